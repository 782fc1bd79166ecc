#include "hostd-fork.h"

#include <glib/gstdio.h>

#include "hostd-agent.h"
#include "hostd-resources.h"
#include "hostd-secrets.h"
#include "hostd-template.h"
#include "hostd-warm.h"
#include "hostd-checkpoint.h"
#include "vm-domain-read.h"
#include "vm-error.h"
#include "vm-image.h"
#include "vm-name.h"
#include "vm-template.h"

/* The first boot of a fork runs cloud-init for a new instance: hostd's seed gives it new host
 * keys, hostname and the new agent key. This drops the source's agent key, which the user's
 * authorized_keys still holds; keys the user added stay. */
static char *
hostd_fork_user_data(const HostdAgentRecord *source)
{
    return g_strdup_printf("#cloud-config\n"
                           "bootcmd:\n"
                           "  - [cloud-init-per, instance, vmctl-fork-keys, sh, -c, "
                           "'f=$(getent passwd %s | cut -d: -f6)/.ssh/authorized_keys; "
                           "if [ -f \"$f\" ]; then sed -i \"/ vmctl-%s$/d\" \"$f\"; fi']\n",
                           source->user, source->name);
}

/* With the source's lock held: the new agent's record, not yet on disk. */
static HostdAgentRecord *
hostd_fork_record_new(HostdContext *ctx, const HostdForkRequest *req,
                      const HostdAgentRecord *source, const VmCheckpointSet *set,
                      const VmCheckpoint *c)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_copy(source);
    g_free(r->dir);
    r->dir = hostd_agent_dir(ctx, req->name);
    g_free(r->name);
    r->name = g_strdup(req->name);
    g_free(r->uuid);
    r->uuid = g_uuid_string_random();
    g_free(r->phase);
    r->phase = g_strdup(HOSTD_PHASE_CREATING);
    g_free(r->mac);
    r->mac = hostd_random_mac();
    g_free(r->instance_id);
    r->instance_id = g_strdup_printf("vmctl-%s", r->uuid);
    g_free(r->forked_from);
    r->forked_from = g_strdup(source->name);
    g_free(r->fork_checkpoint);
    r->fork_checkpoint = g_strdup(c->id);
    g_free(r->fork_base);
    r->fork_base = vm_checkpoint_set_path(set, c->image);
    if (req->cpus != 0)
        r->cpus = req->cpus;
    if (req->memory_mib != 0)
        r->memory_mib = req->memory_mib;
    r->ssh_port = 0;
    r->backend_port = 0;
    /* An id of its own (hostd_agent_reserve()): never its source's, whose files it must not
     * reach but for the images it stands on. */
    r->agent_id = 0;
    r->created = g_get_real_time() / G_USEC_PER_SEC;
    r->state_since = r->created;
    /* Its domain has its own name: never a warm pool machine's its source was made of. */
    g_clear_pointer(&r->domain, g_free);
    /* A name of its own in the fleet: never its source's fence or epoch. */
    g_clear_pointer(&r->fenced, g_free);
    r->fleet_epoch = 0;
    return g_steal_pointer(&r);
}

/* Best effort, on the failure path: removes the checkpoint that was taken for the fork. */
static void
hostd_fork_drop_checkpoint(HostdContext *ctx, const char *source, const char *id)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, source, &lock, &r, &dom, NULL))
        return;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, NULL);
    const VmCheckpoint *c = set != NULL ? vm_checkpoint_set_find(set, id) : NULL;
    if (c != NULL)
        hostd_checkpoint_rm_locked(ctx, r, dom, set, c, NULL);
}

/* Best effort, on the failure path of the fork's checkpoint: a checkpoint can fail after its
 * record was saved (the domain's definition could not be written), and that checkpoint is the
 * fork's, so it goes with it. A journal left on disk is start-up's to repair. */
static void
hostd_fork_drop_recorded(HostdContext *ctx, const HostdAgentRecord *source, virDomainPtr dom,
                         const char *id)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(source->dir, NULL);
    if (set == NULL || set->pending != VM_CHECKPOINT_OP_NONE)
        return;
    const VmCheckpoint *c = vm_checkpoint_set_find(set, id);
    if (c != NULL)
        hostd_checkpoint_rm_locked(ctx, source, dom, set, c, NULL);
}

/* Whether the running @dom has @cpus vCPUs and @memory_mib MiB: its memory state is what a live
 * fork restores, and vmctl set changes the record (the next start's sizes) before the VM. */
static gboolean
hostd_fork_live_sizes_match(virDomainPtr dom, guint cpus, guint memory_mib)
{
    g_autofree char *xml = virDomainGetXMLDesc(dom, 0);
    guint live_cpus = 0, live_mib = 0;

    if (xml == NULL) {
        virResetLastError();
        return FALSE;
    }
    return vm_domain_read_sizes(xml, &live_cpus, &live_mib, NULL) && live_cpus == cpus &&
           live_mib == memory_mib;
}

GVariant *
hostd_fork(HostdContext *ctx, const HostdForkRequest *req, char **ret_checkpoint,
           VmProgressFunc progress, gpointer progress_data, GError **error)
{
    if (!vm_name_validate(req->name, error) || !vm_name_validate(req->source, error))
        return NULL;
    if (g_str_equal(req->name, req->source))
        return vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already exists", req->name), NULL;

    g_autoptr(HostdNameLock) source_lock = NULL;
    g_autoptr(HostdAgentRecord) source = NULL;
    g_autoptr(virDomain) source_dom = NULL;
    if (!hostd_agent_lock_open(ctx, req->source, &source_lock, &source, &source_dom, error))
        return NULL;
    /* Locks are always taken source first, and a fork's name does not exist yet, so two forks
     * cannot wait on each other. */
    g_autoptr(HostdNameLock) name_lock = hostd_name_lock(ctx, req->name);
    g_autofree char *dir = hostd_agent_dir(ctx, req->name);
    g_autoptr(virDomain) existing = hostd_libvirt_lookup(ctx->lv, req->name, NULL);
    if (g_file_test(dir, G_FILE_TEST_EXISTS) || existing != NULL)
        return vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already exists", req->name), NULL;
    g_auto(HostdAgentClaim) claim = {0};
    if (!hostd_agent_claim(ctx, req->name, &claim, error))
        return NULL;

    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, source->template_name, error);
    if (tpl == NULL)
        return NULL;
    g_autoptr(VmImage) image = vm_image_lookup(ctx->config->images_dir, tpl, error);
    if (image == NULL)
        return NULL;
    guint cpus = req->cpus != 0 ? req->cpus : source->cpus;
    guint memory_mib = req->memory_mib != 0 ? req->memory_mib : source->memory_mib;
    if (!hostd_check_resources(ctx, cpus, memory_mib, source->disk_gib, error))
        return NULL;

    /* A live fork runs the source's saved devices: the same machine, and a running source. */
    gboolean live = req->live;
    if (live) {
        const char *why = NULL;
        if (!hostd_libvirt_is_active(source_dom))
            why = "the source is not running";
        else if (cpus != source->cpus || memory_mib != source->memory_mib)
            why = "another CPU count or memory size was asked for";
        else if (!hostd_fork_live_sizes_match(source_dom, cpus, memory_mib))
            why = "the source's CPUs or memory were changed since it started (vmctl set)";
        if (why != NULL) {
            live = FALSE;
            hostd_context_log(ctx, "fork '%s' of '%s': booting cold: %s", req->name, req->source,
                              why);
            g_autofree char *note = g_strdup_printf("booting cold: %s", why);
            hostd_progress(progress, progress_data, note, -1);
        }
    }

    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(source->dir, error);
    if (set == NULL)
        return NULL;
    const VmCheckpoint *c = NULL;
    g_autofree char *taken = NULL;
    if (req->checkpoint != NULL) {
        c = vm_checkpoint_set_find(set, req->checkpoint);
        if (c == NULL)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' has no checkpoint '%s'",
                            req->source, req->checkpoint),
                   NULL;
    } else {
        hostd_progress(progress, progress_data, "checkpointing the source", -1);
        g_autofree char *label = g_strdup_printf("fork %s", req->name);
        g_autofree char *warning = NULL;
        g_autofree char *next_id = g_strdup_printf("c%u", set->next_seq);
        c = hostd_checkpoint_create_locked(ctx, source, source_dom, set, label, TRUE, live,
                                           &warning, error);
        if (c == NULL) {
            hostd_fork_drop_recorded(ctx, source, source_dom, next_id);
            return NULL;
        }
        taken = g_strdup(c->id);
    }
    g_autofree char *checkpoint_id = g_strdup(c->id);
    /* The fork's disk is made by qemu-img on the checkpoint, which opens its chain. */
    if (!hostd_checkpoint_chain_check(ctx, source, set, checkpoint_id, error)) {
        if (taken != NULL)
            hostd_checkpoint_rm_locked(ctx, source, source_dom, set, c, NULL);
        return NULL;
    }
    /* What the fork restores: the checkpoint's memory, on its disk (r->fork_base). */
    g_autoptr(HostdWarmImage) memory = NULL;
    if (live && c->memory != NULL) {
        memory = g_new0(HostdWarmImage, 1);
        memory->memory_path = vm_checkpoint_set_path(set, c->memory);
    } else if (live) {
        hostd_context_log(ctx, "fork '%s' of '%s': booting cold: checkpoint %s has no memory",
                          req->name, req->source, c->id);
    }

    /* Once the record is on disk the checkpoint is pinned (hostd_checkpoint_fork_on()), so the
     * source may go on with other work while the fork boots. */
    g_autoptr(HostdAgentRecord) r = hostd_fork_record_new(ctx, req, source, set, c);
    r->fleet_epoch = claim.epoch;
    r->cpus = cpus;
    r->memory_mib = memory_mib;
    if (memory != NULL) {
        /* The saved NIC carries the source's MAC; with user networking each VM has a network of
         * its own, so two may share it. */
        g_free(r->mac);
        r->mac = g_strdup(source->mac);
    }
    if (!hostd_agent_reserve(ctx, r, error)) {
        if (taken != NULL)
            hostd_checkpoint_rm_locked(ctx, source, source_dom, set, c, NULL);
        return NULL;
    }
    /* Copied while the source is locked, so that it is the source's grants as of the fork; made
     * before hostd_agent_create(), whose hooks put them into effect as for `new --secret` (the
     * proxy from the first boot, the placeholders in the seed): no sync of a guest still
     * booting. */
    if (req->grants && !hostd_secrets_fork_grants(ctx, req->source, req->name, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        if (taken != NULL)
            hostd_checkpoint_rm_locked(ctx, source, source_dom, set, c, NULL);
        return NULL;
    }
    g_clear_pointer(&source_lock, hostd_name_unlock);

    hostd_progress(progress, progress_data, "creating the fork's disk and seed", -1);
    g_autofree char *user_data = hostd_fork_user_data(source);
    if (!hostd_agent_create(ctx, r, tpl, image, memory, user_data, req->wait, progress,
                            progress_data, error)) {
        if (taken != NULL)
            hostd_fork_drop_checkpoint(ctx, req->source, taken);
        return NULL;
    }
    claim.held = FALSE;
    if (ret_checkpoint != NULL)
        *ret_checkpoint = g_steal_pointer(&checkpoint_id);
    return hostd_agent_to_variant(ctx, r);
}

/* A fork's disk reads its source's checkpoint images: they go only with the last fork. */
static gboolean
hostd_fork_agent_removing(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autoptr(GPtrArray) forks = hostd_agent_records_forked_from(ctx, r->name);
    if (forks->len == 0)
        return TRUE;
    g_autoptr(GString) names = g_string_new(NULL);
    for (guint i = 0; i < forks->len; i++) {
        const HostdAgentRecord *f = forks->pdata[i];
        g_string_append_printf(names, "%s%s", i > 0 ? ", " : "", f->name);
    }
    return vm_throw(error, VM_ERROR_BAD_STATE,
                    "agent '%s' has forks standing on its checkpoints (%s); remove them first",
                    r->name, names->str);
}

const HostdComponent hostd_fork_component = {
    .name = "fork",
    .agent_removing = hostd_fork_agent_removing,
};
