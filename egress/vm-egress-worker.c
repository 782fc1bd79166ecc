/* vm-egress-worker: one agent's egress proxy in a process of its own (docs/EGRESS.md).
 *
 * hostd starts it per agent with the control socketpair on fd VM_EGRESS_WORKER_CONTROL_FD, the
 * agent's listening egress.sock on VM_EGRESS_WORKER_LISTEN_FD and the socketpair on which hostd
 * makes its TCP connections on VM_EGRESS_WORKER_CONNECT_FD (vm-egress-wire.h): it resolves
 * names and decides itself, and hostd, checking the address again, connects. It reads
 * the "start" message, confines itself (vm-egress-sandbox.h: another uid, no capabilities,
 * no_new_privs, Landlock, seccomp), and only then starts the proxy on the socket, so no guest byte
 * is ever read with privileges. Then it obeys hostd's messages until hostd closes the channel, and
 * exits. The proxy's log records go to hostd as lines; hostd writes egress.log. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vm-egress-proxy.h"
#include "vm-egress-sandbox.h"
#include "vm-egress-wire.h"
#include "vm-error.h"
#include "vm-fd-pass.h"
#include "vm-util.h"

/* How long a name lookup that hostd answers may take. */
#define RESOLVE_TIMEOUT_US (15 * G_USEC_PER_SEC)
/* How long hostd may take to answer a connection asked (it answers at once: it only begins the
 * connect()). */
#define CONNECT_ASK_TIMEOUT_MS 5000

typedef struct {
    gboolean done;
    gboolean ok;
    char *message;
    GArray *addresses;
} Pending;

typedef struct {
    int fd;
    GMutex send_lock; /* one frame at a time on the channel */
    GCond answered;   /* with send_lock: the answer to "start" ("ready" or "failed") is sent */
    gboolean started; /* under send_lock */
    GMutex lock;      /* the fields below */
    GCond cond;
    guint32 serial;
    GHashTable *pending; /* serial -> Pending, lookups hostd answers */
    gboolean closed;
} Worker;

static Worker worker;

/* The channel on which hostd makes its TCP connections (VM_EGRESS_WORKER_CONNECT_FD): one ask
 * and its answer at a time. */
static GMutex connect_lock;
static gboolean connect_broken; /* an answer went missing: the channel is out of step */
static const char *agent = "?"; /* the agent it serves, for its messages (argv[1]) */
static char *sandbox_note;      /* what its confinement lacks (no Landlock), or NULL */

static void
worker_send(const char *kind, GVariant *payload)
{
    gboolean answer = g_str_equal(kind, "ready") || g_str_equal(kind, "failed");

    g_mutex_lock(&worker.send_lock);
    /* hostd takes the first frame for the answer to its start: the proxy serves from its start,
     * and a connection that waited in the socket's backlog (made while the run before was
     * stopped) is logged at once, before "ready" went out. */
    while (!answer && !worker.started)
        g_cond_wait(&worker.answered, &worker.send_lock);
    /* A channel hostd closed is noticed by the reader, which then ends the process. */
    (void)vm_wire_send(worker.fd, kind, payload, NULL);
    if (answer) {
        worker.started = TRUE;
        g_cond_broadcast(&worker.answered);
    }
    g_mutex_unlock(&worker.send_lock);
}

static void
worker_log(const VmEgressRecord *record, gpointer user_data)
{
    g_autofree char *json = vm_egress_record_to_json(record);

    worker_send("log", g_variant_new_string(json));
}

/* Names resolved by hostd: only where hostd was told to (its tests' fake resolver). */
static GArray *
worker_resolve(const char *host, gpointer user_data, GError **error)
{
    Pending pending = {0};
    guint32 serial;
    gint64 deadline = g_get_monotonic_time() + RESOLVE_TIMEOUT_US;
    GArray *out = NULL;

    g_mutex_lock(&worker.lock);
    serial = ++worker.serial;
    g_hash_table_insert(worker.pending, GUINT_TO_POINTER(serial), &pending);
    g_mutex_unlock(&worker.lock);
    worker_send("resolve", g_variant_new("(us)", serial, host));
    g_mutex_lock(&worker.lock);
    while (!pending.done && !worker.closed) {
        if (!g_cond_wait_until(&worker.cond, &worker.lock, deadline))
            break;
    }
    g_hash_table_remove(worker.pending, GUINT_TO_POINTER(serial));
    g_mutex_unlock(&worker.lock);
    if (pending.done && pending.ok)
        out = g_steal_pointer(&pending.addresses);
    else
        vm_throw(error, VM_ERROR_NOT_FOUND, "cannot resolve %s: %s", host,
                 pending.message != NULL ? pending.message : "no answer");
    g_free(pending.message);
    g_clear_pointer(&pending.addresses, g_array_unref);
    return out;
}

/* The proxy's connections out, made by hostd (the filter refuses this process a TCP socket):
 * see vm-egress-wire.h. */
static int
worker_connect(const VmEgressAddress *address, guint16 port, gpointer user_data)
{
    VmEgressConnectAsk ask = {.family = (guint8)address->family, .port = port};
    struct pollfd pfd = {.fd = VM_EGRESS_WORKER_CONNECT_FD, .events = POLLIN};
    char code = 0;
    int rc = -EPIPE;

    memcpy(ask.bytes, address->bytes, sizeof(ask.bytes));
    g_mutex_lock(&connect_lock);
    if (connect_broken)
        goto out;
    if (send(pfd.fd, &ask, sizeof(ask), MSG_NOSIGNAL) != (ssize_t)sizeof(ask))
        goto broken;
    do {
        rc = poll(&pfd, 1, CONNECT_ASK_TIMEOUT_MS);
    } while (rc < 0 && errno == EINTR);
    if (rc <= 0)
        goto broken;
    rc = vm_fd_receive(pfd.fd, &code);
    if (rc == -ENOMSG)
        rc = code != 0 ? -(int)(guint8)code : -EPROTO;
    else if (rc == -EAGAIN || rc == -ECONNRESET)
        goto broken;
    goto out; /* -EPROTO too: the answer was taken (its descriptor beyond a limit, closed) */
broken:
    connect_broken = TRUE;
    rc = -EPIPE;
out:
    g_mutex_unlock(&connect_lock);
    return rc;
}

static void
worker_resolved(GVariant *payload)
{
    guint32 serial;
    gboolean ok;
    const char *message;
    g_autoptr(GVariantIter) iter = NULL;
    const char *text;
    Pending *pending;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE("(ubsas)")))
        return;
    g_variant_get(payload, "(ub&sas)", &serial, &ok, &message, &iter);
    g_mutex_lock(&worker.lock);
    pending = g_hash_table_lookup(worker.pending, GUINT_TO_POINTER(serial));
    if (pending != NULL) {
        pending->done = TRUE;
        pending->ok = ok;
        pending->message = g_strdup(message);
        pending->addresses = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
        while (g_variant_iter_next(iter, "&s", &text)) {
            VmEgressAddress address;

            if (vm_egress_address_parse(text, &address, NULL))
                g_array_append_val(pending->addresses, address);
        }
        g_cond_broadcast(&worker.cond);
    }
    g_mutex_unlock(&worker.lock);
}

static VmEgressPolicy *
policy_from(GVariant *allow, GVariant *deny, GError **error)
{
    g_autofree const char **a = g_variant_get_strv(allow, NULL);
    g_autofree const char **d = g_variant_get_strv(deny, NULL);

    return vm_egress_policy_new(a, d, error);
}

static gboolean
fail(const char *what, GError *error)
{
    g_autofree char *message = g_strdup_printf("%s: %s", what, error->message);

    worker_send("failed", g_variant_new_string(message));
    fprintf(stderr, "vm-egress-worker %s: %s\n", agent, message);
    return FALSE;
}

/* Reads the "start" message, confines the process and starts the proxy. */
static VmEgressProxy *
worker_start(void)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) start = NULL;
    g_autoptr(GVariantDict) dict = NULL;
    g_autoptr(GVariant) allow = NULL;
    g_autoptr(GVariant) deny = NULL;
    g_autoptr(GVariant) grants = NULL;
    g_autoptr(VmEgressPolicy) policy = NULL;
    g_autoptr(VmEgressCredentials) creds = NULL;
    g_autofree char *ca_cert = NULL;
    g_autofree char *ca_key = NULL;
    g_autofree char *upstream_ca = NULL;
    gboolean change_user = FALSE, by_parent = FALSE;
    guint32 uid = 0, gid = 0;
    VmEgressConfig config = {
        .use_listen_fd = TRUE,
        .listen_fd = VM_EGRESS_WORKER_LISTEN_FD,
        .log = worker_log,
    };
    VmEgressProxy *proxy;

    start = vm_wire_recv(worker.fd, VM_EGRESS_WIRE_TO_WORKER_MAX, &kind, &error);
    if (start == NULL)
        return fail("no start message", error), NULL;
    if (!g_str_equal(kind, "start") || !g_variant_is_of_type(start, G_VARIANT_TYPE_VARDICT)) {
        g_set_error(&error, VM_ERROR, VM_ERROR_PROTOCOL, "'%s' before 'start'", kind);
        return fail("no start message", error), NULL;
    }
    dict = g_variant_dict_new(start);
    allow = g_variant_dict_lookup_value(dict, "allow", G_VARIANT_TYPE_STRING_ARRAY);
    deny = g_variant_dict_lookup_value(dict, "deny", G_VARIANT_TYPE_STRING_ARRAY);
    grants = g_variant_dict_lookup_value(dict, "credentials", G_VARIANT_TYPE("a(sssasss)"));
    (void)g_variant_dict_lookup(dict, "ca-cert", "s", &ca_cert);
    (void)g_variant_dict_lookup(dict, "ca-key", "s", &ca_key);
    (void)g_variant_dict_lookup(dict, "upstream-ca", "s", &upstream_ca);
    (void)g_variant_dict_lookup(dict, "max-connections", "u", &config.max_connections);
    (void)g_variant_dict_lookup(dict, "handshake-ms", "u", &config.handshake_timeout_ms);
    (void)g_variant_dict_lookup(dict, "idle-ms", "u", &config.idle_timeout_ms);
    (void)g_variant_dict_lookup(dict, "connect-ms", "u", &config.connect_timeout_ms);
    (void)g_variant_dict_lookup(dict, "resolve-by-parent", "b", &by_parent);
    (void)g_variant_dict_lookup(dict, "change-user", "b", &change_user);
    (void)g_variant_dict_lookup(dict, "uid", "u", &uid);
    (void)g_variant_dict_lookup(dict, "gid", "u", &gid);
    if (allow == NULL || deny == NULL) {
        g_set_error(&error, VM_ERROR, VM_ERROR_PROTOCOL, "no policy");
        return fail("bad start message", error), NULL;
    }
    policy = policy_from(allow, deny, &error);
    if (policy == NULL)
        return fail("bad policy", error), NULL;
    if (grants != NULL && (creds = vm_egress_wire_credentials_parse(grants, &error)) == NULL)
        return fail("bad credentials", error), NULL;

    /* Before the first guest byte: nothing the guest sends is read with privileges. */
    if (!vm_egress_sandbox_enter(VM_SANDBOX_EGRESS, change_user, uid, gid, &sandbox_note, &error))
        return fail("cannot confine the worker", error), NULL;

    config.policy = policy;
    config.credentials = creds;
    config.ca_cert_pem = ca_cert;
    config.ca_key_pem = ca_key;
    config.upstream_ca_pem = upstream_ca;
    if (by_parent)
        config.resolve = worker_resolve;
    config.connect = worker_connect;
    proxy = vm_egress_proxy_new(&config, &error);
    if (ca_key != NULL)
        explicit_bzero(ca_key, strlen(ca_key));
    g_variant_dict_clear(dict);
    if (proxy == NULL)
        return fail("cannot start the proxy", error), NULL;
    return proxy;
}

int
main(int argc, char **argv)
{
    g_autoptr(VmEgressProxy) proxy = NULL;

    /* Before the CA key and the secrets arrive: no core file, no tracer of its own uid. */
    vm_process_undumpable();
    worker.fd = VM_EGRESS_WORKER_CONTROL_FD;
    g_mutex_init(&worker.send_lock);
    g_cond_init(&worker.answered);
    g_mutex_init(&worker.lock);
    g_cond_init(&worker.cond);
    worker.pending = g_hash_table_new(NULL, NULL);
    if (argc > 2 || fcntl(worker.fd, F_GETFD) < 0 ||
        fcntl(VM_EGRESS_WORKER_LISTEN_FD, F_GETFD) < 0 ||
        fcntl(VM_EGRESS_WORKER_CONNECT_FD, F_GETFD) < 0) {
        fprintf(stderr,
                "vm-egress-worker: hostd runs this, with its channel on fd %d, the proxy's "
                "socket on fd %d and its connections' channel on fd %d\n",
                VM_EGRESS_WORKER_CONTROL_FD, VM_EGRESS_WORKER_LISTEN_FD,
                VM_EGRESS_WORKER_CONNECT_FD);
        return 2;
    }
    if (argc == 2)
        agent = argv[1];
    proxy = worker_start();
    if (proxy == NULL)
        return 1;
    worker_send("ready", g_variant_new_string(sandbox_note != NULL ? sandbox_note : ""));

    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload =
            vm_wire_recv(worker.fd, VM_EGRESS_WIRE_TO_WORKER_MAX, &kind, &error);

        if (payload == NULL)
            break; /* hostd is gone or asks it to stop: so is the proxy */
        if (g_str_equal(kind, "policy") &&
            g_variant_is_of_type(payload, G_VARIANT_TYPE("(asas)"))) {
            g_autoptr(GVariant) allow = g_variant_get_child_value(payload, 0);
            g_autoptr(GVariant) deny = g_variant_get_child_value(payload, 1);
            g_autoptr(VmEgressPolicy) policy = policy_from(allow, deny, &error);

            if (policy != NULL)
                vm_egress_proxy_set_policy(proxy, policy);
            else
                fprintf(stderr, "vm-egress-worker %s: policy refused: %s\n", agent, error->message);
        } else if (g_str_equal(kind, "credentials")) {
            g_autoptr(VmEgressCredentials) creds =
                vm_egress_wire_credentials_parse(payload, &error);

            /* Grants that do not parse leave none rather than the old ones. */
            if (creds == NULL)
                fprintf(stderr, "vm-egress-worker %s: credentials refused: %s\n", agent,
                        error->message);
            vm_egress_proxy_set_credentials(proxy, creds);
        } else if (g_str_equal(kind, "stats") &&
                   g_variant_is_of_type(payload, G_VARIANT_TYPE_UINT32)) {
            guint64 up = 0, down = 0;

            vm_egress_proxy_get_bytes(proxy, &up, &down);
            worker_send("stats", g_variant_new("(uutt)", g_variant_get_uint32(payload),
                                               vm_egress_proxy_get_n_connections(proxy), up, down));
        } else if (g_str_equal(kind, "resolved")) {
            worker_resolved(payload);
        }
    }
    g_mutex_lock(&worker.lock);
    worker.closed = TRUE;
    g_cond_broadcast(&worker.cond);
    g_mutex_unlock(&worker.lock);
    g_clear_pointer(&proxy, vm_egress_proxy_free);
    g_hash_table_unref(worker.pending);
    return 0;
}
