/* Agents booting with nobody waiting for them (hostd-booting.h). */
#include "hostd-booting.h"

#include "hostd-agent.h"
#include "hostd-guest.h"
#include "vm-error.h"

/* One readiness attempt: how long a stopping hostd waits for a watch to notice. */
#define BOOTING_ATTEMPT_S 5
/* What a request waits beyond the boot timeout: the watch's last attempt and its hooks. */
#define BOOTING_WAIT_MARGIN_S 60

/* ctx->booting: name -> its mark's generation, so that a watch of an earlier boot, ending late,
 * does not clear the mark of a later one. */
static guint
booting_mark_locked(HostdContext *ctx, const char *name)
{
    guint generation = ++ctx->booting_generation;

    g_hash_table_insert(ctx->booting, g_strdup(name), GUINT_TO_POINTER(generation));
    return generation;
}

void
hostd_booting_mark(HostdContext *ctx, const char *name)
{
    g_mutex_lock(&ctx->lock);
    booting_mark_locked(ctx, name);
    g_mutex_unlock(&ctx->lock);
}

void
hostd_booting_clear(HostdContext *ctx, const char *name)
{
    g_mutex_lock(&ctx->lock);
    g_hash_table_remove(ctx->booting, name);
    g_cond_broadcast(&ctx->booted);
    g_mutex_unlock(&ctx->lock);
}

gboolean
hostd_booting_is(HostdContext *ctx, const char *name)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);

    return g_hash_table_contains(ctx->booting, name);
}

gboolean
hostd_booting_wait(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    gint64 deadline =
        g_get_monotonic_time() +
        (gint64)(ctx->config->boot_timeout_s + BOOTING_WAIT_MARGIN_S) * G_USEC_PER_SEC;

    while (g_hash_table_contains(ctx->booting, name)) {
        if (!g_cond_wait_until(&ctx->booted, &ctx->lock, deadline) &&
            g_hash_table_contains(ctx->booting, name))
            return vm_throw(error, VM_ERROR_TIMEOUT,
                            "agent '%s' did not finish booting within %u s", name,
                            ctx->config->boot_timeout_s);
    }
    return TRUE;
}

typedef struct {
    HostdContext *ctx;
    HostdAgentRecord *record;
    guint generation;
} BootingWatch;

/* Whether hostd is stopping: the watch gives up. */
static gboolean
booting_stopping(HostdContext *ctx)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);

    return ctx->booting_stop;
}

/* Until the guest answers SSH (TRUE), its VM stops, the boot timeout passes or hostd stops. */
static gboolean
booting_wait_guest(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    gint64 deadline = g_get_monotonic_time() + (gint64)ctx->config->boot_timeout_s * G_USEC_PER_SEC;

    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    for (;;) {
        g_autoptr(GError) local_error = NULL;
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);

        if (booting_stopping(ctx))
            return vm_throw(error, VM_ERROR_CANCELLED, "hostd is stopping");
        if (dom == NULL || !hostd_libvirt_is_active(dom)) {
            virResetLastError();
            return vm_throw(error, VM_ERROR_BAD_STATE, "its VM stopped while booting");
        }
        if (hostd_ssh_wait_ready(ctx->ssh, &target, BOOTING_ATTEMPT_S, ctx->booting_cancel,
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
booting_watch_thread(gpointer data)
{
    BootingWatch *w = data;
    HostdContext *ctx = w->ctx;
    g_autoptr(GError) error = NULL;
    gint64 start = g_get_monotonic_time();

    if (booting_wait_guest(ctx, w->record, &error)) {
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
    g_mutex_lock(&ctx->lock);
    if (GPOINTER_TO_UINT(g_hash_table_lookup(ctx->booting, w->record->name)) == w->generation)
        g_hash_table_remove(ctx->booting, w->record->name);
    ctx->booting_watches--;
    g_cond_broadcast(&ctx->booted);
    g_mutex_unlock(&ctx->lock);
    hostd_agent_record_free(w->record);
    g_free(w);
    return NULL;
}

void
hostd_booting_watch(HostdContext *ctx, const HostdAgentRecord *r)
{
    BootingWatch *w = g_new0(BootingWatch, 1);

    w->ctx = ctx;
    w->record = hostd_agent_record_copy(r);
    g_mutex_lock(&ctx->lock);
    if (ctx->booting_stop) {
        g_hash_table_remove(ctx->booting, r->name);
        g_cond_broadcast(&ctx->booted);
        g_mutex_unlock(&ctx->lock);
        hostd_agent_record_free(w->record);
        g_free(w);
        return;
    }
    w->generation = booting_mark_locked(ctx, r->name);
    ctx->booting_watches++;
    g_mutex_unlock(&ctx->lock);
    g_thread_unref(g_thread_new("hostd-booting", booting_watch_thread, w));
}

void
hostd_booting_stop(HostdContext *ctx)
{
    g_mutex_lock(&ctx->lock);
    ctx->booting_stop = TRUE;
    g_cancellable_cancel(ctx->booting_cancel);
    while (ctx->booting_watches > 0)
        g_cond_wait(&ctx->booted, &ctx->lock);
    g_mutex_unlock(&ctx->lock);
}
