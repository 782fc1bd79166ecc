#include "vmctl.h"

#include "vm-util.h"

gboolean
vmctl_cmd_keep_awake(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *duration = NULL;
    gboolean off = FALSE;
    const GOptionEntry entries[] = {
        {"for", 0, 0, G_OPTION_ARG_STRING, &duration,
         "Only for this long (90s, 30m, 8h); default: until released or hostd restarts",
         "DURATION"},
        {"off", 0, 0, G_OPTION_ARG_NONE, &off, "Let the agent sleep when idle again", NULL},
        G_OPTION_ENTRY_NULL,
    };
    guint64 seconds = 0;

    g_auto(GStrv) names = vmctl_parse_names(ctx, argc, argv, entries, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    if (duration != NULL &&
        (!vm_duration_parse(duration, &seconds, NULL) || seconds == 0 || seconds > G_MAXUINT32))
        return vmctl_usage_error(ctx, error, "--for: expected a duration such as 90s, 30m or 8h");
    g_variant_dict_insert(fields, "seconds", "u", (guint32)seconds);
    g_variant_dict_insert(fields, "off", "b", off);
    return vmctl_agent_actions(ctx, VM_OP_AGENT_KEEP_AWAKE, names, fields,
                               off ? "released" : "keeping awake", error);
}
