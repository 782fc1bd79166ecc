#include "vmctl.h"

#include "vm-name.h"

#include <stdio.h>

gboolean
vmctl_cmd_diff(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *under = NULL;
    const GOptionEntry entries[] = {
        {"path", 0, 0, G_OPTION_ARG_FILENAME, &under, "Only what lies at or below guest PATH",
         "PATH"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 2, 3, &args, error) ||
        !vm_name_validate(args[0], error))
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", args[0]);
    g_variant_dict_insert(&fields, "checkpoint", "s", args[1]);
    if (args[2] != NULL)
        g_variant_dict_insert(&fields, "other", "s", args[2]);
    if (under != NULL)
        g_variant_dict_insert(&fields, "path", "s", under);
    if (!vmctl_request(ctx, VM_OP_CHECKPOINT_DIFF, g_variant_dict_end(&fields), &result, error))
        return FALSE;

    g_autoptr(GVariant) changes = vmctl_result_get(result, "changes", G_VARIANT_TYPE("a(ss)"));
    g_autoptr(GVariant) truncated = vmctl_result_get(result, "truncated", G_VARIANT_TYPE_BOOLEAN);
    if (changes == NULL)
        changes = g_variant_ref_sink(g_variant_new_array(G_VARIANT_TYPE("(ss)"), NULL, 0));
    GVariantIter iter;
    const char *kind, *path;
    if (ctx->json) {
        g_auto(GVariantBuilder) rows = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
        g_variant_iter_init(&iter, changes);
        while (g_variant_iter_next(&iter, "(&s&s)", &kind, &path))
            g_variant_builder_add_parsed(&rows, "{'kind': <%s>, 'path': <%s>}", kind, path);
        g_autoptr(GVariant) value = g_variant_ref_sink(g_variant_builder_end(&rows));
        g_autofree char *json = vmctl_format_json(value);
        fputs(json, stdout);
    } else {
        g_variant_iter_init(&iter, changes);
        while (g_variant_iter_next(&iter, "(&s&s)", &kind, &path)) {
            /* Paths are the guest's file names: any byte but '/' and NUL. */
            g_autofree char *shown = vmctl_format_escaped(path);
            printf("%s %s\n", kind, shown);
        }
    }
    if (truncated != NULL && g_variant_get_boolean(truncated))
        fprintf(stderr, "vmctl: warning: the list was cut; narrow it with --path\n");
    return TRUE;
}
