/* The fleet over a real etcd (3.4, Debian's etcd-server) on loopback: the client's calls, leases
 * that expire, hosts that join and leave, names unique across hosts, a fleet that loses etcd, and
 * a three-member cluster that loses one member. Ports 27020-27049 (below Linux's ephemeral range,
 * where an outgoing connection's port could take one); every etcd started here is
 * killed here, by its process. Skipped where no etcd is installed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>

#include "hostd-agent.h"
#include "hostd-cluster.h"
#include "hostd-fork.h"
#include "test-etcd-fixture.h"
#include "test-hostd-fixture.h"
#include "vm-error.h"
#include "vm-etcd.h"
#include "vm-fleet-records.h"
#include "vm-fs.h"

#define SINGLE_CLIENT 27020
#define SINGLE_PEER   27021
#define DEAD_PORT     27029 /* nothing listens here */
#define TRIO_CLIENT   27030 /* member i: client 27030 + 2i, peer 27031 + 2i */

typedef struct {
    char *dir;
    VmTestEtcdMember single;
    VmTestEtcdMember trio[3]; /* test_three_members' members, killed by the teardown if it fails */
} Suite;

static Suite *suite;

static VmEtcd *
single_client(void)
{
    guint ports[] = {SINGLE_CLIENT};
    return vm_test_etcd_client(ports, 1);
}

static void
single_start(void)
{
    g_autofree char *peer = vm_test_etcd_url(SINGLE_PEER);
    g_autofree char *cluster = g_strdup_printf("m0=%s", peer);
    vm_test_etcd_member_start(&suite->single, cluster);
    g_autoptr(VmEtcd) etcd = single_client();
    vm_test_etcd_wait_ready(etcd);
}

static int
suite_setup(void **state)
{
    if (!vm_test_etcd_installed())
        return 0;
    suite = g_new0(Suite, 1);
    suite->dir = g_dir_make_tmp("fleet-etcd-XXXXXX", NULL);
    vm_test_etcd_member_init(&suite->single, suite->dir, "m0", SINGLE_CLIENT, SINGLE_PEER);
    single_start();
    return 0;
}

static int
suite_teardown(void **state)
{
    if (suite == NULL)
        return 0;
    vm_test_etcd_member_clear(&suite->single);
    for (guint i = 0; i < G_N_ELEMENTS(suite->trio); i++)
        vm_test_etcd_member_clear(&suite->trio[i]);
    vm_remove_tree(suite->dir, NULL);
    g_free(suite->dir);
    g_clear_pointer(&suite, g_free);
    return 0;
}

/* Each test starts from an empty keyspace. */
static int
test_setup(void **state)
{
    if (suite == NULL)
        skip();
    g_autoptr(VmEtcd) etcd = single_client();
    vm_test_etcd_wipe(etcd);
    return 0;
}

static char *
kv_text(const VmEtcdKv *kv)
{
    gsize len;
    const char *data = g_bytes_get_data(kv->value, &len);
    return g_strndup(data, len);
}

/* ---------------------------------------------------------------------------------------------
 * The client */

static void
test_client_kv(void **state)
{
    /* A dead member first: it is skipped. */
    guint ports[] = {DEAD_PORT, SINGLE_CLIENT};
    g_autoptr(VmEtcd) etcd = vm_test_etcd_client(ports, 2);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEtcdKv) kv = NULL;

    assert_true(vm_etcd_get(etcd, "/t/a", &kv, &error));
    assert_null(kv);
    assert_true(vm_etcd_put(etcd, "/t/a", "one", -1, 0, &error));
    assert_true(vm_etcd_put(etcd, "/t/b", "tw\0o", 4, 0, &error));
    assert_true(vm_etcd_put(etcd, "/u/c", "three", -1, 0, &error));
    assert_true(vm_etcd_get(etcd, "/t/a", &kv, &error));
    assert_non_null(kv);
    g_autofree char *one = kv_text(kv);
    assert_string_equal(one, "one");
    assert_int_equal(kv->version, 1);
    assert_true(kv->mod_revision > 0);

    g_autoptr(GPtrArray) kvs = vm_etcd_get_prefix(etcd, "/t/", 0, &error);
    assert_non_null(kvs);
    assert_int_equal(kvs->len, 2);
    assert_string_equal(((VmEtcdKv *)kvs->pdata[0])->key, "/t/a");
    assert_string_equal(((VmEtcdKv *)kvs->pdata[1])->key, "/t/b");
    assert_int_equal(g_bytes_get_size(((VmEtcdKv *)kvs->pdata[1])->value), 4);

    gint64 deleted = -1;
    assert_true(vm_etcd_delete(etcd, "/t/a", &deleted, &error));
    assert_int_equal(deleted, 1);
    assert_true(vm_etcd_delete(etcd, "/t/a", &deleted, &error));
    assert_int_equal(deleted, 0);
}

static void
test_client_txn(void **state)
{
    g_autoptr(VmEtcd) etcd = single_client();
    g_autoptr(GError) error = NULL;
    gboolean ok = FALSE;

    /* Create where absent: once. */
    for (guint i = 0; i < 2; i++) {
        g_autoptr(VmEtcdTxn) txn = vm_etcd_txn_new();
        g_autoptr(GPtrArray) kvs = NULL;
        vm_etcd_txn_if_version(txn, "/t/x", 0);
        vm_etcd_txn_put(txn, TRUE, "/t/x", i == 0 ? "first" : "second", 0);
        vm_etcd_txn_get(txn, FALSE, "/t/x");
        assert_true(vm_etcd_txn_commit(etcd, txn, &ok, &kvs, &error));
        assert_int_equal(ok, i == 0);
        assert_int_equal(kvs->len, i == 0 ? 0 : 1);
        if (i == 1) {
            g_autofree char *text = kv_text(kvs->pdata[0]);
            assert_string_equal(text, "first");
        }
    }
    /* Delete only if the value is what we think. */
    g_autoptr(VmEtcdTxn) wrong = vm_etcd_txn_new();
    vm_etcd_txn_if_value(wrong, "/t/x", "second");
    vm_etcd_txn_delete(wrong, TRUE, "/t/x");
    assert_true(vm_etcd_txn_commit(etcd, wrong, &ok, NULL, &error));
    assert_false(ok);
    g_autoptr(VmEtcdKv) kv = NULL;
    assert_true(vm_etcd_get(etcd, "/t/x", &kv, &error));
    assert_non_null(kv);
    g_autoptr(VmEtcdTxn) right = vm_etcd_txn_new();
    vm_etcd_txn_if_mod_revision(right, "/t/x", kv->mod_revision);
    vm_etcd_txn_delete(right, TRUE, "/t/x");
    assert_true(vm_etcd_txn_commit(etcd, right, &ok, NULL, &error));
    assert_true(ok);
    g_clear_pointer(&kv, vm_etcd_kv_free);
    assert_true(vm_etcd_get(etcd, "/t/x", &kv, &error));
    assert_null(kv);
}

static void
test_client_lease(void **state)
{
    g_autoptr(VmEtcd) etcd = single_client();
    g_autoptr(GError) error = NULL;
    gint64 kept = 0, dropped = 0, revoked = 0, ttl = 0;

    assert_true(vm_etcd_lease_grant(etcd, 2, &kept, &error));
    assert_true(vm_etcd_lease_grant(etcd, 2, &dropped, &error));
    assert_true(vm_etcd_lease_grant(etcd, 30, &revoked, &error));
    assert_true(vm_etcd_put(etcd, "/t/kept", "k", -1, kept, &error));
    assert_true(vm_etcd_put(etcd, "/t/dropped", "d", -1, dropped, &error));
    assert_true(vm_etcd_put(etcd, "/t/revoked", "r", -1, revoked, &error));

    /* Revoked: its key goes at once; revoking again is no error. */
    assert_true(vm_etcd_lease_revoke(etcd, revoked, &error));
    assert_true(vm_etcd_lease_revoke(etcd, revoked, &error));
    g_autoptr(VmEtcdKv) kv = NULL;
    assert_true(vm_etcd_get(etcd, "/t/revoked", &kv, &error));
    assert_null(kv);

    /* One kept alive past its TTL, the other not. */
    for (guint i = 0; i < 8; i++) {
        assert_true(vm_etcd_lease_keepalive(etcd, kept, &ttl, &error));
        assert_int_equal(ttl, 2);
        g_usleep(500 * 1000);
    }
    assert_true(vm_etcd_get(etcd, "/t/kept", &kv, &error));
    assert_non_null(kv);
    assert_int_equal(kv->lease, kept);
    g_clear_pointer(&kv, vm_etcd_kv_free);
    assert_true(vm_etcd_get(etcd, "/t/dropped", &kv, &error));
    assert_null(kv);
    assert_false(vm_etcd_lease_keepalive(etcd, dropped, &ttl, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
    g_clear_error(&error);
    assert_true(vm_etcd_lease_revoke(etcd, kept, &error));
}

static void
test_client_bad_input(void **state)
{
    g_autoptr(GError) error = NULL;
    const char *none[] = {NULL};
    const char *ftp[] = {"ftp://127.0.0.1:1", NULL};
    const char *spaced[] = {"http://127.0.0.1 :1", NULL};
    const char *empty_host[] = {"http://", NULL};
    const char *ok[] = {"http://127.0.0.1:27029/", NULL};

    assert_null(vm_etcd_new(none, NULL, NULL, NULL, &error));
    g_clear_error(&error);
    assert_null(vm_etcd_new(ftp, NULL, NULL, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    g_clear_error(&error);
    assert_null(vm_etcd_new(spaced, NULL, NULL, NULL, &error));
    g_clear_error(&error);
    assert_null(vm_etcd_new(empty_host, NULL, NULL, NULL, &error));
    g_clear_error(&error);
    assert_null(vm_etcd_new(ok, NULL, "/cert.pem", NULL, &error));
    g_clear_error(&error);

    /* Nobody there: a clear error naming the member, at once. */
    g_autoptr(VmEtcd) etcd = vm_etcd_new(ok, NULL, NULL, NULL, &error);
    assert_non_null(etcd);
    g_autoptr(VmEtcdKv) kv = NULL;
    gint64 start = g_get_monotonic_time();
    assert_false(vm_etcd_get(etcd, "/x", &kv, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING));
    assert_non_null(strstr(error->message, "127.0.0.1:27029"));
    assert_true(g_get_monotonic_time() - start < 2 * G_USEC_PER_SEC);
    g_clear_error(&error);
    /* Keys we never send: empty, over the bound. */
    assert_false(vm_etcd_put(etcd, "", "x", -1, 0, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

/* A stand-in for a member that answers one canned HTTP response to each connection. */
typedef struct {
    GSocket *listener;
    GThread *thread;
    GBytes *answer;
    guint connections;
} FakeMember;

static gpointer
fake_member_run(gpointer data)
{
    FakeMember *fake = data;
    for (guint i = 0; i < fake->connections; i++) {
        g_autoptr(GSocket) client = g_socket_accept(fake->listener, NULL, NULL);
        char buf[4096];
        if (client == NULL)
            return NULL;
        /* The request is small: one read takes its headers and body. */
        g_socket_receive(client, buf, sizeof(buf), NULL, NULL);
        gsize len;
        const char *data_ = g_bytes_get_data(fake->answer, &len);
        for (gsize sent = 0; sent < len;) {
            gssize n = g_socket_send(client, data_ + sent, len - sent, NULL, NULL);
            if (n <= 0)
                break;
            sent += (gsize)n;
        }
        g_socket_close(client, NULL);
    }
    return NULL;
}

static FakeMember *
fake_member_new(guint port, const char *body, gsize body_len, guint connections,
                gboolean with_length)
{
    FakeMember *fake = g_new0(FakeMember, 1);
    g_autoptr(GError) error = NULL;
    g_autoptr(GInetAddress) lo = g_inet_address_new_loopback(G_SOCKET_FAMILY_IPV4);
    g_autoptr(GSocketAddress) address = g_inet_socket_address_new(lo, port);
    g_autoptr(GString) answer = g_string_new(NULL);

    g_string_append(answer, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n");
    /* Without a length the answer ends where the connection does: only the reader's own bound
     * stops it. */
    if (with_length)
        g_string_append_printf(answer, "Content-Length: %" G_GSIZE_FORMAT "\r\n", body_len);
    g_string_append(answer, "Connection: close\r\n\r\n");
    g_string_append_len(answer, body, (gssize)body_len);
    fake->answer = g_string_free_to_bytes(g_steal_pointer(&answer));
    fake->connections = connections;
    fake->listener =
        g_socket_new(G_SOCKET_FAMILY_IPV4, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_TCP, &error);
    g_socket_set_option(fake->listener, SOL_SOCKET, SO_REUSEADDR, 1, NULL);
    if (!g_socket_bind(fake->listener, address, TRUE, &error) ||
        !g_socket_listen(fake->listener, &error))
        fail_msg("fake member: %s", error->message);
    fake->thread = g_thread_new("fake-member", fake_member_run, fake);
    return fake;
}

static void
fake_member_free(FakeMember *fake)
{
    g_socket_shutdown(fake->listener, TRUE, TRUE, NULL);
    g_socket_close(fake->listener, NULL);
    g_thread_join(fake->thread);
    g_object_unref(fake->listener);
    g_bytes_unref(fake->answer);
    g_free(fake);
}

/* A member that answers nonsense: each answer refused as a protocol error, the oversized one
 * before it is all read. */
static void
test_client_hostile_answers(void **state)
{
    static const char *const bodies[] = {
        "not json at all",
        "[1, 2]",
        "{\"kvs\": {\"key\": \"Zm9v\"}}",
        "{\"kvs\": [{\"key\": \"Zm9v!!\", \"value\": \"YmFy\"}]}",
        "{\"kvs\": [{\"key\": 7}]}",
        "{\"kvs\": [{\"key\": \"Zm9v\", \"version\": \"one\"}]}",
        "{\"kvs\": [{\"key\": \"Zm9v\", \"mod_revision\": [1]}]}",
        /* "fo\0o": a key with a NUL is none of ours. */
        "{\"kvs\": [{\"key\": \"Zm8Abw==\", \"value\": \"YmFy\"}]}",
    };
    guint port = 27028;

    for (gsize i = 0; i < G_N_ELEMENTS(bodies); i++) {
        FakeMember *fake = fake_member_new(port, bodies[i], strlen(bodies[i]), 1, TRUE);
        guint ports[] = {port};
        g_autoptr(VmEtcd) etcd = vm_test_etcd_client(ports, 1);
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEtcdKv) kv = NULL;
        if (vm_etcd_get(etcd, "/x", &kv, &error))
            fail_msg("accepted: %s", bodies[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        fake_member_free(fake);
    }

    /* Over the bound on an answer. */
    gsize big_len = VM_ETCD_RESPONSE_MAX + 1024;
    g_autofree char *big = g_malloc(big_len);
    memset(big, ' ', big_len);
    big[0] = '{';
    big[big_len - 1] = '}';
    for (guint with_length = 0; with_length < 2; with_length++) {
        FakeMember *fake = fake_member_new(port, big, big_len, 1, with_length);
        guint ports[] = {port};
        g_autoptr(VmEtcd) etcd = vm_test_etcd_client(ports, 1);
        g_autoptr(GError) error = NULL;
        g_autoptr(VmEtcdKv) kv = NULL;
        assert_false(vm_etcd_get(etcd, "/x", &kv, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        assert_non_null(strstr(error->message, "more than"));
        fake_member_free(fake);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Hosts: hostd's cluster module */

typedef struct {
    GMutex lock;
    GHashTable *agents; /* name -> state */
} FakeAgents;

static GHashTable *
fake_agents_func(gpointer data)
{
    FakeAgents *fake = data;
    GHashTable *copy = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    GHashTableIter it;
    gpointer k, v;
    g_mutex_lock(&fake->lock);
    g_hash_table_iter_init(&it, fake->agents);
    while (g_hash_table_iter_next(&it, &k, &v))
        g_hash_table_insert(copy, g_strdup(k), g_strdup(v));
    g_mutex_unlock(&fake->lock);
    return copy;
}

static FakeAgents *
fake_agents_new(void)
{
    FakeAgents *fake = g_new0(FakeAgents, 1);
    g_mutex_init(&fake->lock);
    fake->agents = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    return fake;
}

static void
fake_agents_set(FakeAgents *fake, const char *name, const char *state)
{
    g_mutex_lock(&fake->lock);
    g_hash_table_replace(fake->agents, g_strdup(name), g_strdup(state));
    g_mutex_unlock(&fake->lock);
}

static void
fake_agents_free(FakeAgents *fake)
{
    g_hash_table_unref(fake->agents);
    g_mutex_clear(&fake->lock);
    g_free(fake);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(FakeAgents, fake_agents_free)

static HostdCluster *
host_new(const char *id, const guint *ports, guint n, FakeAgents *agents)
{
    HostdCluster *cluster = hostd_test_cluster_new(id, ports, n, suite->dir);
    if (agents != NULL)
        hostd_cluster_set_agents_func(cluster, fake_agents_func, agents);
    return cluster;
}

static HostdCluster *
single_host(const char *id, FakeAgents *agents)
{
    guint ports[] = {DEAD_PORT, SINGLE_CLIENT};
    return host_new(id, ports, 2, agents);
}

static void
wait_registered(HostdCluster *cluster)
{
    gint64 end = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
    while (!hostd_cluster_registered(cluster)) {
        if (g_get_monotonic_time() > end)
            fail_msg("host '%s' did not register", hostd_cluster_host_id(cluster));
        g_usleep(50 * 1000);
    }
}

/* The row of @key == @value in @rows (aa{sv}), or NULL. */
static GVariant *
row_of(GVariant *rows, const char *key, const char *value)
{
    for (gsize i = 0; i < g_variant_n_children(rows); i++) {
        g_autoptr(GVariant) row = g_variant_get_child_value(rows, i);
        const char *v = NULL;
        if (g_variant_lookup(row, key, "&s", &v) && g_str_equal(v, value))
            return g_steal_pointer(&row);
    }
    return NULL;
}

static gboolean
row_bool(GVariant *row, const char *key)
{
    gboolean b = FALSE;
    assert_true(g_variant_lookup(row, key, "b", &b));
    return b;
}

static const char *
row_string(GVariant *row, const char *key)
{
    const char *s = NULL;
    assert_true(g_variant_lookup(row, key, "&s", &s));
    return s;
}

/* Two hosts join: each is seen by the other with its capacity and load; the agents one had
 * when it joined are claimed for it, with their state. */
static void
test_hosts_join(void **state)
{
    g_autoptr(FakeAgents) agents1 = fake_agents_new();
    fake_agents_set(agents1, "a1", "running");
    fake_agents_set(agents1, "a2", "stopped");
    g_autoptr(HostdCluster) h1 = single_host("h1", agents1);
    g_autoptr(HostdCluster) h2 = single_host("h2", NULL);
    g_autoptr(GError) error = NULL;

    hostd_cluster_start(h1);
    hostd_cluster_start(h2);
    wait_registered(h1);
    wait_registered(h2);

    g_autoptr(GVariant) hosts = hostd_cluster_hosts(h2, &error);
    assert_non_null(hosts);
    assert_int_equal(g_variant_n_children(hosts), 2);
    g_autoptr(GVariant) r1 = row_of(hosts, "id", "h1");
    assert_non_null(r1);
    assert_true(row_bool(r1, "live"));
    assert_string_equal(row_string(r1, "address"), "ssh://root@h1.lab");
    guint32 cores = 0, total = 0;
    guint64 memory = 0;
    assert_true(g_variant_lookup(r1, "cores", "u", &cores));
    assert_true(cores >= 1);
    assert_true(g_variant_lookup(r1, "memory_mib", "t", &memory));
    assert_true(memory > 0);
    assert_true(g_variant_lookup(r1, "agents_total", "u", &total));
    assert_int_equal(total, 2);
    guint32 running = 0;
    g_autoptr(GVariant) counts = g_variant_lookup_value(r1, "agents", G_VARIANT_TYPE("a{su}"));
    assert_true(g_variant_lookup(counts, "running", "u", &running));
    assert_int_equal(running, 1);

    g_autoptr(GVariant) fleet = hostd_cluster_agents(h2, &error);
    assert_non_null(fleet);
    assert_int_equal(g_variant_n_children(fleet), 2);
    g_autoptr(GVariant) a1 = row_of(fleet, "name", "a1");
    assert_string_equal(row_string(a1, "host"), "h1");
    assert_string_equal(row_string(a1, "state"), "running");
    g_autoptr(GVariant) a2 = row_of(fleet, "name", "a2");
    assert_string_equal(row_string(a2, "state"), "stopped");
    guint64 epoch = 0;
    assert_true(g_variant_lookup(a2, "epoch", "t", &epoch));
    assert_int_equal(epoch, 1);

    /* A state that changes reaches the fleet at the next refresh. */
    fake_agents_set(agents1, "a2", "running");
    hostd_cluster_kick(h1);
    gint64 end = g_get_monotonic_time() + 5 * G_USEC_PER_SEC;
    for (;;) {
        g_autoptr(GVariant) again = hostd_cluster_agents(h2, &error);
        g_autoptr(GVariant) row = row_of(again, "name", "a2");
        if (g_str_equal(row_string(row, "state"), "running"))
            break;
        assert_true(g_get_monotonic_time() < end);
        g_usleep(100 * 1000);
    }

    /* A clean exit takes the host out at once. */
    hostd_cluster_stop(h2, TRUE);
    g_autoptr(VmEtcd) etcd = single_client();
    g_autoptr(VmEtcdKv) kv = NULL;
    assert_true(vm_etcd_get(etcd, "/vmctl/hosts/h2", &kv, &error));
    assert_null(kv);
}

#define RACERS 6

typedef struct {
    HostdCluster *cluster;
    GThread *thread;
    gboolean created;
    GError *error;
} Racer;

static gpointer
racer_run(gpointer data)
{
    Racer *r = data;
    if (!hostd_cluster_claim(r->cluster, "contested", &r->created, &r->error))
        r->created = FALSE;
    return NULL;
}

/* A name is one host's: a second claim fails naming the owner; the owner's rm frees it. */
static void
test_claim_unique(void **state)
{
    g_autoptr(HostdCluster) h1 = single_host("h1", NULL);
    g_autoptr(HostdCluster) h2 = single_host("h2", NULL);
    g_autoptr(GError) error = NULL;
    gboolean created = FALSE;

    assert_true(hostd_cluster_claim(h1, "x", &created, &error));
    assert_true(created);
    assert_false(hostd_cluster_claim(h2, "x", &created, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_EXISTS));
    assert_string_equal(error->message, "agent 'x' exists on host 'h1'");
    g_clear_error(&error);
    /* Its owner may claim it again (a `new` that finds it is its own). */
    assert_true(hostd_cluster_claim(h1, "x", &created, &error));
    assert_false(created);
    /* Another host's release leaves it. */
    assert_true(hostd_cluster_release(h2, "x", &error));
    assert_false(hostd_cluster_claim(h2, "x", &created, &error));
    g_clear_error(&error);
    assert_true(hostd_cluster_release(h1, "x", &error));
    assert_true(hostd_cluster_claim(h2, "x", &created, &error));
    assert_true(created);

    /* Many hosts racing for one name: exactly one wins, the others are told who. */
    Racer racers[RACERS] = {{0}};
    for (guint i = 0; i < RACERS; i++) {
        g_autofree char *id = g_strdup_printf("r%u", i);
        racers[i].cluster = single_host(id, NULL);
    }
    for (guint i = 0; i < RACERS; i++)
        racers[i].thread = g_thread_new("racer", racer_run, &racers[i]);
    guint won = 0;
    for (guint i = 0; i < RACERS; i++) {
        g_thread_join(racers[i].thread);
        if (racers[i].created)
            won++;
        else
            assert_true(g_error_matches(racers[i].error, VM_ERROR, VM_ERROR_EXISTS));
        g_clear_error(&racers[i].error);
        hostd_cluster_free(racers[i].cluster);
    }
    assert_int_equal(won, 1);
}

/* A host that stops renewing (killed) is gone after its TTL: down, its agents host-down. */
static void
test_host_expires(void **state)
{
    g_autoptr(FakeAgents) agents1 = fake_agents_new();
    fake_agents_set(agents1, "held", "running");
    g_autoptr(HostdCluster) h1 = single_host("h1", agents1);
    g_autoptr(HostdCluster) h2 = single_host("h2", NULL);
    g_autoptr(GError) error = NULL;

    hostd_cluster_start(h1);
    wait_registered(h1);
    /* Kept alive well past its TTL of 2 s. */
    g_usleep(3 * G_USEC_PER_SEC);
    g_autoptr(GVariant) before = hostd_cluster_hosts(h2, &error);
    g_autoptr(GVariant) live = row_of(before, "id", "h1");
    assert_non_null(live);
    assert_true(row_bool(live, "live"));

    gint64 stopped = g_get_monotonic_time();
    hostd_cluster_stop(h1, FALSE);
    gint64 end = stopped + 5 * G_USEC_PER_SEC;
    for (;;) {
        g_autoptr(GVariant) hosts = hostd_cluster_hosts(h2, &error);
        assert_non_null(hosts);
        g_autoptr(GVariant) row = row_of(hosts, "id", "h1");
        assert_non_null(row);
        if (!row_bool(row, "live"))
            break;
        assert_true(g_get_monotonic_time() < end);
        g_usleep(100 * 1000);
    }
    /* Gone within its TTL and a little. */
    assert_true(g_get_monotonic_time() - stopped < 4 * G_USEC_PER_SEC);
    g_autoptr(GVariant) fleet = hostd_cluster_agents(h2, &error);
    g_autoptr(GVariant) held = row_of(fleet, "name", "held");
    assert_string_equal(row_string(held, "host"), "h1");
    assert_string_equal(row_string(held, "state"), "host-down");
    assert_false(row_bool(held, "host_live"));
}

/* etcd gone: claims and the view fail at once with a clear error, and nothing waits on it; the
 * host registers again once it is back. */
static void
test_etcd_down(void **state)
{
    g_autoptr(HostdCluster) h1 = single_host("h1", NULL);
    g_autoptr(GError) error = NULL;
    gboolean created = FALSE;

    hostd_cluster_start(h1);
    wait_registered(h1);
    vm_test_etcd_member_kill(&suite->single);

    gint64 start = g_get_monotonic_time();
    assert_false(hostd_cluster_claim(h1, "during", &created, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING));
    assert_non_null(strstr(error->message, "cannot claim the name 'during' in the fleet"));
    assert_non_null(strstr(error->message, "etcd cannot be reached"));
    g_clear_error(&error);
    assert_null(hostd_cluster_hosts(h1, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING));
    g_clear_error(&error);
    assert_false(hostd_cluster_release(h1, "during", &error));
    g_clear_error(&error);
    assert_true(g_get_monotonic_time() - start < 3 * G_USEC_PER_SEC);
    /* The thread's keepalives fail meanwhile; asking it never waits on them. */
    start = g_get_monotonic_time();
    for (guint i = 0; i < 20; i++)
        hostd_cluster_registered(h1);
    assert_true(g_get_monotonic_time() - start < G_USEC_PER_SEC / 10);

    /* Down past the lease's TTL: back, the host registers again by itself. */
    g_usleep(2500 * 1000);
    single_start();
    g_autoptr(VmEtcd) etcd = single_client();
    gint64 end = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
    for (;;) {
        g_autoptr(VmEtcdKv) kv = NULL;
        assert_true(vm_etcd_get(etcd, "/vmctl/hosts/h1", &kv, &error));
        if (kv != NULL)
            break;
        assert_true(g_get_monotonic_time() < end);
        g_usleep(100 * 1000);
    }
    assert_true(hostd_cluster_claim(h1, "after", &created, &error));
    assert_true(created);
}

/* Three members: with one killed (the first endpoint), claims and the view go on; with two,
 * there is no quorum and they fail with the clear error. */
static void
test_three_members(void **state)
{
    VmTestEtcdMember *trio = suite->trio;
    guint ports[3];
    g_autoptr(GString) cluster = g_string_new(NULL);
    g_autoptr(GError) error = NULL;
    gboolean created = FALSE;

    for (guint i = 0; i < 3; i++) {
        g_autofree char *name = g_strdup_printf("t%u", i);
        ports[i] = TRIO_CLIENT + 2 * i;
        vm_test_etcd_member_init(&trio[i], suite->dir, name, ports[i], ports[i] + 1);
        g_string_append_printf(cluster, "%st%u=http://127.0.0.1:%u", i > 0 ? "," : "", i,
                               ports[i] + 1);
    }
    for (guint i = 0; i < 3; i++)
        vm_test_etcd_member_start(&trio[i], cluster->str);
    {
        g_autoptr(VmEtcd) etcd = vm_test_etcd_client(ports, 3);
        vm_test_etcd_wait_ready(etcd);
    }

    g_autoptr(HostdCluster) h1 = host_new("h1", ports, 3, NULL);
    g_autoptr(HostdCluster) h2 = host_new("h2", ports, 3, NULL);
    hostd_cluster_start(h1);
    wait_registered(h1);
    assert_true(hostd_cluster_claim(h1, "before", &created, &error));

    vm_test_etcd_member_kill(&trio[0]);
    /* A new leader within an election or two; elections take longer on a loaded machine (the
     * unit suite runs several tests at once on two cores). */
    gint64 end = g_get_monotonic_time() + 30 * G_USEC_PER_SEC;
    while (!hostd_cluster_claim(h2, "during", &created, &error)) {
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING));
        g_clear_error(&error);
        assert_true(g_get_monotonic_time() < end);
        g_usleep(200 * 1000);
    }
    assert_true(created);
    assert_false(hostd_cluster_claim(h1, "during", &created, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_EXISTS));
    g_clear_error(&error);
    g_autoptr(GVariant) fleet = hostd_cluster_agents(h1, &error);
    assert_non_null(fleet);
    assert_int_equal(g_variant_n_children(fleet), 2);

    /* Quorum lost: a clear error, bounded in time. */
    vm_test_etcd_member_kill(&trio[1]);
    gint64 start = g_get_monotonic_time();
    assert_false(hostd_cluster_claim(h2, "lost", &created, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING));
    assert_non_null(strstr(error->message, "no quorum"));
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);

    hostd_cluster_stop(h1, FALSE);
    hostd_cluster_stop(h2, FALSE);
    for (guint i = 0; i < 3; i++)
        vm_test_etcd_member_kill(&trio[i]);
}

/* ---------------------------------------------------------------------------------------------
 * hostd's new, fork and rm in a fleet */

static void
test_hostd_new_rm(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) mine = single_host("here", NULL);
    g_autoptr(HostdCluster) other = single_host("there", NULL);
    g_autoptr(VmEtcd) etcd = single_client();
    g_autoptr(GError) error = NULL;
    gboolean created = FALSE;

    f->ctx->cluster = mine;

    /* Made here: its record names this host. */
    HostdNewRequest req = {.name = "a1", .cpus = 1, .memory_mib = 128};
    g_autoptr(GVariant) a1 = hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, &error));
    if (a1 == NULL)
        fail_msg("%s", error->message);
    g_autoptr(VmEtcdKv) kv = NULL;
    assert_true(vm_etcd_get(etcd, "/vmctl/agents/a1", &kv, &error));
    assert_non_null(kv);
    g_autofree char *json = kv_text(kv);
    g_autoptr(VmFleetAgent) record = vm_fleet_agent_from_json(json, strlen(json), &error);
    assert_string_equal(record->host, "here");
    assert_int_equal(record->epoch, 1);

    /* Another host's name: refused, nothing made. */
    assert_true(hostd_cluster_claim(other, "taken", &created, &error));
    HostdNewRequest taken = {.name = "taken", .cpus = 1, .memory_mib = 128};
    assert_null(hostd_agent_new(f->ctx, &taken, NULL, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_EXISTS));
    assert_string_equal(error->message, "agent 'taken' exists on host 'there'");
    g_clear_error(&error);
    g_autofree char *taken_dir = g_build_filename(f->agents_dir, "taken", NULL);
    assert_false(g_file_test(taken_dir, G_FILE_TEST_EXISTS));

    /* A new that fails after its claim gives the name back. */
    HostdNewRequest bad = {.name = "bad", .template_name = "no-such-template"};
    assert_null(hostd_agent_new(f->ctx, &bad, NULL, NULL, &error));
    g_clear_error(&error);
    g_clear_pointer(&kv, vm_etcd_kv_free);
    assert_true(vm_etcd_get(etcd, "/vmctl/agents/bad", &kv, &error));
    assert_null(kv);

    /* A fork is claimed as a new is. */
    HostdForkRequest fork_taken = {.source = "a1", .name = "taken"};
    assert_null(hostd_fork(f->ctx, &fork_taken, NULL, NULL, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_EXISTS));
    g_clear_error(&error);

    /* rm frees the name for any host. */
    assert_true(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    assert_true(vm_etcd_get(etcd, "/vmctl/agents/a1", &kv, &error));
    assert_null(kv);
    assert_true(hostd_cluster_claim(other, "a1", &created, &error));
    assert_true(created);

    /* Without etcd: new is refused with the clear error; the agents here are untouched. */
    g_autoptr(GVariant) a2 = NULL;
    HostdNewRequest req2 = {.name = "a2", .cpus = 1, .memory_mib = 128};
    a2 = hostd_test_sink(hostd_agent_new(f->ctx, &req2, NULL, NULL, &error));
    assert_non_null(a2);
    guint dead[] = {DEAD_PORT};
    g_autoptr(HostdCluster) cut = host_new("here", dead, 1, NULL);
    f->ctx->cluster = cut;
    HostdNewRequest req3 = {.name = "a3", .cpus = 1, .memory_mib = 128};
    assert_null(hostd_agent_new(f->ctx, &req3, NULL, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING));
    assert_non_null(strstr(error->message, "etcd cannot be reached"));
    g_clear_error(&error);
    g_autoptr(GVariant) info = hostd_test_sink(hostd_agent_info(f->ctx, "a2", &error));
    assert_non_null(info);
    g_autoptr(GVariant) stopped =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a2", TRUE, 0, NULL, NULL, &error));
    assert_non_null(stopped);
    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_client_kv, test_setup),
        cmocka_unit_test_setup(test_client_txn, test_setup),
        cmocka_unit_test_setup(test_client_lease, test_setup),
        cmocka_unit_test_setup(test_client_bad_input, test_setup),
        cmocka_unit_test_setup(test_client_hostile_answers, test_setup),
        cmocka_unit_test_setup(test_hosts_join, test_setup),
        cmocka_unit_test_setup(test_claim_unique, test_setup),
        cmocka_unit_test_setup(test_host_expires, test_setup),
        cmocka_unit_test_setup(test_hostd_new_rm, test_setup),
        cmocka_unit_test_setup(test_three_members, test_setup),
        cmocka_unit_test_setup(test_etcd_down, test_setup),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
