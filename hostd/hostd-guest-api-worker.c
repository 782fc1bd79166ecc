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
    HostdGuestApiWorkerCallFunc call;
    HostdGuestApiWorkerRefusedFunc refused;
    HostdGuestApiWorkerBrokenFunc broken;
    gpointer user_data;

    HostdWorkerRuns runs;
    guint32 ping; /* the watcher's own: the serial of its last ping */
};

static void
worker_release(HostdGuestApiWorker *worker)
{
    hostd_worker_runs_clear(&worker->runs);
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

static GVariant *
worker_start_message(HostdGuestApiWorker *worker)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    g_variant_builder_add(&b, "{sv}", "change-user",
                          g_variant_new_boolean(worker->runs.change_user));
    g_variant_builder_add(&b, "{sv}", "uid", g_variant_new_uint32(worker->runs.uid));
    g_variant_builder_add(&b, "{sv}", "gid", g_variant_new_uint32(worker->runs.gid));
    return g_variant_builder_end(&b);
}

/* Runs a new worker and waits for its "ready": the channel and pid on success. */
static gboolean
worker_launch(gpointer owner, int *ret_fd, GPid *ret_pid, GError **error)
{
    HostdGuestApiWorker *worker = owner;
    const HostdWorkerSpawn spawn = {
        .program = worker->runs.program,
        .name = worker->runs.name,
        .what = "in-guest API worker",
        .channel_fd = HOSTD_GUEST_API_WORKER_CONTROL_FD,
        .fds = {worker->runs.listen_fd},
        .target_fds = {HOSTD_GUEST_API_WORKER_LISTEN_FD},
        .n_fds = 1,
        .from_worker_max = HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX,
        .answer_timeout_ms = worker->runs.answer_timeout_ms,
        .start = worker_start_message(worker),
    };

    return hostd_worker_spawn(&spawn, ret_fd, ret_pid, NULL, error);
}

/* Reads one worker run's messages until its channel ends, it breaks the protocol or it misses a
 * deadline: a frame, once begun, must come whole within the answer deadline, and a ping the
 * watcher sends after a quiet interval must be answered within it. A worker that is stopped
 * (SIGSTOP: alive, silent) is found out so, and then killed and replaced. */
static void
worker_serve(gpointer owner, int fd, guint64 run)
{
    HostdGuestApiWorker *worker = owner;
    gint64 answer_us = (gint64)worker->runs.answer_timeout_ms * 1000;
    gint64 next_ping = g_get_monotonic_time() + (gint64)worker->runs.ping_interval_ms * 1000;
    gint64 ping_deadline = -1; /* of the ping sent, -1: none */

    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload = NULL;

        if (!hostd_worker_wait(fd, ping_deadline >= 0 ? ping_deadline : next_ping)) {
            if (ping_deadline >= 0) {
                g_message("in-guest API worker of '%s' did not answer within %g s; it is killed "
                          "and replaced",
                          worker->runs.name, (double)worker->runs.answer_timeout_ms / 1000);
                return;
            }
            hostd_worker_runs_send(&worker->runs, fd, "ping", g_variant_new_uint32(++worker->ping));
            ping_deadline = g_get_monotonic_time() + answer_us;
            continue;
        }
        payload = vm_wire_recv_until(fd, HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX,
                                     g_get_monotonic_time() + answer_us, &kind, &error);
        if (payload == NULL) {
            if (g_error_matches(error, VM_ERROR, VM_ERROR_TIMEOUT))
                g_message("in-guest API worker of '%s' did not finish a message within %g s; "
                          "it is killed and replaced",
                          worker->runs.name, (double)worker->runs.answer_timeout_ms / 1000);
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
                next_ping = g_get_monotonic_time() + (gint64)worker->runs.ping_interval_ms * 1000;
            }
        } else {
            g_autofree char *why = g_strdup_printf("a message '%.64s' of type %s", kind,
                                                   g_variant_get_type_string(payload));

            worker->broken(why, worker->user_data);
            return;
        }
        /* A worker busy with guest calls answers as it goes; one that sends nothing is asked. */
        if (ping_deadline < 0)
            next_ping = g_get_monotonic_time() + (gint64)worker->runs.ping_interval_ms * 1000;
    }
}

static const HostdWorkerType guest_api_kind = {
    .what = "in-guest API worker",
    .thread_name = "guest-api-worker",
    .backoff_max_ms = HOSTD_GUEST_API_WORKER_BACKOFF_MAX_MS,
    .launch = worker_launch,
    .serve = worker_serve,
};

HostdGuestApiWorker *
hostd_guest_api_worker_new(const HostdGuestApiWorkerConfig *config, GError **error)
{
    HostdGuestApiWorker *worker = g_atomic_rc_box_new0(HostdGuestApiWorker);

    gboolean set_up =
        hostd_worker_runs_init(&worker->runs, &guest_api_kind, &config->worker, worker, error);

    worker->call = config->call;
    worker->refused = config->refused;
    worker->broken = config->broken;
    worker->user_data = config->user_data;
    if (!set_up) {
        hostd_guest_api_worker_unref(worker);
        return NULL;
    }
    if (!hostd_worker_runs_start(&worker->runs, error)) {
        hostd_guest_api_worker_unref(worker);
        return NULL;
    }
    return worker;
}

void
hostd_guest_api_worker_free(HostdGuestApiWorker *worker)
{
    if (worker == NULL)
        return;
    hostd_worker_runs_stop(&worker->runs);
    hostd_guest_api_worker_unref(worker);
}

void
hostd_guest_api_worker_answer(HostdGuestApiWorker *worker, guint64 run, guint32 serial,
                              guint status, const char *body, guint retry_after_s)
{
    int fd;

    g_mutex_lock(&worker->runs.lock);
    fd = worker->runs.run == run ? worker->runs.fd : -1;
    /* Sent under the lock: the watcher cannot close this run's fd meanwhile. */
    hostd_worker_runs_send(
        &worker->runs, fd, "answer",
        g_variant_new("(uuus)", serial, status, retry_after_s, body != NULL ? body : ""));
    g_mutex_unlock(&worker->runs.lock);
}

GPid
hostd_guest_api_worker_get_pid(HostdGuestApiWorker *worker)
{
    return hostd_worker_runs_get_pid(&worker->runs);
}
