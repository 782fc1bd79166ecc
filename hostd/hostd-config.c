#include "hostd-config.h"

#include <errno.h>
#include <gio/gio.h>
#include <pwd.h>
#include <string.h>
#include <unistd.h>

#include "hostd-ids.h"
#include "hostd-libvirt.h"
#include "vm-config.h"
#include "vm-error.h"
#include "vm-fleet-records.h"
#include "vm-template.h"
#include "vm-util.h"

static const char *const hostd_config_keys[] = {
    "state-dir",
    "socket",
    "connect",
    "images-dir",
    "templates-dir",
    "socket-group",
    "ssh-port-min",
    "ssh-port-max",
    "forward-port-min",
    "forward-port-max",
    "boot-timeout",
    "request-timeout",
    "accel",
    "restart-limit",
    "restart-window",
    "shutdown",
    "shutdown-timeout",
    "shutdown-resume",
    "guest-api",
    "guest-api-rate",
    "guest-api-burst",
    "egress-upstream-ca-file",
    "egress-worker",
    "egress-user",
    "ssh-worker",
    "disk-read",
    "disk-write",
    "disk-read-iops",
    "disk-write-iops",
    "agent-ids",
    "worker-ids",
    "guest-checkpoint-max",
    "guest-checkpoint-bytes",
    "checkpoint-free-floor",
    "egress-presets-dir",
    "metrics-listen",
    "ksm",
    "pool",
    NULL,
};

static const char *const hostd_config_cluster_keys[] = {
    "endpoints", "host-id", "address", "ca", "cert", "key", "lease-ttl", "replicate", NULL,
};

/* The config keys of VmDiskLimit, in its order. */
static const char *const hostd_config_disk_keys[VM_DISK_LIMITS] = {
    [VM_DISK_READ_MIB] = "disk-read",
    [VM_DISK_WRITE_MIB] = "disk-write",
    [VM_DISK_READ_IOPS] = "disk-read-iops",
    [VM_DISK_WRITE_IOPS] = "disk-write-iops",
};

char *
hostd_config_default_templates_dir(void)
{
    const char *env = g_getenv("VM_TEMPLATES_DIR");
    if (env != NULL && env[0] != '\0')
        return g_strdup(env);
    return vm_shipped_templates_dir();
}

static gboolean
hostd_config_get_port(GKeyFile *kf, const char *path, const char *key, guint *value, GError **error)
{
    g_autoptr(GError) local_error = NULL;

    if (!g_key_file_has_key(kf, "hostd", key, NULL))
        return TRUE;
    gint v = g_key_file_get_integer(kf, "hostd", key, &local_error);
    if (local_error != NULL || v < 1024 || v > 65535)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s must be a port in 1024-65535",
                        path, key);
    *value = (guint)v;
    return TRUE;
}

/* A duration key (vm_duration_parse(): 90s, 5m) in [@min_s, @max_s], left as it is when absent. */
static gboolean
hostd_config_get_duration(GKeyFile *kf, const char *path, const char *key, guint min_s, guint max_s,
                          const char *bound, guint *value, GError **error)
{
    if (!g_key_file_has_key(kf, "hostd", key, NULL))
        return TRUE;
    g_autofree char *text = g_key_file_get_string(kf, "hostd", key, NULL);
    guint64 seconds = 0;
    if (text == NULL || !vm_duration_parse(text, &seconds, NULL) || seconds < min_s ||
        seconds > max_s)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s must be a duration %s", path, key,
                        bound);
    *value = (guint)seconds;
    return TRUE;
}

/* A whole number key in [@min, @max], left as it is when absent. */
static gboolean
hostd_config_get_number(GKeyFile *kf, const char *path, const char *key, gint min, gint max,
                        guint *value, GError **error)
{
    g_autoptr(GError) local_error = NULL;

    if (!g_key_file_has_key(kf, "hostd", key, NULL))
        return TRUE;
    gint v = g_key_file_get_integer(kf, "hostd", key, &local_error);
    if (local_error != NULL || v < min || v > max)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s must be a number in %d-%d", path,
                        key, min, max);
    *value = (guint)v;
    return TRUE;
}

/* A size: a whole number of bytes, or of KiB, MiB, GiB, TiB with K, M, G, T (a trailing "iB"
 * or "B" allowed); with @pct not NULL, "N%" (N in 0-50) sets *@pct and leaves *@bytes 0. */
static gboolean
hostd_config_parse_size(const char *text, guint64 *bytes, guint *pct)
{
    static const char units[] = "KMGT";
    char *end = NULL;
    guint64 n;
    guint shift = 0;

    if (text == NULL || !g_ascii_isdigit(text[0]))
        return FALSE;
    errno = 0;
    n = g_ascii_strtoull(text, &end, 10);
    if (errno != 0)
        return FALSE;
    if (pct != NULL && g_str_equal(end, "%")) {
        if (n > 50)
            return FALSE;
        *pct = (guint)n;
        *bytes = 0;
        return TRUE;
    }
    if (*end != '\0' && strchr(units, g_ascii_toupper(*end)) != NULL) {
        shift = 10 * (guint)(strchr(units, g_ascii_toupper(*end)) - units + 1);
        end++;
        if (g_str_equal(end, "iB") || g_str_equal(end, "B"))
            end += strlen(end);
    }
    if (*end != '\0' || n > (G_MAXUINT64 >> shift))
        return FALSE;
    *bytes = n << shift;
    if (pct != NULL)
        *pct = 0;
    return TRUE;
}

/* A size key (hostd_config_parse_size()) of at least @min bytes, left as it is when absent. */
static gboolean
hostd_config_get_size(GKeyFile *kf, const char *path, const char *key, guint64 min, guint64 *bytes,
                      guint *pct, GError **error)
{
    if (!g_key_file_has_key(kf, "hostd", key, NULL))
        return TRUE;
    g_autofree char *text = g_key_file_get_string(kf, "hostd", key, NULL);
    guint64 b = 0;
    guint p = 0;
    if (text == NULL || !hostd_config_parse_size(g_strstrip(text), &b, pct != NULL ? &p : NULL) ||
        (b < min && p == 0))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s must be a size (%s)", path, key,
                        pct != NULL ? "bytes, 512M, 2G, or a share of the filesystem such as 5%"
                                    : "bytes, 512M, 2G");
    *bytes = b;
    if (pct != NULL)
        *pct = p;
    return TRUE;
}

guint64
hostd_config_free_floor(const HostdConfig *config, guint64 size)
{
    guint64 share = size / 100 * config->checkpoint_free_floor_pct;

    if (config->checkpoint_free_floor_pct == 0)
        return config->checkpoint_free_floor;
    if (config->checkpoint_free_floor == 0)
        return share;
    return MIN(share, config->checkpoint_free_floor);
}

/* A key whose value is one of @choices (NULL-terminated); *@index is its position. */
static gboolean
hostd_config_get_choice(GKeyFile *kf, const char *path, const char *key, const char *const *choices,
                        guint *index, GError **error)
{
    if (!g_key_file_has_key(kf, "hostd", key, NULL))
        return TRUE;
    g_autofree char *text = g_key_file_get_string(kf, "hostd", key, NULL);
    for (guint i = 0; text != NULL && choices[i] != NULL; i++) {
        if (g_str_equal(text, choices[i])) {
            *index = i;
            return TRUE;
        }
    }
    g_autofree char *list = g_strjoinv(", ", (char **)choices);
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s must be one of %s", path, key, list);
}

/* A TLS file of [cluster]: made absolute, and readable now rather than at the first request. */
static gboolean
hostd_config_cluster_file(GKeyFile *kf, const char *path, const char *key, char **ret,
                          GError **error)
{
    if (!g_key_file_has_key(kf, "cluster", key, NULL))
        return TRUE;
    g_autofree char *value = g_key_file_get_string(kf, "cluster", key, NULL);
    if (value == NULL || value[0] == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: [cluster] %s is empty", path, key);
    g_autofree char *absolute = g_canonicalize_filename(value, NULL);
    if (!g_file_test(absolute, G_FILE_TEST_IS_REGULAR) || access(absolute, R_OK) < 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: [cluster] %s %s is not a readable file", path, key, absolute);
    *ret = g_steal_pointer(&absolute);
    return TRUE;
}

/* [cluster]: endpoints, host-id and address required; ca, cert and key optional (cert and key
 * together); lease-ttl in seconds; replicate, the copies of each checkpoint. */
static gboolean
hostd_config_load_cluster(HostdConfig *config, GKeyFile *kf, const char *path, GError **error)
{
    g_autoptr(HostdClusterConfig) c = g_new0(HostdClusterConfig, 1);
    g_autoptr(GError) local_error = NULL;

    g_auto(GStrv) keys = g_key_file_get_keys(kf, "cluster", NULL, NULL);
    for (char **k = keys; keys != NULL && *k != NULL; k++) {
        if (!g_strv_contains(hostd_config_cluster_keys, *k))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: unknown key '%s' in [cluster]",
                            path, *k);
    }
    gsize n = 0;
    c->endpoints = g_key_file_get_string_list(kf, "cluster", "endpoints", &n, NULL);
    if (c->endpoints == NULL || n == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: [cluster] needs endpoints (etcd's client URLs, separated by ';')",
                        path);
    if (n > 16)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: [cluster] has over 16 endpoints",
                        path);
    for (gsize i = 0; i < n; i++) {
        g_strstrip(c->endpoints[i]);
        if (!g_str_has_prefix(c->endpoints[i], "http://") &&
            !g_str_has_prefix(c->endpoints[i], "https://"))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: [cluster] endpoint '%s' is not http://HOST:PORT or "
                            "https://HOST:PORT",
                            path, c->endpoints[i]);
    }
    c->host_id = g_key_file_get_string(kf, "cluster", "host-id", NULL);
    if (c->host_id == NULL || !vm_fleet_host_id_valid(c->host_id))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: [cluster] host-id must be set: [a-z0-9] then [a-z0-9.-], at most %d "
                        "characters",
                        path, VM_FLEET_HOST_ID_MAX);
    c->address = g_key_file_get_string(kf, "cluster", "address", NULL);
    if (c->address == NULL || !vm_fleet_address_valid(c->address))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: [cluster] address must be set: how other hosts reach this one "
                        "(ssh://[USER@]HOST[:PORT], as vmctl --host takes it)",
                        path);
    if (!hostd_config_cluster_file(kf, path, "ca", &c->ca, error) ||
        !hostd_config_cluster_file(kf, path, "cert", &c->cert, error) ||
        !hostd_config_cluster_file(kf, path, "key", &c->key, error))
        return FALSE;
    if ((c->cert == NULL) != (c->key == NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: [cluster] cert and key go together",
                        path);
    c->lease_ttl_s = HOSTD_CLUSTER_LEASE_TTL_DEFAULT;
    if (g_key_file_has_key(kf, "cluster", "lease-ttl", NULL)) {
        gint v = g_key_file_get_integer(kf, "cluster", "lease-ttl", &local_error);
        if (local_error != NULL || v < HOSTD_CLUSTER_LEASE_TTL_MIN ||
            v > HOSTD_CLUSTER_LEASE_TTL_MAX)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: [cluster] lease-ttl must be %d to %d seconds", path,
                            HOSTD_CLUSTER_LEASE_TTL_MIN, HOSTD_CLUSTER_LEASE_TTL_MAX);
        c->lease_ttl_s = (guint)v;
    }
    if (g_key_file_has_key(kf, "cluster", "replicate", NULL)) {
        gint v = g_key_file_get_integer(kf, "cluster", "replicate", &local_error);
        if (local_error != NULL || v < 0 || v > HOSTD_CLUSTER_REPLICATE_MAX)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: [cluster] replicate must be 0 to %d other hosts", path,
                            HOSTD_CLUSTER_REPLICATE_MAX);
        c->replicate = (guint)v;
    }
    hostd_cluster_config_free(config->cluster);
    config->cluster = g_steal_pointer(&c);
    return TRUE;
}

void
hostd_cluster_config_free(HostdClusterConfig *cluster)
{
    if (cluster == NULL)
        return;
    g_strfreev(cluster->endpoints);
    g_free(cluster->host_id);
    g_free(cluster->address);
    g_free(cluster->ca);
    g_free(cluster->cert);
    g_free(cluster->key);
    g_free(cluster);
}

static gboolean
hostd_config_load_file(HostdConfig *config, const char *path, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) local_error = NULL;

    if (!g_key_file_load_from_file(kf, path, G_KEY_FILE_NONE, &local_error))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path, local_error->message);

    g_auto(GStrv) groups = g_key_file_get_groups(kf, NULL);
    for (char **g = groups; *g != NULL; g++) {
        if (!g_str_equal(*g, "hostd") && !g_str_equal(*g, "cluster"))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: unknown group [%s]", path, *g);
    }
    g_auto(GStrv) keys = g_key_file_get_keys(kf, "hostd", NULL, NULL);
    for (char **k = keys; keys != NULL && *k != NULL; k++) {
        if (!g_strv_contains(hostd_config_keys, *k))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: unknown key '%s'", path, *k);
    }
    if (g_key_file_has_group(kf, "cluster") && !hostd_config_load_cluster(config, kf, path, error))
        return FALSE;

    struct {
        const char *key;
        char **field;
    } strings[] = {
        {"state-dir", &config->state_dir},
        {"socket", &config->socket_path},
        {"connect", &config->uri},
        {"images-dir", &config->images_dir},
        {"templates-dir", &config->templates_dir},
        {"socket-group", &config->socket_group},
        {"egress-presets-dir", &config->egress_presets_dir},
        {"metrics-listen", &config->metrics_listen},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(strings); i++) {
        if (!g_key_file_has_key(kf, "hostd", strings[i].key, NULL))
            continue;
        char *value = g_key_file_get_string(kf, "hostd", strings[i].key, &local_error);
        if (value == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s: %s", path, strings[i].key,
                            local_error->message);
        /* An empty value would silently mean the current directory, or libvirt's default
         * URI, rather than the default hostd documents. */
        if (value[0] == '\0') {
            g_free(value);
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s must not be empty", path,
                            strings[i].key);
        }
        g_free(*strings[i].field);
        *strings[i].field = value;
    }
    if (!hostd_config_get_port(kf, path, "ssh-port-min", &config->ssh_port_min, error) ||
        !hostd_config_get_port(kf, path, "ssh-port-max", &config->ssh_port_max, error))
        return FALSE;
    if (config->ssh_port_min > config->ssh_port_max)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: ssh-port-min %u is above ssh-port-max %u", path, config->ssh_port_min,
                        config->ssh_port_max);
    if (!hostd_config_get_port(kf, path, "forward-port-min", &config->forward_port_min, error) ||
        !hostd_config_get_port(kf, path, "forward-port-max", &config->forward_port_max, error))
        return FALSE;
    if (config->forward_port_min > config->forward_port_max)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: forward-port-min %u is above forward-port-max %u", path,
                        config->forward_port_min, config->forward_port_max);
    if (!hostd_config_get_duration(kf, path, "boot-timeout", 1, 3600, "up to 1h",
                                   &config->boot_timeout_s, error) ||
        !hostd_config_get_duration(kf, path, "request-timeout", 1, 600, "up to 10m",
                                   &config->request_timeout_s, error) ||
        !hostd_config_get_duration(kf, path, "restart-window", 1, 7 * 24 * 3600, "up to 7d",
                                   &config->restart_window_s, error) ||
        !hostd_config_get_duration(kf, path, "shutdown-timeout", 1, 3600, "up to 1h",
                                   &config->shutdown_timeout_s, error))
        return FALSE;
    if (g_key_file_has_key(kf, "hostd", "restart-limit", NULL)) {
        gint v = g_key_file_get_integer(kf, "hostd", "restart-limit", &local_error);
        if (local_error != NULL || v < 0 || v > 1000)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: restart-limit must be a number in 0-1000", path);
        config->restart_limit = (guint)v;
    }
    static const char *const shutdown_modes[] = {"auto", "keep", "save", NULL};
    static const char *const resume_modes[] = {"lazy", "eager", NULL};
    guint shutdown = config->shutdown, resume = config->shutdown_resume_eager ? 1 : 0;
    if (!hostd_config_get_choice(kf, path, "shutdown", shutdown_modes, &shutdown, error) ||
        !hostd_config_get_choice(kf, path, "shutdown-resume", resume_modes, &resume, error))
        return FALSE;
    config->shutdown = (HostdShutdownMode)shutdown;
    config->shutdown_resume_eager = resume == 1;
    static const char *const on_off[] = {"off", "on", NULL};
    guint guest_api = config->guest_api ? 1 : 0;
    if (!hostd_config_get_choice(kf, path, "guest-api", on_off, &guest_api, error) ||
        !hostd_config_get_number(kf, path, "guest-api-rate", 1, 1000, &config->guest_api_rate,
                                 error) ||
        !hostd_config_get_number(kf, path, "guest-api-burst", 1, 10000, &config->guest_api_burst,
                                 error))
        return FALSE;
    config->guest_api = guest_api == 1;
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        if (!hostd_config_get_number(kf, path, hostd_config_disk_keys[i], 0, VM_DISK_LIMIT_MAX,
                                     &config->disk_limits[i], error))
            return FALSE;
    }
    if (!hostd_config_get_number(kf, path, "pool", 0, VM_TEMPLATE_POOL_MAX, &config->pool, error))
        return FALSE;
    guint egress_worker = config->egress_in_process ? 0 : 1;
    if (!hostd_config_get_choice(kf, path, "egress-worker", on_off, &egress_worker, error))
        return FALSE;
    config->egress_in_process = egress_worker == 0;
    guint ssh_worker = config->ssh_in_process ? 0 : 1;
    if (!hostd_config_get_choice(kf, path, "ssh-worker", on_off, &ssh_worker, error))
        return FALSE;
    config->ssh_in_process = ssh_worker == 0;
    if (g_key_file_has_key(kf, "hostd", "egress-user", NULL)) {
        g_autofree char *user = g_key_file_get_string(kf, "hostd", "egress-user", NULL);

        /* Resolved (getpwnam()) when a worker starts: the user may come after hostd's
         * configuration, and a worker that cannot have it does not start. */
        if (user == NULL || user[0] == '\0' || strchr(user, ':') != NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: egress-user must be a user name",
                            path);
        g_free(config->egress_user);
        config->egress_user = g_steal_pointer(&user);
    }
    if (!hostd_config_get_number(kf, path, "guest-checkpoint-max", 0, 10000,
                                 &config->guest_checkpoint_max, error) ||
        !hostd_config_get_size(kf, path, "guest-checkpoint-bytes", 0,
                               &config->guest_checkpoint_bytes, NULL, error) ||
        !hostd_config_get_size(kf, path, "checkpoint-free-floor", 0, &config->checkpoint_free_floor,
                               &config->checkpoint_free_floor_pct, error))
        return FALSE;
    if (g_key_file_has_key(kf, "hostd", "agent-ids", NULL)) {
        g_autofree char *ids = g_key_file_get_string(kf, "hostd", "agent-ids", NULL);
        g_autoptr(GError) ids_error = NULL;

        if (ids == NULL || !hostd_config_parse_agent_ids(g_strstrip(ids), &config->agent_id_min,
                                                         &config->agent_id_max, &ids_error))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path,
                            ids_error != NULL ? ids_error->message
                                              : "agent-ids must be MIN-MAX or off");
    }
    if (g_key_file_has_key(kf, "hostd", "worker-ids", NULL)) {
        g_autofree char *ids = g_key_file_get_string(kf, "hostd", "worker-ids", NULL);
        g_autoptr(GError) ids_error = NULL;

        if (ids == NULL ||
            !hostd_config_parse_ids("worker-ids", g_strstrip(ids), &config->worker_id_min,
                                    &config->worker_id_max, &ids_error))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path,
                            ids_error != NULL ? ids_error->message
                                              : "worker-ids must be MIN-MAX or off");
    }
    if (g_key_file_has_key(kf, "hostd", "egress-upstream-ca-file", NULL)) {
        g_autofree char *ca_file =
            g_key_file_get_string(kf, "hostd", "egress-upstream-ca-file", NULL);
        g_autoptr(GError) ca_error = NULL;

        if (ca_file == NULL || ca_file[0] == '\0')
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: egress-upstream-ca-file must not be empty", path);
        if (!hostd_config_set_egress_upstream_ca_file(config, ca_file, &ca_error))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path, ca_error->message);
    }
    static const char *const ksm_modes[] = {"auto", "on", "off", NULL};
    guint ksm = config->ksm;
    if (!hostd_config_get_choice(kf, path, "ksm", ksm_modes, &ksm, error))
        return FALSE;
    config->ksm = (HostdKsmMode)ksm;
    if (g_key_file_has_key(kf, "hostd", "accel", NULL)) {
        g_autofree char *text = g_key_file_get_string(kf, "hostd", "accel", NULL);
        if (text == NULL || !hostd_accel_mode_parse(text, &config->accel))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: accel must be auto, kvm or tcg",
                            path);
    }
    return TRUE;
}

/* worker-ids: as given, or right after agent-ids' range (the default one where agent-ids is
 * off) and thrice its size. An agent's workers take the ids of its slot in it (hostd-confine.h):
 * with agent ids on, the slot of an agent with an id is its place in agent-ids, so worker-ids
 * must hold three ids per agent id (SSH, egress, in-guest API), and none of an agent or a user
 * of the host. */
static gboolean
hostd_config_place_worker_ids(HostdConfig *config, const char *path, GError **error)
{
    gboolean ids_off = config->agent_id_min == 0;
    guint agent_min = ids_off ? HOSTD_AGENT_ID_MIN : config->agent_id_min;
    guint agent_max = ids_off ? HOSTD_AGENT_ID_MAX : config->agent_id_max;
    guint64 agents = (guint64)agent_max - agent_min + 1;
    g_autoptr(GError) local_error = NULL;

    if (config->worker_id_min == G_MAXUINT) {
        if ((guint64)agent_max + HOSTD_IDS_WORKER_KINDS * agents > G_MAXINT32)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: agent-ids %u-%u leaves no room for worker-ids after it (ids up "
                            "to %d): set worker-ids",
                            path, agent_min, agent_max, G_MAXINT32);
        config->worker_id_min = agent_max + 1;
        config->worker_id_max = (guint)(agent_max + HOSTD_IDS_WORKER_KINDS * agents);
    }
    if (config->worker_id_min == 0)
        return TRUE;
    if ((guint64)config->worker_id_max - config->worker_id_min + 1 <
        (ids_off ? 1 : agents) * HOSTD_IDS_WORKER_KINDS)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: worker-ids %u-%u must hold three ids (an SSH, an egress and an "
                        "in-guest API worker's) for each id of agent-ids %u-%u",
                        path, config->worker_id_min, config->worker_id_max, agent_min, agent_max);
    if (!ids_off && config->worker_id_min <= agent_max && agent_min <= config->worker_id_max)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s: worker-ids %u-%u overlaps agent-ids %u-%u: a worker would run as "
                        "an agent's QEMU",
                        path, config->worker_id_min, config->worker_id_max, agent_min, agent_max);
    if (!hostd_ids_range_check_free("worker-ids", config->worker_id_min, config->worker_id_max,
                                    &local_error))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path, local_error->message);
    return TRUE;
}

HostdConfig *
hostd_config_load(const char *path, const char *state_dir, const char *socket_path, const char *uri,
                  GError **error)
{
    g_autoptr(HostdConfig) config = g_new0(HostdConfig, 1);

    config->ssh_port_min = 42200;
    config->ssh_port_max = 42999;
    config->forward_port_min = 43000;
    config->forward_port_max = 43999;
    config->boot_timeout_s = 300;
    config->request_timeout_s = 30;
    config->restart_limit = 3;
    config->restart_window_s = 600;
    config->shutdown = HOSTD_SHUTDOWN_AUTO;
    config->shutdown_timeout_s = 90;
    config->guest_api = TRUE;
    config->guest_api_rate = 5;
    config->guest_api_burst = 20;
    /* Enough for a guest's own work, and a share of a host's disk that leaves the rest of it to
     * the other agents and hostd (an SSD does several times this). */
    config->disk_limits[VM_DISK_READ_MIB] = HOSTD_DISK_READ_MIB_DEFAULT;
    config->disk_limits[VM_DISK_WRITE_MIB] = HOSTD_DISK_WRITE_MIB_DEFAULT;
    config->disk_limits[VM_DISK_READ_IOPS] = HOSTD_DISK_READ_IOPS_DEFAULT;
    config->disk_limits[VM_DISK_WRITE_IOPS] = HOSTD_DISK_WRITE_IOPS_DEFAULT;
    config->agent_id_min = HOSTD_AGENT_ID_MIN;
    config->agent_id_max = HOSTD_AGENT_ID_MAX;
    /* Not given: placed after agent-ids once the file is read. */
    config->worker_id_min = G_MAXUINT;
    config->worker_id_max = G_MAXUINT;
    config->guest_checkpoint_max = HOSTD_GUEST_CHECKPOINT_MAX_DEFAULT;
    config->guest_checkpoint_bytes = HOSTD_GUEST_CHECKPOINT_BYTES_DEFAULT;
    config->checkpoint_free_floor = HOSTD_CHECKPOINT_FREE_FLOOR_DEFAULT;
    config->checkpoint_free_floor_pct = HOSTD_CHECKPOINT_FREE_FLOOR_PCT;

    if (path != NULL && !hostd_config_load_file(config, path, error))
        return NULL;
    if (!hostd_config_place_worker_ids(config, path != NULL ? path : "hostd.conf", error))
        return NULL;

    if (state_dir != NULL) {
        g_free(config->state_dir);
        config->state_dir = g_strdup(state_dir);
    }
    if (socket_path != NULL) {
        g_free(config->socket_path);
        config->socket_path = g_strdup(socket_path);
    }
    if (uri != NULL) {
        g_free(config->uri);
        config->uri = g_strdup(uri);
    }

    if (config->state_dir == NULL)
        config->state_dir = vm_default_state_dir();
    if (!g_path_is_absolute(config->state_dir)) {
        g_autofree char *cwd = g_get_current_dir();
        char *abs = g_build_filename(cwd, config->state_dir, NULL);
        g_free(config->state_dir);
        config->state_dir = abs;
    }
    if (config->socket_path == NULL)
        config->socket_path = g_build_filename(config->state_dir, "hostd.sock", NULL);
    if (config->uri == NULL)
        config->uri = hostd_libvirt_default_uri(config->state_dir);
    if (config->images_dir == NULL)
        config->images_dir = g_build_filename(config->state_dir, "images", NULL);
    if (config->templates_dir == NULL)
        config->templates_dir = hostd_config_default_templates_dir();
    /* The presets live beside the configuration: the administrator's, as the file is. */
    if (config->egress_presets_dir == NULL && path != NULL) {
        g_autofree char *config_dir = g_path_get_dirname(path);
        config->egress_presets_dir = g_build_filename(config_dir, "presets.d", NULL);
    }
    config->egress_presets = hostd_egress_presets_load(config->egress_presets_dir, error);
    if (config->egress_presets == NULL)
        return NULL;
    if (config->metrics_listen == NULL)
        config->metrics_listen = g_strdup(HOSTD_METRICS_LISTEN_DEFAULT);
    if (!hostd_config_metrics_listen_valid(config->metrics_listen)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "%s: metrics-listen: '%s' is not off, HOST:PORT or an absolute path",
                 path != NULL ? path : "hostd", config->metrics_listen);
        return NULL;
    }
    return g_steal_pointer(&config);
}

gboolean
hostd_config_metrics_listen_valid(const char *value)
{
    g_autoptr(GSocketConnectable) address = NULL;
    g_autoptr(GInetAddress) inet = NULL;
    const char *port = strrchr(value, ':');
    const char *host;

    if (g_str_equal(value, "off") || g_path_is_absolute(value))
        return TRUE;
    /* A port number (no service name looked up) and an address (no name resolved). */
    if (port == NULL || port[1] == '\0' || strspn(port + 1, "0123456789") != strlen(port + 1))
        return FALSE;
    address = g_network_address_parse(value, 0, NULL);
    if (address == NULL || g_network_address_get_port(G_NETWORK_ADDRESS(address)) == 0)
        return FALSE;
    host = g_network_address_get_hostname(G_NETWORK_ADDRESS(address));
    inet = g_inet_address_new_from_string(host);
    return inet != NULL || g_str_equal(host, "localhost");
}

gboolean
hostd_config_parse_agent_ids(const char *text, guint *ret_min, guint *ret_max, GError **error)
{
    return hostd_config_parse_ids("agent-ids", text, ret_min, ret_max, error);
}

gboolean
hostd_config_parse_ids(const char *key, const char *text, guint *ret_min, guint *ret_max,
                       GError **error)
{
    g_auto(GStrv) parts = NULL;
    guint64 min = 0, max = 0;

    if (g_str_equal(text, "off")) {
        *ret_min = 0;
        *ret_max = 0;
        return TRUE;
    }
    /* Ids below 1000 are the system's own users; 2^31 and above read as negative in places. */
    parts = g_strsplit(text, "-", -1);
    if (g_strv_length(parts) != 2 ||
        !g_ascii_string_to_unsigned(parts[0], 10, 1000, G_MAXINT32, &min, NULL) ||
        !g_ascii_string_to_unsigned(parts[1], 10, 1000, G_MAXINT32, &max, NULL) || min > max)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s must be MIN-MAX (ids from 1000 to %d, MIN not above MAX) or off, "
                        "not '%s'",
                        key, G_MAXINT32, text);
    *ret_min = (guint)min;
    *ret_max = (guint)max;
    return TRUE;
}

gboolean
hostd_config_set_egress_upstream_ca_file(HostdConfig *config, const char *path, GError **error)
{
    g_autofree char *absolute = NULL;
    g_autofree char *contents = NULL;
    g_autoptr(GError) local_error = NULL;

    if (!g_path_is_absolute(path)) {
        g_autofree char *cwd = g_get_current_dir();

        absolute = g_build_filename(cwd, path, NULL);
    } else {
        absolute = g_strdup(path);
    }
    /* Read once, as the proxies will: a directory, a missing file or one hostd may not read is
     * refused now rather than at the first intercepted request. */
    if (!g_file_test(absolute, G_FILE_TEST_IS_REGULAR))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress-upstream-ca-file %s is not a readable file", absolute);
    if (!g_file_get_contents(absolute, &contents, NULL, &local_error))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress-upstream-ca-file %s cannot be read: %s", absolute,
                        local_error->message);
    g_free(config->egress_upstream_ca_file);
    config->egress_upstream_ca_file = g_steal_pointer(&absolute);
    return TRUE;
}

gboolean
hostd_config_shutdown_saves(const HostdConfig *config)
{
    /* A service manager stops hostd when the host goes down; a person's Ctrl-C must not cost a
     * save of every agent. */
    if (config->shutdown == HOSTD_SHUTDOWN_AUTO)
        return g_getenv("NOTIFY_SOCKET") != NULL;
    return config->shutdown == HOSTD_SHUTDOWN_SAVE;
}

void
hostd_config_free(HostdConfig *config)
{
    if (config == NULL)
        return;
    g_free(config->state_dir);
    g_free(config->socket_path);
    g_free(config->uri);
    g_free(config->images_dir);
    g_free(config->templates_dir);
    g_free(config->socket_group);
    g_free(config->metrics_listen);
    hostd_cluster_config_free(config->cluster);
    g_free(config->egress_upstream_ca_file);
    g_free(config->egress_user);
    g_free(config->egress_presets_dir);
    hostd_egress_presets_free(config->egress_presets);
    g_free(config);
}

gboolean
hostd_config_worker_user(const HostdConfig *config, gboolean *ret_change, uid_t *ret_uid,
                         gid_t *ret_gid, GError **error)
{
    const char *user = config->egress_user != NULL ? config->egress_user : "nobody";
    struct passwd pwd;
    struct passwd *found = NULL;
    char buf[4096];
    int rc;

    *ret_change = FALSE;
    *ret_uid = 0;
    *ret_gid = 0;
    if (geteuid() != 0)
        return TRUE;
    rc = getpwnam_r(user, &pwd, buf, sizeof(buf), &found);
    if (found == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "egress-user '%s' is unknown%s%s", user,
                        rc != 0 ? ": " : "", rc != 0 ? g_strerror(rc) : "");
    if (pwd.pw_uid == 0 || pwd.pw_gid == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "egress-user '%s' is root or in root's group", user);
    *ret_change = TRUE;
    *ret_uid = pwd.pw_uid;
    *ret_gid = pwd.pw_gid;
    return TRUE;
}
