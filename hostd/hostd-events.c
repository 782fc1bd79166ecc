#include "hostd-events.h"

#include <json-glib/json-glib.h>
#include <string.h>

#include "hostd-logfile.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-util.h"

/* Bytes kept of the other strings: more than any valid name or state has, and a request with a
 * name that is no name is still an event, but not one of a megabyte. */
#define HOSTD_EVENTS_STRING_MAX 256

struct _HostdEvents {
    char *path;
    HostdLogFile *log;
};

HostdEvents *
hostd_events_new(const char *state_dir)
{
    HostdEvents *events = g_new0(HostdEvents, 1);

    events->path = g_build_filename(state_dir, HOSTD_EVENTS_LOG, NULL);
    /* Synced: an event is what is left to tell what happened after a crash of hostd or of the
     * host itself. */
    events->log = hostd_logfile_new(events->path, HOSTD_EVENTS_LOG_MAX, HOSTD_LOGFILE_SYNC);
    return events;
}

void
hostd_events_free(HostdEvents *events)
{
    if (events == NULL)
        return;
    hostd_logfile_free(events->log);
    g_free(events->path);
    g_free(events);
}

/* Adds @key: @value (NULL: nothing), made valid UTF-8 (a file name or a guest's words in an
 * error message may not be) and cut to @max bytes. */
static void
hostd_event_add_string(JsonBuilder *b, const char *key, const char *value, gsize max)
{
    g_autofree char *valid = NULL;

    if (value == NULL)
        return;
    valid = vm_utf8_cut(value, max);
    json_builder_set_member_name(b, key);
    json_builder_add_string_value(b, valid);
}

/* The event as one JSON object on one line (json-glib escapes newlines inside strings). */
static char *
hostd_event_to_line(const HostdEvent *event)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(GDateTime) now = g_date_time_new_now_utc();
    g_autofree char *time = g_date_time_format_iso8601(now);

    json_builder_begin_object(b);
    hostd_event_add_string(b, "time", time, HOSTD_EVENTS_STRING_MAX);
    hostd_event_add_string(b, "agent", event->agent, HOSTD_EVENTS_STRING_MAX);
    hostd_event_add_string(b, "event", event->event, HOSTD_EVENTS_STRING_MAX);
    hostd_event_add_string(b, "state", event->state, HOSTD_EVENTS_STRING_MAX);
    if (event->uid >= 0) {
        json_builder_set_member_name(b, "uid");
        json_builder_add_int_value(b, event->uid);
    }
    hostd_event_add_string(b, "caller", event->caller, HOSTD_EVENTS_STRING_MAX);
    hostd_event_add_string(b, "outcome", event->outcome, HOSTD_EVENTS_STRING_MAX);
    hostd_event_add_string(b, "detail", event->detail, HOSTD_EVENTS_DETAIL_MAX);
    json_builder_end_object(b);

    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

gboolean
hostd_events_append(HostdEvents *events, const HostdEvent *event, GError **error)
{
    g_autofree char *line = hostd_event_to_line(event);
    g_autoptr(GError) local_error = NULL;

    if (hostd_logfile_append(events->log, line, &local_error))
        return TRUE;
    /* Every failure is one of writing the file, to the caller (a line too long for the log
     * cannot be: the detail is cut). */
    return vm_throw(error, VM_ERROR_IO, "%s", local_error->message);
}

/* ---------------------------------------------------------------------------------------------
 * Reading */

/* Whether the log line @line (@len bytes, no newline) is an event @user_data (a
 * HostdEventsQuery) picks. */
static gboolean
hostd_events_match(const char *line, gsize len, gpointer user_data)
{
    const HostdEventsQuery *query = user_data;
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    JsonObject *o;

    if (!json_parser_load_from_data(parser, line, (gssize)len, NULL) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
        return FALSE;
    o = json_node_get_object(json_parser_get_root(parser));
    if (query->agent != NULL &&
        g_strcmp0(json_object_get_string_member_with_default(o, "agent", NULL), query->agent) != 0)
        return FALSE;
    if (query->since != 0) {
        const char *time = json_object_get_string_member_with_default(o, "time", NULL);
        g_autoptr(GDateTime) t = time != NULL ? g_date_time_new_from_iso8601(time, NULL) : NULL;

        if (t == NULL ||
            g_date_time_to_unix(t) * G_USEC_PER_SEC + g_date_time_get_microsecond(t) < query->since)
            return FALSE;
    }
    return TRUE;
}

/* @query as hostd_logfile_tail() and hostd_logfile_send() take it. */
static HostdLogFileQuery
hostd_events_log_query(const HostdEventsQuery *query)
{
    return (HostdLogFileQuery){
        .lines = query->lines,
        .follow = query->follow,
        .match = hostd_events_match,
        .user_data = (gpointer)query,
    };
}

char *
hostd_events_read(HostdEvents *events, const HostdEventsQuery *query)
{
    HostdLogFileQuery log_query = hostd_events_log_query(query);
    GString *text;

    log_query.follow = FALSE;
    text = hostd_logfile_tail(events->path, &log_query, NULL);
    return g_string_free(text, FALSE);
}

gboolean
hostd_events_send(HostdEvents *events, const HostdEventsQuery *query, VmStreamWriter *reply,
                  GError **error)
{
    HostdLogFileQuery log_query = hostd_events_log_query(query);

    /* Not whether it exists: the events of an agent that is gone are still there. */
    if (query->agent != NULL && !vm_name_validate(query->agent, error))
        return FALSE;
    hostd_logfile_send(events->path, &log_query, reply);
    return TRUE;
}
