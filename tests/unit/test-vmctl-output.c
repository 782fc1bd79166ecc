/* vmctl's formatting: relative times, units, tables, details, JSON, the progress line. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmctl-output.h"

#define NOW G_GINT64_CONSTANT(1700000000) /* 2023-11-14 22:13:20 UTC */

static void
test_format_ago(void **state)
{
    static const struct {
        gint64 delta;
        const char *expected;
    } cases[] = {
        {-5, "in the future"},          {0, "just now"},        {1, "just now"},
        {2, "2 seconds ago"},           {59, "59 seconds ago"}, {60, "1 minute ago"},
        {119, "1 minute ago"},          {120, "2 minutes ago"}, {3600, "1 hour ago"},
        {3 * 3600 + 59, "3 hours ago"}, {86400, "1 day ago"},   {59 * 86400, "59 days ago"},
        {60 * 86400, "2023-09-15"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *text = vmctl_format_ago(NOW - cases[i].delta, NOW);
        assert_string_equal(text, cases[i].expected);
    }
}

static void
test_format_value(void **state)
{
    g_autoptr(GVariant) dict = g_variant_ref_sink(g_variant_new_parsed(
        "{'name': <'a1'>, 'cpus': <uint32 2>, 'memory_mib': <uint32 2048>,"
        " 'disk_gib': <uint32 10>, 'disk_bytes': <uint64 1610612736>, 'ready': <true>,"
        " 'busy': <false>, 'created': <int64 1699999700>, 'boxed': <<'inner'>>,"
        " 'odd': <'many'>, 'list': <['x', 'y']>, 'small': <uint64 512>}"));
    static const struct {
        VmctlField field;
        const char *expected;
    } cases[] = {
        {{"", "name", VMCTL_FORMAT_TEXT}, "a1"},
        {{"", "missing", VMCTL_FORMAT_TEXT}, "-"},
        {{"", "missing", VMCTL_FORMAT_MIB}, "-"},
        {{"", "cpus", VMCTL_FORMAT_TEXT}, "2"},
        {{"", "memory_mib", VMCTL_FORMAT_MIB}, "2 GiB"},
        {{"", "disk_gib", VMCTL_FORMAT_GIB}, "10 GiB"},
        {{"", "disk_bytes", VMCTL_FORMAT_BYTES}, "1.5 GiB"},
        {{"", "small", VMCTL_FORMAT_BYTES}, "512 B"},
        {{"", "ready", VMCTL_FORMAT_YESNO}, "yes"},
        {{"", "busy", VMCTL_FORMAT_YESNO}, "no"},
        {{"", "created", VMCTL_FORMAT_AGO}, "5 minutes ago"},
        {{"", "boxed", VMCTL_FORMAT_TEXT}, "inner"},
        /* A value of an unexpected type shows as it is rather than vanishing. */
        {{"", "odd", VMCTL_FORMAT_MIB}, "many"},
        {{"", "list", VMCTL_FORMAT_TEXT}, "['x', 'y']"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *text = vmctl_format_value(dict, &cases[i].field, NOW);
        assert_string_equal(text, cases[i].expected);
    }
}

static void
test_format_date(void **state)
{
    g_autoptr(GVariant) dict =
        g_variant_ref_sink(g_variant_new_parsed("{'created': <int64 1699999700>}"));
    const VmctlField field = {"created", "created", VMCTL_FORMAT_DATE};
    g_autofree char *text = vmctl_format_value(dict, &field, NOW);

    assert_string_equal(text, "2023-11-14 22:08:20 (5 minutes ago)");
}

static const VmctlField columns[] = {
    {"NAME", "name", VMCTL_FORMAT_TEXT},
    {"STATE", "state", VMCTL_FORMAT_TEXT},
    {"MEMORY", "memory_mib", VMCTL_FORMAT_MIB},
    {"CREATED", "created", VMCTL_FORMAT_AGO},
};

static void
test_format_table(void **state)
{
    g_autoptr(GVariant) rows = g_variant_ref_sink(g_variant_new_parsed(
        "[{'name': <'a1'>, 'state': <'running'>, 'memory_mib': <uint32 2048>,"
        "  'created': <int64 1699996400>},"
        " {'name': <'long-agent-name'>, 'state': <'stopped'>, 'created': <int64 1699999990>}]"));
    g_autofree char *text = vmctl_format_table(rows, columns, G_N_ELEMENTS(columns), NOW);

    assert_string_equal(text, "NAME             STATE    MEMORY  CREATED\n"
                              "a1               running  2 GiB   1 hour ago\n"
                              "long-agent-name  stopped  -       10 seconds ago\n");
}

static void
test_format_table_empty(void **state)
{
    g_autoptr(GVariant) rows =
        g_variant_ref_sink(g_variant_new_array(G_VARIANT_TYPE_VARDICT, NULL, 0));
    g_autofree char *text = vmctl_format_table(rows, columns, G_N_ELEMENTS(columns), NOW);

    assert_string_equal(text, "NAME  STATE  MEMORY  CREATED\n");
}

static void
test_format_details(void **state)
{
    static const VmctlField fields[] = {
        {"name", "name", VMCTL_FORMAT_TEXT},
        {"ssh port", "ssh_port", VMCTL_FORMAT_TEXT},
        {"forked from", "forked_from", VMCTL_FORMAT_TEXT},
    };
    g_autoptr(GVariant) dict = g_variant_ref_sink(
        g_variant_new_parsed("{'name': <'a1'>, 'ssh_port': <uint32 2201>, 'zone': <'eu'>}"));
    g_autofree char *text = vmctl_format_details(dict, fields, G_N_ELEMENTS(fields), NOW);

    /* Unknown keys from a newer hostd still show, after the known ones. */
    assert_string_equal(text, "name:        a1\n"
                              "ssh port:    2201\n"
                              "forked from: -\n"
                              "zone:        eu\n");
}

static void
test_format_json(void **state)
{
    g_autoptr(GVariant) rows = g_variant_ref_sink(
        g_variant_new_parsed("[{'name': <'a1'>, 'cpus': <uint32 2>, 'disk_bytes': <uint64 1024>,"
                             "  'created': <int64 -1>, 'ready': <true>}]"));
    g_autofree char *text = vmctl_format_json(rows);

    /* Variants are unboxed: a script sees plain numbers, strings and booleans. */
    assert_string_equal(text, "[\n"
                              "  {\n"
                              "    \"name\" : \"a1\",\n"
                              "    \"cpus\" : 2,\n"
                              "    \"disk_bytes\" : 1024,\n"
                              "    \"created\" : -1,\n"
                              "    \"ready\" : true\n"
                              "  }\n"
                              "]\n");
}

static void
test_format_progress(void **state)
{
    static const struct {
        const char *message;
        double fraction;
        guint tick;
        guint width;
        const char *expected;
    } cases[] = {
        {"building", 0.25, 0, 80, "[#####               ]  25% building"},
        {"building", 0.0, 0, 80, "[                    ]   0% building"},
        {"done", 1.0, 0, 80, "[####################] 100% done"},
        {"booting", -1, 0, 80, "| booting"},
        {"booting", -1, 1, 80, "/ booting"},
        {"booting", -1, 3, 80, "\\ booting"},
        /* Out of range is "unknown", not a broken bar. */
        {"booting", 1.5, 2, 80, "- booting"},
        /* Never as wide as the terminal, so the line does not wrap. */
        {"a long message", -1, 0, 8, "| a lon"},
        {"caf\xc3\xa9 cr\xc3\xa8me", -1, 0, 8, "| caf\xc3\xa9 "},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *text = vmctl_format_progress(cases[i].message, cases[i].fraction,
                                                      cases[i].tick, cases[i].width);
        assert_string_equal(text, cases[i].expected);
    }
}

/* Runs @messages through a display in @mode and returns what it wrote. */
static char *
progress_output(VmctlProgressMode mode, const char *const *messages, const double *fractions,
                gsize n)
{
    char *buffer = NULL;
    size_t size = 0;
    FILE *stream = open_memstream(&buffer, &size);

    assert_non_null(stream);
    VmctlProgress *progress = vmctl_progress_new(mode, stream);
    for (gsize i = 0; i < n; i++)
        vmctl_progress_update(progress, messages[i], fractions[i]);
    vmctl_progress_free(progress);
    fclose(stream);
    return buffer;
}

static void
test_progress_lines(void **state)
{
    static const char *const messages[] = {"downloading", "downloading", "downloading",
                                           "installing", "downloading"};
    static const double fractions[] = {0.1, 0.2, 0.3, -1, -1};
    g_autofree char *lines = progress_output(VMCTL_PROGRESS_LINES, messages, fractions, 5);
    g_autofree char *none = progress_output(VMCTL_PROGRESS_NONE, messages, fractions, 5);

    /* Each change of message once, no fractions, nothing to erase at the end. */
    assert_string_equal(lines, "downloading\ninstalling\ndownloading\n");
    assert_string_equal(none, "");
}

static void
test_progress_bar(void **state)
{
    static const char *const messages[] = {"downloading", "booting"};
    static const double fractions[] = {0.5, -1};
    g_autofree char *bar = progress_output(VMCTL_PROGRESS_BAR, messages, fractions, 2);

    /* Redrawn in place, and erased when done. */
    assert_string_equal(bar, "\r[##########          ]  50% downloading\033[K"
                             "\r/ booting\033[K"
                             "\r\033[K");
}

static void
test_agent_summary(void **state)
{
    static const struct {
        const char *agent;
        const char *expected;
    } cases[] = {
        {"{'name': <'a1'>, 'state': <'running'>, 'ssh_port': <uint32 2201>}",
         "agent a1 is running: ssh port 2201; try: vmctl exec a1 -- uname -a"},
        {"{'name': <'a2'>, 'state': <'starting'>}", "agent a2 is starting"},
        {"{'name': <'a3'>}", "agent a3 is -"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GVariant) agent = g_variant_ref_sink(g_variant_new_parsed(cases[i].agent));
        g_autofree char *text = vmctl_format_agent_summary(agent);
        assert_string_equal(text, cases[i].expected);
    }
}

/* Text from a file or a guest shows its control characters escaped, and nothing else changed. */
static void
test_format_escaped(void **state)
{
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"", ""},
        {"plain text, 'quoted' \\ back", "plain text, 'quoted' \\ back"},
        {"a\nb\tc\rd", "a\\nb\\tc\\rd"},
        {"\x1b[2Jclear", "\\x1b[2Jclear"},
        {"bell\x07 del\x7f", "bell\\x07 del\\x7f"},
        {"csi \xc2\x9b c1", "csi \\u009b c1"},
        {"h\xc3\xa9llo \xe2\x82\xac", "h\xc3\xa9llo \xe2\x82\xac"},
        {"bad \xff byte", "bad \xef\xbf\xbd byte"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *out = vmctl_format_escaped(cases[i].in);

        assert_string_equal(out, cases[i].out);
    }
}

/* vmctl stats' table: each figure in its unit, "-" for what an agent lacks (a stopped agent,
 * a guest whose balloon does not report, no proxy). */
static void
test_format_stats(void **state)
{
    g_autoptr(GVariant) agents = g_variant_parse(
        G_VARIANT_TYPE("aa{sv}"),
        "[{'name': <'a1'>, 'state': <'running'>, 'vcpus': <uint32 2>,"
        "  'cpu_percent': <12.345>, 'memory_bytes': <uint64 1073741824>,"
        "  'memory_used_bytes': <uint64 160432128>, 'qemu_rss_bytes': <uint64 515899392>,"
        "  'ksm_merged_bytes': <uint64 314572800>,"
        "  'disk_capacity_bytes': <uint64 8589934592>, 'disk_allocated_bytes': <uint64 8192000>,"
        "  'checkpoints_allocated_bytes': <uint64 0>, 'egress_bytes_up': <uint64 1536>,"
        "  'egress_bytes_down': <uint64 3145728>, 'execs': <uint64 42>},"
        " {'name': <'b2'>, 'state': <'stopped'>, 'memory_bytes': <uint64 536870912>,"
        "  'disk_capacity_bytes': <uint64 8589934592>, 'execs': <uint64 0>}]",
        NULL, NULL, NULL);
    g_autofree char *table = vmctl_format_stats(agents);

    assert_string_equal(
        table, "NAME  STATE    CPU    MEMORY USED/GIVEN  QEMU RSS  KSM      DISK USED/SIZE   "
               "CHECKPOINTS  EGRESS UP/DOWN   EXECS\n"
               "a1    running  12.3%  153 MiB / 1 GiB    492 MiB   300 MiB  7.8 MiB / 8 GiB  "
               "0 B          1.5 KiB / 3 MiB  42\n"
               "b2    stopped  -      - / 512 MiB        -         -        - / 8 GiB        "
               "-            - / -            0\n");
}

/* The host's KSM line: its state and hostd's setting, what it saves and its profit (negative
 * too); only what hostd sent. */
static void
test_format_ksm(void **state)
{
    g_autoptr(GVariant) full =
        g_variant_parse(G_VARIANT_TYPE_VARDICT,
                        "{'mode': <'auto'>, 'run': <'running'>, 'pages_shared': <uint64 1000>,"
                        " 'pages_sharing': <uint64 307200>, 'saved_bytes': <uint64 1258291200>,"
                        " 'general_profit_bytes': <int64 -2048>}",
                        NULL, NULL, NULL);
    g_autoptr(GVariant) bare =
        g_variant_parse(G_VARIANT_TYPE_VARDICT, "{'mode': <'on'>}", NULL, NULL, NULL);
    g_autofree char *line = vmctl_format_ksm(full);
    g_autofree char *bare_line = vmctl_format_ksm(bare);

    assert_string_equal(line, "KSM: running (hostd: ksm = auto), 1.2 GiB saved, profit -2 KiB\n");
    assert_string_equal(bare_line, "KSM: unknown (hostd: ksm = on)\n");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_ago),         cmocka_unit_test(test_format_value),
        cmocka_unit_test(test_format_date),        cmocka_unit_test(test_format_table),
        cmocka_unit_test(test_format_table_empty), cmocka_unit_test(test_format_details),
        cmocka_unit_test(test_format_json),        cmocka_unit_test(test_format_progress),
        cmocka_unit_test(test_progress_lines),     cmocka_unit_test(test_progress_bar),
        cmocka_unit_test(test_agent_summary),      cmocka_unit_test(test_format_escaped),
        cmocka_unit_test(test_format_stats),       cmocka_unit_test(test_format_ksm),
    };

    /* Dates are shown in local time: pin it. */
    setenv("TZ", "UTC", 1);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
