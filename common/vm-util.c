#include "vm-util.h"

#include "vm-config.h"
#include "vm-error.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

/* Durations beyond this would overflow a gint64 count of microseconds, which is what GLib's
 * clocks and timeouts use. */
#define VM_DURATION_MAX ((guint64)(G_MAXINT64 / G_USEC_PER_SEC))

/* The failure vm_file_write_fault() injects: calls number fault_first to fault_last (counted
 * from 1 since it was set) fail with fault_errno. */
G_LOCK_DEFINE_STATIC(fault);
static guint fault_calls, fault_first, fault_last;
static int fault_errno;

void
vm_file_write_fault(guint first, guint count, int errnum)
{
    G_LOCK(fault);
    fault_calls = 0;
    fault_first = first;
    fault_last = count > 0 && first > 0 ? first + count - 1 : 0;
    fault_errno = errnum;
    G_UNLOCK(fault);
}

guint
vm_file_write_calls(void)
{
    G_LOCK(fault);
    guint calls = fault_calls;
    G_UNLOCK(fault);
    return calls;
}

/* 0, or the errno this call of vm_file_write_atomic() is to fail with. */
static int
vm_file_write_injected(void)
{
    G_LOCK(fault);
    fault_calls++;
    int injected = fault_first > 0 && fault_calls >= fault_first && fault_calls <= fault_last
                       ? fault_errno
                       : 0;
    G_UNLOCK(fault);
    return injected;
}

/* Writes @len bytes to @fd; with @injected, half of them and then fails with that errno, as a
 * disk filling up halfway would. Sets errno on failure. */
static gboolean
vm_file_write_all(int fd, const char *data, gsize len, int injected)
{
    gsize limit = injected != 0 ? len / 2 : len;
    gsize done = 0;

    while (done < limit) {
        gssize n = write(fd, data + done, limit - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return FALSE;
        done += (gsize)n;
    }
    if (injected != 0) {
        errno = injected;
        return FALSE;
    }
    return TRUE;
}

gboolean
vm_write_all(int fd, const void *data, gsize len, GError **error)
{
    if (!vm_file_write_all(fd, data, len, 0))
        return vm_throw_errno(error, errno, "cannot write");
    return TRUE;
}

gboolean
vm_file_write_atomic(const char *path, const char *contents, gssize len, int mode, GError **error)
{
    g_return_val_if_fail(path != NULL, FALSE);
    g_return_val_if_fail(contents != NULL || len == 0, FALSE);

    gsize size = len < 0 ? strlen(contents) : (gsize)len;
    int injected = vm_file_write_injected();
    g_autofree char *tmp = g_strdup_printf("%s.XXXXXX", path);
    vm_autofd fd = g_mkstemp_full(tmp, O_WRONLY | O_CLOEXEC, mode);
    int saved;

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot create a file next to '%s'", path);
    /* The data is on disk before the name points at it, and the name before success is told:
     * a crash or a full disk at any step leaves the old file or the new one, never a part. */
    if (!vm_file_write_all(fd, contents != NULL ? contents : "", size, injected)) {
        saved = errno;
        unlink(tmp);
        return vm_throw_errno(error, saved, "cannot write '%s'", path);
    }
    if (fsync(fd) < 0 || close(g_steal_fd(&fd)) < 0) {
        saved = errno;
        unlink(tmp);
        return vm_throw_errno(error, saved, "cannot write '%s'", path);
    }
    if (rename(tmp, path) < 0) {
        saved = errno;
        unlink(tmp);
        return vm_throw_errno(error, saved, "cannot replace '%s'", path);
    }
    /* The rename is only durable once the directory entry is on disk too. */
    return vm_file_sync_dir(path, error);
}

gboolean
vm_file_sync(const char *path, GError **error)
{
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot open '%s'", path);
    if (fsync(fd) < 0)
        return vm_throw_errno(error, errno, "cannot sync '%s'", path);
    return TRUE;
}

gboolean
vm_file_sync_dir(const char *path, GError **error)
{
    g_autofree char *dir = g_path_get_dirname(path);
    vm_autofd dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (dir_fd < 0)
        return vm_throw_errno(error, errno, "cannot open directory '%s'", dir);
    if (fsync(dir_fd) < 0)
        return vm_throw_errno(error, errno, "cannot sync directory '%s'", dir);
    return TRUE;
}

char *
vm_utf8_cut(const char *text, gsize max_bytes)
{
    g_autofree char *valid = g_utf8_make_valid(text != NULL ? text : "", -1);
    const char *end = valid;

    if (strlen(valid) <= max_bytes)
        return g_steal_pointer(&valid);
    while (*end != '\0') {
        const char *next = g_utf8_next_char(end);

        if ((gsize)(next - valid) > max_bytes)
            break;
        end = next;
    }
    return g_strndup(valid, end - valid);
}

static guint64
vm_duration_unit(char suffix)
{
    switch (suffix) {
    case '\0':
    case 's':
        return 1;
    case 'm':
        return 60;
    case 'h':
        return 60 * 60;
    case 'd':
        return 24 * 60 * 60;
    default:
        return 0;
    }
}

gboolean
vm_duration_parse(const char *text, guint64 *ret_seconds, GError **error)
{
    g_autofree char *shown = NULL;
    guint64 value = 0;
    guint64 unit;
    const char *p;

    if (text == NULL || text[0] == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "duration is empty");

    shown = g_strescape(text, NULL);
    if (!g_ascii_isdigit(text[0]))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid duration '%s': expected a number with an optional unit s, m, h "
                        "or d",
                        shown);
    for (p = text; g_ascii_isdigit(*p); p++) {
        guint digit = *p - '0';

        if (value > (VM_DURATION_MAX - digit) / 10)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "duration '%s' is too large", shown);
        value = value * 10 + digit;
    }
    unit = vm_duration_unit(*p);
    if (unit == 0 || (*p != '\0' && p[1] != '\0'))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid duration '%s': expected a number with an optional unit s, m, h "
                        "or d",
                        shown);
    if (value > VM_DURATION_MAX / unit)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "duration '%s' is too large", shown);

    if (ret_seconds != NULL)
        *ret_seconds = value * unit;
    return TRUE;
}

char *
vm_format_bytes(guint64 bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    gsize i = 0;
    double value;

    if (bytes < 1024)
        return g_strdup_printf("%" G_GUINT64_FORMAT " B", bytes);

    value = (double)bytes;
    /* Move up while the value, rounded to one decimal, would print as 1024 or more. */
    while (i + 1 < G_N_ELEMENTS(units) && value >= 1023.95) {
        value /= 1024.0;
        i++;
    }
    g_ascii_formatd(buf, sizeof(buf), "%.1f", value);
    if (g_str_has_suffix(buf, ".0"))
        buf[strlen(buf) - 2] = '\0';
    return g_strdup_printf("%s %s", buf, units[i]);
}

gssize
vm_write_nosignal(int fd, const void *buf, gsize len)
{
    sigset_t pipe_set, old_set, pending;
    gboolean was_pending;
    gssize n;
    int saved;

    /* Hold SIGPIPE blocked over the write and swallow the one it caused, unless one was already
     * pending for someone else. */
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    sigpending(&pending);
    was_pending = sigismember(&pending, SIGPIPE);

    n = write(fd, buf, len);
    saved = errno;

    if (n < 0 && saved == EPIPE && !was_pending) {
        const struct timespec zero = {0, 0};

        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &old_set, NULL);
    errno = saved;
    return n;
}

gboolean
vm_unix_address(const char *path, struct sockaddr_un *ret, socklen_t *ret_len, GError **error)
{
    g_return_val_if_fail(path != NULL, FALSE);
    g_return_val_if_fail(ret != NULL && ret_len != NULL, FALSE);

    if (vm_sockaddr_un_fill(path, ret, ret_len) < 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "socket path is too long (at most %zu bytes): %s", VM_UNIX_PATH_MAX, path);
    return TRUE;
}

int
vm_unix_connect_nofollow(const char *path, int type_flags, GError **error)
{
    g_autofree char *dir = NULL;
    g_autofree char *base = NULL;
    char proc_path[64];
    struct sockaddr_un addr;
    socklen_t addr_len;
    struct stat st;
    vm_autofd dir_fd = -1;
    vm_autofd node = -1;
    vm_autofd fd = -1;

    g_return_val_if_fail(path != NULL, -1);

    if (!g_path_is_absolute(path))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "socket path is not absolute: %s", path),
               -1;
    dir = g_path_get_dirname(path);
    base = g_path_get_basename(path);
    dir_fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir_fd < 0)
        return vm_throw_errno(error, errno, "cannot open the directory of socket %s", path), -1;
    /* Not followed: a symbolic link is opened as itself and refused below. */
    node = openat(dir_fd, base, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (node < 0 || fstat(node, &st) < 0)
        return vm_throw_errno(error, errno, "cannot reach socket %s", path), -1;
    if (S_ISLNK(st.st_mode))
        return vm_throw(error, VM_ERROR_FAILED,
                        "refused to connect to %s: it is a symbolic link, not the socket", path),
               -1;
    if (!S_ISSOCK(st.st_mode))
        return vm_throw(error, VM_ERROR_FAILED, "refused to connect to %s: not a socket", path), -1;
    if (st.st_nlink != 1)
        return vm_throw(error, VM_ERROR_FAILED,
                        "refused to connect to %s: the socket has other names (hard links)", path),
               -1;
    /* The magic link names the inode opened above, whatever the directory holds now. */
    g_snprintf(proc_path, sizeof(proc_path), "/proc/self/fd/%d", node);
    if (!vm_unix_address(proc_path, &addr, &addr_len, error))
        return -1;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, addr_len) < 0)
        return vm_throw_errno(error, errno, "cannot connect to %s", path), -1;
    return g_steal_fd(&fd);
}

char *
vm_default_state_dir(void)
{
    if (geteuid() == 0)
        return g_strdup(VM_SYSTEM_STATE_DIR);
    return g_build_filename(g_get_user_data_dir(), "hostd", NULL);
}

char *
vm_default_socket_path(void)
{
    g_autofree char *state_dir = NULL;
    const char *env = g_getenv("VMCTL_SOCKET");

    if (env != NULL && env[0] != '\0')
        return g_strdup(env);
    state_dir = vm_default_state_dir();
    return g_build_filename(state_dir, "hostd.sock", NULL);
}

gboolean
vm_build_tree_decide(const char *override, const char *exe, const char *build_dir)
{
    char exe_real[PATH_MAX], build_real[PATH_MAX];

    if (g_strcmp0(override, "1") == 0)
        return TRUE;
    if (g_strcmp0(override, "0") == 0)
        return FALSE;
    if (exe == NULL || build_dir == NULL || realpath(exe, exe_real) == NULL ||
        realpath(build_dir, build_real) == NULL)
        return FALSE;
    /* "/" as the build directory would take in every program: not a build tree. */
    if (strcmp(build_real, "/") == 0)
        return FALSE;
    gsize len = strlen(build_real);
    return strncmp(exe_real, build_real, len) == 0 && exe_real[len] == '/';
}

gboolean
vm_use_build_tree(void)
{
    static gsize from_exe = 0; /* 0: not decided yet, 1: no, 2: yes */
    const char *override = g_getenv("VM_USE_BUILD_TREE");

    if (g_strcmp0(override, "1") == 0 || g_strcmp0(override, "0") == 0)
        return vm_build_tree_decide(override, NULL, NULL);
    /* Once per process: where this program was started from does not change, but its file may
     * be replaced while it runs (a rebuild, a package upgrade), and /proc/self/exe then names a
     * deleted file. */
    if (g_once_init_enter(&from_exe)) {
        gboolean inside = vm_build_tree_decide(NULL, "/proc/self/exe", VM_BUILD_ROOT);
        g_once_init_leave(&from_exe, inside ? 2 : 1);
    }
    return from_exe == 2;
}

char *
vm_program_path(const char *env_var, const char *build_path, const char *installed_path)
{
    const char *env = g_getenv(env_var);

    if (env != NULL && env[0] != '\0')
        return g_strdup(env);
    return g_strdup(vm_use_build_tree() ? build_path : installed_path);
}

char *
vm_shipped_templates_dir(void)
{
    if (vm_use_build_tree())
        return g_build_filename(VM_SOURCE_DIR, "templates", NULL);
    return g_build_filename(VM_DATADIR, "templates", NULL);
}

gboolean
vm_json_depth_ok(const char *text, gsize len, guint max)
{
    gboolean in_string = FALSE, escaped = FALSE;
    guint depth = 0;

    for (gsize i = 0; i < len; i++) {
        char c = text[i];

        if (in_string) {
            if (escaped)
                escaped = FALSE;
            else if (c == '\\')
                escaped = TRUE;
            else if (c == '"')
                in_string = FALSE;
        } else if (c == '"') {
            in_string = TRUE;
        } else if (c == '[' || c == '{') {
            if (++depth > max)
                return FALSE;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return TRUE;
}

void
vm_process_undumpable(void)
{
    const struct rlimit none = {0, 0};

    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    (void)setrlimit(RLIMIT_CORE, &none);
}

void
vm_secret_wipe(char *text)
{
    if (text != NULL)
        explicit_bzero(text, strlen(text));
}

void
vm_secret_free(char *text)
{
    vm_secret_wipe(text);
    g_free(text);
}
