#include "hostd-server.h"
#include "hostd-server-private.h"

#include "hostd-agent.h"
#include "hostd-authorize.h"
#include "hostd-checkpoint-files.h"
#include "hostd-checkpoint.h"
#include "hostd-cluster.h"
#include "hostd-egress.h"
#include "hostd-fork.h"
#include "hostd-forward.h"
#include "hostd-exec.h"
#include "hostd-ksm.h"
#include "hostd-logs.h"
#include "hostd-metrics.h"
#include "hostd-move.h"
#include "hostd-replica.h"
#include "hostd-secrets.h"
#include "hostd-power.h"
#include "hostd-resize.h"
#include "hostd-shutdown.h"
#include "hostd-stats.h"
#include "hostd-supervise.h"
#include "hostd-template.h"

#include <errno.h>
#include <grp.h>
#include <glib/gstdio.h>
#include <glib-unix.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "vm-config.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-protocol.h"
#include "vm-ssh-key.h"
#include "vm-stream.h"
#include "vm-util.h"

#define HOSTD_MAX_CLIENTS 256
/* A client past HOSTD_MAX_CLIENTS waits this long for a slot (an orchestrator's burst of execs
 * queues rather than fails) before it is refused. */
#define HOSTD_CLIENT_QUEUE_US (10 * G_USEC_PER_SEC)
#define HOSTD_SEND_TIMEOUT_S  60
/* Bytes of an exec's command line its event keeps. */
#define HOSTD_EVENT_COMMAND_MAX 200

struct HostdServer {
    HostdContext *ctx;
    char *socket_path;
    int listen_fd;
    int wake_pipe[2];
    GThread *accept_thread;
};

typedef struct {
    HostdContext *ctx;
    int fd;
} HostdClient;

static gint hostd_active_clients = 0;   /* under hostd_clients_lock */
static guint64 hostd_clients_ended = 0; /* under hostd_clients_lock */
static GMutex hostd_clients_lock;
static GCond hostd_clients_freed;

typedef enum {
    HOSTD_REQUEST_READS = 0,         /* changes nothing: no event */
    HOSTD_REQUEST_CHANGES = 1 << 0,  /* leaves an event once it ran, whatever the outcome */
    HOSTD_REQUEST_TEMPLATE = 1 << 1, /* its "name" is a template's, not an agent's */
} HostdRequestFlags;

/* One request being served. The reply comes first: the VmStreamWriter a handler gets is the
 * start of its HostdRequest. */
typedef struct {
    VmStreamWriter reply;
    HostdContext *ctx;
    const VmMessage *req;
    HostdRequestFlags flags;
    gint64 uid;        /* the caller's; -1: unknown */
    gint64 pid;        /* the caller's, as hostd's pid namespace sees it; -1: unknown */
    gboolean recorded; /* its event is in the log */
} HostdRequest;

/* The uid and pid of the process at the other end of @fd (SO_PEERCRED: what the kernel recorded
 * when it connected, nothing the client says), or -1 for both when the socket cannot say (not a
 * Unix socket). */
static void
hostd_peer_cred(int fd, gint64 *ret_uid, gint64 *ret_pid)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof(cred)) {
        *ret_uid = -1;
        *ret_pid = -1;
        return;
    }
    *ret_uid = cred.uid;
    *ret_pid = cred.pid;
}

/* " (uid U) [pid P]", the end of each log line about a request: who asked. */
static char *
hostd_request_caller(const HostdRequest *request)
{
    if (request->uid < 0)
        return g_strdup(" (caller unknown)");
    if (request->pid <= 0)
        return g_strdup_printf(" (uid %" G_GINT64_FORMAT ")", request->uid);
    return g_strdup_printf(" (uid %" G_GINT64_FORMAT ") [pid %" G_GINT64_FORMAT "]", request->uid,
                           request->pid);
}

/* @text with control characters (newline, escape...) as \xNN: a client's name or a message that
 * quotes it cannot start a line of its own in the log, or forge another caller's. */
static char *
hostd_log_safe(const char *text)
{
    GString *out = g_string_new(NULL);

    for (const char *c = text != NULL ? text : ""; *c != '\0'; c++) {
        if ((guchar)*c < 0x20 || *c == 0x7f)
            g_string_append_printf(out, "\\x%02x", (guchar)*c);
        else
            g_string_append_c(out, *c);
    }
    return g_string_free(out, FALSE);
}

/* hostd's log line of a request once it ran: always for a failure and for a request that changes
 * something (the log says who did what), for a read only with --debug, so that a busy hostd's
 * log is not all `list` and `info`. A client that went away is no failure of the request. */
static void
hostd_request_log(const HostdRequest *request, const GError *failure)
{
    const VmMessage *req = request->req;
    const char *raw_name = vm_message_get_string(req, "name", NULL);
    /* The secret's name, never anything else of its request: its value is in there. */
    const char *raw_secret = vm_message_get_string(req, "secret", NULL);
    gboolean cancelled = g_error_matches(failure, VM_ERROR, VM_ERROR_CANCELLED);

    if ((failure == NULL || cancelled) && !(request->flags & HOSTD_REQUEST_CHANGES) &&
        !request->ctx->debug)
        return;
    g_autofree char *who = hostd_request_caller(request);
    g_autofree char *name = NULL;
    if (raw_name != NULL && raw_secret != NULL)
        name = g_strdup_printf("%s secret %s", raw_name, raw_secret);
    else if (raw_name != NULL || raw_secret != NULL)
        name = g_strdup(raw_name != NULL ? raw_name : raw_secret);
    if (name != NULL) {
        char *safe = hostd_log_safe(name);
        g_free(name);
        name = safe;
    }
    if (failure != NULL && !cancelled) {
        g_autofree char *message = hostd_log_safe(failure->message);

        g_message("%s%s%s failed: %s%s", vm_op_name(req->op), name ? " " : "", name ? name : "",
                  message, who);
    } else
        g_message("%s%s%s %s%s", vm_op_name(req->op), name ? " " : "", name ? name : "",
                  cancelled ? "cancelled, the client went away" : "ok", who);
}

/* An exec's command line as a shell would read it, cut to HOSTD_EVENT_COMMAND_MAX bytes. */
static char *
hostd_exec_command_line(const VmMessage *req)
{
    g_auto(GStrv) argv = vm_message_dup_strv(req, "argv");
    g_autoptr(GString) line = g_string_new(NULL);

    for (char **arg = argv; arg != NULL && *arg != NULL; arg++) {
        gboolean plain = **arg != '\0';

        for (const char *c = *arg; *c != '\0' && plain; c++)
            plain = g_ascii_isalnum(*c) || strchr("_./=:,@%+-", *c) != NULL;
        if (line->len > 0)
            g_string_append_c(line, ' ');
        if (plain) {
            g_string_append(line, *arg);
        } else {
            g_autofree char *quoted = g_shell_quote(*arg);

            g_string_append(line, quoted);
        }
        if (line->len > HOSTD_EVENT_COMMAND_MAX)
            break;
    }
    return vm_utf8_cut(line->str, HOSTD_EVENT_COMMAND_MAX);
}

/* The keys an authorize request names, by fingerprint (as --list shows them): who authorized
 * or removed which key stays in the log. Lines that are no key show as "?". */
static char *
hostd_authorize_keys_named(const VmMessage *req)
{
    if (req->op == VM_OP_AGENT_AUTHORIZE_RM)
        return g_strdup_printf("key %s", vm_message_get_string(req, "fingerprint", ""));

    g_auto(GStrv) lines = vm_message_dup_strv(req, "keys");
    g_autoptr(GString) text = g_string_new("keys");
    for (char **line = lines; line != NULL && *line != NULL; line++) {
        g_autoptr(VmSshKey) key = vm_ssh_key_parse(*line, NULL);
        g_string_append_printf(text, " %s", key != NULL ? key->fingerprint : "?");
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* The event of a request that changed (or tried to change) something, once it ran: what, on
 * which agent, by whom, how it ended (@failure NULL: ok) and the state the agent is in now. */
static void
hostd_request_event(HostdContext *ctx, const VmMessage *req, HostdRequestFlags flags, gint64 uid,
                    const GError *failure)
{
    const char *name = vm_message_get_string(req, "name", NULL);
    const char *agent = (flags & HOSTD_REQUEST_TEMPLATE) ? NULL : name;
    g_autofree char *what = NULL;
    g_autofree char *detail = NULL;
    g_autoptr(virDomain) dom = NULL;
    HostdEvent event = {
        .agent = agent,
        .event = vm_op_name(req->op),
        .uid = uid,
        .outcome = failure != NULL ? "error" : "ok",
    };

    if (req->op == VM_OP_EXEC)
        what = hostd_exec_command_line(req);
    else if (req->op == VM_OP_FORWARD_ADD || req->op == VM_OP_FORWARD_RM)
        what = g_strdup_printf("guest port %u", vm_message_get_uint(req, "guest_port", 0));
    else if (req->op == VM_OP_AGENT_AUTHORIZE_ADD || req->op == VM_OP_AGENT_AUTHORIZE_RM)
        what = hostd_authorize_keys_named(req);
    else if (vm_message_get_string(req, "secret", NULL) != NULL)
        what = g_strdup_printf("secret %s", vm_message_get_string(req, "secret", NULL));
    else if (req->op == VM_OP_FLEET_DRAIN)
        what = g_strdup_printf("host %s %s", vm_message_get_string(req, "host", ""),
                               vm_message_get_bool(req, "drained", TRUE) ? "drained" : "undrained");
    else if ((flags & HOSTD_REQUEST_TEMPLATE) && name != NULL)
        what = g_strdup_printf("template %s", name);
    if (failure != NULL && what != NULL)
        detail = g_strdup_printf("%s: %s", what, failure->message);
    else
        detail = g_strdup(failure != NULL ? failure->message : what);
    event.detail = detail;
    /* A name that is no agent name was refused by the request; it is not looked up here
     * either. */
    if (agent != NULL && vm_name_validate(agent, NULL))
        dom = hostd_libvirt_lookup(ctx->lv, agent, NULL);
    if (dom != NULL)
        event.state = hostd_libvirt_state_name(dom);
    hostd_context_event(ctx, &event);
}

/* Appends the event of @request, once, when it is a request that changes something; @failure
 * NULL: it worked. Called before the answer that ends it is written, so that a client that heard
 * the answer finds the event. */
static void
hostd_request_record(HostdRequest *request, const GError *failure)
{
    if (!(request->flags & HOSTD_REQUEST_CHANGES) || request->recorded)
        return;
    request->recorded = TRUE;
    hostd_request_event(request->ctx, request->req, request->flags, request->uid, failure);
}

/* One request: runs it and ends @reply with its RESULT (or, for the streamed requests, lets
 * the code it calls write the stream and its EXIT). On failure returns FALSE with @error set and
 * leaves @reply open for the ERROR. */
typedef gboolean (*HostdHandler)(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                 GError **error);

/* Ends @reply with RESULT @fields (consumed). A client that went away only loses its answer:
 * the operation itself is done, so that is no failure. */
static gboolean
hostd_reply(VmStreamWriter *reply, GVariant *fields, GError **error)
{
    g_autoptr(GError) local_error = NULL;

    /* Every handler gets the reply of a HostdRequest (hostd_server_serve_fd()). */
    hostd_request_record((HostdRequest *)reply, NULL);
    if (vm_stream_writer_result(reply, fields, &local_error) ||
        g_error_matches(local_error, VM_ERROR, VM_ERROR_CANCELLED))
        return TRUE;
    g_propagate_error(error, g_steal_pointer(&local_error));
    return FALSE;
}

/* Ends @reply with RESULT {@key: @value}; a NULL @value is the failure already in @error. */
static gboolean
hostd_reply1(VmStreamWriter *reply, const char *key, GVariant *value, GError **error)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    if (value == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", key, value);
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static const char *
hostd_req_name(const VmMessage *req)
{
    return vm_message_get_string(req, "name", NULL);
}

static gboolean
hostd_handle_ping(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply, GError **error)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    g_variant_builder_add(&b, "{sv}", "version", g_variant_new_string(VM_VERSION));
    g_variant_builder_add(&b, "{sv}", "protocol", g_variant_new_uint32(VM_PROTOCOL_VERSION));
    g_variant_builder_add(&b, "{sv}", "virt_type", g_variant_new_string(ctx->lv->virt_type));
    g_variant_builder_add(&b, "{sv}", "uri", g_variant_new_string(ctx->lv->uri));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_template_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    return hostd_reply1(reply, "templates", hostd_template_list(ctx, error), error);
}

static gboolean
hostd_handle_template_build(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                            GError **error)
{
    const char *name = hostd_req_name(req);
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autofree char *image =
        hostd_template_build(ctx, name, vm_message_get_bool(req, "force", FALSE),
                             vm_stream_writer_progress_func, reply, error);

    if (image == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(name));
    g_variant_builder_add(&b, "{sv}", "image", g_variant_new_string(image));
    g_autofree char *warm = hostd_template_warm_state(ctx, name);
    g_variant_builder_add(&b, "{sv}", "warm", g_variant_new_string(warm));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_agent_new(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                       GError **error)
{
    g_auto(GStrv) ssh_keys = vm_message_dup_strv(req, "ssh_keys");
    g_auto(GStrv) secrets = vm_message_dup_strv(req, "secrets");
    g_auto(GStrv) egress = vm_message_dup_strv(req, "egress");
    HostdNewRequest nr = {
        .name = hostd_req_name(req),
        .template_name = vm_message_get_string(req, "template", NULL),
        .cpus = vm_message_get_uint(req, "cpus", 0),
        .memory_mib = vm_message_get_uint(req, "memory_mib", 0),
        .disk_gib = vm_message_get_uint(req, "disk_gib", 0),
        .user_data = vm_message_get_string(req, "user_data", NULL),
        .wait = vm_message_get_bool(req, "wait", TRUE),
        .cold = vm_message_get_bool(req, "cold", FALSE),
        .ssh_keys = ssh_keys,
        .secrets = secrets,
        .egress = egress,
    };
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        /* Given or not: 0 is a value here (no limit). */
        guint limit = vm_message_get_uint(req, vm_disk_limit_field(i), G_MAXUINT);

        nr.disk_limits_set[i] = limit != G_MAXUINT;
        nr.disk_limits[i] = nr.disk_limits_set[i] ? limit : 0;
    }

    return hostd_reply1(reply, "agent",
                        hostd_agent_new(ctx, &nr, vm_stream_writer_progress_func, reply, error),
                        error);
}

static gboolean
hostd_handle_agent_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    return hostd_reply1(reply, "agents", hostd_agent_list(ctx, error), error);
}

static gboolean
hostd_handle_agent_info(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    g_autoptr(GVariant) agent = hostd_agent_info(ctx, hostd_req_name(req), error);
    if (agent == NULL)
        return FALSE;
    /* The agent's grants: names and env vars only, never a placeholder (vmctl info is shown). */
    g_autoptr(GVariantDict) info = g_variant_dict_new(agent);
    g_variant_dict_insert_value(info, "secrets",
                                hostd_secrets_agent_grants(ctx, hostd_req_name(req)));
    return hostd_reply1(reply, "agent", g_variant_dict_end(info), error);
}

static gboolean
hostd_handle_agent_start(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                         GError **error)
{
    return hostd_reply1(reply, "agent",
                        hostd_agent_start(ctx, hostd_req_name(req),
                                          vm_message_get_bool(req, "wait", TRUE),
                                          vm_stream_writer_progress_func, reply, error),
                        error);
}

static gboolean
hostd_handle_agent_stop(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    return hostd_reply1(reply, "agent",
                        hostd_agent_stop(ctx, hostd_req_name(req),
                                         vm_message_get_bool(req, "force", FALSE),
                                         vm_message_get_uint(req, "timeout_s", 0),
                                         vm_stream_writer_progress_func, reply, error),
                        error);
}

static gboolean
hostd_handle_agent_rm(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                      GError **error)
{
    if (!hostd_agent_rm(ctx, hostd_req_name(req), vm_message_get_bool(req, "force", FALSE), error))
        return FALSE;
    /* A new agent of the same name starts its counts from 0. */
    hostd_metrics_forget(ctx->metrics, hostd_req_name(req));
    return hostd_reply(reply, NULL, error);
}

static gboolean
hostd_handle_agent_ssh_config(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                              GError **error)
{
    g_autofree char *path = NULL, *host = NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autofree char *config = hostd_agent_ssh_config(ctx, hostd_req_name(req), &path, &host, error);

    if (config == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "config", g_variant_new_string(config));
    if (path != NULL) {
        g_variant_builder_add(&b, "{sv}", "path", g_variant_new_string(path));
        g_variant_builder_add(&b, "{sv}", "host", g_variant_new_string(host));
    }
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

/* Answers with a stream on the socket itself: hostd_ssh_exec() writes it, EXIT included. */
static gboolean
hostd_handle_exec(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply, GError **error)
{
    g_auto(GStrv) argv = vm_message_dup_strv(req, "argv");
    g_auto(GStrv) env = vm_message_dup_strv(req, "env");
    HostdExecRequest er = {
        .argv = argv,
        .env = env,
        .cwd = vm_message_get_string(req, "cwd", NULL),
        .tty = vm_message_get_bool(req, "tty", FALSE),
        .term = vm_message_get_string(req, "term", NULL),
        .cols = vm_message_get_uint(req, "cols", 0),
        .rows = vm_message_get_uint(req, "rows", 0),
    };

    return hostd_agent_exec(ctx, hostd_req_name(req), &er, reply->fd, error);
}

static gboolean
hostd_handle_checkpoint_create(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                               GError **error)
{
    g_autofree char *warning = NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    GVariant *c =
        hostd_checkpoint_create(ctx, hostd_req_name(req), vm_message_get_string(req, "label", NULL),
                                FALSE, vm_message_get_bool(req, "memory", FALSE), &warning, error);

    if (c == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "checkpoint", c);
    if (warning != NULL)
        g_variant_builder_add(&b, "{sv}", "warning", g_variant_new_string(warning));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_checkpoint_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                             GError **error)
{
    return hostd_reply1(reply, "checkpoints",
                        hostd_checkpoint_list(ctx, hostd_req_name(req), error), error);
}

static gboolean
hostd_handle_checkpoint_restore(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                GError **error)
{
    const char *name = hostd_req_name(req);
    const char *checkpoint = vm_message_get_string(req, "checkpoint", NULL);
    g_autofree char *undo = NULL;
    g_auto(GStrv) paths = vm_message_dup_strv(req, "paths");
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    GVariant *agent =
        paths != NULL
            ? hostd_checkpoint_restore_paths(ctx, name, checkpoint, (const char *const *)paths,
                                             &undo, vm_stream_writer_progress_func, reply, error)
            : hostd_checkpoint_restore(ctx, name, checkpoint,
                                       vm_message_get_bool(req, "wait", TRUE), &undo,
                                       vm_stream_writer_progress_func, reply, error);

    if (agent == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "agent", agent);
    g_variant_builder_add(&b, "{sv}", "undo", g_variant_new_string(undo ? undo : ""));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_checkpoint_rm(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    return hostd_checkpoint_rm(ctx, hostd_req_name(req),
                               vm_message_get_string(req, "checkpoint", NULL), error) &&
           hostd_reply(reply, NULL, error);
}

static gboolean
hostd_handle_agent_suspend(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    return hostd_reply1(reply, "agent",
                        hostd_agent_suspend(ctx, hostd_req_name(req),
                                            vm_message_get_bool(req, "save", FALSE), error),
                        error);
}

static gboolean
hostd_handle_agent_resume(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                          GError **error)
{
    return hostd_reply1(reply, "agent", hostd_agent_resume(ctx, hostd_req_name(req), error), error);
}

static gboolean
hostd_handle_agent_keep_awake(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                              GError **error)
{
    return hostd_reply1(reply, "agent",
                        hostd_agent_keep_awake(ctx, hostd_req_name(req),
                                               vm_message_get_uint(req, "seconds", 0),
                                               vm_message_get_bool(req, "off", FALSE), error),
                        error);
}

static gboolean
hostd_handle_agent_set_idle(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                            GError **error)
{
    return hostd_reply1(reply, "agent",
                        hostd_agent_set_idle(ctx, hostd_req_name(req),
                                             vm_message_get_bool(req, "never", FALSE),
                                             vm_message_get_uint(req, "pause_s", 0),
                                             vm_message_get_uint(req, "save_s", 0), error),
                        error);
}

static gboolean
hostd_handle_agent_set_checkpoints(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                   GError **error)
{
    /* Absent hourly/daily leave the agent's as they are. */
    g_autoptr(GVariant) hourly = vm_message_lookup(req, "hourly");
    g_autoptr(GVariant) daily = vm_message_lookup(req, "daily");

    return hostd_reply1(reply, "agent",
                        hostd_agent_set_checkpoints(
                            ctx, hostd_req_name(req), vm_message_get_bool(req, "never", FALSE),
                            vm_message_get_uint(req, "every_s", 0),
                            vm_message_get_uint(req, "keep", 0),
                            hourly != NULL ? (gint)g_variant_get_uint32(hourly) : -1,
                            daily != NULL ? (gint)g_variant_get_uint32(daily) : -1, error),
                        error);
}

static gboolean
hostd_handle_agent_fork(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    HostdForkRequest fr = {
        .name = hostd_req_name(req),
        .source = vm_message_get_string(req, "source", NULL),
        .checkpoint = vm_message_get_string(req, "checkpoint", NULL),
        .cpus = vm_message_get_uint(req, "cpus", 0),
        .memory_mib = vm_message_get_uint(req, "memory_mib", 0),
        .wait = vm_message_get_bool(req, "wait", TRUE),
        .grants = vm_message_get_bool(req, "grants", FALSE),
        .live = vm_message_get_bool(req, "live", FALSE),
    };
    g_autofree char *checkpoint = NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    GVariant *agent =
        hostd_fork(ctx, &fr, &checkpoint, vm_stream_writer_progress_func, reply, error);

    if (agent == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "agent", agent);
    g_variant_builder_add(&b, "{sv}", "checkpoint", g_variant_new_string(checkpoint));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_checkpoint_diff(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                             GError **error)
{
    gboolean truncated = FALSE;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    GVariant *changes = hostd_checkpoint_diff(
        ctx, hostd_req_name(req), vm_message_get_string(req, "checkpoint", NULL),
        vm_message_get_string(req, "other", NULL), vm_message_get_string(req, "path", NULL),
        &truncated, vm_stream_writer_progress_func, reply, error);

    if (changes == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "changes", changes);
    g_variant_builder_add(&b, "{sv}", "truncated", g_variant_new_boolean(truncated));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_egress_get(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    return hostd_reply1(reply, "egress", hostd_egress_get(ctx, hostd_req_name(req), error), error);
}

static gboolean
hostd_handle_egress_set(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    g_auto(GStrv) allow = vm_message_dup_strv(req, "allow");
    g_auto(GStrv) deny = vm_message_dup_strv(req, "deny");
    g_auto(GStrv) remove = vm_message_dup_strv(req, "remove");

    return hostd_reply1(reply, "egress",
                        hostd_egress_set(ctx, hostd_req_name(req), (const char *const *)allow,
                                         (const char *const *)deny, (const char *const *)remove,
                                         vm_message_get_bool(req, "reset", FALSE), error),
                        error);
}

static gboolean
hostd_handle_egress_presets(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                            GError **error)
{
    return hostd_reply1(reply, "presets", hostd_egress_presets(ctx), error);
}

/* Answers with a stream on the socket itself: hostd_egress_log() writes it, EXIT included. */
static gboolean
hostd_handle_egress_log(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    return hostd_egress_log(ctx, hostd_req_name(req), vm_message_get_bool(req, "follow", FALSE),
                            vm_message_get_uint(req, "lines", G_MAXUINT32), reply->fd, error);
}

static gboolean
hostd_handle_agent_set_restart(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                               GError **error)
{
    return hostd_reply1(reply, "agent",
                        hostd_agent_set_restart(ctx, hostd_req_name(req),
                                                vm_message_get_string(req, "policy", NULL), error),
                        error);
}

static gboolean
hostd_handle_agent_set_resources(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                 GError **error)
{
    const HostdResizeRequest rr = {
        .name = hostd_req_name(req),
        .cpus = vm_message_get_uint(req, "cpus", 0),
        .cpus_add = vm_message_get_uint(req, "cpus_add", 0),
        .memory_mib = vm_message_get_uint(req, "memory_mib", 0),
        .memory_add_mib = vm_message_get_uint(req, "memory_add_mib", 0),
        .disk_gib = vm_message_get_uint(req, "disk_gib", 0),
        .disk_add_gib = vm_message_get_uint(req, "disk_add_gib", 0),
    };
    g_auto(GStrv) changes = NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    GVariant *agent = hostd_agent_set_resources(ctx, &rr, &changes, error);

    if (agent == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "agent", agent);
    g_variant_builder_add(&b, "{sv}", "changes",
                          g_variant_new_strv((const char *const *)changes, -1));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_host_save_all(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    guint timeout_s = vm_message_get_uint(req, "timeout_s", ctx->config->shutdown_timeout_s);
    double seconds = 0;
    GVariant *agents = hostd_save_all(ctx, timeout_s, "vmctl stop-host-agents", &seconds);

    g_variant_builder_add(&b, "{sv}", "agents", agents);
    g_variant_builder_add(&b, "{sv}", "seconds", g_variant_new_double(seconds));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

/* Answers with a stream: hostd_events_send() writes it, EXIT included. */
static gboolean
hostd_handle_events(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply, GError **error)
{
    g_autoptr(GVariant) since = vm_message_lookup(req, "since");
    HostdEventsQuery query = {
        .agent = hostd_req_name(req),
        .since = since != NULL ? g_variant_get_int64(since) : 0,
        .lines = vm_message_get_uint(req, "lines", G_MAXUINT32),
        .follow = vm_message_get_bool(req, "follow", FALSE),
    };

    return hostd_events_send(ctx->events, &query, reply, error);
}

static gboolean
hostd_handle_forward_add(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                         GError **error)
{
    /* Every handler gets the reply of a HostdRequest: who asks decides about privileged ports. */
    gint64 uid = ((HostdRequest *)reply)->uid;

    return hostd_reply1(reply, "forward",
                        hostd_forward_add(ctx, hostd_req_name(req),
                                          vm_message_get_uint(req, "guest_port", 0),
                                          vm_message_get_uint(req, "host_port", 0), uid, error),
                        error);
}

static gboolean
hostd_handle_agent_authorize_add(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                 GError **error)
{
    g_auto(GStrv) lines = vm_message_dup_strv(req, "keys");
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    guint added = 0;
    GVariant *keys =
        hostd_authorize_add(ctx, hostd_req_name(req), (const char *const *)lines, &added, error);

    if (keys == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "keys", keys);
    g_variant_builder_add(&b, "{sv}", "added", g_variant_new_uint32(added));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_agent_authorize_rm(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                GError **error)
{
    return hostd_reply1(reply, "keys",
                        hostd_authorize_rm(ctx, hostd_req_name(req),
                                           vm_message_get_string(req, "fingerprint", NULL), error),
                        error);
}

static gboolean
hostd_handle_forward_rm(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    return hostd_forward_remove(ctx, hostd_req_name(req), vm_message_get_uint(req, "guest_port", 0),
                                error) &&
           hostd_reply(reply, NULL, error);
}

static gboolean
hostd_handle_forward_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                          GError **error)
{
    return hostd_reply1(reply, "forwards", hostd_forward_list(ctx, hostd_req_name(req), error),
                        error);
}

static gboolean
hostd_handle_agent_authorize_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                  GError **error)
{
    return hostd_reply1(reply, "keys", hostd_authorize_list(ctx, hostd_req_name(req), error),
                        error);
}

static gboolean
hostd_handle_secret_create(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    g_auto(GStrv) hosts = vm_message_dup_strv(req, "hosts");
    gsize value_len = 0;
    HostdSecretRequest sr = {
        .name = vm_message_get_string(req, "secret", NULL),
        .hosts = (const char *const *)hosts,
        .header = vm_message_get_string(req, "header", NULL),
        .format = vm_message_get_string(req, "format", NULL),
        .env = vm_message_get_string(req, "env", NULL),
        .value = vm_message_get_data(req, "value", &value_len),
    };

    sr.value_len = value_len;
    return hostd_reply1(reply, "secret", hostd_secret_create(ctx, &sr, error), error);
}

static gboolean
hostd_handle_secret_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                         GError **error)
{
    return hostd_reply1(reply, "secrets", hostd_secret_list(ctx, error), error);
}

static gboolean
hostd_handle_secret_set(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    gsize value_len = 0;
    const guint8 *value = vm_message_get_data(req, "value", &value_len);

    return hostd_reply1(
        reply, "secret",
        hostd_secret_set(ctx, vm_message_get_string(req, "secret", NULL), value, value_len, error),
        error);
}

static gboolean
hostd_handle_secret_rm(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                       GError **error)
{
    return hostd_reply1(reply, "revoked",
                        hostd_secret_rm(ctx, vm_message_get_string(req, "secret", NULL),
                                        vm_message_get_bool(req, "force", FALSE), error),
                        error);
}

static gboolean
hostd_handle_secret_grant(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                          GError **error)
{
    return hostd_reply1(reply, "secrets",
                        hostd_secret_grant(ctx, hostd_req_name(req),
                                           vm_message_get_string(req, "secret", NULL), error),
                        error);
}

static gboolean
hostd_handle_secret_revoke(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    return hostd_reply1(reply, "secrets",
                        hostd_secret_revoke(ctx, hostd_req_name(req),
                                            vm_message_get_string(req, "secret", NULL), error),
                        error);
}

/* Answers with a stream on the socket itself: hostd_agent_logs() writes it, EXIT included. */
static gboolean
hostd_handle_agent_logs(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    return hostd_agent_logs(ctx, hostd_req_name(req), vm_message_get_bool(req, "follow", FALSE),
                            vm_message_get_uint(req, "lines", G_MAXUINT32),
                            vm_message_get_bool(req, "cloud_init", FALSE), reply->fd, error);
}

static gboolean
hostd_handle_agent_stats(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                         GError **error)
{
    g_auto(GStrv) names = vm_message_dup_strv(req, "names");
    g_autoptr(GVariant) agents = hostd_stats_collect(ctx, (const char *const *)names, error);
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);

    if (agents == NULL)
        return FALSE;
    g_variant_builder_add(&b, "{sv}", "agents", agents);
    g_variant_builder_add(&b, "{sv}", "uptime_s",
                          g_variant_new_double(hostd_metrics_uptime(ctx->metrics)));
    if (ctx->ksm != NULL)
        g_variant_builder_add(&b, "{sv}", "ksm", hostd_ksm_figures(ctx->ksm));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_fleet_hosts(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                         GError **error)
{
    HostdCluster *cluster = hostd_context_fleet(ctx, error);
    if (cluster == NULL)
        return FALSE;
    return hostd_reply1(reply, "hosts", hostd_cluster_hosts(cluster, error), error);
}

static gboolean
hostd_handle_fleet_list(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    HostdCluster *cluster = hostd_context_fleet(ctx, error);
    if (cluster == NULL)
        return FALSE;
    return hostd_reply1(reply, "agents", hostd_cluster_agents(cluster, error), error);
}

static gboolean
hostd_handle_fleet_drain(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                         GError **error)
{
    HostdCluster *cluster = hostd_context_fleet(ctx, error);
    if (cluster == NULL)
        return FALSE;
    const char *host = vm_message_get_string(req, "host", "");
    gboolean drained = vm_message_get_bool(req, "drained", TRUE);
    gboolean changed = FALSE;
    if (!hostd_cluster_set_drained(cluster, host, drained, &changed, error))
        return FALSE;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "host", g_variant_new_string(host));
    g_variant_builder_add(&b, "{sv}", "drained", g_variant_new_boolean(drained));
    g_variant_builder_add(&b, "{sv}", "changed", g_variant_new_boolean(changed));
    return hostd_reply(reply, g_variant_builder_end(&b), error);
}

static gboolean
hostd_handle_move_out(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                      GError **error)
{
    const char *name = hostd_req_name(req);
    const char *step = vm_message_get_string(req, "step", "");
    const char *to = vm_message_get_string(req, "to", NULL);
    GVariant *result = NULL;

    if (g_str_equal(step, "plan"))
        result = hostd_move_plan(ctx, name, to, vm_stream_writer_progress_func, reply, error);
    else if (g_str_equal(step, "replica-plan"))
        result = hostd_replica_plan(ctx, name, error);
    else if (g_str_equal(step, "replica-done")) {
        g_auto(GStrv) hosts = vm_message_dup_strv(req, "hosts");
        result = hostd_replica_done(ctx, name, vm_message_get_string(req, "checkpoint", NULL),
                                    hosts, error);
    } else if (g_str_equal(step, "replica-abort"))
        result = hostd_replica_abort_out(ctx, name, error);
    else if (g_str_equal(step, "abort"))
        result = hostd_move_abort_out(ctx, name, error);
    else if (to == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "move-out step '%s' needs 'to'", step);
    else if (g_str_equal(step, "save"))
        result = hostd_move_save(ctx, name, to, vm_stream_writer_progress_func, reply, error);
    else if (g_str_equal(step, "done"))
        result = hostd_move_done(ctx, name, to, error);
    else
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no move-out step '%s'", step);
    return result != NULL && hostd_reply(reply, result, error);
}

static gboolean
hostd_handle_move_read(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                       GError **error)
{
    return hostd_move_read(ctx, hostd_req_name(req), vm_message_get_string(req, "file", ""), reply,
                           error);
}

static gboolean
hostd_handle_move_in(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply, GError **error)
{
    const char *step = vm_message_get_string(req, "step", "");
    g_autoptr(GVariant) epoch = vm_message_lookup(req, "epoch");
    g_auto(GStrv) files = vm_message_dup_strv(req, "files");
    HostdMoveIn in = {
        .name = hostd_req_name(req),
        .from = vm_message_get_string(req, "from", NULL),
        .epoch = epoch != NULL ? (guint64)MAX(g_variant_get_int64(epoch), 0) : 0,
        .template_name = vm_message_get_string(req, "template", NULL),
        .cpus = vm_message_get_uint(req, "cpus", 0),
        .memory_mib = vm_message_get_uint(req, "memory_mib", 0),
        .disk_gib = vm_message_get_uint(req, "disk_gib", 0),
        .base_sha256 = vm_message_get_string(req, "base_sha256", NULL),
        .source_dir = vm_message_get_string(req, "source_dir", NULL),
        .base_path = vm_message_get_string(req, "base_path", NULL),
        .warm_path = vm_message_get_string(req, "warm_path", NULL),
        .files = files,
    };
    GVariant *result = NULL;

    if (g_str_equal(step, "begin"))
        result = hostd_move_begin(ctx, &in, error);
    else if (g_str_equal(step, "commit"))
        result = hostd_move_commit(ctx, &in, vm_stream_writer_progress_func, reply, error);
    else if (g_str_equal(step, "abort"))
        result = hostd_move_abort_in(ctx, in.name, error);
    else if (g_str_equal(step, "replica-begin"))
        result = hostd_replica_begin(ctx, &in, error);
    else if (g_str_equal(step, "replica-commit"))
        result = hostd_replica_commit(ctx, in.name, vm_message_get_string(req, "checkpoint", NULL),
                                      files, error);
    else if (g_str_equal(step, "replica-abort"))
        result = hostd_replica_abort_in(ctx, in.name, error);
    else
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no move-in step '%s'", step);
    return result != NULL && hostd_reply(reply, result, error);
}

static gboolean
hostd_handle_move_write(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                        GError **error)
{
    g_autoptr(GVariant) size = vm_message_lookup(req, "size");
    return hostd_move_write(ctx, hostd_req_name(req), vm_message_get_string(req, "file", ""),
                            g_variant_get_int64(size), reply, error);
}

static gboolean
hostd_handle_agent_recover(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                           GError **error)
{
    GVariant *result = hostd_replica_recover(ctx, hostd_req_name(req),
                                             vm_stream_writer_progress_func, reply, error);
    return result != NULL && hostd_reply(reply, result, error);
}

static gboolean
hostd_handle_agent_set_replicate(HostdContext *ctx, const VmMessage *req, VmStreamWriter *reply,
                                 GError **error)
{
    g_autoptr(GVariant) copies = vm_message_lookup(req, "copies");
    GVariant *result = hostd_replica_set(ctx, hostd_req_name(req), copies != NULL,
                                         copies != NULL ? g_variant_get_uint32(copies) : 0, error);
    return result != NULL && hostd_reply(reply, result, error);
}

/* Which function serves each request, and whether it changes something. The fields a request may
 * carry, and what ends its reply, are in the schema table in common/vm-protocol.c, checked
 * before a handler runs. */
static const struct {
    VmOp op;
    HostdHandler handler;
    HostdRequestFlags flags;
} hostd_handlers[] = {
    {VM_OP_PING, hostd_handle_ping, HOSTD_REQUEST_READS},
    {VM_OP_TEMPLATE_LIST, hostd_handle_template_list, HOSTD_REQUEST_READS},
    {VM_OP_TEMPLATE_BUILD, hostd_handle_template_build,
     HOSTD_REQUEST_CHANGES | HOSTD_REQUEST_TEMPLATE},
    {VM_OP_AGENT_NEW, hostd_handle_agent_new, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_LIST, hostd_handle_agent_list, HOSTD_REQUEST_READS},
    {VM_OP_AGENT_INFO, hostd_handle_agent_info, HOSTD_REQUEST_READS},
    {VM_OP_AGENT_START, hostd_handle_agent_start, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_STOP, hostd_handle_agent_stop, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_RM, hostd_handle_agent_rm, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_SSH_CONFIG, hostd_handle_agent_ssh_config, HOSTD_REQUEST_READS},
    {VM_OP_EXEC, hostd_handle_exec, HOSTD_REQUEST_CHANGES},
    {VM_OP_CHECKPOINT_CREATE, hostd_handle_checkpoint_create, HOSTD_REQUEST_CHANGES},
    {VM_OP_CHECKPOINT_LIST, hostd_handle_checkpoint_list, HOSTD_REQUEST_READS},
    {VM_OP_CHECKPOINT_RESTORE, hostd_handle_checkpoint_restore, HOSTD_REQUEST_CHANGES},
    {VM_OP_CHECKPOINT_RM, hostd_handle_checkpoint_rm, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_SUSPEND, hostd_handle_agent_suspend, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_RESUME, hostd_handle_agent_resume, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_KEEP_AWAKE, hostd_handle_agent_keep_awake, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_SET_IDLE, hostd_handle_agent_set_idle, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_SET_CHECKPOINTS, hostd_handle_agent_set_checkpoints, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_FORK, hostd_handle_agent_fork, HOSTD_REQUEST_CHANGES},
    {VM_OP_CHECKPOINT_DIFF, hostd_handle_checkpoint_diff, HOSTD_REQUEST_READS},
    {VM_OP_EGRESS_GET, hostd_handle_egress_get, HOSTD_REQUEST_READS},
    {VM_OP_EGRESS_SET, hostd_handle_egress_set, HOSTD_REQUEST_CHANGES},
    {VM_OP_EGRESS_LOG, hostd_handle_egress_log, HOSTD_REQUEST_READS},
    {VM_OP_AGENT_SET_RESTART, hostd_handle_agent_set_restart, HOSTD_REQUEST_CHANGES},
    {VM_OP_HOST_SAVE_ALL, hostd_handle_host_save_all, HOSTD_REQUEST_CHANGES},
    {VM_OP_EVENTS, hostd_handle_events, HOSTD_REQUEST_READS},
    {VM_OP_FORWARD_ADD, hostd_handle_forward_add, HOSTD_REQUEST_CHANGES},
    {VM_OP_FORWARD_RM, hostd_handle_forward_rm, HOSTD_REQUEST_CHANGES},
    {VM_OP_FORWARD_LIST, hostd_handle_forward_list, HOSTD_REQUEST_READS},
    {VM_OP_AGENT_AUTHORIZE_ADD, hostd_handle_agent_authorize_add, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_AUTHORIZE_RM, hostd_handle_agent_authorize_rm, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_AUTHORIZE_LIST, hostd_handle_agent_authorize_list, HOSTD_REQUEST_READS},
    {VM_OP_SECRET_CREATE, hostd_handle_secret_create, HOSTD_REQUEST_CHANGES},
    {VM_OP_SECRET_LIST, hostd_handle_secret_list, HOSTD_REQUEST_READS},
    {VM_OP_EGRESS_PRESETS, hostd_handle_egress_presets, HOSTD_REQUEST_READS},
    {VM_OP_SECRET_SET, hostd_handle_secret_set, HOSTD_REQUEST_CHANGES},
    {VM_OP_SECRET_RM, hostd_handle_secret_rm, HOSTD_REQUEST_CHANGES},
    {VM_OP_SECRET_GRANT, hostd_handle_secret_grant, HOSTD_REQUEST_CHANGES},
    {VM_OP_SECRET_REVOKE, hostd_handle_secret_revoke, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_SET_RESOURCES, hostd_handle_agent_set_resources, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_LOGS, hostd_handle_agent_logs, HOSTD_REQUEST_READS},
    {VM_OP_AGENT_STATS, hostd_handle_agent_stats, HOSTD_REQUEST_READS},
    {VM_OP_FLEET_HOSTS, hostd_handle_fleet_hosts, HOSTD_REQUEST_READS},
    {VM_OP_FLEET_LIST, hostd_handle_fleet_list, HOSTD_REQUEST_READS},
    {VM_OP_FLEET_DRAIN, hostd_handle_fleet_drain, HOSTD_REQUEST_CHANGES},
    {VM_OP_MOVE_OUT, hostd_handle_move_out, HOSTD_REQUEST_CHANGES},
    {VM_OP_MOVE_READ, hostd_handle_move_read, HOSTD_REQUEST_READS},
    {VM_OP_MOVE_IN, hostd_handle_move_in, HOSTD_REQUEST_CHANGES},
    {VM_OP_MOVE_WRITE, hostd_handle_move_write, HOSTD_REQUEST_READS},
    {VM_OP_AGENT_RECOVER, hostd_handle_agent_recover, HOSTD_REQUEST_CHANGES},
    {VM_OP_AGENT_SET_REPLICATE, hostd_handle_agent_set_replicate, HOSTD_REQUEST_CHANGES},
};

/* The row of @op in hostd_handlers, or -1. */
static gssize
hostd_handler_index(VmOp op)
{
    for (gsize i = 0; i < G_N_ELEMENTS(hostd_handlers); i++) {
        if (hostd_handlers[i].op == op)
            return (gssize)i;
    }
    return -1;
}

typedef enum {
    HOSTD_ROUTE_HERE,     /* this host serves it */
    HOSTD_ROUTE_ANSWERED, /* ELSEWHERE went out: another host of the fleet serves it */
    HOSTD_ROUTE_FAILED,   /* it cannot be served: the error says why */
} HostdRoute;

/* The agent a request is about, when it is one that exists already: a fork's source, else its
 * "name"; NULL for a new agent's name, a template's, or none. */
static const char *
hostd_route_agent(const VmMessage *req, HostdRequestFlags flags)
{
    /* A move's target is asked about an agent that is not its own yet, on purpose. */
    if (req->op == VM_OP_AGENT_NEW || req->op == VM_OP_MOVE_IN || req->op == VM_OP_MOVE_WRITE ||
        req->op == VM_OP_AGENT_RECOVER || (flags & HOSTD_REQUEST_TEMPLATE))
        return NULL;
    return vm_message_get_string(req, req->op == VM_OP_AGENT_FORK ? "source" : "name", NULL);
}

/* Where a recovery goes: the host "to" names, when it is another live one (*@ret_host at
 * *@ret_address), else this host (NULL). */
static gboolean
hostd_route_recover(HostdContext *ctx, const VmMessage *req, char **ret_host, char **ret_address,
                    GError **error)
{
    const char *to = vm_message_get_string(req, "to", NULL);
    if (to == NULL || ctx->cluster == NULL || g_str_equal(to, hostd_cluster_host_id(ctx->cluster)))
        return TRUE;
    g_autoptr(GVariant) hosts = hostd_cluster_hosts(ctx->cluster, error);
    if (hosts == NULL)
        return FALSE;
    GVariantIter it;
    GVariant *host;
    g_variant_iter_init(&it, hosts);
    while ((host = g_variant_iter_next_value(&it)) != NULL) {
        g_autoptr(GVariant) owned = host;
        const char *id = NULL, *address = NULL;
        gboolean live = FALSE;
        if (!g_variant_lookup(host, "id", "&s", &id) || !g_str_equal(id, to))
            continue;
        g_variant_lookup(host, "address", "&s", &address);
        g_variant_lookup(host, "live", "b", &live);
        if (!live || address == NULL || address[0] == '\0')
            return vm_throw(error, VM_ERROR_BAD_STATE, "host '%s' is down", to);
        *ret_host = g_strdup(to);
        *ret_address = g_strdup(address);
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_NOT_FOUND, "no host '%s' in the fleet", to);
}

/* Where a new agent goes in a fleet (the host "on" names, else where placement puts it): to
 * *@ret_host at *@ret_address, or NULL for this host. Without a fleet: here, and "on" is
 * refused. */
static gboolean
hostd_route_new(HostdContext *ctx, const VmMessage *req, char **ret_host, char **ret_address,
                GError **error)
{
    const char *on = vm_message_get_string(req, "on", NULL);
    const char *template_name = vm_message_get_string(req, "template", HOSTD_DEFAULT_TEMPLATE);
    guint64 memory_mib = vm_message_get_uint(req, "memory_mib", 0);

    *ret_host = NULL;
    *ret_address = NULL;
    if (ctx->cluster == NULL) {
        if (on != NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "cannot make the agent on host '%s': this host is in no fleet "
                            "(hostd's configuration has no [cluster])",
                            on);
        return TRUE;
    }
    if (memory_mib == 0) {
        /* The template's memory where this host has it: a host without the room is passed
         * over. */
        g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, template_name, NULL);
        memory_mib = tpl != NULL ? tpl->memory_mib : 0;
    }
    g_autofree char *host = NULL;
    g_autofree char *address = NULL;
    if (!hostd_cluster_place(ctx->cluster, on, template_name, memory_mib, &host, &address, error))
        return FALSE;
    if (g_str_equal(host, hostd_cluster_host_id(ctx->cluster)))
        return TRUE;
    *ret_host = g_steal_pointer(&host);
    *ret_address = g_steal_pointer(&address);
    return TRUE;
}

/* In a fleet, a request for another host goes there: a new agent placed on another host, a
 * request about an agent another live host owns (whatever is here by that name is served
 * here). It is answered with ELSEWHERE, which the client follows once. An agent whose host is
 * down fails clearly; without etcd each host serves what it has. */
static HostdRoute
hostd_route(HostdContext *ctx, const VmMessage *req, HostdRequestFlags flags, VmStreamWriter *reply,
            GError **error)
{
    g_autofree char *host = NULL;
    g_autofree char *address = NULL;
    g_autofree char *message = NULL;
    const char *name = vm_message_get_string(req, "name", "");

    if (req->op == VM_OP_AGENT_NEW) {
        if (!hostd_route_new(ctx, req, &host, &address, error))
            return HOSTD_ROUTE_FAILED;
        if (host == NULL)
            return HOSTD_ROUTE_HERE;
        message =
            g_strdup_printf("agent '%s' is to be made on host '%s' (%s)", name, host, address);
    } else if (req->op == VM_OP_AGENT_RECOVER) {
        if (!hostd_route_recover(ctx, req, &host, &address, error))
            return HOSTD_ROUTE_FAILED;
        if (host == NULL)
            return HOSTD_ROUTE_HERE;
        message =
            g_strdup_printf("agent '%s' is to be recovered on host '%s' (%s)", name, host, address);
    } else {
        const char *agent = hostd_route_agent(req, flags);
        gboolean live = FALSE;
        g_autoptr(GError) local_error = NULL;
        if (ctx->cluster == NULL || agent == NULL || !vm_name_validate(agent, NULL))
            return HOSTD_ROUTE_HERE;
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, agent, NULL);
        if (dom != NULL)
            return HOSTD_ROUTE_HERE;
        /* etcd away: this host's agents only, as without a fleet. */
        if (!hostd_cluster_locate(ctx->cluster, agent, &host, &address, &live, &local_error) ||
            host == NULL)
            return HOSTD_ROUTE_HERE;
        if (!live) {
            vm_throw(error, VM_ERROR_NOT_RUNNING, "agent '%s' is on host '%s', which is down",
                     agent, host);
            return HOSTD_ROUTE_FAILED;
        }
        message = g_strdup_printf("agent '%s' is on host '%s' (%s)", agent, host, address);
    }
    /* A client that went away only loses its answer. */
    (void)vm_stream_writer_elsewhere(reply, host, address, message, NULL);
    return HOSTD_ROUTE_ANSWERED;
}

gboolean
hostd_server_handles(VmOp op)
{
    return hostd_handler_index(op) >= 0;
}

void
hostd_server_serve_fd(HostdContext *ctx, int fd_in)
{
    vm_autofd fd = fd_in;
    g_autoptr(GError) error = NULL;
    gboolean eof = FALSE;

    /* A client that never sends its whole request, or never reads its answer, must not hold a
     * thread for long: the request is due within request-timeout however its bytes are spaced,
     * and a reply that cannot be sent for HOSTD_SEND_TIMEOUT_S fails. Streams (exec, follow)
     * are the client's to pace: no send timeout there. */
    struct timeval send_timeout = {.tv_sec = HOSTD_SEND_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    gint64 deadline =
        g_get_monotonic_time() + (gint64)ctx->config->request_timeout_s * G_USEC_PER_SEC;
    g_autoptr(VmMessage) req = vm_message_read_fd_until(fd, deadline, &eof, &error);
    if (req != NULL && vm_op_reply_end(req->op) != VM_OP_RESULT) {
        struct timeval none = {0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
    }

    HostdRequest request = {
        .reply = VM_STREAM_WRITER_INIT(fd),
        .ctx = ctx,
        .req = req,
    };
    gssize row;

    hostd_peer_cred(fd, &request.uid, &request.pid);
    if (req == NULL) {
        if (!eof) {
            g_autofree char *who = hostd_request_caller(&request);
            g_autofree char *message = hostd_log_safe(error->message);

            g_message("bad request: %s%s", message, who);
            /* A client that went away only loses its answer. */
            (void)vm_stream_writer_error(&request.reply, error, NULL);
        }
        return;
    }
    if (!vm_op_is_request(req->op)) {
        vm_throw(&error, VM_ERROR_PROTOCOL, "first message must be a request, not %s",
                 vm_op_name(req->op));
        hostd_request_log(&request, error);
        (void)vm_stream_writer_error(&request.reply, error, NULL);
        return;
    }
    /* Every request has one; test-server checks that. */
    row = hostd_handler_index(req->op);
    if (row < 0) {
        vm_throw(&error, VM_ERROR_PROTOCOL, "%s is not served by this hostd", vm_op_name(req->op));
        hostd_request_log(&request, error);
        (void)vm_stream_writer_error(&request.reply, error, NULL);
        return;
    }
    request.flags = hostd_handlers[row].flags;

    switch (hostd_route(ctx, req, request.flags, &request.reply, &error)) {
    case HOSTD_ROUTE_ANSWERED:
        /* Nothing was done here: no event; the log says where it went. */
        if ((request.flags & HOSTD_REQUEST_CHANGES) || ctx->debug) {
            g_autofree char *who = hostd_request_caller(&request);
            g_autofree char *name = hostd_log_safe(vm_message_get_string(req, "name", ""));
            g_message("%s %s sent to another host of the fleet%s", vm_op_name(req->op), name, who);
        }
        return;
    case HOSTD_ROUTE_FAILED:
        hostd_request_log(&request, error);
        hostd_request_record(&request, error);
        (void)vm_stream_writer_error(&request.reply, error, NULL);
        return;
    case HOSTD_ROUTE_HERE:
    default:
        break;
    }

    gint64 started = g_get_monotonic_time();
    gboolean ok = hostd_handlers[row].handler(ctx, req, &request.reply, &error);
    hostd_metrics_request(ctx->metrics, vm_op_name(req->op), g_get_monotonic_time() - started);
    /* A failure is logged before the client hears it, as its event is recorded. */
    if (!ok) {
        hostd_request_log(&request, error);
        hostd_request_record(&request, error);
        if (!request.reply.ended)
            (void)vm_stream_writer_error(&request.reply, error, NULL);
    }
    /* A stream (exec) ended on its own: its event comes after. */
    hostd_request_record(&request, error);
    if (ok)
        hostd_request_log(&request, NULL);
}

guint
hostd_server_active_clients(void)
{
    g_mutex_lock(&hostd_clients_lock);
    guint n = (guint)hostd_active_clients;
    g_mutex_unlock(&hostd_clients_lock);
    return n;
}

gboolean
hostd_server_quiet_after_work(guint64 *seen)
{
    g_mutex_lock(&hostd_clients_lock);
    gboolean quiet = hostd_active_clients == 0 && hostd_clients_ended != *seen;
    if (quiet)
        *seen = hostd_clients_ended;
    g_mutex_unlock(&hostd_clients_lock);
    return quiet;
}

static gpointer
hostd_client_thread(gpointer data)
{
    HostdClient *client = data;
    hostd_server_serve_fd(client->ctx, client->fd);
    g_mutex_lock(&hostd_clients_lock);
    hostd_active_clients--;
    hostd_clients_ended++;
    g_cond_signal(&hostd_clients_freed);
    g_mutex_unlock(&hostd_clients_lock);
    g_free(client);
    return NULL;
}

static gpointer
hostd_accept_thread(gpointer data)
{
    HostdServer *server = data;
    struct pollfd fds[2] = {
        {.fd = server->listen_fd, .events = POLLIN},
        {.fd = server->wake_pipe[0], .events = POLLIN},
    };

    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[1].revents != 0)
            break;
        int fd = accept4(server->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        /* Past the limit the accept waits for a slot: later clients queue in the backlog. */
        gint64 deadline = g_get_monotonic_time() + HOSTD_CLIENT_QUEUE_US;
        gboolean admitted = TRUE;
        g_mutex_lock(&hostd_clients_lock);
        while (hostd_active_clients >= HOSTD_MAX_CLIENTS && admitted)
            admitted = g_cond_wait_until(&hostd_clients_freed, &hostd_clients_lock, deadline) ||
                       hostd_active_clients < HOSTD_MAX_CLIENTS;
        if (admitted)
            hostd_active_clients++;
        g_mutex_unlock(&hostd_clients_lock);
        if (!admitted) {
            g_autoptr(GError) error = NULL;
            vm_throw(&error, VM_ERROR_NO_RESOURCES, "hostd is serving too many requests");
            VmStreamWriter reply = VM_STREAM_WRITER_INIT(fd);
            (void)vm_stream_writer_error(&reply, error, NULL);
            close(fd);
            continue;
        }
        HostdClient *client = g_new0(HostdClient, 1);
        client->ctx = server->ctx;
        client->fd = fd;
        g_thread_unref(g_thread_new("hostd-client", hostd_client_thread, client));
    }
    return NULL;
}

static gboolean
hostd_socket_in_use(const struct sockaddr_un *sa)
{
    vm_autofd fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    return fd >= 0 && connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0;
}

HostdServer *
hostd_server_start(HostdContext *ctx, const char *socket_path, const char *group, GError **error)
{
    struct sockaddr_un sa;
    socklen_t sa_len;

    if (!vm_unix_address(socket_path, &sa, &sa_len, error))
        return NULL;

    gid_t gid = (gid_t)-1;
    if (group != NULL) {
        struct group *gr = getgrnam(group);
        if (gr == NULL) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no group '%s'", group);
            return NULL;
        }
        gid = gr->gr_gid;
    }

    g_autofree char *parent = g_path_get_dirname(socket_path);
    if (g_mkdir_with_parents(parent, 0755) < 0) {
        vm_throw_errno(error, errno, "cannot create %s", parent);
        return NULL;
    }
    if (g_file_test(socket_path, G_FILE_TEST_EXISTS)) {
        if (hostd_socket_in_use(&sa)) {
            vm_throw(error, VM_ERROR_BUSY, "another hostd is listening on %s", socket_path);
            return NULL;
        }
        g_unlink(socket_path);
    }

    vm_autofd fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        vm_throw_errno(error, errno, "socket");
        return NULL;
    }
    /* The mode is set before listen(), so no client can connect through a wider one. */
    if (bind(fd, (struct sockaddr *)&sa, sa_len) < 0) {
        vm_throw_errno(error, errno, "cannot bind %s", socket_path);
        return NULL;
    }
    if (chmod(socket_path, group != NULL ? 0660 : 0600) < 0 ||
        (group != NULL && chown(socket_path, (uid_t)-1, gid) < 0)) {
        vm_throw_errno(error, errno, "cannot set the mode of %s", socket_path);
        g_unlink(socket_path);
        return NULL;
    }
    if (listen(fd, HOSTD_MAX_CLIENTS) < 0) {
        vm_throw_errno(error, errno, "cannot listen on %s", socket_path);
        g_unlink(socket_path);
        return NULL;
    }

    HostdServer *server = g_new0(HostdServer, 1);
    server->ctx = ctx;
    server->socket_path = g_strdup(socket_path);
    server->listen_fd = fd;
    fd = -1;
    if (!g_unix_open_pipe(server->wake_pipe, FD_CLOEXEC, NULL))
        g_error("cannot create a pipe");
    server->accept_thread = g_thread_new("hostd-accept", hostd_accept_thread, server);
    return server;
}

void
hostd_server_stop(HostdServer *server)
{
    if (server == NULL)
        return;
    if (write(server->wake_pipe[1], "x", 1) < 0) {
        /* The accept thread then only ends with the process, which is what happens next. */
    }
    g_thread_join(server->accept_thread);
    close(server->listen_fd);
    close(server->wake_pipe[0]);
    close(server->wake_pipe[1]);
    g_unlink(server->socket_path);
    g_free(server->socket_path);
    g_free(server);
}
