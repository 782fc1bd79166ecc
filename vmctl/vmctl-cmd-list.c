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
/* clang-format on */

gboolean
vmctl_cmd_list(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 0, &args, error))
        return FALSE;
    return vmctl_print_list(ctx, VM_OP_AGENT_LIST, NULL, "agents", agent_columns,
                            G_N_ELEMENTS(agent_columns), error);
}
