#include "hostd-move.h"
#include "hostd-move-private.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-checkpoint.h"
#include "hostd-cluster.h"
#include "hostd-confine.h"
#include "hostd-fence.h"
#include "hostd-guest.h"
#include "hostd-libvirt.h"
#include "hostd-resources.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets.h"
#include "hostd-template.h"
#include "vm-checkpoint.h"
#include "vm-error.h"
#include "vm-image.h"
#include "vm-name.h"
#include "vm-qemu-img.h"
#include "vm-util.h"

static GMutex moves_lock;
static GHashTable *moves; /* "<ctx>/<out|in>/<name>" -> HostdMove */

void
hostd_move_free(gpointer data)
{
    HostdMove *m = data;
    g_free(m->peer);
    if (m->sums != NULL)
        g_hash_table_unref(m->sums);
    g_free(m->template_name);
    g_free(m->source_dir);
    g_free(m->base_path);
    g_free(m->warm_path);
    g_free(m->base_sha256);
    g_free(m);
}

static char *
move_key(HostdContext *ctx, gboolean out, const char *name)
{
    return g_strdup_printf("%p/%s/%s", (void *)ctx, out ? "out" : "in", name);
}

/* Records @m (consumed) as the move of @name. */
void
hostd_move_put(HostdContext *ctx, gboolean out, const char *name, HostdMove *m)
{
    m->last_seen = g_get_monotonic_time();
    g_mutex_lock(&moves_lock);
    if (moves == NULL)
        moves = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, hostd_move_free);
    g_hash_table_replace(moves, move_key(ctx, out, name), m);
    g_mutex_unlock(&moves_lock);
}

void
hostd_move_forget(HostdContext *ctx, gboolean out, const char *name)
{
    g_autofree char *key = move_key(ctx, out, name);
    g_mutex_lock(&moves_lock);
    if (moves != NULL)
        g_hash_table_remove(moves, key);
    g_mutex_unlock(&moves_lock);
}

/* Runs @func on the move of @name with the table locked (the client was just heard from);
 * FALSE when there is none. */
gboolean
hostd_move_with(HostdContext *ctx, gboolean out, const char *name,
                void (*func)(HostdMove *m, gpointer data), gpointer data)
{
    g_autofree char *key = move_key(ctx, out, name);
    g_mutex_lock(&moves_lock);
    HostdMove *m = moves != NULL ? g_hash_table_lookup(moves, key) : NULL;
    if (m != NULL) {
        m->last_seen = g_get_monotonic_time();
        if (func != NULL)
            func(m, data);
    }
    g_mutex_unlock(&moves_lock);
    return m != NULL;
}

gboolean
hostd_move_forget_replica(HostdContext *ctx, gboolean out, const char *name)
{
    g_autofree char *key = move_key(ctx, out, name);
    g_mutex_lock(&moves_lock);
    HostdMove *m = moves != NULL ? g_hash_table_lookup(moves, key) : NULL;
    gboolean replica = m != NULL && m->replica;
    if (replica)
        g_hash_table_remove(moves, key);
    g_mutex_unlock(&moves_lock);
    return replica;
}

/* Whether a client was heard from about the move of @name within HOSTD_MOVE_IDLE_S. */
gboolean
hostd_move_active(HostdContext *ctx, gboolean out, const char *name)
{
    g_autofree char *key = move_key(ctx, out, name);
    g_mutex_lock(&moves_lock);
    HostdMove *m = moves != NULL ? g_hash_table_lookup(moves, key) : NULL;
    gboolean active =
        m != NULL && g_get_monotonic_time() - m->last_seen < HOSTD_MOVE_IDLE_S * G_USEC_PER_SEC;
    g_mutex_unlock(&moves_lock);
    return active;
}

/* Whether @file may name a file of an agent's dir in a move: a plain name, no path. */
gboolean
hostd_move_file_name_valid(const char *file)
{
    if (file[0] == '\0' || file[0] == '.' || strlen(file) > 255)
        return FALSE;
    for (const char *c = file; *c != '\0'; c++) {
        if (!g_ascii_isalnum(*c) && strchr("._-", *c) == NULL)
            return FALSE;
    }
    return TRUE;
}

/* Files of an agent's dir a move never copies: hostd writes them anew on the target, or they
 * are sockets of this host's processes. */
gboolean
hostd_move_file_skipped(const char *file)
{
    /* A warm layer a move brought here goes as "@warm" on the next one, never by its name. */
    return g_str_equal(file, HOSTD_AGENT_DOMAIN_XML) || g_str_equal(file, MOVE_MEMORY_FILE) ||
           g_str_equal(file, MOVE_WARM_FILE);
}

/* The SHA-256 of the file at @path, in hex. Newly allocated. */
char *
hostd_move_file_sha256(const char *path, GError **error)
{
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot open %s", path), NULL;
    g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
    g_autofree guint8 *buf = g_malloc(1024 * 1024);
    for (;;) {
        ssize_t n = read(fd, buf, 1024 * 1024);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot read %s", path), NULL;
        if (n == 0)
            break;
        g_checksum_update(sum, buf, n);
    }
    return g_strdup(g_checksum_get_string(sum));
}

/* The SHA-256 of a template's base image, remembered by path, size and change time: the image
 * is hostd's and changes only when rebuilt. */
char *
hostd_move_base_sha256(const char *path, GError **error)
{
    static GMutex lock;
    static GHashTable *known; /* "path\nsize\nctime" -> sha */
    struct stat st;
    if (stat(path, &st) < 0)
        return vm_throw_errno(error, errno, "cannot read %s", path), NULL;
    g_autofree char *key =
        g_strdup_printf("%s\n%" G_GINT64_FORMAT "\n%" G_GINT64_FORMAT ".%ld", path,
                        (gint64)st.st_size, (gint64)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
    g_mutex_lock(&lock);
    if (known == NULL)
        known = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    char *sha = g_strdup(g_hash_table_lookup(known, key));
    g_mutex_unlock(&lock);
    if (sha != NULL)
        return sha;
    sha = hostd_move_file_sha256(path, error);
    if (sha == NULL)
        return NULL;
    g_mutex_lock(&lock);
    g_hash_table_replace(known, g_steal_pointer(&key), g_strdup(sha));
    g_mutex_unlock(&lock);
    return sha;
}

/* Where libvirt keeps @dom_name's managed save on this connection. Newly allocated. */
static char *
move_managed_save_path(HostdContext *ctx, const char *dom_name)
{
    g_autofree char *root = hostd_libvirt_embed_root(ctx->lv->uri);
    g_autofree char *file = g_strdup_printf("%s.save", dom_name);
    if (root != NULL)
        return g_build_filename(root, "lib", "qemu", "save", file, NULL);
    return g_build_filename("/var/lib/libvirt/qemu/save", file, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * The source */

/* The record of @name says this host owns it: its epoch. */
static gboolean
move_owned_here(HostdContext *ctx, const char *name, guint64 *ret_epoch, GError **error)
{
    g_autofree char *owner = NULL;
    if (!hostd_cluster_owner_of(ctx->cluster, name, &owner, ret_epoch, error))
        return FALSE;
    if (g_strcmp0(owner, hostd_cluster_host_id(ctx->cluster)) != 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not this host's in the fleet (the record names %s)", name,
                        owner != NULL ? owner : "no host");
    return TRUE;
}

/* Whether @r may move: what it is allows it, and the fleet's record says it is this host's
 * (*@ret_epoch: with which epoch). */
static gboolean
move_out_check(HostdContext *ctx, const HostdAgentRecord *r, guint64 *ret_epoch, GError **error)
{
    if (g_str_equal(r->phase, HOSTD_PHASE_CREATING))
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' is still being made", r->name);
    if (r->fenced != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' is fenced: %s", r->name, r->fenced);
    if (r->forked_from != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is a fork: its disk stands on checkpoints of '%s' on this "
                        "host, and forks do not move",
                        r->name, r->forked_from);
    g_autoptr(GPtrArray) forks = hostd_agent_records_forked_from(ctx, r->name);
    if (forks->len > 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' has forks standing on its checkpoints (%s first); it moves "
                        "only without them",
                        r->name, ((HostdAgentRecord *)forks->pdata[0])->name);
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, r->name, error);
    if (grants == NULL)
        return FALSE;
    if (g_hash_table_size(grants) > 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' holds secrets of this host's broker (vmctl secret); their "
                        "values do not leave this host: revoke them before the move and grant "
                        "them on the target after",
                        r->name);
    return move_owned_here(ctx, r->name, ret_epoch, error);
}

GVariant *
hostd_move_file_entry(const char *file, const struct stat *st)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "file", g_variant_new_string(file));
    g_variant_builder_add(&b, "{sv}", "size", g_variant_new_int64(st->st_size));
    g_variant_builder_add(&b, "{sv}", "mtime",
                          g_variant_new_int64((gint64)st->st_mtim.tv_sec * G_USEC_PER_SEC +
                                              st->st_mtim.tv_nsec / 1000));
    return g_variant_builder_end(&b);
}

/* Adds @file at @path to @b when it is a regular file. */
gboolean
hostd_move_list_add(GVariantBuilder *b, const char *file, const char *path, GError **error)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return vm_throw_errno(error, errno, "cannot read %s", path);
    if (S_ISREG(st.st_mode))
        g_variant_builder_add_value(b, hostd_move_file_entry(file, &st));
    return TRUE;
}

/* The frozen files of @r (its checkpoints' images and memory, its warm layer): what can be
 * copied while it runs. */
static GVariant *
move_frozen_files(const HostdAgentRecord *r, GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *image = vm_checkpoint_set_path(set, c->image);
        if (!hostd_move_list_add(&b, c->image, image, error))
            return NULL;
        if (c->memory != NULL) {
            g_autofree char *memory = vm_checkpoint_set_path(set, c->memory);
            if (!hostd_move_list_add(&b, c->memory, memory, error))
                return NULL;
        }
    }
    if (r->warm_base != NULL && !hostd_move_list_add(&b, MOVE_WARM, r->warm_base, error))
        return NULL;
    return g_variant_builder_end(&b);
}

char *
hostd_move_base_named(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                      GError **error)
{
    /* A warm layer names the base image as it was when the warm image was built. */
    if (r->warm_base == NULL)
        return g_strdup(image->disk_path);
    /* One a move brought into the agent's dir came through a client: read as the agent's id,
     * whose group it is (hostd_confine_agent()); the template's own is hostd's. */
    g_autofree char *prefix = g_strconcat(r->dir, "/", NULL);
    guint uid = ctx->agent_ids && r->agent_id != 0 && g_str_has_prefix(r->warm_base, prefix)
                    ? r->agent_id
                    : 0;
    g_autoptr(GPtrArray) warm = vm_qemu_img_info_as(
        r->warm_base, VM_QEMU_IMG_INFO_QCOW2 | VM_QEMU_IMG_INFO_SHARED, uid, error);
    if (warm == NULL)
        return NULL;
    const VmQemuImgInfo *top = warm->pdata[0];
    return g_strdup(top->backing_filename != NULL ? top->backing_filename : image->disk_path);
}

void
hostd_move_describe(GVariantBuilder *b, const char *me, guint64 epoch, const HostdAgentRecord *r,
                    const char *base_sha256, const char *base_named)
{
    g_variant_builder_add(b, "{sv}", "from", g_variant_new_string(me));
    g_variant_builder_add(b, "{sv}", "epoch", g_variant_new_int64((gint64)epoch));
    g_variant_builder_add(b, "{sv}", "template", g_variant_new_string(r->template_name));
    g_variant_builder_add(b, "{sv}", "cpus", g_variant_new_uint32(r->cpus));
    g_variant_builder_add(b, "{sv}", "memory_mib", g_variant_new_uint32(r->memory_mib));
    g_variant_builder_add(b, "{sv}", "disk_gib", g_variant_new_uint32(r->disk_gib));
    g_variant_builder_add(b, "{sv}", "base_sha256", g_variant_new_string(base_sha256));
    g_variant_builder_add(b, "{sv}", "source_dir", g_variant_new_string(r->dir));
    g_variant_builder_add(b, "{sv}", "base_path", g_variant_new_string(base_named));
    if (r->warm_base != NULL)
        g_variant_builder_add(b, "{sv}", "warm_path", g_variant_new_string(r->warm_base));
}

GVariant *
hostd_move_plan(HostdContext *ctx, const char *name, const char *to, VmProgressFunc progress,
                gpointer progress_data, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL)
        return NULL;
    const char *me = hostd_cluster_host_id(ctx->cluster);
    if (to != NULL && g_str_equal(to, me))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "agent '%s' is on host '%s' already",
                        name, me),
               NULL;
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    /* A move takes over from a copy of its replica under way: that copy then fails. */
    if (hostd_move_forget_replica(ctx, TRUE, name))
        hostd_context_log(ctx, "agent '%s': its move stops the copy of its replica", name);
    if (r->moving_to != NULL || hostd_move_active(ctx, TRUE, name))
        return vm_throw(error, VM_ERROR_BUSY, "agent '%s' is being moved already", name), NULL;
    guint64 epoch = 0;
    if (!move_out_check(ctx, r, &epoch, error))
        return NULL;
    g_autofree char *host = NULL;
    g_autofree char *address = NULL;
    if (!hostd_cluster_place_except(ctx->cluster, to, me, r->template_name, r->memory_mib, &host,
                                    &address, error))
        return NULL;
    g_autoptr(VmImage) image = hostd_agent_image(ctx, r, error);
    if (image == NULL)
        return NULL;
    hostd_progress(progress, progress_data, "reading the template's base image", -1);
    g_autofree char *base_sha = hostd_move_base_sha256(image->disk_path, error);
    if (base_sha == NULL)
        return NULL;

    /* What the running agent wrote so far is frozen in a checkpoint, so that it is copied
     * while the agent still runs and only what it writes from now on waits for the save. */
    if (hostd_libvirt_is_active(dom)) {
        hostd_progress(progress, progress_data, "checkpointing the disk", -1);
        g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
        if (set == NULL)
            return NULL;
        g_autofree char *label = g_strdup_printf("move to %s", host);
        g_autofree char *warning = NULL;
        if (hostd_checkpoint_create_locked(ctx, r, dom, set, label, TRUE, FALSE, &warning, error) ==
            NULL)
            return NULL;
    }
    g_autoptr(GVariant) files = move_frozen_files(r, error);
    if (files == NULL)
        return NULL;
    g_autofree char *base_named = hostd_move_base_named(ctx, r, image, error);
    if (base_named == NULL)
        return NULL;

    HostdMove *m = g_new0(HostdMove, 1);
    m->peer = g_strdup(host);
    m->epoch = epoch;
    hostd_move_put(ctx, TRUE, name, m);

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "to", g_variant_new_string(host));
    g_variant_builder_add(&b, "{sv}", "address", g_variant_new_string(address));
    hostd_move_describe(&b, me, epoch, r, base_sha, base_named);
    g_variant_builder_add(&b, "{sv}", "files", g_steal_pointer(&files));
    return g_variant_builder_end(&b);
}

GVariant *
hostd_move_save(HostdContext *ctx, const char *name, const char *to, VmProgressFunc progress,
                gpointer progress_data, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL)
        return NULL;
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    if (!hostd_move_with(ctx, TRUE, name, NULL, NULL))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' has no move under way here (plan it first)", name),
               NULL;
    guint64 epoch = 0;
    if (!move_out_check(ctx, r, &epoch, error))
        return NULL;

    /* Marked before the save: a hostd that dies from here on finds the mark at start and
     * starts nothing until the fleet's record says whose the agent is. */
    if (r->moving_to == NULL) {
        r->moving_to = g_strdup(to);
        if (!hostd_agent_record_save(r, error))
            return NULL;
    }
    if (hostd_libvirt_is_active(dom)) {
        hostd_progress(progress, progress_data, "saving the agent's memory", -1);
        hostd_ssh_pool_forget(ctx->ssh, name);
        if (virDomainManagedSave(dom, 0) < 0) {
            g_autoptr(GError) local_error = NULL;
            hostd_libvirt_throw(&local_error, "cannot save the agent");
            g_clear_pointer(&r->moving_to, g_free);
            hostd_agent_record_save(r, NULL);
            g_propagate_error(error, g_steal_pointer(&local_error));
            return NULL;
        }
        hostd_agent_set_wanted(r, HOSTD_WANTED_SAVED);
    }
    hostd_crash_point("move-saved");

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    g_autoptr(GDir) dir = g_dir_open(r->dir, 0, error);
    if (dir == NULL)
        return NULL;
    for (const char *file; (file = g_dir_read_name(dir)) != NULL;) {
        if (!hostd_move_file_name_valid(file) || hostd_move_file_skipped(file))
            continue;
        g_autofree char *path = g_build_filename(r->dir, file, NULL);
        if (!hostd_move_list_add(&b, file, path, error))
            return NULL;
    }
    if (r->warm_base != NULL && !hostd_move_list_add(&b, MOVE_WARM, r->warm_base, error))
        return NULL;
    g_autofree char *dom_name = hostd_libvirt_domain_name(ctx->lv, name);
    g_autofree char *memory = move_managed_save_path(ctx, dom_name);
    if (virDomainHasManagedSaveImage(dom, 0) > 0 &&
        !hostd_move_list_add(&b, MOVE_MEMORY, memory, error))
        return NULL;
    virResetLastError();
    hostd_context_log(ctx, "agent '%s': saved for its move to host '%s'", name, to);
    g_auto(GVariantBuilder) rb = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&rb, "{sv}", "files", g_variant_builder_end(&b));
    return g_variant_builder_end(&rb);
}

/* The path on this host of @file of moving agent @r. */
static char *
move_out_path(HostdContext *ctx, const HostdAgentRecord *r, const char *file, GError **error)
{
    if (g_str_equal(file, MOVE_MEMORY)) {
        g_autofree char *dom_name = hostd_libvirt_domain_name(ctx->lv, r->name);
        return move_managed_save_path(ctx, dom_name);
    }
    if (g_str_equal(file, MOVE_WARM)) {
        if (r->warm_base == NULL)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' stands on no warm image",
                            r->name),
                   NULL;
        return g_strdup(r->warm_base);
    }
    if (!hostd_move_file_name_valid(file) || hostd_move_file_skipped(file))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' is no file of a move", file), NULL;
    return g_build_filename(r->dir, file, NULL);
}

gboolean
hostd_move_read(HostdContext *ctx, const char *name, const char *file, VmStreamWriter *reply,
                GError **error)
{
    if (!vm_name_validate(name, error))
        return FALSE;
    if (!hostd_move_with(ctx, TRUE, name, NULL, NULL))
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' has no move under way here", name);
    /* The record only: the files read are frozen (checkpoints) or of a saved agent, whose lock
     * a long copy must not hold. */
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return FALSE;
    g_autofree char *path = move_out_path(ctx, r, file, error);
    if (path == NULL)
        return FALSE;
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot open %s", path);
    g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
    g_autofree guint8 *buf = g_malloc(MOVE_CHUNK);
    for (guint frames = 0;; frames++) {
        ssize_t n = read(fd, buf, MOVE_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot read %s", path);
        if (n == 0)
            break;
        g_checksum_update(sum, buf, n);
        g_autoptr(VmMessage) chunk = vm_message_new_data(VM_OP_STDOUT, buf, n);
        if (!vm_message_write_fd(reply->fd, chunk, error))
            return FALSE;
        if (frames % 256 == 0)
            hostd_move_with(ctx, TRUE, name, NULL, NULL);
        if (frames == 16 && g_str_equal(file, MOVE_MEMORY))
            hostd_crash_point("move-reading");
    }
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "status", g_variant_new_int32(0));
    g_variant_builder_add(&b, "{sv}", "sha256", g_variant_new_string(g_checksum_get_string(sum)));
    g_autoptr(VmMessage) exit_msg = vm_message_new(VM_OP_EXIT, g_variant_builder_end(&b), error);
    reply->ended = TRUE;
    return exit_msg != NULL && vm_message_write_fd(reply->fd, exit_msg, error);
}

/* With @name's lock held and its record @r: the fleet's record says @owner holds it with
 * @epoch. The move is over either way: this copy is gone (moved), or it is the agent again. */
static void
move_out_settled(HostdContext *ctx, HostdAgentRecord *r)
{
    g_clear_pointer(&r->moving_to, g_free);
    hostd_move_forget(ctx, TRUE, r->name);
}

/* Removes this host's copy of @name, whose record another host now holds. With its lock. */
static void
move_out_remove(HostdContext *ctx, HostdAgentRecord *r, const char *owner)
{
    hostd_ssh_pool_forget(ctx->ssh, r->name);
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);
    if (dom != NULL && hostd_libvirt_is_active(dom))
        virDomainDestroy(dom);
    if (dom != NULL && virDomainHasManagedSaveImage(dom, 0) > 0)
        virDomainManagedSaveRemove(dom, 0);
    virResetLastError();
    g_autofree char *dir = g_strdup(r->dir);
    g_autofree char *name = g_strdup(r->name);
    move_out_settled(ctx, r);
    hostd_agent_rollback(ctx, name, dir);
    hostd_context_log(ctx, "agent '%s' moved to host '%s': this host's copy removed", name, owner);
    hostd_context_agent_event(ctx, name, "moved", "moved", owner);
}

GVariant *
hostd_move_done(HostdContext *ctx, const char *name, const char *to, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL)
        return NULL;
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    g_autofree char *owner = NULL;
    guint64 epoch = 0;
    if (!hostd_cluster_owner_of(ctx->cluster, name, &owner, &epoch, error))
        return NULL;
    if (g_strcmp0(owner, to) != 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not host '%s''s in the fleet (the record names %s): this "
                        "copy stays",
                        name, to, owner != NULL ? owner : "no host"),
               NULL;
    hostd_crash_point("move-done");
    move_out_remove(ctx, r, owner);
    return g_variant_new_parsed("@a{sv} {}");
}

/* Settles the move of @r by the fleet's record; with its lock held. *@ret_owner, *@ret_epoch:
 * what the record says now. */
static gboolean
move_out_settle(HostdContext *ctx, HostdAgentRecord *r, char **ret_owner, guint64 *ret_epoch,
                GError **error)
{
    const char *me = hostd_cluster_host_id(ctx->cluster);
    g_autofree char *owner = NULL;
    guint64 epoch = 0;
    if (!hostd_cluster_owner_of(ctx->cluster, r->name, &owner, &epoch, error))
        return FALSE;
    if (owner != NULL && g_str_equal(owner, me)) {
        /* Taken back with a higher epoch: a target that has not taken it over yet never
         * will. */
        if (!hostd_cluster_take(ctx->cluster, r->name, me, epoch, NULL, &epoch, error))
            return FALSE;
        r->fleet_epoch = epoch;
        move_out_settled(ctx, r);
        if (!hostd_agent_record_save(r, error))
            return FALSE;
        hostd_context_log(ctx,
                          "agent '%s': its move did not finish; it is this host's again (epoch "
                          "%" G_GUINT64_FORMAT ")",
                          r->name, epoch);
    } else if (owner != NULL) {
        /* The target took it over: this copy is the agent's past. */
        move_out_remove(ctx, r, owner);
    } else {
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "the fleet has no record of agent '%s'; it stays unstartable here",
                        r->name);
    }
    *ret_owner = g_steal_pointer(&owner);
    *ret_epoch = epoch;
    return TRUE;
}

GVariant *
hostd_move_abort_out(HostdContext *ctx, const char *name, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL)
        return NULL;
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    g_autofree char *owner = NULL;
    guint64 epoch = r->fleet_epoch;
    if (r->moving_to == NULL) {
        /* Not saved yet: nothing to settle. */
        hostd_move_forget(ctx, TRUE, name);
        owner = g_strdup(hostd_cluster_host_id(ctx->cluster));
    } else if (!move_out_settle(ctx, r, &owner, &epoch, error)) {
        return NULL;
    }
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "owner", g_variant_new_string(owner));
    g_variant_builder_add(&b, "{sv}", "epoch", g_variant_new_int64((gint64)epoch));
    return g_variant_builder_end(&b);
}

/* ---------------------------------------------------------------------------------------------
 * The target */

char *
hostd_replica_stage_dir(HostdContext *ctx, const char *name)
{
    return g_build_filename(ctx->state->dir, HOSTD_REPLICA_STAGE_DIR, name, NULL);
}

static char *
hostd_move_incoming_dir(HostdContext *ctx, const char *name)
{
    return g_build_filename(ctx->state->dir, HOSTD_MOVE_INCOMING_DIR, name, NULL);
}

/* The name @file has in the incoming dir. */
const char *
hostd_move_in_file(const char *file)
{
    if (g_str_equal(file, MOVE_MEMORY))
        return MOVE_MEMORY_FILE;
    if (g_str_equal(file, MOVE_WARM))
        return MOVE_WARM_FILE;
    return file;
}

gboolean
hostd_move_check_base(HostdContext *ctx, const char *template_name, const char *base_sha256,
                      const char *from, GError **error)
{
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, template_name, error);
    if (tpl == NULL)
        return FALSE;
    g_autoptr(VmImage) image = vm_image_lookup(ctx->config->images_dir, tpl, error);
    if (image == NULL)
        return FALSE;
    g_autofree char *sha = hostd_move_base_sha256(image->disk_path, error);
    if (sha == NULL)
        return FALSE;
    /* The agent's disk stands on its template's base image: the same bytes, or its disk would
     * read another file system. */
    if (!g_str_equal(sha, base_sha256))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "host '%s' has another base image of template '%s' than host '%s' "
                        "(SHA-256 %.12s..., there %.12s...): the hosts of a fleet build each "
                        "template from the same image (docs/CLUSTER.md)",
                        hostd_cluster_host_id(ctx->cluster), template_name, from, sha, base_sha256);
    return TRUE;
}

gboolean
hostd_move_in_check(HostdContext *ctx, const HostdMoveIn *in, GError **error)
{
    if (hostd_move_active(ctx, FALSE, in->name))
        return vm_throw(error, VM_ERROR_BUSY, "agent '%s' is being copied here already", in->name);
    g_autofree char *owner = NULL;
    guint64 epoch = 0;
    if (!hostd_cluster_owner_of(ctx->cluster, in->name, &owner, &epoch, error))
        return FALSE;
    if (g_strcmp0(owner, in->from) != 0 || epoch != in->epoch)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not host '%s''s with epoch %" G_GUINT64_FORMAT
                        " in the fleet",
                        in->name, in->from, in->epoch);
    return TRUE;
}

gboolean
hostd_move_in_valid(HostdContext *ctx, const HostdMoveIn *in, const char *what, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL || !vm_name_validate(in->name, error))
        return FALSE;
    if (in->from == NULL || in->template_name == NULL || in->base_sha256 == NULL ||
        in->source_dir == NULL || in->base_path == NULL || in->epoch == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s's begin needs from, epoch, template, base_sha256, source_dir and "
                        "base_path",
                        what);
    return TRUE;
}

GVariant *
hostd_move_begin(HostdContext *ctx, const HostdMoveIn *in, GError **error)
{
    if (!hostd_move_in_valid(ctx, in, "a move", error))
        return NULL;
    const char *me = hostd_cluster_host_id(ctx->cluster);
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, in->name);
    g_autofree char *dir = hostd_agent_dir(ctx, in->name);
    g_autoptr(virDomain) existing = hostd_libvirt_lookup(ctx->lv, in->name, NULL);
    if (g_file_test(dir, G_FILE_TEST_EXISTS) || existing != NULL)
        return vm_throw(error, VM_ERROR_EXISTS,
                        "agent '%s' already has a copy on host '%s' (a fenced one is removed "
                        "with `vmctl rm` there)",
                        in->name, me),
               NULL;
    if (hostd_move_forget_replica(ctx, FALSE, in->name)) {
        g_autofree char *stage = hostd_replica_stage_dir(ctx, in->name);
        vm_remove_tree(stage, NULL);
    }
    if (!hostd_move_in_check(ctx, in, error))
        return NULL;
    /* This host as placement sees it: live, not drained, has the template and the memory. */
    g_autofree char *host = NULL;
    g_autofree char *address = NULL;
    if (!hostd_cluster_place(ctx->cluster, me, in->template_name, in->memory_mib, &host, &address,
                             error) ||
        !hostd_check_resources(ctx, in->cpus, in->memory_mib, in->disk_gib, error))
        return NULL;
    if (!hostd_move_check_base(ctx, in->template_name, in->base_sha256, in->from, error))
        return NULL;

    g_autofree char *incoming = hostd_move_incoming_dir(ctx, in->name);
    vm_remove_tree(incoming, NULL);
    if (g_mkdir_with_parents(incoming, 0700) < 0)
        return vm_throw_errno(error, errno, "cannot create %s", incoming), NULL;
    HostdMove *m = g_new0(HostdMove, 1);
    m->peer = g_strdup(in->from);
    m->epoch = in->epoch;
    m->sums = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    m->template_name = g_strdup(in->template_name);
    m->source_dir = g_strdup(in->source_dir);
    m->base_path = g_strdup(in->base_path);
    m->warm_path = g_strdup(in->warm_path);
    hostd_move_put(ctx, FALSE, in->name, m);
    return g_variant_new_parsed("@a{sv} {}");
}

typedef struct {
    const char *file;
    const char *sha;
} MoveSum;

static void
move_record_sum(HostdMove *m, gpointer data)
{
    const MoveSum *s = data;
    g_hash_table_replace(m->sums, g_strdup(s->file), g_strdup(s->sha));
}

gboolean
hostd_move_write(HostdContext *ctx, const char *name, const char *file, gint64 size,
                 VmStreamWriter *reply, GError **error)
{
    if (!vm_name_validate(name, error))
        return FALSE;
    g_autoptr(HostdMove) m_seen = g_new0(HostdMove, 1);
    if (!hostd_move_with(ctx, FALSE, name, hostd_move_snapshot, m_seen))
        return vm_throw(error, VM_ERROR_BAD_STATE, "no move of agent '%s' is under way here", name);
    if (m_seen->replica && g_str_equal(file, MOVE_MEMORY))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "a replica holds no memory");
    if (!g_str_equal(file, MOVE_MEMORY) && !g_str_equal(file, MOVE_WARM) &&
        (!hostd_move_file_name_valid(file) || hostd_move_file_skipped(file)))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' is no file of a move", file);
    if (size < 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "a file's size is not negative");
    g_autofree char *incoming =
        m_seen->replica ? hostd_replica_stage_dir(ctx, name) : hostd_move_incoming_dir(ctx, name);
    g_autofree char *path = g_build_filename(incoming, hostd_move_in_file(file), NULL);
    g_unlink(path);
    /* The size a client announces is checked before a byte is written: a file too big for this
     * host fails at once, not once the disk is full. */
    if (!hostd_checkpoint_room_for(ctx, incoming, (guint64)size, error))
        return FALSE;
    vm_autofd fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot create %s", path);

    g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
    gint64 written = 0;
    for (guint frames = 0;; frames++) {
        gboolean eof = FALSE;
        gint64 deadline = g_get_monotonic_time() + MOVE_FRAME_TIMEOUT_S * G_USEC_PER_SEC;
        g_autoptr(VmMessage) m = vm_message_read_fd_until(reply->fd, deadline, &eof, error);
        if (m == NULL) {
            g_unlink(path);
            return eof ? vm_throw(error, VM_ERROR_CANCELLED, "the client went away mid-file")
                       : FALSE;
        }
        if (m->op == VM_OP_STDIN_EOF)
            break;
        if (m->op != VM_OP_STDIN) {
            g_unlink(path);
            return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message in a move's file",
                            vm_op_name(m->op) != NULL ? vm_op_name(m->op) : "unknown");
        }
        gsize len = 0;
        const guint8 *data = vm_message_get_data(m, "data", &len);
        if (written + (gint64)len > size) {
            g_unlink(path);
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: more bytes than the %" G_GINT64_FORMAT " announced", file, size);
        }
        if (len > 0 && !vm_write_all(fd, data, len, error)) {
            g_unlink(path);
            return FALSE;
        }
        g_checksum_update(sum, data, len);
        written += (gint64)len;
        if (frames % 256 == 0)
            hostd_move_with(ctx, FALSE, name, NULL, NULL);
    }
    if (written != size) {
        g_unlink(path);
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: %" G_GINT64_FORMAT " bytes came of the %" G_GINT64_FORMAT " announced",
                        file, written, size);
    }
    if (fsync(fd) < 0) {
        g_unlink(path);
        return vm_throw_errno(error, errno, "cannot write %s", path);
    }
    MoveSum s = {file, g_checksum_get_string(sum)};
    if (!hostd_move_with(ctx, FALSE, name, move_record_sum, &s)) {
        g_unlink(path);
        return vm_throw(error, VM_ERROR_BAD_STATE, "the move of agent '%s' was given up", name);
    }
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "status", g_variant_new_int32(0));
    g_variant_builder_add(&b, "{sv}", "sha256", g_variant_new_string(s.sha));
    g_autoptr(VmMessage) exit_msg = vm_message_new(VM_OP_EXIT, g_variant_builder_end(&b), error);
    reply->ended = TRUE;
    return exit_msg != NULL && vm_message_write_fd(reply->fd, exit_msg, error);
}

void
hostd_move_snapshot(HostdMove *m, gpointer data)
{
    HostdMove *copy = data;
    copy->peer = g_strdup(m->peer);
    copy->epoch = m->epoch;
    copy->replica = m->replica;
    copy->base_sha256 = g_strdup(m->base_sha256);
    copy->sums = g_hash_table_ref(m->sums);
    copy->template_name = g_strdup(m->template_name);
    copy->source_dir = g_strdup(m->source_dir);
    copy->base_path = g_strdup(m->base_path);
    copy->warm_path = g_strdup(m->warm_path);
}

/* Checks that every file of @files ("SHA256 NAME") came with that SHA-256, and returns the set
 * of their incoming names. */
static GHashTable *
move_check_sums(const HostdMove *m, char **files, GError **error)
{
    g_autoptr(GHashTable) names = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (char **f = files; f != NULL && *f != NULL; f++) {
        const char *space = strchr(*f, ' ');
        if (space == NULL || space - *f != 64)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' is no \"SHA256 NAME\"", *f),
                   NULL;
        const char *file = space + 1;
        const char *got = g_hash_table_lookup(m->sums, file);
        if (got == NULL)
            return vm_throw(error, VM_ERROR_BAD_STATE, "file %s of the move never came", file),
                   NULL;
        if (strncmp(got, *f, 64) != 0)
            return vm_throw(error, VM_ERROR_BAD_STATE,
                            "file %s of the move came with SHA-256 %.12s..., not the source's "
                            "%.12s...",
                            file, got, *f),
                   NULL;
        g_hash_table_add(names, g_strdup(hostd_move_in_file(file)));
    }
    if (!g_hash_table_contains(names, HOSTD_AGENT_RECORD))
        return vm_throw(error, VM_ERROR_BAD_STATE, "the move brought no %s", HOSTD_AGENT_RECORD),
               NULL;
    return g_steal_pointer(&names);
}

/* The record of the moved agent, as this host will have it, from the incoming one. */
HostdAgentRecord *
hostd_move_in_record(HostdContext *ctx, const HostdMove *m, const char *name, const char *incoming,
                     GHashTable *names, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(incoming, error);
    if (r == NULL)
        return NULL;
    if (!g_str_equal(r->name, name) || !g_str_equal(r->template_name, m->template_name))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "the moved record is of agent '%s' (template '%s'), not of '%s' "
                        "(template '%s')",
                        r->name, r->template_name, name, m->template_name),
               NULL;
    if ((r->warm_base != NULL) != g_hash_table_contains(names, MOVE_WARM_FILE) ||
        r->forked_from != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "the moved record of '%s' does not match its files", r->name),
               NULL;
    g_free(r->dir);
    r->dir = hostd_agent_dir(ctx, name);
    g_free(r->phase);
    r->phase = g_strdup(HOSTD_PHASE_CREATING);
    r->ssh_port = 0;
    r->backend_port = 0;
    r->agent_id = 0;
    /* What names files or this host's things is this host's to set, never the record's: it
     * came through a client. */
    g_clear_pointer(&r->domain, g_free);
    g_clear_pointer(&r->fork_base, g_free);
    g_clear_pointer(&r->fork_checkpoint, g_free);
    g_clear_pointer(&r->fenced, g_free);
    g_clear_pointer(&r->moving_to, g_free);
    g_clear_pointer(&r->crashed, g_free);
    /* Its replicas are of its life on the other host (they go with the epoch it had there). */
    g_clear_pointer(&r->replicas, g_free);
    g_clear_pointer(&r->replicated, g_free);
    r->crash_count = 0;
    r->shutdown_saved = FALSE;
    r->fleet_epoch = m->epoch + 1;
    if (r->warm_base != NULL) {
        g_free(r->warm_base);
        r->warm_base = g_build_filename(r->dir, MOVE_WARM_FILE, NULL);
    }
    return g_steal_pointer(&r);
}

/* Moves the incoming files @names into @r's dir (the record there is hostd_agent_reserve()'s). */
gboolean
hostd_move_in_install(const HostdAgentRecord *r, const char *incoming, GHashTable *names,
                      gboolean link_only, GError **error)
{
    GHashTableIter it;
    gpointer file;
    g_hash_table_iter_init(&it, names);
    while (g_hash_table_iter_next(&it, &file, NULL)) {
        if (g_str_equal(file, HOSTD_AGENT_RECORD))
            continue;
        g_autofree char *from = g_build_filename(incoming, file, NULL);
        g_autofree char *to = g_build_filename(r->dir, file, NULL);
        if (link_only ? link(from, to) < 0 : g_rename(from, to) < 0)
            return vm_throw_errno(error, errno, "cannot move %s to %s", from, to);
        /* hostd's own files as hostd writes them; the images are the agent's id's at boot. */
        if (g_str_equal(file, MOVE_WARM_FILE) || g_str_has_suffix(file, ".pub") ||
            g_str_equal(file, HOSTD_AGENT_KNOWN_HOSTS) || g_str_equal(file, HOSTD_AGENT_SSH_CONFIG))
            g_chmod(to, 0644);
    }
    return TRUE;
}

/* Old path on the source -> path here, for every image a header may name. */
GHashTable *
hostd_move_in_paths(const HostdMove *m, const HostdAgentRecord *r, const char *base_here,
                    GHashTable *names)
{
    GHashTable *moved = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    GHashTableIter it;
    gpointer file;
    g_hash_table_iter_init(&it, names);
    while (g_hash_table_iter_next(&it, &file, NULL)) {
        if (g_str_equal(file, MOVE_WARM_FILE) || g_str_equal(file, MOVE_MEMORY_FILE))
            continue;
        g_hash_table_replace(moved, g_build_filename(m->source_dir, file, NULL),
                             g_build_filename(r->dir, file, NULL));
    }
    g_hash_table_replace(moved, g_strdup(m->base_path), g_strdup(base_here));
    if (m->warm_path != NULL && r->warm_base != NULL)
        g_hash_table_replace(moved, g_strdup(m->warm_path), g_strdup(r->warm_base));
    return moved;
}

GVariant *
hostd_move_commit(HostdContext *ctx, const HostdMoveIn *in, VmProgressFunc progress,
                  gpointer progress_data, GError **error)
{
    if (hostd_context_fleet(ctx, error) == NULL || !vm_name_validate(in->name, error))
        return NULL;
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, in->name);
    g_autoptr(HostdMove) m = g_new0(HostdMove, 1);
    if (!hostd_move_with(ctx, FALSE, in->name, hostd_move_snapshot, m))
        return vm_throw(error, VM_ERROR_BAD_STATE, "no move of agent '%s' is under way here",
                        in->name),
               NULL;
    g_autofree char *dir = hostd_agent_dir(ctx, in->name);
    g_autoptr(virDomain) existing = hostd_libvirt_lookup(ctx->lv, in->name, NULL);
    if (g_file_test(dir, G_FILE_TEST_EXISTS) || existing != NULL)
        return vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already has a copy here", in->name),
               NULL;
    g_autoptr(GHashTable) names = move_check_sums(m, in->files, error);
    if (names == NULL)
        return NULL;
    g_autofree char *incoming = hostd_move_incoming_dir(ctx, in->name);
    g_autoptr(HostdAgentRecord) r = hostd_move_in_record(ctx, m, in->name, incoming, names, error);
    if (r == NULL)
        return NULL;
    /* The sizes the record says, which begin's check did not see. */
    if (!hostd_check_resources(ctx, r->cpus, r->memory_mib, r->disk_gib, error))
        return NULL;
    g_autoptr(VmImage) image = hostd_agent_image(ctx, r, error);
    if (image == NULL)
        return NULL;
    g_autofree char *wanted = g_strdup(r->wanted);
    gboolean has_memory = g_hash_table_contains(names, MOVE_MEMORY_FILE);

    hostd_progress(progress, progress_data, "installing the agent", -1);
    if (!hostd_agent_reserve(ctx, r, error))
        return NULL;
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GHashTable) moved = hostd_move_in_paths(m, r, image->disk_path, names);
    g_autoptr(virDomain) dom = NULL;
    g_autoptr(VmCheckpointSet) set = NULL;
    g_autofree char *memory = g_build_filename(r->dir, MOVE_MEMORY_FILE, NULL);
    gboolean ok = hostd_move_in_install(r, incoming, names, FALSE, &local_error) &&
                  hostd_agent_rehome(ctx, r, &local_error) &&
                  hostd_confine_agent(ctx, r, &local_error) &&
                  hostd_checkpoint_rehome(ctx, r, moved, &local_error);
    if (ok)
        ok = (set = vm_checkpoint_set_load(r->dir, &local_error)) != NULL &&
             hostd_checkpoint_define(ctx, r, set, &local_error) &&
             (dom = hostd_libvirt_lookup(ctx->lv, r->name, &local_error)) != NULL;
    if (ok)
        hostd_crash_point("move-installed");
    if (ok && has_memory) {
        hostd_progress(progress, progress_data, "restoring the agent's memory", -1);
        g_autofree char *xml = hostd_checkpoint_saved_xml(ctx, r, set, memory, &local_error);
        ok = xml != NULL && hostd_agent_restore_locked(ctx, r, dom, memory, xml, &local_error);
    }
    /* Ready on disk before the record moves: a hostd killed from here on finds a finished agent
     * at start, fenced while the record names the source, this host's once it names this one
     * (a record still "creating" would be rolled back at start, after the fleet gave it here). */
    if (ok) {
        g_free(r->phase);
        r->phase = g_strdup(HOSTD_PHASE_READY);
        hostd_agent_set_wanted(r, has_memory ? HOSTD_WANTED_RUNNING : wanted);
        ok = hostd_agent_record_save(r, &local_error);
    }
    /* The fleet's record moves only once the agent runs here: until then it is the source's. */
    guint64 epoch = 0;
    if (ok) {
        hostd_crash_point("move-restored");
        hostd_progress(progress, progress_data, "taking the agent over in the fleet", -1);
        ok = hostd_cluster_take(ctx->cluster, in->name, m->peer, m->epoch,
                                hostd_libvirt_state_name(dom), &epoch, &local_error);
    }
    if (!ok) {
        if (dom != NULL && hostd_libvirt_is_active(dom))
            virDomainDestroy(dom);
        virResetLastError();
        hostd_agent_rollback(ctx, in->name, r->dir);
        g_propagate_prefixed_error(error, g_steal_pointer(&local_error),
                                   "cannot take agent '%s' in: ", in->name);
        return NULL;
    }
    hostd_crash_point("move-taken");
    g_unlink(memory);
    r->fleet_epoch = epoch;
    if (!hostd_agent_record_save(r, &local_error))
        hostd_context_log(ctx, "agent '%s': moved here, but its record is not saved: %s", in->name,
                          local_error->message);
    vm_remove_tree(incoming, NULL);
    hostd_move_forget(ctx, FALSE, in->name);
    if (has_memory)
        hostd_guest_sync_clock(ctx, dom, r->name);
    hostd_cluster_kick(ctx->cluster);
    hostd_context_log(ctx, "agent '%s' moved here from host '%s' (epoch %" G_GUINT64_FORMAT ")",
                      in->name, m->peer, epoch);
    hostd_context_agent_event(ctx, in->name, "moved-in", hostd_libvirt_state_name(dom), m->peer);
    return hostd_agent_to_variant(ctx, r);
}

GVariant *
hostd_move_abort_in(HostdContext *ctx, const char *name, GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, name);
    hostd_move_forget(ctx, FALSE, name);
    g_autofree char *incoming = hostd_move_incoming_dir(ctx, name);
    vm_remove_tree(incoming, NULL);
    return g_variant_new_parsed("@a{sv} {}");
}

/* ---------------------------------------------------------------------------------------------
 * Settling what was left */

void
hostd_move_tick(HostdContext *ctx, const GPtrArray *records)
{
    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *seen = records->pdata[i];
        if (seen->moving_to == NULL || hostd_move_active(ctx, TRUE, seen->name))
            continue;
        g_autoptr(HostdNameLock) lock = hostd_name_trylock(ctx, seen->name);
        if (lock == NULL)
            continue;
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, seen->name, NULL);
        if (r == NULL || r->moving_to == NULL)
            continue;
        g_autofree char *owner = NULL;
        guint64 epoch = 0;
        g_autoptr(GError) error = NULL;
        if (!move_out_settle(ctx, r, &owner, &epoch, &error) &&
            !g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING))
            hostd_context_log(ctx, "agent '%s': its move cannot be settled: %s", seen->name,
                              error->message);
    }

    hostd_move_sweep_received(ctx, HOSTD_MOVE_INCOMING_DIR);
}

void
hostd_move_sweep_received(HostdContext *ctx, const char *subdir)
{
    g_autofree char *top = g_build_filename(ctx->state->dir, subdir, NULL);
    g_autoptr(GDir) dir = g_dir_open(top, 0, NULL);
    for (const char *name; dir != NULL && (name = g_dir_read_name(dir)) != NULL;) {
        if (hostd_move_active(ctx, FALSE, name))
            continue;
        g_autoptr(HostdNameLock) lock = hostd_name_trylock(ctx, name);
        if (lock == NULL)
            continue;
        hostd_move_forget(ctx, FALSE, name);
        g_autofree char *path = g_build_filename(top, name, NULL);
        vm_remove_tree(path, NULL);
    }
}
