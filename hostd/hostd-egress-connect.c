/* hostd's end of an egress worker's connections out: check the address again, connect, hand
 * the socket over. */
#include "hostd-egress-connect.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-fd-pass.h"
#include "vm-util.h"

/* How long the worker may take to take one answer; past it the channel is closed. */
#define SEND_TIMEOUT_S 2
/* How often the host's own addresses are read again (they are refused like loopback). */
#define LOCAL_REFRESH_US (5 * G_USEC_PER_SEC)

typedef struct {
    int sock;
    char *name;
    HostdEgressConnectPolicyFunc policy_func;
    gpointer user_data;
    GDestroyNotify notify;
} Server;

int
hostd_egress_connect_one(const VmEgressConnectAsk *ask, VmEgressPolicy *policy, GArray *local)
{
    VmEgressAddress address = {.family = ask->family};
    struct sockaddr_storage ss = {0};
    socklen_t sslen;
    int one = 1;
    vm_autofd fd = -1;

    if ((ask->family != AF_INET && ask->family != AF_INET6) || ask->zero != 0 || ask->port == 0)
        return -EINVAL;
    memcpy(address.bytes, ask->bytes, sizeof(address.bytes));
    if (ask->family == AF_INET)
        memset(address.bytes + 4, 0, sizeof(address.bytes) - 4);
    if (vm_egress_policy_check_connect(policy, &address, ask->port, local) != VM_EGRESS_ALLOW)
        return -EACCES;
    if (ask->family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

        sin->sin_family = AF_INET;
        sin->sin_port = htons(ask->port);
        memcpy(&sin->sin_addr, address.bytes, 4);
        sslen = sizeof(*sin);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(ask->port);
        memcpy(&sin6->sin6_addr, address.bytes, 16);
        sslen = sizeof(*sin6);
    }
    fd = socket(ask->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    /* Non-blocking: the answer goes back at once, whatever the destination does. */
    if (connect(fd, (struct sockaddr *)&ss, sslen) < 0 && errno != EINPROGRESS)
        return -errno;
    return g_steal_fd(&fd);
}

/* Reads exactly one ask: TRUE, or FALSE when the worker closed its end or sent a part of one
 * (it is gone or out of step: the channel ends). */
static gboolean
read_ask(int sock, VmEgressConnectAsk *ask)
{
    ssize_t n;

    do {
        n = recv(sock, ask, sizeof(*ask), MSG_WAITALL);
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof(*ask);
}

static gpointer
serve(gpointer data)
{
    Server *server = data;
    g_autoptr(GArray) local = NULL;
    gint64 local_time = 0;
    guint refused = 0;
    VmEgressConnectAsk ask;

    while (read_ask(server->sock, &ask)) {
        g_autoptr(VmEgressPolicy) policy = server->policy_func(server->user_data);
        gint64 now = g_get_monotonic_time();
        int fd, rc;

        if (local == NULL || now - local_time > LOCAL_REFRESH_US) {
            GArray *fresh = vm_egress_local_addresses(NULL);

            if (fresh != NULL) {
                g_clear_pointer(&local, g_array_unref);
                local = fresh;
                local_time = now;
            }
        }
        fd = hostd_egress_connect_one(&ask, policy, local);
        if (fd >= 0) {
            rc = vm_fd_send(server->sock, fd);
            close(fd);
        } else {
            char code = (char)MIN(-fd, 255);

            /* The worker checked this address itself: a refusal here means it did not. */
            if (fd == -EACCES && refused++ == 0)
                g_message("egress worker of '%s' asked for a connection its policy refuses; "
                          "refused",
                          server->name);
            rc = send(server->sock, &code, 1, MSG_NOSIGNAL) == 1 ? 0 : -1;
        }
        if (rc < 0)
            break;
    }
    close(server->sock);
    if (server->notify != NULL)
        server->notify(server->user_data);
    g_free(server->name);
    g_free(server);
    return NULL;
}

gboolean
hostd_egress_connect_serve(int sock, const char *name, HostdEgressConnectPolicyFunc policy_func,
                           gpointer user_data, GDestroyNotify notify, GError **error)
{
    const struct timeval send_timeout = {.tv_sec = SEND_TIMEOUT_S};
    Server *server = g_new0(Server, 1);
    g_autoptr(GError) local_error = NULL;
    GThread *thread;

    (void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    server->sock = sock;
    server->name = g_strdup(name);
    server->policy_func = policy_func;
    server->user_data = user_data;
    server->notify = notify;
    thread = g_thread_try_new("egress-connect", serve, server, &local_error);
    if (thread == NULL) {
        close(sock);
        if (notify != NULL)
            notify(user_data);
        g_free(server->name);
        g_free(server);
        return vm_throw(error, VM_ERROR_IO, "cannot serve the egress worker's connections: %s",
                        local_error->message);
    }
    g_thread_unref(thread);
    return TRUE;
}
