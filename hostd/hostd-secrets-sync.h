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

/* The proxy given the grants made at `new --secret` or `fork --grants` (agent_creating, after
 * the component that makes them), the seed of a new agent with the CA certificate and the
 * block of placeholders, the guest brought up to date when it comes up (agent_up: also what
 * removes a fork's copy of its source's placeholders), grants dropped with the agent (its CA
 * goes with the egress component), credentials handed to every proxy at start-up. */
extern const HostdComponent hostd_secrets_sync_component;

/* Applies @agent's current grants to its egress proxy at once (substitution, and its grants'
 * hosts opened on port 443) and, when the agent is running, to its guest (the /etc/environment
 * block of placeholders and CA variables, the CA certificate in the trust store:
 * hostd_secrets_guest_update()); SSH sessions and `vmctl exec` commands started afterwards see
 * the new environment (hostd's pooled sessions to the guest are dropped when it changed). A
 * paused or saved agent whose guest may hold another block is woken for it (a rotation, which
 * changes nothing in the guest, wakes nobody that hostd brought up to date); a stopped one gets
 * it when it next comes up. A grant whose secret is gone fails with VM_ERROR_NOT_FOUND, and the
 * proxy then substitutes nothing and opens no host for the agent until the next sync. Call
 * after every grant, revoke, rotation or removal of a secret, for each agent concerned, with the
 * agent's name lock held. Fails with VM_ERROR_NOT_FOUND for an unknown agent, VM_ERROR_SSH or
 * VM_ERROR_IO when the guest could not be brought up to date (the proxy side is applied even
 * then). */
gboolean hostd_secrets_sync(HostdContext *ctx, const char *agent, GError **error);

/* Where the credential broker keeps its state: *@ret_secrets_dir = $STATE/secrets (the secret
 * store, hostd-secrets-store.h) and *@ret_grants_dir = $STATE/secrets/grants
 * (hostd-secrets-grants.h), newly allocated; either may be NULL. Creates nothing. Can't fail. */
void hostd_secrets_paths(HostdContext *ctx, char **ret_secrets_dir, char **ret_grants_dir);

G_END_DECLS
