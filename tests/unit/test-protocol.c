/* The wire protocol: every message survives a round trip, and every malformed frame is refused
 * with VM_ERROR_PROTOCOL, whether it arrives as a payload or through a file descriptor. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "vm-protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* Ops in declaration order, with whether a client may open a connection with them. */
static const struct {
    VmOp op;
    gboolean request;
} all_ops[] = {
    {VM_OP_PING, TRUE},
    {VM_OP_TEMPLATE_LIST, TRUE},
    {VM_OP_TEMPLATE_BUILD, TRUE},
    {VM_OP_AGENT_NEW, TRUE},
    {VM_OP_AGENT_LIST, TRUE},
    {VM_OP_AGENT_INFO, TRUE},
    {VM_OP_AGENT_START, TRUE},
    {VM_OP_AGENT_STOP, TRUE},
    {VM_OP_AGENT_RM, TRUE},
    {VM_OP_AGENT_SSH_CONFIG, TRUE},
    {VM_OP_EXEC, TRUE},
    {VM_OP_CHECKPOINT_CREATE, TRUE},
    {VM_OP_CHECKPOINT_LIST, TRUE},
    {VM_OP_CHECKPOINT_RESTORE, TRUE},
    {VM_OP_CHECKPOINT_RM, TRUE},
    {VM_OP_AGENT_SUSPEND, TRUE},
    {VM_OP_AGENT_RESUME, TRUE},
    {VM_OP_AGENT_KEEP_AWAKE, TRUE},
    {VM_OP_AGENT_SET_IDLE, TRUE},
    {VM_OP_AGENT_SET_CHECKPOINTS, TRUE},
    {VM_OP_AGENT_FORK, TRUE},
    {VM_OP_CHECKPOINT_DIFF, TRUE},
    {VM_OP_EGRESS_GET, TRUE},
    {VM_OP_EGRESS_SET, TRUE},
    {VM_OP_EGRESS_LOG, TRUE},
    {VM_OP_AGENT_SET_RESTART, TRUE},
    {VM_OP_HOST_SAVE_ALL, TRUE},
    {VM_OP_EVENTS, TRUE},
    {VM_OP_FORWARD_ADD, TRUE},
    {VM_OP_FORWARD_RM, TRUE},
    {VM_OP_FORWARD_LIST, TRUE},
    {VM_OP_AGENT_AUTHORIZE_ADD, TRUE},
    {VM_OP_AGENT_AUTHORIZE_RM, TRUE},
    {VM_OP_AGENT_AUTHORIZE_LIST, TRUE},
    {VM_OP_SECRET_CREATE, TRUE},
    {VM_OP_SECRET_LIST, TRUE},
    {VM_OP_SECRET_SET, TRUE},
    {VM_OP_SECRET_RM, TRUE},
    {VM_OP_SECRET_GRANT, TRUE},
    {VM_OP_SECRET_REVOKE, TRUE},
    {VM_OP_AGENT_SET_RESOURCES, TRUE},
    {VM_OP_EGRESS_PRESETS, TRUE},
    {VM_OP_AGENT_LOGS, TRUE},
    {VM_OP_AGENT_STATS, TRUE},
    {VM_OP_FLEET_HOSTS, TRUE},
    {VM_OP_FLEET_LIST, TRUE},
    {VM_OP_FLEET_DRAIN, TRUE},
    {VM_OP_MOVE_OUT, TRUE},
    {VM_OP_MOVE_READ, TRUE},
    {VM_OP_MOVE_IN, TRUE},
    {VM_OP_MOVE_WRITE, TRUE},
    {VM_OP_AGENT_RECOVER, TRUE},
    {VM_OP_AGENT_SET_REPLICATE, TRUE},
    {VM_OP_STDIN, FALSE},
    {VM_OP_STDIN_EOF, FALSE},
    {VM_OP_WINDOW_SIZE, FALSE},
    {VM_OP_PROGRESS, FALSE},
    {VM_OP_RESULT, FALSE},
    {VM_OP_ERROR, FALSE},
    {VM_OP_STDOUT, FALSE},
    {VM_OP_STDERR, FALSE},
    {VM_OP_EXIT, FALSE},
    {VM_OP_RESULT_PART, FALSE},
    {VM_OP_ELSEWHERE, FALSE},
};

/* One message per op with every field it may carry, in GVariant text form. */
static const struct {
    VmOp op;
    const char *fields;
} full_messages[] = {
    {VM_OP_PING, "@a{sv} {}"},
    {VM_OP_TEMPLATE_LIST, "@a{sv} {}"},
    {VM_OP_TEMPLATE_BUILD, "{'name': <'debian-12'>, 'force': <true>}"},
    {VM_OP_AGENT_NEW, "{'name': <'alice'>, 'template': <'debian-12'>, 'cpus': <uint32 2>, "
                      "'memory_mib': <uint32 2048>, 'disk_gib': <uint32 20>, "
                      "'user_data': <'#cloud-config\\n'>, 'wait': <true>, "
                      "'egress': <['@pypi', 'example.com:8443']>, 'on': <'h2'>}"},
    {VM_OP_AGENT_LIST, "@a{sv} {}"},
    {VM_OP_AGENT_INFO, "{'name': <'alice'>}"},
    {VM_OP_AGENT_START, "{'name': <'alice'>, 'wait': <false>}"},
    {VM_OP_AGENT_STOP, "{'name': <'alice'>, 'force': <true>, 'timeout_s': <uint32 30>}"},
    {VM_OP_AGENT_RM, "{'name': <'alice'>, 'force': <true>}"},
    {VM_OP_AGENT_SSH_CONFIG, "{'name': <'alice'>}"},
    {VM_OP_EXEC, "{'name': <'alice'>, 'argv': <['sh', '-c', 'echo é']>, "
                 "'env': <['LANG=C.UTF-8', 'EMPTY=']>, 'cwd': <'/tmp'>, 'tty': <true>, "
                 "'term': <'xterm'>, 'cols': <uint32 80>, 'rows': <uint32 24>}"},
    {VM_OP_CHECKPOINT_CREATE, "{'name': <'alice'>, 'label': <'before upgrade'>}"},
    {VM_OP_CHECKPOINT_LIST, "{'name': <'alice'>}"},
    {VM_OP_CHECKPOINT_RESTORE, "{'name': <'alice'>, 'checkpoint': <'c1'>, 'wait': <true>}"},
    {VM_OP_CHECKPOINT_RM, "{'name': <'alice'>, 'checkpoint': <'c1'>}"},
    {VM_OP_AGENT_SUSPEND, "{'name': <'alice'>, 'save': <true>}"},
    {VM_OP_AGENT_RESUME, "{'name': <'alice'>}"},
    {VM_OP_AGENT_KEEP_AWAKE, "{'name': <'alice'>, 'seconds': <uint32 3600>, 'off': <false>}"},
    {VM_OP_AGENT_SET_IDLE, "{'name': <'alice'>, 'never': <false>, 'pause_s': <uint32 300>, "
                           "'save_s': <uint32 1800>}"},
    {VM_OP_AGENT_SET_CHECKPOINTS, "{'name': <'alice'>, 'never': <false>, 'every_s': <uint32 1800>, "
                                  "'keep': <uint32 10>}"},
    {VM_OP_FORWARD_ADD, "{'name': <'alice'>, 'guest_port': <uint32 3000>, "
                        "'host_port': <uint32 43000>}"},
    {VM_OP_FORWARD_RM, "{'name': <'alice'>, 'guest_port': <uint32 3000>}"},
    {VM_OP_FORWARD_LIST, "{'name': <'alice'>}"},
    {VM_OP_AGENT_NEW, "{'name': <'alice'>, 'ssh_keys': <['ssh-ed25519 AAAA alice@laptop']>}"},
    {VM_OP_AGENT_AUTHORIZE_ADD, "{'name': <'alice'>, 'keys': <['ssh-ed25519 AAAA a', "
                                "'ssh-rsa AAAA b']>}"},
    {VM_OP_AGENT_AUTHORIZE_RM, "{'name': <'alice'>, 'fingerprint': <'SHA256:abc'>}"},
    {VM_OP_AGENT_AUTHORIZE_LIST, "{'name': <'alice'>}"},
    {VM_OP_AGENT_NEW, "{'name': <'alice'>, 'secrets': <['example-api', 'gh']>}"},
    {VM_OP_AGENT_FORK, "{'name': <'bob'>, 'source': <'alice'>, 'grants': <true>}"},
    {VM_OP_SECRET_CREATE, "{'secret': <'example-api'>, 'hosts': <['api.example.com', "
                          "'*.example.com']>, 'header': <'Authorization'>, "
                          "'format': <'Bearer {}'>, 'env': <'EXAMPLE_API_KEY'>, "
                          "'value': <b'sk-test'>}"},
    {VM_OP_SECRET_LIST, "@a{sv} {}"},
    {VM_OP_SECRET_SET, "{'secret': <'example-api'>, 'value': <b'sk-new'>}"},
    {VM_OP_SECRET_RM, "{'secret': <'example-api'>, 'force': <true>}"},
    {VM_OP_SECRET_GRANT, "{'name': <'alice'>, 'secret': <'example-api'>}"},
    {VM_OP_SECRET_REVOKE, "{'name': <'alice'>, 'secret': <'example-api'>}"},
    {VM_OP_AGENT_SET_RESOURCES, "{'name': <'alice'>, 'cpus': <uint32 4>, "
                                "'memory_add_mib': <uint32 2048>, 'disk_add_gib': <uint32 5>}"},
    {VM_OP_EGRESS_PRESETS, "@a{sv} {}"},
    {VM_OP_AGENT_LOGS, "{'name': <'alice'>, 'follow': <true>, 'lines': <uint32 20>, "
                       "'cloud_init': <false>}"},
    {VM_OP_AGENT_STATS, "{'names': <['alice', 'bob']>}"},
    {VM_OP_FLEET_HOSTS, "@a{sv} {}"},
    {VM_OP_FLEET_LIST, "@a{sv} {}"},
    {VM_OP_FLEET_DRAIN, "{'host': <'h2'>, 'drained': <true>}"},
    {VM_OP_MOVE_OUT, "{'name': <'alice'>, 'step': <'save'>, 'to': <'h2'>}"},
    {VM_OP_MOVE_READ, "{'name': <'alice'>, 'file': <'@memory'>}"},
    {VM_OP_MOVE_IN, "{'name': <'alice'>, 'step': <'begin'>, 'from': <'h1'>, 'epoch': <int64 3>, "
                    "'template': <'debian-12'>, 'cpus': <uint32 2>, 'memory_mib': <uint32 1024>, "
                    "'disk_gib': <uint32 8>, 'base_sha256': <'"
                    "0123456789abcdef0123456789abcdef"
                    "0123456789abcdef0123456789abcdef"
                    "'>, 'source_dir': <'/s/agents/alice'>, "
                    "'base_path': <'/s/images/debian-12/base.qcow2'>, 'warm_path': <'/s/w.qcow2'>, "
                    "'files': <['0123 agent.ini']>}"},
    {VM_OP_MOVE_WRITE, "{'name': <'alice'>, 'file': <'disk.qcow2'>, 'size': <int64 65536>}"},
    {VM_OP_AGENT_RECOVER, "{'name': <'alice'>, 'to': <'h2'>}"},
    {VM_OP_AGENT_SET_REPLICATE, "{'name': <'alice'>, 'copies': <uint32 2>}"},
    {VM_OP_STDIN, "{'data': <[byte 0x00, 0x68, 0xff]>}"},
    {VM_OP_STDIN_EOF, "@a{sv} {}"},
    {VM_OP_WINDOW_SIZE, "{'cols': <uint32 132>, 'rows': <uint32 43>}"},
    {VM_OP_PROGRESS, "{'message': <'downloading'>, 'fraction': <0.25>}"},
    {VM_OP_RESULT, "{'agent': <{'name': <'alice'>, 'state': <'running'>}>, "
                   "'agents': <[{'name': <'bob'>}]>, 'version': <'0.1.0'>, "
                   "'protocol': <uint32 1>}"},
    {VM_OP_ERROR, "{'code': <uint32 3>, 'message': <'no agent \\'x\\''>}"},
    {VM_OP_STDOUT, "{'data': <[byte 0x0a]>}"},
    {VM_OP_STDERR, "{'data': <@ay []>}"},
    {VM_OP_EXIT, "{'status': <-1>}"},
    {VM_OP_ELSEWHERE, "{'host': <'h2'>, 'address': <'ssh://root@h2'>, "
                      "'message': <'agent \\'x\\' is on host \\'h2\\''>}"},
};

/* Serialises (op, fields) exactly as a peer would, without any schema check. */
static GBytes *
raw_payload(guint32 op, GVariant *fields)
{
    g_autoptr(GVariant) v = g_variant_ref_sink(g_variant_new("(u@a{sv})", op, fields));

    return g_variant_get_data_as_bytes(v);
}

static GBytes *
frame_of(GBytes *payload)
{
    gsize len;
    const guint8 *data = g_bytes_get_data(payload, &len);
    guint8 *frame = g_malloc(len + 4);

    frame[0] = len >> 24;
    frame[1] = len >> 16;
    frame[2] = len >> 8;
    frame[3] = len;
    if (len > 0)
        memcpy(frame + 4, data, len);
    return g_bytes_new_take(frame, len + 4);
}

static GVariant *
vardict_with(const char *key, GVariant *value)
{
    GVariantBuilder b;

    g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", key, value);
    return g_variant_builder_end(&b);
}

static GVariant *
exec_with_argv(gsize n)
{
    GVariantBuilder b, argv;

    g_variant_builder_init(&argv, G_VARIANT_TYPE_STRING_ARRAY);
    for (gsize i = 0; i < n; i++)
        g_variant_builder_add(&argv, "s", "x");
    g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string("a"));
    g_variant_builder_add(&b, "{sv}", "argv", g_variant_builder_end(&argv));
    return g_variant_builder_end(&b);
}

static GVariant *
exec_with_env(gsize n, const char *entry)
{
    GVariantBuilder b, env;
    const char *argv[] = {"true", NULL};

    g_variant_builder_init(&env, G_VARIANT_TYPE_STRING_ARRAY);
    for (gsize i = 0; i < n; i++)
        g_variant_builder_add(&env, "s", entry);
    g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string("a"));
    g_variant_builder_add(&b, "{sv}", "argv", g_variant_new_strv(argv, -1));
    g_variant_builder_add(&b, "{sv}", "env", g_variant_builder_end(&env));
    return g_variant_builder_end(&b);
}

static GVariant *
agent_new_with_user_data(gsize len)
{
    g_autofree char *text = g_strnfill(len, 'u');
    GVariantBuilder b;

    g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string("a"));
    g_variant_builder_add(&b, "{sv}", "user_data", g_variant_new_string(text));
    return g_variant_builder_end(&b);
}

static GVariant *
data_of(gsize len)
{
    g_autofree guint8 *buf = g_malloc0(MAX(len, 1));

    return vardict_with("data", g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, buf, len, 1));
}

/* ---------------------------------------------------------------------------------------------
 * Op table */

static void
test_op_names(void **state)
{
    g_autoptr(GHashTable) names = g_hash_table_new(g_str_hash, g_str_equal);
    guint known = 0;

    for (gsize i = 0; i < G_N_ELEMENTS(all_ops); i++) {
        const char *name = vm_op_name(all_ops[i].op);

        assert_non_null(name);
        assert_true(g_hash_table_add(names, (gpointer)name));
        assert_int_equal(vm_op_is_request(all_ops[i].op), all_ops[i].request);
    }
    /* No value outside the enum has a name, so the table above is the whole protocol. */
    for (guint op = 0; op < 1000; op++) {
        if (vm_op_name(op) != NULL)
            known++;
    }
    assert_int_equal(known, G_N_ELEMENTS(all_ops));
    assert_null(vm_op_name(0));
    assert_false(vm_op_is_request(0));
    assert_string_equal(vm_op_name(VM_OP_AGENT_NEW), "agent-new");
    assert_string_equal(vm_op_name(VM_OP_STDIN_EOF), "stdin-eof");
}

/* The numbers are the wire format: pin them. */
static void
test_op_numbers(void **state)
{
    assert_int_equal(VM_OP_PING, 1);
    assert_int_equal(VM_OP_EXEC, 11);
    assert_int_equal(VM_OP_CHECKPOINT_CREATE, 12);
    assert_int_equal(VM_OP_CHECKPOINT_RM, 15);
    assert_int_equal(VM_OP_AGENT_SET_CHECKPOINTS, 20);
    assert_int_equal(VM_OP_AGENT_FORK, 21);
    assert_int_equal(VM_OP_EGRESS_LOG, 25);
    assert_int_equal(VM_OP_AGENT_SET_RESTART, 26);
    assert_int_equal(VM_OP_HOST_SAVE_ALL, 27);
    assert_int_equal(VM_OP_EVENTS, 28);
    assert_int_equal(VM_OP_FORWARD_ADD, 29);
    assert_int_equal(VM_OP_FORWARD_RM, 30);
    assert_int_equal(VM_OP_FORWARD_LIST, 31);
    assert_int_equal(VM_OP_AGENT_AUTHORIZE_ADD, 32);
    assert_int_equal(VM_OP_AGENT_AUTHORIZE_RM, 33);
    assert_int_equal(VM_OP_AGENT_AUTHORIZE_LIST, 34);
    assert_int_equal(VM_OP_SECRET_CREATE, 35);
    assert_int_equal(VM_OP_SECRET_LIST, 36);
    assert_int_equal(VM_OP_SECRET_SET, 37);
    assert_int_equal(VM_OP_SECRET_RM, 38);
    assert_int_equal(VM_OP_SECRET_GRANT, 39);
    assert_int_equal(VM_OP_SECRET_REVOKE, 40);
    assert_int_equal(VM_OP_AGENT_SET_RESOURCES, 41);
    assert_int_equal(VM_OP_EGRESS_PRESETS, 42);
    assert_int_equal(VM_OP_AGENT_LOGS, 43);
    assert_int_equal(VM_OP_AGENT_STATS, 44);
    assert_int_equal(VM_OP_FLEET_HOSTS, 45);
    assert_int_equal(VM_OP_FLEET_LIST, 46);
    assert_int_equal(VM_OP_FLEET_DRAIN, 47);
    assert_int_equal(VM_OP_MOVE_OUT, 48);
    assert_int_equal(VM_OP_MOVE_READ, 49);
    assert_int_equal(VM_OP_MOVE_IN, 53);
    assert_int_equal(VM_OP_MOVE_WRITE, 54);
    assert_int_equal(VM_OP_AGENT_RECOVER, 55);
    assert_int_equal(VM_OP_AGENT_SET_REPLICATE, 56);
    assert_int_equal(VM_OP_ELSEWHERE, 107);
    assert_int_equal(VM_OP_STDIN, 50);
    assert_int_equal(VM_OP_WINDOW_SIZE, 52);
    assert_int_equal(VM_OP_PROGRESS, 100);
    assert_int_equal(VM_OP_EXIT, 105);
}

/* ---------------------------------------------------------------------------------------------
 * Round trips */

static void
test_round_trip(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(full_messages); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) fields =
            g_variant_ref_sink(g_variant_new_parsed(full_messages[i].fields));
        g_autoptr(VmMessage) msg = NULL;
        g_autoptr(VmMessage) back = NULL;
        g_autoptr(GBytes) frame = NULL;
        const guint8 *data;
        gsize len;
        guint32 header;

        msg = vm_message_new(full_messages[i].op, g_variant_ref(fields), &error);
        if (msg == NULL)
            fail_msg("%s: %s", vm_op_name(full_messages[i].op), error->message);

        frame = vm_message_encode(msg, &error);
        assert_null(error);
        data = g_bytes_get_data(frame, &len);
        assert_true(len > VM_FRAME_HEADER_SIZE);
        header = (guint32)data[0] << 24 | data[1] << 16 | data[2] << 8 | data[3];
        assert_int_equal(header, len - VM_FRAME_HEADER_SIZE);

        back = vm_message_decode(data + VM_FRAME_HEADER_SIZE, len - VM_FRAME_HEADER_SIZE, &error);
        assert_null(error);
        assert_non_null(back);
        assert_int_equal(back->op, full_messages[i].op);
        assert_true(g_variant_equal(back->fields, fields));
    }
}

static void
test_round_trip_fd(void **state)
{
    int sv[2];
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) big = NULL;
    g_autoptr(VmMessage) ping = NULL;
    g_autoptr(VmMessage) got = NULL;
    g_autofree guint8 *chunk = g_malloc(VM_STREAM_CHUNK_MAX);
    const guint8 *data;
    gboolean eof = TRUE;
    gsize len = 0;

    for (gsize i = 0; i < VM_STREAM_CHUNK_MAX; i++)
        chunk[i] = i * 7;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);

    big = vm_message_new_data(VM_OP_STDOUT, chunk, VM_STREAM_CHUNK_MAX);
    ping = vm_message_new(VM_OP_PING, NULL, &error);
    assert_null(error);
    assert_true(vm_message_write_fd(sv[0], big, &error));
    assert_true(vm_message_write_fd(sv[0], ping, &error));
    assert_null(error);
    close(sv[0]);

    got = vm_message_read_fd(sv[1], &eof, &error);
    assert_null(error);
    assert_false(eof);
    assert_int_equal(got->op, VM_OP_STDOUT);
    data = vm_message_get_data(got, "data", &len);
    assert_int_equal(len, VM_STREAM_CHUNK_MAX);
    assert_memory_equal(data, chunk, len);
    g_clear_pointer(&got, vm_message_free);

    got = vm_message_read_fd(sv[1], &eof, &error);
    assert_null(error);
    assert_int_equal(got->op, VM_OP_PING);
    g_clear_pointer(&got, vm_message_free);

    /* Then the clean end of the stream. */
    got = vm_message_read_fd(sv[1], &eof, &error);
    assert_null(got);
    assert_null(error);
    assert_true(eof);
    close(sv[1]);
}

/* ---------------------------------------------------------------------------------------------
 * Accessors and constructors */

static void
test_accessors(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) msg = NULL;
    g_autoptr(GVariant) value = NULL;
    g_auto(GStrv) argv = NULL;
    gsize len = 99;

    msg = vm_message_new(VM_OP_EXEC,
                         g_variant_new_parsed("{'name': <'alice'>, 'argv': <['ls', '-l']>, "
                                              "'tty': <true>, 'cols': <uint32 80>}"),
                         &error);
    assert_null(error);
    assert_string_equal(vm_message_get_string(msg, "name", NULL), "alice");
    assert_string_equal(vm_message_get_string(msg, "cwd", "/home"), "/home");
    assert_int_equal(vm_message_get_uint(msg, "cols", 0), 80);
    assert_int_equal(vm_message_get_uint(msg, "rows", 24), 24);
    assert_true(vm_message_get_bool(msg, "tty", FALSE));
    /* A key of another type reads as absent. */
    assert_int_equal(vm_message_get_uint(msg, "name", 7), 7);
    argv = vm_message_dup_strv(msg, "argv");
    assert_non_null(argv);
    assert_int_equal(g_strv_length(argv), 2);
    assert_string_equal(argv[1], "-l");
    assert_null(vm_message_dup_strv(msg, "env"));
    value = vm_message_lookup(msg, "argv");
    assert_non_null(value);
    assert_true(g_variant_is_of_type(value, G_VARIANT_TYPE_STRING_ARRAY));
    assert_null(vm_message_lookup(msg, "env"));
    g_clear_pointer(&msg, vm_message_free);

    msg = vm_message_new(VM_OP_EXIT, g_variant_new_parsed("{'status': <-3>}"), &error);
    assert_int_equal(vm_message_get_int(msg, "status", 0), -3);
    assert_null(vm_message_get_data(msg, "data", &len));
    assert_int_equal(len, 99);
    g_clear_pointer(&msg, vm_message_free);

    /* Empty data is present, not absent. */
    msg = vm_message_new_data(VM_OP_STDIN, NULL, 0);
    assert_non_null(msg);
    assert_non_null(vm_message_get_data(msg, "data", &len));
    assert_int_equal(len, 0);
}

static void
test_progress(void **state)
{
    g_autoptr(VmMessage) known = vm_message_new_progress("copying", 0.5);
    g_autoptr(VmMessage) unknown = vm_message_new_progress("waiting", -1);
    g_autoptr(VmMessage) over = vm_message_new_progress("done", 1.5);
    g_autoptr(VmMessage) nan = vm_message_new_progress(NULL, NAN);

    assert_int_equal(known->op, VM_OP_PROGRESS);
    assert_string_equal(vm_message_get_string(known, "message", NULL), "copying");
    assert_true(vm_message_get_double(known, "fraction", -1) == 0.5);
    assert_null(vm_message_lookup(unknown, "fraction"));
    assert_true(vm_message_get_double(over, "fraction", -1) == 1.0);
    assert_null(vm_message_lookup(nan, "fraction"));
    assert_string_equal(vm_message_get_string(nan, "message", NULL), "");
}

static void
test_error_messages(void **state)
{
    g_autoptr(GError) vm = g_error_new(VM_ERROR, VM_ERROR_NOT_FOUND, "no agent 'x'");
    g_autoptr(GError) foreign = g_error_new(G_FILE_ERROR, G_FILE_ERROR_NOENT, "gone");
    g_autoptr(GError) bad_utf8 = g_error_new(VM_ERROR, VM_ERROR_IO, "file \xff\xfe");
    g_autoptr(GError) back = NULL;
    g_autoptr(VmMessage) msg = NULL;
    g_autoptr(VmMessage) ping = NULL;

    msg = vm_message_new_error(vm);
    assert_int_equal(msg->op, VM_OP_ERROR);
    assert_false(vm_message_to_error(msg, &back));
    assert_true(g_error_matches(back, VM_ERROR, VM_ERROR_NOT_FOUND));
    assert_string_equal(back->message, "no agent 'x'");
    g_clear_error(&back);
    g_clear_pointer(&msg, vm_message_free);

    msg = vm_message_new_error(foreign);
    assert_int_equal(vm_message_get_uint(msg, "code", 0), VM_ERROR_FAILED);
    assert_string_equal(vm_message_get_string(msg, "message", NULL), "gone");
    g_clear_pointer(&msg, vm_message_free);

    /* Messages carrying file names may be any bytes; the wire only carries UTF-8. */
    msg = vm_message_new_error(bad_utf8);
    assert_non_null(msg);
    assert_true(g_utf8_validate(vm_message_get_string(msg, "message", ""), -1, NULL));
    assert_true(g_str_has_prefix(vm_message_get_string(msg, "message", ""), "file "));

    ping = vm_message_new(VM_OP_PING, NULL, NULL);
    assert_false(vm_message_to_error(ping, &back));
    assert_true(g_error_matches(back, VM_ERROR, VM_ERROR_PROTOCOL));
}

/* vm_message_new() owns what it is given, also on failure, and sinks floating refs (leaks and
 * double unrefs show under the sanitizer build). */
static void
test_new_ownership(void **state)
{
    g_autoptr(GError) error = NULL;
    GVariant *fields = g_variant_ref_sink(g_variant_new_parsed("{'name': <'a'>}"));
    g_autoptr(VmMessage) msg = NULL;

    msg = vm_message_new(VM_OP_PING, g_variant_ref(fields), &error);
    assert_null(msg);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    g_clear_error(&error);

    msg = vm_message_new(VM_OP_AGENT_INFO, g_variant_ref(fields), &error);
    assert_non_null(msg);
    assert_false(g_variant_is_floating(msg->fields));
    g_clear_pointer(&msg, vm_message_free);
    /* Still ours: a message that dropped a reference it did not own would break this. */
    assert_string_equal(g_variant_get_type_string(fields), "a{sv}");
    g_variant_unref(fields);

    msg = vm_message_new(VM_OP_AGENT_INFO, g_variant_new_string("a"), &error);
    assert_null(msg);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
}

static void
test_encode_too_big(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *text = g_strnfill(VM_FRAME_MAX, 'x');
    g_autoptr(VmMessage) msg =
        vm_message_new(VM_OP_RESULT, vardict_with("config", g_variant_new_string(text)), &error);
    g_autoptr(GBytes) frame = NULL;
    int sv[2];

    assert_non_null(msg);
    frame = vm_message_encode(msg, &error);
    assert_null(frame);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    g_clear_error(&error);

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_false(vm_message_write_fd(sv[0], msg, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    close(sv[0]);
    close(sv[1]);
}

/* ---------------------------------------------------------------------------------------------
 * Bad frames */

typedef enum {
    BAD_SCHEMA, /* well-formed payload the schema refuses (vm_message_new refuses it too) */
    BAD_WIRE,   /* payload that is not a message at all */
} BadKind;

typedef struct {
    const char *what;
    BadKind kind;
    guint32 op;
    GVariant *(*fields)(void);
    const char *text;     /* fields in text form, when @fields is NULL */
    GBytes *(*raw)(void); /* whole payload, for BAD_WIRE */
} BadCase;

static GVariant *
too_much_user_data(void)
{
    return agent_new_with_user_data(VM_USER_DATA_MAX + 1);
}

static GVariant *
too_many_args(void)
{
    return exec_with_argv(VM_ARGV_MAX + 1);
}

static GVariant *
too_many_env(void)
{
    return exec_with_env(VM_ARGV_MAX + 1, "A=b");
}

static GVariant *
too_much_data(void)
{
    return data_of(VM_STREAM_CHUNK_MAX + 1);
}

static GBytes *
wrong_top_type(void)
{
    g_autoptr(GVariant) v = g_variant_ref_sink(g_variant_new_parsed("('ping', @a{sv} {})"));

    return g_variant_get_data_as_bytes(v);
}

static GBytes *
empty_payload(void)
{
    return g_bytes_new(NULL, 0);
}

static GBytes *
garbage_payload(void)
{
    static const guint8 junk[] = {0x01, 0x00, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x07};

    return g_bytes_new(junk, sizeof(junk));
}

/* The payload of @op with @fields, where the byte at @at of the first run of the 3 bytes of
 * @marker (the serialised @what) becomes @value. */
static GBytes *
patched_payload(guint32 op, GVariant *fields, const char *marker, gsize at, guint8 value,
                const char *what)
{
    g_autoptr(GBytes) good = raw_payload(op, fields);
    gsize len;
    guint8 *data = g_bytes_unref_to_data(g_bytes_ref(good), &len);

    for (gsize i = 0; i + 2 < len; i++) {
        if (memcmp(data + i, marker, 3) == 0) {
            data[i + at] = value;
            return g_bytes_new_take(data, len);
        }
    }
    g_free(data);
    fail_msg("no %s found in the payload", what);
    return NULL;
}

/* A boolean serialised as 2: readable, but not in normal form. */
static GBytes *
non_normal_bool(void)
{
    /* true, the 0 that ends a variant's value, then its type */
    static const char serialised[] = {0x01, 0x00, 'b'};

    return patched_payload(VM_OP_AGENT_START,
                           g_variant_new_parsed("{'name': <'a'>, 'wait': <true>}"), serialised, 0,
                           0x02, "boolean");
}

/* A string whose bytes are not UTF-8. */
static GBytes *
non_utf8_string(void)
{
    return patched_payload(VM_OP_AGENT_INFO, g_variant_new_parsed("{'name': <'abc'>}"), "abc", 1,
                           0xff, "string");
}

/* A secret's value one byte over VM_SECRET_VALUE_MAX. */
static GVariant *
too_long_secret(void)
{
    g_autofree guint8 *bytes = g_malloc0(VM_SECRET_VALUE_MAX + 1);
    GVariantBuilder b;

    memset(bytes, 'x', VM_SECRET_VALUE_MAX + 1);
    g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "secret", g_variant_new_string("a"));
    g_variant_builder_add(
        &b, "{sv}", "value",
        g_variant_new_fixed_array(G_VARIANT_TYPE_BYTE, bytes, VM_SECRET_VALUE_MAX + 1, 1));
    return g_variant_builder_end(&b);
}

static const BadCase bad_cases[] = {
    {"wrong top-level type", BAD_WIRE, 0, NULL, NULL, wrong_top_type},
    {"empty payload", BAD_WIRE, 0, NULL, NULL, empty_payload},
    {"garbage", BAD_WIRE, 0, NULL, NULL, garbage_payload},
    {"non-normal boolean", BAD_WIRE, 0, NULL, NULL, non_normal_bool},
    {"non-UTF-8 string", BAD_WIRE, 0, NULL, NULL, non_utf8_string},
    {"op zero", BAD_SCHEMA, 0, NULL, "@a{sv} {}"},
    {"unknown op", BAD_SCHEMA, 999, NULL, "@a{sv} {}"},
    {"op between ranges", BAD_SCHEMA, 12, NULL, "@a{sv} {}"},
    {"unknown key", BAD_SCHEMA, VM_OP_AGENT_INFO, NULL, "{'name': <'a'>, 'bogus': <1>}"},
    {"key on a keyless op", BAD_SCHEMA, VM_OP_PING, NULL, "{'name': <'a'>}"},
    {"wrong key type", BAD_SCHEMA, VM_OP_AGENT_INFO, NULL, "{'name': <uint32 3>}"},
    {"int for uint", BAD_SCHEMA, VM_OP_AGENT_NEW, NULL, "{'name': <'a'>, 'cpus': <2>}"},
    {"missing required key", BAD_SCHEMA, VM_OP_AGENT_INFO, NULL, "@a{sv} {}"},
    {"missing argv", BAD_SCHEMA, VM_OP_EXEC, NULL, "{'name': <'a'>}"},
    {"repeated key", BAD_SCHEMA, VM_OP_AGENT_INFO, NULL, "{'name': <'a'>, 'name': <'b'>}"},
    {"oversized user_data", BAD_SCHEMA, VM_OP_AGENT_NEW, too_much_user_data},
    {"too many argv", BAD_SCHEMA, VM_OP_EXEC, too_many_args},
    {"too many env", BAD_SCHEMA, VM_OP_EXEC, too_many_env},
    {"env without =", BAD_SCHEMA, VM_OP_EXEC, NULL,
     "{'name': <'a'>, 'argv': <['true']>, 'env': <['PATH']>}"},
    {"env with empty name", BAD_SCHEMA, VM_OP_EXEC, NULL,
     "{'name': <'a'>, 'argv': <['true']>, 'env': <['=x']>}"},
    {"empty argv", BAD_SCHEMA, VM_OP_EXEC, NULL, "{'name': <'a'>, 'argv': <@as []>}"},
    {"guest port 0", BAD_SCHEMA, VM_OP_FORWARD_ADD, NULL,
     "{'name': <'a'>, 'guest_port': <uint32 0>}"},
    {"guest port past 65535", BAD_SCHEMA, VM_OP_FORWARD_RM, NULL,
     "{'name': <'a'>, 'guest_port': <uint32 65536>}"},
    {"host port 0", BAD_SCHEMA, VM_OP_FORWARD_ADD, NULL,
     "{'name': <'a'>, 'guest_port': <uint32 80>, 'host_port': <uint32 0>}"},
    {"oversized stdin", BAD_SCHEMA, VM_OP_STDIN, too_much_data},
    {"oversized stdout", BAD_SCHEMA, VM_OP_STDOUT, too_much_data},
    {"oversized stderr", BAD_SCHEMA, VM_OP_STDERR, too_much_data},
    {"stdout without data", BAD_SCHEMA, VM_OP_STDOUT, NULL, "@a{sv} {}"},
    {"error code 0", BAD_SCHEMA, VM_OP_ERROR, NULL, "{'code': <uint32 0>, 'message': <'x'>}"},
    {"error code past last", BAD_SCHEMA, VM_OP_ERROR, NULL,
     "{'code': <uint32 18>, 'message': <'x'>}"},
    {"error without message", BAD_SCHEMA, VM_OP_ERROR, NULL, "{'code': <uint32 1>}"},
    {"fraction over 1", BAD_SCHEMA, VM_OP_PROGRESS, NULL, "{'message': <'x'>, 'fraction': <1.5>}"},
    {"negative fraction", BAD_SCHEMA, VM_OP_PROGRESS, NULL,
     "{'message': <'x'>, 'fraction': <-0.5>}"},
    {"window too wide", BAD_SCHEMA, VM_OP_WINDOW_SIZE, NULL,
     "{'cols': <uint32 65536>, 'rows': <uint32 1>}"},
    {"window without rows", BAD_SCHEMA, VM_OP_WINDOW_SIZE, NULL, "{'cols': <uint32 80>}"},
    /* A secret's value is bytes, not a string (no UTF-8 rule on a credential); hostd itself
     * refuses an empty one, with a better message than a protocol error. */
    {"secret without value", BAD_SCHEMA, VM_OP_SECRET_CREATE, NULL,
     "{'secret': <'a'>, 'hosts': <['h']>}"},
    {"oversized secret value", BAD_SCHEMA, VM_OP_SECRET_SET, too_long_secret},
    {"secret value as string", BAD_SCHEMA, VM_OP_SECRET_SET, NULL,
     "{'secret': <'a'>, 'value': <'x'>}"},
    {"secret without hosts", BAD_SCHEMA, VM_OP_SECRET_CREATE, NULL,
     "{'secret': <'a'>, 'hosts': <@as []>, 'value': <b'x'>}"},
    {"grant without agent", BAD_SCHEMA, VM_OP_SECRET_GRANT, NULL, "{'secret': <'a'>}"},
    {"exit status as uint", BAD_SCHEMA, VM_OP_EXIT, NULL, "{'status': <uint32 0>}"},
};

static GVariant *
bad_case_fields(const BadCase *c)
{
    return c->fields != NULL ? c->fields() : g_variant_new_parsed(c->text);
}

static GBytes *
bad_case_payload(const BadCase *c)
{
    return c->kind == BAD_WIRE ? c->raw() : raw_payload(c->op, bad_case_fields(c));
}

static void
test_bad_payloads(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        const BadCase *c = &bad_cases[i];
        g_autoptr(GError) error = NULL;
        g_autoptr(GBytes) payload = bad_case_payload(c);
        g_autoptr(VmMessage) msg = NULL;
        gsize len;
        const guint8 *data = g_bytes_get_data(payload, &len);

        msg = vm_message_decode(data, len, &error);
        if (msg != NULL || !g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
            fail_msg("%s: decoded, or wrong error", c->what);

        if (c->kind == BAD_SCHEMA) {
            g_clear_error(&error);
            msg = vm_message_new(c->op, bad_case_fields(c), &error);
            if (msg != NULL || !g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
                fail_msg("%s: vm_message_new accepted it", c->what);
        }
    }
}

/* The same limits, exactly at the edge, are accepted. */
static void
test_limits_accepted(void **state)
{
    struct {
        VmOp op;
        GVariant *fields;
    } cases[] = {
        {VM_OP_AGENT_NEW, agent_new_with_user_data(VM_USER_DATA_MAX)},
        {VM_OP_EXEC, exec_with_argv(VM_ARGV_MAX)},
        {VM_OP_EXEC, exec_with_env(VM_ARGV_MAX, "A=")},
        {VM_OP_STDIN, data_of(VM_STREAM_CHUNK_MAX)},
        {VM_OP_ERROR, g_variant_new_parsed("{'code': <uint32 16>, 'message': <''>}")},
        {VM_OP_PROGRESS, g_variant_new_parsed("{'message': <''>, 'fraction': <1.0>}")},
        {VM_OP_WINDOW_SIZE, g_variant_new_parsed("{'cols': <uint32 65535>, 'rows': <uint32 0>}")},
        {VM_OP_FORWARD_ADD, g_variant_new_parsed("{'name': <'a'>, 'guest_port': <uint32 65535>, "
                                                 "'host_port': <uint32 1>}")},
    };

    assert_int_equal(VM_ERROR_WIRE_LAST, 16);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GBytes) frame = NULL;
        g_autoptr(VmMessage) msg = vm_message_new(cases[i].op, cases[i].fields, &error);
        g_autoptr(VmMessage) back = NULL;
        gsize len;
        const guint8 *data;

        if (msg == NULL)
            fail_msg("case %zu: %s", i, error->message);
        frame = vm_message_encode(msg, &error);
        assert_non_null(frame);
        data = g_bytes_get_data(frame, &len);
        back = vm_message_decode(data + 4, len - 4, &error);
        if (back == NULL)
            fail_msg("case %zu: %s", i, error->message);
    }
}

typedef struct {
    int fd;
    GBytes *bytes;
} Writer;

static gpointer
writer_thread(gpointer data)
{
    Writer *w = data;
    gsize len;
    const guint8 *p = g_bytes_get_data(w->bytes, &len);

    while (len > 0) {
        gssize n = write(w->fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        p += n;
        len -= n;
    }
    close(w->fd);
    return NULL;
}

/* Feeds @bytes through a pipe (from a thread, as frames may exceed the pipe buffer) and reads one
 * frame. */
static VmMessage *
read_through_pipe(GBytes *bytes, gboolean *ret_eof, GError **error)
{
    int p[2];
    Writer w;
    GThread *thread;
    VmMessage *msg;

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    w.fd = p[1];
    w.bytes = bytes;
    thread = g_thread_new("writer", writer_thread, &w);
    msg = vm_message_read_fd(p[0], ret_eof, error);
    close(p[0]);
    g_thread_join(thread);
    return msg;
}

static void
test_bad_frames_fd(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(bad_cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GBytes) payload = bad_case_payload(&bad_cases[i]);
        g_autoptr(GBytes) frame = frame_of(payload);
        g_autoptr(VmMessage) msg = NULL;
        gboolean eof = TRUE;

        msg = read_through_pipe(frame, &eof, &error);
        if (msg != NULL || !g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
            fail_msg("%s: read, or wrong error", bad_cases[i].what);
        assert_false(eof);
    }
}

static void
test_truncated(void **state)
{
    g_autoptr(VmMessage) ping = vm_message_new(VM_OP_PING, NULL, NULL);
    g_autoptr(GBytes) frame = vm_message_encode(ping, NULL);
    gsize len;
    const guint8 *data = g_bytes_get_data(frame, &len);

    /* Every proper prefix but the empty one is a truncated frame. */
    for (gsize cut = 1; cut < len; cut++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GBytes) prefix = g_bytes_new(data, cut);
        g_autoptr(VmMessage) msg = NULL;
        gboolean eof = TRUE;

        msg = read_through_pipe(prefix, &eof, &error);
        assert_null(msg);
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL))
            fail_msg("prefix of %zu bytes: wrong error", cut);
        assert_false(eof);
    }
}

static void
test_eof(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GBytes) nothing = g_bytes_new(NULL, 0);
    g_autoptr(VmMessage) msg = NULL;
    gboolean eof = FALSE;

    msg = read_through_pipe(nothing, &eof, &error);
    assert_null(msg);
    assert_null(error);
    assert_true(eof);

    /* Without a place to report EOF, it is an error. */
    msg = read_through_pipe(nothing, NULL, &error);
    assert_null(msg);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
}

static void
on_alarm(int sig)
{
    /* Reaching here means the reader waited for a payload it should have refused. */
    _exit(99);
}

/* An oversized length is refused from the header alone: nothing after it is read, and the
 * writer keeps the pipe open, so a reader that waited for the payload would hang. */
static void
test_oversized_length(void **state)
{
    static const guint32 lengths[] = {VM_FRAME_MAX + 1, 0x7fffffff, 0xffffffff};

    for (gsize i = 0; i < G_N_ELEMENTS(lengths); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) msg = NULL;
        guint8 buf[4 + 16] = {0};
        int p[2];
        int left = 0;
        gboolean eof = TRUE;

        buf[0] = lengths[i] >> 24;
        buf[1] = lengths[i] >> 16;
        buf[2] = lengths[i] >> 8;
        buf[3] = lengths[i];
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        assert_int_equal(write(p[1], buf, sizeof(buf)), sizeof(buf));

        signal(SIGALRM, on_alarm);
        alarm(10);
        msg = vm_message_read_fd(p[0], &eof, &error);
        alarm(0);
        signal(SIGALRM, SIG_DFL);

        assert_null(msg);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        assert_non_null(strstr(error->message, "over the limit"));
        assert_int_equal(ioctl(p[0], FIONREAD, &left), 0);
        assert_int_equal(left, 16);
        close(p[0]);
        close(p[1]);
    }
}

/* The exact limit is still a valid length: it fails for its content, not for its size. */
static void
test_frame_max_length(void **state)
{
    g_autofree guint8 *payload = g_malloc0(VM_FRAME_MAX);
    g_autoptr(GBytes) bytes = g_bytes_new_take(g_steal_pointer(&payload), VM_FRAME_MAX);
    g_autoptr(GBytes) frame = frame_of(bytes);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) msg = read_through_pipe(frame, NULL, &error);

    assert_null(msg);
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    assert_null(strstr(error->message, "over the limit"));
    assert_null(strstr(error->message, "truncated"));
}

static void
test_write_closed(void **state)
{
    g_autoptr(VmMessage) ping = vm_message_new(VM_OP_PING, NULL, NULL);
    g_autoptr(GError) error = NULL;
    int sv[2];
    int p[2];

    /* With the default SIGPIPE disposition, a raised signal would kill the test. */
    signal(SIGPIPE, SIG_DFL);

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    close(sv[1]);
    assert_false(vm_message_write_fd(sv[0], ping, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    close(sv[0]);
    g_clear_error(&error);

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    close(p[0]);
    assert_false(vm_message_write_fd(p[1], ping, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    close(p[1]);
    signal(SIGPIPE, SIG_IGN);
}

static void
test_write_to_pipe(void **state)
{
    g_autoptr(VmMessage) exit_msg =
        vm_message_new(VM_OP_EXIT, g_variant_new_parsed("{'status': <42>}"), NULL);
    g_autoptr(VmMessage) got = NULL;
    g_autoptr(GError) error = NULL;
    int p[2];

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    assert_true(vm_message_write_fd(p[1], exit_msg, &error));
    close(p[1]);
    got = vm_message_read_fd(p[0], NULL, &error);
    assert_non_null(got);
    assert_int_equal(vm_message_get_int(got, "status", 0), 42);
    close(p[0]);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_names),         cmocka_unit_test(test_op_numbers),
        cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_round_trip_fd),
        cmocka_unit_test(test_accessors),        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_error_messages),   cmocka_unit_test(test_new_ownership),
        cmocka_unit_test(test_encode_too_big),   cmocka_unit_test(test_bad_payloads),
        cmocka_unit_test(test_limits_accepted),  cmocka_unit_test(test_bad_frames_fd),
        cmocka_unit_test(test_truncated),        cmocka_unit_test(test_eof),
        cmocka_unit_test(test_oversized_length), cmocka_unit_test(test_frame_max_length),
        cmocka_unit_test(test_write_closed),     cmocka_unit_test(test_write_to_pipe),
    };

    /* The pipe writer thread may outlive a reader that gave up. */
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
