#include "hostd-checkpoint.h"
#include "hostd-checkpoint-private.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-confine.h"
#include "hostd-fence.h"
#include "hostd-guest-agent.h"
#include "hostd-guest.h"
#include "hostd-resources.h"
#include "vm-checkpoint.h"
#include "vm-domain-read.h"
#include "vm-qemu-img.h"
#include "vm-retention.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-save-image.h"
#include "vm-spawn.h"
#include "vm-util.h"

/* How long a checkpoint waits for the guest's sync before it freezes anyway. */
#define HOSTD_CHECKPOINT_SYNC_TIMEOUT_MS 10000

/* Run in the guest before its filesystems are frozen: syncs, and turns on expedited RCU grace
 * periods, printing what the setting was. FIFREEZE waits for three grace periods (one per level
 * of the freeze) and the guest's writes wait through the last two: under TCG a normal grace
 * period takes ~15 ms, an expedited one well under a millisecond (measured: FIFREEZE of an idle,
 * synced root 50-56 ms, and 3-7 ms expedited). An expedited grace period interrupts each vCPU
 * rather than waiting for it; what the freeze does is the same. Put back after the thaw. */
#define HOSTD_RCU_EXPEDITED "/sys/kernel/rcu_expedited"
#define HOSTD_CHECKPOINT_PREPARE_SCRIPT                                                            \
    "f=" HOSTD_RCU_EXPEDITED                                                                       \
    "; read v 2>/dev/null < $f && echo $v && { echo 1 > $f; } 2>/dev/null; "                       \
    "exec /bin/sync"

#define HOSTD_CHECKPOINT_MIN_FREE (256ULL * 1024 * 1024)
#define HOSTD_BLOCK_JOB_TIMEOUT_S 600

/* A step after the journal failed (@error is set, saying why): drops the journal, in memory and
 * on disk. Clearing it on disk is tried twice; should both fail (a full disk, an I/O error), the
 * stale journal would refuse every later operation on the agent until start-up repairs it, so
 * the operator learns it at once: @error gets the save's failure added, and hostd's log says it
 * on a line of its own. */
static void
hostd_checkpoint_abort_journal(HostdContext *ctx, const HostdAgentRecord *r, VmCheckpointSet *set,
                               GError **error)
{
    g_autoptr(GError) first = NULL;
    g_autoptr(GError) second = NULL;

    vm_checkpoint_set_abort(set);
    if (vm_checkpoint_set_save(set, &first) || vm_checkpoint_set_save(set, &second))
        return;
    g_autofree char *what =
        g_strdup_printf("the checkpoint journal of agent '%s' could not be cleared (%s); it "
                        "refuses checkpoint operations on the agent until hostd restarts and "
                        "repairs it",
                        r->name, second->message);
    if (ctx->log != NULL)
        ctx->log(what);
    if (error != NULL && *error != NULL) {
        char *old = (*error)->message;
        (*error)->message = g_strdup_printf("%s; and %s", old, what);
        g_free(old);
    }
}

/* Saves the record of a committed operation whose switch has already happened. A failed save is
 * tried once more, as a full disk may have room again once the failed temporary file is gone;
 * when both fail, the journal stays on disk and the error says so at once (start-up repairs it
 * from which file the domain uses). */
static gboolean
hostd_checkpoint_commit_save(HostdContext *ctx, const HostdAgentRecord *r, VmCheckpointSet *set,
                             GError **error)
{
    g_autoptr(GError) first = NULL;
    g_autoptr(GError) second = NULL;

    if (vm_checkpoint_set_save(set, &first) || vm_checkpoint_set_save(set, &second))
        return TRUE;
    g_autofree char *what =
        g_strdup_printf("the checkpoint record of agent '%s' could not be saved (%s); its "
                        "journal refuses checkpoint operations on the agent until hostd restarts "
                        "and repairs it",
                        r->name, second->message);
    if (ctx->log != NULL)
        ctx->log(what);
    return vm_throw(error, VM_ERROR_IO, "%s", what);
}

/* The free-space figures tests set (hostd_checkpoint_test_space()); 0 size: the real ones. */
G_LOCK_DEFINE_STATIC(test_space);
static guint64 test_space_avail, test_space_size;

void
hostd_checkpoint_test_space(guint64 avail, guint64 size)
{
    G_LOCK(test_space);
    test_space_avail = avail;
    test_space_size = size;
    G_UNLOCK(test_space);
}

/* Free and total bytes of the filesystem of @dir, as an unprivileged user sees them free. */
static gboolean
hostd_checkpoint_space(const char *dir, guint64 *ret_avail, guint64 *ret_size, GError **error)
{
    struct statvfs vfs;

    G_LOCK(test_space);
    *ret_avail = test_space_avail;
    *ret_size = test_space_size;
    G_UNLOCK(test_space);
    if (*ret_size != 0)
        return TRUE;
    if (statvfs(dir, &vfs) < 0)
        return vm_throw_errno(error, errno, "cannot stat %s", dir);
    *ret_avail = (guint64)vfs.f_bavail * vfs.f_frsize;
    *ret_size = (guint64)vfs.f_blocks * vfs.f_frsize;
    return TRUE;
}

/* Refuses a checkpoint of @r, before anything changes, when it would leave the filesystem of the
 * agent's directory below checkpoint-free-floor. What it takes is estimated: a disk checkpoint
 * HOSTD_CHECKPOINT_MIN_FREE (the new overlay starts empty; this is room for the writes that
 * follow it), a memory checkpoint that and the guest's whole memory (the state file holds what
 * of it the guest uses, at most all of it). Test hook: HOSTD_TEST_RESERVE_BYTES=N counts N
 * bytes fewer as free, so the VM suite can see the refusal without filling a real disk. */
static gboolean
hostd_checkpoint_check_room(HostdContext *ctx, const HostdAgentRecord *r,
                            const VmCheckpointSet *set, gboolean memory, GError **error)
{
    guint64 avail, size;
    if (!hostd_checkpoint_space(set->dir, &avail, &size, error))
        return FALSE;
    const char *reserve = g_getenv("HOSTD_TEST_RESERVE_BYTES");
    if (reserve != NULL) {
        guint64 n = g_ascii_strtoull(reserve, NULL, 10);
        avail = avail > n ? avail - n : 0;
    }
    guint64 floor = hostd_config_free_floor(ctx->config, size);
    guint64 guest_memory = memory ? (guint64)r->memory_mib << 20 : 0;
    guint64 need = HOSTD_CHECKPOINT_MIN_FREE + guest_memory;
    if (avail >= floor && avail - floor >= need)
        return TRUE;
    g_autofree char *shown = vm_format_bytes(avail);
    g_autofree char *floor_shown = vm_format_bytes(floor);
    g_autofree char *memory_shown = vm_format_bytes(guest_memory);
    return vm_throw(error, VM_ERROR_NO_RESOURCES,
                    "only %s free under %s: a checkpoint needs at least 256 MiB%s%s%s above the "
                    "host's free-space floor of %s (checkpoint-free-floor)",
                    shown, set->dir, memory ? " and room for the guest's memory (" : "",
                    memory ? memory_shown : "", memory ? ")" : "", floor_shown);
}

gboolean
hostd_checkpoint_room_for(HostdContext *ctx, const char *dir, guint64 bytes, GError **error)
{
    guint64 avail, size;
    if (!hostd_checkpoint_space(dir, &avail, &size, error))
        return FALSE;
    guint64 floor = hostd_config_free_floor(ctx->config, size);
    if (avail >= floor && avail - floor >= bytes)
        return TRUE;
    g_autofree char *shown = vm_format_bytes(avail);
    g_autofree char *floor_shown = vm_format_bytes(floor);
    g_autofree char *need = vm_format_bytes(bytes);
    return vm_throw(error, VM_ERROR_NO_RESOURCES,
                    "only %s free under %s: %s more would go below the host's free-space floor "
                    "of %s (checkpoint-free-floor)",
                    shown, dir, need, floor_shown);
}

/* The bytes @set's checkpoints take: their images and memory files, as allocated. */
static guint64
hostd_checkpoint_set_bytes(const VmCheckpointSet *set)
{
    guint64 total = 0;

    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *image = vm_checkpoint_set_path(set, c->image);

        total += hostd_file_allocated(image);
        if (c->memory != NULL) {
            g_autofree char *state = vm_checkpoint_set_path(set, c->memory);
            total += hostd_file_allocated(state);
        }
    }
    return total;
}

gboolean
hostd_checkpoint_guest_quota(HostdContext *ctx, const char *name, gboolean memory, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    g_autoptr(VmCheckpointSet) set = NULL;
    guint max = ctx->config->guest_checkpoint_max;
    guint64 quota = ctx->config->guest_checkpoint_bytes;

    if (r == NULL)
        return FALSE;
    set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    if (set->checkpoints->len >= max)
        return vm_throw(error, VM_ERROR_NO_RESOURCES,
                        "agent '%s' has %u checkpoints, the most it may have to make one from "
                        "inside (guest-checkpoint-max %u); the host can remove some "
                        "(vmctl checkpoint rm)",
                        name, set->checkpoints->len, max);
    /* The active overlay is frozen into the new checkpoint: its bytes become the checkpoint's. */
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    guint64 used = hostd_checkpoint_set_bytes(set);
    guint64 grows = hostd_file_allocated(active) + (memory ? (guint64)r->memory_mib << 20 : 0);
    if (used > quota || grows > quota - used) {
        g_autofree char *used_shown = vm_format_bytes(used);
        g_autofree char *grows_shown = vm_format_bytes(grows);
        g_autofree char *quota_shown = vm_format_bytes(quota);
        const char *with = memory ? " with the guest's memory" : "";

        return vm_throw(error, VM_ERROR_NO_RESOURCES,
                        "the checkpoints of agent '%s' take %s and one more would add %s%s, over "
                        "the %s it may fill from inside (guest-checkpoint-bytes); the host can "
                        "remove some (vmctl checkpoint rm)",
                        name, used_shown, grows_shown, with, quota_shown);
    }
    return TRUE;
}

/* The file a checkpoint image (or, for NULL, the agent's first disk) stands on. */
static char *
hostd_checkpoint_backing_path(HostdContext *ctx, const HostdAgentRecord *r,
                              const VmCheckpointSet *set, const char *parent, GError **error)
{
    if (parent != NULL) {
        const VmCheckpoint *p = vm_checkpoint_set_find(set, parent);
        return vm_checkpoint_set_path(set, p->image);
    }
    if (r->fork_base != NULL)
        return g_strdup(r->fork_base);
    if (r->warm_base != NULL)
        return g_strdup(r->warm_base);
    g_autoptr(VmImage) image = hostd_agent_image(ctx, r, error);
    return image != NULL ? g_strdup(image->disk_path) : NULL;
}

/* Who reads the header of @path, an image of @r's: @r's own id where agents have ids and the
 * file is that id's (an active overlay) or its group's (a checkpoint image), as every image the
 * agent's QEMU ever wrote is, so the reader holds no more than that QEMU does; 0, hostd itself,
 * for a file hostd made that no QEMU of the agent ever had (the agent's id cannot make one). */
static guint
hostd_checkpoint_reader(HostdContext *ctx, const HostdAgentRecord *r, const char *path)
{
    struct stat st;

    if (!ctx->agent_ids || geteuid() != 0 || r->agent_id == 0 || stat(path, &st) < 0)
        return 0;
    return st.st_uid == r->agent_id || st.st_gid == r->agent_id ? r->agent_id : 0;
}

/* A fork's chain is followed down through its sources: a chain deeper than this is refused. */
#define HOSTD_CHAIN_FORKS_MAX 64

/* One image of an agent's disk chain: its file, and who reads its header. */
typedef struct {
    char *path;
    guint reader; /* hostd_checkpoint_reader() */
} HostdChainImage;

static void
hostd_chain_image_free(gpointer data)
{
    HostdChainImage *image = data;

    g_free(image->path);
    g_free(image);
}

static void
hostd_chain_add(GPtrArray *chain, const char *path, guint reader)
{
    HostdChainImage *image = g_new0(HostdChainImage, 1);

    image->path = g_strdup(path);
    image->reader = reader;
    g_ptr_array_add(chain, image);
}

/* The disk chain of checkpoint @id of @r (NULL: of the active overlay), whose record is @set, as
 * hostd's records have it, top-down: that image first, then what each stands on (a fork's chain
 * goes on in its source's record), the last one hostd's own (the template's base image or a warm
 * image), never a file an agent wrote. Reads no image. Fails with VM_ERROR_NOT_FOUND for an
 * unknown @id or a fork's source that is gone, VM_ERROR_BAD_STATE when a fork stands on no
 * checkpoint of its source or is forked too deep, or as the records' loads. */
static GPtrArray *
hostd_checkpoint_chain(HostdContext *ctx, const HostdAgentRecord *r, const VmCheckpointSet *set,
                       const char *id, GError **error)
{
    g_autoptr(HostdAgentRecord) source = NULL;
    g_autoptr(VmCheckpointSet) source_set = NULL;
    g_autoptr(GPtrArray) chain = g_ptr_array_new_with_free_func(hostd_chain_image_free);
    const VmCheckpoint *c = id != NULL ? vm_checkpoint_set_find(set, id) : NULL;
    g_autofree char *path = vm_checkpoint_set_path(set, c != NULL ? c->image : set->active);
    const char *parent = id != NULL ? (c != NULL ? c->parent : NULL) : set->active_parent;

    if (id != NULL && c == NULL)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' has no checkpoint '%s'", r->name,
                        id),
               NULL;
    for (guint forks = 0;;) {
        hostd_chain_add(chain, path, hostd_checkpoint_reader(ctx, r, path));
        g_autofree char *below = hostd_checkpoint_backing_path(ctx, r, set, parent, error);
        if (below == NULL)
            return NULL;
        g_free(path);
        path = g_steal_pointer(&below);
        if (parent != NULL) {
            parent = vm_checkpoint_set_find(set, parent)->parent;
            continue;
        }
        if (r->fork_base == NULL) {
            hostd_chain_add(chain, path, 0);
            return g_steal_pointer(&chain);
        }
        /* The fork's first disk stands on its source's checkpoint image, whose own chain is in
         * the source's record. */
        if (++forks > HOSTD_CHAIN_FORKS_MAX)
            return vm_throw(error, VM_ERROR_BAD_STATE, "the chain of '%s' is forked too deep",
                            path),
                   NULL;
        g_autofree char *source_dir = hostd_agent_dir(ctx, r->forked_from);
        g_autoptr(HostdAgentRecord) next = hostd_agent_record_load(source_dir, error);
        if (next == NULL)
            return NULL;
        g_autoptr(VmCheckpointSet) next_set = vm_checkpoint_set_load(source_dir, error);
        if (next_set == NULL)
            return NULL;
        const VmCheckpoint *on = vm_checkpoint_set_find(next_set, r->fork_checkpoint);
        g_autofree char *on_path = on != NULL ? vm_checkpoint_set_path(next_set, on->image) : NULL;
        if (on_path == NULL || !g_str_equal(on_path, path))
            return vm_throw(error, VM_ERROR_BAD_STATE,
                            "agent '%s' stands on '%s', which is no checkpoint of '%s'", r->name,
                            path, r->forked_from),
                   NULL;
        parent = on->parent;
        g_clear_pointer(&source, hostd_agent_record_free);
        g_clear_pointer(&source_set, vm_checkpoint_set_free);
        source = g_steal_pointer(&next);
        source_set = g_steal_pointer(&next_set);
        r = source;
        set = source_set;
    }
}

/* The files of @chain from its @from'th image on, as a NULL-terminated array (free with
 * g_strfreev()). */
static char **
hostd_chain_paths(const GPtrArray *chain, guint from)
{
    g_autoptr(GPtrArray) paths = g_ptr_array_new_with_free_func(g_free);

    for (guint i = from; i < chain->len; i++)
        g_ptr_array_add(paths, g_strdup(((HostdChainImage *)chain->pdata[i])->path));
    g_ptr_array_add(paths, NULL);
    return (char **)g_ptr_array_free(g_steal_pointer(&paths), FALSE);
}

/* Checks each header of @chain but the bottom one, hostd's own, against the image the record
 * puts under it (vm_qemu_img_check()). */
static gboolean
hostd_chain_check(const GPtrArray *chain, GError **error)
{
    for (guint i = 0; i + 1 < chain->len; i++) {
        const HostdChainImage *image = chain->pdata[i];
        const HostdChainImage *below = chain->pdata[i + 1];
        if (!vm_qemu_img_check(image->path, below->path, image->reader, error))
            return FALSE;
    }
    return TRUE;
}

gboolean
hostd_checkpoint_chain_check(HostdContext *ctx, const HostdAgentRecord *r,
                             const VmCheckpointSet *set, const char *id, GError **error)
{
    g_autoptr(GPtrArray) chain = hostd_checkpoint_chain(ctx, r, set, id, error);

    return chain != NULL && hostd_chain_check(chain, error);
}

/* @r's domain XML for @set's active overlay with the chain under it from the records
 * (hostd_checkpoint_chain()), so that libvirt reads none of those headers; with @on_top, a new
 * overlay standing on the active one, for that overlay. @genid as hostd_agent_domain_xml_genid().
 */
static char *
hostd_checkpoint_domain_xml(HostdContext *ctx, const HostdAgentRecord *r,
                            const VmCheckpointSet *set, const char *on_top, const char *genid,
                            GError **error)
{
    g_autoptr(GPtrArray) chain = hostd_checkpoint_chain(ctx, r, set, NULL, error);
    if (chain == NULL)
        return NULL;
    g_auto(GStrv) below = hostd_chain_paths(chain, on_top != NULL ? 0 : 1);
    return hostd_agent_domain_xml_genid(ctx, r, NULL, on_top != NULL ? on_top : set->active, genid,
                                        (const char *const *)below, error);
}

gboolean
hostd_checkpoint_define(HostdContext *ctx, const HostdAgentRecord *r, const VmCheckpointSet *set,
                        GError **error)
{
    g_autofree char *genid = r->warm_base != NULL ? hostd_agent_genid(r) : NULL;
    g_autofree char *xml = hostd_checkpoint_domain_xml(ctx, r, set, NULL, genid, error);
    return xml != NULL && hostd_agent_define(ctx, r, xml, "cannot update the domain", error);
}

/* A safe rebase of @r's image at @path onto @base, for a stopped agent, as @r's own id where
 * agents have ids: the rebase reads the guest-written chain and writes @path, which is the
 * agent's active overlay (its id's) or one of its checkpoint images (its group's, writable by
 * that group only for the rebase's time, as for a merge). The caller checks the headers first. */
static gboolean
hostd_checkpoint_rebase(HostdContext *ctx, const HostdAgentRecord *r, const char *base,
                        const char *path, GError **error)
{
    guint uid = hostd_checkpoint_reader(ctx, r, path);

    if (uid != 0 && !hostd_confine_merging(ctx, r, TRUE, error))
        return FALSE;
    gboolean ok = vm_qemu_img_rebase(base, path, uid, error);
    if (uid != 0 && !hostd_confine_merging(ctx, r, FALSE, ok ? error : NULL))
        return FALSE;
    return ok;
}

/* Thaws what hostd_checkpoint_snapshot_live() froze: a guest left frozen stops writing, so a
 * failed thaw is tried again before it is reported. TRUE once thawed. */
static gboolean
hostd_checkpoint_thaw(virDomainPtr dom)
{
    for (int i = 0; i < 3; i++) {
        if (virDomainFSThaw(dom, NULL, 0, 0) >= 0)
            return TRUE;
        virResetLastError();
    }
    return FALSE;
}

/* The live part: an external disk-only snapshot, atomic, with the guest's filesystems frozen
 * around the switch and thawed right after it. hostd freezes and thaws itself instead of asking
 * libvirt's QUIESCE, which does the same three steps, so that @trace shows each of them (may be
 * NULL). A guest agent that does not answer only costs the freeze: the checkpoint is then
 * crash-consistent, which *ret_warning says. */
static gboolean
hostd_checkpoint_snapshot_live(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                               const char *active_path, const char *new_path, VmTrace *trace,
                               gboolean *ret_quiesced, char **ret_warning, GError **error)
{
    g_autofree char *xml = g_markup_printf_escaped(
        "<domainsnapshot><disks>"
        "<disk name='vda' snapshot='external'><driver type='qcow2'/><source file='%s'/></disk>"
        "<disk name='sda' snapshot='no'/>"
        "</disks></domainsnapshot>",
        new_path);
    unsigned int flags = VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY | VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC |
                         VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA |
                         VIR_DOMAIN_SNAPSHOT_CREATE_REUSE_EXT;

    if (!vm_qemu_img_overlay(active_path, new_path, r->disk_gib, error) ||
        !hostd_confine_overlay(ctx, r, new_path, error))
        return FALSE;
    vm_trace_mark(trace, "overlay made");
    int state = 0, reason = 0;
    g_autofree char *why = NULL;
    int frozen = -1;
    g_autofree char *expedited_before = NULL;
    /* Paused vCPUs cannot freeze anything, and nothing in the guest writes meanwhile. */
    if (virDomainGetState(dom, &state, &reason, 0) < 0 || state != VIR_DOMAIN_PAUSED) {
        hostd_guest_agent_bound(dom);
        /* The freeze flushes what the guest has not written yet, and its writes wait all that
         * time: a sync just before leaves it little to flush (after a build, up to the guest's
         * dirty limit, seconds under TCG). Best effort: the freeze flushes whatever is left. */
        const char *const sync_argv[] = {"/bin/sh", "-c", HOSTD_CHECKPOINT_PREPARE_SCRIPT, NULL};
        int sync_status = 0;
        if (!hostd_guest_agent_exec(dom, sync_argv, NULL, HOSTD_CHECKPOINT_SYNC_TIMEOUT_MS,
                                    &sync_status, &expedited_before, NULL))
            virResetLastError();
        vm_trace_mark(trace, "synced");
        frozen = virDomainFSFreeze(dom, NULL, 0, 0);
        if (frozen < 0)
            why = hostd_libvirt_take_error("no answer", NULL);
        vm_trace_mark(trace, "filesystems frozen");
    }
    g_autoptr(virDomainSnapshot) snap = virDomainSnapshotCreateXML(dom, xml, flags);
    g_autofree char *failed = snap == NULL ? hostd_libvirt_take_error("unknown", NULL) : NULL;
    vm_trace_mark(trace, "disk switched");
    gboolean thawed = frozen < 0 || hostd_checkpoint_thaw(dom);
    if (frozen >= 0)
        vm_trace_mark(trace, "thawed");
    /* What the script saw is put back (a guest that had them on keeps them), and the kernel's
     * default when it may have run but did not say (its sync outlasted the wait). */
    if (frozen >= 0 && (expedited_before == NULL || g_str_equal(expedited_before, "0\n"))) {
        if (!hostd_guest_agent_write_file(dom, HOSTD_RCU_EXPEDITED, "0\n", NULL))
            virResetLastError();
        vm_trace_mark(trace, "grace periods back");
    }
    if (snap == NULL)
        return vm_throw(error, VM_ERROR_LIBVIRT, "cannot take the checkpoint: %s", failed);
    *ret_quiesced = frozen > 0;
    if (!thawed)
        *ret_warning = g_strdup("the guest's filesystems could not be thawed after the "
                                "checkpoint: writes in the guest wait until they are "
                                "(vmctl restart fixes it)");
    else if (state != VIR_DOMAIN_PAUSED && frozen <= 0)
        *ret_warning = g_strdup_printf("the guest's filesystems were not frozen (%s): the "
                                       "checkpoint is crash-consistent",
                                       why != NULL ? why : "none to freeze");
    return TRUE;
}

/* The live part of a memory checkpoint: RAM and device state go to @memory_path, the disk to a
 * new overlay at the same instant. No freeze is needed: the saved RAM holds whatever the guest had
 * not written yet. With @live the guest runs while its RAM is copied (it stops only for the last
 * pages); without, it is paused for the whole copy. Only KVM's dirty-page tracking is trusted
 * for the live copy: under TCG a live copy now and then restores into a guest kernel that oopses
 * at once (a NULL current task in the idle loop: a page written during the copy was not sent
 * again), so there the guest pauses for the second or two the copy takes. */
static gboolean
hostd_checkpoint_snapshot_memory(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                 const char *active_path, const char *new_path,
                                 const char *memory_path, gboolean live, GError **error)
{
    g_autofree char *xml = g_markup_printf_escaped(
        "<domainsnapshot><memory snapshot='external' file='%s'/><disks>"
        "<disk name='vda' snapshot='external'><driver type='qcow2'/><source file='%s'/></disk>"
        "<disk name='sda' snapshot='no'/>"
        "</disks></domainsnapshot>",
        memory_path, new_path);
    /* hostd makes the overlay (REUSE_EXT), as for a disk-only checkpoint: libvirt would make it
     * as root, and with agent ids it gives no file to QEMU's user itself. */
    unsigned int flags = VIR_DOMAIN_SNAPSHOT_CREATE_ATOMIC |
                         VIR_DOMAIN_SNAPSHOT_CREATE_NO_METADATA |
                         VIR_DOMAIN_SNAPSHOT_CREATE_REUSE_EXT;
    if (live)
        flags |= VIR_DOMAIN_SNAPSHOT_CREATE_LIVE;
    if (!vm_qemu_img_overlay(active_path, new_path, r->disk_gib, error) ||
        !hostd_confine_overlay(ctx, r, new_path, error))
        return FALSE;
    g_autoptr(virDomainSnapshot) snap = virDomainSnapshotCreateXML(dom, xml, flags);
    if (snap == NULL)
        return hostd_libvirt_throw(error, "cannot take the memory checkpoint");
    return TRUE;
}

static GVariant *
hostd_checkpoint_to_variant(const VmCheckpointSet *set, const VmCheckpoint *c)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autofree char *image = vm_checkpoint_set_path(set, c->image);

    g_variant_builder_add(&b, "{sv}", "id", g_variant_new_string(c->id));
    g_variant_builder_add(&b, "{sv}", "created", g_variant_new_int64(c->created));
    if (c->label != NULL)
        g_variant_builder_add(&b, "{sv}", "label", g_variant_new_string(c->label));
    g_variant_builder_add(&b, "{sv}", "automatic", g_variant_new_boolean(c->automatic));
    g_autofree char *memory = c->memory != NULL ? vm_checkpoint_set_path(set, c->memory) : NULL;
    guint64 bytes = hostd_file_allocated(image) + (memory ? hostd_file_allocated(memory) : 0);
    g_variant_builder_add(&b, "{sv}", "kind", g_variant_new_string(memory ? "memory" : "disk"));
    g_variant_builder_add(&b, "{sv}", "quiesced", g_variant_new_boolean(c->quiesced));
    g_variant_builder_add(&b, "{sv}", "bytes", g_variant_new_uint64(bytes));
    if (c->parent != NULL)
        g_variant_builder_add(&b, "{sv}", "parent", g_variant_new_string(c->parent));
    g_variant_builder_add(&b, "{sv}", "current",
                          g_variant_new_boolean(g_strcmp0(set->active_parent, c->id) == 0));
    return g_variant_builder_end(&b);
}

/* @r with the CPU count and memory size of @saved, a saved state's definition (NULL: none), or a
 * copy of @r as it is when that has none: a saved state holds a VM of the sizes it was saved
 * with, which vmctl set may have changed in the record since, and libvirt refuses to load it
 * into a definition of others. The record's sizes come with the next cold boot. Can't fail. */
static HostdAgentRecord *
hostd_checkpoint_saved_sizes(const HostdAgentRecord *r, const char *saved)
{
    HostdAgentRecord *c = hostd_agent_record_copy(r);
    guint cpus, memory_mib;

    if (saved != NULL && vm_domain_read_sizes(saved, &cpus, &memory_mib, NULL)) {
        c->cpus = cpus;
        c->memory_mib = memory_mib;
    }
    return c;
}

/* A saved agent (idle save, `suspend --save`) resumes from a state file that names the disk it
 * was writing to and the chain under it. When a checkpoint freezes that file, the state must
 * name @new_file, the new overlay, or the wake would write into the checkpoint; with @new_file
 * NULL, it is made to name the set's active overlay and its chain as the record has them now.
 * Nothing to do for an agent without saved state. */
static gboolean
hostd_checkpoint_repoint_saved(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                               const VmCheckpointSet *set, const char *new_file, GError **error)
{
    if (virDomainHasManagedSaveImage(dom, 0) <= 0) {
        virResetLastError();
        return TRUE;
    }
    /* libvirt checks the generation ID too: the saved one (made new at each restore). A
     * libvirt that cannot show the saved definition gets none, and says so if it matters. */
    g_autofree char *saved = virDomainManagedSaveGetXMLDesc(dom, 0);
    if (saved == NULL)
        virResetLastError();
    g_autofree char *genid = saved != NULL ? vm_domain_read_genid(saved, NULL) : NULL;
    g_autoptr(HostdAgentRecord) sized = hostd_checkpoint_saved_sizes(r, saved);
    g_autofree char *xml = hostd_checkpoint_domain_xml(ctx, sized, set, new_file, genid, error);
    if (xml == NULL)
        return FALSE;
    if (virDomainManagedSaveDefineXML(dom, xml, 0) < 0)
        return hostd_libvirt_throw(error, new_file != NULL
                                              ? "cannot point the saved state at the new overlay"
                                              : "cannot give the saved state its disk chain");
    return TRUE;
}

VmCheckpoint *
hostd_checkpoint_create_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                               VmCheckpointSet *set, const char *label, gboolean automatic,
                               gboolean memory, char **ret_warning, GError **error)
{
    const char *new_file = NULL;
    gboolean quiesced = TRUE;
    gboolean running = hostd_libvirt_is_active(dom);
    /* With --debug, where a checkpoint's time went: one line in hostd's log. */
    g_auto(VmTrace) trace = {0};

    if (ctx->debug)
        vm_trace_init(&trace);

    if (memory && !running)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not running: a memory checkpoint needs running processes "
                        "(a disk-only checkpoint works on a stopped agent)",
                        r->name),
               NULL;
    /* A stopped agent's new overlay is made by qemu-img, which opens the active chain. */
    if (!hostd_checkpoint_check_room(ctx, r, set, memory, error) ||
        (!running && !hostd_checkpoint_chain_check(ctx, r, set, NULL, error)) ||
        !vm_checkpoint_set_begin_create(set, label, automatic, &new_file, error))
        return NULL;
    g_autofree char *memory_path =
        memory ? vm_checkpoint_set_path(set, vm_checkpoint_set_journal_memory(set)) : NULL;
    /* The journal is durable before the chain changes: a crash from here on is repaired at
     * start-up by looking at which file the domain uses. */
    if (!vm_checkpoint_set_save(set, error)) {
        vm_checkpoint_set_abort(set);
        return NULL;
    }
    hostd_crash_point("checkpoint-journaled");
    vm_trace_mark(&trace, "journal");

    g_autofree char *new_path = vm_checkpoint_set_path(set, new_file);
    g_autofree char *active_path = vm_checkpoint_set_path(set, set->active);
    gboolean ok;
    if (memory_path != NULL) {
        /* RAM and disk are taken at the same instant: consistent without a freeze. */
        ok = hostd_checkpoint_snapshot_memory(ctx, r, dom, active_path, new_path, memory_path,
                                              g_str_equal(ctx->lv->virt_type, "kvm"), error);
    } else if (running) {
        ok = hostd_checkpoint_snapshot_live(ctx, r, dom, active_path, new_path, &trace, &quiesced,
                                            ret_warning, error);
    } else {
        ok = vm_qemu_img_overlay(active_path, new_path, r->disk_gib, error) &&
             hostd_checkpoint_repoint_saved(ctx, r, dom, set, new_file, error);
    }
    if (!ok) {
        g_unlink(new_path);
        if (memory_path != NULL)
            g_unlink(memory_path);
        hostd_checkpoint_abort_journal(ctx, r, set, error);
        return NULL;
    }
    hostd_crash_point("checkpoint-switched");

    VmCheckpoint *c = vm_checkpoint_set_commit_create(set, quiesced);
    /* The record first: the switch has happened, and a journal left behind would block every
     * later operation. A stopped domain only changes through the definition; a running one
     * already writes to the new overlay, and the definition makes the next boot use it too.
     * Should defining fail, start-up repairs it (hostd_checkpoint_reconcile()). */
    if (!hostd_checkpoint_commit_save(ctx, r, set, error) ||
        !hostd_checkpoint_define(ctx, r, set, error))
        return NULL;
    /* The frozen image is read-only to the agent from now on (a running QEMU reopened it so),
     * and the new overlay is the agent's: a saved agent wakes on it without a boot. */
    g_autoptr(GError) confine_error = NULL;
    if (!hostd_confine_agent(ctx, r, &confine_error))
        hostd_context_log(ctx, "agent '%s': %s", r->name, confine_error->message);
    if (trace.phases != NULL) {
        vm_trace_mark(&trace, "recorded");
        g_autofree char *what = g_strdup_printf("checkpoint %s", r->name);
        g_autofree char *text = vm_trace_finish(&trace, what);
        hostd_context_log(ctx, "trace: %s", text);
    }
    return c;
}

GVariant *
hostd_checkpoint_create(HostdContext *ctx, const char *name, const char *label, gboolean automatic,
                        gboolean memory, char **ret_warning, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return NULL;
    VmCheckpoint *c = hostd_checkpoint_create_locked(ctx, r, dom, set, label, automatic, memory,
                                                     ret_warning, error);
    return c != NULL ? hostd_checkpoint_to_variant(set, c) : NULL;
}

GVariant *
hostd_checkpoint_list(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return NULL;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < set->checkpoints->len; i++)
        g_variant_builder_add_value(&b,
                                    hostd_checkpoint_to_variant(set, set->checkpoints->pdata[i]));
    return g_variant_builder_end(&b);
}

void
hostd_checkpoint_open_clear(HostdCheckpointOpen *o)
{
    g_clear_pointer(&o->set, vm_checkpoint_set_free);
    g_clear_pointer(&o->dom, virDomainFree);
    g_clear_pointer(&o->record, hostd_agent_record_free);
    g_clear_pointer(&o->lock, hostd_name_unlock);
    o->checkpoint = NULL;
}

gboolean
hostd_checkpoint_open(HostdContext *ctx, const char *name, const char *id,
                      HostdCheckpointOpen *ret_open, GError **error)
{
    g_auto(HostdCheckpointOpen) o = {0};

    if (!hostd_agent_lock_open(ctx, name, &o.lock, &o.record, &o.dom, error))
        return FALSE;
    o.set = vm_checkpoint_set_load(o.record->dir, error);
    if (o.set == NULL)
        return FALSE;
    o.checkpoint = vm_checkpoint_set_find(o.set, id);
    if (o.checkpoint == NULL)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' has no checkpoint '%s'", name, id);
    *ret_open = o;
    o = (HostdCheckpointOpen){0};
    return TRUE;
}

char *
hostd_checkpoint_saved_xml(HostdContext *ctx, const HostdAgentRecord *r, const VmCheckpointSet *set,
                           const char *memory_path, GError **error)
{
    /* The saved definition names the disk of that time and that host: ours names the set's
     * active overlay (and no stale <backingStore>, which libvirt would otherwise trust). libvirt
     * checks the generation ID too: the saved one (made new at each restore). */
    g_autofree char *saved = vm_save_image_read_xml(memory_path, NULL);
    g_autofree char *genid = saved != NULL ? vm_domain_read_genid(saved, NULL) : NULL;
    g_autoptr(HostdAgentRecord) sized = hostd_checkpoint_saved_sizes(r, saved);
    return hostd_checkpoint_domain_xml(ctx, sized, set, NULL, genid, error);
}

gboolean
hostd_checkpoint_rehome(HostdContext *ctx, const HostdAgentRecord *r, GHashTable *moved,
                        GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    g_autoptr(GPtrArray) images = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < set->checkpoints->len; i++)
        g_ptr_array_add(images, vm_checkpoint_set_path(
                                    set, ((VmCheckpoint *)set->checkpoints->pdata[i])->image));
    /* A recovered agent's overlay is made after its chain is rehomed (it has none yet). */
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    if (g_file_test(active, G_FILE_TEST_EXISTS))
        g_ptr_array_add(images, g_steal_pointer(&active));
    if (r->warm_base != NULL)
        g_ptr_array_add(images, g_strdup(r->warm_base));

    if (!hostd_confine_merging(ctx, r, TRUE, error))
        return FALSE;
    gboolean ok = TRUE;
    for (guint i = 0; ok && i < images->len; i++) {
        const char *path = images->pdata[i];
        /* As the agent's id, the warm layer a move brought too: it came through a client, and
         * hostd_confine_agent() made it the agent's group's as a checkpoint image is. */
        guint uid = hostd_checkpoint_reader(ctx, r, path);
        /* Read as the agent's id, the image alone: its header came from a guest's host. */
        g_autoptr(GPtrArray) info = vm_qemu_img_info_as(path, VM_QEMU_IMG_INFO_QCOW2, uid, error);
        ok = info != NULL;
        if (!ok)
            break;
        const VmQemuImgInfo *top = info->pdata[0];
        if (top->backing_filename == NULL)
            continue;
        const char *to = g_hash_table_lookup(moved, top->backing_filename);
        /* Only what the move brought or this host has for it: a header naming anything else
         * (a host file) is never written into a definition. */
        if (to == NULL) {
            ok = vm_throw(error, VM_ERROR_BAD_STATE,
                          "image %s stands on %s, which is no image of the move", path,
                          top->backing_filename);
            break;
        }
        ok = vm_qemu_img_info_check(top, path, top->backing_filename, error) &&
             vm_qemu_img_rebase_header(to, path, uid, error);
    }
    if (!hostd_confine_merging(ctx, r, FALSE, ok ? error : NULL))
        return FALSE;
    return ok;
}

gboolean
hostd_checkpoint_recover(HostdContext *ctx, const HostdAgentRecord *r, GHashTable *moved,
                         char **ret_checkpoint, gint64 *ret_created, GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    /* A journal of the source's is of files that did not come. */
    vm_checkpoint_set_abort(set);
    g_autoptr(GHashTable) kept = g_hash_table_new(g_str_hash, g_str_equal);
    for (guint i = 0; i < set->checkpoints->len;) {
        VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *image = vm_checkpoint_set_path(set, c->image);
        if (g_file_test(image, G_FILE_TEST_IS_REGULAR) &&
            (c->parent == NULL || g_hash_table_contains(kept, c->parent))) {
            /* A replica holds disks only: the agent boots. */
            g_clear_pointer(&c->memory, g_free);
            g_hash_table_add(kept, c->id);
            i++;
        } else {
            g_ptr_array_remove_index(set->checkpoints, i);
        }
    }
    if (set->checkpoints->len == 0)
        return vm_throw(error, VM_ERROR_BAD_STATE, "the replica of agent '%s' holds no checkpoint",
                        r->name);
    const VmCheckpoint *last = set->checkpoints->pdata[set->checkpoints->len - 1];
    g_autofree char *last_id = g_strdup(last->id);
    gint64 created = last->created;
    g_autofree char *last_image = vm_checkpoint_set_path(set, last->image);
    const char *new_file = NULL;
    if (!vm_checkpoint_set_begin_restore(set, last_id, &new_file, error))
        return FALSE;
    g_autofree char *new_path = vm_checkpoint_set_path(set, new_file);
    g_free(vm_checkpoint_set_commit_restore(set));
    if (!vm_checkpoint_set_save(set, error) || !hostd_checkpoint_rehome(ctx, r, moved, error) ||
        !hostd_checkpoint_chain_check(ctx, r, set, last_id, error))
        return FALSE;
    if (!vm_qemu_img_overlay(last_image, new_path, r->disk_gib, error)) {
        g_unlink(new_path);
        return FALSE;
    }
    *ret_checkpoint = g_steal_pointer(&last_id);
    *ret_created = created;
    return TRUE;
}

/* Starts the restored agent: a memory checkpoint resumes its processes from the saved state on
 * the new overlay (then the guest clock is set); a disk-only one boots. A state file that does
 * not load costs the processes, not the disk: the agent then boots from the same overlay. */
static gboolean
hostd_checkpoint_resume_or_boot(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                const VmCheckpointSet *set, const char *memory,
                                VmProgressFunc progress, gpointer progress_data, GError **error)
{
    /* The backend port hostd held while the agent was saved is QEMU's to bind now. */
    hostd_ports_release_backend(ctx, r->name);
    if (!hostd_confine_agent(ctx, r, error))
        return FALSE;
    if (memory != NULL) {
        hostd_progress(progress, progress_data, "resuming the saved processes", -1);
        g_autofree char *memory_path = vm_checkpoint_set_path(set, memory);
        /* The saved definition names the disk of that time: ours names the new overlay (and no
         * stale <backingStore>, which libvirt would otherwise trust). */
        /* libvirt checks the generation ID too: the saved one (made new at each restore). */
        g_autofree char *saved = vm_save_image_read_xml(memory_path, NULL);
        g_autofree char *genid = saved != NULL ? vm_domain_read_genid(saved, NULL) : NULL;
        g_autoptr(HostdAgentRecord) sized = hostd_checkpoint_saved_sizes(r, saved);
        g_autofree char *xml = hostd_checkpoint_domain_xml(ctx, sized, set, NULL, genid, error);
        if (xml == NULL)
            return FALSE;
        if (virDomainRestoreFlags(ctx->lv->conn, memory_path, xml, VIR_DOMAIN_SAVE_RUNNING) == 0) {
            hostd_guest_sync_clock(ctx, dom, r->name);
            return TRUE;
        }
        g_autofree char *why = hostd_libvirt_take_error("unknown error", NULL);
        g_autofree char *note =
            g_strdup_printf("the saved memory did not load (%s); booting from the disk", why);
        hostd_progress(progress, progress_data, note, -1);
    }
    hostd_progress(progress, progress_data, "booting", -1);
    if (virDomainCreate(dom) < 0)
        return hostd_libvirt_throw(error, "cannot start the domain");
    return TRUE;
}

GVariant *
hostd_checkpoint_restore(HostdContext *ctx, const char *name, const char *id, gboolean wait,
                         char **ret_undo, VmProgressFunc progress, gpointer progress_data,
                         GError **error)
{
    g_auto(HostdCheckpointOpen) o = {0};

    if (!hostd_checkpoint_open(ctx, name, id, &o, error))
        return NULL;
    /* A fenced agent's disk is not turned back either: it would run nowhere. */
    if (!hostd_fence_refuse(o.record, error))
        return NULL;
    g_autofree char *target_id = g_strdup(o.checkpoint->id);
    g_autofree char *target_memory = g_strdup(o.checkpoint->memory);
    /* The new overlay is made by qemu-img, which opens the target's chain. */
    if (!hostd_checkpoint_chain_check(ctx, o.record, o.set, target_id, error))
        return NULL;

    /* The state being thrown away is kept first, so the restore itself can be undone. */
    hostd_progress(progress, progress_data, "checkpointing the current state", -1);
    g_autofree char *undo_label = g_strdup_printf("before restore to %s", target_id);
    g_autofree char *warning = NULL;
    VmCheckpoint *undo = hostd_checkpoint_create_locked(ctx, o.record, o.dom, o.set, undo_label,
                                                        TRUE, FALSE, &warning, error);
    if (undo == NULL)
        return NULL;
    g_autofree char *undo_id = g_strdup(undo->id);

    const char *new_file = NULL;
    if (!vm_checkpoint_set_begin_restore(o.set, target_id, &new_file, error) ||
        !vm_checkpoint_set_save(o.set, error))
        return NULL;
    hostd_crash_point("restore-journaled");

    hostd_progress(progress, progress_data, "restoring the disk", -1);
    g_autofree char *new_path = vm_checkpoint_set_path(o.set, new_file);
    g_autofree char *target_image = vm_checkpoint_set_path(o.set, o.checkpoint->image);
    if (!vm_qemu_img_overlay(target_image, new_path, o.record->disk_gib, error)) {
        g_unlink(new_path);
        hostd_checkpoint_abort_journal(ctx, o.record, o.set, error);
        return NULL;
    }
    hostd_ssh_pool_forget(ctx->ssh, name);
    if (hostd_libvirt_is_active(o.dom) && !hostd_libvirt_stop(ctx->lv, o.dom, TRUE, 0, error))
        return NULL;
    /* A saved state belongs to the disk being thrown away (kept above as the undo checkpoint). */
    if (virDomainHasManagedSaveImage(o.dom, 0) > 0 && virDomainManagedSaveRemove(o.dom, 0) < 0)
        return hostd_libvirt_throw(error, "cannot drop the saved state"), NULL;
    virResetLastError();
    hostd_crash_point("restore-stopped");

    /* Commit in memory, define, then make the record durable: a crash before the save is
     * repaired at start-up because the domain already names the new file. */
    g_autofree char *old_active = vm_checkpoint_set_commit_restore(o.set);
    if (!hostd_checkpoint_define(ctx, o.record, o.set, error))
        return NULL;
    hostd_crash_point("restore-defined");
    if (!vm_checkpoint_set_save(o.set, error))
        return NULL;
    g_autofree char *old_path = vm_checkpoint_set_path(o.set, old_active);
    g_unlink(old_path);

    if (!hostd_checkpoint_resume_or_boot(ctx, o.record, o.dom, o.set, target_memory, progress,
                                         progress_data, error))
        return NULL;
    hostd_agent_mark_state_change(o.record);
    if (wait) {
        if (!hostd_agent_wait_ssh(ctx, o.record, progress, progress_data, error))
            return NULL;
        hostd_agent_emit_up(ctx, o.record);
    }
    if (ret_undo != NULL)
        *ret_undo = g_steal_pointer(&undo_id);
    return hostd_agent_to_variant(ctx, o.record);
}

/* Waits for the disk's block job (a pull or a commit below the active layer) to end. */
static gboolean
hostd_checkpoint_wait_job(virDomainPtr dom, GError **error)
{
    gint64 deadline = g_get_monotonic_time() + HOSTD_BLOCK_JOB_TIMEOUT_S * G_USEC_PER_SEC;
    for (;;) {
        virDomainBlockJobInfo info;
        int r = virDomainGetBlockJobInfo(dom, "vda", &info, 0);
        if (r < 0)
            return hostd_libvirt_throw(error, "cannot follow the merge");
        if (r == 0)
            return TRUE;
        if (g_get_monotonic_time() > deadline) {
            virDomainBlockJobAbort(dom, "vda", 0);
            return vm_throw(error, VM_ERROR_TIMEOUT, "merging the checkpoint took too long");
        }
        g_usleep(100 * 1000);
    }
}

gboolean
hostd_checkpoint_rm(HostdContext *ctx, const char *name, const char *id, GError **error)
{
    g_auto(HostdCheckpointOpen) o = {0};

    if (!hostd_checkpoint_open(ctx, name, id, &o, error))
        return FALSE;
    return hostd_checkpoint_rm_locked(ctx, o.record, o.dom, o.set, o.checkpoint, error);
}

/* Takes checkpoint @id, whose data is already in whatever stood on it, out of the record, makes
 * that durable, then deletes its image and @memory_path (its saved state, or NULL). */
static gboolean
hostd_checkpoint_drop(VmCheckpointSet *set, const char *id, const char *memory_path, GError **error)
{
    g_autofree char *image = vm_checkpoint_set_remove(set, id, error);
    if (image == NULL || !vm_checkpoint_set_save(set, error))
        return FALSE;
    g_autofree char *path = vm_checkpoint_set_path(set, image);
    if (memory_path != NULL)
        g_unlink(memory_path);
    if (g_unlink(path) < 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot remove %s", path);
    return TRUE;
}

/* Records the journaled merge as done (its child's data is in the merged checkpoint's file),
 * then deletes the child's old file and @memory_path, the merged checkpoint's saved state. */
static gboolean
hostd_checkpoint_finish_merge(VmCheckpointSet *set, const char *memory_path, GError **error)
{
    g_autofree char *old_child_image = vm_checkpoint_set_commit_merge(set);
    if (old_child_image == NULL)
        return vm_throw(error, VM_ERROR_FAILED, "no merge to finish");
    if (!vm_checkpoint_set_save(set, error))
        return FALSE;
    g_autofree char *old_path = vm_checkpoint_set_path(set, old_child_image);
    g_unlink(old_path);
    if (memory_path != NULL)
        g_unlink(memory_path);
    return TRUE;
}

/* With @source's lock held: the name of a fork whose disk reads checkpoint @id of @source (it
 * stands on @id or on a checkpoint above it), or NULL. Removing such a checkpoint would change or
 * delete an image the fork reads. */
static char *
hostd_checkpoint_fork_on(HostdContext *ctx, const HostdAgentRecord *source,
                         const VmCheckpointSet *set, const char *id)
{
    g_autoptr(GPtrArray) forks = hostd_agent_records_forked_from(ctx, source->name);
    for (guint i = 0; i < forks->len; i++) {
        const HostdAgentRecord *f = forks->pdata[i];
        /* The fork reads its checkpoint's image and every image below it. */
        for (const VmCheckpoint *c = vm_checkpoint_set_find(set, f->fork_checkpoint); c != NULL;
             c = c->parent != NULL ? vm_checkpoint_set_find(set, c->parent) : NULL) {
            if (g_str_equal(c->id, id))
                return g_strdup(f->name);
        }
    }
    return NULL;
}

gboolean
hostd_checkpoint_rm_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                           VmCheckpointSet *set, const VmCheckpoint *c, GError **error)
{
    g_autofree char *id = g_strdup(c->id);
    g_autofree char *memory_path =
        c->memory != NULL ? vm_checkpoint_set_path(set, c->memory) : NULL;
    g_autofree char *fork = hostd_checkpoint_fork_on(ctx, r, set, id);
    if (fork != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "fork '%s' stands on checkpoint %s of '%s'; remove the fork first", fork,
                        id, r->name);
    gboolean active_dependant = FALSE;
    g_auto(GStrv) dependants = vm_checkpoint_set_dependants(set, id, &active_dependant);
    guint n = g_strv_length(dependants) + (active_dependant ? 1 : 0);
    if (n > 1)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "%u checkpoints or disks stand on checkpoint %s; remove the newer ones "
                        "first",
                        n, id);

    if (n == 1) {
        g_autofree char *base = hostd_checkpoint_backing_path(ctx, r, set, c->parent, error);
        if (base == NULL)
            return FALSE;
        gboolean running = hostd_libvirt_is_active(dom);
        const VmCheckpoint *child =
            active_dependant ? NULL : vm_checkpoint_set_find(set, dependants[0]);
        g_autofree char *child_path =
            vm_checkpoint_set_path(set, child != NULL ? child->image : set->active);
        if (child == NULL && running) {
            /* Pull @id's data into the running disk, which then stands on @base. */
            if (virDomainBlockRebase(dom, "vda", base, 0, 0) < 0)
                return hostd_libvirt_throw(error, "cannot merge the checkpoint into the disk");
            if (!hostd_checkpoint_wait_job(dom, error))
                return FALSE;
        } else {
            /* A file no running QEMU has open: a safe rebase copies into it what @id held. A
             * running VM may read older checkpoint images through its chain, so that case is
             * refused above the running disk only. */
            gboolean in_running_chain = FALSE;
            g_autofree char *check_id =
                running && child != NULL ? g_strdup(set->active_parent) : NULL;
            while (check_id != NULL && !in_running_chain) {
                in_running_chain = g_str_equal(check_id, child->id);
                const VmCheckpoint *up = vm_checkpoint_set_find(set, check_id);
                g_free(check_id);
                check_id = g_strdup(up != NULL ? up->parent : NULL);
            }
            if (in_running_chain) {
                /* QEMU reads the child's image: rewriting it is not safe, but committing it
                 * down into @id's image is (nothing else stands on that one). The child then
                 * lives in @id's file, and its own file goes. From the first write on, @id's
                 * file no longer holds @id: the journal makes start-up finish the merge.
                 * QEMU rewrites the header of the one image above the child in its chain only:
                 * another standing on the child (a branch a restore left) would go on naming
                 * the file that goes, so such a merge waits until that branch is removed. */
                gboolean child_active = FALSE;
                g_auto(GStrv) above = vm_checkpoint_set_dependants(set, child->id, &child_active);
                guint n_above = g_strv_length(above) + (child_active ? 1 : 0);
                if (n_above > 1)
                    return vm_throw(error, VM_ERROR_BAD_STATE,
                                    "checkpoint %s is merged into %s while the agent runs, and "
                                    "%u checkpoints or disks stand on %s; remove the other "
                                    "branch first",
                                    id, child->id, n_above, child->id);
                g_autofree char *own_path = vm_checkpoint_set_path(set, c->image);
                if (vm_checkpoint_set_begin_merge(set, id, error) == NULL)
                    return FALSE;
                if (!vm_checkpoint_set_save(set, error)) {
                    vm_checkpoint_set_abort(set);
                    return FALSE;
                }
                hostd_crash_point("merge-journaled");
                /* QEMU writes @id's image and rewrites the header of the one above the child. */
                if (!hostd_confine_merging(ctx, r, TRUE, error)) {
                    hostd_checkpoint_abort_journal(ctx, r, set, error);
                    return FALSE;
                }
                if (virDomainBlockCommit(dom, "vda", own_path, child_path, 0, 0) < 0) {
                    hostd_libvirt_throw(error, "cannot merge the checkpoint");
                    hostd_confine_merging(ctx, r, FALSE, NULL);
                    hostd_checkpoint_abort_journal(ctx, r, set, error);
                    return FALSE;
                }
                /* Should the wait fail, the journal stays and start-up finishes the merge. */
                gboolean waited = hostd_checkpoint_wait_job(dom, error);
                if (!hostd_confine_merging(ctx, r, FALSE, waited ? error : NULL) || !waited)
                    return FALSE;
                hostd_crash_point("merge-committed");
                return hostd_checkpoint_finish_merge(set, memory_path, error);
            }
            /* The rebase opens the child's chain and writes the child: its headers first. */
            if (!hostd_checkpoint_chain_check(ctx, r, set, child != NULL ? child->id : NULL,
                                              error) ||
                !hostd_checkpoint_rebase(ctx, r, base, child_path, error))
                return FALSE;
        }
    }

    return hostd_checkpoint_drop(set, id, memory_path, error);
}

/* Whether domain XML @xml has a disk whose top image is @path. */
static gboolean
hostd_domain_xml_uses(const char *xml, const char *path)
{
    g_auto(GStrv) files = vm_domain_read_disk_files(xml, NULL);

    return files != NULL && g_strv_contains((const char *const *)files, path);
}

/* Whether the domain's persistent definition names @path; TRUE when it cannot be read. */
static gboolean
hostd_domain_uses_inactive(virDomainPtr dom, const char *path)
{
    g_autofree char *inactive = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    g_auto(GStrv) files = NULL;

    virResetLastError();
    if (inactive == NULL)
        return TRUE;
    files = vm_domain_read_disk_files(inactive, NULL);
    return files == NULL || g_strv_contains((const char *const *)files, path);
}

/* Whether the domain's definition (live when running, else persistent) names @path. */
static gboolean
hostd_domain_uses(virDomainPtr dom, const char *path)
{
    g_autofree char *xml = virDomainGetXMLDesc(dom, 0);
    g_autofree char *inactive = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    virResetLastError();
    return (xml != NULL && hostd_domain_xml_uses(xml, path)) ||
           (inactive != NULL && hostd_domain_xml_uses(inactive, path));
}

/* Whether @path is in the backing chain of @set's active overlay as the images' headers say now
 * (a merge hostd died in may or may not have rewritten them). The headers are read one at a
 * time, never a chain, and followed only through @r's own files: its checkpoint images and what
 * its first disk stands on; an image naming any other file, or with a data file, is refused. */
static gboolean
hostd_chain_holds(HostdContext *ctx, const HostdAgentRecord *r, const VmCheckpointSet *set,
                  const char *path, gboolean *ret_holds, GError **error)
{
    g_autofree char *bottom = hostd_checkpoint_backing_path(ctx, r, set, NULL, error);
    g_autoptr(GPtrArray) known = g_ptr_array_new_with_free_func(g_free);
    g_autofree char *p = vm_checkpoint_set_path(set, set->active);

    if (bottom == NULL)
        return FALSE;
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_ptr_array_add(known, vm_checkpoint_set_path(set, c->image));
    }
    for (guint depth = 0; depth <= known->len; depth++) {
        if (g_str_equal(p, path)) {
            *ret_holds = TRUE;
            return TRUE;
        }
        g_autoptr(GPtrArray) info =
            vm_qemu_img_info_as(p, VM_QEMU_IMG_INFO_SHARED | VM_QEMU_IMG_INFO_QCOW2,
                                hostd_checkpoint_reader(ctx, r, p), error);
        if (info == NULL)
            return FALSE;
        const VmQemuImgInfo *top = info->pdata[0];
        const char *next = top->backing_filename;
        gboolean ours =
            next != NULL && (g_str_equal(next, bottom) ||
                             g_ptr_array_find_with_equal_func(known, next, g_str_equal, NULL));
        if (!vm_qemu_img_info_check(top, p, ours ? next : bottom, error))
            return FALSE;
        if (g_str_equal(next, bottom))
            break;
        g_free(p);
        p = g_strdup(next);
    }
    *ret_holds = FALSE;
    return TRUE;
}

/* Finishes a merge hostd died in (hostd_checkpoint_rm_locked()), whatever point it reached:
 * - the commit finished (the child's file is out of the chain): record it;
 * - the agent runs and the child's file is still in its chain: commit again, then record it.
 *   A commit copies the child's allocated clusters down, so doing it twice, or after a partial
 *   one, gives the same file;
 * - the agent is stopped and the child's file is still in its chain: give the child what the
 *   merged checkpoint held with a safe rebase instead (reading through the child hides any
 *   clusters a partial commit wrote), then drop the merged checkpoint and its file.
 * A commit job QEMU carried on with after hostd died is waited for first. */
static gboolean
hostd_checkpoint_reconcile_merge(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                 VmCheckpointSet *set, GError **error)
{
    VmCheckpoint *child = vm_checkpoint_set_merge_child(set);
    const VmCheckpoint *merged = vm_checkpoint_set_find(set, set->pending_target);
    g_autofree char *child_path = vm_checkpoint_set_path(set, child->image);
    g_autofree char *merged_path = vm_checkpoint_set_path(set, merged->image);
    g_autofree char *active_path = vm_checkpoint_set_path(set, set->active);
    g_autofree char *memory_path =
        merged->memory != NULL ? vm_checkpoint_set_path(set, merged->memory) : NULL;
    gboolean running = dom != NULL && hostd_libvirt_is_active(dom);
    gboolean holds = TRUE;

    if (running && !hostd_checkpoint_wait_job(dom, error))
        return FALSE;
    if (!hostd_chain_holds(ctx, r, set, child_path, &holds, error))
        return FALSE;
    if (holds && running) {
        if (!hostd_confine_merging(ctx, r, TRUE, error))
            return FALSE;
        if (virDomainBlockCommit(dom, "vda", merged_path, child_path, 0, 0) < 0) {
            hostd_confine_merging(ctx, r, FALSE, NULL);
            return hostd_libvirt_throw(error, "cannot merge the checkpoint");
        }
        gboolean waited = hostd_checkpoint_wait_job(dom, error);
        if (!hostd_confine_merging(ctx, r, FALSE, waited ? error : NULL) || !waited)
            return FALSE;
    } else if (holds) {
        g_autofree char *base = hostd_checkpoint_backing_path(ctx, r, set, merged->parent, error);
        if (base == NULL || !hostd_checkpoint_chain_check(ctx, r, set, child->id, error) ||
            !hostd_checkpoint_rebase(ctx, r, base, child_path, error))
            return FALSE;
        g_autofree char *id = g_strdup(merged->id);
        vm_checkpoint_set_abort(set);
        return hostd_checkpoint_drop(set, id, memory_path, error);
    }
    return hostd_checkpoint_finish_merge(set, memory_path, error);
}

gboolean
hostd_checkpoint_reconcile(HostdContext *ctx, const HostdAgentRecord *r, GPtrArray *notes,
                           GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);
    if (set->pending == VM_CHECKPOINT_OP_NONE) {
        /* A checkpoint whose definition failed after the switch: the record is the truth. */
        g_autofree char *active_path = vm_checkpoint_set_path(set, set->active);
        if (dom == NULL || set->checkpoints->len == 0 ||
            hostd_domain_uses_inactive(dom, active_path))
            return TRUE;
        g_ptr_array_add(notes,
                        g_strdup_printf("agent '%s': redefined on its current overlay", r->name));
        return hostd_checkpoint_define(ctx, r, set, error);
    }

    if (set->pending == VM_CHECKPOINT_OP_MERGE) {
        if (!hostd_checkpoint_reconcile_merge(ctx, r, dom, set, error))
            return FALSE;
        g_ptr_array_add(notes,
                        g_strdup_printf("agent '%s': finished an interrupted merge", r->name));
        return TRUE;
    }

    g_autofree char *new_path = vm_checkpoint_set_path(set, set->pending_file);
    gboolean switched = dom != NULL && hostd_domain_uses(dom, new_path);
    const char *what = set->pending == VM_CHECKPOINT_OP_CREATE ? "checkpoint" : "restore";

    if (!switched) {
        g_unlink(new_path);
        if (set->pending_memory != NULL) {
            g_autofree char *memory_path = vm_checkpoint_set_path(set, set->pending_memory);
            g_unlink(memory_path);
        }
        vm_checkpoint_set_abort(set);
        g_ptr_array_add(notes,
                        g_strdup_printf("agent '%s': rolled back an unfinished %s", r->name, what));
        return vm_checkpoint_set_save(set, error);
    }
    if (set->pending == VM_CHECKPOINT_OP_CREATE) {
        /* Whether the freeze happened is unknown: say crash-consistent. */
        vm_checkpoint_set_commit_create(set, FALSE);
    } else {
        g_autofree char *old = vm_checkpoint_set_commit_restore(set);
        g_autofree char *old_path = vm_checkpoint_set_path(set, old);
        g_unlink(old_path);
    }
    g_ptr_array_add(notes,
                    g_strdup_printf("agent '%s': finished an interrupted %s", r->name, what));
    return hostd_checkpoint_define(ctx, r, set, error) && vm_checkpoint_set_save(set, error);
}

gboolean
hostd_checkpoint_before_save(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                             GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    g_autofree char *warning = NULL;
    VmCheckpoint *fresh = hostd_checkpoint_create_locked(ctx, r, dom, set, HOSTD_BEFORE_SAVE_LABEL,
                                                         TRUE, FALSE, &warning, error);
    if (fresh == NULL)
        return FALSE;
    g_autofree char *fresh_id = g_strdup(fresh->id);

    /* Only the newest of these is kept, so an agent that sleeps often grows no chain. One that
     * others stand on (a restore branched from it) stays until those go. */
    g_autoptr(GPtrArray) older = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        if (c->automatic && g_strcmp0(c->label, HOSTD_BEFORE_SAVE_LABEL) == 0 &&
            !g_str_equal(c->id, fresh_id))
            g_ptr_array_add(older, g_strdup(c->id));
    }
    for (guint i = 0; i < older->len; i++) {
        const VmCheckpoint *c = vm_checkpoint_set_find(set, older->pdata[i]);
        if (c != NULL)
            hostd_checkpoint_rm_locked(ctx, r, dom, set, c, NULL);
    }
    return TRUE;
}

gboolean
hostd_checkpoint_periodic(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                          GError **error)
{
    if (r->checkpoint_every_s == 0)
        return TRUE;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;

    gint64 newest = r->created;
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        if (c->automatic && g_strcmp0(c->label, HOSTD_PERIODIC_LABEL) == 0)
            newest = MAX(newest, c->created);
    }
    if (g_get_real_time() / G_USEC_PER_SEC - newest < (gint64)r->checkpoint_every_s)
        return TRUE;

    g_autofree char *warning = NULL;
    if (hostd_checkpoint_create_locked(ctx, r, dom, set, HOSTD_PERIODIC_LABEL, TRUE, FALSE,
                                       &warning, error) == NULL)
        return FALSE;

    /* Retention: the newest `keep` automatic checkpoints, plus the oldest of each recent hour
     * and day, stay; the rest are merged away, oldest first. Manual ones are the user's; the
     * before-save one has its own rule; one that a fork or a branch stands on stays until those
     * go (the merge refuses). */
    g_autoptr(GArray) entries = g_array_new(FALSE, TRUE, sizeof(VmRetentionEntry));
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        VmRetentionEntry e = {
            .id = c->id,
            .created = c->created,
            .automatic = c->automatic && g_strcmp0(c->label, HOSTD_BEFORE_SAVE_LABEL) != 0,
        };
        g_array_append_val(entries, e);
    }
    VmRetentionPolicy policy = {
        .keep = MAX(r->checkpoint_keep, 1),
        .hourly = r->checkpoint_hourly,
        .daily = r->checkpoint_daily,
    };
    g_autoptr(GPtrArray) drop =
        vm_retention_select((const VmRetentionEntry *)(gpointer)entries->data, entries->len,
                            g_get_real_time() / G_USEC_PER_SEC, &policy);
    for (guint i = 0; i < drop->len; i++) {
        const VmCheckpoint *c = vm_checkpoint_set_find(set, drop->pdata[i]);
        if (c != NULL)
            hostd_checkpoint_rm_locked(ctx, r, dom, set, c, NULL);
    }
    return TRUE;
}

GVariant *
hostd_agent_set_checkpoints(HostdContext *ctx, const char *name, gboolean never, guint every_s,
                            guint keep, gint hourly, gint daily, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!never && every_s != 0 && every_s < 5)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "checkpoints every %us: at least 5 s",
                        every_s),
               NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    r->checkpoint_every_s = never ? 0 : every_s;
    r->checkpoint_keep = keep != 0 ? keep : 10;
    if (hourly >= 0)
        r->checkpoint_hourly = (guint)hourly;
    if (daily >= 0)
        r->checkpoint_daily = (guint)daily;
    if (!hostd_agent_record_save(r, error))
        return NULL;
    return hostd_agent_to_variant(ctx, r);
}

static void
hostd_checkpoint_agent_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                 GPtrArray *notes)
{
    g_autoptr(GError) local_error = NULL;

    if (dom != NULL && !hostd_checkpoint_reconcile(ctx, r, notes, &local_error))
        g_ptr_array_add(notes, g_strdup_printf("agent '%s': %s", r->name, local_error->message));
}

/* Whether @named, the chain a definition gives libvirt (vm_domain_read_disk_chain()), is
 * @chain's: the same images in the same order. libvirt may list more below the bottom one, which
 * it read from hostd's own image. */
static gboolean
hostd_chain_named(const GPtrArray *chain, const char *const *named)
{
    guint n = g_strv_length((char **)named);

    if (n < chain->len)
        return FALSE;
    for (guint i = 0; i < chain->len; i++) {
        if (!g_str_equal(((HostdChainImage *)chain->pdata[i])->path, named[i]))
            return FALSE;
    }
    return TRUE;
}

/* Makes the definition libvirt will start @dom from (a saved state's, or the persistent one)
 * name @chain, the record's, when it does not: defined before this chain was known to it (an
 * older hostd, a checkpoint removed while stopped or saved, an agent given its id). A saved
 * state whose definition libvirt cannot show is left as it is. */
static gboolean
hostd_checkpoint_define_chain(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                              const VmCheckpointSet *set, const GPtrArray *chain, GError **error)
{
    gboolean saved = virDomainHasManagedSaveImage(dom, 0) > 0;
    g_autofree char *xml = saved ? virDomainManagedSaveGetXMLDesc(dom, 0)
                                 : virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);
    if (xml == NULL) {
        if (saved) {
            virResetLastError();
            return TRUE;
        }
        return hostd_libvirt_throw(error, "cannot read the domain's definition");
    }
    g_auto(GStrv) named = vm_domain_read_disk_chain(xml, error);
    if (named == NULL)
        return FALSE;
    if (hostd_chain_named(chain, (const char *const *)named))
        return TRUE;
    return saved ? hostd_checkpoint_repoint_saved(ctx, r, dom, set, NULL, error)
                 : hostd_checkpoint_define(ctx, r, set, error);
}

gboolean
hostd_checkpoint_boot_check(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                            GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    g_autoptr(GPtrArray) chain = hostd_checkpoint_chain(ctx, r, set, NULL, error);
    return chain != NULL && hostd_chain_check(chain, error) &&
           (dom == NULL || hostd_checkpoint_define_chain(ctx, r, dom, set, chain, error));
}

/* Before a stopped agent boots: no QEMU of it runs, so the headers checked stay as they are
 * until QEMU, as the agent's id, opens the images. A running one (resumed by start) is left
 * alone. */
static gboolean
hostd_checkpoint_agent_starting(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);

    if (dom != NULL && hostd_libvirt_is_active(dom))
        return TRUE;
    return hostd_checkpoint_boot_check(ctx, r, dom, error);
}

/* Every definition of the agent's domain built for the record's active overlay names the chain
 * under it (a new agent's, a fork's, one given an id); a caller that gave one keeps its own. A
 * record that cannot be read gives none: libvirt then reads the headers, which
 * hostd_checkpoint_boot_check() checks before each start. */
static void
hostd_checkpoint_agent_domain(HostdContext *ctx, const HostdAgentRecord *r, VmDomainSpec *spec,
                              GPtrArray *keep)
{
    if (spec->backing_chain != NULL)
        return;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, NULL);
    g_autofree char *active = set != NULL ? vm_checkpoint_set_path(set, set->active) : NULL;
    if (active == NULL || !g_str_equal(active, spec->disk_path))
        return;
    g_autoptr(GPtrArray) chain = hostd_checkpoint_chain(ctx, r, set, NULL, NULL);
    if (chain == NULL)
        return;
    char **below = hostd_chain_paths(chain, 1);
    for (char **p = below; *p != NULL; p++)
        g_ptr_array_add(keep, *p);
    g_ptr_array_add(keep, below);
    spec->backing_chain = (const char *const *)below;
}

const HostdComponent hostd_checkpoint_component = {
    .name = "checkpoint",
    .agent_domain = hostd_checkpoint_agent_domain,
    .agent_starting = hostd_checkpoint_agent_starting,
    .agent_reconcile = hostd_checkpoint_agent_reconcile,
};
