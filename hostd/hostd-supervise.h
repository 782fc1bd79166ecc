/* The supervisor: keeps each agent's VM what its record says the user wants (HostdAgentRecord
 * .wanted). It hears libvirt's lifecycle events as they happen (a QEMU that died, a guest that
 * powered itself off or rebooted), looks at every agent every few seconds in case an event was
 * missed, and at start-up brings back the agents whose QEMU is gone (host reboot, power loss).
 * A crashed agent boots again from its disk with backoff; past the configured number of crashes
 * within the window it is left `crashed` until `vmctl start`. Every change it sees or makes goes
 * to the event log. See docs/LIFECYCLE.md. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* The supervisor as a component of the context: stops it when the context goes. */
extern const HostdComponent hostd_supervise_component;

/* Registers for libvirt's domain events and starts the supervisor's thread, whose first pass
 * brings the agents in line as at start-up: running and paused ones whose QEMU is gone boot
 * again (their RAM is lost: the log says so), saved ones stay saved, and those saved by a
 * shutdown resume at once when the configuration says shutdown-resume = eager. Returns once
 * that pass is done. Fails with VM_ERROR_LIBVIRT when the events cannot be had. */
gboolean hostd_supervise_start(HostdContext *ctx, GError **error);

/* Stops the supervisor (no restart happens after it returns). Accepts a context never started. */
void hostd_supervise_stop(HostdContext *ctx);

/* Sets what a crash or a poweroff from inside does to @name (HOSTD_RESTART_*; anything else
 * fails with VM_ERROR_INVALID_ARGUMENT). Stored in its record; returns its info dictionary. */
GVariant *hostd_agent_set_restart(HostdContext *ctx, const char *name, const char *policy,
                                  GError **error);

/* The delay before the @count-th restart within the window: 0 s for the first, then 2 s, 4 s,
 * 8 s..., at most 60 s. */
guint hostd_supervise_backoff_s(guint count);

G_END_DECLS
