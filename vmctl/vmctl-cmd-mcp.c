#include "vmctl.h"

#include "vm-name.h"
#include "vmctl-mcp.h"

#include <signal.h>
#include <unistd.h>

gboolean
vmctl_cmd_mcp(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) agents = NULL;
    gboolean read_only = FALSE;
    const GOptionEntry entries[] = {
        {"agent", 0, 0, G_OPTION_ARG_STRING_ARRAY, &agents,
         "Serve only agent NAME (repeatable); others are not listed nor reachable", "NAME"},
        {"read-only", 0, 0, G_OPTION_ARG_NONE, &read_only,
         "Offer only the tools that change nothing", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    VmctlEndpoint endpoint;

    if (!vmctl_parse(ctx, argc, argv, entries, 0, 0, &args, error))
        return FALSE;
    for (gsize i = 0; agents != NULL && agents[i] != NULL; i++) {
        if (!vm_name_validate(agents[i], error))
            return FALSE;
    }
    if (!vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;

    /* stdout is the protocol's: a client that is gone shows as a failed write, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    VmctlMcpOptions options = {
        .endpoint = &endpoint,
        .agents = (const char *const *)agents,
        .read_only = read_only,
    };
    return vmctl_mcp_serve(&options, STDIN_FILENO, STDOUT_FILENO, error);
}
