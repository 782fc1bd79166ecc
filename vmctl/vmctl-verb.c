#include "vmctl.h"

#include "vm-error.h"
#include "vm-name.h"
#include "vm-ssh-key.h"
#include "vm-stream.h"
#include "vm-util.h"
#include "vmctl-client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The global options, less those whose long name one of @verb_entries (may be NULL) takes: a
 * verb's own meaning wins after the verb (secret create --host HOST), and the global one is
 * still there before it (vmctl --host URL secret create ...). */
static void
add_global_options(GOptionContext *options, VmctlContext *ctx, const GOptionEntry *verb_entries)
{
    const GOptionEntry entries[] = {
        {"socket", 0, 0, G_OPTION_ARG_FILENAME, &ctx->socket_path,
         "Talk to hostd at PATH (default: $VMCTL_SOCKET, else your own hostd's socket, else the "
         "system's)",
         "PATH"},
        {"host", 0, 0, G_OPTION_ARG_STRING, &ctx->host,
         "Talk to hostd on another host over SSH: ssh://[USER@]HOST[:PORT][/SOCKET] (default: "
         "$VMCTL_HOST)",
         "URL"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &ctx->json, "Print the result as JSON", NULL},
        {"quiet", 'q', 0, G_OPTION_ARG_NONE, &ctx->quiet, "Do not show progress", NULL},
        G_OPTION_ENTRY_NULL,
    };

    GOptionEntry kept[G_N_ELEMENTS(entries)];
    gsize n = 0;

    for (gsize i = 0; entries[i].long_name != NULL; i++) {
        gboolean taken = FALSE;
        for (const GOptionEntry *e = verb_entries; e != NULL && e->long_name != NULL; e++)
            taken = taken || strcmp(e->long_name, entries[i].long_name) == 0;
        if (!taken)
            kept[n++] = entries[i];
    }
    kept[n] = (GOptionEntry)G_OPTION_ENTRY_NULL;
    g_option_context_add_main_entries(options, kept, NULL);
}

void
vmctl_add_global_options(GOptionContext *options, VmctlContext *ctx)
{
    add_global_options(options, ctx, NULL);
}

gboolean
vmctl_usage_error(VmctlContext *ctx, GError **error, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_autofree char *what = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (ctx->verb == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s; see 'vmctl --help'", what);
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s; see 'vmctl %s --help'", what,
                    ctx->verb->name);
}

static GOptionContext *
verb_options_new(VmctlContext *ctx, const GOptionEntry *entries, gboolean *help)
{
    const GOptionEntry help_entries[] = {
        {"help", 'h', 0, G_OPTION_ARG_NONE, help, "Show this help", NULL},
        G_OPTION_ENTRY_NULL,
    };
    GOptionContext *options = g_option_context_new(ctx->verb->params);
    GOptionGroup *main_group = g_option_group_new("vmctl", "", "", ctx->option_data, NULL);

    g_option_context_set_main_group(options, main_group);
    g_option_context_set_summary(options, ctx->verb->summary);
    if (ctx->verb_description != NULL)
        g_option_context_set_description(options, ctx->verb_description);
    g_option_context_set_help_enabled(options, FALSE);
    if (entries != NULL)
        g_option_context_add_main_entries(options, entries, NULL);
    add_global_options(options, ctx, entries);
    g_option_context_add_main_entries(options, help_entries, NULL);
    return options;
}

/* Parses the options in @args (args[0] is the verb), removing them. With @strict, parsing stops
 * at the first word that is not an option. */
static gboolean
parse_options(VmctlContext *ctx, const GOptionEntry *entries, gboolean strict, GStrv *args,
              GError **error)
{
    gboolean help = FALSE;
    g_autoptr(GOptionContext) options = verb_options_new(ctx, entries, &help);
    g_autoptr(GError) local_error = NULL;

    g_option_context_set_strict_posix(options, strict);
    if (!g_option_context_parse_strv(options, args, &local_error)) {
        /* GOption capitalises its messages; vmctl's one-line errors are lower case. */
        char *message = local_error->message;
        message[0] = g_ascii_tolower(message[0]);
        return vmctl_usage_error(ctx, error, "%s", message);
    }
    if (help) {
        char *prgname = g_strconcat("vmctl ", ctx->verb->name, NULL);
        g_set_prgname(prgname);
        g_free(prgname);
        char *text = g_option_context_get_help(options, TRUE, NULL);
        fputs(text, stdout);
        g_free(text);
        exit(0);
    }
    return TRUE;
}

static GStrv
args_copy(int argc, char **argv)
{
    GStrv args = g_new0(char *, argc + 1);

    for (int i = 0; i < argc; i++)
        args[i] = g_strdup(argv[i]);
    return args;
}

/* Removes the word at @index from the NULL-terminated @args. */
static void
args_remove(GStrv args, gsize index)
{
    gsize len = g_strv_length(args);

    g_free(args[index]);
    memmove(&args[index], &args[index + 1], (len - index) * sizeof(char *));
}

/* GOption keeps a "--" in some positions and drops it in others; a leftover one at @index ends
 * the options and is not itself an argument. */
static void
args_drop_separator(GStrv args, gsize index)
{
    if (args[0] != NULL && args[index] != NULL && strcmp(args[index], "--") == 0)
        args_remove(args, index);
}

gboolean
vmctl_parse(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries, int min_args,
            int max_args, char ***ret_args, GError **error)
{
    g_auto(GStrv) args = args_copy(argc, argv);

    if (!parse_options(ctx, entries, FALSE, &args, error))
        return FALSE;
    for (gsize i = 1; args[i] != NULL; i++) {
        if (strcmp(args[i], "--") == 0) {
            args_remove(args, i);
            break;
        }
    }

    int n = (int)g_strv_length(args) - 1;
    if (n < min_args)
        return vmctl_usage_error(ctx, error, "missing %s", ctx->verb->params);
    if (max_args >= 0 && n > max_args)
        return vmctl_usage_error(ctx, error, "unexpected argument '%s'", args[1 + max_args]);
    args_remove(args, 0);
    *ret_args = g_steal_pointer(&args);
    return TRUE;
}

GVariantDict *
vmctl_parse_name(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries,
                 GError **error)
{
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error))
        return NULL;
    if (!vm_name_validate(args[0], error))
        return NULL;
    GVariantDict *fields = g_variant_dict_new(NULL);
    g_variant_dict_insert(fields, "name", "s", args[0]);
    return fields;
}

char **
vmctl_parse_names(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries,
                  GError **error)
{
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, -1, &args, error))
        return NULL;
    for (gsize i = 0; args[i] != NULL; i++) {
        if (!vm_name_validate(args[i], error))
            return NULL;
        for (gsize j = 0; j < i; j++)
            if (strcmp(args[i], args[j]) == 0) {
                vmctl_usage_error(ctx, error, "'%s' is named twice", args[i]);
                return NULL;
            }
    }
    return g_steal_pointer(&args);
}

gboolean
vmctl_parse_command(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries,
                    char **ret_name, char ***ret_command, GError **error)
{
    g_auto(GStrv) args = args_copy(argc, argv);

    /* Two strict passes: options before NAME, then options between NAME and the command. */
    if (!parse_options(ctx, entries, TRUE, &args, error))
        return FALSE;
    args_drop_separator(args, 1);
    if (args[0] == NULL || args[1] == NULL)
        return vmctl_usage_error(ctx, error, "missing NAME");
    if (!vm_name_validate(args[1], error))
        return FALSE;
    g_autofree char *name = g_strdup(args[1]);
    args_remove(args, 1);
    if (!parse_options(ctx, entries, TRUE, &args, error))
        return FALSE;
    args_drop_separator(args, 1);

    args_remove(args, 0);
    *ret_name = g_steal_pointer(&name);
    *ret_command = g_steal_pointer(&args);
    return TRUE;
}

gboolean
vmctl_parse_uint(VmctlContext *ctx, const char *option, const char *text, guint32 min, guint32 max,
                 guint32 *ret_value, GError **error)
{
    guint64 value = 0;

    if (!g_ascii_string_to_unsigned(text, 10, min, max, &value, NULL))
        return vmctl_usage_error(ctx, error, "%s needs a number from %u to %u, not '%s'", option,
                                 min, max, text);
    *ret_value = (guint32)value;
    return TRUE;
}

gboolean
vmctl_insert_tail_options(VmctlContext *ctx, GVariantDict *fields, const char *lines,
                          gboolean follow, GError **error)
{
    if (lines != NULL) {
        guint32 n;

        if (!vmctl_parse_uint(ctx, "--lines", lines, 0, G_MAXUINT32 - 1, &n, error))
            return FALSE;
        g_variant_dict_insert(fields, "lines", "u", n);
    }
    g_variant_dict_insert(fields, "follow", "b", follow);
    return TRUE;
}

gboolean
vmctl_parse_size(VmctlContext *ctx, const char *option, const char *text, guint bare_mib,
                 guint64 max_mib, gboolean *ret_relative, guint64 *ret_mib, GError **error)
{
    static const struct {
        const char *suffix;
        guint64 mib;
    } units[] = {
        {"m", 1}, {"mib", 1}, {"g", 1024}, {"gib", 1024}, {"t", 1024 * 1024}, {"tib", 1024 * 1024},
    };
    gboolean relative = text[0] == '+';
    const char *p = relative ? text + 1 : text;
    gsize digits = strspn(p, "0123456789");
    guint64 unit = bare_mib;
    guint64 n = 0;

    if (digits > 0 && digits <= 12) {
        g_autofree char *number = g_strndup(p, digits);
        n = g_ascii_strtoull(number, NULL, 10);
    } else {
        digits = 0;
    }
    if (digits > 0 && p[digits] != '\0') {
        unit = 0;
        for (gsize i = 0; i < G_N_ELEMENTS(units); i++) {
            if (g_ascii_strcasecmp(p + digits, units[i].suffix) == 0)
                unit = units[i].mib;
        }
    }
    if (digits == 0 || unit == 0 || n == 0 || n > max_mib / unit)
        return vmctl_usage_error(
            ctx, error,
            "%s needs a size such as 512M, 20G or +5G (at most %" G_GUINT64_FORMAT "G), not '%s'",
            option, max_mib / 1024, text);
    *ret_relative = relative;
    *ret_mib = n * unit;
    return TRUE;
}

/* @text as an ISO 8601 time in @tz when it has no zone; GLib's parser wants seconds, which a
 * user often leaves out ("2024-05-01 14:00"), as the whole time of day ("2024-05-01"). */
static GDateTime *
parse_iso8601(const char *text, GTimeZone *tz)
{
    GDateTime *t = g_date_time_new_from_iso8601(text, tz);
    gsize len = strlen(text);
    g_autofree char *full = NULL;

    if (t != NULL)
        return t;
    if (len == 10)
        full = g_strconcat(text, "T00:00:00", NULL);
    else if (len >= 16 && text[13] == ':' && (text[16] == '\0' || strchr("Zz+-", text[16]) != NULL))
        full = g_strdup_printf("%.16s:00%s", text, text + 16);
    return full != NULL ? g_date_time_new_from_iso8601(full, tz) : NULL;
}

gboolean
vmctl_parse_time(VmctlContext *ctx, const char *option, const char *text, gint64 now_usec,
                 gint64 *ret_usec, GError **error)
{
    g_autoptr(GTimeZone) local = g_time_zone_new_local();
    g_autoptr(GDateTime) t = NULL;
    guint64 seconds = 0;

    if (vm_duration_parse(text, &seconds, NULL)) {
        *ret_usec = now_usec - (gint64)seconds * G_USEC_PER_SEC;
        return TRUE;
    }
    t = parse_iso8601(text, local);
    if (t == NULL) {
        g_autofree char *shown = g_strescape(text, NULL);

        return vmctl_usage_error(ctx, error,
                                 "%s needs a duration (90s, 10m, 2h, 3d) or an ISO 8601 time "
                                 "(2024-05-01T14:00:00, with or without a zone), not '%s'",
                                 option, shown);
    }
    *ret_usec = g_date_time_to_unix(t) * G_USEC_PER_SEC + g_date_time_get_microsecond(t);
    return TRUE;
}

char *
vmctl_socket_path(const VmctlContext *ctx, GError **error)
{
    const char *env = g_getenv("VMCTL_SOCKET");

    if (ctx->socket_path != NULL)
        return g_strdup(ctx->socket_path);
    if (env != NULL && env[0] != '\0')
        return g_strdup(env);
    g_auto(GStrv) candidates = vmctl_socket_candidates();
    return vmctl_socket_find((const char *const *)candidates, error);
}

gboolean
vmctl_endpoint(VmctlContext *ctx, VmctlEndpoint *ret_endpoint, GError **error)
{
    const char *env = g_getenv("VMCTL_HOST");

    if (ctx->remote == NULL && ctx->endpoint_path == NULL) {
        if (ctx->host != NULL && ctx->socket_path != NULL)
            return vmctl_usage_error(ctx, error,
                                     "--host and --socket do not go together (the remote "
                                     "socket goes in the URL: ssh://HOST/PATH)");
        if (ctx->host != NULL) {
            ctx->remote = vmctl_remote_parse(ctx->host, "--host", error);
        } else if (ctx->socket_path == NULL && env != NULL && env[0] != '\0') {
            ctx->remote = vmctl_remote_parse(env, "$VMCTL_HOST", error);
        } else {
            ctx->endpoint_path = vmctl_socket_path(ctx, error);
        }
        if (ctx->remote == NULL && ctx->endpoint_path == NULL)
            return FALSE;
    }
    *ret_endpoint = (VmctlEndpoint){.socket_path = ctx->endpoint_path, .remote = ctx->remote};
    return TRUE;
}

void
vmctl_context_clear(VmctlContext *ctx)
{
    g_clear_pointer(&ctx->socket_path, g_free);
    g_clear_pointer(&ctx->host, g_free);
    g_clear_pointer(&ctx->remote, vmctl_remote_free);
    g_clear_pointer(&ctx->endpoint_path, g_free);
}

VmctlProgressMode
vmctl_progress_mode(const VmctlContext *ctx)
{
    if (ctx->quiet)
        return VMCTL_PROGRESS_NONE;
    return isatty(STDERR_FILENO) ? VMCTL_PROGRESS_BAR : VMCTL_PROGRESS_LINES;
}

gboolean
vmctl_request(VmctlContext *ctx, VmOp op, GVariant *fields, VmMessage **ret_result, GError **error)
{
    g_autoptr(VmMessage) request = vm_message_new(op, fields, error);
    VmctlEndpoint endpoint;

    g_autoptr(VmctlRemote) followed = NULL;

    if (request == NULL || !vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;
    if (!vmctl_client_call(&endpoint, request, vmctl_progress_mode(ctx), ret_result, &followed,
                           error))
        return FALSE;
    /* The fleet sent it to another host: what the verb does next (ssh to the agent) goes there
     * too. */
    if (followed != NULL) {
        g_clear_pointer(&ctx->remote, vmctl_remote_free);
        g_clear_pointer(&ctx->endpoint_path, g_free);
        ctx->remote = g_steal_pointer(&followed);
    }
    return TRUE;
}

gboolean
vmctl_require_protocol(VmctlContext *ctx, guint32 version, const char *what, GError **error)
{
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_request(ctx, VM_OP_PING, NULL, &result, error))
        return FALSE;
    guint32 spoken = 0;
    g_variant_lookup(result->fields, "protocol", "u", &spoken);
    if (spoken < version)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "%s needs hostd's protocol %u; hostd speaks %u (an older hostd)", what,
                        version, spoken);
    return TRUE;
}

GVariant *
vmctl_result_get(const VmMessage *result, const char *key, const GVariantType *type)
{
    g_autoptr(GVariant) value = vmctl_dict_lookup(result->fields, key);

    if (value == NULL || !g_variant_is_of_type(value, type))
        return NULL;
    return g_steal_pointer(&value);
}

GVariant *
vmctl_result_rows(const VmMessage *result, const char *key)
{
    GVariant *rows = vmctl_result_get(result, key, G_VARIANT_TYPE("aa{sv}"));

    if (rows == NULL)
        rows = g_variant_ref_sink(g_variant_new_array(G_VARIANT_TYPE_VARDICT, NULL, 0));
    return rows;
}

void
vmctl_print_result(VmctlContext *ctx, const VmMessage *result, const char *key, const char *text)
{
    if (ctx->json) {
        g_autoptr(GVariant) value = key != NULL ? vm_message_lookup(result, key) : NULL;
        g_autofree char *json = vmctl_format_json(value != NULL ? value : result->fields);
        fputs(json, stdout);
    } else if (text != NULL) {
        puts(text);
    }
}

gboolean
vmctl_print_list(VmctlContext *ctx, VmOp op, GVariant *fields, const char *key,
                 const VmctlField *columns, gsize n_columns, GError **error)
{
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_request(ctx, op, fields, &result, error))
        return FALSE;
    g_autoptr(GVariant) rows = vmctl_result_rows(result, key);
    g_autofree char *text = ctx->json ? vmctl_format_json(rows)
                                      : vmctl_format_table(rows, columns, n_columns,
                                                           g_get_real_time() / G_USEC_PER_SEC);
    fputs(text, stdout);
    return TRUE;
}

gboolean
vmctl_agent_action(VmctlContext *ctx, VmOp op, GVariantDict *fields, const char *done,
                   GError **error)
{
    g_autofree char *name = NULL;
    g_autoptr(VmMessage) result = NULL;

    g_variant_dict_lookup(fields, "name", "s", &name);
    if (!vmctl_request(ctx, op, g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autofree char *text = g_strdup_printf("%s %s", done, name);
    vmctl_print_result(ctx, result, "agent", text);
    return TRUE;
}

gboolean
vmctl_agent_actions(VmctlContext *ctx, VmOp op, char **names, GVariantDict *fields,
                    const char *done, GError **error)
{
    g_autoptr(GVariant) common = g_variant_ref_sink(g_variant_dict_end(fields));
    g_autoptr(GVariantBuilder) results = g_variant_builder_new(G_VARIANT_TYPE("aa{sv}"));
    int first_failure = 0;

    if (names[1] == NULL) {
        g_autoptr(GVariantDict) one = g_variant_dict_new(common);
        g_variant_dict_insert(one, "name", "s", names[0]);
        return vmctl_agent_action(ctx, op, one, done, error);
    }
    /* One after the other, each answered before the next is sent: a failure stops none of
     * the others, and the output reads in the order the names were given. */
    for (gsize i = 0; names[i] != NULL; i++) {
        g_autoptr(GVariantDict) one = g_variant_dict_new(common);
        g_autoptr(VmMessage) result = NULL;
        g_autoptr(GError) local_error = NULL;
        g_auto(GVariantDict) row = G_VARIANT_DICT_INIT(NULL);

        g_variant_dict_insert(one, "name", "s", names[i]);
        g_variant_dict_insert(&row, "name", "s", names[i]);
        if (vmctl_request(ctx, op, g_variant_dict_end(one), &result, &local_error)) {
            g_autoptr(GVariant) agent = vm_message_lookup(result, "agent");
            g_variant_dict_insert_value(&row, "agent", agent != NULL ? agent : result->fields);
            if (!ctx->json)
                printf("%s %s\n", done, names[i]);
        } else if (g_error_matches(local_error, VM_ERROR, VM_ERROR_NOT_RUNNING) ||
                   g_error_matches(local_error, VM_ERROR, VM_ERROR_PERMISSION)) {
            /* No other name would fare better. */
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        } else {
            VmErrorCode code = vm_error_code(local_error);
            g_autofree char *message = vmctl_format_escaped_lines(local_error->message);
            g_autofree char *utf8 = g_utf8_make_valid(local_error->message, -1);

            g_variant_dict_insert_value(&row, "error",
                                        g_variant_new_parsed("{'code': <%s>, 'message': <%s>}",
                                                             vm_error_code_name(code), utf8));
            fflush(stdout);
            fprintf(stderr, "vmctl: %s: %s\n", names[i], message);
            if (first_failure == 0)
                first_failure = vm_error_exit_status(code);
        }
        g_variant_builder_add_value(results, g_variant_dict_end(&row));
        if (fflush(stdout) != 0)
            return vm_throw(error, VM_ERROR_IO, "cannot write the output");
    }
    if (ctx->json) {
        g_autoptr(GVariant) value = g_variant_ref_sink(g_variant_builder_end(results));
        g_autofree char *json = vmctl_format_json(value);
        fputs(json, stdout);
    }
    ctx->exit_status = first_failure;
    return TRUE;
}

gboolean
vmctl_dict_add_uint(VmctlContext *ctx, GVariantDict *fields, const char *option, const char *text,
                    const char *key, GError **error)
{
    guint32 value;

    if (text == NULL)
        return TRUE;
    if (!vmctl_parse_uint(ctx, option, text, 1, G_MAXUINT32, &value, error))
        return FALSE;
    g_variant_dict_insert(fields, key, "u", value);
    return TRUE;
}

/* Prints the whole lines in @pending, through @format when set, and keeps the rest. */
static gboolean
print_lines(GString *pending, VmctlLineFormat format, GError **error)
{
    char *nl;

    while ((nl = memchr(pending->str, '\n', pending->len)) != NULL) {
        g_autofree char *line = g_strndup(pending->str, nl - pending->str);
        g_autofree char *text = format != NULL ? format(line) : g_strdup(line);

        g_string_erase(pending, 0, nl - pending->str + 1);
        if (printf("%s\n", text) < 0 || fflush(stdout) != 0)
            return vm_throw(error, VM_ERROR_IO, "cannot write the output");
    }
    return TRUE;
}

/* One frame of a log's stream: its lines printed (the last one only once whole, or at the end),
 * a PROGRESS passed over. */
static gboolean
print_stream_frame(const VmMessage *m, GString *pending, VmctlLineFormat format, GError **error)
{
    const guint8 *data;
    gsize len = 0;

    switch (m->op) {
    case VM_OP_STDOUT:
        data = vm_message_get_data(m, "data", &len);
        g_string_append_len(pending, (const char *)data, (gssize)len);
        return print_lines(pending, format, error);
    case VM_OP_EXIT:
        g_string_append_c(pending, '\n');
        return pending->len == 1 || print_lines(pending, format, error);
    case VM_OP_PROGRESS:
        return TRUE;
    default: /* a log has no stderr */
        return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                        vm_op_name(m->op));
    }
}

gboolean
vmctl_print_stream(VmctlContext *ctx, VmOp op, GVariant *fields, VmctlLineFormat format,
                   GError **error)
{
    g_autoptr(GString) pending = g_string_new(NULL);
    g_autoptr(VmMessage) request = vm_message_new(op, fields, error);
    g_autoptr(VmctlConnection) connection = NULL;
    g_autoptr(VmctlRemote) followed = NULL;
    VmctlEndpoint endpoint;
    VmStreamReader reader;

    if (request == NULL || !vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;
    if (ctx->json)
        format = NULL;
    for (;;) {
        connection = vmctl_connection_open(&endpoint, error);
        if (connection == NULL)
            return FALSE;
        if (!vm_message_write_fd(vmctl_connection_get_fd(connection), request, error))
            return vmctl_connection_fail(connection, error);
        vm_stream_reader_init(&reader, vmctl_connection_get_fd(connection), request->op);
        g_autoptr(GError) local_error = NULL;
        g_autoptr(VmMessage) first = vm_stream_reader_next(&reader, &local_error);
        /* The agent is another host's in the fleet: the stream comes from there, once. */
        if (first == NULL && reader.elsewhere && followed == NULL) {
            g_autoptr(VmMessage) again = NULL;
            g_clear_pointer(&connection, vmctl_connection_free);
            if (!vmctl_follow_prepare(request, &reader.where, &followed, &again, error))
                return FALSE;
            g_clear_pointer(&request, vm_message_free);
            request = g_steal_pointer(&again);
            endpoint = (VmctlEndpoint){.remote = followed};
            continue;
        }
        if (first == NULL) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return vmctl_connection_fail(connection, error);
        }
        /* The first frame is the stream's: it goes through the loop below like the others. */
        if (!print_stream_frame(first, pending, format, error))
            return FALSE;
        if (first->op == VM_OP_EXIT)
            return TRUE;
        break;
    }
    for (;;) {
        g_autoptr(VmMessage) m = vm_stream_reader_next(&reader, error);

        if (m == NULL)
            return vmctl_connection_fail(connection, error);
        if (!print_stream_frame(m, pending, format, error))
            return FALSE;
        if (m->op == VM_OP_EXIT)
            return TRUE;
    }
}

char **
vmctl_read_ssh_keys(const char *const *files, GError **error)
{
    g_autoptr(GStrvBuilder) lines = g_strv_builder_new();
    guint n = 0;

    for (const char *const *file = files; *file != NULL; file++) {
        g_autoptr(GPtrArray) keys = vm_ssh_key_read_file(*file, VM_SSH_KEYS_MAX, error);
        if (keys == NULL)
            return NULL;
        n += keys->len;
        if (n > VM_SSH_KEYS_MAX) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "more than %d keys in all", VM_SSH_KEYS_MAX);
            return NULL;
        }
        for (guint i = 0; i < keys->len; i++) {
            g_autofree char *line = vm_ssh_key_to_line(keys->pdata[i]);
            g_strv_builder_add(lines, line);
        }
    }
    return g_strv_builder_end(lines);
}

char **
vmctl_split_rules(const char *const *options)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();

    for (const char *const *it = options; it != NULL && *it != NULL; it++) {
        g_auto(GStrv) pieces = g_strsplit(*it, ",", -1);

        for (char **piece = pieces; *piece != NULL; piece++) {
            g_strstrip(*piece);
            if (**piece != '\0')
                g_strv_builder_add(builder, *piece);
        }
    }
    return g_strv_builder_end(builder);
}
