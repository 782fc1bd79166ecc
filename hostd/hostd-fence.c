#include "hostd-fence.h"

#include "hostd-cluster.h"
#include "hostd-libvirt.h"
#include "vm-error.h"

/* Takes @name's lock (with @wait, else only when it is free) and loads its record; NULL
 * (nothing held) when it has none or the lock is busy. Not hostd_agent_lock_load(): the agent
 * module asks this one, so this one does not ask it. */
static HostdAgentRecord *
hostd_fence_lock_load(HostdContext *ctx, const char *name, gboolean wait, GMutex **ret_lock)
{
    g_autoptr(HostdNameLock) lock =
        wait ? hostd_name_lock(ctx, name) : hostd_name_trylock(ctx, name);
    if (lock == NULL)
        return NULL;
    g_autofree char *dir = g_build_filename(ctx->state->agents_dir, name, NULL);
    HostdAgentRecord *r = hostd_agent_record_load(dir, NULL);
    if (r != NULL)
        *ret_lock = g_steal_pointer(&lock);
    return r;
}

gboolean
hostd_fence_refuse(const HostdAgentRecord *r, GError **error)
{
    /* Saved for a move: the copy on the target may be running, and which of the two is the
     * agent is the fleet record's to say (hostd-move.h), not this host's. */
    if (r->moving_to != NULL && r->fenced == NULL)
        return vm_throw(error, VM_ERROR_BUSY,
                        "agent '%s' is being moved to host '%s'; it is not started here until "
                        "the move ends",
                        r->name, r->moving_to);
    if (r->fenced == NULL)
        return TRUE;
    return vm_throw(error, VM_ERROR_BAD_STATE,
                    "agent '%s' is fenced: %s; this copy is never started here "
                    "(`vmctl rm` removes it from this host only)",
                    r->name, r->fenced);
}

/* hostd_fence_agent(), which with @wait FALSE gives up at once when the agent is busy. */
static gboolean
hostd_fence_agent_full(HostdContext *ctx, const char *name, const char *owner, guint64 epoch,
                       gboolean wait)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_fence_lock_load(ctx, name, wait, &name_lock);
    if (r == NULL)
        return FALSE; /* removed meanwhile (nothing to fence), or busy (the next round) */
    if (g_str_equal(r->phase, HOSTD_PHASE_CREATING))
        return FALSE; /* a new that is still being made claimed its name first */

    g_autofree char *why =
        g_strdup_printf("host '%s' owns it (epoch %" G_GUINT64_FORMAT ")", owner, epoch);
    gboolean now = g_strcmp0(r->fenced, why) != 0;
    if (now) {
        /* Wanted stopped as well: the supervisor takes the domain's end for a stop, not a
         * crash to restart, and a fence lifted later does not start it by itself. */
        g_free(r->fenced);
        r->fenced = g_strdup(why);
        g_free(r->wanted);
        r->wanted = g_strdup(HOSTD_WANTED_STOPPED);
        if (!hostd_agent_record_save(r, &error)) {
            hostd_context_log(ctx,
                              "fleet: agent '%s' is another host's (%s) but cannot be fenced: %s",
                              name, why, error->message);
            g_clear_error(&error);
        }
    }
    /* A copy still running here (a host back with its QEMUs) would be a second agent: it goes,
     * its disk stays. Destroyed rather than paused: a paused QEMU can be resumed by anyone with
     * libvirt, and its memory is the owner's past now, not something to serve from. */
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    gboolean destroyed = FALSE;
    if (dom != NULL && hostd_libvirt_is_active(dom)) {
        if (virDomainDestroy(dom) == 0) {
            destroyed = TRUE;
        } else {
            hostd_libvirt_throw(&error, "cannot stop it");
            hostd_context_log(ctx, "fleet: fenced agent '%s' still runs here: %s", name,
                              error->message);
        }
    }
    if (now || destroyed) {
        g_autofree char *line =
            g_strdup_printf("fleet: agent '%s' fenced: %s; its files stay here, it is never "
                            "started here%s",
                            name, why, destroyed ? " (its running copy was stopped)" : "");
        hostd_context_log(ctx, "%s", line);
        hostd_context_agent_event(ctx, name, "fenced", "fenced", why);
    }
    return now;
}

gboolean
hostd_fence_agent(HostdContext *ctx, const char *name, const char *owner, guint64 epoch)
{
    return hostd_fence_agent_full(ctx, name, owner, epoch, TRUE);
}

void
hostd_fence_from_cluster(gpointer data, const char *name, const char *owner, guint64 epoch)
{
    /* Never waits for an agent's lock: a boot or a checkpoint may hold it for minutes, and this
     * thread renews the host's lease. A busy agent is fenced at the next refresh (5 s). */
    hostd_fence_agent_full(data, name, owner, epoch, FALSE);
}

/* @name's fleet record names this host with @epoch: a copy that kept no epoch (made before
 * epochs were kept) takes it, and a fence is lifted. */
static void
hostd_fence_lift(HostdContext *ctx, const char *name, guint64 epoch, GPtrArray *notes)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_fence_lock_load(ctx, name, TRUE, &name_lock);
    if (r == NULL || (r->fenced == NULL && r->fleet_epoch != 0))
        return;
    gboolean was_fenced = r->fenced != NULL;
    g_clear_pointer(&r->fenced, g_free);
    if (r->fleet_epoch == 0)
        r->fleet_epoch = epoch;
    if (hostd_agent_record_save(r, NULL) && was_fenced)
        g_ptr_array_add(notes, g_strdup_printf("fleet: agent '%s' is this host's again: no "
                                               "longer fenced (stopped; `vmctl start` runs it)",
                                               name));
}

void
hostd_fence_startup(HostdContext *ctx, GPtrArray *notes)
{
    if (ctx->cluster == NULL)
        return;
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, NULL);
    const char *me = hostd_cluster_host_id(ctx->cluster);
    g_autoptr(GHashTable) here = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, NULL);
    for (guint i = 0; names != NULL && i < names->len; i++)
        g_hash_table_add(here, names->pdata[i]);
    g_autoptr(GError) release_error = NULL;
    g_autoptr(GPtrArray) released =
        names != NULL ? hostd_cluster_release_missing(ctx->cluster, here, &release_error) : NULL;
    for (guint i = 0; released != NULL && i < released->len; i++)
        g_ptr_array_add(notes, g_strdup_printf("fleet: the name '%s' was this host's, which has "
                                               "no such agent: given back to the fleet",
                                               (char *)released->pdata[i]));

    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        g_autofree char *owner = NULL;
        guint64 epoch = 0;
        g_autoptr(GError) error = NULL;

        if (g_str_equal(r->phase, HOSTD_PHASE_CREATING))
            continue;
        if (!hostd_cluster_owner_of(ctx->cluster, r->name, &owner, &epoch, &error)) {
            if (g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING)) {
                /* No quorum: nothing to go on, so nothing is fenced; the thread checks again. */
                g_ptr_array_add(notes, g_strdup_printf("fleet: the ownership of this host's "
                                                       "agents could not be checked (%s); they "
                                                       "start as before, and are checked again "
                                                       "when etcd answers",
                                                       error->message));
                return;
            }
            g_ptr_array_add(notes,
                            g_strdup_printf("fleet: agent '%s': %s", r->name, error->message));
            continue;
        }
        /* No record: nobody else holds the name; a fence stays until this host holds it. */
        if (owner == NULL)
            continue;
        /* This host's record, but with a higher epoch than this copy was made under: another
         * copy was brought here, or recovered, since; this one is stale. */
        if (g_str_equal(owner, me) && (r->fleet_epoch == 0 || epoch <= r->fleet_epoch)) {
            hostd_fence_lift(ctx, r->name, epoch, notes);
            continue;
        }
        /* Logged there, once. */
        hostd_fence_agent(ctx, r->name, owner, epoch);
    }
}
