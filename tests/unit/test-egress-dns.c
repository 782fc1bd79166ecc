/* The egress proxy's resolver (egress/vm-egress-dns.c) and the CONNECTs to the addresses it
 * hands out, end to end on the guest path: connections handed over a Unix socket as the guest
 * forward's helper does (DNS with VM_FD_PASS_TAG_DNS), real queries built by libresolv, the
 * fake resolver of test names and a counting echo sink on 127.0.0.1. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-dns.h"
#include "vm-egress-proxy.h"
#include "vm-error.h"
#include "vm-fd-pass.h"
#include "test-common.h"
#include "test-egress-fixture.h"
#include "test-sink.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <resolv.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define IO_TIMEOUT_MS 5000

typedef struct {
    char *dir;
    char *path;
    VmTestSink *sink;
    VmTestEgressLog *log;
    VmEgressProxy *proxy;
    gint resolves;
} Fixture;

static VmEgressPolicy *
sink_policy(Fixture *f, const char *allow)
{
    g_autofree char *port = g_strdup_printf("%u", f->sink->port);
    g_autoptr(GString) a = g_string_new(allow);

    g_string_replace(a, "PORT", port, 0);
    return vm_test_egress_policy(a->str, NULL);
}

/* A proxy on a Unix socket allowing @allow (PORT: the sink's), 127.0.0.1 at the sink's port
 * opened by a CIDR rule so that test names (127.0.0.1) pass the address check. */
static void
fixture_start(Fixture *f, const char *allow, guint max_names)
{
    g_autofree char *rules = g_strdup_printf("%s 127.0.0.1/32:PORT", allow);
    g_autoptr(VmEgressPolicy) policy = sink_policy(f, rules);
    g_autoptr(GError) error = NULL;
    VmEgressConfig config = {
        .listen_path = f->path,
        .policy = policy,
        .resolve = vm_test_egress_resolve,
        .resolve_data = &f->resolves,
        .log = vm_test_egress_log_func,
        .log_data = f->log,
        .handshake_timeout_ms = 2000,
        .dns_max_names = max_names,
    };

    vm_egress_proxy_free(f->proxy);
    f->proxy = vm_egress_proxy_new(&config, &error);
    if (f->proxy == NULL)
        fail_msg("proxy: %s", error->message);
}

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->dir = vm_test_make_tmpdir("egress-dns-XXXXXX");
    f->path = g_build_filename(f->dir, "egress.sock", NULL);
    f->sink = vm_test_sink_new();
    f->log = vm_test_egress_log_new(NULL);
    fixture_start(f, "sink.test:PORT", 0);
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
    vm_test_remove_tree(f->dir);
    g_free(f->path);
    g_free(f->dir);
    g_free(f);
    return 0;
}

/* A guest connection handed to the proxy with @tag, as vm-egress-connect does: our end. */
static int
guest_connect(Fixture *f, char tag)
{
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(vm_fd_pass_tagged(f->path, sv[1], tag), 0);
    close(sv[1]);
    return sv[0];
}

/* Reads exactly @len bytes; FALSE at EOF or after the timeout. */
static gboolean
read_exact(int fd, guint8 *buf, gsize len)
{
    while (len > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t n;

        if (poll(&pfd, 1, IO_TIMEOUT_MS) <= 0)
            return FALSE;
        n = recv(fd, buf, len, 0);
        if (n <= 0)
            return FALSE;
        buf += n;
        len -= n;
    }
    return TRUE;
}

/* Sends @len bytes of @msg with its 2-byte length on @fd; the answer (NULL: the proxy closed). */
static GBytes *
dns_exchange(int fd, const guint8 *msg, gsize len)
{
    guint8 length[2] = {len >> 8, len & 0xff};
    guint8 answer[65536];
    gsize answer_len;
    g_autofree guint8 *framed = g_malloc(len + 2);
    ssize_t sent;

    /* One send: the proxy may close as soon as it reads a length it refuses, and a second send
     * would then race its close. */
    memcpy(framed, length, 2);
    if (len > 0)
        memcpy(framed + 2, msg, len);
    sent = send(fd, framed, len + 2, MSG_NOSIGNAL);
    if (sent < 0 && (errno == EPIPE || errno == ECONNRESET))
        return NULL;
    assert_int_equal(sent, len + 2);
    if (!read_exact(fd, length, 2))
        return NULL;
    answer_len = (gsize)length[0] << 8 | length[1];
    assert_true(read_exact(fd, answer, answer_len));
    return g_bytes_new(answer, answer_len);
}

/* A query for @name of @type built by libresolv. */
static GBytes *
make_query(const char *name, int type)
{
    guint8 buf[NS_PACKETSZ];
    int len = res_mkquery(ns_o_query, name, ns_c_in, type, NULL, 0, NULL, buf, sizeof(buf));

    assert_true(len > 0);
    return g_bytes_new(buf, len);
}

typedef struct {
    int rcode;
    guint16 id;
    guint answers;
    char address[INET_ADDRSTRLEN]; /* the first A record's */
    guint32 ttl;
    char qname[NS_MAXDNAME];
} Answer;

/* Parses @bytes with libresolv, failing the test when they are no answer to @query. */
static void
parse_answer(GBytes *bytes, GBytes *query, Answer *ret)
{
    ns_msg msg;
    ns_rr rr;
    gsize len;
    const guint8 *data = g_bytes_get_data(bytes, &len);

    memset(ret, 0, sizeof(*ret));
    assert_int_equal(ns_initparse(data, (int)len, &msg), 0);
    assert_true(ns_msg_getflag(msg, ns_f_qr));
    assert_memory_equal(data, g_bytes_get_data(query, NULL), 2); /* the id */
    ret->rcode = ns_msg_getflag(msg, ns_f_rcode);
    ret->answers = ns_msg_count(msg, ns_s_an);
    if (ns_msg_count(msg, ns_s_qd) == 1) {
        assert_int_equal(ns_parserr(&msg, ns_s_qd, 0, &rr), 0);
        g_strlcpy(ret->qname, ns_rr_name(rr), sizeof(ret->qname));
    }
    for (guint i = 0; i < ret->answers; i++) {
        assert_int_equal(ns_parserr(&msg, ns_s_an, i, &rr), 0);
        if (ns_rr_type(rr) == ns_t_a && i == 0) {
            assert_int_equal(ns_rr_rdlen(rr), 4);
            assert_string_equal(ns_rr_name(rr), ret->qname);
            inet_ntop(AF_INET, ns_rr_rdata(rr), ret->address, sizeof(ret->address));
            ret->ttl = ns_rr_ttl(rr);
        }
    }
}

/* Resolves @name (type @type) on a connection of its own. */
static void
resolve(Fixture *f, const char *name, int type, Answer *ret)
{
    g_autoptr(GBytes) query = make_query(name, type);
    int fd = guest_connect(f, VM_FD_PASS_TAG_DNS);
    g_autoptr(GBytes) answer =
        dns_exchange(fd, g_bytes_get_data(query, NULL), g_bytes_get_size(query));

    assert_non_null(answer);
    parse_answer(answer, query, ret);
    close(fd);
}

/* ---------------------------------------------------------------------------------------------
 * The table */

static void
test_table(void **state)
{
    g_autoptr(VmEgressDnsTable) table = vm_egress_dns_table_new(3);
    VmEgressAddress a, b, again, c, d, literal;
    g_autofree char *a_text = NULL;
    g_autofree char *name = NULL;

    (void)state;
    vm_egress_dns_table_assign(table, "a.test", &a);
    vm_egress_dns_table_assign(table, "b.test", &b);
    vm_egress_dns_table_assign(table, "a.test", &again);
    a_text = vm_egress_address_to_string(&a);
    assert_string_equal(a_text, "100.100.0.1");
    assert_memory_equal(&a, &again, sizeof(a));
    assert_memory_not_equal(a.bytes, b.bytes, 4);
    assert_true(vm_egress_dns_address_is_synthetic(&a));
    name = vm_egress_dns_table_lookup(table, &b);
    assert_string_equal(name, "b.test");

    /* Full at three: the least recently used (a.test, since b.test was looked up) goes. */
    vm_egress_dns_table_assign(table, "c.test", &c);
    vm_egress_dns_table_assign(table, "d.test", &d);
    assert_int_equal(vm_egress_dns_table_size(table), 3);
    assert_null(vm_egress_dns_table_lookup(table, &a));
    g_autofree char *b_name = vm_egress_dns_table_lookup(table, &b);
    assert_string_equal(b_name, "b.test");
    /* A forgotten name's address is not handed out again soon. */
    assert_memory_not_equal(d.bytes, a.bytes, 4);

    assert_true(vm_egress_address_parse("100.101.0.1", &literal, NULL));
    assert_false(vm_egress_dns_address_is_synthetic(&literal));
    assert_null(vm_egress_dns_table_lookup(table, &literal));
    assert_true(vm_egress_address_parse("100.100.200.7", &literal, NULL));
    assert_true(vm_egress_dns_address_is_synthetic(&literal));
    assert_null(vm_egress_dns_table_lookup(table, &literal));
}

/* ---------------------------------------------------------------------------------------------
 * Answers */

static void
test_resolve_allowed(void **state)
{
    Fixture *f = *state;
    Answer first, second, aaaa, mx;
    VmEgressAddress address;

    resolve(f, "sink.test", ns_t_a, &first);
    assert_int_equal(first.rcode, ns_r_noerror);
    assert_int_equal(first.answers, 1);
    assert_string_equal(first.qname, "sink.test");
    assert_int_equal(first.ttl, VM_EGRESS_DNS_TTL);
    assert_true(vm_egress_address_parse(first.address, &address, NULL));
    assert_true(vm_egress_dns_address_is_synthetic(&address));
    /* The same address for the same name, whatever its case; the question keeps its case. */
    resolve(f, "SINK.Test", ns_t_a, &second);
    assert_string_equal(second.address, first.address);
    assert_string_equal(second.qname, "SINK.Test");
    /* No IPv6: an empty answer, not an error. */
    resolve(f, "sink.test", ns_t_aaaa, &aaaa);
    assert_int_equal(aaaa.rcode, ns_r_noerror);
    assert_int_equal(aaaa.answers, 0);
    resolve(f, "sink.test", ns_t_mx, &mx);
    assert_int_equal(mx.rcode, ns_r_noerror);
    assert_int_equal(mx.answers, 0);
    /* Allowed answers are not logged. */
    assert_int_equal(vm_test_egress_log_count(f->log), 0);
}

static void
test_resolve_denied(void **state)
{
    Fixture *f = *state;
    Answer answer;
    const VmTestEgressRecord *record;

    resolve(f, "other.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_nxdomain);
    assert_int_equal(answer.answers, 0);
    /* Never resolved for real: the policy refused it first. */
    assert_int_equal(g_atomic_int_get(&f->resolves), 0);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_string_equal(record->host, "other.test");
    assert_int_equal(record->port, 53);
    assert_string_equal(record->reason, "dns-denied");
    /* Names that are no names, and IP spellings, are denied too. */
    resolve(f, "127.0.0.1", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_nxdomain);
    resolve(f, "a\\.b.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_nxdomain);
}

static void
test_resolve_wildcard_and_any(void **state)
{
    Fixture *f = *state;
    Answer answer;

    fixture_start(f, "*.wild.test:PORT", 0);
    resolve(f, "a.wild.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_noerror);
    assert_int_equal(answer.answers, 1);
    resolve(f, "wild.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_nxdomain);

    /* A rule with a port counts: the name is allowed at some port. A deny rule without one
     * shuts the name. */
    {
        g_autoptr(VmEgressPolicy) policy = vm_test_egress_policy("any", "deny.test");

        vm_egress_proxy_set_policy(f->proxy, policy);
    }
    resolve(f, "anything.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_noerror);
    assert_int_equal(answer.answers, 1);
    resolve(f, "deny.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_nxdomain);
}

/* Allowed but not resolving: NXDOMAIN, logged as such. */
static void
test_resolve_nonexistent(void **state)
{
    Fixture *f = *state;
    Answer answer;
    const VmTestEgressRecord *record;

    fixture_start(f, "unknown.test", 0);
    resolve(f, "unknown.test", ns_t_a, &answer);
    assert_int_equal(answer.rcode, ns_r_nxdomain);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->reason, "dns-not-found");
    assert_int_equal(g_atomic_int_get(&f->resolves), 1);
}

/* Several queries on one connection, as glibc sends A and AAAA, answered in order. */
static void
test_several_queries(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) a = make_query("sink.test", ns_t_a);
    g_autoptr(GBytes) aaaa = make_query("sink.test", ns_t_aaaa);
    int fd = guest_connect(f, VM_FD_PASS_TAG_DNS);
    g_autoptr(GBytes) first = dns_exchange(fd, g_bytes_get_data(a, NULL), g_bytes_get_size(a));
    g_autoptr(GBytes) second =
        dns_exchange(fd, g_bytes_get_data(aaaa, NULL), g_bytes_get_size(aaaa));
    Answer answer;

    assert_non_null(first);
    parse_answer(first, a, &answer);
    assert_int_equal(answer.answers, 1);
    assert_non_null(second);
    parse_answer(second, aaaa, &answer);
    assert_int_equal(answer.answers, 0);
    close(fd);
}

/* Sends @msg on a new DNS connection; the answer's rcode, or -1 when the proxy closed. */
static int
rcode_of(Fixture *f, const guint8 *msg, gsize len)
{
    int fd = guest_connect(f, VM_FD_PASS_TAG_DNS);
    g_autoptr(GBytes) answer = dns_exchange(fd, msg, len);
    int rcode = -1;

    if (answer != NULL) {
        const guint8 *data = g_bytes_get_data(answer, NULL);

        assert_true(g_bytes_get_size(answer) >= NS_HFIXEDSZ);
        assert_true(data[2] & 0x80);
        rcode = data[3] & 0x0f;
    }
    close(fd);
    return rcode;
}

static void
test_malformed(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) query = make_query("sink.test", ns_t_a);
    gsize len = g_bytes_get_size(query);
    g_autofree guint8 *msg = g_memdup2(g_bytes_get_data(query, NULL), len);
    g_autofree guint8 *big = g_malloc0(VM_EGRESS_DNS_MESSAGE_MAX + 1);
    guint8 two[NS_PACKETSZ];
    Answer answer;

    /* shorter than a header, empty, longer than the bound: closed */
    assert_int_equal(rcode_of(f, msg, 5), -1);
    assert_int_equal(rcode_of(f, msg, 0), -1);
    memcpy(big, msg, len);
    assert_int_equal(rcode_of(f, big, VM_EGRESS_DNS_MESSAGE_MAX + 1), -1);
    /* cut inside the question, trailing garbage: FORMERR */
    assert_int_equal(rcode_of(f, msg, len - 3), ns_r_formerr);
    memcpy(big, msg, len);
    assert_int_equal(rcode_of(f, big, len + 7), ns_r_formerr);
    /* a response, two questions, an answer record in a query: FORMERR */
    msg[2] |= 0x80;
    assert_int_equal(rcode_of(f, msg, len), ns_r_formerr);
    msg[2] &= ~0x80;
    memcpy(two, msg, len);
    memcpy(two + len, msg + NS_HFIXEDSZ, len - NS_HFIXEDSZ);
    two[5] = 2;
    assert_int_equal(rcode_of(f, two, 2 * len - NS_HFIXEDSZ), ns_r_formerr);
    /* a compression pointer looping on itself */
    memcpy(two, msg, NS_HFIXEDSZ);
    two[NS_HFIXEDSZ] = 0xc0;
    two[NS_HFIXEDSZ + 1] = NS_HFIXEDSZ;
    memset(two + NS_HFIXEDSZ + 2, 0, 4);
    two[NS_HFIXEDSZ + 3] = 1;
    two[NS_HFIXEDSZ + 5] = 1;
    assert_int_equal(rcode_of(f, two, NS_HFIXEDSZ + 6), ns_r_formerr);
    /* another opcode: NOTIMP; another class: REFUSED */
    msg[2] = (guint8)((msg[2] & ~0x78) | (ns_o_update << 3));
    assert_int_equal(rcode_of(f, msg, len), ns_r_notimpl);
    msg[2] = ((const guint8 *)g_bytes_get_data(query, NULL))[2];
    msg[len - 1] = ns_c_chaos;
    assert_int_equal(rcode_of(f, msg, len), ns_r_refused);

    /* Random bytes after a header: answered or closed, never a crash. */
    for (guint i = 0; i < 200; i++) {
        guint8 noise[64];
        gsize n = NS_HFIXEDSZ + g_random_int_range(0, sizeof(noise) - NS_HFIXEDSZ);

        for (gsize j = 0; j < n; j++)
            noise[j] = (guint8)g_random_int();
        noise[2] &= 0x7f;
        (void)rcode_of(f, noise, n);
    }
    /* A query that stops half way: closed after the handshake timeout. */
    {
        int fd = guest_connect(f, VM_FD_PASS_TAG_DNS);
        guint8 length[2] = {0, 40};
        gboolean eof = FALSE;
        g_autoptr(GString) rest = NULL;

        assert_int_equal(send(fd, length, 2, MSG_NOSIGNAL), 2);
        rest = vm_test_read_until(fd, "never", 4000, &eof);
        assert_true(eof);
        assert_int_equal(rest->len, 0);
        close(fd);
    }
    /* still serving */
    resolve(f, "sink.test", ns_t_a, &answer);
    assert_int_equal(answer.answers, 1);
}

/* ---------------------------------------------------------------------------------------------
 * CONNECT to a synthetic address */

/* CONNECT @target:PORT on the guest path, then @hello; the status of the proxy's answer. */
static int
tunnel_status(Fixture *f, const char *target, GBytes *hello, int *ret_fd)
{
    g_autofree char *req = g_strdup_printf("CONNECT %s:%u HTTP/1.0\r\n\r\n", target, f->sink->port);
    int fd = guest_connect(f, VM_FD_PASS_TAG);
    g_autoptr(GString) response = NULL;
    int status = 0;

    vm_test_send_text(fd, req);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    if (g_str_has_prefix(response->str, "HTTP/1.1 ") && response->len >= 12)
        status = atoi(response->str + 9);
    if (status == 200 && hello != NULL)
        assert_int_equal(
            send(fd, g_bytes_get_data(hello, NULL), g_bytes_get_size(hello), MSG_NOSIGNAL),
            g_bytes_get_size(hello));
    *ret_fd = fd;
    return status;
}

static void
test_connect_synthetic(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("sink.test");
    gsize len = g_bytes_get_size(hello);
    g_autoptr(GString) echo = NULL;
    const VmTestEgressRecord *record;
    Answer answer;
    int fd;

    resolve(f, "sink.test", ns_t_a, &answer);
    assert_int_equal(tunnel_status(f, answer.address, hello, &fd), 200);
    echo = vm_test_read_until(fd, NULL, 500, NULL);
    assert_int_equal(echo->len, len);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    /* Decided, logged and connected as the name: the address it resolves to, not the synthetic */
    assert_string_equal(record->host, "sink.test");
    assert_string_equal(record->address, "127.0.0.1");
    assert_int_equal(record->bytes_up, len);
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), len);
}

/* As for the name: a ClientHello for another name is refused and nothing reaches the sink. */
static void
test_connect_synthetic_sni(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("other.test");
    const VmTestEgressRecord *record;
    Answer answer;
    int fd;

    resolve(f, "sink.test", ns_t_a, &answer);
    assert_int_equal(tunnel_status(f, answer.address, hello, &fd), 200);
    g_autoptr(GString) rest = vm_test_read_until(fd, "never", 2000, NULL);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_string_equal(record->reason, "sni-mismatch");
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* The policy is asked at the CONNECT, not at the answer: a name revoked since is refused. */
static void
test_connect_synthetic_revoked(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("sink.test");
    g_autoptr(VmEgressPolicy) none = vm_egress_policy_new_none();
    const VmTestEgressRecord *record;
    Answer answer;
    int fd;

    resolve(f, "sink.test", ns_t_a, &answer);
    vm_egress_proxy_set_policy(f->proxy, none);
    assert_int_equal(tunnel_status(f, answer.address, hello, &fd), 403);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_string_equal(record->host, "sink.test");
    assert_string_equal(record->reason, "no-rule");
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* An address of the range that stands for no name is refused, even where a CIDR rule opens the
 * range: it is never taken as an address. So is a name forgotten by a full table, and a plain
 * HTTP request to a synthetic address. */
static void
test_connect_synthetic_unknown(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("sink.test");
    const VmTestEgressRecord *record;
    Answer first, other;
    int fd;

    fixture_start(f, "sink.test:PORT *.more.test:PORT 100.100.0.0/16:PORT", 1);
    assert_int_equal(tunnel_status(f, "100.100.3.4", hello, &fd), 403);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 0);
    assert_string_equal(record->reason, "dns-unknown-address");
    assert_string_equal(record->address, "100.100.3.4");

    resolve(f, "sink.test", ns_t_a, &first);
    resolve(f, "a.more.test", ns_t_a, &other);
    assert_string_not_equal(first.address, other.address);
    assert_int_equal(tunnel_status(f, first.address, hello, &fd), 403);
    close(fd);
    record = vm_test_egress_log_wait(f->log, 1);
    assert_string_equal(record->reason, "dns-unknown-address");

    {
        g_autofree char *req =
            g_strdup_printf("GET http://%s:%u/ HTTP/1.1\r\nHost: %s:%u\r\n\r\n", other.address,
                            f->sink->port, other.address, f->sink->port);
        int plain = guest_connect(f, VM_FD_PASS_TAG);
        g_autoptr(GString) response = NULL;

        vm_test_send_text(plain, req);
        response = vm_test_read_until(plain, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
        assert_true(g_str_has_prefix(response->str, "HTTP/1.1 403 "));
        close(plain);
    }
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

/* Plain HTTP in a tunnel to a synthetic address (port 80 through the guest's redirect): served
 * as a proxy request to the name, its Host checked; the echo sink sends the forwarded head back. */
static void
test_connect_synthetic_http(void **state)
{
    Fixture *f = *state;
    g_autofree char *get =
        g_strdup_printf("GET /x HTTP/1.1\r\nHost: sink.test:%u\r\n\r\n", f->sink->port);
    g_autofree char *bad =
        g_strdup_printf("GET /x HTTP/1.1\r\nHost: other.test:%u\r\n\r\n", f->sink->port);
    g_autoptr(GBytes) request = g_bytes_new(get, strlen(get));
    g_autoptr(GBytes) wrong = g_bytes_new(bad, strlen(bad));
    g_autoptr(GString) echo = NULL;
    g_autoptr(GString) refused = NULL;
    const VmTestEgressRecord *record;
    Answer answer;
    int fd;

    resolve(f, "sink.test", ns_t_a, &answer);
    assert_int_equal(tunnel_status(f, answer.address, request, &fd), 200);
    echo = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    close(fd);
    assert_true(g_str_has_prefix(echo->str, "GET /x HTTP/1.1\r\nHost: sink.test:"));
    record = vm_test_egress_log_wait(f->log, 0);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_ALLOWED);
    assert_string_equal(record->host, "sink.test");

    /* Host naming another name than the one the address stands for: 400, nothing sent. */
    gint before = g_atomic_int_get(&f->sink->bytes);
    assert_int_equal(tunnel_status(f, answer.address, wrong, &fd), 200);
    refused = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, NULL);
    close(fd);
    assert_true(g_str_has_prefix(refused->str, "HTTP/1.1 400 "));
    record = vm_test_egress_log_wait(f->log, 1);
    assert_int_equal(record->kind, VM_EGRESS_RECORD_DENIED);
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), before);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test_setup_teardown(test_resolve_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resolve_denied, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resolve_wildcard_and_any, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resolve_nonexistent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_several_queries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_synthetic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_synthetic_sni, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_synthetic_revoked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_synthetic_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_synthetic_http, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
