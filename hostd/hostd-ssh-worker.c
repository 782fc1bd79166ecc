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

/* How long a worker may take to start (read its key, confine itself), and to take a frame. */
#define START_TIMEOUT_S 10
#define SEND_TIMEOUT_S  5
/* A wait's answer may come this long after the wait itself timed out. */
#define READY_GRACE_S 10
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
    GMutex lock;
    GHashTable *workers; /* agent -> Worker (a reference) */
    gboolean closed;     /* hostd_ssh_workers_close(): none starts any more */
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

static void
wipe_free(char *text)
{
    if (text != NULL)
        explicit_bzero(text, strlen(text));
    g_free(text);
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
    const struct timeval start_timeout = {.tv_sec = START_TIMEOUT_S};
    const struct timeval no_timeout = {0};

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
    (void)setsockopt(parent, SOL_SOCKET, SO_RCVTIMEO, &start_timeout, sizeof(start_timeout));
    sent = vm_wire_send(
        parent, "start",
        hostd_ssh_wire_start_new(target, identity, host_key, as->change, as->uid, as->gid),
        &local_error);
    if (sent)
        reply = vm_wire_recv(parent, HOSTD_SSH_WIRE_FROM_WORKER_MAX, &kind, &local_error);
    if (reply == NULL || !g_str_equal(kind, "ready")) {
        g_autofree char *why = NULL;

        if (reply != NULL && g_str_equal(kind, "failed") &&
            g_variant_is_of_type(reply, G_VARIANT_TYPE_STRING))
            why = hostd_ssh_wire_text(g_variant_get_string(reply, NULL));
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
    (void)setsockopt(parent, SOL_SOCKET, SO_RCVTIMEO, &no_timeout, sizeof(no_timeout));
    worker->control = g_steal_fd(&parent);
    return worker;
}

/* The running worker for @target, started (or restarted) as needed. */
static Worker *
workers_get(HostdSshWorkers *workers, const HostdSshTarget *target, GError **error)
{
    g_autoptr(GMutexLocker) locker = NULL;
    g_autofree char *host_key = NULL;
    g_autofree char *key = NULL;
    char *identity = NULL;
    WorkerUser as;
    Worker *worker;

    /* Asked before the lock: hostd's answer reads its records. */
    if (!workers_user(workers, target, &as, error) ||
        !target_read_keys(target, &identity, &host_key, error))
        return NULL;
    key = target_key(target, &as, identity, host_key);
    locker = g_mutex_locker_new(&workers->lock);
    if (workers->closed) {
        wipe_free(identity);
        return vm_throw(error, VM_ERROR_SSH, "the SSH workers are closed"), NULL;
    }
    worker = g_hash_table_lookup(workers->workers, target->agent);

    if (worker != NULL) {
        gboolean alive;

        g_mutex_lock(&worker->lock);
        alive = worker->control >= 0 && worker->pid > 0;
        g_mutex_unlock(&worker->lock);
        if (alive && g_str_equal(worker->started_for, key)) {
            wipe_free(identity);
            return worker_ref(worker);
        }
        worker_retire(worker);
        g_hash_table_remove(workers->workers, target->agent);
    }
    worker = worker_launch(workers, target, &as, identity, host_key, key, error);
    wipe_free(identity);
    if (worker == NULL)
        return NULL;
    g_hash_table_insert(workers->workers, g_strdup(target->agent), worker_ref(worker));
    return worker;
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

/* A new request's socket, handed to @target's worker. */
static int
workers_request(HostdSshWorkers *workers, const HostdSshTarget *target, GError **error)
{
    /* A worker that died since its last request is found out by the handover and replaced. */
    for (guint attempt = 0; attempt < 2; attempt++) {
        Worker *worker = workers_get(workers, target, error);
        int sock = -1;
        int rc;

        if (worker == NULL)
            return -1;
        rc = worker_request(worker, &sock, error);
        if (rc != 0) {
            worker_unref(worker);
            return sock;
        }
        worker_kill(worker);
        worker_unref(worker);
    }
    return vm_throw(error, VM_ERROR_SSH, "the SSH worker of '%s' takes no request", target->agent),
           -1;
}

/* A new request's socket handed to @agent's running worker; -1 when none runs (none is
 * started). */
static int
workers_request_running(HostdSshWorkers *workers, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&workers->lock);
    Worker *worker = g_hash_table_lookup(workers->workers, agent);
    int sock = -1;

    if (worker == NULL || worker_request(worker, &sock, NULL) <= 0)
        return -1;
    return sock;
}

/* Waits for the answer on @sock until @cancellable (may be NULL) is cancelled. */
static gboolean
request_wait(int sock, GCancellable *cancellable, GError **error)
{
    GPollFD fds[2] = {{.fd = sock, .events = G_IO_IN}};
    guint n = 1;

    if (cancellable != NULL && g_cancellable_make_pollfd(cancellable, &fds[1]))
        n = 2;
    while (g_poll(fds, n, -1) < 0 && errno == EINTR)
        ;
    if (n == 2)
        g_cancellable_release_fd(cancellable);
    return !g_cancellable_set_error_if_cancelled(cancellable, error);
}

/* Reads the request's frames until "done": answers "before" with @before (may be NULL), and
 * passes each "activity" to @activity (may be NULL). */
static gboolean
request_finish(int sock, const HostdSshTarget *target, VmTrace *trace,
               void (*before)(gpointer data), gpointer before_data, void (*activity)(gpointer data),
               gpointer activity_data, GError **error)
{
    gboolean before_seen = FALSE;

    for (;;) {
        g_autoptr(GError) local_error = NULL;
        g_autofree char *kind = NULL;
        g_autoptr(GVariant) payload =
            vm_wire_recv(sock, HOSTD_SSH_WIRE_FROM_WORKER_MAX, &kind, &local_error);

        if (payload == NULL)
            return vm_throw(error, VM_ERROR_SSH,
                            "the SSH worker of '%s' ended before answering: %s", target->agent,
                            local_error->message);
        if (g_str_equal(kind, "done"))
            return hostd_ssh_wire_done_parse(payload, trace, error);
        if (g_str_equal(kind, "activity") && activity != NULL) {
            activity(activity_data);
            continue;
        }
        if (!g_str_equal(kind, "before") || before == NULL || before_seen)
            return vm_throw(error, VM_ERROR_PROTOCOL,
                            "the SSH worker of '%s' sent an unexpected message", target->agent);
        before_seen = TRUE;
        before(before_data);
        if (!vm_wire_send(sock, "go", g_variant_new("()"), error))
            return FALSE;
    }
}

static gboolean
workers_wait_ready(gpointer data, const HostdSshTarget *target, guint timeout_s,
                   GCancellable *cancellable, GError **error)
{
    HostdSshWorkers *workers = data;
    vm_autofd sock = workers_request(workers, target, error);
    const struct timeval answer_timeout = {.tv_sec = timeout_s + READY_GRACE_S};

    if (sock < 0)
        return FALSE;
    (void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &answer_timeout, sizeof(answer_timeout));
    if (!vm_wire_send(sock, "ready", g_variant_new_uint32(timeout_s), error) ||
        !request_wait(sock, cancellable, error))
        return FALSE;
    return request_finish(sock, target, NULL, NULL, NULL, NULL, NULL, error);
}

static gboolean
workers_exec(gpointer data, const HostdSshTarget *target, const HostdExecRequest *request,
             int client_fd, GError **error)
{
    HostdSshWorkers *workers = data;
    vm_autofd sock = workers_request(workers, target, error);
    int rc;

    if (sock < 0)
        return FALSE;
    vm_trace_mark(request->trace, "ssh worker");
    if (!vm_wire_send(sock, "exec", hostd_ssh_wire_exec_new(request), error))
        return FALSE;
    rc = vm_fd_send(sock, client_fd);
    if (rc < 0)
        return vm_throw_errno(error, -rc, "cannot hand the client to the SSH worker of '%s'",
                              target->agent);
    return request_finish(sock, target, request->trace, request->before_command,
                          request->before_command_data, NULL, NULL, error);
}

static gboolean
workers_forward(gpointer data, const HostdSshTarget *target, guint guest_port, int fd,
                void (*activity)(gpointer activity_data), gpointer activity_data, GError **error)
{
    HostdSshWorkers *workers = data;
    vm_autofd sock = workers_request(workers, target, error);
    int rc;

    if (sock < 0)
        return FALSE;
    if (!vm_wire_send(sock, "forward", g_variant_new_uint32(guest_port), error))
        return FALSE;
    rc = vm_fd_send(sock, fd);
    if (rc < 0)
        return vm_throw_errno(error, -rc, "cannot hand the connection to the SSH worker of '%s'",
                              target->agent);
    return request_finish(sock, target, NULL, NULL, NULL, activity, activity_data, error);
}

static gboolean
workers_serial(gpointer data, const HostdSshTarget *target, int fd, gboolean resume, GError **error)
{
    HostdSshWorkers *workers = data;
    vm_autofd chan = fd;
    /* A resume is for the session a running worker holds: a new worker holds none. */
    vm_autofd sock = resume ? workers_request_running(workers, target->agent)
                            : workers_request(workers, target, error);
    int rc;

    if (sock < 0)
        return resume ? vm_throw(error, VM_ERROR_SSH, "no SSH worker of '%s' holds a session",
                                 target->agent)
                      : FALSE;
    if (!vm_wire_send(sock, "serial", g_variant_new_boolean(resume), error))
        return FALSE;
    rc = vm_fd_send(sock, chan);
    if (rc < 0)
        return vm_throw_errno(error, -rc, "cannot hand the virtio port to the SSH worker of '%s'",
                              target->agent);
    return request_finish(sock, target, NULL, NULL, NULL, NULL, NULL, error);
}

static void
workers_sleep(gpointer data, const char *agent)
{
    HostdSshWorkers *workers = data;
    vm_autofd sock = workers_request_running(workers, agent);
    HostdSshTarget target = {.agent = agent};

    /* No worker: no session to keep or drop. */
    if (sock >= 0 && vm_wire_send(sock, "sleep", g_variant_new("()"), NULL))
        (void)request_finish(sock, &target, NULL, NULL, NULL, NULL, NULL, NULL);
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
    g_mutex_init(&workers->lock);
    workers->workers = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, worker_unref);
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
}

void
hostd_ssh_workers_free(HostdSshWorkers *workers)
{
    if (workers == NULL)
        return;
    hostd_ssh_workers_close(workers);
    g_hash_table_unref(workers->workers);
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
