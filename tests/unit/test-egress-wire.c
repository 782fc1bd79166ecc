/* The framed messages between hostd and an egress worker: what hostd reads from a worker it does
 * not trust is bounded and typed, and the grants survive the trip whole. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vm-egress-wire.h"
#include "vm-error.h"

typedef struct {
    int fds[2];
} Pair;

static int
setup(void **state)
{
    Pair *p = g_new0(Pair, 1);

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p->fds), 0);
    *state = p;
    return 0;
}

static int
teardown(void **state)
{
    Pair *p = *state;

    close(p->fds[0]);
    if (p->fds[1] >= 0)
        close(p->fds[1]);
    g_free(p);
    return 0;
}

static void
send_raw(int fd, guint32 len, const void *data, gsize data_len)
{
    guint8 header[4] = {(guint8)(len >> 24), (guint8)(len >> 16), (guint8)(len >> 8), (guint8)len};

    assert_int_equal(write(fd, header, 4), 4);
    if (data_len > 0)
        assert_int_equal(write(fd, data, data_len), (gssize)data_len);
}

static void
test_round_trip(void **state)
{
    Pair *p = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) payload = NULL;
    guint32 serial, connections;

    assert_true(vm_wire_send(p->fds[0], "stats", g_variant_new("(uu)", 7, 3), &error));
    payload = vm_wire_recv(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX, &kind, &error);
    assert_non_null(payload);
    assert_string_equal(kind, "stats");
    assert_true(g_variant_is_of_type(payload, G_VARIANT_TYPE("(uu)")));
    g_variant_get(payload, "(uu)", &serial, &connections);
    assert_int_equal(serial, 7);
    assert_int_equal(connections, 3);
}

/* A frame longer than the bound is refused before its bytes are read. */
static void
test_too_long(void **state)
{
    Pair *p = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;

    send_raw(p->fds[0], VM_EGRESS_WIRE_FROM_WORKER_MAX + 1, NULL, 0);
    assert_null(vm_wire_recv(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX, &kind, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
}

/* A frame cut short is an error, a channel closed between frames its end. */
static void
test_cut_short_and_end(void **state)
{
    Pair *p = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) end = NULL;
    g_autofree char *kind = NULL;
    g_autofree char *kind2 = NULL;
    int fds[2];

    send_raw(p->fds[0], 100, "abc", 3);
    close(p->fds[0]);
    p->fds[0] = -1;
    assert_null(vm_wire_recv(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX, &kind, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    close(fds[0]);
    assert_null(vm_wire_recv(fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX, &kind2, &end));
    assert_true(g_error_matches(end, VM_ERROR, VM_ERROR_NOT_RUNNING));
    close(fds[1]);
    p->fds[0] = dup(p->fds[1]); /* for teardown */
}

/* A byte every 50 ms, for a second: each read would be quick. */
static gpointer
dribble(gpointer data)
{
    int fd = GPOINTER_TO_INT(data);

    for (guint i = 0; i < 20; i++) {
        g_usleep(G_USEC_PER_SEC / 20);
        if (write(fd, "b", 1) != 1)
            break;
    }
    return NULL;
}

/* The deadline bounds the whole frame, not each read: a peer that sends nothing, or a header and
 * then a byte now and then, is given up on once it passes; a frame that comes in time is read. */
static void
test_deadline(void **state)
{
    Pair *p = *state;
    g_autoptr(GError) silent = NULL;
    g_autoptr(GError) dribbled = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *kind = NULL;
    g_autoptr(GVariant) payload = NULL;
    gint64 start = g_get_monotonic_time();
    GThread *dribbler;

    assert_null(vm_wire_recv_until(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX,
                                   start + G_USEC_PER_SEC / 5, &kind, &silent));
    assert_true(g_error_matches(silent, VM_ERROR, VM_ERROR_TIMEOUT));
    assert_true(g_get_monotonic_time() - start >= G_USEC_PER_SEC / 5);

    send_raw(p->fds[0], 100, "a", 1);
    start = g_get_monotonic_time();
    dribbler = g_thread_new("dribble", dribble, GINT_TO_POINTER(p->fds[0]));
    assert_null(vm_wire_recv_until(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX,
                                   start + G_USEC_PER_SEC / 5, &kind, &dribbled));
    assert_true(g_error_matches(dribbled, VM_ERROR, VM_ERROR_TIMEOUT));
    assert_true(g_get_monotonic_time() - start < G_USEC_PER_SEC / 2);
    g_thread_join(dribbler);

    /* A fresh channel: the one above is of no further use. */
    close(p->fds[0]);
    close(p->fds[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p->fds), 0);
    assert_true(vm_wire_send(p->fds[0], "stats", g_variant_new("(uu)", 1, 2), &error));
    payload = vm_wire_recv_until(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX,
                                 g_get_monotonic_time() + G_USEC_PER_SEC, &kind, &error);
    assert_null(error);
    assert_non_null(payload);
    assert_string_equal(kind, "stats");
}

/* Bytes that are not a (sv) message in normal form are refused, whatever they hold. */
static void
test_not_a_message(void **state)
{
    Pair *p = *state;
    static const guint8 garbage[] = {0xff, 0xff, 0xff, 0xff, 0x00, 0x01, 0x02, 0x03, 0x04};
    /* a (sv) whose variant's type string is not a type: not in normal form */
    static const guint8 bad_type[] = {'l', 'o', 'g', 0, 'x', 0, '(', '(', 4};

    for (gsize i = 0; i < 2; i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *kind = NULL;
        const guint8 *data = i == 0 ? garbage : bad_type;
        gsize len = i == 0 ? sizeof(garbage) : sizeof(bad_type);

        send_raw(p->fds[0], (guint32)len, data, len);
        assert_null(vm_wire_recv(p->fds[1], VM_EGRESS_WIRE_FROM_WORKER_MAX, &kind, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    }
}

/* Grants go to the worker whole: the same hosts intercepted, the same values substituted. */
static void
test_credentials(void **state)
{
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    g_autoptr(VmEgressCredentials) back = NULL;
    g_autoptr(GVariant) payload = NULL;
    g_autoptr(GError) error = NULL;
    const char *hosts[] = {"api.example.com", "*.example.org", NULL};
    g_autoptr(GVariant) wrong = g_variant_ref_sink(g_variant_new_string("x"));
    g_autoptr(GVariant) again = NULL;

    assert_true(vm_egress_credentials_add(creds, "token", "PLACEHOLDER-1", "s3cret", hosts,
                                          "X-Api-Key", "Bearer {}", &error));
    payload = g_variant_ref_sink(vm_egress_wire_credentials(creds));
    back = vm_egress_wire_credentials_parse(payload, &error);
    assert_non_null(back);
    assert_int_equal(vm_egress_credentials_size(back), 1);
    assert_true(vm_egress_credentials_intercepts(back, "api.example.com"));
    assert_true(vm_egress_credentials_intercepts(back, "a.example.org"));
    assert_false(vm_egress_credentials_intercepts(back, "example.net"));
    again = g_variant_ref_sink(vm_egress_wire_credentials(back));
    assert_true(g_variant_equal(payload, again));

    assert_null(vm_egress_wire_credentials_parse(wrong, &error));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_too_long, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cut_short_and_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test(test_credentials),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
