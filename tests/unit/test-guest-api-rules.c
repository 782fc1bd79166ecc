/* The in-guest API's rules without a server (hostd-guest-api-rules.c): the route table, the rate
 * limiter, request bodies good and bad, error statuses, host paths taken out of messages, and
 * the JSON shapes of answers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-guest-api-rules.h"
#include "vm-protocol.h"
#include "test-common.h"

/* ---- routes --------------------------------------------------------------------------------- */

static void
test_routes(void **state)
{
    static const struct {
        const char *method, *path;
        HostdGuestApiEndpoint endpoint;
        HostdGuestApiFlags flags;
        const char *event;
    } good[] = {
        {"GET", "/v1/info", HOSTD_GUEST_API_INFO, HOSTD_GUEST_API_READS, NULL},
        {"GET", "/v1/checkpoints", HOSTD_GUEST_API_CHECKPOINT_LIST, HOSTD_GUEST_API_READS, NULL},
        {"POST", "/v1/checkpoints", HOSTD_GUEST_API_CHECKPOINT_CREATE,
         HOSTD_GUEST_API_CHANGES | HOSTD_GUEST_API_HEAVY | HOSTD_GUEST_API_BODY,
         "checkpoint-create"},
        {"GET", "/v1/restore", HOSTD_GUEST_API_RESTORE_STATUS, HOSTD_GUEST_API_READS, NULL},
        {"POST", "/v1/restore", HOSTD_GUEST_API_RESTORE,
         HOSTD_GUEST_API_CHANGES | HOSTD_GUEST_API_HEAVY | HOSTD_GUEST_API_BODY,
         "checkpoint-restore"},
        {"GET", "/v1/keep-awake", HOSTD_GUEST_API_KEEP_AWAKE_GET, HOSTD_GUEST_API_READS, NULL},
        {"POST", "/v1/keep-awake", HOSTD_GUEST_API_KEEP_AWAKE_SET,
         HOSTD_GUEST_API_CHANGES | HOSTD_GUEST_API_BODY, "agent-keep-awake"},
        {"GET", "/v1/egress", HOSTD_GUEST_API_EGRESS, HOSTD_GUEST_API_READS, NULL},
    };
    /* Known paths with a method they do not take: 405 and what they take. */
    static const struct {
        const char *method, *path, *allow;
    } wrong_method[] = {
        {"POST", "/v1/info", "GET"},         {"PUT", "/v1/egress", "GET"},
        {"POST", "/v1/egress", "GET"},       {"DELETE", "/v1/egress", "GET"},
        {"PATCH", "/v1/egress", "GET"},      {"DELETE", "/v1/checkpoints", "GET, POST"},
        {"PUT", "/v1/restore", "GET, POST"}, {"HEAD", "/v1/keep-awake", "GET, POST"},
        {"get", "/v1/info", "GET"},
    };
    /* Everything else, another agent's name and a policy among them: 404. */
    static const char *const unknown[] = {
        "/",
        "",
        "/v1",
        "/v1/",
        "/v1/info/",
        "/v1/INFO",
        "/v1//info",
        "/v1/info/../info",
        "/v2/info",
        "/v1/agents/b1/info",
        "/v1/agents/b1",
        "/b1/v1/info",
        "/v1/info/b1",
        "/v1/egress/policy",
        "/v1/egress/allow",
        "/v1/policy",
        "/v1/checkpoints/c1",
        "/v1/checkpoints/c1/restore",
        "/v1/exec",
        "/v1/keep-awake/b1",
        "/v1/info\n",
    };
    guint status = 0;
    const char *allow = NULL;

    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        const HostdGuestApiRoute *route =
            hostd_guest_api_route(good[i].method, good[i].path, &status, &allow);

        if (route == NULL)
            fail_msg("%s %s has no route", good[i].method, good[i].path);
        assert_int_equal(route->endpoint, good[i].endpoint);
        assert_int_equal(route->flags, good[i].flags);
        vm_test_assert_nullable_string_equal(route->event, good[i].event);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(wrong_method); i++) {
        status = 0;
        assert_null(
            hostd_guest_api_route(wrong_method[i].method, wrong_method[i].path, &status, &allow));
        assert_int_equal(status, 405);
        assert_string_equal(allow, wrong_method[i].allow);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(unknown); i++) {
        status = 0;
        allow = "x";
        if (hostd_guest_api_route("GET", unknown[i], &status, &allow) != NULL)
            fail_msg("'%s' has a route", unknown[i]);
        assert_int_equal(status, 404);
        assert_null(allow);
        assert_null(hostd_guest_api_route("POST", unknown[i], &status, &allow));
        assert_int_equal(status, 404);
    }
}

/* ---- the rate ------------------------------------------------------------------------------- */

#define SEC G_GINT64_CONSTANT(1000000)

/* A new bucket gives its burst at once, then refuses, saying when the next token comes. */
static void
test_bucket_burst(void **state)
{
    HostdGuestApiBucket b = {0};
    gint64 t = 1000 * SEC;
    guint retry = 0;

    for (int i = 0; i < 20; i++)
        assert_true(hostd_guest_api_bucket_take(&b, 5, 20, t, &retry));
    assert_false(hostd_guest_api_bucket_take(&b, 5, 20, t, &retry));
    assert_int_equal(retry, 1);
    /* 100 at once: 20 pass, 80 are refused. */
    HostdGuestApiBucket c = {0};
    int passed = 0;
    for (int i = 0; i < 100; i++)
        passed += hostd_guest_api_bucket_take(&c, 5, 20, t, &retry);
    assert_int_equal(passed, 20);
}

/* Tokens come back at the rate, never beyond the burst, and a refusal costs nothing. */
static void
test_bucket_refill(void **state)
{
    HostdGuestApiBucket b = {0};
    gint64 t = 5 * SEC;
    guint retry = 0;

    for (int i = 0; i < 20; i++)
        assert_true(hostd_guest_api_bucket_take(&b, 5, 20, t, &retry));
    /* 0.1 s: half a token. */
    assert_false(hostd_guest_api_bucket_take(&b, 5, 20, t + SEC / 10, &retry));
    /* 0.2 s: one. */
    assert_true(hostd_guest_api_bucket_take(&b, 5, 20, t + SEC / 5, &retry));
    assert_false(hostd_guest_api_bucket_take(&b, 5, 20, t + SEC / 5, &retry));
    /* An hour later: the burst, no more. */
    int passed = 0;
    for (int i = 0; i < 30; i++)
        passed += hostd_guest_api_bucket_take(&b, 5, 20, t + 3600 * SEC, &retry);
    assert_int_equal(passed, 20);
    /* A clock that seems to go back changes nothing. */
    assert_false(hostd_guest_api_bucket_take(&b, 5, 20, t, &retry));
}

/* Slow rates: Retry-After counts whole seconds, rounded up. */
static void
test_bucket_retry_after(void **state)
{
    HostdGuestApiBucket b = {0};
    gint64 t = 7 * SEC;
    guint retry = 0;

    for (int i = 0; i < 3; i++)
        assert_true(hostd_guest_api_bucket_take(&b, 0.1, 3, t, &retry));
    assert_false(hostd_guest_api_bucket_take(&b, 0.1, 3, t, &retry));
    assert_int_equal(retry, 10);
    assert_false(hostd_guest_api_bucket_take(&b, 0.1, 3, t + 4 * SEC, &retry));
    assert_int_equal(retry, 6);
    assert_false(hostd_guest_api_bucket_take(&b, 0.1, 3, t + 9500 * 1000, &retry));
    assert_int_equal(retry, 1);
    assert_true(hostd_guest_api_bucket_take(&b, 0.1, 3, t + 10 * SEC, &retry));
}

/* ---- request bodies ------------------------------------------------------------------------- */

static void
test_args_good(void **state)
{
    g_autoptr(GError) error = NULL;

    {
        g_auto(HostdGuestApiArgs) a = {0};
        const char body[] = "{\"label\": \"before-upgrade \\u00e9\", \"memory\": true}";

        assert_true(hostd_guest_api_args_parse(HOSTD_GUEST_API_CHECKPOINT_CREATE, body,
                                               strlen(body), &a, &error));
        assert_string_equal(a.label, "before-upgrade \xc3\xa9");
        assert_true(a.memory);
    }
    {
        g_auto(HostdGuestApiArgs) a = {0};

        /* No body, an empty object, an empty label: a checkpoint without a label. */
        assert_true(
            hostd_guest_api_args_parse(HOSTD_GUEST_API_CHECKPOINT_CREATE, NULL, 0, &a, &error));
        assert_null(a.label);
        assert_false(a.memory);
        assert_true(hostd_guest_api_args_parse(HOSTD_GUEST_API_CHECKPOINT_CREATE,
                                               "{\"label\":\"\"}", 12, &a, &error));
        assert_null(a.label);
    }
    {
        g_auto(HostdGuestApiArgs) a = {0};
        const char body[] = "{\"id\":\"c12\",\"paths\":[\"/etc\",\"/home/agent/proj\"]}";

        assert_true(
            hostd_guest_api_args_parse(HOSTD_GUEST_API_RESTORE, body, strlen(body), &a, &error));
        assert_string_equal(a.id, "c12");
        assert_int_equal(g_strv_length(a.paths), 2);
        assert_string_equal(a.paths[1], "/home/agent/proj");
    }
    {
        g_auto(HostdGuestApiArgs) a = {0};
        const char body[] = " {\"seconds\" : 86400} \n";

        assert_true(hostd_guest_api_args_parse(HOSTD_GUEST_API_KEEP_AWAKE_SET, body, strlen(body),
                                               &a, &error));
        assert_int_equal(a.seconds, 86400);
    }
    assert_null(error);
}

static void
test_args_bad(void **state)
{
    g_autofree char *long_label = g_strnfill(VM_LABEL_MAX + 1, 'x');
    g_autofree char *label_body = g_strdup_printf("{\"label\":\"%s\"}", long_label);
    g_autofree char *deep = g_strconcat("{\"label\":", "[[[[[[\"x\"]]]]]]", "}", NULL);
    g_autoptr(GString) many_paths = g_string_new("{\"id\":\"c1\",\"paths\":[");
    g_autoptr(GString) big = g_string_new("{\"label\":\"");
    static const struct {
        HostdGuestApiEndpoint endpoint;
        const char *body;
        VmErrorCode code;
        const char *needle;
    } cases[] = {
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "not json", VM_ERROR_PROTOCOL, "not JSON"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "[]", VM_ERROR_PROTOCOL, "not a JSON object"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "\"x\"", VM_ERROR_PROTOCOL, "not a JSON object"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "null", VM_ERROR_PROTOCOL, "not a JSON object"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{", VM_ERROR_PROTOCOL, "not JSON"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"label\":\"\xc3\x28\"}", VM_ERROR_PROTOCOL, "UTF-8"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"label\":1}", VM_ERROR_INVALID_ARGUMENT,
         "label must be a string"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"label\":null}", VM_ERROR_INVALID_ARGUMENT,
         "label must be a string"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"label\":\"a\\nb\"}", VM_ERROR_INVALID_ARGUMENT,
         "control character"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"memory\":\"yes\"}", VM_ERROR_INVALID_ARGUMENT,
         "memory must be true or false"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"name\":\"b1\"}", VM_ERROR_INVALID_ARGUMENT,
         "no field 'name'"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"agent\":\"b1\",\"label\":\"x\"}",
         VM_ERROR_INVALID_ARGUMENT, "no field 'agent'"},
        {HOSTD_GUEST_API_CHECKPOINT_CREATE, "{\"id\":\"c1\"}", VM_ERROR_INVALID_ARGUMENT,
         "no field 'id'"},
        {HOSTD_GUEST_API_RESTORE, "{}", VM_ERROR_INVALID_ARGUMENT, "needs the checkpoint's id"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"\"}", VM_ERROR_INVALID_ARGUMENT, "id is empty"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"../c1\"}", VM_ERROR_INVALID_ARGUMENT,
         "no checkpoint id"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1 c2\"}", VM_ERROR_INVALID_ARGUMENT,
         "no checkpoint id"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":3}", VM_ERROR_INVALID_ARGUMENT, "id must be a string"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"name\":\"b1\"}", VM_ERROR_INVALID_ARGUMENT,
         "no field 'name'"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":[]}", VM_ERROR_INVALID_ARGUMENT,
         "1 to 16 paths"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":\"/etc\"}", VM_ERROR_INVALID_ARGUMENT,
         "list of strings"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":[\"etc\"]}", VM_ERROR_INVALID_ARGUMENT,
         "must be absolute"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":[\"/\"]}", VM_ERROR_INVALID_ARGUMENT,
         "not the root"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":[\"/etc/../root\"]}",
         VM_ERROR_INVALID_ARGUMENT, "'..'"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":[\"/a/..\"]}",
         VM_ERROR_INVALID_ARGUMENT, "'..'"},
        {HOSTD_GUEST_API_RESTORE, "{\"id\":\"c1\",\"paths\":[1]}", VM_ERROR_INVALID_ARGUMENT,
         "a path must be a string"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{}", VM_ERROR_INVALID_ARGUMENT, "needs its length"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":0}", VM_ERROR_INVALID_ARGUMENT,
         "1 to 86400"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":86401}", VM_ERROR_INVALID_ARGUMENT,
         "1 to 86400"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":-5}", VM_ERROR_INVALID_ARGUMENT,
         "1 to 86400"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":99999999999999999999}",
         VM_ERROR_INVALID_ARGUMENT, NULL},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":1.5}", VM_ERROR_INVALID_ARGUMENT,
         "whole number"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":\"60\"}", VM_ERROR_INVALID_ARGUMENT,
         "whole number"},
        {HOSTD_GUEST_API_KEEP_AWAKE_SET, "{\"seconds\":60,\"off\":true}", VM_ERROR_INVALID_ARGUMENT,
         "no field 'off'"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(HostdGuestApiArgs) a = {0};
        g_autoptr(GError) error = NULL;

        print_message("# body: %s\n", cases[i].body);
        assert_false(hostd_guest_api_args_parse(cases[i].endpoint, cases[i].body,
                                                strlen(cases[i].body), &a, &error));
        vm_test_assert_error(error, VM_ERROR, cases[i].code, cases[i].needle);
        assert_null(a.label);
        assert_null(a.id);
        assert_null(a.paths);
    }

    struct {
        const char *what;
        const char *body;
        gsize len;
        VmErrorCode code;
        const char *needle;
    } built[] = {
        {"long label", label_body, strlen(label_body), VM_ERROR_INVALID_ARGUMENT, "longer than"},
        {"deep nesting", deep, strlen(deep), VM_ERROR_PROTOCOL, "nests deeper"},
        {"NUL inside", "{\"label\":\"a\0b\"}", 15, VM_ERROR_PROTOCOL, "UTF-8 text"},
        {"many paths", NULL, 0, VM_ERROR_INVALID_ARGUMENT, "1 to 16 paths"},
        {"too big", NULL, 0, VM_ERROR_PROTOCOL, "longer than 16384 bytes"},
    };
    for (int i = 0; i < HOSTD_GUEST_API_PATHS_MAX + 1; i++)
        g_string_append_printf(many_paths, "%s\"/p%d\"", i > 0 ? "," : "", i);
    g_string_append(many_paths, "]}");
    built[3].body = many_paths->str;
    built[3].len = many_paths->len;
    while (big->len <= HOSTD_GUEST_API_BODY_MAX)
        g_string_append_c(big, 'x');
    g_string_append(big, "\"}");
    built[4].body = big->str;
    built[4].len = big->len;
    for (gsize i = 0; i < G_N_ELEMENTS(built); i++) {
        g_auto(HostdGuestApiArgs) a = {0};
        g_autoptr(GError) error = NULL;
        HostdGuestApiEndpoint endpoint =
            i == 3 ? HOSTD_GUEST_API_RESTORE : HOSTD_GUEST_API_CHECKPOINT_CREATE;

        print_message("# body: %s\n", built[i].what);
        assert_false(hostd_guest_api_args_parse(endpoint, built[i].body, built[i].len, &a, &error));
        vm_test_assert_error(error, VM_ERROR, built[i].code, built[i].needle);
    }
}

/* Brackets inside strings are no nesting. */
static void
test_args_depth_in_strings(void **state)
{
    g_auto(HostdGuestApiArgs) a = {0};
    g_autoptr(GError) error = NULL;
    const char body[] = "{\"label\":\"[[[[[[{{{{{{ \\\" [[[[[[\"}";

    assert_true(hostd_guest_api_args_parse(HOSTD_GUEST_API_CHECKPOINT_CREATE, body, strlen(body),
                                           &a, &error));
    assert_string_equal(a.label, "[[[[[[{{{{{{ \" [[[[[[");
}

/* ---- errors --------------------------------------------------------------------------------- */

static void
test_error_status(void **state)
{
    static const struct {
        VmErrorCode code;
        guint status;
    } cases[] = {
        {VM_ERROR_FAILED, 500},       {VM_ERROR_INVALID_ARGUMENT, 400},
        {VM_ERROR_NOT_FOUND, 404},    {VM_ERROR_EXISTS, 409},
        {VM_ERROR_BAD_STATE, 409},    {VM_ERROR_TEMPLATE, 500},
        {VM_ERROR_NO_RESOURCES, 507}, {VM_ERROR_TIMEOUT, 504},
        {VM_ERROR_LIBVIRT, 500},      {VM_ERROR_SSH, 500},
        {VM_ERROR_PROTOCOL, 400},     {VM_ERROR_NOT_RUNNING, 503},
        {VM_ERROR_IO, 500},           {VM_ERROR_IMAGE, 500},
        {VM_ERROR_CANCELLED, 503},    {VM_ERROR_BUSY, 409},
        {VM_ERROR_PERMISSION, 500},
    };

    assert_int_equal(G_N_ELEMENTS(cases), VM_ERROR_LAST);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++)
        assert_int_equal(hostd_guest_api_error_status(cases[i].code), cases[i].status);
}

static void
test_scrub(void **state)
{
    const char *const dirs[] = {"/var/lib/hostd", "", "/var/lib/hostd/images", "/srv/tpl", NULL};
    g_autofree char *a = hostd_guest_api_scrub(
        "only 1 MiB free under /var/lib/hostd/agents/a1: a checkpoint needs at least 256 MiB",
        dirs);
    g_autofree char *b = hostd_guest_api_scrub(
        "cannot read /var/lib/hostd/images/debian-12/image.ini and /srv/tpl/x.yaml", dirs);
    g_autofree char *c = hostd_guest_api_scrub("agent 'a1' has no checkpoint 'c9'", dirs);
    g_autofree char *d = hostd_guest_api_scrub("x", NULL);

    assert_string_equal(a, "only 1 MiB free under <host>/agents/a1: a checkpoint needs at least "
                           "256 MiB");
    assert_string_equal(b, "cannot read <host>/debian-12/image.ini and <host>/x.yaml");
    assert_string_equal(c, "agent 'a1' has no checkpoint 'c9'");
    assert_string_equal(d, "x");
}

static void
test_error_json(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) foreign = g_error_new_literal(G_FILE_ERROR, G_FILE_ERROR_NOENT, "gone");
    g_autoptr(GString) long_message = g_string_new(NULL);

    vm_throw(&error, VM_ERROR_NOT_FOUND, "agent 'a1' has no checkpoint \"c9\"");
    g_autofree char *json = hostd_guest_api_error_json(error, 0);
    assert_string_equal(json, "{\"error\":\"not-found\",\"message\":\"agent 'a1' has no checkpoint "
                              "\\\"c9\\\"\"}");
    g_autofree char *busy = NULL;
    g_clear_error(&error);
    vm_throw(&error, VM_ERROR_BUSY, "slow down");
    busy = hostd_guest_api_error_json(error, 3);
    assert_string_equal(busy, "{\"error\":\"busy\",\"message\":\"slow down\",\"retry_after\":3}");
    g_autofree char *other = hostd_guest_api_error_json(foreign, 0);
    assert_string_equal(other, "{\"error\":\"failed\",\"message\":\"gone\"}");

    while (long_message->len < 5000)
        g_string_append(long_message, "\xc3\xa9");
    g_clear_error(&error);
    error = g_error_new_literal(VM_ERROR, VM_ERROR_IO, long_message->str);
    g_autofree char *cut = hostd_guest_api_error_json(error, 0);
    assert_true(strlen(cut) < 1100);
    assert_true(g_utf8_validate(cut, -1, NULL));
}

/* ---- answers -------------------------------------------------------------------------------- */

static char *
to_text(JsonNode *node)
{
    g_autoptr(JsonGenerator) gen = json_generator_new();
    char *text;

    json_generator_set_root(gen, node);
    text = json_generator_to_data(gen, NULL);
    json_node_unref(node);
    return text;
}

/* Only the keys asked for, whatever else the dictionary holds. */
static void
test_pick(void **state)
{
    static const char *const keys[] = {"id", "label", "bytes", "current", "missing", NULL};
    g_autoptr(GVariant) dict = g_variant_ref_sink(g_variant_new_parsed(
        "{'id': <'c1'>, 'label': <'x'>, 'bytes': <uint64 4096>, 'current': <true>, "
        "'image': <'/var/lib/hostd/agents/a1/disk-1.qcow2'>, 'path': <'/secret'>}"));
    g_autoptr(GVariant) list = g_variant_ref_sink(
        g_variant_new_parsed("[{'id': <'c1'>, 'image': <'/x'>}, {'id': <'c2'>, 'label': <'y'>}]"));
    static const char *const egress_keys[] = {"allow", "deny", "proxy", NULL};
    g_autoptr(GVariant) egress = g_variant_ref_sink(g_variant_new_parsed(
        "{'allow': <['pypi.org', '*.github.com']>, 'deny': <@as []>, 'connections': <uint32 2>, "
        "'proxy': <'http://10.0.2.100:3128'>, 'wired': <true>}"));

    g_autofree char *one = to_text(hostd_guest_api_pick(dict, keys));
    assert_string_equal(one, "{\"id\":\"c1\",\"label\":\"x\",\"bytes\":4096,\"current\":true}");
    g_autofree char *each = to_text(hostd_guest_api_pick_each(list, keys));
    assert_string_equal(each, "[{\"id\":\"c1\"},{\"id\":\"c2\",\"label\":\"y\"}]");
    g_autofree char *e = to_text(hostd_guest_api_pick(egress, egress_keys));
    assert_string_equal(e, "{\"allow\":[\"pypi.org\",\"*.github.com\"],\"deny\":[],"
                           "\"proxy\":\"http://10.0.2.100:3128\"}");
}

static void
test_keep_awake_node(void **state)
{
    gint64 now = 50 * SEC;
    gint64 real = G_GINT64_CONSTANT(1714564800) * SEC; /* 2024-05-01T12:00:00Z */

    g_autofree char *none = to_text(hostd_guest_api_keep_awake_node(0, now, real));
    assert_string_equal(none, "null");
    g_autofree char *passed = to_text(hostd_guest_api_keep_awake_node(now - 1, now, real));
    assert_string_equal(passed, "null");
    g_autofree char *forever = to_text(hostd_guest_api_keep_awake_node(G_MAXINT64, now, real));
    assert_string_equal(forever, "{\"indefinite\":true}");
    g_autofree char *hour = to_text(hostd_guest_api_keep_awake_node(now + 3600 * SEC, now, real));
    assert_string_equal(hour, "{\"until\":\"2024-05-01T13:00:00Z\",\"seconds_left\":3600}");
    g_autofree char *part = to_text(hostd_guest_api_keep_awake_node(now + SEC / 2, now, real));
    assert_string_equal(part, "{\"until\":\"2024-05-01T12:00:00Z\",\"seconds_left\":1}");
}

/* The agent's own info: its policies, never its host paths, keys, ports or identity. */
static void
test_info_node(void **state)
{
    HostdAgentRecord r = {
        .dir = "/var/lib/hostd/agents/a1",
        .name = "a1",
        .uuid = "6f1c8a52-3d4e-4b0a-9c1d-2e3f4a5b6c7d",
        .template_name = "debian-12",
        .phase = "ready",
        .cpus = 2,
        .memory_mib = 1024,
        .disk_gib = 8,
        .ssh_port = 42201,
        .backend_port = 42202,
        .idle_pause_s = 300,
        .idle_save_s = 1800,
        .checkpoint_every_s = 1800,
        .checkpoint_keep = 10,
        .checkpoint_hourly = 24,
        .checkpoint_daily = 7,
        .mac = "52:54:00:ab:cd:ef",
        .user = "agent",
        .instance_id = "vmctl-6f1c",
        .forked_from = "b1",
        .fork_base = "/var/lib/hostd/agents/b1/disk-1.qcow2",
        .created = 1714564800,
        .state_since = 1714564900,
        .restart = "always",
    };
    g_autofree char *text =
        to_text(hostd_guest_api_info_node(&r, "running", json_node_new(JSON_NODE_NULL)));

    assert_string_equal(
        text, "{\"name\":\"a1\",\"state\":\"running\",\"template\":\"debian-12\",\"cpus\":2,"
              "\"memory_mib\":1024,\"disk_gib\":8,\"created\":1714564800,\"state_since\":"
              "1714564900,\"idle\":{\"never\":false,\"pause_after_s\":300,\"save_after_s\":1800},"
              "\"checkpoints\":{\"every_s\":1800,\"keep\":10,\"hourly\":24,\"daily\":7},"
              "\"restart\":\"always\",\"keep_awake\":null}");
    r.idle_never = TRUE;
    r.restart = NULL;
    g_autofree char *never = to_text(hostd_guest_api_info_node(&r, "paused", NULL));
    assert_non_null(strstr(never, "\"idle\":{\"never\":true,\"pause_after_s\":0,"
                                  "\"save_after_s\":0}"));
    assert_non_null(strstr(never, "\"restart\":\"on-crash\""));
}

static void
test_wrap(void **state)
{
    g_autofree char *null = hostd_guest_api_wrap("restore", NULL);
    g_autofree char *one = hostd_guest_api_wrap("keep_awake", json_node_new(JSON_NODE_NULL));

    assert_string_equal(null, "{\"restore\":null}");
    assert_string_equal(one, "{\"keep_awake\":null}");
}

/* ---- calls: what the worker hands hostd ---------------------------------------------------- */

/* A whole request makes one call: its endpoint and arguments, or the worker's own refusal, in the
 * order the API answers them (route, then length, then body); method and path as logged. */
static void
test_call_read(void **state)
{
    static const struct {
        const char *method, *path, *body;
        gboolean too_long;
        HostdGuestApiEndpoint endpoint;
        guint status;
        const char *log_path, *needle;
    } cases[] = {
        {"GET", "/v1/info", NULL, FALSE, HOSTD_GUEST_API_INFO, 0, "/v1/info", NULL},
        {"GET", "/v1/info", "ignored", FALSE, HOSTD_GUEST_API_INFO, 0, "/v1/info", NULL},
        {"POST", "/v1/keep-awake", "{\"seconds\": 60}", FALSE, HOSTD_GUEST_API_KEEP_AWAKE_SET, 0,
         "/v1/keep-awake", NULL},
        {"POST", "/v1/nope", "{}", TRUE, 0, 404, "/v1/nope", "no /v1/nope in this API"},
        {"PUT", "/v1/egress", "{}", TRUE, 0, 405, "/v1/egress", "/v1/egress takes GET only"},
        {"GET", "/v1/info", NULL, TRUE, 0, 413, "/v1/info", "longer than 16384 bytes"},
        {"POST", "/v1/checkpoints", "{\"x\": 1}", TRUE, 0, 413, "/v1/checkpoints", NULL},
        {"POST", "/v1/checkpoints", "{\"x\": 1}", FALSE, 0, 400, "/v1/checkpoints", "no field 'x'"},
        {"POST", "/v1/restore", "[]", FALSE, 0, 400, "/v1/restore", "not a JSON object"},
        {"GET", "/v1/a b\n\x01", NULL, FALSE, 0, 404, "/v1/a?b??", NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(HostdGuestApiCall) call = {0};

        hostd_guest_api_call_read(cases[i].method, cases[i].path, cases[i].body,
                                  cases[i].body != NULL ? strlen(cases[i].body) : 0,
                                  cases[i].too_long, &call);
        assert_int_equal(call.endpoint, cases[i].endpoint);
        assert_int_equal(call.status, cases[i].status);
        assert_string_equal(call.path, cases[i].log_path);
        assert_true((call.refusal != NULL) == (cases[i].status != 0));
        assert_true((call.allow != NULL) == (cases[i].status == 405));
        if (cases[i].needle != NULL)
            assert_non_null(strstr(call.refusal, cases[i].needle));
    }

    g_autofree char *long_path = g_strnfill(300, 'a');
    g_auto(HostdGuestApiCall) cut = {0};
    hostd_guest_api_call_read("GETGETGETGETGETGETGET", long_path, NULL, 0, FALSE, &cut);
    assert_int_equal(strlen(cut.method), HOSTD_GUEST_API_LOG_METHOD_MAX + 3);
    assert_int_equal(strlen(cut.path), HOSTD_GUEST_API_LOG_PATH_MAX + 3);
    assert_true(g_str_has_suffix(cut.path, "..."));
}

/* Each call the worker can make reads back the same through hostd's check. */
static void
test_call_wire(void **state)
{
    static const struct {
        const char *method, *path, *body;
    } cases[] = {
        {"GET", "/v1/info", NULL},
        {"POST", "/v1/checkpoints", "{\"label\": \"x y\", \"memory\": true}"},
        {"POST", "/v1/restore", "{\"id\": \"c2\", \"paths\": [\"/etc\", \"/srv/a\"]}"},
        {"POST", "/v1/restore", "{\"id\": \"c2\"}"},
        {"POST", "/v1/keep-awake", "{\"seconds\": 86400}"},
        {"DELETE", "/v1/restore", NULL},
        {"GET", "/v1/../etc", NULL},
        {"POST", "/v1/keep-awake", "{}"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_auto(HostdGuestApiCall) call = {0};
        g_auto(HostdGuestApiCall) back = {0};
        g_autoptr(GError) error = NULL;
        guint32 serial = 0;

        hostd_guest_api_call_read(cases[i].method, cases[i].path, cases[i].body,
                                  cases[i].body != NULL ? strlen(cases[i].body) : 0, FALSE, &call);
        g_autoptr(GVariant) v = g_variant_ref_sink(hostd_guest_api_call_to_variant(&call, 42));
        if (!hostd_guest_api_call_from_variant(v, &serial, &back, &error))
            fail_msg("%s %s: %s", cases[i].method, cases[i].path, error->message);
        assert_int_equal(serial, 42);
        assert_int_equal(back.endpoint, call.endpoint);
        assert_int_equal(back.status, call.status);
        assert_string_equal(back.method, call.method);
        assert_string_equal(back.path, call.path);
        assert_string_equal(back.args.label != NULL ? back.args.label : "-",
                            call.args.label != NULL ? call.args.label : "-");
        assert_int_equal(back.args.memory, call.args.memory);
        assert_int_equal(back.args.seconds, call.args.seconds);
        assert_null(back.refusal);
        if (call.args.paths != NULL)
            assert_true(g_strv_equal((const char *const *)back.args.paths,
                                     (const char *const *)call.args.paths));
        else
            assert_null(back.args.paths);
    }
}

/* What a worker taken over might send instead: each refused, whatever hostd would otherwise do
 * with it. */
static void
test_call_untrusted(void **state)
{
    g_autofree char *long_label = g_strnfill(VM_LABEL_MAX + 1, 'l');
    g_autofree char *long_path = g_strnfill(HOSTD_GUEST_API_PATH_MAX + 1, 'p');
    g_autofree char *long_log = g_strnfill(HOSTD_GUEST_API_LOG_PATH_MAX + 1, 'a');
    const char *const none[] = {NULL};
    const char *const etc[] = {"/etc", NULL};
    const char *const root[] = {"/", NULL};
    const char *const dotdot[] = {"/a/../etc", NULL};
    const char *const control[] = {"/a\tb", NULL};
    const char *const too_many[] = {"/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h", "/i",
                                    "/j", "/k", "/l", "/m", "/n", "/o", "/p", "/q", NULL};
    char *long_paths[] = {long_path, NULL};
    struct {
        const char *what;
        GVariant *value;
    } cases[] = {
        {"another type",
         g_variant_new("(uuusssbs^as)", 1, 1, 0, "GET", "/v1/info", "", FALSE, "", none)},
        {"no endpoint",
         g_variant_new("(uuusssbs^asu)", 1, 99, 0, "GET", "/v1/info", "", FALSE, "", none, 0)},
        {"endpoint of another path", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_EGRESS, 0,
                                                   "GET", "/v1/info", "", FALSE, "", none, 0)},
        {"endpoint of another method",
         g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_CHECKPOINT_CREATE, 0, "GET",
                       "/v1/checkpoints", "", FALSE, "", none, 0)},
        {"endpoint with a status", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_INFO, 200,
                                                 "GET", "/v1/info", "", FALSE, "", none, 0)},
        {"404 for a route",
         g_variant_new("(uuusssbs^asu)", 1, 0, 404, "GET", "/v1/info", "", FALSE, "", none, 0)},
        {"400 for a route without a body",
         g_variant_new("(uuusssbs^asu)", 1, 0, 400, "GET", "/v1/info", "", FALSE, "", none, 0)},
        {"a status of its own",
         g_variant_new("(uuusssbs^asu)", 1, 0, 200, "GET", "/v1/nope", "", FALSE, "", none, 0)},
        {"a refusal with arguments",
         g_variant_new("(uuusssbs^asu)", 1, 0, 404, "GET", "/v1/nope", "", FALSE, "c1", none, 0)},
        {"a log path too long",
         g_variant_new("(uuusssbs^asu)", 1, 0, 404, "GET", long_log, "", FALSE, "", none, 0)},
        {"a newline in the log",
         g_variant_new("(uuusssbs^asu)", 1, 0, 404, "GET", "/v1/x\ny", "", FALSE, "", none, 0)},
        {"a label for info", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_INFO, 0, "GET",
                                           "/v1/info", "l", FALSE, "", none, 0)},
        {"memory for a restore", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0,
                                               "POST", "/v1/restore", "", TRUE, "c1", none, 0)},
        {"a label too long",
         g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_CHECKPOINT_CREATE, 0, "POST",
                       "/v1/checkpoints", long_label, FALSE, "", none, 0)},
        {"a label with an escape",
         g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_CHECKPOINT_CREATE, 0, "POST",
                       "/v1/checkpoints", "a\x1b[2J", FALSE, "", none, 0)},
        {"a restore without an id", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0,
                                                  "POST", "/v1/restore", "", FALSE, "", none, 0)},
        {"an id that is a path", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0,
                                               "POST", "/v1/restore", "", FALSE, "../c1", none, 0)},
        {"the root", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0, "POST",
                                   "/v1/restore", "", FALSE, "c1", root, 0)},
        {"a '..'", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0, "POST",
                                 "/v1/restore", "", FALSE, "c1", dotdot, 0)},
        {"a control character in a path",
         g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0, "POST", "/v1/restore", "",
                       FALSE, "c1", control, 0)},
        {"a path too long", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0, "POST",
                                          "/v1/restore", "", FALSE, "c1", long_paths, 0)},
        {"17 paths", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_RESTORE, 0, "POST",
                                   "/v1/restore", "", FALSE, "c1", too_many, 0)},
        {"paths for a checkpoint",
         g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_CHECKPOINT_CREATE, 0, "POST",
                       "/v1/checkpoints", "", FALSE, "", etc, 0)},
        {"no seconds", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_KEEP_AWAKE_SET, 0, "POST",
                                     "/v1/keep-awake", "", FALSE, "", none, 0)},
        {"a day and a second",
         g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_KEEP_AWAKE_SET, 0, "POST",
                       "/v1/keep-awake", "", FALSE, "", none, HOSTD_GUEST_API_KEEP_AWAKE_MAX + 1)},
        {"seconds for info", g_variant_new("(uuusssbs^asu)", 1, HOSTD_GUEST_API_INFO, 0, "GET",
                                           "/v1/info", "", FALSE, "", none, 5)},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GVariant) v = g_variant_ref_sink(cases[i].value);
        g_auto(HostdGuestApiCall) call = {0};
        g_autoptr(GError) error = NULL;
        guint32 serial = 0;

        print_message("# %s\n", cases[i].what);
        assert_false(hostd_guest_api_call_from_variant(v, &serial, &call, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        assert_null(call.method);
        assert_int_equal(serial, 0);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_bucket_burst),
        cmocka_unit_test(test_bucket_refill),
        cmocka_unit_test(test_bucket_retry_after),
        cmocka_unit_test(test_args_good),
        cmocka_unit_test(test_args_bad),
        cmocka_unit_test(test_args_depth_in_strings),
        cmocka_unit_test(test_error_status),
        cmocka_unit_test(test_scrub),
        cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_keep_awake_node),
        cmocka_unit_test(test_info_node),
        cmocka_unit_test(test_wrap),
        cmocka_unit_test(test_call_read),
        cmocka_unit_test(test_call_wire),
        cmocka_unit_test(test_call_untrusted),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
