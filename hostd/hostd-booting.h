/* Agents hostd boots on its own, with nobody waiting for them: a crashed agent restarted, one
 * whose QEMU was gone when hostd started (hostd-supervise.c watches those boots). Such an agent
 * is `starting` (not `running`) until its guest answers SSH, as after `new` or `start`, and the
 * requests that need the guest (exec, the public SSH port) wait for that within the boot timeout,
 * as they wait for a wake. The marks live in the context (ctx->booting). */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Marks @name starting, from before its boot on: a look between the crash and the boot already
 * says so, and a request already waits. Returns the mark's generation, for
 * hostd_booting_done(). Can't fail. */
guint hostd_booting_mark(HostdContext *ctx, const char *name);

/* @name's boot marked as @generation is over (its guest answers, or it will not): no longer
 * starting, waiters go on; a later mark of it stays. 0: whatever the mark. Can't fail. */
void hostd_booting_done(HostdContext *ctx, const char *name, guint generation);

/* Whether @name is starting so. Can't fail. */
gboolean hostd_booting_is(HostdContext *ctx, const char *name);

/* Without @name's lock: returns once @name is not starting (at once when it is not), at most
 * the boot timeout and a margin later. Fails with VM_ERROR_TIMEOUT past that. */
gboolean hostd_booting_wait(HostdContext *ctx, const char *name, GError **error);

G_END_DECLS
