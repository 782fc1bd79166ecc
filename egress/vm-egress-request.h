/* The request head a guest sends to its egress proxy.
 *
 * Two shapes are accepted: "CONNECT host:port HTTP/1.x" (a tunnel, for TLS) and a plain HTTP
 * request in absolute form ("GET http://host[:port]/path HTTP/1.1"). Origin-form requests are
 * refused: a guest reaches the outside only by addressing the proxy explicitly.
 *
 * The parser is strict where proxies and servers have been known to disagree (request
 * smuggling): no obs-fold, no NUL, no bare CR or LF, no whitespace before a header colon, one
 * Content-Length at most, Transfer-Encoding only as a lone "chunked" and never with
 * Content-Length, a Host header that names the same authority as the request target, no userinfo.
 * Limits: request line 8 KiB, head 32 KiB, 100 header fields.
 *
 * A parsed request keeps its header fields as a list, so a hook can rewrite them before the
 * head is serialised and forwarded.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_EGRESS_REQUEST_LINE_MAX   (8 * 1024)
#define VM_EGRESS_REQUEST_HEAD_MAX   (32 * 1024)
#define VM_EGRESS_REQUEST_FIELDS_MAX 100

typedef enum {
    VM_EGRESS_REQUEST_CONNECT,
    VM_EGRESS_REQUEST_HTTP,
} VmEgressRequestKind;

typedef struct {
    char *name;
    char *value;
} VmEgressHeader;

typedef struct {
    VmEgressRequestKind kind;
    char *method;       /* as sent ("GET", "CONNECT") */
    char *scheme;       /* "http" for VM_EGRESS_REQUEST_HTTP ("https" from an origin parser),
                         * NULL for CONNECT */
    char *host;         /* as sent, IPv6 brackets removed; not yet normalised */
    guint16 port;       /* explicit or the scheme's default */
    char *path;         /* origin-form target ("/x?y"), NULL for CONNECT */
    guint minor;        /* HTTP/1.<minor> */
    GPtrArray *headers; /* of VmEgressHeader, in order; hop-by-hop fields already removed */
    gboolean close;     /* the client asked to close after this request (Connection: close, or
                         * HTTP/1.0 without keep-alive) */
} VmEgressRequest;

typedef enum {
    VM_EGRESS_PARSE_MORE, /* the head is incomplete: feed more */
    VM_EGRESS_PARSE_DONE, /* the head is complete */
    VM_EGRESS_PARSE_ERROR,
} VmEgressParseStatus;

typedef struct _VmEgressParser VmEgressParser;

/* A new incremental parser. Can't fail. */
VmEgressParser *vm_egress_parser_new(void);
void vm_egress_parser_free(VmEgressParser *parser);

/* A parser for the requests inside an intercepted TLS connection to @host:@port (as the CONNECT
 * named them): only origin-form targets ("/path?query", or "*" for OPTIONS), whose Host header
 * must name @host (and @port, 443 when it has none); CONNECT and absolute forms are refused with
 * VM_ERROR_INVALID_ARGUMENT. The request gets kind VM_EGRESS_REQUEST_HTTP, scheme "https", and
 * @host and @port. Same strictness and limits as vm_egress_parser_new(). Can't fail. */
VmEgressParser *vm_egress_parser_new_origin(const char *host, guint16 port);

/* vm_egress_parser_new_origin() for plain HTTP inside a tunnel to @host:@port: scheme "http", so
 * a Host without a port names port 80. */
VmEgressParser *vm_egress_parser_new_http(const char *host, guint16 port);

/* Feeds @len bytes. Returns VM_EGRESS_PARSE_MORE while the head is incomplete,
 * VM_EGRESS_PARSE_DONE once it is complete (then @ret_consumed tells how many of these @len
 * bytes belonged to the head; the rest is body to forward as is), or VM_EGRESS_PARSE_ERROR with
 * VM_ERROR_PROTOCOL (malformed, oversized) or VM_ERROR_INVALID_ARGUMENT (well-formed but refused:
 * origin form, unsupported scheme, mismatching Host). Errors are detected as early as the bytes
 * allow: a bad byte or an over-long line fails without waiting for the end of the head. Feeding
 * after DONE or ERROR is a programming error. */
VmEgressParseStatus vm_egress_parser_feed(VmEgressParser *parser, const guint8 *data, gsize len,
                                          gsize *ret_consumed, GError **error);

/* The request, after vm_egress_parser_feed() returned VM_EGRESS_PARSE_DONE; the caller owns it.
 * NULL before that or if already taken. */
VmEgressRequest *vm_egress_parser_steal_request(VmEgressParser *parser);

/* Parses one complete head (ending with the empty line) from @data; bytes after the head are
 * ignored. A head that does not end within @len fails with VM_ERROR_PROTOCOL ("truncated"). */
VmEgressRequest *vm_egress_request_parse(const guint8 *data, gsize len, GError **error);

void vm_egress_request_free(VmEgressRequest *request);

/* The value of the first header field named @name (case-insensitive), or NULL. */
const char *vm_egress_request_get_header(const VmEgressRequest *request, const char *name);

/* Replaces the value of every field named @name with @value, appending one field when there was
 * none; a NULL @value removes them. For rewrite hooks. Can't fail. */
void vm_egress_request_set_header(VmEgressRequest *request, const char *name, const char *value);

/* The authority as a Host header writes it: "host", "host:port" when the port is not the
 * scheme's default, brackets around an IPv6 literal. Newly allocated; can't fail. */
char *vm_egress_request_dup_authority(const VmEgressRequest *request);

/* The head to send to the destination for a plain HTTP request: origin-form request line, the
 * remaining fields (Host first) and "Connection: close". Only for VM_EGRESS_REQUEST_HTTP. */
GBytes *vm_egress_request_build_head(const VmEgressRequest *request);

/* The head to send to an intercepted connection's destination: the origin-form request line, Host
 * first, the remaining fields, and "Connection: close" when @request->close; keep-alive
 * otherwise. Newly allocated; the caller wipes it once sent (it may hold a credential). */
GString *vm_egress_request_build_origin_head(const VmEgressRequest *request);

/* Where a request's body ends, so that the bytes after it are read as the next request head and
 * checked on their own instead of being relayed. Content-Length counts bytes; chunked is followed
 * chunk by chunk, strictly (hex sizes without signs or spaces, CRLF line ends, chunk lines and
 * trailers bounded like header lines); a request with neither has no body. */
typedef struct _VmEgressBodyFramer VmEgressBodyFramer;

/* The framer of @request's body (a plain HTTP request whose head parsed). Can't fail. */
VmEgressBodyFramer *vm_egress_body_framer_new(const VmEgressRequest *request);
/* A framer of a response body: chunked, or @length bytes (G_MAXUINT64: until the connection
 * closes, which the caller sees itself). Can't fail. */
VmEgressBodyFramer *vm_egress_body_framer_new_response(gboolean chunked, guint64 length);
void vm_egress_body_framer_free(VmEgressBodyFramer *framer);

/* Calls @func with each piece of the body's payload as it is fed: the Content-Length bytes, or
 * the data of each chunk without the chunked framing, so that a reader sees the body as the
 * destination will after decoding it (a string split between chunks is whole there). Can't
 * fail. */
void vm_egress_body_framer_set_payload_func(VmEgressBodyFramer *framer,
                                            void (*func)(const guint8 *data, gsize len,
                                                         gpointer user_data),
                                            gpointer user_data);

/* Feeds @len bytes that follow the head (or earlier body bytes). VM_EGRESS_PARSE_MORE: all of
 * them belong to the body and it goes on; VM_EGRESS_PARSE_DONE: the body ended, after
 * *@ret_consumed of them (the rest is the next request); VM_EGRESS_PARSE_ERROR with
 * VM_ERROR_PROTOCOL for malformed chunked framing. May be called with @len 0 (a request without
 * a body is DONE at once, and so is a framer already DONE). Feeding after ERROR is a programming
 * error. */
VmEgressParseStatus vm_egress_body_framer_feed(VmEgressBodyFramer *framer, const guint8 *data,
                                               gsize len, gsize *ret_consumed, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressParser, vm_egress_parser_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressBodyFramer, vm_egress_body_framer_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressRequest, vm_egress_request_free)

G_END_DECLS
