#include "vmctl.h"

#include "vm-name.h"

#include <stdio.h>

gboolean
vmctl_cmd_ssh_config(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 1, &args, error))
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    if (args[0] != NULL) {
        if (!vm_name_validate(args[0], error))
            return FALSE;
        g_variant_dict_insert(&fields, "name", "s", args[0]);
    }
    if (!vmctl_request(ctx, VM_OP_AGENT_SSH_CONFIG, g_variant_dict_end(&fields), &result, error))
        return FALSE;
    if (ctx->json) {
        vmctl_print_result(ctx, result, NULL, NULL);
    } else if (ctx->remote != NULL) {
        g_autofree char *config =
            vmctl_remote_ssh_config(ctx->remote, vm_message_get_string(result, "config", ""));
        fputs(config, stdout);
    } else {
        fputs(vm_message_get_string(result, "config", ""), stdout);
    }
    return TRUE;
}
