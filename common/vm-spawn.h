/* Running helper programs (qemu-img, genisoimage, ...): the one runner of hostd and its
 * libraries. */
#pragma once

#include <gio/gio.h>
#include <sys/types.h>

G_BEGIN_DECLS

/* Bytes of a program's stderr kept for the error message; the rest is read and dropped. */
#define VM_SPAWN_STDERR_MAX 4096

/* What vm_spawn_run() does besides running the program. Zero-initialised, or a NULL pointer,
 * means: stdin from /dev/null, no time limit, not cancellable. */
typedef struct {
    GBytes *input;             /* written to the program's stdin, which is then closed */
    guint timeout_ms;          /* 0: no limit */
    GCancellable *cancellable; /* NULL: not cancellable */
    gsize stdout_max;          /* 0: unbounded; past it the program is killed (VM_ERROR_IO) */
    gsize *ret_stdout_len;     /* with ret_stdout: set to its length (it may hold NUL bytes) */
    int stdout_fd;             /* > 0 (and ret_stdout NULL): the program's stdout is this
                                * descriptor, e.g. a file hostd opened; 0: not given */
    gboolean run_as;           /* the program runs as @uid and @gid, with no supplementary group
                                * and no_new_privs, set before it starts (hostd must be root) */
    uid_t uid;
    gid_t gid;
    gboolean exit_is_code; /* a program of this project: an exit status from 1 to
                            * VM_ERROR_LAST is the VmErrorCode of its failure, and its
                            * stderr the message alone */
} VmSpawnOptions;

/* Runs @argv (argv[0] looked up in PATH, the environment inherited) to completion in a process
 * group of its own, and returns TRUE when it exits with status 0. With @ret_stdout non-NULL, what
 * it wrote on stdout is returned there (newly allocated, NUL-terminated, not bounded: for
 * programs whose output hostd reads), else stdout goes to /dev/null. @options may be NULL.
 * Fails with
 * - VM_ERROR_IO "cannot run <argv[0]>: <why>" when the program cannot be started;
 * - VM_ERROR_IO "<argv[0]> failed: <stderr>" on a non-zero exit or a signal, with the first
 *   VM_SPAWN_STDERR_MAX bytes of its stderr stripped (how it ended when stderr is empty); with
 *   @options->exit_is_code, the code its exit status names and its stderr as the message;
 * - VM_ERROR_IO "cannot run <argv[0]> as uid N" when @options->run_as cannot be honoured (the
 *   program never starts then);
 * - VM_ERROR_TIMEOUT when @options->timeout_ms passes, VM_ERROR_CANCELLED when
 *   @options->cancellable fires, and VM_ERROR_IO "<argv[0]> printed more than N bytes" when
 *   stdout passes @options->stdout_max: the whole process group is killed (SIGKILL) and reaped
 *   first. */
gboolean vm_spawn_run(const char *const *argv, const VmSpawnOptions *options, char **ret_stdout,
                      GError **error);

G_END_DECLS
