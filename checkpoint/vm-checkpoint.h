/* The checkpoint record of one agent: which qcow2 files exist, which checkpoint each stands on,
 * which file the VM writes to now, and the journal of an operation in flight.
 *
 * A disk-only checkpoint freezes the file the VM was writing to (it becomes the checkpoint's
 * image, read-only from then on) and puts a new empty overlay on top of it. So the images form a
 * tree rooted at the template's base image: every checkpoint image and the active overlay name
 * the checkpoint they stand on ("parent"; NULL for the agent's first disk, which stands on the
 * base image). A restore adds a new overlay on the chosen checkpoint, which starts a new branch.
 *
 * The record is kept in <agent dir>/checkpoints.ini and always written atomically. An operation
 * first writes its intent (the journal: op, new file), then changes libvirt and files, then
 * commits the record; a hostd killed in between finds the journal at start-up and either
 * finishes (the domain already uses the new file) or rolls back (it does not). This module is
 * pure bookkeeping: no libvirt, no qemu-img.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_CHECKPOINT_RECORD     "checkpoints.ini"
#define VM_CHECKPOINT_FIRST_DISK "disk.qcow2"

typedef struct {
    char *id;       /* "c1", "c2", ...: per agent, never reused */
    char *label;    /* or NULL */
    char *image;    /* frozen qcow2, a file name inside the agent dir */
    char *parent;   /* id of the checkpoint this one's image stands on, or NULL */
    gint64 created; /* unix seconds */
    gboolean automatic;
    gboolean quiesced; /* FALSE: crash-consistent (the guest agent did not answer) */
    char *memory;      /* the saved RAM and device state (file name), or NULL: disk only */
} VmCheckpoint;

typedef enum {
    VM_CHECKPOINT_OP_NONE = 0,
    VM_CHECKPOINT_OP_CREATE,
    VM_CHECKPOINT_OP_RESTORE,
    VM_CHECKPOINT_OP_MERGE,
} VmCheckpointOp;

typedef struct {
    char *dir;              /* the agent dir; not stored */
    GPtrArray *checkpoints; /* VmCheckpoint*, in creation order */
    char *active;           /* the overlay the VM writes to (file name) */
    char *active_parent;    /* checkpoint id it stands on, or NULL */
    guint next_seq;         /* for ids and file names */
    VmCheckpointOp pending; /* the journal: an operation that has not committed */
    char *pending_file;     /* the new overlay it introduces */
    char *pending_target;   /* RESTORE: the checkpoint id; MERGE: the one merged away */
    char *pending_label;    /* CREATE */
    char *pending_memory;   /* CREATE with memory: the state file it writes */
    gboolean pending_automatic;
} VmCheckpointSet;

/* Loads <dir>/checkpoints.ini; a missing file is an agent that never took a checkpoint (active
 * = disk.qcow2). Fails with VM_ERROR_IO or VM_ERROR_FAILED ("corrupt checkpoint record") when
 * the file is unreadable or inconsistent (unknown parent, duplicate id). */
VmCheckpointSet *vm_checkpoint_set_load(const char *dir, GError **error);

/* Writes the record atomically and durably. Fails with VM_ERROR_IO. */
gboolean vm_checkpoint_set_save(const VmCheckpointSet *set, GError **error);

void vm_checkpoint_set_free(VmCheckpointSet *set);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmCheckpointSet, vm_checkpoint_set_free)

/* The checkpoint with @id, or NULL. */
VmCheckpoint *vm_checkpoint_set_find(const VmCheckpointSet *set, const char *id);

/* Absolute path of a file name of the set. Newly allocated. */
char *vm_checkpoint_set_path(const VmCheckpointSet *set, const char *file);

/* Journals a checkpoint: reserves the next id and a new overlay file name (returned in
 * @ret_file, owned by the set). Fails with VM_ERROR_BAD_STATE when another operation is
 * pending. The caller saves the set before touching anything. */
gboolean vm_checkpoint_set_begin_create(VmCheckpointSet *set, const char *label, gboolean automatic,
                                        const char **ret_file, GError **error);

/* Makes the journaled checkpoint a memory checkpoint: reserves the name of the file that will hold
 * the RAM and device state (owned by the set). Only between begin_create and commit_create. */
const char *vm_checkpoint_set_journal_memory(VmCheckpointSet *set);

/* Commits the journaled checkpoint: the old active file becomes checkpoint @quiesced-or-not,
 * the new overlay becomes active. Returns the new checkpoint (owned by the set). */
VmCheckpoint *vm_checkpoint_set_commit_create(VmCheckpointSet *set, gboolean quiesced);

/* Journals a restore to checkpoint @id: reserves a new overlay file name. Fails with
 * VM_ERROR_NOT_FOUND (no such checkpoint) or VM_ERROR_BAD_STATE (an operation is pending). */
gboolean vm_checkpoint_set_begin_restore(VmCheckpointSet *set, const char *id,
                                         const char **ret_file, GError **error);

/* Commits the journaled restore: the new overlay becomes active, standing on the target. Returns
 * the file name of the overlay that was active before: it now belongs to no checkpoint and the
 * caller deletes it (owned by the caller). */
char *vm_checkpoint_set_commit_restore(VmCheckpointSet *set);

/* Journals the merge of checkpoint @id into the one checkpoint that stands on it (the child),
 * which will then live in @id's image file: the way to remove @id when the child's image is in
 * use by a running QEMU and only a block commit may write. Returns the child (owned by the set).
 * Fails with VM_ERROR_NOT_FOUND, or VM_ERROR_BAD_STATE when another operation is pending or
 * anything but exactly one checkpoint stands on @id. */
const VmCheckpoint *vm_checkpoint_set_begin_merge(VmCheckpointSet *set, const char *id,
                                                  GError **error);

/* The child of the journaled merge, or NULL when no merge is journaled. */
VmCheckpoint *vm_checkpoint_set_merge_child(const VmCheckpointSet *set);

/* Commits the journaled merge once the child's data is in the merged checkpoint's file: the
 * child takes that file, the merged checkpoint leaves the record. Returns the file name the
 * child had, which nothing uses any more (owned by the caller, who deletes it). */
char *vm_checkpoint_set_commit_merge(VmCheckpointSet *set);

/* Forgets the journal (after a rollback). Can't fail. */
void vm_checkpoint_set_abort(VmCheckpointSet *set);

/* What stands on checkpoint @id: the ids of checkpoints whose parent it is (newly allocated
 * NULL-terminated vector) and whether the active overlay does. */
char **vm_checkpoint_set_dependants(const VmCheckpointSet *set, const char *id,
                                    gboolean *ret_active);

/* Depth of the backing chain under the active overlay (1 = the first disk on the base). */
guint vm_checkpoint_set_active_depth(const VmCheckpointSet *set);

/* Removes checkpoint @id from the record once its image has been merged away: whatever stood
 * on it now stands on its parent. Returns the image file name to delete (owned by the caller).
 * Fails with VM_ERROR_NOT_FOUND. The caller must have merged the image's data into every
 * dependant first. */
char *vm_checkpoint_set_remove(VmCheckpointSet *set, const char *id, GError **error);

G_END_DECLS
