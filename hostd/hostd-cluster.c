#include "hostd-cluster.h"

#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "hostd-memory.h"
#include "vm-error.h"
#include "vm-etcd.h"
#include "vm-fleet-records.h"
#include "vm-placement.h"

/* Tries of a drained flag's transaction against other hosts changing it meanwhile. */
#define HOSTD_CLUSTER_TXN_TRIES 5

/* How long one etcd call may take from this host's thread: a fraction of the TTL, so that a
 * member that hangs is left for the next before the lease runs out. */
#define HOSTD_CLUSTER_CALL_MS_MIN 500

struct _HostdCluster {
    VmEtcd *etcd;
    char *host_id;
    char *address;
    char *state_dir;
    guint ttl_s;
    HostdClusterAgentsFunc agents_func;
    gpointer agents_data;
    HostdClusterTemplatesFunc templates_func;
    gpointer templates_data;
    void (*log)(const char *message);
    HostdClusterFenceFunc fence_func;
    gpointer fence_data;
    void (*tick_func)(gpointer data);
    gpointer tick_data;

    GMutex lock; /* guards what follows */
    GCond wake;
    GThread *thread;
    gboolean stopping;
    gboolean kicked;
    gint64 lease; /* 0: none held */
    gboolean registered;
    char *last_problem;    /* the last thing reported, so that a retry is not logged again */
    GHashTable *published; /* agent -> the state last written to its record; thread only */
    GHashTable *conflicts; /* agents another host owns, reported once; thread only */
};

HostdCluster *
hostd_cluster_new(const HostdClusterConfig *config, const char *state_dir, GError **error)
{
    g_autoptr(VmEtcd) etcd = vm_etcd_new((const char *const *)config->endpoints, config->ca,
                                         config->cert, config->key, error);
    if (etcd == NULL)
        return NULL;
    /* A call bounded well within the TTL, so a keepalive that hangs on one member still reaches
     * another in time. */
    vm_etcd_set_timeout(etcd, MAX(HOSTD_CLUSTER_CALL_MS_MIN,
                                  MIN(VM_ETCD_TIMEOUT_MS, config->lease_ttl_s * 1000 / 4)));
    HostdCluster *c = g_new0(HostdCluster, 1);
    c->etcd = g_steal_pointer(&etcd);
    c->host_id = g_strdup(config->host_id);
    c->address = g_strdup(config->address);
    c->state_dir = g_strdup(state_dir);
    c->ttl_s = MAX(config->lease_ttl_s, 1);
    g_mutex_init(&c->lock);
    g_cond_init(&c->wake);
    c->published = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    c->conflicts = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    return c;
}

void
hostd_cluster_set_agents_func(HostdCluster *cluster, HostdClusterAgentsFunc func, gpointer data)
{
    cluster->agents_func = func;
    cluster->agents_data = data;
}

void
hostd_cluster_set_templates_func(HostdCluster *cluster, HostdClusterTemplatesFunc func,
                                 gpointer data)
{
    cluster->templates_func = func;
    cluster->templates_data = data;
}

void
hostd_cluster_set_fence_func(HostdCluster *cluster, HostdClusterFenceFunc func, gpointer data)
{
    cluster->fence_func = func;
    cluster->fence_data = data;
}

void
hostd_cluster_set_tick_func(HostdCluster *cluster, void (*func)(gpointer data), gpointer data)
{
    cluster->tick_func = func;
    cluster->tick_data = data;
}

void
hostd_cluster_set_log_func(HostdCluster *cluster, void (*log)(const char *message))
{
    cluster->log = log;
}

const char *
hostd_cluster_host_id(const HostdCluster *cluster)
{
    return cluster->host_id;
}

gboolean
hostd_cluster_registered(HostdCluster *cluster)
{
    g_mutex_lock(&cluster->lock);
    gboolean registered = cluster->registered;
    g_mutex_unlock(&cluster->lock);
    return registered;
}

static void hostd_cluster_report(HostdCluster *c, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static void
hostd_cluster_report(HostdCluster *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *text = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (g_strcmp0(text, c->last_problem) == 0)
        return;
    g_free(c->last_problem);
    c->last_problem = g_strdup(text);
    if (c->log != NULL)
        c->log(text);
}

/* ---------------------------------------------------------------------------------------------
 * The host's record */

static VmFleetHost *
hostd_cluster_host_record(HostdCluster *c, GHashTable *agents)
{
    g_autoptr(VmFleetHost) host = vm_fleet_host_new(c->host_id, c->address);
    struct statvfs vfs;

    host->cores = g_get_num_processors();
    host->memory_mib = hostd_memory_host_mib("MemTotal");
    host->free_memory_mib = hostd_memory_host_mib("MemAvailable");
    if (statvfs(c->state_dir, &vfs) == 0) {
        host->disk_gib = ((guint64)vfs.f_blocks * vfs.f_frsize) >> 30;
        host->free_disk_gib = ((guint64)vfs.f_bavail * vfs.f_frsize) >> 30;
    }
    if (agents != NULL) {
        GHashTableIter it;
        gpointer state;
        g_hash_table_iter_init(&it, agents);
        while (g_hash_table_iter_next(&it, NULL, &state))
            vm_fleet_host_add_agents(host, state, 1);
    }
    g_autoptr(GPtrArray) templates =
        c->templates_func != NULL ? c->templates_func(c->templates_data) : NULL;
    for (guint i = 0; templates != NULL && i < templates->len; i++) {
        if (host->templates->len < VM_FLEET_TEMPLATES_MAX)
            g_ptr_array_add(host->templates, g_strdup(templates->pdata[i]));
    }
    return g_steal_pointer(&host);
}

static gboolean
hostd_cluster_put_host(HostdCluster *c, gint64 lease, GHashTable *agents, GError **error)
{
    g_autoptr(VmFleetHost) host = hostd_cluster_host_record(c, agents);
    g_autofree char *key = vm_fleet_host_key(c->host_id);
    g_autofree char *json = vm_fleet_host_to_json(host);
    return vm_etcd_put(c->etcd, key, json, -1, lease, error);
}

/* ---------------------------------------------------------------------------------------------
 * Ownership */

/* The host record @kv holds, parsed as untrusted; NULL when it is not one. */
static VmFleetHost *
kv_host(const VmEtcdKv *kv)
{
    gsize len;
    const char *data = g_bytes_get_data(kv->value, &len);
    return vm_fleet_host_from_json(data != NULL ? data : "", len, NULL);
}

/* The agent record @kv holds, the same. */
static VmFleetAgent *
kv_agent(const VmEtcdKv *kv, GError **error)
{
    gsize len;
    const char *data = g_bytes_get_data(kv->value, &len);
    return vm_fleet_agent_from_json(data != NULL ? data : "", len, error);
}

static gboolean
hostd_cluster_owner(HostdCluster *c, const VmEtcdKv *kv, VmFleetAgent **ret_agent, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    VmFleetAgent *agent = kv_agent(kv, &local_error);
    if (agent == NULL)
        return vm_throw(error, VM_ERROR_FAILED, "the fleet's record of '%s' is damaged: %s",
                        kv->key, local_error->message);
    *ret_agent = agent;
    return TRUE;
}

static gboolean
hostd_cluster_fleet_error(HostdCluster *c, const char *doing, GError *cause, GError **error)
{
    if (g_error_matches(cause, VM_ERROR, VM_ERROR_NOT_RUNNING))
        return vm_throw(error, VM_ERROR_NOT_RUNNING,
                        "cannot %s: the fleet's etcd cannot be reached or has no quorum (%s); "
                        "this host's own agents keep working",
                        doing, cause->message);
    return vm_throw(error, vm_error_code(cause), "cannot %s: %s", doing, cause->message);
}

gboolean
hostd_cluster_claim(HostdCluster *cluster, const char *name, gboolean *ret_created, GError **error)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmFleetAgent) mine = vm_fleet_agent_new(name, cluster->host_id, 1, "creating");
    g_autofree char *json = vm_fleet_agent_to_json(mine);
    g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
    g_autoptr(GPtrArray) kvs = NULL;
    g_autoptr(GError) local_error = NULL;
    g_autofree char *doing = g_strdup_printf("claim the name '%s' in the fleet", name);
    gboolean created = FALSE;

    /* Created only where no record is: of two hosts claiming one name, one wins. */
    vm_etcd_txn_if_version(txn, key, 0);
    vm_etcd_txn_put(txn, TRUE, key, json, 0);
    vm_etcd_txn_get(txn, FALSE, key);
    if (!vm_etcd_txn_commit(cluster->etcd, txn, &created, &kvs, &local_error))
        return hostd_cluster_fleet_error(cluster, doing, local_error, error);
    if (!created) {
        g_autoptr(VmFleetAgent) owner = NULL;
        if (kvs->len == 0)
            return vm_throw(error, VM_ERROR_BUSY,
                            "cannot %s: its record changed meanwhile; try again", doing);
        if (!hostd_cluster_owner(cluster, kvs->pdata[0], &owner, error))
            return FALSE;
        if (!g_str_equal(owner->host, cluster->host_id))
            return vm_throw(error, VM_ERROR_EXISTS, "agent '%s' exists on host '%s'", name,
                            owner->host);
    }
    if (ret_created != NULL)
        *ret_created = created;
    return TRUE;
}

gboolean
hostd_cluster_owner_of(HostdCluster *cluster, const char *name, char **ret_host, guint64 *ret_epoch,
                       GError **error)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmEtcdKv) kv = NULL;
    g_autoptr(VmFleetAgent) owner = NULL;
    g_autoptr(GError) local_error = NULL;
    g_autofree char *doing = g_strdup_printf("read the fleet's record of '%s'", name);

    *ret_host = NULL;
    *ret_epoch = 0;
    if (!vm_etcd_get(cluster->etcd, key, &kv, &local_error))
        return hostd_cluster_fleet_error(cluster, doing, local_error, error);
    if (kv == NULL)
        return TRUE;
    if (!hostd_cluster_owner(cluster, kv, &owner, error))
        return FALSE;
    *ret_host = g_strdup(owner->host);
    *ret_epoch = owner->epoch;
    return TRUE;
}

gboolean
hostd_cluster_release(HostdCluster *cluster, const char *name, GError **error)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(GError) local_error = NULL;
    g_autoptr(VmEtcdKv) kv = NULL;
    g_autofree char *doing = g_strdup_printf("release the name '%s' in the fleet", name);

    for (guint attempt = 0; attempt < 3; attempt++) {
        g_autoptr(VmFleetAgent) owner = NULL;
        g_clear_pointer(&kv, vm_etcd_kv_free);
        if (!vm_etcd_get(cluster->etcd, key, &kv, &local_error))
            return hostd_cluster_fleet_error(cluster, doing, local_error, error);
        if (kv == NULL)
            return TRUE;
        /* A record that does not parse is nobody's: it goes with the agent of that name here. */
        if (hostd_cluster_owner(cluster, kv, &owner, NULL) &&
            !g_str_equal(owner->host, cluster->host_id))
            return TRUE;
        /* Only the record read: a host that took it over meanwhile keeps it. */
        g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
        gboolean deleted = FALSE;
        vm_etcd_txn_if_mod_revision(txn, key, kv->mod_revision);
        vm_etcd_txn_delete(txn, TRUE, key);
        if (!vm_etcd_txn_commit(cluster->etcd, txn, &deleted, NULL, &local_error))
            return hostd_cluster_fleet_error(cluster, doing, local_error, error);
        if (deleted)
            return TRUE;
    }
    return vm_throw(error, VM_ERROR_BUSY, "cannot %s: its record keeps changing", doing);
}

/* Writes @state into @name's record where this host owns it and it says another. */
static gboolean
hostd_cluster_publish_state(HostdCluster *c, const char *name, const char *state, GError **error)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmEtcdKv) kv = NULL;
    g_autoptr(VmFleetAgent) owner = NULL;

    if (!vm_etcd_get(c->etcd, key, &kv, error))
        return FALSE;
    if (kv == NULL || !hostd_cluster_owner(c, kv, &owner, NULL) ||
        !g_str_equal(owner->host, c->host_id))
        return TRUE;
    if (g_str_equal(owner->state, state))
        return TRUE;
    g_free(owner->state);
    owner->state = g_strdup(vm_fleet_state_valid(state) ? state : "unknown");
    g_autofree char *json = vm_fleet_agent_to_json(owner);
    g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
    gboolean done = FALSE;
    vm_etcd_txn_if_mod_revision(txn, key, kv->mod_revision);
    vm_etcd_txn_put(txn, TRUE, key, json, 0);
    return vm_etcd_txn_commit(c->etcd, txn, &done, NULL, error);
}

/* Hands agent @name, which another host owns, to the fence function with its owner's record. */
static void
hostd_cluster_fence(HostdCluster *c, const char *name)
{
    g_autofree char *owner = NULL;
    guint64 epoch = 0;

    if (c->fence_func == NULL || !hostd_cluster_owner_of(c, name, &owner, &epoch, NULL) ||
        owner == NULL || g_str_equal(owner, c->host_id))
        return;
    c->fence_func(c->fence_data, name, owner, epoch);
}

/* Every agent of this host: claimed where it has no record (a host joining with agents), its
 * state written where it changed. */
static gboolean
hostd_cluster_sync_agents(HostdCluster *c, GHashTable *agents, GError **error)
{
    GHashTableIter it;
    gpointer name, state;

    if (agents == NULL)
        return TRUE;
    g_hash_table_iter_init(&it, agents);
    while (g_hash_table_iter_next(&it, &name, &state)) {
        const char *published = g_hash_table_lookup(c->published, name);
        if (g_strcmp0(published, state) == 0)
            continue;
        g_autoptr(GError) local_error = NULL;
        if (!hostd_cluster_claim(c, name, NULL, &local_error)) {
            if (!g_error_matches(local_error, VM_ERROR, VM_ERROR_EXISTS)) {
                g_propagate_error(error, g_steal_pointer(&local_error));
                return FALSE;
            }
            if (g_hash_table_add(c->conflicts, g_strdup(name)) && c->log != NULL) {
                g_autofree char *line =
                    g_strdup_printf("fleet: agent '%s' here is another host's in the fleet: %s",
                                    (char *)name, local_error->message);
                c->log(line);
            }
            hostd_cluster_fence(c, name);
            continue;
        }
        if (!hostd_cluster_publish_state(c, name, state, error))
            return FALSE;
        g_hash_table_replace(c->published, g_strdup(name), g_strdup(state));
    }
    /* Agents gone from this host are no longer followed. */
    GHashTableIter pit;
    g_hash_table_iter_init(&pit, c->published);
    while (g_hash_table_iter_next(&pit, &name, NULL)) {
        if (!g_hash_table_contains(agents, name))
            g_hash_table_iter_remove(&pit);
    }
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * The thread */

static GHashTable *
hostd_cluster_read_agents(HostdCluster *c)
{
    return c->agents_func != NULL ? c->agents_func(c->agents_data) : NULL;
}

/* One round: registers where no lease is held, else renews it; refreshes the records when
 * @refresh. Returns FALSE when etcd could not be reached (reported). */
static gboolean
hostd_cluster_round(HostdCluster *c, gboolean refresh)
{
    g_autoptr(GError) error = NULL;
    g_mutex_lock(&c->lock);
    gint64 lease = c->lease;
    g_mutex_unlock(&c->lock);

    if (lease != 0 && !vm_etcd_lease_keepalive(c->etcd, lease, NULL, &error)) {
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND)) {
            hostd_cluster_report(c, "fleet: cannot renew this host's lease: %s", error->message);
            return FALSE;
        }
        /* Expired while etcd was away: register again, as a host that comes back does. */
        hostd_cluster_report(c, "fleet: this host's lease expired; registering again");
        g_clear_error(&error);
        lease = 0;
        g_mutex_lock(&c->lock);
        c->lease = 0;
        c->registered = FALSE;
        g_mutex_unlock(&c->lock);
    }
    if (lease != 0 && !refresh)
        return TRUE;

    g_autoptr(GHashTable) agents = hostd_cluster_read_agents(c);
    gboolean fresh = lease == 0;
    if (fresh && !vm_etcd_lease_grant(c->etcd, c->ttl_s, &lease, &error)) {
        hostd_cluster_report(c, "fleet: cannot register host '%s': %s", c->host_id, error->message);
        return FALSE;
    }
    if (!hostd_cluster_put_host(c, lease, agents, &error)) {
        hostd_cluster_report(c, "fleet: cannot write host '%s': %s", c->host_id, error->message);
        if (fresh)
            vm_etcd_lease_revoke(c->etcd, lease, NULL);
        return FALSE;
    }
    g_mutex_lock(&c->lock);
    c->lease = lease;
    c->registered = TRUE;
    g_mutex_unlock(&c->lock);
    if (fresh)
        hostd_cluster_report(c, "fleet: host '%s' registered (lease TTL %u s)", c->host_id,
                             c->ttl_s);
    if (!hostd_cluster_sync_agents(c, agents, &error)) {
        hostd_cluster_report(c, "fleet: cannot write this host's agents: %s", error->message);
        return FALSE;
    }
    return TRUE;
}

static gpointer
hostd_cluster_thread(gpointer data)
{
    HostdCluster *c = data;
    /* Renewed thrice per TTL: two renewals may be lost before the record goes. */
    gint64 renew_us = MAX((gint64)c->ttl_s * G_USEC_PER_SEC / 3, 200 * 1000);
    gint64 next_refresh = 0;

    for (;;) {
        gint64 now = g_get_monotonic_time();
        gboolean refresh = now >= next_refresh;
        if (hostd_cluster_round(c, refresh) && refresh) {
            next_refresh = now + HOSTD_CLUSTER_REFRESH_S * G_USEC_PER_SEC;
            if (c->tick_func != NULL)
                c->tick_func(c->tick_data);
        }

        gint64 until = g_get_monotonic_time() + renew_us;
        g_mutex_lock(&c->lock);
        while (!c->stopping && !c->kicked) {
            if (!g_cond_wait_until(&c->wake, &c->lock, until))
                break;
        }
        gboolean stopping = c->stopping;
        if (c->kicked)
            next_refresh = 0;
        c->kicked = FALSE;
        g_mutex_unlock(&c->lock);
        if (stopping)
            return NULL;
    }
}

void
hostd_cluster_start(HostdCluster *cluster)
{
    g_return_if_fail(cluster->thread == NULL);
    cluster->stopping = FALSE;
    cluster->thread = g_thread_new("hostd-cluster", hostd_cluster_thread, cluster);
}

void
hostd_cluster_kick(HostdCluster *cluster)
{
    g_mutex_lock(&cluster->lock);
    cluster->kicked = TRUE;
    g_cond_signal(&cluster->wake);
    g_mutex_unlock(&cluster->lock);
}

void
hostd_cluster_stop(HostdCluster *cluster, gboolean revoke)
{
    if (cluster->thread != NULL) {
        g_mutex_lock(&cluster->lock);
        cluster->stopping = TRUE;
        g_cond_signal(&cluster->wake);
        g_mutex_unlock(&cluster->lock);
        g_thread_join(g_steal_pointer(&cluster->thread));
    }
    g_mutex_lock(&cluster->lock);
    gint64 lease = cluster->lease;
    cluster->lease = 0;
    cluster->registered = FALSE;
    g_mutex_unlock(&cluster->lock);
    if (revoke && lease != 0)
        vm_etcd_lease_revoke(cluster->etcd, lease, NULL);
}

void
hostd_cluster_free(HostdCluster *cluster)
{
    if (cluster == NULL)
        return;
    hostd_cluster_stop(cluster, TRUE);
    vm_etcd_free(cluster->etcd);
    g_free(cluster->host_id);
    g_free(cluster->address);
    g_free(cluster->state_dir);
    g_free(cluster->last_problem);
    g_hash_table_unref(cluster->published);
    g_hash_table_unref(cluster->conflicts);
    g_mutex_clear(&cluster->lock);
    g_cond_clear(&cluster->wake);
    g_free(cluster);
}

/* ---------------------------------------------------------------------------------------------
 * The one view */

static gint
compare_strs(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static gint
compare_kv_keys(gconstpointer a, gconstpointer b)
{
    return strcmp((*(VmEtcdKv *const *)a)->key, (*(VmEtcdKv *const *)b)->key);
}

/* Reads the fleet: the hosts with a live record (id -> VmFleetHost, drained as its flag says),
 * every agent record, and the ids of the drained hosts (a set; may be NULL). */
static gboolean
hostd_cluster_read(HostdCluster *c, GHashTable **ret_hosts, GPtrArray **ret_agents,
                   GHashTable **ret_drained, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GPtrArray) host_kvs =
        vm_etcd_get_prefix(c->etcd, VM_FLEET_HOSTS_PREFIX, VM_FLEET_HOSTS_MAX, &local_error);
    if (host_kvs == NULL)
        return hostd_cluster_fleet_error(c, "read the fleet", local_error, error);
    g_autoptr(GPtrArray) agent_kvs =
        vm_etcd_get_prefix(c->etcd, VM_FLEET_AGENTS_PREFIX, VM_FLEET_AGENTS_MAX, &local_error);
    if (agent_kvs == NULL)
        return hostd_cluster_fleet_error(c, "read the fleet", local_error, error);
    g_autoptr(GPtrArray) drained_kvs =
        vm_etcd_get_prefix(c->etcd, VM_FLEET_DRAINED_PREFIX, VM_FLEET_HOSTS_MAX, &local_error);
    if (drained_kvs == NULL)
        return hostd_cluster_fleet_error(c, "read the fleet", local_error, error);
    g_autoptr(GHashTable) drained = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (guint i = 0; i < drained_kvs->len; i++) {
        const char *id = ((VmEtcdKv *)drained_kvs->pdata[i])->key + strlen(VM_FLEET_DRAINED_PREFIX);
        if (vm_fleet_host_id_valid(id))
            g_hash_table_add(drained, g_strdup(id));
    }

    g_autoptr(GHashTable) hosts =
        g_hash_table_new_full(g_str_hash, g_str_equal, NULL, (GDestroyNotify)vm_fleet_host_free);
    for (guint i = 0; i < host_kvs->len; i++) {
        const VmEtcdKv *kv = host_kvs->pdata[i];
        VmFleetHost *host = kv_host(kv);
        /* Only a record at its own id's key counts. */
        if (host == NULL || !g_str_equal(kv->key + strlen(VM_FLEET_HOSTS_PREFIX), host->id)) {
            vm_fleet_host_free(host);
            continue;
        }
        /* The flag's own key says; what a record says of itself does not count. */
        host->drained = g_hash_table_contains(drained, host->id);
        g_hash_table_replace(hosts, host->id, host);
    }
    g_autoptr(GPtrArray) agents =
        g_ptr_array_new_with_free_func((GDestroyNotify)vm_fleet_agent_free);
    g_ptr_array_sort(agent_kvs, compare_kv_keys);
    for (guint i = 0; i < agent_kvs->len; i++) {
        const VmEtcdKv *kv = agent_kvs->pdata[i];
        VmFleetAgent *agent = kv_agent(kv, NULL);
        if (agent == NULL || !g_str_equal(kv->key + strlen(VM_FLEET_AGENTS_PREFIX), agent->name)) {
            vm_fleet_agent_free(agent);
            continue;
        }
        g_ptr_array_add(agents, agent);
    }
    *ret_hosts = g_steal_pointer(&hosts);
    *ret_agents = g_steal_pointer(&agents);
    if (ret_drained != NULL)
        *ret_drained = g_steal_pointer(&drained);
    return TRUE;
}

static void
add_host(GVariantBuilder *b, const VmFleetHost *host, gboolean live, guint records)
{
    GVariantBuilder d, counts;
    g_variant_builder_init(&d, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_init(&counts, G_VARIANT_TYPE("a{su}"));
    g_variant_builder_add(&d, "{sv}", "id", g_variant_new_string(host->id));
    g_variant_builder_add(&d, "{sv}", "address", g_variant_new_string(host->address));
    g_variant_builder_add(&d, "{sv}", "live", g_variant_new_boolean(live));
    g_variant_builder_add(&d, "{sv}", "cores", g_variant_new_uint32(host->cores));
    g_variant_builder_add(&d, "{sv}", "memory_mib", g_variant_new_uint64(host->memory_mib));
    g_variant_builder_add(&d, "{sv}", "disk_gib", g_variant_new_uint64(host->disk_gib));
    for (guint i = 0; i < host->agents->len; i++) {
        const VmFleetStateCount *sc = &g_array_index(host->agents, VmFleetStateCount, i);
        g_variant_builder_add(&counts, "{su}", sc->state, sc->count);
    }
    g_variant_builder_add(&d, "{sv}", "agents", g_variant_builder_end(&counts));
    g_variant_builder_add(&d, "{sv}", "agents_total",
                          g_variant_new_uint32(live ? vm_fleet_host_agents_total(host) : records));
    g_variant_builder_add(&d, "{sv}", "free_memory_mib",
                          g_variant_new_uint64(host->free_memory_mib));
    g_variant_builder_add(&d, "{sv}", "free_disk_gib", g_variant_new_uint64(host->free_disk_gib));
    g_variant_builder_add(&d, "{sv}", "drained", g_variant_new_boolean(host->drained));
    g_variant_builder_add_value(b, g_variant_builder_end(&d));
}

GVariant *
hostd_cluster_hosts(HostdCluster *cluster, GError **error)
{
    g_autoptr(GHashTable) hosts = NULL;
    g_autoptr(GPtrArray) agents = NULL;
    g_autoptr(GHashTable) drained = NULL;
    if (!hostd_cluster_read(cluster, &hosts, &agents, &drained, error))
        return NULL;

    /* Hosts agents' records name: live ones, and those whose lease is gone (down). */
    g_autoptr(GHashTable) records = g_hash_table_new(g_str_hash, g_str_equal);
    for (guint i = 0; i < agents->len; i++) {
        const VmFleetAgent *a = agents->pdata[i];
        guint n = GPOINTER_TO_UINT(g_hash_table_lookup(records, a->host));
        g_hash_table_replace(records, a->host, GUINT_TO_POINTER(n + 1));
    }
    g_autoptr(GPtrArray) ids = g_ptr_array_new();
    GHashTableIter it;
    gpointer id;
    g_hash_table_iter_init(&it, hosts);
    while (g_hash_table_iter_next(&it, &id, NULL))
        g_ptr_array_add(ids, id);
    g_hash_table_iter_init(&it, records);
    while (g_hash_table_iter_next(&it, &id, NULL)) {
        if (!g_hash_table_contains(hosts, id))
            g_ptr_array_add(ids, id);
    }
    g_ptr_array_sort(ids, compare_strs);

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < ids->len; i++) {
        const VmFleetHost *host = g_hash_table_lookup(hosts, ids->pdata[i]);
        guint n = GPOINTER_TO_UINT(g_hash_table_lookup(records, ids->pdata[i]));
        if (host != NULL) {
            add_host(&b, host, TRUE, n);
        } else {
            g_autoptr(VmFleetHost) down = vm_fleet_host_new(ids->pdata[i], "");
            down->drained = g_hash_table_contains(drained, ids->pdata[i]);
            add_host(&b, down, FALSE, n);
        }
    }
    return g_variant_builder_end(&b);
}

GVariant *
hostd_cluster_agents(HostdCluster *cluster, GError **error)
{
    g_autoptr(GHashTable) hosts = NULL;
    g_autoptr(GPtrArray) agents = NULL;
    if (!hostd_cluster_read(cluster, &hosts, &agents, NULL, error))
        return NULL;

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < agents->len; i++) {
        const VmFleetAgent *a = agents->pdata[i];
        gboolean live = g_hash_table_contains(hosts, a->host);
        GVariantBuilder d;
        g_variant_builder_init(&d, G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&d, "{sv}", "name", g_variant_new_string(a->name));
        g_variant_builder_add(&d, "{sv}", "host", g_variant_new_string(a->host));
        g_variant_builder_add(&d, "{sv}", "epoch", g_variant_new_uint64(a->epoch));
        g_variant_builder_add(&d, "{sv}", "state",
                              g_variant_new_string(live ? a->state : "host-down"));
        g_variant_builder_add(&d, "{sv}", "host_live", g_variant_new_boolean(live));
        g_variant_builder_add_value(&b, g_variant_builder_end(&d));
    }
    return g_variant_builder_end(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Drained hosts, placement and owners */

/* Whether @id has a live record or agents' records name it. */
static gboolean
hostd_cluster_known(GHashTable *hosts, GPtrArray *agents, const char *id)
{
    if (g_hash_table_contains(hosts, id))
        return TRUE;
    for (guint i = 0; i < agents->len; i++) {
        if (g_str_equal(((VmFleetAgent *)agents->pdata[i])->host, id))
            return TRUE;
    }
    return FALSE;
}

gboolean
hostd_cluster_set_drained(HostdCluster *cluster, const char *id, gboolean drained,
                          gboolean *ret_changed, GError **error)
{
    const char *doing = drained ? "drain the host" : "undrain the host";
    g_autoptr(GHashTable) hosts = NULL;
    g_autoptr(GPtrArray) agents = NULL;
    g_autoptr(GError) local_error = NULL;

    if (!vm_fleet_host_id_valid(id))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' is no host id", id);
    if (!hostd_cluster_read(cluster, &hosts, &agents, NULL, error))
        return FALSE;
    if (!hostd_cluster_known(hosts, agents, id))
        return vm_throw(error, VM_ERROR_NOT_FOUND, "no host '%s' in the fleet", id);

    g_autofree char *key = vm_fleet_drained_key(id);
    for (guint i = 0; i < HOSTD_CLUSTER_TXN_TRIES; i++) {
        g_autoptr(VmEtcdKv) kv = NULL;
        if (!vm_etcd_get(cluster->etcd, key, &kv, &local_error))
            return hostd_cluster_fleet_error(cluster, doing, local_error, error);
        if ((kv != NULL) == drained) {
            if (ret_changed != NULL)
                *ret_changed = FALSE;
            return TRUE;
        }
        g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
        gboolean done = FALSE;
        vm_etcd_txn_if_version(txn, key, kv != NULL ? kv->version : 0);
        if (drained) {
            g_autofree char *json =
                g_strdup_printf("{\"drained\":true,\"by\":\"%s\"}", cluster->host_id);
            vm_etcd_txn_put(txn, TRUE, key, json, 0);
        } else {
            vm_etcd_txn_delete(txn, TRUE, key);
        }
        if (!vm_etcd_txn_commit(cluster->etcd, txn, &done, NULL, &local_error))
            return hostd_cluster_fleet_error(cluster, doing, local_error, error);
        if (done) {
            if (ret_changed != NULL)
                *ret_changed = TRUE;
            return TRUE;
        }
    }
    return vm_throw(error, VM_ERROR_BUSY, "cannot %s: its flag keeps changing", doing);
}

gboolean
hostd_cluster_place(HostdCluster *cluster, const char *on, const char *template_name,
                    guint64 memory_mib, char **ret_host, char **ret_address, GError **error)
{
    return hostd_cluster_place_except(cluster, on, NULL, template_name, memory_mib, ret_host,
                                      ret_address, error);
}

gboolean
hostd_cluster_place_except(HostdCluster *cluster, const char *on, const char *except,
                           const char *template_name, guint64 memory_mib, char **ret_host,
                           char **ret_address, GError **error)
{
    g_autoptr(GHashTable) hosts = NULL;
    g_autoptr(GPtrArray) agents = NULL;
    g_autoptr(GHashTable) drained = NULL;

    if (!hostd_cluster_read(cluster, &hosts, &agents, &drained, error))
        return FALSE;

    /* The live hosts by id, then the down ones agents' records name: the same view, in the same
     * order, on every host. */
    g_autoptr(GPtrArray) ids = g_ptr_array_new();
    GHashTableIter it;
    gpointer id;
    g_hash_table_iter_init(&it, hosts);
    while (g_hash_table_iter_next(&it, &id, NULL)) {
        if (on != NULL || g_strcmp0(id, except) != 0)
            g_ptr_array_add(ids, id);
    }
    g_ptr_array_sort(ids, compare_strs);
    g_autoptr(GPtrArray) down = g_ptr_array_new_with_free_func((GDestroyNotify)vm_fleet_host_free);
    for (guint i = 0; i < agents->len; i++) {
        const char *owner = ((VmFleetAgent *)agents->pdata[i])->host;
        gboolean seen =
            g_hash_table_contains(hosts, owner) || (on == NULL && g_strcmp0(owner, except) == 0);
        for (guint j = 0; j < down->len && !seen; j++)
            seen = g_str_equal(((VmFleetHost *)down->pdata[j])->id, owner);
        if (!seen) {
            VmFleetHost *h = vm_fleet_host_new(owner, "");
            h->drained = g_hash_table_contains(drained, owner);
            g_ptr_array_add(down, h);
        }
    }
    gsize n = ids->len + down->len;
    g_autofree VmPlacementHost *candidates = g_new0(VmPlacementHost, MAX(n, 1));
    for (guint i = 0; i < ids->len; i++)
        candidates[i] = (VmPlacementHost){g_hash_table_lookup(hosts, ids->pdata[i]), TRUE};
    for (guint i = 0; i < down->len; i++)
        candidates[ids->len + i] = (VmPlacementHost){down->pdata[i], FALSE};

    gsize chosen = n;
    if (on != NULL) {
        for (gsize i = 0; i < n && chosen == n; i++) {
            if (g_str_equal(candidates[i].record->id, on))
                chosen = i;
        }
        if (chosen == n)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "no host '%s' in the fleet", on);
        g_autofree char *why = vm_placement_refusal(&candidates[chosen], template_name, memory_mib);
        if (why != NULL) {
            gboolean state = !candidates[chosen].live || candidates[chosen].record->drained;
            return vm_throw(error, state ? VM_ERROR_BAD_STATE : VM_ERROR_NO_RESOURCES,
                            "cannot make the agent on host '%s': %s", on, why);
        }
    } else if (!vm_placement_choose(candidates, n, template_name, memory_mib, &chosen, error)) {
        return FALSE;
    }
    *ret_host = g_strdup(candidates[chosen].record->id);
    *ret_address = g_strdup(candidates[chosen].record->address);
    return TRUE;
}

gboolean
hostd_cluster_replica_hosts(HostdCluster *cluster, const char *template_name, guint count,
                            const char *keep, GPtrArray **ret_hosts, GPtrArray **ret_addresses,
                            GError **error)
{
    g_autoptr(GHashTable) hosts = NULL;
    g_autoptr(GPtrArray) agents = NULL;
    g_autoptr(GHashTable) drained = NULL;

    if (!hostd_cluster_read(cluster, &hosts, &agents, &drained, error))
        return FALSE;
    /* The live hosts but this one that can hold the agent, by id: the same order everywhere. */
    g_autoptr(GPtrArray) ids = g_ptr_array_new();
    GHashTableIter it;
    gpointer id, record;
    g_hash_table_iter_init(&it, hosts);
    while (g_hash_table_iter_next(&it, &id, &record)) {
        VmPlacementHost candidate = {record, TRUE};
        g_autofree char *why = vm_placement_refusal(&candidate, template_name, 0);
        if (why == NULL && !g_str_equal(id, cluster->host_id))
            g_ptr_array_add(ids, id);
    }
    g_ptr_array_sort(ids, compare_strs);

    g_autoptr(GPtrArray) chosen = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GPtrArray) addresses = g_ptr_array_new_with_free_func(g_free);
    /* The hosts that hold a replica already stay (the next copy only adds what changed). */
    g_auto(GStrv) kept = keep != NULL ? g_strsplit(keep, ",", 0) : g_new0(char *, 1);
    for (char **k = kept; *k != NULL && chosen->len < count; k++) {
        for (guint i = 0; i < ids->len; i++) {
            if (g_str_equal(ids->pdata[i], *k)) {
                const VmFleetHost *h = g_hash_table_lookup(hosts, ids->pdata[i]);
                g_ptr_array_add(chosen, g_strdup(h->id));
                g_ptr_array_add(addresses, g_strdup(h->address));
                g_ptr_array_remove_index(ids, i);
                break;
            }
        }
    }
    /* Then placement's choice, one at a time over what is left. */
    while (chosen->len < count && ids->len > 0) {
        g_autofree VmPlacementHost *candidates = g_new0(VmPlacementHost, ids->len);
        for (guint i = 0; i < ids->len; i++)
            candidates[i] = (VmPlacementHost){g_hash_table_lookup(hosts, ids->pdata[i]), TRUE};
        gsize pick = 0;
        if (!vm_placement_choose(candidates, ids->len, template_name, 0, &pick, NULL))
            break;
        g_ptr_array_add(chosen, g_strdup(candidates[pick].record->id));
        g_ptr_array_add(addresses, g_strdup(candidates[pick].record->address));
        g_ptr_array_remove_index(ids, (guint)pick);
    }
    *ret_hosts = g_steal_pointer(&chosen);
    *ret_addresses = g_steal_pointer(&addresses);
    return TRUE;
}

gboolean
hostd_cluster_locate(HostdCluster *cluster, const char *name, char **ret_host, char **ret_address,
                     gboolean *ret_live, GError **error)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmEtcdKv) kv = NULL;
    g_autoptr(VmFleetAgent) owner = NULL;
    g_autoptr(GError) local_error = NULL;

    *ret_host = NULL;
    *ret_address = NULL;
    *ret_live = FALSE;
    if (!vm_etcd_get(cluster->etcd, key, &kv, &local_error))
        return hostd_cluster_fleet_error(cluster, "find the agent's host", local_error, error);
    if (kv == NULL)
        return TRUE;
    if (!hostd_cluster_owner(cluster, kv, &owner, error))
        return FALSE;
    if (g_str_equal(owner->host, cluster->host_id))
        return TRUE;

    g_autofree char *host_key = vm_fleet_host_key(owner->host);
    g_autoptr(VmEtcdKv) host_kv = NULL;
    if (!vm_etcd_get(cluster->etcd, host_key, &host_kv, &local_error))
        return hostd_cluster_fleet_error(cluster, "find the agent's host", local_error, error);
    if (host_kv != NULL) {
        g_autoptr(VmFleetHost) host = kv_host(host_kv);
        if (host != NULL && g_str_equal(host->id, owner->host)) {
            *ret_live = TRUE;
            *ret_address = g_strdup(host->address);
        }
    }
    *ret_host = g_strdup(owner->host);
    return TRUE;
}

gboolean
hostd_cluster_take(HostdCluster *cluster, const char *name, const char *from, guint64 epoch,
                   const char *state, guint64 *ret_epoch, GError **error)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmEtcdKv) kv = NULL;
    g_autoptr(VmFleetAgent) owner = NULL;
    g_autoptr(GError) local_error = NULL;
    g_autofree char *doing = g_strdup_printf("take agent '%s' over in the fleet", name);

    if (!vm_etcd_get(cluster->etcd, key, &kv, &local_error))
        return hostd_cluster_fleet_error(cluster, doing, local_error, error);
    if (kv == NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE, "cannot %s: the fleet has no record of it",
                        doing);
    if (!hostd_cluster_owner(cluster, kv, &owner, error))
        return FALSE;
    if (!g_str_equal(owner->host, from) || owner->epoch != epoch)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "cannot %s: host '%s' owns it with epoch %" G_GUINT64_FORMAT
                        ", not host '%s' with epoch %" G_GUINT64_FORMAT,
                        doing, owner->host, owner->epoch, from, epoch);
    g_autoptr(VmFleetAgent) mine =
        vm_fleet_agent_new(name, cluster->host_id, epoch + 1,
                           state != NULL && vm_fleet_state_valid(state) ? state : owner->state);
    g_autofree char *json = vm_fleet_agent_to_json(mine);
    g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
    gboolean done = FALSE;
    /* Only the record read: a take-over by anyone else meanwhile wins, and this one fails. */
    vm_etcd_txn_if_mod_revision(txn, key, kv->mod_revision);
    vm_etcd_txn_put(txn, TRUE, key, json, 0);
    if (!vm_etcd_txn_commit(cluster->etcd, txn, &done, NULL, &local_error))
        return hostd_cluster_fleet_error(cluster, doing, local_error, error);
    if (!done)
        return vm_throw(error, VM_ERROR_BAD_STATE, "cannot %s: its record changed meanwhile",
                        doing);
    if (ret_epoch != NULL)
        *ret_epoch = epoch + 1;
    return TRUE;
}

GPtrArray *
hostd_cluster_release_missing(HostdCluster *cluster, GHashTable *here, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GPtrArray) kvs = vm_etcd_get_prefix(cluster->etcd, VM_FLEET_AGENTS_PREFIX,
                                                  VM_FLEET_AGENTS_MAX, &local_error);
    if (kvs == NULL)
        return hostd_cluster_fleet_error(cluster, "read the fleet's agents", local_error, error),
               NULL;
    g_autoptr(GPtrArray) released = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < kvs->len; i++) {
        const VmEtcdKv *kv = kvs->pdata[i];
        g_autoptr(VmFleetAgent) agent = kv_agent(kv, NULL);
        if (agent == NULL || !g_str_equal(agent->host, cluster->host_id) ||
            g_hash_table_contains(here, agent->name))
            continue;
        /* Only the record read: a host that takes the name meanwhile keeps it. */
        g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
        gboolean deleted = FALSE;
        vm_etcd_txn_if_mod_revision(txn, kv->key, kv->mod_revision);
        vm_etcd_txn_delete(txn, TRUE, kv->key);
        if (!vm_etcd_txn_commit(cluster->etcd, txn, &deleted, NULL, &local_error))
            return hostd_cluster_fleet_error(cluster, "release a name", local_error, error), NULL;
        if (deleted)
            g_ptr_array_add(released, g_strdup(agent->name));
    }
    return g_steal_pointer(&released);
}
