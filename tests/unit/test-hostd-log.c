/* hostd's log (hostd-log.h): every message one line, escaped, whoever wrote its text; a worker's
 * output through a pipe hostd reads, bounded in length and in lines. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "hostd-log.h"
#include "test-common.h"
#include "test-sink.h"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* What is in the pipe @fd within @timeout_ms, read until @lines newlines came (or the time is
 * up). */
static gboolean
has_lines(const GString *text, gconstpointer data)
{
    guint seen = 0;

    for (gsize i = 0; i < text->len; i++)
        seen += text->str[i] == '\n';
    return seen >= GPOINTER_TO_UINT(data);
}

/* What came on @fd until @lines lines did, for at most @timeout_ms. */
static char *
read_lines(int fd, guint lines, guint timeout_ms)
{
    return g_string_free(
        vm_test_read_while(fd, (int)timeout_ms, has_lines, GUINT_TO_POINTER(lines), NULL), FALSE);
}

static guint
count_lines(const char *text)
{
    guint n = 0;

    for (const char *p = text; *p != '\0'; p++)
        n += *p == '\n';
    return n;
}

/* A message whose text holds a forged line, a terminal escape and a NUL's worth of garbage comes
 * out as one line, its controls escaped, with the time and "hostd:" in front. */
static void
test_handler_one_line(void **state)
{
    int fds[2];

    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    hostd_log_handler(NULL, G_LOG_LEVEL_MESSAGE,
                      "exec a1 failed: denied\n12:00:00 hostd: rm a2 ok (uid 0)\x1b[2J\xff",
                      GINT_TO_POINTER(fds[1]));
    hostd_log_handler(NULL, G_LOG_LEVEL_WARNING, "guest says \r\x07hi", GINT_TO_POINTER(fds[1]));
    g_autofree char *text = read_lines(fds[0], 2, 1000);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);

    assert_int_equal(g_strv_length(lines), 3);
    assert_string_equal(lines[2], "");
    assert_true(g_regex_match_simple(
        "^[0-9]{2}:[0-9]{2}:[0-9]{2} hostd: exec a1 failed: denied\\\\n12:00:00 hostd: rm a2 ok "
        "\\(uid 0\\)\\\\x1b\\[2J\\\\xff$",
        lines[0], 0, 0));
    assert_true(g_regex_match_simple(
        "^[0-9]{2}:[0-9]{2}:[0-9]{2} hostd: warning: guest says \\\\r\\\\x07hi$", lines[1], 0, 0));
    close(fds[0]);
    close(fds[1]);
}

/* A message of a MiB (a guest's error text) is cut to the bound, in one line. */
static void
test_handler_long_message(void **state)
{
    int fds[2];
    g_autofree char *message = g_strnfill(1024 * 1024, '\n');

    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    /* The pipe holds 64 KiB: the line must fit without a reader. */
    hostd_log_handler(NULL, G_LOG_LEVEL_MESSAGE, message, GINT_TO_POINTER(fds[1]));
    close(fds[1]);
    g_autofree char *text = read_lines(fds[0], 2, 1000);

    assert_int_equal(count_lines(text), 1);
    assert_true(strlen(text) <= HOSTD_LOG_MESSAGE_MAX + 64);
    assert_true(g_str_has_suffix(text, "\\n...\n"));
    close(fds[0]);
}

/* A real process's stdout and stderr through hostd_log_worker_output(): each of its lines is one
 * log line named after the worker, escaped, cut to HOSTD_LOG_WORKER_LINE_MAX; past
 * HOSTD_LOG_WORKER_LINES_MAX lines in a minute the rest is dropped, with one note. */
static void
test_worker_output(void **state)
{
    int log[2];
    g_autoptr(GError) error = NULL;
    const char *script = "printf 'started\\n'; "
                         "printf 'bad key\\n12:00:00 hostd: forged\\033[31m\\n' >&2; "
                         "head -c 5000 /dev/zero | tr '\\0' x; echo; "
                         "i=0; while [ $i -lt 100 ]; do echo \"line $i\" >&2; i=$((i+1)); done";
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    GPid pid = 0;
    int status = 0;

    assert_int_equal(pipe2(log, O_CLOEXEC), 0);
    g_log_set_default_handler(hostd_log_handler, GINT_TO_POINTER(log[1]));
    int output = hostd_log_worker_output("SSH worker of 'a1'", &error);
    vm_test_assert_no_error(error);
    assert_true(output >= 0);
    assert_true(g_spawn_async_with_pipes_and_fds(
        "/", argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_STDIN_FROM_DEV_NULL, NULL, NULL, -1,
        output, output, NULL, NULL, 0, &pid, NULL, NULL, NULL, &error));
    close(output);
    /* 4 lines of its own, then 56 of the 100, then the note */
    g_autofree char *text = read_lines(log[0], HOSTD_LOG_WORKER_LINES_MAX + 1, 10000);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    g_autofree char *more = read_lines(log[0], 1, 300);
    g_log_set_default_handler(g_log_default_handler, NULL);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);

    assert_string_equal(more, "");
    assert_int_equal(count_lines(text), HOSTD_LOG_WORKER_LINES_MAX + 1);
    for (guint i = 0; i < HOSTD_LOG_WORKER_LINES_MAX + 1; i++) {
        assert_non_null(strstr(lines[i], " hostd: SSH worker of 'a1': "));
        assert_true(strlen(lines[i]) < HOSTD_LOG_WORKER_LINE_MAX + 64);
    }
    assert_true(g_str_has_suffix(lines[0], ": started"));
    assert_true(g_str_has_suffix(lines[1], ": bad key"));
    assert_true(g_str_has_suffix(lines[2], ": 12:00:00 hostd: forged\\x1b[31m"));
    assert_true(g_str_has_suffix(lines[3], "xxx..."));
    assert_true(g_str_has_suffix(lines[4], ": line 0"));
    assert_true(g_str_has_suffix(lines[HOSTD_LOG_WORKER_LINES_MAX - 1], ": line 55"));
    assert_non_null(
        strstr(lines[HOSTD_LOG_WORKER_LINES_MAX], "the rest of the minute's are dropped"));
    close(log[0]);
    close(log[1]);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handler_one_line),
        cmocka_unit_test(test_handler_long_message),
        cmocka_unit_test(test_worker_output),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
