#include "vmctl.h"

#include "vm-name.h"

gboolean
vmctl_stats_fetch(VmctlContext *ctx, char **names, VmMessage **ret_result, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);

    for (char **name = names; name != NULL && *name != NULL; name++) {
        if (!vm_name_validate(*name, error))
            return FALSE;
    }
    if (names != NULL && names[0] != NULL)
        g_variant_dict_insert(&fields, "names", "^as", names);
    return vmctl_request(ctx, VM_OP_AGENT_STATS, g_variant_dict_end(&fields), ret_result, error);
}

gboolean
vmctl_cmd_stats(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) names = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, VM_NAMES_MAX, &names, error))
        return FALSE;
    if (!vmctl_stats_fetch(ctx, names, &result, error))
        return FALSE;
    g_autoptr(GVariant) agents = vmctl_result_rows(result, "agents");
    g_autofree char *text = ctx->json ? vmctl_format_json(agents) : vmctl_format_stats(agents);
    fputs(text, stdout);
    /* The host's line under the table; --json stays the agents' array it always was. */
    g_autoptr(GVariant) ksm = vmctl_result_get(result, "ksm", G_VARIANT_TYPE_VARDICT);
    if (!ctx->json && ksm != NULL) {
        g_autofree char *line = vmctl_format_ksm(ksm);
        fputs(line, stdout);
    }
    return TRUE;
}
