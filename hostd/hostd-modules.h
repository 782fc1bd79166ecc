/* The one place that knows every component of hostd: attaches them to a context in the order
 * their hooks must run. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Adds egress, checkpoints, forks, forwarded ports, power, the in-guest API, the supervisor and
 * the users' keys to @ctx, in that order (egress first: a new agent's proxy must exist before
 * anything boots; forwarded ports before power: power's idle loop, which asks about their
 * connections, stops first; power after the others: a port is relayed once all else is ready;
 * the in-guest API after those it calls; the users' keys last, applied once an agent is up with
 * all else; the supervisor, being stopped in reverse order, among the first to stop). Call once,
 * right after hostd_context_new(). Can't fail. */
void hostd_modules_attach(HostdContext *ctx);

G_END_DECLS
