/* libvirt's QEMU save image: the header libvirt puts before QEMU's migration stream (a warm
 * image, a memory checkpoint, a managed save), read and rewritten.
 *
 * libvirt restores a save image only into the domain it was taken from: a definition given
 * with the restore must pass virDomainDefCheckABIStability(), which refuses another UUID. A
 * warm image is restored into many agents, each with its own name, UUID, disk, seed and ports,
 * so hostd writes each agent a copy whose header holds that agent's definition; the stream of
 * RAM and device state after it is copied unchanged. libvirt has no call that does this.
 *
 * The layout (libvirt's qemu_saveimage.h, QEMU_SAVE_VERSION 2, host byte order): 16 bytes of
 * magic "LibvirtQemudSave", then the 32-bit words version, data_len, was_running, compressed,
 * cookieOffset and 14 unused; then data_len bytes holding the domain XML and the save cookie,
 * each NUL-terminated, and zeros (libvirt leaves 64 KiB of room); then the stream. The header
 * is read as untrusted: every length is checked against the file before it is used.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_SAVE_IMAGE_MAGIC   "LibvirtQemudSave"
#define VM_SAVE_IMAGE_VERSION 2
/* The most XML and cookie hostd reads from a header: libvirt's own data areas are ~70 KiB. */
#define VM_SAVE_IMAGE_DATA_MAX (4 * 1024 * 1024)

/* The domain XML held in the header of the save image at @path (newly allocated). Fails with
 * VM_ERROR_IO when it cannot be read and VM_ERROR_INVALID_ARGUMENT when it is not a complete,
 * uncompressed save image of this layout. */
char *vm_save_image_read_xml(const char *path, GError **error);

/* Writes to @dest (created, mode 0600; an existing file is replaced) the save image @src with
 * @xml as its domain XML: the same header words, cookie and stream, the data area the same size,
 * so the stream stays at the offset it had. The stream is copied in the kernel
 * (copy_file_range(), which shares blocks where the file system can). Fails as
 * vm_save_image_read_xml(), and with VM_ERROR_INVALID_ARGUMENT when @xml and the cookie do not
 * fit in @src's data area; on failure @dest does not exist. */
gboolean vm_save_image_copy_with_xml(const char *src, const char *dest, const char *xml,
                                     GError **error);

G_END_DECLS
