/* Agent ids: the uid (gid equal) each agent's QEMU runs as, picked from the configured range
 * (agent-ids in hostd.conf); the ids of its SSH, egress and in-guest API workers, derived from
 * it in a second range (worker-ids); and the file modes and POSIX ACLs that give one id, and no
 * other, its files. A leaf: it knows records, not agents' lifecycles (hostd-confine.h does). */
#pragma once

#include <glib.h>
#include <sys/types.h>

G_BEGIN_DECLS

/* The lowest id in [@min, @max] that no record in @records (HostdAgentRecord*) has as its
 * agent_id, that is not in @held (a set of GUINT_TO_POINTER ids, or NULL) and that names no
 * user or group of the host. Fails with VM_ERROR_NO_RESOURCES, naming the range, when every id
 * is taken. */
gboolean hostd_ids_pick(const GPtrArray *records, GHashTable *held, guint min, guint max,
                        guint *ret_id, GError **error);

/* The workers of an agent (hostd-confine.h picks whom they run as). */
typedef enum {
    HOSTD_WORKER_SSH,    /* its SSH client (vm-ssh-worker) */
    HOSTD_WORKER_EGRESS, /* its egress proxy (vm-egress-worker) */
    HOSTD_WORKER_API,    /* its in-guest API (vm-guest-api-worker) */
} HostdWorkerKind;

/* The id (uid, gid equal) worker @kind of the agent in slot @slot runs as, in the worker range
 * [@min, @max]: its first third holds the SSH workers, its second the egress workers, its last
 * the in-guest API workers, slot s the s-th id of each. @slot must be below
 * HOSTD_IDS_WORKER_SLOTS(@min, @max). Can't fail. */
#define HOSTD_IDS_WORKER_KINDS           3
#define HOSTD_IDS_WORKER_SLOTS(min, max) (((max) - (min) + 1) / HOSTD_IDS_WORKER_KINDS)
guint hostd_ids_worker(guint min, guint max, guint slot, HostdWorkerKind kind);

/* Whether no user and no group of the host has an id in [@min, @max] (every entry of the user
 * and group databases is read once). Fails with VM_ERROR_INVALID_ARGUMENT naming @key, the range
 * and the first user or group found in it. Not thread-safe (getpwent()): for start-up. */
gboolean hostd_ids_range_check_free(const char *key, guint min, guint max, GError **error);

/* Whether @id names a user or a group of the host: such an id is someone's, never an agent's
 * nor a worker's. Can't fail. */
gboolean hostd_ids_named(guint id);

/* Gives @path (never followed when it is a symbolic link) owner @uid, group @gid and mode @mode,
 * and, when @n_readers > 0, an access ACL that adds each of @readers (uids, any order, duplicates
 * allowed) with the permissions @reader_perm (an octal digit: 4 read, 1 traverse) besides the
 * owner, the group and the rest as @mode has them. With no readers any ACL is removed. Fails
 * with VM_ERROR_IO naming the path. */
gboolean hostd_ids_own(const char *path, uid_t uid, gid_t gid, mode_t mode, const guint *readers,
                       guint n_readers, guint reader_perm, GError **error);

/* The users @path's access ACL names (uids, ascending), into @ret_readers; none when it has no
 * ACL. For tests and checks. Fails with VM_ERROR_IO. */
gboolean hostd_ids_read_acl(const char *path, GArray *ret_readers, GError **error);

G_END_DECLS
