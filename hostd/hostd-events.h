/* The event log: every agent state change hostd makes or sees, and every request that changed
 * something, with time, agent, caller uid and outcome, appended durably as JSON lines to
 * <state dir>/events.log (bounded: rotated to events.log.1 past HOSTD_EVENTS_LOG_MAX). A leaf:
 * it knows the file and the record, not who writes them. See docs/EVENTS.md. */
#pragma once

#include <glib.h>

#include "vm-stream.h"

G_BEGIN_DECLS

#define HOSTD_EVENTS_LOG     "events.log"
#define HOSTD_EVENTS_LOG_MAX (4 * 1024 * 1024)
/* An event's detail is cut to this many bytes (of valid UTF-8). */
#define HOSTD_EVENTS_DETAIL_MAX 4096

typedef struct _HostdEvents HostdEvents;

/* One event. Every string but @event may be NULL (then the key is left out). */
typedef struct {
    const char *agent;   /* the agent it concerns; NULL: hostd itself */
    const char *event;   /* what happened: a request's op name ("agent-start"), or a change
                          * hostd saw or made ("crashed", "restarted", "poweroff", "saved"...) */
    const char *state;   /* the agent's state after it */
    gint64 uid;          /* the caller's uid; -1: hostd itself, or a caller with none */
    const char *caller;  /* who asked when it was no uid: "guest" for the agent itself, through
                          * its in-guest API; NULL: the uid says (or hostd itself) */
    const char *outcome; /* requests: "ok", or "error" when it failed; NULL for what hostd saw */
    const char *detail;  /* one human-readable line: why, or the error's message */
} HostdEvent;

/* The log at <@state_dir>/events.log; the file is opened on first append. Can't fail. */
HostdEvents *hostd_events_new(const char *state_dir);
void hostd_events_free(HostdEvents *events);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdEvents, hostd_events_free)

/* Appends @event, stamped with the current time, as one JSON line, and syncs it to disk. Safe
 * from any thread. An event that cannot be written is returned as VM_ERROR_IO (the caller
 * decides whether that is worth a log line: losing an event never fails the operation). */
gboolean hostd_events_append(HostdEvents *events, const HostdEvent *event, GError **error);

/* Which events a reader wants. Lines of the log that are not JSON objects are never picked. */
typedef struct {
    const char *agent; /* only this agent's; NULL: every event, hostd's own too */
    gint64 since;      /* only those at or after this time (unix microseconds); 0: all */
    guint lines;       /* only the last this many of those; G_MAXUINT32: all */
    gboolean follow;   /* hostd_events_send(): then new ones as they come */
} HostdEventsQuery;

/* The events @query picks (follow aside), oldest first, as the JSON lines of the log, each
 * ending in a newline ("" for none). Newly allocated; can't fail. */
char *hostd_events_read(HostdEvents *events, const HostdEventsQuery *query);

/* Answers a request for events on @reply: what hostd_events_read() returns as STDOUT frames of
 * whole lines, then with @query->follow each new event it picks as it is appended (across
 * rotations) until the client closes its end, then EXIT {status 0}. A @query->agent that is no
 * valid agent name fails with VM_ERROR_INVALID_ARGUMENT before anything was sent; a client that
 * goes away ends the stream early, which is no failure. */
gboolean hostd_events_send(HostdEvents *events, const HostdEventsQuery *query,
                           VmStreamWriter *reply, GError **error);

G_END_DECLS
