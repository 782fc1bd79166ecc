#include "vmctl.h"

#include "vm-error.h"
#include "vm-util.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Reads the --user-data file ("-" is stdin): at most VM_USER_DATA_MAX bytes of UTF-8 text, as
 * the request carries it in a string. */
static char *
read_user_data(const char *path, GError **error)
{
    vm_autofd fd = strcmp(path, "-") == 0 ? dup(STDIN_FILENO) : open(path, O_RDONLY | O_CLOEXEC);
    g_autofree char *text = g_malloc(VM_USER_DATA_MAX + 2);
    gsize len = 0;

    if (fd < 0) {
        vm_throw_errno(error, errno, "cannot open --user-data %s", path);
        return NULL;
    }
    while (len <= VM_USER_DATA_MAX) {
        ssize_t n = read(fd, text + len, VM_USER_DATA_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            vm_throw_errno(error, errno, "cannot read --user-data %s", path);
            return NULL;
        }
        if (n == 0)
            break;
        len += (gsize)n;
    }
    if (len > VM_USER_DATA_MAX) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "--user-data %s is larger than %d bytes", path,
                 VM_USER_DATA_MAX);
        return NULL;
    }
    text[len] = '\0';
    if (memchr(text, '\0', len) != NULL || !g_utf8_validate(text, (gssize)len, NULL)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "--user-data %s is not UTF-8 text", path);
        return NULL;
    }
    return g_steal_pointer(&text);
}

gboolean
vmctl_cmd_new(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *template_name = NULL, *cpus = NULL, *memory = NULL, *disk = NULL;
    g_autofree char *user_data_path = NULL;
    g_autofree char *on = NULL;
    g_autofree char *disk_read = NULL, *disk_write = NULL, *read_iops = NULL, *write_iops = NULL;
    g_auto(GStrv) key_files = NULL;
    g_auto(GStrv) secrets = NULL;
    g_auto(GStrv) egress = NULL;
    gboolean no_wait = FALSE;
    gboolean cold = FALSE;
    const GOptionEntry entries[] = {
        {"template", 0, 0, G_OPTION_ARG_STRING, &template_name, "Create the agent from TEMPLATE",
         "TEMPLATE"},
        {"cpus", 0, 0, G_OPTION_ARG_STRING, &cpus, "Give the VM N virtual CPUs", "N"},
        {"memory", 0, 0, G_OPTION_ARG_STRING, &memory, "Give the VM MIB MiB of memory", "MIB"},
        {"disk", 0, 0, G_OPTION_ARG_STRING, &disk, "Give the VM a disk of GIB GiB", "GIB"},
        {"disk-read", 0, 0, G_OPTION_ARG_STRING, &disk_read,
         "Let the VM read at most MIB MiB per second from its disk (0: no limit)", "MIB"},
        {"disk-write", 0, 0, G_OPTION_ARG_STRING, &disk_write,
         "Let the VM write at most MIB MiB per second to its disk (0: no limit)", "MIB"},
        {"disk-read-iops", 0, 0, G_OPTION_ARG_STRING, &read_iops,
         "Let the VM make at most N disk reads per second (0: no limit)", "N"},
        {"disk-write-iops", 0, 0, G_OPTION_ARG_STRING, &write_iops,
         "Let the VM make at most N disk writes per second (0: no limit)", "N"},
        {"user-data", 0, 0, G_OPTION_ARG_FILENAME, &user_data_path,
         "Pass the cloud-init user data in FILE ('-' reads stdin)", "FILE"},
        {"no-wait", 0, 0, G_OPTION_ARG_NONE, &no_wait,
         "Return once the VM is started, without waiting for SSH", NULL},
        {"ssh-key", 0, 0, G_OPTION_ARG_FILENAME_ARRAY, &key_files,
         "Let the SSH public key(s) in FILE log in too, from the first boot (repeatable)", "FILE"},
        {"secret", 0, 0, G_OPTION_ARG_STRING_ARRAY, &secrets,
         "Grant the agent the secret NAME from the start (see 'vmctl secret'; repeatable)", "NAME"},
        {"egress", 0, 0, G_OPTION_ARG_STRING_ARRAY, &egress,
         "Also allow RULE (as 'vmctl egress --allow': a rule or a preset such as @pypi; "
         "repeatable, or several separated by commas)",
         "RULE"},
        {"cold", 0, 0, G_OPTION_ARG_NONE, &cold,
         "Boot the VM even when the template has a warm image", NULL},
        {"on", 0, 0, G_OPTION_ARG_STRING, &on,
         "Make the agent on HOST of the fleet (default: where the fleet's placement puts it)",
         "HOST"},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(VmMessage) result = NULL;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, entries, error);
    if (fields == NULL)
        return FALSE;
    g_variant_dict_insert(fields, "wait", "b", !no_wait);
    if (cold)
        g_variant_dict_insert(fields, "cold", "b", TRUE);
    if (template_name != NULL)
        g_variant_dict_insert(fields, "template", "s", template_name);
    if (on != NULL) {
        if (on[0] == '\0' || strlen(on) > VM_HOST_ID_MAX)
            return vmctl_usage_error(ctx, error, "--on takes a host id of 1 to %d characters",
                                     VM_HOST_ID_MAX);
        g_variant_dict_insert(fields, "on", "s", on);
    }
    if (!vmctl_dict_add_uint(ctx, fields, "--cpus", cpus, "cpus", error) ||
        !vmctl_dict_add_uint(ctx, fields, "--memory", memory, "memory_mib", error) ||
        !vmctl_dict_add_uint(ctx, fields, "--disk", disk, "disk_gib", error))
        return FALSE;
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        static const char *const options[VM_DISK_LIMITS] = {
            [VM_DISK_READ_MIB] = "--disk-read",
            [VM_DISK_WRITE_MIB] = "--disk-write",
            [VM_DISK_READ_IOPS] = "--disk-read-iops",
            [VM_DISK_WRITE_IOPS] = "--disk-write-iops",
        };
        const char *const texts[VM_DISK_LIMITS] = {
            [VM_DISK_READ_MIB] = disk_read,
            [VM_DISK_WRITE_MIB] = disk_write,
            [VM_DISK_READ_IOPS] = read_iops,
            [VM_DISK_WRITE_IOPS] = write_iops,
        };
        guint32 value;

        if (texts[i] == NULL)
            continue;
        /* 0 is a value here: no limit, where the template or hostd.conf set one. */
        if (!vmctl_parse_uint(ctx, options[i], texts[i], 0, VM_DISK_LIMIT_MAX, &value, error))
            return FALSE;
        g_variant_dict_insert(fields, vm_disk_limit_field(i), "u", value);
    }
    if (key_files != NULL) {
        g_auto(GStrv) keys = vmctl_read_ssh_keys((const char *const *)key_files, error);
        if (keys == NULL)
            return FALSE;
        g_variant_dict_insert(fields, "ssh_keys", "^as", keys);
    }
    if (secrets != NULL)
        g_variant_dict_insert(fields, "secrets", "^as", secrets);
    if (egress != NULL) {
        g_auto(GStrv) rules = vmctl_split_rules((const char *const *)egress);
        g_variant_dict_insert(fields, "egress", "^as", rules);
    }
    if (user_data_path != NULL) {
        g_autofree char *user_data = read_user_data(user_data_path, error);
        if (user_data == NULL)
            return FALSE;
        g_variant_dict_insert(fields, "user_data", "s", user_data);
    }

    /* An older hostd would refuse the field as a protocol error that does not say why. */
    if (on != NULL && !vmctl_require_protocol(ctx, 11, "--on", error))
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_AGENT_NEW, g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autoptr(GVariant) agent = vmctl_result_get(result, "agent", G_VARIANT_TYPE_VARDICT);
    g_autofree char *summary = agent != NULL ? vmctl_format_agent_summary(agent) : NULL;
    vmctl_print_result(ctx, result, "agent", summary);
    return TRUE;
}
