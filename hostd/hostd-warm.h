/* Warm images: a template's machine booted once and saved settled, so that `new` restores it
 * into each agent instead of booting (docs/INSTANT.md).
 *
 * A warm image lives in <images>/<template>/warm/<build>/: disk.qcow2 (the disk layer the
 * machine ran on, over the template's base image, never written again), memory.save (libvirt's
 * save image of its RAM and devices) and warm.ini (what it was made with). `current` names the
 * build new agents get; older builds stay while an agent's disk stands on them.
 *
 * The machine holds no key: its seed is generic (vm_seed's warm mode) and its sshd never started.
 * Each agent made from it gets its identity through the guest agent before sshd starts:
 * hostname, machine-id, hostd's host key and agent key, a new VM generation ID (Linux reseeds its
 * RNG) with fresh entropy, the clock. Library code: errors in VM_ERROR, no logging.
 */
#pragma once

#include "hostd-context.h"
#include "vm-image.h"
#include "vm-template.h"

G_BEGIN_DECLS

typedef struct {
    char *dir;
    char *disk_path;   /* the warm disk layer */
    char *memory_path; /* the save image */
    char *instance_id; /* cloud-init's instance of the warm boot: agents keep it */
    char *mac;         /* the NIC's MAC, which the saved device state carries */
    guint cpus;
    guint memory_mib;
    guint disk_gib;
} HostdWarmImage;

void hostd_warm_image_free(HostdWarmImage *warm);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdWarmImage, hostd_warm_image_free)

/* Boots @tpl's @image once with a generic seed, waits until cloud-init is done (sshd not
 * started, no host key), and saves it as the template's current warm image; removes older builds
 * no agent stands on. Nothing of a failed build is left. VM_ERROR_BAD_STATE for a template that
 * cannot be warm (it installs packages at first boot, which needs the network the warm boot does
 * not have), VM_ERROR_TIMEOUT, VM_ERROR_LIBVIRT, VM_ERROR_IO. */
gboolean hostd_warm_build(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image,
                          VmProgressFunc progress, gpointer progress_data, GError **error);

/* The current warm image of @tpl when an agent of @cpus, @memory_mib and @disk_gib can be made
 * from it on this host now; else NULL, and *ret_why (newly allocated) says why in a few words:
 * none built, stale (the base image, QEMU, libvirt, the machine type, the accelerator or the
 * template changed since), or another size asked for. */
HostdWarmImage *hostd_warm_lookup(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image,
                                  guint cpus, guint memory_mib, guint disk_gib, char **ret_why);

/* "yes", or why not (as hostd_warm_lookup() with the template's own sizes), newly allocated. */
char *hostd_warm_state(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image);

typedef struct {
    const char *hostname;
    const char *machine_id;       /* 32 hex digits */
    const char *user;             /* whose authorized_keys get the agent key */
    const char *agent_key;        /* hostd's public key line for the agent */
    const char *host_key_private; /* OpenSSH PEM */
    const char *host_key_public;
    const char *drop_comment; /* a key with this comment is removed first, or NULL */
    /* The grants of a new agent (as its seed's, VmSeedSpec), put in place before sshd starts:
     * its agent_up hook then finds them there and the first SSH session already has them, where
     * writing them over SSH took seconds and a new connection under emulation. NULL: none. */
    const char *egress_ca_pem;     /* trusted at once (VM_SEED_TRUST_CA_SCRIPT) */
    const char *environment_block; /* hostd's block of /etc/environment */
} HostdWarmIdentity;

/* Restores the save image @memory_path into the defined, inactive domain @dom as @xml (its
 * definition): a copy with @xml in its header at @scratch_path, restored running, removed.
 * Then applies @id with hostd_warm_identify(); with @id NULL it is restored paused and nothing
 * applied (a warm pool's machine, identified once `new` takes it). VM_ERROR_LIBVIRT,
 * VM_ERROR_TIMEOUT, VM_ERROR_IO; the domain may be left running on failure (the caller destroys
 * it). *ret_trace gets the phases' times ("copy 210 ms, restore 900 ms, ..."), newly
 * allocated, when not NULL. */
gboolean hostd_warm_restore(HostdContext *ctx, virDomainPtr dom, const char *memory_path,
                            const char *xml, const char *scratch_path, const HostdWarmIdentity *id,
                            char **ret_trace, GError **error);

/* In the restored guest @dom, running: waits for its guest agent, applies @id through it, sets
 * the clock and starts sshd; appends ", guest agent N ms, identity N ms" to @trace.
 * VM_ERROR_TIMEOUT, VM_ERROR_LIBVIRT, VM_ERROR_FAILED (the identity script failed). */
gboolean hostd_warm_identify(HostdContext *ctx, virDomainPtr dom, const HostdWarmIdentity *id,
                             GString *trace, GError **error);

/* Writes the generic seed of @tpl's warm machines to @path: no key of any kind, the warm
 * hostname, @instance_id (the warm build's). VM_ERROR_IO, VM_ERROR_INVALID_ARGUMENT. */
gboolean hostd_warm_write_seed(const VmTemplate *tpl, const char *instance_id, const char *path,
                               GError **error);

G_END_DECLS
