#include "vmctl-output.h"

#include "vm-util.h"

#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define MINUTE    60
#define HOUR      (60 * MINUTE)
#define DAY       (24 * HOUR)
#define BAR_WIDTH 20

char *
vmctl_format_ago(gint64 then, gint64 now)
{
    gint64 delta = now - then;
    static const struct {
        gint64 seconds;
        const char *unit;
    } units[] = {{DAY, "day"}, {HOUR, "hour"}, {MINUTE, "minute"}, {1, "second"}};

    if (delta < 0)
        return g_strdup("in the future");
    if (delta < 2)
        return g_strdup("just now");
    if (delta >= 60 * (gint64)DAY) {
        g_autoptr(GDateTime) date = g_date_time_new_from_unix_local(then);
        if (date == NULL)
            return g_strdup("-");
        return g_date_time_format(date, "%Y-%m-%d");
    }
    for (gsize i = 0; i < G_N_ELEMENTS(units); i++) {
        gint64 count = delta / units[i].seconds;
        if (count > 0)
            return g_strdup_printf("%" G_GINT64_FORMAT " %s%s ago", count, units[i].unit,
                                   count == 1 ? "" : "s");
    }
    g_assert_not_reached();
}

/* Reads any integer GVariant; hostd may widen or narrow a field without breaking vmctl. */
static gboolean
variant_get_integer(GVariant *value, gint64 *ret_value)
{
    if (g_variant_is_of_type(value, G_VARIANT_TYPE_BYTE))
        *ret_value = g_variant_get_byte(value);
    else if (g_variant_is_of_type(value, G_VARIANT_TYPE_INT16))
        *ret_value = g_variant_get_int16(value);
    else if (g_variant_is_of_type(value, G_VARIANT_TYPE_UINT16))
        *ret_value = g_variant_get_uint16(value);
    else if (g_variant_is_of_type(value, G_VARIANT_TYPE_INT32))
        *ret_value = g_variant_get_int32(value);
    else if (g_variant_is_of_type(value, G_VARIANT_TYPE_UINT32))
        *ret_value = g_variant_get_uint32(value);
    else if (g_variant_is_of_type(value, G_VARIANT_TYPE_INT64))
        *ret_value = g_variant_get_int64(value);
    else if (g_variant_is_of_type(value, G_VARIANT_TYPE_UINT64))
        *ret_value = (gint64)MIN(g_variant_get_uint64(value), (guint64)G_MAXINT64);
    else
        return FALSE;
    return TRUE;
}

GVariant *
vmctl_dict_lookup(GVariant *dict, const char *key)
{
    GVariant *value = g_variant_lookup_value(dict, key, NULL);

    while (value != NULL && g_variant_is_of_type(value, G_VARIANT_TYPE_VARIANT)) {
        GVariant *inner = g_variant_get_variant(value);
        g_variant_unref(value);
        value = inner;
    }
    return value;
}

/* Strings may hold what a guest wrote (a crash reason, a label): shown escaped. */
static char *
format_text(GVariant *value)
{
    if (g_variant_is_of_type(value, G_VARIANT_TYPE_STRING))
        return vmctl_format_escaped(g_variant_get_string(value, NULL));
    return g_variant_print(value, FALSE);
}

static char *
format_date(gint64 then, gint64 now)
{
    g_autoptr(GDateTime) date = g_date_time_new_from_unix_local(then);
    g_autofree char *ago = vmctl_format_ago(then, now);

    if (date == NULL)
        return g_strdup("-");
    g_autofree char *text = g_date_time_format(date, "%Y-%m-%d %H:%M:%S");
    return g_strdup_printf("%s (%s)", text, ago);
}

char *
vmctl_format_value(GVariant *dict, const VmctlField *field, gint64 now)
{
    g_autoptr(GVariant) value = vmctl_dict_lookup(dict, field->key);
    gint64 number = 0;

    if (value == NULL)
        return g_strdup("-");
    if (field->format == VMCTL_FORMAT_YESNO && g_variant_is_of_type(value, G_VARIANT_TYPE_BOOLEAN))
        return g_strdup(g_variant_get_boolean(value) ? "yes" : "no");
    if (field->format == VMCTL_FORMAT_TEXT || !variant_get_integer(value, &number))
        return format_text(value);

    switch (field->format) {
    case VMCTL_FORMAT_MIB:
        return vm_format_bytes((guint64)MAX(number, 0) * 1024 * 1024);
    case VMCTL_FORMAT_GIB:
        return vm_format_bytes((guint64)MAX(number, 0) * 1024 * 1024 * 1024);
    case VMCTL_FORMAT_BYTES:
        return vm_format_bytes((guint64)MAX(number, 0));
    case VMCTL_FORMAT_AGO:
        return vmctl_format_ago(number, now);
    case VMCTL_FORMAT_DATE:
        return format_date(number, now);
    case VMCTL_FORMAT_TEXT:
    case VMCTL_FORMAT_YESNO:
    default:
        return format_text(value);
    }
}

char *
vmctl_format_agent_summary(GVariant *agent)
{
    static const VmctlField name_field = {"name", "name", VMCTL_FORMAT_TEXT};
    static const VmctlField state_field = {"state", "state", VMCTL_FORMAT_TEXT};
    g_autofree char *name = vmctl_format_value(agent, &name_field, 0);
    g_autofree char *state = vmctl_format_value(agent, &state_field, 0);
    g_autoptr(GVariant) port = vmctl_dict_lookup(agent, "ssh_port");
    gint64 number;

    if (port == NULL || !variant_get_integer(port, &number))
        return g_strdup_printf("agent %s is %s", name, state);
    return g_strdup_printf("agent %s is %s: ssh port %" G_GINT64_FORMAT
                           "; try: vmctl exec %s -- uname -a",
                           name, state, number, name);
}

static void
append_padded(GString *out, const char *text, gsize width)
{
    g_string_append(out, text);
    for (gsize n = g_utf8_strlen(text, -1); n < width; n++)
        g_string_append_c(out, ' ');
}

char *
vmctl_format_table(GVariant *rows, const VmctlField *fields, gsize n_fields, gint64 now)
{
    g_return_val_if_fail(g_variant_is_of_type(rows, G_VARIANT_TYPE("aa{sv}")), g_strdup(""));

    gsize n_rows = g_variant_n_children(rows);
    g_autoptr(GPtrArray) cells = g_ptr_array_new_with_free_func(g_free);
    g_autofree gsize *widths = g_new0(gsize, n_fields);
    GString *out = g_string_new(NULL);

    for (gsize c = 0; c < n_fields; c++) {
        g_ptr_array_add(cells, g_strdup(fields[c].label));
        widths[c] = g_utf8_strlen(fields[c].label, -1);
    }
    for (gsize r = 0; r < n_rows; r++) {
        g_autoptr(GVariant) row = g_variant_get_child_value(rows, r);
        for (gsize c = 0; c < n_fields; c++) {
            char *cell = vmctl_format_value(row, &fields[c], now);
            widths[c] = MAX(widths[c], (gsize)g_utf8_strlen(cell, -1));
            g_ptr_array_add(cells, cell);
        }
    }
    for (gsize r = 0; r <= n_rows; r++) {
        for (gsize c = 0; c < n_fields; c++) {
            const char *cell = g_ptr_array_index(cells, r * n_fields + c);
            if (c + 1 < n_fields) {
                append_padded(out, cell, widths[c]);
                g_string_append(out, "  ");
            } else {
                g_string_append(out, cell);
            }
        }
        g_string_append_c(out, '\n');
    }
    return g_string_free(out, FALSE);
}

char *
vmctl_format_details(GVariant *dict, const VmctlField *fields, gsize n_fields, gint64 now)
{
    g_return_val_if_fail(g_variant_is_of_type(dict, G_VARIANT_TYPE_VARDICT), g_strdup(""));

    g_autoptr(GPtrArray) labels = g_ptr_array_new();
    g_autoptr(GPtrArray) values = g_ptr_array_new_with_free_func(g_free);
    gsize width = 0;
    GVariantIter iter;
    const char *key;
    GString *out = g_string_new(NULL);

    for (gsize i = 0; i < n_fields; i++) {
        g_ptr_array_add(labels, (gpointer)fields[i].label);
        g_ptr_array_add(values, vmctl_format_value(dict, &fields[i], now));
    }
    /* Fields a newer hostd adds still show, under their key. */
    g_variant_iter_init(&iter, dict);
    while (g_variant_iter_next(&iter, "{&sv}", &key, NULL)) {
        gboolean known = FALSE;
        for (gsize i = 0; i < n_fields && !known; i++)
            known = strcmp(fields[i].key, key) == 0;
        if (!known) {
            VmctlField extra = {key, key, VMCTL_FORMAT_TEXT};
            g_ptr_array_add(labels, (gpointer)key);
            g_ptr_array_add(values, vmctl_format_value(dict, &extra, now));
        }
    }
    for (guint i = 0; i < labels->len; i++)
        width = MAX(width, (gsize)g_utf8_strlen(g_ptr_array_index(labels, i), -1) + 1);
    for (guint i = 0; i < labels->len; i++) {
        g_autofree char *label = g_strconcat(g_ptr_array_index(labels, i), ":", NULL);
        append_padded(out, label, width + 1);
        g_string_append(out, g_ptr_array_index(values, i));
        g_string_append_c(out, '\n');
    }
    return g_string_free(out, FALSE);
}

static char *
format_escaped(const char *text, gboolean keep_newlines)
{
    g_autofree char *valid = g_utf8_make_valid(text, -1);
    GString *out = g_string_sized_new(strlen(valid));

    for (const char *p = valid; *p != '\0'; p = g_utf8_next_char(p)) {
        gunichar c = g_utf8_get_char(p);

        if (c == '\n' && keep_newlines)
            g_string_append_c(out, '\n');
        else if (c == '\n')
            g_string_append(out, "\\n");
        else if (c == '\r')
            g_string_append(out, "\\r");
        else if (c == '\t')
            g_string_append(out, "\\t");
        else if (c < 0x20 || c == 0x7f)
            g_string_append_printf(out, "\\x%02x", c);
        else if (g_unichar_iscntrl(c))
            g_string_append_printf(out, "\\u%04x", c);
        else
            g_string_append_len(out, p, g_utf8_next_char(p) - p);
    }
    return g_string_free(out, FALSE);
}

char *
vmctl_format_escaped(const char *text)
{
    return format_escaped(text, FALSE);
}

char *
vmctl_format_escaped_lines(const char *text)
{
    return format_escaped(text, TRUE);
}

char *
vmctl_format_json(GVariant *value)
{
    g_autoptr(JsonNode) node = json_gvariant_serialize(value);
    g_autoptr(JsonGenerator) generator = json_generator_new();

    json_generator_set_pretty(generator, TRUE);
    json_generator_set_indent(generator, 2);
    json_generator_set_root(generator, node);
    g_autofree char *text = json_generator_to_data(generator, NULL);
    return g_strconcat(text, "\n", NULL);
}

char *
vmctl_format_progress(const char *message, double fraction, guint tick, guint width)
{
    static const char spinner[] = "|/-\\";
    GString *line = g_string_new(NULL);

    if (fraction >= 0 && fraction <= 1) {
        int filled = (int)floor(fraction * BAR_WIDTH);
        g_string_append_c(line, '[');
        for (int i = 0; i < BAR_WIDTH; i++)
            g_string_append_c(line, i < filled ? '#' : ' ');
        g_string_append_printf(line, "] %3d%% %s", (int)floor(fraction * 100), message);
    } else {
        g_string_append_printf(line, "%c %s", spinner[tick % 4], message);
    }
    if (width > 1 && (gsize)g_utf8_strlen(line->str, -1) > width - 1) {
        const char *cut = g_utf8_offset_to_pointer(line->str, width - 1);
        g_string_truncate(line, cut - line->str);
    }
    return g_string_free(line, FALSE);
}

struct VmctlProgress {
    VmctlProgressMode mode;
    FILE *stream;
    char *last_message;
    guint tick;
    gboolean shown; /* a bar line is on screen */
};

VmctlProgress *
vmctl_progress_new(VmctlProgressMode mode, FILE *stream)
{
    VmctlProgress *progress = g_new0(VmctlProgress, 1);

    progress->mode = mode;
    progress->stream = stream;
    return progress;
}

static guint
stream_width(FILE *stream)
{
    struct winsize size = {0};

    if (ioctl(fileno(stream), TIOCGWINSZ, &size) == 0 && size.ws_col > 0)
        return size.ws_col;
    return 80;
}

void
vmctl_progress_update(VmctlProgress *progress, const char *message, double fraction)
{
    switch (progress->mode) {
    case VMCTL_PROGRESS_LINES:
        if (g_strcmp0(progress->last_message, message) == 0)
            return;
        g_free(progress->last_message);
        progress->last_message = g_strdup(message);
        fprintf(progress->stream, "%s\n", message);
        break;
    case VMCTL_PROGRESS_BAR: {
        g_autofree char *line = vmctl_format_progress(message, fraction, progress->tick++,
                                                      stream_width(progress->stream));
        fprintf(progress->stream, "\r%s\033[K", line);
        progress->shown = TRUE;
        break;
    }
    case VMCTL_PROGRESS_NONE:
    default:
        return;
    }
    fflush(progress->stream);
}

void
vmctl_progress_clear(VmctlProgress *progress)
{
    if (!progress->shown)
        return;
    fputs("\r\033[K", progress->stream);
    fflush(progress->stream);
    progress->shown = FALSE;
}

void
vmctl_progress_free(VmctlProgress *progress)
{
    if (progress == NULL)
        return;
    vmctl_progress_clear(progress);
    g_free(progress->last_message);
    g_free(progress);
}

/* The bytes in @agent's field @key, as vm_format_bytes() writes them, or "-" when absent. */
static char *
stats_bytes(GVariant *agent, const char *key)
{
    g_autoptr(GVariant) value = vmctl_dict_lookup(agent, key);
    gint64 number = 0;

    if (value == NULL || !variant_get_integer(value, &number) || number < 0)
        return g_strdup("-");
    return vm_format_bytes((guint64)number);
}

/* "A / B" of two byte fields, "-" for either that is absent. */
static char *
stats_pair(GVariant *agent, const char *a, const char *b)
{
    g_autofree char *first = stats_bytes(agent, a);
    g_autofree char *second = stats_bytes(agent, b);

    return g_strdup_printf("%s / %s", first, second);
}

/* One agent's figures as the strings a stats table shows. */
static GVariant *
stats_row(GVariant *agent)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autoptr(GVariant) percent = vmctl_dict_lookup(agent, "cpu_percent");
    g_autoptr(GVariant) execs = vmctl_dict_lookup(agent, "execs");
    const VmctlField name = {"", "name", VMCTL_FORMAT_TEXT};
    const VmctlField state = {"", "state", VMCTL_FORMAT_TEXT};
    gint64 n = 0;

    g_variant_builder_add(&b, "{sv}", "name",
                          g_variant_new_take_string(vmctl_format_value(agent, &name, 0)));
    g_variant_builder_add(&b, "{sv}", "state",
                          g_variant_new_take_string(vmctl_format_value(agent, &state, 0)));
    if (percent != NULL && g_variant_is_of_type(percent, G_VARIANT_TYPE_DOUBLE))
        g_variant_builder_add(
            &b, "{sv}", "cpu",
            g_variant_new_take_string(g_strdup_printf("%.1f%%", g_variant_get_double(percent))));
    g_variant_builder_add(
        &b, "{sv}", "memory",
        g_variant_new_take_string(stats_pair(agent, "memory_used_bytes", "memory_bytes")));
    g_variant_builder_add(&b, "{sv}", "rss",
                          g_variant_new_take_string(stats_bytes(agent, "qemu_rss_bytes")));
    g_variant_builder_add(&b, "{sv}", "ksm",
                          g_variant_new_take_string(stats_bytes(agent, "ksm_merged_bytes")));
    g_variant_builder_add(&b, "{sv}", "disk",
                          g_variant_new_take_string(
                              stats_pair(agent, "disk_allocated_bytes", "disk_capacity_bytes")));
    g_variant_builder_add(
        &b, "{sv}", "checkpoints",
        g_variant_new_take_string(stats_bytes(agent, "checkpoints_allocated_bytes")));
    g_variant_builder_add(
        &b, "{sv}", "egress",
        g_variant_new_take_string(stats_pair(agent, "egress_bytes_up", "egress_bytes_down")));
    if (execs != NULL && variant_get_integer(execs, &n))
        g_variant_builder_add(&b, "{sv}", "execs",
                              g_variant_new_take_string(g_strdup_printf("%" G_GINT64_FORMAT, n)));
    return g_variant_builder_end(&b);
}

char *
vmctl_format_stats(GVariant *agents)
{
    /* clang-format off */
    static const VmctlField columns[] = {
        {"NAME", "name", VMCTL_FORMAT_TEXT},
        {"STATE", "state", VMCTL_FORMAT_TEXT},
        {"CPU", "cpu", VMCTL_FORMAT_TEXT},
        {"MEMORY USED/GIVEN", "memory", VMCTL_FORMAT_TEXT},
        {"QEMU RSS", "rss", VMCTL_FORMAT_TEXT},
        {"KSM", "ksm", VMCTL_FORMAT_TEXT},
        {"DISK USED/SIZE", "disk", VMCTL_FORMAT_TEXT},
        {"CHECKPOINTS", "checkpoints", VMCTL_FORMAT_TEXT},
        {"EGRESS UP/DOWN", "egress", VMCTL_FORMAT_TEXT},
        {"EXECS", "execs", VMCTL_FORMAT_TEXT},
    };
    /* clang-format on */
    g_auto(GVariantBuilder) rows = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    gsize n = g_variant_n_children(agents);

    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) agent = g_variant_get_child_value(agents, i);

        g_variant_builder_add_value(&rows, stats_row(agent));
    }
    g_autoptr(GVariant) table = g_variant_ref_sink(g_variant_builder_end(&rows));
    return vmctl_format_table(table, columns, G_N_ELEMENTS(columns), 0);
}

char *
vmctl_format_ksm(GVariant *ksm)
{
    g_autoptr(GVariant) saved = vmctl_dict_lookup(ksm, "saved_bytes");
    g_autoptr(GVariant) profit = vmctl_dict_lookup(ksm, "general_profit_bytes");
    const char *mode = NULL, *run = NULL;
    GString *line = g_string_new("KSM: ");
    gint64 number = 0;

    g_variant_lookup(ksm, "run", "&s", &run);
    g_variant_lookup(ksm, "mode", "&s", &mode);
    g_string_append_printf(line, "%s (hostd: ksm = %s)", run != NULL ? run : "unknown",
                           mode != NULL ? mode : "unknown");
    if (saved != NULL && variant_get_integer(saved, &number) && number >= 0) {
        g_autofree char *bytes = vm_format_bytes((guint64)number);
        g_string_append_printf(line, ", %s saved", bytes);
    }
    if (profit != NULL && variant_get_integer(profit, &number)) {
        g_autofree char *bytes = vm_format_bytes((guint64)ABS(number));
        g_string_append_printf(line, ", profit %s%s", number < 0 ? "-" : "", bytes);
    }
    g_string_append_c(line, '\n');
    return g_string_free(line, FALSE);
}
