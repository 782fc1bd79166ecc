/* The SNI of a TLS ClientHello: record and handshake framing here, extensions by GnuTLS. */
#include "vm-egress-tls.h"
#include "vm-error.h"

#include <gnutls/gnutls.h>
#include <string.h>

#define RECORD_HEADER    5
#define RECORD_MAX       (16 * 1024) /* TLSPlaintext.length is at most 2^14 */
#define RECORD_HANDSHAKE 22
#define HANDSHAKE_HEADER 4
#define CLIENT_HELLO     1
#define EXT_SERVER_NAME  0
#define SNI_HOST_NAME    0
#define SNI_MAX          255

typedef struct {
    guint n_sni;
    char *sni;
    const char *problem; /* why the server_name extension was refused */
} SniContext;

/* Reads the server_name extension's ServerNameList (RFC 6066 section 3): the one part of the
 * ClientHello that GnuTLS hands over as bytes. */
static int
sni_extension(void *user_data, unsigned tls_id, const unsigned char *data, unsigned size)
{
    SniContext *ctx = user_data;
    gsize list_len, name_len;

    if (tls_id != EXT_SERVER_NAME)
        return 0;
    if (++ctx->n_sni > 1)
        return ctx->problem = "server_name extension repeated", GNUTLS_E_RECEIVED_ILLEGAL_EXTENSION;
    if (size < 2 || (list_len = (gsize)data[0] << 8 | data[1]) != size - 2)
        return ctx->problem = "bad server_name list length", GNUTLS_E_RECEIVED_ILLEGAL_EXTENSION;
    /* exactly one entry, a host name: other name types were never defined */
    if (list_len < 3 || data[2] != SNI_HOST_NAME ||
        (name_len = (gsize)data[3] << 8 | data[4]) != list_len - 3)
        return ctx->problem = "server_name must hold exactly one host name",
               GNUTLS_E_RECEIVED_ILLEGAL_EXTENSION;
    if (name_len == 0 || name_len > SNI_MAX)
        return ctx->problem = "bad server name length", GNUTLS_E_RECEIVED_ILLEGAL_EXTENSION;
    for (gsize i = 0; i < name_len; i++)
        if (data[5 + i] <= 0x20 || data[5 + i] >= 0x7f)
            return ctx->problem = "server name is not printable ASCII",
                   GNUTLS_E_RECEIVED_ILLEGAL_EXTENSION;
    ctx->sni = g_strndup((const char *)data + 5, name_len);
    return 0;
}

VmEgressHelloStatus
vm_egress_tls_client_hello_sni(const guint8 *data, gsize len, char **ret_sni, GError **error)
{
    g_autoptr(GByteArray) handshake = g_byte_array_new();
    gsize off = 0;
    gsize hello_len = 0;
    SniContext ctx = {0};
    gnutls_datum_t body;
    int rc;

    /* Gather the handshake bytes of the records that carry the ClientHello; each record header
     * is checked as soon as it is there, so what is not TLS fails at once. */
    for (;;) {
        gsize record_len;

        if (handshake->len >= HANDSHAKE_HEADER) {
            if (handshake->data[0] != CLIENT_HELLO)
                return vm_throw(error, VM_ERROR_PROTOCOL,
                                "first handshake message is not a "
                                "ClientHello"),
                       VM_EGRESS_HELLO_ERROR;
            hello_len = (gsize)handshake->data[1] << 16 | (gsize)handshake->data[2] << 8 |
                        handshake->data[3];
            /* half the limit: the other half leaves room for the record headers */
            if (hello_len > VM_EGRESS_CLIENT_HELLO_MAX / 2)
                return vm_throw(error, VM_ERROR_PROTOCOL, "ClientHello longer than %d bytes",
                                VM_EGRESS_CLIENT_HELLO_MAX / 2),
                       VM_EGRESS_HELLO_ERROR;
            if (handshake->len >= HANDSHAKE_HEADER + hello_len)
                break;
        }
        if (off >= VM_EGRESS_CLIENT_HELLO_MAX)
            return vm_throw(error, VM_ERROR_PROTOCOL, "ClientHello records longer than %d bytes",
                            VM_EGRESS_CLIENT_HELLO_MAX),
                   VM_EGRESS_HELLO_ERROR;
        if (len - off >= 1 && data[off] != RECORD_HANDSHAKE)
            return vm_throw(error, VM_ERROR_PROTOCOL, "not a TLS handshake record"),
                   VM_EGRESS_HELLO_ERROR;
        if (len - off >= 2 && data[off + 1] != 3)
            return vm_throw(error, VM_ERROR_PROTOCOL, "not a TLS record version"),
                   VM_EGRESS_HELLO_ERROR;
        if (len - off < RECORD_HEADER)
            return VM_EGRESS_HELLO_MORE;
        record_len = (gsize)data[off + 3] << 8 | data[off + 4];
        if (record_len == 0 || record_len > RECORD_MAX)
            return vm_throw(error, VM_ERROR_PROTOCOL, "bad TLS record length %zu", record_len),
                   VM_EGRESS_HELLO_ERROR;
        if (len - off - RECORD_HEADER < record_len)
            return VM_EGRESS_HELLO_MORE;
        g_byte_array_append(handshake, data + off + RECORD_HEADER, record_len);
        off += RECORD_HEADER + record_len;
    }

    body.data = handshake->data + HANDSHAKE_HEADER;
    body.size = hello_len;
    rc = gnutls_ext_raw_parse(&ctx, sni_extension, &body, GNUTLS_EXT_RAW_FLAG_TLS_CLIENT_HELLO);
    if (rc < 0) {
        vm_throw(error, VM_ERROR_PROTOCOL, "bad ClientHello: %s",
                 ctx.problem != NULL ? ctx.problem : gnutls_strerror(rc));
        g_free(ctx.sni);
        return VM_EGRESS_HELLO_ERROR;
    }
    *ret_sni = ctx.sni;
    return VM_EGRESS_HELLO_DONE;
}
