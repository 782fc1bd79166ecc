/* A worker taken over, for test-hostd-guest-api: it starts as vm-guest-api-worker does, then
 * sends hostd a call no worker of ours makes (a checkpoint asked on GET /v1/info, which a
 * hostd that believed it would take), and waits for hostd to end it. */
#include <stdio.h>
#include <unistd.h>

#include "hostd-guest-api-wire.h"

int
main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) start = NULL;
    const char *const none[] = {NULL};

    start = vm_wire_recv(HOSTD_GUEST_API_WORKER_CONTROL_FD, HOSTD_GUEST_API_WIRE_TO_WORKER_MAX,
                         &kind, &error);
    if (start == NULL ||
        !vm_wire_send(HOSTD_GUEST_API_WORKER_CONTROL_FD, "ready", g_variant_new("()"), &error))
        return 1;
    if (!vm_wire_send(HOSTD_GUEST_API_WORKER_CONTROL_FD, "call",
                      g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_CHECKPOINT_CREATE, 0,
                                    "GET", "/v1/info", "taken\x1b[2J", FALSE, "", none, 0),
                      &error))
        return 1;
    while (read(HOSTD_GUEST_API_WORKER_CONTROL_FD, &(char){0}, 1) > 0)
        ;
    return 0;
}
