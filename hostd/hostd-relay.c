/* The wake-on-connect TCP relay (see hostd-relay.h and docs/IDLE.md).
 *
 * Threads: one I/O thread runs poll() over every listener and every connection socket of every
 * agent, and a thread pool runs the blocking part of each new connection (the wake callback,
 * then the backend connect with retries). One I/O thread rather than one thread per connection
 * because ~100 agents with a few connections each would mean hundreds of mostly idle threads,
 * each with its own stack and its own wake-ups, while a single poll() over a few hundred
 * sockets costs microseconds per round; the only blocking work, the wake, is exactly what must
 * not sit on the I/O thread, so that one slow wake does not stall other agents' traffic.
 *
 * Ownership: the I/O thread alone closes sockets and frees agents and connections, so no fd is
 * closed while another thread polls it. API calls change state under the lock and nudge the
 * I/O thread through an eventfd; hostd_relay_remove() then waits until the thread has closed
 * everything of the agent. A worker knows its connection only by id and hands its backend
 * socket back through a queue; when the connection is gone by then, it closes the socket itself.
 */
#include "hostd-relay.h"

#include "hostd-pipe.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-util.h"

/* Pause between backend connect attempts while a restored QEMU is not listening yet. */
#define BACKEND_RETRY_MS 50

/* How long accepting stops for an agent when the process runs out of descriptors: the listener
 * stays readable, and polling it at once again would spin. */
#define ACCEPT_BACKOFF_US (100 * G_TIME_SPAN_MILLISECOND)

typedef HostdPipe RelayPipe;

typedef struct _RelayAgent RelayAgent;

typedef struct {
    guint64 id;
    RelayAgent *agent;
    int client_fd;
    int backend_fd; /* -1 while waking / connecting */
    RelayPipe up;   /* client -> backend */
    RelayPipe down; /* backend -> client */
} RelayConn;

struct _RelayAgent {
    char *name;
    guint64 serial; /* tells a removed agent from a new one of the same name */
    int listen_fd;
    guint backend_port;
    GList *conns;
    guint n_conns;
    gint64 last_activity;
    gint64 accept_paused_until;
    gboolean removing;
};

typedef struct {
    guint64 conn_id;
    int backend_fd; /* -1: wake or connect failed */
} RelayResult;

typedef struct {
    guint64 conn_id;
    char *agent;
    guint backend_port;
    guint timeout_ms;
} RelayJob;

struct _HostdRelay {
    GMutex lock;
    GCond cond;
    GHashTable *agents; /* name -> RelayAgent */
    GHashTable *conns;  /* &id -> RelayConn, for workers' results */
    GQueue results;     /* RelayResult */
    guint64 next_id;
    guint64 next_serial;
    guint backend_timeout_ms;
    gboolean stopping;
    int event_fd;
    GThread *thread;
    GThreadPool *pool;
    HostdRelayWakeFunc wake;
    gpointer user_data;
};

/* One entry of the I/O thread's poll set: a listener (conn NULL) or a connection. */
typedef struct {
    RelayAgent *agent;
    RelayConn *conn;
    int idx_a; /* listener or client socket */
    int idx_b; /* backend socket, -1 when not polled */
} PollRef;

static void
relay_notify(HostdRelay *r)
{
    guint64 one = 1;

    /* EAGAIN means the counter is already non-zero: the thread wakes anyway. */
    while (write(r->event_fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

static void
relay_conn_free(HostdRelay *r, RelayConn *c)
{
    RelayAgent *a = c->agent;

    g_hash_table_remove(r->conns, &c->id);
    a->conns = g_list_remove(a->conns, c);
    a->n_conns--;
    a->last_activity = g_get_monotonic_time();
    if (c->client_fd >= 0)
        close(c->client_fd);
    if (c->backend_fd >= 0)
        close(c->backend_fd);
    hostd_pipe_clear(&c->up);
    hostd_pipe_clear(&c->down);
    g_free(c);
}

static void
relay_agent_free(gpointer data)
{
    RelayAgent *a = data;

    g_assert(a->conns == NULL);
    if (a->listen_fd >= 0)
        close(a->listen_fd);
    g_free(a->name);
    g_free(a);
}

static void
relay_job_free(RelayJob *job)
{
    g_free(job->agent);
    g_free(job);
}

/* ---- worker side: wake, then connect ------------------------------------------------------- */

static gboolean
relay_conn_alive(HostdRelay *r, guint64 id)
{
    gboolean alive;

    g_mutex_lock(&r->lock);
    alive = g_hash_table_contains(r->conns, &id);
    g_mutex_unlock(&r->lock);
    return alive;
}

/* One non-blocking connect to 127.0.0.1:@port, waiting at most @wait_ms for it to complete.
 * Returns the connected socket (non-blocking, close-on-exec) or -1. */
static int
relay_connect_once(guint port, int wait_ms)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    vm_autofd fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct pollfd pfd;
    int err = 0;
    socklen_t len = sizeof(err);
    int one = 1;

    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (errno != EINPROGRESS)
            return -1;
        pfd = (struct pollfd){.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, MAX(wait_ms, 1)) <= 0)
            return -1;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err != 0)
            return -1;
    }
    /* Interactive SSH sends small packets; don't let Nagle hold them on the second hop. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return g_steal_fd(&fd);
}

/* Wakes the agent, then connects to its backend, retrying refusals until the deadline. Returns
 * the backend socket, or -1 when the wake failed, the backend never answered or the connection
 * was closed meanwhile. */
static int
relay_wake_and_connect(HostdRelay *r, const RelayJob *job)
{
    gint64 deadline;

    if (r->wake != NULL) {
        g_autoptr(GError) error = NULL;

        if (!r->wake(job->agent, r->user_data, &error))
            return -1;
    }
    /* A restored or freshly started QEMU listens on the backend port only after a moment. */
    deadline = g_get_monotonic_time() + (gint64)job->timeout_ms * G_TIME_SPAN_MILLISECOND;
    for (;;) {
        gint64 left_ms = (deadline - g_get_monotonic_time()) / G_TIME_SPAN_MILLISECOND;
        int fd = relay_connect_once(job->backend_port, (int)CLAMP(left_ms, 1, G_MAXINT));

        if (fd >= 0 || left_ms <= 0 || !relay_conn_alive(r, job->conn_id))
            return fd;
        g_usleep(MIN(BACKEND_RETRY_MS, left_ms) * G_TIME_SPAN_MILLISECOND);
    }
}

static void
relay_worker(gpointer data, gpointer user_data)
{
    RelayJob *job = data;
    HostdRelay *r = user_data;
    int fd;

    /* Skip the wake of a connection that was closed while the job waited in the pool. */
    fd = relay_conn_alive(r, job->conn_id) ? relay_wake_and_connect(r, job) : -1;

    g_mutex_lock(&r->lock);
    if (g_hash_table_contains(r->conns, &job->conn_id)) {
        RelayResult *res = g_new(RelayResult, 1);

        res->conn_id = job->conn_id;
        res->backend_fd = fd;
        g_queue_push_tail(&r->results, res);
        relay_notify(r);
    } else if (fd >= 0) {
        close(fd);
    }
    g_mutex_unlock(&r->lock);
    relay_job_free(job);
}

/* ---- I/O thread ---------------------------------------------------------------------------- */

static void
relay_accept(HostdRelay *r, RelayAgent *a)
{
    for (;;) {
        int fd = accept4(a->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        int one = 1;

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                a->accept_paused_until = g_get_monotonic_time() + ACCEPT_BACKOFF_US;
            /* EAGAIN: drained; ECONNABORTED and the like concern one client only. */
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;
        }
        if (a->n_conns >= HOSTD_RELAY_MAX_CONNECTIONS) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

        RelayConn *c = g_new0(RelayConn, 1);
        RelayJob *job = g_new0(RelayJob, 1);

        c->id = ++r->next_id;
        c->agent = a;
        c->client_fd = fd;
        c->backend_fd = -1;
        hostd_pipe_init(&c->up, HOSTD_RELAY_BUFFER_SIZE);
        hostd_pipe_init(&c->down, HOSTD_RELAY_BUFFER_SIZE);
        g_hash_table_insert(r->conns, &c->id, c);
        a->conns = g_list_prepend(a->conns, c);
        a->n_conns++;
        a->last_activity = g_get_monotonic_time();

        job->conn_id = c->id;
        job->agent = g_strdup(a->name);
        job->backend_port = a->backend_port;
        job->timeout_ms = r->backend_timeout_ms;
        /* Unlimited non-exclusive pool: cannot fail, and no wake waits for another. */
        g_thread_pool_push(r->pool, job, NULL);
    }
}

/* Handles one connection's poll results. Returns FALSE when the connection is over. */
static gboolean
relay_conn_handle(RelayConn *c)
{
    gboolean progress = FALSE;
    gboolean ok = hostd_pipe_recv(&c->up, c->client_fd, &progress);

    /* While the agent wakes there is no backend yet: the client's bytes wait in the buffer. */
    if (ok && c->backend_fd >= 0)
        ok = hostd_pipe_recv(&c->down, c->backend_fd, &progress) &&
             hostd_pipe_send(&c->up, c->backend_fd, &progress) &&
             hostd_pipe_send(&c->down, c->client_fd, &progress);
    if (progress)
        c->agent->last_activity = g_get_monotonic_time();
    if (!ok)
        return FALSE;
    return c->backend_fd < 0 || !(c->up.shut && c->down.shut);
}

static short
relay_pipe_events_src(RelayPipe *p)
{
    return !p->eof && hostd_pipe_space(p) > 0 ? POLLIN : 0;
}

static short
relay_pipe_events_dst(const RelayPipe *p)
{
    return hostd_pipe_len(p) > 0 ? POLLOUT : 0;
}

static void
relay_pollfd_add(GArray *pfds, int fd, short events)
{
    /* A socket with nothing wanted is left out (fd -1): polling it for errors alone would spin
     * on POLLHUP once both directions are shut but a buffer still waits. */
    struct pollfd pfd = {.fd = events != 0 ? fd : -1, .events = events};

    g_array_append_val(pfds, pfd);
}

/* Applies the workers' results and the pending removals. Called with the lock held. */
static void
relay_process_queues(HostdRelay *r)
{
    RelayResult *res;
    GHashTableIter iter;
    gpointer value;
    gboolean removed = FALSE;

    while ((res = g_queue_pop_head(&r->results)) != NULL) {
        RelayConn *c = g_hash_table_lookup(r->conns, &res->conn_id);

        if (c == NULL) {
            if (res->backend_fd >= 0)
                close(res->backend_fd);
        } else if (res->backend_fd < 0) {
            relay_conn_free(r, c);
        } else {
            c->backend_fd = res->backend_fd;
            c->agent->last_activity = g_get_monotonic_time();
            /* Client bytes (or its FIN) buffered during the wake go out now. */
            if (!relay_conn_handle(c))
                relay_conn_free(r, c);
        }
        g_free(res);
    }

    g_hash_table_iter_init(&iter, r->agents);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        RelayAgent *a = value;

        if (!a->removing)
            continue;
        while (a->conns != NULL)
            relay_conn_free(r, a->conns->data);
        g_hash_table_iter_remove(&iter);
        removed = TRUE;
    }
    if (removed)
        g_cond_broadcast(&r->cond);
}

static gpointer
relay_thread(gpointer data)
{
    HostdRelay *r = data;
    g_autoptr(GArray) pfds = g_array_new(FALSE, FALSE, sizeof(struct pollfd));
    g_autoptr(GArray) refs = g_array_new(FALSE, FALSE, sizeof(PollRef));

    g_mutex_lock(&r->lock);
    for (;;) {
        GHashTableIter iter;
        gpointer value;
        gint64 now = g_get_monotonic_time();
        gint64 wake_at = G_MAXINT64;
        int timeout = -1;

        relay_process_queues(r);
        if (r->stopping && g_hash_table_size(r->agents) == 0)
            break;

        g_array_set_size(pfds, 0);
        g_array_set_size(refs, 0);
        relay_pollfd_add(pfds, r->event_fd, POLLIN);
        g_hash_table_iter_init(&iter, r->agents);
        while (g_hash_table_iter_next(&iter, NULL, &value)) {
            RelayAgent *a = value;
            PollRef ref = {.agent = a, .idx_a = pfds->len, .idx_b = -1};

            if (a->accept_paused_until > now) {
                wake_at = MIN(wake_at, a->accept_paused_until);
            } else {
                relay_pollfd_add(pfds, a->listen_fd, POLLIN);
                g_array_append_val(refs, ref);
            }
            for (GList *l = a->conns; l != NULL; l = l->next) {
                RelayConn *c = l->data;
                PollRef cref = {.agent = a, .conn = c, .idx_a = pfds->len, .idx_b = -1};

                relay_pollfd_add(pfds, c->client_fd,
                                 relay_pipe_events_src(&c->up) | relay_pipe_events_dst(&c->down));
                if (c->backend_fd >= 0) {
                    cref.idx_b = pfds->len;
                    relay_pollfd_add(pfds, c->backend_fd,
                                     relay_pipe_events_src(&c->down) |
                                         relay_pipe_events_dst(&c->up));
                }
                g_array_append_val(refs, cref);
            }
        }
        if (wake_at != G_MAXINT64)
            timeout = (int)MAX((wake_at - now + 999) / 1000, 1);

        g_mutex_unlock(&r->lock);
        int n = poll((struct pollfd *)pfds->data, pfds->len, timeout);
        g_mutex_lock(&r->lock);
        if (n < 0)
            continue; /* EINTR; nothing else is expected with a valid array */

        struct pollfd *p = (struct pollfd *)pfds->data;
        if (p[0].revents != 0) {
            guint64 count;

            while (read(r->event_fd, &count, sizeof(count)) < 0 && errno == EINTR)
                ;
        }
        /* Agents and connections in refs are still alive: only this thread frees them, and
         * each connection appears once in refs. */
        for (guint i = 0; i < refs->len; i++) {
            PollRef *ref = &g_array_index(refs, PollRef, i);
            short ev = p[ref->idx_a].revents | (ref->idx_b >= 0 ? p[ref->idx_b].revents : 0);

            if (ev == 0 || ref->agent->removing)
                continue;
            if (ref->conn == NULL)
                relay_accept(r, ref->agent);
            else if (!relay_conn_handle(ref->conn))
                relay_conn_free(r, ref->conn);
        }
    }
    g_mutex_unlock(&r->lock);
    return NULL;
}

/* ---- public API ---------------------------------------------------------------------------- */

HostdRelay *
hostd_relay_new(HostdRelayWakeFunc wake, gpointer user_data)
{
    HostdRelay *r = g_new0(HostdRelay, 1);

    g_mutex_init(&r->lock);
    g_cond_init(&r->cond);
    r->agents = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, relay_agent_free);
    r->conns = g_hash_table_new(g_int64_hash, g_int64_equal);
    g_queue_init(&r->results);
    r->backend_timeout_ms = HOSTD_RELAY_BACKEND_TIMEOUT_MS;
    r->wake = wake;
    r->user_data = user_data;
    r->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->event_fd < 0)
        g_error("eventfd: %s", g_strerror(errno));
    r->pool = g_thread_pool_new(relay_worker, r, -1, FALSE, NULL);
    r->thread = g_thread_new("hostd-relay", relay_thread, r);
    return r;
}

void
hostd_relay_set_backend_timeout(HostdRelay *r, guint timeout_ms)
{
    g_return_if_fail(r != NULL);

    g_mutex_lock(&r->lock);
    r->backend_timeout_ms = timeout_ms;
    g_mutex_unlock(&r->lock);
}

gboolean
hostd_relay_listen(guint port, int *ret_fd, GError **error)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    vm_autofd fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot create a socket");
    /* Lets hostd take the port back at once after a restart, past TIME_WAIT connections;
     * a live listener still makes bind fail. */
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
        return vm_throw_errno(error, errno, "cannot set SO_REUSEADDR");
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0) {
        if (errno == EADDRINUSE)
            return vm_throw(error, VM_ERROR_NO_RESOURCES, "port %u on 127.0.0.1 is taken", port);
        return vm_throw_errno(error, errno, "cannot listen on 127.0.0.1:%u", port);
    }
    *ret_fd = g_steal_fd(&fd);
    return TRUE;
}

gboolean
hostd_relay_add(HostdRelay *r, const char *agent, guint public_port, guint backend_port,
                GError **error)
{
    g_return_val_if_fail(r != NULL, FALSE);
    g_return_val_if_fail(agent != NULL, FALSE);
    g_return_val_if_fail(public_port > 0 && public_port <= 65535, FALSE);

    /* Said before the port is tried: the port may be the agent's own listener. */
    g_mutex_lock(&r->lock);
    gboolean served = g_hash_table_contains(r->agents, agent);
    g_mutex_unlock(&r->lock);
    if (served)
        return vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already has a relay", agent);
    int fd = -1;
    if (!hostd_relay_listen(public_port, &fd, error))
        return FALSE;
    return hostd_relay_add_listener(r, agent, fd, backend_port, error);
}

gboolean
hostd_relay_add_listener(HostdRelay *r, const char *agent, int listen_fd, guint backend_port,
                         GError **error)
{
    vm_autofd fd = listen_fd;

    g_return_val_if_fail(r != NULL, FALSE);
    g_return_val_if_fail(agent != NULL, FALSE);
    g_return_val_if_fail(listen_fd >= 0, FALSE);
    g_return_val_if_fail(backend_port > 0 && backend_port <= 65535, FALSE);
    g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

    g_mutex_lock(&r->lock);
    if (g_hash_table_contains(r->agents, agent)) {
        g_mutex_unlock(&r->lock);
        return vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already has a relay", agent);
    }
    /* The I/O thread polls it and accepts without blocking. */
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        g_mutex_unlock(&r->lock);
        return vm_throw_errno(error, errno, "cannot make agent '%s''s listener non-blocking",
                              agent);
    }

    RelayAgent *a = g_new0(RelayAgent, 1);

    a->name = g_strdup(agent);
    a->serial = ++r->next_serial;
    a->listen_fd = g_steal_fd(&fd);
    a->backend_port = backend_port;
    a->last_activity = g_get_monotonic_time();
    g_hash_table_insert(r->agents, a->name, a);
    relay_notify(r);
    g_mutex_unlock(&r->lock);
    return TRUE;
}

gboolean
hostd_relay_set_backend(HostdRelay *r, const char *agent, guint backend_port)
{
    g_return_val_if_fail(r != NULL, FALSE);
    g_return_val_if_fail(agent != NULL, FALSE);
    g_return_val_if_fail(backend_port > 0 && backend_port <= 65535, FALSE);

    g_mutex_lock(&r->lock);
    RelayAgent *a = g_hash_table_lookup(r->agents, agent);
    if (a != NULL)
        a->backend_port = backend_port;
    g_mutex_unlock(&r->lock);
    return a != NULL;
}

void
hostd_relay_remove(HostdRelay *r, const char *agent)
{
    RelayAgent *a;
    guint64 serial;

    g_return_if_fail(r != NULL);
    g_return_if_fail(agent != NULL);

    g_mutex_lock(&r->lock);
    a = g_hash_table_lookup(r->agents, agent);
    if (a != NULL) {
        serial = a->serial;
        a->removing = TRUE;
        relay_notify(r);
        /* The I/O thread closes the sockets; wait so that the port is free on return. */
        while ((a = g_hash_table_lookup(r->agents, agent)) != NULL && a->serial == serial)
            g_cond_wait(&r->cond, &r->lock);
    }
    g_mutex_unlock(&r->lock);
}

guint
hostd_relay_open_connections(HostdRelay *r, const char *agent)
{
    RelayAgent *a;
    guint n = 0;

    g_return_val_if_fail(r != NULL, 0);
    g_return_val_if_fail(agent != NULL, 0);

    g_mutex_lock(&r->lock);
    a = g_hash_table_lookup(r->agents, agent);
    if (a != NULL)
        n = a->n_conns;
    g_mutex_unlock(&r->lock);
    return n;
}

gint64
hostd_relay_last_activity(HostdRelay *r, const char *agent)
{
    RelayAgent *a;
    gint64 t = 0;

    g_return_val_if_fail(r != NULL, 0);
    g_return_val_if_fail(agent != NULL, 0);

    g_mutex_lock(&r->lock);
    a = g_hash_table_lookup(r->agents, agent);
    if (a != NULL)
        t = a->last_activity;
    g_mutex_unlock(&r->lock);
    return t;
}

void
hostd_relay_free(HostdRelay *r)
{
    GHashTableIter iter;
    gpointer value;

    if (r == NULL)
        return;

    g_mutex_lock(&r->lock);
    g_hash_table_iter_init(&iter, r->agents);
    while (g_hash_table_iter_next(&iter, NULL, &value))
        ((RelayAgent *)value)->removing = TRUE;
    r->stopping = TRUE;
    relay_notify(r);
    g_mutex_unlock(&r->lock);
    g_thread_join(r->thread);

    /* Every connection is gone now, so workers still in a wake drop their result themselves;
     * this waits for them because they use @r and the caller's user_data. */
    g_thread_pool_free(r->pool, FALSE, TRUE);

    RelayResult *res;
    while ((res = g_queue_pop_head(&r->results)) != NULL) {
        if (res->backend_fd >= 0)
            close(res->backend_fd);
        g_free(res);
    }
    g_hash_table_destroy(r->conns);
    g_hash_table_destroy(r->agents);
    close(r->event_fd);
    g_cond_clear(&r->cond);
    g_mutex_clear(&r->lock);
    g_free(r);
}
