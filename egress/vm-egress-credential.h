/* Credentials the egress proxy substitutes (the credential broker; docs/SECRETS.md).
 *
 * A guest holds only placeholders: random tokens, one per agent and secret. A VmEgressCredentials
 * is the set of grants one agent's proxy honours: for each, the placeholder, the real value, the
 * host patterns it may go to, and the request header it goes in. The proxy intercepts TLS only
 * for CONNECTs to a host that some grant names (terminating the guest's TLS with a certificate
 * the agent's own CA signs, vm-egress-ca.h), replaces the placeholder in that header of each
 * request on the connection, and refuses any request that carries a placeholder anywhere else.
 *
 * A set is immutable once handed to a proxy (vm_egress_proxy_set_credentials() takes a
 * reference); to change grants, build a new set. Values live in memory only: nothing here writes
 * or logs them.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct _VmEgressCredentials VmEgressCredentials;

/* An empty set (a proxy with it intercepts nothing). Can't fail. */
VmEgressCredentials *vm_egress_credentials_new(void);

VmEgressCredentials *vm_egress_credentials_ref(VmEgressCredentials *creds);
void vm_egress_credentials_unref(VmEgressCredentials *creds);

/* Adds one grant: @placeholder (what the guest sends) stands for @value (the real secret) in the
 * header @header (NULL: "Authorization") of requests to a host matching one of @hosts (exact
 * names or "*.suffix", normalised as egress rules are), written through @format (NULL: "{}"; one
 * "{}" where the value goes, e.g. "Bearer {}"; "Basic {}" means the value is the user:password
 * pair that is base64-encoded into the header, with the placeholder found in the decoded pair).
 * @secret_name names the grant in the egress log. Fails with VM_ERROR_INVALID_ARGUMENT for an
 * empty value or placeholder, a malformed host pattern, header or format, or a placeholder
 * already in the set. */
gboolean vm_egress_credentials_add(VmEgressCredentials *creds, const char *secret_name,
                                   const char *placeholder, const char *value,
                                   const char *const *hosts, const char *header, const char *format,
                                   GError **error);

/* How many grants @creds holds. Can't fail. */
guint vm_egress_credentials_size(VmEgressCredentials *creds);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressCredentials, vm_egress_credentials_unref)

G_END_DECLS
