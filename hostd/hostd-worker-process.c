/* Worker processes: start, the ready exchange, deadlines, restarts' delay, reap. */
#include "hostd-worker-process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hostd-log.h"
#include "vm-error.h"
#include "vm-util.h"
#include "vm-wire.h"

/* A worker that served this long before it died is restarted at once. */
#define HEALTHY_US     (5 * G_USEC_PER_SEC)
#define BACKOFF_MIN_MS 50
/* How long a worker may take to take one message. */
#define IO_TIMEOUT_S 2

void
hostd_worker_send(GMutex *send_lock, int fd, const char *kind, GVariant *payload)
{
    g_autoptr(GVariant) sunk = g_variant_ref_sink(payload);

    if (fd < 0)
        return;
    g_mutex_lock(send_lock);
    if (!vm_wire_send(fd, kind, sunk, NULL))
        (void)shutdown(fd, SHUT_RDWR);
    g_mutex_unlock(send_lock);
}

void
hostd_worker_reap(GPid pid)
{
    (void)kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

gboolean
hostd_worker_spawn(const HostdWorkerSpawn *spawn, int *ret_fd, GPid *ret_pid, GVariant **ret_ready,
                   GError **error)
{
    g_autoptr(GVariant) start = g_variant_ref_sink(spawn->start);
    int pair[2];
    vm_autofd parent = -1;
    vm_autofd child = -1;
    const char *argv[] = {spawn->program, spawn->name, NULL};
    int source_fds[1 + HOSTD_WORKER_FDS_MAX];
    int target_fds[1 + HOSTD_WORKER_FDS_MAX];
    g_autoptr(GError) local_error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) reply = NULL;
    GPid pid = 0;
    const struct timeval io_timeout = {.tv_sec = IO_TIMEOUT_S};

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make the %s's channel", spawn->what);
    parent = pair[0];
    child = pair[1];
    g_return_val_if_fail(spawn->n_fds <= HOSTD_WORKER_FDS_MAX, FALSE);
    source_fds[0] = child;
    target_fds[0] = spawn->channel_fd;
    for (guint i = 0; i < spawn->n_fds; i++) {
        source_fds[1 + i] = spawn->fds[i];
        target_fds[1 + i] = spawn->target_fds[i];
    }
    /* What it prints reaches hostd's log only through a pipe hostd reads, bounded and escaped. */
    g_autofree char *who = g_strdup_printf("%s of '%s'", spawn->what, spawn->name);
    vm_autofd output = hostd_log_worker_output(who, error);
    if (output < 0)
        return FALSE;
    if (!g_spawn_async_with_pipes_and_fds("/", argv, NULL,
                                          G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_STDIN_FROM_DEV_NULL,
                                          NULL, NULL, -1, output, output, source_fds, target_fds,
                                          1 + spawn->n_fds, &pid, NULL, NULL, NULL, &local_error))
        return vm_throw(error, VM_ERROR_IO, "cannot run %s: %s", spawn->program,
                        local_error->message);
    close(g_steal_fd(&child));
    /* Neither side of hostd waits on a worker for long: a start, a send. */
    (void)setsockopt(parent, SOL_SOCKET, SO_SNDTIMEO, &io_timeout, sizeof(io_timeout));
    if (!vm_wire_send(parent, "start", start, &local_error)) {
        vm_throw(error, VM_ERROR_IO, "the %s of '%s' did not start: %.400s", spawn->what,
                 spawn->name, local_error->message);
        hostd_worker_reap(pid);
        return FALSE;
    }
    reply = vm_wire_recv_until(parent, spawn->from_worker_max,
                               g_get_monotonic_time() + (gint64)spawn->answer_timeout_ms * 1000,
                               &kind, &local_error);
    if (reply == NULL || !g_str_equal(kind, "ready")) {
        const char *why = local_error != NULL ? local_error->message : kind;

        if (reply != NULL && g_str_equal(kind, "failed") &&
            g_variant_is_of_type(reply, G_VARIANT_TYPE_STRING))
            why = g_variant_get_string(reply, NULL);
        vm_throw(error, VM_ERROR_IO, "the %s of '%s' did not start: %.400s", spawn->what,
                 spawn->name, why);
        hostd_worker_reap(pid);
        return FALSE;
    }
    if (ret_ready != NULL)
        *ret_ready = g_steal_pointer(&reply);
    *ret_fd = g_steal_fd(&parent);
    *ret_pid = pid;
    return TRUE;
}

gboolean
hostd_worker_wait(int fd, gint64 until)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    for (;;) {
        gint64 left = until - g_get_monotonic_time();
        int rc;

        if (left <= 0)
            return FALSE;
        rc = poll(&pfd, 1, (int)MIN((left + 999) / 1000, G_MAXINT));
        if (rc > 0)
            return TRUE;
        if (rc < 0 && errno != EINTR)
            return TRUE; /* the read says what is wrong */
    }
}

guint
hostd_worker_backoff(guint *backoff_ms, gint64 started, guint max_ms)
{
    guint delay;

    /* Dying young again and again slows the restarts down; a worker that served a while is
     * replaced at once. */
    if (g_get_monotonic_time() - started >= HEALTHY_US)
        *backoff_ms = 0;
    delay = *backoff_ms;
    *backoff_ms = MIN(MAX(*backoff_ms * 2, BACKOFF_MIN_MS), max_ms);
    return delay;
}

void
hostd_worker_run_end(GMutex *send_lock, int fd, GPid pid)
{
    /* Only now: sends that took the old fd are done with it once send_lock is free. */
    g_mutex_lock(send_lock);
    if (fd >= 0)
        close(fd);
    g_mutex_unlock(send_lock);
    if (pid > 0)
        hostd_worker_reap(pid);
}

gboolean
hostd_worker_pause(GMutex *lock, GCond *cond, const gboolean *stopping, guint *backoff_ms,
                   gint64 started, guint max_ms)
{
    guint delay_ms = hostd_worker_backoff(backoff_ms, started, max_ms);
    gboolean go_on;

    g_mutex_lock(lock);
    if (delay_ms > 0) {
        gint64 until = g_get_monotonic_time() + (gint64)delay_ms * 1000;

        while (!*stopping && g_cond_wait_until(cond, lock, until))
            ;
    }
    go_on = !*stopping;
    g_mutex_unlock(lock);
    return go_on;
}

void
hostd_worker_timeouts(guint answer_timeout_ms, guint ping_interval_ms, guint *ret_answer_ms,
                      guint *ret_ping_ms)
{
    *ret_answer_ms =
        answer_timeout_ms != 0 ? answer_timeout_ms : HOSTD_WORKER_ANSWER_TIMEOUT_MS_DEFAULT;
    *ret_ping_ms = ping_interval_ms != 0 ? ping_interval_ms : HOSTD_WORKER_PING_INTERVAL_MS_DEFAULT;
}

gboolean
hostd_worker_runs_init(HostdWorkerRuns *runs, const HostdWorkerType *kind,
                       const HostdWorkerSetup *setup, gpointer owner, GError **error)
{
    runs->kind = kind;
    runs->owner = owner;
    runs->program = g_strdup(setup->program);
    runs->name = g_strdup(setup->name);
    runs->change_user = setup->change_user;
    runs->uid = setup->uid;
    runs->gid = setup->gid;
    hostd_worker_timeouts(setup->answer_timeout_ms, setup->ping_interval_ms,
                          &runs->answer_timeout_ms, &runs->ping_interval_ms);
    g_mutex_init(&runs->send_lock);
    g_mutex_init(&runs->lock);
    g_cond_init(&runs->cond);
    runs->fd = -1;
    runs->pid = 0;
    runs->run = 0;
    runs->listen_fd = fcntl(setup->listen_fd, F_DUPFD_CLOEXEC, 3);
    if (runs->listen_fd < 0)
        return vm_throw_errno(error, errno, "cannot pass the socket of the %s of '%s'", kind->what,
                              setup->name);
    return TRUE;
}

void
hostd_worker_runs_clear(HostdWorkerRuns *runs)
{
    g_free(runs->program);
    g_free(runs->name);
    if (runs->listen_fd >= 0)
        close(runs->listen_fd);
    g_mutex_clear(&runs->send_lock);
    g_mutex_clear(&runs->lock);
    g_cond_clear(&runs->cond);
}

/* The watcher: serves the running worker, and when it dies starts another until stopped. */
static gpointer
runs_watch(gpointer data)
{
    HostdWorkerRuns *runs = data;
    guint backoff_ms = 0;

    for (;;) {
        gint64 started = g_get_monotonic_time();
        int fd;
        GPid pid;
        guint64 run;

        g_mutex_lock(&runs->lock);
        fd = runs->fd;
        pid = runs->pid;
        run = runs->run;
        g_mutex_unlock(&runs->lock);
        if (fd >= 0)
            runs->kind->serve(runs->owner, fd, run);

        g_mutex_lock(&runs->lock);
        runs->fd = -1;
        runs->pid = 0;
        if (runs->kind->run_ended != NULL)
            runs->kind->run_ended(runs->owner);
        g_cond_broadcast(&runs->cond);
        g_mutex_unlock(&runs->lock);
        hostd_worker_run_end(&runs->send_lock, fd, pid);
        if (!hostd_worker_pause(&runs->lock, &runs->cond, &runs->stopping, &backoff_ms, started,
                                runs->kind->backoff_max_ms))
            return NULL;

        {
            g_autoptr(GError) error = NULL;

            if (!runs->kind->launch(runs->owner, &fd, &pid, &error)) {
                g_warning("%s", error->message);
                fd = -1;
                pid = 0;
            }
        }
        g_mutex_lock(&runs->lock);
        runs->fd = fd;
        runs->pid = pid;
        runs->run++;
        if (runs->stopping && pid > 0)
            (void)kill(pid, SIGKILL);
        if (runs->kind->run_begun != NULL)
            runs->kind->run_begun(runs->owner, fd);
        g_mutex_unlock(&runs->lock);
        if (pid > 0)
            g_message("%s of '%s' restarted (pid %d)", runs->kind->what, runs->name, (int)pid);
    }
}

gboolean
hostd_worker_runs_start(HostdWorkerRuns *runs, GError **error)
{
    int fd;
    GPid pid;

    if (!runs->kind->launch(runs->owner, &fd, &pid, error))
        return FALSE;
    g_mutex_lock(&runs->lock);
    runs->fd = fd;
    runs->pid = pid;
    runs->run = 1;
    g_mutex_unlock(&runs->lock);
    runs->watcher = g_thread_new(runs->kind->thread_name, runs_watch, runs);
    return TRUE;
}

void
hostd_worker_runs_stop(HostdWorkerRuns *runs)
{
    GThread *watcher;

    g_mutex_lock(&runs->lock);
    runs->stopping = TRUE;
    if (runs->pid > 0)
        (void)kill(runs->pid, SIGKILL);
    watcher = g_steal_pointer(&runs->watcher);
    g_cond_broadcast(&runs->cond);
    g_mutex_unlock(&runs->lock);
    if (watcher != NULL)
        g_thread_join(watcher);
}

GPid
hostd_worker_runs_get_pid(HostdWorkerRuns *runs)
{
    GPid pid;

    g_mutex_lock(&runs->lock);
    pid = runs->pid;
    g_mutex_unlock(&runs->lock);
    return pid;
}

void
hostd_worker_runs_send(HostdWorkerRuns *runs, int fd, const char *kind, GVariant *payload)
{
    hostd_worker_send(&runs->send_lock, fd, kind, payload);
}
