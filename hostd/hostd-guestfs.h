/* Files inside an agent's checkpoint images (diff, a partial restore's tar), read by
 * vm-guestfs-helper in a process of its own, never in hostd: libguestfs's appliance parses
 * images and filesystems the guest wrote. When agents have ids of their own (hostd-confine.h)
 * the helper runs as the agent's id, which reads that agent's images (and the images of a fork's
 * source it stands on) and nothing else of any agent's; an agent without an id is read with
 * hostd's own user (docs/SECURITY.md, "Not built yet"). The appliance is a fixed one hostd keeps
 * under <state dir>/guestfs-appliance, built from the host's packages, readable to all. */
#pragma once

#include "hostd-context.h"
#include "hostd-state.h"

G_BEGIN_DECLS

/* The helper program: $VM_GUESTFS_HELPER, else the build tree's when this hostd runs from its
 * build tree, else the installed one. Newly allocated. */
char *hostd_guestfs_helper_path(void);

/* What changed from @old_image to @new_image (images of @r's chain) below guest path @under
 * (NULL: all; already checked), as vm_guestfs_diff_at() returns it, with at most about
 * @max_bytes of paths: *@ret_truncated says whether more were dropped. Fails with the codes of
 * vm_guestfs_diff(), or VM_ERROR_IO when the helper cannot run or its answer is malformed. */
GPtrArray *hostd_guestfs_diff(HostdContext *ctx, const HostdAgentRecord *r, const char *old_image,
                              const char *new_image, const char *under, gsize max_bytes,
                              gboolean *ret_truncated, GError **error);

/* Writes to @tar_fd (a file hostd opened, at its start) a tar of @paths (checked) as they are in
 * @image, as vm_guestfs_export_at() makes it. Fails with the codes of vm_guestfs_export(), or
 * VM_ERROR_IO when the helper cannot run. */
gboolean hostd_guestfs_export(HostdContext *ctx, const HostdAgentRecord *r, const char *image,
                              const char *const *paths, int tar_fd, GError **error);

G_END_DECLS
