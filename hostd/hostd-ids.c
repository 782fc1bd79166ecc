#include "hostd-ids.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "hostd-state.h"
#include "vm-error.h"

gboolean
hostd_ids_named(guint id)
{
    char buf[4096];
    struct passwd pwd;
    struct passwd *pw = NULL;
    struct group grp;
    struct group *gr = NULL;

    if (getpwuid_r((uid_t)id, &pwd, buf, sizeof(buf), &pw) == 0 && pw != NULL)
        return TRUE;
    return getgrgid_r((gid_t)id, &grp, buf, sizeof(buf), &gr) == 0 && gr != NULL;
}

gboolean
hostd_ids_pick(const GPtrArray *records, GHashTable *held, guint min, guint max, guint *ret_id,
               GError **error)
{
    g_autoptr(GHashTable) used = g_hash_table_new(g_direct_hash, g_direct_equal);

    g_return_val_if_fail(min != 0 && min <= max, FALSE);
    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (r->agent_id != 0)
            g_hash_table_add(used, GUINT_TO_POINTER(r->agent_id));
    }
    for (guint64 id = min; id <= max; id++) {
        if (g_hash_table_contains(used, GUINT_TO_POINTER((guint)id)) ||
            (held != NULL && g_hash_table_contains(held, GUINT_TO_POINTER((guint)id))) ||
            hostd_ids_named((guint)id))
            continue;
        *ret_id = (guint)id;
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_NO_RESOURCES,
                    "no free agent id in %u-%u (agent-ids in hostd.conf): every one is an "
                    "agent's or names a user or group",
                    min, max);
}

guint
hostd_ids_worker(guint min, guint max, guint slot, HostdWorkerKind kind)
{
    guint slots = HOSTD_IDS_WORKER_SLOTS(min, max);

    g_return_val_if_fail(min != 0 && min <= max && slot < slots, 0);
    return min + slot + (guint)kind * slots;
}

gboolean
hostd_ids_range_check_free(const char *key, guint min, guint max, GError **error)
{
    struct passwd *pw;
    struct group *gr;
    g_autofree char *found = NULL;

    /* One pass over each database: a range of 100000 ids asked one by one would read the files
     * as many times. */
    setpwent();
    while (found == NULL && (pw = getpwent()) != NULL) {
        if (pw->pw_uid >= min && pw->pw_uid <= max)
            found = g_strdup_printf("user %s (%u)", pw->pw_name, (guint)pw->pw_uid);
    }
    endpwent();
    setgrent();
    while (found == NULL && (gr = getgrent()) != NULL) {
        if (gr->gr_gid >= min && gr->gr_gid <= max)
            found = g_strdup_printf("group %s (%u)", gr->gr_name, (guint)gr->gr_gid);
    }
    endgrent();
    if (found != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s %u-%u holds the id of %s: a worker would run as someone's id; set "
                        "%s to a range of ids no user or group has",
                        key, min, max, found, key);
    return TRUE;
}

/* The kernel's POSIX ACL extended attribute (linux/posix_acl_xattr.h, which userspace does not
 * get): a version, then entries sorted by tag and, within a tag, by id; little-endian. */
#define ACL_XATTR         "system.posix_acl_access"
#define ACL_XATTR_VERSION 2u
#define ACL_TAG_USER_OBJ  0x01u
#define ACL_TAG_USER      0x02u
#define ACL_TAG_GROUP_OBJ 0x04u
#define ACL_TAG_MASK      0x10u
#define ACL_TAG_OTHER     0x20u
#define ACL_NO_ID         0xffffffffu

typedef struct __attribute__((packed)) {
    guint16 tag;
    guint16 perm;
    guint32 id;
} AclEntry;

static void
acl_add(GByteArray *acl, guint tag, guint perm, guint32 id)
{
    AclEntry e = {GUINT16_TO_LE((guint16)tag), GUINT16_TO_LE((guint16)perm), GUINT32_TO_LE(id)};
    g_byte_array_append(acl, (const guint8 *)&e, sizeof(e));
}

static gint
compare_ids(gconstpointer a, gconstpointer b)
{
    guint x = *(const guint *)a, y = *(const guint *)b;
    return x < y ? -1 : x > y;
}

gboolean
hostd_ids_own(const char *path, uid_t uid, gid_t gid, mode_t mode, const guint *readers,
              guint n_readers, guint reader_perm, GError **error)
{
    struct stat st;

    /* Agent dirs are written by hostd alone; still, a link is never followed to a file that
     * would then be given away. */
    if (lstat(path, &st) < 0)
        return vm_throw_errno(error, errno, "cannot stat %s", path);
    if (S_ISLNK(st.st_mode))
        return vm_throw(error, VM_ERROR_IO, "%s is a symbolic link", path);
    if ((st.st_uid != uid || st.st_gid != gid) &&
        fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
        return vm_throw_errno(error, errno, "cannot give %s to %u:%u", path, (guint)uid,
                              (guint)gid);
    if (n_readers == 0) {
        if (lremovexattr(path, ACL_XATTR) < 0 && errno != ENODATA && errno != ENOTSUP)
            return vm_throw_errno(error, errno, "cannot drop the ACL of %s", path);
        if (chmod(path, mode) < 0)
            return vm_throw_errno(error, errno, "cannot chmod %s", path);
        return TRUE;
    }

    g_autoptr(GArray) ids = g_array_sized_new(FALSE, FALSE, sizeof(guint), n_readers);
    g_array_append_vals(ids, readers, n_readers);
    g_array_sort(ids, compare_ids);
    g_autoptr(GByteArray) acl = g_byte_array_new();
    guint32 version = GUINT32_TO_LE(ACL_XATTR_VERSION);
    guint group = (mode >> 3) & 7;
    g_byte_array_append(acl, (const guint8 *)&version, sizeof(version));
    acl_add(acl, ACL_TAG_USER_OBJ, (mode >> 6) & 7, ACL_NO_ID);
    for (guint i = 0; i < ids->len; i++) {
        guint id = g_array_index(ids, guint, i);
        if ((i > 0 && id == g_array_index(ids, guint, i - 1)) || id == uid)
            continue;
        acl_add(acl, ACL_TAG_USER, reader_perm, id);
    }
    acl_add(acl, ACL_TAG_GROUP_OBJ, group, ACL_NO_ID);
    acl_add(acl, ACL_TAG_MASK, group | reader_perm, ACL_NO_ID);
    acl_add(acl, ACL_TAG_OTHER, mode & 7, ACL_NO_ID);
    /* The ACL sets the mode's permission bits with it (the group bits become the mask); the
     * special bits are set apart. */
    if (lsetxattr(path, ACL_XATTR, acl->data, acl->len, 0) < 0)
        return vm_throw_errno(error, errno, "cannot set the ACL of %s", path);
    return TRUE;
}

gboolean
hostd_ids_read_acl(const char *path, GArray *ret_readers, GError **error)
{
    guint8 buf[4096];
    ssize_t n = lgetxattr(path, ACL_XATTR, buf, sizeof(buf));

    if (n < 0) {
        if (errno == ENODATA || errno == ENOTSUP)
            return TRUE;
        return vm_throw_errno(error, errno, "cannot read the ACL of %s", path);
    }
    for (gsize off = sizeof(guint32); off + sizeof(AclEntry) <= (gsize)n; off += sizeof(AclEntry)) {
        AclEntry e;
        memcpy(&e, buf + off, sizeof(e));
        if (GUINT16_FROM_LE(e.tag) == ACL_TAG_USER) {
            guint id = GUINT32_FROM_LE(e.id);
            g_array_append_val(ret_readers, id);
        }
    }
    return TRUE;
}
