/* The per-agent CA: a self-signed ECDSA CA certificate a TLS client can trust (CA, path length 0,
 * certSign, ten years, the agent in its subject) and its key; names a subject cannot hold plainly
 * are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-egress-ca.h"
#include "vm-egress-mint.h"
#include "vm-error.h"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <string.h>
#include <time.h>

static void
test_ca_generated(void **state)
{
    (void)state;
    g_autoptr(GError) error = NULL;
    g_autofree char *cert_pem = NULL;
    g_autofree char *key_pem = NULL;

    assert_true(vm_egress_ca_generate("alpha-1", &cert_pem, &key_pem, &error));
    assert_null(error);
    assert_non_null(strstr(cert_pem, "BEGIN CERTIFICATE"));
    assert_non_null(strstr(key_pem, "PRIVATE KEY"));

    gnutls_x509_crt_t crt;
    gnutls_datum_t datum = {(unsigned char *)cert_pem, (unsigned)strlen(cert_pem)};
    assert_int_equal(gnutls_x509_crt_init(&crt), 0);
    assert_int_equal(gnutls_x509_crt_import(crt, &datum, GNUTLS_X509_FMT_PEM), 0);

    char dn[256];
    size_t dn_size = sizeof dn;
    assert_int_equal(gnutls_x509_crt_get_dn(crt, dn, &dn_size), 0);
    assert_string_equal(dn, "CN=vmctl egress CA for alpha-1");

    unsigned int critical = 0;
    unsigned int ca = 0;
    int pathlen = -1;
    assert_int_equal(gnutls_x509_crt_get_basic_constraints(crt, &critical, &ca, &pathlen), 1);
    assert_true(ca != 0);
    assert_int_equal(pathlen, 0);

    unsigned int usage = 0;
    assert_true(gnutls_x509_crt_get_key_usage(crt, &usage, &critical) >= 0);
    assert_true(usage & GNUTLS_KEY_KEY_CERT_SIGN);
    assert_int_equal(gnutls_x509_crt_get_pk_algorithm(crt, NULL), GNUTLS_PK_ECDSA);

    time_t now = time(NULL);
    assert_true(gnutls_x509_crt_get_activation_time(crt) <= now);
    assert_true(gnutls_x509_crt_get_expiration_time(crt) > now + (time_t)9 * 365 * 24 * 3600);

    /* Self-signed: it verifies against itself as the one trusted CA. */
    unsigned int verify = 1;
    assert_int_equal(gnutls_x509_crt_verify(crt, &crt, 1, 0, &verify), 0);
    assert_int_equal(verify, 0);

    /* The key is the certificate's. */
    gnutls_x509_privkey_t key;
    gnutls_datum_t key_datum = {(unsigned char *)key_pem, (unsigned)strlen(key_pem)};
    assert_int_equal(gnutls_x509_privkey_init(&key), 0);
    assert_int_equal(gnutls_x509_privkey_import(key, &key_datum, GNUTLS_X509_FMT_PEM), 0);
    unsigned char crt_id[64], key_id[64];
    size_t crt_id_size = sizeof crt_id, key_id_size = sizeof key_id;
    assert_int_equal(gnutls_x509_crt_get_key_id(crt, 0, crt_id, &crt_id_size), 0);
    assert_int_equal(gnutls_x509_privkey_get_key_id(key, 0, key_id, &key_id_size), 0);
    assert_int_equal(crt_id_size, key_id_size);
    assert_memory_equal(crt_id, key_id, crt_id_size);

    gnutls_x509_privkey_deinit(key);
    gnutls_x509_crt_deinit(crt);
}

static void
test_two_cas_differ(void **state)
{
    (void)state;
    g_autofree char *cert_a = NULL, *key_a = NULL, *cert_b = NULL, *key_b = NULL;

    assert_true(vm_egress_ca_generate("a", &cert_a, &key_a, NULL));
    assert_true(vm_egress_ca_generate("a", &cert_b, &key_b, NULL));
    assert_string_not_equal(key_a, key_b);
    assert_string_not_equal(cert_a, cert_b);
}

static void
test_bad_name_refused(void **state)
{
    (void)state;
    g_autoptr(GError) error = NULL;
    char *cert_pem = (char *)"x";
    char *key_pem = (char *)"x";

    assert_false(vm_egress_ca_generate("a,CN=evil", &cert_pem, &key_pem, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_null(cert_pem);
    assert_null(key_pem);
}

static gnutls_x509_crt_t
crt_from_pem(const char *pem)
{
    gnutls_x509_crt_t crt;
    gnutls_datum_t datum = {(unsigned char *)pem, (unsigned)strlen(pem)};

    assert_int_equal(gnutls_x509_crt_init(&crt), 0);
    assert_int_equal(gnutls_x509_crt_import(crt, &datum, GNUTLS_X509_FMT_PEM), 0);
    return crt;
}

static void
test_mint_verifies_for_its_host_only(void **state)
{
    (void)state;
    g_autoptr(GError) error = NULL;
    g_autofree char *ca_cert = NULL, *ca_key = NULL, *leaf_cert = NULL, *leaf_key = NULL;
    g_autofree char *other_ca_cert = NULL, *other_ca_key = NULL;

    assert_true(vm_egress_ca_generate("alpha", &ca_cert, &ca_key, NULL));
    assert_true(vm_egress_ca_generate("beta", &other_ca_cert, &other_ca_key, NULL));
    assert_true(
        vm_egress_ca_mint(ca_cert, ca_key, "api.example.com", &leaf_cert, &leaf_key, &error));
    assert_null(error);

    gnutls_x509_crt_t ca = crt_from_pem(ca_cert);
    gnutls_x509_crt_t other_ca = crt_from_pem(other_ca_cert);
    gnutls_x509_crt_t leaf = crt_from_pem(leaf_cert);
    unsigned int verify = 1;
    assert_int_equal(gnutls_x509_crt_verify(leaf, &ca, 1, 0, &verify), 0);
    assert_int_equal(verify, 0);
    assert_int_equal(gnutls_x509_crt_verify(leaf, &other_ca, 1, 0, &verify), 0);
    assert_int_not_equal(verify, 0);
    assert_true(gnutls_x509_crt_check_hostname(leaf, "api.example.com"));
    assert_false(gnutls_x509_crt_check_hostname(leaf, "evil.example.com"));
    assert_true(gnutls_x509_crt_get_expiration_time(leaf) <=
                gnutls_x509_crt_get_expiration_time(ca));
    assert_true(gnutls_x509_crt_get_activation_time(leaf) < time(NULL) - 3600);
    gnutls_x509_crt_deinit(leaf);

    g_clear_pointer(&leaf_cert, g_free);
    g_clear_pointer(&leaf_key, g_free);
    assert_true(vm_egress_ca_mint(ca_cert, ca_key, "127.0.0.1", &leaf_cert, &leaf_key, NULL));
    leaf = crt_from_pem(leaf_cert);
    assert_true(gnutls_x509_crt_check_ip(leaf, (const unsigned char *)"\x7f\0\0\x01", 4, 0));
    assert_false(gnutls_x509_crt_check_ip(leaf, (const unsigned char *)"\x7f\0\0\x02", 4, 0));

    gnutls_x509_crt_deinit(leaf);
    gnutls_x509_crt_deinit(ca);
    gnutls_x509_crt_deinit(other_ca);
}

static void
test_mint_refuses_bad_input(void **state)
{
    (void)state;
    g_autoptr(GError) error = NULL;
    g_autofree char *ca_cert = NULL, *ca_key = NULL;
    char *leaf_cert = (char *)"x";
    char *leaf_key = (char *)"x";

    assert_true(vm_egress_ca_generate("alpha", &ca_cert, &ca_key, NULL));
    assert_false(vm_egress_ca_mint(ca_cert, ca_key, "", &leaf_cert, &leaf_key, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_null(leaf_cert);
    g_clear_error(&error);
    assert_false(
        vm_egress_ca_mint("not a pem", ca_key, "a.example", &leaf_cert, &leaf_key, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_null(leaf_key);
}

static void
test_mint_cache(void **state)
{
    (void)state;
    g_autofree char *ca_cert = NULL, *ca_key = NULL;
    g_autofree char *a1 = NULL, *a1_key = NULL, *a2 = NULL, *a2_key = NULL;
    g_autofree char *b = NULL, *b_key = NULL, *a3 = NULL, *a3_key = NULL;

    assert_true(vm_egress_ca_generate("alpha", &ca_cert, &ca_key, NULL));
    g_autoptr(VmEgressMintCache) cache = vm_egress_mint_cache_new(ca_cert, ca_key, 1);
    assert_true(vm_egress_mint_cache_get(cache, "a.example", &a1, &a1_key, NULL));
    assert_true(vm_egress_mint_cache_get(cache, "a.example", &a2, &a2_key, NULL));
    assert_string_equal(a1, a2);
    assert_string_equal(a1_key, a2_key);
    /* Past the bound the cache starts over: another host, then the first minted anew. */
    assert_true(vm_egress_mint_cache_get(cache, "b.example", &b, &b_key, NULL));
    assert_string_not_equal(a1, b);
    assert_true(vm_egress_mint_cache_get(cache, "a.example", &a3, &a3_key, NULL));
    assert_string_not_equal(a1, a3);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ca_generated),
        cmocka_unit_test(test_two_cas_differ),
        cmocka_unit_test(test_bad_name_refused),
        cmocka_unit_test(test_mint_verifies_for_its_host_only),
        cmocka_unit_test(test_mint_refuses_bad_input),
        cmocka_unit_test(test_mint_cache),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
