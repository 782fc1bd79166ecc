/* The egress proxy: the one way out of an agent's VM.
 *
 * A proxy owns a listening TCP socket and a thread that accepts connections; each connection is
 * served by a thread of its own. Each request head on a connection (see vm-egress-request.h) is
 * decided on its own: the proxy decides on the host and port it names, resolves the name itself,
 * checks every address, and only then connects, to the checked address. Every refusal and every
 * error closes the guest's connection, after a 4xx/5xx response where HTTP allows one; nothing is
 * ever relayed anywhere else. An allowed CONNECT to a name must then send a TLS ClientHello whose
 * SNI names that host (vm-egress-tls.h). An allowed connection becomes a byte relay (a buffer per
 * direction, poll() over non-blocking sockets) until either side closes, the idle timeout
 * strikes, or a policy change refuses its host; for a plain HTTP request only its body is
 * relayed up, and a request after it is read once the destination closed, and served on a
 * connection of its own after its own decisions.
 *
 * With a CA (ca_cert_pem/ca_key_pem) and grants (credentials), a CONNECT to a host that a grant
 * names is intercepted instead of tunnelled (vm-egress-intercept.h): the proxy verifies the
 * destination's certificate, terminates the guest's TLS with a certificate its CA signs, puts the
 * grants' values in place of their placeholders request by request, and refuses a placeholder
 * anywhere else. A plain HTTP request with a placeholder in its head is refused, whatever its
 * host (docs/EGRESS.md).
 *
 * Instead of TCP the proxy can listen on a Unix stream socket (listen_path). A client of that
 * socket either speaks HTTP on it, or hands the guest's connection over: its first message is one
 * byte carrying a connected stream socket as SCM_RIGHTS (vm_egress_proxy_pass_fd()); the proxy
 * then serves that socket and closes the Unix connection. This is how a QEMU guestfwd helper
 * gives its guest connection away and exits, so no process relays bytes but the proxy.
 *
 * A connection handed over with the byte VM_FD_PASS_TAG_DNS carries DNS over TCP instead: the
 * proxy's resolver (vm-egress-dns.h) answers allowed names with synthetic addresses, and a
 * CONNECT to such an address is a CONNECT to its name.
 */
#pragma once

#include <glib.h>
#include <sys/types.h>

#include "vm-egress-credential.h"
#include "vm-egress-policy.h"
#include "vm-egress-request.h"

G_BEGIN_DECLS

typedef enum {
    VM_EGRESS_RECORD_ALLOWED,
    VM_EGRESS_RECORD_DENIED,
} VmEgressRecordKind;

/* One log record: per allowed connection when it ends, per denied attempt when refused. */
typedef struct {
    VmEgressRecordKind kind;
    gint64 start_time; /* wall clock when the guest connected, microseconds since the epoch */
    const char *host;  /* as requested; NULL when no valid request head arrived */
    guint16 port;
    const char *address; /* the address connected to (or refused); NULL before resolution */
    const char *reason;  /* denied: why ("no-rule", "timeout", ...); allowed: how it ended */
    guint64 bytes_up;    /* guest to destination, request head included */
    guint64 bytes_down;  /* destination to guest */
    gint64 duration_us;
    const char *secret; /* allowed: the grant substituted in its requests (the last one); else
                         * NULL. A name, never a value. */
} VmEgressRecord;

/* Called from the proxy's threads, one record at a time (calls are serialised), never after
 * vm_egress_proxy_free() returned. Must not call back into the proxy. */
typedef void (*VmEgressLogFunc)(const VmEgressRecord *record, gpointer user_data);

/* Resolves @host (a normalised name, never an IP literal) into a new GArray of VmEgressAddress;
 * NULL with an error when it cannot. Called from connection threads, so it may block. */
typedef GArray *(*VmEgressResolveFunc)(const char *host, gpointer user_data, GError **error);

/* Makes a TCP socket to @address:@port and begins its connect(): the socket (non-blocking,
 * close-on-exec; the proxy waits for the connection itself, up to its connect timeout), or a
 * negative errno (-EACCES: the one who connects refused the destination). Called from connection
 * threads, so it may block briefly. */
typedef int (*VmEgressConnectFunc)(const VmEgressAddress *address, guint16 port,
                                   gpointer user_data);

/* Sees an allowed request before anything goes to the destination and may rewrite its header
 * fields (vm_egress_request_set_header()); returning FALSE refuses the request. */
typedef gboolean (*VmEgressRewriteFunc)(VmEgressRequest *request, gpointer user_data,
                                        GError **error);

typedef struct {
    const char *listen_address; /* NULL: "127.0.0.1" */
    guint16 listen_port;        /* 0: any free port (vm_egress_proxy_get_port()) */
    const char *listen_path;    /* non-NULL: a Unix socket here instead of TCP (mode 0600; a
                                 * socket file already there is replaced) */
    gboolean listen_chown;      /* with listen_path: the socket belongs to listen_uid:listen_gid
                                 * before anyone can connect */
    uid_t listen_uid;
    gid_t listen_gid;
    gboolean use_listen_fd;      /* serve listen_fd instead of binding anything: a listening */
    int listen_fd;               /* Unix stream socket (vm_egress_proxy_listen_unix()) that takes
                                  * handed-over connections; duplicated, the caller keeps its own
                                  * and its path (nothing is unlinked) */
    VmEgressPolicy *policy;      /* NULL: nothing allowed; the proxy takes its own reference */
    guint max_connections;       /* 0: 64; more are answered 503 and closed */
    guint handshake_timeout_ms;  /* 0: 10 s for the whole request head to arrive */
    guint idle_timeout_ms;       /* 0: 5 min without a byte either way */
    guint connect_timeout_ms;    /* 0: 10 s */
    VmEgressResolveFunc resolve; /* NULL: getaddrinfo() */
    gpointer resolve_data;
    VmEgressConnectFunc connect; /* NULL: socket() and connect() of its own */
    gpointer connect_data;
    VmEgressLogFunc log; /* may be NULL */
    gpointer log_data;
    VmEgressRewriteFunc rewrite; /* may be NULL */
    gpointer rewrite_data;
    /* The credential broker (vm-egress-credential.h, docs/SECRETS.md): */
    VmEgressCredentials *credentials; /* NULL: none, nothing intercepted; a reference is taken */
    const char *ca_cert_pem;          /* the agent's CA (vm-egress-ca.h): signs the certificates */
    const char *ca_key_pem;           /* of intercepted hosts; both needed to intercept */
    const char *upstream_ca_file;     /* NULL: the system's trust store, for real hosts' certs */
    const char *upstream_ca_pem;      /* instead of upstream_ca_file: the certificates as PEM */
    guint dns_max_names; /* names the resolver holds addresses for; 0: VM_EGRESS_DNS_MAX_NAMES */
} VmEgressConfig;

typedef struct _VmEgressProxy VmEgressProxy;

/* Binds the listening socket and starts serving. Fails with VM_ERROR_INVALID_ARGUMENT for a bad
 * listen address, a path too long for a Unix socket, a CA that does not parse or an
 * upstream_ca_file without certificates, VM_ERROR_NO_RESOURCES when the port is
 * taken, VM_ERROR_IO otherwise. */
VmEgressProxy *vm_egress_proxy_new(const VmEgressConfig *config, GError **error);

/* Binds a Unix stream socket at @path (a socket file already there is replaced), gives it mode
 * 0600 and, with @chown, the owner @uid:@gid, and only then listens, so nobody connects through a
 * wider mode in between. Returns the listening socket (close-on-exec, non-blocking), for
 * VmEgressConfig.listen_fd; -1 with VM_ERROR_INVALID_ARGUMENT for a path too long, VM_ERROR_IO
 * otherwise (nothing left at @path). */
int vm_egress_proxy_listen_unix(const char *path, gboolean chown, uid_t uid, gid_t gid,
                                GError **error);

/* Stops accepting, closes every connection and returns once all threads are gone (at most about
 * the resolver's own timeout, since a running getaddrinfo() cannot be interrupted). NULL is
 * accepted. */
void vm_egress_proxy_free(VmEgressProxy *proxy);

/* The port the proxy listens on (0 on a Unix socket). Can't fail. */
guint16 vm_egress_proxy_get_port(VmEgressProxy *proxy);

/* Replaces the policy (the proxy takes a reference): new connections follow it at once, and open
 * connections whose host or address it refuses are closed within a second. Can't fail. */
void vm_egress_proxy_set_policy(VmEgressProxy *proxy, VmEgressPolicy *policy);

/* Replaces the grants the proxy honours (a reference is taken; NULL: none): new requests follow
 * them at once, an intercepted connection whose host no grant names any more is closed. Can't
 * fail. */
void vm_egress_proxy_set_credentials(VmEgressProxy *proxy, VmEgressCredentials *credentials);

/* A new reference to the current policy. Can't fail. */
VmEgressPolicy *vm_egress_proxy_dup_policy(VmEgressProxy *proxy);

/* How many guest connections are being served now. Can't fail. */
guint vm_egress_proxy_get_n_connections(VmEgressProxy *proxy);

/* The bytes of every request that ended since @proxy started (as its records count them: a
 * tunnel's once it closes), guest to destination in @ret_up, destination to guest in @ret_down.
 * Can't fail. */
void vm_egress_proxy_get_bytes(VmEgressProxy *proxy, guint64 *ret_up, guint64 *ret_down);

/* Connects to the proxy's Unix socket @path and hands it the connected stream socket @fd (see
 * above); returns once the kernel holds it, so the caller may close @fd and exit at once. Fails
 * with VM_ERROR_NOT_RUNNING when nothing listens at @path, VM_ERROR_INVALID_ARGUMENT for a path
 * too long, VM_ERROR_IO otherwise. */
gboolean vm_egress_proxy_pass_fd(const char *path, int fd, GError **error);

/* @record as one line of JSON without the newline: time (ISO 8601, UTC), event
 * ("allowed"/"denied"), host, port, address, reason, bytes_up, bytes_down, duration_ms, and secret
 * when one was substituted; absent strings are null. Newly allocated; can't fail. */
char *vm_egress_record_to_json(const VmEgressRecord *record);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressProxy, vm_egress_proxy_free)

G_END_DECLS
