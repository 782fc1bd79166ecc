/* The users' own keys in an agent (hostd-authorize.c): the script the guest runs, run here in a
 * scratch home as the guest would (atomic, idempotent, keeps every line it does not own, right
 * modes), and hostd's side on libvirt's test driver (test-hostd-fixture.h): the record, what is
 * refused before the guest is touched, waking, a guest that does not answer, the seed of `new`,
 * a fork's copy, and the record applied when an agent comes up. The test driver has no guest, so
 * a change that reaches the guest ends in an SSH error here; the VM suite's authorize-check.sh
 * drives real guests. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

#include "hostd-authorize-private.h"
#include "hostd-keys.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-protocol.h"
#include "vm-spawn.h"

static char *
fingerprint_of(const char *name)
{
    g_autofree char *line = vm_test_ssh_key_line(name);
    g_autoptr(VmSshKey) key = vm_ssh_key_parse(line, NULL);

    assert_non_null(key);
    return g_strdup(key->fingerprint);
}

/* The agent's record, as list shows it: "FINGERPRINT COMMENT" per key, joined with "|". */
static char *
listed(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) keys = hostd_test_sink(hostd_authorize_list(f->ctx, name, &error));
    g_autoptr(GString) text = g_string_new(NULL);
    GVariantIter iter;
    GVariant *key;

    vm_test_assert_no_error(error);
    g_variant_iter_init(&iter, keys);
    while ((key = g_variant_iter_next_value(&iter)) != NULL) {
        g_autofree char *fingerprint = hostd_test_dict_string(key, "fingerprint");
        g_autofree char *comment = hostd_test_dict_string(key, "comment");
        g_string_append_printf(text, "%s%s %s", text->len > 0 ? "|" : "", fingerprint, comment);
        g_variant_unref(key);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* Writes the record of @name to hold the keys of the data files @names (NULL-terminated). */
static void
write_record(HostdTestFixture *f, const char *name, const char *const *names)
{
    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);
    g_autofree char *path = hostd_test_agent_file(f, name, HOSTD_AGENT_USER_KEYS);
    g_autoptr(GError) error = NULL;

    for (const char *const *n = names; *n != NULL; n++) {
        g_autofree char *line = vm_test_ssh_key_line(*n);
        g_ptr_array_add(keys, vm_ssh_key_parse(line, NULL));
    }
    assert_true(hostd_user_keys_save(path, keys, &error));
}

/* ---- the guest's script, run here --------------------------------------------------------- */

/* Runs the guest script with HOME=@home and @input on stdin; returns its exit status. */
static int
run_script(const char *home, const char *input, char **ret_stderr)
{
    const char *argv[] = {"sh", "-c", hostd_authorize_guest_script(), NULL};
    g_autoptr(GSubprocessLauncher) launcher =
        g_subprocess_launcher_new(G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDERR_PIPE);
    g_autoptr(GError) error = NULL;

    g_subprocess_launcher_setenv(launcher, "HOME", home, TRUE);
    g_autoptr(GSubprocess) process = g_subprocess_launcher_spawnv(launcher, argv, &error);
    vm_test_assert_no_error(error);
    g_autofree char *err = NULL;
    assert_true(g_subprocess_communicate_utf8(process, input, NULL, NULL, &err, &error));
    assert_true(g_subprocess_get_if_exited(process));
    if (ret_stderr != NULL)
        *ret_stderr = g_steal_pointer(&err);
    return g_subprocess_get_exit_status(process);
}

static GPtrArray *
keys_of(const char *const *names)
{
    GPtrArray *keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);

    for (const char *const *n = names; *n != NULL; n++) {
        g_autofree char *line = vm_test_ssh_key_line(*n);
        g_ptr_array_add(keys, vm_ssh_key_parse(line, NULL));
    }
    return keys;
}

static void
test_guest_script(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *ssh_dir = g_build_filename(t->dir, ".ssh", NULL);
    g_autofree char *file = g_build_filename(ssh_dir, "authorized_keys", NULL);
    const char *const two[] = {"ed25519.pub", "rsa-2048.pub", NULL};
    const char *const one[] = {"ecdsa-256.pub", NULL};
    g_autoptr(GPtrArray) two_keys = keys_of(two);
    g_autoptr(GPtrArray) one_key = keys_of(one);
    g_autofree char *two_input = hostd_authorize_guest_input(two_keys);
    g_autofree char *one_input = hostd_authorize_guest_input(one_key);
    g_autoptr(GPtrArray) no_keys = g_ptr_array_new();
    g_autofree char *none_input = hostd_authorize_guest_input(no_keys);

    /* A first run makes ~/.ssh and the file, private. */
    assert_int_equal(run_script(t->dir, two_input, NULL), 0);
    assert_int_equal(vm_test_file_mode(ssh_dir), 0700);
    assert_int_equal(vm_test_file_mode(file), 0600);
    g_autofree char *first = vm_test_read_file(file);
    assert_string_equal(first, two_input);
    assert_true(g_str_has_prefix(two_input, "ssh-ed25519 "));
    assert_non_null(strstr(two_input, " vmctl-authorized: alice@laptop\n"));

    /* Twice is once. */
    assert_int_equal(run_script(t->dir, two_input, NULL), 0);
    g_autofree char *second = vm_test_read_file(file);
    assert_string_equal(second, two_input);

    /* hostd's own key, a line the user wrote (options and all), a comment and a last line without
     * its newline stay where they are; hostd's marked lines are replaced by the new set. */
    g_autofree char *others = g_strdup_printf(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VDbGllbnRLZXlGb3JUZXN0c09ubHkwMDAw vmctl-a1\n"
        "%s"
        "# mine\n"
        "no-pty ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VVc2VyS2V5Rm9yVGVzdHNPbmx5MDAwMDAw "
        "vmctl-authorized: not mine\n"
        "ssh-rsa AAAAB3NzaC1yc2E me@home",
        two_input);
    vm_test_write_file(file, others);
    assert_int_equal(chmod(file, 0644), 0);
    assert_int_equal(run_script(t->dir, one_input, NULL), 0);
    g_autofree char *replaced = vm_test_read_file(file);
    g_autofree char *want = g_strdup_printf(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VDbGllbnRLZXlGb3JUZXN0c09ubHkwMDAw vmctl-a1\n"
        "# mine\n"
        "no-pty ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VVc2VyS2V5Rm9yVGVzdHNPbmx5MDAwMDAw "
        "vmctl-authorized: not mine\n"
        "ssh-rsa AAAAB3NzaC1yc2E me@home\n"
        "%s",
        one_input);
    assert_string_equal(replaced, want);
    assert_int_equal(vm_test_file_mode(file), 0600);

    /* No key left: only hostd's lines go. */
    assert_int_equal(run_script(t->dir, none_input, NULL), 0);
    g_autofree char *emptied = vm_test_read_file(file);
    assert_null(strstr(emptied, "ecdsa-sha2"));
    assert_true(g_str_has_prefix(emptied, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEZha2VDbGllbnRL"));
    assert_non_null(strstr(emptied, "ssh-rsa AAAAB3NzaC1yc2E me@home\n"));

    /* No scratch file is left behind. */
    g_autofree char *listing = vm_test_dir_listing(ssh_dir, TRUE);
    assert_string_equal(listing, "authorized_keys");
}

/* What is in the way is left alone, and the failure says why. */
static void
test_guest_script_refuses(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *ssh_dir = g_build_filename(t->dir, ".ssh", NULL);
    g_autofree char *file = g_build_filename(ssh_dir, "authorized_keys", NULL);
    g_autofree char *inside = g_build_filename(file, "x", NULL);
    g_autofree char *err = NULL;

    assert_int_equal(g_mkdir_with_parents(file, 0700), 0);
    vm_test_write_file(inside, "kept\n");
    assert_int_not_equal(run_script(t->dir, "ssh-ed25519 AAAA vmctl-authorized:\n", &err), 0);
    assert_non_null(strstr(err, "is not a file"));
    g_autofree char *kept = vm_test_read_file(inside);
    assert_string_equal(kept, "kept\n");
    g_autofree char *listing = vm_test_dir_listing(ssh_dir, TRUE);
    assert_string_equal(listing, "authorized_keys");
}

/* ---- hostd's side --------------------------------------------------------------------------- */

static void
test_list(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    const char *const keys[] = {"ed25519.pub", "sk-ecdsa.pub", NULL};
    g_autofree char *ed = fingerprint_of("ed25519.pub");
    g_autofree char *sk = fingerprint_of("sk-ecdsa.pub");

    /* No record yet: no key. */
    g_autofree char *none = listed(f, "a1");
    assert_string_equal(none, "");

    /* From the record, whatever the agent's state. */
    write_record(f, "a1", keys);
    g_autofree char *two = listed(f, "a1");
    g_autofree char *want = g_strdup_printf("%s alice@laptop|%s security-key-ecdsa", ed, sk);
    assert_string_equal(two, want);

    assert_null(hostd_authorize_list(f->ctx, "ghost", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no agent 'ghost'");
    g_clear_error(&error);
    assert_null(hostd_authorize_list(f->ctx, "../x", &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, NULL);
}

/* A bad key, an unknown agent, a stopped agent, an unknown fingerprint: refused before the guest
 * or the record is touched. */
static void
test_refused_before_anything(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_USER_KEYS);
    g_autofree char *ed = vm_test_ssh_key_line("ed25519.pub");
    g_autofree char *dsa = vm_test_ssh_key_line("dsa.pub");
    g_autofree char *options = g_strdup_printf("from=\"10.0.0.1\" %s", ed);
    g_autofree char *ed_fp = fingerprint_of("ed25519.pub");
    g_autoptr(GError) error = NULL;
    guint added = 99;

    const char *const bad[] = {ed, options, NULL};
    assert_null(hostd_authorize_add(f->ctx, "a1", bad, &added, &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "key 2: key options");
    g_clear_error(&error);
    const char *const weak[] = {dsa, NULL};
    assert_null(hostd_authorize_add(f->ctx, "ghost", weak, &added, &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "DSA");
    g_clear_error(&error);

    const char *const good[] = {ed, NULL};
    assert_null(hostd_authorize_add(f->ctx, "ghost", good, &added, &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no agent 'ghost'");
    g_clear_error(&error);
    assert_null(hostd_authorize_add(f->ctx, "a1", good, &added, &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "agent 'a1' is stopped");
    g_clear_error(&error);
    assert_int_equal(added, 99);
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));

    const char *const one[] = {"ed25519.pub", NULL};
    write_record(f, "a1", one);
    g_autofree char *before = vm_test_read_file(path);
    assert_null(hostd_authorize_rm(f->ctx, "a1", "SHA256:unknown", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "agent 'a1' has no key SHA256:unknown");
    g_clear_error(&error);
    assert_null(hostd_authorize_rm(f->ctx, "a1", ed_fp, &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "vmctl start a1");
    g_clear_error(&error);
    g_autofree char *after = vm_test_read_file(path);
    assert_string_equal(after, before);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");
}

/* A saved agent is woken as exec wakes it; a guest that does not answer leaves the record as it
 * was: it lists only keys the guest took. */
static void
test_guest_unreachable(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_SAVED);
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_USER_KEYS);
    g_autofree char *ed = vm_test_ssh_key_line("ed25519.pub");
    g_autofree char *rsa_fp = fingerprint_of("rsa-2048.pub");
    g_autoptr(GError) error = NULL;
    const char *const good[] = {ed, NULL};

    assert_null(hostd_authorize_add(f->ctx, "a1", good, NULL, &error));
    assert_non_null(error);
    hostd_test_assert_error(error, VM_ERROR_SSH, "agent 'a1'");
    g_clear_error(&error);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));

    const char *const one[] = {"rsa-2048.pub", NULL};
    write_record(f, "a1", one);
    assert_null(hostd_authorize_rm(f->ctx, "a1", rsa_fp, &error));
    hostd_test_assert_error(error, VM_ERROR_SSH, NULL);
    g_autofree char *still = listed(f, "a1");
    assert_true(g_str_has_prefix(still, rsa_fp));
}

/* The record may hold VM_SSH_KEYS_MAX keys; one more is refused before the guest. */
static void
test_too_many(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_USER_KEYS);
    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);
    g_autofree char *rsa = vm_test_ssh_key_line("rsa-2048.pub");
    g_autoptr(GError) error = NULL;

    /* Distinct ed25519 keys: 32 bytes each, all different. */
    for (guint i = 0; i < VM_SSH_KEYS_MAX; i++) {
        guint8 blob[4 + 11 + 4 + 32] = {0,   0,   0,   11,  's', 's', 'h', '-', 'e', 'd',
                                        '2', '5', '5', '1', '9', 0,   0,   0,   32};
        blob[19] = (guint8)i;
        g_autofree char *b64 = g_base64_encode(blob, sizeof(blob));
        g_autofree char *line = g_strdup_printf("ssh-ed25519 %s k%u", b64, i);
        g_ptr_array_add(keys, vm_ssh_key_parse(line, NULL));
        assert_non_null(keys->pdata[i]);
    }
    assert_true(hostd_user_keys_save(path, keys, &error));
    const char *const more[] = {rsa, NULL};
    assert_null(hostd_authorize_add(f->ctx, "a1", more, NULL, &error));
    hostd_test_assert_error(error, VM_ERROR_NO_RESOURCES, "at most 32");
}

/* `new --ssh-key`: checked before anything is made, then recorded (0600) where the seed takes
 * them from. */
static void
test_new_with_keys(void **state)
{
    HostdTestFixture *f = *state;
    g_autofree char *ed = vm_test_ssh_key_line("ed25519.pub");
    g_autofree char *rsa = vm_test_ssh_key_line("rsa-2048.pub");
    g_autofree char *short_rsa = vm_test_ssh_key_line("rsa-1024.pub");
    g_autofree char *ed_fp = fingerprint_of("ed25519.pub");
    g_autofree char *rsa_fp = fingerprint_of("rsa-2048.pub");
    g_autoptr(GError) error = NULL;

    char *bad[] = {ed, short_rsa, NULL};
    HostdNewRequest refused = {.name = "a1", .cpus = 1, .memory_mib = 128, .ssh_keys = bad};
    assert_null(hostd_test_sink(hostd_agent_new(f->ctx, &refused, NULL, NULL, &error)));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "key 2: the RSA key has 1024 bits");
    g_clear_error(&error);
    assert_int_equal(vm_test_count_entries(f->agents_dir), 0);

    char *good[] = {ed, rsa, ed, NULL};
    HostdNewRequest req = {.name = "a1", .cpus = 1, .memory_mib = 128, .ssh_keys = good};
    g_autoptr(GVariant) agent = hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, &error));
    vm_test_assert_no_error(error);
    assert_non_null(agent);
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_USER_KEYS);
    assert_int_equal(vm_test_file_mode(path), 0600);
    g_autofree char *keys = listed(f, "a1");
    g_autofree char *want = g_strdup_printf("%s alice@laptop|%s rsa-2048", ed_fp, rsa_fp);
    assert_string_equal(keys, want);
}

/* The hooks: a fork starts with its source's record, the seed holds the guest's lines. */
static void
test_fork_and_seed(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) source = hostd_test_agent_new(f, "src", HOSTD_TEST_STOPPED);
    g_autoptr(HostdAgentRecord) fork = hostd_test_agent_record_new(f, "copy");
    g_autoptr(HostdAgentRecord) plain = hostd_test_agent_record_new(f, "plain");
    g_autofree char *fork_path = hostd_test_agent_file(f, "copy", HOSTD_AGENT_USER_KEYS);
    g_autofree char *plain_path = hostd_test_agent_file(f, "plain", HOSTD_AGENT_USER_KEYS);
    const char *const keys[] = {"ecdsa-521.pub", "ed25519.pub", NULL};
    g_autoptr(GError) error = NULL;

    write_record(f, "src", keys);
    fork->forked_from = g_strdup("src");
    assert_true(hostd_authorize_component.agent_creating(f->ctx, fork, NULL, &error));
    vm_test_assert_no_error(error);
    g_autofree char *copied = listed(f, "copy");
    g_autofree char *original = listed(f, "src");
    assert_string_equal(copied, original);
    assert_int_equal(vm_test_file_mode(fork_path), 0600);
    assert_true(hostd_authorize_component.agent_creating(f->ctx, plain, NULL, &error));
    assert_false(g_file_test(plain_path, G_FILE_TEST_EXISTS));

    VmSeedSpec spec = {0};
    g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
    hostd_authorize_component.agent_seed(f->ctx, fork, &spec, keep);
    assert_non_null(spec.user_keys);
    assert_int_equal(g_strv_length((char **)spec.user_keys), 2);
    assert_true(g_str_has_prefix(spec.user_keys[0], "ecdsa-sha2-nistp521 "));
    assert_true(g_str_has_suffix(spec.user_keys[0], " vmctl-authorized: ecdsa-521"));
    assert_true(g_str_has_suffix(spec.user_keys[1], " vmctl-authorized: alice@laptop"));

    VmSeedSpec none = {0};
    hostd_authorize_component.agent_seed(f->ctx, plain, &none, keep);
    assert_null(none.user_keys);
}

/* Coming up: nothing to do without a record (no command at all); with one, a guest that does not
 * answer is reported in hostd's log. */
static void
test_up(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    const char *const keys[] = {"ed25519.pub", NULL};

    hostd_agent_emit_up(f->ctx, r);
    g_autofree char *quiet = hostd_test_log_text();
    assert_null(strstr(quiet, "users' keys"));

    write_record(f, "a1", keys);
    hostd_agent_emit_up(f->ctx, r);
    g_autofree char *logged = hostd_test_log_text();
    assert_non_null(strstr(logged, "agent 'a1': could not apply its users' keys"));
}

int
main(void)
{
    /* The guest script may refuse before it read the key written to its stdin. */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_guest_script, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_guest_script_refuses, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_list, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_refused_before_anything, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_guest_unreachable, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_too_many, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_with_keys, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_fork_and_seed, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_up, hostd_test_setup, hostd_test_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
