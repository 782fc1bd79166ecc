#include "vmctl.h"

#include <stdio.h>

/* One column a line, in the order they show. */
/* clang-format off */
static const VmctlField host_columns[] = {
    {"HOST", "id", VMCTL_FORMAT_TEXT},
    {"ADDRESS", "address", VMCTL_FORMAT_TEXT},
    {"STATE", "liveness", VMCTL_FORMAT_TEXT},
    {"CORES", "cores", VMCTL_FORMAT_TEXT},
    {"MEMORY", "memory_mib", VMCTL_FORMAT_MIB},
    {"FREE MEMORY", "free_memory_mib", VMCTL_FORMAT_MIB},
    {"DISK", "disk_gib", VMCTL_FORMAT_GIB},
    {"FREE DISK", "free_disk_gib", VMCTL_FORMAT_GIB},
    {"AGENTS", "agents_text", VMCTL_FORMAT_TEXT},
};
/* clang-format on */

/* "3 (2 running, 1 stopped)" from a host's agents_total and its counts by state. */
static char *
agents_text(GVariant *host)
{
    g_autoptr(GVariant) counts = g_variant_lookup_value(host, "agents", G_VARIANT_TYPE("a{su}"));
    g_autoptr(GString) text = g_string_new(NULL);
    guint32 total = 0;
    GVariantIter it;
    const char *state;
    guint32 count;

    g_variant_lookup(host, "agents_total", "u", &total);
    g_string_append_printf(text, "%u", total);
    if (counts == NULL || g_variant_n_children(counts) == 0)
        return g_string_free(g_steal_pointer(&text), FALSE);
    g_string_append(text, " (");
    g_variant_iter_init(&it, counts);
    for (gboolean first = TRUE; g_variant_iter_next(&it, "{&su}", &state, &count); first = FALSE)
        g_string_append_printf(text, "%s%u %s", first ? "" : ", ", count, state);
    g_string_append(text, ")");
    return g_string_free(g_steal_pointer(&text), FALSE);
}

gboolean
vmctl_cmd_hosts(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 0, &args, error))
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_FLEET_HOSTS, NULL, &result, error))
        return FALSE;
    g_autoptr(GVariant) rows = vmctl_result_rows(result, "hosts");
    if (ctx->json) {
        g_autofree char *json = vmctl_format_json(rows);
        fputs(json, stdout);
        return TRUE;
    }

    /* A down host has no figures of its own: only its id and the agents it held. */
    g_auto(GVariantBuilder) shown = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    GVariantIter it;
    GVariant *host;
    g_variant_iter_init(&it, rows);
    while ((host = g_variant_iter_next_value(&it)) != NULL) {
        gboolean live = FALSE;
        g_variant_lookup(host, "live", "b", &live);
        g_autoptr(GVariantDict) d = g_variant_dict_new(live ? host : NULL);
        if (!live) {
            g_autoptr(GVariant) id = g_variant_lookup_value(host, "id", G_VARIANT_TYPE_STRING);
            if (id != NULL)
                g_variant_dict_insert_value(d, "id", id);
        }
        gboolean drained = FALSE;
        g_variant_lookup(host, "drained", "b", &drained);
        g_variant_dict_insert(d, "liveness", "s", !live ? "down" : drained ? "drained" : "live");
        g_autofree char *agents = agents_text(host);
        g_variant_dict_insert(d, "agents_text", "s", agents);
        g_variant_builder_add_value(&shown, g_variant_dict_end(d));
        g_variant_unref(host);
    }
    g_autoptr(GVariant) table_rows = g_variant_ref_sink(g_variant_builder_end(&shown));
    g_autofree char *text = vmctl_format_table(table_rows, host_columns, G_N_ELEMENTS(host_columns),
                                               g_get_real_time() / G_USEC_PER_SEC);
    fputs(text, stdout);
    return TRUE;
}
