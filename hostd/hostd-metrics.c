#include "hostd-metrics.h"

#include <string.h>

/* Upper bounds of the request-time buckets, in seconds: a `list` takes milliseconds, a `new`
 * tens of seconds, a followed log or an exec as long as its client wants. */
static const double metrics_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                         1,     2.5,  5,     10,   30,  60,   300};
#define METRICS_N_BUCKETS G_N_ELEMENTS(metrics_buckets)

/* The states an agent's `state` may say, always shown (a 0 is a figure too). */
static const char *const metrics_states[] = {"running", "paused",   "saved",   "stopped",
                                             "crashed", "stopping", "missing", NULL};

typedef struct {
    guint64 counts[METRICS_N_BUCKETS]; /* requests at most each bound (not cumulative here) */
    guint64 count;
    double sum; /* seconds */
} MetricsRequests;

typedef struct {
    guint64 cpu_ns;
    gint64 time_us;
    gboolean have_sample;
    double last_percent;
    gboolean have_percent;
    guint64 execs;
} MetricsAgent;

struct _HostdMetrics {
    GMutex lock;
    gint64 started_us;    /* monotonic */
    GHashTable *requests; /* op name -> MetricsRequests* */
    GHashTable *agents;   /* agent name -> MetricsAgent* */
};

HostdMetrics *
hostd_metrics_new(void)
{
    HostdMetrics *metrics = g_new0(HostdMetrics, 1);

    g_mutex_init(&metrics->lock);
    metrics->started_us = g_get_monotonic_time();
    metrics->requests = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    metrics->agents = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    return metrics;
}

void
hostd_metrics_free(HostdMetrics *metrics)
{
    if (metrics == NULL)
        return;
    g_hash_table_unref(metrics->requests);
    g_hash_table_unref(metrics->agents);
    g_mutex_clear(&metrics->lock);
    g_free(metrics);
}

void
hostd_metrics_request(HostdMetrics *metrics, const char *op, gint64 duration_us)
{
    double seconds = (double)MAX(duration_us, 0) / G_USEC_PER_SEC;
    MetricsRequests *r;

    g_mutex_lock(&metrics->lock);
    r = g_hash_table_lookup(metrics->requests, op);
    if (r == NULL) {
        r = g_new0(MetricsRequests, 1);
        g_hash_table_insert(metrics->requests, g_strdup(op), r);
    }
    for (gsize i = 0; i < METRICS_N_BUCKETS; i++) {
        if (seconds <= metrics_buckets[i]) {
            r->counts[i]++;
            break;
        }
    }
    r->count++;
    r->sum += seconds;
    g_mutex_unlock(&metrics->lock);
}

/* @agent's entry, made when missing; under the lock. */
static MetricsAgent *
metrics_agent_locked(HostdMetrics *metrics, const char *agent)
{
    MetricsAgent *a = g_hash_table_lookup(metrics->agents, agent);

    if (a == NULL) {
        a = g_new0(MetricsAgent, 1);
        g_hash_table_insert(metrics->agents, g_strdup(agent), a);
    }
    return a;
}

void
hostd_metrics_exec(HostdMetrics *metrics, const char *agent)
{
    g_mutex_lock(&metrics->lock);
    metrics_agent_locked(metrics, agent)->execs++;
    g_mutex_unlock(&metrics->lock);
}

guint64
hostd_metrics_execs(HostdMetrics *metrics, const char *agent)
{
    MetricsAgent *a;
    guint64 n;

    g_mutex_lock(&metrics->lock);
    a = g_hash_table_lookup(metrics->agents, agent);
    n = a != NULL ? a->execs : 0;
    g_mutex_unlock(&metrics->lock);
    return n;
}

void
hostd_metrics_forget(HostdMetrics *metrics, const char *agent)
{
    g_mutex_lock(&metrics->lock);
    g_hash_table_remove(metrics->agents, agent);
    g_mutex_unlock(&metrics->lock);
}

double
hostd_metrics_cpu_percent(guint64 prev_cpu_ns, gint64 prev_us, guint64 cpu_ns, gint64 now_us)
{
    if (now_us <= prev_us || cpu_ns < prev_cpu_ns)
        return 0;
    /* ns of CPU per us of time: / 1000 for a fraction, * 100 for a percentage. */
    return (double)(cpu_ns - prev_cpu_ns) / (double)(now_us - prev_us) / 10.0;
}

gboolean
hostd_metrics_cpu_sample(HostdMetrics *metrics, const char *agent, guint64 cpu_ns, gint64 now_us,
                         double *ret_percent)
{
    MetricsAgent *a;
    gboolean known = FALSE;

    g_mutex_lock(&metrics->lock);
    a = metrics_agent_locked(metrics, agent);
    if (a->have_sample && cpu_ns < a->cpu_ns) {
        /* A new QEMU starts its CPU time again: this sample starts the next figure. */
        a->have_sample = FALSE;
        a->have_percent = FALSE;
    }
    if (a->have_sample && now_us - a->time_us < HOSTD_METRICS_CPU_MIN_US) {
        /* Two readers close together (top and a scrape): the figure spans from the older
         * sample, or is the last one when that too is this recent. */
        if (now_us > a->time_us) {
            *ret_percent = hostd_metrics_cpu_percent(a->cpu_ns, a->time_us, cpu_ns, now_us);
            known = TRUE;
        } else if (a->have_percent) {
            *ret_percent = a->last_percent;
            known = TRUE;
        }
        g_mutex_unlock(&metrics->lock);
        return known;
    }
    if (a->have_sample) {
        a->last_percent = hostd_metrics_cpu_percent(a->cpu_ns, a->time_us, cpu_ns, now_us);
        a->have_percent = TRUE;
        *ret_percent = a->last_percent;
        known = TRUE;
    }
    a->cpu_ns = cpu_ns;
    a->time_us = now_us;
    a->have_sample = TRUE;
    g_mutex_unlock(&metrics->lock);
    return known;
}

double
hostd_metrics_uptime(HostdMetrics *metrics)
{
    return (double)(g_get_monotonic_time() - metrics->started_us) / G_USEC_PER_SEC;
}

char *
hostd_metrics_label_escape(const char *value)
{
    g_autofree char *valid = g_utf8_make_valid(value, -1);
    GString *out = g_string_new(NULL);

    for (const char *c = valid; *c != '\0'; c++) {
        if (*c == '\\')
            g_string_append(out, "\\\\");
        else if (*c == '"')
            g_string_append(out, "\\\"");
        else if (*c == '\n')
            g_string_append(out, "\\n");
        else
            g_string_append_c(out, *c);
    }
    return g_string_free(out, FALSE);
}

/* A number as the exposition format writes it: integers without a fraction, the rest with
 * enough digits to read back the same. */
static void
metrics_append_value(GString *out, double value)
{
    char buf[G_ASCII_DTOSTR_BUF_SIZE];

    /* The shortest of 15 or 17 digits that reads back as @value ("0.005", not
     * "0.0050000000000000001"). */
    g_ascii_formatd(buf, sizeof(buf), "%.15g", value);
    if (g_ascii_strtod(buf, NULL) != value)
        g_ascii_formatd(buf, sizeof(buf), "%.17g", value);
    g_string_append(out, buf);
}

static gint
metrics_compare_names(gconstpointer a, gconstpointer b, gpointer user_data)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void
metrics_family(GString *out, const char *name, const char *type, const char *help)
{
    g_string_append_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One agent figure: the field of an agent's stats it comes from, its family, and a factor. */
typedef struct {
    const char *field;
    const char *name;
    const char *type;
    const char *help;
    const char *label; /* an extra label "KEY=\"VALUE\"", or NULL */
    double scale;
} MetricsAgentFigure;

static const MetricsAgentFigure metrics_agent_figures[] = {
    {"vcpus", "hostd_agent_vcpus", "gauge", "Virtual CPUs of the agent.", NULL, 1},
    {"cpu_time_ns", "hostd_agent_cpu_seconds_total", "counter",
     "CPU time the agent's vCPUs used since its QEMU started.", NULL, 1e-9},
    {"cpu_percent", "hostd_agent_cpu_percent", "gauge",
     "CPU use of the agent between hostd's last two samples (100: one host CPU).", NULL, 1},
    {"memory_bytes", "hostd_agent_memory_bytes", "gauge", "Memory the agent's VM is given.", NULL,
     1},
    {"memory_used_bytes", "hostd_agent_guest_memory_used_bytes", "gauge",
     "Memory in use in the guest, as its balloon driver reports it.", NULL, 1},
    {"memory_available_bytes", "hostd_agent_guest_memory_available_bytes", "gauge",
     "Memory the guest sees, as its balloon driver reports it.", NULL, 1},
    {"qemu_rss_bytes", "hostd_agent_qemu_rss_bytes", "gauge",
     "Resident memory of the agent's QEMU process on the host.", NULL, 1},
    {"ksm_merged_bytes", "hostd_agent_ksm_merged_bytes", "gauge",
     "Memory of the agent's QEMU that KSM merges with identical pages.", NULL, 1},
    {"ksm_profit_bytes", "hostd_agent_ksm_profit_bytes", "gauge",
     "What KSM saves on the agent's QEMU, less its metadata (may be negative).", NULL, 1},
    {"balloon_actual_bytes", "hostd_agent_balloon_bytes", "gauge",
     "Memory the agent's guest has now, as its balloon says.", NULL, 1},
    {"disk_capacity_bytes", "hostd_agent_disk_capacity_bytes", "gauge",
     "Size of the agent's disk as its guest sees it.", NULL, 1},
    {"disk_allocated_bytes", "hostd_agent_disk_allocated_bytes", "gauge",
     "Host bytes the agent's current disk overlay takes.", NULL, 1},
    {"checkpoints_allocated_bytes", "hostd_agent_checkpoints_allocated_bytes", "gauge",
     "Host bytes the agent's checkpoints take (disk images and saved memory).", NULL, 1},
    {"egress_bytes_up", "hostd_agent_egress_bytes_total", "counter",
     "Bytes through the agent's egress proxy, of requests that ended.", "direction=\"up\"", 1},
    {"egress_bytes_down", "hostd_agent_egress_bytes_total", "counter", NULL, "direction=\"down\"",
     1},
    {"egress_connections", "hostd_agent_egress_connections", "gauge",
     "Connections the agent's egress proxy serves now.", NULL, 1},
    {"execs", "hostd_agent_execs_total", "counter",
     "Commands run in the agent since hostd started.", NULL, 1},
};

/* The number in @agent's field @field, when it has one. */
static gboolean
metrics_agent_value(GVariant *agent, const char *field, double *ret_value)
{
    g_autoptr(GVariant) v = g_variant_lookup_value(agent, field, NULL);

    if (v == NULL)
        return FALSE;
    if (g_variant_is_of_type(v, G_VARIANT_TYPE_UINT64))
        *ret_value = (double)g_variant_get_uint64(v);
    else if (g_variant_is_of_type(v, G_VARIANT_TYPE_INT64))
        *ret_value = (double)g_variant_get_int64(v);
    else if (g_variant_is_of_type(v, G_VARIANT_TYPE_UINT32))
        *ret_value = g_variant_get_uint32(v);
    else if (g_variant_is_of_type(v, G_VARIANT_TYPE_DOUBLE))
        *ret_value = g_variant_get_double(v);
    else
        return FALSE;
    return TRUE;
}

static void
metrics_text_agents(GString *out, GVariant *agents)
{
    gsize n = agents != NULL ? g_variant_n_children(agents) : 0;

    metrics_family(out, "hostd_agent_info", "gauge", "One per agent, with its state.");
    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) agent = g_variant_get_child_value(agents, i);
        const char *name = NULL, *state = NULL;

        g_variant_lookup(agent, "name", "&s", &name);
        g_variant_lookup(agent, "state", "&s", &state);
        g_autofree char *n_esc = hostd_metrics_label_escape(name != NULL ? name : "");
        g_autofree char *s_esc = hostd_metrics_label_escape(state != NULL ? state : "unknown");
        g_string_append_printf(out, "hostd_agent_info{agent=\"%s\",state=\"%s\"} 1\n", n_esc,
                               s_esc);
    }
    for (gsize f = 0; f < G_N_ELEMENTS(metrics_agent_figures); f++) {
        const MetricsAgentFigure *fig = &metrics_agent_figures[f];

        if (fig->help != NULL)
            metrics_family(out, fig->name, fig->type, fig->help);
        for (gsize i = 0; i < n; i++) {
            g_autoptr(GVariant) agent = g_variant_get_child_value(agents, i);
            const char *name = "";
            double value;

            if (!metrics_agent_value(agent, fig->field, &value))
                continue;
            g_variant_lookup(agent, "name", "&s", &name);
            g_autofree char *n_esc = hostd_metrics_label_escape(name);
            g_string_append_printf(out, "%s{agent=\"%s\"%s%s} ", fig->name, n_esc,
                                   fig->label != NULL ? "," : "",
                                   fig->label != NULL ? fig->label : "");
            metrics_append_value(out, value * fig->scale);
            g_string_append_c(out, '\n');
        }
    }
}

static void
metrics_text_states(GString *out, GVariant *agents)
{
    g_autoptr(GHashTable) counts = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    gsize n = agents != NULL ? g_variant_n_children(agents) : 0;

    for (const char *const *s = metrics_states; *s != NULL; s++)
        g_hash_table_insert(counts, g_strdup(*s), GUINT_TO_POINTER(0));
    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) agent = g_variant_get_child_value(agents, i);
        char *state = NULL;

        if (!g_variant_lookup(agent, "state", "s", &state))
            continue;
        guint count = GPOINTER_TO_UINT(g_hash_table_lookup(counts, state));
        /* The table takes the key (and frees the one it had). */
        g_hash_table_insert(counts, state, GUINT_TO_POINTER(count + 1));
    }
    g_autofree gpointer *keys = g_hash_table_get_keys_as_array(counts, NULL);
    g_qsort_with_data(keys, (gint)g_hash_table_size(counts), sizeof(gpointer),
                      (GCompareDataFunc)metrics_compare_names, NULL);
    metrics_family(out, "hostd_agents", "gauge", "Agents by state.");
    for (guint i = 0; i < g_hash_table_size(counts); i++) {
        g_autofree char *esc = hostd_metrics_label_escape(keys[i]);

        g_string_append_printf(out, "hostd_agents{state=\"%s\"} %u\n", esc,
                               GPOINTER_TO_UINT(g_hash_table_lookup(counts, keys[i])));
    }
}

static void
metrics_text_requests(HostdMetrics *metrics, GString *out)
{
    const char *name = "hostd_request_duration_seconds";

    metrics_family(out, name, "histogram", "Time hostd took to answer each request, by kind.");
    g_mutex_lock(&metrics->lock);
    g_autofree gpointer *ops = g_hash_table_get_keys_as_array(metrics->requests, NULL);
    guint n_ops = g_hash_table_size(metrics->requests);
    g_qsort_with_data(ops, (gint)n_ops, sizeof(gpointer), (GCompareDataFunc)metrics_compare_names,
                      NULL);
    for (guint i = 0; i < n_ops; i++) {
        const MetricsRequests *r = g_hash_table_lookup(metrics->requests, ops[i]);
        g_autofree char *op = hostd_metrics_label_escape(ops[i]);
        guint64 below = 0;

        for (gsize b = 0; b < METRICS_N_BUCKETS; b++) {
            below += r->counts[b];
            g_string_append_printf(out, "%s_bucket{request=\"%s\",le=\"", name, op);
            metrics_append_value(out, metrics_buckets[b]);
            g_string_append_printf(out, "\"} %" G_GUINT64_FORMAT "\n", below);
        }
        g_string_append_printf(out, "%s_bucket{request=\"%s\",le=\"+Inf\"} %" G_GUINT64_FORMAT "\n",
                               name, op, r->count);
        g_string_append_printf(out, "%s_sum{request=\"%s\"} ", name, op);
        metrics_append_value(out, r->sum);
        g_string_append_printf(out, "\n%s_count{request=\"%s\"} %" G_GUINT64_FORMAT "\n", name, op,
                               r->count);
    }
    g_mutex_unlock(&metrics->lock);
}

/* The host's KSM figures (hostd-ksm.h): those it has, and its state as labels of one series. */
static void
metrics_text_ksm(GString *out, GVariant *ksm)
{
    static const struct {
        const char *field;
        const char *name;
        const char *help;
    } figures[] = {
        {"pages_shared", "hostd_ksm_pages_shared", "Pages KSM keeps one copy of, host-wide."},
        {"pages_sharing", "hostd_ksm_pages_sharing", "Pages merged into those, host-wide."},
        {"saved_bytes", "hostd_ksm_saved_bytes", "Memory KSM saves, host-wide (pages_sharing)."},
        {"general_profit_bytes", "hostd_ksm_general_profit_bytes",
         "What KSM saves, host-wide, less its metadata (may be negative)."},
    };
    const char *mode = NULL, *run = NULL;

    if (ksm == NULL)
        return;
    g_variant_lookup(ksm, "mode", "&s", &mode);
    g_variant_lookup(ksm, "run", "&s", &run);
    g_autofree char *mode_esc = hostd_metrics_label_escape(mode != NULL ? mode : "unknown");
    g_autofree char *run_esc = hostd_metrics_label_escape(run != NULL ? run : "unknown");
    metrics_family(out, "hostd_ksm_info", "gauge",
                   "1, with hostd's ksm setting and the kernel's KSM state as labels.");
    g_string_append_printf(out, "hostd_ksm_info{mode=\"%s\",run=\"%s\"} 1\n", mode_esc, run_esc);
    for (gsize i = 0; i < G_N_ELEMENTS(figures); i++) {
        double value;

        if (!metrics_agent_value(ksm, figures[i].field, &value))
            continue;
        metrics_family(out, figures[i].name, "gauge", figures[i].help);
        g_string_append_printf(out, "%s ", figures[i].name);
        metrics_append_value(out, value);
        g_string_append_c(out, '\n');
    }
}

char *
hostd_metrics_text(HostdMetrics *metrics, GVariant *agents, GVariant *ksm)
{
    GString *out = g_string_new(NULL);

    metrics_family(out, "hostd_uptime_seconds", "gauge", "Seconds since hostd started.");
    g_string_append(out, "hostd_uptime_seconds ");
    metrics_append_value(out, hostd_metrics_uptime(metrics));
    g_string_append_c(out, '\n');
    metrics_text_states(out, agents);
    metrics_text_ksm(out, ksm);
    metrics_text_requests(metrics, out);
    metrics_text_agents(out, agents);
    return g_string_free(out, FALSE);
}
