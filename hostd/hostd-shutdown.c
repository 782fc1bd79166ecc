#include "hostd-shutdown.h"

#include "hostd-agent.h"
#include "vm-error.h"

typedef struct {
    HostdContext *ctx;
    const char *why;
    gint64 deadline; /* monotonic us */
    GMutex lock;     /* guards the rest */
    GCond done_cond;
    guint pending;
    GHashTable
        *busy; /* name -> virDomainPtr being saved (borrowed), for aborting at the deadline */
    GVariant **results; /* per agent, in the order of the records; NULL: nothing to report */
} SaveAll;

typedef struct {
    char *name;
    guint index;
} SaveAllJob;

/* Takes @name's lock, waiting for an operation that holds it until the deadline. */
static GMutex *
save_all_lock(SaveAll *all, const char *name)
{
    for (;;) {
        GMutex *lock = hostd_name_trylock(all->ctx, name);
        if (lock != NULL || g_get_monotonic_time() >= all->deadline)
            return lock;
        g_usleep(100 * 1000);
    }
}

static void
save_all_result(SaveAll *all, guint index, const char *name, gboolean saved, double seconds,
                const char *why)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(name));
    g_variant_builder_add(&b, "{sv}", "saved", g_variant_new_boolean(saved));
    g_variant_builder_add(&b, "{sv}", "seconds", g_variant_new_double(seconds));
    if (why != NULL)
        g_variant_builder_add(&b, "{sv}", "error", g_variant_new_string(why));
    all->results[index] = g_variant_ref_sink(g_variant_builder_end(&b));
}

/* One agent: saved, or left as it is with the reason in the results. */
static void
save_all_agent(SaveAll *all, guint index, const char *name)
{
    HostdContext *ctx = all->ctx;
    gint64 start = g_get_monotonic_time();
    g_autoptr(GError) error = NULL;

    GMutex *lock = save_all_lock(all, name);
    if (lock == NULL) {
        save_all_result(all, index, name, FALSE, 0, "out of time: an operation held the agent");
        return;
    }
    g_autoptr(HostdNameLock) held = lock;
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, NULL);
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    if (r == NULL || dom == NULL || !hostd_libvirt_is_active(dom)) {
        virResetLastError();
        return; /* gone, or stopped meanwhile: nothing to save */
    }
    hostd_ssh_pool_sleep(ctx->ssh, name);
    g_mutex_lock(&all->lock);
    g_hash_table_insert(all->busy, g_strdup(name), dom);
    g_mutex_unlock(&all->lock);
    /* Flags 0: a paused agent comes back paused, a running one running. */
    gboolean saved = virDomainManagedSave(dom, 0) == 0;
    if (!saved)
        hostd_libvirt_throw(&error, "cannot save");
    g_mutex_lock(&all->lock);
    g_hash_table_remove(all->busy, name);
    g_mutex_unlock(&all->lock);

    double seconds = (g_get_monotonic_time() - start) / 1e6;
    if (!saved) {
        save_all_result(all, index, name, FALSE, seconds, error->message);
        return;
    }
    r->shutdown_saved = TRUE; /* kept by hostd_agent_set_wanted(), which writes the record */
    hostd_agent_set_wanted(r, HOSTD_WANTED_SAVED);
    g_autofree char *detail = g_strdup_printf("saved to disk in %.1f s: %s", seconds, all->why);
    hostd_context_agent_event(ctx, name, "saved", "saved", detail);
    save_all_result(all, index, name, TRUE, seconds, NULL);
}

static void
save_all_job(gpointer data, gpointer user_data)
{
    SaveAllJob *job = data;
    SaveAll *all = user_data;

    if (g_get_monotonic_time() < all->deadline)
        save_all_agent(all, job->index, job->name);
    else
        save_all_result(all, job->index, job->name, FALSE, 0, "out of time: not started");
    g_free(job->name);
    g_free(job);
    g_mutex_lock(&all->lock);
    all->pending--;
    g_cond_signal(&all->done_cond);
    g_mutex_unlock(&all->lock);
}

GVariant *
hostd_save_all(HostdContext *ctx, guint timeout_s, const char *why, double *ret_seconds)
{
    gint64 start = g_get_monotonic_time();
    SaveAll all = {
        .ctx = ctx,
        .why = why,
        .deadline = start + (gint64)timeout_s * G_USEC_PER_SEC,
        .busy = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
    };
    g_mutex_init(&all.lock);
    g_cond_init(&all.done_cond);

    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, NULL);
    guint count = records != NULL ? records->len : 0;
    all.results = g_new0(GVariant *, count + 1);
    GThreadPool *pool = g_thread_pool_new(save_all_job, &all, HOSTD_SAVE_ALL_JOBS, FALSE, NULL);
    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        g_autoptr(virDomain) dom = NULL;
        if (!g_str_equal(r->phase, HOSTD_PHASE_READY) ||
            (dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL)) == NULL ||
            !hostd_libvirt_is_active(dom)) {
            virResetLastError();
            continue;
        }
        g_mutex_lock(&all.lock);
        all.pending++;
        g_mutex_unlock(&all.lock);
        SaveAllJob *job = g_new0(SaveAllJob, 1);
        job->name = g_strdup(r->name);
        job->index = i;
        g_thread_pool_push(pool, job, NULL);
    }

    /* At the deadline the saves under way are aborted (the agents go on running); the jobs
     * not started yet see the deadline and give up at once. */
    gboolean aborted = FALSE;
    g_mutex_lock(&all.lock);
    while (all.pending > 0) {
        if (aborted) {
            g_cond_wait(&all.done_cond, &all.lock);
        } else if (!g_cond_wait_until(&all.done_cond, &all.lock, all.deadline)) {
            GHashTableIter iter;
            gpointer dom;
            g_hash_table_iter_init(&iter, all.busy);
            while (g_hash_table_iter_next(&iter, NULL, &dom)) {
                if (virDomainAbortJob(dom) < 0)
                    virResetLastError();
            }
            aborted = TRUE;
        }
    }
    g_mutex_unlock(&all.lock);
    g_thread_pool_free(pool, FALSE, TRUE);

    *ret_seconds = (g_get_monotonic_time() - start) / 1e6;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < count; i++) {
        if (all.results[i] == NULL)
            continue;
        g_variant_builder_add_value(&b, all.results[i]);
        g_variant_unref(all.results[i]);
    }
    g_free(all.results);
    g_hash_table_unref(all.busy);
    g_mutex_clear(&all.lock);
    g_cond_clear(&all.done_cond);
    return g_variant_builder_end(&b);
}
