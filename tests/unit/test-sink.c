#include "test-sink.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    VmTestSink *sink;
    int fd;
} VmTestSinkConn;

static gpointer
sink_conn_thread(gpointer data)
{
    VmTestSinkConn *conn = data;
    char buf[65536];

    while (!g_atomic_int_get(&conn->sink->stop)) {
        struct pollfd pfd = {.fd = conn->fd, .events = POLLIN};
        ssize_t n;

        if (poll(&pfd, 1, 100) <= 0)
            continue;
        n = recv(conn->fd, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        g_atomic_int_add(&conn->sink->bytes, (gint)n);
        if (send(conn->fd, buf, n, MSG_NOSIGNAL) != n)
            break;
    }
    close(conn->fd);
    g_free(conn);
    return NULL;
}

static gpointer
sink_thread(gpointer data)
{
    VmTestSink *sink = data;

    while (!g_atomic_int_get(&sink->stop)) {
        struct pollfd pfd = {.fd = sink->listen_fd, .events = POLLIN};
        VmTestSinkConn *conn;
        int fd;

        if (poll(&pfd, 1, 100) <= 0)
            continue;
        fd = accept4(sink->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        g_atomic_int_inc(&sink->connections);
        conn = g_new0(VmTestSinkConn, 1);
        conn->sink = sink;
        conn->fd = fd;
        g_mutex_lock(&sink->lock);
        g_ptr_array_add(sink->workers, g_thread_new("sink-conn", sink_conn_thread, conn));
        g_mutex_unlock(&sink->lock);
    }
    return NULL;
}

int
vm_test_listen_loopback(guint16 *ret_port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(fd, 64), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    *ret_port = ntohs(sin.sin_port);
    return fd;
}

VmTestSink *
vm_test_sink_new(void)
{
    VmTestSink *sink = g_new0(VmTestSink, 1);

    sink->listen_fd = vm_test_listen_loopback(&sink->port);
    g_mutex_init(&sink->lock);
    sink->workers = g_ptr_array_new();
    sink->thread = g_thread_new("sink", sink_thread, sink);
    return sink;
}

void
vm_test_sink_free(VmTestSink *sink)
{
    g_atomic_int_set(&sink->stop, 1);
    g_thread_join(sink->thread);
    for (guint i = 0; i < sink->workers->len; i++)
        g_thread_join(g_ptr_array_index(sink->workers, i));
    g_ptr_array_unref(sink->workers);
    close(sink->listen_fd);
    g_mutex_clear(&sink->lock);
    g_free(sink);
}

/* The first port the kernel hands out for connect() and bind(0) (32768 where it cannot say). */
static guint
ephemeral_first(void)
{
    g_autofree char *text = NULL;
    guint64 first;

    if (!g_file_get_contents("/proc/sys/net/ipv4/ip_local_port_range", &text, NULL, NULL))
        return 32768;
    first = g_ascii_strtoull(text, NULL, 10);
    return first > 1024 && first <= 65535 ? (guint)first : 32768;
}

guint16
vm_test_free_port(void)
{
    /* Below the kernel's own range: a port the test lets go of there is not handed to another
     * process's outgoing connection or bind(0) before the test binds it again, as a released
     * ephemeral port can be while the unit tests run side by side. Under 27000, where the fleet
     * tests' fixed ports begin, and so 32 or more under the kernel's range. */
    guint first = 16384;
    guint end = MIN(ephemeral_first(), 27000) - 32;

    for (guint attempt = 0; end > first + 1024 && attempt < 256; attempt++) {
        guint16 port = (guint16)g_random_int_range((gint32)first, (gint32)end);
        struct sockaddr_in sin = {.sin_family = AF_INET,
                                  .sin_port = htons(port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        gboolean free_now;

        assert_true(fd >= 0);
        free_now = bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
        close(fd);
        if (free_now)
            return port;
    }
    {
        guint16 port;
        int fd = vm_test_listen_loopback(&port);

        close(fd);
        return port;
    }
}

int
vm_test_connect_loopback(guint16 port, guint timeout_s)
{
    struct sockaddr_in sin = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    if (timeout_s > 0) {
        struct timeval tv = {.tv_sec = timeout_s};
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    }
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
        fail_msg("cannot connect to 127.0.0.1:%u: %s", port, g_strerror(errno));
    return fd;
}

typedef struct {
    int fd;
    const guint8 *data;
    gsize len;
} VmTestSendJob;

static gpointer
send_thread(gpointer data)
{
    VmTestSendJob *job = data;
    gsize off = 0;

    while (off < job->len) {
        ssize_t n = send(job->fd, job->data + off, job->len - off, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += n;
    }
    shutdown(job->fd, SHUT_WR);
    g_free(job);
    return GSIZE_TO_POINTER(off);
}

GThread *
vm_test_send_thread(int fd, const guint8 *data, gsize len)
{
    VmTestSendJob *job = g_new0(VmTestSendJob, 1);

    job->fd = fd;
    job->data = data;
    job->len = len;
    return g_thread_new("send", send_thread, job);
}

void
vm_test_send_text(int fd, const char *text)
{
    assert_int_equal(send(fd, text, strlen(text), MSG_NOSIGNAL), (ssize_t)strlen(text));
}

GString *
vm_test_read_while(int fd, int timeout_ms, VmTestReadDone done, gconstpointer data,
                   gboolean *ret_eof)
{
    GString *out = g_string_new(NULL);
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;

    if (ret_eof != NULL)
        *ret_eof = FALSE;
    while (done == NULL || !done(out, data)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        gint64 left = (deadline - g_get_monotonic_time()) / 1000;
        char buf[4096];
        ssize_t n;

        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            break;
        n = read(fd, buf, sizeof(buf));
        if (n <= 0) {
            if (ret_eof != NULL)
                *ret_eof = TRUE;
            break;
        }
        g_string_append_len(out, buf, n);
    }
    return out;
}

static gboolean
has_needle(const GString *text, gconstpointer needle)
{
    return strstr(text->str, needle) != NULL;
}

GString *
vm_test_read_until(int fd, const char *needle, int timeout_ms, gboolean *ret_eof)
{
    return vm_test_read_while(fd, timeout_ms, needle != NULL ? has_needle : NULL, needle, ret_eof);
}
