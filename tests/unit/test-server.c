/* hostd's request handling without VMs: real frames through a socketpair into
 * hostd_server_serve_fd(), over libvirt's test driver (a fresh instance per test) and a
 * temporary state dir, and start-up reconciliation of half-made or damaged agents. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "hostd-agent.h"
#include "hostd-reconcile.h"
#include "hostd-server.h"
#include "hostd-server-private.h"
#include "vm-config.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-stream.h"
#include "vm-template.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "test-sink.h"

#define TEST_UUID_PREFIX "6c0b7a1e-52f4-4d0e-9d1b-"

typedef HostdTestFixture Fixture;
#define teardown hostd_test_teardown

/* ---- captured log ---------------------------------------------------------------------------
 * hostd logs one line per failed request; the tests keep those lines off the TAP output and
 * check them. */

static GMutex log_lock;
static GPtrArray *log_lines;

static GLogWriterOutput
capture_log(GLogLevelFlags level, const GLogField *fields, gsize n_fields, gpointer user_data)
{
    for (gsize i = 0; i < n_fields; i++) {
        if (g_str_equal(fields[i].key, "MESSAGE")) {
            g_mutex_lock(&log_lock);
            g_ptr_array_add(log_lines, g_strdup(fields[i].value));
            g_mutex_unlock(&log_lock);
        }
    }
    /* Warnings and worse still go through the default writer (and are fatal in tests). */
    if (level & (G_LOG_LEVEL_ERROR | G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING))
        return g_log_writer_default(level, fields, n_fields, user_data);
    return G_LOG_WRITER_HANDLED;
}

static void
assert_logged_once(const char *needle)
{
    guint found = 0;

    g_mutex_lock(&log_lock);
    for (guint i = 0; i < log_lines->len; i++) {
        if (strstr(log_lines->pdata[i], needle) != NULL)
            found++;
    }
    guint total = log_lines->len;
    g_mutex_unlock(&log_lock);
    if (found != 1 || total != 1)
        fail_msg("expected one log line with '%s', got %u of %u lines", needle, found, total);
}

static void
assert_nothing_logged(void)
{
    g_mutex_lock(&log_lock);
    guint total = log_lines->len;
    g_mutex_unlock(&log_lock);
    if (total != 0)
        fail_msg("unexpected log line: %s", (char *)log_lines->pdata[0]);
}

/* ---- the test driver's gaps ------------------------------------------------------------------
 * The QEMU driver accepts every undefine flag hostd passes; the test driver refuses the ones for
 * checkpoints and NVRAM ("unsupported flags"), which it has none of anyway. Strip them so that
 * rm and rollback run as they do against QEMU. */

int
virDomainUndefineFlags(virDomainPtr domain, unsigned int flags)
{
    static int (*real)(virDomainPtr, unsigned int);

    if (real == NULL)
        real = (int (*)(virDomainPtr, unsigned int))dlsym(RTLD_NEXT, "virDomainUndefineFlags");
    assert_non_null(real);
    return real(domain,
                flags & ~(VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA | VIR_DOMAIN_UNDEFINE_NVRAM));
}

/* ---- fixture ------------------------------------------------------------------------------- */

/* No image is ready: assert_nothing_created() finds the images dir as empty as `new` must leave
 * it. */
static int
setup_flags(void **state, HostdTestFixtureFlags flags)
{
    *state = hostd_test_fixture_new_full(flags);
    g_mutex_lock(&log_lock);
    g_ptr_array_set_size(log_lines, 0);
    g_mutex_unlock(&log_lock);
    return 0;
}

static int
setup(void **state)
{
    return setup_flags(state, HOSTD_TEST_NO_IMAGE);
}

/* debian-12's image ready: for agents that boot (start checks the disk's chain down to it). */
static int
setup_image(void **state)
{
    return setup_flags(state, 0);
}

/* The template tests need the YAML loader; skip them, saying why, while it cannot load the
 * shipped template. */
static void
require_template_loader(const Fixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(f->templates_dir, "debian-12.yaml", NULL);
    VmTemplate *t = vm_template_load_file(path, &error);

    if (t == NULL) {
        print_message("# SKIP: the template loader cannot load debian-12.yaml: %s\n",
                      error->message);
        skip();
    }
    vm_template_free(t);
}

/* ---- talking to serve_fd ------------------------------------------------------------------- */

/* Reads frames up to the RESULT or ERROR that ends a conversation, then checks that hostd
 * closed the connection and its thread ended. */
static GPtrArray *
read_replies(int fd, GThread *thread)
{
    GPtrArray *replies = g_ptr_array_new_with_free_func((GDestroyNotify)vm_message_free);

    for (;;) {
        g_autoptr(GError) error = NULL;
        gboolean eof = FALSE;
        VmMessage *m = vm_message_read_fd(fd, &eof, &error);
        if (m == NULL) {
            if (!eof)
                fail_msg("reading a reply: %s", error->message);
            break;
        }
        g_ptr_array_add(replies, m);
        if (m->op == VM_OP_RESULT || m->op == VM_OP_ERROR) {
            /* Nothing follows the end. A socket closed with unread client bytes in it reads
             * as a reset rather than EOF; either way the conversation is over. */
            char byte;
            gssize n = recv(fd, &byte, 1, 0);
            if (n != 0 && !(n < 0 && errno == ECONNRESET))
                fail_msg("hostd did not close the connection after %s", vm_op_name(m->op));
            break;
        }
    }
    g_thread_join(thread);
    close(fd);
    return replies;
}

/* @text as a GVariant text-format string literal. */
static char *
quote(const char *text)
{
    g_autoptr(GVariant) v = g_variant_ref_sink(g_variant_new_string(text));

    return g_variant_print(v, FALSE);
}

/* Sends one message (@fields_text is GVariant text of an a{sv}, NULL for none) and returns
 * every message hostd answered with. */
static GPtrArray *
converse(Fixture *f, VmOp op, const char *fields_text)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) m = hostd_test_request(op, fields_text);
    GThread *thread = NULL;
    int fd = hostd_test_serve(f, &thread);

    if (!vm_message_write_fd(fd, m, &error))
        fail_msg("cannot send: %s", error->message);
    return read_replies(fd, thread);
}

/* Sends raw bytes, then closes the sending side when @half_close, and returns the replies. */
static GPtrArray *
converse_raw(Fixture *f, const void *bytes, gsize len, gboolean half_close)
{
    GThread *thread = NULL;
    int fd = hostd_test_serve(f, &thread);

    assert_int_equal(send(fd, bytes, len, MSG_NOSIGNAL), (gssize)len);
    if (half_close)
        assert_int_equal(shutdown(fd, SHUT_WR), 0);
    return read_replies(fd, thread);
}

/* The conversation ended with exactly one ERROR of @code (after any PROGRESS). */
static void
assert_error_reply(GPtrArray *replies, VmErrorCode code, const char *needle)
{
    if (replies->len == 0)
        fail_msg("no reply, expected error %d", code);
    for (guint i = 0; i + 1 < replies->len; i++) {
        const VmMessage *m = replies->pdata[i];
        if (m->op != VM_OP_PROGRESS)
            fail_msg("unexpected %s before the end", vm_op_name(m->op));
    }
    const VmMessage *last = replies->pdata[replies->len - 1];
    if (last->op != VM_OP_ERROR)
        fail_msg("expected an error %d, got %s", code, vm_op_name(last->op));
    const char *message = vm_message_get_string(last, "message", "");
    guint32 got = vm_message_get_uint(last, "code", 0);
    if (got != (guint32)code)
        fail_msg("expected error %d, got %u: %s", code, got, message);
    if (needle != NULL && strstr(message, needle) == NULL)
        fail_msg("error '%s' does not mention '%s'", message, needle);
}

/* The conversation ended with one RESULT (after any PROGRESS); returns it. */
static const VmMessage *
assert_result_reply(GPtrArray *replies)
{
    if (replies->len == 0)
        fail_msg("no reply, expected a result");
    const VmMessage *last = replies->pdata[replies->len - 1];
    if (last->op == VM_OP_ERROR)
        fail_msg("expected a result, got error %u: %s", vm_message_get_uint(last, "code", 0),
                 vm_message_get_string(last, "message", ""));
    if (last->op != VM_OP_RESULT)
        fail_msg("expected a result, got %s", vm_op_name(last->op));
    for (guint i = 0; i + 1 < replies->len; i++)
        assert_int_equal(((const VmMessage *)replies->pdata[i])->op, VM_OP_PROGRESS);
    return last;
}

/* Nothing was made: no agent directory, no image, no domain. */
static void
assert_nothing_created(Fixture *f)
{
    assert_int_equal(vm_test_count_entries(f->agents_dir), 0);
    assert_int_equal(vm_test_count_entries(f->images_dir), 0);
    assert_int_equal(virConnectNumOfDefinedDomains(f->ctx->lv->conn), 0);
    assert_int_equal(virConnectNumOfDomains(f->ctx->lv->conn), 0);
}

/* ---- agents made by hand ------------------------------------------------------------------- */

static char *
agent_dir(Fixture *f, const char *name)
{
    return g_build_filename(f->agents_dir, name, NULL);
}

static char *
domain_xml(const char *name, const char *uuid)
{
    g_autofree char *path = vm_test_data_path("hostd", "domain.xml", NULL);
    g_autofree char *text = vm_test_read_file(path);
    g_auto(GStrv) a = g_strsplit(text, "@NAME@", -1);
    g_autofree char *named = g_strjoinv(name, a);
    g_auto(GStrv) b = g_strsplit(named, "@UUID@", -1);
    return g_strjoinv(uuid, b);
}

static virDomainPtr
define_domain(Fixture *f, const char *name, const char *uuid, gboolean start)
{
    g_autofree char *xml = domain_xml(name, uuid);
    virDomainPtr dom = virDomainDefineXML(f->ctx->lv->conn, xml);

    if (dom == NULL)
        fail_msg("cannot define %s: %s", name, virGetLastErrorMessage());
    if (start && virDomainCreate(dom) < 0)
        fail_msg("cannot start %s: %s", name, virGetLastErrorMessage());
    return dom;
}

static gboolean
domain_exists(Fixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, name, &error);

    assert_null(error);
    return dom != NULL;
}

typedef enum {
    MAKE_RECORD = 1 << 0,
    MAKE_DOMAIN = 1 << 1,  /* defined in libvirt */
    MAKE_RUNNING = 1 << 2, /* and started */
    MAKE_XML = 1 << 3,     /* domain.xml saved in the agent's directory */
} MakeFlags;

/* Makes an agent as `new` leaves it, without keys: a directory with agent.ini in @phase, its disk
 * on the base image where the fixture has one, and optionally the domain and its saved XML.
 * Returns the record. */
static HostdAgentRecord *
make_agent(Fixture *f, const char *name, const char *phase, MakeFlags flags, guint port)
{
    g_autoptr(GError) error = NULL;
    HostdAgentRecord *r = g_new0(HostdAgentRecord, 1);

    r->dir = agent_dir(f, name);
    r->name = g_strdup(name);
    r->uuid = g_strdup_printf(TEST_UUID_PREFIX "%012u", port);
    r->template_name = g_strdup("debian-12");
    r->phase = g_strdup(phase);
    r->cpus = 1;
    r->memory_mib = 128;
    r->disk_gib = 8;
    r->ssh_port = port;
    r->mac = g_strdup("52:54:00:00:00:01");
    r->user = g_strdup("agent");
    r->instance_id = g_strdup_printf("vmctl-%s", r->uuid);
    r->created = 1700000000;
    r->state_since = 1700000000;

    assert_int_equal(g_mkdir_with_parents(r->dir, 0711), 0);
    if (f->base_image != NULL && g_file_test(f->base_image, G_FILE_TEST_IS_REGULAR)) {
        g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
        hostd_test_image_write(disk, f->base_image);
    }
    if (flags & MAKE_RECORD && !hostd_agent_record_save(r, &error))
        fail_msg("cannot save the record: %s", error->message);
    if (flags & MAKE_XML) {
        g_autofree char *xml = domain_xml(name, r->uuid);
        g_autofree char *path = hostd_agent_record_path(r, "domain.xml");
        vm_test_write_file(path, xml);
    }
    if (flags & MAKE_DOMAIN) {
        g_autoptr(virDomain) dom = define_domain(f, name, r->uuid, flags & MAKE_RUNNING);
    }
    return r;
}

/* ---- requests ------------------------------------------------------------------------------ */

static void
test_ping(void **state)
{
    Fixture *f = *state;
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_PING, NULL);
    const VmMessage *m = assert_result_reply(replies);

    assert_int_equal(replies->len, 1);
    assert_string_equal(vm_message_get_string(m, "version", ""), VM_VERSION);
    assert_int_equal(vm_message_get_uint(m, "protocol", 0), VM_PROTOCOL_VERSION);
    assert_string_equal(vm_message_get_string(m, "virt_type", ""), "qemu");
    assert_string_equal(vm_message_get_string(m, "uri", ""), f->uri);
    assert_nothing_logged();
}

/* A client that half-closes after its request still gets the answer. */
static void
test_ping_half_closed(void **state)
{
    Fixture *f = *state;
    g_autoptr(VmMessage) m = hostd_test_request(VM_OP_PING, NULL);
    g_autoptr(GBytes) frame = vm_message_encode(m, NULL);
    gsize len = 0;
    const void *data = g_bytes_get_data(frame, &len);
    g_autoptr(GPtrArray) replies = converse_raw(f, data, len, TRUE);

    assert_result_reply(replies);
}

static void
test_agent_list_empty(void **state)
{
    Fixture *f = *state;
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_LIST, NULL);
    const VmMessage *m = assert_result_reply(replies);
    g_autoptr(GVariant) agents = vm_message_lookup(m, "agents");

    assert_non_null(agents);
    assert_true(g_variant_is_of_type(agents, G_VARIANT_TYPE("aa{sv}")));
    assert_int_equal(g_variant_n_children(agents), 0);
}

/* Every request about one agent, with the fields it needs besides the name. */
static const struct {
    VmOp op;
    const char *extra;
} agent_ops[] = {
    {VM_OP_AGENT_INFO, ""},
    {VM_OP_AGENT_RM, ", 'force': <true>"},
    {VM_OP_AGENT_START, ", 'wait': <false>"},
    {VM_OP_AGENT_STOP, ", 'force': <true>"},
    {VM_OP_AGENT_SSH_CONFIG, ""},
    {VM_OP_EXEC, ", 'argv': <['true']>"},
};

static void
test_unknown_agent(void **state)
{
    Fixture *f = *state;

    for (gsize i = 0; i < G_N_ELEMENTS(agent_ops); i++) {
        g_autofree char *fields = g_strdup_printf("{'name': <'ghost'>%s}", agent_ops[i].extra);
        g_autoptr(GPtrArray) replies = converse(f, agent_ops[i].op, fields);

        assert_error_reply(replies, VM_ERROR_NOT_FOUND, "'ghost'");
    }
    assert_nothing_created(f);
}

/* The fleet's view without [cluster]: one clear error, not-running, for both requests. */
static void
test_fleet_without_cluster(void **state)
{
    Fixture *f = *state;
    const VmOp ops[] = {VM_OP_FLEET_HOSTS, VM_OP_FLEET_LIST};

    for (gsize i = 0; i < G_N_ELEMENTS(ops); i++) {
        g_autoptr(GPtrArray) replies = converse(f, ops[i], NULL);
        assert_error_reply(replies, VM_ERROR_NOT_RUNNING,
                           "this host is in no fleet: hostd's configuration has no [cluster]");
    }
    g_autoptr(GPtrArray) drain =
        converse(f, VM_OP_FLEET_DRAIN, "{'host': <'h2'>, 'drained': <true>}");
    assert_error_reply(drain, VM_ERROR_NOT_RUNNING, "this host is in no fleet");
    /* --on names a host of a fleet this host is not in: refused, nothing made. */
    g_autoptr(GPtrArray) on =
        converse(f, VM_OP_AGENT_NEW, "{'name': <'a1'>, 'on': <'h2'>, 'wait': <false>}");
    assert_error_reply(on, VM_ERROR_INVALID_ARGUMENT,
                       "cannot make the agent on host 'h2': this host is in no fleet");
    assert_nothing_created(f);
}

/* hostd logs each failed request once, naming the operation and the agent. */
static void
test_failure_logged(void **state)
{
    Fixture *f = *state;
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_INFO, "{'name': <'ghost'>}");

    assert_error_reply(replies, VM_ERROR_NOT_FOUND, NULL);
    assert_logged_once("agent-info ghost failed: ");
}

/* The log lines so far, one a line, and forgets them. */
static char *
take_log(void)
{
    g_mutex_lock(&log_lock);
    g_ptr_array_add(log_lines, NULL);
    char *text = g_strjoinv("\n", (char **)log_lines->pdata);
    g_ptr_array_set_size(log_lines, 0);
    g_mutex_unlock(&log_lock);
    return text;
}

/* Each request's log line names the caller's uid and pid (SO_PEERCRED; the socket pair's other end
 * is this process): always for a change and a failure, for a read only with --debug. A name that
 * holds a newline cannot start a forged line. */
static void
test_request_log(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "erin", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42326);
    g_autofree char *who = g_strdup_printf(" (uid %u) [pid %d]", (guint)getuid(), (int)getpid());

    g_autoptr(GPtrArray) info = converse(f, VM_OP_AGENT_INFO, "{'name': <'erin'>}");
    assert_result_reply(info);
    g_autoptr(GPtrArray) ping = converse(f, VM_OP_PING, NULL);
    assert_result_reply(ping);
    assert_nothing_logged();

    g_autoptr(GPtrArray) start =
        converse(f, VM_OP_AGENT_START, "{'name': <'erin'>, 'wait': <false>}");
    assert_result_reply(start);
    g_autofree char *started = take_log();
    g_autofree char *want_started = g_strconcat("agent-start erin ok", who, NULL);
    assert_string_equal(started, want_started);

    g_autoptr(GPtrArray) ghost = converse(f, VM_OP_AGENT_INFO, "{'name': <'ghost'>}");
    assert_error_reply(ghost, VM_ERROR_NOT_FOUND, NULL);
    g_autofree char *failed = take_log();
    assert_true(g_str_has_prefix(failed, "agent-info ghost failed: "));
    assert_true(g_str_has_suffix(failed, who));

    g_autoptr(GPtrArray) forged =
        converse(f, VM_OP_AGENT_INFO, "{'name': <'x\\n12:00:00 hostd: agent-rm y ok'>}");
    assert_error_reply(forged, VM_ERROR_INVALID_ARGUMENT, NULL);
    g_autofree char *one_line = take_log();
    assert_null(strchr(one_line, '\n'));
    assert_non_null(strstr(one_line, "x\\x0a12:00:00"));
    assert_true(g_str_has_suffix(one_line, who));

    static const char garbage[] = "not a message at all, just bytes\n";
    g_autoptr(GPtrArray) bad = converse_raw(f, garbage, sizeof(garbage) - 1, TRUE);
    assert_int_equal(((VmMessage *)bad->pdata[bad->len - 1])->op, VM_OP_ERROR);
    g_autofree char *bad_line = take_log();
    assert_true(g_str_has_prefix(bad_line, "bad request: "));
    assert_true(g_str_has_suffix(bad_line, who));

    /* --debug: reads too. */
    f->ctx->debug = TRUE;
    g_autoptr(GPtrArray) ping_debug = converse(f, VM_OP_PING, NULL);
    assert_result_reply(ping_debug);
    g_autoptr(GPtrArray) info_debug = converse(f, VM_OP_AGENT_INFO, "{'name': <'erin'>}");
    assert_result_reply(info_debug);
    g_autofree char *reads = take_log();
    g_autofree char *want_reads = g_strdup_printf("ping ok%s\nagent-info erin ok%s", who, who);
    assert_string_equal(reads, want_reads);
    f->ctx->debug = FALSE;
}

static const char *const bad_names[] = {
    "",
    "Alice",
    "../x",
    "a/b",
    "-x",
    "x-",
    "1abc",
    "a b",
    "a.b",
    "é",
    "a\\nb",
    "..",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", /* 64 */
};

static void
test_bad_names(void **state)
{
    Fixture *f = *state;

    for (gsize n = 0; n < G_N_ELEMENTS(bad_names); n++) {
        g_autofree char *quoted = quote(bad_names[n]);
        for (gsize i = 0; i < G_N_ELEMENTS(agent_ops); i++) {
            g_autofree char *fields =
                g_strdup_printf("{'name': <%s>%s}", quoted, agent_ops[i].extra);
            g_autoptr(GPtrArray) replies = converse(f, agent_ops[i].op, fields);

            assert_error_reply(replies, VM_ERROR_INVALID_ARGUMENT, NULL);
        }
        g_autofree char *fields = g_strdup_printf("{'name': <%s>, 'wait': <false>}", quoted);
        g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_NEW, fields);
        assert_error_reply(replies, VM_ERROR_INVALID_ARGUMENT, NULL);
    }
    assert_nothing_created(f);
    /* "../x" must not have escaped agents/ either. */
    g_autofree char *escaped = g_build_filename(f->ctx->state->dir, "x", NULL);
    assert_false(g_file_test(escaped, G_FILE_TEST_EXISTS));
}

static void
test_new_unknown_template(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *template_name;
        VmErrorCode code;
    } cases[] = {
        {"no-such", VM_ERROR_NOT_FOUND},
        {"ubuntu-24", VM_ERROR_NOT_FOUND},
        {"../templates/debian-12", VM_ERROR_INVALID_ARGUMENT},
        {"Debian-12", VM_ERROR_INVALID_ARGUMENT},
        {"", VM_ERROR_INVALID_ARGUMENT},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *quoted = quote(cases[i].template_name);
        g_autofree char *fields =
            g_strdup_printf("{'name': <'alice'>, 'template': <%s>, 'wait': <false>}", quoted);
        g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_NEW, fields);

        assert_error_reply(replies, cases[i].code,
                           cases[i].code == VM_ERROR_NOT_FOUND ? cases[i].template_name : NULL);
    }
    assert_nothing_created(f);
}

/* Requests beyond the host are refused before anything is made or any image is built. */
static void
test_new_no_resources(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *fields;
        const char *needle;
    } cases[] = {
        {"'cpus': <uint32 9999>", "--cpus"},
        {"'cpus': <uint32 4294967295>", "--cpus"},
        {"'memory_mib': <uint32 1>", "--memory"},
        {"'memory_mib': <uint32 127>", "--memory"},
        {"'memory_mib': <uint32 4294967295>", "--memory"},
        {"'disk_gib': <uint32 16385>", "--disk"},
    };

    require_template_loader(f);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *fields =
            g_strdup_printf("{'name': <'alice'>, %s, 'wait': <false>}", cases[i].fields);
        g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_NEW, fields);

        assert_error_reply(replies, VM_ERROR_NO_RESOURCES, cases[i].needle);
    }
    assert_nothing_created(f);
}

/* A name held by a directory or by a libvirt domain is taken; neither is touched. */
static void
test_new_exists(void **state)
{
    Fixture *f = *state;
    g_autofree char *dir = agent_dir(f, "taken");
    g_autofree char *file = g_build_filename(dir, "keep", NULL);

    assert_int_equal(g_mkdir(dir, 0700), 0);
    vm_test_write_file(file, "data");
    g_autoptr(virDomain) dom = define_domain(f, "held", TEST_UUID_PREFIX "000000000001", FALSE);

    static const char *const names[] = {"taken", "held"};
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        g_autofree char *fields =
            g_strdup_printf("{'name': <'%s'>, 'cpus': <uint32 9999>, 'wait': <false>}", names[i]);
        g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_NEW, fields);

        assert_error_reply(replies, VM_ERROR_EXISTS, names[i]);
    }
    assert_true(g_file_test(file, G_FILE_TEST_IS_REGULAR));
    assert_true(domain_exists(f, "held"));
    g_autofree char *held_dir = agent_dir(f, "held");
    assert_false(g_file_test(held_dir, G_FILE_TEST_EXISTS));
}

/* Only requests open a conversation. */
static void
test_not_a_request(void **state)
{
    Fixture *f = *state;
    static const struct {
        VmOp op;
        const char *fields;
    } cases[] = {
        {VM_OP_STDOUT, "{'data': <[byte 0x68, 0x69]>}"},
        {VM_OP_STDIN, "{'data': <[byte 0x68]>}"},
        {VM_OP_STDIN_EOF, NULL},
        {VM_OP_WINDOW_SIZE, "{'cols': <uint32 80>, 'rows': <uint32 24>}"},
        {VM_OP_RESULT, NULL},
        {VM_OP_EXIT, "{'status': <0>}"},
        {VM_OP_PROGRESS, "{'message': <'50%'>}"},
        {VM_OP_ERROR, "{'code': <uint32 1>, 'message': <'no'>}"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GPtrArray) replies = converse(f, cases[i].op, cases[i].fields);

        assert_error_reply(replies, VM_ERROR_PROTOCOL, "request");
        assert_int_equal(replies->len, 1);
    }
}

static void
test_bad_frames(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *bytes;
        gsize len;
        gboolean half_close;
    } cases[] = {
        /* a payload that is no message */
        {"\0\0\0\5hello", 9, FALSE},
        {"\0\0\0\0", 4, FALSE},
        {"\0\0\0\4\0\0\0\0", 8, FALSE},
        /* lengths over the limit, refused before reading on */
        {"\xff\xff\xff\xff", 4, FALSE},
        {"\0\x10\0\1", 4, FALSE},
        {"\x7f\0\0\0garbage", 11, FALSE},
        /* frames cut short by the client */
        {"\0\0\0\020abc", 7, TRUE},
        {"\0\0", 2, TRUE},
        {"G", 1, TRUE},
        /* text a confused client might send */
        {"GET / HTTP/1.1\r\n\r\n", 18, FALSE},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GPtrArray) replies =
            converse_raw(f, cases[i].bytes, cases[i].len, cases[i].half_close);

        if (replies->len != 1)
            fail_msg("case %zu: %u replies", i, replies->len);
        assert_error_reply(replies, VM_ERROR_PROTOCOL, NULL);
    }
}

/* A client that goes away at once, or before reading its answer, costs nothing. */
static void
test_client_gone(void **state)
{
    Fixture *f = *state;
    GThread *thread = NULL;

    int fd = hostd_test_serve(f, &thread);
    close(fd);
    g_thread_join(thread);
    assert_nothing_logged();

    /* The answer goes to a closed socket: no SIGPIPE may kill hostd. */
    static const struct {
        VmOp op;
        const char *fields;
    } requests[] = {{VM_OP_PING, NULL}, {VM_OP_AGENT_INFO, "{'name': <'ghost'>}"}};
    for (gsize i = 0; i < G_N_ELEMENTS(requests); i++) {
        g_autoptr(VmMessage) m = hostd_test_request(requests[i].op, requests[i].fields);
        fd = hostd_test_serve(f, &thread);
        assert_true(vm_message_write_fd(fd, m, NULL));
        close(fd);
        g_thread_join(thread);
    }

    /* hostd still answers afterwards. */
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_PING, NULL);
    assert_result_reply(replies);
}

/* The handler table covers every request of the protocol, and nothing else. */
static void
test_every_request_handled(void **state)
{
    for (guint op = 0; op < 256; op++) {
        const char *name = vm_op_name((VmOp)op);

        if (hostd_server_handles((VmOp)op) != vm_op_is_request((VmOp)op))
            fail_msg("op %u (%s): %s", op, name != NULL ? name : "unknown",
                     vm_op_is_request((VmOp)op) ? "a request without a handler"
                                                : "a handler for what is no request");
    }
}

static GVariant *
find_entry(GVariant *list, const char *name)
{
    for (gsize i = 0; i < g_variant_n_children(list); i++) {
        g_autoptr(GVariant) entry = g_variant_get_child_value(list, i);
        const char *entry_name = NULL;
        if (g_variant_lookup(entry, "name", "&s", &entry_name) && g_str_equal(entry_name, name))
            return g_steal_pointer(&entry);
    }
    return NULL;
}

static void
test_template_list(void **state)
{
    Fixture *f = *state;

    require_template_loader(f);
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_TEMPLATE_LIST, NULL);
    const VmMessage *m = assert_result_reply(replies);
    g_autoptr(GVariant) templates = vm_message_lookup(m, "templates");

    assert_non_null(templates);
    assert_true(g_variant_is_of_type(templates, G_VARIANT_TYPE("aa{sv}")));
    assert_int_equal(g_variant_n_children(templates), 1);
    g_autoptr(GVariant) t = find_entry(templates, "debian-12");
    assert_non_null(t);

    gboolean ready = TRUE;
    const char *source = NULL, *description = NULL;
    guint32 cpus = 0, memory = 0, disk = 0;
    assert_true(g_variant_lookup(t, "ready", "b", &ready));
    assert_false(ready);
    assert_true(g_variant_lookup(t, "source", "&s", &source));
    assert_string_equal(source, "mmdebstrap");
    assert_true(g_variant_lookup(t, "description", "&s", &description));
    assert_true(description[0] != '\0');
    assert_true(g_variant_lookup(t, "cpus", "u", &cpus));
    assert_true(g_variant_lookup(t, "memory_mib", "u", &memory));
    assert_true(g_variant_lookup(t, "disk_gib", "u", &disk));
    assert_int_equal(cpus, 2);
    assert_int_equal(memory, 1024);
    assert_int_equal(disk, 8);
    assert_int_equal(vm_test_count_entries(f->images_dir), 0);
}

/* A broken template is reported, not silently left out. */
static void
test_template_list_broken(void **state)
{
    Fixture *f = *state;
    g_autofree char *broken = g_build_filename(f->templates_dir, "broken.yaml", NULL);

    require_template_loader(f);
    vm_test_write_file(broken, "name: broken\nresources: [\n");
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_TEMPLATE_LIST, NULL);
    assert_error_reply(replies, VM_ERROR_TEMPLATE, "broken.yaml");
}

static GVariant *
agent_field(const VmMessage *m)
{
    GVariant *agent = vm_message_lookup(m, "agent");

    if (agent == NULL)
        fail_msg("the result has no 'agent'");
    assert_true(g_variant_is_of_type(agent, G_VARIANT_TYPE_VARDICT));
    return agent;
}

/* An agent hostd did not make itself (record and domain made here) is listed and described
 * from its record and its domain. */
static void
test_agent_info(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "alice", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42301);
    g_autoptr(HostdAgentRecord) half =
        make_agent(f, "bob", HOSTD_PHASE_CREATING, MAKE_RECORD, 42302);

    g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_INFO, "{'name': <'alice'>}");
    g_autoptr(GVariant) agent = agent_field(assert_result_reply(replies));
    const char *s = NULL;
    guint32 u = 0;
    gint64 x = 0;
    assert_true(g_variant_lookup(agent, "name", "&s", &s));
    assert_string_equal(s, "alice");
    assert_true(g_variant_lookup(agent, "state", "&s", &s));
    assert_string_equal(s, "stopped");
    assert_true(g_variant_lookup(agent, "template", "&s", &s));
    assert_string_equal(s, "debian-12");
    assert_true(g_variant_lookup(agent, "uuid", "&s", &s));
    assert_string_equal(s, r->uuid);
    assert_true(g_variant_lookup(agent, "user", "&s", &s));
    assert_string_equal(s, "agent");
    assert_true(g_variant_lookup(agent, "ssh_port", "u", &u));
    assert_int_equal(u, 42301);
    assert_true(g_variant_lookup(agent, "cpus", "u", &u));
    assert_int_equal(u, 1);
    assert_true(g_variant_lookup(agent, "memory_mib", "u", &u));
    assert_int_equal(u, 128);
    assert_true(g_variant_lookup(agent, "created", "x", &x));
    assert_int_equal(x, 1700000000);
    assert_false(g_variant_lookup(agent, "forked_from", "&s", &s));

    /* One still being created is not an agent yet. */
    g_autoptr(GPtrArray) half_replies = converse(f, VM_OP_AGENT_INFO, "{'name': <'bob'>}");
    assert_error_reply(half_replies, VM_ERROR_NOT_FOUND, "bob");

    g_autoptr(GPtrArray) list_replies = converse(f, VM_OP_AGENT_LIST, NULL);
    g_autoptr(GVariant) agents = vm_message_lookup(assert_result_reply(list_replies), "agents");
    assert_int_equal(g_variant_n_children(agents), 1);
    g_autoptr(GVariant) listed = find_entry(agents, "alice");
    assert_non_null(listed);

    g_autoptr(GPtrArray) ssh_replies = converse(f, VM_OP_AGENT_SSH_CONFIG, "{'name': <'alice'>}");
    const VmMessage *ssh = assert_result_reply(ssh_replies);
    const char *config = vm_message_get_string(ssh, "config", "");
    assert_non_null(strstr(config, "Host vmctl-alice\n"));
    assert_non_null(strstr(config, "  Port 42301\n"));
    assert_non_null(strstr(config, "  StrictHostKeyChecking yes\n"));
    assert_string_equal(vm_message_get_string(ssh, "host", ""), "vmctl-alice");
}

/* start, stop and rm on the test driver's domains, without waiting for SSH. */
static void
test_agent_lifecycle(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "carol", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42303);
    const char *s = NULL;
    gint64 since = 0;

    /* A stopped agent cannot run commands. */
    g_autoptr(GPtrArray) exec = converse(f, VM_OP_EXEC, "{'name': <'carol'>, 'argv': <['true']>}");
    assert_error_reply(exec, VM_ERROR_BAD_STATE, "carol");

    g_autoptr(GPtrArray) start =
        converse(f, VM_OP_AGENT_START, "{'name': <'carol'>, 'wait': <false>}");
    g_autoptr(GVariant) started = agent_field(assert_result_reply(start));
    assert_true(g_variant_lookup(started, "state", "&s", &s));
    assert_string_equal(s, "running");
    assert_true(g_variant_lookup(started, "state_since", "x", &since));
    assert_true(since > 1700000000);
    assert_string_equal(hostd_test_domain_state(f, "carol"), "running");

    /* Starting a running agent is success. */
    g_autoptr(GPtrArray) again =
        converse(f, VM_OP_AGENT_START, "{'name': <'carol'>, 'wait': <false>}");
    assert_result_reply(again);

    /* A running agent is not removed without force. */
    g_autoptr(GPtrArray) rm = converse(f, VM_OP_AGENT_RM, "{'name': <'carol'>}");
    assert_error_reply(rm, VM_ERROR_BAD_STATE, "carol");
    assert_true(g_file_test(r->dir, G_FILE_TEST_IS_DIR));
    assert_string_equal(hostd_test_domain_state(f, "carol"), "running");

    g_autoptr(GPtrArray) stop =
        converse(f, VM_OP_AGENT_STOP, "{'name': <'carol'>, 'timeout_s': <uint32 5>}");
    g_autoptr(GVariant) stopped = agent_field(assert_result_reply(stop));
    assert_true(g_variant_lookup(stopped, "state", "&s", &s));
    assert_string_equal(s, "stopped");
    assert_string_equal(hostd_test_domain_state(f, "carol"), "stopped");

    /* Stopping a stopped agent is success. */
    g_autoptr(GPtrArray) stop_again = converse(f, VM_OP_AGENT_STOP, "{'name': <'carol'>}");
    assert_result_reply(stop_again);

    g_autoptr(GPtrArray) rm_stopped = converse(f, VM_OP_AGENT_RM, "{'name': <'carol'>}");
    const VmMessage *done = assert_result_reply(rm_stopped);
    g_autoptr(GVariant) empty = vm_message_lookup(done, "name");
    assert_null(empty);
    assert_false(g_file_test(r->dir, G_FILE_TEST_EXISTS));
    assert_false(domain_exists(f, "carol"));

    g_autoptr(GPtrArray) gone = converse(f, VM_OP_AGENT_INFO, "{'name': <'carol'>}");
    assert_error_reply(gone, VM_ERROR_NOT_FOUND, "carol");
}

static void
test_agent_rm_force(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "dave", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN | MAKE_RUNNING, 42304);

    g_autoptr(GPtrArray) rm = converse(f, VM_OP_AGENT_RM, "{'name': <'dave'>, 'force': <true>}");
    assert_result_reply(rm);
    assert_false(g_file_test(r->dir, G_FILE_TEST_EXISTS));
    assert_false(domain_exists(f, "dave"));
}

/* ---- the event log --------------------------------------------------------------------------- */

static char *
events_text(Fixture *f)
{
    g_autofree char *path = g_build_filename(f->ctx->state->dir, HOSTD_EVENTS_LOG, NULL);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

/* The events logged so far, each a JSON object. */
static GPtrArray *
events_logged(Fixture *f)
{
    g_autofree char *text = events_text(f);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    GPtrArray *events = g_ptr_array_new_with_free_func((GDestroyNotify)json_object_unref);

    for (guint i = 0; lines[i] != NULL && lines[i][0] != '\0'; i++) {
        g_autoptr(JsonParser) parser = json_parser_new();

        if (!json_parser_load_from_data(parser, lines[i], -1, NULL) ||
            !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
            fail_msg("event %u is no JSON object: %s", i, lines[i]);
        g_ptr_array_add(events,
                        json_object_ref(json_node_get_object(json_parser_get_root(parser))));
    }
    return events;
}

static const char *
member(JsonObject *o, const char *key)
{
    return json_object_get_string_member_with_default(o, key, NULL);
}

/* The one event logged since the log held @before events: its JSON object. */
static JsonObject *
one_new_event(Fixture *f, guint before)
{
    g_autoptr(GPtrArray) events = events_logged(f);

    if (events->len != before + 1)
        fail_msg("expected %u events, got %u:\n%s", before + 1, events->len, events_text(f));
    return json_object_ref(events->pdata[before]);
}

/* A request that changes something and succeeds leaves one event: the agent, the op, the caller's
 * uid (from the socket: this process), "ok" and the agent's state afterwards. */
static void
test_event_ok(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "carol", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42320);
    g_autoptr(GPtrArray) start =
        converse(f, VM_OP_AGENT_START, "{'name': <'carol'>, 'wait': <false>}");
    g_autoptr(JsonObject) event = NULL;

    assert_result_reply(start);
    event = one_new_event(f, 0);
    assert_string_equal(member(event, "agent"), "carol");
    assert_string_equal(member(event, "event"), "agent-start");
    assert_string_equal(member(event, "state"), "running");
    assert_string_equal(member(event, "outcome"), "ok");
    assert_int_equal(json_object_get_int_member_with_default(event, "uid", -1), getuid());
    assert_null(member(event, "detail"));
    assert_non_null(member(event, "time"));

    /* rm takes the agent away: no state after it. */
    g_autoptr(GPtrArray) rm = converse(f, VM_OP_AGENT_RM, "{'name': <'carol'>, 'force': <true>}");
    assert_result_reply(rm);
    g_autoptr(JsonObject) removed = one_new_event(f, 1);
    assert_string_equal(member(removed, "event"), "agent-rm");
    assert_string_equal(member(removed, "outcome"), "ok");
    assert_null(member(removed, "state"));
}

/* The event is in the log before the answer is sent: a client that heard "ok" finds it. */
static void
test_event_before_answer(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "hank", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42325);
    g_autoptr(VmMessage) m =
        hostd_test_request(VM_OP_AGENT_START, "{'name': <'hank'>, 'wait': <false>}");
    g_autoptr(VmMessage) answer = NULL;
    GThread *thread = NULL;
    int fd = hostd_test_serve(f, &thread);

    assert_true(vm_message_write_fd(fd, m, NULL));
    do {
        g_clear_pointer(&answer, vm_message_free);
        answer = vm_message_read_fd(fd, NULL, NULL);
        assert_non_null(answer);
    } while (answer->op == VM_OP_PROGRESS);
    assert_int_equal(answer->op, VM_OP_RESULT);
    g_autoptr(JsonObject) event = one_new_event(f, 0);
    assert_string_equal(member(event, "event"), "agent-start");
    g_thread_join(thread);
    close(fd);
}

/* A request that fails leaves an event with its error; hostd's log line names the caller. */
static void
test_event_error(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "dave", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN | MAKE_RUNNING, 42321);
    g_autofree char *uid = g_strdup_printf("(uid %u)", (guint)getuid());

    g_autoptr(GPtrArray) rm = converse(f, VM_OP_AGENT_RM, "{'name': <'dave'>}");
    assert_error_reply(rm, VM_ERROR_BAD_STATE, "dave");
    g_autoptr(JsonObject) event = one_new_event(f, 0);
    const VmMessage *error = rm->pdata[rm->len - 1];
    assert_string_equal(member(event, "agent"), "dave");
    assert_string_equal(member(event, "event"), "agent-rm");
    assert_string_equal(member(event, "outcome"), "error");
    assert_string_equal(member(event, "detail"), vm_message_get_string(error, "message", ""));
    assert_string_equal(member(event, "state"), "running");
    assert_int_equal(json_object_get_int_member_with_default(event, "uid", -1), getuid());
    assert_logged_once(uid);

    /* An agent that does not exist has no state. */
    g_autoptr(GPtrArray) start =
        converse(f, VM_OP_AGENT_START, "{'name': <'ghost'>, 'wait': <false>}");
    assert_error_reply(start, VM_ERROR_NOT_FOUND, "ghost");
    g_autoptr(JsonObject) ghost = one_new_event(f, 1);
    assert_string_equal(member(ghost, "agent"), "ghost");
    assert_string_equal(member(ghost, "outcome"), "error");
    assert_null(member(ghost, "state"));
    assert_non_null(strstr(member(ghost, "detail"), "'ghost'"));
}

/* exec is a change: its detail is the command line, as a shell would read it, cut to 200 bytes. */
static void
test_event_exec(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "erin", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42322);
    g_autofree char *long_arg = g_strnfill(300, 'x');
    g_autofree char *fields = g_strdup_printf(
        "{'name': <'erin'>, 'argv': <['sh', '-c', 'echo hi; exit 3', '%s']>}", long_arg);

    /* It cannot run here (the agent is stopped), which the event says after the command. */
    g_autoptr(GPtrArray) exec = converse(f, VM_OP_EXEC, fields);
    assert_error_reply(exec, VM_ERROR_BAD_STATE, "erin");
    g_autoptr(JsonObject) event = one_new_event(f, 0);
    const char *detail = member(event, "detail");
    const char *colon = strstr(detail, ": ");
    assert_string_equal(member(event, "event"), "exec");
    assert_string_equal(member(event, "state"), "stopped");
    assert_true(g_str_has_prefix(detail, "sh -c 'echo hi; exit 3' xxx"));
    assert_non_null(colon);
    assert_int_equal(colon - detail, 200);
}

/* forward-add and forward-rm are changes whose detail names the guest port; forward-list only
 * reads. */
static void
test_event_forward(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "gail", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42326);
    guint port = vm_test_free_port();
    g_autofree char *fields = g_strdup_printf(
        "{'name': <'gail'>, 'guest_port': <uint32 3000>, 'host_port': <uint32 %u>}", port);
    g_autoptr(GPtrArray) add = converse(f, VM_OP_FORWARD_ADD, fields);
    const VmMessage *result = assert_result_reply(add);
    g_autoptr(GVariant) forward = vm_message_lookup(result, "forward");
    guint32 host_port = 0;

    assert_non_null(forward);
    assert_true(g_variant_lookup(forward, "host_port", "u", &host_port));
    assert_int_equal(host_port, port);
    g_autoptr(JsonObject) added = one_new_event(f, 0);
    assert_string_equal(member(added, "agent"), "gail");
    assert_string_equal(member(added, "event"), "forward-add");
    assert_string_equal(member(added, "outcome"), "ok");
    assert_string_equal(member(added, "detail"), "guest port 3000");
    assert_int_equal(json_object_get_int_member_with_default(added, "uid", -1), getuid());

    g_autoptr(GPtrArray) list = converse(f, VM_OP_FORWARD_LIST, "{'name': <'gail'>}");
    assert_result_reply(list);
    g_autoptr(GPtrArray) rm =
        converse(f, VM_OP_FORWARD_RM, "{'name': <'gail'>, 'guest_port': <uint32 3000>}");
    assert_result_reply(rm);
    g_autoptr(JsonObject) removed = one_new_event(f, 1);
    assert_string_equal(member(removed, "event"), "forward-rm");
    assert_string_equal(member(removed, "detail"), "guest port 3000");

    g_autoptr(GPtrArray) again =
        converse(f, VM_OP_FORWARD_RM, "{'name': <'gail'>, 'guest_port': <uint32 3000>}");
    assert_error_reply(again, VM_ERROR_NOT_FOUND, "does not forward its port 3000");
    g_autoptr(JsonObject) failed = one_new_event(f, 2);
    assert_string_equal(member(failed, "outcome"), "error");
    assert_string_equal(member(failed, "detail"),
                        "guest port 3000: agent 'gail' does not forward its port 3000");
}

/* authorize names its keys by fingerprint in the event, whatever the outcome; list changes
 * nothing and leaves none. */
static void
test_event_authorize(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "ivan", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42326);
    g_autofree char *path = vm_test_data_path("ssh-keys", "ed25519.pub", NULL);
    g_autofree char *text = vm_test_read_file(path);
    g_autofree char *line = quote(g_strstrip(text));
    g_autofree char *add = g_strdup_printf("{'name': <'ivan'>, 'keys': <[%s, 'ssh-dss x']>}", line);

    g_autoptr(GPtrArray) added = converse(f, VM_OP_AGENT_AUTHORIZE_ADD, add);
    assert_error_reply(added, VM_ERROR_INVALID_ARGUMENT, "key 2: ssh-dss");
    g_autoptr(JsonObject) event = one_new_event(f, 0);
    assert_string_equal(member(event, "event"), "agent-authorize-add");
    assert_true(g_str_has_prefix(
        member(event, "detail"),
        "keys SHA256:Z0zG8m+z77Va4093TsHLE2T8lX2xBgz3n+0qJpiUxGU ?: key 2: ssh-dss"));

    g_autoptr(GPtrArray) removed =
        converse(f, VM_OP_AGENT_AUTHORIZE_RM, "{'name': <'ivan'>, 'fingerprint': <'SHA256:x'>}");
    assert_error_reply(removed, VM_ERROR_NOT_FOUND, "agent 'ivan' has no key SHA256:x");
    g_autoptr(JsonObject) rm_event = one_new_event(f, 1);
    assert_string_equal(member(rm_event, "event"), "agent-authorize-rm");
    assert_true(g_str_has_prefix(member(rm_event, "detail"), "key SHA256:x: agent 'ivan'"));

    g_autoptr(GPtrArray) listed = converse(f, VM_OP_AGENT_AUTHORIZE_LIST, "{'name': <'ivan'>}");
    const VmMessage *result = assert_result_reply(listed);
    g_autoptr(GVariant) keys = vm_message_lookup(result, "keys");
    assert_non_null(keys);
    assert_int_equal(g_variant_n_children(keys), 0);
    g_autoptr(GPtrArray) events = events_logged(f);
    assert_int_equal(events->len, 2);
}

/* @text as a GVariant text "ay" without the NUL a bytestring literal (b'...') would add. */
static char *
bytes_text(const char *text)
{
    GString *out = g_string_new("[byte ");

    for (const char *c = text; *c != '\0'; c++)
        g_string_append_printf(out, "%s0x%02x", c == text ? "" : ", ", (guchar)*c);
    g_string_append_c(out, ']');
    return g_string_free(out, FALSE);
}

/* Nothing hostd logs or records about a secret carries its value: the request log and the event
 * name the operation and the secret (and the agent of a grant), and a duplicate's failure names
 * it too; info lists the grant by name. */
static void
test_secret_never_logged(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "ivan", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42327);
    g_autofree char *live = bytes_text("sk-live-Q7xWz2");
    g_autofree char *rotated = bytes_text("sk-rotated-P3kV9");
    g_autofree char *create = g_strdup_printf(
        "{'secret': <'example-api'>, 'hosts': <['api.example.com']>, 'value': <%s>}", live);
    g_autofree char *set_fields =
        g_strdup_printf("{'secret': <'example-api'>, 'value': <%s>}", rotated);

    f->ctx->debug = TRUE;
    g_autoptr(GPtrArray) created = converse(f, VM_OP_SECRET_CREATE, create);
    assert_result_reply(created);
    g_autoptr(JsonObject) event = one_new_event(f, 0);
    assert_string_equal(member(event, "event"), "secret-create");
    assert_string_equal(member(event, "detail"), "secret example-api");
    g_autoptr(GPtrArray) again = converse(f, VM_OP_SECRET_CREATE, create);
    assert_error_reply(again, VM_ERROR_EXISTS, "secret 'example-api' already exists");
    g_autoptr(GPtrArray) granted =
        converse(f, VM_OP_SECRET_GRANT, "{'name': <'ivan'>, 'secret': <'example-api'>}");
    assert_result_reply(granted);
    g_autoptr(JsonObject) grant_event = one_new_event(f, 2);
    assert_string_equal(member(grant_event, "agent"), "ivan");
    assert_string_equal(member(grant_event, "detail"), "secret example-api");
    g_autoptr(GPtrArray) set = converse(f, VM_OP_SECRET_SET, set_fields);
    assert_result_reply(set);
    g_autoptr(GPtrArray) empty =
        converse(f, VM_OP_SECRET_SET, "{'secret': <'example-api'>, 'value': <@ay []>}");
    assert_error_reply(empty, VM_ERROR_INVALID_ARGUMENT, "empty secret value");

    g_autoptr(GPtrArray) info = converse(f, VM_OP_AGENT_INFO, "{'name': <'ivan'>}");
    g_autoptr(GVariant) agent = vm_message_lookup(assert_result_reply(info), "agent");
    g_autofree char *agent_text = g_variant_print(agent, FALSE);
    assert_non_null(strstr(agent_text, "'secrets': <[{'name': <'example-api'>, 'env': "
                                       "<'EXAMPLE_API'>}]>"));
    assert_null(strstr(agent_text, "vmph_"));

    g_autofree char *events = events_text(f);
    assert_null(strstr(events, "sk-live"));
    assert_null(strstr(events, "sk-rotated"));
    g_mutex_lock(&log_lock);
    gboolean named = FALSE;
    for (guint i = 0; i < log_lines->len; i++) {
        const char *line = log_lines->pdata[i];
        assert_null(strstr(line, "sk-live"));
        assert_null(strstr(line, "sk-rotated"));
        named = named || strstr(line, "secret-grant ivan secret example-api ok") != NULL;
    }
    g_mutex_unlock(&log_lock);
    assert_true(named);
}

/* Requests that only read leave no event. */
static void
test_event_read_only(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "frank", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42323);
    static const struct {
        VmOp op;
        const char *fields;
    } reads[] = {
        {VM_OP_PING, NULL},
        {VM_OP_AGENT_LIST, NULL},
        {VM_OP_AGENT_INFO, "{'name': <'frank'>}"},
        {VM_OP_AGENT_INFO, "{'name': <'ghost'>}"},
        {VM_OP_AGENT_SSH_CONFIG, "{'name': <'frank'>}"},
        {VM_OP_CHECKPOINT_LIST, "{'name': <'frank'>}"},
        {VM_OP_EGRESS_GET, "{'name': <'frank'>}"},
        {VM_OP_TEMPLATE_LIST, NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(reads); i++) {
        g_autoptr(GPtrArray) replies = converse(f, reads[i].op, reads[i].fields);
    }
    g_autofree char *text = events_text(f);
    assert_string_equal(text, "");
}

/* Reads a streamed reply up to its EXIT; returns what came as STDOUT. */
static char *
read_stream(int fd, GThread *thread)
{
    g_autoptr(GString) out = g_string_new(NULL);

    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) m = vm_message_read_fd(fd, NULL, &error);
        const guint8 *data;
        gsize len = 0;

        if (m == NULL)
            fail_msg("reading the stream: %s", error != NULL ? error->message : "EOF");
        if (m->op == VM_OP_EXIT)
            break;
        if (m->op != VM_OP_STDOUT)
            fail_msg("unexpected %s in the stream", vm_op_name(m->op));
        data = vm_message_get_data(m, "data", &len);
        g_string_append_len(out, (const char *)data, (gssize)len);
    }
    g_thread_join(thread);
    close(fd);
    return g_string_free(g_steal_pointer(&out), FALSE);
}

static char *
events_request(Fixture *f, const char *fields_text)
{
    g_autoptr(VmMessage) m = hostd_test_request(VM_OP_EVENTS, fields_text);
    GThread *thread = NULL;
    int fd = hostd_test_serve(f, &thread);

    assert_true(vm_message_write_fd(fd, m, NULL));
    return read_stream(fd, thread);
}

/* The "event" members of the JSON lines @text, space-separated. */
static char *
event_names(const char *text)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    g_autoptr(GString) names = g_string_new(NULL);

    for (guint i = 0; lines[i] != NULL && lines[i][0] != '\0'; i++) {
        g_autoptr(JsonParser) parser = json_parser_new();

        assert_true(json_parser_load_from_data(parser, lines[i], -1, NULL));
        g_string_append_printf(names, "%s%s", names->len > 0 ? " " : "",
                               json_object_get_string_member(
                                   json_node_get_object(json_parser_get_root(parser)), "event"));
    }
    return g_string_free(g_steal_pointer(&names), FALSE);
}

static void
assert_events_request(Fixture *f, const char *fields, const char *expected)
{
    g_autofree char *text = events_request(f, fields);
    g_autofree char *names = event_names(text);

    if (!g_str_equal(names, expected))
        fail_msg("events %s: expected '%s', got '%s'", fields, expected, names);
}

/* EVENTS answers with the lines of the log it picks by name, time and count. */
static void
test_events_request(void **state)
{
    Fixture *f = *state;
    g_autofree char *path = g_build_filename(f->ctx->state->dir, HOSTD_EVENTS_LOG, NULL);
    /* 2024-05-01T12:00:00Z in unix microseconds */
    const gint64 t0 = G_GINT64_CONSTANT(1714564800000000);

    static const char logged[] =
        "{\"time\":\"2024-05-01T12:00:00Z\",\"agent\":\"a\",\"event\":\"e1\"}\n"
        "{\"time\":\"2024-05-01T12:00:00Z\",\"agent\":\"b\",\"event\":\"e2\"}\n"
        "garbage\n"
        "{\"time\":\"2024-05-01T12:00:01Z\",\"event\":\"e3\"}\n"
        "{\"time\":\"2024-05-01T12:00:01Z\",\"agent\":\"a\",\"event\":\"e4\"}\n";

    vm_test_write_file(path, logged);
    assert_events_request(f, NULL, "e1 e2 e3 e4");
    assert_events_request(f, "{'name': <'a'>}", "e1 e4");
    assert_events_request(f, "{'lines': <uint32 2>}", "e3 e4");
    g_autofree char *since = g_strdup_printf("{'since': <int64 %" G_GINT64_FORMAT ">}", t0 + 1);
    assert_events_request(f, since, "e3 e4");
    g_autofree char *all = g_strdup_printf(
        "{'name': <'a'>, 'since': <int64 %" G_GINT64_FORMAT ">, 'lines': <uint32 1>}", t0);
    assert_events_request(f, all, "e4");
    assert_events_request(f, "{'name': <'zed'>}", "");

    g_autoptr(GPtrArray) bad = converse(f, VM_OP_EVENTS, "{'name': <'../x'>}");
    assert_error_reply(bad, VM_ERROR_INVALID_ARGUMENT, NULL);
    /* Reading changes nothing. */
    g_autofree char *text = vm_test_read_file(path);
    assert_string_equal(text, logged);
}

/* Reads STDOUT frames of a stream onto @got until it holds @n whole lines. */
static void
read_lines(int fd, GString *got, guint n)
{
    for (;;) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmMessage) data = NULL;
        const guint8 *bytes;
        gsize len = 0;
        guint lines = 0;

        for (const char *c = got->str; *c != '\0'; c++)
            lines += *c == '\n';
        if (lines >= n)
            return;
        data = vm_message_read_fd(fd, NULL, &error);
        if (data == NULL)
            fail_msg("no event came: %s", error != NULL ? error->message : "EOF");
        assert_int_equal(data->op, VM_OP_STDOUT);
        bytes = vm_message_get_data(data, "data", &len);
        g_string_append_len(got, (const char *)bytes, (gssize)len);
    }
}

/* With follow, a new event comes as it is logged; the stream ends when the client goes. */
static void
test_events_follow(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "gina", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN, 42324);
    g_autoptr(VmMessage) m = hostd_test_request(
        VM_OP_EVENTS, "{'name': <'gina'>, 'lines': <uint32 1>, 'follow': <true>}");
    g_autoptr(GString) got = g_string_new(NULL);
    GThread *thread = NULL;
    int fd;

    /* An event before: once it came, the follower reads on from after it. */
    g_autoptr(GPtrArray) stop = converse(f, VM_OP_AGENT_STOP, "{'name': <'gina'>}");
    assert_result_reply(stop);
    fd = hostd_test_serve(f, &thread);
    assert_true(vm_message_write_fd(fd, m, NULL));
    read_lines(fd, got, 1);

    g_autoptr(GPtrArray) other = converse(f, VM_OP_AGENT_STOP, "{'name': <'ghost'>}");
    g_autoptr(GPtrArray) start =
        converse(f, VM_OP_AGENT_START, "{'name': <'gina'>, 'wait': <false>}");
    assert_result_reply(start);
    read_lines(fd, got, 2);
    g_autofree char *names = event_names(got->str);
    assert_string_equal(names, "agent-stop agent-start");
    close(fd);
    g_thread_join(thread);
}

/* ---- reconciliation ------------------------------------------------------------------------ */

static GPtrArray *
reconcile(Fixture *f)
{
    g_autoptr(GError) error = NULL;
    GPtrArray *notes = g_ptr_array_new_with_free_func(g_free);

    if (!hostd_reconcile(f->ctx, notes, &error))
        fail_msg("reconcile failed: %s", error->message);
    return notes;
}

/* Exactly one note mentions @name, and it contains @needle. */
static void
assert_note(GPtrArray *notes, const char *name, const char *needle)
{
    g_autofree char *quoted = g_strdup_printf("'%s'", name);
    const char *found = NULL;

    for (guint i = 0; i < notes->len; i++) {
        if (strstr(notes->pdata[i], quoted) == NULL)
            continue;
        if (found != NULL)
            fail_msg("two notes about %s: '%s' and '%s'", name, found, (char *)notes->pdata[i]);
        found = notes->pdata[i];
    }
    if (found == NULL)
        fail_msg("no note about %s", name);
    if (strstr(found, needle) == NULL)
        fail_msg("note '%s' does not say '%s'", found, needle);
}

static void
test_reconcile_empty(void **state)
{
    Fixture *f = *state;
    g_autoptr(GPtrArray) notes = reconcile(f);

    assert_int_equal(notes->len, 0);
}

/* A `new` that never finished is rolled back: domain and directory. */
static void
test_reconcile_creating(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) a = make_agent(f, "half", HOSTD_PHASE_CREATING,
                                               MAKE_RECORD | MAKE_DOMAIN | MAKE_RUNNING, 42310);
    g_autoptr(HostdAgentRecord) b =
        make_agent(f, "early", HOSTD_PHASE_CREATING, MAKE_RECORD, 42311);
    g_autofree char *disk = hostd_agent_record_path(a, HOSTD_AGENT_DISK);
    vm_test_write_file(disk, "overlay");

    g_autoptr(GPtrArray) notes = reconcile(f);
    assert_int_equal(notes->len, 2);
    assert_note(notes, "half", "rolled back");
    assert_note(notes, "early", "rolled back");
    assert_false(g_file_test(a->dir, G_FILE_TEST_EXISTS));
    assert_false(g_file_test(b->dir, G_FILE_TEST_EXISTS));
    assert_false(domain_exists(f, "half"));
}

/* A directory with no record is what an interrupted rm (or a very early new) leaves. */
static void
test_reconcile_no_record(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = make_agent(f, "leftover", HOSTD_PHASE_READY, 0, 42312);
    g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
    vm_test_write_file(disk, "overlay");

    g_autoptr(GPtrArray) notes = reconcile(f);
    assert_int_equal(notes->len, 1);
    assert_note(notes, "leftover", "removed");
    assert_false(g_file_test(r->dir, G_FILE_TEST_EXISTS));
}

/* libvirt lost the domain (e.g. a new embed root): it comes back from the saved XML, stopped. */
static void
test_reconcile_redefine(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "lost", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_XML, 42313);

    assert_false(domain_exists(f, "lost"));
    g_autoptr(GPtrArray) notes = reconcile(f);
    assert_int_equal(notes->len, 1);
    assert_note(notes, "lost", "redefined");
    assert_string_equal(hostd_test_domain_state(f, "lost"), "stopped");
    g_autoptr(HostdAgentRecord) kept = hostd_agent_record_load(r->dir, NULL);
    assert_non_null(kept);
    assert_string_equal(kept->phase, HOSTD_PHASE_READY);

    /* The agent works again. */
    g_autoptr(GPtrArray) replies = converse(f, VM_OP_AGENT_INFO, "{'name': <'lost'>}");
    g_autoptr(GVariant) agent = agent_field(assert_result_reply(replies));
    const char *s = NULL;
    assert_true(g_variant_lookup(agent, "uuid", "&s", &s));
    assert_string_equal(s, r->uuid);

    /* A second pass finds everything in order and changes nothing. */
    g_autoptr(GPtrArray) again = reconcile(f);
    assert_int_equal(again->len, 1);
    assert_note(again, "lost", "stopped");
}

/* Data hostd cannot read is never deleted. */
static void
test_reconcile_corrupt(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r =
        make_agent(f, "damaged", HOSTD_PHASE_READY, MAKE_DOMAIN | MAKE_RUNNING | MAKE_XML, 42314);
    g_autofree char *record = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);
    g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
    vm_test_write_file(record, "[agent]\nname=damaged\ncpus=lots\n");
    vm_test_write_file(disk, "precious");

    g_autoptr(GPtrArray) notes = reconcile(f);
    assert_int_equal(notes->len, 1);
    assert_note(notes, "damaged", record);
    assert_true(g_file_test(record, G_FILE_TEST_IS_REGULAR));
    assert_true(g_file_test(disk, G_FILE_TEST_IS_REGULAR));
    assert_string_equal(hostd_test_domain_state(f, "damaged"), "running");
}

/* Running agents keep running; agents that cannot be repaired are kept and reported. */
static void
test_reconcile_keeps(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) running =
        make_agent(f, "busy", HOSTD_PHASE_READY, MAKE_RECORD | MAKE_DOMAIN | MAKE_RUNNING, 42315);
    g_autoptr(HostdAgentRecord) no_xml =
        make_agent(f, "orphan", HOSTD_PHASE_READY, MAKE_RECORD, 42316);
    g_autoptr(HostdAgentRecord) bad_xml =
        make_agent(f, "garbled", HOSTD_PHASE_READY, MAKE_RECORD, 42317);
    g_autofree char *xml_path = hostd_agent_record_path(bad_xml, "domain.xml");
    vm_test_write_file(xml_path, "<domain type='test'><name>garbled</name>");

    g_autoptr(GPtrArray) notes = reconcile(f);
    assert_int_equal(notes->len, 3);
    assert_note(notes, "busy", "running");
    assert_note(notes, "orphan", "no domain");
    assert_note(notes, "garbled", "redefine");
    assert_string_equal(hostd_test_domain_state(f, "busy"), "running");
    assert_true(g_file_test(no_xml->dir, G_FILE_TEST_IS_DIR));
    assert_true(g_file_test(bad_xml->dir, G_FILE_TEST_IS_DIR));
    assert_false(domain_exists(f, "orphan"));
    assert_false(domain_exists(f, "garbled"));
}

/* A client that trickles its request, a byte at a time well within the old per-read timeout,
 * is cut off at request-timeout for the whole request: it cannot hold a thread. */
static void
test_request_deadline(void **state)
{
    Fixture *f = *state;
    GThread *thread = NULL;
    g_autoptr(VmMessage) m = hostd_test_request(VM_OP_PING, NULL);
    g_autoptr(GBytes) frame = vm_message_encode(m, NULL);
    gsize len = 0;
    const guint8 *bytes = g_bytes_get_data(frame, &len);

    f->ctx->config->request_timeout_s = 1;
    int fd = hostd_test_serve(f, &thread);
    gint64 start = g_get_monotonic_time();
    for (gsize i = 0; i + 1 < len && g_get_monotonic_time() - start < 3 * G_USEC_PER_SEC; i++) {
        if (send(fd, bytes + i, 1, MSG_NOSIGNAL) != 1)
            break;
        g_usleep(200 * 1000);
    }
    g_autoptr(GPtrArray) replies = read_replies(fd, thread);
    gint64 took = g_get_monotonic_time() - start;
    assert_error_reply(replies, VM_ERROR_TIMEOUT, "in time");
    assert_true(took < 3 * G_USEC_PER_SEC);
}

/* ---- the socket under load ------------------------------------------------------------------ */

#define LOAD_AGENTS 10000

/* @n agent records a00000, a00001, ..., as hostd_test_agent_record_new() makes them: the first
 * by it, the others copied from it without its fsync (ten thousand would take a minute). */
static void
make_records(Fixture *f, guint n)
{
    g_autoptr(HostdAgentRecord) first = hostd_test_agent_record_new(f, "a00000");
    g_autofree char *first_path = hostd_agent_record_path(first, HOSTD_AGENT_RECORD);
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) error = NULL;

    assert_true(g_key_file_load_from_file(kf, first_path, G_KEY_FILE_NONE, &error));
    for (guint i = 1; i < n; i++) {
        char name[16];

        g_snprintf(name, sizeof(name), "a%05u", i);
        g_autofree char *dir = hostd_agent_dir(f->ctx, name);
        g_autofree char *path = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
        g_autofree char *uuid = g_uuid_string_random();
        g_autofree char *instance = g_strdup_printf("vmctl-%s", uuid);
        g_key_file_set_string(kf, "agent", "name", name);
        g_key_file_set_string(kf, "agent", "uuid", uuid);
        g_key_file_set_string(kf, "agent", "instance-id", instance);
        g_key_file_set_uint64(kf, "agent", "ssh-port", 20000 + i);
        g_key_file_set_uint64(kf, "agent", "backend-port", 40000 + i);
        g_autofree char *text = g_key_file_to_data(kf, NULL, NULL);
        assert_int_equal(g_mkdir_with_parents(dir, 0711), 0);
        vm_test_write_file(path, text);
    }
}

static int
connect_to(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    g_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        fail_msg("connect %s: %s", path, g_strerror(errno));
    return fd;
}

/* Asks for the agent list on @fd, as vmctl does, and returns how many agents came back, after
 * checking they are a00000, a00001, ... in order. */
static guint
list_over(int fd)
{
    g_autoptr(VmMessage) req = hostd_test_request(VM_OP_AGENT_LIST, NULL);
    g_autoptr(GError) error = NULL;
    VmStreamReader reader;

    if (!vm_message_write_fd(fd, req, &error))
        fail_msg("sending list: %s", error->message);
    vm_stream_reader_init(&reader, fd, VM_OP_AGENT_LIST);
    for (;;) {
        g_autoptr(VmMessage) m = vm_stream_reader_next(&reader, &error);
        if (m == NULL)
            fail_msg("list: %s", error->message);
        if (!reader.ended)
            continue;
        g_autoptr(GVariant) agents = vm_message_lookup(m, "agents");
        assert_non_null(agents);
        gsize n = g_variant_n_children(agents);
        for (gsize i = 0; i < n; i++) {
            g_autoptr(GVariant) agent = g_variant_get_child_value(agents, i);
            const char *name = NULL;
            char want[16];

            g_snprintf(want, sizeof(want), "a%05u", (guint)i);
            assert_true(g_variant_lookup(agent, "name", "&s", &name));
            assert_string_equal(name, want);
        }
        vm_stream_reader_clear(&reader);
        return (guint)n;
    }
}

/* A list of 10,000 agents is several MiB, past any one frame: it arrives whole, in parts. */
static void
test_list_many_agents(void **state)
{
    Fixture *f = *state;
    GThread *thread = NULL;

    gint64 start = g_get_monotonic_time();
    make_records(f, LOAD_AGENTS);
    print_message("# %u agent records made in %" G_GINT64_FORMAT " ms\n", LOAD_AGENTS,
                  (g_get_monotonic_time() - start) / 1000);
    start = g_get_monotonic_time();
    int fd = hostd_test_serve(f, &thread);
    assert_int_equal(list_over(fd), LOAD_AGENTS);
    print_message("# a list of %u agents in %" G_GINT64_FORMAT " ms\n", LOAD_AGENTS,
                  (g_get_monotonic_time() - start) / 1000);
    g_thread_join(thread);
    close(fd);
}

/* 64 clients that ask for the agent list and never read it, and 64 that trickle a request they
 * never finish, do not keep the next client from its list; the tricklers are cut off at
 * request-timeout, and the non-readers' threads end once their side closes. */
static void
test_clients_cannot_hold_hostd(void **state)
{
    enum { SLOW = 64, DEAF = 64, AGENTS = 1000 };
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *path = g_build_filename(f->dir, "load.sock", NULL);
    g_autoptr(VmMessage) req = hostd_test_request(VM_OP_AGENT_LIST, NULL);
    g_autoptr(GBytes) frame = vm_message_encode(req, NULL);
    int slow[SLOW], deaf[DEAF];

    make_records(f, AGENTS);
    f->ctx->config->request_timeout_s = 2;
    HostdServer *server = hostd_server_start(f->ctx, path, NULL, &error);
    vm_test_assert_no_error(error);

    /* The non-readers first: each list is made and stuck in a full socket (answer bytes wait
     * unread) before the tricklers come, so these never get near their timeout. */
    for (guint i = 0; i < DEAF; i++) {
        deaf[i] = connect_to(path);
        assert_true(vm_message_write_fd(deaf[i], req, NULL));
    }
    for (guint i = 0; i < DEAF; i++) {
        int pending = 0;

        for (guint j = 0; j < 3000 && pending == 0; j++) {
            assert_int_equal(ioctl(deaf[i], FIONREAD, &pending), 0);
            if (pending == 0)
                g_usleep(10 * 1000);
        }
        assert_true(pending > 0);
    }
    for (guint i = 0; i < SLOW; i++) {
        slow[i] = connect_to(path);
        /* All of the frame but its last byte. */
        assert_int_equal(
            send(slow[i], g_bytes_get_data(frame, NULL), g_bytes_get_size(frame) - 1, MSG_NOSIGNAL),
            (gssize)g_bytes_get_size(frame) - 1);
    }
    for (guint i = 0; i < 100 && hostd_server_active_clients() < SLOW + DEAF; i++)
        g_usleep(10 * 1000);
    guint held = hostd_server_active_clients();

    gint64 start = g_get_monotonic_time();
    int fd = connect_to(path);
    guint listed = list_over(fd);
    close(fd);
    gint64 took_ms = (g_get_monotonic_time() - start) / 1000;
    print_message("# with %u clients held, the next had its list of %u agents in %" G_GINT64_FORMAT
                  " ms\n",
                  held, listed, took_ms);

    /* The tricklers are told they were too slow, within request-timeout and a second. */
    guint timed_out = 0;
    for (guint i = 0; i < SLOW; i++) {
        struct timeval tv = {.tv_sec = 4};
        setsockopt(slow[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        g_autoptr(VmMessage) m = vm_message_read_fd(slow[i], NULL, NULL);
        if (m != NULL && m->op == VM_OP_ERROR &&
            vm_message_get_uint(m, "code", 0) == VM_ERROR_TIMEOUT)
            timed_out++;
        close(slow[i]);
    }
    for (guint i = 0; i < DEAF; i++)
        close(deaf[i]);
    /* Their threads end with their connections: nothing is left holding a slot, and nothing
     * uses the context once the test frees it. */
    for (guint i = 0; i < 1000 && hostd_server_active_clients() > 0; i++)
        g_usleep(10 * 1000);
    guint left = hostd_server_active_clients();
    hostd_server_stop(server);

    assert_int_equal(left, 0);
    assert_int_equal(held, SLOW + DEAF);
    assert_int_equal(listed, AGENTS);
    assert_true(took_ms < 1000);
    assert_int_equal(timed_out, SLOW);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ping_half_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_list_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_agent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fleet_without_cluster, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_log, setup_image, teardown),
        cmocka_unit_test_setup_teardown(test_bad_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_unknown_template, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_no_resources, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_exists, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_request, setup, teardown),
        cmocka_unit_test(test_every_request_handled),
        cmocka_unit_test_setup_teardown(test_bad_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_template_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_template_list_broken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_info, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_lifecycle, setup_image, teardown),
        cmocka_unit_test_setup_teardown(test_agent_rm_force, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_ok, setup_image, teardown),
        cmocka_unit_test_setup_teardown(test_event_before_answer, setup_image, teardown),
        cmocka_unit_test_setup_teardown(test_event_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_exec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_authorize, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secret_never_logged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_follow, setup_image, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_creating, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_no_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_redefine, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_corrupt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_keeps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_many_agents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clients_cannot_hold_hostd, setup, teardown),
    };

    log_lines = g_ptr_array_new_with_free_func(g_free);
    g_log_set_writer_func(capture_log, NULL, NULL);
    return cmocka_run_group_tests_name("server", tests, NULL, NULL);
}
