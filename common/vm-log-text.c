#include "vm-log-text.h"

#include <string.h>

/* Whether @c, a valid character, is shown as an escape rather than as itself. */
static gboolean
log_text_escaped(gunichar c)
{
    return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 ||
           (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

char *
vm_log_text(const char *text, gssize len, gsize max_bytes)
{
    const char *p = text != NULL ? text : "";
    gsize n = len < 0 ? strlen(p) : (gsize)len;
    const char *end = p + n;
    GString *out = g_string_sized_new(MIN(n, max_bytes) + 4);

    while (p < end) {
        char piece[16];
        gsize piece_len;
        gunichar c = g_utf8_get_char_validated(p, (gssize)(end - p));
        gsize char_len = 1;

        if (c == (gunichar)-1 || c == (gunichar)-2) {
            piece_len = (gsize)g_snprintf(piece, sizeof(piece), "\\x%02x", (guchar)*p);
        } else {
            char_len = (gsize)(g_utf8_next_char(p) - p);
            if (c == '\n')
                piece_len = (gsize)g_snprintf(piece, sizeof(piece), "\\n");
            else if (c == '\r')
                piece_len = (gsize)g_snprintf(piece, sizeof(piece), "\\r");
            else if (c == '\t')
                piece_len = (gsize)g_snprintf(piece, sizeof(piece), "\\t");
            else if (c < 0x80 && log_text_escaped(c))
                piece_len = (gsize)g_snprintf(piece, sizeof(piece), "\\x%02x", c);
            else if (log_text_escaped(c))
                piece_len = (gsize)g_snprintf(piece, sizeof(piece), "\\u%04x", c);
            else
                piece_len = 0;
        }
        if (out->len + (piece_len > 0 ? piece_len : char_len) > max_bytes) {
            g_string_append(out, "...");
            break;
        }
        if (piece_len > 0)
            g_string_append_len(out, piece, (gssize)piece_len);
        else
            g_string_append_len(out, p, (gssize)char_len);
        p += char_len;
    }
    return g_string_free(out, FALSE);
}
