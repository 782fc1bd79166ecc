/* Small helpers shared by hostd and vmctl. */
#pragma once

#include <glib.h>
#include <errno.h>
#include <unistd.h>

#include "vm-sockaddr.h"

G_BEGIN_DECLS

/* A file descriptor that closes itself (GLib 2.74 has no g_autofd). */
static inline void
vm_close_fdp(int *fdp)
{
    if (*fdp >= 0) {
        int saved = errno;
        close(*fdp);
        errno = saved;
    }
}
#define vm_autofd __attribute__((cleanup(vm_close_fdp))) int

/* Writes all @len bytes of @data to @fd (a file), retrying short writes and EINTR. Fails with
 * VM_ERROR_IO and the errno's text. */
gboolean vm_write_all(int fd, const void *data, gsize len, GError **error);

/* Writes @contents to @path atomically and durably: temp file in the same directory (removed
 * again on failure), fsync, rename, fsync of the directory. @mode applies to the new file. Fails
 * with VM_ERROR_IO; @path then holds what it held before, or, when only the directory's sync
 * failed, the new contents. Every file hostd's state lives in is written through here. */
gboolean vm_file_write_atomic(const char *path, const char *contents, gssize len, int mode,
                              GError **error);

/* Test seam for the disk-full and I/O-error tests: from now on, calls number @first to
 * @first + @count - 1 (counted from 1) of vm_file_write_atomic() write half their data and fail
 * with @errnum (ENOSPC, EIO), as a disk filling up would. @first 0 turns it off. Process-wide;
 * nothing but tests calls it. Can't fail. */
void vm_file_write_fault(guint first, guint count, int errnum);

/* How many times vm_file_write_atomic() was called since the last vm_file_write_fault(), so a
 * test can tell whether an operation reached the write it meant to fail. Can't fail. */
guint vm_file_write_calls(void);

/* Syncs the file or directory @path itself (its data, or its entries), so that what was written
 * there is on disk. Fails with VM_ERROR_IO. */
gboolean vm_file_sync(const char *path, GError **error);

/* Syncs the directory holding @path, so that an entry created, renamed or removed there is on
 * disk. Fails with VM_ERROR_IO. */
gboolean vm_file_sync_dir(const char *path, GError **error);

/* A copy of @text (NULL: "") made valid UTF-8 (g_utf8_make_valid()) and cut after the last whole
 * character that fits in @max_bytes. Newly allocated; can't fail. */
char *vm_utf8_cut(const char *text, gsize max_bytes);

/* Whether the JSON text @text (@len bytes) nests arrays and objects at most @max deep, counted as
 * a JSON reader counts (brackets inside strings, escapes included, do not count). json-glib's
 * parser recurses once per level with no limit of its own, so a few hundred thousand '[' from
 * untrusted input would overflow the stack: callers check this before parsing. Reads no more
 * than @len bytes; says nothing of whether the text is valid JSON. */
gboolean vm_json_depth_ok(const char *text, gsize len, guint max);

/* Parses a duration such as "90", "90s", "5m", "2h", "1d" into seconds. "never" is not accepted
 * here (callers handle it). Fails with VM_ERROR_INVALID_ARGUMENT. */
gboolean vm_duration_parse(const char *text, guint64 *ret_seconds, GError **error);

/* Formats a byte count as "1.5 GiB" (newly allocated): the one size format users see. Not
 * g_format_size(): it puts a no-break space before the unit, "bytes" for small counts, and the
 * locale's decimal mark, none of which suit a table or a log line. Can't fail. */
char *vm_format_bytes(guint64 bytes);

/* write(2) that never raises SIGPIPE: on a pipe whose reader is gone it fails with EPIPE
 * instead (sockets have send(MSG_NOSIGNAL) for that). Same return value and errno as write(). */
gssize vm_write_nosignal(int fd, const void *buf, gsize len);

/* Fills @ret with the Unix socket address of @path (a file system path, not an abstract name)
 * and @ret_len with its length, as bind() and connect() take them. Fails with
 * VM_ERROR_INVALID_ARGUMENT when @path is longer than the VM_UNIX_PATH_MAX bytes an address
 * holds. */
gboolean vm_unix_address(const char *path, struct sockaddr_un *ret, socklen_t *ret_len,
                         GError **error);

/* A stream connection to the Unix socket at @path, made as safely as root can make one to a
 * socket in a directory another user may write: the last component is opened without following
 * it (O_PATH|O_NOFOLLOW) and the connection goes to that very inode (through /proc/self/fd), so
 * nothing swapped in between the check and the connect is reached. Refused (VM_ERROR_FAILED,
 * nothing connected) when the last component is a symbolic link, not a socket, or has other
 * names (a hard link to someone else's socket). A socket bound there is one its directory's
 * writers made: what they reach anyway. @type_flags are or-ed into socket()'s type
 * (SOCK_NONBLOCK); the descriptor has O_CLOEXEC. Fails with VM_ERROR_IO when the socket cannot
 * be reached, VM_ERROR_INVALID_ARGUMENT for a path that is not absolute. Returns the caller's
 * descriptor. */
int vm_unix_connect_nofollow(const char *path, int type_flags, GError **error);

/* hostd's state directory when it runs as root (the system service), by default. */
#define VM_SYSTEM_STATE_DIR "/var/lib/hostd"

/* The default state directory: VM_SYSTEM_STATE_DIR for root, else $XDG_DATA_HOME/hostd. Newly
 * allocated; can't fail. */
char *vm_default_state_dir(void);

/* The default socket: $VMCTL_SOCKET when set, else <default state dir>/hostd.sock. Newly
 * allocated; can't fail. */
char *vm_default_socket_path(void);

/* Whether a program uses files from its source and build trees rather than its installed ones.
 * @override ($VM_USE_BUILD_TREE) decides when it is "1" (yes) or "0" (no); otherwise yes only
 * when @exe, the program's path, resolves (realpath(3)) to a file inside @build_dir. A build
 * directory that no longer exists, or an @exe that does not resolve, means no. Can't fail. */
gboolean vm_build_tree_decide(const char *override, const char *exe, const char *build_dir);

/* vm_build_tree_decide() for this process: $VM_USE_BUILD_TREE, /proc/self/exe and the build
 * directory this program was built in, the last two looked at once per process (the program's
 * file may be replaced while it runs). An installed program (meson install) is not inside its
 * build directory, so it uses only its installed files even while that tree exists. Can't fail. */
gboolean vm_use_build_tree(void);

/* Where a program of this project that hostd runs is: $@env_var when set and not empty, else
 * @build_path when vm_use_build_tree(), else @installed_path. An installed hostd (root) never
 * runs the build tree's programs, even while that tree exists: whoever can write it could put
 * anything there. Newly allocated; can't fail. */
char *vm_program_path(const char *env_var, const char *build_path, const char *installed_path);

/* The directory of the templates this program ships: <source tree>/templates when
 * vm_use_build_tree(), else the installed <datadir>/vmctl/templates. Newly allocated; can't
 * fail. */
char *vm_shipped_templates_dir(void);

/* Makes this process non-dumpable (PR_SET_DUMPABLE 0: no core dump, and no process without
 * CAP_SYS_PTRACE, not even one of its own uid, may ptrace it or open its /proc/PID/mem, environ
 * or fd) and sets RLIMIT_CORE to 0, soft and hard limit, so that a core dump of its memory, where
 * keys and secrets are, is never written. The limit is inherited by the programs it runs (QEMU
 * among them: its memory is the guest's); execve() makes a program dumpable again. hostd and each
 * of its workers call it first in main(). Can't fail (neither call can, for these arguments). */
void vm_process_undumpable(void);

/* Overwrites the NUL-terminated @text with zeros up to its NUL (explicit_bzero(): kept even when
 * the memory is freed next). NULL is fine. */
void vm_secret_wipe(char *text);

/* vm_secret_wipe() then g_free(): for strings that held a key or a secret's value. NULL is fine.
 * Not a GDestroyNotify by accident: pass it where a container frees such strings. */
void vm_secret_free(char *text);

G_END_DECLS
