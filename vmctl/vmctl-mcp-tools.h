/* The tools `vmctl mcp` offers: one table, each tool with its arguments (from which both its
 * inputSchema and the check of a call's arguments come), its outputSchema, hints, and the
 * function that runs it as a client of hostd.
 *
 * A tool's structured result is the result of its hostd request as `vmctl --json` prints it
 * whole (the protocol's field names: docs/PROTOCOL.md, "Objects in results"); exec, read_file
 * and write_file have results of their own (docs/MCP.md). A failure is a tool error, not a
 * protocol one: its text is `vmctl --json`'s error object, {"error": {"code": "not-found",
 * "message": "..."}}, the code named as vmctl(1) names its exit statuses.
 */
#pragma once

#include "vm-progress.h"
#include "vmctl-client.h"

#include <gio/gio.h>
#include <json-glib/json-glib.h>

G_BEGIN_DECLS

/* exec's bounds: bytes of stdout and of stderr kept, and seconds a command may run. */
#define VMCTL_MCP_OUTPUT_DEFAULT  (256 * 1024)
#define VMCTL_MCP_OUTPUT_MAX      (4 * 1024 * 1024)
#define VMCTL_MCP_TIMEOUT_DEFAULT 300
#define VMCTL_MCP_TIMEOUT_MAX     86400
/* read_file's bound on the bytes returned. */
#define VMCTL_MCP_READ_DEFAULT (1024 * 1024)
#define VMCTL_MCP_READ_MAX     (4 * 1024 * 1024)

typedef struct VmctlMcpTool VmctlMcpTool;

/* What every tool call runs with. */
typedef struct {
    const VmctlEndpoint *endpoint;
    const char *const *agents; /* the agents served (--agent); NULL: all */
    const char *copy_dir;      /* --copy-dir, resolved: the host tree copies use; NULL: none */
    GCancellable *cancellable; /* the client's cancel; may be NULL */
    VmProgressFunc progress;   /* hostd's PROGRESS; may be NULL */
    gpointer progress_data;
} VmctlMcpContext;

/* The tool named @name among those offered (with @read_only, only the tools that change
 * nothing; without @host_files, none of those that copy host files), or NULL. */
const VmctlMcpTool *vmctl_mcp_tool_find(const char *name, gboolean read_only, gboolean host_files);

/* The tools offered (as vmctl_mcp_tool_find() chooses them), as the "tools" array of
 * tools/list's result: name, title, description, inputSchema, outputSchema, annotations. With
 * @agents (NULL-terminated, may be NULL: any agent) an agent argument's schema lists those names.
 * Newly allocated; can't fail. */
JsonNode *vmctl_mcp_tools_list(gboolean read_only, gboolean host_files, const char *const *agents);

/* Runs @tool with @arguments (may be NULL: none) and returns tools/call's result: content (one
 * text item), and structuredContent or isError. Arguments are checked against the tool's table
 * first; an agent outside @context->agents is refused as hostd refuses an unknown one. Can't
 * fail: every failure is a tool error. Newly allocated. */
JsonNode *vmctl_mcp_tool_call(const VmctlMcpTool *tool, JsonObject *arguments,
                              const VmctlMcpContext *context);

G_END_DECLS
