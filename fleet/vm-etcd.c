#include "vm-etcd.h"

#include <curl/curl.h>
#include <json-glib/json-glib.h>
#include <string.h>

#include "vm-error.h"

#define VM_ETCD_CONNECT_TIMEOUT_MS 1000
#define VM_ETCD_TTL_MAX            (365LL * 24 * 3600)

/* gRPC status codes etcd answers with where another member may do better. */
#define GRPC_CANCELLED         1
#define GRPC_UNKNOWN           2
#define GRPC_DEADLINE_EXCEEDED 4
#define GRPC_NOT_FOUND         5
#define GRPC_UNAVAILABLE       14

struct _VmEtcd {
    GPtrArray *endpoints; /* char*, without a trailing slash */
    char *endpoints_text;
    char *ca;
    char *cert;
    char *key;
    guint timeout_ms;
    gint current; /* the endpoint that answered last; atomic */
};

typedef enum {
    TXN_PUT,
    TXN_DELETE,
    TXN_GET,
} TxnOpKind;

typedef struct {
    TxnOpKind kind;
    char *key;
    char *value;
    gint64 lease;
} TxnOp;

typedef struct {
    const char *target; /* "VERSION", "VALUE", "MOD" */
    char *key;
    gint64 number;
    char *value;
} TxnCompare;

struct _VmEtcdTxn {
    GPtrArray *compares; /* TxnCompare* */
    GPtrArray *success;  /* TxnOp* */
    GPtrArray *failure;  /* TxnOp* */
};

static void
vm_etcd_curl_init(void)
{
    static gsize once = 0;

    if (g_once_init_enter(&once))
        g_once_init_leave(&once, curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 1 : 2);
}

void
vm_etcd_kv_free(VmEtcdKv *kv)
{
    if (kv == NULL)
        return;
    g_free(kv->key);
    g_clear_pointer(&kv->value, g_bytes_unref);
    g_free(kv);
}

static gboolean
vm_etcd_endpoint_valid(const char *endpoint)
{
    if (!g_str_has_prefix(endpoint, "http://") && !g_str_has_prefix(endpoint, "https://"))
        return FALSE;
    if (strlen(endpoint) > 512)
        return FALSE;
    for (const char *p = endpoint; *p != '\0'; p++) {
        if (!g_ascii_isgraph(*p))
            return FALSE;
    }
    const char *host = strstr(endpoint, "://") + 3;
    return *host != '\0' && *host != '/';
}

VmEtcd *
vm_etcd_new(const char *const *endpoints, const char *ca, const char *cert, const char *key,
            GError **error)
{
    g_autoptr(GPtrArray) list = g_ptr_array_new_with_free_func(g_free);

    for (guint i = 0; endpoints != NULL && endpoints[i] != NULL; i++) {
        if (!vm_etcd_endpoint_valid(endpoints[i]))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "etcd endpoint '%s' is not http://HOST:PORT or https://HOST:PORT",
                            endpoints[i]),
                   NULL;
        char *e = g_strdup(endpoints[i]);
        gsize n = strlen(e);
        while (n > 0 && e[n - 1] == '/')
            e[--n] = '\0';
        g_ptr_array_add(list, e);
    }
    if (list->len == 0 || list->len > VM_ETCD_ENDPOINTS_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "1 to %d etcd endpoints are needed",
                        VM_ETCD_ENDPOINTS_MAX),
               NULL;
    if ((cert == NULL) != (key == NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "an etcd client certificate needs its key, and a key its certificate"),
               NULL;

    vm_etcd_curl_init();
    VmEtcd *etcd = g_new0(VmEtcd, 1);
    g_ptr_array_add(list, NULL);
    etcd->endpoints_text = g_strjoinv(", ", (char **)list->pdata);
    g_ptr_array_remove_index(list, list->len - 1);
    etcd->endpoints = g_steal_pointer(&list);
    etcd->ca = g_strdup(ca);
    etcd->cert = g_strdup(cert);
    etcd->key = g_strdup(key);
    etcd->timeout_ms = VM_ETCD_TIMEOUT_MS;
    return etcd;
}

void
vm_etcd_set_timeout(VmEtcd *etcd, guint timeout_ms)
{
    etcd->timeout_ms = MAX(timeout_ms, 100);
}

void
vm_etcd_free(VmEtcd *etcd)
{
    if (etcd == NULL)
        return;
    g_ptr_array_unref(etcd->endpoints);
    g_free(etcd->endpoints_text);
    g_free(etcd->ca);
    g_free(etcd->cert);
    g_free(etcd->key);
    g_free(etcd);
}

const char *
vm_etcd_endpoints_text(const VmEtcd *etcd)
{
    return etcd->endpoints_text;
}

/* ---------------------------------------------------------------------------------------------
 * One call */

typedef struct {
    GByteArray *body;
    gboolean too_big;
} Answer;

static size_t
vm_etcd_write_cb(char *data, size_t size, size_t nmemb, void *user)
{
    Answer *answer = user;
    size_t n = size * nmemb;

    if (answer->body->len + n > VM_ETCD_RESPONSE_MAX) {
        answer->too_big = TRUE;
        return 0;
    }
    g_byte_array_append(answer->body, (const guint8 *)data, (guint)n);
    return n;
}

typedef enum {
    CALL_OK,
    CALL_NEXT, /* this member cannot answer: try another */
    CALL_FAILED,
} CallOutcome;

static gboolean
json_int64(JsonObject *o, const char *member, gint64 *ret)
{
    JsonNode *n = json_object_get_member(o, member);

    *ret = 0;
    if (n == NULL)
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(n))
        return FALSE;
    if (json_node_get_value_type(n) == G_TYPE_INT64) {
        *ret = json_node_get_int(n);
        return TRUE;
    }
    if (json_node_get_value_type(n) != G_TYPE_STRING)
        return FALSE;
    const char *s = json_node_get_string(n);
    gint64 v;
    if (!g_ascii_string_to_signed(s, 10, G_MININT64, G_MAXINT64, &v, NULL))
        return FALSE;
    *ret = v;
    return TRUE;
}

/* Parses @body as a JSON object; on an etcd error object returns CALL_NEXT or CALL_FAILED with
 * @error set. */
static CallOutcome
vm_etcd_parse(const char *endpoint, long status, GByteArray *body, JsonNode **ret_root,
              GError **error)
{
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    g_autoptr(GError) local_error = NULL;

    if (body->len == 0 ||
        !json_parser_load_from_data(parser, (const char *)body->data, (gssize)body->len,
                                    &local_error) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser))) {
        vm_throw(error, status >= 500 ? VM_ERROR_NOT_RUNNING : VM_ERROR_PROTOCOL,
                 "etcd at %s answered HTTP %ld with no JSON object", endpoint, status);
        return status >= 500 ? CALL_NEXT : CALL_FAILED;
    }
    JsonObject *o = json_node_get_object(json_parser_get_root(parser));
    if (json_object_has_member(o, "error") || status != 200) {
        gint64 code = 0;
        const char *message = NULL;
        const char *code_member = "code";
        JsonNode *m = json_object_get_member(o, "error");
        /* A streaming call (keepalive) wraps its error: {"error": {"grpc_code", "message"}}. */
        if (m != NULL && JSON_NODE_HOLDS_OBJECT(m)) {
            o = json_node_get_object(m);
            code_member = "grpc_code";
            m = NULL;
        }
        if (m == NULL)
            m = json_object_get_member(o, "message");
        if (m != NULL && JSON_NODE_HOLDS_VALUE(m) && json_node_get_value_type(m) == G_TYPE_STRING)
            message = json_node_get_string(m);
        if (!json_int64(o, code_member, &code) || code == 0)
            code = GRPC_UNKNOWN;
        g_autofree char *text = g_strndup(message != NULL ? message : "no message", 512);
        g_strcanon(text,
                   " !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`"
                   "abcdefghijklmnopqrstuvwxyz{|}~",
                   '?');
        if (code == GRPC_CANCELLED || code == GRPC_UNKNOWN || code == GRPC_DEADLINE_EXCEEDED ||
            code == GRPC_UNAVAILABLE || status >= 500) {
            vm_throw(error, VM_ERROR_NOT_RUNNING, "etcd at %s: %s", endpoint, text);
            return CALL_NEXT;
        }
        vm_throw(error, code == GRPC_NOT_FOUND ? VM_ERROR_NOT_FOUND : VM_ERROR_FAILED,
                 "etcd at %s: %s", endpoint, text);
        return CALL_FAILED;
    }
    *ret_root = json_node_ref(json_parser_get_root(parser));
    return CALL_OK;
}

static CallOutcome
vm_etcd_post_one(VmEtcd *etcd, const char *endpoint, const char *path, const char *request,
                 JsonNode **ret_root, GError **error)
{
    g_autofree char *url = g_strconcat(endpoint, path, NULL);
    g_autoptr(GByteArray) body = g_byte_array_new();
    Answer answer = {body, FALSE};
    char curl_error[CURL_ERROR_SIZE] = "";
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    CURL *curl = curl_easy_init();
    long status = 0;

    if (curl == NULL) {
        curl_slist_free_all(headers);
        vm_throw(error, VM_ERROR_IO, "cannot make an HTTP client");
        return CALL_FAILED;
    }
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(request));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)etcd->timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)MIN(etcd->timeout_ms, VM_ETCD_CONNECT_TIMEOUT_MS));
    curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)VM_ETCD_RESPONSE_MAX);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, vm_etcd_write_cb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    if (etcd->ca != NULL)
        curl_easy_setopt(curl, CURLOPT_CAINFO, etcd->ca);
    if (etcd->cert != NULL) {
        curl_easy_setopt(curl, CURLOPT_SSLCERT, etcd->cert);
        curl_easy_setopt(curl, CURLOPT_SSLKEY, etcd->key);
    }
    CURLcode rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);

    if (answer.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
        vm_throw(error, VM_ERROR_PROTOCOL, "etcd at %s answered more than %d bytes", endpoint,
                 VM_ETCD_RESPONSE_MAX);
        return CALL_FAILED;
    }
    if (rc != CURLE_OK) {
        vm_throw(error, VM_ERROR_NOT_RUNNING, "etcd at %s: %s", endpoint,
                 curl_error[0] != '\0' ? curl_error : curl_easy_strerror(rc));
        return CALL_NEXT;
    }
    return vm_etcd_parse(endpoint, status, body, ret_root, error);
}

/* POSTs @request (a JSON text) to @path on the endpoints in turn, from the one that answered
 * last. Returns the answer's root object. */
static JsonNode *
vm_etcd_post(VmEtcd *etcd, const char *path, const char *request, GError **error)
{
    g_autoptr(GString) reasons = g_string_new(NULL);
    guint n = etcd->endpoints->len;
    guint start = (guint)g_atomic_int_get(&etcd->current) % n;

    for (guint i = 0; i < n; i++) {
        guint at = (start + i) % n;
        g_autoptr(GError) local_error = NULL;
        JsonNode *root = NULL;
        CallOutcome outcome =
            vm_etcd_post_one(etcd, etcd->endpoints->pdata[at], path, request, &root, &local_error);
        if (outcome == CALL_OK) {
            g_atomic_int_set(&etcd->current, (gint)at);
            return root;
        }
        if (outcome == CALL_FAILED) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return NULL;
        }
        g_string_append_printf(reasons, "%s%s", reasons->len > 0 ? "; " : "", local_error->message);
    }
    vm_throw(error, VM_ERROR_NOT_RUNNING, "no etcd member answers (%s)", reasons->str);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Requests and answers */

static void
add_b64(JsonBuilder *b, const char *member, const void *data, gsize len)
{
    g_autofree char *text = g_base64_encode(data, len);
    json_builder_set_member_name(b, member);
    json_builder_add_string_value(b, text);
}

static void
add_int64(JsonBuilder *b, const char *member, gint64 value)
{
    g_autofree char *text = g_strdup_printf("%" G_GINT64_FORMAT, value);
    json_builder_set_member_name(b, member);
    json_builder_add_string_value(b, text);
}

static char *
builder_text(JsonBuilder *b)
{
    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

/* The key just after every key that starts with @prefix (etcd's range_end for a prefix). */
static GBytes *
prefix_end(const char *prefix)
{
    gsize n = strlen(prefix);
    g_autofree guint8 *end = g_memdup2(prefix, n);

    while (n > 0) {
        if (end[n - 1] < 0xff) {
            end[n - 1]++;
            return g_bytes_new(end, n);
        }
        n--;
    }
    /* Every byte 0xff: to the end of the key space. */
    return g_bytes_new("\0", 1);
}

static gboolean
decode_b64(JsonObject *o, const char *member, gboolean text, GBytes **ret, GError **error)
{
    JsonNode *n = json_object_get_member(o, member);
    *ret = NULL;
    if (n == NULL) {
        *ret = g_bytes_new(NULL, 0);
        return TRUE;
    }
    if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING)
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's %s is not a string", member);
    const char *s = json_node_get_string(n);
    for (const char *p = s; *p != '\0'; p++) {
        if (!g_ascii_isalnum(*p) && *p != '+' && *p != '/' && *p != '=')
            return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's %s is not base64", member);
    }
    gsize len = 0;
    guchar *data = g_base64_decode(s, &len);
    if (text && (len > VM_ETCD_KEY_MAX || memchr(data, '\0', len) != NULL ||
                 !g_utf8_validate((const char *)data, (gssize)len, NULL))) {
        g_free(data);
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's %s is no key of ours", member);
    }
    *ret = g_bytes_new_take(data, len);
    return TRUE;
}

static VmEtcdKv *
kv_from_json(JsonNode *node, GError **error)
{
    if (!JSON_NODE_HOLDS_OBJECT(node))
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's kv is not an object"), NULL;
    JsonObject *o = json_node_get_object(node);
    g_autoptr(VmEtcdKv) kv = g_new0(VmEtcdKv, 1);
    g_autoptr(GBytes) key = NULL;
    if (!decode_b64(o, "key", TRUE, &key, error) ||
        !decode_b64(o, "value", FALSE, &kv->value, error))
        return NULL;
    gsize len = 0;
    const char *k = g_bytes_get_data(key, &len);
    kv->key = g_strndup(k != NULL ? k : "", len);
    if (!json_int64(o, "version", &kv->version) ||
        !json_int64(o, "create_revision", &kv->create_revision) ||
        !json_int64(o, "mod_revision", &kv->mod_revision) || !json_int64(o, "lease", &kv->lease))
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's kv has a bad number"), NULL;
    return g_steal_pointer(&kv);
}

/* Appends the "kvs" of range answer @o to @kvs. */
static gboolean
kvs_from_range(JsonObject *o, GPtrArray *kvs, GError **error)
{
    JsonNode *n = json_object_get_member(o, "kvs");
    if (n == NULL)
        return TRUE;
    if (!JSON_NODE_HOLDS_ARRAY(n))
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's kvs is not an array");
    JsonArray *a = json_node_get_array(n);
    for (guint i = 0; i < json_array_get_length(a); i++) {
        VmEtcdKv *kv = kv_from_json(json_array_get_element(a, i), error);
        if (kv == NULL)
            return FALSE;
        g_ptr_array_add(kvs, kv);
    }
    return TRUE;
}

static gboolean
check_key(const char *key, GError **error)
{
    if (key == NULL || key[0] == '\0' || strlen(key) > VM_ETCD_KEY_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "an etcd key of 1 to %d bytes is needed",
                        VM_ETCD_KEY_MAX);
    return TRUE;
}

static GPtrArray *
vm_etcd_range(VmEtcd *etcd, const char *key, gboolean prefix, guint limit, GError **error)
{
    if (!check_key(key, error))
        return NULL;
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    add_b64(b, "key", key, strlen(key));
    if (prefix) {
        g_autoptr(GBytes) end = prefix_end(key);
        gsize len;
        const void *data = g_bytes_get_data(end, &len);
        add_b64(b, "range_end", data, len);
    }
    if (limit > 0)
        add_int64(b, "limit", limit);
    json_builder_end_object(b);
    g_autofree char *request = builder_text(b);
    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/kv/range", request, error);
    if (root == NULL)
        return NULL;
    g_autoptr(GPtrArray) kvs = g_ptr_array_new_with_free_func((GDestroyNotify)vm_etcd_kv_free);
    if (!kvs_from_range(json_node_get_object(root), kvs, error))
        return NULL;
    return g_steal_pointer(&kvs);
}

gboolean
vm_etcd_get(VmEtcd *etcd, const char *key, VmEtcdKv **ret_kv, GError **error)
{
    g_autoptr(GPtrArray) kvs = vm_etcd_range(etcd, key, FALSE, 1, error);
    if (kvs == NULL)
        return FALSE;
    *ret_kv = kvs->len > 0 ? g_ptr_array_steal_index(kvs, 0) : NULL;
    return TRUE;
}

GPtrArray *
vm_etcd_get_prefix(VmEtcd *etcd, const char *prefix, guint limit, GError **error)
{
    return vm_etcd_range(etcd, prefix, TRUE, limit, error);
}

gboolean
vm_etcd_put(VmEtcd *etcd, const char *key, const char *value, gssize len, gint64 lease,
            GError **error)
{
    if (!check_key(key, error))
        return FALSE;
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    add_b64(b, "key", key, strlen(key));
    add_b64(b, "value", value, len < 0 ? strlen(value) : (gsize)len);
    if (lease != 0)
        add_int64(b, "lease", lease);
    json_builder_end_object(b);
    g_autofree char *request = builder_text(b);
    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/kv/put", request, error);
    return root != NULL;
}

gboolean
vm_etcd_delete(VmEtcd *etcd, const char *key, gint64 *ret_deleted, GError **error)
{
    if (!check_key(key, error))
        return FALSE;
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    add_b64(b, "key", key, strlen(key));
    json_builder_end_object(b);
    g_autofree char *request = builder_text(b);
    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/kv/deleterange", request, error);
    if (root == NULL)
        return FALSE;
    gint64 deleted = 0;
    if (!json_int64(json_node_get_object(root), "deleted", &deleted))
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's deleted is not a number");
    if (ret_deleted != NULL)
        *ret_deleted = deleted;
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Transactions */

static void
txn_op_free(TxnOp *op)
{
    g_free(op->key);
    g_free(op->value);
    g_free(op);
}

static void
txn_compare_free(TxnCompare *c)
{
    g_free(c->key);
    g_free(c->value);
    g_free(c);
}

VmEtcdTxn *
vm_etcd_txn_new(void)
{
    VmEtcdTxn *txn = g_new0(VmEtcdTxn, 1);
    txn->compares = g_ptr_array_new_with_free_func((GDestroyNotify)txn_compare_free);
    txn->success = g_ptr_array_new_with_free_func((GDestroyNotify)txn_op_free);
    txn->failure = g_ptr_array_new_with_free_func((GDestroyNotify)txn_op_free);
    return txn;
}

void
vm_etcd_txn_free(VmEtcdTxn *txn)
{
    if (txn == NULL)
        return;
    g_ptr_array_unref(txn->compares);
    g_ptr_array_unref(txn->success);
    g_ptr_array_unref(txn->failure);
    g_free(txn);
}

static void
txn_compare(VmEtcdTxn *txn, const char *target, const char *key, gint64 number, const char *value)
{
    g_return_if_fail(txn->compares->len < VM_ETCD_TXN_OPS_MAX);
    TxnCompare *c = g_new0(TxnCompare, 1);
    c->target = target;
    c->key = g_strdup(key);
    c->number = number;
    c->value = g_strdup(value);
    g_ptr_array_add(txn->compares, c);
}

void
vm_etcd_txn_if_version(VmEtcdTxn *txn, const char *key, gint64 version)
{
    txn_compare(txn, "VERSION", key, version, NULL);
}

void
vm_etcd_txn_if_value(VmEtcdTxn *txn, const char *key, const char *value)
{
    txn_compare(txn, "VALUE", key, 0, value);
}

void
vm_etcd_txn_if_mod_revision(VmEtcdTxn *txn, const char *key, gint64 revision)
{
    txn_compare(txn, "MOD", key, revision, NULL);
}

static void
txn_op(VmEtcdTxn *txn, gboolean success, TxnOpKind kind, const char *key, const char *value,
       gint64 lease)
{
    GPtrArray *ops = success ? txn->success : txn->failure;
    g_return_if_fail(ops->len < VM_ETCD_TXN_OPS_MAX);
    TxnOp *op = g_new0(TxnOp, 1);
    op->kind = kind;
    op->key = g_strdup(key);
    op->value = g_strdup(value);
    op->lease = lease;
    g_ptr_array_add(ops, op);
}

void
vm_etcd_txn_put(VmEtcdTxn *txn, gboolean success, const char *key, const char *value, gint64 lease)
{
    txn_op(txn, success, TXN_PUT, key, value, lease);
}

void
vm_etcd_txn_delete(VmEtcdTxn *txn, gboolean success, const char *key)
{
    txn_op(txn, success, TXN_DELETE, key, NULL, 0);
}

void
vm_etcd_txn_get(VmEtcdTxn *txn, gboolean success, const char *key)
{
    txn_op(txn, success, TXN_GET, key, NULL, 0);
}

static void
txn_ops_json(JsonBuilder *b, const char *member, GPtrArray *ops)
{
    json_builder_set_member_name(b, member);
    json_builder_begin_array(b);
    for (guint i = 0; i < ops->len; i++) {
        const TxnOp *op = ops->pdata[i];
        json_builder_begin_object(b);
        json_builder_set_member_name(b, op->kind == TXN_PUT      ? "request_put"
                                        : op->kind == TXN_DELETE ? "request_delete_range"
                                                                 : "request_range");
        json_builder_begin_object(b);
        add_b64(b, "key", op->key, strlen(op->key));
        if (op->kind == TXN_PUT) {
            add_b64(b, "value", op->value, strlen(op->value));
            if (op->lease != 0)
                add_int64(b, "lease", op->lease);
        }
        json_builder_end_object(b);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
}

gboolean
vm_etcd_txn_commit(VmEtcd *etcd, const VmEtcdTxn *txn, gboolean *ret_succeeded, GPtrArray **ret_kvs,
                   GError **error)
{
    GPtrArray *all[] = {txn->success, txn->failure};
    for (guint i = 0; i < txn->compares->len; i++) {
        if (!check_key(((TxnCompare *)txn->compares->pdata[i])->key, error))
            return FALSE;
    }
    for (guint j = 0; j < G_N_ELEMENTS(all); j++) {
        for (guint i = 0; i < all[j]->len; i++) {
            if (!check_key(((TxnOp *)all[j]->pdata[i])->key, error))
                return FALSE;
        }
    }

    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "compare");
    json_builder_begin_array(b);
    for (guint i = 0; i < txn->compares->len; i++) {
        const TxnCompare *c = txn->compares->pdata[i];
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "result");
        json_builder_add_string_value(b, "EQUAL");
        json_builder_set_member_name(b, "target");
        json_builder_add_string_value(b, c->target);
        add_b64(b, "key", c->key, strlen(c->key));
        if (g_str_equal(c->target, "VERSION"))
            add_int64(b, "version", c->number);
        else if (g_str_equal(c->target, "MOD"))
            add_int64(b, "mod_revision", c->number);
        else
            add_b64(b, "value", c->value, strlen(c->value));
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    txn_ops_json(b, "success", txn->success);
    txn_ops_json(b, "failure", txn->failure);
    json_builder_end_object(b);
    g_autofree char *request = builder_text(b);

    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/kv/txn", request, error);
    if (root == NULL)
        return FALSE;
    JsonObject *o = json_node_get_object(root);
    gboolean succeeded = FALSE;
    JsonNode *s = json_object_get_member(o, "succeeded");
    if (s != NULL) {
        if (!JSON_NODE_HOLDS_VALUE(s) || json_node_get_value_type(s) != G_TYPE_BOOLEAN)
            return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's succeeded is not a boolean");
        succeeded = json_node_get_boolean(s);
    }
    g_autoptr(GPtrArray) kvs = g_ptr_array_new_with_free_func((GDestroyNotify)vm_etcd_kv_free);
    JsonNode *r = json_object_get_member(o, "responses");
    if (r != NULL) {
        if (!JSON_NODE_HOLDS_ARRAY(r))
            return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's responses is not an array");
        JsonArray *a = json_node_get_array(r);
        for (guint i = 0; i < json_array_get_length(a); i++) {
            JsonNode *e = json_array_get_element(a, i);
            if (!JSON_NODE_HOLDS_OBJECT(e))
                return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's response is not an object");
            JsonNode *range = json_object_get_member(json_node_get_object(e), "response_range");
            if (range == NULL)
                continue;
            if (!JSON_NODE_HOLDS_OBJECT(range))
                return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's response_range is no object");
            if (!kvs_from_range(json_node_get_object(range), kvs, error))
                return FALSE;
        }
    }
    *ret_succeeded = succeeded;
    if (ret_kvs != NULL)
        *ret_kvs = g_steal_pointer(&kvs);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Leases */

static char *
lease_request(const char *member, gint64 value)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    add_int64(b, member, value);
    json_builder_end_object(b);
    return builder_text(b);
}

gboolean
vm_etcd_lease_grant(VmEtcd *etcd, gint64 ttl_s, gint64 *ret_id, GError **error)
{
    if (ttl_s < 1 || ttl_s > VM_ETCD_TTL_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "a lease TTL of %" G_GINT64_FORMAT " s is out of range", ttl_s);
    g_autofree char *request = lease_request("TTL", ttl_s);
    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/lease/grant", request, error);
    if (root == NULL)
        return FALSE;
    gint64 id = 0;
    if (!json_int64(json_node_get_object(root), "ID", &id) || id == 0)
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd granted no lease id");
    *ret_id = id;
    return TRUE;
}

gboolean
vm_etcd_lease_keepalive(VmEtcd *etcd, gint64 id, gint64 *ret_ttl, GError **error)
{
    g_autofree char *request = lease_request("ID", id);
    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/lease/keepalive", request, error);
    if (root == NULL)
        return FALSE;
    /* The gateway answers a stream: the one message is under "result". */
    JsonObject *o = json_node_get_object(root);
    JsonNode *result = json_object_get_member(o, "result");
    if (result == NULL || !JSON_NODE_HOLDS_OBJECT(result))
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's keepalive answer has no result");
    gint64 ttl = 0;
    if (!json_int64(json_node_get_object(result), "TTL", &ttl))
        return vm_throw(error, VM_ERROR_PROTOCOL, "etcd's TTL is not a number");
    /* A lease that is gone is renewed to nothing: TTL absent or 0. */
    if (ttl <= 0)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "etcd lease %" G_GINT64_MODIFIER "x expired",
                        id);
    if (ret_ttl != NULL)
        *ret_ttl = ttl;
    return TRUE;
}

gboolean
vm_etcd_lease_revoke(VmEtcd *etcd, gint64 id, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autofree char *request = lease_request("ID", id);
    g_autoptr(JsonNode) root = vm_etcd_post(etcd, "/v3/lease/revoke", request, &local_error);
    if (root == NULL && !g_error_matches(local_error, VM_ERROR, VM_ERROR_NOT_FOUND)) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    return TRUE;
}
