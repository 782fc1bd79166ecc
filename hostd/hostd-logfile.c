/* A bounded log of lines: one current file, one older file, rotation between them. */
#include "hostd-logfile.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-util.h"

/* How often a follower looks for new lines (and for its client having gone). */
#define LOGFILE_FOLLOW_MS 250
/* How often a reader starts over when the log rotates while it reads both files. */
#define LOGFILE_READ_TRIES 3

struct _HostdLogFile {
    GMutex lock; /* appends and rotation */
    char *path;
    char *old_path;
    gint64 max_bytes;
    HostdLogFileFlags flags;
    int fd;      /* -1 until the first append, and after a failure to open */
    gint64 size; /* of the current file: what it had when opened, plus what was appended */
};

/* Closes *@fd if open and marks it closed. */
static void
logfile_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

HostdLogFile *
hostd_logfile_new(const char *path, gint64 max_bytes, HostdLogFileFlags flags)
{
    HostdLogFile *log = g_new0(HostdLogFile, 1);

    g_mutex_init(&log->lock);
    log->path = g_strdup(path);
    log->old_path = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    log->max_bytes = max_bytes;
    log->flags = flags;
    log->fd = -1;
    return log;
}

void
hostd_logfile_free(HostdLogFile *log)
{
    if (log == NULL)
        return;
    if (log->fd >= 0)
        close(log->fd);
    g_mutex_clear(&log->lock);
    g_free(log->path);
    g_free(log->old_path);
    g_free(log);
}

static gboolean
logfile_open_locked(HostdLogFile *log, GError **error)
{
    struct stat st;

    if (log->fd >= 0)
        return TRUE;
    log->fd = open(log->path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (log->fd < 0)
        return vm_throw_errno(error, errno, "cannot open %s", log->path);
    if (fstat(log->fd, &st) < 0) {
        int saved = errno;

        logfile_close(&log->fd);
        return vm_throw_errno(error, saved, "cannot open %s", log->path);
    }
    log->size = st.st_size;
    /* A line cut short (a crash while it was written) must not swallow the next one. Bytes
     * have no lines to keep apart. */
    if (log->size > 0 && !(log->flags & HOSTD_LOGFILE_BYTES)) {
        char last = '\n';

        if (pread(log->fd, &last, 1, log->size - 1) == 1 && last != '\n' &&
            write(log->fd, "\n", 1) == 1)
            log->size++;
    }
    /* A synced line is only durable once the file it is in has its entry on disk too (a new
     * file, or the one a rotation just started). */
    return !(log->flags & HOSTD_LOGFILE_SYNC) || vm_file_sync_dir(log->path, error);
}

static gboolean
logfile_rotate_locked(HostdLogFile *log, GError **error)
{
    logfile_close(&log->fd);
    if (rename(log->path, log->old_path) < 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot rotate %s", log->path);
    return TRUE;
}

/* Appends @len bytes, a whole line, to the open file. */
static gboolean
logfile_write_locked(HostdLogFile *log, const char *line, gsize len, GError **error)
{
    gssize n = write(log->fd, line, len);

    if (n != (gssize)len) {
        int saved = n < 0 ? errno : ENOSPC;

        /* Half a line would glue itself to the next one: take it back. */
        if (n > 0 && ftruncate(log->fd, log->size) < 0)
            logfile_close(&log->fd);
        return vm_throw_errno(error, saved, "cannot append to %s", log->path);
    }
    log->size += n;
    if ((log->flags & HOSTD_LOGFILE_SYNC) && fdatasync(log->fd) < 0)
        return vm_throw_errno(error, errno, "cannot sync %s", log->path);
    return TRUE;
}

gboolean
hostd_logfile_append(HostdLogFile *log, const char *line, GError **error)
{
    gsize len = strlen(line);
    g_autofree char *ended = NULL;
    gboolean ok;

    if (len == 0 || line[len - 1] != '\n') {
        ended = g_strconcat(line, "\n", NULL);
        line = ended;
        len++;
    }
    if ((gint64)len > log->max_bytes)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "a line of %" G_GSIZE_FORMAT " bytes does not fit in %s", len, log->path);

    g_mutex_lock(&log->lock);
    ok = logfile_open_locked(log, error);
    if (ok && log->size > 0 && log->size + (gint64)len > log->max_bytes)
        ok = logfile_rotate_locked(log, error) && logfile_open_locked(log, error);
    if (ok)
        ok = logfile_write_locked(log, line, len, error);
    g_mutex_unlock(&log->lock);
    return ok;
}

gboolean
hostd_logfile_append_bytes(HostdLogFile *log, const char *data, gsize len, GError **error)
{
    gboolean ok;

    g_return_val_if_fail(log->flags & HOSTD_LOGFILE_BYTES, FALSE);
    if ((gint64)len > log->max_bytes) {
        data += len - (gsize)log->max_bytes;
        len = (gsize)log->max_bytes;
    }
    if (len == 0)
        return TRUE;
    g_mutex_lock(&log->lock);
    ok = logfile_open_locked(log, error);
    if (ok && log->size > 0 && log->size + (gint64)len > log->max_bytes)
        ok = logfile_rotate_locked(log, error) && logfile_open_locked(log, error);
    while (ok && len > 0) {
        gssize n = write(log->fd, data, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            ok = vm_throw_errno(error, n < 0 ? errno : ENOSPC, "cannot append to %s", log->path);
            break;
        }
        log->size += n;
        data += n;
        len -= (gsize)n;
    }
    g_mutex_unlock(&log->lock);
    return ok;
}

/* ---------------------------------------------------------------------------------------------
 * Reading */

static gboolean
logfile_matches(const HostdLogFileQuery *query, const char *line, gsize len)
{
    return query->match == NULL || query->match(line, len, query->user_data);
}

/* Appends the whole line @line (@len bytes and its newline) to @out as @query shows it. */
static void
logfile_append_line(const HostdLogFileQuery *query, const char *line, gsize len, GString *out)
{
    if (query->show != NULL)
        query->show(line, len, out, query->user_data);
    else
        g_string_append_len(out, line, (gssize)len + 1);
}

/* Reads @fd from where it is to its end onto @out. */
static void
logfile_read_fd(int fd, GString *out)
{
    char buf[16384];
    gssize n;

    while (fd >= 0 && (n = read(fd, buf, sizeof(buf))) > 0)
        g_string_append_len(out, buf, n);
}

/* The length of @text up to and with its last newline: a line still being written is not a line
 * yet, it comes with the next read. */
static gsize
logfile_whole_lines(const char *text, gsize len)
{
    while (len > 0 && text[len - 1] != '\n')
        len--;
    return len;
}

/* The whole lines of the older file and of the current one, in order, with the current file
 * open in *@ret_fd (-1 when there is none) and read up to *@ret_offset. */
static GString *
logfile_read_all(const char *path, int *ret_fd, gint64 *ret_offset)
{
    g_autofree char *old_path = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    GString *text = g_string_new(NULL);
    vm_autofd fd = -1;
    gsize old_part = 0; /* bytes of @text from the older file */

    for (int tries = 0; tries < LOGFILE_READ_TRIES; tries++) {
        g_autofree char *old = NULL;
        gsize old_len = 0;
        struct stat opened, now;

        g_string_truncate(text, 0);
        logfile_close(&fd);
        /* The current file first: when it moves to the older one while this reads, the older
         * file read below may be this one again, which the check after tells. */
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fstat(fd, &opened) < 0)
            logfile_close(&fd);
        if (g_file_get_contents(old_path, &old, &old_len, NULL))
            g_string_append_len(text, old, (gssize)logfile_whole_lines(old, old_len));
        old_part = text->len;
        logfile_read_fd(fd, text);
        if (fd < 0 ? stat(path, &now) < 0
                   : stat(path, &now) == 0 && now.st_ino == opened.st_ino &&
                         now.st_dev == opened.st_dev)
            break;
    }
    g_string_truncate(text, logfile_whole_lines(text->str, text->len));
    *ret_offset = (gint64)(text->len - old_part);
    if (fd >= 0 && lseek(fd, *ret_offset, SEEK_SET) < 0)
        logfile_close(&fd);
    *ret_fd = g_steal_fd(&fd);
    return text;
}

/* The last query->lines lines of @text (whole lines) that match, in order. Found from the end,
 * so a short tail of a long log matches only as many lines as it needs. */
static GString *
logfile_last_lines(const GString *text, const HostdLogFileQuery *query)
{
    g_autoptr(GArray) found = g_array_new(FALSE, FALSE, sizeof(gsize) * 2);
    GString *out = g_string_new(NULL);
    gsize end = text->len;

    while (end > 0 && found->len < query->lines) {
        gsize start = end - 1;

        while (start > 0 && text->str[start - 1] != '\n')
            start--;
        if (logfile_matches(query, text->str + start, end - 1 - start)) {
            gsize span[2] = {start, end - start};

            g_array_append_val(found, span);
        }
        end = start;
    }
    for (guint i = found->len; i > 0; i--) {
        const gsize *span = &g_array_index(found, gsize, (i - 1) * 2);

        logfile_append_line(query, text->str + span[0], span[1] - 1, out);
    }
    return out;
}

GString *
hostd_logfile_tail(const char *path, const HostdLogFileQuery *query, gint64 *ret_offset)
{
    gint64 offset = 0;
    vm_autofd fd = -1;
    g_autoptr(GString) text = logfile_read_all(path, &fd, &offset);

    if (ret_offset != NULL)
        *ret_offset = offset;
    return logfile_last_lines(text, query);
}

/* Whether the client is still there: it sends nothing after its request, so readable means it
 * closed (or misbehaves, which ends the stream as well). */
static gboolean
logfile_client_gone(int fd, int timeout_ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    return poll(&pfd, 1, timeout_ms) > 0;
}

/* Sends the whole lines at the start of @pending that match, and keeps the rest. */
static gboolean
logfile_send_new(GString *pending, const HostdLogFileQuery *query, VmStreamWriter *reply)
{
    g_autoptr(GString) out = g_string_new(NULL);
    gsize whole = logfile_whole_lines(pending->str, pending->len);
    gsize start = 0;

    while (start < whole) {
        const char *nl = memchr(pending->str + start, '\n', whole - start);
        gsize len = nl - (pending->str + start);

        if (logfile_matches(query, pending->str + start, len))
            logfile_append_line(query, pending->str + start, len, out);
        start += len + 1;
    }
    g_string_erase(pending, 0, (gssize)whole);
    return vm_stream_writer_data(reply, VM_OP_STDOUT, out->str, out->len, NULL);
}

/* Sends what is appended to the log from where @fd_in is on, across rotations, until the
 * client goes away or query->alive says stop. Takes @fd_in (-1: no file yet). */
static void
logfile_follow(const char *path, int fd_in, const HostdLogFileQuery *query, VmStreamWriter *reply)
{
    vm_autofd fd = fd_in;
    g_autoptr(GString) pending = g_string_new(NULL);
    struct stat st;
    ino_t ino = 0;

    if (fd >= 0 && fstat(fd, &st) == 0)
        ino = st.st_ino;
    while (!logfile_client_gone(reply->fd, LOGFILE_FOLLOW_MS)) {
        gboolean rotated;

        if (query->alive != NULL && !query->alive(query->user_data))
            return;
        /* Checked before reading: the lines the old file got until it moved are read from it
         * below, the new file from its start after. */
        rotated = stat(path, &st) == 0 && (fd < 0 || st.st_ino != ino);
        logfile_read_fd(fd, pending);
        if (!logfile_send_new(pending, query, reply))
            return;
        if (rotated) {
            logfile_close(&fd);
            g_string_truncate(pending, 0);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0 && fstat(fd, &st) == 0)
                ino = st.st_ino;
        }
    }
}

void
hostd_logfile_send(const char *path, const HostdLogFileQuery *query, VmStreamWriter *reply)
{
    gint64 offset = 0;
    vm_autofd fd = -1;
    g_autoptr(GString) all = logfile_read_all(path, &fd, &offset);
    g_autoptr(GString) tail = logfile_last_lines(all, query);

    g_string_free(g_steal_pointer(&all), TRUE);
    /* Frames carry whole lines (the writer cuts after a newline), so a reader never sees half
     * a line; a client that went away ends the stream. */
    if (!vm_stream_writer_data(reply, VM_OP_STDOUT, tail->str, tail->len, NULL))
        return;
    if (query->follow)
        logfile_follow(path, g_steal_fd(&fd), query, reply);
    (void)vm_stream_writer_exit(reply, 0, NULL);
}
