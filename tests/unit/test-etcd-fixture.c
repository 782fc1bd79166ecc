#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>

#include "test-etcd-fixture.h"

#include "vm-fleet-records.h"
#include "vm-fs.h"

#define READY_TIMEOUT_S 20

/* The output files of the members this process started, newest last: what a test that finds
 * etcd silent shows of why. */
static GPtrArray *member_logs;

gboolean
vm_test_etcd_installed(void)
{
    return g_file_test(VM_TEST_ETCD_BIN, G_FILE_TEST_IS_EXECUTABLE);
}

char *
vm_test_etcd_url(guint port)
{
    return g_strdup_printf("http://127.0.0.1:%u", port);
}

void
vm_test_etcd_member_init(VmTestEtcdMember *m, const char *dir, const char *name, guint client_port,
                         guint peer_port)
{
    m->name = g_strdup(name);
    m->data_dir = g_build_filename(dir, name, NULL);
    m->client_port = client_port;
    m->peer_port = peer_port;
    m->process = NULL;
}

static void
die_with_parent(gpointer data)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

void
vm_test_etcd_member_start(VmTestEtcdMember *m, const char *cluster)
{
    g_autofree char *client = vm_test_etcd_url(m->client_port);
    g_autofree char *peer = vm_test_etcd_url(m->peer_port);
    g_autofree char *alone = g_strdup_printf("%s=%s", m->name, peer);
    g_autoptr(GError) error = NULL;
    const char *argv[] = {
        VM_TEST_ETCD_BIN,
        "--name",
        m->name,
        "--data-dir",
        m->data_dir,
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        cluster != NULL ? cluster : alone,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        "vmctl-test",
        /* Elections in a fraction of a second: a member killed is replaced quickly. */
        "--heartbeat-interval",
        "50",
        "--election-timeout",
        "500",
        NULL,
    };
    g_autoptr(GSubprocessLauncher) launcher =
        g_subprocess_launcher_new(G_SUBPROCESS_FLAGS_STDERR_MERGE);
    g_autofree char *log = g_strconcat(m->data_dir, ".log", NULL);
    g_subprocess_launcher_set_stdout_file_path(launcher, log);
    if (member_logs == NULL)
        member_logs = g_ptr_array_new_with_free_func(g_free);
    g_ptr_array_add(member_logs, g_steal_pointer(&log));
    /* Should the test die without its teardown, its etcd goes with it. */
    g_subprocess_launcher_set_child_setup(launcher, die_with_parent, NULL, NULL);
    m->process = g_subprocess_launcher_spawnv(launcher, argv, &error);
    if (m->process == NULL)
        fail_msg("cannot start etcd: %s", error->message);
}

void
vm_test_etcd_member_kill(VmTestEtcdMember *m)
{
    if (m->process == NULL)
        return;
    g_subprocess_force_exit(m->process);
    g_subprocess_wait(m->process, NULL, NULL);
    g_clear_object(&m->process);
}

void
vm_test_etcd_member_clear(VmTestEtcdMember *m)
{
    vm_test_etcd_member_kill(m);
    g_clear_pointer(&m->name, g_free);
    g_clear_pointer(&m->data_dir, g_free);
}

VmEtcd *
vm_test_etcd_client(const guint *ports, guint n)
{
    g_autoptr(GPtrArray) urls = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < n; i++)
        g_ptr_array_add(urls, vm_test_etcd_url(ports[i]));
    g_ptr_array_add(urls, NULL);
    g_autoptr(GError) error = NULL;
    VmEtcd *etcd = vm_etcd_new((const char *const *)urls->pdata, NULL, NULL, NULL, &error);
    if (etcd == NULL)
        fail_msg("%s", error->message);
    vm_etcd_set_timeout(etcd, 1000);
    return etcd;
}

void
vm_test_etcd_wait_ready(VmEtcd *etcd)
{
    gint64 end = g_get_monotonic_time() + READY_TIMEOUT_S * G_USEC_PER_SEC;
    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEtcdKv) kv = NULL;
        if (vm_etcd_get(etcd, "/ready", &kv, &error))
            return;
        if (g_get_monotonic_time() > end) {
            /* The last lines each member wrote: a port taken, a data dir refused... */
            for (guint i = 0; member_logs != NULL && i < member_logs->len; i++) {
                g_autofree char *text = NULL;
                gsize len = 0;
                if (!g_file_get_contents(member_logs->pdata[i], &text, &len, NULL))
                    continue;
                fprintf(stderr, "%s (last 2 KiB):\n%s\n", (char *)member_logs->pdata[i],
                        text + (len > 2048 ? len - 2048 : 0));
            }
            fail_msg("etcd does not answer: %s", error->message);
        }
        g_usleep(100 * 1000);
    }
}

void
vm_test_etcd_wipe(VmEtcd *etcd)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) kvs = vm_etcd_get_prefix(etcd, "/", 0, &error);
    if (kvs == NULL)
        fail_msg("cannot list etcd's keys: %s", error->message);
    for (guint i = 0; i < kvs->len; i++) {
        if (!vm_etcd_delete(etcd, ((VmEtcdKv *)kvs->pdata[i])->key, NULL, &error))
            fail_msg("cannot delete an etcd key: %s", error->message);
    }
}

VmTestEtcdSuite *
vm_test_etcd_suite_new(const char *prefix, guint client_port, guint peer_port)
{
    if (!vm_test_etcd_installed())
        return NULL;
    VmTestEtcdSuite *suite = g_new0(VmTestEtcdSuite, 1);
    g_autofree char *template = g_strdup_printf("%s-XXXXXX", prefix);
    suite->dir = g_dir_make_tmp(template, NULL);
    vm_test_etcd_member_init(&suite->member, suite->dir, "m0", client_port, peer_port);
    vm_test_etcd_member_start(&suite->member, NULL);
    g_autoptr(VmEtcd) etcd = vm_test_etcd_suite_client(suite);
    vm_test_etcd_wait_ready(etcd);
    return suite;
}

void
vm_test_etcd_suite_free(VmTestEtcdSuite *suite)
{
    if (suite == NULL)
        return;
    vm_test_etcd_member_clear(&suite->member);
    vm_remove_tree(suite->dir, NULL);
    g_free(suite->dir);
    g_free(suite);
}

int
vm_test_etcd_suite_test_setup(VmTestEtcdSuite *suite)
{
    if (suite == NULL)
        skip();
    g_autoptr(VmEtcd) etcd = vm_test_etcd_suite_client(suite);
    vm_test_etcd_wipe(etcd);
    return 0;
}

VmEtcd *
vm_test_etcd_suite_client(const VmTestEtcdSuite *suite)
{
    guint ports[] = {suite->member.client_port};
    return vm_test_etcd_client(ports, 1);
}

void
vm_test_etcd_agent_put(VmEtcd *etcd, const char *name, const char *host, guint64 epoch)
{
    g_autoptr(VmFleetAgent) agent = vm_fleet_agent_new(name, host, epoch, "running");
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autofree char *json = vm_fleet_agent_to_json(agent);
    g_autoptr(GError) error = NULL;
    if (!vm_etcd_put(etcd, key, json, -1, 0, &error))
        fail_msg("%s", error->message);
}

char *
vm_test_etcd_agent_owner(VmEtcd *etcd, const char *name)
{
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmEtcdKv) kv = NULL;
    g_autoptr(GError) error = NULL;
    if (!vm_etcd_get(etcd, key, &kv, &error))
        fail_msg("%s", error->message);
    if (kv == NULL)
        return g_strdup("none");
    gsize len;
    const char *data = g_bytes_get_data(kv->value, &len);
    g_autoptr(VmFleetAgent) agent = vm_fleet_agent_from_json(data, len, &error);
    if (agent == NULL)
        fail_msg("%s", error->message);
    return g_strdup_printf("%s/%" G_GUINT64_FORMAT, agent->host, agent->epoch);
}
