/* Warm pools: for each template whose pool is not 0 (its `pool:`, else hostd.conf's `pool`),
 * that many machines restored from its current warm image and left paused, waiting for `vmctl
 * new` to take one (hostd-agent.c gives it the agent's name and identity and resumes it), which
 * skips the restore. docs/INSTANT.md. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

typedef struct _HostdPool HostdPool;

/* The directory of the pool's machines under the state dir. */
#define HOSTD_POOL_DIR "pool"

/* The phase of a pool machine's record: no agent's yet. */
#define HOSTD_PHASE_POOL "pool"

/* Removes what an earlier run left in <state dir>/pool/ (its machines destroyed and their dirs
 * removed, the dirs an agent took kept), then starts the thread that fills the pools: one
 * machine at a time, at the lowest CPU priority (the machine's QEMU too, until `new` takes it),
 * never while a warm `new` is under way nor just after one, only while the host's available memory
 * holds the machine and a margin (a tenth of the host's memory, at least 1 GiB) after it;
 * machines of a warm image that is no longer current, or beyond a smaller pool, are removed.
 * Sets ctx->pool_take, ctx->pool_settled and ctx->pool_count. Each machine made or removed is
 * logged (ctx->log). Can't fail: a pool that cannot be filled stays short, said in the log. */
void hostd_pool_start(HostdContext *ctx);

/* Stops the thread and destroys every machine still waiting. Safe when never started. */
void hostd_pool_stop(HostdContext *ctx);

G_END_DECLS
