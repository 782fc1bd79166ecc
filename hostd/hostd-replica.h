/* Replicas of agents' checkpoints on other hosts of the fleet, and recovery from them
 * (docs/CLUSTER.md, "Replicas and recovery").
 *
 * With `replicate = N` in [cluster], each checkpoint an agent takes is copied to N other hosts:
 * its disk as of that checkpoint (the checkpoints' images, the warm layer it stands on) and its
 * records (keys, policy, checkpoint record). A copy is carried by a client, as a move is:
 * `vmctl replicate AGENT`, which hostd itself runs after a checkpoint, asks the agent's host for
 * the plan, each target host for what it has, and carries what is missing (each file with its
 * SHA-256 on both sides). The target keeps one replica per agent, $STATE/replicas/<name>, and
 * swaps a new one in only once all of it came: a replica is always whole.
 *
 * When the agent's host is lost (its lease gone), `vmctl recover AGENT --to HOST` makes the agent
 * again on HOST from its replica there: the disk as of the replica's newest checkpoint (what it
 * did after that is lost), booted, and the fleet's record taken over with a higher epoch, so the
 * lost host fences its copy if it comes back.
 */
#pragma once

#include "hostd-context.h"
#include "hostd-move.h"

G_BEGIN_DECLS

/* The replicas this host keeps, under the state dir. */
#define HOSTD_REPLICAS_DIR "replicas"

/* The agent's host, step "replica-plan": what a replica of @name holds now and where it goes.
 * Returns {from, epoch, template, cpus, memory_mib, disk_gib, base_sha256, source_dir,
 * base_path, warm_path?, checkpoint, created, targets (aa{sv}: host, address), files (aa{sv}:
 * file, size, mtime)}. Fails with VM_ERROR_NOT_RUNNING without a fleet or etcd,
 * VM_ERROR_BAD_STATE (replication off, no checkpoint yet, a fork, fenced, not this host's),
 * VM_ERROR_BUSY (a move, a copy or a checkpoint of it under way), VM_ERROR_NO_RESOURCES (no
 * other host can hold it). */
GVariant *hostd_replica_plan(HostdContext *ctx, const char *name, GError **error);

/* Gives agent @name a count of replicas of its own, @copies (0-8), or with !@own the host's
 * ([cluster] replicate) again. Returns {agent, copies (u: the count that holds now)}. Fails with
 * VM_ERROR_NOT_RUNNING without a fleet, VM_ERROR_NOT_FOUND, VM_ERROR_INVALID_ARGUMENT. */
GVariant *hostd_replica_set(HostdContext *ctx, const char *name, gboolean own, guint copies,
                            GError **error);

/* The agent's host, step "replica-done": the copy ended; @hosts hold @checkpoint now (none: it
 * reached no host). Returns {}. */
GVariant *hostd_replica_done(HostdContext *ctx, const char *name, const char *checkpoint,
                             char **hosts, GError **error);

/* The agent's host, step "replica-abort": forgets the copy under way. Returns {}. */
GVariant *hostd_replica_abort_out(HostdContext *ctx, const char *name, GError **error);

/* A keeping host, step "replica-begin": checks this host may keep a replica of the agent @in
 * describes (the record names @in->from with @in->epoch, not this host; the same base image) and
 * opens its staging dir. Returns {have (aa{sv}: file, size, mtime, sha256)}: the files of the
 * replica kept now, which need not come again. */
GVariant *hostd_replica_begin(HostdContext *ctx, const HostdMoveIn *in, GError **error);

/* A keeping host, step "replica-commit": @files ("SHA256 SIZE MTIME NAME", each either written
 * in this copy with that SHA-256 or kept from the last replica with it) are the replica of
 * @checkpoint now; it replaces the last one whole. Returns {}. */
GVariant *hostd_replica_commit(HostdContext *ctx, const char *name, const char *checkpoint,
                               char **files, GError **error);

/* A keeping host, step "replica-abort": forgets the copy under way (the last replica stays). */
GVariant *hostd_replica_abort_in(HostdContext *ctx, const char *name, GError **error);

/* Makes agent @name on this host from its replica here: its host must be down, the replica of
 * the epoch the fleet's record has. Returns {agent, checkpoint, created, from, started,
 * warning?}. Fails with VM_ERROR_NOT_RUNNING without a fleet or etcd, VM_ERROR_NOT_FOUND (no
 * record, no replica here), VM_ERROR_BAD_STATE (its host is live, the replica is older than
 * the record), VM_ERROR_EXISTS (a copy of it here), and as placement and resources. */
GVariant *hostd_replica_recover(HostdContext *ctx, const char *name, VmProgressFunc progress,
                                gpointer progress_data, GError **error);

/* The replicas here that no longer serve (the agent was removed, or moved or recovered here, or
 * its record moved past them), removed; copies under way that stopped, forgotten; and the
 * agents of this host whose newest checkpoint no host holds yet, copied (one `vmctl replicate`
 * at a time). For the cluster's thread; @records: as for hostd_move_tick(). */
void hostd_replica_tick(HostdContext *ctx, const GPtrArray *records);

G_END_DECLS
