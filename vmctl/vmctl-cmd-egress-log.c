#include "vmctl.h"

#include "vm-util.h"

#include <json-glib/json-glib.h>
#include <string.h>

/* One record as a line: "TIME EVENT HOST:PORT [-> ADDRESS] REASON [up N down N] DURATION". A
 * line that is not a record is shown escaped, as is the host: the guest named it. */
static char *
format_record_raw(const char *line)
{
    g_autoptr(JsonParser) parser = json_parser_new();
    JsonObject *o;
    g_autoptr(GString) out = g_string_new(NULL);
    const char *host, *address;

    if (!json_parser_load_from_data(parser, line, -1, NULL) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
        return g_strdup(line);
    o = json_node_get_object(json_parser_get_root(parser));
    host = json_object_get_string_member_with_default(o, "host", NULL);
    address = json_object_get_string_member_with_default(o, "address", NULL);
    g_string_append_printf(out, "%s  %-7s  %s:%" G_GINT64_FORMAT,
                           json_object_get_string_member_with_default(o, "time", "-"),
                           json_object_get_string_member_with_default(o, "event", "-"),
                           host != NULL ? host : "-",
                           json_object_get_int_member_with_default(o, "port", 0));
    if (address != NULL && (host == NULL || strcmp(address, host) != 0))
        g_string_append_printf(out, " -> %s", address);
    g_string_append_printf(out, "  %s",
                           json_object_get_string_member_with_default(o, "reason", "-"));
    if (g_strcmp0(json_object_get_string_member_with_default(o, "event", NULL), "allowed") == 0) {
        g_autofree char *up =
            vm_format_bytes((guint64)json_object_get_int_member_with_default(o, "bytes_up", 0));
        g_autofree char *down =
            vm_format_bytes((guint64)json_object_get_int_member_with_default(o, "bytes_down", 0));

        g_string_append_printf(out, "  up %s  down %s", up, down);
    }
    g_string_append_printf(out, "  %" G_GINT64_FORMAT " ms",
                           json_object_get_int_member_with_default(o, "duration_ms", 0));
    return g_string_free(g_steal_pointer(&out), FALSE);
}

static char *
format_record(const char *line)
{
    g_autofree char *raw = format_record_raw(line);
    return vmctl_format_escaped(raw);
}

gboolean
vmctl_cmd_egress_log(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean follow = FALSE;
    g_autofree char *lines = NULL;
    const GOptionEntry entries[] = {
        {"follow", 'f', 0, G_OPTION_ARG_NONE, &follow, "Keep showing new records as they come",
         NULL},
        {"lines", 'n', 0, G_OPTION_ARG_STRING, &lines,
         "Show the last N records first (default: all)", "N"},
        G_OPTION_ENTRY_NULL,
    };

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (!vmctl_insert_tail_options(ctx, fields, lines, follow, error))
        return FALSE;
    return vmctl_print_stream(ctx, VM_OP_EGRESS_LOG, g_variant_dict_end(fields), format_record,
                              error);
}
