/* vm_spawn_run(): output and input, the failure message made of stderr, the bound on stderr, and
 * the time limit and cancel that take the whole process group down. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-spawn.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

static pid_t
read_pid(const char *path)
{
    g_autofree char *text = vm_test_read_file(path);
    return (pid_t)g_ascii_strtoll(text, NULL, 10);
}

static void
test_spawn_output(void **state)
{
    const char *const echo[] = {"sh", "-c", "echo out; echo err >&2", NULL};
    const char *const quiet[] = {"true", NULL};
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;

    assert_true(vm_spawn_run(echo, NULL, &out, &error));
    assert_null(error);
    assert_string_equal(out, "out\n");
    g_clear_pointer(&out, g_free);

    /* Without @ret_stdout the output goes nowhere; empty output is an empty string. */
    assert_true(vm_spawn_run(echo, NULL, NULL, &error));
    assert_true(vm_spawn_run(quiet, NULL, &out, &error));
    assert_string_equal(out, "");
    assert_null(error);
}

static void
test_spawn_input(void **state)
{
    const char *const cat[] = {"cat", NULL};
    const char *const ignore[] = {"true", NULL};
    const char *const no_stdin[] = {"sh", "-c", "cat; echo done", NULL};
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;
    g_autoptr(GBytes) hello = g_bytes_new_static("hello\n", 6);
    gsize big_len = 4 * 1024 * 1024;
    g_autofree guint8 *big_data = g_malloc(big_len);

    VmSpawnOptions options = {.input = hello};
    assert_true(vm_spawn_run(cat, &options, &out, &error));
    assert_string_equal(out, "hello\n");
    g_clear_pointer(&out, g_free);

    /* More than any pipe holds, both ways at once: no deadlock. */
    for (gsize i = 0; i < big_len; i++)
        big_data[i] = 'a' + (i % 26);
    g_autoptr(GBytes) big = g_bytes_new_static(big_data, big_len);
    options.input = big;
    assert_true(vm_spawn_run(cat, &options, &out, &error));
    assert_int_equal(strlen(out), big_len);
    assert_memory_equal(out, big_data, big_len);
    g_clear_pointer(&out, g_free);

    /* A program that reads nothing: no SIGPIPE here, its exit status decides. */
    assert_true(vm_spawn_run(ignore, &options, NULL, &error));

    /* Without input, stdin is at its end at once. */
    assert_true(vm_spawn_run(no_stdin, NULL, &out, &error));
    assert_string_equal(out, "done\n");
    assert_null(error);
}

static void
test_spawn_failure(void **state)
{
    const char *const noisy[] = {"sh", "-c", "echo out; printf '  disk full\\n\\n' >&2; exit 3",
                                 NULL};
    const char *const silent[] = {"sh", "-c", "exit 4", NULL};
    const char *const killed[] = {"sh", "-c", "kill -9 $$", NULL};
    const char *const flood[] = {"sh", "-c", "yes 0123456789abcdef | head -c 1000000 >&2; exit 1",
                                 NULL};
    const char *const missing[] = {"vm-no-such-program", NULL};
    g_autofree char *out = NULL;

    g_autoptr(GError) noisy_error = NULL;
    assert_false(vm_spawn_run(noisy, NULL, &out, &noisy_error));
    vm_test_assert_error(noisy_error, VM_ERROR, VM_ERROR_IO, NULL);
    assert_string_equal(noisy_error->message, "sh failed: disk full");
    assert_null(out);

    g_autoptr(GError) silent_error = NULL;
    assert_false(vm_spawn_run(silent, NULL, NULL, &silent_error));
    vm_test_assert_error(silent_error, VM_ERROR, VM_ERROR_IO, NULL);
    assert_string_equal(silent_error->message, "sh failed: exit status 4");

    g_autoptr(GError) killed_error = NULL;
    assert_false(vm_spawn_run(killed, NULL, NULL, &killed_error));
    vm_test_assert_error(killed_error, VM_ERROR, VM_ERROR_IO, NULL);
    assert_string_equal(killed_error->message, "sh failed: killed by signal 9");

    /* The message keeps the first VM_SPAWN_STDERR_MAX bytes; the rest is read and dropped. */
    g_autoptr(GError) flood_error = NULL;
    assert_false(vm_spawn_run(flood, NULL, NULL, &flood_error));
    vm_test_assert_error(flood_error, VM_ERROR, VM_ERROR_IO, "sh failed: 0123456789abcdef\n0123");
    assert_true(strlen(flood_error->message) <= strlen("sh failed: ") + VM_SPAWN_STDERR_MAX);
    assert_true(strlen(flood_error->message) > VM_SPAWN_STDERR_MAX / 2);

    g_autoptr(GError) missing_error = NULL;
    assert_false(vm_spawn_run(missing, NULL, NULL, &missing_error));
    vm_test_assert_error(missing_error, VM_ERROR, VM_ERROR_IO, "cannot run vm-no-such-program: ");
}

/* The time limit kills the whole group, children included, also after the program closed its
 * outputs. */
static void
test_spawn_timeout(void **state)
{
    Fixture *f = *state;
    g_autofree char *pid_file = g_build_filename(f->dir, "child.pid", NULL);
    const char *const hang[] = {"sh", "-c", "sleep 60 & echo $! > \"$0\"; wait", pid_file, NULL};
    const char *const closed[] = {"sh", "-c", "exec >/dev/null 2>&1; sleep 60", NULL};
    const VmSpawnOptions options = {.timeout_ms = 300};
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;

    gint64 start = g_get_monotonic_time();
    assert_false(vm_spawn_run(hang, &options, &out, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, "sh did not finish within 300 ms");
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
    assert_null(out);
    vm_test_assert_process_gone(read_pid(pid_file), 5000);
    g_clear_error(&error);

    start = g_get_monotonic_time();
    assert_false(vm_spawn_run(closed, &options, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, NULL);
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
}

static gpointer
cancel_later(gpointer data)
{
    g_usleep(200 * 1000);
    g_cancellable_cancel(data);
    return NULL;
}

static void
test_spawn_cancel(void **state)
{
    Fixture *f = *state;
    g_autofree char *pid_file = g_build_filename(f->dir, "child.pid", NULL);
    const char *const hang[] = {"sh", "-c", "sleep 60 & echo $! > \"$0\"; wait", pid_file, NULL};
    g_autoptr(GCancellable) cancellable = g_cancellable_new();
    const VmSpawnOptions options = {.cancellable = cancellable};
    g_autoptr(GError) error = NULL;

    GThread *thread = g_thread_new("cancel", cancel_later, cancellable);
    gint64 start = g_get_monotonic_time();
    assert_false(vm_spawn_run(hang, &options, NULL, &error));
    g_thread_join(thread);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_CANCELLED, "sh cancelled");
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
    vm_test_assert_process_gone(read_pid(pid_file), 5000);
    g_clear_error(&error);

    /* Cancelled before: nothing runs. */
    g_autofree char *marker = g_build_filename(f->dir, "ran", NULL);
    const char *const touch[] = {"touch", marker, NULL};
    assert_false(vm_spawn_run(touch, &options, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    assert_false(g_file_test(marker, G_FILE_TEST_EXISTS));
}

/* Output with NUL bytes keeps its length; stdout into a descriptor the caller opened. */
static void
test_spawn_binary_and_fd(void **state)
{
    Fixture *f = *state;
    const char *const nul[] = {"printf", "a\\0b", NULL};
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;
    gsize len = 0;

    VmSpawnOptions options = {.ret_stdout_len = &len};
    assert_true(vm_spawn_run(nul, &options, &out, &error));
    assert_int_equal(len, 3);
    assert_memory_equal(out, "a\0b", 3);

    g_autofree char *path = g_build_filename(f->dir, "out", NULL);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    const char *const echo[] = {"echo", "into the file", NULL};
    VmSpawnOptions to_fd = {.stdout_fd = fd};
    assert_true(vm_spawn_run(echo, &to_fd, NULL, &error));
    close(fd);
    g_autofree char *text = vm_test_read_file(path);
    assert_string_equal(text, "into the file\n");
}

/* A program of ours names its error's code by its exit status; others do not. */
static void
test_spawn_exit_is_code(void **state)
{
    const char *const not_found[] = {"sh", "-c", "echo 'no such path' >&2; exit 3", NULL};
    const char *const silent[] = {"sh", "-c", "exit 3", NULL};
    g_autoptr(GError) error = NULL;

    VmSpawnOptions options = {.exit_is_code = TRUE};
    assert_false(vm_spawn_run(not_found, &options, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "no such path");
    assert_string_equal(error->message, "no such path");
    g_clear_error(&error);
    /* No message: how it ended, as for any program. */
    assert_false(vm_spawn_run(silent, &options, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "sh failed: exit status 3");
    g_clear_error(&error);
    assert_false(vm_spawn_run(not_found, NULL, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "sh failed: no such path");
}

/* run_as: the program runs as the uid and gid given, no supplementary group, no_new_privs, no
 * capability; as root only. */
static void
test_spawn_run_as(void **state)
{
    const char *const ids[] = {
        "sh", "-c", "id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapEff|CapPrm):' /proc/self/status",
        NULL};
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;

    if (geteuid() != 0) {
        VmSpawnOptions options = {.run_as = TRUE, .uid = 65534, .gid = 65534};
        assert_false(vm_spawn_run(ids, &options, &out, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "cannot run sh as uid 65534");
        skip();
    }
    VmSpawnOptions options = {.run_as = TRUE, .uid = 1879113001, .gid = 1879113002};
    assert_true(vm_spawn_run(ids, &options, &out, &error));
    assert_string_equal(out, "1879113001\n1879113002\n1879113002\n"
                             "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
                             "NoNewPrivs:\t1\n");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spawn_output),
        cmocka_unit_test(test_spawn_input),
        cmocka_unit_test(test_spawn_failure),
        cmocka_unit_test_setup_teardown(test_spawn_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spawn_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spawn_binary_and_fd, setup, teardown),
        cmocka_unit_test(test_spawn_exit_is_code),
        cmocka_unit_test(test_spawn_run_as),
    };

    /* A run that feeds a program which stopped reading must not die of SIGPIPE. */
    signal(SIGPIPE, SIG_DFL);
    return cmocka_run_group_tests_name("spawn", tests, NULL, NULL);
}
