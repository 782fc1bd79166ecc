/* Fuzz target for the template loader: any input either loads into a template that respects
 * every documented limit or fails with one VM_ERROR_TEMPLATE error carrying a position. */
#include <glib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vm-error.h"
#include "vm-template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmTemplate) t = vm_template_load_data((const char *)data, size, "fuzz", &error);

    if (t == NULL) {
        g_assert_nonnull(error);
        g_assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_TEMPLATE));
        g_assert_true(g_str_has_prefix(error->message, "fuzz:"));
        return 0;
    }
    g_assert_null(error);
    g_assert_nonnull(t->name);
    g_assert_true(t->cpus >= 1 && t->cpus <= 256);
    g_assert_true(t->memory_mib >= 128 && t->memory_mib <= 1024 * 1024);
    g_assert_true(t->disk_gib >= 1 && t->disk_gib <= 16384);
    g_assert_nonnull(t->user);
    g_assert_nonnull(t->packages);
    g_assert_nonnull(t->egress_allow);
    g_assert_nonnull(t->egress_deny);
    if (t->source == VM_IMAGE_SOURCE_URL) {
        g_assert_nonnull(t->url);
        g_assert_true(t->sha256 != NULL && strlen(t->sha256) == 64);
    } else {
        g_assert_cmpint(t->source, ==, VM_IMAGE_SOURCE_MMDEBSTRAP);
        g_assert_nonnull(t->suite);
        g_assert_nonnull(t->mirror);
    }
    return 0;
}
