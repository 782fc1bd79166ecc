/* The per-proxy cache of minted leaf certificates. */
#include "vm-egress-mint.h"
#include "vm-egress-ca.h"

struct VmEgressMintCache {
    GMutex lock;
    char *ca_cert_pem;
    char *ca_key_pem;
    guint max_entries;
    GHashTable *entries; /* host -> char *[2] {cert, key} as a GStrv */
};

VmEgressMintCache *
vm_egress_mint_cache_new(const char *ca_cert_pem, const char *ca_key_pem, guint max_entries)
{
    VmEgressMintCache *cache = g_new0(VmEgressMintCache, 1);

    g_mutex_init(&cache->lock);
    cache->ca_cert_pem = g_strdup(ca_cert_pem);
    cache->ca_key_pem = g_strdup(ca_key_pem);
    cache->max_entries = MAX(max_entries, 1);
    cache->entries =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_strfreev);
    return cache;
}

void
vm_egress_mint_cache_free(VmEgressMintCache *cache)
{
    if (cache == NULL)
        return;
    g_hash_table_unref(cache->entries);
    g_free(cache->ca_cert_pem);
    g_free(cache->ca_key_pem);
    g_mutex_clear(&cache->lock);
    g_free(cache);
}

gboolean
vm_egress_mint_cache_get(VmEgressMintCache *cache, const char *host, char **ret_cert_pem,
                         char **ret_key_pem, GError **error)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&cache->lock);
    char **entry = g_hash_table_lookup(cache->entries, host);

    *ret_cert_pem = NULL;
    *ret_key_pem = NULL;
    if (entry == NULL) {
        g_autofree char *cert_pem = NULL;
        g_autofree char *key_pem = NULL;
        if (!vm_egress_ca_mint(cache->ca_cert_pem, cache->ca_key_pem, host, &cert_pem, &key_pem,
                               error))
            return FALSE;
        if (g_hash_table_size(cache->entries) >= cache->max_entries)
            g_hash_table_remove_all(cache->entries);
        entry = g_new0(char *, 3);
        entry[0] = g_steal_pointer(&cert_pem);
        entry[1] = g_steal_pointer(&key_pem);
        g_hash_table_insert(cache->entries, g_strdup(host), entry);
    }
    *ret_cert_pem = g_strdup(entry[0]);
    *ret_key_pem = g_strdup(entry[1]);
    return TRUE;
}
