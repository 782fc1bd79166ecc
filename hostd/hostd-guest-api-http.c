/* The in-guest API's worker: a request's bytes to its call. */
#include "hostd-guest-api-http.h"

#include <libsoup/soup.h>
#include <string.h>

/* libsoup's own bound on a request head. */
#define HEAD_MAX (64 * 1024)

/* The end of the head in @data: just past its first empty line ("\r\n" or "\n"); 0: none. */
static gsize
head_end(const char *data, gsize len)
{
    for (gsize i = 0; i + 1 < len && i < HEAD_MAX; i++) {
        if (data[i] != '\n')
            continue;
        if (data[i + 1] == '\n')
            return i + 2;
        if (i + 2 < len && data[i + 1] == '\r' && data[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

/* Decodes the chunks in @data into @body (at most HOSTD_GUEST_API_BODY_MAX kept, the rest
 * counted in *@ret_total). FALSE for framing that is not chunks or is cut short. */
static gboolean
read_chunks(const char *data, gsize len, GByteArray *body, gsize *ret_total)
{
    gsize off = 0;

    *ret_total = 0;
    for (;;) {
        const char *eol = memchr(data + off, '\n', len - off);
        g_autofree char *line = NULL;
        char *end = NULL;
        guint64 size;

        if (eol == NULL)
            return FALSE;
        line = g_strndup(data + off, (gsize)(eol - (data + off)));
        size = g_ascii_strtoull(line, &end, 16);
        if (end == line || size > HOSTD_GUEST_API_DISCARD_MAX)
            return FALSE;
        off = (gsize)(eol - data) + 1;
        if (size == 0)
            return TRUE;
        if (len - off < size + 1)
            return FALSE;
        if (*ret_total + size <= HOSTD_GUEST_API_BODY_MAX)
            g_byte_array_append(body, (const guint8 *)data + off, (guint)size);
        *ret_total += size;
        if (*ret_total > HOSTD_GUEST_API_DISCARD_MAX)
            return FALSE;
        off += size;
        if (data[off] == '\r')
            off++;
        if (off >= len || data[off] != '\n')
            return FALSE;
        off++;
    }
}

/* The path a handler of SoupServer gets for @target: made absolute with the Host header (or the
 * server's address for HTTP/1.0), dot segments removed by GUri, percent-decoded; NULL where the
 * server answers 400. */
static char *
request_path(SoupMessageHeaders *headers, const char *target, SoupHTTPVersion version)
{
    const char *host = soup_message_headers_get_one(headers, "Host");
    g_autofree char *url = NULL;
    g_autoptr(GUri) uri = NULL;
    char *path;

    if (target[0] != '/')
        url = g_strdup(target);
    else if (host != NULL)
        url = g_strdup_printf("http://%s%s", host, target);
    else if (version == SOUP_HTTP_1_0)
        url = g_strdup_printf("http://10.0.2.100%s", target);
    else
        return NULL;
    uri = g_uri_parse(url, SOUP_HTTP_URI_FLAGS, NULL);
    if (uri == NULL || g_strcmp0(g_uri_get_scheme(uri), "http") != 0)
        return NULL;
    path = g_uri_unescape_string(g_uri_get_path(uri), NULL);
    if (path != NULL && (strstr(path, "/../") != NULL || g_str_has_suffix(path, "/.."))) {
        g_free(path);
        return NULL;
    }
    return path;
}

gboolean
hostd_guest_api_request_parse(const char *data, gsize len, HostdGuestApiCall *ret,
                              guint *ret_status)
{
    g_autoptr(SoupMessageHeaders) headers = soup_message_headers_new(SOUP_MESSAGE_HEADERS_REQUEST);
    g_autoptr(GByteArray) body = g_byte_array_new();
    g_autofree char *method = NULL;
    g_autofree char *target = NULL;
    g_autofree char *path = NULL;
    SoupHTTPVersion version;
    gsize head = head_end(data, len), total = 0;
    guint status;

    *ret_status = 400;
    if (head == 0)
        return FALSE;
    status = soup_headers_parse_request(data, (int)head, headers, &method, &target, &version);
    if (!SOUP_STATUS_IS_SUCCESSFUL(status))
        return FALSE;
    switch (soup_message_headers_get_encoding(headers)) {
    case SOUP_ENCODING_CONTENT_LENGTH: {
        goffset announced = soup_message_headers_get_content_length(headers);

        if (announced > HOSTD_GUEST_API_DISCARD_MAX || (gsize)announced > len - head) {
            *ret_status = 0;
            return FALSE;
        }
        total = (gsize)announced;
        if (total <= HOSTD_GUEST_API_BODY_MAX)
            g_byte_array_append(body, (const guint8 *)data + head, (guint)total);
        break;
    }
    case SOUP_ENCODING_CHUNKED:
        if (!read_chunks(data + head, len - head, body, &total))
            return FALSE;
        break;
    case SOUP_ENCODING_NONE:
    case SOUP_ENCODING_EOF:
    case SOUP_ENCODING_UNRECOGNIZED:
    case SOUP_ENCODING_BYTERANGES:
    default:
        break;
    }
    path = request_path(headers, target, version);
    if (path == NULL)
        return FALSE;
    hostd_guest_api_call_read(method, path, (const char *)body->data, body->len,
                              total > HOSTD_GUEST_API_BODY_MAX, ret);
    return TRUE;
}
