#include "hostd-metrics-server.h"

#include "hostd-ksm.h"
#include "hostd-metrics.h"
#include "hostd-stats.h"

#include <errno.h>
#include <gio/gunixsocketaddress.h>
#include <glib/gstdio.h>
#include <grp.h>
#include <libsoup/soup.h>
#include <string.h>
#include <sys/stat.h>

#include "vm-error.h"

struct _HostdMetricsServer {
    HostdContext *ctx;
    GMainContext *context;
    GMainLoop *loop;
    SoupServer *soup;
    GThread *thread;
    char *path; /* the Unix socket made, or NULL */
    char *url;
};

static void
metrics_server_handle(SoupServer *soup, SoupServerMessage *msg, const char *path, GHashTable *query,
                      gpointer user_data)
{
    HostdMetricsServer *server = user_data;
    const char *method = soup_server_message_get_method(msg);
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) agents = NULL;
    g_autoptr(GVariant) ksm = NULL;
    char *text;

    if (method != SOUP_METHOD_GET && method != SOUP_METHOD_HEAD) {
        soup_server_message_set_status(msg, SOUP_STATUS_METHOD_NOT_ALLOWED, NULL);
        return;
    }
    /* Without the agents' figures hostd's own are still worth a scrape. */
    agents = hostd_stats_collect(server->ctx, NULL, &error);
    if (server->ctx->ksm != NULL)
        ksm = g_variant_ref_sink(hostd_ksm_figures(server->ctx->ksm));
    text = hostd_metrics_text(server->ctx->metrics, agents, ksm);
    soup_server_message_set_status(msg, SOUP_STATUS_OK, NULL);
    soup_server_message_set_response(msg, HOSTD_METRICS_CONTENT_TYPE, SOUP_MEMORY_TAKE, text,
                                     strlen(text));
}

static gpointer
metrics_server_thread(gpointer data)
{
    HostdMetricsServer *server = data;

    g_main_context_push_thread_default(server->context);
    g_main_loop_run(server->loop);
    g_main_context_pop_thread_default(server->context);
    return NULL;
}

/* A listening Unix socket at @path, a stale one there replaced; its mode as hostd's own
 * socket's. */
static GSocket *
metrics_server_unix_socket(HostdContext *ctx, const char *path, GError **error)
{
    g_autoptr(GSocket) sock = NULL;
    g_autoptr(GSocketAddress) address = NULL;
    const char *group = ctx->config->socket_group;
    GError *local_error = NULL;

    sock = g_socket_new(G_SOCKET_FAMILY_UNIX, G_SOCKET_TYPE_STREAM, G_SOCKET_PROTOCOL_DEFAULT,
                        &local_error);
    if (sock == NULL) {
        vm_throw(error, VM_ERROR_IO, "cannot make a socket: %s", local_error->message);
        g_error_free(local_error);
        return NULL;
    }
    address = g_unix_socket_address_new(path);
    (void)g_unlink(path);
    if (!g_socket_bind(sock, address, FALSE, &local_error)) {
        vm_throw(error, VM_ERROR_IO, "cannot bind %s: %s", path, local_error->message);
        g_error_free(local_error);
        return NULL;
    }
    /* The mode is set before listen(), so no client can connect through a wider one. */
    if (chmod(path, group != NULL ? 0660 : 0600) < 0) {
        vm_throw_errno(error, errno, "cannot set the mode of %s", path);
        return NULL;
    }
    if (group != NULL) {
        struct group *gr = getgrnam(group);

        if (gr == NULL || chown(path, (uid_t)-1, gr->gr_gid) < 0) {
            vm_throw(error, VM_ERROR_IO, "cannot give %s to group '%s'", path, group);
            return NULL;
        }
    }
    if (!g_socket_listen(sock, &local_error)) {
        vm_throw(error, VM_ERROR_IO, "cannot listen on %s: %s", path, local_error->message);
        g_error_free(local_error);
        return NULL;
    }
    return g_steal_pointer(&sock);
}

/* The address HOST:PORT names: HOST is an address ("localhost" is the loopback one); names are
 * not resolved. */
static GSocketAddress *
metrics_server_tcp_address(const char *listen, GError **error)
{
    g_autoptr(GSocketConnectable) parsed = g_network_address_parse(listen, 0, NULL);
    g_autoptr(GInetAddress) inet = NULL;
    const char *host;

    if (parsed == NULL || g_network_address_get_port(G_NETWORK_ADDRESS(parsed)) == 0) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "metrics-listen '%s' is not HOST:PORT", listen);
        return NULL;
    }
    host = g_network_address_get_hostname(G_NETWORK_ADDRESS(parsed));
    if (g_str_equal(host, "localhost"))
        inet = g_inet_address_new_loopback(G_SOCKET_FAMILY_IPV4);
    else
        inet = g_inet_address_new_from_string(host);
    if (inet == NULL) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "metrics-listen '%s': '%s' is no address",
                 listen, host);
        return NULL;
    }
    return g_inet_socket_address_new(inet, g_network_address_get_port(G_NETWORK_ADDRESS(parsed)));
}

HostdMetricsServer *
hostd_metrics_server_start(HostdContext *ctx, const char *listen, GError **error)
{
    g_autoptr(GMainContext) context = g_main_context_new();
    g_autoptr(SoupServer) soup = NULL;
    g_autoptr(GSocket) sock = NULL;
    g_autoptr(GSocketAddress) address = NULL;
    GError *local_error = NULL;
    gboolean ok;
    HostdMetricsServer *server;

    if (g_path_is_absolute(listen)) {
        sock = metrics_server_unix_socket(ctx, listen, error);
        if (sock == NULL)
            return NULL;
    } else {
        address = metrics_server_tcp_address(listen, error);
        if (address == NULL)
            return NULL;
    }
    server = g_new0(HostdMetricsServer, 1);
    server->ctx = ctx;
    /* The server's sources belong to the context current when it listens: its own. */
    g_main_context_push_thread_default(context);
    soup = soup_server_new("server-header", "hostd", NULL);
    soup_server_add_handler(soup, NULL, metrics_server_handle, server, NULL);
    if (sock != NULL)
        ok = soup_server_listen_socket(soup, sock, 0, &local_error);
    else
        ok = soup_server_listen(soup, address, 0, &local_error);
    g_main_context_pop_thread_default(context);
    if (!ok) {
        vm_throw(error, VM_ERROR_IO, "cannot serve metrics at %s: %s", listen,
                 local_error->message);
        g_error_free(local_error);
        if (sock != NULL)
            (void)g_unlink(listen);
        g_free(server);
        return NULL;
    }
    if (sock != NULL) {
        server->path = g_strdup(listen);
        server->url = g_strdup_printf("unix:%s", listen);
    } else {
        GSList *uris = soup_server_get_uris(soup);
        g_autofree char *base = uris != NULL ? g_uri_to_string(uris->data) : g_strdup(listen);

        g_slist_free_full(uris, (GDestroyNotify)g_uri_unref);
        server->url = g_strdup_printf("%smetrics", base);
    }
    server->context = g_steal_pointer(&context);
    server->loop = g_main_loop_new(server->context, FALSE);
    server->soup = g_steal_pointer(&soup);
    server->thread = g_thread_new("hostd-metrics", metrics_server_thread, server);
    return server;
}

const char *
hostd_metrics_server_url(HostdMetricsServer *server)
{
    return server->url;
}

static gboolean
metrics_server_quit(gpointer data)
{
    g_main_loop_quit(data);
    return G_SOURCE_REMOVE;
}

void
hostd_metrics_server_stop(HostdMetricsServer *server)
{
    if (server == NULL)
        return;
    g_main_context_invoke(server->context, metrics_server_quit, server->loop);
    g_thread_join(server->thread);
    g_main_context_push_thread_default(server->context);
    soup_server_disconnect(server->soup);
    g_clear_object(&server->soup);
    g_main_context_pop_thread_default(server->context);
    if (server->path != NULL)
        (void)g_unlink(server->path);
    g_main_loop_unref(server->loop);
    g_main_context_unref(server->context);
    g_free(server->path);
    g_free(server->url);
    g_free(server);
}
