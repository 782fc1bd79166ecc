#include "vm-template.h"

#include "vm-error.h"
#include "vm-name.h"
#include "vm-util.h"

#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#define TEMPLATE_MAX_BYTES  (64 * 1024)
#define TEMPLATE_MAX_DEPTH  8  /* the format itself needs 3 levels */
#define USER_DATA_MAX_DEPTH 32 /* free-form cloud-config nests deeper */
#define DURATION_MAX_S      (365 * 24 * 3600)
#define SHOWN_MAX           40 /* characters of a bad value quoted in a message */

#define DEFAULT_CPUS              2
#define DEFAULT_MEMORY_MIB        1024
#define DEFAULT_DISK_GIB          8
#define DEFAULT_USER              "agent"
#define DEFAULT_MIRROR            "host"
#define DEFAULT_CHECKPOINT_KEEP   10
#define DEFAULT_CHECKPOINT_HOURLY 24
#define DEFAULT_CHECKPOINT_DAILY  7
#define DEFAULT_IDLE_PAUSE_S      (5 * 60)
#define DEFAULT_IDLE_SAVE_S       (30 * 60)

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(yaml_parser_t, yaml_parser_delete)
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(yaml_event_t, yaml_event_delete)

/* The parsed YAML, before any meaning is given to it: libyaml's document API would do, but it
 * has no depth limit and expands nothing we need, so a small tree built from events is simpler
 * to bound. */
typedef enum {
    NODE_SCALAR,
    NODE_MAPPING,
    NODE_SEQUENCE,
} NodeKind;

typedef struct Node Node;
struct Node {
    NodeKind kind;
    gsize line;   /* 1-based */
    gsize column; /* 1-based */
    char *value;  /* scalars */
    gboolean is_null;
    gboolean plain;
    GPtrArray *children; /* mappings: key, value, key, value...; sequences: items */
};

static void
node_free(Node *node)
{
    if (node == NULL)
        return;
    g_free(node->value);
    if (node->children != NULL)
        g_ptr_array_unref(node->children);
    g_free(node);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(Node, node_free)

/* Where and why the YAML itself is broken. */
typedef struct {
    gsize line;
    gsize column;
    char *message;
} Problem;

static void
problem_clear(Problem *problem)
{
    g_clear_pointer(&problem->message, g_free);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Problem, problem_clear)

/* A template as allocated here: the public struct plus where its name was, so that
 * vm_template_load_dir() can point at a duplicate. vm_template_free() frees it through the
 * first member. */
typedef struct {
    VmTemplate pub;
    gsize name_line;
    gsize name_column;
} TemplatePrivate;

static gboolean problem_set(Problem *problem, gsize line, gsize column, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static gboolean
problem_set(Problem *problem, gsize line, gsize column, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    problem->message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    problem->line = line;
    problem->column = column;
    return FALSE;
}

/* libyaml reports reader errors (bad UTF-8, control characters) as a byte offset only. */
static void
offset_to_position(const char *data, gsize len, gsize offset, gsize *ret_line, gsize *ret_column)
{
    gsize line = 1;
    gsize column = 1;

    for (gsize i = 0; i < offset && i < len; i++) {
        if (data[i] == '\n') {
            line++;
            column = 1;
        } else if (((guchar)data[i] & 0xc0) != 0x80) {
            column++;
        }
    }
    *ret_line = line;
    *ret_column = column;
}

/* The character at 1-based @line/@column of @data, or '\0' past the end. */
static char
char_at(const char *data, gsize len, gsize line, gsize column)
{
    gsize i = 0;

    for (gsize l = 1; l < line && i < len; i++) {
        if (data[i] == '\n')
            l++;
    }
    for (gsize c = 1; c < column && i < len; i++) {
        if (((guchar)data[i] & 0xc0) != 0x80)
            c++;
    }
    /* skip the continuation bytes of the character before */
    while (i < len && ((guchar)data[i] & 0xc0) == 0x80)
        i++;
    return i < len ? data[i] : '\0';
}

static gboolean
problem_from_parser(Problem *problem, const yaml_parser_t *parser, const char *data, gsize len)
{
    const char *what = parser->problem != NULL ? parser->problem : "invalid YAML";
    gsize line = parser->problem_mark.line + 1;
    gsize column = parser->problem_mark.column + 1;
    const char *hint = "";

    if (parser->error == YAML_READER_ERROR) {
        const char *bad = NULL;
        gsize offset = parser->problem_offset;

        /* libyaml points at the byte where it noticed, which can be the one after a broken
         * character; point at the character itself */
        if (!g_utf8_validate_len(data, len, &bad) && (gsize)(bad - data) < offset)
            offset = (gsize)(bad - data);
        offset_to_position(data, len, offset, &line, &column);
        return problem_set(problem, line, column, "%s", what);
    }
    if (char_at(data, len, line, column) == '\t')
        hint = " (YAML does not allow tabs for indentation)";
    if (parser->context != NULL && parser->context_mark.line != parser->problem_mark.line)
        return problem_set(problem, line, column,
                           "%s (line %" G_GSIZE_FORMAT ", column %" G_GSIZE_FORMAT "): %s%s",
                           parser->context, (gsize)parser->context_mark.line + 1,
                           (gsize)parser->context_mark.column + 1, what, hint);
    if (parser->context != NULL)
        return problem_set(problem, line, column, "%s: %s%s", parser->context, what, hint);
    return problem_set(problem, line, column, "%s%s", what, hint);
}

static gboolean
scalar_is_null(const yaml_event_t *event)
{
    const char *value = (const char *)event->data.scalar.value;

    if (event->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return FALSE;
    return value[0] == '\0' || g_str_equal(value, "~") || g_str_equal(value, "null") ||
           g_str_equal(value, "Null") || g_str_equal(value, "NULL");
}

/* Parses @data (one YAML document) into a tree at most @max_depth collections deep. Aliases are
 * refused: templates have no use for them and they are the classic way to blow up a consumer.
 * An empty document gives a NULL root. On failure fills @problem. */
static gboolean
tree_parse(const char *data, gsize len, guint max_depth, Node **ret_root, Problem *problem)
{
    g_auto(yaml_parser_t) parser = {0};
    g_autoptr(Node) root = NULL;
    g_autoptr(GPtrArray) open = g_ptr_array_new(); /* borrowed: the collections being filled */
    guint documents = 0;

    if (!yaml_parser_initialize(&parser))
        return problem_set(problem, 1, 1, "cannot initialize the YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    yaml_parser_set_encoding(&parser, YAML_UTF8_ENCODING);

    for (;;) {
        g_auto(yaml_event_t) event = {0};
        gsize line, column;
        Node *node = NULL;

        if (!yaml_parser_parse(&parser, &event))
            return problem_from_parser(problem, &parser, data, len);
        line = event.start_mark.line + 1;
        column = event.start_mark.column + 1;

        switch (event.type) {
        case YAML_STREAM_END_EVENT:
            *ret_root = g_steal_pointer(&root);
            return TRUE;
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1)
                return problem_set(problem, line, column, "only one YAML document is allowed");
            continue;
        case YAML_ALIAS_EVENT:
            return problem_set(problem, line, column, "aliases (*name) are not supported");
        case YAML_SCALAR_EVENT:
            if (strlen((const char *)event.data.scalar.value) != event.data.scalar.length)
                return problem_set(problem, line, column, "value contains a NUL character");
            node = g_new0(Node, 1);
            node->kind = NODE_SCALAR;
            node->value = g_strdup((const char *)event.data.scalar.value);
            node->is_null = scalar_is_null(&event);
            node->plain = event.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (open->len >= max_depth)
                return problem_set(problem, line, column, "nested deeper than %u levels",
                                   max_depth);
            node = g_new0(Node, 1);
            node->kind = event.type == YAML_MAPPING_START_EVENT ? NODE_MAPPING : NODE_SEQUENCE;
            node->children = g_ptr_array_new_with_free_func((GDestroyNotify)node_free);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            g_ptr_array_set_size(open, open->len - 1);
            continue;
        case YAML_NO_EVENT:
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
        default:
            continue;
        }

        node->line = line;
        node->column = column;
        if (open->len > 0) {
            Node *parent = g_ptr_array_index(open, open->len - 1);
            g_ptr_array_add(parent->children, node);
        } else {
            /* one document holds one root node; a second root is a second document */
            g_assert(root == NULL);
            root = node;
        }
        if (node->kind != NODE_SCALAR)
            g_ptr_array_add(open, node);
    }
}

/* ---- giving the tree its meaning ---- */

static gboolean fail_at(GError **error, const char *display, const Node *node, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static gboolean
fail_at(GError **error, const char *display, const Node *node, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_autofree char *message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, VM_ERROR, VM_ERROR_TEMPLATE,
                "%s:%" G_GSIZE_FORMAT ":%" G_GSIZE_FORMAT ": %s", display, node->line, node->column,
                message);
    return FALSE;
}

/* A user's value, quoted in a message: escaped and cut short. */
static char *
shown(const char *value)
{
    g_autofree char *cut = g_utf8_make_valid(value, -1);

    if (g_utf8_strlen(cut, -1) > SHOWN_MAX) {
        char *end = g_utf8_offset_to_pointer(cut, SHOWN_MAX);
        *end = '\0';
        g_autofree char *escaped = g_strescape(cut, NULL);
        return g_strconcat(escaped, "...", NULL);
    }
    return g_strescape(cut, NULL);
}

static const char *
node_kind_name(const Node *node)
{
    switch (node->kind) {
    case NODE_MAPPING:
        return "a mapping";
    case NODE_SEQUENCE:
        return "a list";
    case NODE_SCALAR:
    default:
        return node->is_null ? "nothing" : "a scalar";
    }
}

static gboolean
fail_type(GError **error, const char *display, const Node *node, const char *key,
          const char *expected)
{
    return fail_at(error, display, node, "%s: expected %s, got %s", key, expected,
                   node_kind_name(node));
}

/* Checks that @map is a mapping whose keys are distinct strings out of @allowed; @prefix
 * ("image.") names the mapping in messages. */
static gboolean
check_keys(const Node *map, const char *prefix, const char *const *allowed, const char *display,
           GError **error)
{
    g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);

    for (guint i = 0; i < map->children->len; i += 2) {
        const Node *key = g_ptr_array_index(map->children, i);

        if (key->kind != NODE_SCALAR || key->is_null)
            return fail_at(error, display, key, "%skeys must be strings, got %s", prefix,
                           node_kind_name(key));
        if (!g_strv_contains(allowed, key->value)) {
            g_autofree char *name = shown(key->value);
            return fail_at(error, display, key, "unknown key '%s%s'", prefix, name);
        }
        if (!g_hash_table_add(seen, key->value))
            return fail_at(error, display, key, "duplicate key '%s%s'", prefix, key->value);
    }
    return TRUE;
}

/* The value of @key in @map (already checked by check_keys()), or NULL. */
static const Node *
map_get(const Node *map, const char *key)
{
    for (guint i = 0; i < map->children->len; i += 2) {
        const Node *k = g_ptr_array_index(map->children, i);
        if (g_str_equal(k->value, key))
            return g_ptr_array_index(map->children, i + 1);
    }
    return NULL;
}

/* The key node of @key in @map, to point messages at it. */
static const Node *
map_get_key(const Node *map, const char *key)
{
    for (guint i = 0; i < map->children->len; i += 2) {
        const Node *k = g_ptr_array_index(map->children, i);
        if (g_str_equal(k->value, key))
            return k;
    }
    return NULL;
}

static gboolean
get_string(const Node *node, const char *key, char **ret, const char *display, GError **error)
{
    if (node->kind != NODE_SCALAR || node->is_null)
        return fail_type(error, display, node, key, "a string");
    g_free(*ret);
    *ret = g_strdup(node->value);
    return TRUE;
}

static gboolean
get_uint(const Node *node, const char *key, guint64 min, guint64 max, const char *unit,
         guint64 *ret, const char *display, GError **error)
{
    const char *text = node->value;
    guint64 value = 0;

    if (node->kind != NODE_SCALAR || node->is_null)
        return fail_type(error, display, node, key, "an integer");
    /* '"2"' is a string in YAML; only a plain scalar is a number */
    if (!node->plain || text[0] == '\0' || strspn(text, "0123456789") != strlen(text)) {
        g_autofree char *s = shown(text);
        return fail_at(error, display, node, "%s: expected an integer, got '%s'", key, s);
    }
    for (const char *p = text; *p != '\0'; p++) {
        if (value > (G_MAXUINT64 - 9) / 10) {
            value = G_MAXUINT64;
            break;
        }
        value = value * 10 + (guint64)(*p - '0');
    }
    if (value < min || value > max) {
        g_autofree char *s = shown(text);
        return fail_at(error, display, node,
                       "%s: must be between %" G_GUINT64_FORMAT " and %" G_GUINT64_FORMAT
                       "%s%s, got %s",
                       key, min, max, unit[0] != '\0' ? " " : "", unit, s);
    }
    *ret = value;
    return TRUE;
}

static gboolean
get_duration(const Node *node, const char *key, guint64 *ret_seconds, const char *display,
             GError **error)
{
    guint64 seconds = 0;

    if (node->kind != NODE_SCALAR || node->is_null)
        return fail_type(error, display, node, key, "a duration (30s, 5m, 2h, 1d)");
    if (!vm_duration_parse(node->value, &seconds, NULL)) {
        g_autofree char *s = shown(node->value);
        return fail_at(error, display, node,
                       "%s: expected a duration such as 30s, 5m, 2h or 1d, got '%s'", key, s);
    }
    if (seconds > DURATION_MAX_S)
        return fail_at(error, display, node, "%s: must be at most 365d, got %s", key, node->value);
    *ret_seconds = seconds;
    return TRUE;
}

typedef gboolean (*ItemCheck)(const char *item);

static gboolean
get_string_list(const Node *node, const char *key, ItemCheck check, const char *what, char ***ret,
                const char *display, GError **error)
{
    g_autoptr(GPtrArray) items = g_ptr_array_new_with_free_func(g_free);

    if (node->kind != NODE_SEQUENCE)
        return fail_type(error, display, node, key, "a list");
    for (guint i = 0; i < node->children->len; i++) {
        const Node *item = g_ptr_array_index(node->children, i);

        if (item->kind != NODE_SCALAR || item->is_null)
            return fail_at(error, display, item, "%s[%u]: expected %s, got %s", key, i, what,
                           node_kind_name(item));
        if (!check(item->value)) {
            g_autofree char *s = shown(item->value);
            return fail_at(error, display, item, "%s[%u]: '%s' is not %s", key, i, s, what);
        }
        g_ptr_array_add(items, g_strdup(item->value));
    }
    g_ptr_array_add(items, NULL);
    g_strfreev(*ret);
    *ret = (char **)g_ptr_array_free(g_steal_pointer(&items), FALSE);
    return TRUE;
}

/* ---- value checks ---- */

/* A secret's name as hostd's store takes it (hostd-secrets-check.h): 1-64 characters of
 * [a-z0-9-], a letter or digit first. Whether the secret exists is hostd's to say at `new`. */
static gboolean
is_secret_name(const char *name)
{
    gsize len = strlen(name);

    if (len < 1 || len > 64 || !(g_ascii_islower(name[0]) || g_ascii_isdigit(name[0])))
        return FALSE;
    for (gsize i = 1; i < len; i++) {
        if (!(g_ascii_islower(name[i]) || g_ascii_isdigit(name[i]) || name[i] == '-'))
            return FALSE;
    }
    return TRUE;
}

/* Debian policy: lower case, digits, + - .; at least two characters, alphanumeric first. */
static gboolean
is_package_name(const char *name)
{
    gsize len = strlen(name);

    if (len < 2 || len > 128 || !(g_ascii_islower(name[0]) || g_ascii_isdigit(name[0])))
        return FALSE;
    for (gsize i = 1; i < len; i++) {
        char c = name[i];
        if (!(g_ascii_islower(c) || g_ascii_isdigit(c) || c == '+' || c == '-' || c == '.'))
            return FALSE;
    }
    return TRUE;
}

/* A host name, "*.domain", an IP address or CIDR, optionally ":port", or hostd's preset
 * "@name"; the egress filter (and hostd's presets) give them meaning, this only keeps out what
 * could never be one (spaces, quotes, control bytes). */
static gboolean
is_egress_rule(const char *rule)
{
    gsize len = strlen(rule);

    if (len == 0 || len > 261)
        return FALSE;
    for (gsize i = rule[0] == '@' ? 1 : 0; i < len; i++) {
        char c = rule[i];
        if (!(g_ascii_isalnum(c) || strchr(".-*:/[]_", c) != NULL))
            return FALSE;
    }
    return TRUE;
}

static gboolean
is_suite(const char *suite)
{
    gsize len = strlen(suite);

    if (len == 0 || len > 64 || !g_ascii_islower(suite[0]))
        return FALSE;
    for (gsize i = 1; i < len; i++) {
        if (!(g_ascii_islower(suite[i]) || g_ascii_isdigit(suite[i]) || suite[i] == '-'))
            return FALSE;
    }
    return TRUE;
}

/* An absolute http(s) URL with a host and nothing a command line or config file could trip on. */
static gboolean
is_http_url(const char *url)
{
    g_autoptr(GUri) uri = NULL;

    for (const char *p = url; *p != '\0'; p++) {
        if ((guchar)*p <= 0x20 || (guchar)*p >= 0x7f)
            return FALSE;
    }
    uri = g_uri_parse(url, G_URI_FLAGS_NONE, NULL);
    if (uri == NULL || g_uri_get_host(uri) == NULL || g_uri_get_host(uri)[0] == '\0')
        return FALSE;
    return g_str_equal(g_uri_get_scheme(uri), "http") ||
           g_str_equal(g_uri_get_scheme(uri), "https");
}

static gboolean
is_sha256(const char *text)
{
    return strlen(text) == 64 && strspn(text, "0123456789abcdefABCDEF") == 64;
}

/* Accounts that Debian's base-passwd (and the packages an agent image has) already own. */
static const char reserved_users[] = " root daemon bin sys sync games man lp mail news uucp proxy "
                                     "www-data backup list irc gnats nobody _apt messagebus sshd "
                                     "systemd-network systemd-resolve systemd-timesync polkitd ";

/* [a-z_][a-z0-9_-]{0,31}, and no account the base system already has. */
static gboolean
user_validate(const char *user, const char **ret_why)
{
    gsize len = strlen(user);

    if (len == 0 || len > 32 || !(g_ascii_islower(user[0]) || user[0] == '_')) {
        *ret_why = "must match [a-z_][a-z0-9_-]{0,31}";
        return FALSE;
    }
    for (gsize i = 1; i < len; i++) {
        char c = user[i];
        if (!(g_ascii_islower(c) || g_ascii_isdigit(c) || c == '_' || c == '-')) {
            *ret_why = "must match [a-z_][a-z0-9_-]{0,31}";
            return FALSE;
        }
    }
    g_autofree char *word = g_strdup_printf(" %s ", user);
    if (strstr(reserved_users, word) != NULL) {
        *ret_why = "is a system account";
        return FALSE;
    }
    return TRUE;
}

/* ---- sections ---- */

static gboolean
parse_image(const Node *node, VmTemplate *t, const char *display, GError **error)
{
    static const char *const keys[] = {"build", "suite", "mirror", "url", "sha256", NULL};
    const Node *build, *value;
    g_autofree char *kind = NULL;

    if (node->kind != NODE_MAPPING)
        return fail_type(error, display, node, "image", "a mapping");
    if (!check_keys(node, "image.", keys, display, error))
        return FALSE;

    build = map_get(node, "build");
    if (build == NULL)
        return fail_at(error, display, node, "image: missing key 'build' (mmdebstrap or url)");
    if (!get_string(build, "image.build", &kind, display, error))
        return FALSE;

    if (g_str_equal(kind, "mmdebstrap")) {
        t->source = VM_IMAGE_SOURCE_MMDEBSTRAP;
        for (const char *const *k = (const char *const[]){"url", "sha256", NULL}; *k; k++) {
            if (map_get(node, *k) != NULL)
                return fail_at(error, display, map_get_key(node, *k),
                               "image.%s: only valid with 'build: url'", *k);
        }
        if ((value = map_get(node, "suite")) == NULL)
            return fail_at(error, display, node,
                           "image: 'build: mmdebstrap' needs a 'suite' (e.g. bookworm)");
        if (!get_string(value, "image.suite", &t->suite, display, error))
            return FALSE;
        if (!is_suite(t->suite)) {
            g_autofree char *s = shown(t->suite);
            return fail_at(error, display, value, "image.suite: '%s' is not a suite name", s);
        }
        t->mirror = g_strdup(DEFAULT_MIRROR);
        if ((value = map_get(node, "mirror")) != NULL) {
            if (!get_string(value, "image.mirror", &t->mirror, display, error))
                return FALSE;
            if (!g_str_equal(t->mirror, "host") && !is_http_url(t->mirror)) {
                g_autofree char *s = shown(t->mirror);
                return fail_at(error, display, value,
                               "image.mirror: must be 'host' or an http(s) URL, got '%s'", s);
            }
        }
        return TRUE;
    }

    if (g_str_equal(kind, "url")) {
        t->source = VM_IMAGE_SOURCE_URL;
        for (const char *const *k = (const char *const[]){"suite", "mirror", NULL}; *k; k++) {
            if (map_get(node, *k) != NULL)
                return fail_at(error, display, map_get_key(node, *k),
                               "image.%s: only valid with 'build: mmdebstrap'", *k);
        }
        if ((value = map_get(node, "url")) == NULL)
            return fail_at(error, display, node, "image: 'build: url' needs a 'url'");
        if (!get_string(value, "image.url", &t->url, display, error))
            return FALSE;
        if (!is_http_url(t->url)) {
            g_autofree char *s = shown(t->url);
            return fail_at(error, display, value, "image.url: '%s' is not an http(s) URL", s);
        }
        if ((value = map_get(node, "sha256")) == NULL)
            return fail_at(error, display, node,
                           "image: 'url' needs a pinned 'sha256' of the image");
        if (!get_string(value, "image.sha256", &t->sha256, display, error))
            return FALSE;
        if (!is_sha256(t->sha256))
            return fail_at(error, display, value, "image.sha256: expected 64 hex digits");
        g_autofree char *lower = g_ascii_strdown(t->sha256, -1);
        g_free(t->sha256);
        t->sha256 = g_steal_pointer(&lower);
        return TRUE;
    }

    g_autofree char *s = shown(kind);
    return fail_at(error, display, build, "image.build: must be 'mmdebstrap' or 'url', got '%s'",
                   s);
}

static gboolean
parse_resources(const Node *node, VmTemplate *t, const char *display, GError **error)
{
    static const char *const keys[] = {
        "cpus",           "memory",          "disk", "disk_read", "disk_write",
        "disk_read_iops", "disk_write_iops", NULL};
    static const char *const limit_keys[VM_DISK_LIMITS] = {
        [VM_DISK_READ_MIB] = "disk_read",
        [VM_DISK_WRITE_MIB] = "disk_write",
        [VM_DISK_READ_IOPS] = "disk_read_iops",
        [VM_DISK_WRITE_IOPS] = "disk_write_iops",
    };
    const Node *value;
    guint64 n;

    if (node->kind != NODE_MAPPING)
        return fail_type(error, display, node, "resources", "a mapping");
    if (!check_keys(node, "resources.", keys, display, error))
        return FALSE;
    if ((value = map_get(node, "cpus")) != NULL) {
        if (!get_uint(value, "resources.cpus", 1, 256, "", &n, display, error))
            return FALSE;
        t->cpus = (guint)n;
    }
    if ((value = map_get(node, "memory")) != NULL) {
        if (!get_uint(value, "resources.memory", 128, 1024 * 1024, "MiB", &n, display, error))
            return FALSE;
        t->memory_mib = (guint)n;
    }
    if ((value = map_get(node, "disk")) != NULL) {
        if (!get_uint(value, "resources.disk", 1, 16384, "GiB", &n, display, error))
            return FALSE;
        t->disk_gib = (guint)n;
    }
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        g_autofree char *key = g_strconcat("resources.", limit_keys[i], NULL);

        if ((value = map_get(node, limit_keys[i])) == NULL)
            continue;
        if (!get_uint(value, key, 0, VM_DISK_LIMIT_MAX,
                      i == VM_DISK_READ_MIB || i == VM_DISK_WRITE_MIB ? "MiB/s" : "", &n, display,
                      error))
            return FALSE;
        t->disk_limits[i] = (guint)n;
        t->disk_limits_set[i] = TRUE;
    }
    return TRUE;
}

static gboolean
scalar_is(const Node *node, const char *word)
{
    return node->kind == NODE_SCALAR && !node->is_null && g_str_equal(node->value, word);
}

static gboolean
parse_checkpoints(const Node *node, VmTemplate *t, const char *display, GError **error)
{
    static const char *const keys[] = {"every", "keep", "hourly", "daily", NULL};
    const Node *value;
    guint64 n;

    if (scalar_is(node, "never")) {
        t->checkpoints_never = TRUE;
        t->checkpoint_every_s = 0;
        t->checkpoint_keep = 0;
        t->checkpoint_hourly = 0;
        t->checkpoint_daily = 0;
        return TRUE;
    }
    if (node->kind != NODE_MAPPING)
        return fail_type(error, display, node, "checkpoints", "a mapping or 'never'");
    if (!check_keys(node, "checkpoints.", keys, display, error))
        return FALSE;
    if ((value = map_get(node, "every")) != NULL &&
        !get_duration(value, "checkpoints.every", &t->checkpoint_every_s, display, error))
        return FALSE;
    if ((value = map_get(node, "keep")) != NULL) {
        if (!get_uint(value, "checkpoints.keep", 1, 1000, "", &n, display, error))
            return FALSE;
        t->checkpoint_keep = (guint)n;
    }
    if ((value = map_get(node, "hourly")) != NULL) {
        if (!get_uint(value, "checkpoints.hourly", 0, 1000, "", &n, display, error))
            return FALSE;
        t->checkpoint_hourly = (guint)n;
    }
    if ((value = map_get(node, "daily")) != NULL) {
        if (!get_uint(value, "checkpoints.daily", 0, 1000, "", &n, display, error))
            return FALSE;
        t->checkpoint_daily = (guint)n;
    }
    return TRUE;
}

static gboolean
parse_idle(const Node *node, VmTemplate *t, const char *display, GError **error)
{
    static const char *const keys[] = {"pause_after", "save_after", NULL};
    const Node *value;

    if (scalar_is(node, "never")) {
        t->idle_never = TRUE;
        t->idle_pause_after_s = 0;
        t->idle_save_after_s = 0;
        return TRUE;
    }
    if (node->kind != NODE_MAPPING)
        return fail_type(error, display, node, "idle", "a mapping or 'never'");
    if (!check_keys(node, "idle.", keys, display, error))
        return FALSE;
    if ((value = map_get(node, "pause_after")) != NULL &&
        !get_duration(value, "idle.pause_after", &t->idle_pause_after_s, display, error))
        return FALSE;
    if ((value = map_get(node, "save_after")) != NULL &&
        !get_duration(value, "idle.save_after", &t->idle_save_after_s, display, error))
        return FALSE;
    /* both count from the moment the agent went idle; saving comes after pausing */
    if (t->idle_pause_after_s != 0 && t->idle_save_after_s != 0 &&
        t->idle_save_after_s < t->idle_pause_after_s)
        return fail_at(error, display, value != NULL ? value : node,
                       "idle.save_after: must not be shorter than idle.pause_after");
    return TRUE;
}

static gboolean
parse_egress(const Node *node, VmTemplate *t, const char *display, GError **error)
{
    static const char *const keys[] = {"allow", "deny", NULL};
    const Node *value;

    if (scalar_is(node, "none"))
        return TRUE;
    if (scalar_is(node, "any")) {
        g_strfreev(t->egress_allow);
        t->egress_allow = g_strdupv((char *[]){"*", NULL});
        return TRUE;
    }
    if (node->kind != NODE_MAPPING)
        return fail_type(error, display, node, "egress", "a mapping, 'none' or 'any'");
    if (!check_keys(node, "egress.", keys, display, error))
        return FALSE;
    if ((value = map_get(node, "allow")) != NULL &&
        !get_string_list(value, "egress.allow", is_egress_rule,
                         "a host, *.domain, address or @preset", &t->egress_allow, display, error))
        return FALSE;
    if ((value = map_get(node, "deny")) != NULL &&
        !get_string_list(value, "egress.deny", is_egress_rule,
                         "a host, *.domain, address or @preset", &t->egress_deny, display, error))
        return FALSE;
    return TRUE;
}

static gboolean
parse_user_data(const Node *node, VmTemplate *t, const char *display, GError **error)
{
    g_auto(Problem) problem = {0};
    g_autoptr(Node) root = NULL;

    if (!get_string(node, "user-data", &t->user_data, display, error))
        return FALSE;
    /* A broken cloud-config would only show up at an agent's first boot, as a guest without a
     * user: catch it here. */
    if (!tree_parse(t->user_data, strlen(t->user_data), USER_DATA_MAX_DEPTH, &root, &problem))
        return fail_at(error, display, node,
                       "user-data: not valid YAML: %s (line %" G_GSIZE_FORMAT
                       ", column %" G_GSIZE_FORMAT " of the block)",
                       problem.message, problem.line, problem.column);
    if (root != NULL && root->kind != NODE_MAPPING)
        return fail_at(error, display, node, "user-data: must be a cloud-config mapping, got %s",
                       node_kind_name(root));
    return TRUE;
}

static gboolean
parse_root(const Node *root, TemplatePrivate *priv, const char *display, GError **error)
{
    static const char *const keys[] = {
        "name",        "description", "image",  "resources", "user", "packages", "user-data",
        "checkpoints", "idle",        "egress", "secrets",   "pool", NULL};
    VmTemplate *t = &priv->pub;
    const Node *value;

    if (root->kind != NODE_MAPPING)
        return fail_type(error, display, root, "template", "a mapping");
    if (!check_keys(root, "", keys, display, error))
        return FALSE;

    if ((value = map_get(root, "name")) == NULL)
        return fail_at(error, display, root, "missing key 'name'");
    if (!get_string(value, "name", &t->name, display, error))
        return FALSE;
    g_autoptr(GError) name_error = NULL;
    if (!vm_name_validate_template(t->name, &name_error))
        return fail_at(error, display, value, "name: %s", name_error->message);
    priv->name_line = value->line;
    priv->name_column = value->column;

    if ((value = map_get(root, "description")) != NULL &&
        !get_string(value, "description", &t->description, display, error))
        return FALSE;

    if ((value = map_get(root, "image")) == NULL)
        return fail_at(error, display, root, "missing key 'image'");
    if (!parse_image(value, t, display, error))
        return FALSE;

    if ((value = map_get(root, "resources")) != NULL && !parse_resources(value, t, display, error))
        return FALSE;

    if ((value = map_get(root, "user")) != NULL) {
        const char *why = NULL;
        if (!get_string(value, "user", &t->user, display, error))
            return FALSE;
        if (!user_validate(t->user, &why)) {
            g_autofree char *s = shown(t->user);
            return fail_at(error, display, value, "user: '%s' %s", s, why);
        }
    }

    if ((value = map_get(root, "packages")) != NULL &&
        !get_string_list(value, "packages", is_package_name, "a Debian package name", &t->packages,
                         display, error))
        return FALSE;

    if ((value = map_get(root, "user-data")) != NULL && !parse_user_data(value, t, display, error))
        return FALSE;
    if ((value = map_get(root, "checkpoints")) != NULL &&
        !parse_checkpoints(value, t, display, error))
        return FALSE;
    if ((value = map_get(root, "idle")) != NULL && !parse_idle(value, t, display, error))
        return FALSE;
    if ((value = map_get(root, "egress")) != NULL && !parse_egress(value, t, display, error))
        return FALSE;
    if ((value = map_get(root, "pool")) != NULL) {
        guint64 n;
        if (!get_uint(value, "pool", 0, VM_TEMPLATE_POOL_MAX, "", &n, display, error))
            return FALSE;
        t->pool = (guint)n;
        t->pool_set = TRUE;
    }
    if ((value = map_get(root, "secrets")) != NULL &&
        !get_string_list(value, "secrets", is_secret_name, "a secret's name", &t->secrets, display,
                         error))
        return FALSE;
    return TRUE;
}

static TemplatePrivate *
template_new_defaults(const char *display)
{
    TemplatePrivate *priv = g_new0(TemplatePrivate, 1);
    VmTemplate *t = &priv->pub;

    t->path = g_strdup(display);
    t->description = g_strdup("");
    t->cpus = DEFAULT_CPUS;
    t->memory_mib = DEFAULT_MEMORY_MIB;
    t->disk_gib = DEFAULT_DISK_GIB;
    t->user = g_strdup(DEFAULT_USER);
    t->packages = g_new0(char *, 1);
    t->checkpoint_every_s = 0;
    t->checkpoint_keep = DEFAULT_CHECKPOINT_KEEP;
    t->checkpoint_hourly = DEFAULT_CHECKPOINT_HOURLY;
    t->checkpoint_daily = DEFAULT_CHECKPOINT_DAILY;
    t->idle_pause_after_s = DEFAULT_IDLE_PAUSE_S;
    t->idle_save_after_s = DEFAULT_IDLE_SAVE_S;
    t->egress_allow = g_new0(char *, 1);
    t->egress_deny = g_new0(char *, 1);
    t->secrets = g_new0(char *, 1);
    return priv;
}

VmTemplate *
vm_template_load_data(const char *data, gsize len, const char *display_name, GError **error)
{
    g_auto(Problem) problem = {0};
    g_autoptr(Node) root = NULL;
    g_autoptr(VmTemplate) template_ = NULL;

    g_return_val_if_fail(data != NULL || len == 0, NULL);
    g_return_val_if_fail(display_name != NULL, NULL);

    if (len > TEMPLATE_MAX_BYTES) {
        vm_throw(error, VM_ERROR_TEMPLATE, "%s: larger than %d KiB", display_name,
                 TEMPLATE_MAX_BYTES / 1024);
        return NULL;
    }
    if (!tree_parse(data != NULL ? data : "", len, TEMPLATE_MAX_DEPTH, &root, &problem)) {
        vm_throw(error, VM_ERROR_TEMPLATE, "%s:%" G_GSIZE_FORMAT ":%" G_GSIZE_FORMAT ": %s",
                 display_name, problem.line, problem.column, problem.message);
        return NULL;
    }
    if (root == NULL) {
        vm_throw(error, VM_ERROR_TEMPLATE, "%s:1:1: template is empty", display_name);
        return NULL;
    }

    TemplatePrivate *priv = template_new_defaults(display_name);
    template_ = &priv->pub;
    if (!parse_root(root, priv, display_name, error))
        return NULL;
    return g_steal_pointer(&template_);
}

/* Reads at most TEMPLATE_MAX_BYTES + 1 bytes, so a huge file (or /dev/zero) costs nothing. */
static gboolean
read_capped(const char *path, char **ret_data, gsize *ret_len, GError **error)
{
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    g_autofree char *data = NULL;
    gsize len = 0;
    struct stat st;

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot open template %s", path);
    if (fstat(fd, &st) < 0)
        return vm_throw_errno(error, errno, "cannot stat template %s", path);
    if (!S_ISREG(st.st_mode))
        return vm_throw(error, VM_ERROR_IO, "template %s is not a regular file", path);

    data = g_malloc(TEMPLATE_MAX_BYTES + 2);
    while (len <= TEMPLATE_MAX_BYTES) {
        ssize_t n = read(fd, data + len, TEMPLATE_MAX_BYTES + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot read template %s", path);
        if (n == 0)
            break;
        len += (gsize)n;
    }
    if (len > TEMPLATE_MAX_BYTES)
        return vm_throw(error, VM_ERROR_TEMPLATE, "%s: larger than %d KiB", path,
                        TEMPLATE_MAX_BYTES / 1024);
    data[len] = '\0';
    *ret_data = g_steal_pointer(&data);
    *ret_len = len;
    return TRUE;
}

VmTemplate *
vm_template_load_file(const char *path, GError **error)
{
    g_autofree char *data = NULL;
    gsize len = 0;

    g_return_val_if_fail(path != NULL, NULL);

    if (!read_capped(path, &data, &len, error))
        return NULL;
    return vm_template_load_data(data, len, path, error);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

GPtrArray *
vm_template_load_dir(const char *dir, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GDir) d = NULL;
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GPtrArray) templates = NULL;
    g_autoptr(GHashTable) by_name = g_hash_table_new(g_str_hash, g_str_equal);
    const char *entry;

    g_return_val_if_fail(dir != NULL, NULL);

    d = g_dir_open(dir, 0, &local_error);
    if (d == NULL) {
        vm_throw(error, VM_ERROR_IO, "cannot read template directory %s: %s", dir,
                 local_error->message);
        return NULL;
    }
    while ((entry = g_dir_read_name(d)) != NULL) {
        /* editors leave hidden files such as ".#x.yaml" lock links next to the real one */
        if (entry[0] != '.' && g_str_has_suffix(entry, ".yaml"))
            g_ptr_array_add(names, g_strdup(entry));
    }
    g_ptr_array_sort(names, compare_names);

    templates = g_ptr_array_new_with_free_func((GDestroyNotify)vm_template_free);
    for (guint i = 0; i < names->len; i++) {
        g_autofree char *path = g_build_filename(dir, g_ptr_array_index(names, i), NULL);
        VmTemplate *t = vm_template_load_file(path, error);
        const VmTemplate *other;

        if (t == NULL)
            return NULL;
        g_ptr_array_add(templates, t);
        other = g_hash_table_lookup(by_name, t->name);
        if (other != NULL) {
            const TemplatePrivate *priv = (const TemplatePrivate *)t;
            vm_throw(error, VM_ERROR_TEMPLATE,
                     "%s:%" G_GSIZE_FORMAT ":%" G_GSIZE_FORMAT ": template '%s' is already "
                     "defined in %s",
                     path, priv->name_line, priv->name_column, t->name, other->path);
            return NULL;
        }
        g_hash_table_insert(by_name, t->name, t);
    }
    return g_steal_pointer(&templates);
}

void
vm_template_free(VmTemplate *template_)
{
    if (template_ == NULL)
        return;
    g_free(template_->name);
    g_free(template_->description);
    g_free(template_->path);
    g_free(template_->suite);
    g_free(template_->mirror);
    g_free(template_->url);
    g_free(template_->sha256);
    g_free(template_->user);
    g_strfreev(template_->packages);
    g_free(template_->user_data);
    g_strfreev(template_->egress_allow);
    g_strfreev(template_->egress_deny);
    g_strfreev(template_->secrets);
    /* allocated as a TemplatePrivate, whose first member this is */
    g_free(template_);
}
