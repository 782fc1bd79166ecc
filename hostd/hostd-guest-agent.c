#include "hostd-guest-agent.h"

#include <json-glib/json-glib.h>
#include <libvirt/libvirt-qemu.h>
#include <string.h>

#include "hostd-libvirt.h"
#include "vm-log-text.h"
#include "vm-util.h"

#define GUEST_AGENT_POLL_MS 50
#define GUEST_AGENT_ASK_S   5 /* one question's own deadline */

/* The deepest an answer nests: the protocol's answers nest 3 deep. */
#define GUEST_AGENT_DEPTH_MAX 16

/* Fails with libvirt's error for a question the guest agent did not answer. Its message may quote
 * the guest agent's own error text (libvirt puts "desc" in it): bounded and escaped here, so that
 * what the guest wrote reaches a log line or a client as one line of at most
 * HOSTD_GUEST_AGENT_ERROR_MAX bytes. */
static void
guest_agent_throw(GError **error, const char *what)
{
    int code = 0;
    g_autofree char *raw = hostd_libvirt_take_error("unknown error", &code);
    g_autofree char *text = vm_log_text(raw, -1, HOSTD_GUEST_AGENT_ERROR_MAX);

    vm_throw(error, code == VIR_ERR_NO_DOMAIN ? VM_ERROR_NOT_FOUND : VM_ERROR_LIBVIRT, "%s: %s",
             what, text);
}

/* Sends @command (a JSON object) and returns the "return" member of the answer (a new node), or
 * NULL with @error set. */
static JsonNode *
guest_agent_ask(virDomainPtr dom, JsonNode *command, GError **error)
{
    g_autofree char *text = json_to_string(command, FALSE);
    g_autofree char *answer = virDomainQemuAgentCommand(dom, text, GUEST_AGENT_ASK_S, 0);
    if (answer == NULL) {
        guest_agent_throw(error, "the guest agent did not answer");
        return NULL;
    }
    gsize len = strnlen(answer, HOSTD_GUEST_AGENT_REPLY_MAX + 1);
    if (len > HOSTD_GUEST_AGENT_REPLY_MAX) {
        vm_throw(error, VM_ERROR_PROTOCOL, "the guest agent's answer is over %d bytes",
                 HOSTD_GUEST_AGENT_REPLY_MAX);
        return NULL;
    }
    /* json-glib recurses once per level, with no limit of its own. */
    if (!vm_json_depth_ok(answer, len, GUEST_AGENT_DEPTH_MAX)) {
        vm_throw(error, VM_ERROR_PROTOCOL, "the guest agent's answer nests over %d deep",
                 GUEST_AGENT_DEPTH_MAX);
        return NULL;
    }
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    if (!json_parser_load_from_data(parser, answer, (gssize)len, NULL)) {
        vm_throw(error, VM_ERROR_PROTOCOL, "the guest agent's answer is not JSON");
        return NULL;
    }
    JsonNode *root = json_parser_get_root(parser);
    JsonObject *o = JSON_NODE_HOLDS_OBJECT(root) ? json_node_get_object(root) : NULL;
    JsonNode *ret = o != NULL ? json_object_get_member(o, "return") : NULL;
    if (ret == NULL) {
        vm_throw(error, VM_ERROR_PROTOCOL, "the guest agent's answer has no result");
        return NULL;
    }
    return json_node_copy(ret);
}

/* The command @execute with @arguments (taken, may be NULL). */
static JsonNode *
guest_agent_command(const char *execute, JsonObject *arguments)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "execute");
    json_builder_add_string_value(b, execute);
    if (arguments != NULL) {
        json_builder_set_member_name(b, "arguments");
        JsonNode *args = json_node_new(JSON_NODE_OBJECT);
        json_node_take_object(args, arguments);
        json_builder_add_value(b, args);
    }
    json_builder_end_object(b);
    return json_builder_get_root(b);
}

gboolean
hostd_guest_agent_wait(virDomainPtr dom, guint timeout_ms, GError **error)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;
    g_autoptr(JsonNode) ping = guest_agent_command("guest-ping", NULL);
    for (;;) {
        g_autofree char *text = json_to_string(ping, FALSE);
        /* A guest agent not connected yet answers at once with an error: no long waits here. */
        g_autofree char *answer = virDomainQemuAgentCommand(dom, text, 1, 0);
        if (answer != NULL)
            return TRUE;
        virResetLastError();
        if (g_get_monotonic_time() >= deadline)
            return vm_throw(error, VM_ERROR_TIMEOUT, "the guest agent did not answer within %u ms",
                            timeout_ms);
        g_usleep(GUEST_AGENT_POLL_MS * 1000);
    }
}

/* The base64 member @name of @o, decoded, appended to @out up to its cap. */
static gboolean
guest_agent_append_data(JsonObject *o, const char *name, GString *out, GError **error)
{
    JsonNode *node = json_object_get_member(o, name);
    if (node == NULL)
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING)
        return vm_throw(error, VM_ERROR_PROTOCOL, "guest-exec-status: '%s' is not a string", name);
    gsize len = 0;
    g_autofree guchar *data = g_base64_decode(json_node_get_string(node), &len);
    gsize room = HOSTD_GUEST_AGENT_OUTPUT_MAX - MIN(out->len, HOSTD_GUEST_AGENT_OUTPUT_MAX);
    g_string_append_len(out, (const char *)data, (gssize)MIN(len, room));
    return TRUE;
}

/* One guest-exec-status: TRUE with *ret_exited FALSE while it runs. */
static gboolean
guest_agent_exec_status(virDomainPtr dom, gint64 pid, gboolean *ret_exited, int *ret_status,
                        GString *output, GError **error)
{
    JsonObject *args = json_object_new();
    json_object_set_int_member(args, "pid", pid);
    g_autoptr(JsonNode) cmd = guest_agent_command("guest-exec-status", args);
    g_autoptr(JsonNode) ret = guest_agent_ask(dom, cmd, error);
    if (ret == NULL)
        return FALSE;
    JsonObject *o = JSON_NODE_HOLDS_OBJECT(ret) ? json_node_get_object(ret) : NULL;
    JsonNode *exited = o != NULL ? json_object_get_member(o, "exited") : NULL;
    if (exited == NULL || json_node_get_value_type(exited) != G_TYPE_BOOLEAN)
        return vm_throw(error, VM_ERROR_PROTOCOL, "guest-exec-status: no 'exited'");
    *ret_exited = json_node_get_boolean(exited);
    if (!*ret_exited)
        return TRUE;
    JsonNode *code = json_object_get_member(o, "exitcode");
    JsonNode *signal = json_object_get_member(o, "signal");
    if (code != NULL && json_node_get_value_type(code) == G_TYPE_INT64)
        *ret_status = (int)CLAMP(json_node_get_int(code), 0, 255);
    else if (signal != NULL && json_node_get_value_type(signal) == G_TYPE_INT64)
        *ret_status = 128 + (int)CLAMP(json_node_get_int(signal), 0, 127);
    else
        return vm_throw(error, VM_ERROR_PROTOCOL, "guest-exec-status: no exit status");
    return guest_agent_append_data(o, "err-data", output, error) &&
           guest_agent_append_data(o, "out-data", output, error);
}

gboolean
hostd_guest_agent_exec(virDomainPtr dom, const char *const *argv, GBytes *input, guint timeout_ms,
                       int *ret_status, char **ret_output, GError **error)
{
    g_return_val_if_fail(argv != NULL && argv[0] != NULL, FALSE);
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;

    JsonObject *args = json_object_new();
    json_object_set_string_member(args, "path", argv[0]);
    JsonArray *arg = json_array_new();
    for (const char *const *a = argv + 1; *a != NULL; a++)
        json_array_add_string_element(arg, *a);
    json_object_set_array_member(args, "arg", arg);
    if (input != NULL) {
        gsize len = 0;
        const guchar *data = g_bytes_get_data(input, &len);
        g_autofree char *b64 = g_base64_encode(data, len);
        json_object_set_string_member(args, "input-data", b64);
    }
    json_object_set_boolean_member(args, "capture-output", TRUE);
    g_autoptr(JsonNode) cmd = guest_agent_command("guest-exec", args);
    g_autoptr(JsonNode) ret = guest_agent_ask(dom, cmd, error);
    if (ret == NULL)
        return FALSE;
    JsonObject *o = JSON_NODE_HOLDS_OBJECT(ret) ? json_node_get_object(ret) : NULL;
    JsonNode *pid = o != NULL ? json_object_get_member(o, "pid") : NULL;
    if (pid == NULL || json_node_get_value_type(pid) != G_TYPE_INT64)
        return vm_throw(error, VM_ERROR_PROTOCOL, "guest-exec: no pid in the answer");

    g_autoptr(GString) output = g_string_new(NULL);
    guint poll_ms = 5;
    for (;;) {
        gboolean exited = FALSE;
        if (!guest_agent_exec_status(dom, json_node_get_int(pid), &exited, ret_status, output,
                                     error))
            return FALSE;
        if (exited)
            break;
        if (g_get_monotonic_time() >= deadline)
            return vm_throw(error, VM_ERROR_TIMEOUT, "%s did not finish in the guest within %u ms",
                            argv[0], timeout_ms);
        g_usleep(poll_ms * 1000);
        /* Most programs hostd runs this way take milliseconds: ask often at first. */
        poll_ms = MIN(poll_ms * 2, GUEST_AGENT_POLL_MS);
    }
    if (ret_output != NULL)
        *ret_output = g_string_free(g_steal_pointer(&output), FALSE);
    return TRUE;
}

/* The answer of @command that must be a handle (an integer >= 0), or -1 with @error set. */
static gint64
guest_agent_ask_handle(virDomainPtr dom, JsonNode *command, GError **error)
{
    g_autoptr(JsonNode) ret = guest_agent_ask(dom, command, error);
    if (ret == NULL)
        return -1;
    if (json_node_get_value_type(ret) != G_TYPE_INT64 || json_node_get_int(ret) < 0) {
        vm_throw(error, VM_ERROR_PROTOCOL, "the guest agent's answer is not a handle");
        return -1;
    }
    return json_node_get_int(ret);
}

gboolean
hostd_guest_agent_write_file(virDomainPtr dom, const char *path, const char *text, GError **error)
{
    JsonObject *args = json_object_new();
    json_object_set_string_member(args, "path", path);
    json_object_set_string_member(args, "mode", "w");
    g_autoptr(JsonNode) open_cmd = guest_agent_command("guest-file-open", args);
    gint64 handle = guest_agent_ask_handle(dom, open_cmd, error);
    if (handle < 0)
        return FALSE;

    args = json_object_new();
    json_object_set_int_member(args, "handle", handle);
    g_autofree char *b64 = g_base64_encode((const guchar *)text, strlen(text));
    json_object_set_string_member(args, "buf-b64", b64);
    g_autoptr(JsonNode) write_cmd = guest_agent_command("guest-file-write", args);
    g_autoptr(JsonNode) written = guest_agent_ask(dom, write_cmd, error);

    /* Closed whatever the write did: the guest agent keeps an open handle until then. */
    args = json_object_new();
    json_object_set_int_member(args, "handle", handle);
    g_autoptr(JsonNode) close_cmd = guest_agent_command("guest-file-close", args);
    g_autoptr(JsonNode) closed = guest_agent_ask(dom, close_cmd, written != NULL ? error : NULL);
    return written != NULL && closed != NULL;
}
