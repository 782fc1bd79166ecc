/* A trace of where the time of one operation went: phases marked as they end, each with the
 * milliseconds since the previous mark, for a debug log line and the benches. Cheap enough to
 * take on every operation; a NULL trace takes marks and does nothing. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct {
    const char *phase; /* static */
    gint64 when;       /* monotonic us */
} VmTraceMark;

typedef struct {
    gint64 start; /* monotonic us */
    gint64 last;
    GString *phases;
    GArray *marks; /* VmTraceMark, in order: what another process replays (vm_trace_mark_at) */
} VmTrace;

/* Starts @trace now. Can't fail. */
void vm_trace_init(VmTrace *trace);

/* Ends the phase @phase (a static string) now. @trace may be NULL, or one never started (all
 * zero): then nothing happens. */
void vm_trace_mark(VmTrace *trace, const char *phase);

/* Ends the phase @phase (copied) at @when, a g_get_monotonic_time() of this or another process
 * of this machine (a mark another process took), kept between the last mark and now: a time
 * out of order is not believed. Else as vm_trace_mark(). */
void vm_trace_mark_at(VmTrace *trace, const char *phase, gint64 when);

/* "@what: PHASE N.NN ms, ...; total N.NN ms", newly allocated; @trace is cleared. */
char *vm_trace_finish(VmTrace *trace, const char *what);

/* Frees what an unfinished @trace holds. Can't fail. */
void vm_trace_clear(VmTrace *trace);

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(VmTrace, vm_trace_clear)

G_END_DECLS
