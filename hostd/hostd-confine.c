#include "hostd-confine.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-ids.h"
#include "vm-checkpoint.h"
#include "vm-domain-read.h"
#include "vm-error.h"

#define CONFINE_DIR_MODE    0710 /* root's; the agent's group may traverse, nobody else */
#define CONFINE_ACTIVE_MODE 0600 /* the agent's id: its QEMU writes it */
#define CONFINE_FROZEN_MODE 0440 /* root's; the agent's group reads it */
#define CONFINE_SEED_MODE   0400
#define CONFINE_READ        4  /* an ACL entry's permissions: read */
#define CONFINE_TRAVERSE    1  /* and traverse */
#define CONFINE_FORKS_MAX   64 /* as hostd_checkpoint_chain_check(): deeper chains are refused */

/* Makes every file under @dir root's and writable by nobody else: images are shared by every
 * agent, and an owner could make them writable again. */
static void
confine_shared_tree(HostdContext *ctx, const char *dir, guint depth)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *entry;

    while (d != NULL && depth < 8 && (entry = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(dir, entry, NULL);
        struct stat st;
        if (lstat(path, &st) < 0 || S_ISLNK(st.st_mode) ||
            !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)))
            continue;
        /* Write bits go; read bits stay as they were made (a warm image's memory is root's
         * alone: libvirt reads it as root). */
        mode_t mode = st.st_mode & 07777 & ~(mode_t)022;
        /* The files of a build in progress are its machine's until it is done. */
        if (S_ISDIR(st.st_mode) && g_str_has_suffix(entry, ".tmp"))
            continue;
        if (st.st_uid != 0 || st.st_gid != 0 || (st.st_mode & 07777) != mode) {
            g_autoptr(GError) error = NULL;
            if (!hostd_ids_own(path, 0, 0, mode, NULL, 0, 0, &error))
                hostd_context_log(ctx, "images: %s", error->message);
        }
        if (S_ISDIR(st.st_mode))
            confine_shared_tree(ctx, path, depth + 1);
    }
}

static char *
confine_start_agents(HostdContext *ctx)
{
    g_autofree char *caps = NULL;
    guint uid = 0, gid = 0;

    ctx->agent_ids = FALSE;
    if (ctx->config->agent_id_min == 0)
        return g_strdup("agent ids: off (agent-ids = off): every agent's QEMU runs as the "
                        "driver's user");
    if (geteuid() != 0)
        return g_strdup("agent ids: off (hostd is not root): every agent's QEMU runs as hostd's "
                        "user");
    caps = virConnectGetCapabilities(ctx->lv->conn);
    if (caps == NULL)
        virResetLastError();
    if (caps == NULL ||
        !vm_capabilities_read_dac_owner(caps, ctx->lv->virt_type, &uid, &gid, NULL) || uid == 0)
        return g_strdup("agent ids: off (the driver runs QEMU without a DAC label of an "
                        "unprivileged user)");
    ctx->agent_ids = TRUE;
    confine_shared_tree(ctx, ctx->config->images_dir, 0);
    return g_strdup_printf("agent ids: on, each agent's QEMU runs as an id of its own from "
                           "%u-%u",
                           ctx->config->agent_id_min, ctx->config->agent_id_max);
}

char *
hostd_confine_start(HostdContext *ctx)
{
    g_autofree char *agents = confine_start_agents(ctx);
    const HostdConfig *config = ctx->config;

    if (geteuid() != 0)
        return g_strdup_printf("%s; workers run as hostd's user", agents);
    if (config->worker_id_min == 0)
        return g_strdup_printf("%s; workers: every one as egress-user (worker-ids = off)", agents);
    return g_strdup_printf("%s; each agent's SSH and egress workers run as ids of their own from "
                           "%u-%u",
                           agents, config->worker_id_min, config->worker_id_max);
}

static gboolean
confine_pick_locked(HostdContext *ctx, guint *ret_id, GError **error)
{
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return FALSE;
    return hostd_ids_pick(records, ctx->ids_held, ctx->config->agent_id_min,
                          ctx->config->agent_id_max, ret_id, error);
}

gboolean
hostd_confine_pick_locked(HostdContext *ctx, HostdAgentRecord *r, GError **error)
{
    if (!ctx->agent_ids || r->agent_id != 0)
        return TRUE;
    return confine_pick_locked(ctx, &r->agent_id, error);
}

gboolean
hostd_confine_hold(HostdContext *ctx, guint *ret_id, GError **error)
{
    guint id = 0;
    gboolean ok = TRUE;

    if (ctx->agent_ids) {
        g_mutex_lock(&ctx->lock);
        ok = confine_pick_locked(ctx, &id, error);
        if (ok)
            g_hash_table_add(ctx->ids_held, GUINT_TO_POINTER(id));
        g_mutex_unlock(&ctx->lock);
    }
    if (ok)
        *ret_id = id;
    return ok;
}

void
hostd_confine_unhold(HostdContext *ctx, guint id)
{
    if (id == 0)
        return;
    g_mutex_lock(&ctx->lock);
    g_hash_table_remove(ctx->ids_held, GUINT_TO_POINTER(id));
    g_mutex_unlock(&ctx->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Who reads what: a fork's disk stands on a checkpoint image of its source, that image on the
 * source's older ones, and the source's first disk maybe on its own source's checkpoint. */

static void
confine_readers_add(GHashTable *readers, const char *path, guint id)
{
    GArray *ids = g_hash_table_lookup(readers, path);
    if (ids == NULL) {
        ids = g_array_new(FALSE, FALSE, sizeof(guint));
        g_hash_table_insert(readers, g_strdup(path), ids);
    }
    g_array_append_val(ids, id);
}

static void
confine_readers_free(gpointer data)
{
    g_array_free(data, TRUE);
}

/* Calls @each(dir, image path, data) for each image of another agent that @r's disk stands on
 * (images first with their agent's dir), down through its sources; records from @records. */
typedef void (*ConfineEachFunc)(const char *dir, const char *image, gpointer data);

static const HostdAgentRecord *
confine_find(GPtrArray *records, const char *name)
{
    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (g_str_equal(r->name, name))
            return r;
    }
    return NULL;
}

static void
confine_walk_sources(GPtrArray *records, const HostdAgentRecord *r, ConfineEachFunc each,
                     gpointer data)
{
    const char *source = r->forked_from;
    const char *checkpoint = r->fork_checkpoint;

    for (guint depth = 0; source != NULL && depth < CONFINE_FORKS_MAX; depth++) {
        const HostdAgentRecord *s = confine_find(records, source);
        if (s == NULL)
            return;
        g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(s->dir, NULL);
        if (set == NULL)
            return;
        each(s->dir, NULL, data);
        for (const VmCheckpoint *c = vm_checkpoint_set_find(set, checkpoint); c != NULL;
             c = c->parent != NULL ? vm_checkpoint_set_find(set, c->parent) : NULL) {
            g_autofree char *image = vm_checkpoint_set_path(set, c->image);
            each(s->dir, image, data);
        }
        source = s->forked_from;
        checkpoint = s->fork_checkpoint;
    }
}

typedef struct {
    GHashTable *readers;
    guint id;
} ConfineAdd;

static void
confine_add_each(const char *dir, const char *image, gpointer data)
{
    ConfineAdd *add = data;
    confine_readers_add(add->readers, image != NULL ? image : dir, add->id);
}

/* Every fork's reads of other agents' files, leaving out agent @skip (NULL: none). */
static GHashTable *
confine_readers(GPtrArray *records, const char *skip)
{
    GHashTable *readers =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, confine_readers_free);
    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (r->agent_id == 0 || r->forked_from == NULL || g_strcmp0(r->name, skip) == 0)
            continue;
        ConfineAdd add = {readers, r->agent_id};
        confine_walk_sources(records, r, confine_add_each, &add);
    }
    return readers;
}

/* Sets @path's ACL to the readers @readers holds for it, keeping its owner and mode. */
static gboolean
confine_grant(GHashTable *readers, const char *path, guint perm, GError **error)
{
    struct stat st;
    GArray *ids = g_hash_table_lookup(readers, path);

    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return TRUE;
        return vm_throw_errno(error, errno, "cannot stat %s", path);
    }
    return hostd_ids_own(path, st.st_uid, st.st_gid, st.st_mode & 07777,
                         ids != NULL ? (const guint *)ids->data : NULL, ids != NULL ? ids->len : 0,
                         perm, error);
}

typedef struct {
    GHashTable *readers;
    GError **error;
    gboolean ok;
} ConfineApply;

static void
confine_apply_each(const char *dir, const char *image, gpointer data)
{
    ConfineApply *apply = data;
    if (apply->ok)
        apply->ok = confine_grant(apply->readers, image != NULL ? image : dir,
                                  image != NULL ? CONFINE_READ : CONFINE_TRAVERSE, apply->error);
}

/* ---------------------------------------------------------------------------------------------
 * An agent's own files */

/* A checkpoint image's mode: read-only to its agent's group, unless a merge left it writable. */
static mode_t
confine_frozen_mode(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0 && (st.st_mode & 0020) != 0)
        return CONFINE_FROZEN_MODE | 0020;
    return CONFINE_FROZEN_MODE;
}

static gboolean
confine_own_files(const HostdAgentRecord *r, GHashTable *readers, GError **error)
{
    guint id = r->agent_id;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    GArray *dir_ids = g_hash_table_lookup(readers, r->dir);
    if (!hostd_ids_own(r->dir, 0, id, CONFINE_DIR_MODE,
                       dir_ids != NULL ? (const guint *)dir_ids->data : NULL,
                       dir_ids != NULL ? dir_ids->len : 0, CONFINE_TRAVERSE, error))
        return FALSE;

    g_autoptr(GDir) d = g_dir_open(r->dir, 0, NULL);
    const char *entry;
    while (d != NULL && (entry = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(r->dir, entry, NULL);
        gboolean ok = TRUE;
        if (g_str_equal(entry, set->active)) {
            ok = hostd_ids_own(path, id, id, CONFINE_ACTIVE_MODE, NULL, 0, 0, error);
        } else if (g_str_has_suffix(entry, ".qcow2")) {
            GArray *ids = g_hash_table_lookup(readers, path);
            ok = hostd_ids_own(path, 0, id, confine_frozen_mode(path),
                               ids != NULL ? (const guint *)ids->data : NULL,
                               ids != NULL ? ids->len : 0, CONFINE_READ, error);
        } else if (g_str_equal(entry, HOSTD_AGENT_SEED)) {
            ok = hostd_ids_own(path, id, id, CONFINE_SEED_MODE, NULL, 0, 0, error);
        } else if (g_str_equal(entry, "egress.sock") || g_str_equal(entry, "api.sock")) {
            /* The sockets its QEMU's guest forward helper connects to (HOSTD_AGENT_EGRESS_SOCKET,
             * HOSTD_AGENT_API_SOCKET): made with their owner (hostd_egress_socket_owner()), but
             * a proxy that keeps running across an agent's first boot with an id keeps its
             * socket. */
            ok = hostd_ids_own(path, id, id, CONFINE_ACTIVE_MODE, NULL, 0, 0, error);
        }
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

/* Every agent's record into *ret_all, @r's first and in its form here (a new agent's may not be
 * on disk yet in its latest form): *ret_all points into the returned array, which owns the
 * records read, and at @r. NULL when the records cannot be read. */
static GPtrArray *
confine_records_with(HostdContext *ctx, const HostdAgentRecord *r, GPtrArray **ret_all,
                     GError **error)
{
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return NULL;
    GPtrArray *all = g_ptr_array_new();
    g_ptr_array_add(all, (gpointer)r);
    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *o = records->pdata[i];
        if (!g_str_equal(o->name, r->name))
            g_ptr_array_add(all, (gpointer)o);
    }
    *ret_all = all;
    return g_steal_pointer(&records);
}

gboolean
hostd_confine_agent(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    if (!ctx->agent_ids || r->agent_id == 0)
        return TRUE;
    g_autoptr(GPtrArray) all = NULL;
    g_autoptr(GPtrArray) records = confine_records_with(ctx, r, &all, error);
    if (records == NULL)
        return FALSE;
    g_autoptr(GHashTable) readers = confine_readers(all, NULL);
    if (!confine_own_files(r, readers, error))
        return FALSE;
    ConfineApply apply = {readers, error, TRUE};
    confine_walk_sources(all, r, confine_apply_each, &apply);
    return apply.ok;
}

gboolean
hostd_confine_overlay(HostdContext *ctx, const HostdAgentRecord *r, const char *path,
                      GError **error)
{
    if (!ctx->agent_ids || r->agent_id == 0)
        return TRUE;
    return hostd_ids_own(path, r->agent_id, r->agent_id, CONFINE_ACTIVE_MODE, NULL, 0, 0, error);
}

gboolean
hostd_confine_merging(HostdContext *ctx, const HostdAgentRecord *r, gboolean writable,
                      GError **error)
{
    if (!ctx->agent_ids || r->agent_id == 0)
        return TRUE;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    /* A chmod keeps the forks' ACL entries: it sets the mask, and theirs stay read-only. */
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *path = vm_checkpoint_set_path(set, c->image);
        struct stat st;
        if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (chmod(path, writable ? CONFINE_FROZEN_MODE | 0020 : CONFINE_FROZEN_MODE) < 0)
            return vm_throw_errno(error, errno, "cannot chmod %s", path);
    }
    /* A warm layer a move or a recovery brought into the agent's dir is one of its frozen
     * images: its header is rewritten as the agent's id too. */
    g_autofree char *prefix = g_strconcat(r->dir, "/", NULL);
    if (r->warm_base != NULL && g_str_has_prefix(r->warm_base, prefix) &&
        chmod(r->warm_base, writable ? CONFINE_FROZEN_MODE | 0020 : CONFINE_FROZEN_MODE) < 0 &&
        errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot chmod %s", r->warm_base);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * The workers' ids */

/* The slot of agent @name's workers, with ctx->lock held: its id's place in agent-ids where it
 * has one there; else one of its own, kept in ctx->worker_slots, that no agent id's slot, held
 * id's slot or other agent's is (an agent made later does not take the agent id whose slot it
 * is: that id is held). */
static gboolean
confine_worker_slot_locked(HostdContext *ctx, const char *name, guint agent_id, guint *ret_slot,
                           GError **error)
{
    const HostdConfig *config = ctx->config;
    guint slots = HOSTD_IDS_WORKER_SLOTS(config->worker_id_min, config->worker_id_max);
    gboolean ids_on = config->agent_id_min != 0;
    g_autoptr(GHashTable) taken = NULL;
    g_autoptr(GPtrArray) records = NULL;
    GHashTableIter iter;
    gpointer key, value;

    if (ids_on && agent_id >= config->agent_id_min && agent_id <= config->agent_id_max) {
        *ret_slot = agent_id - config->agent_id_min;
        return TRUE;
    }
    if (g_hash_table_lookup_extended(ctx->worker_slots, name, NULL, &value)) {
        *ret_slot = GPOINTER_TO_UINT(value) - 1;
        return TRUE;
    }
    /* Read under the lock: a `new` picks its id and saves its record under it. */
    records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return FALSE;
    taken = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (guint i = 0; ids_on && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (r->agent_id >= config->agent_id_min && r->agent_id <= config->agent_id_max)
            g_hash_table_add(taken, GUINT_TO_POINTER(r->agent_id - config->agent_id_min));
    }
    g_hash_table_iter_init(&iter, ctx->ids_held);
    while (ids_on && g_hash_table_iter_next(&iter, &key, NULL)) {
        guint id = GPOINTER_TO_UINT(key);
        if (id >= config->agent_id_min && id <= config->agent_id_max)
            g_hash_table_add(taken, GUINT_TO_POINTER(id - config->agent_id_min));
    }
    g_hash_table_iter_init(&iter, ctx->worker_slots);
    while (g_hash_table_iter_next(&iter, NULL, &value))
        g_hash_table_add(taken, GUINT_TO_POINTER(GPOINTER_TO_UINT(value) - 1));
    for (guint slot = 0; slot < slots; slot++) {
        if (g_hash_table_contains(taken, GUINT_TO_POINTER(slot)))
            continue;
        g_hash_table_insert(ctx->worker_slots, g_strdup(name), GUINT_TO_POINTER(slot + 1));
        if (ids_on && slot <= config->agent_id_max - config->agent_id_min)
            g_hash_table_add(ctx->ids_held, GUINT_TO_POINTER(config->agent_id_min + slot));
        *ret_slot = slot;
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_NO_RESOURCES,
                    "no free worker ids in %u-%u (worker-ids in hostd.conf) for agent '%s'",
                    config->worker_id_min, config->worker_id_max, name);
}

/* With ctx->lock held: whether no worker id of slot @slot is a user's or group's of the
 * host (one made since worker-ids was checked at start) or an agent's id (one from an earlier
 * agent-ids). */
static gboolean
confine_worker_check_locked(HostdContext *ctx, const char *name, guint slot, GError **error)
{
    const HostdConfig *config = ctx->config;
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);

    if (records == NULL)
        return FALSE;
    for (HostdWorkerKind kind = HOSTD_WORKER_SSH; kind <= HOSTD_WORKER_API; kind++) {
        guint id = hostd_ids_worker(config->worker_id_min, config->worker_id_max, slot, kind);
        const char *what = kind == HOSTD_WORKER_SSH      ? "SSH"
                           : kind == HOSTD_WORKER_EGRESS ? "egress"
                                                         : "in-guest API";
        if (hostd_ids_named(id))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "the %s worker of agent '%s' would run as %u, a user or group of the "
                            "host: set worker-ids to a range of ids nobody has",
                            what, name, id);
        for (guint i = 0; i < records->len; i++) {
            const HostdAgentRecord *r = records->pdata[i];
            if (r->agent_id == id)
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "the %s worker of agent '%s' would run as %u, the id of agent "
                                "'%s' (from an earlier agent-ids): set worker-ids to a range no "
                                "agent's id is in",
                                what, name, id, r->name);
        }
    }
    return TRUE;
}

gboolean
hostd_confine_worker_user(HostdContext *ctx, const char *name, guint agent_id, HostdWorkerKind kind,
                          gboolean *ret_change, guint *ret_uid, guint *ret_gid, GError **error)
{
    const HostdConfig *config = ctx->config;
    guint slot = 0;
    gboolean ok;

    if (geteuid() != 0 || config->worker_id_min == 0) {
        gboolean change;
        uid_t uid;
        gid_t gid;

        if (!hostd_config_worker_user(config, &change, &uid, &gid, error))
            return FALSE;
        *ret_change = change;
        *ret_uid = uid;
        *ret_gid = gid;
        return TRUE;
    }
    /* Asked before each request of an SSH worker: the records are read only the first time for
     * an agent (and its id) in hostd's run. */
    g_mutex_lock(&ctx->lock);
    ok = confine_worker_slot_locked(ctx, name, agent_id, &slot, error);
    if (ok && GPOINTER_TO_UINT(g_hash_table_lookup(ctx->workers_checked, name)) != agent_id + 1) {
        ok = confine_worker_check_locked(ctx, name, slot, error);
        if (ok)
            g_hash_table_insert(ctx->workers_checked, g_strdup(name),
                                GUINT_TO_POINTER(agent_id + 1));
    }
    g_mutex_unlock(&ctx->lock);
    if (!ok)
        return FALSE;
    *ret_change = TRUE;
    *ret_uid = hostd_ids_worker(config->worker_id_min, config->worker_id_max, slot, kind);
    *ret_gid = *ret_uid;
    return TRUE;
}

gboolean
hostd_confine_ssh_worker_user(gpointer ctx, const char *agent, guint agent_id, gboolean *ret_change,
                              guint *ret_uid, guint *ret_gid, GError **error)
{
    return hostd_confine_worker_user(ctx, agent, agent_id, HOSTD_WORKER_SSH, ret_change, ret_uid,
                                     ret_gid, error);
}

void
hostd_confine_release(HostdContext *ctx, const HostdAgentRecord *r)
{
    gpointer slot;

    /* Its workers ended before (rm forgets its SSH sessions and stops its proxy first). */
    g_mutex_lock(&ctx->lock);
    if (g_hash_table_lookup_extended(ctx->worker_slots, r->name, NULL, &slot)) {
        guint s = GPOINTER_TO_UINT(slot) - 1;
        if (ctx->config->agent_id_min != 0 &&
            s <= ctx->config->agent_id_max - ctx->config->agent_id_min)
            g_hash_table_remove(ctx->ids_held, GUINT_TO_POINTER(ctx->config->agent_id_min + s));
        g_hash_table_remove(ctx->worker_slots, r->name);
    }
    g_hash_table_remove(ctx->workers_checked, r->name);
    g_mutex_unlock(&ctx->lock);
    if (!ctx->agent_ids || r->agent_id == 0 || r->forked_from == NULL)
        return;
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) all = NULL;
    g_autoptr(GPtrArray) records = confine_records_with(ctx, r, &all, &error);
    if (records != NULL) {
        g_autoptr(GHashTable) readers = confine_readers(all, r->name);
        ConfineApply apply = {readers, &error, TRUE};
        confine_walk_sources(all, r, confine_apply_each, &apply);
        if (apply.ok)
            return;
    }
    hostd_context_log(ctx, "agent '%s': its id %u keeps access to its source's images: %s", r->name,
                      r->agent_id, error != NULL ? error->message : "unknown error");
}
