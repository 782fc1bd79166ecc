/* Guest ports carried over SSH (see hostd-ssh-forward.h).
 *
 * Threads: one accept thread polls every listener, as the relay's I/O thread does; a thread pool
 * runs each new connection's wake, the one step that may block for long before the guest; and
 * each agent with connections has a carrier thread, the only user of that agent's SSH session
 * (libssh sessions are not thread-safe): it opens a direct-tcpip channel per connection and moves
 * bytes between the client sockets and the channels with one poll() over both. A carrier runs
 * while its agent has connections and gives its session back to the pool when the last one
 * ends. One carrier per agent rather than one for all: opening a channel or making a session
 * blocks, and one agent's slow guest must not stall the traffic of another.
 *
 * Ownership: after hostd_ssh_forward_add() the accept thread alone polls a listener; a removal
 * waits until that thread has built a poll set without the port, then closes the listener. A
 * connection belongs to the worker that wakes it, then to its agent's carrier, which frees it.
 * Ports and agents are reference-counted, so connections and carriers keep theirs alive after a
 * removal.
 */
#include "hostd-ssh-forward.h"
#include "hostd-ssh-private.h"
#include "hostd-pipe.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hostd-relay.h"
#include "vm-error.h"
#include "vm-util.h"

/* How long accepting stops on a port when the process runs out of descriptors: the listener
 * stays readable, and polling it at once again would spin. */
#define ACCEPT_BACKOFF_US (100 * G_TIME_SPAN_MILLISECOND)

/* A carrier's poll() returns at least this often. Only a safety net: whatever it waits for (a
 * client socket, the session's socket, a new connection) wakes it at once. */
#define CARRIER_POLL_MS 1000

/* Where a connection goes inside the guest, tried in this order: servers on the IPv4 loopback
 * or on every address first, then those on ::1 alone (a dev server bound to "localhost" often
 * is). */
static const char *const guest_hosts[] = {"127.0.0.1", "::1"};

typedef HostdPipe FwdPipe;

/* What the forwarder knows of one agent; lives while it has ports, or a carrier. */
typedef struct {
    gint ref;
    char *name;
    int event_fd;         /* nudges its carrier */
    GQueue incoming;      /* FwdConn woken, for the carrier (lock) */
    gboolean running;     /* a carrier thread runs for it (lock) */
    gboolean stopping;    /* removed: its carrier closes everything and ends (lock) */
    guint n_conns;        /* over all its ports (lock) */
    gint64 last_activity; /* lock */
} FwdAgent;

typedef struct {
    gint ref;
    FwdAgent *agent; /* a reference */
    guint guest_port;
    guint host_port;
    int listen_fd;              /* polled by the accept thread alone; -1 once closed */
    gint64 accept_paused_until; /* the accept thread's */
    gboolean removing;          /* lock */
    guint n_conns;              /* lock */
    GList *waking;              /* FwdConn whose wake runs (lock) */
} FwdPort;

/* An SSH target with strings of its own. */
typedef struct {
    HostdSshTarget target;
    char *agent;
    char *host;
    char *user;
    char *identity_path;
    char *known_hosts_path;
    char *identity_pem;
    char *host_key;
} FwdTarget;

typedef struct {
    FwdPort *port; /* a reference */
    int fd;        /* the client's socket, non-blocking */
    guint client_port;
    FwdTarget *target;            /* what its wake said, until the carrier takes it */
    gboolean closing;             /* its port was removed (the carrier's copy of the flag) */
    char *why;                    /* why it could not be carried, once that is known */
    HostdSshForwardDoneFunc done; /* hostd_ssh_forward_carry()'s, or NULL */
    gpointer done_data;
    /* The carrier's alone: */
    ssh_channel channel;
    FwdPipe up;   /* client -> guest */
    FwdPipe down; /* guest -> client */
} FwdConn;

struct _HostdSshForward {
    GMutex lock; /* everything below but the constants */
    GCond cond;  /* an accept round passed; a carrier ended */
    HostdSshPool *pool;
    HostdSshForwardWakeFunc wake;
    HostdSshForwardLogFunc log;
    gpointer user_data;
    GHashTable *agents;   /* name -> FwdAgent */
    GHashTable *ports;    /* "agent:guest port" -> FwdPort */
    guint64 accept_round; /* poll sets the accept thread has built */
    guint carriers;       /* carrier threads running */
    gboolean stopping;
    int event_fd; /* nudges the accept thread */
    GThread *accept_thread;
    GThreadPool *wakers;
};

/* One carrier thread's state. */
typedef struct {
    HostdSshForward *f;
    FwdAgent *agent;     /* a reference */
    ssh_session session; /* NULL until a connection needs one */
    ssh_event event;     /* watches @session */
    guint64 generation;  /* the pool's, for giving @session back */
    FwdTarget *target;   /* the newest connection's: where sessions are made */
    GPtrArray *conns;    /* FwdConn with an open channel */
} Carrier;

static void
fwd_nudge(int fd)
{
    guint64 one = 1;

    /* EAGAIN means the counter is non-zero already: the reader wakes anyway. */
    while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

static void
fwd_drain(int fd)
{
    guint64 count;

    while (read(fd, &count, sizeof(count)) < 0 && errno == EINTR)
        ;
}

static void G_GNUC_PRINTF(4, 5)
    fwd_log(HostdSshForward *f, const char *agent, guint guest_port, const char *fmt, ...)
{
    g_autofree char *message = NULL;
    va_list ap;

    if (f->log == NULL)
        return;
    va_start(ap, fmt);
    message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    f->log(agent, guest_port, message, f->user_data);
}

static char *
fwd_port_key(const char *agent, guint guest_port)
{
    return g_strdup_printf("%s:%u", agent, guest_port);
}

/* ---- agents, ports, connections ------------------------------------------------------------ */

static FwdAgent *
fwd_agent_new(const char *name)
{
    FwdAgent *a = g_new0(FwdAgent, 1);

    a->ref = 1;
    a->name = g_strdup(name);
    a->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (a->event_fd < 0)
        g_error("eventfd: %s", g_strerror(errno));
    g_queue_init(&a->incoming);
    return a;
}

static FwdAgent *
fwd_agent_ref(FwdAgent *a)
{
    g_atomic_int_inc(&a->ref);
    return a;
}

static void
fwd_agent_unref(gpointer data)
{
    FwdAgent *a = data;

    if (a == NULL || !g_atomic_int_dec_and_test(&a->ref))
        return;
    g_assert(g_queue_is_empty(&a->incoming));
    close(a->event_fd);
    g_free(a->name);
    g_free(a);
}

static FwdPort *
fwd_port_ref(FwdPort *p)
{
    g_atomic_int_inc(&p->ref);
    return p;
}

static void
fwd_port_unref(gpointer data)
{
    FwdPort *p = data;

    if (p == NULL || !g_atomic_int_dec_and_test(&p->ref))
        return;
    g_assert(p->listen_fd < 0 && p->waking == NULL);
    fwd_agent_unref(p->agent);
    g_free(p);
}

static void
fwd_target_free(FwdTarget *t)
{
    if (t == NULL)
        return;
    g_free(t->agent);
    g_free(t->host);
    g_free(t->user);
    g_free(t->identity_path);
    g_free(t->known_hosts_path);
    if (t->identity_pem != NULL)
        explicit_bzero(t->identity_pem, strlen(t->identity_pem));
    g_free(t->identity_pem);
    g_free(t->host_key);
    g_free(t);
}

static FwdTarget *
fwd_target_new(const HostdSshTarget *from)
{
    FwdTarget *t = g_new0(FwdTarget, 1);

    t->agent = g_strdup(from->agent);
    t->host = g_strdup(from->host);
    t->user = g_strdup(from->user);
    t->identity_path = g_strdup(from->identity_path);
    t->known_hosts_path = g_strdup(from->known_hosts_path);
    t->identity_pem = g_strdup(from->identity_pem);
    t->host_key = g_strdup(from->host_key);
    t->target = (HostdSshTarget){
        .agent = t->agent,
        .host = t->host,
        .port = from->port,
        .user = t->user,
        .identity_path = t->identity_path,
        .known_hosts_path = t->known_hosts_path,
        .identity_pem = t->identity_pem,
        .host_key = t->host_key,
        .agent_id = from->agent_id,
    };
    return t;
}

/* Closes @fd after reading what the client sent and nobody took: a socket closed with unread
 * bytes resets the connection, and a client refused (nothing listens in the guest) should see
 * a plain end instead. Bounded: a client still sending gets its reset. */
static void
fwd_close_client(int fd)
{
    char buf[4096];

    for (guint i = 0; i < 16; i++) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

        if (n <= 0 && !(n < 0 && errno == EINTR))
            break;
    }
    close(fd);
}

/* Forgets @c and closes its socket. Its channel must be gone already. Takes the lock. */
static void
fwd_conn_free(HostdSshForward *f, FwdConn *c)
{
    FwdPort *p = c->port;

    g_assert(c->channel == NULL);
    /* Uncounted before the client can see its end. */
    g_mutex_lock(&f->lock);
    p->n_conns--;
    p->agent->n_conns--;
    p->agent->last_activity = g_get_monotonic_time();
    g_mutex_unlock(&f->lock);
    if (c->fd >= 0)
        fwd_close_client(c->fd);
    if (c->done != NULL)
        c->done(c->why, c->done_data);
    hostd_pipe_clear(&c->up);
    hostd_pipe_clear(&c->down);
    fwd_target_free(c->target);
    fwd_port_unref(p);
    g_free(c->why);
    g_free(c);
}

/* Logs why @c could not be carried, keeps it for its done callback, and frees @c. Takes the
 * lock. */
static void G_GNUC_PRINTF(3, 4) fwd_conn_fail(HostdSshForward *f, FwdConn *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_free(c->why);
    c->why = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (f->log != NULL)
        f->log(c->port->agent->name, c->port->guest_port, c->why, f->user_data);
    fwd_conn_free(f, c);
}

/* ---- the pipes ----------------------------------------------------------------------------- */

/* Writes what the pipe holds to @ch, as much as the channel's window takes, then the channel's
 * EOF once the client ended and all is written. Never waits for the window: the guest may be
 * waiting for this side to read. A closed channel takes nothing more: what is left is dropped.
 * FALSE when libssh fails. */
static gboolean
fwd_pipe_to_channel(FwdPipe *p, ssh_channel ch, gboolean *progress)
{
    if (ssh_channel_is_closed(ch))
        return TRUE;
    if (hostd_pipe_len(p) > 0) {
        guint32 len = (guint32)MIN(hostd_pipe_len(p), ssh_channel_window_size(ch));

        if (len > 0) {
            int n = ssh_channel_write(ch, p->data + p->start, len);

            if (n == SSH_ERROR)
                return FALSE;
            p->start += n;
            *progress = *progress || n > 0;
        }
    }
    if (p->eof && hostd_pipe_len(p) == 0 && !p->shut) {
        if (ssh_channel_send_eof(ch) == SSH_ERROR)
            return FALSE;
        p->shut = TRUE;
        *progress = TRUE;
    }
    return TRUE;
}

/* Takes what libssh holds for @ch while there is room, and sees the guest's side end. libssh
 * widens the channel's window only as this reads, so a full pipe stops the guest. FALSE when
 * libssh fails. */
static gboolean
fwd_pipe_from_channel(FwdPipe *p, ssh_channel ch, gboolean *progress)
{
    while (!p->eof) {
        gsize space = hostd_pipe_space(p);
        int n;

        if (space == 0)
            return TRUE;
        n = ssh_channel_read_nonblocking(ch, p->data + p->end, (guint32)space, 0);
        if (n > 0) {
            p->end += n;
            *progress = TRUE;
            continue;
        }
        if (n == SSH_ERROR)
            return FALSE;
        /* Nothing buffered (0), or SSH_EOF: the end once every byte before it is read. */
        if (ssh_channel_is_eof(ch) || ssh_channel_is_closed(ch)) {
            p->eof = TRUE;
            *progress = TRUE;
        }
        return TRUE;
    }
    return TRUE;
}

/* Moves what can move on @c both ways. Returns FALSE when the connection is over: both sides
 * ended (or the guest's closed the channel) and all that came is delivered, or a side failed. */
static gboolean
fwd_conn_pump(FwdConn *c, gboolean *progress)
{
    ssh_channel ch = c->channel;

    if (!hostd_pipe_recv(&c->up, c->fd, progress) || !fwd_pipe_to_channel(&c->up, ch, progress) ||
        !fwd_pipe_from_channel(&c->down, ch, progress) ||
        !hostd_pipe_send(&c->down, c->fd, progress))
        return FALSE;
    return !(c->down.shut && (c->up.shut || ssh_channel_is_closed(ch)));
}

/* ---- carriers ------------------------------------------------------------------------------ */

/* Frees @conn's channel (closing it in the guest) and @conn. */
static void
carrier_conn_close(Carrier *c, FwdConn *conn)
{
    if (conn->channel != NULL) {
        ssh_channel_free(conn->channel);
        conn->channel = NULL;
    }
    fwd_conn_free(c->f, conn);
}

/* Gives the session back to the pool (which closes it when it is dead), every channel of it
 * closed first: the connections still on it are closed. */
static void
carrier_release(Carrier *c)
{
    while (c->conns->len > 0)
        carrier_conn_close(c, g_ptr_array_steal_index_fast(c->conns, c->conns->len - 1));
    if (c->event != NULL) {
        ssh_event_remove_session(c->event, c->session);
        ssh_event_free(c->event);
        c->event = NULL;
    }
    hostd_ssh_session_give(c->f->pool, c->agent->name, c->generation, c->session);
    c->session = NULL;
}

/* The session died under its channels (the guest was saved, rebooted, restored): every
 * connection on it ends. */
static void
carrier_lose(Carrier *c)
{
    if (c->conns->len > 0)
        fwd_log(c->f, c->agent->name, 0,
                "the SSH connection to the agent was lost: %u forwarded connections closed",
                c->conns->len);
    carrier_release(c);
}

/* Makes sure the carrier has a session: a pooled one, or with @fresh a new one. */
static gboolean
carrier_session(Carrier *c, gboolean fresh, GError **error)
{
    if (c->session != NULL)
        return TRUE;
    c->session =
        hostd_ssh_session_take(c->f->pool, &c->target->target, fresh, &c->generation, error);
    if (c->session == NULL)
        return FALSE;
    c->event = ssh_event_new();
    if (c->event == NULL || ssh_event_add_session(c->event, c->session) != SSH_OK) {
        g_autofree char *what =
            g_strdup_printf("cannot watch the connection to agent '%s'", c->agent->name);

        hostd_ssh_throw(error, c->session, what);
        if (c->event != NULL)
            ssh_event_free(c->event);
        c->event = NULL;
        hostd_ssh_session_give(c->f->pool, c->agent->name, c->generation, c->session);
        c->session = NULL;
        return FALSE;
    }
    return TRUE;
}

typedef enum {
    OPEN_OK,
    OPEN_REFUSED, /* the guest's side said no; the session is fine */
    OPEN_LOST,    /* the session is dead */
} OpenResult;

/* Opens @conn's direct-tcpip channel to its port on the guest's loopback, trying each of
 * guest_hosts; *@ret_why says why not (the first refusal). */
static OpenResult
carrier_open_channel(Carrier *c, FwdConn *conn, char **ret_why)
{
    g_autoptr(GError) first = NULL;

    for (gsize i = 0; i < G_N_ELEMENTS(guest_hosts); i++) {
        ssh_channel ch = ssh_channel_new(c->session);
        g_autoptr(GError) error = NULL;

        if (ch != NULL && ssh_channel_open_forward(ch, guest_hosts[i], (int)conn->port->guest_port,
                                                   "127.0.0.1", (int)conn->client_port) == SSH_OK) {
            conn->channel = ch;
            return OPEN_OK;
        }
        hostd_ssh_throw(&error, c->session, "the guest refused the connection");
        if (ch != NULL)
            ssh_channel_free(ch);
        if (!ssh_is_connected(c->session)) {
            *ret_why = g_strdup(error->message);
            return OPEN_LOST;
        }
        if (first == NULL)
            first = g_steal_pointer(&error);
    }
    *ret_why = g_strdup(first->message);
    return OPEN_REFUSED;
}

/* Starts carrying @conn (just woken): a session if the carrier has none, then a channel. A
 * connection that cannot be carried is logged once and closed. */
static void
carrier_open(Carrier *c, FwdConn *conn)
{
    guint port = conn->port->guest_port;
    g_autofree char *why = NULL;

    if (conn->target != NULL) {
        fwd_target_free(c->target);
        c->target = g_steal_pointer(&conn->target);
    }
    /* A pooled session may be dead (the guest restarted under it): one more try, fresh. */
    for (guint attempt = 0; attempt < 2; attempt++) {
        g_autoptr(GError) error = NULL;

        g_clear_pointer(&why, g_free);
        if (!carrier_session(c, attempt > 0, &error)) {
            fwd_conn_fail(c->f, conn, "cannot reach the agent over SSH: %s", error->message);
            return;
        }
        switch (carrier_open_channel(c, conn, &why)) {
        case OPEN_OK:
            hostd_pipe_init(&conn->up, HOSTD_SSH_FORWARD_BUFFER_SIZE);
            hostd_pipe_init(&conn->down, HOSTD_SSH_FORWARD_BUFFER_SIZE);
            g_ptr_array_add(c->conns, conn);
            return;
        case OPEN_REFUSED:
            fwd_conn_fail(c->f, conn, "nothing took the connection on port %u in the guest: %s",
                          port, why);
            return;
        case OPEN_LOST:
        default:
            carrier_lose(c);
            break;
        }
    }
    fwd_conn_fail(c->f, conn, "cannot open a channel to the agent: %s", why);
}

static void
carrier_pollfd_add(GArray *pfds, int fd, short events)
{
    /* A socket with nothing wanted is left out (fd -1): polled for errors alone it would spin on
     * POLLHUP once both directions are shut but a buffer still waits. */
    struct pollfd pfd = {.fd = events != 0 ? fd : -1, .events = events};

    g_array_append_val(pfds, pfd);
}

/* Waits up to @timeout_ms for anything the carrier can act on, and lets libssh read what the
 * session's socket has. */
static void
carrier_wait(Carrier *c, int timeout_ms)
{
    g_autoptr(GArray) pfds = g_array_new(FALSE, FALSE, sizeof(struct pollfd));
    struct pollfd *p;

    carrier_pollfd_add(pfds, c->agent->event_fd, POLLIN);
    carrier_pollfd_add(pfds, c->session != NULL ? ssh_get_fd(c->session) : -1, POLLIN);
    for (guint i = 0; i < c->conns->len; i++) {
        FwdConn *conn = c->conns->pdata[i];
        short events = 0;

        if (!conn->up.eof && hostd_pipe_space(&conn->up) > 0)
            events |= POLLIN;
        if (hostd_pipe_len(&conn->down) > 0)
            events |= POLLOUT;
        carrier_pollfd_add(pfds, conn->fd, events);
    }
    if (poll((struct pollfd *)pfds->data, pfds->len, timeout_ms) <= 0)
        return;
    p = (struct pollfd *)pfds->data;
    if (p[0].revents != 0)
        fwd_drain(c->agent->event_fd);
    if (c->session != NULL && p[1].revents != 0 && ssh_event_dopoll(c->event, 0) == SSH_ERROR &&
        !ssh_is_connected(c->session))
        carrier_lose(c);
}

static gpointer
carrier_thread(gpointer data)
{
    Carrier *c = data;
    HostdSshForward *f = c->f;
    FwdAgent *a = c->agent;

    for (;;) {
        GQueue fresh = G_QUEUE_INIT;
        gboolean stopping;
        gboolean progress = FALSE;
        FwdConn *conn;

        g_mutex_lock(&f->lock);
        fresh = a->incoming;
        g_queue_init(&a->incoming);
        stopping = a->stopping || f->stopping;
        for (guint i = 0; i < c->conns->len; i++) {
            conn = c->conns->pdata[i];
            conn->closing = conn->port->removing;
        }
        /* The decision to end is taken under the lock that a worker handing over a connection
         * holds: either it sees this carrier gone and starts another, or this one sees it. */
        if (g_queue_is_empty(&fresh) && c->conns->len == 0 && c->session == NULL) {
            a->running = FALSE;
            f->carriers--;
            g_cond_broadcast(&f->cond);
            g_mutex_unlock(&f->lock);
            break;
        }
        g_mutex_unlock(&f->lock);

        if (stopping) {
            while ((conn = g_queue_pop_head(&fresh)) != NULL)
                fwd_conn_free(f, conn);
            carrier_release(c);
            continue;
        }
        for (guint i = c->conns->len; i-- > 0;) {
            conn = c->conns->pdata[i];
            if (conn->closing)
                carrier_conn_close(c, g_ptr_array_steal_index_fast(c->conns, i));
        }
        while ((conn = g_queue_pop_head(&fresh)) != NULL) {
            carrier_open(c, conn);
            progress = TRUE;
        }
        if (c->conns->len == 0) {
            carrier_release(c);
            continue;
        }

        for (guint i = c->conns->len; i-- > 0;) {
            conn = c->conns->pdata[i];
            if (!fwd_conn_pump(conn, &progress)) {
                carrier_conn_close(c, g_ptr_array_steal_index_fast(c->conns, i));
                progress = TRUE;
            }
        }
        if (progress) {
            g_mutex_lock(&f->lock);
            a->last_activity = g_get_monotonic_time();
            g_mutex_unlock(&f->lock);
        }
        /* After progress, look again at once: writing to a channel lets libssh read the
         * session's socket, which may leave another channel's bytes buffered inside it. */
        if (c->session != NULL)
            carrier_wait(c, progress ? 0 : CARRIER_POLL_MS);
    }

    fwd_target_free(c->target);
    g_ptr_array_unref(c->conns);
    fwd_agent_unref(a);
    g_free(c);
    return NULL;
}

/* Hands @conn, woken, to its agent's carrier, starting one when none runs. Call with the
 * lock held. */
static void
fwd_carry(HostdSshForward *f, FwdConn *conn)
{
    FwdAgent *a = conn->port->agent;
    Carrier *c;

    g_queue_push_tail(&a->incoming, conn);
    if (a->running) {
        fwd_nudge(a->event_fd);
        return;
    }
    c = g_new0(Carrier, 1);
    c->f = f;
    c->agent = fwd_agent_ref(a);
    c->conns = g_ptr_array_new();
    a->running = TRUE;
    f->carriers++;
    g_thread_unref(g_thread_new("hostd-forward", carrier_thread, c));
}

/* ---- accepting and waking ------------------------------------------------------------------ */

typedef struct {
    HostdSshForward *f;
    FwdAgent *agent;
} FwdActivity;

static void
fwd_note_activity(gpointer data)
{
    FwdActivity *activity = data;

    g_mutex_lock(&activity->f->lock);
    activity->agent->last_activity = g_get_monotonic_time();
    g_mutex_unlock(&activity->f->lock);
}

/* Carries @conn through the pool's delegate (an SSH worker): blocks until it ended, the
 * connection staying among its port's waking ones so that a removal shuts its socket down. */
static void
fwd_delegate(HostdSshForward *f, FwdConn *conn, const HostdSshDelegate *delegate, gpointer data)
{
    FwdPort *p = conn->port;
    FwdActivity activity = {f, p->agent};
    g_autoptr(GError) error = NULL;
    gboolean ok;

    ok = delegate->forward(data, &conn->target->target, p->guest_port, conn->fd, fwd_note_activity,
                           &activity, &error);
    g_mutex_lock(&f->lock);
    p->waking = g_list_remove(p->waking, conn);
    g_mutex_unlock(&f->lock);
    if (!ok)
        fwd_conn_fail(f, conn, "%s", error->message);
    else
        fwd_conn_free(f, conn);
}

static void
fwd_wake_worker(gpointer data, gpointer user_data)
{
    FwdConn *conn = data;
    HostdSshForward *f = user_data;
    FwdPort *p = conn->port;
    FwdAgent *a = p->agent;
    g_autoptr(GError) error = NULL;
    gpointer delegate_data = NULL;
    const HostdSshDelegate *delegate = hostd_ssh_pool_get_delegate(f->pool, &delegate_data);
    gboolean gone;
    gboolean ok = FALSE;

    g_mutex_lock(&f->lock);
    gone = p->removing || a->stopping || f->stopping;
    g_mutex_unlock(&f->lock);
    if (!gone) {
        g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
        HostdSshTarget target = {0};

        ok = f->wake(a->name, f->user_data, &target, keep, &error);
        if (ok)
            conn->target = fwd_target_new(&target);
    }

    g_mutex_lock(&f->lock);
    /* A port removed meanwhile (its agent's rm, which the wake waited for) refuses quietly. */
    gone = p->removing || a->stopping || f->stopping;
    if (ok && !gone && delegate != NULL && delegate->forward != NULL) {
        g_mutex_unlock(&f->lock);
        fwd_delegate(f, conn, delegate, delegate_data);
        return;
    }
    p->waking = g_list_remove(p->waking, conn);
    if (ok && !gone) {
        fwd_carry(f, conn);
        g_mutex_unlock(&f->lock);
        return;
    }
    g_mutex_unlock(&f->lock);
    if (!gone && !ok)
        fwd_conn_fail(f, conn, "connection refused: %s",
                      error != NULL ? error->message : "the agent cannot be woken");
    else
        fwd_conn_free(f, conn);
}

/* A new connection of @p on @fd (its client's port @client_port): counted, and woken by a
 * worker of the pool. Call with the lock held. */
static FwdConn *
fwd_conn_start(HostdSshForward *f, FwdPort *p, int fd, guint client_port)
{
    FwdConn *conn = g_new0(FwdConn, 1);

    conn->port = fwd_port_ref(p);
    conn->fd = fd;
    conn->client_port = client_port;
    p->n_conns++;
    p->agent->n_conns++;
    p->agent->last_activity = g_get_monotonic_time();
    p->waking = g_list_prepend(p->waking, conn);
    /* Unlimited non-exclusive pool: cannot fail, and no wake waits for another. */
    g_thread_pool_push(f->wakers, conn, NULL);
    return conn;
}

/* Accepts what waits on @p's listener. Call with the lock held. */
static void
fwd_accept(HostdSshForward *f, FwdPort *p)
{
    for (;;) {
        struct sockaddr_in peer = {0};
        socklen_t len = sizeof(peer);
        int fd =
            accept4(p->listen_fd, (struct sockaddr *)&peer, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        int one = 1;

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                p->accept_paused_until = g_get_monotonic_time() + ACCEPT_BACKOFF_US;
            /* EAGAIN: drained; ECONNABORTED and the like concern one client only. */
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;
        }
        if (p->agent->n_conns >= HOSTD_SSH_FORWARD_MAX_CONNECTIONS) {
            close(fd);
            continue;
        }
        /* Interactive traffic (a dev server's websocket) sends small packets. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        fwd_conn_start(f, p, fd, ntohs(peer.sin_port));
    }
}

static gpointer
fwd_accept_thread(gpointer data)
{
    HostdSshForward *f = data;
    g_autoptr(GArray) pfds = g_array_new(FALSE, FALSE, sizeof(struct pollfd));
    g_autoptr(GPtrArray) polled = g_ptr_array_new();

    g_mutex_lock(&f->lock);
    while (!f->stopping) {
        struct pollfd pfd = {.fd = f->event_fd, .events = POLLIN};
        gint64 now = g_get_monotonic_time();
        gint64 wake_at = G_MAXINT64;
        GHashTableIter iter;
        gpointer value;
        int timeout = -1;
        int n;

        g_array_set_size(pfds, 0);
        g_ptr_array_set_size(polled, 0);
        g_array_append_val(pfds, pfd);
        g_hash_table_iter_init(&iter, f->ports);
        while (g_hash_table_iter_next(&iter, NULL, &value)) {
            FwdPort *p = value;

            if (p->listen_fd < 0)
                continue; /* hostd_ssh_forward_carry()'s: no listener */
            if (p->accept_paused_until > now) {
                wake_at = MIN(wake_at, p->accept_paused_until);
                continue;
            }
            pfd = (struct pollfd){.fd = p->listen_fd, .events = POLLIN};
            g_array_append_val(pfds, pfd);
            g_ptr_array_add(polled, p);
        }
        /* A port removed before this point is not in the set: its listener may be closed. */
        f->accept_round++;
        g_cond_broadcast(&f->cond);
        if (wake_at != G_MAXINT64)
            timeout = (int)MAX((wake_at - now + 999) / 1000, 1);

        g_mutex_unlock(&f->lock);
        n = poll((struct pollfd *)pfds->data, pfds->len, timeout);
        g_mutex_lock(&f->lock);
        if (n <= 0)
            continue;
        if (g_array_index(pfds, struct pollfd, 0).revents != 0)
            fwd_drain(f->event_fd);
        /* The ports polled are alive: a removal holds its reference until the next round. */
        for (guint i = 0; i < polled->len; i++) {
            FwdPort *p = polled->pdata[i];

            if (g_array_index(pfds, struct pollfd, i + 1).revents != 0 && !p->removing &&
                !f->stopping)
                fwd_accept(f, p);
        }
    }
    g_mutex_unlock(&f->lock);
    return NULL;
}

/* Stops @ports (already out of the table; their references are the caller's): their
 * connections being woken see EOF now and are dropped after their wake, their carriers close
 * the others, and their listeners are closed once the accept thread no longer polls them. Call
 * with the lock held. */
static void
fwd_retire_ports(HostdSshForward *f, GPtrArray *ports)
{
    guint64 round = f->accept_round;

    for (guint i = 0; i < ports->len; i++) {
        FwdPort *p = ports->pdata[i];

        p->removing = TRUE;
        for (GList *l = p->waking; l != NULL; l = l->next)
            shutdown(((FwdConn *)l->data)->fd, SHUT_RDWR);
        fwd_nudge(p->agent->event_fd);
    }
    if (!f->stopping) {
        fwd_nudge(f->event_fd);
        while (f->accept_round == round && !f->stopping)
            g_cond_wait(&f->cond, &f->lock);
    }
    for (guint i = 0; i < ports->len; i++) {
        FwdPort *p = ports->pdata[i];

        if (p->listen_fd >= 0)
            close(p->listen_fd);
        p->listen_fd = -1;
    }
}

/* A new port of @agent in the table (the caller checked there is none), @key taken. Call with
 * the lock held. */
static FwdPort *
fwd_port_add(HostdSshForward *f, char *key, const char *agent, guint guest_port, guint host_port,
             int listen_fd)
{
    FwdAgent *a = g_hash_table_lookup(f->agents, agent);
    FwdPort *p;

    if (a == NULL) {
        a = fwd_agent_new(agent);
        g_hash_table_insert(f->agents, a->name, a);
    }
    p = g_new0(FwdPort, 1);
    p->ref = 1;
    p->agent = fwd_agent_ref(a);
    p->guest_port = guest_port;
    p->host_port = host_port;
    p->listen_fd = listen_fd;
    g_hash_table_insert(f->ports, key, p);
    return p;
}

/* ---- public API ---------------------------------------------------------------------------- */

HostdSshForward *
hostd_ssh_forward_new(HostdSshPool *pool, HostdSshForwardWakeFunc wake, HostdSshForwardLogFunc log,
                      gpointer user_data)
{
    HostdSshForward *f;

    g_return_val_if_fail(pool != NULL && wake != NULL, NULL);

    f = g_new0(HostdSshForward, 1);
    g_mutex_init(&f->lock);
    g_cond_init(&f->cond);
    f->pool = pool;
    f->wake = wake;
    f->log = log;
    f->user_data = user_data;
    f->agents = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, fwd_agent_unref);
    f->ports = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, fwd_port_unref);
    f->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (f->event_fd < 0)
        g_error("eventfd: %s", g_strerror(errno));
    f->wakers = g_thread_pool_new(fwd_wake_worker, f, -1, FALSE, NULL);
    f->accept_thread = g_thread_new("hostd-forward-accept", fwd_accept_thread, f);
    return f;
}

gboolean
hostd_ssh_forward_add(HostdSshForward *f, const char *agent, guint guest_port, guint host_port,
                      GError **error)
{
    g_autofree char *key = NULL;
    g_autoptr(GMutexLocker) locker = NULL;
    int fd = -1;

    g_return_val_if_fail(f != NULL && agent != NULL, FALSE);
    g_return_val_if_fail(guest_port > 0 && guest_port <= 65535, FALSE);
    g_return_val_if_fail(host_port > 0 && host_port <= 65535, FALSE);
    g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

    key = fwd_port_key(agent, guest_port);
    locker = g_mutex_locker_new(&f->lock);
    if (g_hash_table_contains(f->ports, key))
        return vm_throw(error, VM_ERROR_EXISTS, "guest port %u of agent '%s' is forwarded already",
                        guest_port, agent);
    if (!hostd_relay_listen(host_port, &fd, error))
        return FALSE;

    fwd_port_add(f, g_steal_pointer(&key), agent, guest_port, host_port, fd);
    fwd_nudge(f->event_fd);
    return TRUE;
}

gboolean
hostd_ssh_forward_carry(HostdSshForward *f, const char *agent, guint guest_port, int fd,
                        HostdSshForwardDoneFunc done, gpointer done_data, GError **error)
{
    g_autofree char *key = NULL;
    g_autoptr(GMutexLocker) locker = NULL;
    struct sockaddr_in peer = {0};
    socklen_t len = sizeof(peer);
    FwdConn *conn;
    FwdPort *p;

    g_return_val_if_fail(f != NULL && agent != NULL && fd >= 0, FALSE);
    g_return_val_if_fail(guest_port > 0 && guest_port <= 65535, FALSE);

    key = fwd_port_key(agent, guest_port);
    locker = g_mutex_locker_new(&f->lock);
    p = g_hash_table_lookup(f->ports, key);
    if (p == NULL)
        p = fwd_port_add(f, g_steal_pointer(&key), agent, guest_port, 0, -1);
    if (p->agent->n_conns >= HOSTD_SSH_FORWARD_MAX_CONNECTIONS) {
        close(fd);
        return vm_throw(error, VM_ERROR_NO_RESOURCES,
                        "agent '%s' holds %u forwarded connections already", agent,
                        HOSTD_SSH_FORWARD_MAX_CONNECTIONS);
    }
    if (getpeername(fd, (struct sockaddr *)&peer, &len) < 0 || peer.sin_family != AF_INET)
        peer.sin_port = 0;
    conn = fwd_conn_start(f, p, fd, ntohs(peer.sin_port));
    conn->done = done;
    conn->done_data = done_data;
    return TRUE;
}

void
hostd_ssh_forward_remove(HostdSshForward *f, const char *agent, guint guest_port)
{
    g_autofree char *key = NULL;
    g_autofree char *stored_key = NULL;
    g_autoptr(GPtrArray) ports = g_ptr_array_new_with_free_func(fwd_port_unref);
    gpointer port = NULL;

    g_return_if_fail(f != NULL && agent != NULL);

    key = fwd_port_key(agent, guest_port);
    g_mutex_lock(&f->lock);
    if (g_hash_table_steal_extended(f->ports, key, (gpointer *)&stored_key, &port)) {
        g_ptr_array_add(ports, port);
        fwd_retire_ports(f, ports);
    }
    g_mutex_unlock(&f->lock);
}

void
hostd_ssh_forward_remove_agent(HostdSshForward *f, const char *agent)
{
    g_autoptr(GPtrArray) ports = g_ptr_array_new_with_free_func(fwd_port_unref);
    GHashTableIter iter;
    gpointer value;
    FwdAgent *a = NULL;

    g_return_if_fail(f != NULL && agent != NULL);

    g_mutex_lock(&f->lock);
    g_hash_table_iter_init(&iter, f->ports);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        FwdPort *p = value;

        if (g_str_equal(p->agent->name, agent)) {
            g_ptr_array_add(ports, fwd_port_ref(p));
            g_hash_table_iter_remove(&iter);
        }
    }
    if (ports->len > 0)
        fwd_retire_ports(f, ports);
    if (g_hash_table_steal_extended(f->agents, agent, NULL, (gpointer *)&a)) {
        a->stopping = TRUE;
        fwd_nudge(a->event_fd);
    }
    g_mutex_unlock(&f->lock);
    fwd_agent_unref(a);
}

gboolean
hostd_ssh_forward_lookup(HostdSshForward *f, const char *agent, guint guest_port,
                         guint *ret_connections)
{
    g_autofree char *key = NULL;
    FwdPort *p;
    guint n = 0;

    g_return_val_if_fail(f != NULL && agent != NULL, FALSE);

    key = fwd_port_key(agent, guest_port);
    g_mutex_lock(&f->lock);
    p = g_hash_table_lookup(f->ports, key);
    if (p != NULL)
        n = p->n_conns;
    g_mutex_unlock(&f->lock);
    if (ret_connections != NULL)
        *ret_connections = n;
    return p != NULL;
}

guint
hostd_ssh_forward_open_connections(HostdSshForward *f, const char *agent)
{
    FwdAgent *a;
    guint n = 0;

    g_return_val_if_fail(f != NULL && agent != NULL, 0);

    g_mutex_lock(&f->lock);
    a = g_hash_table_lookup(f->agents, agent);
    if (a != NULL)
        n = a->n_conns;
    g_mutex_unlock(&f->lock);
    return n;
}

gint64
hostd_ssh_forward_last_activity(HostdSshForward *f, const char *agent)
{
    FwdAgent *a;
    gint64 t = 0;

    g_return_val_if_fail(f != NULL && agent != NULL, 0);

    g_mutex_lock(&f->lock);
    a = g_hash_table_lookup(f->agents, agent);
    if (a != NULL)
        t = a->last_activity;
    g_mutex_unlock(&f->lock);
    return t;
}

void
hostd_ssh_forward_free(HostdSshForward *f)
{
    GHashTableIter iter;
    gpointer value;

    if (f == NULL)
        return;

    g_mutex_lock(&f->lock);
    f->stopping = TRUE;
    fwd_nudge(f->event_fd);
    g_hash_table_iter_init(&iter, f->agents);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        FwdAgent *a = value;

        a->stopping = TRUE;
        fwd_nudge(a->event_fd);
    }
    g_hash_table_iter_init(&iter, f->ports);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        for (GList *l = ((FwdPort *)value)->waking; l != NULL; l = l->next)
            shutdown(((FwdConn *)l->data)->fd, SHUT_RDWR);
    }
    g_mutex_unlock(&f->lock);
    g_thread_join(f->accept_thread);

    /* Wakes still running finish (the callback cannot be interrupted); their connections, and
     * those queued behind them, are dropped since everything is stopping. Then no carrier can
     * start any more, and those running end. */
    g_thread_pool_free(f->wakers, FALSE, TRUE);
    g_mutex_lock(&f->lock);
    while (f->carriers > 0)
        g_cond_wait(&f->cond, &f->lock);
    g_mutex_unlock(&f->lock);

    g_hash_table_iter_init(&iter, f->ports);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        FwdPort *p = value;

        if (p->listen_fd >= 0)
            close(p->listen_fd);
        p->listen_fd = -1;
    }
    g_hash_table_destroy(f->ports);
    g_hash_table_destroy(f->agents);
    close(f->event_fd);
    g_cond_clear(&f->cond);
    g_mutex_clear(&f->lock);
    g_free(f);
}
