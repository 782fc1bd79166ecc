#include "vmctl.h"

#include "vm-error.h"

#include <stdio.h>

/* Adds --cpus N or +N to @fields. */
static gboolean
set_add_cpus(VmctlContext *ctx, GVariantDict *fields, const char *text, GError **error)
{
    gboolean relative = text[0] == '+';
    guint32 n;

    if (!vmctl_parse_uint(ctx, "--cpus", relative ? text + 1 : text, 1, VM_SET_CPUS_MAX, &n, error))
        return FALSE;
    g_variant_dict_insert(fields, relative ? "cpus_add" : "cpus", "u", n);
    return TRUE;
}

/* Adds --memory SIZE (a bare number in MiB, as new's) to @fields. */
static gboolean
set_add_memory(VmctlContext *ctx, GVariantDict *fields, const char *text, GError **error)
{
    gboolean relative;
    guint64 mib;

    if (!vmctl_parse_size(ctx, "--memory", text, 1, VM_SET_MEMORY_MIB_MAX, &relative, &mib, error))
        return FALSE;
    g_variant_dict_insert(fields, relative ? "memory_add_mib" : "memory_mib", "u", (guint32)mib);
    return TRUE;
}

/* Adds --disk SIZE (a bare number in GiB, as new's; whole GiB only) to @fields. */
static gboolean
set_add_disk(VmctlContext *ctx, GVariantDict *fields, const char *text, GError **error)
{
    gboolean relative;
    guint64 mib;

    if (!vmctl_parse_size(ctx, "--disk", text, 1024, (guint64)VM_SET_DISK_GIB_MAX * 1024, &relative,
                          &mib, error))
        return FALSE;
    if (mib % 1024 != 0)
        return vmctl_usage_error(ctx, error, "--disk grows by whole GiB, not '%s'", text);
    g_variant_dict_insert(fields, relative ? "disk_add_gib" : "disk_gib", "u",
                          (guint32)(mib / 1024));
    return TRUE;
}

gboolean
vmctl_cmd_set(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *cpus = NULL, *memory = NULL, *disk = NULL;
    const GOptionEntry entries[] = {
        {"cpus", 0, 0, G_OPTION_ARG_STRING, &cpus,
         "Give the VM N virtual CPUs (+N: N more), live where it can, else at its next start", "N"},
        {"memory", 0, 0, G_OPTION_ARG_STRING, &memory,
         "Give the VM SIZE of memory: 4096 (MiB), 8G, +2G; live where it can, else at its next "
         "start",
         "SIZE"},
        {"disk", 0, 0, G_OPTION_ARG_STRING, &disk,
         "Grow the disk and its root filesystem to SIZE: 40 (GiB), 40G, +5G; never shrinks",
         "SIZE"},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(VmMessage) result = NULL;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    if (cpus == NULL && memory == NULL && disk == NULL)
        return vmctl_usage_error(ctx, error, "nothing to change: give --cpus, --memory or --disk");
    if ((cpus != NULL && !set_add_cpus(ctx, fields, cpus, error)) ||
        (memory != NULL && !set_add_memory(ctx, fields, memory, error)) ||
        (disk != NULL && !set_add_disk(ctx, fields, disk, error)))
        return FALSE;
    g_autofree char *name = NULL;
    g_variant_dict_lookup(fields, "name", "s", &name);

    if (!vmctl_request(ctx, VM_OP_AGENT_SET_RESOURCES, g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autoptr(GVariant) changes = vmctl_result_get(result, "changes", G_VARIANT_TYPE_STRING_ARRAY);
    g_autoptr(GString) text = g_string_new(NULL);
    gsize n = 0;
    g_autofree const char **lines = changes != NULL ? g_variant_get_strv(changes, &n) : NULL;
    for (gsize i = 0; i < n; i++)
        g_string_append_printf(text, "%s%s: %s", i > 0 ? "\n" : "", name, lines[i]);
    vmctl_print_result(ctx, result, NULL, n > 0 ? text->str : NULL);
    return TRUE;
}
