#include "hostd-secrets-guest.h"

#include <stdlib.h>
#include <string.h>

#include "vm-error.h"
#include "vm-seed.h"

#define BLOCK_BEGIN "# BEGIN vmctl secrets (managed by hostd; edits here are replaced)"
#define BLOCK_END   "# END vmctl secrets"

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char *
hostd_secrets_guest_environment(const char *environment, GHashTable *env_to_placeholder)
{
    g_autoptr(GString) out = g_string_new(NULL);
    g_auto(GStrv) lines = g_strsplit(environment != NULL ? environment : "", "\n", -1);
    gboolean inside = FALSE;
    for (char **line = lines; *line != NULL; line++) {
        /* The empty string after a final newline is not a line. */
        if (line[1] == NULL && **line == '\0')
            break;
        if (g_str_equal(*line, BLOCK_BEGIN)) {
            inside = TRUE;
            continue;
        }
        if (inside) {
            if (g_str_equal(*line, BLOCK_END))
                inside = FALSE;
            continue;
        }
        g_string_append_printf(out, "%s\n", *line);
    }
    if (env_to_placeholder == NULL || g_hash_table_size(env_to_placeholder) == 0)
        return g_string_free(g_steal_pointer(&out), FALSE);

    g_autofree gpointer *names = g_hash_table_get_keys_as_array(env_to_placeholder, NULL);
    qsort(names, g_hash_table_size(env_to_placeholder), sizeof *names, compare_names);
    g_string_append(out, BLOCK_BEGIN "\n");
    for (gpointer *name = names; *name != NULL; name++)
        g_string_append_printf(out, "%s=%s\n", (const char *)*name,
                               (const char *)g_hash_table_lookup(env_to_placeholder, *name));
    g_string_append(out, "NODE_EXTRA_CA_CERTS=" HOSTD_SECRETS_GUEST_CA_PATH "\n"
                         "REQUESTS_CA_BUNDLE=" HOSTD_SECRETS_GUEST_BUNDLE_PATH "\n"
                         "SSL_CERT_FILE=" HOSTD_SECRETS_GUEST_BUNDLE_PATH "\n" BLOCK_END "\n");
    return g_string_free(g_steal_pointer(&out), FALSE);
}

/* The commands hostd_secrets_guest_update() runs, each as `sudo -n sh -c SCRIPT sh ARGS`:
 * the paths come as arguments, never spliced into the script. Each stops at its first failure
 * (set -e) with the file as it was. */

/* $1: the file, $2: how many bytes at most. A missing file reads as empty. */
#define GUEST_READ_SCRIPT                                                                          \
    "set -eu\n"                                                                                    \
    "[ -e \"$1\" ] || exit 0\n"                                                                    \
    "[ -f \"$1\" ] || { echo \"$1 is not a file\" >&2; exit 1; }\n"                                \
    "exec head -c \"$2\" -- \"$1\"\n"
static const char guest_read_script[] = GUEST_READ_SCRIPT;

/* $1: the file; the new contents on stdin, renamed over it once whole. */
static const char guest_write_script[] =
    "set -eu\n"
    "[ ! -e \"$1\" ] || [ -f \"$1\" ] || { echo \"$1 is not a file\" >&2; exit 1; }\n"
    "tmp=$(mktemp \"$1.vmctl.XXXXXX\")\n"
    "trap 'rm -f \"$tmp\"' EXIT\n"
    "cat >\"$tmp\"\n"
    "chmod 644 \"$tmp\"\n"
    "sync \"$tmp\" 2>/dev/null || sync\n"
    "mv -f \"$tmp\" \"$1\"\n"
    "trap - EXIT\n";

/* $1: the certificate's path, $2: the trust bundle; the certificate on stdin. Nothing happens
 * when the guest has it already. The temporary names do not end in .crt, so an
 * update-ca-certificates running meanwhile never picks them up. Then the certificate is trusted
 * at once, the one it replaced no longer (VM_SEED_TRUST_CA_SCRIPT). */
#define GUEST_CA_SCRIPT                                                                            \
    "set -eu\n"                                                                                    \
    "mkdir -p \"${1%/*}\"\n"                                                                       \
    "tmp=$(mktemp \"$1.XXXXXX\")\n"                                                                \
    "trap 'rm -f \"$tmp\" \"$tmp.old\"' EXIT\n"                                                    \
    "cat >\"$tmp\"\n"                                                                              \
    "if [ -f \"$1\" ] && cmp -s \"$tmp\" \"$1\"; then exit 0; fi\n"                                \
    "old=\n"                                                                                       \
    "if [ -f \"$1\" ]; then cp \"$1\" \"$tmp.old\"; old=$tmp.old; fi\n"                            \
    "chmod 644 \"$tmp\"\n"                                                                         \
    "mv -f \"$tmp\" \"$1\"\n"                                                                      \
    "(set -- \"$1\" \"$old\" \"$2\"\n" VM_SEED_TRUST_CA_SCRIPT ")\n"

/* Both in one command, one sudo and one round trip: $1, $2 as the certificate's, the certificate
 * on stdin; $3, $4 as the read's. The certificate's part runs in a subshell, which its early exit
 * (nothing to do) ends alone. */
static const char guest_ca_read_script[] = "set -eu\n"
                                           "(" GUEST_CA_SCRIPT ")\n"
                                           "shift 2\n" GUEST_READ_SCRIPT;

/* Runs @script as root in the guest with @args; a non-zero exit fails with @what and the
 * guest's stderr. */
static gboolean
guest_run_script(HostdSecretsGuestRunFunc run, gpointer user_data, const char *script,
                 const char *const *args, GBytes *input, gsize max_output, GBytes **ret_output,
                 const char *what, GError **error)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();
    g_auto(GStrv) argv = NULL;
    g_autofree char *guest_stderr = NULL;
    int status = -1;

    g_strv_builder_add_many(builder, "sudo", "-n", "sh", "-c", script, "sh", NULL);
    g_strv_builder_addv(builder, (const char **)args);
    argv = g_strv_builder_end(builder);
    if (!run(argv, input, max_output, &status, ret_output, &guest_stderr, user_data, error))
        return FALSE;
    if (status != 0) {
        if (ret_output != NULL)
            g_clear_pointer(ret_output, g_bytes_unref);
        return vm_throw(error, VM_ERROR_IO, "the guest could not %s (exit %d): %s", what, status,
                        guest_stderr != NULL ? g_strstrip(guest_stderr) : "");
    }
    return TRUE;
}

gboolean
hostd_secrets_guest_update(HostdSecretsGuestRunFunc run, gpointer user_data,
                           GHashTable *env_to_placeholder, const char *ca_cert_pem,
                           gboolean *ret_changed, GError **error)
{
    gboolean has_grants = env_to_placeholder != NULL && g_hash_table_size(env_to_placeholder) > 0;
    g_autofree char *max_text = g_strdup_printf("%d", HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX + 1);
    const char *const read_args[] = {HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH, max_text, NULL};
    const char *const write_args[] = {HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH, NULL};
    const char *const ca_read_args[] = {HOSTD_SECRETS_GUEST_CA_PATH,
                                        HOSTD_SECRETS_GUEST_BUNDLE_PATH,
                                        HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH, max_text, NULL};
    g_autoptr(GBytes) current = NULL;
    g_autoptr(GBytes) input = NULL;
    g_autofree char *current_text = NULL;
    g_autofree char *updated = NULL;
    gsize len = 0;
    const char *data;

    if (ret_changed != NULL)
        *ret_changed = FALSE;
    if (has_grants && ca_cert_pem != NULL) {
        g_autoptr(GBytes) cert = g_bytes_new(ca_cert_pem, strlen(ca_cert_pem));

        if (!guest_run_script(
                run, user_data, guest_ca_read_script, ca_read_args, cert,
                HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX + 1, &current,
                "install the egress CA certificate and read " HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH,
                error))
            return FALSE;
    } else if (!guest_run_script(run, user_data, guest_read_script, read_args, NULL,
                                 HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX + 1, &current,
                                 "read " HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH, error)) {
        return FALSE;
    }
    data = current != NULL ? g_bytes_get_data(current, &len) : NULL;
    if (len > HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX)
        return vm_throw(error, VM_ERROR_IO,
                        "the guest's " HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH
                        " is larger than %d bytes: left as it is",
                        HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX);
    if (len > 0 && memchr(data, '\0', len) != NULL)
        return vm_throw(error, VM_ERROR_IO,
                        "the guest's " HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH
                        " holds a NUL byte: left as it is");
    current_text = g_strndup(data != NULL ? data : "", len);
    updated = hostd_secrets_guest_environment(current_text, env_to_placeholder);
    if (g_str_equal(updated, current_text))
        return TRUE;
    input = g_bytes_new(updated, strlen(updated));
    if (!guest_run_script(run, user_data, guest_write_script, write_args, input, 0, NULL,
                          "write " HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH, error))
        return FALSE;
    if (ret_changed != NULL)
        *ret_changed = TRUE;
    return TRUE;
}
