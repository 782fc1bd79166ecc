#include "vmctl.h"

#include "vm-error.h"
#include "vm-stream.h"
#include "vm-util.h"
#include "vmctl-client.h"

#include <json-glib/json-glib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* One record as a line: "TIME EVENT HOST:PORT [-> ADDRESS] REASON [up N down N] DURATION". A
 * line that is not a record is shown as it is. */
static char *
format_record(const char *line)
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

/* Prints the whole lines in @pending and keeps the rest. */
static gboolean
print_lines(VmctlContext *ctx, GString *pending, GError **error)
{
    char *nl;

    while ((nl = memchr(pending->str, '\n', pending->len)) != NULL) {
        g_autofree char *line = g_strndup(pending->str, nl - pending->str);
        g_autofree char *text = ctx->json ? g_strdup(line) : format_record(line);

        g_string_erase(pending, 0, nl - pending->str + 1);
        if (printf("%s\n", text) < 0 || fflush(stdout) != 0)
            return vm_throw(error, VM_ERROR_IO, "cannot write the output");
    }
    return TRUE;
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
    g_autoptr(GString) pending = g_string_new(NULL);
    g_autoptr(VmMessage) request = NULL;
    g_autoptr(VmctlConnection) connection = NULL;
    VmctlEndpoint endpoint;
    VmStreamReader reader;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (lines != NULL) {
        guint32 n;

        if (!vmctl_parse_uint(ctx, "--lines", lines, 0, G_MAXUINT32 - 1, &n, error))
            return FALSE;
        g_variant_dict_insert(fields, "lines", "u", n);
    }
    g_variant_dict_insert(fields, "follow", "b", follow);
    request = vm_message_new(VM_OP_EGRESS_LOG, g_variant_dict_end(fields), error);
    if (request == NULL)
        return FALSE;
    if (!vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;
    connection = vmctl_connection_open(&endpoint, error);
    if (connection == NULL)
        return FALSE;
    if (!vm_message_write_fd(vmctl_connection_get_fd(connection), request, error))
        return vmctl_connection_fail(connection, error);
    vm_stream_reader_init(&reader, vmctl_connection_get_fd(connection), request->op);
    for (;;) {
        g_autoptr(VmMessage) m = vm_stream_reader_next(&reader, error);
        const guint8 *data;
        gsize len = 0;

        if (m == NULL)
            return vmctl_connection_fail(connection, error);
        switch (m->op) {
        case VM_OP_STDOUT:
            data = vm_message_get_data(m, "data", &len);
            g_string_append_len(pending, (const char *)data, (gssize)len);
            if (!print_lines(ctx, pending, error))
                return FALSE;
            break;
        case VM_OP_EXIT:
            g_string_append_c(pending, '\n');
            return pending->len == 1 || print_lines(ctx, pending, error);
        case VM_OP_PROGRESS:
            break;
        default: /* the log has no stderr */
            return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                            vm_op_name(m->op));
        }
    }
}
