#include "vmctl.h"

gboolean
vmctl_cmd_autorestart(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 2, 2, &args, error))
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_variant_dict_insert(fields, "name", "s", args[0]);
    g_variant_dict_insert(fields, "policy", "s", args[1]);
    g_autofree char *done = g_strdup_printf("restart policy %s set for", args[1]);
    return vmctl_agent_action(ctx, VM_OP_AGENT_SET_RESTART, fields, done, error);
}
