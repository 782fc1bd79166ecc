#include "vmctl.h"

gboolean
vmctl_cmd_resume(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) names = vmctl_parse_names(ctx, argc, argv, NULL, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    return vmctl_agent_actions(ctx, VM_OP_AGENT_RESUME, names, fields, "resumed", error);
}
