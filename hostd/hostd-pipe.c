#include "hostd-pipe.h"

#include <errno.h>
#include <sys/socket.h>

void
hostd_pipe_init(HostdPipe *p, gsize size)
{
    p->data = g_malloc(size);
    p->size = size;
    p->start = p->end = 0;
    p->eof = p->shut = FALSE;
}

void
hostd_pipe_clear(HostdPipe *p)
{
    g_clear_pointer(&p->data, g_free);
    p->size = p->start = p->end = 0;
}

gsize
hostd_pipe_len(const HostdPipe *p)
{
    return p->end - p->start;
}

gsize
hostd_pipe_space(HostdPipe *p)
{
    if (p->start == p->end)
        p->start = p->end = 0;
    if (p->end == p->size && p->start > 0) {
        memmove(p->data, p->data + p->start, p->end - p->start);
        p->end -= p->start;
        p->start = 0;
    }
    return p->size - p->end;
}

gboolean
hostd_pipe_recv(HostdPipe *p, int fd, gboolean *progress)
{
    while (!p->eof) {
        gsize space = hostd_pipe_space(p);
        ssize_t n;

        if (space == 0)
            return TRUE;
        n = recv(fd, p->data + p->end, space, MSG_DONTWAIT);
        if (n > 0) {
            p->end += n;
            *progress = TRUE;
            if ((gsize)n < space)
                return TRUE; /* drained for now: don't pay an EAGAIN round */
        } else if (n == 0) {
            p->eof = TRUE;
            *progress = TRUE;
        } else if (errno != EINTR) {
            return errno == EAGAIN || errno == EWOULDBLOCK;
        }
    }
    return TRUE;
}

gboolean
hostd_pipe_send(HostdPipe *p, int fd, gboolean *progress)
{
    while (hostd_pipe_len(p) > 0) {
        ssize_t n = send(fd, p->data + p->start, hostd_pipe_len(p), MSG_DONTWAIT | MSG_NOSIGNAL);

        if (n > 0) {
            p->start += n;
            *progress = TRUE;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return TRUE;
        } else {
            return FALSE;
        }
    }
    if (p->eof && !p->shut) {
        if (shutdown(fd, SHUT_WR) < 0 && errno != ENOTCONN)
            return FALSE;
        p->shut = TRUE;
        *progress = TRUE;
    }
    return TRUE;
}
