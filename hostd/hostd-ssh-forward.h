/* Guest ports served on the host (vmctl forward): hostd listens on 127.0.0.1:HOST_PORT and
 * carries each connection it accepts to GUEST_PORT on the guest's loopback through an SSH
 * direct-tcpip channel, over one session per agent that hostd holds (the host key pinned, as for
 * exec). QEMU's network stays as it is: the guest's sshd makes the connection inside the guest.
 * As with the SSH relay (hostd-relay.h), hostd accepts each connection itself, so it can wake a
 * paused or saved agent before a byte reaches the guest; the client only notices a delay. Part
 * of the ssh module (it shares hostd-ssh-private.h with hostd-ssh.c).
 *
 * All functions may be called from any thread but the callbacks', except
 * hostd_ssh_forward_free(), which waits for running callbacks and so must not be called from
 * one. */
#pragma once

#include <glib.h>

#include "hostd-ssh.h"

G_BEGIN_DECLS

/* Open connections (waking or carried) one agent may hold over all its ports; further ones are
 * closed on accept. */
#define HOSTD_SSH_FORWARD_MAX_CONNECTIONS 64

/* Bytes buffered per connection and direction on hostd's side; a full buffer stops reading
 * from that side until the other has taken some (back-pressure). libssh keeps at most one
 * channel window more per connection (about 1.2 MiB): it widens the window only as hostd
 * reads. */
#define HOSTD_SSH_FORWARD_BUFFER_SIZE (64 * 1024)

/* Called in a worker thread for each new connection to a port of @agent, before anything of it
 * reaches the guest: blocks until the agent can take connections (woken as needed), then fills
 * @ret_target with the agent's SSH target, adding the strings it points at to @keep (freed with
 * g_free once the target is copied). Returns FALSE with @error set to refuse the connection: it
 * is closed and the guest never sees it. Runs concurrently for several connections (also of
 * the same agent), so it must be thread-safe. */
typedef gboolean (*HostdSshForwardWakeFunc)(const char *agent, gpointer user_data,
                                            HostdSshTarget *ret_target, GPtrArray *keep,
                                            GError **error);

/* Called once for each connection that could not be carried, with a line saying why (the wake
 * refused it, no SSH session could be made, nothing listens on the port in the guest), and once
 * when the session died under open connections (@guest_port 0: all of @agent's), from a worker
 * thread or the thread that carries @agent's connections. */
typedef void (*HostdSshForwardLogFunc)(const char *agent, guint guest_port, const char *message,
                                       gpointer user_data);

typedef struct _HostdSshForward HostdSshForward;

/* Creates a forwarder that serves no port yet and starts its accept thread. Sessions come from
 * and go back to @pool, which must outlive it, as must @user_data; @log may be NULL. Free with
 * hostd_ssh_forward_free(). Can't fail (aborts like g_thread_new() when no thread can be
 * made). */
HostdSshForward *hostd_ssh_forward_new(HostdSshPool *pool, HostdSshForwardWakeFunc wake,
                                       HostdSshForwardLogFunc log, gpointer user_data);

/* Starts serving @guest_port of @agent on 127.0.0.1:@host_port: binds and listens now. Fails
 * with VM_ERROR_EXISTS when that guest port of @agent is served already, VM_ERROR_NO_RESOURCES
 * when @host_port is taken, VM_ERROR_IO for any other socket failure (a port below 1024 without
 * the privilege to bind it); nothing is left bound on failure. Ports are 1-65535. */
gboolean hostd_ssh_forward_add(HostdSshForward *f, const char *agent, guint guest_port,
                               guint host_port, GError **error);

/* Stops serving @guest_port of @agent: its listener is closed before this returns, so the host
 * port can be bound again at once, and its open connections are closed right after (by the
 * thread that carries them; one still being woken when its wake returns). Unknown: no-op. */
void hostd_ssh_forward_remove(HostdSshForward *f, const char *agent, guint guest_port);

/* Called once when a connection given to hostd_ssh_forward_carry() has ended: @why is NULL when
 * it was carried, else the line the log got for it. */
typedef void (*HostdSshForwardDoneFunc)(const char *why, gpointer data);

/* Carries @fd, a connected socket that is now the forwarder's, to @guest_port of @agent as a
 * connection accepted on a served port would be (the wake included), without a listener of the
 * forwarder's own: the SSH worker's side of a port whose listener is hostd's. @done (may be
 * NULL) is called with @done_data once it ended. Fails with VM_ERROR_NO_RESOURCES when @agent
 * holds HOSTD_SSH_FORWARD_MAX_CONNECTIONS already: then @fd is closed and @done not called. */
gboolean hostd_ssh_forward_carry(HostdSshForward *f, const char *agent, guint guest_port, int fd,
                                 HostdSshForwardDoneFunc done, gpointer done_data, GError **error);

/* hostd_ssh_forward_remove() of every port of @agent, and its SSH session goes too. Unknown
 * @agent: no-op. Can't fail. */
void hostd_ssh_forward_remove_agent(HostdSshForward *f, const char *agent);

/* Whether @guest_port of @agent is served; *@ret_connections (may be NULL) gets the number of
 * its open connections (0 when not served). Can't fail. */
gboolean hostd_ssh_forward_lookup(HostdSshForward *f, const char *agent, guint guest_port,
                                  guint *ret_connections);

/* The number of open connections to any port of @agent: accepted and being woken, or carried.
 * 0 for an unknown agent. Can't fail. */
guint hostd_ssh_forward_open_connections(HostdSshForward *f, const char *agent);

/* g_get_monotonic_time() of the last activity on @agent's ports: a byte carried either way, a
 * connection opened or closed; 0 before any. Can't fail. */
gint64 hostd_ssh_forward_last_activity(HostdSshForward *f, const char *agent);

/* Closes every listener and connection, gives the sessions back, stops the threads and frees
 * @f; waits for wake callbacks still running (it cannot interrupt them). NULL is a no-op. */
void hostd_ssh_forward_free(HostdSshForward *f);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshForward, hostd_ssh_forward_free)

G_END_DECLS
