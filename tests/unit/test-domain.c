/* Domain XML: golden files, escaping, required fields, and libvirt's own schema. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>

#include "vm-domain.h"
#include "vm-error.h"
#include "test-common.h"

/* A fresh temporary directory per test, f->dir. */
typedef VmTestTmpDir Fixture;
#define setup    vm_test_tmpdir_setup
#define teardown vm_test_tmpdir_teardown

/* A TCG guest booting its kernel directly, with everything optional set. */
static VmDomainSpec
spec_tcg_kernel(void)
{
    return (VmDomainSpec){
        .name = "agent-tcg",
        .uuid = "6f1c8a52-3d4e-4b0a-9c1d-2e3f4a5b6c7d",
        .virt_type = "qemu",
        .emulator = "/usr/bin/qemu-system-x86_64",
        .cpus = 2,
        .memory_mib = 1024,
        .disk_path = "/var/lib/hostd/agents/agent-tcg/disk.qcow2",
        .seed_path = "/var/lib/hostd/agents/agent-tcg/seed.iso",
        .kernel_path = "/var/lib/hostd/images/debian-12/vmlinuz",
        .initrd_path = "/var/lib/hostd/images/debian-12/initrd.img",
        .cmdline = "root=LABEL=root rw console=ttyS0",
        .disk_limits = {200, 100, 4000, 2000},
        .mac = "52:54:00:ab:cd:ef",
        .ssh_port = 2201,
        .console_socket = "/var/lib/hostd/agents/agent-tcg/console.sock",
        .agent_socket = "/var/lib/hostd/agents/agent-tcg/qga.sock",
        .metadata_xml = "<hostd:agent xmlns:hostd='https://vmctl.invalid/hostd/1'>"
                        "<hostd:template>debian-12</hostd:template></hostd:agent>",
    };
}

/* A KVM guest booting from its disk, with every optional field left out. */
static VmDomainSpec
spec_kvm_disk(void)
{
    return (VmDomainSpec){
        .name = "agent-kvm",
        .uuid = "0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f70",
        .virt_type = "kvm",
        .cpus = 4,
        .memory_mib = 4096,
        .disk_path = "/srv/agents/agent-kvm.qcow2",
        .mac = "52:54:00:00:00:01",
        .ssh_port = 65535,
        .console_socket = "/srv/agents/agent-kvm/console.sock",
    };
}

/* The TCG guest with its way out: the guest forward to the egress helper. */
static VmDomainSpec
spec_egress(void)
{
    VmDomainSpec spec = spec_tcg_kernel();

    spec.egress_command = "'/usr/libexec/vm-egress-connect' "
                          "'/var/lib/hostd/agents/agent-tcg/egress.sock'";
    return spec;
}

/* The same with the in-guest API: a second guest forward, to the API's socket. */
static VmDomainSpec
spec_guest_api(void)
{
    VmDomainSpec spec = spec_egress();

    spec.guest_api_command = "'/usr/libexec/vm-egress-connect' "
                             "'/var/lib/hostd/agents/agent-tcg/api.sock'";
    return spec;
}

static char *
build_ok(const VmDomainSpec *spec)
{
    g_autoptr(GError) error = NULL;
    char *xml = vm_domain_xml_build(spec, &error);

    if (xml == NULL)
        fail_msg("vm_domain_xml_build: %s", error->message);
    assert_null(error);
    return xml;
}

/* Runs libvirt's RelaxNG check (virt-xml-validate, from libvirt-clients) on @xml. */
static void
assert_schema_valid(Fixture *f, const char *xml)
{
    g_autofree char *path = g_build_filename(f->dir, "domain.xml", NULL);
    g_autofree char *tool = g_find_program_in_path("virt-xml-validate");
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;
    g_autoptr(GError) error = NULL;
    int status = -1;

    if (tool == NULL)
        fail_msg("virt-xml-validate not found (install libvirt-clients)");
    assert_true(g_file_set_contents(path, xml, -1, NULL));
    const char *argv[] = {tool, path, "domain", NULL};
    if (!g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, &out, &err, &status,
                      &error))
        fail_msg("cannot run %s: %s", tool, error->message);
    if (!g_spawn_check_wait_status(status, NULL))
        fail_msg("libvirt's schema rejects the XML:\n%s%s\n%s", out, err, xml);
}

static void
test_golden_tcg_kernel(void **state)
{
    VmDomainSpec spec = spec_tcg_kernel();
    g_autofree char *xml = build_ok(&spec);

    vm_test_assert_golden("domain-tcg-kernel.xml", xml);
    assert_schema_valid(*state, xml);
}

static void
test_golden_kvm_disk(void **state)
{
    VmDomainSpec spec = spec_kvm_disk();
    g_autofree char *xml = build_ok(&spec);

    vm_test_assert_golden("domain-kvm-disk.xml", xml);
    assert_schema_valid(*state, xml);
}

static void
test_golden_egress(void **state)
{
    VmDomainSpec spec = spec_egress();
    g_autofree char *xml = build_ok(&spec);

    vm_test_assert_golden("domain-egress.xml", xml);
    assert_schema_valid(*state, xml);
}

/* Guest RAM stays mergeable (QEMU's mem-merge default, which libvirt turns off only for
 * <nosharepages/>), so that KSM can share what agents restored from one warm image hold alike;
 * and the balloon keeps reporting free pages. */
static void
test_memory_mergeable(void **state)
{
    VmDomainSpec specs[] = {spec_tcg_kernel(), spec_kvm_disk(), spec_egress(), spec_guest_api()};

    for (gsize i = 0; i < G_N_ELEMENTS(specs); i++) {
        g_autofree char *xml = build_ok(&specs[i]);

        assert_null(strstr(xml, "nosharepages"));
        assert_null(strstr(xml, "mem-merge"));
        assert_null(strstr(xml, "<memoryBacking"));
        assert_non_null(strstr(xml, "<memballoon model='virtio' freePageReporting='on'/>"));
    }
}

/* The guest forward is the only addition to the restricted network; QEMU's own sandbox, there
 * either way, allows spawning the helper but denies the rest of what libvirt's does. */
static void
test_egress_forward(void **state)
{
    VmDomainSpec with = spec_egress();
    VmDomainSpec without = spec_tcg_kernel();
    g_autofree char *xml = build_ok(&with);
    g_autofree char *plain = build_ok(&without);

    assert_non_null(strstr(xml, "<qemu:arg value='user,id=vmnet0,restrict=on,"
                                "hostfwd=tcp:127.0.0.1:2201-:22,"
                                "guestfwd=tcp:10.0.2.100:3128-cmd:&apos;/usr/libexec/"
                                "vm-egress-connect&apos; &apos;/var/lib/hostd/agents/agent-tcg/"
                                "egress.sock&apos;,"
                                "guestfwd=tcp:10.0.2.100:53-cmd:&apos;/usr/libexec/"
                                "vm-egress-connect&apos; &apos;/var/lib/hostd/agents/agent-tcg/"
                                "egress.sock&apos; dns'/>"));
    assert_non_null(strstr(xml, "<qemu:arg value='-sandbox'/>\n"
                                "    <qemu:arg value='on,obsolete=deny,resourcecontrol=deny'/>"));
    assert_null(strstr(xml, "spawn=deny"));
    assert_null(strstr(xml, "elevateprivileges=deny"));
    assert_null(strstr(plain, "guestfwd"));
    assert_non_null(strstr(plain, "<qemu:arg value='-sandbox'/>\n"
                                  "    <qemu:arg value='on,obsolete=deny,resourcecontrol=deny'/>"));
}

static void
test_golden_guest_api(void **state)
{
    VmDomainSpec spec = spec_guest_api();
    g_autofree char *xml = build_ok(&spec);

    vm_test_assert_golden("domain-guest-api.xml", xml);
    assert_schema_valid(*state, xml);
}

/* An agent with an id of its own: QEMU runs as that uid and gid through libvirt's static DAC
 * label, and libvirt gives no file away (relabel='no'): the kernel, the initrd and every image of
 * the disk's backing chain are shared by agents. The label is the only difference. */
/* A confined agent's disk with the chain from hostd's record: each image below the top named in
 * a <backingStore> inside the one above, format qcow2, the bottom left open; libvirt's schema
 * takes it, and the rest of the domain is the same as without it. A relative path is refused. */
static void
test_golden_backing_chain(void **state)
{
    VmDomainSpec spec = spec_guest_api();
    spec.qemu_id = 1879048193;
    const char *const chain[] = {"/var/lib/hostd/agents/agent-tcg/checkpoints/2.qcow2",
                                 "/var/lib/hostd/agents/agent-tcg/checkpoints/1.qcow2",
                                 "/var/lib/hostd/images/debian-12/base.qcow2", NULL};
    spec.backing_chain = chain;
    g_autofree char *xml = build_ok(&spec);

    vm_test_assert_golden("domain-backing-chain.xml", xml);
    assert_schema_valid(*state, xml);
    const char *open = strstr(xml, "      <backingStore type='file'>");
    const char *close = strstr(xml, "</disk>");
    assert_non_null(open);
    assert_null(strstr(xml, "<backingStore/>"));
    assert_true(open < close);
    /* Without the <backingStore> elements, between the disk's source and its target, it is the
     * domain without a chain. */
    g_autoptr(GString) stripped = g_string_new(xml);
    g_string_erase(stripped, open - xml, strstr(xml, "      <target dev='vda'") - open);
    VmDomainSpec plain = spec_guest_api();
    plain.qemu_id = 1879048193;
    g_autofree char *plain_xml = build_ok(&plain);
    assert_string_equal(stripped->str, plain_xml);

    const char *const relative[] = {"checkpoints/1.qcow2", NULL};
    spec.backing_chain = relative;
    g_autoptr(GError) error = NULL;
    assert_null(vm_domain_xml_build(&spec, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

static void
test_golden_confined(void **state)
{
    VmDomainSpec spec = spec_guest_api();
    spec.qemu_id = 1879048193;
    g_autofree char *xml = build_ok(&spec);
    VmDomainSpec plain = spec_guest_api();
    g_autofree char *plain_xml = build_ok(&plain);
    const char *label = "  <seclabel type='static' model='dac' relabel='no'>\n"
                        "    <label>+1879048193:+1879048193</label>\n"
                        "  </seclabel>\n";

    vm_test_assert_golden("domain-confined.xml", xml);
    assert_schema_valid(*state, xml);
    assert_non_null(strstr(xml, label));
    assert_null(strstr(plain_xml, "<seclabel"));
    g_autoptr(GString) stripped = g_string_new(xml);
    assert_int_equal(g_string_replace(stripped, label, "", 0), 1);
    assert_string_equal(stripped->str, plain_xml);
}

/* The API's forward comes after the proxy's (and its resolver's) on the same restricted network, at
 * port 80 of the same guest address, and nothing else changes; commas in its command are doubled
 * too. */
static void
test_guest_api_forward(void **state)
{
    VmDomainSpec spec = spec_guest_api();
    VmDomainSpec egress = spec_egress();
    g_autofree char *xml = build_ok(&spec);
    g_autofree char *egress_xml = build_ok(&egress);

    assert_non_null(strstr(xml, "guestfwd=tcp:10.0.2.100:53-cmd:&apos;/usr/libexec/"
                                "vm-egress-connect&apos; &apos;/var/lib/hostd/agents/agent-tcg/"
                                "egress.sock&apos; dns,guestfwd=tcp:10.0.2.100:80-cmd:&apos;/usr/"
                                "libexec/vm-egress-connect&apos; &apos;/var/lib/hostd/agents/"
                                "agent-tcg/api.sock&apos;'/>"));
    assert_null(strstr(egress_xml, ":80-cmd"));
    spec.guest_api_command = "/x/connect /state,restrict=off/api.sock";
    g_autofree char *comma = build_ok(&spec);
    assert_non_null(strstr(comma, "10.0.2.100:80-cmd:/x/connect /state,,restrict=off/api.sock'/>"));
}

/* A comma would end the netdev option and start a new one of the user's choosing: it is
 * doubled, which is QEMU's escape for a literal comma. */
static void
test_egress_command_comma(void **state)
{
    VmDomainSpec spec = spec_egress();

    spec.egress_command = "/x/connect /state,restrict=off/egress.sock";
    g_autofree char *xml = build_ok(&spec);

    assert_non_null(strstr(xml, "-cmd:/x/connect /state,,restrict=off/egress.sock,"));
    assert_non_null(strstr(xml, "-cmd:/x/connect /state,,restrict=off/egress.sock dns'/>"));
    assert_null(strstr(xml, "/state,restrict"));
}

/* The TCG tuning must never reach a KVM guest and host-passthrough never a TCG one (QEMU
 * refuses it without KVM). */
static void
test_virt_type_features(void **state)
{
    VmDomainSpec tcg = spec_tcg_kernel();
    VmDomainSpec kvm = spec_kvm_disk();
    g_autofree char *tcg_xml = build_ok(&tcg);
    g_autofree char *kvm_xml = build_ok(&kvm);

    assert_non_null(strstr(tcg_xml, "<domain type='qemu'"));
    assert_non_null(strstr(tcg_xml, "<tb-cache unit='MiB'>128</tb-cache>"));
    assert_null(strstr(tcg_xml, "host-passthrough"));
    assert_non_null(strstr(kvm_xml, "<domain type='kvm'"));
    assert_null(strstr(kvm_xml, "<tcg>"));
    assert_non_null(strstr(kvm_xml, "<cpu mode='host-passthrough'/>"));
}

/* On a nested host whose KVM cannot set some of the host CPU's MSRs, those features are hidden
 * from the guest, and only from KVM guests. */
static void
test_cpu_disable(void **state)
{
    const char *const off[] = {"arch-capabilities", NULL};
    VmDomainSpec kvm = spec_kvm_disk();
    VmDomainSpec tcg = spec_tcg_kernel();
    kvm.cpu_disable = off;
    tcg.cpu_disable = off;
    g_autofree char *kvm_xml = build_ok(&kvm);
    g_autofree char *tcg_xml = build_ok(&tcg);

    assert_non_null(strstr(kvm_xml, "  <cpu mode='host-passthrough'>\n"
                                    "    <feature policy='disable' name='arch-capabilities'/>\n"
                                    "  </cpu>\n"));
    assert_null(strstr(tcg_xml, "<cpu"));
    assert_null(strstr(tcg_xml, "arch-capabilities"));
}

/* The guest must stay behind restricted user networking: no libvirt <interface> (which would
 * give it a bridge or unrestricted slirp) and a forward bound to loopback only. */
static void
test_network_is_restricted(void **state)
{
    VmDomainSpec spec = spec_kvm_disk();
    g_autofree char *xml = build_ok(&spec);

    assert_null(strstr(xml, "<interface"));
    assert_non_null(strstr(
        xml, "<qemu:arg value='user,id=vmnet0,restrict=on,hostfwd=tcp:127.0.0.1:65535-:22'/>"));
    assert_non_null(strstr(
        xml, "<qemu:arg value='virtio-net-pci,netdev=vmnet0,mac=52:54:00:00:00:01,addr=0x10'/>"));
}

static void
test_optional_parts_omitted(void **state)
{
    VmDomainSpec spec = spec_kvm_disk();
    g_autofree char *xml = build_ok(&spec);

    assert_null(strstr(xml, "<emulator>"));
    assert_null(strstr(xml, "<metadata>"));
    assert_null(strstr(xml, "device='cdrom'"));
    assert_null(strstr(xml, "<kernel>"));
    assert_non_null(strstr(xml, "<boot dev='hd'/>"));
    /* no socket path: the channel is there, libvirt picks the path */
    assert_non_null(strstr(xml, "<channel type='unix'>\n"
                                "      <target type='virtio' name='org.qemu.guest_agent.0'/>"));
}

/* The disk limits as QEMU's throttling wants them (bytes, not MiB), only those that are set,
 * on the agent's disk and not on its seed; none at all without limits. */
static void
test_disk_limits(void **state)
{
    VmDomainSpec spec = spec_tcg_kernel();
    g_autofree char *xml = build_ok(&spec);
    const char *disk = strstr(xml, "<target dev='vda'");
    const char *iotune = strstr(xml, "<iotune>");

    assert_non_null(disk);
    assert_non_null(iotune);
    assert_true(iotune > disk && iotune < strstr(disk, "</disk>"));
    assert_null(strstr(iotune + 1, "<iotune>"));
    assert_non_null(strstr(xml, "<read_bytes_sec>209715200</read_bytes_sec>"));
    assert_non_null(strstr(xml, "<write_bytes_sec>104857600</write_bytes_sec>"));
    assert_non_null(strstr(xml, "<read_iops_sec>4000</read_iops_sec>"));
    assert_non_null(strstr(xml, "<write_iops_sec>2000</write_iops_sec>"));

    spec.disk_limits[VM_DISK_READ_MIB] = 0;
    spec.disk_limits[VM_DISK_READ_IOPS] = 0;
    spec.disk_limits[VM_DISK_WRITE_IOPS] = 0;
    g_autofree char *write_only = build_ok(&spec);
    assert_non_null(strstr(write_only, "<iotune>\n"
                                       "        <write_bytes_sec>104857600</write_bytes_sec>\n"
                                       "      </iotune>"));
    assert_null(strstr(write_only, "read_"));

    spec.disk_limits[VM_DISK_WRITE_MIB] = VM_DISK_LIMIT_MAX;
    g_autofree char *max = build_ok(&spec);
    assert_non_null(strstr(max, "<write_bytes_sec>1048576000000</write_bytes_sec>"));
    assert_schema_valid(*state, max);

    VmDomainSpec none = spec_kvm_disk();
    g_autofree char *unlimited = build_ok(&none);
    assert_null(strstr(unlimited, "iotune"));
}

typedef struct {
    GHashTable *sources; /* element name -> text or 'file'/'path' attribute, as parsed */
} Collected;

static void
collect_start(GMarkupParseContext *context, const char *element, const char **names,
              const char **values, gpointer user_data, GError **error)
{
    Collected *c = user_data;

    for (int i = 0; names[i] != NULL; i++) {
        if (g_str_equal(element, "source") && g_str_equal(names[i], "file"))
            g_hash_table_insert(c->sources, g_strdup("source@file"), g_strdup(values[i]));
        if (g_str_equal(element, "qemu:arg") && g_str_has_prefix(values[i], "user,"))
            g_hash_table_insert(c->sources, g_strdup("netdev"), g_strdup(values[i]));
    }
}

static void
collect_text(GMarkupParseContext *context, const char *text, gsize len, gpointer user_data,
             GError **error)
{
    Collected *c = user_data;
    const char *element = g_markup_parse_context_get_element(context);

    if (g_str_equal(element, "name") || g_str_equal(element, "cmdline"))
        g_hash_table_insert(c->sources, g_strdup(element), g_strndup(text, len));
}

/* Hostile strings come back out of an XML parser exactly as they went in. */
static void
test_escaping(void **state)
{
    static const GMarkupParser parser = {.start_element = collect_start, .text = collect_text};
    VmDomainSpec spec = spec_kvm_disk();
    const char *path = "/srv/a<b&c'd\"e>/disk.qcow2";
    const char *name = "x</name><devices>&amp;";
    const char *cmdline = "console=ttyS0 init=/bin/sh' <![CDATA[";
    g_autoptr(GHashTable) sources = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    Collected c = {sources};
    g_autoptr(GError) error = NULL;

    spec.disk_path = path;
    spec.name = name;
    spec.kernel_path = "/boot/vmlinuz";
    spec.cmdline = cmdline;
    g_autofree char *xml = build_ok(&spec);

    assert_null(strstr(xml, "a<b"));
    assert_non_null(strstr(xml, "a&lt;b&amp;c&apos;d&quot;e&gt;"));
    g_autoptr(GMarkupParseContext) context = g_markup_parse_context_new(&parser, 0, &c, NULL);
    if (!g_markup_parse_context_parse(context, xml, -1, &error) ||
        !g_markup_parse_context_end_parse(context, &error))
        fail_msg("not well-formed: %s\n%s", error->message, xml);
    assert_string_equal(g_hash_table_lookup(c.sources, "source@file"), path);
    assert_string_equal(g_hash_table_lookup(c.sources, "name"), name);
    assert_string_equal(g_hash_table_lookup(c.sources, "cmdline"), cmdline);
    assert_schema_valid(*state, xml);
}

typedef enum {
    BAD_NO_NAME,
    BAD_EMPTY_NAME,
    BAD_NO_UUID,
    BAD_SHORT_UUID,
    BAD_UUID_CHARS,
    BAD_NO_VIRT_TYPE,
    BAD_VIRT_TYPE_XEN,
    BAD_ZERO_CPUS,
    BAD_ZERO_MEMORY,
    BAD_NO_DISK,
    BAD_EMPTY_DISK,
    BAD_NO_MAC,
    BAD_SHORT_MAC,
    BAD_COMMA_MAC,
    BAD_MULTICAST_MAC,
    BAD_ZERO_PORT,
    BAD_BIG_PORT,
    BAD_NO_CONSOLE,
    BAD_INITRD_ALONE,
    BAD_CMDLINE_ALONE,
    BAD_MALFORMED_METADATA,
    BAD_METADATA_CLOSES,
    BAD_EGRESS_EMPTY,
    BAD_EGRESS_NEWLINE,
    BAD_GUEST_API_EMPTY,
    BAD_GUEST_API_TAB,
    BAD_DISK_LIMIT,
} BadKind;

typedef struct {
    const char *what;
    BadKind kind;
} BadSpec;

static const BadSpec bad_specs[] = {
    {"no name", BAD_NO_NAME},
    {"empty name", BAD_EMPTY_NAME},
    {"no uuid", BAD_NO_UUID},
    {"short uuid", BAD_SHORT_UUID},
    {"uuid with a bad character", BAD_UUID_CHARS},
    {"no virt_type", BAD_NO_VIRT_TYPE},
    {"virt_type xen", BAD_VIRT_TYPE_XEN},
    {"cpus 0", BAD_ZERO_CPUS},
    {"memory 0", BAD_ZERO_MEMORY},
    {"no disk", BAD_NO_DISK},
    {"empty disk", BAD_EMPTY_DISK},
    {"no mac", BAD_NO_MAC},
    {"short mac", BAD_SHORT_MAC},
    {"mac with a comma", BAD_COMMA_MAC},
    {"multicast mac", BAD_MULTICAST_MAC},
    {"ssh_port 0", BAD_ZERO_PORT},
    {"ssh_port 65536", BAD_BIG_PORT},
    {"no console_socket", BAD_NO_CONSOLE},
    {"initrd without kernel", BAD_INITRD_ALONE},
    {"cmdline without kernel", BAD_CMDLINE_ALONE},
    {"malformed metadata", BAD_MALFORMED_METADATA},
    {"metadata closing its element", BAD_METADATA_CLOSES},
    {"empty egress command", BAD_EGRESS_EMPTY},
    {"egress command with a newline", BAD_EGRESS_NEWLINE},
    {"empty guest API command", BAD_GUEST_API_EMPTY},
    {"guest API command with a tab", BAD_GUEST_API_TAB},
    {"disk limit over the maximum", BAD_DISK_LIMIT},
};

static void
bad_spec_apply(VmDomainSpec *s, BadKind kind)
{
    switch (kind) {
    case BAD_NO_NAME:
        s->name = NULL;
        break;
    case BAD_EMPTY_NAME:
        s->name = "";
        break;
    case BAD_NO_UUID:
        s->uuid = NULL;
        break;
    case BAD_SHORT_UUID:
        s->uuid = "6f1c8a52-3d4e-4b0a-9c1d-2e3f4a5b6c7";
        break;
    case BAD_UUID_CHARS:
        s->uuid = "6f1c8a52x3d4e-4b0a-9c1d-2e3f4a5b6c7d";
        break;
    case BAD_NO_VIRT_TYPE:
        s->virt_type = NULL;
        break;
    case BAD_VIRT_TYPE_XEN:
        s->virt_type = "xen";
        break;
    case BAD_ZERO_CPUS:
        s->cpus = 0;
        break;
    case BAD_ZERO_MEMORY:
        s->memory_mib = 0;
        break;
    case BAD_NO_DISK:
        s->disk_path = NULL;
        break;
    case BAD_EMPTY_DISK:
        s->disk_path = "";
        break;
    case BAD_NO_MAC:
        s->mac = NULL;
        break;
    case BAD_SHORT_MAC:
        s->mac = "52:54:00:ab:cd";
        break;
    case BAD_COMMA_MAC:
        s->mac = "52:54:00:ab:c,:ef";
        break;
    case BAD_MULTICAST_MAC:
        s->mac = "01:54:00:ab:cd:ef";
        break;
    case BAD_ZERO_PORT:
        s->ssh_port = 0;
        break;
    case BAD_BIG_PORT:
        s->ssh_port = 65536;
        break;
    case BAD_NO_CONSOLE:
        s->console_socket = NULL;
        break;
    case BAD_INITRD_ALONE:
        s->kernel_path = NULL;
        s->cmdline = NULL;
        break;
    case BAD_CMDLINE_ALONE:
        s->kernel_path = NULL;
        s->initrd_path = NULL;
        break;
    case BAD_MALFORMED_METADATA:
        s->metadata_xml = "<a><b></a>";
        break;
    case BAD_METADATA_CLOSES:
        s->metadata_xml = "</metadata><devices>";
        break;
    case BAD_EGRESS_EMPTY:
        s->egress_command = "";
        break;
    case BAD_EGRESS_NEWLINE:
        s->egress_command = "/x/connect\n/y";
        break;
    case BAD_GUEST_API_EMPTY:
        s->guest_api_command = "";
        break;
    case BAD_GUEST_API_TAB:
        s->guest_api_command = "/x/connect\t/y";
        break;
    case BAD_DISK_LIMIT:
        s->disk_limits[VM_DISK_WRITE_IOPS] = VM_DISK_LIMIT_MAX + 1;
        break;
    default:
        g_assert_not_reached();
    }
}

/* A warm agent's generation ID: in the XML libvirt accepts, once; none without one; a value that
 * is not a UUID refused. */
static void
test_genid(void **state)
{
    VmDomainSpec spec = spec_tcg_kernel();
    g_autofree char *plain = build_ok(&spec);
    assert_null(strstr(plain, "<genid"));

    spec.genid = "0f4f4b5e-9a57-4d49-9a36-2f1d2f6a7c11";
    g_autofree char *xml = build_ok(&spec);
    const char *at = strstr(xml, "<genid>0f4f4b5e-9a57-4d49-9a36-2f1d2f6a7c11</genid>");
    assert_non_null(at);
    assert_null(strstr(at + 1, "<genid"));
    assert_schema_valid(*state, xml);

    g_autoptr(GError) error = NULL;
    spec.genid = "0f4f4b5e'/><x";
    g_autofree char *bad = vm_domain_xml_build(&spec, &error);
    assert_null(bad);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

static void
test_bad_spec(void **state)
{
    const BadSpec *bad = *state;
    VmDomainSpec spec = spec_tcg_kernel();
    g_autoptr(GError) error = NULL;

    bad_spec_apply(&spec, bad->kind);
    g_autofree char *xml = vm_domain_xml_build(&spec, &error);
    if (xml != NULL)
        fail_msg("%s: accepted", bad->what);
    assert_non_null(error);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
}

int
main(void)
{
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test_setup_teardown(test_golden_tcg_kernel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_kvm_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_egress, setup, teardown),
        cmocka_unit_test(test_egress_forward),
        cmocka_unit_test(test_memory_mergeable),
        cmocka_unit_test(test_egress_command_comma),
        cmocka_unit_test_setup_teardown(test_golden_guest_api, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_confined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_golden_backing_chain, setup, teardown),
        cmocka_unit_test(test_guest_api_forward),
        cmocka_unit_test(test_virt_type_features),
        cmocka_unit_test(test_cpu_disable),
        cmocka_unit_test(test_network_is_restricted),
        cmocka_unit_test(test_optional_parts_omitted),
        cmocka_unit_test_setup_teardown(test_disk_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_escaping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_genid, setup, teardown),
    };
    g_autoptr(GArray) tests = g_array_new(FALSE, FALSE, sizeof(struct CMUnitTest));

    g_array_append_vals(tests, fixed, G_N_ELEMENTS(fixed));
    for (gsize i = 0; i < G_N_ELEMENTS(bad_specs); i++) {
        struct CMUnitTest t = {
            .name = bad_specs[i].what,
            .test_func = test_bad_spec,
            .initial_state = (void *)&bad_specs[i],
        };
        g_array_append_val(tests, t);
    }
    return _cmocka_run_group_tests("domain", (const struct CMUnitTest *)tests->data, tests->len,
                                   NULL, NULL);
}
