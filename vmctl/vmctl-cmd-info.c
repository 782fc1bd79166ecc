#include "vmctl.h"

#include <stdio.h>

#include "vm-util.h"

static const VmctlField agent_details[] = {
    {"name", "name", VMCTL_FORMAT_TEXT},
    {"state", "state", VMCTL_FORMAT_TEXT},
    {"since", "state_since", VMCTL_FORMAT_DATE},
    {"wanted", "wanted", VMCTL_FORMAT_TEXT},
    {"template", "template", VMCTL_FORMAT_TEXT},
    {"cpus", "cpus", VMCTL_FORMAT_TEXT},
    {"memory", "memory_mib", VMCTL_FORMAT_MIB},
    {"disk", "disk_gib", VMCTL_FORMAT_GIB},
    {"disk used", "disk_bytes", VMCTL_FORMAT_BYTES},
    {"ssh port", "ssh_port", VMCTL_FORMAT_TEXT},
    {"user", "user", VMCTL_FORMAT_TEXT},
    {"created", "created", VMCTL_FORMAT_DATE},
    {"forked from", "forked_from", VMCTL_FORMAT_TEXT},
    {"fork checkpoint", "fork_checkpoint", VMCTL_FORMAT_TEXT},
    {"virt type", "virt_type", VMCTL_FORMAT_TEXT},
    {"restart", "restart", VMCTL_FORMAT_TEXT},
    {"crashes", "crashes", VMCTL_FORMAT_TEXT},
    {"crash reason", "crash_reason", VMCTL_FORMAT_TEXT},
    {"secrets", "secrets", VMCTL_FORMAT_TEXT},
    {"disk limits", "disk_limits", VMCTL_FORMAT_TEXT},
};

/* What the agent's memory costs the host, shown while its QEMU runs. "unknown" where hostd could
 * not read a figure (no KSM in the kernel, a guest whose balloon does not report yet). */
static const VmctlField memory_details[] = {
    {"qemu pid", "qemu_pid", VMCTL_FORMAT_TEXT},
    {"qemu rss", "qemu_rss_bytes", VMCTL_FORMAT_BYTES},
    {"ksm merged", "ksm_merged_bytes", VMCTL_FORMAT_BYTES},
    {"ksm profit", "ksm_profit_bytes", VMCTL_FORMAT_TEXT},
    {"balloon", "balloon_actual_bytes", VMCTL_FORMAT_BYTES},
    {"guest available", "balloon_available_bytes", VMCTL_FORMAT_BYTES},
    {"guest usable", "balloon_usable_bytes", VMCTL_FORMAT_BYTES},
    {"guest unused", "balloon_unused_bytes", VMCTL_FORMAT_BYTES},
};

/* Whether @dict's agent has a QEMU (running, paused, starting), or hostd sent a memory figure. */
static gboolean
has_qemu(GVariantDict *dict)
{
    const char *state = NULL;

    for (gsize i = 0; i < G_N_ELEMENTS(memory_details); i++) {
        if (g_variant_dict_contains(dict, memory_details[i].key))
            return TRUE;
    }
    return g_variant_dict_lookup(dict, "state", "&s", &state) &&
           (g_str_equal(state, "running") || g_str_equal(state, "paused") ||
            g_str_equal(state, "starting"));
}

/* The memory figures of @dict for the text form: KSM's profit signed in human units, "unknown"
 * for those hostd could not read. libvirt's RSS is QEMU's again: only in --json. */
static void
memory_words(GVariantDict *dict)
{
    gint64 profit = 0;

    g_variant_dict_remove(dict, "balloon_rss_bytes");
    if (g_variant_dict_lookup(dict, "ksm_profit_bytes", "x", &profit)) {
        g_autofree char *bytes = vm_format_bytes((guint64)ABS(profit));
        g_autofree char *words = g_strdup_printf("%s%s", profit < 0 ? "-" : "", bytes);
        g_variant_dict_insert(dict, "ksm_profit_bytes", "s", words);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(memory_details); i++) {
        if (!g_variant_dict_contains(dict, memory_details[i].key))
            g_variant_dict_insert(dict, memory_details[i].key, "s", "unknown");
    }
}

/* The agent's grants in words: "NAME (env VAR), ...", or "none". */
static char *
format_secrets(GVariant *grants)
{
    g_autoptr(GString) text = g_string_new(NULL);

    for (gsize i = 0; i < g_variant_n_children(grants); i++) {
        g_autoptr(GVariant) grant = g_variant_get_child_value(grants, i);
        const char *name = NULL, *env = NULL;

        if (!g_variant_lookup(grant, "name", "&s", &name))
            continue;
        if (text->len > 0)
            g_string_append(text, ", ");
        if (g_variant_lookup(grant, "env", "&s", &env))
            g_string_append_printf(text, "%s (env %s)", name, env);
        else
            g_string_append(text, name);
    }
    return text->len > 0 ? g_string_free(g_steal_pointer(&text), FALSE) : g_strdup("none");
}

/* One direction of the disk limits in words: "read 200 MiB/s, 2000 IOPS", "write no limit". */
static void
format_disk_direction(GString *text, const char *what, guint32 mib, guint32 iops)
{
    g_string_append(text, what);
    if (mib == 0 && iops == 0) {
        g_string_append(text, " no limit");
        return;
    }
    if (mib != 0)
        g_string_append_printf(text, " %u MiB/s", mib);
    if (iops != 0)
        g_string_append_printf(text, "%s %u IOPS", mib != 0 ? "," : "", iops);
}

/* The disk limits of @dict in words, or NULL when hostd sent none (older than protocol 8). */
static char *
format_disk_limits(GVariantDict *dict)
{
    guint32 limits[VM_DISK_LIMITS];
    g_autoptr(GString) text = g_string_new(NULL);

    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        if (!g_variant_dict_lookup(dict, vm_disk_limit_field(i), "u", &limits[i]))
            return NULL;
    }
    format_disk_direction(text, "read", limits[VM_DISK_READ_MIB], limits[VM_DISK_READ_IOPS]);
    g_string_append(text, "; ");
    format_disk_direction(text, "write", limits[VM_DISK_WRITE_MIB], limits[VM_DISK_WRITE_IOPS]);
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* @agent with its "secrets" list, its disk limits and its memory figures in words, for the text
 * form; *@ret_memory says whether these are shown. */
static GVariant *
with_words(GVariant *agent, gboolean *ret_memory)
{
    g_autoptr(GVariantDict) dict = g_variant_dict_new(agent);
    g_autoptr(GVariant) grants =
        g_variant_dict_lookup_value(dict, "secrets", G_VARIANT_TYPE("aa{sv}"));
    g_autofree char *disk_limits = format_disk_limits(dict);

    if (grants != NULL) {
        g_autofree char *words = format_secrets(grants);
        g_variant_dict_insert(dict, "secrets", "s", words);
    }
    if (disk_limits != NULL) {
        g_variant_dict_insert(dict, "disk_limits", "s", disk_limits);
        /* The one line says it all: not each number again. */
        for (guint i = 0; i < VM_DISK_LIMITS; i++)
            g_variant_dict_remove(dict, vm_disk_limit_field(i));
    }
    *ret_memory = has_qemu(dict);
    if (*ret_memory)
        memory_words(dict);
    return g_variant_ref_sink(g_variant_dict_end(dict));
}

gboolean
vmctl_cmd_info(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autoptr(VmMessage) result = NULL;

    g_autoptr(GVariantDict) fields = vmctl_parse_name(ctx, argc, argv, NULL, error);
    if (fields == NULL)
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_AGENT_INFO, g_variant_dict_end(fields), &result, error))
        return FALSE;
    g_autoptr(GVariant) agent = vmctl_result_get(result, "agent", G_VARIANT_TYPE_VARDICT);
    if (ctx->json || agent == NULL) {
        vmctl_print_result(ctx, result, "agent", NULL);
        return TRUE;
    }
    gboolean memory = FALSE;
    g_autoptr(GVariant) shown = with_words(agent, &memory);
    g_autoptr(GArray) shown_fields = g_array_new(FALSE, FALSE, sizeof(VmctlField));
    g_array_append_vals(shown_fields, agent_details, G_N_ELEMENTS(agent_details));
    if (memory)
        g_array_append_vals(shown_fields, memory_details, G_N_ELEMENTS(memory_details));
    g_autofree char *text =
        vmctl_format_details(shown, (const VmctlField *)shown_fields->data, shown_fields->len,
                             g_get_real_time() / G_USEC_PER_SEC);
    /* A fleet's "fenced" shows among the fields the table does not name, only where set. */
    fputs(text, stdout);
    return TRUE;
}
