/* Each agent's SSH client in a confined worker process: start, reap, hand requests over. */
#include "hostd-ssh-worker.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hostd-log.h"
#include "hostd-ssh-wire.h"
#include "vm-error.h"
#include "vm-fd-pass.h"
#include "vm-util.h"
#include "vm-wire.h"

/* How long a worker may take to take a frame. */
#define SEND_TIMEOUT_S 5
/* The deadline of each answer a worker owes, unless configured (hostd-ssh-worker.h). */
#define ANSWER_TIMEOUT_MS_DEFAULT 10000
/* While a command runs, how often its worker is asked whether it still answers, unless
 * configured. */
#define PING_INTERVAL_MS_DEFAULT 30000
/* A sleep's time for a spare shell on its way, unless configured: the worker's own bound on that
 * wait (SESSION_TIMEOUT_S in hostd-ssh.c). */
#define SLEEP_GRACE_MS_DEFAULT 30000
/* A new session over the virtio port may take this long (as long as vm-ssh-worker gives it). */
#define SERIAL_CONNECT_TIMEOUT_MS (300 * 1000)
/* A connection to the guest's forwarded port: QEMU accepts at once, or refuses. */
#define CONNECT_TIMEOUT_MS 5000

typedef struct {
    char *agent;
    char *started_for; /* the target it holds: another one replaces it */
    GMutex lock;       /* control, pid */
    int control;       /* -1 once forgotten or gone */
    GPid pid;          /* 0 once it exited */
} Worker;

struct _HostdSshWorkers {
    char *program;
    HostdSshWorkerUserFunc worker_user;
    gpointer worker_user_data;
    gboolean change_user;
    guint uid, gid;
    guint answer_timeout_ms, ping_interval_ms, sleep_grace_ms;
    GMutex lock;
    GHashTable *workers;  /* agent -> Worker (a reference) */
    GHashTable *starting; /* agents whose worker a request is starting */
    GCond started;        /* one of them is done */
    gboolean closed;      /* hostd_ssh_workers_close(): none starts any more */
    /* Cancelled by hostd_ssh_workers_close(): every request still waiting on a worker ends at
     * once, also one whose worker another replaced (out of the set, so not killed there). */
    GCancellable *closing;
};

static void
worker_release(Worker *worker)
{
    g_free(worker->agent);
    g_free(worker->started_for);
    if (worker->control >= 0)
        close(worker->control);
    g_mutex_clear(&worker->lock);
}

static Worker *
worker_ref(Worker *worker)
{
    return g_atomic_rc_box_acquire(worker);
}

static void
worker_unref(gpointer worker)
{
    g_atomic_rc_box_release_full(worker, (GDestroyNotify)worker_release);
}

/* Closes the worker's control socket: it takes no new request and exits once the running ones
 * end (they are the callers', who still wait on them). */
static void
worker_retire(Worker *worker)
{
    g_mutex_lock(&worker->lock);
    if (worker->control >= 0)
        close(g_steal_fd(&worker->control));
    g_mutex_unlock(&worker->lock);
}

/* Ends a worker at once: one that broke the protocol, or at hostd's end. */
static void
worker_kill(Worker *worker)
{
    g_mutex_lock(&worker->lock);
    if (worker->pid > 0)
        (void)kill(worker->pid, SIGKILL);
    g_mutex_unlock(&worker->lock);
    worker_retire(worker);
}

/* The reaper: waits for the worker to exit, however it does, so that none is left a zombie and a
 * dead one is replaced on the next request. */
static gpointer
worker_reap(gpointer data)
{
    Worker *worker = data;
    siginfo_t info;
    GPid pid;

    g_mutex_lock(&worker->lock);
    pid = worker->pid;
    g_mutex_unlock(&worker->lock);
    /* Waited for without reaping, so that its pid stays its own until nobody can kill() it. */
    while (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR)
        ;
    g_mutex_lock(&worker->lock);
    worker->pid = 0;
    g_mutex_unlock(&worker->lock);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    worker_retire(worker);
    worker_unref(worker);
    return NULL;
}

/* The pinned key of @target out of the known_hosts file hostd wrote, "TYPE BASE64" from its
 * line "[HOST]:PORT TYPE BASE64" for the target's host and port: what libssh would take from
 * the file in hostd. */
static char *
read_host_key(const HostdSshTarget *target, GError **error)
{
    g_autofree char *contents = NULL;
    g_autofree char *host = g_strdup_printf("[%s]:%u", target->host, target->port);
    g_autoptr(GError) local_error = NULL;
    g_auto(GStrv) lines = NULL;

    if (!g_file_get_contents(target->known_hosts_path, &contents, NULL, &local_error))
        return vm_throw(error, VM_ERROR_SSH, "no host key of %s pinned: %s", target->agent,
                        local_error->message),
               NULL;
    lines = g_strsplit(contents, "\n", -1);
    for (char **line = lines; *line != NULL; line++) {
        g_auto(GStrv) fields = g_strsplit(*line, " ", 4);

        if (g_strv_length(fields) >= 3 && g_str_equal(fields[0], host))
            return g_strdup_printf("%s %s", fields[1], fields[2]);
    }
    return vm_throw(error, VM_ERROR_SSH, "no host key of %s pinned in %s", target->agent,
                    target->known_hosts_path),
           NULL;
}

/* Whom a worker runs as (HostdSshWorkerUserFunc). */
typedef struct {
    gboolean change;
    guint uid, gid;
} WorkerUser;

/* What a worker is started for: a target that differs in any of it (a new port, user, id, key,
 * pinned host key or the user its worker runs as) needs another worker. */
static char *
target_key(const HostdSshTarget *target, const WorkerUser *as, const char *identity,
           const char *host_key)
{
    g_autofree char *digest = g_compute_checksum_for_string(G_CHECKSUM_SHA256, identity, -1);

    return g_strdup_printf("%s:%u %s %u %d:%u:%u %s %s", target->host, target->port, target->user,
                           target->agent_id, as->change, as->uid, as->gid, digest, host_key);
}

/* Whom @target's worker is to run as. */
static gboolean
workers_user(HostdSshWorkers *workers, const HostdSshTarget *target, WorkerUser *ret_as,
             GError **error)
{
    g_autoptr(GError) local_error = NULL;

    if (workers->worker_user == NULL) {
        *ret_as = (WorkerUser){workers->change_user, workers->uid, workers->gid};
        return TRUE;
    }
    if (!workers->worker_user(workers->worker_user_data, target->agent, target->agent_id,
                              &ret_as->change, &ret_as->uid, &ret_as->gid, &local_error))
        return vm_throw(error, VM_ERROR_SSH, "the SSH worker of '%s' cannot start: %s",
                        target->agent, local_error->message);
    return TRUE;
}

/* Reads the key and the pinned key of @target: what its worker gets (it may read no file of
 * hostd's), and what tells whether the running worker still fits. */
static gboolean
target_read_keys(const HostdSshTarget *target, char **ret_identity, char **ret_host_key,
                 GError **error)
{
    g_autoptr(GError) local_error = NULL;

    *ret_host_key = read_host_key(target, error);
    if (*ret_host_key == NULL)
        return FALSE;
    if (!g_file_get_contents(target->identity_path, ret_identity, NULL, &local_error)) {
        g_clear_pointer(ret_host_key, g_free);
        return vm_throw(error, VM_ERROR_SSH, "cannot read the SSH key of agent '%s': %s",
                        target->agent, local_error->message);
    }
    return TRUE;
}

/* The guest's sshd as hostd reaches it: the target's host and port, fixed when its worker
 * starts (another port starts another worker). */
typedef struct {
    int sock; /* hostd's end of the worker's HOSTD_SSH_WORKER_CONNECT_FD */
    char *host;
    guint port;
} Connector;

/* A TCP connection to @host:@port (numeric, as hostd writes its targets): the socket, or a
 * negative errno. */
static int
connect_guest(const char *host, guint port)
{
    const struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                                   .ai_socktype = SOCK_STREAM};
    g_autofree char *service = g_strdup_printf("%u", port);
    struct addrinfo *addr = NULL;
    struct pollfd pfd = {.events = POLLOUT};
    int fd, rc, err = 0, nodelay = 1;
    socklen_t len = sizeof(err);

    if (getaddrinfo(host, service, &hints, &addr) != 0 || addr == NULL)
        return -EINVAL;
    fd = socket(addr->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(addr);
        return -errno;
    }
    rc = connect(fd, addr->ai_addr, addr->ai_addrlen);
    freeaddrinfo(addr);
    if (rc < 0 && errno == EINPROGRESS) {
        pfd.fd = fd;
        do {
            rc = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
        } while (rc < 0 && errno == EINTR);
        if (rc == 0)
            err = ETIMEDOUT;
        else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
    } else if (rc < 0) {
        err = errno;
    }
    if (err != 0) {
        close(fd);
        return -err;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, sizeof(nodelay));
    return fd;
}

/* Answers the worker's asks for a connection until it exits (or breaks the protocol): each 'C'
 * gets a connection to its guest's sshd, or the errno of the connect() that failed. */
static gpointer
worker_connector(gpointer data)
{
    Connector *connector = data;

    for (;;) {
        char ask = 0;
        ssize_t n = read(connector->sock, &ask, 1);
        int fd, rc;

        if (n < 0 && errno == EINTR)
            continue;
        if (n != 1 || ask != 'C')
            break;
        fd = connect_guest(connector->host, connector->port);
        if (fd >= 0) {
            rc = vm_fd_send(connector->sock, fd);
            close(fd);
        } else {
            char code = (char)MIN(-fd, 255);

            rc = send(connector->sock, &code, 1, MSG_NOSIGNAL) == 1 ? 0 : -1;
        }
        if (rc < 0)
            break;
    }
    close(connector->sock);
    g_free(connector->host);
    g_free(connector);
    return NULL;
}

/* Runs a worker for @target and waits for its "ready". */
static Worker *
worker_launch(HostdSshWorkers *workers, const HostdSshTarget *target, const WorkerUser *as,
              const char *identity, const char *host_key, const char *started_for, GError **error)
{
    int pair[2];
    vm_autofd parent = -1;
    vm_autofd child = -1;
    vm_autofd connect_parent = -1;
    vm_autofd connect_child = -1;
    const char *argv[] = {workers->program, target->agent, NULL};
    int source_fds[2];
    int target_fds[2] = {HOSTD_SSH_WORKER_CONTROL_FD, HOSTD_SSH_WORKER_CONNECT_FD};
    Connector *connector;
    g_autofree char *note = NULL;
    g_autoptr(GError) local_error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) reply = NULL;
    gboolean sent;
    GPid pid = 0;
    Worker *worker;
    const struct timeval send_timeout = {.tv_sec = SEND_TIMEOUT_S};

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make the SSH worker's channel"), NULL;
    parent = pair[0];
    child = pair[1];
    /* What it prints reaches hostd's log only through a pipe hostd reads, bounded and escaped. */
    g_autofree char *who = g_strdup_printf("SSH worker of '%s'", target->agent);
    vm_autofd output = hostd_log_worker_output(who, error);
    if (output < 0)
        return NULL;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make the SSH worker's channel"), NULL;
    connect_parent = pair[0];
    connect_child = pair[1];
    source_fds[0] = child;
    source_fds[1] = connect_child;
    if (!g_spawn_async_with_pipes_and_fds(
            "/", argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_STDIN_FROM_DEV_NULL, NULL, NULL,
            -1, output, output, source_fds, target_fds, 2, &pid, NULL, NULL, NULL, &local_error))
        return vm_throw(error, VM_ERROR_SSH, "cannot run %s: %s", workers->program,
                        local_error->message),
               NULL;
    close(g_steal_fd(&child));
    close(g_steal_fd(&connect_child));
    /* Ends with the worker (its end closes when it exits), holding nothing of hostd's. */
    (void)setsockopt(connect_parent, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    connector = g_new0(Connector, 1);
    connector->sock = g_steal_fd(&connect_parent);
    connector->host = g_strdup(target->host);
    connector->port = target->port;
    g_thread_unref(g_thread_new("ssh-worker-connect", worker_connector, connector));

    worker = g_atomic_rc_box_new0(Worker);
    g_mutex_init(&worker->lock);
    worker->agent = g_strdup(target->agent);
    worker->started_for = g_strdup(started_for);
    worker->pid = pid;
    worker->control = -1;
    /* From here the reaper owns the pid: whatever happens below, the process is reaped. */
    g_thread_unref(g_thread_new("ssh-worker-reap", worker_reap, worker_ref(worker)));

    (void)setsockopt(parent, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    sent = vm_wire_send(
        parent, "start",
        hostd_ssh_wire_start_new(target, identity, host_key, as->change, as->uid, as->gid),
        &local_error);
    if (sent)
        reply =
            vm_wire_recv_until(parent, HOSTD_SSH_WIRE_FROM_WORKER_MAX,
                               g_get_monotonic_time() + (gint64)workers->answer_timeout_ms * 1000,
                               &kind, &local_error);
    if (reply == NULL || !g_str_equal(kind, "ready")) {
        g_autofree char *why = NULL;

        if (reply != NULL && g_str_equal(kind, "failed") &&
            g_variant_is_of_type(reply, G_VARIANT_TYPE_STRING))
            why = hostd_ssh_wire_text(g_variant_get_string(reply, NULL));
        else if (g_error_matches(local_error, VM_ERROR, VM_ERROR_TIMEOUT))
            why = g_strdup_printf("no answer within %g s; it was killed",
                                  workers->answer_timeout_ms / 1000.0);
        else
            why = g_strdup(local_error != NULL ? local_error->message : "an unexpected message");
        vm_throw(error, VM_ERROR_SSH, "the SSH worker of '%s' did not start: %s", target->agent,
                 why);
        worker_kill(worker);
        worker_unref(worker);
        return NULL;
    }
    note = hostd_ssh_wire_ready_note(reply);
    if (note != NULL) {
        static gsize told;

        if (g_once_init_enter(&told)) {
            g_message("SSH worker of '%s': %s", target->agent, note);
            g_once_init_leave(&told, 1);
        }
    }
    worker->control = g_steal_fd(&parent);
    return worker;
}

/* A new reference to @agent's running worker when it was started for @key; else NULL, and one
 * started for another target is retired. Call with workers->lock held. */
static Worker *
workers_lookup_fit(HostdSshWorkers *workers, const char *agent, const char *key)
{
    Worker *worker = g_hash_table_lookup(workers->workers, agent);
    gboolean alive;

    if (worker == NULL)
        return NULL;
    g_mutex_lock(&worker->lock);
    alive = worker->control >= 0 && worker->pid > 0;
    g_mutex_unlock(&worker->lock);
    if (alive && g_str_equal(worker->started_for, key))
        return worker_ref(worker);
    worker_retire(worker);
    g_hash_table_remove(workers->workers, agent);
    return NULL;
}

/* The running worker for @target, started (or restarted) as needed. A start is waited for
 * without the set's lock, so that one agent's slow worker holds up no other agent's request; the
 * requests of the same agent wait for the one start (bounded by its deadline). */
static Worker *
workers_get(HostdSshWorkers *workers, const HostdSshTarget *target, GError **error)
{
    g_autofree char *host_key = NULL;
    g_autofree char *key = NULL;
    char *identity = NULL;
    WorkerUser as;
    Worker *worker, *running = NULL;
    gboolean closed;

    /* Asked before the lock: hostd's answer reads its records. */
    if (!workers_user(workers, target, &as, error) ||
        !target_read_keys(target, &identity, &host_key, error))
        return NULL;
    key = target_key(target, &as, identity, host_key);
    g_mutex_lock(&workers->lock);
    for (;;) {
        closed = workers->closed;
        if (!closed)
            running = workers_lookup_fit(workers, target->agent, key);
        if (closed || running != NULL || !g_hash_table_contains(workers->starting, target->agent))
            break;
        g_cond_wait(&workers->started, &workers->lock);
    }
    if (!closed && running == NULL)
        g_hash_table_add(workers->starting, g_strdup(target->agent));
    g_mutex_unlock(&workers->lock);
    if (closed || running != NULL) {
        vm_secret_free(identity);
        if (closed)
            return vm_throw(error, VM_ERROR_SSH, "the SSH workers are closed"), NULL;
        return running;
    }
    worker = worker_launch(workers, target, &as, identity, host_key, key, error);
    vm_secret_free(identity);
    g_mutex_lock(&workers->lock);
    g_hash_table_remove(workers->starting, target->agent);
    g_cond_broadcast(&workers->started);
    closed = workers->closed;
    if (worker != NULL && !closed) {
        /* Retires one started for another target meanwhile (none of this agent's starts ran). */
        running = workers_lookup_fit(workers, target->agent, key);
        if (running != NULL)
            worker_unref(running);
        g_hash_table_insert(workers->workers, g_strdup(target->agent), worker_ref(worker));
    }
    g_mutex_unlock(&workers->lock);
    if (worker == NULL || !closed)
        return worker;
    worker_kill(worker);
    worker_unref(worker);
    return vm_throw(error, VM_ERROR_SSH, "the SSH workers are closed"), NULL;
}

/* Past a deadline: @worker is killed and, unless already replaced, forgotten, so that the next
 * request of @agent starts another. */
static void
workers_replace(HostdSshWorkers *workers, Worker *worker, const char *agent)
{
    g_mutex_lock(&workers->lock);
    if (g_hash_table_lookup(workers->workers, agent) == worker)
        g_hash_table_remove(workers->workers, agent);
    g_mutex_unlock(&workers->lock);
    worker_kill(worker);
}

/* Hands @worker a new request's socket, ours in *@ret_sock: 1; 0 when the worker takes none
 * (it died); -1 when the socket could not be made. */
static int
worker_request(Worker *worker, int *ret_sock, GError **error)
{
    const struct timeval send_timeout = {.tv_sec = SEND_TIMEOUT_S};
    int pair[2];
    int rc;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot make a request's channel"), -1;
    g_mutex_lock(&worker->lock);
    rc = worker->control >= 0 ? vm_fd_send(worker->control, pair[1]) : -EPIPE;
    g_mutex_unlock(&worker->lock);
    close(pair[1]);
    if (rc < 0) {
        close(pair[0]);
        return 0;
    }
    (void)setsockopt(pair[0], SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    *ret_sock = pair[0];
    return 1;
}

/* A new request's socket, handed to @target's worker (a reference in *@ret_worker). */
static int
workers_request(HostdSshWorkers *workers, const HostdSshTarget *target, Worker **ret_worker,
                GError **error)
{
    /* A worker that died since its last request is found out by the handover and replaced. */
    for (guint attempt = 0; attempt < 2; attempt++) {
        Worker *worker = workers_get(workers, target, error);
        int sock = -1;
        int rc;

        if (worker == NULL)
            return -1;
        rc = worker_request(worker, &sock, error);
        if (rc > 0) {
            *ret_worker = worker;
            return sock;
        }
        if (rc < 0) {
            worker_unref(worker);
            return -1;
        }
        worker_kill(worker);
        worker_unref(worker);
    }
    return vm_throw(error, VM_ERROR_SSH, "the SSH worker of '%s' takes no request", target->agent),
           -1;
}

/* A new request's socket handed to @agent's running worker (a reference in *@ret_worker); -1
 * when none runs (none is started). */
static int
workers_request_running(HostdSshWorkers *workers, const char *agent, Worker **ret_worker)
{
    Worker *worker;
    int sock = -1;

    g_mutex_lock(&workers->lock);
    worker = g_hash_table_lookup(workers->workers, agent);
    if (worker != NULL)
        worker_ref(worker);
    g_mutex_unlock(&workers->lock);
    if (worker == NULL || worker_request(worker, &sock, NULL) <= 0) {
        g_clear_pointer(&worker, worker_unref);
        return -1;
    }
    *ret_worker = worker;
    return sock;
}

/* One request on a worker, and the deadline of the answer it owes. */
typedef struct {
    HostdSshWorkers *workers;
    Worker *worker; /* a reference */
    const char *agent;
    int sock;
    int client;        /* watched: once it hangs up, the worker owes its "done"; -1: none */
    gint64 deadline;   /* of the next answer (g_get_monotonic_time()); -1: none, a command runs */
    gint64 allowed_ms; /* what the deadline allowed, for the message */
    gboolean taken;    /* "taken" is owed first (an exec, a forwarded connection) */
} Request;

static void
request_clear(Request *req)
{
    if (req->sock >= 0)
        close(g_steal_fd(&req->sock));
    g_clear_pointer(&req->worker, worker_unref);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Request, request_clear)

/* The next answer is owed within @ms from now. */
static void
request_expect(Request *req, gint64 ms)
{
    req->deadline = g_get_monotonic_time() + ms * 1000;
    req->allowed_ms = ms;
}

/* Kills and forgets the worker that missed its deadline (the next request starts another). */
static gboolean
request_give_up(Request *req, GError **error)
{
    workers_replace(req->workers, req->worker, req->agent);
    return vm_throw(error, VM_ERROR_SSH,
                    "the SSH worker of agent '%s' did not answer within %g s; it was replaced",
                    req->agent, (double)req->allowed_ms / 1000);
}

/* Sends @kind with @payload; a worker that does not take it is given up as well. */
static gboolean
request_send(Request *req, const char *kind, GVariant *payload, GError **error)
{
    if (vm_wire_send(req->sock, kind, payload, error))
        return TRUE;
    workers_replace(req->workers, req->worker, req->agent);
    return FALSE;
}

/* Hands @fd over after the request's message; the same. */
static gboolean
request_send_fd(Request *req, int fd, const char *what, GError **error)
{
    int rc = vm_fd_send(req->sock, fd);

    if (rc >= 0)
        return TRUE;
    workers_replace(req->workers, req->worker, req->agent);
    return vm_throw_errno(error, -rc, "cannot hand %s to the SSH worker of '%s'", what, req->agent);
}

/* Whether the worker still answers: a request of its own, "ping", answered within the answer
 * deadline. TRUE also when it takes no request any more (forgotten, its last requests ending):
 * then only the client's hang-up times it. */
static gboolean
request_ping(Request *req)
{
    g_autoptr(GVariant) payload = NULL;
    g_autofree char *kind = NULL;
    vm_autofd sock = -1;
    int rc;

    rc = worker_request(req->worker, &sock, NULL);
    if (rc <= 0)
        return TRUE;
    if (!vm_wire_send(sock, "ping", g_variant_new("()"), NULL))
        return FALSE;
    payload = vm_wire_recv_until(
        sock, HOSTD_SSH_WIRE_FROM_WORKER_MAX,
        g_get_monotonic_time() + (gint64)req->workers->answer_timeout_ms * 1000, &kind, NULL);
    return payload != NULL && g_str_equal(kind, "done");
}

/* The next frame the worker sends, by the request's deadline. Without one (a command runs), the
 * client's hang-up starts it, and the worker is pinged now and then meanwhile; @cancellable (may
 * be NULL) ends the wait early. */
static GVariant *
request_next(Request *req, GCancellable *cancellable, char **ret_kind, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    GVariant *payload;
    gint64 frame_deadline;

    for (;;) {
        GPollFD fds[4] = {{.fd = req->sock, .events = G_IO_IN}};
        guint n = 1, client_at = 0, cancel_at = 0, closing_at = 0;
        gint timeout = -1;
        gint rc;

        /* Only its hang-up is looked at (no events asked): its bytes are the worker's. */
        if (req->client >= 0) {
            client_at = n;
            fds[n++] = (GPollFD){.fd = req->client, .events = 0};
        }
        if (cancellable != NULL && g_cancellable_make_pollfd(cancellable, &fds[n]))
            cancel_at = n++;
        if (g_cancellable_make_pollfd(req->workers->closing, &fds[n]))
            closing_at = n++;
        if (req->deadline >= 0) {
            gint64 left = req->deadline - g_get_monotonic_time();

            timeout = left <= 0 ? 0 : (gint)MIN((left + 999) / 1000, G_MAXINT);
        } else {
            timeout = (gint)MIN(req->workers->ping_interval_ms, G_MAXINT);
        }
        rc = g_poll(fds, n, timeout);
        if (cancel_at != 0)
            g_cancellable_release_fd(cancellable);
        if (closing_at != 0)
            g_cancellable_release_fd(req->workers->closing);
        if (rc < 0 && errno == EINTR)
            continue;
        if (g_cancellable_set_error_if_cancelled(cancellable, error))
            return NULL;
        if (g_cancellable_is_cancelled(req->workers->closing))
            return vm_throw(error, VM_ERROR_SSH, "the SSH workers are closed"), NULL;
        if (fds[0].revents != 0)
            break;
        if (client_at != 0 && fds[client_at].revents != 0) {
            req->client = -1;
            if (req->deadline < 0)
                request_expect(req, req->workers->answer_timeout_ms);
            continue;
        }
        if (rc == 0 && req->deadline >= 0 && g_get_monotonic_time() >= req->deadline)
            return request_give_up(req, error), NULL;
        if (rc == 0 && req->deadline < 0 && !request_ping(req)) {
            req->allowed_ms = req->workers->answer_timeout_ms;
            return request_give_up(req, error), NULL;
        }
    }
    /* A frame, once begun, comes whole within the answer deadline. */
    frame_deadline = req->deadline >= 0
                         ? req->deadline
                         : g_get_monotonic_time() + (gint64)req->workers->answer_timeout_ms * 1000;
    if (req->deadline < 0)
        req->allowed_ms = req->workers->answer_timeout_ms;
    payload = vm_wire_recv_until(req->sock, HOSTD_SSH_WIRE_FROM_WORKER_MAX, frame_deadline,
                                 ret_kind, &local_error);
    if (payload == NULL && g_error_matches(local_error, VM_ERROR, VM_ERROR_TIMEOUT))
        return request_give_up(req, error), NULL;
    if (payload == NULL)
        return vm_throw(error, VM_ERROR_SSH, "the SSH worker of '%s' ended before answering: %s",
                        req->agent, local_error->message),
               NULL;
    return payload;
}

/* Reads the request's frames until "done": "taken" first when owed (then a command runs, and
 * only the client's hang-up sets a deadline again), answers "before" with @before (may be NULL),
 * and passes each "activity" to @activity (may be NULL). */
static gboolean
request_finish(Request *req, VmTrace *trace, void (*before)(gpointer data), gpointer before_data,
               void (*activity)(gpointer data), gpointer activity_data, GCancellable *cancellable,
               GError **error)
{
    gboolean before_seen = FALSE;

    for (;;) {
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload = request_next(req, cancellable, &kind, error);

        if (payload == NULL)
            return FALSE;
        if (g_str_equal(kind, "done"))
            return hostd_ssh_wire_done_parse(payload, trace, error);
        if (g_str_equal(kind, "taken") && req->taken) {
            req->taken = FALSE;
            req->deadline = -1;
            continue;
        }
        if (req->taken)
            return vm_throw(error, VM_ERROR_PROTOCOL,
                            "the SSH worker of '%s' did not say it took the request", req->agent);
        if (g_str_equal(kind, "activity") && activity != NULL) {
            activity(activity_data);
            continue;
        }
        if (!g_str_equal(kind, "before") || before == NULL || before_seen)
            return vm_throw(error, VM_ERROR_PROTOCOL,
                            "the SSH worker of '%s' sent an unexpected message", req->agent);
        before_seen = TRUE;
        before(before_data);
        if (!request_send(req, "go", g_variant_new("()"), error))
            return FALSE;
    }
}

/* A request of @target's worker, started as needed; FALSE when none could be had. */
static gboolean
request_open(Request *req, HostdSshWorkers *workers, const HostdSshTarget *target, GError **error)
{
    *req = (Request){.workers = workers, .agent = target->agent, .client = -1, .deadline = -1};
    req->sock = workers_request(workers, target, &req->worker, error);
    return req->sock >= 0;
}

/* The same with @agent's running worker only. */
static gboolean
request_open_running(Request *req, HostdSshWorkers *workers, const char *agent)
{
    *req = (Request){.workers = workers, .agent = agent, .client = -1, .deadline = -1};
    req->sock = workers_request_running(workers, agent, &req->worker);
    return req->sock >= 0;
}

static gboolean
workers_wait_ready(gpointer data, const HostdSshTarget *target, guint timeout_s,
                   GCancellable *cancellable, GError **error)
{
    HostdSshWorkers *workers = data;
    g_auto(Request) req = {.sock = -1};

    if (!request_open(&req, workers, target, error) ||
        !request_send(&req, "ready", g_variant_new_uint32(timeout_s), error))
        return FALSE;
    /* The worker's own wait ends after @timeout_s: its answer is owed a moment later. */
    request_expect(&req, (gint64)timeout_s * 1000 + workers->answer_timeout_ms);
    return request_finish(&req, NULL, NULL, NULL, NULL, NULL, cancellable, error);
}

static gboolean
workers_exec(gpointer data, const HostdSshTarget *target, const HostdExecRequest *request,
             int client_fd, GError **error)
{
    HostdSshWorkers *workers = data;
    g_auto(Request) req = {.sock = -1};

    if (!request_open(&req, workers, target, error))
        return FALSE;
    vm_trace_mark(request->trace, "ssh worker");
    if (!request_send(&req, "exec", hostd_ssh_wire_exec_new(request), error) ||
        !request_send_fd(&req, client_fd, "the client", error))
        return FALSE;
    req.client = client_fd;
    req.taken = TRUE;
    request_expect(&req, workers->answer_timeout_ms);
    return request_finish(&req, request->trace, request->before_command,
                          request->before_command_data, NULL, NULL, NULL, error);
}

static gboolean
workers_forward(gpointer data, const HostdSshTarget *target, guint guest_port, int fd,
                void (*activity)(gpointer activity_data), gpointer activity_data, GError **error)
{
    HostdSshWorkers *workers = data;
    g_auto(Request) req = {.sock = -1};

    if (!request_open(&req, workers, target, error))
        return FALSE;
    if (!request_send(&req, "forward", g_variant_new_uint32(guest_port), error) ||
        !request_send_fd(&req, fd, "the connection", error))
        return FALSE;
    req.client = fd;
    req.taken = TRUE;
    request_expect(&req, workers->answer_timeout_ms);
    return request_finish(&req, NULL, NULL, NULL, activity, activity_data, NULL, error);
}

static gboolean
workers_serial(gpointer data, const HostdSshTarget *target, int fd, gboolean resume, GError **error)
{
    HostdSshWorkers *workers = data;
    vm_autofd chan = fd;
    g_auto(Request) req = {.sock = -1};

    /* A resume is for the session a running worker holds: a new worker holds none. */
    if (resume && !request_open_running(&req, workers, target->agent))
        return vm_throw(error, VM_ERROR_SSH, "no SSH worker of '%s' holds a session",
                        target->agent);
    if (!resume && !request_open(&req, workers, target, error))
        return FALSE;
    if (!request_send(&req, "serial", g_variant_new_boolean(resume), error) ||
        !request_send_fd(&req, chan, "the virtio port", error))
        return FALSE;
    /* A resume adopts the port at once; a new session waits for the guest's sshd on it. */
    request_expect(&req,
                   (gint64)workers->answer_timeout_ms + (resume ? 0 : SERIAL_CONNECT_TIMEOUT_MS));
    return request_finish(&req, NULL, NULL, NULL, NULL, NULL, NULL, error);
}

/* Bounded by the answer deadline: a worker that does not answer is killed, which drops its
 * sessions as a sleep would have, the one over the virtio port too. */
static void
workers_sleep(gpointer data, const char *agent)
{
    HostdSshWorkers *workers = data;
    g_auto(Request) req = {.sock = -1};

    /* No worker: no session to keep or drop. */
    if (!request_open_running(&req, workers, agent) ||
        !request_send(&req, "sleep", g_variant_new("()"), NULL))
        return;
    request_expect(&req, (gint64)workers->answer_timeout_ms + workers->sleep_grace_ms);
    (void)request_finish(&req, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
}

static void
workers_forget(gpointer data, const char *agent)
{
    HostdSshWorkers *workers = data;
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&workers->lock);
    Worker *worker = g_hash_table_lookup(workers->workers, agent);

    if (worker != NULL) {
        worker_retire(worker);
        g_hash_table_remove(workers->workers, agent);
    }
}

const HostdSshDelegate hostd_ssh_workers_delegate = {
    .wait_ready = workers_wait_ready,
    .exec = workers_exec,
    .forget = workers_forget,
    .forward = workers_forward,
    .serial = workers_serial,
    .sleep = workers_sleep,
};

HostdSshWorkers *
hostd_ssh_workers_new(const HostdSshWorkersConfig *config)
{
    HostdSshWorkers *workers = g_new0(HostdSshWorkers, 1);

    workers->program = g_strdup(config->program);
    workers->worker_user = config->worker_user;
    workers->worker_user_data = config->worker_user_data;
    workers->change_user = config->change_user;
    workers->uid = config->uid;
    workers->gid = config->gid;
    workers->answer_timeout_ms =
        config->answer_timeout_ms != 0 ? config->answer_timeout_ms : ANSWER_TIMEOUT_MS_DEFAULT;
    workers->ping_interval_ms =
        config->ping_interval_ms != 0 ? config->ping_interval_ms : PING_INTERVAL_MS_DEFAULT;
    workers->sleep_grace_ms =
        config->sleep_grace_ms != 0 ? config->sleep_grace_ms : SLEEP_GRACE_MS_DEFAULT;
    g_mutex_init(&workers->lock);
    workers->workers = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, worker_unref);
    workers->starting = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_cond_init(&workers->started);
    workers->closing = g_cancellable_new();
    return workers;
}

void
hostd_ssh_workers_close(HostdSshWorkers *workers)
{
    GHashTableIter iter;
    gpointer worker;

    if (workers == NULL)
        return;
    g_mutex_lock(&workers->lock);
    workers->closed = TRUE;
    g_hash_table_iter_init(&iter, workers->workers);
    while (g_hash_table_iter_next(&iter, NULL, &worker))
        worker_kill(worker);
    g_hash_table_remove_all(workers->workers);
    g_mutex_unlock(&workers->lock);
    g_cancellable_cancel(workers->closing);
}

void
hostd_ssh_workers_free(HostdSshWorkers *workers)
{
    if (workers == NULL)
        return;
    hostd_ssh_workers_close(workers);
    g_hash_table_unref(workers->workers);
    g_hash_table_unref(workers->starting);
    g_cond_clear(&workers->started);
    g_object_unref(workers->closing);
    g_mutex_clear(&workers->lock);
    g_free(workers->program);
    g_free(workers);
}

GPid
hostd_ssh_workers_get_pid(HostdSshWorkers *workers, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&workers->lock);
    Worker *worker = g_hash_table_lookup(workers->workers, agent);
    GPid pid = 0;

    if (worker != NULL) {
        g_mutex_lock(&worker->lock);
        pid = worker->control >= 0 ? worker->pid : 0;
        g_mutex_unlock(&worker->lock);
    }
    return pid;
}

char *
hostd_ssh_worker_path(void)
{
    return vm_program_path("VM_SSH_WORKER", HOSTD_SSH_WORKER_BUILD, HOSTD_SSH_WORKER_INSTALLED);
}
