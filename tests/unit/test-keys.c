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
    };

    return cmocka_run_group_tests_name("keys", tests, NULL, NULL);
}
