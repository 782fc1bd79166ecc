#include "vm-name.h"

#include "vm-error.h"

#include <string.h>

gboolean
vm_name_validate(const char *name, GError **error)
{
    if (name == NULL || name[0] == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "agent name is empty");

    size_t len = strlen(name);
    g_autofree char *shown = g_strescape(len > 80 ? "(too long)" : name, NULL);
    if (len > VM_NAME_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid name: longer than %d characters",
                        VM_NAME_MAX);
    if (!g_ascii_islower(name[0]))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid name '%s': must start with a lower-case letter a-z", shown);
    for (size_t i = 1; i < len; i++) {
        char c = name[i];
        if (!(g_ascii_islower(c) || g_ascii_isdigit(c) || c == '-'))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "invalid name '%s': only a-z, 0-9 and '-' are allowed", shown);
    }
    if (name[len - 1] == '-')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid name '%s': must not end with '-' (it is also the hostname)",
                        shown);
    return TRUE;
}

gboolean
vm_name_validate_template(const char *name, GError **error)
{
    if (name == NULL || name[0] == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "template name is empty");
    if (strstr(name, "..") != NULL || name[strlen(name) - 1] == '.') {
        g_autofree char *shown = g_strescape(name, NULL);
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid template name '%s': dots only between other characters", shown);
    }
    /* With the dots taken out, the rest follows the agent-name rules. */
    g_autofree char *undotted = g_strdup(name);
    for (char *p = undotted; *p != '\0'; p++) {
        if (*p == '.')
            *p = 'x';
    }
    g_autoptr(GError) local_error = NULL;
    if (!vm_name_validate(undotted, &local_error)) {
        g_autofree char *shown = g_strescape(strlen(name) > 80 ? "(too long)" : name, NULL);
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid template name '%s': use a-z, 0-9, '-' and '.'", shown);
    }
    return TRUE;
}
