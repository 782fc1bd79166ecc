/* hostd-ssh against a real OpenSSH server started per test on 127.0.0.1. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-config.h"
#include "hostd-ids.h"
#include "hostd-ssh-forward.h"
#include "hostd-ssh-private.h"
#include "hostd-ssh-worker.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-spawn.h"
#include "test-common.h"
#include "test-sink.h"

#define SSHD_PATH "/usr/sbin/sshd"

/* Keys shared by all tests of the binary. */
static struct {
    char *dir;
    char *host_key;       /* private, the server's */
    char *host_pub_line;  /* "ssh-ed25519 AAAA..." */
    char *other_pub_line; /* a key the server does not have */
    char *user_key;       /* private, the client's */
    char *user_pub_line;
} keys;

typedef enum {
    SERVER_DEFAULT,
    SERVER_REFUSES_KEY,  /* our key is not in authorized_keys */
    SERVER_FEW_STARTUPS, /* drops every connection past 5 unauthenticated ones */
} ServerKind;

typedef struct {
    char *dir;
    GPid sshd_pid;
    guint port;
    char *log_path;
    char *known_hosts_path;
    HostdSshPool *pool;
    HostdSshWorkers *workers; /* the pool's delegate, or NULL */
    HostdSshTarget target;
} Fixture;

/* ---- helpers ------------------------------------------------------------------------------- */

static char *
read_pub_line(const char *path)
{
    g_autofree char *contents = NULL;
    g_auto(GStrv) fields = NULL;

    assert_true(g_file_get_contents(path, &contents, NULL, NULL));
    fields = g_strsplit(g_strstrip(contents), " ", 3);
    assert_non_null(fields[0]);
    assert_non_null(fields[1]);
    return g_strdup_printf("%s %s", fields[0], fields[1]);
}

static char *
keygen(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_autofree char *pub = g_strdup_printf("%s.pub", path);
    const char *argv[] = {"ssh-keygen", "-q",   "-t", "ed25519", "-N", "",
                          "-C",         "test", "-f", path,      NULL};
    g_autoptr(GError) error = NULL;

    assert_true(vm_spawn_run(argv, NULL, NULL, &error));
    vm_test_assert_no_error(error);
    return g_steal_pointer(&path);
}

static gboolean
port_accepts(guint port)
{
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    gboolean ok;

    assert_true(fd >= 0);
    ok = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0;
    close(fd);
    return ok;
}

static void
write_known_hosts(Fixture *f, const char *pub_line)
{
    g_autofree char *line = g_strdup_printf("[127.0.0.1]:%u %s\n", f->port, pub_line);

    assert_true(g_file_set_contents(f->known_hosts_path, line, -1, NULL));
}

/* sshd -D stays the spawned process: have it die with the test even when the test is killed. */
static void
sshd_child_setup(gpointer data)
{
    prctl(PR_SET_PDEATHSIG, SIGTERM);
}

static void
sshd_start(Fixture *f, ServerKind kind)
{
    g_autofree char *config_path = g_build_filename(f->dir, "sshd_config", NULL);
    g_autofree char *auth_path = g_build_filename(f->dir, "authorized_keys", NULL);
    g_autofree char *config = NULL;
    g_autofree char *auth = NULL;
    g_autoptr(GError) error = NULL;
    const char *argv[] = {SSHD_PATH, "-D", "-e", "-f", config_path, NULL};
    int log_fd;
    int null_fd;

    auth = g_strdup_printf("%s\n",
                           kind == SERVER_REFUSES_KEY ? keys.host_pub_line : keys.user_pub_line);
    assert_true(g_file_set_contents(auth_path, auth, -1, NULL));
    config = g_strdup_printf("ListenAddress 127.0.0.1\n"
                             "Port %u\n"
                             "HostKey %s\n"
                             "AuthorizedKeysFile %s\n"
                             "PidFile none\n"
                             "UsePAM no\n"
                             "StrictModes no\n"
                             "PermitRootLogin prohibit-password\n"
                             "PasswordAuthentication no\n"
                             "KbdInteractiveAuthentication no\n"
                             /* bash sources ~/.bashrc for a top-level command from sshd; the
                              * host's root dotfiles (a pyenv init costs 0.5 s a command) are
                              * not what these tests measure. */
                             "SetEnv SHLVL=1\n"
                             "%s",
                             f->port, keys.host_key, auth_path,
                             kind == SERVER_FEW_STARTUPS ? "MaxStartups 5:100:5\n" : "");
    assert_true(g_file_set_contents(config_path, config, -1, NULL));

    /* sshd's privilege separation directory. */
    g_mkdir_with_parents("/run/sshd", 0755);

    log_fd = open(f->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    assert_true(log_fd >= 0 && null_fd >= 0);
    assert_true(g_spawn_async_with_fds(NULL, (char **)argv, NULL, G_SPAWN_DO_NOT_REAP_CHILD,
                                       sshd_child_setup, NULL, &f->sshd_pid, null_fd, null_fd,
                                       log_fd, &error));
    vm_test_assert_no_error(error);
    close(log_fd);
    close(null_fd);

    for (guint i = 0; i < 250; i++) {
        int status;

        if (port_accepts(f->port))
            return;
        if (waitpid(f->sshd_pid, &status, WNOHANG) == f->sshd_pid) {
            g_autofree char *log = NULL;

            g_file_get_contents(f->log_path, &log, NULL, NULL);
            f->sshd_pid = 0;
            fail_msg("sshd exited at start: %s", log != NULL ? log : "");
        }
        g_usleep(20 * 1000);
    }
    fail_msg("sshd did not listen on port %u", f->port);
}

static int
setup_kind(void **state, ServerKind kind)
{
    Fixture *f = g_new0(Fixture, 1);

    f->dir = vm_test_make_tmpdir("test-ssh-XXXXXX");
    f->port = vm_test_free_port();
    f->log_path = g_build_filename(f->dir, "sshd.log", NULL);
    f->known_hosts_path = g_build_filename(f->dir, "known_hosts", NULL);
    write_known_hosts(f, keys.host_pub_line);
    f->pool = hostd_ssh_pool_new();
    f->target = (HostdSshTarget){
        .agent = "alpha",
        .host = "127.0.0.1",
        .port = f->port,
        .user = "root",
        .identity_path = keys.user_key,
        .known_hosts_path = f->known_hosts_path,
    };
    *state = f;
    sshd_start(f, kind);
    return 0;
}

static int
setup(void **state)
{
    return setup_kind(state, SERVER_DEFAULT);
}

/* As hostd_confine_worker_user() answers for an agent with an id in the default agent-ids, as
 * root: the SSH worker id of its slot in the default worker-ids; else the test's own user. */
static gboolean
worker_user(gpointer data, const char *agent, guint agent_id, gboolean *ret_change, guint *ret_uid,
            guint *ret_gid, GError **error)
{
    g_autoptr(HostdConfig) config = hostd_config_load(NULL, "/nonexistent", NULL, NULL, error);

    if (config == NULL)
        return FALSE;
    *ret_change =
        geteuid() == 0 && agent_id >= config->agent_id_min && agent_id <= config->agent_id_max;
    *ret_uid = *ret_gid = 0;
    if (*ret_change)
        *ret_uid = *ret_gid = hostd_ids_worker(config->worker_id_min, config->worker_id_max,
                                               agent_id - config->agent_id_min, HOSTD_WORKER_SSH);
    return TRUE;
}

/* The same server, with the pool's waits and execs run by SSH workers (vm-ssh-worker of this
 * build, as this test's own user for an agent without an id). */
static int
setup_worker(void **state)
{
    Fixture *f;
    g_autofree char *program = hostd_ssh_worker_path();
    HostdSshWorkersConfig config = {.program = program, .worker_user = worker_user};

    setup_kind(state, SERVER_DEFAULT);
    f = *state;
    f->workers = hostd_ssh_workers_new(&config);
    hostd_ssh_pool_set_delegate(f->pool, &hostd_ssh_workers_delegate, f->workers);
    return 0;
}

/* The same with a short answer deadline, for the tests of a worker that does not answer. */
static int
setup_worker_quick(void **state)
{
    Fixture *f;
    g_autofree char *program = hostd_ssh_worker_path();
    HostdSshWorkersConfig config = {.program = program,
                                    .answer_timeout_ms = 2000,
                                    .ping_interval_ms = 500,
                                    .sleep_grace_ms = 1};

    setup_kind(state, SERVER_DEFAULT);
    f = *state;
    f->workers = hostd_ssh_workers_new(&config);
    hostd_ssh_pool_set_delegate(f->pool, &hostd_ssh_workers_delegate, f->workers);
    return 0;
}

static int
setup_refuses_key(void **state)
{
    return setup_kind(state, SERVER_REFUSES_KEY);
}

static int
setup_few_startups(void **state)
{
    return setup_kind(state, SERVER_FEW_STARTUPS);
}

/* Ends every connection the server holds, as a guest that restarts does: kills its
 * per-connection processes (the children of the sshd this test started) and waits until the
 * server has reaped them. */
static void
server_drop_connections(Fixture *f)
{
    g_autofree char *path = g_strdup_printf("/proc/%d/task/%d/children", f->sshd_pid, f->sshd_pid);
    g_autofree char *children = NULL;
    g_auto(GStrv) pids = NULL;

    assert_true(g_file_get_contents(path, &children, NULL, NULL));
    pids = g_strsplit(g_strstrip(children), " ", -1);
    assert_true(pids[0] != NULL && *pids[0] != '\0');
    for (char **pid = pids; *pid != NULL; pid++)
        assert_int_equal(kill((pid_t)g_ascii_strtoll(*pid, NULL, 10), SIGKILL), 0);
    for (guint i = 0; i < 100; i++) {
        g_clear_pointer(&children, g_free);
        assert_true(g_file_get_contents(path, &children, NULL, NULL));
        if (*g_strstrip(children) == '\0')
            return;
        g_usleep(50 * 1000);
    }
    fail_msg("sshd did not reap its connections: %s", children);
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    /* First the pool and workers: their sessions end the server's per-connection processes. */
    hostd_ssh_pool_free(f->pool);
    hostd_ssh_workers_free(f->workers);
    if (f->sshd_pid > 0) {
        kill(f->sshd_pid, SIGTERM);
        waitpid(f->sshd_pid, NULL, 0);
    }
    vm_test_remove_tree(f->dir);
    g_free(f->dir);
    g_free(f->log_path);
    g_free(f->known_hosts_path);
    g_free(f);
    return 0;
}

static int
group_setup(void **state)
{
    keys.dir = vm_test_make_tmpdir("test-ssh-keys-XXXXXX");
    keys.host_key = keygen(keys.dir, "host");
    keys.user_key = keygen(keys.dir, "user");
    g_autofree char *other = keygen(keys.dir, "other");
    g_autofree char *host_pub = g_strdup_printf("%s.pub", keys.host_key);
    g_autofree char *user_pub = g_strdup_printf("%s.pub", keys.user_key);
    g_autofree char *other_pub = g_strdup_printf("%s.pub", other);
    keys.host_pub_line = read_pub_line(host_pub);
    keys.user_pub_line = read_pub_line(user_pub);
    keys.other_pub_line = read_pub_line(other_pub);
    return 0;
}

static int
group_teardown(void **state)
{
    vm_test_remove_tree(keys.dir);
    g_free(keys.dir);
    g_free(keys.host_key);
    g_free(keys.host_pub_line);
    g_free(keys.other_pub_line);
    g_free(keys.user_key);
    g_free(keys.user_pub_line);
    return 0;
}

/* ---- running an exec the way the server does: a thread, a socketpair ----------------------- */

typedef struct {
    Fixture *f;
    HostdExecRequest request;
    GBytes *input;      /* sent as STDIN frames, or NULL */
    gboolean input_eof; /* then STDIN_EOF */
    int fds[2];         /* [0] hostd's end, [1] the client's */
    GThread *exec_thread;
    GThread *writer_thread;
    gboolean ok;
    GError *error;
    /* What the client saw. */
    GString *out;
    GString *err;
    guint out_frames;
    guint err_frames;
    gboolean exited;
    int status;
    gboolean data_after_exit;
} ExecRun;

static gpointer
exec_thread(gpointer data)
{
    ExecRun *run = data;
    run->ok =
        hostd_ssh_exec(run->f->pool, &run->f->target, &run->request, run->fds[0], &run->error);
    /* As the server does: the conversation ends with the connection. */
    close(run->fds[0]);
    run->fds[0] = -1;
    return NULL;
}

static gpointer
writer_thread(gpointer data)
{
    ExecRun *run = data;
    gsize len = 0;
    const guint8 *bytes = g_bytes_get_data(run->input, &len);

    for (gsize off = 0; off < len; off += VM_STREAM_CHUNK_MAX) {
        g_autoptr(VmMessage) message =
            vm_message_new_data(VM_OP_STDIN, bytes + off, MIN(VM_STREAM_CHUNK_MAX, len - off));

        if (!vm_message_write_fd(run->fds[1], message, NULL))
            return NULL;
    }
    if (run->input_eof) {
        g_autoptr(VmMessage) message = vm_message_new(VM_OP_STDIN_EOF, NULL, NULL);

        vm_message_write_fd(run->fds[1], message, NULL);
    }
    return NULL;
}

static void
exec_run_init(ExecRun *run, Fixture *f, char **argv)
{
    *run = (ExecRun){.f = f, .request = {.argv = argv}, .fds = {-1, -1}};
    run->out = g_string_new(NULL);
    run->err = g_string_new(NULL);
}

static void
exec_run_start(ExecRun *run)
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, run->fds), 0);
    run->exec_thread = g_thread_new("exec", exec_thread, run);
    if (run->input != NULL || run->input_eof) {
        if (run->input == NULL)
            run->input = g_bytes_new(NULL, 0);
        run->writer_thread = g_thread_new("writer", writer_thread, run);
    }
}

/* Reads frames until hostd's end closes, then joins the threads. */
static void
exec_run_finish(ExecRun *run)
{
    for (;;) {
        g_autoptr(VmMessage) message = NULL;
        g_autoptr(GError) error = NULL;
        gboolean eof = FALSE;
        gsize len = 0;
        const guint8 *data;

        message = vm_message_read_fd(run->fds[1], &eof, &error);
        if (message == NULL) {
            if (!eof)
                vm_test_assert_no_error(error);
            break;
        }
        if (run->exited)
            run->data_after_exit = TRUE;
        switch (message->op) {
        case VM_OP_STDOUT:
            data = vm_message_get_data(message, "data", &len);
            assert_true(len > 0 && len <= VM_STREAM_CHUNK_MAX);
            g_string_append_len(run->out, (const char *)data, (gssize)len);
            run->out_frames++;
            break;
        case VM_OP_STDERR:
            data = vm_message_get_data(message, "data", &len);
            assert_true(len > 0 && len <= VM_STREAM_CHUNK_MAX);
            g_string_append_len(run->err, (const char *)data, (gssize)len);
            run->err_frames++;
            break;
        case VM_OP_EXIT:
            run->exited = TRUE;
            run->status = vm_message_get_int(message, "status", -1000);
            break;
        default:
            fail_msg("unexpected frame %d from the exec", message->op);
        }
    }
    g_thread_join(run->exec_thread);
    run->exec_thread = NULL;
    if (run->writer_thread != NULL) {
        g_thread_join(run->writer_thread);
        run->writer_thread = NULL;
    }
    /* The EXIT frame is sent exactly when the exec succeeds. */
    assert_int_equal(run->exited, run->ok);
    assert_false(run->data_after_exit);
}

static void
exec_run_clear(ExecRun *run)
{
    if (run->fds[1] >= 0)
        close(run->fds[1]);
    g_clear_error(&run->error);
    g_clear_pointer(&run->input, g_bytes_unref);
    g_string_free(run->out, TRUE);
    g_string_free(run->err, TRUE);
}

static void
exec_run(ExecRun *run)
{
    exec_run_start(run);
    exec_run_finish(run);
}

static void
assert_exec_ok(const ExecRun *run, int status)
{
    vm_test_assert_no_error(run->error);
    assert_true(run->ok);
    assert_true(run->exited);
    assert_int_equal(run->status, status);
}

/* Runs @argv (no stdin frames) and checks its exit status and stdout. */
static void
exec_check(Fixture *f, char **argv, int status, const char *want_out)
{
    ExecRun run;

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, status);
    assert_string_equal(run.out->str, want_out);
    exec_run_clear(&run);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void
test_exec_stdout_stderr_status(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "echo out; sleep 0.1; echo err >&2; exit 3", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 3);
    assert_string_equal(run.out->str, "out\n");
    assert_string_equal(run.err->str, "err\n");
    assert_int_equal(run.out_frames, 1);
    assert_int_equal(run.err_frames, 1);
    exec_run_clear(&run);
}

static void
test_exec_stdin(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"cat", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    run.input = g_bytes_new_static("hello", 5);
    run.input_eof = TRUE;
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "hello");
    assert_int_equal(run.err->len, 0);
    exec_run_clear(&run);
}

/* More stdin than the SSH window holds, through a command that echoes it back while it reads:
 * neither side may wait for the other. */
static void
test_exec_stdin_large(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"cat", NULL};
    const gsize len = 6 * 1024 * 1024 + 7;
    guint8 *data = g_malloc(len);
    ExecRun run;

    for (gsize i = 0; i < len; i++)
        data[i] = (guint8)(i * 7 + i / 251);
    exec_run_init(&run, f, argv);
    run.input = g_bytes_new_take(data, len);
    run.input_eof = TRUE;
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_int_equal(run.out->len, len);
    assert_memory_equal(run.out->str, g_bytes_get_data(run.input, NULL), len);
    exec_run_clear(&run);
}

static void
test_exec_large_output(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"seq", "1", "800000", NULL};
    g_autoptr(GString) expected = g_string_new(NULL);
    ExecRun run;

    for (guint i = 1; i <= 800000; i++)
        g_string_append_printf(expected, "%u\n", i);
    assert_true(expected->len > 5 * 1000 * 1000);

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_int_equal(run.out->len, expected->len);
    assert_memory_equal(run.out->str, expected->str, expected->len);
    assert_true(run.out_frames >= expected->len / VM_STREAM_CHUNK_MAX);
    exec_run_clear(&run);
}

static void
test_exec_env_cwd(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "printf '%s|%s|' \"$FOO\" \"$BAR_2\"; pwd", NULL};
    char *env[] = {"FOO=a b'c $HOME", "BAR_2=", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    run.request.env = env;
    run.request.cwd = "/usr/share";
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "a b'c $HOME||/usr/share\n");
    exec_run_clear(&run);
}

static void
test_exec_cwd_missing(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"echo", "ran", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    run.request.cwd = "/nonexistent dir";
    exec_run(&run);
    assert_exec_ok(&run, 1);
    assert_string_equal(run.out->str, "");
    assert_non_null(strstr(run.err->str, "nonexistent dir"));
    exec_run_clear(&run);
}

static void
test_exec_bad_env(void **state)
{
    static const char *const bad[] = {"NOEQUALS", "=v", "1X=v", "A-B=v", "A B=v", "$(id)=v"};
    Fixture *f = *state;
    char *argv[] = {"true", NULL};

    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        char *env[] = {"OK=1", (char *)bad[i], NULL};
        ExecRun run;

        exec_run_init(&run, f, argv);
        run.request.env = env;
        exec_run(&run);
        assert_false(run.ok);
        vm_test_assert_error(run.error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
        exec_run_clear(&run);
    }
    /* Nothing was run, so nothing was connected. */
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 0);
}

static void
test_exec_empty_argv(void **state)
{
    Fixture *f = *state;
    char *argv[] = {NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    exec_run(&run);
    vm_test_assert_error(run.error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, NULL);
    exec_run_clear(&run);
}

/* Arguments arrive in the remote command exactly as given, whatever they hold. */
static void
test_exec_argv_roundtrip(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"printf", "[%s]", "a b", "it's", "$HOME", "*",     "",  "\\",
                    "a\nb",   "'",    "~",   "`id`", "x;y",   "\"q\"", "é", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str,
                        "[a b][it's][$HOME][*][][\\][a\nb]['][~][`id`][x;y][\"q\"][é]");
    exec_run_clear(&run);
}

static void
test_exec_tty(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "test -t 0 && echo tty; stty size; echo $TERM", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    run.request.tty = TRUE;
    run.request.cols = 100;
    run.request.rows = 30;
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "tty\r\n30 100\r\nxterm-256color\r\n");
    exec_run_clear(&run);
}

static void
test_exec_no_tty(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "test -t 0 || echo notty", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "notty\n");
    exec_run_clear(&run);
}

static void
test_exec_window_size(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "stty -echo; echo ready; read x; stty size", NULL};
    g_autoptr(VmMessage) resize = NULL;
    g_autoptr(VmMessage) line = NULL;
    GVariantDict fields;
    ExecRun run;

    exec_run_init(&run, f, argv);
    run.request.tty = TRUE;
    run.request.term = "vt100";
    exec_run_start(&run);

    g_variant_dict_init(&fields, NULL);
    g_variant_dict_insert(&fields, "cols", "u", 132);
    g_variant_dict_insert(&fields, "rows", "u", 43);
    resize = vm_message_new(VM_OP_WINDOW_SIZE, g_variant_dict_end(&fields), NULL);
    assert_non_null(resize);
    line = vm_message_new_data(VM_OP_STDIN, "go\n", 3);
    assert_true(vm_message_write_fd(run.fds[1], resize, NULL));
    assert_true(vm_message_write_fd(run.fds[1], line, NULL));
    exec_run_finish(&run);
    assert_exec_ok(&run, 0);
    assert_non_null(strstr(run.out->str, "43 132\r\n"));
    exec_run_clear(&run);
}

static void
test_exec_signal_status(void **state)
{
    static const struct {
        const char *script;
        int status;
    } cases[] = {
        {"kill -TERM $$", 143}, {"kill -KILL $$", 137}, {"kill -HUP $$", 129},
        {"exit 255", 255},      {"exit 0", 0},
    };
    Fixture *f = *state;

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *argv[] = {"sh", "-c", (char *)cases[i].script, NULL};
        ExecRun run;

        exec_run_init(&run, f, argv);
        exec_run(&run);
        assert_exec_ok(&run, cases[i].status);
        exec_run_clear(&run);
    }
}

static void
test_exec_client_goes_away(void **state)
{
    Fixture *f = *state;
    /* cat ends by itself once the closed channel closes its stdin. */
    char *argv[] = {"sh", "-c", "echo started; cat", NULL};
    char *argv2[] = {"echo", "again", NULL};
    g_autoptr(VmMessage) first = NULL;
    ExecRun run;
    ExecRun again;
    gint64 start;

    exec_run_init(&run, f, argv);
    exec_run_start(&run);
    /* Wait until the command runs, then hang up. */
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    assert_int_equal(first->op, VM_OP_STDOUT);
    start = g_get_monotonic_time();
    close(run.fds[1]);
    run.fds[1] = -1;
    g_thread_join(run.exec_thread);
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    assert_false(run.ok);
    vm_test_assert_error(run.error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    exec_run_clear(&run);

    /* The session is still good for the next command. */
    exec_run_init(&again, f, argv2);
    exec_run(&again);
    assert_exec_ok(&again, 0);
    assert_string_equal(again.out->str, "again\n");
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 1);
    exec_run_clear(&again);
}

/* An exec runs on the spare shell its pooled session holds: no channel open, no exec request,
 * and what the command sees and gives back is what an exec request gives: arguments,
 * environment, working directory, stdin byte for byte (a NUL and the ready line in it
 * included), stdout, stderr, the exit status, a signal's status with nothing added to stderr.
 * Each exec leaves a new spare behind; a terminal goes the ordinary way. */
static void
test_exec_spare(void **state)
{
    static const char input[] = "one\0vmctl-spare-ready\n\0tail";
    Fixture *f = *state;
    char *argv[] = {"sh",  "-c", "echo \"$0|$1|$FOO|$PWD\"; cat; echo err >&2; exit 3",
                    "a b", "c",  NULL};
    char *env[] = {"FOO=x y", NULL};
    char *killed[] = {"sh", "-c", "kill -TERM $$", NULL};
    char *tty[] = {"tty", NULL};
    char *seconds[] = {"eval", "echo $SECONDS", NULL};
    g_autoptr(GString) want = g_string_new("a b|c|x y|/usr/share\n");
    ExecRun run;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 1);

    exec_run_init(&run, f, argv);
    run.request.env = env;
    run.request.cwd = "/usr/share";
    run.input = g_bytes_new(input, sizeof(input) - 1);
    run.input_eof = TRUE;
    exec_run(&run);
    assert_exec_ok(&run, 3);
    g_string_append_len(want, input, sizeof(input) - 1);
    assert_int_equal(run.out->len, want->len);
    assert_memory_equal(run.out->str, want->str, want->len);
    assert_string_equal(run.err->str, "err\n");
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 1);
    assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 1);

    exec_run_init(&run, f, killed);
    exec_run(&run);
    assert_exec_ok(&run, 143);
    assert_string_equal(run.err->str, "");
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 2);

    /* bash's clock of the shell's age starts with the command, not with the spare. */
    g_usleep(1200 * 1000);
    exec_check(f, seconds, 0, "0\n");
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 3);

    exec_run_init(&run, f, tty);
    run.request.tty = TRUE;
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_true(g_str_has_prefix(run.out->str, "/dev/pts/"));
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 3);
    assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 1);
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 1);
}

/* A login shell that does not run the spare script (not bash): the exec goes the ordinary
 * way, with its output, and the agent gets no more spares. */
static void
test_exec_spare_refused(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"echo", "ordinary", NULL};

    hostd_ssh_pool_set_spare_script(f->pool, "echo 'not ready'; exit 0");
    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    for (guint i = 0; i < 2; i++) {
        exec_check(f, argv, 0, "ordinary\n");
        assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 0);
    }
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 0);
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 1);
}

/* What the shell's start-up files print before the spare is ready is not the command's (bash
 * -c prints it again for the command); more than a few KiB of it, and the exec goes the
 * ordinary way once. A command too long for the spare goes the ordinary way too. */
static void
test_exec_spare_noise(void **state)
{
    static const char noisy[] = "echo from-startup-files; printf 'vmctl-spare-ready\\n'; "
                                "IFS= read -r -d '' c && exec bash -c \"$c\"";
    static const char flood[] =
        "head -c 8192 /dev/zero | tr '\\0' x; printf 'vmctl-spare-ready\\n'; "
        "IFS= read -r -d '' c && exec bash -c \"$c\"";
    Fixture *f = *state;
    g_autofree char *long_word = g_strnfill(5000, 'y');
    char *argv[] = {"echo", "hi", NULL};
    char *long_argv[] = {"echo", long_word, NULL};
    g_autofree char *long_want = g_strdup_printf("%s\n", long_word);

    hostd_ssh_pool_set_spare_script(f->pool, noisy);
    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    exec_check(f, argv, 0, "hi\n");
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 1);
    exec_check(f, long_argv, 0, long_want);
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 1);

    hostd_ssh_pool_forget(f->pool, "alpha");
    hostd_ssh_pool_set_spare_script(f->pool, flood);
    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    exec_check(f, argv, 0, "hi\n");
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 1);
    /* Not refused: the next exec finds a spare again. */
    assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 1);
}

/* A spare that said it was ready and was killed since (an agent's pkill, the OOM killer) does
 * not take the next command with it: that exec goes the ordinary way and runs. */
static void
test_exec_spare_killed(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"echo", "ran", NULL};
    gint64 deadline;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 1);
    /* The spare's shell: a process of this test's sshd whose command line holds its script;
     * wait_ready may return before sshd has started it. */
    deadline = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
    for (;;) {
        g_autoptr(GDir) proc = g_dir_open("/proc", 0, NULL);
        const char *entry;
        guint killed = 0;

        while ((entry = g_dir_read_name(proc)) != NULL) {
            g_autofree char *path = g_strdup_printf("/proc/%s/cmdline", entry);
            g_autofree char *cmdline = NULL;
            gsize len = 0;

            if (!g_ascii_isdigit(*entry) || !g_file_get_contents(path, &cmdline, &len, NULL) ||
                memmem(cmdline, len, "vmctl-spare-ready", strlen("vmctl-spare-ready")) == NULL)
                continue;
            /* Ready: it printed so at once, and waits on its stdin. */
            g_usleep(300 * 1000);
            assert_int_equal(kill((pid_t)g_ascii_strtoll(entry, NULL, 10), SIGKILL), 0);
            killed++;
        }
        if (killed > 0)
            break;
        assert_true(g_get_monotonic_time() < deadline);
        g_usleep(20 * 1000);
    }
    /* Its end reaches hostd's socket meanwhile, as it does for a spare killed in the past. */
    g_usleep(300 * 1000);
    exec_check(f, argv, 0, "ran\n");
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 0);
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 1);
    /* Not refused: the next exec has a spare again. */
    assert_int_equal(hostd_ssh_pool_get_spare_count(f->pool, "alpha"), 1);
    exec_check(f, argv, 0, "ran\n");
    assert_int_equal(hostd_ssh_pool_get_spares_used(f->pool), 1);
}

/* A spare runs each command as an exec request's `bash -c` does: output, error messages and
 * status the same, run by run, for builtins, programs, names not found, files not executable,
 * signals, with and without environment and working directory. One difference: whether bash
 * forks for the last program or execs it, which `bash -c` decides by what precedes the command
 * (and so prints its own "Terminated" line for a command killed by a signal, or not); a spare
 * always execs it (the program replaces the shell, no such line). */
static void
test_exec_spare_same_as_ordinary(void **state)
{
    static const struct {
        char *argv[6];
        gboolean killed;
    } cases[] = {
        {{"true"}},
        {{"exit", "3"}},
        {{"echo", "hi", "--help"}},
        {{"sh", "-c", "echo \"$0|$1\"; echo err >&2; exit 4", "a b", "c"}},
        {{"sh", "-c", "kill -TERM $$"}, TRUE},
        {{"/bin/sh", "-c", "kill -KILL $$"}, TRUE},
        {{"no-such-command", "a"}},
        {{"/no/such/file"}},
        {{"./passwd"}}, /* in /etc: a file, not executable */
        {{"A=b"}},
        {{"pwd"}},
    };
    Fixture *f = *state;
    HostdSshPool *spares = f->pool;
    g_autoptr(HostdSshPool) ordinary = hostd_ssh_pool_new();
    char *env[] = {"FOO=x y", NULL};

    hostd_ssh_pool_set_spare_script(ordinary, "exit 0");
    for (guint with_env = 0; with_env < 2; with_env++) {
        for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
            ExecRun runs[2];

            for (guint k = 0; k < 2; k++) {
                f->pool = k == 0 ? ordinary : spares;
                assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
                exec_run_init(&runs[k], f, (char **)cases[i].argv);
                runs[k].request.cwd = "/etc";
                runs[k].request.env = with_env ? env : NULL;
                exec_run(&runs[k]);
                assert_exec_ok(&runs[k], runs[k].status);
            }
            f->pool = spares;
            if (runs[0].status != runs[1].status || !g_string_equal(runs[0].out, runs[1].out) ||
                (cases[i].killed ? runs[1].err->len != 0
                                 : !g_string_equal(runs[0].err, runs[1].err)))
                fail_msg("%s: ordinary %d [%s] [%s], spare %d [%s] [%s]", cases[i].argv[0],
                         runs[0].status, runs[0].out->str, runs[0].err->str, runs[1].status,
                         runs[1].out->str, runs[1].err->str);
            exec_run_clear(&runs[0]);
            exec_run_clear(&runs[1]);
        }
    }
    assert_int_equal(hostd_ssh_pool_get_spares_used(ordinary), 0);
    assert_int_equal(hostd_ssh_pool_get_spares_used(spares), 2 * G_N_ELEMENTS(cases));
}

static void
test_pool_reuse(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"true", NULL};
    ExecRun run;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 1);
    assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 1);

    for (guint i = 0; i < 3; i++) {
        exec_run_init(&run, f, argv);
        exec_run(&run);
        assert_exec_ok(&run, 0);
        exec_run_clear(&run);
        assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 1);
        assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 1);
    }

    /* Forgetting drops the idle session; the next exec connects afresh. */
    hostd_ssh_pool_forget(f->pool, "alpha");
    assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 0);
    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 2);

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 2);

    /* Unknown agents are fine to forget. */
    hostd_ssh_pool_forget(f->pool, "nobody");
}

/* Many execs at once on one agent, far more than its sshd's MaxStartups (10:30:100 by default:
 * past 10 handshakes it drops new connections at random; here past 5, all of them): every one
 * runs, with its own output, because hostd queues its handshakes to an agent instead of opening
 * them all at once. */
static void
test_exec_concurrent(void **state)
{
    Fixture *f = *state;
    enum { N = 40 };
    ExecRun runs[N];
    char *argvs[N][5];
    char numbers[N][8];

    for (guint i = 0; i < N; i++) {
        g_snprintf(numbers[i], sizeof(numbers[i]), "%u", i);
        argvs[i][0] = "sh";
        argvs[i][1] = "-c";
        argvs[i][2] = "sleep 0.2; echo \"run $0\"";
        argvs[i][3] = numbers[i];
        argvs[i][4] = NULL;
        exec_run_init(&runs[i], f, argvs[i]);
    }
    for (guint i = 0; i < N; i++)
        exec_run_start(&runs[i]);
    for (guint i = 0; i < N; i++) {
        g_autofree char *want = g_strdup_printf("run %u\n", i);
        exec_run_finish(&runs[i]);
        if (!runs[i].ok)
            fail_msg("exec %u failed: %s", i, runs[i].error->message);
        assert_exec_ok(&runs[i], 0);
        assert_string_equal(runs[i].out->str, want);
        exec_run_clear(&runs[i]);
    }
}

/* A session in use when its agent is forgotten (stop, port change) is not pooled again. */
static void
test_pool_forget_during_exec(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "echo started; sleep 0.3", NULL};
    g_autoptr(VmMessage) first = NULL;
    ExecRun run;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    exec_run_init(&run, f, argv);
    exec_run_start(&run);
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    assert_int_equal(first->op, VM_OP_STDOUT);
    hostd_ssh_pool_forget(f->pool, "alpha");
    exec_run_finish(&run);
    assert_exec_ok(&run, 0);
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 0);
}

/* Concurrent execs on one agent each get a session; afterwards at most two stay idle. */
static void
test_pool_concurrent(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "sleep 0.5; echo done", NULL};
    ExecRun runs[3];

    for (gsize i = 0; i < G_N_ELEMENTS(runs); i++) {
        exec_run_init(&runs[i], f, argv);
        exec_run_start(&runs[i]);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(runs); i++) {
        exec_run_finish(&runs[i]);
        assert_exec_ok(&runs[i], 0);
        assert_string_equal(runs[i].out->str, "done\n");
        exec_run_clear(&runs[i]);
    }
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 3);
    assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 2);
}

/* A pooled session the server has dropped meanwhile (as after a guest reboot) is replaced. */
static void
test_pool_stale_session(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"echo", "fresh", NULL};
    ExecRun run;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 1);
    server_drop_connections(f);

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "fresh\n");
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 2);
    exec_run_clear(&run);
}

static void
test_wait_ready_ok(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 1);
}

/* Host keys that are not the pinned one fail at once, without retries. */
static void
test_wait_ready_host_key(void **state)
{
    static const struct {
        const char *known_hosts; /* NULL: the file does not exist */
        const char *message;
    } cases[] = {
        {"other", "does not match the key hostd pinned"},
        {"", "no host key"},
        {NULL, "no host key"},
        {"wrong-port", "no host key"},
    };
    Fixture *f = *state;

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        char *argv[] = {"true", NULL};
        guint connections;
        gint64 start;
        ExecRun run;

        g_unlink(f->known_hosts_path);
        if (g_strcmp0(cases[i].known_hosts, "other") == 0) {
            write_known_hosts(f, keys.other_pub_line);
        } else if (g_strcmp0(cases[i].known_hosts, "wrong-port") == 0) {
            g_autofree char *line =
                g_strdup_printf("[127.0.0.1]:%u %s\n", f->port + 1, keys.host_pub_line);

            assert_true(g_file_set_contents(f->known_hosts_path, line, -1, NULL));
        } else if (cases[i].known_hosts != NULL) {
            assert_true(g_file_set_contents(f->known_hosts_path, "", -1, NULL));
        }

        connections = hostd_ssh_pool_get_connections_opened(f->pool);
        start = g_get_monotonic_time();
        assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 20, NULL, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, NULL);
        assert_non_null(strstr(error->message, cases[i].message));
        /* One attempt, no retry. */
        assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), connections + 1);
        assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
        assert_int_equal(hostd_ssh_pool_get_idle_count(f->pool, "alpha"), 0);

        exec_run_init(&run, f, argv);
        exec_run(&run);
        vm_test_assert_error(run.error, VM_ERROR, VM_ERROR_SSH, NULL);
        assert_non_null(strstr(run.error->message, cases[i].message));
        exec_run_clear(&run);
        assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), connections + 2);
    }
}

static void
test_wait_ready_key_refused(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    /* Refusal is retried: cloud-init may install the key later. */
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 2, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, NULL);
    assert_non_null(strstr(error->message, "refused the key"));
    assert_true(hostd_ssh_pool_get_connections_opened(f->pool) >= 2);
}

static void
test_wait_ready_bad_identity(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(f->dir, "no-such-key", NULL);

    f->target.identity_path = path;
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 20, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, NULL);
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 0);
    f->target.identity_path = keys.user_key;
}

static void
test_wait_ready_nothing_listens(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    gint64 start = g_get_monotonic_time();
    gint64 elapsed;

    f->target.port = vm_test_free_port();
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 2, NULL, &error));
    elapsed = g_get_monotonic_time() - start;
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, NULL);
    assert_true(elapsed >= 2 * G_USEC_PER_SEC - 100000);
    assert_true(elapsed < 5 * G_USEC_PER_SEC);
}

/* The forwarded port of a booting guest: TCP is accepted, no banner ever comes. */
static void
test_wait_ready_silent_port(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    guint16 port = 0;
    int fd = vm_test_listen_loopback(&port);
    gint64 start;
    gint64 elapsed;

    f->target.port = port;

    start = g_get_monotonic_time();
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 3, NULL, &error));
    elapsed = g_get_monotonic_time() - start;
    close(fd);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, NULL);
    assert_true(elapsed >= 3 * G_USEC_PER_SEC - 100000);
    assert_true(elapsed < 6 * G_USEC_PER_SEC);
}

static gboolean
cancel_later(gpointer data)
{
    g_cancellable_cancel(data);
    return G_SOURCE_REMOVE;
}

static gpointer
cancel_thread(gpointer data)
{
    g_usleep(300 * 1000);
    cancel_later(data);
    return NULL;
}

static void
test_wait_ready_cancelled(void **state)
{
    Fixture *f = *state;
    g_autoptr(GCancellable) cancellable = g_cancellable_new();
    g_autoptr(GError) error = NULL;
    GThread *thread;
    gint64 start;

    f->target.port = vm_test_free_port();
    thread = g_thread_new("cancel", cancel_thread, cancellable);
    start = g_get_monotonic_time();
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 30, cancellable, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    assert_true(g_get_monotonic_time() - start < 2 * G_USEC_PER_SEC);
    g_thread_join(thread);
}

static void
test_shell_quote(void **state)
{
    static const struct {
        const char *argv[4];
        const char *quoted;
    } cases[] = {
        {{"echo", NULL}, "echo"},
        {{"ls", "-la", "/tmp/a_b.c", NULL}, "ls -la /tmp/a_b.c"},
        {{"x", "a=b:c,d+e-f", NULL}, "x a=b:c,d+e-f"},
        {{"a b", NULL}, "'a b'"},
        {{"echo", "it's", NULL}, "echo 'it'\\''s'"},
        {{"echo", "", NULL}, "echo ''"},
        {{"echo", "'", NULL}, "echo ''\\'''"},
        {{"echo", "$HOME", "*", NULL}, "echo '$HOME' '*'"},
        {{"echo", "~", "a;b", NULL}, "echo '~' 'a;b'"},
        {{"echo", "a\nb", NULL}, "echo 'a\nb'"},
        {{"echo", "\xc3\xa9", NULL}, "echo '\xc3\xa9'"},
        {{"echo", "\\", "`x`", NULL}, "echo '\\' '`x`'"},
        /* An assignment-looking first word would not be run as a command. */
        {{"FOO=bar", "x", NULL}, "'FOO=bar' x"},
        {{NULL}, ""},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *quoted = hostd_shell_quote_argv((char *const *)cases[i].argv);

        assert_string_equal(quoted, cases[i].quoted);
    }
}

static void
test_signal_exit_status(void **state)
{
    static const struct {
        const char *name;
        int status;
    } cases[] = {
        {"TERM", 143},
        {"KILL", 137},
        {"INT", 130},
        {"HUP", 129},
        {"SEGV", 139},
        {"PIPE", 141},
        {"USR2", 140},
        {"term", 255},
        {"SIGTERM", 255},
        {"", 255},
        {"WINCH@openssh.com", 255},
        {NULL, 255},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++)
        assert_int_equal(hostd_ssh_signal_exit_status(cases[i].name), cases[i].status);
}

static void
test_pool_free_null(void **state)
{
    hostd_ssh_pool_free(NULL);
}

/* ---- the SSH worker (hostd-ssh-worker.h) ---------------------------------------------------- */

/* Waits up to 10 s until alpha's worker is no longer running (@pid reaped, or replaced). */
static void
worker_wait_gone(Fixture *f, GPid pid)
{
    for (guint i = 0; i < 1000; i++) {
        g_autofree char *path = g_strdup_printf("/proc/%d", (int)pid);

        if (hostd_ssh_workers_get_pid(f->workers, "alpha") != pid &&
            !g_file_test(path, G_FILE_TEST_EXISTS))
            return;
        g_usleep(10 * 1000);
    }
    fail_msg("the SSH worker %d is still there", (int)pid);
}

/* The worker's sockets are only those hostd handed it: Unix ones without a name (its
 * channels, the requests' and the clients'), and established TCP connections to the guest's
 * sshd made by hostd; nothing listening, no other family. */
static void
assert_worker_sockets(Fixture *f, GPid pid)
{
    vm_test_assert_tcp_made_by_caller(pid, (guint)f->port, TRUE);
}

/* The exec runs in a worker process, not in the caller: confined (no capabilities,
 * no_new_privs, seccomp filter mode 2), with no session of the caller's own pool, over a
 * connection hostd made and handed it, and, when the caller is root, as the id it was given
 * (hostd gives an id of its own, never its QEMU's): that id can neither open the memory of a
 * process of the agent's id (dumpable, as QEMU is) nor signal it nor open its files, nor can the
 * agent's id signal the worker. */
static void
test_worker_confined(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "echo \"$0\"", "worker", NULL};
    g_autofree char *cap_eff = NULL, *nnp = NULL, *seccomp = NULL;
    const guint qemu_id = HOSTD_AGENT_ID_MIN + 3;
    guint expected = 0, uid = 0, gid = 0;
    gboolean change = FALSE;
    GPid pid;

    if (geteuid() == 0)
        f->target.agent_id = qemu_id;
    assert_true(
        worker_user(NULL, "alpha", f->target.agent_id, &change, &expected, &expected, NULL));
    exec_check(f, argv, 0, "worker\n");
    pid = hostd_ssh_workers_get_pid(f->workers, "alpha");
    assert_true(pid > 0 && pid != getpid());
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), 0);
    cap_eff = vm_test_proc_status(pid, "CapEff");
    nnp = vm_test_proc_status(pid, "NoNewPrivs");
    seccomp = vm_test_proc_status(pid, "Seccomp");
    assert_string_equal(cap_eff, "0000000000000000");
    assert_string_equal(nnp, "1");
    assert_string_equal(seccomp, "2");
    /* no core file, no tracer of its own uid; what it prints through hostd's pipe */
    vm_test_assert_undumpable(pid);
    vm_test_assert_output_piped(pid);
    if (geteuid() == 0) {
        g_autofree char *file = g_build_filename(f->dir, "qemu-owned", NULL);
        g_autofree char *mem = NULL;
        g_autofree char *scope = NULL;
        GPid qemu;

        vm_test_proc_ids(pid, &uid, &gid);
        assert_int_equal(uid, expected);
        assert_int_equal(gid, expected);
        assert_int_not_equal(uid, qemu_id);
        assert_int_not_equal(gid, qemu_id);

        /* A stand-in for the agent's QEMU, and a file of its id's as its disk is. */
        qemu = vm_test_sleeper_start(qemu_id);
        mem = g_strdup_printf("/proc/%d/mem", (int)qemu);
        assert_true(g_file_set_contents(file, "disk", -1, NULL));
        assert_int_equal(chmod(f->dir, 0755), 0);
        assert_int_equal(chown(file, qemu_id, qemu_id), 0);
        assert_int_equal(chmod(file, 0600), 0);
        /* What shows the checks can fail: its own id reaches all of it (its memory where Yama
         * leaves a process of the same id alone). */
        assert_int_equal(vm_test_try_as(qemu_id, qemu_id, file, O_RDWR, 0), 0);
        assert_int_equal(vm_test_try_as(qemu_id, qemu_id, NULL, 0, qemu), 0);
        if (!g_file_get_contents("/proc/sys/kernel/yama/ptrace_scope", &scope, NULL, NULL) ||
            g_str_has_prefix(scope, "0"))
            assert_int_equal(vm_test_try_as(qemu_id, qemu_id, mem, O_RDWR, 0), 0);
        assert_int_equal(vm_test_try_as(uid, gid, mem, O_RDWR, 0), EACCES);
        assert_int_equal(vm_test_try_as(uid, gid, mem, O_RDONLY, 0), EACCES);
        assert_int_equal(vm_test_try_as(uid, gid, NULL, 0, qemu), EPERM);
        assert_int_equal(vm_test_try_as(uid, gid, file, O_RDONLY, 0), EACCES);
        /* nor the other way round */
        assert_int_equal(vm_test_try_as(qemu_id, qemu_id, NULL, 0, pid), EPERM);
        vm_test_sleeper_stop(qemu);
    }
    assert_worker_sockets(f, pid);
    /* The same worker serves the next exec, on its pooled session. */
    exec_check(f, argv, 0, "worker\n");
    assert_int_equal(hostd_ssh_workers_get_pid(f->workers, "alpha"), pid);
}

/* Output, status, stdin and a terminal pass between the client and the worker as they do
 * without one. */
/* ---- the session over a virtio port, carried across a save ------------------------------- */

/* Plays QEMU's port and the guest's vmctl-ssh-serial: answers hostd's start line, joins the port
 * to the test's sshd over TCP (the guest's own sshd over loopback), and carries bytes between
 * them; the port's connection can end and another take its place (a save and the wake) while
 * the TCP connection, the guest's side of the session, stays. */
typedef struct {
    GMutex lock;
    int port;        /* the current QEMU's end of the port, -1 between QEMUs */
    int next_port;   /* handed in by the test */
    gboolean unplug; /* the test ends the current QEMU */
    int tcp;
    int wake[2];
    gboolean stop;
    GThread *thread;
} GuestPort;

static void
guest_port_copy(int from, int to, gboolean *ended)
{
    char buf[16384];
    ssize_t n = read(from, buf, sizeof buf);

    if (n <= 0) {
        *ended = TRUE;
        return;
    }
    for (ssize_t done = 0; done < n;) {
        ssize_t w = send(to, buf + done, (size_t)(n - done), MSG_NOSIGNAL);
        if (w <= 0) {
            *ended = TRUE;
            return;
        }
        done += w;
    }
}

static gpointer
guest_port_thread(gpointer data)
{
    GuestPort *g = data;

    for (;;) {
        struct pollfd fds[3] = {{.fd = g->wake[0], .events = POLLIN},
                                {.fd = g->tcp, .events = POLLIN},
                                {.fd = -1, .events = POLLIN}};
        gboolean ended = FALSE;

        g_mutex_lock(&g->lock);
        if (g->stop) {
            g_mutex_unlock(&g->lock);
            return NULL;
        }
        /* The QEMU ends between two reads: what sshd sends after it waits in the TCP
         * connection, as it waits in the guest. */
        if (g->unplug && g->port >= 0)
            close(g_steal_fd(&g->port));
        g->unplug = FALSE;
        if (g->port < 0 && g->next_port >= 0)
            g->port = g_steal_fd(&g->next_port);
        fds[2].fd = g->port;
        g_mutex_unlock(&g->lock);
        /* No QEMU: what sshd sends waits in the TCP connection, as it would in the guest. */
        if (fds[2].fd < 0)
            fds[1].fd = -1;
        assert_true(poll(fds, 3, -1) > 0);
        if (fds[0].revents & POLLIN) {
            char c;
            assert_int_equal(read(g->wake[0], &c, 1), 1);
        }
        if (fds[1].revents & (POLLIN | POLLHUP))
            guest_port_copy(g->tcp, fds[2].fd, &ended);
        if (ended)
            return NULL; /* the session ended */
        if (fds[2].revents & (POLLIN | POLLHUP)) {
            guest_port_copy(fds[2].fd, g->tcp, &ended);
            if (ended) {
                g_mutex_lock(&g->lock);
                close(g_steal_fd(&g->port));
                g_mutex_unlock(&g->lock);
            }
        }
    }
}

/* Waits for hostd's start line on @port, answers it and joins the port to the test's sshd. */
static GuestPort *
guest_port_start(Fixture *f, int port)
{
    GuestPort *g = g_new0(GuestPort, 1);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)f->port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    GString *line = g_string_new(NULL);
    char c;

    while (read(port, &c, 1) == 1 && c != '\n')
        g_string_append_c(line, c);
    assert_string_equal(line->str, "vmctl-ssh-start");
    g_string_free(line, TRUE);
    assert_int_equal(send(port, "vmctl-ssh-starting\n", 19, MSG_NOSIGNAL), 19);
    g->tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(g->tcp, (struct sockaddr *)&addr, sizeof addr), 0);
    g_mutex_init(&g->lock);
    g->port = port;
    g->next_port = -1;
    assert_int_equal(pipe2(g->wake, O_CLOEXEC), 0);
    g->thread = g_thread_new("guest-port", guest_port_thread, g);
    return g;
}

static void
guest_port_plug(GuestPort *g, int port)
{
    g_mutex_lock(&g->lock);
    g->next_port = port;
    g_mutex_unlock(&g->lock);
    assert_int_equal(write(g->wake[1], "", 1), 1);
}

/* The QEMU exits: its end of the port closes (what it read was delivered). */
static void
guest_port_unplug(GuestPort *g)
{
    g_mutex_lock(&g->lock);
    g->unplug = TRUE;
    g_mutex_unlock(&g->lock);
    assert_int_equal(write(g->wake[1], "", 1), 1);
}

static void
guest_port_free(GuestPort *g)
{
    g_mutex_lock(&g->lock);
    g->stop = TRUE;
    g_mutex_unlock(&g->lock);
    assert_int_equal(write(g->wake[1], "", 1), 1);
    g_thread_join(g->thread);
    close(g->tcp);
    if (g->port >= 0)
        close(g->port);
    if (g->next_port >= 0)
        close(g->next_port);
    close(g->wake[0]);
    close(g->wake[1]);
    g_mutex_clear(&g->lock);
    g_free(g);
}

typedef struct {
    Fixture *f;
    int fd;
    gboolean ok;
    GError *error;
} SerialCall;

static gpointer
serial_call_thread(gpointer data)
{
    SerialCall *call = data;

    call->ok =
        hostd_ssh_pool_serial(call->f->pool, &call->f->target, call->fd, FALSE, &call->error);
    return NULL;
}

/* The sshd process an exec's command ran under, as $PPID says. */
static char *
exec_ppid(Fixture *f)
{
    char *argv[] = {"sh", "-c", "echo $PPID", NULL};
    ExecRun run;
    char *ppid;

    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    ppid = g_strdup(g_strstrip(run.out->str));
    exec_run_clear(&run);
    return ppid;
}

static void
test_worker_serial_carried(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *before = NULL;
    g_autofree char *after = NULL;
    SerialCall call = {.f = f};
    GuestPort *guest;
    GThread *thread;
    int qemu1[2], qemu2[2], qemu3[2];

    /* A new session over the port: hostd's call returns once it is held. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qemu1), 0);
    call.fd = qemu1[0];
    thread = g_thread_new("serial", serial_call_thread, &call);
    guest = guest_port_start(f, qemu1[1]);
    g_thread_join(thread);
    vm_test_assert_no_error(call.error);
    assert_true(call.ok);
    before = exec_ppid(f);

    /* The save: hostd lets the pool sleep, the QEMU ends; the wake: a new QEMU's port, handed
     * over before anything is sent. The commands after it run on the same session: no
     * handshake, the same sshd process. */
    hostd_ssh_pool_sleep(f->pool, f->target.agent);
    guest_port_unplug(guest);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qemu2), 0);
    guest_port_plug(guest, qemu2[1]);
    assert_true(hostd_ssh_pool_serial(f->pool, &f->target, qemu2[0], TRUE, &error));
    vm_test_assert_no_error(error);
    after = exec_ppid(f);
    assert_string_equal(after, before);
    g_clear_pointer(&after, g_free);
    after = exec_ppid(f);
    assert_string_equal(after, before);

    /* A worker started since holds no session: a resume is refused at once. */
    hostd_ssh_pool_forget(f->pool, f->target.agent);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qemu3), 0);
    assert_false(hostd_ssh_pool_serial(f->pool, &f->target, qemu3[0], TRUE, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_SSH));
    close(qemu3[1]);
    guest_port_free(guest);
}

/* hostd stopping while a new session over a port is still being made: the closing of the
 * workers ends the attach at once, not after its connect deadline (300 s), which kept hostd from
 * exiting (hostd_context_free() waits for every attach). */
static void
test_worker_serial_closed(void **state)
{
    Fixture *f = *state;
    SerialCall call = {.f = f};
    GThread *thread;
    int qemu[2];
    gint64 start;

    /* The guest's end of the port says nothing: the worker waits for the guest's sshd on it. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, qemu), 0);
    call.fd = qemu[0];
    thread = g_thread_new("serial", serial_call_thread, &call);
    for (int i = 0; i < 200 && hostd_ssh_workers_get_pid(f->workers, f->target.agent) == 0; i++)
        g_usleep(50000);
    assert_true(hostd_ssh_workers_get_pid(f->workers, f->target.agent) > 0);
    g_usleep(500000); /* the serial request sent */

    start = g_get_monotonic_time();
    hostd_ssh_workers_close(f->workers);
    g_thread_join(thread);
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
    assert_false(call.ok);
    vm_test_assert_error(call.error, VM_ERROR, VM_ERROR_SSH, NULL);
    g_clear_error(&call.error);
    close(qemu[1]);
}

static void
test_worker_exec(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "cat; echo err >&2; exit 3", NULL};
    char *tty_argv[] = {"sh", "-c", "test -t 0 && stty size", NULL};
    char *env[] = {"FOO=x y", NULL};
    char *env_argv[] = {"sh", "-c", "echo \"$FOO|$PWD\"", NULL};
    ExecRun run;

    exec_run_init(&run, f, argv);
    run.input = g_bytes_new_static("one\ntwo\n", 8);
    run.input_eof = TRUE;
    exec_run(&run);
    assert_exec_ok(&run, 3);
    assert_string_equal(run.out->str, "one\ntwo\n");
    assert_string_equal(run.err->str, "err\n");
    exec_run_clear(&run);

    exec_run_init(&run, f, tty_argv);
    run.request.tty = TRUE;
    run.request.cols = 100;
    run.request.rows = 30;
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "30 100\r\n");
    exec_run_clear(&run);

    exec_run_init(&run, f, env_argv);
    run.request.env = env;
    run.request.cwd = "/tmp";
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "x y|/tmp\n");
    exec_run_clear(&run);
}

static void
note_before_command(gpointer data)
{
    g_atomic_int_inc((gint *)data);
}

/* The caller's before_command runs once, before the command, though the command is sent by the
 * worker; the worker's phases reach the caller's trace. */
static void
test_worker_before_command_and_trace(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"true", NULL};
    g_autofree char *text = NULL;
    gint before = 0;
    VmTrace trace;
    ExecRun run;

    vm_trace_init(&trace);
    exec_run_init(&run, f, argv);
    run.request.before_command = note_before_command;
    run.request.before_command_data = &before;
    run.request.trace = &trace;
    exec_run(&run);
    assert_exec_ok(&run, 0);
    exec_run_clear(&run);
    assert_int_equal(g_atomic_int_get(&before), 1);
    text = vm_trace_finish(&trace, "exec");
    assert_non_null(strstr(text, "ssh worker "));
    assert_non_null(strstr(text, "command ran "));
    assert_non_null(strstr(text, "exit sent "));
}

/* A worker killed between execs is reaped and replaced by the next one; one killed during an
 * exec fails that exec at once (no EXIT frame), and the next runs on a new worker. */
static void
test_worker_killed(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"echo", "up", NULL};
    char *sleep_argv[] = {"sh", "-c", "echo started; sleep 30", NULL};
    g_autoptr(VmMessage) first = NULL;
    GPid pid, again;
    gint64 start;
    ExecRun run;

    exec_check(f, argv, 0, "up\n");
    pid = hostd_ssh_workers_get_pid(f->workers, "alpha");
    assert_int_equal(kill(pid, SIGKILL), 0);
    worker_wait_gone(f, pid);
    exec_check(f, argv, 0, "up\n");
    again = hostd_ssh_workers_get_pid(f->workers, "alpha");
    assert_true(again > 0 && again != pid);

    exec_run_init(&run, f, sleep_argv);
    exec_run_start(&run);
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    assert_int_equal(first->op, VM_OP_STDOUT);
    start = g_get_monotonic_time();
    assert_int_equal(kill(again, SIGKILL), 0);
    exec_run_finish(&run);
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    assert_false(run.ok);
    vm_test_assert_error(run.error, VM_ERROR, VM_ERROR_SSH, NULL);
    assert_non_null(strstr(run.error->message, "SSH worker"));
    exec_run_clear(&run);
    worker_wait_gone(f, again);
    exec_check(f, argv, 0, "up\n");
}

/* Whether every thread of @pid is stopped: a group stop reaches each thread on its own, and a
 * thread on another CPU may still act (read a hang-up, answer) just after kill() returned. */
static gboolean
worker_all_stopped(GPid pid)
{
    g_autofree char *dir_path = g_strdup_printf("/proc/%d/task", (int)pid);
    g_autoptr(GDir) dir = g_dir_open(dir_path, 0, NULL);
    const char *tid;

    assert_non_null(dir);
    while ((tid = g_dir_read_name(dir)) != NULL) {
        g_autofree char *stat_path = g_strdup_printf("%s/%s/stat", dir_path, tid);
        g_autofree char *stat = NULL;
        const char *state;

        if (!g_file_get_contents(stat_path, &stat, NULL, NULL))
            continue; /* the thread ended */
        state = strrchr(stat, ')');
        if (state == NULL || state[1] != ' ' || (state[2] != 'T' && state[2] != 't'))
            return FALSE;
    }
    return TRUE;
}

/* Stops alpha's running worker (SIGSTOP: alive and silent, as its agent's QEMU could leave it)
 * and returns its pid once all its threads are stopped. */
static GPid
worker_stop(Fixture *f)
{
    GPid pid = hostd_ssh_workers_get_pid(f->workers, "alpha");
    gint64 until;

    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    until = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;
    while (!worker_all_stopped(pid)) {
        assert_true(g_get_monotonic_time() < until);
        g_usleep(1000);
    }
    return pid;
}

/* Asserts that the request that began at @start failed with @error within @allowed_us (the
 * answer deadline, 2 s here, and what it waited on top) and not before it, saying the worker
 * was replaced. */
static void
assert_given_up(const GError *error, gint64 start, gint64 allowed_us)
{
    gint64 took = g_get_monotonic_time() - start;

    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, NULL);
    if (strstr(error->message, "the SSH worker of agent 'alpha' did not answer within") == NULL ||
        strstr(error->message, "it was replaced") == NULL)
        fail_msg("not the deadline's error: %s", error->message);
    assert_true(took >= allowed_us);
    assert_true(took < allowed_us + 3 * G_USEC_PER_SEC);
}

/* A stopped worker holds nothing up past its deadline: an exec, a wait for the guest and a
 * sleep (the idle thread's, before a save) each end within it, the exec and the wait with an
 * error that says so; the worker is killed and forgotten, and the next exec runs on a new one. */
static void
test_worker_stopped(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"echo", "up", NULL};
    g_autoptr(GError) error = NULL;
    GPid pid, again;
    gint64 start;
    ExecRun run;

    exec_check(f, argv, 0, "up\n");
    pid = worker_stop(f);
    exec_run_init(&run, f, argv);
    start = g_get_monotonic_time();
    exec_run(&run);
    assert_false(run.ok);
    assert_given_up(run.error, start, 2 * G_USEC_PER_SEC);
    exec_run_clear(&run);
    worker_wait_gone(f, pid);
    exec_check(f, argv, 0, "up\n");
    again = hostd_ssh_workers_get_pid(f->workers, "alpha");
    assert_true(again > 0 && again != pid);

    /* A wait: the worker's own wait (1 s) and then the answer deadline. */
    pid = worker_stop(f);
    start = g_get_monotonic_time();
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 1, NULL, &error));
    assert_given_up(error, start, 3 * G_USEC_PER_SEC);
    g_clear_error(&error);
    worker_wait_gone(f, pid);
    exec_check(f, argv, 0, "up\n");

    /* A sleep returns within the deadline; the worker is gone and none starts until asked. */
    pid = worker_stop(f);
    start = g_get_monotonic_time();
    hostd_ssh_pool_sleep(f->pool, "alpha");
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    worker_wait_gone(f, pid);
    assert_int_equal(hostd_ssh_workers_get_pid(f->workers, "alpha"), 0);
    exec_check(f, argv, 0, "up\n");
    assert_true(hostd_ssh_workers_get_pid(f->workers, "alpha") != pid);
}

/* An exec under way has no deadline while its command runs, however long, but its worker must
 * answer a ping every interval; once the client hangs up, the worker's end is owed within the
 * deadline. A worker stopped during a command is killed either way within its deadline. */
static void
test_worker_stopped_during_exec(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "echo started; sleep 3; echo done", NULL};
    char *long_argv[] = {"sh", "-c", "echo started; sleep 30", NULL};
    char *up_argv[] = {"echo", "up", NULL};
    g_autoptr(VmMessage) first = NULL;
    gint64 start;
    GPid pid;
    ExecRun run;

    /* Longer than the deadline, and fine. */
    exec_run_init(&run, f, argv);
    exec_run(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "started\ndone\n");
    exec_run_clear(&run);

    /* A client that hangs up on a worker that answers: its end comes in time, it stays. */
    pid = hostd_ssh_workers_get_pid(f->workers, "alpha");
    exec_run_init(&run, f, long_argv);
    exec_run_start(&run);
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    close(run.fds[1]);
    run.fds[1] = -1;
    g_thread_join(run.exec_thread);
    run.exec_thread = NULL;
    vm_test_assert_error(run.error, VM_ERROR, VM_ERROR_CANCELLED, NULL);
    exec_run_clear(&run);
    assert_int_equal(hostd_ssh_workers_get_pid(f->workers, "alpha"), pid);
    g_clear_pointer(&first, vm_message_free);

    exec_run_init(&run, f, long_argv);
    exec_run_start(&run);
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    assert_int_equal(first->op, VM_OP_STDOUT);
    pid = worker_stop(f);
    /* The client goes away: the stopped worker never says the exec ended. */
    close(run.fds[1]);
    run.fds[1] = -1;
    start = g_get_monotonic_time();
    g_thread_join(run.exec_thread);
    run.exec_thread = NULL;
    assert_false(run.ok);
    assert_given_up(run.error, start, 2 * G_USEC_PER_SEC);
    exec_run_clear(&run);
    worker_wait_gone(f, pid);
    exec_check(f, up_argv, 0, "up\n");
    g_clear_pointer(&first, vm_message_free);

    /* The client stays: the next ping goes unanswered. */
    exec_run_init(&run, f, long_argv);
    exec_run_start(&run);
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    pid = worker_stop(f);
    start = g_get_monotonic_time();
    exec_run_finish(&run);
    assert_false(run.ok);
    assert_given_up(run.error, start, 2 * G_USEC_PER_SEC);
    exec_run_clear(&run);
    worker_wait_gone(f, pid);
    exec_check(f, up_argv, 0, "up\n");
}

/* Forgetting the agent (stop, a new port) lets an exec under way finish on its worker, which
 * then exits; the next exec gets a new worker. */
static void
test_worker_forget(void **state)
{
    Fixture *f = *state;
    char *argv[] = {"sh", "-c", "echo started; sleep 0.5; echo done", NULL};
    char *argv2[] = {"echo", "next", NULL};
    g_autoptr(VmMessage) first = NULL;
    GPid pid;
    ExecRun run;

    exec_run_init(&run, f, argv);
    exec_run_start(&run);
    first = vm_message_read_fd(run.fds[1], NULL, NULL);
    assert_non_null(first);
    pid = hostd_ssh_workers_get_pid(f->workers, "alpha");
    hostd_ssh_pool_forget(f->pool, "alpha");
    assert_int_equal(hostd_ssh_workers_get_pid(f->workers, "alpha"), 0);
    exec_run_finish(&run);
    assert_exec_ok(&run, 0);
    assert_string_equal(run.out->str, "done\n");
    exec_run_clear(&run);
    worker_wait_gone(f, pid);
    exec_check(f, argv2, 0, "next\n");
    assert_true(hostd_ssh_workers_get_pid(f->workers, "alpha") != pid);
}

/* Waits through a worker: ready, a pinned key that does not match (at once, the worker's
 * message kept), a port where nothing listens (the timeout), a key hostd cannot read. */
static void
test_worker_wait_ready(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *missing = g_build_filename(f->dir, "no-such-key", NULL);
    gint64 start;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, &error));
    vm_test_assert_no_error(error);

    write_known_hosts(f, keys.other_pub_line);
    start = g_get_monotonic_time();
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 20, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, NULL);
    assert_non_null(strstr(error->message, "does not match the key hostd pinned"));
    assert_true(g_get_monotonic_time() - start < 10 * G_USEC_PER_SEC);
    g_clear_error(&error);
    write_known_hosts(f, keys.host_pub_line);

    /* Pinned for another port only, or not at all: nothing to check the key against. */
    {
        g_autofree char *line =
            g_strdup_printf("[127.0.0.1]:%u %s\n", f->port + 1, keys.host_pub_line);

        assert_true(g_file_set_contents(f->known_hosts_path, line, -1, NULL));
        assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 20, NULL, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, "no host key");
        g_clear_error(&error);
        assert_true(g_file_set_contents(f->known_hosts_path, "", -1, NULL));
        assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 20, NULL, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, "no host key");
        g_clear_error(&error);
    }

    /* A port where nothing listens (pinned for it): the wait times out. */
    f->port = f->target.port = vm_test_free_port();
    write_known_hosts(f, keys.host_pub_line);
    start = g_get_monotonic_time();
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 2, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, NULL);
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    g_clear_error(&error);

    f->target.identity_path = missing;
    assert_false(hostd_ssh_wait_ready(f->pool, &f->target, 2, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, NULL);
    assert_non_null(strstr(error->message, "cannot read the SSH key"));
    f->target.identity_path = keys.user_key;
}

/* ---- forwarded guest ports (hostd-ssh-forward.h) ------------------------------------------- */

/* That the connections to the server were @n, made by the pool itself; with workers, that the
 * caller made none (the worker's are its own). */
static void
assert_own_connections(Fixture *f, guint n)
{
    assert_int_equal(hostd_ssh_pool_get_connections_opened(f->pool), f->workers != NULL ? 0 : n);
}

/* The forwarder of the tests: its wake hands out the fixture's target (or refuses), its log is
 * kept. Guest ports are on this host's loopback, where the fixture's sshd connects. */
typedef struct {
    Fixture *f;
    HostdSshForward *fwd;
    GMutex lock;
    GString *log; /* "PORT: message" lines */
    gint wakes;
    gboolean refuse;
} Forward;

static gboolean
forward_wake(const char *agent, gpointer user_data, HostdSshTarget *ret_target, GPtrArray *keep,
             GError **error)
{
    Forward *fw = user_data;

    g_atomic_int_inc(&fw->wakes);
    if (fw->refuse)
        return vm_throw(error, VM_ERROR_BAD_STATE, "agent '%s' is stopped", agent);
    *ret_target = fw->f->target;
    return TRUE;
}

static void
forward_log(const char *agent, guint guest_port, const char *message, gpointer user_data)
{
    Forward *fw = user_data;

    g_mutex_lock(&fw->lock);
    g_string_append_printf(fw->log, "%s %u: %s\n", agent, guest_port, message);
    g_mutex_unlock(&fw->lock);
}

static void
forward_init(Forward *fw, Fixture *f)
{
    *fw = (Forward){.f = f};
    g_mutex_init(&fw->lock);
    fw->log = g_string_new(NULL);
    fw->fwd = hostd_ssh_forward_new(f->pool, forward_wake, forward_log, fw);
}

static void
forward_clear(Forward *fw)
{
    hostd_ssh_forward_free(fw->fwd);
    g_string_free(fw->log, TRUE);
    g_mutex_clear(&fw->lock);
}

static char *
forward_log_text(Forward *fw)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&fw->lock);

    return g_strdup(fw->log->str);
}

/* Serves @guest_port of agent alpha on a free host port, which it returns. */
static guint
forward_add(Forward *fw, guint guest_port)
{
    guint port = vm_test_free_port();
    g_autoptr(GError) error = NULL;

    assert_true(hostd_ssh_forward_add(fw->fwd, "alpha", guest_port, port, &error));
    vm_test_assert_no_error(error);
    return port;
}

/* Waits up to 10 s until alpha has @n open connections and, with @idle, until its session is
 * back in the pool. */
static void
forward_wait(Forward *fw, guint n, gboolean idle)
{
    for (guint i = 0; i < 1000; i++) {
        /* With workers the sessions are theirs: the pool here holds none. */
        if (hostd_ssh_forward_open_connections(fw->fwd, "alpha") == n &&
            (!idle || fw->f->workers != NULL ||
             hostd_ssh_pool_get_idle_count(fw->f->pool, "alpha") > 0))
            return;
        g_usleep(10 * 1000);
    }
    fail_msg("alpha has %u forwarded connections, not %u",
             hostd_ssh_forward_open_connections(fw->fwd, "alpha"), n);
}

/* Reads @fd to its end (each read giving up after its receive timeout). */
static GByteArray *
read_all(int fd)
{
    GByteArray *all = g_byte_array_new();
    guint8 buf[65536];

    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail_msg("reading a forwarded connection: %s", g_strerror(errno));
        if (n == 0)
            return all;
        g_byte_array_append(all, buf, (guint)n);
    }
}

static void
assert_echo(int fd, const char *text)
{
    g_autoptr(GString) got = NULL;

    vm_test_send_text(fd, text);
    got = vm_test_read_until(fd, text, 10000, NULL);
    assert_string_equal(got->str, text);
}

/* A connection reaches the guest's port through a channel, bytes go both ways, the client's
 * FIN reaches the guest's server and its close comes back; the session then goes back to the
 * pool. */
static void
test_forward_echo(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    g_autofree char *log = NULL;
    g_autoptr(GByteArray) rest = NULL;
    guint connections = 0;
    Forward fw;
    guint port;
    int fd;

    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    assert_true(hostd_ssh_forward_lookup(fw.fwd, "alpha", sink->port, &connections));
    assert_int_equal(connections, 0);
    assert_int_equal(hostd_ssh_forward_last_activity(fw.fwd, "alpha"), 0);

    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "hello\n");
    assert_echo(fd, "and again\n");
    assert_true(hostd_ssh_forward_lookup(fw.fwd, "alpha", sink->port, &connections));
    assert_int_equal(connections, 1);
    assert_int_equal(hostd_ssh_forward_open_connections(fw.fwd, "alpha"), 1);
    assert_true(hostd_ssh_forward_last_activity(fw.fwd, "alpha") > 0);

    shutdown(fd, SHUT_WR);
    rest = read_all(fd);
    assert_int_equal(rest->len, 0);
    close(fd);
    forward_wait(&fw, 0, TRUE);
    assert_int_equal(g_atomic_int_get(&fw.wakes), 1);
    assert_int_equal(g_atomic_int_get(&sink->connections), 1);
    assert_own_connections(f, 1);
    log = forward_log_text(&fw);
    assert_string_equal(log, "");

    /* The next connection takes the pooled session: no new handshake. */
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "third\n");
    close(fd);
    forward_wait(&fw, 0, TRUE);
    assert_int_equal(g_atomic_int_get(&fw.wakes), 2);
    assert_own_connections(f, 1);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

/* 8 MiB each way, at once, through one connection, arrive whole and in order. */
static void
test_forward_large(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    gsize len = 8 * 1024 * 1024;
    g_autofree guint8 *data = g_malloc(len);
    g_autoptr(GByteArray) got = NULL;
    GThread *sender;
    Forward fw;
    guint port;
    int fd;

    for (gsize i = 0; i < len; i++)
        data[i] = (guint8)(i * 7 + i / 4096);
    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 20);
    sender = vm_test_send_thread(fd, data, len);
    got = read_all(fd);
    assert_int_equal(GPOINTER_TO_SIZE(g_thread_join(sender)), len);
    assert_int_equal(got->len, len);
    assert_memory_equal(got->data, data, len);
    close(fd);
    forward_wait(&fw, 0, FALSE);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

typedef struct {
    int listen_fd;
    const char *greeting; /* sent to each client, which is then closed */
    gboolean flood;       /* instead: send without end to the client until @stop */
    gint stop;
    GMutex lock;
    gint64 sent; /* lock */
} GuestServer;

static gint64
guest_server_sent(GuestServer *s)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&s->lock);

    return s->sent;
}

static gpointer
guest_server_thread(gpointer data)
{
    GuestServer *s = data;
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    static guint8 chunk[65536];

    if (fd < 0)
        return NULL;
    if (!s->flood) {
        send(fd, s->greeting, strlen(s->greeting), MSG_NOSIGNAL);
        close(fd);
        return NULL;
    }
    while (!g_atomic_int_get(&s->stop)) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        ssize_t n = send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n > 0) {
            g_mutex_lock(&s->lock);
            s->sent += n;
            g_mutex_unlock(&s->lock);
        } else if (n < 0 && errno != EAGAIN && errno != EINTR)
            break;
        else
            poll(&pfd, 1, 100);
    }
    close(fd);
    return NULL;
}

/* The guest's server answers and closes: the client gets the answer, then EOF. */
static void
test_forward_guest_closes(void **state)
{
    Fixture *f = *state;
    guint16 guest_port;
    GuestServer server = {.greeting = "bye\n"};
    g_autoptr(GByteArray) got = NULL;
    GThread *thread;
    Forward fw;
    guint port;
    int fd;

    server.listen_fd = vm_test_listen_loopback(&guest_port);
    thread = g_thread_new("guest-server", guest_server_thread, &server);
    forward_init(&fw, f);
    port = forward_add(&fw, guest_port);
    fd = vm_test_connect_loopback(port, 10);
    got = read_all(fd);
    g_byte_array_append(got, (const guint8 *)"", 1);
    assert_string_equal((const char *)got->data, "bye\n");
    close(fd);
    forward_wait(&fw, 0, FALSE);
    g_thread_join(thread);
    close(server.listen_fd);

    forward_clear(&fw);
}

/* Nothing listens on the guest's port: the client's connection closes cleanly, one line says
 * why, and the session serves the next connection. */
static void
test_forward_no_listener(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    guint16 nobody = vm_test_free_port();
    g_autoptr(GByteArray) got = NULL;
    g_autofree char *log = NULL;
    g_autofree char *want = NULL;
    Forward fw;
    guint port;
    int fd;

    forward_init(&fw, f);
    port = forward_add(&fw, nobody);
    fd = vm_test_connect_loopback(port, 10);
    /* What the client sent is taken before the close: it sees an end, not a reset. */
    vm_test_send_text(fd, "GET / HTTP/1.0\r\n\r\n");
    got = read_all(fd);
    assert_int_equal(got->len, 0);
    close(fd);
    forward_wait(&fw, 0, FALSE);
    log = forward_log_text(&fw);
    want = g_strdup_printf(
        "alpha %u: nothing took the connection on port %u in the guest: ", nobody, nobody);
    assert_true(g_str_has_prefix(log, want));
    assert_int_equal(strchr(log, '\n') - log + 1, (long)strlen(log));

    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "still here\n");
    close(fd);
    forward_wait(&fw, 0, FALSE);
    assert_own_connections(f, 1);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

/* A wake that fails refuses the connection before any SSH. */
static void
test_forward_wake_refused(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    g_autoptr(GByteArray) got = NULL;
    g_autofree char *log = NULL;
    g_autofree char *want = NULL;
    Forward fw;
    guint port;
    int fd;

    forward_init(&fw, f);
    fw.refuse = TRUE;
    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 10);
    vm_test_send_text(fd, "GET / HTTP/1.0\r\n\r\n");
    got = read_all(fd);
    assert_int_equal(got->len, 0);
    close(fd);
    forward_wait(&fw, 0, FALSE);
    log = forward_log_text(&fw);
    want = g_strdup_printf("alpha %u: connection refused: agent 'alpha' is stopped\n", sink->port);
    assert_string_equal(log, want);
    assert_own_connections(f, 0);
    assert_int_equal(g_atomic_int_get(&sink->connections), 0);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

/* Many connections at once share one session, each with its own bytes. */
static void
test_forward_many(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    enum { N = 12 };
    int fds[N];
    Forward fw;
    guint port;

    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    for (guint i = 0; i < N; i++)
        fds[i] = vm_test_connect_loopback(port, 10);
    for (guint i = 0; i < N; i++) {
        g_autofree char *text = g_strdup_printf("connection %u\n", i);

        assert_echo(fds[i], text);
    }
    forward_wait(&fw, N, FALSE);
    for (guint i = 0; i < N; i++)
        close(fds[i]);
    forward_wait(&fw, 0, TRUE);
    assert_own_connections(f, 1);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

/* A guest that sends without end to a client that reads nothing fills the buffers on the way
 * and then waits: what hostd holds for the connection is bounded. Once the client reads, the
 * bytes flow again. */
static void
test_forward_backpressure(void **state)
{
    Fixture *f = *state;
    GuestServer server = {.flood = TRUE};
    guint16 guest_port;
    gint64 sent = -1;
    guint8 buf[65536];
    gsize taken = 0;
    GThread *thread;
    Forward fw;
    guint port;
    int fd;

    server.listen_fd = vm_test_listen_loopback(&guest_port);
    thread = g_thread_new("guest-server", guest_server_thread, &server);
    forward_init(&fw, f);
    port = forward_add(&fw, guest_port);
    fd = vm_test_connect_loopback(port, 10);

    /* Stalled: nothing more went out in the last second. */
    for (guint i = 0; i < 80; i++) {
        g_usleep(250 * 1000);
        if (i % 4 == 3) {
            gint64 now = guest_server_sent(&server);

            if (now == sent)
                break;
            sent = now;
        }
    }
    assert_true(sent > 0);
    assert_int_equal(guest_server_sent(&server), sent);
    /* Kernel socket buffers on both hops, one channel window in libssh and in sshd, one buffer
     * of hostd's: far below this. */
    assert_true(sent < 64 * 1024 * 1024);

    while (taken < (gsize)sent + 4 * 1024 * 1024) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);

        assert_true(n > 0);
        taken += (gsize)n;
    }
    assert_true(guest_server_sent(&server) > sent);

    g_atomic_int_set(&server.stop, 1);
    close(fd);
    g_thread_join(thread);
    close(server.listen_fd);
    forward_wait(&fw, 0, FALSE);
    forward_clear(&fw);
}

/* A removed port's listener is gone when the call returns and its connections close; the port
 * can be served again at once. */
static void
test_forward_remove(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    g_autoptr(GByteArray) got = NULL;
    g_autoptr(GError) error = NULL;
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    Forward fw;
    guint port;
    int fd;
    int probe;

    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "before\n");

    hostd_ssh_forward_remove(fw.fwd, "alpha", sink->port);
    assert_false(hostd_ssh_forward_lookup(fw.fwd, "alpha", sink->port, NULL));
    sin.sin_port = htons((guint16)port);
    probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(connect(probe, (struct sockaddr *)&sin, sizeof(sin)) < 0);
    assert_int_equal(errno, ECONNREFUSED);
    close(probe);
    got = read_all(fd);
    assert_int_equal(got->len, 0);
    close(fd);
    forward_wait(&fw, 0, FALSE);
    /* Unknown ports and agents: nothing happens. */
    hostd_ssh_forward_remove(fw.fwd, "alpha", sink->port);
    hostd_ssh_forward_remove_agent(fw.fwd, "nobody");

    assert_true(hostd_ssh_forward_add(fw.fwd, "alpha", sink->port, port, &error));
    vm_test_assert_no_error(error);
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "after\n");

    /* Removing the agent stops every port of it, and the connections on them. */
    port = forward_add(&fw, 8080);
    hostd_ssh_forward_remove_agent(fw.fwd, "alpha");
    assert_false(hostd_ssh_forward_lookup(fw.fwd, "alpha", sink->port, NULL));
    g_clear_pointer(&got, g_byte_array_unref);
    got = read_all(fd);
    assert_int_equal(got->len, 0);
    close(fd);
    assert_int_equal(hostd_ssh_forward_open_connections(fw.fwd, "alpha"), 0);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

/* A guest port served twice, a host port taken: refused, nothing left behind. */
static void
test_forward_add_errors(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    Forward fw;
    guint port;

    forward_init(&fw, f);
    port = forward_add(&fw, 80);
    assert_false(hostd_ssh_forward_add(fw.fwd, "alpha", 80, vm_test_free_port(), &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_EXISTS, "guest port 80 of agent 'alpha'");
    g_clear_error(&error);
    assert_false(hostd_ssh_forward_add(fw.fwd, "beta", 80, port, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NO_RESOURCES, "is taken");
    assert_false(hostd_ssh_forward_lookup(fw.fwd, "beta", 80, NULL));
    assert_true(hostd_ssh_forward_lookup(fw.fwd, "alpha", 80, NULL));

    forward_clear(&fw);
}

/* A pooled session the server dropped meanwhile (a guest that restarted) is replaced. */
static void
test_forward_stale_session(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    Forward fw;
    guint port;
    int fd;

    assert_true(hostd_ssh_wait_ready(f->pool, &f->target, 10, NULL, NULL));
    server_drop_connections(f);
    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "fresh\n");
    close(fd);
    forward_wait(&fw, 0, FALSE);
    assert_own_connections(f, 2);

    forward_clear(&fw);
    vm_test_sink_free(sink);
}

/* Freeing the forwarder with connections open closes them. */
static void
test_forward_free_open(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    g_autoptr(GByteArray) got = NULL;
    Forward fw;
    guint port;
    int fd;

    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "open\n");
    forward_clear(&fw);
    got = read_all(fd);
    assert_int_equal(got->len, 0);
    close(fd);
    hostd_ssh_forward_free(NULL);
    vm_test_sink_free(sink);
}

/* Bytes moving on a connection a worker carries count as the agent's activity in hostd (what
 * keeps it from idling), while the connection stays open. */
static void
test_worker_forward_activity(void **state)
{
    Fixture *f = *state;
    VmTestSink *sink = vm_test_sink_new();
    Forward fw;
    gint64 before;
    guint port;
    int fd;

    forward_init(&fw, f);
    port = forward_add(&fw, sink->port);
    fd = vm_test_connect_loopback(port, 10);
    assert_echo(fd, "one\n");
    g_usleep(1200 * 1000);
    before = g_get_monotonic_time();
    assert_echo(fd, "two\n");
    for (guint i = 0; i < 300 && hostd_ssh_forward_last_activity(fw.fwd, "alpha") < before; i++)
        g_usleep(10 * 1000);
    assert_true(hostd_ssh_forward_last_activity(fw.fwd, "alpha") >= before);
    assert_int_equal(hostd_ssh_forward_open_connections(fw.fwd, "alpha"), 1);
    close(fd);
    forward_wait(&fw, 0, FALSE);
    forward_clear(&fw);
    vm_test_sink_free(sink);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shell_quote),
        cmocka_unit_test(test_signal_exit_status),
        cmocka_unit_test(test_pool_free_null),
        cmocka_unit_test_setup_teardown(test_exec_stdout_stderr_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_stdin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_stdin_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_large_output, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_env_cwd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_cwd_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_bad_env, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_empty_argv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_argv_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_tty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_no_tty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_window_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_signal_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_client_goes_away, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_spare, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_spare_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_spare_noise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_spare_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_spare_same_as_ordinary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_concurrent, setup_few_startups, teardown),
        cmocka_unit_test_setup_teardown(test_pool_forget_during_exec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_concurrent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_stale_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_ok, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_host_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_key_refused, setup_refuses_key, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_bad_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_nothing_listens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_silent_port, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_ready_cancelled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_confined, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_exec, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_serial_carried, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_serial_closed, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_before_command_and_trace, setup_worker,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_worker_killed, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_forget, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_wait_ready, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_stopped, setup_worker_quick, teardown),
        cmocka_unit_test_setup_teardown(test_worker_stopped_during_exec, setup_worker_quick,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_exec_concurrent, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_exec_signal_status, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_exec_stdin_large, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_exec_large_output, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_echo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_guest_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_no_listener, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_wake_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_backpressure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_add_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_stale_session, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_free_open, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_echo, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_worker_forward_activity, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_large, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_guest_closes, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_no_listener, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_wake_refused, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_many, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_backpressure, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_remove, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_stale_session, setup_worker, teardown),
        cmocka_unit_test_setup_teardown(test_forward_free_open, setup_worker, teardown),
    };

    /* TEST_FILTER=test_exec_* runs a subset while debugging. */
    if (g_getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(g_getenv("TEST_FILTER"));
    return cmocka_run_group_tests_name("ssh", tests, group_setup, group_teardown);
}
