#include "vm-error.h"

#include <errno.h>
#include <string.h>

G_DEFINE_QUARK(vm - error - quark, vm_error)

gboolean
vm_throw(GError **error, VmErrorCode code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_autofree char *message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error_literal(error, VM_ERROR, code, message);
    return FALSE;
}

gboolean
vm_throw_errno(GError **error, int errno_value, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g_autofree char *message = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, VM_ERROR, VM_ERROR_IO, "%s: %s", message, g_strerror(errno_value));
    return FALSE;
}

VmErrorCode
vm_error_code(const GError *error)
{
    if (error == NULL || error->domain != VM_ERROR)
        return VM_ERROR_FAILED;
    if (error->code < VM_ERROR_FAILED || error->code > VM_ERROR_LAST)
        return VM_ERROR_FAILED;
    return (VmErrorCode)error->code;
}

static const struct {
    const char *name;
    int exit_status;
} vm_error_table[] = {
    [VM_ERROR_FAILED] = {"failed", 1},
    [VM_ERROR_INVALID_ARGUMENT] = {"invalid-argument", 2},
    [VM_ERROR_NOT_FOUND] = {"not-found", 3},
    [VM_ERROR_EXISTS] = {"exists", 4},
    [VM_ERROR_BAD_STATE] = {"bad-state", 5},
    [VM_ERROR_TEMPLATE] = {"template", 6},
    [VM_ERROR_NO_RESOURCES] = {"no-resources", 7},
    [VM_ERROR_TIMEOUT] = {"timeout", 8},
    [VM_ERROR_LIBVIRT] = {"libvirt", 9},
    [VM_ERROR_SSH] = {"ssh", 10},
    [VM_ERROR_PROTOCOL] = {"protocol", 11},
    [VM_ERROR_NOT_RUNNING] = {"not-running", 12},
    [VM_ERROR_IO] = {"io", 13},
    [VM_ERROR_IMAGE] = {"image", 14},
    [VM_ERROR_CANCELLED] = {"cancelled", 15},
    [VM_ERROR_BUSY] = {"busy", 16},
    [VM_ERROR_PERMISSION] = {"permission", 17},
};

int
vm_error_exit_status(VmErrorCode code)
{
    if (code < VM_ERROR_FAILED || code > VM_ERROR_LAST)
        return 1;
    return vm_error_table[code].exit_status;
}

const char *
vm_error_code_name(VmErrorCode code)
{
    if (code < VM_ERROR_FAILED || code > VM_ERROR_LAST)
        return "failed";
    return vm_error_table[code].name;
}
