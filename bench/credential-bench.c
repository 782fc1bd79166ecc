/* bench/credential: what the credential broker's TLS interception costs, against a plain CONNECT
 * tunnel and a direct connection to the same upstream, measured in the same run.
 *
 * A loopback HTTPS upstream (GnuTLS, a certificate of a test CA made by bench/credential.sh)
 * answers GET /small (2 bytes) and GET /big?mib=N, over keep-alive connections. The client, as a
 * guest would, reaches it three ways: directly (TLS to the upstream, trusting the test CA);
 * through the egress proxy's CONNECT tunnel to a host no grant names (TLS end to end); and
 * through the proxy to a host a grant names, which the proxy intercepts: the client's TLS ends
 * at the proxy with a certificate the agent's CA (vm_egress_ca_generate()) signed, the proxy
 * puts the real value in place of the placeholder and speaks TLS to the upstream, which it
 * verifies against the test CA (upstream_ca_file). The direct and tunnel clients send the real
 * value themselves, so every request carries a header of the same size; the upstream checks that
 * each one arrived with the real value and the bench fails otherwise.
 *
 * Figures: requests/s on one keep-alive connection and the median time per request; the time to
 * a new connection's first answer (connect, CONNECT, handshake(s), one request); throughput of a
 * download of MIB MiB. Rounds alternate between the paths so the noise of a shared machine hits
 * them alike; ratios are medians of the per-round ratios.
 *
 * Usage: credential-bench CA_PEM CERT_PEM KEY_PEM [MIB] [REQUESTS] [CONNECTIONS]
 * (defaults 100, 2000, 100). Everything stays on 127.0.0.1. */
#include "vm-egress-ca.h"
#include "vm-egress-credential.h"
#include "vm-egress-proxy.h"
#include "vm-error.h"
#include "bench-common.h"

#include <gnutls/gnutls.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ROUNDS           5
#define HOST_INTERCEPTED "api.bench.example"
#define HOST_TUNNEL      "tunnel.bench.example"
#define SECRET_VALUE     "sk-bench-6b1f0c3a9e2d4f5a8c7b6e1d0f9a8b7c6d5e4f3a"
#define PLACEHOLDER      "vmph_Bench0123456789abcdefghijABCDEFGHIJklmnopqr"
#define CHUNK            (1024 * 1024)

typedef enum {
    PATH_DIRECT,
    PATH_TUNNEL,
    PATH_INTERCEPTED,
    N_PATHS,
} Path;

static const char *const path_names[N_PATHS] = {"direct", "CONNECT tunnel", "intercepted"};

static gnutls_certificate_credentials_t upstream_creds; /* the upstream's certificate */
static gnutls_certificate_credentials_t trust_test_ca;  /* clients of direct and tunnel */
static gnutls_certificate_credentials_t trust_agent_ca; /* clients of the intercepted path */
static guint16 upstream_port;
static guint16 proxy_port;
static gint with_value;    /* requests the upstream got with the real value */
static gint without_value; /* and without it: a failed substitution */

/* --- the upstream ------------------------------------------------------------------------------
 */

static gboolean
tls_send_all(gnutls_session_t session, const char *data, gsize len)
{
    while (len > 0) {
        ssize_t n = gnutls_record_send(session, data, len);

        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            continue;
        if (n <= 0)
            return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}

/* Reads from @session into @buf until it holds a whole head ("\r\n\r\n"); returns the head's
 * length (terminator included), 0 at the end of the stream or on an error. */
static gsize
tls_read_head(gnutls_session_t session, GString *buf)
{
    char chunk[16384];

    for (;;) {
        const char *end = strstr(buf->str, "\r\n\r\n");
        ssize_t n;

        if (end != NULL)
            return end + 4 - buf->str;
        if (buf->len > 65536)
            return 0;
        n = gnutls_record_recv(session, chunk, sizeof(chunk));
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            continue;
        if (n <= 0)
            return 0;
        g_string_append_len(buf, chunk, n);
    }
}

static gboolean
tls_handshake(gnutls_session_t session)
{
    int rc;

    do
        rc = gnutls_handshake(session);
    while (rc < 0 && !gnutls_error_is_fatal(rc));
    return rc >= 0;
}

/* The value of header @name in @head (case-insensitive name), newly allocated, or NULL. */
static char *
header_value(const char *head, const char *name)
{
    g_auto(GStrv) lines = g_strsplit(head, "\r\n", -1);

    for (char **line = lines + 1; *line != NULL; line++) {
        const char *colon = strchr(*line, ':');

        if (colon != NULL && (gsize)(colon - *line) == strlen(name) &&
            g_ascii_strncasecmp(*line, name, strlen(name)) == 0)
            return g_strstrip(g_strdup(colon + 1));
    }
    return NULL;
}

static gpointer
upstream_connection(gpointer data)
{
    int fd = GPOINTER_TO_INT(data);
    gnutls_session_t session;
    g_autoptr(GString) buf = g_string_new(NULL);
    g_autofree char *zeros = g_malloc0(CHUNK);
    gsize head_len;

    gnutls_init(&session, GNUTLS_SERVER);
    gnutls_set_default_priority(session);
    gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, upstream_creds);
    gnutls_transport_set_int(session, fd);
    if (!tls_handshake(session))
        goto out;
    while ((head_len = tls_read_head(session, buf)) > 0) {
        g_autofree char *head = g_strndup(buf->str, head_len);
        g_autofree char *auth = header_value(head, "Authorization");
        guint mib = 0;
        g_autofree char *reply = NULL;

        g_string_erase(buf, 0, head_len);
        if (g_strcmp0(auth, "Bearer " SECRET_VALUE) == 0)
            g_atomic_int_inc(&with_value);
        else
            g_atomic_int_inc(&without_value);
        if (g_str_has_prefix(head, "GET /big?mib="))
            mib = (guint)atoi(head + strlen("GET /big?mib="));
        if (mib > 0) {
            reply =
                g_strdup_printf("HTTP/1.1 200 OK\r\nContent-Length: %" G_GUINT64_FORMAT "\r\n\r\n",
                                (guint64)mib * CHUNK);
            if (!tls_send_all(session, reply, strlen(reply)))
                break;
            for (guint i = 0; i < mib; i++)
                if (!tls_send_all(session, zeros, CHUNK))
                    goto out;
        } else if (!tls_send_all(session, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                                 strlen("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))) {
            break;
        }
    }
out:
    gnutls_deinit(session);
    close(fd);
    return NULL;
}

static gpointer
upstream_thread(gpointer data)
{
    int listen_fd = GPOINTER_TO_INT(data);

    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        int one = 1;

        if (fd < 0)
            continue;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        g_thread_unref(g_thread_new("upstream", upstream_connection, GINT_TO_POINTER(fd)));
    }
    return NULL;
}

static guint16
upstream_start(void)
{
    guint16 port;
    int fd = bench_listen_loopback(&port);

    g_thread_unref(g_thread_new("upstream-accept", upstream_thread, GINT_TO_POINTER(fd)));
    return port;
}

/* --- the client --------------------------------------------------------------------------------
 */

typedef struct {
    int fd;
    gnutls_session_t session;
    const char *host;
    const char *token; /* what it sends in Authorization */
    GString *buf;      /* bytes read past the last response */
} Client;

/* Sends CONNECT @host to the proxy on @fd and reads its answer, which must be a 200. The answer
 * is read a byte at a time: nothing past it may be taken from the TLS that follows. */
static void
proxy_connect(int fd, const char *host)
{
    g_autofree char *req = g_strdup_printf("CONNECT %s:%u HTTP/1.1\r\nHost: %s:%u\r\n\r\n", host,
                                           upstream_port, host, upstream_port);
    g_autoptr(GString) answer = g_string_new(NULL);

    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req))
        g_error("send to the proxy failed");
    while (!g_str_has_suffix(answer->str, "\r\n\r\n")) {
        char c;

        if (recv(fd, &c, 1, 0) != 1)
            g_error("the proxy closed during CONNECT %s", host);
        g_string_append_c(answer, c);
    }
    if (!g_str_has_prefix(answer->str, "HTTP/1.1 200"))
        g_error("the proxy refused CONNECT %s: %s", host, answer->str);
}

static Client *
client_open(Path path)
{
    Client *c = g_new0(Client, 1);
    gnutls_certificate_credentials_t trust =
        path == PATH_INTERCEPTED ? trust_agent_ca : trust_test_ca;
    int rc;

    c->host = path == PATH_INTERCEPTED ? HOST_INTERCEPTED : HOST_TUNNEL;
    c->token = path == PATH_INTERCEPTED ? PLACEHOLDER : SECRET_VALUE;
    c->buf = g_string_new(NULL);
    c->fd = bench_dial_loopback(path == PATH_DIRECT ? upstream_port : proxy_port);
    if (path != PATH_DIRECT)
        proxy_connect(c->fd, c->host);
    gnutls_init(&c->session, GNUTLS_CLIENT);
    gnutls_set_default_priority(c->session);
    gnutls_credentials_set(c->session, GNUTLS_CRD_CERTIFICATE, trust);
    gnutls_server_name_set(c->session, GNUTLS_NAME_DNS, c->host, strlen(c->host));
    gnutls_session_set_verify_cert(c->session, c->host, 0);
    gnutls_transport_set_int(c->session, c->fd);
    do
        rc = gnutls_handshake(c->session);
    while (rc < 0 && !gnutls_error_is_fatal(rc));
    if (rc < 0)
        g_error("TLS handshake (%s) failed: %s", path_names[path], gnutls_strerror(rc));
    return c;
}

static void
client_close(Client *c)
{
    gnutls_deinit(c->session);
    close(c->fd);
    g_string_free(c->buf, TRUE);
    g_free(c);
}

/* GET @target on @c's connection and reads the whole answer, which must be a 200; returns the
 * body's size. */
static guint64
client_get(Client *c, const char *target)
{
    g_autofree char *req =
        g_strdup_printf("GET %s HTTP/1.1\r\nHost: %s:%u\r\nAuthorization: Bearer %s\r\n\r\n",
                        target, c->host, upstream_port, c->token);
    g_autofree char *chunk = g_malloc(CHUNK);
    g_autofree char *head = NULL;
    g_autofree char *length = NULL;
    guint64 want, got;
    gsize head_len;

    if (!tls_send_all(c->session, req, strlen(req)))
        g_error("sending a request failed");
    head_len = tls_read_head(c->session, c->buf);
    if (head_len == 0)
        g_error("the connection closed before an answer to %s", target);
    head = g_strndup(c->buf->str, head_len);
    if (!g_str_has_prefix(head, "HTTP/1.1 200"))
        g_error("%s answered: %s", target, head);
    length = header_value(head, "Content-Length");
    want = length != NULL ? g_ascii_strtoull(length, NULL, 10) : 0;
    g_string_erase(c->buf, 0, head_len);
    got = MIN(c->buf->len, want);
    g_string_erase(c->buf, 0, got);
    while (got < want) {
        ssize_t n = gnutls_record_recv(c->session, chunk, MIN((guint64)CHUNK, want - got));

        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            continue;
        if (n <= 0)
            g_error("the body of %s ended at %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT, target,
                    got, want);
        got += n;
    }
    return got;
}

/* --- figures -----------------------------------------------------------------------------------
 */

/* Downloads @mib MiB on a new connection; MiB/s from the request to the last byte. */
static double
download(Path path, guint mib)
{
    Client *c = client_open(path);
    g_autofree char *target = g_strdup_printf("/big?mib=%u", mib);
    gint64 start = g_get_monotonic_time();

    if (client_get(c, target) != (guint64)mib * CHUNK)
        g_error("short download");
    client_close(c);
    return mib / ((g_get_monotonic_time() - start) / 1e6);
}

/* @n requests on one connection: requests/s, and each one's time in microseconds in @ret_us. */
static double
keepalive(Path path, guint n, double *ret_us)
{
    Client *c = client_open(path);
    gint64 start = g_get_monotonic_time();

    for (guint i = 0; i < n; i++) {
        gint64 t = g_get_monotonic_time();

        (void)client_get(c, "/small");
        ret_us[i] = (double)(g_get_monotonic_time() - t);
    }
    client_close(c);
    return n / ((g_get_monotonic_time() - start) / 1e6);
}

/* Microseconds from connect() to a new connection's first answer. */
static double
first_answer(Path path)
{
    gint64 start = g_get_monotonic_time();
    Client *c = client_open(path);
    double us;

    (void)client_get(c, "/small");
    us = (double)(g_get_monotonic_time() - start);
    client_close(c);
    return us;
}

static GArray *
resolve_loopback(const char *host, gpointer user_data, GError **error)
{
    GArray *out;
    VmEgressAddress address;

    (void)user_data;
    if (!g_str_equal(host, HOST_INTERCEPTED) && !g_str_equal(host, HOST_TUNNEL))
        return vm_throw(error, VM_ERROR_NOT_FOUND, "no bench host '%s'", host), NULL;
    out = g_array_new(FALSE, FALSE, sizeof(VmEgressAddress));
    (void)vm_egress_address_parse("127.0.0.1", &address, NULL);
    g_array_append_val(out, address);
    return out;
}

static gnutls_certificate_credentials_t
trust_from(const char *pem)
{
    gnutls_certificate_credentials_t creds;
    gnutls_datum_t datum = {(unsigned char *)pem, (unsigned int)strlen(pem)};

    gnutls_certificate_allocate_credentials(&creds);
    if (gnutls_certificate_set_x509_trust_mem(creds, &datum, GNUTLS_X509_FMT_PEM) <= 0)
        g_error("no CA certificate to trust");
    return creds;
}

int
main(int argc, char **argv)
{
    guint mib, requests, conns, per_round;
    g_autofree char *test_ca = NULL;
    g_autofree char *agent_ca_cert = NULL;
    g_autofree char *agent_ca_key = NULL;
    g_autoptr(GError) error = NULL;
    g_autoptr(VmEgressPolicy) policy = NULL;
    g_autoptr(VmEgressCredentials) creds = vm_egress_credentials_new();
    g_autoptr(VmEgressProxy) proxy = NULL;
    const char *grant_hosts[] = {HOST_INTERCEPTED, NULL};
    double mibs[N_PATHS][ROUNDS], rps[N_PATHS][ROUNDS], mib_ratio[N_PATHS][ROUNDS],
        rps_ratio[N_PATHS][ROUNDS];
    g_autofree double *req_us[N_PATHS] = {NULL};
    g_autofree double *conn_us[N_PATHS] = {NULL};

    if (argc < 4) {
        fprintf(stderr, "usage: %s CA_PEM CERT_PEM KEY_PEM [MIB] [REQUESTS] [CONNECTIONS]\n",
                argv[0]);
        return 2;
    }
    mib = argc > 4 ? (guint)atoi(argv[4]) : 100;
    requests = argc > 5 ? (guint)atoi(argv[5]) : 2000;
    conns = argc > 6 ? (guint)atoi(argv[6]) : 100;
    per_round = MAX(requests / ROUNDS, 1);
    if (mib == 0 || conns == 0)
        g_error("MIB and CONNECTIONS must be positive");

    if (!g_file_get_contents(argv[1], &test_ca, NULL, &error))
        g_error("%s", error->message);
    gnutls_certificate_allocate_credentials(&upstream_creds);
    if (gnutls_certificate_set_x509_key_file(upstream_creds, argv[2], argv[3],
                                             GNUTLS_X509_FMT_PEM) < 0)
        g_error("cannot load the upstream's certificate %s and key %s", argv[2], argv[3]);
    trust_test_ca = trust_from(test_ca);
    if (!vm_egress_ca_generate("bench", &agent_ca_cert, &agent_ca_key, &error))
        g_error("the agent's CA: %s", error->message);
    trust_agent_ca = trust_from(agent_ca_cert);
    upstream_port = upstream_start();

    /* Names and loopback at the upstream's port only; the grant names one of the two hosts. */
    {
        g_autofree char *a = g_strdup_printf("%s:%u", HOST_INTERCEPTED, upstream_port);
        g_autofree char *b = g_strdup_printf("%s:%u", HOST_TUNNEL, upstream_port);
        g_autofree char *lo = g_strdup_printf("127.0.0.1/32:%u", upstream_port);
        const char *allow[] = {a, b, lo, NULL};

        policy = vm_egress_policy_new(allow, NULL, &error);
        if (policy == NULL)
            g_error("%s", error->message);
    }
    if (!vm_egress_credentials_add(creds, "bench", PLACEHOLDER, SECRET_VALUE, grant_hosts, NULL,
                                   "Bearer {}", &error))
        g_error("the grant: %s", error->message);
    {
        VmEgressConfig config = {
            .policy = policy,
            .max_connections = 256,
            .resolve = resolve_loopback,
            .credentials = creds,
            .ca_cert_pem = agent_ca_cert,
            .ca_key_pem = agent_ca_key,
            .upstream_ca_file = argv[1],
        };

        proxy = vm_egress_proxy_new(&config, &error);
        if (proxy == NULL)
            g_error("%s", error->message);
        proxy_port = vm_egress_proxy_get_port(proxy);
    }

    /* warm up every path (the intercepted host's certificate is minted here), then alternate */
    for (int p = 0; p < N_PATHS; p++) {
        (void)download(p, MIN(mib, 8));
        (void)first_answer(p);
    }
    for (int p = 0; p < N_PATHS; p++) {
        req_us[p] = g_new(double, per_round *ROUNDS);
        conn_us[p] = g_new(double, conns);
    }
    for (guint r = 0; r < ROUNDS; r++) {
        for (int p = 0; p < N_PATHS; p++) {
            mibs[p][r] = download(p, mib);
            rps[p][r] = keepalive(p, per_round, req_us[p] + r * per_round);
        }
        for (int p = 0; p < N_PATHS; p++) {
            mib_ratio[p][r] = mibs[p][r] / mibs[PATH_TUNNEL][r];
            rps_ratio[p][r] = rps[p][r] / rps[PATH_DIRECT][r];
        }
    }
    for (guint i = 0; i < conns; i++)
        for (int p = 0; p < N_PATHS; p++)
            conn_us[p][i] = first_answer(p);
    if (g_atomic_int_get(&without_value) != 0)
        g_error("%d requests reached the upstream without the real value (of %d)",
                g_atomic_int_get(&without_value),
                g_atomic_int_get(&without_value) + g_atomic_int_get(&with_value));

    printf("credential broker: %d requests, all with the real value upstream\n",
           g_atomic_int_get(&with_value));
    printf("download of %u MiB (median of %d):\n", mib, ROUNDS);
    for (int p = 0; p < N_PATHS; p++)
        printf("  %-15s %7.0f MiB/s  ratio to the tunnel %.2fx\n", path_names[p],
               bench_median(mibs[p], ROUNDS), bench_median(mib_ratio[p], ROUNDS));
    printf("ratio intercepted/tunnel download %.2fx (goal >= 0.80)\n",
           bench_median(mib_ratio[PATH_INTERCEPTED], ROUNDS));
    printf("keep-alive requests (%u per round on one connection, median of %d rounds):\n",
           per_round, ROUNDS);
    {
        double direct = bench_median(req_us[PATH_DIRECT], per_round * ROUNDS);

        for (int p = 0; p < N_PATHS; p++) {
            double us = bench_median(req_us[p], per_round * ROUNDS);

            printf("  %-15s %7.0f requests/s  ratio to direct %.2fx  %5.0f us per request "
                   "(+%.0f us)\n",
                   path_names[p], bench_median(rps[p], ROUNDS), bench_median(rps_ratio[p], ROUNDS),
                   us, us - direct);
        }
    }
    printf("new connection to its first answer (median of %u):\n", conns);
    {
        double direct = bench_median(conn_us[PATH_DIRECT], conns);
        double tunnel = bench_median(conn_us[PATH_TUNNEL], conns);
        double intercepted = bench_median(conn_us[PATH_INTERCEPTED], conns);

        printf("  direct %.0f us | tunnel %.0f us | intercepted %.0f us\n", direct, tunnel,
               intercepted);
        printf("added latency per connection: %.0f us (tunnel), %.0f us (intercepted; %.0f us "
               "more than the tunnel)\n",
               tunnel - direct, intercepted - direct, intercepted - tunnel);
    }
    return 0;
}
