/* Forwarded ports (vmctl forward): a TCP port of an agent's guest served on the host's
 * 127.0.0.1, through hostd, so that a connection wakes a paused or saved agent as one to its SSH
 * port does. The carrying is hostd-ssh-forward's (an SSH direct-tcpip channel per connection);
 * this component keeps the record, agents/<name>/forwards.ini (written atomically), chooses host
 * ports, serves the recorded ports again at start-up and stops them when the agent goes.
 *
 * Requests take the agent's name lock themselves; hooks run with it held.
 */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Forwarding as a component of the context: the recorded ports served again at start-up
 * (agent_reconcile), stopped when the agent goes (agent_removed), everything stopped when the
 * context goes. */
extern const HostdComponent hostd_forward_component;

#define HOSTD_AGENT_FORWARDS "forwards.ini"

/* Forwarded ports one agent may have. */
#define HOSTD_FORWARD_MAX 64

/* Forwards @guest_port of agent @name to 127.0.0.1:@host_port (0: the lowest free port of the
 * configured forward range) and records it. @uid is the caller's (-1: unknown): a port below
 * 1024 is root's alone. Fails with VM_ERROR_EXISTS when that guest port is forwarded already,
 * VM_ERROR_NO_RESOURCES when the host port is taken (by another forward, an agent's SSH, or
 * anything listening), none is free in the range, or the agent has HOSTD_FORWARD_MAX ports,
 * VM_ERROR_INVALID_ARGUMENT for a privileged port asked by someone else than root, and as
 * hostd_agent_load(); nothing is left listening or recorded on failure. Returns the forward's
 * dictionary (docs/PROTOCOL.md, "Forward"). */
GVariant *hostd_forward_add(HostdContext *ctx, const char *name, guint guest_port, guint host_port,
                            gint64 uid, GError **error);

/* Stops forwarding @guest_port of agent @name and forgets it: the host port is free on return,
 * the open connections on it close. Fails with VM_ERROR_NOT_FOUND when it is not forwarded, as
 * hostd_agent_load(), or VM_ERROR_IO when the record cannot be written (then nothing
 * changed). */
gboolean hostd_forward_remove(HostdContext *ctx, const char *name, guint guest_port,
                              GError **error);

/* The forwards of agent @name, or of every agent when @name is NULL (agents whose record cannot
 * be read are left out), as aa{sv} in agent and guest port order. Fails as hostd_agent_load()
 * for @name, or with VM_ERROR_IO / VM_ERROR_FAILED when its forwards cannot be read. */
GVariant *hostd_forward_list(HostdContext *ctx, const char *name, GError **error);

/* Stops serving every forwarded port (records are kept): for hostd's exit, before a shutdown
 * saves the agents, so that no connection wakes one again. Can't fail. */
void hostd_forward_stop(HostdContext *ctx);

G_END_DECLS
