/* Reading the XML libvirt hands back: a domain's definition (what vm_domain_xml_build() wrote,
 * as libvirt keeps or runs it) and the host's capabilities.
 *
 * Every document is parsed with libxml2 without network access and without entities: one with
 * a document type declaration (libvirt never writes one) is refused before any of its
 * declarations is read, so no entity is expanded and no external file or DTD is ever loaded.
 * Documents over VM_DOMAIN_READ_MAX bytes are refused. Nothing is printed: parse errors come back
 * as GErrors. Safe to call from any thread.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_DOMAIN_READ_MAX (16 * 1024 * 1024)

/* The namespace of <qemu:commandline> in domain XML. */
#define VM_DOMAIN_QEMU_NS "http://libvirt.org/schemas/domain/qemu/1.0"

/* The files the disks of domain XML @xml read as their top image: the file attribute of each
 * <source> of a <disk> under <devices>, in document order; a disk with no file adds nothing, and
 * the images of a <backingStore> are not listed. Returns a NULL-terminated array, possibly empty
 * (free with g_strfreev()). Fails with VM_ERROR_FAILED when @xml is over VM_DOMAIN_READ_MAX
 * bytes, is not well-formed, has a document type declaration, or its root is not <domain>. */
GStrv vm_domain_read_disk_files(const char *xml, GError **error);

/* The image chain of domain XML @xml's disk vda, top-down: its <source>'s file, then that of
 * each <backingStore> nested in it, as far as the XML names them (libvirt's live XML lists what
 * it read from the headers too). Returns a NULL-terminated array, empty when there is no such
 * disk. Fails as vm_domain_read_disk_files(). */
GStrv vm_domain_read_disk_chain(const char *xml, GError **error);

/* The values of the <qemu:arg> elements of domain XML @xml's <qemu:commandline>
 * (VM_DOMAIN_QEMU_NS), in order. Returns a NULL-terminated array, possibly empty. Fails as
 * vm_domain_read_disk_files(). */
GStrv vm_domain_read_qemu_args(const char *xml, GError **error);

/* The rules of the guestfwd= options of every -netdev argument among domain XML @xml's
 * <qemu:arg>s, unescaped (QEMU's ",," is a comma): "tcp:10.0.2.100:3128-cmd:...". Returns a
 * NULL-terminated array, possibly empty. Fails as vm_domain_read_disk_files(). */
GStrv vm_domain_read_guestfwds(const char *xml, GError **error);

/* The VM generation ID of domain XML @xml (<genid>, as libvirt writes it: it makes a new one at
 * each restore of a saved state), newly allocated; NULL with no error when it has none. Fails as
 * vm_domain_read_disk_files(). */
char *vm_domain_read_genid(const char *xml, GError **error);

/* The vCPU count (<vcpu>'s maximum) and memory size (<memory>, in its unit: KiB when libvirt
 * wrote it, b, KiB, MiB, GiB or their one-letter forms) of domain XML @xml, in @ret_cpus and
 * @ret_memory_mib (rounded down to whole MiB). Fails with VM_ERROR_NOT_FOUND when either is
 * missing, not a number, of another unit, or zero, else as vm_domain_read_disk_files(). */
gboolean vm_domain_read_sizes(const char *xml, guint *ret_cpus, guint *ret_memory_mib,
                              GError **error);

/* The path of the Unix socket that QEMU listens on for the virtio port VM_DOMAIN_SSH_CHANNEL in
 * live domain XML @xml (libvirt names it at each start), newly allocated; NULL with no error
 * when the domain has no such port. Fails as vm_domain_read_disk_files(). */
char *vm_domain_read_ssh_channel(const char *xml, GError **error);

/* Splits a QEMU option string ("user,id=n0,guestfwd=...") at its commas, where ",," stands for
 * one comma inside an option. Returns a NULL-terminated array of at least one string (empty
 * strings where commas meet the ends). Pure, can't fail. */
GStrv vm_qemu_opts_split(const char *opts);

/* The user and group libvirt's DAC security driver runs QEMU as for domains of @virt_type
 * ("kvm" or "qemu"), from the capabilities XML @caps: the <baselabel type='@virt_type'> of the
 * <secmodel> whose <model> is "dac", which reads "+UID:+GID". Writes @ret_uid and @ret_gid.
 * Fails with VM_ERROR_NOT_FOUND when there is no such label (the test driver, a session
 * connection) or it is not of that form, else as vm_domain_read_disk_files() with a root that
 * is not <capabilities>. */
gboolean vm_capabilities_read_dac_owner(const char *caps, const char *virt_type, guint *ret_uid,
                                        guint *ret_gid, GError **error);

G_END_DECLS
