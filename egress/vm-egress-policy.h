/* Egress policy: which destinations an agent's proxy may connect to.
 *
 * A policy is two rule lists, allow and deny. A rule is an exact name ("pypi.org"), a wildcard
 * "*.suffix" (subdomains only, never the apex), a CIDR ("203.0.113.0/24", "2001:db8::/32"; a bare
 * address is a /32 or /128), or one of the shortcuts "any" and "none", which stand alone in their
 * list. Deny wins over allow; an empty allow list allows nothing. A rule but "any" and "none" may
 * carry a port ("pypi.org:443", "203.0.113.0/24:8443", "[2001:db8::]/32:443"): an allow rule
 * without one allows ports 80 and 443 only, a deny rule without one refuses every port.
 *
 * Names and addresses never mix: an IP literal is matched only against CIDR rules, a name only
 * against name rules. After resolution every address is checked again: loopback, link-local,
 * private, multicast and other special ranges (IPv4-mapped and other IPv4-in-IPv6 forms included)
 * and the host's own addresses are refused unless an allow CIDR rule covers the address. A name
 * rule never opens such an address.
 *
 * A policy is immutable and reference counted, so threads may share one without locks.
 */
#pragma once

#include <glib.h>
#include <sys/socket.h>

G_BEGIN_DECLS

/* One IP address. IPv4 lives in the first 4 bytes; IPv4-mapped IPv6 addresses are always stored
 * as the IPv4 address they carry. */
typedef struct {
    int family;       /* AF_INET or AF_INET6 */
    guint8 bytes[16]; /* network byte order */
} VmEgressAddress;

typedef enum {
    VM_EGRESS_ALLOW = 0,
    VM_EGRESS_DENY_NO_RULE,  /* no allow rule matches (the default policy "none") */
    VM_EGRESS_DENY_RULE,     /* a deny rule matches */
    VM_EGRESS_DENY_ADDRESS,  /* special or host-own address that no allow CIDR covers */
    VM_EGRESS_DENY_BAD_HOST, /* not a valid name, or an IP spelling other than the strict forms */
} VmEgressVerdict;

typedef struct _VmEgressPolicy VmEgressPolicy;

/* A short stable name for @verdict ("allowed", "no-rule", "deny-rule", "address", "bad-host"),
 * used in logs. Can't fail. */
const char *vm_egress_verdict_name(VmEgressVerdict verdict);

/* Parses an IP literal in one of the strict forms: a dotted quad of four decimal numbers without
 * leading zeros, or an IPv6 address as inet_pton() reads it (no brackets, no zone id). An
 * IPv4-mapped IPv6 address becomes the IPv4 address. Anything else (decimal "2130706433", octal
 * "0177.0.0.1", hex "0x7f000001", short "127.1", "fe80::1%eth0") fails with
 * VM_ERROR_INVALID_ARGUMENT. */
gboolean vm_egress_address_parse(const char *text, VmEgressAddress *ret_address, GError **error);

/* Fills @ret_address from a struct sockaddr_in or sockaddr_in6; FALSE for other families. */
gboolean vm_egress_address_from_sockaddr(const struct sockaddr *sa, VmEgressAddress *ret_address);

/* The canonical text of @address ("192.0.2.1", "2001:db8::1"), newly allocated. Can't fail. */
char *vm_egress_address_to_string(const VmEgressAddress *address);

/* TRUE when @address is an ordinary public unicast address, FALSE for loopback, unspecified,
 * link-local, private (RFC 1918, CGNAT, ULA), multicast, broadcast, reserved ranges and IPv6
 * forms that embed any of these (IPv4-compatible, NAT64, 6to4). Can't fail. */
gboolean vm_egress_address_is_public(const VmEgressAddress *address);

/* Normalises a destination host as it appears in a request: an IP literal (see
 * vm_egress_address_parse()) becomes its canonical text; a name is lower-cased and loses one
 * trailing dot, and must then be 1-253 ASCII characters of dot-separated labels of 1-63 letters,
 * digits and inner hyphens. A name whose last label is numeric ("127.1", "0x7f000001",
 * "2130706433") is an odd IP spelling and refused, as is non-ASCII (IDNs must come as
 * punycode). Returns a new string, or NULL with VM_ERROR_INVALID_ARGUMENT. */
char *vm_egress_host_normalise(const char *host, GError **error);

/* The addresses of the host's own interfaces (getifaddrs()), as a new GArray of VmEgressAddress.
 * Fails with VM_ERROR_IO. */
GArray *vm_egress_local_addresses(GError **error);

/* Builds a policy from rule lists; NULL or empty @allow means "none". A policy with any bad rule
 * is refused as a whole with VM_ERROR_INVALID_ARGUMENT naming the first bad rule. Returns a new
 * reference. */
VmEgressPolicy *vm_egress_policy_new(const char *const *allow, const char *const *deny,
                                     GError **error);

/* The default policy: nothing allowed. Returns a new reference; can't fail. */
VmEgressPolicy *vm_egress_policy_new_none(void);

VmEgressPolicy *vm_egress_policy_ref(VmEgressPolicy *policy);
void vm_egress_policy_unref(VmEgressPolicy *policy);

/* The normalised rules of @policy ("none" for an empty allow list, an empty list for an empty
 * deny list), as a new NULL-terminated array. Can't fail. */
char **vm_egress_policy_dup_allow(const VmEgressPolicy *policy);
char **vm_egress_policy_dup_deny(const VmEgressPolicy *policy);

/* TRUE when @a and @b hold the same normalised rules. Can't fail. */
gboolean vm_egress_policy_equal(const VmEgressPolicy *a, const VmEgressPolicy *b);

/* Stores @policy in @group of @keyfile as string lists "allow" and "deny", replacing what was
 * there. Can't fail. */
void vm_egress_policy_to_keyfile(const VmEgressPolicy *policy, GKeyFile *keyfile,
                                 const char *group);

/* Reads the policy stored by vm_egress_policy_to_keyfile(); a missing group or key means an
 * empty list. A bad rule fails with VM_ERROR_INVALID_ARGUMENT. */
VmEgressPolicy *vm_egress_policy_new_from_keyfile(GKeyFile *keyfile, const char *group,
                                                  GError **error);

/* The first decision, on the host and port a request names, before any resolution. @host is as
 * the guest wrote it (without IPv6 brackets); it is normalised first (VM_EGRESS_DENY_BAD_HOST
 * when that fails). A rule matches @port when it names that port, or names none and @port is 80
 * or 443 (allow) or anything (deny). On VM_EGRESS_ALLOW, @ret_normalised (may be NULL) receives
 * the normalised host, newly allocated. */
VmEgressVerdict vm_egress_policy_check_host(const VmEgressPolicy *policy, const char *host,
                                            guint16 port, char **ret_normalised);

/* Whether the name @host (not an IP literal: VM_EGRESS_DENY_BAD_HOST) is allowed at some port:
 * vm_egress_policy_check_host() at 80, 443 and each port an allow rule names, the first verdict
 * VM_EGRESS_ALLOW wins, else the verdict at 443. What the proxy's resolver asks before it gives
 * a name an address (vm-egress-dns.h); @ret_normalised as there. */
VmEgressVerdict vm_egress_policy_check_name(const VmEgressPolicy *policy, const char *host,
                                            char **ret_normalised);

/* The second decision, on each address a host resolved to (or the literal itself), for @port
 * as above: a deny CIDR refuses it, an allow CIDR opens it, and otherwise a special address or
 * one of @local (a GArray of VmEgressAddress, may be NULL) is refused. Only meaningful after
 * vm_egress_policy_check_host() allowed the host. */
VmEgressVerdict vm_egress_policy_check_address(const VmEgressPolicy *policy,
                                               const VmEgressAddress *address, guint16 port,
                                               GArray *local);

/* The check of a connection asked for by a process that holds no name, only an address: hostd's
 * of what an egress worker asks it to connect to. vm_egress_policy_check_address(), and then
 * VM_EGRESS_DENY_NO_RULE unless some allow rule (of any kind) matches @port. Looser than the
 * proxy's two checks together (the name is unknown here), never looser than its address check. */
VmEgressVerdict vm_egress_policy_check_connect(const VmEgressPolicy *policy,
                                               const VmEgressAddress *address, guint16 port,
                                               GArray *local);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressPolicy, vm_egress_policy_unref)

G_END_DECLS
