/* KSM and per-agent memory accounting without a kernel's help: the controller of `ksm = auto|on|
 * off` against a fixture directory standing for /sys/kernel/mm/ksm (what it writes, what it puts
 * back, what it does where the files are missing or cannot be written), the host's figures it
 * reads there, and the parsers of /proc/PID/status, ksm_merging_pages and ksm_stat against
 * fixture text and a fixture /proc. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-ksm.h"
#include "hostd-memory.h"
#include "test-common.h"
#include "test-hostd-fixture.h"

/* A fixture sysfs directory with run = @run and some figures. */
static char *
ksm_dir(VmTestTmpDir *t, const char *run)
{
    g_autofree char *path = g_build_filename(t->dir, "ksm", NULL);
    const struct {
        const char *name;
        const char *value;
    } files[] = {
        {"run", run},
        {"pages_shared", "1200\n"},
        {"pages_sharing", "51200\n"},
        {"general_profit", "-4096\n"},
    };

    g_assert(g_mkdir(path, 0755) == 0);
    for (gsize i = 0; i < G_N_ELEMENTS(files); i++) {
        g_autofree char *file = g_build_filename(path, files[i].name, NULL);

        vm_test_write_file(file, files[i].value);
    }
    return g_steal_pointer(&path);
}

/* The run file's content under @dir, stripped. */
static char *
run_of(const char *dir)
{
    g_autofree char *path = g_build_filename(dir, "run", NULL);
    char *text = vm_test_read_file(path);

    return g_strstrip(text);
}

static void
assert_run(const char *dir, const char *want)
{
    g_autofree char *run = run_of(dir);

    assert_string_equal(run, want);
}

/* A log line, which must say @needle (NULL: there must be none). */
static void
assert_note(char *note, const char *needle)
{
    g_autofree char *owned = note;

    if (needle == NULL) {
        if (owned != NULL)
            fail_msg("unexpected log line: %s", owned);
        return;
    }
    if (owned == NULL)
        fail_msg("no log line, wanted one saying '%s'", needle);
    if (strstr(owned, needle) == NULL)
        fail_msg("'%s' does not say '%s'", owned, needle);
}

/* on: run=1 at start, the old value back at the end; a second start finds it on and keeps it. */
static void
test_on(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *dir = ksm_dir(t, "0\n");
    g_autoptr(HostdKsm) ksm = hostd_ksm_new(dir, HOSTD_KSM_ON);

    assert_note(hostd_ksm_begin(ksm), "run was 0");
    assert_run(dir, "1");
    /* Agents come and go: on stays on. */
    assert_note(hostd_ksm_agents_running(ksm, TRUE), NULL);
    assert_note(hostd_ksm_agents_running(ksm, FALSE), NULL);
    assert_run(dir, "1");
    assert_note(hostd_ksm_restore(ksm), "put back to 0");
    assert_run(dir, "0");
    /* Once put back, nothing more to do. */
    assert_note(hostd_ksm_restore(ksm), NULL);

    /* Found on: left on, also at the end. */
    g_autofree char *path = g_build_filename(dir, "run", NULL);
    vm_test_write_file(path, "1\n");
    g_autoptr(HostdKsm) again = hostd_ksm_new(dir, HOSTD_KSM_ON);
    assert_note(hostd_ksm_begin(again), NULL);
    assert_note(hostd_ksm_restore(again), NULL);
    assert_run(dir, "1");
}

/* auto: on while agents run, back to what it was when none does; found on, never turned off. */
static void
test_auto(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *dir = ksm_dir(t, "0\n");
    g_autoptr(HostdKsm) ksm = hostd_ksm_new(dir, HOSTD_KSM_AUTO);

    assert_note(hostd_ksm_begin(ksm), NULL);
    assert_run(dir, "0");
    assert_note(hostd_ksm_agents_running(ksm, FALSE), NULL);
    assert_run(dir, "0");
    assert_note(hostd_ksm_agents_running(ksm, TRUE), "run was 0");
    assert_run(dir, "1");
    /* Told again: nothing written, nothing said. */
    assert_note(hostd_ksm_agents_running(ksm, TRUE), NULL);
    assert_note(hostd_ksm_agents_running(ksm, FALSE), "put back to 0");
    assert_run(dir, "0");
    assert_note(hostd_ksm_agents_running(ksm, TRUE), "run was 0");
    /* hostd stops with agents running (shutdown = keep): put back all the same. */
    assert_note(hostd_ksm_restore(ksm), "put back to 0");
    assert_run(dir, "0");

    /* Someone else had it on: auto leaves it on when the agents go. */
    g_autofree char *path = g_build_filename(dir, "run", NULL);
    vm_test_write_file(path, "1\n");
    g_autoptr(HostdKsm) found_on = hostd_ksm_new(dir, HOSTD_KSM_AUTO);
    assert_note(hostd_ksm_agents_running(found_on, TRUE), NULL);
    assert_note(hostd_ksm_agents_running(found_on, FALSE), NULL);
    assert_note(hostd_ksm_restore(found_on), NULL);
    assert_run(dir, "1");

    /* Found unmerging (2): on while agents run, 2 again after. */
    vm_test_write_file(path, "2\n");
    g_autoptr(HostdKsm) unmerging = hostd_ksm_new(dir, HOSTD_KSM_AUTO);
    assert_note(hostd_ksm_agents_running(unmerging, TRUE), "run was 2");
    assert_run(dir, "1");
    assert_note(hostd_ksm_restore(unmerging), "put back to 2");
    assert_run(dir, "2");
}

/* off: the file is never written, whatever happens. */
static void
test_off(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *dir = ksm_dir(t, "0\n");
    g_autofree char *path = g_build_filename(dir, "run", NULL);
    g_autoptr(HostdKsm) ksm = hostd_ksm_new(dir, HOSTD_KSM_OFF);
    GStatBuf before, after;

    g_assert(g_stat(path, &before) == 0);
    assert_note(hostd_ksm_begin(ksm), NULL);
    assert_note(hostd_ksm_agents_running(ksm, TRUE), NULL);
    assert_note(hostd_ksm_agents_running(ksm, FALSE), NULL);
    assert_note(hostd_ksm_restore(ksm), NULL);
    g_assert(g_stat(path, &after) == 0);
    assert_run(dir, "0");
    assert_int_equal(before.st_mtime, after.st_mtime);
    assert_int_equal(before.st_ino, after.st_ino);

    /* It still reports what KSM does. */
    g_autoptr(GVariant) figures = g_variant_ref_sink(hostd_ksm_figures(ksm));
    const char *mode = NULL;
    assert_true(g_variant_lookup(figures, "mode", "&s", &mode));
    assert_string_equal(mode, "off");
}

/* No KSM (no directory), a run file that holds no number, a directory in its place: hostd goes
 * on, says so once, and changes nothing. */
static void
test_missing_unwritable(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *none = g_build_filename(t->dir, "no-ksm", NULL);
    g_autoptr(HostdKsm) missing = hostd_ksm_new(none, HOSTD_KSM_ON);

    assert_note(hostd_ksm_begin(missing), "cannot read run");
    assert_note(hostd_ksm_agents_running(missing, TRUE), NULL);
    assert_note(hostd_ksm_restore(missing), NULL);
    assert_false(g_file_test(none, G_FILE_TEST_EXISTS));
    g_autoptr(GVariant) figures = g_variant_ref_sink(hostd_ksm_figures(missing));
    g_autoptr(GVariant) run = g_variant_lookup_value(figures, "run", NULL);
    assert_null(run);
    assert_int_equal(g_variant_n_children(figures), 1);

    /* auto says it once, however often agents come and go. */
    g_autoptr(HostdKsm) missing_auto = hostd_ksm_new(none, HOSTD_KSM_AUTO);
    assert_note(hostd_ksm_agents_running(missing_auto, TRUE), "going on without it");
    assert_note(hostd_ksm_agents_running(missing_auto, FALSE), NULL);
    assert_note(hostd_ksm_agents_running(missing_auto, TRUE), NULL);

    /* A run file that is not a number. */
    g_autofree char *dir = ksm_dir(t, "junk\n");
    g_autoptr(HostdKsm) junk = hostd_ksm_new(dir, HOSTD_KSM_ON);
    assert_note(hostd_ksm_begin(junk), "run holds no number");
    assert_run(dir, "junk");

    /* A directory where run should be. */
    g_autofree char *path = g_build_filename(dir, "run", NULL);
    g_assert(g_unlink(path) == 0);
    g_assert(g_mkdir(path, 0755) == 0);
    g_autoptr(HostdKsm) directory = hostd_ksm_new(dir, HOSTD_KSM_AUTO);
    assert_note(hostd_ksm_agents_running(directory, TRUE), "going on without it");
    assert_note(hostd_ksm_restore(directory), NULL);
    assert_true(g_file_test(path, G_FILE_TEST_IS_DIR));
}

/* A run file that reads a value but refuses writes, even root's: a read-only sysctl (root ignores
 * a plain file's mode). Said once; nothing to put back. */
static void
test_write_fails(void **state)
{
    VmTestTmpDir *t = *state;
    const char *readonly = "/proc/sys/kernel/bootloader_version";
    g_autofree char *dir = g_build_filename(t->dir, "ksm", NULL);
    g_autofree char *path = g_build_filename(dir, "run", NULL);
    g_autofree char *value = NULL;
    guint64 number = 0;

    if (!g_file_get_contents(readonly, &value, NULL, NULL) ||
        !hostd_memory_parse_number(value, 0, &number)) {
        skip();
        return;
    }
    g_assert(g_mkdir(dir, 0755) == 0);
    g_assert(symlink(readonly, path) == 0);
    g_autoptr(HostdKsm) ksm = hostd_ksm_new(dir, HOSTD_KSM_AUTO);
    assert_note(hostd_ksm_agents_running(ksm, TRUE), "cannot write run");
    assert_note(hostd_ksm_agents_running(ksm, FALSE), NULL);
    assert_note(hostd_ksm_agents_running(ksm, TRUE), NULL);
    assert_note(hostd_ksm_restore(ksm), NULL);
}

/* The host's figures: mode, run in words, pages, saved bytes, a negative profit. */
static void
test_figures(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *dir = ksm_dir(t, "1\n");
    g_autoptr(HostdKsm) ksm = hostd_ksm_new(dir, HOSTD_KSM_AUTO);
    g_autoptr(GVariant) figures = g_variant_ref_sink(hostd_ksm_figures(ksm));
    const char *mode = NULL, *run = NULL;
    guint64 shared = 0, sharing = 0, saved = 0;
    gint64 profit = 0;

    assert_true(g_variant_lookup(figures, "mode", "&s", &mode));
    assert_string_equal(mode, "auto");
    assert_true(g_variant_lookup(figures, "run", "&s", &run));
    assert_string_equal(run, "running");
    assert_true(g_variant_lookup(figures, "pages_shared", "t", &shared));
    assert_int_equal(shared, 1200);
    assert_true(g_variant_lookup(figures, "pages_sharing", "t", &sharing));
    assert_int_equal(sharing, 51200);
    assert_true(g_variant_lookup(figures, "saved_bytes", "t", &saved));
    assert_int_equal(saved, 51200ULL * (guint64)sysconf(_SC_PAGESIZE));
    assert_true(g_variant_lookup(figures, "general_profit_bytes", "x", &profit));
    assert_int_equal(profit, -4096);

    /* An older kernel has no general_profit: left out. A hostile or broken value: left out. */
    g_autofree char *profit_path = g_build_filename(dir, "general_profit", NULL);
    g_autofree char *sharing_path = g_build_filename(dir, "pages_sharing", NULL);
    g_autofree char *run_path = g_build_filename(dir, "run", NULL);
    g_assert(g_unlink(profit_path) == 0);
    vm_test_write_file(sharing_path, "99999999999999999999999\n");
    vm_test_write_file(run_path, "3\n");
    g_autoptr(GVariant) fewer = g_variant_ref_sink(hostd_ksm_figures(ksm));
    g_autoptr(GVariant) no_profit = g_variant_lookup_value(fewer, "general_profit_bytes", NULL);
    g_autoptr(GVariant) no_sharing = g_variant_lookup_value(fewer, "pages_sharing", NULL);
    g_autoptr(GVariant) no_saved = g_variant_lookup_value(fewer, "saved_bytes", NULL);
    g_autoptr(GVariant) no_run = g_variant_lookup_value(fewer, "run", NULL);
    assert_null(no_profit);
    assert_null(no_sharing);
    assert_null(no_saved);
    assert_null(no_run);
    assert_true(g_variant_lookup(fewer, "pages_shared", "t", &shared));
}

static void
test_mode_parse(void **state)
{
    HostdKsmMode mode = HOSTD_KSM_OFF;

    assert_true(hostd_ksm_mode_parse("auto", &mode));
    assert_int_equal(mode, HOSTD_KSM_AUTO);
    assert_true(hostd_ksm_mode_parse("on", &mode));
    assert_int_equal(mode, HOSTD_KSM_ON);
    assert_true(hostd_ksm_mode_parse("off", &mode));
    assert_int_equal(mode, HOSTD_KSM_OFF);
    assert_false(hostd_ksm_mode_parse("yes", &mode));
    assert_false(hostd_ksm_mode_parse("", &mode));
    assert_false(hostd_ksm_mode_parse(NULL, &mode));
    assert_string_equal(hostd_ksm_mode_name(HOSTD_KSM_ON), "on");
}

/* ---- following the agents ---- */

/* Runs the default main context until @dir's run reads @want, for at most 10 s. */
static void
wait_run(const char *dir, const char *want)
{
    gint64 deadline = g_get_monotonic_time() + 10 * G_USEC_PER_SEC;

    for (;;) {
        g_autofree char *run = run_of(dir);

        if (g_str_equal(run, want))
            return;
        if (g_get_monotonic_time() > deadline)
            fail_msg("run is %s, not %s, after 10 s", run, want);
        g_main_context_iteration(NULL, FALSE);
        g_usleep(10 * 1000);
    }
}

/* hostd with ksm = auto over libvirt's test driver: on as soon as an agent's domain starts
 * (libvirt's lifecycle event, handled on the main context), back off when the last one stops,
 * on again for the next, and put back as found when hostd stops with one running. */
static void
test_auto_follows_agents(void **state)
{
    HostdTestFixture *f = *state;
    VmTestTmpDir t = {.dir = f->dir};
    g_autofree char *dir = ksm_dir(&t, "0\n");

    f->ctx->config->ksm = HOSTD_KSM_AUTO;
    hostd_ksm_start(f->ctx, dir);
    assert_non_null(f->ctx->ksm);
    assert_run(dir, "0");

    g_autoptr(HostdAgentRecord) a = hostd_test_agent_new(f, "alpha", HOSTD_TEST_RUNNING);
    wait_run(dir, "1");
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(f->ctx->lv, "alpha", NULL);
    assert_non_null(dom);
    assert_int_equal(virDomainDestroy(dom), 0);
    wait_run(dir, "0");
    assert_int_equal(virDomainCreate(dom), 0);
    wait_run(dir, "1");

    hostd_ksm_stop(f->ctx);
    assert_null(f->ctx->ksm);
    assert_run(dir, "0");
    /* Stopped twice (main, then the context's detach): nothing more happens. */
    hostd_ksm_stop(f->ctx);
}

/* ksm = on: on at start with no agent at all; off: hostd_ksm_start() writes nothing. */
static void
test_start_on_off(void **state)
{
    HostdTestFixture *f = *state;
    VmTestTmpDir t = {.dir = f->dir};
    g_autofree char *dir = ksm_dir(&t, "0\n");

    f->ctx->config->ksm = HOSTD_KSM_ON;
    hostd_ksm_start(f->ctx, dir);
    assert_run(dir, "1");
    hostd_ksm_stop(f->ctx);
    assert_run(dir, "0");

    f->ctx->config->ksm = HOSTD_KSM_OFF;
    hostd_ksm_start(f->ctx, dir);
    g_autoptr(HostdAgentRecord) a = hostd_test_agent_new(f, "alpha", HOSTD_TEST_RUNNING);
    for (int i = 0; i < 20; i++)
        g_main_context_iteration(NULL, FALSE);
    assert_run(dir, "0");
    /* Left to the context's detach, as at an early exit of main(). */
}

/* ---- /proc parsers ---- */

static void
test_parse_number(void **state)
{
    static const struct {
        const char *text;
        gboolean ok;
        guint64 value;
    } cases[] = {
        {"0\n", TRUE, 0},    {"42", TRUE, 42},
        {"  7 \n", TRUE, 7}, {"1000", TRUE, 1000},
        {"1001", FALSE, 0}, /* above the bound */
        {"", FALSE, 0},      {"\n", FALSE, 0},
        {"-1\n", FALSE, 0},  {"+1", FALSE, 0},
        {"12abc", FALSE, 0}, {"1 2", FALSE, 0},
        {"0x10", FALSE, 0},  {"99999999999999999999999", FALSE, 0},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        guint64 value = 12345;
        gboolean ok = hostd_memory_parse_number(cases[i].text, 1000, &value);

        if (ok != cases[i].ok)
            fail_msg("'%s': %s", cases[i].text, ok ? "taken" : "refused");
        assert_int_equal(value, ok ? cases[i].value : 12345);
    }
    gint64 s = 0;
    assert_true(hostd_memory_parse_signed("-4096\n", 1 << 20, &s));
    assert_int_equal(s, -4096);
    assert_true(hostd_memory_parse_signed("5", 1 << 20, &s));
    assert_int_equal(s, 5);
    assert_false(hostd_memory_parse_signed("- 5", 1 << 20, &s));
    assert_false(hostd_memory_parse_signed("--5", 1 << 20, &s));
    assert_false(hostd_memory_parse_signed("-", 1 << 20, &s));
    assert_false(hostd_memory_parse_signed("-9999999999", 1 << 20, &s));
}

static const char status_text[] = "Name:\tqemu-system-x86\n"
                                  "Umask:\t0077\n"
                                  "VmPeak:\t 3215248 kB\n"
                                  "VmRSSX:\t 1 kB\n"
                                  "VmRSS:\t  466780 kB\n"
                                  "RssAnon:\t  450000 kB\n"
                                  "Threads:\t7\n";

static void
test_parse_status(void **state)
{
    guint64 bytes = 0;

    assert_true(hostd_memory_parse_status_kib(status_text, "VmRSS", &bytes));
    assert_int_equal(bytes, 466780ULL * 1024);
    assert_true(hostd_memory_parse_status_kib(status_text, "RssAnon", &bytes));
    assert_int_equal(bytes, 450000ULL * 1024);
    /* Not a size, absent, in another unit, too large, cut. */
    assert_false(hostd_memory_parse_status_kib(status_text, "Threads", &bytes));
    assert_false(hostd_memory_parse_status_kib(status_text, "VmSwap", &bytes));
    assert_false(hostd_memory_parse_status_kib("VmRSS:\t 12 MB\n", "VmRSS", &bytes));
    assert_false(hostd_memory_parse_status_kib("VmRSS:\t 99999999999999999 kB\n", "VmRSS", &bytes));
    assert_false(hostd_memory_parse_status_kib("VmRSS:\t kB\n", "VmRSS", &bytes));
    assert_false(hostd_memory_parse_status_kib("VmRSS:", "VmRSS", &bytes));
    assert_false(hostd_memory_parse_status_kib("", "VmRSS", &bytes));
    assert_true(hostd_memory_parse_status_kib("VmRSS:\t 1 kB", "VmRSS", &bytes));
    assert_int_equal(bytes, 1024);

    static const char ksm_stat[] = "ksm_rmap_items 3000\n"
                                   "ksm_zero_pages 12\n"
                                   "ksm_merging_pages 2500\n"
                                   "ksm_process_profit -20480\n"
                                   "ksm_merge_any no\n";
    gint64 value = 0;
    assert_true(hostd_memory_parse_keyed(ksm_stat, "ksm_process_profit", 1ULL << 50, &value));
    assert_int_equal(value, -20480);
    assert_true(hostd_memory_parse_keyed(ksm_stat, "ksm_merging_pages", 1ULL << 50, &value));
    assert_int_equal(value, 2500);
    assert_false(hostd_memory_parse_keyed(ksm_stat, "ksm_merge_any", 1ULL << 50, &value));
    assert_false(hostd_memory_parse_keyed(ksm_stat, "ksm_merging", 1ULL << 50, &value));
    assert_false(hostd_memory_parse_keyed(ksm_stat, "ksm_rmap_items", 100, &value));
}

/* A process's figures from a fixture /proc: each one only where its file says a number; a
 * missing or oversized file leaves its figure out. */
static void
test_process_figures(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *pid_dir = g_build_filename(t->dir, "4242", NULL);
    g_autofree char *status = g_build_filename(pid_dir, "status", NULL);
    g_autofree char *merging = g_build_filename(pid_dir, "ksm_merging_pages", NULL);
    g_autofree char *stat = g_build_filename(pid_dir, "ksm_stat", NULL);
    guint64 page = (guint64)sysconf(_SC_PAGESIZE);

    g_assert(g_mkdir(pid_dir, 0755) == 0);
    vm_test_write_file(status, status_text);
    vm_test_write_file(merging, "2500\n");
    vm_test_write_file(stat, "ksm_rmap_items 3000\nksm_process_profit 1003520\n");

    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    hostd_memory_add_process(&b, t->dir, 4242);
    g_autoptr(GVariant) all = g_variant_ref_sink(g_variant_builder_end(&b));
    guint64 rss = 0, merged = 0;
    gint64 profit = 0;
    assert_true(g_variant_lookup(all, "qemu_rss_bytes", "t", &rss));
    assert_int_equal(rss, 466780ULL * 1024);
    assert_true(g_variant_lookup(all, "ksm_merged_bytes", "t", &merged));
    assert_int_equal(merged, 2500 * page);
    assert_true(g_variant_lookup(all, "ksm_profit_bytes", "x", &profit));
    assert_int_equal(profit, 1003520);

    /* No KSM files (an older kernel), a status larger than any real one. */
    g_assert(g_unlink(merging) == 0);
    g_assert(g_unlink(stat) == 0);
    g_autofree char *huge = g_strnfill(HOSTD_MEMORY_FILE_MAX + 1, 'x');
    vm_test_write_file(status, huge);
    g_auto(GVariantBuilder) b2 = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    hostd_memory_add_process(&b2, t->dir, 4242);
    g_autoptr(GVariant) none = g_variant_ref_sink(g_variant_builder_end(&b2));
    assert_int_equal(g_variant_n_children(none), 0);

    /* This test's own process, in the real /proc: an RSS above 0. */
    g_auto(GVariantBuilder) b3 = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    hostd_memory_add_process(&b3, "/proc", getpid());
    g_autoptr(GVariant) self = g_variant_ref_sink(g_variant_builder_end(&b3));
    assert_true(g_variant_lookup(self, "qemu_rss_bytes", "t", &rss));
    assert_true(rss > 0);
}

static void
test_read_file_bound(void **state)
{
    VmTestTmpDir *t = *state;
    g_autofree char *path = g_build_filename(t->dir, "f", NULL);
    gsize len = 0;

    vm_test_write_file(path, "12345");
    g_autofree char *exact = hostd_memory_read_file(path, 5, &len);
    assert_non_null(exact);
    assert_int_equal(len, 5);
    assert_string_equal(exact, "12345");
    g_autofree char *over = hostd_memory_read_file(path, 4, &len);
    assert_null(over);
    g_autofree char *gone = hostd_memory_read_file("/nonexistent/f", 4, &len);
    assert_null(gone);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_on, vm_test_tmpdir_setup, vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_auto, vm_test_tmpdir_setup, vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_off, vm_test_tmpdir_setup, vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_missing_unwritable, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_write_fails, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_figures, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test(test_mode_parse),
        cmocka_unit_test_setup_teardown(test_auto_follows_agents, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_start_on_off, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test(test_parse_number),
        cmocka_unit_test(test_parse_status),
        cmocka_unit_test_setup_teardown(test_process_figures, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
        cmocka_unit_test_setup_teardown(test_read_file_bound, vm_test_tmpdir_setup,
                                        vm_test_tmpdir_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
