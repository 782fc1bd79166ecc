/* hostd over libvirt's test driver, with fakes where it cannot go; see test-hostd-fixture.h. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-modules.h"
#include "hostd-power.h"
#include "hostd-server.h"
#include "vm-config.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "hostd-cluster.h"
#include "test-sink.h"

#define FAKE_IMAGE_MAGIC "fake-qcow2"

/* ---- the fake qemu-img ---------------------------------------------------------------------- */

/* Follows "dir=<the fixture's dir>". A call whose arguments contain what qemu-img.fail holds
 * fails. Every file a call would open, as the real one does (the image, and for a chain each
 * backing file and data file its header names: a line "data-file=PATH"), is added to
 * qemu-img.opened. Options hostd passes are skipped; the first other argument
 * is the image. A safe rebase needs both the old and the new backing chain readable, as the
 * real one does. Who ran each call is in qemu-img.uids ("UID SUBCOMMAND"). */
static const char fake_qemu_img_body[] =
    "echo \"$*\" >> \"$dir/qemu-img.log\"\n"
    "echo \"$(id -u) $1\" >> \"$dir/qemu-img.uids\"\n"
    "if [ -f \"$dir/qemu-img.fail\" ]; then\n"
    "    case \"$*\" in *\"$(cat \"$dir/qemu-img.fail\")\"*)\n"
    "        echo \"qemu-img: $1: injected failure\" >&2\n"
    "        exit 1 ;;\n"
    "    esac\n"
    "fi\n"
    "cmd=$1\n"
    "shift\n"
    "backing=\n"
    "unsafe=\n"
    "chain=\n"
    "path=\n"
    "while [ $# -gt 0 ]; do\n"
    "    case $1 in\n"
    "    -b) backing=$2; shift 2 ;;\n"
    "    -f|-F|-o) shift 2 ;;\n"
    "    -u) unsafe=1; shift ;;\n"
    "    --backing-chain) chain=1; shift ;;\n"
    "    -*) shift ;;\n"
    "    *) [ -n \"$path\" ] || path=$1; shift ;;\n"
    "    esac\n"
    "done\n"
    "fake() { [ -f \"$1\" ] && IFS= read -r first < \"$1\" && [ \"$first\" = " FAKE_IMAGE_MAGIC
    " ]; }\n"
    "backing_of() { sed -n 's/^backing=//p' \"$1\"; }\n"
    "fail() { echo \"qemu-img: $1\" >&2; exit 1; }\n"
    "walk() {\n"
    "    p=$1\n"
    "    while [ -n \"$p\" ]; do\n"
    "        echo \"$p\" >> \"$dir/qemu-img.opened\"\n"
    "        fake \"$p\" || return 0\n"
    "        sed -n 's/^data-file=//p' \"$p\" >> \"$dir/qemu-img.opened\"\n"
    "        p=$(backing_of \"$p\")\n"
    "    done\n"
    "}\n"
    "case $cmd in\n"
    "create)\n"
    "    [ -z \"$backing\" ] || [ -n \"$unsafe\" ] || walk \"$backing\"\n"
    "    if [ -n \"$backing\" ] && [ -z \"$unsafe\" ] && ! fake \"$backing\"; then\n"
    "        fail \"$path: Could not open backing file $backing\"\n"
    "    fi\n"
    "    printf '" FAKE_IMAGE_MAGIC "\\nbacking=%s\\n' \"$backing\" > \"$path\" ;;\n"
    "rebase)\n"
    "    walk \"$path\"\n"
    "    [ -z \"$backing\" ] || walk \"$backing\"\n"
    "    fake \"$path\" || fail \"Could not open $path\"\n"
    "    old=$(backing_of \"$path\")\n"
    "    if [ -z \"$unsafe\" ] && [ -n \"$old\" ] && ! fake \"$old\"; then\n"
    "        fail \"Could not open old backing file $old\"\n"
    "    fi\n"
    "    if [ -n \"$backing\" ] && ! fake \"$backing\"; then\n"
    "        fail \"Could not open new backing file $backing\"\n"
    "    fi\n"
    "    printf '" FAKE_IMAGE_MAGIC "\\nbacking=%s\\n' \"$backing\" > \"$path\" ;;\n"
    "resize)\n"
    "    walk \"$path\"\n"
    "    fake \"$path\" || fail \"Could not open $path\" ;;\n"
    "info)\n"
    "    if [ -z \"$chain\" ]; then\n"
    "        echo \"$path\" >> \"$dir/qemu-img.opened\"\n"
    "        fake \"$path\" || fail \"Could not open $path\"\n"
    "        b= d= bf=qcow2\n"
    "        while IFS= read -r line; do\n"
    "            case $line in\n"
    "            backing=*) b=${line#backing=} ;;\n"
    "            backing-format=*) bf=${line#backing-format=} ;;\n"
    "            data-file=*) d=${line#data-file=} ;;\n"
    "            esac\n"
    "        done < \"$path\"\n"
    "        printf '{\"filename\": \"%s\", \"format\": \"qcow2\"' \"$path\"\n"
    "        [ -z \"$b\" ] || printf ', \"full-backing-filename\": \"%s\", "
    "\"backing-filename-format\": \"%s\"' \"$b\" \"$bf\"\n"
    "        [ -z \"$d\" ] || printf ', \"format-specific\": {\"type\": \"qcow2\", "
    "\"data\": {\"data-file\": \"%s\"}}' \"$d\"\n"
    "        echo '}'\n"
    "        exit 0\n"
    "    fi\n"
    "    walk \"$path\"\n"
    "    p=$path\n"
    "    sep='['\n"
    "    while [ -n \"$p\" ]; do\n"
    "        fake \"$p\" || fail \"Could not open $p\"\n"
    "        printf '%s{\"filename\": \"%s\", \"format\": \"qcow2\"}' \"$sep\" \"$p\"\n"
    "        sep=', '\n"
    "        p=$(backing_of \"$p\")\n"
    "    done\n"
    "    echo ']' ;;\n"
    "*) fail \"unknown command $cmd\" ;;\n"
    "esac\n";

static void
write_fake_qemu_img(const char *bin_dir, const char *dir)
{
    g_autofree char *path = g_build_filename(bin_dir, "qemu-img", NULL);
    g_autofree char *quoted = g_shell_quote(dir);
    g_autofree char *script = g_strconcat(
        "#!/bin/sh\n# qemu-img for hostd's unit tests (test-hostd-fixture.c)\ndir=", quoted, "\n",
        fake_qemu_img_body, NULL);

    vm_test_write_file(path, script);
    assert_int_equal(g_chmod(path, 0755), 0);
}

void
hostd_test_image_write(const char *path, const char *backing)
{
    g_autofree char *text =
        g_strdup_printf(FAKE_IMAGE_MAGIC "\nbacking=%s\n", backing != NULL ? backing : "");

    vm_test_write_file(path, text);
}

char *
hostd_test_image_backing(const char *path)
{
    g_autofree char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return NULL;
    if (!g_str_has_prefix(text, FAKE_IMAGE_MAGIC "\nbacking="))
        fail_msg("%s is not a fake image", path);
    char *start = text + strlen(FAKE_IMAGE_MAGIC "\nbacking=");
    char *end = strchr(start, '\n');
    return g_strndup(start, end != NULL ? (gsize)(end - start) : strlen(start));
}

char *
hostd_test_qemu_img_log(HostdTestFixture *f)
{
    g_autofree char *path = g_build_filename(f->dir, "qemu-img.log", NULL);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

char *
hostd_test_qemu_img_opened(HostdTestFixture *f)
{
    g_autofree char *path = g_build_filename(f->dir, "qemu-img.opened", NULL);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

void
hostd_test_qemu_img_fail(HostdTestFixture *f, const char *pattern)
{
    g_autofree char *path = g_build_filename(f->dir, "qemu-img.fail", NULL);

    if (pattern == NULL)
        g_unlink(path);
    else
        vm_test_write_file(path, pattern);
}

/* ---- libvirt where the test driver cannot go -------------------------------------------------
 * These replace libvirt's public functions of the same names in the test programs (hostd's
 * library calls them through the executable); what they do not fake goes to the real one. */

static GMutex fake_lock;
static struct {
    gboolean guest_agent;
    gboolean frozen;          /* between a faked freeze and its thaw */
    guint snapshots_unfrozen; /* disk switches of a running domain while not frozen */
    guint snapshots;
    GString *block_jobs;
    char *saved_xml;
    GHashTable *idle_cpu;   /* domain names */
    GHashTable *no_info;    /* domain names */
    GHashTable *clock_sets; /* domain name -> count */
    guint saved_restore_failures;
} fake;

/* Handed out for the snapshots faked here; virDomainSnapshotFree() knows it. */
static char fake_snapshot_token;

static gpointer
real_symbol(const char *name)
{
    gpointer p = dlsym(RTLD_NEXT, name);

    if (p == NULL)
        fail_msg("no real %s: %s", name, dlerror());
    return p;
}

#define REAL(fn) ((__typeof__(&fn))real_symbol(#fn))

static void
fakes_reset(void)
{
    g_mutex_lock(&fake_lock);
    fake.guest_agent = FALSE;
    fake.frozen = FALSE;
    fake.snapshots_unfrozen = 0;
    fake.snapshots = 0;
    if (fake.block_jobs == NULL)
        fake.block_jobs = g_string_new(NULL);
    g_string_truncate(fake.block_jobs, 0);
    g_clear_pointer(&fake.saved_xml, g_free);
    g_clear_pointer(&fake.idle_cpu, g_hash_table_unref);
    fake.idle_cpu = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_clear_pointer(&fake.no_info, g_hash_table_unref);
    fake.no_info = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_clear_pointer(&fake.clock_sets, g_hash_table_unref);
    fake.clock_sets = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    fake.saved_restore_failures = 0;
    g_mutex_unlock(&fake_lock);
}

/* The value of the first "<source file='...'" after @from in @xml, or NULL. */
static char *
xml_source_file(const char *xml, const char *from)
{
    const char *p = xml != NULL && from != NULL ? strstr(xml, from) : NULL;
    const char *needle = "<source file='";

    p = p != NULL ? strstr(p, needle) : NULL;
    if (p == NULL)
        return NULL;
    p += strlen(needle);
    const char *end = strchr(p, '\'');
    return end != NULL ? g_strndup(p, (gsize)(end - p)) : NULL;
}

/* The file of the domain's first disk in its persistent definition, which hostd keeps on the
 * disk the guest writes to. */
static char *
fake_current_disk(virDomainPtr dom)
{
    g_autofree char *xml = virDomainGetXMLDesc(dom, VIR_DOMAIN_XML_INACTIVE);

    return xml_source_file(xml, "device='disk'");
}

virDomainSnapshotPtr
virDomainSnapshotCreateXML(virDomainPtr domain, const char *xmlDesc, unsigned int flags)
{
    gboolean memory = strstr(xmlDesc, "<memory snapshot='external'") != NULL;

    if ((!(flags & VIR_DOMAIN_SNAPSHOT_CREATE_DISK_ONLY) && !memory) ||
        virDomainIsActive(domain) != 1)
        return REAL(virDomainSnapshotCreateXML)(domain, xmlDesc, flags);
    g_mutex_lock(&fake_lock);
    gboolean agent = fake.guest_agent;
    g_mutex_unlock(&fake_lock);
    /* The test driver refuses these flags: a real libvirt error, as a guest agent that does not
     * answer gives one. */
    if ((flags & VIR_DOMAIN_SNAPSHOT_CREATE_QUIESCE) && !agent)
        return REAL(virDomainSnapshotCreateXML)(domain, xmlDesc, flags);
    g_mutex_lock(&fake_lock);
    if (!fake.frozen && !memory)
        fake.snapshots_unfrozen++;
    g_mutex_unlock(&fake_lock);

    /* QEMU switches the disk to the new overlay, on the file it wrote to until now. */
    g_autofree char *overlay = xml_source_file(xmlDesc, "<disk name='vda'");
    g_autofree char *current = fake_current_disk(domain);
    if (overlay == NULL || current == NULL)
        fail_msg("a snapshot without a new overlay for vda: %s", xmlDesc);
    if (!(flags & VIR_DOMAIN_SNAPSHOT_CREATE_REUSE_EXT) ||
        !g_file_test(overlay, G_FILE_TEST_EXISTS))
        hostd_test_image_write(overlay, current);
    if (memory) {
        const char *m = strstr(xmlDesc, "<memory snapshot='external' file='");
        g_autofree char *file = NULL;
        m += strlen("<memory snapshot='external' file='");
        file = g_strndup(m, (gsize)(strchr(m, '\'') - m));
        vm_test_write_file(file, "fake saved memory\n");
    }
    g_mutex_lock(&fake_lock);
    fake.snapshots++;
    g_mutex_unlock(&fake_lock);
    return (virDomainSnapshotPtr)(void *)&fake_snapshot_token;
}

int
virDomainSnapshotFree(virDomainSnapshotPtr snapshot)
{
    if ((void *)snapshot == (void *)&fake_snapshot_token)
        return 0;
    return REAL(virDomainSnapshotFree)(snapshot);
}

/* A live block pull that finishes at once: the running disk then stands on @base. */
int
virDomainBlockRebase(virDomainPtr dom, const char *disk, const char *base, unsigned long bandwidth,
                     unsigned int flags)
{
    g_autofree char *top = fake_current_disk(dom);

    if (top == NULL || base == NULL || virDomainIsActive(dom) != 1)
        return REAL(virDomainBlockRebase)(dom, disk, base, bandwidth, flags);
    hostd_test_image_write(top, base);
    g_mutex_lock(&fake_lock);
    g_string_append_printf(fake.block_jobs, "pull %s\n", base);
    g_mutex_unlock(&fake_lock);
    return 0;
}

/* A live block commit of @top into @base that finishes at once: what stood on @top then stands
 * on @base. */
int
virDomainBlockCommit(virDomainPtr dom, const char *disk, const char *base, const char *top,
                     unsigned long bandwidth, unsigned int flags)
{
    if (base == NULL || top == NULL || virDomainIsActive(dom) != 1)
        return REAL(virDomainBlockCommit)(dom, disk, base, top, bandwidth, flags);
    g_autofree char *dir_path = g_path_get_dirname(top);
    g_autoptr(GDir) dir = g_dir_open(dir_path, 0, NULL);
    const char *entry;
    while (dir != NULL && (entry = g_dir_read_name(dir)) != NULL) {
        g_autofree char *path = g_build_filename(dir_path, entry, NULL);
        g_autofree char *text = NULL;
        if (!g_str_has_suffix(entry, ".qcow2") || !g_file_get_contents(path, &text, NULL, NULL) ||
            !g_str_has_prefix(text, FAKE_IMAGE_MAGIC))
            continue;
        g_autofree char *backing = hostd_test_image_backing(path);
        if (g_strcmp0(backing, top) == 0)
            hostd_test_image_write(path, base);
    }
    g_mutex_lock(&fake_lock);
    g_string_append_printf(fake.block_jobs, "commit %s %s\n", base, top);
    g_mutex_unlock(&fake_lock);
    return 0;
}

/* A live resize of a running domain's disk, which the test driver lacks: logged as a block job,
 * "resize DISK BYTES". */
int
virDomainBlockResize(virDomainPtr dom, const char *disk, unsigned long long size,
                     unsigned int flags)
{
    if (virDomainIsActive(dom) != 1 || !(flags & VIR_DOMAIN_BLOCK_RESIZE_BYTES))
        return REAL(virDomainBlockResize)(dom, disk, size, flags);
    g_mutex_lock(&fake_lock);
    g_string_append_printf(fake.block_jobs, "resize %s %llu\n", disk, size);
    g_mutex_unlock(&fake_lock);
    return 0;
}

/* The fake jobs above are over before anyone asks. */
int
virDomainGetBlockJobInfo(virDomainPtr dom, const char *disk, virDomainBlockJobInfoPtr info,
                         unsigned int flags)
{
    (void)dom;
    (void)disk;
    (void)flags;
    memset(info, 0, sizeof(*info));
    return 0;
}

int
virDomainManagedSaveDefineXML(virDomainPtr domain, const char *dxml, unsigned int flags)
{
    if (virDomainHasManagedSaveImage(domain, 0) != 1)
        return REAL(virDomainManagedSaveDefineXML)(domain, dxml, flags);
    g_mutex_lock(&fake_lock);
    g_free(fake.saved_xml);
    fake.saved_xml = g_strdup(dxml);
    g_mutex_unlock(&fake_lock);
    return 0;
}

/* The definition a saved state holds: the one last given to it, where the test driver keeps
 * none of its own. */
char *
virDomainManagedSaveGetXMLDesc(virDomainPtr domain, unsigned int flags)
{
    g_mutex_lock(&fake_lock);
    char *xml = virDomainHasManagedSaveImage(domain, 0) == 1 ? g_strdup(fake.saved_xml) : NULL;
    g_mutex_unlock(&fake_lock);
    return xml != NULL ? xml : REAL(virDomainManagedSaveGetXMLDesc)(domain, flags);
}

int
virDomainGetInfo(virDomainPtr domain, virDomainInfoPtr info)
{
    g_mutex_lock(&fake_lock);
    gboolean unreadable = g_hash_table_contains(fake.no_info, virDomainGetName(domain));
    g_mutex_unlock(&fake_lock);
    /* No info to give: a real libvirt error, for the argument it cannot take. */
    if (unreadable)
        return REAL(virDomainGetInfo)(domain, NULL);

    int ret = REAL(virDomainGetInfo)(domain, info);
    g_mutex_lock(&fake_lock);
    if (ret == 0 && g_hash_table_contains(fake.idle_cpu, virDomainGetName(domain)))
        info->cpuTime = G_USEC_PER_SEC;
    g_mutex_unlock(&fake_lock);
    return ret;
}

int
virDomainSetTime(virDomainPtr dom, long long seconds, unsigned int nseconds, unsigned int flags)
{
    int ret = REAL(virDomainSetTime)(dom, seconds, nseconds, flags);

    if (ret == 0) {
        g_mutex_lock(&fake_lock);
        const char *name = virDomainGetName(dom);
        guint n = GPOINTER_TO_UINT(g_hash_table_lookup(fake.clock_sets, name));
        g_hash_table_insert(fake.clock_sets, g_strdup(name), GUINT_TO_POINTER(n + 1));
        g_mutex_unlock(&fake_lock);
    }
    return ret;
}

int
virDomainCreate(virDomainPtr domain)
{
    gboolean fail = FALSE;

    g_mutex_lock(&fake_lock);
    if (fake.saved_restore_failures > 0 && virDomainHasManagedSaveImage(domain, 0) == 1) {
        fake.saved_restore_failures--;
        fail = TRUE;
    }
    g_mutex_unlock(&fake_lock);
    /* A flag no driver knows: a real libvirt error, as a state file that does not load gives. */
    if (fail)
        return REAL(virDomainCreateWithFlags)(domain, 1U << 31);
    return REAL(virDomainCreate)(domain);
}

/* The guest agent's freeze and thaw: one filesystem when it answers, a real libvirt error (a flag
 * no driver knows) when it does not. */
int
virDomainFSFreeze(virDomainPtr dom, const char **mountpoints, unsigned int nmountpoints,
                  unsigned int flags)
{
    g_mutex_lock(&fake_lock);
    gboolean agent = fake.guest_agent;
    if (agent)
        fake.frozen = TRUE;
    g_mutex_unlock(&fake_lock);
    return agent ? 1 : REAL(virDomainFSFreeze)(dom, mountpoints, nmountpoints, flags | 1U << 31);
}

int
virDomainFSThaw(virDomainPtr dom, const char **mountpoints, unsigned int nmountpoints,
                unsigned int flags)
{
    g_mutex_lock(&fake_lock);
    gboolean agent = fake.guest_agent;
    if (agent)
        fake.frozen = FALSE;
    g_mutex_unlock(&fake_lock);
    return agent ? 1 : REAL(virDomainFSThaw)(dom, mountpoints, nmountpoints, flags | 1U << 31);
}

gboolean
hostd_test_fake_frozen(void)
{
    g_mutex_lock(&fake_lock);
    gboolean frozen = fake.frozen;
    g_mutex_unlock(&fake_lock);
    return frozen;
}

guint
hostd_test_fake_snapshots_unfrozen(void)
{
    g_mutex_lock(&fake_lock);
    guint n = fake.snapshots_unfrozen;
    g_mutex_unlock(&fake_lock);
    return n;
}

void
hostd_test_fake_guest_agent(gboolean answers)
{
    g_mutex_lock(&fake_lock);
    fake.guest_agent = answers;
    g_mutex_unlock(&fake_lock);
}

guint
hostd_test_fake_snapshots(void)
{
    g_mutex_lock(&fake_lock);
    guint n = fake.snapshots;
    g_mutex_unlock(&fake_lock);
    return n;
}

char *
hostd_test_fake_block_jobs(void)
{
    g_mutex_lock(&fake_lock);
    char *text = g_strdup(fake.block_jobs->str);
    g_mutex_unlock(&fake_lock);
    return text;
}

char *
hostd_test_fake_saved_xml(void)
{
    g_mutex_lock(&fake_lock);
    char *xml = g_strdup(fake.saved_xml);
    g_mutex_unlock(&fake_lock);
    return xml;
}

void
hostd_test_fake_idle_cpu(const char *name)
{
    g_mutex_lock(&fake_lock);
    g_hash_table_add(fake.idle_cpu, g_strdup(name));
    g_mutex_unlock(&fake_lock);
}

void
hostd_test_fake_cpu_unreadable(const char *name)
{
    g_mutex_lock(&fake_lock);
    g_hash_table_add(fake.no_info, g_strdup(name));
    g_mutex_unlock(&fake_lock);
}

guint
hostd_test_fake_clock_sets(const char *name)
{
    g_mutex_lock(&fake_lock);
    guint n = GPOINTER_TO_UINT(g_hash_table_lookup(fake.clock_sets, name));
    g_mutex_unlock(&fake_lock);
    return n;
}

void
hostd_test_fake_saved_restore_fails(guint n)
{
    g_mutex_lock(&fake_lock);
    fake.saved_restore_failures = n;
    g_mutex_unlock(&fake_lock);
}

/* ---- captured log --------------------------------------------------------------------------- */

static GMutex log_lock;
static GPtrArray *log_lines;

static void
capture_log(const char *message)
{
    g_mutex_lock(&log_lock);
    g_ptr_array_add(log_lines, g_strdup(message));
    g_mutex_unlock(&log_lock);
}

char *
hostd_test_log_text(void)
{
    g_mutex_lock(&log_lock);
    g_ptr_array_add(log_lines, NULL);
    char *text = g_strjoinv("\n", (char **)log_lines->pdata);
    g_ptr_array_remove_index(log_lines, log_lines->len - 1);
    g_mutex_unlock(&log_lock);
    return text;
}

void
hostd_test_assert_logged(const char *needle)
{
    for (int i = 0; i < 50; i++) {
        g_autofree char *log = hostd_test_log_text();
        if (strstr(log, needle) != NULL)
            return;
        g_usleep(100 * 1000);
    }
    g_autofree char *log = hostd_test_log_text();
    fail_msg("nothing logged says '%s'; the log:\n%s", needle, log);
}

/* ---- the fixture ---------------------------------------------------------------------------- */

static const char *
source_dir(void)
{
    const char *env = g_getenv("VM_SOURCE_DIR");

    return env != NULL && env[0] != '\0' ? env : VM_SOURCE_DIR;
}

/* debian-12's image as a finished build leaves it, with fake files. */
static void
write_image(HostdTestFixture *f)
{
    g_autofree char *dir = g_build_filename(f->images_dir, "debian-12", NULL);
    g_autofree char *ini = g_build_filename(dir, "image.ini", NULL);
    g_autofree char *kernel = g_build_filename(dir, "vmlinuz", NULL);
    g_autofree char *initrd = g_build_filename(dir, "initrd.img", NULL);

    assert_int_equal(g_mkdir_with_parents(dir, 0755), 0);
    f->base_image = g_build_filename(dir, "base.qcow2", NULL);
    hostd_test_image_write(f->base_image, NULL);
    vm_test_write_file(kernel, "kernel\n");
    vm_test_write_file(initrd, "initrd\n");
    vm_test_write_file(ini, "[image]\n"
                            "template=debian-12\n"
                            "disk=base.qcow2\n"
                            "kernel=vmlinuz\n"
                            "initrd=initrd.img\n"
                            "cmdline=root=LABEL=root rw console=ttyS0\n"
                            "virtual-size=2147483648\n");
}

/* A templates dir of its own, so that a test may add a broken template to it. */
static void
write_templates(HostdTestFixture *f)
{
    g_autofree char *shipped = g_build_filename(source_dir(), "templates", "debian-12.yaml", NULL);
    g_autofree char *copy = NULL;
    g_autofree char *yaml = vm_test_read_file(shipped);

    f->templates_dir = g_build_filename(f->dir, "templates", NULL);
    assert_int_equal(g_mkdir(f->templates_dir, 0700), 0);
    copy = g_build_filename(f->templates_dir, "debian-12.yaml", NULL);
    vm_test_write_file(copy, yaml);
}

HostdTestFixture *
hostd_test_fixture_new_full(HostdTestFixtureFlags flags)
{
    HostdTestFixture *f = g_new0(HostdTestFixture, 1);
    g_autoptr(GError) error = NULL;

    /* Short: egress proxies' Unix sockets live below it. */
    f->dir = vm_test_make_tmpdir("hostd-XXXXXX");
    g_autofree char *node = vm_test_data_path("hostd", "node.xml", NULL);
    f->uri = g_strconcat("test://", node, NULL);

    f->bin_dir = g_build_filename(f->dir, "bin", NULL);
    assert_int_equal(g_mkdir(f->bin_dir, 0755), 0);
    write_fake_qemu_img(f->bin_dir, f->dir);
    f->saved_path = g_strdup(g_getenv("PATH"));
    g_autofree char *path =
        g_strconcat(f->bin_dir, ":", f->saved_path != NULL ? f->saved_path : "/usr/bin:/bin", NULL);
    g_setenv("PATH", path, TRUE);

    write_templates(f);
    f->images_dir = g_build_filename(f->dir, "images", NULL);
    if (flags & HOSTD_TEST_NO_IMAGE)
        assert_int_equal(g_mkdir(f->images_dir, 0700), 0);
    else
        write_image(f);

    g_autofree char *state_dir = g_build_filename(f->dir, "s", NULL);
    HostdConfig *config = hostd_config_load(NULL, state_dir, NULL, f->uri, &error);
    if (config == NULL)
        fail_msg("config: %s", error->message);
    g_free(config->templates_dir);
    config->templates_dir = g_strdup(f->templates_dir);
    g_free(config->images_dir);
    config->images_dir = g_strdup(f->images_dir);
    HostdState *st = hostd_state_open(state_dir, &error);
    if (st == NULL)
        fail_msg("state: %s", error->message);
    f->agents_dir = g_strdup(st->agents_dir);
    HostdLibvirt *lv = hostd_libvirt_open(f->uri, HOSTD_ACCEL_TCG, &error);
    if (lv == NULL)
        fail_msg("libvirt: %s", error->message);
    f->ctx = hostd_context_new(config, st, lv);
    hostd_modules_attach(f->ctx);
    f->ctx->log = capture_log;

    fakes_reset();
    g_mutex_lock(&log_lock);
    if (log_lines == NULL)
        log_lines = g_ptr_array_new_with_free_func(g_free);
    g_ptr_array_set_size(log_lines, 0);
    g_mutex_unlock(&log_lock);
    return f;
}

HostdTestFixture *
hostd_test_fixture_new(void)
{
    return hostd_test_fixture_new_full(0);
}

void
hostd_test_fixture_free(HostdTestFixture *f)
{
    if (f == NULL)
        return;
    hostd_power_stop(f->ctx);
    hostd_context_free(f->ctx);
    if (f->saved_path != NULL)
        g_setenv("PATH", f->saved_path, TRUE);
    vm_test_remove_tree(f->dir);
    g_free(f->dir);
    g_free(f->uri);
    g_free(f->templates_dir);
    g_free(f->images_dir);
    g_free(f->base_image);
    g_free(f->bin_dir);
    g_free(f->agents_dir);
    g_free(f->saved_path);
    g_free(f);
}

int
hostd_test_setup(void **state)
{
    *state = hostd_test_fixture_new();
    return 0;
}

int
hostd_test_teardown(void **state)
{
    hostd_test_fixture_free(*state);
    return 0;
}

/* ---- agents --------------------------------------------------------------------------------- */

HostdAgentRecord *
hostd_test_agent_record_new(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    HostdAgentRecord *r = g_new0(HostdAgentRecord, 1);

    r->dir = hostd_agent_dir(f->ctx, name);
    r->name = g_strdup(name);
    r->uuid = g_uuid_string_random();
    r->template_name = g_strdup("debian-12");
    r->phase = g_strdup(HOSTD_PHASE_READY);
    r->cpus = 1;
    r->memory_mib = 128;
    r->disk_gib = 8;
    /* Free ones: the relay binds the SSH port of every ready agent when hostd_power_start()
     * attaches them, while other test programs bind ports of their own. */
    r->ssh_port = vm_test_free_port();
    do
        r->backend_port = vm_test_free_port();
    while (r->backend_port == r->ssh_port);
    r->mac = hostd_random_mac();
    r->user = g_strdup("agent");
    r->instance_id = g_strdup_printf("vmctl-%s", r->uuid);
    r->created = g_get_real_time() / G_USEC_PER_SEC - 24 * 3600;
    r->state_since = r->created;
    assert_int_equal(g_mkdir_with_parents(r->dir, 0711), 0);
    if (!hostd_agent_record_save(r, &error))
        fail_msg("record: %s", error->message);
    return r;
}

HostdAgentRecord *
hostd_test_agent_new(HostdTestFixture *f, const char *name, HostdTestState state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f, name);
    g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
    hostd_test_image_write(disk, f->base_image);
    g_autofree char *xml = hostd_agent_domain_xml(f->ctx, r, NULL, HOSTD_AGENT_DISK, &error);
    if (xml == NULL)
        fail_msg("domain XML: %s", error->message);
    g_autofree char *xml_path = hostd_agent_record_path(r, "domain.xml");
    vm_test_write_file(xml_path, xml);
    g_autoptr(virDomain) dom = virDomainDefineXML(f->ctx->lv->conn, xml);
    if (dom == NULL)
        fail_msg("cannot define %s: %s", name, virGetLastErrorMessage());
    if (state != HOSTD_TEST_STOPPED && virDomainCreate(dom) < 0)
        fail_msg("cannot start %s: %s", name, virGetLastErrorMessage());
    if (state == HOSTD_TEST_PAUSED && virDomainSuspend(dom) < 0)
        fail_msg("cannot pause %s: %s", name, virGetLastErrorMessage());
    if (state == HOSTD_TEST_SAVED && virDomainManagedSave(dom, 0) < 0)
        fail_msg("cannot save %s: %s", name, virGetLastErrorMessage());
    return g_steal_pointer(&r);
}

char *
hostd_test_agent_file(HostdTestFixture *f, const char *name, const char *file)
{
    return g_build_filename(f->agents_dir, name, file, NULL);
}

HostdAgentRecord *
hostd_test_agent_record(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);
    HostdAgentRecord *r = hostd_agent_record_load(dir, &error);

    if (r == NULL)
        fail_msg("no record of %s: %s", name, error->message);
    return r;
}

const char *
hostd_test_domain_state(HostdTestFixture *f, const char *name)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, name, NULL);

    return dom != NULL ? hostd_libvirt_state_name(dom) : "missing";
}

char *
hostd_test_agent_as_pool_machine(HostdTestFixture *f, const char *name, const char *machine)
{
    g_autoptr(HostdAgentRecord) made = hostd_test_agent_new(f, name, HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;
    g_autofree char *xml_path = hostd_test_agent_file(f, name, HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml = vm_test_read_file(xml_path);
    g_autofree char *from = g_strdup_printf("<name>%s</name>", name);
    g_autofree char *to = g_strdup_printf("<name>%s</name>", machine);
    g_autoptr(GString) renamed = g_string_new(xml);
    assert_int_equal(g_string_replace(renamed, from, to, 1), 1);
    assert_true(hostd_libvirt_remove(f->ctx->lv, name, NULL));
    g_autoptr(virDomain) defined = virDomainDefineXML(f->ctx->lv->conn, renamed->str);
    assert_non_null(defined);

    g_autofree char *pool = g_build_filename(f->ctx->config->state_dir, "pool", NULL);
    char *dir = g_build_filename(pool, machine, NULL);
    g_autofree char *link = g_build_filename(f->agents_dir, name, NULL);
    assert_int_equal(g_mkdir_with_parents(pool, 0711), 0);
    assert_int_equal(g_rename(link, dir), 0);
    assert_int_equal(symlink(dir, link), 0);
    g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(link, &error);
    if (r == NULL)
        fail_msg("record: %s", error->message);
    r->domain = g_strdup(machine);
    if (!hostd_agent_record_save(r, &error))
        fail_msg("record: %s", error->message);
    return dir;
}

char *
hostd_test_domain_disk(HostdTestFixture *f, const char *name, gboolean inactive)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, name, NULL);

    if (dom == NULL)
        fail_msg("no domain %s", name);
    g_autofree char *xml = virDomainGetXMLDesc(dom, inactive ? VIR_DOMAIN_XML_INACTIVE : 0);
    char *disk = xml_source_file(xml, "device='disk'");
    if (disk == NULL)
        fail_msg("domain %s has no disk", name);
    return disk;
}

VmCheckpointSet *
hostd_test_checkpoints(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = hostd_agent_dir(f->ctx, name);
    VmCheckpointSet *set = vm_checkpoint_set_load(dir, &error);

    if (set == NULL)
        fail_msg("checkpoints of %s: %s", name, error->message);
    return set;
}

char *
hostd_test_checkpoint_ids(HostdTestFixture *f, const char *name)
{
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, name);
    g_autoptr(GString) ids = g_string_new(NULL);

    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_string_append_printf(ids, "%s%s", i > 0 ? " " : "", c->id);
    }
    return g_string_free(g_steal_pointer(&ids), FALSE);
}

void
hostd_test_checkpoint_n(HostdTestFixture *f, const char *name, guint n)
{
    for (guint i = 0; i < n; i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *warning = NULL;
        g_autoptr(GVariant) v = hostd_test_sink(
            hostd_checkpoint_create(f->ctx, name, NULL, FALSE, FALSE, &warning, &error));
        if (v == NULL)
            fail_msg("checkpoint of %s: %s", name, error->message);
    }
}

/* ---- hostd's request handling --------------------------------------------------------------- */

typedef struct {
    HostdContext *ctx;
    int fd;
} ServeArgs;

static gpointer
serve_thread(gpointer data)
{
    ServeArgs *args = data;

    hostd_server_serve_fd(args->ctx, args->fd);
    g_free(args);
    return NULL;
}

int
hostd_test_serve(HostdTestFixture *f, GThread **ret_thread)
{
    int fds[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    struct timeval tv = {.tv_sec = 20};
    assert_int_equal(setsockopt(fds[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    ServeArgs *args = g_new0(ServeArgs, 1);
    args->ctx = f->ctx;
    args->fd = fds[1];
    *ret_thread = g_thread_new("serve", serve_thread, args);
    return fds[0];
}

/* ---- assertions and small helpers ----------------------------------------------------------- */

void
hostd_test_assert_error(const GError *error, VmErrorCode code, const char *needle)
{
    if (error == NULL)
        fail_msg("expected error %d, got success", code);
    if (!g_error_matches(error, VM_ERROR, (gint)code))
        fail_msg("expected error %d, got %d: %s", code, error->code, error->message);
    if (needle != NULL && strstr(error->message, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", error->message, needle);
}

GVariant *
hostd_test_sink(GVariant *v)
{
    return v != NULL ? g_variant_ref_sink(v) : NULL;
}

char *
hostd_test_egress_text(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) egress = hostd_test_sink(hostd_egress_get(f->ctx, name, &error));
    g_autofree const char **allow = NULL;
    g_autofree const char **deny = NULL;

    if (egress == NULL)
        fail_msg("egress of %s: %s", name, error->message);
    assert_true(g_variant_lookup(egress, "allow", "^a&s", &allow));
    assert_true(g_variant_lookup(egress, "deny", "^a&s", &deny));
    g_autofree char *a = g_strjoinv(" ", (char **)allow);
    g_autofree char *d = g_strjoinv(" ", (char **)deny);
    return g_strdup_printf("%s|%s", a, d);
}

char *
hostd_test_dict_string(GVariant *dict, const char *key)
{
    const char *value = NULL;

    if (dict == NULL || !g_variant_lookup(dict, key, "&s", &value))
        return NULL;
    return g_strdup(value);
}

gboolean
hostd_test_wait_state(HostdTestFixture *f, const char *name, const char *state, guint timeout_ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;

    for (;;) {
        if (g_str_equal(hostd_test_domain_state(f, name), state))
            return TRUE;
        if (g_get_monotonic_time() > deadline)
            return FALSE;
        g_usleep(50 * 1000);
    }
}

gboolean
hostd_test_egress_allows(HostdContext *ctx, const char *name, const char *host, guint16 port)
{
    g_autoptr(VmEgressPolicy) policy = hostd_egress_dup_effective_policy(ctx, name);

    assert_non_null(policy);
    return vm_egress_policy_check_host(policy, host, port, NULL) == VM_EGRESS_ALLOW;
}

VmMessage *
hostd_test_request(VmOp op, const char *fields_text)
{
    g_autoptr(GError) error = NULL;
    GVariant *fields = NULL;

    if (fields_text != NULL) {
        fields = g_variant_parse(G_VARIANT_TYPE_VARDICT, fields_text, NULL, NULL, &error);
        if (fields == NULL)
            fail_msg("bad fields '%s': %s", fields_text, error->message);
    }
    VmMessage *m = vm_message_new(op, fields, &error);
    if (m == NULL)
        fail_msg("cannot build %s %s: %s", vm_op_name(op), fields_text, error->message);
    return m;
}

struct _HostdCluster *
hostd_test_cluster_new(const char *id, const guint *ports, guint n, const char *dir)
{
    g_autoptr(HostdClusterConfig) config = g_new0(HostdClusterConfig, 1);
    g_autoptr(GError) error = NULL;

    config->endpoints = g_new0(char *, n + 1);
    for (guint i = 0; i < n; i++)
        config->endpoints[i] = g_strdup_printf("http://127.0.0.1:%u", ports[i]);
    config->host_id = g_strdup(id);
    config->address = g_strdup_printf("ssh://root@%s.lab", id);
    config->lease_ttl_s = 2;
    HostdCluster *cluster = hostd_cluster_new(config, dir, &error);
    if (cluster == NULL)
        fail_msg("%s", error->message);
    return cluster;
}
