/* hostd's local API: a Unix stream socket, one thread per connection, one request per
 * connection (see docs/PROTOCOL.md). */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

typedef struct HostdServer HostdServer;

/* Binds and listens on @socket_path with mode 0600 (0660 and group @group when set). A stale
 * socket file nobody answers on is replaced; a live one fails with VM_ERROR_BUSY. Connections
 * are served from a thread started here. Fails with VM_ERROR_IO. */
HostdServer *hostd_server_start(HostdContext *ctx, const char *socket_path, const char *group,
                                GError **error);

/* Stops accepting and removes the socket file; requests in flight finish on their own threads.
 * Accepts NULL. */
void hostd_server_stop(HostdServer *server);

/* TRUE when no client is being served and at least one ended since the call that set *@seen
 * (0 at first), which this call updates: hostd has just gone quiet after some work. Can't fail. */
gboolean hostd_server_quiet_after_work(guint64 *seen);

/* Serves one already-accepted connection until its request is answered (used by the accept
 * thread and by tests through a socketpair), then, for a request that changes something, appends
 * its event to ctx->events with the caller's uid (SO_PEERCRED), which hostd's log line for a
 * failed request names too. Takes ownership of @fd. Never fails: every failure becomes an ERROR
 * frame or, when the client is gone, nothing. */
void hostd_server_serve_fd(HostdContext *ctx, int fd);

G_END_DECLS
