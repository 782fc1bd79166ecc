/* Idle decisions: scenarios of ticks with an injected clock (running -> paused -> saved, what
 * keeps an agent awake, what resets the idle time, policy variants) and the guest CPU
 * arithmetic, each as a table. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-idle.h"

/* Times in the tables are seconds on the injected monotonic clock. */
#define S(sec) (G_TIME_SPAN_SECOND * (sec))

#define RUN   HOSTD_POWER_RUNNING
#define PAUSE HOSTD_POWER_PAUSED
#define SAVE  HOSTD_POWER_SAVED
#define STOP  HOSTD_POWER_STOPPED

#define NONE     HOSTD_IDLE_ACTION_NONE
#define DO_PAUSE HOSTD_IDLE_ACTION_PAUSE
#define DO_SAVE  HOSTD_IDLE_ACTION_SAVE

/* Expect idle_since == 0 (not idle). */
#define NOT_IDLE (-1)

typedef struct {
    gint64 at; /* now; > 0, and 0 ends the list */
    HostdPowerState state;
    guint conns;
    guint sessions;
    gint64 activity;   /* last activity; 0: none */
    double cpu;        /* % of one vCPU; -1: unknown */
    double threshold;  /* 0: HOSTD_IDLE_CPU_THRESHOLD */
    gint64 keep_until; /* 0: not held */
    HostdIdleAction expect;
    const char *reason; /* substring the reason must contain; NULL: any */
    gint64 since;       /* expected idle_since; 0: not checked, NOT_IDLE: must be 0 */
} Step;

typedef struct {
    const char *name;
    HostdIdlePolicy policy;
    Step steps[12];
} Scenario;

/* 5 minutes to pause, 30 minutes to save: the template default. */
#define POLICY_5M_30M .pause_after_s = 300, .save_after_s = 1800

static const Scenario scenarios[] = {
    {"running, then paused, then saved by itself",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .expect = NONE, .reason = "not yet", .since = 1},
      {.at = 300, .state = RUN, .expect = NONE, .since = 1},
      {.at = 301, .state = RUN, .expect = DO_PAUSE, .reason = "pause_after", .since = 1},
      {.at = 302, .state = PAUSE, .expect = NONE, .reason = "not yet save_after", .since = 1},
      {.at = 1800, .state = PAUSE, .expect = NONE, .since = 1},
      {.at = 1801, .state = PAUSE, .expect = DO_SAVE, .reason = "save_after", .since = 1},
      {.at = 1802, .state = SAVE, .expect = NONE, .reason = "saved"}}},

    {"an open connection keeps it running; idle counts from the close",
     {POLICY_5M_30M},
     {{.at = 1,
       .state = RUN,
       .conns = 1,
       .expect = NONE,
       .reason = "connection",
       .since = NOT_IDLE},
      {.at = 400, .state = RUN, .conns = 2, .expect = NONE, .reason = "connection"},
      {.at = 401, .state = RUN, .activity = S(400), .expect = NONE, .since = 401},
      {.at = 700, .state = RUN, .activity = S(400), .expect = NONE},
      {.at = 701, .state = RUN, .activity = S(400), .expect = DO_PAUSE}}},

    {"an open exec session keeps it running past every threshold",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .sessions = 1, .expect = NONE, .reason = "session"},
      {.at = 5000,
       .state = RUN,
       .sessions = 1,
       .expect = NONE,
       .reason = "session",
       .since = NOT_IDLE},
      {.at = 5001, .state = RUN, .expect = NONE, .since = 5001},
      {.at = 5301, .state = RUN, .expect = DO_PAUSE}}},

    {"guest CPU above the threshold resets idle time",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .cpu = 1.0, .expect = NONE, .since = 1},
      {.at = 250, .state = RUN, .cpu = 50.0, .expect = NONE, .reason = "CPU", .since = NOT_IDLE},
      {.at = 260, .state = RUN, .cpu = 4.9, .expect = NONE, .since = 260},
      {.at = 559, .state = RUN, .cpu = 0.2, .expect = NONE},
      {.at = 560, .state = RUN, .cpu = 0.2, .expect = DO_PAUSE}}},

    {"CPU at exactly the threshold is busy; the threshold is the caller's",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .cpu = 5.0, .expect = NONE, .reason = "CPU", .since = NOT_IDLE},
      {.at = 2, .state = RUN, .cpu = 5.0, .threshold = 10.0, .expect = NONE, .since = 2},
      {.at = 302, .state = RUN, .cpu = 9.9, .threshold = 10.0, .expect = DO_PAUSE},
      {.at = 303, .state = RUN, .cpu = 10.0, .threshold = 10.0, .expect = NONE, .reason = "CPU"}}},

    {"unknown CPU of a running guest is not idle",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .cpu = -1, .expect = NONE, .reason = "unknown", .since = NOT_IDLE},
      {.at = 400, .state = RUN, .cpu = -1, .expect = NONE, .reason = "unknown"},
      {.at = 401, .state = RUN, .cpu = 0.5, .expect = NONE, .since = 401},
      {.at = 701, .state = RUN, .cpu = 0.5, .expect = DO_PAUSE}}},

    {"activity between two ticks resets idle time",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .expect = NONE, .since = 1},
      {.at = 299, .state = RUN, .activity = S(250), .expect = NONE, .since = 250},
      {.at = 301, .state = RUN, .activity = S(250), .expect = NONE},
      {.at = 549, .state = RUN, .activity = S(250), .expect = NONE},
      {.at = 550, .state = RUN, .activity = S(250), .expect = DO_PAUSE}}},

    {"activity stamped in the future does not push idle time past now",
     {POLICY_5M_30M},
     {{.at = 10, .state = RUN, .activity = S(20), .expect = NONE, .since = 10},
      {.at = 310, .state = RUN, .activity = S(20), .expect = NONE, .since = 20},
      {.at = 320, .state = RUN, .activity = S(20), .expect = DO_PAUSE}}},

    {"keep-awake holds it; idle counts from the expiry",
     {POLICY_5M_30M},
     {{.at = 1,
       .state = RUN,
       .keep_until = S(1000),
       .expect = NONE,
       .reason = "kept awake",
       .since = NOT_IDLE},
      {.at = 999, .state = RUN, .keep_until = S(1000), .expect = NONE, .reason = "kept awake"},
      {.at = 1000, .state = RUN, .keep_until = S(1000), .expect = NONE, .since = 1000},
      {.at = 1299, .state = RUN, .keep_until = S(1000), .expect = NONE},
      {.at = 1300, .state = RUN, .keep_until = S(1000), .expect = DO_PAUSE}}},

    {"keep-awake also stops a paused agent from being saved",
     {POLICY_5M_30M},
     {{.at = 1, .state = PAUSE, .expect = NONE, .since = 1},
      {.at = 1801, .state = PAUSE, .keep_until = S(5000), .expect = NONE, .reason = "kept awake"}}},

    {"policy never: idle is tracked, nothing is done",
     {.never = TRUE, .pause_after_s = 300, .save_after_s = 1800},
     {{.at = 1, .state = RUN, .expect = NONE, .reason = "never", .since = 1},
      {.at = 100000, .state = RUN, .expect = NONE, .reason = "never", .since = 1},
      {.at = 100001, .state = PAUSE, .expect = NONE, .reason = "never"}}},

    {"save level only: a running agent is saved directly",
     {.save_after_s = 600},
     {{.at = 1, .state = RUN, .expect = NONE},
      {.at = 600, .state = RUN, .expect = NONE},
      {.at = 601, .state = RUN, .expect = DO_SAVE}}},

    {"pause level only: a paused agent stays paused",
     {.pause_after_s = 300},
     {{.at = 1, .state = RUN, .expect = NONE},
      {.at = 301, .state = RUN, .expect = DO_PAUSE},
      {.at = 302, .state = PAUSE, .expect = NONE, .reason = "save level off"},
      {.at = 100000, .state = PAUSE, .expect = NONE, .reason = "save level off"}}},

    {"save_after before pause_after: saved directly, never paused",
     {.pause_after_s = 600, .save_after_s = 300},
     {{.at = 1, .state = RUN, .expect = NONE},
      {.at = 300, .state = RUN, .expect = NONE},
      {.at = 301, .state = RUN, .expect = DO_SAVE}}},

    {"both levels off: nothing happens",
     {0},
     {{.at = 1, .state = RUN, .expect = NONE},
      {.at = 1000000, .state = RUN, .expect = NONE, .since = 1}}},

    {"resumed by hand without activity: idle time starts again",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .expect = NONE},
      {.at = 301, .state = RUN, .expect = DO_PAUSE},
      {.at = 302, .state = PAUSE, .expect = NONE, .since = 1},
      {.at = 400, .state = RUN, .expect = NONE, .since = 400},
      {.at = 699, .state = RUN, .expect = NONE},
      {.at = 700, .state = RUN, .expect = DO_PAUSE}}},

    {"woken by a connection from the saved level, then idle again",
     {POLICY_5M_30M},
     {{.at = 1, .state = RUN, .expect = NONE},
      {.at = 1801, .state = RUN, .expect = DO_SAVE},
      {.at = 1802, .state = SAVE, .expect = NONE, .reason = "saved"},
      {.at = 5000,
       .state = RUN,
       .conns = 1,
       .activity = S(4999),
       .expect = NONE,
       .since = NOT_IDLE},
      /* The close at 5090 happened before the first idle tick: idle counts from the tick. */
      {.at = 5100, .state = RUN, .activity = S(5090), .expect = NONE, .since = 5100},
      {.at = 5399, .state = RUN, .activity = S(5090), .expect = NONE},
      {.at = 5400, .state = RUN, .activity = S(5090), .expect = DO_PAUSE}}},

    {"a paused agent with a session open is not saved",
     {POLICY_5M_30M},
     {{.at = 1, .state = PAUSE, .expect = NONE, .since = 1},
      {.at = 1000, .state = PAUSE, .sessions = 1, .expect = NONE, .reason = "session"},
      {.at = 1801, .state = PAUSE, .expect = NONE, .since = 1801},
      {.at = 3601, .state = PAUSE, .expect = DO_SAVE}}},

    {"unknown CPU does not matter once paused",
     {POLICY_5M_30M},
     {{.at = 1, .state = PAUSE, .cpu = -1, .expect = NONE, .since = 1},
      {.at = 1801, .state = PAUSE, .cpu = -1, .expect = DO_SAVE}}},

    {"stopped and saved agents get no action",
     {POLICY_5M_30M},
     {{.at = 1, .state = STOP, .expect = NONE, .reason = "stopped", .since = NOT_IDLE},
      {.at = 100000, .state = STOP, .expect = NONE, .reason = "stopped"},
      {.at = 100001, .state = SAVE, .expect = NONE, .reason = "saved"},
      {.at = 200000, .state = SAVE, .expect = NONE, .reason = "saved"}}},

    {"started from stopped: idle counts from the start",
     {POLICY_5M_30M},
     {{.at = 1, .state = STOP, .expect = NONE},
      {.at = 5000, .state = RUN, .expect = NONE, .since = 5000},
      {.at = 5299, .state = RUN, .expect = NONE},
      {.at = 5300, .state = RUN, .expect = DO_PAUSE}}},
};

static void
test_scenarios(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(scenarios); i++) {
        const Scenario *sc = &scenarios[i];
        HostdIdleTracker tracker = {0};

        for (gsize j = 0; j < G_N_ELEMENTS(sc->steps) && sc->steps[j].at != 0; j++) {
            const Step *st = &sc->steps[j];
            HostdIdleInput in = {
                .state = st->state,
                .keep_awake_until = st->keep_until,
                .open_connections = st->conns,
                .open_sessions = st->sessions,
                .last_activity = st->activity,
                .cpu_percent = st->cpu,
                .cpu_threshold = st->threshold != 0 ? st->threshold : HOSTD_IDLE_CPU_THRESHOLD,
                .now = S(st->at),
            };
            HostdIdleDecision d = hostd_idle_tick(&tracker, &sc->policy, &in);

            if (d.action != st->expect)
                fail_msg("'%s' at %" G_GINT64_FORMAT " s (%s): action %s (%s), expected %s",
                         sc->name, st->at, hostd_power_state_name(st->state),
                         hostd_idle_action_name(d.action), d.reason,
                         hostd_idle_action_name(st->expect));
            if (d.reason == NULL || *d.reason == '\0')
                fail_msg("'%s' at %" G_GINT64_FORMAT " s: no reason", sc->name, st->at);
            if (st->reason != NULL && strstr(d.reason, st->reason) == NULL)
                fail_msg("'%s' at %" G_GINT64_FORMAT " s: reason '%s' lacks '%s'", sc->name, st->at,
                         d.reason, st->reason);
            if (st->since == NOT_IDLE && d.idle_since != 0)
                fail_msg("'%s' at %" G_GINT64_FORMAT " s: idle since %" G_GINT64_FORMAT
                         " us, expected not idle",
                         sc->name, st->at, d.idle_since);
            if (st->since > 0 && d.idle_since != S(st->since))
                fail_msg("'%s' at %" G_GINT64_FORMAT " s: idle since %" G_GINT64_FORMAT
                         " us, expected %" G_GINT64_FORMAT " s",
                         sc->name, st->at, d.idle_since, st->since);
        }
    }
}

static void
test_tracker_reset(void **state)
{
    HostdIdlePolicy policy = {POLICY_5M_30M};
    HostdIdleTracker tracker = {0};
    HostdIdleInput in = {.state = RUN, .cpu_threshold = HOSTD_IDLE_CPU_THRESHOLD, .now = S(1)};
    HostdIdleDecision d;

    hostd_idle_tick(&tracker, &policy, &in);
    hostd_idle_tracker_reset(&tracker);
    /* Forgotten: idle time restarts at the next tick instead of reaching pause_after. */
    in.now = S(400);
    d = hostd_idle_tick(&tracker, &policy, &in);
    assert_int_equal(d.action, NONE);
    assert_int_equal(d.idle_since, S(400));
}

typedef struct {
    const char *name;
    HostdCpuSample prev;
    HostdCpuSample cur;
    gboolean ok;
    double percent;
} CpuCase;

#define NS_S 1000000000LL

static const CpuCase cpu_cases[] = {
    {"idle guest, 1 % of a core", {0, 0, 2}, {NS_S / 100, NS_S, 2}, TRUE, 1.0},
    {"no CPU at all", {5 * NS_S, NS_S, 1}, {5 * NS_S, 3 * NS_S, 1}, TRUE, 0.0},
    {"one core busy on a 2-vCPU guest", {NS_S, 0, 2}, {3 * NS_S, 2 * NS_S, 2}, TRUE, 100.0},
    {"both vCPUs busy: 200 %", {0, 0, 2}, {2 * NS_S, NS_S, 2}, TRUE, 200.0},
    {"emulator overhead clamped to the vCPUs", {0, 0, 1}, {3 * NS_S / 2, NS_S, 1}, TRUE, 100.0},
    {"large counters keep their precision",
     {1000000 * NS_S, 7000 * NS_S, 4},
     {1000000 * NS_S + NS_S / 2, 7010 * NS_S, 4},
     TRUE,
     5.0},
    {"CPU time went backwards (QEMU restarted)", {9 * NS_S, 0, 2}, {NS_S, NS_S, 2}, FALSE, 0},
    {"wall clock did not advance", {0, NS_S, 2}, {NS_S, NS_S, 2}, FALSE, 0},
    {"wall clock went backwards", {0, 2 * NS_S, 2}, {NS_S, NS_S, 2}, FALSE, 0},
    {"vCPU count changed", {0, 0, 2}, {NS_S / 10, NS_S, 4}, FALSE, 0},
    {"no vCPUs", {0, 0, 0}, {NS_S / 10, NS_S, 0}, FALSE, 0},
};

static void
test_cpu_percent(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(cpu_cases); i++) {
        const CpuCase *c = &cpu_cases[i];
        double percent = -7.0;
        gboolean ok = hostd_idle_cpu_percent(&c->prev, &c->cur, &percent);

        if (ok != c->ok)
            fail_msg("'%s': returned %d, expected %d", c->name, ok, c->ok);
        if (ok && (percent < c->percent - 1e-9 || percent > c->percent + 1e-9))
            fail_msg("'%s': %.6f %%, expected %.6f %%", c->name, percent, c->percent);
        if (!ok && percent != -7.0)
            fail_msg("'%s': result written on failure", c->name);
    }
}

static void
test_names(void **state)
{
    static const struct {
        HostdPowerState state;
        const char *name;
    } states[] = {{RUN, "running"}, {PAUSE, "paused"}, {SAVE, "saved"}, {STOP, "stopped"}};
    static const struct {
        HostdIdleAction action;
        const char *name;
    } actions[] = {{NONE, "none"}, {DO_PAUSE, "pause"}, {DO_SAVE, "save"}};

    for (gsize i = 0; i < G_N_ELEMENTS(states); i++)
        assert_string_equal(hostd_power_state_name(states[i].state), states[i].name);
    for (gsize i = 0; i < G_N_ELEMENTS(actions); i++)
        assert_string_equal(hostd_idle_action_name(actions[i].action), actions[i].name);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scenarios),
        cmocka_unit_test(test_tracker_reset),
        cmocka_unit_test(test_cpu_percent),
        cmocka_unit_test(test_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
