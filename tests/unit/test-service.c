/* hostd as a system service: what it tells systemd (hostd_notify(), sd_notify(3) underneath)
 * and the commented default configuration `meson install` puts in place. A datagram socket of
 * the test's own stands in for systemd's $NOTIFY_SOCKET. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hostd-config.h"
#include "hostd-notify.h"
#include "hostd-server.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-sink.h"
#include "test-hostd-fixture.h"

/* Every key hostd_config_load() reads (hostd-config.h); the default file shows each one. */
static const char *const config_keys[] = {
    "state-dir",        "socket",
    "connect",          "images-dir",
    "templates-dir",    "socket-group",
    "ssh-port-min",     "ssh-port-max",
    "boot-timeout",     "accel",
    "restart-limit",    "restart-window",
    "shutdown",         "shutdown-timeout",
    "shutdown-resume",  "forward-port-min",
    "forward-port-max", "request-timeout",
    "guest-api",        "guest-api-rate",
    "guest-api-burst",  "disk-read",
    "disk-write",       "disk-read-iops",
    "disk-write-iops",
};

/* ---- the stand-in for systemd ---------------------------------------------------------------- */

/* A datagram socket bound at @path (a file, or "@name" for an abstract one), with
 * $NOTIFY_SOCKET naming it. */
static int
manager_listen(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    socklen_t len;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    assert_true(strlen(path) < sizeof(sa.sun_path));
    strcpy(sa.sun_path, path);
    len = offsetof(struct sockaddr_un, sun_path) + strlen(path);
    if (path[0] == '@')
        sa.sun_path[0] = '\0';
    else
        len++;
    if (bind(fd, (struct sockaddr *)&sa, len) < 0)
        fail_msg("bind %s: %s", path, g_strerror(errno));
    g_setenv("NOTIFY_SOCKET", path, TRUE);
    return fd;
}

/* The next message the manager got, waiting up to 5 s; NULL when none came. */
static char *
manager_receive(int fd)
{
    char buf[4096];
    struct timeval tv = {.tv_sec = 5};

    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    if (n < 0)
        return NULL;
    buf[n] = '\0';
    return g_strdup(buf);
}

/* Whether a message is waiting, without waiting. */
static gboolean
manager_has_message(int fd)
{
    char buf[16];

    return recv(fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_PEEK) >= 0;
}

static int
tmpdir_setup(void **state)
{
    g_unsetenv("NOTIFY_SOCKET");
    return vm_test_tmpdir_setup(state);
}

static int
tmpdir_teardown(void **state)
{
    g_unsetenv("NOTIFY_SOCKET");
    return vm_test_tmpdir_teardown(state);
}

/* ---- hostd_notify ---------------------------------------------------------------------------- */

/* Started by hand, as everywhere but under systemd: nothing to tell, and no failure. */
static void
test_notify_without_manager(void **state)
{
    g_autoptr(GError) error = NULL;

    assert_null(g_getenv("NOTIFY_SOCKET"));
    assert_true(hostd_notify("READY=1", "listening on /x", &error));
    vm_test_assert_no_error(error);
    assert_true(hostd_notify("STOPPING=1", NULL, &error));
    vm_test_assert_no_error(error);
}

static void
test_notify_state_and_status(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *path = g_build_filename(t->dir, "notify", NULL);
    vm_autofd fd = manager_listen(path);
    g_autoptr(GError) error = NULL;

    assert_true(hostd_notify("READY=1", "listening on /var/lib/hostd/hostd.sock", &error));
    vm_test_assert_no_error(error);
    g_autofree char *ready = manager_receive(fd);
    assert_string_equal(ready, "READY=1\nSTATUS=listening on /var/lib/hostd/hostd.sock\n");

    /* A status is one line: a newline in it would start another key. */
    assert_true(hostd_notify(NULL, "two\nlines\r\nSTOPPING=1", &error));
    g_autofree char *status = manager_receive(fd);
    assert_string_equal(status, "STATUS=two lines  STOPPING=1\n");

    assert_true(hostd_notify("STOPPING=1", NULL, &error));
    g_autofree char *stopping = manager_receive(fd);
    assert_string_equal(stopping, "STOPPING=1\n");

    /* Nothing to say sends nothing. */
    assert_true(hostd_notify(NULL, NULL, &error));
    assert_false(manager_has_message(fd));
}

/* systemd may name an abstract socket ("@..."). */
static void
test_notify_abstract_socket(void **state)
{
    g_autofree char *name = g_strdup_printf("@hostd-test-notify-%d", (int)getpid());
    vm_autofd fd = manager_listen(name);
    g_autoptr(GError) error = NULL;

    assert_true(hostd_notify("READY=1", NULL, &error));
    vm_test_assert_no_error(error);
    g_autofree char *ready = manager_receive(fd);
    assert_string_equal(ready, "READY=1\n");
}

static void
test_notify_manager_gone(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *path = g_build_filename(t->dir, "no-such-socket", NULL);
    g_autoptr(GError) error = NULL;

    g_setenv("NOTIFY_SOCKET", path, TRUE);
    assert_false(hostd_notify("READY=1", NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "no-such-socket");
}

/* ---- readiness --------------------------------------------------------------------------------
 * main.c starts the server, then sends READY=1: by the time systemd hears it, a client that
 * connects is answered. The same two calls here, then a client's PING. */

static void
test_ready_once_server_answers(void **state)
{
    HostdTestFixture *f = *state;
    g_autofree char *notify_path = g_build_filename(f->dir, "notify", NULL);
    g_autofree char *socket_path = g_build_filename(f->dir, "hostd.sock", NULL);
    vm_autofd manager = manager_listen(notify_path);
    g_autoptr(GError) error = NULL;

    HostdServer *server = hostd_server_start(f->ctx, socket_path, NULL, &error);
    if (server == NULL)
        fail_msg("server: %s", error->message);
    g_autofree char *status = g_strdup_printf("listening on %s", socket_path);
    assert_true(hostd_notify("READY=1", status, &error));

    g_autofree char *ready = manager_receive(manager);
    assert_non_null(ready);
    assert_true(g_str_has_prefix(ready, "READY=1\n"));
    assert_non_null(strstr(ready, socket_path));

    struct sockaddr_un sa;
    socklen_t sa_len;
    assert_true(vm_unix_address(socket_path, &sa, &sa_len, &error));
    vm_autofd client = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(client, (struct sockaddr *)&sa, sa_len), 0);
    g_autoptr(VmMessage) ping = vm_message_new(VM_OP_PING, NULL, &error);
    assert_true(vm_message_write_fd(client, ping, &error));
    gboolean eof = FALSE;
    g_autoptr(VmMessage) reply = vm_message_read_fd(client, &eof, &error);
    if (reply == NULL)
        fail_msg("no answer to PING: %s", error != NULL ? error->message : "end of stream");
    assert_int_equal(reply->op, VM_OP_RESULT);
    assert_non_null(vm_message_get_string(reply, "version", NULL));
    /* The server is done with the connection once it closes it. */
    g_autoptr(VmMessage) more = vm_message_read_fd(client, &eof, NULL);
    assert_null(more);
    assert_true(eof);

    g_unsetenv("NOTIFY_SOCKET");
    hostd_server_stop(server);
}

/* ---- the real hostd process ---------------------------------------------------------------- */

static gboolean
has_line_with(const GString *text, gconstpointer needle)
{
    return strstr(text->str, needle) != NULL && g_str_has_suffix(text->str, "\n");
}

/* What the running hostd wrote to its stderr (@fd) until a line holding @needle came, for at most
 * @timeout_ms. */
static char *
hostd_read_until(int fd, const char *needle, guint timeout_ms)
{
    return g_string_free(vm_test_read_while(fd, (int)timeout_ms, has_line_with, needle, NULL),
                         FALSE);
}

/* The hostd program itself, started as a service would start it (on libvirt's test driver): from
 * its first moment it can write no core file and cannot be traced or read through /proc by a
 * process of its own uid without CAP_SYS_PTRACE; and its log handler keeps each message on one
 * line, though the text (here the state directory's name, as it is logged at start) holds a
 * newline that would forge a line of its own and a terminal escape. */
static void
test_hostd_process(void **state)
{
    VmTestTmpDir *t = *state;
    const char *build = g_getenv("VM_BUILD_DIR");
    g_autofree char *hostd = g_build_filename(build != NULL ? build : ".", "hostd", "hostd", NULL);
    g_autofree char *node = vm_test_data_path("hostd", "node.xml", NULL);
    g_autofree char *uri = g_strconcat("test://", node, NULL);
    g_autofree char *config = g_build_filename(t->dir, "hostd.conf", NULL);
    g_autofree char *state_dir =
        g_build_filename(t->dir, "state\n12:00:00 hostd: forged line\x1b[31m", NULL);
    g_autofree char *socket_path = g_build_filename(t->dir, "hostd.sock", NULL);
    const char *argv[] = {hostd,     "--config", config,      "--connect", uri,   "--state-dir",
                          state_dir, "--socket", socket_path, "--accel",   "tcg", NULL};
    g_auto(GStrv) env = g_environ_unsetenv(g_get_environ(), "G_DEBUG");
    g_autoptr(GError) error = NULL;
    int err[2];
    GPid pid = 0;
    int status = 0;

    if (!g_file_test(hostd, G_FILE_TEST_IS_EXECUTABLE))
        fail_msg("no hostd at %s (VM_BUILD_DIR)", hostd);
    vm_test_write_file(config, "[hostd]\n");
    assert_int_equal(pipe2(err, O_CLOEXEC), 0);
    if (!g_spawn_async_with_pipes_and_fds(
            "/", argv, (const char *const *)env,
            G_SPAWN_DO_NOT_REAP_CHILD | G_SPAWN_STDIN_FROM_DEV_NULL | G_SPAWN_STDOUT_TO_DEV_NULL,
            NULL, NULL, -1, -1, err[1], NULL, NULL, 0, &pid, NULL, NULL, NULL, &error))
        fail_msg("cannot run hostd: %s", error->message);
    close(err[1]);
    g_autofree char *log = hostd_read_until(err[0], "listening on", 60000);
    if (strstr(log, "listening on") == NULL)
        fail_msg("hostd did not start: %s", log);

    vm_test_assert_undumpable(pid);

    g_auto(GStrv) lines = g_strsplit(log, "\n", -1);
    gboolean found = FALSE;
    for (char **line = lines; *line != NULL; line++) {
        if (**line == '\0')
            continue;
        /* every line is one of hostd's */
        if (!g_regex_match_simple("^[0-9]{2}:[0-9]{2}:[0-9]{2} hostd: ", *line, 0, 0) ||
            g_str_has_prefix(*line, "12:00:00 hostd: forged"))
            fail_msg("a line hostd did not write: '%s'", *line);
        assert_null(strchr(*line, '\x1b'));
        if (strstr(*line, "state directory ") != NULL) {
            assert_non_null(strstr(*line, "state\\n12:00:00 hostd: forged line\\x1b[31m"));
            found = TRUE;
        }
    }
    assert_true(found);

    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(err[0]);
}

/* ---- the default configuration --------------------------------------------------------------- */

static char *
default_config_path(void)
{
    const char *build = g_getenv("VM_BUILD_DIR");

    if (build == NULL || build[0] == '\0')
        fail_msg("VM_BUILD_DIR is not set (run through meson test)");
    return g_build_filename(build, "dist", "hostd.conf", NULL);
}

/* As shipped, every key is commented out: hostd with the file is hostd without it. */
static void
test_default_config_is_the_defaults(void **state)
{
    g_autofree char *path = default_config_path();
    g_autoptr(GError) error = NULL;

    g_autoptr(HostdConfig) with = hostd_config_load(path, NULL, NULL, NULL, &error);
    if (with == NULL)
        fail_msg("%s: %s", path, error->message);
    g_autoptr(HostdConfig) without = hostd_config_load(NULL, NULL, NULL, NULL, &error);
    assert_non_null(without);
    assert_string_equal(with->state_dir, without->state_dir);
    assert_string_equal(with->socket_path, without->socket_path);
    assert_string_equal(with->uri, without->uri);
    assert_string_equal(with->images_dir, without->images_dir);
    assert_string_equal(with->templates_dir, without->templates_dir);
    assert_null(with->socket_group);
    assert_int_equal(with->ssh_port_min, without->ssh_port_min);
    assert_int_equal(with->ssh_port_max, without->ssh_port_max);
    assert_int_equal(with->forward_port_min, without->forward_port_min);
    assert_int_equal(with->forward_port_max, without->forward_port_max);
    assert_int_equal(with->boot_timeout_s, without->boot_timeout_s);
    assert_int_equal(with->accel, without->accel);
    assert_int_equal(with->restart_limit, without->restart_limit);
    assert_int_equal(with->request_timeout_s, without->request_timeout_s);
    assert_int_equal(with->restart_window_s, without->restart_window_s);
    assert_int_equal(with->shutdown, without->shutdown);
    assert_int_equal(with->shutdown_timeout_s, without->shutdown_timeout_s);
    assert_int_equal(with->shutdown_resume_eager, without->shutdown_resume_eager);
    assert_int_equal(with->guest_api, without->guest_api);
    assert_int_equal(with->guest_api_rate, without->guest_api_rate);
    assert_int_equal(with->guest_api_burst, without->guest_api_burst);
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_int_equal(with->disk_limits[i], without->disk_limits[i]);
}

/* Each key is shown, and its line, uncommented, is a value hostd takes. */
static void
test_default_config_shows_every_key(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *path = default_config_path();
    g_autofree char *text = vm_test_read_file(path);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);

    for (gsize k = 0; k < G_N_ELEMENTS(config_keys); k++) {
        g_autofree char *prefix = g_strdup_printf("#%s = ", config_keys[k]);
        const char *line = NULL;
        for (char **l = lines; *l != NULL; l++) {
            if (g_str_has_prefix(*l, prefix)) {
                assert_null(line);
                line = *l;
            }
        }
        if (line == NULL)
            fail_msg("%s does not show '%s'", path, config_keys[k]);

        g_autofree char *one = g_build_filename(t->dir, "one.conf", NULL);
        g_autofree char *contents = g_strdup_printf("[hostd]\n%s\n", line + 1);
        vm_test_write_file(one, contents);
        g_autoptr(GError) error = NULL;
        g_autoptr(HostdConfig) config = hostd_config_load(one, NULL, NULL, NULL, &error);
        if (config == NULL)
            fail_msg("'%s' does not load: %s", line + 1, error->message);
    }
}

/* shutdown = auto saves under a service manager only; save and keep are what they say. */
static void
test_shutdown_mode(void **state)
{
    VmTestTmpDir *t = *state;
    static const struct {
        const char *line;
        gboolean with_manager, without_manager;
    } cases[] = {
        {"", TRUE, FALSE},
        {"shutdown = auto", TRUE, FALSE},
        {"shutdown = save", TRUE, TRUE},
        {"shutdown = keep", FALSE, FALSE},
    };
    g_autofree char *saved = g_strdup(g_getenv("NOTIFY_SOCKET"));
    g_autofree char *path = g_build_filename(t->dir, "shutdown.conf", NULL);

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *text = g_strdup_printf("[hostd]\n%s\n", cases[i].line);
        vm_test_write_file(path, text);
        g_autoptr(HostdConfig) config = hostd_config_load(path, NULL, NULL, NULL, &error);
        assert_non_null(config);
        g_setenv("NOTIFY_SOCKET", "/run/systemd/notify", TRUE);
        assert_int_equal(hostd_config_shutdown_saves(config), cases[i].with_manager);
        g_unsetenv("NOTIFY_SOCKET");
        assert_int_equal(hostd_config_shutdown_saves(config), cases[i].without_manager);
    }
    vm_test_write_file(path, "[hostd]\nshutdown = hibernate\n");
    g_autoptr(GError) error = NULL;
    assert_null(hostd_config_load(path, NULL, NULL, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "auto, keep, save");
    if (saved != NULL)
        g_setenv("NOTIFY_SOCKET", saved, TRUE);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_notify_without_manager, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_mode, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_notify_state_and_status, tmpdir_setup,
                                        tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_notify_abstract_socket, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_notify_manager_gone, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_ready_once_server_answers, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_hostd_process, tmpdir_setup, tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_default_config_is_the_defaults, tmpdir_setup,
                                        tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_default_config_shows_every_key, tmpdir_setup,
                                        tmpdir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
