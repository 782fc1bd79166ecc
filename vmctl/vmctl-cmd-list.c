#include "vmctl.h"

/* One column a line, in the order they show. */
/* clang-format off */
static const VmctlField agent_columns[] = {
    {"NAME", "name", VMCTL_FORMAT_TEXT},
    {"STATE", "state", VMCTL_FORMAT_TEXT},
    {"SINCE", "state_since", VMCTL_FORMAT_AGO},
    {"TEMPLATE", "template", VMCTL_FORMAT_TEXT},
    {"CPUS", "cpus", VMCTL_FORMAT_TEXT},
    {"MEMORY", "memory_mib", VMCTL_FORMAT_MIB},
    {"DISK", "disk_gib", VMCTL_FORMAT_GIB},
    {"SSH", "ssh_port", VMCTL_FORMAT_TEXT},
    {"CREATED", "created", VMCTL_FORMAT_AGO},
};

static const VmctlField fleet_columns[] = {
    {"NAME", "name", VMCTL_FORMAT_TEXT},
    {"HOST", "host", VMCTL_FORMAT_TEXT},
    {"STATE", "state", VMCTL_FORMAT_TEXT},
    {"EPOCH", "epoch", VMCTL_FORMAT_TEXT},
};
/* clang-format on */

gboolean
vmctl_cmd_list(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    gboolean fleet = FALSE;
    const GOptionEntry entries[] = {
        {"fleet", 0, 0, G_OPTION_ARG_NONE, &fleet,
         "Every agent of the fleet with its host, from any host of it", NULL},
        {NULL},
    };

    if (!vmctl_parse(ctx, argc, argv, entries, 0, 0, &args, error))
        return FALSE;
    if (fleet)
        return vmctl_print_list(ctx, VM_OP_FLEET_LIST, NULL, "agents", fleet_columns,
                                G_N_ELEMENTS(fleet_columns), error);
    return vmctl_print_list(ctx, VM_OP_AGENT_LIST, NULL, "agents", agent_columns,
                            G_N_ELEMENTS(agent_columns), error);
}
