/* hostd's state directory: the lock that makes one hostd per state dir, and the per-agent
 * records (agents/<name>/agent.ini), always written atomically. */
#pragma once

#include <glib.h>

#include "vm-domain.h"
#include "vm-fs.h"

G_BEGIN_DECLS

/* Files inside an agent's directory. */
#define HOSTD_AGENT_RECORD       "agent.ini"
#define HOSTD_AGENT_DISK         "disk.qcow2"
#define HOSTD_AGENT_SEED         "seed.iso"
#define HOSTD_AGENT_KEY          "id_ed25519"
#define HOSTD_AGENT_KEY_PUB      "id_ed25519.pub"
#define HOSTD_AGENT_HOST_KEY_PUB "ssh_host_ed25519_key.pub"
#define HOSTD_AGENT_KNOWN_HOSTS  "known_hosts"
#define HOSTD_AGENT_SSH_CONFIG   "ssh_config"
#define HOSTD_AGENT_CONSOLE      "console.log"     /* the serial console, as hostd copies it */
#define HOSTD_AGENT_CONSOLE_SOCK "serial.sock"     /* the serial console, where QEMU serves it */
#define HOSTD_AGENT_DOMAIN_XML   "domain.xml"      /* the definition as hostd last made it */
#define HOSTD_AGENT_USER_KEYS    "authorized_keys" /* the users' own keys (vmctl authorize) */

/* An agent's lifecycle as recorded on disk; "creating" records found at start-up belong to a
 * `new` that never finished and are rolled back. */
#define HOSTD_PHASE_CREATING "creating"
#define HOSTD_PHASE_READY    "ready"

/* What the user wants an agent to be (HostdAgentRecord.wanted): changed by the verbs and the
 * idle policy only; the supervisor (hostd-supervise.h) keeps the VM in line with it. */
#define HOSTD_WANTED_RUNNING "running"
#define HOSTD_WANTED_PAUSED  "paused"
#define HOSTD_WANTED_SAVED   "saved"
#define HOSTD_WANTED_STOPPED "stopped"

/* What a crash or a poweroff from inside leads to (HostdAgentRecord.restart). */
#define HOSTD_RESTART_ON_CRASH "on-crash" /* the default: crashes restart, a poweroff stops */
#define HOSTD_RESTART_ALWAYS   "always"   /* a poweroff from inside restarts too */
#define HOSTD_RESTART_NEVER    "never"    /* nothing restarts; a crash leaves it crashed */

typedef struct {
    char *dir; /* not stored: where the record lives */
    char *name;
    char *uuid;
    char *template_name;
    char *phase;
    guint cpus;
    guint memory_mib;
    guint disk_gib;
    guint disk_limits[VM_DISK_LIMITS]; /* VmDiskLimit, 0: no limit (and in records made before
                                        * there were limits) */
    guint ssh_port;           /* public: hostd's relay listens here (QEMU itself for old agents) */
    guint backend_port;       /* QEMU's forward to the guest's sshd, behind the relay; 0: none */
    gboolean idle_never;      /* idle policy: never suspended automatically */
    guint idle_pause_s;       /* 0: no pause level */
    guint idle_save_s;        /* 0: no save level */
    guint checkpoint_every_s; /* periodic automatic checkpoints; 0: none */
    guint checkpoint_keep;    /* how many periodic ones are kept, newest first */
    guint checkpoint_hourly;  /* plus the oldest one of each of this many recent hours */
    guint checkpoint_daily;   /* plus the oldest one of each of this many recent days */
    char *mac;
    char *user;
    char *instance_id;
    char *forked_from;       /* NULL unless forked: the source agent's name */
    char *fork_checkpoint;   /* with forked_from: the source's checkpoint the disk stands on */
    char *fork_base;         /* with forked_from: that checkpoint's image (absolute path) */
    char *warm_base;         /* made from a warm image: its disk layer, which the agent's first
                              * disk stands on instead of the template's image; or NULL */
    char *domain;            /* its libvirt domain's name where it is not the agent's (a warm
                              * pool's machine keeps the name it was restored under); or NULL */
    gint64 created;          /* unix seconds */
    gint64 state_since;      /* unix seconds of the last state change hostd made */
    char *wanted;            /* HOSTD_WANTED_*; NULL in records older than the supervisor */
    char *restart;           /* HOSTD_RESTART_*; never NULL once loaded */
    guint crash_count;       /* crashes restarted within the window that began at crash_window */
    gint64 crash_window;     /* unix seconds */
    char *crashed;           /* NULL, or why the supervisor gave up restarting it */
    guint64 fleet_epoch;     /* the epoch of the fleet record this copy was made under (1 for a
                              * new or fork, raised by whatever brings a copy here with a new
                              * one); 0: not in a fleet, or made before epochs were kept */
    char *fenced;            /* NULL, or why this copy is never started: another host of the
                              * fleet owns the agent (hostd-fence.h) */
    char *moving_to;         /* NULL, or the host this copy is being moved to (hostd-move.h):
                              * saved for the move, never started here until the move is
                              * settled by the fleet's record */
    char *replicas;          /* NULL, or the hosts holding the last replica of its checkpoints
                              * ("h2,h3"), as the last replication left them (hostd-replica.h) */
    char *replicated;        /* NULL, or the checkpoint that replica holds last */
    gboolean replicate_own;  /* it has a count of replicas of its own (vmctl replicate --copies) */
    guint replicate;         /* and that count (0-8); else the host's [cluster] one holds */
    gboolean shutdown_saved; /* saved by hostd's shutdown (or stop-host-agents), not by the user */
    gboolean grow_fs;        /* its disk grew (vmctl set) and the guest's root filesystem is
                              * still to be grown to it, the next time the guest answers */
    guint agent_id;          /* the uid (and gid) its QEMU runs as, from agent-ids; 0: none (an
                              * unprivileged hostd, or a record from before agent ids) */
} HostdAgentRecord;

/* Whether @wanted is one of HOSTD_WANTED_*, @policy one of HOSTD_RESTART_*. */
gboolean hostd_wanted_is_valid(const char *wanted);
gboolean hostd_restart_policy_is_valid(const char *policy);

/* Loads <dir>/agent.ini. Fails with VM_ERROR_IO or VM_ERROR_FAILED ("corrupt record") when a
 * required key is missing. */
HostdAgentRecord *hostd_agent_record_load(const char *dir, GError **error);

/* Writes the record to <dir>/agent.ini atomically and durably. Fails with VM_ERROR_IO. */
gboolean hostd_agent_record_save(const HostdAgentRecord *record, GError **error);

/* Returns <record dir>/<file>, newly allocated. */
char *hostd_agent_record_path(const HostdAgentRecord *record, const char *file);

HostdAgentRecord *hostd_agent_record_copy(const HostdAgentRecord *record);
void hostd_agent_record_free(HostdAgentRecord *record);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdAgentRecord, hostd_agent_record_free)

typedef struct {
    char *dir;
    char *agents_dir;
    int lock_fd;
} HostdState;

/* Creates @state_dir (0711) and its agents/ folder if needed and takes the exclusive lock on
 * <state_dir>/hostd.lock, held until hostd_state_close(). A second hostd on the same state dir
 * fails with VM_ERROR_BUSY naming the holder's PID. */
HostdState *hostd_state_open(const char *state_dir, GError **error);
void hostd_state_close(HostdState *state);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdState, hostd_state_close)

/* Lists the agent directory names under agents/ (sorted). Fails with VM_ERROR_IO. */
GPtrArray *hostd_state_list_agents(HostdState *state, GError **error);

/* The record of every agent that has one that loads (any phase), sorted by name
 * (HostdAgentRecord*); records that cannot be read are skipped. Fails like
 * hostd_state_list_agents(). */
GPtrArray *hostd_state_load_records(HostdState *state, GError **error);

G_END_DECLS
