/* The egress proxy: an accept thread and one thread per guest connection. */
#include "vm-egress-proxy.h"
#include "vm-egress-dns.h"
#include "vm-egress-intercept.h"
#include "vm-egress-tls.h"
#include "vm-error.h"
#include "vm-util.h"
#include "vm-fd-pass.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#define DEFAULT_MAX_CONNECTIONS 64
#define DEFAULT_HANDSHAKE_MS    (10 * 1000)
#define DEFAULT_IDLE_MS         (5 * 60 * 1000)
#define DEFAULT_CONNECT_MS      (10 * 1000)
/* How often a waiting connection looks at the stop flag and the policy generation: the bound on
 * how long a refused tunnel stays open after a policy change. */
#define TICK_MS          200
#define RELAY_BUFFER     (128 * 1024) /* per connection and direction */
#define LOCAL_REFRESH_US (5 * G_USEC_PER_SEC)
#define DRAIN_US         (200 * 1000)
#define DRAIN_MAX        (256 * 1024)
/* Guest bytes read past the current request's body, kept for the next request head: enough for
 * a whole head and the start of its body; past it the guest is not read until their turn. */
#define NEXT_MAX (2 * VM_EGRESS_REQUEST_HEAD_MAX)
/* Queries one DNS connection may carry: glibc sends A and AAAA on one, a search list a few
 * more. */
#define DNS_QUERIES_MAX 16

struct _VmEgressProxy {
    VmEgressConfig config;
    char *listen_address;
    char *listen_path; /* NULL: TCP or the caller's socket */
    gboolean on_unix;  /* guest connections are handed over on a Unix socket */
    int listen_fd;
    int wake[2];
    guint16 port;
    GThread *acceptor;
    gint stopping;   /* atomic */
    gint generation; /* atomic; bumped by each policy change */

    GMutex log_lock;    /* one record at a time to the log callback; the totals below */
    guint64 total_up;   /* bytes of every request that ended, guest to destination */
    guint64 total_down; /* and destination to guest */
    GMutex lock;
    GCond idle;
    VmEgressPolicy *policy;
    VmEgressCredentials *credentials; /* NULL: none */
    VmEgressInterceptor *interceptor; /* NULL: the proxy has no CA, intercepts nothing */
    VmEgressDnsTable *dns;            /* the names the resolver gave synthetic addresses */
    guint active;
    GArray *local; /* the host's own addresses, refreshed now and then */
    gint64 local_time;
};

/* A guest connection. It may carry several requests one after the other (keep-alive,
 * pipelining): each is parsed, decided, connected and logged on its own, and the fields below
 * "per request" are reset between them (conn_next_request()). */
typedef struct {
    VmEgressProxy *proxy;
    int fd;
    gboolean on_unix;   /* accepted on the Unix socket: may hand over the guest's connection */
    GByteArray *next;   /* guest bytes after the last request's body: the next request's start */
    gboolean guest_eof; /* the guest shut down its sending side */
    gboolean dns;       /* handed over with VM_FD_PASS_TAG_DNS: DNS over TCP, not HTTP */
    char *origin_host;  /* non-NULL: a synthetic tunnel that carries plain HTTP to this name */
    guint16 origin_port;

    /* per request */
    gint64 start_time;
    gint64 start_mono;
    VmEgressRequest *request;
    gboolean synthetic; /* the request named a synthetic address, mapped to its name */
    char *host;         /* the request's host, normalised, once the policy allowed it */
    gboolean host_is_literal;
    VmEgressAddress address;
    gboolean have_address;
    int up_fd;
    gint generation; /* of the policy the decision used */
    guint64 bytes_up;
    guint64 bytes_down;
    GByteArray *pending_up; /* guest bytes after the head, not yet sent */
    const char *secret;     /* the grant substituted in an intercepted request, for its record */
} Conn;

/* ---------------------------------------------------------------------------------------------
 * Records */

char *
vm_egress_record_to_json(const VmEgressRecord *record)
{
    g_autoptr(JsonBuilder) builder = json_builder_new();
    g_autoptr(JsonGenerator) generator = json_generator_new();
    g_autoptr(JsonNode) root = NULL;
    g_autoptr(GDateTime) time = g_date_time_new_from_unix_utc(record->start_time / G_USEC_PER_SEC);
    g_autoptr(GDateTime) precise = NULL;
    g_autofree char *stamp = NULL;

    precise = g_date_time_add(time, record->start_time % G_USEC_PER_SEC);
    stamp = g_date_time_format_iso8601(precise);
    json_builder_begin_object(builder);
    json_builder_set_member_name(builder, "time");
    json_builder_add_string_value(builder, stamp);
    json_builder_set_member_name(builder, "event");
    json_builder_add_string_value(builder,
                                  record->kind == VM_EGRESS_RECORD_ALLOWED ? "allowed" : "denied");
    json_builder_set_member_name(builder, "host");
    if (record->host != NULL)
        json_builder_add_string_value(builder, record->host);
    else
        json_builder_add_null_value(builder);
    json_builder_set_member_name(builder, "port");
    json_builder_add_int_value(builder, record->port);
    json_builder_set_member_name(builder, "address");
    if (record->address != NULL)
        json_builder_add_string_value(builder, record->address);
    else
        json_builder_add_null_value(builder);
    json_builder_set_member_name(builder, "reason");
    if (record->reason != NULL)
        json_builder_add_string_value(builder, record->reason);
    else
        json_builder_add_null_value(builder);
    json_builder_set_member_name(builder, "bytes_up");
    json_builder_add_int_value(builder, (gint64)record->bytes_up);
    json_builder_set_member_name(builder, "bytes_down");
    json_builder_add_int_value(builder, (gint64)record->bytes_down);
    json_builder_set_member_name(builder, "duration_ms");
    json_builder_add_int_value(builder, record->duration_us / 1000);
    if (record->secret != NULL) {
        json_builder_set_member_name(builder, "secret");
        json_builder_add_string_value(builder, record->secret);
    }
    json_builder_end_object(builder);
    root = json_builder_get_root(builder);
    json_generator_set_root(generator, root);
    return json_generator_to_data(generator, NULL);
}

static void
conn_log(Conn *conn, VmEgressRecordKind kind, const char *reason)
{
    VmEgressProxy *proxy = conn->proxy;
    g_autofree char *address = NULL;
    VmEgressRecord record = {
        .kind = kind,
        .start_time = conn->start_time,
        .reason = reason,
        .bytes_up = conn->bytes_up,
        .bytes_down = conn->bytes_down,
        .duration_us = g_get_monotonic_time() - conn->start_mono,
        .secret = conn->secret,
    };

    g_mutex_lock(&proxy->log_lock);
    proxy->total_up += conn->bytes_up;
    proxy->total_down += conn->bytes_down;
    g_mutex_unlock(&proxy->log_lock);
    if (proxy->config.log == NULL)
        return;
    if (conn->request != NULL) {
        record.host = conn->request->host;
        record.port = conn->request->port;
    }
    if (conn->have_address) {
        address = vm_egress_address_to_string(&conn->address);
        record.address = address;
    }
    g_mutex_lock(&proxy->log_lock);
    proxy->config.log(&record, proxy->config.log_data);
    g_mutex_unlock(&proxy->log_lock);
}

/* ---------------------------------------------------------------------------------------------
 * Small socket helpers */

static gboolean
stopping(VmEgressProxy *proxy)
{
    return g_atomic_int_get(&proxy->stopping) != 0;
}

/* Sends a short error response; best effort, since the connection closes right after. Closing
 * a socket with unread input makes the kernel send a reset that can destroy the response before
 * the guest reads it, so the guest's remaining bytes are drained (briefly, boundedly) first. */
static void
respond_full(int fd, int code, const char *status, const char *message, gboolean drain)
{
    g_autofree char *text = g_strdup_printf("HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n"
                                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                                            code, status, strlen(message) + 1, message);
    gint64 deadline = g_get_monotonic_time() + DRAIN_US;
    gsize drained = 0;

    (void)send(fd, text, strlen(text), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)shutdown(fd, SHUT_WR);
    while (drain && drained < DRAIN_MAX) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        gint64 left = deadline - g_get_monotonic_time();
        char buf[4096];
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, (int)(left / 1000 + 1)) <= 0)
            break;
        n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        drained += n;
    }
}

static void
respond(int fd, int code, const char *status, const char *message)
{
    respond_full(fd, code, status, message, TRUE);
}

/* Sends all of @data on a non-blocking socket, waiting for room at most @timeout_ms. */
static gboolean
send_all(int fd, const guint8 *data, gsize len, int timeout_ms)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);

        if (n > 0) {
            data += n;
            len -= n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};

            if (poll(&pfd, 1, timeout_ms) <= 0)
                return FALSE;
        } else {
            return FALSE;
        }
    }
    return TRUE;
}

static socklen_t
address_to_sockaddr(const VmEgressAddress *address, guint16 port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (address->family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)ss;

        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        memcpy(&sin->sin_addr, address->bytes, 4);
        return sizeof(*sin);
    }
    {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;

        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        memcpy(&sin6->sin6_addr, address->bytes, 16);
        return sizeof(*sin6);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Policy and resolution */

static VmEgressPolicy *
proxy_dup_policy(VmEgressProxy *proxy, GArray **ret_local)
{
    VmEgressPolicy *policy;
    gint64 now = g_get_monotonic_time();

    g_mutex_lock(&proxy->lock);
    policy = vm_egress_policy_ref(proxy->policy);
    if (ret_local != NULL) {
        if (proxy->local == NULL || now - proxy->local_time > LOCAL_REFRESH_US) {
            GArray *fresh = vm_egress_local_addresses(NULL);

            /* Keep the old list if listing fails: fail closed on the old knowledge. */
            if (fresh != NULL) {
                g_clear_pointer(&proxy->local, g_array_unref);
                proxy->local = fresh;
                proxy->local_time = now;
            }
        }
        *ret_local = proxy->local != NULL ? g_array_ref(proxy->local) : NULL;
    }
    g_mutex_unlock(&proxy->lock);
    return policy;
}

static GArray *
resolve_getaddrinfo(const char *host, gpointer user_data, GError **error)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *list = NULL;
    g_autoptr(GArray) out = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
    int rc = getaddrinfo(host, NULL, &hints, &list);

    if (rc != 0)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "cannot resolve '%s': %s", host,
                        gai_strerror(rc)),
               NULL;
    for (struct addrinfo *it = list; it != NULL; it = it->ai_next) {
        VmEgressAddress address;

        if (vm_egress_address_from_sockaddr(it->ai_addr, &address))
            g_array_append_val(out, address);
    }
    freeaddrinfo(list);
    return g_steal_pointer(&out);
}

/* A CONNECT to an address of the resolver's synthetic range (vm-egress-dns.h) is a CONNECT to
 * the name the address stands for: the request's host becomes that name, and everything after
 * (the policy, the resolution, the address check, the SNI check, interception) is done on the
 * name, as for a client that named it. An address that stands for no name, or a plain HTTP
 * request to one, is refused: it is never taken as an address. */
static gboolean
conn_map_synthetic(Conn *conn, const char **ret_reason)
{
    VmEgressAddress literal;
    char *name;

    if (!vm_egress_address_parse(conn->request->host, &literal, NULL) ||
        !vm_egress_dns_address_is_synthetic(&literal))
        return TRUE;
    name = conn->request->kind == VM_EGRESS_REQUEST_CONNECT
               ? vm_egress_dns_table_lookup(conn->proxy->dns, &literal)
               : NULL;
    if (name == NULL) {
        conn->address = literal;
        conn->have_address = TRUE;
        *ret_reason = "dns-unknown-address";
        return FALSE;
    }
    g_free(conn->request->host);
    conn->request->host = name;
    conn->synthetic = TRUE;
    return TRUE;
}

/* Decides on the whole request: host first, then every address it resolves to. On success
 * @ret_addresses holds the checked candidates. On refusal @ret_reason is set and, when an
 * address was at fault, conn->address names it. */
static gboolean
conn_decide(Conn *conn, GArray **ret_addresses, const char **ret_reason, int *ret_code)
{
    VmEgressProxy *proxy = conn->proxy;
    g_autoptr(GArray) local = NULL;
    g_autoptr(VmEgressPolicy) policy = NULL;
    g_autofree char *host = NULL;
    g_autoptr(GArray) addresses = NULL;
    VmEgressAddress literal;
    VmEgressVerdict verdict;

    /* The generation is read before the policy: a change racing with this decision is then
     * seen by the relay, which re-checks. */
    conn->generation = g_atomic_int_get(&proxy->generation);
    policy = proxy_dup_policy(proxy, &local);
    *ret_code = 403;
    if (!conn_map_synthetic(conn, ret_reason))
        return FALSE;
    verdict = vm_egress_policy_check_host(policy, conn->request->host, conn->request->port, &host);
    if (verdict != VM_EGRESS_ALLOW) {
        *ret_reason = vm_egress_verdict_name(verdict);
        return FALSE;
    }
    if (vm_egress_address_parse(host, &literal, NULL)) {
        addresses = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
        g_array_append_val(addresses, literal);
    } else {
        VmEgressResolveFunc resolve =
            proxy->config.resolve != NULL ? proxy->config.resolve : resolve_getaddrinfo;

        addresses = resolve(host, proxy->config.resolve_data, NULL);
        if (addresses == NULL || addresses->len == 0) {
            *ret_code = 502;
            *ret_reason = "resolve-failed";
            return FALSE;
        }
    }
    /* One refused candidate refuses the name: a name that mixes public and internal addresses
     * is not one to trust with the public half either. */
    for (guint i = 0; i < addresses->len; i++) {
        VmEgressAddress *address = &g_array_index(addresses, VmEgressAddress, i);

        verdict = vm_egress_policy_check_address(policy, address, conn->request->port, local);
        if (verdict != VM_EGRESS_ALLOW) {
            conn->address = *address;
            conn->have_address = TRUE;
            *ret_reason = vm_egress_verdict_name(verdict);
            return FALSE;
        }
    }
    conn->host_is_literal = vm_egress_address_parse(host, &literal, NULL);
    conn->host = g_steal_pointer(&host);
    *ret_addresses = g_steal_pointer(&addresses);
    return TRUE;
}

/* Whether the current policy still allows this open connection. */
static gboolean
conn_still_allowed(Conn *conn)
{
    g_autoptr(GArray) local = NULL;
    g_autoptr(VmEgressPolicy) policy = proxy_dup_policy(conn->proxy, &local);

    return vm_egress_policy_check_host(policy, conn->request->host, conn->request->port, NULL) ==
               VM_EGRESS_ALLOW &&
           vm_egress_policy_check_address(policy, &conn->address, conn->request->port, local) ==
               VM_EGRESS_ALLOW;
}

/* ---------------------------------------------------------------------------------------------
 * Connection stages */

/* Feeds @len bytes of the head to @parser; TRUE once the head is complete (*@ret_ok TRUE) or the
 * request is refused (*@ret_ok FALSE), FALSE while more is needed. */
static gboolean
conn_feed(Conn *conn, VmEgressParser *parser, const guint8 *buf, gsize len, gboolean *ret_ok,
          const char **ret_reason, int *ret_code, char **ret_message)
{
    g_autoptr(GError) error = NULL;
    gsize consumed = 0;

    switch (vm_egress_parser_feed(parser, buf, len, &consumed, &error)) {
    case VM_EGRESS_PARSE_MORE:
        return FALSE;
    case VM_EGRESS_PARSE_DONE:
        conn->request = vm_egress_parser_steal_request(parser);
        g_byte_array_append(conn->pending_up, buf + consumed, len - consumed);
        *ret_ok = TRUE;
        return TRUE;
    case VM_EGRESS_PARSE_ERROR:
    default:
        *ret_reason = "bad-request";
        *ret_code = 400;
        *ret_message = g_strdup(error->message);
        *ret_ok = FALSE;
        return TRUE;
    }
}

/* Waits until @fd is readable, @deadline (monotonic) passes or the proxy stops. */
static gboolean
conn_wait_until(Conn *conn, int fd, gint64 deadline, const char **ret_reason, int *ret_code)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        gint64 left = deadline - g_get_monotonic_time();
        int rc;

        if (stopping(conn->proxy)) {
            *ret_reason = "shutdown";
            *ret_code = 503;
            return FALSE;
        }
        if (left <= 0) {
            *ret_reason = "timeout";
            *ret_code = 408;
            return FALSE;
        }
        rc = poll(&pfd, 1, (int)MIN(left / 1000 + 1, TICK_MS));
        if (rc < 0 && errno != EINTR) {
            *ret_reason = "io-error";
            *ret_code = 0;
            return FALSE;
        }
        if (rc > 0)
            return TRUE;
    }
}

/* Waits until @fd is readable, the handshake deadline passes or the proxy stops. */
static gboolean
conn_wait_readable(Conn *conn, int fd, const char **ret_reason, int *ret_code)
{
    return conn_wait_until(
        conn, fd, conn->start_mono + (gint64)conn->proxy->config.handshake_timeout_ms * 1000,
        ret_reason, ret_code);
}

/* On the Unix socket, the first message either hands over the guest's connection (one byte with
 * one stream socket as SCM_RIGHTS), which then replaces conn->fd, or is the first byte of a
 * request head, returned in @ret_byte with *@ret_len 1. */
static gboolean
conn_take_over(Conn *conn, guint8 *ret_byte, gsize *ret_len, const char **ret_reason, int *ret_code)
{
    for (;;) {
        int fd;

        if (!conn_wait_readable(conn, conn->fd, ret_reason, ret_code))
            return FALSE;
        fd = vm_fd_receive(conn->fd, (char *)ret_byte);
        if (fd == -EAGAIN || fd == -EINTR)
            continue;
        if (fd == -ENOMSG) {
            *ret_len = 1;
            return TRUE;
        }
        /* Anything but exactly one stream socket is refused: the proxy only ever speaks to the
         * guest through what it was given, and only a socket can be that. */
        if (fd == -EPROTO) {
            *ret_reason = "bad-request";
            *ret_code = 0;
            return FALSE;
        }
        if (fd < 0) {
            *ret_reason = "incomplete-request";
            *ret_code = 0;
            return FALSE;
        }
        close(conn->fd);
        conn->fd = fd;
        conn->dns = *ret_byte == VM_FD_PASS_TAG_DNS;
        *ret_len = 0;
        return TRUE;
    }
}

/* Reads a request head before the handshake deadline: the first one of the connection, or a
 * later one (@first FALSE), which starts with the bytes kept in conn->next. A later request
 * that never began (the guest closed or stayed silent after the last response) ends the
 * connection quietly: *@ret_reason stays NULL. */
static gboolean
conn_read_head(Conn *conn, gboolean first, const char **ret_reason, int *ret_code,
               char **ret_message)
{
    g_autoptr(VmEgressParser) parser =
        conn->origin_host != NULL ? vm_egress_parser_new_http(conn->origin_host, conn->origin_port)
                                  : vm_egress_parser_new();
    guint8 buf[4096];
    gboolean ok = FALSE;
    gboolean began = conn->next->len > 0;

    if (conn->next->len > 0) {
        g_autoptr(GByteArray) kept = g_steal_pointer(&conn->next);

        conn->next = g_byte_array_new();
        if (conn_feed(conn, parser, kept->data, kept->len, &ok, ret_reason, ret_code, ret_message))
            return ok;
    }
    for (;;) {
        ssize_t n;

        if (conn->guest_eof) {
            n = 0;
        } else {
            if (!conn_wait_readable(conn, conn->fd, ret_reason, ret_code)) {
                if (!first && !began && g_strcmp0(*ret_reason, "timeout") == 0)
                    *ret_reason = NULL, *ret_code = 0;
                return FALSE;
            }
            n = recv(conn->fd, buf, sizeof(buf), 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
        }
        if (n <= 0) {
            *ret_reason = first || began ? "incomplete-request" : NULL;
            *ret_code = 0;
            return FALSE;
        }
        began = TRUE;
        if (conn_feed(conn, parser, buf, n, &ok, ret_reason, ret_code, ret_message))
            return ok;
    }
}

/* For a CONNECT to a name: reads the guest's ClientHello (bounded, before the handshake timeout
 * counted from now) into conn->pending_up, where it waits to be forwarded unchanged, and checks
 * that its SNI names the CONNECT host. FALSE with @ret_reason when it does not, or when what came
 * is not a ClientHello. */
static gboolean
conn_check_sni(Conn *conn, const char **ret_reason)
{
    gint64 deadline =
        g_get_monotonic_time() + (gint64)conn->proxy->config.handshake_timeout_ms * 1000;
    guint8 buf[4096];

    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autofree char *sni = NULL;
        g_autofree char *name = NULL;
        int code = 0;
        ssize_t n;

        switch (vm_egress_tls_client_hello_sni(conn->pending_up->data, conn->pending_up->len, &sni,
                                               &error)) {
        case VM_EGRESS_HELLO_DONE:
            if (sni == NULL) {
                *ret_reason = "sni-missing";
                return FALSE;
            }
            name = vm_egress_host_normalise(sni, NULL);
            if (name == NULL || strcmp(name, conn->host) != 0) {
                *ret_reason = "sni-mismatch";
                return FALSE;
            }
            return TRUE;
        case VM_EGRESS_HELLO_ERROR:
            *ret_reason = "not-tls";
            return FALSE;
        case VM_EGRESS_HELLO_MORE:
        default:
            break;
        }
        if (conn->pending_up->len >= VM_EGRESS_CLIENT_HELLO_MAX) {
            *ret_reason = "not-tls";
            return FALSE;
        }
        if (!conn_wait_until(conn, conn->fd, deadline, ret_reason, &code))
            return FALSE;
        n = recv(conn->fd, buf,
                 MIN(sizeof(buf), VM_EGRESS_CLIENT_HELLO_MAX - conn->pending_up->len), 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n <= 0) {
            *ret_reason = "incomplete-request";
            return FALSE;
        }
        g_byte_array_append(conn->pending_up, buf, n);
    }
}

/* A TCP socket to @address:@port with its connect() begun, or a negative errno: made here, or by
 * whoever the configuration names (an egress worker's hostd, which checks the address again). */
static int
conn_connect_start(VmEgressProxy *proxy, const VmEgressAddress *address, guint16 port)
{
    struct sockaddr_storage ss;
    socklen_t sslen;
    int one = 1;
    vm_autofd fd = -1;

    if (proxy->config.connect != NULL) {
        fd = proxy->config.connect(address, port, proxy->config.connect_data);
        if (fd < 0)
            return fd;
    } else {
        sslen = address_to_sockaddr(address, port, &ss);
        fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return -errno;
        if (connect(fd, (struct sockaddr *)&ss, sslen) < 0 && errno != EINPROGRESS)
            return -errno;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return g_steal_fd(&fd);
}

/* Connects to the first candidate that answers before the connect deadline; -EACCES when
 * every candidate was refused by the one who connects for the proxy. */
static int
conn_connect(Conn *conn, GArray *addresses)
{
    gint64 deadline =
        g_get_monotonic_time() + (gint64)conn->proxy->config.connect_timeout_ms * 1000;
    gboolean refused = addresses->len > 0;

    for (guint i = 0; i < addresses->len; i++) {
        const VmEgressAddress *address = &g_array_index(addresses, VmEgressAddress, i);
        vm_autofd fd = conn_connect_start(conn->proxy, address, conn->request->port);

        conn->address = *address;
        conn->have_address = TRUE;
        refused = refused && fd == -EACCES;
        if (fd < 0)
            continue;
        for (;;) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            gint64 left = deadline - g_get_monotonic_time();
            int err = 0;
            socklen_t errlen = sizeof(err);

            if (left <= 0 || stopping(conn->proxy))
                return -1;
            if (poll(&pfd, 1, (int)MIN(left / 1000 + 1, TICK_MS)) <= 0)
                continue;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) < 0 || err != 0)
                break;
            return g_steal_fd(&fd);
        }
    }
    return refused ? -EACCES : -1;
}

typedef struct {
    int from;
    int to;
    guint8 *buf;
    gsize start; /* first byte read from @from and not yet written to @to */
    gsize end;
    gboolean eof;     /* @from is done */
    gboolean shut;    /* @to was shut down for writing */
    gboolean keep_to; /* @from's end does not shut @to (a later response may follow) */
    guint64 *total;
    const char *error; /* how the direction failed */
    /* From the guest, for a plain HTTP request: only its body goes up; the bytes after it are
     * kept in @next for the next request head, which is checked on its own. */
    VmEgressBodyFramer *framer;
    gboolean body_done;
    GByteArray *next;
} Direction;

static gsize
direction_pending(const Direction *d)
{
    return d->end - d->start;
}

static void
direction_open(Direction *d, int from, int to, guint64 *total)
{
    memset(d, 0, sizeof(*d));
    d->from = from;
    d->to = to;
    d->total = total;
    d->buf = g_malloc(RELAY_BUFFER);
}

static void
direction_close(Direction *d)
{
    g_free(d->buf);
    vm_egress_body_framer_free(d->framer);
}

/* Runs the body framer over the bytes just read: what follows the body moves to @next. */
static gboolean
direction_frame(Direction *d)
{
    g_autoptr(GError) error = NULL;
    gsize consumed = 0;

    if (d->framer == NULL || d->body_done)
        return TRUE;
    switch (vm_egress_body_framer_feed(d->framer, d->buf + d->start, direction_pending(d),
                                       &consumed, &error)) {
    case VM_EGRESS_PARSE_MORE:
        return TRUE;
    case VM_EGRESS_PARSE_DONE:
        g_byte_array_append(d->next, d->buf + d->start + consumed, direction_pending(d) - consumed);
        d->end = d->start + consumed;
        d->body_done = TRUE;
        return TRUE;
    case VM_EGRESS_PARSE_ERROR:
    default:
        d->error = "bad-request";
        return FALSE;
    }
}

/* Moves what it can in one direction without blocking. FALSE on a fatal socket error or bad
 * body framing (d->error says which).
 *
 * The bytes pass through a buffer of ours, not through a pipe with splice(): measured with
 * bench/egress, the spliced hop cost more CPU than the two copies it saves (a guest's tunnel ran
 * at about 0.5-0.65x a direct loopback transfer with splice, at 0.9x and more with this buffer,
 * which stays in the cache; the kernel builds TCP segments from a copy as it does for any
 * sender). A full buffer stops reading from that side until the other side took it. */
static gboolean
direction_pump(Direction *d, gboolean *ret_moved)
{
    for (;;) {
        ssize_t n;

        if (direction_pending(d) > 0) {
            n = send(d->to, d->buf + d->start, direction_pending(d), MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    return TRUE;
                d->error = "reset";
                return FALSE;
            }
            d->start += n;
            *d->total += n;
            *ret_moved = TRUE;
            if (direction_pending(d) > 0)
                return TRUE;
        }
        if (d->eof) {
            if (!d->shut && !d->keep_to) {
                (void)shutdown(d->to, SHUT_WR);
                d->shut = TRUE;
            }
            return TRUE;
        }
        if (d->body_done && d->next->len >= NEXT_MAX)
            return TRUE;
        n = recv(d->from, d->buf,
                 d->body_done ? MIN(RELAY_BUFFER, NEXT_MAX - d->next->len) : RELAY_BUFFER,
                 MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return TRUE;
            d->error = "reset";
            return FALSE;
        }
        *ret_moved = TRUE;
        if (n == 0) {
            d->eof = TRUE;
            continue;
        }
        if (d->body_done) {
            g_byte_array_append(d->next, d->buf, n);
            continue;
        }
        d->start = 0;
        d->end = n;
        if (!direction_frame(d))
            return FALSE;
    }
}

/* Whether @d wants to read from its source now. */
static gboolean
direction_wants_input(const Direction *d)
{
    return direction_pending(d) == 0 && !d->eof && !(d->body_done && d->next->len >= NEXT_MAX);
}

/* Relays bytes both ways until both sides are done, or, for a plain HTTP request, until the
 * destination closed after the whole body went up. Returns how it ended. */
static const char *
conn_relay_loop(Conn *conn, Direction *up, Direction *down)
{
    VmEgressProxy *proxy = conn->proxy;
    gint generation = conn->generation;
    gint64 last_activity = g_get_monotonic_time();

    for (;;) {
        struct pollfd pfd[2] = {{.fd = conn->fd}, {.fd = conn->up_fd}};
        gboolean moved = FALSE;
        gint64 now;

        if (!direction_pump(up, &moved))
            return up->error;
        if (!direction_pump(down, &moved))
            return down->error;
        now = g_get_monotonic_time();
        if (moved)
            last_activity = now;
        if (down->eof && direction_pending(down) == 0 &&
            ((up->eof && direction_pending(up) == 0) ||
             (up->body_done && direction_pending(up) == 0)))
            return "closed";
        /* The destination closed before the whole body went up: no next request can follow,
         * so the guest learns of the close at once, as in a tunnel. */
        if (down->eof && direction_pending(down) == 0 && down->keep_to && !down->shut) {
            (void)shutdown(conn->fd, SHUT_WR);
            down->shut = TRUE;
        }
        if (stopping(proxy))
            return "shutdown";
        if (g_atomic_int_get(&proxy->generation) != generation) {
            generation = g_atomic_int_get(&proxy->generation);
            if (!conn_still_allowed(conn))
                return "policy-changed";
        }
        if (now - last_activity > (gint64)proxy->config.idle_timeout_ms * 1000)
            return "idle";
        if (moved)
            continue;
        if (direction_pending(up) > 0)
            pfd[1].events |= POLLOUT;
        else if (direction_wants_input(up))
            pfd[0].events |= POLLIN;
        if (direction_pending(down) > 0)
            pfd[0].events |= POLLOUT;
        else if (direction_wants_input(down))
            pfd[1].events |= POLLIN;
        if (poll(pfd, 2, TICK_MS) < 0 && errno != EINTR)
            return "io-error";
    }
}

/* Relays the request's connection. The guest bytes already read (conn->pending_up) go first.
 * For a plain HTTP request, *@ret_more tells whether the guest sent a next request after this
 * one's body, to be read from conn->next once this response is through. */
static const char *
conn_relay(Conn *conn, gboolean *ret_more)
{
    gboolean http = conn->request->kind == VM_EGRESS_REQUEST_HTTP;
    Direction up, down;
    const char *ended;

    *ret_more = FALSE;
    direction_open(&up, conn->fd, conn->up_fd, &conn->bytes_up);
    direction_open(&down, conn->up_fd, conn->fd, &conn->bytes_down);
    /* the guest may already have closed its side after a pipelined request */
    up.eof = conn->guest_eof;
    /* An empty GByteArray may have no data at all: memcpy() must not see NULL even for 0. */
    if (conn->pending_up->len > 0)
        memcpy(up.buf, conn->pending_up->data, conn->pending_up->len);
    up.end = conn->pending_up->len;
    g_byte_array_set_size(conn->pending_up, 0);
    if (http) {
        up.framer = vm_egress_body_framer_new(conn->request);
        up.next = conn->next;
        down.keep_to = TRUE;
    }
    if (http && !direction_frame(&up))
        ended = up.error;
    else
        ended = conn_relay_loop(conn, &up, &down);
    conn->guest_eof = up.eof;
    if (http && strcmp(ended, "closed") == 0 && up.body_done && conn->next->len > 0)
        *ret_more = TRUE;
    else if (http)
        (void)shutdown(conn->fd, SHUT_WR);
    direction_close(&down);
    direction_close(&up);
    return ended;
}

/* ---------------------------------------------------------------------------------------------
 * Interception (vm-egress-intercept.h) */

static VmEgressCredentials *
proxy_dup_credentials(VmEgressProxy *proxy)
{
    VmEgressCredentials *creds;

    g_mutex_lock(&proxy->lock);
    creds = proxy->credentials != NULL ? vm_egress_credentials_ref(proxy->credentials) : NULL;
    g_mutex_unlock(&proxy->lock);
    return creds;
}

static VmEgressCredentials *
intercept_dup_credentials(gpointer data)
{
    Conn *conn = data;

    return proxy_dup_credentials(conn->proxy);
}

/* Whether an intercepted connection must end now: shutdown, a policy that refuses it, or grants
 * that no longer name its host. Looked at only when the generation moved. */
static const char *
intercept_interrupted(gpointer data)
{
    Conn *conn = data;
    gint generation = g_atomic_int_get(&conn->proxy->generation);

    if (stopping(conn->proxy))
        return "shutdown";
    if (generation != conn->generation) {
        g_autoptr(VmEgressCredentials) creds = proxy_dup_credentials(conn->proxy);

        conn->generation = generation;
        if (!conn_still_allowed(conn))
            return "policy-changed";
        if (!vm_egress_credentials_intercepts(creds, conn->host))
            return "credentials-changed";
    }
    return NULL;
}

/* A record per intercepted request: its own bytes and time, the CONNECT's host and address. */
static void
intercept_log(gpointer data, VmEgressRecordKind kind, const char *reason, const char *secret,
              guint64 bytes_up, guint64 bytes_down)
{
    Conn *conn = data;

    conn->bytes_up = bytes_up;
    conn->bytes_down = bytes_down;
    conn->secret = secret;
    conn_log(conn, kind, reason);
    conn->secret = NULL;
    conn->start_time = g_get_real_time();
    conn->start_mono = g_get_monotonic_time();
}

/* Whether this allowed CONNECT is intercepted: the proxy has a CA and a grant names its host. */
static gboolean
conn_intercepts(Conn *conn)
{
    g_autoptr(VmEgressCredentials) creds = NULL;

    if (conn->request->kind != VM_EGRESS_REQUEST_CONNECT || conn->proxy->interceptor == NULL)
        return FALSE;
    creds = proxy_dup_credentials(conn->proxy);
    return vm_egress_credentials_intercepts(creds, conn->host);
}

/* An intercepted CONNECT once connected: TLS to the destination, verified, before the guest
 * hears 200; then the guest's SNI as for a tunnel, then the requests (each logged on its own).
 */
static void
conn_intercept(Conn *conn)
{
    VmEgressProxy *proxy = conn->proxy;
    g_autoptr(GError) error = NULL;
    static const char established[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    const char *reason = NULL;
    VmEgressInterceptConn ic_conn = {
        .guest_fd = conn->fd,
        .up_fd = conn->up_fd,
        .host = conn->host,
        .connect_host = conn->request->host,
        .port = conn->request->port,
        .host_is_literal = conn->host_is_literal,
        .guest_pending = conn->pending_up,
        .handshake_timeout_ms = proxy->config.handshake_timeout_ms,
        .idle_timeout_ms = proxy->config.idle_timeout_ms,
        .dup_credentials = intercept_dup_credentials,
        .interrupted = intercept_interrupted,
        .log = intercept_log,
        .data = conn,
    };
    g_autoptr(VmEgressIntercept) ic = vm_egress_intercept_new(proxy->interceptor, &ic_conn);

    if (!vm_egress_intercept_upstream(ic, proxy->config.connect_timeout_ms, &error)) {
        g_autofree char *text = g_strdup_printf("egress to %s:%u refused: %s", conn->request->host,
                                                conn->request->port, error->message);

        respond(conn->fd, 502, "Bad Gateway", text);
        conn_log(conn, VM_EGRESS_RECORD_DENIED, error->message);
        return;
    }
    if (!send_all(conn->fd, (const guint8 *)established, strlen(established), 1000)) {
        conn_log(conn, VM_EGRESS_RECORD_ALLOWED, "reset");
        return;
    }
    if (!conn->host_is_literal && !conn_check_sni(conn, &reason)) {
        conn_log(conn, VM_EGRESS_RECORD_DENIED, reason);
        return;
    }
    vm_egress_intercept_serve(ic);
}

/* Whether the tunnel's first byte (waited for within the handshake timeout) starts an HTTP
 * request rather than a TLS record; FALSE with @ret_reason set when none came. */
static gboolean
conn_tunnel_carries_http(Conn *conn, const char **ret_reason)
{
    gint64 deadline =
        g_get_monotonic_time() + (gint64)conn->proxy->config.handshake_timeout_ms * 1000;

    while (conn->pending_up->len == 0) {
        guint8 byte;
        int code = 0;
        ssize_t n;

        if (!conn_wait_until(conn, conn->fd, deadline, ret_reason, &code))
            return FALSE;
        n = recv(conn->fd, &byte, 1, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n <= 0) {
            *ret_reason = "incomplete-request";
            return FALSE;
        }
        g_byte_array_append(conn->pending_up, &byte, 1);
    }
    return g_ascii_isupper(conn->pending_up->data[0]);
}

/* Answers a request head that could not be read (@code 0: nothing to answer) and logs why
 * (@reason NULL: the connection just ended). */
static void
conn_refuse_head(Conn *conn, int code, const char *reason, const char *message)
{
    if (code != 0)
        respond(conn->fd, code,
                code == 400   ? "Bad Request"
                : code == 408 ? "Request Timeout"
                              : "Service Unavailable",
                message != NULL ? message : reason);
    if (reason != NULL)
        conn_log(conn, VM_EGRESS_RECORD_DENIED, reason);
}

/* Serves one request of the connection: head, decisions, connection, relay, record. TRUE when
 * another request follows on the same connection. */
static gboolean
conn_serve_one(Conn *conn, gboolean first)
{
    VmEgressProxy *proxy = conn->proxy;
    g_autoptr(GArray) addresses = NULL;
    g_autofree char *message = NULL;
    const char *reason = NULL;
    const char *ended;
    gboolean more = FALSE;
    int code = 0;

    if (!conn_read_head(conn, first, &reason, &code, &message)) {
        conn_refuse_head(conn, code, reason, message);
        return FALSE;
    }
    /* A placeholder goes nowhere unencrypted, whatever the policy says of the host. */
    if (conn->request->kind == VM_EGRESS_REQUEST_HTTP) {
        g_autoptr(VmEgressCredentials) creds = proxy_dup_credentials(proxy);
        g_autoptr(GError) error = NULL;

        if (!vm_egress_credentials_check_plain(creds, conn->request, &error)) {
            respond(conn->fd, 403, "Forbidden", error->message);
            conn_log(conn, VM_EGRESS_RECORD_DENIED, error->message);
            return FALSE;
        }
    }
    if (!conn_decide(conn, &addresses, &reason, &code)) {
        g_autofree char *text = g_strdup_printf("egress to %s:%u refused: %s", conn->request->host,
                                                conn->request->port, reason);

        respond(conn->fd, code, code == 403 ? "Forbidden" : "Bad Gateway", text);
        conn_log(conn, VM_EGRESS_RECORD_DENIED, reason);
        return FALSE;
    }
    if (proxy->config.rewrite != NULL) {
        g_autoptr(GError) error = NULL;

        if (!proxy->config.rewrite(conn->request, proxy->config.rewrite_data, &error)) {
            respond(conn->fd, 403, "Forbidden", error != NULL ? error->message : "refused");
            conn_log(conn, VM_EGRESS_RECORD_DENIED, "rewrite-refused");
            return FALSE;
        }
    }
    conn->up_fd = conn_connect(conn, addresses);
    if (conn->up_fd == -EACCES) {
        g_autofree char *text = g_strdup_printf("egress to %s:%u refused: connect-refused",
                                                conn->request->host, conn->request->port);

        respond(conn->fd, 403, "Forbidden", text);
        conn_log(conn, VM_EGRESS_RECORD_DENIED, "connect-refused");
        return FALSE;
    }
    if (conn->up_fd < 0) {
        respond(conn->fd, 502, "Bad Gateway", "cannot connect");
        conn_log(conn, VM_EGRESS_RECORD_DENIED, "connect-failed");
        return FALSE;
    }
    if (conn_intercepts(conn)) {
        conn_intercept(conn);
        return FALSE;
    }
    if (conn->request->kind == VM_EGRESS_REQUEST_CONNECT) {
        static const char established[] = "HTTP/1.1 200 Connection established\r\n\r\n";

        if (!send_all(conn->fd, (const guint8 *)established, strlen(established), 1000)) {
            conn_log(conn, VM_EGRESS_RECORD_ALLOWED, "reset");
            return FALSE;
        }
        /* A program without proxy settings sends plain HTTP where it meant it (port 80 through
         * the guest's redirect): served as proxy requests to the name, each decided anew. */
        if (conn->synthetic && conn_tunnel_carries_http(conn, &reason)) {
            conn->origin_host = g_strdup(conn->host);
            conn->origin_port = conn->request->port;
            g_byte_array_append(conn->next, conn->pending_up->data, conn->pending_up->len);
            return TRUE;
        }
        if (reason != NULL) {
            conn_log(conn, VM_EGRESS_RECORD_DENIED, reason);
            return FALSE;
        }
        /* A tunnel to a name carries TLS for that name: the ClientHello must say so before a
         * byte goes up. An address that a CIDR rule allows is trusted with any bytes. */
        if (!conn->host_is_literal && !conn_check_sni(conn, &reason)) {
            conn_log(conn, VM_EGRESS_RECORD_DENIED, reason);
            return FALSE;
        }
    } else {
        g_autoptr(GBytes) head = vm_egress_request_build_head(conn->request);
        gsize len;
        const guint8 *data = g_bytes_get_data(head, &len);

        conn->bytes_up = len;
        if (!send_all(conn->up_fd, data, len, proxy->config.idle_timeout_ms)) {
            conn_log(conn, VM_EGRESS_RECORD_ALLOWED, "reset");
            return FALSE;
        }
    }
    ended = conn_relay(conn, &more);
    conn_log(conn, VM_EGRESS_RECORD_ALLOWED, ended);
    return more;
}

/* ---------------------------------------------------------------------------------------------
 * DNS over TCP (vm-egress-dns.h) */

static VmEgressDnsVerdict
conn_dns_decide(const char *name, gpointer data, char **ret_name)
{
    Conn *conn = data;
    VmEgressProxy *proxy = conn->proxy;
    g_autoptr(VmEgressPolicy) policy = proxy_dup_policy(proxy, NULL);
    g_autofree char *normalised = NULL;
    g_autoptr(GArray) addresses = NULL;
    VmEgressResolveFunc resolve =
        proxy->config.resolve != NULL ? proxy->config.resolve : resolve_getaddrinfo;

    if (vm_egress_policy_check_name(policy, name, &normalised) != VM_EGRESS_ALLOW)
        return VM_EGRESS_DNS_NAME_DENIED;
    addresses = resolve(normalised, proxy->config.resolve_data, NULL);
    if (addresses == NULL || addresses->len == 0)
        return VM_EGRESS_DNS_NAME_NOT_FOUND;
    *ret_name = g_steal_pointer(&normalised);
    return VM_EGRESS_DNS_NAME_ALLOWED;
}

/* Reads exactly @len bytes before the handshake deadline. */
static gboolean
conn_recv_exact(Conn *conn, guint8 *buf, gsize len)
{
    const char *reason = NULL;
    int code = 0;

    while (len > 0) {
        ssize_t n;

        if (!conn_wait_readable(conn, conn->fd, &reason, &code))
            return FALSE;
        n = recv(conn->fd, buf, len, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n <= 0)
            return FALSE;
        buf += n;
        len -= n;
    }
    return TRUE;
}

/* One record for a query the resolver refused. */
static void
conn_log_dns(Conn *conn, const char *name, const char *reason)
{
    VmEgressProxy *proxy = conn->proxy;
    VmEgressRecord record = {
        .kind = VM_EGRESS_RECORD_DENIED,
        .start_time = conn->start_time,
        .host = name,
        .port = 53,
        .reason = reason,
        .duration_us = g_get_monotonic_time() - conn->start_mono,
    };

    if (proxy->config.log == NULL)
        return;
    g_mutex_lock(&proxy->log_lock);
    proxy->config.log(&record, proxy->config.log_data);
    g_mutex_unlock(&proxy->log_lock);
}

/* Serves DNS over TCP (RFC 7766: a 2-byte length before each message) on the guest's
 * connection: a few queries, each whole within the handshake timeout, answered in order. A
 * length out of bounds, a short read or a query too broken to answer ends the connection. */
static void
conn_serve_dns(Conn *conn)
{
    for (guint i = 0; i < DNS_QUERIES_MAX && !stopping(conn->proxy); i++) {
        g_auto(VmEgressDnsResult) result = {0};
        g_autoptr(GBytes) answer = NULL;
        guint8 query[VM_EGRESS_DNS_MESSAGE_MAX];
        guint8 length[2];
        gsize len;
        const guint8 *data;

        conn->start_time = g_get_real_time();
        conn->start_mono = g_get_monotonic_time();
        if (!conn_recv_exact(conn, length, 2))
            return;
        len = (gsize)length[0] << 8 | length[1];
        if (len > sizeof(query) || !conn_recv_exact(conn, query, len))
            return;
        answer = vm_egress_dns_answer(conn->proxy->dns, query, len, conn_dns_decide, conn, &result);
        if (answer == NULL)
            return;
        if (result.decided && result.verdict == VM_EGRESS_DNS_NAME_DENIED)
            conn_log_dns(conn, result.name, "dns-denied");
        else if (result.decided && result.verdict == VM_EGRESS_DNS_NAME_NOT_FOUND)
            conn_log_dns(conn, result.name, "dns-not-found");
        data = g_bytes_get_data(answer, &len);
        length[0] = len >> 8;
        length[1] = len & 0xff;
        if (!send_all(conn->fd, length, 2, 1000) || !send_all(conn->fd, data, len, 1000))
            return;
    }
}

/* Forgets the request just served, so that the next one on the connection starts afresh: no
 * decision, address or destination carries over. */
static void
conn_next_request(Conn *conn)
{
    g_clear_pointer(&conn->request, vm_egress_request_free);
    g_clear_pointer(&conn->host, g_free);
    conn->synthetic = FALSE;
    conn->host_is_literal = FALSE;
    conn->have_address = FALSE;
    memset(&conn->address, 0, sizeof(conn->address));
    if (conn->up_fd >= 0) {
        close(conn->up_fd);
        conn->up_fd = -1;
    }
    conn->bytes_up = 0;
    conn->bytes_down = 0;
    g_byte_array_set_size(conn->pending_up, 0);
    conn->start_time = g_get_real_time();
    conn->start_mono = g_get_monotonic_time();
}

static void
conn_serve(Conn *conn)
{
    if (conn->on_unix) {
        const char *reason = NULL;
        int code = 0;
        guint8 byte = 0;
        gsize len = 0;

        if (!conn_take_over(conn, &byte, &len, &reason, &code)) {
            conn_refuse_head(conn, code, reason, NULL);
            return;
        }
        /* A client speaking HTTP on the socket itself: its first byte starts the head. */
        if (len > 0)
            g_byte_array_append(conn->next, &byte, 1);
    }
    if (conn->dns) {
        conn_serve_dns(conn);
        return;
    }
    for (gboolean first = TRUE; conn_serve_one(conn, first); first = FALSE)
        conn_next_request(conn);
}

/* Gives back a connection slot and wakes whoever waits for the proxy to drain. */
static void
proxy_release_slot(VmEgressProxy *proxy)
{
    g_mutex_lock(&proxy->lock);
    proxy->active--;
    g_cond_broadcast(&proxy->idle);
    g_mutex_unlock(&proxy->lock);
}

static void
conn_free(Conn *conn)
{
    if (conn->up_fd >= 0)
        close(conn->up_fd);
    vm_egress_request_free(conn->request);
    g_free(conn->host);
    g_free(conn->origin_host);
    g_byte_array_unref(conn->pending_up);
    g_byte_array_unref(conn->next);
    g_free(conn);
}

static gpointer
conn_thread(gpointer data)
{
    Conn *conn = data;
    VmEgressProxy *proxy = conn->proxy;

    conn_serve(conn);
    close(conn->fd);
    conn_free(conn);
    proxy_release_slot(proxy);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Accepting */

static void
proxy_accept_one(VmEgressProxy *proxy)
{
    vm_autofd fd = accept4(proxy->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    Conn *conn;
    GThread *thread;
    gboolean full;

    if (fd < 0)
        return;
    g_mutex_lock(&proxy->lock);
    full = proxy->active >= proxy->config.max_connections;
    if (!full)
        proxy->active++;
    g_mutex_unlock(&proxy->lock);

    conn = g_new0(Conn, 1);
    conn->proxy = proxy;
    conn->start_time = g_get_real_time();
    conn->start_mono = g_get_monotonic_time();
    conn->up_fd = -1;
    conn->pending_up = g_byte_array_new();
    conn->next = g_byte_array_new();
    if (full) {
        /* No draining here: the accept thread must not wait on one guest. */
        respond_full(fd, 503, "Service Unavailable", "too many connections", FALSE);
        conn_log(conn, VM_EGRESS_RECORD_DENIED, "too-many-connections");
        conn_free(conn);
        return;
    }
    if (!proxy->on_unix) {
        int one = 1;

        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    conn->on_unix = proxy->on_unix;
    conn->fd = g_steal_fd(&fd);
    thread = g_thread_try_new("egress-conn", conn_thread, conn, NULL);
    if (thread == NULL) {
        close(conn->fd);
        conn_free(conn);
        proxy_release_slot(proxy);
        return;
    }
    g_thread_unref(thread);
}

static gpointer
proxy_accept_thread(gpointer data)
{
    VmEgressProxy *proxy = data;

    while (!stopping(proxy)) {
        struct pollfd pfd[2] = {{.fd = proxy->listen_fd, .events = POLLIN},
                                {.fd = proxy->wake[0], .events = POLLIN}};

        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            g_usleep(10 * 1000);
            continue;
        }
        if (pfd[0].revents & POLLIN)
            proxy_accept_one(proxy);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Life cycle */

int
vm_egress_proxy_listen_unix(const char *path, gboolean do_chown, uid_t uid, gid_t gid,
                            GError **error)
{
    struct sockaddr_un sun;
    socklen_t sun_len;
    vm_autofd fd = -1;

    if (!vm_unix_address(path, &sun, &sun_len, error))
        return -1;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot create the egress proxy socket"), -1;
    if (unlink(path) < 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot replace %s", path), -1;
    if (bind(fd, (struct sockaddr *)&sun, sun_len) < 0)
        return vm_throw_errno(error, errno, "cannot bind the egress proxy to %s", path), -1;
    if (chmod(path, 0600) < 0 || (do_chown && chown(path, uid, gid) < 0)) {
        int saved = errno;

        (void)unlink(path);
        return vm_throw_errno(error, saved, "cannot set the owner and mode of %s", path), -1;
    }
    if (listen(fd, 128) < 0) {
        int saved = errno;

        (void)unlink(path);
        return vm_throw_errno(error, saved, "cannot listen on %s", path), -1;
    }
    return g_steal_fd(&fd);
}

/* Binds the Unix socket, gives it its owner and mode, and only then listens: nobody can connect
 * through a wider mode in between. */
static gboolean
proxy_listen_unix(VmEgressProxy *proxy, GError **error)
{
    proxy->listen_fd =
        vm_egress_proxy_listen_unix(proxy->listen_path, proxy->config.listen_chown,
                                    proxy->config.listen_uid, proxy->config.listen_gid, error);
    return proxy->listen_fd >= 0;
}

/* Serves the caller's listening socket: a duplicate, so that both close their own. */
static gboolean
proxy_listen_fd(VmEgressProxy *proxy, GError **error)
{
    proxy->listen_fd = fcntl(proxy->config.listen_fd, F_DUPFD_CLOEXEC, 3);
    if (proxy->listen_fd < 0)
        return vm_throw_errno(error, errno, "cannot take the egress proxy socket");
    if (fcntl(proxy->listen_fd, F_SETFL, O_NONBLOCK) < 0)
        return vm_throw_errno(error, errno, "cannot make the egress proxy socket non-blocking");
    return TRUE;
}

static gboolean
proxy_listen(VmEgressProxy *proxy, GError **error)
{
    VmEgressAddress address;
    struct sockaddr_storage ss;
    socklen_t sslen;
    int one = 1;

    if (!vm_egress_address_parse(proxy->listen_address, &address, error))
        return FALSE;
    sslen = address_to_sockaddr(&address, proxy->config.listen_port, &ss);
    proxy->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (proxy->listen_fd < 0)
        return vm_throw_errno(error, errno, "cannot create the egress proxy socket");
    (void)setsockopt(proxy->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(proxy->listen_fd, (struct sockaddr *)&ss, sslen) < 0) {
        int saved = errno;

        if (saved == EADDRINUSE)
            return vm_throw(error, VM_ERROR_NO_RESOURCES, "egress proxy port %s:%u is taken",
                            proxy->listen_address, proxy->config.listen_port);
        return vm_throw_errno(error, saved, "cannot bind the egress proxy to %s:%u",
                              proxy->listen_address, proxy->config.listen_port);
    }
    if (listen(proxy->listen_fd, 128) < 0)
        return vm_throw_errno(error, errno, "cannot listen on the egress proxy socket");
    sslen = sizeof(ss);
    if (getsockname(proxy->listen_fd, (struct sockaddr *)&ss, &sslen) < 0)
        return vm_throw_errno(error, errno, "cannot read the egress proxy's port");
    proxy->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return TRUE;
}

VmEgressProxy *
vm_egress_proxy_new(const VmEgressConfig *config, GError **error)
{
    g_autoptr(VmEgressProxy) proxy = g_new0(VmEgressProxy, 1);

    proxy->listen_fd = -1;
    proxy->wake[0] = proxy->wake[1] = -1;
    g_mutex_init(&proxy->log_lock);
    g_mutex_init(&proxy->lock);
    g_cond_init(&proxy->idle);
    proxy->config = *config;
    proxy->listen_address =
        g_strdup(config->listen_address != NULL ? config->listen_address : "127.0.0.1");
    proxy->config.listen_address = proxy->listen_address;
    proxy->listen_path = g_strdup(config->listen_path);
    proxy->on_unix = config->use_listen_fd || config->listen_path != NULL;
    proxy->config.listen_path = proxy->listen_path;
    if (proxy->config.max_connections == 0)
        proxy->config.max_connections = DEFAULT_MAX_CONNECTIONS;
    if (proxy->config.handshake_timeout_ms == 0)
        proxy->config.handshake_timeout_ms = DEFAULT_HANDSHAKE_MS;
    if (proxy->config.idle_timeout_ms == 0)
        proxy->config.idle_timeout_ms = DEFAULT_IDLE_MS;
    if (proxy->config.connect_timeout_ms == 0)
        proxy->config.connect_timeout_ms = DEFAULT_CONNECT_MS;
    proxy->policy =
        config->policy != NULL ? vm_egress_policy_ref(config->policy) : vm_egress_policy_new_none();
    proxy->credentials =
        config->credentials != NULL ? vm_egress_credentials_ref(config->credentials) : NULL;
    proxy->config.policy = NULL;
    proxy->config.credentials = NULL;
    proxy->dns = vm_egress_dns_table_new(config->dns_max_names);
    /* The PEM strings and the file name are read here and not kept. */
    if (config->ca_cert_pem != NULL && config->ca_key_pem != NULL) {
        proxy->interceptor =
            vm_egress_interceptor_new(config->ca_cert_pem, config->ca_key_pem,
                                      config->upstream_ca_file, config->upstream_ca_pem, error);
        if (proxy->interceptor == NULL)
            return NULL;
    }
    proxy->config.ca_cert_pem = NULL;
    proxy->config.ca_key_pem = NULL;
    proxy->config.upstream_ca_file = NULL;
    proxy->config.upstream_ca_pem = NULL;

    if (!(config->use_listen_fd        ? proxy_listen_fd(proxy, error)
          : proxy->listen_path != NULL ? proxy_listen_unix(proxy, error)
                                       : proxy_listen(proxy, error)))
        return NULL;
    if (pipe2(proxy->wake, O_CLOEXEC | O_NONBLOCK) < 0)
        return vm_throw_errno(error, errno, "cannot create the egress proxy's wake pipe"), NULL;
    proxy->acceptor = g_thread_try_new("egress-accept", proxy_accept_thread, proxy, NULL);
    if (proxy->acceptor == NULL)
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "cannot start the egress proxy thread"), NULL;
    return g_steal_pointer(&proxy);
}

void
vm_egress_proxy_free(VmEgressProxy *proxy)
{
    if (proxy == NULL)
        return;
    g_atomic_int_set(&proxy->stopping, 1);
    if (proxy->acceptor != NULL) {
        (void)!write(proxy->wake[1], "x", 1);
        g_thread_join(proxy->acceptor);
    }
    /* Connection threads see the stop flag within a tick and exit. */
    g_mutex_lock(&proxy->lock);
    while (proxy->active > 0)
        g_cond_wait(&proxy->idle, &proxy->lock);
    g_mutex_unlock(&proxy->lock);

    if (proxy->listen_fd >= 0) {
        /* Gone at once, so a guest's next connection fails instead of waiting on a dead socket. */
        if (proxy->listen_path != NULL && !proxy->config.use_listen_fd)
            (void)unlink(proxy->listen_path);
        close(proxy->listen_fd);
    }
    if (proxy->wake[0] >= 0)
        close(proxy->wake[0]);
    if (proxy->wake[1] >= 0)
        close(proxy->wake[1]);
    vm_egress_policy_unref(proxy->policy);
    g_clear_pointer(&proxy->credentials, vm_egress_credentials_unref);
    g_clear_pointer(&proxy->interceptor, vm_egress_interceptor_free);
    g_clear_pointer(&proxy->dns, vm_egress_dns_table_free);
    g_clear_pointer(&proxy->local, g_array_unref);
    g_mutex_clear(&proxy->log_lock);
    g_mutex_clear(&proxy->lock);
    g_cond_clear(&proxy->idle);
    g_free(proxy->listen_address);
    g_free(proxy->listen_path);
    g_free(proxy);
}

guint16
vm_egress_proxy_get_port(VmEgressProxy *proxy)
{
    return proxy->port;
}

void
vm_egress_proxy_set_policy(VmEgressProxy *proxy, VmEgressPolicy *policy)
{
    VmEgressPolicy *old;

    g_return_if_fail(policy != NULL);
    g_mutex_lock(&proxy->lock);
    old = proxy->policy;
    proxy->policy = vm_egress_policy_ref(policy);
    g_mutex_unlock(&proxy->lock);
    g_atomic_int_inc(&proxy->generation);
    vm_egress_policy_unref(old);
}

void
vm_egress_proxy_set_credentials(VmEgressProxy *proxy, VmEgressCredentials *credentials)
{
    VmEgressCredentials *old;

    g_mutex_lock(&proxy->lock);
    old = proxy->credentials;
    proxy->credentials = credentials != NULL ? vm_egress_credentials_ref(credentials) : NULL;
    g_mutex_unlock(&proxy->lock);
    g_atomic_int_inc(&proxy->generation);
    if (old != NULL)
        vm_egress_credentials_unref(old);
}

gboolean
vm_egress_proxy_pass_fd(const char *path, int fd, GError **error)
{
    int rc = vm_fd_pass(path, fd);
    if (rc == -ENAMETOOLONG)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "socket path too long: %s", path);
    if (rc == -ENOENT || rc == -ECONNREFUSED)
        return vm_throw(error, VM_ERROR_NOT_RUNNING, "no egress proxy at %s", path);
    if (rc < 0)
        return vm_throw_errno(error, -rc, "cannot hand the connection to %s", path);
    return TRUE;
}

VmEgressPolicy *
vm_egress_proxy_dup_policy(VmEgressProxy *proxy)
{
    return proxy_dup_policy(proxy, NULL);
}

void
vm_egress_proxy_get_bytes(VmEgressProxy *proxy, guint64 *ret_up, guint64 *ret_down)
{
    g_mutex_lock(&proxy->log_lock);
    *ret_up = proxy->total_up;
    *ret_down = proxy->total_down;
    g_mutex_unlock(&proxy->log_lock);
}

guint
vm_egress_proxy_get_n_connections(VmEgressProxy *proxy)
{
    guint n;

    g_mutex_lock(&proxy->lock);
    n = proxy->active;
    g_mutex_unlock(&proxy->lock);
    return n;
}
