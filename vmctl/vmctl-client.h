/* vmctl's side of the hostd conversation: one request per connection, then either PROGRESS*
 * and a RESULT or ERROR, or (for EXEC) a stream of stdin/stdout/stderr frames ending in EXIT.
 * The connection is hostd's socket, or for a remote hostd an ssh (vmctl-remote.h) that carries
 * the same frames.
 */
#pragma once

#include "vm-progress.h"
#include "vm-protocol.h"
#include "vm-stream.h"
#include "vmctl-output.h"
#include "vmctl-remote.h"

#include <gio/gio.h>

G_BEGIN_DECLS

/* Where hostd is: its socket on this host, or a remote host reached over SSH. */
typedef struct {
    const char *socket_path;   /* hostd's socket here; unused with @remote */
    const VmctlRemote *remote; /* NULL: hostd runs on this host */
} VmctlEndpoint;

/* One conversation with hostd: the socket, and for a remote hostd the ssh that carries it. */
typedef struct VmctlConnection VmctlConnection;

/* Connects to hostd at @socket_path and returns the connected blocking socket (close-on-exec).
 * Fails with VM_ERROR_NOT_RUNNING: "hostd is not running at PATH" when there is no socket,
 * "nothing listens on PATH" when there is one but no hostd behind it; VM_ERROR_PERMISSION
 * when the socket is not open to this user (the message names hostd's socket-group, the
 * socket's group when it has one); VM_ERROR_INVALID_ARGUMENT for a path too long for a Unix
 * socket; VM_ERROR_IO otherwise. */
int vmctl_client_connect(const char *socket_path, GError **error);

/* Where vmctl looks for hostd when neither --socket nor $VMCTL_SOCKET says, in this order: the
 * user's own hostd ($XDG_DATA_HOME/hostd/hostd.sock; not for root), then the system's
 * ($VMCTL_SYSTEM_SOCKET, else VM_SYSTEM_STATE_DIR/hostd.sock). Newly allocated,
 * NULL-terminated, never empty; can't fail. */
char **vmctl_socket_candidates(void);

/* The first of @candidates (NULL-terminated, not empty) that exists, or whose directory this
 * user cannot search (connecting then says why); one that nothing listens on is passed over for
 * a later one that exists (it is connected to, and closed, to tell). Fails with
 * VM_ERROR_NOT_RUNNING "hostd is not running: no socket at A or B" when none exists. Newly
 * allocated. */
char *vmctl_socket_find(const char *const *candidates, GError **error);

/* Opens a conversation with hostd at @endpoint: vmctl_client_connect(), or for a remote one
 * vmctl_remote_connect(). Fails like them. Free with vmctl_connection_free(). */
VmctlConnection *vmctl_connection_open(const VmctlEndpoint *endpoint, GError **error);

/* The socket of @connection (owned by it): frames are written to and read from it. */
int vmctl_connection_get_fd(const VmctlConnection *connection);

/* Closes the socket of @connection, so that hostd (through ssh and the remote bridge) sees the
 * client go away, and waits for ssh to end: a short grace, then SIGTERM. Then, when @error
 * holds the failure the conversation ended with and ssh's own failure is why (it exited with
 * 255 or 127 and said something: no connection, no login, no vmctl on the remote), replaces it
 * with VM_ERROR_NOT_RUNNING "cannot reach hostd on HOST: <ssh's last line>". Local
 * connections are only closed. Returns FALSE (a throw helper for a failed conversation). */
gboolean vmctl_connection_fail(VmctlConnection *connection, GError **error);

/* Closes @connection (as vmctl_connection_fail() without an error) and frees it; accepts
 * NULL. */
void vmctl_connection_free(VmctlConnection *connection);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmctlConnection, vmctl_connection_free)

/* Sends @request to hostd at @endpoint and returns the RESULT in @ret_result (owned by the
 * caller). Every PROGRESS goes to @progress (may be NULL) on the calling thread. While waiting,
 * @cancellable (may be NULL) ends the conversation with VM_ERROR_CANCELLED "cancelled": the
 * connection is closed, which hostd takes as the client going away. Fails with the error hostd
 * sent (same code and message), VM_ERROR_NOT_RUNNING when hostd is not there (or ssh cannot
 * reach it), VM_ERROR_PROTOCOL when the connection ends early or hostd answers with an
 * unexpected message, VM_ERROR_IO on a socket error. Safe to call from several threads. */
gboolean vmctl_client_request(const VmctlEndpoint *endpoint, const VmMessage *request,
                              GCancellable *cancellable, VmProgressFunc progress,
                              gpointer progress_data, VmMessage **ret_result, GError **error);

/* vmctl_client_request() that says where it went: when hostd answered ELSEWHERE (the request
 * is for another host of the fleet), the request went there once, and *@ret_followed (may be
 * NULL) is that host's remote (left alone otherwise). A second ELSEWHERE fails with
 * VM_ERROR_FAILED naming both hosts. vmctl_client_request() follows the same way. */
gboolean vmctl_client_request_follow(const VmctlEndpoint *endpoint, const VmMessage *request,
                                     GCancellable *cancellable, VmProgressFunc progress,
                                     gpointer progress_data, VmMessage **ret_result,
                                     VmctlRemote **ret_followed, GError **error);

/* What following @where means for @request: the remote its address names
 * (VM_ERROR_INVALID_ARGUMENT for an address that is not ssh://...) and the request sent there,
 * the same but for a new agent, which is pinned to the host chosen ("on" it): it is made there,
 * not placed again. */
gboolean vmctl_follow_prepare(const VmMessage *request, const VmElsewhere *where,
                              VmctlRemote **ret_remote, VmMessage **ret_request, GError **error);

/* vmctl_client_request_follow() for the command line: shows every PROGRESS on stderr as @mode
 * says. */
gboolean vmctl_client_call(const VmctlEndpoint *endpoint, const VmMessage *request,
                           VmctlProgressMode mode, VmMessage **ret_result,
                           VmctlRemote **ret_followed, GError **error);

/* Sends the EXEC @request and runs the stream until EXIT: stdin (fd 0) is forwarded in STDIN
 * frames and ended with STDIN_EOF, STDOUT/STDERR frames are written to fds 1 and 2 unbuffered.
 * With @raw_terminal (and a terminal on fd 0) the terminal is put in raw mode for the duration,
 * restored on every way out including SIGINT/SIGTERM/SIGHUP/SIGQUIT, and SIGWINCH is forwarded as
 * WINDOW_SIZE. Returns the remote exit status in @ret_status; a local signal ends the stream with
 * 128 + its number, a closed local stdout with 141 (SIGPIPE's). Fails like vmctl_client_call(). */
gboolean vmctl_client_exec(const VmctlEndpoint *endpoint, const VmMessage *request,
                           VmctlProgressMode mode, gboolean raw_terminal, int *ret_status,
                           GError **error);

/* What vmctl_client_exec_capture() kept of a command's run. */
typedef struct {
    GByteArray *out;   /* the first max_output bytes of stdout */
    GByteArray *err;   /* the first max_output bytes of stderr */
    guint64 out_total; /* bytes of stdout there were, kept or not */
    guint64 err_total; /* bytes of stderr there were */
    int status;        /* the command's exit status, 128 + N for signal N */
} VmctlExecOutput;

void vmctl_exec_output_free(VmctlExecOutput *output);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmctlExecOutput, vmctl_exec_output_free)

/* Sends the EXEC @request with @input (may be NULL: none) as its stdin, then STDIN_EOF, and
 * collects its output: at most @max_output bytes of each of stdout and stderr are kept, the rest
 * is read and counted. PROGRESS goes to @progress (may be NULL). Ends early with
 * VM_ERROR_TIMEOUT "the command still ran after N s" once @timeout_ms (0: none) passes and with
 * VM_ERROR_CANCELLED "cancelled" when @cancellable (may be NULL) fires; either way the
 * connection is closed, which hostd takes as the client going away. Returns the output in
 * @ret_output (owned by the caller). Otherwise fails like vmctl_client_request(). Safe to call
 * from several threads; touches no terminal, signal or standard fd. */
gboolean vmctl_client_exec_capture(const VmctlEndpoint *endpoint, const VmMessage *request,
                                   GBytes *input, gsize max_output, guint timeout_ms,
                                   GCancellable *cancellable, VmProgressFunc progress,
                                   gpointer progress_data, VmctlExecOutput **ret_output,
                                   GError **error);

/* An EXEC whose stdin and stdout the caller drives itself, as bytes (vmctl cp's tar streams):
 * one thread may write its stdin while another reads its stdout. Its stderr is kept (the last
 * VMCTL_EXEC_PIPE_STDERR_MAX bytes) for the caller's message. */
typedef struct VmctlExecPipe VmctlExecPipe;

#define VMCTL_EXEC_PIPE_STDERR_MAX 4096

/* Sends the EXEC @request to hostd at @endpoint. The transfer fails with VM_ERROR_TIMEOUT once
 * no byte moved either way (nor any PROGRESS came) for @idle_timeout_s seconds (0: never).
 * Fails like vmctl_connection_open(), or VM_ERROR_IO when the request cannot be sent. Free with
 * vmctl_exec_pipe_free(). */
VmctlExecPipe *vmctl_exec_pipe_open(const VmctlEndpoint *endpoint, const VmMessage *request,
                                    guint idle_timeout_s, GError **error);

/* Sends @len bytes of @data as the command's stdin (in frames of at most VM_STREAM_CHUNK_MAX).
 * Blocks while hostd does not read; vmctl_exec_pipe_abort() from another thread ends the wait.
 * Fails with VM_ERROR_IO when hostd is gone. */
gboolean vmctl_exec_pipe_write(VmctlExecPipe *channel, const void *data, gsize len, GError **error);

/* Ends the command's stdin (STDIN_EOF). Fails like vmctl_exec_pipe_write(). */
gboolean vmctl_exec_pipe_close_input(VmctlExecPipe *channel, GError **error);

/* Waits for the command's next stdout bytes and points @ret_data at them (owned by @channel, valid
 * until the next call). Returns their number, or 0 once the command has ended (its status is
 * then vmctl_exec_pipe_status()), or -1 with @error set: hostd's error, VM_ERROR_TIMEOUT after
 * the idle timeout, VM_ERROR_PROTOCOL or VM_ERROR_IO for a broken conversation. Only one thread
 * may read. */
gssize vmctl_exec_pipe_read(VmctlExecPipe *channel, const guint8 **ret_data, GError **error);

/* The command's exit status (128 + N for signal N) once vmctl_exec_pipe_read() returned 0; -1
 * before. */
int vmctl_exec_pipe_status(const VmctlExecPipe *channel);

/* The SHA-256 (hex) the EXIT carried once vmctl_exec_pipe_read() returned 0 (a move's file);
 * NULL before, and when it carried none. */
const char *vmctl_exec_pipe_sha256(const VmctlExecPipe *channel);
/* The end of what the command wrote on its stderr so far, as it came (not escaped). */
const char *vmctl_exec_pipe_stderr(const VmctlExecPipe *channel);

/* Shuts the conversation down from any thread: a write or read blocked on it returns with an
 * error, and hostd ends the command. Can't fail. */
void vmctl_exec_pipe_abort(VmctlExecPipe *channel);

/* For a conversation that failed with @error: closes it and, for a remote hostd, replaces a
 * broken conversation's error with ssh's reason (vmctl_connection_fail()). Returns FALSE. */
gboolean vmctl_exec_pipe_fail(VmctlExecPipe *channel, GError **error);

/* Closes the conversation (hostd ends a command still running) and frees @channel; accepts NULL.
 * No other thread may still use it. */
void vmctl_exec_pipe_free(VmctlExecPipe *channel);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmctlExecPipe, vmctl_exec_pipe_free)

/* Reads the size of the terminal on stdout (else stdin). Returns FALSE when neither is a
 * terminal; @ret_cols and @ret_rows are written only on success. */
gboolean vmctl_terminal_size(guint32 *ret_cols, guint32 *ret_rows);

G_END_DECLS
