#include "hostd-checkpoint-files.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <string.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-checkpoint.h"
#include "hostd-guest.h"
#include "hostd-guestfs.h"
#include "vm-checkpoint.h"
#include "vm-error.h"
#include "vm-guestfs.h"
#include "vm-protocol.h"
#include "vm-util.h"

/* Room left in one reply frame for the list, with a margin for the framing. */
#define HOSTD_DIFF_MAX_BYTES (VM_FRAME_MAX - 64 * 1024)
#define HOSTD_DIFF_LABEL     "for a diff"

GVariant *
hostd_checkpoint_diff(HostdContext *ctx, const char *name, const char *id, const char *other,
                      const char *under, gboolean *ret_truncated, VmProgressFunc progress,
                      gpointer progress_data, GError **error)
{
    g_auto(HostdCheckpointOpen) o = {0};
    g_autofree char *normalized = NULL;

    if (under != NULL && !vm_guest_path_check(under, &normalized, error))
        return NULL;
    if (!hostd_checkpoint_open(ctx, name, id, &o, error))
        return NULL;
    g_autofree char *old_image = vm_checkpoint_set_path(o.set, o.checkpoint->image);
    g_autofree char *new_image = NULL;
    g_autofree char *temporary = NULL;
    if (other != NULL) {
        const VmCheckpoint *theirs = vm_checkpoint_set_find(o.set, other);
        if (theirs == NULL)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' has no checkpoint '%s'", name,
                            other),
                   NULL;
        new_image = vm_checkpoint_set_path(o.set, theirs->image);
    } else if (hostd_libvirt_is_active(o.dom)) {
        /* The running disk changes under any reader: compare against a frozen copy of this
         * instant, which is merged away again below. */
        g_autofree char *warning = NULL;
        const VmCheckpoint *now = hostd_checkpoint_create_locked(
            ctx, o.record, o.dom, o.set, HOSTD_DIFF_LABEL, TRUE, FALSE, &warning, error);
        if (now == NULL)
            return NULL;
        temporary = g_strdup(now->id);
        new_image = vm_checkpoint_set_path(o.set, now->image);
    } else {
        new_image = vm_checkpoint_set_path(o.set, o.set->active);
    }

    hostd_progress(progress, progress_data, "comparing the files (a helper appliance starts)", -1);
    g_autoptr(GError) diff_error = NULL;
    gboolean helper_truncated = FALSE;
    g_autoptr(GPtrArray) changes =
        hostd_guestfs_diff(ctx, o.record, old_image, new_image, normalized, HOSTD_DIFF_MAX_BYTES,
                           &helper_truncated, &diff_error);
    if (temporary != NULL) {
        const VmCheckpoint *t = vm_checkpoint_set_find(o.set, temporary);
        if (t != NULL)
            hostd_checkpoint_rm_locked(ctx, o.record, o.dom, o.set, t, NULL);
    }
    if (changes == NULL) {
        g_propagate_error(error, g_steal_pointer(&diff_error));
        return NULL;
    }

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("a(ss)"));
    gsize bytes = 0;
    *ret_truncated = helper_truncated;
    for (guint i = 0; i < changes->len; i++) {
        const VmGuestChange *change = changes->pdata[i];
        /* Guest paths are bytes; the wire carries UTF-8. */
        g_autofree char *shown = g_utf8_make_valid(change->path, -1);
        bytes += strlen(shown) + 16;
        if (bytes > HOSTD_DIFF_MAX_BYTES) {
            *ret_truncated = TRUE;
            break;
        }
        char kind[2] = {change->kind, '\0'};
        g_variant_builder_add(&b, "(ss)", kind, shown);
    }
    return g_variant_builder_end(&b);
}

GVariant *
hostd_checkpoint_restore_paths(HostdContext *ctx, const char *name, const char *id,
                               const char *const *paths, char **ret_undo, VmProgressFunc progress,
                               gpointer progress_data, GError **error)
{
    g_autoptr(GPtrArray) checked = g_ptr_array_new_with_free_func(g_free);
    for (const char *const *p = paths; *p != NULL; p++) {
        char *normalized = NULL;
        if (!vm_guest_path_check(*p, &normalized, error))
            return NULL;
        g_ptr_array_add(checked, normalized);
    }
    g_ptr_array_add(checked, NULL);

    g_auto(HostdCheckpointOpen) o = {0};
    if (!hostd_checkpoint_open(ctx, name, id, &o, error))
        return NULL;
    if (!hostd_libvirt_is_active(o.dom))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not running; start it first (or restore it whole)", name),
               NULL;

    /* Everything that can fail on the checkpoint's side happens before the guest is touched. */
    hostd_progress(progress, progress_data, "reading the paths from the checkpoint", -1);
    g_autofree char *image = vm_checkpoint_set_path(o.set, o.checkpoint->image);
    g_autofree char *tar = hostd_agent_record_path(o.record, "restore-paths.tar");
    /* hostd's own file, gone from the directory at once: the helper only writes into it. */
    vm_autofd tar_fd = open(tar, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (tar_fd < 0)
        return vm_throw_errno(error, errno, "cannot make %s", tar), NULL;
    g_unlink(tar);
    g_autoptr(GError) export_error = NULL;
    if (!hostd_guestfs_export(ctx, o.record, image, (const char *const *)checked->pdata, tar_fd,
                              &export_error)) {
        /* Users know checkpoints by id, not by file. */
        g_autoptr(GString) message = g_string_new(export_error->message);
        g_autofree char *quoted = g_strdup_printf("'%s'", image);
        g_autofree char *ours = g_strdup_printf("checkpoint %s", id);
        g_string_replace(message, quoted, ours, 0);
        vm_throw(error, export_error->code, "%s", message->str);
        return NULL;
    }
    if (lseek(tar_fd, 0, SEEK_SET) < 0)
        return vm_throw_errno(error, errno, "cannot read %s", tar), NULL;

    hostd_progress(progress, progress_data, "checkpointing the current state", -1);
    g_autofree char *undo_label = g_strdup_printf("before restore of paths from %s", id);
    g_autofree char *warning = NULL;
    const VmCheckpoint *undo = hostd_checkpoint_create_locked(
        ctx, o.record, o.dom, o.set, undo_label, TRUE, FALSE, &warning, error);
    if (undo == NULL)
        return NULL;
    g_autofree char *undo_id = g_strdup(undo->id);

    hostd_progress(progress, progress_data, "putting the paths back", -1);
    g_autoptr(GStrvBuilder) argv = g_strv_builder_new();
    g_strv_builder_add_many(argv, "sudo", "-n", "sh", "-c",
                            "rm -rf -- \"$@\" && exec tar -xpf - -C / --numeric-owner "
                            "--no-overwrite-dir --xattrs --xattrs-include='*' --acls",
                            "sh", NULL);
    for (guint i = 0; checked->pdata[i] != NULL; i++)
        g_strv_builder_add(argv, checked->pdata[i]);
    g_auto(GStrv) command = g_strv_builder_end(argv);
    int status = -1;
    g_autofree char *guest_stderr = NULL;
    if (!hostd_agent_run(ctx, o.record, command, tar_fd, &status, &guest_stderr, error))
        return NULL;
    if (status != 0)
        return vm_throw(error, VM_ERROR_FAILED,
                        "the guest could not put the paths back (exit %d): %s; undo with "
                        "vmctl restore %s %s",
                        status, g_strstrip(guest_stderr), name, undo_id),
               NULL;
    hostd_agent_emit_up(ctx, o.record);
    if (ret_undo != NULL)
        *ret_undo = g_steal_pointer(&undo_id);
    return hostd_agent_to_variant(ctx, o.record);
}
