/* Base images: built with mmdebstrap or downloaded, cached under an images directory.
 *
 * Layout of a ready image: <images_dir>/<template>/base.qcow2 (+ vmlinuz and initrd.img for
 * direct kernel boot of built images) and image.ini describing it. A directory without
 * image.ini is incomplete and is rebuilt; builds happen in <template>.tmp-XXXXXX and are renamed
 * into place, so an interrupted build never looks ready.
 */
#pragma once

#include <gio/gio.h>

#include "vm-progress.h"
#include "vm-template.h"

G_BEGIN_DECLS

typedef struct {
    char *dir;         /* <images_dir>/<template> */
    char *disk_path;   /* base.qcow2 */
    char *kernel_path; /* NULL when the image boots from its disk */
    char *initrd_path; /* NULL when the image boots from its disk */
    char *cmdline;     /* kernel command line for direct boot, or NULL */
    guint64 virtual_size;
} VmImage;

void vm_image_free(VmImage *image);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmImage, vm_image_free)

/* Returns the ready image of @template_ under @images_dir, or NULL with VM_ERROR_NOT_FOUND
 * when it has not been built/downloaded yet. */
VmImage *vm_image_lookup(const char *images_dir, const VmTemplate *template_, GError **error);

/* Makes sure the image of @template_ is ready: returns it at once when cached (unless @force),
 * else builds (mmdebstrap) or downloads (url: resumable, sha256-verified) it, reporting
 * progress through @progress. Cancellable. Fails with VM_ERROR_IMAGE (with the failing step's
 * last output lines), VM_ERROR_CANCELLED, VM_ERROR_IO. Nothing half-made is left visible. */
VmImage *vm_image_ensure(const char *images_dir, const VmTemplate *template_, gboolean force,
                         VmProgressFunc progress, gpointer progress_data, GCancellable *cancellable,
                         GError **error);

/* The image build script (build-debian-image.sh) a build runs: the one in $VM_TEMPLATES_DIR when
 * that names a directory holding it, else the shipped one (vm_shipped_templates_dir(): the source
 * tree's only when this program runs from its build tree). Newly allocated; fails with
 * VM_ERROR_NOT_FOUND when neither exists. */
char *vm_image_find_script(GError **error);

G_END_DECLS
