/* The hostd <-> vmctl protocol: a closed set of typed messages over a Unix stream socket.
 *
 * A frame is a 4-byte big-endian payload length followed by the payload: a GVariant of type
 * VM_MESSAGE_TYPE "(ua{sv})" in normal form, holding the operation and its fields. Every
 * operation has a schema (the keys it may carry, their GVariant types, which are required);
 * vm_message_decode() rejects unknown operations, unknown keys, wrong types, missing required
 * keys, non-normal payloads and frames over VM_FRAME_MAX. docs/PROTOCOL.md describes the
 * conversation; this header is the single source of truth for the message set.
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
#define VM_PROTOCOL_VERSION  3
#define VM_PATHS_MAX         64  /* --path arguments of a restore */
#define VM_RULES_MAX         256 /* egress rules in one request */

/* Values are part of the wire protocol: append only, never renumber. */
typedef enum {
    /* Requests: the first message a client sends on a connection (one request per
     * connection). */
    VM_OP_PING = 1,              /* -> RESULT {version s, protocol u, virt_type s, uri s} */
    VM_OP_TEMPLATE_LIST,         /* -> RESULT {templates aa{sv}} */
    VM_OP_TEMPLATE_BUILD,        /* {name s, force b?} -> PROGRESS* RESULT {name s, image s} */
    VM_OP_AGENT_NEW,             /* {name s, template s?, cpus u?, memory_mib u?, disk_gib u?,
                                  *  user_data s?, wait b?} -> PROGRESS* RESULT {agent a{sv}} */
    VM_OP_AGENT_LIST,            /* -> RESULT {agents aa{sv}} */
    VM_OP_AGENT_INFO,            /* {name s} -> RESULT {agent a{sv}} */
    VM_OP_AGENT_START,           /* {name s, wait b?} -> PROGRESS* RESULT {agent a{sv}} */
    VM_OP_AGENT_STOP,            /* {name s, force b?, timeout_s u?} -> PROGRESS* RESULT {agent} */
    VM_OP_AGENT_RM,              /* {name s, force b?} -> RESULT {} */
    VM_OP_AGENT_SSH_CONFIG,      /* {name s?} -> RESULT {config s} */
    VM_OP_EXEC,                  /* {name s, argv as, env as?, cwd s?, tty b?, term s?, cols u?,
                                  *  rows u?} -> then a stream, see below */
    VM_OP_CHECKPOINT_CREATE,     /* {name s, label s?, memory b?} -> PROGRESS* RESULT
                                  *  {checkpoint a{sv}, warning s?} */
    VM_OP_CHECKPOINT_LIST,       /* {name s} -> RESULT {checkpoints aa{sv}} */
    VM_OP_CHECKPOINT_RESTORE,    /* {name s, checkpoint s, wait b?, paths as?} -> PROGRESS* RESULT
                                  *  {agent a{sv}, undo s: the checkpoint taken just before} */
    VM_OP_CHECKPOINT_RM,         /* {name s, checkpoint s} -> RESULT {} */
    VM_OP_AGENT_SUSPEND,         /* {name s, save b?} -> RESULT {agent a{sv}} */
    VM_OP_AGENT_RESUME,          /* {name s} -> RESULT {agent a{sv}} */
    VM_OP_AGENT_KEEP_AWAKE,      /* {name s, seconds u?, off b?} -> RESULT {agent a{sv}} */
    VM_OP_AGENT_SET_IDLE,        /* {name s, never b?, pause_s u?, save_s u?} -> RESULT {agent} */
    VM_OP_AGENT_SET_CHECKPOINTS, /* {name s, never b?, every_s u?, keep u?, hourly u?,
                                  *  daily u?} -> RESULT {agent} */
    VM_OP_AGENT_FORK,            /* {name s (the new agent), source s, checkpoint s?, cpus u?,
                                  *  memory_mib u?, wait b?} -> PROGRESS* RESULT {agent a{sv},
                                  *  checkpoint s: the one the fork stands on} */
    VM_OP_CHECKPOINT_DIFF,       /* {name s, checkpoint s, other s?, path s?} -> PROGRESS* RESULT
                                  *  {changes a(ss): (A|D|M, path) sorted by path, truncated b} */
    VM_OP_EGRESS_GET,            /* {name s} -> RESULT {egress a{sv}} */
    VM_OP_EGRESS_SET,            /* {name s, allow as?, deny as?, remove as?, reset b?} -> RESULT
                                  *  {egress a{sv}} */
    VM_OP_EGRESS_LOG,            /* {name s, follow b?, lines u?} -> STDOUT* EXIT {status 0} */

    /* Client -> hostd during an EXEC stream. */
    VM_OP_STDIN = 50,  /* {data ay} */
    VM_OP_STDIN_EOF,   /* {} */
    VM_OP_WINDOW_SIZE, /* {cols u, rows u} */

    /* hostd -> client. */
    VM_OP_PROGRESS = 100, /* {message s, fraction d?}: fraction in [0,1], absent if unknown */
    VM_OP_RESULT,         /* free-form fields, per request (see above) */
    VM_OP_ERROR,          /* {code u (VmErrorCode), message s}: ends the conversation */
    VM_OP_STDOUT,         /* {data ay} */
    VM_OP_STDERR,         /* {data ay} */
    VM_OP_EXIT,           /* {status i}: the remote command's exit status; ends EXEC */
} VmOp;

typedef struct {
    VmOp op;
    GVariant *fields; /* a{sv}, floating ref sunk, never NULL */
} VmMessage;

/* Returns a stable lower-case name for @op ("agent-new"), or NULL for an unknown value. */
const char *vm_op_name(VmOp op);

/* TRUE for ops a client may send as the first message of a connection. */
gboolean vm_op_is_request(VmOp op);

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

/* Writes one frame to the blocking stream @fd (retries on EINTR and short writes, never raises
 * SIGPIPE: uses send(MSG_NOSIGNAL) on sockets). Fails with VM_ERROR_IO or VM_ERROR_PROTOCOL. */
gboolean vm_message_write_fd(int fd, const VmMessage *message, GError **error);

G_END_DECLS
