/* The credential broker's TLS interception: an intercepted CONNECT, after the policy allowed it.
 *
 * For a CONNECT to a host that some grant names (vm-egress-credential.h), the proxy does not
 * tunnel: it is a TLS client to the checked address (SNI the host, the certificate verified
 * against the system's trust store or a CA file), and, once that verified, the TLS server the
 * guest talks to (a certificate for the host minted with the agent's CA, ALPN "http/1.1" only).
 * Between the two it runs HTTP/1.1: each request head the guest sends is parsed (origin form, its
 * Host the CONNECT host), the grants are applied to it with the grants current at that moment
 * (a placeholder anywhere it does not belong refuses it and closes the connection), its body is
 * scanned for placeholders on its way up, and the response goes down as it arrives (Content-Length,
 * chunked, or until the close), so streamed answers reach the guest piece by piece. Then the
 * next request on the kept-alive connection goes through the same steps.
 *
 * The proxy's connection thread calls these; one VmEgressInterceptor per proxy holds what its
 * connections share (the minted certificates, the upstream trust).
 */
#pragma once

#include <glib.h>

#include "vm-egress-credential.h"
#include "vm-egress-proxy.h"

G_BEGIN_DECLS

typedef struct _VmEgressInterceptor VmEgressInterceptor;

/* What one proxy's interceptions share: certificates minted with the CA @ca_cert_pem/@ca_key_pem
 * (copied; cached per host), and the trust for real hosts: @upstream_ca_pem (PEM text) when not
 * NULL, else @upstream_ca_file (PEM), else the system's trust store. Fails with
 * VM_ERROR_INVALID_ARGUMENT when the CA does not parse or the upstream certificates cannot be
 * read, VM_ERROR_IO when GnuTLS fails. Safe to share between threads. */
VmEgressInterceptor *vm_egress_interceptor_new(const char *ca_cert_pem, const char *ca_key_pem,
                                               const char *upstream_ca_file,
                                               const char *upstream_ca_pem, GError **error);
void vm_egress_interceptor_free(VmEgressInterceptor *interceptor);

/* One intercepted connection, as the proxy's connection thread hands it over. The descriptors
 * are non-blocking and stay the caller's. */
typedef struct {
    int guest_fd;
    int up_fd;                /* connected to the checked address */
    const char *host;         /* normalised: the certificate's name, the upstream SNI */
    const char *connect_host; /* as the CONNECT wrote it: what each Host header must name */
    guint16 port;
    gboolean host_is_literal;  /* an IP literal: no SNI either way */
    GByteArray *guest_pending; /* guest bytes already read (its ClientHello); consumed */
    guint handshake_timeout_ms;
    guint idle_timeout_ms;
    /* The grants current now: a new reference, or NULL for none. */
    VmEgressCredentials *(*dup_credentials)(gpointer data);
    /* NULL while the connection may go on, else why it must end now ("shutdown",
     * "policy-changed", "credentials-changed"); called at least every 200 ms while waiting. */
    const char *(*interrupted)(gpointer data);
    /* One record: per request when it ends (allowed, with the grant substituted or NULL), per
     * refusal (denied). */
    void (*log)(gpointer data, VmEgressRecordKind kind, const char *reason, const char *secret,
                guint64 bytes_up, guint64 bytes_down);
    gpointer data;
} VmEgressInterceptConn;

typedef struct _VmEgressIntercept VmEgressIntercept;

/* Starts intercepting @conn (kept by pointer: it must outlive the result). Can't fail. */
VmEgressIntercept *vm_egress_intercept_new(VmEgressInterceptor *interceptor,
                                           const VmEgressInterceptConn *conn);
void vm_egress_intercept_free(VmEgressIntercept *intercept);

/* The TLS handshake with the destination, within @timeout_ms, before the guest is answered.
 * Fails with VM_ERROR_PROTOCOL and a message that is the log reason: "upstream certificate not
 * trusted: ..." when its certificate does not verify for the host, "upstream-tls: ..." for other
 * failures, VM_ERROR_TIMEOUT ("timeout") or VM_ERROR_CANCELLED (the interruption's reason). */
gboolean vm_egress_intercept_upstream(VmEgressIntercept *intercept, guint timeout_ms,
                                      GError **error);

/* After the guest got its 200: the TLS handshake with the guest, then the requests, each logged
 * through the callback, until either side closes, a refusal, an error, idleness or an
 * interruption. Returns once the connection is done (the caller closes the descriptors). */
void vm_egress_intercept_serve(VmEgressIntercept *intercept);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressInterceptor, vm_egress_interceptor_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressIntercept, vm_egress_intercept_free)

G_END_DECLS
