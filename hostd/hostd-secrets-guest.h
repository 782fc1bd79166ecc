#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* What a guest sees of its grants: lines of /etc/environment (read by pam_env for SSH sessions
 * and vmctl exec), kept in one block between marker lines so hostd can rewrite its own lines on
 * every grant and revoke without touching what the user wrote there. Pure text transforms: the
 * caller writes the result into the guest (seed at creation, SSH exec when running). */

#define HOSTD_SECRETS_GUEST_CA_PATH     "/usr/local/share/ca-certificates/vmctl-egress.crt"
#define HOSTD_SECRETS_GUEST_BUNDLE_PATH "/etc/ssl/certs/ca-certificates.crt"

/* Returns @environment (the guest's current /etc/environment; NULL or "" for none) with hostd's
 * block replaced by one holding, for each entry of @env_to_placeholder (env var -> placeholder,
 * written sorted by name), ENV=placeholder, and the CA variables (NODE_EXTRA_CA_CERTS,
 * REQUESTS_CA_BUNDLE, SSL_CERT_FILE). With no grants the block, CA lines included, goes. Lines
 * outside the block are kept as they were. Can't fail. */
char *hostd_secrets_guest_environment(const char *environment, GHashTable *env_to_placeholder);

G_END_DECLS
