#include "hostd-supervise.h"

#include "hostd-agent.h"
#include "hostd-booting.h"
#include "hostd-guest.h"
#include "hostd-power.h"
#include "hostd-resources.h"
#include "vm-error.h"

#define SUPERVISE_TICK_US       (5 * G_USEC_PER_SEC)
#define SUPERVISE_RETRY_US      (1 * G_USEC_PER_SEC) /* an agent whose lock an operation holds */
#define SUPERVISE_BACKOFF_MAX_S 60
/* One readiness attempt of a boot's watch: how long a stopping hostd waits for it at most. */
#define SUPERVISE_WATCH_ATTEMPT_S 5
/* Agents resumed (shutdown-resume eager) or stopped at once at start-up. */
#define SUPERVISE_RESUME_JOBS 4
/* One reboot from inside resets the machine more than once (the kernel, then the firmware):
 * resets this close to the last one are the same reboot. */
#define SUPERVISE_REBOOT_SAME_US (20 * G_USEC_PER_SEC)

/* Why the supervisor looks at an agent, strongest last: a deferred look keeps the strongest. */
typedef enum {
    SUPERVISE_CHECK,     /* the periodic look: no event was seen */
    SUPERVISE_REBOOT,    /* the guest rebooted itself (the domain stays running) */
    SUPERVISE_DESTROYED, /* the domain was destroyed, and not by a verb that wanted it so */
    SUPERVISE_POWEROFF,  /* the guest powered itself off */
    SUPERVISE_FAILED,    /* QEMU ended without a shutdown: killed, crashed, out of memory */
    SUPERVISE_PANIC,     /* the guest crashed (panic device) */
    SUPERVISE_RESTART,   /* a crashed agent's backoff is over: boot it */
} SuperviseCause;

typedef struct {
    char *name; /* NULL: the supervisor is stopping */
    SuperviseCause cause;
} SuperviseJob;

typedef struct {
    SuperviseCause cause;
    gint64 due; /* monotonic us */
} SuperviseDeferred;

struct _HostdSupervisor {
    GAsyncQueue *jobs;    /* SuperviseJob*, from libvirt's event thread */
    GHashTable *deferred; /* name -> SuperviseDeferred*; the supervisor thread's alone */
    GHashTable *down;     /* names the last periodic look found down (the thread's alone) */
    GHashTable *rebooted; /* name -> monotonic us of its last reboot (the thread's alone) */
    GThread *thread;
    HostdLibvirt *lv; /* events name domains: their agents' names through its aliases */
    int lifecycle_id;
    int reboot_id;
    /* The watches of agents it booted (supervise_watch()): */
    GMutex watch_lock;
    GCond watch_ended;
    guint watches;        /* guarded by watch_lock */
    gboolean stopping;    /* guarded by watch_lock: no new watch */
    GCancellable *cancel; /* cancelled as it stops: the watches' waits end */
};

guint
hostd_supervise_backoff_s(guint count)
{
    if (count <= 1)
        return 0;
    if (count > 7)
        return SUPERVISE_BACKOFF_MAX_S;
    return MIN(1u << (count - 1), SUPERVISE_BACKOFF_MAX_S);
}

static void
supervise_job_free(SuperviseJob *job)
{
    g_free(job->name);
    g_free(job);
}

static void
supervise_push(struct _HostdSupervisor *sv, const char *name, SuperviseCause cause)
{
    SuperviseJob *job = g_new0(SuperviseJob, 1);
    job->name = g_strdup(name);
    job->cause = cause;
    g_async_queue_push(sv->jobs, job);
}

/* libvirt's event thread: hand the event over, never block here. */
static int
supervise_on_lifecycle(virConnectPtr conn, virDomainPtr dom, int event, int detail, void *opaque)
{
    struct _HostdSupervisor *sv = opaque;
    g_autofree char *name = hostd_libvirt_agent_name(sv->lv, dom);

    if (name == NULL)
        return 0;
    if (event == VIR_DOMAIN_EVENT_CRASHED) {
        supervise_push(sv, name, SUPERVISE_PANIC);
    } else if (event == VIR_DOMAIN_EVENT_STOPPED) {
        switch (detail) {
        case VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN:
            supervise_push(sv, name, SUPERVISE_POWEROFF);
            break;
        case VIR_DOMAIN_EVENT_STOPPED_FAILED:
            supervise_push(sv, name, SUPERVISE_FAILED);
            break;
        case VIR_DOMAIN_EVENT_STOPPED_CRASHED:
            supervise_push(sv, name, SUPERVISE_PANIC);
            break;
        case VIR_DOMAIN_EVENT_STOPPED_DESTROYED:
            supervise_push(sv, name, SUPERVISE_DESTROYED);
            break;
        default: /* saved, migrated, from a snapshot: a verb did it and says what it wants */
            break;
        }
    }
    return 0;
}

static void
supervise_on_reboot(virConnectPtr conn, virDomainPtr dom, void *opaque)
{
    struct _HostdSupervisor *sv = opaque;
    g_autofree char *name = hostd_libvirt_agent_name(sv->lv, dom);

    if (name != NULL)
        supervise_push(sv, name, SUPERVISE_REBOOT);
}

static void
supervise_defer(struct _HostdSupervisor *sv, const char *name, SuperviseCause cause, gint64 due)
{
    SuperviseDeferred *d = g_hash_table_lookup(sv->deferred, name);

    if (d == NULL) {
        d = g_new0(SuperviseDeferred, 1);
        d->cause = cause;
        d->due = due;
        g_hash_table_insert(sv->deferred, g_strdup(name), d);
        return;
    }
    d->cause = MAX(d->cause, cause);
    d->due = MIN(d->due, due);
}

static void
supervise_event(HostdContext *ctx, const HostdAgentRecord *r, const char *event, const char *state,
                const char *detail)
{
    hostd_context_log(ctx, "agent '%s': %s", r->name, detail);
    hostd_context_agent_event(ctx, r->name, event, state, detail);
}

/* What the user wants, for records written before there was a wanted state: what it is now. */
static void
supervise_adopt(HostdAgentRecord *r, const char *state)
{
    const char *wanted = HOSTD_WANTED_STOPPED;

    if (g_str_equal(state, "running") || g_str_equal(state, "starting"))
        wanted = HOSTD_WANTED_RUNNING;
    else if (g_str_equal(state, "paused"))
        wanted = HOSTD_WANTED_PAUSED;
    else if (g_str_equal(state, "saved"))
        wanted = HOSTD_WANTED_SAVED;
    g_free(r->wanted);
    r->wanted = g_strdup(wanted);
    hostd_agent_record_save(r, NULL);
}

/* Whether @r should have a QEMU: wanted running or paused. */
static gboolean
supervise_wants_up(const HostdAgentRecord *r)
{
    return r->wanted != NULL && (g_str_equal(r->wanted, HOSTD_WANTED_RUNNING) ||
                                 g_str_equal(r->wanted, HOSTD_WANTED_PAUSED));
}

/* Whether @state (hostd_libvirt_state_name()) means no QEMU and no saved image. */
static gboolean
supervise_state_is_down(const char *state)
{
    return g_str_equal(state, "stopped") || g_str_equal(state, "crashed");
}

typedef struct {
    HostdContext *ctx;
    HostdAgentRecord *record;
    guint generation;
} SuperviseWatch;

/* Until @r's guest answers SSH (TRUE), its VM stops, the boot timeout passes or the supervisor
 * stops. */
static gboolean
supervise_wait_guest(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    struct _HostdSupervisor *sv = ctx->supervisor;
    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    gint64 deadline = g_get_monotonic_time() + (gint64)ctx->config->boot_timeout_s * G_USEC_PER_SEC;

    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    for (;;) {
        g_autoptr(GError) local_error = NULL;
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);

        if (g_cancellable_is_cancelled(sv->cancel))
            return vm_throw(error, VM_ERROR_CANCELLED, "hostd is stopping");
        if (dom == NULL || !hostd_libvirt_is_active(dom)) {
            virResetLastError();
            return vm_throw(error, VM_ERROR_BAD_STATE, "its VM stopped while booting");
        }
        if (hostd_ssh_wait_ready(ctx->ssh, &target, SUPERVISE_WATCH_ATTEMPT_S, sv->cancel,
                                 &local_error))
            return TRUE;
        if (!g_error_matches(local_error, VM_ERROR, VM_ERROR_TIMEOUT)) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        if (g_get_monotonic_time() >= deadline)
            return vm_throw(error, VM_ERROR_TIMEOUT, "it did not answer SSH within %u s",
                            ctx->config->boot_timeout_s);
    }
}

static gpointer
supervise_watch_thread(gpointer data)
{
    SuperviseWatch *w = data;
    HostdContext *ctx = w->ctx;
    struct _HostdSupervisor *sv = ctx->supervisor;
    g_autoptr(GError) error = NULL;
    gint64 start = g_get_monotonic_time();

    if (supervise_wait_guest(ctx, w->record, &error)) {
        /* As a waited-for start: the hooks with the agent's lock, on the record as it is now. */
        g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, w->record->name);
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, w->record->name, NULL);

        if (r != NULL)
            hostd_agent_emit_up(ctx, r);
        hostd_context_log(ctx, "agent '%s': its guest answers, %.1f s after its boot",
                          w->record->name, (g_get_monotonic_time() - start) / 1e6);
    } else if (!g_error_matches(error, VM_ERROR, VM_ERROR_CANCELLED)) {
        hostd_context_log(ctx, "agent '%s': booted by hostd, %s", w->record->name, error->message);
    }
    hostd_booting_done(ctx, w->record->name, w->generation);
    hostd_agent_record_free(w->record);
    g_free(w);
    g_mutex_lock(&sv->watch_lock);
    sv->watches--;
    g_cond_broadcast(&sv->watch_ended);
    g_mutex_unlock(&sv->watch_lock);
    return NULL;
}

/* With @r's lock held, its domain just started: @r is starting (hostd-booting.h) until its guest
 * answers SSH, watched in the background; then, with its lock, the agent_up hooks run as after a
 * waited-for start. */
static void
supervise_watch(HostdContext *ctx, const HostdAgentRecord *r)
{
    struct _HostdSupervisor *sv = ctx->supervisor;
    SuperviseWatch *w = g_new0(SuperviseWatch, 1);

    w->ctx = ctx;
    w->record = hostd_agent_record_copy(r);
    w->generation = hostd_booting_mark(ctx, r->name);
    g_mutex_lock(&sv->watch_lock);
    gboolean stopping = sv->stopping;
    if (!stopping)
        sv->watches++;
    g_mutex_unlock(&sv->watch_lock);
    if (stopping) {
        hostd_booting_done(ctx, r->name, w->generation);
        hostd_agent_record_free(w->record);
        g_free(w);
        return;
    }
    g_thread_unref(g_thread_new("hostd-watch-boot", supervise_watch_thread, w));
}

/* Boots @r again; its RAM is gone, so what it wants is running whatever it was. */
static gboolean
supervise_boot(HostdContext *ctx, HostdAgentRecord *r, virDomainPtr dom, GError **error)
{
    if (!hostd_agent_boot_locked(ctx, r, dom, error))
        return FALSE;
    hostd_agent_set_wanted(r, HOSTD_WANTED_RUNNING);
    return TRUE;
}

static const char *
supervise_cause_text(SuperviseCause cause)
{
    switch (cause) {
    case SUPERVISE_FAILED:
        return "its QEMU ended without a shutdown (killed, crashed or out of memory)";
    case SUPERVISE_PANIC:
        return "the guest crashed";
    case SUPERVISE_DESTROYED:
        return "its VM was destroyed from outside hostd";
    case SUPERVISE_POWEROFF:
        return "the guest powered itself off";
    case SUPERVISE_CHECK:
    case SUPERVISE_REBOOT:
    case SUPERVISE_RESTART:
    default:
        return "its QEMU is gone";
    }
}

static void supervise_crashed(HostdContext *ctx, HostdAgentRecord *r, virDomainPtr dom,
                              const char *why);

/* Boots a crashed @r again; a boot that fails is one more crash. */
static void
supervise_restart(HostdContext *ctx, HostdAgentRecord *r, virDomainPtr dom)
{
    g_autoptr(GError) error = NULL;

    if (supervise_boot(ctx, r, dom, &error)) {
        supervise_watch(ctx, r);
        supervise_event(ctx, r, "restarted", "starting",
                        "booted again from its disk after a crash");
        return;
    }
    hostd_booting_done(ctx, r->name, 0);
    g_autofree char *failed = g_strdup_printf("cannot boot it again: %s", error->message);
    supervise_crashed(ctx, r, dom, failed);
}

/* A crash of @r (wanted running or paused, domain down): count it, then restart now, later
 * (deferred), or give up and leave it crashed. */
static void
supervise_crashed(HostdContext *ctx, HostdAgentRecord *r, virDomainPtr dom, const char *why)
{
    struct _HostdSupervisor *sv = ctx->supervisor;
    const HostdConfig *config = ctx->config;
    gint64 now = g_get_real_time() / G_USEC_PER_SEC;

    g_clear_pointer(&r->crashed, g_free);
    if (g_str_equal(r->restart, HOSTD_RESTART_NEVER) || config->restart_limit == 0) {
        r->crashed = g_strdup(why);
        hostd_agent_set_wanted(r, HOSTD_WANTED_STOPPED);
        g_autofree char *detail = g_strdup_printf("%s; not restarted (restart: never)", why);
        supervise_event(ctx, r, "crashed", "crashed", detail);
        return;
    }
    if (now - r->crash_window >= (gint64)config->restart_window_s || now < r->crash_window) {
        r->crash_window = now;
        r->crash_count = 0;
    }
    r->crash_count++;
    if (r->crash_count > config->restart_limit) {
        r->crashed = g_strdup_printf("%s; %u crashes within %us", why, r->crash_count,
                                     config->restart_window_s);
        hostd_agent_set_wanted(r, HOSTD_WANTED_STOPPED);
        g_autofree char *detail =
            g_strdup_printf("%s; gave up, `vmctl start %s` to try again", r->crashed, r->name);
        supervise_event(ctx, r, "crashed", "crashed", detail);
        return;
    }
    hostd_agent_record_save(r, NULL);
    guint delay = hostd_supervise_backoff_s(r->crash_count);
    /* Booted again at once: starting from now, for a look or a request in between. */
    if (delay == 0)
        hostd_booting_mark(ctx, r->name);
    g_autofree char *detail =
        g_strdup_printf("%s; restart %u of %u within %us, in %us", why, r->crash_count,
                        config->restart_limit, config->restart_window_s, delay);
    supervise_event(ctx, r, "crashed", "stopped", detail);
    if (delay > 0)
        supervise_defer(sv, r->name, SUPERVISE_RESTART,
                        g_get_monotonic_time() + (gint64)delay * G_USEC_PER_SEC);
    else
        supervise_restart(ctx, r, dom);
}

/* Looks at one agent with its lock held and brings it in line with what the user wants. */
static void
supervise_agent_locked(HostdContext *ctx, HostdAgentRecord *r, virDomainPtr dom,
                       SuperviseCause cause)
{
    const char *state = hostd_libvirt_state_name(dom);

    if (r->wanted == NULL)
        supervise_adopt(r, state);
    if (cause == SUPERVISE_REBOOT) {
        struct _HostdSupervisor *sv = ctx->supervisor;
        gint64 now = g_get_monotonic_time();
        gpointer last = NULL;
        /* The same QEMU, a new guest: every session to the old one is gone, and the one over
         * the virtio port would not say so (its host end stays connected), so a command sent on
         * it would wait for ever. Requests under way fail; the next exec connects anew. */
        hostd_ssh_pool_forget(ctx->ssh, r->name);
        if (g_hash_table_lookup_extended(sv->rebooted, r->name, NULL, &last) &&
            now - *(gint64 *)last < SUPERVISE_REBOOT_SAME_US)
            return;
        gint64 *stamp = g_new(gint64, 1);
        *stamp = now;
        g_hash_table_insert(sv->rebooted, g_strdup(r->name), stamp);
        supervise_event(ctx, r, "reboot", state, "the guest rebooted itself");
        return;
    }
    if (!supervise_state_is_down(state) || !supervise_wants_up(r))
        return; /* stopped or saved as wanted (a saved agent's image is the driver's to keep) */

    if (cause == SUPERVISE_POWEROFF && !g_str_equal(r->restart, HOSTD_RESTART_ALWAYS)) {
        hostd_agent_set_wanted(r, HOSTD_WANTED_STOPPED);
        supervise_event(ctx, r, "poweroff", "stopped",
                        "the guest powered itself off; left stopped");
        return;
    }
    g_autoptr(GError) error = NULL;
    if (cause == SUPERVISE_POWEROFF) {
        if (supervise_boot(ctx, r, dom, &error)) {
            supervise_watch(ctx, r);
            supervise_event(ctx, r, "restarted", "starting",
                            "the guest powered itself off; booted again (restart: always)");
        } else {
            supervise_crashed(ctx, r, dom, error->message);
        }
        return;
    }
    if (cause == SUPERVISE_RESTART) {
        if (r->crashed == NULL) /* else given up meanwhile */
            supervise_restart(ctx, r, dom);
        return;
    }
    supervise_crashed(ctx, r, dom, supervise_cause_text(cause));
}

static void
supervise_agent(HostdContext *ctx, const char *name, SuperviseCause cause)
{
    GMutex *lock = hostd_name_trylock(ctx, name);
    if (lock == NULL) {
        /* An operation holds the agent: look again once it is done, with what it leaves. */
        supervise_defer(ctx->supervisor, name, cause, g_get_monotonic_time() + SUPERVISE_RETRY_US);
        return;
    }
    g_autoptr(HostdNameLock) held = lock;
    g_autofree char *dir = hostd_agent_dir(ctx, name);
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
    if (r == NULL || !g_str_equal(r->phase, HOSTD_PHASE_READY))
        return;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    if (dom == NULL) {
        virResetLastError();
        return;
    }
    supervise_agent_locked(ctx, r, dom, cause);
}

/* The periodic look: agents that should be up and are down without an event having said so.
 * Only what two looks in a row find down is acted on, so that the event, which says why, wins. */
static void
supervise_tick(HostdContext *ctx)
{
    struct _HostdSupervisor *sv = ctx->supervisor;
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, NULL);
    g_autoptr(GHashTable) down = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (!g_str_equal(r->phase, HOSTD_PHASE_READY) || !supervise_wants_up(r) ||
            g_hash_table_contains(sv->deferred, r->name))
            continue;
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);
        if (dom == NULL) {
            virResetLastError();
            continue;
        }
        if (!hostd_libvirt_is_active(dom) && virDomainHasManagedSaveImage(dom, 0) == 0) {
            if (g_hash_table_contains(sv->down, r->name))
                supervise_agent(ctx, r->name, SUPERVISE_CHECK);
            else
                g_hash_table_add(down, g_strdup(r->name));
        }
        virResetLastError();
    }
    g_hash_table_unref(sv->down);
    sv->down = g_steal_pointer(&down);
}

static gpointer
supervise_thread(gpointer data)
{
    HostdContext *ctx = data;
    struct _HostdSupervisor *sv = ctx->supervisor;
    gint64 next_tick = g_get_monotonic_time() + SUPERVISE_TICK_US;

    for (;;) {
        gint64 now = g_get_monotonic_time();
        gint64 wake = next_tick;
        GHashTableIter iter;
        gpointer key, value;

        g_hash_table_iter_init(&iter, sv->deferred);
        while (g_hash_table_iter_next(&iter, NULL, &value))
            wake = MIN(wake, ((SuperviseDeferred *)value)->due);
        SuperviseJob *job = g_async_queue_timeout_pop(sv->jobs, MAX(wake - now, 0));
        if (job != NULL && job->name == NULL) {
            supervise_job_free(job);
            return NULL;
        }
        if (job != NULL) {
            /* An event about an agent that waits out a backoff changes nothing: it is down. */
            if (!g_hash_table_contains(sv->deferred, job->name))
                supervise_agent(ctx, job->name, job->cause);
            supervise_job_free(job);
        }

        now = g_get_monotonic_time();
        g_autoptr(GPtrArray) due = g_ptr_array_new_with_free_func(g_free);
        g_autoptr(GArray) causes = g_array_new(FALSE, FALSE, sizeof(SuperviseCause));
        g_hash_table_iter_init(&iter, sv->deferred);
        while (g_hash_table_iter_next(&iter, &key, &value)) {
            SuperviseDeferred *d = value;
            if (d->due > now)
                continue;
            g_ptr_array_add(due, g_strdup(key));
            g_array_append_val(causes, d->cause);
            g_hash_table_iter_remove(&iter);
        }
        for (guint i = 0; i < due->len; i++)
            supervise_agent(ctx, due->pdata[i], g_array_index(causes, SuperviseCause, i));
        if (now >= next_tick) {
            supervise_tick(ctx);
            next_tick = g_get_monotonic_time() + SUPERVISE_TICK_US;
        }
    }
}

/* Work start-up leaves to a pool, so that one slow agent does not hold the others back. */
typedef struct {
    char *name;
    gboolean stop; /* finish a stop (else: resume a saved agent) */
} SuperviseStartJob;

static SuperviseStartJob *
supervise_start_job_new(const char *name, gboolean stop)
{
    SuperviseStartJob *job = g_new0(SuperviseStartJob, 1);
    job->name = g_strdup(name);
    job->stop = stop;
    return job;
}

static void
supervise_start_job_free(SuperviseStartJob *job)
{
    g_free(job->name);
    g_free(job);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(SuperviseStartJob, supervise_start_job_free)

/* Start-up, one agent: what was running or paused and is down lost its QEMU while hostd was
 * away; boot it. One whose record says stopped but whose VM runs was being stopped when hostd
 * ended (stop writes the record first): the stop is finished (@jobs). */
static void
supervise_recover(HostdContext *ctx, const char *name, GPtrArray *jobs)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, NULL))
        return;
    const char *state = hostd_libvirt_state_name(dom);
    if (r->wanted == NULL)
        supervise_adopt(r, state);
    if (g_str_equal(state, "saved") && r->shutdown_saved && ctx->config->shutdown_resume_eager) {
        g_ptr_array_add(jobs, supervise_start_job_new(name, FALSE));
        return;
    }
    /* A saved agent's forward port, kept from other programs until its wake. */
    if (g_str_equal(state, "saved"))
        hostd_ports_hold_saved(ctx, name, r->backend_port);
    if (g_str_equal(r->wanted, HOSTD_WANTED_STOPPED) &&
        (g_str_equal(state, "running") || g_str_equal(state, "paused"))) {
        g_ptr_array_add(jobs, supervise_start_job_new(name, TRUE));
        return;
    }
    if (!supervise_state_is_down(state) || !supervise_wants_up(r))
        return;
    g_autoptr(GError) error = NULL;
    if (!supervise_boot(ctx, r, dom, &error)) {
        supervise_crashed(ctx, r, dom, error->message);
        return;
    }
    supervise_watch(ctx, r);
    supervise_event(ctx, r, "recovered", "starting",
                    "its QEMU was gone when hostd started (host restart or power loss?): booted "
                    "from its disk; what was in its RAM is lost");
}

/* Start-up, one agent whose stop hostd's end cut short: the same stop again, as the user asked
 * it (a shutdown, then the VM destroyed if the guest does not go down in time). */
static void
supervise_finish_stop(HostdContext *ctx, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) info = hostd_agent_stop(ctx, name, FALSE, 0, NULL, NULL, &error);
    if (info == NULL) {
        hostd_context_log(ctx, "agent '%s': cannot finish its stop: %s", name, error->message);
        return;
    }
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, NULL);
    if (r != NULL)
        supervise_event(ctx, r, "stopped", "stopped",
                        "its stop was cut short when hostd ended: finished at start-up");
}

/* Start-up, one agent saved by the last shutdown, with shutdown-resume = eager. */
static void
supervise_resume(HostdContext *ctx, const char *name)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    g_autoptr(GError) error = NULL;
    gint64 start = g_get_monotonic_time();

    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, NULL))
        return;
    if (!hostd_power_wake_locked(ctx, r, dom, &error)) {
        hostd_context_log(ctx, "agent '%s': cannot resume after the shutdown: %s", name,
                          error->message);
        return;
    }
    g_autofree char *detail =
        g_strdup_printf("resumed as saved at the last shutdown (shutdown-resume = eager) in %.1f s",
                        (g_get_monotonic_time() - start) / 1e6);
    supervise_event(ctx, r, "resumed", "running", detail);
}

static void
supervise_run_job(gpointer data, gpointer user_data)
{
    g_autoptr(SuperviseStartJob) job = data;

    if (job->stop)
        supervise_finish_stop(user_data, job->name);
    else
        supervise_resume(user_data, job->name);
}

GVariant *
hostd_agent_set_restart(HostdContext *ctx, const char *name, const char *policy, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!hostd_restart_policy_is_valid(policy))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "restart policy must be on-crash, always or never, not '%s'", policy),
               NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    g_free(r->restart);
    r->restart = g_strdup(policy);
    if (!hostd_agent_record_save(r, error))
        return NULL;
    return hostd_agent_to_variant(ctx, r);
}

gboolean
hostd_supervise_start(HostdContext *ctx, GError **error)
{
    struct _HostdSupervisor *sv = g_new0(struct _HostdSupervisor, 1);
    sv->jobs = g_async_queue_new_full((GDestroyNotify)supervise_job_free);
    sv->deferred = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    sv->down = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    sv->rebooted = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    sv->lifecycle_id = sv->reboot_id = -1;
    g_mutex_init(&sv->watch_lock);
    g_cond_init(&sv->watch_ended);
    sv->cancel = g_cancellable_new();
    sv->lv = ctx->lv;
    ctx->supervisor = sv;

    sv->lifecycle_id = virConnectDomainEventRegisterAny(
        ctx->lv->conn, NULL, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
        VIR_DOMAIN_EVENT_CALLBACK(supervise_on_lifecycle), sv, NULL);
    sv->reboot_id =
        virConnectDomainEventRegisterAny(ctx->lv->conn, NULL, VIR_DOMAIN_EVENT_ID_REBOOT,
                                         VIR_DOMAIN_EVENT_CALLBACK(supervise_on_reboot), sv, NULL);
    if (sv->lifecycle_id < 0 || sv->reboot_id < 0) {
        hostd_libvirt_throw(error, "cannot watch the agents' VMs");
        hostd_supervise_stop(ctx);
        return FALSE;
    }

    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, NULL);
    g_autoptr(GPtrArray) jobs = g_ptr_array_new();
    for (guint i = 0; names != NULL && i < names->len; i++)
        supervise_recover(ctx, names->pdata[i], jobs);
    if (jobs->len > 0) {
        GThreadPool *pool =
            g_thread_pool_new(supervise_run_job, ctx, SUPERVISE_RESUME_JOBS, FALSE, NULL);
        for (guint i = 0; i < jobs->len; i++)
            g_thread_pool_push(pool, jobs->pdata[i], NULL);
        g_thread_pool_free(pool, FALSE, TRUE);
    }
    sv->thread = g_thread_new("hostd-supervise", supervise_thread, ctx);
    return TRUE;
}

void
hostd_supervise_stop(HostdContext *ctx)
{
    struct _HostdSupervisor *sv = ctx->supervisor;

    if (sv == NULL)
        return;
    if (sv->lifecycle_id >= 0)
        virConnectDomainEventDeregisterAny(ctx->lv->conn, sv->lifecycle_id);
    if (sv->reboot_id >= 0)
        virConnectDomainEventDeregisterAny(ctx->lv->conn, sv->reboot_id);
    if (sv->thread != NULL) {
        g_async_queue_push(sv->jobs, g_new0(SuperviseJob, 1));
        g_thread_join(sv->thread);
    }
    /* The watches run the components' hooks and use the supervisor: they end first. */
    g_mutex_lock(&sv->watch_lock);
    sv->stopping = TRUE;
    g_cancellable_cancel(sv->cancel);
    while (sv->watches > 0)
        g_cond_wait(&sv->watch_ended, &sv->watch_lock);
    g_mutex_unlock(&sv->watch_lock);
    g_object_unref(sv->cancel);
    g_mutex_clear(&sv->watch_lock);
    g_cond_clear(&sv->watch_ended);
    ctx->supervisor = NULL;
    g_async_queue_unref(sv->jobs);
    g_hash_table_unref(sv->deferred);
    g_hash_table_unref(sv->down);
    g_hash_table_unref(sv->rebooted);
    g_free(sv);
}

const HostdComponent hostd_supervise_component = {
    .name = "supervise",
    .detach = hostd_supervise_stop,
};
