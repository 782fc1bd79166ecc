#include "vmctl.h"

#include "vm-util.h"

static gboolean
vmctl_idle_duration(VmctlContext *ctx, const char *option, const char *text, guint32 *ret,
                    GError **error)
{
    guint64 seconds = 0;
    if (text == NULL) {
        *ret = 0;
        return TRUE;
    }
    if (!vm_duration_parse(text, &seconds, NULL) || seconds > G_MAXUINT32)
        return vmctl_usage_error(ctx, error, "%s: expected a duration such as 30s, 5m or 1h",
                                 option);
    *ret = (guint32)seconds;
    return TRUE;
}

gboolean
vmctl_cmd_idle(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *pause_after = NULL, *save_after = NULL;
    gboolean never = FALSE;
    const GOptionEntry entries[] = {
        {"pause-after", 0, 0, G_OPTION_ARG_STRING, &pause_after,
         "Pause (vCPUs stopped, RAM kept) after this long idle; 0 turns it off", "DURATION"},
        {"save-after", 0, 0, G_OPTION_ARG_STRING, &save_after,
         "Save to disk (no RAM used) after this long idle; 0 turns it off", "DURATION"},
        {"never", 0, 0, G_OPTION_ARG_NONE, &never, "Never suspend this agent by itself", NULL},
        G_OPTION_ENTRY_NULL,
    };
    guint32 pause_s = 0, save_s = 0;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (never && (pause_after != NULL || save_after != NULL))
        return vmctl_usage_error(ctx, error, "--never excludes --pause-after and --save-after");
    if (!never && pause_after == NULL && save_after == NULL)
        return vmctl_usage_error(ctx, error, "give --pause-after, --save-after or --never");
    if (!vmctl_idle_duration(ctx, "--pause-after", pause_after, &pause_s, error) ||
        !vmctl_idle_duration(ctx, "--save-after", save_after, &save_s, error))
        return FALSE;
    g_variant_dict_insert(fields, "never", "b", never);
    g_variant_dict_insert(fields, "pause_s", "u", pause_s);
    g_variant_dict_insert(fields, "save_s", "u", save_s);
    return vmctl_agent_action(ctx, VM_OP_AGENT_SET_IDLE, fields, "idle policy set for", error);
}
