#include "vmctl-mcp.h"

#include "vm-config.h"
#include "vm-util.h"
#include "vmctl-mcp-rpc.h"
#include "vmctl-mcp-tools.h"

#include <string.h>

/* The revisions a client may ask for, newest first; any other gets the newest. Older ones have
 * no structured results, which such a client ignores. */
static const char *const protocol_versions[] = {
    VMCTL_MCP_PROTOCOL_VERSION,
    "2025-03-26",
    "2024-11-05",
    NULL,
};

#define INSTRUCTIONS                                                                               \
    "Each agent is a Linux VM of its own, run by hostd. list_agents shows them; exec runs a "      \
    "command (an argv array) and returns its output and exit status; read_file and write_file "    \
    "move files; checkpoint before a risky step and restore to go back (diff shows what "          \
    "changed); fork makes a copy to try something on."

typedef struct {
    const VmctlMcpOptions *options;
    int out_fd;
} Session;

/* Where the notifications of one tools/call go, when it carried a progressToken. */
typedef struct {
    VmctlRpcServer *server;
    JsonNode *token;
    gint64 count;
    char *last_message;
    double last_fraction;
} Progress;

/* A node holding @object, taking the caller's reference (json_node_init_object() adds one). */
static JsonNode *
node_take_object(JsonObject *object)
{
    JsonNode *node = json_node_new(JSON_NODE_OBJECT);

    json_node_take_object(node, object);
    return node;
}

static gboolean
write_line(const char *line, gsize len, gpointer user_data)
{
    Session *session = user_data;

    while (len > 0) {
        gssize n = vm_write_nosignal(session->out_fd, line, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return FALSE;
        line += n;
        len -= (gsize)n;
    }
    return TRUE;
}

/* hostd's PROGRESS as notifications/progress: progress counts them (MCP wants it to grow),
 * the message carries the fraction when hostd knows it. Repeats are dropped. */
static void
progress_notify(const char *message, double fraction, gpointer user_data)
{
    Progress *progress = user_data;
    g_autofree char *text = NULL;

    if (g_strcmp0(message, progress->last_message) == 0 && fraction == progress->last_fraction)
        return;
    g_free(progress->last_message);
    progress->last_message = g_strdup(message);
    progress->last_fraction = fraction;

    JsonObject *params = json_object_new();
    json_object_set_member(params, "progressToken", json_node_copy(progress->token));
    json_object_set_int_member(params, "progress", ++progress->count);
    if (fraction >= 0)
        text = g_strdup_printf("%s (%d%%)", message, (int)(fraction * 100));
    json_object_set_string_member(params, "message", text != NULL ? text : message);
    vmctl_rpc_server_notify(progress->server, "notifications/progress", node_take_object(params));
}

static gboolean
member_is_string(JsonObject *object, const char *name)
{
    JsonNode *node = object != NULL ? json_object_get_member(object, name) : NULL;

    return node != NULL && JSON_NODE_HOLDS_VALUE(node) &&
           json_node_get_value_type(node) == G_TYPE_STRING;
}

static void
method_initialize(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    const char *version = VMCTL_MCP_PROTOCOL_VERSION;

    if (!member_is_string(params, "protocolVersion")) {
        vmctl_rpc_call_fail(call, VMCTL_RPC_INVALID_PARAMS,
                            "Invalid params: protocolVersion must be a string");
        return;
    }
    if (g_strv_contains(protocol_versions,
                        json_object_get_string_member(params, "protocolVersion")))
        version = json_object_get_string_member(params, "protocolVersion");

    JsonObject *result = json_object_new();
    JsonObject *capabilities = json_object_new();
    JsonObject *tools = json_object_new();
    JsonObject *info = json_object_new();
    json_object_set_string_member(result, "protocolVersion", version);
    json_object_set_boolean_member(tools, "listChanged", FALSE);
    json_object_set_object_member(capabilities, "tools", tools);
    json_object_set_object_member(result, "capabilities", capabilities);
    json_object_set_string_member(info, "name", "vmctl");
    json_object_set_string_member(info, "title", "vmctl: agents' VMs run by hostd");
    json_object_set_string_member(info, "version", VM_VERSION);
    json_object_set_object_member(result, "serverInfo", info);
    json_object_set_string_member(result, "instructions", INSTRUCTIONS);
    vmctl_rpc_call_return(call, node_take_object(result));
}

static void
method_initialized(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    /* Nothing waits for it: requests are served from the first one on. */
}

static void
method_ping(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    vmctl_rpc_call_return(call, NULL);
}

static void
method_tools_list(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    Session *session = user_data;
    JsonNode *cursor = params != NULL ? json_object_get_member(params, "cursor") : NULL;

    /* One page: no cursor is ever handed out, so none can come back. */
    if (cursor != NULL && !JSON_NODE_HOLDS_NULL(cursor)) {
        vmctl_rpc_call_fail(call, VMCTL_RPC_INVALID_PARAMS, "Invalid params: unknown cursor");
        return;
    }
    JsonObject *result = json_object_new();
    json_object_set_member(result, "tools",
                           vmctl_mcp_tools_list(session->options->read_only,
                                                session->options->copy_dir != NULL,
                                                session->options->agents));
    vmctl_rpc_call_return(call, node_take_object(result));
}

/* The progressToken of a request's _meta: a string or an integer; NULL when absent. */
static JsonNode *
progress_token(JsonObject *params)
{
    JsonNode *meta = json_object_get_member(params, "_meta");

    if (meta == NULL || !JSON_NODE_HOLDS_OBJECT(meta))
        return NULL;
    JsonNode *token = json_object_get_member(json_node_get_object(meta), "progressToken");
    if (token == NULL || !JSON_NODE_HOLDS_VALUE(token))
        return NULL;
    GType type = json_node_get_value_type(token);
    return type == G_TYPE_STRING || type == G_TYPE_INT64 ? token : NULL;
}

static void
method_tools_call(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    Session *session = user_data;
    JsonNode *arguments = params != NULL ? json_object_get_member(params, "arguments") : NULL;
    Progress progress = {.server = vmctl_rpc_call_get_server(call)};

    if (!member_is_string(params, "name")) {
        vmctl_rpc_call_fail(call, VMCTL_RPC_INVALID_PARAMS,
                            "Invalid params: name must be a string");
        return;
    }
    if (arguments != NULL && !JSON_NODE_HOLDS_OBJECT(arguments) &&
        !JSON_NODE_HOLDS_NULL(arguments)) {
        vmctl_rpc_call_fail(call, VMCTL_RPC_INVALID_PARAMS,
                            "Invalid params: arguments must be an object");
        return;
    }
    const char *name = json_object_get_string_member(params, "name");
    const VmctlMcpTool *tool =
        vmctl_mcp_tool_find(name, session->options->read_only, session->options->copy_dir != NULL);
    if (tool == NULL) {
        g_autofree char *shown = g_strndup(name, 64);
        vmctl_rpc_call_fail(call, VMCTL_RPC_INVALID_PARAMS, "Unknown tool: %s%s", shown,
                            session->options->read_only &&
                                    vmctl_mcp_tool_find(name, FALSE, TRUE) != NULL
                                ? " (this server is read-only)"
                                : "");
        return;
    }

    progress.token = progress_token(params);
    VmctlMcpContext context = {
        .endpoint = session->options->endpoint,
        .agents = session->options->agents,
        .copy_dir = session->options->copy_dir,
        .cancellable = vmctl_rpc_call_get_cancellable(call),
        .progress = progress.token != NULL ? progress_notify : NULL,
        .progress_data = &progress,
    };
    JsonNode *result = vmctl_mcp_tool_call(tool,
                                           arguments != NULL && JSON_NODE_HOLDS_OBJECT(arguments)
                                               ? json_node_get_object(arguments)
                                               : NULL,
                                           &context);
    g_free(progress.last_message);
    vmctl_rpc_call_return(call, result);
}

static void
method_cancelled(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    JsonNode *id = params != NULL ? json_object_get_member(params, "requestId") : NULL;

    if (id != NULL)
        vmctl_rpc_server_cancel(vmctl_rpc_call_get_server(call), id);
}

/* clang-format off */
static const VmctlRpcMethod methods[] = {
    {"initialize", method_initialize, FALSE, FALSE},
    {"ping", method_ping, FALSE, FALSE},
    {"tools/list", method_tools_list, FALSE, FALSE},
    {"tools/call", method_tools_call, FALSE, TRUE},
    {"notifications/initialized", method_initialized, TRUE, FALSE},
    {"notifications/cancelled", method_cancelled, TRUE, FALSE},
};
/* clang-format on */

gboolean
vmctl_mcp_serve(const VmctlMcpOptions *options, int in_fd, int out_fd, GError **error)
{
    Session session = {.options = options, .out_fd = out_fd};
    g_autoptr(VmctlRpcServer) server =
        vmctl_rpc_server_new(methods, G_N_ELEMENTS(methods), &session, write_line, &session);

    return vmctl_rpc_server_run(server, in_fd, error);
}
