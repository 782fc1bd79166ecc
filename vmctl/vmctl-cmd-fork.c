#include "vmctl.h"

#include "vm-name.h"

gboolean
vmctl_cmd_fork(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *from = NULL, *cpus = NULL, *memory = NULL;
    gboolean no_wait = FALSE, grants = FALSE, live = FALSE;
    const GOptionEntry entries[] = {
        {"from", 0, 0, G_OPTION_ARG_STRING, &from,
         "Fork from the source's CHECKPOINT instead of a checkpoint taken now", "CHECKPOINT"},
        {"cpus", 0, 0, G_OPTION_ARG_STRING, &cpus, "Give the fork N virtual CPUs", "N"},
        {"memory", 0, 0, G_OPTION_ARG_STRING, &memory, "Give the fork MIB MiB of memory", "MIB"},
        {"no-wait", 0, 0, G_OPTION_ARG_NONE, &no_wait,
         "Return once the VM is started, without waiting for SSH", NULL},
        {"grants", 0, 0, G_OPTION_ARG_NONE, &grants,
         "Give the fork the source's secrets, each under a new placeholder (default: none)", NULL},
        {"live", 0, 0, G_OPTION_ARG_NONE, &live,
         "Fork the running source with its processes (a memory checkpoint), not a fresh boot",
         NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 2, 2, &args, error) ||
        !vm_name_validate(args[0], error) || !vm_name_validate(args[1], error))
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "source", "s", args[0]);
    g_variant_dict_insert(&fields, "name", "s", args[1]);
    g_variant_dict_insert(&fields, "wait", "b", !no_wait);
    if (from != NULL)
        g_variant_dict_insert(&fields, "checkpoint", "s", from);
    if (grants)
        g_variant_dict_insert(&fields, "grants", "b", TRUE);
    if (live)
        g_variant_dict_insert(&fields, "live", "b", TRUE);
    if (!vmctl_dict_add_uint(ctx, &fields, "--cpus", cpus, "cpus", error) ||
        !vmctl_dict_add_uint(ctx, &fields, "--memory", memory, "memory_mib", error))
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_AGENT_FORK, g_variant_dict_end(&fields), &result, error))
        return FALSE;

    g_autoptr(GVariant) agent = vmctl_result_get(result, "agent", G_VARIANT_TYPE_VARDICT);
    g_autoptr(GVariant) checkpoint = vmctl_result_get(result, "checkpoint", G_VARIANT_TYPE_STRING);
    g_autofree char *summary = agent != NULL ? vmctl_format_agent_summary(agent) : NULL;
    g_autofree char *text =
        g_strdup_printf("%s\nforked from %s at checkpoint %s", summary != NULL ? summary : args[1],
                        args[0], checkpoint != NULL ? g_variant_get_string(checkpoint, NULL) : "?");
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}
