#include "vm-checkpoint.h"

#include "vm-error.h"
#include "vm-util.h"

#include <string.h>

#define GROUP_CHAIN   "chain"
#define GROUP_PENDING "pending"
#define GROUP_PREFIX  "checkpoint "

static void
vm_checkpoint_free(VmCheckpoint *c)
{
    if (c == NULL)
        return;
    g_free(c->id);
    g_free(c->label);
    g_free(c->image);
    g_free(c->parent);
    g_free(c->memory);
    g_free(c);
}

static VmCheckpointSet *
vm_checkpoint_set_new(const char *dir)
{
    VmCheckpointSet *set = g_new0(VmCheckpointSet, 1);
    set->dir = g_strdup(dir);
    set->checkpoints = g_ptr_array_new_with_free_func((GDestroyNotify)vm_checkpoint_free);
    set->active = g_strdup(VM_CHECKPOINT_FIRST_DISK);
    set->next_seq = 1;
    return set;
}

void
vm_checkpoint_set_free(VmCheckpointSet *set)
{
    if (set == NULL)
        return;
    g_free(set->dir);
    g_ptr_array_unref(set->checkpoints);
    g_free(set->active);
    g_free(set->active_parent);
    g_free(set->pending_file);
    g_free(set->pending_target);
    g_free(set->pending_label);
    g_free(set->pending_memory);
    g_free(set);
}

VmCheckpoint *
vm_checkpoint_set_find(const VmCheckpointSet *set, const char *id)
{
    for (guint i = 0; i < set->checkpoints->len; i++) {
        VmCheckpoint *c = set->checkpoints->pdata[i];
        if (g_strcmp0(c->id, id) == 0)
            return c;
    }
    return NULL;
}

char *
vm_checkpoint_set_path(const VmCheckpointSet *set, const char *file)
{
    return g_build_filename(set->dir, file, NULL);
}

static gboolean
vm_checkpoint_corrupt(GError **error, const char *path, const char *what)
{
    return vm_throw(error, VM_ERROR_FAILED, "corrupt checkpoint record %s: %s", path, what);
}

/* File names in the record are bare names inside the agent dir: never a path. */
static gboolean
vm_checkpoint_file_name_ok(const char *name)
{
    return name != NULL && name[0] != '\0' && name[0] != '.' && strchr(name, '/') == NULL;
}

/* GKeyFile silently merges groups that repeat, so a duplicated checkpoint would come back as one
 * with a mix of both records' keys: look for repeated group headers in the text itself. */
static gboolean
vm_checkpoint_has_duplicate_group(const char *data)
{
    g_autoptr(GHashTable) seen = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_auto(GStrv) lines = g_strsplit(data, "\n", -1);

    for (char **l = lines; *l != NULL; l++) {
        char *line = g_strstrip(*l);
        if (line[0] != '[')
            continue;
        if (!g_hash_table_add(seen, g_strdup(line)))
            return TRUE;
    }
    return FALSE;
}

/* Every file the record names is distinct: otherwise removing a checkpoint or committing an
 * operation could make the caller delete or overwrite a disk still in use. */
static gboolean
vm_checkpoint_files_distinct(const VmCheckpointSet *set)
{
    g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

    g_hash_table_add(seen, set->active);
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        if (!g_hash_table_add(seen, c->image))
            return FALSE;
    }
    return set->pending_file == NULL || g_hash_table_add(seen, set->pending_file);
}

VmCheckpointSet *
vm_checkpoint_set_load(const char *dir, GError **error)
{
    g_autofree char *path = g_build_filename(dir, VM_CHECKPOINT_RECORD, NULL);
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_new(dir);
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) local_error = NULL;
    g_autofree char *data = NULL;
    gsize len = 0;

    if (!g_file_test(path, G_FILE_TEST_EXISTS))
        return g_steal_pointer(&set);
    if (!g_file_get_contents(path, &data, &len, &local_error)) {
        vm_throw(error, VM_ERROR_IO, "cannot read %s: %s", path, local_error->message);
        return NULL;
    }
    if (!g_key_file_load_from_data(kf, data, len, G_KEY_FILE_NONE, &local_error)) {
        vm_checkpoint_corrupt(error, path, local_error->message);
        return NULL;
    }
    if (vm_checkpoint_has_duplicate_group(data)) {
        vm_checkpoint_corrupt(error, path, "duplicate checkpoint");
        return NULL;
    }

    g_free(set->active);
    set->active = g_key_file_get_string(kf, GROUP_CHAIN, "active", NULL);
    set->active_parent = g_key_file_get_string(kf, GROUP_CHAIN, "active-parent", NULL);
    set->next_seq = (guint)g_key_file_get_uint64(kf, GROUP_CHAIN, "next", NULL);
    if (!vm_checkpoint_file_name_ok(set->active) || set->next_seq == 0) {
        vm_checkpoint_corrupt(error, path, "no active disk or sequence");
        return NULL;
    }

    g_auto(GStrv) groups = g_key_file_get_groups(kf, NULL);
    for (char **g = groups; *g != NULL; g++) {
        if (!g_str_has_prefix(*g, GROUP_PREFIX))
            continue;
        VmCheckpoint *c = g_new0(VmCheckpoint, 1);
        c->id = g_strdup(*g + strlen(GROUP_PREFIX));
        c->label = g_key_file_get_string(kf, *g, "label", NULL);
        c->image = g_key_file_get_string(kf, *g, "image", NULL);
        c->parent = g_key_file_get_string(kf, *g, "parent", NULL);
        c->created = g_key_file_get_int64(kf, *g, "created", NULL);
        c->automatic = g_key_file_get_boolean(kf, *g, "automatic", NULL);
        c->quiesced = g_key_file_get_boolean(kf, *g, "quiesced", NULL);
        c->memory = g_key_file_get_string(kf, *g, "memory", NULL);
        if (vm_checkpoint_set_find(set, c->id) != NULL || !vm_checkpoint_file_name_ok(c->image) ||
            (c->memory != NULL && !vm_checkpoint_file_name_ok(c->memory))) {
            vm_checkpoint_free(c);
            vm_checkpoint_corrupt(error, path, "duplicate checkpoint or bad image name");
            return NULL;
        }
        g_ptr_array_add(set->checkpoints, c);
    }
    for (guint i = 0; i < set->checkpoints->len; i++) {
        VmCheckpoint *c = set->checkpoints->pdata[i];
        if (c->parent != NULL && vm_checkpoint_set_find(set, c->parent) == NULL) {
            vm_checkpoint_corrupt(error, path, "a checkpoint stands on an unknown one");
            return NULL;
        }
    }
    if (set->active_parent != NULL && vm_checkpoint_set_find(set, set->active_parent) == NULL) {
        vm_checkpoint_corrupt(error, path, "the active disk stands on an unknown checkpoint");
        return NULL;
    }

    g_autofree char *op = g_key_file_get_string(kf, GROUP_PENDING, "op", NULL);
    if (op != NULL) {
        set->pending = g_str_equal(op, "create")    ? VM_CHECKPOINT_OP_CREATE
                       : g_str_equal(op, "restore") ? VM_CHECKPOINT_OP_RESTORE
                       : g_str_equal(op, "merge")   ? VM_CHECKPOINT_OP_MERGE
                                                    : VM_CHECKPOINT_OP_NONE;
        set->pending_file = g_key_file_get_string(kf, GROUP_PENDING, "file", NULL);
        set->pending_target = g_key_file_get_string(kf, GROUP_PENDING, "target", NULL);
        set->pending_label = g_key_file_get_string(kf, GROUP_PENDING, "label", NULL);
        set->pending_automatic = g_key_file_get_boolean(kf, GROUP_PENDING, "automatic", NULL);
        set->pending_memory = g_key_file_get_string(kf, GROUP_PENDING, "memory", NULL);
        gboolean merge = set->pending == VM_CHECKPOINT_OP_MERGE;
        if (set->pending == VM_CHECKPOINT_OP_NONE ||
            (set->pending_memory != NULL && !vm_checkpoint_file_name_ok(set->pending_memory)) ||
            (!merge && !vm_checkpoint_file_name_ok(set->pending_file)) ||
            (merge && (set->pending_file != NULL || vm_checkpoint_set_merge_child(set) == NULL)) ||
            (set->pending == VM_CHECKPOINT_OP_RESTORE &&
             vm_checkpoint_set_find(set, set->pending_target) == NULL)) {
            vm_checkpoint_corrupt(error, path, "unreadable journal");
            return NULL;
        }
    }
    if (!vm_checkpoint_files_distinct(set)) {
        vm_checkpoint_corrupt(error, path, "two records name the same file");
        return NULL;
    }
    return g_steal_pointer(&set);
}

gboolean
vm_checkpoint_set_save(const VmCheckpointSet *set, GError **error)
{
    g_autofree char *path = g_build_filename(set->dir, VM_CHECKPOINT_RECORD, NULL);
    g_autoptr(GKeyFile) kf = g_key_file_new();

    g_key_file_set_string(kf, GROUP_CHAIN, "active", set->active);
    if (set->active_parent != NULL)
        g_key_file_set_string(kf, GROUP_CHAIN, "active-parent", set->active_parent);
    g_key_file_set_uint64(kf, GROUP_CHAIN, "next", set->next_seq);
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *group = g_strconcat(GROUP_PREFIX, c->id, NULL);
        if (c->label != NULL)
            g_key_file_set_string(kf, group, "label", c->label);
        g_key_file_set_string(kf, group, "image", c->image);
        if (c->parent != NULL)
            g_key_file_set_string(kf, group, "parent", c->parent);
        g_key_file_set_int64(kf, group, "created", c->created);
        g_key_file_set_boolean(kf, group, "automatic", c->automatic);
        g_key_file_set_boolean(kf, group, "quiesced", c->quiesced);
        if (c->memory != NULL)
            g_key_file_set_string(kf, group, "memory", c->memory);
    }
    if (set->pending != VM_CHECKPOINT_OP_NONE) {
        const char *op = set->pending == VM_CHECKPOINT_OP_CREATE    ? "create"
                         : set->pending == VM_CHECKPOINT_OP_RESTORE ? "restore"
                                                                    : "merge";
        g_key_file_set_string(kf, GROUP_PENDING, "op", op);
        if (set->pending_file != NULL)
            g_key_file_set_string(kf, GROUP_PENDING, "file", set->pending_file);
        if (set->pending_target != NULL)
            g_key_file_set_string(kf, GROUP_PENDING, "target", set->pending_target);
        if (set->pending_label != NULL)
            g_key_file_set_string(kf, GROUP_PENDING, "label", set->pending_label);
        g_key_file_set_boolean(kf, GROUP_PENDING, "automatic", set->pending_automatic);
        if (set->pending_memory != NULL)
            g_key_file_set_string(kf, GROUP_PENDING, "memory", set->pending_memory);
    }
    gsize len = 0;
    g_autofree char *data = g_key_file_to_data(kf, &len, NULL);
    return vm_file_write_atomic(path, data, (gssize)len, 0600, error);
}

static gboolean
vm_checkpoint_set_check_idle(const VmCheckpointSet *set, GError **error)
{
    if (set->pending != VM_CHECKPOINT_OP_NONE)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "another checkpoint operation has not finished; restart hostd to repair");
    return TRUE;
}

gboolean
vm_checkpoint_set_begin_create(VmCheckpointSet *set, const char *label, gboolean automatic,
                               const char **ret_file, GError **error)
{
    if (!vm_checkpoint_set_check_idle(set, error))
        return FALSE;
    set->pending = VM_CHECKPOINT_OP_CREATE;
    set->pending_file = g_strdup_printf("disk-%u.qcow2", set->next_seq);
    set->pending_label = g_strdup(label);
    set->pending_automatic = automatic;
    *ret_file = set->pending_file;
    return TRUE;
}

const char *
vm_checkpoint_set_journal_memory(VmCheckpointSet *set)
{
    g_return_val_if_fail(set->pending == VM_CHECKPOINT_OP_CREATE, NULL);
    g_free(set->pending_memory);
    set->pending_memory = g_strdup_printf("memory-%u.save", set->next_seq);
    return set->pending_memory;
}

VmCheckpoint *
vm_checkpoint_set_commit_create(VmCheckpointSet *set, gboolean quiesced)
{
    g_return_val_if_fail(set->pending == VM_CHECKPOINT_OP_CREATE, NULL);

    VmCheckpoint *c = g_new0(VmCheckpoint, 1);
    c->id = g_strdup_printf("c%u", set->next_seq);
    c->label = g_steal_pointer(&set->pending_label);
    c->image = g_steal_pointer(&set->active);
    c->parent = g_steal_pointer(&set->active_parent);
    c->created = g_get_real_time() / G_USEC_PER_SEC;
    c->automatic = set->pending_automatic;
    c->quiesced = quiesced;
    c->memory = g_steal_pointer(&set->pending_memory);
    g_ptr_array_add(set->checkpoints, c);

    set->active = g_steal_pointer(&set->pending_file);
    set->active_parent = g_strdup(c->id);
    set->next_seq++;
    vm_checkpoint_set_abort(set);
    return c;
}

gboolean
vm_checkpoint_set_begin_restore(VmCheckpointSet *set, const char *id, const char **ret_file,
                                GError **error)
{
    if (!vm_checkpoint_set_check_idle(set, error))
        return FALSE;
    if (vm_checkpoint_set_find(set, id) == NULL)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "no checkpoint '%s'", id);
    set->pending = VM_CHECKPOINT_OP_RESTORE;
    set->pending_file = g_strdup_printf("disk-%u.qcow2", set->next_seq);
    set->pending_target = g_strdup(id);
    *ret_file = set->pending_file;
    return TRUE;
}

char *
vm_checkpoint_set_commit_restore(VmCheckpointSet *set)
{
    g_return_val_if_fail(set->pending == VM_CHECKPOINT_OP_RESTORE, NULL);

    char *old = g_steal_pointer(&set->active);
    g_free(set->active_parent);
    set->active = g_steal_pointer(&set->pending_file);
    set->active_parent = g_steal_pointer(&set->pending_target);
    set->next_seq++;
    vm_checkpoint_set_abort(set);
    return old;
}

const VmCheckpoint *
vm_checkpoint_set_begin_merge(VmCheckpointSet *set, const char *id, GError **error)
{
    if (!vm_checkpoint_set_check_idle(set, error))
        return NULL;
    if (vm_checkpoint_set_find(set, id) == NULL) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no checkpoint '%s'", id);
        return NULL;
    }
    set->pending = VM_CHECKPOINT_OP_MERGE;
    set->pending_target = g_strdup(id);
    const VmCheckpoint *child = vm_checkpoint_set_merge_child(set);
    if (child == NULL) {
        vm_checkpoint_set_abort(set);
        vm_throw(error, VM_ERROR_BAD_STATE,
                 "checkpoint %s cannot be merged: exactly one checkpoint must stand on it", id);
    }
    return child;
}

VmCheckpoint *
vm_checkpoint_set_merge_child(const VmCheckpointSet *set)
{
    if (set->pending != VM_CHECKPOINT_OP_MERGE ||
        vm_checkpoint_set_find(set, set->pending_target) == NULL ||
        g_strcmp0(set->active_parent, set->pending_target) == 0)
        return NULL;
    VmCheckpoint *child = NULL;
    for (guint i = 0; i < set->checkpoints->len; i++) {
        VmCheckpoint *c = set->checkpoints->pdata[i];
        if (g_strcmp0(c->parent, set->pending_target) == 0) {
            if (child != NULL)
                return NULL;
            child = c;
        }
    }
    return child;
}

char *
vm_checkpoint_set_commit_merge(VmCheckpointSet *set)
{
    VmCheckpoint *child = vm_checkpoint_set_merge_child(set);
    g_return_val_if_fail(child != NULL, NULL);

    VmCheckpoint *merged = vm_checkpoint_set_find(set, set->pending_target);
    char *file = child->image;
    child->image = merged->image;
    merged->image = file;
    g_autofree char *id = g_strdup(merged->id);
    vm_checkpoint_set_abort(set);
    return vm_checkpoint_set_remove(set, id, NULL);
}

void
vm_checkpoint_set_abort(VmCheckpointSet *set)
{
    set->pending = VM_CHECKPOINT_OP_NONE;
    g_clear_pointer(&set->pending_file, g_free);
    g_clear_pointer(&set->pending_target, g_free);
    g_clear_pointer(&set->pending_label, g_free);
    g_clear_pointer(&set->pending_memory, g_free);
    set->pending_automatic = FALSE;
}

char **
vm_checkpoint_set_dependants(const VmCheckpointSet *set, const char *id, gboolean *ret_active)
{
    g_autoptr(GPtrArray) ids = g_ptr_array_new();
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        if (g_strcmp0(c->parent, id) == 0)
            g_ptr_array_add(ids, g_strdup(c->id));
    }
    g_ptr_array_add(ids, NULL);
    if (ret_active != NULL)
        *ret_active = g_strcmp0(set->active_parent, id) == 0;
    return (char **)g_ptr_array_free(g_steal_pointer(&ids), FALSE);
}

guint
vm_checkpoint_set_active_depth(const VmCheckpointSet *set)
{
    guint depth = 1;
    const char *parent = set->active_parent;
    while (parent != NULL && depth <= set->checkpoints->len + 1) {
        const VmCheckpoint *c = vm_checkpoint_set_find(set, parent);
        if (c == NULL)
            break;
        depth++;
        parent = c->parent;
    }
    return depth;
}

char *
vm_checkpoint_set_remove(VmCheckpointSet *set, const char *id, GError **error)
{
    VmCheckpoint *c = vm_checkpoint_set_find(set, id);
    if (c == NULL) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no checkpoint '%s'", id);
        return NULL;
    }
    for (guint i = 0; i < set->checkpoints->len; i++) {
        VmCheckpoint *d = set->checkpoints->pdata[i];
        if (g_strcmp0(d->parent, id) == 0) {
            g_free(d->parent);
            d->parent = g_strdup(c->parent);
        }
    }
    if (g_strcmp0(set->active_parent, id) == 0) {
        g_free(set->active_parent);
        set->active_parent = g_strdup(c->parent);
    }
    char *image = g_steal_pointer(&c->image);
    g_ptr_array_remove(set->checkpoints, c);
    return image;
}
