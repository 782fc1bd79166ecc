#include "vmctl.h"

#include "vm-error.h"
#include "vm-util.h"

#include <sys/socket.h>
#include <unistd.h>

/* Bytes moved at a time: a stream chunk and its frame header fit. */
#define BRIDGE_BUFFER (VM_STREAM_CHUNK_MAX + 1024)

/* Writes all of @len bytes to @fd (a socket or a pipe). Returns FALSE when the peer is gone. */
static gboolean
write_all(int fd, const guint8 *data, gsize len)
{
    while (len > 0) {
        gssize n = vm_write_nosignal(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return FALSE;
        data += n;
        len -= (gsize)n;
    }
    return TRUE;
}

/* Copies @from to @to until the end of @from or a failure of either. */
static void
copy(int from, int to)
{
    g_autofree guint8 *buffer = g_malloc(BRIDGE_BUFFER);

    for (;;) {
        ssize_t n = read(from, buffer, BRIDGE_BUFFER);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || !write_all(to, buffer, (gsize)n))
            return;
    }
}

/* The client's side: what comes in on stdin goes to hostd, and its end is passed on as a
 * half-close, which hostd reads as a local client's end of data. */
static gpointer
upstream_thread(gpointer data)
{
    int fd = GPOINTER_TO_INT(data);

    copy(STDIN_FILENO, fd);
    shutdown(fd, SHUT_WR);
    return NULL;
}

gboolean
vmctl_cmd_bridge(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(GError) local_error = NULL;

    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 0, &args, error))
        return FALSE;
    if (ctx->host != NULL)
        return vmctl_usage_error(ctx, error, "the bridge serves this host's hostd: no --host");

    g_autofree char *socket_path = vmctl_socket_path(ctx, &local_error);
    int fd = socket_path != NULL ? vmctl_client_connect(socket_path, &local_error) : -1;
    if (fd < 0) {
        /* The client on the other end of ssh reads frames: tell it why in one, so it reports
         * hostd's own code and message. */
        g_autoptr(VmMessage) message = vm_message_new_error(local_error);
        if (!vm_message_write_fd(STDOUT_FILENO, message, NULL)) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        ctx->exit_status = vm_error_exit_status(vm_error_code(local_error));
        return TRUE;
    }

    /* Both ways at once: a command's output may flow while its input still does. The fd stays
     * open for the thread, which may sit in read() on stdin until the process ends, right after
     * hostd ends the conversation. */
    g_thread_unref(g_thread_new("vmctl-bridge", upstream_thread, GINT_TO_POINTER(fd)));
    copy(fd, STDOUT_FILENO);
    shutdown(fd, SHUT_RDWR);
    return TRUE;
}
