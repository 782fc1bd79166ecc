/* hostd's state directory: agent records survive a save/load round trip and are written
 * privately and atomically, damaged records are refused with the file named, one hostd per
 * state dir. Tree removal (vm_remove_tree()) is tested in test-fs.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-state.h"
#include "vm-error.h"
#include "vm-util.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* ---- helpers ------------------------------------------------------------------------------- */

static HostdAgentRecord *
sample_record(const char *dir)
{
    HostdAgentRecord *r = g_new0(HostdAgentRecord, 1);

    r->dir = g_strdup(dir);
    r->name = g_strdup("alice");
    r->uuid = g_strdup("0b6f1f0e-3c1d-4f7e-9a51-6b2d1f0c9e11");
    r->template_name = g_strdup("debian-12");
    r->phase = g_strdup(HOSTD_PHASE_READY);
    r->cpus = 2;
    r->memory_mib = 1536;
    r->disk_gib = 20;
    r->disk_limits[VM_DISK_READ_MIB] = 300;
    r->disk_limits[VM_DISK_WRITE_MIB] = 0;
    r->disk_limits[VM_DISK_READ_IOPS] = 1000000;
    r->disk_limits[VM_DISK_WRITE_IOPS] = 9;
    r->ssh_port = 42217;
    r->mac = g_strdup("52:54:00:12:ab:ef");
    r->user = g_strdup("agent");
    r->instance_id = g_strdup("vmctl-0b6f1f0e-3c1d-4f7e-9a51-6b2d1f0c9e11");
    r->forked_from = NULL;
    r->created = 1700000000;
    r->state_since = 1700000123;
    return r;
}

static void
assert_records_equal(const HostdAgentRecord *a, const HostdAgentRecord *b)
{
    assert_string_equal(a->dir, b->dir);
    assert_string_equal(a->name, b->name);
    assert_string_equal(a->uuid, b->uuid);
    assert_string_equal(a->template_name, b->template_name);
    assert_string_equal(a->phase, b->phase);
    assert_int_equal(a->cpus, b->cpus);
    assert_int_equal(a->memory_mib, b->memory_mib);
    assert_int_equal(a->disk_gib, b->disk_gib);
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_int_equal(a->disk_limits[i], b->disk_limits[i]);
    assert_int_equal(a->ssh_port, b->ssh_port);
    assert_string_equal(a->mac, b->mac);
    assert_string_equal(a->user, b->user);
    assert_string_equal(a->instance_id, b->instance_id);
    if (a->forked_from == NULL || b->forked_from == NULL)
        assert_ptr_equal(a->forked_from, b->forked_from);
    else
        assert_string_equal(a->forked_from, b->forked_from);
    if (a->forked_from != NULL) {
        assert_string_equal(a->fork_checkpoint, b->fork_checkpoint);
        assert_string_equal(a->fork_base, b->fork_base);
    }
    assert_int_equal(a->checkpoint_hourly, b->checkpoint_hourly);
    assert_int_equal(a->checkpoint_daily, b->checkpoint_daily);
    assert_int_equal(a->grow_fs, b->grow_fs);
    assert_int_equal(a->created, b->created);
    assert_int_equal(a->state_since, b->state_since);
    assert_string_equal(a->domain != NULL ? a->domain : "(none)",
                        b->domain != NULL ? b->domain : "(none)");
}

/* ---- records ------------------------------------------------------------------------------- */

static void
test_record_round_trip(void **state)
{
    Fixture *f = *state;
    static const char *const forked_from[] = {NULL, "bob"};

    for (gsize i = 0; i < G_N_ELEMENTS(forked_from); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(HostdAgentRecord) r = sample_record(f->dir);

        r->forked_from = g_strdup(forked_from[i]);
        if (forked_from[i] != NULL) {
            r->fork_checkpoint = g_strdup("c4");
            r->fork_base = g_strdup("/var/lib/hostd/agents/bob/disk-4.qcow2");
        }
        r->checkpoint_hourly = 24;
        r->checkpoint_daily = 7;
        /* A fleet's replicas, one record with its own count (none) and one with the host's. */
        r->replicas = g_strdup("h2,h3");
        r->replicated = g_strdup("c9");
        r->replicate_own = i == 0;
        if (!hostd_agent_record_save(r, &error))
            fail_msg("save failed: %s", error->message);
        g_autoptr(HostdAgentRecord) loaded = hostd_agent_record_load(f->dir, &error);
        if (loaded == NULL)
            fail_msg("load failed: %s", error->message);
        assert_records_equal(r, loaded);
        assert_string_equal(loaded->replicas, "h2,h3");
        assert_string_equal(loaded->replicated, "c9");
        assert_int_equal(loaded->replicate_own, i == 0);
        assert_int_equal(loaded->replicate, 0);

        g_autoptr(HostdAgentRecord) copy = hostd_agent_record_copy(loaded);
        assert_records_equal(r, copy);
        assert_ptr_not_equal(copy->name, loaded->name);
    }
}

/* An agent made from a warm pool's machine: its domain's own name comes back, and its record
 * read through its link in agents/ names the dir the link points to, where its files are. */
static void
test_record_pool_machine(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *real = g_build_filename(f->dir, "pool.0123456789abcdef", NULL);
    g_autofree char *link = g_build_filename(f->dir, "alice", NULL);
    assert_int_equal(g_mkdir(real, 0711), 0);
    assert_int_equal(symlink(real, link), 0);

    g_autoptr(HostdAgentRecord) r = sample_record(real);
    r->domain = g_strdup("pool.0123456789abcdef");
    if (!hostd_agent_record_save(r, &error))
        fail_msg("save failed: %s", error->message);
    g_autoptr(HostdAgentRecord) loaded = hostd_agent_record_load(link, &error);
    if (loaded == NULL)
        fail_msg("load failed: %s", error->message);
    g_autofree char *expected = realpath(real, NULL);
    g_free(r->dir);
    r->dir = g_strdup(expected);
    assert_records_equal(r, loaded);
    g_autoptr(HostdAgentRecord) copy = hostd_agent_record_copy(loaded);
    assert_string_equal(copy->domain, "pool.0123456789abcdef");
}

/* Values at the edges of their types come back unchanged. */
static void
test_record_round_trip_limits(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = sample_record(f->dir);

    r->cpus = G_MAXUINT;
    r->memory_mib = G_MAXUINT;
    r->disk_gib = 0;
    r->ssh_port = 65535;
    r->created = G_MININT64;
    r->state_since = G_MAXINT64;
    r->grow_fs = TRUE;
    g_free(r->name);
    r->name = g_strdup("name with = and ; and # and \\ and é");
    assert_true(hostd_agent_record_save(r, &error));
    g_autoptr(HostdAgentRecord) loaded = hostd_agent_record_load(f->dir, &error);
    if (loaded == NULL)
        fail_msg("load failed: %s", error->message);
    assert_records_equal(r, loaded);
}

static void
test_record_file(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = sample_record(f->dir);
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);
    g_autofree char *expected_path = g_build_filename(f->dir, "agent.ini", NULL);

    assert_string_equal(path, expected_path);

    /* Even a permissive umask leaves the record private. */
    mode_t old_umask = umask(0);
    gboolean ok = hostd_agent_record_save(r, &error);
    umask(old_umask);
    if (!ok)
        fail_msg("save failed: %s", error->message);
    assert_int_equal(vm_test_file_mode(path), 0600);

    /* A rewrite replaces the file whole and leaves no temporary file behind. */
    g_free(r->phase);
    r->phase = g_strdup(HOSTD_PHASE_CREATING);
    assert_true(hostd_agent_record_save(r, &error));
    assert_true(hostd_agent_record_save(r, &error));
    g_autofree char *listing = vm_test_dir_listing(f->dir, TRUE);
    assert_string_equal(listing, "agent.ini");
    assert_int_equal(vm_test_file_mode(path), 0600);

    g_autoptr(HostdAgentRecord) loaded = hostd_agent_record_load(f->dir, &error);
    assert_non_null(loaded);
    assert_string_equal(loaded->phase, HOSTD_PHASE_CREATING);

    /* A previously wider file is narrowed by the rewrite. */
    assert_int_equal(chmod(path, 0644), 0);
    assert_true(hostd_agent_record_save(r, &error));
    assert_int_equal(vm_test_file_mode(path), 0600);
}

static void
test_record_save_fails(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *missing = g_build_filename(f->dir, "missing", NULL);
    g_autoptr(HostdAgentRecord) r = sample_record(missing);

    assert_false(hostd_agent_record_save(r, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, NULL);
}

/* A full disk or an I/O error while the record is written: the record on disk is the old one,
 * whole, and no temporary file is left; the next save writes the new one. */
static void
test_record_disk_full(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = sample_record(f->dir);
    static const int errors[] = {ENOSPC, EIO};

    assert_true(hostd_agent_record_save(r, NULL));
    g_free(r->phase);
    r->phase = g_strdup(HOSTD_PHASE_CREATING);
    for (gsize i = 0; i < G_N_ELEMENTS(errors); i++) {
        g_autoptr(GError) error = NULL;

        vm_file_write_fault(1, 1, errors[i]);
        assert_false(hostd_agent_record_save(r, &error));
        assert_int_equal(vm_file_write_calls(), 1);
        vm_file_write_fault(0, 0, 0);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, g_strerror(errors[i]));
        g_autofree char *listing = vm_test_dir_listing(f->dir, TRUE);
        assert_string_equal(listing, "agent.ini");
        g_autoptr(HostdAgentRecord) old = hostd_agent_record_load(f->dir, &error);
        assert_non_null(old);
        assert_string_equal(old->phase, HOSTD_PHASE_READY);
    }
    assert_true(hostd_agent_record_save(r, NULL));
    g_autoptr(HostdAgentRecord) loaded = hostd_agent_record_load(f->dir, NULL);
    assert_string_equal(loaded->phase, HOSTD_PHASE_CREATING);
}

static void
test_record_missing(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(f->dir, "agent.ini", NULL);

    assert_null(hostd_agent_record_load(f->dir, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, path);
}

/* A complete record as hostd writes it, one "key=value" per line, to remove or damage keys. */
static const char *const good_lines[] = {
    "name=alice",
    "uuid=0b6f1f0e-3c1d-4f7e-9a51-6b2d1f0c9e11",
    "template=debian-12",
    "phase=ready",
    "cpus=2",
    "memory-mib=1024",
    "disk-gib=8",
    "ssh-port=42200",
    "mac=52:54:00:00:00:01",
    "user=agent",
    "instance-id=vmctl-0b6f1f0e",
    "created=1700000000",
    "state-since=1700000000",
};

/* Writes [agent] with good_lines, leaving out the line of @drop and adding @extra. */
static void
write_record(const char *dir, const char *drop, const char *extra)
{
    g_autoptr(GString) text = g_string_new("[agent]\n");
    g_autofree char *path = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
    g_autofree char *drop_prefix = drop != NULL ? g_strconcat(drop, "=", NULL) : NULL;

    for (gsize i = 0; i < G_N_ELEMENTS(good_lines); i++) {
        if (drop_prefix != NULL && g_str_has_prefix(good_lines[i], drop_prefix))
            continue;
        g_string_append_printf(text, "%s\n", good_lines[i]);
    }
    if (extra != NULL)
        g_string_append_printf(text, "%s\n", extra);
    vm_test_write_file(path, text->str);
}

static void
test_record_hand_written(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    write_record(f->dir, NULL,
                 "forked-from=bob\nfork-checkpoint=c4\nfork-base=/state/agents/bob/disk-4.qcow2");
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(f->dir, &error);
    if (r == NULL)
        fail_msg("load failed: %s", error->message);
    assert_string_equal(r->dir, f->dir);
    assert_string_equal(r->name, "alice");
    assert_int_equal(r->cpus, 2);
    assert_int_equal(r->memory_mib, 1024);
    assert_int_equal(r->disk_gib, 8);
    /* made before there were disk limits: none, as its VM was made */
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_int_equal(r->disk_limits[i], 0);
    assert_int_equal(r->ssh_port, 42200);
    assert_string_equal(r->forked_from, "bob");
    assert_string_equal(r->fork_checkpoint, "c4");
    assert_int_equal(r->created, 1700000000);
}

static void
test_record_missing_key(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, HOSTD_AGENT_RECORD, NULL);

    for (gsize i = 0; i < G_N_ELEMENTS(good_lines); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *key = g_strndup(good_lines[i], strcspn(good_lines[i], "="));

        write_record(f->dir, key, NULL);
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(f->dir, &error);
        if (r != NULL)
            fail_msg("a record without '%s' was accepted", key);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, path);
        if (strstr(error->message, key) == NULL)
            fail_msg("'%s' does not name the missing key '%s'", error->message, key);
    }
}

static void
test_record_bad_values(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, HOSTD_AGENT_RECORD, NULL);
    static const struct {
        const char *key;
        const char *line;
    } cases[] = {
        {"cpus", "cpus=0"},
        {"cpus", "cpus=two"},
        {"cpus", "cpus=-1"},
        {"cpus", "cpus=4294967298"},
        {"cpus", "cpus=2x"},
        {"cpus", "cpus="},
        {"memory-mib", "memory-mib=0"},
        {"memory-mib", "memory-mib=1e3"},
        {"disk-gib", "disk-gib=-8"},
        {"ssh-port", "ssh-port=0"},
        {"ssh-port", "ssh-port=65536"},
        {"created", "created=yesterday"},
        {"created", "created=99999999999999999999"},
        {"state-since", "state-since=1.5"},
        {"disk-read", "disk-read=1000001"},
        {"disk-write-iops", "disk-write-iops=-1"},
        {"domain", "domain=../x"},
        {"domain", "domain="},
        {"domain", "domain=Pool"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;

        write_record(f->dir, cases[i].key, cases[i].line);
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(f->dir, &error);
        if (r != NULL)
            fail_msg("'%s' was accepted", cases[i].line);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, path);
        if (strstr(error->message, cases[i].key) == NULL)
            fail_msg("'%s' does not name the key of '%s'", error->message, cases[i].line);
    }
}

/* Files that are no record at all fail too, naming the file. */
static void
test_record_unreadable(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, HOSTD_AGENT_RECORD, NULL);
    static const char *const cases[] = {
        "", "garbage\n", "[agent\nname=alice\n", "[other]\nname=alice\n", "\xff\xfe[agent]\n",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;

        vm_test_write_file(path, cases[i]);
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(f->dir, &error);
        if (r != NULL)
            fail_msg("case %zu was accepted", i);
        if (error == NULL || error->domain != VM_ERROR ||
            (error->code != VM_ERROR_IO && error->code != VM_ERROR_FAILED))
            fail_msg("case %zu: unexpected error %s", i, error ? error->message : "(none)");
        if (strstr(error->message, path) == NULL)
            fail_msg("case %zu: '%s' does not name %s", i, error->message, path);
    }
}

static void
test_record_free_null(void **state)
{
    hostd_agent_record_free(NULL);
    hostd_state_close(NULL);
}

/* ---- the state directory ------------------------------------------------------------------- */

static void
test_state_open_creates(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *state_dir = g_build_filename(f->dir, "a", "b", "state", NULL);
    g_autofree char *agents_dir = g_build_filename(state_dir, "agents", NULL);
    g_autofree char *lock = g_build_filename(state_dir, "hostd.lock", NULL);

    /* The traversal bits must not depend on the umask hostd was started with. */
    mode_t old_umask = umask(077);
    g_autoptr(HostdState) st = hostd_state_open(state_dir, &error);
    umask(old_umask);
    if (st == NULL)
        fail_msg("open failed: %s", error->message);

    assert_string_equal(st->dir, state_dir);
    assert_string_equal(st->agents_dir, agents_dir);
    assert_true(st->lock_fd >= 0);
    assert_int_equal(vm_test_file_mode(state_dir), 0711);
    assert_int_equal(vm_test_file_mode(agents_dir), 0711);

    /* The lock file names its holder. */
    g_autofree char *pid = NULL;
    g_autofree char *expected = g_strdup_printf("%d\n", (int)getpid());
    assert_true(g_file_get_contents(lock, &pid, NULL, NULL));
    assert_string_equal(pid, expected);
    int flags = fcntl(st->lock_fd, F_GETFD);
    assert_true(flags >= 0 && (flags & FD_CLOEXEC));
}

/* An existing, narrower state dir (made by an older hostd or by hand) is opened up for QEMU. */
static void
test_state_open_existing(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *state_dir = g_build_filename(f->dir, "state", NULL);
    g_autofree char *agents_dir = g_build_filename(state_dir, "agents", NULL);
    g_autofree char *keep = g_build_filename(agents_dir, "alice", NULL);

    assert_int_equal(g_mkdir_with_parents(keep, 0700), 0);
    assert_int_equal(chmod(state_dir, 0700), 0);
    assert_int_equal(chmod(agents_dir, 0700), 0);

    g_autoptr(HostdState) st = hostd_state_open(state_dir, &error);
    if (st == NULL)
        fail_msg("open failed: %s", error->message);
    assert_int_equal(vm_test_file_mode(state_dir), 0711);
    assert_int_equal(vm_test_file_mode(agents_dir), 0711);
    assert_true(g_file_test(keep, G_FILE_TEST_IS_DIR));
}

static void
test_state_open_fails(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *file = g_build_filename(f->dir, "file", NULL);
    g_autofree char *below = g_build_filename(file, "state", NULL);

    vm_test_write_file(file, "x");
    assert_null(hostd_state_open(below, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, below);
}

static void
test_state_lock(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *state_dir = g_build_filename(f->dir, "state", NULL);
    g_autofree char *pid = g_strdup_printf("pid %d", (int)getpid());

    HostdState *first = hostd_state_open(state_dir, &error);
    if (first == NULL)
        fail_msg("open failed: %s", error->message);

    /* flock() locks belong to the open file description, so a second open in this very
     * process conflicts as a second hostd would. */
    g_autoptr(HostdState) second = hostd_state_open(state_dir, &error);
    assert_null(second);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BUSY, pid);
    assert_non_null(strstr(error->message, state_dir));
    g_clear_error(&error);

    /* The failed attempt must not have clobbered the holder's PID in the lock file. */
    g_autoptr(HostdState) third = hostd_state_open(state_dir, &error);
    assert_null(third);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BUSY, pid);
    g_clear_error(&error);

    hostd_state_close(first);
    g_autoptr(HostdState) again = hostd_state_open(state_dir, &error);
    if (again == NULL)
        fail_msg("the lock outlived hostd_state_close(): %s", error->message);
}

static void
test_list_agents(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *state_dir = g_build_filename(f->dir, "state", NULL);
    g_autoptr(HostdState) st = hostd_state_open(state_dir, &error);
    assert_non_null(st);

    g_autoptr(GPtrArray) empty = hostd_state_list_agents(st, &error);
    assert_non_null(empty);
    assert_int_equal(empty->len, 0);

    static const char *const dirs[] = {"zed", "alice", "bob-2", "bob", ".tmp-carol", ".x"};
    for (gsize i = 0; i < G_N_ELEMENTS(dirs); i++) {
        g_autofree char *path = g_build_filename(st->agents_dir, dirs[i], NULL);
        assert_int_equal(g_mkdir(path, 0700), 0);
    }
    g_autofree char *stray = g_build_filename(st->agents_dir, "notes.txt", NULL);
    g_autofree char *dot_file = g_build_filename(st->agents_dir, ".lock", NULL);
    vm_test_write_file(stray, "not an agent");
    vm_test_write_file(dot_file, "");

    g_autoptr(GPtrArray) names = hostd_state_list_agents(st, &error);
    if (names == NULL)
        fail_msg("list failed: %s", error->message);
    g_ptr_array_add(names, NULL);
    g_autofree char *joined = g_strjoinv(" ", (char **)names->pdata);
    assert_string_equal(joined, "alice bob bob-2 zed");
}

static void
test_list_agents_fails(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *state_dir = g_build_filename(f->dir, "state", NULL);
    g_autoptr(HostdState) st = hostd_state_open(state_dir, &error);
    assert_non_null(st);

    assert_int_equal(g_rmdir(st->agents_dir), 0);
    assert_null(hostd_state_list_agents(st, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_round_trip_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_pool_machine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_save_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_disk_full, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_hand_written, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_missing_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_bad_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_unreadable, setup, teardown),
        cmocka_unit_test(test_record_free_null),
        cmocka_unit_test_setup_teardown(test_state_open_creates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_open_existing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_open_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_agents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_agents_fails, setup, teardown),
    };

    return cmocka_run_group_tests_name("state", tests, NULL, NULL);
}
