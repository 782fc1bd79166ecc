#include "vmctl.h"

#include <stdio.h>

/* "a, b, c", or "-" for an empty list. */
static char *
format_rules(GVariant *egress, const char *key)
{
    g_autoptr(GVariant) value = vmctl_dict_lookup(egress, key);
    g_autofree const char **rules = NULL;

    if (value == NULL || !g_variant_is_of_type(value, G_VARIANT_TYPE_STRING_ARRAY))
        return g_strdup("-");
    rules = g_variant_get_strv(value, NULL);
    return rules[0] != NULL ? g_strjoinv(", ", (char **)rules) : g_strdup("-");
}

static char *
format_egress(GVariant *egress)
{
    g_autofree char *allow = format_rules(egress, "allow");
    g_autofree char *deny = format_rules(egress, "deny");
    g_autoptr(GVariant) proxy = vmctl_dict_lookup(egress, "proxy");
    g_autoptr(GVariant) wired = vmctl_dict_lookup(egress, "wired");
    g_autoptr(GVariant) connections = vmctl_dict_lookup(egress, "connections");
    gboolean is_wired = wired != NULL && g_variant_is_of_type(wired, G_VARIANT_TYPE_BOOLEAN) &&
                        g_variant_get_boolean(wired);

    return g_strdup_printf("allow:        %s\n"
                           "deny:         %s\n"
                           "proxy:        %s%s\n"
                           "connections:  %u\n",
                           allow, deny,
                           proxy != NULL && g_variant_is_of_type(proxy, G_VARIANT_TYPE_STRING)
                               ? g_variant_get_string(proxy, NULL)
                               : "-",
                           is_wired ? "" : " (not wired into this agent's VM: it has no way out)",
                           connections != NULL &&
                                   g_variant_is_of_type(connections, G_VARIANT_TYPE_UINT32)
                               ? g_variant_get_uint32(connections)
                               : 0);
}

gboolean
vmctl_cmd_egress(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) allow = NULL, deny = NULL, remove = NULL;
    gboolean reset = FALSE;
    const GOptionEntry entries[] = {
        {"allow", 0, 0, G_OPTION_ARG_STRING_ARRAY, &allow,
         "Allow RULE: a name, *.suffix, an address or CIDR, or any/none; NAME:PORT, CIDR:PORT, "
         "[IPv6]/LEN:PORT for one port, else 80 and 443 only; @PRESET for a preset's rules "
         "(see 'vmctl egress presets'; repeatable, or several separated by commas)",
         "RULE"},
        {"deny", 0, 0, G_OPTION_ARG_STRING_ARRAY, &deny,
         "Deny RULE, even where an allow rule matches; without a port every port (repeatable)",
         "RULE"},
        {"remove", 0, 0, G_OPTION_ARG_STRING_ARRAY, &remove,
         "Take RULE out of the allow and deny lists (repeatable)", "RULE"},
        {"reset", 0, 0, G_OPTION_ARG_NONE, &reset,
         "Drop every rule first (nothing allowed), then apply the other options", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(VmMessage) result = NULL;
    gboolean change;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    change = reset || allow != NULL || deny != NULL || remove != NULL;
    const struct {
        const char *key;
        char **values;
    } lists[] = {{"allow", allow}, {"deny", deny}, {"remove", remove}};
    for (gsize i = 0; i < G_N_ELEMENTS(lists); i++) {
        if (lists[i].values == NULL)
            continue;
        g_auto(GStrv) rules = vmctl_split_rules((const char *const *)lists[i].values);
        g_variant_dict_insert(fields, lists[i].key, "^as", rules);
    }
    if (reset)
        g_variant_dict_insert(fields, "reset", "b", TRUE);
    if (!vmctl_request(ctx, change ? VM_OP_EGRESS_SET : VM_OP_EGRESS_GET,
                       g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autoptr(GVariant) egress = vmctl_result_get(result, "egress", G_VARIANT_TYPE_VARDICT);
    if (ctx->json || egress == NULL) {
        vmctl_print_result(ctx, result, "egress", NULL);
        return TRUE;
    }
    g_autofree char *text = format_egress(egress);
    fputs(text, stdout);
    return TRUE;
}
