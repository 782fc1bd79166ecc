#include "vmctl.h"

#include <stdio.h>

#include "vm-error.h"
#include "vm-util.h"

gboolean
vmctl_cmd_stop_host_agents(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *timeout = NULL;
    const GOptionEntry entries[] = {
        {"timeout", 0, 0, G_OPTION_ARG_STRING, &timeout,
         "Leave running the agents not saved within this long (default: hostd's shutdown-timeout)",
         "DURATION"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);

    if (!vmctl_parse(ctx, argc, argv, entries, 0, 0, &args, error))
        return FALSE;
    if (timeout != NULL) {
        guint64 seconds = 0;
        if (!vm_duration_parse(timeout, &seconds, NULL) || seconds == 0 || seconds > 3600)
            return vmctl_usage_error(ctx, error,
                                     "--timeout: expected a duration up to 1h such as 30s or 2m");
        g_variant_dict_insert(fields, "timeout_s", "u", (guint32)seconds);
    }
    if (!vmctl_request(ctx, VM_OP_HOST_SAVE_ALL, g_variant_dict_end(fields), &result, error))
        return FALSE;
    if (ctx->json) {
        vmctl_print_result(ctx, result, NULL, NULL);
    }

    g_autoptr(GVariant) agents = vmctl_result_get(result, "agents", G_VARIANT_TYPE("aa{sv}"));
    g_autoptr(GVariant) seconds = vmctl_result_get(result, "seconds", G_VARIANT_TYPE_DOUBLE);
    guint failed = 0, total = agents != NULL ? (guint)g_variant_n_children(agents) : 0;
    for (guint i = 0; i < total; i++) {
        g_autoptr(GVariant) one = g_variant_get_child_value(agents, i);
        const char *name = "?", *why = "?";
        gboolean saved = FALSE;
        double took = 0;
        g_variant_lookup(one, "name", "&s", &name);
        g_variant_lookup(one, "saved", "b", &saved);
        g_variant_lookup(one, "seconds", "d", &took);
        g_variant_lookup(one, "error", "&s", &why);
        if (!saved)
            failed++;
        if (ctx->json)
            continue;
        if (saved)
            printf("saved %s in %.1f s\n", name, took);
        else
            printf("not saved %s (left running): %s\n", name, why);
    }
    if (!ctx->json)
        printf("%u of %u running agents saved in %.1f s\n", total - failed, total,
               seconds != NULL ? g_variant_get_double(seconds) : 0.0);
    if (failed > 0)
        return vm_throw(error, VM_ERROR_FAILED, "%u of %u agents not saved", failed, total);
    return TRUE;
}
