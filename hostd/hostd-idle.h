/* Idle decisions: when an agent should be paused (vCPUs stopped, RAM kept) or saved (RAM written
 * to disk, QEMU gone). A pure state machine: the caller samples the signals and the clock once
 * per tick and carries out the action; nothing here reads a clock, a socket or libvirt, so every
 * case is a row in a table test. See docs/IDLE.md. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Guest CPU use under which an agent counts as idle, in % of one vCPU; an idle Debian guest
 * under TCG uses about 1 %. */
#define HOSTD_IDLE_CPU_THRESHOLD 5.0

typedef enum {
    HOSTD_POWER_RUNNING,
    HOSTD_POWER_PAUSED,
    HOSTD_POWER_SAVED,
    HOSTD_POWER_STOPPED,
} HostdPowerState;

typedef enum {
    HOSTD_IDLE_ACTION_NONE,
    HOSTD_IDLE_ACTION_PAUSE,
    HOSTD_IDLE_ACTION_SAVE,
} HostdIdleAction;

/* When to suspend, both delays counted from the moment the agent became idle. A delay of 0
 * turns its level off: {pause 5m, save 0} only pauses, {pause 0, save 30m} saves a running
 * agent directly, and so does any save_after_s <= pause_after_s. */
typedef struct {
    gboolean never; /* the agent is never suspended automatically */
    guint64 pause_after_s;
    guint64 save_after_s;
} HostdIdlePolicy;

/* What the caller sampled for one agent at one tick. Times are g_get_monotonic_time()
 * microseconds. */
typedef struct {
    HostdPowerState state;
    gint64 keep_awake_until; /* 0: not held awake */
    guint open_connections;  /* relayed, forwarded and egress connections */
    guint open_sessions;     /* vmctl exec / ssh sessions hostd runs */
    gint64 last_activity;    /* latest byte or open/close seen anywhere; 0: none */
    double cpu_percent;      /* guest CPU over the last sample, % of one vCPU; < 0: unknown */
    double cpu_threshold;    /* idle below this, e.g. HOSTD_IDLE_CPU_THRESHOLD */
    gint64 now;              /* > 0 */
} HostdIdleInput;

/* Per-agent memory between ticks. Zero-initialise it (or hostd_idle_tracker_reset()) when the
 * agent is first seen; it needs no freeing. */
typedef struct {
    gint64 idle_since; /* 0: not idle */
    HostdPowerState last_state;
    gboolean seen;
} HostdIdleTracker;

typedef struct {
    HostdIdleAction action;
    gint64 idle_since;  /* 0 when the agent is not idle */
    const char *reason; /* static text for logs: why this action (or none) */
} HostdIdleDecision;

/* Forgets everything about the agent: idle time counts from the next tick. Can't fail. */
void hostd_idle_tracker_reset(HostdIdleTracker *tracker);

/* One tick for one agent: updates @tracker from @input and returns what to do now.
 *
 * The agent is idle while all of these hold: no open connection, no open session, guest CPU
 * below the threshold (unknown counts as busy while running, since it cannot show idleness; a
 * paused or saved guest uses none), and no keep-awake in force. Idle time starts at the first
 * tick that sees it idle, or at the latest activity if that is later, so activity between two
 * ticks also resets it; a change to running made by anyone else (a wake, vmctl resume) starts
 * it afresh too. A running agent idle for save_after is saved, else for pause_after paused; a
 * paused agent idle for save_after is saved. Saved and stopped agents get no action: waking is
 * the relay's and exec's job, not this machine's. Can't fail. */
HostdIdleDecision hostd_idle_tick(HostdIdleTracker *tracker, const HostdIdlePolicy *policy,
                                  const HostdIdleInput *input);

/* A sample of a domain's CPU time, as virDomainGetCPUStats() (total cpu_time) and a monotonic
 * wall clock give it. */
typedef struct {
    guint64 cpu_time_ns;
    gint64 wall_ns;
    guint vcpus;
} HostdCpuSample;

/* Guest CPU use between @prev and @cur in % of one vCPU (a guest keeping two vCPUs busy is at
 * 200 %), clamped to [0, 100 * vcpus]. Returns FALSE, leaving @ret_percent alone, when the
 * samples cannot be compared: wall time not advancing, CPU time going backwards (the QEMU
 * process was restarted or restored), vCPU count changed or zero. Pure arithmetic. */
gboolean hostd_idle_cpu_percent(const HostdCpuSample *prev, const HostdCpuSample *cur,
                                double *ret_percent);

/* "running", "paused", "saved", "stopped" / "none", "pause", "save". Can't fail. */
const char *hostd_power_state_name(HostdPowerState state);
const char *hostd_idle_action_name(HostdIdleAction action);

G_END_DECLS
