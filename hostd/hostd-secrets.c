/* The credential broker's operations: secrets and grants, put into effect through
 * hostd_secrets_sync(). */
#include "hostd-secrets.h"

#include <stdlib.h>
#include <string.h>

#include "hostd-agent.h"
#include "hostd-secrets-check.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets-store.h"
#include "hostd-secrets-sync.h"
#include "vm-error.h"
#include "vm-name.h"

#define HOSTD_SECRET_DEFAULT_HEADER "Authorization"
#define HOSTD_SECRET_DEFAULT_FORMAT "Bearer {}"

/* Serialises the store's check-then-write steps: create against create, and a grant's "the
 * secret exists" against rm's "nobody holds it". Taken after an agent's name lock, never before
 * one, so it cannot deadlock with them. */
static GMutex hostd_secrets_lock;

char *
hostd_secrets_dir(HostdContext *ctx)
{
    return g_build_filename(ctx->state->dir, "secrets", NULL);
}

char *
hostd_secrets_grants_dir(HostdContext *ctx)
{
    return g_build_filename(ctx->state->dir, "secrets", "grants", NULL);
}

/* The value of a request as the store takes it: checked first, so that a NUL inside cannot cut
 * it short unseen. */
static char *
hostd_secret_value(const guint8 *value, gsize len, GError **error)
{
    if (!hostd_secret_check_value((const char *)value, len, error))
        return NULL;
    return g_strndup((const char *)value, len);
}

/* A secret's description: everything but its value. */
static GVariant *
hostd_secret_describe(HostdContext *ctx, const HostdSecret *secret, GError **error)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_auto(GStrv) agents = hostd_grants_holders(grants_dir, secret->name, error);
    if (agents == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(secret->name));
    g_variant_builder_add(&b, "{sv}", "hosts",
                          g_variant_new_strv((const char *const *)secret->hosts, -1));
    g_variant_builder_add(&b, "{sv}", "header", g_variant_new_string(secret->header));
    g_variant_builder_add(&b, "{sv}", "format", g_variant_new_string(secret->format));
    g_variant_builder_add(&b, "{sv}", "env", g_variant_new_string(secret->env));
    g_variant_builder_add(&b, "{sv}", "agents",
                          g_variant_new_strv((const char *const *)agents, -1));
    return g_variant_builder_end(&b);
}

static GVariant *
hostd_secret_describe_named(HostdContext *ctx, const char *name, GError **error)
{
    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, name, error);
    if (secret == NULL)
        return NULL;
    return hostd_secret_describe(ctx, secret, error);
}

GVariant *
hostd_secret_create(HostdContext *ctx, const HostdSecretRequest *req, GError **error)
{
    /* The name first: the defaults below are made from it. */
    if (!hostd_secret_check_name(req->name, error))
        return NULL;
    g_autoptr(HostdSecret) secret = g_new0(HostdSecret, 1);
    secret->value = hostd_secret_value(req->value, req->value_len, error);
    if (secret->value == NULL)
        return NULL;
    secret->name = g_strdup(req->name);
    const char *const headers[] = {req->header != NULL ? req->header : HOSTD_SECRET_DEFAULT_HEADER,
                                   NULL};
    secret->header = hostd_secret_normalise_headers(headers, error);
    if (secret->header == NULL)
        return NULL;
    /* Several headers: the value goes where the placeholder stands in each, whatever form its
     * client gives it ("x-api-key: P", "Authorization: Bearer P"); a format would not fit all. */
    gboolean several = strchr(secret->header, ',') != NULL;
    if (several && req->format != NULL && !g_str_equal(req->format, "{}")) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "secret '%s' names several headers: the value goes where the placeholder "
                 "stands in each (Bearer kept), so --format does not apply",
                 req->name);
        return NULL;
    }
    secret->format = g_strdup(req->format != NULL ? req->format
                              : several           ? "{}"
                                                  : HOSTD_SECRET_DEFAULT_FORMAT);
    secret->env = req->env != NULL ? g_strdup(req->env) : hostd_secret_default_env(req->name);
    /* Stored normalised, so that list shows what the proxy compares. */
    g_autoptr(GPtrArray) hosts = g_ptr_array_new_with_free_func(g_free);
    for (const char *const *host = req->hosts; host != NULL && *host != NULL; host++) {
        char *normal = hostd_secret_normalise_host(*host, error);
        if (normal == NULL)
            return NULL;
        if (!g_ptr_array_find_with_equal_func(hosts, normal, g_str_equal, NULL))
            g_ptr_array_add(hosts, normal);
        else
            g_free(normal);
    }
    g_ptr_array_add(hosts, NULL);
    secret->hosts = (char **)g_ptr_array_free(g_steal_pointer(&hosts), FALSE);

    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_mutex_lock(&hostd_secrets_lock);
    gboolean ok = hostd_secrets_store_prepare(dir, error) &&
                  hostd_secrets_store_save(dir, secret, TRUE, error);
    g_mutex_unlock(&hostd_secrets_lock);
    if (!ok)
        return NULL;
    return hostd_secret_describe(ctx, secret, error);
}

GVariant *
hostd_secret_list(HostdContext *ctx, GError **error)
{
    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_auto(GStrv) names = hostd_secrets_store_list(dir, error);
    if (names == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (char **name = names; *name != NULL; name++) {
        g_autoptr(GError) local = NULL;
        GVariant *secret = hostd_secret_describe_named(ctx, *name, &local);
        /* Removed between the listing and its reading: it is gone, not an error. */
        if (secret == NULL && g_error_matches(local, VM_ERROR, VM_ERROR_NOT_FOUND))
            continue;
        if (secret == NULL) {
            g_propagate_error(error, g_steal_pointer(&local));
            return NULL;
        }
        g_variant_builder_add_value(&b, secret);
    }
    return g_variant_builder_end(&b);
}

/* Puts the grants of @agent into effect with its name lock held. */
static gboolean
hostd_secrets_sync_locked(HostdContext *ctx, const char *agent, GError **error)
{
    g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, agent);
    return hostd_secrets_sync(ctx, agent, error);
}

/* Syncs every agent in @agents; all are tried, the first failure is returned, prefixed with
 * @what. */
static gboolean
hostd_secrets_sync_all(HostdContext *ctx, char **agents, const char *what, GError **error)
{
    g_autoptr(GError) first = NULL;
    for (char **agent = agents; agent != NULL && *agent != NULL; agent++) {
        g_autoptr(GError) local = NULL;
        /* Grants of an agent that is gone (a removal cut short) have nothing to update. */
        if (!hostd_secrets_sync_locked(ctx, *agent, &local) && first == NULL &&
            !g_error_matches(local, VM_ERROR, VM_ERROR_NOT_FOUND))
            first = g_steal_pointer(&local);
    }
    if (first == NULL)
        return TRUE;
    return vm_throw(error, vm_error_code(first), "%s, but %s", what, first->message);
}

GVariant *
hostd_secret_set(HostdContext *ctx, const char *name, const guint8 *value, gsize value_len,
                 GError **error)
{
    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_autofree char *new_value = NULL;
    g_autoptr(HostdSecret) secret = NULL;

    if (!hostd_secret_check_name(name, error) ||
        (new_value = hostd_secret_value(value, value_len, error)) == NULL)
        return NULL;
    g_mutex_lock(&hostd_secrets_lock);
    secret = hostd_secrets_store_load(dir, name, error);
    gboolean ok = secret != NULL;
    if (ok) {
        explicit_bzero(secret->value, strlen(secret->value));
        g_free(secret->value);
        secret->value = g_steal_pointer(&new_value);
        ok = hostd_secrets_store_save(dir, secret, FALSE, error);
    }
    g_mutex_unlock(&hostd_secrets_lock);
    if (new_value != NULL)
        explicit_bzero(new_value, strlen(new_value));
    if (!ok)
        return NULL;

    g_auto(GStrv) holders = hostd_grants_holders(grants_dir, name, error);
    if (holders == NULL)
        return NULL;
    g_autofree char *what = g_strdup_printf("secret '%s' is set", name);
    if (!hostd_secrets_sync_all(ctx, holders, what, error))
        return NULL;
    return hostd_secret_describe(ctx, secret, error);
}

/* "a, b, c" */
static char *
hostd_secrets_join(char **names)
{
    return g_strjoinv(", ", names);
}

GVariant *
hostd_secret_rm(HostdContext *ctx, const char *name, gboolean force, GError **error)
{
    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_autoptr(GPtrArray) revoked = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) sync_error = NULL;

    if (!hostd_secret_check_name(name, error))
        return NULL;
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, name, error);
    if (secret == NULL)
        return NULL;
    /* A grant may come in while the holders are revoked: go round until none is left, then
     * remove with the store locked, which a grant's check of the secret also takes. */
    for (;;) {
        g_mutex_lock(&hostd_secrets_lock);
        g_auto(GStrv) holders = hostd_grants_holders(grants_dir, name, error);
        if (holders == NULL) {
            g_mutex_unlock(&hostd_secrets_lock);
            return NULL;
        }
        if (holders[0] == NULL) {
            gboolean ok = hostd_secrets_store_remove(dir, name, error);
            g_mutex_unlock(&hostd_secrets_lock);
            if (!ok)
                return NULL;
            break;
        }
        g_mutex_unlock(&hostd_secrets_lock);
        if (!force) {
            g_autofree char *list = hostd_secrets_join(holders);
            vm_throw(error, VM_ERROR_BAD_STATE,
                     "secret '%s' is granted to %s; revoke it first or use --force", name, list);
            return NULL;
        }
        for (char **agent = holders; *agent != NULL; agent++) {
            g_autoptr(HostdNameLock) lock = hostd_name_lock(ctx, *agent);
            g_autoptr(GError) local = NULL;
            if (!hostd_grants_revoke(grants_dir, *agent, name, &local)) {
                if (g_error_matches(local, VM_ERROR, VM_ERROR_NOT_FOUND))
                    continue; /* revoked meanwhile */
                g_propagate_error(error, g_steal_pointer(&local));
                return NULL;
            }
            g_ptr_array_add(revoked, g_strdup(*agent));
            if (!hostd_secrets_sync(ctx, *agent, &local) && sync_error == NULL &&
                !g_error_matches(local, VM_ERROR, VM_ERROR_NOT_FOUND))
                sync_error = g_steal_pointer(&local);
        }
    }
    if (sync_error != NULL) {
        vm_throw(error, vm_error_code(sync_error), "secret '%s' is removed, but %s", name,
                 sync_error->message);
        return NULL;
    }
    g_ptr_array_add(revoked, NULL);
    return g_variant_new_strv((const char *const *)revoked->pdata, -1);
}

static int
hostd_secrets_compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

GVariant *
hostd_secrets_agent_grants(HostdContext *ctx, const char *agent)
{
    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, agent, NULL);
    if (grants == NULL)
        return g_variant_builder_end(&b);
    guint n = 0;
    g_autofree const char **names = (const char **)g_hash_table_get_keys_as_array(grants, &n);
    qsort(names, n, sizeof(char *), hostd_secrets_compare_names);
    for (const char **name = names; *name != NULL; name++) {
        g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, *name, NULL);
        g_auto(GVariantBuilder) grant = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&grant, "{sv}", "name", g_variant_new_string(*name));
        /* A grant whose secret is unreadable still shows: it is there. */
        if (secret != NULL)
            g_variant_builder_add(&grant, "{sv}", "env", g_variant_new_string(secret->env));
        g_variant_builder_add_value(&b, g_variant_builder_end(&grant));
    }
    return g_variant_builder_end(&b);
}

/* Opens @agent for a grant or revoke: the name checked, its lock taken, the agent known. */
static GMutex *
hostd_secrets_lock_agent(HostdContext *ctx, const char *agent, const char *name, GError **error)
{
    if (!vm_name_validate(agent, error) || !hostd_secret_check_name(name, error))
        return NULL;
    GMutex *lock = hostd_name_lock(ctx, agent);
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, agent, error);
    if (r == NULL) {
        hostd_name_unlock(lock);
        return NULL;
    }
    return lock;
}

/* With @agent's name lock held: grants it secret @name, which must exist, and whose env var no
 * other secret the agent holds has (the guest would see one of the two). Returns the
 * placeholder. */
static char *
hostd_secrets_grant_one(HostdContext *ctx, const char *agent, const char *name, GError **error)
{
    g_autofree char *dir = hostd_secrets_dir(ctx);
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    char *placeholder = NULL;

    g_mutex_lock(&hostd_secrets_lock);
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, name, error);
    g_autoptr(GHashTable) held =
        secret != NULL ? hostd_grants_load(grants_dir, agent, error) : NULL;
    gboolean ok = held != NULL;
    GHashTableIter iter;
    gpointer other_name;
    if (ok)
        g_hash_table_iter_init(&iter, held);
    while (ok && g_hash_table_iter_next(&iter, &other_name, NULL)) {
        g_autoptr(HostdSecret) other = hostd_secrets_store_load(dir, other_name, NULL);
        if (other != NULL && !g_str_equal(other->name, name) &&
            g_str_equal(other->env, secret->env))
            ok = vm_throw(error, VM_ERROR_EXISTS,
                          "agent '%s' holds secret '%s' under the same env %s already", agent,
                          (const char *)other_name, secret->env);
    }
    if (ok)
        placeholder = hostd_grants_add(grants_dir, agent, name, error);
    g_mutex_unlock(&hostd_secrets_lock);
    return placeholder;
}

GVariant *
hostd_secret_grant(HostdContext *ctx, const char *agent, const char *name, GError **error)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_autoptr(HostdNameLock) lock = hostd_secrets_lock_agent(ctx, agent, name, error);
    if (lock == NULL)
        return NULL;

    g_autofree char *placeholder = hostd_secrets_grant_one(ctx, agent, name, error);
    if (placeholder == NULL)
        return NULL;

    g_autoptr(GError) sync_error = NULL;
    if (!hostd_secrets_sync(ctx, agent, &sync_error)) {
        /* Nothing half made: the grant goes again, and what was applied of it with it. */
        if (hostd_grants_revoke(grants_dir, agent, name, NULL))
            (void)hostd_secrets_sync(ctx, agent, NULL);
        vm_throw(error, vm_error_code(sync_error), "cannot grant secret '%s' to '%s': %s", name,
                 agent, sync_error->message);
        return NULL;
    }
    return hostd_secrets_agent_grants(ctx, agent);
}

GVariant *
hostd_secret_revoke(HostdContext *ctx, const char *agent, const char *name, GError **error)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    g_autoptr(HostdNameLock) lock = hostd_secrets_lock_agent(ctx, agent, name, error);
    if (lock == NULL || !hostd_grants_revoke(grants_dir, agent, name, error))
        return NULL;
    g_autoptr(GError) sync_error = NULL;
    if (!hostd_secrets_sync(ctx, agent, &sync_error)) {
        vm_throw(error, vm_error_code(sync_error), "secret '%s' is revoked from '%s', but %s", name,
                 agent, sync_error->message);
        return NULL;
    }
    return hostd_secrets_agent_grants(ctx, agent);
}

gboolean
hostd_secrets_fork_grants(HostdContext *ctx, const char *src, const char *dst, GError **error)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    return hostd_grants_copy_fresh(grants_dir, src, dst, error);
}

/* ---------------------------------------------------------------------------------------------
 * The component */

/* `new`: the template's secrets and --secret, granted before the seed is made (the sync
 * component, after this one, puts them into the seed and the proxy). A fork's grants are
 * hostd_fork()'s to give (--grants), never its template's. An unknown secret fails the `new`,
 * whose rollback drops the grants made so far (agent_removed). */
static gboolean
hostd_secrets_agent_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                             GError **error)
{
    if (r->forked_from != NULL)
        return TRUE;
    /* A grant file left by an earlier agent of this name (a removal cut short) is not this
     * one's. */
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    if (!hostd_grants_remove_agent(grants_dir, r->name, error))
        return FALSE;
    for (char **name = tpl->secrets; name != NULL && *name != NULL; name++) {
        g_autofree char *placeholder = hostd_secrets_grant_one(ctx, r->name, *name, error);
        if (placeholder == NULL)
            return FALSE;
    }
    return TRUE;
}

static void
hostd_secrets_agent_removed(HostdContext *ctx, const char *name)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(ctx);
    /* Best effort, as every removed hook: a grant file left behind names no agent. */
    (void)hostd_grants_remove_agent(grants_dir, name, NULL);
}

const HostdComponent hostd_secrets_component = {
    .name = "secret grants",
    .agent_creating = hostd_secrets_agent_creating,
    .agent_removed = hostd_secrets_agent_removed,
};
