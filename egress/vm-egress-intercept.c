/* The credential broker's TLS interception: GnuTLS on both sides, HTTP/1.1 in between. */
#include "vm-egress-intercept.h"
#include "vm-egress-mint.h"
#include "vm-error.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

/* How often a waiting connection asks whether it must end (shutdown, policy, grants). */
#define TICK_MS 200
/* Plaintext moved per step; one per connection, shared by both directions (one HTTP exchange
 * runs at a time: the request goes up, then its response comes down). */
#define BUFFER_SIZE (128 * 1024)
/* The most a response head may take (status line and fields), as for request heads and more. */
#define RESPONSE_HEAD_MAX (64 * 1024)
/* A request (head and body) is held back until all of it was checked, up to this size; a larger
 * body goes up as it comes, less the bytes that could begin a placeholder. */
#define REQUEST_HOLD_MAX (256 * 1024)
#define MINT_CACHE_MAX   256
/* A response body past this size is relayed by two threads: this one decrypts what the
 * destination sends while a writer encrypts and sends the previous piece to the guest. */
#define PIPELINE_AFTER   (1024 * 1024)
#define PIPELINE_BUFFERS 2
/* A piece holds a read and what the redactor held back before it. */
#define PIECE_SIZE (BUFFER_SIZE + VM_EGRESS_REDACTOR_HOLD_MAX)
/* The methods an intercepted connection carries: TRACE would echo the substituted header back,
 * CONNECT would open a tunnel no one inspects, and an unknown method's meaning is unknown. */
static const char *const allowed_methods[] = {"GET",   "HEAD",   "POST",    "PUT",
                                              "PATCH", "DELETE", "OPTIONS", NULL};
#define ALLOWED_METHODS "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

static const gnutls_datum_t alpn_http11 = {(unsigned char *)"http/1.1", 8};

struct _VmEgressInterceptor {
    VmEgressMintCache *mint;
    gnutls_certificate_credentials_t upstream;
};

/* One TLS session over a non-blocking socket. */
typedef struct {
    gnutls_session_t session;
    int fd;
    GByteArray *preread; /* the guest's: bytes read before the handshake, served first */
    gsize preread_off;
    int deferred; /* a recv outcome (0: end, < 0: a GnuTLS error) met while filling a buffer */
} Side;

struct _VmEgressIntercept {
    VmEgressInterceptor *interceptor;
    const VmEgressInterceptConn *conn;
    Side guest;
    Side up;
    gnutls_certificate_credentials_t guest_creds;
    guint8 *buf;
    GByteArray *guest_next; /* guest plaintext read past the current request */
    GByteArray *up_head;    /* the response head being read */
    /* Every real value substituted on this connection so far, looked for in every response
     * byte from the first substitution on (what an echo of the request would give back). */
    VmEgressRedactor *redactor;
    GPtrArray *redacted; /* the secrets whose redaction the current response logged */
    GArray *payload;     /* Segment: the payload pieces of the bytes the body framer was just fed */
};

typedef struct {
    const guint8 *data;
    gsize len;
} Segment;

/* ---------------------------------------------------------------------------------------------
 * The interceptor */

static gboolean
tls_failed(GError **error, int rc, const char *what)
{
    return vm_throw(error, VM_ERROR_IO, "cannot %s: %s", what, gnutls_strerror(rc));
}

VmEgressInterceptor *
vm_egress_interceptor_new(const char *ca_cert_pem, const char *ca_key_pem,
                          const char *upstream_ca_file, const char *upstream_ca_pem, GError **error)
{
    g_autoptr(VmEgressInterceptor) interceptor = g_new0(VmEgressInterceptor, 1);
    gnutls_x509_crt_t crt = NULL;
    gnutls_x509_privkey_t key = NULL;
    gnutls_datum_t cert_datum = {(unsigned char *)ca_cert_pem, (unsigned)strlen(ca_cert_pem)};
    gnutls_datum_t key_datum = {(unsigned char *)ca_key_pem, (unsigned)strlen(ca_key_pem)};
    gboolean parsed;
    int rc;

    parsed = gnutls_x509_crt_init(&crt) >= 0 && gnutls_x509_privkey_init(&key) >= 0 &&
             gnutls_x509_crt_import(crt, &cert_datum, GNUTLS_X509_FMT_PEM) >= 0 &&
             gnutls_x509_privkey_import(key, &key_datum, GNUTLS_X509_FMT_PEM) >= 0;
    if (crt != NULL)
        gnutls_x509_crt_deinit(crt);
    if (key != NULL)
        gnutls_x509_privkey_deinit(key);
    if (!parsed)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "the egress CA does not parse"), NULL;
    if ((rc = gnutls_certificate_allocate_credentials(&interceptor->upstream)) < 0)
        return tls_failed(error, rc, "make TLS credentials"), NULL;
    if (upstream_ca_pem != NULL) {
        gnutls_datum_t datum = {(unsigned char *)upstream_ca_pem,
                                (unsigned)strlen(upstream_ca_pem)};

        rc = gnutls_certificate_set_x509_trust_mem(interceptor->upstream, &datum,
                                                   GNUTLS_X509_FMT_PEM);
        if (rc <= 0)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "cannot read the upstream CA certificates: %s",
                            rc < 0 ? gnutls_strerror(rc) : "none found"),
                   NULL;
    } else if (upstream_ca_file != NULL) {
        rc = gnutls_certificate_set_x509_trust_file(interceptor->upstream, upstream_ca_file,
                                                    GNUTLS_X509_FMT_PEM);
        if (rc <= 0)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "cannot read CA certificates from %s: %s", upstream_ca_file,
                            rc < 0 ? gnutls_strerror(rc) : "none found"),
                   NULL;
    } else if ((rc = gnutls_certificate_set_x509_system_trust(interceptor->upstream)) < 0) {
        return tls_failed(error, rc, "load the system's trusted CAs"), NULL;
    }
    interceptor->mint = vm_egress_mint_cache_new(ca_cert_pem, ca_key_pem, MINT_CACHE_MAX);
    return g_steal_pointer(&interceptor);
}

void
vm_egress_interceptor_free(VmEgressInterceptor *interceptor)
{
    if (interceptor == NULL)
        return;
    if (interceptor->upstream != NULL)
        gnutls_certificate_free_credentials(interceptor->upstream);
    vm_egress_mint_cache_free(interceptor->mint);
    g_free(interceptor);
}

/* ---------------------------------------------------------------------------------------------
 * Transport */

static ssize_t
side_pull(gnutls_transport_ptr_t ptr, void *data, size_t len)
{
    Side *side = ptr;
    ssize_t n;

    if (side->preread != NULL && side->preread_off < side->preread->len) {
        n = (ssize_t)MIN(len, side->preread->len - side->preread_off);
        memcpy(data, side->preread->data + side->preread_off, n);
        side->preread_off += n;
        return n;
    }
    n = recv(side->fd, data, len, 0);
    if (n < 0)
        gnutls_transport_set_errno(side->session, errno);
    return n;
}

static ssize_t
side_push(gnutls_transport_ptr_t ptr, const void *data, size_t len)
{
    Side *side = ptr;
    ssize_t n = send(side->fd, data, len, MSG_NOSIGNAL);

    if (n < 0)
        gnutls_transport_set_errno(side->session, errno);
    return n;
}

static gboolean
side_buffered(const Side *side)
{
    return (side->preread != NULL && side->preread_off < side->preread->len) ||
           gnutls_record_check_pending(side->session) > 0;
}

static int
side_pull_timeout(gnutls_transport_ptr_t ptr, unsigned int ms)
{
    Side *side = ptr;
    struct pollfd pfd = {.fd = side->fd, .events = POLLIN};

    if (side->preread != NULL && side->preread_off < side->preread->len)
        return 1;
    return poll(&pfd, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : (int)ms);
}

static gboolean
side_open(Side *side, int fd, unsigned int flags, GError **error)
{
    int rc = gnutls_init(&side->session, flags | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL);

    if (rc < 0)
        return tls_failed(error, rc, "start a TLS session");
    side->fd = fd;
    gnutls_transport_set_ptr(side->session, side);
    gnutls_transport_set_pull_function(side->session, side_pull);
    gnutls_transport_set_push_function(side->session, side_push);
    gnutls_transport_set_pull_timeout_function(side->session, side_pull_timeout);
    if ((rc = gnutls_set_default_priority(side->session)) < 0 ||
        (rc = gnutls_alpn_set_protocols(side->session, &alpn_http11, 1, 0)) < 0)
        return tls_failed(error, rc, "set up a TLS session");
    return TRUE;
}

static void
side_close(Side *side)
{
    if (side->session == NULL)
        return;
    gnutls_deinit(side->session);
    side->session = NULL;
}

/* Waits until @side's socket is ready for @events (or bytes are buffered for a read), at most
 * until @deadline, asking the proxy every tick whether the connection must end. FALSE with
 * *@ret_reason: @timeout_reason, or the proxy's. */
static gboolean
side_wait(VmEgressIntercept *ic, Side *side, short events, gint64 deadline,
          const char *timeout_reason, const char **ret_reason)
{
    for (;;) {
        struct pollfd pfd = {.fd = side->fd, .events = events};
        const char *why = ic->conn->interrupted(ic->conn->data);
        gint64 left = deadline - g_get_monotonic_time();
        int rc;

        if (why != NULL) {
            *ret_reason = why;
            return FALSE;
        }
        if ((events & POLLIN) && side_buffered(side))
            return TRUE;
        if (left <= 0) {
            *ret_reason = timeout_reason;
            return FALSE;
        }
        rc = poll(&pfd, 1, (int)MIN(left / 1000 + 1, TICK_MS));
        if (rc > 0)
            return TRUE;
        if (rc < 0 && errno != EINTR) {
            *ret_reason = "io-error";
            return FALSE;
        }
    }
}

static short
side_direction(const Side *side)
{
    return gnutls_record_get_direction(side->session) ? POLLOUT : POLLIN;
}

static gint64
idle_deadline(VmEgressIntercept *ic)
{
    return g_get_monotonic_time() + (gint64)ic->conn->idle_timeout_ms * 1000;
}

/* The handshake on @side before @deadline: 0, a GnuTLS error, or 1 when waiting failed
 * (*@ret_reason set). */
static int
side_handshake(VmEgressIntercept *ic, Side *side, gint64 deadline, const char **ret_reason)
{
    for (;;) {
        int rc = gnutls_handshake(side->session);

        if (rc == 0)
            return 0;
        if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
            if (!side_wait(ic, side, side_direction(side), deadline, "timeout", ret_reason))
                return 1;
            continue;
        }
        if (gnutls_error_is_fatal(rc))
            return rc;
    }
}

/* Reads plaintext: > 0 bytes, 0 at the peer's end (close_notify, or a close without it), -1
 * with *@ret_reason. */
static gssize
side_recv(VmEgressIntercept *ic, Side *side, void *buf, gsize len, gint64 deadline,
          const char *timeout_reason, const char **ret_reason)
{
    if (side->deferred != 0 || side->session == NULL) {
        if (side->deferred < 0 && side->deferred != GNUTLS_E_PREMATURE_TERMINATION) {
            *ret_reason = "reset";
            return -1;
        }
        return 0;
    }
    for (;;) {
        ssize_t n = gnutls_record_recv(side->session, buf, len);

        if (n > 0)
            return n;
        if (n == 0 || n == GNUTLS_E_PREMATURE_TERMINATION) {
            side->deferred = 1;
            return 0;
        }
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
            if (!side_wait(ic, side, side_direction(side), deadline, timeout_reason, ret_reason))
                return -1;
            continue;
        }
        if (!gnutls_error_is_fatal((int)n))
            continue;
        side->deferred = (int)n;
        *ret_reason = "reset";
        return -1;
    }
}

/* Adds to the @have bytes at @buf what @side already has, without waiting: throughput comes from
 * moving many records per write, and nothing that arrived waits for more. An end or an error met
 * here is kept for the next side_recv(). */
static gsize
side_fill(Side *side, guint8 *buf, gsize have, gsize len)
{
    while (side->deferred == 0 && len - have >= 16 * 1024) {
        ssize_t n = gnutls_record_recv(side->session, buf + have, len - have);

        if (n > 0)
            have += n;
        else if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            break;
        else if (n == 0 || n == GNUTLS_E_PREMATURE_TERMINATION)
            side->deferred = 1;
        else if (gnutls_error_is_fatal((int)n))
            side->deferred = (int)n;
    }
    return have;
}

static gboolean
side_send(VmEgressIntercept *ic, Side *side, const guint8 *data, gsize len, const char **ret_reason)
{
    while (len > 0) {
        ssize_t n = gnutls_record_send(side->session, data, len);

        if (n > 0) {
            data += n;
            len -= n;
        } else if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
            /* called again with the same data, as GnuTLS wants */
            if (!side_wait(ic, side, POLLOUT, idle_deadline(ic), "idle", ret_reason))
                return FALSE;
        } else {
            *ret_reason = "reset";
            return FALSE;
        }
    }
    return TRUE;
}

/* Sends a large piece as one write of many records: corked, GnuTLS encrypts it all into its
 * buffer, then one uncork pushes it (again after a wait while the socket is full). */
static gboolean
side_send_corked(VmEgressIntercept *ic, Side *side, const guint8 *data, gsize len,
                 const char **ret_reason)
{
    gnutls_record_cork(side->session);
    while (len > 0) {
        ssize_t n = gnutls_record_send(side->session, data, len);

        if (n <= 0) {
            (void)gnutls_record_uncork(side->session, 0);
            *ret_reason = "reset";
            return FALSE;
        }
        data += n;
        len -= n;
    }
    for (;;) {
        int rc = gnutls_record_uncork(side->session, 0);

        if (rc >= 0)
            return TRUE;
        if (rc != GNUTLS_E_AGAIN && rc != GNUTLS_E_INTERRUPTED) {
            *ret_reason = "reset";
            return FALSE;
        }
        if (!side_wait(ic, side, POLLOUT, idle_deadline(ic), "idle", ret_reason))
            return FALSE;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Upstream */

VmEgressIntercept *
vm_egress_intercept_new(VmEgressInterceptor *interceptor, const VmEgressInterceptConn *conn)
{
    VmEgressIntercept *ic = g_new0(VmEgressIntercept, 1);

    ic->interceptor = interceptor;
    ic->conn = conn;
    ic->guest.fd = conn->guest_fd;
    ic->up.fd = conn->up_fd;
    ic->buf = g_malloc(BUFFER_SIZE);
    ic->guest_next = g_byte_array_new();
    ic->up_head = g_byte_array_new();
    ic->redactor = vm_egress_redactor_new();
    ic->redacted = g_ptr_array_new_with_free_func(g_free);
    ic->payload = g_array_new(FALSE, FALSE, sizeof(Segment));
    return ic;
}

void
vm_egress_intercept_free(VmEgressIntercept *ic)
{
    if (ic == NULL)
        return;
    side_close(&ic->guest);
    side_close(&ic->up);
    if (ic->guest_creds != NULL)
        gnutls_certificate_free_credentials(ic->guest_creds);
    /* the guest's plaintext may hold a placeholder, the buffer a substituted head: wipe */
    explicit_bzero(ic->buf, BUFFER_SIZE);
    g_free(ic->buf);
    g_byte_array_unref(ic->guest_next);
    g_byte_array_unref(ic->up_head);
    vm_egress_redactor_free(ic->redactor);
    g_ptr_array_unref(ic->redacted);
    g_array_unref(ic->payload);
    g_free(ic);
}

gboolean
vm_egress_intercept_upstream(VmEgressIntercept *ic, guint timeout_ms, GError **error)
{
    const VmEgressInterceptConn *conn = ic->conn;
    const char *reason = NULL;
    int rc;

    if (!side_open(&ic->up, conn->up_fd, GNUTLS_CLIENT, error))
        return FALSE;
    if ((rc = gnutls_credentials_set(ic->up.session, GNUTLS_CRD_CERTIFICATE,
                                     ic->interceptor->upstream)) < 0 ||
        (!conn->host_is_literal &&
         (rc = gnutls_server_name_set(ic->up.session, GNUTLS_NAME_DNS, conn->host,
                                      strlen(conn->host))) < 0))
        return tls_failed(error, rc, "set up the upstream TLS session");
    /* The certificate must name the host (an address literal: an iPAddress SAN). */
    gnutls_session_set_verify_cert(ic->up.session, conn->host, 0);
    rc = side_handshake(ic, &ic->up, g_get_monotonic_time() + (gint64)timeout_ms * 1000, &reason);
    if (rc == 1)
        return vm_throw(error,
                        g_strcmp0(reason, "timeout") == 0 ? VM_ERROR_TIMEOUT : VM_ERROR_CANCELLED,
                        "%s", reason);
    if (rc == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
        unsigned int status = gnutls_session_get_verify_cert_status(ic->up.session);
        gnutls_datum_t text = {NULL, 0};
        g_autofree char *what = NULL;

        if (gnutls_certificate_verification_status_print(
                status, gnutls_certificate_type_get(ic->up.session), &text, 0) >= 0) {
            what = g_strndup((const char *)text.data, text.size);
            gnutls_free(text.data);
        }
        return vm_throw(error, VM_ERROR_PROTOCOL, "upstream certificate not trusted: %s",
                        what != NULL ? what : "verification failed");
    }
    if (rc < 0)
        return vm_throw(error, VM_ERROR_PROTOCOL, "upstream-tls: %s", gnutls_strerror(rc));
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Requests */

static void
ic_log(VmEgressIntercept *ic, VmEgressRecordKind kind, const char *reason, const char *secret,
       guint64 up, guint64 down)
{
    ic->conn->log(ic->conn->data, kind, reason, secret, up, down);
}

/* A short error response to the guest inside its TLS session; best effort, the connection
 * closes after it. */
static void
guest_respond_with(VmEgressIntercept *ic, int code, const char *status, const char *fields,
                   const char *message)
{
    g_autofree char *text = g_strdup_printf("HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n%s"
                                            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                                            code, status, fields, strlen(message) + 1, message);
    const char *ignored = NULL;

    (void)side_send(ic, &ic->guest, (const guint8 *)text, strlen(text), &ignored);
}

static void
guest_respond(VmEgressIntercept *ic, int code, const char *status, const char *message)
{
    guest_respond_with(ic, code, status, "", message);
}

/* The value of the Host field in a raw head, newly allocated, or NULL. */
static char *
raw_host(const GByteArray *raw)
{
    g_autofree char *text = g_strndup((const char *)raw->data, raw->len);
    g_auto(GStrv) lines = g_strsplit(text, "\r\n", 0);

    for (char **line = lines; *line != NULL; line++)
        if (g_ascii_strncasecmp(*line, "host:", 5) == 0)
            return g_strstrip(g_strdup(*line + 5));
    return NULL;
}

/* Why a head that did not parse is refused: a leak when it carries a placeholder (the guest
 * tried to send it somewhere), else the parser's reason. Newly allocated. */
static char *
refused_head_reason(VmEgressCredentials *creds, const GByteArray *raw, const GError *error)
{
    g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);
    g_autoptr(GError) leak = NULL;

    if (!vm_egress_leak_scanner_feed(scanner, raw->data, raw->len, &leak)) {
        g_autofree char *host = raw_host(raw);
        /* "leak: placeholder of NAME in body" -> "... sent to HOST" */
        g_autofree char *prefix =
            g_strndup(leak->message, strlen(leak->message) - strlen(" in body"));

        return g_strdup_printf("%s sent to %s", prefix, host != NULL ? host : "another host");
    }
    return g_strdup(error->domain == VM_ERROR && error->code == VM_ERROR_INVALID_ARGUMENT &&
                            strstr(error->message, "Host") != NULL
                        ? "host-mismatch"
                        : "bad-request");
}

/* Between requests: waits until the guest sends (TRUE), or the destination closes its side
 * (FALSE), so that the guest sees the close of an idle kept-alive connection as it would without
 * the proxy, and opens a new one instead of sending its next request into a dead one. FALSE too
 * after the idle timeout or an interruption. */
static gboolean
wait_next_request(VmEgressIntercept *ic)
{
    gint64 deadline = idle_deadline(ic);

    for (;;) {
        struct pollfd pfd[2] = {{.fd = ic->guest.fd, .events = POLLIN},
                                {.fd = ic->up.fd, .events = POLLIN}};
        gint64 left = deadline - g_get_monotonic_time();
        guint8 byte;

        if (side_buffered(&ic->guest))
            return TRUE;
        if (left <= 0 || ic->conn->interrupted(ic->conn->data) != NULL)
            return FALSE;
        if (poll(pfd, 2, (int)MIN(left / 1000 + 1, TICK_MS)) < 0 && errno != EINTR)
            return FALSE;
        if (pfd[0].revents != 0)
            return TRUE;
        if (pfd[1].revents != 0) {
            /* a TLS 1.3 ticket is consumed quietly; the end, an error or stray bytes end it */
            ssize_t n = gnutls_record_recv(ic->up.session, &byte, 1);

            if (n != GNUTLS_E_AGAIN && n != GNUTLS_E_INTERRUPTED)
                return FALSE;
        }
    }
}

/* Reads the next request head from the guest. NULL at a quiet end (the guest closed or stayed
 * idle between requests: *@ret_reason NULL) or on refusal (*@ret_reason set, newly allocated; the
 * guest was answered). */
static VmEgressRequest *
read_request(VmEgressIntercept *ic, VmEgressCredentials *creds, char **ret_reason)
{
    const VmEgressInterceptConn *conn = ic->conn;
    g_autoptr(VmEgressParser) parser = vm_egress_parser_new_origin(conn->connect_host, conn->port);
    g_autoptr(GByteArray) raw = g_byte_array_new();
    gboolean began = FALSE;
    gint64 deadline = idle_deadline(ic);

    *ret_reason = NULL;
    for (;;) {
        g_autoptr(GError) error = NULL;
        const char *why = NULL;
        gsize consumed = 0;
        guint8 *data;
        gsize len;
        gssize n;

        if (ic->guest_next->len > 0) {
            len = MIN(ic->guest_next->len, BUFFER_SIZE);
            memcpy(ic->buf, ic->guest_next->data, len);
            g_byte_array_remove_range(ic->guest_next, 0, len);
            n = (gssize)len;
        } else {
            if (!began && !wait_next_request(ic))
                return NULL;
            n = side_recv(ic, &ic->guest, ic->buf, BUFFER_SIZE, deadline, "timeout", &why);
            if (n <= 0) {
                /* between requests, an end, silence or a stop is no refusal */
                if (began)
                    *ret_reason = g_strdup(n == 0 ? "incomplete-request" : why);
                return NULL;
            }
        }
        if (!began)
            deadline = g_get_monotonic_time() + (gint64)conn->handshake_timeout_ms * 1000;
        began = TRUE;
        data = ic->buf;
        len = (gsize)n;
        switch (vm_egress_parser_feed(parser, data, len, &consumed, &error)) {
        case VM_EGRESS_PARSE_MORE:
            g_byte_array_append(raw, data, len);
            continue;
        case VM_EGRESS_PARSE_DONE:
            g_byte_array_prepend(ic->guest_next, data + consumed, len - consumed);
            return vm_egress_parser_steal_request(parser);
        case VM_EGRESS_PARSE_ERROR:
        default:
            g_byte_array_append(raw, data, len);
            *ret_reason = refused_head_reason(creds, raw, error);
            guest_respond(ic, g_str_has_prefix(*ret_reason, "leak:") ? 403 : 400,
                          g_str_has_prefix(*ret_reason, "leak:") ? "Forbidden" : "Bad Request",
                          g_str_has_prefix(*ret_reason, "leak:") ? *ret_reason : error->message);
            explicit_bzero(raw->data, raw->len);
            return NULL;
        }
    }
}

/* Sends @len bytes of the request up, counting them. */
static gboolean
send_up(VmEgressIntercept *ic, const guint8 *data, gsize len, guint64 *bytes_up,
        const char **ret_reason)
{
    if (!side_send(ic, &ic->up, data, len, ret_reason))
        return FALSE;
    *bytes_up += len;
    return TRUE;
}

/* What the payload scanner found, and where it looks. */
typedef struct {
    VmEgressLeakScanner *scanner;
    char *leak; /* the reason, once found */
} PayloadScan;

static void
payload_scan(const guint8 *data, gsize len, gpointer user_data)
{
    PayloadScan *scan = user_data;
    g_autoptr(GError) error = NULL;

    if (scan->leak == NULL && !vm_egress_leak_scanner_feed(scan->scanner, data, len, &error))
        scan->leak = g_strdup(error->message);
}

/* Relays the request: its head (already rewritten) and its body through the leak scanner. The
 * whole request is held until checked when it fits REQUEST_HOLD_MAX; past that the body goes up
 * as it comes, less the bytes that could begin a placeholder. FALSE with *@ret_reason (newly
 * allocated) on a leak or a failure. */
static gboolean
relay_request(VmEgressIntercept *ic, VmEgressCredentials *creds, VmEgressRequest *request,
              guint64 *bytes_up, char **ret_reason)
{
    g_autoptr(GString) head = vm_egress_request_build_origin_head(request);
    g_autoptr(VmEgressBodyFramer) framer = vm_egress_body_framer_new(request);
    g_autoptr(VmEgressLeakScanner) scanner = vm_egress_leak_scanner_new(creds);
    g_autoptr(VmEgressLeakScanner) payload_scanner = vm_egress_leak_scanner_new(creds);
    g_autoptr(GByteArray) held = g_byte_array_new();
    gsize keep = vm_egress_leak_scanner_get_keep(scanner);
    PayloadScan payload = {payload_scanner, NULL};
    gboolean streaming = FALSE;
    gboolean done = FALSE;
    gint64 deadline;
    const char *why = NULL;

    /* The bytes as sent (chunk lines and trailers included), and the payload as the destination
     * decodes it (a placeholder split between chunks is whole there): both scanned. */
    vm_egress_body_framer_set_payload_func(framer, payload_scan, &payload);
    g_byte_array_append(held, (const guint8 *)head->str, head->len);
    explicit_bzero(head->str, head->len);
    while (!done) {
        g_autoptr(GError) error = NULL;
        gsize consumed = 0;
        gssize n;

        /* a request without a body is done at once */
        if (vm_egress_body_framer_feed(framer, NULL, 0, &consumed, NULL) == VM_EGRESS_PARSE_DONE)
            break;
        if (ic->guest_next->len > 0) {
            n = (gssize)MIN(ic->guest_next->len, BUFFER_SIZE);
            memcpy(ic->buf, ic->guest_next->data, n);
            g_byte_array_remove_range(ic->guest_next, 0, n);
        } else {
            deadline = idle_deadline(ic);
            n = side_recv(ic, &ic->guest, ic->buf, BUFFER_SIZE, deadline, "idle", &why);
            if (n <= 0) {
                *ret_reason = g_strdup(n == 0 ? "incomplete-request" : why);
                goto fail;
            }
        }
        switch (vm_egress_body_framer_feed(framer, ic->buf, n, &consumed, &error)) {
        case VM_EGRESS_PARSE_MORE:
            consumed = n;
            break;
        case VM_EGRESS_PARSE_DONE:
            g_byte_array_prepend(ic->guest_next, ic->buf + consumed, n - consumed);
            done = TRUE;
            break;
        case VM_EGRESS_PARSE_ERROR:
        default:
            *ret_reason = g_strdup("bad-request");
            guest_respond(ic, 400, "Bad Request", error->message);
            goto fail;
        }
        if (!vm_egress_leak_scanner_feed(scanner, ic->buf, consumed, &error) ||
            payload.leak != NULL) {
            *ret_reason = g_strdup(payload.leak != NULL ? payload.leak : error->message);
            guest_respond(ic, 403, "Forbidden", *ret_reason);
            goto fail;
        }
        g_byte_array_append(held, ic->buf, consumed);
        if (held->len > REQUEST_HOLD_MAX)
            streaming = TRUE;
        if (streaming && !done && held->len > keep) {
            gsize out = held->len - keep;

            if (!send_up(ic, held->data, out, bytes_up, &why)) {
                *ret_reason = g_strdup(why);
                goto fail;
            }
            explicit_bzero(held->data, out);
            g_byte_array_remove_range(held, 0, out);
        }
    }
    if (!send_up(ic, held->data, held->len, bytes_up, &why)) {
        *ret_reason = g_strdup(why);
        goto fail;
    }
    explicit_bzero(held->data, held->len);
    return TRUE;
fail:
    explicit_bzero(held->data, held->len);
    g_free(payload.leak);
    return FALSE;
}

/* ---------------------------------------------------------------------------------------------
 * Responses */

typedef struct {
    guint status;
    gboolean chunked;
    gboolean has_length;
    guint64 length;
    gboolean close;
    gboolean encoded;     /* a Content-Encoding other than identity */
    gboolean transformed; /* a transfer coding other than chunked */
} ResponseHead;

/* Whether the comma-separated list @value holds @token (case-insensitive). */
static gboolean
list_has(const char *value, const char *token)
{
    g_auto(GStrv) items = g_strsplit(value, ",", 0);

    for (char **it = items; *it != NULL; it++)
        if (g_ascii_strcasecmp(g_strstrip(*it), token) == 0)
            return TRUE;
    return FALSE;
}

/* Parses the response head in @text (without its final empty line). */
static gboolean
response_head_parse(const char *text, ResponseHead *head)
{
    g_auto(GStrv) lines = g_strsplit(text, "\r\n", 0);
    const char *line = lines[0];
    gboolean http10;

    memset(head, 0, sizeof(*head));
    if (line == NULL || strlen(line) < 12 ||
        !(g_str_has_prefix(line, "HTTP/1.1 ") || g_str_has_prefix(line, "HTTP/1.0 ")) ||
        !g_ascii_isdigit(line[9]) || !g_ascii_isdigit(line[10]) || !g_ascii_isdigit(line[11]) ||
        (line[12] != '\0' && line[12] != ' '))
        return FALSE;
    http10 = line[7] == '0';
    head->status = (guint)((line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0'));
    head->close = http10;
    for (char **it = lines + 1; *it != NULL; it++) {
        char *colon = strchr(*it, ':');
        char *value;

        if (colon == NULL || colon == *it)
            return FALSE;
        *colon = '\0';
        value = g_strstrip(colon + 1);
        if (g_ascii_strcasecmp(*it, "content-length") == 0) {
            guint64 length = 0;

            if (*value == '\0' || strlen(value) > 15 ||
                strspn(value, "0123456789") != strlen(value))
                return FALSE;
            length = g_ascii_strtoull(value, NULL, 10);
            if (head->has_length && head->length != length)
                return FALSE;
            head->has_length = TRUE;
            head->length = length;
        } else if (g_ascii_strcasecmp(*it, "transfer-encoding") == 0) {
            g_auto(GStrv) codings = g_strsplit(value, ",", 0);
            guint n = g_strv_length(codings);

            /* chunked last: chunked framing; any other coding last: until the close */
            head->chunked = n > 0 && g_ascii_strcasecmp(g_strstrip(codings[n - 1]), "chunked") == 0;
            if (!head->chunked)
                head->close = TRUE;
            for (guint i = 0; i < n; i++)
                if (g_ascii_strcasecmp(g_strstrip(codings[i]), "chunked") != 0)
                    head->transformed = TRUE;
        } else if (g_ascii_strcasecmp(*it, "content-encoding") == 0) {
            g_auto(GStrv) codings = g_strsplit(value, ",", 0);

            for (char **coding = codings; *coding != NULL; coding++)
                if (g_ascii_strcasecmp(g_strstrip(*coding), "identity") != 0)
                    head->encoded = TRUE;
        } else if (g_ascii_strcasecmp(*it, "connection") == 0) {
            if (list_has(value, "close"))
                head->close = TRUE;
            else if (http10 && list_has(value, "keep-alive"))
                head->close = FALSE;
        }
    }
    if (head->chunked)
        head->has_length = FALSE;
    return TRUE;
}

/* Reads a response head from upstream into ic->up_head; the bytes after it stay there past
 * *@ret_head_len. */
static gboolean
read_response_head(VmEgressIntercept *ic, gsize *ret_head_len, const char **ret_reason)
{
    gsize searched = 0;

    for (;;) {
        guint8 *end = NULL;
        gssize n;

        if (ic->up_head->len > searched) {
            gsize from = searched > 3 ? searched - 3 : 0;

            end = memmem(ic->up_head->data + from, ic->up_head->len - from, "\r\n\r\n", 4);
            searched = ic->up_head->len;
        }
        if (end != NULL) {
            *ret_head_len = (gsize)(end - ic->up_head->data) + 4;
            return TRUE;
        }
        if (ic->up_head->len > RESPONSE_HEAD_MAX) {
            *ret_reason = "bad-response";
            return FALSE;
        }
        n = side_recv(ic, &ic->up, ic->buf, BUFFER_SIZE, idle_deadline(ic), "idle", ret_reason);
        if (n < 0)
            return FALSE;
        if (n == 0) {
            *ret_reason = "closed";
            return FALSE;
        }
        g_byte_array_append(ic->up_head, ic->buf, n);
    }
}

/* Sends @len response bytes down to the guest, counting them. */
static gboolean
send_down(VmEgressIntercept *ic, const guint8 *data, gsize len, guint64 *bytes_down,
          const char **ret_reason)
{
    if (len == 0)
        return TRUE;
    if (!(len > 16 * 1024 ? side_send_corked(ic, &ic->guest, data, len, ret_reason)
                          : side_send(ic, &ic->guest, data, len, ret_reason)))
        return FALSE;
    *bytes_down += len;
    return TRUE;
}

/* Whether responses go through the redactor: from the first substitution on the connection. */
static gboolean
redacting(const VmEgressIntercept *ic)
{
    return vm_egress_redactor_size(ic->redactor) > 0;
}

/* Logs each secret whose value the redactor masked since the last call, once per response (a
 * stream may repeat it), as soon as it was found: the guest got its placeholder's bytes
 * instead. */
static void
log_redactions(VmEgressIntercept *ic)
{
    g_auto(GStrv) hits = vm_egress_redactor_steal_hits(ic->redactor);

    for (char **it = hits; it != NULL && *it != NULL; it++) {
        g_autofree char *reason = NULL;

        if (g_ptr_array_find_with_equal_func(ic->redacted, *it, g_str_equal, NULL))
            continue;
        g_ptr_array_add(ic->redacted, g_strdup(*it));
        reason = g_strdup_printf("redacted: value of %s in response", *it);
        ic_log(ic, VM_EGRESS_RECORD_DENIED, reason, *it, 0, 0);
    }
}

/* What the redactor lets go of what it was fed (everything when @final), masked: *@ret_data and
 * *@ret_len, valid until its next call; the redactions logged. */
static gboolean
redact(VmEgressIntercept *ic, gboolean final, const guint8 **ret_data, gsize *ret_len,
       const char **ret_reason)
{
    if (!vm_egress_redactor_take(ic->redactor, final, ret_data, ret_len, NULL)) {
        *ret_reason = "bad-response"; /* a secret's first bytes spread over too many chunks */
        return FALSE;
    }
    log_redactions(ic);
    return TRUE;
}

static gboolean
redact_down(VmEgressIntercept *ic, gboolean final, guint64 *bytes_down, const char **ret_reason)
{
    const guint8 *data;
    gsize len;

    return redact(ic, final, &data, &len, ret_reason) &&
           send_down(ic, data, len, bytes_down, ret_reason);
}

/* The body framer's payload func while redacting: where the payload lies in what it was fed. */
static void
payload_piece(const guint8 *data, gsize len, gpointer user_data)
{
    GArray *payload = user_data;
    Segment seg = {data, len};

    g_array_append_val(payload, seg);
}

/* Feeds the redactor the @len body bytes at @data: with @framed, the pieces the framer reported
 * (ic->payload) as payload and the bytes between them as framing; else all of it as payload. */
static void
redactor_feed_body(VmEgressIntercept *ic, gboolean framed, const guint8 *data, gsize len)
{
    gsize at = 0;

    if (!framed) {
        vm_egress_redactor_feed(ic->redactor, data, len, TRUE);
        return;
    }
    for (guint i = 0; i < ic->payload->len; i++) {
        const Segment *seg = &g_array_index(ic->payload, Segment, i);
        gsize off = (gsize)(seg->data - data);

        g_assert(off >= at && off + seg->len <= len);
        vm_egress_redactor_feed(ic->redactor, data + at, off - at, FALSE);
        vm_egress_redactor_feed(ic->redactor, seg->data, seg->len, TRUE);
        at = off + seg->len;
    }
    vm_egress_redactor_feed(ic->redactor, data + at, len - at, FALSE);
    g_array_set_size(ic->payload, 0);
}

/* Relays the body bytes at @data through @framer (NULL: until the close): what belongs to the
 * body goes down. *@ret_done once it ended; bytes past its end mean the upstream cannot be
 * trusted with another request (*@ret_close). */
static gboolean
relay_body_bytes(VmEgressIntercept *ic, VmEgressBodyFramer *framer, const guint8 *data, gsize len,
                 gboolean *ret_done, gboolean *ret_close, guint64 *bytes_down,
                 const char **ret_reason)
{
    g_autoptr(GError) error = NULL;
    gsize consumed = len;

    if (framer != NULL) {
        switch (vm_egress_body_framer_feed(framer, data, len, &consumed, &error)) {
        case VM_EGRESS_PARSE_MORE:
            consumed = len;
            break;
        case VM_EGRESS_PARSE_DONE:
            *ret_done = TRUE;
            if (consumed < len)
                *ret_close = TRUE;
            break;
        case VM_EGRESS_PARSE_ERROR:
        default:
            *ret_reason = "bad-response";
            return FALSE;
        }
    }
    if (redacting(ic)) {
        redactor_feed_body(ic, framer != NULL, data, consumed);
        return redact_down(ic, *ret_done, bytes_down, ret_reason);
    }
    return send_down(ic, data, consumed, bytes_down, ret_reason);
}

/* The writer of a pipelined response body: pieces go from the reading thread to it through
 * @full and come back through @free, so at most PIPELINE_BUFFERS pieces are in flight. Only the
 * writer touches the guest's session until it is joined. */
typedef struct {
    guint8 *data;
    gsize len;
} Piece;

typedef struct {
    VmEgressIntercept *ic;
    GThread *thread;
    GAsyncQueue *full;
    GAsyncQueue *free;
    gint failed; /* atomic: the guest went away or stopped reading */
    gint stop;   /* atomic: the reader gave up */
    guint64 sent;
    Piece pieces[PIPELINE_BUFFERS];
    Piece end; /* pushed last */
} Writer;

static gboolean
writer_wait_writable(Writer *w)
{
    gint64 deadline = idle_deadline(w->ic);

    for (;;) {
        struct pollfd pfd = {.fd = w->ic->guest.fd, .events = POLLOUT};
        gint64 left = deadline - g_get_monotonic_time();
        int rc;

        if (g_atomic_int_get(&w->stop) || left <= 0)
            return FALSE;
        rc = poll(&pfd, 1, (int)MIN(left / 1000 + 1, TICK_MS));
        if (rc > 0)
            return TRUE;
        if (rc < 0 && errno != EINTR)
            return FALSE;
    }
}

/* side_send_corked() without the proxy's interruption callback, which is the reader's. */
static gboolean
writer_send(Writer *w, const guint8 *data, gsize len)
{
    gnutls_session_t session = w->ic->guest.session;

    gnutls_record_cork(session);
    while (len > 0) {
        ssize_t n = gnutls_record_send(session, data, len);

        if (n <= 0) {
            (void)gnutls_record_uncork(session, 0);
            return FALSE;
        }
        data += n;
        len -= n;
    }
    for (;;) {
        int rc = gnutls_record_uncork(session, 0);

        if (rc >= 0)
            return TRUE;
        if ((rc != GNUTLS_E_AGAIN && rc != GNUTLS_E_INTERRUPTED) || !writer_wait_writable(w))
            return FALSE;
    }
}

static gpointer
writer_thread(gpointer data)
{
    Writer *w = data;

    for (;;) {
        Piece *piece = g_async_queue_pop(w->full);

        if (piece == &w->end)
            return NULL;
        if (!g_atomic_int_get(&w->failed)) {
            if (writer_send(w, piece->data, piece->len))
                w->sent += piece->len;
            else
                g_atomic_int_set(&w->failed, 1);
        }
        g_async_queue_push(w->free, piece);
    }
}

/* A writer, or NULL when no thread can be had (the caller then writes itself). */
static Writer *
writer_start(VmEgressIntercept *ic)
{
    Writer *w = g_new0(Writer, 1);

    w->ic = ic;
    w->full = g_async_queue_new();
    w->free = g_async_queue_new();
    for (guint i = 0; i < PIPELINE_BUFFERS; i++) {
        w->pieces[i].data = g_malloc(PIECE_SIZE);
        g_async_queue_push(w->free, &w->pieces[i]);
    }
    w->thread = g_thread_try_new("egress-writer", writer_thread, w, NULL);
    if (w->thread != NULL)
        return w;
    for (guint i = 0; i < PIPELINE_BUFFERS; i++)
        g_free(w->pieces[i].data);
    g_async_queue_unref(w->full);
    g_async_queue_unref(w->free);
    g_free(w);
    return NULL;
}

/* Lets the writer send what it holds (or drop it, after @stop) and joins it. FALSE when it
 * failed. */
static gboolean
writer_finish(Writer *w, gboolean stop, guint64 *bytes_down)
{
    gboolean ok;

    if (stop)
        g_atomic_int_set(&w->stop, 1);
    g_async_queue_push(w->full, &w->end);
    g_thread_join(w->thread);
    ok = !g_atomic_int_get(&w->failed);
    *bytes_down += w->sent;
    for (guint i = 0; i < PIPELINE_BUFFERS; i++)
        g_free(w->pieces[i].data);
    g_async_queue_unref(w->full);
    g_async_queue_unref(w->free);
    g_free(w);
    return ok;
}

/* A free piece for the reader, waiting for the writer to hand one back; NULL with *@ret_reason
 * when the writer failed or the connection must end. */
static Piece *
writer_get_piece(Writer *w, const char **ret_reason)
{
    for (;;) {
        Piece *piece;
        const char *why;

        if (g_atomic_int_get(&w->failed)) {
            *ret_reason = "reset";
            return NULL;
        }
        piece = g_async_queue_timeout_pop(w->free, TICK_MS * 1000);
        if (piece != NULL)
            return piece;
        if ((why = w->ic->conn->interrupted(w->ic->conn->data)) != NULL) {
            *ret_reason = why;
            return NULL;
        }
    }
}

/* Reads the body from the destination into pieces the writer sends, until it ended. */
static gboolean
relay_body_pipelined(VmEgressIntercept *ic, Writer *w, VmEgressBodyFramer *framer,
                     gboolean *ret_close, const char **ret_reason)
{
    gboolean redact_body = redacting(ic);

    for (gboolean done = FALSE; !done;) {
        g_autoptr(GError) error = NULL;
        Piece *piece = writer_get_piece(w, ret_reason);
        /* redacting, the read lands in ic->buf, and what the redactor lets go in the piece */
        guint8 *buf = redact_body ? ic->buf : piece != NULL ? piece->data : NULL;
        const guint8 *out = NULL;
        gsize consumed;
        gssize n;

        if (piece == NULL)
            return FALSE;
        n = side_recv(ic, &ic->up, buf, BUFFER_SIZE, idle_deadline(ic), "idle", ret_reason);
        if (n == 0 && framer == NULL && redact_body) {
            /* the end of a body delimited by the close: the held tail can go */
            if (!redact(ic, TRUE, &out, &piece->len, ret_reason)) {
                g_async_queue_push(w->free, piece);
                return FALSE;
            }
            memcpy(piece->data, out, piece->len);
            g_async_queue_push(piece->len > 0 ? w->full : w->free, piece);
            return TRUE;
        }
        if (n <= 0) {
            g_async_queue_push(w->free, piece);
            if (n == 0 && framer != NULL)
                *ret_reason = "closed"; /* cut short */
            return n == 0 && framer == NULL;
        }
        n = (gssize)side_fill(&ic->up, buf, (gsize)n, BUFFER_SIZE);
        consumed = (gsize)n;
        if (framer != NULL) {
            switch (vm_egress_body_framer_feed(framer, buf, n, &consumed, &error)) {
            case VM_EGRESS_PARSE_MORE:
                consumed = (gsize)n;
                break;
            case VM_EGRESS_PARSE_DONE:
                done = TRUE;
                if (consumed < (gsize)n)
                    *ret_close = TRUE;
                break;
            case VM_EGRESS_PARSE_ERROR:
            default:
                g_async_queue_push(w->free, piece);
                *ret_reason = "bad-response";
                return FALSE;
            }
        }
        if (redact_body) {
            redactor_feed_body(ic, framer != NULL, buf, consumed);
            if (!redact(ic, done, &out, &consumed, ret_reason)) {
                g_async_queue_push(w->free, piece);
                return FALSE;
            }
            /* at most what was held (VM_EGRESS_REDACTOR_HOLD_MAX) and one read */
            memcpy(piece->data, out, consumed);
        }
        piece->len = consumed;
        g_async_queue_push(consumed > 0 ? w->full : w->free, piece);
    }
    return TRUE;
}

/* Relays the response to @request as it arrives: interim 1xx heads, the final head, then the
 * body by its framing; each byte through the redactor once a value was substituted on the
 * connection. *@ret_close when the connection cannot carry another request. *@ret_refused when
 * the response was refused (the guest got a 502 instead): a body the redactor cannot read. */
static gboolean
relay_response(VmEgressIntercept *ic, const VmEgressRequest *request, gboolean *ret_close,
               gboolean *ret_refused, guint64 *bytes_down, const char **ret_reason)
{
    g_autoptr(VmEgressBodyFramer) framer = NULL;
    ResponseHead head;
    gsize head_len = 0;
    gboolean done = FALSE;
    gboolean no_body;

    g_byte_array_set_size(ic->up_head, 0);
    g_ptr_array_set_size(ic->redacted, 0);
    for (;;) {
        g_autofree char *text = NULL;

        if (!read_response_head(ic, &head_len, ret_reason))
            return FALSE;
        text = g_strndup((const char *)ic->up_head->data, head_len - 4);
        /* a NUL would hide the fields after it from this parse, not from the guest's */
        if (memchr(ic->up_head->data, '\0', head_len) != NULL ||
            !response_head_parse(text, &head) || head.status == 101) {
            *ret_reason = "bad-response";
            return FALSE;
        }
        no_body = g_ascii_strcasecmp(request->method, "HEAD") == 0 || head.status == 204 ||
                  head.status == 304;
        if (redacting(ic) && head.status >= 200 && !no_body && (head.encoded || head.transformed)) {
            /* the redactor reads the body as it goes: a coded one would hide the value */
            *ret_reason = head.encoded ? "refused: response Content-Encoding is not identity"
                                       : "refused: response transfer coding is not chunked";
            guest_respond(ic, 502, "Bad Gateway", *ret_reason);
            *ret_refused = TRUE;
            return FALSE;
        }
        if (redacting(ic)) {
            vm_egress_redactor_feed(ic->redactor, ic->up_head->data, head_len, TRUE);
            if (!redact_down(ic, TRUE, bytes_down, ret_reason))
                return FALSE;
        } else if (!send_down(ic, ic->up_head->data, head_len, bytes_down, ret_reason)) {
            return FALSE;
        }
        g_byte_array_remove_range(ic->up_head, 0, head_len);
        if (head.status >= 200)
            break;
    }
    *ret_close = head.close || request->close;
    if (no_body) {
        done = TRUE;
        if (ic->up_head->len > 0)
            *ret_close = TRUE; /* bytes no request asked for */
    } else if (head.chunked || head.has_length) {
        framer = vm_egress_body_framer_new_response(head.chunked, head.length);
        if (redacting(ic))
            vm_egress_body_framer_set_payload_func(framer, payload_piece, ic->payload);
        if (vm_egress_body_framer_feed(framer, NULL, 0, NULL, NULL) == VM_EGRESS_PARSE_DONE)
            done = TRUE;
    } else {
        *ret_close = TRUE; /* delimited by the close */
    }
    if (!done && ic->up_head->len > 0 &&
        !relay_body_bytes(ic, framer, ic->up_head->data, ic->up_head->len, &done, ret_close,
                          bytes_down, ret_reason))
        return FALSE;
    g_byte_array_set_size(ic->up_head, 0);
    while (!done) {
        gssize n;

        if (*bytes_down > PIPELINE_AFTER) {
            Writer *w = writer_start(ic);

            if (w != NULL) {
                gboolean ok = relay_body_pipelined(ic, w, framer, ret_close, ret_reason);

                if (!writer_finish(w, !ok, bytes_down) && ok) {
                    *ret_reason = "reset";
                    ok = FALSE;
                }
                return ok;
            }
        }
        n = side_recv(ic, &ic->up, ic->buf, BUFFER_SIZE, idle_deadline(ic), "idle", ret_reason);

        if (n < 0)
            return FALSE;
        if (n == 0) {
            if (framer != NULL) {
                *ret_reason = "closed"; /* cut short */
                return FALSE;
            }
            /* the end of a body delimited by the close: the held tail can go */
            if (redacting(ic) && !redact_down(ic, TRUE, bytes_down, ret_reason))
                return FALSE;
            break;
        }
        n = (gssize)side_fill(&ic->up, ic->buf, (gsize)n, BUFFER_SIZE);
        if (!relay_body_bytes(ic, framer, ic->buf, (gsize)n, &done, ret_close, bytes_down,
                              ret_reason))
            return FALSE;
    }
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * The connection */

/* One request and its response. FALSE when the connection ends after it. */
static gboolean
serve_request(VmEgressIntercept *ic)
{
    const VmEgressInterceptConn *conn = ic->conn;
    g_autoptr(VmEgressCredentials) creds = NULL;
    g_autoptr(VmEgressRequest) request = NULL;
    g_autofree char *reason = NULL;
    g_autofree char *secret = NULL;
    g_autoptr(GError) error = NULL;
    const char *expect;
    const char *ended = NULL;
    guint64 bytes_up = 0, bytes_down = 0;
    gboolean close = FALSE;
    gboolean refused = FALSE;

    creds = conn->dup_credentials(conn->data);
    request = read_request(ic, creds, &reason);
    if (request == NULL) {
        if (reason != NULL)
            ic_log(ic, VM_EGRESS_RECORD_DENIED, reason, NULL, 0, 0);
        return FALSE;
    }
    if (!g_strv_contains(allowed_methods, request->method)) {
        /* cut short: the method is the guest's, and no placeholder fits in 16 bytes */
        g_autofree char *why = g_strdup_printf("method not allowed: %.16s", request->method);

        guest_respond_with(ic, 405, "Method Not Allowed", "Allow: " ALLOWED_METHODS "\r\n", why);
        ic_log(ic, VM_EGRESS_RECORD_DENIED, why, NULL, 0, 0);
        return FALSE;
    }
    /* The grants of this moment: a rotation or a revoke applies from the next request on. */
    g_clear_pointer(&creds, vm_egress_credentials_unref);
    creds = conn->dup_credentials(conn->data);
    if (!vm_egress_credentials_intercepts(creds, conn->host)) {
        guest_respond(ic, 503, "Service Unavailable", "no grant for this host any more: retry");
        ic_log(ic, VM_EGRESS_RECORD_DENIED, "credentials-changed", NULL, 0, 0);
        return FALSE;
    }
    if (!vm_egress_credentials_apply(creds, request, conn->host, ic->redactor, &secret, &error)) {
        guest_respond(ic, 403, "Forbidden", error->message);
        ic_log(ic, VM_EGRESS_RECORD_DENIED, error->message, NULL, 0, 0);
        return FALSE;
    }
    /* The proxy holds the body until it was checked: the guest gets its 100 from here. */
    expect = vm_egress_request_get_header(request, "expect");
    if (expect != NULL) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

        if (g_ascii_strcasecmp(expect, "100-continue") == 0 &&
            !side_send(ic, &ic->guest, (const guint8 *)cont, strlen(cont), &ended)) {
            ic_log(ic, VM_EGRESS_RECORD_ALLOWED, ended, secret, 0, 0);
            return FALSE;
        }
        vm_egress_request_set_header(request, "expect", NULL);
    }
    /* A response the redactor can read: no compression once a value went up on the connection */
    if (redacting(ic))
        vm_egress_request_set_header(request, "Accept-Encoding", "identity");
    if (!relay_request(ic, creds, request, &bytes_up, &reason)) {
        gboolean leak = g_str_has_prefix(reason, "leak:") || strcmp(reason, "bad-request") == 0;

        ic_log(ic, leak ? VM_EGRESS_RECORD_DENIED : VM_EGRESS_RECORD_ALLOWED, reason,
               leak ? NULL : secret, leak ? 0 : bytes_up, 0);
        return FALSE;
    }
    if (!relay_response(ic, request, &close, &refused, &bytes_down, &ended)) {
        ic_log(ic, refused ? VM_EGRESS_RECORD_DENIED : VM_EGRESS_RECORD_ALLOWED, ended, secret,
               bytes_up, bytes_down);
        return FALSE;
    }
    ic_log(ic, VM_EGRESS_RECORD_ALLOWED, close ? "closed" : "completed", secret, bytes_up,
           bytes_down);
    return !close;
}

void
vm_egress_intercept_serve(VmEgressIntercept *ic)
{
    const VmEgressInterceptConn *conn = ic->conn;
    g_autoptr(GError) error = NULL;
    g_autofree char *cert_pem = NULL;
    g_autofree char *key_pem = NULL;
    const char *reason = NULL;
    int rc;

    if (!vm_egress_mint_cache_get(ic->interceptor->mint, conn->host, &cert_pem, &key_pem, &error)) {
        ic_log(ic, VM_EGRESS_RECORD_DENIED, "mint-failed", NULL, 0, 0);
        return;
    }
    gnutls_datum_t cert = {(unsigned char *)cert_pem, (unsigned)strlen(cert_pem)};
    gnutls_datum_t key = {(unsigned char *)key_pem, (unsigned)strlen(key_pem)};
    rc = gnutls_certificate_allocate_credentials(&ic->guest_creds);
    if (rc >= 0)
        rc = gnutls_certificate_set_x509_key_mem(ic->guest_creds, &cert, &key, GNUTLS_X509_FMT_PEM);
    explicit_bzero(key_pem, strlen(key_pem));
    if (rc < 0 || !side_open(&ic->guest, conn->guest_fd, GNUTLS_SERVER, &error) ||
        gnutls_credentials_set(ic->guest.session, GNUTLS_CRD_CERTIFICATE, ic->guest_creds) < 0) {
        ic_log(ic, VM_EGRESS_RECORD_DENIED, "guest-tls: setup failed", NULL, 0, 0);
        return;
    }
    /* the ClientHello the proxy read for the SNI check goes to GnuTLS first */
    ic->guest.preread = conn->guest_pending;
    rc =
        side_handshake(ic, &ic->guest,
                       g_get_monotonic_time() + (gint64)conn->handshake_timeout_ms * 1000, &reason);
    if (rc != 0) {
        g_autofree char *why =
            rc == 1 ? g_strdup(reason) : g_strdup_printf("guest-tls: %s", gnutls_strerror(rc));

        ic_log(ic, VM_EGRESS_RECORD_DENIED, why, NULL, 0, 0);
        return;
    }
    while (serve_request(ic))
        ;
    (void)gnutls_bye(ic->guest.session, GNUTLS_SHUT_WR);
    (void)gnutls_bye(ic->up.session, GNUTLS_SHUT_WR);
}
