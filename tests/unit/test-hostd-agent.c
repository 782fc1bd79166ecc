/* The agent lifecycle and its components' hooks (hostd-agent.c, hostd-context.h): the order in
 * which a component sees an agent's life, and what a failing hook does to it. A recording
 * component is added after hostd's own, on libvirt's test driver (test-hostd-fixture.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-reconcile.h"
#include "test-common.h"
#include "test-hostd-fixture.h"

/* What the recording component saw, one word per hook ("creating:a1"), and which hook fails. */
static GString *seen;
static const char *fail_hook;

static gboolean
record_hook(const char *hook, const char *name, GError **error)
{
    g_string_append_printf(seen, "%s%s:%s", seen->len > 0 ? " " : "", hook, name);
    if (g_strcmp0(fail_hook, hook) == 0)
        return vm_throw(error, VM_ERROR_BAD_STATE, "the recorder refuses %s", hook);
    return TRUE;
}

static gboolean
rec_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl, GError **error)
{
    assert_non_null(tpl);
    return record_hook("creating", r->name, error);
}

static void
rec_seed(HostdContext *ctx, const HostdAgentRecord *r, VmSeedSpec *spec, GPtrArray *keep)
{
    record_hook("seed", r->name, NULL);
}

static void
rec_domain(HostdContext *ctx, const HostdAgentRecord *r, VmDomainSpec *spec, GPtrArray *keep)
{
    char *metadata = g_strdup("<recorder xmlns='https://vmctl.dev/xmlns/test'/>");

    /* What a hook points the spec at lives until the XML is built. */
    g_ptr_array_add(keep, metadata);
    spec->metadata_xml = metadata;
    record_hook("domain", r->name, NULL);
}

static gboolean
rec_starting(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    return record_hook("starting", r->name, error);
}

static gboolean
rec_ready(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    return record_hook("ready", r->name, error);
}

static gboolean
rec_removing(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    return record_hook("removing", r->name, error);
}

static void
rec_removed(HostdContext *ctx, const char *name)
{
    record_hook("removed", name, NULL);
}

static void
rec_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom, GPtrArray *notes)
{
    record_hook(dom != NULL ? "reconcile" : "reconcile-nodomain", r->name, NULL);
}

static const HostdComponent recorder = {
    .name = "recorder",
    .agent_creating = rec_creating,
    .agent_seed = rec_seed,
    .agent_domain = rec_domain,
    .agent_starting = rec_starting,
    .agent_ready = rec_ready,
    .agent_removing = rec_removing,
    .agent_removed = rec_removed,
    .agent_reconcile = rec_reconcile,
};

static int
setup(void **state)
{
    int rc = hostd_test_setup(state);
    HostdTestFixture *f = *state;

    seen = g_string_new(NULL);
    fail_hook = NULL;
    hostd_context_add_component(f->ctx, &recorder);
    return rc;
}

static int
teardown(void **state)
{
    g_string_free(seen, TRUE);
    seen = NULL;
    return hostd_test_teardown(state);
}

static GVariant *
new_agent(HostdTestFixture *f, const char *name, GError **error)
{
    HostdNewRequest req = {.name = name, .cpus = 1, .memory_mib = 128};

    return hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, error));
}

/* `new`: the component prepares before anything is made, fills its part of the seed and the
 * domain, and hears that the agent is ready last; its domain part is in the definition. */
static void
test_new_runs_hooks_in_order(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) info = new_agent(f, "a1", &error);
    g_autofree char *xml_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml = vm_test_read_file(xml_path);

    if (info == NULL)
        fail_msg("new: %s", error->message);
    assert_string_equal(seen->str, "creating:a1 seed:a1 domain:a1 ready:a1");
    assert_non_null(strstr(xml, "https://vmctl.dev/xmlns/test"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

/* A component that refuses at `new` leaves nothing: no record, no directory, no domain, and it
 * is told the agent is gone. */
static void
test_failing_hook_rolls_new_back(void **state)
{
    HostdTestFixture *f = *state;
    const char *hooks[] = {"creating", "ready"};

    for (gsize i = 0; i < G_N_ELEMENTS(hooks); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *dir = g_build_filename(f->agents_dir, "a1", NULL);

        g_string_truncate(seen, 0);
        fail_hook = hooks[i];
        g_autoptr(GVariant) info = new_agent(f, "a1", &error);
        assert_null(info);
        hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "the recorder refuses");
        assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
        assert_string_equal(hostd_test_domain_state(f, "a1"), "missing");
        assert_true(g_str_has_suffix(seen->str, "removed:a1"));
    }
}

/* `start` asks the components first; `rm` asks, then tells; a refusal keeps the agent whole. */
static void
test_start_and_rm(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    g_autofree char *record = hostd_test_agent_file(f, "a1", HOSTD_AGENT_RECORD);

    /* Making the agent built its domain XML, with the component's part. */
    assert_string_equal(seen->str, "domain:a1");
    g_string_truncate(seen, 0);
    g_autoptr(GVariant) started = hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error);
    assert_non_null(started);
    assert_string_equal(seen->str, "starting:a1");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");

    g_string_truncate(seen, 0);
    fail_hook = "removing";
    assert_false(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "the recorder refuses removing");
    g_clear_error(&error);
    assert_string_equal(seen->str, "removing:a1");
    assert_true(g_file_test(record, G_FILE_TEST_EXISTS));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");

    g_string_truncate(seen, 0);
    fail_hook = NULL;
    /* The mark of a session held over its virtio port goes with it. */
    g_hash_table_insert(f->ctx->serial_runs, g_strdup("a1"), g_strdup("1/attaching"));
    assert_true(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    assert_string_equal(seen->str, "removing:a1 removed:a1");
    assert_false(g_hash_table_contains(f->ctx->serial_runs, "a1"));
    assert_false(g_file_test(record, G_FILE_TEST_EXISTS));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "missing");
}

/* An agent made from a warm pool's machine keeps that machine's domain name and dir, its name in
 * agents/ a link to the dir: after a restart (reconcile) every call by the agent's name reaches
 * that domain, and rm takes the domain, the dir and the link. */
static void
test_agent_with_pool_machine(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    const char *machine = "pool.00000000000000a1";
    g_autofree char *dir = hostd_test_agent_as_pool_machine(f, "a1", machine);
    g_autofree char *link = g_build_filename(f->agents_dir, "a1", NULL);

    /* Before the restart's reconcile: the agent's name reaches no domain. */
    assert_string_equal(hostd_test_domain_state(f, "a1"), "missing");
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    assert_true(hostd_reconcile(f->ctx, notes, &error));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");

    g_autoptr(GVariant) started = hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error);
    if (started == NULL)
        fail_msg("start: %s", error->message);
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    assert_non_null(dom);
    assert_string_equal(virDomainGetName(dom), machine);
    assert_string_equal(hostd_libvirt_state_name(dom), "running");
    g_autofree char *agent = hostd_libvirt_agent_name(f->ctx->lv, dom);
    assert_string_equal(agent, "a1");
    /* What hostd writes for the agent goes where the machine's files are. */
    g_autoptr(HostdAgentRecord) loaded = hostd_agent_load(f->ctx, "a1", &error);
    g_autofree char *real = realpath(dir, NULL);
    assert_string_equal(loaded->dir, real);

    assert_true(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    assert_false(g_file_test(link, G_FILE_TEST_IS_SYMLINK));
    g_autoptr(virDomain) gone = virDomainLookupByName(f->ctx->lv->conn, machine);
    assert_null(gone);
    virResetLastError();
    g_autofree char *domain = hostd_libvirt_domain_name(f->ctx->lv, "a1");
    assert_string_equal(domain, "a1");
}

/* A `new` from the pool that fails after the link is made rolls back naming the machine's dir:
 * the link goes too, so that the `new` made the other way finds the name free. */
static void
test_rollback_of_pool_machine_removes_link(void **state)
{
    HostdTestFixture *f = *state;
    const char *machine = "pool.00000000000000b2";
    g_autofree char *dir = hostd_test_agent_as_pool_machine(f, "a1", machine);
    g_autofree char *link = g_build_filename(f->agents_dir, "a1", NULL);
    hostd_libvirt_alias_set(f->ctx->lv, "a1", machine);

    hostd_agent_rollback(f->ctx, "a1", dir);
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    assert_false(g_file_test(link, G_FILE_TEST_IS_SYMLINK));
    g_autoptr(virDomain) gone = virDomainLookupByName(f->ctx->lv->conn, machine);
    assert_null(gone);
    virResetLastError();
}

/* A failing `starting` hook keeps a stopped agent stopped. */
static void
test_failing_start_hook_keeps_it_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    fail_hook = "starting";
    g_autoptr(GVariant) started = hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error);
    assert_null(started);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "the recorder refuses starting");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");
    /* start records wanted running before it boots: a boot refused puts the record back */
    g_autoptr(HostdAgentRecord) after = hostd_test_agent_record(f, "a1");
    vm_test_assert_nullable_string_equal(after->wanted, r->wanted);
}

/* The disk limits `new` gives an agent, in its record, its info and its domain: hostd.conf's,
 * unless its template sets one, unless `new` does (0: no limit, over a default). */
static void
test_new_disk_limits(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *tpl_path = g_build_filename(f->templates_dir, "debian-12.yaml", NULL);
    g_autofree char *tpl = vm_test_read_file(tpl_path);

    f->ctx->config->disk_limits[VM_DISK_READ_MIB] = 11;
    f->ctx->config->disk_limits[VM_DISK_WRITE_MIB] = 22;
    f->ctx->config->disk_limits[VM_DISK_READ_IOPS] = 33;
    f->ctx->config->disk_limits[VM_DISK_WRITE_IOPS] = 44;
    g_autoptr(GVariant) a1 = new_agent(f, "a1", &error);
    if (a1 == NULL)
        fail_msg("new: %s", error->message);
    g_autoptr(HostdAgentRecord) r1 = hostd_test_agent_record(f, "a1");
    assert_int_equal(r1->disk_limits[VM_DISK_READ_MIB], 11);
    assert_int_equal(r1->disk_limits[VM_DISK_WRITE_IOPS], 44);
    guint32 value = 0;
    assert_true(g_variant_lookup(a1, "disk_write_mib", "u", &value));
    assert_int_equal(value, 22);
    g_autofree char *xml1_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml1 = vm_test_read_file(xml1_path);
    assert_non_null(strstr(xml1, "<read_bytes_sec>11534336</read_bytes_sec>"));
    assert_non_null(strstr(xml1, "<write_iops_sec>44</write_iops_sec>"));
    /* and libvirt took them */
    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, "a1");
    assert_non_null(dom);
    g_autofree char *live = virDomainGetXMLDesc(dom, 0);
    assert_non_null(strstr(live, "<write_bytes_sec>23068672</write_bytes_sec>"));

    /* the template's, over hostd.conf's */
    g_autofree char *limited = g_strconcat(tpl, "\n", NULL);
    g_autofree char *edited = NULL;
    {
        g_auto(GStrv) parts = g_strsplit(limited, "resources:\n", 2);
        assert_int_equal(g_strv_length(parts), 2);
        edited = g_strconcat(parts[0], "resources:\n  disk_read: 0\n  disk_write_iops: 5\n",
                             parts[1], NULL);
    }
    vm_test_write_file(tpl_path, edited);
    g_autoptr(GVariant) a2 = new_agent(f, "a2", &error);
    if (a2 == NULL)
        fail_msg("new from the template: %s", error->message);
    g_autoptr(HostdAgentRecord) r2 = hostd_test_agent_record(f, "a2");
    assert_int_equal(r2->disk_limits[VM_DISK_READ_MIB], 0);
    assert_int_equal(r2->disk_limits[VM_DISK_WRITE_MIB], 22);
    assert_int_equal(r2->disk_limits[VM_DISK_READ_IOPS], 33);
    assert_int_equal(r2->disk_limits[VM_DISK_WRITE_IOPS], 5);
    g_autofree char *xml2_path = hostd_test_agent_file(f, "a2", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml2 = vm_test_read_file(xml2_path);
    assert_null(strstr(xml2, "read_bytes_sec"));

    /* `new`'s, over both; all 0: no <iotune> at all */
    HostdNewRequest req = {.name = "a3", .cpus = 1, .memory_mib = 128};
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        req.disk_limits_set[i] = TRUE;
    g_autoptr(GVariant) a3 = hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, &error));
    if (a3 == NULL)
        fail_msg("new with limits: %s", error->message);
    g_autoptr(HostdAgentRecord) r3 = hostd_test_agent_record(f, "a3");
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_int_equal(r3->disk_limits[i], 0);
    g_autofree char *xml3_path = hostd_test_agent_file(f, "a3", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml3 = vm_test_read_file(xml3_path);
    assert_null(strstr(xml3, "<iotune>"));

    /* over the maximum: refused, nothing made */
    HostdNewRequest big = {.name = "a4", .cpus = 1, .memory_mib = 128};
    big.disk_limits_set[VM_DISK_READ_IOPS] = TRUE;
    big.disk_limits[VM_DISK_READ_IOPS] = VM_DISK_LIMIT_MAX + 1;
    g_autoptr(GVariant) a4 = hostd_test_sink(hostd_agent_new(f->ctx, &big, NULL, NULL, &error));
    assert_null(a4);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "disk limit");
    assert_string_equal(hostd_test_domain_state(f, "a4"), "missing");
}

/* A template's egress presets and `new --egress`'s rules make the new agent's policy; an
 * unknown preset fails the `new` before anything is made. */
static void
test_new_egress_presets(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *tpl_path = g_build_filename(f->templates_dir, "debian-12.yaml", NULL);
    g_autofree char *tpl = vm_test_read_file(tpl_path);
    g_auto(GStrv) lines = g_strsplit(tpl, "\n", -1);
    g_autoptr(GString) edited = g_string_new(NULL);

    for (char **line = lines; *line != NULL; line++) {
        if (!g_str_has_prefix(*line, "egress:"))
            g_string_append_printf(edited, "%s\n", *line);
    }
    g_string_append(edited, "egress: {allow: ['@debian'], deny: ['security.debian.org']}\n");
    vm_test_write_file(tpl_path, edited->str);

    char *more[] = {"@pypi", "x.example:8443", NULL};
    HostdNewRequest req = {.name = "a1", .cpus = 1, .memory_mib = 128, .egress = more};
    g_autoptr(GVariant) a1 = hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, &error));
    if (a1 == NULL)
        fail_msg("new: %s", error->message);
    g_autofree char *p1 = hostd_test_egress_text(f, "a1");
    assert_string_equal(p1, "deb.debian.org security.debian.org ftp.debian.org *.deb.debian.org "
                            "pypi.org files.pythonhosted.org x.example:8443|security.debian.org");

    char *unknown[] = {"@pypi", "@nosuch", NULL};
    HostdNewRequest bad = {.name = "a2", .cpus = 1, .memory_mib = 128, .egress = unknown};
    g_autoptr(GVariant) a2 = hostd_test_sink(hostd_agent_new(f->ctx, &bad, NULL, NULL, &error));
    assert_null(a2);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no egress preset '@nosuch'");
    assert_string_equal(hostd_test_domain_state(f, "a2"), "missing");
    g_autofree char *dir = g_build_filename(f->agents_dir, "a2", NULL);
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
}

/* Start-up: every ready agent reaches the component, a lost domain once it is redefined. */
static void
test_reconcile_reaches_components(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) a2 = hostd_test_agent_new(f, "a2", HOSTD_TEST_STOPPED);
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;

    /* libvirt lost a2's definition: reconcile redefines it from domain.xml. */
    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, "a2");
    assert_non_null(dom);
    assert_int_equal(virDomainUndefine(dom), 0);

    g_string_truncate(seen, 0);
    assert_true(hostd_reconcile(f->ctx, notes, &error));
    assert_string_equal(seen->str, "reconcile:a1 reconcile:a2");
    assert_string_equal(hostd_test_domain_state(f, "a2"), "stopped");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_new_runs_hooks_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_hook_rolls_new_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_and_rm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_with_pool_machine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_of_pool_machine_removes_link, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_new_egress_presets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failing_start_hook_keeps_it_stopped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_reaches_components, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_disk_limits, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
