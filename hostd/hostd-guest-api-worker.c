/* One agent's in-guest API worker: start, watch, restart, talk. */
#include "hostd-guest-api-worker.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-util.h"

/* A worker that served this long before it died is restarted at once. */
#define HEALTHY_US     (5 * G_USEC_PER_SEC)
#define BACKOFF_MIN_MS 50
/* How long a worker may take to start, and to take one message. */
#define START_TIMEOUT_S 10
#define IO_TIMEOUT_S    2

struct _HostdGuestApiWorker {
    char *program;
    char *name;
    int listen_fd;
    gboolean change_user;
    uid_t uid;
    gid_t gid;
    HostdGuestApiWorkerCallFunc call;
    HostdGuestApiWorkerRefusedFunc refused;
    HostdGuestApiWorkerBrokenFunc broken;
    gpointer user_data;

    GMutex send_lock; /* one frame at a time to the worker */
    GMutex lock;      /* the fields below */
    GCond cond;
    int fd;      /* the channel to the running worker, -1 when none */
    GPid pid;    /* the running worker, 0 when none */
    guint64 run; /* which run fd and pid are, counted from 1 */
    gboolean stopping;
    GThread *watcher;
};

static void
worker_release(HostdGuestApiWorker *worker)
{
    g_free(worker->program);
    g_free(worker->name);
    if (worker->listen_fd >= 0)
        close(worker->listen_fd);
    g_mutex_clear(&worker->send_lock);
    g_mutex_clear(&worker->lock);
    g_cond_clear(&worker->cond);
}

HostdGuestApiWorker *
hostd_guest_api_worker_ref(HostdGuestApiWorker *worker)
{
    return g_atomic_rc_box_acquire(worker);
}

void
hostd_guest_api_worker_unref(HostdGuestApiWorker *worker)
{
    g_atomic_rc_box_release_full(worker, (GDestroyNotify)worker_release);
}

/* Sends one message on @fd (the channel of one worker run); a worker that is gone is noticed by
 * the watcher. */
static void
worker_send(HostdGuestApiWorker *worker, int fd, const char *kind, GVariant *payload)
{
    g_autoptr(GVariant) sunk = g_variant_ref_sink(payload);

    if (fd < 0)
        return;
    g_mutex_lock(&worker->send_lock);
    /* A worker that stops reading (the send timed out) is ended: the watcher sees its channel
     * close and starts another. */
    if (!vm_wire_send(fd, kind, sunk, NULL))
        (void)shutdown(fd, SHUT_RDWR);
    g_mutex_unlock(&worker->send_lock);
}

static GVariant *
worker_start_message(HostdGuestApiWorker *worker)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    g_variant_builder_add(&b, "{sv}", "change-user", g_variant_new_boolean(worker->change_user));
    g_variant_builder_add(&b, "{sv}", "uid", g_variant_new_uint32(worker->uid));
    g_variant_builder_add(&b, "{sv}", "gid", g_variant_new_uint32(worker->gid));
    return g_variant_builder_end(&b);
}

/* Reaps @pid (killed first: a worker that broke the protocol may still run). */
static void
worker_reap(GPid pid)
{
    (void)kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* Runs a new worker and waits for its "ready": the channel and pid on success. */
static gboolean
worker_launch(HostdGuestApiWorker *worker, int *ret_fd, GPid *ret_pid, GError **error)
{
    int pair[2];
    vm_autofd parent = -1;
    vm_autofd child = -1;
    const char *argv[] = {worker->program, worker->name, NULL};
    int source_fds[2];
    int target_fds[2] = {HOSTD_GUEST_API_WORKER_CONTROL_FD, HOSTD_GUEST_API_WORKER_LISTEN_FD};
    g_autoptr(GError) local_error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) reply = NULL;
    GPid pid = 0;
    const struct timeval io_timeout = {.tv_sec = IO_TIMEOUT_S};
    const struct timeval start_timeout = {.tv_sec = START_TIMEOUT_S};
    const struct timeval no_timeout = {0};

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make the in-guest API worker's channel");
    parent = pair[0];
    child = pair[1];
    source_fds[0] = child;
    source_fds[1] = worker->listen_fd;
    if (!g_spawn_async_with_pipes_and_fds(
            "/", argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_STDIN_FROM_DEV_NULL, NULL, NULL,
            -1, -1, -1, source_fds, target_fds, 2, &pid, NULL, NULL, NULL, &local_error))
        return vm_throw(error, VM_ERROR_IO, "cannot run %s: %s", worker->program,
                        local_error->message);
    close(g_steal_fd(&child));
    (void)setsockopt(parent, SOL_SOCKET, SO_SNDTIMEO, &io_timeout, sizeof(io_timeout));
    (void)setsockopt(parent, SOL_SOCKET, SO_RCVTIMEO, &start_timeout, sizeof(start_timeout));
    worker_send(worker, parent, "start", worker_start_message(worker));
    reply = vm_wire_recv(parent, HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX, &kind, &local_error);
    if (reply == NULL || !g_str_equal(kind, "ready")) {
        const char *why = local_error != NULL ? local_error->message : kind;

        if (reply != NULL && g_str_equal(kind, "failed") &&
            g_variant_is_of_type(reply, G_VARIANT_TYPE_STRING))
            why = g_variant_get_string(reply, NULL);
        vm_throw(error, VM_ERROR_IO, "the in-guest API worker of '%s' did not start: %.400s",
                 worker->name, why);
        worker_reap(pid);
        return FALSE;
    }
    /* From now on the watcher waits for its messages as long as it runs. */
    (void)setsockopt(parent, SOL_SOCKET, SO_RCVTIMEO, &no_timeout, sizeof(no_timeout));
    *ret_fd = g_steal_fd(&parent);
    *ret_pid = pid;
    return TRUE;
}

/* Reads one worker run's messages until its channel ends or it breaks the protocol. */
static void
worker_serve(HostdGuestApiWorker *worker, int fd, guint64 run)
{
    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload =
            vm_wire_recv(fd, HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX, &kind, &error);

        if (payload == NULL) {
            if (!g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING))
                worker->broken(error->message, worker->user_data);
            return;
        }
        if (g_str_equal(kind, "call")) {
            g_auto(HostdGuestApiCall) call = {0};
            guint32 serial;

            if (!hostd_guest_api_call_from_variant(payload, &serial, &call, &error)) {
                worker->broken(error->message, worker->user_data);
                return;
            }
            worker->call(worker, run, serial, &call, worker->user_data);
        } else if (g_str_equal(kind, "refused") &&
                   g_variant_is_of_type(payload, G_VARIANT_TYPE_UINT32) &&
                   g_variant_get_uint32(payload) >= HOSTD_GUEST_API_REFUSED_OPEN &&
                   g_variant_get_uint32(payload) <= HOSTD_GUEST_API_REFUSED_LAST) {
            worker->refused(g_variant_get_uint32(payload), worker->user_data);
        } else {
            g_autofree char *why = g_strdup_printf("a message '%.64s' of type %s", kind,
                                                   g_variant_get_type_string(payload));

            worker->broken(why, worker->user_data);
            return;
        }
    }
}

/* The watcher: serves the running worker, and when it dies starts another until stopped. */
static gpointer
worker_watch(gpointer data)
{
    HostdGuestApiWorker *worker = data;
    guint backoff_ms = 0;

    for (;;) {
        gint64 started = g_get_monotonic_time();
        int fd;
        GPid pid;
        guint64 run;

        g_mutex_lock(&worker->lock);
        fd = worker->fd;
        pid = worker->pid;
        run = worker->run;
        g_mutex_unlock(&worker->lock);
        if (fd >= 0)
            worker_serve(worker, fd, run);

        g_mutex_lock(&worker->lock);
        worker->fd = -1;
        worker->pid = 0;
        g_mutex_unlock(&worker->lock);
        /* Only now: sends that took the old fd are done with it once send_lock is free. */
        g_mutex_lock(&worker->send_lock);
        if (fd >= 0)
            close(fd);
        g_mutex_unlock(&worker->send_lock);
        if (pid > 0)
            worker_reap(pid);

        if (g_get_monotonic_time() - started >= HEALTHY_US)
            backoff_ms = 0;
        g_mutex_lock(&worker->lock);
        if (backoff_ms > 0) {
            gint64 until = g_get_monotonic_time() + (gint64)backoff_ms * 1000;

            while (!worker->stopping && g_cond_wait_until(&worker->cond, &worker->lock, until))
                ;
        }
        backoff_ms =
            MIN(MAX(backoff_ms * 2, BACKOFF_MIN_MS), HOSTD_GUEST_API_WORKER_BACKOFF_MAX_MS);
        if (worker->stopping) {
            g_mutex_unlock(&worker->lock);
            return NULL;
        }
        g_mutex_unlock(&worker->lock);

        {
            g_autoptr(GError) error = NULL;

            if (!worker_launch(worker, &fd, &pid, &error)) {
                g_warning("%s", error->message);
                fd = -1;
                pid = 0;
            }
        }
        g_mutex_lock(&worker->lock);
        worker->fd = fd;
        worker->pid = pid;
        worker->run++;
        if (worker->stopping && pid > 0)
            (void)kill(pid, SIGKILL);
        g_mutex_unlock(&worker->lock);
        if (pid > 0)
            g_message("in-guest API worker of '%s' restarted (pid %d)", worker->name, (int)pid);
    }
}

HostdGuestApiWorker *
hostd_guest_api_worker_new(const HostdGuestApiWorkerConfig *config, GError **error)
{
    HostdGuestApiWorker *worker = g_atomic_rc_box_new0(HostdGuestApiWorker);
    int fd;
    GPid pid;

    g_mutex_init(&worker->send_lock);
    g_mutex_init(&worker->lock);
    g_cond_init(&worker->cond);
    worker->fd = -1;
    worker->program = g_strdup(config->program);
    worker->name = g_strdup(config->name);
    worker->listen_fd = fcntl(config->listen_fd, F_DUPFD_CLOEXEC, 3);
    worker->change_user = config->change_user;
    worker->uid = config->uid;
    worker->gid = config->gid;
    worker->call = config->call;
    worker->refused = config->refused;
    worker->broken = config->broken;
    worker->user_data = config->user_data;
    if (worker->listen_fd < 0) {
        vm_throw_errno(error, errno, "cannot pass the in-guest API's socket of '%s'", config->name);
        hostd_guest_api_worker_unref(worker);
        return NULL;
    }
    if (!worker_launch(worker, &fd, &pid, error)) {
        hostd_guest_api_worker_unref(worker);
        return NULL;
    }
    worker->fd = fd;
    worker->pid = pid;
    worker->run = 1;
    /* The watcher holds a reference of its own: it may outlive the caller's by a moment. */
    worker->watcher =
        g_thread_new("guest-api-worker", worker_watch, hostd_guest_api_worker_ref(worker));
    return worker;
}

void
hostd_guest_api_worker_free(HostdGuestApiWorker *worker)
{
    GThread *watcher;

    if (worker == NULL)
        return;
    g_mutex_lock(&worker->lock);
    worker->stopping = TRUE;
    if (worker->pid > 0)
        (void)kill(worker->pid, SIGKILL);
    watcher = g_steal_pointer(&worker->watcher);
    g_cond_broadcast(&worker->cond);
    g_mutex_unlock(&worker->lock);
    if (watcher != NULL)
        g_thread_join(watcher);
    hostd_guest_api_worker_unref(worker); /* the watcher's */
    hostd_guest_api_worker_unref(worker);
}

void
hostd_guest_api_worker_answer(HostdGuestApiWorker *worker, guint64 run, guint32 serial,
                              guint status, const char *body, guint retry_after_s)
{
    int fd;

    g_mutex_lock(&worker->lock);
    fd = worker->run == run ? worker->fd : -1;
    /* Sent under the lock: the watcher cannot close this run's fd meanwhile. */
    worker_send(worker, fd, "answer",
                g_variant_new("(uuus)", serial, status, retry_after_s, body != NULL ? body : ""));
    g_mutex_unlock(&worker->lock);
}

GPid
hostd_guest_api_worker_get_pid(HostdGuestApiWorker *worker)
{
    GPid pid;

    g_mutex_lock(&worker->lock);
    pid = worker->pid;
    g_mutex_unlock(&worker->lock);
    return pid;
}
