/* The messages between hostd and an agent's in-guest API worker (vm-guest-api-worker):
 * docs/GUEST-API.md.
 *
 * hostd starts one worker per agent with a socketpair as its fd
 * HOSTD_GUEST_API_WORKER_CONTROL_FD and the agent's listening api.sock as
 * HOSTD_GUEST_API_WORKER_LISTEN_FD. Each message is one frame of vm-wire.h. The worker takes the
 * guest's connections, parses their HTTP (libsoup) and JSON (json-glib), and hands hostd one
 * typed call per request; hostd, which does not trust it, reads its frames with a small bound,
 * takes only the kinds below with the exact payload type, checks each call
 * (hostd_guest_api_call_from_variant()), keeps the agent's rate itself, runs the call and answers
 * with the status and the body it composed.
 *
 * hostd to worker:
 *   "start"   a{sv}: change-user b, uid u, gid u
 *   "answer"  (uuus): serial, HTTP status (0: the worker's own refusal of that call), the
 *             Retry-After seconds (0: none), the JSON body
 *   "ping"    u: a serial, asked of a worker silent for a while
 * worker to hostd:
 *   "ready"   (): serving
 *   "failed"  s: could not start (then it exits)
 *   "call"    HOSTD_GUEST_API_CALL_TYPE: one whole request
 *   "refused" u: a HostdGuestApiRefusal, for hostd's log (nothing reached hostd otherwise)
 *   "pong"    u: the serial of the ping it answers
 */
#pragma once

#include <glib.h>

#include "hostd-guest-api-rules.h"
#include "vm-wire.h"

G_BEGIN_DECLS

#define HOSTD_GUEST_API_WORKER_CONTROL_FD 3
#define HOSTD_GUEST_API_WORKER_LISTEN_FD  4

/* Bounds on one frame's payload: hostd's answers carry a checkpoint list; the worker's calls
 * at most HOSTD_GUEST_API_PATHS_MAX paths. */
#define HOSTD_GUEST_API_WIRE_TO_WORKER_MAX   (8 * 1024 * 1024)
#define HOSTD_GUEST_API_WIRE_FROM_WORKER_MAX (128 * 1024)
/* The longest answer body hostd sends; a longer one is answered 500. */
#define HOSTD_GUEST_API_WIRE_ANSWER_MAX (4 * 1024 * 1024)

/* What the worker refused without a call, each one line of hostd's log. */
typedef enum {
    HOSTD_GUEST_API_REFUSED_OPEN = 1,    /* a connection closed: too many open */
    HOSTD_GUEST_API_REFUSED_HANDING,     /* a connection closed: too many handing over */
    HOSTD_GUEST_API_REFUSED_NOTHING,     /* a helper's connection handed nothing over */
    HOSTD_GUEST_API_REFUSED_SLOW,        /* a connection cut: no whole request in time */
    HOSTD_GUEST_API_REFUSED_CONNECTIONS, /* a request answered 503: too many connections */
    HOSTD_GUEST_API_REFUSED_BODY_CUT,    /* a connection cut: a body announced past 1 MiB */
    HOSTD_GUEST_API_REFUSED_LAST = HOSTD_GUEST_API_REFUSED_BODY_CUT,
} HostdGuestApiRefusal;

G_END_DECLS
