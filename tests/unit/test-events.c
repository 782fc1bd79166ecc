/* The event log: what one append writes, which events a reader picks, and whole lines under
 * appends from many threads at once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <json-glib/json-glib.h>
#include <string.h>

#include "hostd-events.h"
#include "vm-error.h"
#include "test-common.h"

static char *
events_path(void **state)
{
    VmTestTmpDir *t = *state;

    return g_build_filename(t->dir, HOSTD_EVENTS_LOG, NULL);
}

static HostdEvents *
events_new(void **state)
{
    VmTestTmpDir *t = *state;

    return hostd_events_new(t->dir);
}

static void
append(HostdEvents *events, const HostdEvent *event)
{
    g_autoptr(GError) error = NULL;

    if (!hostd_events_append(events, event, &error))
        fail_msg("append: %s", error->message);
}

/* The one JSON object on @line. */
static JsonObject *
parse_line(const char *line)
{
    g_autoptr(JsonParser) parser = json_parser_new();
    g_autoptr(GError) error = NULL;

    if (!json_parser_load_from_data(parser, line, -1, &error))
        fail_msg("'%s' is no JSON: %s", line, error->message);
    assert_true(JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)));
    return json_object_ref(json_node_get_object(json_parser_get_root(parser)));
}

/* Each event is one line of JSON with the fields it was given, the time it was appended, and
 * nothing for what it left out. */
static void
test_append_lines(void **state)
{
    g_autofree char *path = events_path(state);
    g_autoptr(HostdEvents) events = events_new(state);
    g_autoptr(GDateTime) before = g_date_time_new_now_utc();
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;
    g_autoptr(GString) long_detail = g_string_new(NULL);

    append(events, &(HostdEvent){.agent = "alice",
                                 .event = "agent-start",
                                 .state = "running",
                                 .uid = 1000,
                                 .outcome = "ok"});
    append(events, &(HostdEvent){.event = "restarted", .uid = -1, .detail = "two\nlines"});
    while (long_detail->len <= HOSTD_EVENTS_DETAIL_MAX)
        g_string_append(long_detail, "é");
    append(events, &(HostdEvent){
                       .agent = "bad\xff", .event = "exec", .uid = 0, .detail = long_detail->str});
    append(events, &(HostdEvent){.agent = "alice",
                                 .event = "checkpoint-create",
                                 .uid = -1,
                                 .caller = "guest",
                                 .outcome = "ok"});

    text = vm_test_read_file(path);
    lines = g_strsplit(text, "\n", -1);
    assert_int_equal(g_strv_length(lines), 5);
    assert_string_equal(lines[4], "");
    assert_int_equal(vm_test_file_mode(path), 0600);

    {
        g_autoptr(JsonObject) o = parse_line(lines[0]);
        g_autoptr(GDateTime) t =
            g_date_time_new_from_iso8601(json_object_get_string_member(o, "time"), NULL);

        assert_non_null(t);
        assert_true(g_date_time_compare(t, before) >= 0);
        assert_true(g_str_has_suffix(json_object_get_string_member(o, "time"), "Z"));
        assert_string_equal(json_object_get_string_member(o, "agent"), "alice");
        assert_string_equal(json_object_get_string_member(o, "event"), "agent-start");
        assert_string_equal(json_object_get_string_member(o, "state"), "running");
        assert_int_equal(json_object_get_int_member(o, "uid"), 1000);
        assert_string_equal(json_object_get_string_member(o, "outcome"), "ok");
        assert_false(json_object_has_member(o, "detail"));
    }
    {
        g_autoptr(JsonObject) o = parse_line(lines[1]);

        assert_false(json_object_has_member(o, "agent"));
        assert_false(json_object_has_member(o, "uid"));
        assert_false(json_object_has_member(o, "state"));
        assert_string_equal(json_object_get_string_member(o, "detail"), "two\nlines");
    }
    {
        g_autoptr(JsonObject) o = parse_line(lines[2]);
        const char *detail = json_object_get_string_member(o, "detail");

        assert_true(g_utf8_validate(json_object_get_string_member(o, "agent"), -1, NULL));
        assert_int_equal(json_object_get_int_member(o, "uid"), 0);
        assert_true(strlen(detail) <= HOSTD_EVENTS_DETAIL_MAX);
        assert_true(strlen(detail) > HOSTD_EVENTS_DETAIL_MAX - 2);
        assert_true(g_utf8_validate(detail, -1, NULL));
    }
    {
        g_autoptr(JsonObject) o = parse_line(lines[3]);

        assert_false(json_object_has_member(o, "uid"));
        assert_string_equal(json_object_get_string_member(o, "caller"), "guest");
        assert_string_equal(json_object_get_string_member(o, "outcome"), "ok");
    }
    {
        g_autoptr(JsonObject) o = parse_line(lines[0]);

        assert_false(json_object_has_member(o, "caller"));
    }
}

/* A log as hostd may find it: events of two agents and of hostd, lines that are no event. */
static const char test_log[] =
    "{\"time\":\"2024-05-01T12:00:00Z\",\"agent\":\"a\",\"event\":\"agent-start\"}\n"
    "not json at all\n"
    "{\"time\":\"2024-05-01T12:00:01.500000Z\",\"agent\":\"b\",\"event\":\"agent-stop\"}\n"
    "[1, 2]\n"
    "{\"time\":\"2024-05-01T12:00:02Z\",\"event\":\"restarted\"}\n"
    "{\"time\":\"yesterday\",\"agent\":\"a\",\"event\":\"exec\"}\n"
    "{\"agent\":\"a\",\"event\":\"agent-rm\"}\n"
    "{\"time\":\"2024-05-01T12:00:03Z\",\"agent\":\"a\",\"event\":\"agent";

static gint64
usec(const char *iso)
{
    g_autoptr(GDateTime) t = g_date_time_new_from_iso8601(iso, NULL);

    assert_non_null(t);
    return g_date_time_to_unix(t) * G_USEC_PER_SEC + g_date_time_get_microsecond(t);
}

/* The events (their "event" members) of the lines @text, space-separated. */
static char *
event_names(const char *text)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    g_autoptr(GString) names = g_string_new(NULL);

    for (guint i = 0; lines[i] != NULL && lines[i][0] != '\0'; i++) {
        g_autoptr(JsonObject) o = parse_line(lines[i]);

        g_string_append_printf(names, "%s%s", names->len > 0 ? " " : "",
                               json_object_get_string_member(o, "event"));
    }
    return g_string_free(g_steal_pointer(&names), FALSE);
}

static void
assert_read(HostdEvents *events, const HostdEventsQuery *query, const char *expected)
{
    g_autofree char *text = hostd_events_read(events, query);
    g_autofree char *names = event_names(text);

    if (!g_str_equal(names, expected))
        fail_msg("expected '%s', got '%s' from:\n%s", expected, names, text);
}

/* Readers get the events, never a line that is no JSON object or one still being written; by
 * agent, by time (at or after), the last N of those. */
static void
test_read_filters(void **state)
{
    g_autofree char *path = events_path(state);
    g_autoptr(HostdEvents) events = events_new(state);

    vm_test_write_file(path, test_log);
    assert_read(events, &(HostdEventsQuery){.lines = G_MAXUINT32},
                "agent-start agent-stop restarted exec agent-rm");
    assert_read(events, &(HostdEventsQuery){.agent = "a", .lines = G_MAXUINT32},
                "agent-start exec agent-rm");
    assert_read(events, &(HostdEventsQuery){.agent = "c", .lines = G_MAXUINT32}, "");
    assert_read(events,
                &(HostdEventsQuery){.since = usec("2024-05-01T12:00:01.5Z"), .lines = G_MAXUINT32},
                "agent-stop restarted");
    assert_read(
        events,
        &(HostdEventsQuery){.since = usec("2024-05-01T12:00:01.500001Z"), .lines = G_MAXUINT32},
        "restarted");
    assert_read(events,
                &(HostdEventsQuery){
                    .agent = "a", .since = usec("2024-05-01T11:00:00Z"), .lines = G_MAXUINT32},
                "agent-start");
    assert_read(events, &(HostdEventsQuery){.lines = 2}, "exec agent-rm");
    assert_read(events, &(HostdEventsQuery){.agent = "b", .lines = 5}, "agent-stop");
    assert_read(events, &(HostdEventsQuery){.lines = 0}, "");

    /* Appended after a line cut short, a new event is read; the cut line stays no event. */
    append(events, &(HostdEvent){.agent = "a", .event = "agent-new", .uid = -1});
    assert_read(events, &(HostdEventsQuery){.agent = "a", .lines = 1}, "agent-new");
}

/* ---- many writers ---------------------------------------------------------------------------- */

#define WRITERS     8
#define EVENTS_EACH 40

typedef struct {
    HostdEvents *events;
    guint id;
} Writer;

static gpointer
writer_thread(gpointer data)
{
    Writer *w = data;
    g_autofree char *agent = g_strdup_printf("agent-%u", w->id);
    /* Long enough that a write of one event could be split if appends were not kept apart. */
    g_autofree char *detail = g_strnfill(1000 + w->id, 'a' + w->id);

    for (guint i = 0; i < EVENTS_EACH; i++) {
        g_autofree char *event = g_strdup_printf("e%u", i);

        append(
            w->events,
            &(HostdEvent){
                .agent = agent, .event = event, .uid = w->id, .outcome = "ok", .detail = detail});
    }
    return NULL;
}

/* Eight threads appending at once leave every event, each a whole line, each thread's in the
 * order it appended them. */
static void
test_concurrent_appends(void **state)
{
    g_autofree char *path = events_path(state);
    g_autoptr(HostdEvents) events = events_new(state);
    Writer writers[WRITERS];
    GThread *threads[WRITERS];
    guint next[WRITERS] = {0};
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;

    for (guint i = 0; i < WRITERS; i++) {
        writers[i] = (Writer){.events = events, .id = i};
        threads[i] = g_thread_new("writer", writer_thread, &writers[i]);
    }
    for (guint i = 0; i < WRITERS; i++)
        g_thread_join(threads[i]);

    text = vm_test_read_file(path);
    lines = g_strsplit(text, "\n", -1);
    assert_int_equal(g_strv_length(lines), WRITERS * EVENTS_EACH + 1);
    for (guint i = 0; i < WRITERS * EVENTS_EACH; i++) {
        g_autoptr(JsonObject) o = parse_line(lines[i]);
        guint id = (guint)json_object_get_int_member(o, "uid");
        g_autofree char *agent = g_strdup_printf("agent-%u", id);
        g_autofree char *event = g_strdup_printf("e%u", next[id]++);
        g_autofree char *detail = g_strnfill(1000 + id, 'a' + id);

        assert_true(id < WRITERS);
        assert_string_equal(json_object_get_string_member(o, "agent"), agent);
        assert_string_equal(json_object_get_string_member(o, "event"), event);
        assert_string_equal(json_object_get_string_member(o, "detail"), detail);
    }
    for (guint i = 0; i < WRITERS; i++)
        assert_int_equal(next[i], EVENTS_EACH);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_append_lines, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_read_filters, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_appends, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
