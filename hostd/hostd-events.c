#include "hostd-events.h"

#include <errno.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <unistd.h>

#include "vm-error.h"

struct _HostdEvents {
    GMutex lock; /* appends */
    char *path;
    int fd; /* -1 until the first append */
};

HostdEvents *
hostd_events_new(const char *state_dir)
{
    HostdEvents *events = g_new0(HostdEvents, 1);
    g_mutex_init(&events->lock);
    events->path = g_build_filename(state_dir, HOSTD_EVENTS_LOG, NULL);
    events->fd = -1;
    return events;
}

void
hostd_events_free(HostdEvents *events)
{
    if (events == NULL)
        return;
    if (events->fd >= 0)
        close(events->fd);
    g_mutex_clear(&events->lock);
    g_free(events->path);
    g_free(events);
}

static void
hostd_event_add_string(JsonBuilder *b, const char *key, const char *value)
{
    if (value == NULL)
        return;
    json_builder_set_member_name(b, key);
    json_builder_add_string_value(b, value);
}

/* The event as one JSON object on one line (json-glib escapes newlines inside strings). */
static char *
hostd_event_to_line(const HostdEvent *event)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(GDateTime) now = g_date_time_new_now_utc();
    g_autofree char *time = g_date_time_format_iso8601(now);

    json_builder_begin_object(b);
    hostd_event_add_string(b, "time", time);
    hostd_event_add_string(b, "agent", event->agent);
    hostd_event_add_string(b, "event", event->event);
    hostd_event_add_string(b, "state", event->state);
    if (event->uid >= 0) {
        json_builder_set_member_name(b, "uid");
        json_builder_add_int_value(b, event->uid);
    }
    hostd_event_add_string(b, "outcome", event->outcome);
    hostd_event_add_string(b, "detail", event->detail);
    json_builder_end_object(b);

    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    json_generator_set_root(gen, root);
    g_autofree char *text = json_generator_to_data(gen, NULL);
    return g_strconcat(text, "\n", NULL);
}

gboolean
hostd_events_append(HostdEvents *events, const HostdEvent *event, GError **error)
{
    g_autofree char *line = hostd_event_to_line(event);
    gsize len = strlen(line);
    gboolean ok = TRUE;

    g_mutex_lock(&events->lock);
    if (events->fd < 0)
        events->fd = open(events->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (events->fd < 0 || write(events->fd, line, len) != (gssize)len ||
        fdatasync(events->fd) < 0) {
        int saved = errno;
        ok = vm_throw(error, VM_ERROR_IO, "cannot append to %s: %s", events->path,
                      g_strerror(saved));
    }
    g_mutex_unlock(&events->lock);
    return ok;
}
