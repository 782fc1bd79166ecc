/* Checkpoints of agents: hostd's side of the checkpoint engine (checkpoint/vm-checkpoint.h keeps
 * the record; this drives libvirt and qemu-img). Disk-only checkpoints are external qcow2
 * overlays taken live with the guest's filesystems frozen through qemu-guest-agent, so their
 * cost does not depend on the disk's size. */
#pragma once

#include "hostd-context.h"
#include "vm-checkpoint.h"

G_BEGIN_DECLS

/* Checkpoints as a component of the context: at start-up, finishes or rolls back what a killed
 * hostd left journaled (hostd_checkpoint_reconcile()). */
extern const HostdComponent hostd_checkpoint_component;

/* Takes a disk-only checkpoint of agent @name, running or stopped, without stopping it. Refuses
 * before touching anything (VM_ERROR_NO_RESOURCES) when it would leave the filesystem of the
 * agent's directory below checkpoint-free-floor, counting 256 MiB for a checkpoint and the
 * guest's memory besides for one with @memory; every checkpoint is made through
 * hostd_checkpoint_create_locked(), which checks this (vmctl's, the guest's, a restore's undo
 * checkpoint, the periodic and idle ones). When the
 * guest agent does not answer, the checkpoint is crash-consistent and *ret_warning says so
 * (newly allocated, else NULL). Returns the checkpoint's dictionary (a{sv}). */
GVariant *hostd_checkpoint_create(HostdContext *ctx, const char *name, const char *label,
                                  gboolean automatic, gboolean memory, char **ret_warning,
                                  GError **error);

/* Whether agent @name's guest may have one more checkpoint made at its asking (a checkpoint
 * from inside, with @memory or not, or the undo checkpoint of a restore it asks for): the agent
 * has fewer than guest-checkpoint-max checkpoints, and their images and memory files, with the
 * active overlay the new one freezes and, with @memory, the guest's memory, take no more than
 * guest-checkpoint-bytes. Every checkpoint of the agent counts, the host's too. Fails with
 * VM_ERROR_NO_RESOURCES saying which (the guest gets 507), VM_ERROR_NOT_FOUND or VM_ERROR_IO
 * when the agent or its record cannot be read. Makes nothing. */
gboolean hostd_checkpoint_guest_quota(HostdContext *ctx, const char *name, gboolean memory,
                                      GError **error);

/* With the agent lock held: journals and takes a disk-only checkpoint of @r (running or
 * stopped) in @set, redefines the domain on the new overlay and saves the record. Returns the new
 * checkpoint (owned by @set). Fails like hostd_checkpoint_create(). */
VmCheckpoint *hostd_checkpoint_create_locked(HostdContext *ctx, const HostdAgentRecord *r,
                                             virDomainPtr dom, VmCheckpointSet *set,
                                             const char *label, gboolean automatic, gboolean memory,
                                             char **ret_warning, GError **error);

/* The agent's checkpoints (aa{sv}: id, created, label, automatic, quiesced, kind, bytes,
 * parent), oldest first. */
GVariant *hostd_checkpoint_list(HostdContext *ctx, const char *name, GError **error);

/* Puts the whole agent back to checkpoint @id: first an automatic checkpoint of the current
 * state (its id in *ret_undo), then a new overlay on @id's image, and a boot (with @wait, until
 * SSH answers). Fails with VM_ERROR_NOT_FOUND for an unknown checkpoint (nothing changed). */
GVariant *hostd_checkpoint_restore(HostdContext *ctx, const char *name, const char *id,
                                   gboolean wait, char **ret_undo, VmProgressFunc progress,
                                   gpointer progress_data, GError **error);

/* Removes checkpoint @id, merging its data into what stands on it: a leaf is deleted; a
 * checkpoint with one dependant is merged into it (a live block pull when that is the running
 * disk); one with several dependants is refused (VM_ERROR_BAD_STATE) until they are removed. */
gboolean hostd_checkpoint_rm(HostdContext *ctx, const char *name, const char *id, GError **error);

/* An agent opened for an operation on one of its checkpoints: its name lock held, its record,
 * domain and checkpoint set, and the checkpoint asked for (in @set). */
typedef struct {
    GMutex *lock;
    HostdAgentRecord *record;
    virDomainPtr dom;
    VmCheckpointSet *set;
    VmCheckpoint *checkpoint;
} HostdCheckpointOpen;

/* Releases what @o holds (the lock last) and zeroes it. Accepts a zeroed one. */
void hostd_checkpoint_open_clear(HostdCheckpointOpen *o);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(HostdCheckpointOpen, hostd_checkpoint_open_clear)

/* Locks and opens agent @name and finds its checkpoint @id (VM_ERROR_NOT_FOUND naming both when
 * it has none): what restore, rm, diff start with. On success *ret_open holds it all (clear it
 * with g_auto(HostdCheckpointOpen)); on failure nothing is held. */
gboolean hostd_checkpoint_open(HostdContext *ctx, const char *name, const char *id,
                               HostdCheckpointOpen *ret_open, GError **error);

/* Checks each image of the backing chain hostd's record says lies under checkpoint @id's image
 * (NULL: under the active overlay) of @r, whose record is @set, down to the template's base
 * image: each must be qcow2, without an external data file, and name as its backing file the
 * image the record puts under it (a fork's chain goes on in its source's record). Each header
 * is read alone (vm_qemu_img_check()), so no backing or data file a header names is opened. A
 * guest can rewrite its images' headers: hostd runs nothing that opens a backing chain or
 * writes an image (qemu-img create on it, rebase) before this passed. Fails with
 * VM_ERROR_BAD_STATE naming the image that differs, VM_ERROR_IO when qemu-img fails,
 * VM_ERROR_NOT_FOUND when a fork's source is gone. */
gboolean hostd_checkpoint_chain_check(HostdContext *ctx, const HostdAgentRecord *r,
                                      const VmCheckpointSet *set, const char *id, GError **error);

/* Removes checkpoint @c of @set with the agent lock held (see hostd_checkpoint_rm()). */
gboolean hostd_checkpoint_rm_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                    VmCheckpointSet *set, const VmCheckpoint *c, GError **error);

/* Finishes or rolls back a checkpoint operation that a killed hostd left journaled in the
 * agent's record. Appends a note for each action. Called at start-up for every agent. */
gboolean hostd_checkpoint_reconcile(HostdContext *ctx, const HostdAgentRecord *r, GPtrArray *notes,
                                    GError **error);

/* Before libvirt starts @r's stopped domain @dom, from its disk or from a saved state:
 * hostd_checkpoint_chain_check() of the active overlay, as the agent's id, then the definition
 * libvirt starts from (the saved state's, or the persistent one) made to name the whole chain
 * from hostd's records where it does not (<backingStore>, VmDomainSpec's backing_chain), so that
 * libvirt reads none of the headers a guest wrote (it would, as hostd's user: root) and QEMU is
 * given that chain, not the one the headers name. @dom NULL: the check alone. Fails as the
 * check, with VM_ERROR_IO when the record cannot be read, VM_ERROR_LIBVIRT when the definition
 * cannot be read or made. The checkpoint component runs it as its agent_starting hook; a wake
 * from a saved state calls it. */
gboolean hostd_checkpoint_boot_check(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                     GError **error);

#define HOSTD_BEFORE_SAVE_LABEL "before idle save"

/* With the agent lock held, before the idle loop saves a paused agent: takes an automatic
 * checkpoint and merges away the previous one taken for the same reason, so exactly one such
 * checkpoint exists. */
gboolean hostd_checkpoint_before_save(HostdContext *ctx, const HostdAgentRecord *r,
                                      virDomainPtr dom, GError **error);

#define HOSTD_PERIODIC_LABEL "periodic"

/* With the agent lock held, on a running agent: takes a periodic automatic checkpoint when the
 * newest one is older than the agent's interval, then thins automatic checkpoints by the agent's
 * retention (checkpoint/vm-retention.h) and merges the dropped ones away, oldest first, so the
 * chain stays as short as what is kept. */
gboolean hostd_checkpoint_periodic(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                   GError **error);

/* Sets @name's periodic checkpoint policy: @never, or every @every_s seconds keeping the newest
 * @keep automatic ones plus one per hour for @hourly hours and one per day for @daily days
 * (negative: unchanged). */
GVariant *hostd_agent_set_checkpoints(HostdContext *ctx, const char *name, gboolean never,
                                      guint every_s, guint keep, gint hourly, gint daily,
                                      GError **error);

/* Makes libvirt's persistent definition and hostd's saved copy of @r's domain use the active
 * overlay of @set and the chain under it. Fails as hostd_agent_define(). */
gboolean hostd_checkpoint_define(HostdContext *ctx, const HostdAgentRecord *r,
                                 const VmCheckpointSet *set, GError **error);

/* The definition @r's saved state at @memory_path (a libvirt save image) restores with on this
 * host: the set's active overlay and chain, the saved CPUs, memory and generation ID. Newly
 * allocated; fails as the definition's build. */
char *hostd_checkpoint_saved_xml(HostdContext *ctx, const HostdAgentRecord *r,
                                 const VmCheckpointSet *set, const char *memory_path,
                                 GError **error);

/* For an agent whose images came from another host (a move): each of its images (checkpoints,
 * active overlay, warm layer) whose header names a backing file names instead what @moved maps
 * that name to (old path -> path here), header only (`qemu-img rebase -u`), as the agent's id.
 * Each header is read first as that id and must be a plain qcow2 image; one naming a file
 * @moved does not hold fails with VM_ERROR_BAD_STATE and is left as it was. Fails with VM_ERROR_IO
 * for qemu-img's failures. */
gboolean hostd_checkpoint_rehome(HostdContext *ctx, const HostdAgentRecord *r, GHashTable *moved,
                                 GError **error);

/* Whether @bytes more written under @dir leave its filesystem above checkpoint-free-floor (as
 * checkpoints keep it): the check of a file another host sends. Fails with VM_ERROR_NO_RESOURCES
 * saying how much is free, VM_ERROR_IO when the filesystem cannot be read. */
gboolean hostd_checkpoint_room_for(HostdContext *ctx, const char *dir, guint64 bytes,
                                   GError **error);

/* For an agent whose files came from a replica (hostd-replica.h): its checkpoint record cut to
 * the checkpoints whose images came and that stand on ones that came, without memory (a replica
 * holds disks only), its images' headers pointed at their paths here (hostd_checkpoint_rehome()
 * with @moved), and a new empty overlay on the newest of them as its disk: the agent as of that
 * checkpoint. *@ret_checkpoint: that checkpoint's id (newly allocated), *@ret_created its time
 * (unix seconds). Fails with VM_ERROR_BAD_STATE when no checkpoint came, and as the rehome. */
gboolean hostd_checkpoint_recover(HostdContext *ctx, const HostdAgentRecord *r, GHashTable *moved,
                                  char **ret_checkpoint, gint64 *ret_created, GError **error);

G_END_DECLS
