#include "vm-stream.h"

#include "vm-error.h"

/* Writes @message (consumed; NULL means building it failed, with @error set). */
static gboolean
vm_stream_write(VmStreamWriter *writer, VmMessage *message, gboolean end, GError **error)
{
    g_autoptr(VmMessage) owned = message;
    g_autoptr(GError) local_error = NULL;

    if (owned == NULL)
        return FALSE;
    if (!vm_message_write_fd(writer->fd, owned, &local_error)) {
        /* Too big for a frame: refused before a byte went out, so the reply is as it was. */
        if (vm_error_code(local_error) == VM_ERROR_PROTOCOL) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        /* Whatever reached the reader, the reply is over: nothing may follow an end frame. */
        if (end)
            writer->ended = TRUE;
        return vm_throw(error, VM_ERROR_CANCELLED, "the client went away: %s",
                        local_error->message);
    }
    if (end)
        writer->ended = TRUE;
    return TRUE;
}

gboolean
vm_stream_writer_progress(VmStreamWriter *writer, const char *message, double fraction,
                          GError **error)
{
    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);

    return vm_stream_write(writer, vm_message_new_progress(message, fraction), FALSE, error);
}

void
vm_stream_writer_progress_func(const char *message, double fraction, gpointer user_data)
{
    (void)vm_stream_writer_progress(user_data, message, fraction, NULL);
}

gboolean
vm_stream_writer_data(VmStreamWriter *writer, VmOp op, const void *data, gsize len, GError **error)
{
    const char *rest = data;

    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);
    g_return_val_if_fail(op == VM_OP_STDOUT || op == VM_OP_STDERR, FALSE);
    g_return_val_if_fail(data != NULL || len == 0, FALSE);

    while (len > 0) {
        gsize chunk = MIN(len, VM_STREAM_CHUNK_MAX);

        if (chunk < len) {
            const char *nl = g_strrstr_len(rest, (gssize)chunk, "\n");

            if (nl != NULL)
                chunk = nl - rest + 1;
        }
        if (!vm_stream_write(writer, vm_message_new_data(op, rest, chunk), FALSE, error))
            return FALSE;
        rest += chunk;
        len -= chunk;
    }
    return TRUE;
}

gboolean
vm_stream_writer_exit(VmStreamWriter *writer, gint32 status, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);

    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);

    g_variant_dict_insert(&fields, "status", "i", status);
    return vm_stream_write(writer, vm_message_new(VM_OP_EXIT, g_variant_dict_end(&fields), error),
                           TRUE, error);
}

gboolean
vm_stream_writer_result(VmStreamWriter *writer, GVariant *fields, GError **error)
{
    /* Consumed whatever happens, as the contract says. */
    g_autoptr(GVariant) owned = fields != NULL ? g_variant_ref_sink(fields) : NULL;

    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);

    return vm_stream_write(writer, vm_message_new(VM_OP_RESULT, g_steal_pointer(&owned), error),
                           TRUE, error);
}

gboolean
vm_stream_writer_error(VmStreamWriter *writer, const GError *failure, GError **error)
{
    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);
    g_return_val_if_fail(failure != NULL, FALSE);

    return vm_stream_write(writer, vm_message_new_error(failure), TRUE, error);
}

void
vm_stream_reader_init(VmStreamReader *reader, int fd, VmOp request)
{
    g_return_if_fail(reader != NULL);
    g_return_if_fail(vm_op_is_request(request));

    *reader = (VmStreamReader){.fd = fd, .end = vm_op_reply_end(request)};
}

static gboolean
vm_stream_unexpected(const VmMessage *message, GError **error)
{
    const char *name = vm_op_name(message->op);

    return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                    name != NULL ? name : "unknown");
}

VmMessage *
vm_stream_reader_next(VmStreamReader *reader, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(VmMessage) message = NULL;
    gboolean eof = FALSE;

    g_return_val_if_fail(reader != NULL && !reader->ended, NULL);

    message = vm_message_read_fd(reader->fd, &eof, &local_error);
    if (message == NULL) {
        if (eof) {
            vm_throw(error, VM_ERROR_PROTOCOL, "hostd closed the connection unexpectedly");
            return NULL;
        }
        /* A reset is how a Unix socket reports a peer that closed with our data unread: it is
         * hostd going away as much as an end of file is. */
        if (vm_error_code(local_error) == VM_ERROR_IO)
            g_prefix_error(&local_error, "lost the connection to hostd: ");
        g_propagate_error(error, g_steal_pointer(&local_error));
        return NULL;
    }

    switch (message->op) {
    case VM_OP_ERROR:
        reader->ended = TRUE;
        vm_message_to_error(message, error);
        return NULL;
    case VM_OP_PROGRESS:
        return g_steal_pointer(&message);
    case VM_OP_STDOUT:
    case VM_OP_STDERR:
        if (reader->end != VM_OP_EXIT)
            break;
        return g_steal_pointer(&message);
    case VM_OP_RESULT:
    case VM_OP_EXIT:
        if (message->op != reader->end)
            break;
        reader->ended = TRUE;
        return g_steal_pointer(&message);
    default:
        break;
    }
    vm_stream_unexpected(message, error);
    return NULL;
}
