/* Start-up: the state directory and libvirt brought into agreement before hostd serves. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Rolls back agents whose `new` never finished, removes leftovers of interrupted removals,
 * redefines domains libvirt lost from the agent's saved domain XML, leaves running agents
 * running, and runs every component's agent_reconcile hook. Appends one human-readable line per
 * action to @notes. Fails only when the agents cannot be listed. */
gboolean hostd_reconcile(HostdContext *ctx, GPtrArray *notes, GError **error);

G_END_DECLS
