#include "vmctl-move.h"

#include <stdio.h>

#include "vm-name.h"

/* Moves a running (or saved, or stopped) agent to another host of the fleet: it keeps its
 * processes, disk, checkpoints, keys and address (its name). */
gboolean
vmctl_cmd_move(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    const char *to = NULL;
    const GOptionEntry entries[] = {
        {"to", 0, 0, G_OPTION_ARG_STRING, &to,
         "The host to move it to (default: where placement puts it)", "HOST"},
        {NULL},
    };
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error))
        return FALSE;
    if (!vm_name_validate(args[0], error))
        return FALSE;
    if (to != NULL && to[0] == '\0')
        return vmctl_usage_error(ctx, error, "--to is empty");
    g_auto(VmctlMoveReport) report = {0};
    if (!vmctl_move_agent(ctx, args[0], to, &report, error))
        return FALSE;
    if (ctx->json) {
        g_autofree char *json = g_strdup_printf(
            "{\"agent\": \"%s\", \"from\": \"%s\", \"to\": \"%s\", \"bytes\": %" G_GUINT64_FORMAT
            ", \"bytes_down\": %" G_GUINT64_FORMAT ", \"seconds\": %.3f, \"down_s\": %.3f}\n",
            args[0], report.from, report.to, report.bytes, report.bytes_down, report.seconds,
            report.down_s);
        fputs(json, stdout);
    } else if (!ctx->quiet) {
        printf("moved %s from %s to %s: %.1f MiB copied in %.1f s, %.1f MiB of it in the %.1f s "
               "it was saved\n",
               args[0], report.from, report.to, (double)report.bytes / (1024.0 * 1024.0),
               report.seconds, (double)report.bytes_down / (1024.0 * 1024.0), report.down_s);
    }
    return TRUE;
}
