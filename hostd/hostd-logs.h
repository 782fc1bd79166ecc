/* `vmctl logs`: what an agent's guest printed, as the user may see it. The serial console comes
 * from the log hostd keeps of it (hostd-console.h); cloud-init's output from the guest's
 * /var/log/cloud-init-output.log, read over SSH. Both are guest-written bytes: each line is
 * escaped (vm_log_text()) before it leaves hostd, so that no client's terminal runs a sequence a
 * guest wrote, and bounded. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* The longest line sent, escaped, before it is cut ("..." after). */
#define HOSTD_LOGS_LINE_MAX 4096

/* The most of the end of cloud-init's log read from the guest. */
#define HOSTD_LOGS_CLOUD_INIT_MAX (1024 * 1024)

/* Where cloud-init writes its output in the guest. */
#define HOSTD_LOGS_CLOUD_INIT_PATH "/var/log/cloud-init-output.log"

/* Appends line @line (@len bytes, no newline; trailing carriage returns dropped) to @out escaped
 * by vm_log_text() and cut at HOSTD_LOGS_LINE_MAX, then a newline. Can't fail. */
void hostd_logs_escape_line(const char *line, gsize len, GString *out);

/* The last @lines lines of @text (@len bytes; G_MAXUINT32: all), each escaped as
 * hostd_logs_escape_line() does; a last line without its newline counts. Newly allocated; can't
 * fail. */
GString *hostd_logs_escape_tail(const char *text, gsize len, guint lines);

/* Answers agent-logs for @name on @client_fd: the last @lines lines of its console (G_MAXUINT32:
 * all hostd keeps), then with @follow the new ones until the client goes or the agent is
 * removed; with @cloud_init, the last @lines lines of cloud-init's output in the guest instead
 * (the agent must be running). Writes the stream and its EXIT itself. Fails before the stream
 * with VM_ERROR_NOT_FOUND, VM_ERROR_INVALID_ARGUMENT (@follow with @cloud_init),
 * VM_ERROR_BAD_STATE (cloud-init of an agent not running), VM_ERROR_SSH or VM_ERROR_FAILED (the
 * guest could not give its log). */
gboolean hostd_agent_logs(HostdContext *ctx, const char *name, gboolean follow, guint lines,
                          gboolean cloud_init, int client_fd, GError **error);

G_END_DECLS
