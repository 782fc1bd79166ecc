/* hostd's end of an egress worker's connections out (vm-egress-wire.h, docs/EGRESS.md): the
 * worker, which may be taken over, makes no TCP socket of its own; it asks hostd for each
 * connection to an address, and hostd checks that address again against the agent's policy as
 * hostd holds it before it connects. As OpenSSH's privilege separation does: the unprivileged
 * side gets a socket, never the network. */
#pragma once

#include <glib.h>

#include "vm-egress-policy.h"
#include "vm-egress-wire.h"

G_BEGIN_DECLS

/* The agent's policy now, a new reference; called by the serving thread for each ask. */
typedef VmEgressPolicy *(*HostdEgressConnectPolicyFunc)(gpointer user_data);

/* The answer to one ask, without the socket: a new TCP socket (non-blocking, close-on-exec)
 * to @ask's address and port with its connect() begun (in progress or done), or a negative
 * errno: -EINVAL for a malformed ask, -EACCES when @policy refuses the destination
 * (vm_egress_policy_check_connect() with the host's own addresses @local, may be NULL), else
 * that of socket() or connect(). Never waits on the destination. */
int hostd_egress_connect_one(const VmEgressConnectAsk *ask, VmEgressPolicy *policy, GArray *local);

/* Serves the worker's asks on @sock (hostd's end of its VM_EGRESS_WORKER_CONNECT_FD; taken) in
 * a thread of its own until the worker closes its end or breaks the protocol, answering each at
 * once with hostd_egress_connect_one() under the policy @policy_func gives: one ask in flight at
 * a time, so hostd holds at most one of the worker's connections, for as long as a send takes
 * (bounded by a send timeout). @notify (may be NULL) frees @user_data when the thread ends. A
 * refused ask is answered, and logged once per worker run by hostd. Fails with VM_ERROR_IO when
 * no thread can be started (@sock is closed and @user_data freed then too). */
gboolean hostd_egress_connect_serve(int sock, const char *name,
                                    HostdEgressConnectPolicyFunc policy_func, gpointer user_data,
                                    GDestroyNotify notify, GError **error);

G_END_DECLS
