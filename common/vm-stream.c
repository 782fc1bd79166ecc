#include "vm-stream.h"

#include "vm-error.h"
#include "vm-util.h"

/* As vm-protocol.c cuts error and progress texts. */
#define VM_STREAM_TEXT_MAX (16 * 1024)

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

/* A RESULT over one frame: its fields in normal form, in RESULT_PART frames, then an empty
 * RESULT to end it. */
static gboolean
vm_stream_write_parts(VmStreamWriter *writer, GVariant *fields, GError **error)
{
    g_autoptr(GVariant) normal = g_variant_get_normal_form(fields);
    gsize size = g_variant_get_size(normal);
    const guint8 *data = g_variant_get_data(normal);

    if (size > VM_RESULT_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "the answer is %" G_GSIZE_FORMAT " bytes, over the limit of %d", size,
                        VM_RESULT_MAX);
    for (gsize off = 0; off < size; off += VM_RESULT_PART_MAX) {
        gsize len = MIN(size - off, (gsize)VM_RESULT_PART_MAX);
        g_auto(GVariantDict) part = G_VARIANT_DICT_INIT(NULL);
        g_variant_dict_insert_value(
            &part, "data", g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, data + off, len, 1));
        if (!vm_stream_write(writer,
                             vm_message_new(VM_OP_RESULT_PART, g_variant_dict_end(&part), error),
                             FALSE, error))
            return FALSE;
    }
    return vm_stream_write(writer, vm_message_new(VM_OP_RESULT, NULL, error), TRUE, error);
}

gboolean
vm_stream_writer_result(VmStreamWriter *writer, GVariant *fields, GError **error)
{
    /* Consumed whatever happens, as the contract says. */
    g_autoptr(GVariant) owned = fields != NULL ? g_variant_ref_sink(fields) : NULL;
    g_autoptr(GError) local_error = NULL;

    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);

    VmMessage *message =
        vm_message_new(VM_OP_RESULT, owned != NULL ? g_variant_ref(owned) : NULL, &local_error);
    if (message == NULL) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return FALSE;
    }
    if (vm_stream_write(writer, message, TRUE, &local_error))
        return TRUE;
    /* Refused before a byte went out because it does not fit in a frame: send it in parts. */
    if (vm_error_code(local_error) == VM_ERROR_PROTOCOL && owned != NULL && !writer->ended)
        return vm_stream_write_parts(writer, owned, error);
    g_propagate_error(error, g_steal_pointer(&local_error));
    return FALSE;
}

gboolean
vm_stream_writer_error(VmStreamWriter *writer, const GError *failure, GError **error)
{
    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);
    g_return_val_if_fail(failure != NULL, FALSE);

    return vm_stream_write(writer, vm_message_new_error(failure), TRUE, error);
}

gboolean
vm_stream_writer_elsewhere(VmStreamWriter *writer, const char *host, const char *address,
                           const char *message, GError **error)
{
    g_return_val_if_fail(writer != NULL && !writer->ended, FALSE);

    g_autofree char *text = vm_utf8_cut(message, VM_STREAM_TEXT_MAX);
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "host", g_variant_new_string(host));
    g_variant_builder_add(&b, "{sv}", "address", g_variant_new_string(address));
    g_variant_builder_add(&b, "{sv}", "message", g_variant_new_string(text));
    VmMessage *m = vm_message_new(VM_OP_ELSEWHERE, g_variant_builder_end(&b), error);
    if (m == NULL) {
        writer->ended = TRUE;
        return FALSE;
    }
    return vm_stream_write(writer, m, TRUE, error);
}

void
vm_stream_reader_init(VmStreamReader *reader, int fd, VmOp request)
{
    g_return_if_fail(reader != NULL);
    g_return_if_fail(vm_op_is_request(request));

    *reader = (VmStreamReader){.fd = fd, .end = vm_op_reply_end(request)};
}

void
vm_stream_reader_clear(VmStreamReader *reader)
{
    if (reader->parts != NULL)
        g_byte_array_unref(reader->parts);
    reader->parts = NULL;
}

static gboolean
vm_stream_unexpected(const VmMessage *message, GError **error)
{
    const char *name = vm_op_name(message->op);

    return vm_throw(error, VM_ERROR_PROTOCOL, "unexpected %s message from hostd",
                    name != NULL ? name : "unknown");
}

/* The RESULT that ended parts: empty itself, its fields are the parts joined. */
static VmMessage *
vm_stream_reader_join(VmStreamReader *reader, const VmMessage *end, GError **error)
{
    g_autoptr(GBytes) bytes = g_byte_array_free_to_bytes(g_steal_pointer(&reader->parts));
    g_autoptr(GVariant) fields = NULL;

    if (g_variant_n_children(end->fields) != 0)
        return vm_throw(error, VM_ERROR_PROTOCOL, "a result in parts ended with fields"), NULL;
    fields = g_variant_ref_sink(g_variant_new_from_bytes(G_VARIANT_TYPE_VARDICT, bytes, FALSE));
    /* What came over the wire: only a value in normal form is one hostd could have sent. */
    if (!g_variant_is_normal_form(fields))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a result in parts is malformed"), NULL;
    return vm_message_new(VM_OP_RESULT, g_steal_pointer(&fields), error);
}

/* One frame of the reply; a RESULT_PART is kept in @reader and returns NULL with *@ret_part. */
static VmMessage *
vm_stream_reader_frame(VmStreamReader *reader, gboolean *ret_part, GError **error)
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
    case VM_OP_ELSEWHERE:
        /* A client that does not follow it reports it as what it is for this host: the agent
         * (or the new one) is not here. The schema bounded both fields to the arrays. */
        reader->ended = TRUE;
        reader->elsewhere = TRUE;
        g_strlcpy(reader->where.host, vm_message_get_string(message, "host", ""),
                  sizeof(reader->where.host));
        g_strlcpy(reader->where.address, vm_message_get_string(message, "address", ""),
                  sizeof(reader->where.address));
        vm_throw(error, VM_ERROR_NOT_FOUND, "%s", vm_message_get_string(message, "message", ""));
        return NULL;
    case VM_OP_PROGRESS:
        return g_steal_pointer(&message);
    case VM_OP_STDOUT:
    case VM_OP_STDERR:
        if (reader->end != VM_OP_EXIT)
            break;
        return g_steal_pointer(&message);
    case VM_OP_RESULT_PART: {
        gsize len = 0;
        const guint8 *data = vm_message_get_data(message, "data", &len);
        if (reader->end != VM_OP_RESULT)
            break;
        if (reader->parts == NULL)
            reader->parts = g_byte_array_new();
        if (reader->parts->len + len > VM_RESULT_MAX) {
            vm_throw(error, VM_ERROR_PROTOCOL, "hostd's answer is over the limit of %d bytes",
                     VM_RESULT_MAX);
            return NULL;
        }
        g_byte_array_append(reader->parts, data, (guint)len);
        *ret_part = TRUE;
        return NULL;
    }
    case VM_OP_RESULT:
        if (message->op != reader->end)
            break;
        reader->ended = TRUE;
        if (reader->parts != NULL)
            return vm_stream_reader_join(reader, message, error);
        return g_steal_pointer(&message);
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

VmMessage *
vm_stream_reader_next(VmStreamReader *reader, GError **error)
{
    for (;;) {
        gboolean part = FALSE;
        VmMessage *message = vm_stream_reader_frame(reader, &part, error);

        if (part)
            continue;
        /* Whatever ended the reply, parts of it are of no use any more. */
        if (message == NULL || reader->ended)
            vm_stream_reader_clear(reader);
        return message;
    }
}
