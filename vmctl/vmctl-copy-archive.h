/* The tar streams of vmctl cp on the host's side: a local file or tree packed as a tar stream
 * for `tar -x` in a guest, and a guest's tar stream unpacked into a local directory.
 *
 * The guest is hostile: what it sends is unpacked only under the target directory, with names
 * checked before they touch the disk (relative, no `.` or `..` component, one top name), through
 * no symlink (libarchive's ARCHIVE_EXTRACT_SECURE_SYMLINKS and _NODOTDOT), with no set-user-ID
 * or set-group-ID bit and no device, fifo or socket, and hard links only to a regular file the
 * same stream made. Nothing here logs or holds more than a block in memory.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Takes the next @len bytes at @data of the stream being written. */
typedef gboolean (*VmctlCopyWriteFunc)(const void *data, gsize len, gpointer user_data,
                                       GError **error);

/* Points @ret_data at the next bytes of the stream being read and returns their number, 0 at
 * its end, -1 with @error set on failure. */
typedef gssize (*VmctlCopyReadFunc)(gpointer user_data, const guint8 **ret_data, GError **error);

/* Packs the local file, symlink (as itself) or tree at @path into a tar stream (POSIX pax) whose
 * top entry is named @name, and hands it to @write in blocks. Modes and modification times go
 * with it; owners do not. Fails with VM_ERROR_IO naming the local path that could not be read,
 * or with @write's error. */
gboolean vmctl_copy_archive_pack(const char *path, const char *name, VmctlCopyWriteFunc write,
                                 gpointer user_data, GError **error);

/* Unpacks the tar stream that @read yields into the existing directory @dir (an absolute path
 * without symlinks: realpath(3)'s), as the calling user. Every entry must be named TOP or
 * TOP/..., TOP being the first entry's first component; TOP becomes @new_name (NULL: TOP) on
 * disk. Modes (less set-user-ID and set-group-ID) and modification times are kept; symlinks are
 * made as they are and never followed. Stops at the stream's end marker. It is unpacked in a
 * fresh directory in @dir first, then put in place: renamed, or merged into a directory of that
 * name already there (its entries replaced, added to). Fails with VM_ERROR_PROTOCOL for a
 * malformed stream or a refused entry (the entry named), VM_ERROR_IO when the disk refuses, or
 * with @read's error; a failure before the move leaves @dir as it was. */
gboolean vmctl_copy_archive_unpack(VmctlCopyReadFunc read, gpointer user_data, const char *dir,
                                   const char *new_name, GError **error);

G_END_DECLS
