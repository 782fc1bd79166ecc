#include "vmctl.h"

gboolean
vmctl_cmd_start(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean no_wait = FALSE;
    const GOptionEntry entries[] = {
        {"no-wait", 0, 0, G_OPTION_ARG_NONE, &no_wait,
         "Return once the VM is started, without waiting for SSH", NULL},
        G_OPTION_ENTRY_NULL,
    };

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    g_variant_dict_insert(fields, "wait", "b", !no_wait);
    return vmctl_agent_action(ctx, VM_OP_AGENT_START, fields, "started", error);
}
