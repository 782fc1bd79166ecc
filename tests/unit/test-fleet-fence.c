/* Fencing over a real etcd (3.4, Debian's etcd-server) on loopback: a host that starts with a
 * local agent another host of the fleet now owns never starts it (docs/CLUSTER.md, "Fencing").
 * Ports 27200-27209; the etcd started here is killed here, by its process. Skipped where no
 * etcd is installed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gio/gio.h>
#include <signal.h>
#include <string.h>

#include "hostd-agent.h"
#include "hostd-checkpoint.h"
#include "hostd-cluster.h"
#include "hostd-fence.h"
#include "hostd-power.h"
#include "test-etcd-fixture.h"
#include "test-hostd-fixture.h"
#include "vm-error.h"
#include "vm-etcd.h"
#include "vm-fleet-records.h"
#include "vm-fs.h"

#define CLIENT_PORT 27200
#define PEER_PORT   27201
#define DEAD_PORT   27209 /* nothing listens here */

static VmTestEtcdSuite *suite;

static VmEtcd *
client(void)
{
    return vm_test_etcd_suite_client(suite);
}

static int
suite_setup(void **state)
{
    suite = vm_test_etcd_suite_new("fleet-fence", CLIENT_PORT, PEER_PORT);
    return 0;
}

static int
suite_teardown(void **state)
{
    g_clear_pointer(&suite, vm_test_etcd_suite_free);
    return 0;
}

/* Each test starts from an empty keyspace. */
static int
test_setup(void **state)
{
    return vm_test_etcd_suite_test_setup(suite);
}

static HostdCluster *
host_new(const char *id, guint port)
{
    guint ports[] = {port};
    return hostd_test_cluster_new(id, ports, 1, suite->dir);
}

/* Writes @name's fleet record as host @host would hold it. */
static void
record_put(const char *name, const char *host, guint64 epoch)
{
    g_autoptr(VmEtcd) etcd = client();
    vm_test_etcd_agent_put(etcd, name, host, epoch);
}

/* The host @name's fleet record names, or NULL when it has none. */
static char *
record_host(const char *name)
{
    g_autoptr(VmEtcd) etcd = client();
    g_autofree char *owner = vm_test_etcd_agent_owner(etcd, name);
    if (g_str_equal(owner, "none"))
        return NULL;
    return g_strndup(owner, strcspn(owner, "/"));
}

static void
make_agent(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    HostdNewRequest req = {.name = name, .cpus = 1, .memory_mib = 128};
    g_autoptr(GVariant) made = hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, &error));
    if (made == NULL)
        fail_msg("%s", error->message);
}

static char *
info_string(HostdTestFixture *f, const char *name, const char *key)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) info = hostd_test_sink(hostd_agent_info(f->ctx, name, &error));
    if (info == NULL)
        fail_msg("%s", error->message);
    return hostd_test_dict_string(info, key);
}

static void
assert_fenced_refusal(GError *error, const char *name)
{
    assert_non_null(error);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "is fenced: host 'h2' owns it (epoch 2)");
    assert_non_null(strstr(error->message, name));
    /* vmctl's exit status for it: bad-state, 5. */
    assert_int_equal(vm_error_exit_status(vm_error_code(error)), 5);
}

/* A host back with an agent another host took over: fenced at start, never started, resumed or
 * woken, its files kept; rm removes the local copy and leaves the owner's record. An agent this
 * host owns starts as ever. */
static void
test_fenced_at_start(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h1 = host_new("h1", CLIENT_PORT);
    g_autoptr(GError) error = NULL;

    f->ctx->cluster = h1;
    make_agent(f, "taken");
    make_agent(f, "mine");
    make_agent(f, "stale");
    assert_string_equal(hostd_test_domain_state(f, "taken"), "running");
    /* Each copy keeps the epoch it was claimed with. */
    g_autofree char *ini_path = hostd_test_agent_file(f, "mine", "agent.ini");
    g_autofree char *ini = NULL;
    assert_true(g_file_get_contents(ini_path, &ini, NULL, NULL));
    assert_non_null(strstr(ini, "fleet-epoch=1\n"));
    /* Meanwhile h1 was away and another host recovered "taken" with a higher epoch; "stale" is
     * h1's again, but a newer copy of it (epoch 3) than the one on this disk. */
    hostd_test_checkpoint_n(f, "taken", 1);
    g_autofree char *checkpoint = hostd_test_checkpoint_ids(f, "taken");
    record_put("taken", "h2", 2);
    record_put("stale", "h1", 3);
    /* A name h1 claimed for a `new` that died before it made anything; another host's name
     * that h1 does not have either. */
    record_put("ghost", "h1", 1);
    record_put("theirs", "h2", 1);

    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    hostd_fence_startup(f->ctx, notes);

    /* The dead claim is given back, said in the notes; the other host's stays. */
    g_autofree char *ghost = record_host("ghost");
    assert_null(ghost);
    g_autofree char *theirs = record_host("theirs");
    assert_string_equal(theirs, "h2");
    gboolean said = FALSE;
    for (guint i = 0; i < notes->len; i++)
        said = said || strstr(notes->pdata[i], "the name 'ghost' was this host's") != NULL;
    assert_true(said);

    /* Its running copy (a host back with its QEMUs) is gone, its files stay. */
    assert_string_equal(hostd_test_domain_state(f, "taken"), "stopped");
    g_autofree char *disk = hostd_test_agent_file(f, "taken", "agent.ini");
    assert_true(g_file_test(disk, G_FILE_TEST_EXISTS));
    g_autofree char *state_shown = info_string(f, "taken", "state");
    assert_string_equal(state_shown, "fenced");
    g_autofree char *why = info_string(f, "taken", "fenced");
    assert_string_equal(why, "host 'h2' owns it (epoch 2)");
    hostd_test_assert_logged("agent 'taken' fenced: host 'h2' owns it (epoch 2)");

    /* Never started, resumed or woken (exec and a connection wake through the same). */
    assert_null(hostd_agent_start(f->ctx, "taken", FALSE, NULL, NULL, &error));
    assert_fenced_refusal(error, "taken");
    g_clear_error(&error);
    assert_null(hostd_agent_resume(f->ctx, "taken", &error));
    assert_fenced_refusal(error, "taken");
    g_clear_error(&error);
    assert_false(hostd_power_wake(f->ctx, "taken", &error));
    assert_fenced_refusal(error, "taken");
    g_clear_error(&error);
    /* Nor turned back to a checkpoint (which would run it): the checkpoint stays as it was. */
    assert_null(
        hostd_checkpoint_restore(f->ctx, "taken", checkpoint, FALSE, NULL, NULL, NULL, &error));
    assert_fenced_refusal(error, "taken");
    g_clear_error(&error);
    g_autofree char *kept = hostd_test_checkpoint_ids(f, "taken");
    assert_string_equal(kept, checkpoint);
    assert_string_equal(hostd_test_domain_state(f, "taken"), "stopped");

    /* A refused start leaves the record as it was: still fenced, still not wanted running. */
    g_autofree char *still = info_string(f, "taken", "state");
    assert_string_equal(still, "fenced");

    g_autofree char *stale = info_string(f, "stale", "fenced");
    assert_string_equal(stale, "host 'h1' owns it (epoch 3)");

    /* The agent this host owns is untouched and starts as ever. */
    g_autofree char *mine_state = info_string(f, "mine", "state");
    assert_string_equal(mine_state, "running");
    g_autoptr(GVariant) stopped =
        hostd_test_sink(hostd_agent_stop(f->ctx, "mine", TRUE, 0, NULL, NULL, &error));
    assert_non_null(stopped);
    g_autoptr(GVariant) started =
        hostd_test_sink(hostd_agent_start(f->ctx, "mine", FALSE, NULL, NULL, &error));
    if (started == NULL)
        fail_msg("%s", error->message);
    assert_string_equal(hostd_test_domain_state(f, "mine"), "running");

    /* rm removes the copy here only: the name stays h2's in the fleet. */
    assert_true(hostd_agent_rm(f->ctx, "taken", TRUE, &error));
    g_autofree char *dir = g_build_filename(f->agents_dir, "taken", NULL);
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    g_autofree char *owner = record_host("taken");
    assert_string_equal(owner, "h2");
    g_autofree char *mine_owner = record_host("mine");
    assert_string_equal(mine_owner, "h1");

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

/* etcd down at start: nothing is fenced (nothing to go on) and nothing fails; once etcd answers,
 * the cluster's thread fences the agent another host owns, stopping its running copy. */
static void
test_fenced_when_etcd_answers(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h1 = host_new("h1", CLIENT_PORT);
    g_autoptr(GError) error = NULL;

    f->ctx->cluster = h1;
    make_agent(f, "taken");
    record_put("taken", "h2", 2);

    /* Started without etcd. */
    g_autoptr(HostdCluster) cut = host_new("h1", DEAD_PORT);
    f->ctx->cluster = cut;
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    hostd_fence_startup(f->ctx, notes);
    assert_int_equal(notes->len, 1);
    assert_non_null(strstr(notes->pdata[0], "could not be checked"));
    g_autofree char *before = info_string(f, "taken", "state");
    assert_string_equal(before, "running");
    g_autofree char *no_fence = info_string(f, "taken", "fenced");
    assert_null(no_fence);

    /* etcd answers: the thread's first round finds the record another host's. */
    f->ctx->cluster = h1;
    hostd_cluster_set_agents_func(h1, hostd_agent_states, f->ctx);
    hostd_cluster_set_fence_func(h1, hostd_fence_from_cluster, f->ctx);
    hostd_cluster_start(h1);
    gint64 end = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
    for (;;) {
        g_autofree char *now = info_string(f, "taken", "state");
        if (g_str_equal(now, "fenced"))
            break;
        if (g_get_monotonic_time() > end)
            fail_msg("agent 'taken' not fenced once etcd answered (state %s)", now);
        g_usleep(50 * 1000);
    }
    hostd_cluster_stop(h1, TRUE);
    assert_string_equal(hostd_test_domain_state(f, "taken"), "stopped");
    assert_null(hostd_agent_start(f->ctx, "taken", FALSE, NULL, NULL, &error));
    assert_fenced_refusal(error, "taken");
    g_autofree char *owner = record_host("taken");
    assert_string_equal(owner, "h2");

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fenced_at_start, test_setup),
        cmocka_unit_test_setup(test_fenced_when_etcd_answers, test_setup),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
