#include "hostd-secrets-grants.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "hostd-secrets-check.h"
#include "hostd-secrets-store.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-util.h"

#define GROUP "grants"

static char *
grants_path(const char *grants_dir, const char *agent)
{
    return g_build_filename(grants_dir, agent, NULL);
}

GHashTable *
hostd_grants_load(const char *grants_dir, const char *agent, GError **error)
{
    /* The agent's name becomes a file name: a path in it must never get this far. */
    if (!vm_name_validate(agent, error))
        return NULL;
    g_autoptr(GHashTable) grants = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_autofree char *path = grants_path(grants_dir, agent);
    if (!g_file_test(path, G_FILE_TEST_EXISTS))
        return g_steal_pointer(&grants);
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autoptr(GError) local = NULL;
    if (!g_key_file_load_from_file(keyfile, path, G_KEY_FILE_NONE, &local)) {
        vm_throw(error, VM_ERROR_IO, "cannot read the grants of '%s': %s", agent, local->message);
        return NULL;
    }
    g_auto(GStrv) keys = g_key_file_get_keys(keyfile, GROUP, NULL, NULL);
    for (char **key = keys; key != NULL && *key != NULL; key++) {
        char *placeholder = g_key_file_get_string(keyfile, GROUP, *key, NULL);
        if (!hostd_secret_placeholder_is_valid(placeholder)) {
            g_free(placeholder);
            vm_throw(error, VM_ERROR_IO, "the grants of '%s' are damaged at '%s'", agent, *key);
            return NULL;
        }
        g_hash_table_insert(grants, g_strdup(*key), placeholder);
    }
    return g_steal_pointer(&grants);
}

static gboolean
save(const char *grants_dir, const char *agent, GHashTable *grants, GError **error)
{
    g_autofree char *path = grants_path(grants_dir, agent);
    if (g_hash_table_size(grants) == 0) {
        if (unlink(path) != 0 && errno != ENOENT)
            return vm_throw_errno(error, errno, "cannot remove the grants of '%s'", agent);
        return TRUE;
    }
    if (g_mkdir_with_parents(grants_dir, 0700) != 0)
        return vm_throw_errno(error, errno, "cannot create %s", grants_dir);
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    GHashTableIter iter;
    gpointer key, value;
    g_hash_table_iter_init(&iter, grants);
    while (g_hash_table_iter_next(&iter, &key, &value))
        g_key_file_set_string(keyfile, GROUP, key, value);
    gsize length = 0;
    g_autofree char *text = g_key_file_to_data(keyfile, &length, NULL);
    return vm_file_write_atomic(path, text, (gssize)length, 0600, error);
}

char *
hostd_grants_add(const char *grants_dir, const char *agent, const char *secret, GError **error)
{
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, agent, error);
    if (grants == NULL)
        return NULL;
    if (g_hash_table_contains(grants, secret)) {
        vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already holds secret '%s'", agent, secret);
        return NULL;
    }
    g_autofree char *placeholder = hostd_secret_placeholder_new(error);
    if (placeholder == NULL)
        return NULL;
    g_hash_table_insert(grants, g_strdup(secret), g_strdup(placeholder));
    if (!save(grants_dir, agent, grants, error))
        return NULL;
    return g_steal_pointer(&placeholder);
}

gboolean
hostd_grants_revoke(const char *grants_dir, const char *agent, const char *secret, GError **error)
{
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, agent, error);
    if (grants == NULL)
        return FALSE;
    if (!g_hash_table_remove(grants, secret))
        return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' does not hold secret '%s'", agent,
                        secret);
    return save(grants_dir, agent, grants, error);
}

gboolean
hostd_grants_remove_agent(const char *grants_dir, const char *agent, GError **error)
{
    if (!vm_name_validate(agent, error))
        return FALSE;
    g_autofree char *path = grants_path(grants_dir, agent);
    if (unlink(path) != 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot remove the grants of '%s'", agent);
    return TRUE;
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char **
hostd_grants_holders(const char *grants_dir, const char *secret, GError **error)
{
    g_autoptr(GPtrArray) agents = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GDir) handle = g_dir_open(grants_dir, 0, NULL);
    for (const char *entry; handle != NULL && (entry = g_dir_read_name(handle)) != NULL;) {
        if (entry[0] == '.')
            continue; /* a temporary file of an interrupted write */
        g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, entry, error);
        if (grants == NULL)
            return NULL;
        if (g_hash_table_contains(grants, secret))
            g_ptr_array_add(agents, g_strdup(entry));
    }
    g_ptr_array_sort(agents, compare_names);
    g_ptr_array_add(agents, NULL);
    return (char **)g_ptr_array_free(g_steal_pointer(&agents), FALSE);
}

gboolean
hostd_grants_copy_fresh(const char *grants_dir, const char *src, const char *dst, GError **error)
{
    g_autoptr(GHashTable) source = hostd_grants_load(grants_dir, src, error);
    if (source == NULL || !vm_name_validate(dst, error))
        return FALSE;
    g_autoptr(GHashTable) copy = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    GHashTableIter iter;
    gpointer key;
    g_hash_table_iter_init(&iter, source);
    while (g_hash_table_iter_next(&iter, &key, NULL)) {
        char *placeholder = hostd_secret_placeholder_new(error);
        if (placeholder == NULL)
            return FALSE;
        g_hash_table_insert(copy, g_strdup(key), placeholder);
    }
    return save(grants_dir, dst, copy, error);
}

VmEgressCredentials *
hostd_grants_credentials(const char *secrets_dir, const char *grants_dir, const char *agent,
                         GError **error)
{
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, agent, error);
    if (grants == NULL)
        return NULL;
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    GHashTableIter iter;
    gpointer key, value;
    g_hash_table_iter_init(&iter, grants);
    while (g_hash_table_iter_next(&iter, &key, &value)) {
        g_autoptr(HostdSecret) secret = hostd_secrets_store_load(secrets_dir, key, error);
        if (secret == NULL)
            return NULL;
        if (!vm_egress_credentials_add(creds, secret->name, value, secret->value,
                                       (const char *const *)secret->hosts, secret->header,
                                       secret->format, error))
            return NULL;
    }
    return g_steal_pointer(&creds);
}
