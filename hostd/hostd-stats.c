#include "hostd-stats.h"

#include "hostd-egress.h"
#include "hostd-memory.h"
#include "hostd-metrics.h"
#include "hostd-resources.h"

#include "vm-checkpoint.h"
#include "vm-error.h"
#include "vm-name.h"

/* One agent while its figures are gathered. */
typedef struct {
    HostdAgentRecord *r; /* borrowed from the records array */
    virDomainPtr dom;    /* NULL: libvirt has none */
    const char *state;
    gboolean have_cpu;
    guint64 cpu_ns;
    guint vcpus;
    gboolean have_percent;
    double percent;
} StatsAgent;

static void
stats_agent_clear(gpointer data)
{
    StatsAgent *a = data;

    if (a->dom != NULL)
        virDomainFree(a->dom);
}

/* The vCPUs' CPU time of a running or paused agent. */
static void
stats_read_cpu(StatsAgent *a)
{
    virDomainInfo info;

    a->have_cpu = FALSE;
    if (a->dom == NULL || !(g_str_equal(a->state, "running") || g_str_equal(a->state, "paused")))
        return;
    if (virDomainGetInfo(a->dom, &info) < 0) {
        virResetLastError();
        return;
    }
    a->have_cpu = TRUE;
    a->cpu_ns = info.cpuTime;
    a->vcpus = info.nrVirtCpu;
}

/* What the guest's balloon driver reports of its memory (hostd_memory_add_balloon()). Asks for
 * reports from now on when the guest gives none. */
static void
stats_add_memory(GVariantBuilder *b, StatsAgent *a)
{
    if (a->dom == NULL || !g_str_equal(a->state, "running"))
        return;
    /* The balloon reports only once asked to; the next figures have it. */
    if (!hostd_memory_add_balloon(b, a->dom, TRUE) &&
        virDomainSetMemoryStatsPeriod(a->dom, HOSTD_MEMORY_BALLOON_PERIOD_S,
                                      VIR_DOMAIN_AFFECT_LIVE) < 0)
        virResetLastError();
}

/* The bytes the agent's current overlay takes, and those its checkpoints take apart from it. */
static void
stats_add_disk(GVariantBuilder *b, const HostdAgentRecord *r)
{
    g_autoptr(VmCheckpointSet) set = vm_checkpoint_set_load(r->dir, NULL);
    guint64 checkpoints = 0;

    g_variant_builder_add(b, "{sv}", "disk_capacity_bytes",
                          g_variant_new_uint64((guint64)r->disk_gib << 30));
    if (set == NULL)
        return;
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);
    g_variant_builder_add(b, "{sv}", "disk_allocated_bytes",
                          g_variant_new_uint64(hostd_file_allocated(active)));
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *image = vm_checkpoint_set_path(set, c->image);

        checkpoints += hostd_file_allocated(image);
        if (c->memory != NULL) {
            g_autofree char *memory = vm_checkpoint_set_path(set, c->memory);

            checkpoints += hostd_file_allocated(memory);
        }
    }
    g_variant_builder_add(b, "{sv}", "checkpoints_allocated_bytes",
                          g_variant_new_uint64(checkpoints));
}

static GVariant *
stats_agent_variant(HostdContext *ctx, StatsAgent *a)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    const HostdAgentRecord *r = a->r;
    guint connections = 0;
    guint64 up = 0, down = 0;
    GPid pid;

    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(r->name));
    g_variant_builder_add(&b, "{sv}", "state", g_variant_new_string(a->state));
    g_variant_builder_add(&b, "{sv}", "vcpus",
                          g_variant_new_uint32(a->have_cpu ? a->vcpus : r->cpus));
    g_variant_builder_add(&b, "{sv}", "memory_bytes",
                          g_variant_new_uint64((guint64)r->memory_mib << 20));
    if (a->have_cpu)
        g_variant_builder_add(&b, "{sv}", "cpu_time_ns", g_variant_new_uint64(a->cpu_ns));
    if (a->have_percent)
        g_variant_builder_add(&b, "{sv}", "cpu_percent", g_variant_new_double(a->percent));
    stats_add_memory(&b, a);
    pid = a->have_cpu ? hostd_memory_qemu_pid(ctx->lv, r->name) : 0;
    if (pid > 0) {
        g_variant_builder_add(&b, "{sv}", "qemu_pid", g_variant_new_uint32((guint32)pid));
        hostd_memory_add_process(&b, "/proc", pid);
    }
    stats_add_disk(&b, r);
    if (hostd_egress_traffic(ctx, r->name, &connections, &up, &down)) {
        g_variant_builder_add(&b, "{sv}", "egress_bytes_up", g_variant_new_uint64(up));
        g_variant_builder_add(&b, "{sv}", "egress_bytes_down", g_variant_new_uint64(down));
        g_variant_builder_add(&b, "{sv}", "egress_connections", g_variant_new_uint32(connections));
    }
    g_variant_builder_add(&b, "{sv}", "execs",
                          g_variant_new_uint64(hostd_metrics_execs(ctx->metrics, r->name)));
    return g_variant_builder_end(&b);
}

/* Whether @r is one of @names (NULL or empty: every agent is). */
static gboolean
stats_wanted(const char *const *names, const HostdAgentRecord *r)
{
    return names == NULL || names[0] == NULL || g_strv_contains(names, r->name);
}

GVariant *
hostd_stats_collect(HostdContext *ctx, const char *const *names, GError **error)
{
    g_autoptr(GPtrArray) records = NULL;
    g_autoptr(GArray) agents = g_array_new(FALSE, TRUE, sizeof(StatsAgent));
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    gboolean second = FALSE;

    g_array_set_clear_func(agents, stats_agent_clear);
    for (const char *const *n = names; n != NULL && *n != NULL; n++) {
        if (!vm_name_validate(*n, error))
            return NULL;
    }
    records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return NULL;
    for (guint i = 0; i < records->len; i++) {
        HostdAgentRecord *r = records->pdata[i];
        StatsAgent a = {.r = r};

        if (!g_str_equal(r->phase, HOSTD_PHASE_READY) || !stats_wanted(names, r))
            continue;
        a.dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);
        a.state = a.dom != NULL ? hostd_libvirt_state_name(a.dom) : "missing";
        if (r->crashed != NULL && g_str_equal(a.state, "stopped"))
            a.state = "crashed";
        g_array_append_val(agents, a);
    }
    for (const char *const *n = names; n != NULL && *n != NULL; n++) {
        gboolean found = FALSE;

        for (guint i = 0; i < agents->len && !found; i++)
            found = g_str_equal(g_array_index(agents, StatsAgent, i).r->name, *n);
        if (!found) {
            vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s'", *n);
            return NULL;
        }
    }
    /* A CPU % needs two samples: agents hostd has none of are sampled again after a moment,
     * once for all of them. */
    for (guint i = 0; i < agents->len; i++) {
        StatsAgent *a = &g_array_index(agents, StatsAgent, i);

        stats_read_cpu(a);
        if (a->have_cpu)
            a->have_percent = hostd_metrics_cpu_sample(ctx->metrics, a->r->name, a->cpu_ns,
                                                       g_get_monotonic_time(), &a->percent);
        second = second || (a->have_cpu && !a->have_percent);
    }
    if (second)
        g_usleep(HOSTD_STATS_FIRST_SAMPLE_US);
    for (guint i = 0; second && i < agents->len; i++) {
        StatsAgent *a = &g_array_index(agents, StatsAgent, i);

        if (!a->have_cpu || a->have_percent)
            continue;
        stats_read_cpu(a);
        if (a->have_cpu)
            a->have_percent = hostd_metrics_cpu_sample(ctx->metrics, a->r->name, a->cpu_ns,
                                                       g_get_monotonic_time(), &a->percent);
    }
    for (guint i = 0; i < agents->len; i++)
        g_variant_builder_add_value(
            &b, stats_agent_variant(ctx, &g_array_index(agents, StatsAgent, i)));
    return g_variant_ref_sink(g_variant_builder_end(&b));
}
