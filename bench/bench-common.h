/* What the benchmarks share: loopback sockets, which abort the bench (g_error) when it cannot
 * get one, as it then has nothing to measure, and the median of its figures. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* A TCP socket listening on 127.0.0.1 at a port the kernel picks, which goes to *ret_port. */
int bench_listen_loopback(guint16 *ret_port);

/* A TCP connection to 127.0.0.1:@port, with Nagle off: the benches time small requests. */
int bench_dial_loopback(guint16 port);

/* The median of the @n (> 0) @values, which it sorts in place. */
double bench_median(double *values, guint n);

G_END_DECLS
