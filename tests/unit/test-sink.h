/* A sink for network tests: an echo server on 127.0.0.1 that counts the connections and bytes
 * that reach it, so a test can assert that a blocked case delivered nothing; and the socket
 * helpers those tests share. */
#pragma once

#include <glib.h>

typedef struct {
    int listen_fd;
    guint16 port; /* where it listens on 127.0.0.1 */
    gint stop;
    gint bytes;       /* received so far (atomic) */
    gint connections; /* accepted so far (atomic) */
    GThread *thread;
    GMutex lock;
    GPtrArray *workers;
} VmTestSink;

/* Starts a sink on an ephemeral port of 127.0.0.1 (fails the test when it cannot). */
VmTestSink *vm_test_sink_new(void);

/* Stops it, joins its threads and closes every connection. */
void vm_test_sink_free(VmTestSink *sink);

/* A listening TCP socket on an ephemeral port of 127.0.0.1 (fails the test when it cannot). */
int vm_test_listen_loopback(guint16 *ret_port);

/* A port on 127.0.0.1 that was free a moment ago, in 16384-26967 where it can: below the
 * kernel's ephemeral range (so no other process's connection takes it meanwhile) and the fixed
 * ports (27000-27999) of the fleet tests, 32 or more ports under either. */
guint16 vm_test_free_port(void);

/* A blocking TCP connection to 127.0.0.1:@port whose reads give up after @timeout_s seconds (0:
 * never), so that a peer that hangs fails the test instead of hanging it (fails the test when it
 * cannot connect). */
int vm_test_connect_loopback(guint16 port, guint timeout_s);

/* Sends all of @text on @fd (fails the test when it cannot). */
void vm_test_send_text(int fd, const char *text);

/* Sends the @len bytes at @data on @fd from a thread of its own, then shuts down the sending side
 * of @fd, so that the peer reads EOF; stops early when the peer goes away. g_thread_join() returns
 * how many bytes went out (GPOINTER_TO_SIZE()). @data must outlive the thread. */
GThread *vm_test_send_thread(int fd, const guint8 *data, gsize len);

/* Whether what was read so far, @text, is all the caller waits for. */
typedef gboolean (*VmTestReadDone)(const GString *text, gconstpointer data);

/* Reads from @fd (a socket or a pipe) until @done(text, @data) holds, @fd ends, or @timeout_ms
 * pass; returns what came. *@ret_eof (may be NULL) tells whether the peer closed. */
GString *vm_test_read_while(int fd, int timeout_ms, VmTestReadDone done, gconstpointer data,
                            gboolean *ret_eof);

/* Reads from @fd until @needle appears (NULL: until EOF) or @timeout_ms pass; returns what came.
 * *@ret_eof (may be NULL) tells whether the peer closed. */
GString *vm_test_read_until(int fd, const char *needle, int timeout_ms, gboolean *ret_eof);
