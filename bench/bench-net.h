/* Loopback sockets of the benchmarks. A bench that cannot get one has nothing to measure, so
 * these abort it (g_error) instead of returning an error. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* A TCP socket listening on 127.0.0.1 at a port the kernel picks, which goes to *ret_port. */
int bench_listen_loopback(guint16 *ret_port);

/* A TCP connection to 127.0.0.1:@port, with Nagle off: the benches time small requests. */
int bench_dial_loopback(guint16 port);

G_END_DECLS
