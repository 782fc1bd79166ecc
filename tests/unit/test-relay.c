/* The wake-on-connect relay: bytes pass intact both ways with half-close, the wake runs once per
 * connection before the backend sees it and can refuse it, one slow wake does not hold up other
 * agents, the counters follow the connections, and removal frees the port. Everything runs on
 * 127.0.0.1 with ports the kernel picked, against an echo backend the test runs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hostd-relay.h"
#include "vm-error.h"
#include "vm-util.h"
#include "test-sink.h"

/* What the echo backend appends once it has seen the client's FIN. */
#define ECHO_TRAILER "<eof>"

/* Longest any single wait in a test may take before it counts as a hang. */
#define HANG_LIMIT_US (10 * G_TIME_SPAN_SECOND)

/* ---- echo backend -------------------------------------------------------------------------- */

/* Echoes every byte back; on the client's FIN it sends ECHO_TRAILER and closes. */
typedef struct {
    int listen_fd;
    guint port;
    GThread *thread;
    GMutex lock;
    GPtrArray *conn_threads;
    GArray *conn_fds;
    gint accepts;
    gboolean stop;
} EchoServer;

static void
write_all(int fd, const void *data, gsize len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* the peer went away; the reader notices */
        p += n;
        len -= n;
    }
}

static gpointer
echo_conn_thread(gpointer data)
{
    int fd = GPOINTER_TO_INT(data);
    g_autofree char *buf = g_malloc(65536);

    for (;;) {
        ssize_t n = read(fd, buf, 65536);

        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            write_all(fd, ECHO_TRAILER, strlen(ECHO_TRAILER));
        if (n <= 0)
            break;
        write_all(fd, buf, n);
    }
    shutdown(fd, SHUT_WR);
    return NULL;
}

static gpointer
echo_accept_thread(gpointer data)
{
    EchoServer *e = data;

    while (!g_atomic_int_get(&e->stop)) {
        struct pollfd pfd = {.fd = e->listen_fd, .events = POLLIN};
        int fd;

        if (poll(&pfd, 1, 20) <= 0)
            continue;
        fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        g_atomic_int_inc(&e->accepts);
        g_mutex_lock(&e->lock);
        g_array_append_val(e->conn_fds, fd);
        g_ptr_array_add(e->conn_threads,
                        g_thread_new("echo-conn", echo_conn_thread, GINT_TO_POINTER(fd)));
        g_mutex_unlock(&e->lock);
    }
    return NULL;
}

/* Binds 127.0.0.1:@port (0: any) and listens; returns the socket. */
static int
listen_on(guint port)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;

    assert_true(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static EchoServer *
echo_start(guint port)
{
    EchoServer *e = g_new0(EchoServer, 1);
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);

    e->listen_fd = listen_on(port);
    assert_true(e->listen_fd >= 0);
    assert_int_equal(getsockname(e->listen_fd, (struct sockaddr *)&sa, &len), 0);
    e->port = ntohs(sa.sin_port);
    g_mutex_init(&e->lock);
    e->conn_threads = g_ptr_array_new();
    e->conn_fds = g_array_new(FALSE, FALSE, sizeof(int));
    e->thread = g_thread_new("echo", echo_accept_thread, e);
    return e;
}

static void
echo_stop(EchoServer *e)
{
    if (e == NULL)
        return;
    g_atomic_int_set(&e->stop, TRUE);
    g_thread_join(e->thread);
    close(e->listen_fd);
    /* Unblock connection threads still reading, then reap them. */
    for (guint i = 0; i < e->conn_fds->len; i++)
        shutdown(g_array_index(e->conn_fds, int, i), SHUT_RDWR);
    for (guint i = 0; i < e->conn_threads->len; i++)
        g_thread_join(e->conn_threads->pdata[i]);
    for (guint i = 0; i < e->conn_fds->len; i++)
        close(g_array_index(e->conn_fds, int, i));
    g_ptr_array_free(e->conn_threads, TRUE);
    g_array_free(e->conn_fds, TRUE);
    g_mutex_clear(&e->lock);
    g_free(e);
}

/* ---- clients ------------------------------------------------------------------------------- */

/* A blocking client connected to 127.0.0.1:@port whose reads give up after the hang limit. */
static int
client_connect(guint port)
{
    return vm_test_connect_loopback(port, HANG_LIMIT_US / G_TIME_SPAN_SECOND);
}

/* Reads until EOF (or a reset, which also ends the stream). Fails the test on a timeout. */
static GByteArray *
read_to_eof(int fd)
{
    GByteArray *out = g_byte_array_new();
    g_autofree guint8 *buf = g_malloc(65536);

    for (;;) {
        ssize_t n = read(fd, buf, 65536);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            fail_msg("read timed out: the relay hangs");
        if (n <= 0)
            break;
        g_byte_array_append(out, buf, n);
    }
    return out;
}

/* Reads exactly @len bytes; fails the test on EOF or timeout. */
static void
read_exact(int fd, void *data, gsize len)
{
    char *p = data;

    while (len > 0) {
        ssize_t n = read(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("short read (%zd): %s", n, n < 0 ? g_strerror(errno) : "EOF");
        p += n;
        len -= n;
    }
}

/* One request/answer through a connection: sends @msg, expects it echoed. */
static void
ping(int fd, const char *msg)
{
    g_autofree char *back = g_malloc0(strlen(msg) + 1);

    write_all(fd, msg, strlen(msg));
    read_exact(fd, back, strlen(msg));
    assert_string_equal(back, msg);
}

/* Polls @cond until it holds; fails the test after the hang limit. */
#define WAIT_UNTIL(cond)                                                                           \
    do {                                                                                           \
        gint64 wait_deadline_ = g_get_monotonic_time() + HANG_LIMIT_US;                            \
        while (!(cond)) {                                                                          \
            if (g_get_monotonic_time() > wait_deadline_)                                           \
                fail_msg("timed out waiting for: %s", #cond);                                      \
            g_usleep(2000);                                                                        \
        }                                                                                          \
    } while (0)

/* ---- fixture ------------------------------------------------------------------------------- */

typedef struct {
    HostdRelay *relay;
    EchoServer *echo;
    GMutex lock;
    GCond cond;
    guint wakes;
    GArray *accepts_at_wake; /* the backend's accept count at each wake */
    gboolean refuse;
    const char *block_agent; /* wakes for this agent wait until gate_open */
    gboolean gate_open;
} Fixture;

static gboolean
fixture_wake(const char *agent, gpointer user_data, GError **error)
{
    Fixture *f = user_data;
    gint accepts = g_atomic_int_get(&f->echo->accepts);

    g_mutex_lock(&f->lock);
    f->wakes++;
    g_array_append_val(f->accepts_at_wake, accepts);
    while (f->block_agent != NULL && g_str_equal(agent, f->block_agent) && !f->gate_open)
        g_cond_wait(&f->cond, &f->lock);
    gboolean refuse = f->refuse;
    g_mutex_unlock(&f->lock);

    if (refuse)
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' cannot wake", agent);
    return TRUE;
}

static guint
fixture_wakes(Fixture *f)
{
    guint n;

    g_mutex_lock(&f->lock);
    n = f->wakes;
    g_mutex_unlock(&f->lock);
    return n;
}

static void
fixture_open_gate(Fixture *f)
{
    g_mutex_lock(&f->lock);
    f->gate_open = TRUE;
    g_cond_broadcast(&f->cond);
    g_mutex_unlock(&f->lock);
}

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    g_mutex_init(&f->lock);
    g_cond_init(&f->cond);
    f->accepts_at_wake = g_array_new(FALSE, FALSE, sizeof(gint));
    f->echo = echo_start(0);
    f->relay = hostd_relay_new(fixture_wake, f);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    /* A test that failed with a wake still blocked must not hang the free. */
    fixture_open_gate(f);
    hostd_relay_free(f->relay);
    echo_stop(f->echo);
    g_array_free(f->accepts_at_wake, TRUE);
    g_cond_clear(&f->cond);
    g_mutex_clear(&f->lock);
    g_free(f);
    return 0;
}

/* Serves @agent on a fresh public port in front of the echo backend; returns the port. */
static guint
add_agent(Fixture *f, const char *agent)
{
    g_autoptr(GError) error = NULL;
    guint port = vm_test_free_port();

    if (!hostd_relay_add(f->relay, agent, port, f->echo->port, &error))
        fail_msg("hostd_relay_add: %s", error->message);
    return port;
}

/* ---- tests --------------------------------------------------------------------------------- */

/* Streams @len random bytes through port @port while reading the echo; checks every byte and
 * the trailer that proves the FIN came through; returns MB/s (both directions counted once). */
static double
stream_through(guint port, const guint8 *data, gsize len)
{
    int fd = client_connect(port);
    gint64 start = g_get_monotonic_time();
    GThread *t = vm_test_send_thread(fd, data, len);
    g_autoptr(GByteArray) back = read_to_eof(fd);
    gint64 elapsed = g_get_monotonic_time() - start;

    g_thread_join(t);
    close(fd);
    assert_int_equal(back->len, len + strlen(ECHO_TRAILER));
    assert_memory_equal(back->data, data, len);
    assert_memory_equal(back->data + len, ECHO_TRAILER, strlen(ECHO_TRAILER));
    return (double)len / (1024.0 * 1024.0) / ((double)MAX(elapsed, 1) / G_TIME_SPAN_SECOND);
}

static void
test_bytes_both_ways(void **state)
{
    Fixture *f = *state;
    const gsize len = 16 * 1024 * 1024;
    g_autofree guint8 *data = g_malloc(len);
    g_autoptr(GRand) rand = g_rand_new_with_seed(42);
    guint port = add_agent(f, "alice");
    double relayed, direct;

    for (gsize i = 0; i < len; i += 4) {
        guint32 v = g_rand_int(rand);
        memcpy(data + i, &v, MIN(4, len - i));
    }
    relayed = stream_through(port, data, len);
    direct = stream_through(f->echo->port, data, len);
    printf("# throughput 16 MiB echoed: relay %.0f MB/s, direct %.0f MB/s (%.0f %%)\n", relayed,
           direct, 100.0 * relayed / direct);
    assert_int_equal(fixture_wakes(f), 1);
}

static void
test_half_close(void **state)
{
    Fixture *f = *state;
    guint port = add_agent(f, "alice");
    int fd = client_connect(port);

    write_all(fd, "hello", 5);
    assert_int_equal(shutdown(fd, SHUT_WR), 0);
    /* The backend answers after it saw the FIN: the reply still arrives, then EOF. */
    g_autoptr(GByteArray) back = read_to_eof(fd);
    close(fd);
    assert_int_equal(back->len, 5 + strlen(ECHO_TRAILER));
    assert_memory_equal(back->data, "hello" ECHO_TRAILER, back->len);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 0);
}

static void
test_wake_once_before_backend(void **state)
{
    Fixture *f = *state;
    guint port = add_agent(f, "alice");

    for (int i = 0; i < 3; i++) {
        int fd = client_connect(port);

        ping(fd, "x");
        close(fd);
    }
    assert_int_equal(fixture_wakes(f), 3);
    assert_int_equal(g_atomic_int_get(&f->echo->accepts), 3);
    /* Wake k ran while the backend had seen only the k connections before it. */
    for (guint k = 0; k < 3; k++)
        assert_int_equal(g_array_index(f->accepts_at_wake, gint, k), k);
}

static void
test_wake_refused(void **state)
{
    Fixture *f = *state;
    guint port = add_agent(f, "alice");
    int fd;

    f->refuse = TRUE;
    fd = client_connect(port);
    write_all(fd, "hello", 5);
    g_autoptr(GByteArray) back = read_to_eof(fd);
    close(fd);
    assert_int_equal(back->len, 0);
    assert_int_equal(fixture_wakes(f), 1);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 0);
    g_usleep(50 * 1000);
    assert_int_equal(g_atomic_int_get(&f->echo->accepts), 0);
}

static void
test_slow_wake_isolated(void **state)
{
    Fixture *f = *state;
    guint port_a, port_b;
    int fd_a, fd_b;
    gint64 start;

    f->block_agent = "alice";
    port_a = add_agent(f, "alice");
    port_b = add_agent(f, "bob");

    fd_a = client_connect(port_a);
    write_all(fd_a, "early", 5); /* buffered in the relay while alice wakes */
    WAIT_UNTIL(fixture_wakes(f) == 1);

    start = g_get_monotonic_time();
    fd_b = client_connect(port_b);
    ping(fd_b, "bob is served");
    assert_true(g_get_monotonic_time() - start < G_TIME_SPAN_SECOND);
    assert_int_equal(hostd_relay_open_connections(f->relay, "alice"), 1);

    fixture_open_gate(f);
    char back[6] = {0};
    read_exact(fd_a, back, 5);
    assert_string_equal(back, "early");
    ping(fd_a, "alice too");
    close(fd_a);
    close(fd_b);
}

static void
test_open_connections_count(void **state)
{
    Fixture *f = *state;
    guint port;
    int fd1, fd2;

    f->block_agent = "alice";
    port = add_agent(f, "alice");
    assert_int_equal(hostd_relay_open_connections(f->relay, "alice"), 0);
    assert_int_equal(hostd_relay_open_connections(f->relay, "nobody"), 0);

    /* Connections count from the accept, while they still wait for the wake. */
    fd1 = client_connect(port);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 1);
    fd2 = client_connect(port);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 2);

    fixture_open_gate(f);
    ping(fd1, "one");
    ping(fd2, "two");
    assert_int_equal(hostd_relay_open_connections(f->relay, "alice"), 2);

    close(fd1);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 1);
    ping(fd2, "still");
    close(fd2);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 0);
}

static void
test_last_activity(void **state)
{
    Fixture *f = *state;
    guint port = add_agent(f, "alice");
    gint64 t0 = hostd_relay_last_activity(f->relay, "alice");
    gint64 t1, t2;
    int fd;

    assert_true(t0 > 0);
    assert_true(t0 <= g_get_monotonic_time());
    assert_int_equal(hostd_relay_last_activity(f->relay, "nobody"), 0);

    g_usleep(5000);
    fd = client_connect(port);
    ping(fd, "a");
    /* The relay stamps its last send just after the client may already have read it. */
    g_usleep(5000);
    t1 = hostd_relay_last_activity(f->relay, "alice");
    assert_true(t1 > t0);

    /* No traffic: no movement. */
    g_usleep(20000);
    assert_int_equal(hostd_relay_last_activity(f->relay, "alice"), t1);

    ping(fd, "b");
    t2 = hostd_relay_last_activity(f->relay, "alice");
    assert_true(t2 >= t1 + 20000);
    close(fd);
    WAIT_UNTIL(hostd_relay_last_activity(f->relay, "alice") > t2);
}

static void
test_remove_closes_and_frees_port(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    guint port = add_agent(f, "alice");
    int fd = client_connect(port);
    int again;

    ping(fd, "hi");
    hostd_relay_remove(f->relay, "alice");

    /* The open connection is closed, and the port can be bound at once. */
    g_autoptr(GByteArray) back = read_to_eof(fd);
    close(fd);
    assert_int_equal(back->len, 0);
    assert_int_equal(hostd_relay_open_connections(f->relay, "alice"), 0);
    again = listen_on(port);
    assert_true(again >= 0);
    close(again);

    /* Removing twice or an unknown agent is harmless; the name can be served again. */
    hostd_relay_remove(f->relay, "alice");
    hostd_relay_remove(f->relay, "nobody");
    assert_true(hostd_relay_add(f->relay, "alice", port, f->echo->port, &error));
    fd = client_connect(port);
    ping(fd, "back");
    close(fd);
}

static void
test_add_refused(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    int taken = listen_on(0);
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    guint port;

    assert_true(taken >= 0);
    assert_int_equal(getsockname(taken, (struct sockaddr *)&sa, &len), 0);
    assert_false(hostd_relay_add(f->relay, "alice", ntohs(sa.sin_port), f->echo->port, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_non_null(strstr(error->message, "taken"));
    g_clear_error(&error);
    close(taken);

    port = add_agent(f, "alice");
    assert_false(hostd_relay_add(f->relay, "alice", vm_test_free_port(), f->echo->port, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_EXISTS));
    g_clear_error(&error);

    /* Another agent on alice's port. */
    assert_false(hostd_relay_add(f->relay, "bob", port, f->echo->port, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_int_equal(hostd_relay_open_connections(f->relay, "bob"), 0);
}

static void
test_backend_down(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    guint port = vm_test_free_port();
    guint dead = vm_test_free_port();
    gint64 start;
    int fd;

    while (dead == port)
        dead = vm_test_free_port();
    hostd_relay_set_backend_timeout(f->relay, 300);
    assert_true(hostd_relay_add(f->relay, "alice", port, dead, &error));
    start = g_get_monotonic_time();
    fd = client_connect(port);
    write_all(fd, "anyone?", 7);
    g_autoptr(GByteArray) back = read_to_eof(fd);
    close(fd);
    assert_int_equal(back->len, 0);
    assert_true(g_get_monotonic_time() - start < 3 * G_TIME_SPAN_SECOND);
    assert_int_equal(fixture_wakes(f), 1);
    WAIT_UNTIL(hostd_relay_open_connections(f->relay, "alice") == 0);
}

typedef struct {
    guint port;
    EchoServer *echo;
} LateBackend;

static gpointer
late_backend_thread(gpointer data)
{
    LateBackend *lb = data;

    g_usleep(300 * 1000);
    lb->echo = echo_start(lb->port);
    return NULL;
}

static void
test_backend_late(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    LateBackend lb = {.port = vm_test_free_port()};
    guint port = vm_test_free_port();
    GThread *t;
    int fd;

    while (port == lb.port)
        port = vm_test_free_port();
    /* Like a restored QEMU that listens a moment after the wake returned. */
    assert_true(hostd_relay_add(f->relay, "alice", port, lb.port, &error));
    t = g_thread_new("late", late_backend_thread, &lb);
    fd = client_connect(port);
    ping(fd, "patience");
    close(fd);
    g_thread_join(t);
    echo_stop(lb.echo);
}

static void
test_many_agents(void **state)
{
    Fixture *f = *state;
    enum { N = 100 };
    int fds[N];
    char name[32];

    for (int i = 0; i < N; i++) {
        g_snprintf(name, sizeof(name), "agent-%d", i);
        fds[i] = client_connect(add_agent(f, name));
    }
    for (int i = 0; i < N; i++) {
        g_snprintf(name, sizeof(name), "ping %d", i);
        ping(fds[i], name);
    }
    for (int i = 0; i < N; i++) {
        g_snprintf(name, sizeof(name), "agent-%d", i);
        assert_int_equal(hostd_relay_open_connections(f->relay, name), 1);
    }
    assert_int_equal(fixture_wakes(f), N);
    /* Freeing the relay with everything open closes every client. */
    hostd_relay_free(f->relay);
    f->relay = NULL;
    for (int i = 0; i < N; i++) {
        g_autoptr(GByteArray) back = read_to_eof(fds[i]);

        assert_int_equal(back->len, 0);
        close(fds[i]);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bytes_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_half_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_once_before_backend, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_wake_isolated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_connections_count, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_activity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_closes_and_frees_port, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backend_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backend_late, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_agents, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
