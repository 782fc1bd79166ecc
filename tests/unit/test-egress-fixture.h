/* Fixtures of the egress tests, those of egress/ and of hostd's egress: a policy from lists of
 * words, the fake resolver of test names, and a collector of the proxy's log records. Every
 * helper fails the running test (cmocka's fail_msg) instead of returning an error. */
#pragma once

#include <glib.h>

#include "vm-egress-policy.h"
#include "vm-egress-proxy.h"

G_BEGIN_DECLS

/* The policy of the space-separated rules in @allow and @deny (NULL: none); fails the test when
 * they are refused. */
VmEgressPolicy *vm_test_egress_policy(const char *allow, const char *deny);

/* A VmEgressResolveFunc for tests, which reach nothing but 127.0.0.1: a name ending in ".test"
 * resolves to 127.0.0.1, "mixed.test" to an internal address (10.1.2.3) as well; every other
 * name, "unknown.test" among them, is VM_ERROR_NOT_FOUND. @counter (a gint *, may be NULL)
 * counts the calls, atomically. */
GArray *vm_test_egress_resolve(const char *host, gpointer counter, GError **error);

/* The first flight of a real GnuTLS client session that names @server_name in its SNI (NULL:
 * none): the TLS records of its ClientHello, as a guest's TLS library sends them into a tunnel.
 * Fails the test when GnuTLS cannot make one. */
GBytes *vm_test_tls_client_hello(const char *server_name);

/* Waits up to 5 s for @proxy to have no connection left; fails the test when one stays. */
void vm_test_egress_wait_idle(VmEgressProxy *proxy);

/* One record of a VmTestEgressLog: copies of the VmEgressRecord fields the tests look at. */
typedef struct {
    VmEgressRecordKind kind;
    char *host;
    char *address;
    guint16 port;
    char *reason;
    char *secret;
    guint64 bytes_up;
    guint64 bytes_down;
} VmTestEgressRecord;

/* Each record's one-line JSON (vm_egress_record_to_json()), for a test's assertion on every
 * record; it runs on the proxy's thread before the record is kept. */
typedef void (*VmTestEgressCheck)(const char *json);

/* The records a proxy logged, in order, which test threads wait for. */
typedef struct VmTestEgressLog VmTestEgressLog;

/* An empty log; @check (may be NULL) sees every record that arrives. Free it with
 * vm_test_egress_log_free() after the proxy that logs into it. */
VmTestEgressLog *vm_test_egress_log_new(VmTestEgressCheck check);

/* Frees @log and its records; NULL is ignored. */
void vm_test_egress_log_free(VmTestEgressLog *log);

/* A VmEgressLogFunc: keeps a copy of @record in @log (a VmTestEgressLog *) and wakes its
 * waiters. Safe from any thread. */
void vm_test_egress_log_func(const VmEgressRecord *record, gpointer log);

/* Record number @n (0-based), waiting up to 5 s for it; fails the test when it does not come.
 * The record belongs to @log. */
const VmTestEgressRecord *vm_test_egress_log_wait(VmTestEgressLog *log, guint n);

/* How many records @log holds now. */
guint vm_test_egress_log_count(VmTestEgressLog *log);

G_END_DECLS
