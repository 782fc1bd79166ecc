/* What hostd does alike for each kind of worker process it supervises (the egress worker,
 * hostd-egress-worker.h; the in-guest API worker, hostd-guest-api-worker.h): start one with its
 * channel, the descriptors it is handed and its output to hostd's log through a pipe; the
 * start/ready exchange within a deadline; a wait on its channel bounded by a deadline; the delay
 * before a restart of one that keeps dying young; the kill and the reap. The watch thread and
 * the protocol on the channel stay each kind's own.
 *
 * Every function may be called from any thread. */
#pragma once

#include <glib.h>
#include <sys/types.h>

G_BEGIN_DECLS

/* Unless a kind configures another: the deadline of a worker's start and of each frame and
 * answer, and how often a watcher asks a worker that says nothing whether it still answers. */
#define HOSTD_WORKER_ANSWER_TIMEOUT_MS_DEFAULT 10000
#define HOSTD_WORKER_PING_INTERVAL_MS_DEFAULT  5000

/* A kind's configured deadline and ping interval (0: the defaults above) as its watcher keeps
 * them. Can't fail. */
void hostd_worker_timeouts(guint answer_timeout_ms, guint ping_interval_ms, guint *ret_answer_ms,
                           guint *ret_ping_ms);

/* The most descriptors a worker is handed besides its channel. */
#define HOSTD_WORKER_FDS_MAX 2

typedef struct {
    const char *program;           /* the worker to run */
    const char *name;              /* the agent: the worker's argument, and for messages */
    const char *what;              /* "egress worker", for messages */
    int channel_fd;                /* the number the channel gets in the worker */
    int fds[HOSTD_WORKER_FDS_MAX]; /* handed to the worker besides: its listening socket... */
    int target_fds[HOSTD_WORKER_FDS_MAX]; /* ...as these numbers */
    guint n_fds;
    gsize from_worker_max;   /* the largest frame the worker may send */
    guint answer_timeout_ms; /* the deadline for its "ready" */
    GVariant *start;         /* floating or not: the "start" message's payload */
} HostdWorkerSpawn;

/* Runs @spawn's worker with the channel (a new Unix stream pair), the descriptors @spawn hands
 * it (its listening socket, ...) and its stdout and stderr on a pipe hostd's log reads
 * (hostd_log_worker_output()), sends it "start" and waits up to the answer deadline for its
 * "ready". On success the channel (sends on it bounded in time), the pid and the "ready" payload
 * (*@ret_ready, when not NULL). Fails with VM_ERROR_IO when it cannot run or answers anything else
 * ("failed" with its reason included), the worker then killed and reaped. */
gboolean hostd_worker_spawn(const HostdWorkerSpawn *spawn, int *ret_fd, GPid *ret_pid,
                            GVariant **ret_ready, GError **error);

/* Sends one message (@payload: floating or not) on @fd, the channel of one worker run (-1:
 * none, nothing sent), one frame at a time under @send_lock. A worker that stops reading (the
 * send timed out) or is gone gets its channel shut down: its watcher sees it close, and kills
 * and replaces it. Can't fail. */
void hostd_worker_send(GMutex *send_lock, int fd, const char *kind, GVariant *payload);

/* Kills @pid (a worker that broke the protocol or missed a deadline may still run) and reaps
 * it. Can't fail. */
void hostd_worker_reap(GPid pid);

/* Waits until @fd can be read (TRUE: a read then says what is there) or @until (monotonic us)
 * passes (FALSE). Can't fail. */
gboolean hostd_worker_wait(int fd, gint64 until);

/* The delay before the next start of a worker whose run began at @started (monotonic us), from
 * the previous delay *@backoff_ms, which it updates: none for a worker that served a while,
 * else growing from 50 ms to @max_ms. Can't fail. */
guint hostd_worker_backoff(guint *backoff_ms, gint64 started, guint max_ms);

/* The end of one worker run, whose channel @fd (-1: none) and process @pid (0: none) its
 * watcher has just taken back under its own lock: @fd closed once no send holds it any more
 * (@send_lock: a send that took it finishes first), @pid killed and reaped. Can't fail. */
void hostd_worker_run_end(GMutex *send_lock, int fd, GPid pid);

/* The watcher's pause before it starts another worker: the delay of hostd_worker_backoff()
 * (@backoff_ms, @started, @max_ms), waited on @cond under @lock (which the caller does not hold,
 * and which guards *@stopping) unless *@stopping turns TRUE. Returns FALSE when stopping (no
 * worker is to be started), else TRUE. Can't fail. */
gboolean hostd_worker_pause(GMutex *lock, GCond *cond, const gboolean *stopping, guint *backoff_ms,
                            gint64 started, guint max_ms);

/* The runs of one supervised worker, embedded in each kind's worker object: the running one's
 * channel and pid, and the watcher thread that serves it and, when it ends, starts the next
 * (after hostd_worker_pause()'s delay) until stopped. @lock guards fd, pid, run and stopping,
 * and whatever fields of its own the kind puts under it; @send_lock keeps one frame at a time
 * on the channel (hostd_worker_send()). */
typedef struct {
    const char *what; /* "egress worker", for messages */
    const char *thread_name;
    guint backoff_max_ms;
    /* Start a worker and wait for its "ready"; serve one run until it ends (from the watcher,
     * without the lock); with the lock held, after a run ended and after the next began (@fd
     * -1 when it could not start), both may be NULL. */
    gboolean (*launch)(gpointer owner, int *ret_fd, GPid *ret_pid, GError **error);
    void (*serve)(gpointer owner, int fd, guint64 run);
    void (*run_ended)(gpointer owner);
    void (*run_begun)(gpointer owner, int fd);
} HostdWorkerType;

/* Who a worker of one agent is: what hostd_worker_runs_init() copies into its runs. */
typedef struct {
    const char *program; /* the worker to run */
    const char *name;    /* the agent */
    int listen_fd;       /* the socket the worker serves (duplicated) */
    gboolean change_user;
    guint uid, gid;                            /* whom it becomes, with change_user */
    guint answer_timeout_ms, ping_interval_ms; /* 0: the defaults (hostd_worker_timeouts()) */
} HostdWorkerSetup;

typedef struct {
    const HostdWorkerType *kind;
    gpointer owner; /* what the kind's functions get */
    char *program;
    char *name; /* the agent, for messages */
    int listen_fd;
    gboolean change_user;
    uid_t uid;
    gid_t gid;
    guint answer_timeout_ms, ping_interval_ms;

    GMutex send_lock;
    GMutex lock;
    GCond cond;
    int fd;      /* the channel to the running worker, -1 when none */
    GPid pid;    /* the running worker, 0 when none */
    guint64 run; /* which run fd and pid are, counted from 1 */
    gboolean stopping;
    GThread *watcher;
} HostdWorkerRuns;

/* Sets up @runs of a worker of @kind (kept, not copied) as @setup says, whose object, passed
 * to @kind's functions, is @owner; no run yet. Fails when the listening socket cannot be
 * duplicated; hostd_worker_runs_clear() is owed either way. */
gboolean hostd_worker_runs_init(HostdWorkerRuns *runs, const HostdWorkerType *kind,
                                const HostdWorkerSetup *setup, gpointer owner, GError **error);

/* Launches the first run and starts the watcher thread. The caller keeps the owner alive until
 * hostd_worker_runs_stop() returned. Fails with the kind's launch error, nothing started. */
gboolean hostd_worker_runs_start(HostdWorkerRuns *runs, GError **error);

/* Stops the watcher: no run starts any more, the running worker is killed, and the watcher,
 * once it reaped it, is joined. Can't fail. */
void hostd_worker_runs_stop(HostdWorkerRuns *runs);

/* Frees what hostd_worker_runs_init() set up; after hostd_worker_runs_stop(). Can't fail. */
void hostd_worker_runs_clear(HostdWorkerRuns *runs);

/* hostd_worker_send() on @fd, a channel of @runs' worker. Can't fail. */
void hostd_worker_runs_send(HostdWorkerRuns *runs, int fd, const char *kind, GVariant *payload);

/* The running worker's pid, 0 when none. Can't fail. */
GPid hostd_worker_runs_get_pid(HostdWorkerRuns *runs);

G_END_DECLS
