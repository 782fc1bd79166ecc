/* Users' public keys as text (vm-ssh-key): every accepted type parses with the size and the
 * fingerprint ssh-keygen gives (tests/data/ssh-keys holds keys it made), and every way a line can
 * be wrong is refused with its own reason: options, DSA, short RSA, certificates, two keys on one
 * line, bad base64, data of another type. Comments keep printable ASCII only. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include <glib/gstdio.h>

#include "test-common.h"
#include "vm-error.h"
#include "vm-ssh-key.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* The base64 field of the data file @name. */
static char *
key_base64(const char *name)
{
    g_autofree char *line = vm_test_ssh_key_line(name);
    g_auto(GStrv) words = g_strsplit(line, " ", 3);

    return g_strdup(words[1]);
}

static VmSshKey *
parse_ok(const char *line)
{
    g_autoptr(GError) error = NULL;
    VmSshKey *key = vm_ssh_key_parse(line, &error);

    vm_test_assert_no_error(error);
    assert_non_null(key);
    return key;
}

static void
parse_fails(const char *line, const char *needle)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmSshKey) key = vm_ssh_key_parse(line, &error);

    if (key != NULL)
        fail_msg("'%.60s' parsed", line);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, needle);
    /* One line, so vmctl's "vmctl: ..." stays one line. */
    assert_null(strchr(error->message, '\n'));
}

static void
test_accepted_types(void **state)
{
    /* What `ssh-keygen -l` says of each file. */
    static const struct {
        const char *file;
        const char *type;
        guint bits;
        const char *fingerprint;
        const char *comment;
    } cases[] = {
        {"ed25519.pub", "ssh-ed25519", 256, "SHA256:Z0zG8m+z77Va4093TsHLE2T8lX2xBgz3n+0qJpiUxGU",
         "alice@laptop"},
        {"ecdsa-256.pub", "ecdsa-sha2-nistp256", 256,
         "SHA256:8nyqQMuwO56KvrFLUFg4OLa3ZBMD1BATrFJ7TztrJcU", "ecdsa-256"},
        {"ecdsa-384.pub", "ecdsa-sha2-nistp384", 384,
         "SHA256:zL8BT9/sxVwIg3vOy92Si0vRLmGHEBns4hWH/dALFwM", "ecdsa-384"},
        {"ecdsa-521.pub", "ecdsa-sha2-nistp521", 521,
         "SHA256:FeSctQzPev91J2vFV3E6nijk43b4nyhX7ye+nxsbZRw", "ecdsa-521"},
        {"rsa-2048.pub", "ssh-rsa", 2048, "SHA256:Cd+m8wF058lJGn1RGeiyPPx3oRGgVz0+2WQxVRZ6ZRI",
         "rsa-2048"},
        {"sk-ed25519.pub", "sk-ssh-ed25519@openssh.com", 256,
         "SHA256:fVx9p2oeY4a/uiKj8GQOrpckwJPtD4eez86HNojXIXw", "security-key"},
        {"sk-ecdsa.pub", "sk-ecdsa-sha2-nistp256@openssh.com", 256,
         "SHA256:6zP6BNos7qmD0KUJzZSOgBRidsw4hBb6lwOkU5NfbrY", "security-key-ecdsa"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *line = vm_test_ssh_key_line(cases[i].file);
        g_autoptr(VmSshKey) key = parse_ok(line);

        assert_string_equal(key->type, cases[i].type);
        assert_int_equal(key->bits, cases[i].bits);
        assert_string_equal(key->fingerprint, cases[i].fingerprint);
        assert_string_equal(key->comment, cases[i].comment);
        /* What goes on is the line as it came, once blanks are trimmed. */
        g_autofree char *back = vm_ssh_key_to_line(key);
        assert_string_equal(back, line);
    }
}

static void
test_blanks_and_comments(void **state)
{
    g_autofree char *b64 = key_base64("ed25519.pub");
    g_autofree char *tabs = g_strdup_printf("  ssh-ed25519\t%s \t a  b \r", b64);
    g_autofree char *bare = g_strdup_printf("ssh-ed25519 %s", b64);
    g_autofree char *controls = g_strdup_printf("ssh-ed25519 %s bob\x1b[31m\x07\xc3\xa9 x", b64);
    g_autofree char *c300 = g_strnfill(300, 'c');
    g_autofree char *long_comment = g_strdup_printf("ssh-ed25519 %s %s", b64, c300);

    g_autoptr(VmSshKey) k1 = parse_ok(tabs);
    assert_string_equal(k1->comment, "a  b");
    assert_string_equal(k1->base64, b64);

    g_autoptr(VmSshKey) k2 = parse_ok(bare);
    assert_string_equal(k2->comment, "");
    g_autofree char *line2 = vm_ssh_key_to_line(k2);
    assert_string_equal(line2, bare);

    /* An escape sequence, a bell and UTF-8 never reach a terminal that lists the keys. */
    g_autoptr(VmSshKey) k3 = parse_ok(controls);
    assert_string_equal(k3->comment, "bob?[31m??? x");

    g_autoptr(VmSshKey) k4 = parse_ok(long_comment);
    assert_int_equal(strlen(k4->comment), VM_SSH_KEY_COMMENT_MAX);
}

static void
test_refused(void **state)
{
    g_autofree char *ed = vm_test_ssh_key_line("ed25519.pub");
    g_autofree char *ed_b64 = key_base64("ed25519.pub");
    g_autofree char *rsa_b64 = key_base64("rsa-2048.pub");
    g_autofree char *ecdsa = vm_test_ssh_key_line("ecdsa-256.pub");
    g_autofree char *ecdsa_b64 = key_base64("ecdsa-256.pub");
    g_autofree char *dsa = vm_test_ssh_key_line("dsa.pub");
    g_autofree char *short_rsa = vm_test_ssh_key_line("rsa-1024.pub");

    /* The ed25519 data cut short, and with a byte too many. */
    gsize len = 0;
    g_autofree guint8 *blob = g_base64_decode(ed_b64, &len);
    g_autofree char *cut_b64 = g_base64_encode(blob, len - 3);
    g_autofree guint8 *longer = g_malloc(len + 1);
    memcpy(longer, blob, len);
    longer[len] = 0;
    g_autofree char *long_b64 = g_base64_encode(longer, len + 1);

    g_autofree char *command = g_strdup_printf("command=\"/bin/sh -c 'id'\" %s", ed);
    g_autofree char *no_pty = g_strdup_printf("no-pty %s", ed);
    g_autofree char *from = g_strdup_printf("from=\"10.0.0.1\",no-agent-forwarding %s", ed);
    g_autofree char *environment = g_strdup_printf("environment=\"A=B\" %s", ed);
    g_autofree char *two = g_strdup_printf("%s %s", ed, ecdsa);
    g_autofree char *two_bare = g_strdup_printf("ssh-ed25519 %s ssh-ed25519 %s", ed_b64, ed_b64);
    g_autofree char *wrong_type = g_strdup_printf("ssh-ed25519 %s", rsa_b64);
    g_autofree char *wrong_curve = g_strdup_printf("ecdsa-sha2-nistp384 %s", ecdsa_b64);
    g_autofree char *cut = g_strdup_printf("ssh-ed25519 %s", cut_b64);
    g_autofree char *trailing = g_strdup_printf("ssh-ed25519 %s", long_b64);
    g_autofree char *bad_chars = g_strdup_printf("ssh-ed25519 %.20s!%s", ed_b64, ed_b64 + 21);
    g_autofree char *unpadded =
        g_strdup_printf("ssh-ed25519 %.*s", (int)strlen(ed_b64) - 1, ed_b64);
    g_autofree char *cert = g_strdup_printf("ssh-ed25519-cert-v01@openssh.com %s", ed_b64);
    g_autofree char *filler = g_strnfill(VM_SSH_KEY_LINE_MAX, 'x');
    g_autofree char *huge = g_strdup_printf("%s %s", ed, filler);
    const struct {
        const char *line;
        const char *needle;
    } cases[] = {
        {"", "no public key"},
        {"   \t ", "no public key"},
        {"ssh-ed25519", "base64 data is malformed"},
        {command, "key options (command=, from=, no-pty...) are not accepted"},
        {no_pty, "key options"},
        {from, "key options"},
        {environment, "key options"},
        {dsa, "ssh-dss (DSA) keys are not accepted"},
        {short_rsa, "the RSA key has 1024 bits: at least 2048 are needed"},
        {cert, "SSH certificates are not accepted"},
        {two, "more than one key on one line"},
        {two_bare, "more than one key on one line"},
        {wrong_type, "not a valid ssh-ed25519 key"},
        {wrong_curve, "not a valid ecdsa-sha2-nistp384 key"},
        {cut, "not a valid ssh-ed25519 key"},
        {trailing, "not a valid ssh-ed25519 key"},
        {bad_chars, "base64 data is malformed"},
        {unpadded, "base64 data is malformed"},
        {"ssh-ed25519 AAAA", "not a valid ssh-ed25519 key"},
        {"ssh-ed25519 ====", "base64 data is malformed"},
        {"foo AAAAC3NzaC1lZDI1NTE5", "unknown key type 'foo'"},
        {"\x1b[2J AAAA", "unknown key type '\\033[2J'"},
        {huge, "longer than 8192 bytes"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++)
        parse_fails(cases[i].line, cases[i].needle);
}

static void
test_text(void **state)
{
    g_autofree char *ed = vm_test_ssh_key_line("ed25519.pub");
    g_autofree char *ecdsa = vm_test_ssh_key_line("ecdsa-256.pub");
    g_autofree char *dsa = vm_test_ssh_key_line("dsa.pub");
    g_autofree char *text = g_strdup_printf("# my keys\n\n%s\r\n   \n%s\n%s", ed, ecdsa, ed);
    g_autofree char *bad = g_strdup_printf("%s\n\n%s\n", ed, dsa);
    g_autoptr(GError) error = NULL;

    g_autoptr(GPtrArray) keys = vm_ssh_key_parse_text(text, strlen(text), "keys", 32, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(keys->len, 3);
    assert_string_equal(((VmSshKey *)keys->pdata[0])->type, "ssh-ed25519");
    assert_string_equal(((VmSshKey *)keys->pdata[1])->type, "ecdsa-sha2-nistp256");
    assert_string_equal(((VmSshKey *)keys->pdata[0])->comment, "alice@laptop");

    /* The line that is wrong is named. */
    g_autoptr(GPtrArray) none = vm_ssh_key_parse_text(bad, strlen(bad), "id.pub", 32, &error);
    assert_null(none);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "id.pub, line 3: ssh-dss");
    g_clear_error(&error);

    assert_null(vm_ssh_key_parse_text(text, strlen(text), "keys", 2, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "more than 2 keys");
    g_clear_error(&error);

    assert_null(vm_ssh_key_parse_text("# nothing\n\n", 11, "empty.pub", 32, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "holds no public key");
    g_clear_error(&error);

    assert_null(vm_ssh_key_parse_text(ed, 10, "cut", 32, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "cut, line 1:");
    g_clear_error(&error);

    const char with_nul[] = "ssh-ed25519\0AAAA";
    assert_null(vm_ssh_key_parse_text(with_nul, sizeof(with_nul) - 1, "bin", 32, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "not a text file");
    g_clear_error(&error);

    const char private[] = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n";
    assert_null(vm_ssh_key_parse_text(private, strlen(private), "id_ed25519", 32, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT,
                         "id_ed25519 holds a private key: give its public key (the .pub file)");
}

static void
test_read_file(void **state)
{
    Fixture *f = *state;
    g_autofree char *good = vm_test_data_path("ssh-keys", "rsa-2048.pub", NULL);
    g_autofree char *huge = g_build_filename(f->dir, "huge.pub", NULL);
    g_autofree char *missing = g_build_filename(f->dir, "missing.pub", NULL);
    g_autofree char *ed = vm_test_ssh_key_line("ed25519.pub");
    g_autoptr(GString) big = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    g_autoptr(GPtrArray) keys = vm_ssh_key_read_file(good, 32, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(keys->len, 1);
    assert_int_equal(((VmSshKey *)keys->pdata[0])->bits, 2048);

    /* Valid keys, but more bytes than any key file holds: refused before parsing. */
    while (big->len <= VM_SSH_KEY_FILE_MAX)
        g_string_append_printf(big, "%s\n", ed);
    vm_test_write_file(huge, big->str);
    assert_null(vm_ssh_key_read_file(huge, 10000, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "larger than 65536 bytes");
    g_clear_error(&error);

    assert_null(vm_ssh_key_read_file(missing, 32, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "cannot open the key file");
    g_clear_error(&error);

    assert_null(vm_ssh_key_read_file(f->dir, 32, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "cannot read the key file");
}

static void
test_free_null(void **state)
{
    vm_ssh_key_free(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted_types),
        cmocka_unit_test(test_blanks_and_comments),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_text),
        cmocka_unit_test_setup_teardown(test_read_file, setup, teardown),
        cmocka_unit_test(test_free_null),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
