/* Moving an agent to another host of the fleet (docs/CLUSTER.md, "Moves").
 *
 * The embedded driver has no migration between hosts, and an agent's disk is a chain of local
 * qcow2 files, so a move is save -> copy -> restore, carried by the client that asked for it
 * (vmctl move), which talks to the source and the target in turn and carries each file's bytes
 * between them: no hostd reaches another. The steps:
 *
 *   source plan    checks the agent can go (owned here, no fork, no secret grants, the target
 *                  takes its template with the same base image), takes a disk checkpoint so that
 *                  most of the disk is frozen, and lists those frozen files
 *   target begin   checks it can take the agent; files go to $STATE/incoming/<name>
 *   (copy)         the frozen files, each with its SHA-256 on both sides, while the agent runs
 *   source save    marks the agent moving (agent.ini: moving-to), saves its memory (managed
 *                  save) and lists every file it has now; from here it is not started here
 *   (copy)         what changed since: the active overlay, the memory, the records
 *   target commit  checks every file's SHA-256, installs the agent with ports and an id of this
 *                  host, points its images' headers at their paths here, restores its memory,
 *                  and only then takes the fleet record over: {source, E} -> {target, E + 1}, one
 *                  etcd transaction; a failure before that removes everything it made
 *   source done    once the record names the target, removes its own copy
 *
 * At every step exactly one copy may run: the source's until the record moves, the target's
 * after. A source left marked moving (the client or either hostd died) settles by the record:
 * still its own, it takes the record back with a higher epoch (so a target about to take it
 * over fails) and the agent stays saved, waking as usual; the target's, it is fenced. A target
 * that dies before the record moved finds its copy fenced at start, as any copy another host
 * owns.
 */
#pragma once

#include "hostd-context.h"
#include "vm-stream.h"

G_BEGIN_DECLS

/* The incoming files of moves, under the state dir. */
#define HOSTD_MOVE_INCOMING_DIR "incoming"
/* A client that goes quiet for this long abandons its move: the source settles it. */
#define HOSTD_MOVE_IDLE_S 120

/* Source, step "plan": agent @name may move to host @to (NULL: where placement puts it, never
 * this host). Returns {to, address, from, epoch, template, cpus, memory_mib, disk_gib,
 * base_sha256, source_dir, base_path, warm_path?, files (aa{sv}: file, size)}. Fails with
 * VM_ERROR_NOT_RUNNING without a fleet or etcd, VM_ERROR_NOT_FOUND, VM_ERROR_BAD_STATE (a fork,
 * one with forks, fenced, not this host's in the fleet, secrets granted, creating), VM_ERROR_BUSY
 * (a move of it under way) and as placement for @to. */
GVariant *hostd_move_plan(HostdContext *ctx, const char *name, const char *to,
                          VmProgressFunc progress, gpointer progress_data, GError **error);

/* Source, step "save": after plan, marks @name moving to @to, saves its memory when it runs and
 * returns {files (aa{sv}: file, size, mtime)}: everything the target needs now. */
GVariant *hostd_move_save(HostdContext *ctx, const char *name, const char *to,
                          VmProgressFunc progress, gpointer progress_data, GError **error);

/* Source, move-read: streams @file of the agent being moved (a file of its dir, "@memory" its
 * saved state, "@warm" the warm image layer it stands on) as STDOUT frames on @reply, then EXIT
 * with the SHA-256 of what was sent. */
gboolean hostd_move_read(HostdContext *ctx, const char *name, const char *file,
                         VmStreamWriter *reply, GError **error);

/* Source, step "done": the fleet's record names @to now: removes this host's copy. Returns {}. */
GVariant *hostd_move_done(HostdContext *ctx, const char *name, const char *to, GError **error);

/* Source, step "abort": settles the move by the fleet's record (see above). Returns {owner,
 * epoch}. Fails with VM_ERROR_NOT_RUNNING when etcd cannot say (the agent stays unstartable,
 * and the settling is tried again in the background). */
GVariant *hostd_move_abort_out(HostdContext *ctx, const char *name, GError **error);

/* What a target is told of the agent it receives. */
typedef struct {
    const char *name;
    const char *from;
    guint64 epoch;
    const char *template_name;
    guint cpus;
    guint memory_mib;
    guint disk_gib;
    const char *base_sha256;
    const char *source_dir;
    const char *base_path;
    const char *warm_path; /* NULL: it stands on no warm layer */
    char **files;          /* commit: "SHA256 NAME" of every file the agent has */
} HostdMoveIn;

/* Target, step "begin": checks this host can take the agent (in the fleet, live, not drained,
 * the template with the same base image, the resources, no agent of that name here, the record
 * names @in->from with @in->epoch) and opens its incoming dir. Returns {}. */
GVariant *hostd_move_begin(HostdContext *ctx, const HostdMoveIn *in, GError **error);

/* Target, move-write: reads @size bytes of @file from STDIN frames on @fd until STDIN_EOF into
 * the incoming dir, then ends @reply with EXIT and their SHA-256. */
gboolean hostd_move_write(HostdContext *ctx, const char *name, const char *file, gint64 size,
                          VmStreamWriter *reply, GError **error);

/* Target, step "commit": installs and restores the agent, then takes its fleet record over
 * (see above). Returns the agent's info. On failure nothing of it stays here but the incoming
 * files. */
GVariant *hostd_move_commit(HostdContext *ctx, const HostdMoveIn *in, VmProgressFunc progress,
                            gpointer progress_data, GError **error);

/* Target, step "abort": forgets the incoming move of @name and its files. Returns {}. */
GVariant *hostd_move_abort_in(HostdContext *ctx, const char *name, GError **error);

/* Settles the moves this host's copies were left in (no client heard from for
 * HOSTD_MOVE_IDLE_S, or from before hostd started) and removes incoming files nobody sends.
 * Never waits on a busy agent. For the cluster's thread; @records: this host's agent records as
 * hostd_state_load_records() read them for this tick (NULL: none could be read). */
void hostd_move_tick(HostdContext *ctx, const GPtrArray *records);

G_END_DECLS
