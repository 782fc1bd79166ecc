#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test-vmctl-fixture.h"

#include "vm-stream.h"
#include "vm-util.h"

#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SERVER_WAIT_MS 30000

VmTestHostd *
vm_test_hostd_new(const char *socket_path)
{
    VmTestHostd *hostd = g_new0(VmTestHostd, 1);
    struct sockaddr_un addr;
    socklen_t addr_len;

    hostd->socket_path = g_strdup(socket_path);
    assert_true(vm_unix_address(socket_path, &addr, &addr_len, NULL));
    hostd->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(hostd->listen_fd >= 0);
    assert_int_equal(bind(hostd->listen_fd, (struct sockaddr *)&addr, addr_len), 0);
    assert_int_equal(listen(hostd->listen_fd, 64), 0);
    hostd->replies = g_ptr_array_new_with_free_func((GDestroyNotify)vm_message_free);
    hostd->stdin_data = g_byte_array_new();
    g_mutex_init(&hostd->lock);
    hostd->workers = g_ptr_array_new();
    return hostd;
}

void
vm_test_hostd_free(VmTestHostd *hostd)
{
    if (hostd == NULL)
        return;
    if (hostd->thread != NULL) {
        g_atomic_int_set(&hostd->stop, 1);
        g_thread_join(hostd->thread);
    }
    /* No new worker once the accepting thread is gone. */
    for (guint i = 0; i < hostd->workers->len; i++)
        g_thread_join(hostd->workers->pdata[i]);
    g_ptr_array_unref(hostd->workers);
    g_mutex_clear(&hostd->lock);
    close(hostd->listen_fd);
    g_ptr_array_unref(hostd->replies);
    g_clear_pointer(&hostd->result, g_variant_unref);
    g_byte_array_unref(hostd->stdin_data);
    if (hostd->request != NULL)
        vm_message_free(hostd->request);
    g_free(hostd->socket_path);
    g_free(hostd);
}

void
vm_test_hostd_reply(VmTestHostd *hostd, VmOp op, const char *fields)
{
    g_autoptr(GError) error = NULL;
    VmMessage *message =
        vm_message_new(op, fields != NULL ? g_variant_new_parsed(fields) : NULL, &error);

    assert_non_null(message);
    g_ptr_array_add(hostd->replies, message);
}

void
vm_test_hostd_reply_data(VmTestHostd *hostd, VmOp op, const char *text)
{
    g_ptr_array_add(hostd->replies, vm_message_new_data(op, text, strlen(text)));
}

void
vm_test_hostd_reply_error(VmTestHostd *hostd, VmErrorCode code, const char *text)
{
    g_autoptr(GError) error = g_error_new_literal(VM_ERROR, code, text);

    g_ptr_array_add(hostd->replies, vm_message_new_error(error));
}

gboolean
vm_test_hostd_read_stdin(int fd, GByteArray *data)
{
    for (;;) {
        gboolean eof = FALSE;
        g_autoptr(VmMessage) message = vm_message_read_fd(fd, &eof, NULL);
        gsize len = 0;

        if (message == NULL)
            return FALSE;
        if (message->op == VM_OP_STDIN_EOF)
            return TRUE;
        if (message->op == VM_OP_STDIN && data != NULL) {
            const guint8 *bytes = vm_message_get_data(message, "data", &len);
            g_byte_array_append(data, bytes, (guint)len);
        }
    }
}

void
vm_test_hostd_send(int fd, VmOp op, const char *fields)
{
    g_autoptr(VmMessage) message =
        vm_message_new(op, fields != NULL ? g_variant_new_parsed(fields) : NULL, NULL);

    /* Handlers run on threads of their own, where cmocka cannot fail a test. */
    g_assert_nonnull(message);
    vm_message_write_fd(fd, message, NULL);
}

void
vm_test_hostd_send_error(int fd, VmErrorCode code, const char *text)
{
    g_autoptr(GError) error = g_error_new_literal(VM_ERROR, code, text);
    g_autoptr(VmMessage) message = vm_message_new_error(error);

    vm_message_write_fd(fd, message, NULL);
}

static void
collect_stdin(VmTestHostd *hostd, int fd)
{
    for (;;) {
        gboolean eof = FALSE;
        g_autoptr(VmMessage) message = vm_message_read_fd(fd, &eof, NULL);
        gsize len = 0;

        if (message == NULL)
            return;
        if (message->op == VM_OP_STDIN_EOF) {
            hostd->got_eof = TRUE;
            return;
        }
        if (message->op == VM_OP_WINDOW_SIZE)
            g_atomic_int_inc(&hostd->window_sizes);
        if (message->op == VM_OP_STDIN) {
            const guint8 *data = vm_message_get_data(message, "data", &len);
            g_byte_array_append(hostd->stdin_data, data, (guint)len);
            hostd->max_chunk = MAX(hostd->max_chunk, len);
            if (hostd->echo_as_read) {
                g_autoptr(VmMessage) out = vm_message_new_data(VM_OP_STDOUT, data, len);
                vm_message_write_fd(fd, out, NULL);
            }
        }
    }
}

/* Waits for a connection until stop is set or SERVER_WAIT_MS pass. Returns it, or -1. */
static int
accept_one(VmTestHostd *hostd, int wait_ms)
{
    struct pollfd pfd = {.fd = hostd->listen_fd, .events = POLLIN};
    int waited = 0;

    while (!g_atomic_int_get(&hostd->stop) && (wait_ms < 0 || waited < wait_ms)) {
        if (poll(&pfd, 1, 50) == 1)
            return accept4(hostd->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        waited += 50;
    }
    return -1;
}

static gpointer
script_thread(gpointer data)
{
    VmTestHostd *hostd = data;
    int fd = accept_one(hostd, SERVER_WAIT_MS);

    if (fd < 0)
        return NULL;
    hostd->connected = TRUE;
    hostd->request = vm_message_read_fd(fd, NULL, NULL);
    if (hostd->collect_stdin)
        collect_stdin(hostd, fd);
    for (guint off = 0; hostd->echo_stdin && off < hostd->stdin_data->len;) {
        gsize len = MIN(hostd->stdin_data->len - off, VM_STREAM_CHUNK_MAX);
        g_autoptr(VmMessage) chunk =
            vm_message_new_data(VM_OP_STDOUT, hostd->stdin_data->data + off, len);
        vm_message_write_fd(fd, chunk, NULL);
        off += (guint)len;
    }
    for (guint i = 0; i < hostd->replies->len; i++)
        vm_message_write_fd(fd, g_ptr_array_index(hostd->replies, i), NULL);
    if (hostd->result != NULL) {
        VmStreamWriter writer = VM_STREAM_WRITER_INIT(fd);
        vm_stream_writer_result(&writer, g_variant_ref(hostd->result), NULL);
    }
    close(fd);
    return NULL;
}

void
vm_test_hostd_start(VmTestHostd *hostd)
{
    g_clear_pointer(&hostd->request, vm_message_free);
    g_byte_array_set_size(hostd->stdin_data, 0);
    hostd->connected = FALSE;
    hostd->got_eof = FALSE;
    hostd->max_chunk = 0;
    g_atomic_int_set(&hostd->stop, 0);
    hostd->thread = g_thread_new("fake-hostd", script_thread, hostd);
}

void
vm_test_hostd_join(VmTestHostd *hostd)
{
    g_atomic_int_set(&hostd->stop, 1);
    g_thread_join(hostd->thread);
    hostd->thread = NULL;
}

typedef struct {
    VmTestHostd *hostd;
    int fd;
} Worker;

static gpointer
worker_thread(gpointer data)
{
    Worker *worker = data;
    g_autoptr(VmMessage) request = vm_message_read_fd(worker->fd, NULL, NULL);

    if (request != NULL)
        worker->hostd->handler(worker->hostd, worker->fd, request, worker->hostd->handler_data);
    close(worker->fd);
    g_free(worker);
    return NULL;
}

static gpointer
serve_thread(gpointer data)
{
    VmTestHostd *hostd = data;

    for (;;) {
        int fd = accept_one(hostd, -1);
        if (fd < 0)
            return NULL;
        Worker *worker = g_new0(Worker, 1);
        worker->hostd = hostd;
        worker->fd = fd;
        g_atomic_int_inc(&hostd->connections);
        g_mutex_lock(&hostd->lock);
        g_ptr_array_add(hostd->workers, g_thread_new("fake-hostd-conn", worker_thread, worker));
        g_mutex_unlock(&hostd->lock);
    }
}

void
vm_test_hostd_serve(VmTestHostd *hostd, VmTestHostdHandler handler, gpointer user_data)
{
    hostd->handler = handler;
    hostd->handler_data = user_data;
    g_atomic_int_set(&hostd->stop, 0);
    hostd->thread = g_thread_new("fake-hostd", serve_thread, hostd);
}
