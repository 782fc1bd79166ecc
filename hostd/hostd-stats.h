/* `vmctl stats`, `vmctl top` and the metrics endpoint: each agent's figures, as hostd reads them
 * now. From libvirt: its state, its vCPUs' CPU time (CPU % from hostd's previous sample,
 * hostd-metrics.h), what its guest's balloon driver reports of its memory. From the host: its
 * QEMU's resident memory (/proc/PID/status of the process libvirt's pid file names), the bytes
 * its disk overlay and its checkpoints take. From hostd: its egress proxy's traffic and its
 * execs. Nothing here changes an agent, but the balloon's statistics period, turned on when a
 * running guest reports none. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* How long a collection waits for a second CPU sample of agents that have none yet. */
#define HOSTD_STATS_FIRST_SAMPLE_US (500 * 1000)

/* The balloon's statistics period hostd sets on a guest that reports none, in seconds. */
#define HOSTD_STATS_BALLOON_PERIOD_S 2

/* The figures of the agents named in @names (NULL or empty: every agent), in name order, as an
 * aa{sv} (docs/PROTOCOL.md, agent-stats). Figures that cannot be had are left out of an agent's
 * dictionary. Fails with VM_ERROR_INVALID_ARGUMENT or VM_ERROR_NOT_FOUND for a name that is no
 * agent's, VM_ERROR_IO when the agents cannot be listed. New reference (not floating). */
GVariant *hostd_stats_collect(HostdContext *ctx, const char *const *names, GError **error);

/* The pid of agent @name's QEMU as the pid file of @lv's driver says (the embedded driver's
 * <root>/run/qemu/NAME.pid, else /run/libvirt/qemu/NAME.pid), checked against
 * /proc/PID/cmdline (a QEMU with guest=NAME); 0 when there is none. Can't fail. */
GPid hostd_stats_qemu_pid(HostdLibvirt *lv, const char *name);

/* The resident memory in bytes of process @pid (VmRSS of /proc/PID/status); FALSE when it cannot
 * be read. Can't fail. */
gboolean hostd_stats_process_rss(GPid pid, guint64 *ret_bytes);

G_END_DECLS
