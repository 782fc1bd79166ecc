#include "vmctl.h"

gboolean
vmctl_cmd_resume(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, NULL, error);
    if (fields == NULL)
        return FALSE;
    return vmctl_agent_action(ctx, VM_OP_AGENT_RESUME, fields, "resumed", error);
}
