/* Template loader: every fixture under tests/data/templates, the shipped templates, limits and
 * directory loading. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>

#include "vm-error.h"
#include "vm-template.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

static char *
shipped_dir(void)
{
    const char *dir = g_getenv("VM_SOURCE_DIR");

    assert_non_null(dir);
    return g_build_filename(dir, "templates", NULL);
}

static VmTemplate *
load_ok(const char *path)
{
    g_autoptr(GError) error = NULL;
    VmTemplate *t = vm_template_load_file(path, &error);

    if (t == NULL)
        fail_msg("%s: %s", path, error->message);
    assert_null(error);
    return t;
}

static void
write_file(const char *dir, const char *name, const char *contents)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);

    assert_true(g_file_set_contents(path, contents, -1, NULL));
}

static void
assert_strv(char **actual, const char *const *expected)
{
    assert_non_null(actual);
    assert_int_equal(g_strv_length(actual), g_strv_length((char **)expected));
    for (guint i = 0; expected[i] != NULL; i++)
        assert_string_equal(actual[i], expected[i]);
}

static void
assert_defaults_except_image(const VmTemplate *t)
{
    assert_string_equal(t->description, "");
    assert_int_equal(t->cpus, 2);
    assert_int_equal(t->memory_mib, 1024);
    assert_int_equal(t->disk_gib, 8);
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_false(t->disk_limits_set[i]);
    assert_string_equal(t->user, "agent");
    assert_strv(t->packages, (const char *const[]){NULL});
    assert_null(t->user_data);
    assert_false(t->checkpoints_never);
    assert_int_equal(t->checkpoint_every_s, 0);
    assert_int_equal(t->checkpoint_keep, 10);
    assert_int_equal(t->checkpoint_hourly, 24);
    assert_int_equal(t->checkpoint_daily, 7);
    assert_false(t->idle_never);
    assert_int_equal(t->idle_pause_after_s, 300);
    assert_int_equal(t->idle_save_after_s, 1800);
    assert_strv(t->egress_allow, (const char *const[]){NULL});
    assert_strv(t->egress_deny, (const char *const[]){NULL});
    assert_strv(t->secrets, (const char *const[]){NULL});
}

/* ---- good fixtures: each with what a user relies on it meaning ---- */

static void
check_minimal(const VmTemplate *t)
{
    assert_string_equal(t->name, "minimal");
    assert_int_equal(t->source, VM_IMAGE_SOURCE_MMDEBSTRAP);
    assert_string_equal(t->suite, "bookworm");
    assert_string_equal(t->mirror, "host");
    assert_null(t->url);
    assert_null(t->sha256);
    assert_defaults_except_image(t);
}

static void
check_full(const VmTemplate *t)
{
    assert_string_equal(t->name, "full-2");
    assert_string_equal(t->description, "All keys set: quoted, with a colon");
    assert_int_equal(t->source, VM_IMAGE_SOURCE_MMDEBSTRAP);
    assert_string_equal(t->suite, "trixie");
    assert_string_equal(t->mirror, "http://127.0.0.1:3142/debian");
    assert_int_equal(t->cpus, 256);
    assert_int_equal(t->memory_mib, 1048576);
    assert_int_equal(t->disk_gib, 16384);
    assert_int_equal(t->disk_limits[VM_DISK_READ_MIB], 1000000);
    assert_int_equal(t->disk_limits[VM_DISK_WRITE_MIB], 0);
    assert_int_equal(t->disk_limits[VM_DISK_READ_IOPS], 1);
    assert_int_equal(t->disk_limits[VM_DISK_WRITE_IOPS], 250);
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_true(t->disk_limits_set[i]);
    assert_string_equal(t->user, "dev_user-1");
    assert_strv(t->packages, (const char *const[]){"git", "g++", "libc6.1-dev", NULL});
    assert_string_equal(t->user_data, "#cloud-config\nwrite_files:\n  - path: /etc/motd\n"
                                      "    content: hello\n");
    assert_false(t->checkpoints_never);
    assert_int_equal(t->checkpoint_every_s, 7200);
    assert_int_equal(t->checkpoint_keep, 1000);
    assert_int_equal(t->checkpoint_hourly, 0);
    assert_int_equal(t->checkpoint_daily, 30);
    assert_false(t->idle_never);
    assert_int_equal(t->idle_pause_after_s, 90);
    assert_int_equal(t->idle_save_after_s, 86400);
    assert_strv(t->egress_allow, (const char *const[]){"deb.debian.org", "*.pypi.org:443",
                                                       "10.0.0.0/8", "[::1]:8080", "@pypi", NULL});
    assert_strv(t->egress_deny, (const char *const[]){"evil.example", NULL});
    assert_strv(t->secrets, (const char *const[]){"example-api", "gh-token2", NULL});
}

static void
check_shortcuts(const VmTemplate *t)
{
    assert_string_equal(t->name, "shortcuts");
    assert_true(t->checkpoints_never);
    assert_int_equal(t->checkpoint_every_s, 0);
    assert_true(t->idle_never);
    assert_int_equal(t->idle_pause_after_s, 0);
    assert_int_equal(t->idle_save_after_s, 0);
    assert_strv(t->egress_allow, (const char *const[]){"*", NULL});
    assert_strv(t->egress_deny, (const char *const[]){NULL});
}

static void
check_url(const VmTemplate *t)
{
    assert_string_equal(t->name, "cloud");
    assert_int_equal(t->source, VM_IMAGE_SOURCE_URL);
    assert_string_equal(t->url, "https://example.org/images/disk.img?x=1");
    /* stored lower-case whatever the file says, so comparing with sha256sum output works */
    assert_string_equal(t->sha256,
                        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    assert_null(t->suite);
    assert_null(t->mirror);
    assert_int_equal(t->cpus, 1);
    assert_int_equal(t->memory_mib, 128);
    assert_int_equal(t->disk_gib, 1);
    assert_int_equal(t->checkpoint_every_s, 0);
    assert_int_equal(t->checkpoint_keep, 10);
    assert_int_equal(t->idle_pause_after_s, 0);
    assert_int_equal(t->idle_save_after_s, 0);
    assert_false(t->idle_never);
    assert_strv(t->egress_allow, (const char *const[]){NULL});
}

static void
check_flow(const VmTemplate *t)
{
    assert_string_equal(t->name, "flow");
    assert_string_equal(t->suite, "bookworm");
    assert_defaults_except_image(t);
}

typedef struct {
    const char *file;
    void (*check)(const VmTemplate *t);
} GoodCase;

static const GoodCase good_cases[] = {
    {"good-minimal.yaml", check_minimal},     {"good-full.yaml", check_full},
    {"good-shortcuts.yaml", check_shortcuts}, {"good-url.yaml", check_url},
    {"good-flow.yaml", check_flow},
};

static void
test_good(void **state)
{
    const GoodCase *c = *state;
    g_autofree char *path = vm_test_data_path("templates", c->file, NULL);
    g_autoptr(VmTemplate) t = load_ok(path);

    assert_string_equal(t->path, path);
    c->check(t);
}

/* ---- bad fixtures: the exact position and reason ---- */

typedef struct {
    const char *file;
    int line;
    int column;
    const char *reason; /* ending in "...": only this much is checked (the rest is another
                         * module's wording) */
} BadCase;

static const BadCase bad_cases[] = {
    {"bad-alias.yaml", 3, 14, "aliases (*name) are not supported"},
    {"bad-build-missing.yaml", 3, 3, "image: missing key 'build' (mmdebstrap or url)"},
    {"bad-build.yaml", 3, 10, "image.build: must be 'mmdebstrap' or 'url', got 'docker'"},
    {"bad-checkpoints-scalar.yaml", 3, 14,
     "checkpoints: expected a mapping or 'never', got a scalar"},
    {"bad-comments-only.yaml", 1, 1, "template is empty"},
    {"bad-complex-key.yaml", 3, 3, "keys must be strings, got a list"},
    {"bad-cpus-list.yaml", 4, 9, "resources.cpus: expected an integer, got a list"},
    {"bad-cpus-negative.yaml", 3, 19, "resources.cpus: expected an integer, got '-1'"},
    {"bad-cpus-overflow.yaml", 4, 9,
     "resources.cpus: must be between 1 and 256, got 99999999999999999999999999"},
    {"bad-cpus-quoted.yaml", 3, 19, "resources.cpus: expected an integer, got '2'"},
    {"bad-cpus-too-many.yaml", 4, 9, "resources.cpus: must be between 1 and 256, got 257"},
    {"bad-cpus-word.yaml", 3, 19, "resources.cpus: expected an integer, got 'two'"},
    {"bad-cpus-zero.yaml", 4, 9, "resources.cpus: must be between 1 and 256, got 0"},
    {"bad-deep-nesting.yaml", 3, 23, "nested deeper than 8 levels"},
    {"bad-disk-large.yaml", 4, 9, "resources.disk: must be between 1 and 16384 GiB, got 16385"},
    {"bad-disk-zero.yaml", 4, 9, "resources.disk: must be between 1 and 16384 GiB, got 0"},
    {"bad-disk-read-large.yaml", 4, 14,
     "resources.disk_read: must be between 0 and 1000000 MiB/s, got 1000001"},
    {"bad-disk-iops-word.yaml", 4, 20,
     "resources.disk_write_iops: expected an integer, got 'fast'"},
    {"bad-duplicate-key.yaml", 3, 1, "duplicate key 'name'"},
    {"bad-duration-huge.yaml", 3, 22, "checkpoints.every: must be at most 365d, got 366d"},
    {"bad-duration-negative.yaml", 4, 15,
     "idle.save_after: expected a duration such as 30s, 5m, 2h or 1d, got '-5m'"},
    {"bad-duration-unit.yaml", 4, 16,
     "idle.pause_after: expected a duration such as 30s, 5m, 2h or 1d, got '5w'"},
    {"bad-duration-words.yaml", 4, 10,
     "checkpoints.every: expected a duration such as 30s, 5m, 2h or 1d, got '5 minutes'"},
    {"bad-egress-key.yaml", 4, 3, "unknown key 'egress.permit'"},
    {"bad-egress-rule.yaml", 5, 7,
     "egress.allow[0]: 'deb.debian.org pypi.org' is not a host, *.domain, address or @preset"},
    {"bad-egress-word.yaml", 3, 9, "egress: expected a mapping, 'none' or 'any', got a scalar"},
    {"bad-empty.yaml", 1, 1, "template is empty"},
    {"bad-idle-order.yaml", 5, 15, "idle.save_after: must not be shorter than idle.pause_after"},
    {"bad-idle-scalar.yaml", 3, 7, "idle: expected a mapping or 'never', got a scalar"},
    {"bad-image-missing.yaml", 1, 1, "missing key 'image'"},
    {"bad-image-scalar.yaml", 2, 8, "image: expected a mapping, got a scalar"},
    {"bad-keep-zero.yaml", 5, 9, "checkpoints.keep: must be between 1 and 1000, got 0"},
    {"bad-memory-large.yaml", 4, 11,
     "resources.memory: must be between 128 and 1048576 MiB, got 1048577"},
    {"bad-memory-small.yaml", 4, 11,
     "resources.memory: must be between 128 and 1048576 MiB, got 127"},
    {"bad-mirror.yaml", 5, 11,
     "image.mirror: must be 'host' or an http(s) URL, got 'deb.debian.org'"},
    {"bad-mmdebstrap-with-url.yaml", 5, 3, "image.url: only valid with 'build: url'"},
    {"bad-mmdebstrap-without-suite.yaml", 3, 3,
     "image: 'build: mmdebstrap' needs a 'suite' (e.g. bookworm)"},
    {"bad-name-dot.yaml", 1, 7, "name: ..."},
    {"bad-name-list.yaml", 1, 7, "name: expected a string, got a list"},
    {"bad-name-missing.yaml", 1, 1, "missing key 'name'"},
    {"bad-name-traversal.yaml", 1, 7, "name: ..."},
    {"bad-name-upper.yaml", 1, 7, "name: ..."},
    {"bad-not-utf8.yaml", 2, 17, "invalid trailing UTF-8 octet"},
    {"bad-nul-escape.yaml", 2, 14, "value contains a NUL character"},
    {"bad-null-value.yaml", 3, 6, "user: expected a string, got nothing"},
    {"bad-package-list.yaml", 3, 11, "packages: expected a list, got a scalar"},
    {"bad-package-name.yaml", 5, 5, "packages[1]: 'curl; rm -rf /' is not a Debian package name"},
    {"bad-package-nested.yaml", 3, 17, "packages[1]: expected a Debian package name, got a list"},
    {"bad-root-list.yaml", 1, 1, "template: expected a mapping, got a list"},
    {"bad-root-scalar.yaml", 1, 1, "template: expected a mapping, got a scalar"},
    {"bad-secret-name.yaml", 5, 5, "secrets[1]: 'Example_Key' is not a secret's name"},
    {"bad-sha256-not-hex.yaml", 5, 11, "image.sha256: expected 64 hex digits"},
    {"bad-sha256-short.yaml", 5, 11, "image.sha256: expected 64 hex digits"},
    {"bad-suite.yaml", 4, 10, "image.suite: 'bookworm main' is not a suite name"},
    {"bad-syntax-bracket.yaml", 3, 10,
     "while parsing a flow mapping (line 2, column 8): did not find expected ',' or '}'"},
    {"bad-syntax-indent.yaml", 4, 9, "mapping values are not allowed in this context"},
    {"bad-syntax-tab.yaml", 3, 1,
     "while scanning for the next token: found character that cannot start any token (YAML "
     "does not allow tabs for indentation)"},
    {"bad-two-documents.yaml", 3, 1, "only one YAML document is allowed"},
    {"bad-unknown-key.yaml", 3, 1, "unknown key 'colour'"},
    {"bad-unknown-nested-key.yaml", 5, 3, "unknown key 'resources.ram'"},
    {"bad-url-scheme.yaml", 4, 8, "image.url: 'ftp://example.org/disk.img' is not an http(s) URL"},
    {"bad-url-with-suite.yaml", 6, 3, "image.suite: only valid with 'build: mmdebstrap'"},
    {"bad-url-without-sha256.yaml", 3, 3, "image: 'url' needs a pinned 'sha256' of the image"},
    {"bad-user-data-list.yaml", 3, 12, "user-data: must be a cloud-config mapping, got a list"},
    {"bad-user-data-syntax.yaml", 3, 12,
     "user-data: not valid YAML: while parsing a flow sequence (line 2, column 11): did not "
     "find expected ',' or ']' (line 3, column 1 of the block)"},
    {"bad-user-long.yaml", 3, 7,
     "user: 'a23456789012345678901234567890123' must match [a-z_][a-z0-9_-]{0,31}"},
    {"bad-user-root.yaml", 3, 7, "user: 'root' is a system account"},
    {"bad-user-upper.yaml", 3, 7, "user: 'Agent' must match [a-z_][a-z0-9_-]{0,31}"},
};

static void
test_bad(void **state)
{
    const BadCase *c = *state;
    g_autofree char *path = vm_test_data_path("templates", c->file, NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmTemplate) t = vm_template_load_file(path, &error);
    g_autofree char *expected =
        g_strdup_printf("%s:%d:%d: %s", path, c->line, c->column, c->reason);
    gboolean prefix_only = g_str_has_suffix(expected, "...");

    if (t != NULL)
        fail_msg("%s: accepted", c->file);
    assert_non_null(error);
    assert_int_equal(error->domain, VM_ERROR);
    assert_int_equal(error->code, VM_ERROR_TEMPLATE);
    if (prefix_only) {
        expected[strlen(expected) - 3] = '\0';
        if (!g_str_has_prefix(error->message, expected))
            fail_msg("'%s' does not start with '%s'", error->message, expected);
    } else {
        assert_string_equal(error->message, expected);
    }
}

/* Every fixture on disk is in one of the tables, so none is silently never run. */
static void
test_every_fixture_listed(void **state)
{
    g_autofree char *dir_path = vm_test_data_path("templates", "", NULL);
    g_autoptr(GDir) dir = g_dir_open(dir_path, 0, NULL);
    const char *name;
    guint seen = 0;

    assert_non_null(dir);
    while ((name = g_dir_read_name(dir)) != NULL) {
        gboolean listed = FALSE;

        for (gsize i = 0; i < G_N_ELEMENTS(good_cases); i++)
            listed |= g_str_equal(good_cases[i].file, name);
        for (gsize i = 0; i < G_N_ELEMENTS(bad_cases); i++)
            listed |= g_str_equal(bad_cases[i].file, name);
        if (!listed)
            fail_msg("fixture %s is in no table of test-template.c", name);
        seen++;
    }
    assert_int_equal(seen, G_N_ELEMENTS(good_cases) + G_N_ELEMENTS(bad_cases));
}

/* ---- the shipped templates ---- */

static void
test_shipped_debian(void **state)
{
    g_autofree char *dir = shipped_dir();
    g_autofree char *path = g_build_filename(dir, "debian-12.yaml", NULL);
    g_autoptr(VmTemplate) t = load_ok(path);

    assert_string_equal(t->name, "debian-12");
    assert_int_equal(t->source, VM_IMAGE_SOURCE_MMDEBSTRAP);
    assert_string_equal(t->suite, "bookworm");
    assert_string_equal(t->mirror, "host");
    assert_int_equal(t->cpus, 2);
    assert_int_equal(t->memory_mib, 1024);
    assert_int_equal(t->disk_gib, 8);
    assert_string_equal(t->user, "agent");
    assert_strv(t->packages, (const char *const[]){"ca-certificates", "curl", "git", "less", "nano",
                                                   "rsync", NULL});
    assert_false(t->checkpoints_never);
    assert_int_equal(t->checkpoint_every_s, 30 * 60);
    assert_int_equal(t->checkpoint_keep, 10);
    assert_false(t->idle_never);
    assert_int_equal(t->idle_pause_after_s, 5 * 60);
    assert_int_equal(t->idle_save_after_s, 30 * 60);
    assert_strv(t->egress_allow, (const char *const[]){NULL});
    assert_strv(t->egress_deny, (const char *const[]){NULL});
}

static void
test_shipped_ubuntu(void **state)
{
    g_autofree char *dir = shipped_dir();
    g_autofree char *path = g_build_filename(dir, "ubuntu-24.04.yaml", NULL);
    g_autoptr(VmTemplate) t = load_ok(path);

    assert_string_equal(t->name, "ubuntu-24.04");
    assert_int_equal(t->source, VM_IMAGE_SOURCE_URL);
    assert_string_equal(t->url, "https://cloud-images.ubuntu.com/releases/24.04/release/"
                                "ubuntu-24.04-server-cloudimg-amd64.img");
    assert_int_equal(strlen(t->sha256), 64);
    assert_int_equal(strspn(t->sha256, "0123456789abcdef"), 64);
    assert_int_equal(t->cpus, 2);
    assert_int_equal(t->memory_mib, 1024);
    assert_int_equal(t->disk_gib, 8);
    assert_string_equal(t->user, "agent");
    assert_int_equal(t->checkpoint_every_s, 30 * 60);
    assert_int_equal(t->idle_pause_after_s, 5 * 60);
    assert_int_equal(t->idle_save_after_s, 30 * 60);
    assert_strv(t->egress_allow, (const char *const[]){NULL});
}

static void
test_shipped_dir(void **state)
{
    g_autofree char *dir = shipped_dir();
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) templates = vm_template_load_dir(dir, &error);

    if (templates == NULL)
        fail_msg("%s", error->message);
    assert_int_equal(templates->len, 2);
    assert_string_equal(((VmTemplate *)templates->pdata[0])->name, "debian-12");
    assert_string_equal(((VmTemplate *)templates->pdata[1])->name, "ubuntu-24.04");
}

/* ---- limits and odd inputs ---- */

static const char minimal[] = "name: tiny\nimage: {build: mmdebstrap, suite: bookworm}\n";

/* @len bounds the input: nothing past it is read, and no NUL terminator is needed. */
static void
test_data_len_respected(void **state)
{
    g_autofree char *buffer = g_strconcat(minimal, "colour: red\n", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmTemplate) t = vm_template_load_data(buffer, strlen(minimal), "mem", &error);

    assert_null(error);
    assert_non_null(t);
    assert_string_equal(t->name, "tiny");
    assert_string_equal(t->path, "mem");
}

static void
test_data_too_large(void **state)
{
    g_autoptr(GString) big = g_string_new(minimal);
    g_autoptr(GError) error = NULL;

    while (big->len <= 64 * 1024)
        g_string_append(big, "# padding padding padding padding padding padding padding\n");
    g_autoptr(VmTemplate) t = vm_template_load_data(big->str, big->len, "big.yaml", &error);
    assert_null(t);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
    assert_string_equal(error->message, "big.yaml: larger than 64 KiB");
}

static void
test_file_too_large(void **state)
{
    Fixture *f = *state;
    g_autoptr(GString) big = g_string_new(minimal);
    g_autofree char *path = g_build_filename(f->dir, "big.yaml", NULL);
    g_autoptr(GError) error = NULL;

    while (big->len <= 64 * 1024)
        g_string_append(big, "# padding padding padding padding padding padding padding\n");
    assert_true(g_file_set_contents(path, big->str, big->len, NULL));
    g_autoptr(VmTemplate) t = vm_template_load_file(path, &error);
    assert_null(t);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
    assert_true(g_str_has_prefix(error->message, path));
}

/* Exactly at the cap still loads. */
static void
test_data_at_limit(void **state)
{
    g_autoptr(GString) data = g_string_new(minimal);
    g_autoptr(GError) error = NULL;

    while (data->len < 64 * 1024)
        g_string_append_c(data, data->len % 64 == 63 ? '\n' : '#');
    g_string_truncate(data, 64 * 1024);
    g_autoptr(VmTemplate) t = vm_template_load_data(data->str, data->len, "limit.yaml", &error);
    assert_null(error);
    assert_non_null(t);
}

static void
test_file_missing(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, "nope.yaml", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmTemplate) t = vm_template_load_file(path, &error);

    assert_null(t);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    assert_non_null(strstr(error->message, path));
}

static void
test_file_not_regular(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(VmTemplate) t = vm_template_load_file(f->dir, &error);

    assert_null(t);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
}

/* A long hostile key is quoted escaped and cut, so the message stays one short line. */
static void
test_unknown_key_shown_escaped(void **state)
{
    g_autofree char *data = g_strconcat(minimal, "\"a\\nb", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
                                        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\": 1\n", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmTemplate) t = vm_template_load_data(data, strlen(data), "t.yaml", &error);

    assert_null(t);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
    assert_null(strchr(error->message, '\n'));
    assert_true(g_str_has_prefix(error->message, "t.yaml:3:1: unknown key 'a\\nbxxx"));
    assert_true(g_str_has_suffix(error->message, "...'"));
}

/* `pool:` keeps that many machines; absent, hostd.conf says (pool_set FALSE); 0-64 only. */
static void
test_pool(void **state)
{
    g_autoptr(VmTemplate) none = vm_template_load_data(minimal, strlen(minimal), "t.yaml", NULL);
    assert_non_null(none);
    assert_false(none->pool_set);
    assert_int_equal(none->pool, 0);

    static const guint good[] = {0, 3, VM_TEMPLATE_POOL_MAX};
    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autofree char *data = g_strdup_printf("%spool: %u\n", minimal, good[i]);
        g_autoptr(VmTemplate) t = vm_template_load_data(data, strlen(data), "t.yaml", NULL);
        assert_non_null(t);
        assert_true(t->pool_set);
        assert_int_equal(t->pool, good[i]);
    }
    static const struct {
        const char *value;
        const char *message;
    } bad[] = {
        {"65", "t.yaml:3:7: pool: must be between 0 and 64, got 65"},
        {"-1", "t.yaml:3:7: pool: expected an integer, got '-1'"},
        {"two", "t.yaml:3:7: pool: expected an integer, got 'two'"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *data = g_strdup_printf("%spool: %s\n", minimal, bad[i].value);
        g_autoptr(GError) error = NULL;
        g_autoptr(VmTemplate) t = vm_template_load_data(data, strlen(data), "t.yaml", &error);
        assert_null(t);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
        assert_string_equal(error->message, bad[i].message);
    }
}

/* ---- directories ---- */

static void
test_dir_sorted_and_filtered(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    write_file(f->dir, "b.yaml", "name: bee\nimage: {build: mmdebstrap, suite: bookworm}\n");
    write_file(f->dir, "a.yaml", "name: zed\nimage: {build: mmdebstrap, suite: bookworm}\n");
    write_file(f->dir, "c.yaml.orig", "not: loaded\n");
    write_file(f->dir, "README", "not loaded either\n");
    write_file(f->dir, ".#a.yaml", "editor lock file\n");
    g_autoptr(GPtrArray) templates = vm_template_load_dir(f->dir, &error);

    if (templates == NULL)
        fail_msg("%s", error->message);
    assert_int_equal(templates->len, 2);
    /* sorted by file name, not by template name */
    assert_string_equal(((VmTemplate *)templates->pdata[0])->name, "zed");
    assert_string_equal(((VmTemplate *)templates->pdata[1])->name, "bee");
    g_autofree char *a_path = g_build_filename(f->dir, "a.yaml", NULL);
    assert_string_equal(((VmTemplate *)templates->pdata[0])->path, a_path);
}

static void
test_dir_empty(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) templates = vm_template_load_dir(f->dir, &error);

    assert_null(error);
    assert_non_null(templates);
    assert_int_equal(templates->len, 0);
}

static void
test_dir_one_broken_fails_all(void **state)
{
    Fixture *f = *state;
    g_autofree char *broken = g_build_filename(f->dir, "b.yaml", NULL);
    g_autofree char *expected = g_strdup_printf("%s:3:1: unknown key 'cpus'", broken);
    g_autoptr(GError) error = NULL;

    write_file(f->dir, "a.yaml", "name: one\nimage: {build: mmdebstrap, suite: bookworm}\n");
    write_file(f->dir, "b.yaml",
               "name: two\nimage: {build: mmdebstrap, suite: bookworm}\n"
               "cpus: 4\n");
    write_file(f->dir, "c.yaml", "name: three\nimage: {build: mmdebstrap, suite: bookworm}\n");
    g_autoptr(GPtrArray) templates = vm_template_load_dir(f->dir, &error);

    assert_null(templates);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
    assert_string_equal(error->message, expected);
}

static void
test_dir_duplicate_name(void **state)
{
    Fixture *f = *state;
    g_autofree char *first = g_build_filename(f->dir, "a.yaml", NULL);
    g_autofree char *second = g_build_filename(f->dir, "b.yaml", NULL);
    g_autofree char *expected =
        g_strdup_printf("%s:2:7: template 'same' is already defined in %s", second, first);
    g_autoptr(GError) error = NULL;

    write_file(f->dir, "a.yaml", "name: same\nimage: {build: mmdebstrap, suite: bookworm}\n");
    write_file(f->dir, "b.yaml", "image: {build: mmdebstrap, suite: bookworm}\nname: same\n");
    g_autoptr(GPtrArray) templates = vm_template_load_dir(f->dir, &error);

    assert_null(templates);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
    assert_string_equal(error->message, expected);
}

static void
test_dir_missing(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->dir, "nope", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) templates = vm_template_load_dir(path, &error);

    assert_null(templates);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
}

int
main(void)
{
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_every_fixture_listed),
        cmocka_unit_test(test_shipped_debian),
        cmocka_unit_test(test_shipped_ubuntu),
        cmocka_unit_test(test_shipped_dir),
        cmocka_unit_test(test_data_len_respected),
        cmocka_unit_test(test_data_too_large),
        cmocka_unit_test(test_data_at_limit),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_unknown_key_shown_escaped),
        cmocka_unit_test_setup_teardown(test_file_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_not_regular, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_sorted_and_filtered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_one_broken_fails_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_duplicate_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_missing, setup, teardown),
    };
    g_autoptr(GArray) tests = g_array_new(FALSE, FALSE, sizeof(struct CMUnitTest));

    g_array_append_vals(tests, fixed, G_N_ELEMENTS(fixed));
    for (gsize i = 0; i < G_N_ELEMENTS(good_cases); i++) {
        struct CMUnitTest t = {
            .name = good_cases[i].file,
            .test_func = test_good,
            .initial_state = (void *)&good_cases[i],
        };
        g_array_append_val(tests, t);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        struct CMUnitTest t = {
            .name = bad_cases[i].file,
            .test_func = test_bad,
            .initial_state = (void *)&bad_cases[i],
        };
        g_array_append_val(tests, t);
    }
    return _cmocka_run_group_tests("template", (const struct CMUnitTest *)tests->data, tests->len,
                                   NULL, NULL);
}
