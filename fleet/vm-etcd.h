/* A small etcd v3 client over etcd's own JSON gateway (HTTP/1.1 POST /v3/...).
 *
 * etcd 3.4 serves its gRPC API as JSON at /v3/ on every client URL: keys and values travel in
 * base64, 64-bit numbers as decimal strings. This client speaks the few calls the fleet needs
 * (range, put, delete, txn, lease grant/keepalive/revoke), one libcurl easy handle per call so
 * that any thread may call at any time. Endpoints are tried in turn, starting at the last one
 * that answered: a member that is down, refuses, times out or answers "unavailable" is skipped.
 * Every answer is bounded (VM_ETCD_RESPONSE_MAX) and parsed as untrusted input.
 *
 * Errors: VM_ERROR_NOT_RUNNING when no endpoint answers (the cluster is down or has lost its
 * quorum), VM_ERROR_NOT_FOUND for a lease etcd does not know, VM_ERROR_PROTOCOL for an answer
 * that is not what the API says, VM_ERROR_FAILED for an error etcd states. Library code: never
 * logs.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_ETCD_RESPONSE_MAX  (8 * 1024 * 1024) /* bytes of one answer */
#define VM_ETCD_ENDPOINTS_MAX 16
#define VM_ETCD_KEY_MAX       1024 /* bytes of a key we send or accept */
#define VM_ETCD_TIMEOUT_MS    3000 /* default bound on one call to one endpoint */
#define VM_ETCD_TXN_OPS_MAX   16   /* compares, and operations of each branch, in one txn */

typedef struct _VmEtcd VmEtcd;

/* One key as etcd holds it. */
typedef struct {
    char *key;      /* UTF-8, no NUL (keys that are not are refused as a protocol error) */
    GBytes *value;  /* never NULL */
    gint64 version; /* writes since the key was created; 0: absent */
    gint64 create_revision;
    gint64 mod_revision;
    gint64 lease; /* 0: none */
} VmEtcdKv;

void vm_etcd_kv_free(VmEtcdKv *kv);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEtcdKv, vm_etcd_kv_free)

/* A client of the cluster at @endpoints ("http://HOST:PORT" or "https://..."; 1 to
 * VM_ETCD_ENDPOINTS_MAX). @ca, @cert and @key (PEM files) are optional: @ca verifies the members'
 * certificates instead of the system's CAs, @cert and @key (both or neither) authenticate us.
 * Nothing is contacted here. Fails with VM_ERROR_INVALID_ARGUMENT for a bad endpoint or a
 * certificate without its key. */
VmEtcd *vm_etcd_new(const char *const *endpoints, const char *ca, const char *cert, const char *key,
                    GError **error);

/* Sets the bound on one call to one endpoint (connect included). Can't fail. */
void vm_etcd_set_timeout(VmEtcd *etcd, guint timeout_ms);

void vm_etcd_free(VmEtcd *etcd);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEtcd, vm_etcd_free)

/* Reads @key: *@ret_kv is the key, or NULL when it does not exist (that is success). */
gboolean vm_etcd_get(VmEtcd *etcd, const char *key, VmEtcdKv **ret_kv, GError **error);

/* Reads every key that starts with @prefix, in key order, at most @limit of them (0: no limit
 * but VM_ETCD_RESPONSE_MAX). Returns a GPtrArray of VmEtcdKv (empty when none). */
GPtrArray *vm_etcd_get_prefix(VmEtcd *etcd, const char *prefix, guint limit, GError **error);

/* Writes @value (@len bytes; -1: a string) at @key, attached to @lease (0: none). */
gboolean vm_etcd_put(VmEtcd *etcd, const char *key, const char *value, gssize len, gint64 lease,
                     GError **error);

/* Deletes @key; *@ret_deleted (may be NULL) is how many keys went (0 or 1). */
gboolean vm_etcd_delete(VmEtcd *etcd, const char *key, gint64 *ret_deleted, GError **error);

/* A transaction: compares, then the operations done when all hold, else the others. */
typedef struct _VmEtcdTxn VmEtcdTxn;

VmEtcdTxn *vm_etcd_txn_new(void);
void vm_etcd_txn_free(VmEtcdTxn *txn);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEtcdTxn, vm_etcd_txn_free)

/* Compares: @key's version equals @version (0: the key does not exist); its value equals @value;
 * its mod revision equals @revision. At most VM_ETCD_TXN_OPS_MAX (programming error beyond). */
void vm_etcd_txn_if_version(VmEtcdTxn *txn, const char *key, gint64 version);
void vm_etcd_txn_if_value(VmEtcdTxn *txn, const char *key, const char *value);
void vm_etcd_txn_if_mod_revision(VmEtcdTxn *txn, const char *key, gint64 revision);

/* Operations of the branch @success picks: a put of the string @value (@lease 0: none), a
 * delete, a read (its key comes back in vm_etcd_txn_commit()'s @ret_kvs). */
void vm_etcd_txn_put(VmEtcdTxn *txn, gboolean success, const char *key, const char *value,
                     gint64 lease);
void vm_etcd_txn_delete(VmEtcdTxn *txn, gboolean success, const char *key);
void vm_etcd_txn_get(VmEtcdTxn *txn, gboolean success, const char *key);

/* Runs @txn. *@ret_succeeded: whether the compares held. *@ret_kvs (may be NULL): the keys the
 * branch taken read, in order (a GPtrArray of VmEtcdKv; a read of an absent key adds nothing). */
gboolean vm_etcd_txn_commit(VmEtcd *etcd, const VmEtcdTxn *txn, gboolean *ret_succeeded,
                            GPtrArray **ret_kvs, GError **error);

/* Grants a lease of @ttl_s seconds; *@ret_id is its id. */
gboolean vm_etcd_lease_grant(VmEtcd *etcd, gint64 ttl_s, gint64 *ret_id, GError **error);

/* Renews lease @id; *@ret_ttl (may be NULL) is its TTL again. A lease that expired or was
 * revoked fails with VM_ERROR_NOT_FOUND. */
gboolean vm_etcd_lease_keepalive(VmEtcd *etcd, gint64 id, gint64 *ret_ttl, GError **error);

/* Revokes lease @id, deleting its keys. A lease etcd does not know is success. */
gboolean vm_etcd_lease_revoke(VmEtcd *etcd, gint64 id, GError **error);

/* The endpoints as one line ("http://a:2379, http://b:2379") for messages. Can't fail. */
const char *vm_etcd_endpoints_text(const VmEtcd *etcd);

G_END_DECLS
