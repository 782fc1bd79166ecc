/* The error domain: codes map to distinct vmctl exit statuses and stable names, and foreign
 * errors fold into VM_ERROR_FAILED. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"

#include <errno.h>
#include <string.h>

static void
test_exit_statuses_distinct(void **state)
{
    g_autoptr(GHashTable) seen = g_hash_table_new(g_direct_hash, g_direct_equal);

    for (int code = VM_ERROR_FAILED; code <= VM_ERROR_LAST; code++) {
        int status = vm_error_exit_status(code);

        /* 0 is success; 126 and up belong to the shell and to signals. */
        assert_in_range(status, 1, 125);
        if (!g_hash_table_add(seen, GINT_TO_POINTER(status)))
            fail_msg("code %d shares exit status %d", code, status);
    }
    assert_int_equal(vm_error_exit_status(VM_ERROR_FAILED), 1);
    assert_int_equal(vm_error_exit_status(VM_ERROR_INVALID_ARGUMENT), 2);
    /* Unknown codes (from a newer hostd) still fail. */
    assert_int_equal(vm_error_exit_status(0), 1);
    assert_int_equal(vm_error_exit_status(VM_ERROR_LAST + 1), 1);
}

static void
test_names(void **state)
{
    static const struct {
        VmErrorCode code;
        const char *name;
    } pinned[] = {
        {VM_ERROR_FAILED, "failed"},       {VM_ERROR_INVALID_ARGUMENT, "invalid-argument"},
        {VM_ERROR_NOT_FOUND, "not-found"}, {VM_ERROR_EXISTS, "exists"},
        {VM_ERROR_PROTOCOL, "protocol"},   {VM_ERROR_NOT_RUNNING, "not-running"},
        {VM_ERROR_BUSY, "busy"},           {VM_ERROR_PERMISSION, "permission"},
    };
    g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

    for (int code = VM_ERROR_FAILED; code <= VM_ERROR_LAST; code++) {
        const char *name = vm_error_code_name(code);

        assert_non_null(name);
        assert_true(name[0] != '\0');
        for (const char *p = name; *p != '\0'; p++)
            assert_true(g_ascii_islower(*p) || *p == '-');
        if (!g_hash_table_add(seen, (gpointer)name))
            fail_msg("code %d shares name '%s'", code, name);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(pinned); i++)
        assert_string_equal(vm_error_code_name(pinned[i].code), pinned[i].name);
    assert_string_equal(vm_error_code_name(0), "failed");
    assert_string_equal(vm_error_code_name(VM_ERROR_LAST + 1), "failed");
}

/* Codes travel over the socket: pin the numbers. */
static void
test_code_numbers(void **state)
{
    assert_int_equal(VM_ERROR_FAILED, 1);
    assert_int_equal(VM_ERROR_PROTOCOL, 11);
    assert_int_equal(VM_ERROR_BUSY, 16);
    assert_int_equal(VM_ERROR_PERMISSION, 17);
    assert_int_equal(VM_ERROR_LAST, VM_ERROR_PERMISSION);
}

static void
test_code_mapping(void **state)
{
    g_autoptr(GError) vm = g_error_new_literal(VM_ERROR, VM_ERROR_NOT_FOUND, "x");
    g_autoptr(GError) file = g_error_new_literal(G_FILE_ERROR, G_FILE_ERROR_NOENT, "x");
    g_autoptr(GError) foreign_same_number =
        g_error_new_literal(G_IO_CHANNEL_ERROR, VM_ERROR_NOT_FOUND, "x");
    g_autoptr(GError) out_of_range = g_error_new_literal(VM_ERROR, 1000, "x");
    g_autoptr(GError) zero = g_error_new_literal(VM_ERROR, 0, "x");

    assert_int_equal(vm_error_code(vm), VM_ERROR_NOT_FOUND);
    assert_int_equal(vm_error_code(file), VM_ERROR_FAILED);
    assert_int_equal(vm_error_code(foreign_same_number), VM_ERROR_FAILED);
    assert_int_equal(vm_error_code(out_of_range), VM_ERROR_FAILED);
    assert_int_equal(vm_error_code(zero), VM_ERROR_FAILED);
    assert_int_equal(vm_error_code(NULL), VM_ERROR_FAILED);
}

static void
test_throw(void **state)
{
    g_autoptr(GError) error = NULL;

    assert_false(vm_throw(&error, VM_ERROR_EXISTS, "agent '%s' exists", "alice"));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_EXISTS));
    assert_string_equal(error->message, "agent 'alice' exists");
    /* A caller that does not want the error may pass NULL. */
    assert_false(vm_throw(NULL, VM_ERROR_EXISTS, "ignored"));
    /* A message that looks like a format is taken literally once formatted. */
    g_clear_error(&error);
    assert_false(vm_throw(&error, VM_ERROR_FAILED, "%s", "100%d"));
    assert_string_equal(error->message, "100%d");
}

static void
test_throw_errno(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *expected = g_strdup_printf("cannot open 'x': %s", g_strerror(ENOENT));

    assert_false(vm_throw_errno(&error, ENOENT, "cannot open '%s'", "x"));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    assert_string_equal(error->message, expected);
    assert_false(vm_throw_errno(NULL, EIO, "ignored"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_statuses_distinct),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_code_numbers),
        cmocka_unit_test(test_code_mapping),
        cmocka_unit_test(test_throw),
        cmocka_unit_test(test_throw_errno),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
