/* Fuzz target for vmctl mcp's JSON-RPC layer: the input is one message, a line as the server
 * reads it from its client, handed to vmctl_rpc_server_handle() with methods that answer at once
 * (a request echoing its params, a notification).
 *
 * Besides "no crash, no leak", it checks what the layer promises: at most one answer a message,
 * each one line of valid JSON, a JSON-RPC 2.0 response with an id and either a result or an error
 * with an integer code.
 *
 * Fuzz: clang -fsanitize=fuzzer,address ... fuzz-mcp-rpc.c vmctl/vmctl-mcp-rpc.c ...; the corpus
 * in corpus-mcp-rpc/ replays as an ordinary test through fuzz-replay.c.
 */
#include "vmctl-mcp-rpc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static guint answers;

static gboolean
check_line(const char *line, gsize len, gpointer user_data)
{
    g_autoptr(JsonNode) node = NULL;

    if (len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1) != NULL)
        abort();
    g_autofree char *text = g_strndup(line, len - 1);
    node = json_from_string(text, NULL);
    if (node == NULL || !JSON_NODE_HOLDS_OBJECT(node))
        abort();
    JsonObject *message = json_node_get_object(node);
    if (g_strcmp0(json_object_get_string_member_with_default(message, "jsonrpc", NULL), "2.0") !=
            0 ||
        !json_object_has_member(message, "id") ||
        json_object_has_member(message, "result") == json_object_has_member(message, "error"))
        abort();
    if (json_object_has_member(message, "error")) {
        JsonNode *code =
            json_object_get_member(json_object_get_object_member(message, "error"), "code");
        if (code == NULL || !JSON_NODE_HOLDS_VALUE(code) ||
            json_node_get_value_type(code) != G_TYPE_INT64)
            abort();
    }
    answers++;
    return TRUE;
}

static void
method_echo(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    vmctl_rpc_call_return(call,
                          params != NULL ? json_node_init_object(json_node_alloc(), params) : NULL);
}

static void
method_note(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
}

static const VmctlRpcMethod methods[] = {
    {"echo", method_echo, FALSE, FALSE},
    {"note", method_note, TRUE, FALSE},
};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(VmctlRpcServer) server =
        vmctl_rpc_server_new(methods, G_N_ELEMENTS(methods), NULL, check_line, NULL);

    answers = 0;
    vmctl_rpc_server_handle(server, (const char *)data, size);
    if (answers > 1)
        abort();
    return 0;
}
