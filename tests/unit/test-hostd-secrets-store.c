/* The credential broker's secret store (hostd-secrets-store.c): modes of the directory and of
 * each file, save/load round trip with normalised hosts, a duplicate refused without touching the
 * first, rotation, listing, removal, and that nothing bad is ever written. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-secrets-store.h"
#include "vm-error.h"
#include "test-common.h"

static HostdSecret
make_secret(const char *name, char *value, char **hosts)
{
    return (HostdSecret){
        .name = (char *)name,
        .value = value,
        .hosts = hosts,
        .header = (char *)"Authorization",
        .format = (char *)"Bearer {}",
        .env = (char *)"EXAMPLE_API_KEY",
    };
}

static void
test_round_trip_and_modes(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *dir = g_build_filename(tmp->dir, "secrets", NULL);
    g_autoptr(GError) error = NULL;
    assert_true(hostd_secrets_store_prepare(dir, &error));
    assert_int_equal(vm_test_file_mode(dir), 0700);
    /* A directory left wider than 0700 is tightened. */
    assert_int_equal(chmod(dir, 0755), 0);
    assert_true(hostd_secrets_store_prepare(dir, &error));
    assert_int_equal(vm_test_file_mode(dir), 0700);

    char *hosts[] = {(char *)"API.example.com.", (char *)"*.Example.org", NULL};
    HostdSecret secret = make_secret("example-api", (char *)"sk-live-1", hosts);
    assert_true(hostd_secrets_store_save(dir, &secret, TRUE, &error));
    vm_test_assert_no_error(error);
    g_autofree char *path = g_build_filename(dir, "example-api", NULL);
    assert_int_equal(vm_test_file_mode(path), 0600);

    g_autoptr(HostdSecret) loaded = hostd_secrets_store_load(dir, "example-api", &error);
    vm_test_assert_no_error(error);
    assert_string_equal(loaded->value, "sk-live-1");
    assert_int_equal(g_strv_length(loaded->hosts), 2);
    assert_string_equal(loaded->hosts[0], "api.example.com");
    assert_string_equal(loaded->hosts[1], "*.example.org");
    assert_string_equal(loaded->header, "Authorization");
    assert_string_equal(loaded->format, "Bearer {}");
    assert_string_equal(loaded->env, "EXAMPLE_API_KEY");

    /* Several headers, as one "header=" line: the single-header form is this with one name. */
    HostdSecret several = make_secret("anthropic", (char *)"sk-ant", hosts);
    several.header = (char *)"Authorization, x-api-key";
    several.format = (char *)"{}";
    assert_true(hostd_secrets_store_save(dir, &several, TRUE, &error));
    vm_test_assert_no_error(error);
    g_autoptr(HostdSecret) several_loaded = hostd_secrets_store_load(dir, "anthropic", &error);
    vm_test_assert_no_error(error);
    assert_string_equal(several_loaded->header, "Authorization, x-api-key");
    assert_string_equal(several_loaded->format, "{}");
    assert_true(hostd_secrets_store_remove(dir, "anthropic", &error));

    /* A second create of the same name is refused and the first value stays. */
    HostdSecret again = make_secret("example-api", (char *)"sk-other", hosts);
    assert_false(hostd_secrets_store_save(dir, &again, TRUE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_EXISTS, "already exists");
    g_clear_error(&error);
    g_autofree char *text = vm_test_read_file(path);
    assert_non_null(strstr(text, "sk-live-1"));
    assert_null(strstr(text, "sk-other"));

    /* Rotation replaces it, still 0600. */
    assert_true(hostd_secrets_store_save(dir, &again, FALSE, &error));
    g_autoptr(HostdSecret) rotated = hostd_secrets_store_load(dir, "example-api", &error);
    vm_test_assert_no_error(error);
    assert_string_equal(rotated->value, "sk-other");
    assert_int_equal(vm_test_file_mode(path), 0600);
}

static void
test_list_remove_and_bad_input(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *dir = g_build_filename(tmp->dir, "secrets", NULL);
    g_autoptr(GError) error = NULL;

    g_auto(GStrv) none = hostd_secrets_store_list(dir, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(g_strv_length(none), 0);

    assert_true(hostd_secrets_store_prepare(dir, &error));
    char *hosts[] = {(char *)"api.example.com", NULL};
    HostdSecret b = make_secret("b-key", (char *)"v1", hosts);
    HostdSecret a = make_secret("a-key", (char *)"v2", hosts);
    assert_true(hostd_secrets_store_save(dir, &b, TRUE, &error));
    assert_true(hostd_secrets_store_save(dir, &a, TRUE, &error));
    g_autofree char *grants = g_build_filename(dir, "grants", NULL);
    assert_int_equal(mkdir(grants, 0700), 0);

    g_auto(GStrv) names = hostd_secrets_store_list(dir, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(g_strv_length(names), 2);
    assert_string_equal(names[0], "a-key");
    assert_string_equal(names[1], "b-key");

    /* Bad fields: refused with the field's error and nothing new on disk. */
    char *bad_hosts[] = {(char *)"bad_host", NULL};
    char *no_hosts[] = {NULL};
    HostdSecret bad[] = {
        make_secret("c-key", (char *)"", hosts),
        make_secret("c-key", (char *)"v", bad_hosts),
        make_secret("c-key", (char *)"v", no_hosts),
        make_secret("../c", (char *)"v", hosts),
    };
    bad[3].name = (char *)"../c";
    HostdSecret bad_format = make_secret("c-key", (char *)"v", hosts);
    bad_format.format = (char *)"Bearer";
    HostdSecret bad_header = make_secret("c-key", (char *)"v", hosts);
    bad_header.header = (char *)"Bad Header";
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        assert_false(hostd_secrets_store_save(dir, &bad[i], TRUE, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
        g_clear_error(&error);
    }
    assert_false(hostd_secrets_store_save(dir, &bad_format, TRUE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "exactly once");
    g_clear_error(&error);
    assert_false(hostd_secrets_store_save(dir, &bad_header, TRUE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "header");
    g_clear_error(&error);
    /* Several headers take the value where the placeholder stands: no format but "{}". */
    HostdSecret several_formatted = make_secret("c-key", (char *)"v", hosts);
    several_formatted.header = (char *)"Authorization, x-api-key";
    assert_false(hostd_secrets_store_save(dir, &several_formatted, TRUE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "several headers");
    g_clear_error(&error);
    assert_int_equal(vm_test_count_entries(dir), 3);

    assert_true(hostd_secrets_store_remove(dir, "a-key", &error));
    assert_false(hostd_secrets_store_remove(dir, "a-key", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "no secret 'a-key'");
    g_clear_error(&error);
    g_autoptr(HostdSecret) gone = hostd_secrets_store_load(dir, "a-key", &error);
    assert_null(gone);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "no secret 'a-key'");
}

/* The store's own reader and writer (no GKeyFile, whose copies of the value are freed unwiped)
 * speak GKeyFile's format: a file GKeyFile wrote (an older hostd's store) loads to the same
 * fields, and a file written now loads in GKeyFile to the same fields, escapes and all. */
static void
test_keyfile_compatible(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *dir = g_build_filename(tmp->dir, "secrets", NULL);
    g_autoptr(GError) error = NULL;
    const char *values[] = {"sk-live-1",
                            " leading and trailing ",
                            "tab\there\t",
                            "back\\slash \\n",
                            "semi;colon=equals#hash",
                            "[secret]",
                            "caf\xc3\xa9 \xe2\x82\xac"};
    char *hosts[] = {(char *)"api.example.com", (char *)"*.example.org", NULL};

    assert_true(hostd_secrets_store_prepare(dir, &error));
    for (gsize i = 0; i < G_N_ELEMENTS(values); i++) {
        g_autofree char *path = g_build_filename(dir, "k", NULL);
        HostdSecret secret = make_secret("k", (char *)values[i], hosts);
        secret.format = (char *)" Token {} ;x";

        /* as an older hostd wrote it */
        g_autoptr(GKeyFile) old = g_key_file_new();
        g_key_file_set_string(old, "secret", "value", secret.value);
        g_key_file_set_string_list(old, "secret", "hosts", (const char *const *)hosts, 2);
        g_key_file_set_string(old, "secret", "header", secret.header);
        g_key_file_set_string(old, "secret", "format", secret.format);
        g_key_file_set_string(old, "secret", "env", secret.env);
        assert_true(g_key_file_save_to_file(old, path, &error));
        g_autoptr(HostdSecret) loaded = hostd_secrets_store_load(dir, "k", &error);
        vm_test_assert_no_error(error);
        assert_string_equal(loaded->value, values[i]);
        assert_string_equal(loaded->format, secret.format);
        assert_string_equal(loaded->header, secret.header);
        assert_string_equal(loaded->env, secret.env);
        assert_int_equal(g_strv_length(loaded->hosts), 2);
        assert_string_equal(loaded->hosts[1], "*.example.org");

        /* as this one writes it, read by GKeyFile and by the store */
        assert_true(hostd_secrets_store_save(dir, &secret, FALSE, &error));
        g_autoptr(GKeyFile) now = g_key_file_new();
        assert_true(g_key_file_load_from_file(now, path, G_KEY_FILE_NONE, &error));
        g_autofree char *value = g_key_file_get_string(now, "secret", "value", &error);
        g_autofree char *format = g_key_file_get_string(now, "secret", "format", &error);
        g_auto(GStrv) list = g_key_file_get_string_list(now, "secret", "hosts", NULL, &error);
        vm_test_assert_no_error(error);
        assert_string_equal(value, values[i]);
        assert_string_equal(format, secret.format);
        assert_int_equal(g_strv_length(list), 2);
        assert_string_equal(list[0], "api.example.com");
        g_autoptr(HostdSecret) again = hostd_secrets_store_load(dir, "k", &error);
        vm_test_assert_no_error(error);
        assert_string_equal(again->value, values[i]);
        assert_string_equal(again->format, secret.format);
    }
}

/* Files that are not a secret's: refused with VM_ERROR_IO naming the secret, never half read.
 * Comments, other groups and unknown keys are what GKeyFile makes of them: nothing. */
static void
test_damaged_files(void **state)
{
    VmTestTmpDir *tmp = *state;
    g_autofree char *dir = g_build_filename(tmp->dir, "secrets", NULL);
    g_autofree char *path = g_build_filename(dir, "k", NULL);
    g_autofree char *huge = g_strdup_printf("[secret]\nvalue=%0*d\n", 70000, 0);
    const char *rest = "hosts=api.example.com;\nheader=Authorization\nformat=Bearer {}\nenv=K\n";
    const struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"[secret]\nvalue=a\\qb\n", "invalid escape"},
        {"[secret]\nvalue=a\\;b\n", "invalid escape"},
        {"[secret]\nvalue=ab\\\n", "invalid escape"},
        {"[secret]\nvalue\n", "neither a group nor a key"},
        {"[secret\nvalue=a\n", "without ']'"},
        {"value=a\n[secret]\n", "damaged"},
        {"[secret]\nhosts=api.example.com;\n", "damaged"},
        {huge, "at most"},
    };
    g_autoptr(GError) error = NULL;

    assert_true(hostd_secrets_store_prepare(dir, &error));
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        vm_test_write_file(path, bad[i].text);
        g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, "k", &error);
        assert_null(secret);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, bad[i].needle);
        assert_non_null(strstr(error->message, "'k'"));
        g_clear_error(&error);
    }

    g_autofree char *mixed =
        g_strconcat("# a comment\n[other]\nvalue=not this\n\n[secret]\n",
                    "value = first\n  value\t=\t real \\s \r\nextra=1\n", rest, NULL);
    vm_test_write_file(path, mixed);
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, "k", &error);
    vm_test_assert_no_error(error);
    assert_string_equal(secret->value, "real   ");

    /* a symbolic link in the store is not followed */
    g_autofree char *target = g_build_filename(tmp->dir, "elsewhere", NULL);
    g_autofree char *good = g_strconcat("[secret]\nvalue=v\n", rest, NULL);
    vm_test_write_file(target, good);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(target, path), 0);
    g_autoptr(HostdSecret) linked = hostd_secrets_store_load(dir, "k", &error);
    assert_null(linked);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "cannot read secret 'k'");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_and_modes, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_list_remove_and_bad_input, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_keyfile_compatible, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_damaged_files, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
