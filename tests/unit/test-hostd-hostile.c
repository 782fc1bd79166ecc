/* Guest-written image headers (hostd-checkpoint.c, hostd-fork.c): an agent's checkpoint image or
 * active overlay whose header names a host file as its backing file (as raw) or as an external
 * data file, as an escaped QEMU could write it. Checkpoint rm and merge, checkpoint and restore
 * of a stopped agent, fork and start-up repair must refuse it, naming the image, before any
 * qemu-img opens the chain: the fixture's qemu-img records every file it opens as the real one
 * would (tests/unit/test-qemu-img.c shows, with the real qemu-img, that reading one header alone
 * opens nothing else). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-checkpoint.h"
#include "hostd-fork.h"
#include "hostd-power.h"
#include "hostd-reconcile.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-domain-read.h"

#define HOST_BACKING   "/etc/shadow"
#define HOST_DATA_FILE "/etc/passwd"

typedef enum {
    HOSTILE_BACKING,   /* backing file a host file, as raw */
    HOSTILE_DATA_FILE, /* the right backing file, and a host file as external data file */
} Hostile;

/* The file of checkpoint @id of @name (NULL: its active overlay). Newly allocated. */
static char *
image_of(HostdTestFixture *f, const char *name, const char *id)
{
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, name);
    const VmCheckpoint *c = id != NULL ? vm_checkpoint_set_find(set, id) : NULL;

    if (id != NULL && c == NULL)
        fail_msg("%s has no checkpoint %s", name, id);
    return vm_checkpoint_set_path(set, c != NULL ? c->image : set->active);
}

/* Starts agent @name (without waiting for its guest), failing the test when it does not. */
static void
start_ok(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_start(f->ctx, name, FALSE, NULL, NULL, &error));
    if (v == NULL)
        fail_msg("start %s: %s", name, error->message);
}

/* Stops agent @name at once, failing the test when it does not. */
static void
stop_ok(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_stop(f->ctx, name, TRUE, 0, NULL, NULL, &error));
    if (v == NULL)
        fail_msg("stop %s: %s", name, error->message);
}

/* Rewrites the header of checkpoint @id's image of @name (NULL: the active overlay) as @how, and
 * starts qemu-img's records afresh. Returns the image's path. */
static char *
make_hostile(HostdTestFixture *f, const char *name, const char *id, Hostile how)
{
    g_autofree char *path = image_of(f, name, id);
    g_autofree char *backing = hostd_test_image_backing(path);
    g_autofree char *text =
        how == HOSTILE_BACKING
            ? g_strdup("fake-qcow2\nbacking=" HOST_BACKING "\nbacking-format=raw\n")
            : g_strdup_printf("fake-qcow2\nbacking=%s\ndata-file=" HOST_DATA_FILE "\n", backing);

    vm_test_write_file(path, text);
    /* What qemu-img did before the header was rewritten does not count. */
    g_autofree char *log = g_build_filename(f->dir, "qemu-img.log", NULL);
    g_autofree char *opened = g_build_filename(f->dir, "qemu-img.opened", NULL);
    vm_test_write_file(log, "");
    vm_test_write_file(opened, "");
    return g_steal_pointer(&path);
}

/* No qemu-img call opened a host file the headers name, and every call that named @image read
 * its header alone: `info` with -f qcow2 and -U, no chain. */
static void
assert_host_files_unopened(HostdTestFixture *f, const char *image)
{
    g_autofree char *opened = hostd_test_qemu_img_opened(f);
    g_autofree char *log = hostd_test_qemu_img_log(f);
    g_auto(GStrv) calls = g_strsplit(log, "\n", -1);

    if (strstr(opened, HOST_BACKING) != NULL || strstr(opened, HOST_DATA_FILE) != NULL)
        fail_msg("qemu-img opened a host file:\n%s", opened);
    for (char **call = calls; *call != NULL; call++) {
        if (strstr(*call, image) == NULL)
            continue;
        if (!g_str_has_prefix(*call, "info ") || strstr(*call, "-f qcow2") == NULL ||
            strstr(*call, "-U") == NULL || strstr(*call, "--backing-chain") != NULL)
            fail_msg("qemu-img ran on the hostile image: %s", *call);
    }
}

/* @error refuses @image, and says what its header names. */
static void
assert_refused(const GError *error, const char *image, Hostile how)
{
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, image);
    assert_non_null(strstr(error->message, how == HOSTILE_BACKING ? HOST_BACKING : HOST_DATA_FILE));
}

/* The detector itself: a qemu-img that reads the chain is seen opening the host file. */
static void
test_detector_sees_chain_reads(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *image = make_hostile(f, "a1", NULL, HOSTILE_DATA_FILE);
    const char *argv[] = {"qemu-img", "info", "--backing-chain", image, NULL};
    g_autofree char *opened = NULL;

    assert_true(g_spawn_sync(NULL, (char **)argv, NULL,
                             G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL, NULL, NULL, NULL,
                             NULL, NULL, NULL));
    opened = hostd_test_qemu_img_opened(f);
    assert_non_null(strstr(opened, HOST_DATA_FILE));
}

/* Removing a checkpoint rebases what stands on it (a stopped agent): refused when that image,
 * or one below it, names a file hostd did not put there. The record is unchanged. */
static void
check_rm_refused(HostdTestFixture *f, const char *hostile_id, const char *rm_id, Hostile how)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *image = make_hostile(f, "a1", hostile_id, how);

    assert_false(hostd_checkpoint_rm(f->ctx, "a1", rm_id, &error));
    assert_refused(error, image, how);
    assert_host_files_unopened(f, image);
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "c1 c2");
}

static void
test_rm_child_backing(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 2);
    check_rm_refused(f, "c2", "c1", HOSTILE_BACKING);
}

static void
test_rm_child_data_file(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 2);
    check_rm_refused(f, "c2", "c1", HOSTILE_DATA_FILE);
}

static void
test_rm_active_overlay(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 2);
    check_rm_refused(f, NULL, "c2", HOSTILE_BACKING);
}

/* An image below the one rebased is checked too. */
static void
test_rm_deeper_image(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "a1", 2);
    check_rm_refused(f, "c1", "c2", HOSTILE_DATA_FILE);
}

/* A stopped agent's checkpoint and a restore make a new overlay with qemu-img on the chain. */
static void
test_checkpoint_and_restore_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 2);
    g_autofree char *active = make_hostile(f, "a1", NULL, HOSTILE_BACKING);
    g_autofree char *warning = NULL;
    g_autoptr(GVariant) v = hostd_test_sink(
        hostd_checkpoint_create(f->ctx, "a1", NULL, FALSE, FALSE, &warning, &error));
    assert_null(v);
    assert_refused(error, active, HOSTILE_BACKING);
    g_clear_error(&error);

    g_autofree char *c1 = make_hostile(f, "a1", "c1", HOSTILE_DATA_FILE);
    g_autoptr(GVariant) restored = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c1", FALSE, NULL, NULL, NULL, &error));
    assert_null(restored);
    assert_refused(error, c1, HOSTILE_DATA_FILE);
    assert_host_files_unopened(f, active);
    assert_host_files_unopened(f, c1);
    /* Refused before anything: no undo checkpoint, no journal. */
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "c1 c2");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
}

/* A fork's disk is made on its source's checkpoint: a hostile one (or one under it) is refused,
 * and nothing of the fork is left. */
static void
test_fork_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 2);
    g_autofree char *c1 = make_hostile(f, "a1", "c1", HOSTILE_BACKING);
    HostdForkRequest req = {.name = "b1", .source = "a1", .checkpoint = "c2"};
    g_autoptr(GVariant) v = hostd_test_sink(hostd_fork(f->ctx, &req, NULL, NULL, NULL, &error));
    assert_null(v);
    assert_refused(error, c1, HOSTILE_BACKING);
    assert_host_files_unopened(f, c1);
    g_autofree char *dir = hostd_test_agent_file(f, "b1", "");
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    assert_string_equal(hostd_test_domain_state(f, "b1"), "missing");
}

/* A fork's own chain goes on in its source's images: a hostile source image under the fork's
 * checkpoint is refused when the fork's checkpoint is removed. */
static void
test_fork_chain_checked_through_source(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 2);
    HostdForkRequest req = {.name = "b1", .source = "a1", .checkpoint = "c2"};
    g_autoptr(GVariant) v = hostd_test_sink(hostd_fork(f->ctx, &req, NULL, NULL, NULL, &error));
    if (v == NULL)
        fail_msg("fork: %s", error->message);
    g_autoptr(HostdAgentRecord) b1 = hostd_test_agent_record(f, "b1");
    stop_ok(f, "b1");
    hostd_test_checkpoint_n(f, "b1", 1);
    g_autofree char *c1 = make_hostile(f, "a1", "c1", HOSTILE_DATA_FILE);
    assert_false(hostd_checkpoint_rm(f->ctx, "b1", "c1", &error));
    assert_refused(error, c1, HOSTILE_DATA_FILE);
    assert_host_files_unopened(f, c1);
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "b1");
    assert_string_equal(ids, "c1");
}

/* libvirt reads the headers of the disk's chain itself, as root, when it starts a domain: a
 * stopped agent's start and a saved agent's wake check them first as hostd_checkpoint_chain_check()
 * does, and refuse a hostile one with the domain left as it was; once the header is as hostd
 * wrote it, the agent starts. */
static void
check_boot_refused(HostdTestFixture *f, HostdTestState state, const char *id, Hostile how)
{
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", state);
    g_autoptr(GError) error = NULL;
    const char *before = state == HOSTD_TEST_SAVED ? "saved" : "stopped";

    if (id != NULL)
        hostd_test_checkpoint_n(f, "a1", 1);
    g_autofree char *path = image_of(f, "a1", id);
    g_autofree char *saved = vm_test_read_file(path);
    g_autofree char *image = make_hostile(f, "a1", id, how);

    if (state == HOSTD_TEST_SAVED) {
        assert_false(hostd_power_wake(f->ctx, "a1", &error));
    } else {
        g_autoptr(GVariant) v =
            hostd_test_sink(hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error));
        assert_null(v);
    }
    assert_refused(error, image, how);
    assert_host_files_unopened(f, image);
    assert_string_equal(hostd_test_domain_state(f, "a1"), before);
    g_clear_error(&error);

    vm_test_write_file(image, saved);
    if (state == HOSTD_TEST_SAVED) {
        if (!hostd_power_wake(f->ctx, "a1", &error))
            fail_msg("wake: %s", error->message);
    } else {
        start_ok(f, "a1");
    }
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

static void
test_start_refused(void **state)
{
    check_boot_refused(*state, HOSTD_TEST_STOPPED, NULL, HOSTILE_DATA_FILE);
}

static void
test_start_refused_deeper(void **state)
{
    check_boot_refused(*state, HOSTD_TEST_STOPPED, "c1", HOSTILE_BACKING);
}

static void
test_saved_wake_refused(void **state)
{
    check_boot_refused(*state, HOSTD_TEST_SAVED, NULL, HOSTILE_BACKING);
}

/* The chain libvirt's definition of @name names (the saved state's with @saved), top-down. */
static char *
named_chain(HostdTestFixture *f, const char *name, gboolean saved)
{
    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, name);
    assert_non_null(dom);
    g_autofree char *xml =
        saved ? hostd_test_fake_saved_xml() : virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(xml);
    g_auto(GStrv) chain = vm_domain_read_disk_chain(xml, NULL);
    assert_non_null(chain);
    return g_strjoinv("|", chain);
}

/* The chain hostd's record gives @name's active overlay, down to the template's base image. */
static char *
record_chain(HostdTestFixture *f, const char *name, const char *const *ids)
{
    g_autoptr(GPtrArray) files = g_ptr_array_new_with_free_func(g_free);
    g_ptr_array_add(files, image_of(f, name, NULL));
    for (const char *const *id = ids; *id != NULL; id++)
        g_ptr_array_add(files, image_of(f, name, *id));
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, name);
    g_autoptr(VmImage) image = hostd_agent_image(f->ctx, r, NULL);
    assert_non_null(image);
    g_ptr_array_add(files, g_strdup(image->disk_path));
    g_ptr_array_add(files, NULL);
    return g_strjoinv("|", (char **)files->pdata);
}

/* A definition as an older hostd made it: the disk's top image alone, its chain left to libvirt
 * to read from the headers. */
static char *
without_chain(const char *xml)
{
    g_autoptr(GRegex) re =
        g_regex_new("\\s*<backingStore.*</backingStore>", G_REGEX_DOTALL, 0, NULL);
    return g_regex_replace_literal(re, xml, -1, 0, "", 0, NULL);
}

/* libvirt is given the whole chain from hostd's records, so that it reads none of the headers a
 * guest wrote: a stopped agent's definition names it from the start and after each checkpoint;
 * one that does not (made by an older hostd, or left behind by a checkpoint removed while the
 * agent was stopped) names it again before libvirt starts the agent. */
static void
test_start_names_chain(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    const char *const none[] = {NULL};
    const char *const both[] = {"c2", "c1", NULL};
    const char *const c2[] = {"c2", NULL};

    g_autofree char *first = record_chain(f, "a1", none);
    g_autofree char *named_first = named_chain(f, "a1", FALSE);
    assert_string_equal(named_first, first);
    hostd_test_checkpoint_n(f, "a1", 2);
    g_autofree char *two = record_chain(f, "a1", both);
    g_autofree char *named_two = named_chain(f, "a1", FALSE);
    assert_string_equal(named_two, two);

    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, "a1");
    g_autofree char *xml = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    g_autofree char *old = without_chain(xml);
    g_autoptr(virDomain) redefined = virDomainDefineXML(f->ctx->lv->conn, old);
    assert_non_null(redefined);
    g_autofree char *top = named_chain(f, "a1", FALSE);
    g_autofree char *active = image_of(f, "a1", NULL);
    assert_string_equal(top, active);
    start_ok(f, "a1");
    g_autofree char *named_start = named_chain(f, "a1", FALSE);
    assert_string_equal(named_start, two);

    stop_ok(f, "a1");
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c1", &error))
        fail_msg("rm c1: %s", error->message);
    g_autofree char *one = record_chain(f, "a1", c2);
    start_ok(f, "a1");
    g_autofree char *named_again = named_chain(f, "a1", FALSE);
    assert_string_equal(named_again, one);
}

/* A fork's definition names its chain down through its source's checkpoint images, which the
 * source's guest wrote, to the template's base image. */
static void
test_fork_names_chain(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 2);
    HostdForkRequest req = {.name = "b1", .source = "a1", .checkpoint = "c2"};
    g_autoptr(GVariant) v = hostd_test_sink(hostd_fork(f->ctx, &req, NULL, NULL, NULL, &error));
    if (v == NULL)
        fail_msg("fork: %s", error->message);
    const char *const source[] = {"c2", "c1", NULL};
    g_autofree char *below = record_chain(f, "a1", source);
    g_autofree char *active = image_of(f, "b1", NULL);
    g_autofree char *a1_active = image_of(f, "a1", NULL);
    /* a1's chain with b1's first disk in place of a1's active overlay. */
    g_autofree char *expected = g_strconcat(active, below + strlen(a1_active), NULL);
    g_autofree char *named = named_chain(f, "b1", FALSE);
    assert_string_equal(named, expected);
}

/* The same for a saved agent: the wake gives the saved state's definition the chain it lacks
 * (a state saved by an older hostd), keeping its generation ID. */
static void
test_saved_wake_names_chain(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_SAVED);
    g_autoptr(GError) error = NULL;
    const char *const c1[] = {"c1", NULL};

    hostd_test_checkpoint_n(f, "a1", 1);
    g_autofree char *chain = record_chain(f, "a1", c1);
    g_autofree char *named = named_chain(f, "a1", TRUE);
    assert_string_equal(named, chain);

    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, "a1");
    g_autofree char *saved = hostd_test_fake_saved_xml();
    g_autofree char *old = without_chain(saved);
    assert_int_equal(virDomainManagedSaveDefineXML(dom, old, 0), 0);
    g_autofree char *top = named_chain(f, "a1", TRUE);
    g_autofree char *active = image_of(f, "a1", NULL);
    assert_string_equal(top, active);
    if (!hostd_power_wake(f->ctx, "a1", &error))
        fail_msg("wake: %s", error->message);
    g_autofree char *woken = named_chain(f, "a1", TRUE);
    assert_string_equal(woken, chain);
    g_autofree char *after = hostd_test_fake_saved_xml();
    g_autofree char *genid_before = vm_domain_read_genid(saved, NULL);
    g_autofree char *genid_after = vm_domain_read_genid(after, NULL);
    assert_string_equal(genid_after != NULL ? genid_after : "",
                        genid_before != NULL ? genid_before : "");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

/* Start-up finishing a merge hostd died in: the chain is walked one header at a time through the
 * agent's own images, and a header naming anything else is refused (a note of start-up); the
 * journal stays, and once the header is as hostd wrote it the same repair finishes the merge. */
static void
check_reconcile_merge_refused(HostdTestFixture *f, Hostile how)
{
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    hostd_test_checkpoint_n(f, "a1", 2);
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    g_autofree char *c2 = image_of(f, "a1", "c2");
    g_autofree char *saved = vm_test_read_file(c2);
    if (vm_checkpoint_set_begin_merge(set, "c1", &error) == NULL ||
        !vm_checkpoint_set_save(set, &error))
        fail_msg("journal: %s", error->message);
    g_autofree char *image = make_hostile(f, "a1", "c2", how);

    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    assert_true(hostd_reconcile(f->ctx, notes, &error));
    g_ptr_array_add(notes, NULL);
    g_autofree char *text = g_strjoinv("\n", (char **)notes->pdata);
    assert_non_null(strstr(text, image));
    assert_non_null(strstr(text, how == HOSTILE_BACKING ? HOST_BACKING : HOST_DATA_FILE));
    assert_host_files_unopened(f, image);
    g_autoptr(VmCheckpointSet) after = hostd_test_checkpoints(f, "a1");
    assert_int_equal(after->pending, VM_CHECKPOINT_OP_MERGE);

    vm_test_write_file(image, saved);
    g_autoptr(GPtrArray) notes2 = g_ptr_array_new_with_free_func(g_free);
    assert_true(hostd_reconcile(f->ctx, notes2, &error));
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "c2");
}

static void
test_reconcile_merge_backing(void **state)
{
    check_reconcile_merge_refused(*state, HOSTILE_BACKING);
}

static void
test_reconcile_merge_data_file(void **state)
{
    check_reconcile_merge_refused(*state, HOSTILE_DATA_FILE);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, hostd_test_setup, hostd_test_teardown)
        T(test_detector_sees_chain_reads),
        T(test_rm_child_backing),
        T(test_rm_child_data_file),
        T(test_rm_active_overlay),
        T(test_rm_deeper_image),
        T(test_start_refused),
        T(test_start_refused_deeper),
        T(test_saved_wake_refused),
        T(test_start_names_chain),
        T(test_fork_names_chain),
        T(test_saved_wake_names_chain),
        T(test_checkpoint_and_restore_refused),
        T(test_fork_refused),
        T(test_fork_chain_checked_through_source),
        T(test_reconcile_merge_backing),
        T(test_reconcile_merge_data_file),
#undef T
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
