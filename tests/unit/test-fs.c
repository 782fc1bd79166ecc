/* vm_remove_tree(): a whole tree goes, a missing one is success, and links are removed, never
 * followed out of the tree. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "vm-error.h"
#include "vm-fs.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

static void
test_remove_tree(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *top = g_build_filename(f->dir, "top", NULL);
    g_autofree char *deep = g_build_filename(top, "a", "b", "c", NULL);
    g_autofree char *empty = g_build_filename(top, "empty", NULL);
    g_autofree char *file1 = g_build_filename(top, "file", NULL);
    g_autofree char *file2 = g_build_filename(deep, ".hidden", NULL);
    g_autofree char *readonly = g_build_filename(top, "a", "ro", NULL);
    g_autofree char *dangling = g_build_filename(top, "a", "dangling", NULL);

    assert_int_equal(g_mkdir_with_parents(deep, 0700), 0);
    assert_int_equal(g_mkdir_with_parents(empty, 0700), 0);
    vm_test_write_file(file1, "1");
    vm_test_write_file(file2, "2");
    vm_test_write_file(readonly, "3");
    assert_int_equal(chmod(readonly, 0400), 0);
    assert_int_equal(symlink("/nonexistent/target", dangling), 0);

    if (!vm_remove_tree(top, &error))
        fail_msg("remove failed: %s", error->message);
    assert_false(g_file_test(top, G_FILE_TEST_EXISTS));
    g_autofree char *listing = vm_test_dir_listing(f->dir, TRUE);
    assert_string_equal(listing, "");

    /* Missing is success, twice over. */
    assert_true(vm_remove_tree(top, &error));
    g_autofree char *deeper = g_build_filename(f->dir, "no", "such", "dir", NULL);
    assert_true(vm_remove_tree(deeper, &error));
    assert_null(error);
}

/* Links are removed, never followed: an agent directory or a guest-made tree that is, or holds, a
 * link to data elsewhere must not take that data with it. */
static void
test_remove_tree_links(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *outside = g_build_filename(f->dir, "outside", NULL);
    g_autofree char *precious = g_build_filename(outside, "precious", NULL);
    g_autofree char *top = g_build_filename(f->dir, "top", NULL);
    g_autofree char *inner_link = g_build_filename(top, "link", NULL);
    g_autofree char *nested = g_build_filename(top, "x", "y", NULL);
    g_autofree char *nested_dir_link = g_build_filename(nested, "dir-link", NULL);
    g_autofree char *nested_file_link = g_build_filename(nested, "file-link", NULL);
    g_autofree char *top_link = g_build_filename(f->dir, "top-link", NULL);

    assert_int_equal(g_mkdir_with_parents(outside, 0700), 0);
    assert_int_equal(g_mkdir_with_parents(nested, 0700), 0);
    vm_test_write_file(precious, "keep me");
    assert_int_equal(symlink(outside, inner_link), 0);
    assert_int_equal(symlink(outside, nested_dir_link), 0);
    assert_int_equal(symlink(precious, nested_file_link), 0);
    assert_int_equal(symlink(outside, top_link), 0);

    assert_true(vm_remove_tree(top, &error));
    assert_false(g_file_test(top, G_FILE_TEST_EXISTS));
    assert_true(g_file_test(precious, G_FILE_TEST_IS_REGULAR));
    g_autofree char *kept = vm_test_read_file(precious);
    assert_string_equal(kept, "keep me");

    assert_true(vm_remove_tree(top_link, &error));
    assert_false(g_file_test(top_link, G_FILE_TEST_IS_SYMLINK));
    assert_true(g_file_test(precious, G_FILE_TEST_IS_REGULAR));
    assert_null(error);

    /* A single file is removed like a tree of one. */
    assert_true(vm_remove_tree(precious, &error));
    assert_false(g_file_test(precious, G_FILE_TEST_EXISTS));
}

/* What cannot be removed is named, and what could be is gone. */
static void
test_remove_tree_fails(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *top = g_build_filename(f->dir, "top", NULL);
    g_autofree char *locked = g_build_filename(top, "locked", NULL);
    g_autofree char *stuck = g_build_filename(locked, "stuck", NULL);

    /* root may write into a directory whatever its mode: nothing to check there (cmocka's skip()
     * reads as a failure in meson's TAP). */
    if (geteuid() == 0)
        return;
    assert_int_equal(g_mkdir_with_parents(locked, 0700), 0);
    vm_test_write_file(stuck, "x");
    assert_int_equal(chmod(locked, 0500), 0);

    assert_false(vm_remove_tree(top, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    assert_non_null(strstr(error->message, stuck));
    assert_true(g_file_test(stuck, G_FILE_TEST_EXISTS));
    assert_int_equal(chmod(locked, 0700), 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_remove_tree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_tree_links, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_tree_fails, setup, teardown),
    };

    return cmocka_run_group_tests_name("fs", tests, NULL, NULL);
}
