/* Watching agents without VMs: agent-stats and agent-logs through hostd_server_serve_fd() over
 * libvirt's test driver (which counts wall time as a busy guest's CPU time), the CPU % from two
 * samples, the Prometheus text (read back by Python's prometheus_client parser) and its
 * endpoint, and a hostile guest's console shown escaped. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-ksm.h"
#include "hostd-logs.h"
#include "hostd-metrics-server.h"
#include "hostd-metrics.h"
#include "hostd-server.h"
#include "hostd-stats.h"
#include "vm-protocol.h"
#include "vm-spawn.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-hostd-fixture.h"

typedef HostdTestFixture Fixture;
#define setup    hostd_test_setup
#define teardown hostd_test_teardown

/* ---- talking to hostd ---- */

/* Sends @op and returns what ends its answer (RESULT, ERROR or EXIT); the STDOUT before it in
 * *@ret_stdout when not NULL. */
static VmMessage *
converse(Fixture *f, VmOp op, const char *fields_text, char **ret_stdout)
{
    g_autoptr(VmMessage) m = hostd_test_request(op, fields_text);
    g_autoptr(GString) out = g_string_new(NULL);
    GThread *thread = NULL;
    int fd = hostd_test_serve(f, &thread);
    VmMessage *end = NULL;

    assert_true(vm_message_write_fd(fd, m, NULL));
    while (end == NULL) {
        g_autoptr(GError) error = NULL;
        VmMessage *reply = vm_message_read_fd(fd, NULL, &error);
        const guint8 *data;
        gsize len = 0;

        if (reply == NULL)
            fail_msg("reading the answer: %s", error != NULL ? error->message : "EOF");
        if (reply->op == VM_OP_RESULT || reply->op == VM_OP_ERROR || reply->op == VM_OP_EXIT) {
            end = reply;
            break;
        }
        if (reply->op == VM_OP_STDOUT) {
            data = vm_message_get_data(reply, "data", &len);
            g_string_append_len(out, (const char *)data, (gssize)len);
        }
        vm_message_free(reply);
    }
    g_thread_join(thread);
    close(fd);
    if (ret_stdout != NULL)
        *ret_stdout = g_string_free(g_steal_pointer(&out), FALSE);
    return end;
}

static void
assert_error(const VmMessage *m, VmErrorCode code, const char *needle)
{
    if (m->op != VM_OP_ERROR)
        fail_msg("expected error %d, got %s", code, vm_op_name(m->op));
    assert_int_equal(vm_message_get_uint(m, "code", 0), code);
    if (needle != NULL && strstr(vm_message_get_string(m, "message", ""), needle) == NULL)
        fail_msg("'%s' does not mention '%s'", vm_message_get_string(m, "message", ""), needle);
}

/* The agents of an agent-stats RESULT. */
static GVariant *
stats_agents(const VmMessage *m)
{
    if (m->op != VM_OP_RESULT)
        fail_msg("expected a result, got %s: %s", vm_op_name(m->op),
                 vm_message_get_string(m, "message", ""));
    GVariant *agents = vm_message_lookup(m, "agents");
    assert_non_null(agents);
    assert_true(g_variant_is_of_type(agents, G_VARIANT_TYPE("aa{sv}")));
    return agents;
}

static gboolean
has_field(GVariant *agent, const char *key)
{
    g_autoptr(GVariant) v = g_variant_lookup_value(agent, key, NULL);

    return v != NULL;
}

static guint64
field_u64(GVariant *agent, const char *key)
{
    guint64 value = 0;

    if (!g_variant_lookup(agent, key, "t", &value))
        fail_msg("no %s", key);
    return value;
}

/* ---- agent-stats ---- */

/* One request gives every agent's figures in name order, each only with what it has: a running
 * agent its CPU (busy: about one CPU), a stopped one none; names pick agents, an unknown one is
 * not found. */
static void
test_stats_request(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) a = hostd_test_agent_new(f, "alpha", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) b = hostd_test_agent_new(f, "bravo", HOSTD_TEST_STOPPED);

    g_autoptr(VmMessage) m = converse(f, VM_OP_AGENT_STATS, NULL, NULL);
    g_autoptr(GVariant) agents = stats_agents(m);
    assert_int_equal(g_variant_n_children(agents), 2);
    g_autoptr(GVariant) run = g_variant_get_child_value(agents, 0);
    g_autoptr(GVariant) stop = g_variant_get_child_value(agents, 1);
    g_autofree char *run_name = hostd_test_dict_string(run, "name");
    g_autofree char *run_state = hostd_test_dict_string(run, "state");
    g_autofree char *stop_name = hostd_test_dict_string(stop, "name");
    g_autofree char *stop_state = hostd_test_dict_string(stop, "state");
    assert_string_equal(run_name, "alpha");
    assert_string_equal(run_state, "running");
    assert_string_equal(stop_name, "bravo");
    assert_string_equal(stop_state, "stopped");

    double percent = -1;
    assert_true(g_variant_lookup(run, "cpu_percent", "d", &percent));
    if (percent < 50 || percent > 150)
        fail_msg("a busy one-vCPU guest at %.1f%%", percent);
    assert_true(field_u64(run, "cpu_time_ns") > 0);
    assert_false(has_field(stop, "cpu_percent"));
    assert_false(has_field(stop, "cpu_time_ns"));
    assert_false(has_field(stop, "qemu_rss_bytes"));
    for (guint i = 0; i < 2; i++) {
        GVariant *agent = i == 0 ? run : stop;

        assert_int_equal(field_u64(agent, "memory_bytes"), 128ULL << 20);
        assert_int_equal(field_u64(agent, "disk_capacity_bytes"), 8ULL << 30);
        assert_true(has_field(agent, "disk_allocated_bytes"));
        assert_int_equal(field_u64(agent, "checkpoints_allocated_bytes"), 0);
        assert_int_equal(field_u64(agent, "execs"), 0);
    }
    double uptime = -1;
    g_autoptr(GVariant) up = vm_message_lookup(m, "uptime_s");
    assert_non_null(up);
    uptime = g_variant_get_double(up);
    assert_true(uptime >= 0);

    /* An idle guest's CPU stands still: the next figure is 0. */
    hostd_test_fake_idle_cpu("alpha");
    g_usleep(2 * HOSTD_METRICS_CPU_MIN_US);
    g_autoptr(VmMessage) idle = converse(f, VM_OP_AGENT_STATS, "{'names': <['alpha']>}", NULL);
    g_autoptr(GVariant) only = stats_agents(idle);
    assert_int_equal(g_variant_n_children(only), 1);
    g_autoptr(GVariant) idle_agent = g_variant_get_child_value(only, 0);
    assert_true(g_variant_lookup(idle_agent, "cpu_percent", "d", &percent));
    if (percent > 5)
        fail_msg("an idle guest at %.1f%%", percent);

    g_autoptr(VmMessage) missing = converse(f, VM_OP_AGENT_STATS, "{'names': <['zulu']>}", NULL);
    assert_error(missing, VM_ERROR_NOT_FOUND, "zulu");
    g_autoptr(VmMessage) bad = converse(f, VM_OP_AGENT_STATS, "{'names': <['../x']>}", NULL);
    assert_error(bad, VM_ERROR_INVALID_ARGUMENT, NULL);
}

/* A fixture KSM directory under the fixture's: run = @run, and what it merged. */
static char *
fake_ksm(Fixture *f, const char *run)
{
    g_autofree char *dir = g_build_filename(f->dir, "ksm", NULL);
    const char *const files[][2] = {
        {"run", run},
        {"pages_shared", "1000\n"},
        {"pages_sharing", "25600\n"},
        {"general_profit", "98304000\n"},
    };

    assert_int_equal(g_mkdir(dir, 0755), 0);
    for (gsize i = 0; i < G_N_ELEMENTS(files); i++) {
        g_autofree char *path = g_build_filename(dir, files[i][0], NULL);

        assert_true(g_file_set_contents(path, files[i][1], -1, NULL));
    }
    return g_steal_pointer(&dir);
}

/* agent-stats carries the host's KSM figures next to the agents' (hostd's setting, the kernel's
 * state, pages, bytes saved); a hostd without a controller (KSM never started) none. agent-info
 * of a running agent says what its QEMU costs as far as it can be had (the test driver has no
 * QEMU process: no RSS; its balloon's size); of a stopped one nothing. */
static void
test_stats_ksm(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) a = hostd_test_agent_new(f, "alpha", HOSTD_TEST_RUNNING);
    g_autoptr(HostdAgentRecord) b = hostd_test_agent_new(f, "bravo", HOSTD_TEST_STOPPED);

    g_autoptr(VmMessage) without = converse(f, VM_OP_AGENT_STATS, NULL, NULL);
    g_autoptr(GVariant) none = vm_message_lookup(without, "ksm");
    assert_null(none);

    g_autofree char *dir = fake_ksm(f, "0\n");
    f->ctx->ksm = hostd_ksm_new(dir, HOSTD_KSM_ON);
    g_free(hostd_ksm_begin(f->ctx->ksm));
    g_autoptr(VmMessage) m = converse(f, VM_OP_AGENT_STATS, NULL, NULL);
    g_autoptr(GVariant) ksm = vm_message_lookup(m, "ksm");
    assert_non_null(ksm);
    assert_true(g_variant_is_of_type(ksm, G_VARIANT_TYPE_VARDICT));
    g_autofree char *mode = hostd_test_dict_string(ksm, "mode");
    g_autofree char *run = hostd_test_dict_string(ksm, "run");
    assert_string_equal(mode, "on");
    assert_string_equal(run, "running");
    assert_int_equal(field_u64(ksm, "pages_sharing"), 25600);
    assert_int_equal(field_u64(ksm, "pages_shared"), 1000);
    assert_int_equal(field_u64(ksm, "saved_bytes"), 25600ULL * (guint64)sysconf(_SC_PAGESIZE));
    gint64 profit = 0;
    assert_true(g_variant_lookup(ksm, "general_profit_bytes", "x", &profit));
    assert_int_equal(profit, 98304000);

    g_autoptr(VmMessage) info = converse(f, VM_OP_AGENT_INFO, "{'name': <'alpha'>}", NULL);
    assert_int_equal(info->op, VM_OP_RESULT);
    g_autoptr(GVariant) agent = vm_message_lookup(info, "agent");
    assert_false(has_field(agent, "qemu_rss_bytes"));
    assert_false(has_field(agent, "ksm_merged_bytes"));
    assert_int_equal(field_u64(agent, "balloon_actual_bytes"), 128ULL << 20);
    g_autofree char *name = hostd_test_dict_string(agent, "name");
    assert_string_equal(name, "alpha");
    g_autoptr(VmMessage) stopped = converse(f, VM_OP_AGENT_INFO, "{'name': <'bravo'>}", NULL);
    g_autoptr(GVariant) stopped_agent = vm_message_lookup(stopped, "agent");
    assert_false(has_field(stopped_agent, "balloon_actual_bytes"));
    assert_false(has_field(stopped_agent, "qemu_pid"));

    g_autofree char *restored = hostd_ksm_restore(f->ctx->ksm);
    assert_non_null(restored);
    g_autofree char *run_path = g_build_filename(dir, "run", NULL);
    g_autofree char *run_text = NULL;
    assert_true(g_file_get_contents(run_path, &run_text, NULL, NULL));
    assert_string_equal(run_text, "0\n");
    g_clear_pointer(&f->ctx->ksm, hostd_ksm_free);
}

/* The checkpoints' bytes are counted apart from the overlay's. */
static void
test_stats_checkpoints_apart(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "alpha", HOSTD_TEST_STOPPED);

    hostd_test_checkpoint_n(f, "alpha", 2);
    g_autoptr(VmCheckpointSet) set = hostd_test_checkpoints(f, "alpha");
    guint64 images = 0;
    for (guint i = 0; i < set->checkpoints->len; i++) {
        const VmCheckpoint *c = set->checkpoints->pdata[i];
        g_autofree char *path = vm_checkpoint_set_path(set, c->image);

        images += hostd_file_allocated(path);
    }
    g_autofree char *active = vm_checkpoint_set_path(set, set->active);

    g_autoptr(VmMessage) m = converse(f, VM_OP_AGENT_STATS, NULL, NULL);
    g_autoptr(GVariant) agents = stats_agents(m);
    g_autoptr(GVariant) agent = g_variant_get_child_value(agents, 0);
    assert_true(images > 0);
    assert_int_equal(field_u64(agent, "checkpoints_allocated_bytes"), images);
    assert_int_equal(field_u64(agent, "disk_allocated_bytes"), hostd_file_allocated(active));
}

/* The CPU % between two samples: 100 is one CPU busy all the time; a sample too close to the
 * last does not replace it; a CPU time that goes back (a new QEMU) starts again. */
static void
test_cpu_percent(void **state)
{
    g_autoptr(HostdMetrics) m = hostd_metrics_new();
    double pct = -1;

    assert_true(hostd_metrics_cpu_percent(0, 0, 1000000000, 1000000) == 100.0);
    assert_true(hostd_metrics_cpu_percent(0, 0, 2500000000ULL, 1000000) == 250.0);
    assert_true(hostd_metrics_cpu_percent(5, 10, 4, 20) == 0.0);
    assert_true(hostd_metrics_cpu_percent(5, 10, 9, 10) == 0.0);

    assert_false(hostd_metrics_cpu_sample(m, "a", 1000000000, 1000000, &pct));
    /* Half a CPU over a second. */
    assert_true(hostd_metrics_cpu_sample(m, "a", 1500000000, 2000000, &pct));
    assert_true(pct == 50.0);
    /* 0.1 s later: spans from the sample before (1.5 s of CPU in 1.1 s is not what it says). */
    assert_true(hostd_metrics_cpu_sample(m, "a", 1600000000, 2100000, &pct));
    assert_true(pct == 100.0);
    /* A second after the kept one, a whole CPU. */
    assert_true(hostd_metrics_cpu_sample(m, "a", 2500000000ULL, 3000000, &pct));
    assert_true(pct == 100.0);
    /* A new QEMU: no figure until its second sample. */
    assert_false(hostd_metrics_cpu_sample(m, "a", 1000, 4000000, &pct));
    assert_true(hostd_metrics_cpu_sample(m, "a", 250001000, 5000000, &pct));
    assert_true(pct == 25.0);
    hostd_metrics_forget(m, "a");
    assert_false(hostd_metrics_cpu_sample(m, "a", 300000000, 6000000, &pct));
}

/* ---- the Prometheus text ---- */

/* A stats list of one agent named @name (any text: the escaping is what is tested). */
static GVariant *
one_agent(const char *name, const char *state)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    g_auto(GVariantBuilder) a = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    g_variant_builder_add(&a, "{sv}", "name", g_variant_new_string(name));
    g_variant_builder_add(&a, "{sv}", "state", g_variant_new_string(state));
    g_variant_builder_add(&a, "{sv}", "vcpus", g_variant_new_uint32(2));
    g_variant_builder_add(&a, "{sv}", "cpu_time_ns", g_variant_new_uint64(1500000000));
    g_variant_builder_add(&a, "{sv}", "cpu_percent", g_variant_new_double(12.5));
    g_variant_builder_add(&a, "{sv}", "qemu_rss_bytes", g_variant_new_uint64(123456789));
    g_variant_builder_add(&a, "{sv}", "ksm_merged_bytes", g_variant_new_uint64(4096));
    g_variant_builder_add(&a, "{sv}", "egress_bytes_up", g_variant_new_uint64(10));
    g_variant_builder_add(&a, "{sv}", "egress_bytes_down", g_variant_new_uint64(20));
    g_variant_builder_add(&a, "{sv}", "execs", g_variant_new_uint64(3));
    g_variant_builder_add_value(&b, g_variant_builder_end(&a));
    return g_variant_ref_sink(g_variant_builder_end(&b));
}

static void
test_label_escape(void **state)
{
    g_autofree char *plain = hostd_metrics_label_escape("web-2");
    g_autofree char *hostile = hostd_metrics_label_escape("a\"b\\c\nd");
    g_autofree char *invalid = hostd_metrics_label_escape("x\xff");

    assert_string_equal(plain, "web-2");
    assert_string_equal(hostile, "a\\\"b\\\\c\\nd");
    assert_true(g_utf8_validate(invalid, -1, NULL));
}

/* What Python's prometheus_client parser reads in @text: one line per sample, "NAME LABELS
 * VALUE" with the labels sorted, and "# TYPE NAME TYPE" per family. */
static char *
python_parse(const char *text)
{
    const char *script = "import sys\n"
                         "from prometheus_client.parser import text_string_to_metric_families\n"
                         "for fam in text_string_to_metric_families(sys.stdin.read()):\n"
                         "    print('# TYPE', fam.name, fam.type)\n"
                         "    for s in fam.samples:\n"
                         "        print(s.name, sorted(s.labels.items()), repr(float(s.value)))\n";
    /* Debian's Python, which has Debian's python3-prometheus-client (scripts/packages.txt),
     * whatever python3 comes first on PATH. */
    const char *python =
        g_file_test("/usr/bin/python3", G_FILE_TEST_IS_EXECUTABLE) ? "/usr/bin/python3" : "python3";
    const char *argv[] = {python, "-c", script, NULL};
    g_autoptr(GError) error = NULL;
    g_autofree char *out = NULL;
    g_autofree char *err = NULL;
    int status = -1;
    g_autoptr(GSubprocess) p =
        g_subprocess_newv(argv,
                          G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                              G_SUBPROCESS_FLAGS_STDERR_PIPE,
                          &error);

    if (p == NULL)
        fail_msg("python3: %s", error->message);
    if (!g_subprocess_communicate_utf8(p, text, NULL, &out, &err, &error))
        fail_msg("python3: %s", error->message);
    status = g_subprocess_get_exit_status(p);
    if (status != 0)
        fail_msg("prometheus_client did not parse it (%d): %s\n%s", status, err, text);
    return g_steal_pointer(&out);
}

/* The text holds HELP and TYPE before each family, the agent's figures under its name with the
 * label escaped, hostd's own figures; and a Prometheus parser reads back the same. */
static void
test_metrics_text(void **state)
{
    g_autoptr(HostdMetrics) m = hostd_metrics_new();
    g_autoptr(GVariant) agents = one_agent("we\"ird\\na\nme", "running");

    hostd_metrics_request(m, "agent-list", 3000);
    hostd_metrics_request(m, "agent-list", 2 * G_USEC_PER_SEC);
    hostd_metrics_request(m, "agent-new", 40 * G_USEC_PER_SEC);
    g_auto(GVariantBuilder) kb = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&kb, "{sv}", "mode", g_variant_new_string("auto"));
    g_variant_builder_add(&kb, "{sv}", "run", g_variant_new_string("running"));
    g_variant_builder_add(&kb, "{sv}", "pages_sharing", g_variant_new_uint64(25600));
    g_variant_builder_add(&kb, "{sv}", "general_profit_bytes", g_variant_new_int64(-8192));
    g_autoptr(GVariant) ksm = g_variant_ref_sink(g_variant_builder_end(&kb));
    g_autofree char *text = hostd_metrics_text(m, agents, ksm);

    assert_non_null(strstr(text, "# HELP hostd_uptime_seconds "));
    assert_non_null(strstr(text, "# TYPE hostd_request_duration_seconds histogram\n"));
    assert_non_null(strstr(text, "hostd_agents{state=\"running\"} 1\n"));
    assert_non_null(strstr(text, "hostd_agents{state=\"saved\"} 0\n"));
    assert_non_null(strstr(text, "hostd_agent_cpu_percent{agent=\"we\\\"ird\\\\na\\nme\"} 12.5\n"));
    assert_non_null(strstr(text, "hostd_agent_egress_bytes_total{agent=\"we\\\"ird\\\\na\\nme\","
                                 "direction=\"down\"} 20\n"));
    assert_non_null(strstr(text, "hostd_request_duration_seconds_bucket{request=\"agent-list\","
                                 "le=\"0.005\"} 1\n"));
    assert_non_null(strstr(text, "hostd_request_duration_seconds_bucket{request=\"agent-list\","
                                 "le=\"+Inf\"} 2\n"));
    assert_null(strstr(text, "hostd_agent_guest_memory_used_bytes{"));
    assert_non_null(strstr(text, "hostd_ksm_info{mode=\"auto\",run=\"running\"} 1\n"));
    assert_non_null(strstr(text, "\nhostd_ksm_pages_sharing 25600\n"));
    assert_non_null(strstr(text, "\nhostd_ksm_general_profit_bytes -8192\n"));
    assert_null(strstr(text, "hostd_ksm_pages_shared"));
    assert_non_null(
        strstr(text, "hostd_agent_ksm_merged_bytes{agent=\"we\\\"ird\\\\na\\nme\"} 4096\n"));

    g_autofree char *parsed = python_parse(text);
    const char *name_label = "('agent', 'we\"ird\\\\na\\nme')";
    g_autofree char *cpu = g_strdup_printf("hostd_agent_cpu_seconds_total [%s] 1.5\n", name_label);
    g_autofree char *rss =
        g_strdup_printf("hostd_agent_qemu_rss_bytes [%s] 123456789.0\n", name_label);
    g_autofree char *up = g_strdup_printf(
        "hostd_agent_egress_bytes_total [%s, ('direction', 'up')] 10.0\n", name_label);
    assert_non_null(strstr(parsed, "# TYPE hostd_agent_cpu_seconds counter\n"));
    if (strstr(parsed, cpu) == NULL || strstr(parsed, rss) == NULL || strstr(parsed, up) == NULL)
        fail_msg("parsed:\n%s\nwanted:\n%s%s%s", parsed, cpu, rss, up);
    assert_non_null(strstr(parsed, "hostd_request_duration_seconds_count [('request', "
                                   "'agent-new')] 1.0\n"));
    assert_non_null(strstr(parsed, "hostd_request_duration_seconds_bucket [('le', '30'), "
                                   "('request', 'agent-new')] 0.0\n"));
    assert_non_null(strstr(parsed, "hostd_request_duration_seconds_bucket [('le', '60'), "
                                   "('request', 'agent-new')] 1.0\n"));
}

/* The endpoint answers GET with the text of hostd's agents, and counts the requests served. */
static void
test_metrics_endpoint(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "alpha", HOSTD_TEST_RUNNING);
    g_autofree char *path = g_build_filename(f->dir, "metrics.sock", NULL);
    g_autoptr(GError) error = NULL;
    HostdMetricsServer *server = hostd_metrics_server_start(f->ctx, path, &error);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    g_autoptr(GString) answer = g_string_new(NULL);
    char buf[4096];
    gssize n;

    if (server == NULL)
        fail_msg("%s", error->message);
    g_autoptr(VmMessage) ping = converse(f, VM_OP_PING, NULL, NULL);
    g_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
    vm_autofd fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    const char *get = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    assert_int_equal(write(fd, get, strlen(get)), (gssize)strlen(get));
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        g_string_append_len(answer, buf, n);
    hostd_metrics_server_stop(server);
    assert_false(g_file_test(path, G_FILE_TEST_EXISTS));

    if (!g_str_has_prefix(answer->str, "HTTP/1.0 200") &&
        !g_str_has_prefix(answer->str, "HTTP/1.1 200"))
        fail_msg("answer: %s", answer->str);
    assert_non_null(strstr(answer->str, "text/plain; version=0.0.4"));
    const char *body = strstr(answer->str, "\r\n\r\n");
    assert_non_null(body);
    assert_non_null(strstr(body, "hostd_agent_info{agent=\"alpha\",state=\"running\"} 1\n"));
    assert_non_null(strstr(body, "hostd_agent_cpu_percent{agent=\"alpha\"} "));
    assert_non_null(strstr(body, "hostd_request_duration_seconds_count{request=\"ping\"} 1\n"));
    g_autofree char *parsed = python_parse(body + 4);
    assert_non_null(strstr(parsed, "# TYPE hostd_agents gauge\n"));
}

/* ---- agent-logs ---- */

/* A console a hostile guest wrote: screen clears, a title change, a bell, invalid UTF-8, a
 * bidirectional override, a prompt it did not end. */
static const char hostile_console[] = "[    0.000000] Linux version 6.1\r\n"
                                      "\x1b[2J\x1b]0;pwned\x07gotcha\r\n"
                                      "bad \xff\xfe bytes \xe2\x80\xae reversed\r\n"
                                      "debian login: ";

static void
write_console(Fixture *f, const char *name)
{
    g_autofree char *path = hostd_test_agent_file(f, name, HOSTD_AGENT_CONSOLE);

    assert_true(g_file_set_contents(path, hostile_console, sizeof(hostile_console) - 1, NULL));
}

/* The console comes escaped, line by line, carriage returns dropped; --lines takes its end. */
static void
test_logs_escaped(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "alpha", HOSTD_TEST_RUNNING);
    g_autofree char *all = NULL;
    g_autofree char *last = NULL;

    write_console(f, "alpha");
    g_autoptr(VmMessage) end = converse(f, VM_OP_AGENT_LOGS, "{'name': <'alpha'>}", &all);
    assert_int_equal(end->op, VM_OP_EXIT);
    assert_string_equal(all, "[    0.000000] Linux version 6.1\n"
                             "\\x1b[2J\\x1b]0;pwned\\x07gotcha\n"
                             "bad \\xff\\xfe bytes \\u202e reversed\n");
    for (const char *c = all; *c != '\0'; c++) {
        if ((guchar)*c < 0x20 && *c != '\n')
            fail_msg("a control byte 0x%02x reached the client", (guchar)*c);
    }
    g_autoptr(VmMessage) end2 =
        converse(f, VM_OP_AGENT_LOGS, "{'name': <'alpha'>, 'lines': <uint32 1>}", &last);
    assert_int_equal(end2->op, VM_OP_EXIT);
    assert_string_equal(last, "bad \\xff\\xfe bytes \\u202e reversed\n");

    g_autoptr(VmMessage) missing = converse(f, VM_OP_AGENT_LOGS, "{'name': <'zulu'>}", NULL);
    assert_error(missing, VM_ERROR_NOT_FOUND, NULL);
    g_autoptr(VmMessage) both = converse(
        f, VM_OP_AGENT_LOGS, "{'name': <'alpha'>, 'follow': <true>, 'cloud_init': <true>}", NULL);
    assert_error(both, VM_ERROR_INVALID_ARGUMENT, "--follow");
    g_autoptr(HostdAgentRecord) s = hostd_test_agent_new(f, "bravo", HOSTD_TEST_STOPPED);
    g_autoptr(VmMessage) stopped =
        converse(f, VM_OP_AGENT_LOGS, "{'name': <'bravo'>, 'cloud_init': <true>}", NULL);
    assert_error(stopped, VM_ERROR_BAD_STATE, "running");
}

/* cloud-init's output is escaped and cut the same way, its last line counted when unended. */
static void
test_logs_escape_tail(void **state)
{
    g_autoptr(GString) all =
        hostd_logs_escape_tail(hostile_console, sizeof(hostile_console) - 1, G_MAXUINT32);
    g_autoptr(GString) two =
        hostd_logs_escape_tail(hostile_console, sizeof(hostile_console) - 1, 2);
    g_autoptr(GString) none = hostd_logs_escape_tail("", 0, 5);
    g_autofree char *long_line = g_strnfill(3 * HOSTD_LOGS_LINE_MAX, 'x');
    g_autoptr(GString) cut = hostd_logs_escape_tail(long_line, strlen(long_line), 1);

    assert_non_null(strstr(all->str, "\\x1b]0;pwned\\x07gotcha\n"));
    assert_true(g_str_has_suffix(all->str, "debian login: \n"));
    assert_string_equal(two->str, "bad \\xff\\xfe bytes \\u202e reversed\ndebian login: \n");
    assert_string_equal(none->str, "");
    assert_int_equal(cut->len, HOSTD_LOGS_LINE_MAX + 3 + 1);
    assert_true(g_str_has_suffix(cut->str, "...\n"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stats_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_ksm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_checkpoints_apart, setup, teardown),
        cmocka_unit_test(test_cpu_percent),
        cmocka_unit_test(test_label_escape),
        cmocka_unit_test(test_metrics_text),
        cmocka_unit_test_setup_teardown(test_metrics_endpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logs_escaped, setup, teardown),
        cmocka_unit_test(test_logs_escape_tail),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
