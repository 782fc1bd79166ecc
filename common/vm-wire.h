/* Framed messages between hostd and the worker processes it starts (the egress worker's,
 * vm-egress-wire.h; the SSH worker's, hostd-ssh-wire.h): each message is one frame, a 4-byte
 * big-endian length and then that many bytes of a serialised GVariant of type (sv), a kind and
 * its payload. The reader bounds the frame and takes only normal form; checking the payload's
 * type against its kind is the caller's. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Sends one frame: @kind and @payload (floating references are sunk). Blocking, whole or not at
 * all as far as the caller can tell; callers serialise their writes to one fd. The frame's
 * bytes are wiped from memory after the write (they may carry secrets). Fails with VM_ERROR_IO
 * when the peer is gone. */
gboolean vm_wire_send(int fd, const char *kind, GVariant *payload, GError **error);

/* Reads one frame of at most @max bytes (blocking) and returns its payload in normal form, the
 * kind in @ret_kind. Reads no byte past the frame. Fails with VM_ERROR_NOT_RUNNING at end of
 * file before a frame begins, VM_ERROR_PROTOCOL for a frame that is too long, cut short or not
 * a (sv) message, VM_ERROR_IO for a read error (a receive timeout included). */
GVariant *vm_wire_recv(int fd, gsize max, char **ret_kind, GError **error);

/* The same, with @deadline (g_get_monotonic_time(); -1: none) for the whole frame, however its
 * bytes come: fails with VM_ERROR_TIMEOUT once it passes before the frame is complete (what was
 * read of it is lost: the channel is then of no further use). SO_RCVTIMEO bounds one read, not
 * a frame, and not a poll(): a worker that is stopped or dribbles is caught only by this. */
GVariant *vm_wire_recv_until(int fd, gsize max, gint64 deadline, char **ret_kind, GError **error);

G_END_DECLS
