#include "vmctl.h"

#include <stdio.h>

/* Sets or clears HOST's drained flag in the fleet (any host of it may): a drained host gets no
 * new agent from placement. */
static gboolean
drain(VmctlContext *ctx, int argc, char **argv, gboolean drained, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 1, 1, &args, error))
        return FALSE;
    if (args[0][0] == '\0')
        return vmctl_usage_error(ctx, error, "HOST is empty");
    if (!vmctl_request(ctx, VM_OP_FLEET_DRAIN,
                       g_variant_new_parsed("{'host': <%s>, 'drained': <%b>}", args[0], drained),
                       &result, error))
        return FALSE;
    gboolean changed = TRUE;
    g_variant_lookup(result->fields, "changed", "b", &changed);
    g_autofree char *summary =
        g_strdup_printf("%s %s%s", drained ? "drained" : "undrained", args[0],
                        changed   ? ""
                        : drained ? " (it was already)"
                                  : " (it was not drained)");
    vmctl_print_result(ctx, result, NULL, summary);
    return TRUE;
}

gboolean
vmctl_cmd_drain(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    return drain(ctx, argc, argv, TRUE, error);
}

gboolean
vmctl_cmd_undrain(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    return drain(ctx, argc, argv, FALSE, error);
}
