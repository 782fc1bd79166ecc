/* Agent and template names. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_NAME_MAX 63

/* Checks that @name is a valid agent (or template) name: `[a-z][a-z0-9-]{0,62}` not ending in '-',
 * so it is safe as a file name, a libvirt domain name and a hostname. Fails with
 * VM_ERROR_INVALID_ARGUMENT and a message that quotes the name (escaped when not printable). @name
 * may be NULL (invalid). */
gboolean vm_name_validate(const char *name, GError **error);

/* Checks a template name: like an agent name, but dots are allowed between other characters
 * ("ubuntu-24.04"), never two in a row, first or last. Fails with VM_ERROR_INVALID_ARGUMENT. */
gboolean vm_name_validate_template(const char *name, GError **error);

G_END_DECLS
