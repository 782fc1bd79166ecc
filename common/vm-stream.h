/* Replies: the frames hostd sends after a request, written with a VmStreamWriter and read with
 * a VmStreamReader. Every reply has one of two shapes (vm_op_reply_end() says which):
 *
 *   PROGRESS*, then RESULT or ERROR                        most requests
 *     (a RESULT too big for a frame goes as RESULT_PART* then an empty RESULT; the reader
 *     joins them and returns one RESULT)
 *   (PROGRESS | STDOUT | STDERR)*, then EXIT or ERROR      EXEC, EGRESS_LOG, EVENTS
 *
 * RESULT, EXIT and ERROR end the reply; nothing follows them. ELSEWHERE (since protocol 11)
 * ends any reply instead of them: the request is for another host of the fleet, whose id and
 * address it carries, and the client may send it there once (docs/CLUSTER.md). The frames are the
 * ones vm-protocol.h defines; these types hold no buffer, so a writer and plain
 * vm_message_write_fd() calls may share a socket. Neither type owns its fd, and neither is
 * thread-safe: one thread writes a reply, one reads it.
 */
#pragma once

#include "vm-protocol.h"

G_BEGIN_DECLS

typedef struct {
    int fd;
    gboolean ended; /* an end frame (RESULT, EXIT, ERROR) went out, or was tried */
} VmStreamWriter;

/* A writer for the reply on @fd, to initialise a VmStreamWriter with. */
#define VM_STREAM_WRITER_INIT(fd_) ((VmStreamWriter){.fd = (fd_), .ended = FALSE})

/* Every writer below fails with VM_ERROR_CANCELLED ("the client went away: ...") when the
 * frame cannot be written, which is how a reader that is gone looks, and with
 * VM_ERROR_PROTOCOL, writing nothing, when the message does not fit in a frame. Writing after
 * the end of the reply is a programming error. */

/* Writes a PROGRESS frame: @message (cut to 16 KiB of valid UTF-8) and @fraction in [0,1], or
 * < 0 when unknown. */
gboolean vm_stream_writer_progress(VmStreamWriter *writer, const char *message, double fraction,
                                   GError **error);

/* A VmProgressFunc that writes PROGRESS frames to the VmStreamWriter @user_data. A reader that
 * is gone only misses the progress, so failures are dropped. */
void vm_stream_writer_progress_func(const char *message, double fraction, gpointer user_data);

/* Writes @len bytes of @data as STDOUT or STDERR (@op) frames of at most VM_STREAM_CHUNK_MAX
 * bytes each. Where the bytes need more than one frame, each frame ends after the last newline
 * that fits, so that a reader of lines never gets half a line in a frame that could have held
 * it whole. @len == 0 writes nothing. On failure an unknown number of frames went out. */
gboolean vm_stream_writer_data(VmStreamWriter *writer, VmOp op, const void *data, gsize len,
                               GError **error);

/* Ends the reply with EXIT {status @status}. */
gboolean vm_stream_writer_exit(VmStreamWriter *writer, gint32 status, GError **error);

/* Ends the reply with RESULT @fields (an a{sv}, floating refs sunk, NULL for none; always
 * consumed). Fields that do not fit in a frame go in RESULT_PART frames of at most
 * VM_RESULT_PART_MAX bytes; over VM_RESULT_MAX it fails with VM_ERROR_PROTOCOL and leaves the
 * reply open, so that the caller can still end it with an ERROR. */
gboolean vm_stream_writer_result(VmStreamWriter *writer, GVariant *fields, GError **error);

/* Ends the reply with ERROR, carrying @failure's code (VM_ERROR_FAILED outside VM_ERROR) and
 * its message (cut to 16 KiB of valid UTF-8). */
gboolean vm_stream_writer_error(VmStreamWriter *writer, const GError *failure, GError **error);

/* Where an ELSEWHERE sends the client: the host's id and its address (`ssh://...`). */
typedef struct {
    char host[VM_HOST_ID_MAX + 1];
    char address[VM_ADDRESS_MAX + 1];
} VmElsewhere;

/* Ends the reply with ELSEWHERE: the request is for host @host, reached at @address; @message
 * (cut to 16 KiB) says so to a client that does not follow it. */
gboolean vm_stream_writer_elsewhere(VmStreamWriter *writer, const char *host, const char *address,
                                    const char *message, GError **error);

typedef struct {
    int fd;
    VmOp end;           /* what ends a successful reply: VM_OP_RESULT or VM_OP_EXIT */
    gboolean ended;     /* the end frame, or an ERROR, was read */
    GByteArray *parts;  /* a RESULT being received in parts; NULL when none */
    gboolean elsewhere; /* the reply was an ELSEWHERE: where says where to */
    VmElsewhere where;
} VmStreamReader;

/* Prepares to read the reply to @request (a request op) on @fd. Can't fail. */
void vm_stream_reader_init(VmStreamReader *reader, int fd, VmOp request);

/* Frees what a reader abandoned mid-reply holds (parts of a RESULT). Can't fail. */
void vm_stream_reader_clear(VmStreamReader *reader);

/* Reads the next frame of the reply. Returns (owned by the caller) a PROGRESS, the end frame
 * (RESULT or EXIT; a RESULT sent in parts comes back whole, at most VM_RESULT_MAX bytes), or,
 * for a streamed reply, STDOUT or STDERR; after the end frame
 * @reader->ended is TRUE and the reply is over. Fails with the error an ERROR frame carries
 * (same code and message; the reply is over too), VM_ERROR_PROTOCOL ("hostd closed the
 * connection unexpectedly") at end of file before the end, VM_ERROR_PROTOCOL for a malformed
 * frame or one that has no place in this reply ("unexpected stdout message from hostd"), and
 * VM_ERROR_IO ("lost the connection to hostd: ...") when reading fails. */
VmMessage *vm_stream_reader_next(VmStreamReader *reader, GError **error);

G_END_DECLS
