/* The per-agent CA of the credential broker. */
#include "vm-egress-ca.h"
#include "vm-error.h"

gboolean
vm_egress_ca_generate(const char *agent_name, char **ret_cert_pem, char **ret_key_pem,
                      GError **error)
{
    *ret_cert_pem = NULL;
    *ret_key_pem = NULL;
    return vm_throw(error, VM_ERROR_FAILED, "no CA for '%s': TLS interception is not built yet",
                    agent_name);
}
