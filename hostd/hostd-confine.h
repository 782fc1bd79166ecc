/* Confinement: each agent's QEMU runs as a uid (gid equal) of its own from agent-ids
 * (hostd-ids.h), with libvirt's static DAC label and no relabelling (templates/vm-domain.h), and
 * hostd gives each agent's files to that id and to no other:
 * - the agent's directory: root, group the agent's id, 0710 (other agents cannot traverse or
 *   list it; a fork's id gets traverse through an ACL entry while it stands on this agent);
 * - the active overlay: the agent's id, 0600; the seed: the agent's id, 0400;
 * - checkpoint images (read-only backing files): root, group the agent's id, 0440 (0460 while
 *   a merge writes into them), plus a read ACL entry for each fork whose chain they are in;
 * - its egress and in-guest API sockets: the agent's id, 0600 (hostd-egress, hostd-guest-api);
 * - everything under images-dir (template images, warm images): root's, writable by root alone.
 * Agents without an id (hostd not root, a driver without DAC, agent-ids = off, a record from
 * before ids that has not booted since) are left as they were.
 *
 * Each agent's three workers (its SSH client, vm-ssh-worker; its egress proxy, vm-egress-worker;
 * its in-guest API, vm-guest-api-worker) run, when hostd is root, as three more ids of their own
 * from worker-ids (hostd_ids_worker()), never its QEMU's nor each other's nor another agent's: a
 * worker taken over by a guest can then neither read nor write its QEMU's memory (/proc/PID/mem,
 * ptrace: QEMU is dumpable), nor signal or throttle another agent's processes. The ids are derived,
 * not recorded: an agent's slot is its id's place in agent-ids, so an agent made before worker ids
 * keeps its record as it is and its workers get theirs from it. An agent with no id in agent-ids
 * (agent-ids = off, a driver without DAC, a record from before ids, an id of an earlier agent-ids
 * range) gets a slot of its own for as long as hostd runs (its workers end with hostd), kept from
 * every agent id's slot. The workers own no file and read none of the agent's (keys and sockets
 * come from hostd), so nothing is given to these ids. worker-ids = off: every worker runs as
 * egress-user, as before. */
#pragma once

#include "hostd-context.h"
#include "hostd-ids.h"

G_BEGIN_DECLS

/* At start-up: whether agents get ids of their own (sets ctx->agent_ids): agent-ids is not off,
 * hostd runs as root, and the driver runs QEMU as an unprivileged user (the DAC label of its
 * capabilities, not root). When they do, every file under images-dir is made root's and
 * writable by root alone. Returns a line for hostd's log saying which and why, and whom the
 * workers run as. Can't fail. */
char *hostd_confine_start(HostdContext *ctx);

/* With ctx->lock held: gives @r an id when agent ids are on and it has none (r->agent_id; the
 * caller saves the record). Fails with VM_ERROR_NO_RESOURCES when the range is used up. */
gboolean hostd_confine_pick_locked(HostdContext *ctx, HostdAgentRecord *r, GError **error);

/* An id for a machine without a record (a warm image's build), held until
 * hostd_confine_unhold(); *ret_id is 0 when agent ids are off. Fails as
 * hostd_confine_pick_locked(). */
gboolean hostd_confine_hold(HostdContext *ctx, guint *ret_id, GError **error);
void hostd_confine_unhold(HostdContext *ctx, guint id);

/* Before @r's QEMU starts (boot, restore, a saved state resumed): its directory, overlay,
 * checkpoint images and seed as above, and read access for its id to the images of other agents
 * its disk stands on (a fork's source). Nothing for an agent without an id. Fails with
 * VM_ERROR_IO. */
gboolean hostd_confine_agent(HostdContext *ctx, const HostdAgentRecord *r, GError **error);

/* @path, a new overlay hostd made as root, is about to become @r's running disk: the agent's
 * id, 0600. Fails with VM_ERROR_IO. */
gboolean hostd_confine_overlay(HostdContext *ctx, const HostdAgentRecord *r, const char *path,
                               GError **error);

/* Around a merge into @r's checkpoint images by its running QEMU (a block commit): with
 * @writable its checkpoint images get group write, without they are read-only again. Fails with
 * VM_ERROR_IO. */
gboolean hostd_confine_merging(HostdContext *ctx, const HostdAgentRecord *r, gboolean writable,
                               GError **error);

/* Whom agent @name's worker @kind runs as: with hostd root and worker-ids on, *@ret_change TRUE
 * and the worker id of the agent's slot (above); @agent_id is the agent's recorded id (0: none).
 * With worker-ids off, hostd_config_worker_user(); hostd not root: its own user (*@ret_change
 * FALSE). Fails with VM_ERROR_NO_RESOURCES when no slot is free, VM_ERROR_INVALID_ARGUMENT when
 * the id names a user or group of the host or is an agent's id (records from an earlier
 * agent-ids), each naming the id. */
gboolean hostd_confine_worker_user(HostdContext *ctx, const char *name, guint agent_id,
                                   HostdWorkerKind kind, gboolean *ret_change, guint *ret_uid,
                                   guint *ret_gid, GError **error);

/* hostd_confine_worker_user() for SSH workers, as a HostdSshWorkersConfig's worker_user with
 * the context as its data. */
gboolean hostd_confine_ssh_worker_user(gpointer ctx, const char *agent, guint agent_id,
                                       gboolean *ret_change, guint *ret_uid, guint *ret_gid,
                                       GError **error);

/* @r is going (rm, a rolled-back new or fork): the read access its id had to other agents'
 * images and directories is taken back, so the id, once free, reaches nothing; a slot its workers
 * held (above) is free again. Best effort; failures go to the log. */
void hostd_confine_release(HostdContext *ctx, const HostdAgentRecord *r);

G_END_DECLS
