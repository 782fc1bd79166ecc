/* hostd: the daemon that owns the agents' VMs, keys and state. See docs/ARCHITECTURE.md. */
#include <glib-unix.h>
#include <locale.h>
#include <malloc.h>
#include <stdio.h>
#include <unistd.h>

#include "hostd-modules.h"
#include "hostd-agent.h"
#include "hostd-cluster.h"
#include "hostd-fence.h"
#include "hostd-move.h"
#include "hostd-replica.h"
#include "hostd-template.h"
#include "hostd-config.h"
#include "hostd-confine.h"
#include "hostd-egress.h"
#include "hostd-guestfs.h"
#include "hostd-forward.h"
#include "hostd-guest-api.h"
#include "hostd-ksm.h"
#include "hostd-libvirt.h"
#include "hostd-log.h"
#include "hostd-metrics-server.h"
#include "hostd-notify.h"
#include "hostd-pool.h"
#include "hostd-power.h"
#include "hostd-reconcile.h"
#include "hostd-server.h"
#include "hostd-shutdown.h"
#include "hostd-state.h"
#include "hostd-supervise.h"
#include "vm-config.h"
#include "vm-error.h"
#include "vm-image.h"
#include "vm-util.h"

/* The fleet's periodic work on the cluster's thread: moves left half done, then replicas, both
 * from one read of the agents' records. */
static void
hostd_fleet_tick(gpointer data)
{
    HostdContext *ctx = data;
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, NULL);

    hostd_move_tick(ctx, records);
    hostd_replica_tick(ctx, records);
}

static void
hostd_log_message(const char *message)
{
    g_message("%s", message);
}

/* Tells systemd, when it started hostd (hostd.service, Type=notify), how far start-up or
 * shutdown is. A manager that cannot be told is worth a warning, not a failure: without
 * NOTIFY_SOCKET this does nothing. */
static void
hostd_tell_manager(const char *state, const char *status)
{
    g_autoptr(GError) error = NULL;

    if (!hostd_notify(state, status, &error))
        g_warning("%s", error->message);
}

/* --print-paths: the files from outside the state directory this hostd would run or read as
 * its own, so that an installation can be checked to use only its installed files. */
static void
hostd_print_paths(void)
{
    g_autofree char *templates = hostd_config_default_templates_dir();
    g_autofree char *helper = hostd_egress_helper_path();
    g_autoptr(GError) error = NULL;
    g_autofree char *script = vm_image_find_script(&error);

    printf("build-tree %s\n", vm_use_build_tree() ? "yes" : "no");
    printf("templates %s\n", templates);
    if (script != NULL)
        printf("image-script %s\n", script);
    else
        printf("image-script none (%s)\n", error->message);
    printf("egress-helper %s\n", helper);
    g_autofree char *guestfs_helper = hostd_guestfs_helper_path();
    printf("guestfs-helper %s\n", guestfs_helper);
    g_autofree char *ssh_worker = hostd_ssh_worker_path();
    printf("ssh-worker %s\n", ssh_worker);
    g_autofree char *guest_api_worker = hostd_guest_api_worker_path();
    printf("guest-api-worker %s\n", guest_api_worker);
}

static gboolean
hostd_quit(gpointer data)
{
    g_main_loop_quit(data);
    return G_SOURCE_REMOVE;
}

/* glibc gives each new thread an arena of its own, up to 8 a core, and hostd makes a thread for
 * each request: its free pages scatter over all of them, and its RSS climbs with the arenas, not
 * with what it holds (in the soak, with the default its heap went from 10 to 15 MiB in 15 busy
 * minutes; with two it stayed within 7-9 MiB for 10). hostd's work is waiting on guests and
 * libvirt, not allocating. */
#define HOSTD_MALLOC_ARENAS 2

/* How often hostd looks whether it went quiet after serving requests, and the longest it goes
 * without handing the heap's free pages back to the kernel. */
#define HOSTD_HEAP_QUIET_CHECK_S 2
#define HOSTD_HEAP_TRIM_MAX_S    60

/* An arena keeps the pages freed in it: untrimmed, a busy hostd's RSS stays at the high-water
 * mark of each arena (in the soak, its heap grew by about 1 MiB a minute, 12 to 18 MiB). Trimmed
 * when the requests stop, and at least each minute for the work of its own timers, it stays near
 * what it uses. A trim of hostd's heap takes well under a millisecond. */
static gboolean
hostd_trim_heap(gpointer data)
{
    static guint64 seen;
    static gint64 last;
    gint64 now = g_get_monotonic_time();

    if (!hostd_server_quiet_after_work(&seen) &&
        now - last < HOSTD_HEAP_TRIM_MAX_S * G_USEC_PER_SEC)
        return G_SOURCE_CONTINUE;
    last = now;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    return G_SOURCE_CONTINUE;
}

/* SIGTERM with shutdown = save: nothing restarts or answers any more, then every running agent
 * is saved, bounded by shutdown-timeout. */
static void
hostd_shutdown_save(HostdContext *ctx)
{
    g_autofree char *status =
        g_strdup_printf("saving the running agents (at most %us)", ctx->config->shutdown_timeout_s);
    hostd_tell_manager("STOPPING=1", status);
    g_message("%s", status);
    double seconds = 0;
    g_autoptr(GVariant) results =
        hostd_save_all(ctx, ctx->config->shutdown_timeout_s, "hostd is stopping", &seconds);
    guint saved = 0, total = (guint)g_variant_n_children(results);
    for (guint i = 0; i < total; i++) {
        g_autoptr(GVariant) one = g_variant_get_child_value(results, i);
        const char *name = NULL, *why = NULL;
        gboolean ok = FALSE;
        g_variant_lookup(one, "name", "&s", &name);
        g_variant_lookup(one, "saved", "b", &ok);
        if (ok)
            saved++;
        else if (g_variant_lookup(one, "error", "&s", &why))
            g_warning("agent '%s' not saved, left running: %s", name, why);
    }
    g_message("saved %u of %u running agents in %.1f s", saved, total, seconds);
}

int
main(int argc, char **argv)
{
    g_autofree char *config_path = NULL, *state_dir = NULL, *socket_path = NULL, *uri = NULL;
    g_autofree char *accel = NULL, *upstream_ca_file = NULL;
    gboolean version = FALSE, debug = FALSE, print_paths = FALSE;
    GOptionEntry entries[] = {
        {"config", 0, 0, G_OPTION_ARG_FILENAME, &config_path, "Configuration file", "FILE"},
        {"state-dir", 0, 0, G_OPTION_ARG_FILENAME, &state_dir, "State directory", "DIR"},
        {"socket", 0, 0, G_OPTION_ARG_FILENAME, &socket_path, "API socket", "PATH"},
        {"connect", 0, 0, G_OPTION_ARG_STRING, &uri,
         "libvirt URI (default: the embedded driver under the state dir)", "URI"},
        {"accel", 0, 0, G_OPTION_ARG_STRING, &accel,
         "auto (default): KVM when it works and beats TCG; kvm; tcg", "MODE"},
        {"egress-upstream-ca-file", 0, 0, G_OPTION_ARG_FILENAME, &upstream_ca_file,
         "CA file the egress proxies verify real hosts against when they intercept (default: the "
         "system's trust store)",
         "PATH"},
        {"debug", 0, 0, G_OPTION_ARG_NONE, &debug,
         "Also log read-only requests, and where each exec's time goes (a trace of its phases)",
         NULL},
        {"version", 0, 0, G_OPTION_ARG_NONE, &version, "Print the version", NULL},
        {"print-paths", 0, 0, G_OPTION_ARG_NONE, &print_paths,
         "Print the templates, image script and egress helper this hostd would use", NULL},
        {NULL},
    };
    g_autoptr(GOptionContext) opts = g_option_context_new("- the vmctl host daemon");
    g_autoptr(GError) error = NULL;

    /* First of all: hostd's memory holds every agent's keys and the secrets' values. */
    vm_process_undumpable();
#ifdef __GLIBC__
    /* Before any thread: see HOSTD_MALLOC_ARENAS. */
    mallopt(M_ARENA_MAX, HOSTD_MALLOC_ARENAS);
#endif
    setlocale(LC_ALL, "");
    g_log_set_default_handler(hostd_log_handler, GINT_TO_POINTER(STDERR_FILENO));
    g_option_context_add_main_entries(opts, entries, NULL);
    if (!g_option_context_parse(opts, &argc, &argv, &error)) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return 2;
    }
    if (version) {
        printf("hostd %s\n", VM_VERSION);
        return 0;
    }
    if (print_paths) {
        hostd_print_paths();
        return 0;
    }

    g_autoptr(HostdConfig) config =
        hostd_config_load(config_path, state_dir, socket_path, uri, &error);
    if (config == NULL) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    if (accel != NULL && !hostd_accel_mode_parse(accel, &config->accel)) {
        fprintf(stderr, "hostd: --accel must be auto, kvm or tcg\n");
        return 2;
    }
    if (upstream_ca_file != NULL &&
        !hostd_config_set_egress_upstream_ca_file(config, upstream_ca_file, &error)) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    g_autoptr(HostdState) state = hostd_state_open(config->state_dir, &error);
    if (state == NULL) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    g_message("state directory %s", config->state_dir);
    g_message("connecting to %s", config->uri);
    hostd_tell_manager(NULL, "connecting to libvirt, choosing the accelerator");
    g_autoptr(HostdLibvirt) lv = hostd_libvirt_open(config->uri, config->accel, &error);
    if (lv == NULL) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    g_message("accelerator: %s", lv->accel_summary);

    g_autoptr(HostdContext) ctx =
        hostd_context_new(g_steal_pointer(&config), g_steal_pointer(&state), g_steal_pointer(&lv));
    if (!ctx->config->ssh_in_process &&
        !hostd_context_use_ssh_workers(ctx, hostd_confine_ssh_worker_user, &error)) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    /* Before anything defines a domain: whether its QEMU gets an id of its own. */
    g_autofree char *confinement = hostd_confine_start(ctx);
    g_message("%s", confinement);
    hostd_modules_attach(ctx);
    hostd_tell_manager(NULL, "reconciling agents");
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    if (!hostd_reconcile(ctx, notes, &error)) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    for (guint i = 0; i < notes->len; i++)
        g_message("%s", (const char *)notes->pdata[i]);

    ctx->log = hostd_log_message;
    ctx->debug = debug;
    g_ptr_array_set_size(notes, 0);

    /* In a fleet: registered, kept alive and refreshed from a thread of its own, which retries
     * while etcd cannot be reached; requests only read ctx->cluster. Made before any agent is
     * woken, restored or restarted: an agent another host owns now is fenced first. */
    g_autoptr(HostdCluster) cluster = NULL;
    if (ctx->config->cluster != NULL) {
        cluster = hostd_cluster_new(ctx->config->cluster, ctx->config->state_dir, &error);
        if (cluster == NULL) {
            fprintf(stderr, "hostd: %s\n", error->message);
            return vm_error_exit_status(vm_error_code(error));
        }
        hostd_cluster_set_agents_func(cluster, hostd_agent_states, ctx);
        hostd_cluster_set_templates_func(cluster, hostd_template_names, ctx);
        hostd_cluster_set_fence_func(cluster, hostd_fence_from_cluster, ctx);
        hostd_cluster_set_tick_func(cluster, hostd_fleet_tick, ctx);
        hostd_cluster_set_log_func(cluster, hostd_log_message);
        ctx->cluster = cluster;
        hostd_tell_manager(NULL, "checking the fleet's owners of the agents");
        hostd_fence_startup(ctx, notes);
    }
    if (!hostd_power_start(ctx, notes, &error)) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    for (guint i = 0; i < notes->len; i++)
        g_message("%s", (const char *)notes->pdata[i]);
    hostd_tell_manager(NULL, "bringing back agents whose VM is gone");
    if (!hostd_supervise_start(ctx, &error)) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }

    /* The thread starts only now: the agents it reports are those the start-up left. */
    if (cluster != NULL) {
        hostd_cluster_start(cluster);
        g_message("fleet: host '%s' joins through etcd at %s", ctx->config->cluster->host_id,
                  ctx->config->cluster->endpoints[0]);
    }
    /* After the agents whose QEMU was gone are booted again: `auto` counts them now. */
    hostd_ksm_start(ctx, HOSTD_KSM_SYSFS);
    /* Last of the agents' machines: the warm pools fill behind everything else. */
    hostd_pool_start(ctx);

    HostdServer *server =
        hostd_server_start(ctx, ctx->config->socket_path, ctx->config->socket_group, &error);
    if (server == NULL) {
        fprintf(stderr, "hostd: %s\n", error->message);
        return vm_error_exit_status(vm_error_code(error));
    }
    g_message("listening on %s", ctx->config->socket_path);
    /* The socket listens and the accept thread serves it: a client connecting from now on is
     * answered, so the service manager may call hostd started. */
    g_autofree char *ready = g_strdup_printf("listening on %s", ctx->config->socket_path);
    hostd_tell_manager("READY=1", ready);

    /* An endpoint that cannot listen (its port taken by another hostd) costs the figures, not
     * the agents: hostd goes on without it. */
    HostdMetricsServer *metrics = NULL;
    if (!g_str_equal(ctx->config->metrics_listen, "off")) {
        g_autoptr(GError) metrics_error = NULL;

        metrics = hostd_metrics_server_start(ctx, ctx->config->metrics_listen, &metrics_error);
        if (metrics != NULL)
            g_message("metrics at %s", hostd_metrics_server_url(metrics));
        else
            g_message("no metrics endpoint: %s", metrics_error->message);
    }

    g_autoptr(GMainLoop) loop = g_main_loop_new(NULL, FALSE);
    g_unix_signal_add(SIGTERM, hostd_quit, loop);
    g_unix_signal_add(SIGINT, hostd_quit, loop);
    g_timeout_add_seconds(HOSTD_HEAP_QUIET_CHECK_S, hostd_trim_heap, NULL);
    g_main_loop_run(loop);

    /* Nothing is restarted and no request starts from here on. */
    hostd_supervise_stop(ctx);
    hostd_server_stop(server);
    hostd_metrics_server_stop(metrics);
    /* No request takes a machine any more: the waiting ones go, before any save. */
    hostd_pool_stop(ctx);
    /* A clean exit leaves the fleet at once rather than after the lease's TTL. */
    if (cluster != NULL)
        hostd_cluster_stop(cluster, TRUE);
    /* Before the saves: no guest asks for a checkpoint or restore while they run. */
    hostd_guest_api_stop(ctx);
    hostd_power_stop(ctx);
    /* No connection to a forwarded port may wake an agent the shutdown is saving. */
    hostd_forward_stop(ctx);
    if (hostd_config_shutdown_saves(ctx->config)) {
        hostd_shutdown_save(ctx);
    } else {
        /* Agents keep running: their QEMU processes do not belong to hostd. */
        hostd_tell_manager("STOPPING=1", "stopping; agents keep running");
        g_message("stopping; agents keep running");
    }
    /* Last: whatever runs now, KSM's run is put back as hostd found it. */
    hostd_ksm_stop(ctx);
    return 0;
}
