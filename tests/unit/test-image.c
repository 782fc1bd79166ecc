/* Tests for templates/vm-image*.c: lookup, downloads against a local HTTP server, and builds
 * through fake build scripts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>

#include "vm-error.h"
#include "vm-fs.h"
#include "vm-image-private.h"
#include "vm-image.h"
#include "test-common.h"

#define FILE_SIZE    (1024 * 1024)
#define VIRTUAL_SIZE ((guint64)64 << 20)

typedef struct {
    char *tmp;
    char *images_dir;
    char *serve_dir;
    char *scripts_dir;
    char *log_path;
    GSubprocess *server;
    guint port;
    char *sha256; /* of serve_dir/image.qcow2 */
    GBytes *image;
} Fixture;

typedef struct {
    GMutex lock;
    GPtrArray *messages;
    GArray *fractions;
    GCancellable *cancel;       /* cancelled on the first call matching cancel_when_known */
    gboolean cancel_when_known; /* only once the fraction is known and above 0 */
} Progress;

/* ---- helpers ---------------------------------------------------------------------------- */

static GBytes *
make_qcow2(guint64 virtual_size, guint64 backing_offset, guint32 seed)
{
    guint8 *data = g_malloc(FILE_SIZE);
    g_autoptr(GRand) rand = g_rand_new_with_seed(seed);

    for (gsize i = 0; i < FILE_SIZE; i += 4) {
        guint32 v = g_rand_int(rand);
        memcpy(data + i, &v, 4);
    }
    memset(data, 0, 104);
    memcpy(data, "QFI\xfb", 4);
    guint32 version = GUINT32_TO_BE(3);
    guint64 backing = GUINT64_TO_BE(backing_offset);
    guint64 size = GUINT64_TO_BE(virtual_size);
    memcpy(data + 4, &version, 4);
    memcpy(data + 8, &backing, 8);
    memcpy(data + 24, &size, 8);
    return g_bytes_new_take(data, FILE_SIZE);
}

static char *
sha256_of(GBytes *bytes)
{
    return g_compute_checksum_for_bytes(G_CHECKSUM_SHA256, bytes);
}

static void
write_bytes(const char *dir, const char *name, GBytes *bytes)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    gsize len;
    const char *data = g_bytes_get_data(bytes, &len);

    assert_true(g_file_set_contents(path, data, len, NULL));
}

static void
write_text(const char *dir, const char *name, const char *text, int mode)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);

    assert_true(g_file_set_contents(path, text, -1, NULL));
    assert_int_equal(chmod(path, mode), 0);
}

static char *
read_text(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

/* The visible entries of @dir, sorted and joined with spaces (lock files are hidden); "" when
 * there is no @dir. */
static char *
dir_entries(const char *dir)
{
    if (!g_file_test(dir, G_FILE_TEST_IS_DIR))
        return g_strdup("");
    return vm_test_dir_listing(dir, FALSE);
}

static guint
count_lines(const char *text, const char *needle)
{
    guint n = 0;
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);

    for (char **l = lines; *l != NULL; l++) {
        if (**l != '\0' && (needle == NULL || strstr(*l, needle) != NULL))
            n++;
    }
    return n;
}

static VmTemplate *
template_new(const char *name, VmImageSource source)
{
    VmTemplate *t = g_new0(VmTemplate, 1);

    t->name = g_strdup(name);
    t->source = source;
    t->packages = g_new0(char *, 1);
    t->egress_allow = g_new0(char *, 1);
    t->egress_deny = g_new0(char *, 1);
    t->user = g_strdup("agent");
    return t;
}

static void
template_free(VmTemplate *t)
{
    g_free(t->name);
    g_free(t->suite);
    g_free(t->mirror);
    g_free(t->url);
    g_free(t->sha256);
    g_free(t->user);
    g_strfreev(t->packages);
    g_strfreev(t->egress_allow);
    g_strfreev(t->egress_deny);
    g_free(t);
}
/* Templates are built by hand here, independent of the YAML loader. */
typedef VmTemplate TestTemplate;
G_DEFINE_AUTOPTR_CLEANUP_FUNC(TestTemplate, template_free)

static VmTemplate *
url_template(Fixture *f, const char *path, const char *sha256)
{
    VmTemplate *t = template_new("cloud", VM_IMAGE_SOURCE_URL);

    t->url = g_strdup_printf("http://127.0.0.1:%u%s", f->port, path);
    t->sha256 = g_strdup(sha256 ? sha256 : f->sha256);
    return t;
}

static VmTemplate *
build_template(void)
{
    VmTemplate *t = template_new("deb", VM_IMAGE_SOURCE_MMDEBSTRAP);

    t->suite = g_strdup("bookworm");
    t->mirror = g_strdup("host");
    g_strfreev(t->packages);
    t->packages = g_strsplit("git curl", " ", -1);
    return t;
}

static void
progress_init(Progress *p)
{
    memset(p, 0, sizeof(*p));
    g_mutex_init(&p->lock);
    p->messages = g_ptr_array_new_with_free_func(g_free);
    p->fractions = g_array_new(FALSE, FALSE, sizeof(double));
}

static void
progress_clear(Progress *p)
{
    g_ptr_array_unref(p->messages);
    g_array_unref(p->fractions);
    g_clear_object(&p->cancel);
    g_mutex_clear(&p->lock);
}

static void
progress_cb(const char *message, double fraction, gpointer user_data)
{
    Progress *p = user_data;

    g_mutex_lock(&p->lock);
    g_ptr_array_add(p->messages, g_strdup(message));
    g_array_append_val(p->fractions, fraction);
    if (p->cancel != NULL && (!p->cancel_when_known || (fraction > 0 && fraction < 1)))
        g_cancellable_cancel(p->cancel);
    g_mutex_unlock(&p->lock);
}

/* ---- fixtures --------------------------------------------------------------------------- */

static int
setup_common(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->tmp = vm_test_make_tmpdir("test-image-XXXXXX");
    f->images_dir = g_build_filename(f->tmp, "images", NULL);
    f->serve_dir = g_build_filename(f->tmp, "www", NULL);
    f->scripts_dir = g_build_filename(f->tmp, "scripts", NULL);
    f->log_path = g_build_filename(f->tmp, "requests.log", NULL);
    assert_int_equal(g_mkdir(f->serve_dir, 0755), 0);
    assert_int_equal(g_mkdir(f->scripts_dir, 0755), 0);
    g_setenv("VM_TEMPLATES_DIR", f->scripts_dir, TRUE);
    *state = f;
    return 0;
}

static int
setup_http(void **state)
{
    g_autoptr(GError) error = NULL;

    setup_common(state);
    Fixture *f = *state;

    f->image = make_qcow2(VIRTUAL_SIZE, 0, 42);
    f->sha256 = sha256_of(f->image);
    write_bytes(f->serve_dir, "image.qcow2", f->image);

    g_autofree char *script = vm_test_data_path("http-server.py", NULL);
    f->server = g_subprocess_new(G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE,
                                 &error, "python3", script, f->serve_dir, f->log_path, NULL);
    assert_non_null(f->server);
    g_autoptr(GDataInputStream) out =
        g_data_input_stream_new(g_subprocess_get_stdout_pipe(f->server));
    g_autofree char *line = g_data_input_stream_read_line(out, NULL, NULL, &error);
    assert_non_null(line);
    f->port = (guint)g_ascii_strtoull(line, NULL, 10);
    assert_true(f->port > 0);
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    if (f->server != NULL) {
        g_subprocess_force_exit(f->server);
        g_subprocess_wait(f->server, NULL, NULL);
        g_object_unref(f->server);
    }
    assert_true(vm_remove_tree(f->tmp, NULL));
    g_unsetenv("VM_TEMPLATES_DIR");
    g_unsetenv("FAKE_SLEEP");
    g_free(f->tmp);
    g_free(f->images_dir);
    g_free(f->serve_dir);
    g_free(f->scripts_dir);
    g_free(f->log_path);
    g_free(f->sha256);
    if (f->image != NULL)
        g_bytes_unref(f->image);
    g_free(f);
    return 0;
}

/* ---- lookup ----------------------------------------------------------------------------- */

static const struct {
    const char *ini; /* NULL: no image.ini */
    gboolean with_disk;
    VmErrorCode code; /* 0: found */
} lookup_cases[] = {
    {NULL, TRUE, VM_ERROR_NOT_FOUND},
    {"[image]\ndisk=base.qcow2\nvirtual-size=100\n", FALSE, VM_ERROR_NOT_FOUND},
    {"[image]\ndisk=base.qcow2\nvirtual-size=100\nkernel=vmlinuz\ninitrd=initrd.img\n", TRUE,
     VM_ERROR_NOT_FOUND},
    {"[image]\ndisk=../base.qcow2\nvirtual-size=100\n", TRUE, VM_ERROR_IMAGE},
    {"[image]\ndisk=\nvirtual-size=100\n", TRUE, VM_ERROR_IMAGE},
    {"[image]\nvirtual-size=100\n", TRUE, VM_ERROR_IMAGE},
    {"[image]\ndisk=base.qcow2\n", TRUE, VM_ERROR_IMAGE},
    {"[image]\ndisk=base.qcow2\nvirtual-size=lots\n", TRUE, VM_ERROR_IMAGE},
    {"this is not a key file\n", TRUE, VM_ERROR_IMAGE},
    {"[image]\ndisk=base.qcow2\nvirtual-size=100\n", TRUE, 0},
};

static void
test_lookup(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = template_new("img", VM_IMAGE_SOURCE_URL);
    g_autofree char *dir = g_build_filename(f->images_dir, "img", NULL);

    for (gsize i = 0; i < G_N_ELEMENTS(lookup_cases); i++) {
        g_autoptr(GError) error = NULL;

        assert_true(vm_remove_tree(dir, NULL));
        assert_int_equal(g_mkdir_with_parents(dir, 0755), 0);
        if (lookup_cases[i].ini != NULL)
            write_text(dir, "image.ini", lookup_cases[i].ini, 0644);
        if (lookup_cases[i].with_disk)
            write_text(dir, "base.qcow2", "", 0644);

        g_autoptr(VmImage) image = vm_image_lookup(f->images_dir, t, &error);
        if (lookup_cases[i].code == 0) {
            assert_non_null(image);
            vm_test_assert_no_error(error);
            g_autofree char *disk = g_build_filename(dir, "base.qcow2", NULL);
            assert_string_equal(image->disk_path, disk);
            assert_string_equal(image->dir, dir);
            assert_null(image->kernel_path);
            assert_null(image->initrd_path);
            assert_int_equal(image->virtual_size, 100);
        } else {
            assert_null(image);
            vm_test_assert_error(error, VM_ERROR, lookup_cases[i].code, NULL);
        }
    }
}

static void
test_lookup_missing(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = template_new("nothing", VM_IMAGE_SOURCE_URL);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmImage) image = vm_image_lookup(f->images_dir, t, &error);
    assert_null(image);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "nothing");
}

static void
test_bad_names(void **state)
{
    Fixture *f = *state;
    const char *names[] = {"", "..", "../etc", "a/b", ".hidden"};

    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        g_autoptr(TestTemplate) t = template_new(names[i], VM_IMAGE_SOURCE_URL);
        g_autoptr(GError) error = NULL;
        g_autoptr(GError) error2 = NULL;

        g_autoptr(VmImage) image = vm_image_lookup(f->images_dir, t, &error);
        assert_null(image);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
        g_autoptr(VmImage) image2 =
            vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error2);
        assert_null(image2);
        vm_test_assert_error(error2, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
    }
}

/* ---- downloads -------------------------------------------------------------------------- */

static void
test_download(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = url_template(f, "/image.qcow2", NULL);
    g_autoptr(GError) error = NULL;
    Progress p;

    progress_init(&p);
    g_autoptr(VmImage) image =
        vm_image_ensure(f->images_dir, t, FALSE, progress_cb, &p, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);

    g_autofree char *dir = g_build_filename(f->images_dir, "cloud", NULL);
    g_autofree char *disk = g_build_filename(dir, "base.qcow2", NULL);
    assert_string_equal(image->dir, dir);
    assert_string_equal(image->disk_path, disk);
    assert_null(image->kernel_path);
    assert_null(image->initrd_path);
    assert_null(image->cmdline);
    assert_int_equal(image->virtual_size, VIRTUAL_SIZE);

    g_autofree char *contents = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(disk, &contents, &len, NULL));
    g_autoptr(GBytes) got = g_bytes_new_static(contents, len);
    assert_true(g_bytes_equal(got, f->image));

    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autofree char *ini = g_build_filename(dir, "image.ini", NULL);
    assert_true(g_key_file_load_from_file(kf, ini, G_KEY_FILE_NONE, NULL));
    g_autofree char *sha = g_key_file_get_string(kf, "image", "sha256", NULL);
    g_autofree char *name = g_key_file_get_string(kf, "image", "template", NULL);
    g_autofree char *url = g_key_file_get_string(kf, "image", "url", NULL);
    assert_string_equal(sha, f->sha256);
    assert_string_equal(name, "cloud");
    assert_string_equal(url, t->url);
    assert_false(g_key_file_has_key(kf, "image", "kernel", NULL));

    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "cloud");

    /* Progress: known fractions only grow, and the last report says done. */
    assert_true(p.fractions->len > 0);
    double last = 0;
    for (guint i = 0; i < p.fractions->len; i++) {
        double fr = g_array_index(p.fractions, double, i);
        assert_true(fr <= 1.0);
        if (fr >= 0) {
            assert_true(fr >= last);
            last = fr;
        }
    }
    assert_true(last == 1.0);
    progress_clear(&p);

    g_autoptr(VmImage) found = vm_image_lookup(f->images_dir, t, &error);
    assert_non_null(found);
    assert_string_equal(found->disk_path, disk);

    /* Ready: a second ensure does not touch the network. */
    g_autofree char *log_before = read_text(f->tmp, "requests.log");
    g_autoptr(VmImage) again = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    assert_non_null(again);
    g_autofree char *log_after = read_text(f->tmp, "requests.log");
    assert_string_equal(log_before, log_after);
    assert_int_equal(count_lines(log_after, "GET /image.qcow2"), 1);
}

static void
test_download_force(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = url_template(f, "/image.qcow2", NULL);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmImage) first = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    assert_non_null(first);

    /* A new file behind the same URL; force fetches it and replaces the image. */
    g_autoptr(GBytes) other = make_qcow2(VIRTUAL_SIZE * 2, 0, 7);
    write_bytes(f->serve_dir, "image.qcow2", other);
    g_free(t->sha256);
    t->sha256 = sha256_of(other);

    g_autoptr(VmImage) second = vm_image_ensure(f->images_dir, t, TRUE, NULL, NULL, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(second);
    assert_int_equal(second->virtual_size, VIRTUAL_SIZE * 2);
    g_autofree char *log = read_text(f->tmp, "requests.log");
    assert_int_equal(count_lines(log, "GET /image.qcow2"), 2);
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "cloud");
}

static void
test_download_sha_mismatch(void **state)
{
    Fixture *f = *state;
    const char *wrong = "0000000000000000000000000000000000000000000000000000000000000000";
    g_autoptr(TestTemplate) t = url_template(f, "/image.qcow2", wrong);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    assert_null(image);
    g_autofree char *expected =
        g_strdup_printf("sha256 mismatch: expected %s, got %s", wrong, f->sha256);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IMAGE, expected);

    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "");
    g_clear_error(&error);
    g_autoptr(VmImage) found = vm_image_lookup(f->images_dir, t, &error);
    assert_null(found);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, NULL);
}

/* A .part holding the first half: @path must complete it. */
static void
check_resume(Fixture *f, const char *path, const char *expected_range)
{
    g_autoptr(TestTemplate) t = url_template(f, path, NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GBytes) half = g_bytes_new_from_bytes(f->image, 0, FILE_SIZE / 2);

    assert_int_equal(g_mkdir_with_parents(f->images_dir, 0755), 0);
    write_bytes(f->images_dir, "cloud.part", half);

    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);

    g_autofree char *contents = NULL;
    gsize len = 0;
    assert_true(g_file_get_contents(image->disk_path, &contents, &len, NULL));
    g_autoptr(GBytes) got = g_bytes_new_static(contents, len);
    assert_true(g_bytes_equal(got, f->image));

    g_autofree char *log = read_text(f->tmp, "requests.log");
    assert_int_equal(count_lines(log, NULL), 1);
    assert_int_equal(count_lines(log, expected_range), 1);
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "cloud");
}

static void
test_download_resume(void **state)
{
    check_resume(*state, "/image.qcow2", "bytes=524288-");
}

static void
test_download_no_range_support(void **state)
{
    /* The server sees the Range request, answers 200 with everything: start over. */
    check_resume(*state, "/norange/image.qcow2", "bytes=524288-");
}

static void
test_download_part_too_long(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = url_template(f, "/image.qcow2", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GBytes) junk = make_qcow2(1, 0, 99);

    /* A .part as long as the file (but wrong): 416, then a fresh download. */
    assert_int_equal(g_mkdir_with_parents(f->images_dir, 0755), 0);
    write_bytes(f->images_dir, "cloud.part", junk);

    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);
    assert_int_equal(image->virtual_size, VIRTUAL_SIZE);
    g_autofree char *log = read_text(f->tmp, "requests.log");
    assert_int_equal(count_lines(log, "bytes=1048576-"), 1);
    assert_int_equal(count_lines(log, "GET /image.qcow2 -"), 1);
}

static void
test_download_redirect(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = url_template(f, "/redirect/image.qcow2", NULL);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);
    g_autofree char *log = read_text(f->tmp, "requests.log");
    assert_int_equal(count_lines(log, "GET /redirect/image.qcow2"), 1);
    assert_int_equal(count_lines(log, "GET /image.qcow2"), 1);
}

static const struct {
    const char *path_or_url; /* starting with '/': on the test server */
    VmErrorCode code;
    const char *message;
} download_failures[] = {
    {"/missing.qcow2", VM_ERROR_IMAGE, "HTTP 404"},
    {"/norange/missing.qcow2", VM_ERROR_IMAGE, "HTTP 404"},
    {"ftp://127.0.0.1/image.qcow2", VM_ERROR_INVALID_ARGUMENT, "http"},
    {"file:///etc/passwd", VM_ERROR_INVALID_ARGUMENT, "http"},
    {"not a url", VM_ERROR_INVALID_ARGUMENT, "http"},
    {"http://127.0.0.1:1/image.qcow2", VM_ERROR_IMAGE, "127.0.0.1:1"},
};

static void
test_download_failures(void **state)
{
    Fixture *f = *state;

    for (gsize i = 0; i < G_N_ELEMENTS(download_failures); i++) {
        const char *where = download_failures[i].path_or_url;
        g_autoptr(TestTemplate) t = url_template(f, "/", NULL);
        g_autoptr(GError) error = NULL;

        g_free(t->url);
        t->url = where[0] == '/' ? g_strdup_printf("http://127.0.0.1:%u%s", f->port, where)
                                 : g_strdup(where);
        g_autoptr(VmImage) image =
            vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
        assert_null(image);
        vm_test_assert_error(error, VM_ERROR, download_failures[i].code,
                             download_failures[i].message);
        g_autofree char *entries = dir_entries(f->images_dir);
        assert_string_equal(entries, "");
    }
}

static void
test_download_cancel_then_resume(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = url_template(f, "/slow/image.qcow2", NULL);
    g_autoptr(GError) error = NULL;
    Progress p;

    progress_init(&p);
    p.cancel = g_cancellable_new();
    p.cancel_when_known = TRUE;
    g_autoptr(VmImage) image =
        vm_image_ensure(f->images_dir, t, FALSE, progress_cb, &p, p.cancel, &error);
    assert_null(image);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    progress_clear(&p);

    /* Only the partial download stays, for the next attempt. */
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "cloud.part");
    g_autofree char *part = g_build_filename(f->images_dir, "cloud.part", NULL);
    struct stat st;
    assert_int_equal(stat(part, &st), 0);
    assert_true(st.st_size > 0 && st.st_size < FILE_SIZE);

    g_autoptr(GError) error2 = NULL;
    g_free(t->url);
    t->url = g_strdup_printf("http://127.0.0.1:%u/image.qcow2", f->port);
    g_autoptr(VmImage) resumed =
        vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error2);
    vm_test_assert_no_error(error2);
    assert_non_null(resumed);
    g_autofree char *log = read_text(f->tmp, "requests.log");
    g_autofree char *range = g_strdup_printf("bytes=%lld-", (long long)st.st_size);
    assert_int_equal(count_lines(log, range), 1);
}

static void
test_download_already_cancelled(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = url_template(f, "/image.qcow2", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GCancellable) cancel = g_cancellable_new();

    g_cancellable_cancel(cancel);
    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, cancel, &error);
    assert_null(image);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "");
}

static void
test_download_unsafe_or_compressed(void **state)
{
    Fixture *f = *state;
    g_autoptr(GBytes) backed = make_qcow2(VIRTUAL_SIZE, 512, 3);
    const guint8 xz[] = {0xfd, '7', 'z', 'X', 'Z', 0, 1, 2};
    g_autoptr(GBytes) compressed = g_bytes_new_static(xz, sizeof(xz));
    const struct {
        const char *name;
        GBytes *bytes;
        const char *message;
    } cases[] = {
        {"backed.qcow2", backed, "refers to other files"},
        {"image.qcow2.xz", compressed, "compressed"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *path = g_strdup_printf("/%s", cases[i].name);
        g_autofree char *sha = sha256_of(cases[i].bytes);
        g_autoptr(TestTemplate) t = url_template(f, path, sha);

        write_bytes(f->serve_dir, cases[i].name, cases[i].bytes);
        g_autoptr(VmImage) image =
            vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
        assert_null(image);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IMAGE, cases[i].message);
        g_autofree char *entries = dir_entries(f->images_dir);
        assert_string_equal(entries, "");
    }
}

static void
test_download_raw(void **state)
{
    Fixture *f = *state;
    g_autofree char *qemu_img = g_find_program_in_path("qemu-img");

    if (qemu_img == NULL)
        skip();

    g_autoptr(GBytes) raw = make_qcow2(0, 0, 5);
    gsize len;
    guint8 *data = g_bytes_unref_to_data(g_bytes_ref(raw), &len);
    memcpy(data, "RAW!", 4);
    g_autoptr(GBytes) raw_disk = g_bytes_new_take(data, len);
    g_autofree char *sha = sha256_of(raw_disk);
    write_bytes(f->serve_dir, "disk.raw", raw_disk);
    g_autoptr(TestTemplate) t = url_template(f, "/disk.raw", sha);
    g_autoptr(GError) error = NULL;

    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);
    assert_int_equal(image->virtual_size, FILE_SIZE);

    gboolean is_qcow2 = FALSE;
    VmQcow2Info info;
    assert_true(vm_image_qcow2_probe(image->disk_path, &is_qcow2, &info, NULL));
    assert_true(is_qcow2);
    assert_false(info.has_backing_file);
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "cloud");
}

/* ---- builds (fake build scripts) -------------------------------------------------------- */

static const char fake_ok[] = "#!/bin/bash\n"
                              "set -euo pipefail\n"
                              "out=$1\n"
                              "echo \"$@\" >\"$VM_TEMPLATES_DIR/args\"\n"
                              "echo run >>\"$VM_TEMPLATES_DIR/count\"\n"
                              "echo 'PROGRESS 10 first step'\n"
                              "echo 'not a progress line'\n"
                              "echo 'PROGRESS 200 out of range'\n"
                              "echo 'to the log' >&2\n"
                              "sleep \"${FAKE_SLEEP:-0}\"\n"
                              "echo 'PROGRESS 50 second step'\n"
                              "cp \"$VM_TEMPLATES_DIR/disk.qcow2\" \"$out/base.qcow2\"\n"
                              "echo kernel >\"$out/vmlinuz\"\n"
                              "echo initrd >\"$out/initrd.img\"\n"
                              "echo 'PROGRESS 100 done'\n";

static const char fake_fail[] = "#!/bin/bash\n"
                                "echo 'PROGRESS 5 starting'\n"
                                "touch \"$1/base.qcow2\"\n"
                                "for i in $(seq 1 15); do echo \"log line $i\" >&2; done\n"
                                "exit 3\n";

static const char fake_no_output[] = "#!/bin/bash\n"
                                     "echo 'PROGRESS 100 done'\n";

static const char fake_hang[] = "#!/bin/bash\n"
                                "sleep 300 &\n"
                                "echo $! >\"$VM_TEMPLATES_DIR/child.pid\"\n"
                                "echo $$ >\"$VM_TEMPLATES_DIR/script.pid\"\n"
                                "echo 'PROGRESS 10 sleeping'\n"
                                "wait\n";

static void
install_script(Fixture *f, const char *text)
{
    write_text(f->scripts_dir, "build-debian-image.sh", text, 0644);
    g_autoptr(GBytes) disk = make_qcow2(VIRTUAL_SIZE, 0, 11);
    write_bytes(f->scripts_dir, "disk.qcow2", disk);
}

static void
test_build(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = build_template();
    g_autoptr(GError) error = NULL;
    Progress p;

    install_script(f, fake_ok);
    progress_init(&p);
    g_autoptr(VmImage) image =
        vm_image_ensure(f->images_dir, t, FALSE, progress_cb, &p, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);

    g_autofree char *dir = g_build_filename(f->images_dir, "deb", NULL);
    g_autofree char *kernel = g_build_filename(dir, "vmlinuz", NULL);
    g_autofree char *initrd = g_build_filename(dir, "initrd.img", NULL);
    assert_string_equal(image->dir, dir);
    assert_string_equal(image->kernel_path, kernel);
    assert_string_equal(image->initrd_path, initrd);
    assert_string_equal(image->cmdline, "root=LABEL=root rw console=ttyS0");
    assert_int_equal(image->virtual_size, VIRTUAL_SIZE);

    /* PROGRESS lines relayed in order, others ignored, then the final report. */
    assert_int_equal(p.messages->len, 4);
    assert_string_equal(g_ptr_array_index(p.messages, 0), "building deb: first step");
    assert_string_equal(g_ptr_array_index(p.messages, 1), "building deb: second step");
    assert_string_equal(g_ptr_array_index(p.messages, 2), "building deb: done");
    assert_true(g_array_index(p.fractions, double, 0) == 0.10);
    assert_true(g_array_index(p.fractions, double, 1) == 0.50);
    assert_true(g_array_index(p.fractions, double, 3) == 1.0);
    progress_clear(&p);

    /* The script ran in <images>/deb.tmp-XXXXXX with suite, mirror and packages. */
    g_autofree char *args = read_text(f->scripts_dir, "args");
    g_autofree char *prefix = g_strdup_printf("%s/deb.tmp-", f->images_dir);
    assert_true(g_str_has_prefix(args, prefix));
    assert_non_null(strstr(args, " bookworm host git curl\n"));

    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autofree char *ini = g_build_filename(dir, "image.ini", NULL);
    assert_true(g_key_file_load_from_file(kf, ini, G_KEY_FILE_NONE, NULL));
    g_autofree char *name = g_key_file_get_string(kf, "image", "template", NULL);
    g_autofree char *created = g_key_file_get_string(kf, "image", "created", NULL);
    assert_string_equal(name, "deb");
    assert_non_null(created);
    g_autofree char *log = read_text(dir, "build.log");
    assert_non_null(strstr(log, "to the log"));

    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "deb");

    /* Ready: no second run; force: a second run that replaces it. */
    g_autoptr(VmImage) again = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    assert_non_null(again);
    g_autofree char *count1 = read_text(f->scripts_dir, "count");
    assert_int_equal(count_lines(count1, NULL), 1);

    g_autoptr(VmImage) forced = vm_image_ensure(f->images_dir, t, TRUE, NULL, NULL, NULL, &error);
    assert_non_null(forced);
    g_autofree char *count2 = read_text(f->scripts_dir, "count");
    assert_int_equal(count_lines(count2, NULL), 2);
    g_autofree char *entries2 = dir_entries(f->images_dir);
    assert_string_equal(entries2, "deb");
}

static void
test_build_replaces_incomplete(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = build_template();
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = g_build_filename(f->images_dir, "deb", NULL);
    g_autofree char *stale = g_build_filename(f->images_dir, "deb.tmp-OLD123", NULL);

    /* An image dir without image.ini and a leftover from a killed build. */
    install_script(f, fake_ok);
    assert_int_equal(g_mkdir_with_parents(dir, 0755), 0);
    assert_int_equal(g_mkdir_with_parents(stale, 0755), 0);
    write_text(dir, "base.qcow2", "half", 0644);

    g_autoptr(VmImage) image = vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
    vm_test_assert_no_error(error);
    assert_non_null(image);
    assert_int_equal(image->virtual_size, VIRTUAL_SIZE);
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "deb");
}

static void
test_build_failures(void **state)
{
    Fixture *f = *state;
    const struct {
        const char *script;
        const char *message;
        const char *not_in_message;
    } cases[] = {
        {fake_fail, "exit status 3", NULL},
        {fake_fail, "log line 6\nlog line 7", "log line 5\n"},
        {fake_fail, "log line 15", NULL},
        {fake_no_output, "made no base.qcow2", NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(TestTemplate) t = build_template();
        g_autoptr(GError) error = NULL;

        install_script(f, cases[i].script);
        g_autoptr(VmImage) image =
            vm_image_ensure(f->images_dir, t, FALSE, NULL, NULL, NULL, &error);
        assert_null(image);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IMAGE, cases[i].message);
        if (cases[i].not_in_message != NULL)
            assert_null(strstr(error->message, cases[i].not_in_message));
        g_autofree char *entries = dir_entries(f->images_dir);
        assert_string_equal(entries, "");
    }
}

static void
test_build_cancel(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = build_template();
    g_autoptr(GError) error = NULL;
    Progress p;

    install_script(f, fake_hang);
    progress_init(&p);
    p.cancel = g_cancellable_new();
    gint64 start = g_get_monotonic_time();
    g_autoptr(VmImage) image =
        vm_image_ensure(f->images_dir, t, FALSE, progress_cb, &p, p.cancel, &error);
    assert_null(image);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
    progress_clear(&p);

    /* The whole process group is gone, not just the script. */
    g_autofree char *script_pid = read_text(f->scripts_dir, "script.pid");
    g_autofree char *child_pid = read_text(f->scripts_dir, "child.pid");
    vm_test_assert_process_gone((pid_t)g_ascii_strtoll(script_pid, NULL, 10), 2000);
    vm_test_assert_process_gone((pid_t)g_ascii_strtoll(child_pid, NULL, 10), 2000);
    g_autofree char *entries = dir_entries(f->images_dir);
    assert_string_equal(entries, "");
}

typedef struct {
    const char *images_dir;
    const VmTemplate *template_;
    VmImage *image;
    GError *error;
} EnsureCall;

static gpointer
ensure_thread(gpointer data)
{
    EnsureCall *call = data;

    call->image =
        vm_image_ensure(call->images_dir, call->template_, FALSE, NULL, NULL, NULL, &call->error);
    return NULL;
}

static void
test_build_concurrent(void **state)
{
    Fixture *f = *state;
    g_autoptr(TestTemplate) t = build_template();
    EnsureCall calls[2] = {{f->images_dir, t, NULL, NULL}, {f->images_dir, t, NULL, NULL}};
    GThread *threads[2];

    install_script(f, fake_ok);
    g_setenv("FAKE_SLEEP", "0.5", TRUE);
    for (int i = 0; i < 2; i++)
        threads[i] = g_thread_new("ensure", ensure_thread, &calls[i]);
    for (int i = 0; i < 2; i++) {
        g_thread_join(threads[i]);
        vm_test_assert_no_error(calls[i].error);
        assert_non_null(calls[i].image);
        vm_image_free(calls[i].image);
    }
    g_autofree char *count = read_text(f->scripts_dir, "count");
    assert_int_equal(count_lines(count, NULL), 1);
}

/* ---- the real build script, up to mmdebstrap (a fake one on PATH) ------------------------ */

static const char deb822_sources[] = "Types: deb\n"
                                     "# a comment inside the stanza\n"
                                     "URIs: http://mirror.test/debian\n"
                                     "Suites: bookworm bookworm-updates\n"
                                     "Components: main\n"
                                     "\n"
                                     "Types: deb-src\n"
                                     "URIs: http://source.test/debian\n"
                                     "Suites: bookworm-security\n"
                                     "\n"
                                     "Types: deb\n"
                                     "URIs: http://security.test/debian-security\n"
                                     "Suites: bookworm-security\n"
                                     "Components: main\n";

static const char one_line_sources[] =
    "# comment\n"
    "deb-src http://source.test/debian bookworm main\n"
    "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://one.test/debian bookworm main\n"
    "deb http://one.test/debian-security bookworm-security main\n";

static const struct {
    const char *suite;
    const char *mirror;
    const char *file; /* under VM_APT_DIR, or NULL */
    const char *contents;
    const char *package;
    const char *sources; /* expected apt lines passed to mmdebstrap, or NULL: refused */
} script_cases[] = {
    {"bookworm", "host", "sources.list.d/debian.sources", deb822_sources, "git",
     "deb http://mirror.test/debian bookworm main\n"
     "deb http://mirror.test/debian bookworm-updates main\n"
     "deb http://security.test/debian-security bookworm-security main\n"},
    {"bookworm", "host", "sources.list", one_line_sources, "git",
     "deb http://one.test/debian bookworm main\n"
     "deb http://one.test/debian bookworm-updates main\n"
     "deb http://one.test/debian-security bookworm-security main\n"},
    {"bookworm", "http://m.test/debian", NULL, NULL, "g++",
     "deb http://m.test/debian bookworm main\n"
     "deb http://m.test/debian bookworm-updates main\n"
     "deb http://m.test/debian-security bookworm-security main\n"},
    {"sid", "https://m.test/debian/", NULL, NULL, "git", "deb https://m.test/debian/ sid main\n"},
    {"trixie", "host", "sources.list.d/debian.sources", deb822_sources, "git", NULL},
    {"bookworm", "host", NULL, NULL, "git", NULL},
    {"bookworm", "ftp://m.test/debian", NULL, NULL, "git", NULL},
    {"bookworm", "http://m.test/debian main", NULL, NULL, "git", NULL},
    {"bookworm main", "host", "sources.list", one_line_sources, "git", NULL},
    {"bookworm", "host", "sources.list", one_line_sources, "git,--foo", NULL},
    {"bookworm", "host", "sources.list", one_line_sources, "-git", NULL},
    {"bookworm", "host", "sources.list", one_line_sources, "", NULL},
};

static const char fake_mmdebstrap[] = "#!/bin/sh\n"
                                      "printf '%s\\n' \"$@\" >\"$FAKE_ARGS\"\n"
                                      "echo 'I: running apt-get update...' >&2\n"
                                      "exit 1\n";

static void
test_script_sources(void **state)
{
    Fixture *f = *state;
    const char *source_dir = g_getenv("VM_SOURCE_DIR");

    if (source_dir == NULL)
        skip();
    g_autofree char *script =
        g_build_filename(source_dir, "templates", "build-debian-image.sh", NULL);
    g_autofree char *bin = g_build_filename(f->tmp, "bin", NULL);
    g_autofree char *args_path = g_build_filename(f->tmp, "args", NULL);
    assert_int_equal(g_mkdir(bin, 0755), 0);
    write_text(bin, "mmdebstrap", fake_mmdebstrap, 0755);
    g_autofree char *path = g_strdup_printf("%s:%s", bin, g_getenv("PATH"));

    for (gsize i = 0; i < G_N_ELEMENTS(script_cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *apt = g_strdup_printf("%s/apt-%zu", f->tmp, i);
        g_autofree char *out = g_strdup_printf("%s/out-%zu", f->tmp, i);
        g_autofree char *stdout_text = NULL;

        assert_int_equal(g_mkdir_with_parents(apt, 0755), 0);
        if (script_cases[i].file != NULL) {
            g_autofree char *file = g_build_filename(apt, script_cases[i].file, NULL);
            g_autofree char *parent = g_path_get_dirname(file);
            assert_int_equal(g_mkdir_with_parents(parent, 0755), 0);
            assert_true(g_file_set_contents(file, script_cases[i].contents, -1, NULL));
        }
        g_unlink(args_path);

        g_autoptr(GSubprocessLauncher) launcher =
            g_subprocess_launcher_new(G_SUBPROCESS_FLAGS_STDOUT_PIPE);
        g_subprocess_launcher_setenv(launcher, "PATH", path, TRUE);
        g_subprocess_launcher_setenv(launcher, "VM_APT_DIR", apt, TRUE);
        g_subprocess_launcher_setenv(launcher, "FAKE_ARGS", args_path, TRUE);
        g_subprocess_launcher_unsetenv(launcher, "VM_SECURITY_MIRROR");
        g_autoptr(GSubprocess) proc = g_subprocess_launcher_spawn(
            launcher, &error, "bash", script, out, script_cases[i].suite, script_cases[i].mirror,
            script_cases[i].package, NULL);
        assert_non_null(proc);
        assert_true(g_subprocess_communicate_utf8(proc, NULL, NULL, &stdout_text, NULL, &error));
        assert_true(g_subprocess_get_if_exited(proc));
        assert_int_not_equal(g_subprocess_get_exit_status(proc), 0);

        /* stdout: progress lines only; the rest went to the log. */
        g_auto(GStrv) lines = g_strsplit(stdout_text, "\n", -1);
        for (char **l = lines; *l != NULL && **l != '\0'; l++)
            assert_true(g_str_has_prefix(*l, "PROGRESS "));
        /* Its work directory is gone, whatever happened. */
        g_autofree char *entries = dir_entries(out);
        assert_string_equal(entries, "build.log");

        g_autofree char *args = read_text(f->tmp, "args");
        if (script_cases[i].sources == NULL) {
            assert_string_equal(args, "");
            continue;
        }
        assert_non_null(strstr(stdout_text, "PROGRESS 8 updating package lists\n"));
        assert_true(g_str_has_suffix(args, script_cases[i].sources));
        assert_non_null(strstr(args, "--mode=root\n--variant=apt\n"));
        g_autofree char *include =
            g_strdup_printf(",qemu-guest-agent,nftables,redsocks,%s\n", script_cases[i].package);
        assert_non_null(strstr(args, include));
        assert_non_null(strstr(args, "--dpkgopt=path-exclude=/usr/share/man/*\n"));
        g_autofree char *rootfs = g_strdup_printf("\n%s/.work.", out);
        assert_non_null(strstr(args, rootfs));
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lookup, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_missing, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_bad_names, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_download, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_force, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_sha_mismatch, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_resume, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_no_range_support, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_part_too_long, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_redirect, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_failures, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_cancel_then_resume, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_already_cancelled, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_unsafe_or_compressed, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_download_raw, setup_http, teardown),
        cmocka_unit_test_setup_teardown(test_build, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_build_replaces_incomplete, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_build_failures, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_build_cancel, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_build_concurrent, setup_common, teardown),
        cmocka_unit_test_setup_teardown(test_script_sources, setup_common, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
