#include "vmctl-mcp-rpc.h"

#include "vm-error.h"
#include "vm-util.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#define READ_CHUNK (64 * 1024)

struct VmctlRpcServer {
    const VmctlRpcMethod *methods;
    gsize n_methods;
    gpointer user_data;
    VmctlRpcWriteFunc write;
    gpointer write_data;
    GMutex write_lock; /* one message at a time on the way out */
    gint broken;       /* the peer stopped reading (atomic) */

    GMutex lock;       /* guards what follows */
    GCond idle;        /* signalled when running drops to 0 */
    GHashTable *calls; /* id key -> VmctlRpcCall: the requests in flight */
    guint running;     /* calls not finished, notifications included */
    GThreadPool *pool; /* the threaded methods' workers */
};

struct VmctlRpcCall {
    VmctlRpcServer *server;
    const VmctlRpcMethod *method;
    JsonNode *message; /* holds the params alive */
    JsonObject *params;
    JsonNode *id; /* NULL for a notification */
    char *key;    /* the id as a key of calls */
    GCancellable *cancellable;
    gint cancelled; /* atomic: its answer is not sent */
    gboolean answered;
};

/* A node holding @object, taking the caller's reference (json_node_init_object() adds one). */
static JsonNode *
node_take_object(JsonObject *object)
{
    JsonNode *node = json_node_new(JSON_NODE_OBJECT);

    json_node_take_object(node, object);
    return node;
}

/* The id as a key: strings and integers never collide. */
static char *
id_key(JsonNode *id)
{
    if (JSON_NODE_HOLDS_VALUE(id) && json_node_get_value_type(id) == G_TYPE_STRING)
        return g_strconcat("s:", json_node_get_string(id), NULL);
    return g_strdup_printf("i:%" G_GINT64_FORMAT, json_node_get_int(id));
}

/* An id JSON-RPC allows and MCP keeps: a string or an integer, not null. */
static gboolean
id_is_valid(JsonNode *id)
{
    if (id == NULL || !JSON_NODE_HOLDS_VALUE(id))
        return FALSE;
    return json_node_get_value_type(id) == G_TYPE_STRING ||
           json_node_get_value_type(id) == G_TYPE_INT64;
}

static void cancel_all(VmctlRpcServer *server);

static void
send_message(VmctlRpcServer *server, JsonObject *message)
{
    g_autoptr(JsonNode) node = json_node_init_object(json_node_alloc(), message);
    g_autofree char *text = json_to_string(node, FALSE);
    g_autofree char *line = g_strconcat(text, "\n", NULL);
    gboolean now_broken = FALSE;

    g_mutex_lock(&server->write_lock);
    if (!g_atomic_int_get(&server->broken) &&
        !server->write(line, strlen(line), server->write_data)) {
        g_atomic_int_set(&server->broken, 1);
        now_broken = TRUE;
    }
    g_mutex_unlock(&server->write_lock);
    if (now_broken)
        cancel_all(server);
}

/* "jsonrpc" goes first: build the object in the order it is read. */
static JsonObject *
message_new(void)
{
    JsonObject *message = json_object_new();

    json_object_set_string_member(message, "jsonrpc", "2.0");
    return message;
}

static void
send_error(VmctlRpcServer *server, JsonNode *id, int code, const char *message)
{
    g_autoptr(JsonObject) reply = message_new();
    JsonObject *error = json_object_new();

    if (id != NULL)
        json_object_set_member(reply, "id", json_node_copy(id));
    else
        json_object_set_null_member(reply, "id");
    /* A message may quote the peer's words, cut anywhere: JSON text must be UTF-8. */
    g_autofree char *text = g_utf8_make_valid(message, -1);

    json_object_set_int_member(error, "code", code);
    json_object_set_string_member(error, "message", text);
    json_object_set_object_member(reply, "error", error);
    send_message(server, reply);
}

static void send_errorf(VmctlRpcServer *server, JsonNode *id, int code, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static void
send_errorf(VmctlRpcServer *server, JsonNode *id, int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_autofree char *message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    send_error(server, id, code, message);
}

VmctlRpcServer *
vmctl_rpc_server_new(const VmctlRpcMethod *methods, gsize n_methods, gpointer user_data,
                     VmctlRpcWriteFunc write, gpointer write_data)
{
    VmctlRpcServer *server = g_new0(VmctlRpcServer, 1);

    server->methods = methods;
    server->n_methods = n_methods;
    server->user_data = user_data;
    server->write = write;
    server->write_data = write_data;
    g_mutex_init(&server->write_lock);
    g_mutex_init(&server->lock);
    g_cond_init(&server->idle);
    server->calls = g_hash_table_new(g_str_hash, g_str_equal);
    return server;
}

static void
wait_idle(VmctlRpcServer *server)
{
    g_mutex_lock(&server->lock);
    while (server->running > 0)
        g_cond_wait(&server->idle, &server->lock);
    g_mutex_unlock(&server->lock);
}

void
vmctl_rpc_server_free(VmctlRpcServer *server)
{
    if (server == NULL)
        return;
    wait_idle(server);
    if (server->pool != NULL)
        g_thread_pool_free(server->pool, FALSE, TRUE);
    g_hash_table_unref(server->calls);
    g_cond_clear(&server->idle);
    g_mutex_clear(&server->lock);
    g_mutex_clear(&server->write_lock);
    g_free(server);
}

gboolean
vmctl_rpc_server_is_broken(VmctlRpcServer *server)
{
    return g_atomic_int_get(&server->broken);
}

VmctlRpcServer *
vmctl_rpc_call_get_server(VmctlRpcCall *call)
{
    return call->server;
}

GCancellable *
vmctl_rpc_call_get_cancellable(VmctlRpcCall *call)
{
    return call->cancellable;
}

/* Whether @call still takes an answer; marks it answered. */
static gboolean
call_take_answer(VmctlRpcCall *call)
{
    if (call->id == NULL || call->answered)
        return FALSE;
    call->answered = TRUE;
    return !g_atomic_int_get(&call->cancelled);
}

void
vmctl_rpc_call_return(VmctlRpcCall *call, JsonNode *result)
{
    g_autoptr(JsonNode) owned = result;

    if (!call_take_answer(call))
        return;
    g_autoptr(JsonObject) reply = message_new();
    json_object_set_member(reply, "id", json_node_copy(call->id));
    json_object_set_member(reply, "result",
                           owned != NULL ? g_steal_pointer(&owned)
                                         : node_take_object(json_object_new()));
    send_message(call->server, reply);
}

void
vmctl_rpc_call_fail(VmctlRpcCall *call, int code, const char *fmt, ...)
{
    va_list ap;

    if (!call_take_answer(call))
        return;
    va_start(ap, fmt);
    g_autofree char *message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    send_error(call->server, call->id, code, message);
}

static void
call_free(VmctlRpcCall *call)
{
    json_node_unref(call->message);
    if (call->id != NULL)
        json_node_unref(call->id);
    g_free(call->key);
    g_object_unref(call->cancellable);
    g_free(call);
}

/* Runs @call's method, answers it if the method did not, and forgets it. */
static void
call_run(VmctlRpcCall *call)
{
    VmctlRpcServer *server = call->server;

    call->method->func(call, call->params, server->user_data);
    vmctl_rpc_call_fail(call, VMCTL_RPC_INTERNAL_ERROR, "Internal error: %s gave no answer",
                        call->method->name);
    g_mutex_lock(&server->lock);
    if (call->key != NULL)
        g_hash_table_remove(server->calls, call->key);
    if (--server->running == 0)
        g_cond_broadcast(&server->idle);
    g_mutex_unlock(&server->lock);
    call_free(call);
}

static void
pool_run(gpointer data, gpointer user_data)
{
    call_run(data);
}

static void
cancel_all(VmctlRpcServer *server)
{
    GHashTableIter iter;
    gpointer value;

    g_mutex_lock(&server->lock);
    g_hash_table_iter_init(&iter, server->calls);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        VmctlRpcCall *call = value;
        g_atomic_int_set(&call->cancelled, 1);
        g_cancellable_cancel(call->cancellable);
    }
    g_mutex_unlock(&server->lock);
}

void
vmctl_rpc_server_cancel(VmctlRpcServer *server, JsonNode *id)
{
    if (!id_is_valid(id))
        return;
    g_autofree char *key = id_key(id);
    g_mutex_lock(&server->lock);
    VmctlRpcCall *call = g_hash_table_lookup(server->calls, key);
    if (call != NULL) {
        g_atomic_int_set(&call->cancelled, 1);
        g_cancellable_cancel(call->cancellable);
    }
    g_mutex_unlock(&server->lock);
}

void
vmctl_rpc_server_notify(VmctlRpcServer *server, const char *method, JsonNode *params)
{
    g_autoptr(JsonNode) owned = params;
    g_autoptr(JsonObject) message = message_new();

    json_object_set_string_member(message, "method", method);
    if (owned != NULL)
        json_object_set_member(message, "params", g_steal_pointer(&owned));
    send_message(server, message);
}

/* Whether every number in @node is finite: json-glib reads 1e999 as infinity, which no JSON
 * text can carry back out. */
static gboolean
numbers_are_finite(JsonNode *node)
{
    if (JSON_NODE_HOLDS_VALUE(node))
        return json_node_get_value_type(node) != G_TYPE_DOUBLE ||
               isfinite(json_node_get_double(node));
    if (JSON_NODE_HOLDS_ARRAY(node)) {
        JsonArray *array = json_node_get_array(node);
        for (guint i = 0; i < json_array_get_length(array); i++) {
            if (!numbers_are_finite(json_array_get_element(array, i)))
                return FALSE;
        }
    } else if (JSON_NODE_HOLDS_OBJECT(node)) {
        JsonObjectIter iter;
        JsonNode *member;
        json_object_iter_init(&iter, json_node_get_object(node));
        while (json_object_iter_next(&iter, NULL, &member)) {
            if (!numbers_are_finite(member))
                return FALSE;
        }
    }
    return TRUE;
}

/* Parses one message. Returns its root, or NULL with what is wrong in @ret_why. */
static JsonNode *
parse_message(const char *line, gsize len, char **ret_why)
{
    g_autoptr(JsonParser) parser = NULL;
    g_autoptr(GError) error = NULL;

    if (len > VMCTL_RPC_MESSAGE_MAX) {
        *ret_why = g_strdup_printf("a message is larger than %d bytes", VMCTL_RPC_MESSAGE_MAX);
        return NULL;
    }
    if (!g_utf8_validate_len(line, len, NULL)) {
        *ret_why = g_strdup("the message is not UTF-8 text");
        return NULL;
    }
    if (!vm_json_depth_ok(line, len, VMCTL_RPC_DEPTH_MAX)) {
        *ret_why = g_strdup_printf("the message nests more than %d levels", VMCTL_RPC_DEPTH_MAX);
        return NULL;
    }
    parser = json_parser_new_immutable();
    if (!json_parser_load_from_data(parser, line, (gssize)len, &error)) {
        /* json-glib says "<data>:1:7: Parse error: unexpected ...": keep the place and why. */
        const char *why = error->message;
        if (g_str_has_prefix(why, "<data>:"))
            why += strlen("<data>:");
        const char *again = strstr(why, "Parse error: ");
        *ret_why = again != NULL ? g_strdup_printf("%.*s%s", (int)(again - why), why,
                                                   again + strlen("Parse error: "))
                                 : g_strdup(why);
        return NULL;
    }
    JsonNode *root = json_parser_steal_root(parser);
    if (root == NULL) {
        *ret_why = g_strdup("the message is empty");
        return NULL;
    }
    if (!numbers_are_finite(root)) {
        *ret_why = g_strdup("a number is out of range");
        json_node_unref(root);
        return NULL;
    }
    return root;
}

static const VmctlRpcMethod *
find_method(VmctlRpcServer *server, const char *name, gboolean notification)
{
    for (gsize i = 0; i < server->n_methods; i++) {
        if (server->methods[i].notification == notification &&
            strcmp(server->methods[i].name, name) == 0)
            return &server->methods[i];
    }
    return NULL;
}

/* Starts @call: on this thread, or on a worker for a threaded method. */
static void
call_start(VmctlRpcServer *server, VmctlRpcCall *call)
{
    if (!call->method->threaded) {
        call_run(call);
        return;
    }
    if (server->pool == NULL)
        server->pool = g_thread_pool_new(pool_run, NULL, VMCTL_RPC_CALLS_MAX, FALSE, NULL);
    g_thread_pool_push(server->pool, call, NULL);
}

/* Registers a call of @method for @message; with an @id (a request) refuses a second call with
 * the same id in flight and more than VMCTL_RPC_CALLS_MAX of them. */
static VmctlRpcCall *
call_new(VmctlRpcServer *server, const VmctlRpcMethod *method, JsonNode *message, JsonNode *id)
{
    g_autofree char *key = id != NULL ? id_key(id) : NULL;
    VmctlRpcCall *call;
    int refused = 0;

    g_mutex_lock(&server->lock);
    if (key != NULL && g_hash_table_contains(server->calls, key))
        refused = VMCTL_RPC_INVALID_REQUEST;
    else if (key != NULL && g_hash_table_size(server->calls) >= VMCTL_RPC_CALLS_MAX)
        refused = VMCTL_RPC_SERVER_BUSY;
    if (refused == 0) {
        call = g_new0(VmctlRpcCall, 1);
        call->server = server;
        call->method = method;
        call->message = json_node_ref(message);
        JsonNode *params = json_object_get_member(json_node_get_object(message), "params");
        call->params = params != NULL ? json_node_get_object(params) : NULL;
        call->id = id != NULL ? json_node_copy(id) : NULL;
        call->key = g_steal_pointer(&key);
        call->cancellable = g_cancellable_new();
        if (call->key != NULL)
            g_hash_table_insert(server->calls, call->key, call);
        server->running++;
    }
    g_mutex_unlock(&server->lock);

    if (refused == VMCTL_RPC_INVALID_REQUEST)
        send_error(server, id, refused, "Invalid Request: a request with this id is in flight");
    else if (refused != 0)
        send_errorf(server, id, refused, "Server busy: more than %d requests in flight",
                    VMCTL_RPC_CALLS_MAX);
    return refused == 0 ? call : NULL;
}

void
vmctl_rpc_server_handle(VmctlRpcServer *server, const char *line, gsize len)
{
    g_autofree char *why = NULL;
    g_autoptr(JsonNode) root = parse_message(line, len, &why);

    if (root == NULL) {
        send_errorf(server, NULL, VMCTL_RPC_PARSE_ERROR, "Parse error: %s", why);
        return;
    }
    if (JSON_NODE_HOLDS_ARRAY(root)) {
        send_error(server, NULL, VMCTL_RPC_INVALID_REQUEST,
                   "Invalid Request: batches are not supported (MCP 2025-06-18)");
        return;
    }
    if (!JSON_NODE_HOLDS_OBJECT(root)) {
        send_error(server, NULL, VMCTL_RPC_INVALID_REQUEST,
                   "Invalid Request: a message is a JSON object");
        return;
    }

    JsonObject *message = json_node_get_object(root);
    JsonNode *id = json_object_get_member(message, "id");
    JsonNode *method = json_object_get_member(message, "method");
    JsonNode *version = json_object_get_member(message, "jsonrpc");
    JsonNode *params = json_object_get_member(message, "params");
    gboolean has_method = method != NULL && JSON_NODE_HOLDS_VALUE(method) &&
                          json_node_get_value_type(method) == G_TYPE_STRING;
    gboolean versioned = version != NULL && JSON_NODE_HOLDS_VALUE(version) &&
                         json_node_get_value_type(version) == G_TYPE_STRING &&
                         strcmp(json_node_get_string(version), "2.0") == 0;

    /* A response to a request: this server sends none, so there is nothing to match. */
    if (method == NULL && id != NULL &&
        (json_object_has_member(message, "result") || json_object_has_member(message, "error")))
        return;

    if (id == NULL) {
        /* A notification: whatever is wrong with it, no answer. */
        const VmctlRpcMethod *handler =
            has_method && versioned ? find_method(server, json_node_get_string(method), TRUE)
                                    : NULL;
        if (handler == NULL || (params != NULL && !JSON_NODE_HOLDS_OBJECT(params)))
            return;
        VmctlRpcCall *call = call_new(server, handler, root, NULL);
        call_start(server, call);
        return;
    }

    if (!id_is_valid(id)) {
        send_error(server, NULL, VMCTL_RPC_INVALID_REQUEST,
                   "Invalid Request: id must be a string or an integer");
        return;
    }
    if (!versioned) {
        send_error(server, id, VMCTL_RPC_INVALID_REQUEST,
                   "Invalid Request: jsonrpc must be \"2.0\"");
        return;
    }
    if (!has_method) {
        send_error(server, id, VMCTL_RPC_INVALID_REQUEST,
                   "Invalid Request: method must be a string");
        return;
    }
    if (params != NULL && !JSON_NODE_HOLDS_OBJECT(params)) {
        send_error(server, id,
                   JSON_NODE_HOLDS_ARRAY(params) ? VMCTL_RPC_INVALID_PARAMS
                                                 : VMCTL_RPC_INVALID_REQUEST,
                   JSON_NODE_HOLDS_ARRAY(params) ? "Invalid params: params must be an object"
                                                 : "Invalid Request: params must be an object");
        return;
    }
    const VmctlRpcMethod *handler = find_method(server, json_node_get_string(method), FALSE);
    if (handler == NULL) {
        g_autofree char *name = g_strndup(json_node_get_string(method), 200);
        send_errorf(server, id, VMCTL_RPC_METHOD_NOT_FOUND, "Method not found: %s", name);
        return;
    }
    VmctlRpcCall *call = call_new(server, handler, root, id);
    if (call != NULL)
        call_start(server, call);
}

/* Lines being read: the current one, or the rest of one too long to keep. */
typedef struct {
    GByteArray *line;
    gboolean skipping;
} LineReader;

static void
handle_line(VmctlRpcServer *server, GByteArray *line)
{
    gsize len = line->len;

    if (len > 0 && line->data[len - 1] == '\r')
        len--;
    for (gsize i = 0; i < len; i++) {
        if (!g_ascii_isspace(line->data[i])) {
            vmctl_rpc_server_handle(server, (const char *)line->data, len);
            break;
        }
    }
    g_byte_array_set_size(line, 0);
}

static void
feed(VmctlRpcServer *server, LineReader *reader, const char *data, gsize len)
{
    while (len > 0 && !vmctl_rpc_server_is_broken(server)) {
        const char *newline = memchr(data, '\n', len);
        gsize take = newline != NULL ? (gsize)(newline - data) : len;

        if (!reader->skipping && reader->line->len + take > VMCTL_RPC_MESSAGE_MAX) {
            reader->skipping = TRUE;
            g_byte_array_set_size(reader->line, 0);
        }
        if (!reader->skipping)
            g_byte_array_append(reader->line, (const guint8 *)data, (guint)take);
        if (newline == NULL)
            return;
        if (reader->skipping) {
            send_errorf(server, NULL, VMCTL_RPC_PARSE_ERROR,
                        "Parse error: a message is larger than %d bytes", VMCTL_RPC_MESSAGE_MAX);
            reader->skipping = FALSE;
        } else {
            handle_line(server, reader->line);
        }
        data += take + 1;
        len -= take + 1;
    }
}

gboolean
vmctl_rpc_server_run(VmctlRpcServer *server, int fd, GError **error)
{
    g_autofree char *chunk = g_malloc(READ_CHUNK);
    g_autoptr(GByteArray) line = g_byte_array_new();
    LineReader reader = {.line = line};
    gboolean ok = TRUE;

    while (!vmctl_rpc_server_is_broken(server)) {
        ssize_t n = read(fd, chunk, READ_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            ok = vm_throw_errno(error, errno, "cannot read the client's messages");
            break;
        }
        if (n == 0) {
            /* The last message may lack its newline. */
            if (!reader.skipping && line->len > 0)
                handle_line(server, line);
            break;
        }
        feed(server, &reader, chunk, (gsize)n);
    }
    wait_idle(server);
    return ok;
}
