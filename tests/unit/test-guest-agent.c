/* hostd's questions to a guest agent (hostd-guest-agent.h) against a guest agent that answers
 * whatever a hostile guest makes it answer: libvirt's virDomainQemuAgentCommand() is replaced
 * here by a script of answers (the rest of libvirt is the test driver's). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <libvirt/libvirt-qemu.h>
#include <string.h>

#include "hostd-guest-agent.h"
#include "hostd-libvirt.h"
#include "test-common.h"

/* The answers still to give, in order; NULL in the queue: fail with a libvirt error whose message
 * quotes fake_error_text, as libvirt's quotes a guest agent's "desc". */
static GQueue fake_answers = G_QUEUE_INIT;
static char *fake_error_text;
static GPtrArray *fake_commands;

char *
virDomainQemuAgentCommand(virDomainPtr domain, const char *cmd, int timeout, unsigned int flags)
{
    g_ptr_array_add(fake_commands, g_strdup(cmd));
    if (g_queue_is_empty(&fake_answers))
        fail_msg("no answer scripted for %s", cmd);
    char *answer = g_queue_pop_head(&fake_answers);
    if (answer == NULL) {
        /* a real libvirt error that carries the text as given */
        virStoragePoolPtr none =
            virStoragePoolLookupByName(virDomainGetConnect(domain), fake_error_text);
        assert_null(none);
        return NULL;
    }
    char *copy = strdup(answer); /* libvirt's answer is free()d memory */
    g_free(answer);
    return copy;
}

/* libvirt prints every error to stderr unless told otherwise (hostd tells it at start-up). */
static void
quiet(void *data, virErrorPtr err)
{
}

typedef struct {
    virConnectPtr conn;
    virDomainPtr dom;
} Fixture;

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    virSetErrorFunc(NULL, quiet);
    f->conn = virConnectOpen("test:///default");
    assert_non_null(f->conn);
    f->dom = virDomainLookupByName(f->conn, "test");
    assert_non_null(f->dom);
    fake_commands = g_ptr_array_new_with_free_func(g_free);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    g_queue_clear_full(&fake_answers, g_free);
    g_clear_pointer(&fake_error_text, g_free);
    g_clear_pointer(&fake_commands, g_ptr_array_unref);
    virDomainFree(f->dom);
    virConnectClose(f->conn);
    g_free(f);
    return 0;
}

static void
answer(const char *text)
{
    g_queue_push_tail(&fake_answers, g_strdup(text));
}

static void
answer_error(const char *text)
{
    g_free(fake_error_text);
    fake_error_text = g_strdup(text);
    g_queue_push_tail(&fake_answers, NULL);
}

/* An exec's answer with its output: the exit status, stderr then stdout. */
static void
test_exec(void **state)
{
    Fixture *f = *state;
    const char *argv[] = {"/bin/true", "x", NULL};
    g_autoptr(GError) error = NULL;
    g_autofree char *output = NULL;
    int status = -1;

    answer("{\"return\": {\"pid\": 42}}");
    answer("{\"return\": {\"exited\": false}}");
    answer("{\"return\": {\"exited\": true, \"exitcode\": 3, \"out-data\": \"b3V0\", "
           "\"err-data\": \"ZXJy\"}}");
    assert_true(hostd_guest_agent_exec(f->dom, argv, NULL, 5000, &status, &output, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(status, 3);
    assert_string_equal(output, "errout");
    assert_int_equal(fake_commands->len, 3);
    assert_non_null(strstr(g_ptr_array_index(fake_commands, 0), "\"guest-exec\""));
    assert_non_null(strstr(g_ptr_array_index(fake_commands, 2), "\"pid\":42"));
}

/* Answers a hostile guest agent could give to guest-exec (first) or guest-exec-status (second):
 * each fails the call with VM_ERROR_PROTOCOL, saying what was wrong; none is taken for a status. */
static void
test_exec_hostile(void **state)
{
    Fixture *f = *state;
    const char *argv[] = {"/bin/true", NULL};
    g_autofree char *huge = g_strdup_printf("{\"return\": {\"pid\": 1, \"x\": \"%0*d\"}}",
                                            HOSTD_GUEST_AGENT_REPLY_MAX, 0);
    g_autofree char *deep_open = g_strnfill(100000, '[');
    g_autofree char *deep = g_strconcat("{\"return\": ", deep_open, NULL);
    g_autofree char *deep17 = g_strdup_printf("{\"return\": {\"pid\": 1, \"x\": %s1%s}}",
                                              "[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]");
    const struct {
        const char *first;
        const char *second;
        const char *needle;
    } cases[] = {
        {"{", NULL, "not JSON"},
        {huge, NULL, "over"},
        {deep, NULL, "nests over"},
        {deep17, NULL, "nests over"},
        {"{\"error\": {}}", NULL, "no result"},
        {"[1]", NULL, "no result"},
        {"{\"return\": [42]}", NULL, "no pid"},
        {"{\"return\": {\"pid\": \"42\"}}", NULL, "no pid"},
        {"{\"return\": {\"pid\": 4.2}}", NULL, "no pid"},
        {"{\"return\": {\"pid\": {}}}", NULL, "no pid"},
        {"{\"return\": {\"pid\": 1}}", "{\"return\": {\"exited\": \"true\"}}", "no 'exited'"},
        {"{\"return\": {\"pid\": 1}}", "{\"return\": {\"exited\": [true]}}", "no 'exited'"},
        {"{\"return\": {\"pid\": 1}}", "{\"return\": \"exited\"}", "no 'exited'"},
        {"{\"return\": {\"pid\": 1}}", "{\"return\": {\"exited\": true}}", "no exit status"},
        {"{\"return\": {\"pid\": 1}}", "{\"return\": {\"exited\": true, \"exitcode\": \"0\"}}",
         "no exit status"},
        {"{\"return\": {\"pid\": 1}}", "{\"return\": {\"exited\": true, \"exitcode\": 0.5}}",
         "no exit status"},
        {"{\"return\": {\"pid\": 1}}",
         "{\"return\": {\"exited\": true, \"exitcode\": 0, \"out-data\": 5}}",
         "'out-data' is not a string"},
        {"{\"return\": {\"pid\": 1}}",
         "{\"return\": {\"exited\": true, \"exitcode\": 0, \"err-data\": {}}}",
         "'err-data' is not a string"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *output = NULL;
        int status = -7;

        answer(cases[i].first);
        if (cases[i].second != NULL)
            answer(cases[i].second);
        assert_false(hostd_guest_agent_exec(f->dom, argv, NULL, 5000, &status, &output, &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, cases[i].needle);
        assert_null(output);
        assert_true(g_queue_is_empty(&fake_answers));
    }
}

/* Exit statuses are clamped to what a shell shows; output is cut at its cap, whatever the guest
 * sends within the answer's. */
static void
test_exec_bounds(void **state)
{
    Fixture *f = *state;
    const char *argv[] = {"/bin/true", NULL};
    const struct {
        const char *status;
        int expected;
    } cases[] = {
        {"\"exitcode\": 300", 255},
        {"\"exitcode\": -5", 0},
        {"\"signal\": 9", 137},
        {"\"signal\": 100000", 255},
        {"\"exitcode\": \"x\", \"signal\": 15", 143},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *text =
            g_strdup_printf("{\"return\": {\"exited\": true, %s}}", cases[i].status);
        int status = -1;

        answer("{\"return\": {\"pid\": 1}}");
        answer(text);
        assert_true(hostd_guest_agent_exec(f->dom, argv, NULL, 5000, &status, NULL, &error));
        assert_int_equal(status, cases[i].expected);
    }

    /* 600 KiB of output, in two fields: 64 KiB kept */
    gsize len = 600 * 1024;
    g_autofree guchar *bytes = g_malloc(len);
    memset(bytes, 'a', len);
    g_autofree char *b64 = g_base64_encode(bytes, len / 2);
    g_autofree char *big =
        g_strdup_printf("{\"return\": {\"exited\": true, \"exitcode\": 0, \"err-data\": \"%s\", "
                        "\"out-data\": \"%s\"}}",
                        b64, b64);
    g_autoptr(GError) error = NULL;
    g_autofree char *output = NULL;
    int status = -1;

    answer("{\"return\": {\"pid\": 1}}");
    answer(big);
    assert_true(hostd_guest_agent_exec(f->dom, argv, NULL, 5000, &status, &output, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(strlen(output), HOSTD_GUEST_AGENT_OUTPUT_MAX);
}

/* A program that never ends in the guest: the call fails at its deadline. */
static void
test_exec_deadline(void **state)
{
    Fixture *f = *state;
    const char *argv[] = {"/bin/sleep", "inf", NULL};
    g_autoptr(GError) error = NULL;
    int status = -1;

    answer("{\"return\": {\"pid\": 1}}");
    for (guint i = 0; i < 200; i++)
        answer("{\"return\": {\"exited\": false}}");
    gint64 start = g_get_monotonic_time();
    assert_false(hostd_guest_agent_exec(f->dom, argv, NULL, 200, &status, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, "/bin/sleep did not finish");
    assert_true(g_get_monotonic_time() - start < 2 * G_USEC_PER_SEC);
}

/* The guest agent's own error text (libvirt quotes it in its error) reaches the caller, and from
 * there a log line or a client, as one line of bounded length: its newline cannot forge a line,
 * its escape sequence cannot reach a terminal. */
static void
test_error_text(void **state)
{
    Fixture *f = *state;
    const char *argv[] = {"/bin/true", NULL};
    g_autofree char *padding = g_strnfill(100000, 'x');
    g_autofree char *text =
        g_strconcat("denied\n12:00:00 hostd: rm a2 ok\x1b[2J\xff", padding, NULL);
    g_autoptr(GError) error = NULL;
    int status = -1;

    answer_error(text);
    assert_false(hostd_guest_agent_exec(f->dom, argv, NULL, 5000, &status, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_LIBVIRT));
    assert_non_null(strstr(error->message, "the guest agent did not answer: "));
    assert_non_null(strstr(error->message, "denied\\n12:00:00 hostd: rm a2 ok\\x1b[2J\\xff"));
    assert_null(strpbrk(error->message, "\n\r\x1b"));
    assert_true(g_utf8_validate(error->message, -1, NULL));
    assert_true(strlen(error->message) < HOSTD_GUEST_AGENT_ERROR_MAX + 64);
    assert_true(g_str_has_suffix(error->message, "xxx..."));
}

/* guest-file-open must answer a handle: anything else fails before a write is sent. */
static void
test_write_file_hostile(void **state)
{
    Fixture *f = *state;
    const char *bad[] = {"{\"return\": -1}", "{\"return\": \"3\"}", "{\"return\": 1.5}",
                         "{\"return\": {}}"};

    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(GError) error = NULL;

        g_ptr_array_set_size(fake_commands, 0);
        answer(bad[i]);
        assert_false(hostd_guest_agent_write_file(f->dom, "/x", "y", &error));
        vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, "not a handle");
        assert_int_equal(fake_commands->len, 1);
    }

    /* a handle: write, then close even though the write failed */
    g_autoptr(GError) error = NULL;
    g_ptr_array_set_size(fake_commands, 0);
    answer("{\"return\": 7}");
    answer("{");
    answer("{\"return\": {}}");
    assert_false(hostd_guest_agent_write_file(f->dom, "/x", "y", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, "not JSON");
    assert_int_equal(fake_commands->len, 3);
    assert_non_null(strstr(g_ptr_array_index(fake_commands, 2), "guest-file-close"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_exec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_hostile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_error_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_file_hostile, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
