/* `vmctl mcp`: a Model Context Protocol server (revision 2025-06-18) over stdio, a client of
 * hostd. The JSON-RPC layer is vmctl-mcp-rpc.h, the tools vmctl-mcp-tools.h; this is the
 * session between them: initialize and the version it settles on, ping, tools/list, tools/call
 * (on a worker thread each, with progress notifications when the call asked for them),
 * notifications/cancelled. docs/MCP.md describes it for users.
 */
#pragma once

#include "vmctl-client.h"

#include <glib.h>

G_BEGIN_DECLS

#define VMCTL_MCP_PROTOCOL_VERSION "2025-06-18"

typedef struct {
    const VmctlEndpoint *endpoint; /* hostd */
    const char *const *agents;     /* --agent: the agents served; NULL: all */
    gboolean read_only;            /* --read-only: only the tools that change nothing */
    const char *copy_dir; /* --copy-dir, resolved: copy_to/from_agent's host tree; NULL: none */
} VmctlMcpOptions;

/* Serves MCP on the messages read from @in_fd, answering on @out_fd, until the end of @in_fd
 * (then the calls in flight finish and are answered) or until @out_fd stops taking what is
 * written (then they are cancelled). Writes nothing else to @out_fd. Fails with VM_ERROR_IO when
 * reading @in_fd fails. */
gboolean vmctl_mcp_serve(const VmctlMcpOptions *options, int in_fd, int out_fd, GError **error);

G_END_DECLS
