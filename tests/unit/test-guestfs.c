/* Files inside checkpoint images: guest paths from users are checked and normalized; a diff
 * between two images of one chain lists exactly the added, deleted and modified paths (not a
 * touch, not a directory whose entries changed); an export is a tar of just the chosen paths and
 * their parent directories, with owners, modes and links as in the image; a path missing from the
 * image fails with NOT_FOUND and leaves no tar behind.
 *
 * The images are built without an appliance (mkfs.ext4 -d from directory trees, qemu-img); the
 * checks that read them share one appliance launch (vm_guestfs_diff() and vm_guestfs_export() are
 * that launch plus one call; only their early failures are checked here, which need no launch).
 * Without a working libguestfs the checks that need it skip. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "vm-guestfs.h"
#include "vm-error.h"
#include "vm-spawn.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

#define T0 1600000000 /* mtime of everything in the old tree */
#define T1 1700000000 /* mtime of what the new tree touched */

/* ---- the two trees ------------------------------------------------------------------------- */

typedef struct {
    char type; /* 'd' directory, 'f' file, 'l' symbolic link */
    const char *path;
    const char *data; /* file content or link target */
    guint mode;
    guint uid;
    gint64 mtime;
} Node;

static const Node common_nodes[] = {
    {'d', "etc", NULL, 0755, 0, T0},
    {'f', "etc/motd", "welcome\n", 0644, 0, T0},
    {'d', "home", NULL, 0755, 0, T0},
    {'d', "home/u", NULL, 0750, 1000, T0},
    {'f', "home/u/notes.txt", "my notes\n", 0640, 1000, T0},
    {'f', "home/u/keep.txt", "keep\n", 0644, 1000, T0},
    {'f', "home/u/n*", "a name that is a wildcard matching notes.txt\n", 0644, 1000, T0},
    {'l', "home/u/docs", "proj/sub", 0, 0, T0},
    {'d', "home/u/proj2", NULL, 0755, 1000, T0},
    {'f', "home/u/proj2/other.txt", "other\n", 0644, 1000, T0},
    {'d', "srv", NULL, 0755, 0, T0},
    {'d', "srv/data", NULL, 0755, 0, T0},
    {'f', "srv/data/line\nbreak", "odd name\n", 0644, 0, T0},
    {'d', "var", NULL, 0755, 0, T0},
    {'d', "var/lib", NULL, 0755, 0, T0},
};

static const Node old_nodes[] = {
    {'f', "etc/hostname", "old-host\n", 0644, 0, T0},
    {'f', "etc/config.ini", "a=1\n", 0644, 0, T0},
    {'l', "home/u/link", "notes.txt", 0, 0, T0},
    {'d', "home/u/proj", NULL, 0755, 1000, T0},
    {'f', "home/u/proj/a.c", "int main;\n", 0644, 1000, T0},
    {'f', "home/u/proj/run.sh", "#!/bin/sh\n", 0755, 1000, T0},
    {'d', "home/u/proj/sub", NULL, 0700, 1000, T0},
    {'f', "home/u/proj/sub/b.c", "b\n", 0600, 1000, T0},
    {'l', "home/u/proj/link", "a.c", 0, 0, T0},
    {'f', "home/u/proj/we*ird[1]", "w\n", 0644, 1000, T0},
    {'f', "home/u/proj/x y", "space\n", 0644, 1000, T0},
    {'f', "srv/data/owned", "mine\n", 0644, 1000, T0},
    {'f', "var/lib/state", "1\n", 0644, 0, T0},
};

/* The new tree: what the old one became. motd is only touched (T1 over T0, same content). */
static const Node new_nodes[] = {
    {'f', "etc/motd", "welcome\n", 0644, 0, T1},
    {'f', "etc/hostname", "new-host\n", 0644, 0, T1},
    {'f', "etc/config.ini", "a=1\n", 0600, 0, T0},
    {'l', "home/u/link", "keep.txt", 0, 0, T1},
    {'f', "home/u/added.txt", "new\n", 0644, 1000, T1},
    {'d', "home/u/new-tree", NULL, 0755, 1000, T1},
    {'d', "home/u/new-tree/d", NULL, 0755, 1000, T1},
    {'f', "home/u/new-tree/d/e.txt", "e\n", 0644, 1000, T1},
    {'f', "home/u/new-tree/f.txt", "f\n", 0644, 1000, T1},
    {'f', "srv/data/owned", "mine\n", 0644, 2000, T0},
    {'f', "var/lib/state", "12\n", 0644, 0, T1},
    /* Entries came and went: the directory's mtime moves, which is no change of its own. */
    {'d', "home/u", NULL, 0750, 1000, T1},
};

static const char full_diff[] = "M /etc/config.ini\n"
                                "M /etc/hostname\n"
                                "A /home/u/added.txt\n"
                                "M /home/u/link\n"
                                "A /home/u/new-tree\n"
                                "A /home/u/new-tree/d\n"
                                "A /home/u/new-tree/d/e.txt\n"
                                "A /home/u/new-tree/f.txt\n"
                                "D /home/u/proj\n"
                                "D /home/u/proj/a.c\n"
                                "D /home/u/proj/link\n"
                                "D /home/u/proj/run.sh\n"
                                "D /home/u/proj/sub\n"
                                "D /home/u/proj/sub/b.c\n"
                                "D /home/u/proj/we*ird[1]\n"
                                "D /home/u/proj/x y\n"
                                "M /srv/data/owned\n"
                                "M /var/lib/state\n";

static const char proj_deleted[] = "D /home/u/proj\n"
                                   "D /home/u/proj/a.c\n"
                                   "D /home/u/proj/link\n"
                                   "D /home/u/proj/run.sh\n"
                                   "D /home/u/proj/sub\n"
                                   "D /home/u/proj/sub/b.c\n"
                                   "D /home/u/proj/we*ird[1]\n"
                                   "D /home/u/proj/x y\n";

/* ---- group fixture: images and one shared session ------------------------------------------ */

static struct {
    char *dir;
    char *old_image;  /* from the old tree */
    char *new_image;  /* from the new tree, as an overlay on old_image */
    char *same_image; /* an empty overlay on new_image */
    char *skip;       /* why the appliance checks cannot run, or NULL */
    VmGuestfs *fs;    /* old, new, same */
} g_images;

enum { OLD = 0, NEW = 1, SAME = 2 };

static gboolean
run_argv(const char *const *argv, char **ret_why)
{
    g_autoptr(GError) error = NULL;

    if (!vm_spawn_run(argv, NULL, NULL, &error)) {
        *ret_why = g_strdup(error->message);
        return FALSE;
    }
    return TRUE;
}

static void
node_put(const char *root, const Node *n)
{
    g_autofree char *path = g_build_filename(root, n->path, NULL);

    switch (n->type) {
    case 'd':
        if (g_mkdir(path, 0700) != 0 && errno != EEXIST)
            fail_msg("mkdir %s: %s", path, g_strerror(errno));
        break;
    case 'f':
        g_unlink(path);
        vm_test_write_file(path, n->data);
        break;
    case 'l':
        g_unlink(path);
        if (symlink(n->data, path) != 0)
            fail_msg("symlink %s: %s", path, g_strerror(errno));
        break;
    default:
        fail_msg("bad node type %c", n->type);
    }
    if (lchown(path, n->uid, n->uid) != 0)
        fail_msg("chown %s: %s", path, g_strerror(errno));
    if (n->type != 'l' && chmod(path, n->mode) != 0)
        fail_msg("chmod %s: %s", path, g_strerror(errno));
}

static void
node_time(const char *root, const Node *n)
{
    g_autofree char *path = g_build_filename(root, n->path, NULL);
    struct timespec times[2] = {{n->mtime, 0}, {n->mtime, 0}};

    if (utimensat(AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW) != 0)
        fail_msg("utimensat %s: %s", path, g_strerror(errno));
}

static void
tree_build(const char *root, const Node *extra, gsize n_extra)
{
    g_assert_cmpint(g_mkdir(root, 0755), ==, 0);
    g_assert_cmpint(chmod(root, 0755), ==, 0);
    for (gsize i = 0; i < G_N_ELEMENTS(common_nodes); i++)
        node_put(root, &common_nodes[i]);
    for (gsize i = 0; i < n_extra; i++)
        node_put(root, &extra[i]);
    /* Times last: creating an entry moves its directory's mtime. */
    for (gsize i = 0; i < G_N_ELEMENTS(common_nodes); i++)
        node_time(root, &common_nodes[i]);
    for (gsize i = 0; i < n_extra; i++)
        node_time(root, &extra[i]);
}

/* One ext4 on the whole disk, label "root", the same UUID in both, as in an agent's chain. */
static gboolean
image_build(const char *tree, const char *raw, const char *qcow2, const char *backing,
            char **ret_why)
{
    const char *truncate_argv[] = {"truncate", "-s", "64M", raw, NULL};
    const char *mkfs_argv[] = {"mkfs.ext4", "-q",  "-F",
                               "-I",        "256", "-L",
                               "root",      "-U",  "2f6b0d8e-5c1a-4a57-9a8e-3b1f0c2d4e6a",
                               "-d",        tree,  raw,
                               NULL};
    const char *convert_argv[] = {"qemu-img", "convert", "-q", "-f",  "raw",
                                  "-O",       "qcow2",   raw,  qcow2, NULL};
    const char *overlay_argv[] = {"qemu-img", "convert", "-q", "-f",    "raw", "-O",  "qcow2",
                                  "-B",       backing,   "-F", "qcow2", raw,   qcow2, NULL};

    return run_argv(truncate_argv, ret_why) && run_argv(mkfs_argv, ret_why) &&
           run_argv(backing != NULL ? overlay_argv : convert_argv, ret_why);
}

static int
group_setup(void **state)
{
    g_autofree char *old_tree = NULL;
    g_autofree char *new_tree = NULL;
    g_autofree char *old_raw = NULL;
    g_autofree char *new_raw = NULL;
    g_autoptr(GError) error = NULL;
    char *why = NULL;

    g_images.dir = vm_test_make_tmpdir("test-guestfs-images-XXXXXX");
    old_tree = g_build_filename(g_images.dir, "old", NULL);
    new_tree = g_build_filename(g_images.dir, "new", NULL);
    old_raw = g_build_filename(g_images.dir, "old.raw", NULL);
    new_raw = g_build_filename(g_images.dir, "new.raw", NULL);
    g_images.old_image = g_build_filename(g_images.dir, "old.qcow2", NULL);
    g_images.new_image = g_build_filename(g_images.dir, "new.qcow2", NULL);
    g_images.same_image = g_build_filename(g_images.dir, "same.qcow2", NULL);

    if (geteuid() != 0) {
        g_images.skip = g_strdup("building images with other owners needs root");
        return 0;
    }
    tree_build(old_tree, old_nodes, G_N_ELEMENTS(old_nodes));
    tree_build(new_tree, NULL, 0);
    for (gsize i = 0; i < G_N_ELEMENTS(new_nodes); i++)
        node_put(new_tree, &new_nodes[i]);
    for (gsize i = 0; i < G_N_ELEMENTS(common_nodes); i++)
        node_time(new_tree, &common_nodes[i]);
    for (gsize i = 0; i < G_N_ELEMENTS(new_nodes); i++)
        node_time(new_tree, &new_nodes[i]);

    const char *same_argv[] = {
        "qemu-img",          "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", g_images.new_image,
        g_images.same_image, NULL};
    if (!image_build(old_tree, old_raw, g_images.old_image, NULL, &why) ||
        !image_build(new_tree, new_raw, g_images.new_image, g_images.old_image, &why) ||
        !run_argv(same_argv, &why)) {
        g_images.skip = g_strdup_printf("cannot build test images: %s", why);
        g_free(why);
        return 0;
    }
    g_unlink(old_raw);
    g_unlink(new_raw);

    /* The one launch of the whole test. */
    const char *images[] = {g_images.old_image, g_images.new_image, g_images.same_image, NULL};
    gint64 start = g_get_monotonic_time();
    g_images.fs = vm_guestfs_open(images, NULL, &error);
    if (g_images.fs == NULL)
        g_images.skip = g_strdup_printf("libguestfs cannot run here: %s", error->message);
    else
        fprintf(stderr, "# vm_guestfs_open, 3 images: %.1f s\n",
                (g_get_monotonic_time() - start) / 1e6);
    return 0;
}

static int
group_teardown(void **state)
{
    vm_guestfs_close(g_images.fs);
    vm_test_remove_tree(g_images.dir);
    g_free(g_images.dir);
    g_free(g_images.old_image);
    g_free(g_images.new_image);
    g_free(g_images.same_image);
    g_free(g_images.skip);
    return 0;
}

#define NEEDS_APPLIANCE()                                                                          \
    do {                                                                                           \
        if (g_images.skip != NULL) {                                                               \
            fprintf(stderr, "# skipped: %s\n", g_images.skip);                                     \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* ---- helpers ------------------------------------------------------------------------------- */

/* vm_test_assert_error(), and the message is one line: guest paths and libguestfs's own
 * messages may hold newlines, an error quoting them must not. */
static void
assert_one_line_error(const GError *error, VmErrorCode code, const char *needle)
{
    vm_test_assert_error(error, VM_ERROR, code, needle);
    if (strchr(error->message, '\n') != NULL)
        fail_msg("error message '%s' is not one line", error->message);
}

static char *
changes_text(const GPtrArray *changes)
{
    GString *s = g_string_new(NULL);

    for (guint i = 0; i < changes->len; i++) {
        const VmGuestChange *c = changes->pdata[i];
        g_string_append_printf(s, "%c %s\n", c->kind, c->path);
    }
    return g_string_free(s, FALSE);
}

static void
assert_diff(guint from, guint to, const char *under, const char *expected)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) changes = vm_guestfs_diff_at(g_images.fs, from, to, under, &error);
    g_autofree char *text = NULL;

    if (changes == NULL)
        fail_msg("diff %u -> %u under %s failed: %s", from, to, under, error->message);
    text = changes_text(changes);
    if (strcmp(text, expected) != 0)
        fail_msg("diff %u -> %u under %s:\n%s\nexpected:\n%s", from, to, under, text, expected);
}

static gint
strptr_compare(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The member names of @tar, sorted, one per line. */
static char *
tar_listing(const char *tar)
{
    g_autofree char *out = NULL;
    g_autoptr(GError) error = NULL;
    const char *argv[] = {"tar", "-tf", tar, NULL};

    if (!vm_spawn_run(argv, NULL, &out, &error))
        fail_msg("tar -tf %s: %s", tar, error->message);

    g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
    g_autoptr(GPtrArray) sorted = g_ptr_array_new();
    GString *s = g_string_new(NULL);
    for (guint i = 0; lines[i] != NULL; i++) {
        if (lines[i][0] != '\0')
            g_ptr_array_add(sorted, lines[i]);
    }
    g_ptr_array_sort(sorted, strptr_compare);
    for (guint i = 0; i < sorted->len; i++)
        g_string_append_printf(s, "%s\n", (const char *)sorted->pdata[i]);
    return g_string_free(s, FALSE);
}

static void
tar_extract(const char *tar, const char *dir)
{
    g_autofree char *why = NULL;
    const char *argv[] = {"tar", "-xpf", tar, "-C", dir, "--numeric-owner", NULL};

    if (!run_argv(argv, &why))
        fail_msg("cannot extract %s: %s", tar, why);
}

/* Mode, owner and mtime of @path in @root, and its content (or link target). */
static void
assert_node(const char *root, const char *path, guint mode, guint uid, gint64 mtime,
            const char *data)
{
    g_autofree char *full = g_build_filename(root, path, NULL);
    GStatBuf st;

    if (g_lstat(full, &st) != 0)
        fail_msg("%s is missing from the export", path);
    if ((st.st_mode & 07777) != mode && !S_ISLNK(st.st_mode))
        fail_msg("%s: mode %o, expected %o", path, st.st_mode & 07777, mode);
    if (st.st_uid != uid || st.st_gid != uid)
        fail_msg("%s: owner %u:%u, expected %u:%u", path, st.st_uid, st.st_gid, uid, uid);
    if (mtime != 0 && st.st_mtime != mtime)
        fail_msg("%s: mtime %ld, expected %ld", path, (long)st.st_mtime, (long)mtime);
    if (S_ISREG(st.st_mode)) {
        g_autofree char *content = vm_test_read_file(full);
        assert_string_equal(content, data);
    } else if (S_ISLNK(st.st_mode)) {
        g_autofree char *target = g_file_read_link(full, NULL);
        assert_string_equal(target, data);
    }
}

static void
assert_absent(const char *root, const char *path)
{
    g_autofree char *full = g_build_filename(root, path, NULL);
    GStatBuf st;

    if (g_lstat(full, &st) == 0)
        fail_msg("%s should not be in the export", path);
}

/* ---- guest paths (pure) -------------------------------------------------------------------- */

static void
test_path_check_good(void **state)
{
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"/etc", "/etc"},
        {"//a/./b/", "/a/b"},
        {"/home/u/x y", "/home/u/x y"},
        {"/a/.../b", "/a/.../b"},
        {"/.hidden/..x", "/.hidden/..x"},
        {"/r\xc3\xa9sum\xc3\xa9", "/r\xc3\xa9sum\xc3\xa9"},
        {"/not-utf8-\xff", "/not-utf8-\xff"},
        {"/./a/", "/a"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *normalized = NULL;
        if (!vm_guest_path_check(cases[i].in, &normalized, &error))
            fail_msg("'%s' refused: %s", cases[i].in, error->message);
        assert_string_equal(normalized, cases[i].out);
        assert_null(error);
    }

    /* Exactly the limit is fine; the result is optional. */
    g_autofree char *longest = g_strnfill(VM_GUEST_PATH_MAX, 'a');
    for (gsize i = 0; i < VM_GUEST_PATH_MAX; i += 200)
        longest[i] = '/';
    assert_true(vm_guest_path_check(longest, NULL, NULL));
}

static void
test_path_check_bad(void **state)
{
    g_autofree char *too_long = g_strnfill(VM_GUEST_PATH_MAX + 1, 'a');
    g_autofree char *long_name = g_strnfill(257, 'n');
    static const struct {
        const char *in;
        const char *why;
    } cases[] = {
        {"", "empty"},
        {"a", "not absolute"},
        {"./a", "not absolute"},
        {"/", "whole filesystem"},
        {"//./", "whole filesystem"},
        {"/a/../b", ".."},
        {"/..", ".."},
        {"/a/..", ".."},
        {"/a\nb", "newline"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        char *normalized = (char *)"untouched";
        g_autofree char *shown = g_strescape(cases[i].in, NULL);

        assert_false(vm_guest_path_check(cases[i].in, &normalized, &error));
        assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, cases[i].why);
        /* The message names the path (a newline shown escaped). */
        g_autofree char *quoted = g_strdup_printf("'%s'", shown);
        if (strstr(error->message, quoted) == NULL)
            fail_msg("'%s' does not name %s", error->message, quoted);
        assert_string_equal(normalized, "untouched");
    }

    too_long[0] = '/';
    g_autoptr(GError) error = NULL;
    assert_false(vm_guest_path_check(too_long, NULL, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "4096");
    assert_true(strlen(error->message) < 300);
    g_clear_error(&error);

    long_name[0] = '/';
    assert_false(vm_guest_path_check(long_name, NULL, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "255");
}

/* Bad requests fail before any appliance starts, so these need none. */
static void
test_bad_requests_fail_early(void **state)
{
    Fixture *f = *state;
    g_autofree char *tar = g_build_filename(f->dir, "out.tar", NULL);
    g_autofree char *missing = g_build_filename(f->dir, "missing.qcow2", NULL);
    const char *relative[] = {"home/u", NULL};
    const char *none[] = {NULL};
    const char *fine[] = {"/etc", NULL};
    g_autoptr(GError) error = NULL;

    assert_null(vm_guestfs_diff(missing, missing, "a/../b", NULL, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "a/../b");
    g_clear_error(&error);

    assert_false(vm_guestfs_export(missing, relative, tar, NULL, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "home/u");
    g_clear_error(&error);

    assert_false(vm_guestfs_export(missing, none, tar, NULL, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, NULL);
    g_clear_error(&error);

    assert_null(vm_guestfs_diff(missing, missing, NULL, NULL, &error));
    assert_one_line_error(error, VM_ERROR_NOT_FOUND, "missing.qcow2");
    g_clear_error(&error);

    assert_false(vm_guestfs_export(missing, fine, tar, NULL, &error));
    assert_one_line_error(error, VM_ERROR_NOT_FOUND, "missing.qcow2");
    assert_int_equal(vm_test_count_entries(f->dir), 0);
}

/* ---- diff ---------------------------------------------------------------------------------- */

static void
test_diff_whole_filesystem(void **state)
{
    gint64 start;

    NEEDS_APPLIANCE();
    start = g_get_monotonic_time();
    assert_diff(OLD, NEW, NULL, full_diff);
    fprintf(stderr, "# vm_guestfs_diff_at, whole filesystem: %.2f s\n",
            (g_get_monotonic_time() - start) / 1e6);
}

static void
test_diff_under(void **state)
{
    NEEDS_APPLIANCE();
    assert_diff(OLD, NEW, "/etc", "M /etc/config.ini\nM /etc/hostname\n");
    assert_diff(OLD, NEW, "//home/u/./proj/", proj_deleted);
    assert_diff(OLD, NEW, "/home/u/new-tree/d",
                "A /home/u/new-tree/d\nA /home/u/new-tree/d/e.txt\n");
    /* A single file, and an unchanged one. */
    assert_diff(OLD, NEW, "/var/lib/state", "M /var/lib/state\n");
    assert_diff(OLD, NEW, "/home/u/notes.txt", "");
    /* The other way round, added becomes deleted. */
    assert_diff(NEW, OLD, "/home/u/new-tree",
                "D /home/u/new-tree\nD /home/u/new-tree/d\nD /home/u/new-tree/d/e.txt\n"
                "D /home/u/new-tree/f.txt\n");
    /* A symbolic link is compared, never followed. */
    assert_diff(OLD, NEW, "/home/u/link", "M /home/u/link\n");
    assert_diff(OLD, NEW, "/home/u/docs", "");
}

static void
test_diff_under_errors(void **state)
{
    g_autoptr(GError) error = NULL;

    NEEDS_APPLIANCE();
    assert_null(vm_guestfs_diff_at(g_images.fs, OLD, NEW, "/nope", &error));
    assert_one_line_error(error, VM_ERROR_NOT_FOUND, "/nope");
    g_clear_error(&error);

    /* Below a symbolic link is not inside the image's tree. */
    assert_null(vm_guestfs_diff_at(g_images.fs, OLD, NEW, "/home/u/docs/b.c", &error));
    assert_one_line_error(error, VM_ERROR_NOT_FOUND, "/home/u/docs/b.c");
    g_clear_error(&error);

    assert_null(vm_guestfs_diff_at(g_images.fs, OLD, NEW, "etc", &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "etc");
}

static void
test_diff_identical(void **state)
{
    NEEDS_APPLIANCE();
    /* An empty overlay, as a checkpoint the guest wrote nothing into. */
    assert_diff(NEW, SAME, NULL, "");
    assert_diff(OLD, OLD, NULL, "");
}

/* ---- export -------------------------------------------------------------------------------- */

static void
test_export_deleted_tree_and_file(void **state)
{
    Fixture *f = *state;
    g_autofree char *tar = g_build_filename(f->dir, "restore.tar", NULL);
    g_autofree char *out = g_build_filename(f->dir, "out", NULL);
    g_autofree char *listing = NULL;
    g_autoptr(GError) error = NULL;
    /* sub is inside proj: it adds nothing. */
    const char *paths[] = {"/home/u/proj", "//home/u/notes.txt", "/home/u/proj/sub", NULL};
    gint64 start;

    NEEDS_APPLIANCE();
    start = g_get_monotonic_time();
    if (!vm_guestfs_export_at(g_images.fs, OLD, paths, tar, &error))
        fail_msg("export failed: %s", error->message);
    fprintf(stderr, "# vm_guestfs_export_at (no launch): %.2f s\n",
            (g_get_monotonic_time() - start) / 1e6);
    assert_int_equal(vm_test_file_mode(tar), 0600);

    /* Just the chosen paths and the directories above them. */
    listing = tar_listing(tar);
    assert_string_equal(listing, "./\n"
                                 "./home/\n"
                                 "./home/u/\n"
                                 "./home/u/notes.txt\n"
                                 "./home/u/proj/\n"
                                 "./home/u/proj/a.c\n"
                                 "./home/u/proj/link\n"
                                 "./home/u/proj/run.sh\n"
                                 "./home/u/proj/sub/\n"
                                 "./home/u/proj/sub/b.c\n"
                                 "./home/u/proj/we*ird[1]\n"
                                 "./home/u/proj/x y\n");

    g_assert_cmpint(g_mkdir(out, 0755), ==, 0);
    tar_extract(tar, out);
    assert_node(out, "home/u", 0750, 1000, T0, NULL);
    assert_node(out, "home/u/notes.txt", 0640, 1000, T0, "my notes\n");
    assert_node(out, "home/u/proj", 0755, 1000, T0, NULL);
    assert_node(out, "home/u/proj/a.c", 0644, 1000, T0, "int main;\n");
    assert_node(out, "home/u/proj/run.sh", 0755, 1000, T0, "#!/bin/sh\n");
    assert_node(out, "home/u/proj/sub", 0700, 1000, T0, NULL);
    assert_node(out, "home/u/proj/sub/b.c", 0600, 1000, T0, "b\n");
    assert_node(out, "home/u/proj/link", 0, 0, T0, "a.c");
    assert_node(out, "home/u/proj/we*ird[1]", 0644, 1000, T0, "w\n");
    assert_node(out, "home/u/proj/x y", 0644, 1000, T0, "space\n");
    assert_absent(out, "home/u/keep.txt");
    assert_absent(out, "home/u/n*");
    assert_absent(out, "home/u/proj2");
    assert_absent(out, "etc");
}

static void
test_export_single_file_replaces_tar(void **state)
{
    Fixture *f = *state;
    g_autofree char *tar = g_build_filename(f->dir, "restore.tar", NULL);
    g_autofree char *out = g_build_filename(f->dir, "out", NULL);
    g_autofree char *listing = NULL;
    g_autoptr(GError) error = NULL;
    const char *paths[] = {"/etc/hostname", NULL};

    NEEDS_APPLIANCE();
    vm_test_write_file(tar, "an older tar\n");
    if (!vm_guestfs_export_at(g_images.fs, NEW, paths, tar, &error))
        fail_msg("export failed: %s", error->message);
    listing = tar_listing(tar);
    assert_string_equal(listing, "./\n./etc/\n./etc/hostname\n");
    g_assert_cmpint(g_mkdir(out, 0755), ==, 0);
    tar_extract(tar, out);
    assert_node(out, "etc/hostname", 0644, 0, T1, "new-host\n");
    assert_node(out, "etc", 0755, 0, T0, NULL);
    assert_int_equal(vm_test_count_entries(f->dir), 2);
}

static void
test_export_failures_leave_no_tar(void **state)
{
    Fixture *f = *state;
    g_autofree char *tar = g_build_filename(f->dir, "restore.tar", NULL);
    g_autofree char *kept = NULL;
    g_autoptr(GError) error = NULL;
    /* added.txt exists only in the new image. */
    const char *missing[] = {"/home/u/notes.txt", "/home/u/added.txt", NULL};
    const char *below_file[] = {"/home/u/notes.txt/x", NULL};
    const char *through_link[] = {"/home/u/docs/b.c", NULL};
    const char *root[] = {"/", NULL};

    NEEDS_APPLIANCE();
    assert_false(vm_guestfs_export_at(g_images.fs, OLD, missing, tar, &error));
    assert_one_line_error(error, VM_ERROR_NOT_FOUND, "'/home/u/added.txt'");
    g_clear_error(&error);
    assert_int_equal(vm_test_count_entries(f->dir), 0);

    assert_false(vm_guestfs_export_at(g_images.fs, OLD, below_file, tar, &error));
    assert_one_line_error(error, VM_ERROR_NOT_FOUND, "/home/u/notes.txt/x");
    g_clear_error(&error);

    /* A failure leaves an existing tar as it was, and nothing beside it. */
    vm_test_write_file(tar, "an older tar\n");
    assert_false(vm_guestfs_export_at(g_images.fs, OLD, through_link, tar, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "'/home/u/docs'");
    g_clear_error(&error);
    kept = vm_test_read_file(tar);
    assert_string_equal(kept, "an older tar\n");
    assert_int_equal(vm_test_count_entries(f->dir), 1);

    assert_false(vm_guestfs_export_at(g_images.fs, OLD, root, tar, &error));
    assert_one_line_error(error, VM_ERROR_INVALID_ARGUMENT, "whole filesystem");
    assert_int_equal(vm_test_count_entries(f->dir), 1);
}

/* ---- the helper, run as an unprivileged user ------------------------------------------------ */

/* The list of changes crosses from the helper (an agent's uid) to hostd as untrusted bytes: it
 * comes back as it went, cut where asked and said so, and anything else is refused. */
static void
test_changes_encoding(void **state)
{
    g_autoptr(GPtrArray) changes =
        g_ptr_array_new_with_free_func((GDestroyNotify)vm_guest_change_free);
    static const char *const paths[] = {"/a", "/b\nc", "/\xff\xfe odd", "/d/e"};
    for (gsize i = 0; i < G_N_ELEMENTS(paths); i++) {
        VmGuestChange *c = g_new0(VmGuestChange, 1);
        c->kind = "ADMM"[i];
        c->path = g_strdup(paths[i]);
        g_ptr_array_add(changes, c);
    }
    g_autoptr(GError) error = NULL;
    gboolean truncated = TRUE;

    g_autoptr(GBytes) all = vm_guest_changes_encode(changes, 0);
    gsize len = 0;
    const guint8 *data = g_bytes_get_data(all, &len);
    g_autoptr(GPtrArray) back = vm_guest_changes_decode(data, len, &truncated, &error);
    assert_non_null(back);
    assert_false(truncated);
    g_autofree char *sent = changes_text(changes);
    g_autofree char *got = changes_text(back);
    assert_string_equal(got, sent);

    /* Room for two entries only. */
    g_autoptr(GBytes) cut = vm_guest_changes_encode(changes, 40);
    data = g_bytes_get_data(cut, &len);
    g_autoptr(GPtrArray) part = vm_guest_changes_decode(data, len, &truncated, &error);
    assert_non_null(part);
    assert_true(truncated);
    assert_int_equal(part->len, 2);

    /* A hostile helper: garbage, a kind that is none, a relative path, a NUL in a path. */
    static const guint8 garbage[] = {0xff, 0x00, 0x13, 0x37, 0x01};
    assert_null(vm_guest_changes_decode(garbage, sizeof(garbage), NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "malformed");
    g_clear_error(&error);
    static const struct {
        guchar kind;
        const char *path;
        gsize len;
    } bad[] = {{'X', "/a", 2}, {'A', "a", 1}, {'A', "/a\0b", 4}, {'M', "", 0}};
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("a(yay)"));
        g_variant_builder_add(
            &b, "(y@ay)", bad[i].kind,
            g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, bad[i].path, bad[i].len, 1));
        g_autoptr(GVariant) v =
            g_variant_ref_sink(g_variant_new("(b@a(yay))", FALSE, g_variant_builder_end(&b)));
        assert_null(
            vm_guest_changes_decode(g_variant_get_data(v), g_variant_get_size(v), NULL, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "bad entry");
        g_clear_error(&error);
    }
}

/* hostd runs the helper as the agent's uid with a fixed appliance: it reads images that uid
 * owns, with the same answers as the library in-process, and cannot read another uid's. */
static void
test_helper_unprivileged(void **state)
{
    Fixture *f = *state;
    NEEDS_APPLIANCE();
    const char *helper = g_getenv("VM_GUESTFS_HELPER");
    assert_non_null(helper);
    const guint owner = 1879113011, other = 1879113012;
    g_autoptr(GError) error = NULL;

    g_autofree char *appliance = g_build_filename(f->dir, "appliance", NULL);
    gint64 start = g_get_monotonic_time();
    if (!vm_guestfs_appliance_build(appliance, &error))
        fail_msg("cannot build the appliance: %s", error->message);
    fprintf(stderr, "# vm_guestfs_appliance_build: %.1f s\n",
            (g_get_monotonic_time() - start) / 1e6);
    assert_int_equal(chmod(f->dir, 0711), 0);
    assert_int_equal(chmod(g_images.dir, 0711), 0);
    const char *mine[] = {g_images.old_image, g_images.new_image};
    for (gsize i = 0; i < G_N_ELEMENTS(mine); i++) {
        assert_int_equal(chown(mine[i], owner, owner), 0);
        assert_int_equal(chmod(mine[i], 0600), 0);
    }

    /* The diff, as the library gives it in-process. */
    g_autofree char *out = NULL;
    gsize len = 0;
    VmSpawnOptions as_owner = {
        .run_as = TRUE, .uid = owner, .gid = owner, .exit_is_code = TRUE, .ret_stdout_len = &len};
    const char *diff_argv[] = {
        helper, "diff", appliance, "1000000", g_images.old_image, g_images.new_image, NULL};
    start = g_get_monotonic_time();
    if (!vm_spawn_run(diff_argv, &as_owner, &out, &error))
        fail_msg("the helper's diff failed: %s", error->message);
    fprintf(stderr, "# vm-guestfs-helper diff as uid %u: %.1f s\n", owner,
            (g_get_monotonic_time() - start) / 1e6);
    gboolean truncated = TRUE;
    g_autoptr(GPtrArray) changes = vm_guest_changes_decode(out, len, &truncated, &error);
    assert_non_null(changes);
    assert_false(truncated);
    g_autofree char *text = changes_text(changes);
    assert_string_equal(text, full_diff);

    /* An export into a file only root may open: the helper writes where it was pointed. */
    g_autofree char *tar = g_build_filename(f->dir, "paths.tar", NULL);
    int fd = open(tar, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    VmSpawnOptions to_file = {
        .run_as = TRUE, .uid = owner, .gid = owner, .exit_is_code = TRUE, .stdout_fd = fd};
    const char *export_argv[] = {helper,          "export", appliance, g_images.new_image,
                                 "/etc/hostname", NULL};
    gboolean exported = vm_spawn_run(export_argv, &to_file, NULL, &error);
    close(fd);
    if (!exported)
        fail_msg("the helper's export failed: %s", error->message);
    const char *list_argv[] = {"tar", "-tf", tar, NULL};
    g_autofree char *members = NULL;
    assert_true(vm_spawn_run(list_argv, NULL, &members, &error));
    assert_string_equal(members, "./\n./etc/\n./etc/hostname\n");

    /* Another uid reads none of it: the appliance cannot open the images. */
    VmSpawnOptions as_other = {.run_as = TRUE, .uid = other, .gid = other, .exit_is_code = TRUE};
    g_clear_pointer(&out, g_free);
    assert_false(vm_spawn_run(diff_argv, &as_other, &out, &error));
    assert_one_line_error(error, VM_ERROR_IO, "Permission denied");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_check_good),
        cmocka_unit_test(test_path_check_bad),
        cmocka_unit_test_setup_teardown(test_bad_requests_fail_early, setup, teardown),
        cmocka_unit_test(test_diff_whole_filesystem),
        cmocka_unit_test(test_diff_under),
        cmocka_unit_test(test_diff_under_errors),
        cmocka_unit_test(test_diff_identical),
        cmocka_unit_test_setup_teardown(test_export_deleted_tree_and_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_single_file_replaces_tar, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_failures_leave_no_tar, setup, teardown),
        cmocka_unit_test(test_changes_encoding),
        cmocka_unit_test_setup_teardown(test_helper_unprivileged, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
