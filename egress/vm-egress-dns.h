/* The egress proxy's resolver: DNS over TCP from the guest, answered from the agent's policy.
 *
 * A guest program that ignores proxy settings resolves a name itself and connects to what it
 * got. The proxy's resolver answers an allowed name that really resolves with an address that
 * stands for the name within this proxy: one of the synthetic range VM_EGRESS_DNS_NET/16, one per
 * name for the life of the table (a bounded table, the least recently used name forgotten
 * first). A CONNECT to such an address is then taken as a CONNECT to the name it stands for
 * (vm-egress-proxy.c): the name is decided, resolved, checked and intercepted exactly as when a
 * proxy-aware client names it, so the synthetic address grants nothing by itself. A denied name
 * gets NXDOMAIN. Queries are parsed with glibc's libresolv (ns_initparse(), ns_parserr()); the
 * answers are built here from the checked question.
 */
#pragma once

#include <glib.h>

#include "vm-egress-policy.h"

G_BEGIN_DECLS

/* The synthetic range: 100.100.0.0/16, inside the shared address space 100.64.0.0/10 that the
 * address check refuses anyway, so no real destination a policy would open is shadowed unless a
 * CIDR rule opens it on purpose (docs/EGRESS.md). Its first and last address are never used. */
#define VM_EGRESS_DNS_NET         "100.100.0.0"
#define VM_EGRESS_DNS_NET_PREFIX  16
#define VM_EGRESS_DNS_MAX_NAMES   4096 /* the default table bound */
#define VM_EGRESS_DNS_TTL         30   /* seconds; the answers' TTL */
#define VM_EGRESS_DNS_MESSAGE_MAX 4096 /* a query or answer, without its 2-byte TCP length */

typedef struct _VmEgressDnsTable VmEgressDnsTable;

/* A table of at most @max_names names (0: VM_EGRESS_DNS_MAX_NAMES; at most 65534, the range's
 * size). Thread-safe. Can't fail. */
VmEgressDnsTable *vm_egress_dns_table_new(guint max_names);

/* NULL is accepted. */
void vm_egress_dns_table_free(VmEgressDnsTable *table);

/* The address that stands for the normalised name @name: the one it already has, else a fresh
 * one (the table's least recently used name is forgotten when it is full). An address is given
 * again only after every other one of the range was, so a forgotten name's address does not
 * soon stand for another. Can't fail. */
void vm_egress_dns_table_assign(VmEgressDnsTable *table, const char *name,
                                VmEgressAddress *ret_address);

/* The name @address stands for (newly allocated), or NULL when no name has it now. Can't
 * fail. */
char *vm_egress_dns_table_lookup(VmEgressDnsTable *table, const VmEgressAddress *address);

/* How many names the table holds. Can't fail. */
guint vm_egress_dns_table_size(VmEgressDnsTable *table);

/* Whether @address lies in the synthetic range. Can't fail. */
gboolean vm_egress_dns_address_is_synthetic(const VmEgressAddress *address);

typedef enum {
    VM_EGRESS_DNS_NAME_ALLOWED,  /* allowed and resolves: gets its synthetic address */
    VM_EGRESS_DNS_NAME_DENIED,   /* the policy refuses it (or it is no valid name) */
    VM_EGRESS_DNS_NAME_NOT_FOUND /* allowed, but does not resolve */
} VmEgressDnsVerdict;

/* Decides on the name of a query (in presentation form, as libresolv gives it, not yet
 * normalised); with VM_EGRESS_DNS_NAME_ALLOWED stores the normalised name in @ret_name. */
typedef VmEgressDnsVerdict (*VmEgressDnsDecideFunc)(const char *name, gpointer user_data,
                                                    char **ret_name);

/* What one query was and how it was answered, for the log. */
typedef struct {
    char *name;                 /* the question's name (NULL for a malformed query) */
    guint16 type;               /* its type (1: A, 28: AAAA, ...) */
    gboolean decided;           /* @verdict holds the decision on @name */
    VmEgressDnsVerdict verdict; /* with @decided */
    int rcode;                  /* of the answer */
} VmEgressDnsResult;

void vm_egress_dns_result_clear(VmEgressDnsResult *result);

/* Answers the DNS message @query (@len bytes, without the TCP length): an A query for a name that
 * @decide allows gets one A record with the name's address from @table (TTL VM_EGRESS_DNS_TTL);
 * AAAA and every other type of such a name get an empty NOERROR answer; a denied or nonexistent
 * name NXDOMAIN; another class REFUSED; another opcode NOTIMP; a response, several questions or
 * anything libresolv does not parse FORMERR. Returns the answer, or NULL when @query is too short
 * to answer at all (less than a header, or more than VM_EGRESS_DNS_MESSAGE_MAX): the connection
 * is then closed. @ret_result says what happened. Can't fail otherwise. */
GBytes *vm_egress_dns_answer(VmEgressDnsTable *table, const guint8 *query, gsize len,
                             VmEgressDnsDecideFunc decide, gpointer decide_data,
                             VmEgressDnsResult *ret_result);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmEgressDnsTable, vm_egress_dns_table_free)
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(VmEgressDnsResult, vm_egress_dns_result_clear)

G_END_DECLS
