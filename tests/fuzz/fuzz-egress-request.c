/* Fuzz target for the egress proxy's request parser: the input is what a guest sends on a new
 * proxy connection. Any input either fails with VM_ERROR_PROTOCOL or VM_ERROR_INVALID_ARGUMENT,
 * or yields a request that respects the documented shape; feeding the same bytes in small pieces
 * gives the same outcome, so a slow sender cannot change the proxy's decision. The bytes after a
 * plain HTTP request's head go through its body framer, whole and a byte at a time, with the same
 * outcome: where the next request starts does not depend on how the bytes arrive. */
#include <glib.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vm-egress-request.h"
#include "vm-error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_request(const VmEgressRequest *request)
{
    if (request->host == NULL || *request->host == '\0' || request->port == 0 ||
        request->method == NULL || request->minor > 1)
        abort();
    if (request->kind == VM_EGRESS_REQUEST_HTTP) {
        g_autoptr(GBytes) head = vm_egress_request_build_head(request);
        gsize len = 0;
        const char *text = g_bytes_get_data(head, &len);

        if (request->path == NULL || request->path[0] != '/' ||
            g_strcmp0(request->scheme, "http") != 0)
            abort();
        /* The forwarded head is one request: it ends at its first empty line. */
        if (len < 4 || memcmp(text + len - 4, "\r\n\r\n", 4) != 0 ||
            g_strstr_len(text, len, "\r\n\r\n") != text + len - 4)
            abort();
    } else if (request->kind != VM_EGRESS_REQUEST_CONNECT || request->path != NULL) {
        abort();
    }
    for (guint i = 0; i < request->headers->len; i++) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        if (strpbrk(header->name, "\r\n: ") != NULL || strpbrk(header->value, "\r\n") != NULL)
            abort();
        if (g_ascii_strcasecmp(header->name, "proxy-authorization") == 0 ||
            g_ascii_strcasecmp(header->name, "connection") == 0)
            abort();
    }
}

/* Frames @len bytes of @request's body in pieces of @step; returns the bytes the body took, -1
 * on error, -2 when incomplete. */
static gssize
frame_body(const VmEgressRequest *request, const uint8_t *data, size_t len, size_t step)
{
    g_autoptr(VmEgressBodyFramer) framer = vm_egress_body_framer_new(request);
    size_t off = 0;

    do {
        g_autoptr(GError) error = NULL;
        size_t n = MIN(step, len - off), consumed = 0;

        switch (vm_egress_body_framer_feed(framer, data + off, n, &consumed, &error)) {
        case VM_EGRESS_PARSE_DONE:
            if (consumed > n || error != NULL)
                abort();
            return (gssize)(off + consumed);
        case VM_EGRESS_PARSE_ERROR:
            if (!g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
                abort();
            return -1;
        case VM_EGRESS_PARSE_MORE:
        default:
            off += n;
        }
    } while (off < len);
    return -2;
}

static void
check_body(const uint8_t *data, size_t size)
{
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new();
    g_autoptr(VmEgressRequest) request = NULL;
    gsize consumed = 0;

    if (vm_egress_parser_feed(parser, data, size, &consumed, NULL) != VM_EGRESS_PARSE_DONE)
        return;
    request = vm_egress_parser_steal_request(parser);
    if (request->kind != VM_EGRESS_REQUEST_HTTP)
        return;
    if (frame_body(request, data + consumed, size - consumed, G_MAXSIZE) !=
        frame_body(request, data + consumed, size - consumed, 1))
        abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressRequest) request = vm_egress_request_parse(data, size, &error);
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new();
    VmEgressParseStatus status = VM_EGRESS_PARSE_MORE;
    gsize offset = 0;

    if (request == NULL) {
        if (error == NULL || (!g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL) &&
                              !g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT)))
            abort();
    } else {
        if (error != NULL)
            abort();
        check_request(request);
    }

    while (offset < size && status == VM_EGRESS_PARSE_MORE) {
        g_autoptr(GError) piece_error = NULL;
        gsize n = MIN(size - offset, 7), consumed = 0;

        status = vm_egress_parser_feed(parser, data + offset, n, &consumed, &piece_error);
        if ((status == VM_EGRESS_PARSE_ERROR) != (piece_error != NULL))
            abort();
        if (status == VM_EGRESS_PARSE_DONE && consumed > n)
            abort();
        offset += n;
    }
    if ((status == VM_EGRESS_PARSE_DONE) != (request != NULL))
        abort();
    check_body(data, size);
    return 0;
}
