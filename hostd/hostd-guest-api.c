/* The in-guest API: a libsoup server per agent on a thread of its own; see hostd-guest-api.h.
 *
 * Threads: the API's thread owns every SoupServer, listening socket, connection and request
 * (everything libsoup touches, and the fields marked "API thread" below); a pool runs the work
 * of requests and hands the answer back to the API's thread; a restore runs on a thread of its
 * own. Agent starts and stops come from request threads and hop to the API's thread. */
#include "hostd-guest-api.h"

#include <errno.h>
#include <libsoup/soup.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <glib-unix.h>
#include <glib/gstdio.h>

#include "hostd-agent.h"
#include "hostd-checkpoint-files.h"
#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-guest-api-rules.h"
#include "hostd-power.h"
#include "vm-domain.h"
#include "vm-error.h"
#include "vm-fd-pass.h"
#include "vm-seed.h"
#include "vm-util.h"

/* Helper connections (vm-egress-connect) waiting to hand over a guest connection, per agent, and
 * how long one may take to. */
#define API_PENDING_MAX 16
#define API_PENDING_MS  2000
/* Bytes of a request's path in hostd's log. */
#define API_LOG_PATH_MAX 80
/* Threads running requests' work, for every agent together. */
#define API_WORKERS 8

typedef struct _HostdGuestApi HostdGuestApi;

/* What the last restore asked from inside did (guarded by its agent's status_lock). */
typedef struct {
    char *id;
    char **paths;
    char *state; /* "accepted", "running", "done", "failed" */
    char *what;  /* what happens, in one sentence */
    char *undo;  /* done: the checkpoint of the state before it */
    char *error_name;
    char *error_message;
    gint64 asked; /* unix seconds */
    gint64 ended;
} ApiRestore;

typedef struct {
    gint refs;
    HostdGuestApi *api;
    HostdContext *ctx;
    char *name;
    char *socket_path;
    /* API thread */
    int listen_fd;
    GSource *listen_source;
    GSource *tick;
    SoupServer *server;
    GPtrArray *conns; /* ApiConn*, open */
    guint pending;    /* helper connections not yet handed over */
    HostdGuestApiBucket bucket;
    HostdGuestApiBucket heavy_bucket;
    gboolean heavy_busy; /* a checkpoint or restore asked from inside is under way */
    gboolean stopped;
    gint64 refused_logged_at; /* the last log line of a refusal for load, monotonic us */
    guint refused_unlogged;   /* refusals since then */
    /* any thread */
    GMutex status_lock;
    ApiRestore *restore;
} ApiAgent;

/* One guest connection. Reached from libsoup's callbacks through the data of the remote address
 * given with it, which holds a reference: the address lives as long as libsoup's connection. */
typedef struct {
    gint refs;
    ApiAgent *agent;
    GSocket *socket; /* API thread; NULL once the connection is gone */
    gint64 deadline; /* API thread: the request must be read by then (monotonic us); 0: it was */
    gboolean over;   /* beyond HOSTD_GUEST_API_CONNECTIONS: answered 503 */
} ApiConn;

/* One request, as the data of its SoupServerMessage (API thread). */
typedef struct {
    ApiAgent *agent;
    ApiConn *conn;
    char *method;
    char *path; /* for the log: printable, cut */
    gint64 started;
    const HostdGuestApiRoute *route;
    GByteArray *body;
    gsize received;
    gboolean finished;          /* libsoup is done with it: no answer can be set any more */
    gboolean refused_load;      /* 429 or 503: logged in a summary */
    HostdGuestApiArgs *restore; /* a restore to start once its 202 went out */
} ApiRequest;

/* The work of one request, on the pool. */
typedef struct {
    ApiAgent *agent;
    SoupServerMessage *msg;
    const HostdGuestApiRoute *route;
    HostdGuestApiArgs args;
    guint status;
    char *body; /* the answer, JSON */
    GError *error;
    gboolean restore_accepted;
} ApiJob;

struct _HostdGuestApi {
    HostdContext *ctx;
    GMutex lock;        /* agents, stopping, restores */
    GHashTable *agents; /* name -> ApiAgent* */
    gboolean stopping;
    GMainContext *context;
    GMainLoop *loop;
    GThread *thread;
    GThreadPool *pool;
    GCond restores_done;
    guint restores; /* restore threads running */
};

static const char *const api_checkpoint_keys[] = {
    "id", "created", "label", "automatic", "kind", "quiesced", "bytes", "parent", "current", NULL,
};
static const char *const api_egress_keys[] = {"allow", "deny", "proxy", NULL};

/* ---------------------------------------------------------------------------------------------
 * Agents and connections */

static ApiAgent *
api_agent_ref(ApiAgent *agent)
{
    g_atomic_int_inc(&agent->refs);
    return agent;
}

static void
api_restore_free(ApiRestore *restore)
{
    if (restore == NULL)
        return;
    g_free(restore->id);
    g_strfreev(restore->paths);
    g_free(restore->state);
    g_free(restore->what);
    g_free(restore->undo);
    g_free(restore->error_name);
    g_free(restore->error_message);
    g_free(restore);
}

static void
api_agent_unref(ApiAgent *agent)
{
    if (agent == NULL || !g_atomic_int_dec_and_test(&agent->refs))
        return;
    g_ptr_array_unref(agent->conns);
    api_restore_free(agent->restore);
    g_mutex_clear(&agent->status_lock);
    g_free(agent->name);
    g_free(agent->socket_path);
    g_free(agent);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ApiAgent, api_agent_unref)

static void
api_conn_unref(gpointer data)
{
    ApiConn *conn = data;

    if (!g_atomic_int_dec_and_test(&conn->refs))
        return;
    g_clear_object(&conn->socket);
    api_agent_unref(conn->agent);
    g_free(conn);
}

/* ---------------------------------------------------------------------------------------------
 * Running on the API's thread */

typedef struct {
    GSourceFunc func;
    gpointer data;
    GMutex lock;
    GCond cond;
    gboolean done;
} ApiCall;

static gboolean
api_call_run(gpointer data)
{
    ApiCall *call = data;

    call->func(call->data);
    g_mutex_lock(&call->lock);
    call->done = TRUE;
    g_cond_signal(&call->cond);
    g_mutex_unlock(&call->lock);
    return G_SOURCE_REMOVE;
}

/* Runs @func(@data) on the API's thread and returns once it did. */
static void
api_run(HostdGuestApi *api, GSourceFunc func, gpointer data)
{
    ApiCall call = {.func = func, .data = data};

    if (g_main_context_is_owner(api->context)) {
        func(data);
        return;
    }
    g_mutex_init(&call.lock);
    g_cond_init(&call.cond);
    g_main_context_invoke(api->context, api_call_run, &call);
    g_mutex_lock(&call.lock);
    while (!call.done)
        g_cond_wait(&call.cond, &call.lock);
    g_mutex_unlock(&call.lock);
    g_mutex_clear(&call.lock);
    g_cond_clear(&call.cond);
}

static gpointer
api_thread(gpointer data)
{
    HostdGuestApi *api = data;

    g_main_context_push_thread_default(api->context);
    g_main_loop_run(api->loop);
    g_main_context_pop_thread_default(api->context);
    return NULL;
}

static void api_work(gpointer data, gpointer user_data);

/* The context's API, made (with its thread and pool) on first use when @create. */
static HostdGuestApi *
api_get(HostdContext *ctx, gboolean create)
{
    HostdGuestApi *api;

    g_mutex_lock(&ctx->lock);
    api = ctx->guest_api;
    if (api == NULL && create) {
        api = g_new0(HostdGuestApi, 1);
        api->ctx = ctx;
        g_mutex_init(&api->lock);
        g_cond_init(&api->restores_done);
        api->agents = g_hash_table_new(g_str_hash, g_str_equal);
        api->context = g_main_context_new();
        api->loop = g_main_loop_new(api->context, FALSE);
        api->pool = g_thread_pool_new(api_work, api, API_WORKERS, FALSE, NULL);
        api->thread = g_thread_new("hostd-guest-api", api_thread, api);
        ctx->guest_api = api;
    }
    g_mutex_unlock(&ctx->lock);
    return api;
}

/* ---------------------------------------------------------------------------------------------
 * Log and events */

/* @text made fit for a log line: printable ASCII, cut to @max bytes. */
static char *
api_printable(const char *text, gsize max)
{
    GString *out = g_string_new(NULL);

    for (const char *p = text; *p != '\0' && out->len < max; p++)
        g_string_append_c(out, g_ascii_isgraph(*p) ? *p : '?');
    if (text[0] != '\0' && out->len >= max)
        g_string_append(out, "...");
    return g_string_free(out, FALSE);
}

/* What the guest may read of @error: its message without the host's directories. */
static GError *
api_guest_error(HostdContext *ctx, const GError *error)
{
    const char *const dirs[] = {ctx->state->dir, ctx->config->images_dir,
                                ctx->config->templates_dir, ctx->config->socket_path, NULL};
    g_autofree char *message = hostd_guest_api_scrub(error->message, dirs);

    return g_error_new_literal(VM_ERROR, vm_error_code(error), message);
}

/* The event of a request that changed something, asked by the guest (@failure NULL: ok). */
static void
api_event(HostdContext *ctx, const char *name, const char *event, const GError *failure,
          const char *detail)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    g_autofree char *text = NULL;
    HostdEvent e = {
        .agent = name,
        .event = event,
        .uid = -1,
        .caller = "guest",
        .outcome = failure != NULL ? "error" : "ok",
    };

    if (failure != NULL && detail != NULL)
        text = g_strdup_printf("%s: %s", detail, failure->message);
    else
        text = g_strdup(failure != NULL ? failure->message : detail);
    e.detail = text;
    if (dom != NULL)
        e.state = hostd_libvirt_state_name(dom);
    hostd_context_event(ctx, &e);
}

/* A refusal for load (429, 503): one log line a second per agent at most, which counts the rest. */
static void
api_log_refused(ApiAgent *agent, const char *what)
{
    gint64 now = g_get_monotonic_time();

    if (agent->refused_logged_at != 0 && now - agent->refused_logged_at < G_USEC_PER_SEC) {
        agent->refused_unlogged++;
        return;
    }
    if (agent->refused_unlogged > 0)
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s (and %u more refused for load)",
                          agent->name, what, agent->refused_unlogged);
    else
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s", agent->name, what);
    agent->refused_logged_at = now;
    agent->refused_unlogged = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Answers (API thread) */

static void
api_respond(SoupServerMessage *msg, guint status, char *json)
{
    soup_server_message_set_status(msg, status, NULL);
    soup_server_message_set_response(msg, "application/json", SOUP_MEMORY_TAKE, json, strlen(json));
}

static void
api_respond_error(SoupServerMessage *msg, guint status, const GError *error, guint retry_after_s)
{
    if (retry_after_s != 0) {
        g_autofree char *retry = g_strdup_printf("%u", retry_after_s);

        soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Retry-After",
                                     retry);
    }
    api_respond(msg, status, hostd_guest_api_error_json(error, retry_after_s));
}

static void
api_refuse(SoupServerMessage *msg, guint status, VmErrorCode code, guint retry_after_s,
           const char *message)
{
    g_autoptr(GError) error = g_error_new_literal(VM_ERROR, code, message);

    api_respond_error(msg, status, error, retry_after_s);
}

/* ---------------------------------------------------------------------------------------------
 * The work of requests (pool threads) */

static void
api_job_free(gpointer data)
{
    ApiJob *job = data;

    hostd_guest_api_args_clear(&job->args);
    g_clear_object(&job->msg);
    g_free(job->body);
    g_clear_error(&job->error);
    api_agent_unref(job->agent);
    g_free(job);
}

static JsonNode *
api_keep_awake_node(HostdContext *ctx, const char *name)
{
    return hostd_guest_api_keep_awake_node(hostd_power_awake_until(ctx, name),
                                           g_get_monotonic_time(), g_get_real_time());
}

static char *
api_info(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    g_autoptr(virDomain) dom = NULL;
    const char *state;

    if (r == NULL)
        return NULL;
    dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    state = dom != NULL ? hostd_libvirt_state_name(dom) : "missing";
    if (r->crashed != NULL && g_str_equal(state, "stopped"))
        state = "crashed";
    return hostd_guest_api_wrap(
        "agent", hostd_guest_api_info_node(r, state, api_keep_awake_node(ctx, name)));
}

static char *
api_checkpoint_list(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(GVariant) list = hostd_checkpoint_list(ctx, name, error);

    if (list == NULL)
        return NULL;
    g_variant_ref_sink(list);
    return hostd_guest_api_wrap("checkpoints",
                                hostd_guest_api_pick_each(list, api_checkpoint_keys));
}

static char *
api_checkpoint_create(HostdContext *ctx, const char *name, const HostdGuestApiArgs *args,
                      char **ret_id, GError **error)
{
    g_autoptr(GVariant) list = hostd_checkpoint_list(ctx, name, error);
    g_autoptr(GVariant) c = NULL;
    g_autofree char *warning = NULL;
    g_autoptr(JsonBuilder) b = NULL;
    g_autoptr(JsonGenerator) gen = NULL;
    g_autoptr(JsonNode) root = NULL;

    if (list == NULL)
        return NULL;
    g_variant_ref_sink(list);
    if (!hostd_checkpoint_guest_quota(ctx, name, args->memory, error))
        return NULL;
    if (args->memory) {
        guint with_memory = 0;

        for (gsize i = 0; i < g_variant_n_children(list); i++) {
            g_autoptr(GVariant) one = g_variant_get_child_value(list, i);
            const char *kind = NULL;

            if (g_variant_lookup(one, "kind", "&s", &kind) && g_str_equal(kind, "memory"))
                with_memory++;
        }
        if (with_memory >= HOSTD_GUEST_API_MEMORY_CHECKPOINTS_MAX)
            return vm_throw(error, VM_ERROR_NO_RESOURCES,
                            "agent '%s' has %u memory checkpoints, the most it may have to make "
                            "one from inside; a disk-only one needs no room for memory",
                            name, with_memory),
                   NULL;
    }
    c = hostd_checkpoint_create(ctx, name, args->label, FALSE, args->memory, &warning, error);
    if (c == NULL)
        return NULL;
    g_variant_ref_sink(c);
    (void)g_variant_lookup(c, "id", "s", ret_id);
    b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "checkpoint");
    json_builder_add_value(b, hostd_guest_api_pick(c, api_checkpoint_keys));
    if (warning != NULL) {
        json_builder_set_member_name(b, "warning");
        json_builder_add_string_value(b, warning);
    }
    json_builder_end_object(b);
    root = json_builder_get_root(b);
    gen = json_generator_new();
    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

static JsonNode *
api_restore_node(const ApiRestore *restore)
{
    g_autoptr(JsonBuilder) b = NULL;

    if (restore == NULL)
        return json_node_new(JSON_NODE_NULL);
    b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "id");
    json_builder_add_string_value(b, restore->id);
    if (restore->paths != NULL) {
        json_builder_set_member_name(b, "paths");
        json_builder_begin_array(b);
        for (char **p = restore->paths; *p != NULL; p++)
            json_builder_add_string_value(b, *p);
        json_builder_end_array(b);
    }
    json_builder_set_member_name(b, "state");
    json_builder_add_string_value(b, restore->state);
    json_builder_set_member_name(b, "what");
    json_builder_add_string_value(b, restore->what);
    if (restore->undo != NULL) {
        json_builder_set_member_name(b, "undo");
        json_builder_add_string_value(b, restore->undo);
    }
    if (restore->error_name != NULL) {
        json_builder_set_member_name(b, "error");
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "error");
        json_builder_add_string_value(b, restore->error_name);
        json_builder_set_member_name(b, "message");
        json_builder_add_string_value(b, restore->error_message);
        json_builder_end_object(b);
    }
    json_builder_set_member_name(b, "asked");
    json_builder_add_int_value(b, restore->asked);
    if (restore->ended != 0) {
        json_builder_set_member_name(b, "ended");
        json_builder_add_int_value(b, restore->ended);
    }
    json_builder_end_object(b);
    return json_builder_get_root(b);
}

static char *
api_restore_status(ApiAgent *agent)
{
    JsonNode *node;

    g_mutex_lock(&agent->status_lock);
    node = api_restore_node(agent->restore);
    g_mutex_unlock(&agent->status_lock);
    return hostd_guest_api_wrap("restore", node);
}

/* Checks a restore before it is acknowledged (the checkpoint exists; a partial one needs a
 * running agent) and records it as accepted, with what will happen. */
static char *
api_restore_accept(ApiAgent *agent, const HostdGuestApiArgs *args, GError **error)
{
    HostdContext *ctx = agent->ctx;
    g_autoptr(GVariant) list = hostd_checkpoint_list(ctx, agent->name, error);
    g_autoptr(virDomain) dom = NULL;
    const char *kind = NULL;
    ApiRestore *restore;

    if (list == NULL)
        return NULL;
    g_variant_ref_sink(list);
    for (gsize i = 0; i < g_variant_n_children(list) && kind == NULL; i++) {
        g_autoptr(GVariant) c = g_variant_get_child_value(list, i);
        const char *id = NULL;

        if (g_variant_lookup(c, "id", "&s", &id) && g_str_equal(id, args->id) &&
            !g_variant_lookup(c, "kind", "&s", &kind))
            kind = "disk";
    }
    if (kind == NULL)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' has no checkpoint '%s'", agent->name,
                        args->id),
               NULL;
    dom = hostd_libvirt_lookup(ctx->lv, agent->name, NULL);
    if (args->paths != NULL &&
        (dom == NULL || !g_str_equal(hostd_libvirt_state_name(dom), "running")))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is not running: paths are put back into a running agent",
                        agent->name),
               NULL;
    /* Its undo checkpoint is one the guest asked for. */
    if (!hostd_checkpoint_guest_quota(ctx, agent->name, FALSE, error))
        return NULL;

    restore = g_new0(ApiRestore, 1);
    restore->id = g_strdup(args->id);
    restore->paths = g_strdupv(args->paths);
    restore->state = g_strdup("accepted");
    restore->asked = g_get_real_time() / G_USEC_PER_SEC;
    if (args->paths != NULL)
        restore->what = g_strdup_printf(
            "in a moment a checkpoint of now is taken (to undo this), then the paths are put back "
            "as they were in %s; the VM runs on",
            args->id);
    else if (g_str_equal(kind, "memory"))
        restore->what = g_strdup_printf(
            "in a moment a checkpoint of now is taken (to undo this), then the VM stops and "
            "resumes where it was when %s was taken",
            args->id);
    else
        restore->what = g_strdup_printf(
            "in a moment a checkpoint of now is taken (to undo this), then the VM stops and boots "
            "from %s",
            args->id);
    g_mutex_lock(&agent->status_lock);
    api_restore_free(agent->restore);
    agent->restore = restore;
    g_mutex_unlock(&agent->status_lock);
    return api_restore_status(agent);
}

static char *
api_keep_awake(ApiAgent *agent, const HostdGuestApiArgs *args, GError **error)
{
    HostdContext *ctx = agent->ctx;
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, agent->name, error);

    if (r == NULL)
        return NULL;
    if (args != NULL && hostd_power_hold_awake(ctx, agent->name, args->seconds) == 0)
        return vm_throw(error, VM_ERROR_NOT_RUNNING, "hostd's idle loop is not running"), NULL;
    return hostd_guest_api_wrap("keep_awake", api_keep_awake_node(ctx, agent->name));
}

static char *
api_egress(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(GVariant) egress = hostd_egress_get(ctx, name, error);

    if (egress == NULL)
        return NULL;
    g_variant_ref_sink(egress);
    return hostd_guest_api_wrap("egress", hostd_guest_api_pick(egress, api_egress_keys));
}

/* What an event says a request did: the new checkpoint's id (@id) and label, the keep-awake's
 * length, the restore's checkpoint. */
static char *
api_event_detail(const ApiJob *job, const char *id)
{
    switch (job->route->endpoint) {
    case HOSTD_GUEST_API_CHECKPOINT_CREATE:
        return g_strdup_printf("%s%s%s%s", id != NULL ? id : "",
                               id != NULL && job->args.label != NULL ? " " : "",
                               job->args.label != NULL ? job->args.label : "",
                               job->args.memory ? " (with memory)" : "");
    case HOSTD_GUEST_API_KEEP_AWAKE_SET:
        return g_strdup_printf("for %us", job->args.seconds);
    case HOSTD_GUEST_API_RESTORE:
        return g_strdup(job->args.id);
    case HOSTD_GUEST_API_INFO:
    case HOSTD_GUEST_API_CHECKPOINT_LIST:
    case HOSTD_GUEST_API_RESTORE_STATUS:
    case HOSTD_GUEST_API_KEEP_AWAKE_GET:
    case HOSTD_GUEST_API_EGRESS:
    default:
        return NULL;
    }
}

static gboolean api_job_done(gpointer data);

static void
api_work(gpointer data, gpointer user_data)
{
    ApiJob *job = data;
    HostdGuestApi *api = user_data;
    ApiAgent *agent = job->agent;
    HostdContext *ctx = agent->ctx;
    g_autoptr(GError) error = NULL;
    g_autofree char *id = NULL;
    char *body = NULL;

    job->status = 200;
    switch (job->route->endpoint) {
    case HOSTD_GUEST_API_INFO:
        body = api_info(ctx, agent->name, &error);
        break;
    case HOSTD_GUEST_API_CHECKPOINT_LIST:
        body = api_checkpoint_list(ctx, agent->name, &error);
        break;
    case HOSTD_GUEST_API_CHECKPOINT_CREATE:
        body = api_checkpoint_create(ctx, agent->name, &job->args, &id, &error);
        job->status = 201;
        break;
    case HOSTD_GUEST_API_RESTORE:
        body = api_restore_accept(agent, &job->args, &error);
        job->status = 202;
        job->restore_accepted = body != NULL;
        break;
    case HOSTD_GUEST_API_RESTORE_STATUS:
        body = api_restore_status(agent);
        break;
    case HOSTD_GUEST_API_KEEP_AWAKE_GET:
        body = api_keep_awake(agent, NULL, &error);
        break;
    case HOSTD_GUEST_API_KEEP_AWAKE_SET:
        body = api_keep_awake(agent, &job->args, &error);
        break;
    case HOSTD_GUEST_API_EGRESS:
        body = api_egress(ctx, agent->name, &error);
        break;
    default:
        g_assert_not_reached();
    }
    /* A restore's event comes when it ran, from its own thread; a refused one has one here. */
    if (job->route->event != NULL && !job->restore_accepted) {
        g_autofree char *detail = api_event_detail(job, id);

        api_event(ctx, agent->name, job->route->event, error, detail);
    }
    if (body == NULL)
        job->error = api_guest_error(ctx, error);
    job->body = body;
    g_main_context_invoke_full(api->context, G_PRIORITY_DEFAULT, api_job_done, job, api_job_free);
}

/* ---------------------------------------------------------------------------------------------
 * Restores asked from inside (their own thread) */

static void
api_args_free(HostdGuestApiArgs *args)
{
    if (args == NULL)
        return;
    hostd_guest_api_args_clear(args);
    g_free(args);
}

typedef struct {
    ApiAgent *agent;
    char *id;
    char **paths;
} ApiRestoreRun;

static void
api_restore_run_free(ApiRestoreRun *run)
{
    api_agent_unref(run->agent);
    g_free(run->id);
    g_strfreev(run->paths);
    g_free(run);
}

static gboolean
api_heavy_done(gpointer data)
{
    ApiAgent *agent = data;

    agent->heavy_busy = FALSE;
    return G_SOURCE_REMOVE;
}

static void
api_restore_set(ApiAgent *agent, const char *state, const char *undo, const GError *error)
{
    g_mutex_lock(&agent->status_lock);
    if (agent->restore != NULL) {
        g_free(agent->restore->state);
        agent->restore->state = g_strdup(state);
        if (undo != NULL) {
            g_free(agent->restore->undo);
            agent->restore->undo = g_strdup(undo);
        }
        if (error != NULL) {
            agent->restore->error_name = g_strdup(vm_error_code_name(vm_error_code(error)));
            agent->restore->error_message = g_strdup(error->message);
        }
        if (!g_str_equal(state, "running"))
            agent->restore->ended = g_get_real_time() / G_USEC_PER_SEC;
    }
    g_mutex_unlock(&agent->status_lock);
}

static gpointer
api_restore_thread(gpointer data)
{
    ApiRestoreRun *run = data;
    ApiAgent *agent = run->agent;
    HostdGuestApi *api = agent->api;
    HostdContext *ctx = agent->ctx;
    g_autoptr(GError) error = NULL;
    g_autoptr(GError) shown = NULL;
    g_autoptr(GVariant) result = NULL;
    g_autofree char *undo = NULL;
    g_autofree char *detail = NULL;

    api_restore_set(agent, "running", NULL, NULL);
    /* As the restore request does: the agent's lock is taken inside, for the whole of it. The
     * quota again: the host may have made checkpoints since the 202. */
    if (!hostd_checkpoint_guest_quota(ctx, agent->name, FALSE, &error))
        result = NULL;
    else if (run->paths != NULL)
        result = hostd_checkpoint_restore_paths(
            ctx, agent->name, run->id, (const char *const *)run->paths, &undo, NULL, NULL, &error);
    else
        result =
            hostd_checkpoint_restore(ctx, agent->name, run->id, FALSE, &undo, NULL, NULL, &error);
    if (result != NULL) {
        g_variant_ref_sink(result);
        api_restore_set(agent, "done", undo, NULL);
        hostd_context_log(ctx,
                          "guest api: agent '%s': restore to %s asked from inside: done; "
                          "undo with %s",
                          agent->name, run->id, undo != NULL ? undo : "-");
        detail = g_strdup_printf("%s%s (undo %s)", run->id, run->paths != NULL ? " paths" : "",
                                 undo != NULL ? undo : "-");
    } else {
        shown = api_guest_error(ctx, error);
        api_restore_set(agent, "failed", NULL, shown);
        hostd_context_log(ctx, "guest api: agent '%s': restore to %s asked from inside failed: %s",
                          agent->name, run->id, error->message);
        detail = g_strdup(run->id);
    }
    api_event(ctx, agent->name, "checkpoint-restore", error, detail);
    g_main_context_invoke_full(api->context, G_PRIORITY_DEFAULT, api_heavy_done,
                               api_agent_ref(agent), (GDestroyNotify)api_agent_unref);
    api_restore_run_free(run);
    g_mutex_lock(&api->lock);
    api->restores--;
    g_cond_broadcast(&api->restores_done);
    g_mutex_unlock(&api->lock);
    return NULL;
}

/* API thread: the restore's answer went out (or its client is gone) a moment ago; it starts now,
 * unless hostd is stopping. @data is the timer's: what the thread needs moves out of it. */
static gboolean
api_restore_start(gpointer data)
{
    ApiRestoreRun *timer_run = data;
    ApiRestoreRun *run = g_new0(ApiRestoreRun, 1);
    HostdGuestApi *api = timer_run->agent->api;
    g_autoptr(GError) error = NULL;

    *run = *timer_run;
    *timer_run = (ApiRestoreRun){0};
    g_mutex_lock(&api->lock);
    if (api->stopping) {
        g_mutex_unlock(&api->lock);
        vm_throw(&error, VM_ERROR_CANCELLED, "hostd stopped before the restore began");
        api_restore_set(run->agent, "failed", NULL, error);
        run->agent->heavy_busy = FALSE;
        api_restore_run_free(run);
        return G_SOURCE_REMOVE;
    }
    api->restores++;
    g_mutex_unlock(&api->lock);
    g_thread_unref(g_thread_new("hostd-guest-restore", api_restore_thread, run));
    return G_SOURCE_REMOVE;
}

static void
api_restore_schedule(ApiRequest *req)
{
    ApiRestoreRun *run = g_new0(ApiRestoreRun, 1);
    GSource *timer = g_timeout_source_new(HOSTD_GUEST_API_RESTORE_DELAY_MS);

    run->agent = api_agent_ref(req->agent);
    run->id = g_strdup(req->restore->id);
    run->paths = g_strdupv(req->restore->paths);
    g_clear_pointer(&req->restore, api_args_free);
    g_source_set_callback(timer, api_restore_start, run, (GDestroyNotify)api_restore_run_free);
    g_source_attach(timer, req->agent->api->context);
    g_source_unref(timer);
}

/* ---------------------------------------------------------------------------------------------
 * Requests (API thread) */

static gboolean
api_job_done(gpointer data)
{
    ApiJob *job = data;
    ApiAgent *agent = job->agent;
    ApiRequest *req = g_object_get_data(G_OBJECT(job->msg), "hostd-guest-api");
    gboolean heavy = (job->route->flags & HOSTD_GUEST_API_HEAVY) != 0;

    if (job->restore_accepted && req != NULL) {
        /* The restore waits for its answer to have gone out: see api_request_finished(). */
        req->restore = g_new0(HostdGuestApiArgs, 1);
        req->restore->id = g_strdup(job->args.id);
        req->restore->paths = g_strdupv(job->args.paths);
        heavy = FALSE;
    }
    if (heavy)
        agent->heavy_busy = FALSE;
    if (req == NULL || req->finished || agent->stopped) {
        if (req != NULL && req->restore != NULL)
            api_restore_schedule(req);
        return G_SOURCE_REMOVE;
    }
    if (job->body != NULL) {
        api_respond(job->msg, job->status, g_steal_pointer(&job->body));
    } else {
        api_respond_error(job->msg, hostd_guest_api_error_status(vm_error_code(job->error)),
                          job->error, 0);
    }
    soup_server_message_unpause(job->msg);
    return G_SOURCE_REMOVE;
}

static void
api_request_free(gpointer data)
{
    ApiRequest *req = data;

    api_args_free(req->restore);
    if (req->conn != NULL)
        api_conn_unref(req->conn);
    api_agent_unref(req->agent);
    g_free(req->method);
    g_free(req->path);
    if (req->body != NULL)
        g_byte_array_unref(req->body);
    g_free(req);
}

static void
api_request_finished(SoupServerMessage *msg, gpointer data)
{
    ApiRequest *req = data;

    req->finished = TRUE;
    if (req->restore != NULL)
        api_restore_schedule(req);
}

/* A body past HOSTD_GUEST_API_BODY_MAX is answered 413 once it was read (and dropped); one past
 * HOSTD_GUEST_API_DISCARD_MAX is not read on: the connection is cut. */
static void
api_got_chunk(SoupServerMessage *msg, GBytes *chunk, gpointer data)
{
    ApiRequest *req = data;
    gsize len = 0;
    const guint8 *bytes = g_bytes_get_data(chunk, &len);

    req->received += len;
    if (req->received <= HOSTD_GUEST_API_BODY_MAX) {
        g_byte_array_append(req->body, bytes, (guint)len);
        return;
    }
    if (soup_server_message_get_status(msg) == 0)
        api_refuse(msg, 413, VM_ERROR_PROTOCOL, 0, "the request body is longer than 16384 bytes");
    if (req->received > HOSTD_GUEST_API_DISCARD_MAX && req->conn != NULL &&
        req->conn->socket != NULL)
        (void)g_socket_shutdown(req->conn->socket, TRUE, TRUE, NULL);
}

static void
api_request_started(SoupServer *server, SoupServerMessage *msg, gpointer data)
{
    ApiAgent *agent = data;
    ApiRequest *req = g_new0(ApiRequest, 1);
    ApiConn *conn =
        g_object_get_data(G_OBJECT(soup_server_message_get_remote_address(msg)), "hostd-guest-api");

    req->agent = api_agent_ref(agent);
    if (conn != NULL) {
        g_atomic_int_inc(&conn->refs);
        req->conn = conn;
    }
    req->started = g_get_monotonic_time();
    req->body = g_byte_array_new();
    g_object_set_data_full(G_OBJECT(msg), "hostd-guest-api", req, api_request_free);
    g_signal_connect(msg, "finished", G_CALLBACK(api_request_finished), req);
    g_signal_connect(msg, "got-chunk", G_CALLBACK(api_got_chunk), req);
}

static void
api_request_read(SoupServer *server, SoupServerMessage *msg, gpointer data)
{
    ApiRequest *req = g_object_get_data(G_OBJECT(msg), "hostd-guest-api");

    if (req != NULL && req->conn != NULL)
        req->conn->deadline = 0;
}

/* hostd's log line of each answered request: agent, method, path, status, time. */
static void
api_request_ended(SoupServer *server, SoupServerMessage *msg, gpointer data)
{
    ApiAgent *agent = data;
    ApiRequest *req = g_object_get_data(G_OBJECT(msg), "hostd-guest-api");
    guint status = soup_server_message_get_status(msg);
    g_autofree char *line = NULL;

    if (req == NULL)
        return;
    /* A request libsoup refused before it was routed has no method or path of ours. */
    line = g_strdup_printf("%s %s %u (%.0f ms)", req->method != NULL ? req->method : "-",
                           req->path != NULL ? req->path : "-", status,
                           (g_get_monotonic_time() - req->started) / 1000.0);
    if (req->refused_load)
        api_log_refused(agent, line);
    else
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s", agent->name, line);
}

/* Before the body: the connection's share, the rate, the route and the announced body size. A
 * status set here answers the request once its body was read (and dropped); the handler below
 * is not called then. */
static void
api_early(SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
          gpointer data)
{
    ApiAgent *agent = data;
    ApiRequest *req = g_object_get_data(G_OBJECT(msg), "hostd-guest-api");
    SoupMessageHeaders *headers = soup_server_message_get_request_headers(msg);
    guint status = 0, retry = 0;
    const char *allow = NULL;
    g_autofree char *message = NULL;

    soup_message_body_set_accumulate(soup_server_message_get_request_body(msg), FALSE);
    if (req == NULL)
        return;
    req->method = api_printable(soup_server_message_get_method(msg), 16);
    req->path = api_printable(path, API_LOG_PATH_MAX);

    if (req->conn != NULL && req->conn->over) {
        req->refused_load = TRUE;
        message = g_strdup_printf("more than %d connections at once from this agent",
                                  HOSTD_GUEST_API_CONNECTIONS);
        api_refuse(msg, 503, VM_ERROR_BUSY, 1, message);
        return;
    }
    if (!hostd_guest_api_bucket_take(&agent->bucket, agent->ctx->config->guest_api_rate,
                                     agent->ctx->config->guest_api_burst, g_get_monotonic_time(),
                                     &retry)) {
        req->refused_load = TRUE;
        message = g_strdup_printf("too many requests: at most %u a second, in bursts of %u",
                                  agent->ctx->config->guest_api_rate,
                                  agent->ctx->config->guest_api_burst);
        api_refuse(msg, 429, VM_ERROR_BUSY, retry, message);
        return;
    }
    req->route = hostd_guest_api_route(soup_server_message_get_method(msg), path, &status, &allow);
    if (req->route == NULL && status == 405) {
        soup_message_headers_replace(soup_server_message_get_response_headers(msg), "Allow", allow);
        message = g_strdup_printf("%s takes %s only", req->path, allow);
        api_refuse(msg, 405, VM_ERROR_INVALID_ARGUMENT, 0, message);
        return;
    }
    if (req->route == NULL) {
        message = g_strdup_printf("no %s in this API (see GET /v1/info)", req->path);
        api_refuse(msg, 404, VM_ERROR_NOT_FOUND, 0, message);
        return;
    }
    if (soup_message_headers_get_encoding(headers) == SOUP_ENCODING_CONTENT_LENGTH &&
        soup_message_headers_get_content_length(headers) > HOSTD_GUEST_API_BODY_MAX) {
        api_refuse(msg, 413, VM_ERROR_PROTOCOL, 0, "the request body is longer than 16384 bytes");
        if (soup_message_headers_get_content_length(headers) > HOSTD_GUEST_API_DISCARD_MAX &&
            req->conn != NULL && req->conn->socket != NULL)
            (void)g_socket_shutdown(req->conn->socket, TRUE, TRUE, NULL);
    }
}

static void
api_handle(SoupServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
           gpointer data)
{
    ApiAgent *agent = data;
    ApiRequest *req = g_object_get_data(G_OBJECT(msg), "hostd-guest-api");
    g_autoptr(GError) error = NULL;
    ApiJob *job;
    guint retry = 0;

    if (req == NULL || req->route == NULL) {
        api_refuse(msg, 500, VM_ERROR_FAILED, 0, "the request was not routed");
        return;
    }
    job = g_new0(ApiJob, 1);
    job->agent = api_agent_ref(agent);
    job->route = req->route;
    if ((req->route->flags & HOSTD_GUEST_API_BODY) &&
        !hostd_guest_api_args_parse(req->route->endpoint, (const char *)req->body->data,
                                    req->body->len, &job->args, &error)) {
        api_respond_error(msg, 400, error, 0);
        api_job_free(job);
        return;
    }
    if (req->route->flags & HOSTD_GUEST_API_HEAVY) {
        if (agent->heavy_busy) {
            api_refuse(msg, 409, VM_ERROR_BUSY, 1,
                       "a checkpoint or restore asked from inside is under way");
            api_job_free(job);
            return;
        }
        if (!hostd_guest_api_bucket_take(&agent->heavy_bucket, HOSTD_GUEST_API_HEAVY_RATE,
                                         HOSTD_GUEST_API_HEAVY_BURST, g_get_monotonic_time(),
                                         &retry)) {
            req->refused_load = TRUE;
            api_refuse(msg, 429, VM_ERROR_BUSY, retry,
                       "too many checkpoints and restores: one every 10 s, in bursts of 3");
            api_job_free(job);
            return;
        }
        agent->heavy_busy = TRUE;
    }
    job->msg = g_object_ref(msg);
    soup_server_message_pause(msg);
    g_thread_pool_push(agent->api->pool, job, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Connections (API thread) */

static void
api_conn_gone(gpointer data, GObject *stream)
{
    ApiConn *conn = data;
    ApiAgent *agent = conn->agent;

    g_ptr_array_remove(agent->conns, conn);
    g_clear_object(&conn->socket);
    api_conn_unref(conn);
}

/* Gives the guest's connection @fd (owned) to @agent's server. */
static void
api_agent_take(ApiAgent *agent, int fd)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GSocket) socket = NULL;
    g_autoptr(GSocketConnection) stream = NULL;
    g_autoptr(GSocketAddress) local = NULL;
    g_autoptr(GSocketAddress) remote = NULL;
    ApiConn *conn;

    if (agent->stopped || agent->conns->len >= 2 * HOSTD_GUEST_API_CONNECTIONS) {
        close(fd);
        if (!agent->stopped)
            api_log_refused(agent, "a connection closed unanswered: too many open");
        return;
    }
    socket = g_socket_new_from_fd(fd, &error);
    if (socket == NULL) {
        close(fd);
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s", agent->name, error->message);
        return;
    }
    stream = g_socket_connection_factory_create_connection(socket);
    conn = g_new0(ApiConn, 1);
    conn->refs = 2; /* the open connection's, and the remote address's */
    conn->agent = api_agent_ref(agent);
    conn->socket = g_object_ref(socket);
    conn->deadline = g_get_monotonic_time() + (gint64)HOSTD_GUEST_API_REQUEST_MS * 1000;
    conn->over = agent->conns->len >= HOSTD_GUEST_API_CONNECTIONS;
    g_ptr_array_add(agent->conns, conn);
    g_object_weak_ref(G_OBJECT(stream), api_conn_gone, conn);
    /* libsoup wants addresses; the guest's end has none that means anything here. */
    local = g_inet_socket_address_new_from_string(VM_GUEST_API_ADDRESS, VM_GUEST_API_PORT);
    remote = g_inet_socket_address_new_from_string("0.0.0.0", 0);
    g_object_set_data_full(G_OBJECT(remote), "hostd-guest-api", conn, api_conn_unref);
    (void)soup_server_accept_iostream(agent->server, G_IO_STREAM(stream), local, remote, NULL);
}

/* Cuts connections that have not sent their whole request in time. */
static gboolean
api_tick(gpointer data)
{
    ApiAgent *agent = data;
    gint64 now = g_get_monotonic_time();

    for (guint i = 0; i < agent->conns->len; i++) {
        ApiConn *conn = agent->conns->pdata[i];

        if (conn->deadline != 0 && now > conn->deadline && conn->socket != NULL) {
            conn->deadline = 0;
            api_log_refused(agent, "a connection cut: no whole request within 10 s");
            (void)g_socket_shutdown(conn->socket, TRUE, TRUE, NULL);
        }
    }
    return G_SOURCE_CONTINUE;
}

typedef struct {
    ApiAgent *agent;
    int fd;
} ApiPending;

static void
api_pending_free(gpointer data)
{
    ApiPending *pending = data;

    if (pending->fd >= 0)
        close(pending->fd);
    pending->agent->pending--;
    api_agent_unref(pending->agent);
    g_free(pending);
}

/* A helper's connection: its one message carries the guest's connection. Called when it is
 * readable, or with no @condition once API_PENDING_MS passed. */
static gboolean
api_pending_ready(gint fd, GIOCondition condition, gpointer data)
{
    ApiPending *pending = data;
    int guest = vm_fd_receive(fd, NULL);

    if (guest == -EAGAIN && condition != 0)
        return G_SOURCE_CONTINUE;
    if (guest >= 0)
        api_agent_take(pending->agent, guest);
    else if (guest != -ECONNRESET)
        hostd_context_log(pending->agent->ctx,
                          "guest api: agent '%s': a connection to its socket handed nothing "
                          "over: %s",
                          pending->agent->name, g_strerror(-guest));
    return G_SOURCE_REMOVE;
}

static gboolean
api_accept(gint listen_fd, GIOCondition condition, gpointer data)
{
    ApiAgent *agent = data;

    for (int i = 0; i < 32; i++) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        ApiPending *pending;
        GSource *source;

        if (fd < 0)
            break;
        if (agent->pending >= API_PENDING_MAX) {
            close(fd);
            api_log_refused(agent, "a connection closed unanswered: too many handing over");
            continue;
        }
        pending = g_new0(ApiPending, 1);
        pending->agent = api_agent_ref(agent);
        pending->fd = fd;
        agent->pending++;
        source = g_unix_fd_source_new(fd, G_IO_IN);
        g_source_set_ready_time(source, g_get_monotonic_time() + API_PENDING_MS * 1000);
        g_source_set_callback(source, G_SOURCE_FUNC(api_pending_ready), pending, api_pending_free);
        g_source_attach(source, agent->api->context);
        g_source_unref(source);
    }
    return G_SOURCE_CONTINUE;
}

/* ---------------------------------------------------------------------------------------------
 * Agents: start and stop */

/* Binds @path, gives it to agent @name's QEMU user with mode 0600 before anyone may connect, and
 * listens. */
static int
api_listen(HostdContext *ctx, const char *name, const char *path, GError **error)
{
    struct sockaddr_un sun;
    socklen_t sun_len;
    uid_t uid;
    gid_t gid;
    gboolean chown_it = hostd_egress_socket_owner(ctx, name, &uid, &gid);
    vm_autofd fd = -1;
    int saved;

    if (!vm_unix_address(path, &sun, &sun_len, error))
        return -1;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot create the in-guest API's socket"), -1;
    if (g_unlink(path) < 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot replace %s", path), -1;
    if (bind(fd, (struct sockaddr *)&sun, sun_len) < 0)
        return vm_throw_errno(error, errno, "cannot bind %s", path), -1;
    if (chmod(path, 0600) < 0 || (chown_it && chown(path, uid, gid) < 0) || listen(fd, 64) < 0) {
        saved = errno;
        g_unlink(path);
        return vm_throw_errno(error, saved, "cannot listen on %s", path), -1;
    }
    saved = fd;
    fd = -1;
    return saved;
}

static gboolean
api_agent_serve(gpointer data)
{
    ApiAgent *agent = data;

    agent->server = soup_server_new(NULL, NULL);
    soup_server_add_early_handler(agent->server, NULL, api_early, agent, NULL);
    soup_server_add_handler(agent->server, NULL, api_handle, agent, NULL);
    g_signal_connect(agent->server, "request-started", G_CALLBACK(api_request_started), agent);
    g_signal_connect(agent->server, "request-read", G_CALLBACK(api_request_read), agent);
    g_signal_connect(agent->server, "request-finished", G_CALLBACK(api_request_ended), agent);
    g_signal_connect(agent->server, "request-aborted", G_CALLBACK(api_request_ended), agent);
    agent->listen_source = g_unix_fd_source_new(agent->listen_fd, G_IO_IN);
    g_source_set_callback(agent->listen_source, G_SOURCE_FUNC(api_accept), agent, NULL);
    g_source_attach(agent->listen_source, agent->api->context);
    agent->tick = g_timeout_source_new_seconds(1);
    g_source_set_callback(agent->tick, api_tick, agent, NULL);
    g_source_attach(agent->tick, agent->api->context);
    return G_SOURCE_REMOVE;
}

/* Stops serving @agent (API thread): no new connection, open ones closed; the socket file goes
 * unless another agent entry has taken its path since. */
static gboolean
api_agent_shutdown(gpointer data)
{
    ApiAgent *agent = data;

    agent->stopped = TRUE;
    if (agent->listen_source != NULL) {
        g_source_destroy(agent->listen_source);
        g_clear_pointer(&agent->listen_source, g_source_unref);
    }
    if (agent->tick != NULL) {
        g_source_destroy(agent->tick);
        g_clear_pointer(&agent->tick, g_source_unref);
    }
    if (agent->listen_fd >= 0) {
        close(agent->listen_fd);
        agent->listen_fd = -1;
        g_unlink(agent->socket_path);
    }
    if (agent->server != NULL) {
        soup_server_disconnect(agent->server);
        g_clear_object(&agent->server);
    }
    return G_SOURCE_REMOVE;
}

/* Whether @agent still listens on its socket file. */
static gboolean
api_agent_healthy(const ApiAgent *agent)
{
    struct stat st;

    return stat(agent->socket_path, &st) == 0 && S_ISSOCK(st.st_mode);
}

char *
hostd_guest_api_command(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_autofree char *socket_path = NULL;

    if (!ctx->config->guest_api)
        return NULL;
    socket_path = hostd_agent_record_path(r, HOSTD_AGENT_API_SOCKET);
    return hostd_egress_forward_command(ctx, socket_path);
}

gboolean
hostd_guest_api_agent_start(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    HostdGuestApi *api;
    g_autoptr(ApiAgent) old = NULL;
    ApiAgent *agent;
    gboolean healthy;
    int fd;

    if (!ctx->config->guest_api)
        return TRUE;
    api = api_get(ctx, TRUE);
    g_mutex_lock(&api->lock);
    if (api->stopping) {
        g_mutex_unlock(&api->lock);
        return TRUE;
    }
    agent = g_hash_table_lookup(api->agents, r->name);
    healthy = agent != NULL && api_agent_healthy(agent);
    if (agent != NULL && !healthy) {
        g_hash_table_remove(api->agents, r->name);
        old = agent;
    }
    g_mutex_unlock(&api->lock);
    if (healthy)
        return TRUE;
    if (old != NULL)
        api_run(api, api_agent_shutdown, old);

    agent = g_new0(ApiAgent, 1);
    agent->refs = 1;
    agent->api = api;
    agent->ctx = ctx;
    agent->name = g_strdup(r->name);
    agent->socket_path = hostd_agent_record_path(r, HOSTD_AGENT_API_SOCKET);
    agent->conns = g_ptr_array_new();
    g_mutex_init(&agent->status_lock);
    fd = api_listen(ctx, r->name, agent->socket_path, error);
    if (fd < 0) {
        agent->listen_fd = -1;
        api_agent_unref(agent);
        return FALSE;
    }
    agent->listen_fd = fd;
    api_run(api, api_agent_serve, agent);
    g_mutex_lock(&api->lock);
    g_hash_table_insert(api->agents, agent->name, agent);
    g_mutex_unlock(&api->lock);
    return TRUE;
}

void
hostd_guest_api_agent_stop(HostdContext *ctx, const char *name)
{
    HostdGuestApi *api = api_get(ctx, FALSE);
    g_autoptr(ApiAgent) agent = NULL;

    if (api == NULL)
        return;
    g_mutex_lock(&api->lock);
    (void)g_hash_table_steal_extended(api->agents, name, NULL, (gpointer *)&agent);
    g_mutex_unlock(&api->lock);
    if (agent != NULL)
        api_run(api, api_agent_shutdown, agent);
}

static gboolean
api_quit(gpointer data)
{
    g_main_loop_quit(data);
    return G_SOURCE_REMOVE;
}

void
hostd_guest_api_stop(HostdContext *ctx)
{
    HostdGuestApi *api;
    GHashTableIter iter;
    gpointer value;

    g_mutex_lock(&ctx->lock);
    api = g_steal_pointer(&ctx->guest_api);
    g_mutex_unlock(&ctx->lock);
    if (api == NULL)
        return;
    g_mutex_lock(&api->lock);
    api->stopping = TRUE;
    g_mutex_unlock(&api->lock);
    g_hash_table_iter_init(&iter, api->agents);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        api_run(api, api_agent_shutdown, value);
        api_agent_unref(value);
    }
    g_hash_table_remove_all(api->agents);
    /* The work in flight ends and hands its answers to the loop, which still runs. */
    g_thread_pool_free(api->pool, FALSE, TRUE);
    g_mutex_lock(&api->lock);
    while (api->restores > 0)
        g_cond_wait(&api->restores_done, &api->lock);
    g_mutex_unlock(&api->lock);
    g_main_context_invoke(api->context, api_quit, api->loop);
    g_thread_join(api->thread);
    /* What is still queued (answers, a restore's timer) is dropped with the context. */
    g_main_loop_unref(api->loop);
    g_main_context_unref(api->context);
    g_hash_table_unref(api->agents);
    g_cond_clear(&api->restores_done);
    g_mutex_clear(&api->lock);
    g_free(api);
}

/* ---------------------------------------------------------------------------------------------
 * The API as a component of the context */

static gboolean
api_agent_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                   GError **error)
{
    return hostd_guest_api_agent_start(ctx, r, error);
}

static void
api_agent_seed(HostdContext *ctx, const HostdAgentRecord *r, VmSeedSpec *spec, GPtrArray *keep)
{
    if (!ctx->config->guest_api)
        return;
    /* A fork gets the tool again: its source may be older than the API. */
    spec->guest_tool = TRUE;
    spec->guest_api_host = VM_GUEST_API_ADDRESS;
}

static void
api_agent_domain(HostdContext *ctx, const HostdAgentRecord *r, VmDomainSpec *spec, GPtrArray *keep)
{
    char *command = hostd_guest_api_command(ctx, r);

    if (command != NULL)
        g_ptr_array_add(keep, command);
    spec->guest_api_command = command;
}

static void
api_agent_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                    GPtrArray *notes)
{
    g_autoptr(GError) local_error = NULL;

    if (!hostd_guest_api_agent_start(ctx, r, &local_error))
        g_ptr_array_add(notes, g_strdup_printf("agent '%s': no in-guest API: %s", r->name,
                                               local_error->message));
}

const HostdComponent hostd_guest_api_component = {
    .name = "guest-api",
    .agent_creating = api_agent_creating,
    .agent_seed = api_agent_seed,
    .agent_domain = api_agent_domain,
    .agent_starting = hostd_guest_api_agent_start,
    .agent_removed = hostd_guest_api_agent_stop,
    .agent_reconcile = api_agent_reconcile,
    .detach = hostd_guest_api_stop,
};
