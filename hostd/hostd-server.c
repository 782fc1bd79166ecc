#include "hostd-server.h"

#include "hostd-checkpoint-files.h"
#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-fork.h"
#include "hostd-power.h"

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
#include "vm-protocol.h"
#include "vm-util.h"

#define HOSTD_MAX_CLIENTS       64
#define HOSTD_REQUEST_TIMEOUT_S 30

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

static gint hostd_active_clients = 0;

static void
hostd_send(int fd, VmMessage *message)
{
    /* A client that went away only loses its answer; the operation itself is done. */
    vm_message_write_fd(fd, message, NULL);
}

static void
hostd_send_result(int fd, GVariant *fields)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(VmMessage) m = vm_message_new(VM_OP_RESULT, fields, &error);
    if (m != NULL)
        hostd_send(fd, m);
}

static void
hostd_send_progress(const char *message, double fraction, gpointer user_data)
{
    g_autoptr(VmMessage) m = vm_message_new_progress(message, fraction);
    hostd_send(GPOINTER_TO_INT(user_data), m);
}

static GVariant *
hostd_fields1(const char *key, GVariant *value)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", key, value);
    return g_variant_builder_end(&b);
}

/* Runs one request; returns the RESULT fields or NULL with @error set. EXEC answers on the
 * socket itself and returns an empty dictionary that is not sent (see *ret_streamed). */
static GVariant *
hostd_dispatch(HostdContext *ctx, int fd, const VmMessage *req, gboolean *ret_streamed,
               GError **error)
{
    const char *name = vm_message_get_string(req, "name", NULL);
    gpointer pdata = GINT_TO_POINTER(fd);

    *ret_streamed = FALSE;
    switch (req->op) {
    case VM_OP_PING: {
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "version", g_variant_new_string(VM_VERSION));
        g_variant_builder_add(&b, "{sv}", "protocol", g_variant_new_uint32(VM_PROTOCOL_VERSION));
        g_variant_builder_add(&b, "{sv}", "virt_type", g_variant_new_string(ctx->lv->virt_type));
        g_variant_builder_add(&b, "{sv}", "uri", g_variant_new_string(ctx->lv->uri));
        return g_variant_builder_end(&b);
    }
    case VM_OP_TEMPLATE_LIST: {
        GVariant *list = hostd_template_list(ctx, error);
        return list != NULL ? hostd_fields1("templates", list) : NULL;
    }
    case VM_OP_TEMPLATE_BUILD: {
        g_autofree char *image = hostd_template_build(
            ctx, name, vm_message_get_bool(req, "force", FALSE), hostd_send_progress, pdata, error);
        if (image == NULL)
            return NULL;
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(name));
        g_variant_builder_add(&b, "{sv}", "image", g_variant_new_string(image));
        return g_variant_builder_end(&b);
    }
    case VM_OP_AGENT_NEW: {
        HostdNewRequest nr = {
            .name = name,
            .template_name = vm_message_get_string(req, "template", NULL),
            .cpus = vm_message_get_uint(req, "cpus", 0),
            .memory_mib = vm_message_get_uint(req, "memory_mib", 0),
            .disk_gib = vm_message_get_uint(req, "disk_gib", 0),
            .user_data = vm_message_get_string(req, "user_data", NULL),
            .wait = vm_message_get_bool(req, "wait", TRUE),
        };
        GVariant *agent = hostd_agent_new(ctx, &nr, hostd_send_progress, pdata, error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_FORK: {
        HostdForkRequest fr = {
            .name = name,
            .source = vm_message_get_string(req, "source", NULL),
            .checkpoint = vm_message_get_string(req, "checkpoint", NULL),
            .cpus = vm_message_get_uint(req, "cpus", 0),
            .memory_mib = vm_message_get_uint(req, "memory_mib", 0),
            .wait = vm_message_get_bool(req, "wait", TRUE),
        };
        g_autofree char *checkpoint = NULL;
        GVariant *agent = hostd_fork(ctx, &fr, &checkpoint, hostd_send_progress, pdata, error);
        if (agent == NULL)
            return NULL;
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "agent", agent);
        g_variant_builder_add(&b, "{sv}", "checkpoint", g_variant_new_string(checkpoint));
        return g_variant_builder_end(&b);
    }
    case VM_OP_AGENT_LIST: {
        GVariant *list = hostd_agent_list(ctx, error);
        return list != NULL ? hostd_fields1("agents", list) : NULL;
    }
    case VM_OP_AGENT_INFO: {
        GVariant *agent = hostd_agent_info(ctx, name, error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_START: {
        GVariant *agent = hostd_agent_start(ctx, name, vm_message_get_bool(req, "wait", TRUE),
                                            hostd_send_progress, pdata, error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_STOP: {
        GVariant *agent = hostd_agent_stop(ctx, name, vm_message_get_bool(req, "force", FALSE),
                                           vm_message_get_uint(req, "timeout_s", 0),
                                           hostd_send_progress, pdata, error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_RM:
        if (!hostd_agent_rm(ctx, name, vm_message_get_bool(req, "force", FALSE), error))
            return NULL;
        return g_variant_new_array(G_VARIANT_TYPE("{sv}"), NULL, 0);
    case VM_OP_AGENT_SSH_CONFIG: {
        g_autofree char *path = NULL, *host = NULL;
        g_autofree char *config = hostd_agent_ssh_config(ctx, name, &path, &host, error);
        if (config == NULL)
            return NULL;
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "config", g_variant_new_string(config));
        if (path != NULL) {
            g_variant_builder_add(&b, "{sv}", "path", g_variant_new_string(path));
            g_variant_builder_add(&b, "{sv}", "host", g_variant_new_string(host));
        }
        return g_variant_builder_end(&b);
    }
    case VM_OP_EXEC: {
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
        if (!hostd_agent_exec(ctx, name, &er, fd, error))
            return NULL;
        *ret_streamed = TRUE;
        return g_variant_new_array(G_VARIANT_TYPE("{sv}"), NULL, 0);
    }
    case VM_OP_CHECKPOINT_CREATE: {
        g_autofree char *warning = NULL;
        GVariant *c =
            hostd_checkpoint_create(ctx, name, vm_message_get_string(req, "label", NULL), FALSE,
                                    vm_message_get_bool(req, "memory", FALSE), &warning, error);
        if (c == NULL)
            return NULL;
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "checkpoint", c);
        if (warning != NULL)
            g_variant_builder_add(&b, "{sv}", "warning", g_variant_new_string(warning));
        return g_variant_builder_end(&b);
    }
    case VM_OP_CHECKPOINT_LIST: {
        GVariant *list = hostd_checkpoint_list(ctx, name, error);
        return list != NULL ? hostd_fields1("checkpoints", list) : NULL;
    }
    case VM_OP_CHECKPOINT_RESTORE: {
        g_autofree char *undo = NULL;
        g_auto(GStrv) paths = vm_message_dup_strv(req, "paths");
        const char *checkpoint = vm_message_get_string(req, "checkpoint", NULL);
        GVariant *agent =
            paths != NULL
                ? hostd_checkpoint_restore_paths(ctx, name, checkpoint, (const char *const *)paths,
                                                 &undo, hostd_send_progress, pdata, error)
                : hostd_checkpoint_restore(ctx, name, checkpoint,
                                           vm_message_get_bool(req, "wait", TRUE), &undo,
                                           hostd_send_progress, pdata, error);
        if (agent == NULL)
            return NULL;
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "agent", agent);
        g_variant_builder_add(&b, "{sv}", "undo", g_variant_new_string(undo ? undo : ""));
        return g_variant_builder_end(&b);
    }
    case VM_OP_CHECKPOINT_DIFF: {
        gboolean truncated = FALSE;
        GVariant *changes = hostd_checkpoint_diff(
            ctx, name, vm_message_get_string(req, "checkpoint", NULL),
            vm_message_get_string(req, "other", NULL), vm_message_get_string(req, "path", NULL),
            &truncated, hostd_send_progress, pdata, error);
        if (changes == NULL)
            return NULL;
        g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&b, "{sv}", "changes", changes);
        g_variant_builder_add(&b, "{sv}", "truncated", g_variant_new_boolean(truncated));
        return g_variant_builder_end(&b);
    }
    case VM_OP_CHECKPOINT_RM:
        if (!hostd_checkpoint_rm(ctx, name, vm_message_get_string(req, "checkpoint", NULL), error))
            return NULL;
        return g_variant_new_array(G_VARIANT_TYPE("{sv}"), NULL, 0);
    case VM_OP_AGENT_SUSPEND: {
        GVariant *agent =
            hostd_agent_suspend(ctx, name, vm_message_get_bool(req, "save", FALSE), error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_RESUME: {
        GVariant *agent = hostd_agent_resume(ctx, name, error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_KEEP_AWAKE: {
        GVariant *agent = hostd_agent_keep_awake(ctx, name, vm_message_get_uint(req, "seconds", 0),
                                                 vm_message_get_bool(req, "off", FALSE), error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_SET_IDLE: {
        GVariant *agent = hostd_agent_set_idle(ctx, name, vm_message_get_bool(req, "never", FALSE),
                                               vm_message_get_uint(req, "pause_s", 0),
                                               vm_message_get_uint(req, "save_s", 0), error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_AGENT_SET_CHECKPOINTS: {
        /* Absent hourly/daily leave the agent's as they are. */
        g_autoptr(GVariant) hourly = vm_message_lookup(req, "hourly");
        g_autoptr(GVariant) daily = vm_message_lookup(req, "daily");
        GVariant *agent = hostd_agent_set_checkpoints(
            ctx, name, vm_message_get_bool(req, "never", FALSE),
            vm_message_get_uint(req, "every_s", 0), vm_message_get_uint(req, "keep", 0),
            hourly != NULL ? (gint)g_variant_get_uint32(hourly) : -1,
            daily != NULL ? (gint)g_variant_get_uint32(daily) : -1, error);
        return agent != NULL ? hostd_fields1("agent", agent) : NULL;
    }
    case VM_OP_EGRESS_GET: {
        GVariant *egress = hostd_egress_get(ctx, name, error);
        return egress != NULL ? hostd_fields1("egress", egress) : NULL;
    }
    case VM_OP_EGRESS_SET: {
        g_auto(GStrv) allow = vm_message_dup_strv(req, "allow");
        g_auto(GStrv) deny = vm_message_dup_strv(req, "deny");
        g_auto(GStrv) remove = vm_message_dup_strv(req, "remove");
        GVariant *egress = hostd_egress_set(ctx, name, (const char *const *)allow,
                                            (const char *const *)deny, (const char *const *)remove,
                                            vm_message_get_bool(req, "reset", FALSE), error);
        return egress != NULL ? hostd_fields1("egress", egress) : NULL;
    }
    case VM_OP_EGRESS_LOG:
        if (!hostd_egress_log(ctx, name, vm_message_get_bool(req, "follow", FALSE),
                              vm_message_get_uint(req, "lines", G_MAXUINT32), fd, error))
            return NULL;
        *ret_streamed = TRUE;
        return g_variant_new_array(G_VARIANT_TYPE("{sv}"), NULL, 0);
    default:
        vm_throw(error, VM_ERROR_PROTOCOL, "%s is not a request",
                 vm_op_name(req->op) ? vm_op_name(req->op) : "unknown op");
        return NULL;
    }
}

void
hostd_server_serve_fd(HostdContext *ctx, int fd_in)
{
    vm_autofd fd = fd_in;
    g_autoptr(GError) error = NULL;
    gboolean eof = FALSE;

    /* A client that connects and never speaks must not hold a thread forever. */
    struct timeval tv = {.tv_sec = HOSTD_REQUEST_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    g_autoptr(VmMessage) req = vm_message_read_fd(fd, &eof, &error);
    struct timeval none = {0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));

    if (req == NULL) {
        if (!eof) {
            g_message("bad request: %s", error->message);
            g_autoptr(VmMessage) m = vm_message_new_error(error);
            hostd_send(fd, m);
        }
        return;
    }
    if (!vm_op_is_request(req->op)) {
        vm_throw(&error, VM_ERROR_PROTOCOL, "first message must be a request, not %s",
                 vm_op_name(req->op));
        g_autoptr(VmMessage) m = vm_message_new_error(error);
        hostd_send(fd, m);
        return;
    }

    gboolean streamed = FALSE;
    g_autoptr(GVariant) result = hostd_dispatch(ctx, fd, req, &streamed, &error);
    if (result != NULL)
        g_variant_ref_sink(result);
    if (result == NULL) {
        const char *name = vm_message_get_string(req, "name", NULL);
        if (!g_error_matches(error, VM_ERROR, VM_ERROR_CANCELLED))
            g_message("%s%s%s failed: %s", vm_op_name(req->op), name ? " " : "", name ? name : "",
                      error->message);
        g_autoptr(VmMessage) m = vm_message_new_error(error);
        hostd_send(fd, m);
        return;
    }
    if (!streamed)
        hostd_send_result(fd, g_steal_pointer(&result));
}

static gpointer
hostd_client_thread(gpointer data)
{
    HostdClient *client = data;
    hostd_server_serve_fd(client->ctx, client->fd);
    g_atomic_int_dec_and_test(&hostd_active_clients);
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
        if (g_atomic_int_add(&hostd_active_clients, 1) >= HOSTD_MAX_CLIENTS) {
            g_atomic_int_dec_and_test(&hostd_active_clients);
            g_autoptr(GError) error = NULL;
            vm_throw(&error, VM_ERROR_NO_RESOURCES, "hostd is serving too many requests");
            g_autoptr(VmMessage) m = vm_message_new_error(error);
            hostd_send(fd, m);
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
    if (listen(fd, 64) < 0) {
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
