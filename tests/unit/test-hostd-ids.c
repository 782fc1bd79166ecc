/* Agent ids (hostd-ids.c, hostd-confine.c): the lowest free id of the range, never one a record
 * or a running build holds, a clear error once the range is used up, the id in the record, the
 * agent-ids and worker-ids settings; the ACLs hostd writes; and, as root on libvirt's test
 * driver, `new`, `rm` and `fork` with ids on: each agent's files given to its id, the id free
 * again after rm, a fork's read access to its source's images given and taken back, and each
 * agent's workers on ids of their own. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pwd.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-checkpoint.h"
#include "hostd-config.h"
#include "hostd-confine.h"
#include "hostd-egress.h"
#include "hostd-fork.h"
#include "hostd-guest-api.h"
#include "hostd-ids.h"
#include "hostd-state.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-error.h"

#define ID0 HOSTD_AGENT_ID_MIN

static HostdAgentRecord *
record_with_id(const char *name, guint id)
{
    HostdAgentRecord *r = g_new0(HostdAgentRecord, 1);
    r->name = g_strdup(name);
    r->agent_id = id;
    return r;
}

/* The lowest id that no record and no build holds; records without an id take none. */
static void
test_pick_lowest(void **state)
{
    g_autoptr(GPtrArray) records =
        g_ptr_array_new_with_free_func((GDestroyNotify)hostd_agent_record_free);
    g_autoptr(GHashTable) held = g_hash_table_new(g_direct_hash, g_direct_equal);
    g_autoptr(GError) error = NULL;
    guint id = 0;

    assert_true(hostd_ids_pick(records, held, ID0, ID0 + 9, &id, &error));
    assert_int_equal(id, ID0);
    g_ptr_array_add(records, record_with_id("a", ID0));
    g_ptr_array_add(records, record_with_id("old", 0));
    g_ptr_array_add(records, record_with_id("c", ID0 + 2));
    assert_true(hostd_ids_pick(records, held, ID0, ID0 + 9, &id, &error));
    assert_int_equal(id, ID0 + 1);
    g_hash_table_add(held, GUINT_TO_POINTER(ID0 + 1));
    assert_true(hostd_ids_pick(records, held, ID0, ID0 + 9, &id, &error));
    assert_int_equal(id, ID0 + 3);
    /* An id freed (its record gone) is the next one given. */
    g_ptr_array_remove_index(records, 0);
    assert_true(hostd_ids_pick(records, held, ID0, ID0 + 9, &id, &error));
    assert_int_equal(id, ID0);
    assert_null(error);
}

/* An id that names a user or group of the host is someone's: never an agent's. */
static void
test_pick_skips_users(void **state)
{
    g_autoptr(GError) error = NULL;
    guint id = 0;

    /* root (0) is in every passwd; a range from it must skip it. */
    assert_true(hostd_ids_pick(NULL, NULL, 0 + 1, 5, &id, &error) || error != NULL);
    g_clear_error(&error);
    assert_true(hostd_ids_pick(NULL, NULL, getuid() == 0 ? 1 : getuid(), G_MAXINT32, &id, &error));
    assert_true(getpwuid(id) == NULL);
}

/* The range used up: a clear error naming it and where it is set. */
static void
test_pick_exhausted(void **state)
{
    g_autoptr(GPtrArray) records =
        g_ptr_array_new_with_free_func((GDestroyNotify)hostd_agent_record_free);
    g_autoptr(GHashTable) held = g_hash_table_new(g_direct_hash, g_direct_equal);
    g_autoptr(GError) error = NULL;
    guint id = 7;

    g_ptr_array_add(records, record_with_id("a", ID0));
    g_hash_table_add(held, GUINT_TO_POINTER(ID0 + 1));
    assert_false(hostd_ids_pick(records, held, ID0, ID0 + 1, &id, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_non_null(strstr(error->message, "1879048192-1879048193"));
    assert_non_null(strstr(error->message, "agent-ids"));
    assert_int_equal(id, 7);
}

/* The id is in the record, and a record from before ids loads with none. */
static void
test_record_keeps_id(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f, "a1");
    g_autoptr(GError) error = NULL;

    assert_int_equal(r->agent_id, 0);
    r->agent_id = ID0 + 5;
    assert_true(hostd_agent_record_save(r, &error));
    g_autoptr(HostdAgentRecord) loaded = hostd_agent_record_load(r->dir, &error);
    assert_non_null(loaded);
    assert_int_equal(loaded->agent_id, ID0 + 5);
    g_autoptr(HostdAgentRecord) copy = hostd_agent_record_copy(loaded);
    assert_int_equal(copy->agent_id, ID0 + 5);

    /* Root's id, or anything not a number, is no agent's: the record is refused. */
    g_autofree char *path = g_build_filename(r->dir, HOSTD_AGENT_RECORD, NULL);
    g_autofree char *text = vm_test_read_file(path);
    g_autoptr(GString) bad = g_string_new(text);
    g_string_replace(bad, "agent-id=1879048197", "agent-id=0", 0);
    assert_true(g_file_set_contents(path, bad->str, -1, NULL));
    g_autoptr(HostdAgentRecord) refused = hostd_agent_record_load(r->dir, &error);
    assert_null(refused);
    assert_non_null(strstr(error->message, "agent-id"));
}

/* agent-ids: a range or off, and the default is outside every range a host gives its users,
 * containers and subordinate ids. */
static void
test_config_agent_ids(void **state)
{
    g_autoptr(GError) error = NULL;
    guint min = 1, max = 1;

    assert_true(hostd_config_parse_agent_ids("off", &min, &max, &error));
    assert_int_equal(min, 0);
    assert_int_equal(max, 0);
    assert_true(hostd_config_parse_agent_ids("200000-265535", &min, &max, &error));
    assert_int_equal(min, 200000);
    assert_int_equal(max, 265535);
    const char *bad[] = {
        "",     "5", "0-100", "999-2000", "3000-2000", "1000-2147483648", "a-b", "1000-2000-3000",
        "-1000"};
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        assert_false(hostd_config_parse_agent_ids(bad[i], &min, &max, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        g_clear_error(&error);
    }
    assert_true(HOSTD_AGENT_ID_MIN > 1879048191u && HOSTD_AGENT_ID_MAX < 2147483648u);

    VmTestTmpDir *tmp = *state;
    g_autofree char *conf = g_build_filename(tmp->dir, "hostd.conf", NULL);
    assert_true(g_file_set_contents(conf, "[hostd]\nagent-ids = 2000-2999\n", -1, NULL));
    g_autoptr(HostdConfig) config = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
    assert_non_null(config);
    assert_int_equal(config->agent_id_min, 2000);
    assert_int_equal(config->agent_id_max, 2999);
    assert_true(g_file_set_contents(conf, "[hostd]\nagent-ids = 10-20\n", -1, NULL));
    g_autoptr(HostdConfig) refused = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
    assert_null(refused);
    assert_non_null(strstr(error->message, "agent-ids"));
    g_autoptr(HostdConfig) defaults = hostd_config_load(NULL, tmp->dir, NULL, NULL, NULL);
    assert_int_equal(defaults->agent_id_min, HOSTD_AGENT_ID_MIN);
    assert_int_equal(defaults->agent_id_max, HOSTD_AGENT_ID_MAX);
}

/* worker-ids: right after agent-ids and thrice its size unless set; off; refused when it
 * overlaps agent-ids, is too small for three ids per agent id, leaves no room, or holds a user's
 * id. */
static void
test_config_worker_ids(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *conf = g_build_filename(tmp->dir, "hostd.conf", NULL);
    g_autoptr(GError) error = NULL;
    const struct passwd *nobody = getpwnam("nobody");

    g_autoptr(HostdConfig) defaults = hostd_config_load(NULL, tmp->dir, NULL, NULL, &error);
    assert_non_null(defaults);
    assert_int_equal(defaults->worker_id_min, HOSTD_AGENT_ID_MAX + 1);
    assert_int_equal(defaults->worker_id_max,
                     HOSTD_AGENT_ID_MAX + 3 * (HOSTD_AGENT_ID_MAX - HOSTD_AGENT_ID_MIN + 1));
    assert_true(defaults->worker_id_max < 2147483648u);

    assert_true(g_file_set_contents(conf, "[hostd]\nagent-ids = 2000000-2000999\n", -1, NULL));
    g_autoptr(HostdConfig) after = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
    assert_non_null(after);
    assert_int_equal(after->worker_id_min, 2001000);
    assert_int_equal(after->worker_id_max, 2003999);

    assert_true(g_file_set_contents(
        conf, "[hostd]\nagent-ids = 2000000-2000999\nworker-ids = 3000000-3002999\n", -1, NULL));
    g_autoptr(HostdConfig) given = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
    assert_non_null(given);
    assert_int_equal(given->worker_id_min, 3000000);
    assert_int_equal(given->worker_id_max, 3002999);

    assert_true(g_file_set_contents(conf, "[hostd]\nworker-ids = off\n", -1, NULL));
    g_autoptr(HostdConfig) off = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
    assert_non_null(off);
    assert_int_equal(off->worker_id_min, 0);
    assert_int_equal(off->worker_id_max, 0);

    static const struct {
        const char *text;
        const char *says;
    } refused[] = {
        {"agent-ids = 2000000-2000999\nworker-ids = 2000500-2003499\n", "overlaps agent-ids"},
        {"agent-ids = 2000000-2000999\nworker-ids = 3000000-3002998\n", "three ids"},
        {"agent-ids = 2000000000-2100000000\n", "no room"},
        {"worker-ids = 5-10\n", "worker-ids must be MIN-MAX"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(refused); i++) {
        g_autofree char *text = g_strconcat("[hostd]\n", refused[i].text, NULL);
        assert_true(g_file_set_contents(conf, text, -1, NULL));
        g_autoptr(HostdConfig) bad = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
        assert_null(bad);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        if (strstr(error->message, refused[i].says) == NULL)
            fail_msg("'%s': %s", refused[i].text, error->message);
        g_clear_error(&error);
    }
    /* A range that holds a user of the host, named in the error. */
    if (nobody != NULL && nobody->pw_uid >= 1000) {
        g_autofree char *text =
            g_strdup_printf("[hostd]\nagent-ids = 1000000-1000009\n"
                            "worker-ids = %u-%u\n",
                            (guint)nobody->pw_uid - 15, (guint)nobody->pw_uid + 15);
        assert_true(g_file_set_contents(conf, text, -1, NULL));
        g_autoptr(HostdConfig) bad = hostd_config_load(conf, tmp->dir, NULL, NULL, &error);
        assert_null(bad);
        assert_non_null(strstr(error->message, "user nobody"));
        g_clear_error(&error);
    }
    assert_true(hostd_ids_range_check_free("worker-ids", HOSTD_AGENT_ID_MAX + 1,
                                           HOSTD_AGENT_ID_MAX + 10, &error));
    assert_false(hostd_ids_range_check_free("worker-ids", 0, 0, &error));
    assert_non_null(strstr(error->message, "root"));
}

/* The three thirds of worker-ids: slot s's SSH worker the s-th id of the first, its egress
 * worker the s-th of the second, its in-guest API worker the s-th of the third. */
static void
test_worker_mapping(void **state)
{
    assert_int_equal(hostd_ids_worker(5000, 5011, 0, HOSTD_WORKER_SSH), 5000);
    assert_int_equal(hostd_ids_worker(5000, 5011, 3, HOSTD_WORKER_SSH), 5003);
    assert_int_equal(hostd_ids_worker(5000, 5011, 0, HOSTD_WORKER_EGRESS), 5004);
    assert_int_equal(hostd_ids_worker(5000, 5011, 3, HOSTD_WORKER_EGRESS), 5007);
    assert_int_equal(hostd_ids_worker(5000, 5011, 0, HOSTD_WORKER_API), 5008);
    assert_int_equal(hostd_ids_worker(5000, 5011, 3, HOSTD_WORKER_API), 5011);
    /* a range not a multiple of three: the last ids are no one's */
    assert_int_equal(hostd_ids_worker(5000, 5013, 3, HOSTD_WORKER_API), 5011);
}

/* The ACL hostd writes: the readers it names (sorted, once each), the mode it asked for, and
 * nothing left when there are none. Owner and group stay the caller's (no privilege needed). */
static void
test_acl(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *path = g_build_filename(tmp->dir, "image.qcow2", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GArray) readers = g_array_new(FALSE, FALSE, sizeof(guint));
    const guint ids[] = {ID0 + 3, ID0 + 1, ID0 + 3};
    struct stat st;

    assert_true(g_file_set_contents(path, "x", -1, NULL));
    assert_true(hostd_ids_own(path, getuid(), getgid(), 0440, ids, G_N_ELEMENTS(ids), 4, &error));
    assert_true(hostd_ids_read_acl(path, readers, &error));
    assert_int_equal(readers->len, 2);
    assert_int_equal(g_array_index(readers, guint, 0), ID0 + 1);
    assert_int_equal(g_array_index(readers, guint, 1), ID0 + 3);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0440);

    g_array_set_size(readers, 0);
    assert_true(hostd_ids_own(path, getuid(), getgid(), 0400, NULL, 0, 0, &error));
    assert_true(hostd_ids_read_acl(path, readers, &error));
    assert_int_equal(readers->len, 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0400);

    /* A link is never followed. */
    g_autofree char *link = g_build_filename(tmp->dir, "link", NULL);
    assert_int_equal(symlink(path, link), 0);
    assert_false(hostd_ids_own(link, getuid(), getgid(), 0644, NULL, 0, 0, &error));
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0400);
}

/* ---- with ids on, as root ------------------------------------------------------------------ */

static HostdTestFixture *
fixture_with_ids(void **state, guint n)
{
    HostdTestFixture *f = *state;
    f->ctx->agent_ids = TRUE;
    f->ctx->config->agent_id_min = ID0;
    f->ctx->config->agent_id_max = ID0 + n - 1;
    /* hostd reads an agent's image headers as the agent's id: as in a real state directory
     * (0711), that id must reach them; and the fake qemu-img it then runs logs as that id. */
    if (geteuid() == 0) {
        assert_int_equal(chmod(f->dir, 0711), 0);
        static const char *const logs[] = {"qemu-img.log", "qemu-img.opened", "qemu-img.uids"};
        for (gsize i = 0; i < G_N_ELEMENTS(logs); i++) {
            g_autofree char *log = g_build_filename(f->dir, logs[i], NULL);
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
            assert_true(fd >= 0);
            assert_int_equal(fchmod(fd, 0666), 0);
            close(fd);
        }
    }
    return f;
}

static GVariant *
new_agent(HostdTestFixture *f, const char *name, GError **error)
{
    HostdNewRequest req = {.name = name, .cpus = 1, .memory_mib = 128};
    return hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, error));
}

static void
new_ok(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) info = new_agent(f, name, &error);
    if (info == NULL)
        fail_msg("new %s: %s", name, error->message);
}

static void
assert_owned(HostdTestFixture *f, const char *name, const char *file, guint uid, guint gid,
             guint mode)
{
    g_autofree char *path = hostd_test_agent_file(f, name, file);
    struct stat st;
    if (lstat(path, &st) < 0)
        fail_msg("no %s", path);
    if (st.st_uid != uid || st.st_gid != gid || (st.st_mode & 0777) != mode)
        fail_msg("%s is %u:%u %o, not %u:%u %o", path, (guint)st.st_uid, (guint)st.st_gid,
                 (guint)(st.st_mode & 0777), uid, gid, mode);
}

static guint
readers_of(const char *path, guint *first)
{
    g_autoptr(GArray) readers = g_array_new(FALSE, FALSE, sizeof(guint));
    g_autoptr(GError) error = NULL;
    assert_true(hostd_ids_read_acl(path, readers, &error));
    if (first != NULL)
        *first = readers->len > 0 ? g_array_index(readers, guint, 0) : 0;
    return readers->len;
}

/* `new` gives each agent the lowest free id, its files to it, its QEMU the label; `rm` frees
 * the id for the next agent; a used-up range refuses `new` with nothing made. */
static void
test_new_rm(void **state)
{
    if (geteuid() != 0)
        skip();
    HostdTestFixture *f = fixture_with_ids(state, 2);
    g_autoptr(GError) error = NULL;

    new_ok(f, "a1");
    new_ok(f, "a2");
    g_autoptr(HostdAgentRecord) a1 = hostd_test_agent_record(f, "a1");
    g_autoptr(HostdAgentRecord) a2 = hostd_test_agent_record(f, "a2");
    assert_int_equal(a1->agent_id, ID0);
    assert_int_equal(a2->agent_id, ID0 + 1);
    assert_owned(f, "a1", ".", 0, ID0, 0710);
    assert_owned(f, "a1", HOSTD_AGENT_DISK, ID0, ID0, 0600);
    assert_owned(f, "a1", HOSTD_AGENT_SEED, ID0, ID0, 0400);
    assert_owned(f, "a2", HOSTD_AGENT_DISK, ID0 + 1, ID0 + 1, 0600);
    g_autofree char *xml_path = hostd_test_agent_file(f, "a2", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml = vm_test_read_file(xml_path);
    assert_non_null(strstr(xml, "<seclabel type='static' model='dac' relabel='no'>\n"
                                "    <label>+1879048193:+1879048193</label>"));

    g_autoptr(GVariant) refused = new_agent(f, "a3", &error);
    assert_null(refused);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_non_null(strstr(error->message, "no free agent id"));
    g_autofree char *a3_dir = hostd_test_agent_file(f, "a3", ".");
    assert_false(g_file_test(a3_dir, G_FILE_TEST_EXISTS));
    g_clear_error(&error);

    assert_true(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    new_ok(f, "a3");
    g_autoptr(HostdAgentRecord) a3 = hostd_test_agent_record(f, "a3");
    assert_int_equal(a3->agent_id, ID0);
}

/* A fork reads its source's checkpoint images through an ACL entry for its id (and traverses
 * the source's dir), and nothing else of the source's; rm of the fork takes both back. */
static void
test_fork_acl(void **state)
{
    if (geteuid() != 0)
        skip();
    HostdTestFixture *f = fixture_with_ids(state, 4);
    g_autoptr(GError) error = NULL;

    new_ok(f, "src");
    g_autofree char *warning = NULL;
    g_autoptr(GVariant) c1 = hostd_test_sink(
        hostd_checkpoint_create(f->ctx, "src", NULL, FALSE, FALSE, &warning, &error));
    if (c1 == NULL)
        fail_msg("checkpoint: %s", error->message);
    g_autofree char *checkpoint = NULL;
    HostdForkRequest req = {.name = "f1", .source = "src", .checkpoint = NULL};
    g_autoptr(GVariant) forked =
        hostd_test_sink(hostd_fork(f->ctx, &req, &checkpoint, NULL, NULL, &error));
    if (forked == NULL)
        fail_msg("fork: %s", error->message);
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_record(f, "src");
    g_autoptr(HostdAgentRecord) fork = hostd_test_agent_record(f, "f1");
    if (fork->agent_id != ID0 + 1)
        fail_msg("fork id %u", fork->agent_id);

    guint who = 0;
    assert_int_equal(readers_of(fork->fork_base, &who), 1);
    assert_int_equal(who, fork->agent_id);
    assert_int_equal(readers_of(src->dir, &who), 1);
    assert_int_equal(who, fork->agent_id);
    struct stat st;
    assert_int_equal(stat(fork->fork_base, &st), 0);
    assert_int_equal(st.st_uid, 0);
    assert_int_equal(st.st_gid, src->agent_id);
    assert_int_equal(st.st_mode & 0077, 0040);
    /* The source's own overlay and seed stay its alone. */
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "src");
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    assert_int_equal(readers_of(active, NULL), 0);
    assert_owned(f, "src", set->active, src->agent_id, src->agent_id, 0600);

    assert_true(hostd_agent_rm(f->ctx, "f1", TRUE, &error));
    assert_int_equal(readers_of(fork->fork_base, NULL), 0);
    assert_int_equal(readers_of(src->dir, NULL), 0);
    assert_owned(f, "src", ".", 0, src->agent_id, 0710);
}

/* Removing a stopped agent's checkpoint rebases the image above it: qemu-img, which reads the
 * guest-written chain and writes that image, runs as the agent's id, which may write its
 * checkpoint images only for the rebase's time; overlays are made without reading any image, so
 * they may run as hostd. */
static void
test_rebase_as_agent(void **state)
{
    if (geteuid() != 0)
        skip();
    HostdTestFixture *f = fixture_with_ids(state, 2);
    g_autoptr(GError) error = NULL;

    new_ok(f, "a1");
    hostd_test_checkpoint_n(f, "a1", 2);
    g_autoptr(GVariant) stopped =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, &error));
    if (stopped == NULL)
        fail_msg("stop: %s", error->message);
    g_autoptr(VmCheckpointSet) before = hostd_test_checkpoints(f, "a1");
    const VmCheckpoint *c2 = vm_checkpoint_set_find(before, "c2");
    g_autofree char *uids_path = g_build_filename(f->dir, "qemu-img.uids", NULL);
    assert_int_equal(truncate(uids_path, 0), 0);

    if (!hostd_checkpoint_rm(f->ctx, "a1", "c1", &error))
        fail_msg("rm c1: %s", error->message);
    g_autofree char *uids = vm_test_read_file(uids_path);
    g_autofree char *as_agent = g_strdup_printf("%u rebase\n", ID0);
    if (strstr(uids, as_agent) == NULL)
        fail_msg("no rebase as the agent's id in:\n%s", uids);
    assert_null(strstr(uids, "\n0 rebase"));
    assert_null(strstr(uids, "\n0 info"));
    assert_false(g_str_has_prefix(uids, "0 "));
    /* The checkpoint image it wrote is read-only to the agent again. */
    assert_owned(f, "a1", c2->image, 0, ID0, 0440);
    g_autoptr(VmCheckpointSet) after = hostd_test_checkpoints(f, "a1");
    assert_null(vm_checkpoint_set_find(after, "c1"));
    assert_non_null(vm_checkpoint_set_find(after, "c2"));
}

/* An agent made before agent ids gets one when it next boots from its disk: recorded, in its
 * definition (libvirt's and hostd's copy), and its files given to it; one resuming a saved state
 * keeps its old user until then. */
static void
test_adopt_at_start(void **state)
{
    if (geteuid() != 0)
        skip();
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) before = hostd_test_agent_new(f, "old", HOSTD_TEST_STOPPED);
    g_autoptr(HostdAgentRecord) saved = hostd_test_agent_new(f, "sav", HOSTD_TEST_SAVED);
    assert_int_equal(before->agent_id, 0);
    fixture_with_ids(state, 4);

    g_autoptr(GVariant) info =
        hostd_test_sink(hostd_agent_start(f->ctx, "old", FALSE, NULL, NULL, &error));
    if (info == NULL)
        fail_msg("start: %s", error->message);
    g_autoptr(HostdAgentRecord) after = hostd_test_agent_record(f, "old");
    assert_int_equal(after->agent_id, ID0);
    g_autofree char *xml_path = hostd_test_agent_file(f, "old", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml = vm_test_read_file(xml_path);
    assert_non_null(strstr(xml, "<label>+1879048192:+1879048192</label>"));
    g_autoptr(virDomain) dom = virDomainLookupByName(f->ctx->lv->conn, "old");
    g_autofree char *defined = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(strstr(defined, "+1879048192:+1879048192"));
    assert_owned(f, "old", HOSTD_AGENT_DISK, ID0, ID0, 0600);
    assert_owned(f, "old", ".", 0, ID0, 0710);

    g_autoptr(GVariant) woken =
        hostd_test_sink(hostd_agent_start(f->ctx, "sav", FALSE, NULL, NULL, &error));
    if (woken == NULL)
        fail_msg("start of the saved agent: %s", error->message);
    g_autoptr(HostdAgentRecord) sav = hostd_test_agent_record(f, "sav");
    assert_int_equal(sav->agent_id, 0);
}

/* Whom an agent's workers run as (hostd_confine_worker_user()), as root: each agent's SSH and
 * egress workers have ids of their own from worker-ids, derived from its id (nothing new in its
 * record), distinct from every agent id and from each other; an agent without an id gets a slot
 * of its own for hostd's run, whose agent id no new agent takes, free again at its rm; an id
 * that names a user is refused. */
static void
test_worker_ids(void **state)
{
    if (geteuid() != 0)
        skip();
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) old = hostd_test_agent_new(f, "old", HOSTD_TEST_STOPPED);
    g_autoptr(HostdAgentRecord) old2 = hostd_test_agent_new(f, "old2", HOSTD_TEST_STOPPED);
    fixture_with_ids(state, 4);
    const HostdConfig *config = f->ctx->config;
    guint third = HOSTD_IDS_WORKER_SLOTS(config->worker_id_min, config->worker_id_max);
    g_autoptr(GHashTable) seen = g_hash_table_new(g_direct_hash, g_direct_equal);

    new_ok(f, "a1");
    new_ok(f, "a2");
    g_autoptr(HostdAgentRecord) a1 = hostd_test_agent_record(f, "a1");
    g_autoptr(HostdAgentRecord) a2 = hostd_test_agent_record(f, "a2");
    const struct {
        const char *name;
        guint agent_id;
        guint slot;
    } agents[] = {
        {"a1", a1->agent_id, 0},
        {"a2", a2->agent_id, 1},
        {"old", 0, 2}, /* the lowest slot no agent id's is */
        {"old2", 0, 3},
    };
    for (guint i = 0; i < 4; i++)
        g_hash_table_add(seen, GUINT_TO_POINTER(ID0 + i));
    for (gsize i = 0; i < G_N_ELEMENTS(agents); i++) {
        for (HostdWorkerKind kind = HOSTD_WORKER_SSH; kind <= HOSTD_WORKER_API; kind++) {
            gboolean change = FALSE;
            guint uid = 0, gid = 0, again = 0;
            if (!hostd_confine_worker_user(f->ctx, agents[i].name, agents[i].agent_id, kind,
                                           &change, &uid, &gid, &error))
                fail_msg("%s: %s", agents[i].name, error->message);
            assert_true(change);
            assert_int_equal(uid, gid);
            assert_int_equal(uid, config->worker_id_min + agents[i].slot + (guint)kind * third);
            /* none an agent's QEMU's, none another worker's */
            if (g_hash_table_contains(seen, GUINT_TO_POINTER(uid)))
                fail_msg("%s's worker runs as %u, an id already someone's", agents[i].name, uid);
            g_hash_table_add(seen, GUINT_TO_POINTER(uid));
            assert_null(getpwuid(uid));
            /* the same for as long as hostd runs */
            assert_true(hostd_confine_worker_user(f->ctx, agents[i].name, agents[i].agent_id, kind,
                                                  &change, &again, &gid, &error));
            assert_int_equal(again, uid);
        }
    }
    /* The real egress and in-guest API workers `new` started run as those ids; as a1's egress
     * worker's, a1's disk (its QEMU's) does not open, as it does for a1's id. */
    for (gsize i = 0; i < 2 * 2; i++) {
        HostdWorkerKind kind = i < 2 ? HOSTD_WORKER_EGRESS : HOSTD_WORKER_API;
        const char *name = agents[i % 2].name;
        GPid pid = kind == HOSTD_WORKER_EGRESS ? hostd_egress_worker_pid(f->ctx, name)
                                               : hostd_guest_api_pid(f->ctx, name);
        guint uid = 0, gid = 0;
        assert_true(pid > 0);
        vm_test_proc_ids(pid, &uid, &gid);
        assert_int_equal(uid, config->worker_id_min + agents[i % 2].slot + (guint)kind * third);
        assert_int_equal(gid, uid);
    }
    g_autofree char *disk = hostd_test_agent_file(f, "a1", HOSTD_AGENT_DISK);
    guint egress_id = config->worker_id_min + third;
    assert_int_equal(vm_test_try_as(a1->agent_id, a1->agent_id, disk, O_RDWR, 0), 0);
    assert_int_equal(vm_test_try_as(egress_id, egress_id, disk, O_RDONLY, 0), EACCES);
    assert_int_equal(
        vm_test_try_as(config->worker_id_min, config->worker_id_min, disk, O_RDONLY, 0), EACCES);

    /* The records are as they were: the workers' ids are derived. */
    g_autofree char *record_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_RECORD);
    g_autofree char *record = vm_test_read_file(record_path);
    assert_null(strstr(record, "worker"));

    /* The slots of "old" and "old2" hold their agent ids: the range (4) is used up. */
    g_autoptr(GVariant) refused = new_agent(f, "a3", &error);
    assert_null(refused);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    g_clear_error(&error);
    assert_true(hostd_agent_rm(f->ctx, "old", TRUE, &error));
    new_ok(f, "a3");
    g_autoptr(HostdAgentRecord) a3 = hostd_test_agent_record(f, "a3");
    assert_int_equal(a3->agent_id, ID0 + 2);

    /* A worker id that names a user of the host (made after the start-up check) is refused, at
     * the first worker of an agent (whose ids were not checked yet). */
    const struct passwd *nobody = getpwnam("nobody");
    if (nobody != NULL && nobody->pw_uid >= 3) {
        gboolean change = FALSE;
        guint uid = 0, gid = 0;
        f->ctx->config->worker_id_min = nobody->pw_uid - 3;
        f->ctx->config->worker_id_max = nobody->pw_uid + 8;
        assert_false(hostd_confine_worker_user(f->ctx, "late", ID0 + 3, HOSTD_WORKER_EGRESS,
                                               &change, &uid, &gid, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(error->message, "a user or group"));
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_lowest),
        cmocka_unit_test(test_pick_skips_users),
        cmocka_unit_test(test_pick_exhausted),
        cmocka_unit_test_setup_teardown(test_record_keeps_id, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_config_agent_ids, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_config_worker_ids, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test(test_worker_mapping),
        cmocka_unit_test_setup_teardown(test_acl, vm_test_tmpdir_setup, vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_new_rm, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_fork_acl, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_rebase_as_agent, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_adopt_at_start, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_worker_ids, hostd_test_setup, hostd_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
