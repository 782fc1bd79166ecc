/* Fuzz target for the protocol decoder: the input is one frame payload (without the 4-byte
 * header), exactly what hostd hands to vm_message_decode() after reading a frame from a client.
 *
 * Besides "no crash, no leak", it checks the invariant the schema promises: whatever decodes is
 * in normal form, so encoding it again gives back the same bytes, and every field is readable
 * through the accessors.
 *
 * Fuzz: clang -fsanitize=fuzzer,address ... fuzz-protocol.c common/vm-protocol.c ...; the
 * corpus in corpus-protocol/ replays as an ordinary test through fuzz-replay.c.
 */
#include "vm-error.h"
#include "vm-protocol.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
touch_fields(const VmMessage *message)
{
    gsize n = g_variant_n_children(message->fields);

    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) value = NULL;
        g_autoptr(GVariant) found = NULL;
        g_auto(GStrv) strv = NULL;
        const char *key = NULL;
        gsize len = 0;

        g_variant_get_child(message->fields, i, "{&sv}", &key, &value);
        found = vm_message_lookup(message, key);
        if (found == NULL || !g_variant_equal(found, value))
            abort();
        strv = vm_message_dup_strv(message, key);
        if ((strv != NULL) != g_variant_is_of_type(value, G_VARIANT_TYPE_STRING_ARRAY))
            abort();
        if ((vm_message_get_data(message, key, &len) != NULL) !=
            g_variant_is_of_type(value, G_VARIANT_TYPE_BYTESTRING))
            abort();
        (void)vm_message_get_string(message, key, NULL);
        (void)vm_message_get_uint(message, key, 0);
        (void)vm_message_get_int(message, key, 0);
        (void)vm_message_get_bool(message, key, FALSE);
        (void)vm_message_get_double(message, key, 0.0);
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) message = NULL;
    g_autoptr(GBytes) frame = NULL;
    const guint8 *frame_data;
    gsize frame_len;

    message = vm_message_decode(data, size, &error);
    if (message == NULL) {
        /* Every refusal is a protocol error, never anything else. */
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
            abort();
        return 0;
    }
    if (error != NULL || vm_op_name(message->op) == NULL)
        abort();

    touch_fields(message);
    if (message->op == VM_OP_ERROR) {
        g_autoptr(GError) carried = NULL;

        if (vm_message_to_error(message, &carried) || carried == NULL ||
            carried->domain != VM_ERROR)
            abort();
    }

    frame = vm_message_encode(message, &error);
    if (frame == NULL)
        abort();
    frame_data = g_bytes_get_data(frame, &frame_len);
    if (frame_len != size + VM_FRAME_HEADER_SIZE ||
        memcmp(frame_data + VM_FRAME_HEADER_SIZE, data, size) != 0)
        abort();
    return 0;
}
