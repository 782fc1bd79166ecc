#include "vmctl.h"

#include "vm-error.h"
#include "vmctl-client.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* docker's convention: the remote command owns every other status, so any failure of vmctl or
 * hostd after the arguments are understood exits with this one. */
#define EXEC_FAILURE_STATUS 125

/* -e K=V adds K=V; -e K copies K from the local environment, or nothing when it is unset. */
static gboolean
add_env(const char *option, const char *value, gpointer data, GError **error)
{
    GPtrArray *env = data;
    const char *equals = strchr(value, '=');

    if (value[0] == '\0' || equals == value)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s needs K=V, not '%s'", option, value);
    if (equals != NULL) {
        g_ptr_array_add(env, g_strdup(value));
    } else if (g_getenv(value) != NULL) {
        g_ptr_array_add(env, g_strconcat(value, "=", g_getenv(value), NULL));
    }
    return TRUE;
}

gboolean
vmctl_cmd_exec(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean tty = FALSE, interactive = FALSE;
    g_autofree char *workdir = NULL;
    g_autoptr(GPtrArray) env = g_ptr_array_new_with_free_func(g_free);
    const GOptionEntry entries[] = {
        {"tty", 't', 0, G_OPTION_ARG_NONE, &tty,
         "Run the command on a terminal (the local one is put in raw mode)", NULL},
        {"interactive", 'i', G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &interactive,
         "Forward stdin (always done)", NULL},
        {"env", 'e', 0, G_OPTION_ARG_CALLBACK, add_env,
         "Set K to V in the command's environment; K alone copies the local value", "K=V"},
        {"workdir", 'w', 0, G_OPTION_ARG_STRING, &workdir, "Run the command in DIR", "DIR"},
        G_OPTION_ENTRY_NULL,
    };
    g_autofree char *name = NULL;
    g_auto(GStrv) command = NULL;
    guint32 cols, rows;

    ctx->option_data = env;
    if (!vmctl_parse_command(ctx, argc, argv, entries, &name, &command, error))
        return FALSE;
    if (command[0] == NULL)
        return vmctl_usage_error(ctx, error, "missing the command to run");
    ctx->failure_status = EXEC_FAILURE_STATUS;

    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", name);
    g_variant_dict_insert(&fields, "argv", "^as", command);
    if (env->len > 0)
        g_variant_dict_insert_value(&fields, "env",
                                    g_variant_new_strv((const char *const *)env->pdata, env->len));
    if (workdir != NULL)
        g_variant_dict_insert(&fields, "cwd", "s", workdir);
    g_variant_dict_insert(&fields, "tty", "b", tty);
    if (tty && g_getenv("TERM") != NULL)
        g_variant_dict_insert(&fields, "term", "s", g_getenv("TERM"));
    if (vmctl_terminal_size(&cols, &rows)) {
        g_variant_dict_insert(&fields, "cols", "u", cols);
        g_variant_dict_insert(&fields, "rows", "u", rows);
    }

    g_autoptr(VmMessage) request = vm_message_new(VM_OP_EXEC, g_variant_dict_end(&fields), error);
    VmctlEndpoint endpoint;
    if (request == NULL || !vmctl_endpoint(ctx, &endpoint, error))
        return FALSE;
    return vmctl_client_exec(&endpoint, request, vmctl_progress_mode(ctx), tty, &ctx->exit_status,
                             error);
}
