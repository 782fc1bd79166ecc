#include "vmctl.h"

/* A line of the console or of cloud-init's output: hostd escaped it already; escaped again here
 * (which leaves it as it is) so that a hostd that did not cannot have the guest drive the
 * terminal either. */
static char *
format_line(const char *line)
{
    return vmctl_format_escaped(line);
}

gboolean
vmctl_cmd_logs(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean follow = FALSE;
    gboolean cloud_init = FALSE;
    g_autofree char *lines = NULL;
    const GOptionEntry entries[] = {
        {"follow", 'f', 0, G_OPTION_ARG_NONE, &follow,
         "Keep showing the console's new lines until interrupted", NULL},
        {"lines", 'n', 0, G_OPTION_ARG_STRING, &lines,
         "Show the last N lines (default: all that is kept)", "N"},
        {"cloud-init", 0, 0, G_OPTION_ARG_NONE, &cloud_init,
         "Show cloud-init's output in the guest (/var/log/cloud-init-output.log) instead", NULL},
        G_OPTION_ENTRY_NULL,
    };

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (follow && cloud_init)
        return vmctl_usage_error(ctx, error, "--follow shows the console, not --cloud-init");
    if (!vmctl_insert_tail_options(ctx, fields, lines, follow, error))
        return FALSE;
    g_variant_dict_insert(fields, "cloud_init", "b", cloud_init);
    return vmctl_print_stream(ctx, VM_OP_AGENT_LOGS, g_variant_dict_end(fields), format_line,
                              error);
}
