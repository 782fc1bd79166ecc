/* A bounded one-way byte buffer between two non-blocking endpoints, with the half-close passed
 * on: what the SSH relay (hostd-relay) and the forwarded guest ports (hostd-ssh-forward) carry
 * each connection's bytes in, one pipe per direction. Never grows: a reader that does not keep
 * up stops the writer (backpressure). */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct {
    char *data; /* size bytes */
    gsize size;
    gsize start;   /* first byte not passed on yet */
    gsize end;     /* one past the last byte taken */
    gboolean eof;  /* the source side ended: nothing more will come */
    gboolean shut; /* that end was passed on to the destination */
} HostdPipe;

/* Makes @p empty with room for @size bytes. */
void hostd_pipe_init(HostdPipe *p, gsize size);

/* Frees what hostd_pipe_init() took. */
void hostd_pipe_clear(HostdPipe *p);

/* How many bytes @p holds. */
gsize hostd_pipe_len(const HostdPipe *p);

/* How many bytes @p can take at its end, moving what it holds to the front when that makes room.
 */
gsize hostd_pipe_space(HostdPipe *p);

/* Takes what socket @fd has while there is room, without waiting; a read of 0 marks the end.
 * Sets *@progress when a byte or the end came. FALSE on a socket error. */
gboolean hostd_pipe_recv(HostdPipe *p, int fd, gboolean *progress);

/* Sends what @p holds to socket @fd while it takes it, without waiting, then its FIN
 * (shutdown(SHUT_WR): the other side may still send) once the source ended and all is sent.
 * Sets *@progress when a byte or the FIN went. FALSE on a socket error (reset, EPIPE). */
gboolean hostd_pipe_send(HostdPipe *p, int fd, gboolean *progress);

G_END_DECLS
