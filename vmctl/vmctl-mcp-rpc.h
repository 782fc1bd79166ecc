/* JSON-RPC 2.0 as MCP's stdio transport carries it: one message a line (UTF-8 JSON without a
 * newline inside), requests answered in any order, notifications never answered.
 *
 * The server reads lines, checks them (size, nesting, UTF-8, JSON, the shape of a request) and
 * hands each to the method of its name in a table: on the reading thread, or for a method marked
 * threaded on a worker thread of its own, so that a long call does not hold the others up and can
 * be cancelled while it runs. Answers and notifications go out whole, one at a time, through a
 * write function. Batches (a JSON array) are refused: MCP 2025-06-18 dropped them.
 */
#pragma once

#include <gio/gio.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

#define VMCTL_RPC_MESSAGE_MAX (4 * 1024 * 1024) /* bytes of one line */
#define VMCTL_RPC_DEPTH_MAX   64                /* arrays and objects inside one another */
#define VMCTL_RPC_CALLS_MAX   64                /* requests in flight at once */

/* The error codes of JSON-RPC 2.0. */
#define VMCTL_RPC_PARSE_ERROR      (-32700)
#define VMCTL_RPC_INVALID_REQUEST  (-32600)
#define VMCTL_RPC_METHOD_NOT_FOUND (-32601)
#define VMCTL_RPC_INVALID_PARAMS   (-32602)
#define VMCTL_RPC_INTERNAL_ERROR   (-32603)
#define VMCTL_RPC_SERVER_BUSY      (-32000) /* more than VMCTL_RPC_CALLS_MAX in flight */

typedef struct VmctlRpcServer VmctlRpcServer;

/* One request or notification being handled. */
typedef struct VmctlRpcCall VmctlRpcCall;

/* Writes @len bytes of @line, one whole message ending in '\n'. Called with the server's write
 * lock held, from any thread. Returns FALSE when the peer is gone: nothing more is written. */
typedef gboolean (*VmctlRpcWriteFunc)(const char *line, gsize len, gpointer user_data);

/* Handles @call, whose "params" are @params (NULL when absent). A request's method answers it
 * with vmctl_rpc_call_return() or vmctl_rpc_call_fail() before it returns; one that does not is
 * answered with an internal error. */
typedef void (*VmctlRpcMethodFunc)(VmctlRpcCall *call, JsonObject *params, gpointer user_data);

typedef struct {
    const char *name;
    VmctlRpcMethodFunc func;
    gboolean notification; /* handles a notification (no id), else a request */
    gboolean threaded;     /* runs on a worker thread; the reader goes on */
} VmctlRpcMethod;

/* A server dispatching to the @n_methods @methods (not copied: they must outlive it), with
 * @user_data for them, writing through @write with @write_data. Can't fail. */
VmctlRpcServer *vmctl_rpc_server_new(const VmctlRpcMethod *methods, gsize n_methods,
                                     gpointer user_data, VmctlRpcWriteFunc write,
                                     gpointer write_data);

/* Waits for the calls in flight, then frees @server; accepts NULL. */
void vmctl_rpc_server_free(VmctlRpcServer *server);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmctlRpcServer, vmctl_rpc_server_free)

/* Handles one message, @len bytes at @line (without its newline; need not be NUL-terminated).
 * What is wrong with it is answered as JSON-RPC says: -32700 for what is not JSON (or over the
 * size, nesting or UTF-8 rules), -32600 for JSON that is not a request (a batch included),
 * -32601 for an unknown method; but a notification is never answered. Responses (the client
 * answering a request the server never sends) are dropped. Can't fail. */
void vmctl_rpc_server_handle(VmctlRpcServer *server, const char *line, gsize len);

/* Reads messages from @fd, one a line ('\r\n' too; blank lines skipped), and handles them until
 * the end of @fd or until the peer stops reading what is written; then waits for the calls in
 * flight. A line over VMCTL_RPC_MESSAGE_MAX is skipped to its end and answered with a parse
 * error. Fails with VM_ERROR_IO when reading fails. */
gboolean vmctl_rpc_server_run(VmctlRpcServer *server, int fd, GError **error);

/* Cancels the request in flight whose id is @id, if there is one: its cancellable fires and its
 * answer is not sent. Can't fail. */
void vmctl_rpc_server_cancel(VmctlRpcServer *server, JsonNode *id);

/* Sends the notification @method with @params (an object, consumed; NULL for none). Can't fail
 * (a peer that is gone only misses it). */
void vmctl_rpc_server_notify(VmctlRpcServer *server, const char *method, JsonNode *params);

/* Whether the peer has stopped reading what is written. */
gboolean vmctl_rpc_server_is_broken(VmctlRpcServer *server);

/* The server handling @call. */
VmctlRpcServer *vmctl_rpc_call_get_server(VmctlRpcCall *call);

/* Fires when the client cancels @call, or once the server cannot answer any more. Owned by the
 * call. */
GCancellable *vmctl_rpc_call_get_cancellable(VmctlRpcCall *call);

/* Answers @call with @result (consumed; NULL means an empty object). Ignored for a notification,
 * a cancelled call, or a call already answered. */
void vmctl_rpc_call_return(VmctlRpcCall *call, JsonNode *result);

/* Answers @call with the error @code and a printf-style message; ignored like
 * vmctl_rpc_call_return(). */
void vmctl_rpc_call_fail(VmctlRpcCall *call, int code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

G_END_DECLS
