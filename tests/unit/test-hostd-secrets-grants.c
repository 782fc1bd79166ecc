/* The credential broker's grants (hostd-secrets-grants.c): a grant gets a fresh placeholder,
 * kept in a 0600 file outside any agent's directory; revoke, agent removal, the holders of a
 * secret, a fork's copy under new placeholders, and the credential set a proxy is given. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-secrets-check.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets-store.h"
#include "vm-error.h"
#include "test-common.h"

static void
store_secret(const char *dir, const char *name, const char *value)
{
    char *hosts[] = {(char *)"api.example.com", NULL};
    HostdSecret secret = {
        .name = (char *)name,
        .value = (char *)value,
        .hosts = hosts,
        .header = (char *)"Authorization",
        .format = (char *)"Bearer {}",
        .env = (char *)"KEY",
    };
    g_autoptr(GError) error = NULL;
    assert_true(hostd_secrets_store_prepare(dir, &error));
    assert_true(hostd_secrets_store_save(dir, &secret, TRUE, &error));
    vm_test_assert_no_error(error);
}

static void
test_grant_revoke_holders(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *grants = g_build_filename(tmp->dir, "secrets", "grants", NULL);
    g_autoptr(GError) error = NULL;

    g_autofree char *p1 = hostd_grants_add(grants, "a1", "key-one", &error);
    vm_test_assert_no_error(error);
    assert_true(hostd_secret_placeholder_is_valid(p1));
    g_autofree char *path = g_build_filename(grants, "a1", NULL);
    assert_int_equal(vm_test_file_mode(path), 0600);
    assert_int_equal(vm_test_file_mode(grants), 0700);

    /* The same secret for another agent: another placeholder. */
    g_autofree char *p2 = hostd_grants_add(grants, "a2", "key-one", &error);
    vm_test_assert_no_error(error);
    assert_string_not_equal(p1, p2);

    /* Granted twice: refused, the first placeholder kept. */
    g_autofree char *again = hostd_grants_add(grants, "a1", "key-one", &error);
    assert_null(again);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_EXISTS, "already holds");
    g_clear_error(&error);
    g_autoptr(GHashTable) a1 = hostd_grants_load(grants, "a1", &error);
    assert_string_equal(g_hash_table_lookup(a1, "key-one"), p1);

    g_auto(GStrv) holders = hostd_grants_holders(grants, "key-one", &error);
    vm_test_assert_no_error(error);
    assert_int_equal(g_strv_length(holders), 2);
    assert_string_equal(holders[0], "a1");
    assert_string_equal(holders[1], "a2");

    assert_true(hostd_grants_revoke(grants, "a1", "key-one", &error));
    assert_false(hostd_grants_revoke(grants, "a1", "key-one", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "does not hold");
    g_clear_error(&error);
    /* The last grant gone, so is the file. */
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));

    assert_true(hostd_grants_remove_agent(grants, "a2", &error));
    assert_true(hostd_grants_remove_agent(grants, "a2", &error));
    g_auto(GStrv) none = hostd_grants_holders(grants, "key-one", &error);
    assert_int_equal(g_strv_length(none), 0);

    /* An agent name that is a path is refused before any file is touched. */
    g_autofree char *escape = hostd_grants_add(grants, "../x", "key-one", &error);
    assert_null(escape);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
    g_clear_error(&error);
    assert_false(hostd_grants_remove_agent(grants, "../secrets", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
}

static void
test_fork_copy_gets_new_placeholders(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *grants = g_build_filename(tmp->dir, "grants", NULL);
    g_autoptr(GError) error = NULL;
    g_autofree char *pa = hostd_grants_add(grants, "src", "key-a", &error);
    g_autofree char *pb = hostd_grants_add(grants, "src", "key-b", &error);
    vm_test_assert_no_error(error);

    assert_true(hostd_grants_copy_fresh(grants, "src", "dst", &error));
    vm_test_assert_no_error(error);
    g_autoptr(GHashTable) dst = hostd_grants_load(grants, "dst", &error);
    assert_int_equal(g_hash_table_size(dst), 2);
    const char *da = g_hash_table_lookup(dst, "key-a");
    const char *db = g_hash_table_lookup(dst, "key-b");
    assert_true(hostd_secret_placeholder_is_valid(da));
    assert_true(hostd_secret_placeholder_is_valid(db));
    assert_string_not_equal(da, pa);
    assert_string_not_equal(db, pb);

    /* A fork without --grants simply gets no file: no grants. */
    g_autoptr(GHashTable) other = hostd_grants_load(grants, "other", &error);
    vm_test_assert_no_error(error);
    assert_int_equal(g_hash_table_size(other), 0);
}

static void
test_credentials_from_grants(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *secrets = g_build_filename(tmp->dir, "secrets", NULL);
    g_autofree char *grants = g_build_filename(secrets, "grants", NULL);
    g_autoptr(GError) error = NULL;
    store_secret(secrets, "key-a", "sk-a");
    store_secret(secrets, "key-b", "sk-b");
    g_autofree char *pa = hostd_grants_add(grants, "a1", "key-a", &error);
    g_autofree char *pb = hostd_grants_add(grants, "a1", "key-b", &error);
    vm_test_assert_no_error(error);

    g_autoptr(VmEgressCredentials) creds = hostd_grants_credentials(secrets, grants, "a1", &error);
    vm_test_assert_no_error(error);
    assert_int_equal(vm_egress_credentials_size(creds), 2);
    g_autoptr(VmEgressCredentials) empty = hostd_grants_credentials(secrets, grants, "a2", &error);
    vm_test_assert_no_error(error);
    assert_int_equal(vm_egress_credentials_size(empty), 0);

    /* The secret list skips the grants directory. */
    g_auto(GStrv) names = hostd_secrets_store_list(secrets, &error);
    assert_int_equal(g_strv_length(names), 2);

    /* A grant whose secret is gone is an error, not a silently smaller set. */
    assert_true(hostd_secrets_store_remove(secrets, "key-b", &error));
    g_autoptr(VmEgressCredentials) broken = hostd_grants_credentials(secrets, grants, "a1", &error);
    assert_null(broken);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "no secret 'key-b'");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_grant_revoke_holders, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_fork_copy_gets_new_placeholders, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_credentials_from_grants, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
