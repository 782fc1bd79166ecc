/* hostd's egress without VMs: agents as records in a temporary state dir over libvirt's test
 * driver, their proxies on their Unix sockets, guest connections handed over as QEMU's guestfwd
 * does (the real vm-egress-connect helper with a socketpair as its stdio), a fake resolver for
 * names, and a counting echo sink on 127.0.0.1 as the only destination. Every refused case must
 * deliver 0 bytes to the sink and leave a log record. */
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
#include <pwd.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-agent.h"
#include "hostd-confine.h"
#include "hostd-egress-presets.h"
#include "hostd-egress.h"
#include "vm-egress-ca.h"
#include "vm-egress-wire.h"
#include "vm-fd-pass.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-egress-fixture.h"
#include "test-hostd-fixture.h"
#include "test-sink.h"

#define IO_TIMEOUT_MS 5000

/* ---- fixture -------------------------------------------------------------------------------- */

typedef struct {
    HostdTestFixture *hostd;
    HostdContext *ctx; /* hostd's */
    VmTestSink *sink;
} Fixture;

static const char *
env_or(const char *name, const char *fallback)
{
    const char *value = g_getenv(name);

    return value != NULL && value[0] != '\0' ? value : fallback;
}

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->hostd = hostd_test_fixture_new();
    f->ctx = f->hostd->ctx;
    hostd_egress_set_resolver(f->ctx, vm_test_egress_resolve, NULL);
    f->sink = vm_test_sink_new();
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    hostd_test_fixture_free(f->hostd);
    vm_test_sink_free(f->sink);
    g_free(f);
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

/* The space-separated rules of @text as a list, PORT standing for the sink's port. */
static char **
rules(Fixture *f, const char *text)
{
    g_autofree char *port = g_strdup_printf("%u", f->sink->port);
    g_autoptr(GString) s = NULL;

    if (text == NULL)
        return NULL;
    s = g_string_new(text);
    g_string_replace(s, "PORT", port, 0);
    return g_strsplit(s->str, " ", 0);
}

static void
init_agent(Fixture *f, const char *name, const char *allow, const char *deny)
{
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, name);
    g_auto(GStrv) a = rules(f, allow);
    g_auto(GStrv) d = rules(f, deny);
    g_autoptr(GError) error = NULL;

    if (!hostd_egress_agent_init(f->ctx, r, (const char *const *)a, (const char *const *)d, &error))
        fail_msg("init: %s", error->message);
}

static GVariant *
set_policy(Fixture *f, const char *name, const char *allow, const char *deny, const char *remove,
           gboolean reset, GError **error)
{
    g_auto(GStrv) a = rules(f, allow);
    g_auto(GStrv) d = rules(f, deny);
    g_auto(GStrv) r = rules(f, remove);

    return hostd_test_sink(hostd_egress_set(f->ctx, name, (const char *const *)a,
                                            (const char *const *)d, (const char *const *)r, reset,
                                            error));
}

static void
set_ok(Fixture *f, const char *name, const char *allow, const char *deny, const char *remove,
       gboolean reset)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v = set_policy(f, name, allow, deny, remove, reset, &error);

    if (v == NULL)
        fail_msg("set: %s", error->message);
}

static char *
helper_path(void)
{
    return g_build_filename(env_or("VM_BUILD_DIR", "."), "egress", "vm-egress-connect", NULL);
}

/* A guest connection as QEMU makes it: a socketpair whose one end becomes the helper's stdio.
 * Returns the guest's end and the helper's exit status in *@ret_status. */
static int
guest_connect(Fixture *f, const char *name, int *ret_status)
{
    g_autofree char *helper = helper_path();
    g_autofree char *socket_path = hostd_test_agent_file(f->hostd, name, HOSTD_AGENT_EGRESS_SOCKET);

    return vm_test_run_on_socketpair(helper, socket_path, ret_status);
}

/* Opens a CONNECT tunnel to @host:sink through @name's proxy; returns the fd, or -1 with the
 * response status in *@ret_status when refused. */
static int
tunnel(Fixture *f, const char *name, const char *host, int *ret_status)
{
    int helper_status = -1;
    int fd = guest_connect(f, name, &helper_status);
    g_autofree char *request = NULL;
    g_autoptr(GString) response = NULL;
    gboolean eof;

    assert_int_equal(helper_status, 0);
    request = g_strdup_printf("CONNECT %s:%u HTTP/1.1\r\nHost: %s:%u\r\n\r\n", host, f->sink->port,
                              host, f->sink->port);
    vm_test_send_text(fd, request);
    response = vm_test_read_until(fd, "\r\n\r\n", IO_TIMEOUT_MS, &eof);
    *ret_status = g_str_has_prefix(response->str, "HTTP/1.1 ") ? atoi(response->str + 9) : 0;
    if (*ret_status == 200)
        return fd;
    close(fd);
    return -1;
}

static char *
log_text(Fixture *f, const char *name)
{
    g_autofree char *path = hostd_test_agent_file(f->hostd, name, HOSTD_AGENT_EGRESS_LOG);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

/* Waits until the log of @name has @n lines; returns them. */
static char **
log_wait_lines(Fixture *f, const char *name, guint n)
{
    for (int i = 0; i < 500; i++) {
        g_autofree char *text = log_text(f, name);
        /* Not g_strsplit(): it may be the 4 MiB log before its rotation, and ASan's strstr()
         * makes splitting that with it quadratic. */
        g_auto(GStrv) lines = g_strsplit_set(text, "\n", -1);

        /* the last element is what follows the last newline */
        if (g_strv_length(lines) >= n + 1)
            return g_steal_pointer(&lines);
        g_usleep(10 * 1000);
    }
    fail_msg("the log of %s never reached %u lines:\n%s", name, n, log_text(f, name));
    return NULL;
}

/* ---- policy: init, change, persistence, copy ------------------------------------------------ */

static void
test_init_from_template(void **state)
{
    Fixture *f = *state;
    g_autofree char *ini = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_POLICY);
    g_autofree char *sock = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_SOCKET);
    g_autofree char *p = NULL;
    struct stat st;

    init_agent(f, "a1", "PyPI.org. *.Example.COM 203.0.113.0/24", "upload.pypi.org");
    p = hostd_test_egress_text(f->hostd, "a1");
    assert_string_equal(p, "pypi.org *.example.com 203.0.113.0/24|upload.pypi.org");
    assert_true(g_file_test(ini, G_FILE_TEST_EXISTS));
    assert_int_equal(vm_test_file_mode(ini), 0600);
    /* The socket is the proxy's and nobody else's. */
    assert_int_equal(lstat(sock, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);

    /* The template spells "any" as "*"; none is nothing at all. */
    init_agent(f, "a2", "*", NULL);
    g_free(p);
    p = hostd_test_egress_text(f->hostd, "a2");
    assert_string_equal(p, "any|");
    init_agent(f, "a3", NULL, NULL);
    g_free(p);
    p = hostd_test_egress_text(f->hostd, "a3");
    assert_string_equal(p, "none|");
}

static void
test_init_bad_template(void **state)
{
    Fixture *f = *state;
    static const char *const bad[] = {"pypi.org:0", "10.0.0.1/8", "a..b", "*x.com", "0x7f.0.0.1"};

    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *name = g_strdup_printf("bad%zu", i);
        g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, name);
        const char *const allow[] = {"ok.example", bad[i], NULL};
        g_autoptr(GError) error = NULL;
        g_autofree char *ini = hostd_test_agent_file(f->hostd, name, HOSTD_AGENT_EGRESS_POLICY);
        g_autofree char *sock = hostd_test_agent_file(f->hostd, name, HOSTD_AGENT_EGRESS_SOCKET);

        assert_false(hostd_egress_agent_init(f->ctx, r, allow, NULL, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        if (strstr(error->message, bad[i]) == NULL)
            fail_msg("the error does not name '%s': %s", bad[i], error->message);
        assert_false(g_file_test(ini, G_FILE_TEST_EXISTS));
        assert_false(g_file_test(sock, G_FILE_TEST_EXISTS));
    }
}

static void
test_set_edits(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *allow, *deny, *remove;
        gboolean reset;
        const char *expect;
    } steps[] = {
        {"pypi.org", NULL, NULL, FALSE, "pypi.org|"},
        {"files.pythonhosted.org 198.18.0.0/30", "evil.pypi.org", NULL, FALSE,
         "pypi.org files.pythonhosted.org 198.18.0.0/30|evil.pypi.org"},
        /* already there: no duplicate */
        {"PYPI.ORG.", NULL, NULL, FALSE,
         "pypi.org files.pythonhosted.org 198.18.0.0/30|evil.pypi.org"},
        {NULL, NULL, "pypi.org evil.pypi.org", FALSE, "files.pythonhosted.org 198.18.0.0/30|"},
        {"any", NULL, NULL, FALSE, "any|"},
        {"none", "x.example", NULL, FALSE, "none|x.example"},
        {"a.example", NULL, NULL, TRUE, "a.example|"},
        {NULL, NULL, NULL, TRUE, "none|"},
    };

    init_agent(f, "a1", NULL, NULL);
    for (gsize i = 0; i < G_N_ELEMENTS(steps); i++) {
        g_autofree char *p = NULL;

        set_ok(f, "a1", steps[i].allow, steps[i].deny, steps[i].remove, steps[i].reset);
        p = hostd_test_egress_text(f->hostd, "a1");
        if (!g_str_equal(p, steps[i].expect))
            fail_msg("step %zu: got '%s', want '%s'", i, p, steps[i].expect);
    }
}

/* Presets stand for their rules in every list, at init as in a change; the policy stores the
 * rules. An unknown preset changes nothing. A user preset replaces the built-in of its name. */
static void
test_presets(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *allow, *deny, *remove;
        const char *expect;
    } steps[] = {
        {"@pypi", NULL, NULL, "a.example pypi.org files.pythonhosted.org|"},
        {NULL, "@npm", NULL, "a.example pypi.org files.pythonhosted.org|registry.npmjs.org"},
        /* a preset goes as a whole, with what it shares with others */
        {NULL, NULL, "@pypi @npm", "a.example|"},
        {"@anthropic,x", NULL, NULL, NULL},
        {"@openai b.example:8443", NULL, NULL, "a.example api.openai.com b.example:8443|"},
    };
    g_autofree char *ini = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_POLICY);

    init_agent(f, "a1", "a.example", NULL);
    for (gsize i = 0; i < G_N_ELEMENTS(steps); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v =
            set_policy(f, "a1", steps[i].allow, steps[i].deny, steps[i].remove, FALSE, &error);
        g_autofree char *p = hostd_test_egress_text(f->hostd, "a1");

        if (steps[i].expect == NULL) {
            /* "@anthropic,x" is no preset name: vmctl splits at commas before it is sent */
            assert_null(v);
            assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
            continue;
        }
        if (v == NULL)
            fail_msg("step %zu: %s", i, error->message);
        if (!g_str_equal(p, steps[i].expect))
            fail_msg("step %zu: got '%s', want '%s'", i, p, steps[i].expect);
    }
    /* What is stored is the rules, never the name. */
    {
        g_autofree char *text = vm_test_read_file(ini);

        assert_null(strstr(text, "@"));
        assert_non_null(strstr(text, "api.openai.com"));
    }

    /* Unknown: refused, named, the old policy kept on disk and live. */
    static const char *const unknown[][3] = {
        {"@nosuch", NULL, NULL},
        {"ok.example", "@nosuch", NULL},
        {NULL, NULL, "@nosuch"},
        /* none of its rules is there */
        {NULL, NULL, "@github"},
    };
    g_autofree char *before = vm_test_read_file(ini);
    for (gsize i = 0; i < G_N_ELEMENTS(unknown); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v =
            set_policy(f, "a1", unknown[i][0], unknown[i][1], unknown[i][2], FALSE, &error);
        g_autofree char *after = vm_test_read_file(ini);
        g_autofree char *p = hostd_test_egress_text(f->hostd, "a1");

        assert_null(v);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
        assert_non_null(strstr(error->message, i < 3 ? "@nosuch" : "@github"));
        assert_string_equal(after, before);
        assert_string_equal(p, "a.example api.openai.com b.example:8443|");
    }

    /* At init, as a template or `new --egress` gives them; "none" among them closes what came
     * before, as in a change. */
    init_agent(f, "a2", "@debian a.example", "@github");
    g_autofree char *p2 = hostd_test_egress_text(f->hostd, "a2");
    assert_string_equal(p2, "deb.debian.org security.debian.org ftp.debian.org *.deb.debian.org "
                            "a.example|github.com api.github.com codeload.github.com "
                            "objects.githubusercontent.com raw.githubusercontent.com "
                            "*.githubusercontent.com");
    init_agent(f, "a3", "@debian none @npm", NULL);
    g_autofree char *p3 = hostd_test_egress_text(f->hostd, "a3");
    assert_string_equal(p3, "registry.npmjs.org|");
    {
        g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, "a4");
        const char *const allow[] = {"ok.example", "@nosuch", NULL};
        g_autoptr(GError) error = NULL;
        g_autofree char *ini4 = hostd_test_agent_file(f->hostd, "a4", HOSTD_AGENT_EGRESS_POLICY);

        assert_false(hostd_egress_presets_check(f->ctx->config->egress_presets, allow, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
        g_clear_error(&error);
        assert_false(hostd_egress_agent_init(f->ctx, r, allow, NULL, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
        assert_non_null(strstr(error->message, "@nosuch"));
        assert_false(g_file_test(ini4, G_FILE_TEST_EXISTS));
    }

    /* A user's preset of a built-in's name is the one used. */
    {
        g_autofree char *dir = g_build_filename(f->hostd->dir, "presets.d", NULL);
        g_autofree char *file = g_build_filename(dir, "pypi.conf", NULL);
        g_autoptr(GError) error = NULL;
        HostdEgressPresets *presets;

        assert_int_equal(g_mkdir_with_parents(dir, 0755), 0);
        assert_true(g_file_set_contents(file, "[preset]\nrules=pypi.mirror.example\n", -1, NULL));
        presets = hostd_egress_presets_load(dir, &error);
        assert_non_null(presets);
        hostd_egress_presets_free(f->ctx->config->egress_presets);
        f->ctx->config->egress_presets = presets;
        set_ok(f, "a3", "@pypi", NULL, NULL, FALSE);
        g_autofree char *p = hostd_test_egress_text(f->hostd, "a3");
        assert_string_equal(p, "registry.npmjs.org pypi.mirror.example|");
    }
}

/* The presets request lists the built-in ones. */
static void
test_presets_listed(void **state)
{
    Fixture *f = *state;
    g_autoptr(GVariant) list = g_variant_ref_sink(hostd_egress_presets(f->ctx));
    g_autoptr(GString) names = g_string_new(NULL);

    for (gsize i = 0; i < g_variant_n_children(list); i++) {
        g_autoptr(GVariant) one = g_variant_get_child_value(list, i);
        const char *name = NULL;

        assert_true(g_variant_lookup(one, "name", "&s", &name));
        g_string_append_printf(names, "%s%s", i > 0 ? " " : "", name);
    }
    assert_string_equal(names->str, "@anthropic @debian @github @npm @openai @pypi");
}

/* A change with one bad rule is refused as a whole: the old policy stays, on disk and live. */
static void
test_set_refused(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *allow, *deny, *remove;
        VmErrorCode code;
    } bad[] = {
        {"ok.example 127.1", NULL, NULL, VM_ERROR_INVALID_ARGUMENT},
        {"ok.example", "10.0.0.1/8", NULL, VM_ERROR_INVALID_ARGUMENT},
        {"any ok.example", NULL, NULL, VM_ERROR_INVALID_ARGUMENT},
        {"http://x.example", NULL, NULL, VM_ERROR_INVALID_ARGUMENT},
        {NULL, NULL, "not.there", VM_ERROR_NOT_FOUND},
        {"ok.example", NULL, "also.not.there", VM_ERROR_NOT_FOUND},
    };
    g_autofree char *ini = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_POLICY);
    g_autofree char *before = NULL;

    init_agent(f, "a1", "pypi.org", NULL);
    before = vm_test_read_file(ini);
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v =
            set_policy(f, "a1", bad[i].allow, bad[i].deny, bad[i].remove, FALSE, &error);
        g_autofree char *after = vm_test_read_file(ini);
        g_autofree char *p = hostd_test_egress_text(f->hostd, "a1");

        assert_null(v);
        if (!g_error_matches(error, VM_ERROR, bad[i].code))
            fail_msg("case %zu: %s", i, error != NULL ? error->message : "no error");
        assert_string_equal(after, before);
        assert_string_equal(p, "pypi.org|");
    }
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = set_policy(f, "nosuch", "x.example", NULL, NULL, FALSE, &error);

        assert_null(v);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
    }
    {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = set_policy(f, "../x", "x.example", NULL, NULL, FALSE, &error);

        assert_null(v);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    }
}

/* What a restarted hostd finds: the stored policy, served again. */
static void
test_policy_survives_restart(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *p = NULL;
    int status = 0;
    int fd;

    init_agent(f, "a1", NULL, NULL);
    g_autofree char *expect =
        g_strdup_printf("sink.test:%1$u 127.0.0.1/32:%1$u|x.example", f->sink->port);

    set_ok(f, "a1", "sink.test:PORT 127.0.0.1/32:PORT", "x.example", NULL, FALSE);
    /* what hostd's exit does; the next hostd starts with a fresh state */
    hostd_egress_stop_all(f->ctx);
    hostd_egress_set_resolver(f->ctx, vm_test_egress_resolve, NULL);
    r = hostd_agent_load(f->ctx, "a1", &error);
    assert_non_null(r);
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
    p = hostd_test_egress_text(f->hostd, "a1");
    assert_string_equal(p, expect);
    fd = tunnel(f, "a1", "sink.test", &status);
    assert_int_equal(status, 200);
    close(fd);
    /* start on a running, healthy proxy changes nothing */
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
}

static void
test_copy_policy(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) dst = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *p = NULL;

    init_agent(f, "src", "pypi.org 198.18.0.0/15", "evil.pypi.org");
    dst = hostd_test_agent_record_new(f->hostd, "dst");
    assert_true(hostd_egress_copy_policy(f->ctx, "src", "dst", &error));
    assert_true(hostd_egress_agent_start(f->ctx, dst, &error));
    p = hostd_test_egress_text(f->hostd, "dst");
    assert_string_equal(p, "pypi.org 198.18.0.0/15|evil.pypi.org");
    /* the two go their own ways afterwards */
    set_ok(f, "src", NULL, NULL, "pypi.org", FALSE);
    g_free(p);
    p = hostd_test_egress_text(f->hostd, "dst");
    assert_string_equal(p, "pypi.org 198.18.0.0/15|evil.pypi.org");

    assert_false(hostd_egress_copy_policy(f->ctx, "nosuch", "dst", &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
}

/* ---- the way out ---------------------------------------------------------------------------- */

static void
test_tunnel_allowed_and_logged(void **state)
{
    Fixture *f = *state;
    g_auto(GStrv) lines = NULL;
    g_autoptr(GString) echo = NULL;
    g_autoptr(GBytes) hello = vm_test_tls_client_hello("sink.test");
    gsize hello_len = g_bytes_get_size(hello);
    const char *hello_text = g_bytes_get_data(hello, NULL);
    g_autofree char *bytes_up = g_strdup_printf("\"bytes_up\":%zu", hello_len);
    g_autofree char *bytes_down = g_strdup_printf("\"bytes_down\":%zu", hello_len);
    gboolean eof;
    int status = 0;
    int fd;

    /* the name opens the host, the CIDR rule its loopback address */
    init_agent(f, "a1", "sink.test:PORT 127.0.0.1/32:PORT", NULL);
    fd = tunnel(f, "a1", "sink.test", &status);
    assert_int_equal(status, 200);
    /* a tunnel to a name carries TLS for that name: the ClientHello goes through unchanged */
    assert_int_equal(send(fd, hello_text, hello_len, MSG_NOSIGNAL), hello_len);
    echo = vm_test_read_until(fd, NULL, 1000, &eof);
    assert_int_equal(echo->len, hello_len);
    assert_memory_equal(echo->str, hello_text, hello_len);
    close(fd);
    lines = log_wait_lines(f, "a1", 1);
    assert_non_null(strstr(lines[0], "\"event\":\"allowed\""));
    assert_non_null(strstr(lines[0], "\"host\":\"sink.test\""));
    assert_non_null(strstr(lines[0], bytes_up));
    assert_non_null(strstr(lines[0], bytes_down));
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), hello_len);

    /* vmctl stats' figures: the worker's counts, asked with its stats. */
    guint connections = 99;
    guint64 up = 0, down = 0;
    assert_true(hostd_egress_traffic(f->ctx, "a1", &connections, &up, &down));
    assert_int_equal(connections, 0);
    assert_int_equal(up, hello_len);
    assert_int_equal(down, hello_len);
    assert_false(hostd_egress_traffic(f->ctx, "nosuch", &connections, &up, &down));
    assert_int_equal(up, 0);
}

/* Names resolve to the sink's loopback address: a name rule never opens it, so only a CIDR
 * rule does, and every refusal is logged and reaches nothing. */
static void
test_refused_reach_nothing(void **state)
{
    Fixture *f = *state;
    static const char *const hosts[] = {
        "evil.test", "127.0.0.1",          "2130706433", "0177.0.0.1", "127.1",
        "[::1]",     "[::ffff:127.0.0.1]", "mixed.test", "sink.test.", "unknown.example",
    };
    /* sink.test is allowed by name but resolves to loopback, which a name never opens;
     * unknown.example is allowed but does not resolve */
    static const int codes[] = {403, 403, 403, 403, 403, 403, 403, 403, 403, 502};
    g_auto(GStrv) lines = NULL;

    init_agent(f, "a1", "sink.test:PORT mixed.test:PORT unknown.example:PORT", NULL);
    for (gsize i = 0; i < G_N_ELEMENTS(hosts); i++) {
        int status = 0;
        int fd = tunnel(f, "a1", hosts[i], &status);

        if (fd >= 0)
            close(fd);
        if (status != codes[i])
            fail_msg("%s: status %d", hosts[i], status);
    }
    lines = log_wait_lines(f, "a1", G_N_ELEMENTS(hosts));
    for (gsize i = 0; i < G_N_ELEMENTS(hosts); i++)
        assert_non_null(strstr(lines[i], "\"event\":\"denied\""));
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

static void
test_host_mismatch(void **state)
{
    Fixture *f = *state;
    g_autofree char *request = NULL;
    g_autoptr(GString) response = NULL;
    gboolean eof;
    int helper_status = -1;
    int fd;

    init_agent(f, "a1", "127.0.0.1/32", NULL);
    fd = guest_connect(f, "a1", &helper_status);
    assert_int_equal(helper_status, 0);
    request = g_strdup_printf("CONNECT 127.0.0.1:%u HTTP/1.1\r\nHost: other.example:%u\r\n\r\n",
                              f->sink->port, f->sink->port);
    vm_test_send_text(fd, request);
    response = vm_test_read_until(fd, NULL, IO_TIMEOUT_MS, &eof);
    assert_true(g_str_has_prefix(response->str, "HTTP/1.1 400"));
    assert_true(eof);
    close(fd);
    g_strfreev(log_wait_lines(f, "a1", 1));
    assert_int_equal(g_atomic_int_get(&f->sink->bytes), 0);
}

static void
test_policy_change_closes_tunnel(void **state)
{
    Fixture *f = *state;
    g_autoptr(GString) rest = NULL;
    g_auto(GStrv) lines = NULL;
    gint64 start;
    gboolean eof;
    int status = 0;
    int fd;

    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 0);
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 1);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "nosuch"), 0);
    start = g_get_monotonic_time();
    set_ok(f, "a1", NULL, NULL, "127.0.0.1/32:PORT", FALSE);
    rest = vm_test_read_until(fd, NULL, 3000, &eof);
    assert_true(eof);
    assert_true(g_get_monotonic_time() - start < G_USEC_PER_SEC);
    close(fd);
    lines = log_wait_lines(f, "a1", 1);
    assert_non_null(strstr(lines[0], "\"reason\":\"policy-changed\""));
}

/* No proxy, no way out: the helper fails at once and the guest's connection closes. */
static void
test_fails_closed(void **state)
{
    Fixture *f = *state;
    g_autofree char *sock = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_SOCKET);
    g_autoptr(GString) rest = NULL;
    gboolean eof;
    int helper_status = 0;
    int fd;

    init_agent(f, "a1", "any", NULL);
    hostd_egress_agent_stop(f->ctx, "a1");
    assert_false(g_file_test(sock, G_FILE_TEST_EXISTS));
    fd = guest_connect(f, "a1", &helper_status);
    assert_int_not_equal(helper_status, 0);
    rest = vm_test_read_until(fd, NULL, 1000, &eof);
    assert_true(eof);
    assert_int_equal(rest->len, 0);
    close(fd);
}

/* A proxy whose socket went away is started again by the next start. */
static void
test_restarts_lost_socket(void **state)
{
    Fixture *f = *state;
    g_autofree char *sock = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_SOCKET);
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GError) error = NULL;
    int status = 0;
    int fd;

    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    assert_int_equal(g_unlink(sock), 0);
    r = hostd_agent_load(f->ctx, "a1", &error);
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    close(fd);
}

/* ---- the guest forward's command ------------------------------------------------------------ */

static void
test_command(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, "a1");
    g_autofree char *root = g_build_filename(f->hostd->dir, "lv", NULL);
    g_autofree char *etc = g_build_filename(root, "etc", NULL);
    g_autofree char *conf = g_build_filename(etc, "qemu.conf", NULL);
    g_autofree char *uri = g_strconcat("qemu:///embed?root=", root, NULL);
    g_autofree char *saved = f->ctx->lv->uri;
    g_autofree char *command = NULL;
    g_autofree char *sock = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_SOCKET);
    g_autofree char *quoted = g_shell_quote(sock);
    g_auto(GStrv) argv = NULL;

    /* Not the embedded driver: hostd cannot know QEMU may spawn the helper. */
    f->ctx->lv->qemu_may_spawn = hostd_libvirt_qemu_may_spawn(f->ctx->lv->uri);
    command = hostd_egress_command(f->ctx, r);
    assert_null(command);

    f->ctx->lv->uri = uri;
    assert_int_equal(g_mkdir_with_parents(etc, 0755), 0);
    vm_test_write_file(conf, "stdio_handler = \"file\"\n");
    f->ctx->lv->qemu_may_spawn = hostd_libvirt_qemu_may_spawn(f->ctx->lv->uri);
    command = hostd_egress_command(f->ctx, r);
    assert_null(command);
    vm_test_write_file(conf, "# seccomp_sandbox = 0\nseccomp_sandbox = 1\n");
    f->ctx->lv->qemu_may_spawn = hostd_libvirt_qemu_may_spawn(f->ctx->lv->uri);
    command = hostd_egress_command(f->ctx, r);
    assert_null(command);
    vm_test_write_file(conf, "stdio_handler = \"file\"\n seccomp_sandbox = 0 \n");
    /* The root is read as a URI parameter: others may follow it. */
    g_autofree char *uri_more = g_strconcat(uri, "&x=1", NULL);
    assert_false(hostd_libvirt_qemu_may_spawn("qemu:///system"));
    assert_true(hostd_libvirt_qemu_may_spawn(uri_more));
    f->ctx->lv->qemu_may_spawn = hostd_libvirt_qemu_may_spawn(f->ctx->lv->uri);
    command = hostd_egress_command(f->ctx, r);
    f->ctx->lv->uri = g_steal_pointer(&saved);
    assert_non_null(command);
    assert_true(g_str_has_suffix(command, quoted));
    assert_true(g_shell_parse_argv(command, NULL, &argv, NULL));
    assert_int_equal(g_strv_length(argv), 2);
    assert_true(g_str_has_suffix(argv[0], "/vm-egress-connect"));
    assert_string_equal(argv[1], sock);
}

/* ---- through hostd's request handling ------------------------------------------------------- */

static int
serve(Fixture *f, VmOp op, GVariant *fields, GThread **ret_thread)
{
    g_autoptr(VmMessage) request = vm_message_new(op, fields, NULL);
    int fd;

    assert_non_null(request);
    fd = hostd_test_serve(f->hostd, ret_thread);
    assert_true(vm_message_write_fd(fd, request, NULL));
    return fd;
}

static VmMessage *
read_message(int fd)
{
    g_autoptr(GError) error = NULL;
    gboolean eof = FALSE;
    VmMessage *m = vm_message_read_fd(fd, &eof, &error);

    if (m == NULL)
        fail_msg("no reply: %s", eof ? "EOF" : error->message);
    return m;
}

static void
test_requests(void **state)
{
    Fixture *f = *state;
    GThread *thread = NULL;
    g_autoptr(VmMessage) reply = NULL;
    g_autoptr(GVariant) egress = NULL;
    g_autofree const char **allow = NULL;
    gboolean wired = TRUE;
    const char *proxy = NULL;
    int fd;

    init_agent(f, "a1", NULL, NULL);
    fd = serve(f, VM_OP_EGRESS_SET,
               g_variant_new_parsed("{'name': <'a1'>, 'allow': <['pypi.org', '198.18.0.0/15']>}"),
               &thread);
    reply = read_message(fd);
    g_thread_join(thread);
    close(fd);
    assert_int_equal(reply->op, VM_OP_RESULT);
    egress = vm_message_lookup(reply, "egress");
    assert_non_null(egress);
    assert_true(g_variant_lookup(egress, "allow", "^a&s", &allow));
    assert_int_equal(g_strv_length((char **)allow), 2);
    assert_true(g_variant_lookup(egress, "proxy", "&s", &proxy));
    assert_string_equal(proxy, "http://10.0.2.100:3128");
    assert_true(g_variant_lookup(egress, "wired", "b", &wired));
    assert_false(wired); /* no domain */

    g_clear_pointer(&reply, vm_message_free);
    fd = serve(f, VM_OP_EGRESS_SET,
               g_variant_new_parsed("{'name': <'a1'>, 'deny': <['0x7f000001']>}"), &thread);
    reply = read_message(fd);
    g_thread_join(thread);
    close(fd);
    assert_int_equal(reply->op, VM_OP_ERROR);
    assert_int_equal(vm_message_get_uint(reply, "code", 0), VM_ERROR_INVALID_ARGUMENT);
}

/* The log request: the last N records, then new ones while following, then EXIT once the
 * agent is gone. */
static void
test_log_request(void **state)
{
    Fixture *f = *state;
    g_autofree char *record = hostd_test_agent_file(f->hostd, "a1", "agent.ini");
    g_autoptr(GString) got = g_string_new(NULL);
    GThread *thread = NULL;
    int status = 0;
    int fd, tun;

    init_agent(f, "a1", NULL, NULL);
    for (int i = 0; i < 3; i++) {
        g_autofree char *host = g_strdup_printf("h%d.test", i);

        tun = tunnel(f, "a1", host, &status);
        assert_int_equal(status, 403);
    }
    g_strfreev(log_wait_lines(f, "a1", 3));

    fd = serve(f, VM_OP_EGRESS_LOG, g_variant_new_parsed("{'name': <'a1'>, 'lines': <@u 2>}"),
               &thread);
    for (;;) {
        g_autoptr(VmMessage) m = read_message(fd);
        const guint8 *data;
        gsize len = 0;

        if (m->op == VM_OP_EXIT)
            break;
        assert_int_equal(m->op, VM_OP_STDOUT);
        data = vm_message_get_data(m, "data", &len);
        g_string_append_len(got, (const char *)data, (gssize)len);
    }
    g_thread_join(thread);
    close(fd);
    assert_null(strstr(got->str, "h0.test"));
    assert_non_null(strstr(got->str, "h1.test"));
    assert_non_null(strstr(got->str, "h2.test"));

    g_string_truncate(got, 0);
    fd =
        serve(f, VM_OP_EGRESS_LOG,
              g_variant_new_parsed("{'name': <'a1'>, 'lines': <@u 0>, 'follow': <true>}"), &thread);
    g_usleep(300 * 1000);
    tun = tunnel(f, "a1", "h3.test", &status);
    assert_int_equal(status, 403);
    while (strstr(got->str, "h3.test") == NULL) {
        g_autoptr(VmMessage) m = read_message(fd);
        const guint8 *data;
        gsize len = 0;

        assert_int_equal(m->op, VM_OP_STDOUT);
        data = vm_message_get_data(m, "data", &len);
        g_string_append_len(got, (const char *)data, (gssize)len);
    }
    assert_null(strstr(got->str, "h2.test"));
    /* the agent goes: the stream ends */
    assert_int_equal(g_unlink(record), 0);
    {
        g_autoptr(VmMessage) m = read_message(fd);

        assert_int_equal(m->op, VM_OP_EXIT);
    }
    g_thread_join(thread);
    close(fd);
    (void)tun;
}

/* Past its size limit the log moves to egress.log.1 and starts afresh; the request still sees
 * the records of both. */
static void
test_log_rotation(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, "a1");
    g_autofree char *path = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_LOG);
    g_autofree char *old = hostd_test_agent_file(f->hostd, "a1", "egress.log.1");
    g_autoptr(GString) filler = g_string_new(NULL);
    g_autoptr(GString) got = g_string_new(NULL);
    g_autoptr(GError) error = NULL;
    g_autofree char *current = NULL;
    GThread *thread = NULL;
    int status = 0;
    int fd;

    while (filler->len < HOSTD_EGRESS_LOG_MAX)
        g_string_append(filler, "{\"time\":\"2023-11-14T22:13:20Z\",\"event\":\"denied\"}\n");
    g_string_append(filler, "{\"host\":\"last-old-record\"}\n");
    vm_test_write_file(path, filler->str);
    assert_true(hostd_egress_agent_init(f->ctx, r, NULL, NULL, &error));
    fd = tunnel(f, "a1", "new.test", &status);
    assert_int_equal(status, 403);
    g_strfreev(log_wait_lines(f, "a1", 1));
    current = vm_test_read_file(path);
    assert_non_null(strstr(current, "new.test"));
    assert_null(strstr(current, "last-old-record"));
    assert_true(g_file_test(old, G_FILE_TEST_EXISTS));

    fd = serve(f, VM_OP_EGRESS_LOG, g_variant_new_parsed("{'name': <'a1'>, 'lines': <@u 2>}"),
               &thread);
    for (;;) {
        g_autoptr(VmMessage) m = read_message(fd);
        const guint8 *data;
        gsize len = 0;

        if (m->op == VM_OP_EXIT)
            break;
        data = vm_message_get_data(m, "data", &len);
        g_string_append_len(got, (const char *)data, (gssize)len);
    }
    g_thread_join(thread);
    close(fd);
    assert_non_null(strstr(got->str, "last-old-record"));
    assert_non_null(strstr(got->str, "new.test"));
}

/* ---- the credential broker's side ----------------------------------------------------------- */

static char *
ca_file(Fixture *f, const char *name, const char *suffix)
{
    g_autofree char *file = g_strconcat(name, suffix, NULL);

    return g_build_filename(f->ctx->config->state_dir, "egress-ca", file, NULL);
}

/* Whether the file at @path holds exactly @text. */
static gboolean
file_is(const char *path, const char *text)
{
    g_autofree char *contents = vm_test_read_file(path);

    return g_str_equal(contents, text);
}

/* Whether the file at @path contains @needle. */
static gboolean
file_has(const char *path, const char *needle)
{
    g_autofree char *contents = vm_test_read_file(path);

    return strstr(contents, needle) != NULL;
}

/* Whether `vmctl egress` would show @name's rules as @text. */
static gboolean
egress_text_is(Fixture *f, const char *name, const char *text)
{
    g_autofree char *got = hostd_test_egress_text(f->hostd, name);

    return g_str_equal(got, text);
}

static guint
file_mode(const char *path)
{
    struct stat st;

    if (stat(path, &st) < 0)
        fail_msg("stat %s: %s", path, g_strerror(errno));
    return st.st_mode & 07777;
}

/* The agent's CA: made with its proxy, kept in $STATE/egress-ca (0700, key 0600) and nowhere
 * under the agent's directory, the same on every later call and proxy restart (the guest trusts
 * it), a usable CA (it mints), its own per agent, and gone with the agent. */
static void
test_ca_stored(void **state)
{
    Fixture *f = *state;
    g_autofree char *dir = g_build_filename(f->ctx->config->state_dir, "egress-ca", NULL);
    g_autofree char *crt = ca_file(f, "a1", ".crt");
    g_autofree char *key = ca_file(f, "a1", ".key");
    g_autofree char *agent_dir = hostd_test_agent_file(f->hostd, "a1", "");
    g_autoptr(GError) error = NULL;
    g_autofree char *first = NULL;
    g_autofree char *second = NULL;
    g_autofree char *other = NULL;
    g_autofree char *key_pem = NULL;
    g_autofree char *leaf = NULL;
    g_autofree char *leaf_key = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GDir) listing = NULL;

    init_agent(f, "a1", NULL, NULL);
    /* The proxy got it at its start, before anyone asked for the certificate. */
    assert_true(g_file_test(crt, G_FILE_TEST_IS_REGULAR));
    assert_true(g_file_test(key, G_FILE_TEST_IS_REGULAR));
    assert_int_equal(file_mode(dir), 0700);
    assert_int_equal(file_mode(key), 0600);
    first = hostd_egress_ca_certificate(f->ctx, "a1", &error);
    assert_non_null(first);
    assert_non_null(strstr(first, "-----BEGIN CERTIFICATE-----"));
    assert_null(strstr(first, "PRIVATE KEY"));
    assert_true(file_is(crt, first));
    key_pem = vm_test_read_file(key);
    assert_non_null(strstr(key_pem, "PRIVATE KEY"));
    assert_true(vm_egress_ca_mint(first, key_pem, "api.example.com", &leaf, &leaf_key, &error));

    /* Nothing of it under the agent's own directory. */
    listing = g_dir_open(agent_dir, 0, NULL);
    assert_non_null(listing);
    for (const char *entry; (entry = g_dir_read_name(listing)) != NULL;) {
        g_autofree char *path = g_build_filename(agent_dir, entry, NULL);
        g_autofree char *text = NULL;

        if (g_file_get_contents(path, &text, NULL, NULL) && text != NULL)
            assert_null(strstr(text, "PRIVATE KEY"));
    }

    /* Stable across calls and proxy restarts. */
    hostd_egress_agent_stop(f->ctx, "a1");
    r = hostd_agent_load(f->ctx, "a1", &error);
    assert_non_null(r);
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
    second = hostd_egress_ca_certificate(f->ctx, "a1", &error);
    assert_string_equal(first, second);

    /* Another agent (a fork has a name of its own) gets another CA. */
    init_agent(f, "a2", NULL, NULL);
    other = hostd_egress_ca_certificate(f->ctx, "a2", &error);
    assert_non_null(other);
    assert_string_not_equal(first, other);

    /* rm: the proxy and the CA go. */
    hostd_egress_component.agent_removed(f->ctx, "a1");
    assert_false(g_file_test(crt, G_FILE_TEST_EXISTS));
    assert_false(g_file_test(key, G_FILE_TEST_EXISTS));
    g_autofree char *a2_key = ca_file(f, "a2", ".key");
    assert_true(g_file_test(a2_key, G_FILE_TEST_EXISTS));

    /* Unknown agents have none, and get none made. */
    g_clear_error(&error);
    assert_null(hostd_egress_ca_certificate(f->ctx, "nosuch", &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
    g_autofree char *nosuch_crt = ca_file(f, "nosuch", ".crt");
    assert_false(g_file_test(nosuch_crt, G_FILE_TEST_EXISTS));
}

/* A key left behind without its certificate (a crash between the writes) makes a new pair. */
static void
test_ca_incomplete_made_anew(void **state)
{
    Fixture *f = *state;
    g_autofree char *crt = ca_file(f, "a1", ".crt");
    g_autoptr(GError) error = NULL;
    g_autofree char *first = NULL;
    g_autofree char *second = NULL;

    init_agent(f, "a1", NULL, NULL);
    first = hostd_egress_ca_certificate(f->ctx, "a1", &error);
    assert_int_equal(g_unlink(crt), 0);
    second = hostd_egress_ca_certificate(f->ctx, "a1", &error);
    assert_non_null(second);
    assert_string_not_equal(first, second);
    assert_true(file_is(crt, second));
}

static VmEgressCredentials *
one_credential(const char *placeholder)
{
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    const char *const hosts[] = {"api.example.com", NULL};
    g_autoptr(GError) error = NULL;

    if (!vm_egress_credentials_add(creds, "example", placeholder, "real-value", hosts, NULL,
                                   "Bearer {}", &error))
        fail_msg("credentials: %s", error->message);
    return g_steal_pointer(&creds);
}

/* Credentials are kept for the proxy's restarts (stop and start, a lost socket) and replaced or
 * dropped as a whole. */
static void
test_credentials_kept(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmEgressCredentials) creds = one_credential("vmph_one");
    g_autoptr(VmEgressCredentials) got = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GError) error = NULL;

    init_agent(f, "a1", NULL, NULL);
    assert_null(hostd_egress_dup_credentials(f->ctx, "a1"));
    assert_true(hostd_egress_set_credentials(f->ctx, "a1", creds, &error));
    got = hostd_egress_dup_credentials(f->ctx, "a1");
    assert_ptr_equal(got, creds);
    g_clear_pointer(&got, vm_egress_credentials_unref);

    hostd_egress_agent_stop(f->ctx, "a1");
    r = hostd_agent_load(f->ctx, "a1", &error);
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
    got = hostd_egress_dup_credentials(f->ctx, "a1");
    assert_ptr_equal(got, creds);
    g_clear_pointer(&got, vm_egress_credentials_unref);

    assert_true(hostd_egress_set_credentials(f->ctx, "a1", NULL, &error));
    assert_null(hostd_egress_dup_credentials(f->ctx, "a1"));

    assert_false(hostd_egress_set_credentials(f->ctx, "nosuch", creds, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
    assert_null(hostd_egress_dup_credentials(f->ctx, "nosuch"));

    /* rm forgets them: an agent made again under the name starts with none. */
    assert_true(hostd_egress_set_credentials(f->ctx, "a1", creds, &error));
    hostd_egress_component.agent_removed(f->ctx, "a1");
    assert_null(hostd_egress_dup_credentials(f->ctx, "a1"));
}

/* A grant's hosts are open on 443 for as long as it holds, on top of the user's rules and
 * across proxy restarts, while egress.ini and `vmctl egress` keep the user's own rules; fewer
 * hosts close the others again. A user's deny still wins. */
static void
test_grant_hosts(void **state)
{
    Fixture *f = *state;
    g_autofree char *ini = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_POLICY);
    g_autofree char *ini_before = NULL;
    g_autofree char *text_before = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GError) error = NULL;
    const char *const hosts[] = {"api.example.com", "*.example.org", "blocked.example", NULL};
    const char *const fewer[] = {"*.example.org", NULL};

    init_agent(f, "a1", "pypi.org", "blocked.example");
    ini_before = vm_test_read_file(ini);
    text_before = hostd_test_egress_text(f->hostd, "a1");
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));

    assert_true(hostd_egress_set_grant_hosts(f->ctx, "a1", hosts, &error));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 80));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "eu.example.org", 443));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "example.org", 443));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "blocked.example", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "pypi.org", 443));
    assert_true(file_is(ini, ini_before));
    assert_true(egress_text_is(f, "a1", text_before));

    /* A change of the user's rules keeps the grants' hosts open, and stores only the user's. */
    set_ok(f, "a1", "files.example", NULL, NULL, FALSE);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "files.example", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    assert_false(file_has(ini, "api.example.com"));
    assert_true(egress_text_is(f, "a1", "pypi.org files.example|blocked.example"));

    /* Across a restart of the proxy. */
    hostd_egress_agent_stop(f->ctx, "a1");
    r = hostd_agent_load(f->ctx, "a1", &error);
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));

    /* Revoke: the host closes again, the user's rules stay. */
    assert_true(hostd_egress_set_grant_hosts(f->ctx, "a1", fewer, &error));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "eu.example.org", 443));
    assert_true(hostd_egress_set_grant_hosts(f->ctx, "a1", NULL, &error));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "eu.example.org", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "files.example", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "pypi.org", 443));

    assert_false(hostd_egress_set_grant_hosts(f->ctx, "nosuch", hosts, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
}

/* An agent whose policy is "none" gets exactly its grants' hosts; a fork copies the user's
 * rules, never its source's grants' hosts. */
static void
test_grant_hosts_none_and_fork(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    const char *const hosts[] = {"api.example.com", NULL};

    init_agent(f, "a1", NULL, NULL);
    init_agent(f, "a2", NULL, NULL);
    assert_true(hostd_egress_set_grant_hosts(f->ctx, "a1", hosts, &error));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "other.example.com", 443));
    assert_true(egress_text_is(f, "a1", "none|"));
    assert_true(hostd_egress_copy_policy(f->ctx, "a1", "a2", &error));
    assert_false(hostd_test_egress_allows(f->ctx, "a2", "api.example.com", 443));
}

/* ---- the worker process --------------------------------------------------------------------- */

/* Bytes through an open tunnel come back from the echo sink. */
static void
assert_echo(int fd)
{
    g_autoptr(GString) back = NULL;
    gboolean eof;

    vm_test_send_text(fd, "ping");
    back = vm_test_read_until(fd, "ping", IO_TIMEOUT_MS, &eof);
    assert_string_equal(back->str, "ping");
}

/* As root: a1's worker @pid runs as the egress id hostd_confine_worker_user() gives a1 (its
 * four uids and gids each one id), an id of its own; a2's worker is started to compare. */
static void
assert_worker_ids(Fixture *f, GPid pid)
{
    const struct passwd *egress_user = getpwnam("nobody");
    const guint qemu_id = f->ctx->config->agent_id_min + 9; /* a stand-in's */
    g_autoptr(GError) error = NULL;
    g_autofree char *mem = NULL;
    guint uid = 0, gid = 0, want_uid = 0, want_gid = 0, ssh_uid = 0, ssh_gid = 0;
    guint uid2 = 0, gid2 = 0;
    gboolean change = FALSE;
    GPid pid2, qemu;

    vm_test_proc_ids(pid, &uid, &gid);
    /* The agents here have no id of their own (0): slots of their own all the same. */
    assert_true(hostd_confine_worker_user(f->ctx, "a1", 0, HOSTD_WORKER_EGRESS, &change, &want_uid,
                                          &want_gid, &error));
    assert_true(change);
    assert_int_equal(uid, want_uid);
    assert_int_equal(gid, want_gid);
    assert_true(uid >= f->ctx->config->worker_id_min && uid <= f->ctx->config->worker_id_max);
    assert_true(hostd_confine_worker_user(f->ctx, "a1", 0, HOSTD_WORKER_SSH, &change, &ssh_uid,
                                          &ssh_gid, &error));
    assert_int_not_equal(uid, ssh_uid);
    assert_int_not_equal(gid, ssh_gid);
    assert_int_not_equal(uid, 0);
    assert_int_not_equal(gid, 0);
    if (egress_user != NULL)
        assert_int_not_equal(uid, egress_user->pw_uid);

    init_agent(f, "a2", "127.0.0.1/32:PORT", NULL);
    pid2 = hostd_egress_worker_pid(f->ctx, "a2");
    assert_true(pid2 > 0);
    vm_test_proc_ids(pid2, &uid2, &gid2);
    assert_int_not_equal(uid2, uid);
    assert_int_not_equal(gid2, gid);
    assert_int_not_equal(uid2, ssh_uid);
    /* One taken-over worker can no longer stop another agent's. */
    assert_int_equal(vm_test_try_as(uid, gid, NULL, 0, pid2), EPERM);

    qemu = vm_test_sleeper_start(qemu_id);
    mem = g_strdup_printf("/proc/%d/mem", (int)qemu);
    assert_int_equal(vm_test_try_as(qemu_id, qemu_id, NULL, 0, qemu), 0);
    assert_int_equal(vm_test_try_as(uid, gid, mem, O_RDWR, 0), EACCES);
    assert_int_equal(vm_test_try_as(uid, gid, NULL, 0, qemu), EPERM);
    assert_int_equal(vm_test_try_as(qemu_id, qemu_id, NULL, 0, pid), EPERM);
    vm_test_sleeper_stop(qemu);
}

/* The proxy runs in a worker process of its own, confined before a guest byte arrives: no
 * capabilities, no_new_privs, seccomp filter mode, and when hostd is root an id of its own (not
 * root's, not egress-user's, not its agent's SSH worker's nor another agent's egress worker's),
 * which can neither signal the other agent's worker nor open the memory of, signal or open a
 * file of a process of its QEMU's id (dumpable, as QEMU is). */
static void
test_worker_confined(void **state)
{
    Fixture *f = *state;
    g_autofree char *uid = NULL;
    g_autofree char *gid = NULL;
    g_autofree char *nnp = NULL;
    g_autofree char *seccomp = NULL;
    g_autofree char *cap_eff = NULL;
    g_autofree char *cap_prm = NULL;
    g_autofree char *cap_bnd = NULL;
    int status = 0;
    int fd;
    GPid pid;

    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    pid = hostd_egress_worker_pid(f->ctx, "a1");
    assert_true(pid > 0);
    assert_int_not_equal(pid, getpid());
    uid = vm_test_proc_status(pid, "Uid");
    gid = vm_test_proc_status(pid, "Gid");
    nnp = vm_test_proc_status(pid, "NoNewPrivs");
    seccomp = vm_test_proc_status(pid, "Seccomp");
    cap_eff = vm_test_proc_status(pid, "CapEff");
    cap_prm = vm_test_proc_status(pid, "CapPrm");
    cap_bnd = vm_test_proc_status(pid, "CapBnd");
    if (geteuid() == 0)
        assert_worker_ids(f, pid);
    assert_string_equal(nnp, "1");
    assert_string_equal(seccomp, "2");
    assert_string_equal(cap_eff, "0000000000000000");
    assert_string_equal(cap_prm, "0000000000000000");
    if (geteuid() == 0)
        assert_string_equal(cap_bnd, "0000000000000000");
    /* no core file, no tracer of its own uid; what it prints through hostd's pipe */
    vm_test_assert_undumpable(pid);
    vm_test_assert_output_piped(pid);

    /* and it still serves: an allowed tunnel relays, a denied host is refused */
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_echo(fd);
    close(fd);
    assert_int_equal(tunnel(f, "a1", "127.0.0.2", &status), -1);
    assert_int_equal(status, 403);
}

/* Without hostd's resolver the worker resolves names itself, as the egress user under its
 * seccomp filter (the C library's resolver reads /etc/hosts here: localhost is loopback, which
 * only the CIDR rules open). */
static void
test_worker_resolves_itself(void **state)
{
    Fixture *f = *state;
    int status = 0;
    int fd;

    hostd_egress_set_resolver(f->ctx, NULL, NULL);
    init_agent(f, "a1", "localhost:PORT 127.0.0.1/32:PORT [::1]:PORT", NULL);
    fd = tunnel(f, "a1", "localhost", &status);
    assert_int_equal(status, 200);
    close(fd);
    assert_int_equal(tunnel(f, "a1", "unknown.invalid", &status), -1);
    assert_int_equal(status, 403);
}

/* egress-worker = off keeps the proxy inside hostd: no worker, the same service. */
static void
test_worker_off(void **state)
{
    Fixture *f = *state;
    int status = 0;
    int fd;

    f->ctx->config->egress_in_process = TRUE;
    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a1"), 0);
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_echo(fd);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 1);
    close(fd);
}

/* A root hostd with worker-ids = off whose egress-user does not exist starts no proxy rather than
 * one as root. */
static void
test_worker_unknown_user(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, "a1");
    g_autoptr(GError) error = NULL;
    const char *const allow[] = {"any", NULL};

    if (geteuid() != 0)
        skip();
    f->ctx->config->worker_id_min = 0;
    f->ctx->config->worker_id_max = 0;
    g_free(f->ctx->config->egress_user);
    f->ctx->config->egress_user = g_strdup("no-such-egress-user");
    assert_false(hostd_egress_agent_init(f->ctx, r, allow, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_non_null(strstr(error->message, "no-such-egress-user"));
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a1"), 0);
}

/* A root hostd whose worker id for an agent names a user of the host (made after hostd checked
 * worker-ids at start) starts no proxy rather than one as that user. */
static void
test_worker_id_named(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f->hostd, "a1");
    g_autoptr(GError) error = NULL;
    const char *const allow[] = {"any", NULL};
    const struct passwd *nobody = getpwnam("nobody");

    if (geteuid() != 0 || nobody == NULL || nobody->pw_uid < 1)
        skip();
    /* One slot: the first agent's egress worker gets the second id, nobody's. */
    f->ctx->config->worker_id_min = nobody->pw_uid - 1;
    f->ctx->config->worker_id_max = nobody->pw_uid + 1;
    assert_false(hostd_egress_agent_init(f->ctx, r, allow, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    g_autofree char *id = g_strdup_printf("as %u, a user", (guint)nobody->pw_uid);
    if (strstr(error->message, id) == NULL)
        fail_msg("%s", error->message);
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a1"), 0);
}

/* Waits up to @ms for @name's worker to run again with another pid than @old. */
static GPid
wait_new_worker(Fixture *f, const char *name, GPid old, guint ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    while (g_get_monotonic_time() < deadline) {
        GPid pid = hostd_egress_worker_pid(f->ctx, name);

        if (pid > 0 && pid != old)
            return pid;
        g_usleep(10 * 1000);
    }
    return 0;
}

/* A killed worker takes its agent's connections with it and no other's; hostd starts another at
 * once that serves the next request with the same policy. */
static void
test_worker_killed_restarts(void **state)
{
    Fixture *f = *state;
    g_autoptr(GString) rest = NULL;
    gboolean eof;
    int status = 0;
    int fd1, fd2;
    GPid pid1, pid2, again;
    gint64 start;

    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    init_agent(f, "a2", "127.0.0.1/32:PORT", NULL);
    pid1 = hostd_egress_worker_pid(f->ctx, "a1");
    pid2 = hostd_egress_worker_pid(f->ctx, "a2");
    assert_true(pid1 > 0 && pid2 > 0 && pid1 != pid2);
    fd1 = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    fd2 = tunnel(f, "a2", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 1);

    start = g_get_monotonic_time();
    assert_int_equal(kill(pid1, SIGKILL), 0);
    rest = vm_test_read_until(fd1, NULL, 3000, &eof);
    assert_true(eof);
    close(fd1);
    again = wait_new_worker(f, "a1", pid1, 2000);
    assert_true(again > 0);
    assert_true(g_get_monotonic_time() - start < 2 * G_USEC_PER_SEC);

    /* the other agent's worker and its tunnel are untouched */
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a2"), pid2);
    assert_echo(fd2);
    close(fd2);

    /* the new worker serves with the old policy */
    fd1 = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_echo(fd1);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 1);
    close(fd1);
    assert_int_equal(tunnel(f, "a1", "127.0.0.2", &status), -1);
    assert_int_equal(status, 403);
}

/* A stopped worker (SIGSTOP: alive and silent, as another agent's taken-over worker could leave
 * it) is found out within its deadline by the watcher's question, killed and replaced: nothing
 * waits on it long meanwhile (a policy change is sent, not waited for; a count of its connections
 * gives up after half a second), a policy changed meanwhile is the new worker's, a guest's
 * connection made meanwhile is served by the new worker, and the other agent's worker is untouched.
 */
static void
test_worker_stopped_restarts(void **state)
{
    Fixture *f = *state;
    g_autofree char *proc = NULL;
    int status = 0;
    int fd;
    GPid pid1, pid2, again;
    gint64 start;

    /* Asked every 300 ms, answers owed within 1.5 s. */
    hostd_egress_set_worker_deadlines(f->ctx, 1500, 300);
    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    init_agent(f, "a2", "127.0.0.1/32:PORT", NULL);
    pid1 = hostd_egress_worker_pid(f->ctx, "a1");
    pid2 = hostd_egress_worker_pid(f->ctx, "a2");
    assert_true(pid1 > 0 && pid2 > 0);
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    close(fd);

    /* Questions asked and answered: the worker that answers stays. */
    g_usleep(G_USEC_PER_SEC);
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a1"), pid1);

    assert_int_equal(kill(pid1, SIGSTOP), 0);
    start = g_get_monotonic_time();
    /* Its answer counts the worker's connections: half a second at most. */
    set_ok(f, "a1", NULL, NULL, "127.0.0.1/32:PORT", FALSE);
    assert_true(g_get_monotonic_time() - start < 3 * G_USEC_PER_SEC / 2);
    start = g_get_monotonic_time();
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 0);
    assert_true(g_get_monotonic_time() - start < G_USEC_PER_SEC);
    /* Made while the worker is stopped: it waits in the socket's backlog for the next one. */
    assert_int_equal(tunnel(f, "a1", "127.0.0.1", &status), -1);
    assert_int_equal(status, 403);
    again = wait_new_worker(f, "a1", pid1, 5000);
    assert_true(again > 0);
    assert_true(g_get_monotonic_time() - start < 5 * G_USEC_PER_SEC);
    proc = g_strdup_printf("/proc/%d", (int)pid1);
    assert_false(g_file_test(proc, G_FILE_TEST_EXISTS));
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a2"), pid2);

    set_ok(f, "a1", "127.0.0.1/32:PORT", NULL, NULL, FALSE);
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_echo(fd);
    assert_int_equal(hostd_egress_open_connections(f->ctx, "a1"), 1);
    close(fd);
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a1"), again);
}

/* ---- connections out: hostd makes them ------------------------------------------------------ */

/* The worker's TCP sockets are connections hostd made: at least one, to the sink, established. */
static void
assert_worker_tcp_by_hostd(Fixture *f, GPid pid)
{
    vm_test_assert_tcp_made_by_caller(pid, (guint)f->sink->port, FALSE);
}

/* A copy of the worker's end of its connections' channel, as code running in it holds it
 * (pidfd_getfd(): needs root here); -1 when the test cannot take it. */
static int
worker_connect_channel(GPid pid)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int fd;

    if (pidfd < 0)
        return -1;
    fd = (int)syscall(SYS_pidfd_getfd, pidfd, VM_EGRESS_WORKER_CONNECT_FD, 0);
    close(pidfd);
    return fd;
}

/* Asks hostd for a connection on @channel as the worker does: the socket, or the negative
 * errno hostd answered. */
static int
forged_ask(int channel, int family, const char *address, guint16 port)
{
    VmEgressConnectAsk ask = {.family = (guint8)family, .port = port};
    struct pollfd pfd = {.fd = channel, .events = POLLIN};
    char code = 0;
    int rc;

    assert_int_equal(inet_pton(family, address, ask.bytes), 1);
    assert_int_equal(send(channel, &ask, sizeof(ask), MSG_NOSIGNAL), sizeof(ask));
    assert_int_equal(poll(&pfd, 1, IO_TIMEOUT_MS), 1);
    rc = vm_fd_receive(channel, &code);
    if (rc == -ENOMSG)
        return -(int)(guint8)code;
    assert_true(rc >= 0);
    return rc;
}

/* The worker reaches its destinations only through connections hostd made after its own check
 * of the address: an allowed tunnel works and its upstream socket is hostd's; a connection the
 * worker asks for itself (as a taken-over worker would) to a 127.0.0.1 service its policy does
 * not open is refused by hostd, and that service sees nothing. */
static void
test_worker_connects_through_hostd(void **state)
{
    Fixture *f = *state;
    int status = 0;
    int fd, channel, listener, got;
    guint16 port = 0;
    GPid pid;

    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    pid = hostd_egress_worker_pid(f->ctx, "a1");
    assert_true(pid > 0);
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_echo(fd);
    assert_worker_tcp_by_hostd(f, pid);
    close(fd);

    channel = worker_connect_channel(pid);
    if (channel < 0) {
        assert_true(geteuid() != 0);
        print_message("# not root: the worker's channel cannot be taken\n");
        return;
    }
    listener = vm_test_listen_loopback(&port);
    assert_int_equal(forged_ask(channel, AF_INET, "127.0.0.1", port), -EACCES);
    assert_int_equal(forged_ask(channel, AF_INET6, "::ffff:127.0.0.1", port), -EACCES);
    assert_int_equal(forged_ask(channel, AF_INET6, "::1", port), -EACCES);
    assert_int_equal(forged_ask(channel, AF_INET, "0.0.0.0", port), -EACCES);
    /* the policy's own destination, yes: the channel works, it is the check that refuses */
    got = forged_ask(channel, AF_INET, "127.0.0.1", f->sink->port);
    assert_true(got >= 0);
    close(got);
    /* a malformed ask is answered too, and the channel stays in step */
    {
        VmEgressConnectAsk bad = {.family = 99, .port = port};
        struct pollfd pfd = {.fd = channel, .events = POLLIN};
        char code = 0;

        assert_int_equal(send(channel, &bad, sizeof(bad), MSG_NOSIGNAL), sizeof(bad));
        assert_int_equal(poll(&pfd, 1, IO_TIMEOUT_MS), 1);
        assert_int_equal(vm_fd_receive(channel, &code), -ENOMSG);
        assert_int_equal(code, EINVAL);
    }
    {
        struct pollfd pfd = {.fd = listener, .events = POLLIN};

        assert_int_equal(poll(&pfd, 1, 200), 0);
        close(listener);
    }

    /* What a connection through hostd costs: asks answered per second, against the socket()
     * and connect() the worker made itself before. */
    {
        const guint n = 500;
        gint64 start = g_get_monotonic_time();
        double ask_us, direct_us;

        for (guint i = 0; i < n; i++)
            close(forged_ask(channel, AF_INET, "127.0.0.1", f->sink->port));
        ask_us = (double)(g_get_monotonic_time() - start) / n;
        start = g_get_monotonic_time();
        for (guint i = 0; i < n; i++) {
            struct sockaddr_in in = {.sin_family = AF_INET,
                                     .sin_port = htons(f->sink->port),
                                     .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);

            assert_true(s >= 0);
            assert_true(connect(s, (struct sockaddr *)&in, sizeof(in)) == 0 ||
                        errno == EINPROGRESS);
            close(s);
        }
        direct_us = (double)(g_get_monotonic_time() - start) / n;
        print_message("# a connection begun by hostd: %.1f us; by socket()+connect(): %.1f us\n",
                      ask_us, direct_us);
    }
    close(channel);
    /* and the worker still serves */
    fd = tunnel(f, "a1", "127.0.0.1", &status);
    assert_int_equal(status, 200);
    assert_echo(fd);
    close(fd);
}

/* N tunnels one after the other through @name's proxy; the time each took, in us. */
static double
tunnels_us(Fixture *f, const char *name, guint n)
{
    gint64 start = g_get_monotonic_time();
    int status = 0;

    for (guint i = 0; i < n; i++) {
        int fd = tunnel(f, name, "127.0.0.1", &status);

        assert_int_equal(status, 200);
        assert_echo(fd);
        close(fd);
    }
    return (double)(g_get_monotonic_time() - start) / n;
}

/* Tunnels one after the other work through the worker (its connections made by hostd) as
 * through the proxy in hostd (egress-worker = off, connecting itself); what each costs is
 * printed. */
static void
test_tunnels_timed(void **state)
{
    Fixture *f = *state;
    double worker_us, in_process_us;

    init_agent(f, "a1", "127.0.0.1/32:PORT", NULL);
    f->ctx->config->egress_in_process = TRUE;
    init_agent(f, "a2", "127.0.0.1/32:PORT", NULL);
    assert_true(hostd_egress_worker_pid(f->ctx, "a1") > 0);
    assert_int_equal(hostd_egress_worker_pid(f->ctx, "a2"), 0);
    worker_us = tunnels_us(f, "a1", 100);
    in_process_us = tunnels_us(f, "a2", 100);
    print_message("# 100 tunnels: %.0f us each through the worker, %.0f us in hostd\n", worker_us,
                  in_process_us);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_init_from_template, setup, teardown),
        cmocka_unit_test_setup_teardown(test_presets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_presets_listed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_bad_template, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_edits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_policy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tunnel_allowed_and_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_reach_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy_change_closes_tunnel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fails_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarts_lost_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command, setup, teardown),
        cmocka_unit_test_setup_teardown(test_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_rotation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ca_stored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ca_incomplete_made_anew, setup, teardown),
        cmocka_unit_test_setup_teardown(test_credentials_kept, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grant_hosts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grant_hosts_none_and_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_confined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_killed_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_stopped_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_resolves_itself, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_unknown_user, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_id_named, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_connects_through_hostd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tunnels_timed, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
