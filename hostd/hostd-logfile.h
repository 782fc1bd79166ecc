/* A bounded log of lines (JSON lines in practice; or of bytes, HOSTD_LOGFILE_BYTES, for a guest's
 * console) in one file plus one older file: appends of
 * whole lines, rotation to PATH.1 once the file would grow past its bound, and the reading
 * requests make of it (the last N lines across both files, then new lines as they come, across
 * rotations). hostd keeps each agent's egress log and its event log this way. A leaf: it knows
 * files and lines, not what they say.
 */
#pragma once

#include <glib.h>

#include "vm-stream.h"

G_BEGIN_DECLS

/* The suffix of the one older file kept: egress.log -> egress.log.1. */
#define HOSTD_LOGFILE_OLD_SUFFIX ".1"

typedef struct _HostdLogFile HostdLogFile;

typedef enum {
    HOSTD_LOGFILE_NONE = 0,
    HOSTD_LOGFILE_SYNC = 1 << 0,  /* each append is on disk (fdatasync) before it returns */
    HOSTD_LOGFILE_BYTES = 1 << 1, /* bytes, not lines: hostd_logfile_append_bytes() only */
} HostdLogFileFlags;

/* The log at @path (the older file at @path + HOSTD_LOGFILE_OLD_SUFFIX), rotated once an append
 * would take it past @max_bytes, so both files together never hold more than 2 * @max_bytes.
 * The file is opened (created 0600) on the first append. Can't fail. */
HostdLogFile *hostd_logfile_new(const char *path, gint64 max_bytes, HostdLogFileFlags flags);
void hostd_logfile_free(HostdLogFile *log);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdLogFile, hostd_logfile_free)

/* Appends @line (ended by a newline here when it has none) in one write, after rotating when it
 * would not fit; with HOSTD_LOGFILE_SYNC it is on disk when this returns. Safe from any thread:
 * appends never interleave, and a write cut short is taken back, so the file only ever holds
 * whole lines. A line longer than the bound fails with VM_ERROR_INVALID_ARGUMENT; a file that
 * cannot be opened, written or synced with VM_ERROR_IO (the line is lost, the next append tries
 * again). */
gboolean hostd_logfile_append(HostdLogFile *log, const char *line, GError **error);

/* Appends @len bytes of @data as they are (any bytes, no line structure: a log made with
 * HOSTD_LOGFILE_BYTES, such as a guest's console), rotating first when they would take the file
 * past its bound; more than the bound keeps only the last bound's worth. A write cut short keeps
 * what was written. Safe from any thread. Fails with VM_ERROR_IO (what was not written is
 * lost; the next append tries again). */
gboolean hostd_logfile_append_bytes(HostdLogFile *log, const char *data, gsize len, GError **error);

/* Which lines a reader wants: @line is one line without its newline, @len bytes, not
 * NUL-terminated. */
typedef gboolean (*HostdLogFileMatch)(const char *line, gsize len, gpointer user_data);

/* Appends line @line (@len bytes, without its newline) to @out as the reader is to get it, its
 * newline included (a guest's console: escaped). */
typedef void (*HostdLogFileFormat)(const char *line, gsize len, GString *out, gpointer user_data);

/* Whether a follower goes on (checked about four times a second). */
typedef gboolean (*HostdLogFileAlive)(gpointer user_data);

typedef struct {
    guint lines;             /* the last this many matching lines first; G_MAXUINT32: all */
    gboolean follow;         /* then new matching lines as they are appended */
    HostdLogFileMatch match; /* NULL: every line */
    HostdLogFileAlive alive; /* NULL: follow until the client goes away */
    HostdLogFileFormat show; /* NULL: each line as it is in the file */
    gpointer user_data;      /* for @match, @alive and @show */
} HostdLogFileQuery;

/* The last @query->lines lines @query->match accepts of the older and the current file at @path,
 * in order, each ending in a newline ("" when there are none); a line still being written is
 * left out. In @ret_offset (may be NULL) how many bytes of the current file were read, where a
 * follower goes on from. Missing files are empty. Newly allocated; can't fail. */
GString *hostd_logfile_tail(const char *path, const HostdLogFileQuery *query, gint64 *ret_offset);

/* Answers a request for the log at @path on @reply: hostd_logfile_tail() as STDOUT frames of whole
 * lines, then with @query->follow the matching lines appended from then on (across rotations),
 * until the client closes its end or @query->alive says stop; then EXIT {status 0}. A client
 * that goes away ends the stream early, which is no failure: can't fail. */
void hostd_logfile_send(const char *path, const HostdLogFileQuery *query, VmStreamWriter *reply);

G_END_DECLS
