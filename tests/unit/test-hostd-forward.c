/* hostd's forwarded ports without VMs (hostd-forward.c): the record (forwards.ini) as text and on
 * disk, the choice of host ports and what is refused, and the requests, the start-up and rm on
 * libvirt's test driver with real listeners on 127.0.0.1. A connection to a forwarded port wakes
 * the agent; carrying it through SSH is tested against a real sshd in test-ssh.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-forward-private.h"
#include "hostd-reconcile.h"
#include "vm-error.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "test-sink.h"

/* ---- helpers -------------------------------------------------------------------------------- */

static GArray *
parse_ok(const char *text)
{
    g_autoptr(GError) error = NULL;
    GArray *forwards = hostd_forwards_parse(text, strlen(text), "forwards.ini", &error);

    if (forwards == NULL)
        fail_msg("%s: %s", text, error->message);
    return forwards;
}

/* "GUEST>HOST GUEST>HOST..." */
static char *
forwards_text(const GArray *forwards)
{
    GString *out = g_string_new(NULL);

    for (guint i = 0; i < forwards->len; i++) {
        const HostdForward *fw = &g_array_index(forwards, HostdForward, i);

        g_string_append_printf(out, "%s%u>%u", i > 0 ? " " : "", fw->guest_port, fw->host_port);
    }
    return g_string_free(out, FALSE);
}

/* Whether something listens on @port. A forwarded port's connection is waited out: here it
 * ends soon (no sshd answers), and is then no longer counted. */
static gboolean
port_accepts(guint port)
{
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_port = htons((guint16)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 10};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char c;
    gboolean ok;

    assert_true(fd >= 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    ok = connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
    if (ok)
        assert_int_equal(recv(fd, &c, 1, 0), 0);
    close(fd);
    return ok;
}

/* A range of ports free a moment ago for the fixture's forwards: [first, first + 20]. */
static guint
use_free_range(HostdTestFixture *f)
{
    guint first = vm_test_free_port();

    if (first > 65535 - 20)
        first = 65535 - 20;
    f->ctx->config->forward_port_min = first;
    f->ctx->config->forward_port_max = first + 20;
    return first;
}

static guint
dict_uint(GVariant *dict, const char *key)
{
    guint32 value = 0;

    if (!g_variant_lookup(dict, key, "u", &value))
        fail_msg("no %s in the forward", key);
    return value;
}

static gboolean
dict_bool(GVariant *dict, const char *key)
{
    gboolean value = FALSE;

    if (!g_variant_lookup(dict, key, "b", &value))
        fail_msg("no %s in the forward", key);
    return value;
}

static GVariant *
add_ok(HostdTestFixture *f, const char *name, guint guest_port, guint host_port)
{
    g_autoptr(GError) error = NULL;
    GVariant *v =
        hostd_test_sink(hostd_forward_add(f->ctx, name, guest_port, host_port, 1000, &error));

    if (v == NULL)
        fail_msg("forward %s %u: %s", name, guest_port, error->message);
    return v;
}

static void
add_fails(HostdTestFixture *f, const char *name, guint guest_port, guint host_port, gint64 uid,
          VmErrorCode code, const char *needle)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_forward_add(f->ctx, name, guest_port, host_port, uid, &error));

    assert_null(v);
    hostd_test_assert_error(error, code, needle);
}

/* The forwards of @name (NULL: all) as "AGENT:GUEST>HOST/LISTENING/CONNECTIONS" words. */
static char *
list_text(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) list = hostd_test_sink(hostd_forward_list(f->ctx, name, &error));
    GString *out = g_string_new(NULL);
    GVariantIter iter;
    GVariant *one;

    if (list == NULL)
        fail_msg("list: %s", error->message);
    g_variant_iter_init(&iter, list);
    while ((one = g_variant_iter_next_value(&iter)) != NULL) {
        g_autofree char *agent = hostd_test_dict_string(one, "agent");
        g_autofree char *address = hostd_test_dict_string(one, "address");
        g_autofree char *want = g_strdup_printf("127.0.0.1:%u", dict_uint(one, "host_port"));

        assert_string_equal(address, want);
        g_string_append_printf(out, "%s%s:%u>%u/%s/%u", out->len > 0 ? " " : "", agent,
                               dict_uint(one, "guest_port"), dict_uint(one, "host_port"),
                               dict_bool(one, "listening") ? "up" : "down",
                               dict_uint(one, "connections"));
        g_variant_unref(one);
    }
    return g_string_free(out, FALSE);
}

static char *
record_text(HostdTestFixture *f, const char *name)
{
    g_autofree char *path = hostd_test_agent_file(f, name, HOSTD_AGENT_FORWARDS);
    g_autoptr(GError) error = NULL;
    g_autoptr(GArray) forwards = NULL;
    g_autofree char *dir = g_path_get_dirname(path);

    forwards = hostd_forwards_load(dir, &error);
    if (forwards == NULL)
        fail_msg("%s: %s", path, error->message);
    return forwards_text(forwards);
}

/* Waits up to 10 s for a line of hostd's log that contains @needle. */
static void
wait_logged(const char *needle)
{
    for (guint i = 0; i < 1000; i++) {
        g_autofree char *log = hostd_test_log_text();

        if (strstr(log, needle) != NULL)
            return;
        g_usleep(10 * 1000);
    }
    g_autofree char *log = hostd_test_log_text();
    fail_msg("'%s' not logged; the log:\n%s", needle, log);
}

/* ---- the record ----------------------------------------------------------------------------- */

static void
test_record_parse(void **state)
{
    static const struct {
        const char *text;
        const char *forwards;
    } good[] = {
        {"", ""},
        {"# nothing forwarded\n", ""},
        {"[forward 3000]\nhost-port=43000\n", "3000>43000"},
        {"[forward 8080]\nhost-port = 8080 \n\n# a comment\n[forward 22]\nhost-port=2222\n",
         "22>2222 8080>8080"},
        {"[forward 65535]\nhost-port=1\n[forward 1]\nhost-port=65535\n", "1>65535 65535>1"},
    };
    static const struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"[forwards]\n", "[forwards] is not [forward GUEST_PORT]"},
        {"[forward]\nhost-port=1\n", "[forward] is not"},
        {"[forward 0]\nhost-port=1\n", "[forward 0] is not"},
        {"[forward 65536]\nhost-port=1\n", "[forward 65536] is not"},
        {"[forward 080]\nhost-port=1\n", "[forward 080] is not"},
        {"[forward +80]\nhost-port=1\n", "[forward +80] is not"},
        {"[forward 80x]\nhost-port=1\n", "[forward 80x] is not"},
        {"[forward  80]\nhost-port=1\n", "is not"},
        {"[forward 80]\n", "[forward 80]: host-port must be a port"},
        {"[forward 80]\nhost-port=\n", "host-port must be a port"},
        {"[forward 80]\nhost-port=0\n", "host-port must be a port"},
        {"[forward 80]\nhost-port=-1\n", "host-port must be a port"},
        {"[forward 80]\nhost-port=65536\n", "host-port must be a port"},
        {"[forward 80]\nhost-port=8o\n", "host-port must be a port"},
        {"[forward 80]\nhost-port=99999999999999999999\n", "host-port must be a port"},
        {"[forward 80]\nhost-port=8080\nbind=0.0.0.0\n", "unknown key 'bind'"},
        {"[forward 80]\nhost-port=8080\n[forward 81]\nhost-port=8080\n", "host port 8080 is there"},
        {"host-port=8080\n", "forwards.ini: "},
        {"[forward 80\n", "forwards.ini: "},
        {"[forward 80]\nhost-port=\xff\n", "forwards.ini: "},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autoptr(GArray) forwards = parse_ok(good[i].text);
        g_autofree char *text = forwards_text(forwards);

        assert_string_equal(text, good[i].forwards);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GArray) forwards =
            hostd_forwards_parse(bad[i].text, strlen(bad[i].text), "forwards.ini", &error);

        if (forwards != NULL)
            fail_msg("accepted: %s", bad[i].text);
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, bad[i].needle);
        assert_true(g_str_has_prefix(error->message, "forwards.ini: "));
    }
}

/* More than HOSTD_FORWARD_MAX ports is a corrupt record; exactly that many is not. */
static void
test_record_cap(void **state)
{
    g_autoptr(GString) text = g_string_new(NULL);
    g_autoptr(GArray) forwards = NULL;
    g_autoptr(GError) error = NULL;

    for (guint i = 1; i <= HOSTD_FORWARD_MAX; i++)
        g_string_append_printf(text, "[forward %u]\nhost-port=%u\n", i, 10000 + i);
    forwards = parse_ok(text->str);
    assert_int_equal(forwards->len, HOSTD_FORWARD_MAX);
    g_clear_pointer(&forwards, g_array_unref);

    g_string_append(text, "[forward 9999]\nhost-port=9999\n");
    forwards = hostd_forwards_parse(text->str, text->len, "f", &error);
    assert_null(forwards);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, "more than 64 forwarded ports");
}

/* What is formatted parses back the same; on disk it is the agent's alone. */
static void
test_record_save_load(void **state)
{
    g_autofree char *dir = vm_test_make_tmpdir("test-forward-XXXXXX");
    g_autofree char *path = g_build_filename(dir, HOSTD_AGENT_FORWARDS, NULL);
    g_autoptr(GArray) forwards = parse_ok("[forward 8080]\nhost-port=43001\n"
                                          "[forward 3000]\nhost-port=43000\n");
    g_autoptr(GArray) none = NULL;
    g_autoptr(GArray) back = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *formatted = hostd_forwards_format(forwards);
    g_autofree char *text = NULL;
    g_autofree char *back_text = NULL;
    struct stat st;

    back = parse_ok(formatted);
    back_text = forwards_text(back);
    assert_string_equal(back_text, "3000>43000 8080>43001");
    g_clear_pointer(&back, g_array_unref);
    g_clear_pointer(&back_text, g_free);

    /* No file: no forwards. */
    none = hostd_forwards_load(dir, &error);
    vm_test_assert_no_error(error);
    assert_int_equal(none->len, 0);

    assert_true(hostd_forwards_save(dir, forwards, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    text = vm_test_read_file(path);
    assert_string_equal(text, formatted);
    back = hostd_forwards_load(dir, &error);
    vm_test_assert_no_error(error);
    back_text = forwards_text(back);
    assert_string_equal(back_text, "3000>43000 8080>43001");

    /* A broken file says which. */
    g_clear_pointer(&back, g_array_unref);
    vm_test_write_file(path, "[forward 3000]\nhost-port=port\n");
    back = hostd_forwards_load(dir, &error);
    assert_null(back);
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_FAILED, path);
    vm_test_remove_tree(dir);
}

/* ---- host ports ----------------------------------------------------------------------------- */

static void
test_choose_port(void **state)
{
    g_autoptr(GHashTable) used = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    g_autoptr(GError) error = NULL;
    guint16 busy_port;
    int busy = vm_test_listen_loopback(&busy_port);
    guint first = vm_test_free_port();
    guint port = 0;

    if (first > 65000)
        first = 40000;
    g_hash_table_insert(used, GUINT_TO_POINTER(first), g_strdup("agent 'a' has its SSH there"));
    g_hash_table_insert(used, GUINT_TO_POINTER(8080), g_strdup("agent 'b' forwards its port 80"));

    /* Asked for: taken as it is, unless privileged or hostd gave it out. */
    assert_true(hostd_forward_choose_port(8081, 1000, 1, 2, used, &port, &error));
    assert_int_equal(port, 8081);
    assert_true(hostd_forward_choose_port(80, 0, 1, 2, used, &port, &error));
    assert_int_equal(port, 80);
    assert_true(hostd_forward_choose_port(1024, 1000, 1, 2, used, &port, &error));
    assert_int_equal(port, 1024);
    vm_test_assert_no_error(error);
    port = 0;
    assert_false(hostd_forward_choose_port(80, 1000, 1, 2, used, &port, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT,
                         "host port 80 is below 1024: only root may forward to it");
    g_clear_error(&error);
    assert_false(hostd_forward_choose_port(1023, -1, 1, 2, used, &port, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT, "below 1024");
    g_clear_error(&error);
    assert_false(hostd_forward_choose_port(8080, 0, 1, 2, used, &port, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NO_RESOURCES,
                         "port 8080 on 127.0.0.1 is taken: agent 'b' forwards its port 80");
    g_clear_error(&error);
    assert_int_equal(port, 0);

    /* Chosen: the lowest of the range that hostd did not give out and nothing listens on. */
    assert_true(hostd_forward_choose_port(0, 1000, first, first + 5, used, &port, &error));
    vm_test_assert_no_error(error);
    assert_true(port > first && port <= first + 5);
    assert_false(hostd_forward_choose_port(0, 1000, busy_port, busy_port, used, &port, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NO_RESOURCES, "no free port in");
    g_clear_error(&error);
    assert_false(hostd_forward_choose_port(0, 0, first, first, used, &port, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NO_RESOURCES, "forward-port-min");
    close(busy);
}

/* ---- requests ------------------------------------------------------------------------------- */

/* Add, list, remove; every refusal leaves the record and the listeners as they were. */
static void
test_add_list_rm(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) alice = hostd_test_agent_record_new(f, "alice");
    g_autoptr(HostdAgentRecord) bob = hostd_test_agent_record_new(f, "bob");
    guint first = use_free_range(f);
    g_autoptr(GVariant) web = NULL;
    g_autoptr(GVariant) api = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *record = NULL;
    g_autofree char *list = NULL;
    g_autofree char *want = NULL;
    g_autofree char *taken = NULL;
    guint web_port, api_port;

    web = add_ok(f, "alice", 3000, 0);
    web_port = dict_uint(web, "host_port");
    assert_true(web_port >= first && web_port <= first + 20);
    assert_int_equal(dict_uint(web, "guest_port"), 3000);
    assert_int_equal(dict_uint(web, "connections"), 0);
    assert_true(dict_bool(web, "listening"));
    assert_true(port_accepts(web_port));
    api_port = vm_test_free_port();
    api = add_ok(f, "bob", 8080, api_port);
    assert_int_equal(dict_uint(api, "host_port"), api_port);
    assert_true(port_accepts(api_port));

    record = record_text(f, "alice");
    want = g_strdup_printf("3000>%u", web_port);
    assert_string_equal(record, want);
    list = list_text(f, NULL);
    g_free(want);
    want = g_strdup_printf("alice:3000>%u/up/0 bob:8080>%u/up/0", web_port, api_port);
    assert_string_equal(list, want);
    g_free(list);
    list = list_text(f, "bob");
    g_free(want);
    want = g_strdup_printf("bob:8080>%u/up/0", api_port);
    assert_string_equal(list, want);

    /* Refused: the same guest port, a port hostd gave out, a privileged port for a user. */
    add_fails(f, "alice", 3000, 0, 1000, VM_ERROR_EXISTS,
              "agent 'alice' forwards its port 3000 already, to 127.0.0.1:");
    add_fails(f, "alice", 3001, api_port, 1000, VM_ERROR_NO_RESOURCES,
              "agent 'bob' forwards its port 8080 there");
    add_fails(f, "alice", 3001, alice->ssh_port, 1000, VM_ERROR_NO_RESOURCES,
              "agent 'alice' has its SSH there");
    add_fails(f, "alice", 3001, bob->backend_port, 1000, VM_ERROR_NO_RESOURCES,
              "agent 'bob' has its SSH backend there");
    add_fails(f, "alice", 3001, 1000, 1000, VM_ERROR_INVALID_ARGUMENT, "below 1024");
    add_fails(f, "carol", 3001, 0, 1000, VM_ERROR_NOT_FOUND, "no agent 'carol'");
    add_fails(f, "Alice", 3001, 0, 1000, VM_ERROR_INVALID_ARGUMENT, NULL);
    {
        /* Something else listens there. */
        guint16 other;
        int fd = vm_test_listen_loopback(&other);

        add_fails(f, "alice", 3001, other, 1000, VM_ERROR_NO_RESOURCES, "is taken");
        close(fd);
    }
    g_free(record);
    record = record_text(f, "alice");
    g_free(want);
    want = g_strdup_printf("3000>%u", web_port);
    assert_string_equal(record, want);

    /* Removed: the port is free at once, the record forgets it. */
    assert_true(hostd_forward_remove(f->ctx, "alice", 3000, &error));
    vm_test_assert_no_error(error);
    assert_false(port_accepts(web_port));
    g_free(record);
    record = record_text(f, "alice");
    assert_string_equal(record, "");
    assert_false(hostd_forward_remove(f->ctx, "alice", 3000, &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "agent 'alice' does not forward its port");
    g_clear_error(&error);
    assert_false(hostd_forward_remove(f->ctx, "carol", 3000, &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no agent 'carol'");
    g_clear_error(&error);
    g_free(list);
    list = list_text(f, "alice");
    assert_string_equal(list, "");

    /* The freed port can be forwarded again, by anyone. */
    g_clear_pointer(&web, g_variant_unref);
    web = add_ok(f, "bob", 3000, web_port);
    assert_true(port_accepts(web_port));
    taken = list_text(f, NULL);
    g_free(want);
    want = g_strdup_printf("bob:3000>%u/up/0 bob:8080>%u/up/0", web_port, api_port);
    assert_string_equal(taken, want);
}

/* rm of the agent stops its ports; a rolled-back or removed agent leaves none listening. */
static void
test_rm_stops(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "alice", HOSTD_TEST_STOPPED);
    g_autoptr(GVariant) web = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *list = NULL;
    guint port;

    use_free_range(f);
    web = add_ok(f, "alice", 3000, 0);
    port = dict_uint(web, "host_port");
    assert_true(port_accepts(port));
    assert_true(hostd_agent_rm(f->ctx, "alice", FALSE, &error));
    vm_test_assert_no_error(error);
    assert_false(port_accepts(port));
    list = list_text(f, NULL);
    assert_string_equal(list, "");
}

/* hostd restarted: the recorded ports are served again; one whose host port something else
 * took meanwhile is listed as not listening, with a note, and the rest still work. */
static void
test_reconcile(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "alice", HOSTD_TEST_RUNNING);
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GVariant) web = NULL;
    g_autoptr(GVariant) api = NULL;
    g_autoptr(GError) error = NULL;
    g_autofree char *list = NULL;
    g_autofree char *want = NULL;
    g_autofree char *note = NULL;
    guint web_port, api_port;
    int squatter;

    use_free_range(f);
    web = add_ok(f, "alice", 3000, 0);
    api = add_ok(f, "alice", 8080, 0);
    web_port = dict_uint(web, "host_port");
    api_port = dict_uint(api, "host_port");

    hostd_forward_stop(f->ctx);
    assert_false(port_accepts(web_port));
    assert_false(port_accepts(api_port));
    list = list_text(f, NULL);
    want = g_strdup_printf("alice:3000>%u/down/0 alice:8080>%u/down/0", web_port, api_port);
    assert_string_equal(list, want);

    {
        struct sockaddr_in sin = {.sin_family = AF_INET,
                                  .sin_port = htons((guint16)api_port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

        squatter = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_int_equal(bind(squatter, (struct sockaddr *)&sin, sizeof(sin)), 0);
        assert_int_equal(listen(squatter, 1), 0);
    }
    assert_true(hostd_reconcile(f->ctx, notes, &error));
    vm_test_assert_no_error(error);
    assert_true(port_accepts(web_port));
    note = g_strdup_printf("agent 'alice': port 8080 not forwarded to 127.0.0.1:%u: port %u on "
                           "127.0.0.1 is taken",
                           api_port, api_port);
    {
        gboolean found = FALSE;

        for (guint i = 0; i < notes->len; i++)
            found = found || g_str_equal(notes->pdata[i], note);
        if (!found)
            fail_msg("no note '%s'", note);
    }
    g_free(list);
    list = list_text(f, NULL);
    g_free(want);
    want = g_strdup_printf("alice:3000>%u/up/0 alice:8080>%u/down/0", web_port, api_port);
    assert_string_equal(list, want);
    close(squatter);

    /* A forward not served can be removed and made again. */
    assert_true(hostd_forward_remove(f->ctx, "alice", 8080, &error));
    vm_test_assert_no_error(error);
    g_clear_pointer(&api, g_variant_unref);
    api = add_ok(f, "alice", 8080, api_port);
    assert_true(port_accepts(api_port));
}

/* A broken record at start-up is a note; the agent's other business goes on. */
static void
test_reconcile_bad_record(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "alice", HOSTD_TEST_RUNNING);
    g_autofree char *path = hostd_test_agent_file(f, "alice", HOSTD_AGENT_FORWARDS);
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) list = NULL;
    gboolean found = FALSE;

    vm_test_write_file(path, "[forward 3000]\nhost-port=nope\n");
    assert_true(hostd_reconcile(f->ctx, notes, &error));
    vm_test_assert_no_error(error);
    for (guint i = 0; i < notes->len; i++)
        found =
            found || (g_str_has_prefix(notes->pdata[i], "agent 'alice': no forwarded ports: ") &&
                      strstr(notes->pdata[i], "host-port must be a port") != NULL);
    assert_true(found);
    list = hostd_test_sink(hostd_forward_list(f->ctx, "alice", &error));
    assert_null(list);
    hostd_test_assert_error(error, VM_ERROR_FAILED, "host-port must be a port");
    g_clear_error(&error);
    add_fails(f, "alice", 8080, 0, 0, VM_ERROR_FAILED, "host-port must be a port");
    /* The list of every agent leaves it out. */
    g_autofree char *all = list_text(f, NULL);
    assert_string_equal(all, "");
}

/* A connection to a forwarded port wakes a paused or saved agent, as one to its SSH port does;
 * a stopped agent refuses it, and says so once. (Here no sshd answers: after the wake the
 * connection fails, which is logged.) */
static void
test_connection_wakes(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) paused = hostd_test_agent_new(f, "paula", HOSTD_TEST_PAUSED);
    g_autoptr(HostdAgentRecord) saved = hostd_test_agent_new(f, "sam", HOSTD_TEST_SAVED);
    g_autoptr(HostdAgentRecord) stopped = hostd_test_agent_new(f, "stan", HOSTD_TEST_STOPPED);
    const char *names[] = {"paula", "sam", "stan"};

    use_free_range(f);
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        g_autoptr(GVariant) fw = add_ok(f, names[i], 3000, 0);
        int fd = vm_test_connect_loopback((guint16)dict_uint(fw, "host_port"), 10);
        g_autoptr(GString) got = vm_test_read_until(fd, NULL, 10000, NULL);

        /* Nothing comes, and the connection ends. */
        assert_string_equal(got->str, "");
        close(fd);
    }
    assert_string_equal(hostd_test_domain_state(f, "paula"), "running");
    assert_string_equal(hostd_test_domain_state(f, "sam"), "running");
    assert_string_equal(hostd_test_domain_state(f, "stan"), "stopped");
    wait_logged("agent 'paula': forwarded port 3000: cannot reach the agent over SSH: ");
    wait_logged("agent 'sam': forwarded port 3000: cannot reach the agent over SSH: ");
    wait_logged("agent 'stan': forwarded port 3000: connection refused: agent 'stan' is stopped");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_parse),
        cmocka_unit_test(test_record_cap),
        cmocka_unit_test(test_record_save_load),
        cmocka_unit_test(test_choose_port),
        cmocka_unit_test_setup_teardown(test_add_list_rm, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_rm_stops, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_reconcile, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_reconcile_bad_record, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_connection_wakes, hostd_test_setup,
                                        hostd_test_teardown),
    };

    return cmocka_run_group_tests_name("hostd-forward", tests, NULL, NULL);
}
