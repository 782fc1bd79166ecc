/* A proxy's cache of minted leaf certificates, so each intercepted host is minted once. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct VmEgressMintCache VmEgressMintCache;

/* A cache of at most @max_entries hosts' certificates minted with the CA @ca_cert_pem/@ca_key_pem
 * (copied). Safe to use from several threads. Can't fail. */
VmEgressMintCache *vm_egress_mint_cache_new(const char *ca_cert_pem, const char *ca_key_pem,
                                            guint max_entries);
void vm_egress_mint_cache_free(VmEgressMintCache *cache);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressMintCache, vm_egress_mint_cache_free)

/* The leaf certificate and key for @host, PEM-encoded and newly allocated: minted on the first
 * call for a host, the same pair after that. When the cache is full it is emptied first (hosts a
 * guest talks to are few; a guest that walks many names only pays the minting again). Fails as
 * vm_egress_ca_mint() does. */
gboolean vm_egress_mint_cache_get(VmEgressMintCache *cache, const char *host, char **ret_cert_pem,
                                  char **ret_key_pem, GError **error);

G_END_DECLS
