/* hostd's own counters, and the Prometheus text of them and of the agents' figures.
 *
 * The counters: every request's time by kind (a histogram per op), each agent's execs, and each
 * agent's last CPU-time sample, from which the next figures compute its CPU % (hostd-stats.h).
 * The text is the Prometheus exposition format, version 0.0.4: # HELP and # TYPE before each
 * family, an `agent` label on each agent's series, label values escaped. A leaf: it knows
 * numbers, not where they come from.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct _HostdMetrics HostdMetrics;

/* The content type of hostd_metrics_text(). */
#define HOSTD_METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A CPU sample younger than this is not the start of a figure: the one before it is kept. */
#define HOSTD_METRICS_CPU_MIN_US (250 * 1000)

/* New counters, started now (hostd's uptime counts from here). Can't fail. */
HostdMetrics *hostd_metrics_new(void);
void hostd_metrics_free(HostdMetrics *metrics);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdMetrics, hostd_metrics_free)

/* Counts one request of kind @op (a protocol op's name) that took @duration_us. Thread-safe;
 * can't fail. */
void hostd_metrics_request(HostdMetrics *metrics, const char *op, gint64 duration_us);

/* Counts one exec in agent @agent; hostd_metrics_execs() says how many since hostd started.
 * Thread-safe; can't fail. */
void hostd_metrics_exec(HostdMetrics *metrics, const char *agent);
guint64 hostd_metrics_execs(HostdMetrics *metrics, const char *agent);

/* Forgets what is kept of @agent (it was removed). Can't fail. */
void hostd_metrics_forget(HostdMetrics *metrics, const char *agent);

/* The CPU % between two samples of a domain's CPU time: 100 is one host CPU busy all the time
 * (as top shows a process), so an agent with N vCPUs goes up to N * 100. 0 when the time did not
 * move forward or the CPU time went back (a new QEMU). Can't fail. */
double hostd_metrics_cpu_percent(guint64 prev_cpu_ns, gint64 prev_us, guint64 cpu_ns,
                                 gint64 now_us);

/* Records @agent's CPU time @cpu_ns at @now_us (monotonic) and returns in @ret_percent its CPU %
 * since its previous sample: TRUE when one was kept (a sample younger than
 * HOSTD_METRICS_CPU_MIN_US is not kept: the figure then spans from the one before). FALSE when
 * there was none to compare with. Thread-safe; can't fail. */
gboolean hostd_metrics_cpu_sample(HostdMetrics *metrics, const char *agent, guint64 cpu_ns,
                                  gint64 now_us, double *ret_percent);

/* Seconds since hostd_metrics_new(). */
double hostd_metrics_uptime(HostdMetrics *metrics);

/* @value as a Prometheus label value: backslash, double quote and newline escaped ("\\", "\"",
 * "\n"); invalid UTF-8 replaced. Newly allocated; can't fail. */
char *hostd_metrics_label_escape(const char *value);

/* The Prometheus text of @agents (the aa{sv} of hostd_stats_collect(): one series per figure an
 * agent has, labelled with its name), of @ksm (hostd_ksm_figures(), or NULL: the host's KSM
 * figures it has) and of @metrics (agents by state, request times, uptime). Newly allocated;
 * can't fail. */
char *hostd_metrics_text(HostdMetrics *metrics, GVariant *agents, GVariant *ksm);

G_END_DECLS
