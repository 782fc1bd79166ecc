#include "vmctl.h"

#include "vm-util.h"

gboolean
vmctl_cmd_autocheckpoint(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *every = NULL;
    gint keep = 0, hourly = -1, daily = -1;
    gboolean never = FALSE;
    const GOptionEntry entries[] = {
        {"every", 0, 0, G_OPTION_ARG_STRING, &every,
         "Take an automatic checkpoint this often while the agent runs (30m, 2h)", "DURATION"},
        {"keep", 0, 0, G_OPTION_ARG_INT, &keep, "How many automatic ones to keep (default 10)",
         "N"},
        {"hourly", 0, 0, G_OPTION_ARG_INT, &hourly,
         "Also keep the oldest of each of the last N hours (template default 24)", "N"},
        {"daily", 0, 0, G_OPTION_ARG_INT, &daily,
         "Also keep the oldest of each of the last N days (template default 7)", "N"},
        {"never", 0, 0, G_OPTION_ARG_NONE, &never, "No periodic checkpoints for this agent", NULL},
        G_OPTION_ENTRY_NULL,
    };
    guint64 seconds = 0;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (never == (every != NULL))
        return vmctl_usage_error(ctx, error, "give either --every or --never");
    if (every != NULL &&
        (!vm_duration_parse(every, &seconds, NULL) || seconds == 0 || seconds > G_MAXUINT32))
        return vmctl_usage_error(ctx, error, "--every: expected a duration such as 30m or 2h");
    if (keep < 0 || keep > 1000)
        return vmctl_usage_error(ctx, error, "--keep: expected 1-1000");
    if (hourly < -1 || hourly > 1000 || daily < -1 || daily > 1000)
        return vmctl_usage_error(ctx, error, "--hourly, --daily: expected 0-1000");
    g_variant_dict_insert(fields, "never", "b", never);
    g_variant_dict_insert(fields, "every_s", "u", (guint32)seconds);
    g_variant_dict_insert(fields, "keep", "u", (guint32)keep);
    if (hourly >= 0)
        g_variant_dict_insert(fields, "hourly", "u", (guint32)hourly);
    if (daily >= 0)
        g_variant_dict_insert(fields, "daily", "u", (guint32)daily);
    return vmctl_agent_action(ctx, VM_OP_AGENT_SET_CHECKPOINTS, fields, "checkpoint policy set for",
                              error);
}
