/* Fixtures of the egress tests; see test-egress-fixture.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "test-egress-fixture.h"

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
