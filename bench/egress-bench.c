/* bench/egress: bulk throughput through the egress proxy against a direct loopback transfer in
 * the same run, and the latency a proxied connection adds.
 *
 * The proxy is reached as a guest reaches it: a socketpair stands for QEMU's end of the guest's
 * connection, and its other end is handed to the proxy's Unix socket the way vm-egress-connect
 * does (for latency, by spawning the real helper per connection, as QEMU's guestfwd does). The
 * proxy on TCP (its core alone, no hand-over) is measured too. Rounds alternate between the
 * paths so that the noise of a shared machine hits them alike; ratios are medians of the
 * per-round ratios.
 *
 * Usage: egress-bench [MIB] [CONNECTIONS] [HELPER]   (defaults 512, 200, and the helper next to
 * this program in the build tree); prints one line per figure. Everything stays on 127.0.0.1. */
#include "vm-egress-proxy.h"
#include "bench-common.h"

#include <glib/gstdio.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 8

extern char **environ;

typedef enum {
    PATH_DIRECT,
    PATH_GUEST, /* socketpair handed over to the proxy's Unix socket */
    PATH_TCP,   /* the proxy's TCP listener */
    N_PATHS,
} Path;

static const char *const path_names[N_PATHS] = {"direct", "proxy (guest path)", "proxy (TCP)"};

typedef struct {
    int listen_fd;
    guint16 port;
    gboolean echo;
} Server;

typedef struct {
    int fd;
    gboolean echo;
} ServerConn;

static char *socket_path;
static guint16 tcp_port;
static guint16 target_port;

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
    server->echo = echo;
    server->listen_fd = bench_listen_loopback(&server->port);
    g_thread_unref(g_thread_new("server", server_thread, server));
}

/* The guest's end of a new connection whose other end the helper (when @helper is set) or this
 * process hands to the proxy. */
static int
guest_connection(const char *helper)
{
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        g_error("socketpair failed");
    if (helper != NULL) {
        posix_spawn_file_actions_t actions;
        char *argv[] = {(char *)helper, socket_path, NULL};
        pid_t pid;
        int status;

        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
        posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
        if (posix_spawn(&pid, helper, &actions, NULL, argv, environ) != 0)
            g_error("cannot run %s", helper);
        posix_spawn_file_actions_destroy(&actions);
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            g_error("%s failed", helper);
    } else {
        g_autoptr(GError) error = NULL;

        if (!vm_egress_proxy_pass_fd(socket_path, sv[1], &error))
            g_error("%s", error->message);
    }
    close(sv[1]);
    return sv[0];
}

/* Opens a connection to @port on @path, through the proxy (CONNECT) unless direct. */
static int
open_to(Path path, guint16 port, const char *helper)
{
    g_autofree char *req = NULL;
    char buf[256];
    gsize got = 0;
    int fd;

    if (path == PATH_DIRECT)
        return bench_dial_loopback(port);
    fd = path == PATH_TCP ? bench_dial_loopback(tcp_port) : guest_connection(helper);
    req = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", port);
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

static double
cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* Sends @mib MiB and waits for the receiver's close; returns MiB/s, and CPU seconds (of this
 * whole process: sender, proxy and receiver) per GiB in *@ret_cpu. */
static double
throughput(Path path, guint mib, double *ret_cpu)
{
    g_autofree char *buf = g_malloc0(1024 * 1024);
    int fd = open_to(path, target_port, NULL);
    gint64 start = g_get_monotonic_time();
    double cpu = cpu_seconds();
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
    if (ret_cpu != NULL)
        *ret_cpu = (cpu_seconds() - cpu) / mib * 1024;
    return mib / ((g_get_monotonic_time() - start) / 1e6);
}

/* Microseconds for connect (+ hand-over + CONNECT) + one byte echoed. */
static double
latency_once(Path path, guint16 echo_port, const char *helper)
{
    gint64 start = g_get_monotonic_time();
    int fd = open_to(path, echo_port, helper);
    char c = 'x';
    double us;

    if (send(fd, &c, 1, MSG_NOSIGNAL) != 1 || recv(fd, &c, 1, 0) != 1)
        g_error("echo failed");
    us = (double)(g_get_monotonic_time() - start);
    close(fd);
    return us;
}

static char *
default_helper(const char *argv0)
{
    g_autofree char *dir = g_path_get_dirname(argv0);

    return g_build_filename(dir, "..", "egress", "vm-egress-connect", NULL);
}

int
main(int argc, char **argv)
{
    guint mib = argc > 1 ? (guint)atoi(argv[1]) : 512;
    guint conns = argc > 2 ? (guint)atoi(argv[2]) : 200;
    g_autofree char *helper = argc > 3 ? g_strdup(argv[3]) : default_helper(argv[0]);
    const char *allow[] = {"127.0.0.1/32", NULL};
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressPolicy) policy = vm_egress_policy_new(allow, NULL, &error);
    g_autofree char *dir = g_dir_make_tmp("egress-bench-XXXXXX", NULL);
    VmEgressConfig config = {.policy = policy, .max_connections = 256};
    g_autoptr(VmEgressProxy) unix_proxy = NULL;
    g_autoptr(VmEgressProxy) tcp_proxy = NULL;
    Server sink = {0}, echo = {0};
    double mibs[N_PATHS][ROUNDS], cpu[N_PATHS][ROUNDS], ratio[N_PATHS][ROUNDS];
    g_autofree double *lat[N_PATHS + 1] = {NULL};
    guint round_mib = MAX(mib / ROUNDS, 1);

    if (policy == NULL || dir == NULL)
        g_error("cannot set up: %s", error != NULL ? error->message : "no temporary directory");
    if (!g_file_test(helper, G_FILE_TEST_IS_EXECUTABLE))
        g_error("no helper at %s (give its path as the third argument)", helper);
    tcp_proxy = vm_egress_proxy_new(&config, &error);
    if (tcp_proxy == NULL)
        g_error("%s", error->message);
    tcp_port = vm_egress_proxy_get_port(tcp_proxy);
    socket_path = g_build_filename(dir, "egress.sock", NULL);
    config.listen_path = socket_path;
    unix_proxy = vm_egress_proxy_new(&config, &error);
    if (unix_proxy == NULL)
        g_error("%s", error->message);
    server_start(&sink, FALSE);
    server_start(&echo, TRUE);
    target_port = sink.port;
    /* a rule without a port allows 80 and 443 only: name the servers' ports */
    {
        g_autofree char *sink_rule = g_strdup_printf("127.0.0.1/32:%u", sink.port);
        g_autofree char *echo_rule = g_strdup_printf("127.0.0.1/32:%u", echo.port);
        const char *ported[] = {sink_rule, echo_rule, NULL};
        g_autoptr(VmEgressPolicy) servers = vm_egress_policy_new(ported, NULL, &error);

        if (servers == NULL)
            g_error("%s", error->message);
        vm_egress_proxy_set_policy(tcp_proxy, servers);
        vm_egress_proxy_set_policy(unix_proxy, servers);
    }

    /* warm up every path, then alternate so drift hits all alike */
    for (int p = 0; p < N_PATHS; p++)
        (void)throughput(p, 16, NULL);
    for (guint r = 0; r < ROUNDS; r++) {
        for (int p = 0; p < N_PATHS; p++)
            mibs[p][r] = throughput(p, round_mib, &cpu[p][r]);
        for (int p = 0; p < N_PATHS; p++)
            ratio[p][r] = mibs[p][r] / mibs[PATH_DIRECT][r];
    }
    for (int p = 0; p <= N_PATHS; p++)
        lat[p] = g_new(double, conns);
    for (guint i = 0; i < conns; i++) {
        lat[PATH_DIRECT][i] = latency_once(PATH_DIRECT, echo.port, NULL);
        lat[PATH_GUEST][i] = latency_once(PATH_GUEST, echo.port, NULL);
        lat[PATH_TCP][i] = latency_once(PATH_TCP, echo.port, NULL);
        lat[N_PATHS][i] = latency_once(PATH_GUEST, echo.port, helper);
    }

    printf("egress throughput (%u MiB in %d rounds, medians):\n", round_mib * ROUNDS, ROUNDS);
    for (int p = 0; p < N_PATHS; p++)
        printf("  %-20s %6.0f MiB/s  cpu %.2f s/GiB  ratio %.2fx\n", path_names[p],
               bench_median(mibs[p], ROUNDS), bench_median(cpu[p], ROUNDS),
               bench_median(ratio[p], ROUNDS));
    printf("ratio proxy/direct throughput %.2fx (guest path; goal >= 0.80)\n",
           bench_median(ratio[PATH_GUEST], ROUNDS));
    printf("connection latency (median of %u, connect + CONNECT + 1-byte echo):\n", conns);
    {
        double direct = bench_median(lat[PATH_DIRECT], conns);
        double guest = bench_median(lat[PATH_GUEST], conns);
        double tcp = bench_median(lat[PATH_TCP], conns);
        double spawned = bench_median(lat[N_PATHS], conns);

        printf("  direct %.0f us | proxy (TCP) %.0f us | proxy (hand-over) %.0f us | "
               "proxy (helper spawned, as QEMU does) %.0f us\n",
               direct, tcp, guest, spawned);
        printf("added latency per connection: %.0f us (proxy) + %.0f us (helper spawn) = %.0f us\n",
               guest - direct, spawned - guest, spawned - direct);
    }
    vm_egress_proxy_free(g_steal_pointer(&unix_proxy));
    g_rmdir(dir);
    return 0;
}
