/* The workers' confinement: user, capabilities, no_new_privs, Landlock, seccomp. */
#include "vm-egress-sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/landlock.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sched.h>
#include <seccomp.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vm-error.h"

/* What every worker does: I/O on the sockets they have, poll, threads, memory, time, reading the
 * resolver's and the trust store's files. */
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
    /* sockets it has (those it may make: per profile, below) */
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
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
    "exit",
    "exit_group",
};

/* The egress worker's own: its resolver's UDP sockets (connect() and bind() on them: TCP it has
 * none, and Landlock refuses TCP connect and bind), and its proxy's listening socket (handed
 * over by hostd) to accept on. The SSH worker gets EPERM for all of them. */
static const char *const allowed_egress[] = {
    "connect",
    "accept",
    "accept4",
    "bind",
};

/* The in-guest API worker's own: guest connections on the listening api.sock hostd handed over.
 * It makes no socket, so it can reach no address: no connect(), bind() or listen(). */
static const char *const allowed_api[] = {
    "accept",
    "accept4",
};

/* Kill the process at once: what only an attacker who runs code in the worker would call. A
 * signal to itself goes through tgkill() (raise(), abort()), so kill() and tkill() have no
 * use. */
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

/* One rule with its argument comparisons (ANDed); -errno from libseccomp. */
#define RULE(ctx, action, name, ...)                                                               \
    seccomp_rule_add((ctx), (action), SCMP_SYS(name),                                              \
                     sizeof((struct scmp_arg_cmp[]){__VA_ARGS__}) / sizeof(struct scmp_arg_cmp),   \
                     __VA_ARGS__)

/* The calls allowed only with some arguments. @pid is the process's own. */
static int
add_argument_rules(scmp_filter_ctx ctx, VmSandboxProfile profile, pid_t pid)
{
    /* socket() and socketpair() take SOCK_CLOEXEC and SOCK_NONBLOCK in their type: compared
     * without them, on the low 32 bits the kernel reads of an int. */
    const scmp_datum_t type_mask = (scmp_datum_t)(guint32) ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
    const scmp_datum_t inet[] = {AF_INET, AF_INET6};
    int rc;

    /* Signals to its own threads only (the C library's raise() and abort()); another process's
     * pid fails with EPERM. */
    rc = RULE(ctx, SCMP_ACT_ALLOW, tgkill, SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)pid));
    /* Its own limits, read only: never another process's (a worker throttling another agent's),
     * never set. */
    rc = rc < 0 ? rc
                : RULE(ctx, SCMP_ACT_ALLOW, prlimit64, SCMP_A0(SCMP_CMP_EQ, 0),
                       SCMP_A2(SCMP_CMP_EQ, 0));
    rc = rc < 0 ? rc
                : RULE(ctx, SCMP_ACT_ALLOW, prlimit64, SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)pid),
                       SCMP_A2(SCMP_CMP_EQ, 0));
    /* clone() for threads only; a new process (no CLONE_THREAD) kills it. clone3() passes its
     * flags in memory a filter cannot read: ENOSYS makes the C library use clone(). */
    rc = rc < 0 ? rc
                : RULE(ctx, SCMP_ACT_ALLOW, clone,
                       SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD));
    rc = rc < 0 ? rc
                : RULE(ctx, SCMP_ACT_KILL_PROCESS, clone,
                       SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
    if (rc >= 0 && seccomp_syscall_resolve_name("clone3") != __NR_SCMP_ERROR)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), seccomp_syscall_resolve_name("clone3"),
                              0);
    /* prctl only to read or name things, never to change the process's limits. */
    rc = rc < 0 ? rc : RULE(ctx, SCMP_ACT_ALLOW, prctl, SCMP_A0(SCMP_CMP_EQ, PR_SET_NAME));
    rc = rc < 0 ? rc : RULE(ctx, SCMP_ACT_ALLOW, prctl, SCMP_A0(SCMP_CMP_EQ, PR_GET_NAME));
    if (rc < 0)
        return rc;

    switch (profile) {
    case VM_SANDBOX_EGRESS:
        /* UDP sockets for DNS (the resolver it is configured with), and getifaddrs()'s netlink
         * route socket. No TCP socket: its connections out are made by hostd, which checks each
         * destination again (vm-egress-wire.h), so no connect() to 127.0.0.1 or a private
         * address whatever the process runs. No Unix sockets (the host's own services,
         * /dev/log), no other netlink family (NETLINK_SOCK_DIAG lists the host's sockets), no
         * ICMP, raw or packet sockets. */
        for (gsize i = 0; rc >= 0 && i < G_N_ELEMENTS(inet); i++) {
            rc = RULE(ctx, SCMP_ACT_ALLOW, socket, SCMP_A0(SCMP_CMP_EQ, inet[i]),
                      SCMP_A1(SCMP_CMP_MASKED_EQ, type_mask, SOCK_DGRAM), SCMP_A2(SCMP_CMP_EQ, 0));
            rc = rc < 0 ? rc
                        : RULE(ctx, SCMP_ACT_ALLOW, socket, SCMP_A0(SCMP_CMP_EQ, inet[i]),
                               SCMP_A1(SCMP_CMP_MASKED_EQ, type_mask, SOCK_DGRAM),
                               SCMP_A2(SCMP_CMP_EQ, IPPROTO_UDP));
        }
        rc = rc < 0 ? rc
                    : RULE(ctx, SCMP_ACT_ALLOW, socket, SCMP_A0(SCMP_CMP_EQ, AF_NETLINK),
                           SCMP_A2(SCMP_CMP_EQ, NETLINK_ROUTE));
        break;
    case VM_SANDBOX_SSH:
        /* No socket of its own: a connected pair of Unix stream sockets reaches nothing outside
         * the process (its relay of the session over the virtio port, hostd-ssh-serial.c). A
         * datagram pair could carry descriptors without a connection; it has no use for one. */
        rc = RULE(ctx, SCMP_ACT_ALLOW, socketpair, SCMP_A0(SCMP_CMP_EQ, AF_UNIX),
                  SCMP_A1(SCMP_CMP_MASKED_EQ, type_mask, SOCK_STREAM));
        break;
    case VM_SANDBOX_API:
        /* Every socket it uses was handed over (api.sock, hostd's channel) or accepted on one:
         * socket() and socketpair() stay refused. */
        break;
    default:
        g_assert_not_reached();
    }
    return rc;
}

gboolean
vm_egress_sandbox_filter_load(VmSandboxProfile profile, GError **error)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    gboolean ok = FALSE;
    int rc;

    if (ctx == NULL)
        return vm_throw(error, VM_ERROR_IO, "cannot make a seccomp filter");
    for (gsize i = 0; i < G_N_ELEMENTS(allowed); i++) {
        if (!add_rule(ctx, SCMP_ACT_ALLOW, allowed[i], error))
            goto out;
    }
    for (gsize i = 0; profile == VM_SANDBOX_EGRESS && i < G_N_ELEMENTS(allowed_egress); i++) {
        if (!add_rule(ctx, SCMP_ACT_ALLOW, allowed_egress[i], error))
            goto out;
    }
    for (gsize i = 0; profile == VM_SANDBOX_API && i < G_N_ELEMENTS(allowed_api); i++) {
        if (!add_rule(ctx, SCMP_ACT_ALLOW, allowed_api[i], error))
            goto out;
    }
    for (gsize i = 0; i < G_N_ELEMENTS(killed); i++) {
        if (!add_rule(ctx, SCMP_ACT_KILL_PROCESS, killed[i], error))
            goto out;
    }
    rc = add_argument_rules(ctx, profile, getpid());
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

/* ---- Landlock ------------------------------------------------------------------------------ */

/* Read beneath these (a path the host lacks is skipped): the libraries and their data, what the
 * C library's resolver and NSS read, OpenSSL's, GnuTLS's and the trust store's configuration. */
static const char *const readable[] = {
    "/usr",
    "/lib",
    "/lib64",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ssl",
    "/etc/gnutls",
    "/etc/crypto-policies",
    "/etc/pki",
    "/etc/ca-certificates",
    "/dev/null",
    "/dev/urandom",
    "/dev/random",
};

/* The in-guest API worker's: libsoup, GIO and the C library need no more than their own files
 * (GIO's modules, the locale's data) and randomness; it resolves no name and checks no
 * certificate. */
static const char *const readable_api[] = {
    "/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/dev/null", "/dev/urandom",
};

/* What the header of this build knows of each ABI; a kernel with an older one is given only
 * what it has. */
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)
#endif

#define FS_ABI1 ((LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1)
#define FS_READ (LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR)

/* The ruleset attribute as the kernel's ABI @abi takes it: its size, 0 when too old. */
typedef struct {
    guint64 handled_access_fs;
    guint64 handled_access_net;
    guint64 scoped;
} RulesetAttr;

static gsize
ruleset_attr_for(int abi, RulesetAttr *attr)
{
    gsize size = sizeof(attr->handled_access_fs);

    memset(attr, 0, sizeof(*attr));
    attr->handled_access_fs = FS_ABI1;
    if (abi >= 2)
        attr->handled_access_fs |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3)
        attr->handled_access_fs |= LANDLOCK_ACCESS_FS_TRUNCATE;
    if (abi >= 5)
        attr->handled_access_fs |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
    if (abi >= 4) {
        /* TCP ports: none bound, none connected to: neither worker connects anywhere (hostd
         * connects for both). The filter refuses them a TCP socket already; this holds for one
         * that came another way. */
        attr->handled_access_net = 1ULL << 0;  /* LANDLOCK_ACCESS_NET_BIND_TCP */
        attr->handled_access_net |= 1ULL << 1; /* LANDLOCK_ACCESS_NET_CONNECT_TCP */
        size = 2 * sizeof(guint64);
    }
    if (abi >= 6) {
        /* LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL */
        attr->scoped = (1ULL << 0) | (1ULL << 1);
        size = 3 * sizeof(guint64);
    }
    return size;
}

/* Read access beneath @path for @ruleset; a path the host lacks is skipped. */
static gboolean
allow_read(int ruleset, const char *path, GError **error)
{
    struct landlock_path_beneath_attr rule = {0};
    struct stat st;
    int fd = open(path, O_PATH | O_CLOEXEC);
    int rc;

    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR || errno == EACCES
                   ? TRUE
                   : vm_throw_errno(error, errno, "Landlock: cannot open %s", path);
    if (fstat(fd, &st) < 0) {
        close(fd);
        return vm_throw_errno(error, errno, "Landlock: cannot stat %s", path);
    }
    /* A directory's right only on a directory: the kernel refuses it on a file. */
    rule.allowed_access = S_ISDIR(st.st_mode) ? FS_READ : LANDLOCK_ACCESS_FS_READ_FILE;
    rule.parent_fd = fd;
    rc = (int)syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    close(fd);
    if (rc < 0)
        return vm_throw_errno(error, errno, "Landlock: cannot add a rule for %s", path);
    return TRUE;
}

gboolean
vm_egress_sandbox_landlock(VmSandboxProfile profile, gboolean *ret_enforced, GError **error)
{
    int abi = (int)syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    RulesetAttr attr;
    const char *const *paths;
    gsize n_paths;
    gsize size;
    int ruleset;

    if (abi < 0) {
        /* ENOSYS: not built in; EOPNOTSUPP: not enabled at boot (lsm=). */
        if (errno != ENOSYS && errno != EOPNOTSUPP)
            return vm_throw_errno(error, errno, "Landlock: cannot read its ABI version");
        *ret_enforced = FALSE;
        return TRUE;
    }
    size = ruleset_attr_for(abi, &attr);
    ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (ruleset < 0)
        return vm_throw_errno(error, errno, "Landlock: cannot make the ruleset (ABI %d)", abi);
    paths = profile == VM_SANDBOX_API ? readable_api : readable;
    n_paths = profile == VM_SANDBOX_API ? G_N_ELEMENTS(readable_api) : G_N_ELEMENTS(readable);
    for (gsize i = 0; i < n_paths; i++) {
        if (!allow_read(ruleset, paths[i], error)) {
            close(ruleset);
            return FALSE;
        }
    }
    if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0) {
        int saved = errno;

        close(ruleset);
        return vm_throw_errno(error, saved, "Landlock: cannot enforce the ruleset");
    }
    close(ruleset);
    *ret_enforced = TRUE;
    return TRUE;
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

/* Landlock and the seccomp filter bind the calling thread and those it starts later: a thread
 * started before would stay free. */
static gboolean
check_one_thread(GError **error)
{
    g_autoptr(GDir) tasks = g_dir_open("/proc/self/task", 0, NULL);
    guint n = 0;

    /* Without /proc there is nothing to count: the callers start no thread before. */
    if (tasks == NULL)
        return TRUE;
    while (g_dir_read_name(tasks) != NULL)
        n++;
    if (n > 1)
        return vm_throw(error, VM_ERROR_IO, "%u threads run before the sandbox: it binds one", n);
    return TRUE;
}

gboolean
vm_egress_sandbox_enter(VmSandboxProfile profile, gboolean change_user, uid_t uid, gid_t gid,
                        char **ret_note, GError **error)
{
    gboolean landlocked = FALSE;

    if (!check_one_thread(error))
        return FALSE;
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
    if (!vm_egress_sandbox_landlock(profile, &landlocked, error) ||
        !vm_egress_sandbox_filter_load(profile, error))
        return FALSE;
    if (ret_note != NULL)
        *ret_note = landlocked ? NULL
                               : g_strdup("no Landlock in this kernel: the worker's files are "
                                          "closed to it by its uid only");
    return TRUE;
}
