/* Small shared helpers: durations, atomic file writes, byte formatting, Unix socket addresses,
 * writes without SIGPIPE, default paths, build tree or installed files. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-config.h"
#include "vm-error.h"
#include "vm-log-text.h"
#include "vm-trace.h"
#include "vm-util.h"
#include "test-common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib-unix.h>
#include <glib/gstdio.h>

/* ---------------------------------------------------------------------------------------------
 * Durations */

static void
test_duration_valid(void **state)
{
    static const struct {
        const char *text;
        guint64 seconds;
    } cases[] = {
        {"0", 0},
        {"90", 90},
        {"90s", 90},
        {"5m", 300},
        {"2h", 7200},
        {"1d", 86400},
        {"30d", 30 * 86400},
        {"007", 7},
        /* the largest count of seconds whose microseconds fit a gint64 */
        {"9223372036854", 9223372036854},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        guint64 seconds = 12345;

        if (!vm_duration_parse(cases[i].text, &seconds, &error))
            fail_msg("'%s' refused: %s", cases[i].text, error->message);
        assert_int_equal(seconds, cases[i].seconds);
    }
}

static void
test_duration_invalid(void **state)
{
    static const char *const cases[] = {
        "",
        " ",
        "never",
        "-1",
        "-5m",
        "+5",
        "5 m",
        " 5",
        "5 ",
        "5M",
        "5ms",
        "5mm",
        "5w",
        "1.5h",
        "m",
        "s",
        "0x10",
        "1e3",
        "5m3s",
        "9223372036855",
        "18446744073709551616",
        "99999999999999999999999",
        "153722867280913m",
        "106751991167301d",
        "5\xff",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *shown = g_strescape(cases[i], NULL);
        guint64 seconds = 12345;

        if (vm_duration_parse(cases[i], &seconds, &error))
            fail_msg("'%s' accepted as %" G_GUINT64_FORMAT, shown, seconds);
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT))
            fail_msg("'%s': wrong error", shown);
        /* ret_ values are written only on success */
        assert_int_equal(seconds, 12345);
    }
    assert_false(vm_duration_parse(NULL, NULL, NULL));
}

/* ---------------------------------------------------------------------------------------------
 * Atomic writes, each in a fresh directory */

static int
setup_dir(void **state)
{
    char *dir = g_dir_make_tmp("test-util-XXXXXX", NULL);

    if (dir == NULL)
        return -1;
    *state = dir;
    return 0;
}

static int
teardown_dir(void **state)
{
    g_autofree char *dir = *state;

    return vm_test_remove_tree(dir) ? 0 : -1;
}

static void
test_write_atomic(void **state)
{
    const char *dir = *state;
    g_autofree char *path = g_build_filename(dir, "state.json", NULL);
    g_autoptr(GError) error = NULL;
    g_autofree char *contents = NULL;
    gsize len = 0;
    struct stat st;
    mode_t old_umask = umask(022);

    assert_true(vm_file_write_atomic(path, "first", -1, 0644, &error));
    assert_null(error);
    assert_true(g_file_get_contents(path, &contents, &len, NULL));
    assert_string_equal(contents, "first");
    g_clear_pointer(&contents, g_free);

    /* Replacing keeps exactly one file: no temporary is left behind. */
    assert_true(vm_file_write_atomic(path, "second\0binary", 13, 0600, &error));
    assert_true(g_file_get_contents(path, &contents, &len, NULL));
    assert_int_equal(len, 13);
    assert_memory_equal(contents, "second\0binary", 13);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(vm_test_count_entries(dir), 1);

    assert_true(vm_file_write_atomic(path, "", 0, 0640, &error));
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_int_equal(vm_test_count_entries(dir), 1);
    umask(old_umask);
}

static void
test_write_atomic_fails(void **state)
{
    const char *dir = *state;
    g_autofree char *missing = g_build_filename(dir, "no-such-dir", "file", NULL);
    g_autofree char *subdir = g_build_filename(dir, "sub", NULL);
    g_autofree char *inner = g_build_filename(subdir, "f", NULL);
    g_autoptr(GError) error = NULL;
    g_autofree char *contents = NULL;

    assert_false(vm_file_write_atomic(missing, "x", -1, 0600, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    g_clear_error(&error);

    /* A replacement that cannot happen (the target is a non-empty directory) fails, leaves the
     * target alone and leaves no temporary file behind. */
    assert_int_equal(mkdir(subdir, 0700), 0);
    assert_true(vm_file_write_atomic(inner, "x", -1, 0600, &error));
    assert_false(vm_file_write_atomic(subdir, "new", -1, 0600, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    assert_true(g_file_get_contents(inner, &contents, NULL, NULL));
    assert_string_equal(contents, "x");
    assert_int_equal(vm_test_count_entries(dir), 1);
    assert_int_equal(vm_test_count_entries(subdir), 1);

    assert_int_equal(unlink(inner), 0);
    assert_int_equal(rmdir(subdir), 0);
}

/* The test seam: the chosen writes fail halfway with the chosen errno, the file keeps its old
 * contents and no temporary file is left; the others work. */
static void
test_write_atomic_fault(void **state)
{
    const char *dir = *state;
    g_autofree char *path = g_build_filename(dir, "state.ini", NULL);
    g_autoptr(GError) error = NULL;

    assert_true(vm_file_write_atomic(path, "old", -1, 0600, &error));
    vm_file_write_fault(2, 2, ENOSPC);
    assert_true(vm_file_write_atomic(path, "first", -1, 0600, &error));
    assert_false(vm_file_write_atomic(path, "second, long enough to be cut", -1, 0600, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "No space left on device");
    g_clear_error(&error);
    assert_false(vm_file_write_atomic(path, "third", -1, 0600, &error));
    g_clear_error(&error);
    assert_true(vm_file_write_atomic(path, "fourth", -1, 0600, &error));
    assert_int_equal(vm_file_write_calls(), 4);
    vm_file_write_fault(0, 0, 0);
    assert_int_equal(vm_test_count_entries(dir), 1);
    g_autofree char *contents = vm_test_read_file(path);
    assert_string_equal(contents, "fourth");

    vm_file_write_fault(1, 1, EIO);
    assert_false(vm_file_write_atomic(path, "fifth", -1, 0600, &error));
    vm_file_write_fault(0, 0, 0);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "Input/output error");
    g_autofree char *kept = vm_test_read_file(path);
    assert_string_equal(kept, "fourth");
    assert_int_equal(vm_test_count_entries(dir), 1);
}

/* ---------------------------------------------------------------------------------------------
 * Byte formatting */

static void
test_format_bytes(void **state)
{
    static const struct {
        guint64 bytes;
        const char *text;
    } cases[] = {
        {0, "0 B"},
        {1, "1 B"},
        {1023, "1023 B"},
        {1024, "1 KiB"},
        {1536, "1.5 KiB"},
        {1024 * 1024 - 1, "1 MiB"},
        {10 * 1024 * 1024, "10 MiB"},
        {G_GUINT64_CONSTANT(1610612736), "1.5 GiB"},
        {G_GUINT64_CONSTANT(21474836480), "20 GiB"},
        {G_GUINT64_CONSTANT(1099511627776), "1 TiB"},
        {G_MAXUINT64, "16 EiB"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *text = vm_format_bytes(cases[i].bytes);

        if (strcmp(text, cases[i].text) != 0)
            fail_msg("%" G_GUINT64_FORMAT ": got '%s', want '%s'", cases[i].bytes, text,
                     cases[i].text);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Unix socket addresses */

static void
test_unix_address(void **state)
{
    g_autoptr(GError) error = NULL;
    struct sockaddr_un addr;
    socklen_t addr_len = 0;
    g_autofree char *longest = g_strnfill(VM_UNIX_PATH_MAX, 'a');
    g_autofree char *too_long = g_strnfill(VM_UNIX_PATH_MAX + 1, 'a');
    g_autofree char *limit = g_strdup_printf("at most %zu bytes", VM_UNIX_PATH_MAX);

    assert_true(vm_unix_address("/run/hostd.sock", &addr, &addr_len, &error));
    assert_null(error);
    assert_int_equal(addr.sun_family, AF_UNIX);
    assert_string_equal(addr.sun_path, "/run/hostd.sock");
    assert_int_equal(addr_len,
                     offsetof(struct sockaddr_un, sun_path) + strlen("/run/hostd.sock") + 1);

    longest[0] = '/';
    assert_true(vm_unix_address(longest, &addr, &addr_len, &error));
    assert_string_equal(addr.sun_path, longest);
    assert_int_equal(addr_len, sizeof(addr));

    /* Too long is refused with the limit named, and the output is left alone. */
    addr_len = 7;
    too_long[0] = '/';
    assert_false(vm_unix_address(too_long, &addr, &addr_len, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_non_null(strstr(error->message, limit));
    assert_int_equal(addr_len, 7);
    assert_int_equal(vm_sockaddr_un_fill(too_long, &addr, &addr_len), -ENAMETOOLONG);
}

/* The address binds and connects as it is. */
static void
test_unix_address_binds(void **state)
{
    const char *dir = *state;
    g_autofree char *path = g_build_filename(dir, "s.sock", NULL);
    struct sockaddr_un addr;
    socklen_t addr_len;
    vm_autofd server = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    vm_autofd client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(vm_unix_address(path, &addr, &addr_len, NULL));
    assert_int_equal(bind(server, (struct sockaddr *)&addr, addr_len), 0);
    assert_int_equal(listen(server, 1), 0);
    assert_true(g_file_test(path, G_FILE_TEST_EXISTS));
    assert_int_equal(connect(client, (struct sockaddr *)&addr, addr_len), 0);
}

/* A listening socket at @path; nonblocking, so that an accept() with nothing waiting says so. */
static int
listen_at(const char *path)
{
    struct sockaddr_un addr;
    socklen_t addr_len;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

    assert_true(fd >= 0);
    assert_true(vm_unix_address(path, &addr, &addr_len, NULL));
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, addr_len), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

/* Whether a connection waits on the listening @fd (taken and closed if so). */
static gboolean
has_connection(int fd)
{
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);

    if (c < 0) {
        assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        return FALSE;
    }
    close(c);
    return TRUE;
}

/* The port's directory is another user's (QEMU's): what it puts in place of the socket (a
 * symbolic link or a hard link to a socket of root's, a file, a linked directory) is refused
 * with nothing connected; the genuine socket connects and carries bytes. */
static void
test_unix_connect_nofollow(void **state)
{
    const char *dir = *state;
    g_autofree char *port_dir = g_build_filename(dir, "domain-1-a1", NULL);
    g_autofree char *port = g_build_filename(port_dir, "org.vmctl.ssh.0", NULL);
    g_autofree char *root_dir = g_build_filename(dir, "root", NULL);
    g_autofree char *root_sock = g_build_filename(root_dir, "hostd.sock", NULL);
    g_autofree char *linked_dir = g_build_filename(dir, "linked", NULL);
    g_autofree char *linked = g_build_filename(linked_dir, "hostd.sock", NULL);
    vm_autofd qemu = -1;
    vm_autofd root = -1;
    vm_autofd fd = -1;
    vm_autofd peer = -1;
    char byte = 0;

    assert_int_equal(g_mkdir(port_dir, 0700), 0);
    assert_int_equal(g_mkdir(root_dir, 0700), 0);
    root = listen_at(root_sock);

    /* The genuine socket. */
    qemu = listen_at(port);
    fd = vm_unix_connect_nofollow(port, 0, NULL);
    assert_true(fd >= 0);
    peer = accept4(qemu, NULL, NULL, SOCK_CLOEXEC);
    assert_true(peer >= 0);
    assert_int_equal(write(fd, "x", 1), 1);
    assert_int_equal(read(peer, &byte, 1), 1);
    assert_int_equal(byte, 'x');
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    close(g_steal_fd(&fd));
    fd = vm_unix_connect_nofollow(port, SOCK_NONBLOCK, NULL);
    assert_true(fd >= 0);
    assert_true(fcntl(fd, F_GETFL) & O_NONBLOCK);
    close(g_steal_fd(&fd));

    /* Swapped for a symbolic link to root's socket, as the directory's owner can. */
    assert_int_equal(g_unlink(port), 0);
    assert_int_equal(symlink(root_sock, port), 0);
    {
        g_autoptr(GError) error = NULL;
        assert_int_equal(vm_unix_connect_nofollow(port, 0, &error), -1);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_FAILED));
        assert_non_null(strstr(error->message, "symbolic link"));
        assert_false(has_connection(root));
    }

    /* A hard link to it. */
    assert_int_equal(g_unlink(port), 0);
    assert_int_equal(link(root_sock, port), 0);
    {
        g_autoptr(GError) error = NULL;
        assert_int_equal(vm_unix_connect_nofollow(port, 0, &error), -1);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_FAILED));
        assert_non_null(strstr(error->message, "hard link"));
        assert_false(has_connection(root));
    }

    /* A file. */
    assert_int_equal(g_unlink(port), 0);
    assert_true(g_file_set_contents(port, "", 0, NULL));
    {
        g_autoptr(GError) error = NULL;
        assert_int_equal(vm_unix_connect_nofollow(port, 0, &error), -1);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_FAILED));
    }

    /* The directory itself a link to root's. */
    assert_int_equal(symlink(root_dir, linked_dir), 0);
    {
        g_autoptr(GError) error = NULL;
        assert_int_equal(vm_unix_connect_nofollow(linked, 0, &error), -1);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
        assert_false(has_connection(root));
    }

    /* Nothing there, and a relative path. */
    assert_int_equal(g_unlink(port), 0);
    {
        g_autoptr(GError) error = NULL;
        assert_int_equal(vm_unix_connect_nofollow(port, 0, &error), -1);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    }
    {
        g_autoptr(GError) error = NULL;
        assert_int_equal(vm_unix_connect_nofollow("org.vmctl.ssh.0", 0, &error), -1);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }

    assert_false(has_connection(root));
}

/* ---------------------------------------------------------------------------------------------
 * Writes that never raise SIGPIPE */

static void
test_write_nosignal(void **state)
{
    int fds[2];

    assert_true(g_unix_open_pipe(fds, FD_CLOEXEC, NULL));
    assert_int_equal(vm_write_nosignal(fds[1], "ab", 2), 2);
    close(fds[0]);
    /* SIGPIPE's default action would end the test here. */
    errno = 0;
    assert_int_equal(vm_write_nosignal(fds[1], "cd", 2), -1);
    assert_int_equal(errno, EPIPE);
    close(fds[1]);
}

/* ---------------------------------------------------------------------------------------------
 * Default paths */

static void
test_default_paths(void **state)
{
    g_autofree char *state_dir = vm_default_state_dir();
    g_autofree char *socket_path = NULL;
    g_autofree char *expected = NULL;
    g_autofree char *saved = g_strdup(g_getenv("VMCTL_SOCKET"));
    g_autofree char *user_dir = g_build_filename(g_get_user_data_dir(), "hostd", NULL);

    assert_string_equal(state_dir, geteuid() == 0 ? "/var/lib/hostd" : user_dir);

    expected = g_build_filename(state_dir, "hostd.sock", NULL);
    g_unsetenv("VMCTL_SOCKET");
    socket_path = vm_default_socket_path();
    assert_string_equal(socket_path, expected);
    g_clear_pointer(&socket_path, g_free);

    /* Empty means unset. */
    g_setenv("VMCTL_SOCKET", "", TRUE);
    socket_path = vm_default_socket_path();
    assert_string_equal(socket_path, expected);
    g_clear_pointer(&socket_path, g_free);

    g_setenv("VMCTL_SOCKET", "/run/test/h.sock", TRUE);
    socket_path = vm_default_socket_path();
    assert_string_equal(socket_path, "/run/test/h.sock");

    if (saved != NULL)
        g_setenv("VMCTL_SOCKET", saved, TRUE);
    else
        g_unsetenv("VMCTL_SOCKET");
}

/* A cut keeps whole characters and makes the text valid UTF-8 first. */
static void
test_utf8_cut(void **state)
{
    static const struct {
        const char *in;
        gsize max;
        const char *out;
    } cases[] = {
        {NULL, 10, ""},
        {"short", 10, "short"},
        {"exactly10!", 10, "exactly10!"},
        {"eleven chars", 10, "eleven cha"},
        {"caf\xc3\xa9", 4, "caf"},
        {"caf\xc3\xa9", 5, "caf\xc3\xa9"},
        {"\xe2\x82\xac\xe2\x82\xac", 5, "\xe2\x82\xac"},
        {"a\xff"
         "b",
         10,
         "a\xef\xbf\xbd"
         "b"},
        {"a\xff"
         "b",
         2, "a"},
        {"abc", 0, ""},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *out = vm_utf8_cut(cases[i].in, cases[i].max);

        assert_string_equal(out, cases[i].out);
    }
}

/* Guest and worker text as one log line: nothing that ends a line, moves a terminal's cursor or
 * reorders what it shows gets through as itself; valid text passes unchanged; the cut keeps whole
 * characters and whole escapes. */
static void
test_log_text(void **state)
{
    static const struct {
        const char *in;
        gssize len;
        gsize max;
        const char *out;
    } cases[] = {
        {NULL, -1, 100, ""},
        {"plain text, caf\xc3\xa9 \xe2\x82\xac", -1, 100, "plain text, caf\xc3\xa9 \xe2\x82\xac"},
        /* a forged line: the newline and what follows stay on this one */
        {"denied\n12:00:00 hostd: agent 'a1' ok", -1, 100,
         "denied\\n12:00:00 hostd: agent 'a1' ok"},
        {"a\r\nb\tc", -1, 100, "a\\r\\nb\\tc"},
        /* terminal escapes: colour, clear screen, a title (OSC ... BEL) */
        {"\x1b[31mred\x1b[2J\x1b]0;title\x07", -1, 100, "\\x1b[31mred\\x1b[2J\\x1b]0;title\\x07"},
        {"del\x7f", -1, 100, "del\\x7f"},
        /* NUL inside the given length */
        {"a\0b", 3, 100, "a\\x00b"},
        /* invalid UTF-8: a lone continuation byte, a cut sequence, an overlong '/', a surrogate */
        {"\x80x\xc3", -1, 100, "\\x80x\\xc3"},
        {"\xc0\xaf", -1, 100, "\\xc0\\xaf"},
        {"\xed\xa0\x80", -1, 100, "\\xed\\xa0\\x80"},
        /* C1 CSI, line and paragraph separators, a right-to-left override, an isolate */
        {"\xc2\x9b"
         "31m",
         -1, 100, "\\u009b31m"},
        {"a\xe2\x80\xa8"
         "b\xe2\x80\xa9",
         -1, 100, "a\\u2028b\\u2029"},
        {"\xe2\x80\xaegnp.exe", -1, 100, "\\u202egnp.exe"},
        {"\xe2\x81\xa6x", -1, 100, "\\u2066x"},
        /* a backslash stays one, so escaping twice changes nothing */
        {"C:\\dir \\n", -1, 100, "C:\\dir \\n"},
        /* cuts: whole characters and whole escapes only, then "..." */
        {"0123456789", -1, 5, "01234..."},
        {"0123456789", -1, 10, "0123456789"},
        {"abc\n", -1, 4, "abc..."},
        {"abc\n", -1, 5, "abc\\n"},
        {"ab\xe2\x82\xac", -1, 4, "ab..."},
        {"ab\xe2\x82\xac", -1, 5, "ab\xe2\x82\xac"},
        {"x", -1, 0, "..."},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *out = vm_log_text(cases[i].in, cases[i].len, cases[i].max);
        g_autofree char *again = vm_log_text(out, -1, G_MAXSIZE);

        if (strcmp(out, cases[i].out) != 0)
            fail_msg("case %" G_GSIZE_FORMAT ": '%s', not '%s'", i, out, cases[i].out);
        assert_true(g_utf8_validate(out, -1, NULL));
        assert_null(strpbrk(out, "\n\r\x1b"));
        assert_true(strlen(out) <= cases[i].max + 3);
        assert_string_equal(again, out);
    }

    /* an over-long line of escapes is cut to the bound, not grown past it */
    g_autofree char *escapes = g_strnfill(100000, '\n');
    g_autofree char *cut = vm_log_text(escapes, -1, 1000);
    assert_true(strlen(cut) <= 1003);
    assert_true(g_str_has_suffix(cut, "\\n..."));
}

/* vm_secret_wipe() zeroes every byte of the string up to its NUL, and nothing past it;
 * vm_secret_free() is it and g_free(), NULL included. */
static void
test_secret_wipe(void **state)
{
    char buf[] = "sk-live-0123456789\0tail";
    gsize len = strlen(buf);

    vm_secret_wipe(buf);
    for (gsize i = 0; i < len; i++)
        assert_int_equal(buf[i], 0);
    assert_string_equal(buf + len + 1, "tail");
    vm_secret_wipe(NULL);
    vm_secret_free(NULL);
    vm_secret_free(g_strdup("sk-live-0123456789"));
}

/* hostd and its workers call vm_process_undumpable() first: afterwards the process cannot be
 * dumped, and no core file of any size may be written by it or by what it runs. */
static void
test_process_undumpable(void **state)
{
    pid_t pid = fork();
    int status = 0;

    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit core = {1, 1};
        gboolean before = prctl(PR_GET_DUMPABLE) == 1;

        vm_process_undumpable();
        if (getrlimit(RLIMIT_CORE, &core) < 0)
            _exit(1);
        _exit(before && prctl(PR_GET_DUMPABLE) == 0 && core.rlim_cur == 0 && core.rlim_max == 0
                  ? 0
                  : 2);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A trace names its phases in order, each with its milliseconds, then the total. */
static void
test_trace(void **state)
{
    VmTrace trace;

    vm_trace_mark(NULL, "nothing happens");
    vm_trace_init(&trace);
    g_usleep(2000);
    vm_trace_mark(&trace, "first");
    vm_trace_mark(&trace, "second");
    g_autofree char *text = vm_trace_finish(&trace, "exec a1");
    g_autoptr(GRegex) re = g_regex_new("^exec a1: first [0-9]+\\.[0-9]{2} ms, second "
                                       "[0-9]+\\.[0-9]{2} ms; total [0-9]+\\.[0-9]{2} ms$",
                                       0, 0, NULL);
    if (!g_regex_match(re, text, 0, NULL))
        fail_msg("trace '%s'", text);
    assert_null(trace.phases);
    assert_true(g_ascii_strtod(strstr(text, "first ") + 6, NULL) >= 2.0);
}

/* ---------------------------------------------------------------------------------------------
 * Build tree or installed files */

static void
test_build_tree_decide(void **state)
{
    const char *dir = *state;
    g_autofree char *build = g_build_filename(dir, "build", NULL);
    g_autofree char *sub = g_build_filename(build, "hostd", NULL);
    g_autofree char *inside = g_build_filename(sub, "hostd", NULL);
    g_autofree char *sibling = g_build_filename(dir, "build-other", NULL);
    g_autofree char *next_door = g_build_filename(sibling, "hostd", NULL);
    g_autofree char *prefix = g_build_filename(dir, "prefix", NULL);
    g_autofree char *installed = g_build_filename(prefix, "hostd", NULL);
    g_autofree char *link_in = g_build_filename(prefix, "link-to-build", NULL);
    g_autofree char *link_out = g_build_filename(build, "link-to-prefix", NULL);
    g_autofree char *build_link = g_build_filename(dir, "build-link", NULL);
    g_autofree char *gone = g_build_filename(dir, "gone", NULL);

    assert_int_equal(g_mkdir_with_parents(sub, 0700), 0);
    assert_int_equal(g_mkdir(sibling, 0700), 0);
    assert_int_equal(g_mkdir(prefix, 0700), 0);
    vm_test_write_file(inside, "");
    vm_test_write_file(next_door, "");
    vm_test_write_file(installed, "");
    assert_int_equal(symlink(inside, link_in), 0);
    assert_int_equal(symlink(installed, link_out), 0);
    assert_int_equal(symlink(build, build_link), 0);

    /* The program inside the build directory uses it; an installed one never does, also while
     * the build tree exists; a directory whose name only starts like it is another one. */
    assert_true(vm_build_tree_decide(NULL, inside, build));
    assert_false(vm_build_tree_decide(NULL, installed, build));
    assert_false(vm_build_tree_decide(NULL, next_door, build));
    assert_false(vm_build_tree_decide(NULL, build, build));
    /* Where the file really is counts, not the name it was started by. */
    assert_true(vm_build_tree_decide(NULL, link_in, build));
    assert_false(vm_build_tree_decide(NULL, link_out, build));
    assert_true(vm_build_tree_decide(NULL, inside, build_link));
    /* Nothing to compare with: installed files. */
    assert_false(vm_build_tree_decide(NULL, inside, gone));
    assert_false(vm_build_tree_decide(NULL, gone, build));
    assert_false(vm_build_tree_decide(NULL, inside, "/"));
    assert_false(vm_build_tree_decide(NULL, NULL, build));
    /* $VM_USE_BUILD_TREE decides when it says 1 or 0, and only then. */
    assert_true(vm_build_tree_decide("1", installed, build));
    assert_false(vm_build_tree_decide("0", inside, build));
    assert_true(vm_build_tree_decide("", inside, build));
    assert_false(vm_build_tree_decide("yes", installed, build));
}

/* This test runs from the build tree, so it uses the source tree's templates unless told not to. */
static void
test_use_build_tree(void **state)
{
    g_autofree char *source = g_build_filename(VM_SOURCE_DIR, "templates", NULL);
    g_autofree char *installed = g_build_filename(VM_DATADIR, "templates", NULL);

    g_unsetenv("VM_USE_BUILD_TREE");
    assert_true(vm_use_build_tree());
    g_autofree char *dir = vm_shipped_templates_dir();
    assert_string_equal(dir, source);

    g_setenv("VM_USE_BUILD_TREE", "0", TRUE);
    assert_false(vm_use_build_tree());
    g_autofree char *forced = vm_shipped_templates_dir();
    assert_string_equal(forced, installed);
    g_unsetenv("VM_USE_BUILD_TREE");
}

/* JSON depth is counted as a reader counts it: brackets in strings, escaped quotes and closers
 * past the top do not count. */
static void
test_json_depth(void **state)
{
    (void)state;
    const char *flat = "{\"a\": [1, 2], \"b\": {}}";
    assert_true(vm_json_depth_ok(flat, strlen(flat), 2));
    assert_false(vm_json_depth_ok(flat, strlen(flat), 1));
    const char *in_string = "{\"a\": \"[[[[\\\"[[[\"}";
    assert_true(vm_json_depth_ok(in_string, strlen(in_string), 1));
    const char *closers = "]]]][[[";
    assert_false(vm_json_depth_ok(closers, strlen(closers), 2));
    g_autofree char *deep = g_strnfill(200000, '[');
    assert_false(vm_json_depth_ok(deep, strlen(deep), 64));
    assert_true(vm_json_depth_ok(deep, 64, 64)); /* only @len bytes are read */
    assert_true(vm_json_depth_ok("", 0, 0));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace),
        cmocka_unit_test(test_duration_valid),
        cmocka_unit_test(test_duration_invalid),
        cmocka_unit_test_setup_teardown(test_write_atomic, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_write_atomic_fails, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_write_atomic_fault, setup_dir, teardown_dir),
        cmocka_unit_test(test_format_bytes),
        cmocka_unit_test(test_unix_address),
        cmocka_unit_test_setup_teardown(test_unix_address_binds, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_unix_connect_nofollow, setup_dir, teardown_dir),
        cmocka_unit_test(test_write_nosignal),
        cmocka_unit_test(test_default_paths),
        cmocka_unit_test(test_utf8_cut),
        cmocka_unit_test(test_log_text),
        cmocka_unit_test(test_secret_wipe),
        cmocka_unit_test(test_process_undumpable),
        cmocka_unit_test_setup_teardown(test_build_tree_decide, setup_dir, teardown_dir),
        cmocka_unit_test(test_use_build_tree),
        cmocka_unit_test(test_json_depth),
    };

    /* So that a write that raised SIGPIPE would end the run. */
    signal(SIGPIPE, SIG_DFL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
