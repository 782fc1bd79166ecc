/* File-system helpers shared by hostd and the image builder. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Removes @path and everything below it. A symbolic link is removed, never followed, wherever it
 * is in the tree (@path itself included), and the removal never crosses into another file system:
 * a mount point below @path (a build killed mid-way may leave /proc mounted in its rootfs) makes
 * it fail instead. A missing @path is success. Fails with VM_ERROR_IO naming the first entry it
 * could not remove; what was removed before stays removed. */
gboolean vm_remove_tree(const char *path, GError **error);

G_END_DECLS
