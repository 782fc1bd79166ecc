/* Grants put into effect: the proxy, the seed, the live guest. */
#include "hostd-secrets-sync.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-egress.h"
#include "hostd-guest.h"
#include "hostd-power.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets-guest.h"
#include "hostd-secrets-store.h"
#include "vm-error.h"
#include "vm-util.h"

#define SECRETS_DIR "secrets"
#define GRANTS_DIR  "grants"

void
hostd_secrets_paths(HostdContext *ctx, char **ret_secrets_dir, char **ret_grants_dir)
{
    if (ret_secrets_dir != NULL)
        *ret_secrets_dir = g_build_filename(ctx->config->state_dir, SECRETS_DIR, NULL);
    if (ret_grants_dir != NULL)
        *ret_grants_dir = g_build_filename(ctx->config->state_dir, SECRETS_DIR, GRANTS_DIR, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * What an agent's grants amount to */

typedef struct {
    VmEgressCredentials *creds; /* NULL: none */
    char **hosts;               /* every grant's host patterns, each once */
    GHashTable *env;            /* env var -> placeholder */
} SyncGrants;

static void
sync_grants_clear(SyncGrants *g)
{
    g_clear_pointer(&g->creds, vm_egress_credentials_unref);
    g_clear_pointer(&g->hosts, g_strfreev);
    g_clear_pointer(&g->env, g_hash_table_unref);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(SyncGrants, sync_grants_clear)

static gint
sync_compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Reads @agent's grants and their secrets. The values stay inside the credentials. */
static gboolean
sync_grants_load(HostdContext *ctx, const char *agent, SyncGrants *out, GError **error)
{
    g_autofree char *secrets_dir = NULL;
    g_autofree char *grants_dir = NULL;
    g_autoptr(GHashTable) grants = NULL;
    g_autoptr(GPtrArray) hosts = g_ptr_array_new_with_free_func(g_free);
    g_autofree gpointer *names = NULL;
    guint n = 0;

    hostd_secrets_paths(ctx, &secrets_dir, &grants_dir);
    out->env = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    grants = hostd_grants_load(grants_dir, agent, error);
    if (grants == NULL)
        return FALSE;
    if (g_hash_table_size(grants) > 0) {
        out->creds = hostd_grants_credentials(secrets_dir, grants_dir, agent, error);
        if (out->creds == NULL)
            return FALSE;
    }
    /* Sorted: two secrets under one env name (which the store should not allow) always give the
     * guest the same one. */
    names = g_hash_table_get_keys_as_array(grants, &n);
    qsort(names, n, sizeof *names, sync_compare_names);
    for (guint i = 0; i < n; i++) {
        g_autoptr(HostdSecret) secret = hostd_secrets_store_load(secrets_dir, names[i], error);

        if (secret == NULL)
            return FALSE;
        if (!g_hash_table_contains(out->env, secret->env))
            g_hash_table_insert(out->env, g_strdup(secret->env),
                                g_strdup(g_hash_table_lookup(grants, names[i])));
        for (char **host = secret->hosts; host != NULL && *host != NULL; host++) {
            if (!g_ptr_array_find_with_equal_func(hosts, *host, g_str_equal, NULL))
                g_ptr_array_add(hosts, g_strdup(*host));
        }
    }
    g_ptr_array_add(hosts, NULL);
    out->hosts = (char **)g_ptr_array_free(g_steal_pointer(&hosts), FALSE);
    return TRUE;
}

/* Gives @agent's proxy @g (NULL: nothing: no substitution, no host opened). */
static gboolean
sync_proxy(HostdContext *ctx, const char *agent, const SyncGrants *g, GError **error)
{
    VmEgressCredentials *creds =
        g != NULL && g->creds != NULL && vm_egress_credentials_size(g->creds) > 0 ? g->creds : NULL;

    return hostd_egress_set_credentials(ctx, agent, creds, error) &&
           hostd_egress_set_grant_hosts(ctx, agent,
                                        g != NULL ? (const char *const *)g->hosts : NULL, error);
}

/* Loads @agent's grants and gives them to its proxy; when they cannot be read, the proxy gets
 * none (a grant that cannot be checked is not honoured) and the error is returned. */
static gboolean
sync_load_and_apply_proxy(HostdContext *ctx, const char *agent, SyncGrants *g, GError **error)
{
    if (!sync_grants_load(ctx, agent, g, error)) {
        (void)sync_proxy(ctx, agent, NULL, NULL);
        return FALSE;
    }
    return sync_proxy(ctx, agent, g, error);
}

/* ---------------------------------------------------------------------------------------------
 * What each guest was last given */

/* In the agent's directory: the SHA-256 of the /etc/environment block hostd last wrote into its
 * guest (a digest: not even the placeholders), so that a sync that changes nothing there (a
 * rotation) does not wake a paused or saved agent. Missing: the guest is brought up to date. */
#define SYNC_APPLIED_FILE "secrets-guest.sum"

static char *
sync_digest(const char *block)
{
    return g_compute_checksum_for_string(G_CHECKSUM_SHA256, block, -1);
}

/* Records that @r's guest holds @block (NULL: unknown). A record that cannot be written only
 * costs a wake later. */
static void
sync_applied_set(const HostdAgentRecord *r, const char *block)
{
    g_autofree char *path = hostd_agent_record_path(r, SYNC_APPLIED_FILE);
    g_autofree char *digest = NULL;

    if (block == NULL) {
        (void)unlink(path);
        return;
    }
    digest = sync_digest(block);
    if (!vm_file_write_atomic(path, digest, -1, 0600, NULL))
        (void)unlink(path);
}

static gboolean
sync_applied_is(const HostdAgentRecord *r, const char *block)
{
    g_autofree char *path = hostd_agent_record_path(r, SYNC_APPLIED_FILE);
    g_autofree char *recorded = NULL;
    g_autofree char *digest = sync_digest(block);

    return g_file_get_contents(path, &recorded, NULL, NULL) && g_str_equal(recorded, digest);
}

/* ---------------------------------------------------------------------------------------------
 * The running guest */

typedef struct {
    HostdContext *ctx;
    const HostdAgentRecord *r;
} SyncGuest;

/* @input in a memory file, for a command's stdin; -1 with the error. */
static int
sync_input_fd(GBytes *input, GError **error)
{
    gsize len = 0;
    const char *data = g_bytes_get_data(input, &len);
    int fd = memfd_create("vmctl-secrets-guest", MFD_CLOEXEC);

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot hold a guest command's input"), -1;
    for (gsize done = 0; done < len;) {
        ssize_t n = write(fd, data + done, len - done);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            vm_throw_errno(error, errno, "cannot hold a guest command's input");
            close(fd);
            return -1;
        }
        done += (gsize)n;
    }
    if (lseek(fd, 0, SEEK_SET) < 0) {
        vm_throw_errno(error, errno, "cannot hold a guest command's input");
        close(fd);
        return -1;
    }
    return fd;
}

/* hostd_secrets_guest_update()'s runner: one command over the agent's SSH session. */
static gboolean
sync_guest_run(char **argv, GBytes *input, gsize max_output, int *ret_status, GBytes **ret_output,
               char **ret_stderr, gpointer user_data, GError **error)
{
    SyncGuest *guest = user_data;
    vm_autofd fd = -1;

    if (input != NULL) {
        fd = sync_input_fd(input, error);
        if (fd < 0)
            return FALSE;
    }
    return hostd_agent_run_output(guest->ctx, guest->r, argv, fd, max_output, ret_status,
                                  ret_output, ret_stderr, error);
}

/* The block @g gives the guest, for the record of what it was given. */
static char *
sync_block(const SyncGrants *g)
{
    return hostd_secrets_guest_environment(NULL, g->env);
}

/* Brings @r's running guest up to date with @g. */
static gboolean
sync_guest(HostdContext *ctx, const HostdAgentRecord *r, const SyncGrants *g, GError **error)
{
    SyncGuest guest = {.ctx = ctx, .r = r};
    g_autofree char *ca = NULL;
    g_autofree char *block = sync_block(g);
    gboolean changed = FALSE;

    /* The certificate only goes in with a grant: an agent without any needs no interception. */
    if (g_hash_table_size(g->env) > 0) {
        ca = hostd_egress_ca_certificate(ctx, r->name, error);
        if (ca == NULL)
            return FALSE;
    }
    sync_applied_set(r, NULL);
    if (!hostd_secrets_guest_update(sync_guest_run, &guest, g->env, ca, &changed, error))
        return FALSE;
    /* sshd's pam_env reads /etc/environment once per connection: hostd's pooled sessions would
     * hand the old environment to the next `vmctl exec`. */
    if (changed)
        hostd_ssh_pool_forget(ctx->ssh, r->name);
    sync_applied_set(r, block);
    return TRUE;
}

gboolean
hostd_secrets_sync(HostdContext *ctx, const char *agent, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, agent, error);
    g_auto(SyncGrants) g = {0};
    g_autoptr(virDomain) dom = NULL;
    g_autofree char *block = NULL;
    const char *state;

    if (r == NULL)
        return FALSE;
    if (!sync_load_and_apply_proxy(ctx, agent, &g, error))
        return FALSE;
    dom = hostd_libvirt_lookup(ctx->lv, agent, NULL);
    state = dom != NULL ? hostd_libvirt_state_name(dom) : "stopped";
    if (g_str_equal(state, "running"))
        return sync_guest(ctx, r, &g, error);
    if (g_str_equal(state, "paused") || g_str_equal(state, "saved")) {
        block = sync_block(&g);
        if (sync_applied_is(r, block))
            return TRUE;
        /* Its guest would run on with the old block: an idle agent wakes for a grant as it
         * does for an exec. */
        if (!hostd_power_wake_locked(ctx, r, dom, error))
            return FALSE;
        return sync_guest(ctx, r, &g, error);
    }
    /* Stopped (or starting): agent_up brings it up to date. */
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * The component */

/* Grants made at `new --secret` or `fork --grants` by the component before this one: the proxy
 * honours them from the guest's first boot. */
static gboolean
sync_agent_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                    GError **error)
{
    g_auto(SyncGrants) g = {0};

    return sync_load_and_apply_proxy(ctx, r->name, &g, error);
}

/* The same once `new` or fork is done, whatever order the components were added in: with
 * --no-wait there is no agent_up. */
static gboolean
sync_agent_ready(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_auto(SyncGrants) g = {0};

    return sync_load_and_apply_proxy(ctx, r->name, &g, error);
}

/* A new agent trusts its CA from the first boot, and holds the placeholders of the grants it was
 * created with. A fork's disk went through its source's first boot: agent_up sets it right. */
static void
sync_agent_seed(HostdContext *ctx, const HostdAgentRecord *r, VmSeedSpec *spec, GPtrArray *keep)
{
    g_auto(SyncGrants) g = {0};
    g_autoptr(GError) error = NULL;
    char *ca;

    if (r->forked_from != NULL)
        return;
    ca = hostd_egress_ca_certificate(ctx, r->name, &error);
    if (ca == NULL) {
        hostd_context_log(ctx, "agent '%s': its egress CA is not in its seed: %s", r->name,
                          error->message);
        return;
    }
    g_ptr_array_add(keep, ca);
    spec->egress_ca_pem = ca;
    if (!sync_grants_load(ctx, r->name, &g, &error)) {
        hostd_context_log(ctx, "agent '%s': its grants are not in its seed: %s", r->name,
                          error->message);
        return;
    }
    if (g_hash_table_size(g.env) > 0) {
        char *block = sync_block(&g);

        g_ptr_array_add(keep, block);
        spec->environment_block = block;
    }
}

/* Whatever the guest's disk holds (a fork's copy of its source's placeholders, a restored
 * checkpoint from before a grant or revoke), it now matches the agent's grants. */
static void
sync_agent_up(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_auto(SyncGrants) g = {0};
    g_autoptr(GError) error = NULL;

    /* A new agent restored from a warm image, or made of a warm pool's machine, got this very
     * block (and the CA with it) in its identity step moments ago, from sync_agent_seed(), the
     * name lock held since: its guest has nothing to check, and the check costs a command in
     * the guest (most of a second under emulation). */
    if (g_str_equal(r->phase, HOSTD_PHASE_CREATING) && r->warm_base != NULL &&
        r->forked_from == NULL) {
        if (!sync_load_and_apply_proxy(ctx, r->name, &g, &error)) {
            hostd_context_log(ctx, "agent '%s': its grants are not honoured: %s", r->name,
                              error->message);
            return;
        }
        g_autofree char *block = sync_block(&g);
        sync_applied_set(r, block);
        return;
    }
    if (!sync_load_and_apply_proxy(ctx, r->name, &g, &error) || !sync_guest(ctx, r, &g, &error))
        hostd_context_log(ctx, "agent '%s': could not bring its guest's secrets up to date: %s",
                          r->name, error->message);
}

static void
sync_agent_removed(HostdContext *ctx, const char *name)
{
    g_autofree char *grants_dir = NULL;
    g_autoptr(GError) error = NULL;

    hostd_secrets_paths(ctx, NULL, &grants_dir);
    if (!hostd_grants_remove_agent(grants_dir, name, &error))
        hostd_context_log(ctx, "agent '%s': its grants stay: %s", name, error->message);
}

/* A new hostd's proxies start without credentials: each gets its agent's. */
static void
sync_agent_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                     GPtrArray *notes)
{
    g_auto(SyncGrants) g = {0};
    g_autoptr(GError) error = NULL;

    if (!sync_load_and_apply_proxy(ctx, r->name, &g, &error))
        g_ptr_array_add(notes, g_strdup_printf("agent '%s': its grants are not honoured: %s",
                                               r->name, error->message));
}

const HostdComponent hostd_secrets_sync_component = {
    .name = "secrets",
    .agent_creating = sync_agent_creating,
    .agent_seed = sync_agent_seed,
    .agent_ready = sync_agent_ready,
    .agent_up = sync_agent_up,
    .agent_removed = sync_agent_removed,
    .agent_reconcile = sync_agent_reconcile,
};
