/* vmctl mcp: the JSON-RPC layer on its own (malformed, oversized and fuzzed messages, every
 * kind of wrong request, notifications, cancellation), then the MCP server against a stateful
 * fake hostd (test-vmctl-fixture.h) that runs exec's commands here: each tool, its arguments and
 * errors, progress, cancellation and timeouts; then the vmctl binary, and the official
 * TypeScript SDK's client (tests/integration/mcp-client.mjs) when node and the SDK are there.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-util.h"
#include "vmctl-mcp-rpc.h"
#include "vmctl-mcp-tools.h"
#include "vmctl-mcp.h"
#include "test-common.h"
#include "test-vmctl-fixture.h"

#define READ_TIMEOUT_MS 20000

/* ---- The JSON-RPC layer */

/* What a server wrote: one message a line. Written from worker threads too, so no cmocka
 * assert in here: a line that breaks the framing is counted and checked by the test. */
typedef struct {
    GMutex lock;
    GPtrArray *lines;
    gint bad_lines;
    gboolean refuse; /* writes fail, as when the client is gone */
} Sink;

static gint notes;

static gboolean
sink_write(const char *line, gsize len, gpointer data)
{
    Sink *sink = data;
    gboolean ok;

    if (len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1) != NULL)
        g_atomic_int_inc(&sink->bad_lines);
    g_mutex_lock(&sink->lock);
    ok = !sink->refuse;
    if (ok)
        g_ptr_array_add(sink->lines, g_strndup(line, len - 1));
    g_mutex_unlock(&sink->lock);
    return ok;
}

static void
sink_init(Sink *sink)
{
    g_mutex_init(&sink->lock);
    sink->lines = g_ptr_array_new_with_free_func(g_free);
    sink->bad_lines = 0;
    sink->refuse = FALSE;
}

static void
sink_clear(Sink *sink)
{
    g_ptr_array_unref(sink->lines);
    g_mutex_clear(&sink->lock);
}

static guint
sink_count(Sink *sink)
{
    g_mutex_lock(&sink->lock);
    guint n = sink->lines->len;
    g_mutex_unlock(&sink->lock);
    return n;
}

static void
method_echo(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    JsonObject *copy = json_object_new();

    if (params != NULL)
        json_object_set_member(copy, "params", json_node_init_object(json_node_alloc(), params));
    JsonNode *node = json_node_new(JSON_NODE_OBJECT);

    json_node_take_object(node, copy);
    vmctl_rpc_call_return(call, node);
}

static void
method_silent(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
}

/* Waits until cancelled (10 s at most), then answers. */
static void
method_wait(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    GCancellable *cancellable = vmctl_rpc_call_get_cancellable(call);

    for (int i = 0; i < 1000 && !g_cancellable_is_cancelled(cancellable); i++)
        g_usleep(10 * 1000);
    vmctl_rpc_call_return(call, json_from_string("{\"waited\": true}", NULL));
}

static void
method_note(VmctlRpcCall *call, JsonObject *params, gpointer user_data)
{
    g_atomic_int_inc(&notes);
}

/* clang-format off */
static const VmctlRpcMethod test_methods[] = {
    {"echo", method_echo, FALSE, FALSE},
    {"silent", method_silent, FALSE, FALSE},
    {"wait", method_wait, FALSE, TRUE},
    {"note", method_note, TRUE, FALSE},
};
/* clang-format on */

static VmctlRpcServer *
rpc_new(Sink *sink)
{
    sink_init(sink);
    return vmctl_rpc_server_new(test_methods, G_N_ELEMENTS(test_methods), NULL, sink_write, sink);
}

static void
rpc_feed(VmctlRpcServer *server, const char *text)
{
    vmctl_rpc_server_handle(server, text, strlen(text));
}

/* Message @index of @sink, which must be a JSON-RPC 2.0 object. New reference. */
static JsonObject *
sink_message(Sink *sink, guint index)
{
    g_autoptr(GError) error = NULL;

    g_mutex_lock(&sink->lock);
    assert_true(index < sink->lines->len);
    g_autoptr(JsonNode) node = json_from_string(sink->lines->pdata[index], &error);
    g_mutex_unlock(&sink->lock);
    vm_test_assert_no_error(error);
    assert_true(JSON_NODE_HOLDS_OBJECT(node));
    JsonObject *object = json_node_get_object(node);
    assert_string_equal(json_object_get_string_member_with_default(object, "jsonrpc", ""), "2.0");
    return json_object_ref(object);
}

static char *
member_text(JsonObject *object, const char *name)
{
    JsonNode *node = json_object_get_member(object, name);

    assert_non_null(node);
    return json_to_string(node, FALSE);
}

/* Message @index is an error @code for the id whose JSON is @id, its message holding
 * @needle. */
static void
assert_rpc_error(Sink *sink, guint index, int code, const char *id, const char *needle)
{
    g_autoptr(JsonObject) message = sink_message(sink, index);
    g_autofree char *id_text = member_text(message, "id");

    assert_string_equal(id_text, id);
    assert_false(json_object_has_member(message, "result"));
    JsonObject *error = json_object_get_object_member(message, "error");
    assert_non_null(error);
    assert_int_equal(json_object_get_int_member(error, "code"), code);
    const char *text = json_object_get_string_member(error, "message");
    if (strstr(text, needle) == NULL)
        fail_msg("error message '%s' lacks '%s'", text, needle);
}

static void
test_rpc_request(void **state)
{
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);

    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"echo\",\"params\":{\"a\":[1]}}");
    rpc_feed(server, "  {\"method\":\"echo\",\"id\":\"x y\",\"jsonrpc\":\"2.0\"}  ");
    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"echo\"}");
    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":-9007199254740993,\"method\":\"echo\"}");
    assert_int_equal(sink_count(&sink), 4);

    g_autoptr(JsonObject) first = sink_message(&sink, 0);
    g_autofree char *id = member_text(first, "id");
    g_autofree char *result = member_text(first, "result");
    assert_string_equal(id, "7");
    assert_string_equal(result, "{\"params\":{\"a\":[1]}}");
    g_autoptr(JsonObject) second = sink_message(&sink, 1);
    g_autofree char *id2 = member_text(second, "id");
    assert_string_equal(id2, "\"x y\"");
    g_autoptr(JsonObject) third = sink_message(&sink, 2);
    g_autofree char *id3 = member_text(third, "id");
    assert_string_equal(id3, "0");
    g_autoptr(JsonObject) fourth = sink_message(&sink, 3);
    g_autofree char *id4 = member_text(fourth, "id");
    assert_string_equal(id4, "-9007199254740993");
    assert_int_equal(sink.bad_lines, 0);
    vmctl_rpc_server_free(server);
    sink_clear(&sink);
}

static void
test_rpc_malformed(void **state)
{
    static const struct {
        const char *input;
        gsize len; /* 0: strlen */
        int code;
        const char *id;
        const char *needle;
    } cases[] = {
        {"{", 0, VMCTL_RPC_PARSE_ERROR, "null", "Parse error"},
        {"not json", 0, VMCTL_RPC_PARSE_ERROR, "null", "Parse error: 1:"},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"} x", 0, VMCTL_RPC_PARSE_ERROR, "null",
         "Parse error"},
        {"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"n\":[-1e999]}}", 0,
         VMCTL_RPC_PARSE_ERROR, "null", "a number is out of range"},
        {"\xff\xfe{}", 0, VMCTL_RPC_PARSE_ERROR, "null", "not UTF-8"},
        {"{\"a\":\"\0\"}", 9, VMCTL_RPC_PARSE_ERROR, "null", "not UTF-8"},
        {"[]", 0, VMCTL_RPC_INVALID_REQUEST, "null", "batches are not supported"},
        {"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"}]", 0, VMCTL_RPC_INVALID_REQUEST,
         "null", "batches are not supported"},
        {"42", 0, VMCTL_RPC_INVALID_REQUEST, "null", "a JSON object"},
        {"\"echo\"", 0, VMCTL_RPC_INVALID_REQUEST, "null", "a JSON object"},
        {"null", 0, VMCTL_RPC_INVALID_REQUEST, "null", "a JSON object"},
        {"{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST,
         "null", "id must be"},
        {"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST,
         "null", "id must be"},
        {"{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST,
         "null", "id must be"},
        {"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST,
         "null", "id must be"},
        {"{\"id\":1,\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST, "1", "jsonrpc must be"},
        {"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST, "1",
         "jsonrpc must be"},
        {"{\"jsonrpc\":2,\"id\":1,\"method\":\"echo\"}", 0, VMCTL_RPC_INVALID_REQUEST, "1",
         "jsonrpc must be"},
        {"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":5}", 0, VMCTL_RPC_INVALID_REQUEST, "\"a\"",
         "method must be"},
        {"{\"jsonrpc\":\"2.0\",\"id\":\"a\"}", 0, VMCTL_RPC_INVALID_REQUEST, "\"a\"",
         "method must be"},
        {"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":\"x\"}", 0,
         VMCTL_RPC_INVALID_REQUEST, "2", "params must be an object"},
        {"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":[1,2]}", 0,
         VMCTL_RPC_INVALID_PARAMS, "2", "params must be an object"},
        {"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"nope\"}", 0, VMCTL_RPC_METHOD_NOT_FOUND, "3",
         "Method not found: nope"},
        /* A notification's name is not a request's. */
        {"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"note\"}", 0, VMCTL_RPC_METHOD_NOT_FOUND, "3",
         "Method not found: note"},
        {"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"silent\"}", 0, VMCTL_RPC_INTERNAL_ERROR, "4",
         "silent gave no answer"},
    };
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        gsize len = cases[i].len != 0 ? cases[i].len : strlen(cases[i].input);
        vmctl_rpc_server_handle(server, cases[i].input, len);
        assert_int_equal(sink_count(&sink), i + 1);
        assert_rpc_error(&sink, (guint)i, cases[i].code, cases[i].id, cases[i].needle);
    }
    assert_int_equal(sink.bad_lines, 0);
    vmctl_rpc_server_free(server);
    sink_clear(&sink);
}

/* Nesting is bounded before json-glib, which recurses, sees it. */
static void
test_rpc_depth(void **state)
{
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);
    g_autoptr(GString) deep = g_string_new("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\","
                                           "\"params\":");
    g_autoptr(GString) bomb = g_string_new(NULL);

    /* params is level 2: 62 more levels fit. */
    for (int i = 0; i < VMCTL_RPC_DEPTH_MAX - 2; i++)
        g_string_append(deep, "{\"a\":");
    g_string_append(deep, "0");
    for (int i = 0; i < VMCTL_RPC_DEPTH_MAX - 2; i++)
        g_string_append_c(deep, '}');
    g_string_append(deep, "}");
    rpc_feed(server, deep->str);
    g_autoptr(JsonObject) ok = sink_message(&sink, 0);
    assert_true(json_object_has_member(ok, "result"));

    /* Brackets inside strings do not count; outside they do. */
    rpc_feed(server,
             "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{\"s\":"
             "\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"\"}}");
    g_autoptr(JsonObject) strings = sink_message(&sink, 1);
    assert_true(json_object_has_member(strings, "result"));
    for (int i = 0; i < 100000; i++)
        g_string_append_c(bomb, '[');
    rpc_feed(server, bomb->str);
    assert_rpc_error(&sink, 2, VMCTL_RPC_PARSE_ERROR, "null", "nests more than 64 levels");
    vmctl_rpc_server_free(server);
    sink_clear(&sink);
}

static void
test_rpc_notifications(void **state)
{
    static const char *const silent[] = {
        "{\"jsonrpc\":\"2.0\",\"method\":\"note\"}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"note\",\"params\":{\"x\":1}}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"unknown/notification\"}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"echo\"}",
        "{\"jsonrpc\":\"2.0\",\"method\":5}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"note\",\"params\":[1]}",
        "{\"method\":\"note\"}",
        "{\"jsonrpc\":\"2.0\"}",
        "{}",
        /* Responses: the server sends no request, so none is waited for. */
        "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}",
        "{\"jsonrpc\":\"2.0\",\"id\":6,\"error\":{\"code\":1,\"message\":\"x\"}}",
    };
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);

    g_atomic_int_set(&notes, 0);
    for (gsize i = 0; i < G_N_ELEMENTS(silent); i++)
        rpc_feed(server, silent[i]);
    assert_int_equal(sink_count(&sink), 0);
    /* The two well-formed ones to "note" ran. */
    assert_int_equal(g_atomic_int_get(&notes), 2);
    vmctl_rpc_server_free(server);
    sink_clear(&sink);
}

static void
test_rpc_cancel(void **state)
{
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);
    gint64 start = g_get_monotonic_time();

    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":\"w\",\"method\":\"wait\"}");
    /* The reader goes on while it waits. */
    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"}");
    assert_int_equal(sink_count(&sink), 1);
    /* The same id again while in flight. */
    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":\"w\",\"method\":\"echo\"}");
    assert_rpc_error(&sink, 1, VMCTL_RPC_INVALID_REQUEST, "\"w\"", "in flight");
    /* Cancelling an id not in flight, or of the wrong type, does nothing. */
    g_autoptr(JsonNode) other = json_from_string("\"v\"", NULL);
    g_autoptr(JsonNode) number = json_from_string("1.5", NULL);
    vmctl_rpc_server_cancel(server, other);
    vmctl_rpc_server_cancel(server, number);
    g_autoptr(JsonNode) id = json_from_string("\"w\"", NULL);
    vmctl_rpc_server_cancel(server, id);
    /* Freeing waits for the call; its answer is not sent. */
    vmctl_rpc_server_free(server);
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    assert_int_equal(sink_count(&sink), 2);
    sink_clear(&sink);
}

static void
test_rpc_notify(void **state)
{
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);

    vmctl_rpc_server_notify(server, "notifications/x", json_from_string("{\"a\":\"b\\nc\"}", NULL));
    g_autoptr(JsonObject) message = sink_message(&sink, 0);
    assert_string_equal(json_object_get_string_member(message, "method"), "notifications/x");
    assert_false(json_object_has_member(message, "id"));
    assert_string_equal(
        json_object_get_string_member(json_object_get_object_member(message, "params"), "a"),
        "b\nc");
    /* The client stopped reading: nothing more goes out, and calls in flight are cancelled. */
    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":\"w\",\"method\":\"wait\"}");
    sink.refuse = TRUE;
    rpc_feed(server, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"}");
    assert_true(vmctl_rpc_server_is_broken(server));
    gint64 start = g_get_monotonic_time();
    vmctl_rpc_server_free(server);
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    assert_int_equal(sink.bad_lines, 0);
    sink_clear(&sink);
}

typedef struct {
    int fd;
    GBytes *data;
} PipeWriter;

static gpointer
pipe_writer(gpointer user_data)
{
    PipeWriter *writer = user_data;
    gsize len;
    const guint8 *data = g_bytes_get_data(writer->data, &len);

    while (len > 0) {
        ssize_t n = write(writer->fd, data, len);
        if (n <= 0)
            break;
        data += n;
        len -= (gsize)n;
    }
    close(writer->fd);
    return NULL;
}

/* Lines from a stream: ends in \r\n, blank lines, one over the bound, a last one without its
 * newline. */
static void
test_rpc_run(void **state)
{
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);
    g_autoptr(GString) input = g_string_new(NULL);
    g_autoptr(GError) error = NULL;
    int fds[2];

    g_string_append(input, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"}\r\n");
    g_string_append(input, "\n  \r\n\t\n");
    g_string_append(input,
                    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"echo\",\"params\":{\"s\":\"");
    for (gsize i = 0; i < VMCTL_RPC_MESSAGE_MAX; i++)
        g_string_append_c(input, 'a');
    g_string_append(input, "\"}}\n");
    g_string_append(input, "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"echo\"}\n");
    g_string_append(input, "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"echo\"}");
    assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
    PipeWriter writer = {.fd = fds[1], .data = g_bytes_new(input->str, input->len)};
    GThread *thread = g_thread_new("writer", pipe_writer, &writer);
    assert_true(vmctl_rpc_server_run(server, fds[0], &error));
    vm_test_assert_no_error(error);
    g_thread_join(thread);
    g_bytes_unref(writer.data);
    close(fds[0]);

    assert_int_equal(sink_count(&sink), 4);
    g_autoptr(JsonObject) first = sink_message(&sink, 0);
    assert_int_equal(json_object_get_int_member(first, "id"), 1);
    assert_rpc_error(&sink, 1, VMCTL_RPC_PARSE_ERROR, "null", "larger than 4194304 bytes");
    g_autoptr(JsonObject) third = sink_message(&sink, 2);
    assert_int_equal(json_object_get_int_member(third, "id"), 3);
    g_autoptr(JsonObject) fourth = sink_message(&sink, 3);
    assert_int_equal(json_object_get_int_member(fourth, "id"), 4);
    vmctl_rpc_server_free(server);
    sink_clear(&sink);
}

/* Mutations of valid messages: nothing crashes, every line out is one JSON-RPC answer, and no
 * message gets more than one. */
static void
test_rpc_fuzz(void **state)
{
    static const char *const seeds[] = {
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"a\":[1,2.5,\"x\"]}}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"note\",\"params\":{}}",
        "{\"jsonrpc\":\"2.0\",\"id\":\"s\",\"method\":\"silent\"}",
        "{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"k\":null}}",
        "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\"}]",
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"exec\","
        "\"arguments\":{\"command\":[\"sh\",\"-c\",\"echo \\\"hi\\\"\\n\"]},\"_meta\":{"
        "\"progressToken\":\"t\"}}}",
    };
    static const char *const tokens[] = {
        "{", "}",    "[",    "]",       "\"",      "\\",  ":",    ",",       "null",       "1e999",
        "-", "\xff", "\xc3", "\\u0000", "\\ud800", "0.0", "true", "\"id\":", "\"method\":"};
    g_autoptr(GRand) rand = g_rand_new_with_seed(20250618);
    Sink sink;
    VmctlRpcServer *server = rpc_new(&sink);

    for (int i = 0; i < 5000; i++) {
        const char *seed = seeds[g_rand_int_range(rand, 0, G_N_ELEMENTS(seeds))];
        g_autoptr(GString) text = g_string_new(seed);
        int mutations = g_rand_int_range(rand, 1, 5);
        gsize cut;

        for (int m = 0; m < mutations && text->len > 0; m++) {
            gsize at = (gsize)g_rand_int_range(rand, 0, (gint32)text->len);
            switch (g_rand_int_range(rand, 0, 5)) {
            case 0:
                text->str[at] = (char)g_rand_int_range(rand, 1, 256);
                break;
            case 1:
                cut = (gsize)g_rand_int_range(rand, 1, 8);
                g_string_erase(text, (gssize)at, (gssize)MIN(text->len - at, cut));
                break;
            case 2:
                g_string_insert(text, (gssize)at,
                                tokens[g_rand_int_range(rand, 0, G_N_ELEMENTS(tokens))]);
                break;
            case 3:
                g_string_truncate(text, at);
                break;
            default:
                g_string_insert_len(text, (gssize)at, text->str, MIN(text->len, 16));
                break;
            }
        }
        guint before = sink_count(&sink);
        vmctl_rpc_server_handle(server, text->str, text->len);
        assert_true(sink_count(&sink) <= before + 1);
    }
    vmctl_rpc_server_free(server);
    assert_int_equal(sink.bad_lines, 0);
    for (guint i = 0; i < sink.lines->len; i++) {
        g_autoptr(JsonObject) message = sink_message(&sink, i);
        assert_true(json_object_has_member(message, "id"));
        assert_true(json_object_has_member(message, "result") !=
                    json_object_has_member(message, "error"));
        if (json_object_has_member(message, "error"))
            assert_true(JSON_NODE_HOLDS_VALUE(
                json_object_get_member(json_object_get_object_member(message, "error"), "code")));
    }
    sink_clear(&sink);
}

/* ---- A fake hostd with state, for the tools: agents, checkpoints of the files write_file
 * wrote, exec's commands run here with fake->home as the user's home. */

typedef struct {
    VmOp op;
    GVariant *fields;
} Recorded;

typedef struct {
    GMutex lock;
    char *home;
    GPtrArray *requests;    /* Recorded */
    GHashTable *agents;     /* name -> state */
    GPtrArray *checkpoints; /* ids, oldest first */
    GHashTable *snapshots;  /* id -> (path -> GBytes, NULL for no file) */
    GPtrArray *written;     /* absolute paths write_file wrote */
    gint exec_started;      /* atomic */
    gint exec_cancelled;    /* atomic: the client went away, the command was killed */
    VmErrorCode fail_code;  /* when set, every request fails with it */
    const char *fail_message;
} Fake;

static void
recorded_free(Recorded *recorded)
{
    g_variant_unref(recorded->fields);
    g_free(recorded);
}

static void
fake_init(Fake *fake, const char *home)
{
    g_mutex_init(&fake->lock);
    fake->home = g_strdup(home);
    fake->requests = g_ptr_array_new_with_free_func((GDestroyNotify)recorded_free);
    fake->agents = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    fake->checkpoints = g_ptr_array_new_with_free_func(g_free);
    fake->snapshots =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_hash_table_unref);
    fake->written = g_ptr_array_new_with_free_func(g_free);
    g_hash_table_insert(fake->agents, g_strdup("a1"), g_strdup("running"));
}

static void
fake_clear(Fake *fake)
{
    g_free(fake->home);
    g_ptr_array_unref(fake->requests);
    g_hash_table_unref(fake->agents);
    g_ptr_array_unref(fake->checkpoints);
    g_hash_table_unref(fake->snapshots);
    g_ptr_array_unref(fake->written);
    g_mutex_clear(&fake->lock);
}

static void
send_fields(int fd, VmOp op, GVariant *fields)
{
    g_autoptr(VmMessage) message = vm_message_new(op, fields, NULL);

    g_assert_nonnull(message);
    vm_message_write_fd(fd, message, NULL);
}

/* Under fake->lock. */
static GVariant *
agent_variant(Fake *fake, const char *name)
{
    const char *state = g_hash_table_lookup(fake->agents, name);

    return g_variant_new_parsed("{'name': <%s>, 'state': <%s>, 'cpus': <uint32 2>, "
                                "'ssh_port': <uint32 42201>, 'created': <int64 1700000000>, "
                                "'disk_bytes': <uint64 4096>}",
                                name, state != NULL ? state : "running");
}

static void
send_agent(Fake *fake, int fd, const char *name, const char *undo, const char *checkpoint)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);

    g_mutex_lock(&fake->lock);
    g_variant_dict_insert_value(&fields, "agent", agent_variant(fake, name));
    g_mutex_unlock(&fake->lock);
    if (undo != NULL)
        g_variant_dict_insert(&fields, "undo", "s", undo);
    if (checkpoint != NULL)
        g_variant_dict_insert(&fields, "checkpoint", "s", checkpoint);
    send_fields(fd, VM_OP_RESULT, g_variant_dict_end(&fields));
}

static GBytes *
file_bytes(const char *path)
{
    char *contents;
    gsize len;

    if (!g_file_get_contents(path, &contents, &len, NULL))
        return NULL;
    return g_bytes_new_take(contents, len);
}

/* A new checkpoint of what write_file wrote; under fake->lock. Returns its id (owned by
 * fake). */
static const char *
fake_snapshot(Fake *fake)
{
    GHashTable *files =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_bytes_unref);
    char *id = g_strdup_printf("c%u", fake->checkpoints->len + 1);

    for (guint i = 0; i < fake->written->len; i++)
        g_hash_table_insert(files, g_strdup(fake->written->pdata[i]),
                            file_bytes(fake->written->pdata[i]));
    g_ptr_array_add(fake->checkpoints, id);
    g_hash_table_insert(fake->snapshots, g_strdup(id), files);
    return id;
}

static gint
compare_strings(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A PROGRESS, then a pause as hostd's work would make: the SDK's client handles a notification
 * after the answer that comes in the same read, and the answer ends its wait for progress. */
static void
fake_progress(int fd, const char *fields)
{
    vm_test_hostd_send(fd, VM_OP_PROGRESS, fields);
    g_usleep(100 * 1000);
}

static void
fake_diff(Fake *fake, int fd, const VmMessage *request)
{
    const char *under = vm_message_get_string(request, "path", "/");
    g_auto(GVariantBuilder) changes = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("a(ss)"));

    fake_progress(fd, "{'message': <'reading the images'>}");
    g_mutex_lock(&fake->lock);
    GHashTable *files =
        g_hash_table_lookup(fake->snapshots, vm_message_get_string(request, "checkpoint", ""));
    g_autoptr(GPtrArray) paths = g_ptr_array_new();
    for (guint i = 0; i < fake->written->len; i++)
        g_ptr_array_add(paths, fake->written->pdata[i]);
    g_ptr_array_sort(paths, compare_strings);
    for (guint i = 0; files != NULL && i < paths->len; i++) {
        const char *path = paths->pdata[i];
        GBytes *then = g_hash_table_lookup(files, path);
        g_autoptr(GBytes) now = file_bytes(path);
        const char *kind = then == NULL && now != NULL                 ? "A"
                           : then != NULL && now == NULL               ? "D"
                           : then != NULL && !g_bytes_equal(then, now) ? "M"
                                                                       : NULL;
        if (kind != NULL && g_str_has_prefix(path, under))
            g_variant_builder_add(&changes, "(ss)", kind, path);
    }
    g_mutex_unlock(&fake->lock);
    if (files == NULL) {
        vm_test_hostd_send_error(fd, VM_ERROR_NOT_FOUND, "no checkpoint");
        return;
    }
    send_fields(fd, VM_OP_RESULT,
                g_variant_new_parsed("{'changes': %v, 'truncated': <false>}",
                                     g_variant_builder_end(&changes)));
}

static void
fake_restore(Fake *fake, int fd, const VmMessage *request)
{
    const char *name = vm_message_get_string(request, "name", "");
    g_auto(GStrv) paths = vm_message_dup_strv(request, "paths");
    g_autofree char *undo = NULL;

    g_mutex_lock(&fake->lock);
    GHashTable *files =
        g_hash_table_lookup(fake->snapshots, vm_message_get_string(request, "checkpoint", ""));
    if (files != NULL) {
        undo = g_strdup(fake_snapshot(fake));
        for (guint i = 0; i < fake->written->len; i++) {
            const char *path = fake->written->pdata[i];
            if (paths != NULL && !g_strv_contains((const char *const *)paths, path))
                continue;
            GBytes *then = g_hash_table_lookup(files, path);
            if (then != NULL)
                g_file_set_contents(path, g_bytes_get_data(then, NULL),
                                    (gssize)g_bytes_get_size(then), NULL);
            else
                g_unlink(path);
        }
    }
    g_mutex_unlock(&fake->lock);
    if (files == NULL) {
        vm_test_hostd_send_error(fd, VM_ERROR_NOT_FOUND, "no checkpoint");
        return;
    }
    send_agent(fake, fd, name, undo, NULL);
}

static void
child_setup(gpointer data)
{
    setpgid(0, 0);
}

/* Sends what @fd gives as STDOUT or STDERR frames. Returns FALSE at its end. */
static gboolean
forward_output(int fd, int client, VmOp op)
{
    guint8 buffer[VM_STREAM_CHUNK_MAX];
    ssize_t n = read(fd, buffer, sizeof buffer);

    if (n <= 0)
        return n < 0 && errno == EINTR;
    g_autoptr(VmMessage) chunk = vm_message_new_data(op, buffer, (gsize)n);
    vm_message_write_fd(client, chunk, NULL);
    return TRUE;
}

/* Runs the command here, in fake->home unless cwd says otherwise, with the stdin the client
 * sent; a client that goes away kills it, as hostd would end the relay. */
static void
fake_exec(Fake *fake, int fd, const VmMessage *request)
{
    g_autoptr(GByteArray) input = g_byte_array_new();
    g_auto(GStrv) argv = vm_message_dup_strv(request, "argv");
    g_auto(GStrv) env = vm_message_dup_strv(request, "env");
    g_auto(GStrv) envp = g_get_environ();
    const char *cwd = vm_message_get_string(request, "cwd", fake->home);
    int out = -1, err = -1, status;
    GPid pid;

    g_atomic_int_inc(&fake->exec_started);
    if (!vm_test_hostd_read_stdin(fd, input))
        return;
    if (g_strv_length(argv) == 1 && strcmp(argv[0], "sync") == 0) {
        vm_test_hostd_send(fd, VM_OP_EXIT, "{'status': <0>}");
        return;
    }
    for (gsize i = 0; env != NULL && env[i] != NULL; i++) {
        g_auto(GStrv) pair = g_strsplit(env[i], "=", 2);
        envp = g_environ_setenv(envp, pair[0], pair[1], TRUE);
    }
    vm_autofd in = memfd_create("stdin", MFD_CLOEXEC);
    g_assert_true(in >= 0);
    g_assert_true(write(in, input->data, input->len) == (ssize_t)input->len);
    lseek(in, 0, SEEK_SET);
    if (!g_spawn_async_with_pipes_and_fds(cwd, (const char *const *)argv, (const char *const *)envp,
                                          G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD,
                                          child_setup, NULL, in, -1, -1, NULL, NULL, 0, &pid, NULL,
                                          &out, &err, NULL)) {
        vm_test_hostd_send(fd, VM_OP_STDERR, "{'data': <b'command not found\\n'>}");
        vm_test_hostd_send(fd, VM_OP_EXIT, "{'status': <127>}");
        return;
    }
    for (gboolean out_open = TRUE, err_open = TRUE; out_open || err_open;) {
        struct pollfd fds[3] = {{.fd = out_open ? out : -1, .events = POLLIN},
                                {.fd = err_open ? err : -1, .events = POLLIN},
                                {.fd = fd, .events = POLLIN}};
        if (poll(fds, 3, -1) < 0)
            continue;
        if (fds[2].revents != 0) {
            /* Nothing follows STDIN_EOF: the client is gone. */
            kill(-pid, SIGKILL);
            waitpid(pid, NULL, 0);
            close(out);
            close(err);
            g_atomic_int_inc(&fake->exec_cancelled);
            return;
        }
        if (fds[0].revents != 0)
            out_open = forward_output(out, fd, VM_OP_STDOUT);
        if (fds[1].revents != 0)
            err_open = forward_output(err, fd, VM_OP_STDERR);
    }
    close(out);
    close(err);
    waitpid(pid, &status, 0);

    if (argv[0] != NULL && argv[1] != NULL && argv[2] != NULL && argv[3] != NULL &&
        strcmp(argv[3], "vmctl-write-file") == 0 && argv[4] != NULL) {
        g_autofree char *path =
            g_path_is_absolute(argv[4]) ? g_strdup(argv[4]) : g_build_filename(cwd, argv[4], NULL);
        g_mutex_lock(&fake->lock);
        if (!g_ptr_array_find_with_equal_func(fake->written, path, g_str_equal, NULL))
            g_ptr_array_add(fake->written, g_steal_pointer(&path));
        g_mutex_unlock(&fake->lock);
    }
    send_fields(fd, VM_OP_EXIT,
                g_variant_new_parsed("{'status': <%i>}", WIFEXITED(status)
                                                             ? WEXITSTATUS(status)
                                                             : 128 + WTERMSIG(status)));
}

static void
fake_handle(VmTestHostd *hostd, int fd, const VmMessage *request, gpointer user_data)
{
    Fake *fake = user_data;
    const char *name = vm_message_get_string(request, "name", "");
    g_auto(GVariantBuilder) list = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    g_autoptr(GList) names = NULL;
    g_autofree char *from = NULL;
    GVariant *checkpoint;
    const char *id;

    g_mutex_lock(&fake->lock);
    Recorded *recorded = g_new0(Recorded, 1);
    recorded->op = request->op;
    recorded->fields = g_variant_ref(request->fields);
    g_ptr_array_add(fake->requests, recorded);
    gboolean known = g_hash_table_contains(fake->agents, name);
    g_mutex_unlock(&fake->lock);

    if (fake->fail_message != NULL) {
        vm_test_hostd_send_error(fd, fake->fail_code, fake->fail_message);
        return;
    }
    if (!known && request->op != VM_OP_AGENT_LIST && request->op != VM_OP_AGENT_NEW &&
        request->op != VM_OP_AGENT_FORK) {
        g_autofree char *message = g_strdup_printf("no agent '%s'", name);
        vm_test_hostd_send_error(fd, VM_ERROR_NOT_FOUND, message);
        return;
    }
    switch (request->op) {
    case VM_OP_AGENT_LIST:
        g_mutex_lock(&fake->lock);
        names = g_list_sort(g_hash_table_get_keys(fake->agents), (GCompareFunc)strcmp);
        for (GList *l = names; l != NULL; l = l->next)
            g_variant_builder_add_value(&list, agent_variant(fake, l->data));
        g_mutex_unlock(&fake->lock);
        send_fields(fd, VM_OP_RESULT,
                    g_variant_new_parsed("{'agents': %v}", g_variant_builder_end(&list)));
        break;
    case VM_OP_AGENT_INFO:
        send_agent(fake, fd, name, NULL, NULL);
        break;
    case VM_OP_AGENT_NEW:
        fake_progress(fd, "{'message': <'booting'>, 'fraction': <0.25>}");
        fake_progress(fd, "{'message': <'waiting for SSH'>}");
        g_mutex_lock(&fake->lock);
        g_hash_table_insert(fake->agents, g_strdup(name), g_strdup("running"));
        g_mutex_unlock(&fake->lock);
        send_agent(fake, fd, name, NULL, NULL);
        break;
    case VM_OP_AGENT_FORK:
        g_mutex_lock(&fake->lock);
        id = vm_message_get_string(request, "checkpoint", NULL);
        if (id == NULL)
            id = fake_snapshot(fake);
        g_hash_table_insert(fake->agents, g_strdup(name), g_strdup("running"));
        from = g_strdup(id);
        g_mutex_unlock(&fake->lock);
        send_agent(fake, fd, name, NULL, from);
        break;
    case VM_OP_EXEC:
        fake_exec(fake, fd, request);
        break;
    case VM_OP_CHECKPOINT_CREATE:
        fake_progress(fd, "{'message': <'freezing'>}");
        g_mutex_lock(&fake->lock);
        id = fake_snapshot(fake);
        checkpoint = g_variant_new_parsed(
            "{'id': <%s>, 'label': <%s>, 'kind': <'disk'>, 'automatic': <false>, "
            "'created': <int64 1700000100>}",
            id, vm_message_get_string(request, "label", ""));
        g_mutex_unlock(&fake->lock);
        send_fields(fd, VM_OP_RESULT, g_variant_new_parsed("{'checkpoint': %v}", checkpoint));
        break;
    case VM_OP_CHECKPOINT_LIST:
        g_mutex_lock(&fake->lock);
        for (guint i = 0; i < fake->checkpoints->len; i++)
            g_variant_builder_add_parsed(&list, "{'id': <%s>, 'kind': <'disk'>}",
                                         (const char *)fake->checkpoints->pdata[i]);
        g_mutex_unlock(&fake->lock);
        send_fields(fd, VM_OP_RESULT,
                    g_variant_new_parsed("{'checkpoints': %v}", g_variant_builder_end(&list)));
        break;
    case VM_OP_CHECKPOINT_RESTORE:
        fake_restore(fake, fd, request);
        break;
    case VM_OP_CHECKPOINT_DIFF:
        fake_diff(fake, fd, request);
        break;
    case VM_OP_AGENT_SUSPEND:
    case VM_OP_AGENT_RESUME:
        g_mutex_lock(&fake->lock);
        g_hash_table_insert(fake->agents, g_strdup(name),
                            g_strdup(request->op == VM_OP_AGENT_RESUME             ? "running"
                                     : vm_message_get_bool(request, "save", FALSE) ? "saved"
                                                                                   : "paused"));
        g_mutex_unlock(&fake->lock);
        send_agent(fake, fd, name, NULL, NULL);
        break;
    case VM_OP_AGENT_SET_RESOURCES:
        send_fields(fd, VM_OP_RESULT,
                    g_variant_new_parsed("{'agent': %v, 'changes': <['cpus 2: at the next "
                                         "start']>}",
                                         agent_variant(fake, name)));
        break;
    case VM_OP_EGRESS_GET:
        vm_test_hostd_send(fd, VM_OP_RESULT,
                           "{'egress': <{'allow': <['pypi.org']>, 'deny': <@as []>, "
                           "'connections': <uint32 0>, 'proxy': <'http://10.0.2.100:3128'>, "
                           "'wired': <true>}>}");
        break;
    default:
        vm_test_hostd_send_error(fd, VM_ERROR_FAILED, "the fake hostd does not do that");
        break;
    }
}

/* ---- The MCP server, on pipes, against the fake */

typedef struct {
    char *tmpdir;
    char *home;
    char *socket_path;
    VmTestHostd *hostd;
    Fake fake;
    VmctlEndpoint endpoint;
    VmctlMcpOptions options;
    char **agents;
    int to_server[2];
    int from_server[2];
    GThread *server;
    GString *pending;
    GPtrArray *notifications; /* JsonObject, seen while waiting for answers */
    gint64 next_id;
} Mcp;

static int
mcp_setup(void **state)
{
    Mcp *f = g_new0(Mcp, 1);

    f->tmpdir = vm_test_make_tmpdir("test-vmctl-mcp-XXXXXX");
    f->home = g_build_filename(f->tmpdir, "home", NULL);
    assert_int_equal(g_mkdir(f->home, 0700), 0);
    f->socket_path = g_build_filename(f->tmpdir, "hostd.sock", NULL);
    fake_init(&f->fake, f->home);
    f->hostd = vm_test_hostd_new(f->socket_path);
    vm_test_hostd_serve(f->hostd, fake_handle, &f->fake);
    f->endpoint.socket_path = f->socket_path;
    f->options.endpoint = &f->endpoint;
    f->pending = g_string_new(NULL);
    f->notifications = g_ptr_array_new_with_free_func((GDestroyNotify)json_object_unref);
    f->to_server[0] = f->to_server[1] = f->from_server[0] = f->from_server[1] = -1;
    *state = f;
    return 0;
}

static gpointer
serve_thread(gpointer data)
{
    Mcp *f = data;
    gboolean ok = vmctl_mcp_serve(&f->options, f->to_server[0], f->from_server[1], NULL);

    close(f->from_server[1]);
    return GINT_TO_POINTER(ok);
}

/* Starts the server with f->options. */
static void
mcp_start(Mcp *f)
{
    assert_int_equal(pipe2(f->to_server, O_CLOEXEC), 0);
    assert_int_equal(pipe2(f->from_server, O_CLOEXEC), 0);
    f->server = g_thread_new("vmctl-mcp", serve_thread, f);
}

/* Ends the input, as a client does to stop the server, and waits for the server to end. */
static gboolean
mcp_stop(Mcp *f)
{
    gboolean ok = TRUE;

    if (f->server == NULL)
        return TRUE;
    close(f->to_server[1]);
    ok = GPOINTER_TO_INT(g_thread_join(f->server));
    f->server = NULL;
    close(f->to_server[0]);
    close(f->from_server[0]);
    return ok;
}

static int
mcp_teardown(void **state)
{
    Mcp *f = *state;

    mcp_stop(f);
    vm_test_hostd_free(f->hostd);
    fake_clear(&f->fake);
    vm_test_remove_tree(f->tmpdir);
    g_string_free(f->pending, TRUE);
    g_ptr_array_unref(f->notifications);
    g_strfreev(f->agents);
    g_free(f->socket_path);
    g_free(f->home);
    g_free(f->tmpdir);
    g_free(f);
    return 0;
}

static void
mcp_send(Mcp *f, const char *text)
{
    g_autofree char *line = g_strconcat(text, "\n", NULL);

    assert_int_equal(write(f->to_server[1], line, strlen(line)), (ssize_t)strlen(line));
}

/* The next message the server writes, or NULL when none comes within @timeout_ms or it ended.
 * New reference. */
static JsonObject *
mcp_read(Mcp *f, int timeout_ms)
{
    for (;;) {
        char *newline = memchr(f->pending->str, '\n', f->pending->len);
        if (newline != NULL) {
            g_autofree char *line = g_strndup(f->pending->str, newline - f->pending->str);
            g_autoptr(GError) error = NULL;
            g_string_erase(f->pending, 0, newline - f->pending->str + 1);
            g_autoptr(JsonNode) node = json_from_string(line, &error);
            vm_test_assert_no_error(error);
            assert_true(JSON_NODE_HOLDS_OBJECT(node));
            return json_object_ref(json_node_get_object(node));
        }
        struct pollfd pfd = {.fd = f->from_server[0], .events = POLLIN};
        if (poll(&pfd, 1, timeout_ms) <= 0)
            return NULL;
        char buffer[65536];
        ssize_t n = read(f->from_server[0], buffer, sizeof buffer);
        if (n <= 0)
            return NULL;
        g_string_append_len(f->pending, buffer, n);
    }
}

/* Sends request @method with @params (JSON text, NULL: none) and returns its answer;
 * notifications that come first are kept in f->notifications. */
static JsonObject *
mcp_call(Mcp *f, const char *method, const char *params)
{
    gint64 id = ++f->next_id;
    g_autofree char *request = g_strdup_printf(
        "{\"jsonrpc\":\"2.0\",\"id\":%" G_GINT64_FORMAT ",\"method\":\"%s\"%s%s}", id, method,
        params != NULL ? ",\"params\":" : "", params != NULL ? params : "");

    mcp_send(f, request);
    for (;;) {
        g_autoptr(JsonObject) message = mcp_read(f, READ_TIMEOUT_MS);
        assert_non_null(message);
        if (!json_object_has_member(message, "id")) {
            g_ptr_array_add(f->notifications, g_steal_pointer(&message));
            continue;
        }
        assert_int_equal(json_object_get_int_member(message, "id"), id);
        return g_steal_pointer(&message);
    }
}

static void
mcp_initialize(Mcp *f)
{
    g_autoptr(JsonObject) answer =
        mcp_call(f, "initialize",
                 "{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},"
                 "\"clientInfo\":{\"name\":\"test\",\"version\":\"1\"}}");

    assert_true(json_object_has_member(answer, "result"));
    mcp_send(f, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}");
}

/* tools/call of @name with @arguments (JSON text): its result object. */
static JsonObject *
tool_result(Mcp *f, const char *name, const char *arguments)
{
    g_autofree char *params =
        g_strdup_printf("{\"name\":\"%s\",\"arguments\":%s}", name, arguments);
    g_autoptr(JsonObject) answer = mcp_call(f, "tools/call", params);

    if (!json_object_has_member(answer, "result")) {
        g_autofree char *text = json_to_string(json_object_get_member(answer, "error"), FALSE);
        fail_msg("tools/call %s failed: %s", name, text);
    }
    return json_object_ref(json_object_get_object_member(answer, "result"));
}

/* The structured result of a successful call, whose text is that result's JSON. */
static JsonObject *
tool_ok(Mcp *f, const char *name, const char *arguments)
{
    g_autoptr(JsonObject) result = tool_result(f, name, arguments);
    g_autoptr(GError) error = NULL;

    if (json_object_get_boolean_member(result, "isError")) {
        g_autofree char *text = json_to_string(json_object_get_member(result, "content"), FALSE);
        fail_msg("%s is a tool error: %s", name, text);
    }
    JsonObject *structured = json_object_get_object_member(result, "structuredContent");
    assert_non_null(structured);
    JsonArray *content = json_object_get_array_member(result, "content");
    assert_int_equal(json_array_get_length(content), 1);
    JsonObject *item = json_array_get_object_element(content, 0);
    assert_string_equal(json_object_get_string_member(item, "type"), "text");
    g_autoptr(JsonNode) text =
        json_from_string(json_object_get_string_member(item, "text"), &error);
    vm_test_assert_no_error(error);
    g_autoptr(JsonNode) node = json_node_init_object(json_node_alloc(), structured);
    assert_true(json_node_equal(text, node));
    return json_object_ref(structured);
}

/* A tool error of @code_name whose message holds @needle. */
static void
tool_fails(Mcp *f, const char *name, const char *arguments, const char *code_name,
           const char *needle)
{
    g_autoptr(JsonObject) result = tool_result(f, name, arguments);
    g_autoptr(GError) error = NULL;

    assert_true(json_object_get_boolean_member(result, "isError"));
    assert_false(json_object_has_member(result, "structuredContent"));
    JsonObject *item =
        json_array_get_object_element(json_object_get_array_member(result, "content"), 0);
    g_autoptr(JsonNode) text =
        json_from_string(json_object_get_string_member(item, "text"), &error);
    vm_test_assert_no_error(error);
    JsonObject *failure = json_object_get_object_member(json_node_get_object(text), "error");
    assert_string_equal(json_object_get_string_member(failure, "code"), code_name);
    const char *message = json_object_get_string_member(failure, "message");
    if (strstr(message, needle) == NULL)
        fail_msg("%s: '%s' lacks '%s'", name, message, needle);
}

/* A JSON-RPC error @code for tools/call with @params. */
static void
call_fails(Mcp *f, const char *params, int code, const char *needle)
{
    g_autoptr(JsonObject) answer = mcp_call(f, "tools/call", params);
    JsonObject *error = json_object_get_object_member(answer, "error");

    assert_non_null(error);
    assert_int_equal(json_object_get_int_member(error, "code"), code);
    const char *message = json_object_get_string_member(error, "message");
    if (strstr(message, needle) == NULL)
        fail_msg("'%s' lacks '%s'", message, needle);
}

/* The fields of the last request the fake got with @op (a new reference), or NULL. */
static GVariant *
last_request(Mcp *f, VmOp op)
{
    GVariant *fields = NULL;

    g_mutex_lock(&f->fake.lock);
    for (guint i = f->fake.requests->len; i > 0 && fields == NULL; i--) {
        Recorded *recorded = f->fake.requests->pdata[i - 1];
        if (recorded->op == op)
            fields = g_variant_ref(recorded->fields);
    }
    g_mutex_unlock(&f->fake.lock);
    return fields;
}

/* @fields (an a{sv}) holds exactly the entries of @expected (GVariant text), in any order. */
static void
assert_fields(GVariant *fields, const char *expected)
{
    g_autoptr(GVariant) want = g_variant_ref_sink(g_variant_new_parsed(expected));
    GVariantIter iter;
    const char *key;
    GVariant *value;

    assert_non_null(fields);
    assert_int_equal(g_variant_n_children(fields), g_variant_n_children(want));
    g_variant_iter_init(&iter, want);
    while (g_variant_iter_next(&iter, "{&sv}", &key, &value)) {
        g_autoptr(GVariant) owned = value;
        g_autoptr(GVariant) got = g_variant_lookup_value(fields, key, NULL);
        if (got == NULL || !g_variant_equal(got, value))
            fail_msg("field '%s' is not as expected", key);
    }
}

static guint
request_count(Mcp *f)
{
    g_mutex_lock(&f->fake.lock);
    guint n = f->fake.requests->len;
    g_mutex_unlock(&f->fake.lock);
    return n;
}

static const char *
string_member(JsonObject *object, const char *name)
{
    assert_true(json_object_has_member(object, name));
    return json_object_get_string_member(object, name);
}

static void
test_mcp_initialize(void **state)
{
    Mcp *f = *state;
    static const struct {
        const char *asked, *given;
    } versions[] = {
        {"2025-06-18", "2025-06-18"}, {"2025-03-26", "2025-03-26"}, {"2024-11-05", "2024-11-05"},
        {"2025-11-25", "2025-06-18"}, {"1999-01-01", "2025-06-18"},
    };

    mcp_start(f);
    for (gsize i = 0; i < G_N_ELEMENTS(versions); i++) {
        g_autofree char *params =
            g_strdup_printf("{\"protocolVersion\":\"%s\",\"capabilities\":{},"
                            "\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}",
                            versions[i].asked);
        g_autoptr(JsonObject) answer = mcp_call(f, "initialize", params);
        JsonObject *result = json_object_get_object_member(answer, "result");
        assert_string_equal(string_member(result, "protocolVersion"), versions[i].given);
        JsonObject *capabilities = json_object_get_object_member(result, "capabilities");
        assert_true(json_object_has_member(capabilities, "tools"));
        assert_string_equal(
            string_member(json_object_get_object_member(result, "serverInfo"), "name"), "vmctl");
    }
    g_autoptr(JsonObject) bad = mcp_call(f, "initialize", "{\"capabilities\":{}}");
    assert_int_equal(
        json_object_get_int_member(json_object_get_object_member(bad, "error"), "code"),
        VMCTL_RPC_INVALID_PARAMS);
    g_autoptr(JsonObject) ping = mcp_call(f, "ping", NULL);
    assert_int_equal(json_object_get_size(json_object_get_object_member(ping, "result")), 0);
    g_autoptr(JsonObject) unknown = mcp_call(f, "resources/list", "{}");
    assert_int_equal(
        json_object_get_int_member(json_object_get_object_member(unknown, "error"), "code"),
        VMCTL_RPC_METHOD_NOT_FOUND);
    g_autoptr(JsonObject) cursor = mcp_call(f, "tools/list", "{\"cursor\":\"x\"}");
    assert_int_equal(
        json_object_get_int_member(json_object_get_object_member(cursor, "error"), "code"),
        VMCTL_RPC_INVALID_PARAMS);
    /* Nothing asked hostd anything. */
    assert_int_equal(request_count(f), 0);
}

/* The names of the tools tools/list gives, sorted, joined with spaces. */
static char *
tool_names(Mcp *f, JsonObject **ret_exec)
{
    g_autoptr(JsonObject) answer = mcp_call(f, "tools/list", "{}");
    JsonArray *tools =
        json_object_get_array_member(json_object_get_object_member(answer, "result"), "tools");
    g_autoptr(GPtrArray) names = g_ptr_array_new();

    for (guint i = 0; i < json_array_get_length(tools); i++) {
        JsonObject *tool = json_array_get_object_element(tools, i);
        JsonObject *input = json_object_get_object_member(tool, "inputSchema");
        JsonObject *output = json_object_get_object_member(tool, "outputSchema");
        assert_string_equal(string_member(input, "type"), "object");
        assert_string_equal(string_member(output, "type"), "object");
        assert_false(json_object_get_boolean_member(input, "additionalProperties"));
        assert_non_null(json_object_get_object_member(tool, "annotations"));
        assert_true(strlen(string_member(tool, "description")) > 20);
        g_ptr_array_add(names, (gpointer)string_member(tool, "name"));
        if (ret_exec != NULL && strcmp(string_member(tool, "name"), "exec") == 0)
            *ret_exec = json_object_ref(tool);
    }
    g_ptr_array_sort(names, compare_strings);
    g_ptr_array_add(names, NULL);
    return g_strjoinv(" ", (char **)names->pdata);
}

static void
test_mcp_tools_list(void **state)
{
    Mcp *f = *state;
    g_autoptr(JsonObject) exec = NULL;

    mcp_start(f);
    mcp_initialize(f);
    g_autofree char *names = tool_names(f, &exec);
    assert_string_equal(names, "agent_info checkpoint diff egress_show exec fork list_agents "
                               "list_checkpoints new_agent read_file restore resume "
                               "set_resources suspend write_file");
    JsonObject *properties = json_object_get_object_member(
        json_object_get_object_member(exec, "inputSchema"), "properties");
    JsonObject *name = json_object_get_object_member(properties, "name");
    assert_string_equal(string_member(name, "pattern"), "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$");
    assert_false(json_object_has_member(name, "enum"));
    JsonObject *timeout = json_object_get_object_member(properties, "timeout_s");
    assert_int_equal(json_object_get_int_member(timeout, "default"), VMCTL_MCP_TIMEOUT_DEFAULT);
    assert_int_equal(json_object_get_int_member(timeout, "maximum"), VMCTL_MCP_TIMEOUT_MAX);
    JsonArray *required = json_object_get_array_member(
        json_object_get_object_member(exec, "inputSchema"), "required");
    assert_int_equal(json_array_get_length(required), 2);
    JsonObject *hints = json_object_get_object_member(exec, "annotations");
    assert_false(json_object_get_boolean_member(hints, "readOnlyHint"));
    assert_true(json_object_get_boolean_member(hints, "destructiveHint"));
}

static void
test_mcp_read_only(void **state)
{
    Mcp *f = *state;

    f->options.read_only = TRUE;
    mcp_start(f);
    mcp_initialize(f);
    g_autofree char *names = tool_names(f, NULL);
    assert_string_equal(names, "agent_info diff egress_show list_agents list_checkpoints "
                               "read_file");
    call_fails(f, "{\"name\":\"exec\",\"arguments\":{\"name\":\"a1\",\"command\":[\"true\"]}}",
               VMCTL_RPC_INVALID_PARAMS, "Unknown tool: exec (this server is read-only)");
    call_fails(f, "{\"name\":\"new_agent\",\"arguments\":{\"name\":\"a2\"}}",
               VMCTL_RPC_INVALID_PARAMS, "read-only");
    g_autoptr(JsonObject) info = tool_ok(f, "agent_info", "{\"name\":\"a1\"}");
    assert_int_equal(request_count(f), 1);
}

static void
test_mcp_agents(void **state)
{
    Mcp *f = *state;
    g_autoptr(JsonObject) exec = NULL;

    f->agents = g_strsplit("a1 b7", " ", -1);
    f->options.agents = (const char *const *)f->agents;
    g_mutex_lock(&f->fake.lock);
    g_hash_table_insert(f->fake.agents, g_strdup("other"), g_strdup("running"));
    g_mutex_unlock(&f->fake.lock);
    mcp_start(f);
    mcp_initialize(f);

    /* Listed: only what is served and exists. */
    g_autoptr(JsonObject) listed = tool_ok(f, "list_agents", "{}");
    JsonArray *agents = json_object_get_array_member(listed, "agents");
    assert_int_equal(json_array_get_length(agents), 1);
    assert_string_equal(string_member(json_array_get_object_element(agents, 0), "name"), "a1");

    /* Refused before hostd is asked. */
    guint before = request_count(f);
    tool_fails(f, "agent_info", "{\"name\":\"other\"}", "not-found",
               "no agent 'other' on this MCP server (it serves only: a1, b7)");
    tool_fails(f, "exec", "{\"name\":\"other\",\"command\":[\"true\"]}", "not-found", "other");
    tool_fails(f, "fork", "{\"source\":\"other\",\"name\":\"a1\"}", "not-found", "other");
    tool_fails(f, "fork", "{\"source\":\"a1\",\"name\":\"zz\"}", "not-found", "zz");
    tool_fails(f, "new_agent", "{\"name\":\"zz\"}", "not-found", "zz");
    assert_int_equal(request_count(f), before);

    /* A served name that does not exist yet may be made. */
    g_autoptr(JsonObject) made = tool_ok(f, "new_agent", "{\"name\":\"b7\"}");
    assert_string_equal(string_member(json_object_get_object_member(made, "agent"), "name"), "b7");

    g_autofree char *names = tool_names(f, &exec);
    JsonObject *name = json_object_get_object_member(
        json_object_get_object_member(json_object_get_object_member(exec, "inputSchema"),
                                      "properties"),
        "name");
    g_autofree char *choices = json_to_string(json_object_get_member(name, "enum"), FALSE);
    assert_string_equal(choices, "[\"a1\",\"b7\"]");
}

static void
test_mcp_agent_tools(void **state)
{
    Mcp *f = *state;

    mcp_start(f);
    mcp_initialize(f);

    g_autoptr(JsonObject) listed = tool_ok(f, "list_agents", "{}");
    JsonObject *first =
        json_array_get_object_element(json_object_get_array_member(listed, "agents"), 0);
    assert_string_equal(string_member(first, "name"), "a1");
    assert_int_equal(json_object_get_int_member(first, "disk_bytes"), 4096);

    g_autoptr(JsonObject) info = tool_ok(f, "agent_info", "{\"name\":\"a1\"}");
    assert_string_equal(string_member(json_object_get_object_member(info, "agent"), "state"),
                        "running");
    g_autoptr(GVariant) asked = last_request(f, VM_OP_AGENT_INFO);
    assert_non_null(asked);

    g_autoptr(JsonObject) made =
        tool_ok(f, "new_agent",
                "{\"name\":\"a2\",\"template\":\"debian-12\",\"cpus\":2,\"memory_mib\":1024.0,"
                "\"disk_gib\":8,\"user_data\":\"#cloud-config\\n\",\"wait\":false}");
    g_autoptr(GVariant) new = last_request(f, VM_OP_AGENT_NEW);
    assert_fields(new, "{'name': <'a2'>, 'template': <'debian-12'>, 'cpus': <uint32 2>, "
                       "'memory_mib': <uint32 1024>, 'disk_gib': <uint32 8>, "
                       "'user_data': <'#cloud-config\\n'>, 'wait': <false>}");

    /* The disk limits, 0 (no limit) too; over the maximum refused before hostd hears of it. */
    g_autoptr(JsonObject) limited = tool_ok(
        f, "new_agent", "{\"name\":\"a4\",\"disk_read_mib\":0,\"disk_write_iops\":1000000}");
    g_autoptr(GVariant) limits = last_request(f, VM_OP_AGENT_NEW);
    assert_fields(limits, "{'name': <'a4'>, 'disk_read_mib': <uint32 0>, "
                          "'disk_write_iops': <uint32 1000000>, 'wait': <true>}");
    tool_fails(f, "new_agent", "{\"name\":\"a5\",\"disk_write_mib\":1000001}", "invalid-argument",
               "disk_write_mib");

    /* Keys are checked as vmctl new --ssh-key checks them: what hostd gets is the key, trimmed. */
    g_autofree char *key_path = vm_test_data_path("ssh-keys", "ed25519.pub", NULL);
    g_autofree char *key_text = vm_test_read_file(key_path);
    g_strstrip(key_text);
    g_autofree char *with_keys =
        g_strdup_printf("{\"name\":\"a3\",\"ssh_keys\":[\"  %s \"]}", key_text);
    g_autoptr(JsonObject) keyed = tool_ok(f, "new_agent", with_keys);
    g_autoptr(GVariant) keyed_new = last_request(f, VM_OP_AGENT_NEW);
    g_autoptr(GVariant) sent = g_variant_lookup_value(keyed_new, "ssh_keys", NULL);
    assert_non_null(sent);
    g_autoptr(GVariant) first_key = g_variant_get_child_value(sent, 0);
    assert_string_equal(g_variant_get_string(first_key, NULL), key_text);
    guint before_bad = request_count(f);
    g_autofree char *bad_keys = g_strdup_printf(
        "{\"name\":\"a3\",\"ssh_keys\":[\"%s\",\"no-pty %s\"]}", key_text, key_text);
    tool_fails(f, "new_agent", bad_keys, "invalid-argument",
               "argument 'ssh_keys', entry 2: key options");
    tool_fails(f, "new_agent", "{\"name\":\"a3\",\"ssh_keys\":[]}", "invalid-argument", "ssh_keys");
    assert_int_equal(request_count(f), before_bad);

    g_autoptr(JsonObject) paused = tool_ok(f, "suspend", "{\"name\":\"a1\"}");
    assert_string_equal(string_member(json_object_get_object_member(paused, "agent"), "state"),
                        "paused");
    g_autoptr(JsonObject) saved = tool_ok(f, "suspend", "{\"name\":\"a1\",\"save\":true}");
    assert_string_equal(string_member(json_object_get_object_member(saved, "agent"), "state"),
                        "saved");
    g_autoptr(JsonObject) resumed = tool_ok(f, "resume", "{\"name\":\"a1\"}");
    assert_string_equal(string_member(json_object_get_object_member(resumed, "agent"), "state"),
                        "running");
    g_autoptr(JsonObject) resized =
        tool_ok(f, "set_resources", "{\"name\":\"a1\",\"cpus\":2,\"disk_gib\":20}");
    g_autoptr(GVariant) set_request = last_request(f, VM_OP_AGENT_SET_RESOURCES);
    guint32 sent_cpus = 0, sent_disk = 0;
    assert_true(g_variant_lookup(set_request, "cpus", "u", &sent_cpus));
    assert_true(g_variant_lookup(set_request, "disk_gib", "u", &sent_disk));
    assert_int_equal(sent_cpus * 100 + sent_disk, 220);
    assert_false(g_variant_lookup(set_request, "memory_mib", "u", &sent_cpus));
    g_autofree char *said = json_to_string(json_object_get_member(resized, "changes"), FALSE);
    assert_string_equal(said, "[\"cpus 2: at the next start\"]");
    tool_fails(f, "set_resources", "{\"name\":\"a1\",\"cpus\":0}", "invalid-argument", "cpus");
    g_autoptr(JsonObject) egress = tool_ok(f, "egress_show", "{\"name\":\"a1\"}");
    g_autofree char *allow = json_to_string(
        json_object_get_member(json_object_get_object_member(egress, "egress"), "allow"), FALSE);
    assert_string_equal(allow, "[\"pypi.org\"]");

    /* hostd's errors, with vmctl's code names. */
    tool_fails(f, "agent_info", "{\"name\":\"zz\"}", "not-found", "no agent 'zz'");
    f->fake.fail_code = VM_ERROR_BAD_STATE;
    f->fake.fail_message = "agent 'a1' is stopped";
    tool_fails(f, "resume", "{\"name\":\"a1\"}", "bad-state", "agent 'a1' is stopped");
    f->fake.fail_message = NULL;
}

static void
test_mcp_exec(void **state)
{
    Mcp *f = *state;

    mcp_start(f);
    mcp_initialize(f);

    g_autoptr(JsonObject) run =
        tool_ok(f, "exec",
                "{\"name\":\"a1\",\"command\":[\"sh\",\"-c\",\"echo out; echo err >&2; exit 3\"]}");
    assert_int_equal(json_object_get_int_member(run, "exit_status"), 3);
    assert_string_equal(string_member(run, "stdout"), "out\n");
    assert_string_equal(string_member(run, "stderr"), "err\n");
    assert_int_equal(json_object_get_int_member(run, "stdout_bytes"), 4);
    assert_false(json_object_get_boolean_member(run, "stdout_truncated"));
    assert_string_equal(string_member(run, "encoding"), "text");

    g_autoptr(JsonObject) env = tool_ok(
        f, "exec",
        "{\"name\":\"a1\",\"command\":[\"sh\",\"-c\",\"printf '%s:%s' \\\"$GREETING\\\" \\\"$(pwd)"
        "\\\"\"],\"env\":{\"GREETING\":\"hi there\"},\"workdir\":\"/\",\"stdin\":\"ignored\"}");
    assert_string_equal(string_member(env, "stdout"), "hi there:/");
    g_autoptr(GVariant) sent = last_request(f, VM_OP_EXEC);
    g_autoptr(GVariant) sent_env = g_variant_lookup_value(sent, "env", G_VARIANT_TYPE("as"));
    g_autofree char *env_text = g_variant_print(sent_env, FALSE);
    assert_string_equal(env_text, "['GREETING=hi there']");
    g_autoptr(GVariant) cwd = g_variant_lookup_value(sent, "cwd", G_VARIANT_TYPE("s"));
    assert_string_equal(g_variant_get_string(cwd, NULL), "/");

    g_autoptr(JsonObject) cat =
        tool_ok(f, "exec", "{\"name\":\"a1\",\"command\":[\"cat\"],\"stdin\":\"h\\u00e9llo\\n\"}");
    assert_string_equal(string_member(cat, "stdout"), "h\xc3\xa9llo\n");

    /* Bytes both ways, and output that is not text. */
    g_autoptr(JsonObject) bytes = tool_ok(f, "exec",
                                          "{\"name\":\"a1\",\"command\":[\"cat\"],"
                                          "\"stdin_base64\":\"AP/+\",\"output_encoding\":"
                                          "\"base64\"}");
    assert_string_equal(string_member(bytes, "stdout"), "AP/+");
    assert_string_equal(string_member(bytes, "encoding"), "base64");
    g_autoptr(JsonObject) mangled =
        tool_ok(f, "exec", "{\"name\":\"a1\",\"command\":[\"cat\"],\"stdin_base64\":\"YQBi/2M=\"}");
    assert_string_equal(string_member(mangled, "stdout"), "a\xef\xbf\xbd"
                                                          "b\xef\xbf\xbd"
                                                          "c");

    /* Bounded: counted, cut, said. */
    g_autoptr(JsonObject) big =
        tool_ok(f, "exec",
                "{\"name\":\"a1\",\"command\":[\"sh\",\"-c\",\"yes | head -c 300000; "
                "yes e | head -c 10 >&2\"],\"max_output_bytes\":1000}");
    assert_int_equal(strlen(string_member(big, "stdout")), 1000);
    assert_int_equal(json_object_get_int_member(big, "stdout_bytes"), 300000);
    assert_true(json_object_get_boolean_member(big, "stdout_truncated"));
    assert_int_equal(json_object_get_int_member(big, "stderr_bytes"), 10);
    assert_false(json_object_get_boolean_member(big, "stderr_truncated"));
}

static void
test_mcp_arguments(void **state)
{
    Mcp *f = *state;
    static const struct {
        const char *tool, *arguments, *code, *needle;
    } cases[] = {
        {"exec", "{\"command\":[\"true\"]}", "invalid-argument", "missing argument 'name' of exec"},
        {"exec", "{\"name\":\"a1\"}", "invalid-argument", "missing argument 'command' of exec"},
        {"exec", "{\"name\":\"a1\",\"command\":\"ls\"}", "invalid-argument",
         "argument 'command' must be an array of 1 to 4096 strings"},
        {"exec", "{\"name\":\"a1\",\"command\":[]}", "invalid-argument", "argument 'command'"},
        {"exec", "{\"name\":\"a1\",\"command\":[1]}", "invalid-argument", "argument 'command'"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"bogus\":1}", "invalid-argument",
         "unknown argument 'bogus' of exec"},
        {"exec", "{\"name\":\"A1\",\"command\":[\"true\"]}", "invalid-argument",
         "invalid name 'A1': must start with a lower-case letter a-z"},
        {"exec", "{\"name\":\"../x\",\"command\":[\"true\"]}", "invalid-argument", "invalid name"},
        {"exec", "{\"name\":7,\"command\":[\"true\"]}", "invalid-argument",
         "argument 'name' must be an agent name"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"timeout_s\":0}", "invalid-argument",
         "argument 'timeout_s' must be an integer from 1 to 86400"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"timeout_s\":1.5}", "invalid-argument",
         "argument 'timeout_s' must be an integer"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"timeout_s\":\"5\"}", "invalid-argument",
         "argument 'timeout_s' must be an integer"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"max_output_bytes\":4194305}",
         "invalid-argument", "argument 'max_output_bytes' must be an integer from 0 to 4194304"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"output_encoding\":\"hex\"}",
         "invalid-argument", "argument 'output_encoding' must be one of text, base64"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"env\":{\"A=B\":\"c\"}}",
         "invalid-argument", "argument 'env' has a bad name 'A=B'"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"env\":{\"\":\"c\"}}",
         "invalid-argument", "argument 'env' has a bad name ''"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"env\":{\"A\":1}}", "invalid-argument",
         "argument 'env' must be an object"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"env\":[\"A=1\"]}", "invalid-argument",
         "argument 'env' must be an object"},
        {"exec",
         "{\"name\":\"a1\",\"command\":[\"true\"],\"stdin\":\"a\",\"stdin_base64\":\"YQ==\"}",
         "invalid-argument", "give stdin or stdin_base64, not both"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"stdin_base64\":\"not base64!\"}",
         "invalid-argument", "argument 'stdin_base64' is not base64"},
        {"exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"workdir\":\"\"}", "invalid-argument",
         "argument 'workdir' must be 1 to 4096 bytes"},
        {"suspend", "{\"name\":\"a1\",\"save\":\"yes\"}", "invalid-argument",
         "argument 'save' must be true or false"},
        {"checkpoint", "{\"name\":\"a1\",\"label\":7}", "invalid-argument",
         "argument 'label' must be a string"},
        {"restore", "{\"name\":\"a1\",\"checkpoint\":\"\"}", "invalid-argument",
         "argument 'checkpoint' must be 1 to 256 bytes"},
        {"restore", "{\"name\":\"a1\",\"checkpoint\":\"c1\",\"paths\":[]}", "invalid-argument",
         "argument 'paths' must be an array of 1 to 64 strings"},
        {"write_file", "{\"name\":\"a1\",\"path\":\"x\",\"content\":\"\",\"mode\":\"999\"}",
         "invalid-argument", "argument 'mode' must be 3 or 4 octal digits"},
        {"write_file", "{\"name\":\"a1\",\"path\":\"x\",\"content\":\"%\",\"encoding\":\"base64\"}",
         "invalid-argument", "argument 'content' is not base64"},
        {"read_file", "{\"name\":\"a1\",\"path\":\"\"}", "invalid-argument",
         "argument 'path' must be 1 to 4096 bytes"},
        {"list_agents", "{\"x\":null}", "invalid-argument", "unknown argument 'x'"},
    };

    mcp_start(f);
    mcp_initialize(f);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++)
        tool_fails(f, cases[i].tool, cases[i].arguments, cases[i].code, cases[i].needle);
    /* Refused before anything is asked of hostd. */
    assert_int_equal(request_count(f), 0);

    /* null stands for an argument left out. */
    g_autoptr(JsonObject) run =
        tool_ok(f, "exec", "{\"name\":\"a1\",\"command\":[\"true\"],\"timeout_s\":null}");
    assert_int_equal(json_object_get_int_member(run, "exit_status"), 0);
    g_autoptr(JsonObject) empty = tool_ok(f, "list_agents", "null");

    call_fails(f, "{\"arguments\":{}}", VMCTL_RPC_INVALID_PARAMS, "name must be a string");
    call_fails(f, "{\"name\":3}", VMCTL_RPC_INVALID_PARAMS, "name must be a string");
    call_fails(f, "{\"name\":\"exec\",\"arguments\":[1]}", VMCTL_RPC_INVALID_PARAMS,
               "arguments must be an object");
    call_fails(f, "{\"name\":\"no_such_tool\",\"arguments\":{}}", VMCTL_RPC_INVALID_PARAMS,
               "Unknown tool: no_such_tool");
    g_autoptr(JsonObject) no_params = mcp_call(f, "tools/call", NULL);
    assert_int_equal(
        json_object_get_int_member(json_object_get_object_member(no_params, "error"), "code"),
        VMCTL_RPC_INVALID_PARAMS);
}

static void
test_mcp_files(void **state)
{
    Mcp *f = *state;
    g_autofree char *dir = g_build_filename(f->home, "d", NULL);

    mcp_start(f);
    mcp_initialize(f);

    g_autoptr(JsonObject) wrote = tool_ok(
        f, "write_file",
        "{\"name\":\"a1\",\"path\":\"d/e/notes.txt\",\"content\":\"one\\n\",\"make_parents\":true,"
        "\"mode\":\"0600\"}");
    assert_int_equal(json_object_get_int_member(wrote, "bytes"), 4);
    g_autofree char *path = g_build_filename(f->home, "d", "e", "notes.txt", NULL);
    g_autofree char *contents = NULL;
    assert_true(g_file_get_contents(path, &contents, NULL, NULL));
    assert_string_equal(contents, "one\n");
    GStatBuf st;
    assert_int_equal(g_stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    g_autoptr(JsonObject) appended = tool_ok(
        f, "write_file",
        "{\"name\":\"a1\",\"path\":\"d/e/notes.txt\",\"content\":\"two\\n\",\"append\":true}");

    g_autoptr(JsonObject) read =
        tool_ok(f, "read_file", "{\"name\":\"a1\",\"path\":\"d/e/notes.txt\"}");
    assert_string_equal(string_member(read, "content"), "one\ntwo\n");
    assert_string_equal(string_member(read, "encoding"), "text");
    assert_int_equal(json_object_get_int_member(read, "bytes"), 8);
    assert_false(json_object_get_boolean_member(read, "truncated"));
    g_autoptr(JsonObject) cut =
        tool_ok(f, "read_file", "{\"name\":\"a1\",\"path\":\"d/e/notes.txt\",\"max_bytes\":3}");
    assert_string_equal(string_member(cut, "content"), "one");
    assert_true(json_object_get_boolean_member(cut, "truncated"));

    /* Every byte there and back; text asked for bytes that are not text gives base64. */
    g_autoptr(JsonObject) binary = tool_ok(f, "write_file",
                                           "{\"name\":\"a1\",\"path\":\"b.bin\",\"content\":"
                                           "\"AAEC/wD+\",\"encoding\":\"base64\"}");
    assert_int_equal(json_object_get_int_member(binary, "bytes"), 6);
    g_autoptr(JsonObject) back =
        tool_ok(f, "read_file", "{\"name\":\"a1\",\"path\":\"b.bin\",\"encoding\":\"base64\"}");
    assert_string_equal(string_member(back, "content"), "AAEC/wD+");
    g_autoptr(JsonObject) fallback =
        tool_ok(f, "read_file", "{\"name\":\"a1\",\"path\":\"b.bin\"}");
    assert_string_equal(string_member(fallback, "encoding"), "base64");

    g_autoptr(JsonObject) empty_file =
        tool_ok(f, "write_file", "{\"name\":\"a1\",\"path\":\"empty\",\"content\":\"\"}");
    assert_int_equal(json_object_get_int_member(empty_file, "bytes"), 0);
    g_autoptr(JsonObject) empty = tool_ok(f, "read_file", "{\"name\":\"a1\",\"path\":\"empty\"}");
    assert_string_equal(string_member(empty, "content"), "");
    assert_string_equal(string_member(empty, "encoding"), "text");
    g_autoptr(JsonObject) empty64 =
        tool_ok(f, "read_file", "{\"name\":\"a1\",\"path\":\"empty\",\"encoding\":\"base64\"}");
    assert_string_equal(string_member(empty64, "content"), "");
    tool_fails(f, "read_file", "{\"name\":\"a1\",\"path\":\"missing.txt\"}", "not-found",
               "no file 'missing.txt' in agent 'a1'");
    tool_fails(f, "read_file", "{\"name\":\"a1\",\"path\":\"d\"}", "invalid-argument",
               "'d' in agent 'a1' is a directory");
    tool_fails(f, "write_file", "{\"name\":\"a1\",\"path\":\"d\",\"content\":\"x\"}", "failed",
               "cannot write 'd' in agent 'a1': ");
    tool_fails(f, "write_file", "{\"name\":\"a1\",\"path\":\"no/such/dir/x\",\"content\":\"x\"}",
               "failed", "cannot write 'no/such/dir/x' in agent 'a1': ");
    assert_true(g_file_test(dir, G_FILE_TEST_IS_DIR));
}

static void
test_mcp_checkpoints(void **state)
{
    Mcp *f = *state;
    g_autofree char *file = g_build_filename(f->home, "state.txt", NULL);
    g_autofree char *args = NULL;

    mcp_start(f);
    mcp_initialize(f);
    args = g_strdup_printf("{\"name\":\"a1\",\"path\":\"%s\",\"content\":\"before\"}", file);
    g_autoptr(JsonObject) first = tool_ok(f, "write_file", args);

    g_autoptr(JsonObject) taken =
        tool_ok(f, "checkpoint", "{\"name\":\"a1\",\"label\":\"safe\",\"memory\":true}");
    JsonObject *checkpoint = json_object_get_object_member(taken, "checkpoint");
    assert_string_equal(string_member(checkpoint, "id"), "c1");
    assert_string_equal(string_member(checkpoint, "label"), "safe");
    g_autoptr(GVariant) sent = last_request(f, VM_OP_CHECKPOINT_CREATE);
    assert_fields(sent, "{'name': <'a1'>, 'label': <'safe'>, 'memory': <true>}");

    g_autoptr(JsonObject) listed = tool_ok(f, "list_checkpoints", "{\"name\":\"a1\"}");
    assert_int_equal(json_array_get_length(json_object_get_array_member(listed, "checkpoints")), 1);

    g_free(args);
    args = g_strdup_printf("{\"name\":\"a1\",\"path\":\"%s\",\"content\":\"after\"}", file);
    g_autoptr(JsonObject) broke = tool_ok(f, "write_file", args);
    g_free(args);
    args = g_strdup_printf("{\"name\":\"a1\",\"checkpoint\":\"c1\",\"path\":\"%s\"}", f->home);
    g_autoptr(JsonObject) diff = tool_ok(f, "diff", args);
    JsonArray *changes = json_object_get_array_member(diff, "changes");
    assert_int_equal(json_array_get_length(changes), 1);
    JsonObject *change = json_array_get_object_element(changes, 0);
    assert_string_equal(string_member(change, "kind"), "M");
    assert_string_equal(string_member(change, "path"), file);
    assert_false(json_object_get_boolean_member(diff, "truncated"));

    g_free(args);
    args = g_strdup_printf("{\"name\":\"a1\",\"checkpoint\":\"c1\",\"paths\":[\"%s\"]}", file);
    g_autoptr(JsonObject) restored = tool_ok(f, "restore", args);
    assert_string_equal(string_member(restored, "undo"), "c2");
    g_autoptr(GVariant) restore = last_request(f, VM_OP_CHECKPOINT_RESTORE);
    g_autoptr(GVariant) paths = g_variant_lookup_value(restore, "paths", G_VARIANT_TYPE("as"));
    assert_non_null(paths);
    g_autofree char *contents = NULL;
    assert_true(g_file_get_contents(file, &contents, NULL, NULL));
    assert_string_equal(contents, "before");

    g_autoptr(JsonObject) forked =
        tool_ok(f, "fork", "{\"source\":\"a1\",\"name\":\"a1-copy\",\"checkpoint\":\"c1\"}");
    assert_string_equal(string_member(forked, "checkpoint"), "c1");
    assert_string_equal(string_member(json_object_get_object_member(forked, "agent"), "name"),
                        "a1-copy");
    g_autoptr(GVariant) fork = last_request(f, VM_OP_AGENT_FORK);
    assert_fields(fork, "{'source': <'a1'>, 'name': <'a1-copy'>, 'checkpoint': <'c1'>, "
                        "'wait': <true>}");
    tool_fails(f, "diff", "{\"name\":\"a1\",\"checkpoint\":\"c9\"}", "not-found", "no checkpoint");
}

/* Progress notifications when asked for, with the token given, growing; none otherwise. */
static void
test_mcp_progress(void **state)
{
    Mcp *f = *state;

    mcp_start(f);
    mcp_initialize(f);
    g_autoptr(JsonObject) answer = mcp_call(
        f, "tools/call",
        "{\"name\":\"new_agent\",\"arguments\":{\"name\":\"a2\"},\"_meta\":{\"progressToken\":"
        "\"tok\"}}");
    assert_false(
        json_object_get_boolean_member(json_object_get_object_member(answer, "result"), "isError"));
    assert_int_equal(f->notifications->len, 2);
    for (guint i = 0; i < 2; i++) {
        JsonObject *note = f->notifications->pdata[i];
        JsonObject *params = json_object_get_object_member(note, "params");
        assert_string_equal(string_member(note, "method"), "notifications/progress");
        assert_string_equal(string_member(params, "progressToken"), "tok");
        assert_int_equal(json_object_get_int_member(params, "progress"), i + 1);
    }
    assert_string_equal(
        string_member(json_object_get_object_member(f->notifications->pdata[0], "params"),
                      "message"),
        "booting (25%)");
    assert_string_equal(
        string_member(json_object_get_object_member(f->notifications->pdata[1], "params"),
                      "message"),
        "waiting for SSH");

    g_ptr_array_set_size(f->notifications, 0);
    g_autoptr(JsonObject) number = mcp_call(f, "tools/call",
                                            "{\"name\":\"checkpoint\",\"arguments\":{\"name\":"
                                            "\"a2\"},\"_meta\":{\"progressToken\":7}}");
    assert_int_equal(f->notifications->len, 1);
    assert_int_equal(
        json_object_get_int_member(
            json_object_get_object_member(f->notifications->pdata[0], "params"), "progressToken"),
        7);
    g_ptr_array_set_size(f->notifications, 0);
    g_autoptr(JsonObject) silent = tool_ok(f, "checkpoint", "{\"name\":\"a2\"}");
    assert_int_equal(f->notifications->len, 0);
}

static void
wait_for(gint *counter, int value)
{
    for (int i = 0; i < 1000 && g_atomic_int_get(counter) < value; i++)
        g_usleep(10 * 1000);
    assert_int_equal(g_atomic_int_get(counter), value);
}

/* notifications/cancelled ends a long exec at once: the connection to hostd closes (the fake
 * kills the command), no answer comes for it, and the server goes on. */
static void
test_mcp_cancel(void **state)
{
    Mcp *f = *state;
    gint64 start = g_get_monotonic_time();

    mcp_start(f);
    mcp_initialize(f);
    mcp_send(f, "{\"jsonrpc\":\"2.0\",\"id\":\"long\",\"method\":\"tools/call\",\"params\":"
                "{\"name\":\"exec\",\"arguments\":{\"name\":\"a1\",\"command\":[\"sleep\","
                "\"60\"]}}}");
    wait_for(&f->fake.exec_started, 1);
    g_autoptr(JsonObject) during = tool_ok(f, "list_agents", "{}");
    mcp_send(f, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":"
                "{\"requestId\":\"long\",\"reason\":\"enough\"}}");
    wait_for(&f->fake.exec_cancelled, 1);
    g_autoptr(JsonObject) ping = mcp_call(f, "ping", NULL);
    assert_true(json_object_has_member(ping, "result"));
    /* Nothing more: no answer to the cancelled call. */
    g_autoptr(JsonObject) nothing = mcp_read(f, 300);
    assert_null(nothing);
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
}

static void
test_mcp_timeout(void **state)
{
    Mcp *f = *state;
    gint64 start = g_get_monotonic_time();

    mcp_start(f);
    mcp_initialize(f);
    tool_fails(f, "exec", "{\"name\":\"a1\",\"command\":[\"sleep\",\"60\"],\"timeout_s\":1}",
               "timeout", "the command still ran after 1 s");
    wait_for(&f->fake.exec_cancelled, 1);
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
}

/* The end of the input lets the calls in flight finish and answer; then the server ends. */
static void
test_mcp_end_of_input(void **state)
{
    Mcp *f = *state;

    mcp_start(f);
    mcp_send(f, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":"
                "{\"name\":\"exec\",\"arguments\":{\"name\":\"a1\",\"command\":[\"sh\",\"-c\","
                "\"sleep 0.3; echo done\"]}}}");
    close(f->to_server[1]);
    g_autoptr(JsonObject) answer = mcp_read(f, READ_TIMEOUT_MS);
    assert_non_null(answer);
    JsonObject *structured = json_object_get_object_member(
        json_object_get_object_member(answer, "result"), "structuredContent");
    assert_string_equal(string_member(structured, "stdout"), "done\n");
    g_autoptr(JsonObject) end = mcp_read(f, READ_TIMEOUT_MS);
    assert_null(end);
    assert_true(GPOINTER_TO_INT(g_thread_join(f->server)));
    f->server = NULL;
    close(f->to_server[0]);
    close(f->from_server[0]);
}

/* ---- The vmctl binary, and the SDK's client */

static char *
vmctl_path(void)
{
    const char *build_dir = g_getenv("VM_BUILD_DIR");

    return g_build_filename(build_dir != NULL ? build_dir : ".", "vmctl", "vmctl", NULL);
}

/* Runs @argv with @input on stdin; returns its exit status, stdout and stderr. */
static int
run_program(const char *const *argv, const char *const *env, const char *input, char **ret_out,
            char **ret_err)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GSubprocessLauncher) launcher =
        g_subprocess_launcher_new(G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                  G_SUBPROCESS_FLAGS_STDERR_PIPE);

    for (gsize i = 0; env != NULL && env[i] != NULL; i += 2)
        g_subprocess_launcher_setenv(launcher, env[i], env[i + 1], TRUE);
    g_autoptr(GSubprocess) process = g_subprocess_launcher_spawnv(launcher, argv, &error);
    vm_test_assert_no_error(error);
    assert_true(g_subprocess_communicate_utf8(process, input, NULL, ret_out, ret_err, &error));
    vm_test_assert_no_error(error);
    assert_true(g_subprocess_get_if_exited(process));
    return g_subprocess_get_exit_status(process);
}

static void
test_mcp_binary(void **state)
{
    Mcp *f = *state;
    g_autofree char *vmctl = vmctl_path();
    g_autofree char *out = NULL, *err = NULL;
    const char *const bad_agent[] = {vmctl, "mcp", "--agent", "A1", NULL};
    const char *const extra[] = {vmctl, "mcp", "extra", NULL};
    const char *const serve[] = {vmctl, "--socket", f->socket_path, "mcp", "--agent", "a1", NULL};
    const char *input = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":"
                        "{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":"
                        "{\"name\":\"t\",\"version\":\"1\"}}}\n"
                        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
                        "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":"
                        "{\"name\":\"list_agents\",\"arguments\":{}}}\n";

    assert_int_equal(run_program(bad_agent, NULL, "", &out, &err), 2);
    assert_string_equal(err, "vmctl: invalid name 'A1': must start with a lower-case letter a-z\n");
    assert_string_equal(out, "");
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);
    assert_int_equal(run_program(extra, NULL, "", &out, &err), 2);
    assert_string_equal(err, "vmctl: unexpected argument 'extra'; see 'vmctl mcp --help'\n");
    g_clear_pointer(&out, g_free);
    g_clear_pointer(&err, g_free);

    /* stdout holds protocol messages and nothing else. */
    assert_int_equal(run_program(serve, NULL, input, &out, &err), 0);
    assert_string_equal(err, "");
    g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
    assert_int_equal(g_strv_length(lines), 3);
    assert_string_equal(lines[2], "");
    for (gsize i = 0; i < 2; i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(JsonNode) node = json_from_string(lines[i], &error);
        vm_test_assert_no_error(error);
        JsonObject *message = json_node_get_object(node);
        assert_int_equal(json_object_get_int_member(message, "id"), i + 1);
        assert_true(json_object_has_member(message, "result"));
    }
    assert_non_null(strstr(lines[1], "\\\"name\\\":\\\"a1\\\""));
}

/* tests/integration/mcp-client.mjs, the check the VM suite runs on a real agent, here through
 * the official SDK against `vmctl mcp` and the fake: schemas validated by the SDK itself. */
static void
test_mcp_sdk(void **state)
{
    Mcp *f = *state;
    const char *source = g_getenv("VM_SOURCE_DIR");
    g_autofree char *script = g_build_filename(source != NULL ? source : ".", "tests",
                                               "integration", "mcp-client.mjs", NULL);
    g_autofree char *sdk =
        g_build_filename(source != NULL ? source : ".", "tests", "integration", "mcp",
                         "node_modules", "@modelcontextprotocol", "sdk", NULL);
    g_autofree char *node = g_find_program_in_path("node");
    g_autofree char *vmctl = vmctl_path();
    g_autofree char *out = NULL, *err = NULL;

    /* Not skip(): meson's TAP reads cmocka's skip as a failure. run-tests.sh installs the SDK
     * (tests/integration/mcp/install.sh) before the unit suite; a build without node or the
     * npm registry says so here and checks the rest. */
    if (node == NULL) {
        print_message("# not run: node not found\n");
        return;
    }
    if (!g_file_test(sdk, G_FILE_TEST_IS_DIR)) {
        print_message(
            "# not run: the MCP SDK is not installed (tests/integration/mcp/install.sh)\n");
        return;
    }
    const char *const argv[] = {node, script, NULL};
    const char *const env[] = {"VMCTL",
                               vmctl,
                               "HOSTD_SOCKET",
                               f->socket_path,
                               "MCP_AGENT",
                               "a1",
                               "MCP_FORK_NAME",
                               "a1-fork",
                               "MCP_NEW_AGENT",
                               "a2",
                               "MCP_EXPECT_PROGRESS",
                               "1",
                               "HOME",
                               f->home,
                               NULL};
    int status = run_program(argv, env, "", &out, &err);
    if (status != 0 || strstr(out, "not ok") != NULL) {
        /* cmocka cuts long messages: the whole output goes to stderr first. */
        g_printerr("%s\n%s\n", out, err);
        fail_msg("mcp-client.mjs exited %d", status);
    }
    assert_non_null(strstr(out, "\n1.."));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpc_request),
        cmocka_unit_test(test_rpc_malformed),
        cmocka_unit_test(test_rpc_depth),
        cmocka_unit_test(test_rpc_notifications),
        cmocka_unit_test(test_rpc_cancel),
        cmocka_unit_test(test_rpc_notify),
        cmocka_unit_test(test_rpc_run),
        cmocka_unit_test(test_rpc_fuzz),
        cmocka_unit_test_setup_teardown(test_mcp_initialize, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_tools_list, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_read_only, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_agents, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_agent_tools, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_exec, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_arguments, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_files, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_checkpoints, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_progress, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_cancel, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_timeout, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_end_of_input, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_binary, mcp_setup, mcp_teardown),
        cmocka_unit_test_setup_teardown(test_mcp_sdk, mcp_setup, mcp_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
