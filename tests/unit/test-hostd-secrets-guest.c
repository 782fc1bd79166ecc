/* The guest's /etc/environment block of grants (hostd-secrets-guest.c): placeholders and the CA
 * variables written in hostd's block, the user's own lines kept, a revoke removing its line, the
 * last revoke removing the block. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>

#include "hostd-secrets-guest.h"
#include "test-common.h"

static void
test_block_written_replaced_removed(void **state)
{
    (void)state;
    const char *user = "PATH=/usr/local/bin:/usr/bin\nLANG=C.UTF-8\n";
    g_autoptr(GHashTable) grants = g_hash_table_new(g_str_hash, g_str_equal);
    g_hash_table_insert(grants, (char *)"EXAMPLE_API_KEY",
                        (char *)"vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    g_hash_table_insert(grants, (char *)"B_KEY",
                        (char *)"vmph_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB");

    g_autofree char *two = hostd_secrets_guest_environment(user, grants);
    assert_string_equal(two,
                        "PATH=/usr/local/bin:/usr/bin\nLANG=C.UTF-8\n"
                        "# BEGIN vmctl secrets (managed by hostd; edits here are replaced)\n"
                        "B_KEY=vmph_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB\n"
                        "EXAMPLE_API_KEY=vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n"
                        "NODE_EXTRA_CA_CERTS=/usr/local/share/ca-certificates/vmctl-egress.crt\n"
                        "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt\n"
                        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\n"
                        "# END vmctl secrets\n");

    /* A revoke: the block is rewritten in place, once, and the user's lines stay. */
    g_hash_table_remove(grants, "B_KEY");
    g_autofree char *one = hostd_secrets_guest_environment(two, grants);
    assert_null(strstr(one, "B_KEY"));
    assert_non_null(strstr(one, "EXAMPLE_API_KEY=vmph_AAAA"));
    assert_true(g_str_has_prefix(one, user));
    assert_null(strstr(strstr(one, "# BEGIN") + 1, "# BEGIN"));

    /* The last revoke: back to exactly what the user had. */
    g_hash_table_remove_all(grants);
    g_autofree char *none = hostd_secrets_guest_environment(one, grants);
    assert_string_equal(none, user);
    g_autofree char *from_nothing = hostd_secrets_guest_environment(NULL, NULL);
    assert_string_equal(from_nothing, "");
}

/* Runs HOSTD_SECRETS_GUEST_ENVIRONMENT_SET_SCRIPT with sh on @path and @block; asserts it
 * succeeded and that @path is then mode 0644 and holds what hostd_secrets_guest_environment()
 * makes of @before (the file's contents, NULL: none) and @grants. */
static void
assert_set_script_agrees(const char *path, const char *before, GHashTable *grants)
{
    g_autofree char *block = hostd_secrets_guest_environment(NULL, grants);
    g_autofree char *expected = hostd_secrets_guest_environment(before, grants);
    g_autofree char *contents = NULL;
    g_autoptr(GError) error = NULL;
    const char *argv[] = {"sh",  "-c", HOSTD_SECRETS_GUEST_ENVIRONMENT_SET_SCRIPT, "sh", path,
                          block, NULL};
    int status = -1;
    struct stat st;

    if (before != NULL)
        vm_test_write_file(path, before);
    else
        (void)g_unlink(path);
    assert_true(g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, NULL, NULL,
                             &status, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(status, 0);
    assert_true(g_file_get_contents(path, &contents, NULL, NULL));
    assert_string_equal(contents, expected);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0644);
}

/* The script a warm agent's identity writes the block with makes what hostd's own transform does
 * (so its agent_up finds nothing to change): the user's lines kept, an older block replaced
 * wherever it stood, a last line without its newline ended, no file made one. */
static void
test_set_script_agrees(void **state)
{
    (void)state;
    g_autofree char *dir = vm_test_make_tmpdir("test-secrets-env-XXXXXX");
    g_autofree char *path = g_build_filename(dir, "environment", NULL);
    g_autoptr(GHashTable) old = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GHashTable) grants = g_hash_table_new(g_str_hash, g_str_equal);
    g_hash_table_insert(old, (char *)"OLD_KEY",
                        (char *)"vmph_OOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOO");
    g_hash_table_insert(grants, (char *)"EXAMPLE_API_KEY",
                        (char *)"vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    g_hash_table_insert(grants, (char *)"B_KEY",
                        (char *)"vmph_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB");
    g_autofree char *with_old = hostd_secrets_guest_environment("A=1\n", old);
    g_autofree char *old_in_middle = g_strconcat(with_old, "Z='a \\ $b *'\n\n", NULL);

    assert_set_script_agrees(path, NULL, grants);
    assert_set_script_agrees(path, "", grants);
    assert_set_script_agrees(path, "PATH=/usr/bin:/bin\nLANG=C.UTF-8\n", grants);
    assert_set_script_agrees(path, "PATH=/usr/bin\n  indented\tand tab\nno newline", grants);
    assert_set_script_agrees(path, old_in_middle, grants);
    /* A block the user left open runs to the end, as hostd reads it. */
    assert_set_script_agrees(path,
                             "A=1\n# BEGIN vmctl secrets (managed by hostd; edits here are "
                             "replaced)\nX=2\n",
                             grants);
    vm_test_remove_tree(dir);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_written_replaced_removed),
        cmocka_unit_test(test_set_script_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
