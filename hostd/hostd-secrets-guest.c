#include "hostd-secrets-guest.h"

#include <stdlib.h>
#include <string.h>

#define BLOCK_BEGIN "# BEGIN vmctl secrets (managed by hostd; edits here are replaced)"
#define BLOCK_END   "# END vmctl secrets"

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char *
hostd_secrets_guest_environment(const char *environment, GHashTable *env_to_placeholder)
{
    g_autoptr(GString) out = g_string_new(NULL);
    g_auto(GStrv) lines = g_strsplit(environment != NULL ? environment : "", "\n", -1);
    gboolean inside = FALSE;
    for (char **line = lines; *line != NULL; line++) {
        /* The empty string after a final newline is not a line. */
        if (line[1] == NULL && **line == '\0')
            break;
        if (g_str_equal(*line, BLOCK_BEGIN)) {
            inside = TRUE;
            continue;
        }
        if (inside) {
            if (g_str_equal(*line, BLOCK_END))
                inside = FALSE;
            continue;
        }
        g_string_append_printf(out, "%s\n", *line);
    }
    if (env_to_placeholder == NULL || g_hash_table_size(env_to_placeholder) == 0)
        return g_string_free(g_steal_pointer(&out), FALSE);

    g_autofree gpointer *names = g_hash_table_get_keys_as_array(env_to_placeholder, NULL);
    qsort(names, g_hash_table_size(env_to_placeholder), sizeof *names, compare_names);
    g_string_append(out, BLOCK_BEGIN "\n");
    for (gpointer *name = names; *name != NULL; name++)
        g_string_append_printf(out, "%s=%s\n", (const char *)*name,
                               (const char *)g_hash_table_lookup(env_to_placeholder, *name));
    g_string_append(out, "NODE_EXTRA_CA_CERTS=" HOSTD_SECRETS_GUEST_CA_PATH "\n"
                         "REQUESTS_CA_BUNDLE=" HOSTD_SECRETS_GUEST_BUNDLE_PATH "\n"
                         "SSL_CERT_FILE=" HOSTD_SECRETS_GUEST_BUNDLE_PATH "\n" BLOCK_END "\n");
    return g_string_free(g_steal_pointer(&out), FALSE);
}
