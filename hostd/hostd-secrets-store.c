#include "hostd-secrets-store.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-secrets-check.h"
#include "vm-error.h"
#include "vm-util.h"

#define GROUP "secret"

void
hostd_secret_free(HostdSecret *secret)
{
    if (secret == NULL)
        return;
    if (secret->value != NULL) {
        /* volatile so the compiler keeps the wipe of memory about to be freed. */
        volatile char *p = secret->value;
        while (*p != '\0')
            *p++ = '\0';
    }
    g_free(secret->name);
    g_free(secret->value);
    g_strfreev(secret->hosts);
    g_free(secret->header);
    g_free(secret->format);
    g_free(secret->env);
    g_free(secret);
}

gboolean
hostd_secrets_store_prepare(const char *dir, GError **error)
{
    if (g_mkdir_with_parents(dir, 0700) != 0)
        return vm_throw_errno(error, errno, "cannot create %s", dir);
    if (chmod(dir, 0700) != 0)
        return vm_throw_errno(error, errno, "cannot set the mode of %s", dir);
    return TRUE;
}

static gboolean
check_secret(const HostdSecret *secret, GError **error)
{
    if (!hostd_secret_check_name(secret->name, error) ||
        !hostd_secret_check_value(secret->value, secret->value ? strlen(secret->value) : 0,
                                  error) ||
        !hostd_secret_check_header(secret->header, error) ||
        !hostd_secret_check_format(secret->format, error) ||
        !hostd_secret_check_env(secret->env, error))
        return FALSE;
    if (secret->hosts == NULL || secret->hosts[0] == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' needs at least one --host",
                        secret->name);
    for (char **host = secret->hosts; *host != NULL; host++) {
        g_autofree char *normal = hostd_secret_normalise_host(*host, error);
        if (normal == NULL)
            return FALSE;
    }
    return TRUE;
}

gboolean
hostd_secrets_store_save(const char *dir, const HostdSecret *secret, gboolean must_be_new,
                         GError **error)
{
    if (!check_secret(secret, error))
        return FALSE;
    g_autofree char *path = g_build_filename(dir, secret->name, NULL);
    if (must_be_new && g_file_test(path, G_FILE_TEST_EXISTS))
        return vm_throw(error, VM_ERROR_EXISTS, "secret '%s' already exists", secret->name);

    g_autoptr(GPtrArray) hosts = g_ptr_array_new_with_free_func(g_free);
    for (char **host = secret->hosts; *host != NULL; host++)
        g_ptr_array_add(hosts, hostd_secret_normalise_host(*host, NULL));
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_key_file_set_string(keyfile, GROUP, "value", secret->value);
    g_key_file_set_string_list(keyfile, GROUP, "hosts", (const char *const *)hosts->pdata,
                               hosts->len);
    g_key_file_set_string(keyfile, GROUP, "header", secret->header);
    g_key_file_set_string(keyfile, GROUP, "format", secret->format);
    g_key_file_set_string(keyfile, GROUP, "env", secret->env);
    gsize length = 0;
    g_autofree char *text = g_key_file_to_data(keyfile, &length, NULL);
    gboolean ok = vm_file_write_atomic(path, text, (gssize)length, 0600, error);
    explicit_bzero(text, length);
    return ok;
}

HostdSecret *
hostd_secrets_store_load(const char *dir, const char *name, GError **error)
{
    if (!hostd_secret_check_name(name, error))
        return NULL;
    g_autofree char *path = g_build_filename(dir, name, NULL);
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no secret '%s'", name);
        return NULL;
    }
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autoptr(GError) local = NULL;
    if (!g_key_file_load_from_file(keyfile, path, G_KEY_FILE_NONE, &local)) {
        vm_throw(error, VM_ERROR_IO, "cannot read secret '%s': %s", name, local->message);
        return NULL;
    }
    g_autoptr(HostdSecret) secret = g_new0(HostdSecret, 1);
    secret->name = g_strdup(name);
    secret->value = g_key_file_get_string(keyfile, GROUP, "value", NULL);
    secret->hosts = g_key_file_get_string_list(keyfile, GROUP, "hosts", NULL, NULL);
    secret->header = g_key_file_get_string(keyfile, GROUP, "header", NULL);
    secret->format = g_key_file_get_string(keyfile, GROUP, "format", NULL);
    secret->env = g_key_file_get_string(keyfile, GROUP, "env", NULL);
    g_autoptr(GError) bad = NULL;
    if (!check_secret(secret, &bad)) {
        vm_throw(error, VM_ERROR_IO, "secret file of '%s' is damaged: %s", name, bad->message);
        return NULL;
    }
    return g_steal_pointer(&secret);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char **
hostd_secrets_store_list(const char *dir, GError **error)
{
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) local = NULL;
    g_autoptr(GDir) handle = g_dir_open(dir, 0, &local);
    if (handle == NULL && !g_error_matches(local, G_FILE_ERROR, G_FILE_ERROR_NOENT)) {
        vm_throw(error, VM_ERROR_IO, "cannot list %s: %s", dir, local->message);
        return NULL;
    }
    for (const char *entry; handle != NULL && (entry = g_dir_read_name(handle)) != NULL;) {
        g_autofree char *path = g_build_filename(dir, entry, NULL);
        /* Temporary files of an interrupted write and the grants directory are not secrets. */
        if (hostd_secret_check_name(entry, NULL) && g_file_test(path, G_FILE_TEST_IS_REGULAR))
            g_ptr_array_add(names, g_strdup(entry));
    }
    g_ptr_array_sort(names, compare_names);
    g_ptr_array_add(names, NULL);
    return (char **)g_ptr_array_free(g_steal_pointer(&names), FALSE);
}

gboolean
hostd_secrets_store_remove(const char *dir, const char *name, GError **error)
{
    if (!hostd_secret_check_name(name, error))
        return FALSE;
    g_autofree char *path = g_build_filename(dir, name, NULL);
    if (unlink(path) != 0) {
        if (errno == ENOENT)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "no secret '%s'", name);
        return vm_throw_errno(error, errno, "cannot remove secret '%s'", name);
    }
    return TRUE;
}
