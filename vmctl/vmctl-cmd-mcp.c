#include "vmctl.h"

#include "vm-error.h"
#include "vm-name.h"
#include "vmctl-mcp.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

gboolean
vmctl_cmd_mcp(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) agents = NULL;
    gboolean read_only = FALSE;
    g_autofree char *copy_dir = NULL;
    const GOptionEntry entries[] = {
        {"agent", 0, 0, G_OPTION_ARG_STRING_ARRAY, &agents,
         "Serve only agent NAME (repeatable); others are not listed nor reachable", "NAME"},
        {"read-only", 0, 0, G_OPTION_ARG_NONE, &read_only,
         "Offer only the tools that change nothing", NULL},
        {"copy-dir", 0, 0, G_OPTION_ARG_FILENAME, &copy_dir,
         "Offer copy_to_agent and copy_from_agent, for files in DIR only", "DIR"},
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
    g_autofree char *root = NULL;
    if (copy_dir != NULL) {
        char *real = realpath(copy_dir, NULL);
        struct stat st;
        if (real == NULL || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
            int err = real == NULL ? errno : ENOTDIR;
            free(real);
            return vm_throw_errno(error, err, "--copy-dir %s", copy_dir);
        }
        root = g_strdup(real);
        free(real);
    }
    if (!vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;

    /* stdout is the protocol's: a client that is gone shows as a failed write, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    VmctlMcpOptions options = {
        .endpoint = &endpoint,
        .agents = (const char *const *)agents,
        .read_only = read_only,
        .copy_dir = root,
    };
    return vmctl_mcp_serve(&options, STDIN_FILENO, STDOUT_FILENO, error);
}
