/* `vmctl exec`: a command in an agent, waking it first when it sleeps. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Runs a command in an agent, relaying its I/O with the client on @client_fd (see
 * hostd_ssh_exec()). A paused or saved agent is woken first, and the command counts as activity
 * for the idle policy while it runs. Fails with VM_ERROR_NOT_FOUND, VM_ERROR_BAD_STATE (not
 * running), or what hostd_ssh_exec() fails with; on failure no EXIT frame was sent. */
gboolean hostd_agent_exec(HostdContext *ctx, const char *name, const HostdExecRequest *request,
                          int client_fd, GError **error);

G_END_DECLS
