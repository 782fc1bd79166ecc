/* Fuzz target for the intercepted request path: the input is what a guest sends inside an
 * intercepted TLS connection to api.test. Its head goes through the origin parser (whole and in
 * pieces, with the same outcome), then the grants are applied: either the request is refused
 * with a "leak: placeholder of NAME ..." reason, or the head that would go up holds no
 * placeholder of any grant and the substituted grant is one of the set. The bytes after the head
 * go through the body scanner whole, a byte at a time and in pieces of 13: each finds a
 * placeholder exactly when one is in them; and through the request's body framer, whose payload
 * (chunked framing taken off) is the same however the bytes come, and scanned as such. The
 * same bytes, as a hostile response body (chunked, and by Content-Length), go through the
 * response redactor in pieces of 1, 13 and whole: what comes out is as long as what went in,
 * holds no real value, and neither does its payload once the guest decodes its chunks. */
#include <glib.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vm-egress-credential.h"
#include "vm-error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const placeholders[] = {
    "vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", /* api: Bearer on api.test */
    "vmph_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB", /* key: X-Api-Key on *.api.test */
    "vmph_CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC", /* basic: Basic on api.test */
    "vmph_DDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDDD", /* other: Bearer on other.test */
};

static VmEgressCredentials *
make_creds(void)
{
    VmEgressCredentials *creds = vm_egress_credentials_new();
    const char *api[] = {"api.test", NULL};
    const char *sub[] = {"*.api.test", "api.test", NULL};
    const char *other[] = {"other.test", NULL};

    if (!vm_egress_credentials_add(creds, "api", placeholders[0], "sk-real", api, NULL, "Bearer {}",
                                   NULL) ||
        !vm_egress_credentials_add(creds, "key", placeholders[1], "key-real", sub, "X-Api-Key",
                                   NULL, NULL) ||
        !vm_egress_credentials_add(creds, "basic", placeholders[2], "pass-real", api, NULL,
                                   "Basic {}", NULL) ||
        !vm_egress_credentials_add(creds, "other", placeholders[3], "other-real", other, NULL,
                                   "Bearer {}", NULL))
        abort();
    return creds;
}

static gboolean
has_placeholder(const guint8 *data, gsize len)
{
    /* An empty GByteArray's data is NULL, which memmem() must not get. */
    if (len == 0)
        return FALSE;
    for (gsize i = 0; i < G_N_ELEMENTS(placeholders); i++)
        if (memmem(data, len, placeholders[i], strlen(placeholders[i])) != NULL)
            return TRUE;
    return FALSE;
}

/* Whether the scanner finds a placeholder in @len bytes fed in pieces of @step. */
static gboolean
scan(VmEgressCredentials *creds, const guint8 *data, gsize len, gsize step)
{
    g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);

    for (gsize off = 0; off < len; off += step) {
        g_autoptr(GError) error = NULL;

        if (!vm_egress_leak_scanner_feed(scanner, data + off, MIN(step, len - off), &error)) {
            if (!g_str_has_prefix(error->message, "leak: placeholder of ") ||
                !g_str_has_suffix(error->message, " in body"))
                abort();
            return TRUE;
        }
    }
    return FALSE;
}

typedef struct {
    GByteArray *payload;
    VmEgressLeakScanner *scanner;
    gboolean found;
} Payload;

static void
payload_piece(const guint8 *data, gsize len, gpointer user_data)
{
    Payload *p = user_data;

    g_byte_array_append(p->payload, data, len);
    if (!vm_egress_leak_scanner_feed(p->scanner, data, len, NULL))
        p->found = TRUE;
}

/* The body's payload as the framer hands it out, fed in pieces of @step: the same bytes whatever
 * the pieces, and the scanner finds a placeholder in it exactly when one is there. */
static GByteArray *
frame_payload(VmEgressCredentials *creds, const VmEgressRequest *request, const guint8 *data,
              gsize len, gsize step)
{
    g_autoptr(VmEgressBodyFramer) framer = vm_egress_body_framer_new(request);
    g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);
    Payload p = {g_byte_array_new(), scanner, FALSE};

    vm_egress_body_framer_set_payload_func(framer, payload_piece, &p);
    for (gsize off = 0; off < len; off += step) {
        gsize consumed = 0;
        VmEgressParseStatus status =
            vm_egress_body_framer_feed(framer, data + off, MIN(step, len - off), &consumed, NULL);

        if (status != VM_EGRESS_PARSE_MORE)
            break;
    }
    if (p.found != has_placeholder(p.payload->data, p.payload->len))
        abort();
    return p.payload;
}

static void
check_apply(VmEgressCredentials *creds, VmEgressRequest *request)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *secret = NULL;

    if (!vm_egress_credentials_apply(creds, request, "api.test", NULL, &secret, &error)) {
        if (error == NULL || !g_str_has_prefix(error->message, "leak: placeholder of ") ||
            secret != NULL)
            abort();
        return;
    }
    g_autoptr(GString) head = vm_egress_request_build_origin_head(request);

    /* what goes up holds no placeholder, and ends at its one empty line */
    if (has_placeholder((const guint8 *)head->str, head->len))
        abort();
    if (head->len < 4 || strcmp(head->str + head->len - 4, "\r\n\r\n") != 0 ||
        strstr(head->str, "\r\n\r\n") != head->str + head->len - 4)
        abort();
    if (secret != NULL && strcmp(secret, "api") != 0 && strcmp(secret, "key") != 0 &&
        strcmp(secret, "basic") != 0)
        abort();
}

static const char *const values[] = {"sk-real", "key-real", "pass-real", "other-real"};

/* The payload of @len chunked bytes, as the guest's client decodes them. */
static GByteArray *
decode_chunked(const guint8 *data, gsize len)
{
    g_autoptr(VmEgressBodyFramer) framer = vm_egress_body_framer_new_response(TRUE, 0);
    g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(NULL);
    Payload p = {g_byte_array_new(), scanner, FALSE};

    vm_egress_body_framer_set_payload_func(framer, payload_piece, &p);
    (void)vm_egress_body_framer_feed(framer, data, len, NULL, NULL);
    return p.payload;
}

static gboolean
has_value(const guint8 *data, gsize len)
{
    if (len == 0)
        return FALSE;
    for (gsize i = 0; i < G_N_ELEMENTS(values); i++)
        if (memmem(data, len, values[i], strlen(values[i])) != NULL)
            return TRUE;
    return FALSE;
}

typedef struct {
    const guint8 *data;
    gsize len;
} Segment;

static void
segment_add(const guint8 *data, gsize len, gpointer user_data)
{
    Segment seg = {data, len};

    g_array_append_val((GArray *)user_data, seg);
}

/* The @len bytes at @data as a response body (chunked, or of @len bytes), through a redactor in
 * pieces of @step, as the intercepted connection relays it: what the guest would get. */
static GByteArray *
redact_response(const guint8 *data, gsize len, gsize step, gboolean chunked)
{
    g_autoptr(VmEgressRedactor) redactor = vm_egress_redactor_new();
    g_autoptr(VmEgressBodyFramer) framer = vm_egress_body_framer_new_response(chunked, len);
    g_autoptr(GArray) segments = g_array_new(FALSE, FALSE, sizeof(Segment));
    GByteArray *out = g_byte_array_new();
    gboolean done = FALSE;
    const guint8 *given;
    gsize given_len;

    for (gsize i = 0; i < G_N_ELEMENTS(values); i++)
        vm_egress_redactor_add(redactor, values[i], values[i], placeholders[i]);
    vm_egress_body_framer_set_payload_func(framer, segment_add, segments);
    for (gsize off = 0; off < len && !done; off += step) {
        gsize n = MIN(step, len - off);
        gsize consumed = n;
        gsize at = off;

        g_array_set_size(segments, 0);
        switch (vm_egress_body_framer_feed(framer, data + off, n, &consumed, NULL)) {
        case VM_EGRESS_PARSE_MORE:
            consumed = n;
            break;
        case VM_EGRESS_PARSE_DONE:
            done = TRUE;
            break;
        case VM_EGRESS_PARSE_ERROR:
        default:
            return out; /* the relay stops: what was held never goes */
        }
        for (guint i = 0; i < segments->len; i++) {
            const Segment *seg = &g_array_index(segments, Segment, i);

            vm_egress_redactor_feed(redactor, data + at, (gsize)(seg->data - (data + at)), FALSE);
            vm_egress_redactor_feed(redactor, seg->data, seg->len, TRUE);
            at = (gsize)(seg->data - data) + seg->len;
        }
        vm_egress_redactor_feed(redactor, data + at, off + consumed - at, FALSE);
        if (!vm_egress_redactor_take(redactor, done, &given, &given_len, NULL))
            return out;
        g_byte_array_append(out, given, given_len);
        if (done && out->len != off + consumed)
            abort(); /* same length: the framing stays true */
    }
    if (!done && vm_egress_redactor_take(redactor, TRUE, &given, &given_len, NULL))
        g_byte_array_append(out, given, given_len);
    return out;
}

static void
check_response(const guint8 *data, gsize len)
{
    const gsize steps[] = {1, 13, G_MAXSIZE};

    for (gsize i = 0; i < G_N_ELEMENTS(steps); i++) {
        g_autoptr(GByteArray) plain = redact_response(data, len, steps[i], FALSE);
        g_autoptr(GByteArray) chunked = redact_response(data, len, steps[i], TRUE);
        g_autoptr(GByteArray) decoded = decode_chunked(chunked->data, chunked->len);

        if (plain->len != len || has_value(plain->data, plain->len) ||
            has_value(chunked->data, chunked->len) || has_value(decoded->data, decoded->len))
            abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(VmEgressCredentials) creds = make_creds();
    g_autoptr(VmEgressParser) whole = vm_egress_parser_new_origin("api.test", 443);
    g_autoptr(VmEgressParser) pieces = vm_egress_parser_new_origin("api.test", 443);
    g_autoptr(VmEgressRequest) request = NULL;
    g_autoptr(GError) error = NULL;
    VmEgressParseStatus status, piece_status = VM_EGRESS_PARSE_MORE;
    gsize consumed = 0, offset = 0, piece_consumed = 0;

    status = vm_egress_parser_feed(whole, data, size, &consumed, &error);
    while (offset < size && piece_status == VM_EGRESS_PARSE_MORE) {
        g_autoptr(GError) piece_error = NULL;
        gsize n = MIN(size - offset, 5);

        piece_status =
            vm_egress_parser_feed(pieces, data + offset, n, &piece_consumed, &piece_error);
        if (piece_status == VM_EGRESS_PARSE_DONE)
            piece_consumed += offset;
        offset += n;
    }
    if (status != piece_status || (status == VM_EGRESS_PARSE_DONE && consumed != piece_consumed))
        abort();
    if (status == VM_EGRESS_PARSE_ERROR && !g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL) &&
        !g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT))
        abort();
    if (status != VM_EGRESS_PARSE_DONE) {
        consumed = 0; /* the whole input as a body, to exercise the scanner anyway */
    } else {
        request = vm_egress_parser_steal_request(whole);
        if (request == NULL || g_strcmp0(request->scheme, "https") != 0 || request->path == NULL)
            abort();
        check_apply(creds, request);
        g_autoptr(GByteArray) whole_payload =
            frame_payload(creds, request, data + consumed, size - consumed, G_MAXSIZE);
        g_autoptr(GByteArray) piece_payload =
            frame_payload(creds, request, data + consumed, size - consumed, 1);
        if (whole_payload->len != piece_payload->len ||
            (whole_payload->len > 0 &&
             memcmp(whole_payload->data, piece_payload->data, whole_payload->len) != 0))
            abort();
    }

    gboolean expected = has_placeholder(data + consumed, size - consumed);
    if (scan(creds, data + consumed, size - consumed, G_MAXSIZE) != expected ||
        scan(creds, data + consumed, size - consumed, 1) != expected ||
        scan(creds, data + consumed, size - consumed, 13) != expected)
        abort();
    check_response(data + consumed, size - consumed);
    return 0;
}
