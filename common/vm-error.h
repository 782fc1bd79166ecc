/* The one error domain of vmctl/hostd.
 *
 * Every fallible function in the project sets a GError in VM_ERROR; the code travels over the
 * hostd socket unchanged and vmctl maps it to its exit status (vm_error_exit_status()).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_ERROR (vm_error_quark())

/* Codes are part of the wire protocol: append only, never renumber. */
typedef enum {
    VM_ERROR_FAILED = 1,       /* anything not covered below */
    VM_ERROR_INVALID_ARGUMENT, /* bad name, bad option value, bad request field */
    VM_ERROR_NOT_FOUND,        /* unknown agent, template or checkpoint */
    VM_ERROR_EXISTS,           /* name already taken */
    VM_ERROR_BAD_STATE,        /* e.g. rm of a running agent without --force */
    VM_ERROR_TEMPLATE,         /* template file invalid (message carries file:line:column) */
    VM_ERROR_NO_RESOURCES,     /* more cpus/memory/disk than the host has, no free port */
    VM_ERROR_TIMEOUT,          /* a guest did not answer in time */
    VM_ERROR_LIBVIRT,          /* libvirt refused an operation */
    VM_ERROR_SSH,              /* the SSH connection to a guest failed */
    VM_ERROR_PROTOCOL,         /* malformed, truncated or oversized frame */
    VM_ERROR_NOT_RUNNING,      /* hostd is not running at the socket */
    VM_ERROR_IO,               /* local file or process failure */
    VM_ERROR_IMAGE,            /* image build or download failed */
    VM_ERROR_CANCELLED,        /* the client went away or asked to stop */
    VM_ERROR_BUSY,             /* another hostd holds the state dir */
    VM_ERROR_PERMISSION,       /* hostd's socket is there, not open to this user */
} VmErrorCode;

#define VM_ERROR_LAST VM_ERROR_PERMISSION

GQuark vm_error_quark(void);

/* Sets @error to VM_ERROR/@code with a printf-style message and returns FALSE, so a failure is
 * one line: `return vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s'", name);`. Can't fail. */
gboolean vm_throw(GError **error, VmErrorCode code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

/* Like vm_throw() with strerror(@errno_value) appended as ": <reason>"; returns FALSE. */
gboolean vm_throw_errno(GError **error, int errno_value, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

/* Returns the code of @error inside VM_ERROR, or VM_ERROR_FAILED for a foreign domain (GIO,
 * GLib file errors, ...). @error may be NULL (returns VM_ERROR_FAILED). Can't fail. */
VmErrorCode vm_error_code(const GError *error);

/* The exit status vmctl uses for @code: distinct per code, documented in vmctl(1). */
int vm_error_exit_status(VmErrorCode code);

/* A short stable name for @code ("not-found"), used in --json error output. Can't fail. */
const char *vm_error_code_name(VmErrorCode code);

G_END_DECLS
