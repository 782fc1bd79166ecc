/* The in-guest API's routes, limits and JSON; see hostd-guest-api-rules.h. */
#include "hostd-guest-api-rules.h"

#include <string.h>

#include "vm-protocol.h"
#include "vm-util.h"

/* Bytes of an error message a guest gets. */
#define HOSTD_GUEST_API_MESSAGE_MAX 1024

/* ---------------------------------------------------------------------------------------------
 * Routes */

static const HostdGuestApiRoute hostd_guest_api_routes[] = {
    {"GET", "/v1/info", HOSTD_GUEST_API_INFO, HOSTD_GUEST_API_READS, NULL},
    {"GET", "/v1/checkpoints", HOSTD_GUEST_API_CHECKPOINT_LIST, HOSTD_GUEST_API_READS, NULL},
    {"POST", "/v1/checkpoints", HOSTD_GUEST_API_CHECKPOINT_CREATE,
     HOSTD_GUEST_API_CHANGES | HOSTD_GUEST_API_HEAVY | HOSTD_GUEST_API_BODY, "checkpoint-create"},
    {"GET", "/v1/restore", HOSTD_GUEST_API_RESTORE_STATUS, HOSTD_GUEST_API_READS, NULL},
    {"POST", "/v1/restore", HOSTD_GUEST_API_RESTORE,
     HOSTD_GUEST_API_CHANGES | HOSTD_GUEST_API_HEAVY | HOSTD_GUEST_API_BODY, "checkpoint-restore"},
    {"GET", "/v1/keep-awake", HOSTD_GUEST_API_KEEP_AWAKE_GET, HOSTD_GUEST_API_READS, NULL},
    {"POST", "/v1/keep-awake", HOSTD_GUEST_API_KEEP_AWAKE_SET,
     HOSTD_GUEST_API_CHANGES | HOSTD_GUEST_API_BODY, "agent-keep-awake"},
    {"GET", "/v1/egress", HOSTD_GUEST_API_EGRESS, HOSTD_GUEST_API_READS, NULL},
};

/* Each path and the methods it takes, for 405's Allow. */
static const struct {
    const char *path;
    const char *allow;
} hostd_guest_api_paths[] = {
    {"/v1/info", "GET"},          {"/v1/checkpoints", "GET, POST"},
    {"/v1/restore", "GET, POST"}, {"/v1/keep-awake", "GET, POST"},
    {"/v1/egress", "GET"},
};

const HostdGuestApiRoute *
hostd_guest_api_route(const char *method, const char *path, guint *ret_status,
                      const char **ret_allow)
{
    g_return_val_if_fail(method != NULL && path != NULL, NULL);

    for (gsize i = 0; i < G_N_ELEMENTS(hostd_guest_api_routes); i++) {
        const HostdGuestApiRoute *route = &hostd_guest_api_routes[i];

        if (g_str_equal(route->path, path) && g_str_equal(route->method, method))
            return route;
    }
    for (gsize i = 0; i < G_N_ELEMENTS(hostd_guest_api_paths); i++) {
        if (g_str_equal(hostd_guest_api_paths[i].path, path)) {
            *ret_status = 405;
            *ret_allow = hostd_guest_api_paths[i].allow;
            return NULL;
        }
    }
    *ret_status = 404;
    *ret_allow = NULL;
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * The rate */

gboolean
hostd_guest_api_bucket_take(HostdGuestApiBucket *bucket, double rate, guint burst, gint64 now,
                            guint *ret_retry_after_s)
{
    g_return_val_if_fail(rate > 0 && burst > 0, FALSE);

    if (bucket->last == 0) {
        bucket->tokens = burst;
        bucket->last = now;
    } else if (now > bucket->last) {
        bucket->tokens = MIN((double)burst,
                             bucket->tokens + (double)(now - bucket->last) / G_USEC_PER_SEC * rate);
        bucket->last = now;
    }
    if (bucket->tokens >= 1.0) {
        bucket->tokens -= 1.0;
        return TRUE;
    }
    double wait = (1.0 - bucket->tokens) / rate;
    guint seconds = (guint)wait;
    if ((double)seconds < wait)
        seconds++;
    *ret_retry_after_s = MAX(seconds, 1);
    return FALSE;
}

/* ---------------------------------------------------------------------------------------------
 * Request bodies */

void
hostd_guest_api_args_clear(HostdGuestApiArgs *args)
{
    g_clear_pointer(&args->label, g_free);
    g_clear_pointer(&args->id, g_free);
    g_clear_pointer(&args->paths, g_strfreev);
    args->memory = FALSE;
    args->seconds = 0;
}

static gboolean
hostd_guest_api_has_control(const char *text)
{
    for (const char *p = text; *p != '\0'; p = g_utf8_next_char(p)) {
        if (g_unichar_iscntrl(g_utf8_get_char(p)))
            return TRUE;
    }
    return FALSE;
}

/* The string member @name, which must be one of at most @max bytes. */
static const char *
hostd_guest_api_string(JsonNode *node, const char *name, gsize max, GError **error)
{
    const char *value;

    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s must be a string", name), NULL;
    value = json_node_get_string(node);
    if (strlen(value) > max)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s is longer than %" G_GSIZE_FORMAT " bytes", name, max),
               NULL;
    if (hostd_guest_api_has_control(value))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s holds a control character", name),
               NULL;
    return value;
}

static gboolean
hostd_guest_api_check_id(const char *id, GError **error)
{
    if (id[0] == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "id is empty");
    for (const char *p = id; *p != '\0'; p++) {
        if (!g_ascii_isalnum(*p) && *p != '.' && *p != '_' && *p != '-')
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "id '%s' is no checkpoint id (c1, c2...)", id);
    }
    return TRUE;
}

/* A guest path of a partial restore: absolute, not the root, no ".." component. */
static gboolean
hostd_guest_api_check_path(const char *path, GError **error)
{
    g_auto(GStrv) parts = NULL;

    if (path[0] != '/' || g_str_equal(path, "/"))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "path '%s' must be absolute and not the root", path);
    parts = g_strsplit(path, "/", -1);
    for (char **part = parts; *part != NULL; part++) {
        if (g_str_equal(*part, ".."))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "path '%s' has a '..'", path);
    }
    return TRUE;
}

static gboolean
hostd_guest_api_read_paths(JsonNode *node, HostdGuestApiArgs *args, GError **error)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();
    JsonArray *array;
    guint n;

    if (!JSON_NODE_HOLDS_ARRAY(node))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "paths must be a list of strings");
    array = json_node_get_array(node);
    n = json_array_get_length(array);
    if (n == 0 || n > HOSTD_GUEST_API_PATHS_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "paths must hold 1 to %d paths",
                        HOSTD_GUEST_API_PATHS_MAX);
    for (guint i = 0; i < n; i++) {
        const char *path = hostd_guest_api_string(json_array_get_element(array, i), "a path",
                                                  HOSTD_GUEST_API_PATH_MAX, error);

        if (path == NULL || !hostd_guest_api_check_path(path, error))
            return FALSE;
        g_strv_builder_add(builder, path);
    }
    args->paths = g_strv_builder_end(builder);
    return TRUE;
}

/* One member @name (@node) of a body to @endpoint into @args. */
static gboolean
hostd_guest_api_member(HostdGuestApiEndpoint endpoint, const char *name, JsonNode *node,
                       HostdGuestApiArgs *args, GError **error)
{
    const char *text;

    if (endpoint == HOSTD_GUEST_API_CHECKPOINT_CREATE && g_str_equal(name, "label")) {
        text = hostd_guest_api_string(node, "label", VM_LABEL_MAX, error);
        if (text == NULL)
            return FALSE;
        g_free(args->label);
        args->label = text[0] != '\0' ? g_strdup(text) : NULL;
        return TRUE;
    }
    if (endpoint == HOSTD_GUEST_API_CHECKPOINT_CREATE && g_str_equal(name, "memory")) {
        if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "memory must be true or false");
        args->memory = json_node_get_boolean(node);
        return TRUE;
    }
    if (endpoint == HOSTD_GUEST_API_RESTORE && g_str_equal(name, "id")) {
        text = hostd_guest_api_string(node, "id", VM_LABEL_MAX, error);
        if (text == NULL || !hostd_guest_api_check_id(text, error))
            return FALSE;
        g_free(args->id);
        args->id = g_strdup(text);
        return TRUE;
    }
    if (endpoint == HOSTD_GUEST_API_RESTORE && g_str_equal(name, "paths")) {
        g_clear_pointer(&args->paths, g_strfreev);
        return hostd_guest_api_read_paths(node, args, error);
    }
    if (endpoint == HOSTD_GUEST_API_KEEP_AWAKE_SET && g_str_equal(name, "seconds")) {
        gint64 seconds;

        if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seconds must be a whole number");
        seconds = json_node_get_int(node);
        if (seconds < 1 || seconds > HOSTD_GUEST_API_KEEP_AWAKE_MAX)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seconds must be 1 to %d (24 hours)",
                            HOSTD_GUEST_API_KEEP_AWAKE_MAX);
        args->seconds = (guint)seconds;
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "this request takes no field '%s'", name);
}

gboolean
hostd_guest_api_args_parse(HostdGuestApiEndpoint endpoint, const char *body, gsize len,
                           HostdGuestApiArgs *ret, GError **error)
{
    g_autoptr(JsonParser) parser = json_parser_new();
    g_autoptr(GError) local_error = NULL;
    g_auto(HostdGuestApiArgs) args = {0};
    g_autoptr(GList) members = NULL;
    JsonNode *root;
    JsonObject *object;

    if (body == NULL || len == 0) {
        body = "{}";
        len = 2;
    }
    if (len > HOSTD_GUEST_API_BODY_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL, "the body is longer than %d bytes",
                        HOSTD_GUEST_API_BODY_MAX);
    if (memchr(body, '\0', len) != NULL || !g_utf8_validate(body, (gssize)len, NULL))
        return vm_throw(error, VM_ERROR_PROTOCOL, "the body is not UTF-8 text");
    if (!vm_json_depth_ok(body, len, HOSTD_GUEST_API_JSON_DEPTH))
        return vm_throw(error, VM_ERROR_PROTOCOL, "the body nests deeper than %d levels",
                        HOSTD_GUEST_API_JSON_DEPTH);
    if (!json_parser_load_from_data(parser, body, (gssize)len, &local_error))
        return vm_throw(error, VM_ERROR_PROTOCOL, "the body is not JSON: %s", local_error->message);
    root = json_parser_get_root(parser);
    if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root))
        return vm_throw(error, VM_ERROR_PROTOCOL, "the body is not a JSON object");
    object = json_node_get_object(root);
    members = json_object_get_members(object);
    for (GList *m = members; m != NULL; m = m->next) {
        const char *name = m->data;

        if (!hostd_guest_api_member(endpoint, name, json_object_get_member(object, name), &args,
                                    error))
            return FALSE;
    }
    if (endpoint == HOSTD_GUEST_API_RESTORE && args.id == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "a restore needs the checkpoint's id: {\"id\": \"c3\"}");
    if (endpoint == HOSTD_GUEST_API_KEEP_AWAKE_SET && args.seconds == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "a keep-awake needs its length: {\"seconds\": 600}");
    *ret = args;
    args = (HostdGuestApiArgs){0};
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Calls: what the worker hands hostd */

void
hostd_guest_api_call_clear(HostdGuestApiCall *call)
{
    g_clear_pointer(&call->method, g_free);
    g_clear_pointer(&call->path, g_free);
    g_clear_pointer(&call->refusal, g_free);
    hostd_guest_api_args_clear(&call->args);
    call->endpoint = 0;
    call->status = 0;
    call->allow = NULL;
}

/* @text made fit for a log line: printable ASCII, cut to @max bytes and "..." then. */
static char *
hostd_guest_api_printable(const char *text, gsize max)
{
    GString *out = g_string_new(NULL);

    for (const char *p = text; *p != '\0' && out->len < max; p++)
        g_string_append_c(out, g_ascii_isgraph(*p) ? *p : '?');
    if (text[0] != '\0' && out->len >= max)
        g_string_append(out, "...");
    return g_string_free(out, FALSE);
}

static gboolean
hostd_guest_api_is_printable(const char *text, gsize max)
{
    gsize len = strlen(text);

    /* As hostd_guest_api_printable() leaves it: "..." only after a cut. */
    if (len > max + 3 || (len > max && !g_str_equal(text + max, "...")))
        return FALSE;
    for (gsize i = 0; i < MIN(len, max); i++) {
        if (!g_ascii_isgraph(text[i]))
            return FALSE;
    }
    return TRUE;
}

static void
hostd_guest_api_call_refuse(HostdGuestApiCall *call, guint status, VmErrorCode code,
                            const char *message)
{
    g_autoptr(GError) error = g_error_new_literal(VM_ERROR, code, message);

    call->endpoint = 0;
    call->status = status;
    hostd_guest_api_args_clear(&call->args);
    g_free(call->refusal);
    call->refusal = hostd_guest_api_error_json(error, 0);
}

void
hostd_guest_api_call_read(const char *method, const char *path, const char *body, gsize len,
                          gboolean too_long, HostdGuestApiCall *ret)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *message = NULL;
    const HostdGuestApiRoute *route;
    guint status = 0;
    const char *allow = NULL;

    *ret = (HostdGuestApiCall){0};
    ret->method = hostd_guest_api_printable(method, HOSTD_GUEST_API_LOG_METHOD_MAX);
    ret->path = hostd_guest_api_printable(path, HOSTD_GUEST_API_LOG_PATH_MAX);
    route = hostd_guest_api_route(method, path, &status, &allow);
    if (route == NULL && status == 405) {
        message = g_strdup_printf("%s takes %s only", ret->path, allow);
        hostd_guest_api_call_refuse(ret, 405, VM_ERROR_INVALID_ARGUMENT, message);
        ret->allow = allow;
        return;
    }
    if (route == NULL) {
        message = g_strdup_printf("no %s in this API (see GET /v1/info)", ret->path);
        hostd_guest_api_call_refuse(ret, 404, VM_ERROR_NOT_FOUND, message);
        return;
    }
    if (too_long) {
        hostd_guest_api_call_refuse(ret, 413, VM_ERROR_PROTOCOL,
                                    "the request body is longer than 16384 bytes");
        return;
    }
    if ((route->flags & HOSTD_GUEST_API_BODY) &&
        !hostd_guest_api_args_parse(route->endpoint, body, len, &ret->args, &error)) {
        hostd_guest_api_call_refuse(ret, 400, vm_error_code(error), error->message);
        return;
    }
    ret->endpoint = route->endpoint;
}

GVariant *
hostd_guest_api_call_to_variant(const HostdGuestApiCall *call, guint32 serial)
{
    const char *const none[] = {NULL};

    return g_variant_new("(uuusssbs^asu)", serial, (guint32)call->endpoint, (guint32)call->status,
                         call->method, call->path, call->args.label != NULL ? call->args.label : "",
                         call->args.memory, call->args.id != NULL ? call->args.id : "",
                         call->args.paths != NULL ? (const char *const *)call->args.paths : none,
                         (guint32)call->args.seconds);
}

/* The arguments of a call to @endpoint: those it takes, within their bounds; the others empty. */
static gboolean
hostd_guest_api_call_args_ok(HostdGuestApiEndpoint endpoint, const char *label, gboolean memory,
                             const char *id, const char *const *paths, guint32 seconds,
                             GError **error)
{
    gsize n_paths = g_strv_length((char **)paths);

    if (endpoint != HOSTD_GUEST_API_CHECKPOINT_CREATE && (label[0] != '\0' || memory))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a label or memory for another endpoint");
    if (strlen(label) > VM_LABEL_MAX || hostd_guest_api_has_control(label))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a label out of bounds");
    if (endpoint != HOSTD_GUEST_API_RESTORE && (id[0] != '\0' || n_paths > 0))
        return vm_throw(error, VM_ERROR_PROTOCOL, "an id or paths for another endpoint");
    if (endpoint == HOSTD_GUEST_API_RESTORE &&
        (strlen(id) > VM_LABEL_MAX || !hostd_guest_api_check_id(id, NULL)))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a restore without a checkpoint id");
    if (n_paths > HOSTD_GUEST_API_PATHS_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL, "more than %d paths", HOSTD_GUEST_API_PATHS_MAX);
    for (gsize i = 0; i < n_paths; i++) {
        if (strlen(paths[i]) > HOSTD_GUEST_API_PATH_MAX || hostd_guest_api_has_control(paths[i]) ||
            !hostd_guest_api_check_path(paths[i], NULL))
            return vm_throw(error, VM_ERROR_PROTOCOL, "a path out of bounds");
    }
    if ((endpoint == HOSTD_GUEST_API_KEEP_AWAKE_SET) !=
            (seconds >= 1 && seconds <= HOSTD_GUEST_API_KEEP_AWAKE_MAX) ||
        (endpoint != HOSTD_GUEST_API_KEEP_AWAKE_SET && seconds != 0))
        return vm_throw(error, VM_ERROR_PROTOCOL, "seconds out of bounds");
    return TRUE;
}

gboolean
hostd_guest_api_call_from_variant(GVariant *value, guint32 *ret_serial, HostdGuestApiCall *ret,
                                  GError **error)
{
    g_auto(HostdGuestApiCall) call = {0};
    g_autofree const char **paths = NULL;
    const char *method, *path, *label, *id;
    guint32 serial, endpoint, status, seconds;
    gboolean memory;
    const HostdGuestApiRoute *route;
    guint route_status = 0;
    const char *allow = NULL;

    if (!g_variant_is_of_type(value, G_VARIANT_TYPE(HOSTD_GUEST_API_CALL_TYPE)))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a call of type %s",
                        g_variant_get_type_string(value));
    g_variant_get(value, "(uuu&s&s&sb&s^a&su)", &serial, &endpoint, &status, &method, &path, &label,
                  &memory, &id, &paths, &seconds);
    if (!hostd_guest_api_is_printable(method, HOSTD_GUEST_API_LOG_METHOD_MAX) ||
        !hostd_guest_api_is_printable(path, HOSTD_GUEST_API_LOG_PATH_MAX))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a method or path that is not as logged");
    route = hostd_guest_api_route(method, path, &route_status, &allow);
    if (endpoint != 0) {
        if (status != 0 || route == NULL || route->endpoint != endpoint)
            return vm_throw(error, VM_ERROR_PROTOCOL, "endpoint %u for %s %s", endpoint, method,
                            path);
    } else if (!((status == 404 || status == 405) ? route == NULL && route_status == status
                 : status == 413                  ? route != NULL
                 : status == 400 ? route != NULL && (route->flags & HOSTD_GUEST_API_BODY) != 0
                                 : FALSE)) {
        return vm_throw(error, VM_ERROR_PROTOCOL, "a refusal %u of %s %s", status, method, path);
    }
    if (!hostd_guest_api_call_args_ok(endpoint, label, memory, id, paths, seconds, error))
        return FALSE;
    call.endpoint = endpoint;
    call.status = status;
    call.method = g_strdup(method);
    call.path = g_strdup(path);
    call.args.label = label[0] != '\0' ? g_strdup(label) : NULL;
    call.args.memory = memory;
    call.args.id = id[0] != '\0' ? g_strdup(id) : NULL;
    call.args.paths = paths[0] != NULL ? g_strdupv((char **)paths) : NULL;
    call.args.seconds = seconds;
    *ret_serial = serial;
    *ret = call;
    call = (HostdGuestApiCall){0};
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Errors */

guint
hostd_guest_api_error_status(VmErrorCode code)
{
    switch (code) {
    case VM_ERROR_INVALID_ARGUMENT:
    case VM_ERROR_PROTOCOL:
        return 400;
    case VM_ERROR_NOT_FOUND:
        return 404;
    case VM_ERROR_EXISTS:
    case VM_ERROR_BAD_STATE:
    case VM_ERROR_BUSY:
        return 409;
    case VM_ERROR_NOT_RUNNING:
    case VM_ERROR_CANCELLED:
        return 503;
    case VM_ERROR_TIMEOUT:
        return 504;
    case VM_ERROR_NO_RESOURCES:
        return 507;
    case VM_ERROR_FAILED:
    case VM_ERROR_TEMPLATE:
    case VM_ERROR_LIBVIRT:
    case VM_ERROR_SSH:
    case VM_ERROR_IO:
    case VM_ERROR_IMAGE:
    default:
        return 500;
    }
}

static gint
hostd_guest_api_longer_first(gconstpointer a, gconstpointer b)
{
    gsize la = strlen(*(const char *const *)a), lb = strlen(*(const char *const *)b);

    return la < lb ? 1 : la > lb ? -1 : 0;
}

char *
hostd_guest_api_scrub(const char *text, const char *const *host_dirs)
{
    g_autoptr(GString) out = g_string_new(text);
    g_autoptr(GPtrArray) dirs = g_ptr_array_new();

    for (const char *const *d = host_dirs; d != NULL && *d != NULL; d++) {
        if ((*d)[0] != '\0')
            g_ptr_array_add(dirs, (gpointer)*d);
    }
    /* The most specific first: an images dir inside the state dir goes as a whole. */
    g_ptr_array_sort(dirs, hostd_guest_api_longer_first);
    for (guint i = 0; i < dirs->len; i++)
        g_string_replace(out, dirs->pdata[i], "<host>", 0);
    return g_string_free(g_steal_pointer(&out), FALSE);
}

static char *
hostd_guest_api_to_text(JsonNode *root)
{
    g_autoptr(JsonGenerator) gen = json_generator_new();

    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

char *
hostd_guest_api_error_json(const GError *error, guint retry_after_s)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autofree char *message = vm_utf8_cut(error->message, HOSTD_GUEST_API_MESSAGE_MAX);
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "error");
    json_builder_add_string_value(b, vm_error_code_name(vm_error_code(error)));
    json_builder_set_member_name(b, "message");
    json_builder_add_string_value(b, message);
    if (retry_after_s != 0) {
        json_builder_set_member_name(b, "retry_after");
        json_builder_add_int_value(b, retry_after_s);
    }
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return hostd_guest_api_to_text(root);
}

/* ---------------------------------------------------------------------------------------------
 * Answers */

JsonNode *
hostd_guest_api_pick(GVariant *dict, const char *const *keys)
{
    JsonObject *object = json_object_new();
    JsonNode *node = json_node_new(JSON_NODE_OBJECT);

    for (const char *const *key = keys; *key != NULL; key++) {
        g_autoptr(GVariant) value = g_variant_lookup_value(dict, *key, NULL);

        if (value != NULL)
            json_object_set_member(object, *key, json_gvariant_serialize(value));
    }
    json_node_take_object(node, object);
    return node;
}

JsonNode *
hostd_guest_api_pick_each(GVariant *list, const char *const *keys)
{
    JsonArray *array = json_array_new();
    JsonNode *node = json_node_new(JSON_NODE_ARRAY);
    gsize n = g_variant_n_children(list);

    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) dict = g_variant_get_child_value(list, i);

        json_array_add_element(array, hostd_guest_api_pick(dict, keys));
    }
    json_node_take_array(node, array);
    return node;
}

JsonNode *
hostd_guest_api_keep_awake_node(gint64 until, gint64 now, gint64 now_real)
{
    g_autoptr(JsonBuilder) b = NULL;

    if (until == 0 || (until != G_MAXINT64 && until <= now))
        return json_node_new(JSON_NODE_NULL);
    b = json_builder_new();
    json_builder_begin_object(b);
    if (until == G_MAXINT64) {
        json_builder_set_member_name(b, "indefinite");
        json_builder_add_boolean_value(b, TRUE);
    } else {
        gint64 left_us = until - now;
        g_autoptr(GDateTime) at =
            g_date_time_new_from_unix_utc((now_real + left_us) / G_USEC_PER_SEC);
        g_autofree char *iso = g_date_time_format(at, "%Y-%m-%dT%H:%M:%SZ");

        json_builder_set_member_name(b, "until");
        json_builder_add_string_value(b, iso);
        json_builder_set_member_name(b, "seconds_left");
        json_builder_add_int_value(b, (left_us + G_USEC_PER_SEC - 1) / G_USEC_PER_SEC);
    }
    json_builder_end_object(b);
    return json_builder_get_root(b);
}

JsonNode *
hostd_guest_api_info_node(const HostdAgentRecord *r, const char *state, JsonNode *keep_awake)
{
    g_autoptr(JsonBuilder) b = json_builder_new();

    json_builder_begin_object(b);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, r->name);
    json_builder_set_member_name(b, "state");
    json_builder_add_string_value(b, state);
    json_builder_set_member_name(b, "template");
    json_builder_add_string_value(b, r->template_name);
    json_builder_set_member_name(b, "cpus");
    json_builder_add_int_value(b, r->cpus);
    json_builder_set_member_name(b, "memory_mib");
    json_builder_add_int_value(b, r->memory_mib);
    json_builder_set_member_name(b, "disk_gib");
    json_builder_add_int_value(b, r->disk_gib);
    json_builder_set_member_name(b, "created");
    json_builder_add_int_value(b, r->created);
    json_builder_set_member_name(b, "state_since");
    json_builder_add_int_value(b, r->state_since);

    json_builder_set_member_name(b, "idle");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "never");
    json_builder_add_boolean_value(b,
                                   r->idle_never || (r->idle_pause_s == 0 && r->idle_save_s == 0));
    json_builder_set_member_name(b, "pause_after_s");
    json_builder_add_int_value(b, r->idle_never ? 0 : r->idle_pause_s);
    json_builder_set_member_name(b, "save_after_s");
    json_builder_add_int_value(b, r->idle_never ? 0 : r->idle_save_s);
    json_builder_end_object(b);

    json_builder_set_member_name(b, "checkpoints");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "every_s");
    json_builder_add_int_value(b, r->checkpoint_every_s);
    json_builder_set_member_name(b, "keep");
    json_builder_add_int_value(b, r->checkpoint_keep);
    json_builder_set_member_name(b, "hourly");
    json_builder_add_int_value(b, r->checkpoint_hourly);
    json_builder_set_member_name(b, "daily");
    json_builder_add_int_value(b, r->checkpoint_daily);
    json_builder_end_object(b);

    json_builder_set_member_name(b, "restart");
    json_builder_add_string_value(b, r->restart != NULL ? r->restart : HOSTD_RESTART_ON_CRASH);
    json_builder_set_member_name(b, "keep_awake");
    json_builder_add_value(b, keep_awake != NULL ? keep_awake : json_node_new(JSON_NODE_NULL));
    json_builder_end_object(b);
    return json_builder_get_root(b);
}

char *
hostd_guest_api_wrap(const char *key, JsonNode *value)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    g_autoptr(JsonNode) root = NULL;

    json_builder_begin_object(b);
    json_builder_set_member_name(b, key);
    json_builder_add_value(b, value != NULL ? value : json_node_new(JSON_NODE_NULL));
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    return hostd_guest_api_to_text(root);
}
