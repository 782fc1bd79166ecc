/* Puts an agent's grants into effect outside the secret store (docs/SECRETS.md).
 *
 * Grants live on the host ($STATE/secrets/grants, hostd-secrets-grants.h). This component makes
 * them real: the agent's proxy honours them (credentials, and egress to each grant's hosts on
 * port 443), the guest holds each grant's placeholder in its environment and trusts the agent's
 * own CA, from the seed at creation and live on a running guest. It also drops an agent's grants
 * and CA when the agent goes, and gives every proxy its credentials at start-up.
 */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Seed at creation, guest brought up to date when it comes up, grants and CA removed with the
 * agent, credentials handed to proxies at start-up. */
extern const HostdComponent hostd_secrets_sync_component;

/* Applies @agent's current grants to its egress proxy at once (substitution, and its grants'
 * hosts opened on port 443) and, when the agent is running, to its guest (the /etc/environment
 * block of placeholders and CA variables, the CA certificate in the trust store); a guest that is
 * not running gets them when it next comes up. Call after every grant, revoke, rotation or
 * removal of a secret, for each agent concerned, with the agent's name lock held. Fails with
 * VM_ERROR_NOT_FOUND for an unknown agent, VM_ERROR_SSH or VM_ERROR_IO when the guest could not
 * be brought up to date (the proxy side is applied even then). */
gboolean hostd_secrets_sync(HostdContext *ctx, const char *agent, GError **error);

G_END_DECLS
