/* Telling the service manager that started hostd how it is doing (sd_notify(3)): systemd's
 * Type=notify waits for READY=1 before it calls hostd started, so a vmctl ordered after
 * hostd.service never races a starting hostd. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Sends @state (one "KEY=VALUE" line such as "READY=1" or "STOPPING=1", or NULL) and @status
 * (free text for `systemctl status`, newlines turned into spaces, or NULL) to the service
 * manager at $NOTIFY_SOCKET. Without $NOTIFY_SOCKET, when no service manager waits for hostd,
 * it sends nothing and succeeds. Fails with VM_ERROR_IO when the message cannot be sent. */
gboolean hostd_notify(const char *state, const char *status, GError **error);

G_END_DECLS
