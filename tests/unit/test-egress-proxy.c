/* Egress proxy end to end on 127.0.0.1: echo sinks that count what reaches them, a fake resolver
 * mapping test names to 127.0.0.1, and the proxy in between. Every refused case must deliver 0
 * bytes to the sink and leave a log record. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-proxy.h"
#include "vm-error.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-egress-fixture.h"
#include "test-sink.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>

#define IO_TIMEOUT_MS 5000

/* ---------------------------------------------------------------------------------------------
 * Log check */

/* Every record must format. */
static void
check_record(const char *json)
{
    g_assert_true(g_str_has_prefix(json, "{\"time\":"));
}

/* ---------------------------------------------------------------------------------------------
 * Fixture */

typedef struct {
    VmTestSink *sink;
    VmTestEgressLog *log;
    VmEgressProxy *proxy;
    gint resolves; /* the resolver's calls */
} Fixture;

/* The policy of vm_test_egress_policy(), with PORT in the rules standing for the sink's port. */
static VmEgressPolicy *
sink_policy(Fixture *f, const char *allow, const char *deny)
{
    g_autofree char *port = g_strdup_printf("%u", f->sink->port);
    g_autoptr(GString) a = allow != NULL ? g_string_new(allow) : NULL;
    g_autoptr(GString) d = deny != NULL ? g_string_new(deny) : NULL;

    if (a != NULL)
        g_string_replace(a, "PORT", port, 0);
    if (d != NULL)
        g_string_replace(d, "PORT", port, 0);
    return vm_test_egress_policy(a != NULL ? a->str : NULL, d != NULL ? d->str : NULL);
}

static void
fixture_start(Fixture *f, const VmEgressConfig *extra, const char *allow, const char *deny)
{
    g_autoptr(VmEgressPolicy) policy = sink_policy(f, allow, deny);
    g_autoptr(GError) error = NULL;
    VmEgressConfig config = {0};

    if (extra != NULL)
        config = *extra;
    config.policy = policy;
    config.resolve = vm_test_egress_resolve;
    config.resolve_data = &f->resolves;
    config.log = vm_test_egress_log_func;
    config.log_data = f->log;
    if (config.handshake_timeout_ms == 0)
        config.handshake_timeout_ms = 3000;
    vm_egress_proxy_free(f->proxy);
    f->proxy = vm_egress_proxy_new(&config, &error);
    if (f->proxy == NULL)
        fail_msg("proxy: %s", error->message);
}

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->sink = vm_test_sink_new();
    f->log = vm_test_egress_log_new(check_record);
    fixture_start(f, NULL, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    vm_egress_proxy_free(f->proxy);
    vm_test_sink_free(f->sink);
    vm_test_egress_log_free(f->log);
    g_free(f);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Client helpers */

static int
client_connect(Fixture *f)
{
    return vm_test_connect_loopback(vm_egress_proxy_get_port(f->proxy), 0);
}

static int
status_of(const GString *response)
{
    if (!g_str_has_prefix(response->str, "HTTP/1.1 ") || response->len < 12)
        return 0;
    return atoi(response->str + 9);
}

/* Sends @request on a new connection; returns the response status. */
static int
request_status(Fixture *f, const char *request)
{
    int fd = client_connect(f);
    g_autoptr(GString) response = NULL;
    int status;

    vm_test_send_text(fd, request);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    status = status_of(response);
    close(fd);
    return status;
}

/* Sends @data on @fd and reads it back from the echo sink behind the tunnel. */
static void
assert_echo(int fd, GBytes *data)
{
    gsize len;
    const guint8 *bytes = g_bytes_get_data(data, &len);
    g_autofree guint8 *back = g_malloc(len);
    gsize got = 0;

    assert_int_equal(send(fd, bytes, len, MSG_NOSIGNAL), len);
    while (got < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t n;

        if (poll(&pfd, 1, IO_TIMEOUT_MS) <= 0)
            break;
        n = recv(fd, back + got, len - got, 0);
        if (n <= 0)
            break;
        got += n;
    }
    assert_int_equal(got, len);
    assert_memory_equal(back, bytes, len);
}

/* ---------------------------------------------------------------------------------------------
 * Allowed */

static void
test_connect_allowed(void **state)
{
    Fixture *f = *state;
    g_autofree char *req = g_strdup_printf("CONNECT sink.test:%u HTTP/1.1\r\n"
                                           "Host: sink.test:%u\r\n\r\n",
                                           f->sink->port, f->sink->port);
    int fd = client_connect(f);
    g_autoptr(GString) response = NULL;
    /* a tunnel to a name carries TLS for that name */
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("sink.test");
    gsize len = g_bytes_get_size(hello);
    const VmTestEgressRecord *record;

    vm_test_send_text(fd, req);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_string_equal(response->str, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_echo(fd, hello);
    close(fd);

    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_string_equal(record->host, "sink.test");
    assert_int_equal(record->port, f->sink->port);
    assert_string_equal(record->address, "127.0.0.1");
    assert_string_equal(record->reason, "closed");
    assert_int_equal(record->bytes_up, len);
    assert_int_equal(record->bytes_down, len);
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), len);

    /* The proxy's totals (vmctl stats, the metrics) count the tunnel once it closed. */
    guint64 up = 0, down = 0;
    vm_egress_proxy_get_bytes(f->proxy, &up, &down);
    assert_int_equal(up, len);
    assert_int_equal(down, len);
}

static void
test_http_allowed(void **state)
{
    Fixture *f = *state;
    g_autofree char *req = g_strdup_printf("POST http://sink.test:%u/x?y=1 HTTP/1.1\r\n"
                                           "Host: sink.test:%u\r\n"
                                           "Proxy-Authorization: Basic eDp5\r\n"
                                           "Proxy-Connection: keep-alive\r\n"
                                           "Content-Length: 5\r\n\r\nhello",
                                           f->sink->port, f->sink->port);
    g_autofree char *expect = g_strdup_printf("POST /x?y=1 HTTP/1.1\r\n"
                                              "Host: sink.test:%u\r\n"
                                              "Content-Length: 5\r\n"
                                              "Connection: close\r\n\r\nhello",
                                              f->sink->port);
    int fd = client_connect(f);
    g_autoptr(GString) echo = NULL;
    const VmTestEgressRecord *record;

    vm_test_send_text(fd, req);
    echo = vm_test_read_until(fd, "hello", IO_TIMEOUT_MS, NULL);
    assert_string_equal(echo->str, expect);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_int_equal(record->bytes_up, strlen(expect));
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), strlen(expect));
}

static void
test_cidr_literal_allowed(void **state)
{
    Fixture *f = *state;
    g_autofree char *req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    g_autofree char *mapped =
        g_strdup_printf("CONNECT [::ffff:127.0.0.1]:%u HTTP/1.1\r\n\r\n", f->sink->port);

    assert_int_equal(request_status(f, req), 200);
    /* the IPv4-mapped spelling is normalised to the same address, and so allowed */
    assert_int_equal(request_status(f, mapped), 200);
    assert_int_equal(g_atomic_int_get(&f->resolves), 0);
}

/* ---------------------------------------------------------------------------------------------
 * Refused: 0 bytes to the sink, one denied record each */

typedef struct {
    const char *allow;
    const char *deny;
    const char *request; /* PORT stands for the sink's port */
    int status;
    const char *reason;
} DenyCase;

static void
test_denied_table(void **state)
{
    Fixture *f = *state;
    static const DenyCase cases[] = {
        /* a name that is not allowed, though it resolves where an allowed name does */
        {"other.test:PORT 127.0.0.1/32:PORT", NULL, "CONNECT sink.test:PORT HTTP/1.1\r\n\r\n", 403,
         "no-rule"},
        {"other.test:PORT 127.0.0.1/32:PORT", NULL,
         "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n", 403, "no-rule"},
        /* loopback without a CIDR rule: a name rule never opens it */
        {"sink.test:PORT", NULL, "CONNECT sink.test:PORT HTTP/1.1\r\n\r\n", 403, "address"},
        {"any", NULL, "CONNECT sink.test:443 HTTP/1.1\r\n\r\n", 403, "address"},
        {"any", NULL, "CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", 403, "address"},
        {"any", NULL, "CONNECT [::ffff:127.0.0.1]:443 HTTP/1.1\r\n\r\n", 403, "address"},
        {"any", NULL, "CONNECT [::ffff:7f00:1]:443 HTTP/1.1\r\n\r\n", 403, "address"},
        {"any", NULL, "GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 403, "address"},
        /* the IP literal of a host the policy only names */
        {"sink.test:PORT", NULL, "CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n", 403, "no-rule"},
        /* deny wins, for the literal and for names resolving into it */
        {"sink.test:PORT 127.0.0.1/32:PORT", "127.0.0.1/32",
         "CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n", 403, "deny-rule"},
        {"sink.test:PORT 127.0.0.1/32:PORT", "127.0.0.1/32",
         "CONNECT sink.test:PORT HTTP/1.1\r\n\r\n", 403, "deny-rule"},
        {"*.test:PORT 127.0.0.1/32:PORT", "sink.test", "CONNECT SINK.test.:PORT HTTP/1.1\r\n\r\n",
         403, "deny-rule"},
        /* odd spellings of 127.0.0.1, even where 127/8 is allowed */
        {"sink.test:PORT 127.0.0.0/8:PORT", NULL, "CONNECT 2130706433:PORT HTTP/1.1\r\n\r\n", 403,
         "bad-host"},
        {"sink.test:PORT 127.0.0.0/8:PORT", NULL, "CONNECT 0177.0.0.1:PORT HTTP/1.1\r\n\r\n", 403,
         "bad-host"},
        {"sink.test:PORT 127.0.0.0/8:PORT", NULL, "CONNECT 0x7f000001:PORT HTTP/1.1\r\n\r\n", 403,
         "bad-host"},
        {"sink.test:PORT 127.0.0.0/8:PORT", NULL, "CONNECT 0x7f.0.0.1:PORT HTTP/1.1\r\n\r\n", 403,
         "bad-host"},
        {"sink.test:PORT 127.0.0.0/8:PORT", NULL, "CONNECT 127.1:PORT HTTP/1.1\r\n\r\n", 403,
         "bad-host"},
        {"sink.test:PORT 127.0.0.0/8:PORT", NULL,
         "GET http://2130706433:PORT/ HTTP/1.1\r\nHost: 2130706433:PORT\r\n\r\n", 403, "bad-host"},
        /* Host/CONNECT mismatch and other bad requests */
        {"*.test:PORT 127.0.0.1/32:PORT", NULL,
         "CONNECT sink.test:PORT HTTP/1.1\r\nHost: other.test:PORT\r\n\r\n", 400, "bad-request"},
        {"*.test:PORT 127.0.0.1/32:PORT", NULL,
         "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: other.test\r\n\r\n", 400, "bad-request"},
        {"*.test:PORT 127.0.0.1/32:PORT", NULL, "GET / HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n",
         400, "bad-request"},
        {"*.test:PORT 127.0.0.1/32:PORT", NULL,
         "GET http://u@sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n", 400,
         "bad-request"},
        {"*.test:PORT 127.0.0.1/32:PORT", NULL,
         "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n"
         "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
         400, "bad-request"},
        /* cannot resolve */
        {"*.test:PORT 127.0.0.1/32:PORT", NULL, "CONNECT unknown.test:PORT HTTP/1.1\r\n\r\n", 502,
         "resolve-failed"},
        /* default policy */
        {NULL, NULL, "CONNECT sink.test:PORT HTTP/1.1\r\n\r\n", 403, "no-rule"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(VmEgressPolicy) policy = sink_policy(f, cases[i].allow, cases[i].deny);
        g_autoptr(GString) text = g_string_new(cases[i].request);
        g_autofree char *port = g_strdup_printf("%u", f->sink->port);
        const char *req;
        const VmTestEgressRecord *record;
        int status;

        g_string_replace(text, "PORT", port, 0);
        req = text->str;
        vm_egress_proxy_set_policy(f->proxy, policy);
        status = request_status(f, req);
        record = vm_test_egress_log_wait(f->log, i);
        if (status != cases[i].status || record->kind != VM_EGRESS_RECORD_DENIED ||
            g_strcmp0(record->reason, cases[i].reason) != 0)
            fail_msg("case %zu (%s): status %d, record %s %s", i, req, status,
                     record->kind == VM_EGRESS_RECORD_DENIED ? "denied" : "allowed",
                     record->reason);
        assert_int_equal(record->bytes_up, 0);
        assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
        assert_int_equal(g_atomic_int_get(&f->sink->connections), 0);
    }
}

static void
test_denied_record_fields(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmEgressPolicy) policy = sink_policy(f, "sink.test:PORT", NULL);
    g_autofree char *req = g_strdup_printf("CONNECT Sink.Test:%u HTTP/1.1\r\n\r\n", f->sink->port);
    const VmTestEgressRecord *record;

    vm_egress_proxy_set_policy(f->proxy, policy);
    assert_int_equal(request_status(f, req), 403);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->host, "Sink.Test");
    assert_int_equal(record->port, f->sink->port);
    /* the refused address is named */
    assert_string_equal(record->address, "127.0.0.1");
    assert_string_equal(record->reason, "address");
}

/* ---------------------------------------------------------------------------------------------
 * Several requests on one connection: each is checked on its own */

/* Sends @text on a new connection, shuts down the sending side (so that each upstream connection
 * ends once its request is through) and returns everything that came back until the close. */
static GString *
exchange_all(Fixture *f, const char *text)
{
    int fd = client_connect(f);
    gboolean eof = FALSE;
    GString *back;

    vm_test_send_text(fd, text);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    back = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, &eof);
    assert_true(eof);
    close(fd);
    return back;
}

/* @template with PORT for the fixture's sink and PORT2 for @other's port. */
static char *
with_ports(Fixture *f, VmTestSink *other, const char *template)
{
    g_autoptr(GString) text = g_string_new(template);
    g_autofree char *port = g_strdup_printf("%u", f->sink->port);
    g_autofree char *port2 = g_strdup_printf("%u", other->port);

    g_string_replace(text, "PORT2", port2, 0);
    g_string_replace(text, "PORT", port, 0);
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* A request to another destination after an allowed one is refused after the first response,
 * and nothing of it reaches that destination: no reuse of the first decision, whatever hides
 * the second head (plain pipelining, after a Content-Length or a chunked body). */
static void
test_pipelined_other_host_refused(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *first;
        const char *second;
        const char *echo; /* what the sink sends back of the first request */
        int status;
        const char *reason;
    } cases[] = {
        {"GET http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n",
         "GET http://other.test:PORT2/b HTTP/1.1\r\nHost: other.test:PORT2\r\n\r\n",
         "GET /a HTTP/1.1\r\nHost: sink.test:PORT\r\nConnection: close\r\n\r\n", 403, "no-rule"},
        /* the same host at another port, and the literal at a port no rule names */
        {"GET http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n",
         "GET http://sink.test:PORT2/b HTTP/1.1\r\nHost: sink.test:PORT2\r\n\r\n",
         "GET /a HTTP/1.1\r\nHost: sink.test:PORT\r\nConnection: close\r\n\r\n", 403, "no-rule"},
        {"GET http://127.0.0.1:PORT/a HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\n\r\n",
         "GET http://127.0.0.1:PORT2/b HTTP/1.1\r\nHost: 127.0.0.1:PORT2\r\n\r\n",
         "GET /a HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\nConnection: close\r\n\r\n", 403, "no-rule"},
        {"GET http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n",
         "CONNECT other.test:PORT2 HTTP/1.1\r\nHost: other.test:PORT2\r\n\r\n",
         "GET /a HTTP/1.1\r\nHost: sink.test:PORT\r\nConnection: close\r\n\r\n", 403, "no-rule"},
        /* hidden behind a body the proxy frames */
        {"POST http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n"
         "Content-Length: 4\r\n\r\nbody",
         "GET http://other.test:PORT2/b HTTP/1.1\r\nHost: other.test:PORT2\r\n\r\n",
         "POST /a HTTP/1.1\r\nHost: sink.test:PORT\r\nContent-Length: 4\r\n"
         "Connection: close\r\n\r\nbody",
         403, "no-rule"},
        {"POST http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n"
         "Transfer-Encoding: chunked\r\n\r\n4;x=y\r\nbody\r\n0\r\nT: v\r\n\r\n",
         "GET http://other.test:PORT2/b HTTP/1.1\r\nHost: other.test:PORT2\r\n\r\n",
         "POST /a HTTP/1.1\r\nHost: sink.test:PORT\r\nTransfer-Encoding: chunked\r\n"
         "Connection: close\r\n\r\n4;x=y\r\nbody\r\n0\r\nT: v\r\n\r\n",
         403, "no-rule"},
        /* a smuggling shape in the second head */
        {"GET http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n",
         "POST http://sink.test:PORT/b HTTP/1.1\r\nHost: sink.test:PORT\r\n"
         "Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         "GET /a HTTP/1.1\r\nHost: sink.test:PORT\r\nConnection: close\r\n\r\n", 400,
         "bad-request"},
        {"GET http://sink.test:PORT/a HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n",
         "GET http://sink.test:PORT/b HTTP/1.1\r\nHost: sink.test:PORT\r\nX: a\r\n b\r\n\r\n",
         "GET /a HTTP/1.1\r\nHost: sink.test:PORT\r\nConnection: close\r\n\r\n", 400,
         "bad-request"},
    };
    VmTestSink *other = vm_test_sink_new();
    guint n_records = 0;

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *first = with_ports(f, other, cases[i].first);
        g_autofree char *second = with_ports(f, other, cases[i].second);
        g_autofree char *echo = with_ports(f, other, cases[i].echo);
        g_autofree char *both = g_strconcat(first, second, NULL);
        g_autoptr(GString) back = NULL;
        const VmTestEgressRecord *allowed, *denied;

        g_atomic_int_set(&f->sink->bytes, 0);
        g_atomic_int_set(&f->sink->connections, 0);
        back = exchange_all(f, both);
        if (!g_str_has_prefix(back->str, echo) ||
            status_of(&(GString){.str = back->str + strlen(echo),
                                 .len = back->len - strlen(echo)}) != cases[i].status)
            fail_msg("case %zu: got '%s'", i, back->str);
        allowed = vm_test_egress_log_wait(f->log, n_records++);
        denied = vm_test_egress_log_wait(f->log, n_records++);
        assert_int_equal(allowed->kind, VM_EGRESS_RECORD_ALLOWED);
        assert_int_equal(allowed->bytes_up, strlen(echo));
        assert_int_equal(denied->kind, VM_EGRESS_RECORD_DENIED);
        assert_string_equal(denied->reason, cases[i].reason);
        assert_int_equal(denied->bytes_up, 0);
        /* the first request reached its sink, once; the second nothing at all */
        assert_int_equal(g_atomic_int_get(&f->sink->connections), 1);
        assert_int_equal(g_atomic_int_get(&f->sink->bytes), strlen(echo));
        assert_int_equal(g_atomic_int_get(&other->connections), 0);
        assert_int_equal(g_atomic_int_get(&other->bytes), 0);
    }
    vm_test_egress_wait_idle(f->proxy);
    vm_test_sink_free(other);
}

/* Pipelined requests that the policy allows all go through, in order, each on an upstream
 * connection of its own after its own decision (and each logged). */
static void
test_pipelined_allowed(void **state)
{
    Fixture *f = *state;
    VmTestSink *other = vm_test_sink_new();
    g_autoptr(VmEgressPolicy) policy = NULL;
    g_autofree char *text =
        with_ports(f, other,
                   "GET http://sink.test:PORT/1 HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n"
                   "POST http://sink.test:PORT/2 HTTP/1.1\r\nHost: "
                   "sink.test:PORT\r\nContent-Length: 2\r\n\r\nhi"
                   "GET http://127.0.0.1:PORT2/3 HTTP/1.0\r\n\r\n");
    g_autofree char *expect =
        with_ports(f, other,
                   "GET /1 HTTP/1.1\r\nHost: sink.test:PORT\r\nConnection: close\r\n\r\n"
                   "POST /2 HTTP/1.1\r\nHost: sink.test:PORT\r\nContent-Length: 2\r\nConnection: "
                   "close\r\n\r\nhi"
                   "GET /3 HTTP/1.0\r\nHost: 127.0.0.1:PORT2\r\nConnection: close\r\n\r\n");
    g_autofree char *allow =
        with_ports(f, other, "sink.test:PORT 127.0.0.1/32:PORT 127.0.0.1/32:PORT2");
    g_autoptr(GString) back = NULL;

    policy = vm_test_egress_policy(allow, NULL);
    vm_egress_proxy_set_policy(f->proxy, policy);
    back = exchange_all(f, text);
    assert_string_equal(back->str, expect);
    assert_int_equal(g_atomic_int_get(&f->sink->connections), 2);
    assert_int_equal(g_atomic_int_get(&other->connections), 1);
    for (guint i = 0; i < 3; i++) {
        const VmTestEgressRecord *record = vm_test_egress_log_wait(f->log, i);

        assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
        assert_string_equal(record->host, i < 2 ? "sink.test" : "127.0.0.1");
    }
    vm_test_egress_wait_idle(f->proxy);
    vm_test_sink_free(other);
}

/* The request smuggling shapes are refused with 400 before anything goes anywhere. */
static void
test_smuggling_refused(void **state)
{
    Fixture *f = *state;
    static const char *const heads[] = {
        /* Content-Length and Transfer-Encoding */
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\nContent-Length: 4\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n"
        "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
        /* two Content-Lengths, different or not */
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\nContent-Length: 4\r\n"
        "Content-Length: 5\r\n\r\nabcde",
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\nContent-Length: 4\r\n"
        "Content-Length: 4\r\n\r\nabcd",
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\nContent-Length: 4, 5\r\n"
        "\r\nabcd",
        /* obs-fold */
        "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\nX-A: 1\r\n\tX-B: 2\r\n\r\n",
        "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n"
        "Transfer-Encoding: chunked\r\n chunked\r\n\r\n",
        /* bare CR, bare LF */
        "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\nX-A: 1\rX-B: 2\r\n\r\n",
        "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\nX-A: 1\r\n\r\n",
        /* Transfer-Encoding other than a lone chunked */
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n"
        "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        "POST http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n"
        "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(heads); i++) {
        g_autoptr(GString) text = g_string_new(heads[i]);
        g_autofree char *port = g_strdup_printf("%u", f->sink->port);
        const VmTestEgressRecord *record;
        int status;

        g_string_replace(text, "PORT", port, 0);
        status = request_status(f, text->str);
        if (status != 400)
            fail_msg("case %zu: status %d", i, status);
        record = vm_test_egress_log_wait(f->log, i);
        assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
        assert_string_equal(record->reason, "bad-request");
    }
    assert_int_equal(g_atomic_int_get(&f->sink->connections), 0);
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* A chunked body whose framing is broken ends the connection: the proxy cannot tell where the
 * next request would start, so there is none. */
static void
test_bad_chunked_body(void **state)
{
    Fixture *f = *state;
    g_autofree char *text =
        g_strdup_printf("POST http://sink.test:%1$u/ HTTP/1.1\r\nHost: sink.test:%1$u\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n4\r\nbodyXX"
                        "GET http://other.test:%1$u/ HTTP/1.1\r\nHost: other.test:%1$u\r\n\r\n",
                        f->sink->port);
    g_autoptr(GString) back = exchange_all(f, text);
    const VmTestEgressRecord *record = vm_test_egress_log_wait(f->log, 0);

    assert_null(strstr(back->str, "other.test"));
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_string_equal(record->reason, "bad-request");
    vm_test_egress_wait_idle(f->proxy);
    /* one record: the bytes after the broken chunk were never read as a request */
    assert_int_equal(vm_test_egress_log_count(f->log), 1);
}

/* ---------------------------------------------------------------------------------------------
 * The SNI of tunnels to names */

/* Opens a tunnel to @target and sends @first in it; returns the connection. */
static int
tunnel_send(Fixture *f, const char *target, GBytes *first)
{
    g_autofree char *req = g_strdup_printf("CONNECT %s:%u HTTP/1.1\r\n\r\n", target, f->sink->port);
    int fd = client_connect(f);
    g_autoptr(GString) response = NULL;
    gsize len;
    const guint8 *data = g_bytes_get_data(first, &len);

    vm_test_send_text(fd, req);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_int_equal(status_of(response), 200);
    assert_int_equal(send(fd, data, len, MSG_NOSIGNAL), len);
    return fd;
}

static void
test_sni_matches(void **state)
{
    Fixture *f = *state;
    /* case and one trailing dot do not matter, on either side */
    static const char *const pairs[][2] = {
        {"sink.test", "sink.test"},
        {"SINK.Test", "sink.test"},
        {"sink.test", "Sink.TEST."},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(pairs); i++) {
        g_autoptr(GBytes) hello = vm_test_tls_client_hello(pairs[i][0]);
        gsize len = g_bytes_get_size(hello);
        int fd = tunnel_send(f, pairs[i][1], hello);
        g_autoptr(GString) echo = vm_test_read_until(fd, NULL, 300, NULL);
        const VmTestEgressRecord *record;

        /* forwarded unchanged */
        assert_int_equal(echo->len, len);
        assert_memory_equal(echo->str, g_bytes_get_data(hello, NULL), len);
        close(fd);
        record = vm_test_egress_log_wait(f->log, i);
        assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
        assert_int_equal(record->bytes_up, len);
    }
}

/* A ClientHello for another name, without SNI, or no TLS at all: closed, logged, and not a byte
 * reaches the destination. */
static void
test_sni_refused(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) other = vm_test_tls_client_hello("other.test");
    g_autoptr(GBytes) suffix = vm_test_tls_client_hello("evil.sink.test");
    g_autoptr(GBytes) none = vm_test_tls_client_hello(NULL);
    g_autoptr(GBytes) ssh = g_bytes_new_static("SSH-2.0-OpenSSH_9.2\r\n", 21);
    g_autoptr(GBytes) http = g_bytes_new_static("GET / HTTP/1.1\r\nHost: sink.test\r\n\r\n", 35);
    struct {
        GBytes *first;
        const char *reason;
    } cases[] = {
        {other, "sni-mismatch"}, {suffix, "sni-mismatch"}, {none, "sni-missing"},
        {ssh, "not-tls"},        {http, "not-tls"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        int fd = tunnel_send(f, "sink.test", cases[i].first);
        gboolean eof = FALSE;
        g_autoptr(GString) rest = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, &eof);
        const VmTestEgressRecord *record;

        assert_true(eof);
        assert_int_equal(rest->len, 0);
        close(fd);
        record = vm_test_egress_log_wait(f->log, i);
        if (record->kind != VM_EGRESS_RECORD_DENIED ||
            g_strcmp0(record->reason, cases[i].reason) != 0)
            fail_msg("case %zu: %s", i, record->reason);
        assert_string_equal(record->host, "sink.test");
        assert_int_equal(record->bytes_up, 0);
    }
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* A ClientHello that never comes in full: refused at the handshake timeout. */
static void
test_sni_timeout(void **state)
{
    Fixture *f = *state;
    VmEgressConfig config = {.handshake_timeout_ms = 300};
    g_autoptr(GBytes) hello = NULL;
    g_autoptr(GBytes) half = NULL;
    gboolean eof = FALSE;
    g_autoptr(GString) rest = NULL;
    int fd;

    fixture_start(f, &config, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    hello = vm_test_tls_client_hello("sink.test");
    half = g_bytes_new_from_bytes(hello, 0, g_bytes_get_size(hello) / 2);
    fd = tunnel_send(f, "sink.test", half);
    rest = vm_test_read_until(fd, NULL, 2000, &eof);
    assert_true(eof);
    close(fd);
    assert_string_equal(vm_test_egress_log_wait(f->log, 0)->reason, "timeout");
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* An address that a CIDR rule allows is trusted with any bytes: no TLS needed. */
static void
test_cidr_connect_without_sni(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) ping = g_bytes_new_static("ping", 4);
    g_autoptr(GBytes) none = vm_test_tls_client_hello(NULL);
    int fd = tunnel_send(f, "127.0.0.1", ping);
    g_autoptr(GString) echo = vm_test_read_until(fd, "ping", IO_TIMEOUT_MS, NULL);

    assert_string_equal(echo->str, "ping");
    close(fd);
    assert_int_equal(vm_test_egress_log_wait(f->log, 0)->kind, VM_EGRESS_RECORD_ALLOWED);
    fd = tunnel_send(f, "127.0.0.1", none);
    g_string_free(vm_test_read_until(fd, NULL, 300, NULL), TRUE);
    close(fd);
    assert_int_equal(vm_test_egress_log_wait(f->log, 1)->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_int_equal(vm_test_egress_log_wait(f->log, 1)->bytes_up, g_bytes_get_size(none));
}

/* ---------------------------------------------------------------------------------------------
 * Ports */

static void
test_ports(void **state)
{
    Fixture *f = *state;
    VmTestSink *other = vm_test_sink_new();
    static const struct {
        const char *allow;
        const char *deny;
        const char *request;
        int status; /* 0: a plain request went through (the sink echoes it) */
        const char *reason;
    } cases[] = {
        /* no port in the rule: 80 and 443 only */
        {"127.0.0.1/32", NULL, "CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n", 403, "no-rule"},
        {"sink.test 127.0.0.1/32", NULL,
         "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n", 403, "no-rule"},
        /* the port of the rule, and only it */
        {"127.0.0.1/32:PORT", NULL, "CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n", 200, NULL},
        {"127.0.0.1/32:PORT", NULL, "CONNECT 127.0.0.1:PORT2 HTTP/1.1\r\n\r\n", 403, "no-rule"},
        {"sink.test:PORT 127.0.0.1/32:PORT", NULL,
         "GET http://sink.test:PORT/ HTTP/1.1\r\nHost: sink.test:PORT\r\n\r\n", 0, "closed"},
        {"sink.test:PORT 127.0.0.1/32:PORT", NULL,
         "GET http://sink.test:PORT2/ HTTP/1.1\r\nHost: sink.test:PORT2\r\n\r\n", 403, "no-rule"},
        /* a name rule at the port, but the loopback address only at another */
        {"sink.test:PORT2 127.0.0.1/32:PORT", NULL,
         "GET http://sink.test:PORT2/ HTTP/1.1\r\nHost: sink.test:PORT2\r\n\r\n", 403, "address"},
        /* deny: at its port, or at every port without one */
        {"127.0.0.1/32:PORT 127.0.0.1/32:PORT2", "127.0.0.1/32:PORT2",
         "CONNECT 127.0.0.1:PORT2 HTTP/1.1\r\n\r\n", 403, "deny-rule"},
        {"127.0.0.1/32:PORT 127.0.0.1/32:PORT2", "127.0.0.1/32:PORT2",
         "CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n", 200, NULL},
        {"127.0.0.1/32:PORT", "127.0.0.1", "CONNECT 127.0.0.1:PORT HTTP/1.1\r\n\r\n", 403,
         "deny-rule"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *allow = with_ports(f, other, cases[i].allow);
        g_autofree char *deny = cases[i].deny != NULL ? with_ports(f, other, cases[i].deny) : NULL;
        g_autofree char *req = with_ports(f, other, cases[i].request);
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy(allow, deny);
        int status;
        const VmTestEgressRecord *record;

        vm_egress_proxy_set_policy(f->proxy, policy);
        status = request_status(f, req);
        record = vm_test_egress_log_wait(f->log, i);
        if (status != cases[i].status ||
            (cases[i].reason != NULL && g_strcmp0(record->reason, cases[i].reason) != 0))
            fail_msg("case %zu (%s): status %d, %s", i, req, status, record->reason);
    }
    assert_int_equal(g_atomic_int_get(&other->connections), 0);
    vm_test_egress_wait_idle(f->proxy);
    vm_test_sink_free(other);
}

/* ---------------------------------------------------------------------------------------------
 * Live policy changes */

static void
test_policy_change_closes_tunnel(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmEgressPolicy) narrower = sink_policy(f, "127.0.0.1/32:PORT", NULL);
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("sink.test");
    g_autoptr(VmEgressPolicy) current = NULL;
    g_autofree char *by_name =
        g_strdup_printf("CONNECT sink.test:%u HTTP/1.1\r\n\r\n", f->sink->port);
    g_autofree char *by_address =
        g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    int a = client_connect(f), b = client_connect(f);
    g_autoptr(GString) ra = NULL;
    g_autoptr(GString) rb = NULL;
    g_autoptr(GString) tail = NULL;
    g_autoptr(GString) echo = NULL;
    gboolean eof = FALSE;
    gint64 start;
    const VmTestEgressRecord *record;

    vm_test_send_text(a, by_name);
    vm_test_send_text(b, by_address);
    ra = vm_test_read_until(a, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    rb = vm_test_read_until(b, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_int_equal(status_of(ra), 200);
    assert_int_equal(status_of(rb), 200);
    assert_echo(a, hello);

    start = g_get_monotonic_time();
    vm_egress_proxy_set_policy(f->proxy, narrower);
    tail = vm_test_read_until(a, NULL, 2000, &eof);
    assert_true(eof);
    assert_true(g_get_monotonic_time() - start < G_USEC_PER_SEC);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->host, "sink.test");
    assert_string_equal(record->reason, "policy-changed");

    /* the tunnel the new policy still allows stays open */
    vm_test_send_text(b, "still");
    echo = vm_test_read_until(b, "still", IO_TIMEOUT_MS, NULL);
    assert_string_equal(echo->str, "still");
    current = vm_egress_proxy_dup_policy(f->proxy);
    assert_true(vm_egress_policy_equal(current, narrower));
    /* and new connections follow the new policy at once */
    assert_int_equal(request_status(f, by_name), 403);
    close(a);
    close(b);
}

/* ---------------------------------------------------------------------------------------------
 * Limits */

static void
test_handshake_timeout(void **state)
{
    Fixture *f = *state;
    VmEgressConfig config = {.handshake_timeout_ms = 300};
    static const char drip[] = "CONNECT sink.test:1 HTTP/1.1\r\n\r\n";
    int fd;
    g_autoptr(GString) response = NULL;
    gboolean eof = FALSE;
    gint64 start;
    const VmTestEgressRecord *record;

    fixture_start(f, &config, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    /* slow-loris: a byte every 100 ms does not extend the deadline */
    fd = client_connect(f);
    start = g_get_monotonic_time();
    for (gsize i = 0; i < sizeof(drip) - 1 && g_get_monotonic_time() - start < 1500000; i++) {
        if (send(fd, drip + i, 1, MSG_NOSIGNAL) != 1)
            break;
        g_usleep(100 * 1000);
    }
    response = vm_test_read_until(fd, NULL, 2000, &eof);
    assert_true(eof);
    assert_int_equal(status_of(response), 408);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_string_equal(record->reason, "timeout");
    assert_int_equal(g_atomic_int_get(&f->sink->connections), 0);
    close(fd);
}

static void
test_too_many_connections(void **state)
{
    Fixture *f = *state;
    VmEgressConfig config = {.max_connections = 2, .handshake_timeout_ms = 5000};
    g_autofree char *req = NULL;
    int a, b, c;
    g_autoptr(GString) response = NULL;
    gboolean eof = FALSE;
    const VmTestEgressRecord *record;

    fixture_start(f, &config, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    a = client_connect(f);
    b = client_connect(f);
    for (int i = 0; i < 200 && vm_egress_proxy_get_n_connections(f->proxy) < 2; i++)
        g_usleep(10 * 1000);
    assert_int_equal(vm_egress_proxy_get_n_connections(f->proxy), 2);
    c = client_connect(f);
    response = vm_test_read_until(c, NULL, IO_TIMEOUT_MS, &eof);
    assert_true(eof);
    assert_int_equal(status_of(response), 503);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->reason, "too-many-connections");
    close(a);
    close(b);
    close(c);
    vm_test_egress_wait_idle(f->proxy);
    req = g_strdup_printf("CONNECT sink.test:%u HTTP/1.1\r\n\r\n", f->sink->port);
    assert_int_equal(request_status(f, req), 200);
}

static void
test_idle_timeout(void **state)
{
    Fixture *f = *state;
    VmEgressConfig config = {.idle_timeout_ms = 300};
    g_autofree char *req = NULL;
    int fd;
    g_autoptr(GString) response = NULL;
    g_autoptr(GString) rest = NULL;
    gboolean eof = FALSE;
    const VmTestEgressRecord *record;

    fixture_start(f, &config, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    fd = client_connect(f);
    vm_test_send_text(fd, req);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_int_equal(status_of(response), 200);
    rest = vm_test_read_until(fd, NULL, 2000, &eof);
    assert_true(eof);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->reason, "idle");
    close(fd);
}

/* Garbage, oversized heads and clients that vanish: each gets an answer or a close, and the
 * proxy ends up with no connection left. */
static void
test_never_hangs(void **state)
{
    Fixture *f = *state;
    g_autoptr(GString) big = g_string_new("GET http://sink.test/ HTTP/1.1\r\n");
    static const char *const garbage[] = {
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        "SSH-2.0-OpenSSH_9.2\r\n",
        "\r\n\r\n",
        "GET http://sink.test/ HTTP/1.1\nHost: sink.test\n\n",
    };

    while (big->len < 40 * 1024)
        g_string_append(big,
                        "X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    for (gsize i = 0; i < G_N_ELEMENTS(garbage); i++) {
        int fd = client_connect(f);
        g_autoptr(GString) response = NULL;
        gboolean eof = FALSE;

        (void)send(fd, garbage[i], strlen(garbage[i]), MSG_NOSIGNAL);
        response = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, &eof);
        assert_true(eof);
        assert_int_equal(status_of(response), 400);
        close(fd);
    }
    {
        int fd = client_connect(f);
        g_autoptr(GString) response = NULL;
        gboolean eof = FALSE;

        (void)send(fd, big->str, big->len, MSG_NOSIGNAL);
        response = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, &eof);
        assert_true(eof);
        assert_int_equal(status_of(response), 400);
        close(fd);
    }
    /* half a head, then the client goes away */
    for (int i = 0; i < 3; i++) {
        int fd = client_connect(f);

        vm_test_send_text(fd, "CONNECT sink.te");
        close(fd);
    }
    vm_test_egress_wait_idle(f->proxy);
    assert_int_equal(g_atomic_int_get(&f->sink->connections), 0);
}

/* Freeing the proxy with open tunnels and half-read heads returns promptly. */
static void
test_free_with_open_connections(void **state)
{
    Fixture *f = *state;
    g_autofree char *req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    int tunnel = client_connect(f), partial = client_connect(f);
    g_autoptr(GString) response = NULL;
    g_autoptr(GString) rest = NULL;
    gboolean eof = FALSE;
    gint64 start;

    vm_test_send_text(tunnel, req);
    response = vm_test_read_until(tunnel, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_int_equal(status_of(response), 200);
    vm_test_send_text(partial, "CONNECT ");
    start = g_get_monotonic_time();
    g_clear_pointer(&f->proxy, vm_egress_proxy_free);
    assert_true(g_get_monotonic_time() - start < G_USEC_PER_SEC);
    rest = vm_test_read_until(tunnel, NULL, 1000, &eof);
    assert_true(eof);
    close(tunnel);
    close(partial);
}

/* ---------------------------------------------------------------------------------------------
 * Rewrite hook */

static gboolean
rewrite_placeholder(VmEgressRequest *request, gpointer user_data, GError **error)
{
    const char *auth = vm_egress_request_get_header(request, "Authorization");

    if (g_strcmp0(auth, "REFUSE") == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no credential for this host");
    if (g_strcmp0(auth, "PLACEHOLDER") == 0)
        vm_egress_request_set_header(request, "Authorization", "Bearer real");
    return TRUE;
}

static void
test_rewrite_hook(void **state)
{
    Fixture *f = *state;
    VmEgressConfig config = {.rewrite = rewrite_placeholder};
    g_autofree char *req = NULL;
    g_autofree char *refused = NULL;
    int fd;
    g_autoptr(GString) echo = NULL;
    const VmTestEgressRecord *record;

    fixture_start(f, &config, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    req = g_strdup_printf("GET http://sink.test:%1$u/ HTTP/1.1\r\nHost: sink.test:%1$u\r\n"
                          "Authorization: PLACEHOLDER\r\n\r\n",
                          f->sink->port);
    fd = client_connect(f);
    vm_test_send_text(fd, req);
    echo = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_non_null(strstr(echo->str, "\r\nAuthorization: Bearer real\r\n"));
    assert_null(strstr(echo->str, "PLACEHOLDER"));
    close(fd);
    (void)vm_test_egress_log_wait(f->log, 0);

    refused = g_strdup_printf("GET http://sink.test:%1$u/ HTTP/1.1\r\nHost: sink.test:%1$u\r\n"
                              "Authorization: REFUSE\r\n\r\n",
                              f->sink->port);
    g_atomic_int_set(&f->sink->bytes, 0);
    assert_int_equal(request_status(f, refused), 403);
    record = vm_test_egress_log_wait(f->log, 1);
    assert_string_equal(record->reason, "rewrite-refused");
    g_usleep(50 * 1000);
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* ---------------------------------------------------------------------------------------------
 * The relay under load */

/* Sends @len bytes through the tunnel on @fd to the echo sink and reads them back. */
static void
assert_bulk_echo(int fd, gsize len)
{
    g_autofree guint8 *data = g_malloc(len);
    g_autofree guint8 *back = g_malloc(len);
    GThread *writer;
    gsize got = 0;

    for (gsize i = 0; i < len; i++)
        data[i] = (guint8)(i * 2654435761u >> 13);
    /* both ways at once: the sink echoes while it reads, so one side alone would stall */
    writer = vm_test_send_thread(fd, data, len);
    while (got < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t n;

        if (poll(&pfd, 1, IO_TIMEOUT_MS) <= 0)
            break;
        n = recv(fd, back + got, len - got, 0);
        if (n <= 0)
            break;
        got += n;
    }
    assert_int_equal(GPOINTER_TO_SIZE(g_thread_join(writer)), len);
    assert_int_equal(got, len);
    assert_memory_equal(back, data, len);
}

static void
test_relay_bulk(void **state)
{
    Fixture *f = *state;
    g_autofree char *req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    int fd = client_connect(f);
    g_autoptr(GString) response = NULL;
    const VmTestEgressRecord *record;

    vm_test_send_text(fd, req);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200"));
    assert_bulk_echo(fd, 6 * 1024 * 1024 + 7);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->bytes_up, 6 * 1024 * 1024 + 7);
    assert_int_equal(record->bytes_down, 6 * 1024 * 1024 + 7);
}

/* ---------------------------------------------------------------------------------------------
 * The Unix socket and the hand-over of a guest's connection */

static char *
unix_fixture(Fixture *f, char **ret_dir)
{
    VmEgressConfig config = {0};
    char *dir = g_dir_make_tmp("egp-XXXXXX", NULL);
    char *path = g_build_filename(dir, "egress.sock", NULL);

    config.listen_path = path;
    fixture_start(f, &config, "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    *ret_dir = dir;
    return path;
}

static void
unix_fixture_end(Fixture *f, char *dir, char *path)
{
    vm_egress_proxy_free(f->proxy);
    f->proxy = NULL;
    /* the proxy takes its socket with it */
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));
    assert_int_equal(g_rmdir(dir), 0);
    g_free(path);
    g_free(dir);
}

static int
unix_connect(const char *path)
{
    struct sockaddr_un sun;
    socklen_t sun_len;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(vm_unix_address(path, &sun, &sun_len, NULL));
    assert_int_equal(connect(fd, (struct sockaddr *)&sun, sun_len), 0);
    return fd;
}

/* Sends one byte with @n copies of @fd as SCM_RIGHTS on @sock. */
static void
send_fds(int sock, int fd, int n)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } control;
    int fds[2] = {fd, fd};
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = CMSG_SPACE(n * sizeof(int))};
    struct cmsghdr *cmsg;

    memset(&control, 0, sizeof(control));
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(cmsg), fds, n * sizeof(int));
    assert_int_equal(sendmsg(sock, &msg, MSG_NOSIGNAL), 1);
}

static void
test_unix_handover(void **state)
{
    Fixture *f = *state;
    g_autofree char *dir = NULL;
    char *path = unix_fixture(f, &dir);
    g_autofree char *req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    g_autoptr(GString) response = NULL;
    g_autoptr(GError) error = NULL;
    struct stat st;
    int sv[2];

    assert_int_equal(vm_egress_proxy_get_port(f->proxy), 0);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);

    /* the guest's connection, handed over; the hander's copy closes at once */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_true(vm_egress_proxy_pass_fd(path, sv[1], &error));
    close(sv[1]);
    vm_test_send_text(sv[0], req);
    response = vm_test_read_until(sv[0], "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_string_equal(response->str, "HTTP/1.1 200 Connection established\r\n\r\n");
    assert_bulk_echo(sv[0], 3 * 1024 * 1024);
    close(sv[0]);
    vm_test_egress_wait_idle(f->proxy);
    assert_int_equal(vm_test_egress_log_wait(f->log, 0)->kind, VM_EGRESS_RECORD_ALLOWED);
    unix_fixture_end(f, g_steal_pointer(&dir), path);
}

/* A client of the Unix socket may also speak HTTP on it directly. */
static void
test_unix_plain(void **state)
{
    Fixture *f = *state;
    g_autofree char *dir = NULL;
    char *path = unix_fixture(f, &dir);
    g_autofree char *req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", f->sink->port);
    g_autoptr(GString) response = NULL;
    g_autoptr(GString) echo = NULL;
    int fd = unix_connect(path);

    vm_test_send_text(fd, req);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 200"));
    vm_test_send_text(fd, "ping");
    echo = vm_test_read_until(fd, "ping", IO_TIMEOUT_MS, NULL);
    assert_string_equal(echo->str, "ping");
    close(fd);
    vm_test_egress_wait_idle(f->proxy);
    unix_fixture_end(f, g_steal_pointer(&dir), path);
}

/* Only exactly one stream socket is taken over: anything else closes the connection, reaches
 * nothing and is logged. */
static void
test_unix_bad_handover(void **state)
{
    Fixture *f = *state;
    g_autofree char *dir = NULL;
    char *path = unix_fixture(f, &dir);
    int p[2], sv[2], dg[2];

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, dg), 0);
    for (int i = 0; i < 3; i++) {
        int fd = unix_connect(path);
        gboolean eof = FALSE;
        g_autoptr(GString) rest = NULL;

        if (i == 0)
            send_fds(fd, p[1], 1); /* a pipe */
        else if (i == 1)
            send_fds(fd, sv[1], 2); /* two sockets */
        else
            send_fds(fd, dg[1], 1); /* a datagram socket */
        rest = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, &eof);
        assert_true(eof);
        assert_int_equal(rest->len, 0);
        close(fd);
        assert_string_equal(vm_test_egress_log_wait(f->log, i)->reason, "bad-request");
    }
    /* the handed sockets were not used: the other ends see nothing */
    {
        char byte;

        assert_int_equal(recv(sv[0], &byte, 1, MSG_DONTWAIT), -1);
        assert_int_equal(errno, EAGAIN);
    }
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
    close(dg[0]);
    close(dg[1]);
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
    vm_test_egress_wait_idle(f->proxy);
    unix_fixture_end(f, g_steal_pointer(&dir), path);
}

static void
test_unix_errors(void **state)
{
    g_autofree char *long_path = g_strnfill(120, 'x');
    VmEgressConfig config = {.listen_path = long_path};
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) pass_error = NULL;
    g_autoptr(VmEgressProxy) proxy = vm_egress_proxy_new(&config, &error);
    g_autofree char *dir = g_dir_make_tmp("egp-XXXXXX", NULL);
    g_autofree char *missing = g_build_filename(dir, "none.sock", NULL);
    int sv[2];

    assert_null(proxy);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    /* nobody there: the hand-over fails, which is what makes the way out fail closed */
    assert_false(vm_egress_proxy_pass_fd(missing, sv[1], &pass_error));
    assert_true(g_error_matches(pass_error, VM_ERROR, VM_ERROR_NOT_RUNNING));
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(g_rmdir(dir), 0);
}

/* ---------------------------------------------------------------------------------------------
 * Set-up errors and records */

static void
test_listen_errors(void **state)
{
    Fixture *f = *state;
    VmEgressConfig taken = {.listen_port = vm_egress_proxy_get_port(f->proxy)};
    VmEgressConfig bad = {.listen_address = "localhost"};
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) bad_error = NULL;
    g_autoptr(VmEgressProxy) second = vm_egress_proxy_new(&taken, &error);
    g_autoptr(VmEgressProxy) third = vm_egress_proxy_new(&bad, &bad_error);

    assert_null(second);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_null(third);
    assert_true(g_error_matches(bad_error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

static void
test_record_json(void **state)
{
    VmEgressRecord allowed = {
        .kind = VM_EGRESS_RECORD_ALLOWED,
        .start_time = 1700000000123456,
        .host = "pypi.org",
        .port = 443,
        .address = "151.101.0.223",
        .reason = "closed",
        .bytes_up = 517,
        .bytes_down = 1048576,
        .duration_us = 2500000,
    };
    VmEgressRecord denied = {
        .kind = VM_EGRESS_RECORD_DENIED,
        .start_time = 1700000000000000,
        .reason = "bad-request",
    };
    g_autofree char *a = vm_egress_record_to_json(&allowed);
    g_autofree char *d = vm_egress_record_to_json(&denied);

    assert_string_equal(a, "{\"time\":\"2023-11-14T22:13:20.123456Z\",\"event\":\"allowed\","
                           "\"host\":\"pypi.org\",\"port\":443,\"address\":\"151.101.0.223\","
                           "\"reason\":\"closed\",\"bytes_up\":517,\"bytes_down\":1048576,"
                           "\"duration_ms\":2500}");
    assert_string_equal(d, "{\"time\":\"2023-11-14T22:13:20Z\",\"event\":\"denied\","
                           "\"host\":null,\"port\":0,\"address\":null,\"reason\":\"bad-request\","
                           "\"bytes_up\":0,\"bytes_down\":0,\"duration_ms\":0}");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connect_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_http_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cidr_literal_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_denied_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_denied_record_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_other_host_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_smuggling_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_chunked_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sni_matches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sni_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sni_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cidr_connect_without_sni, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy_change_closes_tunnel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handshake_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_many_connections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_never_hangs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_with_open_connections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rewrite_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listen_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_bulk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unix_handover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unix_plain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unix_bad_handover, setup, teardown),
        cmocka_unit_test(test_unix_errors),
        cmocka_unit_test(test_record_json),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
