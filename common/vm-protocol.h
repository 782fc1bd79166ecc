/* The hostd <-> vmctl protocol: a closed set of typed messages over a Unix stream socket.
 *
 * A frame is a 4-byte big-endian payload length followed by the payload: a GVariant of type
 * VM_MESSAGE_TYPE "(ua{sv})" in normal form, holding the operation and its fields. Every
 * operation has a schema (the keys it may carry, their GVariant types, which are required);
 * vm_message_decode() rejects unknown operations, unknown keys, wrong types, missing required
 * keys, non-normal payloads and frames over VM_FRAME_MAX. docs/PROTOCOL.md describes the
 * conversation; this header and the schema table in vm-protocol.c are the single source of
 * truth for the message set. vm-stream.h writes and reads the replies.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_MESSAGE_TYPE      "(ua{sv})"
#define VM_FRAME_HEADER_SIZE 4
#define VM_FRAME_MAX         (1024 * 1024) /* payload bytes, any message */
#define VM_STREAM_CHUNK_MAX  (64 * 1024)   /* data bytes in one STDIN/STDOUT/STDERR message */
#define VM_USER_DATA_MAX     (64 * 1024)   /* bytes of --user-data */
#define VM_ARGV_MAX          4096          /* arguments, environment entries */
#define VM_LABEL_MAX         256           /* bytes of a checkpoint label or id */
#define VM_PROTOCOL_VERSION  15
#define VM_PATHS_MAX         64                  /* --path arguments of a restore */
#define VM_RESULT_PART_MAX   (512 * 1024)        /* bytes of a RESULT in one RESULT_PART */
#define VM_RESULT_MAX        (256 * 1024 * 1024) /* bytes of a RESULT sent in parts */
#define VM_RULES_MAX         256                 /* egress rules in one request */
#define VM_SSH_KEYS_MAX      32 /* users' public keys in one request, and authorized in one agent */
#define VM_FINGERPRINT_MAX   128  /* bytes of a key fingerprint ("SHA256:...") */
#define VM_SECRET_NAME_MAX   64   /* bytes of a secret's name */
#define VM_SECRET_VALUE_MAX  8192 /* bytes of a secret's value */
#define VM_SECRET_HOSTS_MAX  32   /* host patterns of one secret */
#define VM_SECRETS_MAX       64   /* secrets granted by one agent-new */
#define VM_NAMES_MAX         1024 /* agents named in one request */
#define VM_HOST_ID_MAX       63   /* bytes of a fleet host's id */
#define VM_ADDRESS_MAX       255  /* bytes of a fleet host's address */
#define VM_MOVE_FILES_MAX    4096 /* files of one agent a move copies */
#define VM_MOVE_FILE_MAX     255  /* bytes of one such file's name */
#define VM_REPLICAS_MAX      8    /* hosts an agent's checkpoints are copied to */
#define VM_SHA256_HEX        64   /* bytes of a SHA-256 in hex */
#define VM_PATH_MAX          4096 /* bytes of a host path in a request */
/* The most an agent-set-resources request can ask for; hostd's own limits are lower. */
#define VM_SET_CPUS_MAX       1024
#define VM_SET_MEMORY_MIB_MAX (16 * 1024 * 1024) /* 16 TiB */
#define VM_SET_DISK_GIB_MAX   16384              /* 16 TiB, hostd's bound at new too */

/* An agent's disk I/O limits (agent-new fields, agent info), applied by QEMU's block throttling
 * (<iotune> on its disk), which needs no cgroups. Each is a rate per second; 0 is no limit. */
typedef enum {
    VM_DISK_READ_MIB,   /* MiB read per second */
    VM_DISK_WRITE_MIB,  /* MiB written per second */
    VM_DISK_READ_IOPS,  /* read requests per second */
    VM_DISK_WRITE_IOPS, /* write requests per second */
    VM_DISK_LIMITS,
} VmDiskLimit;

/* The largest value of each limit (1 TiB/s, 1M requests/s): anything above is a mistake. */
#define VM_DISK_LIMIT_MAX 1000000

/* The field of @limit in agent-new and in an agent's info: "disk_read_mib", "disk_write_mib",
 * "disk_read_iops", "disk_write_iops". Static; can't fail. */
const char *vm_disk_limit_field(VmDiskLimit limit);

/* Values are part of the wire protocol: append only, never renumber. The fields each op may
 * carry are in one place, the schema table in vm-protocol.c; docs/PROTOCOL.md describes them
 * (a unit test keeps the two in step). The comments here give the shape of the reply. */
typedef enum {
    /* Requests: the first message a client sends on a connection (one request per
     * connection). */
    VM_OP_PING = 1,              /* -> RESULT {version, protocol, virt_type, uri} */
    VM_OP_TEMPLATE_LIST,         /* -> RESULT {templates} */
    VM_OP_TEMPLATE_BUILD,        /* -> PROGRESS* RESULT {name, image} */
    VM_OP_AGENT_NEW,             /* -> PROGRESS* RESULT {agent} */
    VM_OP_AGENT_LIST,            /* -> RESULT {agents} */
    VM_OP_AGENT_INFO,            /* -> RESULT {agent} */
    VM_OP_AGENT_START,           /* -> PROGRESS* RESULT {agent} */
    VM_OP_AGENT_STOP,            /* -> PROGRESS* RESULT {agent} */
    VM_OP_AGENT_RM,              /* -> RESULT {} */
    VM_OP_AGENT_SSH_CONFIG,      /* -> RESULT {config, path?, host?} */
    VM_OP_EXEC,                  /* -> a stream both ways, then EXIT (see vm-stream.h) */
    VM_OP_CHECKPOINT_CREATE,     /* -> PROGRESS* RESULT {checkpoint, warning?} */
    VM_OP_CHECKPOINT_LIST,       /* -> RESULT {checkpoints} */
    VM_OP_CHECKPOINT_RESTORE,    /* -> PROGRESS* RESULT {agent, undo} */
    VM_OP_CHECKPOINT_RM,         /* -> RESULT {} */
    VM_OP_AGENT_SUSPEND,         /* -> RESULT {agent} */
    VM_OP_AGENT_RESUME,          /* -> RESULT {agent} */
    VM_OP_AGENT_KEEP_AWAKE,      /* -> RESULT {agent} */
    VM_OP_AGENT_SET_IDLE,        /* -> RESULT {agent} */
    VM_OP_AGENT_SET_CHECKPOINTS, /* -> RESULT {agent} */
    VM_OP_AGENT_FORK,            /* -> PROGRESS* RESULT {agent, checkpoint} */
    VM_OP_CHECKPOINT_DIFF,       /* -> PROGRESS* RESULT {changes, truncated} */
    VM_OP_EGRESS_GET,            /* -> RESULT {egress} */
    VM_OP_EGRESS_SET,            /* -> RESULT {egress} */
    VM_OP_EGRESS_LOG,            /* -> STDOUT* EXIT {status 0} */
    VM_OP_AGENT_SET_RESTART,     /* -> RESULT {agent} */
    VM_OP_HOST_SAVE_ALL,         /* -> RESULT {agents, seconds} */
    VM_OP_EVENTS,                /* -> STDOUT* EXIT {status 0} */
    VM_OP_FORWARD_ADD = 29,      /* -> RESULT {forward} */
    VM_OP_FORWARD_RM = 30,       /* -> RESULT {} */
    VM_OP_FORWARD_LIST = 31,     /* -> RESULT {forwards} */

    /* Users' own SSH public keys in an agent. */
    VM_OP_AGENT_AUTHORIZE_ADD = 32, /* -> RESULT {keys, added} */
    VM_OP_AGENT_AUTHORIZE_RM,       /* -> RESULT {keys} */
    VM_OP_AGENT_AUTHORIZE_LIST,     /* -> RESULT {keys} */

    /* The credential broker's secrets (docs/SECRETS.md); values travel only to hostd. */
    VM_OP_SECRET_CREATE = 35, /* -> RESULT {secret} */
    VM_OP_SECRET_LIST,        /* -> RESULT {secrets} */
    VM_OP_SECRET_SET,         /* -> RESULT {secret} */
    VM_OP_SECRET_RM,          /* -> RESULT {revoked} */
    VM_OP_SECRET_GRANT,       /* -> RESULT {secrets} */
    VM_OP_SECRET_REVOKE,      /* -> RESULT {secrets} */

    /* More CPUs, memory or disk for an agent (vmctl set). */
    VM_OP_AGENT_SET_RESOURCES = 41, /* -> RESULT {agent, changes} */
    VM_OP_EGRESS_PRESETS = 42,      /* -> RESULT {presets} */

    /* Watching agents (docs/OBSERVE.md). */
    VM_OP_AGENT_LOGS = 43, /* -> STDOUT* EXIT {status 0} */
    VM_OP_AGENT_STATS,     /* -> RESULT {agents, seconds} */

    /* The fleet's one view, from etcd (docs/CLUSTER.md); any host of the fleet answers. */
    VM_OP_FLEET_HOSTS = 45, /* -> RESULT {hosts} */
    VM_OP_FLEET_LIST,       /* -> RESULT {agents} */
    VM_OP_FLEET_DRAIN,      /* -> RESULT {host, drained, changed} */

    /* Moving an agent to another host of the fleet (docs/CLUSTER.md, "Moves"): vmctl asks the
     * source and the target in turn and carries the files between them. */
    VM_OP_MOVE_OUT = 48, /* source: -> PROGRESS* RESULT (per step: plan, save, done, abort) */
    VM_OP_MOVE_READ,     /* source: -> STDOUT* EXIT {status, sha256} (one file's bytes) */
    VM_OP_MOVE_IN = 53,  /* target: -> PROGRESS* RESULT (per step: begin, commit, abort) */
    VM_OP_MOVE_WRITE,    /* target: STDIN* STDIN_EOF from the client -> EXIT {status, sha256} */
    /* An agent back from its replica here, its host lost (docs/CLUSTER.md, "Replicas"). */
    VM_OP_AGENT_RECOVER = 55,  /* -> PROGRESS* RESULT {agent, checkpoint, created, from} */
    VM_OP_AGENT_SET_REPLICATE, /* -> RESULT {agent} */

    /* Client -> hostd during an EXEC stream. */
    VM_OP_STDIN = 50,
    VM_OP_STDIN_EOF,
    VM_OP_WINDOW_SIZE,

    /* hostd -> client. */
    VM_OP_PROGRESS = 100, /* fraction in [0,1], absent if unknown */
    VM_OP_RESULT,         /* free-form fields, per request (see above) */
    VM_OP_ERROR,          /* code is a VmErrorCode; ends the conversation */
    VM_OP_STDOUT,
    VM_OP_STDERR,
    VM_OP_EXIT,        /* the remote command's exit status; ends EXEC and the log streams */
    VM_OP_RESULT_PART, /* a piece of a RESULT too big for one frame (vm-stream.h) */
    VM_OP_ELSEWHERE,   /* ends any reply: the request is for another host of the fleet */
} VmOp;

typedef struct {
    VmOp op;
    GVariant *fields; /* a{sv}, floating ref sunk, never NULL */
} VmMessage;

/* Returns a stable lower-case name for @op ("agent-new"), or NULL for an unknown value. */
const char *vm_op_name(VmOp op);

/* TRUE for ops a client may send as the first message of a connection. */
gboolean vm_op_is_request(VmOp op);

/* For a request, the op that ends its successful reply: VM_OP_RESULT, or VM_OP_EXIT for the
 * requests answered with a stream (EXEC, EGRESS_LOG, EVENTS, AGENT_LOGS). 0 for anything that is
 * not a request.
 */
VmOp vm_op_reply_end(VmOp op);

/* Builds a message, taking ownership of @fields (an a{sv}; floating refs are sunk; NULL means
 * empty). Validates @fields against the schema of @op; on failure returns NULL with
 * VM_ERROR_PROTOCOL. */
VmMessage *vm_message_new(VmOp op, GVariant *fields, GError **error);

/* Convenience constructors that cannot fail for well-formed arguments. */
VmMessage *vm_message_new_error(const GError *error);
VmMessage *vm_message_new_progress(const char *message, double fraction);
VmMessage *vm_message_new_data(VmOp op, const void *data, gsize len); /* STDIN/STDOUT/STDERR */

void vm_message_free(VmMessage *message);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmMessage, vm_message_free)

/* Field accessors: return the value of @key or @fallback when absent. The schema check in
 * vm_message_new()/vm_message_decode() guarantees the type, so these can't fail. */
const char *vm_message_get_string(const VmMessage *message, const char *key, const char *fallback);
guint32 vm_message_get_uint(const VmMessage *message, const char *key, guint32 fallback);
gint32 vm_message_get_int(const VmMessage *message, const char *key, gint32 fallback);
gboolean vm_message_get_bool(const VmMessage *message, const char *key, gboolean fallback);
double vm_message_get_double(const VmMessage *message, const char *key, double fallback);
/* Returns a new reference to the value of @key, or NULL when absent. */
GVariant *vm_message_lookup(const VmMessage *message, const char *key);
/* For "as" fields: a newly allocated NULL-terminated vector, or NULL when absent. */
char **vm_message_dup_strv(const VmMessage *message, const char *key);
/* For "ay" fields: pointer into the message (valid while it lives), or NULL when absent. */
const guint8 *vm_message_get_data(const VmMessage *message, const char *key, gsize *ret_len);

/* Turns an ERROR message back into a GError in VM_ERROR with the same code and message.
 * Returns FALSE always (it is a throw helper). */
gboolean vm_message_to_error(const VmMessage *message, GError **error);

/* Serialises @message into a complete frame (header + payload). Fails with VM_ERROR_PROTOCOL
 * when the payload would exceed VM_FRAME_MAX. */
GBytes *vm_message_encode(const VmMessage *message, GError **error);

/* Parses one payload (without the header). Fails with VM_ERROR_PROTOCOL on anything the schema
 * does not allow. */
VmMessage *vm_message_decode(const guint8 *payload, gsize len, GError **error);

/* Reads exactly one frame from the blocking stream @fd. Returns NULL and sets no error on a
 * clean EOF before the first header byte (*ret_eof = TRUE); a truncated frame or oversized
 * length fails with VM_ERROR_PROTOCOL, a read error with VM_ERROR_IO. */
VmMessage *vm_message_read_fd(int fd, gboolean *ret_eof, GError **error);

/* The same, with the whole frame due by @deadline (monotonic microseconds; 0: no deadline):
 * a frame not whole by then fails with VM_ERROR_TIMEOUT, however the peer spaces its bytes. */
VmMessage *vm_message_read_fd_until(int fd, gint64 deadline, gboolean *ret_eof, GError **error);

/* Writes one frame to the blocking stream @fd (retries on EINTR and short writes, never raises
 * SIGPIPE: uses send(MSG_NOSIGNAL) on sockets). Fails with VM_ERROR_IO or VM_ERROR_PROTOCOL. */
gboolean vm_message_write_fd(int fd, const VmMessage *message, GError **error);

G_END_DECLS
