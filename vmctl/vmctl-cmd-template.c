#include "vmctl.h"

#include <stdio.h>

/* One column a line, in the order they show. */
/* clang-format off */
static const VmctlField template_columns[] = {
    {"NAME", "name", VMCTL_FORMAT_TEXT},
    {"READY", "ready", VMCTL_FORMAT_YESNO},
    {"WARM", "warm", VMCTL_FORMAT_TEXT},
    {"POOL", "pool_state", VMCTL_FORMAT_TEXT},
    {"CPUS", "cpus", VMCTL_FORMAT_TEXT},
    {"MEMORY", "memory_mib", VMCTL_FORMAT_MIB},
    {"DISK", "disk_gib", VMCTL_FORMAT_GIB},
    {"DESCRIPTION", "description", VMCTL_FORMAT_TEXT},
};
/* clang-format on */

gboolean
vmctl_cmd_template_list(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 0, &args, error))
        return FALSE;
    return vmctl_print_list(ctx, VM_OP_TEMPLATE_LIST, NULL, "templates", template_columns,
                            G_N_ELEMENTS(template_columns), error);
}

gboolean
vmctl_cmd_template_build(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean force = FALSE;
    const GOptionEntry entries[] = {
        {"force", 'f', 0, G_OPTION_ARG_NONE, &force, "Rebuild the image even if it is ready", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(VmMessage) result = NULL;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    g_variant_dict_insert(fields, "force", "b", force);
    if (!vmctl_request(ctx, VM_OP_TEMPLATE_BUILD, g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autofree char *text = g_strdup_printf(
        "built template %s: %s (warm: %s)", vm_message_get_string(result, "name", "-"),
        vm_message_get_string(result, "image", "-"), vm_message_get_string(result, "warm", "-"));
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}
