/* The guest's /etc/environment block of grants (hostd-secrets-guest.c): placeholders and the CA
 * variables written in hostd's block, the user's own lines kept, a revoke removing its line, the
 * last revoke removing the block. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

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

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_written_replaced_removed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
