#include "vmctl.h"

#include "vm-name.h"

#include <stdio.h>

gboolean
vmctl_cmd_restore(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean no_wait = FALSE;
    g_auto(GStrv) paths = NULL;
    const GOptionEntry entries[] = {
        {"no-wait", 0, 0, G_OPTION_ARG_NONE, &no_wait,
         "Return once the VM is started, without waiting for SSH", NULL},
        {"path", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &paths,
         "Put back only guest PATH (a file or a tree), leaving the rest running as it is; "
         "repeatable",
         "PATH"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 2, 2, &args, error) ||
        !vm_name_validate(args[0], error))
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", args[0]);
    g_variant_dict_insert(&fields, "checkpoint", "s", args[1]);
    g_variant_dict_insert(&fields, "wait", "b", !no_wait);
    if (paths != NULL)
        g_variant_dict_insert(&fields, "paths", "^as", paths);
    if (!vmctl_request(ctx, VM_OP_CHECKPOINT_RESTORE, g_variant_dict_end(&fields), &result, error))
        return FALSE;

    g_autoptr(GVariant) undo = vmctl_result_get(result, "undo", G_VARIANT_TYPE_STRING);
    g_autofree char *what = paths != NULL ? g_strjoinv(" ", paths) : NULL;
    g_autofree char *text = g_strdup_printf(
        "restored %s%s%s to %s (undo with: vmctl restore %s %s)", what != NULL ? what : args[0],
        what != NULL ? " of " : "", what != NULL ? args[0] : "", args[1], args[0],
        undo != NULL ? g_variant_get_string(undo, NULL) : "?");
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}
