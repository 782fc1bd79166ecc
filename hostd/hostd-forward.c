/* Forwarded ports: the record, the choice of host ports, the requests, the component. */
#include "hostd-forward-private.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "hostd-agent.h"
#include "hostd-guest.h"
#include "hostd-power.h"
#include "hostd-ssh-forward.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-util.h"

#define FORWARD_GROUP_PREFIX "forward "
#define FORWARD_KEY_HOST     "host-port"
#define FORWARD_ADDRESS      "127.0.0.1"

/* ---------------------------------------------------------------------------------------------
 * The record */

/* A port in decimal, 1-65535, nothing else (no sign, no leading zero, no blank). */
static gboolean
forward_parse_port(const char *text, guint *ret_port)
{
    guint64 value = 0;

    if (text == NULL || text[0] < '1' || text[0] > '9' || strlen(text) > 5)
        return FALSE;
    for (const char *p = text; *p != '\0'; p++) {
        if (!g_ascii_isdigit(*p))
            return FALSE;
        value = value * 10 + (guint64)(*p - '0');
    }
    if (value > 65535)
        return FALSE;
    *ret_port = (guint)value;
    return TRUE;
}

static gint
forward_compare(gconstpointer a, gconstpointer b)
{
    const HostdForward *x = a, *y = b;

    return x->guest_port < y->guest_port ? -1 : x->guest_port > y->guest_port;
}

GArray *
hostd_forwards_parse(const char *text, gsize len, const char *path, GError **error)
{
    g_autoptr(GKeyFile) keyfile = g_key_file_new();
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GArray) forwards = g_array_new(FALSE, FALSE, sizeof(HostdForward));
    g_autoptr(GHashTable) hosts = g_hash_table_new(g_direct_hash, g_direct_equal);
    g_auto(GStrv) groups = NULL;

    g_return_val_if_fail(text != NULL || len == 0, NULL);

    if (!g_key_file_load_from_data(keyfile, text != NULL ? text : "", len, G_KEY_FILE_NONE,
                                   &local_error))
        return vm_throw(error, VM_ERROR_FAILED, "%s: %s", path, local_error->message), NULL;
    groups = g_key_file_get_groups(keyfile, NULL);
    for (char **group = groups; *group != NULL; group++) {
        g_autofree char *value = NULL;
        g_auto(GStrv) keys = NULL;
        HostdForward fw = {0};

        if (!g_str_has_prefix(*group, FORWARD_GROUP_PREFIX) ||
            !forward_parse_port(*group + strlen(FORWARD_GROUP_PREFIX), &fw.guest_port))
            return vm_throw(error, VM_ERROR_FAILED,
                            "%s: [%s] is not [forward GUEST_PORT] with a port in 1-65535", path,
                            *group),
                   NULL;
        keys = g_key_file_get_keys(keyfile, *group, NULL, NULL);
        for (char **key = keys; keys != NULL && *key != NULL; key++) {
            if (!g_str_equal(*key, FORWARD_KEY_HOST))
                return vm_throw(error, VM_ERROR_FAILED, "%s: [%s]: unknown key '%s'", path, *group,
                                *key),
                       NULL;
        }
        value = g_key_file_get_value(keyfile, *group, FORWARD_KEY_HOST, NULL);
        if (value != NULL)
            g_strstrip(value);
        if (!forward_parse_port(value, &fw.host_port))
            return vm_throw(error, VM_ERROR_FAILED,
                            "%s: [%s]: " FORWARD_KEY_HOST " must be a port in 1-65535", path,
                            *group),
                   NULL;
        for (guint i = 0; i < forwards->len; i++) {
            if (g_array_index(forwards, HostdForward, i).guest_port == fw.guest_port)
                return vm_throw(error, VM_ERROR_FAILED, "%s: guest port %u is there twice", path,
                                fw.guest_port),
                       NULL;
        }
        if (!g_hash_table_add(hosts, GUINT_TO_POINTER(fw.host_port)))
            return vm_throw(error, VM_ERROR_FAILED, "%s: host port %u is there twice", path,
                            fw.host_port),
                   NULL;
        if (forwards->len >= HOSTD_FORWARD_MAX)
            return vm_throw(error, VM_ERROR_FAILED, "%s: more than %d forwarded ports", path,
                            HOSTD_FORWARD_MAX),
                   NULL;
        g_array_append_val(forwards, fw);
    }
    g_array_sort(forwards, forward_compare);
    return g_steal_pointer(&forwards);
}

char *
hostd_forwards_format(const GArray *forwards)
{
    GString *out = g_string_new("# The agent's forwarded ports; change them with vmctl forward.\n");

    for (guint i = 0; i < forwards->len; i++) {
        const HostdForward *fw = &g_array_index(forwards, HostdForward, i);

        g_string_append_printf(out, "\n[" FORWARD_GROUP_PREFIX "%u]\n" FORWARD_KEY_HOST "=%u\n",
                               fw->guest_port, fw->host_port);
    }
    return g_string_free(out, FALSE);
}

GArray *
hostd_forwards_load(const char *dir, GError **error)
{
    g_autofree char *path = g_build_filename(dir, HOSTD_AGENT_FORWARDS, NULL);
    g_autofree char *text = NULL;
    g_autoptr(GError) local_error = NULL;
    gsize len = 0;

    if (!g_file_get_contents(path, &text, &len, &local_error)) {
        if (g_error_matches(local_error, G_FILE_ERROR, G_FILE_ERROR_NOENT))
            return g_array_new(FALSE, FALSE, sizeof(HostdForward));
        return vm_throw(error, VM_ERROR_IO, "cannot read %s: %s", path, local_error->message), NULL;
    }
    return hostd_forwards_parse(text, len, path, error);
}

gboolean
hostd_forwards_save(const char *dir, const GArray *forwards, GError **error)
{
    g_autofree char *path = g_build_filename(dir, HOSTD_AGENT_FORWARDS, NULL);
    g_autofree char *text = hostd_forwards_format(forwards);

    return vm_file_write_atomic(path, text, -1, 0600, error);
}

/* ---------------------------------------------------------------------------------------------
 * Host ports */

static gboolean
forward_port_bindable(guint port)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET,
        .sin_port = htons((guint16)port),
        .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
    };
    vm_autofd fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;

    /* As the listener will bind it: a port whose last connections linger in TIME_WAIT is free. */
    return fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
           bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
}

gboolean
hostd_forward_choose_port(guint requested, gint64 uid, guint min, guint max, GHashTable *used,
                          guint *ret_port, GError **error)
{
    g_return_val_if_fail(used != NULL && ret_port != NULL, FALSE);

    if (requested > 0) {
        const char *holder = g_hash_table_lookup(used, GUINT_TO_POINTER(requested));

        if (requested < 1024 && uid != 0)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "host port %u is below 1024: only root may forward to it", requested);
        if (holder != NULL)
            return vm_throw(error, VM_ERROR_NO_RESOURCES,
                            "port %u on " FORWARD_ADDRESS " is taken: %s", requested, holder);
        *ret_port = requested;
        return TRUE;
    }
    for (guint port = min; port >= 1 && port <= max && port <= 65535; port++) {
        if (!g_hash_table_contains(used, GUINT_TO_POINTER(port)) && forward_port_bindable(port)) {
            *ret_port = port;
            return TRUE;
        }
    }
    return vm_throw(error, VM_ERROR_NO_RESOURCES,
                    "no free port in %u-%u on " FORWARD_ADDRESS
                    " to forward to (forward-port-min, forward-port-max)",
                    min, max);
}

/* Every port hostd gave out, as hostd_forward_choose_port() takes them: each agent's SSH and
 * backend ports and forwarded ports, recorded ones included (a port not served since a
 * start-up is still that agent's). Call with ctx->lock held, so none is given out meanwhile. */
static GHashTable *
forward_used_ports(HostdContext *ctx, GError **error)
{
    g_autoptr(GHashTable) used = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);

    if (records == NULL)
        return NULL;
    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        g_autoptr(GArray) forwards = hostd_forwards_load(r->dir, NULL);

        if (r->ssh_port != 0)
            g_hash_table_insert(used, GUINT_TO_POINTER(r->ssh_port),
                                g_strdup_printf("agent '%s' has its SSH there", r->name));
        if (r->backend_port != 0)
            g_hash_table_insert(used, GUINT_TO_POINTER(r->backend_port),
                                g_strdup_printf("agent '%s' has its SSH backend there", r->name));
        for (guint j = 0; forwards != NULL && j < forwards->len; j++) {
            const HostdForward *fw = &g_array_index(forwards, HostdForward, j);

            g_hash_table_insert(
                used, GUINT_TO_POINTER(fw->host_port),
                g_strdup_printf("agent '%s' forwards its port %u there", r->name, fw->guest_port));
        }
    }
    return g_steal_pointer(&used);
}

/* ---------------------------------------------------------------------------------------------
 * The forwarder */

/* A connection came to one of @agent's ports: make the agent able to take it (as a connection
 * to its SSH port would), then say where its sshd is. */
static gboolean
forward_wake(const char *agent, gpointer user_data, HostdSshTarget *ret_target, GPtrArray *keep,
             GError **error)
{
    HostdContext *ctx = user_data;
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    char *identity = NULL;
    char *known_hosts = NULL;
    char *name;
    char *user;

    if (!hostd_agent_lock_open(ctx, agent, &lock, &r, &dom, error) ||
        !hostd_power_wake_locked(ctx, r, dom, error))
        return FALSE;
    hostd_guest_ssh_target(ret_target, r, &identity, &known_hosts);
    g_ptr_array_add(keep, identity);
    g_ptr_array_add(keep, known_hosts);
    name = g_strdup(r->name);
    user = g_strdup(r->user);
    g_ptr_array_add(keep, name);
    g_ptr_array_add(keep, user);
    ret_target->agent = name;
    ret_target->user = user;
    return TRUE;
}

static void
forward_log(const char *agent, guint guest_port, const char *message, gpointer user_data)
{
    HostdContext *ctx = user_data;

    if (guest_port == 0)
        hostd_context_log(ctx, "agent '%s': forwarded ports: %s", agent, message);
    else
        hostd_context_log(ctx, "agent '%s': forwarded port %u: %s", agent, guest_port, message);
}

/* The context's forwarder, made on first use when @create. */
static HostdSshForward *
forward_get(HostdContext *ctx, gboolean create)
{
    HostdSshForward *fwd = g_atomic_pointer_get(&ctx->forwards);

    if (fwd != NULL || !create)
        return fwd;
    g_mutex_lock(&ctx->lock);
    fwd = ctx->forwards;
    if (fwd == NULL) {
        fwd = hostd_ssh_forward_new(ctx->ssh, forward_wake, forward_log, ctx);
        g_atomic_pointer_set(&ctx->forwards, fwd);
    }
    g_mutex_unlock(&ctx->lock);
    return fwd;
}

void
hostd_forward_stop(HostdContext *ctx)
{
    HostdSshForward *fwd;

    g_mutex_lock(&ctx->lock);
    fwd = ctx->forwards;
    g_atomic_pointer_set(&ctx->forwards, NULL);
    g_mutex_unlock(&ctx->lock);
    hostd_ssh_forward_free(fwd);
}

/* ---------------------------------------------------------------------------------------------
 * Requests */

static GVariant *
forward_to_variant(HostdContext *ctx, const char *agent, const HostdForward *fw)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    HostdSshForward *fwd = forward_get(ctx, FALSE);
    guint connections = 0;
    gboolean listening =
        fwd != NULL && hostd_ssh_forward_lookup(fwd, agent, fw->guest_port, &connections);
    g_autofree char *address = g_strdup_printf(FORWARD_ADDRESS ":%u", fw->host_port);

    g_variant_builder_add(&b, "{sv}", "agent", g_variant_new_string(agent));
    g_variant_builder_add(&b, "{sv}", "guest_port", g_variant_new_uint32(fw->guest_port));
    g_variant_builder_add(&b, "{sv}", "host_port", g_variant_new_uint32(fw->host_port));
    g_variant_builder_add(&b, "{sv}", "address", g_variant_new_string(address));
    g_variant_builder_add(&b, "{sv}", "connections", g_variant_new_uint32(connections));
    g_variant_builder_add(&b, "{sv}", "listening", g_variant_new_boolean(listening));
    return g_variant_builder_end(&b);
}

static gint
forward_find(const GArray *forwards, guint guest_port)
{
    for (guint i = 0; i < forwards->len; i++) {
        if (g_array_index(forwards, HostdForward, i).guest_port == guest_port)
            return (gint)i;
    }
    return -1;
}

GVariant *
hostd_forward_add(HostdContext *ctx, const char *name, guint guest_port, guint host_port,
                  gint64 uid, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GArray) forwards = NULL;
    g_autoptr(GHashTable) used = NULL;
    HostdSshForward *fwd;
    HostdForward fw = {.guest_port = guest_port};
    gint found;
    gboolean ok;

    g_return_val_if_fail(guest_port > 0 && guest_port <= 65535 && host_port <= 65535, NULL);

    r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return NULL;
    forwards = hostd_forwards_load(r->dir, error);
    if (forwards == NULL)
        return NULL;
    found = forward_find(forwards, guest_port);
    if (found >= 0)
        return vm_throw(error, VM_ERROR_EXISTS,
                        "agent '%s' forwards its port %u already, to " FORWARD_ADDRESS ":%u", name,
                        guest_port, g_array_index(forwards, HostdForward, found).host_port),
               NULL;
    if (forwards->len >= HOSTD_FORWARD_MAX)
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "agent '%s' forwards %d ports already", name,
                        HOSTD_FORWARD_MAX),
               NULL;

    /* Chosen and bound under the context lock: two requests never pick the same port, and a
     * new agent's port allocation finds it bound. */
    fwd = forward_get(ctx, TRUE);
    g_mutex_lock(&ctx->lock);
    used = forward_used_ports(ctx, error);
    ok = used != NULL &&
         hostd_forward_choose_port(host_port, uid, ctx->config->forward_port_min,
                                   ctx->config->forward_port_max, used, &fw.host_port, error) &&
         hostd_ssh_forward_add(fwd, name, guest_port, fw.host_port, error);
    g_mutex_unlock(&ctx->lock);
    if (!ok)
        return NULL;

    g_array_append_val(forwards, fw);
    g_array_sort(forwards, forward_compare);
    if (!hostd_forwards_save(r->dir, forwards, error)) {
        hostd_ssh_forward_remove(fwd, name, guest_port);
        return NULL;
    }
    return forward_to_variant(ctx, name, &fw);
}

gboolean
hostd_forward_remove(HostdContext *ctx, const char *name, guint guest_port, GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GArray) forwards = NULL;
    HostdSshForward *fwd;
    gint found;

    r = hostd_agent_lock_load(ctx, name, &lock, error);
    if (r == NULL)
        return FALSE;
    forwards = hostd_forwards_load(r->dir, error);
    if (forwards == NULL)
        return FALSE;
    found = forward_find(forwards, guest_port);
    if (found < 0)
        return vm_throw(error, VM_ERROR_NOT_FOUND, "agent '%s' does not forward its port %u", name,
                        guest_port);
    /* Recorded first: a change that cannot be kept is not made at all. */
    g_array_remove_index(forwards, (guint)found);
    if (!hostd_forwards_save(r->dir, forwards, error))
        return FALSE;
    fwd = forward_get(ctx, FALSE);
    if (fwd != NULL)
        hostd_ssh_forward_remove(fwd, name, guest_port);
    return TRUE;
}

/* Adds @r's forwards to @b. */
static gboolean
forward_list_agent(HostdContext *ctx, const HostdAgentRecord *r, GVariantBuilder *b, GError **error)
{
    g_autoptr(GArray) forwards = hostd_forwards_load(r->dir, error);

    if (forwards == NULL)
        return FALSE;
    for (guint i = 0; i < forwards->len; i++)
        g_variant_builder_add_value(
            b, forward_to_variant(ctx, r->name, &g_array_index(forwards, HostdForward, i)));
    return TRUE;
}

GVariant *
hostd_forward_list(HostdContext *ctx, const char *name, GError **error)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));

    if (name != NULL) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);

        if (r == NULL || !forward_list_agent(ctx, r, &b, error))
            return NULL;
    } else {
        g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);

        if (names == NULL)
            return NULL;
        for (guint i = 0; i < names->len; i++) {
            g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, names->pdata[i], NULL);

            if (r != NULL)
                (void)forward_list_agent(ctx, r, &b, NULL);
        }
    }
    return g_variant_builder_end(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Forwarding as a component of the context */

/* At start-up: the recorded ports are served again. */
static void
forward_agent_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                        GPtrArray *notes)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GArray) forwards = hostd_forwards_load(r->dir, &local_error);
    HostdSshForward *fwd;

    if (forwards == NULL) {
        g_ptr_array_add(notes, g_strdup_printf("agent '%s': no forwarded ports: %s", r->name,
                                               local_error->message));
        return;
    }
    if (forwards->len == 0)
        return;
    fwd = forward_get(ctx, TRUE);
    for (guint i = 0; i < forwards->len; i++) {
        const HostdForward *fw = &g_array_index(forwards, HostdForward, i);

        g_clear_error(&local_error);
        if (!hostd_ssh_forward_add(fwd, r->name, fw->guest_port, fw->host_port, &local_error))
            g_ptr_array_add(
                notes,
                g_strdup_printf("agent '%s': port %u not forwarded to " FORWARD_ADDRESS ":%u: %s",
                                r->name, fw->guest_port, fw->host_port, local_error->message));
    }
}

static void
forward_agent_removed(HostdContext *ctx, const char *name)
{
    HostdSshForward *fwd = forward_get(ctx, FALSE);

    if (fwd != NULL)
        hostd_ssh_forward_remove_agent(fwd, name);
}

const HostdComponent hostd_forward_component = {
    .name = "forward",
    .agent_removed = forward_agent_removed,
    .agent_reconcile = forward_agent_reconcile,
    .detach = hostd_forward_stop,
};
