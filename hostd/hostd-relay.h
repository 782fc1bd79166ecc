/* The wake-on-connect TCP relay: hostd owns each agent's public SSH port on 127.0.0.1 and relays
 * every connection to a backend port that QEMU forwards into the guest. Because hostd accepts
 * the connection itself, it can wake a paused or saved agent before the first byte reaches the
 * guest; the client only notices a delay. See docs/IDLE.md.
 *
 * All functions may be called from any thread, the wake callback included, except
 * hostd_relay_free(), which waits for running wake callbacks and so must not be called from one. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* How long the relay keeps retrying the backend connect after a successful wake, by default:
 * a restored QEMU may take a moment to listen again. */
#define HOSTD_RELAY_BACKEND_TIMEOUT_MS 5000

/* Open connections (waking or relaying) one agent may hold; further ones are closed on accept. */
#define HOSTD_RELAY_MAX_CONNECTIONS 64

/* Bytes buffered per connection and direction; a full buffer stops reading from that side
 * until the other side has taken some (back-pressure), so memory stays bounded. */
#define HOSTD_RELAY_BUFFER_SIZE (64 * 1024)

/* Called in a relay worker thread for each new connection to @agent, BEFORE the relay connects
 * to the backend. It blocks until the agent can take connections (resumed, restored, booted)
 * and returns TRUE, or returns FALSE with @error set: the client connection is then closed and
 * the backend never sees it. Runs concurrently for different connections (also of the same
 * agent), so it must be thread-safe and should coalesce concurrent wakes itself. The relay
 * drops @error after the call: log it in the callback if it matters. */
typedef gboolean (*HostdRelayWakeFunc)(const char *agent, gpointer user_data, GError **error);

typedef struct _HostdRelay HostdRelay;

/* Creates a relay with no agents and starts its I/O thread. @wake may be NULL (connections go
 * straight to the backend); @user_data is passed to it and must outlive the relay. Free with
 * hostd_relay_free(). Can't fail (aborts like g_thread_new() when no thread can be made). */
HostdRelay *hostd_relay_new(HostdRelayWakeFunc wake, gpointer user_data);

/* Sets how long, after a successful wake, the relay retries connecting to a backend that
 * refuses (default HOSTD_RELAY_BACKEND_TIMEOUT_MS); affects connections accepted afterwards.
 * After that the client connection is closed. Can't fail. */
void hostd_relay_set_backend_timeout(HostdRelay *r, guint timeout_ms);

/* Starts serving @agent: binds and listens on 127.0.0.1:@public_port now, and from then on
 * relays each accepted connection to 127.0.0.1:@backend_port (after the wake callback) until
 * hostd_relay_remove(). Fails with VM_ERROR_NO_RESOURCES when the port is taken,
 * VM_ERROR_EXISTS when @agent is already served, VM_ERROR_IO for any other socket failure;
 * nothing is left bound on failure. Ports are 1-65535. */
gboolean hostd_relay_add(HostdRelay *r, const char *agent, guint public_port, guint backend_port,
                         GError **error);

/* Starts serving @agent on @listen_fd, a socket already listening (taken over, closed on
 * failure too): the port a caller chose and held from then on, with no moment when another
 * process could bind it (hostd_allocate_port()). Otherwise as hostd_relay_add(). */
gboolean hostd_relay_add_listener(HostdRelay *r, const char *agent, int listen_fd,
                                  guint backend_port, GError **error);

/* Relays @agent's connections accepted from now on to @backend_port (its QEMU's forward moved).
 * FALSE when @agent is not served. */
gboolean hostd_relay_set_backend(HostdRelay *r, const char *agent, guint backend_port);

/* Stops serving @agent: closes its listener and every connection of it (waking or relaying)
 * before returning, so the public port can be bound again at once. A wake still running for
 * it finishes in the background and its result is dropped. Unknown @agent: no-op. */
void hostd_relay_remove(HostdRelay *r, const char *agent);

/* The number of client connections of @agent that are open: accepted and waiting for the wake
 * or the backend, or relaying. 0 for an unknown agent. Can't fail. */
guint hostd_relay_open_connections(HostdRelay *r, const char *agent);

/* g_get_monotonic_time() of the last activity of @agent: a byte relayed either way, or a
 * connection opened or closed; the time of hostd_relay_add() before any. 0 for an unknown
 * agent. Can't fail. */
gint64 hostd_relay_last_activity(HostdRelay *r, const char *agent);

/* Binds and listens on 127.0.0.1:@port as a relay's listeners do (SO_REUSEADDR, so a port is
 * taken back at once after a restart); *@ret_fd gets the listener (non-blocking, close-on-exec).
 * Fails with VM_ERROR_NO_RESOURCES when the port is taken, VM_ERROR_IO otherwise. */
gboolean hostd_relay_listen(guint port, int *ret_fd, GError **error);

/* Removes every agent, stops the I/O thread and frees @r; waits for wake callbacks still
 * running (it cannot interrupt them). NULL is a no-op. */
void hostd_relay_free(HostdRelay *r);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdRelay, hostd_relay_free)

G_END_DECLS
