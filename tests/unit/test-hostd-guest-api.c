/* hostd's in-guest API over libvirt's test driver, end to end: each agent's real worker process
 * (vm-guest-api-worker, libsoup inside) fed guest connections handed over to its api.sock as
 * QEMU's guest forward does (vm_fd_pass(), and once the real vm-egress-connect helper),
 * answering for that agent only, through hostd's typed calls; checkpoints and a
 * restore through the test driver's fakes, keep-awake seen by the idle loop, every bound a guest
 * can hit, and vmctl-guest itself (cloud-init/vmctl-guest) driving the API over TCP. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <libsoup/soup.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

#include "hostd-checkpoint.h"
#include "hostd-confine.h"
#include "hostd-egress.h"
#include "hostd-events.h"
#include "hostd-guest-api.h"
#include "hostd-power.h"
#include "hostd-resources.h"
#include "vm-config.h"
#include "vm-fd-pass.h"
#include "vm-seed.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "test-sink.h"

#define READ_TIMEOUT_MS 20000
/* Three ticks of the idle loop and the work they start (test-hostd-power.c). */
#define IDLE_WAIT_MS 15000

/* ---- helpers -------------------------------------------------------------------------------- */

static const char *
env_or(const char *name, const char *fallback)
{
    const char *value = g_getenv(name);

    return value != NULL && value[0] != '\0' ? value : fallback;
}

/* A ready agent in @state with its API listening. */
static HostdAgentRecord *
api_agent(HostdTestFixture *f, const char *name, HostdTestState state)
{
    HostdAgentRecord *r = hostd_test_agent_new(f, name, state);
    g_autoptr(GError) error = NULL;

    if (!hostd_guest_api_agent_start(f->ctx, r, &error))
        fail_msg("API of %s: %s", name, error->message);
    return r;
}

/* A guest connection to @name's API as the helper hands it over: the guest's end. */
static int
api_connect(HostdTestFixture *f, const char *name)
{
    g_autofree char *path = hostd_test_agent_file(f, name, HOSTD_AGENT_API_SOCKET);
    struct timeval tv = {.tv_sec = READ_TIMEOUT_MS / 1000};
    int sv[2];
    int rc;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    rc = vm_fd_pass(path, sv[1]);
    close(sv[1]);
    if (rc != 0)
        fail_msg("cannot hand a connection to %s: %s", path, g_strerror(-rc));
    assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    return sv[0];
}

typedef struct {
    guint status; /* 0: no answer */
    SoupMessageHeaders *headers;
    char *body;
} Reply;

static void
reply_clear(Reply *reply)
{
    g_clear_pointer(&reply->headers, soup_message_headers_unref);
    g_clear_pointer(&reply->body, g_free);
    reply->status = 0;
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Reply, reply_clear)

/* Reads the whole answer on @fd (the server closes after one), with libsoup's own parser for
 * the head. */
static void
read_reply(int fd, Reply *ret)
{
    g_autoptr(GString) all = vm_test_read_until(fd, NULL, READ_TIMEOUT_MS, NULL);
    const char *end = strstr(all->str, "\r\n\r\n");

    *ret = (Reply){0};
    if (end == NULL)
        return;
    ret->headers = soup_message_headers_new(SOUP_MESSAGE_HEADERS_RESPONSE);
    if (!soup_headers_parse_response(all->str, (int)(end - all->str + 4), ret->headers, NULL,
                                     &ret->status, NULL))
        fail_msg("not an HTTP answer: %s", all->str);
    ret->body = g_strdup(end + 4);
}

/* One request on its own connection; @body NULL: none. */
static void
call(HostdTestFixture *f, const char *name, const char *method, const char *path, const char *body,
     Reply *ret)
{
    int fd = api_connect(f, name);
    g_autofree char *length =
        body != NULL ? g_strdup_printf("Content-Type: application/json\r\nContent-Length: %zu\r\n",
                                       strlen(body))
                     : g_strdup("");
    g_autofree char *request = g_strdup_printf("%s %s HTTP/1.1\r\nHost: 10.0.2.100\r\n%s\r\n%s",
                                               method, path, length, body != NULL ? body : "");

    vm_test_send_text(fd, request);
    read_reply(fd, ret);
    close(fd);
}

static JsonObject *
json_object(const char *text)
{
    g_autoptr(JsonParser) parser = json_parser_new();
    g_autoptr(GError) error = NULL;

    if (!json_parser_load_from_data(parser, text, -1, &error))
        fail_msg("not JSON (%s): %s", error->message, text);
    if (!JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser)))
        fail_msg("not a JSON object: %s", text);
    return json_object_ref(json_node_get_object(json_parser_get_root(parser)));
}

/* An answer of @status whose JSON body is returned. */
static JsonObject *
expect(const Reply *reply, guint status)
{
    if (reply->status != status)
        fail_msg("expected %u, got %u: %s", status, reply->status,
                 reply->body != NULL ? reply->body : "(no answer)");
    assert_string_equal(soup_message_headers_get_content_type(reply->headers, NULL),
                        "application/json");
    return json_object(reply->body);
}

/* An error answer: @status, the error's name, and its message mentioning @needle. */
static void
expect_error(const Reply *reply, guint status, const char *name, const char *needle)
{
    g_autoptr(JsonObject) o = expect(reply, status);

    assert_string_equal(json_object_get_string_member(o, "error"), name);
    if (needle != NULL && strstr(json_object_get_string_member(o, "message"), needle) == NULL)
        fail_msg("'%s' does not mention '%s'", json_object_get_string_member(o, "message"), needle);
}

static char *
events_text(HostdTestFixture *f)
{
    g_autofree char *path = g_build_filename(f->ctx->state->dir, HOSTD_EVENTS_LOG, NULL);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

static void
start_power(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);

    if (!hostd_power_start(f->ctx, notes, &error))
        fail_msg("power: %s", error->message);
}

static void
set_idle(HostdTestFixture *f, const char *name, guint pause_s)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, name, FALSE, pause_s, 0, &error));

    if (v == NULL)
        fail_msg("idle %s: %s", name, error->message);
}

/* ---- answers for that agent only ------------------------------------------------------------ */

/* Each agent's socket answers with that agent's info, and nothing of the host. */
static void
test_info_own_agent(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) b1 = api_agent(f, "b1", HOSTD_TEST_STOPPED);
    g_auto(Reply) ra = {0};
    g_auto(Reply) rb = {0};

    call(f, "a1", "GET", "/v1/info", NULL, &ra);
    g_autoptr(JsonObject) oa = expect(&ra, 200);
    JsonObject *agent = json_object_get_object_member(oa, "agent");
    assert_string_equal(json_object_get_string_member(agent, "name"), "a1");
    assert_string_equal(json_object_get_string_member(agent, "state"), "running");
    assert_string_equal(json_object_get_string_member(agent, "template"), "debian-12");
    assert_int_equal(json_object_get_int_member(agent, "cpus"), 1);
    assert_true(json_object_get_null_member(agent, "keep_awake"));
    static const char *const never[] = {"ssh_port", "uuid", "mac", "dir", "user", "forked_from"};
    for (gsize i = 0; i < G_N_ELEMENTS(never); i++)
        assert_false(json_object_has_member(agent, never[i]));
    assert_null(strstr(ra.body, f->dir));

    call(f, "b1", "GET", "/v1/info", NULL, &rb);
    g_autoptr(JsonObject) ob = expect(&rb, 200);
    agent = json_object_get_object_member(ob, "agent");
    assert_string_equal(json_object_get_string_member(agent, "name"), "b1");
    assert_string_equal(json_object_get_string_member(agent, "state"), "stopped");

    /* Its egress policy, read-only: the rules and the proxy, nothing else. */
    g_auto(Reply) re = {0};
    call(f, "a1", "GET", "/v1/egress", NULL, &re);
    g_autoptr(JsonObject) oe = expect(&re, 200);
    JsonObject *egress = json_object_get_object_member(oe, "egress");
    assert_string_equal(
        json_array_get_string_element(json_object_get_array_member(egress, "allow"), 0), "none");
    assert_string_equal(json_object_get_string_member(egress, "proxy"), "http://10.0.2.100:3128");
    assert_int_equal(json_object_get_size(egress), 3);
    hostd_test_assert_logged("guest api: agent 'a1': GET /v1/info 200");
    hostd_test_assert_logged("guest api: agent 'b1': GET /v1/info 200");
}

/* A checkpoint asked from inside is a checkpoint of that agent (the test driver's fakes take it,
 * crash-consistent with a warning, as without a guest agent), listed to it and not to another,
 * and an event by the guest. */
static void
test_checkpoint(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) b1 = api_agent(f, "b1", HOSTD_TEST_RUNNING);
    g_auto(Reply) created = {0};
    g_auto(Reply) listed = {0};
    g_auto(Reply) other = {0};

    call(f, "a1", "POST", "/v1/checkpoints", "{\"label\": \"before-upgrade\"}", &created);
    g_autoptr(JsonObject) o = expect(&created, 201);
    JsonObject *c = json_object_get_object_member(o, "checkpoint");
    assert_string_equal(json_object_get_string_member(c, "id"), "c1");
    assert_string_equal(json_object_get_string_member(c, "label"), "before-upgrade");
    assert_string_equal(json_object_get_string_member(c, "kind"), "disk");
    assert_false(json_object_get_boolean_member(c, "automatic"));
    assert_true(json_object_has_member(o, "warning"));
    assert_false(json_object_has_member(c, "image"));
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "c1");
    g_autofree char *none = hostd_test_checkpoint_ids(f, "b1");
    assert_string_equal(none, "");

    call(f, "a1", "GET", "/v1/checkpoints", NULL, &listed);
    g_autoptr(JsonObject) l = expect(&listed, 200);
    JsonArray *list = json_object_get_array_member(l, "checkpoints");
    assert_int_equal(json_array_get_length(list), 1);
    assert_string_equal(json_object_get_string_member(json_array_get_object_element(list, 0), "id"),
                        "c1");
    assert_null(strstr(listed.body, f->dir));
    call(f, "b1", "GET", "/v1/checkpoints", NULL, &other);
    g_autoptr(JsonObject) ol = expect(&other, 200);
    assert_int_equal(json_array_get_length(json_object_get_array_member(ol, "checkpoints")), 0);

    g_autofree char *events = events_text(f);
    assert_non_null(strstr(events, "\"agent\":\"a1\",\"event\":\"checkpoint-create\","
                                   "\"state\":\"running\",\"caller\":\"guest\",\"outcome\":\"ok\","
                                   "\"detail\":\"c1 before-upgrade\"}"));
    hostd_test_assert_logged("guest api: agent 'a1': POST /v1/checkpoints 201");
}

/* What a guest may make is bounded: a memory checkpoint only while the agent has fewer than
 * HOSTD_GUEST_API_MEMORY_CHECKPOINTS_MAX, any only while it has fewer than
 * guest-checkpoint-max (64 by default); only the host removes them. */
static void
test_checkpoint_caps(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_auto(Reply) memory = {0};
    g_auto(Reply) disk = {0};
    g_auto(Reply) full = {0};

    for (int i = 0; i < HOSTD_GUEST_API_MEMORY_CHECKPOINTS_MAX; i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *warning = NULL;
        g_autoptr(GVariant) c = hostd_test_sink(
            hostd_checkpoint_create(f->ctx, "a1", NULL, FALSE, TRUE, &warning, &error));

        if (c == NULL)
            fail_msg("memory checkpoint: %s", error->message);
    }
    call(f, "a1", "POST", "/v1/checkpoints", "{\"memory\": true}", &memory);
    expect_error(&memory, 507, "no-resources", "memory checkpoints");
    call(f, "a1", "POST", "/v1/checkpoints", "{}", &disk);
    g_autoptr(JsonObject) o = expect(&disk, 201);

    assert_int_equal(f->ctx->config->guest_checkpoint_max, 64);
    hostd_test_checkpoint_n(f, "a1", 64 - HOSTD_GUEST_API_MEMORY_CHECKPOINTS_MAX - 1);
    call(f, "a1", "POST", "/v1/checkpoints", "{}", &full);
    expect_error(&full, 507, "no-resources", "64 checkpoints");
}

/* A checkpoint or restore asked from inside, retried while the one before still ends (409). */
static void
call_heavy(HostdTestFixture *f, const char *path, const char *body, Reply *ret)
{
    for (int i = 0; i < 50; i++) {
        reply_clear(ret);
        call(f, "a1", "POST", path, body, ret);
        if (ret->status != 409)
            return;
        g_usleep(100 * 1000);
    }
}

/* Waits for a1's restore asked from inside to be done. */
static void
wait_restore_done(HostdTestFixture *f)
{
    for (int i = 0; i < 150; i++) {
        g_auto(Reply) r = {0};

        call(f, "a1", "GET", "/v1/restore", NULL, &r);
        if (r.body != NULL && strstr(r.body, "\"state\":\"done\"") != NULL)
            return;
        g_usleep(100 * 1000);
    }
    fail_msg("a1's restore did not end");
}

/* A guest asking restores over and over (each takes an undo checkpoint; one with paths keeps the
 * VM running) and checkpoints: made up to guest-checkpoint-max, and then 200 more asks, each
 * refused (507 when the rate lets it through to the quota, 429 after), a restore with paths
 * before its 202; nothing made past the cap. */
static void
test_restore_quota(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    guint over_quota = 0;

    f->ctx->config->guest_checkpoint_max = 4;
    hostd_test_checkpoint_n(f, "a1", 2);
    for (int i = 0; i < 2; i++) {
        g_auto(Reply) r = {0};

        call_heavy(f, "/v1/restore", "{\"id\": \"c1\"}", &r);
        g_autoptr(JsonObject) o = expect(&r, 202);
        wait_restore_done(f);
    }
    g_autoptr(VmCheckpointSet) made = hostd_test_checkpoints(f, "a1");
    assert_int_equal(made->checkpoints->len, 4);
    g_autofree char *record = hostd_test_agent_file(f, "a1", "checkpoints.ini");
    g_autofree char *before = NULL;
    assert_true(g_file_get_contents(record, &before, NULL, NULL));

    for (int i = 0; i < 200; i++) {
        g_auto(Reply) r = {0};
        gboolean restore = i % 2 == 0;

        call_heavy(f, restore ? "/v1/restore" : "/v1/checkpoints",
                   restore ? "{\"id\": \"c1\", \"paths\": [\"/etc\"]}" : "{}", &r);
        if (r.status == 507) {
            expect_error(&r, 507, "no-resources", "guest-checkpoint-max 4");
            over_quota++;
        } else {
            expect_error(&r, 429, "busy", NULL);
        }
    }
    /* The rate's burst let the first ask through to the quota. */
    print_message("# of 200 asks past the cap, %u refused by the quota, the rest by the rate\n",
                  over_quota);
    assert_true(over_quota >= 1);
    g_autofree char *after = NULL;
    assert_true(g_file_get_contents(record, &after, NULL, NULL));
    assert_string_equal(after, before);
    g_autoptr(JsonObject) status = NULL;
    {
        g_auto(Reply) r = {0};
        /* The requests' own rate (guest-api-rate) is spent too: it comes back within a second. */
        for (int i = 0; i < 30 && r.status != 200; i++) {
            reply_clear(&r);
            g_usleep(100 * 1000);
            call(f, "a1", "GET", "/v1/restore", NULL, &r);
        }
        status = expect(&r, 200);
    }
    /* The last restore shown is the last one made, not a refused one. */
    JsonObject *last = json_object_get_object_member(status, "restore");
    assert_false(json_object_has_member(last, "paths"));
    hostd_test_assert_logged("POST /v1/restore 507");
}

/* The bytes a guest's checkpoints may take (guest-checkpoint-bytes): the checkpoints' images,
 * the active overlay the new one freezes, and with memory the guest's memory besides. */
static void
test_checkpoint_bytes_quota(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_auto(Reply) over = {0};
    g_auto(Reply) memory = {0};
    g_auto(Reply) fits = {0};

    hostd_test_checkpoint_n(f, "a1", 1);
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    g_autofree char *image =
        vm_checkpoint_set_path(set, ((VmCheckpoint *)set->checkpoints->pdata[0])->image);
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    /* The guest wrote something since. */
    g_autofree char *junk = g_malloc0(256 * 1024);
    memset(junk, 'x', 256 * 1024);
    {
        FILE *out = fopen(active, "ae");
        assert_non_null(out);
        assert_int_equal(fwrite(junk, 1, 256 * 1024, out), 256 * 1024);
        assert_int_equal(fclose(out), 0);
    }
    guint64 needed = hostd_file_allocated(image) + hostd_file_allocated(active);
    assert_true(needed >= 256 * 1024);

    f->ctx->config->guest_checkpoint_bytes = needed - 1;
    call(f, "a1", "POST", "/v1/checkpoints", "{}", &over);
    expect_error(&over, 507, "no-resources", "guest-checkpoint-bytes");
    f->ctx->config->guest_checkpoint_bytes = needed;
    call(f, "a1", "POST", "/v1/checkpoints", "{\"memory\": true}", &memory);
    expect_error(&memory, 507, "no-resources", "guest's memory");
    g_autofree char *refused = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(refused, "c1");
    call_heavy(f, "/v1/checkpoints", "{}", &fits);
    g_autoptr(JsonObject) o = expect(&fits, 201);
    g_autofree char *made = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(made, "c1 c2");
}

/* Paths that name another agent or a policy, methods a path does not take, bodies that are not
 * what a request takes: each a JSON error, nothing changed, and the server answers on. */
static void
test_refusals(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) b1 = api_agent(f, "b1", HOSTD_TEST_RUNNING);
    g_autofree char *policy = hostd_test_egress_text(f, "a1");
    static const struct {
        const char *method, *path, *body;
        guint status;
        const char *name, *needle;
    } cases[] = {
        {"GET", "/v1/nope", NULL, 404, "not-found", "no /v1/nope"},
        {"GET", "/v1/agents/b1/info", NULL, 404, "not-found", NULL},
        {"POST", "/v1/agents/b1/checkpoints", "{}", 404, "not-found", NULL},
        {"GET", "/v1/info/../../b1", NULL, 404, "not-found", NULL},
        {"POST", "/v1/egress", "{\"allow\": [\"any\"]}", 405, "invalid-argument", "GET only"},
        {"PUT", "/v1/egress", "{\"allow\": [\"any\"]}", 405, "invalid-argument", NULL},
        {"DELETE", "/v1/checkpoints", NULL, 405, "invalid-argument", "GET, POST"},
        {"POST", "/v1/checkpoints", "{\"name\": \"b1\"}", 400, "invalid-argument",
         "no field 'name'"},
        {"POST", "/v1/checkpoints", "not json", 400, "protocol", "not JSON"},
        {"POST", "/v1/restore", "{\"id\": \"c9\"}", 404, "not-found", "no checkpoint 'c9'"},
        {"POST", "/v1/restore", "{\"id\": \"c1\", \"agent\": \"b1\"}", 400, "invalid-argument",
         "no field 'agent'"},
        {"POST", "/v1/keep-awake", "{\"seconds\": 0}", 400, "invalid-argument", "1 to 86400"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(Reply) r = {0};

        print_message("# %s %s\n", cases[i].method, cases[i].path);
        call(f, "a1", cases[i].method, cases[i].path, cases[i].body, &r);
        expect_error(&r, cases[i].status, cases[i].name, cases[i].needle);
        if (cases[i].status == 405)
            assert_non_null(soup_message_headers_get_one(r.headers, "Allow"));
    }
    g_autofree char *after = hostd_test_egress_text(f, "a1");
    assert_string_equal(after, policy);
    g_autofree char *a_ids = hostd_test_checkpoint_ids(f, "a1");
    g_autofree char *b_ids = hostd_test_checkpoint_ids(f, "b1");
    assert_string_equal(a_ids, "");
    assert_string_equal(b_ids, "");
    /* A refused restore is an event all the same, as the host's request is. */
    g_autofree char *events = events_text(f);
    assert_non_null(strstr(events, "\"event\":\"checkpoint-restore\""));
    assert_null(strstr(events, "\"agent\":\"b1\""));

    /* Whatever libsoup itself refuses is an answer too. */
    int fd = api_connect(f, "a1");
    g_auto(Reply) garbage = {0};
    vm_test_send_text(fd, "hello there\r\n\r\n");
    read_reply(fd, &garbage);
    close(fd);
    assert_int_equal(garbage.status, 400);

    g_auto(Reply) ok = {0};
    call(f, "a1", "GET", "/v1/info", NULL, &ok);
    g_autoptr(JsonObject) o = expect(&ok, 200);
}

/* A body past 16 KiB: 413, announced or chunked; one announced past 1 MiB is not read at all;
 * the server answers on. */
static void
test_body_limits(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    gsize mib = 1024 * 1024;
    g_autofree char *big = g_malloc(mib);
    g_autofree char *head = g_strdup_printf("POST /v1/checkpoints HTTP/1.1\r\nHost: 10.0.2.100\r\n"
                                            "Content-Type: application/json\r\n"
                                            "Content-Length: %zu\r\n\r\n",
                                            mib);
    g_auto(Reply) r = {0};
    int fd;

    memset(big, ' ', mib);
    big[0] = '{';
    big[mib - 1] = '}';
    fd = api_connect(f, "a1");
    vm_test_send_text(fd, head);
    GThread *sender = vm_test_send_thread(fd, (const guint8 *)big, mib);
    read_reply(fd, &r);
    assert_int_equal(GPOINTER_TO_SIZE(g_thread_join(sender)), mib);
    close(fd);
    expect_error(&r, 413, "protocol", "longer than 16384 bytes");

    /* Chunked: counted as it comes. */
    g_autoptr(GString) chunked = g_string_new("POST /v1/checkpoints HTTP/1.1\r\nHost: x\r\n"
                                              "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 8; i++) {
        g_string_append_printf(chunked, "%x\r\n", 4096);
        for (int j = 0; j < 4096; j++)
            g_string_append_c(chunked, ' ');
        g_string_append(chunked, "\r\n");
    }
    g_string_append(chunked, "0\r\n\r\n");
    g_auto(Reply) rc = {0};
    fd = api_connect(f, "a1");
    vm_test_send_text(fd, chunked->str);
    read_reply(fd, &rc);
    close(fd);
    expect_error(&rc, 413, "protocol", NULL);

    /* Announced past 1 MiB: the connection is cut, unanswered, before the body. */
    g_auto(Reply) cut = {0};
    fd = api_connect(f, "a1");
    vm_test_send_text(fd, "POST /v1/checkpoints HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          "1073741824\r\n\r\n{");
    read_reply(fd, &cut);
    close(fd);
    assert_int_equal(cut.status, 0);

    g_auto(Reply) ok = {0};
    call(f, "a1", "GET", "/v1/info", NULL, &ok);
    g_autoptr(JsonObject) o = expect(&ok, 200);
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "");
}

/* 100 requests at once: the burst passes, the rest get 429 with Retry-After; the log stays short;
 * a moment later the agent is answered again. */
static void
test_rate_limit(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    guint ok = 0, limited = 0;

    for (int i = 0; i < 100; i++) {
        g_auto(Reply) r = {0};

        call(f, "a1", "GET", "/v1/info", NULL, &r);
        if (r.status == 200) {
            ok++;
        } else {
            expect_error(&r, 429, "busy", "at most 5 a second, in bursts of 20");
            assert_true(atoi(soup_message_headers_get_one(r.headers, "Retry-After")) >= 1);
            limited++;
        }
    }
    print_message("# %u answered, %u limited\n", ok, limited);
    /* The burst, and what the rate refills while the loop runs (a slow host: a few seconds). */
    assert_true(ok >= 20 && ok <= 60);
    assert_int_equal(ok + limited, 100);

    g_autofree char *log = hostd_test_log_text();
    guint lines_429 = 0;
    for (const char *p = log; (p = strstr(p, " 429 (")) != NULL; p++)
        lines_429++;
    assert_true(lines_429 >= 1 && lines_429 <= 10);

    g_usleep(1500 * 1000);
    g_auto(Reply) again = {0};
    call(f, "a1", "GET", "/v1/info", NULL, &again);
    g_autoptr(JsonObject) o = expect(&again, 200);
}

/* Connections beyond HOSTD_GUEST_API_CONNECTIONS get 503; those past twice that are closed; one
 * that never sends its request is cut after HOSTD_GUEST_API_REQUEST_MS. */
static void
test_connection_limits(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    int idle[HOSTD_GUEST_API_CONNECTIONS];
    g_auto(Reply) busy = {0};
    gint64 t0 = g_get_monotonic_time();

    for (int i = 0; i < HOSTD_GUEST_API_CONNECTIONS; i++)
        idle[i] = api_connect(f, "a1");
    /* A half-sent request holds its connection too. */
    vm_test_send_text(idle[0], "GET /v1/info HTTP/1.1\r\n");
    g_usleep(200 * 1000);
    call(f, "a1", "GET", "/v1/info", NULL, &busy);
    expect_error(&busy, 503, "busy", "connections at once");
    assert_non_null(soup_message_headers_get_one(busy.headers, "Retry-After"));

    /* The silent ones are cut once their time is up. */
    for (int i = 0; i < HOSTD_GUEST_API_CONNECTIONS; i++) {
        g_autoptr(GString) rest = vm_test_read_until(idle[i], NULL, READ_TIMEOUT_MS, NULL);
        assert_null(strstr(rest->str, "HTTP/1.1 200"));
        close(idle[i]);
    }
    gint64 waited_ms = (g_get_monotonic_time() - t0) / 1000;
    assert_true(waited_ms >= HOSTD_GUEST_API_REQUEST_MS - 500);
    assert_true(waited_ms <= HOSTD_GUEST_API_REQUEST_MS + 3000);
    hostd_test_assert_logged("no whole request within 10 s");

    g_auto(Reply) ok = {0};
    for (int i = 0; i < 20 && ok.status != 200; i++) {
        reply_clear(&ok);
        g_usleep(100 * 1000);
        call(f, "a1", "GET", "/v1/info", NULL, &ok);
    }
    g_autoptr(JsonObject) o = expect(&ok, 200);
}

/* ---- keep-awake ----------------------------------------------------------------------------- */

/* A keep-awake asked from inside holds an idle agent awake until its deadline, and no longer;
 * it never shortens a hold the host made. */
static void
test_keep_awake(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) kept = api_agent(f, "kept", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) idle = api_agent(f, "idle", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) host = api_agent(f, "host", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    g_auto(Reply) set = {0};
    g_auto(Reply) got = {0};
    g_auto(Reply) info = {0};
    g_auto(Reply) held = {0};

    start_power(f);
    for (int i = 0; i < 3; i++) {
        const char *name = i == 0 ? "kept" : i == 1 ? "idle" : "host";

        hostd_test_fake_idle_cpu(name);
        set_idle(f, name, 1);
    }
    call(f, "kept", "POST", "/v1/keep-awake", "{\"seconds\": 10}", &set);
    g_autoptr(JsonObject) o = expect(&set, 200);
    JsonObject *k = json_object_get_object_member(o, "keep_awake");
    assert_true(json_object_get_int_member(k, "seconds_left") <= 10);
    assert_true(json_object_get_int_member(k, "seconds_left") >= 9);
    assert_true(g_str_has_suffix(json_object_get_string_member(k, "until"), "Z"));
    call(f, "kept", "GET", "/v1/keep-awake", NULL, &got);
    g_autoptr(JsonObject) og = expect(&got, 200);
    assert_true(json_object_has_member(json_object_get_object_member(og, "keep_awake"), "until"));
    call(f, "kept", "GET", "/v1/info", NULL, &info);
    g_autoptr(JsonObject) oi = expect(&info, 200);
    assert_false(
        json_object_get_null_member(json_object_get_object_member(oi, "agent"), "keep_awake"));

    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "host", 0, FALSE, &error));
    assert_non_null(v);
    call(f, "host", "POST", "/v1/keep-awake", "{\"seconds\": 1}", &held);
    g_autoptr(JsonObject) oh = expect(&held, 200);
    assert_true(json_object_get_boolean_member(json_object_get_object_member(oh, "keep_awake"),
                                               "indefinite"));

    if (!hostd_test_wait_state(f, "idle", "paused", IDLE_WAIT_MS))
        fail_msg("the idle agent was not paused");
    assert_string_equal(hostd_test_domain_state(f, "kept"), "running");
    if (!hostd_test_wait_state(f, "kept", "paused", IDLE_WAIT_MS))
        fail_msg("the kept agent was not paused once its keep-awake ran out");
    assert_string_equal(hostd_test_domain_state(f, "host"), "running");

    g_autofree char *events = events_text(f);
    assert_non_null(strstr(events, "\"agent\":\"kept\",\"event\":\"agent-keep-awake\","
                                   "\"state\":\"running\",\"caller\":\"guest\",\"outcome\":\"ok\","
                                   "\"detail\":\"for 10s\"}"));
}

/* ---- restore -------------------------------------------------------------------------------- */

static JsonObject *
restore_status(HostdTestFixture *f, const char *name)
{
    g_auto(Reply) r = {0};

    call(f, name, "GET", "/v1/restore", NULL, &r);
    g_autoptr(JsonObject) o = expect(&r, 200);
    if (json_object_get_null_member(o, "restore"))
        return NULL;
    return json_object_ref(json_object_get_object_member(o, "restore"));
}

/* The 202 says what will happen before it does; the restore then runs as the host's would (an
 * undo checkpoint, a new overlay, a boot), one at a time, and its outcome can be read after. */
static void
test_restore(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) b1 = api_agent(f, "b1", HOSTD_TEST_STOPPED);
    g_auto(Reply) accepted = {0};
    g_auto(Reply) second = {0};
    g_auto(Reply) paths = {0};
    g_autoptr(JsonObject) status = NULL;

    assert_null(restore_status(f, "a1"));
    hostd_test_checkpoint_n(f, "a1", 2);
    hostd_test_checkpoint_n(f, "b1", 1);
    call(f, "b1", "POST", "/v1/restore", "{\"id\": \"c1\", \"paths\": [\"/etc\"]}", &paths);
    expect_error(&paths, 409, "bad-state", "not running");

    call(f, "a1", "POST", "/v1/restore", "{\"id\": \"c1\"}", &accepted);
    g_autoptr(JsonObject) o = expect(&accepted, 202);
    JsonObject *r = json_object_get_object_member(o, "restore");
    assert_string_equal(json_object_get_string_member(r, "id"), "c1");
    assert_string_equal(json_object_get_string_member(r, "state"), "accepted");
    assert_non_null(strstr(json_object_get_string_member(r, "what"), "boots from c1"));
    /* Nothing has happened yet when the answer is read. */
    g_autofree char *before = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(before, "c1 c2");
    call(f, "a1", "POST", "/v1/restore", "{\"id\": \"c2\"}", &second);
    expect_error(&second, 409, "busy", "under way");

    for (int i = 0; i < 150; i++) {
        g_clear_pointer(&status, json_object_unref);
        status = restore_status(f, "a1");
        if (status != NULL && g_str_equal(json_object_get_string_member(status, "state"), "done"))
            break;
        g_usleep(100 * 1000);
    }
    assert_non_null(status);
    assert_string_equal(json_object_get_string_member(status, "state"), "done");
    assert_string_equal(json_object_get_string_member(status, "undo"), "c3");
    g_autofree char *after = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(after, "c1 c2 c3");
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
    assert_string_equal(set->active_parent, "c1");
    g_autofree char *b_after = hostd_test_checkpoint_ids(f, "b1");
    assert_string_equal(b_after, "c1");

    g_autofree char *events = events_text(f);
    assert_non_null(strstr(events, "\"event\":\"checkpoint-restore\",\"state\":\"running\","
                                   "\"caller\":\"guest\",\"outcome\":\"ok\",\"detail\":\"c1 "
                                   "(undo c3)\"}"));
    hostd_test_assert_logged("restore to c1 asked from inside: done; undo with c3");

    /* Once it ended, another may be asked. */
    g_auto(Reply) third = {0};
    for (int i = 0; i < 20; i++) {
        reply_clear(&third);
        call(f, "a1", "POST", "/v1/restore", "{\"id\": \"c9\"}", &third);
        if (third.status != 409)
            break;
        g_usleep(100 * 1000);
    }
    expect_error(&third, 404, "not-found", "c9");
}

/* ---- the socket: the real helper, start, stop, off ------------------------------------------ */

/* QEMU's helper (vm-egress-connect) with a socketpair as its stdio hands the guest's end over. */
static void
test_real_helper(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autofree char *helper =
        g_build_filename(env_or("VM_BUILD_DIR", "."), "egress", "vm-egress-connect", NULL);
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_API_SOCKET);
    g_auto(Reply) r = {0};
    int guest, status = -1;

    assert_int_equal(vm_test_file_mode(path), 0600);
    guest = vm_test_run_on_socketpair(helper, path, &status);
    assert_int_equal(status, 0);
    vm_test_send_text(guest, "GET /v1/info HTTP/1.0\r\n\r\n");
    read_reply(guest, &r);
    close(guest);
    g_autoptr(JsonObject) o = expect(&r, 200);
    assert_string_equal(
        json_object_get_string_member(json_object_get_object_member(o, "agent"), "name"), "a1");
}

/* rm (agent_removed) closes the socket and what is open on it; start makes a lost socket again;
 * nothing but the handed-over connection is taken. */
static void
test_start_stop(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_API_SOCKET);
    g_autoptr(GError) error = NULL;
    int sv[2];

    int open_fd = api_connect(f, "a1");
    g_usleep(100 * 1000);
    hostd_guest_api_agent_stop(f->ctx, "a1");
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));
    g_autoptr(GString) rest = vm_test_read_until(open_fd, NULL, READ_TIMEOUT_MS, NULL);
    assert_int_equal(rest->len, 0);
    close(open_fd);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(vm_fd_pass(path, sv[1]), -ENOENT);
    close(sv[0]);
    close(sv[1]);
    hostd_guest_api_agent_stop(f->ctx, "a1");
    hostd_guest_api_agent_stop(f->ctx, "nobody");

    assert_true(hostd_guest_api_agent_start(f->ctx, a1, &error));
    g_unlink(path);
    assert_true(hostd_guest_api_agent_start(f->ctx, a1, &error));
    assert_true(g_file_test(path, G_FILE_TEST_EXISTS));
    g_auto(Reply) r = {0};
    call(f, "a1", "GET", "/v1/info", NULL, &r);
    g_autoptr(JsonObject) o = expect(&r, 200);

    /* A client that speaks instead of handing a connection over is dropped. */
    g_autoptr(GString) dropped = NULL;
    int direct = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    g_strlcpy(sun.sun_path, path, sizeof(sun.sun_path));
    assert_int_equal(connect(direct, (struct sockaddr *)&sun, sizeof(sun)), 0);
    vm_test_send_text(direct, "GET /v1/info HTTP/1.0\r\n\r\n");
    dropped = vm_test_read_until(direct, NULL, READ_TIMEOUT_MS, NULL);
    assert_int_equal(dropped->len, 0);
    close(direct);
    hostd_test_assert_logged("handed nothing over");
}

/* Waits up to @ms for @name's worker to run with another pid than @old. */
static GPid
wait_new_worker(HostdTestFixture *f, const char *name, GPid old, guint ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    while (g_get_monotonic_time() < deadline) {
        GPid pid = hostd_guest_api_pid(f->ctx, name);

        if (pid > 0 && pid != old)
            return pid;
        g_usleep(20 * 1000);
    }
    fail_msg("no new in-guest API worker for %s within %u ms", name, ms);
    return 0;
}

/* The guest's bytes are read by a worker process of the agent's own, confined (no_new_privs,
 * seccomp, no capabilities, not root when hostd is); killed, it is replaced, and a connection
 * made meanwhile waits in the socket's backlog for the new one. The rate is hostd's: a new
 * worker does not start with a full one. */
static void
test_worker(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = NULL;
    g_auto(Reply) first = {0};
    g_auto(Reply) waited = {0};
    g_auto(Reply) limited = {0};
    GPid pid, again;
    int fd;

    f->ctx->config->guest_api_rate = 1;
    f->ctx->config->guest_api_burst = 3;
    a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    pid = hostd_guest_api_pid(f->ctx, "a1");
    assert_true(pid > 0);
    assert_int_not_equal(pid, getpid());
    g_autofree char *nnp = vm_test_proc_status(pid, "NoNewPrivs");
    g_autofree char *seccomp = vm_test_proc_status(pid, "Seccomp");
    g_autofree char *cap_eff = vm_test_proc_status(pid, "CapEff");
    g_autofree char *uid = vm_test_proc_status(pid, "Uid");
    assert_string_equal(nnp, "1");
    assert_string_equal(seccomp, "2");
    assert_string_equal(cap_eff, "0000000000000000");
    if (geteuid() == 0)
        assert_false(g_str_has_prefix(uid, "0\t") || g_str_has_prefix(uid, "0 "));

    call(f, "a1", "GET", "/v1/info", NULL, &first);
    g_autoptr(JsonObject) o = expect(&first, 200);
    g_autofree char *rss = vm_test_proc_status(pid, "VmRSS");
    print_message("# the worker's resident memory after a request: %s\n", rss);

    assert_int_equal(kill(pid, SIGKILL), 0);
    fd = api_connect(f, "a1");
    vm_test_send_text(fd, "GET /v1/keep-awake HTTP/1.1\r\nHost: 10.0.2.100\r\n\r\n");
    read_reply(fd, &waited);
    close(fd);
    g_autoptr(JsonObject) w = expect(&waited, 200);
    assert_true(json_object_has_member(w, "keep_awake"));
    again = wait_new_worker(f, "a1", pid, 5000);
    vm_test_assert_process_gone(pid, 5000);

    /* Two of the burst of three are spent; the third and then none. */
    for (int i = 0; i < 5 && limited.status != 429; i++) {
        reply_clear(&limited);
        call(f, "a1", "GET", "/v1/info", NULL, &limited);
    }
    expect_error(&limited, 429, "busy", "at most 1 a second, in bursts of 3");
    assert_int_equal(hostd_guest_api_pid(f->ctx, "a1"), again);

    hostd_guest_api_agent_stop(f->ctx, "a1");
    vm_test_assert_process_gone(again, 5000);
    assert_int_equal(hostd_guest_api_pid(f->ctx, "a1"), 0);
}

/* As root, each agent's API worker runs as an id of its own from worker-ids (read from /proc):
 * not root, not egress-user, not its QEMU's, not its SSH or egress worker's, not another
 * agent's; with worker-ids = off, as egress-user. */
static void
test_worker_own_id(void **state)
{
    if (geteuid() != 0)
        skip();
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) a2 = api_agent(f, "a2", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    gboolean change = FALSE;
    uid_t egress_uid = 0;
    gid_t egress_gid = 0;
    guint ids[2] = {0, 0};
    GPid pid;

    assert_true(f->ctx->config->worker_id_min != 0);
    for (guint i = 0; i < 2; i++) {
        const HostdAgentRecord *r = i == 0 ? a1 : a2;
        guint uid = 0, gid = 0, api = 0, other = 0, other_gid = 0;

        pid = hostd_guest_api_pid(f->ctx, r->name);
        assert_true(pid > 0);
        vm_test_proc_ids(pid, &uid, &gid);
        ids[i] = uid;
        assert_int_equal(uid, gid);
        assert_true(uid != 0 && uid >= f->ctx->config->worker_id_min &&
                    uid <= f->ctx->config->worker_id_max);
        assert_true(r->agent_id == 0 || uid != r->agent_id);
        assert_true(hostd_confine_worker_user(f->ctx, r->name, r->agent_id, HOSTD_WORKER_API,
                                              &change, &api, &gid, &error));
        assert_int_equal(uid, api);
        for (HostdWorkerKind kind = HOSTD_WORKER_SSH; kind <= HOSTD_WORKER_EGRESS; kind++) {
            assert_true(hostd_confine_worker_user(f->ctx, r->name, r->agent_id, kind, &change,
                                                  &other, &other_gid, &error));
            assert_int_not_equal(uid, other);
        }
    }
    assert_int_not_equal(ids[0], ids[1]);
    assert_true(hostd_config_worker_user(f->ctx->config, &change, &egress_uid, &egress_gid, NULL));
    assert_int_not_equal(ids[0], egress_uid);

    /* worker-ids = off: egress-user, as before. */
    hostd_guest_api_agent_stop(f->ctx, "a1");
    f->ctx->config->worker_id_min = 0;
    f->ctx->config->worker_id_max = 0;
    assert_true(hostd_guest_api_agent_start(f->ctx, a1, &error));
    pid = hostd_guest_api_pid(f->ctx, "a1");
    assert_true(pid > 0);
    {
        guint uid = 0, gid = 0;

        vm_test_proc_ids(pid, &uid, &gid);
        assert_int_equal(uid, egress_uid);
    }
}

/* A worker that stops answering (SIGSTOP, as its agent's QEMU could send if it shared its id,
 * or a loop) is found out by hostd's ping: killed and replaced within the ping interval and the
 * answer deadline (5 s + 10 s; a new start besides), and a guest call made while it was stopped,
 * waiting in the socket's backlog, is answered by the new one, as is the next. */
static void
test_worker_stopped(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    g_auto(Reply) during = {0};
    g_auto(Reply) after = {0};
    GPid pid = hostd_guest_api_pid(f->ctx, "a1");
    GPid again;
    gint64 stopped;
    int fd;

    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    stopped = g_get_monotonic_time();
    fd = api_connect(f, "a1");
    vm_test_send_text(fd, "GET /v1/info HTTP/1.1\r\nHost: 10.0.2.100\r\n\r\n");
    again = wait_new_worker(f, "a1", pid, 20000);
    print_message("# a stopped worker replaced after %.1f s\n",
                  (double)(g_get_monotonic_time() - stopped) / G_USEC_PER_SEC);
    assert_true(g_get_monotonic_time() - stopped <= 18 * G_USEC_PER_SEC);
    vm_test_assert_process_gone(pid, 5000);
    read_reply(fd, &during);
    close(fd);
    g_autoptr(JsonObject) d = expect(&during, 200);
    call(f, "a1", "GET", "/v1/info", NULL, &after);
    g_autoptr(JsonObject) o = expect(&after, 200);
    assert_int_equal(hostd_guest_api_pid(f->ctx, "a1"), again);
}

/* A worker that sends hostd a call no worker of ours makes (one its guest took over) is killed
 * and replaced, and nothing of that call is done: hostd checks each call, it does not trust the
 * worker's parse. */
static void
test_worker_broken(void **state)
{
    HostdTestFixture *f = *state;
    const char *bad = g_getenv("VM_TEST_GUEST_API_BAD_WORKER");
    g_autoptr(HostdAgentRecord) a1 = NULL;
    guint broken = 0;
    GPid pid;

    if (bad == NULL)
        fail_msg("VM_TEST_GUEST_API_BAD_WORKER is not set (run through meson test)");
    g_setenv("VM_GUEST_API_WORKER", bad, TRUE);
    a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    pid = hostd_guest_api_pid(f->ctx, "a1");
    hostd_test_assert_logged(
        "guest api: agent 'a1': its worker broke the protocol (endpoint 3 for GET "
        "/v1/info); it is replaced");
    /* Replaced: the next one is caught too (each is ended at once; only the log sees them). */
    for (int i = 0; i < 100 && broken < 2; i++) {
        g_autofree char *text = hostd_test_log_text();

        broken = 0;
        for (const char *p = text; (p = strstr(p, "its worker broke the protocol")) != NULL; p++)
            broken++;
        g_usleep(100 * 1000);
    }
    assert_true(broken >= 2);
    if (pid > 0)
        vm_test_assert_process_gone(pid, 5000);
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "a1");
    assert_string_equal(ids, "");
    g_autofree char *log = hostd_test_log_text();
    assert_null(strstr(log, "\x1b"));
    g_unsetenv("VM_GUEST_API_WORKER");
    hostd_guest_api_agent_stop(f->ctx, "a1");
}

/* What the component puts in a new agent's domain and seed, and that guest-api = off puts
 * nothing anywhere. */
static void
test_component(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f, "a1");
    g_autofree char *sock = hostd_test_agent_file(f, "a1", HOSTD_AGENT_API_SOCKET);
    g_autofree char *quoted = g_shell_quote(sock);
    g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;
    VmDomainSpec domain = {0};
    VmSeedSpec seed = {0};

    /* The test driver: QEMU's helper cannot be vouched for, so no forward. */
    g_autofree char *none = hostd_guest_api_command(f->ctx, r);
    assert_null(none);
    f->ctx->lv->qemu_may_spawn = TRUE;
    hostd_guest_api_component.agent_domain(f->ctx, r, &domain, keep);
    assert_non_null(domain.guest_api_command);
    assert_true(g_str_has_suffix(domain.guest_api_command, quoted));
    assert_non_null(strstr(domain.guest_api_command, "vm-egress-connect"));
    hostd_guest_api_component.agent_seed(f->ctx, r, &seed, keep);
    assert_true(seed.guest_tool);
    assert_string_equal(seed.guest_api_host, "10.0.2.100");

    f->ctx->config->guest_api = FALSE;
    domain = (VmDomainSpec){0};
    seed = (VmSeedSpec){0};
    hostd_guest_api_component.agent_domain(f->ctx, r, &domain, keep);
    hostd_guest_api_component.agent_seed(f->ctx, r, &seed, keep);
    assert_null(domain.guest_api_command);
    assert_false(seed.guest_tool);
    assert_true(hostd_guest_api_agent_start(f->ctx, r, &error));
    assert_false(g_file_test(sock, G_FILE_TEST_EXISTS));
    f->ctx->lv->qemu_may_spawn = FALSE;
}

/* ---- vmctl-guest ---------------------------------------------------------------------------- */

/* QEMU's part on a TCP port: each connection to 127.0.0.1:port is handed over to the agent's
 * api.sock, as the guest forward hands each connection to 10.0.2.100:80. */
typedef struct {
    int listen_fd;
    guint16 port;
    char *socket_path;
    GThread *thread;
} Forward;

static gpointer
forward_thread(gpointer data)
{
    Forward *fw = data;

    for (;;) {
        int fd = accept4(fw->listen_fd, NULL, NULL, SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        (void)vm_fd_pass(fw->socket_path, fd);
        close(fd);
    }
}

static Forward *
forward_new(HostdTestFixture *f, const char *name)
{
    Forward *fw = g_new0(Forward, 1);

    fw->listen_fd = vm_test_listen_loopback(&fw->port);
    fw->socket_path = hostd_test_agent_file(f, name, HOSTD_AGENT_API_SOCKET);
    fw->thread = g_thread_new("forward", forward_thread, fw);
    return fw;
}

static void
forward_free(Forward *fw)
{
    shutdown(fw->listen_fd, SHUT_RDWR);
    g_thread_join(fw->thread);
    close(fw->listen_fd);
    g_free(fw->socket_path);
    g_free(fw);
}

typedef struct {
    int status;
    char *out;
    char *err;
} Run;

static void
run_clear(Run *run)
{
    g_clear_pointer(&run->out, g_free);
    g_clear_pointer(&run->err, g_free);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(Run, run_clear)

/* Runs the source tree's vmctl-guest with @args (NULL-terminated) against 127.0.0.1:@port. */
static void
run_tool(guint16 port, Run *ret, const char *first, ...)
{
    g_autofree char *script =
        g_build_filename(env_or("VM_SOURCE_DIR", VM_SOURCE_DIR), "cloud-init", "vmctl-guest", NULL);
    g_autoptr(GPtrArray) argv = g_ptr_array_new();
    g_autofree char *api = g_strdup_printf("127.0.0.1:%u", port);
    g_auto(GStrv) env = g_environ_setenv(g_get_environ(), "VMCTL_GUEST_API", api, TRUE);
    g_autoptr(GError) error = NULL;
    int wait_status = 0;
    va_list ap;

    g_ptr_array_add(argv, "bash");
    g_ptr_array_add(argv, script);
    va_start(ap, first);
    for (const char *a = first; a != NULL; a = va_arg(ap, const char *))
        g_ptr_array_add(argv, (gpointer)a);
    va_end(ap);
    g_ptr_array_add(argv, NULL);
    *ret = (Run){0};
    if (!g_spawn_sync(NULL, (char **)argv->pdata, env, G_SPAWN_SEARCH_PATH, NULL, NULL, &ret->out,
                      &ret->err, &wait_status, &error))
        fail_msg("cannot run vmctl-guest: %s", error->message);
    ret->status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
}

/* vmctl-guest over the API as a guest has it: vmctl's words, the answers formatted or as JSON,
 * vmctl's exit statuses for the errors, and 12 where nothing answers. */
static void
test_vmctl_guest(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = api_agent(f, "a1", HOSTD_TEST_RUNNING);
    Forward *fw = forward_new(f, "a1");
    g_autofree char *python = g_find_program_in_path("python3");

    start_power(f);
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "--json", "info", NULL);
        assert_int_equal(r.status, 0);
        g_autoptr(JsonObject) o = json_object(r.out);
        assert_string_equal(
            json_object_get_string_member(json_object_get_object_member(o, "agent"), "name"), "a1");
    }
    if (python != NULL) {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "info", NULL);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "name         a1\n"));
        assert_non_null(strstr(r.out, "state        running\n"));
    }
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "checkpoint", "--label", "before \"upgrade\" é", NULL);
        assert_int_equal(r.status, 0);
        assert_string_equal(r.out, "c1\n");
        assert_non_null(strstr(r.err, "vmctl-guest: warning: "));
        g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "a1");
        const VmCheckpoint *c = set->checkpoints->pdata[0];
        assert_string_equal(c->label, "before \"upgrade\" é");
    }
    if (python != NULL) {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "checkpoints", NULL);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "before \"upgrade\" é"));
        assert_true(g_str_has_prefix(r.out, "ID "));
    }
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "restore", "c9", NULL);
        assert_int_equal(r.status, 3);
        assert_string_equal(r.err, "vmctl-guest: agent 'a1' has no checkpoint 'c9'\n");
    }
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "--json", "keep-awake", "--for", "2m", NULL);
        assert_int_equal(r.status, 0);
        g_autoptr(JsonObject) o = json_object(r.out);
        JsonObject *k = json_object_get_object_member(o, "keep_awake");
        assert_true(json_object_get_int_member(k, "seconds_left") > 110);
    }
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "keep-awake", "--for", "25h", NULL);
        assert_int_equal(r.status, 2);
        assert_non_null(strstr(r.err, "1 to 86400"));
    }
    if (python != NULL) {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "egress", NULL);
        assert_int_equal(r.status, 0);
        assert_non_null(strstr(r.out, "allow  none\n"));
    }
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "frobnicate", NULL);
        assert_int_equal(r.status, 2);
        g_auto(Run) bad = {0};
        run_tool(fw->port, &bad, "keep-awake", "--for", "soon", NULL);
        assert_int_equal(bad.status, 2);
        g_auto(Run) help = {0};
        run_tool(fw->port, &help, "--help", NULL);
        assert_int_equal(help.status, 0);
        assert_non_null(strstr(help.out, "usage: vmctl-guest"));
    }
    /* hostd's side gone: the connection opens (QEMU's does) but nobody answers. */
    hostd_guest_api_agent_stop(f->ctx, "a1");
    {
        g_auto(Run) r = {0};
        run_tool(fw->port, &r, "info", NULL);
        assert_int_equal(r.status, 12);
        assert_non_null(strstr(r.err, "does not answer"));
    }
    forward_free(fw);
    {
        g_auto(Run) r = {0};
        run_tool(vm_test_free_port(), &r, "info", NULL);
        assert_int_equal(r.status, 12);
    }
}

int
main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, hostd_test_setup, hostd_test_teardown)
    const struct CMUnitTest tests[] = {
        T(test_info_own_agent), T(test_checkpoint),    T(test_checkpoint_caps),
        T(test_refusals),       T(test_restore_quota), T(test_checkpoint_bytes_quota),
        T(test_body_limits),    T(test_rate_limit),    T(test_connection_limits),
        T(test_keep_awake),     T(test_restore),       T(test_real_helper),
        T(test_start_stop),     T(test_component),     T(test_vmctl_guest),
        T(test_worker),         T(test_worker_broken), T(test_worker_own_id),
        T(test_worker_stopped),
    };
#undef T

    return cmocka_run_group_tests(tests, NULL, NULL);
}
