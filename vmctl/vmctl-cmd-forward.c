#include "vmctl.h"

#include "vm-name.h"

#include <stdio.h>

/* clang-format off */
static const VmctlField forward_columns[] = {
    {"AGENT", "agent", VMCTL_FORMAT_TEXT},
    {"GUEST PORT", "guest_port", VMCTL_FORMAT_TEXT},
    {"ADDRESS", "address", VMCTL_FORMAT_TEXT},
    {"CONNECTIONS", "connections", VMCTL_FORMAT_TEXT},
    {"SERVED", "listening", VMCTL_FORMAT_YESNO},
};
/* clang-format on */

gboolean
vmctl_cmd_forward(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *host_port = NULL;
    gboolean list = FALSE, rm = FALSE;
    const GOptionEntry entries[] = {
        {"host-port", 0, 0, G_OPTION_ARG_STRING, &host_port,
         "Serve it on this port of 127.0.0.1 (default: the first free one of hostd's "
         "forward-port-min to forward-port-max; below 1024: root only)",
         "PORT"},
        {"list", 0, 0, G_OPTION_ARG_NONE, &list,
         "List the forwarded ports of AGENT, or of every agent", NULL},
        {"rm", 0, 0, G_OPTION_ARG_NONE, &rm, "Stop forwarding GUEST_PORT of AGENT", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GVariantDict) fields = g_variant_dict_new(NULL);
    g_autoptr(VmMessage) result = NULL;
    g_auto(GStrv) args = NULL;
    guint32 guest_port = 0;
    guint32 port = 0;
    guint n;

    if (!vmctl_parse(ctx, argc, argv, entries, 0, 2, &args, error))
        return FALSE;
    n = g_strv_length(args);
    if (list && rm)
        return vmctl_usage_error(ctx, error, "--list and --rm do not go together");
    if (host_port != NULL && (list || rm))
        return vmctl_usage_error(ctx, error, "--host-port goes with a new forward only");
    if (list && n > 1)
        return vmctl_usage_error(ctx, error, "unexpected argument '%s'", args[1]);
    if (!list && n < 2)
        return vmctl_usage_error(ctx, error, n == 0 ? "missing AGENT" : "missing GUEST_PORT");
    if (n > 0) {
        if (!vm_name_validate(args[0], error))
            return FALSE;
        g_variant_dict_insert(fields, "name", "s", args[0]);
    }
    if (list)
        return vmctl_print_list(ctx, VM_OP_FORWARD_LIST, g_variant_dict_end(fields), "forwards",
                                forward_columns, G_N_ELEMENTS(forward_columns), error);

    if (!vmctl_parse_uint(ctx, "GUEST_PORT", args[1], 1, 65535, &guest_port, error))
        return FALSE;
    g_variant_dict_insert(fields, "guest_port", "u", guest_port);
    if (rm) {
        g_autofree char *text = NULL;

        if (!vmctl_request(ctx, VM_OP_FORWARD_RM, g_variant_dict_end(fields), &result, error))
            return FALSE;
        text = g_strdup_printf("port %u of %s is no longer forwarded", guest_port, args[0]);
        vmctl_print_result(ctx, result, NULL, text);
        return TRUE;
    }

    if (host_port != NULL) {
        if (!vmctl_parse_uint(ctx, "--host-port", host_port, 1, 65535, &port, error))
            return FALSE;
        g_variant_dict_insert(fields, "host_port", "u", port);
    }
    if (!vmctl_request(ctx, VM_OP_FORWARD_ADD, g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autoptr(GVariant) forward = vmctl_result_get(result, "forward", G_VARIANT_TYPE_VARDICT);
    g_autoptr(GVariant) address = forward != NULL ? vmctl_dict_lookup(forward, "address") : NULL;
    g_autofree char *text =
        g_strdup_printf("port %u of %s is served on %s", guest_port, args[0],
                        address != NULL && g_variant_is_of_type(address, G_VARIANT_TYPE_STRING)
                            ? g_variant_get_string(address, NULL)
                            : "?");
    vmctl_print_result(ctx, result, "forward", text);
    return TRUE;
}
