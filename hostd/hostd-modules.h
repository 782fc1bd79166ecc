/* The one place that knows every component of hostd: attaches them to a context in the order
 * their hooks must run. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Adds egress, checkpoints, forks, power, the in-guest API and the supervisor to @ctx, in that
 * order (egress first: a new agent's proxy must exist before anything boots; power after the
 * others: a port is relayed once all else is ready; the in-guest API after those it calls; the
 * supervisor last, so it is the first to stop). Call once, right after hostd_context_new().
 * Can't fail. */
void hostd_modules_attach(HostdContext *ctx);

G_END_DECLS
