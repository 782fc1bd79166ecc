#include "vmctl.h"

#include "vm-name.h"

#include <json-glib/json-glib.h>

/* The string @key of @o escaped for the terminal (it comes from a file hostd keeps, and may quote
 * a guest), or a copy of @fallback when absent. */
static char *
escaped_member(JsonObject *o, const char *key, const char *fallback)
{
    const char *value = json_object_get_string_member_with_default(o, key, NULL);

    return value != NULL ? vmctl_format_escaped(value) : g_strdup(fallback);
}

/* The event's time in local time, "2024-05-01 14:00:00"; as it is written when it is no time. */
static char *
format_time(JsonObject *o)
{
    const char *time = json_object_get_string_member_with_default(o, "time", NULL);
    g_autoptr(GDateTime) utc = time != NULL ? g_date_time_new_from_iso8601(time, NULL) : NULL;
    g_autoptr(GDateTime) local = utc != NULL ? g_date_time_to_local(utc) : NULL;

    if (local == NULL)
        return escaped_member(o, "time", "-");
    return g_date_time_format(local, "%Y-%m-%d %H:%M:%S");
}

/* One event as a line: "TIME AGENT EVENT STATE [uid N | by CALLER] [OUTCOME] [DETAIL]", "-" for
 * hostd's own
 * events and for an unknown state. A line that is no event is shown as it is, escaped. */
static char *
format_event(const char *line)
{
    g_autoptr(JsonParser) parser = json_parser_new();
    g_autoptr(GString) out = g_string_new(NULL);
    JsonObject *o;

    if (!json_parser_load_from_data(parser, line, -1, NULL) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
        return vmctl_format_escaped(line);
    o = json_node_get_object(json_parser_get_root(parser));

    g_autofree char *time = format_time(o);
    g_autofree char *agent = escaped_member(o, "agent", "-");
    g_autofree char *event = escaped_member(o, "event", "-");
    g_autofree char *state = escaped_member(o, "state", "-");
    g_autofree char *caller = escaped_member(o, "caller", NULL);
    g_autofree char *outcome = escaped_member(o, "outcome", NULL);
    g_autofree char *detail = escaped_member(o, "detail", NULL);

    g_string_append_printf(out, "%s  %-12s  %-16s  %-8s", time, agent, event, state);
    if (json_object_has_member(o, "uid"))
        g_string_append_printf(out, "  uid %" G_GINT64_FORMAT,
                               json_object_get_int_member_with_default(o, "uid", -1));
    if (caller != NULL)
        g_string_append_printf(out, "  by %s", caller);
    if (outcome != NULL)
        g_string_append_printf(out, "  %s", outcome);
    if (detail != NULL)
        g_string_append_printf(out, "  %s", detail);
    /* The padding of the last columns is no use at the end of a line. */
    while (out->len > 0 && out->str[out->len - 1] == ' ')
        g_string_truncate(out, out->len - 1);
    return g_string_free(g_steal_pointer(&out), FALSE);
}

gboolean
vmctl_cmd_events(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean follow = FALSE;
    g_autofree char *since = NULL;
    g_autofree char *lines = NULL;
    const GOptionEntry entries[] = {
        {"since", 0, 0, G_OPTION_ARG_STRING, &since,
         "Only events since T: a duration back from now (90s, 10m, 2h, 3d) or an ISO 8601 time",
         "T"},
        {"follow", 'f', 0, G_OPTION_ARG_NONE, &follow, "Keep showing new events as they come",
         NULL},
        {"lines", 'n', 0, G_OPTION_ARG_STRING, &lines,
         "Show the last N events first (default: all)", "N"},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 0, 1, &args, error))
        return FALSE;
    if (args[0] != NULL) {
        if (!vm_name_validate(args[0], error))
            return FALSE;
        g_variant_dict_insert(fields, "name", "s", args[0]);
    }
    if (since != NULL) {
        gint64 usec;

        if (!vmctl_parse_time(ctx, "--since", since, g_get_real_time(), &usec, error))
            return FALSE;
        g_variant_dict_insert(fields, "since", "x", usec);
    }
    if (!vmctl_insert_tail_options(ctx, fields, lines, follow, error))
        return FALSE;
    return vmctl_print_stream(ctx, VM_OP_EVENTS, g_variant_dict_end(fields), format_event, error);
}
