#include "vmctl.h"

#include "vmctl-copy.h"

#include <stdio.h>
#include <string.h>

/* The progress line of a copy on a terminal: bytes so far and the rate, redrawn at most every
 * COPY_REDRAW_US from whichever thread moved them. */
#define COPY_REDRAW_US (200 * 1000)

typedef struct {
    GMutex lock;
    VmctlProgress *progress;
    guint64 bytes;
    gint64 started;
    gint64 drawn;
} CopyProgress;

static void
copy_progress_moved(guint64 bytes, gpointer user_data)
{
    CopyProgress *p = user_data;
    gint64 now = g_get_monotonic_time();

    g_mutex_lock(&p->lock);
    p->bytes += bytes;
    if (p->progress != NULL && now - p->drawn >= COPY_REDRAW_US) {
        double seconds = MAX((double)(now - p->started) / G_TIME_SPAN_SECOND, 0.001);
        g_autofree char *done = g_format_size(p->bytes);
        g_autofree char *rate = g_format_size((guint64)((double)p->bytes / seconds));
        g_autofree char *line = g_strdup_printf("%s copied, %s/s", done, rate);
        vmctl_progress_update(p->progress, line, -1);
        p->drawn = now;
    }
    g_mutex_unlock(&p->lock);
}

gboolean
vmctl_cmd_cp(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean recursive = FALSE;
    const GOptionEntry entries[] = {
        {"recursive", 'r', G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &recursive,
         "Copy directories whole (always done)", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_auto(VmctlCopyLocation) from = {0};
    g_auto(VmctlCopyLocation) to = {0};
    VmctlEndpoint endpoint;

    if (!vmctl_parse(ctx, argc, argv, entries, 2, 2, &args, error))
        return FALSE;
    g_autoptr(GError) bad = NULL;
    if (!vmctl_copy_location_parse(args[0], &from, &bad) ||
        !vmctl_copy_location_parse(args[1], &to, &bad))
        return vmctl_usage_error(ctx, error, "%s", bad->message);
    if (from.agent == NULL && to.agent == NULL)
        return vmctl_usage_error(ctx, error, "both paths are local; name an agent as AGENT:PATH");
    if (from.agent != NULL && from.path[0] == '\0')
        return vmctl_usage_error(ctx, error, "missing the path to copy from %s", from.agent);
    if (!vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;

    CopyProgress progress = {.started = g_get_monotonic_time()};
    g_autoptr(VmctlProgress) display = NULL;
    if (vmctl_progress_mode(ctx) == VMCTL_PROGRESS_BAR)
        display = vmctl_progress_new(VMCTL_PROGRESS_BAR, stderr);
    g_mutex_init(&progress.lock);
    progress.progress = display;
    gboolean ok = vmctl_copy(&endpoint, &from, &to, NULL, copy_progress_moved, &progress, error);
    g_mutex_clear(&progress.lock);
    if (ok && ctx->json) {
        g_autoptr(GVariant) result = g_variant_ref_sink(
            g_variant_new_parsed("{'stream_bytes': <%t>}", (guint64)progress.bytes));
        g_autofree char *json = vmctl_format_json(result);
        fputs(json, stdout);
    }
    return ok;
}
