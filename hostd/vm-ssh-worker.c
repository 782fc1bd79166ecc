/* vm-ssh-worker: one agent's SSH client in a process of its own (hostd-ssh-wire.h).
 *
 * hostd starts it per agent with the control socketpair on fd HOSTD_SSH_WORKER_CONTROL_FD and the
 * connection channel on HOSTD_SSH_WORKER_CONNECT_FD. It reads the "start" message (the agent's
 * target, key and pinned host key), confines itself (vm-egress-sandbox.h, its SSH profile: the
 * id hostd gives it, no capabilities, no_new_privs, Landlock, a seccomp filter with no socket() or
 * connect()) and only then talks to the guest, over connections hostd makes and hands over,
 * so libssh parses no guest byte with privileges and the worker reaches nothing else. Then it
 * serves the requests hostd hands over, each on a thread of its own, with the same pool code hostd
 * would run (hostd-ssh.c), and exits once hostd closes the control socket and its requests ended.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hostd-ssh-forward.h"
#include "hostd-ssh-private.h"
#include "hostd-ssh-serial.h"
#include "hostd-ssh-wire.h"
#include "vm-egress-sandbox.h"
#include "vm-error.h"
#include "vm-fd-pass.h"
#include "vm-util.h"
#include "vm-wire.h"

/* How long hostd has to hand over the client's socket after an exec's message, and a
 * connection to the guest once asked. */
#define CLIENT_TIMEOUT_MS  10000
#define CONNECT_TIMEOUT_MS 10000
/* How often a forwarded connection's activity is told to hostd, at most. */
#define ACTIVITY_INTERVAL_US G_USEC_PER_SEC

/* A session over the virtio port: as long as the guest may take to start sshd on it (a first
 * boot's cloud-init enables the service that does). */
#define SERIAL_CONNECT_TIMEOUT_S 300

static HostdSshPool *pool;
static GMutex serial_lock;
static HostdSshSerial *serial;    /* the relay of the held session over the virtio port, or NULL */
static HostdSshForward *forwards; /* the agent's forwarded connections, over pooled sessions */
static HostdSshTarget target;
static GMutex running_lock;
static GCond running_done;
static guint running;
static GMutex connect_lock; /* one question at a time on HOSTD_SSH_WORKER_CONNECT_FD */

/* The pool's connections: asked of hostd, which connects to the guest's sshd itself. */
static int
connect_through_hostd(gpointer data, const HostdSshTarget *unused, GError **error)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&connect_lock);
    const int sock = HOSTD_SSH_WORKER_CONNECT_FD;
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    const char ask = 'C';
    char code = 0;
    ssize_t n;
    int fd, rc;

    do {
        n = write(sock, &ask, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1)
        return vm_throw_errno(error, n < 0 ? errno : EPIPE, "cannot ask hostd for a connection"),
               -1;
    do {
        rc = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
    } while (rc < 0 && errno == EINTR);
    if (rc <= 0)
        return vm_throw(error, VM_ERROR_SSH, "hostd did not answer for a connection"), -1;
    fd = vm_fd_receive(sock, &code);
    if (fd == -ENOMSG)
        return vm_throw_errno(error, (guchar)code, "hostd could not connect"), -1;
    if (fd < 0)
        return vm_throw_errno(error, -fd, "no connection from hostd"), -1;
    return fd;
}

/* Asks hostd for its go before the command is sent (the guest clock after a wake), and waits
 * for it; a hostd that is gone ends the command through the client's socket. */
static void
ask_before_command(gpointer data)
{
    int sock = GPOINTER_TO_INT(data);
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) go = NULL;

    if (vm_wire_send(sock, "before", g_variant_new("()"), NULL))
        go = vm_wire_recv(sock, HOSTD_SSH_WIRE_TO_WORKER_MAX, &kind, NULL);
}

/* The client's socket, handed over after the request's message; blocking for an exec. */
static int
receive_client(int sock, gboolean blocking, GError **error)
{
    struct pollfd pfd = {.fd = sock, .events = POLLIN};
    int fd, flags;

    if (poll(&pfd, 1, CLIENT_TIMEOUT_MS) <= 0)
        return vm_throw(error, VM_ERROR_PROTOCOL, "no client socket came with the exec"), -1;
    fd = vm_fd_receive(sock, NULL);
    if (fd < 0)
        return vm_throw_errno(error, -fd, "cannot take the client socket"), -1;
    /* As hostd's end of the same socket is (the flag belongs to the open file both hold):
     * blocking for an exec, as hostd_ssh_exec() expects, not for a forwarded connection. */
    if (!blocking)
        return fd;
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        close(fd);
        return vm_throw_errno(error, errno, "cannot use the client socket"), -1;
    }
    return fd;
}

static void
serve_exec(int sock, GVariant *payload)
{
    g_autoptr(GError) error = NULL;
    HostdSshWireExec exec;
    g_auto(VmTrace) trace = {0};
    int client = -1;

    if (hostd_ssh_wire_exec_parse(payload, &exec, &error)) {
        if (exec.traced) {
            vm_trace_init(&trace);
            exec.request.trace = &trace;
        }
        if (exec.before_command) {
            exec.request.before_command = ask_before_command;
            exec.request.before_command_data = GINT_TO_POINTER(sock);
        }
        client = receive_client(sock, TRUE, &error);
    }
    /* From here the command runs as long as it does: hostd times the answers until now. */
    if (client >= 0)
        (void)vm_wire_send(sock, "taken", g_variant_new("()"), NULL);
    if (client >= 0) {
        (void)hostd_ssh_exec(pool, &target, &exec.request, client, &error);
        close(client);
    }
    hostd_ssh_wire_exec_clear(&exec);
    (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(error, &trace), NULL);
}

static void
serve_ready(int sock, GVariant *payload)
{
    g_autoptr(GError) error = NULL;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE_UINT32))
        vm_throw(&error, VM_ERROR_PROTOCOL, "a ready message of type %s",
                 g_variant_get_type_string(payload));
    else
        (void)hostd_ssh_wait_ready(pool, &target, g_variant_get_uint32(payload), NULL, &error);
    (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(error, NULL), NULL);
}

/* The agent's virtio port: a new QEMU's for the held session (resume), or one to make the held
 * session over. */
static void
serve_serial(int sock, GVariant *payload)
{
    g_autoptr(GError) error = NULL;
    HostdSshSerial *old = NULL;
    HostdSshSerial *made = NULL;
    gboolean resume;
    int chan, session_fd = -1;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE_BOOLEAN)) {
        vm_throw(&error, VM_ERROR_PROTOCOL, "a serial message of type %s",
                 g_variant_get_type_string(payload));
        (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(error, NULL), NULL);
        return;
    }
    resume = g_variant_get_boolean(payload);
    chan = receive_client(sock, FALSE, &error);
    if (chan >= 0 && resume) {
        g_mutex_lock(&serial_lock);
        if (serial == NULL || !hostd_ssh_serial_is_alive(serial)) {
            close(chan);
            vm_throw(&error, VM_ERROR_SSH, "the SSH worker holds no session over the virtio port");
        } else if (!hostd_ssh_serial_adopt(serial, chan)) {
            vm_throw(&error, VM_ERROR_SSH, "the session over the virtio port has ended");
        }
        g_mutex_unlock(&serial_lock);
    } else if (chan >= 0) {
        made = hostd_ssh_serial_start(chan, &session_fd, &error);
        /* Published before the handshake: a save and wake meanwhile carry it over too. */
        g_mutex_lock(&serial_lock);
        old = g_steal_pointer(&serial);
        serial = made;
        g_mutex_unlock(&serial_lock);
        hostd_ssh_serial_free(old);
        if (made != NULL &&
            !hostd_ssh_pool_hold(pool, &target, session_fd, SERIAL_CONNECT_TIMEOUT_S, &error)) {
            gboolean ours;

            /* Unless a later request replaced (and freed) it meanwhile. */
            g_mutex_lock(&serial_lock);
            ours = serial == made;
            if (ours)
                serial = NULL;
            g_mutex_unlock(&serial_lock);
            if (ours)
                hostd_ssh_serial_free(made);
        }
    }
    (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(error, NULL), NULL);
}

typedef struct {
    GMutex lock;
    GCond cond;
    gboolean done;
    char *why;
} ForwardEnd;

static void
forward_done(const char *why, gpointer data)
{
    ForwardEnd *end = data;

    g_mutex_lock(&end->lock);
    end->done = TRUE;
    end->why = g_strdup(why);
    g_cond_broadcast(&end->cond);
    g_mutex_unlock(&end->lock);
}

/* The guest's sshd for every forwarded connection: the worker's own target. */
static gboolean
forward_wake(const char *agent, gpointer user_data, HostdSshTarget *ret_target, GPtrArray *keep,
             GError **error)
{
    *ret_target = target;
    return TRUE;
}

/* Carries the client's connection until it ends, telling hostd of its activity (hostd counts it
 * against idling the agent). */
static void
serve_forward(int sock, GVariant *payload)
{
    g_autoptr(GError) error = NULL;
    ForwardEnd end = {0};
    gint64 told = 0;
    int client;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE_UINT32) ||
        g_variant_get_uint32(payload) == 0 || g_variant_get_uint32(payload) > 65535) {
        vm_throw(&error, VM_ERROR_PROTOCOL, "a forward message that names no port");
        (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(error, NULL), NULL);
        return;
    }
    client = receive_client(sock, FALSE, &error);
    if (client >= 0)
        (void)vm_wire_send(sock, "taken", g_variant_new("()"), NULL);
    g_mutex_init(&end.lock);
    g_cond_init(&end.cond);
    if (client >= 0 &&
        hostd_ssh_forward_carry(forwards, target.agent, g_variant_get_uint32(payload), client,
                                forward_done, &end, &error)) {
        g_mutex_lock(&end.lock);
        while (!end.done) {
            gint64 last;

            g_cond_wait_until(&end.cond, &end.lock, g_get_monotonic_time() + ACTIVITY_INTERVAL_US);
            last = hostd_ssh_forward_last_activity(forwards, target.agent);
            if (!end.done && last != told) {
                told = last;
                g_mutex_unlock(&end.lock);
                (void)vm_wire_send(sock, "activity", g_variant_new("()"), NULL);
                g_mutex_lock(&end.lock);
            }
        }
        g_mutex_unlock(&end.lock);
        if (end.why != NULL)
            vm_throw(&error, VM_ERROR_SSH, "%s", end.why);
    }
    (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(error, NULL), NULL);
    g_free(end.why);
    g_cond_clear(&end.cond);
    g_mutex_clear(&end.lock);
}

/* One request: its message, the work, the answer. */
static gpointer
serve_request(gpointer data)
{
    int sock = GPOINTER_TO_INT(data);
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) payload = NULL;
    int flags = fcntl(sock, F_GETFL);

    if (flags >= 0 && fcntl(sock, F_SETFL, flags & ~O_NONBLOCK) == 0)
        payload = vm_wire_recv(sock, HOSTD_SSH_WIRE_TO_WORKER_MAX, &kind, NULL);
    if (payload != NULL && g_str_equal(kind, "exec"))
        serve_exec(sock, payload);
    else if (payload != NULL && g_str_equal(kind, "ready"))
        serve_ready(sock, payload);
    else if (payload != NULL && g_str_equal(kind, "forward"))
        serve_forward(sock, payload);
    else if (payload != NULL && g_str_equal(kind, "serial"))
        serve_serial(sock, payload);
    else if (payload != NULL && g_str_equal(kind, "ping"))
        (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(NULL, NULL), NULL);
    else if (payload != NULL && g_str_equal(kind, "sleep")) {
        hostd_ssh_pool_sleep(pool, target.agent);
        (void)vm_wire_send(sock, "done", hostd_ssh_wire_done_new(NULL, NULL), NULL);
    }
    close(sock);

    g_mutex_lock(&running_lock);
    running--;
    g_cond_broadcast(&running_done);
    g_mutex_unlock(&running_lock);
    return NULL;
}

static void
fail(int control, const char *agent, const char *message)
{
    (void)vm_wire_send(control, "failed", g_variant_new_string(message), NULL);
    fprintf(stderr, "vm-ssh-worker %s: %s\n", agent, message);
    _exit(1);
}

int
main(int argc, char **argv)
{
    const int control = HOSTD_SSH_WORKER_CONTROL_FD;
    const char *agent = argc > 1 ? argv[1] : "?";
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) payload = NULL;
    g_autofree char *note = NULL;
    HostdSshWireStart start;

    /* Before the key arrives: nothing of this process's memory ever reaches a core file. */
    vm_process_undumpable();
    if (fcntl(HOSTD_SSH_WORKER_CONNECT_FD, F_GETFD) < 0) {
        fprintf(stderr,
                "vm-ssh-worker: hostd runs this, with its channel on fd %d and the connection "
                "channel on fd %d\n",
                HOSTD_SSH_WORKER_CONTROL_FD, HOSTD_SSH_WORKER_CONNECT_FD);
        return 2;
    }
    payload = vm_wire_recv(control, HOSTD_SSH_WIRE_TO_WORKER_MAX, &kind, &error);
    if (payload == NULL || !g_str_equal(kind, "start"))
        fail(control, agent, error != NULL ? error->message : "the first message was not start");
    if (!hostd_ssh_wire_start_parse(payload, &start, &error))
        fail(control, agent, error->message);
    g_clear_pointer(&payload, g_variant_unref);

    /* libssh and its crypto start before the filter: they may read what it would refuse. */
    pool = hostd_ssh_pool_new();
    hostd_ssh_pool_set_connect(pool, connect_through_hostd, NULL);
    if (!vm_egress_sandbox_enter(VM_SANDBOX_SSH, start.change_user, start.uid, start.gid, &note,
                                 &error))
        fail(control, agent, error->message);
    hostd_ssh_wire_start_target(&start, &target);
    forwards = hostd_ssh_forward_new(pool, forward_wake, NULL, NULL);
    if (!vm_wire_send(control, "ready", g_variant_new_string(note != NULL ? note : ""), NULL))
        return 1;

    for (;;) {
        struct pollfd pfd = {.fd = control, .events = POLLIN};
        int sock;

        if (poll(&pfd, 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        sock = vm_fd_receive(control, NULL);
        if (sock == -EAGAIN || sock == -EPROTO)
            continue;
        if (sock < 0)
            break; /* hostd closed the channel: no more requests */
        g_mutex_lock(&running_lock);
        running++;
        g_mutex_unlock(&running_lock);
        g_thread_unref(g_thread_new("request", serve_request, GINT_TO_POINTER(sock)));
    }

    /* The requests under way end as they would have. */
    g_mutex_lock(&running_lock);
    while (running > 0)
        g_cond_wait(&running_done, &running_lock);
    g_mutex_unlock(&running_lock);
    return 0;
}
