#include "vm-domain.h"

#include "vm-error.h"

#include <stdarg.h>
#include <string.h>

/* QEMU's translation cache is 1 GiB per VM by default; 128 MiB roughly halves an idle TCG
 * guest's RSS without slowing its boot. */
#define TCG_TB_CACHE_MIB 128

/* The NIC sits at a fixed address on q35's pcie.0, far above the slots libvirt hands out to
 * its own controllers and root ports, so the two never collide. */
#define NET_PCI_ADDR "0x10"

static void append(GString *xml, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* Appends @fmt with every string argument XML-escaped. */
static void
append(GString *xml, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_autofree char *text = g_markup_vprintf_escaped(fmt, ap);
    va_end(ap);
    g_string_append(xml, text);
}

static gboolean
is_set(const char *value)
{
    return value != NULL && value[0] != '\0';
}

char *
vm_domain_seed_xml(const char *seed_path)
{
    GString *xml = g_string_new(NULL);

    append(xml, "    <disk type='file' device='cdrom'>\n");
    append(xml, "      <driver name='qemu' type='raw'/>\n");
    if (is_set(seed_path))
        append(xml, "      <source file='%s'/>\n", seed_path);
    append(xml, "      <target dev='sda' bus='sata'/>\n"
                "      <readonly/>\n"
                "    </disk>\n");
    return g_string_free(xml, FALSE);
}

static gboolean
is_uuid(const char *uuid)
{
    if (strlen(uuid) != 36)
        return FALSE;
    for (int i = 0; i < 36; i++) {
        gboolean dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? uuid[i] != '-' : !g_ascii_isxdigit(uuid[i]))
            return FALSE;
    }
    return TRUE;
}

/* Six colon-separated hex pairs. Checked strictly because it lands inside a QEMU option
 * string, where a comma would start a new option. */
static gboolean
is_mac(const char *mac)
{
    if (strlen(mac) != 17)
        return FALSE;
    for (int i = 0; i < 17; i++) {
        if (i % 3 == 2 ? mac[i] != ':' : !g_ascii_isxdigit(mac[i]))
            return FALSE;
    }
    /* the low bit of the first octet marks multicast, which a NIC cannot have */
    return (g_ascii_xdigit_value(mac[1]) & 1) == 0;
}

/* <metadata> takes @xml verbatim, so a stray '<' would break the whole domain: make sure it
 * is well-formed first. */
static gboolean
is_well_formed(const char *xml)
{
    static const GMarkupParser no_callbacks = {0};
    g_autoptr(GMarkupParseContext) context =
        g_markup_parse_context_new(&no_callbacks, 0, NULL, NULL);

    return g_markup_parse_context_parse(context, "<metadata>", -1, NULL) &&
           g_markup_parse_context_parse(context, xml, -1, NULL) &&
           g_markup_parse_context_parse(context, "</metadata>", -1, NULL) &&
           g_markup_parse_context_end_parse(context, NULL);
}

/* The command lands in a QEMU option string and libslirp splits it like a shell: commas are
 * escaped where it is used, quoting is the caller's, but a control character has no business
 * in either. */
static gboolean
is_forward_command(const char *command)
{
    if (command[0] == '\0')
        return FALSE;
    for (const char *p = command; *p != '\0'; p++) {
        if (g_ascii_iscntrl(*p))
            return FALSE;
    }
    return TRUE;
}

/* QEMU's option syntax: a comma inside a value is written twice. */
static char *
qemu_opt_escape(const char *value)
{
    g_autoptr(GString) out = g_string_new(NULL);

    for (const char *p = value; *p != '\0'; p++) {
        if (*p == ',')
            g_string_append_c(out, ',');
        g_string_append_c(out, *p);
    }
    return g_string_free(g_steal_pointer(&out), FALSE);
}

static gboolean
spec_validate(const VmDomainSpec *spec, GError **error)
{
    if (!is_set(spec->name))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "domain spec: no name");
    if (spec->uuid == NULL || !is_uuid(spec->uuid))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: uuid missing or not in 8-4-4-4-12 form");
    if (spec->genid != NULL && !is_uuid(spec->genid))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: genid not in 8-4-4-4-12 form");
    if (spec->virt_type == NULL ||
        !(g_str_equal(spec->virt_type, "kvm") || g_str_equal(spec->virt_type, "qemu")))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: virt_type must be 'kvm' or 'qemu'");
    if (spec->cpus == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "domain spec: cpus is 0");
    if (spec->memory_mib == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "domain spec: memory_mib is 0");
    if (!is_set(spec->disk_path))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "domain spec: no disk_path");
    for (const char *const *b = spec->backing_chain; b != NULL && *b != NULL; b++) {
        if (!g_path_is_absolute(*b))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "domain spec: backing image '%s' is not an absolute path", *b);
    }
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        if (spec->disk_limits[i] > VM_DISK_LIMIT_MAX)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "domain spec: disk limit %u is over %u", spec->disk_limits[i],
                            VM_DISK_LIMIT_MAX);
    }
    if (spec->mac == NULL || !is_mac(spec->mac))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: mac missing or not a unicast xx:xx:xx:xx:xx:xx address");
    if (spec->ssh_port == 0 || spec->ssh_port > 65535)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: ssh_port %u is not in 1..65535", spec->ssh_port);
    if (!is_set(spec->console_socket))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "domain spec: no console_socket");
    if (!is_set(spec->kernel_path) && (spec->initrd_path != NULL || spec->cmdline != NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: initrd_path and cmdline need a kernel_path");
    if (spec->metadata_xml != NULL && !is_well_formed(spec->metadata_xml))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: metadata_xml is not well-formed XML");
    if (spec->egress_command != NULL && !is_forward_command(spec->egress_command))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: egress_command is empty or holds a control character");
    if (spec->guest_api_command != NULL && !is_forward_command(spec->guest_api_command))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "domain spec: guest_api_command is empty or holds a control character");
    return TRUE;
}

static void
append_os(GString *xml, const VmDomainSpec *spec)
{
    append(xml, "  <os>\n    <type arch='x86_64' machine='%s'>hvm</type>\n", VM_MACHINE_TYPE);
    if (is_set(spec->kernel_path)) {
        append(xml, "    <kernel>%s</kernel>\n", spec->kernel_path);
        if (is_set(spec->initrd_path))
            append(xml, "    <initrd>%s</initrd>\n", spec->initrd_path);
        if (is_set(spec->cmdline))
            append(xml, "    <cmdline>%s</cmdline>\n", spec->cmdline);
    } else {
        g_string_append(xml, "    <boot dev='hd'/>\n");
    }
    g_string_append(xml, "  </os>\n");
}

/* QEMU's throttling of the guest's own I/O on the disk; block jobs (checkpoint commits and
 * pulls) have a device of their own and are not slowed by it. */
static void
append_iotune(GString *xml, const guint *limits)
{
    static const char *const elements[VM_DISK_LIMITS] = {
        [VM_DISK_READ_MIB] = "read_bytes_sec",
        [VM_DISK_WRITE_MIB] = "write_bytes_sec",
        [VM_DISK_READ_IOPS] = "read_iops_sec",
        [VM_DISK_WRITE_IOPS] = "write_iops_sec",
    };
    gboolean any = FALSE;

    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        any = any || limits[i] != 0;
    if (!any)
        return;
    g_string_append(xml, "      <iotune>\n");
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        guint64 value = limits[i];

        if (value == 0)
            continue;
        if (i == VM_DISK_READ_MIB || i == VM_DISK_WRITE_MIB)
            value <<= 20;
        g_string_append_printf(xml, "        <%s>%" G_GUINT64_FORMAT "</%s>\n", elements[i], value,
                               elements[i]);
    }
    g_string_append(xml, "      </iotune>\n");
}

/* One <backingStore> per image of @chain, each inside the one above it. The last is left open
 * (no empty <backingStore/> inside it): the bottom image is the caller's own (a base image),
 * whose own backing file, if any, libvirt may read from its header. */
static void
append_backing_chain(GString *xml, const char *const *chain)
{
    guint n = chain != NULL ? g_strv_length((char **)chain) : 0;

    for (guint i = 0; i < n; i++) {
        g_autofree char *indent = g_strnfill(6 + 2 * i, ' ');
        append(xml,
               "%s<backingStore type='file'>\n"
               "%s  <format type='qcow2'/>\n"
               "%s  <source file='%s'/>\n",
               indent, indent, indent, chain[i]);
    }
    for (guint i = n; i > 0; i--) {
        g_autofree char *indent = g_strnfill(6 + 2 * (i - 1), ' ');
        append(xml, "%s</backingStore>\n", indent);
    }
}

static void
append_devices(GString *xml, const VmDomainSpec *spec)
{
    g_string_append(xml, "  <devices>\n");
    if (is_set(spec->emulator))
        append(xml, "    <emulator>%s</emulator>\n", spec->emulator);

    /* cache='none' (O_DIRECT) is what io='native' needs; discard lets fstrim in the guest
     * shrink the overlay, which keeps checkpoints small. */
    append(xml,
           "    <disk type='file' device='disk'>\n"
           "      <driver name='qemu' type='qcow2' cache='none' io='native' discard='unmap'/>\n"
           "      <source file='%s'/>\n",
           spec->disk_path);
    append_backing_chain(xml, spec->backing_chain);
    g_string_append(xml, "      <target dev='vda' bus='virtio'/>\n");
    append_iotune(xml, spec->disk_limits);
    g_string_append(xml, "    </disk>\n");
    if (is_set(spec->seed_path)) {
        g_autofree char *seed = vm_domain_seed_xml(spec->seed_path);
        g_string_append(xml, seed);
    }

    /* Not a file: QEMU appends to a file without bound, so a guest could fill the host's disk.
     * On a socket QEMU listens on (libvirt makes it and hands QEMU the listening descriptor),
     * output nobody reads is dropped, never blocking QEMU; hostd reads it into a size-capped,
     * rotated console.log (hostd-console.c). */
    append(xml,
           "    <serial type='unix'>\n"
           "      <source mode='bind' path='%s'/>\n"
           "      <target port='0'/>\n"
           "    </serial>\n"
           "    <console type='unix'>\n"
           "      <source mode='bind' path='%s'/>\n"
           "      <target type='serial' port='0'/>\n"
           "    </console>\n",
           spec->console_socket, spec->console_socket);

    g_string_append(xml, "    <channel type='unix'>\n");
    if (is_set(spec->agent_socket))
        append(xml, "      <source mode='bind' path='%s'/>\n", spec->agent_socket);
    g_string_append(xml, "      <target type='virtio' name='org.qemu.guest_agent.0'/>\n"
                         "    </channel>\n");
    /* An sshd for hostd alone, whose session outlives a save (hostd/hostd-ssh-serial.h);
     * libvirt names the socket. */
    g_string_append(xml, "    <channel type='unix'>\n"
                         "      <source mode='bind'/>\n"
                         "      <target type='virtio' name='" VM_DOMAIN_SSH_CHANNEL "'/>\n"
                         "    </channel>\n");

    /* Without an entropy source early getrandom() callers stall for minutes under TCG. Free
     * page reporting: the guest hands the pages it frees back to QEMU, which drops them, so an
     * agent's RSS follows what its guest uses, and a saved or checkpointed memory image carries
     * them as zero pages (a smaller image, read faster at a wake). */
    g_string_append(xml, "    <rng model='virtio'>\n"
                         "      <backend model='random'>/dev/urandom</backend>\n"
                         "    </rng>\n"
                         "    <memballoon model='virtio' freePageReporting='on'/>\n"
                         "  </devices>\n");
}

/* libvirt has no user-mode network that can be restricted (and its passt backend is disabled
 * on Debian 12), so the NIC is passed to QEMU directly; this is also why there is no
 * <interface>. restrict=on drops everything but DHCP, the host forward and the guest forward,
 * and the host forward listens on loopback only. The guest forwards run egress_command (for the
 * proxy, and with "dns" for its resolver) and guest_api_command per connection (the cmd: form; a
 * chardev would serve one connection at a time). */
static void
append_network(GString *xml, const VmDomainSpec *spec)
{
    g_autoptr(GString) netdev = g_string_new(NULL);
    g_autofree char *device =
        g_strdup_printf("virtio-net-pci,netdev=vmnet0,mac=%s,addr=%s", spec->mac, NET_PCI_ADDR);

    g_string_printf(netdev, "user,id=vmnet0,restrict=on,hostfwd=tcp:127.0.0.1:%u-:22",
                    spec->ssh_port);
    if (spec->egress_command != NULL) {
        g_autofree char *command = qemu_opt_escape(spec->egress_command);

        g_string_append_printf(netdev, ",guestfwd=tcp:%s:%d-cmd:%s", VM_EGRESS_GUEST_ADDRESS,
                               VM_EGRESS_GUEST_PORT, command);
        g_string_append_printf(netdev, ",guestfwd=tcp:%s:%d-cmd:%s dns", VM_EGRESS_GUEST_ADDRESS,
                               VM_EGRESS_DNS_PORT, command);
    }
    if (spec->guest_api_command != NULL) {
        g_autofree char *command = qemu_opt_escape(spec->guest_api_command);

        g_string_append_printf(netdev, ",guestfwd=tcp:%s:%d-cmd:%s", VM_GUEST_API_ADDRESS,
                               VM_GUEST_API_PORT, command);
    }
    append(xml,
           "  <qemu:commandline>\n"
           "    <qemu:arg value='-netdev'/>\n"
           "    <qemu:arg value='%s'/>\n"
           "    <qemu:arg value='-device'/>\n"
           "    <qemu:arg value='%s'/>\n"
           "    <qemu:arg value='-sandbox'/>\n"
           "    <qemu:arg value='%s'/>\n"
           "  </qemu:commandline>\n",
           netdev->str, device, VM_DOMAIN_SANDBOX);
}

char *
vm_domain_xml_build(const VmDomainSpec *spec, GError **error)
{
    g_autoptr(GString) xml = g_string_new(NULL);
    gboolean tcg;

    g_return_val_if_fail(spec != NULL, NULL);

    if (!spec_validate(spec, error))
        return NULL;
    tcg = g_str_equal(spec->virt_type, "qemu");

    append(xml,
           "<domain type='%s' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n"
           "  <name>%s</name>\n"
           "  <uuid>%s</uuid>\n",
           spec->virt_type, spec->name, spec->uuid);
    if (spec->genid != NULL)
        append(xml, "  <genid>%s</genid>\n", spec->genid);
    if (spec->metadata_xml != NULL)
        g_string_append_printf(xml, "  <metadata>\n    %s\n  </metadata>\n", spec->metadata_xml);
    /* No <memoryBacking><nosharepages/>: QEMU marks guest RAM mergeable by default (mem-merge),
     * so the kernel's KSM can share the pages agents restored from one warm image hold alike
     * (hostd.conf ksm, hostd/hostd-ksm.h). */
    append(xml,
           "  <memory unit='MiB'>%u</memory>\n"
           "  <vcpu>%u</vcpu>\n",
           spec->memory_mib, spec->cpus);
    append_os(xml, spec);

    g_string_append(xml, "  <features>\n    <acpi/>\n    <apic/>\n");
    if (tcg)
        g_string_append_printf(xml,
                               "    <tcg>\n"
                               "      <tb-cache unit='MiB'>%d</tb-cache>\n"
                               "    </tcg>\n",
                               TCG_TB_CACHE_MIB);
    g_string_append(xml, "  </features>\n");
    /* under TCG the default model boots fastest; 'maximum' was measurably slower */
    if (!tcg && (spec->cpu_disable == NULL || spec->cpu_disable[0] == NULL)) {
        g_string_append(xml, "  <cpu mode='host-passthrough'/>\n");
    } else if (!tcg) {
        g_string_append(xml, "  <cpu mode='host-passthrough'>\n");
        for (const char *const *f = spec->cpu_disable; *f != NULL; f++)
            append(xml, "    <feature policy='disable' name='%s'/>\n", *f);
        g_string_append(xml, "  </cpu>\n");
    }
    g_string_append(xml, "  <clock offset='utc'/>\n"
                         "  <on_poweroff>destroy</on_poweroff>\n"
                         "  <on_reboot>restart</on_reboot>\n"
                         "  <on_crash>destroy</on_crash>\n");
    append_devices(xml, spec);
    /* QEMU runs as the agent's own id. relabel='no': libvirt's DAC driver would give every
     * file the domain names to that id, the shared ones included (the template's kernel and
     * initrd, and each image of the disk's backing chain, base image and warm image too), and
     * an id that owns a file can make it writable. hostd gives each file its owner itself
     * (hostd/hostd-confine.h). */
    if (spec->qemu_id != 0)
        g_string_append_printf(xml,
                               "  <seclabel type='static' model='dac' relabel='no'>\n"
                               "    <label>+%u:+%u</label>\n"
                               "  </seclabel>\n",
                               spec->qemu_id, spec->qemu_id);
    append_network(xml, spec);
    g_string_append(xml, "</domain>\n");
    return g_string_free(g_steal_pointer(&xml), FALSE);
}
