#include "vmctl.h"

/* clang-format off */
static const VmctlField checkpoint_columns[] = {
    {"ID", "id", VMCTL_FORMAT_TEXT},
    {"CREATED", "created", VMCTL_FORMAT_AGO},
    {"KIND", "kind", VMCTL_FORMAT_TEXT},
    {"AUTO", "automatic", VMCTL_FORMAT_YESNO},
    {"FROZEN", "quiesced", VMCTL_FORMAT_YESNO},
    {"SIZE", "bytes", VMCTL_FORMAT_BYTES},
    {"CURRENT", "current", VMCTL_FORMAT_YESNO},
    {"LABEL", "label", VMCTL_FORMAT_TEXT},
};
/* clang-format on */

gboolean
vmctl_cmd_checkpoints(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, NULL, error);
    if (fields == NULL)
        return FALSE;
    return vmctl_print_list(ctx, VM_OP_CHECKPOINT_LIST, g_variant_dict_end(fields), "checkpoints",
                            checkpoint_columns, G_N_ELEMENTS(checkpoint_columns), error);
}
