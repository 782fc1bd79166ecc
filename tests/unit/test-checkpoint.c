/* The checkpoint record of an agent: create and restore journal their intent so that it survives
 * a restart and commit into the tree hostd relies on, ids are never reused, removing a checkpoint
 * re-parents what stood on it, the record survives a save/load round trip written privately and
 * atomically, and a damaged record is refused with the file named before hostd acts on it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

#include "vm-checkpoint.h"
#include "vm-error.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* ---- helpers ------------------------------------------------------------------------------- */

static VmCheckpointSet *
load_ok(const char *dir)
{
    g_autoptr(GError) error = NULL;
    VmCheckpointSet *set = vm_checkpoint_set_load(dir, &error);
    if (set == NULL)
        fail_msg("load failed: %s", error->message);
    return set;
}

static void
save_ok(const VmCheckpointSet *set)
{
    g_autoptr(GError) error = NULL;
    if (!vm_checkpoint_set_save(set, &error))
        fail_msg("save failed: %s", error->message);
}

static VmCheckpointSet *
save_and_reload(const VmCheckpointSet *set)
{
    save_ok(set);
    return load_ok(set->dir);
}

/* A whole create: begin + commit. Returns the new checkpoint's id (owned by the set). */
static const char *
create_ok(VmCheckpointSet *set, const char *label, gboolean automatic, gboolean quiesced)
{
    g_autoptr(GError) error = NULL;
    const char *file = NULL;

    if (!vm_checkpoint_set_begin_create(set, label, automatic, &file, &error))
        fail_msg("begin_create failed: %s", error->message);
    VmCheckpoint *c = vm_checkpoint_set_commit_create(set, quiesced);
    assert_non_null(c);
    return c->id;
}

/* A whole restore: begin + commit. Returns the overlay that was active before. */
static char *
restore_ok(VmCheckpointSet *set, const char *id)
{
    g_autoptr(GError) error = NULL;
    const char *file = NULL;

    if (!vm_checkpoint_set_begin_restore(set, id, &file, &error))
        fail_msg("begin_restore failed: %s", error->message);
    char *old = vm_checkpoint_set_commit_restore(set);
    assert_non_null(old);
    return old;
}

static void
assert_no_pending(const VmCheckpointSet *set)
{
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    assert_null(set->pending_file);
    assert_null(set->pending_target);
    assert_null(set->pending_label);
    assert_false(set->pending_automatic);
}

static void
assert_checkpoints_equal(const VmCheckpoint *a, const VmCheckpoint *b)
{
    assert_string_equal(a->id, b->id);
    vm_test_assert_nullable_string_equal(a->label, b->label);
    assert_string_equal(a->image, b->image);
    vm_test_assert_nullable_string_equal(a->parent, b->parent);
    assert_int_equal(a->created, b->created);
    assert_int_equal(a->automatic, b->automatic);
    assert_int_equal(a->quiesced, b->quiesced);
    vm_test_assert_nullable_string_equal(a->memory, b->memory);
}

static void
assert_sets_equal(const VmCheckpointSet *a, const VmCheckpointSet *b)
{
    assert_string_equal(a->dir, b->dir);
    assert_int_equal(a->checkpoints->len, b->checkpoints->len);
    for (guint i = 0; i < a->checkpoints->len; i++)
        assert_checkpoints_equal(a->checkpoints->pdata[i], b->checkpoints->pdata[i]);
    assert_string_equal(a->active, b->active);
    vm_test_assert_nullable_string_equal(a->active_parent, b->active_parent);
    assert_int_equal(a->next_seq, b->next_seq);
    assert_int_equal(a->pending, b->pending);
    vm_test_assert_nullable_string_equal(a->pending_file, b->pending_file);
    vm_test_assert_nullable_string_equal(a->pending_target, b->pending_target);
    vm_test_assert_nullable_string_equal(a->pending_label, b->pending_label);
    assert_int_equal(a->pending_automatic, b->pending_automatic);
    vm_test_assert_nullable_string_equal(a->pending_memory, b->pending_memory);
}

/* The dependants of @id, joined with spaces, then " +active" when the active overlay stands on
 * it: one string to compare. */
static char *
dependants_string(const VmCheckpointSet *set, const char *id)
{
    gboolean active = FALSE;
    g_auto(GStrv) ids = vm_checkpoint_set_dependants(set, id, &active);
    g_autofree char *joined = g_strjoinv(" ", ids);
    return g_strdup_printf("%s%s", joined, active ? " +active" : "");
}

static void
assert_dependants(const VmCheckpointSet *set, const char *id, const char *expected)
{
    g_autofree char *actual = dependants_string(set, id);
    assert_string_equal(actual, expected);
}

/* ---- load of a fresh agent ----------------------------------------------------------------- */

static void
test_missing_record_is_fresh_agent(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);

    assert_string_equal(set->dir, f->dir);
    assert_string_equal(set->active, VM_CHECKPOINT_FIRST_DISK);
    assert_null(set->active_parent);
    assert_int_equal(set->checkpoints->len, 0);
    assert_no_pending(set);
    assert_int_equal(vm_checkpoint_set_active_depth(set), 1);
    assert_null(vm_checkpoint_set_find(set, "c1"));

    g_autofree char *path = vm_checkpoint_set_path(set, "disk.qcow2");
    g_autofree char *expected = g_build_filename(f->dir, "disk.qcow2", NULL);
    assert_string_equal(path, expected);
}

/* ---- create -------------------------------------------------------------------------------- */

static void
test_begin_create_reserves_file(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    g_autoptr(GError) error = NULL;
    const char *file = NULL;

    assert_true(vm_checkpoint_set_begin_create(set, "before upgrade", TRUE, &file, &error));
    assert_null(error);
    assert_string_equal(file, "disk-1.qcow2");
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_CREATE);
    assert_string_equal(set->pending_file, "disk-1.qcow2");
    /* Nothing is committed yet: the VM still writes to the first disk. */
    assert_string_equal(set->active, VM_CHECKPOINT_FIRST_DISK);
    assert_int_equal(set->checkpoints->len, 0);

    const char *second = NULL;
    assert_false(vm_checkpoint_set_begin_create(set, NULL, FALSE, &second, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, NULL);
    assert_null(second);
    g_clear_error(&error);
    assert_false(vm_checkpoint_set_begin_restore(set, "c1", &second, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, NULL);
    /* The refused begins left the first journal alone. */
    assert_string_equal(set->pending_file, "disk-1.qcow2");
    assert_string_equal(set->pending_label, "before upgrade");
    assert_true(set->pending_automatic);
}

static void
test_create_journal_survives_restart(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    const char *file = NULL;

    assert_true(vm_checkpoint_set_begin_create(set, "nightly", TRUE, &file, NULL));
    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_int_equal(back->pending, VM_CHECKPOINT_OP_CREATE);
    assert_string_equal(back->pending_file, "disk-1.qcow2");
    assert_string_equal(back->pending_label, "nightly");
    assert_true(back->pending_automatic);
    assert_sets_equal(set, back);

    /* The reloaded journal still blocks another operation and can be committed. */
    g_autoptr(GError) error = NULL;
    assert_false(vm_checkpoint_set_begin_create(back, NULL, FALSE, &file, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, NULL);
    VmCheckpoint *c = vm_checkpoint_set_commit_create(back, TRUE);
    assert_non_null(c);
    assert_string_equal(c->id, "c1");
    assert_string_equal(c->label, "nightly");
    assert_true(c->automatic);
    assert_string_equal(back->active, "disk-1.qcow2");
}

/* A memory checkpoint: the state file is journaled (so a crash can remove it), then belongs to
 * the checkpoint; a disk-only one has none. Both survive a reload. */
static void
test_memory_checkpoint_journal(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    const char *file = NULL;

    create_ok(set, "disk only", FALSE, TRUE);
    assert_true(vm_checkpoint_set_begin_create(set, "with memory", FALSE, &file, NULL));
    const char *memory = vm_checkpoint_set_journal_memory(set);
    assert_string_equal(memory, "memory-2.save");
    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_string_equal(back->pending_memory, "memory-2.save");

    VmCheckpoint *c = vm_checkpoint_set_commit_create(back, FALSE);
    assert_string_equal(c->memory, "memory-2.save");
    assert_null(back->pending_memory);
    g_autoptr(VmCheckpointSet) again = save_and_reload(back);
    assert_null(vm_checkpoint_set_find(again, "c1")->memory);
    assert_string_equal(vm_checkpoint_set_find(again, "c2")->memory, "memory-2.save");
    assert_sets_equal(back, again);

    /* An aborted memory checkpoint forgets its state file. */
    assert_true(vm_checkpoint_set_begin_create(again, NULL, FALSE, &file, NULL));
    vm_checkpoint_set_journal_memory(again);
    vm_checkpoint_set_abort(again);
    assert_null(again->pending_memory);
}

static void
test_create_journal_without_label(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    const char *file = NULL;

    assert_true(vm_checkpoint_set_begin_create(set, NULL, FALSE, &file, NULL));
    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_int_equal(back->pending, VM_CHECKPOINT_OP_CREATE);
    assert_null(back->pending_label);
    assert_false(back->pending_automatic);
    assert_null(back->pending_target);
}

static void
test_commit_create(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    const char *file = NULL;

    gint64 before = g_get_real_time() / G_USEC_PER_SEC;
    assert_true(vm_checkpoint_set_begin_create(set, "first", FALSE, &file, NULL));
    VmCheckpoint *c1 = vm_checkpoint_set_commit_create(set, TRUE);
    gint64 after = g_get_real_time() / G_USEC_PER_SEC;

    assert_non_null(c1);
    assert_string_equal(c1->id, "c1");
    assert_string_equal(c1->label, "first");
    assert_string_equal(c1->image, VM_CHECKPOINT_FIRST_DISK);
    assert_null(c1->parent);
    assert_false(c1->automatic);
    assert_true(c1->quiesced);
    assert_in_range(c1->created, before, after);
    assert_ptr_equal(vm_checkpoint_set_find(set, "c1"), c1);
    assert_string_equal(set->active, "disk-1.qcow2");
    assert_string_equal(set->active_parent, "c1");
    assert_no_pending(set);

    assert_true(vm_checkpoint_set_begin_create(set, NULL, TRUE, &file, NULL));
    assert_string_equal(file, "disk-2.qcow2");
    VmCheckpoint *c2 = vm_checkpoint_set_commit_create(set, FALSE);
    assert_string_equal(c2->id, "c2");
    assert_null(c2->label);
    assert_string_equal(c2->image, "disk-1.qcow2");
    assert_string_equal(c2->parent, "c1");
    assert_true(c2->automatic);
    assert_false(c2->quiesced);
    assert_string_equal(set->active, "disk-2.qcow2");
    assert_string_equal(set->active_parent, "c2");
    assert_no_pending(set);
}

static void
test_ids_never_repeat(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    g_autoptr(GHashTable) ids = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_autoptr(GHashTable) files = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);

    g_hash_table_add(files, g_strdup(set->active));
    for (guint round = 0; round < 4; round++) {
        const char *id = create_ok(set, NULL, FALSE, TRUE);
        if (!g_hash_table_add(ids, g_strdup(id)))
            fail_msg("id %s given twice", id);
        if (!g_hash_table_add(files, g_strdup(set->active)))
            fail_msg("file %s given twice", set->active);

        /* Removing the newest checkpoint, and reloading, must not free its id for reuse. */
        g_autofree char *image = vm_checkpoint_set_remove(set, id, NULL);
        assert_non_null(image);
        g_autoptr(VmCheckpointSet) back = save_and_reload(set);
        vm_checkpoint_set_free(g_steal_pointer(&set));
        set = g_steal_pointer(&back);
    }
    /* An aborted create does not consume an id, but the next one is still fresh. */
    const char *file = NULL;
    assert_true(vm_checkpoint_set_begin_create(set, NULL, FALSE, &file, NULL));
    vm_checkpoint_set_abort(set);
    const char *id = create_ok(set, NULL, FALSE, TRUE);
    assert_false(g_hash_table_contains(ids, id));
    assert_false(g_hash_table_contains(files, set->active));
}

/* ---- restore ------------------------------------------------------------------------------- */

static void
test_restore_unknown_id(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    create_ok(set, "one", FALSE, TRUE);
    save_ok(set);
    g_autoptr(VmCheckpointSet) before = load_ok(f->dir);

    static const char *const bad_ids[] = {"c2", "c0", "", "C1", "c1 ", "1", "../c1"};
    for (gsize i = 0; i < G_N_ELEMENTS(bad_ids); i++) {
        g_autoptr(GError) error = NULL;
        const char *file = NULL;
        assert_false(vm_checkpoint_set_begin_restore(set, bad_ids[i], &file, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, NULL);
        assert_null(file);
        assert_sets_equal(set, before);
    }
}

static void
test_restore_journal_survives_restart(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    g_autoptr(GError) error = NULL;
    const char *file = NULL;

    create_ok(set, NULL, FALSE, TRUE);
    create_ok(set, NULL, FALSE, TRUE);
    assert_true(vm_checkpoint_set_begin_restore(set, "c1", &file, &error));
    assert_string_equal(file, "disk-3.qcow2");
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_RESTORE);

    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_int_equal(back->pending, VM_CHECKPOINT_OP_RESTORE);
    assert_string_equal(back->pending_target, "c1");
    assert_string_equal(back->pending_file, "disk-3.qcow2");
    assert_sets_equal(set, back);

    assert_false(vm_checkpoint_set_begin_restore(back, "c2", &file, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, NULL);
}

static void
test_commit_restore(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    const char *file = NULL;

    create_ok(set, NULL, FALSE, TRUE); /* c1: disk.qcow2, active disk-1 */
    create_ok(set, NULL, FALSE, TRUE); /* c2: disk-1, active disk-2 */
    assert_true(vm_checkpoint_set_begin_restore(set, "c1", &file, NULL));
    g_autofree char *old = vm_checkpoint_set_commit_restore(set);

    assert_string_equal(old, "disk-2.qcow2");
    assert_string_equal(set->active, "disk-3.qcow2");
    assert_string_equal(set->active_parent, "c1");
    assert_no_pending(set);
    /* The checkpoints themselves are untouched. */
    assert_int_equal(set->checkpoints->len, 2);
    assert_string_equal(vm_checkpoint_set_find(set, "c2")->image, "disk-1.qcow2");
    assert_string_equal(vm_checkpoint_set_find(set, "c2")->parent, "c1");

    /* Restoring to what the active overlay stands on already still gives a fresh overlay. */
    g_autofree char *old2 = restore_ok(set, "c1");
    assert_string_equal(old2, "disk-3.qcow2");
    assert_string_equal(set->active, "disk-4.qcow2");
    assert_string_equal(set->active_parent, "c1");
}

/* ---- abort --------------------------------------------------------------------------------- */

static void
test_abort(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    create_ok(set, "base", FALSE, TRUE);
    create_ok(set, NULL, TRUE, FALSE);
    save_ok(set);
    g_autoptr(VmCheckpointSet) before = load_ok(f->dir);

    for (int op = 0; op < 2; op++) {
        const char *file = NULL;
        if (op == 0)
            assert_true(vm_checkpoint_set_begin_create(set, "x", TRUE, &file, NULL));
        else
            assert_true(vm_checkpoint_set_begin_restore(set, "c1", &file, NULL));
        vm_checkpoint_set_abort(set);
        assert_no_pending(set);
        assert_sets_equal(set, before);

        /* And the aborted journal is gone from disk once saved. */
        g_autoptr(VmCheckpointSet) back = save_and_reload(set);
        assert_sets_equal(back, before);
    }
    /* Aborting with nothing pending is harmless. */
    vm_checkpoint_set_abort(set);
    assert_sets_equal(set, before);
}

/* ---- dependants and depth ------------------------------------------------------------------ */

static void
test_dependants_and_depth(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);

    assert_int_equal(vm_checkpoint_set_active_depth(set), 1);
    assert_dependants(set, "c1", "");

    create_ok(set, NULL, FALSE, TRUE); /* c1 */
    assert_int_equal(vm_checkpoint_set_active_depth(set), 2);
    assert_dependants(set, "c1", " +active");

    create_ok(set, NULL, FALSE, TRUE); /* c2 on c1 */
    create_ok(set, NULL, FALSE, TRUE); /* c3 on c2 */
    assert_int_equal(vm_checkpoint_set_active_depth(set), 4);
    assert_dependants(set, "c1", "c2");
    assert_dependants(set, "c2", "c3");
    assert_dependants(set, "c3", " +active");

    g_autofree char *old = restore_ok(set, "c1");
    assert_int_equal(vm_checkpoint_set_active_depth(set), 2);
    assert_dependants(set, "c1", "c2 +active");
    assert_dependants(set, "c3", "");

    g_autofree char *old2 = restore_ok(set, "c2");
    assert_int_equal(vm_checkpoint_set_active_depth(set), 3);

    create_ok(set, NULL, FALSE, TRUE); /* c6 on c2 (ids 4 and 5 went to the restores) */
    assert_dependants(set, "c2", "c3 c6");
    assert_dependants(set, "c6", " +active");
    assert_int_equal(vm_checkpoint_set_active_depth(set), 4);

    /* ret_active may be NULL. */
    g_auto(GStrv) ids = vm_checkpoint_set_dependants(set, "c2", NULL);
    assert_int_equal(g_strv_length(ids), 2);
}

/* ---- remove -------------------------------------------------------------------------------- */

static void
test_remove_reparents(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);

    create_ok(set, NULL, FALSE, TRUE);            /* c1: disk.qcow2 */
    create_ok(set, NULL, FALSE, TRUE);            /* c2: disk-1 on c1 */
    create_ok(set, NULL, FALSE, TRUE);            /* c3: disk-2 on c2, active disk-3 on c3 */
    g_autofree char *old = restore_ok(set, "c2"); /* active disk-4 on c2 */

    g_autofree char *image = vm_checkpoint_set_remove(set, "c2", NULL);
    assert_string_equal(image, "disk-1.qcow2");
    assert_null(vm_checkpoint_set_find(set, "c2"));
    assert_int_equal(set->checkpoints->len, 2);
    assert_string_equal(vm_checkpoint_set_find(set, "c3")->parent, "c1");
    assert_string_equal(set->active_parent, "c1");
    assert_dependants(set, "c1", "c3 +active");
    assert_int_equal(vm_checkpoint_set_active_depth(set), 2);

    /* Removing the root: its dependants come to stand on the base image. */
    g_autofree char *root = vm_checkpoint_set_remove(set, "c1", NULL);
    assert_string_equal(root, VM_CHECKPOINT_FIRST_DISK);
    assert_null(vm_checkpoint_set_find(set, "c3")->parent);
    assert_null(set->active_parent);
    assert_int_equal(vm_checkpoint_set_active_depth(set), 1);
    assert_string_equal(set->active, "disk-4.qcow2");

    /* The re-parented tree is a valid record. */
    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_sets_equal(set, back);
}

static void
test_remove_unknown(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    create_ok(set, NULL, FALSE, TRUE);
    save_ok(set);
    g_autoptr(VmCheckpointSet) before = load_ok(f->dir);

    static const char *const bad_ids[] = {"c2", "", "c", "c1/../c1"};
    for (gsize i = 0; i < G_N_ELEMENTS(bad_ids); i++) {
        g_autoptr(GError) error = NULL;
        assert_null(vm_checkpoint_set_remove(set, bad_ids[i], &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, NULL);
        assert_sets_equal(set, before);
    }
}

/* A merge moves the one child into the merged checkpoint's file; the journal names only the
 * merged checkpoint and survives a restart, and the commit hands back the child's old file. */
static void
test_merge(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    g_autoptr(GError) error = NULL;

    create_ok(set, NULL, FALSE, TRUE); /* c1: disk.qcow2 */
    create_ok(set, NULL, FALSE, TRUE); /* c2: disk-1 on c1, active disk-2 on c2 */
    vm_checkpoint_set_find(set, "c1")->memory = g_strdup("memory-9.save");

    /* Only a checkpoint with exactly one checkpoint on it, and nothing pending. */
    assert_null(vm_checkpoint_set_begin_merge(set, "c2", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, "exactly one");
    g_clear_error(&error);
    assert_null(vm_checkpoint_set_begin_merge(set, "c7", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "c7");
    g_clear_error(&error);
    assert_null(vm_checkpoint_set_merge_child(set));

    const VmCheckpoint *child = vm_checkpoint_set_begin_merge(set, "c1", &error);
    assert_non_null(child);
    assert_string_equal(child->id, "c2");
    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_sets_equal(set, back);
    assert_int_equal(back->pending, VM_CHECKPOINT_OP_MERGE);
    assert_string_equal(vm_checkpoint_set_merge_child(back)->id, "c2");
    const char *file = NULL;
    assert_false(vm_checkpoint_set_begin_create(back, NULL, TRUE, &file, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, NULL);
    g_clear_error(&error);

    g_autofree char *old = vm_checkpoint_set_commit_merge(back);
    assert_string_equal(old, "disk-1.qcow2");
    assert_no_pending(back);
    assert_null(vm_checkpoint_set_find(back, "c1"));
    const VmCheckpoint *moved = vm_checkpoint_set_find(back, "c2");
    assert_string_equal(moved->image, VM_CHECKPOINT_FIRST_DISK);
    assert_null(moved->parent);
    assert_null(moved->memory);
    assert_string_equal(back->active_parent, "c2");
    assert_int_equal(vm_checkpoint_set_active_depth(back), 2);
    g_autoptr(VmCheckpointSet) again = save_and_reload(back);
    assert_sets_equal(back, again);
}

/* ---- save/load ----------------------------------------------------------------------------- */

static void
test_round_trip_with_branches(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    const char *file = NULL;

    create_ok(set, "clean install", FALSE, TRUE);
    create_ok(set, NULL, TRUE, FALSE);
    g_autofree char *old = restore_ok(set, "c1");
    create_ok(set, "label with = and ; and [brackets] and ünïcödé", TRUE, TRUE);
    /* Distinct timestamps, so a swapped field would show. */
    for (guint i = 0; i < set->checkpoints->len; i++)
        ((VmCheckpoint *)set->checkpoints->pdata[i])->created = 1700000000 + i * 1111;
    /* And a journal in flight on top of all that. */
    assert_true(vm_checkpoint_set_begin_restore(set, "c2", &file, NULL));

    g_autoptr(VmCheckpointSet) back = save_and_reload(set);
    assert_sets_equal(set, back);
    assert_int_equal(back->checkpoints->len, 3);
    assert_string_equal(((VmCheckpoint *)back->checkpoints->pdata[2])->id, "c4");
    assert_string_equal(((VmCheckpoint *)back->checkpoints->pdata[2])->parent, "c1");

    /* Saving what was loaded gives the same bytes: nothing is lost or reordered. */
    g_autofree char *path = g_build_filename(f->dir, VM_CHECKPOINT_RECORD, NULL);
    g_autofree char *first = vm_test_read_file(path);
    save_ok(back);
    g_autofree char *second = vm_test_read_file(path);
    assert_string_equal(first, second);
}

static void
test_save_private_and_atomic(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmCheckpointSet) set = load_ok(f->dir);
    g_autofree char *path = g_build_filename(f->dir, VM_CHECKPOINT_RECORD, NULL);

    /* An older record with loose permissions is replaced, not rewritten in place. */
    vm_test_write_file(path, "stale");
    g_assert_no_errno(chmod(path, 0644));
    create_ok(set, "one", FALSE, TRUE);
    save_ok(set);
    assert_int_equal(vm_test_file_mode(path), 0600);
    g_autofree char *listing = vm_test_dir_listing(f->dir, TRUE);
    assert_string_equal(listing, VM_CHECKPOINT_RECORD);

    create_ok(set, "two", FALSE, TRUE);
    save_ok(set);
    assert_int_equal(vm_test_file_mode(path), 0600);
    assert_int_equal(vm_test_count_entries(f->dir), 1);
}

static void
test_save_into_missing_dir(void **state)
{
    Fixture *f = *state;
    g_autofree char *dir = g_build_filename(f->dir, "gone", NULL);
    g_autoptr(VmCheckpointSet) set = load_ok(dir);
    g_autoptr(GError) error = NULL;

    assert_false(vm_checkpoint_set_save(set, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, NULL);
}

/* ---- damaged records ----------------------------------------------------------------------- */

typedef struct {
    const char *name;
    const char *contents;
} CorruptCase;

static const CorruptCase corrupt_cases[] = {
    {"unknown parent", "[chain]\nactive=disk-2.qcow2\nactive-parent=c2\nnext=3\n"
                       "[checkpoint c2]\nimage=disk-1.qcow2\nparent=c1\n"},
    {"active on unknown", "[chain]\nactive=disk-1.qcow2\nactive-parent=c7\nnext=2\n"
                          "[checkpoint c1]\nimage=disk.qcow2\n"},
    {"duplicate id", "[chain]\nactive=disk-2.qcow2\nactive-parent=c1\nnext=3\n"
                     "[checkpoint c1]\nimage=disk.qcow2\n"
                     "[checkpoint c1]\nimage=disk-1.qcow2\n"},
    {"image with slash", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                         "[checkpoint c1]\nimage=../other/disk.qcow2\n"},
    {"absolute image", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                       "[checkpoint c1]\nimage=/etc/passwd\n"},
    {"image starting with dot", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                                "[checkpoint c1]\nimage=.hidden\n"},
    {"image dot-dot", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                      "[checkpoint c1]\nimage=..\n"},
    {"empty image", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                    "[checkpoint c1]\nimage=\n"},
    {"no image", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                 "[checkpoint c1]\nlabel=x\n"},
    {"image shared", "[chain]\nactive=disk-2.qcow2\nactive-parent=c2\nnext=3\n"
                     "[checkpoint c1]\nimage=disk.qcow2\n"
                     "[checkpoint c2]\nimage=disk.qcow2\nparent=c1\n"},
    {"image is active", "[chain]\nactive=disk.qcow2\nactive-parent=c1\nnext=2\n"
                        "[checkpoint c1]\nimage=disk.qcow2\n"},
    {"no active", "[chain]\nnext=1\n"},
    {"no chain", "[checkpoint c1]\nimage=disk.qcow2\n"},
    {"active with slash", "[chain]\nactive=../disk.qcow2\nnext=1\n"},
    {"active starting with dot", "[chain]\nactive=.disk.qcow2\nnext=1\n"},
    {"no sequence", "[chain]\nactive=disk.qcow2\n"},
    {"bad sequence", "[chain]\nactive=disk.qcow2\nnext=many\n"},
    {"bad journal op", "[chain]\nactive=disk.qcow2\nnext=1\n"
                       "[pending]\nop=delete\nfile=disk-1.qcow2\n"},
    {"empty journal op", "[chain]\nactive=disk.qcow2\nnext=1\n"
                         "[pending]\nop=\nfile=disk-1.qcow2\n"},
    {"journal file with slash", "[chain]\nactive=disk.qcow2\nnext=1\n"
                                "[pending]\nop=create\nfile=../../victim\n"},
    {"journal absolute file", "[chain]\nactive=disk.qcow2\nnext=1\n"
                              "[pending]\nop=create\nfile=/var/lib/important\n"},
    {"journal file starting with dot", "[chain]\nactive=disk.qcow2\nnext=1\n"
                                       "[pending]\nop=create\nfile=.\n"},
    {"journal without file", "[chain]\nactive=disk.qcow2\nnext=1\n"
                             "[pending]\nop=create\n"},
    {"journal file in use", "[chain]\nactive=disk.qcow2\nnext=1\n"
                            "[pending]\nop=create\nfile=disk.qcow2\n"},
    {"restore to unknown", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                           "[checkpoint c1]\nimage=disk.qcow2\n"
                           "[pending]\nop=restore\nfile=disk-2.qcow2\ntarget=c9\n"},
    {"restore without target", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                               "[checkpoint c1]\nimage=disk.qcow2\n"
                               "[pending]\nop=restore\nfile=disk-2.qcow2\n"},
    {"merge of unknown", "[chain]\nactive=disk-2.qcow2\nactive-parent=c2\nnext=3\n"
                         "[checkpoint c1]\nimage=disk.qcow2\n"
                         "[checkpoint c2]\nimage=disk-1.qcow2\nparent=c1\n"
                         "[pending]\nop=merge\ntarget=c9\n"},
    {"merge with the active on it", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                                    "[checkpoint c1]\nimage=disk.qcow2\n"
                                    "[pending]\nop=merge\ntarget=c1\n"},
    {"merge with a file", "[chain]\nactive=disk-2.qcow2\nactive-parent=c2\nnext=3\n"
                          "[checkpoint c1]\nimage=disk.qcow2\n"
                          "[checkpoint c2]\nimage=disk-1.qcow2\nparent=c1\n"
                          "[pending]\nop=merge\ntarget=c1\nfile=../../victim\n"},
    {"not a key file", "this is not\n an ini file\n"},
};

static void
test_corrupt_records(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, VM_CHECKPOINT_RECORD, NULL);

    for (gsize i = 0; i < G_N_ELEMENTS(corrupt_cases); i++) {
        const CorruptCase *tc = &corrupt_cases[i];
        g_autoptr(GError) error = NULL;

        vm_test_write_file(path, tc->contents);
        g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(f->dir, &error);
        if (set != NULL)
            fail_msg("%s: a corrupt record loaded", tc->name);
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_FAILED))
            fail_msg("%s: expected VM_ERROR_FAILED, got %d: %s", tc->name, error->code,
                     error->message);
        if (strstr(error->message, path) == NULL)
            fail_msg("%s: '%s' does not name the file", tc->name, error->message);
    }
}

/* The near misses of the cases above load: the checks are not simply refusing everything. */
static const CorruptCase good_cases[] = {
    {"minimal", "[chain]\nactive=disk.qcow2\nnext=1\n"},
    {"chain", "[chain]\nactive=disk-2.qcow2\nactive-parent=c2\nnext=3\n"
              "[checkpoint c1]\nimage=disk.qcow2\n"
              "[checkpoint c2]\nimage=disk-1.qcow2\nparent=c1\n"},
    {"dots inside names", "[chain]\nactive=disk..1.qcow2\nactive-parent=c1\nnext=2\n"
                          "[checkpoint c1]\nimage=disk.qcow2.\n"},
    {"create journal", "[chain]\nactive=disk.qcow2\nnext=1\n"
                       "[pending]\nop=create\nfile=disk-1.qcow2\n"},
    {"restore journal", "[chain]\nactive=disk-1.qcow2\nactive-parent=c1\nnext=2\n"
                        "[checkpoint c1]\nimage=disk.qcow2\n"
                        "[pending]\nop=restore\nfile=disk-2.qcow2\ntarget=c1\n"},
    {"other groups ignored", "# a comment\n[chain]\nactive=disk.qcow2\nnext=4\n[extra]\nx=1\n"},
};

static void
test_good_records(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, VM_CHECKPOINT_RECORD, NULL);

    for (gsize i = 0; i < G_N_ELEMENTS(good_cases); i++) {
        g_autoptr(GError) error = NULL;

        vm_test_write_file(path, good_cases[i].contents);
        g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(f->dir, &error);
        if (set == NULL)
            fail_msg("%s: %s", good_cases[i].name, error->message);
    }
}

static void
test_unreadable_record(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, VM_CHECKPOINT_RECORD, NULL);
    g_autoptr(GError) error = NULL;

    /* A directory in the record's place: it exists but cannot be read as a file. */
    g_assert_no_errno(g_mkdir(path, 0700));
    assert_null(vm_checkpoint_set_load(f->dir, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, path);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_missing_record_is_fresh_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_begin_create_reserves_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_journal_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_journal_without_label, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_checkpoint_journal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_create, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ids_never_repeat, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_unknown_id, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restore_journal_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dependants_and_depth, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_reparents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_with_branches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_private_and_atomic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_into_missing_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_good_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_record, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
