/* What qemu-img says about an image: real chains made with qemu-img read back through
 * `qemu-img info --output=json`, the same output parsed from memory and cut short at every byte,
 * hostile JSON (wrong types, huge, deeply nested), and a fake qemu-img that fails, floods stdout
 * or stderr. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include <glib/gstdio.h>

#include "vm-error.h"
#include "vm-qemu-img.h"
#include "test-common.h"

typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

#define MIB (1024 * 1024)

/* ---- helpers ------------------------------------------------------------------------------- */

static void
run_or_fail(const char *const *argv, char **ret_stdout)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *err = NULL;
    int status = 0;

    if (!g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, ret_stdout, &err,
                      &status, &error))
        fail_msg("cannot run %s: %s", argv[0], error->message);
    if (!g_spawn_check_wait_status(status, NULL))
        fail_msg("%s failed: %s", argv[0], err);
}

/* Makes a qcow2 image of @mib MiB at @path, on @backing when it is not NULL. */
static void
make_qcow2(const char *path, const char *backing, guint mib)
{
    g_autofree char *size = g_strdup_printf("%uM", mib);
    const char *plain[] = {"qemu-img", "create", "-q", "-f", "qcow2", path, size, NULL};
    const char *overlay[] = {"qemu-img", "create", "-q",    "-f", "qcow2", "-F",
                             "qcow2",    "-b",     backing, path, NULL};

    run_or_fail(backing != NULL ? overlay : plain, NULL);
}

/* Makes @path a qcow2 image whose header names the host file @host as its backing file, in
 * format raw, as an escaped QEMU could write it. */
static void
make_backed_by_host(const char *path, const char *host)
{
    const char *argv[] = {"qemu-img", "create", "-q", "-f", "qcow2", "-F",
                          "raw",      "-b",     host, path, NULL};

    run_or_fail(argv, NULL);
}

static gboolean
have_qemu_img(void)
{
    g_autofree char *path = g_find_program_in_path("qemu-img");
    return path != NULL;
}

/* base.qcow2 <- mid.qcow2 <- top.qcow2 in @dir; the paths come back in @ret. */
static void
make_chain(const char *dir, char *ret[3])
{
    ret[0] = g_build_filename(dir, "base.qcow2", NULL);
    ret[1] = g_build_filename(dir, "mid.qcow2", NULL);
    ret[2] = g_build_filename(dir, "top.qcow2", NULL);
    make_qcow2(ret[0], NULL, 64);
    make_qcow2(ret[1], ret[0], 0);
    make_qcow2(ret[2], ret[1], 0);
}

/* Puts a script named qemu-img in @dir first on PATH; returns the old PATH. */
static char *
fake_qemu_img(const char *dir, const char *script)
{
    g_autofree char *path = g_build_filename(dir, "qemu-img", NULL);
    g_autofree char *contents = g_strconcat("#!/bin/sh\n", script, NULL);
    char *old_path = g_strdup(g_getenv("PATH"));
    g_autofree char *new_path = g_strconcat(dir, ":", old_path, NULL);

    vm_test_write_file(path, contents);
    assert_int_equal(g_chmod(path, 0755), 0);
    g_setenv("PATH", new_path, TRUE);
    return old_path;
}

/* ---- real images --------------------------------------------------------------------------- */

static void
test_real_chain(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    char *paths[3];

    if (!have_qemu_img())
        skip();
    make_chain(f->dir, paths);
    chain = vm_qemu_img_info(paths[2], VM_QEMU_IMG_INFO_SHARED | VM_QEMU_IMG_INFO_BACKING_CHAIN,
                             &error);
    assert_null(error);
    assert_non_null(chain);
    assert_int_equal(chain->len, 3);
    for (guint i = 0; i < 3; i++) {
        const VmQemuImgInfo *info = g_ptr_array_index(chain, i);
        const char *below = i < 2 ? paths[1 - i] : NULL;

        assert_string_equal(info->filename, paths[2 - i]);
        assert_string_equal(info->format, "qcow2");
        vm_test_assert_nullable_string_equal(info->backing_filename, below);
        vm_test_assert_nullable_string_equal(info->backing_format, below != NULL ? "qcow2" : NULL);
        assert_int_equal(info->virtual_size, 64 * MIB);
        assert_true(info->actual_size > 0);
        assert_false(info->dirty);
        assert_true(vm_qemu_img_chain_holds(chain, paths[i]));
    }
    assert_false(vm_qemu_img_chain_holds(chain, "base.qcow2"));
    assert_false(vm_qemu_img_chain_holds(chain, f->dir));

    g_clear_pointer(&chain, g_ptr_array_unref);
    chain = vm_qemu_img_info(paths[2], VM_QEMU_IMG_INFO_NONE, &error);
    assert_null(error);
    assert_int_equal(chain->len, 1);
    assert_true(vm_qemu_img_chain_holds(chain, paths[2]));
    assert_false(vm_qemu_img_chain_holds(chain, paths[1]));
    for (guint i = 0; i < 3; i++)
        g_free(paths[i]);
}

/* A raw image, and a file name that starts with '-' (qemu-img must not take it for an option). */
static void
test_real_raw(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    g_autofree char *path = g_build_filename(f->dir, "-disk.img", NULL);
    const char *create[] = {"qemu-img", "create", "-q", "-f", "raw", path, "3M", NULL};
    g_autofree char *cwd = g_get_current_dir();
    const VmQemuImgInfo *info;

    if (!have_qemu_img())
        skip();
    run_or_fail(create, NULL);
    assert_int_equal(g_chdir(f->dir), 0);
    chain = vm_qemu_img_info("-disk.img", VM_QEMU_IMG_INFO_BACKING_CHAIN, &error);
    assert_int_equal(g_chdir(cwd), 0);
    assert_null(error);
    assert_int_equal(chain->len, 1);
    info = g_ptr_array_index(chain, 0);
    assert_string_equal(info->filename, "-disk.img");
    assert_string_equal(info->format, "raw");
    assert_null(info->backing_filename);
    assert_int_equal(info->virtual_size, 3 * MIB);
}

static void
test_real_missing_file(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(f->dir, "none.qcow2", NULL);

    if (!have_qemu_img())
        skip();
    assert_null(vm_qemu_img_info(path, VM_QEMU_IMG_INFO_SHARED, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "none.qcow2");
}

/* The captured output of a real chain parses to what the runner returns, and every strict prefix
 * of it (a truncated read) is refused without harm. */
static void
test_captured_and_truncated(void **state)
{
    Fixture *f = *state;
    g_autofree char *out = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    g_autoptr(GError) error = NULL;
    char *paths[3];
    const char *end;

    if (!have_qemu_img())
        skip();
    make_chain(f->dir, paths);
    const char *argv[] = {"qemu-img", "info", "--output=json", "-U", "--backing-chain",
                          paths[2],   NULL};
    run_or_fail(argv, &out);
    chain = vm_qemu_img_info_parse(out, -1, &error);
    assert_null(error);
    assert_int_equal(chain->len, 3);
    assert_string_equal(((VmQemuImgInfo *)g_ptr_array_index(chain, 2))->filename, paths[0]);

    end = strrchr(out, ']');
    assert_non_null(end);
    for (gsize len = 0; len <= (gsize)(end - out); len++) {
        g_autoptr(GError) cut_error = NULL;
        g_autoptr(GPtrArray) cut = vm_qemu_img_info_parse(out, len, &cut_error);

        if (cut != NULL)
            fail_msg("%zu of %zu bytes parsed", len, strlen(out));
        vm_test_assert_error(cut_error, VM_ERROR, VM_ERROR_FAILED, "qemu-img info");
    }
    for (guint i = 0; i < 3; i++)
        g_free(paths[i]);
}

/* ---- hostile and odd JSON ------------------------------------------------------------------ */

static const struct {
    const char *json;
    const char *needle; /* NULL: parses */
} parse_cases[] = {
    /* missing optional fields are defaults; unknown ones are ignored */
    {"{\"filename\": \"a\"}", NULL},
    {"[{\"filename\": \"a\"}, {\"filename\": \"b\", \"format\": null}]", NULL},
    {"{\"filename\": \"a\", \"format-specific\": {\"type\": 7, \"data\": [1, {}]}, \"x\": []}",
     NULL},
    {"{\"filename\": \"a\", \"backing-filename\": \"rel.qcow2\"}", NULL},
    /* not an image */
    {"", "qemu-img info"},
    {"   ", "qemu-img info"},
    {"null", "not an object"},
    {"\"filename\"", "not an object"},
    {"42", "not an object"},
    {"[]", "no image"},
    {"[42]", "not an object"},
    {"[{\"filename\": \"a\"}, \"b\"]", "not an object"},
    {"[[{\"filename\": \"a\"}]]", "not an object"},
    {"{}", "no \"filename\""},
    {"{\"format\": \"qcow2\"}", "no \"filename\""},
    /* wrong types */
    {"{\"filename\": 1}", "\"filename\" is not a string"},
    {"{\"filename\": [\"a\"]}", "\"filename\" is not a string"},
    {"{\"filename\": \"a\", \"format\": {}}", "\"format\" is not a string"},
    {"{\"filename\": \"a\", \"full-backing-filename\": true}", "not a string"},
    {"{\"filename\": \"a\", \"backing-filename-format\": 2}", "not a string"},
    {"{\"filename\": \"a\", \"virtual-size\": \"1073741824\"}", "\"virtual-size\" is not a size"},
    {"{\"filename\": \"a\", \"virtual-size\": -1}", "\"virtual-size\" is not a size"},
    {"{\"filename\": \"a\", \"virtual-size\": 1.5}", "\"virtual-size\" is not a size"},
    {"{\"filename\": \"a\", \"virtual-size\": 1e300}", "\"virtual-size\" is not a size"},
    {"{\"filename\": \"a\", \"actual-size\": [1]}", "\"actual-size\" is not a size"},
    {"{\"filename\": \"a\", \"dirty-flag\": \"false\"}", "\"dirty-flag\" is not a boolean"},
    /* not JSON */
    {"{\"filename\": \"a\"", "qemu-img info"},
    {"{\"filename\": \"a\"} {", "qemu-img info"},
    {"image: a\nfile format: qcow2\n", "qemu-img info"},
    {"{\"filename\": \"\xff\xfe\"}", "qemu-img info"},
};

static void
test_parse_cases(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(parse_cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GPtrArray) chain = vm_qemu_img_info_parse(parse_cases[i].json, -1, &error);

        if (parse_cases[i].needle == NULL) {
            if (chain == NULL)
                fail_msg("case %zu: %s", i, error->message);
            assert_true(chain->len >= 1);
            continue;
        }
        if (chain != NULL)
            fail_msg("case %zu parsed: %s", i, parse_cases[i].json);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, parse_cases[i].needle);
    }
}

static void
test_parse_defaults(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) chain = vm_qemu_img_info_parse(
        "{\"filename\": \"a\", \"backing-filename\": \"rel.qcow2\"}\n", -1, &error);
    const VmQemuImgInfo *info;

    assert_null(error);
    info = g_ptr_array_index(chain, 0);
    assert_string_equal(info->filename, "a");
    assert_null(info->format);
    assert_string_equal(info->backing_filename, "rel.qcow2");
    assert_null(info->backing_format);
    assert_int_equal(info->virtual_size, 0);
    assert_int_equal(info->actual_size, 0);
    assert_false(info->dirty);
}

/* The length given is the length used: a NUL inside it is not the end. */
static void
test_parse_length(void **state)
{
    static const char text[] = "{\"filename\": \"a\"}\0garbage";
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) whole = vm_qemu_img_info_parse(text, sizeof text - 1, &error);
    g_autoptr(GPtrArray) up_to_nul = NULL;

    assert_null(whole);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "qemu-img info");
    g_clear_error(&error);
    up_to_nul = vm_qemu_img_info_parse(text, strlen(text), &error);
    assert_null(error);
    assert_int_equal(up_to_nul->len, 1);
}

/* Nesting that would overflow json-glib's stack, inside and outside strings. */
static void
test_parse_deep(void **state)
{
    const gsize depth = 1000 * 1000;
    g_autoptr(GString) deep = g_string_sized_new(2 * depth + 64);
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    g_autofree char *in_string = NULL;
    g_autofree char *escaped = NULL;

    for (gsize i = 0; i < depth; i++)
        g_string_append_c(deep, '[');
    for (gsize i = 0; i < depth; i++)
        g_string_append_c(deep, ']');
    assert_null(vm_qemu_img_info_parse(deep->str, deep->len, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "nested deeper");
    g_clear_error(&error);

    /* Brackets inside a string (even after an escaped quote) are text, not nesting. */
    g_string_truncate(deep, 0);
    for (gsize i = 0; i < 1000; i++)
        g_string_append_c(deep, '[');
    in_string = g_strdup_printf("{\"filename\": \"\\\"%s\"}", deep->str);
    chain = vm_qemu_img_info_parse(in_string, -1, &error);
    assert_null(error);
    assert_int_equal(strlen(((VmQemuImgInfo *)g_ptr_array_index(chain, 0))->filename), 1001);

    /* Exactly the limit parses as far as the depth goes. */
    g_string_truncate(deep, 0);
    for (gsize i = 0; i < VM_QEMU_IMG_DEPTH_MAX - 1; i++)
        g_string_append_c(deep, '[');
    for (gsize i = 0; i < VM_QEMU_IMG_DEPTH_MAX - 1; i++)
        g_string_append_c(deep, ']');
    escaped = g_strdup_printf("{\"filename\": \"a\", \"x\": %s}", deep->str);
    g_clear_pointer(&chain, g_ptr_array_unref);
    chain = vm_qemu_img_info_parse(escaped, -1, &error);
    assert_null(error);
    assert_non_null(chain);
}

static void
test_parse_huge(void **state)
{
    gsize len = VM_QEMU_IMG_OUTPUT_MAX + 1;
    g_autofree char *huge = g_malloc(len + 1);
    g_autoptr(GError) error = NULL;

    /* Valid JSON padded with whitespace: refused for its size alone. */
    memset(huge, ' ', len);
    memcpy(huge, "{\"filename\": \"a\"}", strlen("{\"filename\": \"a\"}"));
    huge[len] = '\0';
    assert_null(vm_qemu_img_info_parse(huge, -1, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "more than");
    g_clear_error(&error);
    assert_null(vm_qemu_img_info_parse(huge, len, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "more than");
    g_clear_error(&error);

    /* One byte less is fine. */
    huge[len - 1] = '\0';
    g_autoptr(GPtrArray) chain = vm_qemu_img_info_parse(huge, -1, &error);
    assert_null(error);
    assert_non_null(chain);
}

/* ---- a fake qemu-img ----------------------------------------------------------------------- */

static void
test_fake_arguments(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    g_autofree char *old_path = fake_qemu_img(f->dir, "printf '{\"filename\": \"%s\"}' \"$*\"\n");

    chain =
        vm_qemu_img_info("/x y", VM_QEMU_IMG_INFO_SHARED | VM_QEMU_IMG_INFO_BACKING_CHAIN, &error);
    assert_null(error);
    assert_string_equal(((VmQemuImgInfo *)g_ptr_array_index(chain, 0))->filename,
                        "info --output=json -U --backing-chain -- /x y");
    g_clear_pointer(&chain, g_ptr_array_unref);
    chain = vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error);
    assert_null(error);
    assert_string_equal(((VmQemuImgInfo *)g_ptr_array_index(chain, 0))->filename,
                        "info --output=json -- /x");
    g_setenv("PATH", old_path, TRUE);
}

static void
test_fake_fails(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *old_path =
        fake_qemu_img(f->dir, "echo '{\"filename\": \"a\"}'\necho 'it broke' >&2\nexit 1\n");

    assert_null(vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "qemu-img failed: it broke");
    g_setenv("PATH", old_path, TRUE);
}

/* Endless output: the read stops at the cap and qemu-img is killed. */
static void
test_fake_floods_stdout(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *old_path = fake_qemu_img(f->dir, "exec yes '{}'\n");

    assert_null(vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "printed more than");
    g_setenv("PATH", old_path, TRUE);
}

/* Much more stderr than a pipe holds before the JSON: both pipes are read, nothing stalls, and
 * only the start of it is kept. */
static void
test_fake_floods_stderr(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    g_autofree char *old_path = fake_qemu_img(
        f->dir, "head -c 4000000 /dev/zero | tr '\\0' x >&2\necho '{\"filename\": \"a\"}'\n");

    chain = vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error);
    assert_null(error);
    assert_int_equal(chain->len, 1);
    g_setenv("PATH", old_path, TRUE);

    g_clear_pointer(&old_path, g_free);
    old_path = fake_qemu_img(f->dir, "head -c 4000000 /dev/zero | tr '\\0' x >&2\nexit 3\n");
    assert_null(vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "qemu-img failed: xxx");
    assert_true(strlen(error->message) < 8192);
    g_setenv("PATH", old_path, TRUE);
}

static void
test_fake_bad_json(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *old_path = fake_qemu_img(f->dir, "echo 'image: /x'\n");

    assert_null(vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "qemu-img info");
    g_setenv("PATH", old_path, TRUE);
}

static void
test_no_qemu_img(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *old_path = g_strdup(g_getenv("PATH"));

    g_setenv("PATH", f->dir, TRUE);
    assert_null(vm_qemu_img_info("/x", VM_QEMU_IMG_INFO_NONE, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "cannot run qemu-img");
    g_setenv("PATH", old_path, TRUE);
}

/* ---- hostile headers ------------------------------------------------------------------------ */

/* Wraps the real qemu-img in a script first on PATH that records, with strace, every file it
 * opens into @log; returns the old PATH, or NULL when strace cannot trace here. */
static char *
traced_qemu_img(const char *dir, const char *log)
{
    g_autofree char *strace = g_find_program_in_path("strace");
    g_autofree char *real = g_find_program_in_path("qemu-img");
    const char *probe[] = {"strace", "-f",        "-qq",  "-e", "trace=open,openat",
                           "-o",     "/dev/null", "true", NULL};
    int status = 0;

    if (strace == NULL || real == NULL ||
        !g_spawn_sync(NULL, (char **)probe, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDERR_TO_DEV_NULL,
                      NULL, NULL, NULL, NULL, &status, NULL) ||
        !g_spawn_check_wait_status(status, NULL))
        return NULL;
    g_autofree char *q_strace = g_shell_quote(strace);
    g_autofree char *q_real = g_shell_quote(real);
    g_autofree char *q_log = g_shell_quote(log);
    g_autofree char *script = g_strdup_printf(
        "exec %s -f -qq -e trace=open,openat -o %s %s \"$@\"\n", q_strace, q_log, q_real);
    return fake_qemu_img(dir, script);
}

/* Whether the strace log at @log shows @path opened. */
static gboolean
log_opens(const char *log, const char *path)
{
    g_autofree char *text = vm_test_read_file(log);
    g_autofree char *quoted = g_strdup_printf("\"%s\"", path);

    return strstr(text, quoted) != NULL;
}

/* Real images whose headers name a host file: as backing file (as raw), or as external data file
 * (made so at create, and renamed to it later with qemu-img amend). vm_qemu_img_check() refuses
 * each, naming the image and the file, and, where strace can tell, qemu-img never opened that file;
 * the same qemu-img reading the chain does open it (what the check keeps hostd from doing). An
 * image as hostd makes it passes, and only on the backing file hostd recorded. */
static void
test_real_hostile_headers(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *base = g_build_filename(f->dir, "base.qcow2", NULL);
    g_autofree char *good = g_build_filename(f->dir, "good.qcow2", NULL);
    g_autofree char *host = g_build_filename(f->dir, "host-secret", NULL);
    g_autofree char *host_data = g_build_filename(f->dir, "host-data", NULL);
    g_autofree char *backed = g_build_filename(f->dir, "backing-host.qcow2", NULL);
    g_autofree char *data = g_build_filename(f->dir, "data-host.qcow2", NULL);
    g_autofree char *amended = g_build_filename(f->dir, "amended.qcow2", NULL);
    g_autofree char *data_opt = g_strdup_printf("data_file=%s,data_file_raw=on", host_data);
    g_autofree char *amend_opt = g_strdup_printf("data_file=%s", host);
    g_autofree char *benign = g_build_filename(f->dir, "benign-data", NULL);
    g_autofree char *benign_opt = g_strdup_printf("data_file=%s", benign);
    g_autofree char *log = g_build_filename(f->dir, "strace.log", NULL);

    if (!have_qemu_img())
        skip();
    vm_test_write_file(host, "host secret marker 7f3a\n");
    make_qcow2(base, NULL, 4);
    make_qcow2(good, base, 0);
    const char *data_host[] = {"qemu-img", "create", "-q", "-f", "qcow2",
                               "-o",       data_opt, data, "4M", NULL};
    const char *amend[] = {"qemu-img", "amend",   "-q",    "-f", "qcow2",
                           "-o",       amend_opt, amended, NULL};
    make_backed_by_host(backed, host);
    run_or_fail(data_host, NULL);
    /* amend renames a data file; it cannot add one to an image without. */
    const char *amended_first[] = {"qemu-img", "create",   "-q",    "-f", "qcow2",
                                   "-o",       benign_opt, amended, "4M", NULL};
    run_or_fail(amended_first, NULL);
    run_or_fail(amend, NULL);

    assert_true(vm_qemu_img_check(good, base, 0, &error));
    assert_false(vm_qemu_img_check(good, host, 0, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, good);
    g_clear_error(&error);
    assert_false(vm_qemu_img_check(base, base, 0, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, "none");
    g_clear_error(&error);

    g_autofree char *old_path = traced_qemu_img(f->dir, log);
    const struct {
        const char *image;
        const char *backing; /* what hostd's record would say */
        const char *names;   /* the host file its header names */
    } cases[] = {
        {backed, base, host},
        {backed, host, host}, /* even when the record were to say so: raw is refused */
        {data, NULL, host_data},
        {amended, NULL, host},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) case_error = NULL;

        assert_false(vm_qemu_img_check(cases[i].image, cases[i].backing, 0, &case_error));
        vm_test_assert_error(case_error, VM_ERROR, VM_ERROR_BAD_STATE, cases[i].image);
        if (!g_str_equal(cases[i].backing != NULL ? cases[i].backing : "", cases[i].names))
            assert_non_null(strstr(case_error->message, cases[i].names));
        else
            assert_non_null(strstr(case_error->message, "raw"));
        if (old_path != NULL) {
            assert_true(log_opens(log, cases[i].image));
            if (log_opens(log, cases[i].names))
                fail_msg("qemu-img opened %s checking %s", cases[i].names, cases[i].image);
        }
    }
    if (old_path == NULL) {
        print_message("strace cannot trace here: what qemu-img opened is not checked\n");
        return;
    }
    /* The detector: reading the chain, qemu-img opens the host file. */
    g_autoptr(GPtrArray) chain =
        vm_qemu_img_info(backed, VM_QEMU_IMG_INFO_SHARED | VM_QEMU_IMG_INFO_BACKING_CHAIN, &error);
    assert_non_null(chain);
    assert_true(log_opens(log, host));
    g_setenv("PATH", old_path, TRUE);
}

/* The check as an agent's uid: its own image reads, one only root may open does not (so
 * qemu-img did not run as root), and a checked header is judged the same way. */
static void
test_check_as_agent(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *base = g_build_filename(f->dir, "base.qcow2", NULL);
    g_autofree char *mine = g_build_filename(f->dir, "mine.qcow2", NULL);
    g_autofree char *roots = g_build_filename(f->dir, "roots.qcow2", NULL);
    const guint agent = 1879113021;

    if (!have_qemu_img())
        skip();
    make_qcow2(base, NULL, 4);
    make_qcow2(mine, base, 0);
    make_qcow2(roots, base, 0);
    if (geteuid() != 0) {
        assert_false(vm_qemu_img_check(mine, base, agent, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "as uid");
        skip();
    }
    assert_int_equal(chmod(f->dir, 0711), 0);
    assert_int_equal(chown(mine, agent, agent), 0);
    assert_int_equal(chmod(mine, 0600), 0);
    assert_int_equal(chmod(roots, 0600), 0);

    assert_true(vm_qemu_img_check(mine, base, agent, &error));
    assert_null(error);
    assert_false(vm_qemu_img_check(mine, roots, agent, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_BAD_STATE, mine);
    g_clear_error(&error);
    assert_false(vm_qemu_img_check(roots, base, agent, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "Permission denied");
    g_clear_error(&error);
    assert_true(vm_qemu_img_check(roots, base, 0, &error));
}

/* An overlay is made without opening its backing image: on an image whose header names a host
 * file, neither is opened, and the new header names the backing image as asked, in qcow2. */
static void
test_real_overlay_opens_nothing(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *host = g_build_filename(f->dir, "host-secret", NULL);
    g_autofree char *backed = g_build_filename(f->dir, "backing-host.qcow2", NULL);
    g_autofree char *overlay = g_build_filename(f->dir, "overlay.qcow2", NULL);
    g_autofree char *log = g_build_filename(f->dir, "strace.log", NULL);

    if (!have_qemu_img())
        skip();
    vm_test_write_file(host, "host secret marker 7f3a\n");
    make_backed_by_host(backed, host);
    vm_test_write_file(overlay, "an older file, replaced\n");

    g_autofree char *old_path = traced_qemu_img(f->dir, log);
    assert_true(vm_qemu_img_overlay(backed, overlay, 2, &error));
    assert_null(error);
    if (old_path != NULL) {
        assert_true(log_opens(log, overlay));
        assert_false(log_opens(log, backed));
        assert_false(log_opens(log, host));
        g_setenv("PATH", old_path, TRUE);
    }
    g_autoptr(GPtrArray) info =
        vm_qemu_img_info(overlay, VM_QEMU_IMG_INFO_SHARED | VM_QEMU_IMG_INFO_QCOW2, &error);
    assert_non_null(info);
    const VmQemuImgInfo *top = info->pdata[0];
    assert_true(vm_qemu_img_info_check(top, overlay, backed, &error));
    assert_int_equal(top->virtual_size, 2ull * 1024 * MIB);
}

/* A safe rebase as an agent's uid: what the image read through the image it leaves is copied
 * into it first, so it reads the same; an image only root may write is refused to that uid. */
static void
test_real_rebase_as_agent(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) chain = g_new0(char *, 4);
    const guint agent = 1879113022;

    if (!have_qemu_img())
        skip();
    make_chain(f->dir, chain);
    const char *write[] = {"qemu-io", "-f", "qcow2", "-c", "write -q -P 0xab 0 64k",
                           chain[1],  NULL};
    const char *read[] = {"qemu-io", "-f", "qcow2", "-c", "read -q -P 0xab 0 64k", chain[2], NULL};
    run_or_fail(write, NULL);
    if (geteuid() != 0) {
        assert_false(vm_qemu_img_rebase(chain[0], chain[2], agent, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "as uid");
        skip();
    }
    /* As hostd leaves them: the agent's own image its id's, the one below readable to its group,
     * the base readable to all. */
    assert_int_equal(chmod(f->dir, 0711), 0);
    assert_int_equal(chown(chain[2], agent, agent), 0);
    assert_int_equal(chmod(chain[2], 0600), 0);
    assert_int_equal(chown(chain[1], 0, agent), 0);
    assert_int_equal(chmod(chain[1], 0440), 0);
    assert_int_equal(chmod(chain[0], 0444), 0);

    assert_false(vm_qemu_img_rebase(chain[0], chain[1], agent, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "Permission denied");
    g_clear_error(&error);
    assert_true(vm_qemu_img_rebase(chain[0], chain[2], agent, &error));
    assert_null(error);
    assert_true(vm_qemu_img_check(chain[2], chain[0], agent, &error));
    /* Reads the same without the image it left. */
    assert_int_equal(g_unlink(chain[1]), 0);
    run_or_fail(read, NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_real_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_as_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_raw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_hostile_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_overlay_opens_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_rebase_as_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_captured_and_truncated, setup, teardown),
        cmocka_unit_test(test_parse_cases),
        cmocka_unit_test(test_parse_defaults),
        cmocka_unit_test(test_parse_length),
        cmocka_unit_test(test_parse_deep),
        cmocka_unit_test(test_parse_huge),
        cmocka_unit_test_setup_teardown(test_fake_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_floods_stdout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_floods_stderr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_bad_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_qemu_img, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
