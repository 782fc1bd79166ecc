/* Agent power beyond running and stopped: paused (vCPUs stopped, RAM kept), saved (RAM written
 * to disk, no QEMU process), waking on use, and the idle loop that suspends agents by itself.
 * See docs/IDLE.md. */
#pragma once

#include "hostd-context.h"
#include "hostd-guest.h"
#include "vm-trace.h"

G_BEGIN_DECLS

/* Power as a component of the context: relays a new agent's port (agent_ready), forgets a
 * removed one, stops the idle loop when the context goes. */
extern const HostdComponent hostd_power_component;

/* Starts the relay that owns every agent's public SSH port and the idle loop, and attaches the
 * agents that have a backend port. Appends a note per agent it could not attach. */
gboolean hostd_power_start(HostdContext *ctx, GPtrArray *notes, GError **error);

/* Stops the idle loop and the relay (agents keep their state). Accepts a context never started. */
void hostd_power_stop(HostdContext *ctx);

/* Puts @r's public port under the relay (new agents); no-op for agents without a backend port or
 * before hostd_power_start(). Fails with VM_ERROR_NO_RESOURCES when the port is taken. */
gboolean hostd_power_attach(HostdContext *ctx, const HostdAgentRecord *r, GError **error);

/* Releases @name's public port and forgets its power state. Can't fail. */
void hostd_power_detach(HostdContext *ctx, const char *name);

/* Makes a paused or saved agent run again (resume, or restore of the saved image; a saved image
 * that cannot be restored falls back to a cold boot, nothing lost), then sets the guest clock.
 * Running is success; stopped fails with VM_ERROR_BAD_STATE. Takes the agent lock. */
gboolean hostd_power_wake(HostdContext *ctx, const char *name, GError **error);

/* Same, with the agent lock already held by the caller. */
gboolean hostd_power_wake_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                 GError **error);

/* Same, marking its phases in @trace (may be NULL); when it woke the agent, the clock is set on a
 * thread of its own, returned in *@ret_clock for the caller to finish before the guest runs
 * anything that reads the time (NULL there when nothing woke). */
gboolean hostd_power_wake_traced(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                 VmTrace *trace, HostdClockSync **ret_clock, GError **error);

/* Pauses (or with @save, saves) a running agent by hand. Returns its info dictionary. */
GVariant *hostd_agent_suspend(HostdContext *ctx, const char *name, gboolean save, GError **error);

/* Wakes an agent by hand. Returns its info dictionary. */
GVariant *hostd_agent_resume(HostdContext *ctx, const char *name, GError **error);

/* Holds @name awake for @seconds (0: until hostd restarts or `--off`); @off releases it. */
GVariant *hostd_agent_keep_awake(HostdContext *ctx, const char *name, guint seconds, gboolean off,
                                 GError **error);

/* Holds @name awake for at least @seconds from now, without waking it: a later deadline already
 * in force, or a hold until released, stays as it is. Returns the deadline in force afterwards
 * (g_get_monotonic_time() microseconds; G_MAXINT64: until released); 0 before
 * hostd_power_start(), when nothing holds anything. Can't fail. For the in-guest API, whose
 * caller is running. */
gint64 hostd_power_hold_awake(HostdContext *ctx, const char *name, guint seconds);

/* The keep-awake deadline of @name as hostd_power_hold_awake() returns it; 0 when none is in
 * force (never set, released, or passed). Can't fail. */
gint64 hostd_power_awake_until(HostdContext *ctx, const char *name);

/* Sets @name's idle policy: @never, or pause after @pause_s and save after @save_s seconds of
 * idleness (0 turns a level off). Stored in the agent's record. */
GVariant *hostd_agent_set_idle(HostdContext *ctx, const char *name, gboolean never, guint pause_s,
                               guint save_s, GError **error);

/* Marks a vmctl exec session open / closed on @name: an open one keeps the agent awake. */
void hostd_power_session_begin(HostdContext *ctx, const char *name);
void hostd_power_session_end(HostdContext *ctx, const char *name);

G_END_DECLS
