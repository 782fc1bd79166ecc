/* Internals of vm-image.c and vm-image-download.c, visible to tests. */
#pragma once

#include <gio/gio.h>

#include "vm-image.h"

G_BEGIN_DECLS

#define VM_IMAGE_INI       "image.ini"
#define VM_IMAGE_DISK      "base.qcow2"
#define VM_IMAGE_KERNEL    "vmlinuz"
#define VM_IMAGE_INITRD    "initrd.img"
#define VM_IMAGE_CMDLINE   "root=LABEL=root rw console=ttyS0"
#define VM_IMAGE_BUILD_LOG "build.log"
#define VM_IMAGE_SCRIPT    "build-debian-image.sh"

/* What the header of a qcow2 file says about it. */
typedef struct {
    guint32 version;
    guint64 virtual_size;
    gboolean has_backing_file;
    gboolean has_external_data;
} VmQcow2Info;

/* Reads the qcow2 header of @path. Returns FALSE with VM_ERROR_IO when unreadable; with
 * @ret_is_qcow2 set to FALSE (and TRUE returned) when the file is not qcow2 at all; else
 * fills @ret_info. */
gboolean vm_image_qcow2_probe(const char *path, gboolean *ret_is_qcow2, VmQcow2Info *ret_info,
                              GError **error);

/* Downloads @template_'s url into @part_path, resuming a previous partial download, then
 * checks the sha256 of the whole file. On a sha256 mismatch or an HTTP error the partial file is
 * deleted; on a network failure or cancellation it is kept for the next attempt. Fails with
 * VM_ERROR_IMAGE, VM_ERROR_CANCELLED, VM_ERROR_IO or VM_ERROR_INVALID_ARGUMENT (not http(s)). */
gboolean vm_image_download(const VmTemplate *template_, const char *part_path,
                           VmProgressFunc progress, gpointer progress_data,
                           GCancellable *cancellable, GError **error);

G_END_DECLS
