#include "vmctl-move.h"

#include <stdio.h>

#include "vm-error.h"

/* Moves every agent the fleet's record puts on @host to where placement puts it, one after the
 * other; says each, and fails naming those that did not move. */
static gboolean
drain_move_all(VmctlContext *ctx, const char *host, GError **error)
{
    g_autoptr(VmMessage) listed = NULL;
    if (!vmctl_request(ctx, VM_OP_FLEET_LIST, NULL, &listed, error))
        return FALSE;
    g_autoptr(GVariant) rows = vmctl_result_rows(listed, "agents");
    g_autoptr(GString) failed = g_string_new(NULL);
    guint moved = 0, failures = 0;
    GVariantIter it;
    GVariant *row;
    g_variant_iter_init(&it, rows);
    while ((row = g_variant_iter_next_value(&it)) != NULL) {
        g_autoptr(GVariant) owned = row;
        const char *name = NULL, *owner = NULL;
        if (!g_variant_lookup(row, "name", "&s", &name) ||
            !g_variant_lookup(row, "host", "&s", &owner) || !g_str_equal(owner, host))
            continue;
        g_auto(VmctlMoveReport) report = {0};
        g_autoptr(GError) local_error = NULL;
        if (vmctl_move_agent(ctx, name, NULL, &report, &local_error)) {
            moved++;
            if (!ctx->quiet)
                printf("moved %s to %s (%.1f s, %.1f s saved)\n", name, report.to, report.seconds,
                       report.down_s);
            continue;
        }
        failures++;
        g_printerr("vmctl: %s: %s\n", name, local_error->message);
        g_string_append_printf(failed, "%s%s", failed->len > 0 ? ", " : "", name);
    }
    if (failures > 0)
        return vm_throw(error, VM_ERROR_FAILED,
                        "host '%s' is drained, but %u of its agents did not move (%s); `vmctl "
                        "drain %s` again tries them again",
                        host, failures, failed->str, host);
    if (!ctx->quiet)
        printf("drained %s: %u agent%s moved away\n", host, moved, moved == 1 ? "" : "s");
    return TRUE;
}

/* Sets or clears HOST's drained flag in the fleet (any host of it may): a drained host gets no
 * new agent from placement. Draining also moves its agents away, unless --no-move. */
static gboolean
drain(VmctlContext *ctx, int argc, char **argv, gboolean drained, GError **error)
{
    gboolean no_move = FALSE;
    const GOptionEntry entries[] = {
        {"no-move", 0, 0, G_OPTION_ARG_NONE, &no_move,
         "Only keep new agents off; move none of its agents", NULL},
        {NULL},
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, drained ? entries : NULL, 1, 1, &args, error))
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
    if (!drained || no_move || ctx->json) {
        vmctl_print_result(ctx, result, NULL, summary);
        if (!drained || no_move)
            return TRUE;
    } else if (!ctx->quiet) {
        printf("%s: no new agent goes there; moving its agents away\n", summary);
    }
    return drain_move_all(ctx, args[0], error);
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
