/* Request head parser of the egress proxy: incremental line scanning with early errors, then one
 * strict pass over the complete head. */
#include "vm-egress-request.h"
#include "vm-error.h"

#include <string.h>

struct _VmEgressParser {
    GByteArray *head;
    gsize line_start; /* offset in head of the line being scanned */
    guint lines;      /* complete lines so far, request line included */
    gboolean in_method;
    gboolean finished;
    VmEgressRequest *request;
    char *origin_host; /* non-NULL: origin-form requests of an intercepted connection */
    guint16 origin_port;
    const char *origin_scheme; /* "https", or "http" inside a tunnel (vm_egress_parser_new_http) */
};

/* Fields that describe one hop, not the request: never forwarded. */
static const char *const hop_by_hop[] = {
    "connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate",
    "te",         "trailer",          "upgrade",
};

static void
header_free(gpointer data)
{
    VmEgressHeader *header = data;

    g_free(header->name);
    /* a credential may have been substituted into it */
    explicit_bzero(header->value, strlen(header->value));
    g_free(header->value);
    g_free(header);
}

void
vm_egress_request_free(VmEgressRequest *request)
{
    if (request == NULL)
        return;
    g_free(request->method);
    g_free(request->scheme);
    g_free(request->host);
    g_free(request->path);
    g_ptr_array_unref(request->headers);
    g_free(request);
}

VmEgressParser *
vm_egress_parser_new(void)
{
    VmEgressParser *parser = g_new0(VmEgressParser, 1);

    parser->head = g_byte_array_new();
    parser->in_method = TRUE;
    return parser;
}

VmEgressParser *
vm_egress_parser_new_origin(const char *host, guint16 port)
{
    VmEgressParser *parser = vm_egress_parser_new();

    parser->origin_host = g_strdup(host);
    parser->origin_port = port;
    parser->origin_scheme = "https";
    return parser;
}

VmEgressParser *
vm_egress_parser_new_http(const char *host, guint16 port)
{
    VmEgressParser *parser = vm_egress_parser_new_origin(host, port);

    parser->origin_scheme = "http";
    return parser;
}

void
vm_egress_parser_free(VmEgressParser *parser)
{
    if (parser == NULL)
        return;
    g_free(parser->origin_host);
    g_byte_array_unref(parser->head);
    vm_egress_request_free(parser->request);
    g_free(parser);
}

VmEgressRequest *
vm_egress_parser_steal_request(VmEgressParser *parser)
{
    return g_steal_pointer(&parser->request);
}

static gboolean
is_tchar(char c)
{
    return g_ascii_isalnum(c) || (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static gboolean
is_token(const char *s)
{
    if (*s == '\0')
        return FALSE;
    for (; *s != '\0'; s++)
        if (!is_tchar(*s))
            return FALSE;
    return TRUE;
}

static gboolean
parse_port(const char *text, guint16 *ret_port)
{
    guint64 port;

    if (*text == '\0' || strlen(text) > 5)
        return FALSE;
    for (const char *p = text; *p != '\0'; p++)
        if (!g_ascii_isdigit(*p))
            return FALSE;
    port = g_ascii_strtoull(text, NULL, 10);
    if (port == 0 || port > 65535)
        return FALSE;
    *ret_port = (guint16)port;
    return TRUE;
}

/* Splits "host[:port]" or "[v6][:port]". A missing port is 0. */
static gboolean
parse_authority(const char *text, char **ret_host, guint16 *ret_port, GError **error)
{
    g_autofree char *host = NULL;
    const char *port_text = NULL;
    guint16 port = 0;

    if (strchr(text, '@') != NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "userinfo in the request target is refused");
    if (text[0] == '[') {
        const char *end = strchr(text, ']');

        if (end == NULL)
            return vm_throw(error, VM_ERROR_PROTOCOL, "unterminated IPv6 literal '%s'", text);
        host = g_strndup(text + 1, end - text - 1);
        for (const char *p = host; *p != '\0'; p++)
            if (!g_ascii_isxdigit(*p) && *p != ':' && *p != '.')
                return vm_throw(error, VM_ERROR_PROTOCOL,
                                "IPv6 literal '%s' has invalid characters (zone ids are refused)",
                                host);
        if (strchr(host, ':') == NULL)
            return vm_throw(error, VM_ERROR_PROTOCOL, "'[%s]' is not an IPv6 literal", host);
        if (end[1] == ':')
            port_text = end + 2;
        else if (end[1] != '\0')
            return vm_throw(error, VM_ERROR_PROTOCOL, "junk after IPv6 literal in '%s'", text);
    } else {
        const char *colon = strchr(text, ':');

        host = colon != NULL ? g_strndup(text, colon - text) : g_strdup(text);
        if (colon != NULL)
            port_text = colon + 1;
        for (const char *p = host; *p != '\0'; p++)
            if (!g_ascii_isalnum(*p) && *p != '-' && *p != '.' && *p != '_')
                return vm_throw(error, VM_ERROR_PROTOCOL, "invalid character in host '%s'", text);
    }
    if (*host == '\0')
        return vm_throw(error, VM_ERROR_PROTOCOL, "empty host in '%s'", text);
    if (port_text != NULL && !parse_port(port_text, &port))
        return vm_throw(error, VM_ERROR_PROTOCOL, "bad port in '%s'", text);
    *ret_host = g_steal_pointer(&host);
    *ret_port = port;
    return TRUE;
}

static gboolean
parse_origin_target(VmEgressRequest *request, const char *target, const VmEgressParser *parser,
                    GError **error)
{
    if (strcmp(request->method, "CONNECT") == 0 || !(target[0] == '/' || strcmp(target, "*") == 0))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "only origin-form requests inside an intercepted connection");
    if (strchr(target, '#') != NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "fragment in the request target");
    request->kind = VM_EGRESS_REQUEST_HTTP;
    request->scheme = g_strdup(parser->origin_scheme);
    request->host = g_strdup(parser->origin_host);
    request->port = parser->origin_port;
    request->path = g_strdup(target);
    return TRUE;
}

static gboolean
parse_target(VmEgressRequest *request, const char *target, const VmEgressParser *parser,
             GError **error)
{
    const char *rest;
    const char *path;
    g_autofree char *authority = NULL;

    for (const char *p = target; *p != '\0'; p++)
        if ((guchar)*p <= 0x20 || (guchar)*p >= 0x7f)
            return vm_throw(error, VM_ERROR_PROTOCOL, "invalid byte in the request target");
    if (parser->origin_host != NULL)
        return parse_origin_target(request, target, parser, error);
    if (strcmp(request->method, "CONNECT") == 0) {
        request->kind = VM_EGRESS_REQUEST_CONNECT;
        if (!parse_authority(target, &request->host, &request->port, error))
            return FALSE;
        if (request->port == 0)
            return vm_throw(error, VM_ERROR_PROTOCOL, "CONNECT target '%s' has no port", target);
        return TRUE;
    }
    if (target[0] == '/' || strcmp(target, "*") == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "origin-form request '%s': address the proxy with an absolute URL", target);
    if (g_ascii_strncasecmp(target, "https://", 8) == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "https URLs must use CONNECT");
    if (g_ascii_strncasecmp(target, "http://", 7) != 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "only http URLs and CONNECT");
    if (strchr(target, '#') != NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "fragment in the request target");
    request->kind = VM_EGRESS_REQUEST_HTTP;
    request->scheme = g_strdup("http");
    rest = target + 7;
    path = rest + strcspn(rest, "/?");
    authority = g_strndup(rest, path - rest);
    if (!parse_authority(authority, &request->host, &request->port, error))
        return FALSE;
    if (request->port == 0)
        request->port = 80;
    if (*path == '\0')
        request->path = g_strdup("/");
    else if (*path == '?')
        request->path = g_strconcat("/", path, NULL);
    else
        request->path = g_strdup(path);
    return TRUE;
}

static gboolean
parse_request_line(VmEgressRequest *request, const char *line, const VmEgressParser *parser,
                   GError **error)
{
    g_auto(GStrv) parts = g_strsplit(line, " ", 0);

    if (g_strv_length(parts) != 3)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "request line must be 'METHOD TARGET HTTP/1.x' with single spaces");
    if (!is_token(parts[0]))
        return vm_throw(error, VM_ERROR_PROTOCOL, "bad method");
    if (strcmp(parts[2], "HTTP/1.1") == 0)
        request->minor = 1;
    else if (strcmp(parts[2], "HTTP/1.0") == 0)
        request->minor = 0;
    else
        return vm_throw(error, VM_ERROR_PROTOCOL, "only HTTP/1.0 and HTTP/1.1");
    request->method = g_strdup(parts[0]);
    return parse_target(request, parts[1], parser, error);
}

static gboolean
parse_field(VmEgressRequest *request, const char *line, GError **error)
{
    const char *colon = strchr(line, ':');
    const char *value;
    const char *end;
    VmEgressHeader *header;

    if (colon == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "header line without ':'");
    for (const char *p = line; p < colon; p++)
        if (!is_tchar(*p))
            return vm_throw(error, VM_ERROR_PROTOCOL, "bad header name (space before ':'?)");
    if (colon == line)
        return vm_throw(error, VM_ERROR_PROTOCOL, "empty header name");
    value = colon + 1;
    while (*value == ' ' || *value == '\t')
        value++;
    end = value + strlen(value);
    while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    for (const char *p = value; p < end; p++)
        if (((guchar)*p < 0x20 && *p != '\t') || (guchar)*p == 0x7f)
            return vm_throw(error, VM_ERROR_PROTOCOL, "control character in a header value");
    header = g_new0(VmEgressHeader, 1);
    header->name = g_strndup(line, colon - line);
    header->value = g_strndup(value, end - value);
    g_ptr_array_add(request->headers, header);
    return TRUE;
}

static guint
count_headers(const VmEgressRequest *request, const char *name, const VmEgressHeader **ret_first)
{
    guint n = 0;

    for (guint i = 0; i < request->headers->len; i++) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        if (g_ascii_strcasecmp(header->name, name) == 0) {
            if (n == 0 && ret_first != NULL)
                *ret_first = header;
            n++;
        }
    }
    return n;
}

static gboolean
check_framing(const VmEgressRequest *request, GError **error)
{
    const VmEgressHeader *cl = NULL, *te = NULL;
    guint n_cl = count_headers(request, "content-length", &cl);
    guint n_te = count_headers(request, "transfer-encoding", &te);

    if (n_cl > 1)
        return vm_throw(error, VM_ERROR_PROTOCOL, "more than one Content-Length");
    if (n_te > 1)
        return vm_throw(error, VM_ERROR_PROTOCOL, "more than one Transfer-Encoding");
    if (n_cl == 1 && n_te == 1)
        return vm_throw(error, VM_ERROR_PROTOCOL, "both Content-Length and Transfer-Encoding");
    if (cl != NULL) {
        if (*cl->value == '\0' || strlen(cl->value) > 15)
            return vm_throw(error, VM_ERROR_PROTOCOL, "bad Content-Length");
        for (const char *p = cl->value; *p != '\0'; p++)
            if (!g_ascii_isdigit(*p))
                return vm_throw(error, VM_ERROR_PROTOCOL, "bad Content-Length");
    }
    if (te != NULL) {
        if (g_ascii_strcasecmp(te->value, "chunked") != 0)
            return vm_throw(error, VM_ERROR_PROTOCOL,
                            "Transfer-Encoding other than a lone 'chunked'");
        if (request->minor == 0)
            return vm_throw(error, VM_ERROR_PROTOCOL, "Transfer-Encoding in HTTP/1.0");
    }
    if (request->kind == VM_EGRESS_REQUEST_CONNECT &&
        (te != NULL || (cl != NULL && strcmp(cl->value, "0") != 0)))
        return vm_throw(error, VM_ERROR_PROTOCOL, "CONNECT with a body");
    return TRUE;
}

static gboolean
check_host(const VmEgressRequest *request, GError **error)
{
    const VmEgressHeader *host_header = NULL;
    g_autofree char *host = NULL;
    guint16 port = 0;
    guint n = count_headers(request, "host", &host_header);

    if (n > 1)
        return vm_throw(error, VM_ERROR_PROTOCOL, "more than one Host");
    if (n == 0) {
        if (request->kind == VM_EGRESS_REQUEST_HTTP && request->minor == 1)
            return vm_throw(error, VM_ERROR_PROTOCOL, "HTTP/1.1 request without Host");
        return TRUE;
    }
    if (!parse_authority(host_header->value, &host, &port, error)) {
        g_prefix_error(error, "Host header: ");
        return FALSE;
    }
    if (port == 0)
        port = request->kind != VM_EGRESS_REQUEST_HTTP    ? request->port
               : g_strcmp0(request->scheme, "https") == 0 ? 443
                                                          : 80;
    if (g_ascii_strcasecmp(host, request->host) != 0 || port != request->port)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "Host '%s' does not match the request target", host_header->value);
    return TRUE;
}

static gboolean
strip_hop_by_hop(VmEgressRequest *request, GError **error)
{
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    gboolean keep_alive = FALSE;

    request->close = FALSE;
    for (gsize i = 0; i < G_N_ELEMENTS(hop_by_hop); i++)
        g_ptr_array_add(names, g_strdup(hop_by_hop[i]));
    for (guint i = 0; i < request->headers->len; i++) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);
        g_auto(GStrv) listed = NULL;

        if (g_ascii_strcasecmp(header->name, "connection") != 0)
            continue;
        listed = g_strsplit(header->value, ",", 0);
        for (char **it = listed; *it != NULL; it++) {
            g_autofree char *name = g_ascii_strdown(g_strstrip(*it), -1);

            if (*name == '\0')
                continue;
            if (strcmp(name, "close") == 0)
                request->close = TRUE;
            if (strcmp(name, "keep-alive") == 0)
                keep_alive = TRUE;
            if (strcmp(name, "host") == 0 || strcmp(name, "content-length") == 0 ||
                strcmp(name, "transfer-encoding") == 0)
                return vm_throw(error, VM_ERROR_PROTOCOL, "Connection names '%s'", name);
            g_ptr_array_add(names, g_steal_pointer(&name));
        }
    }
    if (request->minor == 0 && !keep_alive)
        request->close = TRUE;
    for (guint i = 0; i < request->headers->len;) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);
        gboolean drop = FALSE;

        for (guint j = 0; j < names->len && !drop; j++)
            drop = g_ascii_strcasecmp(header->name, g_ptr_array_index(names, j)) == 0;
        if (drop)
            g_ptr_array_remove_index(request->headers, i);
        else
            i++;
    }
    return TRUE;
}

/* Parses a complete head: lines separated by CRLF, already checked for NUL, bare CR/LF, obs-fold
 * and the size limits; @len excludes the final empty line's CRLF. */
static VmEgressRequest *
parse_head(const char *head, gsize len, const VmEgressParser *parser, GError **error)
{
    g_autoptr(VmEgressRequest) request = g_new0(VmEgressRequest, 1);
    g_autofree char *text = g_strndup(head, len);
    g_auto(GStrv) lines = NULL;

    request->headers = g_ptr_array_new_with_free_func(header_free);
    lines = g_strsplit(text, "\r\n", 0);
    if (lines[0] == NULL || !parse_request_line(request, lines[0], parser, error))
        return NULL;
    for (char **line = lines + 1; *line != NULL; line++)
        if (**line != '\0' && !parse_field(request, *line, error))
            return NULL;
    if (!check_framing(request, error) || !check_host(request, error) ||
        !strip_hop_by_hop(request, error))
        return NULL;
    return g_steal_pointer(&request);
}

VmEgressParseStatus
vm_egress_parser_feed(VmEgressParser *parser, const guint8 *data, gsize len, gsize *ret_consumed,
                      GError **error)
{
    g_return_val_if_fail(!parser->finished, VM_EGRESS_PARSE_ERROR);

    for (gsize i = 0; i < len; i++) {
        gsize pos = parser->head->len;
        guint8 c = data[i];
        guint8 prev = pos > 0 ? parser->head->data[pos - 1] : 0;

        g_byte_array_append(parser->head, &c, 1);
        parser->finished = TRUE;
        if (c == '\0')
            return vm_throw(error, VM_ERROR_PROTOCOL, "NUL byte in the request head"),
                   VM_EGRESS_PARSE_ERROR;
        if (prev == '\r' && c != '\n')
            return vm_throw(error, VM_ERROR_PROTOCOL, "bare CR in the request head"),
                   VM_EGRESS_PARSE_ERROR;
        if (c == '\n' && prev != '\r')
            return vm_throw(error, VM_ERROR_PROTOCOL, "bare LF in the request head"),
                   VM_EGRESS_PARSE_ERROR;
        if (pos + 1 > VM_EGRESS_REQUEST_HEAD_MAX)
            return vm_throw(error, VM_ERROR_PROTOCOL, "request head longer than %d bytes",
                            VM_EGRESS_REQUEST_HEAD_MAX),
                   VM_EGRESS_PARSE_ERROR;
        if (parser->lines == 0 && pos + 1 > VM_EGRESS_REQUEST_LINE_MAX + 2)
            return vm_throw(error, VM_ERROR_PROTOCOL, "request line longer than %d bytes",
                            VM_EGRESS_REQUEST_LINE_MAX),
                   VM_EGRESS_PARSE_ERROR;
        if (pos == parser->line_start && parser->lines > 0 && (c == ' ' || c == '\t'))
            return vm_throw(error, VM_ERROR_PROTOCOL,
                            "header line starting with whitespace (obs-fold)"),
                   VM_EGRESS_PARSE_ERROR;
        /* What is not an HTTP request (a TLS ClientHello, an SSH banner) fails at its first
         * byte instead of waiting for a line end that may never come. */
        if (parser->in_method && c == ' ' && pos > 0)
            parser->in_method = FALSE;
        else if (parser->in_method && !is_tchar((char)c))
            return vm_throw(error, VM_ERROR_PROTOCOL, "not an HTTP request"), VM_EGRESS_PARSE_ERROR;
        parser->finished = FALSE;
        if (c != '\n')
            continue;

        if (pos + 1 - parser->line_start == 2) {
            g_autoptr(GError) local = NULL;

            parser->finished = TRUE;
            if (parser->lines == 0)
                return vm_throw(error, VM_ERROR_PROTOCOL, "empty request line"),
                       VM_EGRESS_PARSE_ERROR;
            parser->request = parse_head((const char *)parser->head->data, parser->line_start - 2,
                                         parser, &local);
            if (parser->request == NULL) {
                g_propagate_error(error, g_steal_pointer(&local));
                return VM_EGRESS_PARSE_ERROR;
            }
            if (ret_consumed != NULL)
                *ret_consumed = i + 1;
            return VM_EGRESS_PARSE_DONE;
        }
        parser->lines++;
        parser->line_start = pos + 1;
        if (parser->lines > VM_EGRESS_REQUEST_FIELDS_MAX + 1) {
            parser->finished = TRUE;
            return vm_throw(error, VM_ERROR_PROTOCOL, "more than %d header fields",
                            VM_EGRESS_REQUEST_FIELDS_MAX),
                   VM_EGRESS_PARSE_ERROR;
        }
    }
    return VM_EGRESS_PARSE_MORE;
}

VmEgressRequest *
vm_egress_request_parse(const guint8 *data, gsize len, GError **error)
{
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new();

    switch (vm_egress_parser_feed(parser, data, len, NULL, error)) {
    case VM_EGRESS_PARSE_DONE:
        return vm_egress_parser_steal_request(parser);
    case VM_EGRESS_PARSE_MORE:
        vm_throw(error, VM_ERROR_PROTOCOL, "truncated request head");
        return NULL;
    case VM_EGRESS_PARSE_ERROR:
    default:
        return NULL;
    }
}

const char *
vm_egress_request_get_header(const VmEgressRequest *request, const char *name)
{
    const VmEgressHeader *header = NULL;

    return count_headers(request, name, &header) > 0 ? header->value : NULL;
}

void
vm_egress_request_set_header(VmEgressRequest *request, const char *name, const char *value)
{
    gboolean found = FALSE;

    for (guint i = 0; i < request->headers->len;) {
        VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        if (g_ascii_strcasecmp(header->name, name) != 0) {
            i++;
        } else if (value == NULL) {
            g_ptr_array_remove_index(request->headers, i);
        } else {
            g_free(header->value);
            header->value = g_strdup(value);
            found = TRUE;
            i++;
        }
    }
    if (!found && value != NULL) {
        VmEgressHeader *header = g_new0(VmEgressHeader, 1);

        header->name = g_strdup(name);
        header->value = g_strdup(value);
        g_ptr_array_add(request->headers, header);
    }
}

char *
vm_egress_request_dup_authority(const VmEgressRequest *request)
{
    gboolean v6 = strchr(request->host, ':') != NULL;
    gboolean https = g_strcmp0(request->scheme, "https") == 0;
    gboolean default_port =
        request->kind == VM_EGRESS_REQUEST_HTTP && request->port == (https ? 443 : 80);

    if (default_port)
        return v6 ? g_strdup_printf("[%s]", request->host) : g_strdup(request->host);
    return g_strdup_printf(v6 ? "[%s]:%u" : "%s:%u", request->host, request->port);
}

/* The request line in origin form, Host first, then every field but Host, as the proxy sends
 * them upstream; the caller ends the head. */
static GString *
request_origin_lines(const VmEgressRequest *request, gsize reserve)
{
    GString *out = g_string_sized_new(reserve);
    g_autofree char *authority = vm_egress_request_dup_authority(request);

    g_string_append_printf(out, "%s %s HTTP/1.%u\r\nHost: %s\r\n", request->method, request->path,
                           request->minor, authority);
    for (guint i = 0; i < request->headers->len; i++) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        if (g_ascii_strcasecmp(header->name, "host") != 0)
            g_string_append_printf(out, "%s: %s\r\n", header->name, header->value);
    }
    return out;
}

GBytes *
vm_egress_request_build_head(const VmEgressRequest *request)
{
    g_return_val_if_fail(request->kind == VM_EGRESS_REQUEST_HTTP, NULL);

    GString *out = request_origin_lines(request, 0);
    g_string_append(out, "Connection: close\r\n\r\n");
    return g_string_free_to_bytes(out);
}

GString *
vm_egress_request_build_origin_head(const VmEgressRequest *request)
{
    GString *out = request_origin_lines(request, 1024);
    g_string_append(out, request->close ? "Connection: close\r\n\r\n" : "\r\n");
    return out;
}

/* ---------------------------------------------------------------------------------------------
 * Body framing */

typedef enum {
    BODY_LENGTH,     /* Content-Length: @left bytes to go */
    BODY_CHUNK_SIZE, /* reading a chunk-size line */
    BODY_CHUNK_DATA, /* @left bytes of chunk data to go */
    BODY_CHUNK_CRLF, /* the CRLF after chunk data; @left bytes of it to go */
    BODY_TRAILER,    /* trailer fields after the last chunk, up to the empty line */
    BODY_DONE,
    BODY_FAILED,
} BodyState;

#define CHUNK_LINE_MAX VM_EGRESS_REQUEST_LINE_MAX
#define CHUNK_SIZE_MAX 15 /* hex digits: under 2^60 */
#define TRAILER_MAX    VM_EGRESS_REQUEST_HEAD_MAX

struct _VmEgressBodyFramer {
    BodyState state;
    guint64 left;
    GByteArray *line; /* the chunk-size or trailer line being read */
    gsize trailer_len;
    void (*payload)(const guint8 *data, gsize len, gpointer user_data);
    gpointer payload_data;
};

void
vm_egress_body_framer_set_payload_func(VmEgressBodyFramer *framer,
                                       void (*func)(const guint8 *data, gsize len,
                                                    gpointer user_data),
                                       gpointer user_data)
{
    framer->payload = func;
    framer->payload_data = user_data;
}

VmEgressBodyFramer *
vm_egress_body_framer_new(const VmEgressRequest *request)
{
    VmEgressBodyFramer *framer = g_new0(VmEgressBodyFramer, 1);
    const char *te = vm_egress_request_get_header(request, "transfer-encoding");
    const char *cl = vm_egress_request_get_header(request, "content-length");

    framer->line = g_byte_array_new();
    /* the parser admitted only a lone "chunked" and a plain decimal Content-Length */
    if (te != NULL) {
        framer->state = BODY_CHUNK_SIZE;
    } else if (cl != NULL) {
        framer->left = g_ascii_strtoull(cl, NULL, 10);
        framer->state = framer->left > 0 ? BODY_LENGTH : BODY_DONE;
    } else {
        framer->state = BODY_DONE;
    }
    return framer;
}

VmEgressBodyFramer *
vm_egress_body_framer_new_response(gboolean chunked, guint64 length)
{
    VmEgressBodyFramer *framer = g_new0(VmEgressBodyFramer, 1);

    framer->line = g_byte_array_new();
    framer->state = chunked ? BODY_CHUNK_SIZE : length > 0 ? BODY_LENGTH : BODY_DONE;
    framer->left = chunked ? 0 : length;
    return framer;
}

void
vm_egress_body_framer_free(VmEgressBodyFramer *framer)
{
    if (framer == NULL)
        return;
    g_byte_array_unref(framer->line);
    g_free(framer);
}

/* A chunk-size line without its CRLF: hex digits, then nothing or ";" and a chunk extension of
 * visible characters, spaces and tabs. */
static gboolean
chunk_size_parse(const GByteArray *line, guint64 *ret_size)
{
    gsize digits = 0;
    guint64 size = 0;

    while (digits < line->len && g_ascii_isxdigit(line->data[digits])) {
        size = size << 4 | (guint64)g_ascii_xdigit_value(line->data[digits]);
        digits++;
    }
    if (digits == 0 || digits > CHUNK_SIZE_MAX)
        return FALSE;
    if (digits < line->len) {
        if (line->data[digits] != ';')
            return FALSE;
        for (gsize i = digits + 1; i < line->len; i++)
            if ((line->data[i] < 0x20 && line->data[i] != '\t') || line->data[i] >= 0x7f)
                return FALSE;
    }
    *ret_size = size;
    return TRUE;
}

/* Takes one byte of a line (chunk size or trailer): TRUE with *@ret_end once its LF came. */
static gboolean
body_line_byte(VmEgressBodyFramer *framer, guint8 c, gboolean *ret_end, GError **error)
{
    gsize len = framer->line->len;
    guint8 prev = len > 0 ? framer->line->data[len - 1] : 0;

    *ret_end = FALSE;
    if (c == '\0')
        return vm_throw(error, VM_ERROR_PROTOCOL, "NUL byte in chunked framing");
    if (prev == '\r' && c != '\n')
        return vm_throw(error, VM_ERROR_PROTOCOL, "bare CR in chunked framing");
    if (c == '\n' && prev != '\r')
        return vm_throw(error, VM_ERROR_PROTOCOL, "bare LF in chunked framing");
    if (c == '\n') {
        g_byte_array_set_size(framer->line, len - 1);
        *ret_end = TRUE;
        return TRUE;
    }
    if (len >= CHUNK_LINE_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL, "chunk line longer than %d bytes",
                        CHUNK_LINE_MAX);
    g_byte_array_append(framer->line, &c, 1);
    return TRUE;
}

static gboolean
body_line_end(VmEgressBodyFramer *framer, GError **error)
{
    GByteArray *line = framer->line;

    if (framer->state == BODY_CHUNK_SIZE) {
        guint64 size;

        if (!chunk_size_parse(line, &size))
            return vm_throw(error, VM_ERROR_PROTOCOL, "bad chunk size line");
        framer->left = size;
        framer->state = size > 0 ? BODY_CHUNK_DATA : BODY_TRAILER;
    } else if (line->len == 0) {
        framer->state = BODY_DONE;
    } else {
        /* a trailer field: a header line, no obs-fold */
        if (line->data[0] == ' ' || line->data[0] == '\t')
            return vm_throw(error, VM_ERROR_PROTOCOL, "obs-fold in a trailer");
        if (memchr(line->data, ':', line->len) == NULL)
            return vm_throw(error, VM_ERROR_PROTOCOL, "trailer line without ':'");
        for (gsize i = 0; i < line->len && line->data[i] != ':'; i++)
            if (!is_tchar((char)line->data[i]))
                return vm_throw(error, VM_ERROR_PROTOCOL, "bad trailer field name");
    }
    g_byte_array_set_size(line, 0);
    return TRUE;
}

VmEgressParseStatus
vm_egress_body_framer_feed(VmEgressBodyFramer *framer, const guint8 *data, gsize len,
                           gsize *ret_consumed, GError **error)
{
    gsize i = 0;

    g_return_val_if_fail(framer->state != BODY_FAILED, VM_EGRESS_PARSE_ERROR);

    while (framer->state != BODY_DONE && i < len) {
        gsize take;
        gboolean end = FALSE;

        switch (framer->state) {
        case BODY_LENGTH:
        case BODY_CHUNK_DATA:
            take = (gsize)MIN((guint64)(len - i), framer->left);
            if (framer->payload != NULL && take > 0)
                framer->payload(data + i, take, framer->payload_data);
            framer->left -= take;
            i += take;
            if (framer->left == 0) {
                if (framer->state == BODY_LENGTH) {
                    framer->state = BODY_DONE;
                } else {
                    framer->state = BODY_CHUNK_CRLF;
                    framer->left = 2;
                }
            }
            break;
        case BODY_CHUNK_CRLF:
            if (data[i] != (framer->left == 2 ? '\r' : '\n')) {
                framer->state = BODY_FAILED;
                vm_throw(error, VM_ERROR_PROTOCOL, "chunk data not followed by CRLF");
                return VM_EGRESS_PARSE_ERROR;
            }
            i++;
            if (--framer->left == 0)
                framer->state = BODY_CHUNK_SIZE;
            break;
        case BODY_CHUNK_SIZE:
        case BODY_TRAILER:
            if (framer->state == BODY_TRAILER && ++framer->trailer_len > TRAILER_MAX) {
                framer->state = BODY_FAILED;
                vm_throw(error, VM_ERROR_PROTOCOL, "trailer longer than %d bytes", TRAILER_MAX);
                return VM_EGRESS_PARSE_ERROR;
            }
            if (!body_line_byte(framer, data[i], &end, error) ||
                (end && !body_line_end(framer, error))) {
                framer->state = BODY_FAILED;
                return VM_EGRESS_PARSE_ERROR;
            }
            i++;
            break;
        case BODY_DONE:
        case BODY_FAILED:
        default:
            g_assert_not_reached();
        }
    }
    if (framer->state != BODY_DONE)
        return VM_EGRESS_PARSE_MORE;
    if (ret_consumed != NULL)
        *ret_consumed = i;
    return VM_EGRESS_PARSE_DONE;
}
