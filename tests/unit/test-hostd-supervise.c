/* hostd's supervisor and the save of every agent (hostd-supervise.c, hostd-shutdown.c) on
 * libvirt's test driver, whose lifecycle events are real: a domain destroyed behind hostd's back
 * stands for a QEMU that died (a crash), a domain shut down for a guest that powered itself off.
 * What a user relies on: a crash boots the agent again and is counted, past the limit it is
 * left crashed until `start`, a poweroff from inside is honoured unless `restart: always`,
 * hostd's own stop is no crash, and at start-up the agents whose QEMU is gone come back. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <json-glib/json-glib.h>

#include "hostd-booting.h"
#include "hostd-keys.h"
#include "hostd-shutdown.h"
#include "hostd-supervise.h"
#include "test-common.h"
#include "test-hostd-fixture.h"

#define EVENT_WAIT_MS 5000

/* A ready agent with its domain at @state, wanted as @wanted. */
static void
agent_new(HostdTestFixture *f, const char *name, HostdTestState state, const char *wanted)
{
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, name, state);

    g_free(r->wanted);
    r->wanted = g_strdup(wanted);
    assert_true(hostd_agent_record_save(r, NULL));
}

static void
supervise_start(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;

    if (!hostd_supervise_start(f->ctx, &error))
        fail_msg("supervisor: %s", error->message);
}

/* Behind hostd's back, as a QEMU that died. */
static void
domain_destroy(HostdTestFixture *f, const char *name)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, name, NULL);

    assert_non_null(dom);
    assert_int_equal(virDomainDestroy(dom), 0);
}

/* How many events @event about @agent the event log holds. */
static guint
events_count(HostdTestFixture *f, const char *agent, const char *event)
{
    g_autofree char *path = g_build_filename(f->ctx->state->dir, HOSTD_EVENTS_LOG, NULL);
    g_autofree char *text = NULL;
    guint n = 0;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return 0;
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (char **l = lines; *l != NULL; l++) {
        if (**l == '\0')
            continue;
        g_autoptr(JsonParser) parser = json_parser_new();
        if (!json_parser_load_from_data(parser, *l, -1, NULL))
            fail_msg("not JSON in the event log: %s", *l);
        JsonObject *o = json_node_get_object(json_parser_get_root(parser));
        if (g_strcmp0(json_object_get_string_member_with_default(o, "agent", ""), agent) == 0 &&
            g_strcmp0(json_object_get_string_member_with_default(o, "event", ""), event) == 0)
            n++;
    }
    return n;
}

/* Waits up to @timeout_ms for @n events @event about @agent. */
static gboolean
wait_events(HostdTestFixture *f, const char *agent, const char *event, guint n, guint timeout_ms)
{
    gint64 deadline = g_get_monotonic_time() + (gint64)timeout_ms * 1000;

    while (g_get_monotonic_time() < deadline) {
        if (events_count(f, agent, event) >= n)
            return TRUE;
        g_usleep(20 * 1000);
    }
    return FALSE;
}

static char *
info_state(HostdTestFixture *f, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) info = hostd_test_sink(hostd_agent_info(f->ctx, name, &error));

    if (info == NULL)
        fail_msg("info %s: %s", name, error->message);
    return hostd_test_dict_string(info, "state");
}

static void
test_backoff(void **state)
{
    assert_int_equal(hostd_supervise_backoff_s(1), 0);
    assert_int_equal(hostd_supervise_backoff_s(2), 2);
    assert_int_equal(hostd_supervise_backoff_s(3), 4);
    assert_int_equal(hostd_supervise_backoff_s(6), 32);
    assert_int_equal(hostd_supervise_backoff_s(7), 60);
    assert_int_equal(hostd_supervise_backoff_s(1000), 60);
}

/* The QEMU of a running agent dies: it is booted again at once, the crash counted and logged. */
static void
test_crash_restarts(void **state)
{
    HostdTestFixture *f = *state;

    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    supervise_start(f);
    domain_destroy(f, "a1");
    assert_true(wait_events(f, "a1", "restarted", 1, EVENT_WAIT_MS));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_int_equal(r->crash_count, 1);
    assert_null(r->crashed);
    assert_string_equal(r->wanted, HOSTD_WANTED_RUNNING);
    assert_int_equal(events_count(f, "a1", "crashed"), 1);
    g_autofree char *log = hostd_test_log_text();
    assert_non_null(strstr(log, "agent 'a1': its VM was destroyed from outside hostd"));
}

/* After a crash restart the agent is starting, not running, until its guest answers (here it
 * never does: the boot timeout ends the wait), and an exec sent meanwhile waits for that
 * instead of failing at once. */
static void
test_crash_restart_starting(void **state)
{
    HostdTestFixture *f = *state;

    f->ctx->config->boot_timeout_s = 2;
    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    /* hostd's key, as `new` leaves it: the guest is asked, and does not answer. */
    g_autoptr(HostdKeyPair) key = hostd_keypair_generate("vmctl-a1", NULL);
    g_autofree char *key_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_KEY);
    g_autofree char *pub_path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_KEY_PUB);
    assert_non_null(key);
    assert_true(hostd_keypair_save(key, key_path, pub_path, NULL));
    supervise_start(f);
    domain_destroy(f, "a1");
    assert_true(wait_events(f, "a1", "restarted", 1, EVENT_WAIT_MS));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    g_autofree char *shown = info_state(f, "a1");
    assert_string_equal(shown, "starting");
    assert_true(hostd_booting_is(f->ctx, "a1"));

    g_autoptr(GError) error = NULL;
    gint64 start = g_get_monotonic_time();
    assert_true(hostd_booting_wait(f->ctx, "a1", &error));
    /* Waited out the boot (2 s, each readiness attempt up to 5 s), not refused at once. */
    assert_true(g_get_monotonic_time() - start >= G_USEC_PER_SEC);
    g_autofree char *after = info_state(f, "a1");
    assert_string_equal(after, "running");
    g_autofree char *log = hostd_test_log_text();
    assert_non_null(strstr(log, "agent 'a1': booted by hostd, it did not answer SSH within 2 s"));
}

/* Past restart-limit crashes within the window: left crashed, shown so, until `start`. */
static void
test_crashes_past_the_limit(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    f->ctx->config->restart_limit = 1;
    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    supervise_start(f);
    domain_destroy(f, "a1");
    assert_true(wait_events(f, "a1", "restarted", 1, EVENT_WAIT_MS));
    assert_true(hostd_test_wait_state(f, "a1", "running", EVENT_WAIT_MS));
    domain_destroy(f, "a1");
    assert_true(wait_events(f, "a1", "crashed", 2, EVENT_WAIT_MS));
    g_usleep(300 * 1000);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");
    g_autofree char *shown = info_state(f, "a1");
    assert_string_equal(shown, "crashed");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_non_null(strstr(r->crashed, "2 crashes within 600s"));
    assert_string_equal(r->wanted, HOSTD_WANTED_STOPPED);

    g_autoptr(GVariant) info =
        hostd_test_sink(hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error));
    assert_non_null(info);
    g_autofree char *after = hostd_test_dict_string(info, "state");
    assert_string_equal(after, "running");
    g_autoptr(HostdAgentRecord) cleared = hostd_test_agent_record(f, "a1");
    assert_null(cleared->crashed);
    assert_int_equal(cleared->crash_count, 0);
}

/* restart: never: the first crash leaves it crashed. */
static void
test_restart_never(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    g_autoptr(GVariant) info =
        hostd_test_sink(hostd_agent_set_restart(f->ctx, "a1", HOSTD_RESTART_NEVER, &error));
    assert_non_null(info);
    supervise_start(f);
    domain_destroy(f, "a1");
    assert_true(wait_events(f, "a1", "crashed", 1, EVENT_WAIT_MS));
    g_usleep(300 * 1000);
    g_autofree char *shown = info_state(f, "a1");
    assert_string_equal(shown, "crashed");
    assert_int_equal(events_count(f, "a1", "restarted"), 0);
}

static void
test_set_restart_checks_the_policy(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    agent_new(f, "a1", HOSTD_TEST_STOPPED, HOSTD_WANTED_STOPPED);
    assert_null(hostd_agent_set_restart(f->ctx, "a1", "sometimes", &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "on-crash, always or never");
    g_clear_error(&error);
    assert_null(hostd_agent_set_restart(f->ctx, "zz", HOSTD_RESTART_ALWAYS, &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, NULL);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_string_equal(r->restart, HOSTD_RESTART_ON_CRASH);
}

/* The guest powers itself off: it stays off, and is wanted off from then on. */
static void
test_poweroff_is_honoured(void **state)
{
    HostdTestFixture *f = *state;

    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    supervise_start(f);
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    assert_int_equal(virDomainShutdown(dom), 0);
    assert_true(wait_events(f, "a1", "poweroff", 1, EVENT_WAIT_MS));
    g_usleep(300 * 1000);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_string_equal(r->wanted, HOSTD_WANTED_STOPPED);
    assert_int_equal(r->crash_count, 0);
}

/* ... unless its policy is restart: always. */
static void
test_poweroff_with_restart_always(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    g_autoptr(GVariant) info =
        hostd_test_sink(hostd_agent_set_restart(f->ctx, "a1", HOSTD_RESTART_ALWAYS, &error));
    assert_non_null(info);
    supervise_start(f);
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    assert_int_equal(virDomainShutdown(dom), 0);
    assert_true(wait_events(f, "a1", "restarted", 1, EVENT_WAIT_MS));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
}

/* hostd's own stop, forced or not, is neither a crash nor a poweroff. */
static void
test_stop_is_no_crash(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    agent_new(f, "a2", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    supervise_start(f);
    g_autoptr(GVariant) v1 =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, &error));
    assert_non_null(v1);
    g_autoptr(GVariant) v2 =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a2", FALSE, 5, NULL, NULL, &error));
    assert_non_null(v2);
    g_usleep(1000 * 1000);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "stopped");
    assert_string_equal(hostd_test_domain_state(f, "a2"), "stopped");
    assert_int_equal(events_count(f, "a1", "crashed") + events_count(f, "a2", "crashed") +
                         events_count(f, "a2", "poweroff"),
                     0);
}

/* At start-up: running and paused agents whose QEMU is gone boot, saved and stopped ones stay,
 * and a record from before the wanted state adopts what it finds. */
static void
test_start_up_recovers(void **state)
{
    HostdTestFixture *f = *state;

    agent_new(f, "gone", HOSTD_TEST_STOPPED, HOSTD_WANTED_RUNNING);
    agent_new(f, "was-paused", HOSTD_TEST_STOPPED, HOSTD_WANTED_PAUSED);
    agent_new(f, "saved", HOSTD_TEST_SAVED, HOSTD_WANTED_SAVED);
    agent_new(f, "off", HOSTD_TEST_STOPPED, HOSTD_WANTED_STOPPED);
    g_autoptr(HostdAgentRecord) old = hostd_test_agent_new(f, "old", HOSTD_TEST_PAUSED);
    supervise_start(f);

    assert_string_equal(hostd_test_domain_state(f, "gone"), "running");
    assert_string_equal(hostd_test_domain_state(f, "was-paused"), "running");
    assert_string_equal(hostd_test_domain_state(f, "saved"), "saved");
    assert_string_equal(hostd_test_domain_state(f, "off"), "stopped");
    assert_string_equal(hostd_test_domain_state(f, "old"), "paused");
    assert_int_equal(events_count(f, "gone", "recovered"), 1);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "old");
    assert_string_equal(r->wanted, HOSTD_WANTED_PAUSED);
    g_autoptr(HostdAgentRecord) g = hostd_test_agent_record(f, "gone");
    assert_int_equal(g->crash_count, 0);
    g_autofree char *log = hostd_test_log_text();
    assert_non_null(strstr(log, "agent 'gone': its QEMU was gone when hostd started"));
    assert_non_null(strstr(log, "what was in its RAM is lost"));
}

/* A stop cut short by hostd's end (the record says stopped, the VM still runs or is paused) is
 * finished at the next start, and says so; it is not taken for a crash. */
static void
test_start_up_finishes_a_stop(void **state)
{
    HostdTestFixture *f = *state;

    agent_new(f, "halfway", HOSTD_TEST_RUNNING, HOSTD_WANTED_STOPPED);
    agent_new(f, "halfway-paused", HOSTD_TEST_PAUSED, HOSTD_WANTED_STOPPED);
    agent_new(f, "up", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    supervise_start(f);

    assert_string_equal(hostd_test_domain_state(f, "halfway"), "stopped");
    assert_string_equal(hostd_test_domain_state(f, "halfway-paused"), "stopped");
    assert_string_equal(hostd_test_domain_state(f, "up"), "running");
    assert_int_equal(events_count(f, "halfway", "stopped"), 1);
    assert_int_equal(events_count(f, "halfway-paused", "stopped"), 1);
    assert_int_equal(events_count(f, "up", "stopped"), 0);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "halfway");
    assert_string_equal(r->wanted, HOSTD_WANTED_STOPPED);
    assert_int_equal(r->crash_count, 0);
    assert_null(r->crashed);
}

/* Every running and paused agent saved, in parallel, recorded as saved by a shutdown; then with
 * shutdown-resume = eager they resume at the next start, and the others stay saved. */
static void
test_save_all_then_resume_eager(void **state)
{
    HostdTestFixture *f = *state;
    double seconds = -1;

    agent_new(f, "a1", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    agent_new(f, "a2", HOSTD_TEST_PAUSED, HOSTD_WANTED_PAUSED);
    agent_new(f, "a3", HOSTD_TEST_STOPPED, HOSTD_WANTED_STOPPED);
    agent_new(f, "by-user", HOSTD_TEST_SAVED, HOSTD_WANTED_SAVED);
    g_autoptr(GVariant) results = hostd_save_all(f->ctx, 30, "a test", &seconds);
    assert_true(seconds >= 0);
    g_autofree char *text = g_variant_print(results, FALSE);
    assert_int_equal(g_variant_n_children(results), 2);
    assert_non_null(strstr(text, "'name': <'a1'>, 'saved': <true>"));
    assert_non_null(strstr(text, "'name': <'a2'>, 'saved': <true>"));
    assert_string_equal(hostd_test_domain_state(f, "a1"), "saved");
    assert_string_equal(hostd_test_domain_state(f, "a2"), "saved");
    assert_string_equal(hostd_test_domain_state(f, "a3"), "stopped");
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, "a1");
    assert_string_equal(r->wanted, HOSTD_WANTED_SAVED);
    assert_true(r->shutdown_saved);
    assert_int_equal(events_count(f, "a1", "saved"), 1);

    f->ctx->config->shutdown_resume_eager = TRUE;
    supervise_start(f);
    assert_string_equal(hostd_test_domain_state(f, "a1"), "running");
    assert_string_equal(hostd_test_domain_state(f, "a2"), "running");
    assert_string_equal(hostd_test_domain_state(f, "by-user"), "saved");
    assert_string_equal(hostd_test_domain_state(f, "a3"), "stopped");
    g_autoptr(HostdAgentRecord) after = hostd_test_agent_record(f, "a1");
    assert_string_equal(after->wanted, HOSTD_WANTED_RUNNING);
    assert_false(after->shutdown_saved);
    assert_int_equal(events_count(f, "a1", "resumed"), 1);
}

/* An operation holding an agent delays the save; past the bound the agent is left running. */
static void
test_save_all_bound(void **state)
{
    HostdTestFixture *f = *state;
    double seconds = -1;

    agent_new(f, "busy", HOSTD_TEST_RUNNING, HOSTD_WANTED_RUNNING);
    GMutex *held = hostd_name_lock(f->ctx, "busy");
    g_autoptr(GVariant) results = hostd_save_all(f->ctx, 1, "a test", &seconds);
    hostd_name_unlock(held);
    assert_true(seconds >= 1 && seconds < 5);
    g_autofree char *text = g_variant_print(results, FALSE);
    assert_non_null(strstr(text, "'saved': <false>"));
    assert_non_null(strstr(text, "out of time"));
    assert_string_equal(hostd_test_domain_state(f, "busy"), "running");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff),
        cmocka_unit_test_setup_teardown(test_crash_restarts, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_crash_restart_starting, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_crashes_past_the_limit, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_restart_never, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_set_restart_checks_the_policy, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_poweroff_is_honoured, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_poweroff_with_restart_always, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_stop_is_no_crash, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_start_up_recovers, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_start_up_finishes_a_stop, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_save_all_then_resume_eager, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_save_all_bound, hostd_test_setup, hostd_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
