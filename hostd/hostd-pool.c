#include "hostd-pool.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-confine.h"
#include "hostd-console.h"
#include "hostd-memory.h"
#include "hostd-resources.h"
#include "hostd-warm.h"
#include "vm-error.h"
#include "vm-fs.h"
#include "vm-qemu-img.h"
#include "vm-util.h"

/* How often the thread looks again when nothing woke it: a warm image built, a template's
 * `pool:` changed, memory freed. */
#define POOL_LOOK_EVERY_S 10

/* How long after the last warm `new` the pool waits before it fills again: a burst of them
 * restores without a machine being made beside. */
#define POOL_QUIET_S 3

/* The pool thread's nice value, and that of the QEMU of each machine it restores. */
#define POOL_NICE 19

/* What a machine leaves free on the host after it, at least: a tenth of its memory, and 1 GiB. */
#define POOL_MARGIN_MIN_MIB 1024

struct _HostdPool {
    GMutex lock;
    GCond wake;
    GPtrArray *machines; /* HostdAgentRecord*, paused and waiting; under lock */
    guint asking;        /* warm `new`s under way that asked for a machine; under lock */
    gint64 quiet_from;   /* monotonic us from which the pool may fill again; under lock */
    gboolean stopping;   /* under lock */
    GThread *thread;
};

static char *
pool_root(HostdContext *ctx)
{
    return g_build_filename(ctx->config->state_dir, HOSTD_POOL_DIR, NULL);
}

/* Destroys machine @m's domain and removes its files, its ports and its id with them. No
 * component knows the machine (it is no agent): nothing else is told. */
static void
pool_discard(HostdContext *ctx, HostdAgentRecord *m)
{
    g_autoptr(GError) error = NULL;

    hostd_console_unwatch(ctx, m->name);
    hostd_ports_release(ctx, m->name);
    if (!hostd_libvirt_remove(ctx->lv, m->name, &error))
        hostd_context_log(ctx, "pool: machine %s: %s", m->name, error->message);
    hostd_confine_release(ctx, m);
    vm_remove_tree(m->dir, NULL);
    hostd_confine_unhold(ctx, m->agent_id);
    hostd_agent_record_free(m);
}

/* Whether the host has room for a machine of @memory_mib and the margin after it. */
static gboolean
pool_memory_allows(guint memory_mib, guint64 *ret_available)
{
    guint64 total = hostd_memory_host_mib("MemTotal");
    guint64 available = hostd_memory_host_mib("MemAvailable");

    *ret_available = available;
    return available >= memory_mib + MAX(total / 10, POOL_MARGIN_MIN_MIB);
}

/* Makes one paused machine of @warm for @tpl: a record of its own in <state dir>/pool/<id>/
 * (phase "pool"), its ports held, an id held for its QEMU, an overlay on the warm disk, the
 * warm seed, its domain "pool.<hex>" defined and the warm image restored into it paused. Nothing
 * is left when it fails. */
static HostdAgentRecord *
pool_make(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image,
          const HostdWarmImage *warm, char **ret_trace, GError **error)
{
    g_autofree char *root = pool_root(ctx);
    if (g_mkdir_with_parents(root, 0711) < 0) {
        vm_throw_errno(error, errno, "cannot create %s", root);
        return NULL;
    }
    g_autoptr(HostdAgentRecord) r = g_new0(HostdAgentRecord, 1);
    r->name = g_strdup_printf("pool.%08x%08x", g_random_int(), g_random_int());
    r->dir = g_build_filename(root, r->name, NULL);
    r->uuid = g_uuid_string_random();
    r->template_name = g_strdup(tpl->name);
    r->phase = g_strdup(HOSTD_PHASE_POOL);
    r->cpus = tpl->cpus;
    r->memory_mib = tpl->memory_mib;
    r->disk_gib = tpl->disk_gib;
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        r->disk_limits[i] =
            tpl->disk_limits_set[i] ? tpl->disk_limits[i] : ctx->config->disk_limits[i];
    r->mac = g_strdup(warm->mac);
    r->user = g_strdup(tpl->user);
    r->instance_id = g_strdup(warm->instance_id);
    r->warm_base = g_strdup(warm->disk_path);
    r->created = g_get_real_time() / G_USEC_PER_SEC;
    r->state_since = r->created;

    vm_autofd public_fd = -1;
    vm_autofd backend_fd = -1;
    g_mutex_lock(&ctx->lock);
    gboolean ports = hostd_allocate_port(ctx, 0, &r->ssh_port, &public_fd, error) &&
                     hostd_allocate_port(ctx, r->ssh_port, &r->backend_port, &backend_fd, error);
    g_mutex_unlock(&ctx->lock);
    if (!ports || !hostd_confine_hold(ctx, &r->agent_id, error))
        return NULL;
    if (g_mkdir(r->dir, 0711) < 0) {
        vm_throw_errno(error, errno, "cannot create %s", r->dir);
        hostd_confine_unhold(ctx, r->agent_id);
        return NULL;
    }
    if (!hostd_agent_record_save(r, error)) {
        hostd_confine_unhold(ctx, r->agent_id);
        vm_remove_tree(r->dir, NULL);
        return NULL;
    }
    hostd_ports_hold(ctx, r->name, g_steal_fd(&public_fd), g_steal_fd(&backend_fd));

    g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
    g_autofree char *seed = hostd_agent_record_path(r, HOSTD_AGENT_SEED);
    g_autofree char *xml_path = hostd_agent_record_path(r, HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *scratch = hostd_agent_record_path(r, "warm.save");
    g_autofree char *xml = NULL;
    g_autoptr(virDomain) dom = NULL;
    gboolean ok = vm_qemu_img_overlay(warm->disk_path, disk, r->disk_gib, error) &&
                  hostd_warm_write_seed(tpl, warm->instance_id, seed, error) &&
                  (xml = hostd_agent_domain_xml(ctx, r, image, HOSTD_AGENT_DISK, error)) != NULL;
    /* Building the definition had its console followed: a paused machine writes nothing, and a
     * taken one's console is followed under its agent's name. */
    hostd_console_unwatch(ctx, r->name);
    ok = ok && vm_file_write_atomic(xml_path, xml, -1, 0600, error) &&
         hostd_confine_agent(ctx, r, error);
    if (ok) {
        /* QEMU binds its forward itself: hostd lets the port go right before. */
        hostd_ports_release_backend(ctx, r->name);
        dom = virDomainDefineXML(ctx->lv->conn, xml);
        ok = dom != NULL ? hostd_warm_restore(ctx, dom, warm->memory_path, xml, scratch, NULL,
                                              ret_trace, error)
                         : hostd_libvirt_throw(error, "cannot define the domain");
    }
    if (!ok) {
        pool_discard(ctx, g_steal_pointer(&r));
        return NULL;
    }
    return g_steal_pointer(&r);
}

/* Removes @tpl_name's machines that are not of @warm_disk (NULL: none is current) and those
 * beyond @wanted; returns how many are left. */
static guint
pool_trim(HostdContext *ctx, HostdPool *pool, const char *tpl_name, const char *warm_disk,
          guint wanted)
{
    g_autoptr(GPtrArray) gone = g_ptr_array_new();
    guint kept = 0;

    g_mutex_lock(&pool->lock);
    for (guint i = 0; i < pool->machines->len;) {
        HostdAgentRecord *m = pool->machines->pdata[i];
        if (!g_str_equal(m->template_name, tpl_name)) {
            i++;
            continue;
        }
        if (warm_disk == NULL || g_strcmp0(m->warm_base, warm_disk) != 0 || kept >= wanted) {
            g_ptr_array_add(gone, g_ptr_array_steal_index(pool->machines, i));
            continue;
        }
        kept++;
        i++;
    }
    g_mutex_unlock(&pool->lock);
    for (guint i = 0; i < gone->len; i++) {
        HostdAgentRecord *m = gone->pdata[i];
        hostd_context_log(ctx, "pool %s: machine %s removed (%s)", tpl_name, m->name,
                          warm_disk == NULL || g_strcmp0(m->warm_base, warm_disk) != 0
                              ? "its warm image is no longer current"
                              : "the pool is smaller now");
        pool_discard(ctx, m);
    }
    return kept;
}

/* One look at every template: what is stale or too many goes, and one machine is made for the
 * first pool that is short and has room. Returns whether one was made or tried (look again at
 * once). */
static gboolean
pool_fill_once(HostdContext *ctx, HostdPool *pool)
{
    g_autoptr(GPtrArray) templates = vm_template_load_dir(ctx->config->templates_dir, NULL);
    if (templates == NULL)
        return FALSE;

    /* The machines of a template that is gone go too. */
    g_autoptr(GHashTable) known = g_hash_table_new(g_str_hash, g_str_equal);
    for (guint i = 0; i < templates->len; i++)
        g_hash_table_add(known, ((VmTemplate *)templates->pdata[i])->name);
    g_autoptr(GPtrArray) orphans = g_ptr_array_new_with_free_func(g_free);
    g_mutex_lock(&pool->lock);
    for (guint i = 0; i < pool->machines->len; i++) {
        HostdAgentRecord *m = pool->machines->pdata[i];
        if (!g_hash_table_contains(known, m->template_name))
            g_ptr_array_add(orphans, g_strdup(m->template_name));
    }
    g_mutex_unlock(&pool->lock);
    for (guint i = 0; i < orphans->len; i++)
        pool_trim(ctx, pool, orphans->pdata[i], NULL, 0);

    for (guint i = 0; i < templates->len; i++) {
        const VmTemplate *tpl = templates->pdata[i];
        guint wanted = tpl->pool_set ? tpl->pool : ctx->config->pool;
        g_autoptr(VmImage) image =
            wanted > 0 ? vm_image_lookup(ctx->config->images_dir, tpl, NULL) : NULL;
        g_autofree char *why = NULL;
        g_autoptr(HostdWarmImage) warm =
            image != NULL ? hostd_warm_lookup(ctx, tpl, image, tpl->cpus, tpl->memory_mib,
                                              tpl->disk_gib, &why)
                          : NULL;
        guint have = pool_trim(ctx, pool, tpl->name, warm != NULL ? warm->disk_path : NULL,
                               warm != NULL ? wanted : 0);
        if (warm == NULL || have >= wanted)
            continue;
        guint64 available = 0;
        if (!pool_memory_allows(tpl->memory_mib, &available))
            continue;
        g_mutex_lock(&pool->lock);
        gboolean stopping = pool->stopping;
        g_mutex_unlock(&pool->lock);
        if (stopping)
            return FALSE;

        gint64 start = g_get_monotonic_time();
        g_autofree char *trace = NULL;
        g_autoptr(GError) error = NULL;
        HostdAgentRecord *m = pool_make(ctx, tpl, image, warm, &trace, &error);
        if (m == NULL) {
            hostd_context_log(ctx, "pool %s: no machine made: %s", tpl->name, error->message);
            return FALSE;
        }
        g_mutex_lock(&pool->lock);
        g_ptr_array_add(pool->machines, m);
        g_mutex_unlock(&pool->lock);
        hostd_context_log(ctx,
                          "pool %s: machine %s waits, paused (%u of %u; %" G_GINT64_FORMAT
                          " ms: %s; %" G_GUINT64_FORMAT " MiB were available)",
                          tpl->name, m->name, have + 1, wanted,
                          (g_get_monotonic_time() - start) / 1000, trace, available);
        return TRUE;
    }
    return FALSE;
}

/* The threads of machine @m's QEMU, restored at the pool thread's priority, at @priority. */
static void
pool_renice(HostdContext *ctx, const HostdAgentRecord *m, int priority)
{
    GPid pid = hostd_memory_qemu_pid(ctx->lv, m->name);
    if (pid == 0)
        return;
    g_autofree char *tasks = g_strdup_printf("/proc/%d/task", (int)pid);
    g_autoptr(GDir) dir = g_dir_open(tasks, 0, NULL);
    const char *tid;
    while (dir != NULL && (tid = g_dir_read_name(dir)) != NULL) {
        guint64 id = 0;
        if (g_ascii_string_to_unsigned(tid, 10, 1, G_MAXINT32, &id, NULL) &&
            setpriority(PRIO_PROCESS, (id_t)id, priority) < 0) {
            /* Gone meanwhile, or not allowed: it keeps the pool's priority. */
        }
    }
}

static gpointer
pool_thread(gpointer data)
{
    HostdContext *ctx = data;
    HostdPool *pool = ctx->pool;

    /* Filling a pool is never urgent: libvirt starts each machine's QEMU from this thread, so
     * its restore runs at this priority too, on what the agents leave of the CPUs (the machine
     * taken gets hostd's priority back, pool_take()). */
    if (setpriority(PRIO_PROCESS, (id_t)gettid(), POOL_NICE) < 0) {
        /* Not allowed: the pool fills at hostd's priority. */
    }

    for (;;) {
        /* A machine being made takes CPU from a warm `new` (its identity step, or the restore
         * of one that found the pool empty): the pool fills only once none has been under way
         * for POOL_QUIET_S. */
        g_mutex_lock(&pool->lock);
        while (!pool->stopping && (pool->asking > 0 || g_get_monotonic_time() < pool->quiet_from)) {
            if (pool->asking > 0)
                g_cond_wait(&pool->wake, &pool->lock);
            else
                g_cond_wait_until(&pool->wake, &pool->lock, pool->quiet_from);
        }
        g_mutex_unlock(&pool->lock);
        gboolean again = pool_fill_once(ctx, pool);
        g_mutex_lock(&pool->lock);
        if (!pool->stopping && !again)
            g_cond_wait_until(&pool->wake, &pool->lock,
                              g_get_monotonic_time() + POOL_LOOK_EVERY_S * G_USEC_PER_SEC);
        gboolean stopping = pool->stopping;
        g_mutex_unlock(&pool->lock);
        if (stopping)
            return NULL;
    }
}

static HostdAgentRecord *
pool_take(gpointer data, const char *template_name, const char *warm_disk, guint cpus,
          guint memory_mib, guint disk_gib)
{
    HostdContext *ctx = data;
    HostdPool *pool = ctx->pool;
    HostdAgentRecord *taken = NULL;

    g_mutex_lock(&pool->lock);
    for (guint i = 0; i < pool->machines->len && !pool->stopping; i++) {
        HostdAgentRecord *m = pool->machines->pdata[i];
        if (g_str_equal(m->template_name, template_name) &&
            g_strcmp0(m->warm_base, warm_disk) == 0 && m->cpus == cpus &&
            m->memory_mib == memory_mib && m->disk_gib == disk_gib) {
            taken = g_ptr_array_steal_index(pool->machines, i);
            break;
        }
    }
    pool->asking++;
    g_mutex_unlock(&pool->lock);
    if (taken != NULL) {
        errno = 0;
        int priority = getpriority(PRIO_PROCESS, 0);
        pool_renice(ctx, taken, errno == 0 ? priority : 0);
    }
    return taken;
}

static void
pool_settled(gpointer data)
{
    HostdContext *ctx = data;
    HostdPool *pool = ctx->pool;

    g_mutex_lock(&pool->lock);
    pool->asking--;
    pool->quiet_from = g_get_monotonic_time() + POOL_QUIET_S * G_USEC_PER_SEC;
    g_cond_signal(&pool->wake);
    g_mutex_unlock(&pool->lock);
}

static guint
pool_count(gpointer data, const char *template_name)
{
    HostdContext *ctx = data;
    HostdPool *pool = ctx->pool;
    guint n = 0;

    g_mutex_lock(&pool->lock);
    for (guint i = 0; i < pool->machines->len; i++) {
        if (g_str_equal(((HostdAgentRecord *)pool->machines->pdata[i])->template_name,
                        template_name))
            n++;
    }
    g_mutex_unlock(&pool->lock);
    return n;
}

/* The pool's dirs that an agent's link in agents/ names: those are agents', not the pool's. */
static GHashTable *
pool_dirs_taken(HostdContext *ctx)
{
    GHashTable *taken = g_hash_table_new_full(g_str_hash, g_str_equal, free, NULL);
    g_autoptr(GDir) agents = g_dir_open(ctx->state->agents_dir, 0, NULL);
    const char *name;

    while (agents != NULL && (name = g_dir_read_name(agents)) != NULL) {
        g_autofree char *path = g_build_filename(ctx->state->agents_dir, name, NULL);
        struct stat st;
        char *target;

        if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && (target = realpath(path, NULL)) != NULL)
            g_hash_table_add(taken, target);
    }
    return taken;
}

/* What an earlier run left waiting: destroyed and removed (the pool is made again). */
static void
pool_remove_leftovers(HostdContext *ctx)
{
    g_autofree char *root = pool_root(ctx);
    g_autoptr(GDir) dir = g_dir_open(root, 0, NULL);
    if (dir == NULL)
        return;
    g_autoptr(GHashTable) taken = pool_dirs_taken(ctx);
    g_autofree char *real_root = realpath(root, NULL);
    const char *name;
    while ((name = g_dir_read_name(dir)) != NULL) {
        g_autofree char *path = g_build_filename(real_root != NULL ? real_root : root, name, NULL);
        if (g_hash_table_contains(taken, path))
            continue;
        g_autoptr(GError) error = NULL;
        /* A machine's domain has its dir's name. */
        if (!g_str_has_prefix(name, "pool.") || !hostd_libvirt_remove(ctx->lv, name, &error)) {
            hostd_context_log(ctx, "pool: %s left as it is: %s", path,
                              error != NULL ? error->message : "not a machine of the pool");
            continue;
        }
        hostd_ports_release(ctx, name);
        vm_remove_tree(path, NULL);
        hostd_context_log(ctx, "pool: removed machine %s left by an earlier run", name);
    }
}

void
hostd_pool_start(HostdContext *ctx)
{
    pool_remove_leftovers(ctx);
    HostdPool *pool = g_new0(HostdPool, 1);
    g_mutex_init(&pool->lock);
    g_cond_init(&pool->wake);
    pool->machines = g_ptr_array_new();
    ctx->pool = pool;
    ctx->pool_count = pool_count;
    ctx->pool_take = pool_take;
    ctx->pool_settled = pool_settled;
    pool->thread = g_thread_new("hostd-pool", pool_thread, ctx);
}

void
hostd_pool_stop(HostdContext *ctx)
{
    HostdPool *pool = ctx->pool;
    if (pool == NULL)
        return;
    g_mutex_lock(&pool->lock);
    pool->stopping = TRUE;
    g_cond_signal(&pool->wake);
    g_mutex_unlock(&pool->lock);
    g_thread_join(pool->thread);
    ctx->pool_take = NULL;
    ctx->pool_settled = NULL;
    ctx->pool_count = NULL;
    for (guint i = 0; i < pool->machines->len; i++)
        pool_discard(ctx, pool->machines->pdata[i]);
    g_ptr_array_unref(pool->machines);
    g_cond_clear(&pool->wake);
    g_mutex_clear(&pool->lock);
    ctx->pool = NULL;
    g_free(pool);
}
