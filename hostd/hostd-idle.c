/* Idle decisions (see hostd-idle.h and docs/IDLE.md). */
#include "hostd-idle.h"

void
hostd_idle_tracker_reset(HostdIdleTracker *tracker)
{
    g_return_if_fail(tracker != NULL);

    *tracker = (HostdIdleTracker){0};
}

/* Why the agent is busy right now, or NULL when it is idle. */
static const char *
idle_busy_reason(const HostdIdleInput *in)
{
    if (in->keep_awake_until > in->now)
        return "kept awake";
    if (in->open_connections > 0)
        return "connection open";
    if (in->open_sessions > 0)
        return "session open";
    /* Only a running guest can use CPU; without a sample its idleness is unproven. */
    if (in->state == HOSTD_POWER_RUNNING && in->cpu_percent < 0)
        return "guest CPU use unknown";
    if (in->state == HOSTD_POWER_RUNNING && in->cpu_percent >= in->cpu_threshold)
        return "guest CPU use above threshold";
    return NULL;
}

/* @seconds as a span in microseconds, G_MAXINT64 for 0 (level off) or too large to matter. */
static gint64
idle_delay_us(guint64 seconds)
{
    if (seconds == 0 || seconds > (guint64)(G_MAXINT64 / G_TIME_SPAN_SECOND))
        return G_MAXINT64;
    return (gint64)seconds * G_TIME_SPAN_SECOND;
}

HostdIdleDecision
hostd_idle_tick(HostdIdleTracker *tracker, const HostdIdlePolicy *policy, const HostdIdleInput *in)
{
    HostdIdleDecision d = {.action = HOSTD_IDLE_ACTION_NONE};
    gboolean woken;
    const char *busy;

    g_return_val_if_fail(tracker != NULL, d);
    g_return_val_if_fail(policy != NULL, d);
    g_return_val_if_fail(in != NULL, d);

    /* Someone else (a wake, vmctl resume, a start) made the agent run: whatever idle time it
     * had before belongs to its previous life, or the next tick would suspend it again. */
    woken = tracker->seen && tracker->last_state != HOSTD_POWER_RUNNING &&
            in->state == HOSTD_POWER_RUNNING;
    tracker->seen = TRUE;
    tracker->last_state = in->state;

    switch (in->state) {
    case HOSTD_POWER_STOPPED:
        tracker->idle_since = 0;
        d.reason = "stopped";
        return d;
    case HOSTD_POWER_SAVED:
        d.idle_since = tracker->idle_since;
        d.reason = "saved: deepest level";
        return d;
    case HOSTD_POWER_RUNNING:
    case HOSTD_POWER_PAUSED:
        break;
    default:
        g_return_val_if_reached(d);
    }

    busy = idle_busy_reason(in);
    if (busy != NULL) {
        tracker->idle_since = 0;
        d.reason = busy;
        return d;
    }
    if (woken || tracker->idle_since == 0)
        tracker->idle_since = in->now;
    /* Activity between two ticks (a short connection, an exec that came and went) counts. */
    if (in->last_activity > tracker->idle_since)
        tracker->idle_since = MIN(in->last_activity, in->now);
    d.idle_since = tracker->idle_since;

    if (policy->never) {
        d.reason = "idle policy is never";
        return d;
    }

    gint64 idle_for = in->now - tracker->idle_since;
    gint64 save_at = idle_delay_us(policy->save_after_s);
    gint64 pause_at = idle_delay_us(policy->pause_after_s);

    if (idle_for >= save_at) {
        d.action = HOSTD_IDLE_ACTION_SAVE;
        d.reason = "idle longer than save_after";
    } else if (in->state == HOSTD_POWER_PAUSED) {
        d.reason = save_at == G_MAXINT64 ? "paused, save level off" : "paused, not yet save_after";
    } else if (idle_for >= pause_at) {
        d.action = HOSTD_IDLE_ACTION_PAUSE;
        d.reason = "idle longer than pause_after";
    } else {
        d.reason = "idle, not yet past a threshold";
    }
    return d;
}

gboolean
hostd_idle_cpu_percent(const HostdCpuSample *prev, const HostdCpuSample *cur, double *ret_percent)
{
    double percent;

    g_return_val_if_fail(prev != NULL, FALSE);
    g_return_val_if_fail(cur != NULL, FALSE);
    g_return_val_if_fail(ret_percent != NULL, FALSE);

    if (cur->vcpus == 0 || cur->vcpus != prev->vcpus)
        return FALSE;
    if (cur->wall_ns <= prev->wall_ns || cur->cpu_time_ns < prev->cpu_time_ns)
        return FALSE;

    percent = 100.0 * (double)(cur->cpu_time_ns - prev->cpu_time_ns) /
              (double)(cur->wall_ns - prev->wall_ns);
    /* Emulator threads and sampling jitter can push the quotient past what the vCPUs could
     * use; more than that carries no information. */
    *ret_percent = CLAMP(percent, 0.0, 100.0 * cur->vcpus);
    return TRUE;
}

const char *
hostd_power_state_name(HostdPowerState state)
{
    switch (state) {
    case HOSTD_POWER_RUNNING:
        return "running";
    case HOSTD_POWER_PAUSED:
        return "paused";
    case HOSTD_POWER_SAVED:
        return "saved";
    case HOSTD_POWER_STOPPED:
        return "stopped";
    default:
        return "unknown";
    }
}

const char *
hostd_idle_action_name(HostdIdleAction action)
{
    switch (action) {
    case HOSTD_IDLE_ACTION_NONE:
        return "none";
    case HOSTD_IDLE_ACTION_PAUSE:
        return "pause";
    case HOSTD_IDLE_ACTION_SAVE:
        return "save";
    default:
        return "unknown";
    }
}
