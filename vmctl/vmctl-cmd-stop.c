#include "vmctl.h"

#include "vm-util.h"

gboolean
vmctl_cmd_stop(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean force = FALSE;
    g_autofree char *timeout = NULL;
    const GOptionEntry entries[] = {
        {"force", 'f', 0, G_OPTION_ARG_NONE, &force, "Power the VM off instead of shutting it down",
         NULL},
        {"timeout", 0, 0, G_OPTION_ARG_STRING, &timeout,
         "Wait at most DURATION (90, 90s, 5m) for a clean shutdown before powering off",
         "DURATION"},
        G_OPTION_ENTRY_NULL,
    };
    guint64 timeout_s = 0;

    g_auto(GStrv) names = vmctl_parse_names(ctx, argc, argv, entries, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_variant_dict_insert(fields, "force", "b", force);
    if (timeout != NULL) {
        g_autoptr(GError) local_error = NULL;
        if (!vm_duration_parse(timeout, &timeout_s, &local_error) || timeout_s > G_MAXUINT32)
            return vmctl_usage_error(ctx, error, "--timeout: %s",
                                     local_error != NULL ? local_error->message : "too long");
        g_variant_dict_insert(fields, "timeout_s", "u", (guint32)timeout_s);
    }
    return vmctl_agent_actions(ctx, VM_OP_AGENT_STOP, names, fields, "stopped", error);
}
