/* vmctl cp on the host's side: which argument names an agent (scp's rule), and the tar streams:
 * a local tree packed and unpacked back the same, and a hostile guest's stream that writes
 * nothing outside the target (absolute names, "..", a symlink then a file through it, a second
 * top, hard links out, device nodes, set-user-ID bits). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <archive.h>
#include <archive_entry.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <unistd.h>

#include <gio/gio.h>
#include <glib/gstdio.h>

#include "test-common.h"
#include "vm-error.h"
#include "vmctl-copy-archive.h"
#include "vmctl-copy.h"

typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

static void
test_location_parse(void **state)
{
    static const struct {
        const char *arg;
        const char *agent; /* NULL: local */
        const char *path;  /* NULL: refused */
    } cases[] = {
        {"a1:/home/agent/src", "a1", "/home/agent/src"},
        {"a1:", "a1", ""},
        {"a1:x:y", "a1", "x:y"},
        {"a1:rel/path", "a1", "rel/path"},
        {"./a:b", NULL, "./a:b"},
        {"/tmp/a:b", NULL, "/tmp/a:b"},
        {"dir/a1:x", NULL, "dir/a1:x"},
        {"plain", NULL, "plain"},
        {".", NULL, "."},
        {"A1:x", NULL, NULL},
        {":x", NULL, NULL},
        {"a b:x", NULL, NULL},
        {"", NULL, NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(VmctlCopyLocation) location = {0};
        g_autoptr(GError) error = NULL;
        gboolean ok = vmctl_copy_location_parse(cases[i].arg, &location, &error);

        if (cases[i].path == NULL) {
            if (ok)
                fail_msg("'%s' was taken", cases[i].arg);
            assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
            continue;
        }
        if (!ok)
            fail_msg("'%s': %s", cases[i].arg, error->message);
        assert_string_equal(location.path, cases[i].path);
        if (cases[i].agent == NULL)
            assert_null(location.agent);
        else
            assert_string_equal(location.agent, cases[i].agent);
    }
}

/* A stream held in memory, written by libarchive or read back by vmctl_copy_archive_unpack()
 * in pieces of @piece bytes. */
typedef struct {
    GByteArray *bytes;
    gsize offset;
    gsize piece;
} Stream;

static gboolean
stream_write(const void *data, gsize len, gpointer user_data, GError **error)
{
    Stream *s = user_data;

    g_byte_array_append(s->bytes, data, (guint)len);
    return TRUE;
}

static gssize
stream_read(gpointer user_data, const guint8 **ret_data, GError **error)
{
    Stream *s = user_data;
    gsize n = MIN(s->piece, s->bytes->len - s->offset);

    *ret_data = s->bytes->data + s->offset;
    s->offset += n;
    return (gssize)n;
}

static la_ssize_t
archive_to_stream(struct archive *a, void *data, const void *buffer, size_t len)
{
    g_byte_array_append(((Stream *)data)->bytes, buffer, (guint)len);
    return (la_ssize_t)len;
}

/* One entry of a hand-made (hostile) stream. */
typedef struct {
    const char *name;
    mode_t type; /* AE_IF*; 0 with @link: a hard link */
    mode_t perm;
    const char *data; /* a regular file's; a symlink's target */
    const char *link; /* a hard link's target */
} Entry;

static GByteArray *
make_stream(const Entry *entries, gsize n)
{
    Stream s = {.bytes = g_byte_array_new()};
    struct archive *a = archive_write_new();

    archive_write_set_format_pax_restricted(a);
    assert_int_equal(archive_write_open(a, &s, NULL, archive_to_stream, NULL), ARCHIVE_OK);
    for (gsize i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, entries[i].name);
        archive_entry_set_perm(e, entries[i].perm);
        if (entries[i].link != NULL) {
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_hardlink(e, entries[i].link);
        } else {
            archive_entry_set_filetype(e, entries[i].type);
        }
        if (entries[i].type == AE_IFLNK)
            archive_entry_set_symlink(e, entries[i].data);
        if (entries[i].type == AE_IFCHR)
            archive_entry_set_rdev(e, makedev(1, 3));
        gsize len =
            entries[i].type == AE_IFREG && entries[i].data != NULL ? strlen(entries[i].data) : 0;
        archive_entry_set_size(e, (la_int64_t)len);
        assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
        if (len > 0)
            assert_int_equal(archive_write_data(a, entries[i].data, len), (la_ssize_t)len);
        archive_entry_free(e);
    }
    assert_int_equal(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    return s.bytes;
}

/* Unpacks @bytes into @dir under the name "new". */
static gboolean
unpack(GByteArray *bytes, const char *dir, GError **error)
{
    Stream s = {.bytes = bytes, .piece = 1000};

    return vmctl_copy_archive_unpack(stream_read, &s, dir, "new", error);
}

typedef struct {
    const char *what;
    Entry entries[4];
    gsize n;
} Hostile;

/* Each stream is refused, and nothing lands outside the target: f->dir holds "target" (where it
 * is unpacked) and "outside" (a directory a symlink may point at), both empty before. */
static void
test_unpack_hostile(void **state)
{
    Fixture *f = *state;
    g_autofree char *target = g_build_filename(f->dir, "target", NULL);
    g_autofree char *outside = g_build_filename(f->dir, "outside", NULL);
    g_autofree char *victim = g_build_filename(f->dir, "victim", NULL);
    g_autofree char *abs_name = g_build_filename(outside, "abs", NULL);
    const Hostile cases[] = {
        {"an absolute name", {{abs_name, AE_IFREG, 0644, "x", NULL}}, 1},
        {"a top that is absolute", {{"/", AE_IFDIR, 0755, NULL, NULL}}, 1},
        {"'..' inside",
         {{"top", AE_IFDIR, 0755, NULL, NULL}, {"top/../../outside/x", AE_IFREG, 0644, "x", NULL}},
         2},
        {"'..' as the top", {{"..", AE_IFDIR, 0755, NULL, NULL}}, 1},
        {"'.' inside", {{"top/./x", AE_IFREG, 0644, "x", NULL}}, 1},
        {"a symlink out, then a file through it",
         {{"top", AE_IFDIR, 0755, NULL, NULL},
          {"top/l", AE_IFLNK, 0777, outside, NULL},
          {"top/l/x", AE_IFREG, 0644, "x", NULL}},
         3},
        {"a top that is a symlink out, then a file through it",
         {{"top", AE_IFLNK, 0777, outside, NULL}, {"top/x", AE_IFREG, 0644, "x", NULL}},
         2},
        {"a second top",
         {{"top", AE_IFDIR, 0755, NULL, NULL}, {"other", AE_IFREG, 0644, "x", NULL}},
         2},
        {"a hard link to a file outside",
         {{"top", AE_IFDIR, 0755, NULL, NULL}, {"top/h", 0, 0644, NULL, victim}},
         2},
        {"a hard link through '..'",
         {{"top", AE_IFDIR, 0755, NULL, NULL}, {"top/h", 0, 0644, NULL, "top/../../victim"}},
         2},
        {"a hard link to a symlink the stream made",
         {{"top", AE_IFDIR, 0755, NULL, NULL},
          {"top/l", AE_IFLNK, 0777, victim, NULL},
          {"top/h", 0, 0644, NULL, "top/l"}},
         3},
    };

    vm_test_write_file(victim, "the user's");
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GByteArray) bytes = make_stream(cases[i].entries, cases[i].n);

        assert_int_equal(g_mkdir(target, 0700), 0);
        assert_int_equal(g_mkdir(outside, 0700), 0);
        if (unpack(bytes, target, &error))
            fail_msg("%s: unpacked", cases[i].what);
        if (vm_test_count_entries(outside) != 0)
            fail_msg("%s: wrote outside", cases[i].what);
        if (vm_test_count_entries(target) != 0)
            fail_msg("%s: left something in the target", cases[i].what);
        g_autofree char *content = vm_test_read_file(victim);
        assert_string_equal(content, "the user's");
        assert_true(vm_test_remove_tree(target));
        assert_true(vm_test_remove_tree(outside));
    }
}

/* What a guest may send but the host never makes: devices and fifos are left out, set-user-ID
 * and set-group-ID bits dropped; a hard link to a file of the stream is made. */
static void
test_unpack_tamed(void **state)
{
    Fixture *f = *state;
    const Entry entries[] = {
        {"top", AE_IFDIR, 0755, NULL, NULL},
        {"top/null", AE_IFCHR, 0666, NULL, NULL},
        {"top/fifo", AE_IFIFO, 0666, NULL, NULL},
        {"top/suid", AE_IFREG, 06755, "#!/bin/sh\n", NULL},
        {"top/same", 0, 0644, NULL, "top/suid"},
    };
    g_autoptr(GByteArray) bytes = make_stream(entries, G_N_ELEMENTS(entries));
    g_autoptr(GError) error = NULL;
    g_autofree char *top = g_build_filename(f->dir, "new", NULL);
    g_autofree char *suid = g_build_filename(top, "suid", NULL);
    g_autofree char *same = g_build_filename(top, "same", NULL);
    struct stat a, b;

    if (!unpack(bytes, f->dir, &error))
        fail_msg("%s", error->message);
    assert_int_equal(vm_test_count_entries(top), 2);
    assert_int_equal(vm_test_file_mode(suid), 0755);
    assert_int_equal(lstat(suid, &a), 0);
    assert_int_equal(lstat(same, &b), 0);
    assert_int_equal(a.st_ino, b.st_ino);
}

/* Unpacked onto a directory of the same name already there, a stream adds to it and replaces
 * what it brings again, the rest staying; nothing else is left beside it. */
static void
test_unpack_merge(void **state)
{
    Fixture *f = *state;
    const Entry first[] = {
        {"top", AE_IFDIR, 0755, NULL, NULL},
        {"top/kept", AE_IFREG, 0644, "kept", NULL},
        {"top/replaced", AE_IFREG, 0644, "old", NULL},
        {"top/sub", AE_IFDIR, 0755, NULL, NULL},
    };
    const Entry second[] = {
        {"top", AE_IFDIR, 0750, NULL, NULL},
        {"top/replaced", AE_IFREG, 0600, "new", NULL},
        {"top/sub", AE_IFDIR, 0700, NULL, NULL},
        {"top/sub/added", AE_IFREG, 0644, "added", NULL},
    };
    g_autoptr(GByteArray) one = make_stream(first, G_N_ELEMENTS(first));
    g_autoptr(GByteArray) two = make_stream(second, G_N_ELEMENTS(second));
    g_autoptr(GError) error = NULL;
    g_autofree char *top = g_build_filename(f->dir, "new", NULL);
    g_autofree char *kept = g_build_filename(top, "kept", NULL);
    g_autofree char *replaced = g_build_filename(top, "replaced", NULL);
    g_autofree char *added = g_build_filename(top, "sub", "added", NULL);

    if (!unpack(one, f->dir, &error) || !unpack(two, f->dir, &error))
        fail_msg("%s", error->message);
    g_autofree char *kept_text = vm_test_read_file(kept);
    g_autofree char *replaced_text = vm_test_read_file(replaced);
    g_autofree char *added_text = vm_test_read_file(added);
    assert_string_equal(kept_text, "kept");
    assert_string_equal(replaced_text, "new");
    assert_int_equal(vm_test_file_mode(replaced), 0600);
    assert_string_equal(added_text, "added");
    assert_int_equal(vm_test_file_mode(top), 0750);
    assert_int_equal(vm_test_count_entries(f->dir), 1);
}

/* A tree packed and unpacked under another name is the same tree: contents, modes, times,
 * symlinks as symlinks (one pointing out of the tree, as the user made it), odd names. */
static void
test_pack_unpack(void **state)
{
    Fixture *f = *state;
    g_autofree char *src = g_build_filename(f->dir, "src", NULL);
    g_autofree char *dest = g_build_filename(f->dir, "dest", NULL);
    g_autofree char *sub = g_build_filename(src, "sub dir", NULL);
    g_autofree char *odd = g_build_filename(sub, "new\nline: x", NULL);
    g_autofree char *tool = g_build_filename(src, "tool", NULL);
    g_autofree char *link = g_build_filename(src, "link", NULL);
    g_autofree char *out_link = g_build_filename(src, "out", NULL);
    g_autofree char *big = g_build_filename(src, "big", NULL);
    g_autoptr(GError) error = NULL;
    Stream s = {.bytes = g_byte_array_new(), .piece = 4096};
    struct timeval times[2] = {{.tv_sec = 981173106}, {.tv_sec = 981173106}};
    g_autofree char *blob = g_malloc(300 * 1000);

    assert_int_equal(g_mkdir_with_parents(sub, 0750), 0);
    assert_int_equal(g_mkdir(dest, 0700), 0);
    vm_test_write_file(odd, "odd");
    vm_test_write_file(tool, "#!/bin/sh\n");
    assert_int_equal(chmod(tool, 0741), 0);
    assert_int_equal(utimes(tool, times), 0);
    assert_int_equal(symlink("sub dir/new\nline: x", link), 0);
    assert_int_equal(symlink("/etc/passwd", out_link), 0);
    for (gsize i = 0; i < 300 * 1000; i++)
        blob[i] = (char)(i * 7 + i / 1000);
    assert_true(g_file_set_contents(big, blob, 300 * 1000, NULL));
    assert_int_equal(utimes(sub, times), 0);

    if (!vmctl_copy_archive_pack(src, "src", stream_write, &s, &error))
        fail_msg("%s", error->message);
    if (!vmctl_copy_archive_unpack(stream_read, &s, dest, "copy", &error))
        fail_msg("%s", error->message);
    g_byte_array_unref(s.bytes);

    g_autofree char *c_odd = g_build_filename(dest, "copy", "sub dir", "new\nline: x", NULL);
    g_autofree char *c_tool = g_build_filename(dest, "copy", "tool", NULL);
    g_autofree char *c_link = g_build_filename(dest, "copy", "link", NULL);
    g_autofree char *c_out = g_build_filename(dest, "copy", "out", NULL);
    g_autofree char *c_big = g_build_filename(dest, "copy", "big", NULL);
    g_autofree char *c_sub = g_build_filename(dest, "copy", "sub dir", NULL);
    g_autofree char *content = vm_test_read_file(c_odd);
    g_autofree char *target = g_file_read_link(c_link, NULL);
    g_autofree char *out_target = g_file_read_link(c_out, NULL);
    g_autofree char *big_back = NULL;
    gsize big_len = 0;
    struct stat st;

    assert_string_equal(content, "odd");
    assert_int_equal(vm_test_file_mode(c_tool), 0741);
    assert_int_equal(vm_test_file_mode(c_sub), 0750);
    assert_int_equal(stat(c_tool, &st), 0);
    assert_int_equal(st.st_mtime, 981173106);
    assert_int_equal(stat(c_sub, &st), 0);
    assert_int_equal(st.st_mtime, 981173106);
    assert_string_equal(target, "sub dir/new\nline: x");
    assert_string_equal(out_target, "/etc/passwd");
    assert_true(g_file_get_contents(c_big, &big_back, &big_len, NULL));
    assert_int_equal(big_len, 300 * 1000);
    assert_memory_equal(big_back, blob, big_len);
}

/* A stream that ends early, or is not tar at all, fails. */
static void
test_unpack_broken(void **state)
{
    Fixture *f = *state;
    const Entry entries[] = {{"top", AE_IFREG, 0644, "0123456789", NULL}};
    g_autoptr(GByteArray) bytes = make_stream(entries, 1);
    g_autoptr(GByteArray) junk = g_byte_array_new();
    g_autoptr(GByteArray) empty = g_byte_array_new();
    g_autoptr(GError) error = NULL;

    g_byte_array_set_size(bytes, 700);
    assert_false(unpack(bytes, f->dir, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    g_clear_error(&error);
    g_byte_array_append(junk, (const guint8 *)"not a tar stream at all", 23);
    assert_false(unpack(junk, f->dir, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    g_clear_error(&error);
    assert_false(unpack(empty, f->dir, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
}

/* A stream GNU tar made (as a guest's is) unpacks with the directories' times kept, the one of a
 * directory with more inside it included. */
static void
test_unpack_gnu_tar(void **state)
{
    Fixture *f = *state;
    g_autofree char *src = g_build_filename(f->dir, "src", NULL);
    g_autofree char *sub = g_build_filename(src, "sub", NULL);
    g_autofree char *deep = g_build_filename(sub, "dir", NULL);
    g_autofree char *file = g_build_filename(deep, "file", NULL);
    g_autofree char *dest = g_build_filename(f->dir, "dest", NULL);
    g_autofree char *c_sub = g_build_filename(dest, "new", "sub", NULL);
    g_autoptr(GError) error = NULL;
    g_autoptr(GBytes) out = NULL;
    struct timeval times[2] = {{.tv_sec = 1015218367}, {.tv_sec = 1015218367}};
    struct stat st;

    assert_int_equal(g_mkdir_with_parents(deep, 0755), 0);
    vm_test_write_file(file, "x");
    assert_int_equal(utimes(sub, times), 0);
    assert_int_equal(g_mkdir(dest, 0700), 0);
    g_autoptr(GSubprocess) tar = g_subprocess_new(G_SUBPROCESS_FLAGS_STDOUT_PIPE, &error, "tar",
                                                  "-C", f->dir, "-cf", "-", "--", "src", NULL);
    assert_non_null(tar);
    assert_true(g_subprocess_communicate(tar, NULL, NULL, &out, NULL, &error));
    assert_true(g_subprocess_get_successful(tar));

    Stream s = {.bytes = g_bytes_unref_to_array(g_steal_pointer(&out)), .piece = 10240};
    if (!vmctl_copy_archive_unpack(stream_read, &s, dest, "new", &error))
        fail_msg("%s", error->message);
    g_byte_array_unref(s.bytes);
    assert_int_equal(stat(c_sub, &st), 0);
    assert_int_equal(st.st_mtime, 1015218367);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_location_parse),
        cmocka_unit_test_setup_teardown(test_unpack_hostile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpack_tamed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpack_merge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pack_unpack, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpack_broken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpack_gnu_tar, setup, teardown),
    };

    return cmocka_run_group_tests_name("vmctl-copy", tests, NULL, NULL);
}
