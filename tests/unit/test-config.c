/* hostd's configuration: defaults derived from the state dir, the key file, command-line
 * overrides that beat it, and bad files refused with the file named. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-config.h"
#include "hostd-state.h"
#include "vm-config.h"
#include "vm-error.h"
#include "vm-util.h"
#include "test-common.h"

typedef struct {
    char *dir;  /* a fresh temporary directory per test */
    char *file; /* <dir>/hostd.conf */
} Fixture;

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->dir = vm_test_make_tmpdir("test-config-XXXXXX");
    f->file = g_build_filename(f->dir, "hostd.conf", NULL);
    g_unsetenv("VM_TEMPLATES_DIR");
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    vm_test_remove_tree(f->dir);
    g_free(f->dir);
    g_free(f->file);
    g_free(f);
    g_unsetenv("VM_TEMPLATES_DIR");
    return 0;
}

static void
write_config(const Fixture *f, const char *text)
{
    g_autoptr(GError) error = NULL;

    if (!g_file_set_contents(f->file, text, -1, &error))
        fail_msg("cannot write %s: %s", f->file, error->message);
}

static HostdConfig *
load_ok(const char *path, const char *state_dir, const char *socket_path, const char *uri)
{
    g_autoptr(GError) error = NULL;
    HostdConfig *config = hostd_config_load(path, state_dir, socket_path, uri, &error);

    if (config == NULL)
        fail_msg("load failed: %s", error->message);
    return config;
}

static void
test_defaults(void **state)
{
    g_autoptr(HostdConfig) c = load_ok(NULL, "/srv/hostd", NULL, NULL);
    g_autofree char *templates = g_build_filename(VM_SOURCE_DIR, "templates", NULL);

    assert_string_equal(c->state_dir, "/srv/hostd");
    assert_string_equal(c->socket_path, "/srv/hostd/hostd.sock");
    assert_string_equal(c->uri, "qemu:///embed?root=/srv/hostd/libvirt");
    assert_string_equal(c->images_dir, "/srv/hostd/images");
    /* Run from the build tree, the shipped templates are the source tree's. */
    assert_string_equal(c->templates_dir, templates);
    assert_null(c->socket_group);
    assert_int_equal(c->ssh_port_min, 42200);
    assert_int_equal(c->accel, HOSTD_ACCEL_AUTO);
    assert_int_equal(c->ssh_port_max, 42999);
    assert_int_equal(c->boot_timeout_s, 300);
    assert_int_equal(c->forward_port_min, 43000);
    assert_int_equal(c->forward_port_max, 43999);
    assert_true(c->guest_api);
    assert_int_equal(c->guest_api_rate, 5);
    assert_int_equal(c->guest_api_burst, 20);
}

/* The in-guest API's keys, and request-timeout, which the file takes like every key. */
static void
test_guest_api_keys(void **state)
{
    Fixture *f = *state;

    write_config(f, "[hostd]\nguest-api=off\nguest-api-rate=1\nguest-api-burst=10000\n"
                    "request-timeout=2m\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_false(c->guest_api);
    assert_int_equal(c->guest_api_rate, 1);
    assert_int_equal(c->guest_api_burst, 10000);
    assert_int_equal(c->request_timeout_s, 120);
    write_config(f, "[hostd]\nguest-api=on\n");
    g_autoptr(HostdConfig) on = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_true(on->guest_api);
}

/* metrics-listen: loopback by default; an address with a port, a Unix socket's path or off;
 * nothing else. */
static void
test_metrics_listen(void **state)
{
    Fixture *f = *state;
    static const char *const good[] = {
        "off",          "/run/hostd/metrics.sock", "127.0.0.1:9464", "[::1]:9100",
        "0.0.0.0:9464", "localhost:9464"};
    static const char *const bad[] = {"127.0.0.1",       "127.0.0.1:0",    "127.0.0.1:70000",
                                      "metrics.sock",    "127.0.0.1:http", ":",
                                      "example.org:9464"};

    g_autoptr(HostdConfig) c = load_ok(NULL, "/srv/hostd", NULL, NULL);
    assert_string_equal(c->metrics_listen, "127.0.0.1:9464");
    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autofree char *text = g_strdup_printf("[hostd]\nmetrics-listen=%s\n", good[i]);

        write_config(f, text);
        g_autoptr(HostdConfig) ok = load_ok(f->file, "/srv/hostd", NULL, NULL);
        assert_string_equal(ok->metrics_listen, good[i]);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *text = g_strdup_printf("[hostd]\nmetrics-listen=%s\n", bad[i]);
        g_autoptr(GError) error = NULL;

        write_config(f, text);
        g_autoptr(HostdConfig) no = hostd_config_load(f->file, "/srv/hostd", NULL, NULL, &error);
        if (no != NULL)
            fail_msg("metrics-listen=%s was taken", bad[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(error->message, "metrics-listen"));
    }
}

/* ksm: auto by default; auto, on or off; nothing else. */
static void
test_ksm(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *text;
        HostdKsmMode mode;
    } good[] = {{"auto", HOSTD_KSM_AUTO}, {"on", HOSTD_KSM_ON}, {"off", HOSTD_KSM_OFF}};
    static const char *const bad[] = {"yes", "1", "ON", ""};

    g_autoptr(HostdConfig) c = load_ok(NULL, "/srv/hostd", NULL, NULL);
    assert_int_equal(c->ksm, HOSTD_KSM_AUTO);
    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        g_autofree char *text = g_strdup_printf("[hostd]\nksm=%s\n", good[i].text);

        write_config(f, text);
        g_autoptr(HostdConfig) ok = load_ok(f->file, "/srv/hostd", NULL, NULL);
        assert_int_equal(ok->ksm, good[i].mode);
    }
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *text = g_strdup_printf("[hostd]\nksm=%s\n", bad[i]);
        g_autoptr(GError) error = NULL;

        write_config(f, text);
        g_autoptr(HostdConfig) no = hostd_config_load(f->file, "/srv/hostd", NULL, NULL, &error);
        if (no != NULL)
            fail_msg("ksm=%s was taken", bad[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(error->message, "ksm must be one of auto, on, off"));
    }
}

/* pool: 0 by default, 0-64. */
static void
test_pool(void **state)
{
    Fixture *f = *state;

    g_autoptr(HostdConfig) d = load_ok(NULL, "/srv/hostd", NULL, NULL);
    assert_int_equal(d->pool, 0);
    write_config(f, "[hostd]\npool=2\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(c->pool, 2);
    static const char *const bad[] = {"65", "-1", "two"};
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *text = g_strdup_printf("[hostd]\npool=%s\n", bad[i]);
        g_autoptr(GError) error = NULL;

        write_config(f, text);
        g_autoptr(HostdConfig) no = hostd_config_load(f->file, "/srv/hostd", NULL, NULL, &error);
        if (no != NULL)
            fail_msg("pool=%s was taken", bad[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(error->message, "pool"));
    }
}

/* The checkpoint quota of a guest and the free-space floor: defaults, sizes, a share. */
static void
test_checkpoint_space_keys(void **state)
{
    Fixture *f = *state;

    g_autoptr(HostdConfig) d = load_ok(NULL, "/srv/hostd", NULL, NULL);
    assert_int_equal(d->guest_checkpoint_max, 64);
    assert_true(d->guest_checkpoint_bytes == 32ULL << 30);
    /* 5% of the filesystem, at most 2 GiB. */
    assert_true(hostd_config_free_floor(d, 10ULL << 30) == (10ULL << 30) / 100 * 5);
    assert_true(hostd_config_free_floor(d, 1ULL << 40) == 2ULL << 30);

    write_config(f, "[hostd]\nguest-checkpoint-max=3\nguest-checkpoint-bytes=512M\n"
                    "checkpoint-free-floor=10GiB\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(c->guest_checkpoint_max, 3);
    assert_true(c->guest_checkpoint_bytes == 512ULL << 20);
    assert_true(hostd_config_free_floor(c, 1ULL << 40) == 10ULL << 30);
    assert_true(hostd_config_free_floor(c, 1ULL << 30) == 10ULL << 30);

    write_config(f, "[hostd]\nguest-checkpoint-bytes=1000\ncheckpoint-free-floor=20%\n");
    g_autoptr(HostdConfig) p = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_true(p->guest_checkpoint_bytes == 1000);
    assert_true(hostd_config_free_floor(p, 1ULL << 40) == (1ULL << 40) / 100 * 20);

    write_config(f, "[hostd]\ncheckpoint-free-floor=0\nguest-checkpoint-max=0\n");
    g_autoptr(HostdConfig) z = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(z->guest_checkpoint_max, 0);
    assert_true(hostd_config_free_floor(z, 1ULL << 40) == 0);
}

/* The default disk limits, and each one set or turned off in the file. */
static void
test_disk_limit_keys(void **state)
{
    Fixture *f = *state;

    g_autoptr(HostdConfig) d = load_ok(NULL, "/srv/hostd", NULL, NULL);
    assert_int_equal(d->disk_limits[VM_DISK_READ_MIB], HOSTD_DISK_READ_MIB_DEFAULT);
    assert_int_equal(d->disk_limits[VM_DISK_WRITE_MIB], HOSTD_DISK_WRITE_MIB_DEFAULT);
    assert_int_equal(d->disk_limits[VM_DISK_READ_IOPS], HOSTD_DISK_READ_IOPS_DEFAULT);
    assert_int_equal(d->disk_limits[VM_DISK_WRITE_IOPS], HOSTD_DISK_WRITE_IOPS_DEFAULT);
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        assert_true(d->disk_limits[i] > 0);

    write_config(f, "[hostd]\ndisk-read=0\ndisk-write=1\ndisk-read-iops=1000000\n"
                    "disk-write-iops=7\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(c->disk_limits[VM_DISK_READ_MIB], 0);
    assert_int_equal(c->disk_limits[VM_DISK_WRITE_MIB], 1);
    assert_int_equal(c->disk_limits[VM_DISK_READ_IOPS], 1000000);
    assert_int_equal(c->disk_limits[VM_DISK_WRITE_IOPS], 7);
}

static void
test_default_state_dir(void **state)
{
    g_autoptr(HostdConfig) c = load_ok(NULL, NULL, NULL, NULL);
    g_autofree char *expected = vm_default_state_dir();
    g_autofree char *socket = g_build_filename(expected, "hostd.sock", NULL);

    assert_string_equal(c->state_dir, expected);
    assert_string_equal(c->socket_path, socket);
}

static void
test_templates_env(void **state)
{
    g_setenv("VM_TEMPLATES_DIR", "/opt/templates", TRUE);
    g_autoptr(HostdConfig) c = load_ok(NULL, "/srv/hostd", NULL, NULL);
    g_autofree char *dir = hostd_config_default_templates_dir();

    assert_string_equal(c->templates_dir, "/opt/templates");
    assert_string_equal(dir, "/opt/templates");

    /* Empty means unset. */
    g_setenv("VM_TEMPLATES_DIR", "", TRUE);
    g_autofree char *fallback = hostd_config_default_templates_dir();
    assert_string_not_equal(fallback, "");

    /* A hostd told not to use its build tree reads the installed templates, as an installed
     * hostd does even while the source tree exists. */
    g_unsetenv("VM_TEMPLATES_DIR");
    g_setenv("VM_USE_BUILD_TREE", "0", TRUE);
    g_autofree char *installed = hostd_config_default_templates_dir();
    g_autofree char *want = g_build_filename(VM_DATADIR, "templates", NULL);
    assert_string_equal(installed, want);
    g_unsetenv("VM_USE_BUILD_TREE");
}

static void
test_relative_state_dir(void **state)
{
    g_autofree char *cwd = g_get_current_dir();
    g_autofree char *expected = g_build_filename(cwd, "rel", "state", NULL);
    g_autofree char *uri = g_strdup_printf("qemu:///embed?root=%s/libvirt", expected);
    g_autoptr(HostdConfig) c = load_ok(NULL, "rel/state", NULL, NULL);

    assert_true(g_path_is_absolute(c->state_dir));
    assert_string_equal(c->state_dir, expected);
    /* Everything derived from it is absolute too: hostd and libvirt may change directory. */
    assert_true(g_str_has_prefix(c->socket_path, expected));
    assert_true(g_str_has_prefix(c->images_dir, expected));
    assert_string_equal(c->uri, uri);
}

static void
test_file_values(void **state)
{
    Fixture *f = *state;

    write_config(f, "# hostd configuration\n"
                    "[hostd]\n"
                    "state-dir=/data/hostd\n"
                    "socket=/run/hostd/hostd.sock\n"
                    "connect=qemu:///system\n"
                    "images-dir=/data/images\n"
                    "templates-dir=/etc/vmctl/templates\n"
                    "socket-group=vmctl\n"
                    "ssh-port-min=50000\n"
                    "ssh-port-max=50100\n"
                    "forward-port-min=8000\n"
                    "forward-port-max=8099\n"
                    "boot-timeout=10m\n"
                    "accel=tcg\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, NULL, NULL, NULL);

    assert_string_equal(c->state_dir, "/data/hostd");
    assert_string_equal(c->socket_path, "/run/hostd/hostd.sock");
    assert_string_equal(c->uri, "qemu:///system");
    assert_string_equal(c->images_dir, "/data/images");
    assert_string_equal(c->templates_dir, "/etc/vmctl/templates");
    assert_string_equal(c->socket_group, "vmctl");
    assert_int_equal(c->ssh_port_min, 50000);
    assert_int_equal(c->ssh_port_max, 50100);
    assert_int_equal(c->forward_port_min, 8000);
    assert_int_equal(c->forward_port_max, 8099);
    assert_int_equal(c->boot_timeout_s, 600);
    assert_int_equal(c->accel, HOSTD_ACCEL_TCG);
}

/* Paths the file leaves out follow the file's state dir. */
static void
test_file_partial(void **state)
{
    Fixture *f = *state;

    write_config(f, "[hostd]\nstate-dir=/data/hostd\nboot-timeout=90\nssh-port-min=42999\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, NULL, NULL, NULL);

    assert_string_equal(c->state_dir, "/data/hostd");
    assert_string_equal(c->socket_path, "/data/hostd/hostd.sock");
    assert_string_equal(c->uri, "qemu:///embed?root=/data/hostd/libvirt");
    assert_string_equal(c->images_dir, "/data/hostd/images");
    assert_int_equal(c->boot_timeout_s, 90);
    assert_int_equal(c->ssh_port_min, 42999);
    assert_int_equal(c->ssh_port_max, 42999);
}

static void
test_file_empty(void **state)
{
    Fixture *f = *state;
    static const char *const cases[] = {"", "# nothing\n", "[hostd]\n"};

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        write_config(f, cases[i]);
        g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
        assert_string_equal(c->socket_path, "/srv/hostd/hostd.sock");
        assert_int_equal(c->ssh_port_min, 42200);
        assert_int_equal(c->boot_timeout_s, 300);
    }
}

static void
test_overrides(void **state)
{
    Fixture *f = *state;

    write_config(f, "[hostd]\n"
                    "state-dir=/data/hostd\n"
                    "socket=/run/hostd/hostd.sock\n"
                    "connect=qemu:///system\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, "/cli/state", "/cli/hostd.sock", "test:///default");
    assert_string_equal(c->state_dir, "/cli/state");
    assert_string_equal(c->socket_path, "/cli/hostd.sock");
    assert_string_equal(c->uri, "test:///default");
    /* What neither sets follows the winning state dir. */
    assert_string_equal(c->images_dir, "/cli/state/images");

    /* A state dir from the command line alone moves the derived paths, not the file's own. */
    g_autoptr(HostdConfig) d = load_ok(f->file, "/cli/state", NULL, NULL);
    assert_string_equal(d->state_dir, "/cli/state");
    assert_string_equal(d->socket_path, "/run/hostd/hostd.sock");
    assert_string_equal(d->uri, "qemu:///system");
}

static void
test_bad_files(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *text;
        const char *needle; /* the message says this besides the file name */
    } cases[] = {
        {"[hostd]\nstate-dir=/x\n[extra]\nkey=1\n", "[extra]"},
        {"[other]\n", "[other]"},
        {"[hostd]\nstate_dir=/x\n", "state_dir"},
        {"[hostd]\nsocket-mode=0666\n", "socket-mode"},
        {"[hostd]\nguest-checkpoint-max=-1\n", "guest-checkpoint-max"},
        {"[hostd]\nguest-checkpoint-max=10001\n", "guest-checkpoint-max"},
        {"[hostd]\nguest-checkpoint-bytes=5%\n", "guest-checkpoint-bytes"},
        {"[hostd]\nguest-checkpoint-bytes=-1\n", "guest-checkpoint-bytes"},
        {"[hostd]\nguest-checkpoint-bytes=2X\n", "guest-checkpoint-bytes"},
        {"[hostd]\nguest-checkpoint-bytes=2GB7\n", "guest-checkpoint-bytes"},
        {"[hostd]\nguest-checkpoint-bytes=99999999999T\n", "guest-checkpoint-bytes"},
        {"[hostd]\nguest-checkpoint-bytes=\n", "guest-checkpoint-bytes"},
        {"[hostd]\ncheckpoint-free-floor=51%\n", "checkpoint-free-floor"},
        {"[hostd]\ncheckpoint-free-floor=%\n", "checkpoint-free-floor"},
        {"[hostd]\ncheckpoint-free-floor=G\n", "checkpoint-free-floor"},
        {"[hostd]\nssh-port-min=0\n", "ssh-port-min"},
        {"[hostd]\nssh-port-min=80\n", "ssh-port-min"},
        {"[hostd]\nssh-port-min=1023\n", "ssh-port-min"},
        {"[hostd]\nssh-port-max=65536\n", "ssh-port-max"},
        {"[hostd]\nssh-port-max=-1\n", "ssh-port-max"},
        {"[hostd]\nssh-port-max=port\n", "ssh-port-max"},
        {"[hostd]\nssh-port-max=42300x\n", "ssh-port-max"},
        {"[hostd]\nssh-port-max=\n", "ssh-port-max"},
        {"[hostd]\nssh-port-min=43000\nssh-port-max=42999\n", "ssh-port-min"},
        {"[hostd]\nssh-port-min=50000\n", "ssh-port-min"},
        {"[hostd]\nforward-port-min=80\n", "forward-port-min"},
        {"[hostd]\nforward-port-max=65536\n", "forward-port-max"},
        {"[hostd]\nforward-port-max=\n", "forward-port-max"},
        {"[hostd]\nforward-port-min=9000\nforward-port-max=8999\n", "forward-port-min"},
        {"[hostd]\nforward-port-min=44000\n", "forward-port-min"},
        {"[hostd]\nboot-timeout=0\n", "boot-timeout"},
        {"[hostd]\nboot-timeout=2h\n", "boot-timeout"},
        {"[hostd]\nboot-timeout=3601\n", "boot-timeout"},
        {"[hostd]\nboot-timeout=forever\n", "boot-timeout"},
        {"[hostd]\nboot-timeout=-5\n", "boot-timeout"},
        {"[hostd]\nboot-timeout=\n", "boot-timeout"},
        {"[hostd]\naccel=hvf\n", "accel must be auto, kvm or tcg"},
        {"[hostd]\naccel=\n", "accel must be auto, kvm or tcg"},
        {"[hostd]\nstate-dir=\n", "state-dir"},
        {"[hostd]\nsocket=\n", "socket"},
        {"[hostd]\nconnect=\n", "connect"},
        {"[hostd]\nimages-dir=\n", "images-dir"},
        {"[hostd]\ntemplates-dir=\n", "templates-dir"},
        {"[hostd]\nsocket-group=\n", "socket-group"},
        {"[hostd]\nguest-api=yes\n", "guest-api must be one of off, on"},
        {"[hostd]\nguest-api-rate=0\n", "guest-api-rate must be a number in 1-1000"},
        {"[hostd]\nguest-api-rate=1001\n", "guest-api-rate"},
        {"[hostd]\nguest-api-rate=5/s\n", "guest-api-rate"},
        {"[hostd]\nguest-api-burst=0\n", "guest-api-burst must be a number in 1-10000"},
        {"[hostd]\nguest-api-burst=-1\n", "guest-api-burst"},
        {"[hostd]\ndisk-read=-1\n", "disk-read must be a number in 0-1000000"},
        {"[hostd]\ndisk-write=1000001\n", "disk-write must be a number in 0-1000000"},
        {"[hostd]\ndisk-read-iops=fast\n", "disk-read-iops"},
        {"[hostd]\ndisk-write-iops=\n", "disk-write-iops"},
        {"[hostd]\negress-upstream-ca-file=\n", "egress-upstream-ca-file must not be empty"},
        {"[hostd]\negress-upstream-ca-file=/nonexistent/ca.pem\n", "/nonexistent/ca.pem"},
        {"[hostd]\negress-upstream-ca-file=/\n", "egress-upstream-ca-file / is not a readable"},
        {"[hostd\nstate-dir=/x\n", NULL},
        {"state-dir=/x\n", NULL},
        {"[hostd]\nstate-dir\n", NULL},
        {"[hostd]\nstate-dir=\xff\xfe\n", NULL},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autofree char *shown = g_strescape(cases[i].text, NULL);

        write_config(f, cases[i].text);
        g_autoptr(HostdConfig) c = hostd_config_load(f->file, "/srv/hostd", NULL, NULL, &error);
        if (c != NULL)
            fail_msg("'%s' was accepted", shown);
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT))
            fail_msg("'%s': expected INVALID_ARGUMENT, got %s", shown, error->message);
        if (!g_str_has_prefix(error->message, f->file))
            fail_msg("'%s': '%s' does not start with the file name", shown, error->message);
        if (cases[i].needle != NULL && strstr(error->message, cases[i].needle) == NULL)
            fail_msg("'%s': '%s' does not mention '%s'", shown, error->message, cases[i].needle);
    }
}

/* The upstream CA file (the credential broker's tests point proxies at their own CA): taken from
 * the file, made absolute, overridden by the option's setter, and a file hostd cannot read is
 * refused with its path, so that hostd stops at start rather than failing every intercepted
 * request later. */
static void
test_egress_upstream_ca_file(void **state)
{
    Fixture *f = *state;
    g_autofree char *ca = g_build_filename(f->dir, "ca.pem", NULL);
    g_autofree char *other = g_build_filename(f->dir, "other.pem", NULL);
    g_autofree char *unreadable = g_build_filename(f->dir, "unreadable.pem", NULL);
    g_autofree char *text = NULL;
    g_autoptr(GError) error = NULL;

    write_config(f, "[hostd]\n");
    g_autoptr(HostdConfig) none = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_null(none->egress_upstream_ca_file);

    assert_true(g_file_set_contents(ca, "-----BEGIN CERTIFICATE-----\n", -1, NULL));
    assert_true(g_file_set_contents(other, "-----BEGIN CERTIFICATE-----\n", -1, NULL));
    text = g_strdup_printf("[hostd]\negress-upstream-ca-file=%s\n", ca);
    write_config(f, text);
    g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_string_equal(c->egress_upstream_ca_file, ca);

    /* The option wins over the file. */
    assert_true(hostd_config_set_egress_upstream_ca_file(c, other, &error));
    assert_string_equal(c->egress_upstream_ca_file, other);

    /* A relative path is made absolute: hostd's directory may change, the proxies' may not. */
    g_autofree char *cwd = g_get_current_dir();
    assert_int_equal(chdir(f->dir), 0);
    gboolean relative_ok = hostd_config_set_egress_upstream_ca_file(c, "ca.pem", &error);
    assert_int_equal(chdir(cwd), 0);
    assert_true(relative_ok);
    assert_string_equal(c->egress_upstream_ca_file, ca);

    /* Missing, a directory, unreadable: refused, the path in the message, the old value kept. */
    assert_false(hostd_config_set_egress_upstream_ca_file(c, "/nonexistent/ca.pem", &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_non_null(strstr(error->message, "/nonexistent/ca.pem"));
    g_clear_error(&error);
    assert_false(hostd_config_set_egress_upstream_ca_file(c, f->dir, &error));
    g_clear_error(&error);
    assert_string_equal(c->egress_upstream_ca_file, ca);
    if (geteuid() != 0) {
        assert_true(g_file_set_contents(unreadable, "x", -1, NULL));
        assert_int_equal(g_chmod(unreadable, 0), 0);
        assert_false(hostd_config_set_egress_upstream_ca_file(c, unreadable, &error));
        assert_non_null(strstr(error->message, unreadable));
        g_clear_error(&error);
    }
}

/* [cluster]: its keys, their defaults, and what is refused; without it, no fleet. */
static void
test_cluster(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    write_config(f, "[hostd]\nstate-dir=/x\n");
    g_autoptr(HostdConfig) none = load_ok(f->file, NULL, NULL, NULL);
    assert_null(none->cluster);

    g_autofree char *ca = g_build_filename(f->dir, "ca.pem", NULL);
    g_autofree char *cert = g_build_filename(f->dir, "host.pem", NULL);
    g_autofree char *key = g_build_filename(f->dir, "host-key.pem", NULL);
    assert_true(g_file_set_contents(ca, "x", -1, NULL));
    assert_true(g_file_set_contents(cert, "x", -1, NULL));
    assert_true(g_file_set_contents(key, "x", -1, NULL));
    g_autofree char *full = g_strdup_printf(
        "[cluster]\nendpoints=https://10.0.0.1:2379; https://10.0.0.2:2379;https://10.0.0.3:2379\n"
        "host-id=rack1.h2\naddress=ssh://root@10.0.0.2\nca=%s\ncert=%s\nkey=%s\nlease-ttl=15\n"
        "replicate=2\n",
        ca, cert, key);
    write_config(f, full);
    g_autoptr(HostdConfig) config = load_ok(f->file, NULL, NULL, NULL);
    assert_non_null(config->cluster);
    assert_int_equal(g_strv_length(config->cluster->endpoints), 3);
    assert_string_equal(config->cluster->endpoints[1], "https://10.0.0.2:2379");
    assert_string_equal(config->cluster->host_id, "rack1.h2");
    assert_string_equal(config->cluster->address, "ssh://root@10.0.0.2");
    assert_string_equal(config->cluster->ca, ca);
    assert_string_equal(config->cluster->cert, cert);
    assert_string_equal(config->cluster->key, key);
    assert_int_equal(config->cluster->lease_ttl_s, 15);
    assert_int_equal(config->cluster->replicate, 2);

    write_config(f, "[cluster]\nendpoints=http://127.0.0.1:2379\nhost-id=h1\naddress=h1\n");
    g_autoptr(HostdConfig) plain = load_ok(f->file, NULL, NULL, NULL);
    assert_int_equal(plain->cluster->lease_ttl_s, HOSTD_CLUSTER_LEASE_TTL_DEFAULT);
    assert_null(plain->cluster->ca);
    assert_int_equal(plain->cluster->replicate, 0);

    static const struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"[cluster]\nhost-id=h1\naddress=h1\n", "endpoints"},
        {"[cluster]\nendpoints=\nhost-id=h1\naddress=h1\n", "endpoints"},
        {"[cluster]\nendpoints=127.0.0.1:2379\nhost-id=h1\naddress=h1\n", "127.0.0.1:2379"},
        {"[cluster]\nendpoints=http://a:1\naddress=h1\n", "host-id"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=H1\naddress=h1\n", "host-id"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=../h\naddress=h1\n", "host-id"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\n", "address"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=a b\n", "address"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nlease-ttl=1\n", "lease-ttl"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nlease-ttl=301\n", "lease-ttl"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nlease-ttl=x\n", "lease-ttl"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nreplicate=9\n", "replicate"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nreplicate=-1\n", "replicate"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nca=/no/such/ca.pem\n",
         "/no/such/ca.pem"},
        {"[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\nttl=3\n", "'ttl'"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        write_config(f, bad[i].text);
        g_autoptr(HostdConfig) refused = hostd_config_load(f->file, NULL, NULL, NULL, &error);
        if (refused != NULL)
            fail_msg("accepted: %s", bad[i].text);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        if (strstr(error->message, bad[i].needle) == NULL)
            fail_msg("'%s' does not name '%s'", error->message, bad[i].needle);
        g_clear_error(&error);
    }
    /* A certificate without its key. */
    g_autofree char *half =
        g_strdup_printf("[cluster]\nendpoints=http://a:1\nhost-id=h1\naddress=h1\ncert=%s\n", cert);
    write_config(f, half);
    assert_null(hostd_config_load(f->file, NULL, NULL, NULL, &error));
    assert_non_null(strstr(error->message, "cert and key"));
}

static void
test_missing_file(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;

    assert_null(hostd_config_load(f->file, "/srv/hostd", NULL, NULL, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
    assert_true(g_str_has_prefix(error->message, f->file));
}

static void
test_limits_accepted(void **state)
{
    Fixture *f = *state;

    write_config(f, "[hostd]\nssh-port-min=1024\nssh-port-max=65535\nboot-timeout=1h\n");
    g_autoptr(HostdConfig) c = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(c->ssh_port_min, 1024);
    assert_int_equal(c->ssh_port_max, 65535);
    assert_int_equal(c->boot_timeout_s, 3600);

    write_config(f, "[hostd]\nboot-timeout=1\n");
    g_autoptr(HostdConfig) d = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(d->boot_timeout_s, 1);

    /* Every key hostd(8) documents is one a file may set. */
    write_config(f, "[hostd]\nrequest-timeout=45s\n");
    g_autoptr(HostdConfig) e = load_ok(f->file, "/srv/hostd", NULL, NULL);
    assert_int_equal(e->request_timeout_s, 45);
}

static void
test_free_null(void **state)
{
    hostd_config_free(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cluster, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_state_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_templates_env, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relative_state_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_partial, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overrides, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits_accepted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_guest_api_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_listen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ksm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disk_limit_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_space_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_egress_upstream_ca_file, setup, teardown),
        cmocka_unit_test(test_free_null),
    };

    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
