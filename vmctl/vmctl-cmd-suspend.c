#include "vmctl.h"

gboolean
vmctl_cmd_suspend(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean save = FALSE;
    const GOptionEntry entries[] = {
        {"save", 0, 0, G_OPTION_ARG_NONE, &save,
         "Write RAM to disk and end the QEMU process (0 host RAM) instead of pausing", NULL},
        G_OPTION_ENTRY_NULL,
    };

    g_auto(GStrv) names = vmctl_parse_names(ctx, argc, argv, entries, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_variant_dict_insert(fields, "save", "b", save);
    return vmctl_agent_actions(ctx, VM_OP_AGENT_SUSPEND, names, fields, save ? "saved" : "paused",
                               error);
}
