#include "vmctl.h"

#include "vm-name.h"

#include <stdio.h>

gboolean
vmctl_cmd_checkpoint(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *label = NULL;
    gboolean memory = FALSE;
    const GOptionEntry entries[] = {
        {"label", 'l', 0, G_OPTION_ARG_STRING, &label, "A note to find the checkpoint by", "TEXT"},
        {"memory", 0, 0, G_OPTION_ARG_NONE, &memory,
         "Also save RAM and processes, so a restore resumes them instead of booting", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(VmMessage) result = NULL;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (label != NULL)
        g_variant_dict_insert(fields, "label", "s", label);
    if (memory)
        g_variant_dict_insert(fields, "memory", "b", TRUE);
    if (!vmctl_request(ctx, VM_OP_CHECKPOINT_CREATE, g_variant_dict_end(fields), &result, error))
        return FALSE;

    g_autoptr(GVariant) warning = vmctl_result_get(result, "warning", G_VARIANT_TYPE_STRING);
    if (warning != NULL)
        fprintf(stderr, "vmctl: warning: %s\n", g_variant_get_string(warning, NULL));
    g_autoptr(GVariant) checkpoint = vmctl_result_get(result, "checkpoint", G_VARIANT_TYPE_VARDICT);
    const char *id = NULL;
    if (checkpoint != NULL)
        g_variant_lookup(checkpoint, "id", "&s", &id);
    vmctl_print_result(ctx, result, "checkpoint", id != NULL ? id : "");
    return TRUE;
}

gboolean
vmctl_cmd_checkpoint_rm(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 2, 2, &args, error) ||
        !vm_name_validate(args[0], error))
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", args[0]);
    g_variant_dict_insert(&fields, "checkpoint", "s", args[1]);
    if (!vmctl_request(ctx, VM_OP_CHECKPOINT_RM, g_variant_dict_end(&fields), &result, error))
        return FALSE;
    g_autofree char *text = g_strdup_printf("removed checkpoint %s of %s", args[1], args[0]);
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}
