/* vm-guest-api-worker: one agent's in-guest API (docs/GUEST-API.md) in a process of its own.
 *
 * hostd starts it per agent with the control socketpair on fd HOSTD_GUEST_API_WORKER_CONTROL_FD
 * and the agent's listening api.sock on HOSTD_GUEST_API_WORKER_LISTEN_FD
 * (hostd-guest-api-wire.h). It reads the "start" message, confines itself
 * (vm-egress-sandbox.h, VM_SANDBOX_API: another uid, no capabilities, no_new_privs, Landlock,
 * seccomp), and only then
 * takes guest connections: each one handed over by QEMU's helper (vm-fd-pass.h) is served by
 * libsoup, one request per connection, and every whole request becomes one typed call to hostd
 * (hostd_guest_api_call_read()), whose answer it writes back. What the guest sends is bounded
 * here as it was in hostd: HOSTD_GUEST_API_CONNECTIONS at once (503 past that, closed past twice
 * that), HOSTD_GUEST_API_REQUEST_MS for a whole request, the body's bounds. The rate, the
 * checkpoints' caps and the work are hostd's. It exits when hostd closes the channel. */
#include <errno.h>
#include <fcntl.h>
#include <libsoup/soup.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib-unix.h>

#include "hostd-guest-api-wire.h"
#include "vm-egress-sandbox.h"
#include "vm-error.h"
#include "vm-fd-pass.h"
#include "vm-domain.h"

#define CONNECTIONS HOSTD_GUEST_API_CONNECTIONS
#define REQUEST_MS  HOSTD_GUEST_API_REQUEST_MS
/* Helper connections waiting to hand over a guest connection, and how long one may take to. */
#define PENDING_MAX 16
#define PENDING_MS  2000

/* One guest connection, reached from libsoup's callbacks through the data of the remote address
 * given with it, which holds a reference: the address lives as long as libsoup's connection. */
typedef struct {
    gint refs;
    GSocket *socket; /* NULL once the connection is gone */
    gint64 deadline; /* for the whole request, monotonic us; 0: read */
    gboolean over;   /* past CONNECTIONS: answered 503 */
} Conn;

typedef struct {
    Conn *conn;
    GByteArray *body;
    gsize received;
    gboolean too_long;
    gboolean cut;      /* the connection was cut for its body */
    gboolean finished; /* libsoup is done with it: no answer can be set any more */
    guint32 serial;    /* of its call; 0: none sent */
    guint status;      /* the worker's own refusal, answered when hostd says so */
    char *refusal;
    const char *allow;
} Request;

static struct {
    int fd;
    const char *agent;
    SoupServer *server;
    GMainLoop *loop;
    GPtrArray *conns; /* Conn*, open */
    guint pending;
    guint32 serial;
    GHashTable *waiting; /* serial -> SoupServerMessage*, paused for hostd's answer */
} worker;

static void
worker_send(const char *kind, GVariant *payload)
{
    g_autoptr(GError) error = NULL;

    /* hostd gone: the channel's reader ends the loop. */
    if (!vm_wire_send(worker.fd, kind, payload, &error))
        g_main_loop_quit(worker.loop);
}

static void
worker_refused(HostdGuestApiRefusal why)
{
    worker_send("refused", g_variant_new_uint32(why));
}

static void
conn_unref(gpointer data)
{
    Conn *conn = data;

    if (!g_atomic_int_dec_and_test(&conn->refs))
        return;
    g_clear_object(&conn->socket);
    g_free(conn);
}

static void
conn_cut(Conn *conn)
{
    if (conn != NULL && conn->socket != NULL)
        (void)g_socket_shutdown(conn->socket, TRUE, TRUE, NULL);
}

static void
request_free(gpointer data)
{
    Request *req = data;

    if (req->conn != NULL)
        conn_unref(req->conn);
    g_byte_array_unref(req->body);
    g_free(req->refusal);
    g_free(req);
}

static Request *
request_of(SoupServerMessage *msg)
{
    return g_object_get_data(G_OBJECT(msg), "vm-guest-api");
}

static void
respond(SoupServerMessage *msg, guint status, const char *json, gsize len, guint retry_after_s)
{
    SoupMessageHeaders *headers = soup_server_message_get_response_headers(msg);

    if (retry_after_s != 0) {
        g_autofree char *retry = g_strdup_printf("%u", retry_after_s);

        soup_message_headers_replace(headers, "Retry-After", retry);
    }
    soup_server_message_set_status(msg, status, NULL);
    soup_server_message_set_response(msg, "application/json", SOUP_MEMORY_COPY, json, len);
}

/* ---------------------------------------------------------------------------------------------
 * Requests */

static void
request_finished(SoupServerMessage *msg, gpointer data)
{
    Request *req = data;
    gpointer waiting = NULL;

    req->finished = TRUE;
    if (req->serial != 0 &&
        g_hash_table_steal_extended(worker.waiting, GUINT_TO_POINTER(req->serial), NULL, &waiting))
        g_object_unref(waiting);
}

/* A body past HOSTD_GUEST_API_BODY_MAX is counted, not kept (its call is a 413); one past
 * HOSTD_GUEST_API_DISCARD_MAX is not read on: the connection is cut. */
static void
request_got_chunk(SoupServerMessage *msg, GBytes *chunk, gpointer data)
{
    Request *req = data;
    gsize len = 0;
    const guint8 *bytes = g_bytes_get_data(chunk, &len);

    req->received += len;
    if (req->received <= HOSTD_GUEST_API_BODY_MAX) {
        g_byte_array_append(req->body, bytes, (guint)len);
        return;
    }
    req->too_long = TRUE;
    if (req->received > HOSTD_GUEST_API_DISCARD_MAX && !req->cut) {
        req->cut = TRUE;
        worker_refused(HOSTD_GUEST_API_REFUSED_BODY_CUT);
        conn_cut(req->conn);
    }
}

static void
request_started(SoupServer *server, SoupServerMessage *msg, gpointer data)
{
    Request *req = g_new0(Request, 1);
    Conn *conn =
        g_object_get_data(G_OBJECT(soup_server_message_get_remote_address(msg)), "vm-guest-api");

    if (conn != NULL) {
        g_atomic_int_inc(&conn->refs);
        req->conn = conn;
    }
    req->body = g_byte_array_new();
    g_object_set_data_full(G_OBJECT(msg), "vm-guest-api", req, request_free);
    g_signal_connect(msg, "finished", G_CALLBACK(request_finished), req);
    g_signal_connect(msg, "got-chunk", G_CALLBACK(request_got_chunk), req);
}

static void
request_read(SoupServer *server, SoupServerMessage *msg, gpointer data)
{
    Request *req = request_of(msg);

    if (req != NULL && req->conn != NULL)
        req->conn->deadline = 0;
}

/* Before the body: the connection's share and the announced body size. A status set here
 * answers the request once its body was read (and dropped), without a call. */
static void
request_early(SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
              gpointer data)
{
    Request *req = request_of(msg);
    SoupMessageHeaders *headers = soup_server_message_get_request_headers(msg);

    soup_message_body_set_accumulate(soup_server_message_get_request_body(msg), FALSE);
    if (req == NULL)
        return;
    if (req->conn != NULL && req->conn->over) {
        g_autoptr(GError) error =
            g_error_new(VM_ERROR, VM_ERROR_BUSY, "more than %d connections at once from this agent",
                        CONNECTIONS);
        g_autofree char *json = hostd_guest_api_error_json(error, 1);

        worker_refused(HOSTD_GUEST_API_REFUSED_CONNECTIONS);
        respond(msg, 503, json, strlen(json), 1);
        return;
    }
    if (soup_message_headers_get_encoding(headers) == SOUP_ENCODING_CONTENT_LENGTH &&
        soup_message_headers_get_content_length(headers) > HOSTD_GUEST_API_BODY_MAX) {
        req->too_long = TRUE;
        if (soup_message_headers_get_content_length(headers) > HOSTD_GUEST_API_DISCARD_MAX) {
            req->cut = TRUE;
            worker_refused(HOSTD_GUEST_API_REFUSED_BODY_CUT);
            conn_cut(req->conn);
        }
    }
}

/* The whole request: one call to hostd, answered when hostd answers. */
static void
request_handle(SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
               gpointer data)
{
    Request *req = request_of(msg);
    g_auto(HostdGuestApiCall) call = {0};

    if (req == NULL || req->cut) {
        const char *json = "{\"error\":\"failed\",\"message\":\"the request was not read\"}";

        respond(msg, 500, json, strlen(json), 0);
        return;
    }
    hostd_guest_api_call_read(soup_server_message_get_method(msg), path,
                              (const char *)req->body->data, req->body->len, req->too_long, &call);
    req->status = call.status;
    req->refusal = g_steal_pointer(&call.refusal);
    req->allow = call.allow;
    /* Serials are never 0 and never repeat within a run: hostd's answers find their request. */
    if (++worker.serial == 0)
        worker.serial = 1;
    req->serial = worker.serial;
    g_hash_table_insert(worker.waiting, GUINT_TO_POINTER(req->serial), g_object_ref(msg));
    soup_server_message_pause(msg);
    worker_send("call", hostd_guest_api_call_to_variant(&call, req->serial));
}

/* hostd's answer to a call: its status and body, or the worker's own refusal. */
static void
worker_answer(GVariant *payload)
{
    guint32 serial, status, retry;
    const char *body;
    gsize len;
    gpointer found = NULL;
    g_autoptr(SoupServerMessage) msg = NULL;
    Request *req;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE("(uuus)")))
        return;
    g_variant_get(payload, "(uuu&s)", &serial, &status, &retry, &body);
    if (!g_hash_table_steal_extended(worker.waiting, GUINT_TO_POINTER(serial), NULL, &found))
        return;
    msg = found;
    req = request_of(msg);
    if (req == NULL || req->finished)
        return;
    if (status == 0) {
        status = req->status;
        body = req->refusal != NULL ? req->refusal : "{}";
        if (req->allow != NULL)
            soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Allow",
                                         req->allow);
    }
    len = strlen(body);
    respond(msg, status, body, len, retry);
    soup_server_message_unpause(msg);
}

/* ---------------------------------------------------------------------------------------------
 * Connections */

static void
conn_gone(gpointer data, GObject *stream)
{
    Conn *conn = data;

    g_ptr_array_remove(worker.conns, conn);
    g_clear_object(&conn->socket);
    conn_unref(conn);
}

/* Gives the guest's connection @fd (owned) to the server. */
static void
conn_take(int fd)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GSocket) socket = NULL;
    g_autoptr(GSocketConnection) stream = NULL;
    g_autoptr(GSocketAddress) local = NULL;
    g_autoptr(GSocketAddress) remote = NULL;
    Conn *conn;

    if (worker.conns->len >= 2 * CONNECTIONS) {
        close(fd);
        worker_refused(HOSTD_GUEST_API_REFUSED_OPEN);
        return;
    }
    socket = g_socket_new_from_fd(fd, &error);
    if (socket == NULL) {
        close(fd);
        fprintf(stderr, "vm-guest-api-worker %s: %s\n", worker.agent, error->message);
        return;
    }
    stream = g_socket_connection_factory_create_connection(socket);
    conn = g_new0(Conn, 1);
    conn->refs = 2; /* the open connection's, and the remote address's */
    conn->socket = g_object_ref(socket);
    conn->deadline = g_get_monotonic_time() + (gint64)REQUEST_MS * 1000;
    conn->over = worker.conns->len >= CONNECTIONS;
    g_ptr_array_add(worker.conns, conn);
    g_object_weak_ref(G_OBJECT(stream), conn_gone, conn);
    /* libsoup wants addresses; the guest's end has none that means anything here. */
    local = g_inet_socket_address_new_from_string(VM_GUEST_API_ADDRESS, VM_GUEST_API_PORT);
    remote = g_inet_socket_address_new_from_string("0.0.0.0", 0);
    g_object_set_data_full(G_OBJECT(remote), "vm-guest-api", conn, conn_unref);
    (void)soup_server_accept_iostream(worker.server, G_IO_STREAM(stream), local, remote, NULL);
}

/* Cuts connections that have not sent their whole request in time. */
static gboolean
conns_tick(gpointer data)
{
    gint64 now = g_get_monotonic_time();

    for (guint i = 0; i < worker.conns->len; i++) {
        Conn *conn = worker.conns->pdata[i];

        if (conn->deadline != 0 && now > conn->deadline && conn->socket != NULL) {
            conn->deadline = 0;
            worker_refused(HOSTD_GUEST_API_REFUSED_SLOW);
            conn_cut(conn);
        }
    }
    return G_SOURCE_CONTINUE;
}

static void
pending_free(gpointer data)
{
    int *fd = data;

    close(*fd);
    worker.pending--;
    g_free(fd);
}

/* A helper's connection: its one message carries the guest's connection. Called when it is
 * readable, or with no @condition once PENDING_MS passed. */
static gboolean
pending_ready(gint fd, GIOCondition condition, gpointer data)
{
    int guest = vm_fd_receive(fd, NULL);

    if (guest == -EAGAIN && condition != 0)
        return G_SOURCE_CONTINUE;
    if (guest >= 0)
        conn_take(guest);
    else if (guest != -ECONNRESET)
        worker_refused(HOSTD_GUEST_API_REFUSED_NOTHING);
    return G_SOURCE_REMOVE;
}

static gboolean
listen_ready(gint listen_fd, GIOCondition condition, gpointer data)
{
    for (int i = 0; i < 32; i++) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        GSource *source;

        if (fd < 0)
            break;
        if (worker.pending >= PENDING_MAX) {
            close(fd);
            worker_refused(HOSTD_GUEST_API_REFUSED_HANDING);
            continue;
        }
        worker.pending++;
        source = g_unix_fd_source_new(fd, G_IO_IN);
        g_source_set_ready_time(source, g_get_monotonic_time() + PENDING_MS * 1000);
        g_source_set_callback(source, G_SOURCE_FUNC(pending_ready), g_memdup2(&fd, sizeof(fd)),
                              pending_free);
        g_source_attach(source, NULL);
        g_source_unref(source);
    }
    return G_SOURCE_CONTINUE;
}

/* ---------------------------------------------------------------------------------------------
 * The channel */

static gboolean
channel_ready(gint fd, GIOCondition condition, gpointer data)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) payload =
        vm_wire_recv(fd, HOSTD_GUEST_API_WIRE_TO_WORKER_MAX, &kind, &error);

    if (payload == NULL) {
        /* hostd is gone or asks it to stop: so are the guest's connections. */
        g_main_loop_quit(worker.loop);
        return G_SOURCE_REMOVE;
    }
    if (g_str_equal(kind, "answer"))
        worker_answer(payload);
    else if (g_str_equal(kind, "ping") && g_variant_is_of_type(payload, G_VARIANT_TYPE_UINT32))
        /* hostd's check that it still runs: a stopped or stuck worker is replaced. */
        worker_send("pong", g_variant_new_uint32(g_variant_get_uint32(payload)));
    return G_SOURCE_CONTINUE;
}

static int
fail(const char *what, GError *error)
{
    g_autofree char *message = g_strdup_printf("%s: %s", what, error->message);

    worker_send("failed", g_variant_new_string(message));
    fprintf(stderr, "vm-guest-api-worker %s: %s\n", worker.agent, message);
    return 1;
}

/* Reads the "start" message and confines the process. */
static gboolean
worker_start(GError **error)
{
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) start = NULL;
    g_autoptr(GVariantDict) dict = NULL;
    gboolean change_user = FALSE;
    guint32 uid = 0, gid = 0;

    start = vm_wire_recv(worker.fd, HOSTD_GUEST_API_WIRE_TO_WORKER_MAX, &kind, error);
    if (start == NULL)
        return FALSE;
    if (!g_str_equal(kind, "start") || !g_variant_is_of_type(start, G_VARIANT_TYPE_VARDICT))
        return vm_throw(error, VM_ERROR_PROTOCOL, "'%s' before 'start'", kind);
    dict = g_variant_dict_new(start);
    (void)g_variant_dict_lookup(dict, "change-user", "b", &change_user);
    (void)g_variant_dict_lookup(dict, "uid", "u", &uid);
    (void)g_variant_dict_lookup(dict, "gid", "u", &gid);
    /* Before the first guest byte: nothing the guest sends is read with privileges. */
    return vm_egress_sandbox_enter(VM_SANDBOX_API, change_user, uid, gid, NULL, error);
}

int
main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    GSource *source;

    worker.fd = HOSTD_GUEST_API_WORKER_CONTROL_FD;
    worker.agent = argc == 2 ? argv[1] : "?";
    if (argc > 2 || fcntl(worker.fd, F_GETFD) < 0 ||
        fcntl(HOSTD_GUEST_API_WORKER_LISTEN_FD, F_GETFD) < 0) {
        fprintf(stderr,
                "vm-guest-api-worker: hostd runs this, with its channel on fd %d and the API's "
                "socket on fd %d\n",
                HOSTD_GUEST_API_WORKER_CONTROL_FD, HOSTD_GUEST_API_WORKER_LISTEN_FD);
        return 2;
    }
    /* The loop and the server exist before the sandbox: what they set up is no guest's. */
    worker.loop = g_main_loop_new(NULL, FALSE);
    worker.conns = g_ptr_array_new();
    worker.waiting = g_hash_table_new_full(NULL, NULL, NULL, g_object_unref);
    worker.server = soup_server_new(NULL, NULL);
    if (!worker_start(&error))
        return fail("cannot start", error);
    if (fcntl(HOSTD_GUEST_API_WORKER_LISTEN_FD, F_SETFL, O_NONBLOCK) < 0) {
        vm_throw_errno(&error, errno, "cannot use the API's socket");
        return fail("cannot start", error);
    }
    soup_server_add_early_handler(worker.server, NULL, request_early, NULL, NULL);
    soup_server_add_handler(worker.server, NULL, request_handle, NULL, NULL);
    g_signal_connect(worker.server, "request-started", G_CALLBACK(request_started), NULL);
    g_signal_connect(worker.server, "request-read", G_CALLBACK(request_read), NULL);
    g_unix_fd_add(worker.fd, G_IO_IN | G_IO_HUP | G_IO_ERR, channel_ready, NULL);
    g_unix_fd_add(HOSTD_GUEST_API_WORKER_LISTEN_FD, G_IO_IN, listen_ready, NULL);
    source = g_timeout_source_new_seconds(1);
    g_source_set_callback(source, conns_tick, NULL, NULL);
    g_source_attach(source, NULL);
    g_source_unref(source);
    worker_send("ready", g_variant_new("()"));
    g_main_loop_run(worker.loop);
    return 0;
}
