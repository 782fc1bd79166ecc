#include "vmctl.h"

gboolean
vmctl_cmd_rm(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean force = FALSE;
    const GOptionEntry entries[] = {
        {"force", 'f', 0, G_OPTION_ARG_NONE, &force, "Remove the agent even if it is running",
         NULL},
        G_OPTION_ENTRY_NULL,
    };

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    g_variant_dict_insert(fields, "force", "b", force);
    return vmctl_agent_action(ctx, VM_OP_AGENT_RM, fields, "removed", error);
}
