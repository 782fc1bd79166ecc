/* The workers' confinement (docs/SECURITY.md): what the egress worker, the SSH worker and the
 * in-guest API worker give up before they read a byte a guest sent. */
#pragma once

#include <glib.h>
#include <sys/types.h>

G_BEGIN_DECLS

/* What the confined process does, which sets its seccomp filter and its Landlock rules. */
typedef enum {
    /* A proxy (vm-egress-worker) whose TCP connections hostd makes (vm-egress-wire.h): IPv4
     * and IPv6 UDP sockets (its resolver's DNS), a netlink route socket (getifaddrs()), the
     * resolver's and the trust store's files; no TCP socket. */
    VM_SANDBOX_EGRESS,
    /* An SSH client that makes no connection of its own (vm-ssh-worker): every socket it uses
     * was handed over by hostd, so no socket(), connect(), bind(), listen() or accept(); a
     * socketpair only of Unix stream sockets (its relay of the session over the virtio port). */
    VM_SANDBOX_SSH,
    /* An HTTP server on a listening socket it was handed (vm-guest-api-worker): accept() and
     * accept4() on what it holds, no socket(), socketpair(), connect(), bind() or listen(); of
     * the files only the libraries and their data (no resolver, no trust store). */
    VM_SANDBOX_API,
} VmSandboxProfile;

/* Confines the calling process for good, all threads (call it before any thread starts: with
 * another thread running it fails): with
 * @change_user (only as root) every supplementary group dropped and the real, effective and
 * saved ids set to @uid/@gid; every capability dropped from the bounding, inheritable, ambient,
 * permitted and effective sets; no_new_privs; not dumpable; the Landlock rules of @profile
 * (vm_egress_sandbox_landlock()) where the kernel has Landlock; then the seccomp filter of
 * @profile (vm_egress_sandbox_filter_load()). On success *@ret_note (when not NULL) is NULL, or
 * a line for the operator saying what was missing (no Landlock in this kernel: files are then
 * closed to the worker only by its uid). Fails with VM_ERROR_IO naming the step; the process
 * must then exit rather than go on. */
gboolean vm_egress_sandbox_enter(VmSandboxProfile profile, gboolean change_user, uid_t uid,
                                 gid_t gid, char **ret_note, GError **error);

/* Restricts the calling thread (and what it starts later) with Landlock: every file-system
 * access handled, and only reading granted, beneath the paths @profile needs (the libraries in
 * /usr, /dev/null and /dev/urandom; and but for VM_SANDBOX_API the resolver's and TLS's
 * configuration in /etc); nothing
 * may be written, made or removed anywhere (/tmp, /dev/shm included), and /proc and /sys are
 * closed. Where the kernel's ABI has them: TCP bind and TCP connect refused, signals only to
 * processes in the same domain, abstract Unix sockets only of the same domain. Needs
 * no_new_privs. Returns TRUE with *@ret_enforced TRUE once enforced, or FALSE when the kernel has
 * no Landlock (or has it disabled); fails with VM_ERROR_IO when a step failed. */
gboolean vm_egress_sandbox_landlock(VmSandboxProfile profile, gboolean *ret_enforced,
                                    GError **error);

/* Installs the seccomp filter of @profile (libseccomp) for the calling process, whose pid it
 * uses: the system calls the worker needs are allowed, some only with the arguments it needs
 * (tgkill of its own pid, prlimit64 reading its own limits, clone for threads, socket,
 * socketpair, connect and accept per @profile: for VM_SANDBOX_EGRESS socket() only of IPv4/IPv6
 * UDP and netlink route, for VM_SANDBOX_API no socket() at all); exec, ptrace, fork, kill, tkill
 * and the other ones
 * docs/SECURITY.md lists kill the process; everything else fails with EPERM. Needs
 * no_new_privs (or CAP_SYS_ADMIN). Fails with VM_ERROR_IO. */
gboolean vm_egress_sandbox_filter_load(VmSandboxProfile profile, GError **error);

G_END_DECLS
