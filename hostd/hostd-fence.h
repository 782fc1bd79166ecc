/* Fencing: a local copy of an agent that another host of the fleet now owns is never started
 * (docs/CLUSTER.md, "Fencing"). A host that comes back with agents another host took over
 * (recovered, moved while it was away) keeps their files but never runs them as the agent: two
 * copies of one agent must not both serve.
 *
 * A fenced agent's record says so (HostdAgentRecord.fenced); every path that starts, resumes,
 * restores or wakes a domain asks hostd_fence_refuse() first. */
#pragma once

#include "hostd-context.h"
#include "hostd-state.h"

G_BEGIN_DECLS

/* Fails with VM_ERROR_BAD_STATE "agent 'x' is fenced: host 'h2' owns it (epoch 2) ..." when @r
 * is fenced; TRUE otherwise. */
gboolean hostd_fence_refuse(const HostdAgentRecord *r, GError **error);

/* Fences agent @name: another host, @owner, holds its fleet record with @epoch. Takes the agent
 * lock, writes the fence into its record, and destroys its domain when it runs (its disk and
 * files stay; the memory of that copy is the owner's now). Logs one line and an event the first
 * time. Returns whether the agent was fenced now (FALSE: already, or no such agent, or its
 * record could not be written, which is logged). */
gboolean hostd_fence_agent(HostdContext *ctx, const char *name, const char *owner, guint64 epoch);

/* At hostd's start, before any agent is started, resumed or restored: reads each local agent's
 * fleet record and fences those another host owns; a fence whose record names this host again
 * is lifted. Without [cluster] nothing. When etcd cannot be reached nothing is fenced (there is
 * nothing to go on): one note says so, and the cluster's thread fences later (hostd_fence_agent()
 * through hostd_cluster_set_fence_func()). Appends one note per agent fenced. Can't fail. */
void hostd_fence_startup(HostdContext *ctx, GPtrArray *notes);

/* The HostdClusterFenceFunc hostd gives its cluster: @data is the context. As
 * hostd_fence_agent(), but an agent whose lock is held (a boot, a checkpoint) is left for the
 * next call: the cluster's thread, which renews the lease, never waits on an agent. */
void hostd_fence_from_cluster(gpointer data, const char *name, const char *owner, guint64 epoch);

G_END_DECLS
