/* The credential broker's pure logic: which hosts are intercepted, the header substitution table
 * (Bearer, a custom header, token, Basic on either side of the pair), the leak reasons of a
 * placeholder anywhere else, the body scanner fed in pieces of every size, and the response
 * redactor (values at every offset, every piece size, split between chunks). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-credential.h"
#include "vm-error.h"
#include "test-common.h"

#include <string.h>

#define PH_API  "vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
#define PH_GH   "vmph_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
#define PH_KEY  "vmph_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC"
#define PH_USER "vmph_DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD"
#define PH_GONE "vmph_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"

/* api: Bearer on api.example.com; gh: "token {}" on *.github.test; key: a custom header with the
 * bare value; reg: Basic on registry.test. */
static VmEgressCredentials *
make_creds(void)
{
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    g_autoptr(GError) error = NULL;
    const char *api_hosts[] = {"API.Example.com.", NULL};
    const char *gh_hosts[] = {"*.github.test", NULL};
    const char *key_hosts[] = {"keys.test", NULL};
    const char *reg_hosts[] = {"registry.test", NULL};

    assert_true(vm_egress_credentials_add(creds, "api", PH_API, "sk-real-api", api_hosts, NULL,
                                          "Bearer {}", &error));
    assert_true(vm_egress_credentials_add(creds, "gh", PH_GH, "ghp_real", gh_hosts, "Authorization",
                                          "token {}", &error));
    assert_true(vm_egress_credentials_add(creds, "key", PH_KEY, "real-key", key_hosts, "X-Api-Key",
                                          NULL, &error));
    assert_true(vm_egress_credentials_add(creds, "reg", PH_USER, "real-pass", reg_hosts, NULL,
                                          "Basic {}", &error));
    assert_null(error);
    assert_int_equal(vm_egress_credentials_size(creds), 4);
    return g_steal_pointer(&creds);
}

static VmEgressRequest *
parse_origin(const char *host, const char *head)
{
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new_origin(host, 443);
    g_autoptr(GError) error = NULL;
    gsize consumed = 0;

    assert_int_equal(
        vm_egress_parser_feed(parser, (const guint8 *)head, strlen(head), &consumed, &error),
        VM_EGRESS_PARSE_DONE);
    return vm_egress_parser_steal_request(parser);
}

static void
test_add_refused(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    const char *hosts[] = {"api.example.com", NULL};
    const char *bad_hosts[] = {"http://x", NULL};
    const char *no_hosts[] = {NULL};
    struct {
        const char *placeholder, *value;
        const char *const *hosts;
        const char *header, *format;
    } cases[] = {
        {"vmph_1", "", hosts, NULL, NULL},          {"", "v", hosts, NULL, NULL},
        {"vmph_1", "v", bad_hosts, NULL, NULL},     {"vmph_1", "v", no_hosts, NULL, NULL},
        {"vmph_1", "v", hosts, "Bad Header", NULL}, {"vmph_1", "v", hosts, NULL, "Bearer"},
        {"vmph_1", "v", hosts, NULL, "{} {}"},      {"vmph_1", "v\r\nX: y", hosts, NULL, NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;

        assert_false(vm_egress_credentials_add(creds, "s", cases[i].placeholder, cases[i].value,
                                               cases[i].hosts, cases[i].header, cases[i].format,
                                               &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
    }
    assert_int_equal(vm_egress_credentials_size(creds), 0);
    assert_true(vm_egress_credentials_add(creds, "s", "vmph_1", "v", hosts, NULL, NULL, NULL));
    g_autoptr(GError) error = NULL;
    assert_false(vm_egress_credentials_add(creds, "t", "vmph_1", "w", hosts, NULL, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "twice");
}

static void
test_intercepts(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = make_creds();

    assert_true(vm_egress_credentials_intercepts(creds, "api.example.com"));
    assert_true(vm_egress_credentials_intercepts(creds, "api.github.test"));
    assert_true(vm_egress_credentials_intercepts(creds, "a.b.github.test"));
    assert_false(vm_egress_credentials_intercepts(creds, "github.test")); /* the apex: no */
    assert_false(vm_egress_credentials_intercepts(creds, "xgithub.test"));
    assert_false(vm_egress_credentials_intercepts(creds, "example.com"));
    assert_false(vm_egress_credentials_intercepts(creds, "pypi.org"));
    assert_false(vm_egress_credentials_intercepts(NULL, "api.example.com"));
}

/* The substitution table: what the guest sends -> what the upstream gets. */
static void
test_substitution_table(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = make_creds();
    g_autofree char *basic_in = g_base64_encode((const guchar *)"alice:" PH_USER, 51);
    g_autofree char *basic_user_in = g_base64_encode((const guchar *)PH_USER ":x-oauth", 53);
    g_autofree char *basic_out = g_base64_encode((const guchar *)"alice:real-pass", 15);
    g_autofree char *basic_user_out = g_base64_encode((const guchar *)"real-pass:x-oauth", 17);
    g_autofree char *basic_raw_out = g_base64_encode((const guchar *)"real-pass", 9);
    struct {
        const char *host, *name, *in, *out, *secret;
    } cases[] = {
        {"api.example.com", "Authorization", "Bearer " PH_API, "Bearer sk-real-api", "api"},
        {"api.example.com", "authorization", PH_API, "Bearer sk-real-api", "api"},
        {"api.github.test", "Authorization", "token " PH_GH, "token ghp_real", "gh"},
        {"api.github.test", "Authorization", "Bearer " PH_GH, "token ghp_real", "gh"},
        {"keys.test", "X-Api-Key", PH_KEY, "real-key", "key"},
        {"registry.test", "Authorization", NULL, NULL, "reg"}, /* Basic, password side */
        {"registry.test", "Authorization", NULL, NULL, "reg"}, /* Basic, user side */
        {"registry.test", "Authorization", "Basic " PH_USER, NULL, "reg"}, /* not encoded */
        {"api.example.com", "Authorization", "Bearer " PH_GONE, "Bearer " PH_GONE, NULL},
        {"api.example.com", "Authorization", "Bearer sk-own", "Bearer sk-own", NULL},
    };
    g_autofree char *in5 = g_strconcat("Basic ", basic_in, NULL);
    g_autofree char *out5 = g_strconcat("Basic ", basic_out, NULL);
    g_autofree char *in6 = g_strconcat("Basic ", basic_user_in, NULL);
    g_autofree char *out6 = g_strconcat("Basic ", basic_user_out, NULL);
    g_autofree char *out7 = g_strconcat("Basic ", basic_raw_out, NULL);

    cases[5].in = in5, cases[5].out = out5;
    cases[6].in = in6, cases[6].out = out6;
    cases[7].out = out7;
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *head =
            g_strdup_printf("GET /v1/x?y=1 HTTP/1.1\r\nHost: %s\r\nAccept: */*\r\n%s: %s\r\n\r\n",
                            cases[i].host, cases[i].name, cases[i].in);
        g_autoptr(VmEgressRequest) request = parse_origin(cases[i].host, head);
        g_autoptr(GError) error = NULL;
        g_autofree char *secret = NULL;

        if (!vm_egress_credentials_apply(creds, request, cases[i].host, NULL, &secret, &error))
            fail_msg("case %zu: %s", i, error->message);
        assert_string_equal(vm_egress_request_get_header(request, cases[i].name), cases[i].out);
        assert_string_equal(vm_egress_request_get_header(request, "Accept"), "*/*");
        assert_string_equal(request->path, "/v1/x?y=1");
        if (cases[i].secret != NULL)
            assert_string_equal(secret, cases[i].secret);
        else
            assert_null(secret);

        /* The forwarded head carries the value, keep-alive (no Connection: close) */
        g_autoptr(GString) forwarded = vm_egress_request_build_origin_head(request);
        g_autofree char *expected = g_strdup_printf("%s: %s\r\n", cases[i].name, cases[i].out);
        assert_non_null(strstr(forwarded->str, expected));
        assert_null(strstr(forwarded->str, "Connection"));
        assert_true(g_str_has_prefix(forwarded->str, "GET /v1/x?y=1 HTTP/1.1\r\nHost: "));
    }
}

/* A grant of several headers: the placeholder is replaced where it stands in whichever of them
 * holds it, so one grant serves the Anthropic SDK's "x-api-key: KEY" and "Authorization: Bearer
 * KEY" both; in any other header it is still a leak; a format other than "{}" is refused. */
static void
test_several_headers(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    g_autoptr(GError) error = NULL;
    const char *hosts[] = {"api.anthropic.test", NULL};
    g_autoptr(GVariant) wire = NULL;
    struct {
        const char *name, *in, *out;
    } cases[] = {
        {"x-api-key", PH_API, "sk-ant-real"},
        {"X-Api-Key", PH_API, "sk-ant-real"},
        {"Authorization", "Bearer " PH_API, "Bearer sk-ant-real"},
        {"authorization", PH_API, "sk-ant-real"},
        {"Authorization", "Token " PH_API " extra", "Token sk-ant-real extra"},
    };

    assert_true(vm_egress_credentials_add(creds, "anthropic", PH_API, "sk-ant-real", hosts,
                                          "Authorization, x-api-key", NULL, &error));
    assert_null(error);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *head = g_strdup_printf(
            "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.test\r\n%s: %s\r\n\r\n",
            cases[i].name, cases[i].in);
        g_autoptr(VmEgressRequest) request = parse_origin("api.anthropic.test", head);
        g_autoptr(VmEgressRedactor) redactor = vm_egress_redactor_new();
        g_autofree char *secret = NULL;

        if (!vm_egress_credentials_apply(creds, request, "api.anthropic.test", redactor, &secret,
                                         &error))
            fail_msg("case %zu: %s", i, error->message);
        assert_string_equal(vm_egress_request_get_header(request, cases[i].name), cases[i].out);
        assert_string_equal(secret, "anthropic");
        assert_int_equal(vm_egress_redactor_size(redactor), 1);
    }
    /* Both at once, as an SDK sending both would. */
    {
        g_autoptr(VmEgressRequest) request =
            parse_origin("api.anthropic.test",
                         "POST / HTTP/1.1\r\nHost: api.anthropic.test\r\nx-api-key: " PH_API
                         "\r\nAuthorization: Bearer " PH_API "\r\n\r\n");
        g_autofree char *secret = NULL;

        assert_true(vm_egress_credentials_apply(creds, request, "api.anthropic.test", NULL, &secret,
                                                &error));
        assert_string_equal(vm_egress_request_get_header(request, "x-api-key"), "sk-ant-real");
        assert_string_equal(vm_egress_request_get_header(request, "Authorization"),
                            "Bearer sk-ant-real");
    }
    /* Another header, or a host the grant does not name: a leak, nothing substituted. */
    {
        g_autoptr(VmEgressRequest) request =
            parse_origin("api.anthropic.test",
                         "POST / HTTP/1.1\r\nHost: api.anthropic.test\r\nx-api-key: " PH_API
                         "\r\nX-Other: " PH_API "\r\n\r\n");
        g_autofree char *secret = NULL;

        assert_false(vm_egress_credentials_apply(creds, request, "api.anthropic.test", NULL,
                                                 &secret, &error));
        assert_string_equal(error->message,
                            "leak: placeholder of anthropic sent to api.anthropic.test");
        assert_string_equal(vm_egress_request_get_header(request, "x-api-key"), PH_API);
        g_clear_error(&error);
    }
    {
        g_autoptr(VmEgressRequest) request = parse_origin(
            "other.test", "POST / HTTP/1.1\r\nHost: other.test\r\nx-api-key: " PH_API "\r\n\r\n");
        g_autofree char *secret = NULL;

        assert_false(
            vm_egress_credentials_apply(creds, request, "other.test", NULL, &secret, &error));
        assert_string_equal(error->message, "leak: placeholder of anthropic sent to other.test");
        g_clear_error(&error);
    }
    /* What the worker gets: the header as given, which it parses again. */
    wire = g_variant_ref_sink(vm_egress_credentials_to_variant(creds));
    {
        g_autoptr(GVariant) grant = g_variant_get_child_value(wire, 0);
        const char *header = NULL;

        g_variant_get_child(grant, 4, "&s", &header);
        assert_string_equal(header, "Authorization, x-api-key");
    }

    /* Refused: a format that would not fit every header, a name twice, a bad name, too many. */
    static const char *const bad[][2] = {
        {"Authorization, x-api-key", "Bearer {}"},
        {"Authorization, x-api-key", "Basic {}"},
        {"x-api-key, X-API-KEY", NULL},
        {"x-api-key, ", NULL},
        {"x-api-key,Bad Header", NULL},
        {"a,b,c,d,e,f,g,h,i", NULL},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(VmEgressCredentials) other = vm_egress_credentials_new();

        assert_false(vm_egress_credentials_add(other, "s", "vmph_1", "v", hosts, bad[i][0],
                                               bad[i][1], &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
        g_clear_error(&error);
    }
    /* Eight names, and "{}" given, are fine. */
    {
        g_autoptr(VmEgressCredentials) other = vm_egress_credentials_new();

        assert_true(vm_egress_credentials_add(other, "s", "vmph_1", "v", hosts, "a,b,c,d,e,f,g,h",
                                              "{}", &error));
    }
}

/* Every misplaced placeholder refuses the request with its reason and leaves it unchanged. */
static void
test_leaks(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = make_creds();
    g_autofree char *basic_elsewhere = g_base64_encode((const guchar *)"u:" PH_API, 47);
    g_autofree char *basic_header = g_strconcat("X-Creds: Basic ", basic_elsewhere, NULL);
    struct {
        const char *host, *target, *header, *reason;
    } cases[] = {
        {"api.example.com", "/v1?key=" PH_API, "Accept: x", "leak: placeholder of api in URL"},
        {"api.example.com", "/v1/%76mph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "Accept: x",
         "leak: placeholder of api in URL"},
        /* the right host, the wrong header */
        {"api.example.com", "/", "X-Other: Bearer " PH_API,
         "leak: placeholder of api sent to api.example.com"},
        /* the right header, a host the grant does not name */
        {"keys.test", "/", "Authorization: Bearer " PH_API,
         "leak: placeholder of api sent to keys.test"},
        {"api.github.test", "/", "Authorization: token " PH_KEY,
         "leak: placeholder of key sent to api.github.test"},
        /* hidden in Basic credentials of the wrong grant */
        {"api.example.com", "/", basic_header, "leak: placeholder of api sent to api.example.com"},
        /* a header name */
        {"api.example.com", "/", "X-" PH_API ": 1",
         "leak: placeholder of api sent to api.example.com"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *head = g_strdup_printf(
            "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer " PH_API "\r\n%s\r\n\r\n",
            cases[i].target, cases[i].host, cases[i].header);
        g_autoptr(VmEgressRequest) request = NULL;
        g_autoptr(GError) error = NULL;
        g_autofree char *secret = NULL;

        /* the api grant's own header is fine on its own host: the other part is the leak */
        if (strcmp(cases[i].host, "api.example.com") != 0) {
            g_free(head);
            head = g_strdup_printf("POST %s HTTP/1.1\r\nHost: %s\r\n%s\r\n\r\n", cases[i].target,
                                   cases[i].host, cases[i].header);
        }
        request = parse_origin(cases[i].host, head);
        if (vm_egress_credentials_apply(creds, request, cases[i].host, NULL, &secret, &error))
            fail_msg("case %zu: not refused", i);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
        assert_string_equal(error->message, cases[i].reason);
        assert_null(secret);
        /* nothing was substituted before the refusal */
        const char *auth = vm_egress_request_get_header(request, "Authorization");
        if (auth != NULL)
            assert_null(strstr(auth, "sk-real-api"));
    }
}

static void
test_plain_http(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = make_creds();
    const char *leaking[] = {
        "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n"
        "Authorization: Bearer " PH_API "\r\n\r\n",
        "GET http://pypi.test/?k=" PH_API " HTTP/1.1\r\nHost: pypi.test\r\n\r\n",
        "GET http://pypi.test/ HTTP/1.1\r\nHost: pypi.test\r\nCookie: a=" PH_API "\r\n\r\n",
    };
    const char *clean = "GET http://pypi.test/ HTTP/1.1\r\nHost: pypi.test\r\n"
                        "Authorization: Bearer " PH_GONE "\r\n\r\n";

    for (gsize i = 0; i < G_N_ELEMENTS(leaking); i++) {
        g_autoptr(VmEgressRequest) request =
            vm_egress_request_parse((const guint8 *)leaking[i], strlen(leaking[i]), NULL);
        g_autoptr(GError) error = NULL;

        assert_non_null(request);
        assert_false(vm_egress_credentials_check_plain(creds, request, &error));
        assert_string_equal(error->message, "leak: placeholder of api over plain HTTP");
    }
    g_autoptr(VmEgressRequest) request =
        vm_egress_request_parse((const guint8 *)clean, strlen(clean), NULL);
    assert_true(vm_egress_credentials_check_plain(creds, request, NULL));
    assert_true(vm_egress_credentials_check_plain(NULL, request, NULL));
}

/* A body with a placeholder at every offset, fed in pieces of every size: always found, and a
 * body without one never is. */
static void
test_body_scanner(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = make_creds();
    g_autoptr(GString) body = g_string_new(NULL);

    for (int i = 0; i < 300; i++)
        g_string_append_c(body, "abcdefghij{}\":,"[i % 15]);
    for (gsize at = 0; at <= body->len; at += 7) {
        g_autoptr(GString) leaking = g_string_new_len(body->str, body->len);

        g_string_insert(leaking, at, PH_KEY);
        for (gsize step = 1; step <= leaking->len; step = step < 8 ? step + 1 : step * 3) {
            g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);
            g_autoptr(GError) error = NULL;
            gboolean ok = TRUE;

            for (gsize off = 0; off < leaking->len && ok; off += step)
                ok = vm_egress_leak_scanner_feed(scanner, (const guint8 *)leaking->str + off,
                                                 MIN(step, leaking->len - off), &error);
            if (ok)
                fail_msg("placeholder at %zu, pieces of %zu: not found", at, step);
            assert_string_equal(error->message, "leak: placeholder of key in body");
            /* it keeps failing */
            g_clear_error(&error);
            assert_false(vm_egress_leak_scanner_feed(scanner, (const guint8 *)"x", 1, &error));
        }
    }
    for (gsize step = 1; step <= body->len; step *= 2) {
        g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);

        for (gsize off = 0; off < body->len; off += step)
            assert_true(vm_egress_leak_scanner_feed(scanner, (const guint8 *)body->str + off,
                                                    MIN(step, body->len - off), NULL));
    }
    /* an unknown placeholder is no leak; no grants, nothing to find */
    g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);
    assert_true(vm_egress_leak_scanner_feed(scanner, (const guint8 *)PH_GONE, 45, NULL));
    g_autoptr(VmEgressLeakScanner) none = vm_egress_leak_scanner_new(NULL);
    assert_true(vm_egress_leak_scanner_feed(none, (const guint8 *)PH_API, 45, NULL));
}

/* The origin parser: the CONNECT host only, origin form only. */
static void
test_origin_parser(void **state)
{
    (void)state;
    const char *refused[] = {
        "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.example.com:444\r\n\r\n",
        "GET https://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
        "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 1\r\n"
        "Transfer-Encoding: chunked\r\n\r\n",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(refused); i++) {
        g_autoptr(VmEgressParser) parser = vm_egress_parser_new_origin("api.example.com", 443);
        g_autoptr(GError) error = NULL;

        assert_int_equal(vm_egress_parser_feed(parser, (const guint8 *)refused[i],
                                               strlen(refused[i]), NULL, &error),
                         VM_EGRESS_PARSE_ERROR);
    }
    g_autoptr(VmEgressRequest) request =
        parse_origin("api.example.com",
                     "GET /a HTTP/1.1\r\nHost: api.example.com:443\r\nConnection: close\r\n\r\n");
    assert_string_equal(request->scheme, "https");
    assert_true(request->close);
    g_autoptr(GString) head = vm_egress_request_build_origin_head(request);
    assert_string_equal(head->str,
                        "GET /a HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n");
}

/* ---------------------------------------------------------------------------------------------
 * Response redactor */

/* Feeds @text through @redactor, @step bytes at a time, '|' in @text marking framing up to the
 * next '|' (the bars are not fed); returns what came out, checking after each take that no more
 * than @hold_max bytes were held (0: not checked). */
static GString *
redact_through(VmEgressRedactor *redactor, const char *text, gsize step, gsize hold_max)
{
    g_autoptr(GString) bytes = g_string_new(NULL);
    g_autoptr(GByteArray) payload = g_byte_array_new();
    GString *out = g_string_new(NULL);
    gboolean framing = FALSE;
    gsize fed = 0;

    for (const char *p = text; *p != '\0'; p++) {
        guint8 flag;

        if (*p == '|') {
            framing = !framing;
            continue;
        }
        flag = !framing;
        g_string_append_c(bytes, *p);
        g_byte_array_append(payload, &flag, 1);
    }
    for (gsize off = 0; off < bytes->len; off += step) {
        gsize end = MIN(off + step, bytes->len);
        const guint8 *data;
        gsize len;

        for (gsize run = off; run < end;) {
            gsize stop = run;

            while (stop < end && payload->data[stop] == payload->data[run])
                stop++;
            vm_egress_redactor_feed(redactor, (const guint8 *)bytes->str + run, stop - run,
                                    payload->data[run]);
            run = stop;
        }
        fed = end;
        assert_true(vm_egress_redactor_take(redactor, FALSE, &data, &len, NULL));
        g_string_append_len(out, (const char *)data, len);
        if (hold_max > 0)
            assert_true(fed - out->len <= hold_max);
    }
    const guint8 *data;
    gsize len;
    assert_true(vm_egress_redactor_take(redactor, TRUE, &data, &len, NULL));
    g_string_append_len(out, (const char *)data, len);
    assert_int_equal(out->len, bytes->len); /* the same length: framing stays true */
    return out;
}

static VmEgressRedactor *
make_redactor(void)
{
    VmEgressRedactor *redactor = vm_egress_redactor_new();

    vm_egress_redactor_add(redactor, "api", "sk-real-api", PH_API);
    vm_egress_redactor_add(redactor, "key", "real-key", PH_KEY);
    vm_egress_redactor_add(redactor, "api", "sk-real-api", PH_API); /* once */
    assert_int_equal(vm_egress_redactor_size(redactor), 2);
    return redactor;
}

/* A value at every offset of a response, fed in pieces of every size, comes out as the start of
 * its placeholder, same length; reported once; and nothing else changes. */
static void
test_redactor_split(void **state)
{
    (void)state;
    g_autoptr(GString) body = g_string_new(NULL);

    for (int i = 0; i < 120; i++)
        g_string_append_c(body, "abcdefs-k{}\":,r"[i % 15]);
    for (gsize at = 0; at <= body->len; at += 5) {
        g_autoptr(GString) leaking = g_string_new_len(body->str, body->len);
        g_autoptr(GString) expected = g_string_new_len(body->str, body->len);

        g_string_insert(leaking, at, "sk-real-api");
        g_string_insert(expected, at, "vmph_AAAAAA");
        for (gsize step = 1; step <= leaking->len; step = step < 13 ? step + 1 : step * 3) {
            g_autoptr(VmEgressRedactor) redactor = make_redactor();
            g_autoptr(GString) out =
                redact_through(redactor, leaking->str, step, strlen("sk-real-api") - 1);
            g_auto(GStrv) hits = vm_egress_redactor_steal_hits(redactor);

            if (strcmp(out->str, expected->str) != 0)
                fail_msg("value at %zu, pieces of %zu: %s", at, step, out->str);
            assert_non_null(hits);
            assert_string_equal(hits[0], "api");
            assert_null(hits[1]);
            assert_null(vm_egress_redactor_steal_hits(redactor));
        }
    }
    /* a value longer than its placeholder: the placeholder, then '*' */
    g_autoptr(VmEgressRedactor) longer = vm_egress_redactor_new();
    vm_egress_redactor_add(longer, "long", "0123456789", "vmph_X");
    g_autoptr(GString) out = redact_through(longer, "<0123456789>", 4, 9);
    assert_string_equal(out->str, "<vmph_X****>");
}

/* Held back is only the tail that could begin a value: a stream's pieces go on at once unless
 * they end like the start of a secret. */
static void
test_redactor_holds_minimum(void **state)
{
    (void)state;
    g_autoptr(VmEgressRedactor) redactor = make_redactor();
    const guint8 *data;
    gsize len;

    vm_egress_redactor_feed(redactor, (const guint8 *)"data: one\n\n", 11, TRUE);
    assert_true(vm_egress_redactor_take(redactor, FALSE, &data, &len, NULL));
    assert_int_equal(len, 11);
    vm_egress_redactor_feed(redactor, (const guint8 *)"data: sk-re", 11, TRUE);
    assert_true(vm_egress_redactor_take(redactor, FALSE, &data, &len, NULL));
    assert_int_equal(len, 6); /* "data: " */
    assert_memory_equal(data, "data: ", 6);
    vm_egress_redactor_feed(redactor, (const guint8 *)"x\n\n", 3, TRUE);
    assert_true(vm_egress_redactor_take(redactor, FALSE, &data, &len, NULL));
    assert_int_equal(len, 8); /* not a value after all */
    assert_memory_equal(data, "sk-rex\n\n", 8);
    vm_egress_redactor_feed(redactor, (const guint8 *)"real-k", 6, TRUE);
    assert_true(vm_egress_redactor_take(redactor, FALSE, &data, &len, NULL));
    assert_int_equal(len, 0);
    assert_true(vm_egress_redactor_take(redactor, TRUE, &data, &len, NULL));
    assert_int_equal(len, 6); /* the end: nothing can complete it */
    assert_null(vm_egress_redactor_steal_hits(redactor));
}

/* A chunked body: a value split between two chunks is found in the payload and masked where
 * its bytes are, the chunk framing untouched; one inside a trailer is found as sent. */
static void
test_redactor_chunked(void **state)
{
    (void)state;
    const char *text = "|5\r\n|sk-re|\r\n6;x\r\n|al-api|\r\n3\r\n|abc|\r\n0\r\n"
                       "X-T: real-key\r\n\r\n|";
    const char *expected = "5\r\nvmph_\r\n6;x\r\nAAAAAA\r\n3\r\nabc\r\n0\r\n"
                           "X-T: vmph_CCC\r\n\r\n";

    for (gsize step = 1; step <= strlen(text); step++) {
        g_autoptr(VmEgressRedactor) redactor = make_redactor();
        g_autoptr(GString) out = redact_through(redactor, text, step, 0);
        g_auto(GStrv) hits = vm_egress_redactor_steal_hits(redactor);

        if (strcmp(out->str, expected) != 0)
            fail_msg("pieces of %zu: %s", step, out->str);
        assert_int_equal(g_strv_length(hits), 2);
    }
    /* the start of a value in one chunk holds the chunk back, not the framing before it */
    g_autoptr(VmEgressRedactor) redactor = make_redactor();
    const guint8 *data;
    gsize len;
    vm_egress_redactor_feed(redactor, (const guint8 *)"5\r\n", 3, FALSE);
    vm_egress_redactor_feed(redactor, (const guint8 *)"sk-re", 5, TRUE);
    vm_egress_redactor_feed(redactor, (const guint8 *)"\r\n", 2, FALSE);
    assert_true(vm_egress_redactor_take(redactor, FALSE, &data, &len, NULL));
    assert_int_equal(len, 3);
    /* more framing than a redactor holds after that start: refused, not relayed */
    g_autofree char *framing = g_strnfill(VM_EGRESS_REDACTOR_HOLD_MAX, 'f');
    g_autoptr(GError) error = NULL;
    vm_egress_redactor_feed(redactor, (const guint8 *)framing, strlen(framing), FALSE);
    assert_false(vm_egress_redactor_take(redactor, FALSE, &data, &len, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
}

/* Values at many places of a payload cut into chunks of many sizes (some with an extension),
 * fed in pieces of every size: the bytes out are the same chunks of the payload with every
 * value masked. */
static void
test_redactor_chunk_sizes(void **state)
{
    (void)state;
    const char *payload = "sk-real-api, then real-key;real-keysk-real-api--sk-real-ap"
                          "i {\"a\": \"real-key\"} sk-real-api";
    const gsize sizes[] = {1, 3, 7, 2, 5, 11, 4, 13, 6};
    g_autoptr(GString) masked = g_string_new(payload);
    g_autoptr(GString) text = g_string_new(NULL);
    g_autoptr(GString) expected = g_string_new(NULL);

    g_string_replace(masked, "sk-real-api", "vmph_AAAAAA", 0);
    g_string_replace(masked, "real-key", "vmph_CCC", 0);
    for (gsize off = 0, i = 0; off < strlen(payload); i++) {
        gsize n = MIN(sizes[i % G_N_ELEMENTS(sizes)], strlen(payload) - off);
        const char *ext = i % 4 == 1 ? ";ext=sk-real" : "";

        g_string_append_printf(text, "|%zx%s\r\n|%.*s|\r\n|", n, ext, (int)n, payload + off);
        g_string_append_printf(expected, "%zx%s\r\n%.*s\r\n", n, ext, (int)n, masked->str + off);
        off += n;
    }
    g_string_append(text, "|0\r\n\r\n|");
    g_string_append(expected, "0\r\n\r\n");
    for (gsize step = 1; step <= expected->len; step++) {
        g_autoptr(VmEgressRedactor) redactor = make_redactor();
        g_autoptr(GString) out = redact_through(redactor, text->str, step, 0);

        if (strcmp(out->str, expected->str) != 0)
            fail_msg("pieces of %zu: %s", step, out->str);
    }
}

/* What apply() substituted is what the redactor looks for: the value, and for Basic the base64
 * text that went into the header. A refused request adds nothing. */
static void
test_redactor_from_apply(void **state)
{
    (void)state;
    g_autoptr(VmEgressCredentials) creds = make_creds();
    g_autoptr(VmEgressRedactor) redactor = vm_egress_redactor_new();
    g_autofree char *pair = g_base64_encode((const guchar *)"alice:" PH_USER, 51);
    g_autofree char *sent = g_base64_encode((const guchar *)"alice:real-pass", 15);
    g_autofree char *head = g_strdup_printf(
        "GET / HTTP/1.1\r\nHost: registry.test\r\nAuthorization: Basic %s\r\n\r\n", pair);
    g_autofree char *echo =
        g_strdup_printf("{\"auth\": \"Basic %s\", \"pass\": \"real-pass\"}", sent);
    g_autoptr(VmEgressRequest) request = parse_origin("registry.test", head);
    g_autoptr(VmEgressRequest) refused =
        parse_origin("api.example.com", "GET /" PH_API " HTTP/1.1\r\nHost: api.example.com\r\n"
                                        "Authorization: Bearer " PH_API "\r\n\r\n");
    g_autofree char *secret = NULL;
    g_autofree char *none = NULL;
    g_autoptr(GString) out = NULL;

    assert_false(
        vm_egress_credentials_apply(creds, refused, "api.example.com", redactor, &none, NULL));
    assert_int_equal(vm_egress_redactor_size(redactor), 0);
    assert_true(
        vm_egress_credentials_apply(creds, request, "registry.test", redactor, &secret, NULL));
    assert_int_equal(vm_egress_redactor_size(redactor), 2);
    out = redact_through(redactor, echo, 7, 0);
    assert_null(strstr(out->str, sent));
    assert_null(strstr(out->str, "real-pass"));
    assert_non_null(strstr(out->str, "\"pass\": \"vmph_DDDD\""));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_refused),
        cmocka_unit_test(test_intercepts),
        cmocka_unit_test(test_substitution_table),
        cmocka_unit_test(test_several_headers),
        cmocka_unit_test(test_leaks),
        cmocka_unit_test(test_plain_http),
        cmocka_unit_test(test_body_scanner),
        cmocka_unit_test(test_origin_parser),
        cmocka_unit_test(test_redactor_split),
        cmocka_unit_test(test_redactor_holds_minimum),
        cmocka_unit_test(test_redactor_chunked),
        cmocka_unit_test(test_redactor_chunk_sizes),
        cmocka_unit_test(test_redactor_from_apply),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
