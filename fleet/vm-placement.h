/* Where a new agent goes: the fleet's placement rule (docs/CLUSTER.md, "Placement").
 *
 * One pure function over the fleet's host records, so that another scheduler (Nomad, a rule of
 * the user's) can take its place without touching hostd: hostd reads the records, asks
 * vm_placement_choose() and acts on its answer. No I/O, no clock.
 */
#pragma once

#include <glib.h>

#include "vm-fleet-records.h"

G_BEGIN_DECLS

/* Reasons given for hosts that cannot take an agent, in one error message; the rest counted. */
#define VM_PLACEMENT_REASONS_MAX 8

/* One host as placement sees it. */
typedef struct {
    const VmFleetHost *record; /* its record (for a host that is not live: what is known) */
    gboolean live;             /* its lease is held: its record is there */
} VmPlacementHost;

/* Why @host cannot take a new agent of @template_name that needs @memory_mib MiB (0: not known,
 * not checked): "host 'h2' is down", "... is drained", "... does not have template 'x'",
 * "... has 512 MiB free, the agent needs 1024". NULL when it can. Newly allocated; can't fail. */
char *vm_placement_refusal(const VmPlacementHost *host, const char *template_name,
                           guint64 memory_mib);

/* The rule: among the @n @hosts that can take the agent (vm_placement_refusal() is NULL), the
 * one with the most free memory; ties go to the fewest agents, then to the smallest id (so the
 * choice is the same on every host of the fleet for one view). Returns its index in
 * @ret_index. Fails with VM_ERROR_NO_RESOURCES when none can: "no host of the fleet can take
 * it: " and each host's reason (VM_PLACEMENT_REASONS_MAX of them, then how many more), or "the
 * fleet has no host" when @n is 0. */
gboolean vm_placement_choose(const VmPlacementHost *hosts, gsize n, const char *template_name,
                             guint64 memory_mib, gsize *ret_index, GError **error);

G_END_DECLS
