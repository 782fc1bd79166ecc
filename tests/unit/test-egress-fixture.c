/* Fixtures of the egress tests; see test-egress-fixture.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "test-egress-fixture.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <string.h>

VmEgressPolicy *
vm_test_egress_policy(const char *allow, const char *deny)
{
    g_auto(GStrv) a = allow != NULL ? g_strsplit(allow, " ", 0) : NULL;
    g_auto(GStrv) d = deny != NULL ? g_strsplit(deny, " ", 0) : NULL;
    g_autoptr(GError) error = NULL;
    VmEgressPolicy *policy =
        vm_egress_policy_new((const char *const *)a, (const char *const *)d, &error);

    if (policy == NULL)
        fail_msg("policy allow='%s' deny='%s' refused: %s", allow, deny, error->message);
    return policy;
}

GArray *
vm_test_egress_resolve(const char *host, gpointer counter, GError **error)
{
    GArray *out;
    VmEgressAddress address;

    if (counter != NULL)
        g_atomic_int_inc((gint *)counter);
    if (!g_str_has_suffix(host, ".test") || g_str_equal(host, "unknown.test"))
        return vm_throw(error, VM_ERROR_NOT_FOUND, "no such test host '%s'", host), NULL;
    out = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
    (void)vm_egress_address_parse("127.0.0.1", &address, NULL);
    g_array_append_val(out, address);
    if (g_str_equal(host, "mixed.test")) {
        (void)vm_egress_address_parse("10.1.2.3", &address, NULL);
        g_array_append_val(out, address);
    }
    return out;
}

/* GnuTLS's transport: what the session sends is collected, and it never receives anything, so
 * the handshake stops after the ClientHello. */
static ssize_t
hello_push(gnutls_transport_ptr_t user_data, const void *data, size_t len)
{
    g_byte_array_append(user_data, data, len);
    return (ssize_t)len;
}

static ssize_t
hello_pull(gnutls_transport_ptr_t user_data, void *data, size_t len)
{
    errno = EAGAIN;
    return -1;
}

GBytes *
vm_test_tls_client_hello(const char *server_name)
{
    gnutls_session_t session = NULL;
    gnutls_certificate_credentials_t credentials = NULL;
    GByteArray *sent = g_byte_array_new();
    int rc;

    if (gnutls_certificate_allocate_credentials(&credentials) < 0 ||
        gnutls_init(&session, GNUTLS_CLIENT | GNUTLS_NONBLOCK) < 0 ||
        gnutls_set_default_priority(session) < 0 ||
        gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, credentials) < 0)
        fail_msg("cannot set up a GnuTLS client session");
    if (server_name != NULL &&
        gnutls_server_name_set(session, GNUTLS_NAME_DNS, server_name, strlen(server_name)) < 0)
        fail_msg("GnuTLS refused the server name '%s'", server_name);
    gnutls_transport_set_ptr(session, sent);
    gnutls_transport_set_push_function(session, hello_push);
    gnutls_transport_set_pull_function(session, hello_pull);
    rc = gnutls_handshake(session);
    if (rc != GNUTLS_E_AGAIN || sent->len == 0)
        fail_msg("GnuTLS handshake: %s", gnutls_strerror(rc));
    gnutls_deinit(session);
    gnutls_certificate_free_credentials(credentials);
    return g_byte_array_free_to_bytes(sent);
}

void
vm_test_egress_wait_idle(VmEgressProxy *proxy)
{
    for (int i = 0; i < 500 && vm_egress_proxy_get_n_connections(proxy) > 0; i++)
        g_usleep(10 * 1000);
    assert_int_equal(vm_egress_proxy_get_n_connections(proxy), 0);
}

struct VmTestEgressLog {
    GMutex lock;
    GCond cond;
    GPtrArray *records; /* of VmTestEgressRecord */
    VmTestEgressCheck check;
};

/* Long enough for a record that follows a TLS handshake on a busy machine. */
#define LOG_WAIT_MS 5000

static void
record_free(gpointer data)
{
    VmTestEgressRecord *record = data;

    g_free(record->host);
    g_free(record->address);
    g_free(record->reason);
    g_free(record->secret);
    g_free(record);
}

VmTestEgressLog *
vm_test_egress_log_new(VmTestEgressCheck check)
{
    VmTestEgressLog *log = g_new0(VmTestEgressLog, 1);

    g_mutex_init(&log->lock);
    g_cond_init(&log->cond);
    log->records = g_ptr_array_new_with_free_func(record_free);
    log->check = check;
    return log;
}

void
vm_test_egress_log_free(VmTestEgressLog *log)
{
    if (log == NULL)
        return;
    g_ptr_array_unref(log->records);
    g_mutex_clear(&log->lock);
    g_cond_clear(&log->cond);
    g_free(log);
}

void
vm_test_egress_log_func(const VmEgressRecord *in, gpointer user_data)
{
    VmTestEgressLog *log = user_data;
    VmTestEgressRecord *record = g_new0(VmTestEgressRecord, 1);

    if (log->check != NULL) {
        g_autofree char *json = vm_egress_record_to_json(in);

        log->check(json);
    }
    record->kind = in->kind;
    record->host = g_strdup(in->host);
    record->address = g_strdup(in->address);
    record->port = in->port;
    record->reason = g_strdup(in->reason);
    record->secret = g_strdup(in->secret);
    record->bytes_up = in->bytes_up;
    record->bytes_down = in->bytes_down;
    g_mutex_lock(&log->lock);
    g_ptr_array_add(log->records, record);
    g_cond_broadcast(&log->cond);
    g_mutex_unlock(&log->lock);
}

const VmTestEgressRecord *
vm_test_egress_log_wait(VmTestEgressLog *log, guint n)
{
    gint64 deadline = g_get_monotonic_time() + LOG_WAIT_MS * G_TIME_SPAN_MILLISECOND;
    const VmTestEgressRecord *record = NULL;

    g_mutex_lock(&log->lock);
    while (log->records->len <= n)
        if (!g_cond_wait_until(&log->cond, &log->lock, deadline))
            break;
    if (log->records->len > n)
        record = g_ptr_array_index(log->records, n);
    g_mutex_unlock(&log->lock);
    if (record == NULL)
        fail_msg("no log record #%u", n);
    return record;
}

guint
vm_test_egress_log_count(VmTestEgressLog *log)
{
    guint n;

    g_mutex_lock(&log->lock);
    n = log->records->len;
    g_mutex_unlock(&log->lock);
    return n;
}
