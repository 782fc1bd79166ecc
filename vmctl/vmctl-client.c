#include "vmctl-client.h"

#include "vm-error.h"
#include "vm-stream.h"
#include "vm-util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define SIGPIPE_STATUS (128 + SIGPIPE)

/* The group whose members may open @path (a socket of mode 0660), or NULL when only its owner
 * may. */
static char *
socket_group(const char *path)
{
    struct stat st;
    struct group group, *found = NULL;
    char buffer[4096];

    if (stat(path, &st) < 0 || (st.st_mode & 0060) != 0060)
        return NULL;
    if (getgrgid_r(st.st_gid, &group, buffer, sizeof buffer, &found) != 0 || found == NULL)
        return g_strdup_printf("%u", (unsigned)st.st_gid);
    return g_strdup(found->gr_name);
}

static void
throw_connect_error(const char *socket_path, int err, GError **error)
{
    switch (err) {
    case ENOENT:
    case ENOTDIR:
        vm_throw(error, VM_ERROR_NOT_RUNNING, "hostd is not running at %s", socket_path);
        break;
    case ECONNREFUSED:
        vm_throw(error, VM_ERROR_NOT_RUNNING,
                 "nothing listens on %s: the socket is left from a hostd that is gone",
                 socket_path);
        break;
    case EACCES:
    case EPERM: {
        g_autofree char *group = socket_group(socket_path);
        if (group != NULL)
            vm_throw(error, VM_ERROR_PERMISSION,
                     "permission denied on %s: add your user to the group '%s' (hostd's "
                     "socket-group) and log in again",
                     socket_path, group);
        else
            vm_throw(error, VM_ERROR_PERMISSION,
                     "permission denied on %s: set socket-group in hostd's configuration, add "
                     "your user to that group and log in again",
                     socket_path);
        break;
    }
    default:
        vm_throw_errno(error, err, "cannot connect to hostd at %s", socket_path);
        break;
    }
}

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
        throw_connect_error(socket_path, errno, error);
        return -1;
    }
    return g_steal_fd(&fd);
}

char **
vmctl_socket_candidates(void)
{
    g_autoptr(GStrvBuilder) paths = g_strv_builder_new();
    const char *system = g_getenv("VMCTL_SYSTEM_SOCKET");

    if (system == NULL || system[0] == '\0')
        system = VM_SYSTEM_STATE_DIR "/hostd.sock";
    if (geteuid() != 0) {
        g_autofree char *user =
            g_build_filename(g_get_user_data_dir(), "hostd", "hostd.sock", NULL);
        if (strcmp(user, system) != 0)
            g_strv_builder_add(paths, user);
    }
    g_strv_builder_add(paths, system);
    return g_strv_builder_end(paths);
}

/* Whether @path exists as far as this user can tell. A directory this user may not search hides
 * the socket: it counts as there, and connecting says why it cannot be used. */
static gboolean
socket_exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

/* Whether nothing listens on the socket at @path (a hostd that ended without removing it). A
 * live hostd sees a connection closed before any request, which it drops without a word. */
static gboolean
socket_stale(const char *path)
{
    g_autoptr(GError) error = NULL;
    vm_autofd fd = vmctl_client_connect(path, &error);

    return fd < 0 && g_error_matches(error, VM_ERROR, VM_ERROR_NOT_RUNNING);
}

char *
vmctl_socket_find(const char *const *candidates, GError **error)
{
    g_autofree char *listed = NULL;

    g_return_val_if_fail(candidates != NULL && candidates[0] != NULL, NULL);

    for (const char *const *path = candidates; *path != NULL; path++) {
        if (!socket_exists(*path))
            continue;
        /* A stale socket gives way to a later one that exists: the user's own hostd that died
         * does not hide the system's. */
        gboolean later = FALSE;
        for (const char *const *next = path + 1; *next != NULL; next++)
            later = later || socket_exists(*next);
        if (!later || !socket_stale(*path))
            return g_strdup(*path);
    }
    listed = g_strjoinv(" or ", (char **)candidates);
    vm_throw(error, VM_ERROR_NOT_RUNNING, "hostd is not running: no socket at %s", listed);
    return NULL;
}

/* How long ssh gets to end by itself once its connection is closed. */
#define SSH_GRACE_MS 2000
/* Bytes of ssh's stderr kept for the error message: the end of it. */
#define SSH_STDERR_MAX 4096

struct VmctlConnection {
    int fd;
    int ssh_stderr;      /* -1 locally */
    GPid ssh_pid;        /* 0 locally, and once reaped */
    char *host;          /* the remote host, for messages */
    GString *said;       /* what ssh wrote on stderr: its last SSH_STDERR_MAX bytes */
    gboolean ssh_failed; /* ssh ended by itself with a non-zero status */
};

VmctlConnection *
vmctl_connection_open(const VmctlEndpoint *endpoint, GError **error)
{
    g_autofree VmctlConnection *connection = g_new0(VmctlConnection, 1);

    connection->ssh_stderr = -1;
    if (endpoint->remote == NULL) {
        connection->fd = vmctl_client_connect(endpoint->socket_path, error);
        if (connection->fd < 0)
            return NULL;
        return g_steal_pointer(&connection);
    }
    if (!vmctl_remote_connect(endpoint->remote, &connection->fd, &connection->ssh_stderr,
                              &connection->ssh_pid, error))
        return NULL;
    connection->host = g_strdup(endpoint->remote->host);
    connection->said = g_string_new(NULL);
    return g_steal_pointer(&connection);
}

int
vmctl_connection_get_fd(const VmctlConnection *connection)
{
    return connection->fd;
}

/* Reads what ssh wrote on stderr so far, keeping the end. Returns FALSE at its end of file. */
static gboolean
connection_read_stderr(VmctlConnection *connection)
{
    char buffer[1024];

    for (;;) {
        ssize_t n = read(connection->ssh_stderr, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN;
        if (n == 0)
            return FALSE;
        g_string_append_len(connection->said, buffer, n);
        if (connection->said->len > SSH_STDERR_MAX)
            g_string_erase(connection->said, 0, connection->said->len - SSH_STDERR_MAX);
    }
}

/* Closes the socket and reaps ssh: ssh sees the end of its stdin and ends, and the remote
 * bridge with it; one that lingers past the grace is terminated. */
static void
connection_close(VmctlConnection *connection)
{
    gint64 deadline = g_get_monotonic_time() + SSH_GRACE_MS * G_TIME_SPAN_MILLISECOND;
    gboolean open = TRUE;
    int status;

    if (connection->fd >= 0) {
        close(connection->fd);
        connection->fd = -1;
    }
    while (connection->ssh_pid != 0) {
        if (open)
            open = connection_read_stderr(connection);
        pid_t pid = waitpid(connection->ssh_pid, &status, WNOHANG);
        if (pid == connection->ssh_pid || (pid < 0 && errno != EINTR)) {
            connection->ssh_failed = pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) != 0;
            connection->ssh_pid = 0;
        } else if (g_get_monotonic_time() >= deadline) {
            kill(connection->ssh_pid, SIGTERM);
            waitpid(connection->ssh_pid, &status, 0);
            connection->ssh_pid = 0;
        } else {
            struct pollfd pfd = {.fd = connection->ssh_stderr, .events = POLLIN};
            poll(&pfd, open ? 1 : 0, 10);
        }
    }
    if (connection->ssh_stderr >= 0) {
        connection_read_stderr(connection);
        close(connection->ssh_stderr);
        connection->ssh_stderr = -1;
    }
}

/* The last non-empty line of @text, or NULL. */
static char *
last_line(const char *text)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);

    for (gsize i = g_strv_length(lines); i > 0; i--) {
        g_strstrip(lines[i - 1]);
        if (lines[i - 1][0] != '\0')
            return g_utf8_make_valid(lines[i - 1], -1);
    }
    return NULL;
}

gboolean
vmctl_connection_fail(VmctlConnection *connection, GError **error)
{
    connection_close(connection);
    if (error == NULL || *error == NULL || !connection->ssh_failed)
        return FALSE;
    /* Only a broken conversation is ssh's doing; hostd's own errors, a timeout or a cancel
     * are what they say. */
    VmErrorCode code = vm_error_code(*error);
    if (code != VM_ERROR_PROTOCOL && code != VM_ERROR_IO)
        return FALSE;
    g_autofree char *line = last_line(connection->said->str);
    if (line == NULL)
        return FALSE;
    g_clear_error(error);
    return vm_throw(error, VM_ERROR_NOT_RUNNING, "cannot reach hostd on %s: %s", connection->host,
                    line);
}

void
vmctl_connection_free(VmctlConnection *connection)
{
    if (connection == NULL)
        return;
    connection_close(connection);
    if (connection->said != NULL)
        g_string_free(connection->said, TRUE);
    g_free(connection->host);
    g_free(connection);
}

/* Waits until @fd has something to read, @cancellable fires or @deadline (monotonic usec, 0:
 * none) passes. Fails with VM_ERROR_CANCELLED or VM_ERROR_TIMEOUT for the last two. */
static gboolean
wait_readable(int fd, GCancellable *cancellable, gint64 deadline, GError **error)
{
    GPollFD fds[2] = {{.fd = fd, .events = G_IO_IN}};
    gboolean cancel_fd = cancellable != NULL && g_cancellable_make_pollfd(cancellable, &fds[1]);
    gboolean ok = TRUE;

    for (;;) {
        int timeout = -1;
        if (g_cancellable_is_cancelled(cancellable)) {
            ok = vm_throw(error, VM_ERROR_CANCELLED, "cancelled");
            break;
        }
        if (deadline != 0) {
            gint64 left = deadline - g_get_monotonic_time();
            if (left <= 0) {
                ok = vm_throw(error, VM_ERROR_TIMEOUT, "time is up");
                break;
            }
            timeout = (int)MIN((left + 999) / 1000, G_MAXINT);
        }
        fds[0].revents = 0;
        if (g_poll(fds, cancel_fd ? 2 : 1, timeout) < 0 && errno != EINTR) {
            ok = vm_throw_errno(error, errno, "poll");
            break;
        }
        if (fds[0].revents != 0 && !g_cancellable_is_cancelled(cancellable))
            break;
    }
    if (cancel_fd)
        g_cancellable_release_fd(cancellable);
    return ok;
}

/* Reads the next frame of the reply, once it comes or @cancellable fires: PROGRESS goes to
 * @progress (and is still returned); ERROR and an early end of the connection become @error. */
static VmMessage *
next_message(VmStreamReader *reader, GCancellable *cancellable, gint64 deadline,
             VmProgressFunc progress, gpointer progress_data, GError **error)
{
    if ((cancellable != NULL || deadline != 0) &&
        !wait_readable(reader->fd, cancellable, deadline, error))
        return NULL;

    VmMessage *message = vm_stream_reader_next(reader, error);
    if (message != NULL && message->op == VM_OP_PROGRESS && progress != NULL)
        progress(vm_message_get_string(message, "message", ""),
                 vm_message_get_double(message, "fraction", -1), progress_data);
    return message;
}

/* vmctl_client_request() to one hostd: *@ret_where is set (and @error) when it answered
 * ELSEWHERE. */
static gboolean
client_request_once(const VmctlEndpoint *endpoint, const VmMessage *request,
                    GCancellable *cancellable, VmProgressFunc progress, gpointer progress_data,
                    VmMessage **ret_result, gboolean *ret_elsewhere, VmElsewhere *ret_where,
                    GError **error)
{
    *ret_elsewhere = FALSE;
    g_autoptr(VmctlConnection) connection = vmctl_connection_open(endpoint, error);
    if (connection == NULL)
        return FALSE;
    if (!vm_message_write_fd(connection->fd, request, error))
        return vmctl_connection_fail(connection, error);

    VmStreamReader reader;
    vm_stream_reader_init(&reader, connection->fd, request->op);
    for (;;) {
        g_autoptr(VmMessage) message =
            next_message(&reader, cancellable, 0, progress, progress_data, error);
        if (message == NULL) {
            *ret_elsewhere = reader.elsewhere;
            *ret_where = reader.where;
            return vmctl_connection_fail(connection, error);
        }
        if (message->op == VM_OP_PROGRESS)
            continue;
        /* The reader lets nothing but PROGRESS and the RESULT through. */
        *ret_result = g_steal_pointer(&message);
        return TRUE;
    }
}

gboolean
vmctl_follow_prepare(const VmMessage *request, const VmElsewhere *where, VmctlRemote **ret_remote,
                     VmMessage **ret_request, GError **error)
{
    g_autofree char *what = g_strdup_printf("address of host '%s'", where->host);
    g_autoptr(VmctlRemote) remote = vmctl_remote_parse(where->address, what, error);
    if (remote == NULL)
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(request->fields);
    /* The host placement chose: sent there, the agent is made there, not placed again. */
    if (request->op == VM_OP_AGENT_NEW)
        g_variant_dict_insert(&fields, "on", "s", where->host);
    VmMessage *again = vm_message_new(request->op, g_variant_dict_end(&fields), error);
    if (again == NULL)
        return FALSE;
    *ret_remote = g_steal_pointer(&remote);
    *ret_request = again;
    return TRUE;
}

/* One try of a request at @endpoint (@request: its request), for client_follow(): sets
 * *@ret_elsewhere and *@ret_where when the host answered ELSEWHERE. */
typedef gboolean (*ClientTryFunc)(const VmctlEndpoint *endpoint, const VmMessage *request,
                                  gpointer data, gboolean *ret_elsewhere, VmElsewhere *ret_where,
                                  GError **error);

/* Tries @request at @endpoint, and where it answers ELSEWHERE once more at the host named
 * (*@ret_followed, may be NULL: that host). A second ELSEWHERE fails: hosts that keep sending a
 * request on disagree about the fleet. */
static gboolean
client_follow(const VmctlEndpoint *endpoint, const VmMessage *request, ClientTryFunc try_once,
              gpointer data, VmctlRemote **ret_followed, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    gboolean elsewhere = FALSE;
    VmElsewhere where, twice;
    if (try_once(endpoint, request, data, &elsewhere, &where, &local_error))
        return TRUE;
    if (!elsewhere) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    g_clear_error(&local_error);

    g_autoptr(VmctlRemote) remote = NULL;
    g_autoptr(VmMessage) again = NULL;
    if (!vmctl_follow_prepare(request, &where, &remote, &again, error))
        return FALSE;
    VmctlEndpoint there = {.remote = remote};
    if (!try_once(&there, again, data, &elsewhere, &twice, &local_error)) {
        if (elsewhere)
            return vm_throw(error, VM_ERROR_FAILED,
                            "the request was sent on to host '%s', which sent it on to host "
                            "'%s': not following twice",
                            where.host, twice.host);
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    if (ret_followed != NULL)
        *ret_followed = g_steal_pointer(&remote);
    return TRUE;
}

typedef struct {
    GCancellable *cancellable;
    VmProgressFunc progress;
    gpointer progress_data;
    VmMessage **ret_result;
} RequestTry;

static gboolean
request_try(const VmctlEndpoint *endpoint, const VmMessage *request, gpointer data,
            gboolean *ret_elsewhere, VmElsewhere *ret_where, GError **error)
{
    RequestTry *t = data;
    return client_request_once(endpoint, request, t->cancellable, t->progress, t->progress_data,
                               t->ret_result, ret_elsewhere, ret_where, error);
}

gboolean
vmctl_client_request_follow(const VmctlEndpoint *endpoint, const VmMessage *request,
                            GCancellable *cancellable, VmProgressFunc progress,
                            gpointer progress_data, VmMessage **ret_result,
                            VmctlRemote **ret_followed, GError **error)
{
    g_return_val_if_fail(vm_op_reply_end(request->op) == VM_OP_RESULT, FALSE);

    RequestTry t = {cancellable, progress, progress_data, ret_result};
    return client_follow(endpoint, request, request_try, &t, ret_followed, error);
}

gboolean
vmctl_client_request(const VmctlEndpoint *endpoint, const VmMessage *request,
                     GCancellable *cancellable, VmProgressFunc progress, gpointer progress_data,
                     VmMessage **ret_result, GError **error)
{
    return vmctl_client_request_follow(endpoint, request, cancellable, progress, progress_data,
                                       ret_result, NULL, error);
}

static void
show_progress(const char *message, double fraction, gpointer user_data)
{
    vmctl_progress_update(user_data, message, fraction);
}

gboolean
vmctl_client_call(const VmctlEndpoint *endpoint, const VmMessage *request, VmctlProgressMode mode,
                  VmMessage **ret_result, VmctlRemote **ret_followed, GError **error)
{
    g_autoptr(VmctlProgress) progress = vmctl_progress_new(mode, stderr);

    return vmctl_client_request_follow(endpoint, request, NULL, show_progress, progress, ret_result,
                                       ret_followed, error);
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
    int fd; /* owned by the connection */
    gboolean closed;
    GBytes *input; /* what the stdin thread sends; NULL: what it reads on fd 0 */
    /* Until hostd's first output, the input sent is kept (up to VMCTL_EXEC_REPLAY_MAX bytes):
     * an ELSEWHERE comes before hostd reads any, so it is sent again to the host named. Atomic:
     * the main loop clears it without the lock, which the stdin thread holds while a write waits
     * for hostd to read (and hostd may be waiting for the main loop to read its output). */
    gint recording;
    GByteArray *sent;
    gboolean sent_eof;
    gboolean overflow; /* more than can be kept was sent */
    /* A new terminal size to send (atomic): the main loop sends it when the lock is free and the
     * socket has room, the stdin thread after a frame of its own, whichever comes first. */
    gint resized;
} ExecStream;

/* Input kept to be sent again when the fleet sends an exec to another host. */
#define VMCTL_EXEC_REPLAY_MAX (1024 * 1024)

static void
exec_stream_clear(ExecStream *stream)
{
    g_mutex_clear(&stream->lock);
    g_clear_pointer(&stream->input, g_bytes_unref);
    g_clear_pointer(&stream->sent, g_byte_array_unref);
}

static void
exec_stream_unref(ExecStream *stream)
{
    g_atomic_rc_box_release_full(stream, (GDestroyNotify)exec_stream_clear);
}

/* exec_stream_send() with the lock held. */
static gboolean
exec_stream_send_locked(ExecStream *stream, VmMessage *message, GError **error)
{
    gboolean ok = TRUE;
    gboolean recording = g_atomic_int_get(&stream->recording);
    if (recording && message->op == VM_OP_STDIN) {
        gsize len = 0;
        const guint8 *data = vm_message_get_data(message, "data", &len);
        if (!stream->overflow && stream->sent->len + len <= VMCTL_EXEC_REPLAY_MAX)
            g_byte_array_append(stream->sent, data, (guint)len);
        else
            stream->overflow = TRUE;
    } else if (recording && message->op == VM_OP_STDIN_EOF) {
        stream->sent_eof = TRUE;
    }
    if (!stream->closed)
        ok = vm_message_write_fd(stream->fd, message, error);
    /* Kept input is not lost when a hostd that answers ELSEWHERE has closed: it goes again to
     * the host named; and a conversation that really broke is the main loop's to report. */
    if (!ok && recording && !stream->overflow) {
        g_clear_error(error);
        ok = TRUE;
    }
    return ok;
}

/* The terminal's size as a WINDOW_SIZE frame, or NULL when no terminal is there to measure. */
static VmMessage *
window_size_message(void)
{
    guint32 cols, rows;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);

    if (!vmctl_terminal_size(&cols, &rows))
        return NULL;
    g_variant_dict_insert(&fields, "cols", "u", cols);
    g_variant_dict_insert(&fields, "rows", "u", rows);
    return vm_message_new(VM_OP_WINDOW_SIZE, g_variant_dict_end(&fields), NULL);
}

/* Sends the new size, if one waits, with the lock held. A write that fails is hostd gone, which
 * the main loop reads and reports (a resize after hostd's EXIT is no error). */
static void
exec_stream_send_resize_locked(ExecStream *stream)
{
    if (!g_atomic_int_compare_and_exchange(&stream->resized, TRUE, FALSE))
        return;
    g_autoptr(VmMessage) message = window_size_message();
    if (message != NULL)
        (void)exec_stream_send_locked(stream, message, NULL);
}

static gboolean
exec_stream_send(ExecStream *stream, VmMessage *message, GError **error)
{
    g_mutex_lock(&stream->lock);
    gboolean ok = exec_stream_send_locked(stream, message, error);
    exec_stream_send_resize_locked(stream);
    g_mutex_unlock(&stream->lock);
    return ok;
}

/* The main loop's way to send a new size: only when that cannot wait, the lock free and room in
 * the socket, because the stdin thread holds the lock while its write waits for hostd to read,
 * and hostd may be waiting for the main loop to read its output. Otherwise the stdin thread
 * sends it after its frame, or the main loop tries again. */
static void
exec_stream_try_resize(ExecStream *stream)
{
    if (!g_mutex_trylock(&stream->lock))
        return;
    struct pollfd pfd = {.fd = stream->fd, .events = POLLOUT};
    /* A frame this small fits once poll says there is room: a Unix socket says so with at
     * least a quarter of its buffer free. */
    if (stream->closed || (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLOUT | POLLERR | POLLHUP))))
        exec_stream_send_resize_locked(stream);
    g_mutex_unlock(&stream->lock);
}

/* hostd answered with output: the stream stays where it is, nothing more is kept (what was kept
 * goes with the stream). Never waits for the lock: see recording. */
static void
exec_stream_commit(ExecStream *stream)
{
    g_atomic_int_set(&stream->recording, FALSE);
}

/* Moves the stream to @fd (a conversation with the host an ELSEWHERE named, its request sent)
 * and sends it the input kept. Fails with VM_ERROR_FAILED when more input went to the first host
 * than was kept. */
static gboolean
exec_stream_move(ExecStream *stream, int fd, const char *host, GError **error)
{
    gboolean ok = TRUE;

    /* A stdin thread blocked writing to the first hostd lets go of the lock. */
    shutdown(stream->fd, SHUT_RDWR);
    g_mutex_lock(&stream->lock);
    if (stream->overflow) {
        ok = vm_throw(error, VM_ERROR_FAILED,
                      "the agent is on host '%s', and more than %d bytes of input went to this "
                      "host first: run the command with --host set to that host",
                      host, VMCTL_EXEC_REPLAY_MAX);
    } else {
        stream->fd = fd;
        const guint8 *data = stream->sent->data;
        guint len = stream->sent->len;
        for (guint off = 0; ok && off < len; off += VM_STREAM_CHUNK_MAX) {
            g_autoptr(VmMessage) chunk =
                vm_message_new_data(VM_OP_STDIN, data + off, MIN(len - off, VM_STREAM_CHUNK_MAX));
            ok = vm_message_write_fd(fd, chunk, error);
        }
        if (ok && stream->sent_eof) {
            g_autoptr(VmMessage) eof = vm_message_new(VM_OP_STDIN_EOF, NULL, NULL);
            ok = vm_message_write_fd(fd, eof, error);
        }
    }
    g_atomic_int_set(&stream->recording, FALSE);
    g_mutex_unlock(&stream->lock);
    return ok;
}

/* Ends the stream: no frame is written after this returns. The socket is shut down first, so
 * that a stdin thread blocked writing to a hostd that does not read lets go of the lock. */
static void
exec_stream_close(ExecStream *stream)
{
    shutdown(stream->fd, SHUT_RDWR);
    g_mutex_lock(&stream->lock);
    stream->closed = TRUE;
    g_mutex_unlock(&stream->lock);
    exec_stream_unref(stream);
}

/* Forwards fd 0 as STDIN frames. Returns TRUE at the end of input (a read error, a closed stdin
 * included, counts as the end: the remote command sees EOF), FALSE when hostd is gone, which the
 * main loop reports. */
static gboolean
exec_forward_stdin(ExecStream *stream)
{
    g_autofree guint8 *buffer = NULL;

    if (stream->input != NULL) {
        gsize len;
        const guint8 *data = g_bytes_get_data(stream->input, &len);
        for (gsize off = 0; off < len; off += VM_STREAM_CHUNK_MAX) {
            g_autoptr(VmMessage) chunk =
                vm_message_new_data(VM_OP_STDIN, data + off, MIN(len - off, VM_STREAM_CHUNK_MAX));
            if (!exec_stream_send(stream, chunk, NULL))
                return FALSE;
        }
        return TRUE;
    }
    buffer = g_malloc(VM_STREAM_CHUNK_MAX);
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

static ExecStream *
exec_stream_start(int fd, GBytes *input)
{
    ExecStream *stream = g_atomic_rc_box_new0(ExecStream);

    g_mutex_init(&stream->lock);
    stream->fd = fd;
    stream->input = input != NULL ? g_bytes_ref(input) : NULL;
    g_atomic_int_set(&stream->recording, TRUE);
    stream->sent = g_byte_array_new();
    g_thread_unref(g_thread_new("vmctl-stdin", exec_stdin_thread, g_atomic_rc_box_acquire(stream)));
    return stream;
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

/* Takes what the signal pipe says. Returns TRUE and sets *ret_status when a signal ends the
 * stream; a SIGWINCH marks a new size to send (sizes that come faster than they go out are sent
 * once, the latest). */
static gboolean
exec_handle_signals(ExecStream *stream, int signal_fd, int *ret_status)
{
    guint8 signo;

    while (read(signal_fd, &signo, 1) == 1) {
        if (signo != SIGWINCH) {
            *ret_status = 128 + signo;
            return TRUE;
        }
        g_atomic_int_set(&stream->resized, TRUE);
    }
    return FALSE;
}

/* Handles one message of the stream. Returns TRUE and sets *ret_status when the stream is over
 * (EXIT, or a closed local stdout/stderr), or TRUE with @error set when it failed. */
static gboolean
exec_handle_message(VmStreamReader *reader, ExecStream *stream, VmctlProgress *progress,
                    int *ret_status, GError **error)
{
    g_autoptr(VmMessage) message = next_message(reader, NULL, 0, show_progress, progress, error);
    const guint8 *data;
    gsize len = 0;
    int status, err;

    if (message == NULL)
        return TRUE;
    if (message->op != VM_OP_PROGRESS)
        exec_stream_commit(stream);
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

/* An exec's ELSEWHERE (in *@error, with @reader's where): once, sends @request to the host named
 * on a new *@connection (the old one closed), moves @stream there and reads from it; the remote
 * is kept in *@remote, where it pointed in *@first. A second ELSEWHERE, or a failure, leaves
 * *@error set and returns FALSE. */
static gboolean
exec_follow(VmctlConnection **connection, VmctlRemote **remote, VmElsewhere *first,
            const VmMessage *request, ExecStream *stream, VmStreamReader *reader, GError **error)
{
    VmElsewhere where = reader->where;
    g_autoptr(VmMessage) again = NULL;

    g_clear_error(error);
    if (*remote != NULL)
        return vm_throw(error, VM_ERROR_FAILED,
                        "the request was sent on to host '%s', which sent it on to host '%s': "
                        "not following twice",
                        first->host, where.host);
    *first = where;
    if (!vmctl_follow_prepare(request, &where, remote, &again, error))
        return FALSE;
    VmctlEndpoint there = {.remote = *remote};
    g_autoptr(VmctlConnection) next = vmctl_connection_open(&there, error);
    if (next == NULL)
        return FALSE;
    if (!vm_message_write_fd(next->fd, again, error))
        return vmctl_connection_fail(next, error);
    if (!exec_stream_move(stream, next->fd, where.host, error))
        return vmctl_connection_fail(next, error);
    vmctl_connection_free(*connection);
    *connection = g_steal_pointer(&next);
    vm_stream_reader_init(reader, (*connection)->fd, request->op);
    return TRUE;
}

gboolean
vmctl_client_exec(const VmctlEndpoint *endpoint, const VmMessage *request, VmctlProgressMode mode,
                  gboolean raw_terminal, int *ret_status, GError **error)
{
    g_autoptr(VmctlRemote) remote = NULL;
    VmElsewhere first;
    g_autoptr(GError) local_error = NULL;
    int status = -1;
    ExecTerminal term;
    VmStreamReader reader;

    g_return_val_if_fail(vm_op_reply_end(request->op) == VM_OP_EXIT, FALSE);

    g_autoptr(VmctlConnection) connection = vmctl_connection_open(endpoint, error);
    if (connection == NULL)
        return FALSE;
    int fd = connection->fd;
    if (!vm_message_write_fd(fd, request, error))
        return vmctl_connection_fail(connection, error);

    vm_stream_reader_init(&reader, fd, request->op);
    ExecStream *stream = exec_stream_start(fd, NULL);
    g_autoptr(VmctlProgress) progress = vmctl_progress_new(mode, stderr);
    exec_terminal_setup(&term, raw_terminal);
    while (status < 0 && local_error == NULL) {
        struct pollfd fds[2] = {{.fd = fd, .events = POLLIN},
                                {.fd = term.pipe[0], .events = POLLIN}};
        /* A size still to send is tried again every 20 ms. */
        int wait_ms = g_atomic_int_get(&stream->resized) ? 20 : -1;
        if (poll(fds, term.pipe[0] >= 0 ? 2 : 1, wait_ms) < 0) {
            if (errno != EINTR)
                vm_throw_errno(&local_error, errno, "poll");
            continue;
        }
        if (fds[1].revents != 0 && exec_handle_signals(stream, term.pipe[0], &status))
            break;
        if (g_atomic_int_get(&stream->resized))
            exec_stream_try_resize(stream);
        if (fds[0].revents != 0)
            exec_handle_message(&reader, stream, progress, &status, &local_error);
        if (local_error != NULL && reader.elsewhere) {
            if (!exec_follow(&connection, &remote, &first, request, stream, &reader, &local_error))
                break;
            fd = connection->fd;
        }
    }
    exec_terminal_restore(&term);
    vmctl_progress_clear(progress);
    exec_stream_close(stream);
    if (local_error != NULL) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return vmctl_connection_fail(connection, error);
    }
    *ret_status = status;
    return TRUE;
}

void
vmctl_exec_output_free(VmctlExecOutput *output)
{
    if (output == NULL)
        return;
    g_byte_array_unref(output->out);
    g_byte_array_unref(output->err);
    g_free(output);
}

/* Keeps what fits of @len bytes at @data in @kept, at most @max bytes in all, and counts them
 * in @total. */
static void
capture_data(GByteArray *kept, guint64 *total, gsize max, const guint8 *data, gsize len)
{
    if (kept->len < max)
        g_byte_array_append(kept, data, (guint)MIN(len, max - kept->len));
    *total += len;
}

/* Runs the stream of an EXEC whose request went out, until EXIT. */
static gboolean
exec_capture_stream(VmStreamReader *reader, gsize max_output, gint64 deadline,
                    GCancellable *cancellable, VmProgressFunc progress, gpointer progress_data,
                    VmctlExecOutput *output, GError **error)
{
    for (;;) {
        g_autoptr(VmMessage) message =
            next_message(reader, cancellable, deadline, progress, progress_data, error);
        const guint8 *data;
        gsize len = 0;

        if (message == NULL)
            return FALSE;
        switch (message->op) {
        case VM_OP_PROGRESS:
            break;
        case VM_OP_STDOUT:
            data = vm_message_get_data(message, "data", &len);
            capture_data(output->out, &output->out_total, max_output, data, len);
            break;
        case VM_OP_STDERR:
            data = vm_message_get_data(message, "data", &len);
            capture_data(output->err, &output->err_total, max_output, data, len);
            break;
        case VM_OP_EXIT:
            output->status = vm_message_get_int(message, "status", 255);
            if (output->status < 0 || output->status > 255)
                output->status = 255;
            return TRUE;
        default: /* the reader lets nothing else through */
            return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                            vm_op_name(message->op));
        }
    }
}

/* vmctl_client_exec_capture() to one hostd: *@ret_elsewhere and *@ret_where set (and @error)
 * when it answered ELSEWHERE, which it does before any output. */
static gboolean
exec_capture_once(const VmctlEndpoint *endpoint, const VmMessage *request, GBytes *input,
                  gsize max_output, gint64 deadline, GCancellable *cancellable,
                  VmProgressFunc progress, gpointer progress_data, VmctlExecOutput **ret_output,
                  gboolean *ret_elsewhere, VmElsewhere *ret_where, GError **error)
{
    g_autoptr(VmctlExecOutput) output = g_new0(VmctlExecOutput, 1);
    g_autoptr(GError) local_error = NULL;
    guint timeout_ms =
        deadline > 0 ? (guint)((deadline - g_get_monotonic_time()) / G_TIME_SPAN_MILLISECOND) : 0;
    VmStreamReader reader;

    *ret_elsewhere = FALSE;
    output->out = g_byte_array_new();
    output->err = g_byte_array_new();
    g_autoptr(VmctlConnection) connection = vmctl_connection_open(endpoint, error);
    if (connection == NULL)
        return FALSE;
    if (!vm_message_write_fd(connection->fd, request, error))
        return vmctl_connection_fail(connection, error);

    vm_stream_reader_init(&reader, connection->fd, request->op);
    g_autoptr(GBytes) empty = input == NULL ? g_bytes_new(NULL, 0) : NULL;
    ExecStream *stream = exec_stream_start(connection->fd, input != NULL ? input : empty);
    gboolean ok = exec_capture_stream(&reader, max_output, deadline, cancellable, progress,
                                      progress_data, output, &local_error);
    exec_stream_close(stream);
    if (!ok) {
        *ret_elsewhere = reader.elsewhere;
        *ret_where = reader.where;
        if (g_error_matches(local_error, VM_ERROR, VM_ERROR_TIMEOUT)) {
            g_clear_error(&local_error);
            vm_throw(&local_error, VM_ERROR_TIMEOUT, "the command still ran after %u s",
                     (timeout_ms + 999) / 1000);
        }
        g_propagate_error(error, g_steal_pointer(&local_error));
        return vmctl_connection_fail(connection, error);
    }
    *ret_output = g_steal_pointer(&output);
    return TRUE;
}

typedef struct {
    GBytes *input;
    gsize max_output;
    gint64 deadline;
    GCancellable *cancellable;
    VmProgressFunc progress;
    gpointer progress_data;
    VmctlExecOutput **ret_output;
} CaptureTry;

static gboolean
capture_try(const VmctlEndpoint *endpoint, const VmMessage *request, gpointer data,
            gboolean *ret_elsewhere, VmElsewhere *ret_where, GError **error)
{
    CaptureTry *t = data;
    return exec_capture_once(endpoint, request, t->input, t->max_output, t->deadline,
                             t->cancellable, t->progress, t->progress_data, t->ret_output,
                             ret_elsewhere, ret_where, error);
}

gboolean
vmctl_client_exec_capture(const VmctlEndpoint *endpoint, const VmMessage *request, GBytes *input,
                          gsize max_output, guint timeout_ms, GCancellable *cancellable,
                          VmProgressFunc progress, gpointer progress_data,
                          VmctlExecOutput **ret_output, GError **error)
{
    g_return_val_if_fail(vm_op_reply_end(request->op) == VM_OP_EXIT, FALSE);

    /* The input is whole in memory: after an ELSEWHERE it goes again to the host named. */
    CaptureTry t = {
        .input = input,
        .max_output = max_output,
        .deadline = timeout_ms > 0
                        ? g_get_monotonic_time() + (gint64)timeout_ms * G_TIME_SPAN_MILLISECOND
                        : 0,
        .cancellable = cancellable,
        .progress = progress,
        .progress_data = progress_data,
        .ret_output = ret_output,
    };
    return client_follow(endpoint, request, capture_try, &t, NULL, error);
}

struct VmctlExecPipe {
    VmctlConnection *connection;
    VmStreamReader reader;
    GMutex lock;         /* serializes frames written, guards last_moved */
    gint64 last_moved;   /* monotonic usec of the last byte moved either way */
    gint64 idle_timeout; /* usec; 0: none */
    VmMessage *chunk;    /* the STDOUT frame vmctl_exec_pipe_read() last returned */
    GString *err;        /* the end of the command's stderr */
    int status;          /* -1 until EXIT */
    char *sha256;        /* the EXIT's, where it carried one */
};

VmctlExecPipe *
vmctl_exec_pipe_open(const VmctlEndpoint *endpoint, const VmMessage *request, guint idle_timeout_s,
                     GError **error)
{
    g_return_val_if_fail(vm_op_reply_end(request->op) == VM_OP_EXIT, NULL);

    g_autoptr(VmctlConnection) connection = vmctl_connection_open(endpoint, error);
    if (connection == NULL)
        return NULL;
    if (!vm_message_write_fd(connection->fd, request, error)) {
        vmctl_connection_fail(connection, error);
        return NULL;
    }
    VmctlExecPipe *channel = g_new0(VmctlExecPipe, 1);
    g_mutex_init(&channel->lock);
    channel->last_moved = g_get_monotonic_time();
    channel->idle_timeout = (gint64)idle_timeout_s * G_TIME_SPAN_SECOND;
    channel->err = g_string_new(NULL);
    channel->status = -1;
    vm_stream_reader_init(&channel->reader, connection->fd, request->op);
    channel->connection = g_steal_pointer(&connection);
    return channel;
}

static void
exec_pipe_moved(VmctlExecPipe *channel)
{
    g_mutex_lock(&channel->lock);
    channel->last_moved = g_get_monotonic_time();
    g_mutex_unlock(&channel->lock);
}

static gboolean
exec_pipe_send(VmctlExecPipe *channel, VmMessage *message, GError **error)
{
    g_mutex_lock(&channel->lock);
    gboolean ok = vm_message_write_fd(channel->connection->fd, message, error);
    if (ok)
        channel->last_moved = g_get_monotonic_time();
    g_mutex_unlock(&channel->lock);
    return ok;
}

gboolean
vmctl_exec_pipe_write(VmctlExecPipe *channel, const void *data, gsize len, GError **error)
{
    const guint8 *bytes = data;

    for (gsize off = 0; off < len; off += VM_STREAM_CHUNK_MAX) {
        g_autoptr(VmMessage) chunk =
            vm_message_new_data(VM_OP_STDIN, bytes + off, MIN(len - off, VM_STREAM_CHUNK_MAX));
        if (!exec_pipe_send(channel, chunk, error))
            return FALSE;
    }
    return TRUE;
}

gboolean
vmctl_exec_pipe_close_input(VmctlExecPipe *channel, GError **error)
{
    g_autoptr(VmMessage) eof = vm_message_new(VM_OP_STDIN_EOF, NULL, error);

    return eof != NULL && exec_pipe_send(channel, eof, error);
}

/* Waits until the connection has something to read, failing once nothing moved for the idle
 * timeout: a writer on another thread moving bytes counts as life. */
static gboolean
exec_pipe_wait(VmctlExecPipe *channel, GError **error)
{
    for (;;) {
        struct pollfd pfd = {.fd = channel->connection->fd, .events = POLLIN};
        int n = poll(&pfd, 1, channel->idle_timeout > 0 ? 1000 : -1);
        if (n > 0)
            return TRUE;
        if (n < 0 && errno != EINTR)
            return vm_throw_errno(error, errno, "poll");
        g_mutex_lock(&channel->lock);
        gint64 idle = g_get_monotonic_time() - channel->last_moved;
        g_mutex_unlock(&channel->lock);
        if (channel->idle_timeout > 0 && idle >= channel->idle_timeout)
            return vm_throw(error, VM_ERROR_TIMEOUT, "nothing moved for %" G_GINT64_FORMAT " s",
                            channel->idle_timeout / G_TIME_SPAN_SECOND);
    }
}

gssize
vmctl_exec_pipe_read(VmctlExecPipe *channel, const guint8 **ret_data, GError **error)
{
    g_clear_pointer(&channel->chunk, vm_message_free);
    while (channel->status < 0) {
        if (!exec_pipe_wait(channel, error))
            return -1;
        g_autoptr(VmMessage) message = vm_stream_reader_next(&channel->reader, error);
        const guint8 *data;
        gsize len = 0;

        if (message == NULL)
            return -1;
        exec_pipe_moved(channel);
        switch (message->op) {
        case VM_OP_PROGRESS:
            break;
        case VM_OP_STDOUT:
            data = vm_message_get_data(message, "data", &len);
            if (len == 0)
                break;
            *ret_data = data;
            channel->chunk = g_steal_pointer(&message);
            return (gssize)len;
        case VM_OP_STDERR:
            data = vm_message_get_data(message, "data", &len);
            g_string_append_len(channel->err, (const char *)data, (gssize)len);
            if (channel->err->len > VMCTL_EXEC_PIPE_STDERR_MAX)
                g_string_erase(channel->err, 0,
                               (gssize)(channel->err->len - VMCTL_EXEC_PIPE_STDERR_MAX));
            break;
        case VM_OP_EXIT:
            g_free(channel->sha256);
            channel->sha256 = g_strdup(vm_message_get_string(message, "sha256", NULL));
            channel->status = vm_message_get_int(message, "status", 255);
            if (channel->status < 0 || channel->status > 255)
                channel->status = 255;
            break;
        default: /* the reader lets nothing else through */
            vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                     vm_op_name(message->op));
            return -1;
        }
    }
    return 0;
}

int
vmctl_exec_pipe_status(const VmctlExecPipe *channel)
{
    return channel->status;
}

const char *
vmctl_exec_pipe_sha256(const VmctlExecPipe *channel)
{
    return channel->sha256;
}

const char *
vmctl_exec_pipe_stderr(const VmctlExecPipe *channel)
{
    return channel->err->str;
}

void
vmctl_exec_pipe_abort(VmctlExecPipe *channel)
{
    shutdown(channel->connection->fd, SHUT_RDWR);
}

gboolean
vmctl_exec_pipe_fail(VmctlExecPipe *channel, GError **error)
{
    return vmctl_connection_fail(channel->connection, error);
}

void
vmctl_exec_pipe_free(VmctlExecPipe *channel)
{
    if (channel == NULL)
        return;
    vmctl_connection_free(channel->connection);
    g_clear_pointer(&channel->chunk, vm_message_free);
    g_string_free(channel->err, TRUE);
    g_free(channel->sha256);
    g_mutex_clear(&channel->lock);
    g_free(channel);
}
