#include "hostd-agent.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>

#include "hostd-booting.h"
#include "hostd-cluster.h"
#include "hostd-fence.h"
#include "hostd-confine.h"
#include "hostd-guest.h"
#include "hostd-keys.h"
#include "hostd-memory.h"
#include "hostd-relay.h"
#include "hostd-resources.h"
#include "hostd-serial.h"
#include "hostd-egress-presets.h"
#include "hostd-template.h"
#include "vm-checkpoint.h"
#include "vm-domain.h"
#include "vm-error.h"
#include "vm-fs.h"
#include "vm-name.h"
#include "vm-qemu-img.h"
#include "vm-seed.h"
#include "vm-trace.h"
#include "vm-util.h"

/* Starts of a new agent, each on another port when the last one found its forward's taken. */
#define HOSTD_AGENT_START_ATTEMPTS 4

#define HOSTD_STOP_TIMEOUT_S 60

/* ---------------------------------------------------------------------------------------------
 * The components' hooks, run in the order they were added */

static gboolean
hostd_agent_emit_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                          GError **error)
{
    for (guint i = 0; i < ctx->components->len; i++) {
        const HostdComponent *c = ctx->components->pdata[i];
        if (c->agent_creating != NULL && !c->agent_creating(ctx, r, tpl, error))
            return FALSE;
    }
    return TRUE;
}

/* Runs the hook at @offset (a gboolean (*)(ctx, r, error) member of HostdComponent) of every
 * component, stopping at the first failure. */
static gboolean
hostd_agent_emit(HostdContext *ctx, const HostdAgentRecord *r, gsize offset, GError **error)
{
    typedef gboolean (*Hook)(HostdContext *, const HostdAgentRecord *, GError **);
    for (guint i = 0; i < ctx->components->len; i++) {
        const HostdComponent *c = ctx->components->pdata[i];
        Hook hook = G_STRUCT_MEMBER(Hook, c, offset);
        if (hook != NULL && !hook(ctx, r, error))
            return FALSE;
    }
    return TRUE;
}

void
hostd_agent_emit_up(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);
    g_autofree char *identity = NULL, *known_hosts = NULL;
    g_auto(VmTrace) trace = {0};
    HostdSshTarget target;

    /* With --debug, each hook's time: what a new agent waits for after its guest answers. */
    if (ctx->debug)
        vm_trace_init(&trace);
    for (guint i = 0; i < ctx->components->len; i++) {
        const HostdComponent *c = ctx->components->pdata[i];
        if (c->agent_up != NULL) {
            c->agent_up(ctx, r);
            vm_trace_mark(&trace, c->name);
        }
    }
    /* It answers SSH: its session over the virtio port can be made, before its first save. */
    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    if (dom != NULL)
        hostd_serial_ensure(ctx, &target, dom);
    else
        virResetLastError();
    vm_trace_mark(&trace, "serial session");
    if (ctx->debug) {
        g_autofree char *what = g_strdup_printf("agent up %s", r->name);
        g_autofree char *text = vm_trace_finish(&trace, what);
        hostd_context_log(ctx, "trace: %s", text);
    }
}

static void
hostd_agent_emit_removed(HostdContext *ctx, const char *name)
{
    for (guint i = 0; i < ctx->components->len; i++) {
        const HostdComponent *c = ctx->components->pdata[i];
        if (c->agent_removed != NULL)
            c->agent_removed(ctx, name);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The registry */

char *
hostd_agent_dir(HostdContext *ctx, const char *name)
{
    return g_build_filename(ctx->state->agents_dir, name, NULL);
}

/* Loads the record of an existing, finished agent. */
HostdAgentRecord *
hostd_agent_load(HostdContext *ctx, const char *name, GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    g_autofree char *dir = hostd_agent_dir(ctx, name);
    g_autofree char *record = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
    if (!g_file_test(record, G_FILE_TEST_EXISTS)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s'", name);
        return NULL;
    }
    HostdAgentRecord *r = hostd_agent_record_load(dir, error);
    if (r != NULL && !g_str_equal(r->phase, HOSTD_PHASE_READY)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s' (it is still being created)", name);
        hostd_agent_record_free(r);
        return NULL;
    }
    return r;
}

GPtrArray *
hostd_agent_records_forked_from(HostdContext *ctx, const char *source)
{
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, NULL);
    GPtrArray *forks = g_ptr_array_new_with_free_func((GDestroyNotify)hostd_agent_record_free);
    for (guint i = 0; records != NULL && i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (g_strcmp0(r->forked_from, source) == 0)
            g_ptr_array_add(forks, hostd_agent_record_copy(r));
    }
    return forks;
}

/* Bytes the agent's disk files take on the host: its overlay and every checkpoint image. */
static guint64
hostd_agent_disk_bytes(const HostdAgentRecord *r)
{
    g_autoptr(GDir) dir = g_dir_open(r->dir, 0, NULL);
    const char *entry;
    guint64 total = 0;

    while (dir != NULL && (entry = g_dir_read_name(dir)) != NULL) {
        if (g_str_has_suffix(entry, ".qcow2")) {
            g_autofree char *path = g_build_filename(r->dir, entry, NULL);
            total += hostd_file_allocated(path);
        }
    }
    return total;
}

GVariant *
hostd_agent_to_variant(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autoptr(GError) local_error = NULL;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, &local_error);
    const char *state = dom != NULL ? hostd_libvirt_state_name(dom) : "missing";

    /* Stopped because the supervisor gave up restarting it: say so until `vmctl start`. */
    if (r->crashed != NULL && g_str_equal(state, "stopped"))
        state = "crashed";
    /* Another host of the fleet owns it: this copy is never started (hostd-fence.h). */
    else if (r->fenced != NULL && (dom == NULL || !hostd_libvirt_is_active(dom)))
        state = "fenced";
    /* Booted by hostd with nobody waiting (a crash restart): starting until its guest answers,
     * as a `new` or a `start` is until it returns; before and while QEMU starts (libvirt says
     * stopped, then paused) too. */
    else if ((g_str_equal(state, "running") || g_str_equal(state, "stopped") ||
              g_str_equal(state, "paused")) &&
             hostd_booting_is(ctx, r->name))
        state = "starting";

    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(r->name));
    g_variant_builder_add(&b, "{sv}", "state", g_variant_new_string(state));
    g_variant_builder_add(&b, "{sv}", "state_since", g_variant_new_int64(r->state_since));
    g_variant_builder_add(&b, "{sv}", "template", g_variant_new_string(r->template_name));
    g_variant_builder_add(&b, "{sv}", "cpus", g_variant_new_uint32(r->cpus));
    g_variant_builder_add(&b, "{sv}", "memory_mib", g_variant_new_uint32(r->memory_mib));
    g_variant_builder_add(&b, "{sv}", "disk_gib", g_variant_new_uint32(r->disk_gib));
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        g_variant_builder_add(&b, "{sv}", vm_disk_limit_field(i),
                              g_variant_new_uint32(r->disk_limits[i]));
    g_variant_builder_add(&b, "{sv}", "disk_bytes",
                          g_variant_new_uint64(hostd_agent_disk_bytes(r)));
    g_variant_builder_add(&b, "{sv}", "ssh_port", g_variant_new_uint32(r->ssh_port));
    g_variant_builder_add(&b, "{sv}", "user", g_variant_new_string(r->user));
    g_variant_builder_add(&b, "{sv}", "created", g_variant_new_int64(r->created));
    g_variant_builder_add(&b, "{sv}", "virt_type", g_variant_new_string(ctx->lv->virt_type));
    g_variant_builder_add(&b, "{sv}", "uuid", g_variant_new_string(r->uuid));
    if (r->forked_from != NULL) {
        g_variant_builder_add(&b, "{sv}", "forked_from", g_variant_new_string(r->forked_from));
        g_variant_builder_add(&b, "{sv}", "fork_checkpoint",
                              g_variant_new_string(r->fork_checkpoint));
    }
    g_autofree char *idle = NULL;
    if (r->idle_never || (r->idle_pause_s == 0 && r->idle_save_s == 0))
        idle = g_strdup("never");
    else
        idle = g_strdup_printf("pause after %us, save after %us", r->idle_pause_s, r->idle_save_s);
    g_variant_builder_add(&b, "{sv}", "idle", g_variant_new_string(idle));
    g_autofree char *periodic =
        r->checkpoint_every_s == 0
            ? g_strdup("never")
            : g_strdup_printf("every %us, keep %u + %u hourly + %u daily", r->checkpoint_every_s,
                              r->checkpoint_keep, r->checkpoint_hourly, r->checkpoint_daily);
    g_variant_builder_add(&b, "{sv}", "checkpoints", g_variant_new_string(periodic));
    if (r->wanted != NULL)
        g_variant_builder_add(&b, "{sv}", "wanted", g_variant_new_string(r->wanted));
    g_variant_builder_add(
        &b, "{sv}", "restart",
        g_variant_new_string(r->restart != NULL ? r->restart : HOSTD_RESTART_ON_CRASH));
    g_variant_builder_add(&b, "{sv}", "crashes", g_variant_new_uint32(r->crash_count));
    if (r->crashed != NULL)
        g_variant_builder_add(&b, "{sv}", "crash_reason", g_variant_new_string(r->crashed));
    if (r->fenced != NULL)
        g_variant_builder_add(&b, "{sv}", "fenced", g_variant_new_string(r->fenced));
    if (r->replicate_own)
        g_variant_builder_add(&b, "{sv}", "replicate", g_variant_new_uint32(r->replicate));
    /* In a fleet that replicates: where its newest replica is. */
    if (r->replicas != NULL && r->replicated != NULL) {
        g_autofree char *where = g_strdup_printf("%s on %s", r->replicated, r->replicas);
        g_variant_builder_add(&b, "{sv}", "replica", g_variant_new_string(where));
    }
    return g_variant_builder_end(&b);
}

void
hostd_agent_mark_state_change(HostdAgentRecord *r)
{
    r->state_since = g_get_real_time() / G_USEC_PER_SEC;
    /* A failed write loses only the timestamp; the operation itself already happened. */
    hostd_agent_record_save(r, NULL);
}

/* Sets @r's wanted state and the time of the change, in memory only. */
static void
hostd_agent_put_wanted(HostdAgentRecord *r, const char *wanted)
{
    g_free(r->wanted);
    r->wanted = g_strdup(wanted);
    if (!g_str_equal(wanted, HOSTD_WANTED_SAVED))
        r->shutdown_saved = FALSE;
    r->state_since = g_get_real_time() / G_USEC_PER_SEC;
}

void
hostd_agent_set_wanted(HostdAgentRecord *r, const char *wanted)
{
    hostd_agent_put_wanted(r, wanted);
    /* A failed write loses only the timestamp; the operation itself already happened. */
    hostd_agent_record_save(r, NULL);
}

gboolean
hostd_agent_save_wanted(HostdAgentRecord *r, const char *wanted, GError **error)
{
    g_autoptr(GError) local = NULL;

    hostd_agent_put_wanted(r, wanted);
    if (hostd_agent_record_save(r, &local))
        return TRUE;
    return vm_throw(error, vm_error_code(local), "cannot record agent '%s' as wanted %s: %s",
                    r->name, wanted, local->message);
}

/* Puts back @old, the record as it was before a change that did not happen, and tells @error
 * (the change's) so if that write fails too: the record then says what hostd could not do. */
static void
hostd_agent_save_back(const HostdAgentRecord *old, GError **error)
{
    g_autoptr(GError) local = NULL;

    if (hostd_agent_record_save(old, &local) || error == NULL || *error == NULL)
        return;
    g_prefix_error(error, "agent '%s': its record still says wanted %s (%s); ", old->name,
                   old->wanted != NULL ? old->wanted : "(none)", local->message);
}

static char *
hostd_agent_ssh_stanza(const HostdAgentRecord *r)
{
    g_autofree char *identity = hostd_agent_record_path(r, HOSTD_AGENT_KEY);
    g_autofree char *known_hosts = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);

    /* ConnectTimeout covers the banner: a connection to a saved agent waits for its wake. */
    return g_strdup_printf("Host vmctl-%s\n"
                           "  HostName 127.0.0.1\n"
                           "  Port %u\n"
                           "  User %s\n"
                           "  IdentityFile \"%s\"\n"
                           "  IdentitiesOnly yes\n"
                           "  UserKnownHostsFile \"%s\"\n"
                           "  GlobalKnownHostsFile /dev/null\n"
                           "  StrictHostKeyChecking yes\n"
                           "  HostKeyAlgorithms ssh-ed25519\n"
                           "  PasswordAuthentication no\n"
                           "  KbdInteractiveAuthentication no\n"
                           "  ConnectTimeout 60\n"
                           "  LogLevel ERROR\n",
                           r->name, r->ssh_port, r->user, identity, known_hosts);
}

/* What a warm agent's identity needs of the keys `new` made (hostd keeps the private host key
 * only in the seed otherwise) and of its seed (its grants): held in memory until the identity is
 * applied. */
typedef struct {
    char *agent_key;
    char *host_private;
    char *host_public;
    char *egress_ca_pem;     /* NULL: none */
    char *environment_block; /* NULL: none */
} HostdAgentKeys;

static void
hostd_agent_keys_clear(HostdAgentKeys *keys)
{
    g_free(keys->agent_key);
    if (keys->host_private != NULL)
        memset(keys->host_private, 0, strlen(keys->host_private));
    g_free(keys->host_private);
    g_free(keys->host_public);
    g_free(keys->egress_ca_pem);
    g_free(keys->environment_block);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(HostdAgentKeys, hostd_agent_keys_clear)

/* The agent's first disk, an overlay of r->disk_gib: a fork's stands on its source's
 * checkpoint, a warm agent's on the warm image's disk layer, anyone else's on the template's
 * image. An existing one is replaced. */
static gboolean
hostd_agent_make_disk(const HostdAgentRecord *r, const VmImage *image, GError **error)
{
    g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
    const char *backing = r->fork_base != NULL   ? r->fork_base
                          : r->warm_base != NULL ? r->warm_base
                                                 : image->disk_path;
    /* The overlay is made without opening its backing image (for a fork, its source's
     * checkpoint, which a guest wrote): that the file is there is checked here. */
    if (!g_file_test(backing, G_FILE_TEST_IS_REGULAR))
        return vm_throw(error, VM_ERROR_NOT_FOUND, "image '%s' not found", backing);
    return vm_qemu_img_overlay(backing, disk, r->disk_gib, error);
}

char *
hostd_agent_genid(const HostdAgentRecord *r)
{
    g_autofree char *hex = g_compute_checksum_for_string(G_CHECKSUM_SHA256, r->uuid, -1);
    return g_strdup_printf("%.8s-%.4s-4%.3s-8%.3s-%.12s", hex, hex + 8, hex + 12, hex + 15,
                           hex + 18);
}

/* Everything `new` makes before the domain starts: keys, known_hosts, ssh_config, overlay,
 * seed, domain XML. */
static char *
hostd_agent_prepare_files(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                          const VmImage *image, const char *user_data, gboolean disk_made,
                          HostdAgentKeys *ret_keys, GError **error)
{
    g_autofree char *key_path = hostd_agent_record_path(r, HOSTD_AGENT_KEY);
    g_autofree char *key_pub_path = hostd_agent_record_path(r, HOSTD_AGENT_KEY_PUB);
    g_autofree char *host_pub_path = hostd_agent_record_path(r, HOSTD_AGENT_HOST_KEY_PUB);
    g_autofree char *known_hosts_path = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);
    g_autofree char *ssh_config_path = hostd_agent_record_path(r, HOSTD_AGENT_SSH_CONFIG);
    g_autofree char *seed = hostd_agent_record_path(r, HOSTD_AGENT_SEED);
    g_autofree char *comment = g_strdup_printf("vmctl-%s", r->name);

    g_autoptr(HostdKeyPair) user_key = hostd_keypair_generate(comment, error);
    if (user_key == NULL || !hostd_keypair_save(user_key, key_path, key_pub_path, error))
        return NULL;
    /* hostd keeps no copy of the guest's private host key: it lives only in the seed. */
    g_autoptr(HostdKeyPair) host_key = hostd_keypair_generate(comment, error);
    if (host_key == NULL)
        return NULL;
    g_autofree char *host_pub_line = g_strconcat(host_key->public_line, "\n", NULL);
    g_autofree char *known_public = hostd_known_hosts_line(r->ssh_port, host_key->public_line);
    /* hostd itself talks to the backend port, under the same pinned key. */
    g_autofree char *known_backend =
        r->backend_port != 0 ? hostd_known_hosts_line(r->backend_port, host_key->public_line)
                             : g_strdup("");
    g_autofree char *known_hosts = g_strconcat(known_public, known_backend, NULL);
    g_autofree char *stanza = hostd_agent_ssh_stanza(r);
    if (!vm_file_write_atomic(host_pub_path, host_pub_line, -1, 0644, error) ||
        !vm_file_write_atomic(known_hosts_path, known_hosts, -1, 0644, error) ||
        !vm_file_write_atomic(ssh_config_path, stanza, -1, 0644, error))
        return NULL;

    if (!disk_made && !hostd_agent_make_disk(r, image, error))
        return NULL;

    VmSeedSpec seed_spec = {
        .hostname = r->name,
        .instance_id = r->instance_id,
        .user = r->user,
        .authorized_key = user_key->public_line,
        .host_key_private = host_key->private_pem,
        .host_key_public = host_key->public_line,
        /* A fork's disk already went through the template's first boot: running it again
         * would clobber what the source's user made. */
        .packages = tpl->source == VM_IMAGE_SOURCE_URL && r->forked_from == NULL
                        ? (const char *const *)tpl->packages
                        : NULL,
        .template_user_data = r->forked_from == NULL ? tpl->user_data : NULL,
        .user_user_data = user_data,
    };
    g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < ctx->components->len; i++) {
        const HostdComponent *c = ctx->components->pdata[i];
        if (c->agent_seed != NULL)
            c->agent_seed(ctx, r, &seed_spec, keep);
    }
    /* The seed holds the guest's private host key: readable by nobody but its owner (libvirt
     * hands it to QEMU's user when the domain starts). */
    if (!vm_seed_write_iso(&seed_spec, seed, error))
        return NULL;
    if (chmod(seed, 0600) < 0) {
        vm_throw_errno(error, errno, "cannot protect %s", seed);
        return NULL;
    }
    if (ret_keys != NULL) {
        ret_keys->agent_key = g_strdup(user_key->public_line);
        ret_keys->host_private = g_strdup(host_key->private_pem);
        ret_keys->host_public = g_strdup(host_key->public_line);
        /* The CA only with a grant, as a running agent gets it (hostd-secrets-sync.c): every
         * other new agent would pay for trusting it. */
        if (seed_spec.environment_block != NULL) {
            ret_keys->egress_ca_pem = g_strdup(seed_spec.egress_ca_pem);
            ret_keys->environment_block = g_strdup(seed_spec.environment_block);
        }
    }

    return hostd_agent_domain_xml(ctx, r, image, HOSTD_AGENT_DISK, error);
}

VmImage *
hostd_agent_image(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, r->template_name, error);
    if (tpl == NULL)
        return NULL;
    return vm_image_lookup(ctx->config->images_dir, tpl, error);
}

char *
hostd_agent_domain_xml(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                       const char *disk_file, GError **error)
{
    g_autofree char *genid = r->warm_base != NULL ? hostd_agent_genid(r) : NULL;
    return hostd_agent_domain_xml_genid(ctx, r, image, disk_file, genid, NULL, error);
}

char *
hostd_agent_domain_xml_genid(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                             const char *disk_file, const char *genid,
                             const char *const *backing_chain, GError **error)
{
    g_autoptr(VmImage) looked_up = NULL;
    if (image == NULL) {
        looked_up = hostd_agent_image(ctx, r, error);
        if (looked_up == NULL)
            return NULL;
        image = looked_up;
    }
    g_autofree char *disk = hostd_agent_record_path(r, disk_file);
    g_autofree char *seed = hostd_agent_record_path(r, HOSTD_AGENT_SEED);
    g_autofree char *console = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE_SOCK);
    g_autofree char *metadata = g_markup_printf_escaped(
        "<vmctl:agent xmlns:vmctl='https://vmctl.dev/xmlns/agent/1' name='%s' template='%s'/>",
        r->name, r->template_name);
    /* A fork's disk carries its source's /etc/machine-id: systemd takes the new one from the
     * command line before anything reads it, and writes it to the disk on that first boot. */
    g_autofree char *cmdline = NULL;
    if (r->forked_from != NULL && image->cmdline != NULL) {
        g_autofree char *machine_id = hostd_agent_machine_id(r);
        cmdline = g_strdup_printf("%s systemd.machine_id=%s", image->cmdline, machine_id);
    }
    VmDomainSpec spec = {
        .name = r->domain != NULL ? r->domain : r->name,
        .uuid = r->uuid,
        .genid = genid,
        .virt_type = ctx->lv->virt_type,
        .cpu_disable = (const char *const *)ctx->lv->cpu_disable,
        .cpus = r->cpus,
        .memory_mib = r->memory_mib,
        .disk_path = disk,
        .backing_chain = backing_chain,
        .seed_path = seed,
        .kernel_path = image->kernel_path,
        .initrd_path = image->initrd_path,
        .cmdline = cmdline != NULL ? cmdline : image->cmdline,
        .mac = r->mac,
        .ssh_port = r->backend_port != 0 ? r->backend_port : r->ssh_port,
        .console_socket = console,
        .agent_socket = NULL, /* libvirt picks a path QEMU's user may create */
        .metadata_xml = metadata,
        .qemu_id = ctx->agent_ids ? r->agent_id : 0,
    };
    memcpy(spec.disk_limits, r->disk_limits, sizeof(spec.disk_limits));
    g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < ctx->components->len; i++) {
        const HostdComponent *c = ctx->components->pdata[i];
        if (c->agent_domain != NULL)
            c->agent_domain(ctx, r, &spec, keep);
    }
    return vm_domain_xml_build(&spec, error);
}

gboolean
hostd_agent_define(HostdContext *ctx, const HostdAgentRecord *r, const char *xml, const char *what,
                   GError **error)
{
    g_autoptr(virDomain) dom = virDomainDefineXML(ctx->lv->conn, xml);
    if (dom == NULL)
        return hostd_libvirt_throw(error, what);
    g_autofree char *saved = hostd_agent_record_path(r, HOSTD_AGENT_DOMAIN_XML);
    return vm_file_write_atomic(saved, xml, -1, 0600, error);
}

/* Rewrites @r's known_hosts lines pinned to 127.0.0.1:@from for @to: the same host key, wherever
 * its forward now listens. */
static gboolean
hostd_agent_repin(const HostdAgentRecord *r, guint from, guint to, GError **error)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);
    g_autofree char *text = NULL;
    g_autofree char *old_prefix = g_strdup_printf("[127.0.0.1]:%u ", from);
    g_autofree char *new_prefix = g_strdup_printf("[127.0.0.1]:%u ", to);
    g_autoptr(GString) out = g_string_new(NULL);

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return TRUE; /* nothing pinned: nothing to move */
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (guint i = 0; lines[i] != NULL; i++) {
        if (lines[i][0] == '\0')
            continue;
        if (g_str_has_prefix(lines[i], old_prefix))
            g_string_append_printf(out, "%s%s\n", new_prefix, lines[i] + strlen(old_prefix));
        else
            g_string_append_printf(out, "%s\n", lines[i]);
    }
    return vm_file_write_atomic(path, out->str, (gssize)out->len, 0644, error);
}

gboolean
hostd_agent_move_port(HostdContext *ctx, HostdAgentRecord *r, gboolean backend, int *ret_fd,
                      GError **error)
{
    guint *slot = backend ? &r->backend_port : &r->ssh_port;
    guint from = *slot;
    guint to = 0;
    vm_autofd fd = -1;

    g_mutex_lock(&ctx->lock);
    gboolean ok =
        hostd_allocate_port(ctx, backend ? r->ssh_port : r->backend_port, &to, &fd, error);
    if (ok) {
        *slot = to;
        ok = hostd_agent_record_save(r, error);
        if (!ok)
            *slot = from;
    }
    g_mutex_unlock(&ctx->lock);
    if (!ok || !hostd_agent_repin(r, from, to, error))
        return FALSE;
    if (!backend) {
        g_autofree char *config_path = hostd_agent_record_path(r, HOSTD_AGENT_SSH_CONFIG);
        g_autofree char *stanza = hostd_agent_ssh_stanza(r);
        if (!vm_file_write_atomic(config_path, stanza, -1, 0644, error))
            return FALSE;
    }
    g_autofree char *detail =
        g_strdup_printf("%s port %u on 127.0.0.1 was taken by another process: moved to %u",
                        backend ? "its QEMU's SSH forward" : "its SSH", from, to);
    hostd_context_log(ctx, "agent '%s': %s", r->name, detail);
    hostd_context_agent_event(ctx, r->name, "port-moved", r->wanted, detail);
    *ret_fd = g_steal_fd(&fd);
    return TRUE;
}

void
hostd_agent_rollback(HostdContext *ctx, const char *name, const char *dir)
{
    /* Its id goes with its record: what the id was given outside its dir is taken back (after
     * its workers end, for a slot of theirs to be free). */
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
    hostd_ports_release(ctx, name);
    hostd_agent_emit_removed(ctx, name);
    hostd_ssh_pool_forget(ctx->ssh, name);
    if (r != NULL)
        hostd_confine_release(ctx, r);
    hostd_libvirt_remove(ctx->lv, name, NULL);
    hostd_libvirt_alias_set(ctx->lv, name, NULL);
    if (r != NULL && !g_str_equal(r->dir, dir))
        vm_remove_tree(r->dir, NULL);
    vm_remove_tree(dir, NULL);
    /* An agent made of a warm pool's machine: its name in agents/ links to that dir, whichever
     * of the two the caller named. */
    g_autofree char *link = hostd_agent_dir(ctx, name);
    struct stat st;
    if (lstat(link, &st) == 0 && S_ISLNK(st.st_mode))
        g_unlink(link);
}

/* Appends @rules (NULL: none) to @tpl's egress allow rules. */
static void
hostd_agent_add_egress(VmTemplate *tpl, char **rules)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();

    if (rules == NULL)
        return;
    g_strv_builder_addv(builder, (const char **)tpl->egress_allow);
    g_strv_builder_addv(builder, (const char **)rules);
    g_strfreev(tpl->egress_allow);
    tpl->egress_allow = g_strv_builder_end(builder);
}

/* Adds @names (NULL: none) to @tpl's secrets, each once. */
static void
hostd_agent_add_secrets(VmTemplate *tpl, char **names)
{
    g_autoptr(GPtrArray) all = g_ptr_array_new();
    char **lists[] = {tpl->secrets, names};
    for (gsize i = 0; i < G_N_ELEMENTS(lists); i++) {
        for (char **name = lists[i]; name != NULL && *name != NULL; name++) {
            if (!g_ptr_array_find_with_equal_func(all, *name, g_str_equal, NULL))
                g_ptr_array_add(all, *name);
        }
    }
    g_ptr_array_add(all, NULL);
    char **merged = g_strdupv((char **)all->pdata);
    g_strfreev(tpl->secrets);
    tpl->secrets = merged;
}

static gboolean
hostd_domain_define_and_start(HostdContext *ctx, const char *xml, GError **error)
{
    g_autoptr(virDomain) dom = virDomainDefineXML(ctx->lv->conn, xml);
    if (dom == NULL)
        return hostd_libvirt_throw(error, "cannot define the domain");
    if (virDomainCreate(dom) < 0)
        return hostd_libvirt_throw(error, "cannot start the domain");
    return TRUE;
}

/* A warm `new` that asked the pool for a machine: the pool hears that it is done (got one or
 * not) when this goes out of scope. */
typedef HostdContext HostdPoolAsked;
static void
hostd_pool_asked_done(HostdPoolAsked *ctx)
{
    if (ctx->pool_settled != NULL)
        ctx->pool_settled(ctx);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdPoolAsked, hostd_pool_asked_done)

static gboolean hostd_agent_adopt(HostdContext *ctx, HostdAgentRecord *r, HostdAgentRecord *m,
                                  const VmTemplate *tpl, const VmImage *image, GPtrArray *user_keys,
                                  gboolean wait, VmProgressFunc progress, gpointer progress_data,
                                  GError **error);
static gboolean hostd_agent_create_as(HostdContext *ctx, HostdAgentRecord *r, const VmTemplate *tpl,
                                      const VmImage *image, const HostdWarmImage *warm,
                                      gboolean pooled, const char *user_data, gboolean wait,
                                      VmProgressFunc progress, gpointer progress_data,
                                      GError **error);

GVariant *
hostd_agent_new(HostdContext *ctx, const HostdNewRequest *req, VmProgressFunc progress,
                gpointer progress_data, GError **error)
{
    if (!vm_name_validate(req->name, error))
        return NULL;
    g_autoptr(GPtrArray) user_keys = NULL;
    if (req->ssh_keys != NULL && req->ssh_keys[0] != NULL) {
        user_keys = hostd_user_keys_check((const char *const *)req->ssh_keys, error);
        if (user_keys == NULL)
            return NULL;
    }

    g_autoptr(HostdNameLock) name_lock = hostd_name_lock(ctx, req->name);
    g_autofree char *dir = hostd_agent_dir(ctx, req->name);
    g_autoptr(GError) lookup_error = NULL;
    g_autoptr(virDomain) existing = hostd_libvirt_lookup(ctx->lv, req->name, &lookup_error);
    if (g_file_test(dir, G_FILE_TEST_EXISTS) || existing != NULL) {
        vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already exists", req->name);
        return NULL;
    }
    /* The name is the fleet's before anything is made here; given back when `new` fails. */
    g_auto(HostdAgentClaim) claim = {0};
    if (!hostd_agent_claim(ctx, req->name, &claim, error))
        return NULL;

    const char *template_name =
        req->template_name != NULL ? req->template_name : HOSTD_DEFAULT_TEMPLATE;
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, template_name, error);
    if (tpl == NULL)
        return NULL;
    /* The components grant the template's secrets at creation: --secret adds to them. */
    hostd_agent_add_secrets(tpl, req->secrets);
    /* And egress opens what the template allows: --egress adds to it, checked before the image
     * is made (the egress component checks the whole when it stores the policy). */
    if (!hostd_egress_presets_check(ctx->config->egress_presets, (const char *const *)req->egress,
                                    error))
        return NULL;
    hostd_agent_add_egress(tpl, req->egress);
    guint cpus = req->cpus != 0 ? req->cpus : tpl->cpus;
    guint memory_mib = req->memory_mib != 0 ? req->memory_mib : tpl->memory_mib;
    guint disk_gib = req->disk_gib != 0 ? req->disk_gib : tpl->disk_gib;
    if (!hostd_check_resources(ctx, cpus, memory_mib, disk_gib, error))
        return NULL;
    guint disk_limits[VM_DISK_LIMITS];
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        disk_limits[i] = req->disk_limits_set[i]   ? req->disk_limits[i]
                         : tpl->disk_limits_set[i] ? tpl->disk_limits[i]
                                                   : ctx->config->disk_limits[i];
        if (disk_limits[i] > VM_DISK_LIMIT_MAX) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "a disk limit of %u is over %u",
                     disk_limits[i], VM_DISK_LIMIT_MAX);
            return NULL;
        }
    }

    g_autoptr(VmImage) image =
        vm_image_ensure(ctx->config->images_dir, tpl, FALSE, progress, progress_data, NULL, error);
    if (image == NULL)
        return NULL;
    if (image->virtual_size > (guint64)disk_gib << 30) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "--disk %u GiB is smaller than the template's image", disk_gib);
        return NULL;
    }

    /* A warm image when one fits, else the first boot, said once in the log and to the user. */
    g_autoptr(HostdWarmImage) warm = NULL;
    g_autofree char *cold_why = NULL;
    if (req->cold)
        cold_why = g_strdup("--cold");
    else if (req->user_data != NULL)
        cold_why = g_strdup("--user-data runs at a first boot");
    else
        warm = hostd_warm_lookup(ctx, tpl, image, cpus, memory_mib, disk_gib, &cold_why);
    if (warm == NULL) {
        hostd_context_log(ctx, "agent '%s': booting cold: %s", req->name, cold_why);
        g_autofree char *note = g_strdup_printf("booting cold: %s", cold_why);
        hostd_progress(progress, progress_data, note, -1);
    }

    hostd_progress(progress, progress_data, "creating the agent's disk and seed", -1);
    g_autoptr(HostdAgentRecord) r = g_new0(HostdAgentRecord, 1);
    r->dir = g_strdup(dir);
    r->name = g_strdup(req->name);
    r->uuid = g_uuid_string_random();
    r->template_name = g_strdup(tpl->name);
    r->phase = g_strdup(HOSTD_PHASE_CREATING);
    r->fleet_epoch = claim.epoch;
    r->cpus = cpus;
    r->memory_mib = memory_mib;
    r->disk_gib = disk_gib;
    memcpy(r->disk_limits, disk_limits, sizeof(r->disk_limits));
    r->mac = warm != NULL ? g_strdup(warm->mac) : hostd_random_mac();
    r->user = g_strdup(tpl->user);
    /* A warm agent's cloud-init already ran as the warm image's instance: the same id keeps a
     * later reboot from running the first boot's modules again. */
    r->instance_id =
        warm != NULL ? g_strdup(warm->instance_id) : g_strdup_printf("vmctl-%s", r->uuid);
    r->warm_base = warm != NULL ? g_strdup(warm->disk_path) : NULL;
    r->created = g_get_real_time() / G_USEC_PER_SEC;
    r->state_since = r->created;
    r->idle_never = tpl->idle_never;
    r->idle_pause_s = (guint)MIN(tpl->idle_pause_after_s, G_MAXUINT);
    r->idle_save_s = (guint)MIN(tpl->idle_save_after_s, G_MAXUINT);
    r->checkpoint_every_s =
        tpl->checkpoints_never ? 0 : (guint)MIN(tpl->checkpoint_every_s, G_MAXUINT);
    r->checkpoint_keep = tpl->checkpoint_keep;
    r->checkpoint_hourly = tpl->checkpoint_hourly;
    r->checkpoint_daily = tpl->checkpoint_daily;

    /* A machine of the template's warm pool, when one waits: no restore. What fails there is
     * logged, and the agent is made from the warm image as without a pool. */
    g_autoptr(HostdPoolAsked) asked = NULL;
    g_autoptr(HostdAgentRecord) m = NULL;
    if (warm != NULL && ctx->pool_take != NULL) {
        m = ctx->pool_take(ctx, tpl->name, warm->disk_path, cpus, memory_mib, disk_gib);
        asked = ctx;
    }
    if (m != NULL) {
        g_autoptr(HostdAgentRecord) pooled = hostd_agent_record_copy(r);
        g_autoptr(GError) pool_error = NULL;
        g_autofree char *machine = g_strdup(m->name);
        gboolean adopted =
            hostd_agent_adopt(ctx, pooled, g_steal_pointer(&m), tpl, image, user_keys, req->wait,
                              progress, progress_data, &pool_error);
        if (adopted) {
            claim.held = FALSE;
            return hostd_agent_to_variant(ctx, pooled);
        }
        g_autofree char *why = g_strdelimit(vm_utf8_cut(pool_error->message, 1024), "\r\n", ' ');
        hostd_context_log(ctx,
                          "agent '%s': the warm pool's machine %s did not take (%s); "
                          "restoring the warm image",
                          r->name, machine, why);
    }

    if (!hostd_agent_reserve(ctx, r, error))
        return NULL;
    /* The seed takes the user's keys from the record, as it does for a fork. */
    g_autofree char *keys_path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    if (user_keys != NULL && !hostd_user_keys_save(keys_path, user_keys, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return NULL;
    }
    if (!hostd_agent_create(ctx, r, tpl, image, warm, req->user_data, req->wait, progress,
                            progress_data, error))
        return NULL;
    claim.held = FALSE;
    return hostd_agent_to_variant(ctx, r);
}

/* Makes new agent @r (its record as `new` filled it, not reserved) of the warm pool's machine
 * @m, taken (and freed here): @r gets @m's dir (its name in agents/ a link to it), domain, UUID,
 * ports and id, then its keys, seed and identity as a warm agent does, without a restore. On
 * failure everything of both is gone (the caller makes the agent another way). */
static gboolean
hostd_agent_adopt(HostdContext *ctx, HostdAgentRecord *r, HostdAgentRecord *m,
                  const VmTemplate *tpl, const VmImage *image, GPtrArray *user_keys, gboolean wait,
                  VmProgressFunc progress, gpointer progress_data, GError **error)
{
    g_autoptr(HostdAgentRecord) machine = m;
    g_autofree char *link = hostd_agent_dir(ctx, r->name);
    guint machine_id = m->agent_id;

    g_free(r->dir);
    r->dir = g_strdup(m->dir);
    r->domain = g_strdup(m->name);
    g_free(r->uuid);
    r->uuid = g_strdup(m->uuid);
    g_free(r->mac);
    r->mac = g_strdup(m->mac);
    g_free(r->instance_id);
    r->instance_id = g_strdup(m->instance_id);
    g_free(r->warm_base);
    r->warm_base = g_strdup(m->warm_base);
    r->ssh_port = m->ssh_port;
    r->backend_port = m->backend_port;
    r->agent_id = m->agent_id;

    /* From here the machine is the agent's: its ports and its domain go by the agent's name. */
    int public_fd = hostd_ports_take_public(ctx, m->name);
    hostd_ports_release(ctx, m->name);
    hostd_ports_hold(ctx, r->name, public_fd, -1);
    hostd_libvirt_alias_set(ctx->lv, r->name, m->name);
    /* The record first: a hostd killed before the link finds a machine no agent took (removed
     * at its start), after it an agent in phase "creating" (rolled back). */
    gboolean ok = hostd_agent_record_save(r, error);
    if (ok && symlink(m->dir, link) < 0)
        ok = vm_throw_errno(error, errno, "cannot link %s", link);
    hostd_confine_unhold(ctx, machine_id);
    if (!ok) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    g_autofree char *keys_path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    if (user_keys != NULL && !hostd_user_keys_save(keys_path, user_keys, error)) {
        hostd_agent_rollback(ctx, r->name, link);
        return FALSE;
    }
    return hostd_agent_create_as(ctx, r, tpl, image, NULL, TRUE, NULL, wait, progress,
                                 progress_data, error);
}

gboolean
hostd_agent_reserve(HostdContext *ctx, HostdAgentRecord *r, GError **error)
{
    /* The record goes to disk in phase "creating" before anything else exists, so a hostd
     * killed halfway finds it at start-up and rolls the agent back. The port is chosen and
     * recorded under the context lock so two concurrent `new`s never share one. */
    vm_autofd public_fd = -1;
    vm_autofd backend_fd = -1;
    g_mutex_lock(&ctx->lock);
    gboolean ok = hostd_allocate_port(ctx, 0, &r->ssh_port, &public_fd, error) &&
                  hostd_allocate_port(ctx, r->ssh_port, &r->backend_port, &backend_fd, error) &&
                  hostd_confine_pick_locked(ctx, r, error);
    if (ok && g_mkdir_with_parents(r->dir, 0711) < 0)
        ok = vm_throw_errno(error, errno, "cannot create %s", r->dir);
    if (ok && !hostd_agent_record_save(r, error)) {
        vm_remove_tree(r->dir, NULL);
        ok = FALSE;
    }
    g_mutex_unlock(&ctx->lock);
    /* Held until the relay listens on the public port and QEMU is about to bind the backend:
     * another hostd choosing from the same range, or an outgoing connection, cannot take them
     * meanwhile. */
    if (ok)
        hostd_ports_hold(ctx, r->name, g_steal_fd(&public_fd), g_steal_fd(&backend_fd));
    return ok;
}

/* Whether QEMU did not start because the port of its SSH forward was taken. */
static gboolean
hostd_agent_port_was_taken(const GError *error)
{
    return error != NULL && strstr(error->message, "host forwarding rule") != NULL;
}

/* What a restored machine of agent @r is given through its guest agent: its name, @machine_id,
 * its keys, its grants; a key with comment @drop_comment (a fork's source's) removed. The strings
 * stay the caller's. */
static HostdWarmIdentity
hostd_agent_identity(const HostdAgentRecord *r, const HostdAgentKeys *keys, const char *machine_id,
                     const char *drop_comment)
{
    return (HostdWarmIdentity){
        .drop_comment = drop_comment,
        .hostname = r->name,
        .machine_id = machine_id,
        .user = r->user,
        .agent_key = keys->agent_key,
        .host_key_private = keys->host_private,
        .host_key_public = keys->host_public,
        .egress_ca_pem = keys->egress_ca_pem,
        .environment_block = keys->environment_block,
    };
}

/* Restores @warm into the new agent @r defined as @xml and gives it its identity; when that
 * fails, logs why and boots the agent from a disk made again on the template's image. */
static gboolean
hostd_agent_start_warm(HostdContext *ctx, HostdAgentRecord *r, const VmImage *image,
                       const HostdWarmImage *warm, const char *xml, const HostdAgentKeys *keys,
                       gboolean *ret_restored, VmProgressFunc progress, gpointer progress_data,
                       GError **error)
{
    hostd_progress(
        progress, progress_data,
        r->forked_from != NULL ? "restoring the source's memory" : "restoring the warm image", -1);
    g_autoptr(virDomain) dom = virDomainDefineXML(ctx->lv->conn, xml);
    if (dom == NULL)
        return hostd_libvirt_throw(error, "cannot define the domain");
    g_autofree char *machine_id = hostd_agent_machine_id(r);
    g_autofree char *source_comment =
        r->forked_from != NULL ? g_strdup_printf("vmctl-%s", r->forked_from) : NULL;
    HostdWarmIdentity id = hostd_agent_identity(r, keys, machine_id, source_comment);
    g_autofree char *scratch = hostd_agent_record_path(r, "warm.save");
    g_autofree char *trace = NULL;
    g_autoptr(GError) warm_error = NULL;
    gint64 start = g_get_monotonic_time();
    if (hostd_warm_restore(ctx, dom, warm->memory_path, xml, scratch, &id, &trace, &warm_error)) {
        hostd_context_log(ctx, "agent '%s': restored from %s in %" G_GINT64_FORMAT " ms (%s)",
                          r->name, warm->memory_path, (g_get_monotonic_time() - start) / 1000,
                          trace);
        *ret_restored = TRUE;
        return TRUE;
    }

    /* Its forward's port taken: the caller moves it and restores again. */
    if (hostd_agent_port_was_taken(warm_error)) {
        if (hostd_libvirt_is_active(dom) && virDomainDestroy(dom) < 0)
            virResetLastError();
        g_propagate_error(error, g_steal_pointer(&warm_error));
        return FALSE;
    }
    /* QEMU's own words, some of them the guest's: one line in the log. */
    g_autofree char *why = g_strdelimit(vm_utf8_cut(warm_error->message, 1024), "\r\n", ' ');
    hostd_context_log(ctx, "agent '%s': %s did not start (%s); booting cold", r->name,
                      warm->memory_path, why);
    g_autofree char *note =
        g_strdup_printf("the saved machine did not start (%s); booting cold", why);
    hostd_progress(progress, progress_data, note, -1);
    if (hostd_libvirt_is_active(dom) && virDomainDestroy(dom) < 0)
        virResetLastError();
    hostd_ssh_pool_forget(ctx->ssh, r->name);
    g_clear_pointer(&r->warm_base, g_free);
    if (!hostd_agent_record_save(r, error) || !hostd_agent_make_disk(r, image, error) ||
        !hostd_confine_agent(ctx, r, error))
        return FALSE;
    g_autofree char *cold_xml = hostd_agent_domain_xml(ctx, r, image, HOSTD_AGENT_DISK, error);
    g_autofree char *xml_path = hostd_agent_record_path(r, HOSTD_AGENT_DOMAIN_XML);
    return cold_xml != NULL && vm_file_write_atomic(xml_path, cold_xml, -1, 0600, error) &&
           hostd_domain_define_and_start(ctx, cold_xml, error);
}

static gboolean hostd_agent_finish(HostdContext *ctx, HostdAgentRecord *r, gboolean restored,
                                   gboolean wait, VmProgressFunc progress, gpointer progress_data,
                                   GError **error);

/* Gives the warm pool's paused machine that agent @r was made of (hostd_agent_adopt()) the
 * agent's definition @xml for its next boot, its seed, then resumes it and applies its
 * identity. */
static gboolean
hostd_agent_start_pooled(HostdContext *ctx, HostdAgentRecord *r, const char *xml,
                         const HostdAgentKeys *keys, VmProgressFunc progress,
                         gpointer progress_data, GError **error)
{
    hostd_progress(progress, progress_data, "resuming a machine of the warm pool", -1);
    gint64 start = g_get_monotonic_time();
    g_autoptr(virDomain) dom = virDomainDefineXML(ctx->lv->conn, xml);
    if (dom == NULL)
        return hostd_libvirt_throw(error, "cannot define the domain");
    /* The machine was restored with the warm seed in its drive: the agent's goes in, so that
     * cloud-init finds the agent's name there at a reboot. The drive is emptied first: libvirt
     * changes nothing for a medium of the same path. */
    g_autofree char *seed = hostd_agent_record_path(r, HOSTD_AGENT_SEED);
    g_autofree char *eject = vm_domain_seed_xml(NULL);
    g_autofree char *insert = vm_domain_seed_xml(seed);
    if (virDomainUpdateDeviceFlags(dom, eject,
                                   VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_DEVICE_MODIFY_FORCE) < 0 ||
        virDomainUpdateDeviceFlags(dom, insert, VIR_DOMAIN_AFFECT_LIVE) < 0)
        return hostd_libvirt_throw(error, "cannot give the machine the agent's seed");
    g_autoptr(GString) trace = g_string_new(NULL);
    g_string_append_printf(trace, "seed %" G_GINT64_FORMAT " ms",
                           (g_get_monotonic_time() - start) / 1000);
    if (virDomainResume(dom) < 0)
        return hostd_libvirt_throw(error, "cannot resume the machine");
    g_autofree char *machine_id = hostd_agent_machine_id(r);
    HostdWarmIdentity id = hostd_agent_identity(r, keys, machine_id, NULL);
    if (!hostd_warm_identify(ctx, dom, &id, trace, error))
        return FALSE;
    hostd_context_log(
        ctx, "agent '%s': made from the warm pool's machine %s in %" G_GINT64_FORMAT " ms (%s)",
        r->name, r->domain, (g_get_monotonic_time() - start) / 1000, trace->str);
    return TRUE;
}

static gboolean
hostd_agent_create_as(HostdContext *ctx, HostdAgentRecord *r, const VmTemplate *tpl,
                      const VmImage *image, const HostdWarmImage *warm, gboolean pooled,
                      const char *user_data, gboolean wait, VmProgressFunc progress,
                      gpointer progress_data, GError **error)
{
    /* What the VM needs from its first instant (its way out) comes before the VM. */
    if (!hostd_agent_emit_creating(ctx, r, tpl, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    g_auto(HostdAgentKeys) keys = {0};
    g_autofree char *xml = hostd_agent_prepare_files(ctx, r, tpl, image, user_data, pooled,
                                                     warm != NULL || pooled ? &keys : NULL, error);
    g_autofree char *xml_path = hostd_agent_record_path(r, HOSTD_AGENT_DOMAIN_XML);
    if (xml == NULL || !vm_file_write_atomic(xml_path, xml, -1, 0600, error) ||
        !hostd_confine_agent(ctx, r, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }

    gboolean started = FALSE;
    gboolean restored = pooled;
    if (pooled) {
        started = hostd_agent_start_pooled(ctx, r, xml, &keys, progress, progress_data, error);
        if (!started) {
            hostd_agent_rollback(ctx, r->name, r->dir);
            return FALSE;
        }
    }
    for (guint attempt = 1; !started; attempt++) {
        g_autoptr(GError) start_error = NULL;
        /* QEMU binds its forward itself: hostd lets the port go right before. */
        hostd_ports_release_backend(ctx, r->name);
        if (warm != NULL) {
            started = hostd_agent_start_warm(ctx, r, image, warm, xml, &keys, &restored, progress,
                                             progress_data, &start_error);
        } else {
            hostd_progress(progress, progress_data, "starting the VM", -1);
            started = hostd_domain_define_and_start(ctx, xml, &start_error);
        }
        if (started)
            break;
        /* Taken in that moment by another program: the next free port, recorded. */
        int fd = -1;
        if (attempt == HOSTD_AGENT_START_ATTEMPTS || !hostd_agent_port_was_taken(start_error)) {
            g_propagate_error(error, g_steal_pointer(&start_error));
            break;
        }
        if (!hostd_agent_move_port(ctx, r, TRUE, &fd, error))
            break;
        hostd_ports_hold_backend(ctx, r->name, fd);
        g_free(xml);
        xml = hostd_agent_domain_xml(ctx, r, image, HOSTD_AGENT_DISK, error);
        if (xml == NULL || !vm_file_write_atomic(xml_path, xml, -1, 0600, error))
            break;
    }
    if (!started) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    return hostd_agent_finish(ctx, r, restored, wait, progress, progress_data, error);
}

gboolean
hostd_agent_create(HostdContext *ctx, HostdAgentRecord *r, const VmTemplate *tpl,
                   const VmImage *image, const HostdWarmImage *warm, const char *user_data,
                   gboolean wait, VmProgressFunc progress, gpointer progress_data, GError **error)
{
    return hostd_agent_create_as(ctx, r, tpl, image, warm, FALSE, user_data, wait, progress,
                                 progress_data, error);
}

/* The VM of new agent @r runs: waits for it where asked, and marks the agent ready. */
static gboolean
hostd_agent_finish(HostdContext *ctx, HostdAgentRecord *r, gboolean restored, gboolean wait,
                   VmProgressFunc progress, gpointer progress_data, GError **error)
{
    /* A restored agent's cloud-init finished before its memory was saved. */
    if (wait &&
        (!hostd_agent_wait_ssh(ctx, r, progress, progress_data, error) ||
         (!restored && !hostd_agent_wait_first_boot(ctx, r, progress, progress_data, error)))) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    if (wait)
        hostd_agent_emit_up(ctx, r);

    g_free(r->phase);
    r->phase = g_strdup(HOSTD_PHASE_READY);
    g_free(r->wanted);
    r->wanted = g_strdup(HOSTD_WANTED_RUNNING);
    r->state_since = g_get_real_time() / G_USEC_PER_SEC;
    if (!hostd_agent_emit(ctx, r, G_STRUCT_OFFSET(HostdComponent, agent_ready), error) ||
        !hostd_agent_record_save(r, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    return TRUE;
}

/* Loads the record of @name and looks up its domain: what every operation on an existing agent
 * starts with. */
gboolean
hostd_agent_open(HostdContext *ctx, const char *name, HostdAgentRecord **ret_record,
                 virDomainPtr *ret_dom, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return FALSE;
    g_autoptr(GError) local_error = NULL;
    virDomainPtr dom = hostd_libvirt_lookup(ctx->lv, r->name, &local_error);
    if (dom == NULL) {
        if (local_error != NULL) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        return vm_throw(error, VM_ERROR_FAILED,
                        "agent '%s' has no libvirt domain; restart hostd to repair it", r->name);
    }
    *ret_record = g_steal_pointer(&r);
    *ret_dom = dom;
    return TRUE;
}

gboolean
hostd_agent_lock_open(HostdContext *ctx, const char *name, GMutex **ret_lock,
                      HostdAgentRecord **ret_record, virDomainPtr *ret_dom, GError **error)
{
    if (!vm_name_validate(name, error))
        return FALSE;
    GMutex *lock = hostd_name_lock(ctx, name);
    if (!hostd_agent_open(ctx, name, ret_record, ret_dom, error)) {
        hostd_name_unlock(lock);
        return FALSE;
    }
    *ret_lock = lock;
    return TRUE;
}

HostdAgentRecord *
hostd_agent_lock_load(HostdContext *ctx, const char *name, GMutex **ret_lock, GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    GMutex *lock = hostd_name_lock(ctx, name);
    HostdAgentRecord *r = hostd_agent_load(ctx, name, error);
    if (r == NULL) {
        hostd_name_unlock(lock);
        return NULL;
    }
    *ret_lock = lock;
    return r;
}

/* An agent from before agent ids gets one at its first boot from its disk: recorded, then in
 * its definition. One that resumes a saved state keeps the user its state was saved with until
 * it next boots. */
static gboolean
hostd_agent_adopt_id(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom, GError **error)
{
    if (!ctx->agent_ids || r->agent_id != 0)
        return TRUE;
    if (virDomainHasManagedSaveImage(dom, 0) != 0) {
        virResetLastError();
        return TRUE;
    }
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    /* The caller's record is the one it goes on with: it gets the id too. */
    HostdAgentRecord *w = (HostdAgentRecord *)r;
    g_mutex_lock(&ctx->lock);
    gboolean ok = hostd_confine_pick_locked(ctx, w, error) && hostd_agent_record_save(w, error);
    g_mutex_unlock(&ctx->lock);
    if (!ok) {
        w->agent_id = 0;
        return FALSE;
    }
    g_autofree char *xml = hostd_agent_domain_xml(ctx, r, NULL, set->active, error);
    return xml != NULL && hostd_agent_define(ctx, r, xml, "cannot give the agent its id", error);
}

/* Before @r boots from its disk: its QEMU's forward goes to another port, which the definition,
 * the record and the relay get. The caller's record is the one it goes on with: it gets the port
 * too. */
static gboolean
hostd_agent_move_backend(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    HostdAgentRecord *w = (HostdAgentRecord *)r;
    vm_autofd fd = -1;

    if (!hostd_agent_move_port(ctx, w, TRUE, &fd, error))
        return FALSE;
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, error);
    if (set == NULL)
        return FALSE;
    g_autofree char *xml = hostd_agent_domain_xml(ctx, r, NULL, set->active, error);
    if (xml == NULL ||
        !hostd_agent_define(ctx, r, xml, "cannot move the agent's SSH forward", error))
        return FALSE;
    if (ctx->relay != NULL)
        hostd_relay_set_backend(ctx->relay, r->name, r->backend_port);
    /* fd, which holds the port, closes here: right before QEMU binds it. */
    return TRUE;
}

/* What every start of @r's QEMU begins with: the fence, its id, the components' agent_starting
 * hooks, its files' owners; the ports hostd held for it are QEMU's to bind again. */
static gboolean
hostd_agent_boot_prepare(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                         GError **error)
{
    /* Every boot (start, a crash restart) of an agent another host owns is refused here. */
    if (!hostd_fence_refuse(r, error))
        return FALSE;
    /* The id first: the definition it makes is the one the agent_starting hooks see. */
    if (!hostd_agent_adopt_id(ctx, r, dom, error) ||
        !hostd_agent_emit(ctx, r, G_STRUCT_OFFSET(HostdComponent, agent_starting), error) ||
        !hostd_confine_agent(ctx, r, error))
        return FALSE;
    hostd_ssh_pool_forget(ctx->ssh, r->name);
    /* A saved machine restores with the definition it was saved with; the port hostd held for
     * it meanwhile is QEMU's to bind again. */
    hostd_ports_release_backend(ctx, r->name);
    return TRUE;
}

gboolean
hostd_agent_restore_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                           const char *memory_path, const char *xml, GError **error)
{
    if (!hostd_agent_boot_prepare(ctx, r, dom, error))
        return FALSE;
    if (virDomainRestoreFlags(ctx->lv->conn, memory_path, xml, VIR_DOMAIN_SAVE_RUNNING) < 0)
        return hostd_libvirt_throw(error, "cannot restore the saved memory");
    return TRUE;
}

gboolean
hostd_agent_rehome(HostdContext *ctx, HostdAgentRecord *r, GError **error)
{
    g_autofree char *host_pub_path = hostd_agent_record_path(r, HOSTD_AGENT_HOST_KEY_PUB);
    g_autofree char *known_hosts_path = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);
    g_autofree char *config_path = hostd_agent_record_path(r, HOSTD_AGENT_SSH_CONFIG);
    g_autofree char *host_pub = NULL;
    gsize len = 0;
    /* hostd's own file (written at the agent's new), moved with the others. */
    if (!g_file_get_contents(host_pub_path, &host_pub, &len, NULL) || len > 16 * 1024 ||
        strchr(g_strstrip(host_pub), '\n') != NULL || host_pub[0] == '\0')
        return vm_throw(error, VM_ERROR_IO, "agent '%s' has no host key in %s", r->name,
                        host_pub_path);
    g_autofree char *known_public = hostd_known_hosts_line(r->ssh_port, host_pub);
    g_autofree char *known_backend = hostd_known_hosts_line(r->backend_port, host_pub);
    g_autofree char *known_hosts = g_strconcat(known_public, known_backend, NULL);
    g_autofree char *stanza = hostd_agent_ssh_stanza(r);
    return vm_file_write_atomic(known_hosts_path, known_hosts, -1, 0644, error) &&
           vm_file_write_atomic(config_path, stanza, -1, 0644, error);
}

gboolean
hostd_agent_boot_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                        GError **error)
{
    if (!hostd_agent_boot_prepare(ctx, r, dom, error))
        return FALSE;
    gboolean saved = virDomainHasManagedSaveImage(dom, 0) > 0;
    virResetLastError();
    if (!saved && r->backend_port != 0 && !hostd_port_is_free(r->backend_port) &&
        !hostd_agent_move_backend(ctx, r, error))
        return FALSE;
    if (virDomainCreate(dom) == 0)
        return TRUE;
    g_autoptr(GError) local_error = NULL;
    hostd_libvirt_throw(&local_error, "cannot start the domain");
    /* Taken between the look and QEMU's bind: once more, on the next free port. */
    if (saved || r->backend_port == 0 || !hostd_agent_port_was_taken(local_error)) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    if (!hostd_agent_move_backend(ctx, r, error))
        return FALSE;
    if (virDomainCreate(dom) < 0)
        return hostd_libvirt_throw(error, "cannot start the domain");
    return TRUE;
}

/* What start and stop begin with: agent @name locked (*@ret_lock) and open (*@ret_record,
 * *@ret_dom), its record then saved wanting @wanted, strictly, its crash forgotten (asked to run,
 * its count of restarts too). Returns a copy of the record as it was, for
 * hostd_agent_save_back() when what follows fails; on failure nothing is held. */
static HostdAgentRecord *
agent_lock_want(HostdContext *ctx, const char *name, const char *wanted, GMutex **ret_lock,
                HostdAgentRecord **ret_record, virDomainPtr *ret_dom, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    g_autoptr(HostdAgentRecord) old = hostd_agent_record_copy(r);
    g_clear_pointer(&r->crashed, g_free);
    if (g_str_equal(wanted, HOSTD_WANTED_RUNNING))
        r->crash_count = 0;
    if (!hostd_agent_save_wanted(r, wanted, error))
        return NULL;
    *ret_lock = g_steal_pointer(&lock);
    *ret_record = g_steal_pointer(&r);
    *ret_dom = g_steal_pointer(&dom);
    return g_steal_pointer(&old);
}

GVariant *
hostd_agent_start(HostdContext *ctx, const char *name, gboolean wait, VmProgressFunc progress,
                  gpointer progress_data, GError **error)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    /* The record first, and strictly: a VM booted while its record says stopped would be one
     * that hostd believes stopped. A boot that fails puts the old record back. The user asked
     * for it running: a crashed agent is given a fresh count of restarts. */
    g_autoptr(HostdAgentRecord) old =
        agent_lock_want(ctx, name, HOSTD_WANTED_RUNNING, &name_lock, &r, &dom, error);
    if (old == NULL)
        return NULL;
    if (!hostd_fence_refuse(r, error)) {
        hostd_agent_save_back(old, NULL);
        return NULL;
    }
    if (virDomainIsActive(dom) == 1) {
        if (!hostd_agent_emit(ctx, r, G_STRUCT_OFFSET(HostdComponent, agent_starting), error)) {
            hostd_agent_save_back(old, error);
            return NULL;
        }
        if (virDomainResume(dom) < 0)
            virResetLastError(); /* not paused: nothing to do */
    } else {
        hostd_progress(progress, progress_data, "starting the VM", -1);
        if (!hostd_agent_boot_locked(ctx, r, dom, error)) {
            hostd_agent_save_back(old, error);
            return NULL;
        }
    }
    if (wait) {
        if (!hostd_agent_wait_ssh(ctx, r, progress, progress_data, error))
            return NULL;
        hostd_agent_emit_up(ctx, r);
    }
    return hostd_agent_to_variant(ctx, r);
}

GVariant *
hostd_agent_stop(HostdContext *ctx, const char *name, gboolean force, guint timeout_s,
                 VmProgressFunc progress, gpointer progress_data, GError **error)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    /* Wanted first, and strictly: the supervisor, seeing the domain stop, must take it for this
     * stop and not for a poweroff or a crash; a record that cannot say so leaves the VM as it
     * is. A stop that fails puts the old record back. */
    g_autoptr(HostdAgentRecord) old =
        agent_lock_want(ctx, name, HOSTD_WANTED_STOPPED, &name_lock, &r, &dom, error);
    if (old == NULL)
        return NULL;
    if (hostd_libvirt_is_active(dom)) {
        hostd_progress(progress, progress_data,
                       force ? "stopping the VM" : "shutting the guest down", -1);
        hostd_ssh_pool_forget(ctx->ssh, name);
        if (!hostd_libvirt_stop(ctx->lv, dom, force,
                                timeout_s != 0 ? timeout_s : HOSTD_STOP_TIMEOUT_S, error)) {
            hostd_agent_save_back(old, error);
            return NULL;
        }
        hostd_agent_mark_state_change(r);
    } else if (virDomainHasManagedSaveImage(dom, 0) > 0) {
        /* Stopping a saved agent drops its RAM image: the next start boots from the disk,
         * which holds everything the guest had written. */
        if (virDomainManagedSaveRemove(dom, 0) < 0) {
            hostd_libvirt_throw(error, "cannot drop the saved state");
            hostd_agent_save_back(old, error);
            return NULL;
        }
        hostd_agent_mark_state_change(r);
    }
    virResetLastError();
    return hostd_agent_to_variant(ctx, r);
}

/* An rm that released @name in the fleet and then failed: the agent is still here, so is its
 * name again (best effort: the cluster's thread claims it at its next refresh otherwise). */
static void
hostd_agent_reclaim(HostdContext *ctx, const char *name)
{
    g_autoptr(GError) error = NULL;

    if (ctx->cluster != NULL && !hostd_cluster_claim(ctx->cluster, name, NULL, &error))
        hostd_context_log(ctx, "agent '%s' stays, its name in the fleet not claimed again: %s",
                          name, error->message);
}

gboolean
hostd_agent_rm(HostdContext *ctx, const char *name, gboolean force, GError **error)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_lock_load(ctx, name, &name_lock, error);
    if (r == NULL)
        return FALSE;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    if (dom != NULL && hostd_libvirt_is_active(dom) && !force)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is running; stop it first or use --force", name);
    if (!hostd_agent_emit(ctx, r, G_STRUCT_OFFSET(HostdComponent, agent_removing), error))
        return FALSE;
    /* The fleet forgets the name before the agent goes: a name whose record stays would be
     * nobody's to use again. A fenced agent's name is another host's: only this copy goes. */
    gboolean fenced = r->fenced != NULL;
    if (ctx->cluster != NULL && !fenced && !hostd_cluster_release(ctx->cluster, name, error))
        return FALSE;

    hostd_ssh_pool_forget(ctx->ssh, name);
    hostd_agent_emit_removed(ctx, name);
    if (!hostd_libvirt_remove(ctx->lv, name, error)) {
        if (!fenced)
            hostd_agent_reclaim(ctx, name);
        return FALSE;
    }
    /* Its QEMU is gone: the read access its id had to a source's images goes too, and the id
     * is free again once the record is. */
    hostd_confine_release(ctx, r);
    /* The record goes first so that a crash halfway leaves no half-agent that looks whole. */
    g_autofree char *record = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);
    if (g_unlink(record) < 0 && errno != ENOENT) {
        vm_throw_errno(error, errno, "cannot remove %s", record);
        if (!fenced)
            hostd_agent_reclaim(ctx, name);
        return FALSE;
    }
    hostd_libvirt_alias_set(ctx->lv, name, NULL);
    /* A warm pool's machine: its dir, then the link in agents/ that named it. */
    g_autofree char *link = hostd_agent_dir(ctx, name);
    return vm_remove_tree(r->dir, error) &&
           (g_str_equal(r->dir, link) || vm_remove_tree(link, error));
}

GVariant *
hostd_agent_info(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return NULL;
    GVariant *floating = hostd_agent_to_variant(ctx, r);
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    const char *state = dom != NULL ? hostd_libvirt_state_name(dom) : "missing";
    if (!g_str_equal(state, "running") && !g_str_equal(state, "paused"))
        return floating;
    g_autoptr(GVariant) info = g_variant_ref_sink(floating);
    /* What its QEMU costs the host now: read here, not in every answer that carries an agent. */
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    GVariantIter iter;
    GVariant *entry;
    g_variant_iter_init(&iter, info);
    while ((entry = g_variant_iter_next_value(&iter)) != NULL) {
        g_variant_builder_add_value(&b, entry);
        g_variant_unref(entry);
    }
    hostd_memory_add_agent(&b, ctx->lv, dom, name);
    return g_variant_builder_end(&b);
}

gboolean
hostd_agent_claim(HostdContext *ctx, const char *name, HostdAgentClaim *claim, GError **error)
{
    gboolean created = FALSE;

    if (ctx->cluster == NULL)
        return TRUE;
    if (!hostd_cluster_claim(ctx->cluster, name, &created, error))
        return FALSE;
    claim->ctx = ctx;
    claim->name = g_strdup(name);
    claim->held = created;
    claim->epoch = created ? 1 : 0;
    return TRUE;
}

void
hostd_agent_claim_clear(HostdAgentClaim *claim)
{
    g_autoptr(GError) error = NULL;

    if (claim->held && claim->ctx->cluster != NULL &&
        !hostd_cluster_release(claim->ctx->cluster, claim->name, &error))
        hostd_context_log(claim->ctx, "agent '%s' was not made, and its name stays claimed: %s",
                          claim->name, error->message);
    claim->held = FALSE;
    g_clear_pointer(&claim->name, g_free);
}

GHashTable *
hostd_agent_states(gpointer data)
{
    HostdContext *ctx = data;
    g_autoptr(GVariant) agents = hostd_agent_list(ctx, NULL);
    GVariantIter it;
    GVariant *agent;

    if (agents == NULL)
        return NULL;
    GHashTable *states = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_variant_iter_init(&it, agents);
    while ((agent = g_variant_iter_next_value(&it)) != NULL) {
        const char *name = NULL, *state = NULL;
        if (g_variant_lookup(agent, "name", "&s", &name) &&
            g_variant_lookup(agent, "state", "&s", &state))
            g_hash_table_replace(states, g_strdup(name), g_strdup(state));
        g_variant_unref(agent);
    }
    return states;
}

GVariant *
hostd_agent_list(HostdContext *ctx, GError **error)
{
    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < names->len; i++) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, names->pdata[i], NULL);
        if (r != NULL)
            g_variant_builder_add_value(&b, hostd_agent_to_variant(ctx, r));
    }
    return g_variant_builder_end(&b);
}

char *
hostd_agent_ssh_config(HostdContext *ctx, const char *name, char **ret_path, char **ret_host,
                       GError **error)
{
    if (name != NULL) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
        if (r == NULL)
            return NULL;
        if (ret_path != NULL)
            *ret_path = hostd_agent_record_path(r, HOSTD_AGENT_SSH_CONFIG);
        if (ret_host != NULL)
            *ret_host = g_strdup_printf("vmctl-%s", name);
        return hostd_agent_ssh_stanza(r);
    }

    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return NULL;
    g_autoptr(GString) all = g_string_new(NULL);
    for (guint i = 0; i < names->len; i++) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, names->pdata[i], NULL);
        if (r == NULL)
            continue;
        g_autofree char *stanza = hostd_agent_ssh_stanza(r);
        if (all->len > 0)
            g_string_append_c(all, '\n');
        g_string_append(all, stanza);
    }
    return g_string_free(g_steal_pointer(&all), FALSE);
}
