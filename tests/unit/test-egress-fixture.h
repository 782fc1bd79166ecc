/* Fixtures of the egress tests, those of egress/ and of hostd's egress: a policy from lists of
 * words, and the fake resolver of test names. Every helper fails the running test (cmocka's
 * fail_msg) instead of returning an error. */
#pragma once

#include <glib.h>

#include "vm-egress-policy.h"

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

G_END_DECLS
