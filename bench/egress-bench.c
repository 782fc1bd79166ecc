/* bench/egress: bulk throughput through the egress proxy against a direct loopback transfer in
 * the same run, and the latency a proxied connection adds (CONNECT round trip included).
 *
 * Usage: egress-bench [MIB] [CONNECTIONS]   (defaults 512 and 200); prints one line per figure
 * and the ratios. Everything stays on 127.0.0.1. */
#include "vm-egress-proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef struct {
    int listen_fd;
    guint16 port;
    gboolean echo;
} Server;

typedef struct {
    int fd;
    gboolean echo;
} ServerConn;

static gpointer
server_conn(gpointer data)
{
    ServerConn *conn = data;
    g_autofree char *buf = g_malloc(256 * 1024);
    ssize_t n;

    while ((n = recv(conn->fd, buf, 256 * 1024, 0)) > 0)
        if (conn->echo && send(conn->fd, buf, n, MSG_NOSIGNAL) != n)
            break;
    close(conn->fd);
    g_free(conn);
    return NULL;
}

static gpointer
server_thread(gpointer data)
{
    Server *server = data;

    for (;;) {
        int fd = accept4(server->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        ServerConn *conn;
        int one = 1;

        if (fd < 0)
            continue;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn = g_new0(ServerConn, 1);
        conn->fd = fd;
        conn->echo = server->echo;
        g_thread_unref(g_thread_new("server-conn", server_conn, conn));
    }
    return NULL;
}

static void
server_start(Server *server, gboolean echo)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);

    server->echo = echo;
    server->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (server->listen_fd < 0 || bind(server->listen_fd, (struct sockaddr *)&sin, len) < 0 ||
        listen(server->listen_fd, 128) < 0 ||
        getsockname(server->listen_fd, (struct sockaddr *)&sin, &len) < 0)
        g_error("cannot start a loopback server");
    server->port = ntohs(sin.sin_port);
    g_thread_unref(g_thread_new("server", server_thread, server));
}

static int
dial(guint16 port)
{
    struct sockaddr_in sin = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;

    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
        g_error("cannot connect to 127.0.0.1:%u", port);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Opens a connection to @target_port, through the proxy at @proxy_port when non-zero. */
static int
open_to(guint16 proxy_port, guint16 target_port)
{
    g_autofree char *req = NULL;
    char buf[256];
    gsize got = 0;
    int fd;

    if (proxy_port == 0)
        return dial(target_port);
    fd = dial(proxy_port);
    req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", target_port);
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
        g_error("send failed");
    while (got < sizeof(buf) - 1) {
        ssize_t n = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);

        if (n <= 0)
            g_error("proxy closed during CONNECT");
        got += n;
        buf[got] = '\0';
        if (strstr(buf, "\r\n\r\n") != NULL)
            break;
    }
    if (!g_str_has_prefix(buf, "HTTP/1.1 200"))
        g_error("proxy refused: %s", buf);
    return fd;
}

/* Sends @mib MiB and waits for the receiver's close; returns MiB/s. */
static double
throughput(guint16 proxy_port, guint16 sink_port, guint mib)
{
    g_autofree char *buf = g_malloc0(1024 * 1024);
    int fd = open_to(proxy_port, sink_port);
    gint64 start = g_get_monotonic_time();
    char c;

    for (guint i = 0; i < mib; i++) {
        gsize off = 0;

        while (off < 1024 * 1024) {
            ssize_t n = send(fd, buf + off, 1024 * 1024 - off, MSG_NOSIGNAL);

            if (n <= 0)
                g_error("send failed");
            off += n;
        }
    }
    shutdown(fd, SHUT_WR);
    /* The sink closes after reading everything: EOF here means every byte arrived. */
    (void)!recv(fd, &c, 1, 0);
    close(fd);
    return mib / ((g_get_monotonic_time() - start) / 1e6);
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* Median microseconds for connect + (CONNECT) + one byte echoed. */
static double
latency(guint16 proxy_port, guint16 echo_port, guint n)
{
    g_autofree double *samples = g_new(double, n);
    double median;

    for (guint i = 0; i < n; i++) {
        gint64 start = g_get_monotonic_time();
        int fd = open_to(proxy_port, echo_port);
        char c = 'x';

        if (send(fd, &c, 1, MSG_NOSIGNAL) != 1 || recv(fd, &c, 1, 0) != 1)
            g_error("echo failed");
        samples[i] = (double)(g_get_monotonic_time() - start);
        close(fd);
    }
    qsort(samples, n, sizeof(double), cmp_double);
    median = samples[n / 2];
    return median;
}

int
main(int argc, char **argv)
{
    guint mib = argc > 1 ? (guint)atoi(argv[1]) : 512;
    guint conns = argc > 2 ? (guint)atoi(argv[2]) : 200;
    const char *allow[] = {"127.0.0.1/32", NULL};
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressPolicy) policy = vm_egress_policy_new(allow, NULL, &error);
    VmEgressConfig config = {.policy = policy, .max_connections = 256};
    g_autoptr(VmEgressProxy) proxy = NULL;
    Server sink = {0}, echo = {0};
    double direct_mibs, proxy_mibs, direct_us, proxy_us;
    guint16 port;

    if (policy == NULL)
        g_error("%s", error->message);
    proxy = vm_egress_proxy_new(&config, &error);
    if (proxy == NULL)
        g_error("%s", error->message);
    port = vm_egress_proxy_get_port(proxy);
    server_start(&sink, FALSE);
    server_start(&echo, TRUE);

    /* warm up both paths, then alternate so drift hits both equally */
    (void)throughput(0, sink.port, 16);
    (void)throughput(port, sink.port, 16);
    direct_mibs = (throughput(0, sink.port, mib / 2) + throughput(0, sink.port, mib / 2)) / 2;
    proxy_mibs = (throughput(port, sink.port, mib / 2) + throughput(port, sink.port, mib / 2)) / 2;
    direct_us = latency(0, echo.port, conns);
    proxy_us = latency(port, echo.port, conns);

    printf("egress throughput (%u MiB): direct %.0f MiB/s | proxy %.0f MiB/s\n", mib, direct_mibs,
           proxy_mibs);
    printf("ratio proxy/direct throughput %.2fx (goal >= 0.80)\n", proxy_mibs / direct_mibs);
    printf("connection latency (median of %u, connect + 1-byte echo): direct %.0f us | proxy %.0f "
           "us | added %.0f us\n",
           conns, direct_us, proxy_us, proxy_us - direct_us);
    return 0;
}
