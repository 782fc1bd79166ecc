#include "vmctl.h"

#include <stdio.h>

#include "vm-name.h"

/* Brings back an agent whose host was lost, from the replica of its checkpoints that another
 * host keeps: as of that checkpoint, which the output names (what it did after is lost). */
gboolean
vmctl_cmd_recover(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    const char *to = NULL;
    const GOptionEntry entries[] = {
        {"to", 0, 0, G_OPTION_ARG_STRING, &to,
         "The host to recover it on, which keeps a replica of it (default: the host asked)",
         "HOST"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error) ||
        !vm_name_validate(args[0], error))
        return FALSE;
    if (to != NULL && to[0] == '\0')
        return vmctl_usage_error(ctx, error, "--to is empty");
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", args[0]);
    if (to != NULL)
        g_variant_dict_insert(&fields, "to", "s", to);
    if (!vmctl_request(ctx, VM_OP_AGENT_RECOVER, g_variant_dict_end(&fields), &result, error))
        return FALSE;

    const char *checkpoint = "?", *from = "?", *host = "?", *warning = NULL;
    gint64 created = 0;
    g_variant_lookup(result->fields, "checkpoint", "&s", &checkpoint);
    g_variant_lookup(result->fields, "from", "&s", &from);
    g_variant_lookup(result->fields, "created", "x", &created);
    g_variant_lookup(result->fields, "warning", "&s", &warning);
    g_variant_lookup(result->fields, "host", "&s", &host);
    g_autoptr(GDateTime) when = g_date_time_new_from_unix_utc(created);
    g_autofree char *stamp =
        when != NULL ? g_date_time_format(when, "%Y-%m-%d %H:%M:%S UTC") : g_strdup("?");
    g_autofree char *text = g_strdup_printf(
        "recovered %s on %s (its host %s is lost) from checkpoint %s, made %s: what it did "
        "after that is lost",
        args[0], host, from, checkpoint, stamp);
    vmctl_print_result(ctx, result, NULL, text);
    if (warning != NULL)
        g_printerr("vmctl: warning: %s\n", warning);
    return TRUE;
}
