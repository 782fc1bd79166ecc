/* Two hostds of one fleet over a real etcd (3.4) on loopback: placement and --on, the elsewhere
 * answer and vmctl following it, drain and undrain, an owner that is down.
 *
 * Each hostd is the test fixture's (libvirt's test driver) serving a real Unix socket in this
 * process. A host's address is ssh://hN/<its socket>, and a stand-in `ssh` first on PATH runs the
 * real `vmctl bridge --socket <its socket>` as sshd would: everything but sshd itself is real.
 * Ports: etcd 27100-27101, the agents' SSH ports 27110-27149. Every etcd started here is killed
 * here, by its process. Skipped where no etcd is installed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-cluster.h"
#include "hostd-libvirt.h"
#include "hostd-server.h"
#include "hostd-template.h"
#include "test-etcd-fixture.h"
#include "test-hostd-fixture.h"
#include "vm-error.h"
#include "vm-etcd.h"
#include "vm-fleet-records.h"
#include "vm-fs.h"
#include "vm-stream.h"
#include "vmctl-client.h"

#define ETCD_CLIENT 27100
#define ETCD_PEER   27101

typedef struct {
    HostdTestFixture *fixture;
    HostdCluster *cluster;
    HostdServer *server;
    char *socket_path;
} Host;

typedef struct {
    char *dir;
    VmTestEtcdMember etcd;
    Host h1, h2;
    char *saved_path;
} Lab;

static VmEtcd *
etcd_client(void)
{
    guint ports[] = {ETCD_CLIENT};
    return vm_test_etcd_client(ports, 1);
}

static void
etcd_start(Lab *lab)
{
    vm_test_etcd_member_init(&lab->etcd, lab->dir, "m0", ETCD_CLIENT, ETCD_PEER);
    vm_test_etcd_member_start(&lab->etcd, NULL);
    g_autoptr(VmEtcd) etcd = etcd_client();
    vm_test_etcd_wait_ready(etcd);
}

/* A stand-in ssh: drops its options and the destination, then runs the remote words (quoted
 * for a shell, as sshd would hand them to one). `vmctl` there is the one built here. */
static void
fake_ssh(Lab *lab)
{
    g_autofree char *bin = g_build_filename(lab->dir, "bin", NULL);
    g_autofree char *ssh = g_build_filename(bin, "ssh", NULL);
    g_autofree char *vmctl = g_build_filename(bin, "vmctl", NULL);
    const char *build_dir = g_getenv("VM_BUILD_DIR");
    g_autofree char *real =
        g_build_filename(build_dir != NULL ? build_dir : ".", "vmctl", "vmctl", NULL);
    const char *script = "#!/bin/sh\n"
                         "while [ $# -gt 0 ]; do\n"
                         "    case $1 in\n"
                         "    --) shift; break ;;\n"
                         "    -o|-p|-l) shift 2 ;;\n"
                         "    *) shift ;;\n"
                         "    esac\n"
                         "done\n"
                         "shift\n"
                         "exec sh -c \"$*\"\n";

    assert_int_equal(g_mkdir_with_parents(bin, 0700), 0);
    assert_true(g_file_set_contents(ssh, script, -1, NULL));
    assert_int_equal(g_chmod(ssh, 0700), 0);
    assert_int_equal(symlink(real, vmctl), 0);
    lab->saved_path = g_strdup(g_getenv("PATH"));
    g_autofree char *path = g_strconcat(bin, ":", lab->saved_path, NULL);
    g_setenv("PATH", path, TRUE);
}

static void
host_start(Lab *lab, Host *h, const char *id, guint port_min)
{
    g_autoptr(HostdClusterConfig) config = g_new0(HostdClusterConfig, 1);
    g_autoptr(GError) error = NULL;

    h->fixture = hostd_test_fixture_new();
    h->fixture->ctx->config->ssh_port_min = port_min;
    h->fixture->ctx->config->ssh_port_max = port_min + 19;
    h->socket_path = g_strdup_printf("%s/%s.sock", lab->dir, id);
    config->endpoints = g_new0(char *, 2);
    config->endpoints[0] = g_strdup("http://127.0.0.1:27100");
    config->host_id = g_strdup(id);
    config->address = g_strdup_printf("ssh://%s%s", id, h->socket_path);
    config->lease_ttl_s = 2;
    h->cluster = hostd_cluster_new(config, lab->dir, &error);
    if (h->cluster == NULL)
        fail_msg("%s", error->message);
    hostd_cluster_set_agents_func(h->cluster, hostd_agent_states, h->fixture->ctx);
    hostd_cluster_set_templates_func(h->cluster, hostd_template_names, h->fixture->ctx);
    h->fixture->ctx->cluster = h->cluster;
    hostd_cluster_start(h->cluster);
    gint64 end = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
    while (!hostd_cluster_registered(h->cluster)) {
        if (g_get_monotonic_time() > end)
            fail_msg("host '%s' did not register", id);
        g_usleep(50 * 1000);
    }
    h->server = hostd_server_start(h->fixture->ctx, h->socket_path, NULL, &error);
    if (h->server == NULL)
        fail_msg("%s", error->message);
}

static void
host_stop(Host *h)
{
    hostd_server_stop(g_steal_pointer(&h->server));
    if (h->cluster != NULL)
        hostd_cluster_stop(h->cluster, TRUE);
}

static void
host_free(Host *h)
{
    host_stop(h);
    if (h->fixture != NULL)
        h->fixture->ctx->cluster = NULL;
    g_clear_pointer(&h->cluster, hostd_cluster_free);
    g_clear_pointer(&h->fixture, hostd_test_fixture_free);
    g_clear_pointer(&h->socket_path, g_free);
}

static int
setup(void **state)
{
    if (!vm_test_etcd_installed()) {
        *state = NULL;
        return 0;
    }
    Lab *lab = g_new0(Lab, 1);
    lab->dir = g_dir_make_tmp("fleet-route-XXXXXX", NULL);
    etcd_start(lab);
    host_start(lab, &lab->h1, "h1", 27110);
    host_start(lab, &lab->h2, "h2", 27130);
    /* After the fixtures, which put their own bin first on PATH: restored before they go. */
    fake_ssh(lab);
    *state = lab;
    return 0;
}

static int
teardown(void **state)
{
    Lab *lab = *state;
    if (lab == NULL)
        return 0;
    if (lab->saved_path != NULL)
        g_setenv("PATH", lab->saved_path, TRUE);
    /* In the reverse order of their making: each fixture restores the PATH it found. */
    host_free(&lab->h2);
    host_free(&lab->h1);
    vm_test_etcd_member_clear(&lab->etcd);
    vm_remove_tree(lab->dir, NULL);
    g_free(lab->dir);
    g_free(lab->saved_path);
    g_free(lab);
    return 0;
}

static Lab *
lab_of(void **state)
{
    if (*state == NULL)
        skip();
    return *state;
}

/* Sends @op with @fields to @h's socket as vmctl does (following an elsewhere once). Returns the
 * RESULT, or NULL with @error; *@ret_followed (may be NULL) the host it was sent on to. */
static VmMessage *
ask(Host *h, VmOp op, const char *fields, VmctlRemote **ret_followed, GError **error)
{
    g_autoptr(VmMessage) request = hostd_test_request(op, fields);
    VmctlEndpoint endpoint = {.socket_path = h->socket_path};
    VmMessage *result = NULL;
    if (!vmctl_client_request_follow(&endpoint, request, NULL, NULL, NULL, &result, ret_followed,
                                     error))
        return NULL;
    return result;
}

/* Sends @op with @fields straight to @h's hostd and returns its last frame (no following). */
static VmMessage *
last_frame(Host *h, VmOp op, const char *fields)
{
    g_autoptr(VmMessage) request = hostd_test_request(op, fields);
    g_autoptr(GError) error = NULL;
    GThread *thread = NULL;
    int fd = hostd_test_serve(h->fixture, &thread);
    VmMessage *last = NULL;

    if (!vm_message_write_fd(fd, request, &error))
        fail_msg("cannot send: %s", error->message);
    for (;;) {
        gboolean eof = FALSE;
        VmMessage *m = vm_message_read_fd(fd, &eof, &error);
        if (m == NULL)
            break;
        vm_message_free(last);
        last = m;
    }
    g_thread_join(thread);
    close(fd);
    if (last == NULL)
        fail_msg("no answer");
    return last;
}

static char *
owner_of(const char *name)
{
    g_autoptr(VmEtcd) etcd = etcd_client();
    g_autoptr(GError) error = NULL;
    g_autofree char *key = vm_fleet_agent_key(name);
    g_autoptr(VmEtcdKv) kv = NULL;
    assert_true(vm_etcd_get(etcd, key, &kv, &error));
    if (kv == NULL)
        return NULL;
    gsize len;
    const char *data = g_bytes_get_data(kv->value, &len);
    g_autoptr(VmFleetAgent) agent = vm_fleet_agent_from_json(data, len, &error);
    assert_non_null(agent);
    return g_strdup(agent->host);
}

static gboolean
has_domain(Host *h, const char *name)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(h->fixture->ctx->lv, name, NULL);
    return dom != NULL;
}

#define NEW_FIELDS(name, extra)                                                                    \
    "{'name': <'" name "'>, 'cpus': <uint32 1>, 'memory_mib': <uint32 128>, "                      \
    "'wait': <false>" extra "}"

/* new --on h2 asked of h1: h1 answers elsewhere, vmctl sends it to h2, the agent is made there
 * and its record says h2; then info, stop and rm of it asked of h1 go there too. */
static void
test_new_on_and_follow(void **state)
{
    Lab *lab = lab_of(state);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmctlRemote) followed = NULL;

    g_autoptr(VmMessage) frame =
        last_frame(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("a1", ", 'on': <'h2'>"));
    assert_int_equal(frame->op, VM_OP_ELSEWHERE);
    assert_string_equal(vm_message_get_string(frame, "host", ""), "h2");
    g_autofree char *address = g_strdup_printf("ssh://h2%s", lab->h2.socket_path);
    assert_string_equal(vm_message_get_string(frame, "address", ""), address);
    assert_false(has_domain(&lab->h1, "a1"));

    g_autoptr(VmMessage) made =
        ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("a1", ", 'on': <'h2'>"), &followed, &error);
    if (made == NULL)
        fail_msg("%s", error->message);
    assert_non_null(followed);
    assert_string_equal(followed->host, "h2");
    assert_true(has_domain(&lab->h2, "a1"));
    assert_false(has_domain(&lab->h1, "a1"));
    g_autofree char *owner = owner_of("a1");
    assert_string_equal(owner, "h2");

    /* Asked of h1, answered by h2. */
    g_autoptr(VmMessage) info_frame = last_frame(&lab->h1, VM_OP_AGENT_INFO, "{'name': <'a1'>}");
    assert_int_equal(info_frame->op, VM_OP_ELSEWHERE);
    g_autofree char *said = g_strdup_printf("agent 'a1' is on host 'h2' (%s)", address);
    assert_string_equal(vm_message_get_string(info_frame, "message", ""), said);
    g_autoptr(VmMessage) info = ask(&lab->h1, VM_OP_AGENT_INFO, "{'name': <'a1'>}", NULL, &error);
    if (info == NULL)
        fail_msg("%s", error->message);
    g_autoptr(GVariant) agent = g_variant_lookup_value(info->fields, "agent", NULL);
    const char *name = NULL;
    assert_true(g_variant_lookup(agent, "name", "&s", &name));
    assert_string_equal(name, "a1");

    /* An unknown name is still this host's to answer. */
    g_autoptr(VmMessage) ghost =
        ask(&lab->h1, VM_OP_AGENT_INFO, "{'name': <'ghost'>}", NULL, &error);
    assert_null(ghost);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "ghost");
    g_clear_error(&error);

    /* rm through h1 removes it on h2 and frees the name. */
    g_autoptr(VmMessage) gone =
        ask(&lab->h1, VM_OP_AGENT_RM, "{'name': <'a1'>, 'force': <true>}", NULL, &error);
    if (gone == NULL)
        fail_msg("%s", error->message);
    assert_false(has_domain(&lab->h2, "a1"));
    g_autofree char *none = owner_of("a1");
    assert_null(none);
}

/* --on a host that cannot take it: each its own error and exit status, nothing made. */
static void
test_bad_on(void **state)
{
    Lab *lab = lab_of(state);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmMessage) r1 =
        ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("b1", ", 'on': <'h9'>"), NULL, &error);
    assert_null(r1);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no host 'h9' in the fleet");
    assert_int_equal(vm_error_exit_status(vm_error_code(error)), 3);
    g_clear_error(&error);

    g_autoptr(VmMessage) d =
        ask(&lab->h1, VM_OP_FLEET_DRAIN, "{'host': <'h2'>, 'drained': <true>}", NULL, &error);
    assert_non_null(d);
    g_autoptr(VmMessage) r2 =
        ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("b1", ", 'on': <'h2'>"), NULL, &error);
    assert_null(r2);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "host 'h2' is drained");
    assert_int_equal(vm_error_exit_status(vm_error_code(error)), 5);
    g_clear_error(&error);

    g_autoptr(VmMessage) r3 =
        ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("b1", ", 'on': <'h1'>, 'template': <'no-such'>"),
            NULL, &error);
    assert_null(r3);
    hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES,
                            "host 'h1' does not have template 'no-such'");
    g_clear_error(&error);

    g_autoptr(VmMessage) drain_unknown =
        ask(&lab->h1, VM_OP_FLEET_DRAIN, "{'host': <'h9'>, 'drained': <true>}", NULL, &error);
    assert_null(drain_unknown);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no host 'h9' in the fleet");
    g_clear_error(&error);

    assert_false(has_domain(&lab->h1, "b1"));
    assert_false(has_domain(&lab->h2, "b1"));
    g_autofree char *none = owner_of("b1");
    assert_null(none);
}

/* The row of host @id in fleet-hosts, asked of @h. */
static gboolean
shown_drained(Host *h, const char *id)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) r = ask(h, VM_OP_FLEET_HOSTS, NULL, NULL, &error);
    assert_non_null(r);
    g_autoptr(GVariant) hosts = g_variant_lookup_value(r->fields, "hosts", NULL);
    for (gsize i = 0; i < g_variant_n_children(hosts); i++) {
        g_autoptr(GVariant) row = g_variant_get_child_value(hosts, i);
        const char *rid = NULL;
        gboolean drained = FALSE;
        if (g_variant_lookup(row, "id", "&s", &rid) && g_str_equal(rid, id)) {
            assert_true(g_variant_lookup(row, "drained", "b", &drained));
            return drained;
        }
    }
    fail_msg("host '%s' not listed", id);
    return FALSE;
}

/* A drained host gets no new agent; its flag outlives its record's rewrites; undrained, it
 * takes agents again. */
static void
test_drain_placement(void **state)
{
    Lab *lab = lab_of(state);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmMessage) d1 =
        ask(&lab->h2, VM_OP_FLEET_DRAIN, "{'host': <'h1'>, 'drained': <true>}", NULL, &error);
    assert_non_null(d1);
    gboolean changed = FALSE;
    assert_true(g_variant_lookup(d1->fields, "changed", "b", &changed));
    assert_true(changed);
    /* h1 rewrites its record: the flag stays. */
    hostd_cluster_kick(lab->h1.cluster);
    g_usleep(500 * 1000);
    assert_true(shown_drained(&lab->h1, "h1"));
    assert_false(shown_drained(&lab->h1, "h2"));

    /* Placement asked of h1 puts it on h2. */
    g_autoptr(VmMessage) frame = last_frame(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("p1", ""));
    assert_int_equal(frame->op, VM_OP_ELSEWHERE);
    assert_string_equal(vm_message_get_string(frame, "host", ""), "h2");
    g_autoptr(VmMessage) p1 = ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("p1", ""), NULL, &error);
    if (p1 == NULL)
        fail_msg("%s", error->message);
    assert_true(has_domain(&lab->h2, "p1"));
    g_autofree char *owner = owner_of("p1");
    assert_string_equal(owner, "h2");

    /* Twice is no change. */
    g_autoptr(VmMessage) again =
        ask(&lab->h1, VM_OP_FLEET_DRAIN, "{'host': <'h1'>, 'drained': <true>}", NULL, &error);
    assert_true(g_variant_lookup(again->fields, "changed", "b", &changed));
    assert_false(changed);

    /* Both drained: none can take it, and the error says why of each. */
    g_autoptr(VmMessage) d2 =
        ask(&lab->h1, VM_OP_FLEET_DRAIN, "{'host': <'h2'>, 'drained': <true>}", NULL, &error);
    assert_non_null(d2);
    g_autoptr(VmMessage) none = ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("p2", ""), NULL, &error);
    assert_null(none);
    hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES,
                            "no host of the fleet can take it: host 'h1' is drained; "
                            "host 'h2' is drained");
    g_clear_error(&error);

    /* h1 undrained (and h2 still drained): placement asked of h2 makes it on h1. */
    g_autoptr(VmMessage) u1 =
        ask(&lab->h2, VM_OP_FLEET_DRAIN, "{'host': <'h1'>, 'drained': <false>}", NULL, &error);
    assert_non_null(u1);
    assert_false(shown_drained(&lab->h2, "h1"));
    g_autoptr(VmMessage) p2 = ask(&lab->h2, VM_OP_AGENT_NEW, NEW_FIELDS("p2", ""), NULL, &error);
    if (p2 == NULL)
        fail_msg("%s", error->message);
    assert_true(has_domain(&lab->h1, "p2"));
    g_autofree char *owner2 = owner_of("p2");
    assert_string_equal(owner2, "h1");
}

/* An agent whose host is down: a clear error naming the host, not a redirect. */
static void
test_owner_down(void **state)
{
    Lab *lab = lab_of(state);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmMessage) made =
        ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("c1", ", 'on': <'h2'>"), NULL, &error);
    if (made == NULL)
        fail_msg("%s", error->message);
    /* h2 leaves: its lease revoked, its record gone, c1's record still naming it. */
    host_stop(&lab->h2);
    g_autoptr(VmMessage) r = ask(&lab->h1, VM_OP_AGENT_INFO, "{'name': <'c1'>}", NULL, &error);
    assert_null(r);
    hostd_test_assert_error(error, VM_ERROR_NOT_RUNNING, NULL);
    assert_string_equal(error->message, "agent 'c1' is on host 'h2', which is down");
    g_clear_error(&error);
    g_autoptr(VmMessage) on =
        ask(&lab->h1, VM_OP_AGENT_NEW, NEW_FIELDS("c2", ", 'on': <'h2'>"), NULL, &error);
    assert_null(on);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "host 'h2' is down");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_new_on_and_follow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain_placement, setup, teardown),
        cmocka_unit_test_setup_teardown(test_owner_down, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
