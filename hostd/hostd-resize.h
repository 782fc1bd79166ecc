/* More CPUs, memory or disk for an agent that exists (vmctl set; docs/LIFECYCLE.md).
 *
 * The record (agent.ini) and the persistent definition always take the new sizes, so hostd's
 * restarts, forks, checkpoints and the next cold start see them. What the running VM sees:
 * - the disk grows at once: a running agent's (paused and saved ones are woken first, as exec
 *   wakes them) through QEMU's block resize, then its root filesystem inside the guest over SSH;
 *   a stopped agent's active overlay with qemu-img, and its filesystem when it next answers;
 * - CPUs and memory change live only where the running domain was defined with room for more
 *   (a maximum above the current count or size); hostd's own definitions have none, so they
 *   apply at the next cold start (vmctl stop, then vmctl start). A saved state holds the old
 *   sizes: waking it resumes them, and the new ones come with the next boot.
 * A disk never shrinks. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* The component: grows the guest's root filesystem to its disk when the agent comes up after a
 * grow it has not yet followed (agent_up). */
extern const HostdComponent hostd_resize_component;

/* What `vmctl set` asks for: for each of cpus, memory and disk an absolute value or an amount
 * to add to the agent's current one (0: not given; at most one of the two). */
typedef struct {
    const char *name;
    guint cpus;
    guint cpus_add;
    guint memory_mib;
    guint memory_add_mib;
    guint disk_gib;
    guint disk_add_gib;
} HostdResizeRequest;

/* The value a request asks for: @absolute when given, else @current plus @add (saturating at
 * G_MAXUINT), else @current. Pure, can't fail. */
guint hostd_resize_target(guint current, guint absolute, guint add);

/* Gives agent @req->name the sizes asked for, checked against hostd's limits
 * (hostd_check_resources()) before anything changes. Returns the agent (hostd_agent_to_variant())
 * and sets *@ret_changes to one line per size given ("cpus 4: at the next start ...",
 * "disk 21G: grown live, root filesystem too"; newly allocated, NULL-terminated). A filesystem
 * that does not grow after its disk did is reported in its line, not as a failure: the disk
 * stays grown (harmless), and the filesystem is grown the next time the agent comes up. Fails
 * with VM_ERROR_INVALID_ARGUMENT (nothing asked, both an absolute and a relative value, a
 * smaller disk), VM_ERROR_NOT_FOUND, VM_ERROR_NO_RESOURCES (over a limit), VM_ERROR_BAD_STATE
 * (a crashed agent's disk), VM_ERROR_LIBVIRT or VM_ERROR_IO, with the record and the definition
 * left as they were. */
GVariant *hostd_agent_set_resources(HostdContext *ctx, const HostdResizeRequest *req,
                                    char ***ret_changes, GError **error);

/* The shell script that grows the guest's root filesystem to its disk, run as the agent's user
 * (with sudo -n) as `sh -c SCRIPT sh BYTES`: it waits up to 10 s for the kernel to see a disk of
 * BYTES, grows the root partition with growpart where the root filesystem is on one, then
 * resize2fs (ext2/3/4 only). Exit 0 when the filesystem fills its disk. */
const char *hostd_resize_guest_script(void);

G_END_DECLS
