/* Fuzz target for the in-guest API's request parsing in its worker (hostd-guest-api-http.c): the
 * input is what a guest sends on a connection to 10.0.2.100:80. Any input is either refused the
 * way the server refuses it (400, or cut) or makes one call: a refusal the worker answers itself
 * (400, 404, 405 with its Allow, 413, with an error body) or an endpoint with arguments in their
 * bounds. Every call the worker can make passes hostd's own check of what a worker sends
 * (hostd_guest_api_call_from_variant()) and reads back the same. The same bytes read as a call's
 * serialised value go through hostd's check too, which takes it only as a call the worker could
 * have made.
 *
 * Fuzz: clang -fsanitize=fuzzer,address,undefined fuzz-guest-api.c hostd/hostd-guest-api-http.c
 * hostd/hostd-guest-api-rules.c common/vm-util.c common/vm-error.c with the include paths of
 * hostd/, common/, templates/ and the build directory, and libsoup-3.0 and json-glib-1.0; run on
 * a copy of corpus-guest-api/, which replays as an ordinary test through fuzz-replay.c. */
#include <glib.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hostd-guest-api-http.h"
#include "vm-error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_same(const HostdGuestApiCall *a, const HostdGuestApiCall *b)
{
    if (a->endpoint != b->endpoint || a->status != b->status ||
        g_strcmp0(a->method, b->method) != 0 || g_strcmp0(a->path, b->path) != 0 ||
        g_strcmp0(a->args.label, b->args.label) != 0 || a->args.memory != b->args.memory ||
        g_strcmp0(a->args.id, b->args.id) != 0 || a->args.seconds != b->args.seconds)
        abort();
    if ((a->args.paths == NULL) != (b->args.paths == NULL) ||
        (a->args.paths != NULL &&
         !g_strv_equal((const char *const *)a->args.paths, (const char *const *)b->args.paths)))
        abort();
}

/* Through the wire as the worker sends it and hostd reads it: taken, and the same. */
static void
check_wire(const HostdGuestApiCall *call)
{
    g_autoptr(GVariant) sent = g_variant_ref_sink(hostd_guest_api_call_to_variant(call, 7));
    g_autoptr(GBytes) bytes = g_variant_get_data_as_bytes(sent);
    g_autoptr(GVariant) got = g_variant_ref_sink(
        g_variant_new_from_bytes(G_VARIANT_TYPE(HOSTD_GUEST_API_CALL_TYPE), bytes, FALSE));
    g_auto(HostdGuestApiCall) back = {0};
    g_autoptr(GError) error = NULL;
    guint32 serial = 0;

    if (!g_variant_is_normal_form(got) ||
        !hostd_guest_api_call_from_variant(got, &serial, &back, &error) || serial != 7)
        abort();
    check_same(call, &back);
}

static void
check_call(const HostdGuestApiCall *call)
{
    if (call->method == NULL || call->path == NULL)
        abort();
    if (call->endpoint == 0) {
        if (call->refusal == NULL || (call->status == 405) != (call->allow != NULL))
            abort();
        if (call->status != 400 && call->status != 404 && call->status != 405 &&
            call->status != 413)
            abort();
        if (call->args.label != NULL || call->args.id != NULL || call->args.paths != NULL ||
            call->args.memory || call->args.seconds != 0)
            abort();
    } else if (call->status != 0 || call->refusal != NULL) {
        abort();
    }
    check_wire(call);
}

/* The input as a worker's call: hostd takes it only if it reads back the same. */
static void
check_untrusted(const uint8_t *data, size_t size)
{
    g_autoptr(GBytes) bytes = g_bytes_new(data, size);
    g_autoptr(GVariant) value = g_variant_ref_sink(
        g_variant_new_from_bytes(G_VARIANT_TYPE(HOSTD_GUEST_API_CALL_TYPE), bytes, FALSE));
    g_auto(HostdGuestApiCall) call = {0};
    g_autoptr(GError) error = NULL;
    guint32 serial = 0;

    if (!g_variant_is_normal_form(value))
        return;
    if (!hostd_guest_api_call_from_variant(value, &serial, &call, &error)) {
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
            abort();
        return;
    }
    check_wire(&call);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    g_auto(HostdGuestApiCall) call = {0};
    guint status = 1;

    if (hostd_guest_api_request_parse((const char *)data, size, &call, &status))
        check_call(&call);
    else if (status != 400 && status != 0)
        abort();
    check_untrusted(data, size);
    return 0;
}
