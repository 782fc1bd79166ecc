#include "vmctl.h"

#include "vm-error.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

static gboolean
exec_ssh(const char *const *ssh_argv, GError **error)
{
    fflush(stdout);
    execvp("ssh", (char **)ssh_argv);
    if (errno == ENOENT)
        return vm_throw(error, VM_ERROR_IO,
                        "ssh is not installed (vmctl ssh runs it); install openssh-client");
    return vm_throw_errno(error, errno, "cannot run ssh");
}

/* On a remote hostd the agent's key stays there: ssh to the remote host runs `vmctl ssh` there. */
static gboolean
ssh_remote(const VmctlRemote *remote, const char *name, char **command, GError **error)
{
    g_autoptr(GStrvBuilder) words = g_strv_builder_new();

    g_strv_builder_add(words, "vmctl");
    if (remote->socket_path != NULL)
        g_strv_builder_add_many(words, "--socket", remote->socket_path, NULL);
    g_strv_builder_add_many(words, "ssh", name, "--", NULL);
    g_strv_builder_addv(words, (const char **)command);
    g_auto(GStrv) remote_argv = g_strv_builder_end(words);
    g_auto(GStrv) ssh_argv = vmctl_remote_ssh_argv(remote, (const char *const *)remote_argv,
                                                   isatty(STDIN_FILENO) && isatty(STDOUT_FILENO));
    return exec_ssh((const char *const *)ssh_argv, error);
}

gboolean
vmctl_cmd_ssh(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *name = NULL;
    g_auto(GStrv) command = NULL;
    g_autoptr(VmMessage) result = NULL;
    VmctlEndpoint endpoint;

    if (!vmctl_parse_command(ctx, argc, argv, NULL, &name, &command, error) ||
        !vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;
    if (endpoint.remote != NULL)
        return ssh_remote(endpoint.remote, name, command, error);
    if (!vmctl_request(ctx, VM_OP_AGENT_SSH_CONFIG, g_variant_new_parsed("{'name': <%s>}", name),
                       &result, error))
        return FALSE;
    /* The agent is on another host of the fleet: reach it through that host. */
    if (ctx->remote != NULL)
        return ssh_remote(ctx->remote, name, command, error);
    const char *path = vm_message_get_string(result, "path", NULL);
    const char *host = vm_message_get_string(result, "host", NULL);
    if (path == NULL || host == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "hostd sent no ssh configuration for '%s'", name);

    g_autoptr(GPtrArray) ssh_argv = g_ptr_array_new();
    g_ptr_array_add(ssh_argv, "ssh");
    g_ptr_array_add(ssh_argv, "-F");
    g_ptr_array_add(ssh_argv, (gpointer)path);
    if (isatty(STDIN_FILENO) && isatty(STDOUT_FILENO))
        g_ptr_array_add(ssh_argv, "-t");
    /* Without "--", ssh would take options that follow the host as its own. */
    g_ptr_array_add(ssh_argv, "--");
    g_ptr_array_add(ssh_argv, (gpointer)host);
    for (char **word = command; *word != NULL; word++)
        g_ptr_array_add(ssh_argv, *word);
    g_ptr_array_add(ssh_argv, NULL);
    return exec_ssh((const char *const *)ssh_argv->pdata, error);
}
