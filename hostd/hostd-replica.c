#include "hostd-replica.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-checkpoint.h"
#include "hostd-cluster.h"
#include "hostd-confine.h"
#include "hostd-fence.h"
#include "hostd-guest.h"
#include "hostd-libvirt.h"
#include "hostd-move-private.h"
#include "hostd-resources.h"
#include "vm-checkpoint.h"
#include "vm-error.h"
#include "vm-fleet-records.h"
#include "vm-fs.h"
#include "vm-name.h"
#include "vm-util.h"

/* What a keeping host records of its replica, beside the files. */
#define REPLICA_MANIFEST "replica.ini"
/* How often the keeping side looks for replicas that no longer serve. */
#define REPLICA_SWEEP_S 60
/* An agent whose copy failed is tried again after this long (a new checkpoint: at once). */
#define REPLICA_RETRY_S 60

/* ---------------------------------------------------------------------------------------------
 * The manifest: [replica] from, epoch, template, base-sha256, source-dir, base-path, warm-path,
 * checkpoint, created (when it was copied); [files] NAME = SHA256;SIZE;MTIME. */

typedef struct {
    char *from;
    guint64 epoch;
    char *template_name;
    char *base_sha256;
    char *source_dir;
    char *base_path;
    char *warm_path;
    char *checkpoint;
    gint64 copied;
    GHashTable *files; /* name here -> "SHA256;SIZE;MTIME" */
} ReplicaManifest;

static void
replica_manifest_free(ReplicaManifest *m)
{
    g_free(m->from);
    g_free(m->template_name);
    g_free(m->base_sha256);
    g_free(m->source_dir);
    g_free(m->base_path);
    g_free(m->warm_path);
    g_free(m->checkpoint);
    if (m->files != NULL)
        g_hash_table_unref(m->files);
    g_free(m);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC(ReplicaManifest, replica_manifest_free)

static char *
replica_dir(HostdContext *ctx, const char *name)
{
    return g_build_filename(ctx->state->dir, HOSTD_REPLICAS_DIR, name, NULL);
}

/* Splits "SHA256;SIZE;MTIME" (what a manifest holds, hostd's own writing). */
static gboolean
replica_file_parse(const char *value, char **ret_sha, gint64 *ret_size, gint64 *ret_mtime)
{
    g_auto(GStrv) parts = g_strsplit(value, ";", 3);
    if (g_strv_length(parts) != 3 || strlen(parts[0]) != 64)
        return FALSE;
    *ret_sha = g_strdup(parts[0]);
    *ret_size = g_ascii_strtoll(parts[1], NULL, 10);
    *ret_mtime = g_ascii_strtoll(parts[2], NULL, 10);
    return TRUE;
}

/* The manifest of the replica in @dir; NULL (no error) where there is none. */
static ReplicaManifest *
replica_manifest_load(const char *dir, GError **error)
{
    g_autofree char *path = g_build_filename(dir, REPLICA_MANIFEST, NULL);
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) local_error = NULL;
    if (!g_key_file_load_from_file(kf, path, G_KEY_FILE_NONE, &local_error)) {
        if (g_error_matches(local_error, G_FILE_ERROR, G_FILE_ERROR_NOENT))
            return NULL;
        return vm_throw(error, VM_ERROR_IO, "cannot read %s: %s", path, local_error->message), NULL;
    }
    g_autoptr(ReplicaManifest) m = g_new0(ReplicaManifest, 1);
    m->from = g_key_file_get_string(kf, "replica", "from", NULL);
    m->epoch = g_key_file_get_uint64(kf, "replica", "epoch", NULL);
    m->template_name = g_key_file_get_string(kf, "replica", "template", NULL);
    m->base_sha256 = g_key_file_get_string(kf, "replica", "base-sha256", NULL);
    m->source_dir = g_key_file_get_string(kf, "replica", "source-dir", NULL);
    m->base_path = g_key_file_get_string(kf, "replica", "base-path", NULL);
    m->warm_path = g_key_file_get_string(kf, "replica", "warm-path", NULL);
    m->checkpoint = g_key_file_get_string(kf, "replica", "checkpoint", NULL);
    m->copied = g_key_file_get_int64(kf, "replica", "copied", NULL);
    if (m->from == NULL || m->epoch == 0 || m->template_name == NULL || m->base_sha256 == NULL ||
        m->source_dir == NULL || m->base_path == NULL || m->checkpoint == NULL)
        return vm_throw(error, VM_ERROR_FAILED, "corrupt replica manifest %s", path), NULL;
    m->files = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_auto(GStrv) keys = g_key_file_get_keys(kf, "files", NULL, NULL);
    for (char **k = keys; keys != NULL && *k != NULL; k++) {
        g_autofree char *value = g_key_file_get_string(kf, "files", *k, NULL);
        if (value != NULL && hostd_move_file_name_valid(*k))
            g_hash_table_replace(m->files, g_strdup(*k), g_steal_pointer(&value));
    }
    return g_steal_pointer(&m);
}

/* The name a file of a replica's manifest goes by in a copy's listing. */
static const char *
replica_listed_name(const char *file)
{
    return g_str_equal(file, MOVE_WARM_FILE) ? MOVE_WARM : file;
}

/* ---------------------------------------------------------------------------------------------
 * The agent's host */

/* How many other hosts keep a replica of @r: its own count, else this host's. */
static guint
replica_count(HostdContext *ctx, const HostdAgentRecord *r)
{
    if (r->replicate_own)
        return r->replicate;
    return ctx->config->cluster != NULL ? ctx->config->cluster->replicate : 0;
}

/* Whether @file of @set's agent dir goes into a replica: its records and its checkpoints'
 * images, not the overlay being written, memory, logs or what hostd writes anew. */
static gboolean
replica_file_wanted(const VmCheckpointSet *set, const char *file)
{
    if (!hostd_move_file_name_valid(file) || hostd_move_file_skipped(file) ||
        g_str_equal(file, set->active) || g_str_has_suffix(file, ".log") ||
        (set->pending_file != NULL && g_str_equal(file, set->pending_file)))
        return FALSE;
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        if (c->memory != NULL && g_str_equal(file, c->memory))
            return FALSE;
    }
    return TRUE;
}

GVariant *
hostd_replica_plan(HostdContext *ctx, const char *name, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL)
        return NULL;
    const char *me = hostd_cluster_host_id(ctx->cluster);
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    guint count = replica_count(ctx, r);
    if (count == 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        r->replicate_own ? "agent '%s' has no replicas (vmctl replicate --copies)"
                                         : "agent '%s' has no replicas ([cluster] replicate is 0 "
                                           "on this host)",
                        name),
               NULL;
    if (r->moving_to != NULL || hostd_move_active(ctx, TRUE, name))
        return vm_throw(error, VM_ERROR_BUSY, "agent '%s' is being moved or copied already", name),
               NULL;
    if (g_str_equal(r->phase, HOSTD_PHASE_CREATING))
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' is still being made", name), NULL;
    if (r->fenced != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' is fenced: %s", name, r->fenced),
               NULL;
    if (r->forked_from != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is a fork: its disk stands on checkpoints of '%s' on this "
                        "host, and forks are not replicated",
                        name, r->forked_from),
               NULL;
    g_autofree char *owner = NULL;
    guint64 epoch = 0;
    if (!hostd_cluster_owner_of(ctx->cluster, name, &owner, &epoch, error))
        return NULL;
    if (g_strcmp0(owner, me) != 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not this host's in the fleet (the record names %s)", name,
                        owner != NULL ? owner : "no host"),
               NULL;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return NULL;
    if (set->pending != VM_CHECKPOINT_OP_NONE)
        return vm_throw(error, VM_ERROR_BUSY, "a checkpoint of agent '%s' is under way", name),
               NULL;
    if (set->checkpoints->len == 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' has no checkpoint yet: a replica holds its checkpoints", name),
               NULL;
    const VmCheckpoint *last = set->checkpoints->pdata[set->checkpoints->len - 1];

    g_autoptr(GPtrArray) hosts = NULL;
    g_autoptr(GPtrArray) addresses = NULL;
    if (!hostd_cluster_replica_hosts(ctx->cluster, r->template_name, count, r->replicas, &hosts,
                                     &addresses, error))
        return NULL;
    if (hosts->len == 0)
        return vm_throw(error, VM_ERROR_NO_RESOURCES,
                        "no other live host of the fleet has template '%s' to keep a replica of "
                        "agent '%s'",
                        r->template_name, name),
               NULL;
    g_autoptr(VmImage) image = hostd_agent_image(ctx, r, error);
    if (image == NULL)
        return NULL;
    g_autofree char *base_sha = hostd_move_base_sha256(image->disk_path, error);
    g_autofree char *base_named =
        base_sha != NULL ? hostd_move_base_named(ctx, r, image, error) : NULL;
    if (base_named == NULL)
        return NULL;

    g_auto(GVariantBuilder) files = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    g_autoptr(GDir) dir = g_dir_open(r->dir, 0, error);
    if (dir == NULL)
        return NULL;
    for (const char *file; (file = g_dir_read_name(dir)) != NULL;) {
        if (!replica_file_wanted(set, file))
            continue;
        g_autofree char *path = g_build_filename(r->dir, file, NULL);
        if (!hostd_move_list_add(&files, file, path, error))
            return NULL;
    }
    if (r->warm_base != NULL && !hostd_move_list_add(&files, MOVE_WARM, r->warm_base, error))
        return NULL;
    g_auto(GVariantBuilder) targets = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < hosts->len; i++)
        g_variant_builder_add_parsed(&targets, "{'host': <%s>, 'address': <%s>}",
                                     (const char *)hosts->pdata[i],
                                     (const char *)addresses->pdata[i]);

    HostdMove *m = g_new0(HostdMove, 1);
    g_autoptr(GString) peers = g_string_new(NULL);
    for (guint i = 0; i < hosts->len; i++)
        g_string_append_printf(peers, "%s%s", i > 0 ? "," : "", (const char *)hosts->pdata[i]);
    m->peer = g_string_free(g_steal_pointer(&peers), FALSE);
    m->epoch = epoch;
    m->replica = TRUE;
    hostd_move_put(ctx, TRUE, name, m);

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    hostd_move_describe(&b, me, epoch, r, base_sha, base_named);
    g_variant_builder_add(&b, "{sv}", "checkpoint", g_variant_new_string(last->id));
    g_variant_builder_add(&b, "{sv}", "created", g_variant_new_int64(last->created));
    g_variant_builder_add(&b, "{sv}", "targets", g_variant_builder_end(&targets));
    g_variant_builder_add(&b, "{sv}", "files", g_variant_builder_end(&files));
    return g_variant_builder_end(&b);
}

GVariant *
hostd_replica_set(HostdContext *ctx, const char *name, gboolean own, guint copies, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL)
        return NULL;
    if (own && copies > VM_REPLICAS_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "at most %d copies", VM_REPLICAS_MAX),
               NULL;
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    r->replicate_own = own;
    r->replicate = own ? copies : 0;
    if (!hostd_agent_record_save(r, error))
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "agent", hostd_agent_to_variant(ctx, r));
    g_variant_builder_add(&b, "{sv}", "copies", g_variant_new_uint32(replica_count(ctx, r)));
    return g_variant_builder_end(&b);
}

GVariant *
hostd_replica_done(HostdContext *ctx, const char *name, const char *checkpoint, char **hosts,
                   GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    hostd_move_forget_replica(ctx, TRUE, name);
    if (hosts == NULL || hosts[0] == NULL)
        return g_variant_new_parsed("@a{sv} {}");
    for (char **h = hosts; *h != NULL; h++) {
        if (!vm_fleet_host_id_valid(*h))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' is no host id", *h), NULL;
    }
    if (checkpoint == NULL || !hostd_move_file_name_valid(checkpoint))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "replica-done needs its checkpoint"),
               NULL;
    g_free(r->replicas);
    r->replicas = g_strjoinv(",", hosts);
    g_free(r->replicated);
    r->replicated = g_strdup(checkpoint);
    if (!hostd_agent_record_save(r, error))
        return NULL;
    hostd_context_log(ctx, "agent '%s': checkpoint %s replicated to %s", name, checkpoint,
                      r->replicas);
    return g_variant_new_parsed("@a{sv} {}");
}

GVariant *
hostd_replica_abort_out(HostdContext *ctx, const char *name, GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    hostd_move_forget_replica(ctx, TRUE, name);
    return g_variant_new_parsed("@a{sv} {}");
}

/* ---------------------------------------------------------------------------------------------
 * The keeping host */

GVariant *
hostd_replica_begin(HostdContext *ctx, const HostdMoveIn *in, GError **error)
{
    if (!hostd_move_in_valid(ctx, in, "a replica", error))
        return NULL;
    const char *me = hostd_cluster_host_id(ctx->cluster);
    if (g_str_equal(in->from, me))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "host '%s' keeps no replica of its own agent '%s'", me, in->name),
               NULL;
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, in->name);
    if (!hostd_move_in_check(ctx, in, error) ||
        !hostd_move_check_base(ctx, in->template_name, in->base_sha256, in->from, error))
        return NULL;

    g_autofree char *stage = hostd_replica_stage_dir(ctx, in->name);
    vm_remove_tree(stage, NULL);
    if (g_mkdir_with_parents(stage, 0700) < 0)
        return vm_throw_errno(error, errno, "cannot create %s", stage), NULL;
    /* What the last replica holds need not come again, when it is of the same agent's dir. */
    g_auto(GVariantBuilder) have = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    g_autofree char *kept_dir = replica_dir(ctx, in->name);
    g_autoptr(ReplicaManifest) kept = replica_manifest_load(kept_dir, NULL);
    if (kept != NULL && g_str_equal(kept->from, in->from) &&
        g_str_equal(kept->source_dir, in->source_dir)) {
        GHashTableIter it;
        gpointer file, value;
        g_hash_table_iter_init(&it, kept->files);
        while (g_hash_table_iter_next(&it, &file, &value)) {
            g_autofree char *sha = NULL;
            gint64 size = 0, mtime = 0;
            if (replica_file_parse(value, &sha, &size, &mtime))
                g_variant_builder_add_parsed(
                    &have, "{'file': <%s>, 'size': <%x>, 'mtime': <%x>, 'sha256': <%s>}",
                    replica_listed_name(file), size, mtime, sha);
        }
    }
    HostdMove *m = g_new0(HostdMove, 1);
    m->peer = g_strdup(in->from);
    m->epoch = in->epoch;
    m->replica = TRUE;
    m->sums = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    m->template_name = g_strdup(in->template_name);
    m->source_dir = g_strdup(in->source_dir);
    m->base_path = g_strdup(in->base_path);
    m->warm_path = g_strdup(in->warm_path);
    m->base_sha256 = g_strdup(in->base_sha256);
    hostd_move_put(ctx, FALSE, in->name, m);
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "have", g_variant_builder_end(&have));
    return g_variant_builder_end(&b);
}

/* Parses "SHA256 SIZE MTIME NAME" of a replica's commit. */
static gboolean
replica_line_parse(const char *line, char **ret_sha, gint64 *ret_size, gint64 *ret_mtime,
                   char **ret_file, GError **error)
{
    g_auto(GStrv) parts = g_strsplit(line, " ", 4);
    gint64 size = 0, mtime = 0;
    if (g_strv_length(parts) != 4 || strlen(parts[0]) != 64 ||
        !g_ascii_string_to_signed(parts[1], 10, 0, G_MAXINT64, &size, NULL) ||
        !g_ascii_string_to_signed(parts[2], 10, 0, G_MAXINT64, &mtime, NULL) ||
        (!g_str_equal(parts[3], MOVE_WARM) &&
         (!hostd_move_file_name_valid(parts[3]) || hostd_move_file_skipped(parts[3]))))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "'%.80s' is no \"SHA256 SIZE MTIME NAME\" of a replica", line);
    for (const char *c = parts[0]; *c != '\0'; c++) {
        if (!g_ascii_isxdigit(*c))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%.64s' is no SHA-256", parts[0]);
    }
    *ret_sha = g_ascii_strdown(parts[0], -1);
    *ret_size = size;
    *ret_mtime = mtime;
    *ret_file = g_strdup(parts[3]);
    return TRUE;
}

GVariant *
hostd_replica_commit(HostdContext *ctx, const char *name, const char *checkpoint, char **files,
                     GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    if (checkpoint == NULL || !hostd_move_file_name_valid(checkpoint))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "a replica's commit names its checkpoint"),
               NULL;
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, name);
    g_autoptr(HostdMove) m = g_new0(HostdMove, 1);
    if (!hostd_move_with(ctx, FALSE, name, hostd_move_snapshot, m) || !m->replica)
        return vm_throw(error, VM_ERROR_BAD_STATE, "no copy of agent '%s' is under way here", name),
               NULL;
    g_autofree char *stage = hostd_replica_stage_dir(ctx, name);
    g_autofree char *kept_dir = replica_dir(ctx, name);
    g_autoptr(ReplicaManifest) kept = replica_manifest_load(kept_dir, NULL);

    g_autoptr(GKeyFile) kf = g_key_file_new();
    gboolean has_record = FALSE, has_checkpoints = FALSE;
    for (char **f = files; f != NULL && *f != NULL; f++) {
        g_autofree char *sha = NULL;
        g_autofree char *file = NULL;
        gint64 size = 0, mtime = 0;
        if (!replica_line_parse(*f, &sha, &size, &mtime, &file, error))
            return NULL;
        const char *here = hostd_move_in_file(file);
        const char *got = g_hash_table_lookup(m->sums, file);
        g_autofree char *staged = g_build_filename(stage, here, NULL);
        if (got != NULL) {
            if (!g_str_equal(got, sha))
                return vm_throw(error, VM_ERROR_BAD_STATE,
                                "file %s of the replica came with SHA-256 %.12s..., not the "
                                "source's %.12s...",
                                file, got, sha),
                       NULL;
        } else {
            /* Kept from the last replica: the same bytes by its SHA-256. */
            const char *value = kept != NULL ? g_hash_table_lookup(kept->files, here) : NULL;
            g_autofree char *kept_sha = NULL;
            gint64 kept_size = 0, kept_mtime = 0;
            if (value == NULL || !replica_file_parse(value, &kept_sha, &kept_size, &kept_mtime) ||
                !g_str_equal(kept_sha, sha))
                return vm_throw(error, VM_ERROR_BAD_STATE, "file %s of the replica never came",
                                file),
                       NULL;
            g_autofree char *old = g_build_filename(kept_dir, here, NULL);
            if (link(old, staged) < 0 && errno != EEXIST)
                return vm_throw_errno(error, errno, "cannot link %s", old), NULL;
        }
        g_autofree char *value =
            g_strdup_printf("%s;%" G_GINT64_FORMAT ";%" G_GINT64_FORMAT, sha, size, mtime);
        g_key_file_set_string(kf, "files", here, value);
        has_record |= g_str_equal(here, HOSTD_AGENT_RECORD);
        has_checkpoints |= g_str_equal(here, VM_CHECKPOINT_RECORD);
    }
    if (!has_record || !has_checkpoints)
        return vm_throw(error, VM_ERROR_BAD_STATE, "a replica needs %s and %s", HOSTD_AGENT_RECORD,
                        VM_CHECKPOINT_RECORD),
               NULL;
    g_key_file_set_string(kf, "replica", "from", m->peer);
    g_key_file_set_uint64(kf, "replica", "epoch", m->epoch);
    g_key_file_set_string(kf, "replica", "template", m->template_name);
    g_key_file_set_string(kf, "replica", "base-sha256", m->base_sha256);
    g_key_file_set_string(kf, "replica", "source-dir", m->source_dir);
    g_key_file_set_string(kf, "replica", "base-path", m->base_path);
    if (m->warm_path != NULL)
        g_key_file_set_string(kf, "replica", "warm-path", m->warm_path);
    g_key_file_set_string(kf, "replica", "checkpoint", checkpoint);
    g_key_file_set_int64(kf, "replica", "copied", g_get_real_time() / G_USEC_PER_SEC);
    gsize len = 0;
    g_autofree char *data = g_key_file_to_data(kf, &len, NULL);
    g_autofree char *manifest = g_build_filename(stage, REPLICA_MANIFEST, NULL);
    if (!vm_file_write_atomic(manifest, data, (gssize)len, 0600, error))
        return NULL;

    /* The new replica takes the old one's place in one step: a replica is always whole. */
    g_autofree char *parent = g_path_get_dirname(kept_dir);
    if (g_mkdir_with_parents(parent, 0700) < 0)
        return vm_throw_errno(error, errno, "cannot create %s", parent), NULL;
    if (g_file_test(kept_dir, G_FILE_TEST_IS_DIR)) {
        if (renameat2(AT_FDCWD, stage, AT_FDCWD, kept_dir, RENAME_EXCHANGE) < 0)
            return vm_throw_errno(error, errno, "cannot replace %s", kept_dir), NULL;
        vm_remove_tree(stage, NULL);
    } else if (g_rename(stage, kept_dir) < 0) {
        return vm_throw_errno(error, errno, "cannot create %s", kept_dir), NULL;
    }
    hostd_move_forget_replica(ctx, FALSE, name);
    hostd_context_log(ctx,
                      "agent '%s': replica of its checkpoint %s from host '%s' kept (epoch "
                      "%" G_GUINT64_FORMAT ")",
                      name, checkpoint, m->peer, m->epoch);
    return g_variant_new_parsed("@a{sv} {}");
}

GVariant *
hostd_replica_abort_in(HostdContext *ctx, const char *name, GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, name);
    hostd_move_forget_replica(ctx, FALSE, name);
    g_autofree char *stage = hostd_replica_stage_dir(ctx, name);
    vm_remove_tree(stage, NULL);
    return g_variant_new_parsed("@a{sv} {}");
}

/* ---------------------------------------------------------------------------------------------
 * Recovery */

GVariant *
hostd_replica_recover(HostdContext *ctx, const char *name, VmProgressFunc progress,
                      gpointer progress_data, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL || !vm_name_validate(name, error))
        return NULL;
    const char *me = hostd_cluster_host_id(ctx->cluster);
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, name);
    g_autofree char *owner = NULL;
    guint64 epoch = 0;
    if (!hostd_cluster_owner_of(ctx->cluster, name, &owner, &epoch, error))
        return NULL;
    if (owner == NULL)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "the fleet has no agent '%s'", name), NULL;
    if (g_str_equal(owner, me))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "agent '%s' is on host '%s' already",
                        name, me),
               NULL;
    g_autofree char *host = NULL;
    g_autofree char *address = NULL;
    gboolean live = FALSE;
    if (!hostd_cluster_locate(ctx->cluster, name, &host, &address, &live, error))
        return NULL;
    if (live)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is on host '%s', which is live: recovery is for the agents "
                        "of a lost host (`vmctl move` moves it)",
                        name, owner),
               NULL;
    g_autofree char *kept_dir = replica_dir(ctx, name);
    g_autoptr(GError) load_error = NULL;
    g_autoptr(ReplicaManifest) kept = replica_manifest_load(kept_dir, &load_error);
    if (load_error != NULL)
        return g_propagate_error(error, g_steal_pointer(&load_error)), NULL;
    if (kept == NULL)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "host '%s' holds no replica of agent '%s'", me,
                        name),
               NULL;
    if (!g_str_equal(kept->from, owner) || kept->epoch != epoch)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "the replica of agent '%s' here is of host '%s' at epoch %" G_GUINT64_FORMAT
                        ", but the fleet's record says host '%s' at epoch %" G_GUINT64_FORMAT
                        ": it is older than the agent",
                        name, kept->from, kept->epoch, owner, epoch),
               NULL;
    g_autofree char *dir = hostd_agent_dir(ctx, name);
    g_autoptr(virDomain) existing = hostd_libvirt_lookup(ctx->lv, name, NULL);
    if (g_file_test(dir, G_FILE_TEST_EXISTS) || existing != NULL)
        return vm_throw(error, VM_ERROR_EXISTS,
                        "agent '%s' already has a copy on host '%s' (a fenced one is removed "
                        "with `vmctl rm` there)",
                        name, me),
               NULL;
    if (!hostd_move_check_base(ctx, kept->template_name, kept->base_sha256, kept->from, error))
        return NULL;

    /* The replica's files as a move's commit takes them; linked, so the replica stays whole
     * until the agent is this host's. */
    g_autoptr(GHashTable) names = g_hash_table_new(g_str_hash, g_str_equal);
    GHashTableIter it;
    gpointer file;
    g_hash_table_iter_init(&it, kept->files);
    while (g_hash_table_iter_next(&it, &file, NULL))
        g_hash_table_add(names, file);
    HostdMove m = {
        .peer = kept->from,
        .epoch = kept->epoch,
        .template_name = kept->template_name,
        .source_dir = kept->source_dir,
        .base_path = kept->base_path,
        .warm_path = kept->warm_path,
    };
    g_autoptr(HostdAgentRecord) r = hostd_move_in_record(ctx, &m, name, kept_dir, names, error);
    if (r == NULL)
        return NULL;
    if (!hostd_check_resources(ctx, r->cpus, r->memory_mib, r->disk_gib, error))
        return NULL;
    g_autoptr(VmImage) image = hostd_agent_image(ctx, r, error);
    if (image == NULL)
        return NULL;
    hostd_progress(progress, progress_data, "installing the agent from its replica", -1);
    if (!hostd_agent_reserve(ctx, r, error))
        return NULL;
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GHashTable) moved = hostd_move_in_paths(&m, r, image->disk_path, names);
    /* A recovery tried before rewrote the replica's headers (its files are linked): those paths
     * are this host's already. */
    g_hash_table_iter_init(&it, names);
    while (g_hash_table_iter_next(&it, &file, NULL)) {
        g_autofree char *here = g_build_filename(r->dir, file, NULL);
        g_hash_table_replace(moved, g_strdup(here), g_strdup(here));
    }
    g_hash_table_replace(moved, g_strdup(image->disk_path), g_strdup(image->disk_path));
    g_autofree char *checkpoint = NULL;
    gint64 created = 0;
    g_autoptr(virDomain) dom = NULL;
    gboolean ok = hostd_move_in_install(r, kept_dir, names, TRUE, &local_error) &&
                  hostd_agent_rehome(ctx, r, &local_error) &&
                  hostd_confine_agent(ctx, r, &local_error) &&
                  hostd_checkpoint_recover(ctx, r, moved, &checkpoint, &created, &local_error) &&
                  hostd_confine_agent(ctx, r, &local_error);
    g_autoptr(VmCheckpointSet) set = NULL;
    if (ok)
        ok = (set = vm_checkpoint_set_load(r->dir, &local_error)) != NULL &&
             hostd_checkpoint_define(ctx, r, set, &local_error) &&
             (dom = hostd_libvirt_lookup(ctx->lv, r->name, &local_error)) != NULL;
    if (ok) {
        g_free(r->phase);
        r->phase = g_strdup(HOSTD_PHASE_READY);
        hostd_agent_set_wanted(r, HOSTD_WANTED_RUNNING);
        ok = hostd_agent_record_save(r, &local_error);
    }
    /* The fleet's record moves before the agent runs here: of two hosts recovering it at once
     * one wins, and the lost host, back, fences its copy. */
    guint64 new_epoch = 0;
    if (ok) {
        hostd_progress(progress, progress_data, "taking the agent over in the fleet", -1);
        ok = hostd_cluster_take(ctx->cluster, name, owner, epoch, "stopped", &new_epoch,
                                &local_error);
    }
    if (!ok) {
        hostd_agent_rollback(ctx, name, r->dir);
        g_propagate_prefixed_error(error, g_steal_pointer(&local_error),
                                   "cannot recover agent '%s': ", name);
        return NULL;
    }
    r->fleet_epoch = new_epoch;
    if (!hostd_agent_record_save(r, &local_error)) {
        hostd_context_log(ctx, "agent '%s': recovered, but its record is not saved: %s", name,
                          local_error->message);
        g_clear_error(&local_error);
    }
    vm_remove_tree(kept_dir, NULL);
    hostd_context_log(ctx,
                      "agent '%s' recovered here from its replica of host '%s' (checkpoint %s; "
                      "epoch %" G_GUINT64_FORMAT ")",
                      name, owner, checkpoint, new_epoch);
    hostd_context_agent_event(ctx, name, "recovered-in", "stopped", owner);

    hostd_progress(progress, progress_data, "booting", -1);
    g_autofree char *warning = NULL;
    if (!hostd_agent_boot_locked(ctx, r, dom, &local_error)) {
        warning = g_strdup_printf("agent '%s' is recovered but did not start: %s", name,
                                  local_error->message);
    } else {
        hostd_agent_mark_state_change(r);
        /* Answered once it answers, as `vmctl start` is. */
        if (hostd_agent_wait_ssh(ctx, r, progress, progress_data, &local_error))
            hostd_agent_emit_up(ctx, r);
        else
            warning = g_strdup_printf("agent '%s' is recovered and started, but: %s", name,
                                      local_error->message);
    }
    hostd_cluster_kick(ctx->cluster);
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "agent", hostd_agent_to_variant(ctx, r));
    g_variant_builder_add(&b, "{sv}", "checkpoint", g_variant_new_string(checkpoint));
    g_variant_builder_add(&b, "{sv}", "created", g_variant_new_int64(created));
    g_variant_builder_add(&b, "{sv}", "from", g_variant_new_string(owner));
    g_variant_builder_add(&b, "{sv}", "host", g_variant_new_string(me));
    g_variant_builder_add(&b, "{sv}", "epoch", g_variant_new_int64((gint64)new_epoch));
    g_variant_builder_add(&b, "{sv}", "started", g_variant_new_boolean(warning == NULL));
    if (warning != NULL)
        g_variant_builder_add(&b, "{sv}", "warning", g_variant_new_string(warning));
    return g_variant_builder_end(&b);
}

/* ---------------------------------------------------------------------------------------------
 * The cluster's thread */

/* One hostd's replication state; the tick runs on its cluster's thread only. */
typedef struct {
    GPid pid;             /* the `vmctl replicate` running, or 0 */
    char *name;           /* and its agent */
    GHashTable *tried;    /* agent -> "CHECKPOINT" last tried */
    GHashTable *tried_at; /* agent -> monotonic seconds (GINT_TO_POINTER) */
    gint64 swept;         /* monotonic seconds of the last sweep of kept replicas */
} ReplicaRunner;

static GMutex runners_lock;
static GHashTable *runners; /* HostdContext* -> ReplicaRunner* */

static ReplicaRunner *
replica_runner(HostdContext *ctx)
{
    g_mutex_lock(&runners_lock);
    if (runners == NULL)
        runners = g_hash_table_new(g_direct_hash, g_direct_equal);
    ReplicaRunner *run = g_hash_table_lookup(runners, ctx);
    if (run == NULL) {
        run = g_new0(ReplicaRunner, 1);
        run->tried = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
        run->tried_at = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
        g_hash_table_insert(runners, ctx, run);
    }
    g_mutex_unlock(&runners_lock);
    return run;
}

/* Whether the `vmctl replicate` of @run still runs; reaps it when it ended. */
static gboolean
replica_runner_busy(HostdContext *ctx, ReplicaRunner *run)
{
    if (run->pid == 0)
        return FALSE;
    int status = 0;
    pid_t pid = waitpid(run->pid, &status, WNOHANG);
    if (pid == 0)
        return TRUE;
    if (pid == run->pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        hostd_context_log(ctx, "agent '%s': its replication failed (vmctl replicate: %s %d)",
                          run->name, WIFEXITED(status) ? "exit status" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    run->pid = 0;
    g_clear_pointer(&run->name, g_free);
    return FALSE;
}

/* Starts `vmctl replicate @name` against this hostd's own socket. */
static void
replica_runner_start(HostdContext *ctx, ReplicaRunner *run, const char *name)
{
    g_autofree char *vmctl = vm_program_path("VM_VMCTL", HOSTD_VMCTL_BUILD, HOSTD_VMCTL_INSTALLED);
    const char *argv[] = {vmctl, "--socket", ctx->config->socket_path, "--quiet", "replicate",
                          name,  NULL};
    g_autoptr(GError) error = NULL;
    GPid pid = 0;
    if (!g_spawn_async(NULL, (char **)argv, NULL,
                       G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_STDOUT_TO_DEV_NULL |
                           G_SPAWN_STDIN_FROM_DEV_NULL,
                       NULL, NULL, &pid, &error)) {
        hostd_context_log(ctx, "agent '%s': cannot start its replication: %s", name,
                          error->message);
        return;
    }
    run->pid = pid;
    run->name = g_strdup(name);
}

/* Removes the replicas kept here that serve no more, and stages nobody sends. */
static void
replica_sweep(HostdContext *ctx)
{
    const char *me = hostd_cluster_host_id(ctx->cluster);
    g_autofree char *top = g_build_filename(ctx->state->dir, HOSTD_REPLICAS_DIR, NULL);
    g_autoptr(GDir) dir = g_dir_open(top, 0, NULL);
    for (const char *name; dir != NULL && (name = g_dir_read_name(dir)) != NULL;) {
        if (!vm_name_validate(name, NULL))
            continue;
        g_autoptr(HostdNameLock) lock = hostd_name_trylock(ctx, name);
        if (lock == NULL)
            continue;
        g_autofree char *path = g_build_filename(top, name, NULL);
        g_autoptr(ReplicaManifest) kept = replica_manifest_load(path, NULL);
        g_autofree char *owner = NULL;
        guint64 epoch = 0;
        if (kept != NULL && !hostd_cluster_owner_of(ctx->cluster, name, &owner, &epoch, NULL))
            continue; /* etcd cannot say: keep it */
        const char *why = kept == NULL                      ? "it is damaged"
                          : owner == NULL                   ? "the agent was removed"
                          : g_str_equal(owner, me)          ? "the agent is this host's now"
                          : epoch != kept->epoch            ? "the agent moved since"
                          : !g_str_equal(owner, kept->from) ? "the agent moved since"
                                                            : NULL;
        if (why == NULL)
            continue;
        vm_remove_tree(path, NULL);
        hostd_context_log(ctx, "agent '%s': replica removed (%s)", name, why);
    }
    hostd_move_sweep_received(ctx, HOSTD_REPLICA_STAGE_DIR);
}

/* Whether @r's newest checkpoint (*@ret_checkpoint) lacks the replicas it should have. */
static gboolean
replica_needed(const HostdAgentRecord *r, guint count, char **ret_checkpoint)
{
    if (!g_str_equal(r->phase, HOSTD_PHASE_READY) || r->fenced != NULL || r->moving_to != NULL ||
        r->forked_from != NULL)
        return FALSE;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, NULL);
    if (set == NULL || set->pending != VM_CHECKPOINT_OP_NONE || set->checkpoints->len == 0)
        return FALSE;
    const VmCheckpoint *last = set->checkpoints->pdata[set->checkpoints->len - 1];
    g_auto(GStrv) hosts = r->replicas != NULL ? g_strsplit(r->replicas, ",", 0) : NULL;
    if (g_strcmp0(last->id, r->replicated) == 0 && hosts != NULL && g_strv_length(hosts) >= count)
        return FALSE;
    *ret_checkpoint = g_strdup(last->id);
    return TRUE;
}

void
hostd_replica_tick(HostdContext *ctx, const GPtrArray *records)
{
    ReplicaRunner *run = replica_runner(ctx);
    gint64 now = g_get_monotonic_time() / G_USEC_PER_SEC;
    if (now - run->swept >= REPLICA_SWEEP_S) {
        run->swept = now;
        replica_sweep(ctx);
    }
    if (replica_runner_busy(ctx, run))
        return;
    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        g_autofree char *checkpoint = NULL;
        guint count = replica_count(ctx, r);
        if (count == 0 || !replica_needed(r, count, &checkpoint))
            continue;
        /* Tried for this checkpoint already: again once in a while (a host may have come). */
        const char *tried = g_hash_table_lookup(run->tried, r->name);
        gint64 at = GPOINTER_TO_INT(g_hash_table_lookup(run->tried_at, r->name));
        if (g_strcmp0(tried, checkpoint) == 0 && now - at < REPLICA_RETRY_S)
            continue;
        g_hash_table_replace(run->tried, g_strdup(r->name), g_steal_pointer(&checkpoint));
        g_hash_table_replace(run->tried_at, g_strdup(r->name), GINT_TO_POINTER((gint)now));
        replica_runner_start(ctx, run, r->name);
        return;
    }
}
