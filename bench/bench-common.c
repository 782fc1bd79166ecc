/* What the benchmarks share; see bench-common.h. */
#include "bench-common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>

int
bench_listen_loopback(guint16 *ret_port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, len) < 0 || listen(fd, 128) < 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) < 0)
        g_error("cannot listen on 127.0.0.1");
    *ret_port = ntohs(sin.sin_port);
    return fd;
}

int
bench_dial_loopback(guint16 port)
{
    struct sockaddr_in sin = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;

    if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
        g_error("cannot connect to 127.0.0.1:%u", port);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

double
bench_median(double *values, guint n)
{
    qsort(values, n, sizeof(double), cmp_double);
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}
