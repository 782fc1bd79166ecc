/* The in-guest API's hostd side: one worker process per agent (hostd-guest-api-worker.h) serves
 * the guest's HTTP; hostd gets its calls, typed and checked, keeps the agent's rates, runs the
 * work and answers; see hostd-guest-api.h.
 *
 * Threads: each agent's worker has a reader thread, which takes its calls (the rates and the
 * heavy flag, under the agent's lock) and hands the work to a pool; the pool runs it and sends
 * the answer; a restore runs on a thread of its own once its 202 has gone out. */
#include "hostd-guest-api.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-agent.h"
#include "hostd-checkpoint-files.h"
#include "hostd-checkpoint.h"
#include "hostd-config.h"
#include "hostd-confine.h"
#include "hostd-egress.h"
#include "hostd-guest-api-rules.h"
#include "hostd-guest-api-worker.h"
#include "hostd-power.h"
#include "vm-domain.h"
#include "vm-error.h"
#include "vm-seed.h"
#include "vm-util.h"

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
    int listen_fd;               /* api.sock, which each run of the worker serves */
    HostdGuestApiWorker *worker; /* NULL once stopped */
    GMutex lock;                 /* the fields below */
    HostdGuestApiBucket bucket;
    HostdGuestApiBucket heavy_bucket;
    gboolean heavy_busy;      /* a checkpoint or restore asked from inside is under way */
    gint64 refused_logged_at; /* the last log line of a refusal for load, monotonic us */
    guint refused_unlogged;   /* refusals since then */
    GMutex status_lock;
    ApiRestore *restore;
} ApiAgent;

/* The work of one call, on the pool. */
typedef struct {
    ApiAgent *agent;
    HostdGuestApiWorker *worker; /* where the answer goes: run, serial */
    guint64 run;
    guint32 serial;
    char *method; /* for the log line */
    char *path;
    gint64 started;
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
    GCond cond;         /* a restore ended, or stopping began */
    GHashTable *agents; /* name -> ApiAgent* */
    gboolean stopping;
    GThreadPool *pool;
    guint restores; /* restore threads running */
};

static const char *const api_checkpoint_keys[] = {
    "id", "created", "label", "automatic", "kind", "quiesced", "bytes", "parent", "current", NULL,
};
static const char *const api_egress_keys[] = {"allow", "deny", "proxy", NULL};

/* ---------------------------------------------------------------------------------------------
 * Agents */

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
    g_assert(agent->worker == NULL);
    if (agent->listen_fd >= 0)
        close(agent->listen_fd);
    api_restore_free(agent->restore);
    g_mutex_clear(&agent->lock);
    g_mutex_clear(&agent->status_lock);
    g_free(agent->name);
    g_free(agent->socket_path);
    g_free(agent);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(ApiAgent, api_agent_unref)

static void api_work(gpointer data, gpointer user_data);

/* The context's API, made (with its pool) on first use when @create. */
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
        g_cond_init(&api->cond);
        api->agents = g_hash_table_new(g_str_hash, g_str_equal);
        api->pool = g_thread_pool_new(api_work, api, API_WORKERS, FALSE, NULL);
        ctx->guest_api = api;
    }
    g_mutex_unlock(&ctx->lock);
    return api;
}

/* ---------------------------------------------------------------------------------------------
 * Log and events */

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
    guint unlogged;

    g_mutex_lock(&agent->lock);
    if (agent->refused_logged_at != 0 && now - agent->refused_logged_at < G_USEC_PER_SEC) {
        agent->refused_unlogged++;
        g_mutex_unlock(&agent->lock);
        return;
    }
    unlogged = agent->refused_unlogged;
    agent->refused_logged_at = now;
    agent->refused_unlogged = 0;
    g_mutex_unlock(&agent->lock);
    if (unlogged > 0)
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s (and %u more refused for load)",
                          agent->name, what, unlogged);
    else
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s", agent->name, what);
}

/* hostd's log line of each answered call: agent, method, path, status, time. */
static void
api_log_call(ApiAgent *agent, const char *method, const char *path, guint status, gint64 started,
             gboolean refused_load)
{
    g_autofree char *line = g_strdup_printf("%s %s %u (%.0f ms)", method, path, status,
                                            (g_get_monotonic_time() - started) / 1000.0);

    if (refused_load)
        api_log_refused(agent, line);
    else
        hostd_context_log(agent->ctx, "guest api: agent '%s': %s", agent->name, line);
}

/* What the worker refused without a call, as the log says it. */
static void
api_refused(HostdGuestApiRefusal why, gpointer data)
{
    ApiAgent *agent = data;
    g_autofree char *text = NULL;

    switch (why) {
    case HOSTD_GUEST_API_REFUSED_OPEN:
        api_log_refused(agent, "a connection closed unanswered: too many open");
        break;
    case HOSTD_GUEST_API_REFUSED_HANDING:
        api_log_refused(agent, "a connection closed unanswered: too many handing over");
        break;
    case HOSTD_GUEST_API_REFUSED_NOTHING:
        hostd_context_log(agent->ctx,
                          "guest api: agent '%s': a connection to its socket handed nothing over",
                          agent->name);
        break;
    case HOSTD_GUEST_API_REFUSED_SLOW:
        api_log_refused(agent, "a connection cut: no whole request within 10 s");
        break;
    case HOSTD_GUEST_API_REFUSED_CONNECTIONS:
        text = g_strdup_printf("a request answered 503: more than %d connections at once",
                               HOSTD_GUEST_API_CONNECTIONS);
        api_log_refused(agent, text);
        break;
    case HOSTD_GUEST_API_REFUSED_BODY_CUT:
        api_log_refused(agent, "a connection cut: a body announced or sent past 1 MiB");
        break;
    default:
        break;
    }
}

/* The worker sent what no worker of ours sends: it is killed and replaced. */
static void
api_broken(const char *why, gpointer data)
{
    ApiAgent *agent = data;
    g_autofree char *cut = g_strndup(why, 200);

    /* Its words may hold what the worker sent: printable ASCII only in the log. */
    for (char *p = cut; *p != '\0'; p++) {
        if (!g_ascii_isprint(*p))
            *p = '?';
    }
    hostd_context_log(agent->ctx,
                      "guest api: agent '%s': its worker broke the protocol (%s); it is replaced",
                      agent->name, cut);
}

/* ---------------------------------------------------------------------------------------------
 * Answers */

/* Answers a call with an error of @code that hostd decided (a rate, a busy flag). */
static void
api_refuse(ApiAgent *agent, HostdGuestApiWorker *worker, guint64 run, guint32 serial,
           const HostdGuestApiCall *call, guint status, VmErrorCode code, guint retry_after_s,
           const char *message, gboolean refused_load)
{
    g_autoptr(GError) error = g_error_new_literal(VM_ERROR, code, message);
    g_autofree char *json = hostd_guest_api_error_json(error, retry_after_s);

    hostd_guest_api_worker_answer(worker, run, serial, status, json, retry_after_s);
    api_log_call(agent, call->method, call->path, status, g_get_monotonic_time(), refused_load);
}

/* ---------------------------------------------------------------------------------------------
 * The work of requests (pool threads) */

static void
api_job_free(gpointer data)
{
    ApiJob *job = data;

    hostd_guest_api_args_clear(&job->args);
    hostd_guest_api_worker_unref(job->worker);
    g_free(job->method);
    g_free(job->path);
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

static void api_restore_schedule(ApiAgent *agent, const HostdGuestApiArgs *args);
static void api_heavy_done(ApiAgent *agent);

static void
api_work(gpointer data, gpointer user_data)
{
    ApiJob *job = data;
    ApiAgent *agent = job->agent;
    HostdContext *ctx = agent->ctx;
    g_autoptr(GError) error = NULL;
    g_autofree char *id = NULL;
    g_autofree char *json = NULL;
    char *body = NULL;
    guint status;

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
    if (body != NULL && strlen(body) > HOSTD_GUEST_API_WIRE_ANSWER_MAX) {
        g_clear_pointer(&body, g_free);
        vm_throw(&error, VM_ERROR_FAILED, "the answer is longer than %d bytes",
                 HOSTD_GUEST_API_WIRE_ANSWER_MAX);
    }
    if (body == NULL)
        job->error = api_guest_error(ctx, error);
    job->body = body;

    if (job->body != NULL) {
        status = job->status;
    } else {
        status = hostd_guest_api_error_status(vm_error_code(job->error));
        json = hostd_guest_api_error_json(job->error, 0);
    }
    /* Free before the answer goes: the guest may ask the next one as soon as it has it. A
     * restore keeps the flag until it ended. */
    if (!job->restore_accepted && (job->route->flags & HOSTD_GUEST_API_HEAVY))
        api_heavy_done(agent);
    hostd_guest_api_worker_answer(job->worker, job->run, job->serial, status,
                                  job->body != NULL ? job->body : json, 0);
    api_log_call(agent, job->method, job->path, status, job->started, FALSE);
    /* The restore starts once its answer had its moment to reach the guest: see
     * api_restore_thread(). */
    if (job->restore_accepted)
        api_restore_schedule(agent, &job->args);
    api_job_free(job);
}

/* ---------------------------------------------------------------------------------------------
 * Restores asked from inside (their own thread) */

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

static void
api_heavy_done(ApiAgent *agent)
{
    g_mutex_lock(&agent->lock);
    agent->heavy_busy = FALSE;
    g_mutex_unlock(&agent->lock);
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

/* Ends a restore thread: the API's count of them. */
static void
api_restore_ended(HostdGuestApi *api)
{
    g_mutex_lock(&api->lock);
    api->restores--;
    g_cond_broadcast(&api->cond);
    g_mutex_unlock(&api->lock);
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
    gint64 deadline = g_get_monotonic_time() + (gint64)HOSTD_GUEST_API_RESTORE_DELAY_MS * 1000;
    gboolean stopping;

    /* The answer went to the worker a moment ago: it reaches the guest before the restore
     * begins, unless hostd is stopping. */
    g_mutex_lock(&api->lock);
    while (!api->stopping && g_cond_wait_until(&api->cond, &api->lock, deadline))
        ;
    stopping = api->stopping;
    g_mutex_unlock(&api->lock);
    if (stopping) {
        vm_throw(&error, VM_ERROR_CANCELLED, "hostd stopped before the restore began");
        api_restore_set(agent, "failed", NULL, error);
        api_heavy_done(agent);
        api_restore_run_free(run);
        api_restore_ended(api);
        return NULL;
    }

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
    api_heavy_done(agent);
    api_restore_run_free(run);
    api_restore_ended(api);
    return NULL;
}

/* Starts the restore @args of @agent on its own thread, unless hostd is stopping. */
static void
api_restore_schedule(ApiAgent *agent, const HostdGuestApiArgs *args)
{
    HostdGuestApi *api = agent->api;
    g_autoptr(GError) error = NULL;
    ApiRestoreRun *run;

    g_mutex_lock(&api->lock);
    if (api->stopping) {
        g_mutex_unlock(&api->lock);
        vm_throw(&error, VM_ERROR_CANCELLED, "hostd stopped before the restore began");
        api_restore_set(agent, "failed", NULL, error);
        api_heavy_done(agent);
        return;
    }
    api->restores++;
    g_mutex_unlock(&api->lock);
    run = g_new0(ApiRestoreRun, 1);
    run->agent = api_agent_ref(agent);
    run->id = g_strdup(args->id);
    run->paths = g_strdupv(args->paths);
    g_thread_unref(g_thread_new("hostd-guest-restore", api_restore_thread, run));
}

/* A call the agent's worker made (its reader thread): the agent's rate first, whatever the call
 * (as the API always counted), then the worker's own refusal, or the heavy flag and rate, and
 * the work on the pool. */
static void
api_call(HostdGuestApiWorker *worker, guint64 run, guint32 serial, HostdGuestApiCall *call,
         gpointer data)
{
    ApiAgent *agent = data;
    const HostdConfig *config = agent->ctx->config;
    const HostdGuestApiRoute *route;
    g_autofree char *message = NULL;
    guint retry = 0, status = 0;
    const char *allow = NULL;
    gboolean taken;
    ApiJob *job;

    g_mutex_lock(&agent->lock);
    taken = hostd_guest_api_bucket_take(&agent->bucket, config->guest_api_rate,
                                        config->guest_api_burst, g_get_monotonic_time(), &retry);
    g_mutex_unlock(&agent->lock);
    if (!taken) {
        message = g_strdup_printf("too many requests: at most %u a second, in bursts of %u",
                                  config->guest_api_rate, config->guest_api_burst);
        api_refuse(agent, worker, run, serial, call, 429, VM_ERROR_BUSY, retry, message, TRUE);
        return;
    }
    if (call->endpoint == 0) {
        hostd_guest_api_worker_answer(worker, run, serial, 0, NULL, 0);
        api_log_call(agent, call->method, call->path, call->status, g_get_monotonic_time(), FALSE);
        return;
    }
    /* Checked to be there by hostd_guest_api_call_from_variant(). */
    route = hostd_guest_api_route(call->method, call->path, &status, &allow);
    g_assert(route != NULL && route->endpoint == call->endpoint);
    if (route->flags & HOSTD_GUEST_API_HEAVY) {
        g_mutex_lock(&agent->lock);
        if (agent->heavy_busy) {
            g_mutex_unlock(&agent->lock);
            api_refuse(agent, worker, run, serial, call, 409, VM_ERROR_BUSY, 1,
                       "a checkpoint or restore asked from inside is under way", FALSE);
            return;
        }
        if (!hostd_guest_api_bucket_take(&agent->heavy_bucket, HOSTD_GUEST_API_HEAVY_RATE,
                                         HOSTD_GUEST_API_HEAVY_BURST, g_get_monotonic_time(),
                                         &retry)) {
            g_mutex_unlock(&agent->lock);
            api_refuse(agent, worker, run, serial, call, 429, VM_ERROR_BUSY, retry,
                       "too many checkpoints and restores: one every 10 s, in bursts of 3", TRUE);
            return;
        }
        agent->heavy_busy = TRUE;
        g_mutex_unlock(&agent->lock);
    }
    job = g_new0(ApiJob, 1);
    job->agent = api_agent_ref(agent);
    job->worker = hostd_guest_api_worker_ref(worker);
    job->run = run;
    job->serial = serial;
    job->method = g_steal_pointer(&call->method);
    job->path = g_steal_pointer(&call->path);
    job->started = g_get_monotonic_time();
    job->route = route;
    job->args = call->args;
    call->args = (HostdGuestApiArgs){0};
    g_thread_pool_push(agent->api->pool, job, NULL);
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

/* Stops serving @agent: its worker killed (open connections close with it), no new connection
 * taken, the socket file gone. */
static void
api_agent_shutdown(ApiAgent *agent)
{
    /* No lock held: the worker's reader may be in api_call(), which takes the agent's. */
    g_clear_pointer(&agent->worker, hostd_guest_api_worker_free);
    if (agent->listen_fd >= 0) {
        close(agent->listen_fd);
        agent->listen_fd = -1;
        g_unlink(agent->socket_path);
    }
}

/* Whether @agent still listens on its socket file. */
static gboolean
api_agent_healthy(const ApiAgent *agent)
{
    struct stat st;

    return stat(agent->socket_path, &st) == 0 && S_ISSOCK(st.st_mode);
}

char *
hostd_guest_api_worker_path(void)
{
    return vm_program_path("VM_GUEST_API_WORKER", HOSTD_GUEST_API_WORKER_BUILD,
                           HOSTD_GUEST_API_WORKER_INSTALLED);
}

/* Starts @agent's worker on its socket, as the API worker's id of agent id @agent_id
 * (hostd_confine_worker_user()). */
static gboolean
api_agent_serve(ApiAgent *agent, guint agent_id, GError **error)
{
    g_autofree char *program = hostd_guest_api_worker_path();
    HostdGuestApiWorkerConfig config = {
        .worker = {.program = program, .name = agent->name, .listen_fd = agent->listen_fd},
        .call = api_call,
        .refused = api_refused,
        .broken = api_broken,
        .user_data = agent,
    };

    guint uid = 0, gid = 0;

    if (!hostd_confine_worker_user(agent->ctx, agent->name, agent_id, HOSTD_WORKER_API,
                                   &config.worker.change_user, &uid, &gid, error))
        return FALSE;
    config.worker.uid = uid;
    config.worker.gid = gid;
    agent->worker = hostd_guest_api_worker_new(&config, error);
    return agent->worker != NULL;
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
        api_agent_shutdown(old);

    agent = g_new0(ApiAgent, 1);
    agent->refs = 1;
    agent->api = api;
    agent->ctx = ctx;
    agent->name = g_strdup(r->name);
    agent->socket_path = hostd_agent_record_path(r, HOSTD_AGENT_API_SOCKET);
    g_mutex_init(&agent->lock);
    g_mutex_init(&agent->status_lock);
    fd = api_listen(ctx, r->name, agent->socket_path, error);
    agent->listen_fd = fd;
    if (fd < 0) {
        api_agent_unref(agent);
        return FALSE;
    }
    if (!api_agent_serve(agent, r->agent_id, error)) {
        api_agent_shutdown(agent);
        api_agent_unref(agent);
        return FALSE;
    }
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
        api_agent_shutdown(agent);
}

GPid
hostd_guest_api_pid(HostdContext *ctx, const char *name)
{
    HostdGuestApi *api = api_get(ctx, FALSE);
    ApiAgent *agent;
    GPid pid = 0;

    if (api == NULL)
        return 0;
    g_mutex_lock(&api->lock);
    agent = g_hash_table_lookup(api->agents, name);
    if (agent != NULL && agent->worker != NULL)
        pid = hostd_guest_api_worker_get_pid(agent->worker);
    g_mutex_unlock(&api->lock);
    return pid;
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
    g_cond_broadcast(&api->cond);
    g_mutex_unlock(&api->lock);
    g_hash_table_iter_init(&iter, api->agents);
    while (g_hash_table_iter_next(&iter, NULL, &value)) {
        api_agent_shutdown(value);
        api_agent_unref(value);
    }
    g_hash_table_remove_all(api->agents);
    /* The work in flight ends; its answers go nowhere now. */
    g_thread_pool_free(api->pool, FALSE, TRUE);
    g_mutex_lock(&api->lock);
    while (api->restores > 0)
        g_cond_wait(&api->cond, &api->lock);
    g_mutex_unlock(&api->lock);
    g_hash_table_unref(api->agents);
    g_cond_clear(&api->cond);
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
