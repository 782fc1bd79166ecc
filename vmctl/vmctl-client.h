/* vmctl's side of the hostd conversation: one request per connection, then either PROGRESS*
 * and a RESULT or ERROR, or (for EXEC) a stream of stdin/stdout/stderr frames ending in EXIT.
 */
#pragma once

#include "vm-protocol.h"
#include "vmctl-output.h"

#include <glib.h>

G_BEGIN_DECLS

/* Connects to hostd at @socket_path and returns the connected blocking socket (close-on-exec).
 * Fails with VM_ERROR_NOT_RUNNING ("hostd is not running at PATH") when nothing listens there,
 * VM_ERROR_INVALID_ARGUMENT for a path too long for a Unix socket, VM_ERROR_IO otherwise. */
int vmctl_client_connect(const char *socket_path, GError **error);

/* Sends @request to hostd at @socket_path, shows every PROGRESS on stderr as @mode says, and
 * returns the RESULT in @ret_result (owned by the caller). Fails with the error hostd sent
 * (same code and message), VM_ERROR_NOT_RUNNING when hostd is not there, VM_ERROR_PROTOCOL when
 * the connection ends early or hostd answers with an unexpected message, VM_ERROR_IO on a socket
 * error. */
gboolean vmctl_client_call(const char *socket_path, const VmMessage *request,
                           VmctlProgressMode mode, VmMessage **ret_result, GError **error);

/* Sends the EXEC @request and runs the stream until EXIT: stdin (fd 0) is forwarded in STDIN
 * frames and ended with STDIN_EOF, STDOUT/STDERR frames are written to fds 1 and 2 unbuffered.
 * With @raw_terminal (and a terminal on fd 0) the terminal is put in raw mode for the duration,
 * restored on every way out including SIGINT/SIGTERM/SIGHUP/SIGQUIT, and SIGWINCH is forwarded as
 * WINDOW_SIZE. Returns the remote exit status in @ret_status; a local signal ends the stream with
 * 128 + its number, a closed local stdout with 141 (SIGPIPE's). Fails like vmctl_client_call(). */
gboolean vmctl_client_exec(const char *socket_path, const VmMessage *request,
                           VmctlProgressMode mode, gboolean raw_terminal, int *ret_status,
                           GError **error);

/* Reads the size of the terminal on stdout (else stdin). Returns FALSE when neither is a
 * terminal; @ret_cols and @ret_rows are written only on success. */
gboolean vmctl_terminal_size(guint32 *ret_cols, guint32 *ret_rows);

G_END_DECLS
