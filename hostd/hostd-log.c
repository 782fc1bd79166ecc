#include "hostd-log.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-log-text.h"
#include "vm-util.h"

void
hostd_log_handler(const char *domain, GLogLevelFlags level, const char *message, gpointer fd)
{
    g_autoptr(GDateTime) now = g_date_time_new_now_local();
    g_autofree char *stamp = g_date_time_format(now, "%H:%M:%S");
    g_autofree char *text = vm_log_text(message, -1, HOSTD_LOG_MESSAGE_MAX);
    const char *kind = (level & G_LOG_LEVEL_WARNING)                          ? "warning: "
                       : (level & (G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_ERROR)) ? "error: "
                                                                              : "";
    g_autofree char *line = g_strdup_printf("%s hostd: %s%s\n", stamp, kind, text);

    /* One write: a line is never cut by another thread's (stdio may split one into several). */
    for (gsize done = 0, len = strlen(line); done < len;) {
        gssize n = vm_write_nosignal(GPOINTER_TO_INT(fd), line + done, len - done);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        done += (gsize)n;
    }
}

typedef struct {
    char *who;
    int fd;
} WorkerOutput;

/* Logs one line of a worker's output, unless its budget for this minute is spent. */
static void
worker_output_line(const WorkerOutput *w, const char *line, gsize len, gboolean cut,
                   gint64 *window_start, guint *lines)
{
    gint64 now = g_get_monotonic_time();

    if (now - *window_start >= HOSTD_LOG_WORKER_WINDOW_US) {
        *window_start = now;
        *lines = 0;
    }
    if (++*lines > HOSTD_LOG_WORKER_LINES_MAX) {
        if (*lines == HOSTD_LOG_WORKER_LINES_MAX + 1)
            g_message("%s: more than %d lines in a minute; the rest of the minute's are dropped",
                      w->who, HOSTD_LOG_WORKER_LINES_MAX);
        return;
    }
    g_autofree char *text = vm_log_text(line, (gssize)len, HOSTD_LOG_WORKER_LINE_MAX);
    g_message("%s: %s%s", w->who, text, cut ? "..." : "");
}

static gpointer
worker_output_read(gpointer data)
{
    WorkerOutput *w = data;
    g_autofree char *line = g_malloc(HOSTD_LOG_WORKER_LINE_MAX);
    gsize len = 0;
    gboolean cut = FALSE; /* the line under way passed the cap: the rest of it is dropped */
    gint64 window_start = g_get_monotonic_time();
    guint lines = 0;
    char buf[4096];

    for (;;) {
        gssize n = read(w->fd, buf, sizeof(buf));

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        for (gssize i = 0; i < n; i++) {
            if (buf[i] == '\n') {
                worker_output_line(w, line, len, cut, &window_start, &lines);
                len = 0;
                cut = FALSE;
            } else if (len < HOSTD_LOG_WORKER_LINE_MAX) {
                line[len++] = buf[i];
            } else {
                cut = TRUE;
            }
        }
    }
    if (len > 0 || cut)
        worker_output_line(w, line, len, cut, &window_start, &lines);
    close(w->fd);
    g_free(w->who);
    g_free(w);
    return NULL;
}

int
hostd_log_worker_output(const char *who, GError **error)
{
    int fds[2];
    GError *local_error = NULL;
    GThread *thread;
    WorkerOutput *w;

    if (pipe2(fds, O_CLOEXEC) < 0)
        return vm_throw_errno(error, errno, "cannot make the pipe of %s's output", who), -1;
    w = g_new0(WorkerOutput, 1);
    w->who = g_strdup(who);
    w->fd = fds[0];
    thread = g_thread_try_new("worker-output", worker_output_read, w, &local_error);
    if (thread == NULL) {
        vm_throw(error, VM_ERROR_IO, "cannot read %s's output: %s", who, local_error->message);
        g_error_free(local_error);
        close(fds[0]);
        close(fds[1]);
        g_free(w->who);
        g_free(w);
        return -1;
    }
    g_thread_unref(thread);
    return fds[1];
}
