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

/* A shell script, run as root in the guest, that makes the file $1 (/etc/environment) hold hostd's
 * block $2 (whole lines from its marker line to its end marker line, as
 * hostd_secrets_guest_environment() writes it) after the lines of $1 outside any earlier block:
 * what hostd_secrets_guest_environment() makes of $1, written through a temporary file renamed
 * over it, mode 0644. Shell builtins but one mv: a new agent from a warm image gets its grants
 * this way with its identity, before sshd starts (hostd-warm.h). */
#define HOSTD_SECRETS_GUEST_ENVIRONMENT_SET_SCRIPT                                                 \
    "set -eu\n"                                                                                    \
    "nl='\n'\n"                                                                                    \
    "begin=${2%%\"$nl\"*}\n"                                                                       \
    "last=${2%\"$nl\"}\n"                                                                          \
    "end=${last##*\"$nl\"}\n"                                                                      \
    "kept= inside=\n"                                                                              \
    "if [ -f \"$1\" ]; then\n"                                                                     \
    "  while IFS= read -r line || [ -n \"$line\" ]; do\n"                                          \
    "    if [ -n \"$inside\" ]; then\n"                                                            \
    "      if [ \"$line\" = \"$end\" ]; then inside=; fi\n"                                        \
    "      continue\n"                                                                             \
    "    fi\n"                                                                                     \
    "    if [ \"$line\" = \"$begin\" ]; then inside=1; continue; fi\n"                             \
    "    kept=\"$kept$line$nl\"\n"                                                                 \
    "  done < \"$1\"\n"                                                                            \
    "fi\n"                                                                                         \
    "(umask 022; printf '%s%s' \"$kept\" \"$2\" > \"$1.vmctl-new\")\n"                             \
    "mv -f \"$1.vmctl-new\" \"$1\"\n"

/* Where hostd_secrets_guest_update() reads and writes the block, and the most of it it reads: the
 * guest is untrusted, a larger file is refused rather than read. */
#define HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH "/etc/environment"
#define HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX  (64 * 1024)

/* How hostd_secrets_guest_update() runs one command in the guest (hostd: over SSH as the agent's
 * user; tests: a fake guest): @argv with @input (NULL: none) as its stdin. Returns the exit
 * status in *@ret_status, the first @max_output bytes of its stdout in *@ret_output when that is
 * not NULL and the first few KiB of its stderr in *@ret_stderr (both newly allocated). FALSE
 * with VM_ERROR_SSH or VM_ERROR_IO when it could not be run. */
typedef gboolean (*HostdSecretsGuestRunFunc)(char **argv, GBytes *input, gsize max_output,
                                             int *ret_status, GBytes **ret_output,
                                             char **ret_stderr, gpointer user_data, GError **error);

/* Brings a running guest up to date with its grants @env_to_placeholder (env var ->
 * placeholder; NULL or empty: none), as root through sudo:
 * - with grants and @ca_cert_pem: installs the certificate as HOSTD_SECRETS_GUEST_CA_PATH and
 *   trusts it in HOSTD_SECRETS_GUEST_BUNDLE_PATH (VM_SEED_TRUST_CA_SCRIPT: well under a second,
 *   no whole update-ca-certificates run), the certificate it replaced no longer, only when it is
 *   missing or different (first, so that the variables naming it never point at a file that is
 *   not there yet), in the same command as the read below: a guest that has both already (a
 *   new agent given them with its identity) costs one command;
 * - reads /etc/environment (at most HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX bytes: a larger file, or
 *   one holding a NUL byte, fails with VM_ERROR_IO and is left alone) and, when
 *   hostd_secrets_guest_environment() changes it, writes the result back atomically (a
 *   temporary file renamed over it, mode 0644).
 * Nothing but placeholders and the certificate is sent. *@ret_changed (may be NULL) says
 * whether /etc/environment was rewritten: SSH sessions opened before then keep the old
 * environment (sshd's pam_env reads it once per connection). Fails with the runner's error, or
 * VM_ERROR_IO with the guest's stderr when a command failed in the guest. */
gboolean hostd_secrets_guest_update(HostdSecretsGuestRunFunc run, gpointer user_data,
                                    GHashTable *env_to_placeholder, const char *ca_cert_pem,
                                    gboolean *ret_changed, GError **error);

G_END_DECLS
