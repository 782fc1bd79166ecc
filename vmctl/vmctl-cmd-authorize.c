#include "vmctl.h"

#include "vm-error.h"
#include "vm-name.h"

#include <stdio.h>
#include <string.h>

/* clang-format off */
static const VmctlField key_columns[] = {
    {"FINGERPRINT", "fingerprint", VMCTL_FORMAT_TEXT},
    {"TYPE", "type", VMCTL_FORMAT_TEXT},
    {"BITS", "bits", VMCTL_FORMAT_TEXT},
    {"COMMENT", "comment", VMCTL_FORMAT_TEXT},
};
/* clang-format on */

static guint
result_count(const VmMessage *result)
{
    g_autoptr(GVariant) keys = vmctl_result_get(result, "keys", G_VARIANT_TYPE("aa{sv}"));

    return keys != NULL ? (guint)g_variant_n_children(keys) : 0;
}

static gboolean
authorize_list(VmctlContext *ctx, const char *name, GError **error)
{
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_request(ctx, VM_OP_AGENT_AUTHORIZE_LIST,
                       g_variant_new_parsed("{'name': <%s>}", name), &result, error))
        return FALSE;
    g_autoptr(GVariant) keys = vmctl_result_rows(result, "keys");
    if (ctx->json) {
        g_autofree char *json = vmctl_format_json(keys);
        fputs(json, stdout);
    } else if (g_variant_n_children(keys) == 0) {
        printf("%s has no keys of yours; add one with: vmctl authorize %s ~/.ssh/id_ed25519.pub\n",
               name, name);
    } else {
        g_autofree char *table = vmctl_format_table(keys, key_columns, G_N_ELEMENTS(key_columns),
                                                    g_get_real_time() / G_USEC_PER_SEC);
        fputs(table, stdout);
    }
    return TRUE;
}

static gboolean
authorize_rm(VmctlContext *ctx, const char *name, const char *fingerprint, GError **error)
{
    g_autoptr(VmMessage) result = NULL;

    /* What --list shows: OpenSSH's MD5 form or a bare hash would only come back as unknown. */
    if (!g_str_has_prefix(fingerprint, "SHA256:") || fingerprint[7] == '\0')
        return vmctl_usage_error(ctx, error,
                                 "--rm takes a key's fingerprint, SHA256:..., as 'vmctl authorize "
                                 "%s --list' shows it",
                                 name);
    if (!vmctl_request(
            ctx, VM_OP_AGENT_AUTHORIZE_RM,
            g_variant_new_parsed("{'name': <%s>, 'fingerprint': <%s>}", name, fingerprint), &result,
            error))
        return FALSE;
    g_autofree char *text = g_strdup_printf("removed key %s from %s (%u left)", fingerprint, name,
                                            result_count(result));
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}

static gboolean
authorize_add(VmctlContext *ctx, const char *name, const char *file, GError **error)
{
    const char *const files[] = {file, NULL};
    g_auto(GStrv) lines = vmctl_read_ssh_keys(files, error);
    g_autoptr(VmMessage) result = NULL;

    if (lines == NULL)
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_AGENT_AUTHORIZE_ADD,
                       g_variant_new_parsed("{'name': <%s>, 'keys': <%^as>}", name, lines), &result,
                       error))
        return FALSE;
    guint added = vm_message_get_uint(result, "added", 0);
    /* ssh-keygen's habit: the private key is the public one's file without ".pub". */
    g_autofree char *identity = g_str_has_suffix(file, ".pub")
                                    ? g_strndup(file, strlen(file) - strlen(".pub"))
                                    : g_strdup("PRIVATE_KEY");
    g_autofree char *quoted = g_shell_quote(identity);
    g_autofree char *text = g_strdup_printf(
        "authorized %u new key%s in %s (%u in all); log in with: "
        "ssh -F <(vmctl ssh-config %s --identity %s) vmctl-%s",
        added, added == 1 ? "" : "s", name, result_count(result), name, quoted, name);
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}

gboolean
vmctl_cmd_authorize(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean list = FALSE;
    g_autofree char *rm = NULL;
    const GOptionEntry entries[] = {
        {"list", 0, 0, G_OPTION_ARG_NONE, &list,
         "List the keys of yours the agent accepts: fingerprints and comments", NULL},
        {"rm", 0, 0, G_OPTION_ARG_STRING, &rm,
         "Take the key with FINGERPRINT (SHA256:..., from --list) out of the agent", "FINGERPRINT"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 2, &args, error) ||
        !vm_name_validate(args[0], error))
        return FALSE;
    const char *file = args[1];
    if ((file != NULL) + list + (rm != NULL) != 1)
        return vmctl_usage_error(ctx, error,
                                 "give one of: a public key FILE, --list, --rm FINGERPRINT");
    if (list)
        return authorize_list(ctx, args[0], error);
    if (rm != NULL)
        return authorize_rm(ctx, args[0], rm, error);
    return authorize_add(ctx, args[0], file, error);
}
