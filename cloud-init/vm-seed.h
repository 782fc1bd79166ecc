/* cloud-init NoCloud seed for one agent: user-data, meta-data, and the ISO holding them. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct {
    const char *hostname;
    const char *instance_id;
    gboolean warm;                  /* the generic machine of a warm image (docs/INSTANT.md): no
                                     * key of any kind (authorized_key, user_keys and the host
                                     * key are not used), the old host keys deleted, and sshd kept
                                     * from starting during this boot (until
                                     * VM_SEED_WARM_IDENTITY_FLAG exists), so nothing
                                     * answers until hostd gives a restored agent its identity */
    const char *user;               /* default user, gets passwordless sudo */
    const char *authorized_key;     /* "ssh-ed25519 AAAA... comment" */
    const char *const *user_keys;   /* NULL-terminated, or NULL: the user's own public key lines
                                     * (vmctl new --ssh-key), authorized next to hostd's key;
                                     * at most VM_SSH_KEYS_MAX, checked by hostd already */
    const char *host_key_private;   /* OpenSSH PEM of the guest's ed25519 host key */
    const char *host_key_public;    /* "ssh-ed25519 AAAA..." */
    const char *const *packages;    /* NULL-terminated, or NULL: installed at first boot */
    const char *template_user_data; /* template's extra cloud-config, or NULL */
    const char *user_user_data;     /* the user's --user-data (cloud-config or script), or NULL */
    const char *egress_proxy;       /* "http://HOST:PORT", the guest's only way out: written to
                                     * /etc/environment, /etc/profile.d and apt's configuration
                                     * as http(s)_proxy; NULL: none */
    const char *guest_api_host;     /* the in-guest API's address ("10.0.2.100"): added to
                                     * no_proxy with egress_proxy, so that HTTP clients reach it
                                     * directly rather than through the proxy; NULL: none */
    const char *egress_resolver;    /* the egress proxy's resolver, an IPv4 address
                                     * ("10.0.2.100"): /etc/resolv.conf names it alone, over TCP
                                     * ("options use-vc"); NULL: the image's file stays */
    gboolean guest_tool;            /* write /usr/local/bin/vmctl-guest (vm_seed_guest_tool()) */
    const char *egress_ca_pem;      /* the PEM certificate (never a key) of the agent's egress CA
                                     * (the credential broker): written to VM_SEED_EGRESS_CA_PATH
                                     * and trusted (VM_SEED_TRUST_CA_SCRIPT); NULL: none */
    const char *environment_block;  /* whole lines appended to /etc/environment (the credential
                                     * broker's block of placeholders): each "# comment" or
                                     * NAME=VALUE, ending with a newline; NULL: none */
} VmSeedSpec;

/* In a warm image's machine, sshd starts only once this file exists. */
#define VM_SEED_WARM_IDENTITY_FLAG "/run/vmctl-identity"

/* Where egress_ca_pem goes in the guest: Debian's directory of local CAs. */
#define VM_SEED_EGRESS_CA_PATH "/usr/local/share/ca-certificates/vmctl-egress.crt"

/* The guest's bundle of trusted CAs: what OpenSSL reads by default, and SSL_CERT_FILE and
 * REQUESTS_CA_BUNDLE name; its directory holds the links by subject hash. */
#define VM_SEED_CA_BUNDLE_PATH "/etc/ssl/certs/ca-certificates.crt"

/* A shell script, run as root in the guest, that trusts the CA certificate file $1 at once,
 * where a whole update-ca-certificates run (every certificate linked and the bundle rebuilt,
 * 18 s under emulation) made a new agent with a secret wait: in the bundle $3, every block equal
 * to $1 or to $2 (a copy of the certificate $1 replaced; "" for none) goes and $1 is appended,
 * through a temporary file renamed over it; $1 is linked as vmctl-egress.pem and by its subject
 * hash in the bundle's directory (the links to an older one go first). A later
 * update-ca-certificates (an upgrade of ca-certificates) rebuilds the same from $1, which lies
 * among the local CAs. Without a bundle it runs update-ca-certificates instead. */
#define VM_SEED_TRUST_CA_SCRIPT                                                                    \
    "set -eu\n"                                                                                    \
    "dir=${3%/*}\n"                                                                                \
    "if [ ! -f \"$3\" ]; then exec update-ca-certificates >/dev/null; fi\n"                        \
    "bundle_tmp=$(mktemp \"$3.XXXXXX\")\n"                                                         \
    "trap 'rm -f \"$bundle_tmp\"' EXIT\n"                                                          \
    "awk -v old=\"$2\" -v new=\"$1\" '\n"                                                          \
    "function slurp(f,  l, s) { s = \"\"; while ((getline l < f) > 0) s = s l \"\\n\"; close(f); " \
    "return s }\n"                                                                                 \
    "BEGIN { o = old != \"\" ? slurp(old) : \"\"; n = slurp(new) }\n"                              \
    "/-----BEGIN CERTIFICATE-----/ { inb = 1; b = \"\" }\n"                                        \
    "inb { b = b $0 \"\\n\"; if (/-----END CERTIFICATE-----/) { inb = 0; "                         \
    "if (b != o && b != n) printf \"%s\", b }; next }\n"                                           \
    "{ print }\n"                                                                                  \
    "END { if (inb) printf \"%s\", b; printf \"%s\", n }' \"$3\" >\"$bundle_tmp\"\n"               \
    "chmod 644 \"$bundle_tmp\"\n"                                                                  \
    "mv -f \"$bundle_tmp\" \"$3\"\n"                                                               \
    "trap - EXIT\n"                                                                                \
    "find \"$dir\" -maxdepth 1 -lname vmctl-egress.pem -delete\n"                                  \
    "ln -sfn \"$1\" \"$dir/vmctl-egress.pem\"\n"                                                   \
    "if hash=$(openssl x509 -hash -noout -in \"$1\" 2>/dev/null); then\n"                          \
    "    i=0\n"                                                                                    \
    "    while [ -e \"$dir/$hash.$i\" ]; do i=$((i + 1)); done\n"                                  \
    "    ln -sfn vmctl-egress.pem \"$dir/$hash.$i\"\n"                                             \
    "fi\n"

/* Renders user-data. Without extra parts it is one #cloud-config document; with template or
 * user parts it is a MIME multipart whose extra parts merge into hostd's (lists appended), so
 * hostd's user, keys, host keys and proxy settings always hold. Fails with
 * VM_ERROR_INVALID_ARGUMENT when a required field is missing or a value would break the YAML
 * (newline in hostname...), there are more than VM_SSH_KEYS_MAX user keys, or egress_proxy is
 * not "http://" followed by a host name or IPv4 address and an optional port, or guest_api_host
 * is not a host name or IPv4 address, egress_resolver not an IPv4 address, egress_ca_pem is not one
 * PEM certificate, or environment_block has a line that is neither a comment nor NAME=VALUE. */
char *vm_seed_render_user_data(const VmSeedSpec *spec, GError **error);

/* Renders meta-data (instance-id, local-hostname). Can't fail for a valid spec. */
char *vm_seed_render_meta_data(const VmSeedSpec *spec, GError **error);

/* Writes the NoCloud ISO (volume id "cidata") to @iso_path, atomically (temp + rename), with
 * genisoimage. Fails with VM_ERROR_INVALID_ARGUMENT for an invalid spec (as the render functions)
 * and VM_ERROR_IO when writing fails. */
gboolean vm_seed_write_iso(const VmSeedSpec *spec, const char *iso_path, GError **error);

/* The text of vmctl-guest, the in-guest API's command (the source tree's cloud-init/vmctl-guest,
 * built in), as the seed writes it with guest_tool. Static storage; can't fail. */
const char *vm_seed_guest_tool(void);

G_END_DECLS
