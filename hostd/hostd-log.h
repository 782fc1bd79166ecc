/* hostd's own log (stderr: the journal under systemd): one line per message, whoever wrote its
 * text. Guests and workers put text into it (a guest agent's error, a worker's stderr, names a
 * client chose): all of it passes vm_log_text() here, in the one handler every message goes
 * through, so no text can end a line, forge another one or send a terminal escape.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The most of one message's text a line of hostd's log carries (escapes counted); the rest is
 * cut, marked "...". */
#define HOSTD_LOG_MESSAGE_MAX (16 * 1024)

/* The most of one line of a worker's stderr that reaches the log, and how many of its lines do
 * in a minute: a worker a guest took over cannot flood the log (the rest is dropped, once
 * noted). */
#define HOSTD_LOG_WORKER_LINE_MAX  1024
#define HOSTD_LOG_WORKER_LINES_MAX 60
#define HOSTD_LOG_WORKER_WINDOW_US (60 * G_USEC_PER_SEC)

/* A GLogFunc: writes "HH:MM:SS hostd: [warning: |error: ]MESSAGE\n" to the file descriptor
 * GPOINTER_TO_INT(@fd) (hostd passes STDERR_FILENO) in one write(), MESSAGE being @message
 * through vm_log_text() cut to HOSTD_LOG_MESSAGE_MAX. Lines of several threads never mix. Can't
 * fail; a write that fails is lost. */
void hostd_log_handler(const char *domain, GLogLevelFlags level, const char *message, gpointer fd);

/* Makes the pipe a worker's stdout and stderr go to, and returns its write end (O_CLOEXEC: give
 * it to the worker with g_spawn's stdout/stderr fds, then close it). A thread of its own reads
 * the other end until every writer closed it, and logs each line (g_message) as "@who: LINE",
 * LINE cut to HOSTD_LOG_WORKER_LINE_MAX and escaped, at most HOSTD_LOG_WORKER_LINES_MAX lines a
 * minute. -1 with @error (VM_ERROR_IO) when no pipe can be made. */
int hostd_log_worker_output(const char *who, GError **error);

G_END_DECLS
