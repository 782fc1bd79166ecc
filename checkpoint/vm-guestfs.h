/* Reading files inside checkpoint images with libguestfs: what changed between two checkpoints,
 * and a tar of chosen paths as they were in a checkpoint, for a partial restore.
 *
 * An agent's disk is a qcow2 chain whose base holds one ext4 filesystem on the whole disk (no
 * partition table, label "root"); every image named here is the top of such a chain. Images are
 * opened read-only: the appliance's writes go to throwaway overlays and no image ever changes.
 * An image that a running VM writes to may be read, but what is seen is whatever had reached the
 * file, as after a crash; read checkpoint images, which are frozen.
 *
 * Every appliance launch costs ~12 s (much more under load), so a VmGuestfs session launches once
 * for any number of images and calls; vm_guestfs_diff() and vm_guestfs_export() are one-launch
 * shortcuts. Every call blocks until the appliance answered: run them in a worker thread, never
 * in a main loop. A session belongs to one thread at a time. The appliance runs without network
 * through the "direct" backend and nothing is printed: libguestfs errors come back as GErrors.
 *
 * The appliance's QEMU parses the images, which a guest wrote: hostd never calls this in its own
 * process but runs vm-guestfs-helper (vm-guestfs-helper.c) as the agent's own unprivileged id,
 * with a "fixed" appliance (vm_guestfs_appliance_build()) that any user can start.
 *
 * Guest paths are byte strings as the guest filesystem holds them: they may be non-UTF-8 and,
 * for paths found by a diff, may contain a newline.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_GUEST_PATH_MAX 4096

/* Checks a guest path a user named for a partial restore or a diff filter and returns it
 * normalized in @ret_normalized (newly allocated): empty and "." components are dropped, so
 * "//a/./b/" becomes "/a/b". Fails with VM_ERROR_INVALID_ARGUMENT, naming the path, when it is
 * not absolute, names the root itself, has a ".." component or one longer than 255 bytes,
 * contains a newline or is longer than VM_GUEST_PATH_MAX bytes. Pure. */
gboolean vm_guest_path_check(const char *path, char **ret_normalized, GError **error);

typedef struct {
    char kind;  /* 'A' added, 'D' deleted, 'M' modified */
    char *path; /* absolute guest path */
} VmGuestChange;

void vm_guest_change_free(VmGuestChange *change);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmGuestChange, vm_guest_change_free)

typedef struct _VmGuestfs VmGuestfs;

/* Launches one appliance with @images (a NULL-terminated list of qcow2 files, at least one) and
 * mounts the filesystem of each read-only; later calls name an image by its index in @images.
 * @appliance is the directory of a fixed appliance, or NULL for libguestfs's own (built in a
 * cache of the user's on first use).
 * Fails with VM_ERROR_NOT_FOUND when an image file does not exist, VM_ERROR_IO when libguestfs
 * cannot launch or an image holds no mountable filesystem, VM_ERROR_FAILED in a build without
 * libguestfs. Close with vm_guestfs_close(). */
VmGuestfs *vm_guestfs_open(const char *const *images, const char *appliance, GError **error);

/* Shuts the appliance down; its overlays vanish. Accepts NULL. */
void vm_guestfs_close(VmGuestfs *fs);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmGuestfs, vm_guestfs_close)

/* What was added ('A'), deleted ('D') and modified ('M') from image @old_index to image
 * @new_index, limited to guest path @under and everything below it (NULL: the whole filesystem;
 * @under is normalized with vm_guest_path_check(), and a path that crosses a symbolic link or a
 * non-directory in an image does not exist in that image). A path is 'M' when its type, mode,
 * owner, group, size, link target or device number differ, or when a regular file of unchanged
 * size has another mtime and other content (the bytes are compared: a `touch` alone is no change;
 * a same-size rewrite that keeps the mtime is not noticed). A directory is 'M' only for its type,
 * mode or owners, never because entries came or went. A tree that appeared or vanished is listed
 * whole: the directory and everything in it. Nothing is filtered out, so the guest's own churn
 * (logs, journals, caches, /var/lib state) shows up too. Returns VmGuestChange*, sorted by path
 * in byte order (strcmp), empty when nothing differs; the array frees its elements. Fails with
 * VM_ERROR_INVALID_ARGUMENT (bad @under), VM_ERROR_NOT_FOUND (@under exists in neither image) or
 * VM_ERROR_IO (libguestfs failed). */
GPtrArray *vm_guestfs_diff_at(VmGuestfs *fs, guint old_index, guint new_index, const char *under,
                              GError **error);

/* Writes to the host file @tar_path (replaced if it exists, mode 0600) an uncompressed tar of
 * @paths (NULL-terminated, at least one; each is checked with vm_guest_path_check()) exactly as
 * they are in image @index: each path with everything below it, plus the directories above it
 * (only themselves) with their own mode, owners and times. Members are relative to the guest's
 * root ("./", "./home/", "./home/u/x"), owners are numeric, symbolic links stay links, extended
 * attributes and POSIX ACLs are stored. A path below another one adds nothing. Extract it in the
 * guest with `tar -xpf - -C / --numeric-owner --no-overwrite-dir`, so that existing parents keep
 * their metadata (add `--xattrs --xattrs-include='*' --acls` to restore those too). Fails with
 * VM_ERROR_NOT_FOUND naming the first path that does not exist in the image,
 * VM_ERROR_INVALID_ARGUMENT for a bad path or one that lies below a symbolic link in the image
 * (name the real path), VM_ERROR_IO when libguestfs or the host file fails; on failure @tar_path
 * is left as it was and no temporary file stays behind. */
gboolean vm_guestfs_export_at(VmGuestfs *fs, guint index, const char *const *paths,
                              const char *tar_path, GError **error);

/* One launch: vm_guestfs_diff_at() between the two images. Errors as there and as
 * vm_guestfs_open(). */
GPtrArray *vm_guestfs_diff(const char *old_image, const char *new_image, const char *under,
                           const char *appliance, GError **error);

/* One launch: vm_guestfs_export_at() from @image. Errors as there and as vm_guestfs_open(). */
gboolean vm_guestfs_export(const char *image, const char *const *paths, const char *tar_path,
                           const char *appliance, GError **error);

/* Makes (or brings up to date) in @dir a fixed appliance that libguestfs starts as any user:
 * supermin builds it from the host's own packages (only when they are newer than what @dir
 * holds; a new one replaces the old with a rename), and its kernel, initrd and root are made
 * readable to all. Runs as root: it reads host files only, never an image. Takes seconds, and
 * ~700 MiB (a sparse 4 GiB root). Fails with VM_ERROR_IO (supermin failed, or cannot write
 * @dir), VM_ERROR_TIMEOUT after 10 minutes, VM_ERROR_FAILED in a build without libguestfs. */
gboolean vm_guestfs_appliance_build(const char *dir, GError **error);

/* The changes of a diff as bytes another process can read back: at most about @max_bytes of
 * paths (0: all), the rest dropped and marked as truncated. Can't fail. */
GBytes *vm_guest_changes_encode(GPtrArray *changes, gsize max_bytes);

/* Reads back what vm_guest_changes_encode() made, as untrusted input (the helper that wrote it
 * runs as an agent's id): only the normal form, kinds A, D or M, absolute paths of at most
 * VM_GUEST_PATH_MAX bytes without NUL. Returns VmGuestChange* as vm_guestfs_diff_at() does and
 * whether the list was cut in @ret_truncated (may be NULL). Fails with VM_ERROR_IO. */
GPtrArray *vm_guest_changes_decode(const void *data, gsize len, gboolean *ret_truncated,
                                   GError **error);

G_END_DECLS
