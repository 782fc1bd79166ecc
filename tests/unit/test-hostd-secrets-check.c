/* The credential broker's input checks (hostd-secrets-check.c): placeholders' shape and
 * uniqueness, and the names, headers, formats, env vars, hosts and values refused before
 * anything is stored, each with VM_ERROR_INVALID_ARGUMENT and a message that names the field. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-secrets-check.h"
#include "vm-error.h"
#include "test-common.h"

static void
test_placeholder_shape_and_uniqueness(void **state)
{
    (void)state;
    g_autoptr(GHashTable) seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    gboolean used[128] = {FALSE};
    for (int i = 0; i < 2000; i++) {
        g_autoptr(GError) error = NULL;
        char *placeholder = hostd_secret_placeholder_new(&error);
        vm_test_assert_no_error(error);
        assert_non_null(placeholder);
        assert_int_equal(strlen(placeholder), 45);
        assert_true(g_str_has_prefix(placeholder, "vmph_"));
        assert_true(hostd_secret_placeholder_is_valid(placeholder));
        for (const char *p = placeholder + 5; *p != '\0'; p++)
            used[(guchar)*p] = TRUE;
        /* 2000 draws of 238 bits: a repeat means the generator is broken. */
        assert_true(g_hash_table_add(seen, placeholder));
    }
    /* 80000 characters: every one of the 62 appears, so the whole alphabet is drawn from. */
    int distinct = 0;
    for (int c = 0; c < 128; c++)
        distinct += used[c];
    assert_int_equal(distinct, 62);
}

static void
test_placeholder_is_valid(void **state)
{
    (void)state;
    assert_true(hostd_secret_placeholder_is_valid("vmph_0123456789abcdefghijABCDEFGHIJ0123456789"));
    assert_false(hostd_secret_placeholder_is_valid(NULL));
    assert_false(hostd_secret_placeholder_is_valid("vmph_0123456789abcdefghijABCDEFGHIJ012345678"));
    assert_false(
        hostd_secret_placeholder_is_valid("vmph_0123456789abcdefghijABCDEFGHIJ01234567890"));
    assert_false(
        hostd_secret_placeholder_is_valid("vmpx_0123456789abcdefghijABCDEFGHIJ0123456789"));
    assert_false(
        hostd_secret_placeholder_is_valid("vmph_0123456789abcdefghij-BCDEFGHIJ0123456789"));
}

static void
test_good_input(void **state)
{
    (void)state;
    g_autoptr(GError) error = NULL;
    assert_true(hostd_secret_check_name("example-api", &error));
    assert_true(hostd_secret_check_name("0key", &error));
    assert_true(hostd_secret_check_header("Authorization", &error));
    assert_true(hostd_secret_check_header("x-api-key", &error));
    assert_true(hostd_secret_check_header("Authorization, x-api-key", &error));
    assert_true(hostd_secret_check_header("a, b, c, d, e, f, g, h", &error));
    {
        const char *const given[] = {" Authorization ,x-api-key", "X-Other", NULL};
        g_autofree char *normal = hostd_secret_normalise_headers(given, &error);
        assert_string_equal(normal, "Authorization, x-api-key, X-Other");
    }
    assert_true(hostd_secret_check_format("Bearer {}", &error));
    assert_true(hostd_secret_check_format("{}", &error));
    assert_true(hostd_secret_check_env("EXAMPLE_API_KEY", &error));
    assert_true(hostd_secret_check_env("_x1", &error));
    assert_true(hostd_secret_check_value("sk-123", 6, &error));
    vm_test_assert_no_error(error);

    g_autofree char *env = hostd_secret_default_env("example-api-key");
    assert_string_equal(env, "EXAMPLE_API_KEY");

    g_autofree char *exact = hostd_secret_normalise_host("API.Example.COM.", &error);
    vm_test_assert_no_error(error);
    assert_string_equal(exact, "api.example.com");
    g_autofree char *wildcard = hostd_secret_normalise_host("*.Example.com", &error);
    vm_test_assert_no_error(error);
    assert_string_equal(wildcard, "*.example.com");
}

static void
test_bad_input(void **state)
{
    (void)state;
    static const struct {
        const char *field, *text, *needle;
    } bad[] = {
        {"name", "", "invalid secret name"},
        {"name", "-x", "invalid secret name"},
        {"name", "Upper", "invalid secret name"},
        {"name", "a/b", "invalid secret name"},
        {"name", "a_b", "invalid secret name"},
        {"name", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         "invalid secret name"},
        {"header", "", "invalid header name"},
        {"header", "Author ization", "invalid header name"},
        {"header", "X:Y", "invalid header name"},
        {"header", "X\r\nInjected", "invalid header name"},
        {"header", "x-api-key, X-API-KEY", "named twice"},
        {"header", "Authorization,, x-api-key", "invalid header name ''"},
        {"header", "Authorization, ", "invalid header name ''"},
        {"header", "a, b, c, d, e, f, g, h, i", "1-8 names"},
        {"format", "Bearer", "exactly once"},
        {"format", "{}{}", "exactly once"},
        {"format", "Bearer {}\r\nX: y", "one line"},
        {"env", "", "invalid env var"},
        {"env", "1A", "invalid env var"},
        {"env", "A-B", "invalid env var"},
        {"env", "A=B", "invalid env var"},
        {"host", "", "invalid host"},
        {"host", "*", "invalid host"},
        {"host", "a.*.com", "invalid host"},
        {"host", "**.com", "invalid host"},
        {"host", "bad_host.com", "invalid host"},
        {"host", "127.1", "invalid host"},
        {"value", "", "empty secret value"},
        {"value", "a\nb", "NUL, CR or LF"},
        {"value", "a\rb", "NUL, CR or LF"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        gboolean ok = TRUE;
        if (g_str_equal(bad[i].field, "name"))
            ok = hostd_secret_check_name(bad[i].text, &error);
        else if (g_str_equal(bad[i].field, "header"))
            ok = hostd_secret_check_header(bad[i].text, &error);
        else if (g_str_equal(bad[i].field, "format"))
            ok = hostd_secret_check_format(bad[i].text, &error);
        else if (g_str_equal(bad[i].field, "env"))
            ok = hostd_secret_check_env(bad[i].text, &error);
        else if (g_str_equal(bad[i].field, "value"))
            ok = hostd_secret_check_value(bad[i].text, strlen(bad[i].text), &error);
        else {
            g_autofree char *host = hostd_secret_normalise_host(bad[i].text, &error);
            ok = host != NULL;
        }
        if (ok)
            fail_msg("%s '%s' was accepted", bad[i].field, bad[i].text);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, bad[i].needle);
    }
}

static void
test_value_errors_never_echo_value(void **state)
{
    (void)state;
    g_autoptr(GError) error = NULL;
    const char value[] = "sk-secret\nvalue";
    assert_false(hostd_secret_check_value(value, strlen(value), &error));
    assert_null(strstr(error->message, "sk-secret"));
    g_clear_error(&error);

    g_autofree char *big = g_strnfill(8193, 'k');
    assert_false(hostd_secret_check_value(big, strlen(big), &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "over 8192 bytes");
    assert_null(strstr(error->message, "kkkk"));
    g_clear_error(&error);

    const char with_nul[] = {'a', '\0', 'b'};
    assert_false(hostd_secret_check_value(with_nul, sizeof with_nul, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "NUL");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placeholder_shape_and_uniqueness),
        cmocka_unit_test(test_placeholder_is_valid),
        cmocka_unit_test(test_good_input),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_value_errors_never_echo_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
