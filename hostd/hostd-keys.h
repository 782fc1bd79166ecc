/* SSH key material hostd generates for each agent: the user keypair hostd (and the user's
 * OpenSSH) log in with, and the guest's host keypair, injected through cloud-init and pinned in
 * known_hosts so that no connection ever trusts on first use. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct {
    char *private_pem; /* OpenSSH private key format */
    char *public_line; /* "ssh-ed25519 AAAA... comment" */
} HostdKeyPair;

/* Generates a fresh ed25519 keypair; @comment ends the public line. Fails with VM_ERROR_SSH. */
HostdKeyPair *hostd_keypair_generate(const char *comment, GError **error);

void hostd_keypair_free(HostdKeyPair *pair);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdKeyPair, hostd_keypair_free)

/* Writes the private key to @private_path (mode 0600) and, when @public_path is not NULL, the
 * public line to it (0644), both atomically. Fails with VM_ERROR_IO. */
gboolean hostd_keypair_save(const HostdKeyPair *pair, const char *private_path,
                            const char *public_path, GError **error);

/* Returns the known_hosts line pinning @host_public_line for 127.0.0.1:@port, newline-ended. */
char *hostd_known_hosts_line(guint port, const char *host_public_line);

G_END_DECLS
