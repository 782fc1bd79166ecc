/* The vmctl binary against a fake hostd (test-vmctl-fixture.h): a thread in this process that
 * listens on a socket, records the request vmctl sends and answers with scripted messages. vmctl
 * runs as a subprocess ($VM_BUILD_DIR/vmctl/vmctl), so what is checked is what a user sees:
 * stdout, stderr, status.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pty.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-util.h"
#include "vmctl.h"
#include "vm-stream.h"
#include "test-common.h"
#include "test-vmctl-fixture.h"
#include "vmctl-remote.h"

typedef struct {
    char *tmpdir;
    char *socket_path;
    char *vmctl;
    char *path_env;         /* $PATH for vmctl, when set */
    gboolean closed_stdout; /* vmctl's stdout is a pipe nobody reads */
    char *host;             /* when set, vmctl runs with --host HOST instead of --socket */
    char *host_env;         /* $VMCTL_HOST for vmctl, when set */
    gboolean bare;          /* vmctl runs with neither --socket nor --host */
    char *data_home;        /* $XDG_DATA_HOME for vmctl, when set (then $VMCTL_SOCKET is unset) */
    char *system_socket;    /* $VMCTL_SYSTEM_SOCKET for vmctl, when set */
    gboolean as_nobody;     /* vmctl runs as uid and gid 65534 when the test runs as root */
    VmTestHostd *hostd;
} Fixture;

typedef struct {
    char *out;
    char *err;
    int status;
} Run;

static void
run_clear(Run *run)
{
    g_free(run->out);
    g_free(run->err);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Run, run_clear)

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);
    const char *build_dir = g_getenv("VM_BUILD_DIR");

    f->vmctl = g_build_filename(build_dir != NULL ? build_dir : ".", "vmctl", "vmctl", NULL);
    f->tmpdir = vm_test_make_tmpdir("test-vmctl-XXXXXX");
    f->socket_path = g_build_filename(f->tmpdir, "hostd.sock", NULL);
    f->hostd = vm_test_hostd_new(f->socket_path);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    vm_test_hostd_free(f->hostd);
    vm_test_remove_tree(f->tmpdir);
    g_free(f->socket_path);
    g_free(f->tmpdir);
    g_free(f->vmctl);
    g_free(f->path_env);
    g_free(f->host);
    g_free(f->host_env);
    g_free(f->data_home);
    g_free(f->system_socket);
    g_free(f);
    return 0;
}

/* Starts the fake hostd for one vmctl run, forgetting what the previous run recorded. */
static void
server_start(Fixture *f)
{
    vm_test_hostd_start(f->hostd);
}

static void
reply(Fixture *f, VmOp op, const char *fields)
{
    vm_test_hostd_reply(f->hostd, op, fields);
}

static void
reply_data(Fixture *f, VmOp op, const char *text)
{
    vm_test_hostd_reply_data(f->hostd, op, text);
}

static void
reply_error(Fixture *f, VmErrorCode code, const char *text)
{
    vm_test_hostd_reply_error(f->hostd, code, text);
}

/* Runs vmctl as a user who is not root, as hostd's socket-group members are. */
static void
drop_root(gpointer data)
{
    (void)data;
    if (geteuid() != 0)
        return;
    if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
        _exit(127);
}

static char *
bytes_to_string(GBytes *bytes)
{
    gsize size = 0;
    const char *data = bytes != NULL ? g_bytes_get_data(bytes, &size) : NULL;

    return size > 0 ? g_strndup(data, size) : g_strdup("");
}

/* Runs vmctl --socket SOCKET (or --host f->host, or neither with f->bare) @args... with @input on
 * stdin (NULL: none), with the server thread answering, and returns what it printed and its exit
 * status. */
static void
run_vmctl_argv(Fixture *f, const char *input, const char *const *args, Run *ret_run)
{
    g_autoptr(GPtrArray) argv = g_ptr_array_new();
    g_autoptr(GError) error = NULL;

    g_ptr_array_add(argv, f->vmctl);
    if (!f->bare) {
        g_ptr_array_add(argv, f->host != NULL ? "--host" : "--socket");
        g_ptr_array_add(argv, f->host != NULL ? f->host : f->socket_path);
    }
    for (gsize i = 0; args[i] != NULL; i++)
        g_ptr_array_add(argv, (gpointer)args[i]);
    g_ptr_array_add(argv, NULL);

    /* stdin is a file, not a pipe: vmctl may exit before reading it (a usage error), and a
     * write into a pipe nobody reads any more would fail the test, not vmctl. */
    g_autofree char *stdin_path = g_build_filename(f->tmpdir, "stdin", NULL);
    vm_test_write_file(stdin_path, input != NULL ? input : "");
    g_autoptr(GSubprocessLauncher) launcher = g_subprocess_launcher_new(
        G_SUBPROCESS_FLAGS_STDERR_PIPE |
        (f->closed_stdout ? G_SUBPROCESS_FLAGS_NONE : G_SUBPROCESS_FLAGS_STDOUT_PIPE));
    g_subprocess_launcher_set_stdin_file_path(launcher, stdin_path);
    if (f->closed_stdout) {
        int fds[2];
        assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
        close(fds[0]);
        g_subprocess_launcher_take_stdout_fd(launcher, fds[1]);
    }
    if (f->path_env != NULL)
        g_subprocess_launcher_setenv(launcher, "PATH", f->path_env, TRUE);
    if (f->host_env != NULL)
        g_subprocess_launcher_setenv(launcher, "VMCTL_HOST", f->host_env, TRUE);
    else
        g_subprocess_launcher_unsetenv(launcher, "VMCTL_HOST");
    if (f->data_home != NULL) {
        g_subprocess_launcher_setenv(launcher, "XDG_DATA_HOME", f->data_home, TRUE);
        g_subprocess_launcher_unsetenv(launcher, "VMCTL_SOCKET");
    }
    if (f->system_socket != NULL)
        g_subprocess_launcher_setenv(launcher, "VMCTL_SYSTEM_SOCKET", f->system_socket, TRUE);
    if (f->as_nobody)
        g_subprocess_launcher_set_child_setup(launcher, drop_root, NULL, NULL);
    g_autoptr(GSubprocess) process =
        g_subprocess_launcher_spawnv(launcher, (const char *const *)argv->pdata, &error);
    assert_non_null(process);
    g_autoptr(GBytes) out = NULL, err = NULL;
    assert_true(g_subprocess_communicate(process, NULL, NULL, f->closed_stdout ? NULL : &out, &err,
                                         &error));
    /* Whatever happens, vmctl exits: killed by a signal it could leave a terminal raw. */
    assert_true(g_subprocess_get_if_exited(process));
    ret_run->status = g_subprocess_get_exit_status(process);
    ret_run->out = bytes_to_string(out);
    ret_run->err = bytes_to_string(err);
    if (f->hostd->thread != NULL)
        vm_test_hostd_join(f->hostd);
}

#define run_vmctl(f, input, run, ...)                                                              \
    run_vmctl_argv(f, input, (const char *const[]){__VA_ARGS__, NULL}, run)

static void
assert_request(Fixture *f, VmOp op)
{
    assert_true(f->hostd->connected);
    assert_non_null(f->hostd->request);
    assert_int_equal(f->hostd->request->op, op);
}

static void
test_not_running(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_autofree char *missing = g_build_filename(f->tmpdir, "nothing.sock", NULL);
    g_autofree char *expected = g_strdup_printf("vmctl: hostd is not running at %s\n", missing);

    run_vmctl(f, NULL, &run, "--socket", missing, "list");
    assert_string_equal(run.err, expected);
    assert_string_equal(run.out, "");
    assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));
}

static void
test_usage_errors(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *args[6];
        const char *err;
    } cases[] = {
        {{"frobnicate"}, "vmctl: unknown command 'frobnicate'; see 'vmctl --help'\n"},
        {{"help", "frobnicate"}, "vmctl: unknown command 'frobnicate'; see 'vmctl --help'\n"},
        {{"--bogus", "list"}, "vmctl: unknown option --bogus; see 'vmctl --help'\n"},
        {{"template", "frobnicate"},
         "vmctl: unknown command 'template frobnicate'; see 'vmctl template --help'\n"},
        {{"list", "extra"}, "vmctl: unexpected argument 'extra'; see 'vmctl list --help'\n"},
        {{"hosts", "h1"}, "vmctl: unexpected argument 'h1'; see 'vmctl hosts --help'\n"},
        {{"rm"}, "vmctl: missing NAME...; see 'vmctl rm --help'\n"},
        {{"stop", "a1", "a2", "a1"}, "vmctl: 'a1' is named twice; see 'vmctl stop --help'\n"},
        {{"start", "a1", "../x"},
         "vmctl: invalid name '../x': must start with a lower-case letter a-z\n"},
        {{"rm", "--bogus", "a1"}, "vmctl: unknown option --bogus; see 'vmctl rm --help'\n"},
        {{"exec", "a1"}, "vmctl: missing the command to run; see 'vmctl exec --help'\n"},
        {{"exec", "a1", "-x"}, "vmctl: unknown option -x; see 'vmctl exec --help'\n"},
        {{"exec", "a1", "-e", "=v", "true"},
         "vmctl: -e needs K=V, not '=v'; see 'vmctl exec --help'\n"},
        {{"new", "a1", "--cpus", "two"},
         "vmctl: --cpus needs a number from 1 to 4294967295, not 'two'; see 'vmctl new --help'\n"},
        {{"new", "a1", "--memory", "0"},
         "vmctl: --memory needs a number from 1 to 4294967295, not '0'; see 'vmctl new --help'\n"},
        {{"new", "a1", "--disk-read", "1000001"},
         "vmctl: --disk-read needs a number from 0 to 1000000, not '1000001'; see 'vmctl new "
         "--help'\n"},
        {{"new", "a1", "--disk-write-iops", "-1"},
         "vmctl: --disk-write-iops needs a number from 0 to 1000000, not '-1'; see 'vmctl new "
         "--help'\n"},
        {{"set", "a1"},
         "vmctl: nothing to change: give --cpus, --memory or --disk; see 'vmctl set --help'\n"},
        {{"set", "a1", "--disk", "-5G"},
         "vmctl: --disk needs a size such as 512M, 20G or +5G (at most 16384G), not '-5G'; see "
         "'vmctl set --help'\n"},
        {{"set", "a1", "--disk", "1536M"},
         "vmctl: --disk grows by whole GiB, not '1536M'; see 'vmctl set --help'\n"},
        {{"set", "a1", "--memory", "8X"},
         "vmctl: --memory needs a size such as 512M, 20G or +5G (at most 16384G), not '8X'; see "
         "'vmctl set --help'\n"},
        {{"set", "a1", "--cpus", "+0"},
         "vmctl: --cpus needs a number from 1 to 1024, not '0'; see 'vmctl set --help'\n"},
        {{"new", "A1"}, "vmctl: invalid name 'A1': must start with a lower-case letter a-z\n"},
        {{"info", "../x"}, "vmctl: invalid name '../x': must start with a lower-case letter a-z\n"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};
        run_vmctl_argv(f, NULL, cases[i].args, &run);
        assert_string_equal(run.err, cases[i].err);
        assert_string_equal(run.out, "");
        assert_int_equal(run.status, 2);
    }
}

static void
test_help(void **state)
{
    Fixture *f = *state;
    g_auto(Run) help = {0};
    g_auto(Run) verb_help = {0};
    g_auto(Run) version = {0};

    run_vmctl(f, NULL, &help, "help");
    assert_int_equal(help.status, 0);
    assert_non_null(strstr(help.out, "  template build  "));
    run_vmctl(f, NULL, &verb_help, "exec", "--help");
    assert_int_equal(verb_help.status, 0);
    assert_non_null(strstr(verb_help.out, "vmctl exec [OPTION"));
    assert_non_null(strstr(verb_help.out, "--workdir"));
    run_vmctl(f, NULL, &version, "--version");
    assert_int_equal(version.status, 0);
    assert_true(g_str_has_prefix(version.out, "vmctl "));
}

/* The commands `vmctl --help` lists, one a string ("template list" as two words). */
static GPtrArray *
listed_commands(const char *help)
{
    GPtrArray *commands = g_ptr_array_new_with_free_func(g_free);
    g_auto(GStrv) lines = g_strsplit(help, "\n", -1);
    gboolean inside = FALSE;

    for (gsize i = 0; lines[i] != NULL; i++) {
        if (strcmp(lines[i], "Commands:") == 0) {
            inside = TRUE;
        } else if (inside && g_str_has_prefix(lines[i], "  ") && g_ascii_islower(lines[i][2])) {
            const char *end = strstr(lines[i] + 2, "  ");
            g_ptr_array_add(commands, g_strndup(lines[i] + 2, end - (lines[i] + 2)));
        } else if (inside) {
            break;
        }
    }
    return commands;
}

/* Every way to ask for help prints it on stdout and exits 0, for vmctl, each group of
 * subcommands and each command; an unknown command is a usage error. */
static void
test_help_everywhere(void **state)
{
    Fixture *f = *state;
    g_auto(Run) usage = {0};
    static const char *const asks[][3] = {{"--help"}, {"-h"}, {"help"}, {NULL}};

    run_vmctl(f, NULL, &usage, "--help");
    assert_int_equal(usage.status, 0);
    assert_true(g_str_has_prefix(usage.out, "Usage: vmctl [OPTION...] COMMAND"));
    for (gsize i = 0; i < G_N_ELEMENTS(asks); i++) {
        g_auto(Run) run = {0};
        run_vmctl_argv(f, NULL, (const char *const *)asks[i], &run);
        assert_int_equal(run.status, 0);
        assert_string_equal(run.out, usage.out);
        assert_string_equal(run.err, "");
    }

    g_autoptr(GPtrArray) commands = listed_commands(usage.out);
    g_autoptr(GHashTable) groups = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    assert_true(commands->len > 20);
    for (guint i = 0; i < commands->len; i++) {
        const char *command = commands->pdata[i];
        g_auto(GStrv) words = g_strsplit(command, " ", 2);
        g_autofree char *want = g_strdup_printf("Usage:\n  vmctl %s [OPTION", command);
        g_auto(Run) run = {0};
        g_auto(Run) via_help = {0};

        run_vmctl(f, NULL, &run, words[0], words[1] != NULL ? words[1] : "--help",
                  words[1] != NULL ? "--help" : NULL);
        if (run.status != 0 || !g_str_has_prefix(run.out, want))
            fail_msg("'vmctl %s --help' exits %d and prints '%s'", command, run.status, run.out);
        assert_non_null(strstr(run.out, "\n  -h, --help "));
        run_vmctl(f, NULL, &via_help, "help", words[0], words[1]);
        assert_int_equal(via_help.status, 0);
        assert_string_equal(via_help.out, run.out);
        if (words[1] != NULL)
            g_hash_table_add(groups, g_strdup(words[0]));
    }

    /* A group: bare, --help, -h and `help GROUP` give its usage, which lists its commands. */
    assert_true(g_hash_table_contains(groups, "secret"));
    assert_true(g_hash_table_contains(groups, "template"));
    GHashTableIter iter;
    gpointer key;
    g_hash_table_iter_init(&iter, groups);
    while (g_hash_table_iter_next(&iter, &key, NULL)) {
        const char *group = key;
        g_auto(Run) bare = {0};
        g_auto(Run) help = {0};
        g_auto(Run) h = {0};
        g_auto(Run) help_group = {0};
        g_autofree char *prefix = g_strconcat(group, " ", NULL);

        run_vmctl(f, NULL, &help, group, "--help");
        run_vmctl(f, NULL, &h, group, "-h");
        run_vmctl(f, NULL, &help_group, "help", group);
        assert_int_equal(help.status, 0);
        assert_int_equal(h.status, 0);
        assert_int_equal(help_group.status, 0);
        assert_string_equal(h.out, help.out);
        assert_string_equal(help_group.out, help.out);
        for (guint i = 0; i < commands->len; i++) {
            const char *command = commands->pdata[i];
            if (!g_str_has_prefix(command, prefix))
                continue;
            g_autofree char *line = g_strdup_printf("\n  %s", command + strlen(prefix));
            g_autofree char *verb_line = g_strdup_printf("\n  vmctl %s", command);
            if (strstr(help.out, line) == NULL && strstr(help.out, verb_line) == NULL)
                fail_msg("'vmctl %s --help' does not list '%s': %s", group, command, help.out);
        }
        /* A group that is no command of its own: bare, it prints its usage too. */
        if (strstr(help.out, "[OPTION...] ") != NULL) {
            run_vmctl(f, NULL, &bare, group);
            assert_int_equal(bare.status, 0);
            assert_string_equal(bare.out, help.out);
        }
    }
}

static void
test_list(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    gint64 now = g_get_real_time() / G_USEC_PER_SEC;
    g_autofree char *agents = g_strdup_printf(
        "{'agents': <[{'name': <'a1'>, 'state': <'running'>, 'template': <'debian-12'>,"
        " 'cpus': <uint32 2>, 'memory_mib': <uint32 2048>, 'disk_gib': <uint32 10>,"
        " 'ssh_port': <uint32 2201>, 'created': <int64 %" G_GINT64_FORMAT ">,"
        " 'state_since': <int64 %" G_GINT64_FORMAT ">},"
        " {'name': <'builder-2'>, 'state': <'stopped'>}]>}",
        now - 2 * 3600 - 60, now - 5 * 60 - 10);

    reply(f, VM_OP_RESULT, agents);
    server_start(f);
    run_vmctl(f, NULL, &run, "list");
    assert_request(f, VM_OP_AGENT_LIST);
    assert_string_equal(run.out,
                        "NAME       STATE    SINCE          TEMPLATE   CPUS  MEMORY  DISK    SSH   "
                        "CREATED\n"
                        "a1         running  5 minutes ago  debian-12  2     2 GiB   10 GiB  2201  "
                        "2 hours ago\n"
                        "builder-2  stopped  -              -          -     -       -       -     "
                        "-\n");
    assert_string_equal(run.err, "");
    assert_int_equal(run.status, 0);
}

/* A list of 10,000 agents is over one frame: it comes in parts and prints whole. */
static void
test_list_many(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(GVariantBuilder) agents = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));

    for (guint i = 0; i < 10000; i++) {
        g_autofree char *name = g_strdup_printf("agent-%05u", i);
        g_variant_builder_add_parsed(&agents,
                                     "{'name': <%s>, 'state': <'running'>, 'template': "
                                     "<'debian-12'>, 'cpus': <uint32 2>, 'memory_mib': <uint32 "
                                     "2048>, 'disk_gib': <uint32 10>, 'ssh_port': <uint32 2201>}",
                                     name);
    }
    f->hostd->result = g_variant_ref_sink(
        g_variant_new_parsed("{'agents': <%@aa{sv}>}", g_variant_builder_end(&agents)));
    assert_true(g_variant_get_size(f->hostd->result) > VM_FRAME_MAX);
    server_start(f);
    run_vmctl(f, NULL, &run, "list");
    assert_int_equal(run.status, 0);
    g_auto(GStrv) lines = g_strsplit(run.out, "\n", -1);
    assert_int_equal(g_strv_length(lines), 10000 + 2); /* the header, and "" after the last */
    assert_true(g_str_has_prefix(lines[1], "agent-00000 "));
    assert_true(g_str_has_prefix(lines[10000], "agent-09999 "));
}

static void
test_list_json(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT, "{'agents': <[{'name': <'a1'>, 'disk_bytes': <uint64 4096>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "list", "--json");
    assert_string_equal(run.out, "[\n"
                                 "  {\n"
                                 "    \"name\" : \"a1\",\n"
                                 "    \"disk_bytes\" : 4096\n"
                                 "  }\n"
                                 "]\n");
    assert_int_equal(run.status, 0);
}

/* hosts: the fleet's hosts, a down one with only its id and the agents it held. */
static void
test_hosts(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'hosts': <[{'id': <'h1'>, 'address': <'ssh://root@h1'>, 'live': <true>,"
          " 'cores': <uint32 16>, 'memory_mib': <uint64 65536>, 'disk_gib': <uint64 900>,"
          " 'agents': <{'running': uint32 2, 'stopped': 1}>, 'agents_total': <uint32 3>,"
          " 'free_memory_mib': <uint64 32768>, 'free_disk_gib': <uint64 800>,"
          " 'drained': <false>},"
          " {'id': <'h2'>, 'address': <''>, 'live': <false>, 'cores': <uint32 0>,"
          " 'memory_mib': <uint64 0>, 'disk_gib': <uint64 0>, 'agents': <@a{su} {}>,"
          " 'agents_total': <uint32 1>, 'free_memory_mib': <uint64 0>,"
          " 'free_disk_gib': <uint64 0>, 'drained': <false>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "hosts");
    assert_request(f, VM_OP_FLEET_HOSTS);
    assert_string_equal(run.out, "HOST  ADDRESS        STATE  CORES  MEMORY  FREE MEMORY  DISK     "
                                 "FREE DISK  AGENTS\n"
                                 "h1    ssh://root@h1  live   16     64 GiB  32 GiB       900 GiB  "
                                 "800 GiB    3 (2 running, 1 stopped)\n"
                                 "h2    -              down   -      -       -            -        "
                                 "-          1\n");
    assert_string_equal(run.err, "");
    assert_int_equal(run.status, 0);
}

/* hosts --json: the contract's fields as they came. */
static void
test_hosts_json(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT, "{'hosts': <[{'id': <'h1'>, 'live': <true>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "hosts", "--json");
    assert_string_equal(run.out, "[\n"
                                 "  {\n"
                                 "    \"id\" : \"h1\",\n"
                                 "    \"live\" : true\n"
                                 "  }\n"
                                 "]\n");
    assert_int_equal(run.status, 0);
}

/* A host in no fleet: hostd's one line and not-running's status. */
static void
test_hosts_no_fleet(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply_error(f, VM_ERROR_NOT_RUNNING,
                "this host is in no fleet: hostd's configuration has no [cluster] "
                "(docs/CLUSTER.md)");
    server_start(f);
    run_vmctl(f, NULL, &run, "list", "--fleet");
    assert_request(f, VM_OP_FLEET_LIST);
    assert_string_equal(run.err, "vmctl: this host is in no fleet: hostd's configuration has no "
                                 "[cluster] (docs/CLUSTER.md)\n");
    assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));
}

/* list --fleet: every agent of the fleet with its host. */
static void
test_list_fleet(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'agents': <[{'name': <'a1'>, 'host': <'h1'>, 'epoch': <uint64 1>,"
          " 'state': <'running'>, 'host_live': <true>},"
          " {'name': <'b2'>, 'host': <'h2'>, 'epoch': <uint64 3>, 'state': <'host-down'>,"
          " 'host_live': <false>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "list", "--fleet");
    assert_request(f, VM_OP_FLEET_LIST);
    assert_string_equal(run.out, "NAME  HOST  STATE      EPOCH\n"
                                 "a1    h1    running    1\n"
                                 "b2    h2    host-down  3\n");
    assert_int_equal(run.status, 0);
}

static void
test_template_list(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'templates': <[{'name': <'debian-12'>, 'description': <'Debian 12 with tools'>,"
          " 'source': <'mmdebstrap'>, 'ready': <false>, 'warm': <'no image'>, 'cpus': <uint32 2>,"
          " 'memory_mib': <uint32 1024>, 'disk_gib': <uint32 8>, 'pool_state': <'1/2'>},"
          " {'name': <'old'>, 'description': <'from a hostd before pools'>, 'ready': <true>,"
          " 'warm': <'yes'>, 'cpus': <uint32 1>, 'memory_mib': <uint32 512>,"
          " 'disk_gib': <uint32 4>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "template", "list");
    assert_request(f, VM_OP_TEMPLATE_LIST);
    assert_string_equal(
        run.out,
        "NAME       READY  WARM      POOL  CPUS  MEMORY   DISK   DESCRIPTION\n"
        "debian-12  no     no image  1/2   2     1 GiB    8 GiB  Debian 12 with tools\n"
        "old        yes    yes       -     1     512 MiB  4 GiB  from a hostd before pools\n");
    assert_int_equal(run.status, 0);
}

static void
test_info(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'agent': <{'name': <'a1'>, 'state': <'crashed'>, 'disk_bytes': <uint64 1610612736>,"
          " 'ssh_port': <uint32 2201>, 'user': <'agent'>, 'wanted': <'stopped'>,"
          " 'restart': <'on-crash'>, 'crashes': <uint32 4>, 'crash_reason': <'its QEMU died'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "info", "a1");
    assert_request(f, VM_OP_AGENT_INFO);
    assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
    assert_string_equal(run.out, "name:            a1\n"
                                 "state:           crashed\n"
                                 "since:           -\n"
                                 "wanted:          stopped\n"
                                 "template:        -\n"
                                 "cpus:            -\n"
                                 "memory:          -\n"
                                 "disk:            -\n"
                                 "disk used:       1.5 GiB\n"
                                 "ssh port:        2201\n"
                                 "user:            agent\n"
                                 "created:         -\n"
                                 "forked from:     -\n"
                                 "fork checkpoint: -\n"
                                 "virt type:       -\n"
                                 "restart:         on-crash\n"
                                 "crashes:         4\n"
                                 "crash reason:    its QEMU died\n"
                                 "secrets:         -\n"
                                 "disk limits:     -\n");
    assert_int_equal(run.status, 0);
}

/* A fenced copy says whose the agent is, on a line of its own. */
static void
test_info_fenced(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'agent': <{'name': <'a1'>, 'state': <'fenced'>,"
          " 'fenced': <\"host 'h2' owns it (epoch 2)\">}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "info", "a1");
    assert_non_null(strstr(run.out, "state:           fenced\n"));
    assert_true(g_str_has_suffix(run.out, "fenced:          host 'h2' owns it (epoch 2)\n"));
    assert_int_equal(run.status, 0);
}

/* @json without its layout (spaces and newlines outside strings that have none), newly
 * allocated: what a test compares. */
static char *
json_squeezed(const char *json)
{
    GString *out = g_string_new(NULL);

    for (const char *c = json; *c != '\0'; c++) {
        if (*c != ' ' && *c != '\n')
            g_string_append_c(out, *c);
    }
    return g_string_free(out, FALSE);
}

/* A running agent's info ends with what its memory costs the host, in human units, "unknown"
 * for what hostd could not read; --json gives the bytes as hostd sent them. A stopped agent has
 * no such lines (test_info). */
static void
test_info_memory(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) json = {0};
    const char *agent =
        "{'agent': <{'name': <'a1'>, 'state': <'running'>, 'qemu_pid': <uint32 4242>,"
        " 'qemu_rss_bytes': <uint64 489684992>, 'ksm_merged_bytes': <uint64 314572800>,"
        " 'ksm_profit_bytes': <int64 -8192>, 'balloon_actual_bytes': <uint64 1073741824>,"
        " 'balloon_rss_bytes': <uint64 489684992>, 'balloon_available_bytes': <uint64 1004535808>,"
        " 'balloon_usable_bytes': <uint64 734003200>}>}";

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, agent);
    server_start(f);
    run_vmctl(f, NULL, &run, "info", "a1");
    assert_int_equal(run.status, 0);
    const char *memory = strstr(run.out, "qemu pid:");
    if (memory == NULL)
        fail_msg("no memory lines in:\n%s", run.out);
    assert_string_equal(memory, "qemu pid:        4242\n"
                                "qemu rss:        467 MiB\n"
                                "ksm merged:      300 MiB\n"
                                "ksm profit:      -8 KiB\n"
                                "balloon:         1 GiB\n"
                                "guest available: 958 MiB\n"
                                "guest usable:    700 MiB\n"
                                "guest unused:    unknown\n");
    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, agent);
    server_start(f);
    run_vmctl(f, NULL, &json, "--json", "info", "a1");
    assert_int_equal(json.status, 0);
    g_autofree char *squeezed = json_squeezed(json.out);
    assert_non_null(strstr(squeezed, "\"qemu_rss_bytes\":489684992"));
    assert_non_null(strstr(squeezed, "\"ksm_merged_bytes\":314572800"));
    assert_non_null(strstr(squeezed, "\"ksm_profit_bytes\":-8192"));
    assert_non_null(strstr(squeezed, "\"balloon_actual_bytes\":1073741824"));
    assert_null(strstr(squeezed, "unknown"));
}

/* info names the agent's grants and their env vars, in one line. */
static void
test_info_secrets(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) json = {0};
    const char *agent = "{'agent': <{'name': <'a1'>, 'secrets': <[{'name': <'example-api'>, "
                        "'env': <'EXAMPLE_API_KEY'>}, {'name': <'gh'>, 'env': <'GH_TOKEN'>}]>}>}";

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, agent);
    server_start(f);
    run_vmctl(f, NULL, &run, "info", "a1");
    assert_non_null(strstr(
        run.out, "\nsecrets:         example-api (env EXAMPLE_API_KEY), gh (env GH_TOKEN)\n"));
    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, agent);
    server_start(f);
    run_vmctl(f, NULL, &json, "--json", "info", "a1");
    g_autofree char *squeezed = json_squeezed(json.out);
    assert_non_null(strstr(squeezed,
                           "\"secrets\":[{\"name\":\"example-api\",\"env\":"
                           "\"EXAMPLE_API_KEY\"},{\"name\":\"gh\",\"env\":\"GH_TOKEN\"}]"));
    assert_int_equal(json.status, 0);
}

/* The usage errors of `secret`: exit 2, nothing sent, and never the value in a message. */
static void
test_secret_usage_errors(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *input;
        const char *args[7];
        const char *err;
    } cases[] = {
        {"",
         {"secret", "frobnicate"},
         "vmctl: unknown command 'secret frobnicate'; see 'vmctl secret --help'\n"},
        {"v\n",
         {"secret", "create", "s"},
         "vmctl: missing --host: where may the secret go?; see 'vmctl secret create --help'\n"},
        {"", {"secret", "create", "s", "--host", "api.example.com"}, "vmctl: empty secret value\n"},
        {"\n",
         {"secret", "create", "s", "--host", "api.example.com"},
         "vmctl: empty secret value\n"},
        {"\r\n", {"secret", "set", "s"}, "vmctl: empty secret value\n"},
        {"sk-1\n",
         {"secret", "create", "s", "sk-1", "--host", "h"},
         "vmctl: unexpected argument 'sk-1'; see 'vmctl secret create --help'\n"},
        {"",
         {"secret", "grant", "a1"},
         "vmctl: missing AGENT NAME; see 'vmctl secret grant --help'\n"},
        {"",
         {"secret", "revoke", "A1", "s"},
         "vmctl: invalid name 'A1': must start with a lower-case letter a-z\n"},
        {"", {"secret", "rm"}, "vmctl: missing NAME; see 'vmctl secret rm --help'\n"},
        {"",
         {"secret", "list", "x"},
         "vmctl: unexpected argument 'x'; see 'vmctl secret list --help'\n"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};
        run_vmctl_argv(f, cases[i].input, cases[i].args, &run);
        assert_string_equal(run.err, cases[i].err);
        assert_string_equal(run.out, "");
        assert_int_equal(run.status, 2);
    }
    /* Too long: refused before anything is sent. */
    g_autofree char *big = g_strnfill(VM_SECRET_VALUE_MAX + 1, 'x');
    g_auto(Run) run = {0};
    run_vmctl(f, big, &run, "secret", "set", "s");
    assert_int_equal(run.status, 2);
    assert_null(strstr(run.err, "xxxx"));
}

/* create sends the value in the request's body, one trailing newline less, and prints nothing. */
static void
test_secret_create(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_autofree char *path = g_build_filename(f->tmpdir, "value", NULL);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'secret': <{'name': <'example-api'>}>}");
    server_start(f);
    run_vmctl(f, "sk-live-1\n", &run, "secret", "create", "example-api", "--host",
              "api.example.com", "--host", "*.example.com", "--header", "X-Api-Key", "--format",
              "{}", "--env", "EXAMPLE_API_KEY");
    assert_request(f, VM_OP_SECRET_CREATE);
    VmMessage *request = f->hostd->request;
    gsize len = 0;
    const guint8 *value = vm_message_get_data(request, "value", &len);
    assert_int_equal(len, strlen("sk-live-1"));
    assert_memory_equal(value, "sk-live-1", len);
    g_auto(GStrv) hosts = vm_message_dup_strv(request, "hosts");
    assert_int_equal(g_strv_length(hosts), 2);
    assert_string_equal(hosts[1], "*.example.com");
    assert_string_equal(vm_message_get_string(request, "secret", NULL), "example-api");
    assert_string_equal(vm_message_get_string(request, "header", NULL), "X-Api-Key");
    assert_string_equal(vm_message_get_string(request, "format", NULL), "{}");
    assert_string_equal(vm_message_get_string(request, "env", NULL), "EXAMPLE_API_KEY");
    assert_string_equal(run.out, "");
    assert_string_equal(run.err, "");
    assert_int_equal(run.status, 0);

    /* Several --header options travel as one list. */
    g_auto(Run) several = {0};
    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'secret': <{'name': <'anthropic'>}>}");
    server_start(f);
    run_vmctl(f, "sk-ant\n", &several, "secret", "create", "anthropic", "--host",
              "api.anthropic.com", "--header", "Authorization", "--header", "x-api-key");
    assert_request(f, VM_OP_SECRET_CREATE);
    assert_string_equal(vm_message_get_string(f->hostd->request, "header", NULL),
                        "Authorization, x-api-key");
    assert_null(vm_message_lookup(f->hostd->request, "format"));
    assert_int_equal(several.status, 0);

    /* --from-file, defaults left to hostd; only one newline goes. */
    g_auto(Run) set = {0};
    assert_true(g_file_set_contents(path, "sk-2\n\n", -1, NULL));
    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'secret': <{'name': <'example-api'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &set, "secret", "set", "example-api", "--from-file", path);
    assert_request(f, VM_OP_SECRET_SET);
    value = vm_message_get_data(f->hostd->request, "value", &len);
    assert_int_equal(len, strlen("sk-2\n"));
    assert_memory_equal(value, "sk-2\n", len);
    assert_int_equal(set.status, 0);
    assert_string_equal(set.out, "");
}

/* list: a table with the lists in words, or the JSON of the contract; never a value. */
static void
test_secret_list(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) json = {0};
    const char *secrets =
        "{'secrets': <[{'name': <'example-api'>, 'hosts': <['api.example.com', '*.example.com']>,"
        " 'header': <'Authorization'>, 'format': <'Bearer {}'>, 'env': <'EXAMPLE_API'>,"
        " 'agents': <['a1', 'a2']>}, {'name': <'gh'>, 'hosts': <['api.github.com']>,"
        " 'header': <'Authorization'>, 'format': <'token {}'>, 'env': <'GH'>,"
        " 'agents': <@as []>}]>}";

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, secrets);
    server_start(f);
    run_vmctl(f, NULL, &run, "secret", "list");
    assert_request(f, VM_OP_SECRET_LIST);
    assert_non_null(strstr(run.out, "NAME"));
    assert_non_null(strstr(run.out, "api.example.com, *.example.com"));
    assert_non_null(strstr(run.out, "a1, a2"));
    assert_int_equal(run.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, secrets);
    server_start(f);
    run_vmctl(f, NULL, &json, "secret", "list", "--json");
    g_autofree char *squeezed = json_squeezed(json.out);
    assert_non_null(strstr(squeezed, "\"agents\":[\"a1\",\"a2\"]"));
    assert_non_null(strstr(squeezed, "\"hosts\":[\"api.example.com\",\"*.example.com\"]"));
    assert_non_null(strstr(squeezed, "\"agents\":[]"));
    assert_null(strstr(squeezed, "value"));
}

/* grant, revoke and rm send what they name; hostd's refusals keep their exit statuses. */
static void
test_secret_grant_rm(void **state)
{
    Fixture *f = *state;
    static const struct {
        VmErrorCode code;
        int status;
    } refusals[] = {
        {VM_ERROR_INVALID_ARGUMENT, 2},
        {VM_ERROR_NOT_FOUND, 3},
        {VM_ERROR_EXISTS, 4},
        {VM_ERROR_BAD_STATE, 5},
    };
    g_auto(Run) grant = {0};
    g_auto(Run) rm = {0};

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'secrets': <[{'name': <'s'>, 'env': <'S'>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &grant, "secret", "grant", "a1", "s");
    assert_request(f, VM_OP_SECRET_GRANT);
    assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
    assert_string_equal(vm_message_get_string(f->hostd->request, "secret", NULL), "s");
    assert_string_equal(grant.out, "");
    assert_int_equal(grant.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'revoked': <['a1']>}");
    server_start(f);
    run_vmctl(f, NULL, &rm, "secret", "rm", "--force", "s");
    assert_request(f, VM_OP_SECRET_RM);
    assert_true(vm_message_get_bool(f->hostd->request, "force", FALSE));
    assert_int_equal(rm.status, 0);

    for (gsize i = 0; i < G_N_ELEMENTS(refusals); i++) {
        g_auto(Run) run = {0};
        g_ptr_array_set_size(f->hostd->replies, 0);
        reply_error(f, refusals[i].code, "refused");
        server_start(f);
        run_vmctl(f, NULL, &run, "secret", "revoke", "a1", "s");
        assert_string_equal(run.err, "vmctl: refused\n");
        assert_int_equal(run.status, refusals[i].status);
    }
}

/* new --secret (repeatable) and fork --grants reach hostd; without --grants a fork asks none. */
static void
test_new_fork_secrets(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) fork = {0};
    g_auto(Run) plain = {0};

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>, 'state': <'running'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "new", "a1", "--secret", "example-api", "--secret", "gh");
    assert_request(f, VM_OP_AGENT_NEW);
    g_auto(GStrv) secrets = vm_message_dup_strv(f->hostd->request, "secrets");
    assert_int_equal(g_strv_length(secrets), 2);
    assert_string_equal(secrets[0], "example-api");
    assert_string_equal(secrets[1], "gh");

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'b1'>}>, 'checkpoint': <'c1'>}");
    server_start(f);
    run_vmctl(f, NULL, &fork, "fork", "a1", "b1", "--grants");
    assert_request(f, VM_OP_AGENT_FORK);
    assert_true(vm_message_get_bool(f->hostd->request, "grants", FALSE));
    assert_int_equal(fork.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'b2'>}>, 'checkpoint': <'c1'>}");
    server_start(f);
    run_vmctl(f, NULL, &plain, "fork", "a1", "b2");
    assert_request(f, VM_OP_AGENT_FORK);
    assert_null(vm_message_lookup(f->hostd->request, "grants"));
}

/* `vmctl egress presets`: one line a preset, its source and its rules; --json as hostd said. */
static void
test_egress_presets(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) json = {0};
    static const char *const presets =
        "{'presets': <[{'name': <'@github'>, 'source': <'built-in'>, 'overrides': <false>,"
        " 'description': <'GitHub'>, 'rules': <['github.com', 'api.github.com']>},"
        " {'name': <'@pypi'>, 'source': <'/etc/hostd/presets.d/pypi.conf'>,"
        " 'overrides': <true>, 'description': <''>, 'rules': <['pypi.mirror.example']>}]>}";

    reply(f, VM_OP_RESULT, presets);
    server_start(f);
    run_vmctl(f, NULL, &run, "egress", "presets");
    assert_request(f, VM_OP_EGRESS_PRESETS);
    assert_string_equal(run.out,
                        "NAME     SOURCE                                              RULES\n"
                        "@github  built-in                                            "
                        "github.com, api.github.com\n"
                        "@pypi    /etc/hostd/presets.d/pypi.conf (over the built-in)  "
                        "pypi.mirror.example\n");
    assert_int_equal(run.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, presets);
    server_start(f);
    run_vmctl(f, NULL, &json, "--json", "egress", "presets");
    assert_non_null(strstr(json.out, "\"name\" : \"@pypi\""));
    assert_non_null(strstr(json.out, "\"pypi.mirror.example\""));
    assert_int_equal(json.status, 0);
}

/* Egress rules and presets, repeated or comma-separated, reach hostd one by one; an unknown
 * preset is hostd's not-found (exit 3), said in one line. */
static void
test_egress_rules_split(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) set = {0};
    g_auto(Run) unknown = {0};

    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>, 'state': <'running'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "new", "a1", "--egress", "@pypi,@npm", "--egress", " x.example ");
    assert_request(f, VM_OP_AGENT_NEW);
    g_auto(GStrv) egress = vm_message_dup_strv(f->hostd->request, "egress");
    g_autofree char *joined = g_strjoinv(" ", egress);
    assert_string_equal(joined, "@pypi @npm x.example");
    assert_int_equal(run.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'egress': <{'allow': <['pypi.org']>}>}");
    server_start(f);
    run_vmctl(f, NULL, &set, "egress", "a1", "--allow", "@pypi,,a.example", "--deny", "@npm",
              "--remove", "b.example,c.example");
    assert_request(f, VM_OP_EGRESS_SET);
    g_auto(GStrv) allow = vm_message_dup_strv(f->hostd->request, "allow");
    g_auto(GStrv) deny = vm_message_dup_strv(f->hostd->request, "deny");
    g_auto(GStrv) remove = vm_message_dup_strv(f->hostd->request, "remove");
    g_autofree char *allow_text = g_strjoinv(" ", allow);
    g_autofree char *remove_text = g_strjoinv(" ", remove);
    assert_string_equal(allow_text, "@pypi a.example");
    assert_string_equal(deny[0], "@npm");
    assert_string_equal(remove_text, "b.example c.example");
    assert_int_equal(set.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    reply_error(f, VM_ERROR_NOT_FOUND, "no egress preset '@pyp' (see: vmctl egress presets)");
    server_start(f);
    run_vmctl(f, NULL, &unknown, "egress", "a1", "--allow", "@pyp");
    assert_string_equal(unknown.err,
                        "vmctl: no egress preset '@pyp' (see: vmctl egress presets)\n");
    assert_int_equal(unknown.status, 3);

    /* An agent named "presets" has its policy changed all the same. */
    g_auto(Run) named = {0};
    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT, "{'egress': <{'allow': <['a.example']>}>}");
    server_start(f);
    run_vmctl(f, NULL, &named, "egress", "presets", "--allow=a.example");
    assert_request(f, VM_OP_EGRESS_SET);
    assert_string_equal(vm_message_get_string(f->hostd->request, "name", ""), "presets");
    assert_int_equal(named.status, 0);
}

static void
test_hostd_error(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_PROGRESS, "{'message': <'looking'>}");
    reply_error(f, VM_ERROR_NOT_FOUND, "no agent 'zz'");
    server_start(f);
    run_vmctl(f, NULL, &run, "-q", "info", "zz");
    assert_string_equal(run.err, "vmctl: no agent 'zz'\n");
    assert_string_equal(run.out, "");
    assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_NOT_FOUND));
}

/* What a guest wrote (an error quoting its console, file names in a diff) reaches the terminal
 * with its control characters escaped: an escape sequence cannot repaint the screen or forge a
 * line. */
static void
test_error_escaped(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply_error(f, VM_ERROR_TIMEOUT,
                "no SSH after 300 s; the console's last lines:\n\x1b[2Jroot ok\rvmctl: forged");
    server_start(f);
    run_vmctl(f, NULL, &run, "start", "a1");
    assert_string_equal(run.err, "vmctl: no SSH after 300 s; the console's last lines:\n"
                                 "\\x1b[2Jroot ok\\rvmctl: forged\n");
}

static void
test_diff_escaped(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'changes': <[('added', '/home/a/\\u001b]0;pwned\\u0007'), ('deleted', '/etc/x\\ny')]>,"
          " 'truncated': <false>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "diff", "a1", "c1");
    assert_string_equal(run.out, "added /home/a/\\x1b]0;pwned\\x07\n"
                                 "deleted /etc/x\\ny\n");
    assert_int_equal(run.status, 0);
}

static void
test_hostd_error_json(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply_error(f, VM_ERROR_BAD_STATE, "agent 'a1' is running; stop it or use --force");
    server_start(f);
    run_vmctl(f, NULL, &run, "--json", "rm", "a1");
    assert_string_equal(run.err, "vmctl: agent 'a1' is running; stop it or use --force\n");
    assert_string_equal(run.out, "{\n"
                                 "  \"error\" : {\n"
                                 "    \"code\" : \"bad-state\",\n"
                                 "    \"message\" : \"agent 'a1' is running; stop it or use "
                                 "--force\"\n"
                                 "  }\n"
                                 "}\n");
    assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_BAD_STATE));
}

static void
test_hostd_hangs_up(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    server_start(f);
    run_vmctl(f, NULL, &run, "list");
    assert_string_equal(run.err, "vmctl: hostd closed the connection unexpectedly\n");
    assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_PROTOCOL));
}

static void
test_progress_lines(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) quiet = {0};

    /* stderr is a pipe here: each message once, fractions not repeated. */
    reply(f, VM_OP_PROGRESS, "{'message': <'debootstrap'>, 'fraction': <0.1>}");
    reply(f, VM_OP_PROGRESS, "{'message': <'debootstrap'>, 'fraction': <0.5>}");
    reply(f, VM_OP_PROGRESS, "{'message': <'converting image'>}");
    reply(f, VM_OP_RESULT,
          "{'name': <'debian-12'>, 'image': <'/images/debian-12.qcow2'>, 'warm': <'yes'>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "template", "build", "debian-12", "--force");
    assert_request(f, VM_OP_TEMPLATE_BUILD);
    assert_true(vm_message_get_bool(f->hostd->request, "force", FALSE));
    assert_string_equal(run.err, "debootstrap\nconverting image\n");
    assert_string_equal(run.out, "built template debian-12: /images/debian-12.qcow2 (warm: yes)\n");
    assert_int_equal(run.status, 0);

    server_start(f);
    run_vmctl(f, NULL, &quiet, "template", "build", "-q", "debian-12");
    assert_false(vm_message_get_bool(f->hostd->request, "force", TRUE));
    assert_string_equal(quiet.err, "");
    assert_int_equal(quiet.status, 0);
}

static void
test_new(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_autofree char *user_data_path = g_build_filename(f->tmpdir, "user-data", NULL);
    const char *user_data = "#cloud-config\npackages: [git]\n";

    assert_true(g_file_set_contents(user_data_path, user_data, -1, NULL));
    reply(f, VM_OP_RESULT,
          "{'agent': <{'name': <'a1'>, 'state': <'running'>, 'ssh_port': <uint32 2201>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "new", "a1", "--template", "debian-12", "--cpus", "2", "--memory",
              "2048", "--disk", "20", "--user-data", user_data_path);
    assert_request(f, VM_OP_AGENT_NEW);
    VmMessage *request = f->hostd->request;
    assert_string_equal(vm_message_get_string(request, "name", NULL), "a1");
    assert_string_equal(vm_message_get_string(request, "template", NULL), "debian-12");
    assert_int_equal(vm_message_get_uint(request, "cpus", 0), 2);
    assert_int_equal(vm_message_get_uint(request, "memory_mib", 0), 2048);
    assert_int_equal(vm_message_get_uint(request, "disk_gib", 0), 20);
    assert_string_equal(vm_message_get_string(request, "user_data", NULL), user_data);
    assert_true(vm_message_get_bool(request, "wait", FALSE));
    assert_string_equal(run.out,
                        "agent a1 is running: ssh port 2201; try: vmctl exec a1 -- uname -a\n");
    assert_int_equal(run.status, 0);
}

/* The disk limits: each option sent as its field, 0 (no limit) too; unset ones left to hostd. */
static void
test_new_disk_limits(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>, 'state': <'starting'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "new", "a1", "--no-wait", "--disk-read", "0", "--disk-write", "50",
              "--disk-write-iops", "1000000");
    assert_request(f, VM_OP_AGENT_NEW);
    VmMessage *request = f->hostd->request;
    assert_int_equal(vm_message_get_uint(request, "disk_read_mib", 7), 0);
    assert_int_equal(vm_message_get_uint(request, "disk_write_mib", 7), 50);
    assert_null(vm_message_lookup(request, "disk_read_iops"));
    assert_int_equal(vm_message_get_uint(request, "disk_write_iops", 7), 1000000);
    assert_int_equal(run.status, 0);
}

/* The limits in words, each direction on its own; no line from a hostd that sends none. */
static void
test_info_disk_limits(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'agent': <{'name': <'a1'>, 'disk_read_mib': <uint32 200>, 'disk_write_mib': "
          "<uint32 0>, 'disk_read_iops': <uint32 2000>, 'disk_write_iops': <uint32 1000>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "info", "a1");
    assert_non_null(
        strstr(run.out, "\ndisk limits:     read 200 MiB/s, 2000 IOPS; write 1000 IOPS\n"));
    assert_null(strstr(run.out, "disk_"));
    assert_int_equal(run.status, 0);

    g_auto(Run) none = {0};
    g_ptr_array_set_size(f->hostd->replies, 0);
    reply(f, VM_OP_RESULT,
          "{'agent': <{'name': <'a1'>, 'disk_read_mib': <uint32 0>, 'disk_write_mib': "
          "<uint32 0>, 'disk_read_iops': <uint32 0>, 'disk_write_iops': <uint32 0>}>}");
    server_start(f);
    run_vmctl(f, NULL, &none, "info", "a1");
    assert_non_null(strstr(none.out, "\ndisk limits:     read no limit; write no limit\n"));
}

static void
test_new_defaults(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>, 'state': <'starting'>}>}");
    server_start(f);
    run_vmctl(f, "#cloud-config\n", &run, "new", "--no-wait", "--user-data", "-", "a1");
    assert_request(f, VM_OP_AGENT_NEW);
    /* Unset options are left to hostd's defaults, not sent as zeros. */
    assert_null(vm_message_lookup(f->hostd->request, "cpus"));
    assert_null(vm_message_lookup(f->hostd->request, "template"));
    assert_false(vm_message_get_bool(f->hostd->request, "wait", TRUE));
    assert_string_equal(vm_message_get_string(f->hostd->request, "user_data", NULL),
                        "#cloud-config\n");
    assert_string_equal(run.out, "agent a1 is starting\n");
}

static void
test_new_bad_user_data(void **state)
{
    Fixture *f = *state;
    g_autofree char *big = g_build_filename(f->tmpdir, "big", NULL);
    g_autofree char *binary = g_build_filename(f->tmpdir, "binary", NULL);
    g_autofree char *missing = g_build_filename(f->tmpdir, "missing", NULL);
    g_autofree char *big_text = g_strnfill(VM_USER_DATA_MAX + 1, 'x');
    g_autofree char *big_err =
        g_strdup_printf("vmctl: --user-data %s is larger than %d bytes\n", big, VM_USER_DATA_MAX);
    g_autofree char *binary_err =
        g_strdup_printf("vmctl: --user-data %s is not UTF-8 text\n", binary);
    g_autofree char *missing_err =
        g_strdup_printf("vmctl: cannot open --user-data %s: No such file or directory\n", missing);
    const struct {
        const char *path;
        const char *err;
        int status;
    } cases[] = {
        {big, big_err, 2},
        {binary, binary_err, 2},
        {missing, missing_err, vm_error_exit_status(VM_ERROR_IO)},
        {f->tmpdir, NULL, vm_error_exit_status(VM_ERROR_IO)},
    };

    assert_true(g_file_set_contents(big, big_text, -1, NULL));
    assert_true(g_file_set_contents(binary, "\xff\xfe", 2, NULL));
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};
        server_start(f);
        run_vmctl(f, NULL, &run, "new", "a1", "--user-data", cases[i].path);
        /* Refused before anything is sent. */
        assert_false(f->hostd->connected);
        if (cases[i].err != NULL)
            assert_string_equal(run.err, cases[i].err);
        assert_int_equal(run.status, cases[i].status);
    }
}

static void
test_actions(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *args[5];
        VmOp op;
        const char *out;
    } cases[] = {
        {{"start", "a1"}, VM_OP_AGENT_START, "started a1\n"},
        {{"stop", "--force", "a1"}, VM_OP_AGENT_STOP, "stopped a1\n"},
        {{"rm", "-f", "a1"}, VM_OP_AGENT_RM, "removed a1\n"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};
        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>}>}");
        server_start(f);
        run_vmctl_argv(f, NULL, cases[i].args, &run);
        assert_request(f, cases[i].op);
        assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
        assert_string_equal(run.out, cases[i].out);
        assert_int_equal(run.status, 0);
    }
    /* The last one was rm -f. */
    assert_true(vm_message_get_bool(f->hostd->request, "force", FALSE));
}

typedef struct {
    GMutex lock;
    GPtrArray *names; /* the agents asked for, in order */
    GPtrArray *ops;   /* their VmOp, as GUINT_TO_POINTER */
} Asked;

/* A hostd that knows a1, a2 and a3 (a2 is running: rm without --force refuses it) and answers
 * every action on an agent. */
static void
answer_actions(VmTestHostd *hostd, int fd, const VmMessage *request, gpointer data)
{
    Asked *asked = data;
    const char *name = vm_message_get_string(request, "name", "");
    (void)hostd;

    g_mutex_lock(&asked->lock);
    g_ptr_array_add(asked->names, g_strdup(name));
    g_ptr_array_add(asked->ops, GUINT_TO_POINTER(request->op));
    g_mutex_unlock(&asked->lock);
    if (strcmp(name, "a1") != 0 && strcmp(name, "a2") != 0 && strcmp(name, "a3") != 0) {
        g_autofree char *text = g_strdup_printf("no agent '%s'", name);
        vm_test_hostd_send_error(fd, VM_ERROR_NOT_FOUND, text);
    } else if (request->op == VM_OP_AGENT_RM && strcmp(name, "a2") == 0 &&
               !vm_message_get_bool(request, "force", FALSE)) {
        vm_test_hostd_send_error(fd, VM_ERROR_BAD_STATE, "agent 'a2' is running");
    } else {
        g_autofree char *fields = g_strdup_printf("{'agent': <{'name': <'%s'>}>}", name);
        vm_test_hostd_send(fd, VM_OP_RESULT, fields);
    }
}

/* Verbs that act on agents take several names: each is done in turn, a failure stops none of
 * the others, and the status is that of the first failure. */
static void
test_actions_several(void **state)
{
    Fixture *f = *state;
    Asked asked = {.names = g_ptr_array_new_with_free_func(g_free), .ops = g_ptr_array_new()};
    static const struct {
        const char *args[7];
        VmOp op;
        const char *out;
        const char *err;
        int status;
    } cases[] = {
        {{"stop", "a1", "a2", "a3"},
         VM_OP_AGENT_STOP,
         "stopped a1\nstopped a2\nstopped a3\n",
         "",
         0},
        {{"start", "--no-wait", "a1", "a3"}, VM_OP_AGENT_START, "started a1\nstarted a3\n", "", 0},
        {{"suspend", "a1", "a2", "--save"}, VM_OP_AGENT_SUSPEND, "saved a1\nsaved a2\n", "", 0},
        {{"resume", "a3", "a1"}, VM_OP_AGENT_RESUME, "resumed a3\nresumed a1\n", "", 0},
        {{"keep-awake", "a1", "a2", "--for", "1h"},
         VM_OP_AGENT_KEEP_AWAKE,
         "keeping awake a1\nkeeping awake a2\n",
         "",
         0},
        /* The first failure's status, though another comes after it. */
        {{"rm", "a1", "nope", "a2", "a3"},
         VM_OP_AGENT_RM,
         "removed a1\nremoved a3\n",
         "vmctl: nope: no agent 'nope'\nvmctl: a2: agent 'a2' is running\n",
         3},
        {{"rm", "-f", "a1", "a2"}, VM_OP_AGENT_RM, "removed a1\nremoved a2\n", "", 0},
    };

    g_mutex_init(&asked.lock);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};
        gsize n = 0;

        g_ptr_array_set_size(asked.names, 0);
        g_ptr_array_set_size(asked.ops, 0);
        vm_test_hostd_serve(f->hostd, answer_actions, &asked);
        run_vmctl_argv(f, NULL, cases[i].args, &run);
        assert_string_equal(run.out, cases[i].out);
        assert_string_equal(run.err, cases[i].err);
        assert_int_equal(run.status, cases[i].status);
        /* Every name was asked for, in the order given, with the verb's own request. */
        for (gsize a = 1; cases[i].args[a] != NULL; a++) {
            const char *arg = cases[i].args[a];
            if (arg[0] == '-' || g_ascii_isdigit(arg[0]))
                continue;
            assert_true(n < asked.names->len);
            assert_string_equal(asked.names->pdata[n], arg);
            assert_int_equal(GPOINTER_TO_UINT(asked.ops->pdata[n]), cases[i].op);
            n++;
        }
        assert_int_equal(n, asked.names->len);
    }

    /* --json: one array, a record per name, failures included. */
    {
        g_auto(Run) run = {0};
        vm_test_hostd_serve(f->hostd, answer_actions, &asked);
        run_vmctl(f, NULL, &run, "--json", "stop", "a1", "nope");
        assert_int_equal(run.status, 3);
        assert_non_null(strstr(run.out, "\"agent\" : {\n      \"name\" : \"a1\""));
        assert_non_null(strstr(run.out, "\"code\" : \"not-found\""));
        assert_true(g_str_has_prefix(run.out, "[\n"));
    }
    /* With hostd out of reach, one line, not one per name. */
    {
        g_auto(Run) run = {0};
        g_autofree char *missing = g_build_filename(f->tmpdir, "nothing.sock", NULL);
        g_autofree char *err = g_strdup_printf("vmctl: hostd is not running at %s\n", missing);
        run_vmctl(f, NULL, &run, "--socket", missing, "stop", "a1", "a2");
        assert_string_equal(run.err, err);
        assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));
    }
    g_mutex_clear(&asked.lock);
    g_ptr_array_unref(asked.names);
    g_ptr_array_unref(asked.ops);
}

/* A socket file at @path that nobody listens on any more, as a hostd that died leaves. */
static void
make_stale_socket(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    g_strlcpy(addr.sun_path, path, sizeof addr.sun_path);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    close(fd);
    assert_int_equal(chmod(path, 0666), 0);
}

/* Points vmctl, run bare as a user who is not root, at a data home and a system socket in the
 * test's directory, both open to that user. Returns the user's socket path. */
static char *
lookup_setup(Fixture *f)
{
    g_autofree char *user_dir = NULL;

    assert_int_equal(chmod(f->tmpdir, 0755), 0);
    f->bare = TRUE;
    f->as_nobody = TRUE;
    f->data_home = g_build_filename(f->tmpdir, "data", NULL);
    user_dir = g_build_filename(f->data_home, "hostd", NULL);
    assert_int_equal(g_mkdir_with_parents(user_dir, 0755), 0);
    f->system_socket = g_strdup(f->socket_path);
    assert_int_equal(chmod(f->socket_path, 0666), 0);
    return g_build_filename(user_dir, "hostd.sock", NULL);
}

/* Without --socket or $VMCTL_SOCKET, vmctl talks to the user's own hostd when its socket is
 * there, else to the system's; neither there is "not running", naming both. */
static void
test_socket_lookup(void **state)
{
    Fixture *f = *state;
    g_autofree char *user_socket = lookup_setup(f);
    g_auto(Run) system = {0};
    g_auto(Run) user = {0};
    g_auto(Run) none = {0};

    /* No socket of the user's own: the system's. */
    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &system, "start", "a1");
    assert_string_equal(system.err, "");
    assert_request(f, VM_OP_AGENT_START);
    assert_int_equal(system.status, 0);

    /* The user's own comes first, though the system's is there. It is asked whether it listens
     * (a connection closed at once) before the request: a fake that takes many connections. */
    {
        VmTestHostd *own = vm_test_hostd_new(user_socket);
        Asked asked = {.names = g_ptr_array_new_with_free_func(g_free), .ops = g_ptr_array_new()};

        g_mutex_init(&asked.lock);
        assert_int_equal(chmod(user_socket, 0666), 0);
        vm_test_hostd_serve(own, answer_actions, &asked);
        server_start(f);
        run_vmctl(f, NULL, &user, "start", "a1");
        assert_string_equal(user.out, "started a1\n");
        assert_int_equal(user.status, 0);
        vm_test_hostd_free(own);
        assert_false(f->hostd->connected);
        assert_int_equal(asked.names->len, 1);
        assert_int_equal(GPOINTER_TO_UINT(asked.ops->pdata[0]), VM_OP_AGENT_START);
        assert_int_equal(unlink(user_socket), 0);
        g_mutex_clear(&asked.lock);
        g_ptr_array_unref(asked.names);
        g_ptr_array_unref(asked.ops);
    }

    /* Neither. */
    g_free(f->system_socket);
    f->system_socket = g_build_filename(f->tmpdir, "system", "hostd.sock", NULL);
    g_autofree char *want = g_strdup_printf("vmctl: hostd is not running: no socket at %s or %s\n",
                                            user_socket, f->system_socket);
    run_vmctl(f, NULL, &none, "list");
    assert_string_equal(none.err, want);
    assert_int_equal(none.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));
}

/* A socket with nothing behind it says so; one this user may not open says how to get in, with
 * a status of its own. */
static void
test_socket_refused(void **state)
{
    Fixture *f = *state;
    g_autofree char *user_socket = lookup_setup(f);
    g_autofree char *closed_dir = g_build_filename(f->tmpdir, "closed", NULL);
    g_auto(Run) stale = {0};
    g_auto(Run) hidden = {0};

    make_stale_socket(user_socket);
    {
        g_auto(Run) passed_over = {0};
        g_auto(Run) only_user = {0};

        /* The system's hostd answers: the stale one is passed over. */
        reply(f, VM_OP_RESULT, "{'agents': <@aa{sv} []>}");
        server_start(f);
        run_vmctl(f, NULL, &passed_over, "list");
        assert_request(f, VM_OP_AGENT_LIST);
        assert_int_equal(passed_over.status, 0);

        /* Only stale sockets: the last one tried, the system's, is named. */
        g_free(f->system_socket);
        f->system_socket = g_build_filename(f->tmpdir, "stale.sock", NULL);
        make_stale_socket(f->system_socket);
        g_autofree char *want = g_strdup_printf(
            "vmctl: nothing listens on %s: the socket is left from a hostd that is gone\n",
            f->system_socket);
        run_vmctl(f, NULL, &stale, "list");
        assert_string_equal(stale.err, want);
        assert_int_equal(stale.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));

        /* The user's alone. */
        assert_int_equal(unlink(f->system_socket), 0);
        g_autofree char *want_user = g_strdup_printf(
            "vmctl: nothing listens on %s: the socket is left from a hostd that is gone\n",
            user_socket);
        run_vmctl(f, NULL, &only_user, "list");
        assert_string_equal(only_user.err, want_user);
        assert_int_equal(only_user.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));
    }
    assert_int_equal(unlink(user_socket), 0);

    /* A directory the user may not search: root's 0700 one as nobody, or one of mode 0 as its
     * owner. */
    assert_int_equal(g_mkdir(closed_dir, 0700), 0);
    g_free(f->system_socket);
    f->system_socket = g_build_filename(closed_dir, "hostd.sock", NULL);
    make_stale_socket(f->system_socket);
    assert_int_equal(chmod(closed_dir, geteuid() == 0 ? 0700 : 0), 0);
    {
        g_autofree char *want =
            g_strdup_printf("vmctl: permission denied on %s: set socket-group in hostd's "
                            "configuration, add your user to that group and log in again\n",
                            f->system_socket);
        run_vmctl(f, NULL, &hidden, "list");
        assert_string_equal(hidden.err, want);
        assert_int_equal(hidden.status, vm_error_exit_status(VM_ERROR_PERMISSION));
        assert_int_equal(hidden.status, 17);
    }
    assert_int_equal(chmod(closed_dir, 0700), 0);

    /* hostd's socket-group: a socket of mode 0660 in a group this user is not in. */
    if (geteuid() == 0) {
        struct group *daemon_group = getgrgid(1);
        g_autofree char *group = daemon_group != NULL ? g_strdup(daemon_group->gr_name) : NULL;
        g_autofree char *want = g_strdup_printf(
            "vmctl: permission denied on %s: add your user to the group '%s' (hostd's "
            "socket-group) and log in again\n",
            f->socket_path, group != NULL ? group : "1");
        g_auto(Run) run = {0};

        g_free(f->system_socket);
        f->system_socket = g_strdup(f->socket_path);
        assert_int_equal(chown(f->socket_path, 0, 1), 0);
        assert_int_equal(chmod(f->socket_path, 0660), 0);
        server_start(f);
        run_vmctl(f, NULL, &run, "list");
        assert_false(f->hostd->connected);
        assert_string_equal(run.err, want);
        assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_PERMISSION));
    }
}

static void
test_stop_timeout(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "stop", "a1", "--timeout", "2m");
    assert_int_equal(vm_message_get_uint(f->hostd->request, "timeout_s", 0), 120);
    assert_false(vm_message_get_bool(f->hostd->request, "force", TRUE));
}

static void
test_ssh_config(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    const char *config = "Host a1.hostd\n  HostName 127.0.0.1\n  Port 2201\n";
    g_autofree char *fields = g_strdup_printf("{'config': <%s>}", "'Host a1.hostd\\n  HostName "
                                                                  "127.0.0.1\\n  Port 2201\\n'");

    reply(f, VM_OP_RESULT, fields);
    server_start(f);
    run_vmctl(f, NULL, &run, "ssh-config");
    assert_request(f, VM_OP_AGENT_SSH_CONFIG);
    /* No NAME: all agents, so no name field. */
    assert_null(vm_message_lookup(f->hostd->request, "name"));
    assert_string_equal(run.out, config);
    assert_int_equal(run.status, 0);
}

static void
test_ssh(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) missing = {0};
    g_autofree char *bin = g_build_filename(f->tmpdir, "bin", NULL);
    g_autofree char *fake_ssh = g_build_filename(bin, "ssh", NULL);

    /* A stand-in ssh that shows how it was called. */
    assert_int_equal(g_mkdir(bin, 0700), 0);
    assert_true(g_file_set_contents(fake_ssh, "#!/bin/sh\nprintf '[%s]' \"$@\"\n", -1, NULL));
    assert_int_equal(g_chmod(fake_ssh, 0700), 0);
    f->path_env = g_strdup(bin);
    reply(f, VM_OP_RESULT,
          "{'config': <'Host a1.hostd\\n'>, 'path': <'/state/ssh/a1.conf'>, 'host': <'a1.hostd'>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "ssh", "a1", "--", "ls", "-l");
    assert_request(f, VM_OP_AGENT_SSH_CONFIG);
    assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
    /* "--" before the host: ssh would otherwise take the command's -l as its own. */
    assert_string_equal(run.out, "[-F][/state/ssh/a1.conf][--][a1.hostd][ls][-l]");
    assert_int_equal(run.status, 0);

    assert_int_equal(g_unlink(fake_ssh), 0);
    g_rmdir(bin);
    server_start(f);
    run_vmctl(f, NULL, &missing, "ssh", "a1");
    assert_string_equal(
        missing.err, "vmctl: ssh is not installed (vmctl ssh runs it); install openssh-client\n");
    assert_int_equal(missing.status, vm_error_exit_status(VM_ERROR_IO));
}

static void
test_exec(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply_data(f, VM_OP_STDOUT, "out 1\n");
    reply_data(f, VM_OP_STDERR, "err 1\n");
    reply_data(f, VM_OP_STDOUT, "out 2\n");
    reply(f, VM_OP_EXIT, "{'status': <3>}");
    server_start(f);
    g_setenv("VMCTL_TEST_COPIED", "copied", TRUE);
    run_vmctl(f, NULL, &run, "exec", "a1", "-e", "A=1", "-w", "/tmp", "-e", "VMCTL_TEST_COPIED",
              "-e", "VMCTL_TEST_UNSET", "--", "sh", "-c", "echo -n", "--", "-x");
    assert_request(f, VM_OP_EXEC);
    VmMessage *request = f->hostd->request;
    g_auto(GStrv) argv = vm_message_dup_strv(request, "argv");
    g_auto(GStrv) env = vm_message_dup_strv(request, "env");
    const char *const expected_argv[] = {"sh", "-c", "echo -n", "--", "-x", NULL};
    const char *const expected_env[] = {"A=1", "VMCTL_TEST_COPIED=copied", NULL};
    assert_true(g_strv_equal((const char *const *)argv, expected_argv));
    assert_true(g_strv_equal((const char *const *)env, expected_env));
    assert_string_equal(vm_message_get_string(request, "cwd", NULL), "/tmp");
    assert_false(vm_message_get_bool(request, "tty", TRUE));
    /* Not a terminal: no size, no TERM. */
    assert_null(vm_message_lookup(request, "cols"));
    assert_null(vm_message_lookup(request, "term"));

    assert_string_equal(run.out, "out 1\nout 2\n");
    assert_string_equal(run.err, "err 1\n");
    assert_int_equal(run.status, 3);
}

static void
test_exec_without_separator(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    /* Options before and after NAME are vmctl's; from CMD on, the command's. */
    run_vmctl(f, NULL, &run, "exec", "-w", "/", "a1", "-e", "K=V", "ls", "-l", "-e", "x");
    g_auto(GStrv) argv = vm_message_dup_strv(f->hostd->request, "argv");
    const char *const expected[] = {"ls", "-l", "-e", "x", NULL};
    assert_true(g_strv_equal((const char *const *)argv, expected));
    assert_string_equal(vm_message_get_string(f->hostd->request, "cwd", NULL), "/");
    assert_int_equal(run.status, 0);
}

/* @size letters a-z over and over, and a NUL: input whose every byte can be told apart. */
static char *
letters(gsize size)
{
    char *text = g_malloc(size + 1);

    for (gsize i = 0; i < size; i++)
        text[i] = (char)('a' + i % 26);
    text[size] = '\0';
    return text;
}

/* `vmctl exec a1 -- cat` with @input (NULL: none) against a fake hostd that collects it and
 * answers as the caller set it up: hostd got all of it, then the end of the input. */
static void
run_cat(Fixture *f, const char *input, Run *run)
{
    f->hostd->collect_stdin = TRUE;
    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    run_vmctl(f, input, run, "exec", "a1", "--", "cat");
    assert_true(f->hostd->got_eof);
    assert_int_equal(f->hostd->stdin_data->len, input != NULL ? strlen(input) : 0);
}

static void
test_exec_stdin(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    gsize size = 3 * VM_STREAM_CHUNK_MAX + 123;
    g_autofree char *input = letters(size);
    f->hostd->echo_stdin = TRUE;
    run_cat(f, input, &run);
    assert_true(f->hostd->max_chunk <= VM_STREAM_CHUNK_MAX);
    assert_memory_equal(f->hostd->stdin_data->data, input, size);
    assert_string_equal(run.out, input);
    assert_int_equal(run.status, 0);
}

/* `cat` with much input: hostd answers each piece as it reads it, and reads the next only once
 * vmctl has taken the answer. vmctl reads output while its input waits to be written (it once
 * stopped at the first output, waiting for the input's lock, and both sides waited for ever). */
static void
test_exec_stdin_echoed_as_read(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    gsize size = 8 * 1024 * 1024;
    g_autofree char *input = letters(size);
    f->hostd->echo_as_read = TRUE;
    run_cat(f, input, &run);
    assert_int_equal(strlen(run.out), size);
    assert_string_equal(run.out, input);
    assert_int_equal(run.status, 0);
}

/* The terminal on vmctl's side (a pty) while a SIGWINCH comes every half millisecond. */
typedef struct {
    GSubprocess *process;
    gint done;
    int master;
    GByteArray *seen; /* what came out on the terminal */
} Resizes;

static gpointer
resize_thread(gpointer data)
{
    Resizes *r = data;
    gint64 deadline = g_get_monotonic_time() + 60 * G_USEC_PER_SEC;

    while (!g_atomic_int_get(&r->done)) {
        /* Stuck that long is the deadlock this test is about: end it so the test fails. */
        if (g_get_monotonic_time() > deadline) {
            g_subprocess_force_exit(r->process);
            break;
        }
        g_subprocess_send_signal(r->process, SIGWINCH);
        g_usleep(500);
    }
    return NULL;
}

static gpointer
terminal_reader_thread(gpointer data)
{
    Resizes *r = data;
    guint8 buffer[65536];
    ssize_t n;

    /* EIO once vmctl, the last holder of the terminal's other side, is gone. */
    while ((n = read(r->master, buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0)
            g_byte_array_append(r->seen, buffer, (guint)n);
    return NULL;
}

/* vmctl exec -t with a terminal on stdout, resized again and again while much input goes one
 * way and its echo the other: every new size goes to hostd, and none stops vmctl reading the
 * output (the stdin thread may be holding the stream while its write waits for hostd, which
 * waits for vmctl to read). */
static void
test_exec_resized_during_input(void **state)
{
    Fixture *f = *state;
    gsize size = 8 * 1024 * 1024;
    g_autofree char *input = letters(size);
    g_autofree char *stdin_path = g_build_filename(f->tmpdir, "stdin", NULL);
    g_autoptr(GError) error = NULL;
    struct winsize window = {.ws_row = 24, .ws_col = 80};
    struct termios raw;
    int master = -1, slave = -1;
    Resizes r = {.seen = g_byte_array_new()};

    f->hostd->collect_stdin = TRUE;
    f->hostd->echo_as_read = TRUE;
    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    vm_test_write_file(stdin_path, input);
    assert_int_equal(openpty(&master, &slave, NULL, NULL, &window), 0);
    /* Output bytes as they are: no \r added before each \n. */
    assert_int_equal(tcgetattr(slave, &raw), 0);
    cfmakeraw(&raw);
    assert_int_equal(tcsetattr(slave, TCSANOW, &raw), 0);
    {
        g_autoptr(GSubprocessLauncher) launcher =
            g_subprocess_launcher_new(G_SUBPROCESS_FLAGS_STDERR_PIPE);
        g_subprocess_launcher_set_stdin_file_path(launcher, stdin_path);
        g_subprocess_launcher_take_stdout_fd(launcher, slave);
        r.process =
            g_subprocess_launcher_spawn(launcher, &error, f->vmctl, "--socket", f->socket_path,
                                        "exec", "-t", "a1", "--", "cat", NULL);
        vm_test_assert_no_error(error);
    }
    r.master = master;
    GThread *reader = g_thread_new("terminal", terminal_reader_thread, &r);
    GThread *resizer = g_thread_new("resize", resize_thread, &r);
    g_autoptr(GBytes) err = NULL;
    assert_true(g_subprocess_communicate(r.process, NULL, NULL, NULL, &err, &error));
    g_atomic_int_set(&r.done, TRUE);
    g_thread_join(resizer);
    g_thread_join(reader);
    close(master);
    vm_test_hostd_join(f->hostd);

    assert_true(g_subprocess_get_if_exited(r.process));
    g_autofree char *err_text = bytes_to_string(err);
    assert_string_equal(err_text, "");
    assert_int_equal(g_subprocess_get_exit_status(r.process), 0);
    assert_true(f->hostd->got_eof);
    assert_int_equal(f->hostd->stdin_data->len, size);
    assert_int_equal(r.seen->len, size);
    assert_memory_equal(r.seen->data, input, size);
    assert_true(g_atomic_int_get(&f->hostd->window_sizes) > 0);
    g_object_unref(r.process);
    g_byte_array_unref(r.seen);
}

static void
test_exec_empty_stdin(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    run_cat(f, NULL, &run);
    assert_int_equal(run.status, 0);
}

static void
test_exec_closed_stdout(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    /* vmctl exec a1 -- yes | head -1: the end of the reader ends vmctl like it ends yes. */
    f->closed_stdout = TRUE;
    reply_data(f, VM_OP_STDOUT, "y\n");
    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "exec", "a1", "--", "yes");
    assert_string_equal(run.err, "");
    assert_int_equal(run.status, 141);
}

/* vmctl cp to an agent hostd does not know: hostd's error and status, not the broken pipe the
 * stream being sent meets once hostd has answered and closed. */
static void
test_cp_hostd_error(void **state)
{
    Fixture *f = *state;
    g_autofree char *big = g_build_filename(f->tmpdir, "big", NULL);
    g_autofree char *blob = g_malloc0(4 * 1024 * 1024);
    g_auto(Run) run = {0};
    g_auto(Run) missing = {0};

    assert_true(g_file_set_contents(big, blob, 4 * 1024 * 1024, NULL));
    reply_error(f, VM_ERROR_NOT_FOUND, "no agent 'zz'");
    server_start(f);
    run_vmctl(f, NULL, &run, "cp", big, "zz:x");
    assert_string_equal(run.err, "vmctl: no agent 'zz'\n");
    assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_NOT_FOUND));
    /* Where the agent is comes first (in a fleet, another host may have it): refused there,
     * no stream begins. */
    assert_request(f, VM_OP_AGENT_INFO);

    run_vmctl(f, NULL, &missing, "cp", "zz:x", "/nonexistent/dir/x");
    assert_int_equal(missing.status, vm_error_exit_status(VM_ERROR_IO));
}

static void
test_exec_failures(void **state)
{
    Fixture *f = *state;
    g_auto(Run) error = {0};
    g_auto(Run) hangup = {0};
    g_auto(Run) not_running = {0};
    g_autofree char *missing = g_build_filename(f->tmpdir, "nothing.sock", NULL);

    /* Whatever failed, 125: every other status may be the command's own. */
    reply_error(f, VM_ERROR_NOT_FOUND, "no agent 'a1'");
    server_start(f);
    run_vmctl(f, NULL, &error, "exec", "a1", "--", "true");
    assert_string_equal(error.err, "vmctl: no agent 'a1'\n");
    assert_int_equal(error.status, 125);

    /* The server reads stdin to its end first: closing a Unix socket with data unread would
     * reset the connection instead of ending it. */
    g_ptr_array_set_size(f->hostd->replies, 0);
    f->hostd->collect_stdin = TRUE;
    reply_data(f, VM_OP_STDOUT, "partial");
    server_start(f);
    run_vmctl(f, NULL, &hangup, "exec", "a1", "--", "true");
    assert_string_equal(hangup.out, "partial");
    assert_string_equal(hangup.err, "vmctl: hostd closed the connection unexpectedly\n");
    assert_int_equal(hangup.status, 125);

    run_vmctl(f, NULL, &not_running, "--socket", missing, "exec", "a1", "true");
    assert_int_equal(not_running.status, 125);
}

static void
test_remote_parse(void **state)
{
    static const struct {
        const char *url;
        const char *user, *host;
        guint16 port;
        const char *socket_path;
    } good[] = {
        {"ssh://box", NULL, "box", 0, NULL},
        {"ssh://root@10.0.0.2:2222/var/lib/hostd/hostd.sock", "root", "10.0.0.2", 2222,
         "/var/lib/hostd/hostd.sock"},
        {"ssh://me@[::1]:22/run/h s.sock", "me", "::1", 22, "/run/h s.sock"},
        {"ssh://[fe80::1]", NULL, "fe80::1", 0, NULL},
        {"ssh://build.example.com/", NULL, "build.example.com", 0, NULL},
        {"ssh://a_b.c-d@h-1_x:65535", "a_b.c-d", "h-1_x", 65535, NULL},
    };
    static const struct {
        const char *url;
        const char *why;
    } bad[] = {
        {"", "it does not start with ssh://"},
        {"box", "it does not start with ssh://"},
        {"http://box", "it does not start with ssh://"},
        {"SSH://box", "it does not start with ssh://"},
        {"ssh://", "the host is missing"},
        {"ssh:///run/h.sock", "the host is missing"},
        {"ssh://me@", "the host is missing"},
        {"ssh://@box", "a user is letters, digits, '.', '-' and '_'"},
        {"ssh://m e@box", "a user is letters, digits, '.', '-' and '_'"},
        {"ssh://a@b@box", "a user is letters, digits, '.', '-' and '_'"},
        {"ssh://-oProxyCommand=x", "a host is letters, digits, '.', '-' and '_', not starting with "
                                   "'-'"},
        {"ssh://box;rm", "a host is letters, digits, '.', '-' and '_', not starting with '-'"},
        {"ssh://box:0", "the port is a number from 1 to 65535"},
        {"ssh://box:65536", "the port is a number from 1 to 65535"},
        {"ssh://box:22:23", "the port is a number from 1 to 65535"},
        {"ssh://box:", "the port is a number from 1 to 65535"},
        {"ssh://box:x", "the port is a number from 1 to 65535"},
        {"ssh://[::1", "an IPv6 address in brackets is hex digits and ':'"},
        {"ssh://[zz::1]", "an IPv6 address in brackets is hex digits and ':'"},
        {"ssh://[::1]x", "only ':PORT' may follow the address"},
        {"ssh://box/run/a\nb", "the socket path has a control character"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmctlRemote) remote = vmctl_remote_parse(good[i].url, "--host", &error);
        vm_test_assert_no_error(error);
        assert_non_null(remote);
        vm_test_assert_nullable_string_equal(remote->user, good[i].user);
        assert_string_equal(remote->host, good[i].host);
        assert_int_equal(remote->port, good[i].port);
        vm_test_assert_nullable_string_equal(remote->socket_path, good[i].socket_path);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmctlRemote) remote = vmctl_remote_parse(bad[i].url, "--host", &error);
        assert_null(remote);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, bad[i].why);
        assert_true(
            g_str_has_suffix(error->message, "; expected ssh://[user@]host[:port][/socket-path]"));
        assert_null(strchr(error->message, '\n'));
    }

    g_autoptr(GError) error = NULL;
    g_autofree char *long_url = g_strnfill(VMCTL_REMOTE_URL_MAX + 1, 'a');
    memcpy(long_url, "ssh://", 6);
    assert_null(vmctl_remote_parse(long_url, "$VMCTL_HOST", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT,
                         "invalid $VMCTL_HOST 'ssh://a");
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "it is too long");
}

static void
test_remote_ssh_argv(void **state)
{
    g_autoptr(VmctlRemote) full =
        vmctl_remote_parse("ssh://root@[::1]:2222/run/my hostd.sock", "--host", NULL);
    g_autoptr(VmctlRemote) bare = vmctl_remote_parse("ssh://box", "--host", NULL);
    g_auto(GStrv) full_bridge = vmctl_remote_bridge_argv(full);
    g_auto(GStrv) bare_bridge = vmctl_remote_bridge_argv(bare);
    g_auto(GStrv) full_argv = vmctl_remote_ssh_argv(full, (const char *const *)full_bridge, FALSE);
    g_auto(GStrv) bare_argv = vmctl_remote_ssh_argv(bare, (const char *const *)bare_bridge, TRUE);
    const char *const want_full[] = {
        "ssh",  "-o", "BatchMode=yes", "-a",      "-x",       "-T",         "-p",
        "2222", "--", "root@::1",      "'vmctl'", "'bridge'", "'--socket'", "'/run/my hostd.sock'",
        NULL};
    const char *const want_bare[] = {"ssh", "-o",  "BatchMode=yes", "-a",       "-x", "-t",
                                     "--",  "box", "'vmctl'",       "'bridge'", NULL};
    g_autofree char *full_destination = vmctl_remote_destination(full);
    g_autofree char *bare_destination = vmctl_remote_destination(bare);

    assert_true(g_strv_equal((const char *const *)full_argv, want_full));
    assert_true(g_strv_equal((const char *const *)bare_argv, want_bare));
    assert_string_equal(full_destination, "root@[::1]:2222");
    assert_string_equal(bare_destination, "box");
}

static void
test_remote_ssh_config_text(void **state)
{
    g_autoptr(VmctlRemote) remote = vmctl_remote_parse("ssh://me@box:2200", "--host", NULL);
    g_autofree char *config =
        vmctl_remote_ssh_config(remote, "Host vmctl-a1\n  Port 42200\n\nHost vmctl-b\n  Port 1");

    assert_string_equal(config, "Host vmctl-a1\n"
                                "  ProxyJump me@box:2200\n"
                                "  Port 42200\n"
                                "\n"
                                "Host vmctl-b\n"
                                "  ProxyJump me@box:2200\n"
                                "  Port 1\n");
}

/* Puts a fake ssh and the built vmctl first on vmctl's PATH: the fake records its arguments in
 * TMPDIR/ssh-args, then runs the remote command here with sh, as sshd would there, unless
 * @failure is set: then it prints that and exits 255, as ssh does when it cannot connect. */
static void
fake_ssh(Fixture *f, const char *failure)
{
    g_autofree char *bin = g_build_filename(f->tmpdir, "bin", NULL);
    g_autofree char *ssh = g_build_filename(bin, "ssh", NULL);
    g_autofree char *vmctl = g_build_filename(bin, "vmctl", NULL);
    g_autofree char *script = NULL;

    g_mkdir_with_parents(bin, 0700);
    if (failure != NULL)
        script = g_strdup_printf("#!/bin/sh\necho '%s' >&2\nexit 255\n", failure);
    else
        script = g_strdup_printf("#!/bin/sh\n"
                                 "printf '[%%s]' \"$@\" > '%s/ssh-args'\n"
                                 "while [ $# -gt 0 ]; do\n"
                                 "    case $1 in\n"
                                 "    --) shift; break ;;\n"
                                 "    -o|-p|-l) shift 2 ;;\n"
                                 "    *) shift ;;\n"
                                 "    esac\n"
                                 "done\n"
                                 "shift\n"
                                 "exec sh -c \"$*\"\n",
                                 f->tmpdir);
    assert_true(g_file_set_contents(ssh, script, -1, NULL));
    assert_int_equal(g_chmod(ssh, 0700), 0);
    g_unlink(vmctl);
    assert_int_equal(symlink(f->vmctl, vmctl), 0);
    g_free(f->path_env);
    f->path_env = g_strconcat(bin, ":", g_getenv("PATH"), NULL);
}

static char *
ssh_args(Fixture *f)
{
    g_autofree char *path = g_build_filename(f->tmpdir, "ssh-args", NULL);
    char *text = NULL;

    assert_true(g_file_get_contents(path, &text, NULL, NULL));
    return text;
}

static void
test_remote_bridge(void **state)
{
    Fixture *f = *state;
    g_auto(Run) list = {0};
    g_auto(Run) exec = {0};
    g_autofree char *args = NULL;
    g_autofree char *want_args = NULL;

    fake_ssh(f, NULL);
    f->host = g_strdup_printf("ssh://me@box.example:2222%s", f->socket_path);
    reply(f, VM_OP_RESULT, "{'agents': <[{'name': <'a1'>, 'state': <'running'>}]>}");
    server_start(f);
    run_vmctl(f, NULL, &list, "list", "--json");
    assert_request(f, VM_OP_AGENT_LIST);
    assert_string_equal(list.err, "");
    assert_string_equal(list.out, "[\n"
                                  "  {\n"
                                  "    \"name\" : \"a1\",\n"
                                  "    \"state\" : \"running\"\n"
                                  "  }\n"
                                  "]\n");
    assert_int_equal(list.status, 0);
    args = ssh_args(f);
    want_args = g_strdup_printf("[-o][BatchMode=yes][-a][-x][-T][-p][2222][--][me@box.example]"
                                "['vmctl']['bridge']['--socket']['%s']",
                                f->socket_path);
    assert_string_equal(args, want_args);

    /* Both ways at once, through the bridge: stdin in, the echo and the status out. */
    g_ptr_array_set_size(f->hostd->replies, 0);
    f->hostd->collect_stdin = TRUE;
    f->hostd->echo_stdin = TRUE;
    reply_data(f, VM_OP_STDERR, "to stderr\n");
    reply(f, VM_OP_EXIT, "{'status': <3>}");
    server_start(f);
    run_vmctl(f, "line 1\nline 2\n", &exec, "exec", "a1", "--", "cat");
    assert_request(f, VM_OP_EXEC);
    assert_true(f->hostd->got_eof);
    assert_string_equal(exec.out, "line 1\nline 2\n");
    assert_string_equal(exec.err, "to stderr\n");
    assert_int_equal(exec.status, 3);
}

/* The fleet's elsewhere: vmctl sends the request on to the host it names, once, through that
 * host's address (the stand-in ssh runs the real bridge to a second fake hostd); a new is pinned
 * to the host chosen; a second elsewhere is an error; nothing extra is printed. */
static void
test_fleet_elsewhere(void **state)
{
    Fixture *f = *state;
    g_auto(Run) made = {0};
    g_auto(Run) twice = {0};
    g_auto(Run) exec = {0};
    g_auto(Run) exec_twice = {0};
    g_autofree char *second_path = g_build_filename(f->tmpdir, "h2.sock", NULL);
    VmTestHostd *second = vm_test_hostd_new(second_path);
    g_autofree char *elsewhere = g_strdup_printf(
        "{'host': <'h2'>, 'address': <'ssh://root@h2%s'>, 'message': <'agent \\'a1\\' is "
        "to be made on host \\'h2\\''>}",
        second_path);

    fake_ssh(f, NULL);
    reply(f, VM_OP_ELSEWHERE, elsewhere);
    vm_test_hostd_reply(second, VM_OP_RESULT,
                        "{'agent': <{'name': <'a1'>, 'state': <'running'>}>}");
    server_start(f);
    vm_test_hostd_start(second);
    run_vmctl(f, NULL, &made, "new", "a1", "--json");
    vm_test_hostd_join(second);
    assert_request(f, VM_OP_AGENT_NEW);
    assert_null(vm_message_lookup(f->hostd->request, "on"));
    assert_non_null(second->request);
    assert_int_equal(second->request->op, VM_OP_AGENT_NEW);
    assert_string_equal(vm_message_get_string(second->request, "name", ""), "a1");
    assert_string_equal(vm_message_get_string(second->request, "on", ""), "h2");
    assert_string_equal(made.err, "");
    assert_non_null(strstr(made.out, "\"a1\""));
    assert_int_equal(made.status, 0);

    g_ptr_array_set_size(f->hostd->replies, 0);
    g_ptr_array_set_size(second->replies, 0);
    reply(f, VM_OP_ELSEWHERE, elsewhere);
    vm_test_hostd_reply(second, VM_OP_ELSEWHERE,
                        "{'host': <'h3'>, 'address': <'ssh://h3'>, 'message': <'x'>}");
    server_start(f);
    vm_test_hostd_start(second);
    run_vmctl(f, NULL, &twice, "info", "a1");
    vm_test_hostd_join(second);
    assert_int_equal(second->request->op, VM_OP_AGENT_INFO);
    assert_string_equal(twice.err, "vmctl: the request was sent on to host 'h2', which sent it "
                                   "on to host 'h3': not following twice\n");
    assert_int_equal(twice.status, 1);

    /* exec follows too, its input kept and sent again to the host named: none is lost. */
    g_ptr_array_set_size(f->hostd->replies, 0);
    g_ptr_array_set_size(second->replies, 0);
    reply(f, VM_OP_ELSEWHERE, elsewhere);
    second->collect_stdin = TRUE;
    second->echo_stdin = TRUE;
    vm_test_hostd_reply(second, VM_OP_EXIT, "{'status': <3>}");
    server_start(f);
    vm_test_hostd_start(second);
    run_vmctl(f, "line 1\nline 2\n", &exec, "exec", "a1", "--", "cat");
    vm_test_hostd_join(second);
    assert_int_equal(second->request->op, VM_OP_EXEC);
    assert_true(second->got_eof);
    assert_string_equal(exec.err, "");
    assert_string_equal(exec.out, "line 1\nline 2\n");
    assert_int_equal(exec.status, 3);

    /* ... and never twice. */
    g_ptr_array_set_size(f->hostd->replies, 0);
    g_ptr_array_set_size(second->replies, 0);
    second->collect_stdin = FALSE;
    second->echo_stdin = FALSE;
    reply(f, VM_OP_ELSEWHERE, elsewhere);
    vm_test_hostd_reply(second, VM_OP_ELSEWHERE,
                        "{'host': <'h3'>, 'address': <'ssh://h3'>, 'message': <'x'>}");
    server_start(f);
    vm_test_hostd_start(second);
    run_vmctl(f, NULL, &exec_twice, "exec", "a1", "--", "true");
    vm_test_hostd_join(second);
    assert_string_equal(exec_twice.err, "vmctl: the request was sent on to host 'h2', which sent "
                                        "it on to host 'h3': not following twice\n");
    assert_int_equal(exec_twice.status, 125);
    vm_test_hostd_free(second);
}

/* new --on asks hostd's protocol first: an older hostd is named, and no new is sent. */
static void
test_new_on_old_hostd(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) empty = {0};

    reply(f, VM_OP_RESULT, "{'version': <'0.9'>, 'protocol': <uint32 10>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "new", "a1", "--on", "h2");
    assert_request(f, VM_OP_PING);
    assert_string_equal(run.err, "vmctl: --on needs hostd's protocol 11; hostd speaks 10 (an "
                                 "older hostd)\n");
    assert_int_equal(run.status, 11);

    run_vmctl(f, NULL, &empty, "new", "a1", "--on", "");
    assert_non_null(strstr(empty.err, "--on takes a host id"));
    assert_int_equal(empty.status, 2);
}

static void
test_remote_environment(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) both = {0};

    /* $VMCTL_HOST names the host when no --socket does. */
    fake_ssh(f, NULL);
    f->host_env = g_strdup_printf("ssh://box%s", f->socket_path);
    f->bare = TRUE;
    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "start", "a1");
    assert_request(f, VM_OP_AGENT_START);
    assert_string_equal(run.out, "started a1\n");
    assert_int_equal(run.status, 0);

    f->bare = FALSE;
    f->host = g_strdup("ssh://box");
    run_vmctl(f, NULL, &both, "--socket", f->socket_path, "list");
    assert_string_equal(both.err, "vmctl: --host and --socket do not go together (the remote "
                                  "socket goes in the URL: ssh://HOST/PATH); see 'vmctl list "
                                  "--help'\n");
    assert_int_equal(both.status, 2);
}

static void
test_remote_errors(void **state)
{
    Fixture *f = *state;
    g_auto(Run) bad_url = {0};
    g_auto(Run) bad_env = {0};
    g_auto(Run) unreachable = {0};
    g_auto(Run) not_running = {0};
    g_auto(Run) no_ssh = {0};
    g_autofree char *missing = g_build_filename(f->tmpdir, "nothing.sock", NULL);
    g_autofree char *want_not_running =
        g_strdup_printf("vmctl: hostd is not running at %s\n", missing);

    f->host = g_strdup("http://box");
    run_vmctl(f, NULL, &bad_url, "list");
    assert_string_equal(bad_url.err, "vmctl: invalid --host 'http://box': it does not start with "
                                     "ssh://; expected ssh://[user@]host[:port][/socket-path]\n");
    assert_int_equal(bad_url.status, 2);

    f->host_env = g_strdup("ssh://box:99999");
    f->bare = TRUE;
    run_vmctl(f, NULL, &bad_env, "list");
    assert_string_equal(bad_env.err,
                        "vmctl: invalid $VMCTL_HOST 'ssh://box:99999': the port is a number from 1 "
                        "to 65535; expected ssh://[user@]host[:port][/socket-path]\n");
    assert_int_equal(bad_env.status, 2);
    f->bare = FALSE;

    /* ssh's own failure is the error, not the closed connection it leaves. */
    fake_ssh(f, "ssh: connect to host box port 22: Connection refused");
    g_free(f->host);
    f->host = g_strdup("ssh://box");
    run_vmctl(f, NULL, &unreachable, "list");
    assert_string_equal(unreachable.err, "vmctl: cannot reach hostd on box: ssh: connect to host "
                                         "box port 22: Connection refused\n");
    assert_int_equal(unreachable.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));

    /* hostd is not there on the remote: the bridge says so in a frame, with its code. */
    fake_ssh(f, NULL);
    g_free(f->host);
    f->host = g_strdup_printf("ssh://box%s", missing);
    run_vmctl(f, NULL, &not_running, "list");
    assert_string_equal(not_running.err, want_not_running);
    assert_int_equal(not_running.status, vm_error_exit_status(VM_ERROR_NOT_RUNNING));

    g_free(f->path_env);
    f->path_env = g_strdup(f->tmpdir);
    run_vmctl(f, NULL, &no_ssh, "list");
    assert_string_equal(no_ssh.err,
                        "vmctl: ssh is not installed (--host runs it); install openssh-client\n");
    assert_int_equal(no_ssh.status, vm_error_exit_status(VM_ERROR_IO));
}

static void
test_remote_ssh(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) config = {0};
    g_autofree char *bin = g_build_filename(f->tmpdir, "bin", NULL);
    g_autofree char *fake = g_build_filename(bin, "ssh", NULL);

    /* vmctl ssh runs `vmctl ssh` on the remote, where the agent's key is. */
    assert_int_equal(g_mkdir(bin, 0700), 0);
    assert_true(g_file_set_contents(fake, "#!/bin/sh\nprintf '[%s]' \"$@\"\n", -1, NULL));
    assert_int_equal(g_chmod(fake, 0700), 0);
    f->path_env = g_strdup(bin);
    f->host = g_strdup("ssh://me@box:2200/run/hostd.sock");
    run_vmctl(f, NULL, &run, "ssh", "a1", "--", "ls", "-l");
    assert_string_equal(run.out, "[-o][BatchMode=yes][-a][-x][-T][-p][2200][--][me@box]['vmctl']"
                                 "['--socket']['/run/hostd.sock']['ssh']['a1']['--']['ls']['-l']");
    assert_int_equal(run.status, 0);

    /* ssh-config reaches the agent's port on the remote's loopback through the remote. */
    fake_ssh(f, NULL);
    g_free(f->host);
    f->host = g_strdup_printf("ssh://me@box:2200%s", f->socket_path);
    reply(f, VM_OP_RESULT, "{'config': <'Host vmctl-a1\\n  HostName 127.0.0.1\\n'>}");
    server_start(f);
    run_vmctl(f, NULL, &config, "ssh-config", "a1");
    assert_request(f, VM_OP_AGENT_SSH_CONFIG);
    assert_string_equal(config.out,
                        "Host vmctl-a1\n  ProxyJump me@box:2200\n  HostName 127.0.0.1\n");
    assert_int_equal(config.status, 0);
}

/* ---- events ---------------------------------------------------------------------------------- */

/* `events` sends what it was asked for and shows each event on a line of its own, in local time,
 * escaping what came from the log; --json shows the lines as they came. */
static void
test_events(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};
    g_auto(Run) json = {0};
    g_autoptr(GVariant) since = NULL;
    gint64 before = g_get_real_time();
    static const char lines[] =
        "{\"time\":\"2024-05-01T12:00:00.250000Z\",\"agent\":\"alice\",\"event\":\"agent-start\","
        "\"state\":\"running\",\"uid\":1000,\"outcome\":\"ok\"}\n"
        "{\"time\":\"2024-05-01T12:00:01Z\",\"event\":\"restarted\",\"detail\":\"hostd came "
        "back\"}\n"
        "{\"time\":\"2024-05-01T12:00:02Z\",\"agent\":\"alice\",\"event\":\"exec\","
        "\"uid\":0,\"outcome\":\"error\",\"detail\":\"echo \\u001b[2J\\nrm: bad\"}\n";

    g_setenv("TZ", "UTC", TRUE);
    reply_data(f, VM_OP_STDOUT, lines);
    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "events", "alice", "--since", "10m", "--lines", "5");
    assert_request(f, VM_OP_EVENTS);
    assert_string_equal(vm_message_get_string(f->hostd->request, "name", ""), "alice");
    assert_int_equal(vm_message_get_uint(f->hostd->request, "lines", 0), 5);
    assert_false(vm_message_get_bool(f->hostd->request, "follow", TRUE));
    since = vm_message_lookup(f->hostd->request, "since");
    assert_non_null(since);
    assert_true(g_variant_get_int64(since) >= before - 600 * G_USEC_PER_SEC);
    assert_true(g_variant_get_int64(since) <= g_get_real_time() - 600 * G_USEC_PER_SEC);
    assert_int_equal(run.status, 0);
    assert_string_equal(run.err, "");
    assert_string_equal(
        run.out, "2024-05-01 12:00:00  alice         agent-start       running   uid 1000  ok\n"
                 "2024-05-01 12:00:01  -             restarted         -         hostd came back\n"
                 "2024-05-01 12:00:02  alice         exec              -         uid 0  error  "
                 "echo \\x1b[2J\\nrm: bad\n");

    reply_data(f, VM_OP_STDOUT, lines);
    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    run_vmctl(f, NULL, &json, "events", "--follow", "--json");
    assert_request(f, VM_OP_EVENTS);
    assert_null(vm_message_lookup(f->hostd->request, "name"));
    assert_null(vm_message_lookup(f->hostd->request, "since"));
    assert_null(vm_message_lookup(f->hostd->request, "lines"));
    assert_true(vm_message_get_bool(f->hostd->request, "follow", FALSE));
    assert_int_equal(json.status, 0);
    assert_string_equal(json.out, lines);
}

/* What an agent asked from inside (its in-guest API) says so instead of a uid. */
static void
test_events_guest(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    g_setenv("TZ", "UTC", TRUE);
    reply_data(f, VM_OP_STDOUT,
               "{\"time\":\"2024-05-01T12:00:00Z\",\"agent\":\"alice\",\"event\":"
               "\"checkpoint-create\",\"state\":\"running\",\"caller\":\"guest\","
               "\"outcome\":\"ok\",\"detail\":\"c3 before-upgrade\"}\n");
    reply(f, VM_OP_EXIT, "{'status': <0>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "events", "alice");
    assert_int_equal(run.status, 0);
    assert_string_equal(run.out, "2024-05-01 12:00:00  alice         checkpoint-create  running   "
                                 "by guest  ok  c3 before-upgrade\n");
}

/* A bad T or AGENT is a usage error, and nothing is sent. */
static void
test_events_usage(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *args[4];
        const char *err;
    } cases[] = {
        {{"events", "--since", "yesterday"},
         "vmctl: --since needs a duration (90s, 10m, 2h, 3d) or an ISO 8601 time "
         "(2024-05-01T14:00:00, with or without a zone), not 'yesterday'; see 'vmctl events "
         "--help'\n"},
        {{"events", "--lines", "-1"},
         "vmctl: --lines needs a number from 0 to 4294967294, not '-1'; see 'vmctl events "
         "--help'\n"},
        {{"events", "Alice"},
         "vmctl: invalid name 'Alice': must start with a lower-case letter a-z\n"},
        {{"events", "a", "b"}, "vmctl: unexpected argument 'b'; see 'vmctl events --help'\n"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};

        run_vmctl_argv(f, NULL, cases[i].args, &run);
        assert_string_equal(run.err, cases[i].err);
        assert_string_equal(run.out, "");
        assert_int_equal(run.status, 2);
    }
}

/* vmctl forward: add (a port chosen by hostd, or --host-port), --list, --rm; one request each. */
static void
test_forward(void **state)
{
    Fixture *f = *state;
    static const char forward[] =
        "{'forward': <{'agent': <'a1'>, 'guest_port': <uint32 3000>, 'host_port': <uint32 43000>, "
        "'address': <'127.0.0.1:43000'>, 'connections': <uint32 0>, 'listening': <true>}>}";
    static const char forwards[] =
        "{'forwards': <[{'agent': <'a1'>, 'guest_port': <uint32 3000>, "
        "'host_port': <uint32 43000>, 'address': <'127.0.0.1:43000'>, "
        "'connections': <uint32 2>, 'listening': <true>}, "
        "{'agent': <'web-2'>, 'guest_port': <uint32 8080>, 'host_port': <uint32 8080>, "
        "'address': <'127.0.0.1:8080'>, 'connections': <uint32 0>, 'listening': <false>}]>}";

    {
        g_auto(Run) run = {0};

        reply(f, VM_OP_RESULT, forward);
        server_start(f);
        run_vmctl(f, NULL, &run, "forward", "a1", "3000");
        assert_request(f, VM_OP_FORWARD_ADD);
        assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
        assert_int_equal(vm_message_get_uint(f->hostd->request, "guest_port", 0), 3000);
        assert_null(vm_message_lookup(f->hostd->request, "host_port"));
        assert_string_equal(run.out, "port 3000 of a1 is served on 127.0.0.1:43000\n");
        assert_string_equal(run.err, "");
        assert_int_equal(run.status, 0);
    }
    {
        g_auto(Run) run = {0};

        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, forward);
        server_start(f);
        run_vmctl(f, NULL, &run, "forward", "--host-port", "43000", "a1", "3000", "--json");
        assert_request(f, VM_OP_FORWARD_ADD);
        assert_int_equal(vm_message_get_uint(f->hostd->request, "host_port", 0), 43000);
        assert_string_equal(run.out, "{\n"
                                     "  \"agent\" : \"a1\",\n"
                                     "  \"guest_port\" : 3000,\n"
                                     "  \"host_port\" : 43000,\n"
                                     "  \"address\" : \"127.0.0.1:43000\",\n"
                                     "  \"connections\" : 0,\n"
                                     "  \"listening\" : true\n"
                                     "}\n");
        assert_int_equal(run.status, 0);
    }
    {
        g_auto(Run) run = {0};

        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, forwards);
        server_start(f);
        run_vmctl(f, NULL, &run, "forward", "--list");
        assert_request(f, VM_OP_FORWARD_LIST);
        assert_null(vm_message_lookup(f->hostd->request, "name"));
        assert_string_equal(run.out, "AGENT  GUEST PORT  ADDRESS          CONNECTIONS  SERVED\n"
                                     "a1     3000        127.0.0.1:43000  2            yes\n"
                                     "web-2  8080        127.0.0.1:8080   0            no\n");
        assert_int_equal(run.status, 0);
    }
    {
        g_auto(Run) run = {0};

        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, "{'forwards': <@aa{sv} []>}");
        server_start(f);
        run_vmctl(f, NULL, &run, "forward", "a1", "--list", "--json");
        assert_request(f, VM_OP_FORWARD_LIST);
        assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
        assert_string_equal(run.out, "[]\n");
        assert_int_equal(run.status, 0);
    }
    {
        g_auto(Run) run = {0};

        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, NULL);
        server_start(f);
        run_vmctl(f, NULL, &run, "forward", "--rm", "a1", "3000");
        assert_request(f, VM_OP_FORWARD_RM);
        assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
        assert_int_equal(vm_message_get_uint(f->hostd->request, "guest_port", 0), 3000);
        assert_string_equal(run.out, "port 3000 of a1 is no longer forwarded\n");
        assert_int_equal(run.status, 0);
    }
    {
        g_auto(Run) run = {0};

        g_ptr_array_set_size(f->hostd->replies, 0);
        reply_error(f, VM_ERROR_NO_RESOURCES,
                    "port 43000 on 127.0.0.1 is taken: agent 'web-2' forwards its port 80 there");
        server_start(f);
        run_vmctl(f, NULL, &run, "forward", "a1", "3000", "--host-port", "43000");
        assert_string_equal(
            run.err,
            "vmctl: port 43000 on 127.0.0.1 is taken: agent 'web-2' forwards its port 80 there\n");
        assert_string_equal(run.out, "");
        assert_int_equal(run.status, 7);
    }
}

/* What vmctl forward refuses before sending anything. */
static void
test_forward_usage(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *args[7];
        const char *err;
    } cases[] = {
        {{"forward"}, "vmctl: missing AGENT; see 'vmctl forward --help'\n"},
        {{"forward", "a1"}, "vmctl: missing GUEST_PORT; see 'vmctl forward --help'\n"},
        {{"forward", "--rm", "a1"}, "vmctl: missing GUEST_PORT; see 'vmctl forward --help'\n"},
        {{"forward", "a1", "3000", "4000"},
         "vmctl: unexpected argument '4000'; see 'vmctl forward --help'\n"},
        {{"forward", "--list", "a1", "3000"},
         "vmctl: unexpected argument '3000'; see 'vmctl forward --help'\n"},
        {{"forward", "--list", "--rm", "a1"},
         "vmctl: --list and --rm do not go together; see 'vmctl forward --help'\n"},
        {{"forward", "--list", "--host-port", "80"},
         "vmctl: --host-port goes with a new forward only; see 'vmctl forward --help'\n"},
        {{"forward", "--rm", "a1", "3000", "--host-port", "80"},
         "vmctl: --host-port goes with a new forward only; see 'vmctl forward --help'\n"},
        {{"forward", "a1", "0"},
         "vmctl: GUEST_PORT needs a number from 1 to 65535, not '0'; see 'vmctl forward "
         "--help'\n"},
        {{"forward", "a1", "http"},
         "vmctl: GUEST_PORT needs a number from 1 to 65535, not 'http'; see 'vmctl forward "
         "--help'\n"},
        {{"forward", "a1", "3000", "--host-port", "65536"},
         "vmctl: --host-port needs a number from 1 to 65535, not '65536'; see 'vmctl forward "
         "--help'\n"},
        {{"forward", "A1", "3000"},
         "vmctl: invalid name 'A1': must start with a lower-case letter a-z\n"},
        {{"forward", "--list", "../x"},
         "vmctl: invalid name '../x': must start with a lower-case letter a-z\n"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};

        run_vmctl_argv(f, NULL, cases[i].args, &run);
        assert_string_equal(run.err, cases[i].err);
        assert_string_equal(run.out, "");
        assert_int_equal(run.status, 2);
    }
}

static gint64
local_usec(int year, int month, int day, int hour, int minute)
{
    g_autoptr(GDateTime) t = g_date_time_new_local(year, month, day, hour, minute, 0);

    return g_date_time_to_unix(t) * G_USEC_PER_SEC;
}

/* T is a duration back from now or an ISO 8601 time, local without a zone. */
static void
test_parse_time(void **state)
{
    const VmctlVerb verb = {"events", vmctl_cmd_events, "[AGENT]", "events"};
    VmctlContext ctx = {.verb = &verb};
    const gint64 now = G_GINT64_CONSTANT(1714564800000000); /* 2024-05-01T12:00:00Z */
    const struct {
        const char *text;
        gint64 usec;
    } good[] = {
        {"90s", now - (gint64)90 * G_USEC_PER_SEC},
        {"90", now - (gint64)90 * G_USEC_PER_SEC},
        {"10m", now - (gint64)600 * G_USEC_PER_SEC},
        {"2h", now - (gint64)7200 * G_USEC_PER_SEC},
        {"3d", now - (gint64)3 * 86400 * G_USEC_PER_SEC},
        {"0s", now},
        {"2024-05-01T12:00:00Z", now},
        {"2024-05-01T12:00:00.5Z", now + G_USEC_PER_SEC / 2},
        {"2024-05-01T14:00:00+02:00", now},
        {"2024-05-01T14:00:00", local_usec(2024, 5, 1, 14, 0)},
        {"2024-05-01 14:00:00", local_usec(2024, 5, 1, 14, 0)},
        {"2024-05-01 14:00", local_usec(2024, 5, 1, 14, 0)},
        {"2024-05-01T14:00Z", now + (gint64)7200 * G_USEC_PER_SEC},
        {"2024-05-01", local_usec(2024, 5, 1, 0, 0)},
    };
    static const char *const bad[] = {
        "",
        "yesterday",
        "10x",
        "-5m",
        "5 m",
        "2024-13-01",
        "2024-05-01T25:00:00",
        "2024-05",
        "14:00",
        "2024-05-01T14",
        "2024-05-01Tab:cd",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autoptr(GError) error = NULL;
        gint64 usec = 0;

        if (!vmctl_parse_time(&ctx, "--since", good[i].text, now, &usec, &error))
            fail_msg("'%s': %s", good[i].text, error->message);
        if (usec != good[i].usec)
            fail_msg("'%s': %" G_GINT64_FORMAT ", expected %" G_GINT64_FORMAT, good[i].text, usec,
                     good[i].usec);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        gint64 usec = 42;

        assert_false(vmctl_parse_time(&ctx, "--since", bad[i], now, &usec, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "--since needs");
        assert_int_equal(usec, 42);
    }
}

/* ---- users' own keys: authorize, new --ssh-key, ssh-config --identity ---------------------- */

/* A copy of tests/data/ssh-keys/@name in the test's directory as @as; returns its path. */
static char *
key_file(Fixture *f, const char *name, const char *as)
{
    g_autofree char *source = vm_test_data_path("ssh-keys", name, NULL);
    g_autofree char *text = vm_test_read_file(source);
    char *path = g_build_filename(f->tmpdir, as, NULL);

    vm_test_write_file(path, text);
    return path;
}

static char *
key_text(const char *name)
{
    g_autofree char *source = vm_test_data_path("ssh-keys", name, NULL);
    g_autofree char *text = vm_test_read_file(source);

    return g_strdup(g_strstrip(text));
}

#define ONE_KEY_RESULT                                                                             \
    "{'keys': <[{'fingerprint': <'SHA256:Z0zG8m+z77Va4093TsHLE2T8lX2xBgz3n+0qJpiUxGU'>, "          \
    "'type': <'ssh-ed25519'>, 'bits': <uint32 256>, 'comment': <'alice@laptop'>}]>, "              \
    "'added': <uint32 1>}"

static void
test_authorize_add(void **state)
{
    Fixture *f = *state;
    g_autofree char *pub = key_file(f, "ed25519.pub", "id_ed25519.pub");
    g_autofree char *want_line = key_text("ed25519.pub");
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT, ONE_KEY_RESULT);
    server_start(f);
    run_vmctl(f, NULL, &run, "authorize", "a1", pub);
    assert_request(f, VM_OP_AGENT_AUTHORIZE_ADD);
    assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
    g_auto(GStrv) keys = vm_message_dup_strv(f->hostd->request, "keys");
    assert_int_equal(g_strv_length(keys), 1);
    assert_string_equal(keys[0], want_line);
    g_autofree char *want = g_strdup_printf(
        "authorized 1 new key in a1 (1 in all); log in with: ssh -F <(vmctl ssh-config a1 "
        "--identity '%s/id_ed25519') vmctl-a1\n",
        f->tmpdir);
    assert_string_equal(run.out, want);
    assert_int_equal(run.status, 0);
}

/* Sizes as vmctl set reads them: bare numbers in the option's unit, M/G/T, relative with '+'. */
static void
test_parse_size(void **state)
{
    const VmctlVerb verb = {"set", vmctl_cmd_set, "NAME", "set"};
    VmctlContext ctx = {.verb = &verb};
    const guint64 max = 16384 * 1024;
    const struct {
        const char *text;
        guint bare_mib;
        gboolean relative;
        guint64 mib;
    } good[] = {
        {"512", 1, FALSE, 512},    {"512M", 1, FALSE, 512},      {"8G", 1, FALSE, 8192},
        {"8gib", 1, FALSE, 8192},  {"+2G", 1, TRUE, 2048},       {"20", 1024, FALSE, 20480},
        {"+5G", 1024, TRUE, 5120}, {"1T", 1024, FALSE, 1048576}, {"2048MiB", 1024, FALSE, 2048},
        {"16384G", 1, FALSE, max},
    };
    const char *const bad[] = {
        "",     "+",    "G",   "0",  "+0G",    "-1",
        "1.5G", "8 G",  "8GB", "8K", "16385G", "99999999999999",
        "8G ",  "\xff",
    };

    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autoptr(GError) error = NULL;
        gboolean relative = !good[i].relative;
        guint64 mib = 0;
        assert_true(vmctl_parse_size(&ctx, "--x", good[i].text, good[i].bare_mib, max, &relative,
                                     &mib, &error));
        assert_int_equal(relative, good[i].relative);
        assert_int_equal(mib, good[i].mib);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        gboolean relative = FALSE;
        guint64 mib = 0;
        assert_false(vmctl_parse_size(&ctx, "--x", bad[i], 1, max, &relative, &mib, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }
}

/* set: each size sent as its absolute or relative field; one line per change, led by the name;
 * --json gives the whole result. */
static void
test_set(void **state)
{
    Fixture *f = *state;
    g_auto(Run) run = {0};

    reply(f, VM_OP_RESULT,
          "{'agent': <{'name': <'a1'>, 'cpus': <uint32 4>}>, 'changes': <['disk 13G: grown live, "
          "its root filesystem too', 'cpus 4: at the next start (vmctl stop a1, then vmctl start "
          "a1)']>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "set", "a1", "--cpus", "4", "--memory", "+2G", "--disk", "+5G");
    assert_request(f, VM_OP_AGENT_SET_RESOURCES);
    VmMessage *request = f->hostd->request;
    assert_string_equal(vm_message_get_string(request, "name", NULL), "a1");
    assert_int_equal(vm_message_get_uint(request, "cpus", 0), 4);
    assert_null(vm_message_lookup(request, "cpus_add"));
    assert_int_equal(vm_message_get_uint(request, "memory_add_mib", 0), 2048);
    assert_null(vm_message_lookup(request, "memory_mib"));
    assert_int_equal(vm_message_get_uint(request, "disk_add_gib", 0), 5);
    assert_null(vm_message_lookup(request, "disk_gib"));
    assert_string_equal(run.out, "a1: disk 13G: grown live, its root filesystem too\n"
                                 "a1: cpus 4: at the next start (vmctl stop a1, then vmctl start "
                                 "a1)\n");
    assert_int_equal(run.status, 0);
}

/* A wrong key file fails before anything is sent, naming the file and its line. */
static void
test_authorize_refused(void **state)
{
    Fixture *f = *state;
    g_autofree char *dsa = key_file(f, "dsa.pub", "dsa.pub");
    g_autofree char *short_rsa = key_file(f, "rsa-1024.pub", "short.pub");
    g_autofree char *ed = key_text("ed25519.pub");
    g_autofree char *ecdsa = key_text("ecdsa-256.pub");
    g_autofree char *options = g_build_filename(f->tmpdir, "options.pub", NULL);
    g_autofree char *two = g_build_filename(f->tmpdir, "two.pub", NULL);
    g_autofree char *huge = g_build_filename(f->tmpdir, "huge.pub", NULL);
    g_autofree char *private = g_build_filename(f->tmpdir, "id_ed25519", NULL);
    g_autofree char *missing = g_build_filename(f->tmpdir, "missing.pub", NULL);
    g_autofree char *options_text = g_strdup_printf("# mine\ncommand=\"/bin/true\" %s\n", ed);
    g_autofree char *two_text = g_strdup_printf("%s %s\n", ed, ecdsa);
    g_autofree char *huge_text = g_strnfill(70 * 1024, 'A');
    g_autofree char *options_err = g_strdup_printf(
        "vmctl: %s, line 2: key options (command=, from=, no-pty...) are not accepted: give the "
        "bare public key, TYPE BASE64 [COMMENT]\n",
        options);
    g_autofree char *dsa_err = g_strdup_printf("vmctl: %s, line 1: ssh-dss (DSA) keys", dsa);
    g_autofree char *rsa_err = g_strdup_printf("vmctl: %s, line 1: the RSA key has 1024 bits: at "
                                               "least 2048 are needed (or use ed25519)\n",
                                               short_rsa);
    g_autofree char *two_err = g_strdup_printf(
        "vmctl: %s, line 1: more than one key on one line: put each key on a line of its own\n",
        two);
    g_autofree char *huge_err =
        g_strdup_printf("vmctl: %s is larger than 65536 bytes: not a public key\n", huge);
    g_autofree char *private_err = g_strdup_printf(
        "vmctl: %s holds a private key: give its public key (the .pub file)\n", private);
    g_autofree char *missing_err =
        g_strdup_printf("vmctl: cannot open the key file %s: No such file or directory\n", missing);
    const struct {
        const char *args[6];
        const char *err; /* the start of stderr, or NULL */
        int status;
    } cases[] = {
        {{"authorize", "a1", options}, options_err, 2},
        {{"authorize", "a1", dsa}, dsa_err, 2},
        {{"authorize", "a1", short_rsa}, rsa_err, 2},
        {{"authorize", "a1", two}, two_err, 2},
        {{"authorize", "a1", huge}, huge_err, 2},
        {{"authorize", "a1", private}, private_err, 2},
        {{"authorize", "a1", missing}, missing_err, vm_error_exit_status(VM_ERROR_IO)},
        {{"new", "a1", "--ssh-key", options}, options_err, 2},
        {{"new", "a1", "--ssh-key", missing}, missing_err, vm_error_exit_status(VM_ERROR_IO)},
        {{"authorize", "a1"}, "vmctl: give one of: a public key FILE, --list, --rm FINGERPRINT", 2},
        {{"authorize", "a1", missing, "--list"}, "vmctl: give one of", 2},
        {{"authorize", "a1", "--list", "--rm", "SHA256:x"}, "vmctl: give one of", 2},
        {{"authorize", "a1", "--rm", "abc"}, "vmctl: --rm takes a key's fingerprint, SHA256:", 2},
        {{"authorize", "A1", "--list"}, "vmctl: invalid name 'A1'", 2},
    };

    vm_test_write_file(options, options_text);
    vm_test_write_file(two, two_text);
    vm_test_write_file(huge, huge_text);
    vm_test_write_file(private, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n");
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Run) run = {0};

        server_start(f);
        run_vmctl_argv(f, NULL, cases[i].args, &run);
        assert_false(f->hostd->connected);
        if (!g_str_has_prefix(run.err, cases[i].err))
            fail_msg("case %zu: stderr '%s' does not start with '%s'", i, run.err, cases[i].err);
        assert_int_equal(run.status, cases[i].status);
    }
}

static void
test_authorize_list_rm(void **state)
{
    Fixture *f = *state;

    {
        g_auto(Run) run = {0};
        reply(f, VM_OP_RESULT, ONE_KEY_RESULT);
        server_start(f);
        run_vmctl(f, NULL, &run, "authorize", "a1", "--list");
        assert_request(f, VM_OP_AGENT_AUTHORIZE_LIST);
        assert_string_equal(vm_message_get_string(f->hostd->request, "name", NULL), "a1");
        assert_string_equal(run.out,
                            "FINGERPRINT                                         TYPE         "
                            "BITS  COMMENT\n"
                            "SHA256:Z0zG8m+z77Va4093TsHLE2T8lX2xBgz3n+0qJpiUxGU  ssh-ed25519  "
                            "256   alice@laptop\n");
    }
    {
        g_auto(Run) run = {0};
        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, ONE_KEY_RESULT);
        server_start(f);
        run_vmctl(f, NULL, &run, "authorize", "--json", "a1", "--list");
        assert_non_null(strstr(run.out, "\"fingerprint\" : \"SHA256:Z0zG8m"));
        assert_true(g_str_has_prefix(run.out, "["));
    }
    {
        g_auto(Run) run = {0};
        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, "{'keys': <@aa{sv} []>}");
        server_start(f);
        run_vmctl(f, NULL, &run, "authorize", "a1", "--list");
        assert_string_equal(run.out, "a1 has no keys of yours; add one with: vmctl authorize a1 "
                                     "~/.ssh/id_ed25519.pub\n");
    }
    {
        g_auto(Run) run = {0};
        g_ptr_array_set_size(f->hostd->replies, 0);
        reply(f, VM_OP_RESULT, "{'keys': <@aa{sv} []>}");
        server_start(f);
        run_vmctl(f, NULL, &run, "authorize", "a1", "--rm", "SHA256:abc");
        assert_request(f, VM_OP_AGENT_AUTHORIZE_RM);
        assert_string_equal(vm_message_get_string(f->hostd->request, "fingerprint", NULL),
                            "SHA256:abc");
        assert_string_equal(run.out, "removed key SHA256:abc from a1 (0 left)\n");
        assert_int_equal(run.status, 0);
    }
    {
        g_auto(Run) run = {0};
        g_ptr_array_set_size(f->hostd->replies, 0);
        reply_error(f, VM_ERROR_NOT_FOUND, "agent 'a1' has no key SHA256:abc");
        server_start(f);
        run_vmctl(f, NULL, &run, "authorize", "a1", "--rm", "SHA256:abc");
        assert_string_equal(run.err, "vmctl: agent 'a1' has no key SHA256:abc\n");
        assert_int_equal(run.status, 3);
    }
}

static void
test_new_ssh_keys(void **state)
{
    Fixture *f = *state;
    g_autofree char *ed = key_file(f, "ed25519.pub", "a.pub");
    g_autofree char *ed_line = key_text("ed25519.pub");
    g_autofree char *rsa_line = key_text("rsa-2048.pub");
    g_autofree char *ecdsa_line = key_text("ecdsa-384.pub");
    g_autofree char *both = g_build_filename(f->tmpdir, "both.pub", NULL);
    g_autofree char *both_text = g_strdup_printf("%s\n\n# work\n%s\n", rsa_line, ecdsa_line);
    g_auto(Run) run = {0};

    vm_test_write_file(both, both_text);
    reply(f, VM_OP_RESULT, "{'agent': <{'name': <'a1'>, 'state': <'running'>}>}");
    server_start(f);
    run_vmctl(f, NULL, &run, "new", "a1", "--ssh-key", ed, "--ssh-key", both);
    assert_request(f, VM_OP_AGENT_NEW);
    g_auto(GStrv) keys = vm_message_dup_strv(f->hostd->request, "ssh_keys");
    assert_int_equal(g_strv_length(keys), 3);
    assert_string_equal(keys[0], ed_line);
    assert_string_equal(keys[1], rsa_line);
    assert_string_equal(keys[2], ecdsa_line);
    assert_int_equal(run.status, 0);
}

static void
test_ssh_config_identity(void **state)
{
    Fixture *f = *state;
    g_autofree char *identity = g_build_filename(f->tmpdir, "id_ed25519", NULL);
    g_autofree char *missing = g_build_filename(f->tmpdir, "nope", NULL);
    const char *fields =
        "{'config': <'Host vmctl-a1\\n  HostName 127.0.0.1\\n  Port 2201\\n  User agent\\n"
        "  IdentityFile \"/var/lib/hostd/agents/a1/id_ed25519\"\\n  IdentitiesOnly yes\\n'>, "
        "'path': <'/var/lib/hostd/agents/a1/ssh_config'>, 'host': <'vmctl-a1'>}";
    g_autofree char *want = g_strdup_printf("Host vmctl-a1\n  HostName 127.0.0.1\n  Port 2201\n"
                                            "  User agent\n  IdentityFile \"%s\"\n"
                                            "  IdentitiesOnly yes\n",
                                            identity);

    vm_test_write_file(identity, "private\n");
    {
        g_auto(Run) run = {0};
        reply(f, VM_OP_RESULT, fields);
        server_start(f);
        run_vmctl(f, NULL, &run, "ssh-config", "a1", "--identity", identity);
        assert_request(f, VM_OP_AGENT_SSH_CONFIG);
        assert_string_equal(run.out, want);
        assert_int_equal(run.status, 0);
    }
    {
        /* The JSON holds the same text, and no path to hostd's file, which names hostd's key. */
        g_auto(Run) run = {0};
        server_start(f);
        run_vmctl(f, NULL, &run, "--json", "ssh-config", "a1", "--identity", identity);
        assert_non_null(strstr(run.out, identity));
        assert_null(strstr(run.out, "\"path\""));
        assert_non_null(strstr(run.out, "\"host\" : \"vmctl-a1\""));
    }
    {
        g_auto(Run) run = {0};
        g_autofree char *err = g_strdup_printf("vmctl: --identity %s: no such file\n", missing);
        server_start(f);
        run_vmctl(f, NULL, &run, "ssh-config", "a1", "--identity", missing);
        assert_false(f->hostd->connected);
        assert_string_equal(run.err, err);
        assert_int_equal(run.status, vm_error_exit_status(VM_ERROR_IO));
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_not_running, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info_secrets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info_disk_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_disk_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_usage_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_create, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_grant_rm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_fork_secrets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_egress_presets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_egress_rules_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help_everywhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_actions_several, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_lookup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_fleet, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hosts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hosts_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hosts_no_fleet, setup, teardown),
        cmocka_unit_test_setup_teardown(test_template_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info_fenced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostd_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_escaped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_diff_escaped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostd_error_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostd_hangs_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_progress_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_bad_user_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_actions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ssh_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ssh, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_without_separator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_stdin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_stdin_echoed_as_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_resized_during_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_empty_stdin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_closed_stdout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cp_hostd_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_failures, setup, teardown),
        cmocka_unit_test(test_remote_parse),
        cmocka_unit_test(test_remote_ssh_argv),
        cmocka_unit_test(test_remote_ssh_config_text),
        cmocka_unit_test_setup_teardown(test_remote_bridge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fleet_elsewhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_on_old_hostd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_environment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remote_ssh, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_guest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_usage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_usage, setup, teardown),
        cmocka_unit_test(test_parse_time),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test_setup_teardown(test_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_authorize_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_authorize_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_authorize_list_rm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_ssh_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ssh_config_identity, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
