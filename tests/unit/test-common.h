/* Fixtures shared by the unit tests: temporary directories, whole-file reads and writes, directory
 * listings and golden files. GLib and cmocka only, so that the tests of common/ link it too. Every
 * helper fails the running test (cmocka's fail_msg) instead of returning an error. */
#pragma once

#include <sys/types.h>

#include <glib.h>

G_BEGIN_DECLS

/* The state of tests whose whole fixture is one fresh temporary directory. */
typedef struct {
    char *dir;
} VmTestTmpDir;

/* Creates a fresh, empty directory under the system's temporary directory, named from @tmpl as
 * g_dir_make_tmp() does ("test-foo-XXXXXX"). Free with g_free() after vm_test_remove_tree(). */
char *vm_test_make_tmpdir(const char *tmpl);

/* Removes @path and everything below it, never following a symbolic link: a link is removed,
 * not what it points to. A missing @path is not an error. Returns FALSE, leaving what it could
 * not remove, when something stays. */
gboolean vm_test_remove_tree(const char *path);

/* cmocka setup and teardown for a VmTestTmpDir: a fresh directory named after the test program
 * per test, removed with everything in it afterwards. */
int vm_test_tmpdir_setup(void **state);
int vm_test_tmpdir_teardown(void **state);

/* The contents of @path, NUL-terminated. */
char *vm_test_read_file(const char *path);

/* Replaces @path with @contents (NUL-terminated). */
void vm_test_write_file(const char *path, const char *contents);

/* The permission bits of @path itself (a link is not followed). */
guint vm_test_file_mode(const char *path);

/* How many entries @dir holds, hidden ones included. */
guint vm_test_count_entries(const char *dir);

/* The names in @dir, sorted and joined with spaces; names starting with '.' only when
 * @with_hidden. */
char *vm_test_dir_listing(const char *dir, gboolean with_hidden);

/* Fails the running test unless @error is set, in @domain with @code, and (when @needle is not
 * NULL) its message contains @needle. */
void vm_test_assert_error(const GError *error, GQuark domain, int code, const char *needle);

/* Fails the running test, quoting the message, when @error is set. */
void vm_test_assert_no_error(const GError *error);

/* Fails the running test unless @a and @b are both NULL or equal strings. */
void vm_test_assert_nullable_string_equal(const char *a, const char *b);

/* Runs @program @arg with one end of a socketpair as its stdin and stdout, as QEMU runs a guest
 * forward's command, and waits for it to exit. Returns the other end and the exit status in
 * *@ret_status (-1 when it did not exit). Fails the running test when @program is not there. */
int vm_test_run_on_socketpair(const char *program, const char *arg, int *ret_status);

/* The value of @key in /proc/@pid/status, spaces around it stripped ("0 0 0 0" for Uid), newly
 * allocated; fails the running test when there is none. */
char *vm_test_proc_status(pid_t pid, const char *key);

/* The ids process @pid runs as, into *@ret_uid and *@ret_gid; fails the running test unless its
 * real, effective, saved and file system uid are one id, and its gids too. */
void vm_test_proc_ids(pid_t pid, guint *ret_uid, guint *ret_gid);

/* Starts `sleep 60` as uid and gid @id, no supplementary groups: a process as an agent's QEMU
 * is, dumpable (the exec after the change of ids makes it so again). The caller ends it with
 * vm_test_sleeper_stop(). */
GPid vm_test_sleeper_start(guint id);
void vm_test_sleeper_stop(GPid pid);

/* In a child process that runs as @uid and @gid (no supplementary groups): open(@path, @flags),
 * or, with @path NULL, kill(@pid, 0). 0 when it succeeded, else its errno. Needs root. */
int vm_test_try_as(guint uid, guint gid, const char *path, int flags, pid_t pid);

/* Fails the running test unless process @pid can write no core file (RLIMIT_CORE 0, soft and
 * hard, in /proc/@pid/limits) and is not dumpable: when its effective uid is not root, its
 * /proc/@pid/environ belongs to root (the kernel's mark of a non-dumpable process; a dumpable
 * one's belongs to its uid); as root, a child of the test without CAP_SYS_PTRACE is refused
 * kcmp(2) with it while it is allowed kcmp with the test itself (the same uid, dumpable). */
void vm_test_assert_undumpable(pid_t pid);

/* Fails the running test unless process @pid's stdout and stderr are one pipe, not the test's own
 * stderr: what a worker prints reaches hostd's log only through hostd_log_worker_output(). */
void vm_test_assert_output_piped(pid_t pid);

/* Fails the running test unless process @pid is gone within @timeout_ms, or a zombie waiting for
 * init (killed and reparented away from the test). */
void vm_test_assert_process_gone(pid_t pid, guint timeout_ms);

/* The path of @first and the further elements (NULL-terminated) below the tests' data,
 * $VM_TEST_DATA (else tests/data). Newly allocated. */
char *vm_test_data_path(const char *first, ...) G_GNUC_NULL_TERMINATED;

/* The key in tests/data/ssh-keys/@name, without the spaces and newline around it. */
char *vm_test_ssh_key_line(const char *name);

/* Compares @actual with the golden file @name in $VM_TEST_GOLDEN (else tests/golden under
 * $VM_SOURCE_DIR or "."), naming the first line that differs; with VIR_TEST_REGENERATE_OUTPUT=1
 * rewrites the file with @actual instead. */
void vm_test_assert_golden(const char *name, const char *actual);

/* Fails the running test unless process @pid (a worker) holds at least one TCP socket and each
 * is an established connection to port @port whose owner is the test's own uid, hostd's (hostd
 * made it and handed it over; a socket the worker made would be its uid's). With @strict every
 * other socket it holds must be a Unix socket without a name (channels handed over). */
void vm_test_assert_tcp_made_by_caller(pid_t pid, guint port, gboolean strict);

G_END_DECLS
