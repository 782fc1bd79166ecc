/* Framed GVariant messages between hostd and its worker processes. */
#include "vm-wire.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vm-error.h"

static gboolean
wire_write_all(int fd, const guint8 *data, gsize len, GError **error)
{
    while (len > 0) {
        gssize n = send(fd, data, len, MSG_NOSIGNAL);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            return vm_throw(error, VM_ERROR_IO, "cannot write to the worker channel: %s",
                            g_strerror(errno));
        }
        data += n;
        len -= (gsize)n;
    }
    return TRUE;
}

/* Waits until @fd can be read or @deadline (monotonic us; -1: none) passes. */
static gboolean
wire_wait_readable(int fd, gint64 deadline, GError **error)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc;

    if (deadline < 0)
        return TRUE;
    do {
        gint64 left = deadline - g_get_monotonic_time();

        if (left <= 0)
            return vm_throw(error, VM_ERROR_TIMEOUT, "no answer on the worker channel in time");
        /* Rounded up: a poll that wakes a little early only loops. */
        rc = poll(&pfd, 1, (int)MIN((left + 999) / 1000, G_MAXINT));
    } while (rc == 0 || (rc < 0 && errno == EINTR));
    if (rc < 0)
        return vm_throw(error, VM_ERROR_IO, "cannot wait on the worker channel: %s",
                        g_strerror(errno));
    return TRUE;
}

/* Reads exactly @len bytes by @deadline (-1: none); *ret_eof when the channel ended before the
 * first one. */
static gboolean
wire_read_all(int fd, guint8 *data, gsize len, gint64 deadline, gboolean *ret_eof, GError **error)
{
    gsize done = 0;

    *ret_eof = FALSE;
    while (done < len) {
        gssize n;

        if (!wire_wait_readable(fd, deadline, error))
            return FALSE;
        n = read(fd, data + done, len - done);

        if (n < 0 && errno == EINTR)
            continue;
        /* A peer that died with bytes unread resets the channel: an end like any other. */
        if (n < 0 && errno == ECONNRESET)
            n = 0;
        if (n < 0)
            return vm_throw(error, VM_ERROR_IO, "cannot read the worker channel: %s",
                            g_strerror(errno));
        if (n == 0) {
            if (done == 0)
                *ret_eof = TRUE;
            return vm_throw(error, done == 0 ? VM_ERROR_NOT_RUNNING : VM_ERROR_PROTOCOL,
                            done == 0 ? "the worker channel closed"
                                      : "the worker channel closed inside a frame");
        }
        done += (gsize)n;
    }
    return TRUE;
}

/* A received frame is kept at this offset in its block, its size in front of it: the offset keeps
 * the bytes aligned as GVariant wants them (it would copy them otherwise). */
#define WIRE_BLOCK_HEAD 16

/* Frees a received frame's @block, wiped first. */
static void
wire_block_free(gpointer block)
{
    gsize size;

    memcpy(&size, block, sizeof(size));
    explicit_bzero(block, WIRE_BLOCK_HEAD + size);
    g_free(block);
}

gboolean
vm_wire_send(int fd, const char *kind, GVariant *payload, GError **error)
{
    g_autoptr(GVariant) message = g_variant_ref_sink(g_variant_new("(sv)", kind, payload));
    gsize size = g_variant_get_size(message);
    g_autofree guint8 *frame = g_malloc(size + 4);
    gboolean ok;

    frame[0] = (guint8)(size >> 24);
    frame[1] = (guint8)(size >> 16);
    frame[2] = (guint8)(size >> 8);
    frame[3] = (guint8)size;
    /* Copied, not stored in place: frame + 4 lacks the alignment a variant needs. */
    memcpy(frame + 4, g_variant_get_data(message), size);
    ok = wire_write_all(fd, frame, size + 4, error);
    /* Frames to a worker may carry secrets: they do not stay in freed memory, neither the frame
     * nor the message's own serialised bytes (this function's alone: made here). */
    explicit_bzero(frame, size + 4);
    explicit_bzero((gpointer)g_variant_get_data(message), size);
    return ok;
}

GVariant *
vm_wire_recv(int fd, gsize max, char **ret_kind, GError **error)
{
    return vm_wire_recv_until(fd, max, -1, ret_kind, error);
}

GVariant *
vm_wire_recv_until(int fd, gsize max, gint64 deadline, char **ret_kind, GError **error)
{
    guint8 header[4];
    gsize size;
    g_autoptr(GBytes) bytes = NULL;
    g_autoptr(GVariant) message = NULL;
    guint8 *block;
    g_autoptr(GError) local_error = NULL;
    guint8 *data;
    gboolean eof;
    const char *kind = NULL;
    GVariant *payload = NULL;

    if (!wire_read_all(fd, header, sizeof(header), deadline, &eof, error))
        return NULL;
    size = (gsize)header[0] << 24 | (gsize)header[1] << 16 | (gsize)header[2] << 8 | header[3];
    if (size > max)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "worker frame of %" G_GSIZE_FORMAT " bytes, more than %" G_GSIZE_FORMAT,
                        size, max),
               NULL;
    block = g_malloc(WIRE_BLOCK_HEAD + size);
    memcpy(block, &size, sizeof(size));
    data = block + WIRE_BLOCK_HEAD;
    if (!wire_read_all(fd, data, size, deadline, &eof, &local_error)) {
        wire_block_free(block);
        if (g_error_matches(local_error, VM_ERROR, VM_ERROR_TIMEOUT)) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return NULL;
        }
        return vm_throw(error, VM_ERROR_PROTOCOL, "worker frame cut short"), NULL;
    }
    /* What came may be a secret (the egress worker's credentials): wiped when the last variant
     * over it goes. */
    bytes = g_bytes_new_with_free_func(data, size, wire_block_free, block);
    message = g_variant_ref_sink(g_variant_new_from_bytes(G_VARIANT_TYPE("(sv)"), bytes, FALSE));
    /* Normal form is checked, not assumed: a peer's bytes in another form could read
     * differently than they were meant (GVariant's own rule for untrusted data). */
    if (!g_variant_is_normal_form(message))
        return vm_throw(error, VM_ERROR_PROTOCOL, "worker frame not in normal form"), NULL;
    g_variant_get(message, "(&sv)", &kind, &payload);
    *ret_kind = g_strdup(kind);
    return payload;
}
