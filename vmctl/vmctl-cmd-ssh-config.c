#include "vmctl.h"

#include "vm-error.h"
#include "vm-name.h"

#include <stdio.h>
#include <string.h>

/* @config with every IdentityFile line naming @identity: the user's own key, authorized in the
 * agent (vmctl authorize), instead of hostd's, which stays on hostd's host. */
static char *
config_with_identity(const char *config, const char *identity)
{
    g_autoptr(GString) text = g_string_new(NULL);
    g_auto(GStrv) lines = g_strsplit(config, "\n", -1);

    for (guint i = 0; lines[i] != NULL; i++) {
        if (lines[i + 1] == NULL && lines[i][0] == '\0')
            break;
        if (g_str_has_prefix(lines[i] + strspn(lines[i], " \t"), "IdentityFile "))
            g_string_append_printf(text, "  IdentityFile \"%s\"\n", identity);
        else
            g_string_append_printf(text, "%s\n", lines[i]);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* The absolute path of --identity FILE, which must exist and fit in a quoted ssh_config
 * word. */
static char *
identity_path(VmctlContext *ctx, const char *file, GError **error)
{
    g_autofree char *path = g_canonicalize_filename(file, NULL);

    for (const char *p = path; *p != '\0'; p++) {
        if (*p == '"' || g_ascii_iscntrl(*p)) {
            vmctl_usage_error(ctx, error,
                              "--identity %s: a path with '\"' or a control "
                              "character cannot go in an OpenSSH configuration",
                              file);
            return NULL;
        }
    }
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
        vm_throw(error, VM_ERROR_IO, "--identity %s: no such file", file);
        return NULL;
    }
    return g_steal_pointer(&path);
}

gboolean
vmctl_cmd_ssh_config(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *identity_file = NULL;
    const GOptionEntry entries[] = {
        {"identity", 0, 0, G_OPTION_ARG_FILENAME, &identity_file,
         "Log in with the private key FILE (its public key authorized with vmctl authorize) "
         "instead of hostd's",
         "FILE"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;
    g_autofree char *identity = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 0, 1, &args, error))
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    if (args[0] != NULL) {
        if (!vm_name_validate(args[0], error))
            return FALSE;
        g_variant_dict_insert(&fields, "name", "s", args[0]);
    }
    if (identity_file != NULL) {
        identity = identity_path(ctx, identity_file, error);
        if (identity == NULL)
            return FALSE;
    }
    if (!vmctl_request(ctx, VM_OP_AGENT_SSH_CONFIG, g_variant_dict_end(&fields), &result, error))
        return FALSE;

    const char *config = vm_message_get_string(result, "config", "");
    g_autofree char *remote =
        ctx->remote != NULL ? vmctl_remote_ssh_config(ctx->remote, config) : g_strdup(config);
    g_autofree char *text =
        identity != NULL ? config_with_identity(remote, identity) : g_strdup(remote);
    if (ctx->json) {
        /* The configuration as printed; path names hostd's own file, which names hostd's key. */
        g_auto(GVariantDict) out = G_VARIANT_DICT_INIT(result->fields);
        if (identity != NULL) {
            g_variant_dict_insert(&out, "config", "s", text);
            g_variant_dict_remove(&out, "path");
        }
        g_autoptr(GVariant) value = g_variant_ref_sink(g_variant_dict_end(&out));
        g_autofree char *json = vmctl_format_json(value);
        fputs(json, stdout);
    } else {
        fputs(text, stdout);
    }
    return TRUE;
}
