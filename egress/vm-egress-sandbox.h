/* The egress worker's confinement (docs/SECURITY.md): what it gives up before it reads a byte a
 * guest sent. */
#pragma once

#include <glib.h>
#include <sys/types.h>

G_BEGIN_DECLS

/* Confines the calling process for good, all threads (call it before any thread starts): with
 * @change_user (only as root) every supplementary group dropped and the real, effective and
 * saved ids set to @uid/@gid; every capability dropped from the bounding, inheritable, ambient,
 * permitted and effective sets; no_new_privs; then the seccomp filter
 * (vm_egress_sandbox_filter_load()). Fails with VM_ERROR_IO naming the step; the process must
 * then exit rather than go on. */
gboolean vm_egress_sandbox_enter(gboolean change_user, uid_t uid, gid_t gid, GError **error);

/* Installs the worker's seccomp filter (libseccomp): the system calls a proxy needs are allowed,
 * exec, ptrace and the other ones docs/SECURITY.md lists kill the process, everything else fails
 * with EPERM. Needs no_new_privs (or CAP_SYS_ADMIN). Fails with VM_ERROR_IO. */
gboolean vm_egress_sandbox_filter_load(GError **error);

G_END_DECLS
