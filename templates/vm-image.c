#include "vm-image.h"
#include "vm-image-private.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vm-config.h"
#include "vm-error.h"
#include "vm-fs.h"
#include "vm-spawn.h"
#include "vm-util.h"

#define INI_GROUP      "image"
#define LOG_TAIL_LINES 10
#define LOG_TAIL_BYTES 8192
#define KILL_GRACE_US  (30 * G_USEC_PER_SEC)
#define LOCK_POLL_US   (100 * 1000)

void
vm_image_free(VmImage *image)
{
    if (image == NULL)
        return;
    g_free(image->dir);
    g_free(image->disk_path);
    g_free(image->kernel_path);
    g_free(image->initrd_path);
    g_free(image->cmdline);
    g_free(image);
}

/* A template name becomes a directory name: it must stay one path component. */
static gboolean
image_check_name(const char *name, GError **error)
{
    if (name == NULL || name[0] == '\0' || name[0] == '.' || strchr(name, '/') != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid template name '%s'",
                        name ? name : "");
    return TRUE;
}

/* Files named in image.ini live next to it: accept plain file names only. */
static char *
image_ini_file(GKeyFile *kf, const char *ini_path, const char *dir, const char *key,
               gboolean required, GError **error)
{
    g_autofree char *value = g_key_file_get_string(kf, INI_GROUP, key, NULL);

    if (value == NULL) {
        if (required)
            vm_throw(error, VM_ERROR_IMAGE, "%s: no '%s' key", ini_path, key);
        return NULL;
    }
    if (value[0] == '\0' || value[0] == '.' || strchr(value, '/') != NULL) {
        vm_throw(error, VM_ERROR_IMAGE, "%s: invalid %s '%s'", ini_path, key, value);
        return NULL;
    }
    g_autofree char *path = g_build_filename(dir, value, NULL);
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "image incomplete: %s is missing", path);
        return NULL;
    }
    return g_steal_pointer(&path);
}

VmImage *
vm_image_lookup(const char *images_dir, const VmTemplate *template_, GError **error)
{
    g_autoptr(GError) local = NULL;

    g_return_val_if_fail(images_dir != NULL, NULL);
    g_return_val_if_fail(template_ != NULL, NULL);

    if (!image_check_name(template_->name, error))
        return NULL;

    g_autofree char *dir = g_build_filename(images_dir, template_->name, NULL);
    g_autofree char *ini_path = g_build_filename(dir, VM_IMAGE_INI, NULL);
    g_autoptr(GKeyFile) kf = g_key_file_new();

    if (!g_key_file_load_from_file(kf, ini_path, G_KEY_FILE_NONE, &local)) {
        if (g_error_matches(local, G_FILE_ERROR, G_FILE_ERROR_NOENT) ||
            g_error_matches(local, G_FILE_ERROR, G_FILE_ERROR_NOTDIR)) {
            vm_throw(error, VM_ERROR_NOT_FOUND, "the image of template '%s' is not ready",
                     template_->name);
        } else if (local->domain == G_FILE_ERROR) {
            vm_throw(error, VM_ERROR_IO, "reading %s: %s", ini_path, local->message);
        } else {
            vm_throw(error, VM_ERROR_IMAGE, "%s: %s", ini_path, local->message);
        }
        return NULL;
    }

    g_autoptr(VmImage) image = g_new0(VmImage, 1);
    image->disk_path = image_ini_file(kf, ini_path, dir, "disk", TRUE, error);
    if (image->disk_path == NULL)
        return NULL;
    if (g_key_file_has_key(kf, INI_GROUP, "kernel", NULL) ||
        g_key_file_has_key(kf, INI_GROUP, "initrd", NULL)) {
        image->kernel_path = image_ini_file(kf, ini_path, dir, "kernel", TRUE, error);
        if (image->kernel_path == NULL)
            return NULL;
        image->initrd_path = image_ini_file(kf, ini_path, dir, "initrd", TRUE, error);
        if (image->initrd_path == NULL)
            return NULL;
        image->cmdline = g_key_file_get_string(kf, INI_GROUP, "cmdline", NULL);
    }

    image->virtual_size = g_key_file_get_uint64(kf, INI_GROUP, "virtual-size", &local);
    if (local != NULL || image->virtual_size == 0) {
        vm_throw(error, VM_ERROR_IMAGE, "%s: missing or invalid virtual-size", ini_path);
        return NULL;
    }
    image->dir = g_steal_pointer(&dir);
    return g_steal_pointer(&image);
}

gboolean
vm_image_qcow2_probe(const char *path, gboolean *ret_is_qcow2, VmQcow2Info *ret_info,
                     GError **error)
{
    /* magic, version, backing_file_offset, backing_file_size, cluster_bits, size, crypt,
     * l1_size, l1_table_offset, refcount_table_offset, refcount_table_clusters, nb_snapshots,
     * snapshots_offset, then (v3) incompatible_features at byte 72. */
    guint8 header[80] = {0};
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return vm_throw_errno(error, errno, "opening %s", path);
    ssize_t n;
    do {
        n = pread(fd, header, sizeof(header), 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return vm_throw_errno(error, errno, "reading %s", path);

    if (n < 72 || memcmp(header, "QFI\xfb", 4) != 0) {
        *ret_is_qcow2 = FALSE;
        return TRUE;
    }

    guint32 version;
    guint64 backing_offset, size, incompatible = 0;
    memcpy(&version, header + 4, 4);
    memcpy(&backing_offset, header + 8, 8);
    memcpy(&size, header + 24, 8);
    version = GUINT32_FROM_BE(version);
    if (version >= 3 && n >= 80) {
        memcpy(&incompatible, header + 72, 8);
        incompatible = GUINT64_FROM_BE(incompatible);
    }

    *ret_is_qcow2 = TRUE;
    ret_info->version = version;
    ret_info->virtual_size = GUINT64_FROM_BE(size);
    ret_info->has_backing_file = GUINT64_FROM_BE(backing_offset) != 0;
    /* Incompatible feature bit 2: the guest data lives in an external file. */
    ret_info->has_external_data = (incompatible & (1u << 2)) != 0;
    return TRUE;
}

/* Up to LOG_TAIL_LINES last lines of @path, or an empty string. */
static char *
image_log_tail(const char *path)
{
    g_autofree char *contents = NULL;
    gsize len = 0;

    if (!g_file_get_contents(path, &contents, &len, NULL) || len == 0)
        return g_strdup("");

    const char *start = contents + (len > LOG_TAIL_BYTES ? len - LOG_TAIL_BYTES : 0);
    const char *end = contents + len;
    while (end > start && (end[-1] == '\n' || end[-1] == '\r'))
        end--;
    const char *p = end;
    for (int lines = 0; p > start; p--) {
        if (p[-1] == '\n' && ++lines == LOG_TAIL_LINES)
            break;
    }
    g_autofree char *tail = g_strndup(p, end - p);
    return g_utf8_make_valid(tail, -1);
}

/* The build script is not run with vm_spawn_run(): its stdout is read line by line while it runs
 * (progress), its stderr goes to the build log, and a cancel first gives it time to unmount and
 * remove its rootfs. */
static void
image_child_setup(gpointer data)
{
    /* A process group of its own, so cancelling reaches mmdebstrap, apt and dpkg too. */
    setpgid(0, 0);
}

/* Stops the process group led by @pid: SIGTERM (so the build script can unmount and remove its
 * rootfs), then SIGKILL if it is still around after a grace period. */
static void
image_kill_group(GSubprocess *proc, pid_t pid)
{
    /* No pid: the script ended before it could be read, so there is no group to stop (and
     * kill(-0) would signal our own group). */
    if (pid <= 0) {
        g_subprocess_wait(proc, NULL, NULL);
        return;
    }
    kill(-pid, SIGTERM);
    gint64 deadline = g_get_monotonic_time() + KILL_GRACE_US;
    while (g_subprocess_get_identifier(proc) != NULL && g_get_monotonic_time() < deadline)
        g_usleep(50 * 1000);
    kill(-pid, SIGKILL);
    g_subprocess_wait(proc, NULL, NULL);
}

static GSubprocess *
image_spawn(GSubprocessLauncher *launcher, const char *const *argv, pid_t *ret_pid, GError **error)
{
    g_autoptr(GError) local = NULL;

    g_subprocess_launcher_set_child_setup(launcher, image_child_setup, NULL, NULL);
    GSubprocess *proc = g_subprocess_launcher_spawnv(launcher, argv, &local);
    if (proc == NULL) {
        vm_throw(error, VM_ERROR_IO, "running %s: %s", argv[0], local->message);
        return NULL;
    }
    /* A script that fails at once may be reaped already: then it has no identifier left. */
    const char *identifier = g_subprocess_get_identifier(proc);
    *ret_pid = identifier != NULL ? (pid_t)g_ascii_strtoll(identifier, NULL, 10) : 0;
    /* Also from this side, so a cancel right after the spawn cannot miss the group. */
    if (*ret_pid > 0)
        setpgid(*ret_pid, *ret_pid);
    return proc;
}

static gboolean
image_check_exit(GSubprocess *proc, const char *what, const char *output, GError **error)
{
    if (g_subprocess_get_if_exited(proc) && g_subprocess_get_exit_status(proc) == 0)
        return TRUE;

    g_autofree char *how =
        g_subprocess_get_if_signaled(proc)
            ? g_strdup_printf("killed by signal %d", g_subprocess_get_term_sig(proc))
            : g_strdup_printf("exit status %d", g_subprocess_get_exit_status(proc));
    if (output != NULL && output[0] != '\0')
        return vm_throw(error, VM_ERROR_IMAGE, "%s failed (%s):\n%s", what, how, output);
    return vm_throw(error, VM_ERROR_IMAGE, "%s failed (%s)", what, how);
}

char *
vm_image_find_script(GError **error)
{
    const char *env = g_getenv("VM_TEMPLATES_DIR");
    g_autofree char *shipped = vm_shipped_templates_dir();
    const char *dirs[] = {env, shipped};

    for (gsize i = 0; i < G_N_ELEMENTS(dirs); i++) {
        if (dirs[i] == NULL || dirs[i][0] == '\0')
            continue;
        g_autofree char *path = g_build_filename(dirs[i], VM_IMAGE_SCRIPT, NULL);
        if (g_file_test(path, G_FILE_TEST_IS_REGULAR))
            return g_steal_pointer(&path);
    }
    vm_throw(error, VM_ERROR_NOT_FOUND, "%s not found in $VM_TEMPLATES_DIR or %s", VM_IMAGE_SCRIPT,
             shipped);
    return NULL;
}

/* "PROGRESS <0-100> <message>" from the build script. */
static void
image_relay_progress(const char *line, const char *template_name, VmProgressFunc progress,
                     gpointer progress_data)
{
    if (progress == NULL || !g_str_has_prefix(line, "PROGRESS "))
        return;

    char *end = NULL;
    const char *p = line + strlen("PROGRESS ");
    guint64 percent = g_ascii_strtoull(p, &end, 10);
    if (end == p || (*end != ' ' && *end != '\0') || percent > 100)
        return;
    while (*end == ' ')
        end++;
    g_autofree char *valid = g_utf8_make_valid(end, -1);
    g_autofree char *message = g_strdup_printf("building %s: %s", template_name, valid);
    progress(message, (double)percent / 100.0, progress_data);
}

static gboolean
image_build_mmdebstrap(const VmTemplate *template_, const char *work_dir, VmProgressFunc progress,
                       gpointer progress_data, GCancellable *cancellable, GError **error)
{
    g_autoptr(GError) local = NULL;
    pid_t pid;

    g_autofree char *script = vm_image_find_script(error);
    if (script == NULL)
        return FALSE;

    g_autofree char *log_path = g_build_filename(work_dir, VM_IMAGE_BUILD_LOG, NULL);
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        return vm_throw_errno(error, errno, "creating %s", log_path);

    g_autoptr(GStrvBuilder) args = g_strv_builder_new();
    g_strv_builder_add_many(args, "bash", script, work_dir,
                            template_->suite ? template_->suite : "",
                            template_->mirror ? template_->mirror : "host", NULL);
    g_strv_builder_addv(args, (const char **)template_->packages);
    g_auto(GStrv) argv = g_strv_builder_end(args);

    g_autoptr(GSubprocessLauncher) launcher =
        g_subprocess_launcher_new(G_SUBPROCESS_FLAGS_STDOUT_PIPE);
    g_subprocess_launcher_take_stderr_fd(launcher, log_fd);
    g_subprocess_launcher_setenv(launcher, "VM_BUILD_LOG", log_path, TRUE);
    g_subprocess_launcher_setenv(launcher, "LC_ALL", "C.UTF-8", TRUE);

    g_autoptr(GSubprocess) proc = image_spawn(launcher, (const char *const *)argv, &pid, error);
    if (proc == NULL)
        return FALSE;

    g_autoptr(GDataInputStream) lines = g_data_input_stream_new(g_subprocess_get_stdout_pipe(proc));
    for (;;) {
        g_autofree char *line = g_data_input_stream_read_line(lines, NULL, cancellable, &local);
        if (line == NULL)
            break;
        image_relay_progress(line, template_->name, progress, progress_data);
    }
    if (local == NULL)
        g_subprocess_wait(proc, cancellable, &local);
    if (local != NULL) {
        image_kill_group(proc, pid);
        if (g_error_matches(local, G_IO_ERROR, G_IO_ERROR_CANCELLED))
            return vm_throw(error, VM_ERROR_CANCELLED, "building the image of %s cancelled",
                            template_->name);
        return vm_throw(error, VM_ERROR_IO, "reading from %s: %s", script, local->message);
    }

    g_autofree char *tail = image_log_tail(log_path);
    g_autofree char *what = g_strdup_printf("building the image of %s", template_->name);
    if (!image_check_exit(proc, what, tail, error))
        return FALSE;

    const char *outputs[] = {VM_IMAGE_DISK, VM_IMAGE_KERNEL, VM_IMAGE_INITRD};
    for (gsize i = 0; i < G_N_ELEMENTS(outputs); i++) {
        g_autofree char *path = g_build_filename(work_dir, outputs[i], NULL);
        if (!g_file_test(path, G_FILE_TEST_IS_REGULAR))
            return vm_throw(error, VM_ERROR_IMAGE, "%s: the build script made no %s", what,
                            outputs[i]);
    }
    return TRUE;
}

/* Turns the verified download into <work_dir>/base.qcow2. */
static gboolean
image_adopt_download(const char *part_path, const char *work_dir, GCancellable *cancellable,
                     gboolean *ret_renamed, GError **error)
{
    g_autofree char *disk = g_build_filename(work_dir, VM_IMAGE_DISK, NULL);
    gboolean is_qcow2 = FALSE;
    VmQcow2Info info = {0};
    guint8 magic[6] = {0};

    if (!vm_image_qcow2_probe(part_path, &is_qcow2, &info, error))
        return FALSE;

    if (is_qcow2) {
        /* A backing file or external data file in a downloaded header would make QEMU open
         * an arbitrary host file on the guest's behalf. */
        if (info.has_backing_file || info.has_external_data)
            return vm_throw(error, VM_ERROR_IMAGE,
                            "refusing a downloaded qcow2 that refers to other files");
        if (rename(part_path, disk) < 0)
            return vm_throw_errno(error, errno, "moving %s to %s", part_path, disk);
        *ret_renamed = TRUE;
        return TRUE;
    }

    FILE *f = fopen(part_path, "rbe");
    if (f != NULL) {
        if (fread(magic, 1, sizeof(magic), f) == 0)
            memset(magic, 0, sizeof(magic));
        fclose(f);
    }
    if (memcmp(magic,
               "\xfd"
               "7zXZ",
               5) == 0 ||
        memcmp(magic, "\x1f\x8b", 2) == 0 || memcmp(magic, "\x28\xb5\x2f\xfd", 4) == 0 ||
        memcmp(magic, "BZh", 3) == 0)
        return vm_throw(error, VM_ERROR_IMAGE, "compressed images are not supported");

    /* Never let qemu-img probe the format of a download: raw is the only other choice. */
    const char *argv[] = {"qemu-img", "convert", "-q",      "-f", "raw",
                          "-O",       "qcow2",   part_path, disk, NULL};
    const VmSpawnOptions options = {.cancellable = cancellable};
    g_autoptr(GError) local = NULL;
    if (!vm_spawn_run(argv, &options, NULL, &local)) {
        unlink(disk);
        if (vm_error_code(local) == VM_ERROR_CANCELLED)
            return vm_throw(error, VM_ERROR_CANCELLED,
                            "converting the download to qcow2 cancelled");
        return vm_throw(error, VM_ERROR_IMAGE, "converting the download to qcow2: %s",
                        local->message);
    }
    unlink(part_path);
    *ret_renamed = FALSE;
    return TRUE;
}

static gboolean
image_write_ini(const VmTemplate *template_, const char *work_dir, const char *sha256,
                GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autofree char *disk = g_build_filename(work_dir, VM_IMAGE_DISK, NULL);
    gboolean is_qcow2 = FALSE;
    VmQcow2Info info = {0};

    if (!vm_image_qcow2_probe(disk, &is_qcow2, &info, error))
        return FALSE;
    if (!is_qcow2 || info.virtual_size == 0)
        return vm_throw(error, VM_ERROR_IMAGE, "%s is not a qcow2 image", disk);

    g_autoptr(GDateTime) now = g_date_time_new_now_utc();
    g_autofree char *created = g_date_time_format_iso8601(now);

    g_key_file_set_string(kf, INI_GROUP, "template", template_->name);
    g_key_file_set_string(kf, INI_GROUP, "disk", VM_IMAGE_DISK);
    if (template_->source == VM_IMAGE_SOURCE_MMDEBSTRAP) {
        g_key_file_set_string(kf, INI_GROUP, "source", "mmdebstrap");
        g_key_file_set_string(kf, INI_GROUP, "kernel", VM_IMAGE_KERNEL);
        g_key_file_set_string(kf, INI_GROUP, "initrd", VM_IMAGE_INITRD);
        g_key_file_set_string(kf, INI_GROUP, "cmdline", VM_IMAGE_CMDLINE);
        if (template_->suite != NULL)
            g_key_file_set_string(kf, INI_GROUP, "suite", template_->suite);
        if (template_->mirror != NULL)
            g_key_file_set_string(kf, INI_GROUP, "mirror", template_->mirror);
        if (template_->packages[0] != NULL)
            g_key_file_set_string_list(kf, INI_GROUP, "packages",
                                       (const char *const *)template_->packages,
                                       g_strv_length(template_->packages));
    } else {
        g_key_file_set_string(kf, INI_GROUP, "source", "url");
        g_key_file_set_string(kf, INI_GROUP, "url", template_->url);
    }
    g_key_file_set_uint64(kf, INI_GROUP, "virtual-size", info.virtual_size);
    if (sha256 != NULL)
        g_key_file_set_string(kf, INI_GROUP, "sha256", sha256);
    g_key_file_set_string(kf, INI_GROUP, "created", created);

    gsize len = 0;
    g_autofree char *data = g_key_file_to_data(kf, &len, NULL);
    g_autofree char *path = g_build_filename(work_dir, VM_IMAGE_INI, NULL);
    return vm_file_write_atomic(path, data, (gssize)len, 0644, error);
}

/* Puts every file of the finished @work_dir, and the directory itself, on disk before it is
 * renamed into place: after a crash, a directory under its final name holds a whole image, not
 * an image.ini next to a disk whose blocks never reached the disk. */
static gboolean
image_sync_work_dir(const char *work_dir, GError **error)
{
    g_autoptr(GError) local = NULL;
    g_autoptr(GDir) d = g_dir_open(work_dir, 0, &local);
    const char *entry;

    if (d == NULL)
        return vm_throw(error, VM_ERROR_IO, "%s", local->message);
    while ((entry = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(work_dir, entry, NULL);
        struct stat st;

        /* Only the files the build made; anything else holds no data of the image. */
        if (lstat(path, &st) < 0)
            return vm_throw_errno(error, errno, "syncing %s", path);
        if (!S_ISREG(st.st_mode))
            continue;
        vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 || fsync(fd) < 0)
            return vm_throw_errno(error, errno, "syncing %s", path);
    }
    vm_autofd dir_fd = open(work_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0 || fsync(dir_fd) < 0)
        return vm_throw_errno(error, errno, "syncing %s", work_dir);
    return TRUE;
}

/* Moves the finished @work_dir to @dir. An existing @dir is swapped out in one step and only
 * then removed, so readers see either the old or the new image, never a mix. */
static gboolean
image_install(const char *work_dir, const char *dir, GError **error)
{
    struct stat st;

    /* The images directory is synced after each rename: the new name is durable before the
     * build says the image is ready, and before an old image is removed. */
    if (!image_sync_work_dir(work_dir, error))
        return FALSE;
    if (lstat(dir, &st) < 0) {
        if (errno != ENOENT)
            return vm_throw_errno(error, errno, "checking %s", dir);
        if (rename(work_dir, dir) < 0)
            return vm_throw_errno(error, errno, "moving %s to %s", work_dir, dir);
        return vm_file_sync_dir(dir, error);
    }

    if (renameat2(AT_FDCWD, work_dir, AT_FDCWD, dir, RENAME_EXCHANGE) == 0)
        return vm_file_sync_dir(dir, error) && vm_remove_tree(work_dir, error);
    if (errno != EINVAL && errno != ENOSYS)
        return vm_throw_errno(error, errno, "replacing %s", dir);

    /* No RENAME_EXCHANGE on this file system: a short window without an image. */
    g_autofree char *old = g_strdup_printf("%s.old-XXXXXX", dir);
    if (g_mkdtemp(old) == NULL)
        return vm_throw_errno(error, errno, "creating %s", old);
    if (rename(dir, old) < 0)
        return vm_throw_errno(error, errno, "moving %s away", dir);
    if (rename(work_dir, dir) < 0) {
        int saved = errno;
        rename(old, dir);
        return vm_throw_errno(error, saved, "moving %s to %s", work_dir, dir);
    }
    return vm_file_sync_dir(dir, error) && vm_remove_tree(old, error);
}

/* Removes <name>.tmp-* left behind by builds that were killed. Only called under the lock. */
static void
image_remove_stale(const char *images_dir, const char *name)
{
    g_autoptr(GDir) d = g_dir_open(images_dir, 0, NULL);
    g_autofree char *prefix = g_strdup_printf("%s.tmp-", name);
    const char *entry;

    if (d == NULL)
        return;
    while ((entry = g_dir_read_name(d)) != NULL) {
        if (!g_str_has_prefix(entry, prefix))
            continue;
        g_autofree char *path = g_build_filename(images_dir, entry, NULL);
        vm_remove_tree(path, NULL);
    }
}

/* One mutex per image directory, for threads of this process; never freed. */
static GMutex *
image_thread_lock(const char *dir)
{
    static GMutex table_lock;
    static GHashTable *table;

    g_mutex_lock(&table_lock);
    if (table == NULL)
        table = g_hash_table_new(g_str_hash, g_str_equal);
    GMutex *mutex = g_hash_table_lookup(table, dir);
    if (mutex == NULL) {
        mutex = g_new0(GMutex, 1);
        g_mutex_init(mutex);
        g_hash_table_insert(table, g_strdup(dir), mutex);
    }
    g_mutex_unlock(&table_lock);
    return mutex;
}

/* Serialises with other processes (e.g. a test run next to hostd) on <images_dir>/.<name>.lock.
 * Returns the locked fd, or -1 with an error. */
static int
image_process_lock(const char *images_dir, const char *name, GCancellable *cancellable,
                   GError **error)
{
    g_autofree char *path = g_strdup_printf("%s/.%s.lock", images_dir, name);
    vm_autofd fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);

    if (fd < 0) {
        vm_throw_errno(error, errno, "opening %s", path);
        return -1;
    }
    while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            vm_throw_errno(error, errno, "locking %s", path);
            return -1;
        }
        if (g_cancellable_is_cancelled(cancellable)) {
            vm_throw(error, VM_ERROR_CANCELLED, "cancelled while waiting for %s", path);
            return -1;
        }
        g_usleep(LOCK_POLL_US);
    }
    int ret = fd;
    fd = -1;
    return ret;
}

static VmImage *
image_make(const char *images_dir, const VmTemplate *template_, const char *dir,
           VmProgressFunc progress, gpointer progress_data, GCancellable *cancellable,
           GError **error)
{
    g_autofree char *work_dir = g_strdup_printf("%s.tmp-XXXXXX", dir);
    g_autofree char *sha256 = NULL;
    gboolean ok;

    image_remove_stale(images_dir, template_->name);
    if (g_mkdtemp_full(work_dir, 0755) == NULL) {
        vm_throw_errno(error, errno, "creating %s", work_dir);
        return NULL;
    }

    switch (template_->source) {
    case VM_IMAGE_SOURCE_MMDEBSTRAP:
        ok = image_build_mmdebstrap(template_, work_dir, progress, progress_data, cancellable,
                                    error);
        break;
    case VM_IMAGE_SOURCE_URL: {
        g_autofree char *part = g_strdup_printf("%s/%s.part", images_dir, template_->name);
        gboolean renamed = FALSE;
        g_autoptr(GError) local = NULL;
        ok = vm_image_download(template_, part, progress, progress_data, cancellable, error);
        if (ok && !image_adopt_download(part, work_dir, cancellable, &renamed, &local)) {
            /* Verified but unusable: fetching it again would not help. */
            if (g_error_matches(local, VM_ERROR, VM_ERROR_IMAGE))
                unlink(part);
            g_propagate_error(error, g_steal_pointer(&local));
            ok = FALSE;
        }
        if (ok && renamed)
            sha256 = g_ascii_strdown(template_->sha256, -1);
        break;
    }
    default:
        ok = vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "template '%s' has no image source",
                      template_->name);
        break;
    }

    if (ok)
        ok = image_write_ini(template_, work_dir, sha256, error) &&
             image_install(work_dir, dir, error);
    if (!ok) {
        vm_remove_tree(work_dir, NULL);
        return NULL;
    }

    VmImage *image = vm_image_lookup(images_dir, template_, error);
    if (image != NULL && progress != NULL) {
        g_autofree char *message = g_strdup_printf("image of %s ready", template_->name);
        progress(message, 1.0, progress_data);
    }
    return image;
}

VmImage *
vm_image_ensure(const char *images_dir, const VmTemplate *template_, gboolean force,
                VmProgressFunc progress, gpointer progress_data, GCancellable *cancellable,
                GError **error)
{
    g_autoptr(GError) local = NULL;

    g_return_val_if_fail(images_dir != NULL, NULL);
    g_return_val_if_fail(template_ != NULL, NULL);

    if (!image_check_name(template_->name, error))
        return NULL;
    if (g_mkdir_with_parents(images_dir, 0755) < 0) {
        vm_throw_errno(error, errno, "creating %s", images_dir);
        return NULL;
    }

    g_autofree char *dir = g_build_filename(images_dir, template_->name, NULL);
    GMutex *mutex = image_thread_lock(dir);
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(mutex);
    vm_autofd lock_fd = image_process_lock(images_dir, template_->name, cancellable, error);
    if (lock_fd < 0)
        return NULL;

    /* Checked under the lock: whoever held it before may just have made the image. */
    if (!force) {
        VmImage *image = vm_image_lookup(images_dir, template_, &local);
        if (image != NULL)
            return image;
        if (!g_error_matches(local, VM_ERROR, VM_ERROR_NOT_FOUND) &&
            !g_error_matches(local, VM_ERROR, VM_ERROR_IMAGE)) {
            g_propagate_error(error, g_steal_pointer(&local));
            return NULL;
        }
    }
    return image_make(images_dir, template_, dir, progress, progress_data, cancellable, error);
}
