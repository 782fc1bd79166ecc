#include "hostd-agent.h"
#include "hostd-power.h"

#include <string.h>

#include "hostd-booting.h"
#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-fence.h"
#include "hostd-guest.h"
#include "hostd-idle.h"
#include "hostd-relay.h"
#include "hostd-resources.h"
#include "hostd-serial.h"
#include "hostd-ssh-forward.h"
#include "vm-error.h"
#include "vm-name.h"

#define HOSTD_IDLE_TICK_US (2 * G_USEC_PER_SEC)

typedef struct {
    HostdIdleTracker tracker;
    guint sessions;
    gint64 last_session_activity; /* monotonic us */
    gint64 keep_awake_until;      /* monotonic us; G_MAXINT64: until released */
    HostdCpuSample prev;
    gboolean have_prev;
} HostdPowerAgent;

struct _HostdPower {
    GMutex lock;        /* guards agents */
    GHashTable *agents; /* name -> HostdPowerAgent* */
    GThread *thread;
    GMutex stop_lock;
    GCond stop_cond;
    gboolean stopping;
};

/* Returns @name's power state, created on first use. Call with power->lock held. */
static HostdPowerAgent *
hostd_power_agent(struct _HostdPower *power, const char *name)
{
    HostdPowerAgent *a = g_hash_table_lookup(power->agents, name);
    if (a == NULL) {
        a = g_new0(HostdPowerAgent, 1);
        hostd_idle_tracker_reset(&a->tracker);
        g_hash_table_insert(power->agents, g_strdup(name), a);
    }
    return a;
}

gboolean
hostd_power_wake_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                        GError **error)
{
    g_autoptr(HostdClockSync) clock = NULL;

    return hostd_power_wake_traced(ctx, r, dom, NULL, &clock, error);
}

gboolean
hostd_power_wake_traced(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                        VmTrace *trace, HostdClockSync **ret_clock, GError **error)
{
    int state = 0, reason = 0;

    *ret_clock = NULL;
    /* Resume, wake on connect, exec's wake, the idle loop's: never for a fenced agent. */
    if (!hostd_fence_refuse(r, error))
        return FALSE;
    if (virDomainGetState(dom, &state, &reason, 0) < 0)
        return hostd_libvirt_throw(error, "cannot read the agent's state");
    if (state == VIR_DOMAIN_RUNNING || state == VIR_DOMAIN_BLOCKED)
        return TRUE;
    if (state == VIR_DOMAIN_PAUSED) {
        if (virDomainResume(dom) < 0)
            return hostd_libvirt_throw(error, "cannot resume the agent");
        vm_trace_mark(trace, "resume");
    } else if (state == VIR_DOMAIN_SHUTOFF && virDomainHasManagedSaveImage(dom, 0) > 0) {
        gboolean restored = TRUE;

        /* The session over the virtio port stays: it lives on in the saved memory. */
        hostd_ssh_pool_sleep(ctx->ssh, r->name);
        if (!hostd_checkpoint_boot_check(ctx, r, dom, error))
            return FALSE;
        vm_trace_mark(trace, "disk chain checked");
        /* Paused, so that the new QEMU's port of hostd's sshd is connected before the guest
         * runs: the guest then never sees hostd gone, and its session goes on. */
        hostd_ports_release_backend(ctx, r->name);
        if (virDomainCreateWithFlags(dom, VIR_DOMAIN_START_PAUSED) < 0) {
            /* The saved image may no longer load (QEMU changed underneath): the disk is intact,
             * so a cold boot loses only what was in RAM. */
            g_autofree char *why = hostd_libvirt_take_error("?", NULL);
            /* Not when the port of its SSH forward was taken while it slept (the range lies
             * among Linux's ephemeral ports: any outgoing connection may get it): the image is
             * sound, and the boot would fail on the same port after throwing it away. */
            if (strstr(why, "host forwarding rule") != NULL) {
                hostd_ports_hold_saved(ctx, r->name, r->backend_port);
                return vm_throw(error, VM_ERROR_NO_RESOURCES,
                                "agent '%s' cannot wake: port %u of its SSH forward is taken by "
                                "another program (its saved state is kept; try again once it is "
                                "free): %s",
                                r->name, r->backend_port, why);
            }
            hostd_context_log(ctx, "agent '%s': saved state did not restore (%s); booting instead",
                              r->name, why);
            hostd_ssh_pool_forget(ctx->ssh, r->name);
            if (virDomainManagedSaveRemove(dom, 0) < 0 || virDomainCreate(dom) < 0)
                return hostd_libvirt_throw(error, "cannot start the agent");
            restored = FALSE;
        }
        vm_trace_mark(trace, "restore saved image");
        if (restored) {
            g_autofree char *identity = NULL, *known_hosts = NULL;
            HostdSshTarget target;

            hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
            if (hostd_serial_resume(ctx, &target, dom))
                vm_trace_mark(trace, "ssh session carried over");
        }
        if (virDomainGetState(dom, &state, &reason, 0) == 0 && state == VIR_DOMAIN_PAUSED &&
            virDomainResume(dom) < 0)
            return hostd_libvirt_throw(error, "cannot resume the restored agent");
    } else {
        virResetLastError();
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is %s; start it with: vmctl start %s", r->name,
                        hostd_libvirt_state_name(dom), r->name);
    }
    *ret_clock = hostd_guest_sync_clock_begin(ctx, dom, r->name);
    hostd_agent_set_wanted((HostdAgentRecord *)r, HOSTD_WANTED_RUNNING);
    return TRUE;
}

gboolean
hostd_power_wake(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return FALSE;
    return hostd_power_wake_locked(ctx, r, dom, error);
}

static gboolean
hostd_power_relay_wake(const char *agent, gpointer user_data, GError **error)
{
    HostdContext *ctx = user_data;
    g_autoptr(GError) local_error = NULL;

    /* A guest hostd booted again (a crash restart) is waited for, as a wake is. */
    if (hostd_booting_wait(ctx, agent, &local_error) && hostd_power_wake(ctx, agent, &local_error))
        return TRUE;
    hostd_context_log(ctx, "agent '%s': connection refused: %s", agent, local_error->message);
    g_propagate_error(error, g_steal_pointer(&local_error));
    return FALSE;
}

static HostdPowerState
hostd_power_state_of(virDomainPtr dom)
{
    const char *name = hostd_libvirt_state_name(dom);
    if (g_str_equal(name, "running"))
        return HOSTD_POWER_RUNNING;
    if (g_str_equal(name, "paused"))
        return HOSTD_POWER_PAUSED;
    if (g_str_equal(name, "saved"))
        return HOSTD_POWER_SAVED;
    return HOSTD_POWER_STOPPED;
}

/* One agent's idle tick. Skips agents whose lock is taken: an operation is running on them. */
static void
hostd_power_tick_agent(HostdContext *ctx, const char *name)
{
    g_autofree char *dir = hostd_agent_dir(ctx, name);
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
    if (r == NULL || !g_str_equal(r->phase, HOSTD_PHASE_READY) || r->backend_port == 0)
        return;
    GMutex *lock = hostd_name_trylock(ctx, name);
    if (lock == NULL)
        return;
    g_autoptr(HostdNameLock) held = lock;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    if (dom == NULL)
        return;

    if (g_str_equal(hostd_libvirt_state_name(dom), "running")) {
        g_autoptr(GError) checkpoint_error = NULL;
        if (!hostd_checkpoint_periodic(ctx, r, dom, &checkpoint_error))
            hostd_context_log(ctx, "agent '%s': periodic checkpoint failed: %s", name,
                              checkpoint_error->message);
    }

    struct _HostdPower *power = ctx->power;
    HostdIdlePolicy policy = {
        .never = r->idle_never,
        .pause_after_s = r->idle_pause_s,
        .save_after_s = r->idle_save_s,
    };
    HostdIdleInput input = {
        .state = hostd_power_state_of(dom),
        .cpu_percent = -1,
        .cpu_threshold = HOSTD_IDLE_CPU_THRESHOLD,
        .now = g_get_monotonic_time(),
    };
    /* No sample (not running, or libvirt could not say): CPU use stays unknown, which keeps a
     * running agent busy. */
    virDomainInfo info = {0};
    if (input.state == HOSTD_POWER_RUNNING && virDomainGetInfo(dom, &info) < 0) {
        info.nrVirtCpu = 0;
        virResetLastError();
    }

    g_mutex_lock(&power->lock);
    HostdPowerAgent *a = hostd_power_agent(power, name);
    if (input.state == HOSTD_POWER_RUNNING && info.nrVirtCpu > 0) {
        HostdCpuSample cur = {
            .cpu_time_ns = info.cpuTime, .wall_ns = input.now * 1000, .vcpus = info.nrVirtCpu};
        double percent = -1;
        if (a->have_prev && hostd_idle_cpu_percent(&a->prev, &cur, &percent))
            input.cpu_percent = percent;
        a->prev = cur;
        a->have_prev = TRUE;
    } else {
        a->have_prev = FALSE;
    }
    input.keep_awake_until = a->keep_awake_until;
    input.open_sessions = a->sessions;
    /* An agent downloading through its egress proxy is busy even with no SSH session open, and
     * so is one serving a forwarded port. */
    HostdSshForward *forwards = g_atomic_pointer_get(&ctx->forwards);
    input.open_connections =
        (ctx->relay != NULL ? hostd_relay_open_connections(ctx->relay, name) : 0) +
        hostd_egress_open_connections(ctx, name) +
        (forwards != NULL ? hostd_ssh_forward_open_connections(forwards, name) : 0);
    input.last_activity =
        MAX(MAX(a->last_session_activity,
                ctx->relay != NULL ? hostd_relay_last_activity(ctx->relay, name) : 0),
            forwards != NULL ? hostd_ssh_forward_last_activity(forwards, name) : 0);
    HostdIdleDecision d = hostd_idle_tick(&a->tracker, &policy, &input);
    g_mutex_unlock(&power->lock);

    if (d.action == HOSTD_IDLE_ACTION_PAUSE) {
        if (virDomainSuspend(dom) < 0) {
            virResetLastError();
            return;
        }
        hostd_context_log(ctx, "agent '%s' paused: %s", name, d.reason);
        hostd_agent_set_wanted(r, HOSTD_WANTED_PAUSED);
    } else if (d.action == HOSTD_IDLE_ACTION_SAVE) {
        g_autoptr(GError) checkpoint_error = NULL;
        if (!hostd_checkpoint_before_save(ctx, r, dom, &checkpoint_error))
            hostd_context_log(ctx, "agent '%s': no checkpoint before saving: %s", name,
                              checkpoint_error->message);
        /* On the one thread of every agent's ticks, with this agent's lock: bounded by the SSH
         * worker's answer deadline, once (a worker that misses it is killed, and none is
         * started again until asked). */
        hostd_ssh_pool_sleep(ctx->ssh, name);
        if (virDomainManagedSave(dom, VIR_DOMAIN_SAVE_RUNNING) < 0) {
            g_autofree char *why = hostd_libvirt_take_error("?", NULL);
            hostd_context_log(ctx, "agent '%s': cannot save: %s", name, why);
            return;
        }
        hostd_ports_hold_saved(ctx, name, r->backend_port);
        hostd_context_log(ctx, "agent '%s' saved to disk: %s", name, d.reason);
        hostd_agent_set_wanted(r, HOSTD_WANTED_SAVED);
    } else {
        return;
    }
    hostd_context_agent_event(ctx, name,
                              d.action == HOSTD_IDLE_ACTION_PAUSE ? "idle-pause" : "idle-save",
                              r->wanted, d.reason);
}

static gpointer
hostd_power_thread(gpointer data)
{
    HostdContext *ctx = data;
    struct _HostdPower *power = ctx->power;

    for (;;) {
        g_mutex_lock(&power->stop_lock);
        gint64 deadline = g_get_monotonic_time() + HOSTD_IDLE_TICK_US;
        while (!power->stopping &&
               g_cond_wait_until(&power->stop_cond, &power->stop_lock, deadline))
            ;
        gboolean stopping = power->stopping;
        g_mutex_unlock(&power->stop_lock);
        if (stopping)
            return NULL;

        g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, NULL);
        for (guint i = 0; names != NULL && i < names->len; i++)
            hostd_power_tick_agent(ctx, names->pdata[i]);
    }
}

gboolean
hostd_power_attach(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    if (ctx->relay == NULL || r->backend_port == 0)
        return TRUE;
    /* A new agent's port has been held since it was chosen. */
    int fd = hostd_ports_take_public(ctx, r->name);
    if (fd >= 0)
        return hostd_relay_add_listener(ctx->relay, r->name, fd, r->backend_port, error);
    g_autoptr(GError) local_error = NULL;
    if (hostd_relay_add(ctx->relay, r->name, r->ssh_port, r->backend_port, &local_error))
        return TRUE;
    if (!g_error_matches(local_error, VM_ERROR, VM_ERROR_NO_RESOURCES)) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    /* Another program listens there now (hostd's range lies in the ephemeral one; after a host
     * restart anything may have it): another port, recorded and said. The caller's record is
     * the one it goes on with, so it gets the port too. */
    return hostd_agent_move_port(ctx, (HostdAgentRecord *)r, FALSE, &fd, error) &&
           hostd_relay_add_listener(ctx->relay, r->name, fd, r->backend_port, error);
}

void
hostd_power_detach(HostdContext *ctx, const char *name)
{
    if (ctx->relay != NULL)
        hostd_relay_remove(ctx->relay, name);
    if (ctx->power != NULL) {
        g_mutex_lock(&ctx->power->lock);
        g_hash_table_remove(ctx->power->agents, name);
        g_mutex_unlock(&ctx->power->lock);
    }
}

gboolean
hostd_power_start(HostdContext *ctx, GPtrArray *notes, GError **error)
{
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return FALSE;

    struct _HostdPower *power = g_new0(struct _HostdPower, 1);
    g_mutex_init(&power->lock);
    g_mutex_init(&power->stop_lock);
    g_cond_init(&power->stop_cond);
    power->agents = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    ctx->power = power;
    ctx->relay = hostd_relay_new(hostd_power_relay_wake, ctx);

    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        g_autoptr(GError) local_error = NULL;
        if (!g_str_equal(r->phase, HOSTD_PHASE_READY))
            continue;
        if (!hostd_power_attach(ctx, r, &local_error))
            g_ptr_array_add(notes, g_strdup_printf("agent '%s': SSH port %u: %s", r->name,
                                                   r->ssh_port, local_error->message));
    }
    power->thread = g_thread_new("hostd-idle", hostd_power_thread, ctx);
    return TRUE;
}

void
hostd_power_stop(HostdContext *ctx)
{
    struct _HostdPower *power = ctx->power;
    if (power == NULL)
        return;
    g_mutex_lock(&power->stop_lock);
    power->stopping = TRUE;
    g_cond_signal(&power->stop_cond);
    g_mutex_unlock(&power->stop_lock);
    g_thread_join(power->thread);
    g_clear_pointer(&ctx->relay, hostd_relay_free);
    ctx->power = NULL;
    g_hash_table_unref(power->agents);
    g_mutex_clear(&power->lock);
    g_mutex_clear(&power->stop_lock);
    g_cond_clear(&power->stop_cond);
    g_free(power);
}

void
hostd_power_session_begin(HostdContext *ctx, const char *name)
{
    if (ctx->power == NULL)
        return;
    g_mutex_lock(&ctx->power->lock);
    HostdPowerAgent *a = hostd_power_agent(ctx->power, name);
    a->sessions++;
    a->last_session_activity = g_get_monotonic_time();
    g_mutex_unlock(&ctx->power->lock);
}

void
hostd_power_session_end(HostdContext *ctx, const char *name)
{
    if (ctx->power == NULL)
        return;
    g_mutex_lock(&ctx->power->lock);
    HostdPowerAgent *a = hostd_power_agent(ctx->power, name);
    if (a->sessions > 0)
        a->sessions--;
    a->last_session_activity = g_get_monotonic_time();
    g_mutex_unlock(&ctx->power->lock);
}

GVariant *
hostd_agent_suspend(HostdContext *ctx, const char *name, gboolean save, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    HostdPowerState state = hostd_power_state_of(dom);
    if (state == HOSTD_POWER_STOPPED || (state == HOSTD_POWER_SAVED) ||
        (state == HOSTD_POWER_PAUSED && !save))
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' is %s", name,
                        hostd_libvirt_state_name(dom)),
               NULL;
    if (save) {
        hostd_ssh_pool_sleep(ctx->ssh, name);
        if (virDomainManagedSave(dom, VIR_DOMAIN_SAVE_RUNNING) < 0)
            return hostd_libvirt_throw(error, "cannot save the agent"), NULL;
        hostd_ports_hold_saved(ctx, name, r->backend_port);
    } else if (virDomainSuspend(dom) < 0) {
        return hostd_libvirt_throw(error, "cannot pause the agent"), NULL;
    }
    hostd_agent_set_wanted(r, save ? HOSTD_WANTED_SAVED : HOSTD_WANTED_PAUSED);
    return hostd_agent_to_variant(ctx, r);
}

GVariant *
hostd_agent_resume(HostdContext *ctx, const char *name, GError **error)
{
    if (!hostd_power_wake(ctx, name, error))
        return NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    return r != NULL ? hostd_agent_to_variant(ctx, r) : NULL;
}

GVariant *
hostd_agent_keep_awake(HostdContext *ctx, const char *name, guint seconds, gboolean off,
                       GError **error)
{
    if (!off && !hostd_power_wake(ctx, name, error))
        return NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return NULL;
    if (ctx->power != NULL) {
        g_mutex_lock(&ctx->power->lock);
        HostdPowerAgent *a = hostd_power_agent(ctx->power, name);
        a->keep_awake_until = off ? 0
                              : seconds == 0
                                  ? G_MAXINT64
                                  : g_get_monotonic_time() + (gint64)seconds * G_USEC_PER_SEC;
        g_mutex_unlock(&ctx->power->lock);
    }
    return hostd_agent_to_variant(ctx, r);
}

gint64
hostd_power_hold_awake(HostdContext *ctx, const char *name, guint seconds)
{
    gint64 until;

    if (ctx->power == NULL)
        return 0;
    g_mutex_lock(&ctx->power->lock);
    HostdPowerAgent *a = hostd_power_agent(ctx->power, name);
    a->keep_awake_until =
        MAX(a->keep_awake_until, g_get_monotonic_time() + (gint64)seconds * G_USEC_PER_SEC);
    until = a->keep_awake_until;
    g_mutex_unlock(&ctx->power->lock);
    return until;
}

gint64
hostd_power_awake_until(HostdContext *ctx, const char *name)
{
    gint64 until = 0;

    if (ctx->power == NULL)
        return 0;
    g_mutex_lock(&ctx->power->lock);
    HostdPowerAgent *a = g_hash_table_lookup(ctx->power->agents, name);
    if (a != NULL && a->keep_awake_until > g_get_monotonic_time())
        until = a->keep_awake_until;
    g_mutex_unlock(&ctx->power->lock);
    return until;
}

GVariant *
hostd_agent_set_idle(HostdContext *ctx, const char *name, gboolean never, guint pause_s,
                     guint save_s, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    r->idle_never = never;
    r->idle_pause_s = never ? 0 : pause_s;
    r->idle_save_s = never ? 0 : save_s;
    if (!hostd_agent_record_save(r, error))
        return NULL;
    return hostd_agent_to_variant(ctx, r);
}

static gboolean
hostd_power_agent_ready(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    return hostd_power_attach(ctx, r, error);
}

const HostdComponent hostd_power_component = {
    .name = "power",
    .agent_ready = hostd_power_agent_ready,
    .agent_removed = hostd_power_detach,
    .detach = hostd_power_stop,
};
