/* The event log: every agent state change hostd makes or sees, and every request that changed
 * something, with time, agent, caller uid and outcome, appended durably as JSON lines to
 * <state dir>/events.log (bounded: rotated to events.log.1 past HOSTD_EVENTS_LOG_MAX). A leaf:
 * it knows the file and the record, not who writes them. See docs/LIFECYCLE.md. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define HOSTD_EVENTS_LOG     "events.log"
#define HOSTD_EVENTS_LOG_MAX (4 * 1024 * 1024)

typedef struct _HostdEvents HostdEvents;

/* One event. Every string but @event may be NULL (then the key is left out). */
typedef struct {
    const char *agent;   /* the agent it concerns; NULL: hostd itself */
    const char *event;   /* what happened: a request's op name ("agent-start"), or a change
                          * hostd saw or made ("crashed", "restarted", "poweroff", "saved"...) */
    const char *state;   /* the agent's state after it */
    gint64 uid;          /* the caller's uid; -1: hostd itself */
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

G_END_DECLS
