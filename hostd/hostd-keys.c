#include "hostd-keys.h"

#include "hostd-cleanup.h"
#include <string.h>

#include "vm-error.h"
#include "vm-protocol.h"
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

VmSshKey *
hostd_user_key_check(const char *line, GError **error)
{
    g_return_val_if_fail(line != NULL, NULL);

    g_autoptr(VmSshKey) parsed = vm_ssh_key_parse(line, error);
    if (parsed == NULL)
        return NULL;
    enum ssh_keytypes_e type = ssh_key_type_from_name(parsed->type);
    g_autoptr(HostdSshKey) key = NULL;
    if (type == SSH_KEYTYPE_UNKNOWN ||
        ssh_pki_import_pubkey_base64(parsed->base64, type, &key) != SSH_OK ||
        ssh_key_type(key) != type) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "the %s key does not load (libssh refuses it)",
                 parsed->type);
        return NULL;
    }
    char *b64 = NULL;
    if (ssh_pki_export_pubkey_base64(key, &b64) != SSH_OK) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "the %s key cannot be written back",
                 parsed->type);
        return NULL;
    }
    g_autofree char *rebuilt =
        g_strdup_printf("%s %s %s", ssh_key_type_to_char(type), b64, parsed->comment);
    ssh_string_free_char(b64);
    /* The fingerprint is computed again, from the data libssh wrote. */
    return vm_ssh_key_parse(rebuilt, error);
}

GPtrArray *
hostd_user_keys_check(const char *const *lines, GError **error)
{
    g_return_val_if_fail(lines != NULL, NULL);

    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);
    guint n = g_strv_length((char **)lines);

    if (n > VM_SSH_KEYS_MAX) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%u keys: at most %d at once", n,
                 VM_SSH_KEYS_MAX);
        return NULL;
    }
    for (guint i = 0; i < n; i++) {
        g_autoptr(GError) local_error = NULL;
        g_autoptr(VmSshKey) key = hostd_user_key_check(lines[i], &local_error);

        if (key == NULL) {
            if (n == 1)
                g_propagate_error(error, g_steal_pointer(&local_error));
            else
                vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "key %u: %s", i + 1,
                         local_error->message);
            return NULL;
        }
        if (hostd_user_keys_find(keys, key->fingerprint) < 0)
            g_ptr_array_add(keys, g_steal_pointer(&key));
    }
    return g_steal_pointer(&keys);
}

GPtrArray *
hostd_user_keys_load(const char *path, GError **error)
{
    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);
    g_autoptr(GError) local_error = NULL;
    g_autofree char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, &local_error)) {
        if (g_error_matches(local_error, G_FILE_ERROR, G_FILE_ERROR_NOENT))
            return g_steal_pointer(&keys);
        vm_throw(error, VM_ERROR_IO, "cannot read %s: %s", path, local_error->message);
        return NULL;
    }
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (guint i = 0; lines[i] != NULL; i++) {
        if (lines[i][0] == '\0' || lines[i][0] == '#')
            continue;
        VmSshKey *key = vm_ssh_key_parse(lines[i], &local_error);
        if (key == NULL) {
            vm_throw(error, VM_ERROR_FAILED, "corrupt record %s, line %u: %s", path, i + 1,
                     local_error->message);
            return NULL;
        }
        g_ptr_array_add(keys, key);
    }
    return g_steal_pointer(&keys);
}

gboolean
hostd_user_keys_save(const char *path, GPtrArray *keys, GError **error)
{
    g_autoptr(GString) text =
        g_string_new("# The users' own keys hostd authorizes in this agent (vmctl authorize)\n");

    for (guint i = 0; i < keys->len; i++) {
        g_autofree char *line = vm_ssh_key_to_line(keys->pdata[i]);
        g_string_append_printf(text, "%s\n", line);
    }
    return vm_file_write_atomic(path, text->str, (gssize)text->len, 0600, error);
}

gint
hostd_user_keys_find(GPtrArray *keys, const char *fingerprint)
{
    for (guint i = 0; i < keys->len; i++) {
        const VmSshKey *key = keys->pdata[i];
        if (g_str_equal(key->fingerprint, fingerprint))
            return (gint)i;
    }
    return -1;
}

guint
hostd_user_keys_merge(GPtrArray *record, GPtrArray *keys)
{
    guint added = 0;

    for (guint i = 0; i < keys->len; i++) {
        const VmSshKey *key = keys->pdata[i];
        if (hostd_user_keys_find(record, key->fingerprint) >= 0)
            continue;
        VmSshKey *copy = g_new0(VmSshKey, 1);
        copy->type = g_strdup(key->type);
        copy->base64 = g_strdup(key->base64);
        copy->comment = g_strdup(key->comment);
        copy->bits = key->bits;
        copy->fingerprint = g_strdup(key->fingerprint);
        g_ptr_array_add(record, copy);
        added++;
    }
    return added;
}

char *
hostd_user_key_guest_line(const VmSshKey *key)
{
    if (key->comment[0] == '\0')
        return g_strdup_printf("%s %s " HOSTD_USER_KEY_MARK, key->type, key->base64);
    return g_strdup_printf("%s %s " HOSTD_USER_KEY_MARK " %s", key->type, key->base64,
                           key->comment);
}

GVariant *
hostd_user_key_to_variant(const VmSshKey *key)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autofree char *line = vm_ssh_key_to_line(key);

    g_variant_builder_add(&b, "{sv}", "fingerprint", g_variant_new_string(key->fingerprint));
    g_variant_builder_add(&b, "{sv}", "type", g_variant_new_string(key->type));
    g_variant_builder_add(&b, "{sv}", "bits", g_variant_new_uint32(key->bits));
    g_variant_builder_add(&b, "{sv}", "comment", g_variant_new_string(key->comment));
    g_variant_builder_add(&b, "{sv}", "key", g_variant_new_string(line));
    return g_variant_builder_end(&b);
}
