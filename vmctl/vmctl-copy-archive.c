#include "vmctl-copy-archive.h"

#include "vm-error.h"
#include "vm-fs.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

typedef struct archive Archive;
typedef struct archive_entry ArchiveEntry;
G_DEFINE_AUTOPTR_CLEANUP_FUNC(Archive, archive_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ArchiveEntry, archive_entry_free)

#define COPY_BLOCK (64 * 1024)

/* The error of a libarchive call on @a, or of the callback that made it fail. */
typedef struct {
    GError *error; /* a callback's own failure, reported instead of libarchive's words */
    gpointer func;
    gpointer user_data;
} CopyStream;

static gboolean
archive_throw(GError **error, CopyStream *stream, struct archive *a, VmErrorCode code,
              const char *what)
{
    if (stream != NULL && stream->error != NULL) {
        g_propagate_error(error, g_steal_pointer(&stream->error));
        return FALSE;
    }
    const char *reason = archive_error_string(a);
    return vm_throw(error, code, "%s: %s", what, reason != NULL ? reason : "failed");
}

static la_ssize_t
pack_write(struct archive *a, void *data, const void *buffer, size_t len)
{
    CopyStream *stream = data;
    VmctlCopyWriteFunc write = (VmctlCopyWriteFunc)stream->func;

    /* libarchive may try again (its close flushes): the stream stays failed. */
    if (stream->error != NULL || !write(buffer, len, stream->user_data, &stream->error)) {
        archive_set_error(a, EIO, "the stream was not taken");
        return -1;
    }
    return (la_ssize_t)len;
}

/* Copies the data of the regular file @disk is at into @out. */
static gboolean
pack_data(struct archive *disk, struct archive *out, CopyStream *stream, const char *path,
          GError **error)
{
    g_autofree guint8 *buffer = g_malloc(COPY_BLOCK);

    for (;;) {
        la_ssize_t n = archive_read_data(disk, buffer, COPY_BLOCK);
        if (n < 0)
            return archive_throw(error, NULL, disk, VM_ERROR_IO, path);
        if (n == 0)
            return TRUE;
        if (archive_write_data(out, buffer, (size_t)n) != n)
            return archive_throw(error, stream, out, VM_ERROR_IO, "cannot write the stream");
    }
}

gboolean
vmctl_copy_archive_pack(const char *path, const char *name, VmctlCopyWriteFunc write,
                        gpointer user_data, GError **error)
{
    CopyStream stream = {.func = (gpointer)write, .user_data = user_data};
    g_autoptr(Archive) disk = archive_read_disk_new();
    g_autoptr(Archive) out = archive_write_new();
    gsize prefix = strlen(path);

    archive_read_disk_set_symlink_physical(disk);
    archive_read_disk_set_behavior(disk, ARCHIVE_READDISK_NO_XATTR | ARCHIVE_READDISK_NO_ACL |
                                             ARCHIVE_READDISK_NO_FFLAGS);
    if (archive_read_disk_open(disk, path) != ARCHIVE_OK)
        return archive_throw(error, NULL, disk, VM_ERROR_IO, path);
    archive_write_set_format_pax_restricted(out);
    archive_write_set_bytes_in_last_block(out, 1);
    if (archive_write_open(out, &stream, NULL, pack_write, NULL) != ARCHIVE_OK)
        return archive_throw(error, &stream, out, VM_ERROR_IO, "cannot write the stream");
    for (;;) {
        g_autoptr(ArchiveEntry) entry = archive_entry_new();
        int r = archive_read_next_header2(disk, entry);
        if (r == ARCHIVE_EOF)
            break;
        const char *source = archive_entry_pathname(entry);
        if (r != ARCHIVE_OK)
            return archive_throw(error, NULL, disk, VM_ERROR_IO, source != NULL ? source : path);
        archive_read_disk_descend(disk);
        /* The walk names every entry PATH/REST; the guest gets NAME/REST. */
        g_autofree char *renamed = g_strconcat(name, source + MIN(strlen(source), prefix), NULL);
        archive_entry_set_pathname(entry, renamed);
        archive_entry_set_uname(entry, NULL);
        archive_entry_set_gname(entry, NULL);
        r = archive_write_header(out, entry);
        if (r < ARCHIVE_WARN || stream.error != NULL)
            return archive_throw(error, &stream, out, VM_ERROR_IO, source);
        if (archive_entry_filetype(entry) == AE_IFREG && archive_entry_size(entry) > 0 &&
            !pack_data(disk, out, &stream, source, error))
            return FALSE;
    }
    if (archive_write_close(out) != ARCHIVE_OK)
        return archive_throw(error, &stream, out, VM_ERROR_IO, "cannot write the stream");
    return TRUE;
}

static la_ssize_t
unpack_read(struct archive *a, void *data, const void **ret_buffer)
{
    CopyStream *stream = data;
    VmctlCopyReadFunc read = (VmctlCopyReadFunc)stream->func;
    const guint8 *bytes = NULL;
    gssize n = stream->error != NULL ? -1 : read(stream->user_data, &bytes, &stream->error);

    if (n < 0) {
        archive_set_error(a, EIO, "the stream broke");
        return -1;
    }
    *ret_buffer = bytes;
    return n;
}

/* Checks the name @path of an entry the guest sent (a trailing slash allowed) and returns it
 * with its first component replaced by @new_name (NULL: kept), the first component in *@top
 * (set by the first entry). NULL when the name is refused. */
static char *
unpack_rename(const char *path, char **top, const char *new_name)
{
    g_autofree char *trimmed = g_strdup(path);
    gsize len = strlen(trimmed);

    while (len > 1 && trimmed[len - 1] == '/')
        trimmed[--len] = '\0';
    if (len == 0 || trimmed[0] == '/')
        return NULL;
    g_auto(GStrv) parts = g_strsplit(trimmed, "/", -1);
    for (gsize i = 0; parts[i] != NULL; i++) {
        if (parts[i][0] == '\0' || strcmp(parts[i], ".") == 0 || strcmp(parts[i], "..") == 0)
            return NULL;
    }
    if (*top == NULL)
        *top = g_strdup(parts[0]);
    else if (strcmp(*top, parts[0]) != 0)
        return NULL;
    return g_strconcat(new_name != NULL ? new_name : parts[0], trimmed + strlen(parts[0]), NULL);
}

static gboolean
unpack_data(struct archive *in, struct archive *disk, CopyStream *stream, const char *name,
            GError **error)
{
    for (;;) {
        const void *block;
        size_t len;
        la_int64_t offset;
        int r = archive_read_data_block(in, &block, &len, &offset);
        if (r == ARCHIVE_EOF)
            return TRUE;
        if (r != ARCHIVE_OK)
            return archive_throw(error, stream, in, VM_ERROR_PROTOCOL, "the stream is broken");
        if (archive_write_data_block(disk, block, len, offset) != ARCHIVE_OK)
            return archive_throw(error, NULL, disk, VM_ERROR_IO, name);
    }
}

/* Unpacks the stream into @dir, and returns the name its top has there. */
static gboolean
unpack_into(VmctlCopyReadFunc read, gpointer user_data, const char *dir, const char *new_name,
            char **ret_top, GError **error)
{
    CopyStream stream = {.func = (gpointer)read, .user_data = user_data};
    g_autoptr(Archive) in = archive_read_new();
    g_autoptr(Archive) disk = archive_write_disk_new();
    g_autoptr(GHashTable) files = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_autofree char *top = NULL;

    /* Names are made absolute under @dir after unpack_rename() checked them, which is what
     * ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS would refuse on its own. */
    archive_write_disk_set_options(disk, ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM |
                                             ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                             ARCHIVE_EXTRACT_SECURE_NODOTDOT);
    archive_read_support_format_tar(in);
    if (archive_read_open(in, &stream, NULL, unpack_read, NULL) != ARCHIVE_OK)
        return archive_throw(error, &stream, in, VM_ERROR_PROTOCOL, "not a tar stream");
    for (;;) {
        ArchiveEntry *entry;
        int r = archive_read_next_header(in, &entry);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN)
            return archive_throw(error, &stream, in, VM_ERROR_PROTOCOL, "the stream is broken");
        const char *name = archive_entry_pathname(entry);
        if (name == NULL)
            return vm_throw(error, VM_ERROR_PROTOCOL, "the stream has an entry with no name");
        g_autofree char *renamed = unpack_rename(name, &top, new_name);
        g_autofree char *shown = g_strescape(name, NULL);
        if (renamed == NULL)
            return vm_throw(error, VM_ERROR_PROTOCOL, "refused the entry '%s'", shown);
        g_autofree char *target = g_build_filename(dir, renamed, NULL);
        g_hash_table_remove(files, target);

        const char *link = archive_entry_hardlink(entry);
        if (link != NULL) {
            /* Only to a file this stream made: never to anything else of the user's. */
            g_autofree char *link_renamed = unpack_rename(link, &top, new_name);
            g_autofree char *link_target =
                link_renamed != NULL ? g_build_filename(dir, link_renamed, NULL) : NULL;
            if (link_target == NULL || !g_hash_table_contains(files, link_target))
                return vm_throw(error, VM_ERROR_PROTOCOL, "refused the hard link '%s'", shown);
            archive_entry_set_hardlink(entry, link_target);
            archive_entry_set_size(entry, 0);
        } else {
            mode_t type = archive_entry_filetype(entry);
            if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
                continue;
        }
        archive_entry_set_pathname(entry, target);
        archive_entry_set_perm(entry, archive_entry_perm(entry) & ~(mode_t)(S_ISUID | S_ISGID));
        if (archive_write_header(disk, entry) < ARCHIVE_WARN)
            return archive_throw(error, NULL, disk, VM_ERROR_IO, target);
        if (link == NULL && archive_entry_filetype(entry) == AE_IFREG) {
            if (!unpack_data(in, disk, &stream, target, error))
                return FALSE;
            g_hash_table_add(files, g_steal_pointer(&target));
        }
        if (archive_write_finish_entry(disk) < ARCHIVE_WARN)
            return archive_throw(error, NULL, disk, VM_ERROR_IO, shown);
    }
    if (top == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "the stream holds nothing");
    /* Directories get their modes and times once their content is in. */
    if (archive_write_close(disk) != ARCHIVE_OK)
        return archive_throw(error, NULL, disk, VM_ERROR_IO, dir);
    *ret_top = new_name != NULL ? g_strdup(new_name) : g_steal_pointer(&top);
    return TRUE;
}

/* Moves @from (made by unpack_into()) to @to: renamed when @to is not a directory both are,
 * else merged into it entry by entry, the directory then taking @from's mode and times. */
static gboolean
unpack_move(const char *from, const char *to, GError **error)
{
    struct stat st_from, st_to;

    if (lstat(from, &st_from) != 0)
        return vm_throw_errno(error, errno, "%s", from);
    if (lstat(to, &st_to) != 0 || !S_ISDIR(st_to.st_mode) || !S_ISDIR(st_from.st_mode)) {
        if (rename(from, to) != 0)
            return vm_throw_errno(error, errno, "cannot put %s in place", to);
        return TRUE;
    }
    g_autoptr(GDir) entries = g_dir_open(from, 0, error);
    if (entries == NULL)
        return FALSE;
    const char *name;
    while ((name = g_dir_read_name(entries)) != NULL) {
        g_autofree char *from_entry = g_build_filename(from, name, NULL);
        g_autofree char *to_entry = g_build_filename(to, name, NULL);
        if (!unpack_move(from_entry, to_entry, error))
            return FALSE;
    }
    struct timespec times[2] = {st_from.st_atim, st_from.st_mtim};
    if (chmod(to, st_from.st_mode & 07777) != 0 || utimensat(AT_FDCWD, to, times, 0) != 0 ||
        rmdir(from) != 0)
        return vm_throw_errno(error, errno, "%s", to);
    return TRUE;
}

gboolean
vmctl_copy_archive_unpack(VmctlCopyReadFunc read, gpointer user_data, const char *dir,
                          const char *new_name, GError **error)
{
    g_autofree char *staging = g_build_filename(dir, ".vmctl-cp-XXXXXX", NULL);
    g_autofree char *top = NULL;
    g_autoptr(GError) local_error = NULL;

    g_return_val_if_fail(g_path_is_absolute(dir), FALSE);

    /* Unpacked beside the destination first, so that a stream that fails half-way leaves
     * nothing there. */
    if (g_mkdtemp_full(staging, 0700) == NULL)
        return vm_throw_errno(error, errno, "cannot write in %s", dir);
    gboolean ok = unpack_into(read, user_data, staging, new_name, &top, error);
    if (ok) {
        g_autofree char *from = g_build_filename(staging, top, NULL);
        g_autofree char *to = g_build_filename(dir, top, NULL);
        ok = unpack_move(from, to, error);
    }
    if (!vm_remove_tree(staging, ok ? error : &local_error))
        return FALSE;
    return ok;
}
