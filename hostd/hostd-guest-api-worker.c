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

#include "hostd-worker-process.h"
#include "vm-error.h"
#include "vm-util.h"

struct _HostdGuestApiWorker {
    char *program;
    char *name;
    int listen_fd;
    gboolean change_user;
    uid_t uid;
    gid_t gid;
    guint answer_timeout_ms, ping_interval_ms;
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
    guint32 ping; /* the watcher's own: the serial of its last ping */
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
    hostd_worker_send(&worker->send_lock, fd, kind, payload);
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

/* Runs a new worker and waits for its "ready": the channel and pid on success. */
static gboolean
worker_launch(HostdGuestApiWorker *worker, int *ret_fd, GPid *ret_pid, GError **error)
{
    const HostdWorkerSpawn spawn = {
        .program = worker->program,
        .name = worker->name,
        .what = "in-guest API worker",
        .channel_fd = HOSTD_GUEST_API_WORKER_CONTROL_FD,
        .fds = {worker->listen_fd},
        .target_fds = {HOSTD_GUEST_API_WORKER_LISTEN_FD},
        .n_fds = 1,
        .from_worker_max = HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX,
        .answer_timeout_ms = worker->answer_timeout_ms,
        .start = worker_start_message(worker),
    };

    return hostd_worker_spawn(&spawn, ret_fd, ret_pid, NULL, error);
}

/* Reads one worker run's messages until its channel ends, it breaks the protocol or it misses a
 * deadline: a frame, once begun, must come whole within the answer deadline, and a ping the
 * watcher sends after a quiet interval must be answered within it. A worker that is stopped
 * (SIGSTOP: alive, silent) is found out so, and then killed and replaced. */
static void
worker_serve(HostdGuestApiWorker *worker, int fd, guint64 run)
{
    gint64 answer_us = (gint64)worker->answer_timeout_ms * 1000;
    gint64 next_ping = g_get_monotonic_time() + (gint64)worker->ping_interval_ms * 1000;
    gint64 ping_deadline = -1; /* of the ping sent, -1: none */

    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload = NULL;

        if (!hostd_worker_wait(fd, ping_deadline >= 0 ? ping_deadline : next_ping)) {
            if (ping_deadline >= 0) {
                g_message("in-guest API worker of '%s' did not answer within %g s; it is killed "
                          "and replaced",
                          worker->name, (double)worker->answer_timeout_ms / 1000);
                return;
            }
            worker_send(worker, fd, "ping", g_variant_new_uint32(++worker->ping));
            ping_deadline = g_get_monotonic_time() + answer_us;
            continue;
        }
        payload = vm_wire_recv_until(fd, HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX,
                                     g_get_monotonic_time() + answer_us, &kind, &error);
        if (payload == NULL) {
            if (g_error_matches(error, VM_ERROR, VM_ERROR_TIMEOUT))
                g_message("in-guest API worker of '%s' did not finish a message within %g s; "
                          "it is killed and replaced",
                          worker->name, (double)worker->answer_timeout_ms / 1000);
            else if (!g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING))
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
        } else if (g_str_equal(kind, "pong") &&
                   g_variant_is_of_type(payload, G_VARIANT_TYPE_UINT32)) {
            /* Only the answer to the question asked counts. */
            if (ping_deadline >= 0 && g_variant_get_uint32(payload) == worker->ping) {
                ping_deadline = -1;
                next_ping = g_get_monotonic_time() + (gint64)worker->ping_interval_ms * 1000;
            }
        } else {
            g_autofree char *why = g_strdup_printf("a message '%.64s' of type %s", kind,
                                                   g_variant_get_type_string(payload));

            worker->broken(why, worker->user_data);
            return;
        }
        /* A worker busy with guest calls answers as it goes; one that sends nothing is asked. */
        if (ping_deadline < 0)
            next_ping = g_get_monotonic_time() + (gint64)worker->ping_interval_ms * 1000;
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
        hostd_worker_run_end(&worker->send_lock, fd, pid);
        if (!hostd_worker_pause(&worker->lock, &worker->cond, &worker->stopping, &backoff_ms,
                                started, HOSTD_GUEST_API_WORKER_BACKOFF_MAX_MS))
            return NULL;

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
    hostd_worker_timeouts(config->answer_timeout_ms, config->ping_interval_ms,
                          &worker->answer_timeout_ms, &worker->ping_interval_ms);
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
