/* The server name (SNI) of the TLS ClientHello a client sends first in a CONNECT tunnel.
 *
 * The proxy frames only the TLS record headers (5 bytes each) and the handshake header around
 * the ClientHello; the ClientHello's body and its extensions are read by GnuTLS
 * (gnutls_ext_raw_parse()). Only a ClientHello in handshake records is accepted, and its size is
 * bounded, so a client cannot make the proxy buffer more than VM_EGRESS_CLIENT_HELLO_MAX bytes.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The most bytes (records with their headers) a ClientHello may take. */
#define VM_EGRESS_CLIENT_HELLO_MAX (64 * 1024)

typedef enum {
    VM_EGRESS_HELLO_MORE,  /* incomplete: read more and call again with all bytes so far */
    VM_EGRESS_HELLO_DONE,  /* a complete ClientHello */
    VM_EGRESS_HELLO_ERROR, /* not a TLS ClientHello, malformed, or over the limit */
} VmEgressHelloStatus;

/* Looks at the first @len bytes a client sent. On VM_EGRESS_HELLO_DONE, *@ret_sni is the host
 * name of the server_name extension as sent, newly allocated, or NULL when the ClientHello has
 * none. Fails (VM_EGRESS_HELLO_ERROR, VM_ERROR_PROTOCOL) for anything but handshake records
 * carrying a ClientHello, a ClientHello longer than the limit, or a server_name extension that is
 * malformed, repeated, or names anything but exactly one host name of printable ASCII. */
VmEgressHelloStatus vm_egress_tls_client_hello_sni(const guint8 *data, gsize len, char **ret_sni,
                                                   GError **error);

G_END_DECLS
