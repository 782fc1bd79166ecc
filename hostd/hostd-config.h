/* hostd's configuration: an optional key file, overridden by command-line options. */
#pragma once

#include <glib.h>

#include "hostd-accel.h"
#include "hostd-egress-presets.h"
#include "vm-domain.h"
#include "vm-protocol.h"

G_BEGIN_DECLS

/* What hostd does with running agents when it is told to stop (SIGTERM). */
typedef enum {
    HOSTD_SHUTDOWN_AUTO, /* save under a service manager ($NOTIFY_SOCKET), keep otherwise */
    HOSTD_SHUTDOWN_KEEP, /* leave them running: the next hostd reconnects to them */
    HOSTD_SHUTDOWN_SAVE, /* save each to disk (processes and all) before exiting */
} HostdShutdownMode;

/* What hostd does with the kernel's same-page merging (hostd-ksm.h). */
typedef enum {
    HOSTD_KSM_AUTO, /* on while at least one agent runs */
    HOSTD_KSM_ON,   /* on from hostd's start */
    HOSTD_KSM_OFF,  /* never touched */
} HostdKsmMode;

/* The default disk I/O limits of an agent (hostd.conf disk-read...). */
#define HOSTD_DISK_READ_MIB_DEFAULT   200
#define HOSTD_DISK_WRITE_MIB_DEFAULT  100
#define HOSTD_DISK_READ_IOPS_DEFAULT  2000
#define HOSTD_DISK_WRITE_IOPS_DEFAULT 1000

/* [cluster]: this host in a fleet whose records live in etcd (docs/CLUSTER.md). */
typedef struct {
    char **endpoints; /* etcd client URLs, tried in turn */
    char *host_id;    /* this host's id in the fleet (vm_fleet_host_id_valid()) */
    char *address;    /* how another host reaches this one: what `--host ssh://` would use */
    char *ca;         /* optional TLS: the CA the members' certificates are checked against */
    char *cert;       /* and this host's client certificate and key (both or neither) */
    char *key;
    guint lease_ttl_s; /* the host's record goes this long after its last keepalive */
    guint replicate;   /* each checkpoint of an agent copied to this many other hosts */
} HostdClusterConfig;

#define HOSTD_CLUSTER_LEASE_TTL_DEFAULT 10
#define HOSTD_CLUSTER_LEASE_TTL_MIN     2
#define HOSTD_CLUSTER_LEASE_TTL_MAX     300
#define HOSTD_CLUSTER_REPLICATE_MAX     VM_REPLICAS_MAX

void hostd_cluster_config_free(HostdClusterConfig *cluster);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdClusterConfig, hostd_cluster_config_free)

typedef struct {
    char *state_dir;     /* agents/, images/, libvirt/ live here */
    char *socket_path;   /* default <state_dir>/hostd.sock */
    char *uri;           /* default qemu:///embed?root=<state_dir>/libvirt */
    char *images_dir;    /* default <state_dir>/images */
    char *templates_dir; /* default: the shipped templates */
    char *socket_group;  /* when set: socket mode 0660 with this group; else 0600 */
    guint ssh_port_min;  /* forwarded SSH ports are taken from this range */
    guint ssh_port_max;
    guint forward_port_min; /* vmctl forward takes host ports from this range when not given */
    guint forward_port_max;
    guint boot_timeout_s;    /* how long new/start wait for SSH */
    guint request_timeout_s; /* how long a client may take to send its whole request */
    HostdAccelMode accel;    /* default auto (hostd-accel.h) */
    guint restart_limit;     /* crashes restarted within restart_window_s before giving up */
    guint restart_window_s;
    HostdShutdownMode shutdown;
    guint shutdown_timeout_s;       /* the bound on saving every agent at shutdown */
    gboolean shutdown_resume_eager; /* agents saved by a shutdown resume at the next start */
    gboolean guest_api;             /* each agent's in-guest API (docs/GUEST-API.md); default on */
    guint guest_api_rate;           /* its requests per second per agent, on average */
    guint guest_api_burst;          /* and at once, beyond the average */
    char *egress_upstream_ca_file;  /* the CA file proxies verify real hosts against when they
                                     * intercept (the credential broker); NULL: the system's */
    gboolean egress_in_process;     /* egress-worker = off: proxies run inside hostd (default:
                                     * each in a confined vm-egress-worker process) */
    char *egress_user;              /* the user egress workers run as; NULL: "nobody" */
    gboolean ssh_in_process;        /* ssh-worker = off: hostd's SSH client runs inside hostd
                                     * (default: each agent's in a confined vm-ssh-worker) */
    guint disk_limits[VM_DISK_LIMITS]; /* VmDiskLimit: an agent's disk I/O limits where neither
                                        * `new` nor its template sets one; 0: no limit */
    guint agent_id_min;                /* agent-ids: each agent's QEMU runs as a uid (and gid) of */
    guint agent_id_max;                /* its own from this range; both 0: agent-ids = off */
    guint worker_id_min;               /* worker-ids: each agent's SSH and egress workers run as */
    guint worker_id_max;               /* ids of their own from this range (hostd-confine.h); both
                                        * 0: worker-ids = off, workers run as egress-user */
    guint guest_checkpoint_max;        /* checkpoints an agent may have for its guest to ask */
    guint64 guest_checkpoint_bytes;    /* for one more; and bytes they may take (images, memory) */
    guint64 checkpoint_free_floor;     /* free bytes no checkpoint takes the state dir's file */
    guint checkpoint_free_floor_pct;   /* system below, or this % of its size; both set: the less */
    char *egress_presets_dir;          /* the user's egress presets (NAME.conf); default: presets.d
                                        * beside the configuration file, none without one */
    HostdEgressPresets *egress_presets; /* the built-in presets and those of egress_presets_dir */
    /* The Prometheus endpoint: "HOST:PORT", an absolute path (a Unix socket), or "off". */
    char *metrics_listen;
    HostdClusterConfig *cluster; /* [cluster]; NULL without one: this host is in no fleet */
    HostdKsmMode ksm;            /* default auto */
    guint pool;                  /* each template's warm pool where its `pool:` says nothing */
} HostdConfig;

/* Defaults of guest-checkpoint-max, guest-checkpoint-bytes and checkpoint-free-floor (5% of
 * the filesystem, at most 2 GiB). */
#define HOSTD_GUEST_CHECKPOINT_MAX_DEFAULT   64
#define HOSTD_GUEST_CHECKPOINT_BYTES_DEFAULT (32ULL << 30)
#define HOSTD_CHECKPOINT_FREE_FLOOR_DEFAULT  (2ULL << 30)
#define HOSTD_CHECKPOINT_FREE_FLOOR_PCT      5

/* The free-space floor of @config on a filesystem of @size bytes. Can't fail. */
guint64 hostd_config_free_floor(const HostdConfig *config, guint64 size);

/* The default agent-ids range: above the ranges systemd gives to containers (524288-1879048191)
 * and to subordinate ids (useradd's /etc/subuid ends at 600100000), below 2^31, so no user or
 * container of the host has any of these ids. */
#define HOSTD_AGENT_ID_MIN 1879048192u
#define HOSTD_AGENT_ID_MAX 1879113727u

/* Where hostd serves its Prometheus text when metrics-listen is not set: loopback only. */
#define HOSTD_METRICS_LISTEN_DEFAULT "127.0.0.1:9464"

/* Whether @value is a metrics-listen hostd takes: "off", an absolute path (a Unix socket) or
 * ADDRESS:PORT ("[ADDRESS]:PORT" for IPv6; "localhost" for 127.0.0.1) with a port number in
 * 1..65535. Can't fail. */
gboolean hostd_config_metrics_listen_valid(const char *value);

/* Loads @path (a GKeyFile with a [hostd] group: state-dir, socket, connect, images-dir,
 * templates-dir, socket-group, ssh-port-min, ssh-port-max, forward-port-min, forward-port-max,
 * boot-timeout, request-timeout, accel, restart-limit, restart-window, shutdown,
 * shutdown-timeout, shutdown-resume, guest-api, guest-api-rate, guest-api-burst,
 * egress-upstream-ca-file, egress-worker, egress-user, disk-read, disk-write, disk-read-iops,
 * disk-write-iops, agent-ids, worker-ids, guest-checkpoint-max, guest-checkpoint-bytes,
 * checkpoint-free-floor, egress-presets-dir, metrics-listen, ksm) and an optional [cluster] group
 * (endpoints, host-id, address, ca, cert, key, lease-ttl: endpoints, host-id and address
 * required there) when not NULL,
 * then applies the non-NULL overrides, then fills defaults (worker-ids: the ids right after
 * agent-ids', thrice as many), then loads the egress presets (hostd_egress_presets_load()).
 * Unknown keys and bad values fail with VM_ERROR_INVALID_ARGUMENT
 * "FILE: ...", as does a worker-ids range that overlaps agent-ids', holds fewer than three ids per
 * agent id, or holds the id of a user or group of the host, and a bad preset file (hostd does not
 * start with a preset it cannot honour). */
HostdConfig *hostd_config_load(const char *path, const char *state_dir, const char *socket_path,
                               const char *uri, GError **error);

/* Sets @config's egress-upstream-ca-file to @path (made absolute), which must be a readable
 * regular file: a CA file that cannot be read would make every intercepted request fail much
 * later, so it is refused at start. Fails with VM_ERROR_INVALID_ARGUMENT naming the path and
 * why. */
gboolean hostd_config_set_egress_upstream_ca_file(HostdConfig *config, const char *path,
                                                  GError **error);

/* Parses an agent-ids value: "MIN-MAX" (decimal ids, 1000 <= MIN <= MAX < 2^31) or "off" (both
 * 0). Fails with VM_ERROR_INVALID_ARGUMENT saying what is accepted. */
gboolean hostd_config_parse_agent_ids(const char *text, guint *ret_min, guint *ret_max,
                                      GError **error);

/* Parses a value of id range @key (agent-ids, worker-ids) as hostd_config_parse_agent_ids(),
 * naming @key in its error. */
gboolean hostd_config_parse_ids(const char *key, const char *text, guint *ret_min, guint *ret_max,
                                GError **error);

/* Whether SIGTERM saves the running agents: shutdown = save, or auto with a service manager
 * ($NOTIFY_SOCKET set). */
gboolean hostd_config_shutdown_saves(const HostdConfig *config);

void hostd_config_free(HostdConfig *config);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdConfig, hostd_config_free)

/* The directory holding the shipped templates: $VM_TEMPLATES_DIR, else the source tree's
 * templates/ when this hostd runs from its build tree (vm_use_build_tree()), else the installed
 * data dir. Newly allocated. */
char *hostd_config_default_templates_dir(void);

/* Whom a worker process runs as where worker-ids are off (hostd_confine_worker_user()):
 * egress-user ("nobody" by default) when hostd is root, *@ret_change then TRUE; hostd's own user
 * otherwise (it cannot change it, and confines the worker all the same). Fails with
 * VM_ERROR_INVALID_ARGUMENT for a user that is unknown, root or in root's group. */
gboolean hostd_config_worker_user(const HostdConfig *config, gboolean *ret_change, uid_t *ret_uid,
                                  gid_t *ret_gid, GError **error);

G_END_DECLS
