/* vmctl set (hostd-resize.c) over the test driver: the sizes in the record and the persistent
 * definition, the lines that say when each applies, refusals that change nothing, relative
 * sizes, the disk grown live (a fake block resize: the test driver has none) or with qemu-img
 * (the fixture's fake), and the filesystem left for the next time the agent comes up when the
 * guest does not answer (the test driver has no guest; vm-lifecycle.sh drives a real one). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-checkpoint.h"
#include "hostd-fork.h"
#include "hostd-resize.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-spawn.h"

/* hostd's copy of the agent's persistent definition. */
static char *
domain_xml(HostdTestFixture *f, const char *name)
{
    g_autofree char *path = hostd_test_agent_file(f, name, HOSTD_AGENT_DOMAIN_XML);

    return vm_test_read_file(path);
}

/* Runs a request and returns its lines joined with "|"; fails the test on an error. */
static char *
set_ok(HostdTestFixture *f, const HostdResizeRequest *req)
{
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) changes = NULL;
    g_autoptr(GVariant) agent =
        hostd_test_sink(hostd_agent_set_resources(f->ctx, req, &changes, &error));

    vm_test_assert_no_error(error);
    assert_non_null(agent);
    assert_non_null(changes);
    return g_strjoinv("|", changes);
}

static void
test_target(void **state)
{
    (void)state;
    assert_int_equal(hostd_resize_target(8, 0, 0), 8);
    assert_int_equal(hostd_resize_target(8, 20, 0), 20);
    assert_int_equal(hostd_resize_target(8, 0, 5), 13);
    assert_int_equal(hostd_resize_target(8, 4, 0), 4);
    assert_int_equal(hostd_resize_target(G_MAXUINT - 1, 0, 5), G_MAXUINT);
}

/* A stopped agent: record and definition take the sizes, the overlay grows with qemu-img (as
 * the agent's reader, after its chain was checked), and the filesystem is left for its start. */
static void
test_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    const HostdResizeRequest req = {.name = "a1", .cpus = 2, .memory_mib = 256, .disk_add_gib = 2};

    g_autofree char *lines = set_ok(f, &req);
    assert_string_equal(lines, "disk 10G: grown; its root filesystem grows when the agent next "
                               "starts|cpus 2: applied; the agent starts with it|memory 256M: "
                               "applied; the agent starts with it");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_int_equal(r->cpus, 2);
    assert_int_equal(r->memory_mib, 256);
    assert_int_equal(r->disk_gib, 10);
    assert_true(r->grow_fs);
    g_autofree char *xml = domain_xml(f, "a1");
    assert_non_null(strstr(xml, "<vcpu>2</vcpu>"));
    assert_non_null(strstr(xml, "<memory unit='MiB'>256</memory>"));
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    g_autofree char *defined = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(strstr(defined, "<vcpu placement='static'>2</vcpu>"));
    assert_non_null(strstr(defined, "<memory unit='KiB'>262144</memory>"));
    g_autofree char *log = hostd_test_qemu_img_log(f);
    g_autofree char *disk = hostd_test_agent_file(f, "a1", HOSTD_AGENT_DISK);
    g_autofree char *resize = g_strdup_printf("resize -q -f qcow2 -- %s 10G", disk);
    assert_non_null(strstr(log, resize));
    /* Its chain was read before qemu-img opened it to write. */
    assert_true(strstr(log, "info") < strstr(log, "resize"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");
}

/* A running agent: the disk grows live, the guest does not answer here, so its filesystem is
 * left for the next time it comes up (said, and logged); CPUs and memory come with the next
 * start, since hostd's definition leaves no room to add them live. */
static void
test_running(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    const HostdResizeRequest req = {.name = "a1", .cpus_add = 1, .memory_mib = 192, .disk_gib = 9};

    g_autofree char *lines = set_ok(f, &req);
    assert_true(g_str_has_prefix(lines, "disk 9G: grown live; its root filesystem not yet ("));
    assert_non_null(strstr(lines, "): hostd grows it when the agent next comes up|cpus 2: at the "
                                  "next start (vmctl stop a1, then vmctl start a1)|memory 192M: "
                                  "at the next start (vmctl stop a1, then vmctl start a1)"));
    g_autofree char *jobs = hostd_test_fake_block_jobs();
    g_autofree char *want = g_strdup_printf("resize vda %" G_GUINT64_FORMAT "\n", (guint64)9 << 30);
    assert_string_equal(jobs, want);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_int_equal(r->cpus, 2);
    assert_int_equal(r->memory_mib, 192);
    assert_int_equal(r->disk_gib, 9);
    assert_true(r->grow_fs);
    g_autofree char *logged = hostd_test_log_text();
    assert_non_null(strstr(logged, "agent 'a1': disk grown to 9 GiB, root filesystem not"));
    /* The running VM keeps what it has; the next boot takes the new definition. */
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    assert_int_equal(virDomainGetVcpusFlags(dom, VIR_DOMAIN_AFFECT_LIVE), 1);
    g_autofree char *defined = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(strstr(defined, "<vcpu placement='static'>2</vcpu>"));
    g_autofree char *log = hostd_test_qemu_img_log(f);
    assert_null(log != NULL ? strstr(log, "resize") : NULL);
}

/* A saved agent's disk grows live after it is woken, as exec wakes it; sizes alone leave it
 * saved: its saved state holds the old ones until its next boot. */
static void
test_saved(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_SAVED);
    g_autoptr(HostdAgentRecord) r1 = hostd_test_agent_new(f, "a2", HOSTD_TEST_SAVED);
    const HostdResizeRequest sizes = {.name = "a1", .memory_add_mib = 128};
    const HostdResizeRequest disk = {.name = "a2", .disk_add_gib = 1};

    g_autofree char *lines = set_ok(f, &sizes);
    assert_string_equal(lines, "memory 256M: at the next start (vmctl stop a1, then vmctl start "
                               "a1)");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "saved");
    g_autofree char *grown = set_ok(f, &disk);
    assert_true(g_str_has_prefix(grown, "disk 9G: grown live"));
    assert_string_equal(hostd_test_domain_state(f, "a2"), "running");
}

/* A saved state keeps the sizes it was saved with: a checkpoint taken while the agent is saved
 * points its state at the new overlay with the saved CPU count and memory, not the record's new
 * ones, which libvirt would refuse to load it into. */
static void
test_saved_state_keeps_its_sizes(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_SAVED);
    g_autofree char *original = domain_xml(f, "a1");
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    const HostdResizeRequest req = {.name = "a1", .cpus = 2, .memory_mib = 512};
    g_autoptr(GError) error = NULL;

    /* The test driver keeps no saved definition: the fake holds the one it was saved with. */
    assert_int_equal(virDomainManagedSaveDefineXML(dom, original, 0), 0);
    g_autofree char *lines = set_ok(f, &req);
    g_autoptr(GVariant) checkpoint =
        hostd_test_sink(hostd_checkpoint_create(f->ctx, "a1", "after", FALSE, FALSE, NULL, &error));
    vm_test_assert_no_error(error);
    assert_non_null(checkpoint);
    g_autofree char *saved = hostd_test_fake_saved_xml();
    assert_non_null(saved);
    assert_non_null(strstr(saved, "<memory unit='MiB'>128</memory>"));
    assert_non_null(strstr(saved, "<vcpu>1</vcpu>"));
    assert_null(strstr(saved, "<memory unit='MiB'>512</memory>"));
    g_autofree char *defined = domain_xml(f, "a1");
    assert_non_null(strstr(defined, "<memory unit='MiB'>512</memory>"));
}

/* A live fork restores the source's memory, which still has the sizes it started with: after a
 * set that the running source has not taken yet, the fork boots cold instead (and gets the new
 * sizes), said in the log. */
static void
test_live_fork_after_set(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    const HostdResizeRequest req = {.name = "a1", .memory_mib = 256};
    const HostdForkRequest fork = {.name = "b1", .source = "a1", .wait = FALSE, .live = TRUE};
    g_autoptr(GError) error = NULL;
    g_autofree char *checkpoint = NULL;

    g_autofree char *lines = set_ok(f, &req);
    g_autoptr(GVariant) forked =
        hostd_test_sink(hostd_fork(f->ctx, &fork, &checkpoint, NULL, NULL, &error));
    vm_test_assert_no_error(error);
    assert_non_null(forked);
    g_autofree char *logged = hostd_test_log_text();
    assert_non_null(strstr(logged, "fork 'b1' of 'a1': booting cold: the source's CPUs or memory "
                                   "were changed since it started (vmctl set)"));
    g_autoptr(HostdAgentRecord) b1 = hostd_test_agent_record(f, "b1");
    assert_int_equal(b1->memory_mib, 256);
}

/* Refused before anything changes: nothing asked, both forms, a smaller disk, over the host's
 * CPUs, an unknown agent; the record, the definition and the image stay as they were. */
static void
test_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *record_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_RECORD);
    g_autofree char *record_before = vm_test_read_file(record_path);
    g_autofree char *xml_before = domain_xml(f, "a1");
    const struct {
        HostdResizeRequest req;
        VmErrorCode code;
        const char *needle;
    } cases[] = {
        {{.name = "a1"}, VM_ERROR_INVALID_ARGUMENT, "nothing to change"},
        {{.name = "a1", .cpus = 1, .cpus_add = 1}, VM_ERROR_INVALID_ARGUMENT, "not both"},
        {{.name = "a1", .disk_gib = 4}, VM_ERROR_INVALID_ARGUMENT, "a disk never shrinks"},
        {{.name = "a1", .cpus = 100000}, VM_ERROR_NO_RESOURCES, "--cpus 100000"},
        {{.name = "a1", .cpus = 1, .disk_gib = 20000}, VM_ERROR_NO_RESOURCES, "--disk 20000"},
        {{.name = "a1", .memory_mib = 64}, VM_ERROR_NO_RESOURCES, "--memory 64"},
        {{.name = "a1", .disk_add_gib = G_MAXUINT}, VM_ERROR_NO_RESOURCES, "--disk"},
        {{.name = "zz", .cpus = 1}, VM_ERROR_NOT_FOUND, NULL},
        {{.name = "../x", .cpus = 1}, VM_ERROR_INVALID_ARGUMENT, NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_auto(GStrv) changes = NULL;
        assert_null(hostd_agent_set_resources(f->ctx, &cases[i].req, &changes, &error));
        hostd_test_assert_error(error, cases[i].code, cases[i].needle);
        assert_null(changes);
    }
    g_autofree char *record_after = vm_test_read_file(record_path);
    g_autofree char *xml_after = domain_xml(f, "a1");
    assert_string_equal(record_after, record_before);
    assert_string_equal(xml_after, xml_before);
    g_autofree char *log = hostd_test_qemu_img_log(f);
    assert_null(log != NULL ? strstr(log, "resize") : NULL);
}

/* qemu-img fails: the record and the definition are put back, nothing half-changed. */
static void
test_qemu_img_fails(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *record_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_RECORD);
    g_autofree char *record_before = vm_test_read_file(record_path);
    g_autofree char *xml_before = domain_xml(f, "a1");
    const HostdResizeRequest req = {.name = "a1", .cpus = 2, .disk_gib = 12};
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) changes = NULL;

    hostd_test_qemu_img_fail(f, "resize");
    assert_null(hostd_agent_set_resources(f->ctx, &req, &changes, &error));
    hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
    g_autofree char *record_after = vm_test_read_file(record_path);
    g_autofree char *xml_after = domain_xml(f, "a1");
    assert_string_equal(record_after, record_before);
    assert_string_equal(xml_after, xml_before);
}

/* Asking for what the agent has says so, and changes nothing live. */
static void
test_unchanged(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r0 = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    const HostdResizeRequest req = {.name = "a1", .cpus = 1, .memory_mib = 128, .disk_gib = 8};

    g_autofree char *lines = set_ok(f, &req);
    assert_string_equal(lines, "disk 8G: unchanged|cpus 1: unchanged|memory 128M: unchanged");
    g_autofree char *jobs = hostd_test_fake_block_jobs();
    assert_string_equal(jobs, "");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_false(r->grow_fs);
}

/* The agent_up hook tries the grow left pending and keeps it pending while the guest does not
 * answer; an agent with none pending runs nothing. */
static void
test_up(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);

    hostd_agent_emit_up(f->ctx, r);
    g_autofree char *quiet = hostd_test_log_text();
    assert_null(strstr(quiet, "root filesystem"));
    r->grow_fs = TRUE;
    hostd_agent_emit_up(f->ctx, r);
    g_autofree char *logged = hostd_test_log_text();
    assert_non_null(strstr(logged, "agent 'a1': its root filesystem was not grown to its disk"));
    assert_true(r->grow_fs);
}

/* The guest's script is valid sh. */
static void
test_guest_script(void **state)
{
    const char *argv[] = {"sh", "-n", "-c", hostd_resize_guest_script(), NULL};
    g_autoptr(GError) error = NULL;

    (void)state;
    assert_true(vm_spawn_run(argv, NULL, NULL, &error));
    vm_test_assert_no_error(error);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_target),
        cmocka_unit_test(test_guest_script),
        cmocka_unit_test_setup_teardown(test_stopped, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_running, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_saved, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_saved_state_keeps_its_sizes, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_live_fork_after_set, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_refused, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_qemu_img_fails, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_unchanged, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_up, hostd_test_setup, hostd_test_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
