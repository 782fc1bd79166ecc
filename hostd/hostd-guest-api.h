/* The in-guest API: from inside its VM an agent reads its own info, checkpoints itself, lists its
 * checkpoints, asks for a restore of itself, holds itself awake and reads its egress policy,
 * over HTTP at VM_GUEST_API_ADDRESS:VM_GUEST_API_PORT. See docs/GUEST-API.md.
 *
 * The agent's QEMU reaches it as it reaches the egress proxy: a guest forward whose helper
 * (vm-egress-connect) hands each guest connection to the Unix socket agents/<name>/api.sock,
 * which hostd listens on while the agent exists. Which agent calls is known by the socket the
 * connection arrived on, and only by that: no request names an agent, so none can reach
 * another, change its own policy, or see a path of the host (error messages have hostd's
 * directories taken out).
 *
 * hostd parses no byte of it: each agent's socket is served by a worker process of its own
 * (vm-guest-api-worker, confined as the egress worker is: hostd-guest-api-worker.h), which runs
 * libsoup's HTTP and json-glib on what the guest sent and hands hostd one typed, bounded call per
 * request (hostd_guest_api_call_from_variant() checks it again); hostd answers with the status
 * and the JSON it composed. The worker bounds the connections: HOSTD_GUEST_API_CONNECTIONS at
 * once, HOSTD_GUEST_API_REQUEST_MS to send a whole request, one request per connection, a
 * request body of 16 KiB (libsoup's own limit on the head, 64 KiB). hostd keeps the rest, per
 * agent, so a worker taken over cannot go past them: guest-api-rate requests a second on
 * average with bursts of guest-api-burst (429 past that), one checkpoint or restore at a time
 * at HOSTD_GUEST_API_HEAVY_RATE, and a checkpoint (a restore's undo checkpoint too) only
 * within the agent's quota, hostd_checkpoint_guest_quota() (guest-checkpoint-max checkpoints,
 * guest-checkpoint-bytes; of them HOSTD_GUEST_API_MEMORY_CHECKPOINTS_MAX with memory); the work of
 * a request (libvirt, checkpoints) runs on a pool of threads, and a restore on a thread of its own
 * once its 202 has gone out. Each call is one line of hostd's log (ctx->log); a checkpoint,
 * restore or keep-awake is an event by the guest as well.
 *
 * Functions may be called from any thread. */
#pragma once

#include "hostd-context.h"
#include "hostd-guest-api-rules.h"

G_BEGIN_DECLS

/* The API as a component of the context: the forward in a new agent's domain and vmctl-guest in
 * its seed, the socket from `new` (before the VM boots) until `rm`, again at start and at
 * hostd's start-up, and everything stopped when the context goes. Nothing with guest-api = off. */
extern const HostdComponent hostd_guest_api_component;

#define HOSTD_AGENT_API_SOCKET "api.sock"

/* Checkpoints and restores asked from inside: one at a time, at most this many a second on
 * average, in bursts of HOSTD_GUEST_API_HEAVY_BURST. */
#define HOSTD_GUEST_API_HEAVY_RATE  0.1
#define HOSTD_GUEST_API_HEAVY_BURST 3
/* A memory checkpoint asked from inside is refused (no-resources) once the agent has this many:
 * each holds the RAM the guest used. */
#define HOSTD_GUEST_API_MEMORY_CHECKPOINTS_MAX 4
/* Between a restore's 202 and the restore itself: the answer reaches the guest first. */
#define HOSTD_GUEST_API_RESTORE_DELAY_MS 1000

/* The command the agent's guest forward to the API runs (the egress helper and @r's api.sock,
 * shell-quoted), for VmDomainSpec.guest_api_command; NULL with guest-api = off or where no guest
 * forward can work (hostd_egress_forward_command()). Newly allocated; can't fail. */
char *hostd_guest_api_command(HostdContext *ctx, const HostdAgentRecord *r);

/* Makes sure @r's API listens on its api.sock: starts it, or restarts it when its socket is gone
 * (the socket goes to QEMU's user, mode 0600). Nothing to do with guest-api = off, or once
 * hostd_guest_api_stop() ran. Fails with VM_ERROR_IO (VM_ERROR_INVALID_ARGUMENT for a path too
 * long for a socket) and leaves nothing behind. */
gboolean hostd_guest_api_agent_start(HostdContext *ctx, const HostdAgentRecord *r, GError **error);

/* Stops serving @name: its worker is killed (its open connections close), its socket removed;
 * a restore it asked for goes on. Unknown @name: no-op; can't fail. */
void hostd_guest_api_agent_stop(HostdContext *ctx, const char *name);

/* The pid of @name's worker, 0 when it has none running. Can't fail. */
GPid hostd_guest_api_pid(HostdContext *ctx, const char *name);

/* Where hostd runs the worker from (vm_program_path(): VM_GUEST_API_WORKER, the build tree's,
 * or libexecdir's). Newly allocated; can't fail. */
char *hostd_guest_api_worker_path(void);

/* Stops the API for every agent and waits for the work in flight (requests, restores) to end.
 * For hostd's exit (before the agents are saved) and the context's detach; can't fail. */
void hostd_guest_api_stop(HostdContext *ctx);

G_END_DECLS
