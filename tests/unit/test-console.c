/* The console copier (hostd-console.c): whatever a guest writes to its serial console, the host
 * keeps at most HOSTD_CONSOLE_MAX_BYTES in console.log plus as much in console.log.1, the newest
 * bytes, copied as they are (NULs, bytes that are no UTF-8, no line structure). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-console.h"
#include "hostd-state.h"
#include "test-common.h"

typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* The stream the fake guest writes: 16-byte records, the record's number in 12 digits, then a NUL,
 * a byte that is no UTF-8, "\r\n". Byte @pos of it. */
#define RECORD       16
#define STREAM_BYTES (50u * 1024 * 1024)

static char
stream_byte(guint64 pos)
{
    guint64 record = pos / RECORD;
    guint at = (guint)(pos % RECORD);
    static const char tail[] = {'\0', (char)0xff, '\r', '\n'};

    if (at >= 12)
        return tail[at - 12];
    for (guint i = 11; i > at; i--)
        record /= 10;
    return (char)('0' + record % 10);
}

static gpointer
guest_thread(gpointer data)
{
    int fd = GPOINTER_TO_INT(data);
    g_autofree char *buf = g_malloc(RECORD * 4096);
    guint64 pos = 0;

    while (pos < STREAM_BYTES) {
        gsize len = MIN(RECORD * 4096, STREAM_BYTES - pos);
        for (gsize i = 0; i < len; i++)
            buf[i] = stream_byte(pos + i);
        for (gsize done = 0; done < len;) {
            gssize n = write(fd, buf + done, len - done);
            if (n <= 0)
                return GINT_TO_POINTER(FALSE);
            done += (gsize)n;
        }
        pos += len;
    }
    close(fd);
    return GINT_TO_POINTER(TRUE);
}

static gint64
file_size(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* 50 MiB through a socket pair: the files stay under the cap all along, and what they hold
 * together is the end of the stream, byte for byte. */
static void
test_console_capped(void **state)
{
    Fixture *f = *state;
    HostdAgentRecord r = {.name = "a1", .dir = f->dir};
    g_autoptr(HostdLogFile) log = hostd_console_log_new(&r);
    g_autofree char *path = g_build_filename(f->dir, HOSTD_AGENT_CONSOLE, NULL);
    g_autofree char *old_path = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    int fds[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    GThread *guest = g_thread_new("guest", guest_thread, GINT_TO_POINTER(fds[1]));
    guint pumps = 0;
    while (hostd_console_pump(fds[0], log)) {
        pumps++;
        if (file_size(path) > HOSTD_CONSOLE_MAX_BYTES ||
            file_size(old_path) > HOSTD_CONSOLE_MAX_BYTES)
            fail_msg("over the cap after %u reads: %" G_GINT64_FORMAT " + %" G_GINT64_FORMAT, pumps,
                     file_size(path), file_size(old_path));
    }
    close(fds[0]);
    assert_true(GPOINTER_TO_INT(g_thread_join(guest)));

    gchar *current = NULL, *old = NULL;
    gsize current_len = 0, old_len = 0;
    assert_true(g_file_get_contents(path, &current, &current_len, NULL));
    assert_true(g_file_get_contents(old_path, &old, &old_len, NULL));
    g_autofree char *free_current = current, *free_old = old;
    assert_true(current_len > 0 && current_len <= HOSTD_CONSOLE_MAX_BYTES);
    assert_true(old_len > 0 && old_len <= HOSTD_CONSOLE_MAX_BYTES);
    /* The newest bytes, and nothing in between lost: old then current is the stream's end. */
    guint64 start = STREAM_BYTES - current_len - old_len;
    for (gsize i = 0; i < old_len; i++) {
        if (old[i] != stream_byte(start + i))
            fail_msg("console.log.1 byte %zu differs", i);
    }
    for (gsize i = 0; i < current_len; i++) {
        if (current[i] != stream_byte(start + old_len + i))
            fail_msg("console.log byte %zu differs", i);
    }
    assert_int_equal(vm_test_count_entries(f->dir), 2);
}

/* One append larger than the cap keeps its last cap's worth; an empty one writes nothing. */
static void
test_append_bytes_bounds(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, "bytes.log", NULL);
    g_autoptr(HostdLogFile) log = hostd_logfile_new(path, 8, HOSTD_LOGFILE_BYTES);
    g_autoptr(GError) error = NULL;

    assert_true(hostd_logfile_append_bytes(log, "", 0, &error));
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));
    assert_true(hostd_logfile_append_bytes(log, "ab\0", 3, &error));
    assert_true(hostd_logfile_append_bytes(log, "0123456789", 10, &error));
    gchar *text = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(path, &text, &len, NULL));
    g_autofree char *free_text = text;
    assert_int_equal(len, 8);
    assert_memory_equal(text, "23456789", 8);
    g_autofree char *old_path = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    g_autofree char *old = NULL;
    assert_true(g_file_get_contents(old_path, &old, &len, NULL));
    assert_int_equal(len, 3);
    assert_memory_equal(old, "ab\0", 3);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_console_capped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_bytes_bounds, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
