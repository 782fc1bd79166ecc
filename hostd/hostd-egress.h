/* Egress for agents: the one way out of an agent's VM. See docs/EGRESS.md.
 *
 * Every agent has a proxy of its own (egress/vm-egress-proxy.h) that hostd runs while it runs,
 * listening on the Unix socket agents/<name>/egress.sock. The agent's QEMU reaches it through a
 * guestfwd on VM_EGRESS_GUEST_ADDRESS:VM_EGRESS_GUEST_PORT whose helper (vm-egress-connect) hands
 * each guest connection over to that socket; when hostd or the proxy is down the helper fails
 * and the guest's connection closes. The policy lives in agents/<name>/egress.ini (written
 * atomically; the template's at `new`, the source's on fork), the log in agents/<name>/egress.log
 * (JSON lines, one record per denied attempt and per allowed connection, rotated at
 * HOSTD_EGRESS_LOG_MAX to egress.log.1).
 *
 * Functions may be called from any request thread. None of them takes an agent's name lock:
 * those that change an agent (init, copy, stop) expect the caller to hold it, the requests (get,
 * set, log) take it themselves where they need it.
 */
#pragma once

#include "hostd-context.h"
#include "vm-domain.h"
#include "vm-egress-proxy.h"

G_BEGIN_DECLS

/* Egress as a component of the context: a new agent's policy and proxy before its first boot,
 * the proxy in its seed and domain, the proxy started with the agent and at start-up, stopped
 * when it goes, and every proxy stopped when the context goes. */
extern const HostdComponent hostd_egress_component;

#define HOSTD_AGENT_EGRESS_POLICY "egress.ini"
#define HOSTD_AGENT_EGRESS_SOCKET "egress.sock"
#define HOSTD_AGENT_EGRESS_LOG    "egress.log"

/* What the guest's http_proxy/https_proxy and apt's proxy name. */
#define HOSTD_EGRESS_GUEST_PROXY                                                                   \
    "http://" VM_EGRESS_GUEST_ADDRESS ":" G_STRINGIFY(VM_EGRESS_GUEST_PORT)

/* Limits per agent: open connections (more get 503), time for a request head, time without a
 * byte either way before a tunnel is closed, time to connect to a destination. */
#define HOSTD_EGRESS_MAX_CONNECTIONS 64
#define HOSTD_EGRESS_HANDSHAKE_MS    (10 * 1000)
#define HOSTD_EGRESS_IDLE_MS         (10 * 60 * 1000)
#define HOSTD_EGRESS_CONNECT_MS      (10 * 1000)

/* The log is rotated once it grows past this (one older file is kept). */
#define HOSTD_EGRESS_LOG_MAX (4 * 1024 * 1024)

/* The command the agent's guestfwd runs per guest connection (shell-quoted helper and socket),
 * for VmDomainSpec.egress_command; NULL where the guest forward cannot work: on a libvirt
 * connection other than hostd's embedded driver, or when its qemu.conf keeps libvirt's seccomp
 * filter (which kills QEMU when it spawns the helper). Newly allocated; can't fail. */
char *hostd_egress_command(HostdContext *ctx, const HostdAgentRecord *r);

/* The helper program (vm-egress-connect) QEMU's guest forward runs: $VM_EGRESS_CONNECT when set,
 * else the one built next to this hostd when it runs from its build tree (vm_use_build_tree()),
 * else the installed one in libexecdir. Newly allocated; can't fail. */
char *hostd_egress_helper_path(void);

/* The worker program (vm-egress-worker) each agent's proxy runs in (egress-worker = on):
 * $VM_EGRESS_WORKER when set, else the one built next to this hostd when it runs from its build
 * tree (vm_use_build_tree()), else the installed one in libexecdir. Newly allocated; can't
 * fail. */
char *hostd_egress_worker_path(void);

/* The command a guest forward runs to hand each guest connection to the Unix socket
 * @socket_path (any hostd socket that takes handed-over connections: the proxy's, the in-guest
 * API's): the shell-quoted helper and path. NULL where a guest forward cannot work, as for
 * hostd_egress_command(). Newly allocated; can't fail. */
char *hostd_egress_forward_command(HostdContext *ctx, const char *socket_path);

/* The user and group agent @name's QEMU runs as: the owner a socket for its guest forwards gets,
 * so that only its QEMU (and root) can hand connections to it. The agent's own id when it has
 * one (hostd-confine.h), else QEMU's user as libvirt's DAC driver labels its processes. FALSE
 * when neither is known (the test driver, a session connection): the socket then stays hostd's,
 * which is QEMU's user too. Can't fail. */
gboolean hostd_egress_socket_owner(HostdContext *ctx, const char *name, uid_t *ret_uid,
                                   gid_t *ret_gid);

/* At `new`: stores the template's rules (@allow/@deny as the template has them, "*" meaning
 * "any", presets expanded; NULL or empty: none), added one after the other as
 * hostd_egress_set() adds them, as @r's policy and starts its proxy. A bad rule fails with
 * VM_ERROR_INVALID_ARGUMENT naming it, an unknown preset with VM_ERROR_NOT_FOUND; a proxy that
 * cannot start fails (VM_ERROR_IO, VM_ERROR_INVALID_ARGUMENT for a socket path too long). Nothing
 * is left running on failure. */
gboolean hostd_egress_agent_init(HostdContext *ctx, const HostdAgentRecord *r,
                                 const char *const *allow, const char *const *deny, GError **error);

/* Makes sure @r's proxy runs with its stored policy (no policy file: none): starts it when it
 * does not run, restarts it when its socket is gone. For start-up, start and fork. Fails like
 * hostd_egress_agent_init(), or with VM_ERROR_INVALID_ARGUMENT when the stored policy is bad. */
gboolean hostd_egress_agent_start(HostdContext *ctx, const HostdAgentRecord *r, GError **error);

/* Stops @name's proxy (open tunnels are closed) and forgets it; for rm and a rolled-back new or
 * fork. Returns once its threads are gone. Unknown @name: no-op; can't fail. */
void hostd_egress_agent_stop(HostdContext *ctx, const char *name);

/* For fork: gives agent @dst (its directory exists) the policy of agent @src, and applies it to
 * @dst's proxy if that runs already (else hostd_egress_agent_start() picks it up). Fails with
 * VM_ERROR_NOT_FOUND for an unknown @src, VM_ERROR_IO when the policy cannot be written. */
gboolean hostd_egress_copy_policy(HostdContext *ctx, const char *src, const char *dst,
                                  GError **error);

/* The agent's egress state (a{sv}): allow as, deny as (normalised rules; allow ["none"] when
 * nothing is allowed), connections u (open now), proxy s (what the guest's http_proxy names),
 * wired b (whether the agent's VM has the guest forward to its proxy). Fails with
 * VM_ERROR_NOT_FOUND or VM_ERROR_INVALID_ARGUMENT for a bad name. */
GVariant *hostd_egress_get(HostdContext *ctx, const char *name, GError **error);

/* Changes the policy live: with @reset every rule goes first; then @allow and @deny rules are
 * added ("none" in @allow empties the allow list, "any" replaces it), then @remove rules are
 * taken out of both lists. A preset ("@name", hostd-egress-presets.h) in any of the three stands
 * for its rules; an unknown one fails with VM_ERROR_NOT_FOUND. The result is checked as a whole: a
 * bad rule fails with VM_ERROR_INVALID_ARGUMENT naming it, a rule to remove that is in neither list
 * with VM_ERROR_NOT_FOUND, and the old policy stays. Otherwise it is stored, new connections follow
 * it at once and open tunnels it refuses close within a second. Returns hostd_egress_get()'s
 * dictionary. */
GVariant *hostd_egress_set(HostdContext *ctx, const char *name, const char *const *allow,
                           const char *const *deny, const char *const *remove, gboolean reset,
                           GError **error);

/* The egress presets (hostd_egress_presets_to_variant()): for `vmctl egress presets`. Can't
 * fail. */
GVariant *hostd_egress_presets(HostdContext *ctx);

/* Sends the agent's log on @client_fd as STDOUT frames of whole JSON lines: the last @lines
 * records (G_MAXUINT32: all that are kept), then with @follow new records as they come, until the
 * client closes its end or the agent is removed. Ends with EXIT {status 0}. Fails with
 * VM_ERROR_NOT_FOUND or VM_ERROR_INVALID_ARGUMENT before anything was sent. */
gboolean hostd_egress_log(HostdContext *ctx, const char *name, gboolean follow, guint lines,
                          int client_fd, GError **error);

/* How many connections of @name's guest its proxy serves now (0 when none runs): for the idle
 * loop, to which an agent with an open connection out is not idle. Can't fail. */
guint hostd_egress_open_connections(HostdContext *ctx, const char *name);

/* @name's traffic through its proxy since the proxy started: open connections, and the bytes of
 * the requests that ended, guest to destination (@ret_up) and back (@ret_down). FALSE (all 0)
 * when no proxy of @name runs. Can't fail. */
gboolean hostd_egress_traffic(HostdContext *ctx, const char *name, guint *ret_connections,
                              guint64 *ret_up, guint64 *ret_down);

/* Stops every proxy of @ctx (agents' VMs keep running; their guests lose their way out until the
 * next hostd starts the proxies again). For hostd's exit; can't fail. */
void hostd_egress_stop_all(HostdContext *ctx);

/* The credential broker's side of egress (docs/SECRETS.md): gives @name's proxy the grants
 * @creds (a reference is taken; NULL: none), live, and keeps them for the proxy's restarts while
 * this hostd runs (the secrets component sets them again at each start-up). Fails with
 * VM_ERROR_NOT_FOUND for an unknown agent. */
gboolean hostd_egress_set_credentials(HostdContext *ctx, const char *name,
                                      VmEgressCredentials *creds, GError **error);

/* A new reference to the credentials hostd_egress_set_credentials() last gave @name (what its
 * proxy honours now and after a restart), or NULL for none. Can't fail. */
VmEgressCredentials *hostd_egress_dup_credentials(HostdContext *ctx, const char *name);

/* Opens @hosts (a grant's host patterns, exact names or "*.suffix", normalised as egress rules
 * are; NULL or empty: none) on port 443 for @name's proxy, live and across its restarts while
 * this hostd runs, on top of the user's rules. The stored policy (egress.ini, and what
 * hostd_egress_get() and `vmctl egress` show) stays the user's own, so setting fewer hosts
 * closes the others again; the user's deny rules still win. Fails with VM_ERROR_NOT_FOUND for
 * an unknown agent. */
gboolean hostd_egress_set_grant_hosts(HostdContext *ctx, const char *name, const char *const *hosts,
                                      GError **error);

/* A new reference to the policy @name's proxy enforces now (the user's rules and its grants'
 * hosts), or NULL when no proxy runs. Can't fail. */
VmEgressPolicy *hostd_egress_dup_effective_policy(HostdContext *ctx, const char *name);

/* The PEM certificate of @name's own CA, the one its proxy signs intercepted hosts' certificates
 * with: generated on first use (vm_egress_ca_generate()) and stored as $STATE/egress-ca/NAME.crt
 * and NAME.key (the directory 0700, the key 0600, each written atomically), never under the
 * agent's own directory; the key is never handed out or logged. Every proxy starts with its
 * agent's CA; a new agent or fork gets a new one, and `rm` removes it. For the guest's trust
 * store. Fails with VM_ERROR_NOT_FOUND for an unknown agent, VM_ERROR_IO when the CA cannot be
 * made or stored. */
char *hostd_egress_ca_certificate(HostdContext *ctx, const char *name, GError **error);

/* The process id of @name's egress worker now; 0 when its proxy runs inside hostd
 * (egress-worker = off), when none runs, or between a worker's death and its restart. Can't
 * fail. */
GPid hostd_egress_worker_pid(HostdContext *ctx, const char *name);

/* For tests: proxies started from now on resolve names with @resolve (NULL: getaddrinfo()). */
void hostd_egress_set_resolver(HostdContext *ctx, VmEgressResolveFunc resolve,
                               gpointer resolve_data);

/* For tests: workers started from now on owe each answer within @answer_ms and are asked
 * whether they answer every @ping_ms (0: the defaults, hostd-egress-worker.h). Can't fail. */
void hostd_egress_set_worker_deadlines(HostdContext *ctx, guint answer_ms, guint ping_ms);

G_END_DECLS
