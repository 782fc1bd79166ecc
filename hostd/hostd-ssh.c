/* SSH from hostd to agents (libssh): readiness, pooled sessions, exec relay. */
#include "hostd-ssh-private.h"

#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include <libssh/libssh.h>
#include <libssh/callbacks.h>

#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-stream.h"

#include "hostd-cleanup.h"

#define POOL_IDLE_MAX 2 /* idle sessions kept per agent */
/* Handshakes under way to one agent at once: the guest's sshd drops unauthenticated
 * connections past its MaxStartups (10 by default) at random, so many concurrent execs queue
 * for a slot instead of failing. */
#define POOL_CONNECTING_MAX 4
/* An exec waits for a slot as long as handshakes to the agent keep ending, at most
 * POOL_CONNECTING_IDLE_S without one ending (a guest that stopped answering) and
 * POOL_CONNECTING_WAIT_S in all: a slow guest with many execs queued is slow, not broken. */
#define POOL_CONNECTING_IDLE_S  120
#define POOL_CONNECTING_WAIT_S  600
#define EXEC_CONNECT_ATTEMPTS   3  /* a fresh connection for an exec dropped early is retried */
#define READY_ATTEMPT_TIMEOUT_S 5  /* one readiness attempt: TCP connect, banner, kex, auth */
#define EXEC_CONNECT_TIMEOUT_S  15 /* a fresh connection for an exec, guest already up */
#define SESSION_TIMEOUT_S       30 /* blocking calls on an established session */
/* A guest's sshd that is not there yet is tried again after 100 ms, then twice as long each
 * time up to a second: one that a restore or an identity step just started answers within a
 * fraction of a second, and a booting one is not asked more than once a second. */
#define READY_RETRY_FIRST_USEC (100 * 1000)
#define READY_RETRY_USEC       G_USEC_PER_SEC
#define RELAY_POLL_MS          50
#define RELAY_BURST_CHUNKS     16 /* output chunks per stream before looking at the client */
#define STDIN_PENDING_MAX      (4 * VM_STREAM_CHUNK_MAX)

/* Spares: a shell the agent's sshd started on a pooled session before any exec asked for it,
 * waiting for its command on stdin. An exec that finds one skips the channel open, the exec
 * request and sshd's work for a new session (its fork, the login shell's start): those ran
 * while nobody waited, right after the exec before it. The spare says it is ready with
 * SPARE_READY on stdout, then reads the command up to a NUL byte, a byte at a time as bash reads
 * a pipe, so what follows is the command's stdin; and it runs it in that same shell with eval.
 * The command is what an exec request would carry, with the last program run by exec where
 * `bash -c` can run it that way (spare_append_argv()): the same program, arguments,
 * environment, stdin, output, exit status and signals as an exec request's `bash -c`. (That
 * bash execs its last program or forks for it depending on what precedes it, and after a fork
 * adds a "Terminated" line when the program is killed; a spare always execs it. The shell's
 * start-up files ran when the spare started, after the exec before.) A login shell
 * that is not bash never says ready: then the agent's execs go the ordinary way. Terminals,
 * and commands over SPARE_COMMAND_MAX, always do. */
#define SPARE_READY_WORD "vmctl-spare-ready"
#define SPARE_READY      SPARE_READY_WORD "\n"
#define SPARE_SCRIPT                                                                               \
    "[ -n \"${BASH_VERSION-}\" ] && printf '" SPARE_READY_WORD "\\n' && "                          \
    "IFS= read -r -d '' __vmctl_command && "                                                       \
    "eval \"unset __vmctl_command; SECONDS=0; $__vmctl_command\""
#define SPARE_COMMAND_MAX 4096 /* bytes; read a byte at a time by the spare */
#define SPARE_NOISE_MAX   4096 /* output of the login shell's start-up files, before SPARE_READY */

/* The one translator from libssh errors: "@fmt: <libssh's last error>" in VM_ERROR_SSH. */
static gboolean G_GNUC_PRINTF(3, 4)
    ssh_throw(GError **error, ssh_session session, const char *fmt, ...)
{
    g_autofree char *what = NULL;
    const char *reason = session != NULL ? ssh_get_error(session) : NULL;
    va_list ap;

    va_start(ap, fmt);
    what = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (reason == NULL || *reason == '\0')
        reason = "unknown libssh error";
    return vm_throw(error, VM_ERROR_SSH, "%s: %s", what, reason);
}

/* ---- Pool ---------------------------------------------------------------------------------- */

/* An idle session and the spare shell waiting on it (see "Spares" below). */
typedef struct {
    ssh_session session;
    ssh_channel spare; /* or NULL */
} PooledSession;

typedef struct {
    GQueue idle;        /* PooledSession *, most recently used first */
    ssh_session held;   /* the session over the virtio port (hostd_ssh_pool_hold()), or NULL */
    guint64 generation; /* sessions taken under another generation are not taken back */
    guint refilling;    /* sessions out only while they get a spare: back within a round trip */
    gboolean spares_refused; /* a spare never said it was ready: the login shell is not bash */
} PoolEntry;

struct HostdSshPool {
    GMutex lock;
    GCond slot_freed;
    GCond session_returned; /* an idle session was put back, or a refill ended */
    GHashTable *entries;    /* agent -> PoolEntry */
    GHashTable *connecting; /* agent -> handshakes under way (GUINT_TO_POINTER); not forgotten */
    GHashTable *handshakes_ended; /* agent -> how many ended (GUINT_TO_POINTER): progress */
    guint64 last_generation;
    gint connections_opened;
    gint spares_used;
    const char *spare_script;         /* SPARE_SCRIPT, or a test's */
    const HostdSshDelegate *delegate; /* or NULL: waits and execs run here */
    gpointer delegate_data;
    HostdSshConnectFunc connect; /* or NULL: libssh connects */
    gpointer connect_data;
};

static void
pooled_session_free(PooledSession *pooled)
{
    /* The spare's channel goes with its session. */
    hostd_ssh_session_close(pooled->session);
    g_free(pooled);
}

static void
pool_entry_free(gpointer data)
{
    PoolEntry *entry = data;
    PooledSession *pooled;

    while ((pooled = g_queue_pop_head(&entry->idle)) != NULL)
        pooled_session_free(pooled);
    g_free(entry);
}

HostdSshPool *
hostd_ssh_pool_new(void)
{
    static gsize initialized;
    HostdSshPool *pool;

    if (g_once_init_enter(&initialized)) {
        ssh_init();
        g_once_init_leave(&initialized, 1);
    }

    pool = g_new0(HostdSshPool, 1);
    g_mutex_init(&pool->lock);
    pool->entries = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, pool_entry_free);
    pool->connecting = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    pool->handshakes_ended = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_cond_init(&pool->slot_freed);
    g_cond_init(&pool->session_returned);
    pool->spare_script = SPARE_SCRIPT;
    return pool;
}

void
hostd_ssh_pool_free(HostdSshPool *pool)
{
    if (pool == NULL)
        return;
    g_hash_table_unref(pool->entries);
    g_hash_table_unref(pool->connecting);
    g_hash_table_unref(pool->handshakes_ended);
    g_cond_clear(&pool->slot_freed);
    g_cond_clear(&pool->session_returned);
    g_mutex_clear(&pool->lock);
    g_free(pool);
}

/* Call with the lock held. */
static PoolEntry *
pool_ensure_entry(HostdSshPool *pool, const char *agent)
{
    PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);

    if (entry == NULL) {
        entry = g_new0(PoolEntry, 1);
        g_queue_init(&entry->idle);
        entry->generation = ++pool->last_generation;
        g_hash_table_insert(pool->entries, g_strdup(agent), entry);
    }
    return entry;
}

static guint64
pool_get_generation(HostdSshPool *pool, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);

    return pool_ensure_entry(pool, agent)->generation;
}

/* The idle session an exec takes: the most recently used one not held over the virtio port
 * (TCP, a shorter path in the guest), else the held one (after a saved wake it is the only
 * one); NULL when none is idle. Call with the lock held. */
static PooledSession *
pool_pop_preferred(PoolEntry *entry)
{
    for (GList *l = entry->idle.head; l != NULL; l = l->next) {
        PooledSession *pooled = l->data;

        if (pooled->session != entry->held) {
            g_queue_delete_link(&entry->idle, l);
            return pooled;
        }
    }
    return g_queue_pop_head(&entry->idle);
}

/* @session, about to be closed, is no longer @agent's held one. */
static void
pool_unhold(HostdSshPool *pool, const char *agent, ssh_session session)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);

    if (entry != NULL && entry->held == session)
        entry->held = NULL;
}

/* Takes an idle session of @agent that still looks connected, and its spare (or NULL) in
 * *@ret_spare; NULL when there is none. A session of @agent out only for its spare is waited
 * for: it is back within a round trip or two, a new connection takes a handshake. */
static ssh_session
pool_take(HostdSshPool *pool, const char *agent, guint64 *ret_generation, ssh_channel *ret_spare)
{
    gint64 deadline = g_get_monotonic_time() + SESSION_TIMEOUT_S * G_USEC_PER_SEC;

    for (;;) {
        PooledSession *pooled;

        g_mutex_lock(&pool->lock);
        PoolEntry *entry = pool_ensure_entry(pool, agent);
        while (g_queue_is_empty(&entry->idle) && entry->refilling > 0 &&
               g_cond_wait_until(&pool->session_returned, &pool->lock, deadline))
            entry = pool_ensure_entry(pool, agent); /* it may have been forgotten meanwhile */
        *ret_generation = entry->generation;
        pooled = pool_pop_preferred(entry);
        g_mutex_unlock(&pool->lock);

        *ret_spare = NULL;
        if (pooled == NULL)
            return NULL;
        ssh_session session = pooled->session;
        ssh_channel spare = pooled->spare;
        g_free(pooled);
        if (ssh_is_connected(session)) {
            *ret_spare = spare;
            return session;
        }
        pool_unhold(pool, agent, session);
        hostd_ssh_session_close(session);
    }
}

/* Gives @session (with @spare, or NULL) back to the pool, or closes it when it is dead, surplus,
 * or belongs to sessions forgotten since it was taken (e.g. the agent's port changed
 * meanwhile). @refilled: it was out for its spare since pool_refill_begin(). */
static void
pool_put(HostdSshPool *pool, const char *agent, guint64 generation, ssh_session session,
         ssh_channel spare, gboolean refilled)
{
    ssh_session surplus = session;

    {
        g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
        PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);
        gboolean current = entry != NULL && entry->generation == generation;

        if (current && refilled && entry->refilling > 0)
            entry->refilling--;
        /* The held session is kept whatever else is idle: it outlives a save, the others not. */
        if (current && ssh_is_connected(session) &&
            (session == entry->held || g_queue_get_length(&entry->idle) < POOL_IDLE_MAX)) {
            PooledSession *pooled = g_new0(PooledSession, 1);

            pooled->session = session;
            pooled->spare = spare;
            g_queue_push_head(&entry->idle, pooled);
            surplus = NULL;
        } else if (entry != NULL && entry->held == session) {
            entry->held = NULL;
        }
        g_cond_broadcast(&pool->session_returned);
    }
    /* Outside the lock: a disconnect writes to the network. */
    hostd_ssh_session_close(surplus);
}

/* Whether a session of @agent's @generation, about to be given back, should get a spare first;
 * when TRUE, pool_take() waits for it until pool_put(..., TRUE). FALSE when the pool would not
 * keep it or the agent's shell refused spares. */
static gboolean
pool_refill_begin(HostdSshPool *pool, const char *agent, guint64 generation, ssh_session session)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);

    if (entry == NULL || entry->generation != generation || entry->spares_refused ||
        (session != entry->held &&
         g_queue_get_length(&entry->idle) + entry->refilling >= POOL_IDLE_MAX))
        return FALSE;
    entry->refilling++;
    return TRUE;
}

/* No more spares for @agent's @generation: its login shell did not run the spare script. */
static void
pool_refuse_spares(HostdSshPool *pool, const char *agent, guint64 generation)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);

    if (entry != NULL && entry->generation == generation)
        entry->spares_refused = TRUE;
}

void
hostd_ssh_pool_set_connect(HostdSshPool *pool, HostdSshConnectFunc connect, gpointer data)
{
    pool->connect = connect;
    pool->connect_data = data;
}

void
hostd_ssh_pool_set_delegate(HostdSshPool *pool, const HostdSshDelegate *delegate, gpointer data)
{
    pool->delegate = delegate;
    pool->delegate_data = data;
}

const HostdSshDelegate *
hostd_ssh_pool_get_delegate(HostdSshPool *pool, gpointer *ret_data)
{
    *ret_data = pool->delegate_data;
    return pool->delegate;
}

void
hostd_ssh_pool_forget(HostdSshPool *pool, const char *agent)
{
    gpointer key = NULL;
    gpointer entry = NULL;
    gboolean found;

    g_return_if_fail(pool != NULL && agent != NULL);

    if (pool->delegate != NULL)
        pool->delegate->forget(pool->delegate_data, agent);

    g_mutex_lock(&pool->lock);
    found = g_hash_table_steal_extended(pool->entries, agent, &key, &entry);
    /* Waiters for a refill look again: it will not come back to them. */
    g_cond_broadcast(&pool->session_returned);
    g_mutex_unlock(&pool->lock);
    if (found) {
        g_free(key);
        pool_entry_free(entry);
    }
}

guint
hostd_ssh_pool_get_connections_opened(HostdSshPool *pool)
{
    return (guint)g_atomic_int_get(&pool->connections_opened);
}

guint
hostd_ssh_pool_get_spares_used(HostdSshPool *pool)
{
    return (guint)g_atomic_int_get(&pool->spares_used);
}

guint
hostd_ssh_pool_get_spare_count(HostdSshPool *pool, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);
    guint n = 0;

    for (GList *l = entry != NULL ? entry->idle.head : NULL; l != NULL; l = l->next)
        n += ((PooledSession *)l->data)->spare != NULL;
    return n;
}

void
hostd_ssh_pool_set_spare_script(HostdSshPool *pool, const char *script)
{
    pool->spare_script = script;
}

guint
hostd_ssh_pool_get_idle_count(HostdSshPool *pool, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);

    return entry != NULL ? g_queue_get_length(&entry->idle) : 0;
}

/* Waits for one of @agent's POOL_CONNECTING_MAX handshake slots; FALSE when none came free and
 * no handshake to the agent ended for POOL_CONNECTING_IDLE_S, or after POOL_CONNECTING_WAIT_S. */
static gboolean
pool_slot_take(HostdSshPool *pool, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    gint64 now = g_get_monotonic_time();
    gint64 give_up = now + POOL_CONNECTING_WAIT_S * G_USEC_PER_SEC;
    gint64 deadline = now + POOL_CONNECTING_IDLE_S * G_USEC_PER_SEC;
    gpointer ended = g_hash_table_lookup(pool->handshakes_ended, agent);

    while (GPOINTER_TO_UINT(g_hash_table_lookup(pool->connecting, agent)) >= POOL_CONNECTING_MAX) {
        if (!g_cond_wait_until(&pool->slot_freed, &pool->lock, MIN(deadline, give_up)))
            return FALSE;
        gpointer now_ended = g_hash_table_lookup(pool->handshakes_ended, agent);
        if (now_ended != ended) {
            ended = now_ended;
            deadline = g_get_monotonic_time() + POOL_CONNECTING_IDLE_S * G_USEC_PER_SEC;
        }
    }
    guint n = GPOINTER_TO_UINT(g_hash_table_lookup(pool->connecting, agent));
    g_hash_table_insert(pool->connecting, g_strdup(agent), GUINT_TO_POINTER(n + 1));
    return TRUE;
}

static void
pool_slot_give(HostdSshPool *pool, const char *agent)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
    guint n = GPOINTER_TO_UINT(g_hash_table_lookup(pool->connecting, agent));

    guint ended = GPOINTER_TO_UINT(g_hash_table_lookup(pool->handshakes_ended, agent));

    if (n <= 1)
        g_hash_table_remove(pool->connecting, agent);
    else
        g_hash_table_insert(pool->connecting, g_strdup(agent), GUINT_TO_POINTER(n - 1));
    /* Wraps after 2^32 handshakes: only a change is looked at. */
    g_hash_table_insert(pool->handshakes_ended, g_strdup(agent), GUINT_TO_POINTER(ended + 1));
    g_cond_broadcast(&pool->slot_freed);
}

/* ---- Connecting ---------------------------------------------------------------------------- */

typedef enum {
    CONNECT_OK,
    CONNECT_RETRY, /* the guest may not be up yet */
    CONNECT_FATAL, /* retrying cannot help */
} ConnectResult;

/* The guest's host key against @pinned ("ssh-ed25519 BASE64", the key part of the known_hosts
 * line hostd wrote): the answer ssh_session_is_known_server() gives for a known_hosts file. */
static enum ssh_known_hosts_e
host_key_check(ssh_session session, const char *pinned)
{
    g_auto(GStrv) fields = g_strsplit(pinned, " ", 3);
    g_autoptr(HostdSshKey) want = NULL;
    g_autoptr(HostdSshKey) got = NULL;

    if (g_strv_length(fields) < 2 ||
        ssh_pki_import_pubkey_base64(fields[1], ssh_key_type_from_name(fields[0]), &want) != SSH_OK)
        return SSH_KNOWN_HOSTS_UNKNOWN;
    if (ssh_get_server_publickey(session, &got) != SSH_OK)
        return SSH_KNOWN_HOSTS_ERROR;
    return ssh_key_cmp(got, want, SSH_KEY_CMP_PUBLIC) == 0 ? SSH_KNOWN_HOSTS_OK
                                                           : SSH_KNOWN_HOSTS_CHANGED;
}

/* A session to @target over TCP, or over @fd (taken over) when it is not -1. */
static ConnectResult
session_connect(HostdSshPool *pool, const HostdSshTarget *target, long timeout_s, int fd,
                ssh_session *ret_session, GError **error)
{
    g_autoptr(HostdSshSession) session = ssh_new();
    g_autoptr(HostdSshKey) key = NULL;
    unsigned int port = target->port;
    long session_timeout = SESSION_TIMEOUT_S;
    bool process_config = false;
    int nodelay = 1;
    int rc;

    if (session == NULL) {
        if (fd >= 0)
            close(fd);
        vm_throw(error, VM_ERROR_SSH, "cannot allocate an SSH session");
        return CONNECT_FATAL;
    }
    /* libssh closes it from here on. */
    if (fd >= 0 && ssh_options_set(session, SSH_OPTIONS_FD, &fd) < 0) {
        close(fd);
        ssh_throw(error, session, "cannot set SSH options for agent '%s'", target->agent);
        return CONNECT_FATAL;
    }
    if (ssh_options_set(session, SSH_OPTIONS_PROCESS_CONFIG, &process_config) < 0 ||
        ssh_options_set(session, SSH_OPTIONS_HOST, target->host) < 0 ||
        ssh_options_set(session, SSH_OPTIONS_PORT, &port) < 0 ||
        ssh_options_set(session, SSH_OPTIONS_USER, target->user) < 0 ||
        ssh_options_set(session, SSH_OPTIONS_KNOWNHOSTS,
                        target->host_key != NULL ? "/dev/null" : target->known_hosts_path) < 0 ||
        ssh_options_set(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null") < 0 ||
        ssh_options_set(session, SSH_OPTIONS_HOSTKEYS, "ssh-ed25519") < 0 ||
        ssh_options_set(session, SSH_OPTIONS_COMPRESSION, "no") < 0 ||
        ssh_options_set(session, SSH_OPTIONS_NODELAY, &nodelay) < 0 ||
        /* Bounds the whole of ssh_connect(): the forwarded port accepts TCP long before the
         * guest's sshd sends a banner. */
        ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &timeout_s) < 0) {
        ssh_throw(error, session, "cannot set SSH options for agent '%s'", target->agent);
        return CONNECT_FATAL;
    }

    /* A bad key is a local problem: find it before touching the network. */
    if (target->identity_pem != NULL
            ? ssh_pki_import_privkey_base64(target->identity_pem, NULL, NULL, NULL, &key) != SSH_OK
            : ssh_pki_import_privkey_file(target->identity_path, NULL, NULL, NULL, &key) !=
                  SSH_OK) {
        vm_throw(error, VM_ERROR_SSH, "cannot read the SSH key of agent '%s'%s%s", target->agent,
                 target->identity_pem != NULL ? "" : " from ",
                 target->identity_pem != NULL ? "" : target->identity_path);
        return CONNECT_FATAL;
    }

    if (fd < 0 && pool->connect != NULL) {
        g_autoptr(GError) local_error = NULL;

        fd = pool->connect(pool->connect_data, target, &local_error);
        if (fd < 0) {
            vm_throw(error, VM_ERROR_SSH, "cannot connect to agent '%s' at %s:%u: %s",
                     target->agent, target->host, target->port, local_error->message);
            return CONNECT_RETRY;
        }
        if (ssh_options_set(session, SSH_OPTIONS_FD, &fd) < 0) {
            close(fd);
            ssh_throw(error, session, "cannot set SSH options for agent '%s'", target->agent);
            return CONNECT_FATAL;
        }
    }
    if (ssh_connect(session) != SSH_OK) {
        ssh_throw(error, session, "cannot connect to agent '%s' at %s:%u", target->agent,
                  target->host, target->port);
        return CONNECT_RETRY;
    }
    g_atomic_int_inc(&pool->connections_opened);

    switch (target->host_key != NULL ? host_key_check(session, target->host_key)
                                     : ssh_session_is_known_server(session)) {
    case SSH_KNOWN_HOSTS_OK:
        break;
    case SSH_KNOWN_HOSTS_CHANGED:
    case SSH_KNOWN_HOSTS_OTHER:
        vm_throw(error, VM_ERROR_SSH, "host key of %s does not match the key hostd pinned",
                 target->agent);
        return CONNECT_FATAL;
    case SSH_KNOWN_HOSTS_UNKNOWN:
    case SSH_KNOWN_HOSTS_NOT_FOUND:
        vm_throw(error, VM_ERROR_SSH, "no host key of %s pinned in %s", target->agent,
                 target->host_key != NULL ? "the worker's start message"
                                          : target->known_hosts_path);
        return CONNECT_FATAL;
    case SSH_KNOWN_HOSTS_ERROR:
    default:
        ssh_throw(error, session, "cannot check the host key of %s", target->agent);
        return CONNECT_FATAL;
    }

    rc = ssh_userauth_publickey(session, NULL, key);
    if (rc == SSH_AUTH_ERROR) {
        ssh_throw(error, session, "authentication to agent '%s' failed", target->agent);
        return CONNECT_RETRY;
    }
    if (rc != SSH_AUTH_SUCCESS) {
        /* Early in a first boot cloud-init may not have installed the key yet. */
        vm_throw(error, VM_ERROR_SSH, "agent '%s' refused the key %s for user '%s'", target->agent,
                 target->identity_pem != NULL ? "of hostd" : target->identity_path, target->user);
        return CONNECT_RETRY;
    }

    if (ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &session_timeout) < 0) {
        ssh_throw(error, session, "cannot set SSH options for agent '%s'", target->agent);
        return CONNECT_FATAL;
    }
    *ret_session = g_steal_pointer(&session);
    return CONNECT_OK;
}

static void
sleep_cancellable(GCancellable *cancellable, gint64 usec)
{
    GPollFD pollfd;

    if (usec <= 0)
        return;
    if (cancellable != NULL && g_cancellable_make_pollfd(cancellable, &pollfd)) {
        g_poll(&pollfd, 1, (int)((usec + 999) / 1000));
        g_cancellable_release_fd(cancellable);
    } else {
        g_usleep((gulong)usec);
    }
}

/* ---- Spares (see SPARE_SCRIPT) ------------------------------------------------------------- */

/* Starts a spare on @session: NULL when the session could not, never an error (the next exec
 * then goes the ordinary way, and finds out whether the session still works). */
static ssh_channel
spare_start(HostdSshPool *pool, ssh_session session)
{
    ssh_channel channel = ssh_channel_new(session);

    if (channel == NULL)
        return NULL;
    if (ssh_channel_open_session(channel) != SSH_OK ||
        ssh_channel_request_exec(channel, pool->spare_script) != SSH_OK) {
        ssh_channel_free(channel);
        return NULL;
    }
    return channel;
}

typedef enum {
    SPARE_OK,      /* ready: the command goes to it */
    SPARE_REFUSED, /* it exited without saying it was ready: the login shell is not bash */
    SPARE_UNUSED,  /* no answer in time, too much before it, or ended since: the ordinary way */
    SPARE_LOST,    /* the connection is gone */
} SpareClaim;

/* Waits for @spare's SPARE_READY, SESSION_TIMEOUT_S in all however the guest trickles its
 * bytes. What the shell's start-up files printed before it is dropped: `bash -c` runs them
 * again for the command, whose output they are part of. */
static SpareClaim
spare_claim(ssh_session session, ssh_channel spare)
{
    const gsize ready_len = strlen(SPARE_READY);
    const gint64 deadline = g_get_monotonic_time() + SESSION_TIMEOUT_S * G_USEC_PER_SEC;
    g_autoptr(GByteArray) seen = g_byte_array_new();
    char buf[512];

    for (;;) {
        if (seen->len >= ready_len && memmem(seen->data, seen->len, SPARE_READY, ready_len)) {
            /* It said ready, maybe long ago: a spare killed since (the agent's pkill, the OOM
             * killer) has its end in the packets that came meanwhile, and would take the
             * command with it. */
            if (ssh_channel_poll_timeout(spare, 0, 0) == SSH_ERROR)
                return ssh_is_connected(session) ? SPARE_UNUSED : SPARE_LOST;
            if (ssh_channel_is_eof(spare) || ssh_channel_is_closed(spare))
                return SPARE_UNUSED;
            return SPARE_OK; /* nothing follows it: the spare waits for its command */
        }
        gint64 left_ms = (deadline - g_get_monotonic_time()) / 1000;
        if (seen->len > SPARE_NOISE_MAX || left_ms <= 0)
            return SPARE_UNUSED;
        int n = ssh_channel_read_timeout(spare, buf, sizeof(buf), 0, (int)left_ms);
        if (n > 0) {
            g_byte_array_append(seen, (const guint8 *)buf, (guint)n);
            continue;
        }
        if (!ssh_is_connected(session))
            return SPARE_LOST;
        /* Ended by itself without saying ready: not bash. Killed (no exit status, a signal):
         * that says nothing of the shell. */
        if (n == 0 && ssh_channel_is_eof(spare) && ssh_channel_get_exit_status(spare) >= 0)
            return SPARE_REFUSED;
        return SPARE_UNUSED;
    }
}

gboolean
hostd_ssh_wait_ready(HostdSshPool *pool, const HostdSshTarget *target, guint timeout_s,
                     GCancellable *cancellable, GError **error)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_s * G_USEC_PER_SEC;
    g_autoptr(GError) last_error = NULL;
    guint64 generation;

    g_return_val_if_fail(pool != NULL && target != NULL, FALSE);
    if (pool->delegate != NULL)
        return pool->delegate->wait_ready(pool->delegate_data, target, timeout_s, cancellable,
                                          error);
    g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

    generation = pool_get_generation(pool, target->agent);
    for (gint64 retry = READY_RETRY_FIRST_USEC;; retry = MIN(retry * 2, READY_RETRY_USEC)) {
        ssh_session session = NULL;
        gint64 remaining = deadline - g_get_monotonic_time();
        long attempt_s;

        if (g_cancellable_is_cancelled(cancellable))
            return vm_throw(error, VM_ERROR_CANCELLED, "waiting for SSH on agent '%s' cancelled",
                            target->agent);
        if (remaining <= 0)
            break;

        attempt_s = (long)CLAMP((remaining + G_USEC_PER_SEC - 1) / G_USEC_PER_SEC, 1,
                                READY_ATTEMPT_TIMEOUT_S);
        g_clear_error(&last_error);
        switch (session_connect(pool, target, attempt_s, -1, &session, &last_error)) {
        case CONNECT_OK:
            /* The agent's first exec finds its spare ready, as later ones do. */
            pool_put(pool, target->agent, generation, session, spare_start(pool, session), FALSE);
            return TRUE;
        case CONNECT_FATAL:
            g_propagate_error(error, g_steal_pointer(&last_error));
            return FALSE;
        case CONNECT_RETRY:
        default:
            break;
        }
        sleep_cancellable(cancellable, MIN(retry, deadline - g_get_monotonic_time()));
    }
    return vm_throw(error, VM_ERROR_TIMEOUT, "agent '%s' did not answer on SSH within %u s%s%s",
                    target->agent, timeout_s, last_error != NULL ? ": " : "",
                    last_error != NULL ? last_error->message : "");
}

gboolean
hostd_ssh_pool_hold(HostdSshPool *pool, const HostdSshTarget *target, int fd, guint timeout_s,
                    GError **error)
{
    ssh_session session = NULL;
    guint64 generation = pool_get_generation(pool, target->agent);

    if (session_connect(pool, target, (long)timeout_s, fd, &session, error) != CONNECT_OK)
        return FALSE;
    {
        g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
        PoolEntry *entry = pool_ensure_entry(pool, target->agent);

        if (entry->generation == generation)
            entry->held = session;
    }
    pool_put(pool, target->agent, generation, session, spare_start(pool, session), FALSE);
    return TRUE;
}

void
hostd_ssh_pool_sleep(HostdSshPool *pool, const char *agent)
{
    GQueue dropped = G_QUEUE_INIT;
    PooledSession *pooled;

    g_return_if_fail(pool != NULL && agent != NULL);
    if (pool->delegate != NULL) {
        if (pool->delegate->sleep != NULL)
            pool->delegate->sleep(pool->delegate_data, agent);
        else
            pool->delegate->forget(pool->delegate_data, agent);
        return;
    }
    {
        g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&pool->lock);
        PoolEntry *entry = g_hash_table_lookup(pool->entries, agent);
        gint64 deadline = g_get_monotonic_time() + SESSION_TIMEOUT_S * G_USEC_PER_SEC;

        /* A spare on its way is a conversation with the guest, which must end before the QEMU
         * does: what is sent to a QEMU that exits is lost, and the held session with it. */
        while (entry != NULL && entry->held != NULL && entry->refilling > 0 &&
               g_cond_wait_until(&pool->session_returned, &pool->lock, deadline))
            entry = g_hash_table_lookup(pool->entries, agent);
        if (entry == NULL)
            return;
        for (GList *l = entry->idle.head; l != NULL;) {
            GList *next = l->next;

            if (((PooledSession *)l->data)->session != entry->held) {
                g_queue_push_tail(&dropped, l->data);
                g_queue_delete_link(&entry->idle, l);
            }
            l = next;
        }
        /* Sessions out now are not taken back: their connections end with the QEMU. */
        if (entry->held == NULL) {
            entry->generation = ++pool->last_generation;
            entry->spares_refused = FALSE;
        }
    }
    while ((pooled = g_queue_pop_head(&dropped)) != NULL)
        pooled_session_free(pooled);
}

gboolean
hostd_ssh_pool_serial(HostdSshPool *pool, const HostdSshTarget *target, int fd, gboolean resume,
                      GError **error)
{
    g_return_val_if_fail(pool != NULL && target != NULL && fd >= 0, FALSE);
    if (pool->delegate == NULL || pool->delegate->serial == NULL) {
        close(fd);
        return vm_throw(error, VM_ERROR_SSH, "a session over the virtio port needs the SSH worker");
    }
    return pool->delegate->serial(pool->delegate_data, target, fd, resume, error);
}

/* ---- Commands ------------------------------------------------------------------------------ */

static gboolean
shell_word_is_safe(const char *word, gboolean first)
{
    if (*word == '\0')
        return FALSE;
    for (const char *p = word; *p != '\0'; p++) {
        if (!g_ascii_isalnum(*p) && strchr("_./=:,+-", *p) == NULL)
            return FALSE;
    }
    /* "A=b" as the first word would be an assignment, not the command to run. */
    return !first || strchr(word, '=') == NULL;
}

static void
shell_quote_append(GString *out, const char *word)
{
    g_string_append_c(out, '\'');
    for (const char *p = word; *p != '\0'; p++) {
        if (*p == '\'')
            g_string_append(out, "'\\''");
        else
            g_string_append_c(out, *p);
    }
    g_string_append_c(out, '\'');
}

char *
hostd_shell_quote_argv(char *const *argv)
{
    GString *out = g_string_new(NULL);

    for (guint i = 0; argv != NULL && argv[i] != NULL; i++) {
        if (i > 0)
            g_string_append_c(out, ' ');
        if (shell_word_is_safe(argv[i], i == 0))
            g_string_append(out, argv[i]);
        else
            shell_quote_append(out, argv[i]);
    }
    return g_string_free(out, FALSE);
}

static gboolean
env_name_is_valid(const char *name, gsize len)
{
    if (len == 0 || g_ascii_isdigit(name[0]))
        return FALSE;
    for (gsize i = 0; i < len; i++) {
        if (!g_ascii_isalnum(name[i]) && name[i] != '_')
            return FALSE;
    }
    return TRUE;
}

/* bash's builtins and reserved words (bash 5.2): a command named by one runs in the shell
 * itself under `bash -c`, never by exec. */
static gboolean
bash_runs_itself(const char *name)
{
    static const char *const names[] = {
        ".",      ":",       "[",         "alias",    "bg",       "bind",    "break",    "builtin",
        "caller", "cd",      "command",   "compgen",  "complete", "compopt", "continue", "declare",
        "dirs",   "disown",  "echo",      "enable",   "eval",     "exec",    "exit",     "export",
        "false",  "fc",      "fg",        "getopts",  "hash",     "help",    "history",  "jobs",
        "kill",   "let",     "local",     "logout",   "mapfile",  "popd",    "printf",   "pushd",
        "pwd",    "read",    "readarray", "readonly", "return",   "set",     "shift",    "shopt",
        "source", "suspend", "test",      "times",    "trap",     "true",    "type",     "typeset",
        "ulimit", "umask",   "unalias",   "unset",    "wait",     "if",      "then",     "else",
        "elif",   "fi",      "case",      "esac",     "for",      "select",  "while",    "until",
        "do",     "done",    "in",        "function", "time",     "{",       "}",        "!",
        "[[",     "]]",      "coproc",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        if (strcmp(name, names[i]) == 0)
            return TRUE;
    }
    return FALSE;
}

/* Appends @argv (@quoted: it quoted) as a spare runs it: by exec where `bash -c` would exec it
 * as its last command, a program found in PATH or an executable file, so that the program
 * replaces the shell, its signals reach sshd and bash adds no message of its own; run by the
 * shell otherwise (a builtin, a function of the guest's start-up files, a name not found:
 * bash's own error). A name of other characters is left to the shell. */
static void
spare_append_argv(GString *command, char *const *argv, const char *quoted)
{
    const char *name = argv[0];
    g_autofree char *word = hostd_shell_quote_argv((char *const[]){(char *)name, NULL});

    if (bash_runs_itself(name)) {
        g_string_append(command, quoted);
    } else if (strchr(name, '/') != NULL) {
        g_string_append_printf(command, "if [ -f %s ] && [ -x %s ]; then exec %s; else %s; fi",
                               word, word, quoted, quoted);
    } else if (strspn(name,
                      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-") ==
               strlen(name)) {
        g_string_append_printf(command,
                               "if declare -F -- %s >/dev/null || ! hash -- %s 2>/dev/null; "
                               "then %s; else exec %s; fi",
                               word, word, quoted, quoted);
    } else {
        g_string_append(command, quoted);
    }
}

/* The remote command line; @for_spare: as a spare runs it. The environment goes into it because
 * sshd's AcceptEnv refuses almost every variable sent as an "env" request. */
static char *
exec_build_command(const HostdExecRequest *request, gboolean for_spare, GError **error)
{
    g_autoptr(GString) command = g_string_new(NULL);
    g_autofree char *quoted = NULL;

    if (request->argv == NULL || request->argv[0] == NULL) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no command to run");
        return NULL;
    }
    for (guint i = 0; request->env != NULL && request->env[i] != NULL; i++) {
        const char *entry = request->env[i];
        const char *eq = strchr(entry, '=');

        if (eq == NULL || !env_name_is_valid(entry, (gsize)(eq - entry))) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                     "environment entry %u is not NAME=VALUE with a NAME of letters, digits "
                     "and '_'",
                     i + 1);
            return NULL;
        }
        g_string_append(command, "export ");
        g_string_append_len(command, entry, eq - entry + 1);
        shell_quote_append(command, eq + 1);
        g_string_append(command, "; ");
    }
    if (request->cwd != NULL) {
        g_string_append(command, "cd ");
        shell_quote_append(command, request->cwd);
        g_string_append(command, " && ");
    }
    quoted = hostd_shell_quote_argv(request->argv);
    if (for_spare)
        spare_append_argv(command, request->argv, quoted);
    else
        g_string_append(command, quoted);
    return g_string_free(g_steal_pointer(&command), FALSE);
}

int
hostd_ssh_signal_exit_status(const char *name)
{
    /* The names RFC 4254 defines, with their Linux numbers (the guests are Linux). */
    static const struct {
        const char *name;
        int number;
    } signals[] = {
        {"HUP", 1},   {"INT", 2},   {"QUIT", 3},  {"ILL", 4},   {"ABRT", 6},
        {"FPE", 8},   {"KILL", 9},  {"USR1", 10}, {"SEGV", 11}, {"USR2", 12},
        {"PIPE", 13}, {"ALRM", 14}, {"TERM", 15},
    };

    for (gsize i = 0; name != NULL && i < G_N_ELEMENTS(signals); i++) {
        if (strcmp(name, signals[i].name) == 0)
            return 128 + signals[i].number;
    }
    return 255;
}

/* ---- Exec relay ---------------------------------------------------------------------------- */

typedef struct {
    struct ssh_channel_callbacks_struct callbacks;
    char *exit_signal;
} ExecState;

static void
on_exit_signal(ssh_session session, ssh_channel channel, const char *signal, int core,
               const char *errmsg, const char *lang, void *userdata)
{
    ExecState *state = userdata;

    g_free(state->exit_signal);
    state->exit_signal = g_strdup(signal);
}

/* Forwards what libssh has for one stream, a bounded amount per call so that a chatty command
 * cannot starve the client's stdin. *ret_more says whether output was left behind. */
static gboolean
relay_output(ssh_session session, ssh_channel channel, int is_stderr, guint8 *buf,
             VmStreamWriter *reply, gboolean *ret_more, GError **error)
{
    for (guint i = 0; i < RELAY_BURST_CHUNKS; i++) {
        int n = ssh_channel_read_nonblocking(channel, buf, VM_STREAM_CHUNK_MAX, is_stderr);

        if (n == SSH_ERROR)
            return ssh_throw(error, session, "reading the command's output failed");
        if (n <= 0) { /* nothing buffered, or SSH_EOF */
            *ret_more = FALSE;
            return TRUE;
        }
        if (!vm_stream_writer_data(reply, is_stderr ? VM_OP_STDERR : VM_OP_STDOUT, buf, (gsize)n,
                                   error))
            return FALSE;
    }
    *ret_more = TRUE;
    return TRUE;
}

typedef struct {
    GByteArray *pending; /* stdin not yet accepted by the channel's window */
    gboolean stdin_eof;  /* the client sent STDIN_EOF */
    gboolean eof_sent;
} StdinState;

static gboolean
relay_client_message(ssh_session session, ssh_channel channel, const HostdExecRequest *request,
                     const VmMessage *message, StdinState *in, GError **error)
{
    switch (message->op) {
    case VM_OP_STDIN: {
        gsize len = 0;
        const guint8 *data = vm_message_get_data(message, "data", &len);

        if (!in->stdin_eof && data != NULL)
            g_byte_array_append(in->pending, data, (guint)len);
        return TRUE;
    }
    case VM_OP_STDIN_EOF:
        in->stdin_eof = TRUE;
        return TRUE;
    case VM_OP_WINDOW_SIZE:
        if (request->tty &&
            ssh_channel_change_pty_size(channel, (int)vm_message_get_uint(message, "cols", 80),
                                        (int)vm_message_get_uint(message, "rows", 24)) == SSH_ERROR)
            return ssh_throw(error, session, "resizing the terminal failed");
        return TRUE;
    default:
        return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected '%s' message during exec",
                        vm_op_name(message->op) != NULL ? vm_op_name(message->op) : "unknown");
    }
}

/* Moves as much pending stdin as the remote window takes; never waits for the window, since
 * waiting while the command blocks on a full stdout would deadlock. */
static gboolean
relay_stdin(ssh_session session, ssh_channel channel, StdinState *in, GError **error)
{
    if (ssh_channel_is_closed(channel)) {
        /* Nobody is left to read it. */
        g_byte_array_set_size(in->pending, 0);
        return TRUE;
    }
    if (in->pending->len > 0) {
        guint32 len = MIN(in->pending->len, ssh_channel_window_size(channel));
        int n;

        if (len == 0)
            return TRUE;
        n = ssh_channel_write(channel, in->pending->data, len);
        if (n == SSH_ERROR)
            return ssh_throw(error, session, "writing the command's input failed");
        g_byte_array_remove_range(in->pending, 0, (guint)n);
    }
    if (in->pending->len == 0 && in->stdin_eof && !in->eof_sent) {
        if (ssh_channel_send_eof(channel) == SSH_ERROR)
            return ssh_throw(error, session, "closing the command's input failed");
        in->eof_sent = TRUE;
    }
    return TRUE;
}

/* Relays until the channel is closed and drained, @first_input (a spare's command) going to
 * the command's stdin ahead of the client's; then *ret_status holds the exit status.
 * @event holds @session: reading the channel stops feeding libssh from the socket once the
 * remote EOF is in, yet the exit status and the close come after it. */
static gboolean
exec_relay(ssh_session session, ssh_event event, ssh_channel channel,
           const HostdExecRequest *request, GByteArray *first_input, ExecState *state,
           VmStreamWriter *reply, int *ret_status, GError **error)
{
    int client_fd = reply->fd;
    g_autoptr(GByteArray) pending = g_byte_array_ref(first_input);
    g_autofree guint8 *buf = g_malloc(VM_STREAM_CHUNK_MAX);
    StdinState in = {.pending = pending};
    int status;

    for (;;) {
        struct pollfd fds[2];
        gboolean more_stdout;
        gboolean more_stderr;
        int rc;

        if (!relay_output(session, channel, 0, buf, reply, &more_stdout, error) ||
            !relay_output(session, channel, 1, buf, reply, &more_stderr, error) ||
            !relay_stdin(session, channel, &in, error))
            return FALSE;

        if (ssh_channel_is_closed(channel)) {
            if (!ssh_is_connected(session))
                return ssh_throw(error, session, "the connection to the agent was lost");
            if (ssh_channel_is_eof(channel))
                break;
            continue; /* output still buffered */
        }

        fds[0].fd = client_fd;
        fds[0].events = in.pending->len < STDIN_PENDING_MAX ? POLLIN : 0;
        fds[0].revents = 0;
        fds[1].fd = ssh_get_fd(session);
        fds[1].events = POLLIN;
        fds[1].revents = 0;
        /* The timeout only catches data libssh has buffered internally; readiness of either
         * fd wakes the loop at once. */
        rc = poll(fds, G_N_ELEMENTS(fds), more_stdout || more_stderr ? 0 : RELAY_POLL_MS);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            return vm_throw_errno(error, errno, "poll() in the exec relay failed");
        }

        if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) &&
            ssh_event_dopoll(event, 0) == SSH_ERROR && !ssh_is_connected(session))
            return ssh_throw(error, session, "the connection to the agent was lost");

        if (fds[0].revents & POLLIN) {
            g_autoptr(VmMessage) message = NULL;
            g_autoptr(GError) local_error = NULL;
            gboolean eof = FALSE;

            message = vm_message_read_fd(client_fd, &eof, &local_error);
            if (message == NULL) {
                if (eof)
                    return vm_throw(error, VM_ERROR_CANCELLED, "the client went away");
                return vm_throw(error, VM_ERROR_CANCELLED, "the client went away: %s",
                                local_error->message);
            }
            if (!relay_client_message(session, channel, request, message, &in, error))
                return FALSE;
        } else if (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
            return vm_throw(error, VM_ERROR_CANCELLED, "the client went away");
        }
    }

    if (state->exit_signal != NULL) {
        status = hostd_ssh_signal_exit_status(state->exit_signal);
    } else {
        status = ssh_channel_get_exit_status(channel);
        if (status < 0)
            status = 255;
    }
    *ret_status = status;
    return TRUE;
}

static void
channel_finish(ssh_channel channel, ExecState *state)
{
    /* The channel may outlive this frame inside libssh until the remote close arrives. */
    ssh_remove_channel_callbacks(channel, &state->callbacks);
    ssh_channel_close(channel);
    ssh_channel_free(channel);
}

static gboolean
channel_open(ssh_session session, const char *agent, ssh_channel *ret_channel, GError **error)
{
    ssh_channel channel = ssh_channel_new(session);

    if (channel == NULL)
        return ssh_throw(error, session, "cannot open a channel to agent '%s'", agent);
    if (ssh_channel_open_session(channel) != SSH_OK) {
        ssh_throw(error, session, "cannot open a channel to agent '%s'", agent);
        ssh_channel_free(channel);
        return FALSE;
    }
    *ret_channel = channel;
    return TRUE;
}

/* A fresh connection for an exec: one of the agent's handshake slots, and a few tries when the
 * guest drops it early (a guest up, but busy with other handshakes). */
static ssh_session
exec_connect(HostdSshPool *pool, const HostdSshTarget *target, GError **error)
{
    if (!pool_slot_take(pool, target->agent))
        return vm_throw(error, VM_ERROR_BUSY,
                        "agent '%s': no SSH connection slot came free (no handshake ended "
                        "for %d s, or %d s in all)",
                        target->agent, POOL_CONNECTING_IDLE_S, POOL_CONNECTING_WAIT_S),
               NULL;
    ssh_session fresh = NULL;
    for (guint attempt = 1;; attempt++) {
        g_autoptr(GError) local_error = NULL;
        gint64 start = g_get_monotonic_time();
        ConnectResult result =
            session_connect(pool, target, EXEC_CONNECT_TIMEOUT_S, -1, &fresh, &local_error);
        if (result == CONNECT_OK)
            break;
        /* Only an early drop is worth another try; a guest that let a try time out would
         * only make the exec wait longer. */
        if (result == CONNECT_FATAL || attempt == EXEC_CONNECT_ATTEMPTS ||
            g_get_monotonic_time() - start > 2 * G_USEC_PER_SEC) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            break;
        }
        g_usleep(attempt * 200 * 1000);
    }
    pool_slot_give(pool, target->agent);
    return fresh;
}

/* ---- Sessions for the other files of this module -------------------------------------------- */

gboolean
hostd_ssh_throw(GError **error, ssh_session session, const char *what)
{
    return ssh_throw(error, session, "%s", what);
}

ssh_session
hostd_ssh_session_take(HostdSshPool *pool, const HostdSshTarget *target, gboolean fresh,
                       guint64 *ret_generation, GError **error)
{
    ssh_session session = NULL;
    ssh_channel spare = NULL;
    guint64 generation;

    g_return_val_if_fail(pool != NULL && target != NULL && ret_generation != NULL, NULL);
    g_return_val_if_fail(error == NULL || *error == NULL, NULL);

    if (!fresh) {
        session = pool_take(pool, target->agent, &generation, &spare);
        /* The caller gets a session with no channel of anyone else's. */
        if (spare != NULL)
            ssh_channel_free(spare);
    } else
        generation = pool_get_generation(pool, target->agent);
    if (session == NULL)
        session = exec_connect(pool, target, error);
    if (session != NULL)
        *ret_generation = generation;
    return session;
}

void
hostd_ssh_session_give(HostdSshPool *pool, const char *agent, guint64 generation,
                       ssh_session session)
{
    g_return_if_fail(pool != NULL && agent != NULL);

    if (session != NULL)
        pool_put(pool, agent, generation, session, NULL, FALSE);
}

/* Where an exec's command goes: a spare of the pooled session (ready), else a new channel on a
 * pooled or fresh session. */
static gboolean
exec_channel(HostdSshPool *pool, const HostdSshTarget *target, const HostdExecRequest *request,
             gsize command_len, ssh_session *ret_session, guint64 *ret_generation,
             ssh_channel *ret_channel, gboolean *ret_spare, GError **error)
{
    ssh_channel spare = NULL;
    ssh_session session = pool_take(pool, target->agent, ret_generation, &spare);

    vm_trace_mark(request->trace, "pooled session");
    *ret_spare = FALSE;
    if (spare != NULL && !request->tty && command_len < SPARE_COMMAND_MAX) {
        switch (spare_claim(session, spare)) {
        case SPARE_OK:
            g_atomic_int_inc(&pool->spares_used);
            vm_trace_mark(request->trace, "spare ready");
            *ret_session = session;
            *ret_channel = spare;
            *ret_spare = TRUE;
            return TRUE;
        case SPARE_REFUSED:
            pool_refuse_spares(pool, target->agent, *ret_generation);
            break;
        case SPARE_LOST:
            g_clear_pointer(&session, hostd_ssh_session_close); /* the spare with it */
            spare = NULL;
            break;
        case SPARE_UNUSED:
        default:
            break;
        }
    }
    if (spare != NULL)
        ssh_channel_free(spare);

    if (session != NULL && !channel_open(session, target->agent, ret_channel, NULL)) {
        /* The guest may have rebooted under a pooled session: one fresh try. */
        g_clear_pointer(&session, hostd_ssh_session_close);
    }
    if (session == NULL) {
        session = exec_connect(pool, target, error);
        vm_trace_mark(request->trace, "connect");
        if (session == NULL)
            return FALSE;
        if (!channel_open(session, target->agent, ret_channel, error)) {
            hostd_ssh_session_close(session);
            return FALSE;
        }
    }
    vm_trace_mark(request->trace, "channel open");
    *ret_session = session;
    return TRUE;
}

gboolean
hostd_ssh_exec(HostdSshPool *pool, const HostdSshTarget *target, const HostdExecRequest *request,
               int client_fd, GError **error)
{
    g_autofree char *command = NULL;
    g_autofree char *spare_command = NULL;
    g_autoptr(HostdSshSession) session = NULL;
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GByteArray) first_input = g_byte_array_new();
    VmStreamWriter reply = VM_STREAM_WRITER_INIT(client_fd);
    ExecState state = {{0}};
    ssh_channel channel = NULL;
    gboolean from_spare = FALSE;
    gboolean refill = FALSE;
    guint64 generation;
    int status = 0;
    gboolean ok;

    g_return_val_if_fail(pool != NULL && target != NULL && request != NULL, FALSE);
    g_return_val_if_fail(error == NULL || *error == NULL, FALSE);
    if (pool->delegate != NULL)
        return pool->delegate->exec(pool->delegate_data, target, request, client_fd, error);

    command = exec_build_command(request, FALSE, error);
    if (command == NULL)
        return FALSE;
    spare_command = exec_build_command(request, TRUE, NULL);
    if (!exec_channel(pool, target, request, strlen(spare_command), &session, &generation, &channel,
                      &from_spare, error))
        return FALSE;

    state.callbacks.userdata = &state;
    state.callbacks.channel_exit_signal_function = on_exit_signal;
    ssh_callbacks_init(&state.callbacks);
    ssh_set_channel_callbacks(channel, &state.callbacks);

    if (request->before_command != NULL) {
        request->before_command(request->before_command_data);
        vm_trace_mark(request->trace, "guest clock set");
    }
    ok = TRUE;
    if (from_spare) {
        /* The command with its NUL, sent by the relay ahead of the client's stdin. */
        g_byte_array_append(first_input, (const guint8 *)spare_command,
                            (guint)strlen(spare_command) + 1);
    } else {
        if (request->tty && ssh_channel_request_pty_size(
                                channel, request->term != NULL ? request->term : "xterm-256color",
                                request->cols != 0 ? (int)request->cols : 80,
                                request->rows != 0 ? (int)request->rows : 24) != SSH_OK)
            ok = ssh_throw(&local_error, session, "cannot allocate a terminal on agent '%s'",
                           target->agent);
        if (ok && ssh_channel_request_exec(channel, command) != SSH_OK)
            ok = ssh_throw(&local_error, session, "cannot run the command on agent '%s'",
                           target->agent);
        vm_trace_mark(request->trace, "exec request");
    }
    if (ok) {
        ssh_event event = ssh_event_new();

        if (event == NULL || ssh_event_add_session(event, session) != SSH_OK) {
            ok = ssh_throw(&local_error, session, "cannot watch the connection to agent '%s'",
                           target->agent);
        } else {
            ok = exec_relay(session, event, channel, request, first_input, &state, &reply, &status,
                            &local_error);
            ssh_event_remove_session(event, session);
        }
        if (event != NULL)
            ssh_event_free(event);
    }

    vm_trace_mark(request->trace, "command ran");
    channel_finish(channel, &state);
    g_free(state.exit_signal);
    /* A session that failed at the SSH level is not trusted again. Else it goes back to the
     * pool before the EXIT frame, so the client's next exec finds it; or, when it gets a spare
     * first, the next exec waits for that (a round trip or two) while this one's EXIT goes
     * out at once. */
    if (ok || !g_error_matches(local_error, VM_ERROR, VM_ERROR_SSH)) {
        refill = pool_refill_begin(pool, target->agent, generation, session);
        if (!refill)
            pool_put(pool, target->agent, generation, g_steal_pointer(&session), NULL, FALSE);
    }
    if (!ok)
        g_propagate_error(error, g_steal_pointer(&local_error));
    else
        ok = vm_stream_writer_exit(&reply, (gint32)status, error);
    vm_trace_mark(request->trace, "exit sent");
    if (refill) {
        ssh_channel spare = spare_start(pool, session);
        pool_put(pool, target->agent, generation, g_steal_pointer(&session), spare, TRUE);
    }
    return ok;
}
