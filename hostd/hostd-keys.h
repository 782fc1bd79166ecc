/* SSH key material hostd generates for each agent: the user keypair hostd (and the user's
 * OpenSSH) log in with, and the guest's host keypair, injected through cloud-init and pinned in
 * known_hosts so that no connection ever trusts on first use. And the users' own public keys
 * (vmctl authorize, vmctl new --ssh-key): checked with libssh, and the record of an agent's. */
#pragma once

#include <glib.h>

#include "vm-ssh-key.h"

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

/* How a user's key is marked in the guest's authorized_keys: the first word of the comment of
 * each line hostd manages there, so that it can replace those lines and keep every other. */
#define HOSTD_USER_KEY_MARK "vmctl-authorized:"

/* Checks a user's public key line as vm_ssh_key_parse() does, then has libssh load the key and
 * rebuilds the key from what libssh parsed: what goes on is that key and the sanitized comment,
 * never the user's line. Fails with VM_ERROR_INVALID_ARGUMENT. Returns a new key. */
VmSshKey *hostd_user_key_check(const char *line, GError **error);

/* Checks each of @lines (NULL-terminated, at most VM_SSH_KEYS_MAX) with hostd_user_key_check();
 * a key given twice counts once, with its first comment. Fails with VM_ERROR_INVALID_ARGUMENT
 * naming the key ("key 2: ..."). Returns the keys (VmSshKey*), in order. */
GPtrArray *hostd_user_keys_check(const char *const *lines, GError **error);

/* Loads the record of an agent's users' keys (HOSTD_AGENT_USER_KEYS in its dir): one key a
 * line, as vm_ssh_key_to_line() writes them. A missing file is no key. Fails with VM_ERROR_IO,
 * or VM_ERROR_FAILED for a line that is no key (a corrupt record). Returns VmSshKey*. */
GPtrArray *hostd_user_keys_load(const char *path, GError **error);

/* Writes @keys (VmSshKey*) as the record at @path, atomically and durably, mode 0600. Fails with
 * VM_ERROR_IO. */
gboolean hostd_user_keys_save(const char *path, GPtrArray *keys, GError **error);

/* Adds to @record (VmSshKey*) each of @keys it does not hold yet (same fingerprint), copying
 * them; returns how many it added. Can't fail. */
guint hostd_user_keys_merge(GPtrArray *record, GPtrArray *keys);

/* The position of the key with @fingerprint in @keys (VmSshKey*), or -1. */
gint hostd_user_keys_find(GPtrArray *keys, const char *fingerprint);

/* The line the guest's authorized_keys holds for @key: "TYPE BASE64 vmctl-authorized: COMMENT".
 * Newly allocated; can't fail. */
char *hostd_user_key_guest_line(const VmSshKey *key);

/* @key as a dictionary (a{sv}): fingerprint, type, bits, comment and key (its line). */
GVariant *hostd_user_key_to_variant(const VmSshKey *key);

G_END_DECLS
