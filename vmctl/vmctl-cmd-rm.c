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

    g_auto(GStrv) names = vmctl_parse_names(ctx, argc, argv, entries, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_variant_dict_insert(fields, "force", "b", force);
    return vmctl_agent_actions(ctx, VM_OP_AGENT_RM, names, fields, "removed", error);
}
