/* Agent SSH keys: generated keypairs are real ed25519 keys that libssh and OpenSSH both read,
 * they are saved with private modes, and known_hosts lines pin them the way OpenSSH expects. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-cleanup.h"
#include "hostd-keys.h"
#include "hostd-state.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-spawn.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* ---- helpers ------------------------------------------------------------------------------- */

static HostdKeyPair *
generate(const char *comment)
{
    g_autoptr(GError) error = NULL;
    HostdKeyPair *pair = hostd_keypair_generate(comment, &error);

    if (pair == NULL)
        fail_msg("generate failed: %s", error->message);
    return pair;
}

/* Runs @argv; returns its stdout, failing the test unless it exits 0. */
static char *
run_ok(const char *const *argv)
{
    g_autoptr(GError) error = NULL;
    char *out = NULL;

    if (!vm_spawn_run(argv, NULL, &out, &error))
        fail_msg("%s %s %s: %s", argv[0], argv[1], argv[2], error->message);
    return out;
}

/* The base64 field of a "type base64 [comment]" line. */
static char *
b64_field(const char *line)
{
    g_auto(GStrv) parts = g_strsplit(line, " ", 3);

    assert_non_null(parts[0]);
    assert_non_null(parts[1]);
    return g_strdup(parts[1]);
}

/* ---- generation ---------------------------------------------------------------------------- */

static void
test_public_line(void **state)
{
    g_autoptr(HostdKeyPair) pair = generate("vmctl-alice");
    g_auto(GStrv) parts = g_strsplit(pair->public_line, " ", -1);

    assert_int_equal(g_strv_length(parts), 3);
    assert_string_equal(parts[0], "ssh-ed25519");
    assert_string_equal(parts[2], "vmctl-alice");
    assert_null(strchr(pair->public_line, '\n'));

    /* The base64 is the SSH wire form of an ed25519 key: string "ssh-ed25519", then the
     * 32-byte key as a string. */
    for (const char *p = parts[1]; *p != '\0'; p++)
        assert_true(g_ascii_isalnum(*p) || *p == '+' || *p == '/' || *p == '=');
    gsize len = 0;
    g_autofree guchar *blob = g_base64_decode(parts[1], &len);
    static const guchar header[] = {0,   0,   0,   11,  's', 's', 'h', '-', 'e', 'd',
                                    '2', '5', '5', '1', '9', 0,   0,   0,   32};
    assert_int_equal(len, sizeof(header) + 32);
    assert_memory_equal(blob, header, sizeof(header));
}

static void
test_private_key_parses(void **state)
{
    g_autoptr(HostdKeyPair) pair = generate("vmctl-bob");
    g_autoptr(HostdSshKey) key = NULL;
    g_autoptr(HostdSshKey) pub = NULL;
    char *b64 = NULL;

    assert_true(g_str_has_prefix(pair->private_pem, "-----BEGIN OPENSSH PRIVATE KEY-----\n"));
    assert_non_null(strstr(pair->private_pem, "-----END OPENSSH PRIVATE KEY-----"));

    assert_int_equal(ssh_pki_import_privkey_base64(pair->private_pem, NULL, NULL, NULL, &key),
                     SSH_OK);
    assert_int_equal(ssh_key_type(key), SSH_KEYTYPE_ED25519);
    assert_true(ssh_key_is_private(key));

    /* The private key's public half is the one on the public line. */
    assert_int_equal(ssh_pki_export_pubkey_base64(key, &b64), SSH_OK);
    g_autofree char *expected = b64_field(pair->public_line);
    assert_string_equal(b64, expected);
    ssh_string_free_char(b64);

    assert_int_equal(ssh_pki_import_pubkey_base64(expected, SSH_KEYTYPE_ED25519, &pub), SSH_OK);
    assert_int_equal(ssh_key_cmp(key, pub, SSH_KEY_CMP_PUBLIC), 0);
}

static void
test_generations_differ(void **state)
{
    g_autoptr(HostdKeyPair) a = generate("same");
    g_autoptr(HostdKeyPair) b = generate("same");

    assert_string_not_equal(a->public_line, b->public_line);
    assert_string_not_equal(a->private_pem, b->private_pem);
}

static void
test_comments(void **state)
{
    static const char *const comments[] = {"vmctl-a", "two words", "user@host"};

    for (gsize i = 0; i < G_N_ELEMENTS(comments); i++) {
        g_autoptr(HostdKeyPair) pair = generate(comments[i]);
        g_autofree char *b64 = b64_field(pair->public_line);
        g_autofree char *expected = g_strdup_printf("ssh-ed25519 %s %s", b64, comments[i]);

        assert_string_equal(pair->public_line, expected);
    }
}

static void
test_free_null(void **state)
{
    hostd_keypair_free(NULL);
}

/* ---- saving -------------------------------------------------------------------------------- */

static void
test_save(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdKeyPair) pair = generate("vmctl-carol");
    g_autofree char *priv = g_build_filename(f->dir, HOSTD_AGENT_KEY, NULL);
    g_autofree char *pub = g_build_filename(f->dir, HOSTD_AGENT_KEY_PUB, NULL);

    /* A private key must never be readable by others, whatever the umask. */
    mode_t old_umask = umask(0);
    gboolean ok = hostd_keypair_save(pair, priv, pub, &error);
    umask(old_umask);
    if (!ok)
        fail_msg("save failed: %s", error->message);

    assert_int_equal(vm_test_file_mode(priv), 0600);
    assert_int_equal(vm_test_file_mode(pub), 0644);
    g_autofree char *priv_text = vm_test_read_file(priv);
    g_autofree char *pub_text = vm_test_read_file(pub);
    g_autofree char *pub_expected = g_strconcat(pair->public_line, "\n", NULL);
    assert_string_equal(priv_text, pair->private_pem);
    assert_string_equal(pub_text, pub_expected);

    /* Nothing else is left in the directory (no temporary files). */
    g_autoptr(GDir) dir = g_dir_open(f->dir, 0, NULL);
    guint n = 0;
    while (g_dir_read_name(dir) != NULL)
        n++;
    assert_int_equal(n, 2);
}

/* A key saved over a readable file of the same name ends up private. */
static void
test_save_replaces(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdKeyPair) pair = generate("vmctl-dave");
    g_autofree char *priv = g_build_filename(f->dir, "key", NULL);
    g_autofree char *pub = g_build_filename(f->dir, "key.pub", NULL);

    assert_true(g_file_set_contents(priv, "old", -1, NULL));
    assert_int_equal(chmod(priv, 0644), 0);
    assert_true(hostd_keypair_save(pair, priv, NULL, &error));
    assert_int_equal(vm_test_file_mode(priv), 0600);
    g_autofree char *text = vm_test_read_file(priv);
    assert_string_equal(text, pair->private_pem);
    assert_false(g_file_test(pub, G_FILE_TEST_EXISTS));
}

static void
test_save_fails(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdKeyPair) pair = generate("x");
    g_autofree char *missing = g_build_filename(f->dir, "missing", "key", NULL);
    g_autofree char *priv = g_build_filename(f->dir, "key", NULL);
    g_autofree char *missing_pub = g_build_filename(f->dir, "missing", "key.pub", NULL);

    g_autoptr(GError) error = NULL;
    assert_false(hostd_keypair_save(pair, missing, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));

    g_autoptr(GError) error2 = NULL;
    assert_false(hostd_keypair_save(pair, priv, missing_pub, &error2));
    assert_true(g_error_matches(error2, VM_ERROR, VM_ERROR_IO));
}

/* OpenSSH itself reads the saved private key (it also refuses keys others can read) and derives
 * the same public key from it. */
static void
test_openssh_reads_key(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdKeyPair) pair = generate("vmctl-erin");
    g_autofree char *priv = g_build_filename(f->dir, "id_ed25519", NULL);
    g_autofree char *pub_dir = g_build_filename(f->dir, "pub", NULL);
    g_autofree char *pub = g_build_filename(pub_dir, "id_ed25519.pub", NULL);

    assert_int_equal(g_mkdir(pub_dir, 0700), 0);
    /* No .pub next to the private key: ssh-keygen must read the private key itself. */
    assert_true(hostd_keypair_save(pair, priv, NULL, &error));
    g_autofree char *pub_line = g_strconcat(pair->public_line, "\n", NULL);
    assert_true(g_file_set_contents(pub, pub_line, -1, NULL));

    const char *fp_priv_argv[] = {"ssh-keygen", "-l", "-f", priv, NULL};
    const char *fp_pub_argv[] = {"ssh-keygen", "-l", "-f", pub, NULL};
    g_autofree char *fp_priv = run_ok(fp_priv_argv);
    g_autofree char *fp_pub = run_ok(fp_pub_argv);
    assert_true(g_str_has_prefix(fp_priv, "256 SHA256:"));
    assert_non_null(strstr(fp_priv, "(ED25519)"));
    g_auto(GStrv) a = g_strsplit(fp_priv, " ", 3);
    g_auto(GStrv) b = g_strsplit(fp_pub, " ", 3);
    assert_string_equal(a[1], b[1]);

    const char *derive_argv[] = {"ssh-keygen", "-y", "-f", priv, NULL};
    g_autofree char *derived = run_ok(derive_argv);
    g_autofree char *derived_b64 = b64_field(g_strstrip(derived));
    g_autofree char *line_b64 = b64_field(pair->public_line);
    assert_true(g_str_has_prefix(derived, "ssh-ed25519 "));
    assert_string_equal(derived_b64, line_b64);
}

/* ---- known_hosts --------------------------------------------------------------------------- */

static void
test_known_hosts_line(void **state)
{
    static const struct {
        guint port;
        const char *public_line;
        const char *expected;
    } cases[] = {
        {42200, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample vmctl-alice",
         "[127.0.0.1]:42200 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n"},
        {65535, "ssh-ed25519 AAAA two word comment", "[127.0.0.1]:65535 ssh-ed25519 AAAA\n"},
        {1024, "ssh-ed25519 AAAA", "[127.0.0.1]:1024 ssh-ed25519 AAAA\n"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *line = hostd_known_hosts_line(cases[i].port, cases[i].public_line);
        assert_string_equal(line, cases[i].expected);
    }
}

/* OpenSSH finds the pinned key under the name it looks up for 127.0.0.1:PORT. */
static void
test_known_hosts_openssh(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdKeyPair) host = generate("vmctl-frank");
    g_autofree char *path = g_build_filename(f->dir, HOSTD_AGENT_KNOWN_HOSTS, NULL);
    g_autofree char *line = hostd_known_hosts_line(42317, host->public_line);
    g_autofree char *b64 = b64_field(host->public_line);
    g_autofree char *expected = g_strdup_printf("[127.0.0.1]:42317 ssh-ed25519 %s\n", b64);

    assert_string_equal(line, expected);
    assert_true(g_file_set_contents(path, line, -1, NULL));
    const char *argv[] = {"ssh-keygen", "-F", "[127.0.0.1]:42317", "-f", path, NULL};
    g_autofree char *out = run_ok(argv);
    assert_non_null(strstr(out, b64));

    /* Another port is another host: not pinned. */
    g_autoptr(GError) error = NULL;
    const char *other[] = {"ssh-keygen", "-F", "[127.0.0.1]:42318", "-f", path, NULL};
    assert_false(vm_spawn_run(other, NULL, NULL, &error));
    assert_true(g_str_has_prefix(error->message, "ssh-keygen failed: "));
}

/* ---- users' own keys ------------------------------------------------------------------------ */

/* The first line of tests/data/ssh-keys/@name, without its newline. */
static char *
user_key_line(const char *name)
{
    g_autofree char *path = vm_test_data_path("ssh-keys", name, NULL);
    g_autofree char *text = vm_test_read_file(path);

    return g_strdup(g_strstrip(text));
}

static VmSshKey *
user_key(const char *name)
{
    g_autofree char *line = user_key_line(name);
    g_autoptr(GError) error = NULL;
    VmSshKey *key = hostd_user_key_check(line, &error);

    vm_test_assert_no_error(error);
    assert_non_null(key);
    return key;
}

/* libssh reads every accepted type, and what it writes back is the key as ssh-keygen made it. */
static void
test_user_key_types(void **state)
{
    static const char *const files[] = {
        "ed25519.pub",  "ecdsa-256.pub",  "ecdsa-384.pub", "ecdsa-521.pub",
        "rsa-2048.pub", "sk-ed25519.pub", "sk-ecdsa.pub",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(files); i++) {
        g_autofree char *line = user_key_line(files[i]);
        g_autoptr(VmSshKey) parsed = vm_ssh_key_parse(line, NULL);
        g_autoptr(VmSshKey) key = user_key(files[i]);
        g_autofree char *back = vm_ssh_key_to_line(key);

        assert_string_equal(back, line);
        assert_string_equal(key->fingerprint, parsed->fingerprint);
        assert_int_equal(key->bits, parsed->bits);
    }
}

static void
test_user_key_refused(void **state)
{
    g_autofree char *ed = user_key_line("ed25519.pub");
    g_autofree char *dsa = user_key_line("dsa.pub");
    g_autofree char *short_rsa = user_key_line("rsa-1024.pub");
    g_autofree char *ecdsa = user_key_line("ecdsa-256.pub");
    g_auto(GStrv) ecdsa_words = g_strsplit(ecdsa, " ", 3);
    g_autofree char *options = g_strdup_printf("command=\"true\" %s", ed);

    /* The point moved off the curve: the text checks cannot see it, libssh does. */
    gsize len = 0;
    g_autofree guint8 *blob = g_base64_decode(ecdsa_words[1], &len);
    blob[len - 1] ^= 0x01;
    g_autofree char *b64 = g_base64_encode(blob, len);
    g_autofree char *off_curve = g_strdup_printf("ecdsa-sha2-nistp256 %s x", b64);
    g_autoptr(VmSshKey) text_ok = vm_ssh_key_parse(off_curve, NULL);
    assert_non_null(text_ok);

    const struct {
        const char *line;
        const char *needle;
    } cases[] = {
        {off_curve, "the ecdsa-sha2-nistp256 key does not load"},
        {dsa, "ssh-dss (DSA) keys are not accepted"},
        {short_rsa, "1024 bits"},
        {options, "key options"},
        {"", "no public key"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmSshKey) key = hostd_user_key_check(cases[i].line, &error);

        assert_null(key);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, cases[i].needle);
    }
}

static void
test_user_keys_check(void **state)
{
    g_autofree char *ed = user_key_line("ed25519.pub");
    g_autofree char *rsa = user_key_line("rsa-2048.pub");
    g_autofree char *dsa = user_key_line("dsa.pub");
    g_autofree char *renamed = g_strdup_printf("%s-again", ed);
    g_autoptr(GError) error = NULL;

    /* The same key twice is one key, with its first comment. */
    const char *const twice[] = {ed, rsa, renamed, NULL};
    g_autoptr(GPtrArray) keys = hostd_user_keys_check(twice, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(keys->len, 2);
    assert_string_equal(((VmSshKey *)keys->pdata[0])->comment, "alice@laptop");
    assert_string_equal(((VmSshKey *)keys->pdata[1])->type, "ssh-rsa");

    const char *const second_bad[] = {ed, dsa, NULL};
    assert_null(hostd_user_keys_check(second_bad, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "key 2: ssh-dss");
    g_clear_error(&error);

    /* One key: its own message, without a number. */
    const char *const only_bad[] = {dsa, NULL};
    assert_null(hostd_user_keys_check(only_bad, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "ssh-dss (DSA)");
    assert_false(g_str_has_prefix(error->message, "key 1"));
    g_clear_error(&error);

    g_autoptr(GPtrArray) many = g_ptr_array_new();
    for (guint i = 0; i <= VM_SSH_KEYS_MAX; i++)
        g_ptr_array_add(many, ed);
    g_ptr_array_add(many, NULL);
    assert_null(hostd_user_keys_check((const char *const *)many->pdata, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "33 keys: at most 32");
}

/* The record: written 0600 and read back as written; adding a key twice keeps it once. */
static void
test_user_keys_record(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, HOSTD_AGENT_USER_KEYS, NULL);
    g_autoptr(GError) error = NULL;

    g_autoptr(GPtrArray) record = hostd_user_keys_load(path, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(record->len, 0);

    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);
    g_ptr_array_add(keys, user_key("ed25519.pub"));
    g_ptr_array_add(keys, user_key("ecdsa-384.pub"));
    assert_int_equal(hostd_user_keys_merge(record, keys), 2);
    assert_int_equal(hostd_user_keys_merge(record, keys), 0);
    assert_int_equal(record->len, 2);
    assert_true(hostd_user_keys_save(path, record, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(vm_test_file_mode(path), 0600);

    g_autoptr(GPtrArray) back = hostd_user_keys_load(path, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(back->len, 2);
    for (guint i = 0; i < 2; i++) {
        const VmSshKey *a = record->pdata[i], *b = back->pdata[i];
        assert_string_equal(a->fingerprint, b->fingerprint);
        assert_string_equal(a->comment, b->comment);
    }
    const VmSshKey *second = back->pdata[1];
    assert_int_equal(hostd_user_keys_find(back, second->fingerprint), 1);
    assert_int_equal(hostd_user_keys_find(back, "SHA256:nope"), -1);

    /* Emptied, it is a record of no key, not a missing one. */
    g_ptr_array_set_size(back, 0);
    assert_true(hostd_user_keys_save(path, back, &error));
    g_autoptr(GPtrArray) none = hostd_user_keys_load(path, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(none->len, 0);
    assert_true(g_file_test(path, G_FILE_TEST_EXISTS));

    vm_test_write_file(path, "ssh-ed25519 AAAA broken\n");
    assert_null(hostd_user_keys_load(path, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "corrupt record");
}

/* The guest's line carries the mark first in its comment, and OpenSSH reads it as the same key. */
static void
test_user_key_guest_line(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmSshKey) key = user_key("ed25519.pub");
    g_autofree char *line = hostd_user_key_guest_line(key);
    g_autofree char *path = g_build_filename(f->dir, "authorized_keys", NULL);
    g_autofree char *want =
        g_strdup_printf("ssh-ed25519 %s vmctl-authorized: alice@laptop", key->base64);

    assert_string_equal(line, want);
    g_autofree char *text = g_strdup_printf("%s\n", line);
    vm_test_write_file(path, text);
    const char *argv[] = {"ssh-keygen", "-l", "-f", path, NULL};
    g_autofree char *out = run_ok(argv);
    g_autofree char *listed =
        g_strdup_printf("256 %s vmctl-authorized: alice@laptop (ED25519)\n", key->fingerprint);
    assert_string_equal(out, listed);

    g_free(key->comment);
    key->comment = g_strdup("");
    g_autofree char *bare = hostd_user_key_guest_line(key);
    g_autofree char *want_bare = g_strdup_printf("ssh-ed25519 %s vmctl-authorized:", key->base64);
    assert_string_equal(bare, want_bare);

    g_autoptr(GVariant) v = g_variant_ref_sink(hostd_user_key_to_variant(key));
    g_autofree char *printed = g_variant_print(v, FALSE);
    g_autofree char *want_v =
        g_strdup_printf("{'fingerprint': <'%s'>, 'type': <'ssh-ed25519'>, 'bits': <uint32 256>, "
                        "'comment': <''>, 'key': <'ssh-ed25519 %s'>}",
                        key->fingerprint, key->base64);
    assert_string_equal(printed, want_v);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_public_line),
        cmocka_unit_test(test_private_key_parses),
        cmocka_unit_test(test_generations_differ),
        cmocka_unit_test(test_comments),
        cmocka_unit_test(test_free_null),
        cmocka_unit_test_setup_teardown(test_save, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_replaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_openssh_reads_key, setup, teardown),
        cmocka_unit_test(test_known_hosts_line),
        cmocka_unit_test_setup_teardown(test_known_hosts_openssh, setup, teardown),
        cmocka_unit_test(test_user_key_types),
        cmocka_unit_test(test_user_key_refused),
        cmocka_unit_test(test_user_keys_check),
        cmocka_unit_test_setup_teardown(test_user_keys_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_user_key_guest_line, setup, teardown),
    };

    return cmocka_run_group_tests_name("keys", tests, NULL, NULL);
}
