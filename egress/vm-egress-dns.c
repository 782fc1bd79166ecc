/* The egress proxy's resolver: the table of synthetic addresses and the answers. */
#include "vm-egress-dns.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netinet/in.h>
#include <resolv.h>
#include <string.h>

#define RANGE_SIZE 65536u /* addresses in VM_EGRESS_DNS_NET/16 */
#define HEADER_LEN NS_HFIXEDSZ

typedef struct {
    char *name;
    guint32 index; /* the address: VM_EGRESS_DNS_NET + index, 1..RANGE_SIZE-2 */
    GList link;    /* in VmEgressDnsTable.order, data the entry */
} Entry;

struct _VmEgressDnsTable {
    GMutex lock;
    GHashTable *by_name;  /* name -> Entry, owns the entries */
    GHashTable *by_index; /* index -> Entry */
    GQueue order;         /* least recently used first */
    guint max;
    guint32 next; /* the next index to try */
    guint32 base; /* VM_EGRESS_DNS_NET, host order */
};

static void
entry_free(gpointer data)
{
    Entry *entry = data;

    g_free(entry->name);
    g_free(entry);
}

VmEgressDnsTable *
vm_egress_dns_table_new(guint max_names)
{
    VmEgressDnsTable *table = g_new0(VmEgressDnsTable, 1);
    struct in_addr net;

    g_mutex_init(&table->lock);
    table->by_name = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, entry_free);
    table->by_index = g_hash_table_new(g_direct_hash, g_direct_equal);
    g_queue_init(&table->order);
    table->max = max_names == 0 ? VM_EGRESS_DNS_MAX_NAMES : MIN(max_names, RANGE_SIZE - 2);
    table->next = 1;
    (void)inet_pton(AF_INET, VM_EGRESS_DNS_NET, &net);
    table->base = ntohl(net.s_addr);
    return table;
}

void
vm_egress_dns_table_free(VmEgressDnsTable *table)
{
    if (table == NULL)
        return;
    g_hash_table_destroy(table->by_index);
    g_hash_table_destroy(table->by_name);
    g_mutex_clear(&table->lock);
    g_free(table);
}

static void
table_address(const VmEgressDnsTable *table, guint32 index, VmEgressAddress *ret_address)
{
    guint32 be = htonl(table->base + index);

    memset(ret_address, 0, sizeof(*ret_address));
    ret_address->family = AF_INET;
    memcpy(ret_address->bytes, &be, 4);
}

static void
table_forget_locked(VmEgressDnsTable *table, Entry *entry)
{
    g_queue_unlink(&table->order, &entry->link);
    g_hash_table_remove(table->by_index, GUINT_TO_POINTER(entry->index));
    g_hash_table_remove(table->by_name, entry->name);
}

void
vm_egress_dns_table_assign(VmEgressDnsTable *table, const char *name, VmEgressAddress *ret_address)
{
    Entry *entry;

    g_mutex_lock(&table->lock);
    entry = g_hash_table_lookup(table->by_name, name);
    if (entry != NULL) {
        g_queue_unlink(&table->order, &entry->link);
    } else {
        if (g_hash_table_size(table->by_name) >= table->max)
            table_forget_locked(table, table->order.head->data);
        /* The table holds fewer names than the range has addresses: a free one comes. */
        while (g_hash_table_contains(table->by_index, GUINT_TO_POINTER(table->next)))
            table->next = table->next % (RANGE_SIZE - 2) + 1;
        entry = g_new0(Entry, 1);
        entry->name = g_strdup(name);
        entry->index = table->next;
        entry->link.data = entry;
        table->next = table->next % (RANGE_SIZE - 2) + 1;
        g_hash_table_insert(table->by_name, entry->name, entry);
        g_hash_table_insert(table->by_index, GUINT_TO_POINTER(entry->index), entry);
    }
    g_queue_push_tail_link(&table->order, &entry->link);
    table_address(table, entry->index, ret_address);
    g_mutex_unlock(&table->lock);
}

gboolean
vm_egress_dns_address_is_synthetic(const VmEgressAddress *address)
{
    struct in_addr net;
    guint32 host;

    if (address->family != AF_INET)
        return FALSE;
    (void)inet_pton(AF_INET, VM_EGRESS_DNS_NET, &net);
    memcpy(&host, address->bytes, 4);
    return (ntohl(host) >> (32 - VM_EGRESS_DNS_NET_PREFIX)) ==
           (ntohl(net.s_addr) >> (32 - VM_EGRESS_DNS_NET_PREFIX));
}

char *
vm_egress_dns_table_lookup(VmEgressDnsTable *table, const VmEgressAddress *address)
{
    guint32 host;
    Entry *entry;
    char *name = NULL;

    if (!vm_egress_dns_address_is_synthetic(address))
        return NULL;
    memcpy(&host, address->bytes, 4);
    g_mutex_lock(&table->lock);
    entry = g_hash_table_lookup(table->by_index, GUINT_TO_POINTER(ntohl(host) - table->base));
    if (entry != NULL) {
        name = g_strdup(entry->name);
        g_queue_unlink(&table->order, &entry->link);
        g_queue_push_tail_link(&table->order, &entry->link);
    }
    g_mutex_unlock(&table->lock);
    return name;
}

guint
vm_egress_dns_table_size(VmEgressDnsTable *table)
{
    guint n;

    g_mutex_lock(&table->lock);
    n = g_hash_table_size(table->by_name);
    g_mutex_unlock(&table->lock);
    return n;
}

void
vm_egress_dns_result_clear(VmEgressDnsResult *result)
{
    g_clear_pointer(&result->name, g_free);
}

/* ---------------------------------------------------------------------------------------------
 * Answers */

static void
put16(GByteArray *out, guint16 value)
{
    guint8 bytes[2] = {value >> 8, value & 0xff};

    g_byte_array_append(out, bytes, 2);
}

/* A header: the query's id, opcode and RD, QR and RA set, @rcode; @qd and @an records. */
static void
answer_header(GByteArray *out, const guint8 *query, int rcode, guint16 qd, guint16 an)
{
    guint8 flags0 = (guint8)(0x80 | (query[2] & 0x79)); /* QR, opcode, RD kept; AA, TC clear */

    g_byte_array_append(out, query, 2);
    g_byte_array_append(out, &flags0, 1);
    g_byte_array_append(out, (const guint8[]){(guint8)(0x80 | (rcode & 0x0f))}, 1);
    put16(out, qd);
    put16(out, an);
    put16(out, 0);
    put16(out, 0);
}

static GBytes *
answer_bare(const guint8 *query, int rcode)
{
    GByteArray *out = g_byte_array_sized_new(HEADER_LEN);

    answer_header(out, query, rcode, 0, 0);
    return g_byte_array_free_to_bytes(out);
}

GBytes *
vm_egress_dns_answer(VmEgressDnsTable *table, const guint8 *query, gsize len,
                     VmEgressDnsDecideFunc decide, gpointer decide_data,
                     VmEgressDnsResult *ret_result)
{
    g_autoptr(GByteArray) out = NULL;
    g_autofree char *allowed = NULL;
    guint8 name_wire[NS_MAXCDNAME];
    ns_msg msg;
    ns_rr rr;
    int name_len, rcode = ns_r_noerror;
    guint16 an = 0;

    memset(ret_result, 0, sizeof(*ret_result));
    if (len < HEADER_LEN || len > VM_EGRESS_DNS_MESSAGE_MAX)
        return NULL;
    ret_result->rcode = ns_r_formerr;
    if (ns_initparse(query, (int)len, &msg) < 0 || ns_msg_getflag(msg, ns_f_qr))
        return answer_bare(query, ns_r_formerr);
    if (ns_msg_getflag(msg, ns_f_opcode) != ns_o_query) {
        ret_result->rcode = ns_r_notimpl;
        return answer_bare(query, ns_r_notimpl);
    }
    if (ns_msg_count(msg, ns_s_qd) != 1 || ns_msg_count(msg, ns_s_an) != 0 ||
        ns_msg_count(msg, ns_s_ns) != 0 || ns_parserr(&msg, ns_s_qd, 0, &rr) < 0)
        return answer_bare(query, ns_r_formerr);
    /* The question is written anew from what libresolv read, never copied from the guest. */
    name_len = dn_comp(ns_rr_name(rr), name_wire, sizeof(name_wire), NULL, NULL);
    if (name_len < 0)
        return answer_bare(query, ns_r_formerr);
    ret_result->name = g_strdup(ns_rr_name(rr));
    ret_result->type = ns_rr_type(rr);

    if (ns_rr_class(rr) != ns_c_in) {
        rcode = ns_r_refused;
    } else {
        ret_result->verdict = decide(ret_result->name, decide_data, &allowed);
        ret_result->decided = TRUE;
        if (ret_result->verdict != VM_EGRESS_DNS_NAME_ALLOWED)
            rcode = ns_r_nxdomain;
        else if (ns_rr_type(rr) == ns_t_a || ns_rr_type(rr) == ns_t_any)
            an = 1;
    }
    ret_result->rcode = rcode;
    out = g_byte_array_sized_new(HEADER_LEN + name_len + 4 + 16);
    answer_header(out, query, rcode, 1, an);
    g_byte_array_append(out, name_wire, name_len);
    put16(out, ns_rr_type(rr));
    put16(out, ns_rr_class(rr));
    if (an == 1) {
        VmEgressAddress address;

        vm_egress_dns_table_assign(table, allowed, &address);
        put16(out, 0xc000 | HEADER_LEN); /* the name: a pointer to the question's */
        put16(out, ns_t_a);
        put16(out, ns_c_in);
        put16(out, 0);
        put16(out, VM_EGRESS_DNS_TTL);
        put16(out, 4);
        g_byte_array_append(out, address.bytes, 4);
    }
    return g_byte_array_free_to_bytes(g_steal_pointer(&out));
}
