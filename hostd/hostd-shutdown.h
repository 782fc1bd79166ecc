/* Saving every running agent at once: what hostd does on SIGTERM with shutdown = save (a host
 * shutdown or `systemctl stop hostd`), and what `vmctl stop-host-agents` asks for maintenance.
 * Each agent's RAM goes to disk with its processes, so it comes back as it was: woken by the
 * first connection, or at once at the next start with shutdown-resume = eager. See
 * docs/LIFECYCLE.md. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Saves every running or paused agent, HOSTD_SAVE_ALL_JOBS at a time, within @timeout_s: an
 * agent not saved by then is left running (a save under way is aborted). Each saved agent is
 * recorded as wanted saved by a shutdown, with an event saying @why. Returns an aa{sv} with one
 * dictionary per agent it tried (name, saved, seconds, error when not saved), in name order,
 * and in *@ret_seconds the time it took. Can't fail: an agent that fails is in the result. */
GVariant *hostd_save_all(HostdContext *ctx, guint timeout_s, const char *why, double *ret_seconds);

#define HOSTD_SAVE_ALL_JOBS 4

G_END_DECLS
