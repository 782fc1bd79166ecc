/* Replies: what a VmStreamWriter puts on the wire is exactly the frames hostd wrote by hand
 * before it, a VmStreamReader gets back what was written, and every reply cut short,
 * oversized or out of place is an error, never a hang or a crash. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "vm-stream.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Helpers */

static void
make_socketpair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

/* Everything readable from @fd up to EOF. */
static GByteArray *
read_all(int fd)
{
    GByteArray *bytes = g_byte_array_new();
    guint8 buf[4096];

    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));

        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n >= 0);
        if (n == 0)
            return bytes;
        g_byte_array_append(bytes, buf, (guint)n);
    }
}

static void
append_frame(GByteArray *wire, VmMessage *message)
{
    g_autoptr(VmMessage) owned = message;
    g_autoptr(GBytes) frame = NULL;
    gsize len = 0;
    const guint8 *data;

    assert_non_null(owned);
    frame = vm_message_encode(owned, NULL);
    assert_non_null(frame);
    data = g_bytes_get_data(frame, &len);
    g_byte_array_append(wire, data, (guint)len);
}

static VmMessage *
message_parsed(VmOp op, const char *text)
{
    g_autoptr(GError) error = NULL;
    VmMessage *m = vm_message_new(op, g_variant_new_parsed(text), &error);

    if (m == NULL)
        fail_msg("cannot build %s: %s", vm_op_name(op), error->message);
    return m;
}

/* A pipe whose write end holds @bytes and is then closed, for a reader to take apart. */
static int
pipe_with(const void *bytes, gsize len)
{
    int p[2];

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    assert_true(len < 65536); /* fits in the pipe buffer */
    if (len > 0)
        assert_int_equal(write(p[1], bytes, len), (gssize)len);
    close(p[1]);
    return p[0];
}

typedef struct {
    int fd;
    VmOp op;
    const char *data;
    gsize len;
    gboolean ok;
} DataWriter;

/* Writes from a thread, as the frames may be more than a socket buffer holds. */
static gpointer
data_writer_thread(gpointer user_data)
{
    DataWriter *w = user_data;
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(w->fd);

    w->ok = vm_stream_writer_data(&writer, w->op, w->data, w->len, NULL) &&
            vm_stream_writer_exit(&writer, 0, NULL);
    close(w->fd);
    return NULL;
}

/* Writes @data as @op frames and an EXIT, and returns the data frames the reader got. */
static GPtrArray *
data_frames(VmOp op, const char *data, gsize len)
{
    GPtrArray *frames = g_ptr_array_new_with_free_func((GDestroyNotify)vm_message_free);
    VmStreamReader reader;
    DataWriter w = {.op = op, .data = data, .len = len};
    GThread *thread;
    int sv[2];

    make_socketpair(sv);
    w.fd = sv[0];
    thread = g_thread_new("writer", data_writer_thread, &w);
    vm_stream_reader_init(&reader, sv[1], VM_OP_EXEC);
    while (!reader.ended) {
        g_autoptr(GError) error = NULL;
        VmMessage *m = vm_stream_reader_next(&reader, &error);

        if (m == NULL)
            fail_msg("reading the stream: %s", error->message);
        if (m->op == VM_OP_EXIT) {
            vm_message_free(m);
            break;
        }
        assert_int_equal(m->op, op);
        g_ptr_array_add(frames, m);
    }
    g_thread_join(thread);
    assert_true(w.ok);
    close(sv[1]);
    return frames;
}

/* ---------------------------------------------------------------------------------------------
 * The writer */

/* The bytes are those of the same messages built and encoded one by one, which is what hostd
 * wrote before the writer existed: vmctl of either kind reads them. */
static void
test_writer_wire_bytes(void **state)
{
    static const char out[] = "hello\n";
    static const char err[] = "oops";
    g_autoptr(GByteArray) want = g_byte_array_new();
    g_autoptr(GByteArray) got = NULL;
    g_autoptr(GError) error = NULL;
    int sv[2];

    make_socketpair(sv);
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
    assert_true(vm_stream_writer_progress(&writer, "copying", 0.25, &error));
    vm_stream_writer_progress_func("waiting", -1, &writer);
    assert_true(vm_stream_writer_data(&writer, VM_OP_STDOUT, out, strlen(out), &error));
    assert_true(vm_stream_writer_data(&writer, VM_OP_STDERR, err, strlen(err), &error));
    assert_false(writer.ended);
    assert_true(vm_stream_writer_exit(&writer, 3, &error));
    assert_true(writer.ended);
    assert_null(error);
    close(sv[0]);
    got = read_all(sv[1]);
    close(sv[1]);

    append_frame(want, vm_message_new_progress("copying", 0.25));
    append_frame(want, vm_message_new_progress("waiting", -1));
    append_frame(want, vm_message_new_data(VM_OP_STDOUT, out, strlen(out)));
    append_frame(want, vm_message_new_data(VM_OP_STDERR, err, strlen(err)));
    append_frame(want, message_parsed(VM_OP_EXIT, "{'status': <3>}"));
    assert_int_equal(got->len, want->len);
    assert_memory_equal(got->data, want->data, want->len);
}

static void
test_writer_result_and_error_bytes(void **state)
{
    g_autoptr(GByteArray) want = g_byte_array_new();
    g_autoptr(GError) failure = NULL;
    int sv[2];

    /* RESULT, with and without fields. */
    for (int with_fields = 0; with_fields < 2; with_fields++) {
        g_autoptr(GByteArray) got = NULL;
        const char *text = with_fields ? "{'agent': <{'name': <'alice'>}>}" : "@a{sv} {}";

        make_socketpair(sv);
        VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
        assert_true(vm_stream_writer_result(&writer,
                                            with_fields ? g_variant_new_parsed(text) : NULL, NULL));
        assert_true(writer.ended);
        close(sv[0]);
        got = read_all(sv[1]);
        close(sv[1]);
        g_byte_array_set_size(want, 0);
        append_frame(want, message_parsed(VM_OP_RESULT, text));
        assert_int_equal(got->len, want->len);
        assert_memory_equal(got->data, want->data, want->len);
    }

    /* ERROR carries the code and the message. */
    g_autoptr(GByteArray) got = NULL;
    vm_throw(&failure, VM_ERROR_NOT_FOUND, "no agent '%s'", "bob");
    make_socketpair(sv);
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
    assert_true(vm_stream_writer_error(&writer, failure, NULL));
    assert_true(writer.ended);
    close(sv[0]);
    got = read_all(sv[1]);
    close(sv[1]);
    g_byte_array_set_size(want, 0);
    append_frame(want, vm_message_new_error(failure));
    assert_int_equal(got->len, want->len);
    assert_memory_equal(got->data, want->data, want->len);
}

/* Data longer than a frame holds is split into frames of at most VM_STREAM_CHUNK_MAX bytes
 * that put the bytes back together in order; nothing is written for no data. */
static void
test_writer_splits_data(void **state)
{
    const gsize len = 3 * VM_STREAM_CHUNK_MAX + 10;
    g_autofree char *data = g_malloc(len);
    g_autoptr(GByteArray) joined = g_byte_array_new();
    g_autoptr(GPtrArray) frames = NULL;

    for (gsize i = 0; i < len; i++)
        data[i] = 'a' + i % 26;
    frames = data_frames(VM_OP_STDOUT, data, len);
    assert_int_equal(frames->len, 4);
    for (guint i = 0; i < frames->len; i++) {
        gsize n = 0;
        const guint8 *bytes = vm_message_get_data(frames->pdata[i], "data", &n);

        assert_true(n <= VM_STREAM_CHUNK_MAX);
        g_byte_array_append(joined, bytes, (guint)n);
    }
    assert_int_equal(joined->len, len);
    assert_memory_equal(joined->data, data, len);

    g_clear_pointer(&frames, g_ptr_array_unref);
    frames = data_frames(VM_OP_STDERR, "", 0);
    assert_int_equal(frames->len, 0);
}

/* Lines are not cut where a frame can end after a whole line instead (the egress log relies on
 * it); a single line longer than a frame is still cut. */
static void
test_writer_splits_at_lines(void **state)
{
    g_autoptr(GString) text = g_string_new(NULL);
    g_autoptr(GString) joined = g_string_new(NULL);
    g_autoptr(GPtrArray) frames = NULL;

    for (guint i = 0; text->len < 3 * VM_STREAM_CHUNK_MAX; i++)
        g_string_append_printf(text, "{\"record\": %u, \"pad\": \"%0*u\"}\n", i, (int)(i % 300), 0);
    g_string_append_c(text, 'x');
    for (guint i = 0; i < VM_STREAM_CHUNK_MAX + 5; i++)
        g_string_append_c(text, 'y');
    g_string_append_c(text, '\n');

    frames = data_frames(VM_OP_STDOUT, text->str, text->len);
    assert_true(frames->len > 3);
    for (guint i = 0; i < frames->len; i++) {
        gsize n = 0;
        const char *bytes = (const char *)vm_message_get_data(frames->pdata[i], "data", &n);

        assert_true(n > 0 && n <= VM_STREAM_CHUNK_MAX);
        /* Every frame before the overlong line ends a line. */
        if (joined->len < text->len - (VM_STREAM_CHUNK_MAX + 7))
            assert_int_equal(bytes[n - 1], '\n');
        g_string_append_len(joined, bytes, (gssize)n);
    }
    assert_int_equal(joined->len, text->len);
    assert_memory_equal(joined->str, text->str, text->len);
}

typedef struct {
    int fd;
    GVariant *fields;
    gboolean ok;
} ResultWriter;

static gpointer
result_writer_thread(gpointer data)
{
    ResultWriter *w = data;
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(w->fd);

    w->ok = vm_stream_writer_result(&writer, g_variant_ref(w->fields), NULL) && writer.ended;
    close(w->fd);
    return NULL;
}

/* A RESULT too big for a frame (a `list` of thousands of agents) goes in RESULT_PART frames
 * then an empty RESULT, and the reader gives back the one RESULT, equal to what was sent. */
static void
test_result_in_parts(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *huge = g_strnfill(VM_FRAME_MAX, 'x');
    g_auto(GVariantBuilder) names = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("as"));
    VmStreamReader reader;
    int sv[2];

    for (guint i = 0; i < 20000; i++) {
        g_autofree char *name = g_strdup_printf("agent-%05u", i);
        g_variant_builder_add(&names, "s", name);
    }
    g_autoptr(GVariant) fields = g_variant_ref_sink(g_variant_new_parsed(
        "{'config': <%s>, 'names': <%@as>}", huge, g_variant_builder_end(&names)));
    make_socketpair(sv);
    ResultWriter w = {.fd = sv[0], .fields = fields};
    GThread *thread = g_thread_new("writer", result_writer_thread, &w);

    /* On the wire: parts of at most VM_RESULT_PART_MAX bytes, then an empty RESULT. */
    guint parts = 0;
    gsize bytes = 0;
    g_autoptr(GByteArray) joined = g_byte_array_new();
    for (;;) {
        g_autoptr(VmMessage) m = vm_message_read_fd(sv[1], NULL, &error);
        assert_non_null(m);
        if (m->op == VM_OP_RESULT) {
            assert_int_equal(g_variant_n_children(m->fields), 0);
            break;
        }
        assert_int_equal(m->op, VM_OP_RESULT_PART);
        gsize len = 0;
        const guint8 *data = vm_message_get_data(m, "data", &len);
        assert_true(len > 0 && len <= VM_RESULT_PART_MAX);
        g_byte_array_append(joined, data, (guint)len);
        bytes += len;
        parts++;
    }
    g_thread_join(thread);
    assert_true(w.ok);
    assert_true(parts >= 3);
    assert_int_equal(bytes, g_variant_get_size(fields));
    close(sv[1]);

    /* Through the reader, the same again. */
    make_socketpair(sv);
    w = (ResultWriter){.fd = sv[0], .fields = fields};
    thread = g_thread_new("writer", result_writer_thread, &w);
    vm_stream_reader_init(&reader, sv[1], VM_OP_AGENT_LIST);
    g_autoptr(VmMessage) got = vm_stream_reader_next(&reader, &error);
    g_thread_join(thread);
    assert_non_null(got);
    assert_int_equal(got->op, VM_OP_RESULT);
    assert_true(reader.ended);
    assert_null(reader.parts);
    assert_true(g_variant_equal(got->fields, fields));
    close(sv[1]);
}

/* Parts the reader cannot take: a RESULT with fields after them, parts that are no a{sv} in
 * normal form, a part in a streamed reply, a reply cut after a part. */
static void
test_reader_bad_parts(void **state)
{
    static const guint8 not_a_dict[] = {0xff, 0xff, 0xff, 0x07};
    static const struct {
        VmOp request;
        gboolean good_part; /* a real part (of {'a': <1>}) instead of not_a_dict */
        const char *end;    /* the RESULT's fields after the part; NULL: the connection ends */
        const char *needle;
    } cases[] = {
        {VM_OP_AGENT_LIST, TRUE, "{'x': <1>}", "ended with fields"},
        {VM_OP_AGENT_LIST, FALSE, "@a{sv} {}", "malformed"},
        {VM_OP_EXEC, TRUE, NULL, "unexpected result-part"},
        {VM_OP_AGENT_LIST, TRUE, NULL, "closed the connection"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) good = g_variant_ref_sink(g_variant_new_parsed("{'a': <1>}"));
        const guint8 *data = cases[i].good_part ? g_variant_get_data(good) : not_a_dict;
        gsize len = cases[i].good_part ? g_variant_get_size(good) : sizeof(not_a_dict);
        VmStreamReader reader;
        int sv[2];

        make_socketpair(sv);
        g_auto(GVariantDict) part = G_VARIANT_DICT_INIT(NULL);
        g_variant_dict_insert_value(&part, "data",
                                    g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, data, len, 1));
        g_autoptr(VmMessage) m = vm_message_new(VM_OP_RESULT_PART, g_variant_dict_end(&part), NULL);
        assert_true(vm_message_write_fd(sv[0], m, NULL));
        if (cases[i].end != NULL) {
            g_autoptr(VmMessage) end =
                vm_message_new(VM_OP_RESULT, g_variant_new_parsed(cases[i].end), NULL);
            assert_true(vm_message_write_fd(sv[0], end, NULL));
        }
        close(sv[0]);
        vm_stream_reader_init(&reader, sv[1], cases[i].request);
        g_autoptr(VmMessage) got = vm_stream_reader_next(&reader, &error);
        assert_null(got);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        if (strstr(error->message, cases[i].needle) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, error->message, cases[i].needle);
        assert_null(reader.parts);
        close(sv[1]);
    }
}

/* A reader that is gone makes every write fail with VM_ERROR_CANCELLED, without SIGPIPE; an end
 * frame that could not go out still ends the reply. */
static void
test_writer_reader_gone(void **state)
{
    g_autoptr(GError) error = NULL;
    int sv[2];

    make_socketpair(sv);
    close(sv[1]);
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
    vm_stream_writer_progress_func("nobody listens", 0.5, &writer);
    assert_false(vm_stream_writer_data(&writer, VM_OP_STDOUT, "x", 1, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_CANCELLED));
    assert_non_null(strstr(error->message, "went away"));
    g_clear_error(&error);
    assert_false(writer.ended);
    assert_false(vm_stream_writer_exit(&writer, 0, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_CANCELLED));
    assert_true(writer.ended);
    close(sv[0]);
}

/* ---------------------------------------------------------------------------------------------
 * The reader */

static void
test_round_trip_result(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) progress = NULL;
    g_autoptr(VmMessage) result = NULL;
    g_autoptr(GVariant) agent = NULL;
    VmStreamReader reader;
    int sv[2];

    make_socketpair(sv);
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
    assert_true(vm_stream_writer_progress(&writer, "booting", 0.5, NULL));
    assert_true(
        vm_stream_writer_result(&writer, g_variant_new_parsed("{'agent': <@a{sv} {}>}"), NULL));
    close(sv[0]);

    vm_stream_reader_init(&reader, sv[1], VM_OP_AGENT_START);
    assert_int_equal(reader.end, VM_OP_RESULT);
    progress = vm_stream_reader_next(&reader, &error);
    assert_non_null(progress);
    assert_int_equal(progress->op, VM_OP_PROGRESS);
    assert_string_equal(vm_message_get_string(progress, "message", NULL), "booting");
    assert_true(vm_message_get_double(progress, "fraction", -1) == 0.5);
    assert_false(reader.ended);

    result = vm_stream_reader_next(&reader, &error);
    assert_non_null(result);
    assert_int_equal(result->op, VM_OP_RESULT);
    agent = vm_message_lookup(result, "agent");
    assert_non_null(agent);
    assert_true(reader.ended);
    assert_null(error);
    close(sv[1]);
}

static void
test_round_trip_stream(void **state)
{
    static const struct {
        VmOp op;
        const char *data;
    } frames[] = {
        {VM_OP_STDOUT, "out 1\n"},
        {VM_OP_STDERR, "err\n"},
        {VM_OP_PROGRESS, "still here"},
        {VM_OP_STDOUT, "out 2\n"},
    };
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) end = NULL;
    VmStreamReader reader;
    int sv[2];

    make_socketpair(sv);
    VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
    for (gsize i = 0; i < G_N_ELEMENTS(frames); i++) {
        if (frames[i].op == VM_OP_PROGRESS)
            assert_true(vm_stream_writer_progress(&writer, frames[i].data, -1, NULL));
        else
            assert_true(vm_stream_writer_data(&writer, frames[i].op, frames[i].data,
                                              strlen(frames[i].data), NULL));
    }
    assert_true(vm_stream_writer_exit(&writer, 141, NULL));
    close(sv[0]);

    vm_stream_reader_init(&reader, sv[1], VM_OP_EXEC);
    assert_int_equal(reader.end, VM_OP_EXIT);
    for (gsize i = 0; i < G_N_ELEMENTS(frames); i++) {
        g_autoptr(VmMessage) m = vm_stream_reader_next(&reader, &error);
        const char *text;
        gsize len = 0;

        assert_non_null(m);
        assert_int_equal(m->op, frames[i].op);
        if (m->op == VM_OP_PROGRESS) {
            text = vm_message_get_string(m, "message", NULL);
            len = strlen(text);
        } else {
            text = (const char *)vm_message_get_data(m, "data", &len);
        }
        assert_int_equal(len, strlen(frames[i].data));
        assert_memory_equal(text, frames[i].data, len);
        assert_false(reader.ended);
    }
    end = vm_stream_reader_next(&reader, &error);
    assert_non_null(end);
    assert_int_equal(end->op, VM_OP_EXIT);
    assert_int_equal(vm_message_get_int(end, "status", -1), 141);
    assert_true(reader.ended);
    assert_null(error);
    close(sv[1]);
}

/* An ERROR ends either kind of reply with hostd's code and message. */
static void
test_reader_error(void **state)
{
    static const VmOp requests[] = {VM_OP_AGENT_INFO, VM_OP_EXEC, VM_OP_EGRESS_LOG};

    for (gsize i = 0; i < G_N_ELEMENTS(requests); i++) {
        g_autoptr(GError) failure = NULL;
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) m = NULL;
        VmStreamReader reader;
        int sv[2];

        make_socketpair(sv);
        VmStreamWriter writer = VM_STREAM_WRITER_INIT(sv[0]);
        vm_throw(&failure, VM_ERROR_BAD_STATE, "agent '%s' is stopped", "alice");
        if (requests[i] != VM_OP_AGENT_INFO)
            assert_true(vm_stream_writer_data(&writer, VM_OP_STDOUT, "partial", 7, NULL));
        assert_true(vm_stream_writer_error(&writer, failure, NULL));
        close(sv[0]);

        vm_stream_reader_init(&reader, sv[1], requests[i]);
        if (requests[i] != VM_OP_AGENT_INFO) {
            m = vm_stream_reader_next(&reader, &error);
            assert_non_null(m);
            assert_int_equal(m->op, VM_OP_STDOUT);
            g_clear_pointer(&m, vm_message_free);
        }
        m = vm_stream_reader_next(&reader, &error);
        assert_null(m);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_BAD_STATE));
        assert_string_equal(error->message, "agent 'alice' is stopped");
        assert_true(reader.ended);
        close(sv[1]);
    }
}

/* Every cut of a reply, at the end of a frame or inside one, is a protocol error; a cut between
 * frames says that hostd closed the connection. */
static void
test_reader_truncated(void **state)
{
    g_autoptr(GByteArray) wire = g_byte_array_new();
    gsize first_end;

    append_frame(wire, vm_message_new_data(VM_OP_STDOUT, "some output\n", 12));
    first_end = wire->len;
    append_frame(wire, message_parsed(VM_OP_EXIT, "{'status': <0>}"));

    for (gsize cut = 0; cut < wire->len; cut++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) m = NULL;
        VmStreamReader reader;
        int fd = pipe_with(wire->data, cut);

        vm_stream_reader_init(&reader, fd, VM_OP_EXEC);
        if (cut >= first_end) {
            m = vm_stream_reader_next(&reader, &error);
            assert_non_null(m);
            assert_int_equal(m->op, VM_OP_STDOUT);
            g_clear_pointer(&m, vm_message_free);
        }
        m = vm_stream_reader_next(&reader, &error);
        if (m != NULL || !g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
            fail_msg("cut at %zu: no protocol error", cut);
        if ((cut == 0 || cut == first_end) &&
            strcmp(error->message, "hostd closed the connection unexpectedly") != 0)
            fail_msg("cut at %zu: %s", cut, error->message);
        if (cut != 0 && cut != first_end && strstr(error->message, "truncated") == NULL)
            fail_msg("cut at %zu: %s", cut, error->message);
        assert_false(reader.ended);
        close(fd);
    }
}

/* A length over VM_FRAME_MAX is refused from the header, before anything is allocated or read. */
static void
test_reader_oversized(void **state)
{
    static const guint8 headers[][4] = {
        {0x00, 0x10, 0x00, 0x01}, /* VM_FRAME_MAX + 1 */
        {0xff, 0xff, 0xff, 0xff},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(headers); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) m = NULL;
        VmStreamReader reader;
        int fd = pipe_with(headers[i], sizeof(headers[i]));

        vm_stream_reader_init(&reader, fd, VM_OP_PING);
        m = vm_stream_reader_next(&reader, &error);
        assert_null(m);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        assert_non_null(strstr(error->message, "over the limit"));
        close(fd);
    }
}

/* Frames that have no place in the reply: data in a RESULT reply, a RESULT in a stream, and what
 * only a client sends. */
static void
test_reader_unexpected(void **state)
{
    static const struct {
        VmOp request;
        VmOp op;
        const char *fields;
        const char *message;
    } cases[] = {
        {VM_OP_AGENT_INFO, VM_OP_STDOUT, "{'data': <b'x'>}", "unexpected stdout message"},
        {VM_OP_AGENT_INFO, VM_OP_EXIT, "{'status': <0>}", "unexpected exit message"},
        {VM_OP_EXEC, VM_OP_RESULT, "@a{sv} {}", "unexpected result message"},
        {VM_OP_EGRESS_LOG, VM_OP_RESULT, "@a{sv} {}", "unexpected result message"},
        {VM_OP_PING, VM_OP_PING, "@a{sv} {}", "unexpected ping message"},
        {VM_OP_EXEC, VM_OP_STDIN, "{'data': <b'x'>}", "unexpected stdin message"},
        {VM_OP_EXEC, VM_OP_WINDOW_SIZE, "{'cols': <uint32 1>, 'rows': <uint32 1>}",
         "unexpected window-size message"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GByteArray) wire = g_byte_array_new();
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) m = NULL;
        VmStreamReader reader;
        int fd;

        append_frame(wire, message_parsed(cases[i].op, cases[i].fields));
        fd = pipe_with(wire->data, wire->len);
        vm_stream_reader_init(&reader, fd, cases[i].request);
        m = vm_stream_reader_next(&reader, &error);
        assert_null(m);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        if (strstr(error->message, cases[i].message) == NULL)
            fail_msg("case %zu: %s", i, error->message);
        close(fd);
    }
}

/* A read that fails is a lost connection, not a protocol error. */
static void
test_reader_read_error(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) m = NULL;
    VmStreamReader reader;
    int fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    assert_true(fd >= 0);
    vm_stream_reader_init(&reader, fd, VM_OP_PING);
    m = vm_stream_reader_next(&reader, &error);
    assert_null(m);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    assert_true(g_str_has_prefix(error->message, "lost the connection to hostd: "));
    close(fd);
}

/* The shape of each request's reply comes from the schema table. */
static void
test_reply_end(void **state)
{
    for (guint op = 0; op < 256; op++) {
        VmOp end = vm_op_reply_end((VmOp)op);

        if (!vm_op_is_request((VmOp)op))
            assert_int_equal(end, 0);
        else if (op == VM_OP_EXEC || op == VM_OP_EGRESS_LOG || op == VM_OP_EVENTS ||
                 op == VM_OP_AGENT_LOGS || op == VM_OP_MOVE_READ || op == VM_OP_MOVE_WRITE)
            assert_int_equal(end, VM_OP_EXIT);
        else
            assert_int_equal(end, VM_OP_RESULT);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_wire_bytes),
        cmocka_unit_test(test_writer_result_and_error_bytes),
        cmocka_unit_test(test_writer_splits_data),
        cmocka_unit_test(test_writer_splits_at_lines),
        cmocka_unit_test(test_result_in_parts),
        cmocka_unit_test(test_reader_bad_parts),
        cmocka_unit_test(test_writer_reader_gone),
        cmocka_unit_test(test_round_trip_result),
        cmocka_unit_test(test_round_trip_stream),
        cmocka_unit_test(test_reader_error),
        cmocka_unit_test(test_reader_truncated),
        cmocka_unit_test(test_reader_oversized),
        cmocka_unit_test(test_reader_unexpected),
        cmocka_unit_test(test_reader_read_error),
        cmocka_unit_test(test_reply_end),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
