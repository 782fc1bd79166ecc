/* Files inside checkpoints: what changed between two checkpoints (or a checkpoint and now), and
 * putting back chosen paths from a checkpoint into the running agent, leaving the rest of the
 * machine as it is. Reads checkpoint images through libguestfs (checkpoint/vm-guestfs.h); every
 * call launches one helper appliance, so it costs seconds, not milliseconds. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Files added, removed and changed (a(ss): "A"|"D"|"M", guest path; sorted by path) from
 * checkpoint @id of agent @name to checkpoint @other, or to the agent's current state when @other
 * is NULL (for a running agent, through a checkpoint taken and merged away again), limited to
 * @under and below (NULL: everything). A very long list is cut and *ret_truncated set. Fails
 * with VM_ERROR_NOT_FOUND (agent, checkpoint, or @under in neither), VM_ERROR_INVALID_ARGUMENT
 * (bad @under), VM_ERROR_IO (libguestfs). */
GVariant *hostd_checkpoint_diff(HostdContext *ctx, const char *name, const char *id,
                                const char *other, const char *under, gboolean *ret_truncated,
                                VmProgressFunc progress, gpointer progress_data, GError **error);

/* Puts @paths (guest paths, each with everything below it) of running agent @name back as they
 * were in checkpoint @id: each is removed in the guest, then extracted from the checkpoint with
 * owners, modes, links and extended attributes; nothing else changes. First an automatic
 * checkpoint of the current state (its id in *ret_undo). Fails before changing anything with
 * VM_ERROR_INVALID_ARGUMENT (a path that is not absolute, is "/", or has ".."),
 * VM_ERROR_NOT_FOUND (agent, checkpoint, or a path missing in the checkpoint), VM_ERROR_BAD_STATE
 * (not running); VM_ERROR_FAILED when the guest could not write them. Returns the agent's info. */
GVariant *hostd_checkpoint_restore_paths(HostdContext *ctx, const char *name, const char *id,
                                         const char *const *paths, char **ret_undo,
                                         VmProgressFunc progress, gpointer progress_data,
                                         GError **error);

G_END_DECLS
