/* Egress request parser: accepted shapes, refusals (malformed, oversized, truncated, smuggling,
 * Host mismatch), incremental feeding and the head forwarded to the destination. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-request.h"
#include "vm-error.h"
#include "test-common.h"

#include <string.h>

static VmEgressRequest *
parse(const char *text, GError **error)
{
    return vm_egress_request_parse((const guint8 *)text, strlen(text), error);
}

static void
test_good_table(void **state)
{
    static const struct {
        const char *head;
        VmEgressRequestKind kind;
        const char *host;
        guint port;
        const char *path;
    } cases[] = {
        {"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", VM_EGRESS_REQUEST_CONNECT,
         "pypi.org", 443, NULL},
        {"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n", VM_EGRESS_REQUEST_CONNECT, "pypi.org", 443, NULL},
        {"CONNECT pypi.org:443 HTTP/1.0\r\nHost: PyPI.org\r\n\r\n", VM_EGRESS_REQUEST_CONNECT,
         "pypi.org", 443, NULL},
        {"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\nHost: [2001:db8::1]:8443\r\n\r\n",
         VM_EGRESS_REQUEST_CONNECT, "2001:db8::1", 8443, NULL},
        {"CONNECT 203.0.113.5:22 HTTP/1.1\r\nContent-Length: 0\r\n\r\n", VM_EGRESS_REQUEST_CONNECT,
         "203.0.113.5", 22, NULL},
        {"GET http://deb.debian.org/debian/ HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n",
         VM_EGRESS_REQUEST_HTTP, "deb.debian.org", 80, "/debian/"},
        {"GET HTTP://Example.COM HTTP/1.1\r\nHost: example.com:80\r\n\r\n", VM_EGRESS_REQUEST_HTTP,
         "Example.COM", 80, "/"},
        {"GET http://example.com?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n", VM_EGRESS_REQUEST_HTTP,
         "example.com", 80, "/?q=1"},
        {"HEAD http://example.com:8080/a/b?c=d HTTP/1.1\r\nHost: example.com:8080\r\n\r\n",
         VM_EGRESS_REQUEST_HTTP, "example.com", 8080, "/a/b?c=d"},
        {"GET http://[2001:db8::1]/ HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n",
         VM_EGRESS_REQUEST_HTTP, "2001:db8::1", 80, "/"},
        {"GET http://example.com/ HTTP/1.0\r\n\r\n", VM_EGRESS_REQUEST_HTTP, "example.com", 80,
         "/"},
        {"POST http://example.com/ HTTP/1.1\r\nHost: example.com\r\nContent-Length: 12\r\n\r\n",
         VM_EGRESS_REQUEST_HTTP, "example.com", 80, "/"},
        {"POST http://example.com/ HTTP/1.1\r\nHost: example.com\r\n"
         "Transfer-Encoding: Chunked\r\n\r\n",
         VM_EGRESS_REQUEST_HTTP, "example.com", 80, "/"},
        {"GET http://example.com/ HTTP/1.1\r\nHost:example.com\r\nX-Empty:\r\n"
         "X-Tab:\tv\t\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
         VM_EGRESS_REQUEST_HTTP, "example.com", 80, "/"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEgressRequest) request = parse(cases[i].head, &error);

        if (request == NULL)
            fail_msg("case %zu refused: %s", i, error->message);
        assert_int_equal(request->kind, cases[i].kind);
        assert_string_equal(request->host, cases[i].host);
        assert_int_equal(request->port, cases[i].port);
        if (cases[i].path == NULL) {
            assert_null(request->path);
            assert_null(request->scheme);
        } else {
            assert_string_equal(request->path, cases[i].path);
            assert_string_equal(request->scheme, "http");
        }
    }
}

typedef struct {
    const char *head;
    int code;
} BadCase;

static void
check_bad(const BadCase *cases, gsize n)
{
    for (gsize i = 0; i < n; i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEgressRequest) request = parse(cases[i].head, &error);

        if (request != NULL)
            fail_msg("case %zu accepted: %s", i, cases[i].head);
        if (!g_error_matches(error, VM_ERROR, cases[i].code))
            fail_msg("case %zu: wrong error (%d) %s", i, error->code, error->message);
    }
}

static void
test_bad_malformed(void **state)
{
    static const BadCase cases[] = {
        {"\r\n\r\n", VM_ERROR_PROTOCOL},
        {"\r\nGET http://a.example/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\n\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\rHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nX: a\rb\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET  http://a.example/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1 \r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET\thttp://a.example/\tHTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/2.0\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ http/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.10\r\n\r\n", VM_ERROR_PROTOCOL},
        {"G@T http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/\x7f HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/\xc3\xa9 HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/#frag HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http:///x HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example:/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example:0/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example:65536/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example:+80/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example:080080/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a%2eexample/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://[fe80::1%25eth0]/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://[::1/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://[a.example]/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://[::1]x/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example:80:80/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"CONNECT pypi.org HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"CONNECT pypi.org: HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"CONNECT :443 HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"CONNECT http://pypi.org:443 HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nNoColon\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n: v\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: a\x01"
         "b\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: a\x7f\r\n\r\n",
         VM_ERROR_PROTOCOL},
        /* HTTP/1.1 needs Host */
        {"GET http://a.example/ HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: u@a.example\r\n\r\n", VM_ERROR_PROTOCOL},
    };

    check_bad(cases, G_N_ELEMENTS(cases));
}

static void
test_bad_refused(void **state)
{
    static const BadCase cases[] = {
        /* origin form: the guest must address the proxy explicitly */
        {"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"GET /x?y HTTP/1.0\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"GET https://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"GET ftp://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"GET a.example:80 HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        /* Host that disagrees with the target */
        {"GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example:8080\r\n\r\n",
         VM_ERROR_INVALID_ARGUMENT},
        {"GET http://a.example:8080/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
         VM_ERROR_INVALID_ARGUMENT},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example.\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"GET http://127.0.0.1/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"CONNECT a.example:443 HTTP/1.1\r\nHost: b.example:443\r\n\r\n",
         VM_ERROR_INVALID_ARGUMENT},
        {"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:22\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
        {"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::2]:443\r\n\r\n", VM_ERROR_INVALID_ARGUMENT},
    };

    check_bad(cases, G_N_ELEMENTS(cases));
}

static void
test_bad_userinfo(void **state)
{
    static const BadCase cases[] = {
        {"GET http://user@a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://u:p@a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example@evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"CONNECT user@a.example:443 HTTP/1.1\r\n\r\n", VM_ERROR_PROTOCOL},
    };

    check_bad(cases, G_N_ELEMENTS(cases));
}

static void
test_bad_smuggling(void **state)
{
    static const BadCase cases[] = {
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n"
         "Content-Length: 6\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n"
         "Content-Length: 5\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5, 5\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: +5\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: \r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
         "Content-Length: 99999999999999999999\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n"
         "Transfer-Encoding: chunked\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n"
         "Transfer-Encoding: chunked\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
         "Transfer-Encoding: gzip, chunked\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
         "Transfer-Encoding: xchunked\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
         "Transfer-Encoding : chunked\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\n"
         "Content-Length\t: 5\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"POST http://a.example/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: a\r\n b\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nX: a\r\n\tb\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\n Host: a.example\r\n\r\n", VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nConnection: content-length\r\n"
         "Content-Length: 5\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nConnection: close, host\r\n\r\n",
         VM_ERROR_PROTOCOL},
        {"CONNECT a.example:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\n", VM_ERROR_PROTOCOL},
        {"CONNECT a.example:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", VM_ERROR_PROTOCOL},
    };

    check_bad(cases, G_N_ELEMENTS(cases));
}

static void
test_nul_byte(void **state)
{
    static const char head[] = "GET http://a.example/ HTTP/1.1\r\nHost: a\0.example\r\n\r\n";
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressRequest) request =
        vm_egress_request_parse((const guint8 *)head, sizeof(head) - 1, &error);

    assert_null(request);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    assert_non_null(strstr(error->message, "NUL"));
}

static void
test_truncated(void **state)
{
    static const char head[] = "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n";

    for (gsize len = 0; len < sizeof(head) - 1; len++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEgressRequest) request =
            vm_egress_request_parse((const guint8 *)head, len, &error);

        if (request != NULL)
            fail_msg("%zu bytes of the head accepted", len);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    }
}

/* Oversized heads fail as soon as the limit is passed, without waiting for the end. */
static void
test_oversized(void **state)
{
    g_autoptr(GString) line = g_string_new("GET http://a.example/");
    g_autoptr(GString) head = g_string_new("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n");
    g_autoptr(GString) fields =
        g_string_new("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n");
    g_autoptr(GString) ok = g_string_new("GET http://a.example/");
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new();
    g_autoptr(VmEgressParser) head_parser = vm_egress_parser_new();
    g_autoptr(VmEgressParser) fields_parser = vm_egress_parser_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) head_error = NULL;
    g_autoptr(GError) fields_error = NULL;
    g_autoptr(VmEgressRequest) request = NULL;

    /* the longest request line that fits */
    while (ok->len < VM_EGRESS_REQUEST_LINE_MAX - strlen(" HTTP/1.1"))
        g_string_append_c(ok, 'x');
    g_string_append(ok, " HTTP/1.1\r\nHost: a.example\r\n\r\n");
    request = parse(ok->str, &error);
    if (request == NULL)
        fail_msg("longest line refused: %s", error->message);

    while (line->len < VM_EGRESS_REQUEST_LINE_MAX + 100)
        g_string_append_c(line, 'x');
    assert_int_equal(
        vm_egress_parser_feed(parser, (const guint8 *)line->str, line->len, NULL, NULL),
        VM_EGRESS_PARSE_ERROR);

    for (guint i = 0; head->len <= VM_EGRESS_REQUEST_HEAD_MAX; i++)
        g_string_append_printf(head, "X-%u: %0400u\r\n", i % 90, i);
    assert_int_equal(
        vm_egress_parser_feed(head_parser, (const guint8 *)head->str, head->len, NULL, &head_error),
        VM_EGRESS_PARSE_ERROR);
    assert_true(g_error_matches(head_error, VM_ERROR, VM_ERROR_PROTOCOL));

    for (guint i = 0; i < VM_EGRESS_REQUEST_FIELDS_MAX; i++)
        g_string_append_printf(fields, "X-%u: v\r\n", i);
    assert_int_equal(vm_egress_parser_feed(fields_parser, (const guint8 *)fields->str, fields->len,
                                           NULL, &fields_error),
                     VM_EGRESS_PARSE_ERROR);
    assert_true(g_error_matches(fields_error, VM_ERROR, VM_ERROR_PROTOCOL));
}

static void
test_max_fields_accepted(void **state)
{
    g_autoptr(GString) head = g_string_new("GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n");
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressRequest) request = NULL;

    for (guint i = 1; i < VM_EGRESS_REQUEST_FIELDS_MAX; i++)
        g_string_append_printf(head, "X-%u: v\r\n", i);
    g_string_append(head, "\r\n");
    request = parse(head->str, &error);
    if (request == NULL)
        fail_msg("100 fields refused: %s", error->message);
    assert_int_equal(request->headers->len, VM_EGRESS_REQUEST_FIELDS_MAX);
}

/* A byte at a time gives the same result as all at once, and what follows the head is left. */
static void
test_incremental(void **state)
{
    static const char data[] = "POST http://a.example/up HTTP/1.1\r\nHost: a.example\r\n"
                               "Content-Length: 5\r\n\r\nhello";
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new();
    g_autoptr(VmEgressRequest) request = NULL;
    gsize i;

    for (i = 0; i < sizeof(data) - 1; i++) {
        g_autoptr(GError) error = NULL;
        gsize consumed = 99;
        VmEgressParseStatus status =
            vm_egress_parser_feed(parser, (const guint8 *)data + i, 1, &consumed, &error);

        if (status == VM_EGRESS_PARSE_DONE) {
            assert_int_equal(consumed, 1);
            break;
        }
        assert_int_equal(status, VM_EGRESS_PARSE_MORE);
        assert_null(error);
        assert_null(vm_egress_parser_steal_request(parser));
    }
    assert_int_equal(i + 1, sizeof(data) - 1 - strlen("hello"));
    request = vm_egress_parser_steal_request(parser);
    assert_non_null(request);
    assert_string_equal(request->path, "/up");
    assert_null(vm_egress_parser_steal_request(parser));
}

static void
test_consumed_with_body(void **state)
{
    static const char data[] = "CONNECT a.example:443 HTTP/1.1\r\n\r\n\x16\x03\x01";
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new();
    gsize consumed = 0;

    assert_int_equal(
        vm_egress_parser_feed(parser, (const guint8 *)data, sizeof(data) - 1, &consumed, NULL),
        VM_EGRESS_PARSE_DONE);
    assert_int_equal(consumed, sizeof(data) - 1 - 3);
}

/* Errors come as early as the bytes allow: a bad byte fails at once, without the rest. */
static void
test_early_error(void **state)
{
    static const char *const prefixes[] = {
        "GET http://a.example/ HTTP/1.1\r\nX: \x01",
        "GET http://a.example/ HTTP/1.1\r\n\tX",
        "GET http://a.example/ HTTP/1.1\r\nHost: a\rx",
        "GET http://a.example/ HTTP/1.1\n",
        "\x16\x03\x01",
        "SSH-2.0-OpenSSH_9.2\r",
        " GET",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(prefixes); i++) {
        g_autoptr(VmEgressParser) parser = vm_egress_parser_new();
        g_autoptr(GError) error = NULL;
        VmEgressParseStatus status = vm_egress_parser_feed(parser, (const guint8 *)prefixes[i],
                                                           strlen(prefixes[i]), NULL, &error);

        /* the \x01 is only refused with the whole field; the others at once */
        if (i == 0)
            assert_int_equal(status, VM_EGRESS_PARSE_MORE);
        else if (status != VM_EGRESS_PARSE_ERROR)
            fail_msg("prefix %zu not refused early", i);
    }
}

static void
test_forwarded_head(void **state)
{
    static const char data[] = "GET http://a.example:8080/p?q=1 HTTP/1.1\r\n"
                               "User-Agent: t\r\n"
                               "Host: A.example:8080\r\n"
                               "Proxy-Authorization: Basic eDp5\r\n"
                               "Proxy-Connection: keep-alive\r\n"
                               "Connection: keep-alive, X-Hop\r\n"
                               "X-Hop: 1\r\n"
                               "Keep-Alive: 300\r\n"
                               "TE: trailers\r\n"
                               "Upgrade: h2c\r\n"
                               "Accept: */*\r\n"
                               "\r\n";
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressRequest) request = parse(data, &error);
    g_autoptr(GBytes) head = NULL;
    g_autofree char *text = NULL;

    assert_non_null(request);
    head = vm_egress_request_build_head(request);
    text = g_strndup(g_bytes_get_data(head, NULL), g_bytes_get_size(head));
    assert_string_equal(text, "GET /p?q=1 HTTP/1.1\r\n"
                              "Host: a.example:8080\r\n"
                              "User-Agent: t\r\n"
                              "Accept: */*\r\n"
                              "Connection: close\r\n"
                              "\r\n");
}

static void
test_forwarded_head_default_port_and_v6(void **state)
{
    g_autoptr(VmEgressRequest) plain = parse("GET http://a.example HTTP/1.0\r\n\r\n", NULL);
    g_autoptr(VmEgressRequest) v6 =
        parse("GET http://[2001:db8::1]:81/ HTTP/1.1\r\nHost: [2001:db8::1]:81\r\n\r\n", NULL);
    g_autoptr(VmEgressRequest) connect = parse("CONNECT [::1]:443 HTTP/1.1\r\n\r\n", NULL);
    g_autoptr(GBytes) head = NULL;
    g_autofree char *authority = NULL;
    g_autofree char *v6_authority = NULL;
    g_autofree char *text = NULL;

    assert_non_null(plain);
    head = vm_egress_request_build_head(plain);
    text = g_strndup(g_bytes_get_data(head, NULL), g_bytes_get_size(head));
    assert_string_equal(text, "GET / HTTP/1.0\r\nHost: a.example\r\nConnection: close\r\n\r\n");
    v6_authority = vm_egress_request_dup_authority(v6);
    assert_string_equal(v6_authority, "[2001:db8::1]:81");
    authority = vm_egress_request_dup_authority(connect);
    assert_string_equal(authority, "[::1]:443");
}

/* The hook interface: fields can be rewritten, added and removed before forwarding. */
static void
test_set_header(void **state)
{
    g_autoptr(VmEgressRequest) request = parse("GET http://a.example/ HTTP/1.1\r\n"
                                               "Host: a.example\r\nAuthorization: PLACEHOLDER\r\n"
                                               "X-A: 1\r\nx-a: 2\r\n\r\n",
                                               NULL);
    g_autoptr(GBytes) head = NULL;
    g_autofree char *text = NULL;

    assert_non_null(request);
    assert_string_equal(vm_egress_request_get_header(request, "authorization"), "PLACEHOLDER");
    vm_egress_request_set_header(request, "Authorization", "Bearer real");
    vm_egress_request_set_header(request, "X-A", NULL);
    vm_egress_request_set_header(request, "X-New", "v");
    assert_null(vm_egress_request_get_header(request, "x-a"));
    head = vm_egress_request_build_head(request);
    text = g_strndup(g_bytes_get_data(head, NULL), g_bytes_get_size(head));
    assert_string_equal(text, "GET / HTTP/1.1\r\nHost: a.example\r\nAuthorization: Bearer real\r\n"
                              "X-New: v\r\nConnection: close\r\n\r\n");
}

/* ---------------------------------------------------------------------------------------------
 * Body framing: where the next request head starts */

/* Frames @body (what follows @head) fed in pieces of @step bytes; returns how many bytes the body
 * took, or -1 on a framing error. */
static gssize
frame(const char *head, const char *body, gsize step)
{
    g_autoptr(VmEgressRequest) request = parse(head, NULL);
    g_autoptr(VmEgressBodyFramer) framer = NULL;
    gsize len = strlen(body);
    gsize off = 0;

    assert_non_null(request);
    framer = vm_egress_body_framer_new(request);
    do {
        g_autoptr(GError) error = NULL;
        gsize n = MIN(step, len - off);
        gsize consumed = 0;

        switch (
            vm_egress_body_framer_feed(framer, (const guint8 *)body + off, n, &consumed, &error)) {
        case VM_EGRESS_PARSE_DONE:
            return (gssize)(off + consumed);
        case VM_EGRESS_PARSE_ERROR:
            assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
            return -1;
        case VM_EGRESS_PARSE_MORE:
        default:
            off += n;
        }
    } while (off < len);
    return -2; /* still more to come */
}

static void
test_body_framing(void **state)
{
    static const char get[] = "GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n";
    static const char post[] =
        "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\n\r\n";
    static const char zero[] =
        "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nContent-Length: 0\r\n\r\n";
    static const char chunked[] =
        "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n";
    static const struct {
        const char *head;
        const char *body;
        gssize taken; /* -1: refused, -2: incomplete */
    } cases[] = {
        {get, "", 0},
        {get, "GET http://b.example/ HTTP/1.1\r\n", 0},
        {zero, "GET", 0},
        {post, "hello", 5},
        {post, "helloGET http://b.example/", 5},
        {post, "hell", -2},
        {chunked, "5\r\nhello\r\n0\r\n\r\n", 15},
        {chunked, "5\r\nhello\r\n0\r\n\r\nGET http://b.example/", 15},
        {chunked, "A;ext=\"v\"\r\n0123456789\r\n0\r\nX-T: v\r\n\r\nNEXT", 36},
        {chunked, "a\r\n0123456789\r\n00\r\n\r\n", 21},
        {chunked, "5\r\nhello\r\n", -2},
        {chunked, "0\r\nX-T: v\r\n", -2},
        /* refused: the framing would be read differently elsewhere */
        {chunked, "5\nhello\r\n0\r\n\r\n", -1},
        {chunked, "5\r\nhelloXX0\r\n\r\n", -1},
        {chunked, " 5\r\nhello\r\n0\r\n\r\n", -1},
        {chunked, "5 \r\nhello\r\n0\r\n\r\n", -1},
        {chunked, "+5\r\nhello\r\n0\r\n\r\n", -1},
        {chunked, "0x5\r\nhello\r\n0\r\n\r\n", -1},
        {chunked, "5\rX\nhello\r\n0\r\n\r\n", -1},
        {chunked, "1000000000000000\r\n", -1},
        {chunked, "0\r\n folded\r\n\r\n", -1},
        {chunked, "0\r\nno colon\r\n\r\n", -1},
        {chunked, "0\r\nX-T: v\rX\r\n\r\n", -1},
        {chunked, "\r\n", -1},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        /* in one piece and a byte at a time: the same answer */
        gssize whole = frame(cases[i].head, cases[i].body, G_MAXSIZE);
        gssize bytewise = frame(cases[i].head, cases[i].body, 1);

        if (whole != cases[i].taken || bytewise != cases[i].taken)
            fail_msg("case %zu ('%s'): %zd and %zd, expected %zd", i, cases[i].body, whole,
                     bytewise, cases[i].taken);
    }
}

/* Chunk lines and trailers are bounded like header lines. */
static void
test_body_framing_limits(void **state)
{
    static const char chunked[] =
        "POST http://a.example/ HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n";
    g_autoptr(GString) ext = g_string_new("5;");
    g_autoptr(GString) trailer = g_string_new("0\r\n");

    while (ext->len < VM_EGRESS_REQUEST_LINE_MAX + 10)
        g_string_append_c(ext, 'x');
    assert_int_equal(frame(chunked, ext->str, G_MAXSIZE), -1);
    while (trailer->len < VM_EGRESS_REQUEST_HEAD_MAX + 100)
        g_string_append(trailer, "X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    assert_int_equal(frame(chunked, trailer->str, G_MAXSIZE), -1);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_table),
        cmocka_unit_test(test_bad_malformed),
        cmocka_unit_test(test_bad_refused),
        cmocka_unit_test(test_bad_userinfo),
        cmocka_unit_test(test_bad_smuggling),
        cmocka_unit_test(test_nul_byte),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_max_fields_accepted),
        cmocka_unit_test(test_incremental),
        cmocka_unit_test(test_consumed_with_body),
        cmocka_unit_test(test_early_error),
        cmocka_unit_test(test_forwarded_head),
        cmocka_unit_test(test_forwarded_head_default_port_and_v6),
        cmocka_unit_test(test_set_header),
        cmocka_unit_test(test_body_framing),
        cmocka_unit_test(test_body_framing_limits),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
