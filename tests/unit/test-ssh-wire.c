/* The messages between hostd and an SSH worker: requests survive the trip whole, and what hostd
 * takes from a worker it does not trust is typed, bounded and made safe to show. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-ssh-wire.h"
#include "vm-error.h"
#include "test-common.h"

static void
test_start_roundtrip(void **state)
{
    HostdSshTarget target = {.agent = "alpha", .host = "127.0.0.1", .port = 2222, .user = "agent"};
    g_autoptr(GVariant) payload = g_variant_ref_sink(
        hostd_ssh_wire_start_new(&target, "PEM", "ssh-ed25519 AAAA", TRUE, 70001, 70002));
    g_autoptr(GError) error = NULL;
    HostdSshWireStart start;
    HostdSshTarget back;

    assert_true(hostd_ssh_wire_start_parse(payload, &start, &error));
    vm_test_assert_no_error(error);
    hostd_ssh_wire_start_target(&start, &back);
    assert_string_equal(back.agent, "alpha");
    assert_string_equal(back.host, "127.0.0.1");
    assert_int_equal(back.port, 2222);
    assert_string_equal(back.user, "agent");
    assert_string_equal(back.identity_pem, "PEM");
    assert_string_equal(back.host_key, "ssh-ed25519 AAAA");
    assert_null(back.identity_path);
    assert_true(start.change_user);
    assert_int_equal(start.uid, 70001);
    assert_int_equal(start.gid, 70002);
    hostd_ssh_wire_start_clear(&start);

    g_clear_pointer(&payload, g_variant_unref);
    payload = g_variant_ref_sink(g_variant_new_string("start"));
    assert_false(hostd_ssh_wire_start_parse(payload, &start, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, NULL);
}

static void
test_exec_roundtrip(void **state)
{
    char *argv[] = {"sh", "-c", "echo \"$FOO\"", NULL};
    char *env[] = {"FOO=a b", NULL};
    VmTrace trace = {0};
    HostdExecRequest request = {.argv = argv,
                                .env = env,
                                .cwd = "/srv",
                                .tty = TRUE,
                                .term = "vt100",
                                .cols = 132,
                                .rows = 43,
                                .trace = &trace};
    HostdExecRequest bare = {.argv = argv};
    g_autoptr(GVariant) payload = g_variant_ref_sink(hostd_ssh_wire_exec_new(&request));
    g_autoptr(GError) error = NULL;
    HostdSshWireExec exec;

    assert_true(hostd_ssh_wire_exec_parse(payload, &exec, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(g_strv_length(exec.request.argv), 3);
    assert_string_equal(exec.request.argv[2], "echo \"$FOO\"");
    assert_string_equal(exec.request.env[0], "FOO=a b");
    assert_null(exec.request.env[1]);
    assert_string_equal(exec.request.cwd, "/srv");
    assert_true(exec.request.tty);
    assert_string_equal(exec.request.term, "vt100");
    assert_int_equal(exec.request.cols, 132);
    assert_int_equal(exec.request.rows, 43);
    assert_true(exec.traced);
    assert_false(exec.before_command);
    /* The worker's own trace and callback are its to set. */
    assert_null(exec.request.trace);
    assert_null(exec.request.before_command);
    hostd_ssh_wire_exec_clear(&exec);

    g_clear_pointer(&payload, g_variant_unref);
    payload = g_variant_ref_sink(hostd_ssh_wire_exec_new(&bare));
    assert_true(hostd_ssh_wire_exec_parse(payload, &exec, &error));
    assert_null(exec.request.env);
    assert_null(exec.request.cwd);
    assert_null(exec.request.term);
    assert_false(exec.traced);
    hostd_ssh_wire_exec_clear(&exec);
}

/* A done payload built by hand, as a worker that lies could send it. */
static GVariant *
done(gboolean ok, guint32 code, const char *message, GVariant *marks)
{
    if (marks == NULL)
        marks = g_variant_new_array(G_VARIANT_TYPE("(sx)"), NULL, 0);
    return g_variant_ref_sink(g_variant_new("(bus@a(sx))", ok, code, message, marks));
}

static void
test_done(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) cause = NULL;
    g_autoptr(GVariant) payload = NULL;
    g_autofree char *text = NULL;
    VmTrace trace;

    /* Success, and the worker's marks replayed in order. */
    vm_trace_init(&trace);
    vm_trace_mark(&trace, "connect");
    vm_trace_mark(&trace, "command ran");
    payload = g_variant_ref_sink(hostd_ssh_wire_done_new(NULL, &trace));
    vm_trace_clear(&trace);
    vm_trace_init(&trace);
    assert_true(hostd_ssh_wire_done_parse(payload, &trace, &error));
    vm_test_assert_no_error(error);
    text = vm_trace_finish(&trace, "exec");
    assert_non_null(strstr(text, "connect "));
    assert_non_null(strstr(text, ", command ran "));
    g_clear_pointer(&payload, g_variant_unref);

    /* A failure keeps its VM_ERROR code; a foreign domain becomes VM_ERROR_SSH. */
    cause = g_error_new_literal(VM_ERROR, VM_ERROR_TIMEOUT, "too slow");
    payload = g_variant_ref_sink(hostd_ssh_wire_done_new(cause, NULL));
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_TIMEOUT, "too slow");
    g_clear_error(&error);
    g_clear_error(&cause);
    g_clear_pointer(&payload, g_variant_unref);
    cause = g_error_new_literal(G_IO_ERROR, G_IO_ERROR_FAILED, "io");
    payload = g_variant_ref_sink(hostd_ssh_wire_done_new(cause, NULL));
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, "io");
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);
}

static void
test_done_hostile(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) payload = NULL;
    g_autofree char *long_message = g_strnfill(100000, 'x');
    GVariantBuilder marks;
    VmTrace trace;

    /* A code outside VM_ERROR's is VM_ERROR_SSH. */
    payload = done(FALSE, 9999, "odd", NULL);
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, "odd");
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);
    payload = done(FALSE, 0, "zero", NULL);
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_SSH, "zero");
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);

    /* Escape sequences and a forged second line are made printable; length is bounded. */
    payload = done(FALSE, VM_ERROR_SSH, "bad\x1b[2J\nhostd: all good\r", NULL);
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    assert_string_equal(error->message, "bad?[2J?hostd: all good?");
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);
    payload = done(FALSE, VM_ERROR_SSH, long_message, NULL);
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    assert_int_equal(strlen(error->message), HOSTD_SSH_WIRE_MESSAGE_MAX);
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);

    /* Too many marks, or a phase not named as hostd names them: refused. */
    g_variant_builder_init(&marks, G_VARIANT_TYPE("a(sx)"));
    for (guint i = 0; i <= HOSTD_SSH_WIRE_MARKS_MAX; i++)
        g_variant_builder_add(&marks, "(sx)", "connect", (gint64)0);
    payload = done(TRUE, 0, "", g_variant_builder_end(&marks));
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, NULL);
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);
    g_variant_builder_init(&marks, G_VARIANT_TYPE("a(sx)"));
    g_variant_builder_add(&marks, "(sx)", "connect\x1b[31m", (gint64)0);
    payload = done(TRUE, 0, "", g_variant_builder_end(&marks));
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, NULL);
    g_clear_error(&error);
    g_clear_pointer(&payload, g_variant_unref);

    /* A mark from the future or the past is kept within the request's time. */
    vm_trace_init(&trace);
    g_variant_builder_init(&marks, G_VARIANT_TYPE("a(sx)"));
    g_variant_builder_add(&marks, "(sx)", "early", G_MININT64);
    g_variant_builder_add(&marks, "(sx)", "late", G_MAXINT64);
    payload = done(TRUE, 0, "", g_variant_builder_end(&marks));
    assert_true(hostd_ssh_wire_done_parse(payload, &trace, &error));
    assert_true(trace.last >= trace.start && trace.last <= g_get_monotonic_time());
    vm_trace_clear(&trace);
    g_clear_pointer(&payload, g_variant_unref);

    /* Another type altogether. */
    payload = g_variant_ref_sink(g_variant_new("(bs)", TRUE, "done"));
    assert_false(hostd_ssh_wire_done_parse(payload, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_PROTOCOL, NULL);
}

/* A worker's "ready": what its confinement lacks, as one bounded line of printable text; nothing
 * for an empty note or a payload of another type (an older worker's ()). */
static void
test_ready_note(void **state)
{
    g_autoptr(GVariant) empty = g_variant_ref_sink(g_variant_new_string(""));
    g_autoptr(GVariant) unit = g_variant_ref_sink(g_variant_new("()"));
    g_autoptr(GVariant) hostile =
        g_variant_ref_sink(g_variant_new_string("no Landlock\n\033[2Jforged line"));
    g_autofree char *long_text = g_strnfill(10000, 'x');
    g_autoptr(GVariant) longer = g_variant_ref_sink(g_variant_new_string(long_text));
    g_autofree char *note = NULL;
    g_autofree char *long_note = NULL;

    assert_null(hostd_ssh_wire_ready_note(empty));
    assert_null(hostd_ssh_wire_ready_note(unit));
    assert_null(hostd_ssh_wire_ready_note(NULL));
    note = hostd_ssh_wire_ready_note(hostile);
    assert_string_equal(note, "no Landlock??[2Jforged line");
    long_note = hostd_ssh_wire_ready_note(longer);
    assert_int_equal(strlen(long_note), HOSTD_SSH_WIRE_MESSAGE_MAX);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_roundtrip),
        cmocka_unit_test(test_exec_roundtrip),
        cmocka_unit_test(test_done),
        cmocka_unit_test(test_done_hostile),
        cmocka_unit_test(test_ready_note),
    };

    return cmocka_run_group_tests_name("ssh-wire", tests, NULL, NULL);
}
