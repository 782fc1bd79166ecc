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

    g_auto(GStrv) names = vmctl_parse_names(ctx, argc, argv, entries, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_variant_dict_insert(fields, "wait", "b", !no_wait);
    return vmctl_agent_actions(ctx, VM_OP_AGENT_START, names, fields, "started", error);
}
