#include "vmctl-client.h"

#include "vm-error.h"
#include "vm-stream.h"
#include "vm-util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#define SIGPIPE_STATUS (128 + SIGPIPE)

int
vmctl_client_connect(const char *socket_path, GError **error)
{
    struct sockaddr_un addr;
    socklen_t addr_len;

    if (!vm_unix_address(socket_path, &addr, &addr_len, error))
        return -1;

    vm_autofd fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        vm_throw_errno(error, errno, "cannot create a socket");
        return -1;
    }
    while (connect(fd, (struct sockaddr *)&addr, addr_len) < 0) {
        if (errno == EINTR)
            continue;
        if (errno == ENOENT || errno == ECONNREFUSED || errno == ENOTDIR)
            vm_throw(error, VM_ERROR_NOT_RUNNING, "hostd is not running at %s", socket_path);
        else
            vm_throw_errno(error, errno, "cannot connect to hostd at %s", socket_path);
        return -1;
    }
    return g_steal_fd(&fd);
}

/* Reads the next frame of the reply: PROGRESS is shown here (and still returned); ERROR and an
 * early end of the connection become @error. */
static VmMessage *
next_message(VmStreamReader *reader, VmctlProgress *progress, GError **error)
{
    VmMessage *message = vm_stream_reader_next(reader, error);

    if (message != NULL && message->op == VM_OP_PROGRESS)
        vmctl_progress_update(progress, vm_message_get_string(message, "message", ""),
                              vm_message_get_double(message, "fraction", -1));
    return message;
}

gboolean
vmctl_client_call(const char *socket_path, const VmMessage *request, VmctlProgressMode mode,
                  VmMessage **ret_result, GError **error)
{
    g_return_val_if_fail(vm_op_reply_end(request->op) == VM_OP_RESULT, FALSE);

    vm_autofd fd = vmctl_client_connect(socket_path, error);
    if (fd < 0)
        return FALSE;
    if (!vm_message_write_fd(fd, request, error))
        return FALSE;

    g_autoptr(VmctlProgress) progress = vmctl_progress_new(mode, stderr);
    VmStreamReader reader;
    vm_stream_reader_init(&reader, fd, request->op);
    for (;;) {
        g_autoptr(VmMessage) message = next_message(&reader, progress, error);
        if (message == NULL)
            return FALSE;
        if (message->op == VM_OP_PROGRESS)
            continue;
        /* The reader lets nothing but PROGRESS and the RESULT through. */
        *ret_result = g_steal_pointer(&message);
        return TRUE;
    }
}

gboolean
vmctl_terminal_size(guint32 *ret_cols, guint32 *ret_rows)
{
    static const int fds[] = {STDOUT_FILENO, STDIN_FILENO};

    for (gsize i = 0; i < G_N_ELEMENTS(fds); i++) {
        struct winsize size = {0};
        if (isatty(fds[i]) && ioctl(fds[i], TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
            *ret_cols = size.ws_col;
            *ret_rows = size.ws_row;
            return TRUE;
        }
    }
    return FALSE;
}

/* The socket of an EXEC stream, shared by the main loop and the stdin thread. Frames are written
 * under the lock so they never interleave; once the main loop is done it sets closed, so the
 * stdin thread, which may sit in read() until the process exits, never writes to a closed (or
 * reused) fd. */
typedef struct {
    GMutex lock;
    int fd;
    gboolean closed;
} ExecStream;

static void
exec_stream_clear(ExecStream *stream)
{
    g_mutex_clear(&stream->lock);
}

static void
exec_stream_unref(ExecStream *stream)
{
    g_atomic_rc_box_release_full(stream, (GDestroyNotify)exec_stream_clear);
}

static gboolean
exec_stream_send(ExecStream *stream, VmMessage *message, GError **error)
{
    gboolean ok = TRUE;

    g_mutex_lock(&stream->lock);
    if (!stream->closed)
        ok = vm_message_write_fd(stream->fd, message, error);
    g_mutex_unlock(&stream->lock);
    return ok;
}

static void
exec_stream_close(ExecStream *stream)
{
    g_mutex_lock(&stream->lock);
    stream->closed = TRUE;
    close(stream->fd);
    g_mutex_unlock(&stream->lock);
    exec_stream_unref(stream);
}

/* Forwards fd 0 as STDIN frames. Returns TRUE at the end of input (a read error, a closed stdin
 * included, counts as the end: the remote command sees EOF), FALSE when hostd is gone, which the
 * main loop reports. */
static gboolean
exec_forward_stdin(ExecStream *stream)
{
    g_autofree guint8 *buffer = g_malloc(VM_STREAM_CHUNK_MAX);

    for (;;) {
        ssize_t n = read(STDIN_FILENO, buffer, VM_STREAM_CHUNK_MAX);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
            poll(&pfd, 1, -1);
            continue;
        }
        if (n <= 0)
            return TRUE;
        g_autoptr(VmMessage) chunk = vm_message_new_data(VM_OP_STDIN, buffer, (gsize)n);
        if (!exec_stream_send(stream, chunk, NULL))
            return FALSE;
    }
}

static gpointer
exec_stdin_thread(gpointer data)
{
    ExecStream *stream = data;

    if (exec_forward_stdin(stream)) {
        g_autoptr(VmMessage) eof = vm_message_new(VM_OP_STDIN_EOF, NULL, NULL);
        if (eof != NULL)
            exec_stream_send(stream, eof, NULL);
    }
    exec_stream_unref(stream);
    return NULL;
}

/* Writes all of @data to @fd, waiting when @fd is non-blocking. Returns 0 or an errno. */
static int
write_all(int fd, const guint8 *data, gsize len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, -1);
            continue;
        }
        if (n < 0)
            return errno;
        data += n;
        len -= (gsize)n;
    }
    return 0;
}

static int signal_pipe_write = -1;

static void
exec_signal_handler(int signo)
{
    int saved = errno;
    guint8 byte = (guint8)signo;

    if (write(signal_pipe_write, &byte, 1) < 0) {
        /* The pipe is full: a signal is already pending, the loop will wake up anyway. */
    }
    errno = saved;
}

/* The local terminal and signal state an EXEC changes, and restores on every way out. */
typedef struct {
    int signals[5];
    struct sigaction saved_actions[5];
    gsize n_signals;
    int pipe[2];
    gboolean raw;
    struct termios saved_termios;
    struct sigaction saved_sigpipe;
} ExecTerminal;

static void
exec_terminal_setup(ExecTerminal *term, gboolean raw_terminal)
{
    static const int fatal[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    struct termios raw;
    struct sigaction ignore = {.sa_handler = SIG_IGN};

    *term = (ExecTerminal){.pipe = {-1, -1}};
    /* A closed stdout must end the stream with a status (and the terminal restored), not kill
     * vmctl where it stands. */
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &term->saved_sigpipe);
    if (!raw_terminal || pipe2(term->pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return;
    signal_pipe_write = term->pipe[1];
    term->signals[term->n_signals++] = SIGWINCH;
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &term->saved_termios) == 0) {
        raw = term->saved_termios;
        cfmakeraw(&raw);
        term->raw = tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) == 0;
    }
    /* In raw mode ^C is a byte for the remote side; a signal can only come from elsewhere, and
     * must not leave the terminal raw. */
    for (gsize i = 0; term->raw && i < G_N_ELEMENTS(fatal); i++)
        term->signals[term->n_signals++] = fatal[i];
    for (gsize i = 0; i < term->n_signals; i++) {
        struct sigaction action = {.sa_handler = exec_signal_handler, .sa_flags = SA_RESTART};
        sigemptyset(&action.sa_mask);
        sigaction(term->signals[i], &action, &term->saved_actions[i]);
    }
}

static void
exec_terminal_restore(ExecTerminal *term)
{
    if (term->raw)
        tcsetattr(STDIN_FILENO, TCSADRAIN, &term->saved_termios);
    for (gsize i = 0; i < term->n_signals; i++)
        sigaction(term->signals[i], &term->saved_actions[i], NULL);
    sigaction(SIGPIPE, &term->saved_sigpipe, NULL);
    signal_pipe_write = -1;
    for (int i = 0; i < 2; i++)
        if (term->pipe[i] >= 0)
            close(term->pipe[i]);
}

static gboolean
exec_send_window_size(ExecStream *stream, GError **error)
{
    guint32 cols, rows;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);

    if (!vmctl_terminal_size(&cols, &rows))
        return TRUE;
    g_variant_dict_insert(&fields, "cols", "u", cols);
    g_variant_dict_insert(&fields, "rows", "u", rows);
    g_autoptr(VmMessage) message =
        vm_message_new(VM_OP_WINDOW_SIZE, g_variant_dict_end(&fields), error);
    return message != NULL && exec_stream_send(stream, message, error);
}

/* Handles what the signal pipe says. Returns TRUE and sets *ret_status when a signal ends the
 * stream; SIGWINCH is forwarded. */
static gboolean
exec_handle_signals(ExecStream *stream, int signal_fd, int *ret_status, GError **error)
{
    guint8 signo;

    while (read(signal_fd, &signo, 1) == 1) {
        if (signo != SIGWINCH) {
            *ret_status = 128 + signo;
            return TRUE;
        }
        if (!exec_send_window_size(stream, error))
            return TRUE;
    }
    return FALSE;
}

/* Handles one message of the stream. Returns TRUE and sets *ret_status when the stream is over
 * (EXIT, or a closed local stdout/stderr), or TRUE with @error set when it failed. */
static gboolean
exec_handle_message(VmStreamReader *reader, VmctlProgress *progress, int *ret_status,
                    GError **error)
{
    g_autoptr(VmMessage) message = next_message(reader, progress, error);
    const guint8 *data;
    gsize len = 0;
    int status, err;

    if (message == NULL)
        return TRUE;
    switch (message->op) {
    case VM_OP_PROGRESS:
        return FALSE;
    case VM_OP_STDOUT:
    case VM_OP_STDERR:
        vmctl_progress_clear(progress);
        data = vm_message_get_data(message, "data", &len);
        err = write_all(message->op == VM_OP_STDOUT ? STDOUT_FILENO : STDERR_FILENO, data, len);
        if (err == EPIPE) {
            *ret_status = SIGPIPE_STATUS;
            return TRUE;
        }
        if (err != 0)
            vm_throw_errno(error, err, "cannot write the command's output");
        return err != 0;
    case VM_OP_EXIT:
        status = vm_message_get_int(message, "status", 255);
        *ret_status = status >= 0 && status <= 255 ? status : 255;
        return TRUE;
    default: /* the reader lets nothing else through */
        vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                 vm_op_name(message->op));
        return TRUE;
    }
}

gboolean
vmctl_client_exec(const char *socket_path, const VmMessage *request, VmctlProgressMode mode,
                  gboolean raw_terminal, int *ret_status, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    int status = -1;
    ExecTerminal term;
    VmStreamReader reader;

    g_return_val_if_fail(vm_op_reply_end(request->op) == VM_OP_EXIT, FALSE);

    int fd = vmctl_client_connect(socket_path, error);
    if (fd < 0)
        return FALSE;
    if (!vm_message_write_fd(fd, request, error)) {
        close(fd);
        return FALSE;
    }

    vm_stream_reader_init(&reader, fd, request->op);
    ExecStream *stream = g_atomic_rc_box_new0(ExecStream);
    g_mutex_init(&stream->lock);
    stream->fd = fd;
    g_thread_unref(g_thread_new("vmctl-stdin", exec_stdin_thread, g_atomic_rc_box_acquire(stream)));

    g_autoptr(VmctlProgress) progress = vmctl_progress_new(mode, stderr);
    exec_terminal_setup(&term, raw_terminal);
    while (status < 0 && local_error == NULL) {
        struct pollfd fds[2] = {{.fd = fd, .events = POLLIN},
                                {.fd = term.pipe[0], .events = POLLIN}};
        if (poll(fds, term.pipe[0] >= 0 ? 2 : 1, -1) < 0) {
            if (errno != EINTR)
                vm_throw_errno(&local_error, errno, "poll");
            continue;
        }
        if (fds[1].revents != 0 && exec_handle_signals(stream, term.pipe[0], &status, &local_error))
            break;
        if (fds[0].revents != 0)
            exec_handle_message(&reader, progress, &status, &local_error);
    }
    exec_terminal_restore(&term);
    vmctl_progress_clear(progress);
    exec_stream_close(stream);
    if (local_error != NULL) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    *ret_status = status;
    return TRUE;
}
