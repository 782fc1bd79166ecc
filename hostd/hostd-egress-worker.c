/* One agent's egress proxy in a worker process: start, watch, restart, talk. */
#include "hostd-egress-worker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-glib/json-glib.h>

#include "hostd-egress-connect.h"
#include "hostd-ssh-wire.h"
#include "hostd-log.h"
#include "hostd-worker-process.h"
#include "vm-egress-wire.h"
#include "vm-error.h"
#include "vm-util.h"

/* How long a stats question may take before it counts as no answer. */
#define STATS_TIMEOUT_US (G_USEC_PER_SEC / 2)

struct _HostdEgressWorker {
    char *ca_cert;
    char *ca_key;
    char *upstream_ca;
    guint max_connections, handshake_timeout_ms, idle_timeout_ms, connect_timeout_ms;
    HostdEgressWorkerLogFunc log;
    gpointer log_data;
    VmEgressResolveFunc resolve;
    gpointer resolve_data;

    HostdWorkerRuns runs; /* its lock guards the fields below too */
    VmEgressPolicy *policy;
    VmEgressCredentials *credentials;
    guint32 serial;       /* of the last stats question */
    guint32 stats_serial; /* of the last answer */
    guint connections;
    guint64 bytes_up, bytes_down; /* this run's, as its last answer said */
    guint64 past_up, past_down;   /* of the runs before it */
};

static void
worker_release(HostdEgressWorker *worker)
{
    g_free(worker->ca_cert);
    vm_secret_free(worker->ca_key);
    g_free(worker->upstream_ca);
    g_clear_pointer(&worker->policy, vm_egress_policy_unref);
    g_clear_pointer(&worker->credentials, vm_egress_credentials_unref);
    hostd_worker_runs_clear(&worker->runs);
}

HostdEgressWorker *
hostd_egress_worker_ref(HostdEgressWorker *worker)
{
    return g_atomic_rc_box_acquire(worker);
}

void
hostd_egress_worker_unref(HostdEgressWorker *worker)
{
    g_atomic_rc_box_release_full(worker, (GDestroyNotify)worker_release);
}

static GVariant *
policy_variant(VmEgressPolicy *policy)
{
    g_auto(GStrv) allow = vm_egress_policy_dup_allow(policy);
    g_auto(GStrv) deny = vm_egress_policy_dup_deny(policy);

    /* "none" stands alone in an allow list the policy prints, and is read back as nothing. */
    return g_variant_new("(^as^as)", allow, deny);
}

/* The "start" message: everything a new worker needs, from the state now. */
static GVariant *
worker_start_message(HostdEgressWorker *worker)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autoptr(GVariant) policy = NULL;
    g_autoptr(GVariant) allow = NULL;
    g_autoptr(GVariant) deny = NULL;

    g_mutex_lock(&worker->runs.lock);
    policy = g_variant_ref_sink(policy_variant(worker->policy));
    allow = g_variant_get_child_value(policy, 0);
    deny = g_variant_get_child_value(policy, 1);
    g_variant_builder_add(&b, "{sv}", "allow", allow);
    g_variant_builder_add(&b, "{sv}", "deny", deny);
    if (worker->credentials != NULL)
        g_variant_builder_add(&b, "{sv}", "credentials",
                              vm_egress_wire_credentials(worker->credentials));
    g_mutex_unlock(&worker->runs.lock);
    if (worker->ca_cert != NULL && worker->ca_key != NULL) {
        g_variant_builder_add(&b, "{sv}", "ca-cert", g_variant_new_string(worker->ca_cert));
        g_variant_builder_add(&b, "{sv}", "ca-key", g_variant_new_string(worker->ca_key));
    }
    if (worker->upstream_ca != NULL)
        g_variant_builder_add(&b, "{sv}", "upstream-ca", g_variant_new_string(worker->upstream_ca));
    g_variant_builder_add(&b, "{sv}", "max-connections",
                          g_variant_new_uint32(worker->max_connections));
    g_variant_builder_add(&b, "{sv}", "handshake-ms",
                          g_variant_new_uint32(worker->handshake_timeout_ms));
    g_variant_builder_add(&b, "{sv}", "idle-ms", g_variant_new_uint32(worker->idle_timeout_ms));
    g_variant_builder_add(&b, "{sv}", "connect-ms",
                          g_variant_new_uint32(worker->connect_timeout_ms));
    g_variant_builder_add(&b, "{sv}", "resolve-by-parent",
                          g_variant_new_boolean(worker->resolve != NULL));
    g_variant_builder_add(&b, "{sv}", "change-user",
                          g_variant_new_boolean(worker->runs.change_user));
    g_variant_builder_add(&b, "{sv}", "uid", g_variant_new_uint32(worker->runs.uid));
    g_variant_builder_add(&b, "{sv}", "gid", g_variant_new_uint32(worker->runs.gid));
    return g_variant_builder_end(&b);
}

/* Logs once per hostd what a worker's "ready" says its confinement lacks (no Landlock). */
static void
worker_sandbox_note(HostdEgressWorker *worker, GVariant *ready)
{
    g_autofree char *note = hostd_ssh_wire_ready_note(ready);
    static gsize told;

    if (note == NULL || !g_once_init_enter(&told))
        return;
    g_message("egress worker of '%s': %s", worker->runs.name, note);
    g_once_init_leave(&told, 1);
}

static VmEgressPolicy *
connect_policy(gpointer data)
{
    return hostd_egress_worker_dup_policy(data);
}

/* The channel on which one worker run asks hostd for its TCP connections
 * (hostd-egress-connect.h), served by a thread of its own that ends with the worker: the
 * worker's end, to pass as VM_EGRESS_WORKER_CONNECT_FD, or -1. */
static int
worker_connect_channel(HostdEgressWorker *worker, GError **error)
{
    int pair[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make the egress worker's channel"), -1;
    if (!hostd_egress_connect_serve(pair[0], worker->runs.name, connect_policy,
                                    hostd_egress_worker_ref(worker),
                                    (GDestroyNotify)hostd_egress_worker_unref, error)) {
        close(pair[1]);
        return -1;
    }
    return pair[1];
}

/* Runs a new worker and waits for its "ready": the channel and pid on success. */
static gboolean
worker_launch(gpointer owner, int *ret_fd, GPid *ret_pid, GError **error)
{
    HostdEgressWorker *worker = owner;
    g_autoptr(GVariant) ready = NULL;
    vm_autofd connect_child = worker_connect_channel(worker, error);

    if (connect_child < 0)
        return FALSE;
    const HostdWorkerSpawn spawn = {
        .program = worker->runs.program,
        .name = worker->runs.name,
        .what = "egress worker",
        .channel_fd = VM_EGRESS_WORKER_CONTROL_FD,
        .fds = {worker->runs.listen_fd, connect_child},
        .target_fds = {VM_EGRESS_WORKER_LISTEN_FD, VM_EGRESS_WORKER_CONNECT_FD},
        .n_fds = 2,
        .from_worker_max = VM_EGRESS_WIRE_FROM_WORKER_MAX,
        .answer_timeout_ms = worker->runs.answer_timeout_ms,
        .start = worker_start_message(worker),
    };

    if (!hostd_worker_spawn(&spawn, ret_fd, ret_pid, &ready, error))
        return FALSE;
    worker_sandbox_note(worker, ready);
    return TRUE;
}

/* Whether @line is what a log record looks like: one JSON object of bounded size and depth, on
 * one line. The worker is not trusted with hostd's log file beyond that. */
static gboolean
worker_log_line_ok(const char *line, gsize len)
{
    g_autoptr(JsonParser) parser = NULL;
    JsonNode *root;

    if (len == 0 || len > VM_EGRESS_WIRE_LINE_MAX || !g_utf8_validate(line, (gssize)len, NULL) ||
        memchr(line, '\n', len) != NULL || memchr(line, '\r', len) != NULL ||
        !vm_json_depth_ok(line, len, 2))
        return FALSE;
    parser = json_parser_new();
    if (!json_parser_load_from_data(parser, line, (gssize)len, NULL))
        return FALSE;
    root = json_parser_get_root(parser);
    return root != NULL && JSON_NODE_HOLDS_OBJECT(root);
}

static void
worker_answer_resolve(HostdEgressWorker *worker, int fd, GVariant *payload)
{
    guint32 serial;
    const char *host;
    g_autoptr(GError) error = NULL;
    g_autoptr(GArray) addresses = NULL;
    g_autoptr(GStrvBuilder) texts = g_strv_builder_new();
    g_auto(GStrv) list = NULL;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE("(us)")))
        return;
    g_variant_get(payload, "(u&s)", &serial, &host);
    if (strlen(host) > VM_EGRESS_WIRE_HOST_MAX)
        return;
    addresses = worker->resolve(host, worker->resolve_data, &error);
    for (guint i = 0; addresses != NULL && i < addresses->len && i < VM_EGRESS_WIRE_ADDRESSES_MAX;
         i++) {
        g_autofree char *text =
            vm_egress_address_to_string(&g_array_index(addresses, VmEgressAddress, i));

        g_strv_builder_add(texts, text);
    }
    list = g_strv_builder_end(texts);
    hostd_worker_runs_send(&worker->runs, fd, "resolved",
                           g_variant_new("(ubs^as)", serial, addresses != NULL,
                                         error != NULL ? error->message : "", list));
}

/* Reads one worker run's messages until its channel ends, it breaks the protocol or it misses a
 * deadline: a frame, once begun, must come whole within the answer deadline, and a stats
 * question the watcher asks after a quiet interval must be answered within it. A worker that is
 * stopped (SIGSTOP: alive, silent) is found out so, and then killed and replaced. */
static void
worker_serve(gpointer owner, int fd, guint64 run)
{
    HostdEgressWorker *worker = owner;
    gint64 answer_us = (gint64)worker->runs.answer_timeout_ms * 1000;
    gint64 next_ping = g_get_monotonic_time() + (gint64)worker->runs.ping_interval_ms * 1000;
    gint64 ping_deadline = -1; /* of the question asked, -1: none asked */
    guint32 ping = 0;

    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload = NULL;
        gboolean answered;

        if (!hostd_worker_wait(fd, ping_deadline >= 0 ? ping_deadline : next_ping)) {
            g_mutex_lock(&worker->runs.lock);
            answered = ping_deadline >= 0 && (gint32)(worker->stats_serial - ping) >= 0;
            if (ping_deadline < 0)
                ping = ++worker->serial;
            g_mutex_unlock(&worker->runs.lock);
            if (answered) {
                ping_deadline = -1;
                next_ping = g_get_monotonic_time() + (gint64)worker->runs.ping_interval_ms * 1000;
            } else if (ping_deadline >= 0) {
                g_message("egress worker of '%s' did not answer within %g s; it is killed and "
                          "replaced",
                          worker->runs.name, (double)worker->runs.answer_timeout_ms / 1000);
                return;
            } else {
                hostd_worker_runs_send(&worker->runs, fd, "stats", g_variant_new_uint32(ping));
                ping_deadline = g_get_monotonic_time() + answer_us;
            }
            continue;
        }
        payload = vm_wire_recv_until(fd, VM_EGRESS_WIRE_FROM_WORKER_MAX,
                                     g_get_monotonic_time() + answer_us, &kind, &error);
        if (payload == NULL) {
            if (g_error_matches(error, VM_ERROR, VM_ERROR_TIMEOUT))
                g_message("egress worker of '%s' did not finish a message within %g s; it is "
                          "killed and replaced",
                          worker->runs.name, (double)worker->runs.answer_timeout_ms / 1000);
            else if (!g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING))
                g_warning("egress worker of '%s': %s", worker->runs.name, error->message);
            return;
        }
        if (g_str_equal(kind, "log") && g_variant_is_of_type(payload, G_VARIANT_TYPE_STRING)) {
            gsize len;
            const char *line = g_variant_get_string(payload, &len);

            if (!worker_log_line_ok(line, len)) {
                g_warning("egress worker of '%s': a log line that is not a record",
                          worker->runs.name);
                return;
            }
            if (worker->log != NULL)
                worker->log(line, worker->log_data);
        } else if (g_str_equal(kind, "stats") &&
                   g_variant_is_of_type(payload, G_VARIANT_TYPE("(uutt)"))) {
            guint32 serial, connections;
            guint64 up, down;

            g_variant_get(payload, "(uutt)", &serial, &connections, &up, &down);
            g_mutex_lock(&worker->runs.lock);
            /* Bounded by what the proxy allows: a larger number is a lie. The byte counts are
             * the worker's word, shown as such; a count going back is not taken. */
            worker->connections = MIN(connections, MAX(worker->max_connections, 1));
            worker->bytes_up = MAX(worker->bytes_up, up);
            worker->bytes_down = MAX(worker->bytes_down, down);
            worker->stats_serial = serial;
            answered = ping_deadline >= 0 && (gint32)(serial - ping) >= 0;
            g_cond_broadcast(&worker->runs.cond);
            g_mutex_unlock(&worker->runs.lock);
            if (answered) {
                ping_deadline = -1;
                next_ping = g_get_monotonic_time() + (gint64)worker->runs.ping_interval_ms * 1000;
            }
        } else if (g_str_equal(kind, "resolve") && worker->resolve != NULL) {
            worker_answer_resolve(worker, fd, payload);
        } else {
            g_warning("egress worker of '%s': unexpected message '%.64s'", worker->runs.name, kind);
            return;
        }
    }
}

static void
worker_run_ended(gpointer owner)
{
    HostdEgressWorker *worker = owner;

    worker->connections = 0;
    worker->past_up += worker->bytes_up;
    worker->past_down += worker->bytes_down;
    worker->bytes_up = 0;
    worker->bytes_down = 0;
}

/* A change made while the next run started (after its start message was made, before its
 * channel was known) reaches it now; both messages may be repeated harmlessly. */
static void
worker_run_begun(gpointer owner, int fd)
{
    HostdEgressWorker *worker = owner;

    hostd_worker_runs_send(&worker->runs, fd, "policy", policy_variant(worker->policy));
    hostd_worker_runs_send(&worker->runs, fd, "credentials",
                           vm_egress_wire_credentials(worker->credentials));
}

static const HostdWorkerType egress_kind = {
    .what = "egress worker",
    .thread_name = "egress-worker",
    .backoff_max_ms = HOSTD_EGRESS_WORKER_BACKOFF_MAX_MS,
    .launch = worker_launch,
    .serve = worker_serve,
    .run_ended = worker_run_ended,
    .run_begun = worker_run_begun,
};

HostdEgressWorker *
hostd_egress_worker_new(const HostdEgressWorkerConfig *config, GError **error)
{
    HostdEgressWorker *worker = g_atomic_rc_box_new0(HostdEgressWorker);
    g_autoptr(GError) local_error = NULL;

    gboolean set_up =
        hostd_worker_runs_init(&worker->runs, &egress_kind, &config->worker, worker, error);

    worker->ca_cert = g_strdup(config->ca_cert_pem);
    worker->ca_key = g_strdup(config->ca_key_pem);
    worker->max_connections = config->max_connections;
    worker->handshake_timeout_ms = config->handshake_timeout_ms;
    worker->idle_timeout_ms = config->idle_timeout_ms;
    worker->connect_timeout_ms = config->connect_timeout_ms;
    worker->log = config->log;
    worker->log_data = config->log_data;
    worker->resolve = config->resolve;
    worker->resolve_data = config->resolve_data;
    worker->policy =
        config->policy != NULL ? vm_egress_policy_ref(config->policy) : vm_egress_policy_new_none();
    if (config->credentials != NULL)
        worker->credentials = vm_egress_credentials_ref(config->credentials);
    if (!set_up) {
        hostd_egress_worker_unref(worker);
        return NULL;
    }
    /* The worker cannot read a file that only root may: it gets the certificates themselves. */
    if (config->upstream_ca_file != NULL &&
        !g_file_get_contents(config->upstream_ca_file, &worker->upstream_ca, NULL, &local_error)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s", local_error->message);
        hostd_egress_worker_unref(worker);
        return NULL;
    }
    if (!hostd_worker_runs_start(&worker->runs, error)) {
        hostd_egress_worker_unref(worker);
        return NULL;
    }
    return worker;
}

void
hostd_egress_worker_free(HostdEgressWorker *worker)
{
    if (worker == NULL)
        return;
    hostd_worker_runs_stop(&worker->runs);
    hostd_egress_worker_unref(worker);
}

void
hostd_egress_worker_set_policy(HostdEgressWorker *worker, VmEgressPolicy *policy)
{
    int fd;

    g_mutex_lock(&worker->runs.lock);
    vm_egress_policy_ref(policy);
    g_clear_pointer(&worker->policy, vm_egress_policy_unref);
    worker->policy = policy;
    fd = worker->runs.fd;
    /* Sent under the lock, so two changes reach the worker in the order they were made. */
    hostd_worker_runs_send(&worker->runs, fd, "policy", policy_variant(policy));
    g_mutex_unlock(&worker->runs.lock);
}

void
hostd_egress_worker_set_credentials(HostdEgressWorker *worker, VmEgressCredentials *creds)
{
    g_mutex_lock(&worker->runs.lock);
    if (creds != NULL)
        vm_egress_credentials_ref(creds);
    g_clear_pointer(&worker->credentials, vm_egress_credentials_unref);
    worker->credentials = creds;
    hostd_worker_runs_send(&worker->runs, worker->runs.fd, "credentials",
                           vm_egress_wire_credentials(creds));
    g_mutex_unlock(&worker->runs.lock);
}

VmEgressPolicy *
hostd_egress_worker_dup_policy(HostdEgressWorker *worker)
{
    VmEgressPolicy *policy;

    g_mutex_lock(&worker->runs.lock);
    policy = vm_egress_policy_ref(worker->policy);
    g_mutex_unlock(&worker->runs.lock);
    return policy;
}

guint
hostd_egress_worker_get_n_connections(HostdEgressWorker *worker)
{
    guint64 up, down;

    return hostd_egress_worker_get_stats(worker, &up, &down);
}

guint
hostd_egress_worker_get_stats(HostdEgressWorker *worker, guint64 *ret_up, guint64 *ret_down)
{
    gint64 deadline = g_get_monotonic_time() + STATS_TIMEOUT_US;
    guint32 serial;
    guint connections = 0;

    g_mutex_lock(&worker->runs.lock);
    *ret_up = worker->past_up + worker->bytes_up;
    *ret_down = worker->past_down + worker->bytes_down;
    if (worker->runs.fd < 0) {
        g_mutex_unlock(&worker->runs.lock);
        return 0;
    }
    serial = ++worker->serial;
    hostd_worker_runs_send(&worker->runs, worker->runs.fd, "stats", g_variant_new_uint32(serial));
    while (worker->runs.fd >= 0 && (gint32)(worker->stats_serial - serial) < 0) {
        if (!g_cond_wait_until(&worker->runs.cond, &worker->runs.lock, deadline))
            break;
    }
    /* A later answer (to the watcher's question) is as fresh. */
    if (worker->runs.fd >= 0 && (gint32)(worker->stats_serial - serial) >= 0)
        connections = worker->connections;
    *ret_up = worker->past_up + worker->bytes_up;
    *ret_down = worker->past_down + worker->bytes_down;
    g_mutex_unlock(&worker->runs.lock);
    return connections;
}

GPid
hostd_egress_worker_get_pid(HostdEgressWorker *worker)
{
    return hostd_worker_runs_get_pid(&worker->runs);
}
