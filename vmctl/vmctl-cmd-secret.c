/* vmctl secret create|list|set|rm|grant|revoke: the credential broker (docs/SECRETS.md). A
 * secret's value is read from stdin or --from-file, never from the command line (where `ps` and
 * shell history would see it), and goes to hostd in the request's body only. */
#include "vmctl.h"

#include "vm-error.h"
#include "vm-name.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* clang-format off */
static const VmctlField secret_columns[] = {
    {"NAME", "name", VMCTL_FORMAT_TEXT},
    {"HOSTS", "hosts", VMCTL_FORMAT_TEXT},
    {"HEADER", "header", VMCTL_FORMAT_TEXT},
    {"FORMAT", "format", VMCTL_FORMAT_TEXT},
    {"ENV", "env", VMCTL_FORMAT_TEXT},
    {"AGENTS", "agents", VMCTL_FORMAT_TEXT},
};
/* clang-format on */

/* Reads at most @max bytes of @fd into @buf; sets *@ret_len. More than @max is an error. */
static gboolean
read_value_fd(int fd, const char *what, guint8 *buf, gsize max, gsize *ret_len, GError **error)
{
    gsize len = 0;

    for (;;) {
        ssize_t n = read(fd, buf + len, max + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot read the secret's value from %s", what);
        if (n == 0)
            break;
        len += (gsize)n;
        if (len > max)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "the secret's value in %s is over %d bytes", what, VM_SECRET_VALUE_MAX);
    }
    *ret_len = len;
    return TRUE;
}

/* The value from @path or, when NULL, stdin, less one trailing newline (LF or CRLF), as a new
 * "ay" for the request. Empty is refused here, before anything is sent. The buffer it passed
 * through is wiped. */
static GVariant *
read_value(VmctlContext *ctx, const char *path, GError **error)
{
    /* Room for the value, its newline and one byte more to see that it is too long. */
    guint8 buf[VM_SECRET_VALUE_MAX + 3];
    const gsize max = sizeof(buf) - 1;
    gsize len = 0;
    gboolean ok;

    if (path == NULL && isatty(STDIN_FILENO)) {
        vmctl_usage_error(ctx, error,
                          "give the secret's value on stdin (< FILE) or with --from-file FILE, "
                          "never on the command line");
        return NULL;
    }
    if (path != NULL) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            vm_throw_errno(error, errno, "cannot open %s", path);
            return NULL;
        }
        ok = read_value_fd(fd, path, buf, max, &len, error);
        close(fd);
    } else {
        ok = read_value_fd(STDIN_FILENO, "stdin", buf, max, &len, error);
    }
    if (ok && len > 0 && buf[len - 1] == '\n') {
        len--;
        if (len > 0 && buf[len - 1] == '\r')
            len--;
    }
    if (ok && len == 0)
        ok = vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "empty secret value");
    if (ok && len > VM_SECRET_VALUE_MAX)
        ok = vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "the secret's value is over %d bytes",
                      VM_SECRET_VALUE_MAX);
    GVariant *value = ok ? g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, buf, len, 1) : NULL;
    explicit_bzero(buf, sizeof(buf));
    return value;
}

gboolean
vmctl_cmd_secret_create(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) hosts = NULL, headers = NULL;
    g_autofree char *format = NULL, *env = NULL, *from_file = NULL;
    const GOptionEntry entries[] = {
        {"host", 0, 0, G_OPTION_ARG_STRING_ARRAY, &hosts,
         "Let the secret go to HOST: a name, or *.domain for its subdomains (repeatable; at "
         "least one)",
         "HOST"},
        {"header", 0, 0, G_OPTION_ARG_STRING_ARRAY, &headers,
         "Put the secret in request header HEADER (default: Authorization); repeatable, or "
         "several separated by commas: the placeholder is then replaced where it stands in "
         "whichever holds it",
         "HEADER"},
        {"format", 0, 0, G_OPTION_ARG_STRING, &format,
         "The header's value, {} where the secret goes (default: 'Bearer {}'; with several "
         "headers '{}')",
         "FORMAT"},
        {"env", 0, 0, G_OPTION_ARG_STRING, &env,
         "The guest's variable holding the placeholder (default: NAME upper-cased, - as _)", "VAR"},
        {"from-file", 0, 0, G_OPTION_ARG_FILENAME, &from_file,
         "Read the value from PATH instead of stdin", "PATH"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error))
        return FALSE;
    if (hosts == NULL)
        return vmctl_usage_error(ctx, error, "missing --host: where may the secret go?");
    GVariant *value = read_value(ctx, from_file, error);
    if (value == NULL)
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "secret", "s", args[0]);
    g_variant_dict_insert(&fields, "hosts", "^as", hosts);
    if (headers != NULL) {
        /* One string on the wire, as hostd stores it; hostd checks each name. */
        g_autofree char *header = g_strjoinv(", ", headers);
        g_variant_dict_insert(&fields, "header", "s", header);
    }
    if (format != NULL)
        g_variant_dict_insert(&fields, "format", "s", format);
    if (env != NULL)
        g_variant_dict_insert(&fields, "env", "s", env);
    g_variant_dict_insert_value(&fields, "value", value);
    if (!vmctl_request(ctx, VM_OP_SECRET_CREATE, g_variant_dict_end(&fields), &result, error))
        return FALSE;
    vmctl_print_result(ctx, result, "secret", NULL);
    return TRUE;
}

/* "a, b", or "-" for an empty list. */
static char *
join_or_dash(GVariant *dict, const char *key)
{
    g_autoptr(GVariant) list = g_variant_lookup_value(dict, key, G_VARIANT_TYPE_STRING_ARRAY);
    g_autofree const char **items = list != NULL ? g_variant_get_strv(list, NULL) : NULL;

    if (items == NULL || items[0] == NULL)
        return g_strdup("-");
    return g_strjoinv(", ", (char **)items);
}

gboolean
vmctl_cmd_secret_list(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 0, &args, error) ||
        !vmctl_request(ctx, VM_OP_SECRET_LIST, NULL, &result, error))
        return FALSE;
    g_autoptr(GVariant) secrets = vmctl_result_rows(result, "secrets");
    if (ctx->json) {
        g_autofree char *json = vmctl_format_json(secrets);
        fputs(json, stdout);
        return TRUE;
    }
    if (g_variant_n_children(secrets) == 0) {
        puts("no secrets; create one with: vmctl secret create NAME --host HOST < value-file");
        return TRUE;
    }
    /* The lists in words, for the table. */
    g_auto(GVariantBuilder) rows = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (gsize i = 0; i < g_variant_n_children(secrets); i++) {
        g_autoptr(GVariant) secret = g_variant_get_child_value(secrets, i);
        g_autoptr(GVariantDict) row = g_variant_dict_new(secret);
        g_autofree char *hosts = join_or_dash(secret, "hosts");
        g_autofree char *agents = join_or_dash(secret, "agents");
        g_variant_dict_insert(row, "hosts", "s", hosts);
        g_variant_dict_insert(row, "agents", "s", agents);
        g_variant_builder_add_value(&rows, g_variant_dict_end(row));
    }
    g_autoptr(GVariant) table_rows = g_variant_ref_sink(g_variant_builder_end(&rows));
    g_autofree char *table =
        vmctl_format_table(table_rows, secret_columns, G_N_ELEMENTS(secret_columns),
                           g_get_real_time() / G_USEC_PER_SEC);
    fputs(table, stdout);
    return TRUE;
}

gboolean
vmctl_cmd_secret_set(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *from_file = NULL;
    const GOptionEntry entries[] = {
        {"from-file", 0, 0, G_OPTION_ARG_FILENAME, &from_file,
         "Read the new value from PATH instead of stdin", "PATH"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error))
        return FALSE;
    GVariant *value = read_value(ctx, from_file, error);
    if (value == NULL)
        return FALSE;
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "secret", "s", args[0]);
    g_variant_dict_insert_value(&fields, "value", value);
    if (!vmctl_request(ctx, VM_OP_SECRET_SET, g_variant_dict_end(&fields), &result, error))
        return FALSE;
    vmctl_print_result(ctx, result, "secret", NULL);
    return TRUE;
}

gboolean
vmctl_cmd_secret_rm(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    gboolean force = FALSE;
    const GOptionEntry entries[] = {
        {"force", 'f', 0, G_OPTION_ARG_NONE, &force,
         "Revoke the secret from every agent holding it first", NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error))
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_SECRET_RM,
                       g_variant_new_parsed("{'secret': <%s>, 'force': <%b>}", args[0], force),
                       &result, error))
        return FALSE;
    vmctl_print_result(ctx, result, NULL, NULL);
    return TRUE;
}

/* grant and revoke: AGENT NAME. */
static gboolean
secret_grant_or_revoke(VmctlContext *ctx, VmOp op, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 2, 2, &args, error) ||
        !vm_name_validate(args[0], error))
        return FALSE;
    if (!vmctl_request(ctx, op,
                       g_variant_new_parsed("{'name': <%s>, 'secret': <%s>}", args[0], args[1]),
                       &result, error))
        return FALSE;
    vmctl_print_result(ctx, result, "secrets", NULL);
    return TRUE;
}

gboolean
vmctl_cmd_secret_grant(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    return secret_grant_or_revoke(ctx, VM_OP_SECRET_GRANT, argc, argv, error);
}

gboolean
vmctl_cmd_secret_revoke(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    return secret_grant_or_revoke(ctx, VM_OP_SECRET_REVOKE, argc, argv, error);
}
