#include "vm-placement.h"

#include "vm-error.h"

char *
vm_placement_refusal(const VmPlacementHost *host, const char *template_name, guint64 memory_mib)
{
    const VmFleetHost *r = host->record;

    if (!host->live)
        return g_strdup_printf("host '%s' is down", r->id);
    if (r->drained)
        return g_strdup_printf("host '%s' is drained", r->id);
    if (!vm_fleet_host_has_template(r, template_name))
        return g_strdup_printf("host '%s' does not have template '%s'", r->id, template_name);
    if (memory_mib > 0 && r->free_memory_mib < memory_mib)
        return g_strdup_printf("host '%s' has %" G_GUINT64_FORMAT " MiB free, the agent needs "
                               "%" G_GUINT64_FORMAT,
                               r->id, r->free_memory_mib, memory_mib);
    return NULL;
}

/* Whether @a is a better place than @b: more free memory, then fewer agents, then the smaller
 * id. */
static gboolean
better(const VmFleetHost *a, const VmFleetHost *b)
{
    if (a->free_memory_mib != b->free_memory_mib)
        return a->free_memory_mib > b->free_memory_mib;
    guint agents_a = vm_fleet_host_agents_total(a);
    guint agents_b = vm_fleet_host_agents_total(b);
    if (agents_a != agents_b)
        return agents_a < agents_b;
    return g_strcmp0(a->id, b->id) < 0;
}

gboolean
vm_placement_choose(const VmPlacementHost *hosts, gsize n, const char *template_name,
                    guint64 memory_mib, gsize *ret_index, GError **error)
{
    g_autoptr(GString) reasons = g_string_new(NULL);
    gsize best = n;
    gsize refused = 0;

    if (n == 0)
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "the fleet has no host");
    for (gsize i = 0; i < n; i++) {
        g_autofree char *why = vm_placement_refusal(&hosts[i], template_name, memory_mib);
        if (why != NULL) {
            if (refused++ < VM_PLACEMENT_REASONS_MAX)
                g_string_append_printf(reasons, "%s%s", reasons->len > 0 ? "; " : "", why);
            continue;
        }
        if (best == n || better(hosts[i].record, hosts[best].record))
            best = i;
    }
    if (best == n) {
        if (refused > VM_PLACEMENT_REASONS_MAX)
            g_string_append_printf(reasons, "; and %" G_GSIZE_FORMAT " more",
                                   refused - VM_PLACEMENT_REASONS_MAX);
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "no host of the fleet can take it: %s",
                        reasons->str);
    }
    *ret_index = best;
    return TRUE;
}
