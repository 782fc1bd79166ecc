/* Moves between hosts of a fleet (hostd-move.c; docs/CLUSTER.md, "Moves") over a real etcd (3.4)
 * on loopback and the test driver: what a source refuses to move, the mark a saved source keeps
 * (nothing starts it) and how it settles by the record, and what a target takes of the files a
 * client sends (names, sizes, SHA-256s). Replicas (hostd-replica.c) too: what the agent's host
 * lists and refuses, what a keeping host takes, keeps and refuses to recover from. The full move
 * and recovery of a real guest are vm-fleet.sh's. Ports
 * 27250-27251; the etcd started here is killed here, by its process. Skipped without etcd. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "hostd-agent.h"
#include "hostd-checkpoint-private.h"
#include "hostd-cluster.h"
#include "hostd-move.h"
#include "hostd-replica.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets.h"
#include "test-etcd-fixture.h"
#include "test-hostd-fixture.h"
#include "vm-error.h"
#include "vm-etcd.h"
#include "vm-fleet-records.h"
#include "vm-fs.h"

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CLIENT_PORT 27250
#define PEER_PORT   27251

static VmTestEtcdSuite *suite;

static int
suite_setup(void **state)
{
    suite = vm_test_etcd_suite_new("fleet-move", CLIENT_PORT, PEER_PORT);
    return 0;
}

static int
suite_teardown(void **state)
{
    g_clear_pointer(&suite, vm_test_etcd_suite_free);
    return 0;
}

static int
test_setup(void **state)
{
    return vm_test_etcd_suite_test_setup(suite);
}

static VmEtcd *
client(void)
{
    return vm_test_etcd_suite_client(suite);
}

static HostdCluster *
host_new(const char *id)
{
    guint ports[] = {CLIENT_PORT};
    return hostd_test_cluster_new(id, ports, 1, suite->dir);
}

/* Host @id's record, as its hostd would keep it: live, with the template and memory to spare. */
static void
host_put(const char *id)
{
    g_autoptr(VmEtcd) etcd = client();
    g_autoptr(VmFleetHost) host = vm_fleet_host_new(id, "ssh://root@lab");
    host->cores = 4;
    host->memory_mib = 8192;
    host->free_memory_mib = 8000;
    host->disk_gib = 100;
    host->free_disk_gib = 90;
    g_ptr_array_add(host->templates, g_strdup("debian-12"));
    g_autofree char *key = vm_fleet_host_key(id);
    g_autofree char *json = vm_fleet_host_to_json(host);
    g_autoptr(GError) error = NULL;
    if (!vm_etcd_put(etcd, key, json, -1, 0, &error))
        fail_msg("%s", error->message);
}

static void
record_put(const char *name, const char *host, guint64 epoch)
{
    g_autoptr(VmEtcd) etcd = client();
    vm_test_etcd_agent_put(etcd, name, host, epoch);
}

/* "HOST/EPOCH" of @name's record. */
static char *
record_of(const char *name)
{
    g_autoptr(VmEtcd) etcd = client();
    return vm_test_etcd_agent_owner(etcd, name);
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

/* What a source refuses to move, each with its reason, nothing changed. */
static void
test_move_refused(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h1 = host_new("h1");
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) plan = NULL;

    /* No fleet, no move. */
    plan = hostd_move_plan(f->ctx, "a1", "h2", NULL, NULL, &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_NOT_RUNNING, "in no fleet");
    g_clear_error(&error);

    f->ctx->cluster = h1;
    host_put("h1");
    host_put("h2");
    make_agent(f, "a1");
    make_agent(f, "held");
    make_agent(f, "secret");
    g_autofree char *owner = record_of("a1");
    assert_string_equal(owner, "h1/1");

    plan = hostd_move_plan(f->ctx, "a1", "h1", NULL, NULL, &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "is on host 'h1' already");
    g_clear_error(&error);

    plan = hostd_move_plan(f->ctx, "a1", "h9", NULL, NULL, &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no host 'h9'");
    g_clear_error(&error);

    plan = hostd_move_plan(f->ctx, "nope", "h2", NULL, NULL, &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nope");
    g_clear_error(&error);

    /* Another host's by the record: not this one's to move. */
    record_put("held", "h2", 4);
    plan = hostd_move_plan(f->ctx, "held", "h2", NULL, NULL, &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "not this host's in the fleet");
    g_clear_error(&error);

    /* A secret's value never leaves its host. */
    g_autofree char *grants = hostd_secrets_grants_dir(f->ctx);
    g_autofree char *placeholder = hostd_grants_add(grants, "secret", "token", &error);
    assert_non_null(placeholder);
    plan = hostd_move_plan(f->ctx, "secret", "h2", NULL, NULL, &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "holds secrets");
    g_clear_error(&error);

    /* A target whose base image is another's refuses at begin. */
    HostdMoveIn in = {
        .name = "b1",
        .from = "h2",
        .epoch = 1,
        .template_name = "debian-12",
        .cpus = 1,
        .memory_mib = 128,
        .disk_gib = 1,
        .base_sha256 = "0000000000000000000000000000000000000000000000000000000000000000",
        .source_dir = "/elsewhere/agents/b1",
        .base_path = "/elsewhere/images/debian-12/base.qcow2",
    };
    record_put("b1", "h2", 1);
    g_autoptr(GVariant) begun = hostd_move_begin(f->ctx, &in, &error);
    assert_null(begun);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "another base image");
    g_clear_error(&error);
    /* ...and one that has the name already. */
    in.name = "a1";
    begun = hostd_move_begin(f->ctx, &in, &error);
    assert_null(begun);
    hostd_test_assert_error(error, VM_ERROR_EXISTS, "already has a copy");
    g_clear_error(&error);

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

/* A source saved for its move starts nothing of the agent until the move settles; given up, it
 * takes the record back with a higher epoch (a target about to take it over fails). */
static void
test_move_saved_source_settles(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h1 = host_new("h1");
    g_autoptr(GError) error = NULL;

    f->ctx->cluster = h1;
    host_put("h1");
    host_put("h2");
    make_agent(f, "a1");
    /* Stopped: the test driver keeps no saved memory in a file to list. */
    g_autoptr(GVariant) stopped =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, &error));
    assert_non_null(stopped);

    g_autoptr(GVariant) plan =
        hostd_test_sink(hostd_move_plan(f->ctx, "a1", NULL, NULL, NULL, &error));
    if (plan == NULL)
        fail_msg("%s", error->message);
    /* Placement's choice: never the host it is on. */
    g_autofree char *to = hostd_test_dict_string(plan, "to");
    assert_string_equal(to, "h2");
    g_autoptr(GVariant) saved =
        hostd_test_sink(hostd_move_save(f->ctx, "a1", "h2", NULL, NULL, &error));
    if (saved == NULL)
        fail_msg("%s", error->message);
    g_autofree char *ini_path = hostd_test_agent_file(f, "a1", "agent.ini");
    g_autofree char *ini = NULL;
    assert_true(g_file_get_contents(ini_path, &ini, NULL, NULL));
    assert_non_null(strstr(ini, "moving-to=h2\n"));
    /* The save lists the agent's files, its record among them. */
    g_autofree char *listed = g_variant_print(saved, FALSE);
    assert_non_null(strstr(listed, "'agent.ini'"));

    assert_null(hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error));
    hostd_test_assert_error(error, VM_ERROR_BUSY, "is being moved to host 'h2'");
    g_clear_error(&error);
    /* A second move of it meanwhile is refused. */
    g_autoptr(GVariant) again = hostd_move_plan(f->ctx, "a1", "h2", NULL, NULL, &error);
    assert_null(again);
    hostd_test_assert_error(error, VM_ERROR_BUSY, "being moved already");
    g_clear_error(&error);

    g_autoptr(GVariant) settled = hostd_test_sink(hostd_move_abort_out(f->ctx, "a1", &error));
    if (settled == NULL)
        fail_msg("%s", error->message);
    g_autofree char *owner = record_of("a1");
    assert_string_equal(owner, "h1/2");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_null(r->moving_to);
    assert_int_equal(r->fleet_epoch, 2);
    /* A target that would take it over from the epoch the move began with fails. */
    assert_false(hostd_cluster_take(h1, "a1", "h1", 1, NULL, NULL, &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "epoch 2");
    g_clear_error(&error);
    g_autoptr(GVariant) started =
        hostd_test_sink(hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error));
    assert_non_null(started);
    g_autoptr(GVariant) stopped2 =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, &error));
    assert_non_null(stopped2);

    /* The record moved meanwhile (the target took it over): settling removes this copy. */
    g_autoptr(GVariant) plan2 =
        hostd_test_sink(hostd_move_plan(f->ctx, "a1", "h2", NULL, NULL, &error));
    assert_non_null(plan2);
    g_autoptr(GVariant) saved2 =
        hostd_test_sink(hostd_move_save(f->ctx, "a1", "h2", NULL, NULL, &error));
    assert_non_null(saved2);
    record_put("a1", "h2", 3);
    {
        g_autoptr(GPtrArray) records = hostd_state_load_records(f->ctx->state, NULL);
        hostd_move_tick(f->ctx, records); /* a client still heard from: left alone */
    }
    assert_true(g_file_test(ini_path, G_FILE_TEST_EXISTS));
    g_autoptr(GVariant) gone = hostd_test_sink(hostd_move_abort_out(f->ctx, "a1", &error));
    assert_non_null(gone);
    assert_false(g_file_test(ini_path, G_FILE_TEST_EXISTS));
    hostd_test_assert_logged("agent 'a1' moved to host 'h2': this host's copy removed");

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

/* Sends @data (split in frames) then STDIN_EOF as a client of move-write would, runs
 * hostd_move_write() on the other end and returns its EXIT's SHA-256 (NULL: @error). */
static char *
write_file(HostdTestFixture *f, const char *name, const char *file, gint64 size, const char *data,
           GError **error)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    gsize len = strlen(data);
    for (gsize off = 0; off < len; off += 5) {
        g_autoptr(VmMessage) m = vm_message_new_data(VM_OP_STDIN, data + off, MIN(5, len - off));
        assert_true(vm_message_write_fd(sv[0], m, NULL));
    }
    g_autoptr(VmMessage) eof = vm_message_new(VM_OP_STDIN_EOF, NULL, NULL);
    assert_true(vm_message_write_fd(sv[0], eof, NULL));
    VmStreamWriter reply = VM_STREAM_WRITER_INIT(sv[1]);
    gboolean ok = hostd_move_write(f->ctx, name, file, size, &reply, error);
    char *sha = NULL;
    if (ok) {
        g_autoptr(VmMessage) exit_msg = vm_message_read_fd(sv[0], NULL, NULL);
        assert_non_null(exit_msg);
        assert_int_equal(exit_msg->op, VM_OP_EXIT);
        sha = g_strdup(vm_message_get_string(exit_msg, "sha256", NULL));
    }
    close(sv[0]);
    close(sv[1]);
    return sha;
}

/* @f as host h2 of a fleet where h1 and h2 are live and agent b1 is h1's at epoch 5: a host
 * about to receive b1. */
static void
receiving_host(HostdTestFixture *f, HostdCluster *h2)
{
    f->ctx->cluster = h2;
    host_put("h1");
    host_put("h2");
    record_put("b1", "h1", 5);
}

/* The SHA-256 of the fixture's base image, as a source with the same image would send it. */
static char *
base_sha256(HostdTestFixture *f)
{
    g_autofree char *base = g_build_filename(f->images_dir, "debian-12", "base.qcow2", NULL);
    g_autofree char *bytes = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(base, &bytes, &len, NULL));
    return g_compute_checksum_for_data(G_CHECKSUM_SHA256, (const guchar *)bytes, len);
}

/* A target takes only files of a move it began, by plain names, exactly the bytes announced,
 * and commits only what came with the source's SHA-256. */
static void
test_move_target_files(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h2 = host_new("h2");
    g_autoptr(GError) error = NULL;

    receiving_host(f, h2);

    g_autofree char *sha = write_file(f, "b1", "disk.qcow2", 5, "12345", &error);
    assert_null(sha);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "no move of agent 'b1'");
    g_clear_error(&error);

    g_autofree char *base_sha = base_sha256(f);
    HostdMoveIn in = {
        .name = "b1",
        .from = "h1",
        .epoch = 4,
        .template_name = "debian-12",
        .cpus = 1,
        .memory_mib = 128,
        .disk_gib = 1,
        .base_sha256 = base_sha,
        .source_dir = "/elsewhere/agents/b1",
        .base_path = "/elsewhere/images/debian-12/base.qcow2",
    };
    g_autoptr(GVariant) begun = hostd_move_begin(f->ctx, &in, &error);
    assert_null(begun);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "not host 'h1''s with epoch 4");
    g_clear_error(&error);
    in.epoch = 5;
    begun = hostd_test_sink(hostd_move_begin(f->ctx, &in, &error));
    if (begun == NULL)
        fail_msg("%s", error->message);

    const char *bad_names[] = {"../agent.ini", ".hidden", "a/b", "move.save", "domain.xml"};
    for (gsize i = 0; i < G_N_ELEMENTS(bad_names); i++) {
        g_autofree char *s = write_file(f, "b1", bad_names[i], 1, "x", &error);
        assert_null(s);
        hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "is no file of a move");
        g_clear_error(&error);
    }
    g_autofree char *more = write_file(f, "b1", "disk.qcow2", 4, "12345", &error);
    assert_null(more);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "more bytes than the 4 announced");
    g_clear_error(&error);
    g_autofree char *fewer = write_file(f, "b1", "disk.qcow2", 9, "12345", &error);
    assert_null(fewer);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "5 bytes came of the 9 announced");
    g_clear_error(&error);

    /* A size past the host's free-space floor is refused before a byte is written. */
    hostd_checkpoint_test_space(1024 * 1024, 1024 * 1024 * 1024);
    g_autofree char *huge = write_file(f, "b1", "disk.qcow2", 5, "12345", &error);
    assert_null(huge);
    hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "free-space floor");
    g_clear_error(&error);
    hostd_checkpoint_test_space(0, 0);

    const char *text = "some disk bytes, in frames of five";
    g_autofree char *got = write_file(f, "b1", "disk.qcow2", (gint64)strlen(text), text, &error);
    if (got == NULL)
        fail_msg("%s", error->message);
    g_autofree char *expected =
        g_compute_checksum_for_data(G_CHECKSUM_SHA256, (const guchar *)text, strlen(text));
    assert_string_equal(got, expected);
    g_autofree char *incoming =
        g_build_filename(f->ctx->state->dir, HOSTD_MOVE_INCOMING_DIR, "b1", "disk.qcow2", NULL);
    g_autofree char *kept = NULL;
    assert_true(g_file_get_contents(incoming, &kept, NULL, NULL));
    assert_string_equal(kept, text);

    /* A commit naming a SHA-256 other than what came, or a file that never came, takes
     * nothing in. */
    g_autofree char *wrong = g_strdup_printf("%064d disk.qcow2", 0);
    char *files_wrong[] = {wrong, NULL};
    in.files = files_wrong;
    g_autoptr(GVariant) taken = hostd_move_commit(f->ctx, &in, NULL, NULL, &error);
    assert_null(taken);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "not the source's");
    g_clear_error(&error);
    g_autofree char *right = g_strdup_printf("%s disk.qcow2", expected);
    g_autofree char *missing = g_strdup_printf("%s agent.ini", expected);
    char *files_missing[] = {right, missing, NULL};
    in.files = files_missing;
    taken = hostd_move_commit(f->ctx, &in, NULL, NULL, &error);
    assert_null(taken);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "file agent.ini of the move never came");
    g_clear_error(&error);
    g_autofree char *dir = hostd_agent_dir(f->ctx, "b1");
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    g_autofree char *owner = record_of("b1");
    assert_string_equal(owner, "h1/5");

    /* Given up: its files go. */
    g_autoptr(GVariant) aborted = hostd_test_sink(hostd_move_abort_in(f->ctx, "b1", &error));
    assert_non_null(aborted);
    assert_false(g_file_test(incoming, G_FILE_TEST_EXISTS));

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

/* ---------------------------------------------------------------------------------------------
 * Replicas (hostd-replica.c) */

/* This host's [cluster] as far as replicas go: @n copies of each checkpoint. */
static void
set_replicate(HostdTestFixture *f, guint n)
{
    if (f->ctx->config->cluster == NULL)
        f->ctx->config->cluster = g_new0(HostdClusterConfig, 1);
    f->ctx->config->cluster->replicate = n;
}

/* What the agent's host refuses to replicate, and what its plan lists when it can. */
static void
test_replica_plan(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h1 = host_new("h1");
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) plan = NULL;

    plan = hostd_replica_plan(f->ctx, "a1", &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_NOT_RUNNING, "in no fleet");
    g_clear_error(&error);

    f->ctx->cluster = h1;
    host_put("h1");
    make_agent(f, "a1");
    make_agent(f, "held");
    set_replicate(f, 0);
    plan = hostd_replica_plan(f->ctx, "a1", &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "replicate is 0");
    g_clear_error(&error);

    /* Its own count holds over the host's, kept in its record; "host" gives it back. */
    g_autoptr(GVariant) own = hostd_test_sink(hostd_replica_set(f->ctx, "a1", TRUE, 0, &error));
    assert_non_null(own);
    set_replicate(f, 2);
    plan = hostd_replica_plan(f->ctx, "a1", &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "vmctl replicate --copies");
    g_clear_error(&error);
    g_autoptr(HostdAgentRecord) kept = hostd_test_agent_record(f, "a1");
    assert_true(kept->replicate_own);
    assert_int_equal(kept->replicate, 0);
    g_autoptr(GVariant) back = hostd_test_sink(hostd_replica_set(f->ctx, "a1", FALSE, 0, &error));
    assert_non_null(back);
    g_autoptr(HostdAgentRecord) host_count = hostd_test_agent_record(f, "a1");
    assert_false(host_count->replicate_own);
    g_autoptr(GVariant) too_many = hostd_replica_set(f->ctx, "a1", TRUE, 9, &error);
    assert_null(too_many);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "at most 8");
    g_clear_error(&error);

    plan = hostd_replica_plan(f->ctx, "a1", &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "no checkpoint yet");
    g_clear_error(&error);

    hostd_test_checkpoint_n(f, "a1", 2);
    /* The only host of the fleet keeps no replica of its own agents. */
    plan = hostd_replica_plan(f->ctx, "a1", &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "no other live host");
    g_clear_error(&error);

    record_put("held", "h2", 3);
    hostd_test_checkpoint_n(f, "held", 1);
    host_put("h2");
    plan = hostd_replica_plan(f->ctx, "held", &error);
    assert_null(plan);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "not this host's in the fleet");
    g_clear_error(&error);

    /* Two copies asked, one other host: it goes there. The overlay being written, memory and
     * logs stay out; the records and the frozen images are in. */
    plan = hostd_test_sink(hostd_replica_plan(f->ctx, "a1", &error));
    if (plan == NULL)
        fail_msg("%s", error->message);
    g_autofree char *listed = g_variant_print(plan, FALSE);
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *last = set->checkpoints->pdata[set->checkpoints->len - 1];
    g_autofree char *checkpoint = hostd_test_dict_string(plan, "checkpoint");
    assert_string_equal(checkpoint, last->id);
    assert_non_null(strstr(listed, "'host': <'h2'>"));
    assert_null(strstr(listed, "'host': <'h1'>"));
    assert_non_null(strstr(listed, "'agent.ini'"));
    assert_non_null(strstr(listed, "'checkpoints.ini'"));
    g_autofree char *frozen = g_strdup_printf("'%s'", last->image);
    assert_non_null(strstr(listed, frozen));
    g_autofree char *active = g_strdup_printf("'%s'", set->active);
    assert_null(strstr(listed, active));
    assert_null(strstr(listed, ".log'"));
    /* One copy at a time. */
    g_autoptr(GVariant) again = hostd_replica_plan(f->ctx, "a1", &error);
    assert_null(again);
    hostd_test_assert_error(error, VM_ERROR_BUSY, "being moved or copied");
    g_clear_error(&error);

    /* Done: the agent's record says where its replica is. */
    char *hosts[] = {"h2", NULL};
    g_autoptr(GVariant) done =
        hostd_test_sink(hostd_replica_done(f->ctx, "a1", last->id, hosts, &error));
    assert_non_null(done);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_string_equal(r->replicas, "h2");
    assert_string_equal(r->replicated, last->id);
    g_autoptr(GVariant) info = hostd_test_sink(hostd_agent_info(f->ctx, "a1", &error));
    g_autofree char *replica = hostd_test_dict_string(info, "replica");
    g_autofree char *expected = g_strdup_printf("%s on h2", last->id);
    assert_string_equal(replica, expected);

    /* A move takes over from a copy under way, whose end then leaves the move alone. */
    g_autoptr(GVariant) stopped =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, &error));
    assert_non_null(stopped);
    g_autoptr(GVariant) plan2 = hostd_test_sink(hostd_replica_plan(f->ctx, "a1", &error));
    assert_non_null(plan2);
    g_autoptr(GVariant) move =
        hostd_test_sink(hostd_move_plan(f->ctx, "a1", "h2", NULL, NULL, &error));
    if (move == NULL)
        fail_msg("%s", error->message);
    hostd_test_assert_logged("agent 'a1': its move stops the copy of its replica");
    g_autoptr(GVariant) late =
        hostd_test_sink(hostd_replica_done(f->ctx, "a1", last->id, hosts, &error));
    assert_non_null(late);
    g_autoptr(GVariant) saved =
        hostd_test_sink(hostd_move_save(f->ctx, "a1", "h2", NULL, NULL, &error));
    if (saved == NULL)
        fail_msg("%s", error->message);
    g_autoptr(GVariant) settled = hostd_test_sink(hostd_move_abort_out(f->ctx, "a1", &error));
    assert_non_null(settled);

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

/* The line of a replica's commit for @data sent as @file. */
static char *
replica_line(const char *file, const char *data, gint64 mtime)
{
    g_autofree char *sha =
        g_compute_checksum_for_data(G_CHECKSUM_SHA256, (const guchar *)data, strlen(data));
    return g_strdup_printf("%s %zu %" G_GINT64_FORMAT " %s", sha, strlen(data), mtime, file);
}

/* A keeping host takes a replica only whole and only with the source's SHA-256s, keeps the last
 * one until a new one is whole, says what it has so that it need not come again, and does not
 * recover from it while the agent's host is live or the agent moved since. */
static void
test_replica_keep(void **state)
{
    HostdTestFixture *f = hostd_test_fixture_new();
    g_autoptr(HostdCluster) h2 = host_new("h2");
    g_autoptr(GError) error = NULL;

    receiving_host(f, h2);
    g_autofree char *base_sha = base_sha256(f);
    HostdMoveIn in = {
        .name = "b1",
        .from = "h2",
        .epoch = 5,
        .template_name = "debian-12",
        .base_sha256 = base_sha,
        .source_dir = "/elsewhere/agents/b1",
        .base_path = "/elsewhere/images/debian-12/base.qcow2",
    };
    /* Not of its own agents, and only of the record's host and epoch. */
    g_autoptr(GVariant) begun = hostd_replica_begin(f->ctx, &in, &error);
    assert_null(begun);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "no replica of its own agent");
    g_clear_error(&error);
    in.from = "h1";
    in.epoch = 4;
    begun = hostd_replica_begin(f->ctx, &in, &error);
    assert_null(begun);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "not host 'h1''s with epoch 4");
    g_clear_error(&error);
    in.epoch = 5;
    begun = hostd_test_sink(hostd_replica_begin(f->ctx, &in, &error));
    if (begun == NULL)
        fail_msg("%s", error->message);
    g_autofree char *have = g_variant_print(begun, FALSE);
    assert_string_equal(have, "{'have': <@aa{sv} []>}");

    /* Its memory never comes; files come as in a move. */
    g_autofree char *memory = write_file(f, "b1", "@memory", 1, "x", &error);
    assert_null(memory);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "holds no memory");
    g_clear_error(&error);
    const char *record = "[agent]\nname=b1\n";
    const char *checkpoints = "[checkpoints]\n";
    const char *image = "frozen disk bytes";
    g_autofree char *s1 = write_file(f, "b1", "agent.ini", (gint64)strlen(record), record, &error);
    g_autofree char *s2 =
        write_file(f, "b1", "checkpoints.ini", (gint64)strlen(checkpoints), checkpoints, &error);
    g_autofree char *s3 = write_file(f, "b1", "disk.qcow2", (gint64)strlen(image), image, &error);
    assert_non_null(s1);
    assert_non_null(s2);
    assert_non_null(s3);

    /* A SHA-256 other than what came, a commit without the records, a bad line: nothing kept. */
    g_autofree char *l1 = replica_line("agent.ini", record, 11);
    g_autofree char *l2 = replica_line("checkpoints.ini", checkpoints, 12);
    g_autofree char *l3 = replica_line("disk.qcow2", image, 13);
    g_autofree char *bad = replica_line("disk.qcow2", "other bytes", 13);
    char *wrong[] = {l1, l2, bad, NULL};
    char *no_record[] = {l2, l3, NULL};
    char *garbage[] = {l1, "not a line", NULL};
    char **refused[] = {wrong, no_record, garbage};
    const char *why[] = {"not the source's", "needs agent.ini", "no \"SHA256 SIZE MTIME NAME\""};
    g_autofree char *kept = g_build_filename(f->ctx->state->dir, "replicas", "b1", NULL);
    for (gsize i = 0; i < G_N_ELEMENTS(refused); i++) {
        g_autoptr(GVariant) c = hostd_replica_commit(f->ctx, "b1", "c1", refused[i], &error);
        assert_null(c);
        hostd_test_assert_error(error, i == 2 ? VM_ERROR_INVALID_ARGUMENT : VM_ERROR_BAD_STATE,
                                why[i]);
        g_clear_error(&error);
        assert_false(g_file_test(kept, G_FILE_TEST_EXISTS));
    }
    char *whole[] = {l1, l2, l3, NULL};
    g_autoptr(GVariant) committed =
        hostd_test_sink(hostd_replica_commit(f->ctx, "b1", "c1", whole, &error));
    if (committed == NULL)
        fail_msg("%s", error->message);
    g_autofree char *kept_image = g_build_filename(kept, "disk.qcow2", NULL);
    g_autofree char *kept_bytes = NULL;
    assert_true(g_file_get_contents(kept_image, &kept_bytes, NULL, NULL));
    assert_string_equal(kept_bytes, image);
    hostd_test_assert_logged("replica of its checkpoint c1 from host 'h1' kept (epoch 5)");

    /* The next copy learns what is kept, sends only the new image, and names the old one by its
     * SHA-256; a file neither sent nor kept fails it, and the last replica stays whole. */
    g_autoptr(GVariant) begun2 = hostd_test_sink(hostd_replica_begin(f->ctx, &in, &error));
    assert_non_null(begun2);
    g_autofree char *have2 = g_variant_print(begun2, FALSE);
    g_autofree char *image_sha =
        g_compute_checksum_for_data(G_CHECKSUM_SHA256, (const guchar *)image, strlen(image));
    assert_non_null(strstr(have2, image_sha));
    assert_non_null(strstr(have2, "'mtime': <int64 13>"));
    const char *image2 = "the next frozen layer";
    g_autofree char *s4 =
        write_file(f, "b1", "disk-2.qcow2", (gint64)strlen(image2), image2, &error);
    assert_non_null(s4);
    g_autofree char *l4 = replica_line("disk-2.qcow2", image2, 14);
    g_autofree char *l5 = replica_line("disk-3.qcow2", "never sent", 15);
    char *missing[] = {l1, l2, l3, l4, l5, NULL};
    g_autoptr(GVariant) c2 = hostd_replica_commit(f->ctx, "b1", "c2", missing, &error);
    assert_null(c2);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "disk-3.qcow2 of the replica never came");
    g_clear_error(&error);
    char *next[] = {l1, l2, l3, l4, NULL};
    c2 = hostd_test_sink(hostd_replica_commit(f->ctx, "b1", "c2", next, &error));
    if (c2 == NULL)
        fail_msg("%s", error->message);
    g_autofree char *kept_image2 = g_build_filename(kept, "disk-2.qcow2", NULL);
    assert_true(g_file_test(kept_image2, G_FILE_TEST_IS_REGULAR));
    assert_true(g_file_test(kept_image, G_FILE_TEST_IS_REGULAR));

    /* Recovery: not while the agent's host is live, not from a replica older than the record,
     * not without a replica here. */
    g_autoptr(GVariant) back = hostd_replica_recover(f->ctx, "b1", NULL, NULL, &error);
    assert_null(back);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "which is live");
    g_clear_error(&error);
    g_autoptr(VmEtcd) etcd = client();
    g_autofree char *h1_key = vm_fleet_host_key("h1");
    assert_true(vm_etcd_delete(etcd, h1_key, NULL, NULL));
    record_put("b1", "h1", 6);
    back = hostd_replica_recover(f->ctx, "b1", NULL, NULL, &error);
    assert_null(back);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "older than the agent");
    g_clear_error(&error);
    record_put("c9", "h1", 1);
    back = hostd_replica_recover(f->ctx, "c9", NULL, NULL, &error);
    assert_null(back);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "holds no replica of agent 'c9'");
    g_clear_error(&error);

    /* The agent moved on: the replica serves no more and goes at the next sweep. */
    {
        g_autoptr(GPtrArray) records = hostd_state_load_records(f->ctx->state, NULL);
        hostd_replica_tick(f->ctx, records);
    }
    assert_false(g_file_test(kept, G_FILE_TEST_EXISTS));
    hostd_test_assert_logged("agent 'b1': replica removed (the agent moved since)");

    f->ctx->cluster = NULL;
    hostd_test_fixture_free(f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_move_refused, test_setup),
        cmocka_unit_test_setup(test_move_saved_source_settles, test_setup),
        cmocka_unit_test_setup(test_move_target_files, test_setup),
        cmocka_unit_test_setup(test_replica_plan, test_setup),
        cmocka_unit_test_setup(test_replica_keep, test_setup),
    };
    return cmocka_run_group_tests(tests, suite_setup, suite_teardown);
}
