#include "hostd-warm.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-confine.h"
#include "hostd-guest-agent.h"
#include "hostd-ids.h"
#include "hostd-guest.h"
#include "hostd-libvirt.h"
#include "hostd-resources.h"
#include "hostd-secrets-guest.h"
#include "vm-domain.h"
#include "vm-error.h"
#include "vm-fs.h"
#include "vm-qemu-img.h"
#include "vm-save-image.h"
#include "vm-seed.h"
#include "vm-util.h"

#define WARM_DIR      "warm"
#define WARM_CURRENT  "current"
#define WARM_INI      "warm.ini"
#define WARM_DISK     "disk.qcow2"
#define WARM_MEMORY   "memory.save"
#define WARM_SEED     "seed.iso"
#define WARM_CONSOLE  "serial.sock"
#define WARM_GROUP    "warm"
#define WARM_HOSTNAME "vmctl-warm"
/* The first boot under TCG takes about a minute; a loaded host several. */
#define WARM_BOOT_TIMEOUT_MS   (10 * 60 * 1000)
#define WARM_SETTLE_TIMEOUT_MS (10 * 60 * 1000)
/* A restored guest agent answers within a second or two. */
#define WARM_AGENT_TIMEOUT_MS    (30 * 1000)
#define WARM_IDENTITY_TIMEOUT_MS (60 * 1000)

void
hostd_warm_image_free(HostdWarmImage *warm)
{
    if (warm == NULL)
        return;
    g_free(warm->dir);
    g_free(warm->disk_path);
    g_free(warm->memory_path);
    g_free(warm->instance_id);
    g_free(warm->mac);
    g_free(warm);
}

/* ---- What a warm image was made with: each must still hold to restore it */

typedef struct {
    const char *key;
    char *value;
    const char *what; /* for "stale: <what> changed" */
} WarmFact;

/* The template's parts that the warm boot ran: a change to them means another machine. */
static char *
warm_template_digest(const VmTemplate *tpl)
{
    g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
    g_checksum_update(sum, (const guchar *)tpl->user, -1);
    g_checksum_update(sum, (const guchar *)"\n", 1);
    if (tpl->user_data != NULL)
        g_checksum_update(sum, (const guchar *)tpl->user_data, -1);
    for (char **p = tpl->packages; p != NULL && *p != NULL; p++)
        g_checksum_update(sum, (const guchar *)*p, -1);
    return g_strdup(g_checksum_get_string(sum));
}

static char *
warm_file_id(const char *path)
{
    GStatBuf st;
    if (g_stat(path, &st) < 0)
        return g_strdup("missing");
    return g_strdup_printf("%" G_GUINT64_FORMAT ":%" G_GINT64_FORMAT ":%" G_GUINT64_FORMAT,
                           (guint64)st.st_size, (gint64)st.st_mtime, (guint64)st.st_ino);
}

static void
warm_fact_clear(gpointer data)
{
    g_free(((WarmFact *)data)->value);
}

/* The facts of this host now, for @tpl on @image. */
static GArray *
warm_facts_now(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image)
{
    GArray *facts = g_array_new(FALSE, TRUE, sizeof(WarmFact));
    g_array_set_clear_func(facts, warm_fact_clear);
    unsigned long qemu = 0, libvirt = 0;
    if (virConnectGetVersion(ctx->lv->conn, &qemu) < 0)
        virResetLastError();
    if (virConnectGetLibVersion(ctx->lv->conn, &libvirt) < 0)
        virResetLastError();
    g_autofree char *cpu =
        ctx->lv->cpu_disable != NULL ? g_strjoinv(",", ctx->lv->cpu_disable) : g_strdup("");
    WarmFact all[] = {
        {"base", warm_file_id(image->disk_path), "the base image"},
        {"kernel", image->kernel_path != NULL ? warm_file_id(image->kernel_path) : g_strdup(""),
         "the base image's kernel"},
        {"qemu", g_strdup_printf("%lu", qemu), "QEMU"},
        {"libvirt", g_strdup_printf("%lu", libvirt), "libvirt"},
        {"machine", g_strdup(VM_MACHINE_TYPE), "the machine type"},
        {"devices", g_strdup(VM_DOMAIN_DEVICES_VERSION), "the VM's devices"},
        {"virt-type", g_strdup(ctx->lv->virt_type), "the accelerator"},
        {"cpu-disable", g_strdup(cpu), "the guest CPU"},
        {"template", warm_template_digest(tpl), "the template"},
    };
    g_array_append_vals(facts, all, G_N_ELEMENTS(all));
    return facts;
}

static char *
warm_root(HostdContext *ctx, const char *template_name)
{
    return g_build_filename(ctx->config->images_dir, template_name, WARM_DIR, NULL);
}

/* ---- Lookup */

static HostdWarmImage *
warm_load(const char *dir, GKeyFile *kf, GError **error)
{
    g_autoptr(HostdWarmImage) warm = g_new0(HostdWarmImage, 1);
    warm->dir = g_strdup(dir);
    warm->disk_path = g_build_filename(dir, WARM_DISK, NULL);
    warm->memory_path = g_build_filename(dir, WARM_MEMORY, NULL);
    warm->instance_id = g_key_file_get_string(kf, WARM_GROUP, "instance-id", error);
    if (warm->instance_id == NULL)
        return NULL;
    warm->mac = g_key_file_get_string(kf, WARM_GROUP, "mac", error);
    if (warm->mac == NULL)
        return NULL;
    warm->cpus = (guint)g_key_file_get_uint64(kf, WARM_GROUP, "cpus", NULL);
    warm->memory_mib = (guint)g_key_file_get_uint64(kf, WARM_GROUP, "memory-mib", NULL);
    warm->disk_gib = (guint)g_key_file_get_uint64(kf, WARM_GROUP, "disk-gib", NULL);
    if (!g_file_test(warm->disk_path, G_FILE_TEST_IS_REGULAR) ||
        !g_file_test(warm->memory_path, G_FILE_TEST_IS_REGULAR)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "its files are missing");
        return NULL;
    }
    return g_steal_pointer(&warm);
}

HostdWarmImage *
hostd_warm_lookup(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image, guint cpus,
                  guint memory_mib, guint disk_gib, char **ret_why)
{
    g_autofree char *root = warm_root(ctx, tpl->name);
    g_autofree char *current = g_build_filename(root, WARM_CURRENT, NULL);
    g_autofree char *build = g_file_read_link(current, NULL);
    if (build == NULL || strchr(build, '/') != NULL) {
        *ret_why = g_strdup("no warm image built");
        return NULL;
    }
    g_autofree char *dir = g_build_filename(root, build, NULL);
    g_autofree char *ini = g_build_filename(dir, WARM_INI, NULL);
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdWarmImage) warm = NULL;
    if (!g_key_file_load_from_file(kf, ini, G_KEY_FILE_NONE, &error) ||
        (warm = warm_load(dir, kf, &error)) == NULL) {
        *ret_why = g_strdup_printf("the warm image cannot be read (%s)", error->message);
        return NULL;
    }
    g_autoptr(GArray) facts = warm_facts_now(ctx, tpl, image);
    for (guint i = 0; i < facts->len; i++) {
        const WarmFact *f = &g_array_index(facts, WarmFact, i);
        g_autofree char *then = g_key_file_get_string(kf, WARM_GROUP, f->key, NULL);
        if (g_strcmp0(then, f->value) != 0) {
            *ret_why =
                g_strdup_printf("the warm image is stale (%s changed since it was made)", f->what);
            return NULL;
        }
    }
    if (warm->cpus != cpus || warm->memory_mib != memory_mib || warm->disk_gib != disk_gib) {
        *ret_why = g_strdup_printf("the warm image has %u CPUs, %u MiB, %u GiB; asked for %u, "
                                   "%u, %u",
                                   warm->cpus, warm->memory_mib, warm->disk_gib, cpus, memory_mib,
                                   disk_gib);
        return NULL;
    }
    return g_steal_pointer(&warm);
}

char *
hostd_warm_state(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image)
{
    if (image == NULL)
        return g_strdup("no image");
    char *why = NULL;
    g_autoptr(HostdWarmImage) warm =
        hostd_warm_lookup(ctx, tpl, image, tpl->cpus, tpl->memory_mib, tpl->disk_gib, &why);
    return warm != NULL ? g_strdup("yes") : why;
}

/* ---- Build */

gboolean
hostd_warm_write_seed(const VmTemplate *tpl, const char *instance_id, const char *path,
                      GError **error)
{
    VmSeedSpec seed_spec = {
        .hostname = WARM_HOSTNAME,
        .instance_id = instance_id,
        .warm = TRUE,
        .user = tpl->user,
        .template_user_data = tpl->user_data,
        /* What every agent's seed has (hostd-egress, hostd-guest-api): the proxy's address
         * inside the guest is the same for all, and so is the in-guest API's. */
        .egress_proxy = "http://" VM_EGRESS_GUEST_ADDRESS ":" G_STRINGIFY(VM_EGRESS_GUEST_PORT),
        .egress_resolver = VM_EGRESS_GUEST_ADDRESS,
        .guest_api_host = VM_GUEST_API_ADDRESS,
        .guest_tool = TRUE,
    };
    return vm_seed_write_iso(&seed_spec, path, error);
}

/* Removes builds under @root that are not @keep and that no agent's disk stands on. */
static void
warm_remove_unused(HostdContext *ctx, const char *root, const char *keep)
{
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, NULL);
    if (records == NULL)
        return;
    g_autoptr(GDir) d = g_dir_open(root, 0, NULL);
    const char *entry;
    while (d != NULL && (entry = g_dir_read_name(d)) != NULL) {
        if (g_str_equal(entry, WARM_CURRENT) || g_strcmp0(entry, keep) == 0)
            continue;
        g_autofree char *dir = g_build_filename(root, entry, NULL);
        g_autofree char *disk = g_build_filename(dir, WARM_DISK, NULL);
        gboolean used = FALSE;
        for (guint i = 0; i < records->len && !used; i++) {
            const HostdAgentRecord *r = records->pdata[i];
            used = g_strcmp0(r->warm_base, disk) == 0;
        }
        if (!used)
            vm_remove_tree(dir, NULL);
    }
}

/* The warm machine's domain: what an agent's is (hostd_agent_domain_xml()) less its network
 * ways out and its API, which are host-side only and come with each agent's definition. */
static char *
warm_domain_xml(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image, const char *dir,
                const char *name, const char *mac, guint port, guint id, GError **error)
{
    g_autofree char *uuid = g_uuid_string_random();
    g_autofree char *genid = g_uuid_string_random();
    g_autofree char *disk = g_build_filename(dir, WARM_DISK, NULL);
    g_autofree char *seed = g_build_filename(dir, WARM_SEED, NULL);
    g_autofree char *console = g_build_filename(dir, WARM_CONSOLE, NULL);
    VmDomainSpec spec = {
        .name = name,
        .uuid = uuid,
        .genid = genid,
        .virt_type = ctx->lv->virt_type,
        .cpu_disable = (const char *const *)ctx->lv->cpu_disable,
        .cpus = tpl->cpus,
        .memory_mib = tpl->memory_mib,
        .disk_path = disk,
        .seed_path = seed,
        .kernel_path = image->kernel_path,
        .initrd_path = image->initrd_path,
        .cmdline = image->cmdline,
        .mac = mac,
        .ssh_port = port,
        .console_socket = console,
        .qemu_id = id,
    };
    return vm_domain_xml_build(&spec, error);
}

/* In the warm machine: waits for cloud-init, checks that no sshd runs and no host key exists,
 * drops the page cache and fills the free memory with zeros once: QEMU saves a zero page as a
 * flag, so the saved RAM (and each agent's restore, which reads all of it) is what the system
 * uses, not what it once read. */
static const char warm_settle_script[] =
    "cloud-init status --wait >/dev/null 2>&1; s=$?\n"
    "if systemctl is-active --quiet ssh.service; then echo 'sshd is running'; exit 90; fi\n"
    "if ls /etc/ssh/ssh_host_* >/dev/null 2>&1; then echo 'host keys exist'; exit 91; fi\n"
    "sync; echo 3 > /proc/sys/vm/drop_caches\n"
    "n=$(awk '/^MemAvailable:/ { print int($2 / 1024) - 96 }' /proc/meminfo)\n"
    "d=$(mktemp -d)\n"
    "if [ \"$n\" -gt 0 ] && mount -t tmpfs -o size=${n}m vmctl-zero \"$d\"; then\n"
    "  dd if=/dev/zero of=\"$d/zero\" bs=1M count=$n >/dev/null 2>&1\n"
    "  umount \"$d\"\n"
    "fi\n"
    "rmdir \"$d\"\n"
    "case $s in 0|2) exit 0;; *) echo \"cloud-init status $s\"; cloud-init status --long; "
    "exit $s;; esac\n";

static gboolean
warm_boot_and_save(HostdContext *ctx, const char *xml, const char *memory, VmProgressFunc progress,
                   gpointer progress_data, GError **error)
{
    g_autoptr(virDomain) dom = virDomainCreateXML(ctx->lv->conn, xml, 0);
    if (dom == NULL)
        return hostd_libvirt_throw(error, "cannot start the warm machine");
    hostd_progress(progress, progress_data, "booting the warm machine", -1);
    if (!hostd_guest_agent_wait(dom, WARM_BOOT_TIMEOUT_MS, error))
        goto fail;
    hostd_progress(progress, progress_data, "waiting for the warm machine to settle", -1);
    const char *argv[] = {"/bin/sh", "-c", warm_settle_script, NULL};
    int status = -1;
    g_autofree char *output = NULL;
    if (!hostd_guest_agent_exec(dom, argv, NULL, WARM_SETTLE_TIMEOUT_MS, &status, &output, error))
        goto fail;
    if (status != 0) {
        g_autofree char *text = vm_utf8_cut(output, 2048);
        vm_throw(error, VM_ERROR_IMAGE, "the warm machine did not settle (status %d): %s", status,
                 text);
        goto fail;
    }
    hostd_progress(progress, progress_data, "saving the warm machine", -1);
    if (virDomainSaveFlags(dom, memory, NULL, VIR_DOMAIN_SAVE_RUNNING) < 0) {
        hostd_libvirt_throw(error, "cannot save the warm machine");
        goto fail;
    }
    return TRUE;

fail:
    if (virDomainDestroy(dom) < 0)
        virResetLastError();
    return FALSE;
}

gboolean
hostd_warm_build(HostdContext *ctx, const VmTemplate *tpl, const VmImage *image,
                 VmProgressFunc progress, gpointer progress_data, GError **error)
{
    /* An mmdebstrap image has its packages built in; a downloaded one installs them at the
     * first boot. */
    if (tpl->source == VM_IMAGE_SOURCE_URL && tpl->packages != NULL && tpl->packages[0] != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "template %s installs packages at first boot, which needs the network: "
                        "its agents boot cold",
                        tpl->name);
    g_autofree char *root = warm_root(ctx, tpl->name);
    if (g_mkdir_with_parents(root, 0755) < 0)
        return vm_throw_errno(error, errno, "cannot create %s", root);
    g_autofree char *build = g_strdup_printf("%" G_GINT64_FORMAT, g_get_real_time());
    g_autofree char *tmp_name = g_strconcat(".", build, ".tmp", NULL);
    g_autofree char *tmp = g_build_filename(root, tmp_name, NULL);
    g_autofree char *dir = g_build_filename(root, build, NULL);
    if (g_mkdir(tmp, 0755) < 0)
        return vm_throw_errno(error, errno, "cannot create %s", tmp);

    g_autofree char *disk = g_build_filename(tmp, WARM_DISK, NULL);
    g_autofree char *seed = g_build_filename(tmp, WARM_SEED, NULL);
    g_autofree char *memory = g_build_filename(tmp, WARM_MEMORY, NULL);
    g_autofree char *instance_id = g_strdup_printf("vmctl-warm-%s-%s", tpl->name, build);
    g_autofree char *mac = hostd_random_mac();
    g_autofree char *name = g_strdup_printf("vmctl.warm.%s", tpl->name);
    guint port = 0;
    g_mutex_lock(&ctx->lock);
    gboolean have_port = hostd_allocate_port(ctx, 0, &port, NULL, error);
    g_mutex_unlock(&ctx->lock);
    g_autofree char *xml = NULL;
    /* The build machine's QEMU runs as an id of its own too, held while it runs; its disk and
     * seed are that id's until the disk becomes a shared image, root's and read-only. */
    guint id = 0;
    gboolean ok =
        have_port && hostd_confine_hold(ctx, &id, error) &&
        vm_qemu_img_overlay(image->disk_path, disk, tpl->disk_gib, error) &&
        hostd_warm_write_seed(tpl, instance_id, seed, error) &&
        (id == 0 || (hostd_ids_own(disk, id, id, 0600, NULL, 0, 0, error) &&
                     hostd_ids_own(seed, id, id, 0400, NULL, 0, 0, error))) &&
        (xml = warm_domain_xml(ctx, tpl, image, tmp, name, mac, port, id, error)) != NULL &&
        warm_boot_and_save(ctx, xml, memory, progress, progress_data, error);
    hostd_confine_unhold(ctx, id);

    if (ok) {
        g_autoptr(GArray) facts = warm_facts_now(ctx, tpl, image);
        g_autoptr(GKeyFile) kf = g_key_file_new();
        for (guint i = 0; i < facts->len; i++) {
            const WarmFact *f = &g_array_index(facts, WarmFact, i);
            g_key_file_set_string(kf, WARM_GROUP, f->key, f->value);
        }
        g_key_file_set_string(kf, WARM_GROUP, "instance-id", instance_id);
        g_key_file_set_string(kf, WARM_GROUP, "mac", mac);
        g_key_file_set_uint64(kf, WARM_GROUP, "cpus", tpl->cpus);
        g_key_file_set_uint64(kf, WARM_GROUP, "memory-mib", tpl->memory_mib);
        g_key_file_set_uint64(kf, WARM_GROUP, "disk-gib", tpl->disk_gib);
        gsize len = 0;
        g_autofree char *text = g_key_file_to_data(kf, &len, NULL);
        g_autofree char *ini = g_build_filename(tmp, WARM_INI, NULL);
        g_autofree char *current_tmp = g_build_filename(root, ".current.tmp", NULL);
        g_autofree char *current = g_build_filename(root, WARM_CURRENT, NULL);
        /* The seed and console socket were the warm boot's only. Agents never write the disk
         * layer: read-only from now on. */
        g_unlink(seed);
        g_autofree char *console = g_build_filename(tmp, WARM_CONSOLE, NULL);
        g_unlink(console);
        g_unlink(current_tmp);
        ok = vm_file_write_atomic(ini, text, (gssize)len, 0644, error) &&
             vm_file_sync(disk, error) && vm_file_sync(memory, error);
        if (ok && (chmod(disk, 0444) < 0 || chmod(memory, 0400) < 0))
            ok = vm_throw_errno(error, errno, "cannot make %s read-only", tmp);
        if (ok && id != 0)
            ok = hostd_ids_own(disk, 0, 0, 0444, NULL, 0, 0, error);
        if (ok && g_rename(tmp, dir) < 0)
            ok = vm_throw_errno(error, errno, "cannot rename %s", tmp);
        if (ok && (symlink(build, current_tmp) < 0 || g_rename(current_tmp, current) < 0))
            ok = vm_throw_errno(error, errno, "cannot make %s current", dir);
        if (ok)
            ok = vm_file_sync(root, error);
        if (!ok)
            vm_remove_tree(dir, NULL);
    }
    if (!ok) {
        vm_remove_tree(tmp, NULL);
        return FALSE;
    }
    warm_remove_unused(ctx, root, build);
    return TRUE;
}

/* ---- Restore into an agent */

/* Run as root in the restored guest through the guest agent: $1 hostname, $2 machine-id, $3 the
 * user, $4 hostd's agent key, $5 the host public key, $6 a key comment to drop or "", $7 the
 * egress CA certificate to trust or "", $8 the block of grants for /etc/environment or "".
 * Standard input: a line of fresh entropy (hex), then the host private key. sshd starts last, so
 * nothing answers before the identity is whole. */
static const char warm_identity_script[] =
    /* Shell builtins wherever they do: under emulation each program started costs tens of ms. */
    "set -e\n"
    "umask 022\n"
    "ca_path=" VM_SEED_EGRESS_CA_PATH "\n"
    "printf '%s\\n' \"$1\" > /etc/hostname\n"
    "printf '%s' \"$1\" > /proc/sys/kernel/hostname\n"
    "hosts= found=\n"
    "while IFS= read -r line || [ -n \"$line\" ]; do\n"
    "  case $line in 127.0.1.1[[:space:]]*) line=\"127.0.1.1 $1\" found=1;; esac\n"
    "  hosts=\"$hosts$line\n\"\n"
    "done < /etc/hosts\n"
    "[ -n \"$found\" ] || hosts=\"${hosts}127.0.1.1 $1\n\"\n"
    "printf '%s' \"$hosts\" > /etc/hosts\n"
    "printf '%s\\n' \"$2\" > /etc/machine-id\n"
    "read -r entropy\n"
    "printf '%s' \"$entropy\" > /dev/urandom\n"
    "for f in /etc/ssh/ssh_host_*; do if [ -e \"$f\" ]; then rm -f /etc/ssh/ssh_host_*; fi; "
    "break; done\n"
    "umask 077\n"
    "key=\n"
    "while IFS= read -r line || [ -n \"$line\" ]; do key=\"$key$line\n\"; done\n"
    "printf '%s' \"$key\" > /etc/ssh/ssh_host_ed25519_key\n"
    "umask 022\n"
    "printf '%s\\n' \"$5\" > /etc/ssh/ssh_host_ed25519_key.pub\n"
    "home=\n"
    "while IFS=: read -r n x u g gecos h sh; do\n"
    "  if [ \"$n\" = \"$3\" ]; then home=$h uid=$u gid=$g; break; fi\n"
    "done < /etc/passwd\n"
    "[ -n \"$home\" ]\n"
    "[ -d \"$home/.ssh\" ] || mkdir -m 700 \"$home/.ssh\"\n"
    "f=\"$home/.ssh/authorized_keys\" keys=\n"
    "if [ -f \"$f\" ]; then\n"
    "  while IFS= read -r line || [ -n \"$line\" ]; do\n"
    "    if [ -n \"$6\" ]; then case $line in *\" $6\") continue;; esac; fi\n"
    "    keys=\"$keys$line\n\"\n"
    "  done < \"$f\"\n"
    "fi\n"
    "umask 077\n"
    "printf '%s%s\\n' \"$keys\" \"$4\" > \"$f\"\n"
    "chown \"$uid:$gid\" \"$home/.ssh\" \"$f\"\n"
    "umask 022\n"
    "if [ -n \"$7\" ]; then\n"
    "  mkdir -p \"${ca_path%/*}\"\n"
    "  printf '%s' \"$7\" > \"$ca_path\"\n"
    "  (set -- \"$ca_path\" \"\" " VM_SEED_CA_BUNDLE_PATH "\n" VM_SEED_TRUST_CA_SCRIPT ")\n"
    "fi\n"
    "if [ -n \"$8\" ]; then\n"
    "  (set -- " HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH
    " \"$8\"\n" HOSTD_SECRETS_GUEST_ENVIRONMENT_SET_SCRIPT ")\n"
    "fi\n"
    ": > " VM_SEED_WARM_IDENTITY_FLAG "\n"
    "systemctl restart ssh.service\n"
    /* The login message's dynamic part is written once a boot (the image's vmctl-motd.service),
     * and this boot's named the warm machine: written again, after sshd, in the background. */
    "if [ -d /etc/update-motd.d ]; then\n"
    "  (umask 022; run-parts --lsbsysinit /etc/update-motd.d > /run/motd.dynamic.new &&\n"
    "   mv /run/motd.dynamic.new /run/motd.dynamic) < /dev/null > /dev/null 2>&1 &\n"
    "fi\n";

static gboolean
warm_apply_identity(virDomainPtr dom, const HostdWarmIdentity *id, GError **error)
{
    guint8 entropy[64];
    for (gsize i = 0; i < sizeof(entropy); i += 4) {
        guint32 v = g_random_int();
        memcpy(entropy + i, &v, 4);
    }
    g_autoptr(GString) input = g_string_new(NULL);
    for (gsize i = 0; i < sizeof(entropy); i++)
        g_string_append_printf(input, "%02x", entropy[i]);
    g_string_append_c(input, '\n');
    g_string_append(input, id->host_key_private);
    g_autoptr(GBytes) bytes = g_bytes_new(input->str, input->len);
    const char *argv[] = {"/bin/sh",
                          "-c",
                          warm_identity_script,
                          "sh",
                          id->hostname,
                          id->machine_id,
                          id->user,
                          id->agent_key,
                          id->host_key_public,
                          id->drop_comment != NULL ? id->drop_comment : "",
                          id->egress_ca_pem != NULL ? id->egress_ca_pem : "",
                          id->environment_block != NULL ? id->environment_block : "",
                          NULL};
    int status = -1;
    g_autofree char *output = NULL;
    gboolean ok =
        hostd_guest_agent_exec(dom, argv, bytes, WARM_IDENTITY_TIMEOUT_MS, &status, &output, error);
    /* The key passed through this buffer: do not leave it in freed memory. */
    memset(input->str, 0, input->len);
    if (!ok)
        return FALSE;
    if (status != 0) {
        g_autofree char *text = vm_utf8_cut(output, 2048);
        return vm_throw(error, VM_ERROR_FAILED,
                        "giving the agent its identity failed (status %d): %s", status, text);
    }
    return TRUE;
}

static gint64
warm_ms_since(gint64 *t)
{
    gint64 now = g_get_monotonic_time();
    gint64 ms = (now - *t) / 1000;
    *t = now;
    return ms;
}

gboolean
hostd_warm_restore(HostdContext *ctx, virDomainPtr dom, const char *memory_path, const char *xml,
                   const char *scratch_path, const HostdWarmIdentity *id, char **ret_trace,
                   GError **error)
{
    g_autoptr(GString) trace = g_string_new(NULL);
    gint64 t = g_get_monotonic_time();
    if (!vm_save_image_copy_with_xml(memory_path, scratch_path, xml, error))
        return FALSE;
    g_string_append_printf(trace, "copy %" G_GINT64_FORMAT " ms", warm_ms_since(&t));
    int rc = virDomainRestoreFlags(ctx->lv->conn, scratch_path, NULL,
                                   id != NULL ? VIR_DOMAIN_SAVE_RUNNING : VIR_DOMAIN_SAVE_PAUSED);
    /* Restored or not, the copy is of no more use (QEMU has read it all). */
    g_unlink(scratch_path);
    if (rc < 0)
        return hostd_libvirt_throw(error, "cannot restore the warm image");
    g_string_append_printf(trace, ", restore %" G_GINT64_FORMAT " ms", warm_ms_since(&t));
    if (id != NULL && !hostd_warm_identify(ctx, dom, id, trace, error))
        return FALSE;
    if (ret_trace != NULL)
        *ret_trace = g_string_free(g_steal_pointer(&trace), FALSE);
    return TRUE;
}

gboolean
hostd_warm_identify(HostdContext *ctx, virDomainPtr dom, const HostdWarmIdentity *id,
                    GString *trace, GError **error)
{
    gint64 t = g_get_monotonic_time();
    hostd_guest_agent_bound(dom);
    g_autoptr(HostdClockSync) clock = hostd_guest_sync_clock_begin(ctx, dom, id->hostname);
    if (!hostd_guest_agent_wait(dom, WARM_AGENT_TIMEOUT_MS, error))
        return FALSE;
    g_string_append_printf(trace, ", guest agent %" G_GINT64_FORMAT " ms", warm_ms_since(&t));
    if (!warm_apply_identity(dom, id, error))
        return FALSE;
    g_string_append_printf(trace, ", identity %" G_GINT64_FORMAT " ms", warm_ms_since(&t));
    return TRUE;
}
