/* Egress for agents: a proxy per agent on a Unix socket, its policy file and its log. */
#include "hostd-egress.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "hostd-agent.h"
#include "hostd-confine.h"
#include "hostd-egress-worker.h"
#include "hostd-logfile.h"
#include "vm-domain-read.h"
#include "vm-egress-ca.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-protocol.h"
#include "vm-stream.h"
#include "vm-util.h"

#define EGRESS_GROUP "egress"

/* Under the state directory: the agents' CAs, NAME.crt and NAME.key. Outside every agent's
 * directory, so that nothing an agent's files are copied into (a checkpoint, a fork, an export)
 * carries a CA key. */
#define EGRESS_CA_DIR "egress-ca"

/* The port a grant opens on its secret's hosts: interception is for HTTPS only. */
#define EGRESS_GRANT_PORT "443"

typedef struct {
    char *name;
    char *socket_path;
    HostdLogFile *log;
    VmEgressProxy *proxy;        /* egress-worker = off: the proxy in this process */
    HostdEgressWorker *worker;   /* else: the proxy in a worker process */
    int listen_fd;               /* with a worker: the socket it serves, hostd's own */
    VmEgressPolicy *user_policy; /* the stored rules; the proxy's adds the grants' hosts */
} EgressAgent;

/* hostd's egress state for one context (ctx->egress): its agents' proxies and what they
 * share. */
typedef struct _HostdEgress {
    GMutex lock;        /* the table and the fields below */
    GMutex run_lock;    /* one proxy start or restart at a time */
    GHashTable *agents; /* name -> EgressAgent */
    gboolean owner_known;
    gboolean owner_chown; /* the sockets go to QEMU's user */
    uid_t owner_uid;
    gid_t owner_gid;
    VmEgressResolveFunc resolve;
    gpointer resolve_data;
    guint worker_answer_ms, worker_ping_ms; /* 0: the workers' defaults */
    GHashTable *credentials; /* name -> VmEgressCredentials: the grants each proxy honours */
    GHashTable *grant_hosts; /* name -> GStrv: the hosts its grants open on port 443 */
    GMutex ca_lock;          /* one CA made or removed at a time */
} Egress;

static void
egress_agent_free(EgressAgent *agent)
{
    if (agent == NULL)
        return;
    /* The proxy first: its threads log until it returns. */
    vm_egress_proxy_free(agent->proxy);
    hostd_egress_worker_free(agent->worker);
    if (agent->listen_fd >= 0) {
        /* Gone at once, so a guest's next connection fails instead of waiting on a socket
         * nobody serves. */
        (void)g_unlink(agent->socket_path);
        close(agent->listen_fd);
    }
    g_clear_pointer(&agent->user_policy, vm_egress_policy_unref);
    hostd_logfile_free(agent->log);
    g_free(agent->name);
    g_free(agent->socket_path);
    g_free(agent);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(EgressAgent, egress_agent_free)

static Egress *
egress_get(HostdContext *ctx, gboolean create)
{
    Egress *egress;

    g_mutex_lock(&ctx->lock);
    egress = ctx->egress;
    if (egress == NULL && create) {
        egress = g_new0(Egress, 1);
        g_mutex_init(&egress->lock);
        g_mutex_init(&egress->run_lock);
        g_mutex_init(&egress->ca_lock);
        egress->agents = g_hash_table_new(g_str_hash, g_str_equal);
        egress->credentials = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                                    (GDestroyNotify)vm_egress_credentials_unref);
        egress->grant_hosts =
            g_hash_table_new_full(g_str_hash, g_str_equal, g_free, (GDestroyNotify)g_strfreev);
        ctx->egress = egress;
    }
    g_mutex_unlock(&ctx->lock);
    return egress;
}

/* ---------------------------------------------------------------------------------------------
 * Where the guest forward can work, and how it is spelled */

char *
hostd_egress_helper_path(void)
{
    return vm_program_path("VM_EGRESS_CONNECT", HOSTD_EGRESS_CONNECT_BUILD,
                           HOSTD_EGRESS_CONNECT_INSTALLED);
}

char *
hostd_egress_worker_path(void)
{
    return vm_program_path("VM_EGRESS_WORKER", HOSTD_EGRESS_WORKER_BUILD,
                           HOSTD_EGRESS_WORKER_INSTALLED);
}

char *
hostd_egress_forward_command(HostdContext *ctx, const char *socket_path)
{
    g_autofree char *helper = NULL;
    g_autofree char *quoted_helper = NULL;
    g_autofree char *quoted_socket = NULL;

    /* libvirt's own seccomp filter kills QEMU when the guest forward spawns its helper. */
    if (!ctx->lv->qemu_may_spawn)
        return NULL;
    helper = hostd_egress_helper_path();
    quoted_helper = g_shell_quote(helper);
    quoted_socket = g_shell_quote(socket_path);
    return g_strconcat(quoted_helper, " ", quoted_socket, NULL);
}

char *
hostd_egress_command(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_autofree char *socket_path = hostd_agent_record_path(r, HOSTD_AGENT_EGRESS_SOCKET);

    return hostd_egress_forward_command(ctx, socket_path);
}

/* QEMU's user and group as libvirt's DAC driver labels its processes ("+64055:+64055" in the
 * capabilities), so the socket can be theirs and nobody else's. Unknown (test driver, a session
 * connection): the socket stays hostd's, which is then QEMU's user too. */
static void
egress_find_owner_locked(HostdContext *ctx, Egress *egress)
{
    g_autofree char *caps = NULL;
    guint uid, gid;

    if (egress->owner_known)
        return;
    egress->owner_known = TRUE;
    caps = virConnectGetCapabilities(ctx->lv->conn);
    if (caps == NULL) {
        virResetLastError();
        return;
    }
    if (vm_capabilities_read_dac_owner(caps, ctx->lv->virt_type, &uid, &gid, NULL)) {
        egress->owner_chown = TRUE;
        egress->owner_uid = uid;
        egress->owner_gid = gid;
    }
}

gboolean
hostd_egress_socket_owner(HostdContext *ctx, const char *name, uid_t *ret_uid, gid_t *ret_gid)
{
    Egress *egress = egress_get(ctx, TRUE);
    gboolean known;

    if (ctx->agent_ids) {
        g_autofree char *dir = hostd_agent_dir(ctx, name);
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
        if (r != NULL && r->agent_id != 0) {
            *ret_uid = r->agent_id;
            *ret_gid = r->agent_id;
            return TRUE;
        }
    }
    g_mutex_lock(&egress->lock);
    egress_find_owner_locked(ctx, egress);
    known = egress->owner_chown;
    if (known) {
        *ret_uid = egress->owner_uid;
        *ret_gid = egress->owner_gid;
    }
    g_mutex_unlock(&egress->lock);
    return known;
}

/* ---------------------------------------------------------------------------------------------
 * Policy files */

static char *
egress_policy_path(HostdContext *ctx, const char *name)
{
    g_autofree char *dir = hostd_agent_dir(ctx, name);

    return g_build_filename(dir, HOSTD_AGENT_EGRESS_POLICY, NULL);
}

/* The stored policy of @name; none when it has no policy file. */
static VmEgressPolicy *
egress_policy_load(HostdContext *ctx, const char *name, GError **error)
{
    g_autofree char *path = egress_policy_path(ctx, name);
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autoptr(GError) local_error = NULL;
    VmEgressPolicy *policy;

    if (!g_key_file_load_from_file(keyfile, path, G_KEY_FILE_NONE, &local_error)) {
        if (g_error_matches(local_error, G_FILE_ERROR, G_FILE_ERROR_NOENT))
            return vm_egress_policy_new_none();
        return vm_throw(error, VM_ERROR_IO, "cannot read %s: %s", path, local_error->message), NULL;
    }
    policy = vm_egress_policy_new_from_keyfile(keyfile, EGRESS_GROUP, &local_error);
    if (policy == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path, local_error->message),
               NULL;
    return policy;
}

static gboolean
egress_policy_save(HostdContext *ctx, const char *name, const VmEgressPolicy *policy,
                   GError **error)
{
    g_autofree char *path = egress_policy_path(ctx, name);
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autofree char *data = NULL;
    gsize len = 0;

    g_key_file_set_comment(keyfile, NULL, NULL,
                           " The agent's egress policy; change it with vmctl egress NAME.", NULL);
    vm_egress_policy_to_keyfile(policy, keyfile, EGRESS_GROUP);
    data = g_key_file_to_data(keyfile, &len, NULL);
    return vm_file_write_atomic(path, data, (gssize)len, 0600, error);
}

/* ---------------------------------------------------------------------------------------------
 * The log */

/* The proxy's log callback: one JSON line per record, not synced. A write that fails loses that
 * record only; the proxy itself must never wait on or fail because of its log. */
static void
egress_log_record(const VmEgressRecord *record, gpointer user_data)
{
    EgressAgent *agent = user_data;
    g_autofree char *json = vm_egress_record_to_json(record);

    (void)hostd_logfile_append(agent->log, json, NULL);
}

/* The same for a worker's records, which hostd_egress_worker checked to be one JSON object. */
static void
egress_log_line(const char *json, gpointer user_data)
{
    EgressAgent *agent = user_data;

    (void)hostd_logfile_append(agent->log, json, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * One agent's proxy, in this process or in its worker */

static void
egress_agent_set_policy(EgressAgent *agent, VmEgressPolicy *policy)
{
    if (agent->worker != NULL)
        hostd_egress_worker_set_policy(agent->worker, policy);
    else
        vm_egress_proxy_set_policy(agent->proxy, policy);
}

static void
egress_agent_set_credentials(EgressAgent *agent, VmEgressCredentials *creds)
{
    if (agent->worker != NULL)
        hostd_egress_worker_set_credentials(agent->worker, creds);
    else
        vm_egress_proxy_set_credentials(agent->proxy, creds);
}

static VmEgressPolicy *
egress_agent_dup_policy(EgressAgent *agent)
{
    if (agent->worker != NULL)
        return hostd_egress_worker_dup_policy(agent->worker);
    return vm_egress_proxy_dup_policy(agent->proxy);
}

/* ---------------------------------------------------------------------------------------------
 * The policy a proxy runs with: the user's rules and the grants' hosts */

/* @user with each of @hosts allowed on port 443, or a new reference to @user when that adds
 * nothing (no hosts, or "any" allowed already). The user's deny rules still win: a host the
 * user denies stays closed whatever is granted. The stored policy never holds these rules, so
 * `vmctl egress` shows the user's own and a revoke closes the host again. */
static VmEgressPolicy *
egress_effective_policy(VmEgressPolicy *user, const char *const *hosts)
{
    g_auto(GStrv) allow = vm_egress_policy_dup_allow(user);
    g_auto(GStrv) deny = vm_egress_policy_dup_deny(user);
    g_autoptr(GPtrArray) rules = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GPtrArray) deny_rules = g_ptr_array_new_with_free_func(g_free);
    VmEgressPolicy *policy;

    if (hosts == NULL || hosts[0] == NULL || g_strv_contains((const char *const *)allow, "any"))
        return vm_egress_policy_ref(user);
    for (char **rule = allow; *rule != NULL; rule++) {
        if (!g_str_equal(*rule, "none"))
            g_ptr_array_add(rules, g_strdup(*rule));
    }
    for (const char *const *host = hosts; *host != NULL; host++) {
        g_autofree char *rule = g_strconcat(*host, ":" EGRESS_GRANT_PORT, NULL);

        if (!g_ptr_array_find_with_equal_func(rules, rule, g_str_equal, NULL))
            g_ptr_array_add(rules, g_steal_pointer(&rule));
    }
    for (char **rule = deny; *rule != NULL; rule++) {
        if (!g_str_equal(*rule, "none"))
            g_ptr_array_add(deny_rules, g_strdup(*rule));
    }
    g_ptr_array_add(rules, NULL);
    g_ptr_array_add(deny_rules, NULL);
    policy = vm_egress_policy_new((const char *const *)rules->pdata,
                                  (const char *const *)deny_rules->pdata, NULL);
    /* The secret store checks every host pattern as an egress rule; should one still not parse,
     * the grant's hosts stay closed rather than the user's rules being lost. */
    return policy != NULL ? policy : vm_egress_policy_ref(user);
}

/* What @name's proxy must run with for @user: the user's rules and its grants' hosts. */
static VmEgressPolicy *
egress_effective_locked(Egress *egress, const char *name, VmEgressPolicy *user)
{
    return egress_effective_policy(user, g_hash_table_lookup(egress->grant_hosts, name));
}

/* ---------------------------------------------------------------------------------------------
 * The agents' CAs */

static char *
egress_ca_dir(HostdContext *ctx)
{
    return g_build_filename(ctx->config->state_dir, EGRESS_CA_DIR, NULL);
}

static char *
egress_ca_path(HostdContext *ctx, const char *name, const char *suffix)
{
    g_autofree char *dir = egress_ca_dir(ctx);
    g_autofree char *file = g_strconcat(name, suffix, NULL);

    return g_build_filename(dir, file, NULL);
}

/* @name's CA as PEM (certificate and key), made and stored on first use: the key first, so
 * that a certificate on disk always has its key beside it; a pair found incomplete (a crash
 * between the two writes) is made anew. With ca_lock held. */
static gboolean
egress_ca_get_locked(HostdContext *ctx, const char *name, char **ret_cert, char **ret_key,
                     GError **error)
{
    g_autofree char *dir = egress_ca_dir(ctx);
    g_autofree char *cert_path = egress_ca_path(ctx, name, ".crt");
    g_autofree char *key_path = egress_ca_path(ctx, name, ".key");
    g_autofree char *cert = NULL;
    g_autofree char *key = NULL;

    if (!vm_name_validate(name, error))
        return FALSE;
    if (g_file_get_contents(cert_path, &cert, NULL, NULL) &&
        g_file_get_contents(key_path, &key, NULL, NULL)) {
        *ret_cert = g_steal_pointer(&cert);
        *ret_key = g_steal_pointer(&key);
        return TRUE;
    }
    g_clear_pointer(&cert, g_free);
    g_clear_pointer(&key, g_free);
    if (g_mkdir_with_parents(dir, 0700) < 0)
        return vm_throw(error, VM_ERROR_IO, "cannot create %s: %s", dir, g_strerror(errno));
    /* A directory made by an older hostd or by hand is narrowed: it holds keys. */
    if (g_chmod(dir, 0700) < 0)
        return vm_throw(error, VM_ERROR_IO, "cannot restrict %s: %s", dir, g_strerror(errno));
    if (!vm_egress_ca_generate(name, &cert, &key, error))
        return FALSE;
    /* The key's bytes are never put into an error message: only the path. */
    if (!vm_file_write_atomic(key_path, key, -1, 0600, error) ||
        !vm_file_write_atomic(cert_path, cert, -1, 0644, error))
        return FALSE;
    *ret_cert = g_steal_pointer(&cert);
    *ret_key = g_steal_pointer(&key);
    return TRUE;
}

static gboolean
egress_ca_get(HostdContext *ctx, Egress *egress, const char *name, char **ret_cert, char **ret_key,
              GError **error)
{
    gboolean ok;

    g_mutex_lock(&egress->ca_lock);
    ok = egress_ca_get_locked(ctx, name, ret_cert, ret_key, error);
    g_mutex_unlock(&egress->ca_lock);
    return ok;
}

/* Removes @name's CA files (rm, and a new agent that finds an old one under its name). */
static void
egress_ca_remove(HostdContext *ctx, Egress *egress, const char *name)
{
    g_autofree char *cert_path = egress_ca_path(ctx, name, ".crt");
    g_autofree char *key_path = egress_ca_path(ctx, name, ".key");

    g_mutex_lock(&egress->ca_lock);
    (void)g_unlink(cert_path);
    (void)g_unlink(key_path);
    g_mutex_unlock(&egress->ca_lock);
}

/* ---------------------------------------------------------------------------------------------
 * Proxies */

static EgressAgent *
egress_agent_new(HostdContext *ctx, Egress *egress, const char *name, VmEgressPolicy *policy,
                 GError **error)
{
    g_autoptr(EgressAgent) agent = g_new0(EgressAgent, 1);
    g_autofree char *dir = hostd_agent_dir(ctx, name);
    g_autofree char *worker_program = NULL;
    g_autofree char *log_path = NULL;
    g_autofree char *ca_cert = NULL;
    g_autofree char *ca_key = NULL;
    g_autoptr(VmEgressPolicy) effective = NULL;
    VmEgressConfig config = {
        .max_connections = HOSTD_EGRESS_MAX_CONNECTIONS,
        .handshake_timeout_ms = HOSTD_EGRESS_HANDSHAKE_MS,
        .idle_timeout_ms = HOSTD_EGRESS_IDLE_MS,
        .connect_timeout_ms = HOSTD_EGRESS_CONNECT_MS,
        .log = egress_log_record,
        .upstream_ca_file = ctx->config->egress_upstream_ca_file,
    };

    agent->listen_fd = -1;
    /* Every proxy holds its agent's CA from the start, so that a grant made while it runs can be
     * intercepted at once: the CA cannot be handed over later. */
    if (!egress_ca_get(ctx, egress, name, &ca_cert, &ca_key, error))
        return NULL;
    config.ca_cert_pem = ca_cert;
    config.ca_key_pem = ca_key;
    agent->name = g_strdup(name);
    agent->user_policy = vm_egress_policy_ref(policy);
    agent->socket_path = g_build_filename(dir, HOSTD_AGENT_EGRESS_SOCKET, NULL);
    log_path = g_build_filename(dir, HOSTD_AGENT_EGRESS_LOG, NULL);
    agent->log = hostd_logfile_new(log_path, HOSTD_EGRESS_LOG_MAX, HOSTD_LOGFILE_NONE);

    uid_t owner_uid = 0;
    gid_t owner_gid = 0;
    guint worker_answer_ms, worker_ping_ms;
    gboolean owner_known = hostd_egress_socket_owner(ctx, name, &owner_uid, &owner_gid);
    g_mutex_lock(&egress->lock);
    config.listen_path = agent->socket_path;
    config.listen_chown = owner_known;
    config.listen_uid = owner_uid;
    config.listen_gid = owner_gid;
    config.resolve = egress->resolve;
    config.resolve_data = egress->resolve_data;
    worker_answer_ms = egress->worker_answer_ms;
    worker_ping_ms = egress->worker_ping_ms;
    config.credentials = g_hash_table_lookup(egress->credentials, name);
    if (config.credentials != NULL)
        vm_egress_credentials_ref(config.credentials);
    effective = egress_effective_locked(egress, name, policy);
    config.policy = effective;
    g_mutex_unlock(&egress->lock);
    config.log_data = agent;
    if (ctx->config->egress_in_process) {
        agent->proxy = vm_egress_proxy_new(&config, error);
    } else {
        HostdEgressWorkerConfig wconfig = {
            .worker = {.name = name,
                       .answer_timeout_ms = worker_answer_ms,
                       .ping_interval_ms = worker_ping_ms},
            .policy = config.policy,
            .credentials = config.credentials,
            .ca_cert_pem = config.ca_cert_pem,
            .ca_key_pem = config.ca_key_pem,
            .upstream_ca_file = config.upstream_ca_file,
            .max_connections = config.max_connections,
            .handshake_timeout_ms = config.handshake_timeout_ms,
            .idle_timeout_ms = config.idle_timeout_ms,
            .connect_timeout_ms = config.connect_timeout_ms,
            .log = egress_log_line,
            .log_data = agent,
            .resolve = config.resolve,
            .resolve_data = config.resolve_data,
        };

        /* The record is on disk from `new`'s first step (and, for a warm build, none). */
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
        guint uid = 0, gid = 0;

        worker_program = hostd_egress_worker_path();
        wconfig.worker.program = worker_program;
        /* hostd owns the socket; each worker run serves it, and connections a guest makes
         * while one restarts wait in its backlog. */
        if (hostd_confine_worker_user(ctx, name, r != NULL ? r->agent_id : 0, HOSTD_WORKER_EGRESS,
                                      &wconfig.worker.change_user, &uid, &gid, error)) {
            wconfig.worker.uid = uid;
            wconfig.worker.gid = gid;
            agent->listen_fd =
                vm_egress_proxy_listen_unix(agent->socket_path, config.listen_chown,
                                            config.listen_uid, config.listen_gid, error);
            wconfig.worker.listen_fd = agent->listen_fd;
            if (agent->listen_fd >= 0)
                agent->worker = hostd_egress_worker_new(&wconfig, error);
        }
    }
    if (config.credentials != NULL)
        vm_egress_credentials_unref(config.credentials);
    /* The key's copy in this process's heap goes as soon as the proxy has its own. */
    if (ca_key != NULL)
        memset(ca_key, 0, strlen(ca_key));
    if (agent->proxy == NULL && agent->worker == NULL)
        return NULL;
    return g_steal_pointer(&agent);
}

/* Whether @agent's socket is still the one its proxy listens on. */
static gboolean
egress_agent_healthy(const EgressAgent *agent)
{
    struct stat st;

    return stat(agent->socket_path, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Starts (or restarts) @name's proxy with @policy, replacing one that runs. */
static gboolean
egress_agent_run(HostdContext *ctx, const char *name, VmEgressPolicy *policy, GError **error)
{
    Egress *egress = egress_get(ctx, TRUE);
    g_autoptr(EgressAgent) old = NULL;
    EgressAgent *agent;

    /* Two starts at once would each bind the socket, and the loser would serve an unlinked one. */
    g_mutex_lock(&egress->run_lock);
    /* The old proxy goes first: it unlinks its socket when it stops. */
    g_mutex_lock(&egress->lock);
    (void)g_hash_table_steal_extended(egress->agents, name, NULL, (gpointer *)&old);
    g_mutex_unlock(&egress->lock);
    g_clear_pointer(&old, egress_agent_free);

    agent = egress_agent_new(ctx, egress, name, policy, error);
    if (agent != NULL) {
        g_mutex_lock(&egress->lock);
        g_hash_table_insert(egress->agents, agent->name, agent);
        g_mutex_unlock(&egress->lock);
    }
    g_mutex_unlock(&egress->run_lock);
    return agent != NULL;
}

/* A new reference to the user's policy @name's proxy runs with (without its grants' hosts), or
 * NULL when none runs. */
static VmEgressPolicy *
egress_running_policy(HostdContext *ctx, const char *name, guint *ret_connections)
{
    Egress *egress = egress_get(ctx, FALSE);
    VmEgressPolicy *policy = NULL;
    EgressAgent *agent;
    HostdEgressWorker *worker = NULL;

    if (ret_connections != NULL)
        *ret_connections = 0;
    if (egress == NULL)
        return NULL;
    g_mutex_lock(&egress->lock);
    agent = g_hash_table_lookup(egress->agents, name);
    if (agent != NULL) {
        policy = vm_egress_policy_ref(agent->user_policy);
        if (ret_connections != NULL && agent->worker != NULL)
            worker = hostd_egress_worker_ref(agent->worker);
        else if (ret_connections != NULL)
            *ret_connections = vm_egress_proxy_get_n_connections(agent->proxy);
    }
    g_mutex_unlock(&egress->lock);
    /* A worker's answer is awaited without the lock: it may take its time. */
    if (worker != NULL) {
        *ret_connections = hostd_egress_worker_get_n_connections(worker);
        hostd_egress_worker_unref(worker);
    }
    return policy;
}

/* Applies the user's @policy (NULL: the one it has) with its grants' hosts to @name's running
 * proxy; FALSE when none runs. */
static gboolean
egress_apply(HostdContext *ctx, const char *name, VmEgressPolicy *policy)
{
    Egress *egress = egress_get(ctx, FALSE);
    EgressAgent *agent;

    if (egress == NULL)
        return FALSE;
    g_mutex_lock(&egress->lock);
    agent = g_hash_table_lookup(egress->agents, name);
    if (agent != NULL) {
        g_autoptr(VmEgressPolicy) effective = NULL;

        if (policy != NULL) {
            vm_egress_policy_ref(policy);
            g_clear_pointer(&agent->user_policy, vm_egress_policy_unref);
            agent->user_policy = policy;
        }
        effective = egress_effective_locked(egress, name, agent->user_policy);
        egress_agent_set_policy(agent, effective);
    }
    g_mutex_unlock(&egress->lock);
    return agent != NULL;
}

/* The template spells "any" as "*". */
static char **
egress_template_rules(const char *const *rules)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();

    for (const char *const *rule = rules; rule != NULL && *rule != NULL; rule++)
        g_strv_builder_add(builder, g_str_equal(*rule, "*") ? "any" : *rule);
    return g_strv_builder_end(builder);
}

static VmEgressPolicy *egress_policy_edit(HostdContext *ctx, const VmEgressPolicy *current,
                                          const char *const *allow, const char *const *deny,
                                          const char *const *remove, gboolean reset,
                                          GError **error);

/* The policy of a new agent: the template's rules, "*" for "any", as `vmctl egress --allow`
 * would add them one after the other, so that "none" and "any" among `new --egress` rules mean
 * what they mean there. */
static VmEgressPolicy *
egress_initial_policy(HostdContext *ctx, const char *what, const char *const *allow,
                      const char *const *deny, GError **error)
{
    g_auto(GStrv) allow_rules = egress_template_rules(allow);
    g_auto(GStrv) deny_rules = egress_template_rules(deny);
    g_autoptr(GError) local_error = NULL;
    g_autoptr(VmEgressPolicy) none = vm_egress_policy_new_none();
    VmEgressPolicy *policy =
        egress_policy_edit(ctx, none, (const char *const *)allow_rules,
                           (const char *const *)deny_rules, NULL, FALSE, &local_error);

    if (policy == NULL)
        return vm_throw(error, vm_error_code(local_error), "%segress: %s", what,
                        local_error->message),
               NULL;
    return policy;
}

gboolean
hostd_egress_agent_init(HostdContext *ctx, const HostdAgentRecord *r, const char *const *allow,
                        const char *const *deny, GError **error)
{
    g_autofree char *what = g_strdup_printf("template %s: ", r->template_name);
    g_autoptr(VmEgressPolicy) policy = egress_initial_policy(ctx, what, allow, deny, error);

    if (policy == NULL)
        return FALSE;
    if (!egress_policy_save(ctx, r->name, policy, error))
        return FALSE;
    return egress_agent_run(ctx, r->name, policy, error);
}

gboolean
hostd_egress_agent_start(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    Egress *egress = egress_get(ctx, TRUE);
    g_autoptr(VmEgressPolicy) policy = NULL;
    gboolean healthy = FALSE;
    EgressAgent *agent;

    g_mutex_lock(&egress->lock);
    agent = g_hash_table_lookup(egress->agents, r->name);
    healthy = agent != NULL && egress_agent_healthy(agent);
    g_mutex_unlock(&egress->lock);
    if (healthy)
        return TRUE;
    policy = egress_policy_load(ctx, r->name, error);
    if (policy == NULL)
        return FALSE;
    return egress_agent_run(ctx, r->name, policy, error);
}

void
hostd_egress_agent_stop(HostdContext *ctx, const char *name)
{
    Egress *egress = egress_get(ctx, FALSE);
    EgressAgent *agent = NULL;

    if (egress == NULL)
        return;
    /* Freed under the run lock: a proxy unlinks its socket path when it stops, which must not
     * be the path a new proxy for the same name has just bound. */
    g_mutex_lock(&egress->run_lock);
    g_mutex_lock(&egress->lock);
    (void)g_hash_table_steal_extended(egress->agents, name, NULL, (gpointer *)&agent);
    g_mutex_unlock(&egress->lock);
    egress_agent_free(agent);
    g_mutex_unlock(&egress->run_lock);
}

gboolean
hostd_egress_copy_policy(HostdContext *ctx, const char *src, const char *dst, GError **error)
{
    g_autoptr(HostdAgentRecord) source = hostd_agent_load(ctx, src, error);
    g_autoptr(VmEgressPolicy) policy = NULL;

    if (source == NULL)
        return FALSE;
    /* What the source's proxy runs with is its policy; the file says the same unless a change
     * is being written right now. */
    policy = egress_running_policy(ctx, src, NULL);
    if (policy == NULL)
        policy = egress_policy_load(ctx, src, error);
    if (policy == NULL || !vm_name_validate(dst, error) ||
        !egress_policy_save(ctx, dst, policy, error))
        return FALSE;
    (void)egress_apply(ctx, dst, policy);
    return TRUE;
}

guint
hostd_egress_open_connections(HostdContext *ctx, const char *name)
{
    g_autoptr(VmEgressPolicy) policy = NULL;
    guint connections = 0;

    policy = egress_running_policy(ctx, name, &connections);
    return connections;
}

gboolean
hostd_egress_traffic(HostdContext *ctx, const char *name, guint *ret_connections, guint64 *ret_up,
                     guint64 *ret_down)
{
    Egress *egress = egress_get(ctx, FALSE);
    HostdEgressWorker *worker = NULL;
    gboolean found = FALSE;

    *ret_connections = 0;
    *ret_up = 0;
    *ret_down = 0;
    if (egress == NULL)
        return FALSE;
    g_mutex_lock(&egress->lock);
    EgressAgent *agent = g_hash_table_lookup(egress->agents, name);
    if (agent != NULL && agent->worker != NULL) {
        worker = hostd_egress_worker_ref(agent->worker);
    } else if (agent != NULL && agent->proxy != NULL) {
        *ret_connections = vm_egress_proxy_get_n_connections(agent->proxy);
        vm_egress_proxy_get_bytes(agent->proxy, ret_up, ret_down);
        found = TRUE;
    }
    g_mutex_unlock(&egress->lock);
    /* A worker's answer is awaited without the lock: it may take its time. */
    if (worker != NULL) {
        *ret_connections = hostd_egress_worker_get_stats(worker, ret_up, ret_down);
        hostd_egress_worker_unref(worker);
        found = TRUE;
    }
    return found;
}

void
hostd_egress_stop_all(HostdContext *ctx)
{
    Egress *egress;
    GHashTableIter iter;
    gpointer value;

    g_mutex_lock(&ctx->lock);
    egress = g_steal_pointer(&ctx->egress);
    g_mutex_unlock(&ctx->lock);
    if (egress == NULL)
        return;
    g_hash_table_iter_init(&iter, egress->agents);
    while (g_hash_table_iter_next(&iter, NULL, &value))
        egress_agent_free(value);
    g_hash_table_unref(egress->agents);
    g_hash_table_unref(egress->credentials);
    g_hash_table_unref(egress->grant_hosts);
    g_mutex_clear(&egress->lock);
    g_mutex_clear(&egress->run_lock);
    g_mutex_clear(&egress->ca_lock);
    g_free(egress);
}

void
hostd_egress_set_resolver(HostdContext *ctx, VmEgressResolveFunc resolve, gpointer resolve_data)
{
    Egress *egress = egress_get(ctx, TRUE);

    g_mutex_lock(&egress->lock);
    egress->resolve = resolve;
    egress->resolve_data = resolve_data;
    g_mutex_unlock(&egress->lock);
}

void
hostd_egress_set_worker_deadlines(HostdContext *ctx, guint answer_ms, guint ping_ms)
{
    Egress *egress = egress_get(ctx, TRUE);

    g_mutex_lock(&egress->lock);
    egress->worker_answer_ms = answer_ms;
    egress->worker_ping_ms = ping_ms;
    g_mutex_unlock(&egress->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Requests */

/* Whether @name's VM, as libvirt has it, carries the guest forward. */
static gboolean
egress_wired(HostdContext *ctx, const char *name)
{
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    g_autofree char *xml = NULL;
    g_auto(GStrv) rules = NULL;

    if (dom == NULL)
        return FALSE;
    xml = virDomainGetXMLDesc(dom, 0);
    if (xml == NULL) {
        virResetLastError();
        return FALSE;
    }
    rules = vm_domain_read_guestfwds(xml, NULL);
    for (gsize i = 0; rules != NULL && rules[i] != NULL; i++) {
        /* The in-guest API's forward shares the address: only the proxy's port counts. */
        if (g_str_has_prefix(rules[i], "tcp:" VM_EGRESS_GUEST_ADDRESS
                                       ":" G_STRINGIFY(VM_EGRESS_GUEST_PORT) "-"))
            return TRUE;
    }
    return FALSE;
}

static GVariant *
egress_to_variant(HostdContext *ctx, const char *name, const VmEgressPolicy *policy,
                  guint connections)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_auto(GStrv) allow = vm_egress_policy_dup_allow(policy);
    g_auto(GStrv) deny = vm_egress_policy_dup_deny(policy);

    g_variant_builder_add(&b, "{sv}", "allow", g_variant_new_strv((const char **)allow, -1));
    g_variant_builder_add(&b, "{sv}", "deny", g_variant_new_strv((const char **)deny, -1));
    g_variant_builder_add(&b, "{sv}", "connections", g_variant_new_uint32(connections));
    g_variant_builder_add(&b, "{sv}", "proxy", g_variant_new_string(HOSTD_EGRESS_GUEST_PROXY));
    g_variant_builder_add(&b, "{sv}", "wired", g_variant_new_boolean(egress_wired(ctx, name)));
    return g_variant_builder_end(&b);
}

GVariant *
hostd_egress_get(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    g_autoptr(VmEgressPolicy) policy = NULL;
    guint connections = 0;

    if (r == NULL)
        return NULL;
    policy = egress_running_policy(ctx, name, &connections);
    if (policy == NULL)
        policy = egress_policy_load(ctx, name, error);
    if (policy == NULL)
        return NULL;
    return egress_to_variant(ctx, name, policy, connections);
}

/* Normalises @rule as the policy stores it: any rule alone is a valid allow list. */
static char *
egress_normalise_rule(const char *rule, GError **error)
{
    const char *const one[] = {rule, NULL};
    g_autoptr(VmEgressPolicy) policy = vm_egress_policy_new(one, NULL, error);
    g_auto(GStrv) rules = NULL;

    if (policy == NULL)
        return NULL;
    rules = vm_egress_policy_dup_allow(policy);
    return g_strdup(rules[0]);
}

static gboolean
egress_list_add(GPtrArray *list, const char *rule)
{
    for (guint i = 0; i < list->len; i++) {
        if (g_str_equal(list->pdata[i], rule))
            return FALSE;
    }
    g_ptr_array_add(list, g_strdup(rule));
    return TRUE;
}

static gboolean
egress_list_remove(GPtrArray *list, const char *rule)
{
    for (guint i = 0; i < list->len; i++) {
        if (g_str_equal(list->pdata[i], rule)) {
            g_ptr_array_remove_index(list, i);
            return TRUE;
        }
    }
    return FALSE;
}

static GPtrArray *
egress_list_from(char **rules, gboolean drop_none)
{
    GPtrArray *list = g_ptr_array_new_with_free_func(g_free);

    for (char **rule = rules; *rule != NULL; rule++) {
        if (!(drop_none && g_str_equal(*rule, "none")))
            g_ptr_array_add(list, g_strdup(*rule));
    }
    return list;
}

/* Takes the rules of @rule (a rule, or a preset's: "@name") out of @allow_list and @deny_list.
 * A rule fails with VM_ERROR_NOT_FOUND when it is in neither list; a preset only when none of
 * its rules is (rules it shares with another preset the user opened go too: said in vmctl(1)). */
static gboolean
egress_remove(HostdContext *ctx, GPtrArray *allow_list, GPtrArray *deny_list, const char *rule,
              GError **error)
{
    const char *const one[] = {rule, NULL};
    g_auto(GStrv) rules = hostd_egress_presets_expand(ctx->config->egress_presets, one, error);
    gboolean removed = FALSE;

    if (rules == NULL)
        return FALSE;
    for (char **it = rules; *it != NULL; it++) {
        g_autofree char *normal = egress_normalise_rule(*it, error);

        if (normal == NULL)
            return FALSE;
        removed = egress_list_remove(allow_list, normal) || removed;
        removed = egress_list_remove(deny_list, normal) || removed;
    }
    if (!removed)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "no egress rule '%s' to remove", rule);
    return TRUE;
}

/* Applies the change to @current and returns the new policy, or NULL with the error. Presets in
 * @allow, @deny and @remove stand for their rules. */
static VmEgressPolicy *
egress_policy_edit(HostdContext *ctx, const VmEgressPolicy *current, const char *const *allow_in,
                   const char *const *deny_in, const char *const *remove, gboolean reset,
                   GError **error)
{
    g_auto(GStrv) old_allow = vm_egress_policy_dup_allow(current);
    g_auto(GStrv) old_deny = vm_egress_policy_dup_deny(current);
    g_autoptr(GPtrArray) allow_list = egress_list_from(reset ? (char *[]){NULL} : old_allow, TRUE);
    g_autoptr(GPtrArray) deny_list = egress_list_from(reset ? (char *[]){NULL} : old_deny, TRUE);
    g_autoptr(GError) local_error = NULL;
    g_auto(GStrv) allow = hostd_egress_presets_expand(ctx->config->egress_presets, allow_in, error);
    g_auto(GStrv) deny = NULL;
    VmEgressPolicy *policy;

    if (allow == NULL)
        return NULL;
    deny = hostd_egress_presets_expand(ctx->config->egress_presets, deny_in, error);
    if (deny == NULL)
        return NULL;
    for (char **it = allow; *it != NULL; it++) {
        g_autofree char *rule = egress_normalise_rule(*it, error);

        if (rule == NULL)
            return NULL;
        if (g_str_equal(rule, "none") || g_str_equal(rule, "any"))
            g_ptr_array_set_size(allow_list, 0);
        if (!g_str_equal(rule, "none"))
            egress_list_add(allow_list, rule);
    }
    for (char **it = deny; *it != NULL; it++) {
        g_autofree char *rule = egress_normalise_rule(*it, error);

        if (rule == NULL)
            return NULL;
        if (!g_str_equal(rule, "none"))
            egress_list_add(deny_list, rule);
    }
    for (const char *const *it = remove; it != NULL && *it != NULL; it++) {
        if (!egress_remove(ctx, allow_list, deny_list, *it, error))
            return NULL;
    }
    g_ptr_array_add(allow_list, NULL);
    g_ptr_array_add(deny_list, NULL);
    policy = vm_egress_policy_new((const char *const *)allow_list->pdata,
                                  (const char *const *)deny_list->pdata, &local_error);
    if (policy == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s", local_error->message), NULL;
    return policy;
}

GVariant *
hostd_egress_presets(HostdContext *ctx)
{
    return hostd_egress_presets_to_variant(ctx->config->egress_presets);
}

GVariant *
hostd_egress_set(HostdContext *ctx, const char *name, const char *const *allow,
                 const char *const *deny, const char *const *remove, gboolean reset, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(VmEgressPolicy) current = NULL;
    g_autoptr(VmEgressPolicy) policy = NULL;
    guint connections = 0;

    r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    current = egress_policy_load(ctx, name, error);
    if (current == NULL)
        return NULL;
    policy = egress_policy_edit(ctx, current, allow, deny, remove, reset, error);
    if (policy == NULL)
        return NULL;
    /* Stored first: a change that cannot be kept is not made at all. */
    if (!egress_policy_save(ctx, name, policy, error))
        return NULL;
    if (!egress_apply(ctx, name, policy) && !hostd_egress_agent_start(ctx, r, error))
        return NULL;
    g_clear_pointer(&current, vm_egress_policy_unref);
    current = egress_running_policy(ctx, name, &connections);
    return egress_to_variant(ctx, name, current != NULL ? current : policy, connections);
}

/* ---------------------------------------------------------------------------------------------
 * The log, streamed */

/* A follower of the log goes on while the agent exists. */
static gboolean
egress_log_alive(gpointer user_data)
{
    const char *record_path = user_data;

    return g_file_test(record_path, G_FILE_TEST_EXISTS);
}

gboolean
hostd_egress_log(HostdContext *ctx, const char *name, gboolean follow, guint lines, int client_fd,
                 GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    g_autofree char *path = NULL;
    g_autofree char *record_path = NULL;
    VmStreamWriter reply = VM_STREAM_WRITER_INIT(client_fd);
    HostdLogFileQuery query = {.lines = lines, .follow = follow, .alive = egress_log_alive};

    if (r == NULL)
        return FALSE;
    path = hostd_agent_record_path(r, HOSTD_AGENT_EGRESS_LOG);
    record_path = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);
    query.user_data = record_path;
    hostd_logfile_send(path, &query, &reply);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Egress as a component of the context */

/* The way out, before the VM can use it: the template's policy, or the source's on a fork. */
static gboolean
egress_agent_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                      GError **error)
{
    /* A new agent (a fork too) gets a CA of its own: one left under its name by an agent of the
     * same name that went without its files being removed is not reused. */
    egress_ca_remove(ctx, egress_get(ctx, TRUE), r->name);
    if (r->forked_from == NULL)
        return hostd_egress_agent_init(ctx, r, (const char *const *)tpl->egress_allow,
                                       (const char *const *)tpl->egress_deny, error);
    return hostd_egress_copy_policy(ctx, r->forked_from, r->name, error) &&
           hostd_egress_agent_start(ctx, r, error);
}

static void
egress_agent_seed(HostdContext *ctx, const HostdAgentRecord *r, VmSeedSpec *spec, GPtrArray *keep)
{
    /* A fork's disk has the proxy settings from its source's first boot already. */
    if (r->forked_from == NULL) {
        spec->egress_proxy = HOSTD_EGRESS_GUEST_PROXY;
        spec->egress_resolver = VM_EGRESS_GUEST_ADDRESS;
    }
}

static void
egress_agent_domain(HostdContext *ctx, const HostdAgentRecord *r, VmDomainSpec *spec,
                    GPtrArray *keep)
{
    char *command = hostd_egress_command(ctx, r);

    if (command != NULL)
        g_ptr_array_add(keep, command);
    spec->egress_command = command;
}

static void
egress_agent_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                       GPtrArray *notes)
{
    g_autoptr(GError) local_error = NULL;

    if (!hostd_egress_agent_start(ctx, r, &local_error))
        g_ptr_array_add(notes, g_strdup_printf("agent '%s': no egress proxy: %s", r->name,
                                               local_error->message));
}

/* The agent is gone: its proxy, its grants' state and its CA with it. */
static void
egress_agent_removed(HostdContext *ctx, const char *name)
{
    Egress *egress = egress_get(ctx, TRUE);

    hostd_egress_agent_stop(ctx, name);
    g_mutex_lock(&egress->lock);
    g_hash_table_remove(egress->credentials, name);
    g_hash_table_remove(egress->grant_hosts, name);
    g_mutex_unlock(&egress->lock);
    egress_ca_remove(ctx, egress, name);
}

const HostdComponent hostd_egress_component = {
    .name = "egress",
    .agent_creating = egress_agent_creating,
    .agent_seed = egress_agent_seed,
    .agent_domain = egress_agent_domain,
    .agent_starting = hostd_egress_agent_start,
    .agent_removed = egress_agent_removed,
    .agent_reconcile = egress_agent_reconcile,
    .detach = hostd_egress_stop_all,
};

/* Whether @name is an agent with a record, in any phase: the credential broker's calls come
 * while a new agent or fork is still being created too (its grants and seed). */
static gboolean
egress_agent_known(HostdContext *ctx, const char *name, GError **error)
{
    g_autofree char *dir = NULL;
    g_autofree char *record = NULL;

    if (!vm_name_validate(name, error))
        return FALSE;
    dir = hostd_agent_dir(ctx, name);
    record = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
    if (!g_file_test(record, G_FILE_TEST_EXISTS))
        return vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s'", name);
    return TRUE;
}

gboolean
hostd_egress_set_credentials(HostdContext *ctx, const char *name, VmEgressCredentials *creds,
                             GError **error)
{
    Egress *egress = egress_get(ctx, TRUE);
    EgressAgent *agent;

    if (!egress_agent_known(ctx, name, error))
        return FALSE;
    g_mutex_lock(&egress->lock);
    if (creds != NULL)
        g_hash_table_replace(egress->credentials, g_strdup(name), vm_egress_credentials_ref(creds));
    else
        g_hash_table_remove(egress->credentials, name);
    agent = g_hash_table_lookup(egress->agents, name);
    if (agent != NULL)
        egress_agent_set_credentials(agent, creds);
    g_mutex_unlock(&egress->lock);
    return TRUE;
}

VmEgressCredentials *
hostd_egress_dup_credentials(HostdContext *ctx, const char *name)
{
    Egress *egress = egress_get(ctx, FALSE);
    VmEgressCredentials *creds = NULL;

    if (egress == NULL)
        return NULL;
    g_mutex_lock(&egress->lock);
    creds = g_hash_table_lookup(egress->credentials, name);
    if (creds != NULL)
        vm_egress_credentials_ref(creds);
    g_mutex_unlock(&egress->lock);
    return creds;
}

gboolean
hostd_egress_set_grant_hosts(HostdContext *ctx, const char *name, const char *const *hosts,
                             GError **error)
{
    Egress *egress = egress_get(ctx, TRUE);

    if (!egress_agent_known(ctx, name, error))
        return FALSE;
    g_mutex_lock(&egress->lock);
    if (hosts != NULL && hosts[0] != NULL)
        g_hash_table_replace(egress->grant_hosts, g_strdup(name), g_strdupv((char **)hosts));
    else
        g_hash_table_remove(egress->grant_hosts, name);
    g_mutex_unlock(&egress->lock);
    /* A proxy that does not run picks them up when it starts. */
    (void)egress_apply(ctx, name, NULL);
    return TRUE;
}

VmEgressPolicy *
hostd_egress_dup_effective_policy(HostdContext *ctx, const char *name)
{
    Egress *egress = egress_get(ctx, FALSE);
    VmEgressPolicy *policy = NULL;
    EgressAgent *agent;

    if (egress == NULL)
        return NULL;
    g_mutex_lock(&egress->lock);
    agent = g_hash_table_lookup(egress->agents, name);
    if (agent != NULL)
        policy = egress_agent_dup_policy(agent);
    g_mutex_unlock(&egress->lock);
    return policy;
}

char *
hostd_egress_ca_certificate(HostdContext *ctx, const char *name, GError **error)
{
    g_autofree char *cert = NULL;
    g_autofree char *key = NULL;

    if (!egress_agent_known(ctx, name, error))
        return NULL;
    if (!egress_ca_get(ctx, egress_get(ctx, TRUE), name, &cert, &key, error))
        return NULL;
    memset(key, 0, strlen(key));
    return g_steal_pointer(&cert);
}

GPid
hostd_egress_worker_pid(HostdContext *ctx, const char *name)
{
    Egress *egress = egress_get(ctx, FALSE);
    EgressAgent *agent;
    GPid pid = 0;

    if (egress == NULL)
        return 0;
    g_mutex_lock(&egress->lock);
    agent = g_hash_table_lookup(egress->agents, name);
    if (agent != NULL && agent->worker != NULL)
        pid = hostd_egress_worker_get_pid(agent->worker);
    g_mutex_unlock(&egress->lock);
    return pid;
}
