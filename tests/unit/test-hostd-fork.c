/* hostd's fork without VMs (hostd-fork.c): sources and forks on libvirt's test driver, images as
 * the fake qemu-img's files, the live checkpoint as the fixture's fake. Checked: the fork's new
 * identity (record, keys, seed, domain), what it stands on, the pins it puts on its source, and
 * that a refused or failed fork leaves nothing behind. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-fork.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-util.h"

static GVariant *
fork_agent(HostdTestFixture *f, const HostdForkRequest *req, char **ret_checkpoint, GError **error)
{
    return hostd_test_sink(hostd_fork(f->ctx, req, ret_checkpoint, NULL, NULL, error));
}

static GVariant *
fork_ok(HostdTestFixture *f, const char *source, const char *name, const char *from,
        char **ret_checkpoint)
{
    g_autoptr(GError) error = NULL;
    HostdForkRequest req = {.name = name, .source = source, .checkpoint = from};
    GVariant *v = fork_agent(f, &req, ret_checkpoint, &error);

    if (v == NULL)
        fail_msg("fork %s %s: %s", source, name, error->message);
    return v;
}

static char *
read_agent_file(HostdTestFixture *f, const char *name, const char *file)
{
    g_autofree char *path = hostd_test_agent_file(f, name, file);

    return vm_test_read_file(path);
}

/* Whether the file holds @needle anywhere (ISO images store file data as it is). */
static gboolean
file_holds(const char *path, const char *needle)
{
    g_autofree char *data = NULL;
    gsize len = 0;

    if (!g_file_get_contents(path, &data, &len, NULL))
        fail_msg("cannot read %s", path);
    return memmem(data, len, needle, strlen(needle)) != NULL;
}

/* ---- a fork and its new identity ------------------------------------------------------------ */

/* A fork of an agent made of a warm pool's machine gets a domain of its own name, not the
 * machine's its source keeps. */
static void
test_fork_of_pool_machine(void **state)
{
    HostdTestFixture *f = *state;
    const char *machine = "pool.00000000000000f1";
    g_autofree char *dir = hostd_test_agent_as_pool_machine(f, "a1", machine);
    hostd_libvirt_alias_set(f->ctx->lv, "a1", machine);

    g_autoptr(GVariant) info = fork_ok(f, "a1", "b1", NULL, NULL);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "b1");
    assert_null(r->domain);
    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, "b1");
    assert_non_null(dom);
    assert_string_equal(hostd_test_domain_state(f, "b1"), "running");
    /* The source keeps its machine's domain. */
    g_autoptr(virDomain) source = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    assert_non_null(source);
    assert_string_equal(virDomainGetName(source), machine);
}

static void
test_fork_identity(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    const char *const allow[] = {"pypi.org", NULL};
    const char *const deny[] = {"upload.pypi.org", NULL};
    g_autofree char *src_key = hostd_test_agent_file(f, "a1", HOSTD_AGENT_KEY_PUB);

    /* The source's policies and its own key, which the fork must not get. */
    src->idle_pause_s = 300;
    src->idle_save_s = 1800;
    src->checkpoint_every_s = 1800;
    src->checkpoint_keep = 4;
    src->disk_limits[VM_DISK_WRITE_MIB] = 40;
    src->disk_limits[VM_DISK_READ_IOPS] = 400;
    assert_true(hostd_agent_record_save(src, &error));
    assert_true(hostd_egress_agent_init(f->ctx, src, allow, deny, &error));
    vm_test_write_file(src_key, "ssh-ed25519 AAAAsourcekey vmctl-a1\n");

    g_autofree char *taken = NULL;
    g_autoptr(GVariant) info = fork_ok(f, "a1", "b1", NULL, &taken);

    /* What `vmctl info b1` shows. */
    g_autofree char *name = hostd_test_dict_string(info, "name");
    g_autofree char *from = hostd_test_dict_string(info, "forked_from");
    g_autofree char *on = hostd_test_dict_string(info, "fork_checkpoint");
    g_autofree char *shown_state = hostd_test_dict_string(info, "state");
    g_autofree char *idle = hostd_test_dict_string(info, "idle");
    assert_string_equal(name, "b1");
    assert_string_equal(from, "a1");
    assert_string_equal(on, "c1");
    assert_string_equal(taken, "c1");
    assert_string_equal(shown_state, "running");
    assert_string_equal(idle, "pause after 300s, save after 1800s");

    /* The source got a checkpoint for it, and kept its state. */
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_int_equal(set->checkpoints->len, 1);
    const VmCheckpoint *c1 = vm_checkpoint_set_find(set, "c1");
    assert_string_equal(c1->label, "fork b1");
    assert_true(c1->automatic);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");

    /* A new identity: nothing that names the machine is the source's. */
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "b1");
    assert_string_equal(r->phase, HOSTD_PHASE_READY);
    /* its source's disk limits, in its definition too */
    assert_int_equal(r->disk_limits[VM_DISK_WRITE_MIB], 40);
    assert_int_equal(r->disk_limits[VM_DISK_READ_IOPS], 400);
    assert_int_equal(r->disk_limits[VM_DISK_READ_MIB], 0);
    g_autofree char *b1_xml_path = hostd_test_agent_file(f, "b1", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *b1_xml = vm_test_read_file(b1_xml_path);
    assert_non_null(strstr(b1_xml, "<write_bytes_sec>41943040</write_bytes_sec>"));
    assert_non_null(strstr(b1_xml, "<read_iops_sec>400</read_iops_sec>"));
    assert_string_equal(r->name, "b1");
    assert_string_not_equal(r->uuid, src->uuid);
    assert_string_not_equal(r->mac, src->mac);
    assert_true(g_str_has_prefix(r->mac, "52:54:00:"));
    assert_int_not_equal(r->ssh_port, 0);
    assert_int_not_equal(r->backend_port, 0);
    assert_int_not_equal(r->ssh_port, src->ssh_port);
    assert_int_not_equal(r->ssh_port, src->backend_port);
    assert_int_not_equal(r->backend_port, src->backend_port);
    assert_int_not_equal(r->backend_port, r->ssh_port);
    g_autofree char *instance = g_strdup_printf("vmctl-%s", r->uuid);
    assert_string_equal(r->instance_id, instance);
    assert_string_equal(r->forked_from, "a1");
    assert_string_equal(r->fork_checkpoint, "c1");
    g_autofree char *c1_image = vm_checkpoint_set_path(set, c1->image);
    assert_string_equal(r->fork_base, c1_image);
    assert_true(r->created > src->created);
    /* ... but the policies are a copy. */
    assert_int_equal(r->idle_pause_s, 300);
    assert_int_equal(r->idle_save_s, 1800);
    assert_int_equal(r->checkpoint_every_s, 1800);
    assert_int_equal(r->checkpoint_keep, 4);
    assert_int_equal(r->cpus, src->cpus);
    assert_int_equal(r->memory_mib, src->memory_mib);
    g_autofree char *src_egress = hostd_test_egress_text(f, "a1");
    g_autofree char *fork_egress = hostd_test_egress_text(f, "b1");
    assert_string_equal(fork_egress, "pypi.org|upload.pypi.org");
    assert_string_equal(fork_egress, src_egress);

    /* Its disk stands on the source's checkpoint. */
    g_autofree char *disk = hostd_test_agent_file(f, "b1", HOSTD_AGENT_DISK);
    g_autofree char *backing = hostd_test_image_backing(disk);
    assert_string_equal(backing, c1_image);

    /* Its own keys, host key pinned for both of its ports. */
    g_autofree char *key = read_agent_file(f, "b1", HOSTD_AGENT_KEY_PUB);
    g_autofree char *src_key_text = vm_test_read_file(src_key);
    assert_true(g_str_has_prefix(key, "ssh-ed25519 "));
    assert_string_not_equal(key, src_key_text);
    assert_non_null(strstr(key, "vmctl-b1"));
    g_autofree char *host_key = read_agent_file(f, "b1", HOSTD_AGENT_HOST_KEY_PUB);
    g_autofree char *known = read_agent_file(f, "b1", HOSTD_AGENT_KNOWN_HOSTS);
    g_autofree char *public_entry = g_strdup_printf("[127.0.0.1]:%u ", r->ssh_port);
    g_autofree char *backend_entry = g_strdup_printf("[127.0.0.1]:%u ", r->backend_port);
    assert_non_null(strstr(known, public_entry));
    assert_non_null(strstr(known, backend_entry));
    g_auto(GStrv) host_key_fields = g_strsplit(host_key, " ", 3);
    assert_true(g_strv_length(host_key_fields) >= 2);
    g_autofree char *pinned = g_strdup_printf("%s %s", host_key_fields[0], host_key_fields[1]);
    assert_non_null(strstr(known, pinned));

    /* Its seed: a new instance named b1, which drops the source's agent key at first boot and
     * does not run the template's first boot again. */
    g_autofree char *seed = hostd_test_agent_file(f, "b1", HOSTD_AGENT_SEED);
    g_autofree char *instance_line = g_strdup_printf("instance-id: \"%s\"", r->instance_id);
    assert_int_equal(vm_test_file_mode(seed), 0600);
    assert_true(file_holds(seed, instance_line));
    assert_true(file_holds(seed, "local-hostname: \"b1\""));
    assert_true(file_holds(seed, "vmctl-fork-keys"));
    assert_true(file_holds(seed, "vmctl-a1$"));
    assert_false(file_holds(seed, HOSTD_EGRESS_GUEST_PROXY));

    /* Its domain: its UUID, its MAC, its backend port, its machine-id on the command line. */
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "b1", NULL);
    char uuid[VIR_UUID_STRING_BUFLEN];
    assert_int_equal(virDomainGetUUIDString(dom, uuid), 0);
    assert_string_equal(uuid, r->uuid);
    g_autofree char *xml = read_agent_file(f, "b1", "domain.xml");
    g_autofree char *machine_id = hostd_agent_machine_id(r);
    g_autofree char *machine_arg = g_strdup_printf("systemd.machine_id=%s", machine_id);
    g_autofree char *mac_arg = g_strdup_printf("mac=%s", r->mac);
    g_autofree char *fwd_arg = g_strdup_printf("hostfwd=tcp:127.0.0.1:%u-:22", r->backend_port);
    assert_non_null(strstr(xml, machine_arg));
    assert_non_null(strstr(xml, mac_arg));
    assert_non_null(strstr(xml, fwd_arg));
    assert_non_null(strstr(xml, disk));
}

/* --from an existing checkpoint takes none; CPUs and memory may differ from the source's. */
static void
test_fork_from_checkpoint(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    g_autofree char *taken = NULL;

    hostd_test_checkpoint_n(f, "a1", 2);
    HostdForkRequest req = {.name = "b1", .source = "a1", .checkpoint = "c1", .memory_mib = 256};
    g_autoptr(GVariant) info = fork_agent(f, &req, &taken, &error);
    if (info == NULL)
        fail_msg("fork: %s", error->message);
    assert_string_equal(taken, "c1");
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "c1 c2");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    guint32 memory = 0;
    assert_true(g_variant_lookup(info, "memory_mib", "u", &memory));
    assert_int_equal(memory, 256);

    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "b1");
    g_autofree char *c1_image = hostd_test_agent_file(f, "a1", "disk.qcow2");
    g_autofree char *disk = hostd_test_agent_file(f, "b1", HOSTD_AGENT_DISK);
    g_autofree char *backing = hostd_test_image_backing(disk);
    assert_string_equal(r->fork_checkpoint, "c1");
    assert_string_equal(r->fork_base, c1_image);
    assert_string_equal(backing, c1_image);
    assert_int_equal(r->memory_mib, 256);

    /* From a running source without --from: a live checkpoint, the source keeps running. */
    g_autofree char *taken2 = NULL;
    g_autoptr(GVariant) info2 = fork_ok(f, "a1", "b2", NULL, &taken2);
    assert_string_equal(taken2, "c3");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    assert_string_equal(hostd_test_domain_state(f, "b2"), "running");
    g_autofree char *disk2 = hostd_test_agent_file(f, "b2", HOSTD_AGENT_DISK);
    g_autofree char *backing2 = hostd_test_image_backing(disk2);
    g_autofree char *c3_image = hostd_test_agent_file(f, "a1", "disk-2.qcow2");
    assert_string_equal(backing2, c3_image);
}

/* The names of the agents forked from @source, joined with ", ", or NULL when there are none. */
static char *
forks_of(HostdContext *ctx, const char *source)
{
    g_autoptr(GPtrArray) forks = hostd_agent_records_forked_from(ctx, source);
    if (forks->len == 0)
        return NULL;
    g_autoptr(GString) names = g_string_new(NULL);
    for (guint i = 0; i < forks->len; i++) {
        const HostdAgentRecord *r = forks->pdata[i];
        g_string_append_printf(names, "%s%s", i > 0 ? ", " : "", r->name);
    }
    return g_string_free(g_steal_pointer(&names), FALSE);
}

/* A fork pins what it reads: its checkpoint and every one below it, and its source. */
static void
test_fork_pins_source(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    /* c1 <- c2 <- c3 <- disk */
    hostd_test_checkpoint_n(f, "a1", 3);
    assert_null(forks_of(f->ctx, "a1"));
    g_autoptr(GVariant) b1 = fork_ok(f, "a1", "b1", "c2", NULL);
    g_autoptr(GVariant) b2 = fork_ok(f, "a1", "b2", "c2", NULL);
    g_autofree char *forks = forks_of(f->ctx, "a1");
    assert_string_equal(forks, "b1, b2");
    assert_null(forks_of(f->ctx, "b1"));

    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c2", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "remove the fork first");
    g_clear_error(&error);
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c1", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "stands on checkpoint c1");
    g_clear_error(&error);
    assert_false(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "b1, b2");
    g_clear_error(&error);
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "c1 c2 c3");
    g_autofree char *c2_image = hostd_test_agent_file(f, "a1", "disk-1.qcow2");
    assert_true(g_file_test(c2_image, G_FILE_TEST_EXISTS));

    /* Above the fork's checkpoint, and restores of the source, are free. */
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c3", &error))
        fail_msg("rm c3: %s", error->message);
    g_autoptr(GVariant) restored = hostd_test_sink(
        hostd_checkpoint_restore(f->ctx, "a1", "c1", FALSE, NULL, NULL, NULL, &error));
    if (restored == NULL)
        fail_msg("restore: %s", error->message);

    /* The pins go with the last fork. */
    assert_true(hostd_agent_rm(f->ctx, "b1", TRUE, &error));
    assert_false(hostd_checkpoint_rm(f->ctx, "a1", "c2", &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "b2");
    g_clear_error(&error);
    assert_true(hostd_agent_rm(f->ctx, "b2", TRUE, &error));
    assert_null(forks_of(f->ctx, "a1"));
    if (!hostd_checkpoint_rm(f->ctx, "a1", "c2", &error))
        fail_msg("rm c2: %s", error->message);
}

/* ---- refusals and failures ------------------------------------------------------------------ */

/* Nothing of the fork exists afterwards: no directory, no domain, and no checkpoint on the
 * source. */
static void
assert_no_fork(HostdTestFixture *f, const char *name, const char *source_ids)
{
    g_autofree char *dir = hostd_test_agent_file(f, name, "");
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");

    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    assert_string_equal(hostd_test_domain_state(f, name), "missing");
    assert_string_equal(ids, source_ids);
}

static void
test_fork_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) other = hostd_test_agent_new(f, "taken", HOSTD_TEST_STOPPED);
    g_autofree char *xml = read_agent_file(f, "taken", "domain.xml");
    static const struct {
        HostdForkRequest req;
        VmErrorCode code;
        const char *needle;
        const char *fork; /* what must not exist afterwards */
    } cases[] = {
        {{.name = "Bad Name", .source = "a1"}, VM_ERROR_INVALID_ARGUMENT, "Bad Name", "Bad Name"},
        {{.name = "../b1", .source = "a1"}, VM_ERROR_INVALID_ARGUMENT, NULL, "b1"},
        {{.name = "b1", .source = "-a1"}, VM_ERROR_INVALID_ARGUMENT, NULL, "b1"},
        {{.name = "a1", .source = "a1"}, VM_ERROR_EXISTS, "a1", NULL},
        {{.name = "taken", .source = "a1"}, VM_ERROR_EXISTS, "taken", NULL},
        {{.name = "ghost", .source = "a1"}, VM_ERROR_EXISTS, "ghost", NULL},
        {{.name = "b1", .source = "nobody"}, VM_ERROR_NOT_FOUND, "nobody", "b1"},
        {{.name = "b1", .source = "a1", .checkpoint = "c9"}, VM_ERROR_NOT_FOUND, "c9", "b1"},
        {{.name = "b1", .source = "a1", .cpus = 100000}, VM_ERROR_NO_RESOURCES, "CPUs", "b1"},
        {{.name = "b1", .source = "a1", .memory_mib = 64}, VM_ERROR_NO_RESOURCES, "64 MiB", "b1"},
    };

    /* A domain libvirt knows, without a record. */
    g_auto(GStrv) parts = g_strsplit(xml, "<name>taken</name>", 2);
    g_autofree char *ghost_xml = g_strjoinv("<name>ghost</name>", parts);
    g_autofree char *uuid_attr = g_strdup_printf("<uuid>%s</uuid>", other->uuid);
    g_auto(GStrv) parts2 = g_strsplit(ghost_xml, uuid_attr, 2);
    g_autofree char *ghost_xml2 = g_strjoinv("", parts2);
    g_autoptr(virDomain) ghost = virDomainDefineXML(f->ctx->lv->conn, ghost_xml2);
    if (ghost == NULL)
        fail_msg("ghost: %s", virGetLastErrorMessage());

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) case_error = NULL;
        g_autofree char *taken = NULL;
        g_autoptr(GVariant) v = fork_agent(f, &cases[i].req, &taken, &case_error);
        assert_null(v);
        assert_null(taken);
        hostd_test_assert_error(case_error, cases[i].code, cases[i].needle);
        if (cases[i].fork != NULL)
            assert_no_fork(f, cases[i].fork, "");
    }
    assert_int_equal(hostd_test_fake_snapshots(), 0);
    g_autofree char *ghost_dir = hostd_test_agent_file(f, "ghost", "");
    assert_false(g_file_test(ghost_dir, G_FILE_TEST_EXISTS));
    g_autoptr(HostdAgentRecord) still = hostd_test_agent_record(f, "taken");
    assert_null(still->forked_from);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

/* A fork that fails after its checkpoint was taken takes it away again, and rolls itself back;
 * a checkpoint the user named stays. */
static void
test_fork_failure_rolls_back(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    g_autofree char *fork_disk = hostd_test_agent_file(f, "b1", HOSTD_AGENT_DISK);

    hostd_test_qemu_img_fail(f, fork_disk);
    HostdForkRequest req = {.name = "b1", .source = "a1"};
    g_autofree char *taken = NULL;
    g_autoptr(GVariant) v = fork_agent(f, &req, &taken, &error);
    assert_null(v);
    assert_null(taken);
    hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
    g_clear_error(&error);
    /* The checkpoint was taken (live) and merged away again: the source is as before. */
    assert_int_equal(hostd_test_fake_snapshots(), 1);
    assert_no_fork(f, "b1", "");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    g_autofree char *backing = hostd_test_image_backing(active);
    assert_null(set->active_parent);
    assert_string_equal(backing, f->base_image);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");

    hostd_test_checkpoint_n(f, "a1", 1);
    HostdForkRequest from = {.name = "b1", .source = "a1", .checkpoint = "c2"};
    g_autoptr(GVariant) v2 = fork_agent(f, &from, NULL, &error);
    assert_null(v2);
    hostd_test_assert_error(error, VM_ERROR_IO, "injected failure");
    assert_no_fork(f, "b1", "c2");

    /* Once qemu-img works again, the name is free. */
    hostd_test_qemu_img_fail(f, NULL);
    g_autoptr(GVariant) v3 = fork_ok(f, "a1", "b1", "c2", NULL);
    assert_string_equal(hostd_test_domain_state(f, "b1"), "running");
}

/* ---- a full disk or an I/O error at each write ---------------------------------------------- */

static int
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Everything in the source's directory, each file's name and contents, sorted by name: what a
 * failed fork must leave as it was. */
static char *
dir_snapshot(HostdTestFixture *f, const char *name)
{
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GString) text = g_string_new(NULL);
    const char *entry;

    assert_non_null(d);
    while ((entry = g_dir_read_name(d)) != NULL)
        g_ptr_array_add(names, g_strdup(entry));
    g_ptr_array_sort(names, compare_names);
    for (guint i = 0; i < names->len; i++) {
        g_autofree char *path = g_build_filename(dir, names->pdata[i], NULL);
        g_autofree char *contents = NULL;

        if (g_file_test(path, G_FILE_TEST_IS_REGULAR) &&
            !g_file_get_contents(path, &contents, NULL, NULL))
            fail_msg("cannot read %s", path);
        g_string_append_printf(text, "== %s\n%s\n", (char *)names->pdata[i],
                               contents != NULL ? contents : "(not a file)");
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* What of the source a fork that took (and then dropped) a checkpoint may change: nothing a user
 * sees. Its record, its checkpoint ids and what its disk stands on, each as it was. */
static char *
source_state(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);
    g_autofree char *record = read_agent_file(f, name, HOSTD_AGENT_RECORD);
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, &error);
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, name);
    g_autofree char *ids = hostd_test_checkpoint_ids(f, name);
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    g_autofree char *backing = hostd_test_image_backing(active);

    if (r == NULL)
        fail_msg("the record of '%s' does not load: %s", name, error->message);
    assert_int_equal(set->pending, VM_CHECKPOINT_OP_NONE);
    return g_strdup_printf("%s|%s|%s|%s|%s", record, ids,
                           set->active_parent != NULL ? set->active_parent : "", backing,
                           hostd_test_domain_state(f, name));
}

/* No temporary file of an atomic write in the agents' directories. */
static void
assert_no_temp_files(HostdTestFixture *f)
{
    g_autoptr(GDir) d = g_dir_open(f->agents_dir, 0, NULL);
    const char *entry;

    assert_non_null(d);
    while ((entry = g_dir_read_name(d)) != NULL) {
        g_autofree char *sub = g_build_filename(f->agents_dir, entry, NULL);
        g_autoptr(GDir) sd = g_dir_open(sub, 0, NULL);
        const char *file;

        while (sd != NULL && (file = g_dir_read_name(sd)) != NULL) {
            const char *dot = strrchr(file, '.');
            if (dot != NULL && strlen(dot) == 7)
                fail_msg("a temporary file is left: %s/%s", entry, file);
        }
    }
}

/* Removes fork b1 made by a fork that worked, and the checkpoint it took of a1 (with @from
 * NULL), so that the next try starts from the same source. */
static void
fork_undo(HostdTestFixture *f, const char *from)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "b1");

    assert_string_equal(r->phase, HOSTD_PHASE_READY);
    assert_string_equal(hostd_test_domain_state(f, "b1"), "running");
    if (!hostd_agent_rm(f->ctx, "b1", TRUE, &error))
        fail_msg("rm b1: %s", error->message);
    if (from == NULL && !hostd_checkpoint_rm(f->ctx, "a1", r->fork_checkpoint, &error))
        fail_msg("rm the fork's checkpoint: %s", error->message);
}

/* Forks a1 into b1 (from checkpoint @from, or from a checkpoint the fork takes) with @errnum at
 * write @n and, with @stays, every write after it too (a disk that stays full). A fork that
 * fails fails with that error; a1 is then as it was (byte for byte with @from; a checkpoint the
 * fork took is dropped again, which a1's record shows only in its next id) and nothing of b1 is
 * left. A fork may also work when the write that failed was tried again. Returns whether the
 * fork reached write @n: once it does not, it must have worked. */
static gboolean
fork_fails_at(HostdTestFixture *f, const char *from, int errnum, guint n, gboolean stays)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *files_before = dir_snapshot(f, "a1");
    g_autofree char *before = source_state(f, "a1");
    g_autofree char *ids_before = hostd_test_checkpoint_ids(f, "a1");
    HostdForkRequest req = {.name = "b1", .source = "a1", .checkpoint = from};
    g_autofree char *taken = NULL;

    vm_file_write_fault(n, stays ? G_MAXUINT / 2 : 1, errnum);
    g_autoptr(GVariant) v = fork_agent(f, &req, &taken, &error);
    gboolean reached = vm_file_write_calls() >= n;
    vm_file_write_fault(0, 0, 0);

    if (v == NULL && !reached)
        fail_msg("fork failed without the injected error: %s", error->message);
    if (v != NULL) {
        fork_undo(f, from);
        return reached;
    }
    assert_null(taken);
    hostd_test_assert_error(error, VM_ERROR_IO, g_strerror(errnum));
    assert_no_fork(f, "b1", ids_before);
    g_autofree char *fork_grants =
        g_build_filename(f->ctx->config->state_dir, "secrets", "grants", "b1", NULL);
    assert_false(g_file_test(fork_grants, G_FILE_TEST_EXISTS));
    assert_no_temp_files(f);
    g_autofree char *after = source_state(f, "a1");
    assert_string_equal(after, before);
    if (from != NULL) {
        g_autofree char *files_after = dir_snapshot(f, "a1");
        assert_string_equal(files_after, files_before);
    }
    return TRUE;
}

/* ENOSPC and EIO at each write step of a fork (from then on too, with @stays): the fork fails
 * with the error, the source is untouched and no part of the fork is left; with no fault it
 * then works. */
static void
check_fork_each_write(HostdTestFixture *f, const char *from, gboolean stays)
{
    static const int errors[] = {ENOSPC, EIO};

    for (gsize e = 0; e < G_N_ELEMENTS(errors); e++) {
        guint n = 1;
        while (fork_fails_at(f, from, errors[e], n, stays))
            n++;
        /* A fork writes its record (twice), keys, SSH files, policy and definition. */
        assert_true(n > 6);
    }
}

static void
test_fork_full_from_checkpoint(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    const char *const allow[] = {"pypi.org", NULL};

    assert_true(hostd_egress_agent_init(f->ctx, src, allow, NULL, &error));
    hostd_test_checkpoint_n(f, "a1", 1);
    check_fork_each_write(f, "c1", FALSE);
    check_fork_each_write(f, "c1", TRUE);
}

static void
test_fork_full_taking_checkpoint(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);

    hostd_test_checkpoint_n(f, "a1", 1);
    check_fork_each_write(f, NULL, FALSE);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, hostd_test_setup, hostd_test_teardown)
        T(test_fork_identity),
        T(test_fork_of_pool_machine),
        T(test_fork_from_checkpoint),
        T(test_fork_pins_source),
        T(test_fork_refused),
        T(test_fork_failure_rolls_back),
        T(test_fork_full_from_checkpoint),
        T(test_fork_full_taking_checkpoint),
#undef T
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
