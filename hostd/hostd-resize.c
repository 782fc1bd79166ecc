#include "hostd-resize.h"

#include "hostd-agent.h"
#include "hostd-checkpoint.h"
#include "hostd-confine.h"
#include "hostd-guest.h"
#include "hostd-libvirt.h"
#include "hostd-power.h"
#include "hostd-resources.h"
#include "vm-checkpoint.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-qemu-img.h"

#include <unistd.h>

/* The guest's disk as vm-domain.c names it. */
#define RESIZE_GUEST_DISK "vda"

/* The kernel learns of a live resize from virtio's config interrupt, handled on a work queue:
 * the script waits for the new size before it grows anything. growpart says NOCHANGE (exit 1)
 * for a partition that already fills its disk. */
static const char resize_guest_script[] =
    "set -eu\n"
    "want=$1\n"
    "dev=$(findmnt -n -o SOURCE /)\n"
    "type=$(findmnt -n -o FSTYPE /)\n"
    "case $type in\n"
    "ext2|ext3|ext4) ;;\n"
    "*) echo \"the root filesystem is $type, not ext4\" >&2; exit 3 ;;\n"
    "esac\n"
    "[ -b \"$dev\" ] || { echo \"the root filesystem is on $dev, not a block device\" >&2; "
    "exit 3; }\n"
    "name=$(basename \"$(readlink -f \"$dev\")\")\n"
    "disk=$name\n"
    "part=\n"
    "if [ -e \"/sys/class/block/$name/partition\" ]; then\n"
    "    part=$(cat \"/sys/class/block/$name/partition\")\n"
    "    disk=$(basename \"$(readlink -f \"/sys/class/block/$name/..\")\")\n"
    "fi\n"
    "i=0\n"
    "while [ $(( $(cat \"/sys/class/block/$disk/size\") * 512 )) -lt \"$want\" ]; do\n"
    "    i=$((i + 1))\n"
    "    [ $i -le 100 ] || { echo \"the guest still sees the old size of $disk\" >&2; exit 3; }\n"
    "    sleep 0.1\n"
    "done\n"
    "if [ -n \"$part\" ]; then\n"
    "    command -v growpart >/dev/null || { echo \"/ is on partition $part of $disk and the "
    "guest has no growpart (cloud-guest-utils)\" >&2; exit 3; }\n"
    "    out=$(sudo -n growpart \"/dev/$disk\" \"$part\" 2>&1) || case $out in\n"
    "        *NOCHANGE*) ;;\n"
    "        *) echo \"$out\" >&2; exit 3 ;;\n"
    "    esac\n"
    "fi\n"
    "out=$(sudo -n resize2fs \"$dev\" 2>&1) || { echo \"$out\" | tail -n 2 >&2; exit 3; }\n";

const char *
hostd_resize_guest_script(void)
{
    return resize_guest_script;
}

guint
hostd_resize_target(guint current, guint absolute, guint add)
{
    if (absolute != 0)
        return absolute;
    return add > G_MAXUINT - current ? G_MAXUINT : current + add;
}

/* Grows the running guest's root filesystem to its disk of @r->disk_gib GiB. Fails with
 * VM_ERROR_SSH when the guest does not answer, VM_ERROR_FAILED with what the guest said. */
static gboolean
resize_guest_fs(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autofree char *bytes = g_strdup_printf("%" G_GUINT64_FORMAT, (guint64)r->disk_gib << 30);
    char *argv[] = {"sh", "-c", (char *)resize_guest_script, "sh", bytes, NULL};
    g_autofree char *guest_stderr = NULL;
    int status = -1;

    if (!hostd_agent_run(ctx, r, argv, -1, &status, &guest_stderr, error))
        return FALSE;
    if (status != 0)
        return vm_throw(error, VM_ERROR_FAILED, "%s",
                        guest_stderr != NULL && *g_strstrip(guest_stderr) != '\0'
                            ? guest_stderr
                            : "the guest's resize2fs failed");
    return TRUE;
}

/* Makes the persistent definition carry @r's sizes (the next cold start's). */
static gboolean
resize_define(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    g_autofree char *xml = hostd_agent_domain_xml(ctx, r, NULL, set->active, error);
    return xml != NULL && hostd_agent_define(ctx, r, xml, "cannot change the domain", error);
}

/* Grows the disk of @r (whose record already says @r->disk_gib) and says how in @changes: a
 * paused or saved agent is woken first, then the disk of a running one grows in QEMU and its
 * filesystem in the guest; a stopped one's active overlay grows with qemu-img, its headers
 * checked first as for a boot. */
static gboolean
resize_disk(HostdContext *ctx, HostdAgentRecord *r, virDomainPtr dom, GPtrArray *changes,
            GError **error)
{
    const char *state = hostd_libvirt_state_name(dom);

    if (g_str_equal(state, "paused") || g_str_equal(state, "saved")) {
        if (!hostd_power_wake_locked(ctx, r, dom, error))
            return FALSE;
        state = hostd_libvirt_state_name(dom);
    }
    if (g_str_equal(state, "running")) {
        if (virDomainBlockResize(dom, RESIZE_GUEST_DISK, (unsigned long long)r->disk_gib << 30,
                                 VIR_DOMAIN_BLOCK_RESIZE_BYTES) < 0)
            return hostd_libvirt_throw(error, "cannot grow the disk");
        g_autoptr(GError) why = NULL;
        if (resize_guest_fs(ctx, r, &why)) {
            r->grow_fs = FALSE;
            g_ptr_array_add(
                changes,
                g_strdup_printf("disk %uG: grown live, its root filesystem too", r->disk_gib));
        } else {
            hostd_context_log(ctx, "agent '%s': disk grown to %u GiB, root filesystem not: %s",
                              r->name, r->disk_gib, why->message);
            g_ptr_array_add(changes,
                            g_strdup_printf("disk %uG: grown live; its root filesystem not yet "
                                            "(%s): hostd grows it when the agent next comes up",
                                            r->disk_gib, why->message));
        }
        return TRUE;
    }
    if (!g_str_equal(state, "stopped"))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is %s: its disk grows when it is running, paused, saved or "
                        "stopped",
                        r->name, state);

    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL || !hostd_checkpoint_boot_check(ctx, r, NULL, error) ||
        !hostd_confine_agent(ctx, r, error))
        return FALSE;
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    guint uid = ctx->agent_ids && geteuid() == 0 ? r->agent_id : 0;
    if (!vm_qemu_img_resize(active, r->disk_gib, uid, error))
        return FALSE;
    g_ptr_array_add(changes,
                    g_strdup_printf("disk %uG: grown; its root filesystem grows when the agent "
                                    "next starts",
                                    r->disk_gib));
    return TRUE;
}

/* The line for a CPU count or a memory size @what (e.g. "cpus 4") that the persistent
 * definition already holds: @live when the running VM took it too; else it comes with the next
 * cold start, at once for a stopped agent (@up FALSE), after a stop for one whose VM is up or
 * saved. */
static char *
resize_live_line(const char *what, gboolean up, gboolean live, const char *name)
{
    if (live)
        return g_strdup_printf("%s: applied live", what);
    if (!up)
        return g_strdup_printf("%s: applied; the agent starts with it", what);
    return g_strdup_printf("%s: at the next start (vmctl stop %s, then vmctl start %s)", what, name,
                           name);
}

/* Whether the running domain @dom took @cpus vCPUs live: only more than it has, up to the
 * maximum it was defined with (vCPU hot-plug). */
static gboolean
resize_live_cpus(virDomainPtr dom, guint cpus)
{
    int max = virDomainGetMaxVcpus(dom);
    int now = virDomainGetVcpusFlags(dom, VIR_DOMAIN_AFFECT_LIVE);

    if (max < 0 || now < 0 || (guint)max < cpus || (guint)now >= cpus) {
        virResetLastError();
        return FALSE;
    }
    if (virDomainSetVcpusFlags(dom, cpus, VIR_DOMAIN_AFFECT_LIVE) < 0) {
        virResetLastError();
        return FALSE;
    }
    return TRUE;
}

/* Whether the running domain @dom took @memory_mib live: only more than it has now, up to the
 * maximum it was defined with (the balloon gives memory back). */
static gboolean
resize_live_memory(virDomainPtr dom, guint memory_mib)
{
    unsigned long long kib = (unsigned long long)memory_mib << 10;
    unsigned long max = virDomainGetMaxMemory(dom);
    virDomainInfo info;

    if (max == 0 || virDomainGetInfo(dom, &info) < 0 || max < kib || info.memory >= kib) {
        virResetLastError();
        return FALSE;
    }
    if (virDomainSetMemoryFlags(dom, (unsigned long)kib, VIR_DOMAIN_AFFECT_LIVE) < 0) {
        virResetLastError();
        return FALSE;
    }
    return TRUE;
}

static gboolean
resize_request_check(const HostdResizeRequest *req, GError **error)
{
    if ((req->cpus != 0 && req->cpus_add != 0) ||
        (req->memory_mib != 0 && req->memory_add_mib != 0) ||
        (req->disk_gib != 0 && req->disk_add_gib != 0))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "a size is either absolute or relative (+N), not both");
    if (req->cpus == 0 && req->cpus_add == 0 && req->memory_mib == 0 && req->memory_add_mib == 0 &&
        req->disk_gib == 0 && req->disk_add_gib == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "nothing to change: give --cpus, --memory or --disk");
    return vm_name_validate(req->name, error);
}

GVariant *
hostd_agent_set_resources(HostdContext *ctx, const HostdResizeRequest *req, char ***ret_changes,
                          GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;

    if (!resize_request_check(req, error) ||
        !hostd_agent_lock_open(ctx, req->name, &lock, &r, &dom, error))
        return NULL;
    guint cpus = hostd_resize_target(r->cpus, req->cpus, req->cpus_add);
    guint memory_mib = hostd_resize_target(r->memory_mib, req->memory_mib, req->memory_add_mib);
    guint disk_gib = hostd_resize_target(r->disk_gib, req->disk_gib, req->disk_add_gib);
    if (disk_gib < r->disk_gib)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "--disk %uG: agent '%s' has %u GiB; a disk never shrinks", disk_gib,
                        r->name, r->disk_gib),
               NULL;
    if (!hostd_check_resources(ctx, cpus, memory_mib, disk_gib, error))
        return NULL;

    /* The record first: a checkpoint's or a restore's overlay is made of the record's size, so
     * it must never be below the disk's. Put back should anything below fail. */
    g_autoptr(HostdAgentRecord) old = hostd_agent_record_copy(r);
    gboolean grow = disk_gib > r->disk_gib;
    gboolean sizes = cpus != r->cpus || memory_mib != r->memory_mib;
    r->cpus = cpus;
    r->memory_mib = memory_mib;
    r->disk_gib = disk_gib;
    r->grow_fs = r->grow_fs || grow;
    if (!hostd_agent_record_save(r, error))
        return NULL;
    g_autoptr(GPtrArray) changes = g_ptr_array_new_with_free_func(g_free);
    if ((sizes && !resize_define(ctx, r, error)) ||
        (grow && !resize_disk(ctx, r, dom, changes, error))) {
        /* Best effort: a definition that keeps the new sizes is what the record then says the
         * next start brings; the user sees the error and can ask again. A wake stays done. */
        g_free(old->wanted);
        old->wanted = g_strdup(r->wanted);
        if (hostd_agent_record_save(old, NULL) && sizes)
            resize_define(ctx, old, NULL);
        return NULL;
    }
    if (!grow && disk_gib == old->disk_gib && (req->disk_gib != 0 || req->disk_add_gib != 0))
        g_ptr_array_add(changes, g_strdup_printf("disk %uG: unchanged", disk_gib));

    gboolean running = g_str_equal(hostd_libvirt_state_name(dom), "running");
    gboolean active =
        hostd_libvirt_is_active(dom) || g_str_equal(hostd_libvirt_state_name(dom), "saved");
    if (req->cpus != 0 || req->cpus_add != 0) {
        g_autofree char *what = g_strdup_printf("cpus %u", cpus);
        gboolean live = cpus != old->cpus && running && resize_live_cpus(dom, cpus);
        g_ptr_array_add(changes, cpus == old->cpus ? g_strdup_printf("%s: unchanged", what)
                                                   : resize_live_line(what, active, live, r->name));
    }
    if (req->memory_mib != 0 || req->memory_add_mib != 0) {
        g_autofree char *what = g_strdup_printf("memory %uM", memory_mib);
        gboolean live =
            memory_mib != old->memory_mib && running && resize_live_memory(dom, memory_mib);
        g_ptr_array_add(changes, memory_mib == old->memory_mib
                                     ? g_strdup_printf("%s: unchanged", what)
                                     : resize_live_line(what, active, live, r->name));
    }
    /* The filesystem grown, or the wake's wanted state: the record as it is now. */
    g_autoptr(GError) late = NULL;
    if (!hostd_agent_record_save(r, &late))
        hostd_context_log(ctx, "agent '%s': record not updated after resizing: %s", r->name,
                          late->message);
    g_ptr_array_add(changes, NULL);
    *ret_changes = (char **)g_ptr_array_free(g_steal_pointer(&changes), FALSE);
    return hostd_agent_to_variant(ctx, r);
}

/* ---- The component */

/* Cheap for an agent whose filesystem follows its disk (no command at all). */
static void
resize_agent_up(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_autoptr(GError) error = NULL;

    if (!r->grow_fs)
        return;
    if (!resize_guest_fs(ctx, r, &error)) {
        hostd_context_log(ctx, "agent '%s': its root filesystem was not grown to its disk: %s",
                          r->name, error->message);
        return;
    }
    /* The caller's record is const and may be saved again by it: the one on disk says so. */
    ((HostdAgentRecord *)r)->grow_fs = FALSE;
    g_autoptr(HostdAgentRecord) now = hostd_agent_record_load(r->dir, &error);
    if (now == NULL)
        return;
    now->grow_fs = FALSE;
    if (!hostd_agent_record_save(now, &error))
        hostd_context_log(ctx, "agent '%s': %s", r->name, error->message);
}

const HostdComponent hostd_resize_component = {
    .name = "resize",
    .agent_up = resize_agent_up,
};
