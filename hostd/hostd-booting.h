/* Agents hostd boots on its own, with nobody waiting for them: a crashed agent restarted, one
 * whose QEMU was gone when hostd started. Such an agent is `starting` (not `running`) until its
 * guest answers SSH, as after `new` or `start`, and the requests that need the guest (exec, the
 * public SSH port) wait for that within the boot timeout, as they wait for a wake. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Marks @name starting before its boot: a look between the crash and the boot already says so,
 * and a request already waits. Can't fail. */
void hostd_booting_mark(HostdContext *ctx, const char *name);

/* The boot of @name failed or will not come now: no longer starting; waiters go on. Can't
 * fail. */
void hostd_booting_clear(HostdContext *ctx, const char *name);

/* With @r's lock held, its domain just started: marks it starting and waits in the background
 * for its guest to answer SSH (at most the boot timeout, less when the VM stops); then, with its
 * lock, runs the agent_up hooks as a waited-for start does, and it is no longer starting. Can't
 * fail: a guest that does not answer is logged. */
void hostd_booting_watch(HostdContext *ctx, const HostdAgentRecord *r);

/* Whether @name is starting so. Can't fail. */
gboolean hostd_booting_is(HostdContext *ctx, const char *name);

/* Without @name's lock: returns once @name is not starting (at once when it is not), at most
 * the boot timeout and a margin later. Fails with VM_ERROR_TIMEOUT past that. */
gboolean hostd_booting_wait(HostdContext *ctx, const char *name, GError **error);

/* Ends the background waits (each within one attempt, a few seconds) and waits for them; no new
 * one starts. For hostd_context_free(), before the components detach. */
void hostd_booting_stop(HostdContext *ctx);

G_END_DECLS
