#include "vmctl-mcp-tools.h"

#include "vm-error.h"
#include "vm-name.h"
#include "vm-protocol.h"
#include "vm-ssh-key.h"
#include "vmctl-copy.h"
#include "vmctl-output.h"

#include <string.h>

#define PATH_MAX_BYTES 4096
/* A string argument whose size only the message's bound limits. */
#define UNBOUNDED G_MAXINT64

typedef enum {
    ARG_AGENT,   /* an agent name, checked here and limited to the agents served */
    ARG_STRING,  /* min/max: bytes */
    ARG_INTEGER, /* min/max: the value */
    ARG_BOOLEAN,
    ARG_STRINGS, /* an array of strings; min/max: entries */
    ARG_ENV,     /* an object of string values; max: entries */
    ARG_CHOICE,  /* a string among choices */
} ArgType;

typedef struct {
    const char *name;
    ArgType type;
    gboolean required;
    gint64 min, max;
    const char *description;
    const char *fallback; /* the default, as JSON text; NULL: none */
    const char *const *choices;
    const char *pattern; /* of an ARG_STRING, for the schema; the tool checks it */
} ToolArg;

/* Returns the structured result of a call with @args (checked against the table), or NULL with
 * @error set. */
typedef JsonObject *(*ToolFunc)(JsonObject *args, const VmctlMcpContext *context, GError **error);

struct VmctlMcpTool {
    const char *name;
    const char *title;
    const char *description;
    gboolean read_only; /* offered with --read-only: changes nothing */
    gboolean destructive;
    gboolean idempotent;
    gboolean open_world;
    ToolFunc func;
    const char *output_schema; /* JSON with ' for " (schemas hold no apostrophe) */
    ToolArg args[16];
    gboolean host_files; /* copies files of the host: offered only with --copy-dir */
    /* A tool without a func: the request @op about the agent its "name" argument names,
     * answered with the field @result (agent_request()). */
    VmOp op;
    const char *result;
};

/* ---- Output schemas: what hostd sends (docs/PROTOCOL.md, "Objects in results"). Objects may
 * gain keys, so only what is always there is required. */

#define AGENT_SCHEMA                                                                               \
    "{'type':'object','description':'An agent, as vmctl info --json prints it',"                   \
    "'properties':{'name':{'type':'string'},'state':{'type':'string','description':"               \
    "'running, paused, saved, stopped, crashed, ...'},'state_since':{'type':'integer'},"           \
    "'template':{'type':'string'},'cpus':{'type':'integer'},'memory_mib':{'type':'integer'},"      \
    "'disk_gib':{'type':'integer'},'disk_bytes':{'type':'integer'},'ssh_port':{'type':'integer'}," \
    "'user':{'type':'string'},'created':{'type':'integer'},'virt_type':{'type':'string'},"         \
    "'uuid':{'type':'string'},'forked_from':{'type':'string'},"                                    \
    "'fork_checkpoint':{'type':'string'},'idle':{'type':'string'},"                                \
    "'checkpoints':{'type':'string'},'wanted':{'type':'string'},'restart':{'type':'string'},"      \
    "'crashes':{'type':'integer'},'crash_reason':{'type':'string'},'fenced':{'type':'string'}},"   \
    "'required':['name','state']}"

#define CHECKPOINT_SCHEMA                                                                          \
    "{'type':'object','properties':{'id':{'type':'string'},'created':{'type':'integer'},"          \
    "'label':{'type':'string'},'automatic':{'type':'boolean'},'kind':{'type':'string',"            \
    "'description':'disk or memory'},'quiesced':{'type':'boolean'},'bytes':{'type':'integer'},"    \
    "'parent':{'type':'string'},'current':{'type':'boolean'}},'required':['id']}"

#define EGRESS_SCHEMA                                                                              \
    "{'type':'object','properties':{'allow':{'type':'array','items':{'type':'string'}},"           \
    "'deny':{'type':'array','items':{'type':'string'}},'connections':{'type':'integer'},"          \
    "'proxy':{'type':'string'},'wired':{'type':'boolean'}}}"

#define AGENT_RESULT_SCHEMA                                                                        \
    "{'type':'object','properties':{'agent':" AGENT_SCHEMA "},'required':['agent']}"

#define COPY_SCHEMA                                                                                \
    "{'type':'object','properties':{'stream_bytes':{'type':'integer','description':"               \
    "'bytes of the tar stream copied'}},'required':['stream_bytes']}"

#define ENCODING_SCHEMA "{'type':'string','enum':['text','base64']}"

static const char *const encodings[] = {"text", "base64", NULL};

/* A node holding @object, taking the caller's reference (json_node_init_object() adds one). */
static JsonNode *
node_take_object(JsonObject *object)
{
    JsonNode *node = json_node_new(JSON_NODE_OBJECT);

    json_node_take_object(node, object);
    return node;
}

/* ---- Arguments */

static const ToolArg *
tool_arg(const VmctlMcpTool *tool, const char *name)
{
    for (const ToolArg *arg = tool->args; arg->name != NULL; arg++) {
        if (strcmp(arg->name, name) == 0)
            return arg;
    }
    return NULL;
}

static gboolean
node_is_string(JsonNode *node)
{
    return JSON_NODE_HOLDS_VALUE(node) && json_node_get_value_type(node) == G_TYPE_STRING;
}

/* JSON Schema's integer: a number without a fractional part. */
static gboolean
node_get_integer(JsonNode *node, gint64 *ret_value)
{
    if (!JSON_NODE_HOLDS_VALUE(node))
        return FALSE;
    if (json_node_get_value_type(node) == G_TYPE_INT64) {
        *ret_value = json_node_get_int(node);
        return TRUE;
    }
    if (json_node_get_value_type(node) == G_TYPE_DOUBLE) {
        double d = json_node_get_double(node);
        if (d >= -9007199254740992.0 && d <= 9007199254740992.0 && d == (double)(gint64)d) {
            *ret_value = (gint64)d;
            return TRUE;
        }
    }
    return FALSE;
}

static gboolean
arg_throw(GError **error, const ToolArg *arg, const char *what)
{
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "argument '%s' must be %s", arg->name, what);
}

static gboolean
check_agent(const char *name, const VmctlMcpContext *context, GError **error)
{
    if (!vm_name_validate(name, error))
        return FALSE;
    if (context->agents != NULL && !g_strv_contains(context->agents, name)) {
        g_autofree char *served = g_strjoinv(", ", (char **)context->agents);
        return vm_throw(error, VM_ERROR_NOT_FOUND,
                        "no agent '%s' on this MCP server (it serves only: %s)", name, served);
    }
    return TRUE;
}

static gboolean
check_string(const ToolArg *arg, JsonNode *node, GError **error)
{
    if (!node_is_string(node))
        return arg_throw(error, arg, "a string");
    gsize len = strlen(json_node_get_string(node));
    if ((gint64)len < arg->min || (gint64)len > arg->max) {
        g_autofree char *what =
            arg->max == UNBOUNDED
                ? g_strdup_printf("at least %" G_GINT64_FORMAT " bytes", arg->min)
                : g_strdup_printf("%" G_GINT64_FORMAT " to %" G_GINT64_FORMAT " bytes", arg->min,
                                  arg->max);
        return arg_throw(error, arg, what);
    }
    return TRUE;
}

static gboolean
check_strings(const ToolArg *arg, JsonNode *node, GError **error)
{
    g_autofree char *what = g_strdup_printf(
        "an array of %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT " strings", arg->min, arg->max);

    if (!JSON_NODE_HOLDS_ARRAY(node))
        return arg_throw(error, arg, what);
    JsonArray *array = json_node_get_array(node);
    guint n = json_array_get_length(array);
    if ((gint64)n < arg->min || (gint64)n > arg->max)
        return arg_throw(error, arg, what);
    for (guint i = 0; i < n; i++) {
        if (!node_is_string(json_array_get_element(array, i)))
            return arg_throw(error, arg, what);
    }
    return TRUE;
}

static gboolean
check_env(const ToolArg *arg, JsonNode *node, GError **error)
{
    g_autofree char *what = g_strdup_printf(
        "an object of at most %" G_GINT64_FORMAT " NAME: \"value\" strings", arg->max);

    if (!JSON_NODE_HOLDS_OBJECT(node))
        return arg_throw(error, arg, what);
    JsonObject *object = json_node_get_object(node);
    if ((gint64)json_object_get_size(object) > arg->max)
        return arg_throw(error, arg, what);
    g_autoptr(GList) names = json_object_get_members(object);
    for (GList *l = names; l != NULL; l = l->next) {
        const char *name = l->data;
        if (name[0] == '\0' || strchr(name, '=') != NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "argument '%s' has a bad name '%s': not empty, no '='", arg->name,
                            name);
        if (!node_is_string(json_object_get_member(object, name)))
            return arg_throw(error, arg, what);
    }
    return TRUE;
}

static gboolean
check_arg(const ToolArg *arg, JsonNode *node, const VmctlMcpContext *context, GError **error)
{
    gint64 value;

    switch (arg->type) {
    case ARG_AGENT:
        if (!node_is_string(node))
            return arg_throw(error, arg, "an agent name");
        return check_agent(json_node_get_string(node), context, error);
    case ARG_STRING:
        return check_string(arg, node, error);
    case ARG_INTEGER:
        if (!node_get_integer(node, &value) || value < arg->min || value > arg->max) {
            g_autofree char *what = g_strdup_printf(
                "an integer from %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT, arg->min, arg->max);
            return arg_throw(error, arg, what);
        }
        return TRUE;
    case ARG_BOOLEAN:
        if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN)
            return arg_throw(error, arg, "true or false");
        return TRUE;
    case ARG_STRINGS:
        return check_strings(arg, node, error);
    case ARG_ENV:
        return check_env(arg, node, error);
    case ARG_CHOICE:
        if (!node_is_string(node) || !g_strv_contains(arg->choices, json_node_get_string(node))) {
            g_autofree char *choices = g_strjoinv(", ", (char **)arg->choices);
            g_autofree char *what = g_strdup_printf("one of %s", choices);
            return arg_throw(error, arg, what);
        }
        return TRUE;
    default:
        g_assert_not_reached();
    }
}

/* Checks @args against @tool's table: no unknown argument, every required one, each of its
 * type and within its bounds. A JSON null stands for an argument left out. */
static gboolean
check_arguments(const VmctlMcpTool *tool, JsonObject *args, const VmctlMcpContext *context,
                GError **error)
{
    g_autoptr(GList) names = json_object_get_members(args);

    for (GList *l = names; l != NULL; l = l->next) {
        if (tool_arg(tool, l->data) == NULL) {
            g_autofree char *shown = g_strndup(l->data, 64);
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "unknown argument '%s' of %s", shown,
                            tool->name);
        }
    }
    for (const ToolArg *arg = tool->args; arg->name != NULL; arg++) {
        JsonNode *node = json_object_get_member(args, arg->name);
        if (node == NULL || JSON_NODE_HOLDS_NULL(node)) {
            if (arg->required)
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "missing argument '%s' of %s",
                                arg->name, tool->name);
            continue;
        }
        if (!check_arg(arg, node, context, error))
            return FALSE;
    }
    return TRUE;
}

/* The value of the checked argument @name, or NULL/@fallback when left out. */
static const char *
arg_string(JsonObject *args, const char *name)
{
    JsonNode *node = json_object_get_member(args, name);

    return node != NULL && node_is_string(node) ? json_node_get_string(node) : NULL;
}

static gint64
arg_integer(JsonObject *args, const char *name, gint64 fallback)
{
    JsonNode *node = json_object_get_member(args, name);
    gint64 value;

    return node != NULL && node_get_integer(node, &value) ? value : fallback;
}

static gboolean
arg_boolean(JsonObject *args, const char *name, gboolean fallback)
{
    JsonNode *node = json_object_get_member(args, name);

    if (node == NULL || !JSON_NODE_HOLDS_VALUE(node) ||
        json_node_get_value_type(node) != G_TYPE_BOOLEAN)
        return fallback;
    return json_node_get_boolean(node);
}

/* A strings argument as a NULL-terminated vector (newly allocated), or NULL when left out. */
static char **
arg_strv(JsonObject *args, const char *name)
{
    JsonNode *node = json_object_get_member(args, name);

    if (node == NULL || !JSON_NODE_HOLDS_ARRAY(node))
        return NULL;
    JsonArray *array = json_node_get_array(node);
    guint n = json_array_get_length(array);
    char **strv = g_new0(char *, n + 1);
    for (guint i = 0; i < n; i++)
        strv[i] = g_strdup(json_array_get_string_element(array, i));
    return strv;
}

static void
dict_add_string(GVariantDict *fields, JsonObject *args, const char *name, const char *key)
{
    const char *value = arg_string(args, name);

    if (value != NULL)
        g_variant_dict_insert(fields, key, "s", value);
}

static void
dict_add_uint(GVariantDict *fields, JsonObject *args, const char *name, const char *key)
{
    if (json_object_has_member(args, name) &&
        !JSON_NODE_HOLDS_NULL(json_object_get_member(args, name)))
        g_variant_dict_insert(fields, key, "u", (guint32)arg_integer(args, name, 0));
}

/* Bytes from base64 @text; fails with VM_ERROR_INVALID_ARGUMENT naming @what when it is not
 * base64 (g_base64_decode() would decode anything). */
static GBytes *
decode_base64(const char *text, const char *what, GError **error)
{
    gsize len = 0;

    for (const char *c = text; *c != '\0'; c++) {
        if (!g_ascii_isalnum(*c) && *c != '+' && *c != '/' && *c != '=' && !g_ascii_isspace(*c)) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "argument '%s' is not base64", what);
            return NULL;
        }
    }
    guchar *data = g_base64_decode(text, &len);
    return g_bytes_new_take(data, len);
}

/* @len bytes at @data as JSON text: invalid UTF-8 and NUL bytes become U+FFFD. */
static char *
text_of(const guint8 *data, gsize len)
{
    g_autoptr(GString) text = g_string_sized_new(len);
    gsize start = 0;

    for (gsize i = 0; i <= len; i++) {
        if (i < len && data[i] != '\0')
            continue;
        if (i > start) {
            g_autofree char *part =
                g_utf8_make_valid((const char *)data + start, (gssize)(i - start));
            g_string_append(text, part);
        }
        if (i < len)
            g_string_append(text, "\xef\xbf\xbd");
        start = i + 1;
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* ---- Talking to hostd */

static VmMessage *
request(const VmctlMcpContext *context, VmOp op, GVariantDict *fields, GError **error)
{
    g_autoptr(VmMessage) message = vm_message_new(op, g_variant_dict_end(fields), error);
    VmMessage *result = NULL;

    if (message == NULL ||
        !vmctl_client_request(context->endpoint, message, context->cancellable, context->progress,
                              context->progress_data, &result, error))
        return NULL;
    return result;
}

/* The RESULT of @op with @fields as JSON, as `vmctl --json` prints it; hostd must have sent
 * every key of the NULL-terminated @needed (the output schema requires them). */
static JsonObject *
request_json(const VmctlMcpContext *context, VmOp op, GVariantDict *fields,
             const char *const *needed, GError **error)
{
    g_autoptr(VmMessage) result = request(context, op, fields, error);

    if (result == NULL)
        return NULL;
    g_autoptr(JsonNode) node = json_gvariant_serialize(result->fields);
    JsonObject *object = json_node_get_object(node);
    for (gsize i = 0; needed != NULL && needed[i] != NULL; i++) {
        if (!json_object_has_member(object, needed[i])) {
            vm_throw(error, VM_ERROR_PROTOCOL, "hostd sent no %s in its %s result", needed[i],
                     vm_op_name(op));
            return NULL;
        }
    }
    return json_object_ref(object);
}

/* A request about the agent @args names, answered with @needed. */
static JsonObject *
agent_request(const VmctlMcpContext *context, VmOp op, JsonObject *args, const char *needed,
              GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    const char *const keys[] = {needed, NULL};

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    return request_json(context, op, &fields, keys, error);
}

/* Runs @argv in the agent @name with @input on its stdin, keeping up to @max_output bytes of
 * each output. */
static VmctlExecOutput *
run_command(const VmctlMcpContext *context, const char *name, const char *const *argv,
            GBytes *input, gsize max_output, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    VmctlExecOutput *output = NULL;

    g_variant_dict_insert(&fields, "name", "s", name);
    g_variant_dict_insert(&fields, "argv", "^as", argv);
    g_autoptr(VmMessage) message = vm_message_new(VM_OP_EXEC, g_variant_dict_end(&fields), error);
    if (message == NULL || !vmctl_client_exec_capture(context->endpoint, message, input, max_output,
                                                      0, context->cancellable, context->progress,
                                                      context->progress_data, &output, error))
        return NULL;
    return output;
}

/* The last line of what a command said on stderr, or how it ended. */
static char *
command_complaint(const VmctlExecOutput *output)
{
    g_autofree char *text = text_of(output->err->data, output->err->len);
    g_auto(GStrv) lines = g_strsplit(g_strstrip(text), "\n", -1);
    gsize n = g_strv_length(lines);

    if (n > 0 && lines[n - 1][0] != '\0')
        return g_strdup(lines[n - 1]);
    return g_strdup_printf("exit status %d", output->status);
}

/* ---- The tools */

static JsonObject *
tool_list_agents(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_autoptr(JsonObject) result = request_json(context, VM_OP_AGENT_LIST, &fields, NULL, error);

    if (result == NULL)
        return NULL;
    JsonArray *served = json_array_new();
    JsonNode *agents = json_object_get_member(result, "agents");
    for (guint i = 0; agents != NULL && JSON_NODE_HOLDS_ARRAY(agents) &&
                      i < json_array_get_length(json_node_get_array(agents));
         i++) {
        JsonNode *agent = json_array_get_element(json_node_get_array(agents), i);
        const char *name = JSON_NODE_HOLDS_OBJECT(agent)
                               ? json_object_get_string_member_with_default(
                                     json_node_get_object(agent), "name", NULL)
                               : NULL;
        if (name != NULL && (context->agents == NULL || g_strv_contains(context->agents, name)))
            json_array_add_element(served, json_node_copy(agent));
    }
    JsonObject *object = json_object_new();
    json_object_set_array_member(object, "agents", served);
    return object;
}

static JsonObject *
tool_new_agent(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    const char *const needed[] = {"agent", NULL};

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    dict_add_string(&fields, args, "template", "template");
    dict_add_uint(&fields, args, "cpus", "cpus");
    dict_add_uint(&fields, args, "memory_mib", "memory_mib");
    dict_add_uint(&fields, args, "disk_gib", "disk_gib");
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        dict_add_uint(&fields, args, vm_disk_limit_field(i), vm_disk_limit_field(i));
    dict_add_string(&fields, args, "user_data", "user_data");
    g_variant_dict_insert(&fields, "wait", "b", arg_boolean(args, "wait", TRUE));
    g_auto(GStrv) egress = arg_strv(args, "egress");
    if (egress != NULL)
        g_variant_dict_insert(&fields, "egress", "^as", egress);
    /* Checked here as vmctl new --ssh-key checks a key file, and again by hostd. */
    g_auto(GStrv) keys = arg_strv(args, "ssh_keys");
    if (keys != NULL) {
        g_autoptr(GStrvBuilder) lines = g_strv_builder_new();
        for (guint i = 0; keys[i] != NULL; i++) {
            g_autoptr(GError) local_error = NULL;
            g_autoptr(VmSshKey) key = vm_ssh_key_parse(keys[i], &local_error);
            if (key == NULL) {
                vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "argument 'ssh_keys', entry %u: %s",
                         i + 1, local_error->message);
                return NULL;
            }
            g_autofree char *line = vm_ssh_key_to_line(key);
            g_strv_builder_add(lines, line);
        }
        g_auto(GStrv) checked = g_strv_builder_end(lines);
        g_variant_dict_insert(&fields, "ssh_keys", "^as", checked);
    }
    return request_json(context, VM_OP_AGENT_NEW, &fields, needed, error);
}

/* stdout or stderr of @output as exec's result shows it. */
static void
add_output(JsonObject *object, const char *name, GByteArray *kept, guint64 total, gboolean base64)
{
    g_autofree char *bytes_key = g_strconcat(name, "_bytes", NULL);
    g_autofree char *truncated_key = g_strconcat(name, "_truncated", NULL);
    g_autofree char *text =
        base64 ? g_base64_encode(kept->data, kept->len) : text_of(kept->data, kept->len);

    json_object_set_string_member(object, name, text);
    json_object_set_int_member(object, bytes_key, (gint64)total);
    json_object_set_boolean_member(object, truncated_key, total > kept->len);
}

static JsonObject *
tool_exec(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_auto(GStrv) command = arg_strv(args, "command");
    g_autoptr(GBytes) input = NULL;
    g_autoptr(VmctlExecOutput) output = NULL;
    const char *stdin_text = arg_string(args, "stdin");
    const char *stdin_base64 = arg_string(args, "stdin_base64");
    gboolean base64 = g_strcmp0(arg_string(args, "output_encoding"), "base64") == 0;
    JsonNode *env = json_object_get_member(args, "env");

    if (stdin_text != NULL && stdin_base64 != NULL) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "give stdin or stdin_base64, not both");
        return NULL;
    }
    if (stdin_base64 != NULL) {
        input = decode_base64(stdin_base64, "stdin_base64", error);
        if (input == NULL)
            return NULL;
    } else if (stdin_text != NULL) {
        input = g_bytes_new(stdin_text, strlen(stdin_text));
    }

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    g_variant_dict_insert(&fields, "argv", "^as", command);
    dict_add_string(&fields, args, "workdir", "cwd");
    if (env != NULL && JSON_NODE_HOLDS_OBJECT(env)) {
        g_autoptr(GStrvBuilder) entries = g_strv_builder_new();
        g_autoptr(GList) names = json_object_get_members(json_node_get_object(env));
        for (GList *l = names; l != NULL; l = l->next) {
            g_autofree char *entry = g_strconcat(
                l->data, "=", json_object_get_string_member(json_node_get_object(env), l->data),
                NULL);
            g_strv_builder_add(entries, entry);
        }
        g_auto(GStrv) strv = g_strv_builder_end(entries);
        if (strv[0] != NULL)
            g_variant_dict_insert(&fields, "env", "^as", strv);
    }
    g_autoptr(VmMessage) message = vm_message_new(VM_OP_EXEC, g_variant_dict_end(&fields), error);
    if (message == NULL)
        return NULL;
    guint timeout_s = (guint)arg_integer(args, "timeout_s", VMCTL_MCP_TIMEOUT_DEFAULT);
    gsize max_output = (gsize)arg_integer(args, "max_output_bytes", VMCTL_MCP_OUTPUT_DEFAULT);
    if (!vmctl_client_exec_capture(context->endpoint, message, input, max_output, timeout_s * 1000,
                                   context->cancellable, context->progress, context->progress_data,
                                   &output, error))
        return NULL;

    JsonObject *object = json_object_new();
    json_object_set_int_member(object, "exit_status", output->status);
    add_output(object, "stdout", output->out, output->out_total, base64);
    add_output(object, "stderr", output->err, output->err_total, base64);
    json_object_set_string_member(object, "encoding", base64 ? "base64" : "text");
    return object;
}

/* The guest side of read_file: 3 for a directory, 2 for nothing there, else the first $2 bytes. */
#define READ_SCRIPT                                                                                \
    "[ -d \"$1\" ] && exit 3; [ -e \"$1\" ] || exit 2; exec head -c \"$2\" -- \"$1\""

static JsonObject *
tool_read_file(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    const char *name = arg_string(args, "name");
    const char *path = arg_string(args, "path");
    gint64 max_bytes = arg_integer(args, "max_bytes", VMCTL_MCP_READ_DEFAULT);
    g_autofree char *count = g_strdup_printf("%" G_GINT64_FORMAT, max_bytes + 1);
    const char *const argv[] = {"sh", "-c", READ_SCRIPT, "vmctl-read-file", path, count, NULL};

    g_autoptr(VmctlExecOutput) output =
        run_command(context, name, argv, NULL, (gsize)max_bytes + 1, error);
    if (output == NULL)
        return NULL;
    if (output->status == 2) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no file '%s' in agent '%s'", path, name);
        return NULL;
    }
    if (output->status == 3) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "'%s' in agent '%s' is a directory", path, name);
        return NULL;
    }
    if (output->status != 0) {
        g_autofree char *why = command_complaint(output);
        vm_throw(error, VM_ERROR_FAILED, "cannot read '%s' in agent '%s': %s", path, name, why);
        return NULL;
    }

    gboolean truncated = output->out->len > (guint)max_bytes;
    gsize len = MIN(output->out->len, (gsize)max_bytes);
    const char *data = len > 0 ? (const char *)output->out->data : "";
    /* Text was asked for, but bytes that are not text can only go as base64. */
    gboolean base64 = g_strcmp0(arg_string(args, "encoding"), "base64") == 0 ||
                      !g_utf8_validate_len(data, len, NULL);
    g_autofree char *content =
        base64 ? g_base64_encode((const guchar *)data, len) : g_strndup(data, len);
    JsonObject *object = json_object_new();
    json_object_set_string_member(object, "path", path);
    json_object_set_string_member(object, "content", content);
    json_object_set_string_member(object, "encoding", base64 ? "base64" : "text");
    json_object_set_int_member(object, "bytes", (gint64)len);
    json_object_set_boolean_member(object, "truncated", truncated);
    return object;
}

/* The guest side of write_file: $2 append, $3 make the parents, $4 the mode or nothing. */
#define WRITE_SCRIPT                                                                               \
    "set -e; if [ \"$3\" = 1 ]; then mkdir -p -- \"$(dirname -- \"$1\")\"; fi; "                   \
    "if [ \"$2\" = 1 ]; then cat >> \"$1\"; else cat > \"$1\"; fi; "                               \
    "if [ -n \"$4\" ]; then chmod -- \"$4\" \"$1\"; fi"

static gboolean
mode_is_valid(const char *mode)
{
    gsize len = strlen(mode);

    if (len < 3 || len > 4)
        return FALSE;
    for (gsize i = 0; i < len; i++) {
        if (mode[i] < '0' || mode[i] > '7')
            return FALSE;
    }
    return TRUE;
}

static JsonObject *
tool_write_file(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    const char *name = arg_string(args, "name");
    const char *path = arg_string(args, "path");
    const char *content = arg_string(args, "content");
    const char *mode = arg_string(args, "mode");
    g_autoptr(GBytes) data = NULL;

    if (mode != NULL && !mode_is_valid(mode)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "argument 'mode' must be 3 or 4 octal digits (\"0644\"), not '%s'", mode);
        return NULL;
    }
    if (g_strcmp0(arg_string(args, "encoding"), "base64") == 0) {
        data = decode_base64(content, "content", error);
        if (data == NULL)
            return NULL;
    } else {
        data = g_bytes_new(content, strlen(content));
    }
    const char *const argv[] = {"sh",
                                "-c",
                                WRITE_SCRIPT,
                                "vmctl-write-file",
                                path,
                                arg_boolean(args, "append", FALSE) ? "1" : "0",
                                arg_boolean(args, "make_parents", FALSE) ? "1" : "0",
                                mode != NULL ? mode : "",
                                NULL};
    g_autoptr(VmctlExecOutput) output = run_command(context, name, argv, data, 4096, error);
    if (output == NULL)
        return NULL;
    if (output->status != 0) {
        g_autofree char *why = command_complaint(output);
        vm_throw(error, VM_ERROR_FAILED, "cannot write '%s' in agent '%s': %s", path, name, why);
        return NULL;
    }
    JsonObject *object = json_object_new();
    json_object_set_string_member(object, "path", path);
    json_object_set_int_member(object, "bytes", (gint64)g_bytes_get_size(data));
    return object;
}

static JsonObject *
tool_checkpoint(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    const char *const needed[] = {"checkpoint", NULL};

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    dict_add_string(&fields, args, "label", "label");
    if (arg_boolean(args, "memory", FALSE))
        g_variant_dict_insert(&fields, "memory", "b", TRUE);
    return request_json(context, VM_OP_CHECKPOINT_CREATE, &fields, needed, error);
}

static JsonObject *
tool_restore(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_auto(GStrv) paths = arg_strv(args, "paths");
    const char *const needed[] = {"agent", "undo", NULL};

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    g_variant_dict_insert(&fields, "checkpoint", "s", arg_string(args, "checkpoint"));
    g_variant_dict_insert(&fields, "wait", "b", arg_boolean(args, "wait", TRUE));
    if (paths != NULL)
        g_variant_dict_insert(&fields, "paths", "^as", paths);
    return request_json(context, VM_OP_CHECKPOINT_RESTORE, &fields, needed, error);
}

static JsonObject *
tool_diff(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    GVariantIter iter;
    const char *kind, *path;

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    g_variant_dict_insert(&fields, "checkpoint", "s", arg_string(args, "checkpoint"));
    dict_add_string(&fields, args, "other", "other");
    dict_add_string(&fields, args, "path", "path");
    g_autoptr(VmMessage) result = request(context, VM_OP_CHECKPOINT_DIFF, &fields, error);
    if (result == NULL)
        return NULL;

    /* As `vmctl diff --json` shows them: objects rather than pairs. */
    g_autoptr(GVariant) changes = vmctl_dict_lookup(result->fields, "changes");
    JsonArray *array = json_array_new();
    if (changes != NULL && g_variant_is_of_type(changes, G_VARIANT_TYPE("a(ss)"))) {
        g_variant_iter_init(&iter, changes);
        while (g_variant_iter_next(&iter, "(&s&s)", &kind, &path)) {
            JsonObject *change = json_object_new();
            json_object_set_string_member(change, "kind", kind);
            json_object_set_string_member(change, "path", path);
            json_array_add_object_element(array, change);
        }
    }
    JsonObject *object = json_object_new();
    json_object_set_array_member(object, "changes", array);
    json_object_set_boolean_member(object, "truncated",
                                   vm_message_get_bool(result, "truncated", FALSE));
    return object;
}

static JsonObject *
tool_fork(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    const char *const needed[] = {"agent", "checkpoint", NULL};

    g_variant_dict_insert(&fields, "source", "s", arg_string(args, "source"));
    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    dict_add_string(&fields, args, "checkpoint", "checkpoint");
    dict_add_uint(&fields, args, "cpus", "cpus");
    dict_add_uint(&fields, args, "memory_mib", "memory_mib");
    g_variant_dict_insert(&fields, "wait", "b", arg_boolean(args, "wait", TRUE));
    return request_json(context, VM_OP_AGENT_FORK, &fields, needed, error);
}

static JsonObject *
tool_suspend(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    const char *const needed[] = {"agent", NULL};

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    g_variant_dict_insert(&fields, "save", "b", arg_boolean(args, "save", FALSE));
    return request_json(context, VM_OP_AGENT_SUSPEND, &fields, needed, error);
}

static JsonObject *
tool_set_resources(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    const char *const needed[] = {"agent", "changes", NULL};

    g_variant_dict_insert(&fields, "name", "s", arg_string(args, "name"));
    dict_add_uint(&fields, args, "cpus", "cpus");
    dict_add_uint(&fields, args, "memory_mib", "memory_mib");
    dict_add_uint(&fields, args, "disk_gib", "disk_gib");
    return request_json(context, VM_OP_AGENT_SET_RESOURCES, &fields, needed, error);
}

/* A host path of a copy tool: relative to --copy-dir, where it must stay ("" or "." is the
 * directory itself). Newly allocated; NULL with @error set when it is absolute or climbs out
 * with "..". */
static char *
copy_host_path(const VmctlMcpContext *context, const char *path, GError **error)
{
    g_auto(GStrv) parts = g_strsplit(path, "/", -1);

    if (g_path_is_absolute(path)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "argument 'host_path' must be relative to the copy directory");
        return NULL;
    }
    for (gsize i = 0; parts[i] != NULL; i++) {
        if (strcmp(parts[i], "..") == 0) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "argument 'host_path' may not hold '..'");
            return NULL;
        }
    }
    return g_build_filename(context->copy_dir, path[0] != '\0' ? path : ".", NULL);
}

static void
copy_count(guint64 bytes, gpointer user_data)
{
    guint64 *total = user_data;

    /* One thread at a time tells: the feeder, or the reader when nothing feeds. */
    *total += bytes;
}

static JsonObject *
copy_tool(JsonObject *args, const VmctlMcpContext *context, gboolean to_agent, GError **error)
{
    const char *name = arg_string(args, "name");
    const char *path = arg_string(args, "path");
    const char *host_path = arg_string(args, "host_path");
    g_autofree char *host = copy_host_path(context, host_path != NULL ? host_path : "", error);
    g_autofree char *agent = g_strdup(name);
    guint64 bytes = 0;

    if (host == NULL)
        return NULL;
    VmctlCopyLocation local = {.path = host};
    VmctlCopyLocation guest = {.agent = agent, .path = (char *)(path != NULL ? path : "")};
    if (!vmctl_copy(context->endpoint, to_agent ? &local : &guest, to_agent ? &guest : &local,
                    context->copy_dir, copy_count, &bytes, error))
        return NULL;
    JsonObject *object = json_object_new();
    json_object_set_int_member(object, "stream_bytes", (gint64)bytes);
    return object;
}

static JsonObject *
tool_copy_to_agent(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    return copy_tool(args, context, TRUE, error);
}

static JsonObject *
tool_copy_from_agent(JsonObject *args, const VmctlMcpContext *context, GError **error)
{
    return copy_tool(args, context, FALSE, error);
}

/* ---- The table */

#define NAME_ARG(desc)                                                                             \
    {                                                                                              \
        "name", ARG_AGENT, TRUE, 0, 0, desc                                                        \
    }
#define AGENT_DESC "The agent"

/* clang-format off */
static const VmctlMcpTool tools[] = {
    {"list_agents", "List agents",
     "List the agents (each a VM of its own) with their state, size and template.",
     TRUE, FALSE, TRUE, FALSE, tool_list_agents,
     "{'type':'object','properties':{'agents':{'type':'array','items':" AGENT_SCHEMA "}},"
     "'required':['agents']}",
     {{NULL}}},
    {"agent_info", "Show an agent",
     "Everything about one agent: state and since when, wanted state, template, CPUs, memory, "
     "disk and disk used, SSH port and user, where it was forked from, restart policy.",
     TRUE, FALSE, TRUE, FALSE, NULL, AGENT_RESULT_SCHEMA,
     {NAME_ARG(AGENT_DESC), {NULL}}, FALSE, VM_OP_AGENT_INFO, "agent"},
    {"new_agent", "Create an agent",
     "Create an agent from a template and boot its VM; with wait (the default) return once it "
     "answers on SSH, which takes a minute or more. Sends progress notifications.",
     FALSE, FALSE, FALSE, FALSE, tool_new_agent, AGENT_RESULT_SCHEMA,
     {NAME_ARG("The new agent: a-z first, then a-z, 0-9 and -"),
      {"template", ARG_STRING, FALSE, 1, 255, "The template (default: hostd's)"},
      {"cpus", ARG_INTEGER, FALSE, 1, G_MAXUINT32, "Virtual CPUs (default: the template's)"},
      {"memory_mib", ARG_INTEGER, FALSE, 1, G_MAXUINT32, "Memory in MiB (default: the template's)"},
      {"disk_gib", ARG_INTEGER, FALSE, 1, G_MAXUINT32, "Disk in GiB (default: the template's)"},
      {"disk_read_mib", ARG_INTEGER, FALSE, 0, VM_DISK_LIMIT_MAX,
       "MiB per second it may read from its disk, 0: no limit (default: the template's, else "
       "hostd's)"},
      {"disk_write_mib", ARG_INTEGER, FALSE, 0, VM_DISK_LIMIT_MAX,
       "MiB per second it may write to its disk, 0: no limit (default: the template's, else "
       "hostd's)"},
      {"disk_read_iops", ARG_INTEGER, FALSE, 0, VM_DISK_LIMIT_MAX,
       "Disk reads per second, 0: no limit (default: the template's, else hostd's)"},
      {"disk_write_iops", ARG_INTEGER, FALSE, 0, VM_DISK_LIMIT_MAX,
       "Disk writes per second, 0: no limit (default: the template's, else hostd's)"},
      {"user_data", ARG_STRING, FALSE, 0, VM_USER_DATA_MAX, "Extra cloud-init user data"},
      {"wait", ARG_BOOLEAN, FALSE, 0, 0, "Wait until it answers on SSH", "true"},
      {"ssh_keys", ARG_STRINGS, FALSE, 1, VM_SSH_KEYS_MAX,
       "SSH public keys that may log in to the agent as its user, one OpenSSH line each "
       "(TYPE BASE64 [COMMENT]; ed25519, ECDSA or RSA of 2048 bits or more, no options)"},
      {"egress", ARG_STRINGS, FALSE, 1, VM_RULES_MAX,
       "Egress rules to allow besides the template's: host names, *.suffix, addresses or CIDRs "
       "(NAME:PORT for one port, else 80 and 443), or presets such as @debian, @pypi, @npm, "
       "@github, @anthropic, @openai"},
      {NULL}}},
    {"exec", "Run a command",
     "Run a command in an agent (waking it if it sleeps) and return its exit status, stdout and "
     "stderr. The command is an argv array, not a shell line: use [\"sh\", \"-c\", \"...\"] for "
     "one. Output beyond max_output_bytes per stream is counted but not returned (*_truncated "
     "says so); a command still running after timeout_s is abandoned with a timeout error.",
     FALSE, TRUE, FALSE, TRUE, tool_exec,
     "{'type':'object','properties':{'exit_status':{'type':'integer'},"
     "'stdout':{'type':'string'},'stderr':{'type':'string'},"
     "'stdout_bytes':{'type':'integer','description':'bytes the command wrote, kept or not'},"
     "'stderr_bytes':{'type':'integer'},'stdout_truncated':{'type':'boolean'},"
     "'stderr_truncated':{'type':'boolean'},'encoding':" ENCODING_SCHEMA "},"
     "'required':['exit_status','stdout','stderr','stdout_bytes','stderr_bytes',"
     "'stdout_truncated','stderr_truncated','encoding']}",
     {NAME_ARG(AGENT_DESC),
      {"command", ARG_STRINGS, TRUE, 1, VM_ARGV_MAX, "The command and its arguments"},
      {"stdin", ARG_STRING, FALSE, 0, UNBOUNDED, "Text given to the command on stdin"},
      {"stdin_base64", ARG_STRING, FALSE, 0, UNBOUNDED, "Bytes given on stdin, in base64"},
      {"workdir", ARG_STRING, FALSE, 1, PATH_MAX_BYTES,
       "Directory to run it in (default: the user's home)"},
      {"env", ARG_ENV, FALSE, 0, VM_ARGV_MAX, "Environment variables to set: {\"NAME\": \"value\"}"},
      {"timeout_s", ARG_INTEGER, FALSE, 1, VMCTL_MCP_TIMEOUT_MAX, "Seconds it may run", "300"},
      {"max_output_bytes", ARG_INTEGER, FALSE, 0, VMCTL_MCP_OUTPUT_MAX,
       "Bytes of stdout and of stderr returned", "262144"},
      {"output_encoding", ARG_CHOICE, FALSE, 0, 0,
       "text (invalid UTF-8 becomes U+FFFD) or base64", "\"text\"", encodings},
      {NULL}}},
    {"read_file", "Read a file",
     "Read a file in an agent (through exec: head). Text comes back as it is; bytes that are not "
     "UTF-8 come back in base64, and encoding says which.",
     TRUE, FALSE, TRUE, FALSE, tool_read_file,
     "{'type':'object','properties':{'path':{'type':'string'},'content':{'type':'string'},"
     "'encoding':" ENCODING_SCHEMA ",'bytes':{'type':'integer'},'truncated':{'type':'boolean',"
     "'description':'the file goes on past max_bytes'}},"
     "'required':['path','content','encoding','bytes','truncated']}",
     {NAME_ARG(AGENT_DESC),
      {"path", ARG_STRING, TRUE, 1, PATH_MAX_BYTES,
       "The file; a relative path is from the user's home"},
      {"max_bytes", ARG_INTEGER, FALSE, 0, VMCTL_MCP_READ_MAX, "Bytes returned at most",
       "1048576"},
      {"encoding", ARG_CHOICE, FALSE, 0, 0, "text or base64", "\"text\"", encodings},
      {NULL}}},
    {"write_file", "Write a file",
     "Write (or append to) a file in an agent, as the agent's user (through exec: cat).",
     FALSE, TRUE, FALSE, FALSE, tool_write_file,
     "{'type':'object','properties':{'path':{'type':'string'},'bytes':{'type':'integer'}},"
     "'required':['path','bytes']}",
     {NAME_ARG(AGENT_DESC),
      {"path", ARG_STRING, TRUE, 1, PATH_MAX_BYTES,
       "The file; a relative path is from the user's home"},
      {"content", ARG_STRING, TRUE, 0, UNBOUNDED, "What to write"},
      {"encoding", ARG_CHOICE, FALSE, 0, 0, "How content is given: text or base64", "\"text\"",
       encodings},
      {"append", ARG_BOOLEAN, FALSE, 0, 0, "Append instead of replacing", "false"},
      {"make_parents", ARG_BOOLEAN, FALSE, 0, 0, "Create missing parent directories", "false"},
      {"mode", ARG_STRING, FALSE, 3, 4, "Octal permissions to set, such as \"0644\"", NULL, NULL,
       "^[0-7]{3,4}$"},
      {NULL}}},
    {"copy_to_agent", "Copy into an agent",
     "Copy a file or a whole directory from the host's copy directory into an agent (a tar "
     "stream through exec; modes and times kept, symlinks as symlinks). Onto an existing "
     "directory it lands inside it under its own name; otherwise it takes the name of path, "
     "whose parent must exist.",
     FALSE, TRUE, TRUE, FALSE, tool_copy_to_agent, COPY_SCHEMA,
     {NAME_ARG(AGENT_DESC),
      {"host_path", ARG_STRING, TRUE, 1, PATH_MAX_BYTES,
       "What to copy, relative to the copy directory (no '..')"},
      {"path", ARG_STRING, FALSE, 0, PATH_MAX_BYTES,
       "Where it goes in the agent; relative is from the user's home", "\"\""},
      {NULL}}, TRUE},
    {"copy_from_agent", "Copy out of an agent",
     "Copy a file or a whole directory of an agent into the host's copy directory, modes and "
     "times kept, symlinks as symlinks; nothing the agent sends is written outside it.",
     FALSE, TRUE, TRUE, FALSE, tool_copy_from_agent, COPY_SCHEMA,
     {NAME_ARG(AGENT_DESC),
      {"path", ARG_STRING, TRUE, 1, PATH_MAX_BYTES,
       "What to copy; relative is from the user's home"},
      {"host_path", ARG_STRING, FALSE, 0, PATH_MAX_BYTES,
       "Where it goes, relative to the copy directory (no '..'; empty: the directory itself)",
       "\"\""},
      {NULL}}, TRUE},
    {"checkpoint", "Checkpoint an agent",
     "Take a checkpoint of an agent, live: its disk, and with memory its RAM and processes too. "
     "Returns the checkpoint, whose id restore, diff and fork take.",
     FALSE, FALSE, FALSE, FALSE, tool_checkpoint,
     "{'type':'object','properties':{'checkpoint':" CHECKPOINT_SCHEMA ",'warning':{'type':"
     "'string','description':'the filesystems could not be frozen'}},'required':['checkpoint']}",
     {NAME_ARG(AGENT_DESC),
      {"label", ARG_STRING, FALSE, 0, VM_LABEL_MAX, "A note to find it by"},
      {"memory", ARG_BOOLEAN, FALSE, 0, 0, "Save RAM and processes too", "false"},
      {NULL}}},
    {"list_checkpoints", "List checkpoints",
     "List an agent's checkpoints, oldest first: id, time, kind, size, label, whether current.",
     TRUE, FALSE, TRUE, FALSE, NULL,
     "{'type':'object','properties':{'checkpoints':{'type':'array','items':" CHECKPOINT_SCHEMA
     "}},'required':['checkpoints']}",
     {NAME_ARG(AGENT_DESC), {NULL}}, FALSE, VM_OP_CHECKPOINT_LIST, "checkpoints"},
    {"restore", "Restore a checkpoint",
     "Put an agent back to a checkpoint: the whole VM (a disk checkpoint boots, a memory one "
     "resumes), or with paths only those guest files and trees while the rest runs on. The state "
     "before is kept as an automatic checkpoint, returned as undo.",
     FALSE, TRUE, FALSE, FALSE, tool_restore,
     "{'type':'object','properties':{'agent':" AGENT_SCHEMA ",'undo':{'type':'string',"
     "'description':'the checkpoint taken before, to undo the restore'}},"
     "'required':['agent','undo']}",
     {NAME_ARG(AGENT_DESC),
      {"checkpoint", ARG_STRING, TRUE, 1, VM_LABEL_MAX, "The checkpoint id"},
      {"paths", ARG_STRINGS, FALSE, 1, VM_PATHS_MAX, "Absolute guest paths to put back alone"},
      {"wait", ARG_BOOLEAN, FALSE, 0, 0, "Whole restore: wait until it answers on SSH", "true"},
      {NULL}}},
    {"diff", "Compare checkpoints",
     "Files added (A), deleted (D) and modified (M) from a checkpoint to another one or to the "
     "agent as it is now. Takes seconds.",
     TRUE, FALSE, TRUE, FALSE, tool_diff,
     "{'type':'object','properties':{'changes':{'type':'array','items':{'type':'object',"
     "'properties':{'kind':{'type':'string','enum':['A','D','M']},'path':{'type':'string'}},"
     "'required':['kind','path']}},'truncated':{'type':'boolean'}},"
     "'required':['changes','truncated']}",
     {NAME_ARG(AGENT_DESC),
      {"checkpoint", ARG_STRING, TRUE, 1, VM_LABEL_MAX, "The checkpoint compared from"},
      {"other", ARG_STRING, FALSE, 1, VM_LABEL_MAX,
       "The checkpoint compared to (default: the agent now)"},
      {"path", ARG_STRING, FALSE, 1, PATH_MAX_BYTES, "Only this guest tree"},
      {NULL}}},
    {"fork", "Fork an agent",
     "Create a new agent on a checkpoint of another one (taken now, live, unless checkpoint names "
     "one), with an identity of its own; the source keeps running.",
     FALSE, FALSE, FALSE, FALSE, tool_fork,
     "{'type':'object','properties':{'agent':" AGENT_SCHEMA ",'checkpoint':{'type':'string',"
     "'description':'the source checkpoint it stands on'}},'required':['agent','checkpoint']}",
     {{"source", ARG_AGENT, TRUE, 0, 0, "The agent forked"},
      NAME_ARG("The new agent"),
      {"checkpoint", ARG_STRING, FALSE, 1, VM_LABEL_MAX, "The source checkpoint to fork from"},
      {"cpus", ARG_INTEGER, FALSE, 1, G_MAXUINT32, "Virtual CPUs (default: the source's)"},
      {"memory_mib", ARG_INTEGER, FALSE, 1, G_MAXUINT32, "Memory in MiB (default: the source's)"},
      {"wait", ARG_BOOLEAN, FALSE, 0, 0, "Wait until it answers on SSH", "true"},
      {NULL}}},
    {"suspend", "Suspend an agent",
     "Pause an agent (RAM kept, wakes in under a second) or with save write it to disk (no host "
     "RAM, wakes in seconds). Any exec wakes it again.",
     FALSE, FALSE, TRUE, FALSE, tool_suspend, AGENT_RESULT_SCHEMA,
     {NAME_ARG(AGENT_DESC),
      {"save", ARG_BOOLEAN, FALSE, 0, 0, "Save to disk instead of pausing", "false"},
      {NULL}}},
    {"resume", "Resume an agent", "Wake a paused or saved agent now.",
     FALSE, FALSE, TRUE, FALSE, NULL, AGENT_RESULT_SCHEMA,
     {NAME_ARG(AGENT_DESC), {NULL}}, FALSE, VM_OP_AGENT_RESUME, "agent"},
    {"set_resources", "Resize an agent",
     "Give an agent more (or fewer) CPUs, more or less memory, or a larger disk. The disk grows "
     "at once, its root filesystem too; CPUs and memory apply live where the VM can take them, "
     "else at its next start: each line of changes says which.",
     FALSE, FALSE, TRUE, FALSE, tool_set_resources,
     "{'type':'object','properties':{'agent':" AGENT_SCHEMA ",'changes':{'type':'array',"
     "'items':{'type':'string'},'description':'one line per size given, saying when it "
     "applies'}},'required':['agent','changes']}",
     {NAME_ARG(AGENT_DESC),
      {"cpus", ARG_INTEGER, FALSE, 1, VM_SET_CPUS_MAX, "Virtual CPUs"},
      {"memory_mib", ARG_INTEGER, FALSE, 1, VM_SET_MEMORY_MIB_MAX, "Memory in MiB"},
      {"disk_gib", ARG_INTEGER, FALSE, 1, VM_SET_DISK_GIB_MAX,
       "Disk in GiB (never less than it has)"},
      {NULL}}},
    {"egress_show", "Show egress policy",
     "Where an agent may connect: its allow and deny rules, its proxy, open connections.",
     TRUE, FALSE, TRUE, FALSE, NULL,
     "{'type':'object','properties':{'egress':" EGRESS_SCHEMA "},'required':['egress']}",
     {NAME_ARG(AGENT_DESC), {NULL}}, FALSE, VM_OP_EGRESS_GET, "egress"},
};
/* clang-format on */

const VmctlMcpTool *
vmctl_mcp_tool_find(const char *name, gboolean read_only, gboolean host_files)
{
    for (gsize i = 0; i < G_N_ELEMENTS(tools); i++) {
        if (strcmp(tools[i].name, name) == 0 && (tools[i].read_only || !read_only) &&
            (!tools[i].host_files || host_files))
            return &tools[i];
    }
    return NULL;
}

/* Parses JSON text written with ' for ". */
static JsonNode *
schema_parse(const char *text)
{
    g_autofree char *json = g_strdelimit(g_strdup(text), "'", '"');
    g_autoptr(GError) error = NULL;

    JsonNode *node = json_from_string(json, &error);
    g_assert_no_error(error);
    return node;
}

static JsonNode *
arg_schema(const ToolArg *arg, const char *const *agents)
{
    JsonObject *schema = json_object_new();
    JsonArray *values;

    switch (arg->type) {
    case ARG_AGENT:
        json_object_set_string_member(schema, "type", "string");
        json_object_set_string_member(schema, "pattern", "^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$");
        if (agents != NULL) {
            values = json_array_new();
            for (gsize i = 0; agents[i] != NULL; i++)
                json_array_add_string_element(values, agents[i]);
            json_object_set_array_member(schema, "enum", values);
        }
        break;
    case ARG_STRING:
        json_object_set_string_member(schema, "type", "string");
        if (arg->min > 0)
            json_object_set_int_member(schema, "minLength", arg->min);
        /* Bytes here, characters there: the bound holds for ASCII, hostd checks the rest. */
        if (arg->max != UNBOUNDED)
            json_object_set_int_member(schema, "maxLength", arg->max);
        if (arg->pattern != NULL)
            json_object_set_string_member(schema, "pattern", arg->pattern);
        break;
    case ARG_INTEGER:
        json_object_set_string_member(schema, "type", "integer");
        json_object_set_int_member(schema, "minimum", arg->min);
        json_object_set_int_member(schema, "maximum", arg->max);
        break;
    case ARG_BOOLEAN:
        json_object_set_string_member(schema, "type", "boolean");
        break;
    case ARG_STRINGS:
        json_object_set_string_member(schema, "type", "array");
        json_object_set_object_member(schema, "items", json_object_new());
        json_object_set_string_member(json_object_get_object_member(schema, "items"), "type",
                                      "string");
        json_object_set_int_member(schema, "minItems", arg->min);
        json_object_set_int_member(schema, "maxItems", arg->max);
        break;
    case ARG_ENV:
        json_object_set_string_member(schema, "type", "object");
        json_object_set_object_member(schema, "additionalProperties", json_object_new());
        json_object_set_string_member(json_object_get_object_member(schema, "additionalProperties"),
                                      "type", "string");
        json_object_set_int_member(schema, "maxProperties", arg->max);
        break;
    case ARG_CHOICE:
        json_object_set_string_member(schema, "type", "string");
        values = json_array_new();
        for (gsize i = 0; arg->choices[i] != NULL; i++)
            json_array_add_string_element(values, arg->choices[i]);
        json_object_set_array_member(schema, "enum", values);
        break;
    default:
        g_assert_not_reached();
    }
    json_object_set_string_member(schema, "description", arg->description);
    if (arg->fallback != NULL)
        json_object_set_member(schema, "default", schema_parse(arg->fallback));
    return node_take_object(schema);
}

static JsonNode *
input_schema(const VmctlMcpTool *tool, const char *const *agents)
{
    JsonObject *schema = json_object_new();
    JsonObject *properties = json_object_new();
    JsonArray *required = json_array_new();

    for (const ToolArg *arg = tool->args; arg->name != NULL; arg++) {
        json_object_set_member(properties, arg->name, arg_schema(arg, agents));
        if (arg->required)
            json_array_add_string_element(required, arg->name);
    }
    json_object_set_string_member(schema, "type", "object");
    json_object_set_object_member(schema, "properties", properties);
    if (json_array_get_length(required) > 0)
        json_object_set_array_member(schema, "required", required);
    else
        json_array_unref(required);
    json_object_set_boolean_member(schema, "additionalProperties", FALSE);
    return node_take_object(schema);
}

JsonNode *
vmctl_mcp_tools_list(gboolean read_only, gboolean host_files, const char *const *agents)
{
    JsonArray *list = json_array_new();

    for (gsize i = 0; i < G_N_ELEMENTS(tools); i++) {
        const VmctlMcpTool *tool = &tools[i];
        if ((read_only && !tool->read_only) || (tool->host_files && !host_files))
            continue;
        JsonObject *entry = json_object_new();
        JsonObject *annotations = json_object_new();
        json_object_set_string_member(entry, "name", tool->name);
        json_object_set_string_member(entry, "title", tool->title);
        json_object_set_string_member(entry, "description", tool->description);
        json_object_set_member(entry, "inputSchema", input_schema(tool, agents));
        json_object_set_member(entry, "outputSchema", schema_parse(tool->output_schema));
        json_object_set_string_member(annotations, "title", tool->title);
        json_object_set_boolean_member(annotations, "readOnlyHint", tool->read_only);
        if (!tool->read_only) {
            json_object_set_boolean_member(annotations, "destructiveHint", tool->destructive);
            json_object_set_boolean_member(annotations, "idempotentHint", tool->idempotent);
        }
        json_object_set_boolean_member(annotations, "openWorldHint", tool->open_world);
        json_object_set_object_member(entry, "annotations", annotations);
        json_array_add_object_element(list, entry);
    }
    JsonNode *node = json_node_new(JSON_NODE_ARRAY);
    json_node_take_array(node, list);
    return node;
}

/* tools/call's result around @structured, with its JSON as the text for clients that read only
 * that. */
static JsonNode *
result_new(JsonObject *structured)
{
    g_autoptr(JsonNode) node = json_node_init_object(json_node_alloc(), structured);
    g_autofree char *text = json_to_string(node, FALSE);
    JsonObject *result = json_object_new();
    JsonArray *content = json_array_new();
    JsonObject *item = json_object_new();

    json_object_set_string_member(item, "type", "text");
    json_object_set_string_member(item, "text", text);
    json_array_add_object_element(content, item);
    json_object_set_array_member(result, "content", content);
    json_object_set_object_member(result, "structuredContent", json_object_ref(structured));
    json_object_set_boolean_member(result, "isError", FALSE);
    return node_take_object(result);
}

/* A tool error: `vmctl --json`'s error object as the text. No structuredContent, which would
 * have to match the output schema. */
static JsonNode *
result_error(const GError *failure)
{
    g_autofree char *message = g_utf8_make_valid(failure->message, -1);
    g_autoptr(JsonObject) body = json_object_new();
    JsonObject *error = json_object_new();

    json_object_set_string_member(error, "code", vm_error_code_name(vm_error_code(failure)));
    json_object_set_string_member(error, "message", message);
    json_object_set_object_member(body, "error", error);
    g_autoptr(JsonNode) node = json_node_init_object(json_node_alloc(), body);
    g_autofree char *text = json_to_string(node, FALSE);

    JsonObject *result = json_object_new();
    JsonArray *content = json_array_new();
    JsonObject *item = json_object_new();
    json_object_set_string_member(item, "type", "text");
    json_object_set_string_member(item, "text", text);
    json_array_add_object_element(content, item);
    json_object_set_array_member(result, "content", content);
    json_object_set_boolean_member(result, "isError", TRUE);
    return node_take_object(result);
}

JsonNode *
vmctl_mcp_tool_call(const VmctlMcpTool *tool, JsonObject *arguments, const VmctlMcpContext *context)
{
    g_autoptr(JsonObject) empty = arguments == NULL ? json_object_new() : NULL;
    JsonObject *args = arguments != NULL ? arguments : empty;
    g_autoptr(GError) error = NULL;

    if (!check_arguments(tool, args, context, &error))
        return result_error(error);
    g_autoptr(JsonObject) structured =
        tool->func != NULL ? tool->func(args, context, &error)
                           : agent_request(context, tool->op, args, tool->result, &error);
    if (structured == NULL)
        return result_error(error);
    return result_new(structured);
}
