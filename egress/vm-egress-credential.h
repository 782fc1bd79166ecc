/* Credentials the egress proxy substitutes (the credential broker; docs/SECRETS.md).
 *
 * A guest holds only placeholders: random tokens, one per agent and secret. A VmEgressCredentials
 * is the set of grants one agent's proxy honours: for each, the placeholder, the real value, the
 * host patterns it may go to, and the request header it goes in. The proxy intercepts TLS only
 * for CONNECTs to a host that some grant names (terminating the guest's TLS with a certificate
 * the agent's own CA signs, vm-egress-ca.h), replaces the placeholder in that header of each
 * request on the connection, and refuses any request that carries a placeholder anywhere else.
 *
 * A set is immutable once handed to a proxy (vm_egress_proxy_set_credentials() takes a
 * reference); to change grants, build a new set. Values live in memory only: nothing here writes
 * or logs them.
 */
#pragma once

#include <glib.h>

#include "vm-egress-request.h"

G_BEGIN_DECLS

typedef struct _VmEgressCredentials VmEgressCredentials;

/* An empty set (a proxy with it intercepts nothing). Can't fail. */
VmEgressCredentials *vm_egress_credentials_new(void);

VmEgressCredentials *vm_egress_credentials_ref(VmEgressCredentials *creds);
void vm_egress_credentials_unref(VmEgressCredentials *creds);

/* The most header names one grant may name. */
#define VM_EGRESS_CREDENTIAL_HEADERS_MAX 8

/* Adds one grant: @placeholder (what the guest sends) stands for @value (the real secret) in the
 * header @header (NULL: "Authorization"; or several names separated by commas, "Authorization,
 * x-api-key", at most VM_EGRESS_CREDENTIAL_HEADERS_MAX) of requests to a host matching one of
 * @hosts (exact names or "*.suffix", normalised as egress rules are), written through @format
 * (NULL: "{}"; one "{}" where the value goes, e.g. "Bearer {}"; "Basic {}" means the value is the
 * user:password pair that is base64-encoded into the header, with the placeholder found in the
 * decoded pair). With several headers the format must be "{}" (NULL): the value goes where the
 * placeholder stands in whichever of them holds it. @secret_name names the grant in the egress
 * log. Fails with VM_ERROR_INVALID_ARGUMENT for an empty value or placeholder, a malformed host
 * pattern, header (a name twice too) or format, or a placeholder already in the set. */
gboolean vm_egress_credentials_add(VmEgressCredentials *creds, const char *secret_name,
                                   const char *placeholder, const char *value,
                                   const char *const *hosts, const char *header, const char *format,
                                   GError **error);

/* Every grant of @creds as a(sssasss): secret name, placeholder, value, hosts, header, format;
 * what vm_egress_credentials_add() takes again (for the worker process that runs the proxy).
 * Holds the values: drop it soon. A new floating reference; can't fail. */
GVariant *vm_egress_credentials_to_variant(VmEgressCredentials *creds);

/* How many grants @creds holds. Can't fail. */
guint vm_egress_credentials_size(VmEgressCredentials *creds);

/* Whether connections to @host (a normalised host, vm_egress_host_normalise()) are intercepted:
 * some grant's host patterns match it (an exact name, or "*.suffix" for the names below suffix).
 * NULL @creds intercepts nothing. Can't fail. */
gboolean vm_egress_credentials_intercepts(VmEgressCredentials *creds, const char *host);

/* Applies the grants to @request, one origin-form request head read on an intercepted connection
 * to @host (normalised). A header named by a grant that names @host, whose value holds that
 * grant's placeholder, is rewritten: with a grant of several headers the placeholder is replaced
 * by the value where it stands, the rest kept ("Bearer P" gives "Bearer VALUE", "P" gives
 * "VALUE"); with one header, through the grant's format: "Bearer {}" gives "Bearer VALUE";
 * with "Basic {}" the base64 pair after "Basic " is decoded, the placeholder replaced where it
 * stands (user or password), and the pair encoded again. A placeholder anywhere else refuses the
 * request before anything changes, with VM_ERROR_INVALID_ARGUMENT and a message that is the log
 * reason: "leak: placeholder of NAME in URL" (the request target, also percent-decoded), or
 * "leak: placeholder of NAME sent to HOST" (another header, a grant that does not name @host).
 * Placeholders are also looked for inside any "Basic" credentials. Tokens that are no
 * placeholder of @creds (unknown, revoked) pass unchanged. On success *@ret_secret is the name of
 * the grant substituted last (newly allocated), or NULL when none was, and each real value
 * substituted (for "Basic {}" also the base64 text that went into the header) was added to
 * @redactor when not NULL, so that the responses on the connection are scanned for it. */
typedef struct _VmEgressRedactor VmEgressRedactor;
gboolean vm_egress_credentials_apply(VmEgressCredentials *creds, VmEgressRequest *request,
                                     const char *host, VmEgressRedactor *redactor,
                                     char **ret_secret, GError **error);

/* Checks a request head that goes out unencrypted (a plain HTTP request through the proxy): any
 * placeholder of @creds in its target or its header fields fails with VM_ERROR_INVALID_ARGUMENT
 * and the reason "leak: placeholder of NAME over plain HTTP". NULL @creds passes everything. */
gboolean vm_egress_credentials_check_plain(VmEgressCredentials *creds,
                                           const VmEgressRequest *request, GError **error);

/* Looks for placeholders in a request body that arrives in pieces of any size: a placeholder
 * split between pieces is found too. Keeps only the last (longest placeholder - 1) bytes between
 * calls. The scanner holds its own reference to the grants it was made with. */
typedef struct _VmEgressLeakScanner VmEgressLeakScanner;

/* A scanner for the placeholders of @creds (NULL: none, every feed passes). Can't fail. */
VmEgressLeakScanner *vm_egress_leak_scanner_new(VmEgressCredentials *creds);
void vm_egress_leak_scanner_free(VmEgressLeakScanner *scanner);

/* Feeds the next @len bytes of the body. Fails with VM_ERROR_INVALID_ARGUMENT and the reason
 * "leak: placeholder of NAME in body" once a placeholder has been seen; it keeps failing after
 * that. */
gboolean vm_egress_leak_scanner_feed(VmEgressLeakScanner *scanner, const guint8 *data, gsize len,
                                     GError **error);

/* How many of the last bytes fed could be the start of a placeholder that the next piece
 * completes (the longest placeholder's length - 1; 0 without grants): a relay that sends a body
 * on before its end holds that many back. Can't fail. */
gsize vm_egress_leak_scanner_get_keep(const VmEgressLeakScanner *scanner);

/* Masks real values in what goes back to the guest: the responses on an intercepted connection,
 * which an upstream may fill with the request it received (an echo, a debug page, an error body).
 *
 * The stream is fed in pieces of any size, each marked as payload (a head, the body as decoded) or
 * as framing (chunk-size lines, the CRLFs after chunk data, trailers). A value is looked for in
 * the bytes as fed and in the payload alone, so that one split between two chunks is found
 * whole, as the guest's HTTP client will put it together. A value found is overwritten in place
 * by its mask: as many bytes as the value, the start of its placeholder (then '*' where the value
 * is longer), so that Content-Length and chunk sizes stay true. What may go on is all that was
 * fed less the longest tail that could be the start of a value (in either view): a stream keeps
 * its timing except where its last bytes really look like the start of a secret. Encodings of
 * a value (base64, percent-encoding, a compressed body) are not recognised.
 *
 * Values live only here and in the grants; the redactor wipes what it held when freed. */

/* The most bytes a redactor holds back between pieces: past it, take() fails. A value's prefix
 * spread over many tiny chunks with long chunk lines is the only way to reach it. */
#define VM_EGRESS_REDACTOR_HOLD_MAX (64 * 1024)

/* A redactor that looks for nothing yet. Can't fail. */
VmEgressRedactor *vm_egress_redactor_new(void);
void vm_egress_redactor_free(VmEgressRedactor *redactor);

/* Adds @value (non-empty), masked with the start of @placeholder, reported as @secret_name; a
 * value already there is not added twice. Can't fail. */
void vm_egress_redactor_add(VmEgressRedactor *redactor, const char *secret_name, const char *value,
                            const char *placeholder);

/* How many values @redactor looks for. Can't fail. */
guint vm_egress_redactor_size(const VmEgressRedactor *redactor);

/* Appends @len bytes of the stream, payload or framing (see above). Can't fail. */
void vm_egress_redactor_feed(VmEgressRedactor *redactor, const guint8 *data, gsize len,
                             gboolean payload);

/* Masks every value complete in what was fed, and gives the bytes that may go on now:
 * *@ret_data (owned by @redactor, valid until its next call) and *@ret_len; all of them when
 * @final (the stream ends there: nothing can complete a value any more), else all but the tail
 * that could begin one. Fails with VM_ERROR_PROTOCOL ("redactor: ...") when more than
 * VM_EGRESS_REDACTOR_HOLD_MAX bytes would stay held. */
gboolean vm_egress_redactor_take(VmEgressRedactor *redactor, gboolean final,
                                 const guint8 **ret_data, gsize *ret_len, GError **error);

/* The secret names whose values were masked since the last call, in the order found, each once
 * (newly allocated), or NULL when none was. Can't fail. */
char **vm_egress_redactor_steal_hits(VmEgressRedactor *redactor);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressRedactor, vm_egress_redactor_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressCredentials, vm_egress_credentials_unref)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressLeakScanner, vm_egress_leak_scanner_free)

G_END_DECLS
