#include "hostd-keys.h"

#include "hostd-cleanup.h"
#include <string.h>

#include "vm-error.h"
#include "vm-util.h"

HostdKeyPair *
hostd_keypair_generate(const char *comment, GError **error)
{
    g_autoptr(HostdSshKey) key = NULL;
    char *private_b64 = NULL;
    char *public_b64 = NULL;

    if (ssh_pki_generate(SSH_KEYTYPE_ED25519, 0, &key) != SSH_OK) {
        vm_throw(error, VM_ERROR_SSH, "cannot generate an ed25519 key");
        return NULL;
    }
    if (ssh_pki_export_privkey_base64(key, NULL, NULL, NULL, &private_b64) != SSH_OK) {
        vm_throw(error, VM_ERROR_SSH, "cannot export a private key");
        return NULL;
    }
    if (ssh_pki_export_pubkey_base64(key, &public_b64) != SSH_OK) {
        ssh_string_free_char(private_b64);
        vm_throw(error, VM_ERROR_SSH, "cannot export a public key");
        return NULL;
    }

    HostdKeyPair *pair = g_new0(HostdKeyPair, 1);
    pair->private_pem = g_strdup(private_b64);
    pair->public_line = g_strdup_printf("ssh-ed25519 %s %s", public_b64, comment);
    /* The private key text is secret: wipe libssh's copy before giving it back. */
    memset(private_b64, 0, strlen(private_b64));
    ssh_string_free_char(private_b64);
    ssh_string_free_char(public_b64);
    return pair;
}

void
hostd_keypair_free(HostdKeyPair *pair)
{
    if (pair == NULL)
        return;
    if (pair->private_pem != NULL)
        memset(pair->private_pem, 0, strlen(pair->private_pem));
    g_free(pair->private_pem);
    g_free(pair->public_line);
    g_free(pair);
}

gboolean
hostd_keypair_save(const HostdKeyPair *pair, const char *private_path, const char *public_path,
                   GError **error)
{
    if (!vm_file_write_atomic(private_path, pair->private_pem, -1, 0600, error))
        return FALSE;
    if (public_path != NULL) {
        g_autofree char *line = g_strconcat(pair->public_line, "\n", NULL);
        if (!vm_file_write_atomic(public_path, line, -1, 0644, error))
            return FALSE;
    }
    return TRUE;
}

char *
hostd_known_hosts_line(guint port, const char *host_public_line)
{
    /* Only "type base64": the comment of the generated line names the agent, which is noise
     * in known_hosts. */
    g_auto(GStrv) parts = g_strsplit(host_public_line, " ", 3);
    return g_strdup_printf("[127.0.0.1]:%u %s %s\n", port, parts[0], parts[1] ? parts[1] : "");
}
