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
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid name: longer than %d characters", VM_NAME_MAX);
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
