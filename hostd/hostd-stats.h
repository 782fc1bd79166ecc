/* `vmctl stats`, `vmctl top` and the metrics endpoint: each agent's figures, as hostd reads them
 * now. From libvirt: its state, its vCPUs' CPU time (CPU % from hostd's previous sample,
 * hostd-metrics.h), what its guest's balloon driver reports of its memory. From the host: what
 * its QEMU's memory costs (hostd-memory.h), the bytes its disk overlay and its checkpoints
 * take. From hostd: its egress proxy's traffic and its
 * execs. Nothing here changes an agent, but the balloon's statistics period, turned on when a
 * running guest reports none. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* How long a collection waits for a second CPU sample of agents that have none yet. */
#define HOSTD_STATS_FIRST_SAMPLE_US (500 * 1000)

/* The figures of the agents named in @names (NULL or empty: every agent), in name order, as an
 * aa{sv} (docs/PROTOCOL.md, agent-stats). Figures that cannot be had are left out of an agent's
 * dictionary. Fails with VM_ERROR_INVALID_ARGUMENT or VM_ERROR_NOT_FOUND for a name that is no
 * agent's, VM_ERROR_IO when the agents cannot be listed. New reference (not floating). */
GVariant *hostd_stats_collect(HostdContext *ctx, const char *const *names, GError **error);

G_END_DECLS
