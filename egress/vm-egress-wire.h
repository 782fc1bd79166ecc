/* The messages between hostd and an agent's egress worker (vm-egress-worker): docs/EGRESS.md.
 *
 * hostd starts one worker per agent with a socketpair as its fd VM_EGRESS_WORKER_CONTROL_FD and
 * the agent's listening egress.sock as VM_EGRESS_WORKER_LISTEN_FD. Each message is one frame of
 * vm-wire.h (a kind and its payload). hostd is trusted by the worker; the worker is not trusted by
 * hostd, which reads its frames with a small bound (VM_EGRESS_WIRE_FROM_WORKER_MAX), takes only
 * messages in normal form whose payload has the exact type its kind names, and bounds every string
 * again.
 *
 * hostd to worker:
 *   "start"       a{sv}: allow as, deny as, ca-cert s, ca-key s, upstream-ca s (PEM; absent: the
 *                 system's trust), credentials a(sssasss), max-connections u, handshake-ms u,
 *                 idle-ms u, connect-ms u, resolve-by-parent b, uid u, gid u, change-user b
 *   "policy"      (asas): allow, deny (replaces; tunnels it refuses close)
 *   "credentials" a(sssasss): name, placeholder, value, hosts, header, format
 *   "stats"       u: a serial, answered by "stats"
 *   "resolved"    (ubsas): serial, ok, error message, addresses
 * worker to hostd:
 *   "ready"       s: serving; what its confinement lacks ("" for nothing: hostd logs it once)
 *   "failed"      s: could not start (then it exits)
 *   "log"         s: one record as a JSON line (vm_egress_record_to_json())
 *   "stats"       (uutt): the serial asked, open connections, bytes up and down of the
 *                 requests that ended since the worker started
 *   "resolve"     (us): serial, host (only with resolve-by-parent)
 *
 * Connections out: the worker makes no TCP socket (its filter refuses one). Each connection it
 * wants, to an address it resolved and checked against its policy, it asks of hostd on a second
 * socketpair, its fd VM_EGRESS_WORKER_CONNECT_FD: one VmEgressConnectAsk at a time, answered by
 * one byte, 'F' carrying the TCP socket hostd made (SCM_RIGHTS, vm_fd_send(): non-blocking, its
 * connect() begun; the worker waits for it itself), or an errno without a descriptor (EACCES:
 * hostd's own check of the destination refused it). hostd answers at once, never waiting on the
 * destination.
 */
#pragma once

#include <glib.h>

#include "vm-egress-credential.h"
#include "vm-wire.h"

G_BEGIN_DECLS

#define VM_EGRESS_WORKER_CONTROL_FD 3
#define VM_EGRESS_WORKER_LISTEN_FD  4
#define VM_EGRESS_WORKER_CONNECT_FD 5

/* A connection the worker asks of hostd: a fixed record, read whole or not at all. */
typedef struct {
    guint8 family;    /* AF_INET or AF_INET6 */
    guint8 zero;      /* 0 */
    guint16 port;     /* host byte order, not 0 */
    guint8 bytes[16]; /* the address as VmEgressAddress holds it */
} VmEgressConnectAsk;

G_STATIC_ASSERT(sizeof(VmEgressConnectAsk) == 20);

/* Bounds on one frame's payload: hostd's messages carry a CA and credentials; the worker's
 * are log lines and counters. */
#define VM_EGRESS_WIRE_TO_WORKER_MAX   (4 * 1024 * 1024)
#define VM_EGRESS_WIRE_FROM_WORKER_MAX (64 * 1024)
/* The longest log line and host name hostd takes from a worker, and the most addresses it sends
 * in one answer. */
#define VM_EGRESS_WIRE_LINE_MAX      (16 * 1024)
#define VM_EGRESS_WIRE_HOST_MAX      255
#define VM_EGRESS_WIRE_ADDRESSES_MAX 64

/* @creds (NULL: none) as the "credentials" payload, a(sssasss); secret values included, so the
 * caller wipes nothing but drops the variant soon. Can't fail. */
GVariant *vm_egress_wire_credentials(VmEgressCredentials *creds);

/* The credentials a "credentials" payload carries; NULL with VM_ERROR_INVALID_ARGUMENT when one
 * grant is refused by vm_egress_credentials_add(), VM_ERROR_PROTOCOL for a wrong type. */
VmEgressCredentials *vm_egress_wire_credentials_parse(GVariant *payload, GError **error);

G_END_DECLS
