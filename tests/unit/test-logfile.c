/* The bounded log file: rotation at its bound, the tail across the older and the current file,
 * and a follower that sees new lines across a rotation. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-logfile.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "test-common.h"

/* Every line of these tests is this long, newline included. */
#define LINE_LEN 32

static char *
log_path(void **state)
{
    VmTestTmpDir *t = *state;

    return g_build_filename(t->dir, "test.log", NULL);
}

/* Line @n: "line NNNNNN" and a tag, padded to LINE_LEN - 1 bytes. */
static char *
make_line(guint n, const char *tag)
{
    char *line = g_strdup_printf("line %06u %-*s", n, LINE_LEN - 13, tag);

    assert_int_equal(strlen(line), LINE_LEN - 1);
    return line;
}

static void
append(HostdLogFile *log, guint n, const char *tag)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *line = make_line(n, tag);

    if (!hostd_logfile_append(log, line, &error))
        fail_msg("append %u: %s", n, error->message);
}

static gint64
file_size(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* The numbers of the lines in @text, which must all be whole lines of this test. */
static GArray *
line_numbers(const char *text)
{
    g_autoptr(GArray) numbers = g_array_new(FALSE, FALSE, sizeof(guint));
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    guint count = g_strv_length(lines);

    assert_string_equal(lines[count - 1], "");
    for (guint i = 0; i + 1 < count; i++) {
        guint n = 0;

        assert_int_equal(strlen(lines[i]), LINE_LEN - 1);
        assert_int_equal(sscanf(lines[i], "line %u", &n), 1);
        g_array_append_val(numbers, n);
    }
    return g_steal_pointer(&numbers);
}

/* @text holds exactly the lines @first..@last, in order. */
static void
assert_lines(const char *text, guint first, guint last)
{
    g_autoptr(GArray) numbers = line_numbers(text);

    if (numbers->len != last - first + 1)
        fail_msg("expected lines %u..%u, got %u lines:\n%s", first, last, numbers->len, text);
    for (guint i = 0; i < numbers->len; i++)
        assert_int_equal(g_array_index(numbers, guint, i), first + i);
}

/* Past its bound the file moves to .1 and a new one starts; the two never hold more than twice
 * the bound, and what they hold is the newest lines, in order. */
static void
test_rotation(void **state)
{
    g_autofree char *path = log_path(state);
    g_autofree char *old = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    const gint64 max = 10 * LINE_LEN + LINE_LEN / 2;
    g_autoptr(HostdLogFile) log = hostd_logfile_new(path, max, HOSTD_LOGFILE_NONE);
    g_autofree char *text = NULL;
    g_autofree char *old_text = NULL;

    for (guint i = 0; i < 10; i++)
        append(log, i, "a");
    assert_false(g_file_test(old, G_FILE_TEST_EXISTS));
    assert_int_equal(file_size(path), 10 * LINE_LEN);

    for (guint i = 10; i < 95; i++) {
        append(log, i, "b");
        assert_true(file_size(path) <= max);
        assert_true(file_size(old) <= max);
    }
    /* 95 lines, 10 a file: the older file has 80..89, the current one 90..94. */
    old_text = vm_test_read_file(old);
    text = vm_test_read_file(path);
    assert_lines(old_text, 80, 89);
    assert_lines(text, 90, 94);
    assert_int_equal(vm_test_file_mode(path), 0600);
}

/* The file is opened once and grows from what it had: a new log object on an existing file
 * counts its size, and a line is ended when it has no newline. */
static void
test_append_existing(void **state)
{
    g_autofree char *path = log_path(state);
    g_autofree char *old = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    g_autofree char *first = make_line(0, "x");
    g_autofree char *content = g_strconcat(first, "\n", NULL);
    g_autoptr(HostdLogFile) log = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *text = NULL;

    vm_test_write_file(path, content);
    log = hostd_logfile_new(path, 2 * LINE_LEN, HOSTD_LOGFILE_SYNC);
    append(log, 1, "y");
    text = vm_test_read_file(path);
    assert_lines(text, 0, 1);
    append(log, 2, "z");
    g_free(text);
    text = vm_test_read_file(path);
    assert_lines(text, 2, 2);
    g_free(text);
    text = vm_test_read_file(old);
    assert_lines(text, 0, 1);

    /* A line that could never fit is refused, and nothing is written. */
    g_autofree char *big = g_strnfill(2 * LINE_LEN, 'x');
    assert_false(hostd_logfile_append(log, big, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "does not fit");
    assert_int_equal(file_size(path), LINE_LEN);
}

static gboolean
match_tag(const char *line, gsize len, gpointer user_data)
{
    const char *tag = user_data;
    g_autofree char *copy = g_strndup(line, len);

    return strstr(copy, tag) != NULL;
}

/* The tail reads across both files, leaves out a line still being written, and counts only
 * lines that match. */
static void
test_tail(void **state)
{
    g_autofree char *path = log_path(state);
    g_autofree char *old = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    g_autoptr(GString) old_text = g_string_new(NULL);
    g_autoptr(GString) text = g_string_new(NULL);
    HostdLogFileQuery query = {.lines = G_MAXUINT32};
    gint64 offset = -1;

    /* No file yet: nothing. */
    {
        g_autoptr(GString) tail = hostd_logfile_tail(path, &query, &offset);

        assert_string_equal(tail->str, "");
        assert_int_equal(offset, 0);
    }
    for (guint i = 0; i < 6; i++) {
        g_autofree char *line = make_line(i, i % 2 == 0 ? "even" : "odd");

        g_string_append_printf(i < 3 ? old_text : text, "%s\n", line);
    }
    g_string_append(text, "line 000006 half");
    vm_test_write_file(old, old_text->str);
    vm_test_write_file(path, text->str);

    {
        g_autoptr(GString) tail = hostd_logfile_tail(path, &query, &offset);

        assert_lines(tail->str, 0, 5);
        assert_int_equal(offset, 3 * LINE_LEN);
    }
    query.lines = 4;
    {
        g_autoptr(GString) tail = hostd_logfile_tail(path, &query, NULL);

        assert_lines(tail->str, 2, 5);
    }
    query.lines = 0;
    {
        g_autoptr(GString) tail = hostd_logfile_tail(path, &query, NULL);

        assert_string_equal(tail->str, "");
    }
    query.lines = 2;
    query.match = match_tag;
    query.user_data = "even";
    {
        g_autoptr(GString) tail = hostd_logfile_tail(path, &query, NULL);
        g_autoptr(GArray) numbers = line_numbers(tail->str);

        assert_int_equal(numbers->len, 2);
        assert_int_equal(g_array_index(numbers, guint, 0), 2);
        assert_int_equal(g_array_index(numbers, guint, 1), 4);
    }
}

/* ---- following ------------------------------------------------------------------------------ */

typedef struct {
    char *path;
    HostdLogFileQuery query;
    int fd;
    const char *tag; /* for sender_match() */
    gint alive;      /* for sender_alive() */
} Sender;

static gboolean
sender_match(const char *line, gsize len, gpointer user_data)
{
    Sender *s = user_data;

    return match_tag(line, len, (gpointer)s->tag);
}

static gboolean
sender_alive(gpointer user_data)
{
    Sender *s = user_data;

    return g_atomic_int_get(&s->alive);
}

static gpointer
sender_thread(gpointer data)
{
    Sender *s = data;
    VmStreamWriter reply = VM_STREAM_WRITER_INIT(s->fd);

    hostd_logfile_send(s->path, &s->query, &reply);
    return NULL;
}

/* Starts hostd_logfile_send() on one end of a socketpair; returns the other end, which gives up
 * reading after 20 s. */
static int
start_sender(Sender *s, GThread **ret_thread)
{
    int fds[2];
    struct timeval tv = {.tv_sec = 20};

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    assert_int_equal(setsockopt(fds[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    s->fd = fds[1];
    *ret_thread = g_thread_new("sender", sender_thread, s);
    return fds[0];
}

/* Reads STDOUT frames onto @got until it holds line @last (or EXIT comes: returns TRUE). */
static gboolean
read_until(int fd, GString *got, guint last)
{
    g_autofree char *needle = g_strdup_printf("line %06u ", last);

    while (strstr(got->str, needle) == NULL) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) m = vm_message_read_fd(fd, NULL, &error);
        const guint8 *data;
        gsize len = 0;

        if (m == NULL)
            fail_msg("waiting for line %u: %s; got:\n%s", last,
                     error != NULL ? error->message : "EOF", got->str);
        if (m->op == VM_OP_EXIT)
            return TRUE;
        assert_int_equal(m->op, VM_OP_STDOUT);
        data = vm_message_get_data(m, "data", &len);
        g_string_append_len(got, (const char *)data, (gssize)len);
    }
    return FALSE;
}

/* A follower gets the tail, then every new line, those written to the older file just before a
 * rotation and those in the new file after it, and stops when its client goes. */
static void
test_follow(void **state)
{
    g_autofree char *path = log_path(state);
    g_autoptr(HostdLogFile) log = hostd_logfile_new(path, 10 * LINE_LEN, HOSTD_LOGFILE_NONE);
    g_autoptr(GString) got = g_string_new(NULL);
    Sender s = {.path = path, .query = {.lines = 1, .follow = TRUE}};
    GThread *thread = NULL;
    int fd;

    for (guint i = 0; i < 3; i++)
        append(log, i, "t");
    fd = start_sender(&s, &thread);
    assert_false(read_until(fd, got, 2));
    assert_lines(got->str, 2, 2);

    /* 3..14: the file rotates once, after line 9. */
    g_string_truncate(got, 0);
    for (guint i = 3; i < 15; i++)
        append(log, i, "t");
    assert_false(read_until(fd, got, 14));
    assert_lines(got->str, 3, 14);

    close(fd);
    g_thread_join(thread);
    close(s.fd);
}

/* A follower sends only matching lines, and ends with EXIT once alive() says so. */
static void
test_follow_match_alive(void **state)
{
    g_autofree char *path = log_path(state);
    g_autoptr(HostdLogFile) log = hostd_logfile_new(path, 1024, HOSTD_LOGFILE_NONE);
    g_autoptr(GString) got = g_string_new(NULL);
    Sender s = {.path = path,
                .query = {.lines = G_MAXUINT32,
                          .follow = TRUE,
                          .match = sender_match,
                          .alive = sender_alive},
                .tag = "keep",
                .alive = TRUE};
    GThread *thread = NULL;
    int fd;

    s.query.user_data = &s;
    fd = start_sender(&s, &thread);
    append(log, 0, "keep");
    append(log, 1, "drop");
    append(log, 2, "keep");
    assert_false(read_until(fd, got, 2));
    g_atomic_int_set(&s.alive, FALSE);
    assert_true(read_until(fd, got, 99));
    g_thread_join(thread);
    close(fd);
    close(s.fd);
    {
        g_autoptr(GArray) numbers = line_numbers(got->str);

        assert_int_equal(numbers->len, 2);
        assert_int_equal(g_array_index(numbers, guint, 0), 0);
        assert_int_equal(g_array_index(numbers, guint, 1), 2);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rotation, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_append_existing, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_tail, vm_test_tmpdir_setup, vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_follow, vm_test_tmpdir_setup, vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_follow_match_alive, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
