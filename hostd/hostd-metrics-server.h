/* The Prometheus endpoint: hostd_metrics_text() of every agent's figures (hostd_stats_collect())
 * served over HTTP by libsoup's SoupServer, on its own thread and main context, at
 * metrics-listen (hostd.conf): loopback TCP by default, or a Unix socket. Any path answers GET
 * and HEAD with the text; other methods get 405. Reading the figures changes no agent. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

typedef struct _HostdMetricsServer HostdMetricsServer;

/* Serves @ctx's figures at @listen ("HOST:PORT", or an absolute path for a Unix socket, made
 * 0660 in hostd's socket-group when it has one, else 0600; hostd_config_metrics_listen_valid()),
 * until hostd_metrics_server_stop(). Fails with VM_ERROR_INVALID_ARGUMENT for an address that
 * does not parse, VM_ERROR_IO when it cannot be listened on. */
HostdMetricsServer *hostd_metrics_server_start(HostdContext *ctx, const char *listen,
                                               GError **error);

/* The URL a client reaches it at ("http://127.0.0.1:9464/metrics"; for a Unix socket
 * "unix:PATH"). Static while the server lives. */
const char *hostd_metrics_server_url(HostdMetricsServer *server);

/* Stops serving and frees @server; NULL accepted. */
void hostd_metrics_server_stop(HostdMetricsServer *server);

G_END_DECLS
