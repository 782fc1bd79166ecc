/* One agent's in-guest API worker (hostd/vm-guest-api-worker.c): started, watched and restarted
 * by hostd, as the egress worker is (hostd-egress-worker.h). See docs/GUEST-API.md.
 *
 * A HostdGuestApiWorker owns a vm-guest-api-worker process that serves the agent's listening
 * api.sock (kept by the caller, so guest connections wait in its backlog while a worker
 * restarts). A thread of hostd's reads the worker's messages, which it does not trust: bounded
 * frames, exact types, each call checked by hostd_guest_api_call_from_variant() before the
 * caller sees it; a worker that sends anything else is killed and replaced. When the worker dies
 * its connections die with it, and a new one starts at once, then with a growing delay (at most
 * HOSTD_GUEST_API_WORKER_BACKOFF_MAX_MS) while it keeps dying young. Its start and each frame
 * have a deadline, and a worker silent for the ping interval is sent a "ping" it must answer
 * within the deadline: one that is stopped (SIGSTOP) or loops is killed and replaced so.
 *
 * Every function may be called from any thread. */
#pragma once

#include <glib.h>
#include <sys/types.h>

#include "hostd-guest-api-rules.h"
#include "hostd-guest-api-wire.h"
#include "hostd-worker-process.h"

G_BEGIN_DECLS

#define HOSTD_GUEST_API_WORKER_BACKOFF_MAX_MS 2000

typedef struct _HostdGuestApiWorker HostdGuestApiWorker;

/* A checked call of worker run @run (for hostd_guest_api_worker_answer()), with @serial;
 * @call is the callee's to keep (g_steal_pointer() its fields) or leave. Called on the reader
 * thread: it must not wait long (the worker's next messages wait for it). */
typedef void (*HostdGuestApiWorkerCallFunc)(HostdGuestApiWorker *worker, guint64 run,
                                            guint32 serial, HostdGuestApiCall *call,
                                            gpointer user_data);
/* A refusal the worker made without a call, for the log; on the reader thread. */
typedef void (*HostdGuestApiWorkerRefusedFunc)(HostdGuestApiRefusal why, gpointer user_data);
/* The worker broke the protocol (@why: what it sent, in hostd's words) and is being killed and
 * replaced; on the reader thread. */
typedef void (*HostdGuestApiWorkerBrokenFunc)(const char *why, gpointer user_data);

typedef struct {
    /* the vm-guest-api-worker to run, the agent, its listening api.sock, whom it runs as, its
     * deadlines (hostd-worker-process.h) */
    HostdWorkerSetup worker;
    HostdGuestApiWorkerCallFunc call;
    HostdGuestApiWorkerRefusedFunc refused;
    HostdGuestApiWorkerBrokenFunc broken;
    gpointer user_data;
} HostdGuestApiWorkerConfig;

/* Starts the worker and returns once it serves. Fails with VM_ERROR_IO when it cannot be run or
 * says it cannot start (its message). */
HostdGuestApiWorker *hostd_guest_api_worker_new(const HostdGuestApiWorkerConfig *config,
                                                GError **error);

/* Kills the worker (its connections close), waits for its reader and drops the caller's
 * reference; no callback runs once it returned. Other references stay valid (answers on them go
 * nowhere). NULL is accepted. */
void hostd_guest_api_worker_free(HostdGuestApiWorker *worker);

/* A reference for an answer given later (from a pool thread); dropped with
 * hostd_guest_api_worker_unref(). Can't fail. */
HostdGuestApiWorker *hostd_guest_api_worker_ref(HostdGuestApiWorker *worker);
void hostd_guest_api_worker_unref(HostdGuestApiWorker *worker);

/* Answers call @serial of worker run @run: HTTP @status (0: the worker's own refusal of that
 * call) with @body (JSON; NULL: none) and a Retry-After of @retry_after_s (0: none). Dropped
 * when that run has ended. Can't fail. */
void hostd_guest_api_worker_answer(HostdGuestApiWorker *worker, guint64 run, guint32 serial,
                                   guint status, const char *body, guint retry_after_s);

/* The running worker's process id, 0 while none runs. Can't fail. */
GPid hostd_guest_api_worker_get_pid(HostdGuestApiWorker *worker);

G_END_DECLS
