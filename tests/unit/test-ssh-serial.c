/* The relay of the SSH session over an agent's virtio port: the test plays QEMU's socket and the
 * guest on one side and libssh on the other. What a user relies on: the session starts at the
 * guest's banner whatever an earlier sshd left on the port, and it goes on, no byte lost or
 * doubled, when one QEMU's connection ends (a save) and another's is handed over (the wake). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hostd-ssh-serial.h"
#include "vm-error.h"
#include "test-common.h"

#define READ_TIMEOUT_MS 5000

/* Reads exactly strlen(@want) bytes from @fd within READ_TIMEOUT_MS and compares them. */
static void
assert_reads(int fd, const char *want)
{
    gsize len = strlen(want), got = 0;
    g_autofree char *buf = g_malloc0(len + 1);

    while (got < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, READ_TIMEOUT_MS), 1);
        ssize_t n = read(fd, buf + got, len - got);
        assert_true(n > 0);
        got += (gsize)n;
    }
    assert_string_equal(buf, want);
}

/* Nothing more to read on @fd for a moment. */
static void
assert_quiet(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    assert_int_equal(poll(&pfd, 1, 300), 0);
}

static void
write_all(int fd, const char *text)
{
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
}

static void
qemu_port_new(int *ret_host, int *ret_guest)
{
    int pair[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    *ret_host = pair[0];
    *ret_guest = pair[1];
}

static void
test_find_banner(void **state)
{
    static const struct {
        const char *data;
        gssize at;
    } cases[] = {
        {"SSH-2.0-OpenSSH_9.2\r\n", 0},
        {"garbage\nSSH-2.0-x", 8},
        {"\x01\x02\nSSH-", 3},
        {"xSSH-2.0", -1},         /* not at a line's start */
        {"no banner here\n", -1}, /* none yet */
        {"SSH", -1},              /* not all of it yet */
        {"", -1},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++)
        assert_int_equal(
            hostd_ssh_serial_find_banner((const guint8 *)cases[i].data, strlen(cases[i].data)),
            cases[i].at);
}

static void
test_relay_carries_over_a_save(void **state)
{
    g_autoptr(GError) error = NULL;
    int host_a, guest_a, host_b, guest_b, session;
    g_autoptr(HostdSshSerial) serial = NULL;

    qemu_port_new(&host_a, &guest_a);
    serial = hostd_ssh_serial_start(host_a, &session, &error);
    vm_test_assert_no_error(error);
    assert_non_null(serial);

    /* libssh speaks first; the guest's sshd is not there yet: nothing passes but the start
     * line. */
    write_all(session, "SSH-2.0-libssh\r\n");
    assert_reads(guest_a, HOSTD_SSH_SERIAL_START);
    assert_quiet(guest_a);
    /* What an earlier session's sshd left on the port is dropped; the banner and what follows
     * reach libssh, and libssh's bytes that waited reach the guest. */
    write_all(guest_a, "\x17\x03stale packet\nSSH-2.0-OpenSSH_9.2\r\nKEX");
    assert_reads(session, "SSH-2.0-OpenSSH_9.2\r\nKEX");
    assert_reads(guest_a, "SSH-2.0-libssh\r\n");

    /* The save: QEMU's last bytes, then its end. libssh writes while no QEMU runs. */
    write_all(guest_a, "before-save");
    close(guest_a);
    assert_reads(session, "before-save");
    write_all(session, "while-saved");
    assert_true(hostd_ssh_serial_is_alive(serial));

    /* The wake: a new QEMU's port. No start line this time: the session goes on. */
    qemu_port_new(&host_b, &guest_b);
    assert_true(hostd_ssh_serial_adopt(serial, host_b));
    assert_reads(guest_b, "while-saved");
    assert_quiet(guest_b);
    write_all(guest_b, "after-wake");
    assert_reads(session, "after-wake");

    /* libssh closes the session: the relay ends and closes the port's connection. */
    close(session);
    assert_reads(guest_b, "");
    for (guint i = 0; i < 100 && hostd_ssh_serial_is_alive(serial); i++)
        g_usleep(10000);
    assert_false(hostd_ssh_serial_is_alive(serial));
    {
        char c;
        assert_int_equal(read(guest_b, &c, 1), 0);
    }
    /* Nothing to adopt a port any more. */
    qemu_port_new(&host_a, &guest_a);
    assert_false(hostd_ssh_serial_adopt(serial, host_a));
    close(guest_a);
    close(guest_b);
}

/* The start line is sent again until a banner comes: the first may have reached an sshd of an
 * earlier session, which it ended. A long line without a newline is not taken for a banner's
 * line start. */
static void
test_relay_start_line_repeats(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdSshSerial) serial = NULL;
    g_autofree char *noise = g_strnfill(2000, 'x');
    int host, guest, session;

    qemu_port_new(&host, &guest);
    serial = hostd_ssh_serial_start(host, &session, &error);
    vm_test_assert_no_error(error);
    assert_reads(guest, HOSTD_SSH_SERIAL_START);
    write_all(guest, noise);
    write_all(guest, "SSH-in-the-middle");
    assert_reads(guest, HOSTD_SSH_SERIAL_START); /* within HELLO_INTERVAL_MS */
    assert_quiet(session);
    /* The guest says it starts sshd: no start line goes to sshd while it starts, however long
     * (the next would have come 4 s after the last). */
    write_all(guest, "\n" HOSTD_SSH_SERIAL_STARTING);
    {
        struct pollfd pfd = {.fd = guest, .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 4500), 0);
    }
    write_all(guest, "SSH-2.0-sshd\r\n");
    assert_reads(session, "SSH-2.0-sshd\r\n");
    close(session);
    close(guest);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_banner),
        cmocka_unit_test(test_relay_carries_over_a_save),
        cmocka_unit_test(test_relay_start_line_repeats),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
