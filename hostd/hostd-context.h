/* hostd's context: what every part of the daemon shares (configuration, state directory, libvirt
 * connection, SSH pool), the per-agent name locks, and the components that hook into the agents'
 * lifecycle (egress, checkpoints, forks, power). It is the root of hostd's include graph: it knows
 * no component; components register themselves with hostd_context_add_component().
 */
#pragma once

#include <gio/gio.h>

#include "hostd-config.h"
#include "hostd-events.h"
#include "hostd-libvirt.h"
#include "hostd-ssh.h"
#include "hostd-ssh-worker.h"
#include "hostd-state.h"
#include "vm-domain.h"
#include "vm-progress.h"
#include "vm-seed.h"
#include "vm-template.h"

G_BEGIN_DECLS

typedef struct _HostdComponent HostdComponent;

typedef struct {
    HostdConfig *config;
    HostdState *state;
    HostdLibvirt *lv;
    HostdSshPool *ssh;
    HostdSshWorkers *ssh_workers; /* where ssh's waits and execs run; NULL: in hostd */
    HostdEvents *events;          /* the event log (<state dir>/events.log) */
    GMutex lock;                  /* guards name_locks and port allocation */
    GHashTable *name_locks;       /* agent name -> GMutex*, for the life of hostd */
    GPtrArray *components;        /* const HostdComponent*, in the order they were added */
    struct _HostdEgress *egress;  /* hostd-egress.c's state; NULL until it is attached */
    struct _HostdPower *power;    /* hostd-power.c's state; NULL until hostd_power_start() */
    struct _HostdRelay *relay;    /* the public SSH ports (hostd-power.c); NULL until started */
    struct _HostdSshForward *forwards;   /* forwarded guest ports (hostd-forward.c); NULL until
                                          * first used; read it with g_atomic_pointer_get() */
    struct _HostdSupervisor *supervisor; /* hostd-supervise.c's; NULL until started */
    struct _HostdGuestApi *guest_api;    /* hostd-guest-api.c's; NULL until an agent has one */
    struct _HostdConsole *console;       /* hostd-console.c's; NULL until an agent is followed */
    struct _HostdMetrics *metrics;       /* hostd's counters (hostd-metrics.h) */
    struct _HostdCluster *cluster;       /* this host in a fleet (hostd-cluster.h); NULL without
                                          * [cluster]; set before the server starts, its owner
                                          * (main) frees it */
    struct _HostdKsm *ksm;               /* hostd-ksm.c's controller; NULL until started */
    struct _HostdPool *pool;             /* hostd-pool.c's warm pools; NULL until started */
    /* Set by hostd-pool.c while its pools run (NULL: no pool), for the layers below it: the
     * paused machine of @template_name's warm image @warm_disk of that size that a warm `new`
     * takes (its record, the caller's; NULL when none waits), pool_settled() once that `new` is
     * done, whether it got a machine or not (the pool fills only when no warm `new` has been
     * under way for a moment), and how many machines wait. */
    HostdAgentRecord *(*pool_take)(gpointer ctx, const char *template_name, const char *warm_disk,
                                   guint cpus, guint memory_mib, guint disk_gib);
    void (*pool_settled)(gpointer ctx);
    guint (*pool_count)(gpointer ctx, const char *template_name);
    void (*log)(const char *message); /* where hostd's background work reports; may be NULL */
    gboolean debug;                   /* --debug: also a trace of where each exec's time went */
    gboolean agent_ids;          /* each agent's QEMU runs as an id of its own (hostd-confine.h) */
    GHashTable *ids_held;        /* ids held by machines without a record (a warm image's build), as
                                  * GUINT_TO_POINTER; guarded by lock */
    GHashTable *worker_slots;    /* hostd-confine.c: agent name -> its workers' slot + 1, for an
                                  * agent whose workers' ids come from no agent id; guarded by
                                  * lock */
    GHashTable *workers_checked; /* hostd-confine.c: agent name -> its id + 1 its workers' ids
                                  * were checked for; guarded by lock */
    gboolean guestfs_appliance_checked; /* hostd-guestfs.c: the appliance was brought up to date
                                         * by this hostd; guarded by lock */
    GHashTable *serial_runs;  /* hostd-serial.c: agent -> the run ("domain id/worker pid") its
                               * session over the virtio port was made or carried over for;
                               * guarded by lock */
    guint serial_attaching;   /* hostd-serial.c's threads making one; guarded by lock */
    GCond serial_attached;    /* signalled as each of them ends */
    GHashTable *held_ports;   /* hostd-resources.c: agent being made -> the listeners that hold
                               * its ports until they serve them; NULL until used; guarded by
                               * lock */
    GHashTable *booting;      /* hostd-booting.c: agent -> the generation of its mark, while hostd
                               * boots it with nobody waiting; guarded by lock */
    GCond booted;             /* signalled as a mark goes */
    guint booting_generation; /* guarded by lock */
} HostdContext;

/* What a component does at each step of an agent's life. Every hook is optional; hooks run in
 * the order components were added (detach in reverse). The agent's name lock is held in every
 * agent hook. A failing hook makes the step fail with its error (see hostd-agent.h). */
struct _HostdComponent {
    const char *name;
    /* `new` or fork, before the agent's files and domain are made: what the VM needs from the
     * start (the egress proxy). */
    gboolean (*agent_creating)(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                               GError **error);
    /* While a new agent's cloud-init seed is made: fill in the component's part of @spec
     * (strings in @keep, as for agent_domain). */
    void (*agent_seed)(HostdContext *ctx, const HostdAgentRecord *r, VmSeedSpec *spec,
                       GPtrArray *keep);
    /* While the domain XML is built: fill in the component's part of @spec. Strings it points
     * @spec at are added to @keep (freed with g_free once the XML is built). */
    void (*agent_domain)(HostdContext *ctx, const HostdAgentRecord *r, VmDomainSpec *spec,
                         GPtrArray *keep);
    /* Before a stopped agent boots (and before a running one is resumed by start). */
    gboolean (*agent_starting)(HostdContext *ctx, const HostdAgentRecord *r, GError **error);
    /* `new` or fork finished: the agent is about to be marked ready. */
    gboolean (*agent_ready)(HostdContext *ctx, const HostdAgentRecord *r, GError **error);
    /* The guest answers SSH after hostd booted, restored or resumed it and waited for that (new,
     * fork, start, restore; not with --no-wait), or after a restore of paths: what lives on the
     * guest's disk may be older than hostd's record of it. Can't fail: a component reports
     * through hostd_context_log(). */
    void (*agent_up)(HostdContext *ctx, const HostdAgentRecord *r);
    /* `rm` asks: fail to refuse the removal (VM_ERROR_BAD_STATE). */
    gboolean (*agent_removing)(HostdContext *ctx, const HostdAgentRecord *r, GError **error);
    /* The agent is going (rm, or a rolled-back new): forget it. Can't fail. */
    void (*agent_removed)(HostdContext *ctx, const char *name);
    /* At start-up, for every ready agent (@dom NULL when libvirt has no domain for it): bring
     * the component's state in line, one human-readable line per action in @notes. */
    void (*agent_reconcile)(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                            GPtrArray *notes);
    /* The context is being freed: release the component's state. */
    void (*detach)(HostdContext *ctx);
};

/* Builds the context around already-opened parts (ownership passes to it), with no component
 * attached. Can't fail. */
HostdContext *hostd_context_new(HostdConfig *config, HostdState *state, HostdLibvirt *lv);

/* Runs ctx->ssh's waits and execs in a confined SSH worker per agent (hostd-ssh-worker.h) from
 * now on, each as @worker_user (called with @ctx; hostd's is hostd_confine_ssh_worker_user())
 * says. Call before any use of ctx->ssh. Fails with VM_ERROR_INVALID_ARGUMENT for an egress-user
 * that cannot be, VM_ERROR_NOT_FOUND when the worker program is not where hostd looks for it. */
gboolean hostd_context_use_ssh_workers(HostdContext *ctx, HostdSshWorkerUserFunc worker_user,
                                       GError **error);

/* Detaches every component (in reverse order), then frees the parts. Accepts NULL. */
void hostd_context_free(HostdContext *ctx);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdContext, hostd_context_free)

/* Adds @component (static storage) to the context's components. Can't fail. */
void hostd_context_add_component(HostdContext *ctx, const HostdComponent *component);

/* Reports one line of background work through ctx->log, if set. Can't fail. */
void hostd_context_log(HostdContext *ctx, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* Appends @event to the event log; an event that cannot be written is reported through
 * ctx->log, never failing the caller. */
void hostd_context_event(HostdContext *ctx, const HostdEvent *event);

/* The same for what hostd itself saw or did to @agent (no caller, no outcome). */
void hostd_context_agent_event(HostdContext *ctx, const char *agent, const char *event,
                               const char *state, const char *detail);

/* Takes the per-agent lock of @name (operations on one agent never interleave); release with
 * hostd_name_unlock() or g_autoptr(HostdNameLock). */
GMutex *hostd_name_lock(HostdContext *ctx, const char *name);
void hostd_name_unlock(GMutex *lock);
/* Like hostd_name_lock() but returns NULL at once when the lock is taken. */
GMutex *hostd_name_trylock(HostdContext *ctx, const char *name);
typedef GMutex HostdNameLock;
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdNameLock, hostd_name_unlock)

/* Reports progress when @progress is set. Can't fail. */
void hostd_progress(VmProgressFunc progress, gpointer data, const char *message, double fraction);

/* A point where the crash tests kill hostd: with $HOSTD_TEST_CRASH_AT equal to @step, hostd
 * ends at once by SIGKILL there, as a crash or a power cut would end it. Nothing otherwise. */
void hostd_crash_point(const char *step);

/* The fleet this host is in (ctx->cluster), for what needs one: NULL with VM_ERROR_NOT_RUNNING
 * "this host is in no fleet" without [cluster]. */
struct _HostdCluster *hostd_context_fleet(HostdContext *ctx, GError **error);

G_END_DECLS
