/* A fake hostd for vmctl's tests: a thread of the test that listens on a Unix socket and speaks
 * the protocol. Two ways to drive it:
 *
 * - a script, for one vmctl run: vm_test_hostd_start() takes one connection, records the
 *   request (and the stdin frames, when asked), sends the scripted replies and closes;
 * - a handler, for a client that makes many connections (vmctl mcp, vmctl through a bridge):
 *   vm_test_hostd_serve() hands every connection and its request to a function, each in a
 *   thread of its own, until the fake is freed.
 */
#pragma once

#include "vm-error.h"
#include "vm-protocol.h"

#include <glib.h>

typedef struct VmTestHostd VmTestHostd;

/* Answers one connection whose request is @request (owned by the caller) on @fd (closed by the
 * caller once this returns). */
typedef void (*VmTestHostdHandler)(VmTestHostd *hostd, int fd, const VmMessage *request,
                                   gpointer user_data);

struct VmTestHostd {
    char *socket_path;
    int listen_fd;
    GThread *thread;
    gint stop;

    /* The script. */
    GPtrArray *replies;     /* VmMessage, sent after the request (and stdin) */
    GVariant *result;       /* when set, a RESULT sent last through a VmStreamWriter (any size) */
    gboolean collect_stdin; /* read STDIN frames up to STDIN_EOF before replying */
    gboolean echo_stdin;    /* send what was collected back as STDOUT frames first */
    gboolean echo_as_read;  /* with collect_stdin: each STDIN frame back as STDOUT at once, as
                             * `cat` does, the next read only after that write */

    /* What the scripted connection did, read by the test once it is joined. */
    gboolean connected;
    VmMessage *request;
    GByteArray *stdin_data;
    gsize max_chunk;
    gboolean got_eof;
    gint window_sizes; /* WINDOW_SIZE frames among the STDIN ones (atomic) */

    /* vm_test_hostd_serve(). */
    VmTestHostdHandler handler;
    gpointer handler_data;
    GMutex lock;
    GPtrArray *workers; /* GThread, one a connection */
    gint connections;   /* accepted so far (atomic) */
};

/* Listens on @socket_path (fails the test when it cannot). */
VmTestHostd *vm_test_hostd_new(const char *socket_path);

/* Stops the threads (a handler still running is waited for) and closes the socket. */
void vm_test_hostd_free(VmTestHostd *hostd);

/* Appends to the script: a message @op with @fields in GVariant text form (NULL: none), a
 * STDOUT/STDERR frame of @text, or an ERROR. */
void vm_test_hostd_reply(VmTestHostd *hostd, VmOp op, const char *fields);
void vm_test_hostd_reply_data(VmTestHostd *hostd, VmOp op, const char *text);
void vm_test_hostd_reply_error(VmTestHostd *hostd, VmErrorCode code, const char *text);

/* Starts the scripted thread for one connection, forgetting what the previous one recorded. */
void vm_test_hostd_start(VmTestHostd *hostd);

/* Ends the scripted thread (it gives up waiting for a connection at once). */
void vm_test_hostd_join(VmTestHostd *hostd);

/* Answers every connection with @handler until the fake is freed. */
void vm_test_hostd_serve(VmTestHostd *hostd, VmTestHostdHandler handler, gpointer user_data);

/* Reads STDIN frames from @fd up to STDIN_EOF into @data (may be NULL: dropped). Returns TRUE
 * when STDIN_EOF came, FALSE when the connection ended or broke first. */
gboolean vm_test_hostd_read_stdin(int fd, GByteArray *data);

/* Sends @op with @fields in GVariant text form (NULL: none); a failure (the client is gone) is
 * ignored. For handlers: a message that cannot be built aborts (cmocka's asserts work only on
 * the test's own thread). */
void vm_test_hostd_send(int fd, VmOp op, const char *fields);

/* Sends an ERROR of @code and @text; a failure is ignored. */
void vm_test_hostd_send_error(int fd, VmErrorCode code, const char *text);
