#include "vm-guestfs.h"

#include "vm-error.h"
#include "vm-spawn.h"
#include "vm-util.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <glib/gstdio.h>

#define NAME_MAX_BYTES 255

/* A path for an error message: one line, valid UTF-8, not endless. */
static char *
shown_path(const char *path)
{
    char utf8_bytes[129];
    g_autofree char *escaped = NULL;

    /* Bytes of a valid UTF-8 path stay as they are; an invalid one is shown in octal. */
    for (int i = 0; i < 128; i++)
        utf8_bytes[i] = (char)(0x80 + i);
    utf8_bytes[128] = '\0';
    escaped = g_strescape(path, g_utf8_validate(path, -1, NULL) ? utf8_bytes : NULL);
    if (strlen(escaped) > 120) {
        const char *cut = g_utf8_find_prev_char(escaped, escaped + 117);
        return g_strdup_printf("%.*s...", (int)(cut - escaped), escaped);
    }
    return g_steal_pointer(&escaped);
}

static gboolean
bad_path(GError **error, const char *path, const char *why)
{
    g_autofree char *shown = shown_path(path);
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid guest path '%s': %s", shown, why);
}

gboolean
vm_guest_path_check(const char *path, char **ret_normalized, GError **error)
{
    g_autoptr(GString) out = NULL;
    const char *p = path;

    g_return_val_if_fail(path != NULL, FALSE);

    if (path[0] == '\0')
        return bad_path(error, path, "empty");
    if (strlen(path) > VM_GUEST_PATH_MAX)
        return bad_path(error, path, "longer than 4096 bytes");
    if (strchr(path, '\n') != NULL)
        return bad_path(error, path, "contains a newline");
    if (path[0] != '/')
        return bad_path(error, path, "not absolute");

    out = g_string_new(NULL);
    while (*p != '\0') {
        const char *start;
        gsize len;

        while (*p == '/')
            p++;
        start = p;
        while (*p != '\0' && *p != '/')
            p++;
        len = (gsize)(p - start);
        if (len == 0 || (len == 1 && start[0] == '.'))
            continue;
        if (len == 2 && start[0] == '.' && start[1] == '.')
            return bad_path(error, path, "contains '..'");
        if (len > NAME_MAX_BYTES)
            return bad_path(error, path, "a component is longer than 255 bytes");
        g_string_append_c(out, '/');
        g_string_append_len(out, start, (gssize)len);
    }
    if (out->len == 0)
        return bad_path(error, path, "names the whole filesystem");

    if (ret_normalized != NULL)
        *ret_normalized = g_string_free(g_steal_pointer(&out), FALSE);
    return TRUE;
}

void
vm_guest_change_free(VmGuestChange *change)
{
    if (change == NULL)
        return;
    g_free(change->path);
    g_free(change);
}

/* ---- a list of changes between processes ----------------------------------------------------- */

#define VM_GUEST_CHANGES_TYPE "(ba(yay))"

GBytes *
vm_guest_changes_encode(GPtrArray *changes, gsize max_bytes)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("a(yay)"));
    gboolean truncated = FALSE;
    gsize bytes = 0;

    for (guint i = 0; i < changes->len; i++) {
        const VmGuestChange *change = changes->pdata[i];
        gsize len = strlen(change->path);

        /* The path, its kind and the framing GVariant adds to each entry, generously. */
        bytes += len + 16;
        if (max_bytes > 0 && bytes > max_bytes) {
            truncated = TRUE;
            break;
        }
        g_variant_builder_add(&b, "(y@ay)", (guchar)change->kind,
                              g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, change->path, len, 1));
    }
    g_autoptr(GVariant) v =
        g_variant_ref_sink(g_variant_new("(b@a(yay))", truncated, g_variant_builder_end(&b)));
    return g_variant_get_data_as_bytes(v);
}

GPtrArray *
vm_guest_changes_decode(const void *data, gsize len, gboolean *ret_truncated, GError **error)
{
    g_autoptr(GBytes) bytes = g_bytes_new(data, len);
    g_autoptr(GVariant) v = g_variant_ref_sink(
        g_variant_new_from_bytes(G_VARIANT_TYPE(VM_GUEST_CHANGES_TYPE), bytes, FALSE));
    g_autoptr(GPtrArray) changes =
        g_ptr_array_new_with_free_func((GDestroyNotify)vm_guest_change_free);
    g_autoptr(GVariant) list = NULL;
    gboolean truncated = FALSE;

    /* Only the normal form: any other serialisation is not what the helper writes. */
    if (!g_variant_is_normal_form(v))
        return vm_throw(error, VM_ERROR_IO, "the list of changes is malformed"), NULL;
    g_variant_get(v, "(b@a(yay))", &truncated, &list);
    gsize n = g_variant_n_children(list);
    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) path = NULL;
        guchar kind = 0;
        gsize path_len = 0;

        g_variant_get_child(list, i, "(y@ay)", &kind, &path);
        const char *p = g_variant_get_fixed_array(path, &path_len, 1);
        if ((kind != 'A' && kind != 'D' && kind != 'M') || path_len == 0 || p[0] != '/' ||
            path_len > VM_GUEST_PATH_MAX || memchr(p, '\0', path_len) != NULL)
            return vm_throw(error, VM_ERROR_IO, "the list of changes has a bad entry"), NULL;
        VmGuestChange *change = g_new0(VmGuestChange, 1);
        change->kind = (char)kind;
        change->path = g_strndup(p, path_len);
        g_ptr_array_add(changes, change);
    }
    if (ret_truncated != NULL)
        *ret_truncated = truncated;
    return g_steal_pointer(&changes);
}

#ifdef VM_HAVE_GUESTFS

#include <guestfs.h>

typedef struct guestfs_statns_list GfsStatnsList;
G_DEFINE_AUTOPTR_CLEANUP_FUNC(GfsStatnsList, guestfs_free_statns_list)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(guestfs_h, guestfs_close)

struct _VmGuestfs {
    guestfs_h *g;
    char **images; /* as given, for messages */
    guint n_images;
};

/* What a diff compares of one path. */
typedef struct {
    gint64 mode;
    gint64 uid;
    gint64 gid;
    gint64 size;
    gint64 mtime_sec;
    gint64 mtime_nsec;
    gint64 rdev;
    char *link; /* symbolic links only */
} Entry;

static Entry *
entry_new(const struct guestfs_statns *st)
{
    Entry *e = g_new0(Entry, 1);
    e->mode = st->st_mode;
    e->uid = st->st_uid;
    e->gid = st->st_gid;
    e->size = st->st_size;
    e->mtime_sec = st->st_mtime_sec;
    e->mtime_nsec = st->st_mtime_nsec;
    e->rdev = st->st_rdev;
    return e;
}

static void
entry_free(Entry *e)
{
    if (e == NULL)
        return;
    g_free(e->link);
    g_free(e);
}

/* The one translation of a libguestfs failure into a GError: what we were doing, then the first
 * line of libguestfs' message (a failed launch adds lines of advice about debugging). */
static gboolean throw_guestfs(guestfs_h *g, GError **error, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);

static gboolean
throw_guestfs(guestfs_h *g, GError **error, const char *fmt, ...)
{
    const char *message = guestfs_last_error(g);
    int err = guestfs_last_errno(g);
    VmErrorCode code = (err == ENOENT || err == ENOTDIR) ? VM_ERROR_NOT_FOUND : VM_ERROR_IO;
    g_autofree char *what = NULL;
    g_autofree char *reason = NULL;
    va_list ap;

    va_start(ap, fmt);
    what = g_strdup_vprintf(fmt, ap);
    va_end(ap);

    if (message != NULL) {
        while (g_ascii_isspace(*message))
            message++;
        reason = g_strndup(message, strcspn(message, "\n"));
        g_strchomp(reason);
    }
    if (reason == NULL || reason[0] == '\0') {
        g_free(reason);
        reason = g_strdup("unknown libguestfs error");
    }
    return vm_throw(error, code, "%s: %s", what, reason);
}

static void
discard_message(guestfs_h *g, void *opaque, uint64_t event, int event_handle, int flags,
                const char *buf, size_t buf_len, const uint64_t *array, size_t array_len)
{
}

/* Where guest path @path of image @index is in the appliance: every image is mounted on /d<i>. */
static char *
image_path(guint index, const char *path)
{
    if (strcmp(path, "/") == 0)
        return g_strdup_printf("/d%u", index);
    return g_strdup_printf("/d%u%s", index, path);
}

static char *
path_join(const char *dir, const char *name)
{
    if (strcmp(dir, "/") == 0)
        return g_strconcat("/", name, NULL);
    return g_strconcat(dir, "/", name, NULL);
}

/* A quiet handle, not yet started, with @images added read-only; under TCG when @tcg. */
static guestfs_h *
create_handle(const char *const *images, guint n_images, const char *appliance, gboolean tcg,
              GError **error)
{
    /* No environment: LIBGUESTFS_DEBUG and friends would make the library print. */
    g_autoptr(guestfs_h) g =
        guestfs_create_flags(GUESTFS_CREATE_NO_ENVIRONMENT | GUESTFS_CREATE_NO_CLOSE_ON_EXIT);
    if (g == NULL) {
        vm_throw_errno(error, errno, "cannot create a libguestfs handle");
        return NULL;
    }
    /* Errors are read with guestfs_last_error(); warnings and logs would go to stderr. */
    guestfs_set_error_handler(g, NULL, NULL);
    char *tcg_settings[] = {(char *)"force_tcg", NULL};
    if (guestfs_set_event_callback(g, discard_message,
                                   GUESTFS_EVENT_LIBRARY | GUESTFS_EVENT_WARNING |
                                       GUESTFS_EVENT_APPLIANCE | GUESTFS_EVENT_TRACE,
                                   0, NULL) == -1 ||
        guestfs_set_backend(g, "direct") == -1 || guestfs_set_network(g, 0) == -1 ||
        (appliance != NULL && guestfs_set_path(g, appliance) == -1) ||
        guestfs_set_autosync(g, 0) == -1 ||
        (tcg && guestfs_set_backend_settings(g, tcg_settings) == -1)) {
        throw_guestfs(g, error, "cannot configure libguestfs");
        return NULL;
    }

    for (guint i = 0; i < n_images; i++) {
        /* Absolute, because the read-only overlay libguestfs puts on the image lives elsewhere. */
        g_autofree char *absolute = g_canonicalize_filename(images[i], NULL);
        if (guestfs_add_drive_opts(g, absolute, GUESTFS_ADD_DRIVE_OPTS_FORMAT, "qcow2",
                                   GUESTFS_ADD_DRIVE_OPTS_READONLY, 1, -1) == -1) {
            throw_guestfs(g, error, "cannot add image '%s'", images[i]);
            return NULL;
        }
    }
    return g_steal_pointer(&g);
}

/* Set once a KVM appliance failed to start: later handles go straight to TCG. */
static gint kvm_appliance_broken;

/* A handle with @images added read-only and the appliance started, or NULL. The appliance runs
 * with "-cpu host" under KVM, which some nested hosts cannot give (QEMU aborts setting MSRs): when
 * a KVM start fails, it is tried once more under TCG, slower but working. */
static guestfs_h *
launch_appliance(const char *const *images, guint n_images, const char *appliance, GError **error)
{
    gboolean tcg = g_atomic_int_get(&kvm_appliance_broken);

    for (;;) {
        g_autoptr(GError) launch_error = NULL;
        g_autoptr(guestfs_h) g = create_handle(images, n_images, appliance, tcg, &launch_error);
        if (g == NULL) {
            g_propagate_error(error, g_steal_pointer(&launch_error));
            return NULL;
        }
        if (guestfs_launch(g) == 0)
            return g_steal_pointer(&g);
        gboolean retry = !tcg && g_file_test("/dev/kvm", G_FILE_TEST_EXISTS);
        if (!retry) {
            throw_guestfs(g, error, "cannot start the libguestfs appliance");
            return NULL;
        }
        g_atomic_int_set(&kvm_appliance_broken, TRUE);
        tcg = TRUE;
    }
}

VmGuestfs *
vm_guestfs_open(const char *const *images, const char *appliance, GError **error)
{
    g_autoptr(VmGuestfs) fs = NULL;
    g_auto(GStrv) devices = NULL;
    guestfs_h *g;

    g_return_val_if_fail(images != NULL && images[0] != NULL, NULL);

    fs = g_new0(VmGuestfs, 1);
    fs->n_images = g_strv_length((char **)images);
    fs->images = g_strdupv((char **)images);
    for (guint i = 0; i < fs->n_images; i++) {
        if (!g_file_test(images[i], G_FILE_TEST_EXISTS)) {
            vm_throw(error, VM_ERROR_NOT_FOUND, "no image '%s'", images[i]);
            return NULL;
        }
    }

    fs->g = g = launch_appliance(images, fs->n_images, appliance, error);
    if (g == NULL)
        return NULL;

    devices = guestfs_list_devices(g);
    if (devices == NULL) {
        throw_guestfs(g, error, "cannot list the disks of the appliance");
        return NULL;
    }
    if (g_strv_length(devices) != fs->n_images) {
        vm_throw(error, VM_ERROR_IO, "the appliance shows %u disks for %u images",
                 g_strv_length(devices), fs->n_images);
        return NULL;
    }
    /* Mountpoints must all exist before the first mount. */
    for (guint i = 0; i < fs->n_images; i++) {
        g_autofree char *mountpoint = image_path(i, "/");
        if (guestfs_mkmountpoint(g, mountpoint) == -1) {
            throw_guestfs(g, error, "cannot create mountpoint %s", mountpoint);
            return NULL;
        }
    }
    for (guint i = 0; i < fs->n_images; i++) {
        g_autofree char *mountpoint = image_path(i, "/");
        if (guestfs_mount_ro(g, devices[i], mountpoint) == -1) {
            throw_guestfs(g, error, "cannot mount the filesystem of '%s'", images[i]);
            return NULL;
        }
    }
    return g_steal_pointer(&fs);
}

void
vm_guestfs_close(VmGuestfs *fs)
{
    if (fs == NULL)
        return;
    g_clear_pointer(&fs->g, guestfs_close);
    g_strfreev(fs->images);
    g_free(fs);
}

/* The lstat of guest path @path in image @index, whose parent must be a real directory there;
 * ret->st_ino is -1 when @path does not exist. */
static gboolean
lstat_one(VmGuestfs *fs, guint index, const char *path, struct guestfs_statns *ret, GError **error)
{
    g_autofree char *parent = NULL;
    g_autofree char *name = NULL;
    g_autofree char *where = NULL;
    g_autoptr(GfsStatnsList) list = NULL;

    if (strcmp(path, "/") == 0) {
        g_autofree char *root = image_path(index, "/");
        struct guestfs_statns *st = guestfs_lstatns(fs->g, root);
        if (st == NULL)
            return throw_guestfs(fs->g, error, "cannot read / in '%s'", fs->images[index]);
        *ret = *st;
        guestfs_free_statns(st);
        return TRUE;
    }

    parent = g_path_get_dirname(path);
    name = g_path_get_basename(path);
    where = image_path(index, parent);
    char *names[] = {name, NULL};
    list = guestfs_lstatnslist(fs->g, where, names);
    if (list == NULL || list->len != 1) {
        g_autofree char *shown = shown_path(path);
        return throw_guestfs(fs->g, error, "cannot read '%s' in '%s'", shown, fs->images[index]);
    }
    *ret = list->val[0];
    return TRUE;
}

/* Looks @path up in image @index one component at a time, so that no symbolic link is followed
 * (the appliance would resolve an absolute link against its own root, not the guest's).
 * *ret_found is FALSE when a component is missing or when a directory above @path is not one;
 * then @ret_blocker, if given, gets that non-directory (or NULL) and @ret_st its stat. */
static gboolean
resolve(VmGuestfs *fs, guint index, const char *path, struct guestfs_statns *ret_st,
        gboolean *ret_found, char **ret_blocker, GError **error)
{
    g_auto(GStrv) parts = g_strsplit(path, "/", -1);
    g_autoptr(GString) prefix = g_string_new(NULL);
    struct guestfs_statns st;
    guint n = g_strv_length(parts);

    *ret_found = FALSE;
    if (ret_blocker != NULL)
        *ret_blocker = NULL;
    if (strcmp(path, "/") == 0) {
        if (!lstat_one(fs, index, "/", ret_st, error))
            return FALSE;
        *ret_found = TRUE;
        return TRUE;
    }

    /* parts[0] is the empty string before the leading '/'. */
    for (guint i = 1; i < n; i++) {
        g_string_append_c(prefix, '/');
        g_string_append(prefix, parts[i]);
        if (!lstat_one(fs, index, prefix->str, &st, error))
            return FALSE;
        if (st.st_ino == -1)
            return TRUE;
        if (i + 1 < n && !S_ISDIR(st.st_mode)) {
            if (ret_blocker != NULL)
                *ret_blocker = g_strdup(prefix->str);
            *ret_st = st;
            return TRUE;
        }
    }
    *ret_st = st;
    *ret_found = TRUE;
    return TRUE;
}

/* Every path below directory @dir of image @index, relative to it, as find -print0 lists
 * them: one round trip for the whole tree. */
static gboolean
find_below(VmGuestfs *fs, guint index, const char *dir, char **ret_list, gsize *ret_len,
           GError **error)
{
    g_autoptr(GError) local = NULL;
    g_autofree char *tmp = NULL;
    g_autofree char *where = image_path(index, dir);
    gboolean ok;
    int fd;

    fd = g_file_open_tmp("vmctl-find-XXXXXX", &tmp, &local);
    if (fd < 0)
        return vm_throw(error, VM_ERROR_IO, "cannot create a temporary file: %s", local->message);
    close(fd);

    if (guestfs_find0(fs->g, where, tmp) == -1) {
        g_autofree char *shown = shown_path(dir);
        g_unlink(tmp);
        return throw_guestfs(fs->g, error, "cannot list '%s' in '%s'", shown, fs->images[index]);
    }
    ok = g_file_get_contents(tmp, ret_list, ret_len, &local);
    g_unlink(tmp);
    if (!ok)
        return vm_throw(error, VM_ERROR_IO, "cannot read a temporary file: %s", local->message);
    return TRUE;
}

/* Adds to @entries guest path @root of image @index and, for a directory, everything below it.
 * A @root that does not exist there adds nothing. Round trips: one listing of the whole tree,
 * then one per directory, plus one per directory holding symbolic links. */
static gboolean
walk(VmGuestfs *fs, guint index, const char *root, GHashTable *entries, GError **error)
{
    g_autoptr(GHashTable) dirs = NULL;
    g_autofree char *list = NULL;
    struct guestfs_statns st;
    gboolean found;
    gsize len = 0;
    GHashTableIter iter;
    gpointer key, value;

    if (!resolve(fs, index, root, &st, &found, NULL, error))
        return FALSE;
    if (!found)
        return TRUE;

    Entry *top = entry_new(&st);
    g_hash_table_insert(entries, g_strdup(root), top);
    if (S_ISLNK(st.st_mode)) {
        g_autofree char *where = image_path(index, root);
        top->link = guestfs_readlink(fs->g, where);
        if (top->link == NULL) {
            g_autofree char *shown = shown_path(root);
            return throw_guestfs(fs->g, error, "cannot read link '%s' in '%s'", shown,
                                 fs->images[index]);
        }
    }
    if (!S_ISDIR(st.st_mode))
        return TRUE;

    if (!find_below(fs, index, root, &list, &len, error))
        return FALSE;

    /* Group the names by directory: lstatnslist takes one directory and plain names. */
    dirs =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_ptr_array_unref);
    for (gsize pos = 0; pos < len;) {
        const char *rel = list + pos;
        gsize n = strnlen(rel, len - pos);
        const char *slash;
        g_autofree char *dir = NULL;
        GPtrArray *names;

        pos += n + 1;
        /* Relative to @dir, with a leading '/' unless @dir is the mount's root. */
        while (n > 0 && rel[0] == '/') {
            rel++;
            n--;
        }
        if (n == 0)
            continue;
        slash = memrchr(rel, '/', n);
        dir = slash != NULL ? g_strndup(rel, (gsize)(slash - rel)) : g_strdup("");
        names = g_hash_table_lookup(dirs, dir);
        if (names == NULL) {
            names = g_ptr_array_new_with_free_func(g_free);
            g_hash_table_insert(dirs, g_steal_pointer(&dir), names);
        }
        g_ptr_array_add(names, g_strndup(slash != NULL ? slash + 1 : rel,
                                         slash != NULL ? (gsize)(rel + n - slash - 1) : n));
    }

    g_hash_table_iter_init(&iter, dirs);
    while (g_hash_table_iter_next(&iter, &key, &value)) {
        const char *rel_dir = key;
        GPtrArray *names = value;
        g_autofree char *dir = rel_dir[0] == '\0' ? g_strdup(root) : path_join(root, rel_dir);
        g_autofree char *where = image_path(index, dir);
        g_autoptr(GPtrArray) links = g_ptr_array_new();
        g_autoptr(GPtrArray) link_entries = g_ptr_array_new();
        g_autoptr(GfsStatnsList) stats = NULL;

        g_ptr_array_add(names, NULL);
        stats = guestfs_lstatnslist(fs->g, where, (char *const *)names->pdata);
        if (stats == NULL || stats->len != names->len - 1) {
            g_autofree char *shown = shown_path(dir);
            return throw_guestfs(fs->g, error, "cannot read '%s' in '%s'", shown,
                                 fs->images[index]);
        }
        for (guint i = 0; i < stats->len; i++) {
            const char *name = names->pdata[i];
            Entry *e;

            if (stats->val[i].st_ino == -1)
                continue;
            e = entry_new(&stats->val[i]);
            g_hash_table_insert(entries, path_join(dir, name), e);
            if (S_ISLNK(e->mode)) {
                g_ptr_array_add(links, (gpointer)name);
                g_ptr_array_add(link_entries, e);
            }
        }
        if (links->len > 0) {
            g_auto(GStrv) targets = NULL;

            g_ptr_array_add(links, NULL);
            targets = guestfs_readlinklist(fs->g, where, (char *const *)links->pdata);
            if (targets == NULL || g_strv_length(targets) != link_entries->len) {
                g_autofree char *shown = shown_path(dir);
                return throw_guestfs(fs->g, error, "cannot read links in '%s' in '%s'", shown,
                                     fs->images[index]);
            }
            for (guint i = 0; i < link_entries->len; i++) {
                Entry *e = link_entries->pdata[i];
                e->link = g_steal_pointer(&targets[i]);
            }
        }
    }
    return TRUE;
}

typedef enum {
    VERDICT_SAME,
    VERDICT_DIFFERENT,
    VERDICT_CHECK_CONTENT,
} Verdict;

static Verdict
entry_compare(const Entry *a, const Entry *b)
{
    /* st_mode holds the type too. */
    if (a->mode != b->mode || a->uid != b->uid || a->gid != b->gid)
        return VERDICT_DIFFERENT;
    if (S_ISDIR(a->mode))
        return VERDICT_SAME;
    if (S_ISLNK(a->mode))
        return g_strcmp0(a->link, b->link) == 0 ? VERDICT_SAME : VERDICT_DIFFERENT;
    if (S_ISCHR(a->mode) || S_ISBLK(a->mode))
        return a->rdev == b->rdev ? VERDICT_SAME : VERDICT_DIFFERENT;
    if (a->size != b->size)
        return VERDICT_DIFFERENT;
    if (S_ISREG(a->mode) && (a->mtime_sec != b->mtime_sec || a->mtime_nsec != b->mtime_nsec))
        return VERDICT_CHECK_CONTENT;
    return VERDICT_SAME;
}

static void
add_change(GPtrArray *changes, char kind, const char *path)
{
    VmGuestChange *c = g_new0(VmGuestChange, 1);
    c->kind = kind;
    c->path = g_strdup(path);
    g_ptr_array_add(changes, c);
}

static gint
change_compare(gconstpointer a, gconstpointer b)
{
    const VmGuestChange *x = *(VmGuestChange *const *)a;
    const VmGuestChange *y = *(VmGuestChange *const *)b;
    return strcmp(x->path, y->path);
}

/* Files up to this size are compared by reading both in chunks (a round trip each); bigger ones
 * by checksum, which costs a process start in the appliance (~0.1-0.2 s under TCG) but keeps
 * their content inside it. */
#define COMPARE_READ_MAX   (8 * 1024 * 1024)
#define COMPARE_READ_CHUNK (1024 * 1024)

static gboolean
throw_unreadable(VmGuestfs *fs, guint index, const char *path, GError **error)
{
    g_autofree char *shown = shown_path(path);
    return throw_guestfs(fs->g, error, "cannot read '%s' in '%s'", shown, fs->images[index]);
}

/* Whether regular file @path, @size bytes in both images, has the same content in both. */
static gboolean
same_content(VmGuestfs *fs, guint old_index, guint new_index, const char *path, gint64 size,
             gboolean *ret_same, GError **error)
{
    g_autofree char *old_where = image_path(old_index, path);
    g_autofree char *new_where = image_path(new_index, path);
    g_autofree char *old_sum = NULL;
    g_autofree char *new_sum = NULL;

    if (size > COMPARE_READ_MAX) {
        old_sum = guestfs_checksum(fs->g, "sha256", old_where);
        if (old_sum == NULL)
            return throw_unreadable(fs, old_index, path, error);
        new_sum = guestfs_checksum(fs->g, "sha256", new_where);
        if (new_sum == NULL)
            return throw_unreadable(fs, new_index, path, error);
        *ret_same = strcmp(old_sum, new_sum) == 0;
        return TRUE;
    }

    *ret_same = TRUE;
    for (gint64 offset = 0; offset < size; offset += COMPARE_READ_CHUNK) {
        size_t old_len = 0;
        size_t new_len = 0;
        g_autofree char *old_data =
            guestfs_pread(fs->g, old_where, COMPARE_READ_CHUNK, offset, &old_len);
        g_autofree char *new_data = NULL;

        if (old_data == NULL)
            return throw_unreadable(fs, old_index, path, error);
        new_data = guestfs_pread(fs->g, new_where, COMPARE_READ_CHUNK, offset, &new_len);
        if (new_data == NULL)
            return throw_unreadable(fs, new_index, path, error);
        if (old_len != new_len || memcmp(old_data, new_data, old_len) != 0) {
            *ret_same = FALSE;
            break;
        }
        if (old_len == 0)
            break;
    }
    return TRUE;
}

GPtrArray *
vm_guestfs_diff_at(VmGuestfs *fs, guint old_index, guint new_index, const char *under,
                   GError **error)
{
    g_autoptr(GHashTable) old_entries = NULL;
    g_autoptr(GHashTable) new_entries = NULL;
    g_autoptr(GPtrArray) changes = NULL;
    g_autoptr(GPtrArray) to_check = g_ptr_array_new();
    g_autofree char *root = NULL;
    GHashTableIter iter;
    gpointer key, value;

    g_return_val_if_fail(fs != NULL, NULL);
    g_return_val_if_fail(old_index < fs->n_images && new_index < fs->n_images, NULL);

    if (under == NULL)
        root = g_strdup("/");
    else if (!vm_guest_path_check(under, &root, error))
        return NULL;

    old_entries =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)entry_free);
    new_entries =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)entry_free);
    if (!walk(fs, old_index, root, old_entries, error) ||
        !walk(fs, new_index, root, new_entries, error))
        return NULL;
    if (g_hash_table_size(old_entries) == 0 && g_hash_table_size(new_entries) == 0) {
        g_autofree char *shown = shown_path(root);
        vm_throw(error, VM_ERROR_NOT_FOUND, "'%s' exists in neither '%s' nor '%s'", shown,
                 fs->images[old_index], fs->images[new_index]);
        return NULL;
    }

    changes = g_ptr_array_new_with_free_func((GDestroyNotify)vm_guest_change_free);
    g_hash_table_iter_init(&iter, old_entries);
    while (g_hash_table_iter_next(&iter, &key, &value)) {
        const Entry *after = g_hash_table_lookup(new_entries, key);
        if (after == NULL) {
            add_change(changes, 'D', key);
            continue;
        }
        switch (entry_compare(value, after)) {
        case VERDICT_DIFFERENT:
            add_change(changes, 'M', key);
            break;
        case VERDICT_CHECK_CONTENT:
            g_ptr_array_add(to_check, key);
            break;
        case VERDICT_SAME:
        default:
            break;
        }
    }
    g_hash_table_iter_init(&iter, new_entries);
    while (g_hash_table_iter_next(&iter, &key, &value)) {
        if (!g_hash_table_contains(old_entries, key))
            add_change(changes, 'A', key);
    }
    for (guint i = 0; i < to_check->len; i++) {
        const Entry *e = g_hash_table_lookup(old_entries, to_check->pdata[i]);
        gboolean same = FALSE;
        if (!same_content(fs, old_index, new_index, to_check->pdata[i], e->size, &same, error))
            return NULL;
        if (!same)
            add_change(changes, 'M', to_check->pdata[i]);
    }

    g_ptr_array_sort(changes, change_compare);
    return g_steal_pointer(&changes);
}

/* A tar --exclude pattern that matches exactly guest path @path: "./" anchors it (no member
 * name has a "." component to match after), and wildcard characters are escaped. */
static char *
exclude_pattern(const char *path)
{
    GString *s = g_string_new("./");

    for (const char *p = path + 1; *p != '\0'; p++) {
        if (strchr("\\*?[", *p) != NULL)
            g_string_append_c(s, '\\');
        g_string_append_c(s, *p);
    }
    return g_string_free(s, FALSE);
}

static gint
string_compare(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* @paths checked, normalized and sorted, without those below another one. */
static GPtrArray *
export_selection(const char *const *paths, GError **error)
{
    g_autoptr(GPtrArray) all = g_ptr_array_new_with_free_func(g_free);
    GPtrArray *kept = g_ptr_array_new_with_free_func(g_free);

    for (gsize i = 0; paths[i] != NULL; i++) {
        char *normalized;
        if (!vm_guest_path_check(paths[i], &normalized, error)) {
            g_ptr_array_unref(kept);
            return NULL;
        }
        g_ptr_array_add(all, normalized);
    }
    g_ptr_array_sort(all, string_compare);
    for (guint i = 0; i < all->len; i++) {
        const char *p = all->pdata[i];
        gboolean covered = FALSE;
        /* Sorted, so a covering path comes before: "/a" < "/a/b", but "/a-b" may come between. */
        for (guint j = 0; j < kept->len && !covered; j++) {
            const char *k = kept->pdata[j];
            gsize n = strlen(k);
            covered = strncmp(p, k, n) == 0 && (p[n] == '\0' || p[n] == '/');
        }
        if (!covered)
            g_ptr_array_add(kept, g_strdup(p));
    }
    return kept;
}

gboolean
vm_guestfs_export_at(VmGuestfs *fs, guint index, const char *const *paths, const char *tar_path,
                     GError **error)
{
    g_autoptr(GPtrArray) selection = NULL;
    g_autoptr(GHashTable) keep = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_autoptr(GPtrArray) parents = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GPtrArray) excludes = g_ptr_array_new_with_free_func(g_free);
    g_autofree char *tmp = NULL;
    g_autofree char *root = NULL;
    int fd;

    g_return_val_if_fail(fs != NULL && index < fs->n_images, FALSE);
    g_return_val_if_fail(paths != NULL && tar_path != NULL, FALSE);

    if (paths[0] == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no guest path to export");
    selection = export_selection(paths, error);
    if (selection == NULL)
        return FALSE;

    for (guint i = 0; i < selection->len; i++) {
        const char *path = selection->pdata[i];
        g_autofree char *blocker = NULL;
        g_autofree char *shown = shown_path(path);
        struct guestfs_statns st;
        gboolean found;

        if (!resolve(fs, index, path, &st, &found, &blocker, error))
            return FALSE;
        if (!found && blocker != NULL && S_ISLNK(st.st_mode)) {
            g_autofree char *shown_blocker = shown_path(blocker);
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "'%s' lies below the symbolic link '%s' in '%s'", shown, shown_blocker,
                            fs->images[index]);
        }
        if (!found)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "'%s' does not exist in '%s'", shown,
                            fs->images[index]);

        g_hash_table_add(keep, g_strdup(path));
        g_autofree char *dir = g_path_get_dirname(path);
        while (!g_hash_table_contains(keep, dir)) {
            g_hash_table_add(keep, g_strdup(dir));
            g_ptr_array_add(parents, g_strdup(dir));
            if (strcmp(dir, "/") == 0)
                break;
            char *up = g_path_get_dirname(dir);
            g_free(dir);
            dir = up;
        }
    }

    /* tar_out packs a whole directory, so pack the root and exclude every entry of the parent
     * directories that is neither selected nor a parent itself: nothing is copied, and the
     * parents come with their own metadata. */
    g_ptr_array_sort(parents, string_compare);
    for (guint i = 0; i < parents->len; i++) {
        const char *dir = parents->pdata[i];
        g_autofree char *where = image_path(index, dir);
        g_auto(GStrv) names = guestfs_ls(fs->g, where);

        if (names == NULL) {
            g_autofree char *shown = shown_path(dir);
            return throw_guestfs(fs->g, error, "cannot list '%s' in '%s'", shown,
                                 fs->images[index]);
        }
        for (guint j = 0; names[j] != NULL; j++) {
            g_autofree char *path = path_join(dir, names[j]);
            if (g_hash_table_contains(keep, path))
                continue;
            /* tar reads its exclude patterns one per line. */
            if (strchr(names[j], '\n') != NULL) {
                g_autofree char *shown = shown_path(path);
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "cannot export next to '%s': its name holds a newline", shown);
            }
            g_ptr_array_add(excludes, exclude_pattern(path));
        }
    }
    g_ptr_array_add(excludes, NULL);

    /* Write beside the target and rename, so a failure leaves no partial tar. */
    tmp = g_strconcat(tar_path, ".XXXXXX", NULL);
    fd = g_mkstemp_full(tmp, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot create a file beside '%s'", tar_path);
    close(fd);

    root = image_path(index, "/");
    if (guestfs_tar_out_opts(fs->g, root, tmp, GUESTFS_TAR_OUT_OPTS_NUMERICOWNER, 1,
                             GUESTFS_TAR_OUT_OPTS_EXCLUDES, (char *const *)excludes->pdata,
                             GUESTFS_TAR_OUT_OPTS_XATTRS, 1, GUESTFS_TAR_OUT_OPTS_ACLS, 1,
                             -1) == -1) {
        g_unlink(tmp);
        return throw_guestfs(fs->g, error, "cannot pack files of '%s'", fs->images[index]);
    }
    if (g_rename(tmp, tar_path) != 0) {
        int saved = errno;
        g_unlink(tmp);
        return vm_throw_errno(error, saved, "cannot write '%s'", tar_path);
    }
    return TRUE;
}

gboolean
vm_guestfs_appliance_build(const char *dir, GError **error)
{
    g_autoptr(guestfs_h) g = guestfs_create_flags(GUESTFS_CREATE_NO_ENVIRONMENT);
    if (g == NULL)
        return vm_throw_errno(error, errno, "cannot create a libguestfs handle");
    guestfs_set_error_handler(g, NULL, NULL);

    /* libguestfs's own path: where its package put the supermin description of the appliance. */
    g_autofree char *path = g_strdup(guestfs_get_path(g));
    if (path == NULL)
        return throw_guestfs(g, error, "cannot find libguestfs's appliance");
    g_autofree char *supermin_d = NULL;
    g_auto(GStrv) dirs = g_strsplit(path, ":", -1);
    for (gsize i = 0; dirs[i] != NULL && supermin_d == NULL; i++) {
        g_autofree char *candidate = g_build_filename(dirs[i], "supermin.d", NULL);
        if (g_file_test(candidate, G_FILE_TEST_IS_DIR))
            supermin_d = g_steal_pointer(&candidate);
    }
    if (supermin_d == NULL)
        return vm_throw(error, VM_ERROR_IO, "no supermin.d in libguestfs's path %s", path);

    struct utsname host;
    if (uname(&host) < 0)
        return vm_throw_errno(error, errno, "cannot tell the host's CPU");
    g_autofree char *lock = g_strconcat(dir, ".lock", NULL);
    /* As libguestfs builds its own cache: only when the host's packages are newer than the
     * appliance, the new one put in place with a rename. */
    const char *const argv[] = {
        "supermin", "--build",    "--if-newer", "--lock", lock, "--copy-kernel", "--format",
        "ext2",     "--host-cpu", host.machine, "-o",     dir,  supermin_d,      NULL};
    const VmSpawnOptions options = {.timeout_ms = 10 * 60 * 1000};
    if (!vm_spawn_run(argv, &options, NULL, error))
        return FALSE;

    /* A "fixed" appliance to libguestfs: these four files, used as they are by any user. The
     * kernel is the distribution's, copied from the host. */
    static const char *const files[] = {"kernel", "initrd", "root"};
    for (gsize i = 0; i < G_N_ELEMENTS(files); i++) {
        g_autofree char *file = g_build_filename(dir, files[i], NULL);
        if (chmod(file, 0644) < 0)
            return vm_throw_errno(error, errno, "cannot make %s readable", file);
    }
    g_autofree char *readme = g_build_filename(dir, "README.fixed", NULL);
    if (!g_file_test(readme, G_FILE_TEST_EXISTS) &&
        !vm_file_write_atomic(readme, "The appliance vm-guestfs-helper runs, built by hostd.\n", -1,
                              0644, error))
        return FALSE;
    if (chmod(dir, 0755) < 0)
        return vm_throw_errno(error, errno, "cannot make %s readable", dir);
    return TRUE;
}

#else /* !VM_HAVE_GUESTFS */

struct _VmGuestfs {
    int unused;
};

VmGuestfs *
vm_guestfs_open(const char *const *images, const char *appliance, GError **error)
{
    g_return_val_if_fail(images != NULL && images[0] != NULL, NULL);
    vm_throw(error, VM_ERROR_FAILED, "this build has no libguestfs: cannot read image files");
    return NULL;
}

void
vm_guestfs_close(VmGuestfs *fs)
{
    g_free(fs);
}

GPtrArray *
vm_guestfs_diff_at(VmGuestfs *fs, guint old_index, guint new_index, const char *under,
                   GError **error)
{
    g_return_val_if_reached(NULL);
}

gboolean
vm_guestfs_export_at(VmGuestfs *fs, guint index, const char *const *paths, const char *tar_path,
                     GError **error)
{
    g_return_val_if_reached(FALSE);
}

gboolean
vm_guestfs_appliance_build(const char *dir, GError **error)
{
    return vm_throw(error, VM_ERROR_FAILED,
                    "this build has no libguestfs: cannot read image files");
}

#endif /* VM_HAVE_GUESTFS */

GPtrArray *
vm_guestfs_diff(const char *old_image, const char *new_image, const char *under,
                const char *appliance, GError **error)
{
    const char *images[] = {old_image, new_image, NULL};
    g_autoptr(VmGuestfs) fs = NULL;
    g_autofree char *root = NULL;

    g_return_val_if_fail(old_image != NULL && new_image != NULL, NULL);

    /* A bad filter fails before the launch. */
    if (under != NULL && !vm_guest_path_check(under, &root, error))
        return NULL;
    fs = vm_guestfs_open(images, appliance, error);
    if (fs == NULL)
        return NULL;
    return vm_guestfs_diff_at(fs, 0, 1, root, error);
}

gboolean
vm_guestfs_export(const char *image, const char *const *paths, const char *tar_path,
                  const char *appliance, GError **error)
{
    const char *images[] = {image, NULL};
    g_autoptr(VmGuestfs) fs = NULL;

    g_return_val_if_fail(image != NULL && paths != NULL && tar_path != NULL, FALSE);

    /* Bad paths fail before the launch. */
    if (paths[0] == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no guest path to export");
    for (gsize i = 0; paths[i] != NULL; i++) {
        if (!vm_guest_path_check(paths[i], NULL, error))
            return FALSE;
    }
    fs = vm_guestfs_open(images, appliance, error);
    if (fs == NULL)
        return FALSE;
    return vm_guestfs_export_at(fs, 0, paths, tar_path, error);
}
