/* vmctl cp: a file or tree copied between this host and an agent, or between two agents, as a
 * tar stream through an EXEC of `tar` in each guest (so it goes wherever exec goes: the agent's
 * SSH worker, a remote hostd, the wake of a saved agent).
 *
 * Where the copy lands is cp's rule: onto an existing directory, into it under the source's own
 * name; otherwise to the destination's name, whose parent must exist. Directories are always
 * copied whole. A copy onto this host, and one into a guest under a new name, is unpacked beside
 * its destination first and put in place at the end, so a failed copy leaves nothing there.
 */
#pragma once

#include "vmctl-client.h"

#include <glib.h>

G_BEGIN_DECLS

/* One side of a copy, as the command line names it. */
typedef struct {
    char *agent; /* NULL: this host */
    char *path;  /* in the guest: "" is the agent user's home */
} VmctlCopyLocation;

/* Reads the argument @arg as scp does: AGENT:PATH names a path in an agent when a ':' comes
 * before any '/'; anything else (a name with ':' included, written ./a:b or /x/a:b) is local.
 * Fails with VM_ERROR_INVALID_ARGUMENT for an invalid agent name or an empty local path. Fills
 * @ret_location (free its strings with vmctl_copy_location_clear()). */
gboolean vmctl_copy_location_parse(const char *arg, VmctlCopyLocation *ret_location,
                                   GError **error);

void vmctl_copy_location_clear(VmctlCopyLocation *location);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(VmctlCopyLocation, vmctl_copy_location_clear)

/* Told of @bytes more moved (from any thread of the copy). */
typedef void (*VmctlCopyMovedFunc)(guint64 bytes, gpointer user_data);

/* A copy fails once nothing moved for this long: a dead guest or connection. */
#define VMCTL_COPY_IDLE_TIMEOUT_S 300

/* Copies @from to @to through hostd at @endpoint (at least one of them in an agent), telling
 * @moved (may be NULL) of the stream's bytes as they go. With @local_root (an absolute path
 * without symlinks, or NULL: anywhere), the local path must lie in that directory once its
 * directories are resolved, else the copy fails with VM_ERROR_INVALID_ARGUMENT. Fails with hostd's
 * error (VM_ERROR_NOT_FOUND for an unknown agent), VM_ERROR_GUEST_PATH when a path in a guest does
 * not exist, VM_ERROR_IO for a local path that cannot be read or written, VM_ERROR_INVALID_ARGUMENT
 * when both sides are local, VM_ERROR_PROTOCOL when a guest's stream is refused, VM_ERROR_TIMEOUT
 * when the transfer stalls, VM_ERROR_FAILED when `tar` in a guest fails (its last words
 * quoted). */
gboolean vmctl_copy(const VmctlEndpoint *endpoint, const VmctlCopyLocation *from,
                    const VmctlCopyLocation *to, const char *local_root, VmctlCopyMovedFunc moved,
                    gpointer moved_data, GError **error);

G_END_DECLS
