/* Text from a guest or a worker made fit for one line of hostd's log. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* @text (@len bytes, or up to its NUL when @len is -1; NULL: "") as one printable line: valid
 * UTF-8 characters are kept, every other byte (invalid UTF-8, NUL) becomes "\xNN", and every
 * character that could end a line, move the cursor or reorder what a terminal shows is escaped:
 * "\n", "\r", "\t", "\xNN" for the other C0 controls and DEL (ESC is "\x1b"), "\uNNNN" for the C1
 * controls, U+2028 and U+2029 (line and paragraph separators) and the bidirectional overrides
 * and isolates (U+202A..U+202E, U+2066..U+2069). A backslash stays one: the result is the same
 * when escaped again. When the result would pass @max_bytes it is cut after the last whole
 * character or escape that fits and "..." is appended, so it is at most @max_bytes + 3 bytes.
 * Newly allocated; can't fail. */
char *vm_log_text(const char *text, gssize len, gsize max_bytes);

G_END_DECLS
