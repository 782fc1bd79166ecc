/* The per-agent CA of the credential broker: its generation with GnuTLS. */
#include "vm-egress-ca.h"
#include "vm-error.h"

#include <gnutls/gnutls.h>
#include <gnutls/crypto.h>
#include <gnutls/x509.h>
#include <arpa/inet.h>
#include <string.h>
#include <time.h>

G_DEFINE_AUTO_CLEANUP_FREE_FUNC(gnutls_x509_privkey_t, gnutls_x509_privkey_deinit, NULL)
G_DEFINE_AUTO_CLEANUP_FREE_FUNC(gnutls_x509_crt_t, gnutls_x509_crt_deinit, NULL)

#define CA_LIFETIME_SECONDS ((time_t)10 * 365 * 24 * 60 * 60)
/* A minute back, so that a guest whose clock lags hostd's a little still accepts a new CA. */
#define CA_BACKDATE_SECONDS ((time_t)60)

static gboolean
gnutls_failed(GError **error, int rc, const char *what)
{
    return vm_throw(error, VM_ERROR_IO, "cannot %s: %s", what, gnutls_strerror(rc));
}

/* Moves GnuTLS's exported PEM into a GLib string (freed with g_free, unlike the datum). */
static char *
datum_to_string(gnutls_datum_t *datum)
{
    char *text = g_strndup((const char *)datum->data, datum->size);
    gnutls_free(datum->data);
    datum->data = NULL;
    return text;
}

/* @crt and @key as PEM into *@ret_cert_pem and *@ret_key_pem (both set, or neither); @what
 * names them in the error. */
static gboolean
export_pair(gnutls_x509_crt_t crt, gnutls_x509_privkey_t key, const char *what, char **ret_cert_pem,
            char **ret_key_pem, GError **error)
{
    gnutls_datum_t out = {NULL, 0};
    int rc;

    if ((rc = gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &out)) < 0) {
        g_autofree char *step = g_strdup_printf("write the %s certificate", what);
        return gnutls_failed(error, rc, step);
    }
    g_autofree char *cert_pem = datum_to_string(&out);
    if ((rc = gnutls_x509_privkey_export2(key, GNUTLS_X509_FMT_PEM, &out)) < 0) {
        g_autofree char *step = g_strdup_printf("write the %s key", what);
        return gnutls_failed(error, rc, step);
    }
    *ret_key_pem = datum_to_string(&out);
    *ret_cert_pem = g_steal_pointer(&cert_pem);
    return TRUE;
}

gboolean
vm_egress_ca_generate(const char *agent_name, char **ret_cert_pem, char **ret_key_pem,
                      GError **error)
{
    g_auto(gnutls_x509_privkey_t) key = NULL;
    g_auto(gnutls_x509_crt_t) crt = NULL;
    g_autofree char *subject = NULL;
    unsigned char serial[16];
    time_t now = time(NULL);
    int rc;

    *ret_cert_pem = NULL;
    *ret_key_pem = NULL;
    /* A DN special character in the name would change the subject's structure: agent names are
     * validated elsewhere, but the CA refuses what it cannot write plainly. */
    for (const char *p = agent_name; *p != '\0'; p++) {
        if (!g_ascii_isalnum(*p) && *p != '-' && *p != '_' && *p != '.')
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "cannot make a CA for agent '%s': its name has characters a "
                            "certificate subject cannot hold plainly",
                            agent_name);
    }
    if ((rc = gnutls_x509_privkey_init(&key)) < 0)
        return gnutls_failed(error, rc, "make a CA key");
    if ((rc = gnutls_x509_privkey_generate(
             key, GNUTLS_PK_ECDSA, GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0)) < 0)
        return gnutls_failed(error, rc, "generate a CA key");
    if ((rc = gnutls_x509_crt_init(&crt)) < 0)
        return gnutls_failed(error, rc, "make a CA certificate");
    subject = g_strdup_printf("CN=vmctl egress CA for %s", agent_name);
    if ((rc = gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof serial)) < 0)
        return gnutls_failed(error, rc, "make a serial number");
    serial[0] &= 0x7f; /* a positive INTEGER */
    if ((rc = gnutls_x509_crt_set_version(crt, 3)) < 0 ||
        (rc = gnutls_x509_crt_set_serial(crt, serial, sizeof serial)) < 0 ||
        (rc = gnutls_x509_crt_set_dn(crt, subject, NULL)) < 0 ||
        (rc = gnutls_x509_crt_set_activation_time(crt, now - CA_BACKDATE_SECONDS)) < 0 ||
        (rc = gnutls_x509_crt_set_expiration_time(crt, now + CA_LIFETIME_SECONDS)) < 0 ||
        (rc = gnutls_x509_crt_set_basic_constraints(crt, 1, 0)) < 0 ||
        (rc = gnutls_x509_crt_set_key_usage(crt, GNUTLS_KEY_KEY_CERT_SIGN | GNUTLS_KEY_CRL_SIGN)) <
            0 ||
        (rc = gnutls_x509_crt_set_key(crt, key)) < 0 ||
        (rc = gnutls_x509_crt_set_subject_key_id(crt, serial, sizeof serial)) < 0 ||
        (rc = gnutls_x509_crt_sign2(crt, crt, key, GNUTLS_DIG_SHA256, 0)) < 0)
        return gnutls_failed(error, rc, "build the CA certificate");
    return export_pair(crt, key, "CA", ret_cert_pem, ret_key_pem, error);
}

#define LEAF_BACKDATE_SECONDS ((time_t)24 * 60 * 60)
#define LEAF_LIFETIME_SECONDS ((time_t)365 * 24 * 60 * 60)

gboolean
vm_egress_ca_mint(const char *ca_cert_pem, const char *ca_key_pem, const char *host,
                  char **ret_cert_pem, char **ret_key_pem, GError **error)
{
    g_auto(gnutls_x509_privkey_t) ca_key = NULL;
    g_auto(gnutls_x509_crt_t) ca_crt = NULL;
    g_auto(gnutls_x509_privkey_t) key = NULL;
    g_auto(gnutls_x509_crt_t) crt = NULL;
    unsigned char serial[16];
    unsigned char address[16];
    time_t now = time(NULL);
    int rc;

    *ret_cert_pem = NULL;
    *ret_key_pem = NULL;
    if (host == NULL || *host == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "cannot mint a certificate: no host");
    gnutls_datum_t ca_cert_datum = {(unsigned char *)ca_cert_pem, (unsigned)strlen(ca_cert_pem)};
    gnutls_datum_t ca_key_datum = {(unsigned char *)ca_key_pem, (unsigned)strlen(ca_key_pem)};
    if (gnutls_x509_crt_init(&ca_crt) < 0 || gnutls_x509_privkey_init(&ca_key) < 0 ||
        gnutls_x509_crt_import(ca_crt, &ca_cert_datum, GNUTLS_X509_FMT_PEM) < 0 ||
        gnutls_x509_privkey_import(ca_key, &ca_key_datum, GNUTLS_X509_FMT_PEM) < 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "cannot mint a certificate for '%s': the CA does not parse", host);
    if ((rc = gnutls_x509_privkey_init(&key)) < 0 ||
        (rc = gnutls_x509_privkey_generate(
             key, GNUTLS_PK_ECDSA, GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0)) < 0)
        return gnutls_failed(error, rc, "generate a leaf key");
    if ((rc = gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof serial)) < 0)
        return gnutls_failed(error, rc, "make a serial number");
    serial[0] &= 0x7f; /* a positive INTEGER */
    time_t expiry = now + LEAF_LIFETIME_SECONDS;
    time_t ca_expiry = gnutls_x509_crt_get_expiration_time(ca_crt);
    if (ca_expiry != (time_t)-1 && ca_expiry < expiry)
        expiry = ca_expiry;
    if ((rc = gnutls_x509_crt_init(&crt)) < 0 || (rc = gnutls_x509_crt_set_version(crt, 3)) < 0 ||
        (rc = gnutls_x509_crt_set_serial(crt, serial, sizeof serial)) < 0 ||
        (rc = gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, host,
                                            (unsigned)strlen(host))) < 0 ||
        (rc = gnutls_x509_crt_set_activation_time(crt, now - LEAF_BACKDATE_SECONDS)) < 0 ||
        (rc = gnutls_x509_crt_set_expiration_time(crt, expiry)) < 0 ||
        (rc = gnutls_x509_crt_set_basic_constraints(crt, 0, -1)) < 0 ||
        (rc = gnutls_x509_crt_set_key_usage(crt, GNUTLS_KEY_DIGITAL_SIGNATURE)) < 0 ||
        (rc = gnutls_x509_crt_set_key_purpose_oid(crt, GNUTLS_KP_TLS_WWW_SERVER, 0)) < 0 ||
        (rc = gnutls_x509_crt_set_key(crt, key)) < 0)
        return gnutls_failed(error, rc, "build a leaf certificate");
    /* An IP literal goes into an iPAddress SAN: clients match an address against those only. */
    if (inet_pton(AF_INET, host, address) == 1)
        rc = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, address, 4,
                                                  GNUTLS_FSAN_SET);
    else if (inet_pton(AF_INET6, host, address) == 1)
        rc = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_IPADDRESS, address, 16,
                                                  GNUTLS_FSAN_SET);
    else
        rc = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, host,
                                                  (unsigned)strlen(host), GNUTLS_FSAN_SET);
    if (rc < 0)
        return gnutls_failed(error, rc, "name the leaf certificate");
    if ((rc = gnutls_x509_crt_sign2(crt, ca_crt, ca_key, GNUTLS_DIG_SHA256, 0)) < 0)
        return gnutls_failed(error, rc, "sign the leaf certificate");
    return export_pair(crt, key, "leaf", ret_cert_pem, ret_key_pem, error);
}
