/* The framed messages between hostd and an egress worker. */
#include "vm-egress-wire.h"

#include "vm-error.h"

GVariant *
vm_egress_wire_credentials(VmEgressCredentials *creds)
{
    return vm_egress_credentials_to_variant(creds);
}

VmEgressCredentials *
vm_egress_wire_credentials_parse(GVariant *payload, GError **error)
{
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    GVariantIter iter;
    const char *name, *placeholder, *value, *header, *format;
    g_autofree const char **hosts = NULL;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE("a(sssasss)")))
        return vm_throw(error, VM_ERROR_PROTOCOL, "egress credentials of type %s",
                        g_variant_get_type_string(payload)),
               NULL;
    g_variant_iter_init(&iter, payload);
    while (g_variant_iter_next(&iter, "(&s&s&s^a&s&s&s)", &name, &placeholder, &value, &hosts,
                               &header, &format)) {
        if (!vm_egress_credentials_add(creds, name, placeholder, value, hosts, header, format,
                                       error))
            return NULL;
        g_clear_pointer(&hosts, g_free);
    }
    return g_steal_pointer(&creds);
}
