/* hostd's checkpoints without VMs (hostd-checkpoint.c, hostd-checkpoint-files.c): agents on
 * libvirt's test driver, images as the fake qemu-img's files, QEMU's live snapshot, pull and
 * commit as the fixture's fakes. What a user sees is checked: the checkpoint's dictionary, the
 * record on disk, which files exist and what each stands on, which file the domain uses, the
 * error codes of refusals, and the notes of the start-up repair. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include <glib/gstdio.h>

#include "hostd-checkpoint-files.h"
#include "hostd-checkpoint.h"
#include "hostd-checkpoint-private.h"
#include "hostd-reconcile.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-domain-read.h"
#include "vm-util.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* The real free-space figures again after a test that set them. */
static int
space_teardown(void **state)
{
    hostd_checkpoint_test_space(0, 0);
    return hostd_test_teardown(state);
}

static gboolean
dict_bool(GVariant *dict, const char *key)
{
    gboolean value = FALSE;

    if (!g_variant_lookup(dict, key, "b", &value))
        fail_msg("no '%s' in %s", key, g_variant_print(dict, FALSE));
    return value;
}

/* Asks for a checkpoint of @name; returns its dictionary or NULL with @error set. */
static GVariant *
try_checkpoint(HostdTestFixture *f, const char *name, gboolean memory, GError **error)
{
    g_autofree char *warning = NULL;

    return hostd_test_sink(
        hostd_checkpoint_create(f->ctx, name, NULL, FALSE, memory, &warning, error));
}

/* Takes a checkpoint of @name that must succeed; returns its dictionary. */
static GVariant *
checkpoint(HostdTestFixture *f, const char *name, const char *label, gboolean memory,
           char **ret_warning)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *warning = NULL;
    GVariant *v = hostd_test_sink(
        hostd_checkpoint_create(f->ctx, name, label, FALSE, memory, &warning, &error));

    if (v == NULL)
        fail_msg("checkpoint of %s: %s", name, error->message);
    if (ret_warning != NULL)
        *ret_warning = g_steal_pointer(&warning);
    return v;
}

static char *
path_of(HostdTestFixture *f, const char *name, const char *file)
{
    return hostd_test_agent_file(f, name, file);
}

static gboolean
exists(HostdTestFixture *f, const char *name, const char *file)
{
    g_autofree char *path = path_of(f, name, file);

    return g_file_test(path, G_FILE_TEST_EXISTS);
}

/* What the agent's file @file stands on, as a file of the agent ("" for nothing, "BASE" for
 * the template's image). */
static char *
backing_of(HostdTestFixture *f, const char *name, const char *file)
{
    g_autofree char *path = path_of(f, name, file);
    g_autofree char *backing = hostd_test_image_backing(path);
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);

    if (backing == NULL)
        fail_msg("no file %s", path);
    if (g_strcmp0(backing, f->base_image) == 0)
        return g_strdup("BASE");
    if (g_str_has_prefix(backing, dir) && backing[strlen(dir)] == '/')
        return g_strdup(backing + strlen(dir) + 1);
    return g_steal_pointer(&backing);
}

/* The file the domain's persistent definition uses, as a file of the agent. */
static char *
domain_file(HostdTestFixture *f, const char *name)
{
    g_autofree char *disk = hostd_test_domain_disk(f, name, TRUE);

    return g_path_get_basename(disk);
}

static char *
ids(HostdTestFixture *f, const char *name)
{
    return hostd_test_checkpoint_ids(f, name);
}

static void
assert_ids(HostdTestFixture *f, const char *name, const char *expected)
{
    g_autofree char *got = ids(f, name);

    if (!g_str_equal(got, expected))
        fail_msg("checkpoints of %s: '%s', expected '%s'", name, got, expected);
}

static void
assert_backing(HostdTestFixture *f, const char *name, const char *file, const char *expected)
{
    g_autofree char *got = backing_of(f, name, file);

    if (!g_str_equal(got, expected))
        fail_msg("%s stands on '%s', expected '%s'", file, got, expected);
}

static void
write_record(HostdTestFixture *f, const char *name, const char *text)
{
    g_autofree char *path = path_of(f, name, VM_CHECKPOINT_RECORD);

    vm_test_write_file(path, text);
}

static char *
read_record(HostdTestFixture *f, const char *name)
{
    g_autofree char *path = path_of(f, name, VM_CHECKPOINT_RECORD);

    return g_file_test(path, G_FILE_TEST_EXISTS) ? vm_test_read_file(path) : g_strdup("");
}

static void
write_image(HostdTestFixture *f, const char *name, const char *file, const char *backing_file)
{
    g_autofree char *path = path_of(f, name, file);
    g_autofree char *backing =
        backing_file == NULL ? g_strdup(f->base_image) : path_of(f, name, backing_file);

    hostd_test_image_write(path, backing);
}

/* Redefines the domain of @r on @file, as libvirt holds it after a switch hostd did not record. */
static void
define_on(HostdTestFixture *f, const HostdAgentRecord *r, const char *file)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *xml = hostd_agent_domain_xml(f->ctx, r, NULL, file, &error);

    if (xml == NULL)
        fail_msg("domain XML: %s", error->message);
    g_autoptr(virDomain) dom = virDomainDefineXML(f->ctx->lv->conn, xml);
    if (dom == NULL)
        fail_msg("define: %s", virGetLastErrorMessage());
}

static virDomainPtr
lookup(HostdTestFixture *f, const char *name)
{
    virDomainPtr dom = hostd_libvirt_lookup(f->ctx->lv, name, NULL);

    if (dom == NULL)
        fail_msg("no domain %s", name);
    return dom;
}

/* Makes a record of @name in which fork @fork stands on @checkpoint. */
static void
make_fork_record(HostdTestFixture *f, const char *fork, const char *source, const char *id)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, fork, HOSTD_TEST_STOPPED);
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, source);
    const VmCheckpoint *c = vm_checkpoint_set_find(set, id);

    assert_non_null(c);
    r->forked_from = g_strdup(source);
    r->fork_checkpoint = g_strdup(id);
    r->fork_base = vm_checkpoint_set_path(set, c->image);
    if (!hostd_agent_record_save(r, &error))
        fail_msg("fork record: %s", error->message);
}

/* ---- create --------------------------------------------------------------------------------- */

/* A stopped agent: the frozen file becomes the checkpoint, a new overlay on it becomes the disk,
 * and the domain's definition (and hostd's copy of it) moves to it. */
static void
test_create_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *warning = NULL;
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", "before upgrade", FALSE, &warning);

    assert_null(warning);
    g_autofree char *id = hostd_test_dict_string(c1, "id");
    g_autofree char *label = hostd_test_dict_string(c1, "label");
    g_autofree char *kind = hostd_test_dict_string(c1, "kind");
    g_autofree char *parent = hostd_test_dict_string(c1, "parent");
    assert_string_equal(id, "c1");
    assert_string_equal(label, "before upgrade");
    assert_string_equal(kind, "disk");
    assert_null(parent);
    assert_false(dict_bool(c1, "automatic"));
    assert_true(dict_bool(c1, "quiesced")); /* nothing was running */
    assert_true(dict_bool(c1, "current"));

    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active, "disk-1.qcow2");
    assert_string_equal(set->active_parent, "c1");
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    assert_string_equal(vm_checkpoint_set_find(set, "c1")->image, "disk.qcow2");
    assert_backing(f, "a1", "disk-1.qcow2", "disk.qcow2");
    assert_backing(f, "a1", "disk.qcow2", "BASE");
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-1.qcow2");
    g_autofree char *saved_xml_path = path_of(f, "a1", "domain.xml");
    g_autofree char *saved_xml = vm_test_read_file(saved_xml_path);
    g_autofree char *overlay = path_of(f, "a1", "disk-1.qcow2");
    assert_non_null(strstr(saved_xml, overlay));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");

    /* The next one stands on the first; only the newest is current. */
    g_autoptr(GVariant) c2 = checkpoint(f, "a1", NULL, FALSE, NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) list = hostd_test_sink(hostd_checkpoint_list(f->ctx, "a1", &error));
    assert_non_null(list);
    assert_int_equal(g_variant_n_children(list), 2);
    g_autoptr(GVariant) first = g_variant_get_child_value(list, 0);
    g_autoptr(GVariant) second = g_variant_get_child_value(list, 1);
    g_autofree char *first_id = hostd_test_dict_string(first, "id");
    g_autofree char *second_id = hostd_test_dict_string(second, "id");
    g_autofree char *second_parent = hostd_test_dict_string(second, "parent");
    g_autofree char *second_label = hostd_test_dict_string(second, "label");
    assert_string_equal(first_id, "c1");
    assert_string_equal(second_id, "c2");
    assert_string_equal(second_parent, "c1");
    assert_null(second_label);
    assert_false(dict_bool(first, "current"));
    assert_true(dict_bool(second, "current"));
    assert_backing(f, "a1", "disk-2.qcow2", "disk-1.qcow2");
    g_autofree char *defined2 = domain_file(f, "a1");
    assert_string_equal(defined2, "disk-2.qcow2");
}

/* A running agent keeps running; the checkpoint says whether the guest's filesystems were frozen,
 * and warns when they were not. A paused guest writes nothing, so no freeze is tried. */
static void
test_create_live(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) p = hostd_test_agent_new(f, "p1", HOSTD_TEST_PAUSED);
    g_autofree char *warning = NULL;

    /* No guest agent answers: crash-consistent, and the user is told. */
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", NULL, FALSE, &warning);
    assert_non_null(warning);
    assert_non_null(strstr(warning, "crash-consistent"));
    assert_false(dict_bool(c1, "quiesced"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    /* The overlay was made ahead of the switch, without opening the disk QEMU writes. */
    g_autofree char *log = hostd_test_qemu_img_log(f);
    assert_non_null(strstr(log, "create -q -f qcow2 -F qcow2 -u -b"));
    assert_backing(f, "a1", "disk-1.qcow2", "disk.qcow2");

    assert_int_equal(hostd_test_fake_snapshots_unfrozen(), 1);

    /* With a guest agent, the switch happens frozen, and the guest is thawed right after it. */
    hostd_test_fake_guest_agent(TRUE);
    g_autofree char *warning2 = NULL;
    g_autoptr(GVariant) c2 = checkpoint(f, "a1", NULL, FALSE, &warning2);
    assert_null(warning2);
    assert_true(dict_bool(c2, "quiesced"));
    assert_int_equal(hostd_test_fake_snapshots_unfrozen(), 1);
    assert_false(hostd_test_fake_frozen());
    assert_backing(f, "a1", "disk-2.qcow2", "disk-1.qcow2");
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-2.qcow2");
    assert_int_equal(hostd_test_fake_snapshots(), 2);

    g_autofree char *warning3 = NULL;
    g_autoptr(GVariant) c3 = checkpoint(f, "p1", NULL, FALSE, &warning3);
    assert_null(warning3);
    assert_false(dict_bool(c3, "quiesced"));
    assert_string_equal(hostd_test_domain_state(f, "p1"), "paused");
}

/* A memory checkpoint keeps RAM in memory-N.save and counts it; a stopped agent has none to
 * keep, and is refused before anything changes. */
static void
test_create_memory(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) s = hostd_test_agent_new(f, "s1", HOSTD_TEST_STOPPED);
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", "mem", TRUE, NULL);
    g_autofree char *kind = hostd_test_dict_string(c1, "kind");
    guint64 bytes = 0;

    assert_string_equal(kind, "memory");
    assert_true(g_variant_lookup(c1, "bytes", "t", &bytes));
    assert_true(bytes > 0);
    assert_true(exists(f, "a1", "memory-1.save"));
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(vm_checkpoint_set_find(set, "c1")->memory, "memory-1.save");

    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) none = try_checkpoint(f, "s1", TRUE, &error);
    assert_null(none);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "not running");
    assert_false(exists(f, "s1", VM_CHECKPOINT_RECORD));
    assert_false(exists(f, "s1", "disk-1.qcow2"));
}

/* The host's free-space floor holds for every checkpoint (through hostd_checkpoint_create_locked(),
 * which the host's, the guest's, a restore's undo and the timer's all take): with the figures
 * set exactly, a checkpoint that would leave less than the floor is refused before anything
 * changes, one that leaves exactly the floor is made; a memory checkpoint counts the guest's
 * memory; the floor is the configured size or share. */
static void
test_free_floor(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    const guint64 tib = 1ULL << 40, gib = 1ULL << 30, mib = 1ULL << 20;
    /* The default floor on a 1 TiB filesystem: 2 GiB; a checkpoint needs 256 MiB above it. */
    const guint64 disk_need = 2 * gib + 256 * mib;
    const guint64 memory_need = disk_need + (guint64)r->memory_mib * mib;
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", NULL, FALSE, NULL);
    g_autofree char *before = read_record(f, "a1");

    hostd_checkpoint_test_space(disk_need - 1, tib);
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "floor of 2 GiB");
    }
    {
        /* A restore's undo checkpoint too: the restore is refused with nothing changed. */
        g_autoptr(GError) error = NULL;
        g_autofree char *undo = NULL;
        g_autoptr(GVariant) v = hostd_test_sink(
            hostd_checkpoint_restore(f->ctx, "a1", "c1", FALSE, &undo, NULL, NULL, &error));
        assert_null(v);
        assert_null(undo);
        hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "checkpoint-free-floor");
        assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    }
    hostd_checkpoint_test_space(memory_need - 1, tib);
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", TRUE, &error);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "guest's memory (128 MiB)");
    }
    g_autofree char *refused = read_record(f, "a1");
    assert_string_equal(refused, before);
    assert_ids(f, "a1", "c1");

    /* Exactly the floor left: made. */
    hostd_checkpoint_test_space(memory_need, tib);
    g_autoptr(GVariant) c2 = checkpoint(f, "a1", NULL, TRUE, NULL);
    hostd_checkpoint_test_space(disk_need, tib);
    g_autoptr(GVariant) c3 = checkpoint(f, "a1", NULL, FALSE, NULL);
    assert_ids(f, "a1", "c1 c2 c3");

    /* A share: 10% of 100 GiB is 10 GiB; a size: 3 GiB whatever the filesystem; none: 0. */
    f->ctx->config->checkpoint_free_floor = 0;
    f->ctx->config->checkpoint_free_floor_pct = 10;
    hostd_checkpoint_test_space(100 * gib / 100 * 10 + 256 * mib - 1, 100 * gib);
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "floor of 10 GiB");
    }
    f->ctx->config->checkpoint_free_floor = 3 * gib;
    f->ctx->config->checkpoint_free_floor_pct = 0;
    hostd_checkpoint_test_space(3 * gib + 256 * mib - 1, tib);
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "floor of 3 GiB");
    }
    f->ctx->config->checkpoint_free_floor = 0;
    hostd_checkpoint_test_space(256 * mib, tib);
    g_autoptr(GVariant) c4 = checkpoint(f, "a1", NULL, FALSE, NULL);
    assert_ids(f, "a1", "c1 c2 c3 c4");
}

/* A saved agent resumes from a state that names the disk it wrote to: after a checkpoint that
 * state must name the new overlay, or the wake would write into the checkpoint, and the chain
 * under it. */
static void
test_create_saved_repoints_state(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_SAVED);
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", NULL, FALSE, NULL);
    g_autofree char *saved = hostd_test_fake_saved_xml();
    g_autofree char *overlay = path_of(f, "a1", "disk-1.qcow2");
    g_autofree char *frozen = path_of(f, "a1", "disk.qcow2");

    assert_non_null(saved);
    /* The new overlay on top, the frozen image under it as a <backingStore> from hostd's record
     * (libvirt reads neither header), then the template's base image. */
    g_auto(GStrv) chain = vm_domain_read_disk_chain(saved, NULL);
    assert_non_null(chain);
    assert_int_equal(g_strv_length(chain), 3);
    assert_string_equal(chain[0], overlay);
    assert_string_equal(chain[1], frozen);
    assert_true(g_str_has_suffix(chain[2], "/base.qcow2"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "saved");
}

/* Refusals and failures leave the chain as it was: no journal, no new file, and the next
 * checkpoint gets the id this one would have had. */
static void
test_create_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", NULL, FALSE, NULL);
    g_autofree char *before = read_record(f, "a1");

    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = try_checkpoint(f, "nobody", FALSE, &error);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    }
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = try_checkpoint(f, "../a1", FALSE, &error);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, NULL);
    }
    {
        /* Less than 256 MiB free: refused before the journal. */
        g_autoptr(GError) error = NULL;
        g_setenv("HOSTD_TEST_RESERVE_BYTES", "18446744073709551615", TRUE);
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        g_unsetenv("HOSTD_TEST_RESERVE_BYTES");
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "256 MiB");
    }
    {
        g_autoptr(GError) error = NULL;
        hostd_test_qemu_img_fail(f, "create");
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        hostd_test_qemu_img_fail(f, NULL);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
    }
    g_autofree char *after = read_record(f, "a1");
    assert_string_equal(after, before);
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-1.qcow2");

    g_autoptr(GVariant) c2 = checkpoint(f, "a1", NULL, FALSE, NULL);
    g_autofree char *id = hostd_test_dict_string(c2, "id");
    assert_string_equal(id, "c2");

    /* A journal nobody repaired blocks every new operation. */
    write_record(f, "a1",
                 "[chain]\nactive=disk-2.qcow2\nactive-parent=c2\nnext=3\n"
                 "[checkpoint c1]\nimage=disk.qcow2\ncreated=1700000000\n"
                 "[checkpoint c2]\nimage=disk-1.qcow2\nparent=c1\ncreated=1700000001\n"
                 "[pending]\nop=create\nfile=disk-3.qcow2\n");
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
    assert_null(v);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "restart hostd");
}

static void
test_list(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) empty = hostd_test_sink(hostd_checkpoint_list(f->ctx, "a1", &error));

    assert_non_null(empty);
    assert_int_equal(g_variant_n_children(empty), 0);
    g_autoptr(GVariant) none = hostd_test_sink(hostd_checkpoint_list(f->ctx, "nobody", &error));
    assert_null(none);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    g_clear_error(&error);

    hostd_test_checkpoint_n(f, "a1", 3);
    g_autoptr(GVariant) list = hostd_test_sink(hostd_checkpoint_list(f->ctx, "a1", &error));
    assert_int_equal(g_variant_n_children(list), 3);
    for (gsize i = 0; i < 3; i++) {
        g_autoptr(GVariant) c = g_variant_get_child_value(list, i);
        g_autofree char *id = hostd_test_dict_string(c, "id");
        g_autofree char *expected = g_strdup_printf("c%zu", i + 1);
        guint64 bytes = 0;
        assert_string_equal(id, expected);
        assert_true(g_variant_lookup(c, "bytes", "t", &bytes));
        assert_true(bytes > 0);
    }
}

/* ---- rm ------------------------------------------------------------------------------------- */

static void
test_rm_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 3);
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c9", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "c9");
    assert_non_null(strstr(error->message, "a1"));
    g_clear_error(&error);
    assert_false(hostd_checkpoint_rm(f->ctx, "nobody", "c1", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    g_clear_error(&error);

    /* A fork reads c2 and everything below it. */
    make_fork_record(f, "f1", "a1", "c2");
    g_autofree char *before = read_record(f, "a1");
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c2", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "f1");
    g_clear_error(&error);
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c1", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "f1");
    g_clear_error(&error);
    g_autofree char *after = read_record(f, "a1");
    assert_string_equal(after, before);
    assert_true(exists(f, "a1", "disk.qcow2"));
    assert_true(exists(f, "a1", "disk-1.qcow2"));
    /* Above it is free. */
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c3", &error))
        fail_msg("rm c3: %s", error->message);
    assert_ids(f, "a1", "c1 c2");

    /* Two things stand on c1 once a restore branched from it. */
    g_autoptr(HostdAgentRecord) b = hostd_test_agent_new(f, "b1", HOSTD_TEST_STOPPED);
    hostd_test_checkpoint_n(f, "b1", 2);
    g_autoptr(GVariant) restored = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "b1", "c1", FALSE, NULL, NULL, NULL, &error));
    if (restored == NULL)
        fail_msg("restore: %s", error->message);
    assert_false(hostd_checkpoint_rm(f->ctx, "b1", "c1", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "stand on checkpoint c1");
}

/* On a stopped agent a removed checkpoint's data goes into what stood on it by a safe rebase,
 * and only then is its file deleted. */
static void
test_rm_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    /* c1 disk.qcow2 <- c2 disk-1 <- c3 disk-2 <- disk-3 */
    hostd_test_checkpoint_n(f, "a1", 3);

    /* The disk stands on c3. */
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c3", &error))
        fail_msg("rm c3: %s", error->message);
    assert_ids(f, "a1", "c1 c2");
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    assert_backing(f, "a1", "disk-3.qcow2", "disk-1.qcow2");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active_parent, "c2");

    /* A checkpoint stands on c1, which stands on the template's image. */
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c1", &error))
        fail_msg("rm c1: %s", error->message);
    assert_ids(f, "a1", "c2");
    assert_false(exists(f, "a1", "disk.qcow2"));
    assert_backing(f, "a1", "disk-1.qcow2", "BASE");
    g_autoptr(VmCheckpointSet) set2 = hostd_test_checkpoints(f, "a1");
    assert_null(vm_checkpoint_set_find(set2, "c2")->parent);
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-3.qcow2");

    /* A failed rebase removes nothing. */
    g_autofree char *before = read_record(f, "a1");
    hostd_test_qemu_img_fail(f, "rebase");
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c2", &error));
    hostd_test_qemu_img_fail(f, NULL);
    hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
    g_autofree char *after = read_record(f, "a1");
    assert_string_equal(after, before);
    assert_true(exists(f, "a1", "disk-1.qcow2"));
    assert_backing(f, "a1", "disk-3.qcow2", "disk-1.qcow2");
}

/* A leaf (a branch nobody stands on) is just deleted. */
static void
test_rm_leaf(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    g_autofree char *undo = NULL;

    /* c1 disk.qcow2 <- c2 disk-1 (undo, a leaf); disk-3 on c1 */
    hostd_test_checkpoint_n(f, "a1", 1);
    g_autoptr(GVariant) v = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c1", FALSE, &undo, NULL, NULL, &error));
    assert_non_null(v);
    assert_string_equal(undo, "c2");
    g_autofree char *log_before = hostd_test_qemu_img_log(f);
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c2", &error))
        fail_msg("rm c2: %s", error->message);
    g_autofree char *log_after = hostd_test_qemu_img_log(f);
    assert_string_equal(log_after, log_before);
    assert_ids(f, "a1", "c1");
    assert_false(exists(f, "a1", "disk-1.qcow2"));
    assert_backing(f, "a1", "disk-3.qcow2", "disk.qcow2");
}

/* On a running agent: a checkpoint the running disk stands on is pulled into it live; one whose
 * child the running disk reads through is committed down, and the child moves to its file. */
static void
test_rm_running(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    g_autofree char *c1_image = path_of(f, "a1", "disk.qcow2");
    g_autofree char *c2_image = path_of(f, "a1", "disk-1.qcow2");

    /* c1 disk.qcow2 <- c2 disk-1 <- c3 disk-2 <- disk-3 */
    hostd_test_checkpoint_n(f, "a1", 3);

    if (!hostd_checkpoint_rm(f->ctx, "a1", "c3", &error))
        fail_msg("rm c3: %s", error->message);
    g_autofree char *jobs = hostd_test_fake_block_jobs();
    g_autofree char *pull = g_strdup_printf("pull %s\n", c2_image);
    assert_string_equal(jobs, pull);
    assert_ids(f, "a1", "c1 c2");
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    assert_backing(f, "a1", "disk-3.qcow2", "disk-1.qcow2");

    if (!hostd_checkpoint_rm(f->ctx, "a1", "c1", &error))
        fail_msg("rm c1: %s", error->message);
    g_autofree char *jobs2 = hostd_test_fake_block_jobs();
    g_autofree char *commit = g_strdup_printf("%scommit %s %s\n", pull, c1_image, c2_image);
    assert_string_equal(jobs2, commit);
    assert_ids(f, "a1", "c2");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c2 = vm_checkpoint_set_find(set, "c2");
    assert_string_equal(c2->image, "disk.qcow2");
    assert_null(c2->parent);
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    assert_false(exists(f, "a1", "disk-1.qcow2"));
    assert_backing(f, "a1", "disk-3.qcow2", "disk.qcow2");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

/* ---- restore -------------------------------------------------------------------------------- */

static void
test_restore(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    g_autofree char *undo = NULL;

    hostd_test_checkpoint_n(f, "a1", 1);
    g_autofree char *before = read_record(f, "a1");
    g_autoptr(GVariant) none = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c7", FALSE, &undo, NULL, NULL, &error));
    assert_null(none);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "c7");
    g_clear_error(&error);
    g_autofree char *after = read_record(f, "a1");
    assert_string_equal(after, before);
    assert_null(undo);

    /* The undo checkpoint c2 freezes disk-1 and puts disk-2 on it; the restore puts disk-3 on
     * c1 and throws disk-2 away. */
    g_autoptr(GVariant) info = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c1", FALSE, &undo, NULL, NULL, &error));
    if (info == NULL)
        fail_msg("restore: %s", error->message);
    assert_string_equal(undo, "c2");
    g_autofree char *info_state = hostd_test_dict_string(info, "state");
    assert_string_equal(info_state, "running");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");

    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c2 = vm_checkpoint_set_find(set, "c2");
    assert_string_equal(c2->label, "before restore to c1");
    assert_true(c2->automatic);
    assert_string_equal(c2->image, "disk-1.qcow2");
    assert_string_equal(set->active, "disk-3.qcow2");
    assert_string_equal(set->active_parent, "c1");
    assert_backing(f, "a1", "disk-3.qcow2", "disk.qcow2");
    /* The undo checkpoint's overlay was thrown away with the state it held no part of. */
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-3.qcow2");
    g_autofree char *live = hostd_test_domain_disk(f, "a1", FALSE);
    g_autofree char *overlay = path_of(f, "a1", "disk-3.qcow2");
    assert_string_equal(live, overlay);

    /* And back: the undo works the same way. */
    g_autofree char *undo2 = NULL;
    g_autoptr(GVariant) back = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c2", FALSE, &undo2, NULL, NULL, &error));
    if (back == NULL)
        fail_msg("restore: %s", error->message);
    g_autoptr(VmCheckpointSet) set2 = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set2->active_parent, "c2");
    assert_backing(f, "a1", set2->active, "disk-1.qcow2");
}

static void
progress_collect(const char *message, double fraction, gpointer data)
{
    (void)fraction;
    g_string_append_printf(data, "%s\n", message);
}

/* A memory checkpoint whose saved state does not load costs the processes, never the disk: the
 * agent boots from the restored overlay, and the restore says so. */
static void
test_restore_memory_unloadable(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    g_autoptr(GString) progress = g_string_new(NULL);
    g_autoptr(GVariant) c1 = checkpoint(f, "a1", NULL, TRUE, NULL);

    g_autoptr(GVariant) info = hostd_test_sink(hostd_checkpoint_restore(
        f->ctx, "a1", "c1", FALSE, NULL, progress_collect, progress, &error));
    if (info == NULL)
        fail_msg("restore: %s", error->message);
    assert_non_null(strstr(progress->str, "the saved memory did not load"));
    assert_non_null(strstr(progress->str, "booting"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active_parent, "c1");
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, set->active);
    assert_backing(f, "a1", set->active, "disk.qcow2");
}

/* ---- start-up repair ------------------------------------------------------------------------ */

/* The record as hostd left it after c1 on a stopped agent (disk.qcow2 <- disk-1.qcow2), with
 * @pending appended as a journal. */
static HostdAgentRecord *
journaled_agent(HostdTestFixture *f, HostdTestState state, const char *pending)
{
    HostdAgentRecord *r = hostd_test_agent_new(f, "a1", state);

    hostd_test_checkpoint_n(f, "a1", 1);
    g_autofree char *record = read_record(f, "a1");
    g_autofree char *text = g_strconcat(record, "\n[pending]\n", pending, NULL);
    write_record(f, "a1", text);
    return r;
}

static GPtrArray *
reconcile(HostdTestFixture *f, const HostdAgentRecord *r)
{
    g_autoptr(GError) error = NULL;
    GPtrArray *notes = g_ptr_array_new_with_free_func(g_free);

    if (!hostd_checkpoint_reconcile(f->ctx, r, notes, &error))
        fail_msg("reconcile: %s", error->message);
    return notes;
}

static void
assert_one_note(GPtrArray *notes, const char *needle)
{
    if (notes->len != 1)
        fail_msg("%u notes, expected one saying '%s'", notes->len, needle);
    if (strstr(notes->pdata[0], needle) == NULL)
        fail_msg("note '%s' does not say '%s'", (char *)notes->pdata[0], needle);
}

static void
assert_no_journal(HostdTestFixture *f)
{
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");

    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    g_autofree char *record = read_record(f, "a1");
    assert_null(strstr(record, "[pending]"));
}

/* A checkpoint journaled but never switched to: rolled back at start-up, through hostd's
 * start-up pass. */
static void
test_reconcile_create_rolled_back(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = journaled_agent(
        f, HOSTD_TEST_STOPPED, "op=create\nfile=disk-2.qcow2\nlabel=lost\nautomatic=false\n");
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;

    write_image(f, "a1", "disk-2.qcow2", "disk-1.qcow2");
    if (!hostd_reconcile(f->ctx, notes, &error))
        fail_msg("reconcile: %s", error->message);
    gboolean noted = FALSE;
    for (guint i = 0; i < notes->len; i++)
        noted |= g_str_equal(notes->pdata[i], "agent 'a1': rolled back an unfinished checkpoint");
    assert_true(noted);
    assert_no_journal(f);
    assert_ids(f, "a1", "c1");
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active, "disk-1.qcow2");
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-1.qcow2");

    /* The id is not used up. */
    g_autoptr(GVariant) c = checkpoint(f, "a1", NULL, FALSE, NULL);
    g_autofree char *id = hostd_test_dict_string(c, "id");
    assert_string_equal(id, "c2");
}

/* libvirt already uses the journaled overlay: the checkpoint is finished, and since nobody knows
 * whether the guest was frozen, it says crash-consistent. */
static void
test_reconcile_create_finished(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = journaled_agent(
        f, HOSTD_TEST_STOPPED, "op=create\nfile=disk-2.qcow2\nlabel=kept\nautomatic=false\n");

    write_image(f, "a1", "disk-2.qcow2", "disk-1.qcow2");
    define_on(f, r, "disk-2.qcow2");
    g_autoptr(GPtrArray) notes = reconcile(f, r);
    assert_one_note(notes, "finished an interrupted checkpoint");
    assert_no_journal(f);
    assert_ids(f, "a1", "c1 c2");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c2 = vm_checkpoint_set_find(set, "c2");
    assert_string_equal(c2->label, "kept");
    assert_string_equal(c2->image, "disk-1.qcow2");
    assert_false(c2->quiesced);
    assert_string_equal(set->active, "disk-2.qcow2");
    assert_string_equal(set->active_parent, "c2");
    g_autofree char *saved_path = path_of(f, "a1", "domain.xml");
    g_autofree char *saved = vm_test_read_file(saved_path);
    g_autofree char *overlay = path_of(f, "a1", "disk-2.qcow2");
    assert_non_null(strstr(saved, overlay));
}

/* A memory checkpoint that never switched leaves neither its overlay nor its RAM file. */
static void
test_reconcile_memory_rolled_back(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        journaled_agent(f, HOSTD_TEST_RUNNING,
                        "op=create\nfile=disk-2.qcow2\nmemory=memory-2.save\nautomatic=false\n");
    g_autofree char *memory = path_of(f, "a1", "memory-2.save");

    write_image(f, "a1", "disk-2.qcow2", "disk-1.qcow2");
    vm_test_write_file(memory, "partial RAM\n");
    g_autoptr(GPtrArray) notes = reconcile(f, r);
    assert_one_note(notes, "rolled back an unfinished checkpoint");
    assert_no_journal(f);
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    assert_false(exists(f, "a1", "memory-2.save"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

static void
test_reconcile_restore(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        journaled_agent(f, HOSTD_TEST_STOPPED, "op=restore\nfile=disk-2.qcow2\ntarget=c1\n");

    /* Not switched: the new overlay goes, the agent keeps its disk. */
    write_image(f, "a1", "disk-2.qcow2", "disk.qcow2");
    g_autoptr(GPtrArray) notes = reconcile(f, r);
    assert_one_note(notes, "rolled back an unfinished restore");
    assert_no_journal(f);
    assert_false(exists(f, "a1", "disk-2.qcow2"));
    assert_true(exists(f, "a1", "disk-1.qcow2"));
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active, "disk-1.qcow2");

    /* Switched (the domain was defined on the new overlay): finished, the old disk goes. */
    g_autofree char *record = read_record(f, "a1");
    g_autofree char *text =
        g_strconcat(record, "\n[pending]\nop=restore\nfile=disk-2.qcow2\ntarget=c1\n", NULL);
    write_record(f, "a1", text);
    write_image(f, "a1", "disk-2.qcow2", "disk.qcow2");
    define_on(f, r, "disk-2.qcow2");
    g_autoptr(GPtrArray) notes2 = reconcile(f, r);
    assert_one_note(notes2, "finished an interrupted restore");
    assert_no_journal(f);
    assert_false(exists(f, "a1", "disk-1.qcow2"));
    g_autoptr(VmCheckpointSet) set2 = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set2->active, "disk-2.qcow2");
    assert_string_equal(set2->active_parent, "c1");
    assert_ids(f, "a1", "c1");
}

/* A merge (c1 committed into... its child c2 moving to c1's file) that hostd died in: start-up
 * always finishes it, whatever point it reached. */
static HostdAgentRecord *
merge_journaled(HostdTestFixture *f, HostdTestState state)
{
    HostdAgentRecord *r = hostd_test_agent_new(f, "a1", state);

    /* c1 disk.qcow2 <- c2 disk-1 <- disk-2 */
    hostd_test_checkpoint_n(f, "a1", 2);
    g_autofree char *record = read_record(f, "a1");
    g_autofree char *text = g_strconcat(record, "\n[pending]\nop=merge\ntarget=c1\n", NULL);
    write_record(f, "a1", text);
    return r;
}

static void
assert_merged(HostdTestFixture *f, const char *child_image)
{
    assert_no_journal(f);
    assert_ids(f, "a1", "c2");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c2 = vm_checkpoint_set_find(set, "c2");
    assert_string_equal(c2->image, child_image);
    assert_null(c2->parent);
    assert_string_equal(set->active, "disk-2.qcow2");
    assert_string_equal(set->active_parent, "c2");
}

/* Stopped, the child still in the chain: the child gets c1's data by a safe rebase. */
static void
test_reconcile_merge_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = merge_journaled(f, HOSTD_TEST_STOPPED);
    g_autoptr(GPtrArray) notes = reconcile(f, r);

    assert_one_note(notes, "finished an interrupted merge");
    assert_merged(f, "disk-1.qcow2");
    assert_backing(f, "a1", "disk-1.qcow2", "BASE");
    assert_false(exists(f, "a1", "disk.qcow2"));
}

/* The commit finished before hostd died (the child's file left the chain): only the record is
 * left to do. */
static void
test_reconcile_merge_committed(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = merge_journaled(f, HOSTD_TEST_STOPPED);

    write_image(f, "a1", "disk-2.qcow2", "disk.qcow2");
    g_autoptr(GPtrArray) notes = reconcile(f, r);
    assert_one_note(notes, "finished an interrupted merge");
    assert_merged(f, "disk.qcow2");
    assert_false(exists(f, "a1", "disk-1.qcow2"));
    assert_backing(f, "a1", "disk-2.qcow2", "disk.qcow2");
    g_autofree char *jobs = hostd_test_fake_block_jobs();
    assert_string_equal(jobs, "");
}

/* Running, the child still in the chain: the commit runs again. */
static void
test_reconcile_merge_running(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = merge_journaled(f, HOSTD_TEST_RUNNING);
    g_autoptr(GPtrArray) notes = reconcile(f, r);
    g_autofree char *c1_image = path_of(f, "a1", "disk.qcow2");
    g_autofree char *c2_image = path_of(f, "a1", "disk-1.qcow2");
    g_autofree char *commit = g_strdup_printf("commit %s %s\n", c1_image, c2_image);
    g_autofree char *jobs = hostd_test_fake_block_jobs();

    assert_one_note(notes, "finished an interrupted merge");
    assert_string_equal(jobs, commit);
    assert_merged(f, "disk.qcow2");
    assert_false(exists(f, "a1", "disk-1.qcow2"));
    assert_backing(f, "a1", "disk-2.qcow2", "disk.qcow2");
}

/* No journal, but the definition lost the last switch: redefined from the record. A domain
 * that agrees gets no note. */
static void
test_reconcile_redefines(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 1);
    g_autoptr(GPtrArray) quiet = reconcile(f, r);
    assert_int_equal(quiet->len, 0);

    define_on(f, r, "disk.qcow2");
    g_autoptr(GPtrArray) notes = reconcile(f, r);
    assert_one_note(notes, "redefined on its current overlay");
    g_autofree char *defined = domain_file(f, "a1");
    assert_string_equal(defined, "disk-1.qcow2");
}

static void
test_reconcile_corrupt(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;

    write_record(f, "a1", "[chain]\nactive=disk-1.qcow2\nactive-parent=c4\nnext=2\n");
    assert_false(hostd_checkpoint_reconcile(f->ctx, r, notes, &error));
    hostd_test_assert_error(error, VM_ERROR_FAILED, "corrupt");
    assert_int_equal(notes->len, 0);
}

/* ---- automatic checkpoints ------------------------------------------------------------------ */

static void
test_set_checkpoints(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    g_autoptr(GVariant) fast =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", FALSE, 4, 3, -1, -1, &error));
    assert_null(fast);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "at least 5");
    g_clear_error(&error);
    g_autoptr(GVariant) nobody = hostd_test_sink(
        hostd_agent_set_checkpoints(f->ctx, "nobody", FALSE, 60, 3, -1, -1, &error));
    assert_null(nobody);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    g_clear_error(&error);

    g_autoptr(GVariant) set =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", FALSE, 1800, 0, 24, 7, &error));
    g_autofree char *shown = hostd_test_dict_string(set, "checkpoints");
    assert_string_equal(shown, "every 1800s, keep 10 + 24 hourly + 7 daily");
    /* Negative: unchanged. */
    g_autoptr(GVariant) again =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", FALSE, 60, 2, -1, 0, &error));
    g_autofree char *shown2 = hostd_test_dict_string(again, "checkpoints");
    assert_string_equal(shown2, "every 60s, keep 2 + 24 hourly + 0 daily");
    g_autoptr(HostdAgentRecord) stored = hostd_test_agent_record(f, "a1");
    assert_int_equal(stored->checkpoint_every_s, 60);
    assert_int_equal(stored->checkpoint_keep, 2);
    assert_int_equal(stored->checkpoint_hourly, 24);
    assert_int_equal(stored->checkpoint_daily, 0);

    g_autoptr(GVariant) never =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", TRUE, 60, 2, -1, -1, &error));
    g_autofree char *shown3 = hostd_test_dict_string(never, "checkpoints");
    assert_string_equal(shown3, "never");
    g_autoptr(HostdAgentRecord) stored2 = hostd_test_agent_record(f, "a1");
    assert_int_equal(stored2->checkpoint_every_s, 0);
}

static void
periodic(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, name);
    g_autoptr(virDomain) dom = lookup(f, name);

    if (!hostd_checkpoint_periodic(f->ctx, r, dom, &error))
        fail_msg("periodic: %s", error->message);
}

/* One when due, none while not, none with the policy off. */
static void
test_periodic_due(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) off = hostd_test_agent_new(f, "off", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;

    periodic(f, "off");
    assert_false(exists(f, "off", VM_CHECKPOINT_RECORD));

    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", FALSE, 3600, 5, 0, 0, &error));
    assert_non_null(v);
    periodic(f, "a1"); /* created a day ago: due */
    assert_ids(f, "a1", "c1");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c1 = vm_checkpoint_set_find(set, "c1");
    assert_string_equal(c1->label, HOSTD_PERIODIC_LABEL);
    assert_true(c1->automatic);
    periodic(f, "a1"); /* an hour has not passed */
    assert_ids(f, "a1", "c1");
    /* A manual checkpoint does not count as the periodic one. */
    hostd_test_checkpoint_n(f, "a1", 1);
    periodic(f, "a1");
    assert_ids(f, "a1", "c1 c2");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

/* Thinning after a periodic checkpoint: the newest `keep` automatic ones stay; manual ones, the
 * before-save one and those a fork stands on stay whatever their age; the others are merged
 * away, and what stood on them then stands on what they stood on. */
static void
test_periodic_thins(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    gint64 now = g_get_real_time() / G_USEC_PER_SEC;
    static const struct {
        const char *label;
        gboolean automatic;
        gint64 age_s;
    } chain[] = {
        {HOSTD_PERIODIC_LABEL, TRUE, 6 * 3600},    /* c1: below the fork's */
        {"mine", FALSE, 5 * 3600},                 /* c2: manual */
        {HOSTD_PERIODIC_LABEL, TRUE, 4 * 3600},    /* c3: the fork's */
        {HOSTD_PERIODIC_LABEL, TRUE, 3 * 3600},    /* c4: goes */
        {HOSTD_BEFORE_SAVE_LABEL, TRUE, 2 * 3600}, /* c5: its own rule */
        {HOSTD_PERIODIC_LABEL, TRUE, 90 * 60},     /* c6: goes */
        {HOSTD_PERIODIC_LABEL, TRUE, 60 * 60},     /* c7: newest but one after c8 */
    };
    g_autoptr(GString) record = g_string_new(NULL);

    /* c1 on disk.qcow2, cN on disk-(N-1).qcow2, the disk disk-7.qcow2 */
    g_string_append_printf(record, "[chain]\nactive=disk-7.qcow2\nactive-parent=c7\nnext=8\n");
    for (guint i = 0; i < G_N_ELEMENTS(chain); i++) {
        g_autofree char *image =
            i == 0 ? g_strdup("disk.qcow2") : g_strdup_printf("disk-%u.qcow2", i);
        g_autofree char *below =
            i == 0 ? NULL
                   : (i == 1 ? g_strdup("disk.qcow2") : g_strdup_printf("disk-%u.qcow2", i - 1));
        g_string_append_printf(record, "[checkpoint c%u]\nimage=%s\n", i + 1, image);
        if (i > 0)
            g_string_append_printf(record, "parent=c%u\n", i);
        g_string_append_printf(record, "label=%s\ncreated=%" G_GINT64_FORMAT "\nautomatic=%s\n",
                               chain[i].label, now - chain[i].age_s,
                               chain[i].automatic ? "true" : "false");
        write_image(f, "a1", image, below);
    }
    write_image(f, "a1", "disk-7.qcow2", "disk-6.qcow2");
    write_record(f, "a1", record->str);
    define_on(f, r, "disk-7.qcow2");
    make_fork_record(f, "f1", "a1", "c3");
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", FALSE, 1800, 2, 0, 0, &error));
    assert_non_null(v);

    periodic(f, "a1");
    assert_ids(f, "a1", "c1 c2 c3 c5 c7 c8");
    assert_false(exists(f, "a1", "disk-3.qcow2"));
    assert_false(exists(f, "a1", "disk-5.qcow2"));
    assert_backing(f, "a1", "disk-4.qcow2", "disk-2.qcow2");
    assert_backing(f, "a1", "disk-6.qcow2", "disk-4.qcow2");
    assert_backing(f, "a1", "disk-8.qcow2", "disk-7.qcow2");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(vm_checkpoint_set_find(set, "c5")->parent, "c3");
    assert_string_equal(vm_checkpoint_set_find(set, "c7")->parent, "c5");
}

/* However often an agent is saved, exactly one before-save checkpoint exists: the newest. */
static void
test_before_save_keeps_one(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_PAUSED);
    g_autoptr(virDomain) dom = lookup(f, "a1");
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 1); /* c1: the user's */
    for (int i = 0; i < 3; i++) {
        if (!hostd_checkpoint_before_save(f->ctx, r, dom, &error))
            fail_msg("before save: %s", error->message);
    }
    assert_ids(f, "a1", "c1 c4");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c4 = vm_checkpoint_set_find(set, "c4");
    assert_string_equal(c4->label, HOSTD_BEFORE_SAVE_LABEL);
    assert_true(c4->automatic);
    assert_string_equal(c4->parent, "c1");
    assert_string_equal(set->active_parent, "c4");
    assert_backing(f, "a1", set->active, c4->image);
    assert_backing(f, "a1", c4->image, "disk.qcow2");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "paused");
}

/* ---- disk full: ENOSPC at each write ------------------------------------------------------ */

/* Fails when the agent's directory holds a temporary file of an atomic write ("<name>.XXXXXX" next
 * to a record): a failed write leaves nothing half-written behind. */
static void
assert_no_temp_files(HostdTestFixture *f, const char *name)
{
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    static const char *const records[] = {VM_CHECKPOINT_RECORD, HOSTD_AGENT_RECORD,
                                          HOSTD_AGENT_DOMAIN_XML};
    const char *entry;

    assert_non_null(d);
    while ((entry = g_dir_read_name(d)) != NULL) {
        for (gsize i = 0; i < G_N_ELEMENTS(records); i++) {
            if (g_str_has_prefix(entry, records[i]) && entry[strlen(records[i])] == '.')
                fail_msg("a temporary file is left: %s", entry);
        }
    }
}

/* The agent's state as reloaded from disk, after the start-up repair where a journal was left:
 * "<checkpoint ids>|<the active overlay's parent>", checked consistent on the way (no journal,
 * the definition on the active overlay, every image there, the record loads). */
static char *
reloaded_state(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmCheckpointSet) journaled = hostd_test_checkpoints(f, name);
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, &error);

    if (r == NULL)
        fail_msg("the agent record does not load: %s", error->message);
    if (journaled->pending != VM_CHECKPOINT_OP_NONE) {
        g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
        if (!hostd_checkpoint_reconcile(f->ctx, r, notes, &error))
            fail_msg("repair: %s", error->message);
    }
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, name);
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    g_autofree char *defined = domain_file(f, name);
    assert_string_equal(defined, set->active);
    assert_true(exists(f, name, set->active));
    for (guint i = 0; i < set->checkpoints->len; i++)
        assert_true(exists(f, name, ((VmCheckpoint *)set->checkpoints->pdata[i])->image));
    g_autofree char *ids = hostd_test_checkpoint_ids(f, name);
    return g_strdup_printf("%s|%s", ids, set->active_parent != NULL ? set->active_parent : "");
}

typedef enum {
    FULL_CHECKPOINT,
    FULL_RESTORE,
} FullOp;

/* Runs @op on agent a1 with the disk full at its @n-th atomic write; returns whether it worked and
 * sets @ret_reached to whether it made that many writes. */
static gboolean
full_at(HostdTestFixture *f, FullOp op, guint n, gboolean *ret_reached)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v = NULL;
    g_autofree char *warning = NULL;
    g_autofree char *undo = NULL;

    vm_file_write_fault(n, 1, ENOSPC);
    if (op == FULL_CHECKPOINT)
        v = hostd_test_sink(
            hostd_checkpoint_create(f->ctx, "a1", NULL, FALSE, FALSE, &warning, &error));
    else
        v = hostd_test_sink(
            hostd_checkpoint_restore(f->ctx, "a1", "c1", FALSE, &undo, NULL, NULL, &error));
    *ret_reached = vm_file_write_calls() >= n;
    vm_file_write_fault(0, 0, 0);
    if (v == NULL && *ret_reached)
        hostd_test_assert_error(error, VM_ERROR_IO, "No space left on device");
    else if (v == NULL)
        fail_msg("failed without the injected error: %s", error->message);
    return v != NULL;
}

/* ENOSPC at each write of a checkpoint (stopped and running agent) and of a restore: the agent is
 * left at its old state or its new one, never a third (a journal left behind is what start-up
 * repairs, and the repair gives one of the two), with no temporary file. A restore takes an undo
 * checkpoint first; a failure after it leaves the old disk with that checkpoint taken, which is
 * the old state plus a checkpoint of it. */
static void
check_full_each_write(HostdTestFixture *f, FullOp op)
{
    gboolean reached = TRUE;

    for (guint n = 1; reached; n++) {
        g_autofree char *before = reloaded_state(f, "a1");
        g_autofree char *before_ids = g_strndup(before, strcspn(before, "|"));
        g_autoptr(VmCheckpointSet) old_set = hostd_test_checkpoints(f, "a1");
        g_autofree char *next_id = g_strdup_printf("c%u", old_set->next_seq);
        gboolean ok = full_at(f, op, n, &reached);
        g_autofree char *after = reloaded_state(f, "a1");
        g_autofree char *new_checkpoint = g_strdup_printf("%s %s|%s", before_ids, next_id, next_id);
        g_autofree char *new_restore = g_strdup_printf("%s %s|c1", before_ids, next_id);
        const char *new_state = op == FULL_CHECKPOINT ? new_checkpoint : new_restore;

        assert_no_temp_files(f, "a1");
        if (ok) {
            assert_string_equal(after, new_state);
            continue;
        }
        if (!g_str_equal(after, before) && !g_str_equal(after, new_state) &&
            !(op == FULL_RESTORE && g_str_equal(after, new_checkpoint)))
            fail_msg("ENOSPC at write %u: state '%s', neither the old '%s' nor the new '%s'", n,
                     after, before, new_state);
        if (n > 20)
            fail_msg("still writing after %u writes", n);
    }
}

static void
test_full_checkpoint_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 1);
    check_full_each_write(f, FULL_CHECKPOINT);
}

static void
test_full_checkpoint_running(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);

    hostd_test_checkpoint_n(f, "a1", 1);
    check_full_each_write(f, FULL_CHECKPOINT);
}

static void
test_full_restore(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 1);
    check_full_each_write(f, FULL_RESTORE);
}

/* A checkpoint whose snapshot fails drops its journal; when clearing it fails once, the second try
 * clears it; when both fail, the error and hostd's log say so at once, and start-up repairs it. */
static void
test_abort_journal_cleared_or_reported(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    hostd_test_checkpoint_n(f, "a1", 1);
    g_autofree char *before = read_record(f, "a1");

    {
        /* Write 1 is the journal, 2 its clearing, 3 the retry. */
        g_autoptr(GError) error = NULL;
        hostd_test_qemu_img_fail(f, "create");
        vm_file_write_fault(2, 1, ENOSPC);
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        assert_int_equal(vm_file_write_calls(), 3);
        vm_file_write_fault(0, 0, 0);
        hostd_test_qemu_img_fail(f, NULL);
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
        assert_null(strstr(error->message, "journal"));
        assert_no_journal(f);
        assert_no_temp_files(f, "a1");
        g_autofree char *after = read_record(f, "a1");
        assert_string_equal(after, before);
        g_autofree char *log = hostd_test_log_text();
        assert_null(strstr(log, "journal"));
    }
    {
        g_autoptr(GError) error = NULL;
        hostd_test_qemu_img_fail(f, "create");
        vm_file_write_fault(2, 2, EIO);
        g_autoptr(GVariant) v = try_checkpoint(f, "a1", FALSE, &error);
        vm_file_write_fault(0, 0, 0);
        hostd_test_qemu_img_fail(f, NULL);
        assert_null(v);
        /* Both messages: what failed, and that the journal stays. */
        hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
        assert_non_null(strstr(error->message, "journal of agent 'a1' could not be cleared"));
        assert_non_null(strstr(error->message, "Input/output error"));
        g_autofree char *log = hostd_test_log_text();
        assert_non_null(strstr(log, "journal of agent 'a1' could not be cleared"));
        assert_no_temp_files(f, "a1");
        g_autoptr(VmCheckpointSet) stale = hostd_test_checkpoints(f, "a1");
        assert_int_equal(stale->pending, VM_CHECKPOINT_OP_CREATE);
    }
    /* The start-up repair rolls it back: the old state. */
    g_autofree char *repaired = reloaded_state(f, "a1");
    assert_string_equal(repaired, "c1|c1");
}

/* ---- files in checkpoints ------------------------------------------------------------------- */

static void
test_diff_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    static const struct {
        const char *name, *id, *other, *under;
        VmErrorCode code;
        const char *needle;
    } cases[] = {
        {"a1", "c1", NULL, "etc", VM_ERROR_INVALID_ARGUMENT, "etc"},
        {"a1", "c1", NULL, "/etc/../..", VM_ERROR_INVALID_ARGUMENT, ".."},
        {"nobody", "c1", NULL, NULL, VM_ERROR_NOT_FOUND, "nobody"},
        {"a1", "c9", NULL, NULL, VM_ERROR_NOT_FOUND, "c9"},
        {"a1", "c1", "c8", NULL, VM_ERROR_NOT_FOUND, "c8"},
    };

    hostd_test_checkpoint_n(f, "a1", 1);
    g_autofree char *before = read_record(f, "a1");
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        gboolean truncated = FALSE;
        g_autoptr(GVariant) v = hostd_test_sink(
            hostd_checkpoint_diff(f->ctx, cases[i].name, cases[i].id, cases[i].other,
                                  cases[i].under, &truncated, NULL, NULL, &error));
        assert_null(v);
        hostd_test_assert_error(error, cases[i].code, cases[i].needle);
    }
    g_autofree char *after = read_record(f, "a1");
    assert_string_equal(after, before);
}

/* A diff against the running state compares with a checkpoint of this instant, which goes again
 * also when the comparison fails. */
static void
test_diff_running_leaves_nothing(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    gboolean truncated = FALSE;
    g_autofree char *c1_image = path_of(f, "a1", "disk.qcow2");

    hostd_test_checkpoint_n(f, "a1", 1);
    /* A damaged state dir: the checkpoint's image is gone, so libguestfs is never started. */
    assert_int_equal(g_unlink(c1_image), 0);
    g_autoptr(GVariant) v = hostd_test_sink(
        hostd_checkpoint_diff(f->ctx, "a1", "c1", NULL, NULL, &truncated, NULL, NULL, &error));
    assert_null(v);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "disk.qcow2");
    assert_int_equal(hostd_test_fake_snapshots(), 2);
    assert_ids(f, "a1", "c1");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active_parent, "c1");
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    assert_false(exists(f, "a1", "disk-1.qcow2"));
    assert_backing(f, "a1", set->active, "disk.qcow2");
}

static void
test_restore_paths_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) s = hostd_test_agent_new(f, "s1", HOSTD_TEST_STOPPED);
    static const struct {
        const char *name, *id;
        const char *paths[3];
        VmErrorCode code;
        const char *needle;
    } cases[] = {
        {"a1", "c1", {"home/agent", NULL}, VM_ERROR_INVALID_ARGUMENT, "home/agent"},
        {"a1", "c1", {"/home/agent", "/home/../etc", NULL}, VM_ERROR_INVALID_ARGUMENT, ".."},
        {"a1", "c1", {"/", NULL}, VM_ERROR_INVALID_ARGUMENT, NULL},
        {"a1", "c5", {"/home", NULL}, VM_ERROR_NOT_FOUND, "c5"},
        {"s1", "c1", {"/home", NULL}, VM_ERROR_BAD_STATE, "not running"},
    };

    hostd_test_checkpoint_n(f, "a1", 1);
    hostd_test_checkpoint_n(f, "s1", 1);
    g_autofree char *before = read_record(f, "a1");
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *undo = NULL;
        g_autoptr(GVariant) v = hostd_test_sink(hostd_checkpoint_restore_paths(
            f->ctx, cases[i].name, cases[i].id, cases[i].paths, &undo, NULL, NULL, &error));
        assert_null(v);
        assert_null(undo);
        hostd_test_assert_error(error, cases[i].code, cases[i].needle);
    }
    g_autofree char *after = read_record(f, "a1");
    assert_string_equal(after, before);
    assert_ids(f, "s1", "c1");
}

/* A checkpoint merged away while the agent runs goes into its child's place only where the child
 * has nothing else standing on it: a branch a restore left on the child would go on naming the
 * child's old file, which the merge deletes. Refused, nothing changed. */
static void
test_rm_running_child_branched(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    g_autofree char *undo = NULL;

    hostd_test_checkpoint_n(f, "a1", 3);
    /* Back to c2: the old disk is kept as the undo checkpoint, a second branch on c2... */
    g_autoptr(GVariant) restored = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c2", FALSE, &undo, NULL, NULL, &error));
    if (restored == NULL)
        fail_msg("%s", error->message);
    g_autofree char *before = hostd_test_checkpoint_ids(f, "a1");
    /* ...so c1's child c2, which the running disk reads, has two images standing on it. */
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c1", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "remove the other branch first");
    g_autofree char *after = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(after, before);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, hostd_test_setup, hostd_test_teardown)
        T(test_create_stopped),
        T(test_create_live),
        T(test_create_memory),
        cmocka_unit_test_setup_teardown(test_free_floor, hostd_test_setup, space_teardown),
        T(test_create_saved_repoints_state),
        T(test_create_refused),
        T(test_list),
        T(test_rm_refused),
        T(test_rm_stopped),
        T(test_rm_leaf),
        T(test_rm_running),
        T(test_rm_running_child_branched),
        T(test_restore),
        T(test_restore_memory_unloadable),
        T(test_reconcile_create_rolled_back),
        T(test_reconcile_create_finished),
        T(test_reconcile_memory_rolled_back),
        T(test_reconcile_restore),
        T(test_reconcile_merge_stopped),
        T(test_reconcile_merge_committed),
        T(test_reconcile_merge_running),
        T(test_reconcile_redefines),
        T(test_reconcile_corrupt),
        T(test_set_checkpoints),
        T(test_periodic_due),
        T(test_periodic_thins),
        T(test_before_save_keeps_one),
        T(test_diff_refused),
        T(test_diff_running_leaves_nothing),
        T(test_restore_paths_refused),
        T(test_full_checkpoint_stopped),
        T(test_full_checkpoint_running),
        T(test_full_restore),
        T(test_abort_journal_cleared_or_reported),
#undef T
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
