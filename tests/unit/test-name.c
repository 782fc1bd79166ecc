/* Agent names end up as file names, libvirt domain names and hostnames: only [a-z][a-z0-9-]{0,62}
 * not ending in '-' may pass. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "vm-name.h"

#include <string.h>

static const char *const valid_names[] = {
    "a",
    "agent",
    "agent-1",
    "a1",
    "a--b",
    "x0123456789",
    "abcdefghijklmnopqrstuvwxyz",
    /* 63 characters, the limit */
    "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk",
};

static const char *const invalid_names[] = {
    "",
    "A",
    "Agent",
    "aB",
    "a b",
    " a",
    "a ",
    "-a",
    "1a",
    "0",
    "a_b",
    "a.b",
    "..",
    ".",
    "../x",
    "a/b",
    "/a",
    "é",
    "aé",
    "a\xff",
    "\xc3\x28",
    "a\tb",
    "a\nb",
    "a:b",
    "a-",
    "agent-",
    "a@b",
    /* 64 characters, one over */
    "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl",
};

static void
test_valid(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(valid_names); i++) {
        g_autoptr(GError) error = NULL;

        if (!vm_name_validate(valid_names[i], &error))
            fail_msg("'%s' refused: %s", valid_names[i], error->message);
        assert_null(error);
    }
    assert_int_equal(strlen(valid_names[G_N_ELEMENTS(valid_names) - 1]), VM_NAME_MAX);
}

static void
test_invalid(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(invalid_names); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *shown = g_strescape(invalid_names[i], NULL);

        if (vm_name_validate(invalid_names[i], &error))
            fail_msg("'%s' accepted", shown);
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT))
            fail_msg("'%s': wrong error", shown);
        /* The message is printed as is by vmctl: it must be safe text. */
        assert_true(g_utf8_validate(error->message, -1, NULL));
        for (const char *p = error->message; *p != '\0'; p++)
            assert_true(g_ascii_isprint(*p));
    }
    assert_int_equal(strlen(invalid_names[G_N_ELEMENTS(invalid_names) - 1]), VM_NAME_MAX + 1);
}

static void
test_null(void **state)
{
    g_autoptr(GError) error = NULL;

    assert_false(vm_name_validate(NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    /* Callers that only want the answer may pass no error. */
    assert_false(vm_name_validate("../x", NULL));
    assert_true(vm_name_validate("ok", NULL));
}

/* The message quotes the offending name so the user sees what was refused. */
static void
test_message_quotes_name(void **state)
{
    g_autoptr(GError) error = NULL;

    assert_false(vm_name_validate("bad_name", &error));
    assert_non_null(strstr(error->message, "'bad_name'"));
    g_clear_error(&error);

    assert_false(vm_name_validate("a\xff", &error));
    assert_non_null(strstr(error->message, "a\\377"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_null),
        cmocka_unit_test(test_message_quotes_name),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
