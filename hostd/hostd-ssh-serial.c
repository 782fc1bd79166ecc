/* A session over the agent's virtio port that outlives a save: the relay (hostd-ssh-serial.h). */
#include "hostd-ssh-serial.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-util.h"

/* Bytes waiting each way: past it the side they come from is not read (SSH's own windows keep
 * a session far below it). */
#define RELAY_BUFFER_MAX (256 * 1024)
/* The guest's bytes before its banner that are looked at: the rest of a line longer than this
 * is dropped unseen. */
#define BANNER_SCAN_MAX 512
/* The start line is sent again after this, doubled each time up to HELLO_INTERVAL_MAX_MS: the
 * first may have gone to an sshd that was still on the port, which it ended. */
#define HELLO_INTERVAL_MS     2000
#define HELLO_INTERVAL_MAX_MS 8000
/* How long sshd has to send its banner after the guest said it starts it: then a start line
 * again. */
#define STARTING_WAIT_MS 30000
#define RELAY_CHUNK      (16 * 1024)

struct _HostdSshSerial {
    GMutex lock;
    int adopted; /* a new QEMU's connection, until the thread takes it; -1 */
    gboolean stop;
    gboolean ended;
    int wake[2]; /* the thread's poll wakes on [0] */
    GThread *thread;

    /* The thread's own. */
    int mine; /* our end of libssh's socketpair */
    int chan; /* the port's connection now, -1 between QEMUs */
    GByteArray *to_guest, *to_ssh;
    gboolean synced;   /* the guest's banner came: bytes pass both ways */
    gboolean mid_line; /* the scan dropped the start of the line it holds */
    GByteArray *scan;  /* the guest's bytes before the banner */
    gint64 hello_at;   /* when the start line is sent next (monotonic µs) */
    gint64 hello_interval_ms;
};

gssize
hostd_ssh_serial_find_banner(const guint8 *data, gsize len)
{
    for (gsize i = 0; i + 4 <= len; i++) {
        if ((i == 0 || data[i - 1] == '\n') && memcmp(data + i, "SSH-", 4) == 0)
            return (gssize)i;
    }
    return -1;
}

/* Looks at what the guest sent before its banner, a line at a time: the wrapper's
 * HOSTD_SSH_SERIAL_STARTING says sshd is on its way (no more start lines for a while, the next
 * would reach sshd), and once the banner comes what follows it goes to libssh and the relay
 * carries bytes both ways. Anything else is dropped. */
static void
relay_scan(HostdSshSerial *serial)
{
    GByteArray *scan = serial->scan;
    const gsize starting_len = strlen(HOSTD_SSH_SERIAL_STARTING);

    for (;;) {
        const guint8 *nl = memchr(scan->data, '\n', scan->len);
        gsize line_len = nl != NULL ? (gsize)(nl - scan->data) + 1 : scan->len;

        if (!serial->mid_line && hostd_ssh_serial_find_banner(scan->data, MIN(line_len, 4)) == 0) {
            g_byte_array_append(serial->to_ssh, scan->data, scan->len);
            g_byte_array_set_size(scan, 0);
            serial->synced = TRUE;
            return;
        }
        if (nl == NULL)
            break;
        if (!serial->mid_line && line_len == starting_len &&
            memcmp(scan->data, HOSTD_SSH_SERIAL_STARTING, starting_len) == 0)
            serial->hello_at = g_get_monotonic_time() + STARTING_WAIT_MS * 1000;
        g_byte_array_remove_range(scan, 0, (guint)line_len);
        serial->mid_line = FALSE;
    }
    /* What remains is a line's start, "SSH-" maybe not whole yet: kept, but not much of it. */
    if (scan->len > BANNER_SCAN_MAX) {
        g_byte_array_set_size(scan, 0);
        serial->mid_line = TRUE;
    }
}

static void
relay_close_chan(HostdSshSerial *serial)
{
    if (serial->chan >= 0)
        close(g_steal_fd(&serial->chan));
}

/* Reads what @fd has into @into, at most up to RELAY_BUFFER_MAX; FALSE at its end or an error. */
static gboolean
relay_read(int fd, GByteArray *into)
{
    guint8 buf[RELAY_CHUNK];
    gsize room = RELAY_BUFFER_MAX > into->len ? RELAY_BUFFER_MAX - into->len : 0;
    ssize_t n = read(fd, buf, MIN(sizeof(buf), room));

    if (n > 0) {
        g_byte_array_append(into, buf, (guint)n);
        return TRUE;
    }
    return n < 0 && (errno == EAGAIN || errno == EINTR);
}

/* Writes what it can of @from to the socket @fd; FALSE on an error (what was not written stays
 * in @from, for the next QEMU when @fd was a port's). */
static gboolean
relay_write(int fd, GByteArray *from)
{
    ssize_t n = send(fd, from->data, from->len, MSG_NOSIGNAL);

    if (n > 0) {
        g_byte_array_remove_range(from, 0, (guint)n);
        return TRUE;
    }
    return n < 0 && (errno == EAGAIN || errno == EINTR);
}

static void
relay_send_hello(HostdSshSerial *serial)
{
    gint64 now = g_get_monotonic_time();

    if (serial->synced || serial->chan < 0 || now < serial->hello_at)
        return;
    /* A short write is rare on an empty socket; the next one completes the line. */
    if (send(serial->chan, HOSTD_SSH_SERIAL_START, strlen(HOSTD_SSH_SERIAL_START), MSG_NOSIGNAL) <
            0 &&
        errno != EAGAIN && errno != EINTR)
        relay_close_chan(serial);
    serial->hello_at = now + serial->hello_interval_ms * 1000;
    serial->hello_interval_ms = MIN(serial->hello_interval_ms * 2, HELLO_INTERVAL_MAX_MS);
}

static gpointer
relay_thread(gpointer data)
{
    HostdSshSerial *serial = data;

    for (;;) {
        struct pollfd fds[3] = {{.fd = serial->wake[0], .events = POLLIN}};
        int timeout = -1;
        nfds_t n = 3;

        g_mutex_lock(&serial->lock);
        if (serial->stop) {
            g_mutex_unlock(&serial->lock);
            break;
        }
        if (serial->adopted >= 0) {
            relay_close_chan(serial);
            serial->chan = g_steal_fd(&serial->adopted);
        }
        g_mutex_unlock(&serial->lock);

        relay_send_hello(serial);
        if (!serial->synced && serial->chan >= 0)
            timeout = (int)MAX(0, (serial->hello_at - g_get_monotonic_time()) / 1000);

        fds[1].fd = serial->mine;
        if (serial->to_guest->len < RELAY_BUFFER_MAX)
            fds[1].events |= POLLIN;
        if (serial->to_ssh->len > 0)
            fds[1].events |= POLLOUT;
        fds[2].fd = serial->chan;
        if (serial->chan < 0)
            n = 2;
        else {
            if (serial->to_ssh->len < RELAY_BUFFER_MAX)
                fds[2].events |= POLLIN;
            if (serial->synced && serial->to_guest->len > 0)
                fds[2].events |= POLLOUT;
        }
        if (poll(fds, n, timeout) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[0].revents & POLLIN) {
            char drain[64];
            (void)!read(serial->wake[0], drain, sizeof(drain));
        }
        /* libssh closed its end: the session is over. */
        if ((fds[1].revents & POLLIN) && !relay_read(serial->mine, serial->to_guest))
            break;
        if ((fds[1].revents & (POLLERR | POLLHUP)) && !(fds[1].revents & POLLIN))
            break;
        if ((fds[1].revents & POLLOUT) && !relay_write(serial->mine, serial->to_ssh))
            break;
        if (n == 3 && serial->chan >= 0) {
            /* The old QEMU's last bytes are read to their end before its connection goes. */
            if (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) {
                GByteArray *into = serial->synced ? serial->to_ssh : serial->scan;
                if (!relay_read(serial->chan, into))
                    relay_close_chan(serial);
                if (!serial->synced)
                    relay_scan(serial);
            }
            if (serial->chan >= 0 && (fds[2].revents & POLLOUT) &&
                !relay_write(serial->chan, serial->to_guest))
                relay_close_chan(serial);
        }
    }

    g_mutex_lock(&serial->lock);
    serial->ended = TRUE;
    g_mutex_unlock(&serial->lock);
    /* libssh sees its connection end. */
    close(g_steal_fd(&serial->mine));
    relay_close_chan(serial);
    return NULL;
}

static gboolean
set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);

    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

HostdSshSerial *
hostd_ssh_serial_start(int chan_fd, int *ret_session_fd, GError **error)
{
    g_autoptr(HostdSshSerial) serial = g_new0(HostdSshSerial, 1);
    int pair[2];

    g_mutex_init(&serial->lock);
    serial->adopted = -1;
    serial->mine = -1;
    serial->chan = chan_fd;
    serial->wake[0] = serial->wake[1] = -1;
    serial->to_guest = g_byte_array_new();
    serial->to_ssh = g_byte_array_new();
    serial->scan = g_byte_array_new();
    serial->hello_interval_ms = HELLO_INTERVAL_MS;
    serial->ended = TRUE; /* until the thread runs */

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make the serial session's socket"), NULL;
    serial->mine = pair[0];
    *ret_session_fd = pair[1];
    if (pipe2(serial->wake, O_CLOEXEC | O_NONBLOCK) < 0 || !set_nonblocking(serial->mine) ||
        !set_nonblocking(serial->chan)) {
        close(g_steal_fd(ret_session_fd));
        return vm_throw_errno(error, errno, "cannot set up the serial session's relay"), NULL;
    }
    serial->ended = FALSE;
    serial->thread = g_thread_try_new("ssh-serial", relay_thread, serial, error);
    if (serial->thread == NULL) {
        serial->ended = TRUE;
        close(g_steal_fd(ret_session_fd));
        return NULL;
    }
    return g_steal_pointer(&serial);
}

gboolean
hostd_ssh_serial_is_alive(HostdSshSerial *serial)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&serial->lock);

    return !serial->ended;
}

gboolean
hostd_ssh_serial_adopt(HostdSshSerial *serial, int chan_fd)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&serial->lock);

    if (serial->ended || !set_nonblocking(chan_fd)) {
        close(chan_fd);
        return FALSE;
    }
    if (serial->adopted >= 0)
        close(serial->adopted);
    serial->adopted = chan_fd;
    (void)!write(serial->wake[1], "", 1);
    return TRUE;
}

void
hostd_ssh_serial_free(HostdSshSerial *serial)
{
    if (serial == NULL)
        return;
    if (serial->thread != NULL) {
        g_mutex_lock(&serial->lock);
        serial->stop = TRUE;
        g_mutex_unlock(&serial->lock);
        (void)!write(serial->wake[1], "", 1);
        g_thread_join(serial->thread);
    }
    if (serial->mine >= 0)
        close(serial->mine);
    if (serial->chan >= 0)
        close(serial->chan);
    if (serial->adopted >= 0)
        close(serial->adopted);
    for (guint i = 0; i < 2; i++) {
        if (serial->wake[i] >= 0)
            close(serial->wake[i]);
    }
    g_byte_array_unref(serial->to_guest);
    g_byte_array_unref(serial->to_ssh);
    g_byte_array_unref(serial->scan);
    g_mutex_clear(&serial->lock);
    g_free(serial);
}
