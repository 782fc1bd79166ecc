/* The egress worker's seccomp filter (docs/SECURITY.md), tried in child processes: what a proxy
 * needs works, a Unix socket fails with EPERM, exec and fork kill the process. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vm-egress-sandbox.h"

typedef int (*Probe)(void);

/* Runs @probe in a child under the filter; its wait status. */
static int
run_filtered(Probe probe)
{
    int status = 0;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || !vm_egress_sandbox_filter_load(NULL))
            _exit(100);
        _exit(probe());
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static int
probe_inet(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int fd6 = socket(AF_INET6, SOCK_DGRAM, 0);

    return fd >= 0 && fd6 >= 0 ? 0 : 1;
}

static int
probe_unix(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);

    return fd < 0 && errno == EPERM ? 0 : 1;
}

static int
probe_listen(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    return fd >= 0 && listen(fd, 1) < 0 && errno == EPERM ? 0 : 1;
}

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

static int
probe_thread(void)
{
    GThread *thread = g_thread_new("probe", (GThreadFunc)g_strdup, (gpointer) "x");
    char *result = g_thread_join(thread);
    int ok = g_strcmp0(result, "x") == 0;

    g_free(result);
    return ok ? 0 : 1;
}

static void
test_allowed(void **state)
{
    int status = run_filtered(probe_inet);

    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    status = run_filtered(probe_thread);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void
test_refused(void **state)
{
    int status = run_filtered(probe_unix);

    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    status = run_filtered(probe_listen);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void
test_killed(void **state)
{
    int status = run_filtered(probe_exec);

    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSYS);
    status = run_filtered(probe_fork);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSYS);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_killed),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
