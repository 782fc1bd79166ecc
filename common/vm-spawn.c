#include "vm-spawn.h"

#include "vm-error.h"
#include "vm-util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib-unix.h>

#define VM_SPAWN_CHUNK 16384
/* How long the wait for an exit, once the program closed its outputs, sleeps at most between
 * two looks. */
#define VM_SPAWN_REAP_POLL_MAX_US (50 * 1000)

/* Exit status of a child that could not become the user it was asked to run as: it never
 * reaches exec, so it is told from the program's own statuses by its stderr line. */
#define VM_SPAWN_RUN_AS_FAILED 127
#define VM_SPAWN_RUN_AS_LINE   "vm-spawn: cannot change to the user asked for\n"

static void
vm_spawn_child_setup(gpointer data)
{
    const VmSpawnOptions *options = data;

    /* A process group of its own, so that a timeout or a cancel also stops what it started. */
    setpgid(0, 0);
    if (!options->run_as)
        return;
    /* Between fork and exec: system calls only. Groups first, while still allowed to. */
    if (setgroups(0, NULL) < 0 || setresgid(options->gid, options->gid, options->gid) < 0 ||
        setresuid(options->uid, options->uid, options->uid) < 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || getuid() != options->uid ||
        geteuid() != options->uid || getgid() != options->gid || getegid() != options->gid) {
        (void)!write(STDERR_FILENO, VM_SPAWN_RUN_AS_LINE, sizeof(VM_SPAWN_RUN_AS_LINE) - 1);
        _exit(VM_SPAWN_RUN_AS_FAILED);
    }
}

static void
vm_spawn_close(int *fdp)
{
    if (*fdp >= 0)
        close(*fdp);
    *fdp = -1;
}

/* A running program: its pipes and its process, which is killed with its whole group and reaped
 * when the run ends before its exit did. */
typedef struct {
    GPid pid; /* 0 once reaped (or never started) */
    int in_fd;
    int out_fd;
    int err_fd;
    GCancellable *cancellable; /* set when its descriptor is among those polled */
    GPollFD cancel_fd;
} VmSpawnChild;

static void
vm_spawn_child_clear(VmSpawnChild *child)
{
    vm_spawn_close(&child->in_fd);
    vm_spawn_close(&child->out_fd);
    vm_spawn_close(&child->err_fd);
    if (child->cancellable != NULL)
        g_cancellable_release_fd(child->cancellable);
    child->cancellable = NULL;
    if (child->pid > 0) {
        kill(-child->pid, SIGKILL);
        /* In case the group was never made (the child died between fork and setpgid). */
        kill(child->pid, SIGKILL);
        while (waitpid(child->pid, NULL, 0) < 0 && errno == EINTR)
            ;
        child->pid = 0;
    }
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(VmSpawnChild, vm_spawn_child_clear)

/* Why the run stops early: VM_ERROR_TIMEOUT, VM_ERROR_CANCELLED, or 0 to go on. */
static VmErrorCode
vm_spawn_stop_reason(const VmSpawnOptions *options, gint64 deadline)
{
    if (g_cancellable_is_cancelled(options->cancellable))
        return VM_ERROR_CANCELLED;
    if (deadline >= 0 && g_get_monotonic_time() >= deadline)
        return VM_ERROR_TIMEOUT;
    return 0;
}

static gboolean
vm_spawn_throw_stop(GError **error, VmErrorCode reason, const char *program,
                    const VmSpawnOptions *options)
{
    if (reason == VM_ERROR_CANCELLED)
        return vm_throw(error, VM_ERROR_CANCELLED, "%s cancelled", program);
    if (reason == VM_ERROR_IO)
        return vm_throw(error, VM_ERROR_IO, "%s printed more than %" G_GSIZE_FORMAT " bytes",
                        program, options->stdout_max);
    return vm_throw(error, VM_ERROR_TIMEOUT, "%s did not finish within %u ms", program,
                    options->timeout_ms);
}

/* Milliseconds poll() may wait: up to @deadline, or forever (-1). */
static int
vm_spawn_poll_timeout(gint64 deadline)
{
    if (deadline < 0)
        return -1;
    gint64 left_us = deadline - g_get_monotonic_time();
    if (left_us <= 0)
        return 0;
    return (int)MIN((left_us + 999) / 1000, G_MAXINT);
}

/* Reads what is there on *@fdp into @buf, keeping at most @max bytes (0: all); closes the
 * descriptor at its end. */
static void
vm_spawn_read(int *fdp, GByteArray *buf, gsize max)
{
    guint8 chunk[VM_SPAWN_CHUNK];
    gssize n = read(*fdp, chunk, sizeof(chunk));

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        vm_spawn_close(fdp);
        return;
    }
    if (max == 0)
        g_byte_array_append(buf, chunk, (guint)n);
    else if (buf->len < max)
        g_byte_array_append(buf, chunk, (guint)MIN((gsize)n, max - buf->len));
}

/* Writes the next part of @input on *@fdp, closing it once all is written or when the program
 * stopped reading (its exit status then tells whether that was a failure). */
static void
vm_spawn_write(int *fdp, GBytes *input, gsize *done)
{
    gsize len = 0;
    const guint8 *data = g_bytes_get_data(input, &len);
    gssize n = *done < len ? vm_write_nosignal(*fdp, data + *done, len - *done) : 0;

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0)
        *done += (gsize)n;
    if (n < 0 || *done >= len)
        vm_spawn_close(fdp);
}

/* "exit status 3" or "killed by signal 9". */
static char *
vm_spawn_describe_status(int wait_status)
{
    if (WIFSIGNALED(wait_status))
        return g_strdup_printf("killed by signal %d", WTERMSIG(wait_status));
    return g_strdup_printf("exit status %d", WEXITSTATUS(wait_status));
}

gboolean
vm_spawn_run(const char *const *argv, const VmSpawnOptions *options, char **ret_stdout,
             GError **error)
{
    static const VmSpawnOptions no_options = {0};
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GByteArray) out = g_byte_array_new();
    g_autoptr(GByteArray) err = g_byte_array_new();
    g_auto(VmSpawnChild) child = {.in_fd = -1, .out_fd = -1, .err_fd = -1};
    gsize input_done = 0;
    gint64 deadline = -1;
    VmErrorCode stop = 0;
    int wait_status = 0;

    g_return_val_if_fail(argv != NULL && argv[0] != NULL, FALSE);
    if (options == NULL)
        options = &no_options;
    if (g_cancellable_is_cancelled(options->cancellable))
        return vm_spawn_throw_stop(error, VM_ERROR_CANCELLED, argv[0], options);
    if (options->timeout_ms > 0)
        deadline = g_get_monotonic_time() + (gint64)options->timeout_ms * 1000;

    GSpawnFlags flags = G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_CLOEXEC_PIPES;
    int stdout_fd = ret_stdout == NULL && options->stdout_fd > 0 ? options->stdout_fd : -1;
    if (ret_stdout == NULL && stdout_fd < 0)
        flags |= G_SPAWN_STDOUT_TO_DEV_NULL;
    if (!g_spawn_async_with_pipes_and_fds(
            NULL, argv, NULL, flags, vm_spawn_child_setup, (gpointer)options, -1, stdout_fd, -1,
            NULL, NULL, 0, &child.pid, options->input != NULL ? &child.in_fd : NULL,
            ret_stdout != NULL ? &child.out_fd : NULL, &child.err_fd, &local_error))
        return vm_throw(error, VM_ERROR_IO, "cannot run %s: %s", argv[0], local_error->message);
    /* Also from this side, so that a kill right after the spawn cannot miss the group. */
    setpgid(child.pid, child.pid);
    if (child.in_fd >= 0 && !g_unix_set_fd_nonblocking(child.in_fd, TRUE, NULL))
        vm_spawn_close(&child.in_fd);
    if (g_cancellable_make_pollfd(options->cancellable, &child.cancel_fd))
        child.cancellable = options->cancellable;

    /* Feed stdin and drain stdout and stderr together: a program blocked writing one pipe
     * while we block writing the other would never finish. */
    while (stop == 0 && (child.out_fd >= 0 || child.err_fd >= 0)) {
        struct pollfd pfds[4];
        int n_pfds = 0;
        int in_i = -1, out_i = -1, err_i = -1;

        if (child.in_fd >= 0) {
            in_i = n_pfds;
            pfds[n_pfds++] = (struct pollfd){.fd = child.in_fd, .events = POLLOUT};
        }
        if (child.out_fd >= 0) {
            out_i = n_pfds;
            pfds[n_pfds++] = (struct pollfd){.fd = child.out_fd, .events = POLLIN};
        }
        if (child.err_fd >= 0) {
            err_i = n_pfds;
            pfds[n_pfds++] = (struct pollfd){.fd = child.err_fd, .events = POLLIN};
        }
        if (child.cancellable != NULL)
            pfds[n_pfds++] = (struct pollfd){.fd = child.cancel_fd.fd, .events = POLLIN};

        int rc = poll(pfds, n_pfds, vm_spawn_poll_timeout(deadline));
        if (rc < 0 && errno != EINTR)
            return vm_throw_errno(error, errno, "cannot wait for %s", argv[0]);
        stop = vm_spawn_stop_reason(options, deadline);
        if (stop != 0 || rc <= 0)
            continue;
        if (in_i >= 0 && pfds[in_i].revents != 0)
            vm_spawn_write(&child.in_fd, options->input, &input_done);
        if (out_i >= 0 && pfds[out_i].revents != 0) {
            /* One byte past the bound tells that the bound was passed. */
            vm_spawn_read(&child.out_fd, out,
                          options->stdout_max > 0 ? options->stdout_max + 1 : 0);
            if (options->stdout_max > 0 && out->len > options->stdout_max)
                stop = VM_ERROR_IO;
        }
        if (err_i >= 0 && pfds[err_i].revents != 0)
            vm_spawn_read(&child.err_fd, err, VM_SPAWN_STDERR_MAX);
    }
    vm_spawn_close(&child.in_fd);

    /* The program closed its outputs but may still run: wait for its exit within the same
     * limits. */
    for (gulong sleep_us = 1000; stop == 0;) {
        pid_t done = waitpid(child.pid, &wait_status, WNOHANG);
        if (done == child.pid) {
            child.pid = 0;
            break;
        }
        if (done < 0 && errno != EINTR)
            return vm_throw_errno(error, errno, "cannot wait for %s", argv[0]);
        g_usleep(sleep_us);
        sleep_us = MIN(sleep_us * 2, VM_SPAWN_REAP_POLL_MAX_US);
        stop = vm_spawn_stop_reason(options, deadline);
    }
    if (stop != 0) {
        vm_spawn_child_clear(&child);
        return vm_spawn_throw_stop(error, stop, argv[0], options);
    }

    if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
        g_autofree char *text =
            err->len > 0 ? g_utf8_make_valid((const char *)err->data, err->len) : g_strdup("");
        int status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;

        if (options->run_as && status == VM_SPAWN_RUN_AS_FAILED &&
            strcmp(text, VM_SPAWN_RUN_AS_LINE) == 0)
            return vm_throw(error, VM_ERROR_IO, "cannot run %s as uid %u", argv[0],
                            (guint)options->uid);
        g_strstrip(text);
        if (options->exit_is_code && status >= 1 && status <= VM_ERROR_LAST && text[0] != '\0')
            return vm_throw(error, (VmErrorCode)status, "%s", text);
        if (text[0] == '\0') {
            g_free(text);
            text = vm_spawn_describe_status(wait_status);
        }
        return vm_throw(error, VM_ERROR_IO, "%s failed: %s", argv[0], text);
    }
    if (ret_stdout != NULL) {
        if (options->ret_stdout_len != NULL)
            *options->ret_stdout_len = out->len;
        g_byte_array_append(out, (const guint8 *)"", 1);
        *ret_stdout = (char *)g_byte_array_free(g_steal_pointer(&out), FALSE);
    }
    return TRUE;
}
