/* hostd's power handling without VMs (hostd-power.c): pause, save and wake on libvirt's test
 * driver, the idle loop deciding by itself (its 2 s tick, so these tests take seconds), and the
 * relay waking an agent for a connection. hostd-idle.c's decisions are tested on their own in
 * test-idle.c; here the wiring is: which agents the loop acts on, with which signals, and what a
 * user then sees (state, state_since, checkpoints, log lines, bytes through the relay). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hostd-checkpoint.h"
#include "hostd-guest.h"
#include "hostd-power.h"
#include "hostd-relay.h"
#include "hostd-resources.h"
#include "hostd-ssh-worker.h"
#include "hostd-state.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "test-sink.h"

/* Long enough for three ticks of the idle loop and the work they start. */
#define IDLE_WAIT_MS 15000

static char *
state_of(GVariant *info)
{
    char *s = hostd_test_dict_string(info, "state");

    if (s == NULL)
        fail_msg("no state in the info");
    return s;
}

static gint64
state_since(HostdTestFixture *f, const char *name)
{
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, name);

    return r->state_since;
}

static void
set_idle(HostdTestFixture *f, const char *name, guint pause_s, guint save_s)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, name, FALSE, pause_s, save_s, &error));

    if (v == NULL)
        fail_msg("idle %s: %s", name, error->message);
}

static void
start_power(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);

    if (!hostd_power_start(f->ctx, notes, &error))
        fail_msg("power: %s", error->message);
    assert_int_equal(notes->len, 0);
}

static void
assert_state(HostdTestFixture *f, const char *name, const char *expected)
{
    const char *got = hostd_test_domain_state(f, name);

    if (!g_str_equal(got, expected))
        fail_msg("%s is %s, expected %s", name, got, expected);
}

/* ---- by hand: suspend, resume --------------------------------------------------------------- */

static void
test_suspend_resume(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;
    gint64 since = state_since(f, "a1");

    /* Pause: vCPUs stop, and the agent says since when. */
    g_autoptr(GVariant) paused = hostd_test_sink(hostd_agent_suspend(f->ctx, "a1", FALSE, &error));
    g_autofree char *paused_state = state_of(paused);
    gint64 shown_since = 0;
    assert_string_equal(paused_state, "paused");
    assert_state(f, "a1", "paused");
    assert_true(g_variant_lookup(paused, "state_since", "x", &shown_since));
    assert_true(shown_since > since);
    assert_int_equal(state_since(f, "a1"), shown_since);
    g_autoptr(GVariant) again = hostd_test_sink(hostd_agent_suspend(f->ctx, "a1", FALSE, &error));
    assert_null(again);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "paused");
    g_clear_error(&error);

    /* Resume: running again, and the guest clock is set (it lost the paused time). */
    g_autoptr(GVariant) resumed = hostd_test_sink(hostd_agent_resume(f->ctx, "a1", &error));
    g_autofree char *resumed_state = state_of(resumed);
    assert_string_equal(resumed_state, "running");
    assert_state(f, "a1", "running");
    assert_int_equal(hostd_test_fake_clock_sets("a1"), 1);
    /* Resuming a running agent is success and changes nothing. */
    g_autoptr(GVariant) noop = hostd_test_sink(hostd_agent_resume(f->ctx, "a1", &error));
    assert_non_null(noop);
    assert_int_equal(hostd_test_fake_clock_sets("a1"), 1);

    /* Save: RAM to disk, no process; a saved agent is neither paused nor saved again. */
    g_autoptr(GVariant) saved = hostd_test_sink(hostd_agent_suspend(f->ctx, "a1", TRUE, &error));
    g_autofree char *saved_state = state_of(saved);
    assert_string_equal(saved_state, "saved");
    assert_state(f, "a1", "saved");
    /* Its QEMU's SSH forward port is hostd's while it sleeps (no outgoing connection can take
     * it before the wake), QEMU's again after. */
    assert_false(hostd_port_is_free(r->backend_port));
    for (int save = 0; save < 2; save++) {
        g_autoptr(GVariant) v = hostd_test_sink(hostd_agent_suspend(f->ctx, "a1", save, &error));
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "saved");
        g_clear_error(&error);
    }
    g_autoptr(GVariant) restored = hostd_test_sink(hostd_agent_resume(f->ctx, "a1", &error));
    g_autofree char *restored_state = state_of(restored);
    assert_string_equal(restored_state, "running");
    assert_int_equal(hostd_test_fake_clock_sets("a1"), 2);
    assert_true(hostd_port_is_free(r->backend_port));

    /* A paused agent can be saved too. */
    g_autoptr(GVariant) p2 = hostd_test_sink(hostd_agent_suspend(f->ctx, "a1", FALSE, &error));
    g_autoptr(GVariant) s2 = hostd_test_sink(hostd_agent_suspend(f->ctx, "a1", TRUE, &error));
    assert_non_null(s2);
    assert_state(f, "a1", "saved");
    assert_true(hostd_power_wake(f->ctx, "a1", &error));
    assert_state(f, "a1", "running");
}

static void
test_suspend_refused(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "s1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    for (int save = 0; save < 2; save++) {
        g_autoptr(GVariant) v = hostd_test_sink(hostd_agent_suspend(f->ctx, "s1", save, &error));
        assert_null(v);
        hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "stopped");
        g_clear_error(&error);
    }
    /* A stopped agent is started, not woken. */
    g_autoptr(GVariant) resumed = hostd_test_sink(hostd_agent_resume(f->ctx, "s1", &error));
    assert_null(resumed);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "vmctl start s1");
    g_clear_error(&error);
    assert_state(f, "s1", "stopped");

    g_autoptr(GVariant) nobody =
        hostd_test_sink(hostd_agent_suspend(f->ctx, "nobody", FALSE, &error));
    assert_null(nobody);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    g_clear_error(&error);
    assert_false(hostd_power_wake(f->ctx, "nobody", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
}

/* A saved state that no longer loads costs the RAM, not the agent: it boots from its disk. */
static void
test_wake_unloadable_saved_state(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_SAVED);
    g_autoptr(GError) error = NULL;

    hostd_test_fake_saved_restore_fails(1);
    if (!hostd_power_wake(f->ctx, "a1", &error))
        fail_msg("wake: %s", error->message);
    assert_state(f, "a1", "running");
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "a1", NULL);
    assert_int_equal(virDomainHasManagedSaveImage(dom, 0), 0);
    hostd_test_assert_logged("agent 'a1': saved state did not restore");
    hostd_test_assert_logged("booting instead");
}

static void
test_set_idle(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;

    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, "a1", FALSE, 60, 600, &error));
    g_autofree char *idle = hostd_test_dict_string(v, "idle");
    assert_string_equal(idle, "pause after 60s, save after 600s");
    g_autoptr(HostdAgentRecord) stored = hostd_test_agent_record(f, "a1");
    assert_false(stored->idle_never);
    assert_int_equal(stored->idle_pause_s, 60);
    assert_int_equal(stored->idle_save_s, 600);

    g_autoptr(GVariant) never =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, "a1", TRUE, 60, 600, &error));
    g_autofree char *idle2 = hostd_test_dict_string(never, "idle");
    assert_string_equal(idle2, "never");
    g_autoptr(HostdAgentRecord) stored2 = hostd_test_agent_record(f, "a1");
    assert_true(stored2->idle_never);
    assert_int_equal(stored2->idle_pause_s, 0);
    assert_int_equal(stored2->idle_save_s, 0);

    g_autoptr(GVariant) nobody =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, "nobody", FALSE, 1, 2, &error));
    assert_null(nobody);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    g_clear_error(&error);
    g_autoptr(GVariant) bad =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, "../a1", FALSE, 1, 2, &error));
    assert_null(bad);
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, NULL);
}

/* keep-awake wakes the agent first; on a stopped one only its release works. */
static void
test_keep_awake_wakes(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) p = hostd_test_agent_new(f, "p1", HOSTD_TEST_PAUSED);
    g_autoptr(HostdAgentRecord) s = hostd_test_agent_new(f, "s1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    start_power(f);
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "p1", 60, FALSE, &error));
    g_autofree char *shown = state_of(v);
    assert_string_equal(shown, "running");
    assert_state(f, "p1", "running");

    g_autoptr(GVariant) stopped =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "s1", 0, FALSE, &error));
    assert_null(stopped);
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "s1");
    g_clear_error(&error);
    g_autoptr(GVariant) off =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "s1", 0, TRUE, &error));
    assert_non_null(off);
    assert_state(f, "s1", "stopped");
    g_autoptr(GVariant) nobody =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "nobody", 0, TRUE, &error));
    assert_null(nobody);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
}

/* ---- the idle loop -------------------------------------------------------------------------- */

/* A running agent with an idle guest and a one-second pause level. */
static HostdAgentRecord *
idle_agent(HostdTestFixture *f, const char *name)
{
    HostdAgentRecord *r = hostd_test_agent_new(f, name, HOSTD_TEST_RUNNING);

    hostd_test_fake_idle_cpu(name);
    set_idle(f, name, 1, 0);
    return r;
}

/* Only an agent that is idle by every signal is paused: not one whose guest is busy or whose CPU
 * use cannot be read, nor one held awake, with a session open, with the policy never, without a
 * backend port, or whose lock an operation holds. Releasing what held them lets them go too. */
static void
test_idle_pauses(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    start_power(f);
    g_autoptr(HostdAgentRecord) idle = idle_agent(f, "idle");
    g_autoptr(HostdAgentRecord) busy = hostd_test_agent_new(f, "busy", HOSTD_TEST_RUNNING);
    set_idle(f, "busy", 1, 0);
    g_autoptr(HostdAgentRecord) blind = idle_agent(f, "blind");
    hostd_test_fake_cpu_unreadable("blind");
    g_autoptr(HostdAgentRecord) kept = idle_agent(f, "kept");
    g_autoptr(GVariant) k =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "kept", 0, FALSE, &error));
    assert_non_null(k);
    g_autoptr(HostdAgentRecord) session = idle_agent(f, "session");
    hostd_power_session_begin(f->ctx, "session");
    g_autoptr(HostdAgentRecord) never = idle_agent(f, "never");
    g_autoptr(GVariant) n =
        hostd_test_sink(hostd_agent_set_idle(f->ctx, "never", TRUE, 0, 0, &error));
    assert_non_null(n);
    g_autoptr(HostdAgentRecord) legacy = idle_agent(f, "legacy");
    g_autoptr(HostdAgentRecord) legacy_r = hostd_test_agent_record(f, "legacy");
    legacy_r->backend_port = 0;
    assert_true(hostd_agent_record_save(legacy_r, &error));
    g_autoptr(HostdAgentRecord) locked = idle_agent(f, "locked");
    GMutex *lock = hostd_name_lock(f->ctx, "locked");
    gint64 since = state_since(f, "idle");

    if (!hostd_test_wait_state(f, "idle", "paused", IDLE_WAIT_MS))
        fail_msg("the idle agent was not paused");
    /* Two more ticks for the others (and for the record, written after the pause). */
    g_usleep(4500 * 1000);
    hostd_test_assert_logged("agent 'idle' paused: idle longer than pause_after");
    assert_true(state_since(f, "idle") > since);
    static const char *const awake[] = {"busy",  "blind",  "kept",  "session",
                                        "never", "legacy", "locked"};
    for (gsize i = 0; i < G_N_ELEMENTS(awake); i++)
        assert_state(f, awake[i], "running");

    /* Released, they are idle from then on, and paused a pause level later. */
    g_autoptr(GVariant) k_off =
        hostd_test_sink(hostd_agent_keep_awake(f->ctx, "kept", 0, TRUE, &error));
    assert_non_null(k_off);
    hostd_power_session_end(f->ctx, "session");
    hostd_name_unlock(lock);
    if (!hostd_test_wait_state(f, "kept", "paused", IDLE_WAIT_MS))
        fail_msg("kept was not paused once released");
    if (!hostd_test_wait_state(f, "session", "paused", IDLE_WAIT_MS))
        fail_msg("session was not paused once its session closed");
    if (!hostd_test_wait_state(f, "locked", "paused", IDLE_WAIT_MS))
        fail_msg("locked was not paused once its lock was free");
}

/* The save level: a paused agent is saved, and so is a running one when pausing is off; each
 * gets its before-save checkpoint first. */
static void
test_idle_saves(void **state)
{
    HostdTestFixture *f = *state;

    start_power(f);
    g_autoptr(HostdAgentRecord) p = hostd_test_agent_new(f, "p1", HOSTD_TEST_PAUSED);
    set_idle(f, "p1", 0, 1);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "r1", HOSTD_TEST_RUNNING);
    hostd_test_fake_idle_cpu("r1");
    set_idle(f, "r1", 0, 1);

    if (!hostd_test_wait_state(f, "p1", "saved", IDLE_WAIT_MS))
        fail_msg("the paused agent was not saved");
    if (!hostd_test_wait_state(f, "r1", "saved", IDLE_WAIT_MS))
        fail_msg("the running agent was not saved");
    hostd_test_assert_logged("agent 'p1' saved to disk: idle longer than save_after");
    hostd_test_assert_logged("agent 'r1' saved to disk: idle longer than save_after");
    for (int i = 0; i < 2; i++) {
        const char *name = i == 0 ? "p1" : "r1";
        g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, name);
        assert_int_equal(set->checkpoints->len, 1);
        const VmCheckpoint *c = set->checkpoints->pdata[0];
        assert_string_equal(c->label, HOSTD_BEFORE_SAVE_LABEL);
        assert_true(c->automatic);
    }

    /* Woken by hand, it runs and its clock is set. */
    g_autoptr(GError) error = NULL;
    assert_true(hostd_power_wake(f->ctx, "p1", &error));
    assert_state(f, "p1", "running");
    assert_true(hostd_test_fake_clock_sets("p1") >= 1);
}

/* The loop takes periodic checkpoints of running agents only. */
static void
test_idle_periodic_checkpoints(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    start_power(f);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "r1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) p = hostd_test_agent_new(f, "p1", HOSTD_TEST_PAUSED);
    g_autoptr(GVariant) v1 =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "r1", FALSE, 3600, 5, 0, 0, &error));
    g_autoptr(GVariant) v2 =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "p1", FALSE, 3600, 5, 0, 0, &error));
    assert_non_null(v1);
    assert_non_null(v2);
    g_autofree char *record = hostd_test_agent_file(f, "r1", VM_CHECKPOINT_RECORD);

    for (int i = 0; i < 100 && !g_file_test(record, G_FILE_TEST_EXISTS); i++)
        g_usleep(100 * 1000);
    g_usleep(2500 * 1000); /* and one more tick: not due again */
    g_autofree char *ids = hostd_test_checkpoint_ids(f, "r1");
    assert_string_equal(ids, "c1");
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "r1");
    assert_string_equal(vm_checkpoint_set_find(set, "c1")->label, HOSTD_PERIODIC_LABEL);
    g_autofree char *paused_ids = hostd_test_checkpoint_ids(f, "p1");
    assert_string_equal(paused_ids, "");
    assert_state(f, "r1", "running");
    assert_state(f, "p1", "paused");
}

/* One agent's SSH worker stopped (SIGSTOP: its agent's QEMU could send it) holds the idle loop
 * up for its answer deadline at most, once: the sleep before the save gives up on it, kills it,
 * and both that agent and another are saved by the same loop. */
static void
test_idle_save_stopped_worker(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autofree char *program = hostd_ssh_worker_path();
    HostdSshWorkersConfig config = {
        .program = program, .answer_timeout_ms = 2000, .sleep_grace_ms = 1};
    g_autofree char *identity = NULL, *known_hosts = NULL;
    g_autofree char *key_path = NULL, *hosts_path = NULL, *line = NULL;
    g_autofree char *proc = NULL;
    HostdSshTarget target;
    GPid pid;

    /* Workers that run the agents' SSH as hostd's do, with a short deadline. */
    f->ctx->ssh_workers = hostd_ssh_workers_new(&config);
    hostd_ssh_pool_set_delegate(f->ctx->ssh, &hostd_ssh_workers_delegate, f->ctx->ssh_workers);
    g_autoptr(HostdAgentRecord) stuck = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) other = hostd_test_agent_new(f, "z1", HOSTD_TEST_RUNNING);

    /* a1's worker runs (its guest never answers: nothing listens), then is stopped. */
    key_path = hostd_agent_record_path(stuck, HOSTD_AGENT_KEY);
    hosts_path = hostd_agent_record_path(stuck, HOSTD_AGENT_KNOWN_HOSTS);
    line = g_strdup_printf("[127.0.0.1]:%u ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n",
                           stuck->backend_port);
    vm_test_write_file(key_path, "not a key: never read, no guest answers");
    vm_test_write_file(hosts_path, line);
    hostd_guest_ssh_target(&target, stuck, &identity, &known_hosts);
    assert_false(hostd_ssh_wait_ready(f->ctx->ssh, &target, 1, NULL, &error));
    pid = hostd_ssh_workers_get_pid(f->ctx->ssh_workers, "a1");
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);

    start_power(f);
    hostd_test_fake_idle_cpu("a1");
    hostd_test_fake_idle_cpu("z1");
    set_idle(f, "a1", 0, 1);
    set_idle(f, "z1", 0, 1);
    if (!hostd_test_wait_state(f, "a1", "saved", IDLE_WAIT_MS))
        fail_msg("the agent with the stopped worker was not saved");
    if (!hostd_test_wait_state(f, "z1", "saved", IDLE_WAIT_MS))
        fail_msg("the other agent was not saved");
    hostd_test_assert_logged("agent 'z1' saved to disk: idle longer than save_after");
    assert_int_equal(hostd_ssh_workers_get_pid(f->ctx->ssh_workers, "a1"), 0);
    proc = g_strdup_printf("/proc/%d", (int)pid);
    for (int i = 0; i < 100 && g_file_test(proc, G_FILE_TEST_EXISTS); i++)
        g_usleep(50 * 1000);
    assert_false(g_file_test(proc, G_FILE_TEST_EXISTS));
}

/* ---- the relay's wake ----------------------------------------------------------------------- */

/* Puts @name's public port on a free port under the relay, in front of @backend_port. */
static guint
attach(HostdTestFixture *f, const char *name, guint backend_port)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record(f, name);
    guint16 port = vm_test_free_port();

    r->ssh_port = port;
    r->backend_port = backend_port;
    assert_true(hostd_agent_record_save(r, &error));
    if (!hostd_power_attach(f->ctx, r, &error))
        fail_msg("attach: %s", error->message);
    return port;
}

/* A connection to a paused or saved agent's public port wakes it, then reaches the guest; one to
 * a stopped agent is closed without reaching anything. */
static void
test_relay_wakes(void **state)
{
    HostdTestFixture *f = *state;
    VmTestSink *echo = vm_test_sink_new();

    start_power(f);
    g_autoptr(HostdAgentRecord) p = hostd_test_agent_new(f, "p1", HOSTD_TEST_PAUSED);
    g_autoptr(HostdAgentRecord) s = hostd_test_agent_new(f, "s1", HOSTD_TEST_SAVED);
    g_autoptr(HostdAgentRecord) x = hostd_test_agent_new(f, "x1", HOSTD_TEST_STOPPED);
    const char *const names[] = {"p1", "s1"};

    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        guint port = attach(f, names[i], echo->port);
        int fd = vm_test_connect_loopback(port, 10);
        char buf[16] = {0};
        assert_int_equal(send(fd, "hello", 5, MSG_NOSIGNAL), 5);
        gssize n = 0, got = 0;
        while (got < 5 && (n = recv(fd, buf + got, sizeof(buf) - 1 - (gsize)got, 0)) > 0)
            got += n;
        close(fd);
        assert_int_equal(got, 5);
        assert_string_equal(buf, "hello");
        assert_state(f, names[i], "running");
        assert_int_equal(hostd_test_fake_clock_sets(names[i]), 1);
    }
    gint bytes = g_atomic_int_get(&echo->bytes);
    assert_int_equal(bytes, 10);

    guint port = attach(f, "x1", echo->port);
    int fd = vm_test_connect_loopback(port, 10);
    char byte;
    (void)send(fd, "hello", 5, MSG_NOSIGNAL);
    gssize n = recv(fd, &byte, 1, 0);
    close(fd);
    assert_true(n == 0 || (n < 0 && errno == ECONNRESET));
    assert_int_equal(g_atomic_int_get(&echo->bytes), bytes);
    assert_state(f, "x1", "stopped");
    hostd_test_assert_logged("agent 'x1': connection refused");
    hostd_power_stop(f->ctx);
    vm_test_sink_free(echo);
}

/* ---- ports: held from their choice, moved when taken ---------------------------------------- */

/* A socket listening on 127.0.0.1:@port as another program's would (SO_REUSEADDR, as QEMU's and
 * another hostd's); -1 when the port cannot be had. */
static int
other_listener(guint port)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;

    assert_true(fd >= 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 8) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Eight free consecutive ports as hostd's range; returns the first. */
static guint
port_range(HostdTestFixture *f)
{
    for (int tries = 0; tries < 50; tries++) {
        guint base = vm_test_free_port();
        gboolean all = base + 8 <= 65535;
        for (guint p = base; all && p < base + 8; p++) {
            int fd = other_listener(p);
            all = fd >= 0;
            if (fd >= 0)
                close(fd);
        }
        if (all) {
            f->ctx->config->ssh_port_min = base;
            f->ctx->config->ssh_port_max = base + 7;
            return base;
        }
    }
    fail_msg("no eight free consecutive ports");
    return 0;
}

/* Another program holds the first ports of the range: `new` takes the next ones and holds them
 * from their choice, so one that binds the chosen port before the relay listens on it and QEMU
 * forwards from it finds it taken; the relay then serves the very socket chosen. */
static void
test_ports_held_from_choice(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    start_power(f);
    guint base = port_range(f);
    int held[2] = {other_listener(base), other_listener(base + 1)};
    assert_true(held[0] >= 0 && held[1] >= 0);

    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f, "n1");
    r->ssh_port = r->backend_port = 0;
    if (!hostd_agent_reserve(f->ctx, r, &error))
        fail_msg("reserve: %s", error->message);
    assert_int_equal(r->ssh_port, base + 2);
    assert_int_equal(r->backend_port, base + 3);
    /* Between the choice and the use: another hostd's or QEMU's bind fails. */
    assert_int_equal(other_listener(r->ssh_port), -1);
    assert_int_equal(other_listener(r->backend_port), -1);
    /* The backend is let go for QEMU, the public port stays held until the relay takes it. */
    hostd_ports_release_backend(f->ctx, "n1");
    int qemu = other_listener(r->backend_port);
    assert_true(qemu >= 0);
    if (!hostd_power_attach(f->ctx, r, &error))
        fail_msg("attach: %s", error->message);
    assert_int_equal(r->ssh_port, base + 2);
    assert_int_equal(hostd_ports_take_public(f->ctx, "n1"), -1);
    int fd = vm_test_connect_loopback((guint16)r->ssh_port, 10);
    assert_true(fd >= 0);
    close(fd);

    hostd_power_stop(f->ctx);
    close(qemu);
    close(held[0]);
    close(held[1]);
}

/* A rolled-back `new` lets its ports go. */
static void
test_ports_released_on_rollback(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    guint base = port_range(f);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_record_new(f, "n1");
    r->ssh_port = r->backend_port = 0;
    assert_true(hostd_agent_reserve(f->ctx, r, &error));
    assert_int_equal(r->ssh_port, base);
    hostd_agent_rollback(f->ctx, r->name, r->dir);
    for (guint p = base; p < base + 2; p++) {
        int fd = other_listener(p);
        assert_true(fd >= 0);
        close(fd);
    }
}

/* The public port taken while hostd was away (a host restart): hostd serves the agent on the
 * next free port, records it in the record, known_hosts and ssh_config, and says so. */
static void
test_public_port_moved(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    start_power(f);
    guint base = port_range(f);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "m1", HOSTD_TEST_RUNNING);
    r->ssh_port = base;
    r->backend_port = base + 1;
    assert_true(hostd_agent_record_save(r, &error));
    g_autofree char *known = hostd_test_agent_file(f, "m1", HOSTD_AGENT_KNOWN_HOSTS);
    g_autofree char *pins = g_strdup_printf("[127.0.0.1]:%u ssh-ed25519 AAAAkey\n"
                                            "[127.0.0.1]:%u ssh-ed25519 AAAAkey\n",
                                            base, base + 1);
    assert_true(g_file_set_contents(known, pins, -1, NULL));
    int taker = other_listener(base);
    int next = other_listener(base + 2);
    assert_true(taker >= 0 && next >= 0);

    if (!hostd_power_attach(f->ctx, r, &error))
        fail_msg("attach: %s", error->message);
    assert_int_equal(r->ssh_port, base + 3);
    g_autoptr(HostdAgentRecord) on_disk = hostd_test_agent_record(f, "m1");
    assert_int_equal(on_disk->ssh_port, base + 3);
    assert_int_equal(on_disk->backend_port, base + 1);
    g_autofree char *text = NULL;
    assert_true(g_file_get_contents(known, &text, NULL, NULL));
    g_autofree char *want = g_strdup_printf("[127.0.0.1]:%u ssh-ed25519 AAAAkey\n"
                                            "[127.0.0.1]:%u ssh-ed25519 AAAAkey\n",
                                            base + 3, base + 1);
    assert_string_equal(text, want);
    g_autofree char *config_path = hostd_test_agent_file(f, "m1", HOSTD_AGENT_SSH_CONFIG);
    g_autofree char *config = NULL;
    assert_true(g_file_get_contents(config_path, &config, NULL, NULL));
    g_autofree char *port_line = g_strdup_printf("  Port %u\n", base + 3);
    assert_non_null(strstr(config, port_line));
    g_autofree char *said = g_strdup_printf("port %u on 127.0.0.1 was taken", base);
    hostd_test_assert_logged(said);
    int fd = vm_test_connect_loopback((guint16)(base + 3), 10);
    assert_true(fd >= 0);
    close(fd);

    hostd_power_stop(f->ctx);
    close(taker);
    close(next);
}

/* A start that finds its QEMU's forward taken: the forward moves to the next free port, in the
 * record and the definition, before QEMU starts. */
static void
test_backend_port_moved_at_start(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    guint base = port_range(f);
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "m2", HOSTD_TEST_STOPPED);
    r->ssh_port = base;
    r->backend_port = base + 1;
    assert_true(hostd_agent_record_save(r, &error));
    int taker = other_listener(base + 1);
    assert_true(taker >= 0);

    g_autoptr(GVariant) started =
        hostd_test_sink(hostd_agent_start(f->ctx, "m2", FALSE, NULL, NULL, &error));
    if (started == NULL)
        fail_msg("start: %s", error->message);
    assert_state(f, "m2", "running");
    g_autoptr(HostdAgentRecord) on_disk = hostd_test_agent_record(f, "m2");
    assert_int_equal(on_disk->ssh_port, base);
    assert_int_equal(on_disk->backend_port, base + 2);
    g_autofree char *xml_path = hostd_test_agent_file(f, "m2", HOSTD_AGENT_DOMAIN_XML);
    g_autofree char *xml = NULL;
    assert_true(g_file_get_contents(xml_path, &xml, NULL, NULL));
    g_autofree char *fwd = g_strdup_printf("127.0.0.1:%u-:22", base + 2);
    assert_non_null(strstr(xml, fwd));
    g_autofree char *said = g_strdup_printf("port %u on 127.0.0.1 was taken", base + 1);
    hostd_test_assert_logged(said);
    close(taker);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, hostd_test_setup, hostd_test_teardown)
        T(test_suspend_resume),
        T(test_suspend_refused),
        T(test_wake_unloadable_saved_state),
        T(test_set_idle),
        T(test_keep_awake_wakes),
        T(test_idle_pauses),
        T(test_idle_saves),
        T(test_idle_periodic_checkpoints),
        T(test_idle_save_stopped_worker),
        T(test_relay_wakes),
        T(test_ports_held_from_choice),
        T(test_ports_released_on_rollback),
        T(test_public_port_moved),
        T(test_backend_port_moved_at_start),
#undef T
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
