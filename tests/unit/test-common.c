/* Fixtures shared by the unit tests; see test-common.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/kcmp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "test-common.h"

char *
vm_test_make_tmpdir(const char *tmpl)
{
    g_autoptr(GError) error = NULL;
    char *dir = g_dir_make_tmp(tmpl, &error);

    if (dir == NULL)
        fail_msg("cannot make a temporary directory: %s", error->message);
    return dir;
}

gboolean
vm_test_remove_tree(const char *path)
{
    GStatBuf st;

    if (g_lstat(path, &st) < 0)
        return errno == ENOENT;
    if (S_ISDIR(st.st_mode)) {
        g_autoptr(GDir) dir = g_dir_open(path, 0, NULL);
        const char *name;

        while (dir != NULL && (name = g_dir_read_name(dir)) != NULL) {
            g_autofree char *child = g_build_filename(path, name, NULL);
            vm_test_remove_tree(child);
        }
    }
    return g_remove(path) == 0;
}

int
vm_test_tmpdir_setup(void **state)
{
    VmTestTmpDir *t = g_new0(VmTestTmpDir, 1);
    g_autofree char *tmpl = g_strdup_printf("%s-XXXXXX", program_invocation_short_name);

    t->dir = vm_test_make_tmpdir(tmpl);
    *state = t;
    return 0;
}

int
vm_test_tmpdir_teardown(void **state)
{
    VmTestTmpDir *t = *state;

    vm_test_remove_tree(t->dir);
    g_free(t->dir);
    g_free(t);
    return 0;
}

char *
vm_test_read_file(const char *path)
{
    g_autoptr(GError) error = NULL;
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, &error))
        fail_msg("cannot read %s: %s", path, error->message);
    return text;
}

void
vm_test_write_file(const char *path, const char *contents)
{
    g_autoptr(GError) error = NULL;

    if (!g_file_set_contents(path, contents, -1, &error))
        fail_msg("cannot write %s: %s", path, error->message);
}

guint
vm_test_file_mode(const char *path)
{
    GStatBuf st;

    if (g_lstat(path, &st) < 0)
        fail_msg("cannot stat %s: %s", path, g_strerror(errno));
    return st.st_mode & 07777;
}

guint
vm_test_count_entries(const char *dir)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    guint n = 0;

    if (d == NULL)
        fail_msg("cannot open %s", dir);
    while (g_dir_read_name(d) != NULL)
        n++;
    return n;
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char *
vm_test_dir_listing(const char *dir, gboolean with_hidden)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    const char *entry;

    if (d == NULL)
        fail_msg("cannot open %s", dir);
    while ((entry = g_dir_read_name(d)) != NULL) {
        if (with_hidden || entry[0] != '.')
            g_ptr_array_add(names, g_strdup(entry));
    }
    g_ptr_array_sort(names, compare_names);
    g_ptr_array_add(names, NULL);
    return g_strjoinv(" ", (char **)names->pdata);
}

void
vm_test_assert_error(const GError *error, GQuark domain, int code, const char *needle)
{
    if (error == NULL)
        fail_msg("expected error %s/%d, got success", g_quark_to_string(domain), code);
    if (!g_error_matches(error, domain, code))
        fail_msg("expected error %s/%d, got %s/%d: %s", g_quark_to_string(domain), code,
                 g_quark_to_string(error->domain), error->code, error->message);
    if (needle != NULL && strstr(error->message, needle) == NULL)
        fail_msg("error message '%s' does not mention '%s'", error->message, needle);
}

void
vm_test_assert_no_error(const GError *error)
{
    if (error != NULL)
        fail_msg("unexpected error: %s", error->message);
}

void
vm_test_assert_nullable_string_equal(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        assert_ptr_equal(a, b);
    else
        assert_string_equal(a, b);
}

char *
vm_test_proc_status(pid_t pid, const char *key)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/status", (int)pid);
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;
    g_autofree char *prefix = g_strconcat(key, ":", NULL);

    if (!g_file_get_contents(path, &text, NULL, NULL))
        fail_msg("cannot read %s", path);
    lines = g_strsplit(text, "\n", 0);
    for (char **line = lines; *line != NULL; line++) {
        if (g_str_has_prefix(*line, prefix))
            return g_strstrip(g_strdup(*line + strlen(prefix)));
    }
    fail_msg("no %s in %s", key, path);
    return NULL;
}

/* In a child of the test: 0 when, with CAP_SYS_PTRACE out of its effective set (its permitted set
 * kept, so that the kernel's capability subset rule does not decide), kcmp(2) of its memory with
 * process @pid's is refused while kcmp with the test's own (the same uid, dumpable) is not:
 * the kernel refuses a process that is not dumpable to whoever lacks CAP_SYS_PTRACE. */
static int
undumpable_child(pid_t pid)
{
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2] = {{0}};

    if (syscall(SYS_capget, &header, data) < 0)
        return 3;
    data[CAP_TO_INDEX(CAP_SYS_PTRACE)].effective &= ~CAP_TO_MASK(CAP_SYS_PTRACE);
    if (syscall(SYS_capset, &header, data) < 0)
        return 3;
    if (syscall(SYS_kcmp, getpid(), getppid(), KCMP_VM, 0, 0) < 0)
        return 2; /* the check could not tell anything */
    if (syscall(SYS_kcmp, getpid(), pid, KCMP_VM, 0, 0) >= 0)
        return 1;
    return errno == EPERM ? 0 : 4;
}

void
vm_test_assert_undumpable(pid_t pid)
{
    g_autofree char *limits_path = g_strdup_printf("/proc/%d/limits", (int)pid);
    g_autofree char *limits = NULL;
    g_autofree char *uid = vm_test_proc_status(pid, "Uid");
    g_auto(GStrv) uids = g_regex_split_simple("\\s+", uid, 0, 0);
    const char *line;
    guint64 soft = 1, hard = 1;

    if (!g_file_get_contents(limits_path, &limits, NULL, NULL))
        fail_msg("cannot read %s", limits_path);
    line = strstr(limits, "Max core file size");
    if (line == NULL ||
        sscanf(line, "Max core file size %" G_GUINT64_FORMAT " %" G_GUINT64_FORMAT, &soft, &hard) !=
            2 ||
        soft != 0 || hard != 0)
        fail_msg("process %d may write a core file: %.80s", (int)pid, line ? line : "(no line)");

    if (strcmp(uids[1], "0") != 0) {
        g_autofree char *environ_path = g_strdup_printf("/proc/%d/environ", (int)pid);
        struct stat st;

        assert_int_equal(stat(environ_path, &st), 0);
        if (st.st_uid != 0)
            fail_msg("process %d (euid %s) is dumpable: %s belongs to %u", (int)pid, uids[1],
                     environ_path, (guint)st.st_uid);
        return;
    }
    pid_t child = fork();
    int status = 0;

    assert_true(child >= 0);
    if (child == 0)
        _exit(undumpable_child(pid));
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("process %d is dumpable (check %d)", (int)pid, WEXITSTATUS(status));
}

void
vm_test_assert_output_piped(pid_t pid)
{
    g_autofree char *out_path = g_strdup_printf("/proc/%d/fd/1", (int)pid);
    g_autofree char *err_path = g_strdup_printf("/proc/%d/fd/2", (int)pid);
    g_autofree char *out = g_file_read_link(out_path, NULL);
    g_autofree char *err = g_file_read_link(err_path, NULL);
    g_autofree char *own = g_file_read_link("/proc/self/fd/2", NULL);

    if (out == NULL || err == NULL)
        fail_msg("cannot read %s or %s", out_path, err_path);
    if (!g_str_has_prefix(err, "pipe:") || g_strcmp0(out, err) != 0 || g_strcmp0(err, own) == 0)
        fail_msg("process %d: stdout %s, stderr %s (the test's: %s)", (int)pid, out, err, own);
}

void
vm_test_proc_ids(pid_t pid, guint *ret_uid, guint *ret_gid)
{
    static const char *const keys[] = {"Uid", "Gid"};
    guint *ret[] = {ret_uid, ret_gid};

    for (guint k = 0; k < G_N_ELEMENTS(keys); k++) {
        g_autofree char *text = vm_test_proc_status(pid, keys[k]);
        g_auto(GStrv) ids = g_regex_split_simple("\\s+", text, 0, 0);
        if (g_strv_length(ids) != 4)
            fail_msg("%s of %d: '%s'", keys[k], (int)pid, text);
        for (guint i = 1; i < 4; i++) {
            if (!g_str_equal(ids[i], ids[0]))
                fail_msg("%s of %d is not one id: '%s'", keys[k], (int)pid, text);
        }
        *ret[k] = (guint)g_ascii_strtoull(ids[0], NULL, 10);
    }
}

static void
sleeper_setup(gpointer data)
{
    guint id = GPOINTER_TO_UINT(data);

    if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
        _exit(127);
}

GPid
vm_test_sleeper_start(guint id)
{
    const char *argv[] = {"sleep", "60", NULL};
    g_autoptr(GError) error = NULL;
    GPid pid = 0;

    if (!g_spawn_async("/", (char **)argv, NULL,
                       G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD |
                           G_SPAWN_STDOUT_TO_DEV_NULL | G_SPAWN_STDERR_TO_DEV_NULL,
                       sleeper_setup, GUINT_TO_POINTER(id), &pid, &error))
        fail_msg("cannot run sleep as %u: %s", id, error->message);
    /* Until it has exec'd, it is the test's copy and not yet dumpable. */
    for (guint i = 0; i < 500; i++) {
        g_autofree char *exe = g_strdup_printf("/proc/%d/comm", (int)pid);
        g_autofree char *comm = NULL;
        if (g_file_get_contents(exe, &comm, NULL, NULL) && g_str_has_prefix(comm, "sleep"))
            return pid;
        g_usleep(10 * 1000);
    }
    fail_msg("sleep as %u did not start", id);
    return 0;
}

void
vm_test_sleeper_stop(GPid pid)
{
    (void)kill(pid, SIGKILL);
    (void)waitpid(pid, NULL, 0);
}

int
vm_test_try_as(guint uid, guint gid, const char *path, int flags, pid_t pid)
{
    int status = 0;
    pid_t child = fork();

    if (child < 0)
        fail_msg("fork: %s", g_strerror(errno));
    if (child == 0) {
        /* Only system calls from here: the test may have threads. */
        int rc;
        if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
            _exit(255);
        if (path != NULL)
            rc = open(path, flags | O_CLOEXEC);
        else
            rc = kill(pid, 0);
        _exit(rc < 0 ? (errno > 0 && errno < 255 ? errno : 254) : 0);
    }
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            fail_msg("waitpid: %s", g_strerror(errno));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) == 255)
        fail_msg("could not run as %u:%u", uid, gid);
    return WEXITSTATUS(status);
}

void
vm_test_assert_process_gone(pid_t pid, guint timeout_ms)
{
    g_autofree char *stat_path = g_strdup_printf("/proc/%d/stat", (int)pid);

    for (guint waited_ms = 0; waited_ms < timeout_ms; waited_ms += 20) {
        g_autofree char *stat = NULL;
        if (!g_file_get_contents(stat_path, &stat, NULL, NULL))
            return;
        const char *close_paren = strrchr(stat, ')');
        if (close_paren != NULL && close_paren[1] == ' ' && close_paren[2] == 'Z')
            return;
        g_usleep(20 * 1000);
    }
    fail_msg("process %d still runs after %u ms", (int)pid, timeout_ms);
}

char *
vm_test_data_path(const char *first, ...)
{
    const char *dir = g_getenv("VM_TEST_DATA");
    g_autofree char *below = NULL;
    va_list ap;

    va_start(ap, first);
    below = g_build_filename_valist(first, &ap);
    va_end(ap);
    return g_build_filename(dir != NULL && dir[0] != '\0' ? dir : "tests/data", below, NULL);
}

void
vm_test_assert_golden(const char *name, const char *actual)
{
    const char *dir = g_getenv("VM_TEST_GOLDEN");
    const char *source = g_getenv("VM_SOURCE_DIR");
    g_autofree char *path = dir != NULL ? g_build_filename(dir, name, NULL)
                                        : g_build_filename(source != NULL ? source : ".", "tests",
                                                           "golden", name, NULL);
    g_autofree char *expected = NULL;
    g_autoptr(GError) error = NULL;

    if (g_strcmp0(g_getenv("VIR_TEST_REGENERATE_OUTPUT"), "1") == 0) {
        if (!g_file_set_contents(path, actual, -1, &error))
            fail_msg("cannot write %s: %s", path, error->message);
        return;
    }
    if (!g_file_get_contents(path, &expected, NULL, &error))
        fail_msg("cannot read %s: %s (VIR_TEST_REGENERATE_OUTPUT=1 writes it)", path,
                 error->message);
    if (strcmp(expected, actual) != 0) {
        g_auto(GStrv) want = g_strsplit(expected, "\n", -1);
        g_auto(GStrv) got = g_strsplit(actual, "\n", -1);
        guint i = 0;

        while (want[i] != NULL && got[i] != NULL && strcmp(want[i], got[i]) == 0)
            i++;
        fail_msg("%s differs at line %u:\n  expected: %s\n  actual:   %s\n"
                 "(VIR_TEST_REGENERATE_OUTPUT=1 rewrites it)",
                 path, i + 1, want[i] != NULL ? want[i] : "<end>",
                 got[i] != NULL ? got[i] : "<end>");
    }
}

/* The fields of the line for socket @inode in /proc/net/@table (inode in field @inode_field),
 * NULL when it has none. */
static GStrv
proc_net_socket(const char *table, guint inode_field, const char *inode)
{
    g_autofree char *path = g_strdup_printf("/proc/net/%s", table);
    g_autofree char *contents = NULL;
    g_auto(GStrv) lines = NULL;

    assert_true(g_file_get_contents(path, &contents, NULL, NULL));
    lines = g_strsplit(contents, "\n", -1);
    for (char **line = lines + 1; *line != NULL; line++) {
        g_auto(GStrv) fields = g_regex_split_simple("\\s+", g_strstrip(*line), 0, 0);

        if (g_strv_length(fields) > inode_field && g_str_equal(fields[inode_field], inode))
            return g_steal_pointer(&fields);
    }
    return NULL;
}

void
vm_test_assert_tcp_made_by_caller(pid_t pid, guint port, gboolean strict)
{
    g_autofree char *dir_path = g_strdup_printf("/proc/%d/fd", (int)pid);
    g_autoptr(GDir) dir = g_dir_open(dir_path, 0, NULL);
    g_autofree char *port_hex = g_strdup_printf(":%04X", port);
    g_autofree char *own_uid = g_strdup_printf("%u", (guint)geteuid());
    guint tcp = 0;
    const char *name;

    assert_non_null(dir);
    while ((name = g_dir_read_name(dir)) != NULL) {
        g_autofree char *fd_path = g_build_filename(dir_path, name, NULL);
        g_autofree char *target = g_file_read_link(fd_path, NULL);
        g_autofree char *inode = NULL;
        g_auto(GStrv) unix_line = NULL;
        g_auto(GStrv) tcp_line = NULL;

        if (target == NULL || !g_str_has_prefix(target, "socket:["))
            continue;
        inode = g_strndup(target + 8, strlen(target) - 9);
        if (strict) {
            unix_line = proc_net_socket("unix", 6, inode);
            if (unix_line != NULL) {
                assert_true(g_strv_length(unix_line) == 7);
                continue;
            }
        }
        tcp_line = proc_net_socket("tcp", 9, inode);
        if (tcp_line == NULL)
            tcp_line = proc_net_socket("tcp6", 9, inode);
        if (tcp_line == NULL) {
            if (strict)
                fail_msg("process %d holds socket %s, neither Unix nor TCP", (int)pid, inode);
            continue;
        }
        assert_true(g_str_has_suffix(tcp_line[2], port_hex));
        assert_string_equal(tcp_line[3], "01"); /* ESTABLISHED */
        assert_string_equal(tcp_line[7], own_uid);
        tcp++;
    }
    assert_true(tcp >= 1);
}

int
vm_test_run_on_socketpair(const char *program, const char *arg, int *ret_status)
{
    int sv[2], status = -1;
    pid_t pid;

    if (!g_file_test(program, G_FILE_TEST_IS_EXECUTABLE))
        fail_msg("no program at %s (set VM_BUILD_DIR)", program);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(sv[1], 0);
        dup2(sv[1], 1);
        execl(program, program, arg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *ret_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return sv[0];
}

char *
vm_test_ssh_key_line(const char *name)
{
    g_autofree char *path = vm_test_data_path("ssh-keys", name, NULL);
    g_autofree char *text = vm_test_read_file(path);

    return g_strdup(g_strstrip(text));
}
