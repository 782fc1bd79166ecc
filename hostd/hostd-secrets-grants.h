#pragma once

#include <glib.h>

#include "vm-egress-credential.h"

G_BEGIN_DECLS

/* The credential broker's grants: which agent holds which secret under which placeholder. Kept
 * on the host, outside every agent's own directory (hostd uses $STATE/secrets/grants/<agent>,
 * one 0600 key file per agent, written atomically), so a checkpoint restore never brings a grant
 * back and a guest never sees another agent's placeholders. */

/* The grants of @agent in @grants_dir as a new table secret name -> placeholder (empty when the
 * agent has none). Fails with VM_ERROR_IO for a file that cannot be read or parsed. */
GHashTable *hostd_grants_load(const char *grants_dir, const char *agent, GError **error);

/* Grants @secret to @agent with a fresh placeholder (hostd-secrets-check.h), creating
 * @grants_dir (0700) if missing; returns the placeholder (new string). A secret the agent
 * already holds fails with VM_ERROR_EXISTS and keeps its placeholder. VM_ERROR_IO on a failed
 * write, which leaves the grants as they were. */
char *hostd_grants_add(const char *grants_dir, const char *agent, const char *secret,
                       GError **error);

/* Revokes @secret from @agent. VM_ERROR_NOT_FOUND if the agent does not hold it. */
gboolean hostd_grants_revoke(const char *grants_dir, const char *agent, const char *secret,
                             GError **error);

/* Drops every grant of @agent (agent rm). No grants is success. VM_ERROR_IO if the file stays. */
gboolean hostd_grants_remove_agent(const char *grants_dir, const char *agent, GError **error);

/* The agents (sorted, new NULL-terminated array) that hold @secret. VM_ERROR_IO if the grants
 * cannot be read. */
char **hostd_grants_holders(const char *grants_dir, const char *secret, GError **error);

/* Gives @dst every secret @src holds, each under a NEW placeholder (fork --grants): a fork's
 * guest must not be able to use its source's placeholders. Replaces @dst's grants. */
gboolean hostd_grants_copy_fresh(const char *grants_dir, const char *src, const char *dst,
                                 GError **error);

/* Builds the set of credentials @agent's proxy honours from its grants and the secrets in
 * @secrets_dir. A grant whose secret is gone fails with VM_ERROR_NOT_FOUND. */
VmEgressCredentials *hostd_grants_credentials(const char *secrets_dir, const char *grants_dir,
                                              const char *agent, GError **error);

G_END_DECLS
