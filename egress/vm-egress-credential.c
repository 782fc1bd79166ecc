/* The set of grants one agent's proxy honours. */
#include "vm-egress-credential.h"
#include "vm-error.h"

#include <string.h>

typedef struct {
    char *secret_name;
    char *placeholder;
    char *value;
    char **hosts;
    char *header;
    char *format;
} Grant;

struct _VmEgressCredentials {
    gint ref_count;
    GPtrArray *grants; /* Grant */
};

static void
grant_free(Grant *grant)
{
    g_free(grant->secret_name);
    g_free(grant->placeholder);
    if (grant->value != NULL)
        memset(grant->value, 0, strlen(grant->value));
    g_free(grant->value);
    g_strfreev(grant->hosts);
    g_free(grant->header);
    g_free(grant->format);
    g_free(grant);
}

VmEgressCredentials *
vm_egress_credentials_new(void)
{
    VmEgressCredentials *creds = g_new0(VmEgressCredentials, 1);

    creds->ref_count = 1;
    creds->grants = g_ptr_array_new_with_free_func((GDestroyNotify)grant_free);
    return creds;
}

VmEgressCredentials *
vm_egress_credentials_ref(VmEgressCredentials *creds)
{
    g_atomic_int_inc(&creds->ref_count);
    return creds;
}

void
vm_egress_credentials_unref(VmEgressCredentials *creds)
{
    if (creds == NULL || !g_atomic_int_dec_and_test(&creds->ref_count))
        return;
    g_ptr_array_unref(creds->grants);
    g_free(creds);
}

gboolean
vm_egress_credentials_add(VmEgressCredentials *creds, const char *secret_name,
                          const char *placeholder, const char *value, const char *const *hosts,
                          const char *header, const char *format, GError **error)
{
    Grant *grant;

    if (value == NULL || *value == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' has an empty value",
                        secret_name);
    if (placeholder == NULL || *placeholder == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' has no placeholder",
                        secret_name);
    for (guint i = 0; i < creds->grants->len; i++) {
        const Grant *other = g_ptr_array_index(creds->grants, i);
        if (g_str_equal(other->placeholder, placeholder))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "placeholder of '%s' given twice",
                            secret_name);
    }
    grant = g_new0(Grant, 1);
    grant->secret_name = g_strdup(secret_name);
    grant->placeholder = g_strdup(placeholder);
    grant->value = g_strdup(value);
    grant->hosts = g_strdupv((char **)hosts);
    grant->header = g_strdup(header != NULL ? header : "Authorization");
    grant->format = g_strdup(format != NULL ? format : "{}");
    g_ptr_array_add(creds->grants, grant);
    return TRUE;
}

guint
vm_egress_credentials_size(VmEgressCredentials *creds)
{
    return creds->grants->len;
}
