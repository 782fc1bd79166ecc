/* One agent's egress proxy in a worker process (egress/vm-egress-worker.c): started, watched and
 * restarted by hostd. See docs/EGRESS.md.
 *
 * A HostdEgressWorker owns a vm-egress-worker process that serves the agent's listening socket
 * (kept by the caller, so guest connections wait in its backlog while a worker restarts). A
 * thread of hostd's reads the worker's messages, which it does not trust: bounded frames, exact
 * types, log lines checked to be one JSON object of bounded size before they reach the log. When
 * the worker dies (killed, crashed, a bad message) or misses a deadline (a frame begun and not
 * finished, a question of the watcher's not answered: a stopped worker), it is killed, its
 * connections die with it and a new worker
 * starts with the same policy, grants and CA, at once and then with a growing delay (at most
 * HOSTD_EGRESS_WORKER_BACKOFF_MAX_MS) while it keeps dying young.
 *
 * Every function may be called from any thread.
 */
#pragma once

#include <glib.h>
#include <sys/types.h>

#include "hostd-worker-process.h"
#include "vm-egress-credential.h"
#include "vm-egress-policy.h"
#include "vm-egress-proxy.h"

G_BEGIN_DECLS

#define HOSTD_EGRESS_WORKER_BACKOFF_MAX_MS 2000

/* One log record, a JSON object on one line, as the worker sent it after hostd checked it. */
typedef void (*HostdEgressWorkerLogFunc)(const char *json, gpointer user_data);

typedef struct {
    /* the vm-egress-worker to run, the agent, its listening socket, whom it runs as, and the
     * deadline of its start and of each answer it owes (0: 10 s) and how often the watcher asks
     * it whether it answers (0: 5 s): one that misses one (stopped, looping) is killed and
     * replaced as one that died (hostd-worker-process.h) */
    HostdWorkerSetup worker;
    VmEgressPolicy *policy;           /* what the proxy enforces; a reference is taken */
    VmEgressCredentials *credentials; /* NULL: none; a reference is taken */
    const char *ca_cert_pem;          /* the agent's CA, both or neither */
    const char *ca_key_pem;
    const char *upstream_ca_file; /* read here, sent as PEM; NULL: the system's trust store */
    guint max_connections, handshake_timeout_ms, idle_timeout_ms, connect_timeout_ms;
    HostdEgressWorkerLogFunc log; /* called from the worker's reader thread; may be NULL */
    gpointer log_data;
    VmEgressResolveFunc resolve; /* NULL: the worker resolves itself (getaddrinfo()); else it
                                  * asks hostd, which calls this (tests) */
    gpointer resolve_data;
} HostdEgressWorkerConfig;

typedef struct _HostdEgressWorker HostdEgressWorker;

/* Starts the worker and returns once it serves. Fails with VM_ERROR_IO when it cannot be run or
 * says it cannot start (its message), VM_ERROR_INVALID_ARGUMENT when the upstream CA file cannot
 * be read. */
HostdEgressWorker *hostd_egress_worker_new(const HostdEgressWorkerConfig *config, GError **error);

/* Kills the worker (its connections close), waits for it and drops the caller's reference.
 * Other references stay valid (every call on them then finds no worker). NULL is accepted. */
void hostd_egress_worker_free(HostdEgressWorker *worker);

/* A reference for a call made without the caller's lock (the worker is untrusted: it may take
 * its time answering); dropped with hostd_egress_worker_unref(). Can't fail. */
HostdEgressWorker *hostd_egress_worker_ref(HostdEgressWorker *worker);
void hostd_egress_worker_unref(HostdEgressWorker *worker);

/* Gives the worker @policy (a reference is taken), live: new requests follow it, tunnels it
 * refuses close within a second; a restarted worker starts with it. Can't fail. */
void hostd_egress_worker_set_policy(HostdEgressWorker *worker, VmEgressPolicy *policy);

/* Gives the worker @creds (NULL: none; a reference is taken), live and for restarts. Can't
 * fail. */
void hostd_egress_worker_set_credentials(HostdEgressWorker *worker, VmEgressCredentials *creds);

/* A new reference to the policy the worker was last given. Can't fail. */
VmEgressPolicy *hostd_egress_worker_dup_policy(HostdEgressWorker *worker);

/* How many guest connections the worker serves now, as it answers within a second; 0 while no
 * worker runs or when it does not answer. Can't fail. */
guint hostd_egress_worker_get_n_connections(HostdEgressWorker *worker);

/* The same, and in @ret_up and @ret_down the bytes of the requests that ended since the worker
 * was made (its runs before a restart included), guest to destination and back, as the worker
 * counts them. Can't fail. */
guint hostd_egress_worker_get_stats(HostdEgressWorker *worker, guint64 *ret_up, guint64 *ret_down);

/* The running worker's process id, 0 while none runs (between a death and its restart). Can't
 * fail. */
GPid hostd_egress_worker_get_pid(HostdEgressWorker *worker);

G_END_DECLS
