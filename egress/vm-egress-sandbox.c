/* The egress worker's confinement: user, capabilities, no_new_privs, seccomp. */
#include "vm-egress-sandbox.h"

#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vm-error.h"

/* What a proxy does: sockets in and out, poll, threads, memory, time, reading the resolver's
 * and the trust store's files. */
static const char *const allowed[] = {
    /* I/O on descriptors it has */
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "close",
    "lseek",
    "fcntl",
    "ioctl",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "eventfd2",
    /* waiting */
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    /* the network: socket() is narrowed to IPv4, IPv6 and netlink below */
    "connect",
    "accept",
    "accept4",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
    "bind",
    "getsockname",
    "getpeername",
    "setsockopt",
    "getsockopt",
    /* files the resolver (resolv.conf, hosts, nsswitch, NSS modules) and GnuTLS read */
    "openat",
    "open",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
    "getdents64",
    "getcwd",
    "uname",
    "sysinfo",
    /* memory */
    "brk",
    "mmap",
    "munmap",
    "mremap",
    "mprotect",
    "madvise",
    "membarrier",
    /* threads (clone is narrowed to threads below) and their locks */
    "futex",
    "set_robust_list",
    "get_robust_list",
    "set_tid_address",
    "rseq",
    "sched_yield",
    "sched_getaffinity",
    "gettid",
    "getpid",
    "getppid",
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getresuid",
    "getresgid",
    "getgroups",
    "prlimit64",
    "getrlimit",
    "arch_prctl",
    /* time and randomness */
    "clock_gettime",
    "clock_getres",
    "clock_nanosleep",
    "nanosleep",
    "gettimeofday",
    "time",
    "getrandom",
    /* signals of its own, and leaving */
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigtimedwait",
    "rt_sigpending",
    "sigaltstack",
    "restart_syscall",
    "tgkill",
    "exit",
    "exit_group",
};

/* Kill the process at once: what only an attacker who runs code in the worker would call. */
static const char *const killed[] = {
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "capset",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "fork",
    "vfork",
    "kill",
    "tkill",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
};

static gboolean
add_rule(scmp_filter_ctx ctx, uint32_t action, const char *name, GError **error)
{
    int nr = seccomp_syscall_resolve_name(name);
    int rc;

    /* A call this architecture does not have needs no rule. */
    if (nr == __NR_SCMP_ERROR)
        return TRUE;
    rc = seccomp_rule_add(ctx, action, nr, 0);
    if (rc < 0 && rc != -EACCES)
        return vm_throw(error, VM_ERROR_IO, "seccomp rule for %s: %s", name, g_strerror(-rc));
    return TRUE;
}

gboolean
vm_egress_sandbox_filter_load(GError **error)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    static const int domains[] = {AF_INET, AF_INET6, AF_NETLINK};
    gboolean ok = FALSE;
    int rc;

    if (ctx == NULL)
        return vm_throw(error, VM_ERROR_IO, "cannot make a seccomp filter");
    for (gsize i = 0; i < G_N_ELEMENTS(allowed); i++) {
        if (!add_rule(ctx, SCMP_ACT_ALLOW, allowed[i], error))
            goto out;
    }
    for (gsize i = 0; i < G_N_ELEMENTS(killed); i++) {
        if (!add_rule(ctx, SCMP_ACT_KILL_PROCESS, killed[i], error))
            goto out;
    }
    /* Sockets for the destinations, DNS and getifaddrs() only: no Unix sockets (the host's own
     * services), no raw or packet sockets (those need capabilities it lacks anyway). */
    for (gsize i = 0; i < G_N_ELEMENTS(domains); i++) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1,
                              SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)domains[i]));
        if (rc < 0) {
            vm_throw(error, VM_ERROR_IO, "seccomp rule for socket: %s", g_strerror(-rc));
            goto out;
        }
    }
    /* A connected pair of Unix sockets reaches nothing outside the process: the SSH worker's
     * relay of the session over the virtio port (hostd-ssh-serial.c). */
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socketpair), 1,
                          SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)AF_UNIX));
    if (rc < 0) {
        vm_throw(error, VM_ERROR_IO, "seccomp rule for socketpair: %s", g_strerror(-rc));
        goto out;
    }
    /* clone() for threads only; a new process (no CLONE_THREAD) kills it. clone3() passes its
     * flags in memory a filter cannot read: ENOSYS makes the C library use clone(). */
    rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD));
    if (rc >= 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_KILL_PROCESS, SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
    if (rc >= 0 && seccomp_syscall_resolve_name("clone3") != __NR_SCMP_ERROR)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), seccomp_syscall_resolve_name("clone3"),
                              0);
    /* prctl only to read or name things, never to change the process's limits. */
    if (rc >= 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                              SCMP_A0(SCMP_CMP_EQ, PR_SET_NAME));
    if (rc >= 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(prctl), 1,
                              SCMP_A0(SCMP_CMP_EQ, PR_GET_NAME));
    if (rc < 0) {
        vm_throw(error, VM_ERROR_IO, "seccomp rule: %s", g_strerror(-rc));
        goto out;
    }
    rc = seccomp_load(ctx);
    if (rc < 0) {
        vm_throw(error, VM_ERROR_IO, "cannot load the seccomp filter: %s", g_strerror(-rc));
        goto out;
    }
    ok = TRUE;
out:
    seccomp_release(ctx);
    return ok;
}

/* Every capability out of the bounding set (while it still has CAP_SETPCAP), so that nothing
 * it executes could get one back; the other sets are emptied by capset() below. */
static gboolean
drop_bounding_set(GError **error)
{
    for (int cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0)
            break; /* past the kernel's last capability */
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return vm_throw(error, VM_ERROR_IO, "cannot drop capability %d: %s", cap,
                            g_strerror(errno));
    }
    return TRUE;
}

static gboolean
clear_capabilities(GError **error)
{
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2] = {{0}};

    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return vm_throw(error, VM_ERROR_IO, "cannot clear ambient capabilities: %s",
                        g_strerror(errno));
    if (syscall(SYS_capset, &header, data) < 0)
        return vm_throw(error, VM_ERROR_IO, "cannot drop capabilities: %s", g_strerror(errno));
    return TRUE;
}

gboolean
vm_egress_sandbox_enter(gboolean change_user, uid_t uid, gid_t gid, GError **error)
{
    if (change_user) {
        if (geteuid() != 0)
            return vm_throw(error, VM_ERROR_IO, "changing to uid %u needs root", (guint)uid);
        if (!drop_bounding_set(error))
            return FALSE;
        if (setgroups(0, NULL) < 0)
            return vm_throw(error, VM_ERROR_IO, "setgroups: %s", g_strerror(errno));
        if (setresgid(gid, gid, gid) < 0)
            return vm_throw(error, VM_ERROR_IO, "setresgid %u: %s", (guint)gid, g_strerror(errno));
        if (setresuid(uid, uid, uid) < 0)
            return vm_throw(error, VM_ERROR_IO, "setresuid %u: %s", (guint)uid, g_strerror(errno));
        /* Root cannot be regained. */
        if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0))
            return vm_throw(error, VM_ERROR_IO, "could regain root after dropping it");
    } else if (geteuid() == 0 && !drop_bounding_set(error)) {
        return FALSE;
    }
    if (!clear_capabilities(error))
        return FALSE;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return vm_throw(error, VM_ERROR_IO, "no_new_privs: %s", g_strerror(errno));
    /* The process cannot be dumped or ptraced by its new uid's other processes. */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    return vm_egress_sandbox_filter_load(error);
}
