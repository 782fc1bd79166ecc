/* Users' own SSH public keys, as OpenSSH writes them ("TYPE BASE64 [COMMENT]", one a line): the
 * checks every side makes before a key goes anywhere. vmctl and its MCP tools check a key before
 * sending it; hostd checks it again (it never trusts a client), parses it with libssh as well
 * (hostd-keys.h) and sends the guest only a line rebuilt from what it parsed.
 *
 * Accepted: ssh-ed25519, ecdsa-sha2-nistp256/384/521, ssh-rsa of VM_SSH_KEY_RSA_MIN_BITS bits
 * or more, and the security-key variants sk-ssh-ed25519@openssh.com and
 * sk-ecdsa-sha2-nistp256@openssh.com. Refused, each with its own one-line reason: options before
 * the key (command=, from=, no-pty...), DSA, certificates, two keys on one line, malformed base64
 * or key data, a private key. A comment is kept as printable ASCII only (any other byte becomes
 * '?'), cut to VM_SSH_KEY_COMMENT_MAX bytes. Pure: no crypto library, no I/O but
 * vm_ssh_key_read_file().
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_SSH_KEY_LINE_MAX     8192        /* bytes of one public key line */
#define VM_SSH_KEY_FILE_MAX     (64 * 1024) /* bytes of a key file */
#define VM_SSH_KEY_COMMENT_MAX  100         /* bytes of a comment kept */
#define VM_SSH_KEY_RSA_MIN_BITS 2048
#define VM_SSH_KEY_RSA_MAX_BITS 16384

typedef struct {
    char *type;        /* "ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa", "sk-..." */
    char *base64;      /* the key's data (the blob OpenSSH hashes), base64 as given */
    char *comment;     /* printable ASCII, at most VM_SSH_KEY_COMMENT_MAX bytes; "" for none */
    guint bits;        /* 256 for ed25519, the curve's size for ECDSA, the modulus's for RSA */
    char *fingerprint; /* "SHA256:..." as `ssh-keygen -l` shows it */
} VmSshKey;

/* Parses one line holding one public key. Leading and trailing blanks (and a CR) are ignored.
 * Fails with VM_ERROR_INVALID_ARGUMENT and a one-line reason (see above). Returns a new key. */
VmSshKey *vm_ssh_key_parse(const char *line, GError **error);

void vm_ssh_key_free(VmSshKey *key);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmSshKey, vm_ssh_key_free)

/* "TYPE BASE64 COMMENT" (no comment: "TYPE BASE64"). Newly allocated; can't fail. */
char *vm_ssh_key_to_line(const VmSshKey *key);

/* Parses the text of a key file (@len bytes, not necessarily NUL-terminated): one key a line;
 * blank lines and lines starting with '#' are skipped. @what names the text in messages ("FILE"
 * gives "FILE, line 3: ..."). Fails with VM_ERROR_INVALID_ARGUMENT when a line is refused, when
 * the text holds a NUL byte, a private key or no key at all, or more than @max keys. Returns the
 * keys (VmSshKey*) in file order, duplicates included. */
GPtrArray *vm_ssh_key_parse_text(const char *text, gsize len, const char *what, guint max,
                                 GError **error);

/* Reads @path (at most VM_SSH_KEY_FILE_MAX bytes) and parses it as vm_ssh_key_parse_text() does,
 * naming the file in messages. Fails with VM_ERROR_IO when it cannot be read, as that does
 * otherwise. */
GPtrArray *vm_ssh_key_read_file(const char *path, guint max, GError **error);

G_END_DECLS
