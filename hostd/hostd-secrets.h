/* The credential broker's operations (docs/SECRETS.md): the secrets vmctl creates, rotates and
 * removes, and the grants that give an agent a placeholder for one, kept in $STATE/secrets/ (the
 * store, hostd-secrets-store.h) and $STATE/secrets/grants/ (hostd-secrets-grants.h).
 *
 * Every change to a grant, and every rotation or removal of a granted secret, is put into effect
 * through hostd_secrets_sync() (hostd-secrets-sync.h) for each agent concerned, with that agent's
 * name lock held. A secret's value comes in a request and goes to the store; no function here
 * puts it into an error message, a result or a log line.
 */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Grants at `new` (the template's `secrets:` and `vmctl new --secret`), before the seed is made;
 * the agent's grants dropped when it goes. Added after the egress component and before the
 * secrets sync component, whose hooks see the grants made here. */
extern const HostdComponent hostd_secrets_component;

/* $STATE/secrets and $STATE/secrets/grants, newly allocated. Can't fail. */
char *hostd_secrets_dir(HostdContext *ctx);
char *hostd_secrets_grants_dir(HostdContext *ctx);

/* What `vmctl secret create` asks for. NULL @header, @format, @env take the defaults
 * (Authorization, "Bearer {}", the name upper-cased with '-' as '_'). */
typedef struct {
    const char *name;
    const char *const *hosts;
    const char *header;
    const char *format;
    const char *env;
    const guint8 *value; /* not NUL-terminated */
    gsize value_len;
} HostdSecretRequest;

/* Stores a new secret (0600, atomically). Fails with VM_ERROR_INVALID_ARGUMENT for a bad name,
 * host pattern, header, format, env name or value (empty, NUL, CR, LF, over 8 KiB),
 * VM_ERROR_EXISTS when the name is taken, VM_ERROR_IO; nothing is stored on failure. Returns the
 * secret's description (a{sv}: name, hosts, header, format, env, agents; never the value). */
GVariant *hostd_secret_create(HostdContext *ctx, const HostdSecretRequest *request, GError **error);

/* Every secret's description (aa{sv}, sorted by name). Fails with VM_ERROR_IO. */
GVariant *hostd_secret_list(HostdContext *ctx, GError **error);

/* Rotation: replaces the value of secret @name, then brings every agent holding it up to date.
 * Fails with VM_ERROR_INVALID_ARGUMENT (bad value), VM_ERROR_NOT_FOUND (no such secret),
 * VM_ERROR_IO; or, with the new value stored, with the error of the first agent that could not
 * be brought up to date. Returns its description. */
GVariant *hostd_secret_set(HostdContext *ctx, const char *name, const guint8 *value,
                           gsize value_len, GError **error);

/* Removes secret @name. While an agent holds it, fails with VM_ERROR_BAD_STATE naming them,
 * unless @force: then every grant is revoked (and put into effect) first. Fails with
 * VM_ERROR_NOT_FOUND for an unknown secret. Returns the agents whose grant was revoked (as). */
GVariant *hostd_secret_rm(HostdContext *ctx, const char *name, gboolean force, GError **error);

/* Grants secret @name to @agent under a new placeholder and puts it into effect
 * (hostd_secrets_sync()); when that fails the grant is taken back and the error returned, so no
 * grant is left half made. Fails with VM_ERROR_INVALID_ARGUMENT (bad names), VM_ERROR_NOT_FOUND
 * (unknown agent or secret), VM_ERROR_EXISTS (held already, or another secret the agent holds
 * has the same env var: the guest would see only one). Returns the agent's grants now
 * (hostd_secrets_agent_grants()). */
GVariant *hostd_secret_grant(HostdContext *ctx, const char *agent, const char *name,
                             GError **error);

/* Revokes secret @name from @agent and puts it into effect. Fails with VM_ERROR_NOT_FOUND
 * (unknown agent, or a secret it does not hold); a revocation that could not reach the guest is
 * still made (the proxy no longer substitutes) and fails with that error. Returns the agent's
 * grants now. */
GVariant *hostd_secret_revoke(HostdContext *ctx, const char *agent, const char *name,
                              GError **error);

/* @agent's grants as `vmctl info` shows them: aa{sv} of name and env, sorted by name; empty
 * when it has none or they cannot be read. Can't fail. */
GVariant *hostd_secrets_agent_grants(HostdContext *ctx, const char *agent);

/* fork --grants, with both agents' name locks held and @dst reserved: @dst gets every secret
 * @src holds, each under a new placeholder. Fails with VM_ERROR_IO. */
gboolean hostd_secrets_fork_grants(HostdContext *ctx, const char *src, const char *dst,
                                   GError **error);

G_END_DECLS
