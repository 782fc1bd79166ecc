/* The workers' confinement (docs/SECURITY.md), tried in child processes: what each profile needs
 * works; each rule that narrows a call by its arguments refuses the rest with EPERM; exec, fork
 * and kill kill the process; Landlock closes every file outside the worker's own. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vm-egress-sandbox.h"

#ifndef NETLINK_SOCK_DIAG
#define NETLINK_SOCK_DIAG 4
#endif

typedef int (*Probe)(void);

/* What the parent made for the probes before the fork: a TCP listener on 127.0.0.1, an
 * unconnected TCP socket, a bound Unix datagram socket (as /dev/log is), a connected Unix
 * stream pair, and a directory of files. */
static struct {
    int listener;
    guint16 port;
    int tcp;
    int dgram;
    char *dgram_path;
    int pair[2];
    char *dir;
    char *file;
} the;

static int
setup(void **state)
{
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    socklen_t len = sizeof(in);

    the.listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(the.listener >= 0);
    assert_int_equal(bind(the.listener, (struct sockaddr *)&in, sizeof(in)), 0);
    assert_int_equal(listen(the.listener, 8), 0);
    assert_int_equal(getsockname(the.listener, (struct sockaddr *)&in, &len), 0);
    the.port = ntohs(in.sin_port);
    the.tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(the.tcp >= 0);

    the.dir = g_dir_make_tmp("test-sandbox-XXXXXX", NULL);
    assert_non_null(the.dir);
    the.dgram_path = g_build_filename(the.dir, "log", NULL);
    g_strlcpy(un.sun_path, the.dgram_path, sizeof(un.sun_path));
    the.dgram = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    assert_true(the.dgram >= 0);
    assert_int_equal(bind(the.dgram, (struct sockaddr *)&un, sizeof(un)), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, the.pair), 0);
    the.file = g_build_filename(the.dir, "file", NULL);
    assert_true(g_file_set_contents(the.file, "x", 1, NULL));
    return 0;
}

static int
teardown(void **state)
{
    g_autofree char *shm = g_strdup_printf("/dev/shm/test-sandbox-%d", (int)getpid());
    g_autofree char *tmp = g_strdup_printf("/tmp/test-sandbox-%d", (int)getpid());

    close(the.listener);
    close(the.tcp);
    close(the.dgram);
    close(the.pair[0]);
    close(the.pair[1]);
    (void)unlink(shm);
    (void)unlink(tmp);
    (void)unlink(the.dgram_path);
    (void)unlink(the.file);
    (void)rmdir(the.dir);
    g_free(the.dgram_path);
    g_free(the.file);
    g_free(the.dir);
    return 0;
}

typedef enum {
    UNDER_FILTER,
    UNDER_LANDLOCK,
} Confinement;

/* Runs @probe in a child under @profile's filter or Landlock rules; its wait status. */
static int
run_confined(VmSandboxProfile profile, Confinement what, Probe probe)
{
    int status = 0;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        gboolean enforced = FALSE;

        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
            _exit(100);
        if (what == UNDER_FILTER && !vm_egress_sandbox_filter_load(profile, NULL))
            _exit(100);
        if (what == UNDER_LANDLOCK &&
            (!vm_egress_sandbox_landlock(profile, &enforced, NULL) || !enforced))
            _exit(100);
        _exit(probe());
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void
assert_probe(VmSandboxProfile profile, Confinement what, Probe probe)
{
    int status = run_confined(profile, what, probe);

    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void
assert_probe_killed(VmSandboxProfile profile, Probe probe)
{
    int status = run_confined(profile, UNDER_FILTER, probe);

    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSYS);
}

/* The call failed with EPERM (a probe's step); -1 as a probe's result when it did not. */
#define REFUSED(call) ((call) < 0 && errno == EPERM)

/* ---- what each worker needs ---------------------------------------------------------------- */

/* The resolver's UDP sockets (as the C library makes them) and getifaddrs()'s netlink route
 * socket. */
static int
probe_egress_sockets(void)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int fd6 = socket(AF_INET6, SOCK_DGRAM, IPPROTO_UDP);
    int route = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);

    return fd >= 0 && fd6 >= 0 && route >= 0 ? 0 : 1;
}

static int
probe_thread(void)
{
    GThread *thread = g_thread_new("probe", (GThreadFunc)g_strdup, (gpointer) "x");
    char *result = g_thread_join(thread);
    int ok = g_strcmp0(result, "x") == 0;

    g_free(result);
    return ok ? 0 : 1;
}

static int signalled;

static void
on_signal(int sig)
{
    signalled = sig;
}

/* Its own signals (raise() is tgkill() of its own pid) and its own limits, read. */
static int
probe_own_signal_and_limits(void)
{
    struct rlimit limit;

    signal(SIGUSR1, on_signal);
    if (raise(SIGUSR1) != 0 || signalled != SIGUSR1)
        return 1;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 ||
        syscall(SYS_prlimit64, getpid(), RLIMIT_NOFILE, NULL, &limit) != 0)
        return 2;
    return 0;
}

/* The SSH worker's relay: a Unix stream pair, close-on-exec and non-blocking flags included. */
static int
probe_stream_pair(void)
{
    int pair[2];

    return socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) == 0 ? 0 : 1;
}

static void
test_allowed(void **state)
{
    assert_probe(VM_SANDBOX_EGRESS, UNDER_FILTER, probe_egress_sockets);
    assert_probe(VM_SANDBOX_EGRESS, UNDER_FILTER, probe_thread);
    assert_probe(VM_SANDBOX_SSH, UNDER_FILTER, probe_thread);
    assert_probe(VM_SANDBOX_EGRESS, UNDER_FILTER, probe_own_signal_and_limits);
    assert_probe(VM_SANDBOX_SSH, UNDER_FILTER, probe_own_signal_and_limits);
    assert_probe(VM_SANDBOX_SSH, UNDER_FILTER, probe_stream_pair);
    assert_probe(VM_SANDBOX_API, UNDER_FILTER, probe_thread);
    assert_probe(VM_SANDBOX_API, UNDER_FILTER, probe_own_signal_and_limits);
}

/* ---- argument filters: one probe per rule -------------------------------------------------- */

/* tgkill() of another process (here the test's), even with signal 0. */
static int
probe_tgkill_other(void)
{
    return REFUSED(syscall(SYS_tgkill, getppid(), getppid(), 0)) ? 0 : 1;
}

/* prlimit64() of another process, reading or setting; its own limits set. */
static int
probe_prlimit_other(void)
{
    struct rlimit limit = {0, 0};

    if (!REFUSED(syscall(SYS_prlimit64, getppid(), RLIMIT_NOFILE, NULL, &limit)))
        return 1;
    if (!REFUSED(syscall(SYS_prlimit64, getppid(), RLIMIT_CPU, &limit, NULL)))
        return 2;
    if (!REFUSED(syscall(SYS_prlimit64, 0, RLIMIT_CORE, &limit, NULL)))
        return 3;
    return 0;
}

/* A pair of anything but Unix stream sockets: datagram and seqpacket ones carry messages (and
 * descriptors) without a connection. */
static int
probe_socketpair_other(void)
{
    int pair[2];

    if (!REFUSED(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair)))
        return 1;
    if (!REFUSED(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair)))
        return 2;
    return 0;
}

static int
probe_socket_unix(void)
{
    if (!REFUSED(socket(AF_UNIX, SOCK_STREAM, 0)))
        return 1;
    if (!REFUSED(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)))
        return 2;
    return 0;
}

/* NETLINK_SOCK_DIAG lists the host's sockets (ss -x); only the route family is the proxy's. */
static int
probe_netlink_diag(void)
{
    return REFUSED(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG)) ? 0 : 1;
}

/* Nothing reaches a host datagram socket (as /dev/log): no Unix datagram socket can be made,
 * and a socket it holds does not send to an address. */
static int
probe_send_datagram(void)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    int pair[2];
    int fd;

    g_strlcpy(un.sun_path, the.dgram_path, sizeof(un.sun_path));
    if (!REFUSED(socket(AF_UNIX, SOCK_DGRAM, 0)) ||
        !REFUSED(socketpair(AF_UNIX, SOCK_DGRAM, 0, pair)))
        return 1;
    if (sendto(the.pair[0], "x", 1, MSG_NOSIGNAL, (struct sockaddr *)&un, sizeof(un)) >= 0)
        return 2;
    fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd >= 0 && sendto(fd, "x", 1, 0, (struct sockaddr *)&un, sizeof(un)) >= 0)
        return 3;
    return 0;
}

/* The SSH worker makes no connection: no socket of its own, no connect() on one it holds, no
 * listening or accepting. */
static int
probe_ssh_network(void)
{
    struct sockaddr_in in = {.sin_family = AF_INET,
                             .sin_port = htons(the.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

    if (!REFUSED(socket(AF_INET, SOCK_STREAM, 0)) || !REFUSED(socket(AF_INET6, SOCK_DGRAM, 0)) ||
        !REFUSED(socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)))
        return 1;
    if (!REFUSED(connect(the.tcp, (struct sockaddr *)&in, sizeof(in))))
        return 2;
    if (!REFUSED(bind(the.tcp, (struct sockaddr *)&in, sizeof(in))) ||
        !REFUSED(listen(the.tcp, 1)) || !REFUSED(accept(the.listener, NULL, NULL)) ||
        !REFUSED(accept4(the.listener, NULL, NULL, SOCK_CLOEXEC)))
        return 3;
    return 0;
}

/* The API worker makes no socket of any kind and reaches no address with one it holds; it only
 * accepts on the listening socket it was handed (below). */
static int
probe_api_network(void)
{
    struct sockaddr_in in = {.sin_family = AF_INET,
                             .sin_port = htons(the.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    int pair[2];

    g_strlcpy(un.sun_path, the.dgram_path, sizeof(un.sun_path));
    if (!REFUSED(socket(AF_INET, SOCK_STREAM, 0)) || !REFUSED(socket(AF_INET6, SOCK_DGRAM, 0)) ||
        !REFUSED(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) ||
        !REFUSED(socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)))
        return 1;
    if (!REFUSED(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair)))
        return 2;
    if (!REFUSED(connect(the.tcp, (struct sockaddr *)&in, sizeof(in))) ||
        !REFUSED(connect(the.pair[0], (struct sockaddr *)&un, sizeof(un))))
        return 3;
    if (!REFUSED(bind(the.tcp, (struct sockaddr *)&in, sizeof(in))) || !REFUSED(listen(the.tcp, 1)))
        return 4;
    return 0;
}

/* A guest connection waiting on the listening socket it holds is accepted (accept4(), as the
 * worker does, and accept()). */
static int
probe_api_accept(void)
{
    int fd = accept4(the.listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    int fd2 = accept(the.listener, NULL, NULL);

    return fd >= 0 && fd2 >= 0 ? 0 : 1;
}

static void
test_api_accept(void **state)
{
    /* two guest connections waiting, made by the test */
    struct sockaddr_in in = {.sin_family = AF_INET,
                             .sin_port = htons(the.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int client[2];

    for (int i = 0; i < 2; i++) {
        client[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_int_equal(connect(client[i], (struct sockaddr *)&in, sizeof(in)), 0);
    }
    assert_probe(VM_SANDBOX_API, UNDER_FILTER, probe_api_accept);
    close(client[0]);
    close(client[1]);
}

/* The egress worker makes no TCP socket (hostd connects for it), in any spelling; nor an ICMP
 * or SCTP one. A TCP socket it was given still cannot listen. */
static int
probe_egress_tcp(void)
{
    if (!REFUSED(socket(AF_INET, SOCK_STREAM, 0)) ||
        !REFUSED(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) ||
        !REFUSED(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, IPPROTO_TCP)) ||
        !REFUSED(socket(AF_INET, SOCK_DGRAM, IPPROTO_TCP)) ||
        !REFUSED(socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)) ||
        !REFUSED(socket(AF_INET6, SOCK_SEQPACKET, 0)))
        return 1;
    if (!REFUSED(listen(the.tcp, 1)))
        return 2;
    return 0;
}

static void
test_refused(void **state)
{
    char byte;

    for (VmSandboxProfile p = VM_SANDBOX_EGRESS; p <= VM_SANDBOX_API; p++) {
        assert_probe(p, UNDER_FILTER, probe_tgkill_other);
        assert_probe(p, UNDER_FILTER, probe_prlimit_other);
        assert_probe(p, UNDER_FILTER, probe_socketpair_other);
        assert_probe(p, UNDER_FILTER, probe_socket_unix);
        assert_probe(p, UNDER_FILTER, probe_netlink_diag);
        assert_probe(p, UNDER_FILTER, probe_send_datagram);
    }
    assert_probe(VM_SANDBOX_EGRESS, UNDER_FILTER, probe_egress_tcp);
    assert_probe(VM_SANDBOX_SSH, UNDER_FILTER, probe_ssh_network);
    assert_probe(VM_SANDBOX_API, UNDER_FILTER, probe_api_network);
    /* Nothing came through: no datagram, no connection. */
    assert_true(recv(the.dgram, &byte, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
    assert_true(accept(the.listener, NULL, NULL) < 0 && errno == EAGAIN);
}

/* ---- what kills the process ------------------------------------------------------------------ */

static int
probe_exec(void)
{
    char *const argv[] = {(char *)"/bin/true", NULL};

    execv(argv[0], argv);
    return 1;
}

static int
probe_fork(void)
{
    /* the raw call: the C library's fork() is clone() without CLONE_THREAD */
    return syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0) == 0 ? 0 : 1;
}

/* kill() and tkill() have no use (raise() is tgkill()): any pid, its own included. */
static int
probe_kill(void)
{
    (void)kill(getpid(), 0);
    return 1;
}

static int
probe_tkill(void)
{
    (void)syscall(SYS_tkill, getpid(), 0);
    return 1;
}

static void
test_killed(void **state)
{
    for (VmSandboxProfile p = VM_SANDBOX_EGRESS; p <= VM_SANDBOX_API; p++) {
        assert_probe_killed(p, probe_exec);
        assert_probe_killed(p, probe_fork);
        assert_probe_killed(p, probe_kill);
        assert_probe_killed(p, probe_tkill);
    }
}

/* ---- Landlock -------------------------------------------------------------------------------- */

static gboolean
landlock_available(void)
{
    return syscall(SYS_landlock_create_ruleset, NULL, 0, 1U /* VERSION */) >= 1;
}

/* Nothing can be made or written: not in /dev/shm, /tmp or the test's own directory; no file
 * outside the worker's own can be read, /proc included; the libraries can. */
static int
probe_files(void)
{
    g_autofree char *shm = g_strdup_printf("/dev/shm/test-sandbox-%d", (int)getppid());
    g_autofree char *tmp = g_strdup_printf("/tmp/test-sandbox-%d", (int)getppid());
    g_autofree char *made = g_build_filename(the.dir, "made", NULL);

    if (open(shm, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0 || errno != EACCES)
        return 1;
    if (open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0 || errno != EACCES)
        return 2;
    if (open(made, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0 || errno != EACCES ||
        mkdir(made, 0700) == 0)
        return 3;
    if (open(the.file, O_RDONLY | O_CLOEXEC) >= 0 || open(the.file, O_WRONLY | O_CLOEXEC) >= 0)
        return 4;
    if (open("/proc/self/status", O_RDONLY | O_CLOEXEC) >= 0 ||
        open("/proc/1/environ", O_RDONLY | O_CLOEXEC) >= 0)
        return 5;
    if (open("/dev/null", O_WRONLY | O_CLOEXEC) >= 0)
        return 6;
    if (open("/dev/urandom", O_RDONLY | O_CLOEXEC) < 0 || open("/usr", O_RDONLY) < 0)
        return 8;
    return 0;
}

/* The egress and SSH workers resolve names: the resolver's files are open to them. */
static int
probe_resolver_files(void)
{
    int fd = open("/etc/nsswitch.conf", O_RDONLY | O_CLOEXEC);

    return fd >= 0 || errno == ENOENT ? 0 : 1;
}

/* The API worker resolves no name and checks no certificate: the resolver's and the trust
 * store's files are closed to it too; the libraries' are not. */
static int
probe_api_files(void)
{
    if (open("/etc/hosts", O_RDONLY | O_CLOEXEC) >= 0 ||
        open("/etc/passwd", O_RDONLY | O_CLOEXEC) >= 0 ||
        open("/etc/ssl", O_RDONLY | O_CLOEXEC) >= 0)
        return 1;
    if (open("/usr/lib", O_RDONLY | O_CLOEXEC) < 0 ||
        open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC) < 0)
        return 2;
    return 0;
}

/* Each worker's Landlock refuses TCP connections on its own too (a second wall behind the
 * filter's: hostd connects for both). */
static int
probe_landlock_connect(void)
{
    struct sockaddr_in in = {.sin_family = AF_INET,
                             .sin_port = htons(the.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    return fd >= 0 && connect(fd, (struct sockaddr *)&in, sizeof(in)) < 0 && errno == EACCES ? 0
                                                                                             : 1;
}

static void
test_landlock(void **state)
{
    if (!landlock_available()) {
        print_message("# no Landlock in this kernel\n");
        skip();
    }
    assert_probe(VM_SANDBOX_EGRESS, UNDER_LANDLOCK, probe_files);
    assert_probe(VM_SANDBOX_SSH, UNDER_LANDLOCK, probe_files);
    assert_probe(VM_SANDBOX_API, UNDER_LANDLOCK, probe_files);
    assert_probe(VM_SANDBOX_EGRESS, UNDER_LANDLOCK, probe_resolver_files);
    assert_probe(VM_SANDBOX_SSH, UNDER_LANDLOCK, probe_resolver_files);
    assert_probe(VM_SANDBOX_API, UNDER_LANDLOCK, probe_api_files);
    assert_probe(VM_SANDBOX_API, UNDER_LANDLOCK, probe_thread);
    assert_probe(VM_SANDBOX_EGRESS, UNDER_LANDLOCK, probe_thread);
    if (syscall(SYS_landlock_create_ruleset, NULL, 0, 1U) >= 4) {
        assert_probe(VM_SANDBOX_SSH, UNDER_LANDLOCK, probe_landlock_connect);
        assert_probe(VM_SANDBOX_EGRESS, UNDER_LANDLOCK, probe_landlock_connect);
        assert_probe(VM_SANDBOX_API, UNDER_LANDLOCK, probe_landlock_connect);
    }
    {
        g_autofree char *shm = g_strdup_printf("/dev/shm/test-sandbox-%d", (int)getpid());
        g_autofree char *tmp = g_strdup_printf("/tmp/test-sandbox-%d", (int)getpid());

        assert_false(g_file_test(shm, G_FILE_TEST_EXISTS));
        assert_false(g_file_test(tmp, G_FILE_TEST_EXISTS));
    }
}

/* The whole confinement in a child: a thread started before makes it fail (Landlock and the
 * filter would leave that thread free); without one, it holds with no note where the kernel has
 * Landlock, and the child can then neither make a socket nor write /tmp. */
static gpointer
sleep_thread(gpointer data)
{
    g_usleep(G_USEC_PER_SEC);
    return NULL;
}

static void
test_enter(void **state)
{
    int status = 0;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        GThread *thread = g_thread_new("early", sleep_thread, NULL);
        g_autoptr(GError) error = NULL;

        if (vm_egress_sandbox_enter(VM_SANDBOX_SSH, FALSE, 0, 0, NULL, &error))
            _exit(1);
        g_thread_join(thread);
        _exit(error != NULL && strstr(error->message, "threads run before") != NULL ? 0 : 2);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        g_autofree char *note = NULL;
        g_autofree char *tmp = g_strdup_printf("/tmp/test-sandbox-%d", (int)getppid());
        gboolean landlock = landlock_available(); /* the filter refuses the call after */

        if (!vm_egress_sandbox_enter(VM_SANDBOX_SSH, FALSE, 0, 0, &note, NULL))
            _exit(1);
        if ((note == NULL) != landlock)
            _exit(2);
        /* (prctl() past PR_SET_NAME/PR_GET_NAME is refused too, so no more is asked here.) */
        if (!REFUSED(socket(AF_INET, SOCK_STREAM, 0)))
            _exit(3);
        if (note == NULL && open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0)
            _exit(4);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_accept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_landlock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enter, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
