/* Domain XML for one agent: a pure transform from VmDomainSpec to libvirt XML. */
#pragma once

#include <glib.h>

#include "vm-protocol.h" /* VmDiskLimit */

G_BEGIN_DECLS

#define VM_MACHINE_TYPE "pc-q35-7.2" /* pinned, so saved state and checkpoints stay loadable */
/* The devices' guest-visible features, which a saved memory image was made with and a restore
 * must match: raised with each change of them (2: the balloon's free page reporting). A warm
 * image made with another is stale. */
#define VM_DOMAIN_DEVICES_VERSION "4" /* 4: the resolver's guest forward */
/* The virtio port on which the guest runs an sshd for hostd alone (hostd/hostd-ssh-serial.h). */
#define VM_DOMAIN_SSH_CHANNEL "org.vmctl.ssh.0"

/* Where the guest finds its egress proxy: an address inside QEMU's user network (10.0.2.0/24)
 * that no host owns, answered by the guestfwd rule below. */
#define VM_EGRESS_GUEST_ADDRESS "10.0.2.100"
#define VM_EGRESS_GUEST_PORT    3128
/* The proxy's resolver, DNS over TCP (docs/EGRESS.md), on the same address: a guestfwd rule
 * after the proxy's runs the same command with "dns". */
#define VM_EGRESS_DNS_PORT 53

/* Where the guest finds hostd's in-guest API (docs/GUEST-API.md): the same address, port 80,
 * answered by a second guestfwd rule. */
#define VM_GUEST_API_ADDRESS VM_EGRESS_GUEST_ADDRESS
#define VM_GUEST_API_PORT    80

/* The seccomp sandbox every domain gives QEMU itself. libvirt's own (seccomp_sandbox = 1 in
 * qemu.conf) adds spawn=deny, which kills QEMU at the guest's first connection to the egress
 * proxy, and elevateprivileges=deny, which kills the program QEMU spawns for it (libslirp calls
 * setsid() in the child). Where hostd turns libvirt's off, this one, which denies everything else
 * libvirt's does, takes its place; where libvirt's stays on, the two stack (seccomp filters
 * add up), which is harmless as long as no egress_command is set. */
#define VM_DOMAIN_SANDBOX "on,obsolete=deny,resourcecontrol=deny"

typedef struct {
    const char *name;
    const char *uuid;               /* canonical 36-char form */
    const char *genid;              /* the VM generation ID (36-char form), or NULL: none. Linux
                                     * reseeds its RNG when it changes, which a restore of a warm
                                     * image into a new agent does */
    const char *virt_type;          /* "kvm" or "qemu" */
    const char *const *cpu_disable; /* KVM: host CPU features hidden from the guest; or NULL */
    const char *emulator;           /* NULL: libvirt's default */
    guint cpus;
    guint memory_mib;
    const char *disk_path;             /* qcow2 overlay, discard=unmap */
    const char *const *backing_chain;  /* the qcow2 images below disk_path, top-down, as the
                                        * caller's record has them; or NULL: libvirt reads the
                                        * chain from the images' headers */
    guint disk_limits[VM_DISK_LIMITS]; /* VmDiskLimit; all 0: no <iotune> */
    const char *seed_path;             /* NoCloud ISO (cdrom, read-only), or NULL */
    const char *kernel_path;           /* direct kernel boot, or NULL to boot from the disk */
    const char *initrd_path;
    const char *cmdline;
    const char *mac;               /* 52:54:00:xx:xx:xx */
    guint ssh_port;                /* host side, bound to 127.0.0.1 */
    const char *console_socket;    /* the serial console: a Unix socket QEMU listens on */
    const char *agent_socket;      /* qemu-guest-agent channel socket path */
    const char *metadata_xml;      /* inner XML for <metadata>, or NULL */
    const char *egress_command;    /* a shell-quoted command QEMU runs for each guest connection to
                                    * VM_EGRESS_GUEST_ADDRESS:VM_EGRESS_GUEST_PORT, the connection
                                    * as its stdin/stdout; NULL: the guest has no way out at all */
    const char *guest_api_command; /* the same for each guest connection to VM_GUEST_API_ADDRESS:
                                    * VM_GUEST_API_PORT (hostd's in-guest API); NULL: none */
    guint qemu_id; /* the uid and gid QEMU runs as (libvirt's static DAC label, files not
                    * relabelled: their owners are the caller's to set); 0: the driver's user,
                    * files relabelled by libvirt as it does by default */
} VmDomainSpec;

/* Returns newly allocated domain XML for @spec: q35 pinned machine type, virtio disk with
 * discard and the disk_limits that are set (<iotune>), NoCloud cdrom, virtio-rng from /dev/urandom,
 * TCG tb-cache 128 MiB when virt_type is "qemu", the host's CPU (less cpu_disable) under KVM,
 * qemu-guest-agent channel, serial console on a Unix socket QEMU listens on (nobody reading it
 * never blocks QEMU or the guest), and QEMU user networking with restrict=on and a single hostfwd
 * 127.0.0.1:ssh_port -> guest :22 (through <qemu:commandline>, since libvirt has no restricted user
 * network), and QEMU's own seccomp sandbox VM_DOMAIN_SANDBOX; with qemu_id, QEMU runs as that uid
 * and gid and libvirt changes no file's owner. With backing_chain, the disk's <backingStore>
 * elements name each image of it (format qcow2): libvirt then reads no header of those images,
 * only of the last one's own backing file, if it has one, and QEMU is given the same chain
 * rather than the one the headers name. With egress_command, the network also gets the
 * guestfwd to it, and with guest_api_command one to the in-guest API after it (and libvirt's
 * sandbox must be off, see above). Strings are XML-escaped. Fails with VM_ERROR_INVALID_ARGUMENT
 * when a required field is missing, a command is empty or holds a control character, or a disk
 * limit is over VM_DISK_LIMIT_MAX. */
char *vm_domain_xml_build(const VmDomainSpec *spec, GError **error);

/* The seed's CD-ROM <disk> element as vm_domain_xml_build() writes it, with @seed_path as its
 * medium (escaped), or none when @seed_path is NULL or empty (an empty drive): what a live
 * change of the medium hands libvirt. Newly allocated; can't fail. */
char *vm_domain_seed_xml(const char *seed_path);

G_END_DECLS
