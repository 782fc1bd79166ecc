/* The credential broker's interception end to end on 127.0.0.1: a real GnuTLS upstream whose
 * certificate a test CA signs (the proxy's upstream_ca_file), the proxy with an agent CA, and a
 * GnuTLS client that trusts the agent CA and goes through CONNECT. The upstream keeps every
 * plaintext byte it receives, so each case asserts what reached it: the real value where a grant
 * allows it, nothing of a refused request. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-ca.h"
#include "vm-egress-proxy.h"
#include "vm-fd-pass.h"
#include "vm-error.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-egress-fixture.h"
#include "test-sink.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <poll.h>
#include <resolv.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#define IO_TIMEOUT_MS 5000
/* The bulk download: a body of BULK_SIZE bytes, blocks of 'a'..'z' repeated. */
#define BULK_SIZE  (64 * 1024 * 1024)
#define BULK_BLOCK (256 * 1024)
/* The echo past the pipelining size: this many bytes before the request and after it. */
#define ECHO_BULK_FILL (1536 * 1024)

#define PH_API   "vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define PH_KEY   "vmph_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC"
#define PH_BASIC "vmph_DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD"

/* ---------------------------------------------------------------------------------------------
 * The upstream: a GnuTLS HTTP/1.1 server, a thread per connection */

typedef struct {
    int listen_fd;
    guint16 port;
    gnutls_certificate_credentials_t creds;
    GThread *thread;
    gint stop;
    GMutex lock;
    GCond cond;
    GString *received; /* every plaintext byte received, all connections */
    guint connections; /* TCP connections accepted */
    guint handshakes;  /* TLS handshakes completed */
    char *alpn;        /* what the last handshake negotiated */
    gboolean release;  /* the streaming answer may send its second piece */
    GPtrArray *workers;
} Upstream;

typedef struct {
    Upstream *up;
    int fd;
} Worker;

/* Reads one request (head, and a Content-Length body) from @session; FALSE at the end. */
static gboolean
upstream_read_request(Upstream *up, gnutls_session_t session, GString *head)
{
    char buf[4096];
    gsize body = 0;
    char *end;

    g_string_truncate(head, 0);
    while ((end = strstr(head->str, "\r\n\r\n")) == NULL) {
        ssize_t n = gnutls_record_recv(session, buf, sizeof(buf));

        if (n <= 0)
            return FALSE;
        g_string_append_len(head, buf, n);
        g_mutex_lock(&up->lock);
        g_string_append_len(up->received, buf, n);
        g_mutex_unlock(&up->lock);
    }
    const char *cl = strstr(head->str, "Content-Length: ");
    if (cl != NULL && cl < end)
        body = g_ascii_strtoull(cl + 16, NULL, 10);
    for (gsize have = head->len - (end + 4 - head->str); have < body;) {
        ssize_t n = gnutls_record_recv(session, buf, MIN(sizeof(buf), body - have));

        if (n <= 0)
            return FALSE;
        have += n;
        g_mutex_lock(&up->lock);
        g_string_append_len(up->received, buf, n);
        g_mutex_unlock(&up->lock);
    }
    return TRUE;
}

static gboolean
upstream_send_len(gnutls_session_t session, const char *data, gsize len)
{
    while (len > 0) {
        ssize_t n = gnutls_record_send(session, data, len);
        if (n <= 0)
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}

static void
upstream_send(gnutls_session_t session, const char *text)
{
    (void)upstream_send_len(session, text, strlen(text));
}

/* Sends @text as one chunk. */
static void
upstream_send_chunk(gnutls_session_t session, const char *text, gsize len)
{
    g_autofree char *chunk = g_strdup_printf("%zx\r\n%.*s\r\n", len, (int)len, text);

    upstream_send(session, chunk);
}

/* Waits until the test lets the streaming answer go on (at most IO_TIMEOUT_MS). */
static void
upstream_wait_release(Upstream *up)
{
    gint64 deadline = g_get_monotonic_time() + IO_TIMEOUT_MS * 1000;

    g_mutex_lock(&up->lock);
    while (!up->release && g_cond_wait_until(&up->cond, &up->lock, deadline))
        ;
    up->release = FALSE;
    g_mutex_unlock(&up->lock);
}

/* Where a test's echo splits what it sends back: in the middle of the real value, if any. */
static gsize
echo_split(const GString *head)
{
    const char *value = strstr(head->str, "sk-real-1");

    return value != NULL ? (gsize)(value - head->str) + 4 : head->len / 2;
}

/* The answers of an upstream that gives the request back as it received it, substituted value
 * included (as TRACE, a debug page or an error body would): TRUE when @head asked for one of
 * them, which closes the connection when it ends with the close. */
static gboolean
upstream_echo(Upstream *up, gnutls_session_t session, const GString *head, gboolean *ret_close)
{
    gsize split = echo_split(head);
    g_autofree char *auth = NULL;
    const char *line = strstr(head->str, "Authorization: ");

    auth = line != NULL ? g_strndup(line + 15, strcspn(line + 15, "\r")) : g_strdup("none");
    *ret_close = FALSE;
    if (g_str_has_prefix(head->str, "GET /echo ")) {
        /* in a header field and in a Content-Length body */
        g_autofree char *start = g_strdup_printf(
            "HTTP/1.1 200 OK\r\nX-Echo: %s\r\nContent-Length: %zu\r\n\r\n", auth, head->len + 3);

        upstream_send(session, start);
        upstream_send_len(session, head->str, head->len);
        upstream_send(session, "END");
    } else if (g_str_has_prefix(head->str, "GET /echo-chunked ")) {
        /* the value split between two chunks, sent as two writes */
        upstream_send(session, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        upstream_send_chunk(session, head->str, split);
        g_usleep(20 * 1000);
        upstream_send_chunk(session, head->str + split, head->len - split);
        upstream_send(session, "0\r\nX-Trailer: the end\r\n\r\n");
    } else if (g_str_has_prefix(head->str, "GET /echo-close ")) {
        /* delimited by the close, the value split between two writes */
        upstream_send(session, "HTTP/1.1 200 OK\r\n\r\n");
        upstream_send_len(session, head->str, split);
        g_usleep(20 * 1000);
        upstream_send_len(session, head->str + split, head->len - split);
        (void)gnutls_bye(session, GNUTLS_SHUT_WR);
        *ret_close = TRUE;
    } else if (g_str_has_prefix(head->str, "GET /echo-early ")) {
        /* in an interim head */
        g_autofree char *early =
            g_strdup_printf("HTTP/1.1 103 Early Hints\r\nLink: <%s>\r\n\r\nHTTP/1.1 200 OK\r\n"
                            "Content-Length: 2\r\n\r\nok",
                            auth);

        upstream_send(session, early);
    } else if (g_str_has_prefix(head->str, "GET /echo-bulk ")) {
        /* past the size where two threads relay the body, split between two writes */
        g_autofree char *filler = g_strnfill(ECHO_BULK_FILL, 'f');
        g_autofree char *start = g_strdup_printf("HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n",
                                                 2 * (gsize)ECHO_BULK_FILL + head->len + 3);

        upstream_send(session, start);
        upstream_send_len(session, filler, ECHO_BULK_FILL);
        upstream_send_len(session, head->str, split);
        g_usleep(20 * 1000);
        upstream_send_len(session, head->str + split, head->len - split);
        upstream_send_len(session, filler, ECHO_BULK_FILL);
        upstream_send(session, "END");
    } else if (g_str_has_prefix(head->str, "GET /sse ")) {
        /* server-sent events: the value comes in an event split between two chunks, the test
         * releasing each step */
        const char *value = strstr(auth, "sk-real-1");
        gsize at = value != NULL ? (gsize)(value - auth) + 4 : strlen(auth);
        g_autofree char *second = g_strdup_printf("data: two\n\ndata: %.*s", (int)at, auth);
        g_autofree char *rest = g_strdup_printf("%s\n\n", auth + at);
        upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n");
        upstream_send_chunk(session, "data: first\n\n", 13);
        upstream_wait_release(up);
        upstream_send_chunk(session, second, strlen(second));
        upstream_wait_release(up);
        upstream_send_chunk(session, rest, strlen(rest));
        upstream_send_chunk(session, "data: last\n\n", 12);
        upstream_send(session, "0\r\n\r\n");
    } else if (g_str_has_prefix(head->str, "GET /gzip ")) {
        upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                               "Content-Length: 2\r\n\r\nok");
    } else {
        return FALSE;
    }
    return TRUE;
}

static gpointer
upstream_worker(gpointer data)
{
    Worker *worker = data;
    Upstream *up = worker->up;
    gnutls_session_t session = NULL;
    const gnutls_datum_t protocols[] = {{(unsigned char *)"h2", 2},
                                        {(unsigned char *)"http/1.1", 8}};
    gnutls_datum_t alpn = {NULL, 0};
    g_autoptr(GString) head = g_string_new(NULL);
    struct timeval tv = {.tv_sec = 5};

    (void)setsockopt(worker->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (gnutls_init(&session, GNUTLS_SERVER) < 0 || gnutls_set_default_priority(session) < 0 ||
        gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, up->creds) < 0 ||
        /* h2 first and the server's choice: http/1.1 comes out only when h2 was not offered */
        gnutls_alpn_set_protocols(session, protocols, 2, GNUTLS_ALPN_SERVER_PRECEDENCE) < 0)
        goto out;
    gnutls_transport_set_int(session, worker->fd);
    if (gnutls_handshake(session) < 0)
        goto out;
    g_mutex_lock(&up->lock);
    up->handshakes++;
    g_free(up->alpn);
    up->alpn = gnutls_alpn_get_selected_protocol(session, &alpn) == 0
                   ? g_strndup((const char *)alpn.data, alpn.size)
                   : g_strdup("");
    g_mutex_unlock(&up->lock);
    while (upstream_read_request(up, session, head)) {
        gboolean closed = FALSE;

        if (upstream_echo(up, session, head, &closed)) {
            if (closed)
                break;
        } else if (g_str_has_prefix(head->str, "GET /stream ")) {
            gint64 deadline = g_get_monotonic_time() + IO_TIMEOUT_MS * 1000;

            upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n6\r\nfirst\n\r\n");
            g_mutex_lock(&up->lock);
            while (!up->release && g_cond_wait_until(&up->cond, &up->lock, deadline))
                ;
            up->release = FALSE;
            g_mutex_unlock(&up->lock);
            upstream_send(session, "7\r\nsecond\n\r\n0\r\n\r\n");
        } else if (g_str_has_prefix(head->str, "GET /bulk ")) {
            g_autofree char *block = g_malloc(BULK_BLOCK);
            g_autofree char *start =
                g_strdup_printf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", BULK_SIZE);

            for (int i = 0; i < BULK_BLOCK; i++)
                block[i] = (char)('a' + i % 26);
            upstream_send(session, start);
            for (int sent = 0; sent < BULK_SIZE; sent += BULK_BLOCK)
                if (!upstream_send_len(session, block, BULK_BLOCK))
                    break;
        } else if (g_str_has_prefix(head->str, "HEAD ")) {
            /* the length of the body a GET would get, and no body */
            upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
        } else if (g_str_has_prefix(head->str, "GET /204 ")) {
            upstream_send(session, "HTTP/1.1 204 No Content\r\n\r\n");
        } else if (g_str_has_prefix(head->str, "GET /304 ")) {
            upstream_send(session, "HTTP/1.1 304 Not Modified\r\nContent-Length: 1000\r\n\r\n");
        } else if (g_str_has_prefix(head->str, "GET /early ")) {
            upstream_send(session, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                                   "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        } else if (g_str_has_prefix(head->str, "GET /until-close ")) {
            /* no length: the body ends with the connection */
            upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
                                   "all of it, then the close");
            (void)gnutls_bye(session, GNUTLS_SHUT_WR);
            break;
        } else if (g_str_has_prefix(head->str, "GET /bye ")) {
            /* a keep-alive answer, then the server closes the idle connection */
            upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            (void)gnutls_bye(session, GNUTLS_SHUT_WR);
            break;
        } else {
            upstream_send(session, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    }
out:
    if (session != NULL)
        gnutls_deinit(session);
    close(worker->fd);
    g_free(worker);
    return NULL;
}

static gpointer
upstream_accept(gpointer data)
{
    Upstream *up = data;

    while (!g_atomic_int_get(&up->stop)) {
        struct pollfd pfd = {.fd = up->listen_fd, .events = POLLIN};
        Worker *worker;

        if (poll(&pfd, 1, 50) <= 0)
            continue;
        int fd = accept4(up->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        g_mutex_lock(&up->lock);
        up->connections++;
        g_mutex_unlock(&up->lock);
        worker = g_new0(Worker, 1);
        worker->up = up;
        worker->fd = fd;
        g_ptr_array_add(up->workers, g_thread_new("upstream", upstream_worker, worker));
    }
    return NULL;
}

/* An upstream for "api.test" whose certificate @ca signs. */
static Upstream *
upstream_new(const char *ca_cert, const char *ca_key)
{
    Upstream *up = g_new0(Upstream, 1);
    g_autofree char *cert = NULL;
    g_autofree char *key = NULL;

    if (!vm_egress_ca_mint(ca_cert, ca_key, "api.test", &cert, &key, NULL))
        fail_msg("cannot mint the upstream's certificate");
    gnutls_datum_t cert_datum = {(unsigned char *)cert, (unsigned)strlen(cert)};
    gnutls_datum_t key_datum = {(unsigned char *)key, (unsigned)strlen(key)};
    assert_int_equal(gnutls_certificate_allocate_credentials(&up->creds), 0);
    assert_int_equal(gnutls_certificate_set_x509_key_mem(up->creds, &cert_datum, &key_datum,
                                                         GNUTLS_X509_FMT_PEM),
                     0);
    g_mutex_init(&up->lock);
    g_cond_init(&up->cond);
    up->received = g_string_new(NULL);
    up->workers = g_ptr_array_new();
    up->listen_fd = vm_test_listen_loopback(&up->port);
    up->thread = g_thread_new("upstream-accept", upstream_accept, up);
    return up;
}

static void
upstream_free(Upstream *up)
{
    g_atomic_int_set(&up->stop, 1);
    g_thread_join(up->thread);
    for (guint i = 0; i < up->workers->len; i++)
        g_thread_join(g_ptr_array_index(up->workers, i));
    g_ptr_array_unref(up->workers);
    close(up->listen_fd);
    gnutls_certificate_free_credentials(up->creds);
    g_string_free(up->received, TRUE);
    g_free(up->alpn);
    g_mutex_clear(&up->lock);
    g_cond_clear(&up->cond);
    g_free(up);
}

static char *
upstream_dup_received(Upstream *up)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&up->lock);
    return g_strndup(up->received->str, up->received->len);
}

static void
upstream_release(Upstream *up)
{
    g_mutex_lock(&up->lock);
    up->release = TRUE;
    g_cond_broadcast(&up->cond);
    g_mutex_unlock(&up->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Log check */

/* No record ever carries a real value. */
static void
check_record(const char *json)
{
    assert_null(strstr(json, "sk-real"));
    assert_null(strstr(json, "real-key"));
}

/* ---------------------------------------------------------------------------------------------
 * Fixture */

typedef struct {
    char *dir;
    char *agent_cert;
    char *agent_key;
    char *upstream_ca;   /* its file */
    Upstream *upstream;  /* trusted through upstream_ca */
    Upstream *untrusted; /* signed by another CA */
    VmTestEgressLog *log;
    VmEgressProxy *proxy;
} Fixture;

static VmEgressCredentials *
make_creds(const char *api_value, gboolean with_api)
{
    VmEgressCredentials *creds = vm_egress_credentials_new();
    const char *hosts[] = {"api.test", NULL};

    if (with_api)
        assert_true(vm_egress_credentials_add(creds, "api", PH_API, api_value, hosts, NULL,
                                              "Bearer {}", NULL));
    assert_true(vm_egress_credentials_add(creds, "key", PH_KEY, "real-key", hosts, "X-Api-Key",
                                          NULL, NULL));
    assert_true(vm_egress_credentials_add(creds, "basic", PH_BASIC, "real-pass", hosts, NULL,
                                          "Basic {}", NULL));
    return creds;
}

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);
    g_autofree char *ca_cert = NULL;
    g_autofree char *ca_key = NULL;
    g_autofree char *other_cert = NULL;
    g_autofree char *other_key = NULL;
    g_autofree char *allow = NULL;
    g_autoptr(VmEgressPolicy) policy = NULL;
    g_autoptr(VmEgressCredentials) creds = make_creds("sk-real-1", TRUE);
    g_autoptr(GError) error = NULL;
    VmEgressConfig config = {0};

    f->dir = vm_test_make_tmpdir("test-egress-intercept-XXXXXX");
    assert_true(vm_egress_ca_generate("upstream", &ca_cert, &ca_key, NULL));
    assert_true(vm_egress_ca_generate("other", &other_cert, &other_key, NULL));
    assert_true(vm_egress_ca_generate("agent", &f->agent_cert, &f->agent_key, NULL));
    f->upstream_ca = g_build_filename(f->dir, "upstream-ca.pem", NULL);
    vm_test_write_file(f->upstream_ca, ca_cert);
    f->upstream = upstream_new(ca_cert, ca_key);
    f->untrusted = upstream_new(other_cert, other_key);
    f->log = vm_test_egress_log_new(check_record);

    allow = g_strdup_printf("api.test:%u api.test:%u 127.0.0.1/32:%u 127.0.0.1/32:%u",
                            f->upstream->port, f->untrusted->port, f->upstream->port,
                            f->untrusted->port);
    policy = vm_test_egress_policy(allow, NULL);
    config.policy = policy;
    config.resolve = vm_test_egress_resolve;
    config.log = vm_test_egress_log_func;
    config.log_data = f->log;
    config.handshake_timeout_ms = 3000;
    config.credentials = creds;
    config.ca_cert_pem = f->agent_cert;
    config.ca_key_pem = f->agent_key;
    config.upstream_ca_file = f->upstream_ca;
    f->proxy = vm_egress_proxy_new(&config, &error);
    if (f->proxy == NULL)
        fail_msg("proxy: %s", error->message);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    vm_egress_proxy_free(f->proxy);
    upstream_free(f->upstream);
    upstream_free(f->untrusted);
    vm_test_egress_log_free(f->log);
    vm_test_remove_tree(f->dir);
    g_free(f->dir);
    g_free(f->upstream_ca);
    g_free(f->agent_cert);
    g_free(f->agent_key);
    g_free(f);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The client: CONNECT, then TLS trusting the agent's CA */

typedef struct {
    int fd;
    gnutls_session_t session;
    gnutls_certificate_credentials_t creds;
    guint16 port; /* the upstream's: "Host: api.test" in a request gets it */
} Client;

static int
proxy_connect_to(Fixture *f, const char *host, guint16 port, GString **ret_response)
{
    int fd = vm_test_connect_loopback(vm_egress_proxy_get_port(f->proxy), 5);
    g_autofree char *connect =
        g_strdup_printf("CONNECT %s:%u HTTP/1.1\r\nHost: %s:%u\r\n\r\n", host, port, host, port);

    vm_test_send_text(fd, connect);
    *ret_response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    return fd;
}

static int
proxy_connect(Fixture *f, guint16 port, GString **ret_response)
{
    return proxy_connect_to(f, "api.test", port, ret_response);
}

/* A client of api.test through a CONNECT to @connect_host that trusts the CA @trust: the agent's
 * for an intercepted host, the upstream's for a tunnel (where the upstream picks h2). */
static Client *
client_open_fd(Fixture *f, int fd, const char *trust)
{
    Client *c = g_new0(Client, 1);
    const gnutls_datum_t protocols[] = {{(unsigned char *)"h2", 2},
                                        {(unsigned char *)"http/1.1", 8}};
    gnutls_datum_t ca = {(unsigned char *)trust, (unsigned)strlen(trust)};
    gnutls_datum_t alpn = {NULL, 0};
    int rc;

    c->port = f->upstream->port;
    c->fd = fd;
    assert_int_equal(gnutls_certificate_allocate_credentials(&c->creds), 0);
    assert_int_equal(gnutls_certificate_set_x509_trust_mem(c->creds, &ca, GNUTLS_X509_FMT_PEM), 1);
    assert_int_equal(gnutls_init(&c->session, GNUTLS_CLIENT), 0);
    assert_int_equal(gnutls_set_default_priority(c->session), 0);
    assert_int_equal(gnutls_credentials_set(c->session, GNUTLS_CRD_CERTIFICATE, c->creds), 0);
    assert_int_equal(gnutls_server_name_set(c->session, GNUTLS_NAME_DNS, "api.test", 8), 0);
    assert_int_equal(gnutls_alpn_set_protocols(c->session, protocols, 2, 0), 0);
    gnutls_session_set_verify_cert(c->session, "api.test", 0);
    gnutls_transport_set_int(c->session, c->fd);
    rc = gnutls_handshake(c->session);
    if (rc < 0)
        fail_msg("client handshake: %s", gnutls_strerror(rc));
    /* the proxy offers http/1.1 only, even to a client that asks for h2 first (through a
     * tunnel the upstream itself answers, and picks h2) */
    assert_int_equal(gnutls_alpn_get_selected_protocol(c->session, &alpn), 0);
    if (trust == f->agent_cert) {
        assert_int_equal(alpn.size, 8);
        assert_memory_equal(alpn.data, "http/1.1", 8);
    } else {
        assert_int_equal(alpn.size, 2);
    }
    return c;
}

static Client *
client_open_to(Fixture *f, const char *connect_host, const char *trust)
{
    g_autoptr(GString) response = NULL;
    int fd = proxy_connect_to(f, connect_host, f->upstream->port, &response);

    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200 "));
    return client_open_fd(f, fd, trust);
}

static Client *
client_open(Fixture *f)
{
    return client_open_to(f, "api.test", f->agent_cert);
}

static void
client_close(Client *c)
{
    gnutls_deinit(c->session);
    gnutls_certificate_free_credentials(c->creds);
    close(c->fd);
    g_free(c);
}

static void
client_send(Client *c, const char *request)
{
    g_autoptr(GString) with_port = g_string_new(request);
    g_autofree char *host = g_strdup_printf("Host: api.test:%u\r\n", c->port);
    const char *text = with_port->str;
    gsize len;

    g_string_replace(with_port, "Host: api.test\r\n", host, 0);
    text = with_port->str;
    len = with_port->len;
    while (len > 0) {
        ssize_t n = gnutls_record_send(c->session, text, len);
        if (n <= 0)
            fail_msg("client send: %s", gnutls_strerror((int)n));
        text += n;
        len -= n;
    }
}

/* Reads until @needle arrived (NULL: until the end); *@ret_eof when the connection ended. */
static GString *
client_read_until(Client *c, const char *needle, gboolean *ret_eof)
{
    GString *out = g_string_new(NULL);
    char buf[4096];

    if (ret_eof != NULL)
        *ret_eof = FALSE;
    for (gsize searched = 0; needle == NULL || strstr(out->str + searched, needle) == NULL;) {
        ssize_t n = gnutls_record_recv(c->session, buf, sizeof(buf));

        if (n <= 0) {
            if (ret_eof != NULL)
                *ret_eof =
                    n == 0 || n == GNUTLS_E_PREMATURE_TERMINATION || n == GNUTLS_E_PULL_ERROR;
            break;
        }
        /* only the new bytes, and the end of the old that the needle may begin in */
        if (needle != NULL)
            searched = out->len > strlen(needle) ? out->len - strlen(needle) : 0;
        g_string_append_len(out, buf, n);
    }
    return out;
}

/* Sends a GET with @header and reads its "ok" response. */
static void
client_get_ok(Client *c, const char *header)
{
    g_autofree char *request =
        g_strdup_printf("GET /v1/models HTTP/1.1\r\nHost: api.test\r\n%s\r\n\r\n", header);
    g_autoptr(GString) response = NULL;

    client_send(c, request);
    response = client_read_until(c, "\r\n\r\nok", NULL);
    if (!g_str_has_prefix(response->str, "HTTP/1.1 200 OK\r\n"))
        fail_msg("response: %s", response->str);
}

/* ---------------------------------------------------------------------------------------------
 * Tests */

/* Bearer, a custom header and Basic, one after the other on one kept-alive connection: the
 * upstream gets the real values, never a placeholder, over one connection of its own. */
static void
test_substituted(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autofree char *basic_in = g_base64_encode((const guchar *)"alice:" PH_BASIC, 51);
    g_autofree char *basic_out = g_base64_encode((const guchar *)"alice:real-pass", 15);
    g_autofree char *basic_header = g_strconcat("Authorization: Basic ", basic_in, NULL);
    g_autofree char *basic_expected = g_strconcat("Authorization: Basic ", basic_out, NULL);
    g_autofree char *received = NULL;

    client_get_ok(c, "Authorization: Bearer " PH_API);
    client_get_ok(c, "X-Api-Key: " PH_KEY);
    client_get_ok(c, basic_header);
    client_close(c);
    received = upstream_dup_received(f->upstream);
    assert_non_null(strstr(received, "GET /v1/models HTTP/1.1\r\nHost: api.test:"));
    assert_non_null(strstr(received, "Authorization: Bearer sk-real-1\r\n"));
    assert_non_null(strstr(received, "X-Api-Key: real-key\r\n"));
    assert_non_null(strstr(received, basic_expected));
    assert_null(strstr(received, "vmph_"));
    g_mutex_lock(&f->upstream->lock);
    assert_int_equal(f->upstream->connections, 1);
    assert_string_equal(f->upstream->alpn, "http/1.1"); /* the proxy offered no h2 upstream */
    g_mutex_unlock(&f->upstream->lock);

    const char *secrets[] = {"api", "key", "basic"};
    for (guint i = 0; i < 3; i++) {
        const VmTestEgressRecord *record = vm_test_egress_log_wait(f->log, i);

        assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
        assert_string_equal(record->host, "api.test");
        assert_string_equal(record->secret, secrets[i]);
        assert_string_equal(record->reason, "completed");
        assert_true(record->bytes_up > 0);
    }
    vm_test_egress_wait_idle(f->proxy);
}

/* set_credentials() takes effect at the next request of an open connection: a rotated value, a
 * revoked placeholder passed unchanged, and no grant for the host at all closes it. */
static void
test_rotation_and_revoke(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(VmEgressCredentials) rotated = make_creds("sk-real-2", TRUE);
    g_autoptr(VmEgressCredentials) revoked = make_creds(NULL, FALSE);
    g_autoptr(GString) rest = NULL;
    g_autofree char *received = NULL;
    gboolean eof = FALSE;

    client_get_ok(c, "Authorization: Bearer " PH_API);
    vm_egress_proxy_set_credentials(f->proxy, rotated);
    client_get_ok(c, "Authorization: Bearer " PH_API);
    vm_egress_proxy_set_credentials(f->proxy, revoked);
    client_get_ok(c, "Authorization: Bearer " PH_API);
    received = upstream_dup_received(f->upstream);
    assert_non_null(strstr(received, "Authorization: Bearer sk-real-1\r\n"));
    assert_non_null(strstr(received, "Authorization: Bearer sk-real-2\r\n"));
    /* revoked: never substituted, it goes as the guest wrote it */
    assert_non_null(strstr(received, "Authorization: Bearer " PH_API "\r\n"));
    assert_null(vm_test_egress_log_wait(f->log, 2)->secret);

    /* no grant names the host any more: the open connection closes */
    vm_egress_proxy_set_credentials(f->proxy, NULL);
    rest = client_read_until(c, NULL, &eof);
    assert_true(eof);
    client_close(c);
    vm_test_egress_wait_idle(f->proxy);
}

/* The destination closing an idle kept-alive connection closes the guest's, which then opens a
 * new one (intercepted afresh) instead of sending into a dead one. */
static void
test_upstream_closes_idle(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(GString) response = NULL;
    g_autoptr(GString) rest = NULL;
    gboolean eof = FALSE;

    client_send(c, "GET /bye HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, "\r\n\r\nok", NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200 OK\r\n"));
    rest = client_read_until(c, NULL, &eof);
    assert_true(eof);
    assert_int_equal(rest->len, 0);
    client_close(c);
    c = client_open(f);
    client_get_ok(c, "Authorization: Bearer " PH_API);
    client_close(c);
    assert_string_equal(vm_test_egress_log_wait(f->log, 1)->secret, "api");
    vm_test_egress_wait_idle(f->proxy);
}

/* A host that no grant names keeps the plain tunnel: the client talks TLS with the upstream
 * itself, and what it sends arrives as sent. */
static void
test_no_grant_tunnels(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmEgressCredentials) elsewhere = vm_egress_credentials_new();
    const char *hosts[] = {"other.test", NULL};
    g_autofree char *upstream_ca = vm_test_read_file(f->upstream_ca);
    g_autofree char *received = NULL;
    Client *c;

    assert_true(vm_egress_credentials_add(elsewhere, "api", PH_API, "sk-real-1", hosts, NULL,
                                          "Bearer {}", NULL));
    vm_egress_proxy_set_credentials(f->proxy, elsewhere);
    c = client_open_to(f, "api.test", upstream_ca); /* the upstream's own certificate */
    client_get_ok(c, "Authorization: Bearer " PH_API);
    client_close(c);
    received = upstream_dup_received(f->upstream);
    assert_non_null(strstr(received, "Authorization: Bearer " PH_API "\r\n"));
    const VmTestEgressRecord *record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_null(record->secret);
    assert_string_equal(record->reason, "closed");
    vm_test_egress_wait_idle(f->proxy);
}

/* A policy change that refuses the host closes an intercepted connection, as it does a tunnel. */
static void
test_policy_change_closes(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(VmEgressPolicy) none = vm_test_egress_policy(NULL, NULL);
    g_autoptr(GString) rest = NULL;
    gboolean eof = FALSE;
    gint64 start;

    client_get_ok(c, "Authorization: Bearer " PH_API);
    start = g_get_monotonic_time();
    vm_egress_proxy_set_policy(f->proxy, none);
    rest = client_read_until(c, NULL, &eof);
    assert_true(eof);
    assert_true(g_get_monotonic_time() - start < 2 * G_USEC_PER_SEC);
    client_close(c);
    vm_test_egress_wait_idle(f->proxy);
}

/* Responses without a body (HEAD, 204, 304) leave the connection ready for the next request, an
 * interim 103 comes before its final answer, and a body delimited by the close arrives whole,
 * then the connection closes. */
static void
test_response_framings(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(GString) response = NULL;
    gboolean eof = FALSE;

    client_send(c, "HEAD /v1 HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, "\r\n\r\n", NULL);
    assert_string_equal(response->str, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n");
    client_get_ok(c, "X-Api-Key: " PH_KEY);
    g_string_free(response, TRUE);
    client_send(c, "GET /204 HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, "\r\n\r\n", NULL);
    assert_string_equal(response->str, "HTTP/1.1 204 No Content\r\n\r\n");
    g_string_free(response, TRUE);
    client_send(c, "GET /304 HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, "\r\n\r\n", NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 304 Not Modified\r\n"));
    g_string_free(response, TRUE);
    client_send(c, "GET /early HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, "\r\n\r\nok", NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 103 Early Hints\r\n"));
    assert_non_null(strstr(response->str, "\r\n\r\nHTTP/1.1 200 OK\r\n"));
    g_string_free(response, TRUE);
    client_send(c, "GET /until-close HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, NULL, &eof);
    assert_true(eof);
    assert_true(g_str_has_suffix(response->str, "\r\n\r\nall of it, then the close"));
    client_close(c);
    const char *reasons[] = {"completed", "completed", "completed",
                             "completed", "completed", "closed"};
    for (guint i = 0; i < G_N_ELEMENTS(reasons); i++)
        assert_string_equal(vm_test_egress_log_wait(f->log, i)->reason, reasons[i]);
    g_mutex_lock(&f->upstream->lock);
    assert_int_equal(f->upstream->connections, 1);
    g_mutex_unlock(&f->upstream->lock);
    vm_test_egress_wait_idle(f->proxy);
}

/* Freeing the proxy ends open intercepted connections promptly, mid-response included. */
static void
test_free_with_open_connections(void **state)
{
    Fixture *f = *state;
    Client *idle = client_open(f);
    Client *streaming = client_open(f);
    g_autoptr(GString) first = NULL;
    g_autoptr(GString) rest = NULL;
    gboolean eof = FALSE;
    gint64 start;

    client_get_ok(idle, "Authorization: Bearer " PH_API);
    client_send(streaming, "GET /stream HTTP/1.1\r\nHost: api.test\r\n\r\n");
    first = client_read_until(streaming, "first\n", NULL);
    start = g_get_monotonic_time();
    g_clear_pointer(&f->proxy, vm_egress_proxy_free);
    assert_true(g_get_monotonic_time() - start < 2 * G_USEC_PER_SEC);
    rest = client_read_until(idle, NULL, &eof);
    assert_true(eof);
    upstream_release(f->upstream);
    client_close(idle);
    client_close(streaming);
}

/* A chunked, streamed answer reaches the client piece by piece: the client reads the first piece
 * while the upstream still holds back the second. */
static void
test_streamed_response(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(GString) first = NULL;
    g_autoptr(GString) second = NULL;

    client_send(c, "GET /stream HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API
                   "\r\n\r\n");
    first = client_read_until(c, "first\n", NULL);
    assert_non_null(strstr(first->str, "Transfer-Encoding: chunked\r\n"));
    assert_non_null(strstr(first->str, "6\r\nfirst\n"));
    assert_null(strstr(first->str, "second"));
    upstream_release(f->upstream);
    second = client_read_until(c, "0\r\n\r\n", NULL);
    assert_non_null(strstr(second->str, "7\r\nsecond\n\r\n0\r\n\r\n"));
    /* and the connection carries the next request */
    client_get_ok(c, "X-Api-Key: " PH_KEY);
    client_close(c);
    assert_string_equal(vm_test_egress_log_wait(f->log, 0)->secret, "api");
    vm_test_egress_wait_idle(f->proxy);
}

/* Bodies go up whole: one held until checked, one past the hold that streams, one after the
 * proxy's own "100 Continue"; each request substituted, and the connection kept. */
static void
test_request_bodies(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    gsize sizes[] = {1000, 600 * 1024};
    g_autofree char *received = NULL;
    g_autoptr(GString) response = NULL;

    for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++) {
        g_autofree char *body = g_malloc(sizes[i] + 1);
        g_autofree char *head = g_strdup_printf(
            "POST /upload HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API
            "\r\nContent-Length: %zu\r\n\r\n",
            sizes[i]);
        g_autoptr(GString) answer = NULL;

        for (gsize j = 0; j < sizes[i]; j++)
            body[j] = (char)('A' + j % 23);
        body[sizes[i]] = '\0';
        client_send(c, head);
        client_send(c, body);
        answer = client_read_until(c, "\r\n\r\nok", NULL);
        assert_true(g_str_has_prefix(answer->str, "HTTP/1.1 200 OK\r\n"));
        received = upstream_dup_received(f->upstream);
        assert_non_null(strstr(received, body));
        g_clear_pointer(&received, g_free);
    }
    client_send(c, "PUT /x HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: " PH_KEY
                   "\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    response = client_read_until(c, "\r\n\r\n", NULL);
    assert_string_equal(response->str, "HTTP/1.1 100 Continue\r\n\r\n");
    client_send(c, "hello");
    g_string_free(response, TRUE);
    response = client_read_until(c, "\r\n\r\nok", NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200 OK\r\n"));
    client_close(c);
    received = upstream_dup_received(f->upstream);
    /* identity asked: the response is scanned for the values that went up */
    assert_non_null(strstr(received, "X-Api-Key: real-key\r\nContent-Length: 5\r\n"
                                     "Accept-Encoding: identity\r\n\r\nhello"));
    assert_null(strstr(received, "Expect"));
    assert_null(strstr(received, "vmph_"));
    for (guint i = 0; i < 3; i++)
        assert_string_equal(vm_test_egress_log_wait(f->log, i)->reason, "completed");
    assert_true(vm_test_egress_log_wait(f->log, 1)->bytes_up > 600 * 1024);
    g_mutex_lock(&f->upstream->lock);
    assert_int_equal(f->upstream->connections, 1);
    g_mutex_unlock(&f->upstream->lock);
    vm_test_egress_wait_idle(f->proxy);
}

/* A guest that does not trust the agent's CA: its handshake fails, logged, nothing goes up. */
static void
test_guest_distrusts(void **state)
{
    Fixture *f = *state;
    g_autoptr(GString) response = NULL;
    g_autofree char *other_cert = NULL;
    g_autofree char *other_key = NULL;
    gnutls_certificate_credentials_t creds;
    gnutls_session_t session;
    gnutls_datum_t ca;
    int fd = proxy_connect(f, f->upstream->port, &response);
    const VmTestEgressRecord *record;

    assert_true(vm_egress_ca_generate("stranger", &other_cert, &other_key, NULL));
    ca = (gnutls_datum_t){(unsigned char *)other_cert, (unsigned)strlen(other_cert)};
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200 "));
    assert_int_equal(gnutls_certificate_allocate_credentials(&creds), 0);
    assert_int_equal(gnutls_certificate_set_x509_trust_mem(creds, &ca, GNUTLS_X509_FMT_PEM), 1);
    assert_int_equal(gnutls_init(&session, GNUTLS_CLIENT), 0);
    assert_int_equal(gnutls_set_default_priority(session), 0);
    assert_int_equal(gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, creds), 0);
    assert_int_equal(gnutls_server_name_set(session, GNUTLS_NAME_DNS, "api.test", 8), 0);
    gnutls_session_set_verify_cert(session, "api.test", 0);
    gnutls_transport_set_int(session, fd);
    assert_true(gnutls_handshake(session) < 0);
    gnutls_deinit(session);
    gnutls_certificate_free_credentials(creds);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_true(g_str_has_prefix(record->reason, "guest-tls: "));
    g_mutex_lock(&f->upstream->lock);
    assert_int_equal(f->upstream->received->len, 0);
    g_mutex_unlock(&f->upstream->lock);
    vm_test_egress_wait_idle(f->proxy);
}

/* An upstream whose certificate the proxy does not trust: the request fails before the guest's
 * TLS starts, and the upstream receives no request byte. */
static void
test_untrusted_upstream(void **state)
{
    Fixture *f = *state;
    g_autoptr(GString) response = NULL;
    int fd = proxy_connect(f, f->untrusted->port, &response);
    const VmTestEgressRecord *record;

    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 502 "));
    assert_non_null(strstr(response->str, "certificate"));
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_non_null(strstr(record->reason, "certificate"));
    assert_int_equal(record->bytes_up, 0);
    g_mutex_lock(&f->untrusted->lock);
    assert_int_equal(f->untrusted->received->len, 0);
    assert_int_equal(f->untrusted->handshakes, 0);
    g_mutex_unlock(&f->untrusted->lock);
    vm_test_egress_wait_idle(f->proxy);
}

/* Each leak on a connection that first carried a good request: refused, logged with its
 * reason, the connection closed, and nothing of it reaches the upstream. */
static void
test_leaks_refused(void **state)
{
    Fixture *f = *state;
    struct {
        const char *first, *second, *reason;
    } cases[] = {
        {"GET /v1?key=" PH_API " HTTP/1.1\r\nHost: api.test\r\n\r\n", NULL,
         "leak: placeholder of api in URL"},
        {"POST /v1 HTTP/1.1\r\nHost: api.test\r\nContent-Length: "
         "59\r\n\r\n{\"k\":\"vmph_AAAAAAAAAAAA",
         "AAAAAAAAAAAAAAAAAAAAAAAAAAAA\",\"x\":1}", "leak: placeholder of api in body"},
        /* split between two chunks: whole only once the chunked framing is taken off */
        {"POST /v1 HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
         "10\r\nvmph_AAAAAAAAAAA\r\n",
         "1d\r\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\r\n0\r\n\r\n", "leak: placeholder of api in body"},
        {"GET / HTTP/1.1\r\nHost: api.test\r\nX-Other: " PH_API "\r\n\r\n", NULL,
         "leak: placeholder of api sent to api.test"},
        {"GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: Bearer " PH_API "\r\n\r\n", NULL,
         "leak: placeholder of api sent to other.test"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        Client *c = client_open(f);
        g_autoptr(GString) response = NULL;
        g_autofree char *before = NULL;
        g_autofree char *after = NULL;
        gboolean eof = FALSE;
        const VmTestEgressRecord *record;

        client_get_ok(c, "Authorization: Bearer " PH_API);
        record = vm_test_egress_log_wait(f->log, 2 * i);
        assert_string_equal(record->secret, "api");
        before = upstream_dup_received(f->upstream);
        client_send(c, cases[i].first);
        if (cases[i].second != NULL) {
            g_usleep(100 * 1000); /* two writes, two TLS records */
            client_send(c, cases[i].second);
        }
        response = client_read_until(c, NULL, &eof);
        assert_true(eof);
        assert_true(g_str_has_prefix(response->str, "HTTP/1.1 403 "));
        record = vm_test_egress_log_wait(f->log, 2 * i + 1);
        assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
        assert_string_equal(record->reason, cases[i].reason);
        assert_int_equal(record->bytes_up, 0);
        client_close(c);
        vm_test_egress_wait_idle(f->proxy);
        after = upstream_dup_received(f->upstream);
        assert_string_equal(before, after);
    }
}

/* A placeholder in a plain HTTP request goes nowhere, whatever the host. */
static void
test_plain_http_leak(void **state)
{
    Fixture *f = *state;
    int fd = vm_test_connect_loopback(vm_egress_proxy_get_port(f->proxy), 5);
    g_autofree char *request = g_strdup_printf(
        "GET http://api.test:%u/ HTTP/1.1\r\nHost: api.test:%u\r\nAuthorization: Bearer " PH_API
        "\r\n\r\n",
        f->upstream->port, f->upstream->port);
    g_autoptr(GString) response = NULL;
    const VmTestEgressRecord *record;

    vm_test_send_text(fd, request);
    response = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 403 "));
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_string_equal(record->reason, "leak: placeholder of api over plain HTTP");
    g_mutex_lock(&f->upstream->lock);
    assert_int_equal(f->upstream->connections, 0);
    g_mutex_unlock(&f->upstream->lock);
    vm_test_egress_wait_idle(f->proxy);
}

/* Whether the @len bytes at @data are the bulk body's from offset @at. */
static gboolean
bulk_matches(const char *expected, const char *data, gsize len, gsize at)
{
    while (len > 0) {
        gsize in_block = at % BULK_BLOCK;
        gsize n = MIN(len, (gsize)BULK_BLOCK - in_block);

        if (memcmp(data, expected + in_block, n) != 0)
            return FALSE;
        data += n;
        at += n;
        len -= n;
    }
    return TRUE;
}

/* Downloads the bulk body on @c, the request carrying the header lines @fields; returns the
 * seconds it took. Every byte must be right. */
static double
download_bulk(Client *c, const char *fields)
{
    g_autofree char *request =
        g_strdup_printf("GET /bulk HTTP/1.1\r\nHost: api.test\r\n%s\r\n", fields);
    g_autoptr(GString) head = NULL;
    g_autofree char *buf = g_malloc(BULK_BLOCK);
    g_autofree char *expected = g_malloc(BULK_BLOCK);
    gint64 start = g_get_monotonic_time();
    gsize got;
    char *end;

    for (int i = 0; i < BULK_BLOCK; i++)
        expected[i] = (char)('a' + i % 26);
    client_send(c, request);
    head = client_read_until(c, "\r\n\r\n", NULL);
    assert_true(g_str_has_prefix(head->str, "HTTP/1.1 200 OK\r\n"));
    end = strstr(head->str, "\r\n\r\n") + 4;
    got = head->len - (gsize)(end - head->str);
    assert_true(bulk_matches(expected, end, got, 0));
    while (got < BULK_SIZE) {
        ssize_t n = gnutls_record_recv(c->session, buf, BULK_BLOCK);

        if (n <= 0)
            fail_msg("bulk body cut at %zu: %s", got, gnutls_strerror((int)n));
        if (!bulk_matches(expected, buf, (gsize)n, got))
            fail_msg("bulk body wrong after %zu", got);
        got += n;
    }
    return (g_get_monotonic_time() - start) / 1e6;
}

/* CPU time of the whole test process (client, upstream and proxy threads). */
static double
cpu_seconds(void)
{
    struct rusage usage;

    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

/* A large download through interception arrives whole, and at a rate comparable to a plain
 * tunnel to the same upstream (both printed; the goal is 0.8x or more); the same download on a
 * request whose value was substituted goes through the response redactor (printed against the
 * interception without it). */
static void
test_bulk_download(void **state)
{
    Fixture *f = *state;
    Client *intercepted = client_open(f);
    Client *redacted = NULL;
    Client *tunnel = NULL;
    g_autofree char *upstream_ca = vm_test_read_file(f->upstream_ca);
    double cpu0 = cpu_seconds();
    double t_intercepted = download_bulk(intercepted, "");
    double cpu1 = cpu_seconds();
    double t_tunnel, t_redacted;

    client_close(intercepted);
    vm_test_egress_wait_idle(f->proxy);
    tunnel = client_open_to(f, "127.0.0.1", upstream_ca);
    double cpu2 = cpu_seconds();
    t_tunnel = download_bulk(tunnel, "");
    double cpu3 = cpu_seconds();
    client_close(tunnel);
    vm_test_egress_wait_idle(f->proxy);
    redacted = client_open(f);
    double cpu4 = cpu_seconds();
    t_redacted = download_bulk(redacted, "Authorization: Bearer " PH_API "\r\n");
    double cpu5 = cpu_seconds();
    client_close(redacted);
    print_message("# bulk %d MiB: interception %.0f MiB/s (CPU %.2f s), tunnel %.0f MiB/s (CPU "
                  "%.2f s): %.2fx\n",
                  BULK_SIZE >> 20, (BULK_SIZE >> 20) / t_intercepted, cpu1 - cpu0,
                  (BULK_SIZE >> 20) / t_tunnel, cpu3 - cpu2, t_tunnel / t_intercepted);
    print_message("# bulk %d MiB substituted, redactor on: %.0f MiB/s (CPU %.2f s): %.2fx the "
                  "interception without\n",
                  BULK_SIZE >> 20, (BULK_SIZE >> 20) / t_redacted, cpu5 - cpu4,
                  t_intercepted / t_redacted);
    assert_string_equal(vm_test_egress_log_wait(f->log, 0)->reason, "completed");
    assert_string_equal(vm_test_egress_log_wait(f->log, 2)->reason, "completed"); /* 1: tunnel */
    vm_test_egress_wait_idle(f->proxy);
}

/* A guest that goes away in the middle of a large download: the proxy stops, logs how it ended,
 * and lets go of the connection. */
static void
test_bulk_abandoned(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autofree char *buf = g_malloc(BULK_BLOCK);
    gsize got = 0;
    const VmTestEgressRecord *record;

    client_send(c,
                "GET /bulk HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API "\r\n\r\n");
    while (got < 4 * 1024 * 1024) {
        ssize_t n = gnutls_record_recv(c->session, buf, BULK_BLOCK);

        if (n <= 0)
            fail_msg("download cut at %zu", got);
        got += n;
    }
    client_close(c);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_string_equal(record->secret, "api");
    assert_string_equal(record->reason, "reset");
    vm_test_egress_wait_idle(f->proxy);
}

/* The payload of the chunked body after the head in @response, its framing dropped. */
static GString *
dechunk(const char *response)
{
    const char *p = strstr(response, "\r\n\r\n");
    GString *out = g_string_new(NULL);

    assert_non_null(p);
    for (p += 4;;) {
        char *end = NULL;
        guint64 size = g_ascii_strtoull(p, &end, 16);

        if (size == 0 || end == p)
            break;
        p = strstr(end, "\r\n");
        assert_non_null(p);
        g_string_append_len(out, p + 2, (gssize)size);
        p += 2 + size + 2;
    }
    return out;
}

/* How many records of @log, once it holds at least @count, are @kind with @reason and @secret. */
static guint
log_count_records(VmTestEgressLog *log, guint count, VmEgressRecordKind kind, const char *reason,
                  const char *secret)
{
    guint found = 0;

    (void)vm_test_egress_log_wait(log, count - 1);
    for (guint i = 0; i < vm_test_egress_log_count(log); i++) {
        const VmTestEgressRecord *record = vm_test_egress_log_wait(log, i);

        if (record->kind == kind && g_strcmp0(record->reason, reason) == 0 &&
            g_strcmp0(record->secret, secret) == 0)
            found++;
    }
    return found;
}

/* An upstream that echoes the request it received, the substituted value in it: in a header, in
 * a Content-Length body, in a chunked body split between two chunks and two writes (trailer
 * after it), in an interim 1xx head, in a body past the size that two threads relay, and in a
 * body delimited by the close split between two writes. The guest gets the start of the
 * placeholder in its place, same length, not one byte of the value in any of them; each
 * response logs the redaction once. Identity was asked for. */
static void
test_echo_redacted(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *path;
        const char *until;
    } cases[] = {
        {"/echo", "END"},
        {"/echo-chunked", "0\r\nX-Trailer: the end\r\n\r\n"},
        {"/echo-early", "\r\n\r\nok"},
        {"/echo-bulk", "END"},
        {"/echo-close", NULL},
    };
    g_autofree char *received = NULL;

    for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
        Client *c = client_open(f);
        g_autofree char *request =
            g_strdup_printf("GET %s HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API
                            "\r\nAccept-Encoding: gzip, br\r\n\r\n",
                            cases[i].path);
        g_autoptr(GString) response = NULL;
        g_autoptr(GString) payload = NULL;

        client_send(c, request);
        response = client_read_until(c, cases[i].until, NULL);
        client_close(c);
        if (strstr(response->str, "sk-real-1") != NULL)
            fail_msg("%s: the real value came back", cases[i].path);
        assert_true(g_str_has_prefix(response->str, "HTTP/1.1 "));
        payload = i == 1 ? dechunk(response->str) : g_string_new(response->str);
        assert_null(strstr(payload->str, "sk-real-1"));
        assert_null(strstr(payload->str, "sk-re"));
        if (strstr(payload->str, "Bearer vmph_AAAA") == NULL)
            fail_msg("%s: no mask in %.300s", cases[i].path, payload->str);
    }
    /* Basic: the pair goes up in base64, and that comes back masked too */
    Client *c = client_open(f);
    g_autofree char *basic_in = g_base64_encode((const guchar *)"alice:" PH_BASIC, 51);
    g_autofree char *basic_out = g_base64_encode((const guchar *)"alice:real-pass", 15);
    g_autofree char *request = g_strdup_printf(
        "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic %s\r\n\r\n", basic_in);
    g_autoptr(GString) response = NULL;

    client_send(c, request);
    response = client_read_until(c, "END", NULL);
    client_close(c);
    assert_null(strstr(response->str, basic_out));
    assert_non_null(strstr(response->str, "X-Echo: Basic vmph_DDDDDDDDDDDDDDD\r\n"));

    assert_int_equal(log_count_records(f->log, 2 * (G_N_ELEMENTS(cases) + 1),
                                       VM_EGRESS_RECORD_DENIED,
                                       "redacted: value of api in response", "api"),
                     G_N_ELEMENTS(cases));
    assert_int_equal(log_count_records(f->log, 2 * (G_N_ELEMENTS(cases) + 1),
                                       VM_EGRESS_RECORD_DENIED,
                                       "redacted: value of basic in response", "basic"),
                     1);
    received = upstream_dup_received(f->upstream);
    assert_non_null(strstr(received, "Accept-Encoding: identity\r\n"));
    assert_null(strstr(received, "gzip"));
    vm_test_egress_wait_idle(f->proxy);
}

/* Server-sent events keep their timing: each event before the value reaches the guest while
 * the upstream still waits, even the bytes just before the value's first half; that half is
 * held until the rest shows it is the value, which the guest gets masked. */
static void
test_sse_redacted(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(GString) first = NULL;
    g_autoptr(GString) second = NULL;
    g_autoptr(GString) rest = NULL;
    g_autoptr(GString) all = g_string_new(NULL);
    g_autoptr(GString) events = NULL;

    client_send(c,
                "GET /sse HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API "\r\n\r\n");
    first = client_read_until(c, "first\n\n", NULL);
    assert_non_null(strstr(first->str, "data: first\n\n"));
    upstream_release(f->upstream);
    /* the upstream sent "data: two\n\ndata: Bearer sk-r" and waits */
    second = client_read_until(c, "data: Bearer ", NULL);
    assert_non_null(strstr(second->str, "data: two\n\n"));
    assert_null(strstr(second->str, "sk-r"));
    upstream_release(f->upstream);
    rest = client_read_until(c, "0\r\n\r\n", NULL);
    client_close(c);
    g_string_append(all, first->str);
    g_string_append(all, second->str);
    g_string_append(all, rest->str);
    events = dechunk(all->str);
    assert_string_equal(events->str,
                        "data: first\n\ndata: two\n\ndata: Bearer vmph_AAAA\n\ndata: last\n\n");
    assert_int_equal(log_count_records(f->log, 2, VM_EGRESS_RECORD_DENIED,
                                       "redacted: value of api in response", "api"),
                     1);
    vm_test_egress_wait_idle(f->proxy);
}

/* TRACE (which echoes the request), TRACK, CONNECT and unknown methods are refused inside an
 * intercepted connection, before a byte goes up, and logged. */
static void
test_methods_refused(void **state)
{
    Fixture *f = *state;
    static const char *const methods[] = {"TRACE", "TRACK", "PROPFIND", "get"};

    for (guint i = 0; i < G_N_ELEMENTS(methods); i++) {
        Client *c = client_open(f);
        g_autofree char *request = g_strdup_printf(
            "%s / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API "\r\n\r\n",
            methods[i]);
        g_autofree char *reason = g_strdup_printf("method not allowed: %s", methods[i]);
        g_autoptr(GString) response = NULL;
        const VmTestEgressRecord *record;
        gboolean eof = FALSE;

        client_send(c, request);
        response = client_read_until(c, NULL, &eof);
        client_close(c);
        assert_true(eof);
        assert_true(g_str_has_prefix(response->str, "HTTP/1.1 405 Method Not Allowed\r\n"));
        assert_non_null(strstr(response->str, "\r\nAllow: GET, HEAD, POST, PUT, PATCH, DELETE, "
                                              "OPTIONS\r\n"));
        record = vm_test_egress_log_wait(f->log, i);
        assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
        assert_string_equal(record->reason, reason);
        assert_int_equal(record->bytes_up, 0);
    }
    /* CONNECT inside is no origin-form request at all */
    Client *c = client_open(f);
    g_autoptr(GString) response = NULL;
    client_send(c, "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n");
    response = client_read_until(c, NULL, NULL);
    client_close(c);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 400 "));
    assert_int_equal(vm_test_egress_log_wait(f->log, G_N_ELEMENTS(methods))->kind,
                     VM_EGRESS_RECORD_DENIED);
    g_mutex_lock(&f->upstream->lock);
    assert_int_equal(f->upstream->received->len, 0);
    g_mutex_unlock(&f->upstream->lock);
    vm_test_egress_wait_idle(f->proxy);
}

/* Once a value went up on the connection, a compressed response (which the redactor cannot
 * read) is refused with a 502 and logged; without a substitution it passes as it is. */
static void
test_coded_response_refused(void **state)
{
    Fixture *f = *state;
    Client *c = client_open(f);
    g_autoptr(GString) response = NULL;
    g_autoptr(GString) plain = NULL;
    const VmTestEgressRecord *record;
    gboolean eof = FALSE;

    client_send(c, "GET /gzip HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " PH_API
                   "\r\nAccept-Encoding: gzip\r\n\r\n");
    response = client_read_until(c, NULL, &eof);
    client_close(c);
    assert_true(eof);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 502 Bad Gateway\r\n"));
    assert_null(strstr(response->str, "Content-Encoding: gzip"));
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_string_equal(record->reason, "refused: response Content-Encoding is not identity");
    assert_string_equal(record->secret, "api");

    c = client_open(f);
    client_send(c, "GET /gzip HTTP/1.1\r\nHost: api.test\r\nAccept-Encoding: gzip\r\n\r\n");
    plain = client_read_until(c, "\r\n\r\nok", NULL);
    client_close(c);
    assert_true(g_str_has_prefix(plain->str, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"));
    assert_string_equal(vm_test_egress_log_wait(f->log, 1)->reason, "completed");
    vm_test_egress_wait_idle(f->proxy);
}

/* A program without proxy settings: it resolved api.test through the proxy's resolver and
 * connected to the synthetic address it got (the guest's redirect sends that CONNECT). The
 * proxy intercepts and substitutes exactly as for a CONNECT to the name. */
static void
test_substituted_via_synthetic(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, "egress.sock", NULL);
    g_autofree char *allow =
        g_strdup_printf("api.test:%u 127.0.0.1/32:%u", f->upstream->port, f->upstream->port);
    g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(allow, NULL);
    g_autoptr(VmEgressCredentials) creds = make_creds("sk-real-1", TRUE);
    g_autoptr(GError) error = NULL;
    VmEgressConfig config = {
        .listen_path = path,
        .policy = policy,
        .resolve = vm_test_egress_resolve,
        .log = vm_test_egress_log_func,
        .log_data = f->log,
        .handshake_timeout_ms = 3000,
        .credentials = creds,
        .ca_cert_pem = f->agent_cert,
        .ca_key_pem = f->agent_key,
        .upstream_ca_file = f->upstream_ca,
    };
    guint8 query[NS_PACKETSZ], answer[NS_PACKETSZ], length[2];
    int qlen =
        res_mkquery(ns_o_query, "api.test", ns_c_in, ns_t_a, NULL, 0, NULL, query, sizeof(query));
    char address[INET_ADDRSTRLEN];
    g_autofree char *connect = NULL;
    g_autofree char *received = NULL;
    g_autoptr(GString) response = NULL;
    const VmTestEgressRecord *record;
    ns_msg msg;
    ns_rr rr;
    int sv[2];
    Client *c;

    vm_egress_proxy_free(f->proxy);
    f->proxy = vm_egress_proxy_new(&config, &error);
    if (f->proxy == NULL)
        fail_msg("proxy: %s", error->message);

    /* the name's address, from the resolver on a connection handed over as QEMU's helper does */
    assert_true(qlen > 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(vm_fd_pass_tagged(path, sv[1], VM_FD_PASS_TAG_DNS), 0);
    close(sv[1]);
    length[0] = qlen >> 8;
    length[1] = qlen & 0xff;
    assert_int_equal(send(sv[0], length, 2, 0), 2);
    assert_int_equal(send(sv[0], query, qlen, 0), qlen);
    assert_int_equal(recv(sv[0], length, 2, MSG_WAITALL), 2);
    assert_int_equal(recv(sv[0], answer, length[1], MSG_WAITALL), length[1]);
    close(sv[0]);
    assert_int_equal(ns_initparse(answer, length[1], &msg), 0);
    assert_int_equal(ns_msg_count(msg, ns_s_an), 1);
    assert_int_equal(ns_parserr(&msg, ns_s_an, 0, &rr), 0);
    inet_ntop(AF_INET, ns_rr_rdata(rr), address, sizeof(address));
    assert_true(g_str_has_prefix(address, "100.100."));

    /* CONNECT to it, as redsocks sends it */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(vm_fd_pass_tagged(path, sv[1], VM_FD_PASS_TAG), 0);
    close(sv[1]);
    connect = g_strdup_printf("CONNECT %s:%u HTTP/1.0\r\n\r\n", address, f->upstream->port);
    vm_test_send_text(sv[0], connect);
    response = vm_test_read_until(sv[0], "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200 "));
    c = client_open_fd(f, sv[0], f->agent_cert);
    client_get_ok(c, "Authorization: Bearer " PH_API);
    client_close(c);
    received = upstream_dup_received(f->upstream);
    assert_non_null(strstr(received, "Authorization: Bearer sk-real-1\r\n"));
    assert_null(strstr(received, "vmph_"));
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->host, "api.test");
    assert_string_equal(record->secret, "api");
    vm_test_egress_wait_idle(f->proxy);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_substituted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_substituted_via_synthetic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotation_and_revoke, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streamed_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_bodies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upstream_closes_idle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_response_framings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_grant_tunnels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy_change_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_with_open_connections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_guest_distrusts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_untrusted_upstream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_leaks_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_http_leak, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bulk_download, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bulk_abandoned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_echo_redacted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sse_redacted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_methods_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coded_response_refused, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
