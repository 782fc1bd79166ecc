#include "hostd-context.h"

#include <signal.h>

#include "hostd-metrics.h"

#include "vm-error.h"

G_LOCK_DEFINE_STATIC(hostd_retired);
static GPtrArray *hostd_retired_name_locks = NULL;

HostdContext *
hostd_context_new(HostdConfig *config, HostdState *state, HostdLibvirt *lv)
{
    HostdContext *ctx = g_new0(HostdContext, 1);
    ctx->config = config;
    ctx->state = state;
    ctx->lv = lv;
    ctx->ssh = hostd_ssh_pool_new();
    ctx->events = hostd_events_new(state->dir);
    ctx->metrics = hostd_metrics_new();
    g_mutex_init(&ctx->lock);
    ctx->name_locks = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    ctx->components = g_ptr_array_new();
    ctx->ids_held = g_hash_table_new(g_direct_hash, g_direct_equal);
    ctx->worker_slots = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    ctx->workers_checked = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    ctx->serial_runs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_cond_init(&ctx->serial_attached);
    ctx->booting = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_cond_init(&ctx->booted);
    return ctx;
}

gboolean
hostd_context_use_ssh_workers(HostdContext *ctx, HostdSshWorkerUserFunc worker_user, GError **error)
{
    g_autofree char *program = hostd_ssh_worker_path();
    HostdSshWorkersConfig config = {
        .program = program,
        .worker_user = worker_user,
        .worker_user_data = ctx,
    };
    uid_t uid;
    gid_t gid;

    if (!g_file_test(program, G_FILE_TEST_IS_EXECUTABLE))
        return vm_throw(error, VM_ERROR_NOT_FOUND,
                        "the SSH worker %s is not there (ssh-worker = off runs SSH in hostd)",
                        program);
    /* A worker user that cannot be is found now, not at an agent's first exec. */
    if (!hostd_config_worker_user(ctx->config, &config.change_user, &uid, &gid, error))
        return FALSE;
    config.uid = uid;
    config.gid = gid;
    ctx->ssh_workers = hostd_ssh_workers_new(&config);
    hostd_ssh_pool_set_delegate(ctx->ssh, &hostd_ssh_workers_delegate, ctx->ssh_workers);
    return TRUE;
}

void
hostd_context_free(HostdContext *ctx)
{
    if (ctx == NULL)
        return;
    /* Name locks live as long as the process: a request thread may still hold one while
     * hostd exits, so they are not freed here but kept reachable. */
    G_LOCK(hostd_retired);
    if (hostd_retired_name_locks == NULL)
        hostd_retired_name_locks = g_ptr_array_new();
    g_ptr_array_add(hostd_retired_name_locks, ctx->name_locks);
    G_UNLOCK(hostd_retired);
    for (guint i = ctx->components->len; i > 0; i--) {
        const HostdComponent *c = ctx->components->pdata[i - 1];
        if (c->detach != NULL)
            c->detach(ctx);
    }
    g_ptr_array_free(ctx->components, TRUE);
    g_hash_table_unref(ctx->ids_held);
    g_hash_table_unref(ctx->worker_slots);
    g_hash_table_unref(ctx->workers_checked);
    /* The workers closed first: a session over a virtio port still being made then fails at
     * once, and its thread, which uses the context, ends (after a guest command under way, 30 s
     * at most). */
    hostd_ssh_workers_close(ctx->ssh_workers);
    g_mutex_lock(&ctx->lock);
    while (ctx->serial_attaching > 0)
        g_cond_wait(&ctx->serial_attached, &ctx->lock);
    g_mutex_unlock(&ctx->lock);
    g_cond_clear(&ctx->serial_attached);
    g_hash_table_unref(ctx->serial_runs);
    g_clear_pointer(&ctx->held_ports, g_hash_table_unref);
    g_hash_table_unref(ctx->booting);
    g_cond_clear(&ctx->booted);
    hostd_ssh_pool_free(ctx->ssh);
    hostd_ssh_workers_free(ctx->ssh_workers);
    hostd_events_free(ctx->events);
    hostd_metrics_free(ctx->metrics);
    hostd_libvirt_close(ctx->lv);
    hostd_state_close(ctx->state);
    hostd_config_free(ctx->config);
    g_mutex_clear(&ctx->lock);
    g_free(ctx);
}

void
hostd_context_add_component(HostdContext *ctx, const HostdComponent *component)
{
    g_return_if_fail(component != NULL);
    g_ptr_array_add(ctx->components, (gpointer)component);
}

void
hostd_context_log(HostdContext *ctx, const char *fmt, ...)
{
    va_list ap;

    if (ctx->log == NULL)
        return;
    va_start(ap, fmt);
    g_autofree char *message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    ctx->log(message);
}

/* The lock of @name, made on first use; locks live as long as the context. */
static GMutex *
hostd_name_mutex(HostdContext *ctx, const char *name)
{
    g_mutex_lock(&ctx->lock);
    GMutex *m = g_hash_table_lookup(ctx->name_locks, name);
    if (m == NULL) {
        m = g_new0(GMutex, 1);
        g_mutex_init(m);
        g_hash_table_insert(ctx->name_locks, g_strdup(name), m);
    }
    g_mutex_unlock(&ctx->lock);
    return m;
}

GMutex *
hostd_name_lock(HostdContext *ctx, const char *name)
{
    GMutex *m = hostd_name_mutex(ctx, name);
    g_mutex_lock(m);
    return m;
}

GMutex *
hostd_name_trylock(HostdContext *ctx, const char *name)
{
    GMutex *m = hostd_name_mutex(ctx, name);
    return g_mutex_trylock(m) ? m : NULL;
}

void
hostd_name_unlock(GMutex *m)
{
    if (m != NULL)
        g_mutex_unlock(m);
}

void
hostd_progress(VmProgressFunc progress, gpointer data, const char *message, double fraction)
{
    if (progress != NULL)
        progress(message, fraction, data);
}

void
hostd_context_event(HostdContext *ctx, const HostdEvent *event)
{
    g_autoptr(GError) error = NULL;

    if (!hostd_events_append(ctx->events, event, &error))
        hostd_context_log(ctx, "event log: %s", error->message);
}

void
hostd_context_agent_event(HostdContext *ctx, const char *agent, const char *event,
                          const char *state, const char *detail)
{
    HostdEvent e = {.agent = agent, .event = event, .state = state, .uid = -1, .detail = detail};

    hostd_context_event(ctx, &e);
}

void
hostd_crash_point(const char *step)
{
    const char *crash_at = g_getenv("HOSTD_TEST_CRASH_AT");
    if (crash_at != NULL && g_str_equal(crash_at, step))
        raise(SIGKILL);
}

struct _HostdCluster *
hostd_context_fleet(HostdContext *ctx, GError **error)
{
    if (ctx->cluster == NULL)
        vm_throw(error, VM_ERROR_NOT_RUNNING,
                 "this host is in no fleet: hostd's configuration has no [cluster] "
                 "(docs/CLUSTER.md)");
    return ctx->cluster;
}
