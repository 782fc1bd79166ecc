#include "hostd-modules.h"

#include "hostd-authorize.h"
#include "hostd-checkpoint.h"
#include "hostd-console.h"
#include "hostd-egress.h"
#include "hostd-fork.h"
#include "hostd-forward.h"
#include "hostd-guest-api.h"
#include "hostd-power.h"
#include "hostd-resize.h"
#include "hostd-secrets-sync.h"
#include "hostd-secrets.h"
#include "hostd-serial.h"
#include "hostd-supervise.h"

void
hostd_modules_attach(HostdContext *ctx)
{
    hostd_context_add_component(ctx, &hostd_egress_component);
    /* Grants made at `new` before the sync component puts them into the seed. */
    hostd_context_add_component(ctx, &hostd_secrets_component);
    hostd_context_add_component(ctx, &hostd_secrets_sync_component);
    hostd_context_add_component(ctx, &hostd_checkpoint_component);
    hostd_context_add_component(ctx, &hostd_fork_component);
    hostd_context_add_component(ctx, &hostd_forward_component);
    hostd_context_add_component(ctx, &hostd_power_component);
    hostd_context_add_component(ctx, &hostd_guest_api_component);
    hostd_context_add_component(ctx, &hostd_supervise_component);
    hostd_context_add_component(ctx, &hostd_authorize_component);
    hostd_context_add_component(ctx, &hostd_resize_component);
    hostd_context_add_component(ctx, &hostd_console_component);
    hostd_context_add_component(ctx, &hostd_serial_component);
}
