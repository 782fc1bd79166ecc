#include "vm-domain-read.h"

#include "vm-domain.h"
#include "vm-error.h"

#include <libxml/parser.h>
#include <libxml/xpath.h>
#include <libxml/xpathInternals.h>
#include <string.h>

G_DEFINE_AUTOPTR_CLEANUP_FUNC(xmlDoc, xmlFreeDoc)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(xmlParserCtxt, xmlFreeParserCtxt)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(xmlXPathContext, xmlXPathFreeContext)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(xmlXPathObject, xmlXPathFreeObject)

/* Stops the parse at "<!DOCTYPE", before any declaration in it is read: entities (internal ones
 * can multiply a document a billion times, external ones read files) have no business in what
 * libvirt writes. */
static void
domain_read_refuse_doctype(void *user_data, const xmlChar *name, const xmlChar *external_id,
                           const xmlChar *system_id)
{
    xmlStopParser(user_data);
}

/* Parses @xml and checks that its root is <@root>. */
static xmlDoc *
domain_read_parse(const char *xml, const char *root, GError **error)
{
    static gsize initialized;
    g_autoptr(xmlParserCtxt) ctxt = NULL;
    g_autoptr(xmlDoc) doc = NULL;
    gsize len = strnlen(xml, VM_DOMAIN_READ_MAX + 1);
    xmlNode *top;

    /* libxml2 2.9 initializes its globals on first use without a lock. */
    if (g_once_init_enter(&initialized)) {
        xmlInitParser();
        g_once_init_leave(&initialized, 1);
    }
    if (len > VM_DOMAIN_READ_MAX)
        return vm_throw(error, VM_ERROR_FAILED, "<%s> XML of more than %d bytes", root,
                        VM_DOMAIN_READ_MAX),
               NULL;
    ctxt = xmlNewParserCtxt();
    if (ctxt == NULL)
        g_error("out of memory");
    ctxt->sax->internalSubset = domain_read_refuse_doctype;
    doc = xmlCtxtReadMemory(ctxt, xml, (int)len, NULL, NULL,
                            XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
    /* Nothing else stops a parse. */
    if (ctxt->errNo == XML_ERR_USER_STOP)
        return vm_throw(error, VM_ERROR_FAILED, "<%s> XML with a document type declaration", root),
               NULL;
    if (doc == NULL) {
        const xmlError *e = xmlCtxtGetLastError(ctxt);
        g_autofree char *message = g_strdup(e != NULL && e->message != NULL ? e->message : "?");
        return vm_throw(error, VM_ERROR_FAILED, "<%s> XML not well-formed: line %d: %s", root,
                        e != NULL ? e->line : 0, g_strstrip(message)),
               NULL;
    }
    top = xmlDocGetRootElement(doc);
    if (top == NULL || top->ns != NULL || !g_str_equal((const char *)top->name, root))
        return vm_throw(error, VM_ERROR_FAILED, "XML whose root is not <%s>", root), NULL;
    return g_steal_pointer(&doc);
}

/* The nodes @path selects in @doc, where "qemu:" is VM_DOMAIN_QEMU_NS, in document order. */
static xmlXPathObject *
domain_read_eval(xmlDoc *doc, const char *path)
{
    g_autoptr(xmlXPathContext) xpath = xmlXPathNewContext(doc);
    xmlXPathObject *result;

    if (xpath == NULL)
        g_error("out of memory");
    xmlXPathRegisterNs(xpath, BAD_CAST "qemu", BAD_CAST VM_DOMAIN_QEMU_NS);
    result = xmlXPathEvalExpression(BAD_CAST path, xpath);
    /* The paths are this file's constants: one that does not compile is a bug. */
    g_assert(result != NULL);
    return result;
}

static int
domain_read_count(const xmlXPathObject *result)
{
    return result->nodesetval != NULL ? result->nodesetval->nodeNr : 0;
}

/* The text of an element or the value of an attribute, newly allocated. */
static char *
domain_read_text(xmlNode *node)
{
    xmlChar *value = xmlNodeGetContent(node);
    char *text = g_strdup(value != NULL ? (const char *)value : "");

    xmlFree(value);
    return text;
}

/* The string values of the nodes @path selects in @doc, in document order. */
static GPtrArray *
domain_read_select(xmlDoc *doc, const char *path)
{
    g_autoptr(xmlXPathObject) result = domain_read_eval(doc, path);
    GPtrArray *values = g_ptr_array_new_with_free_func(g_free);

    for (int i = 0; i < domain_read_count(result); i++)
        g_ptr_array_add(values, domain_read_text(result->nodesetval->nodeTab[i]));
    return values;
}

static GStrv
domain_read_strv(GPtrArray *values)
{
    g_ptr_array_add(values, NULL);
    return (GStrv)g_ptr_array_free(values, FALSE);
}

GStrv
vm_domain_read_disk_files(const char *xml, GError **error)
{
    g_autoptr(xmlDoc) doc = NULL;

    g_return_val_if_fail(xml != NULL, NULL);

    doc = domain_read_parse(xml, "domain", error);
    if (doc == NULL)
        return NULL;
    return domain_read_strv(domain_read_select(doc, "/domain/devices/disk/source/@file"));
}

GStrv
vm_domain_read_disk_chain(const char *xml, GError **error)
{
    g_autoptr(xmlDoc) doc = NULL;

    g_return_val_if_fail(xml != NULL, NULL);

    doc = domain_read_parse(xml, "domain", error);
    if (doc == NULL)
        return NULL;
    /* A union comes back in document order, which is the chain's order: each <backingStore>
     * is inside the one above it. */
    return domain_read_strv(domain_read_select(
        doc, "/domain/devices/disk[target/@dev='vda']/source/@file | "
             "/domain/devices/disk[target/@dev='vda']//backingStore/source/@file"));
}

char *
vm_domain_read_genid(const char *xml, GError **error)
{
    g_return_val_if_fail(xml != NULL, NULL);

    g_autoptr(xmlDoc) doc = domain_read_parse(xml, "domain", error);
    if (doc == NULL)
        return NULL;
    g_autoptr(GPtrArray) values = domain_read_select(doc, "/domain/genid");
    return values->len > 0 ? g_strdup(values->pdata[0]) : NULL;
}

/* @text, a whole number in [1, G_MAXUINT64], or 0. */
static guint64
domain_read_number(const char *text)
{
    guint64 n = 0;

    return text != NULL && g_ascii_string_to_unsigned(text, 10, 1, G_MAXUINT64, &n, NULL) ? n : 0;
}

gboolean
vm_domain_read_sizes(const char *xml, guint *ret_cpus, guint *ret_memory_mib, GError **error)
{
    static const struct {
        const char *unit;
        guint64 bytes;
    } units[] = {
        {"b", 1},
        {"bytes", 1},
        {"k", 1024},
        {"KiB", 1024},
        {"m", 1024 * 1024},
        {"MiB", 1024 * 1024},
        {"g", 1024 * 1024 * 1024},
        {"GiB", 1024 * 1024 * 1024},
    };

    g_return_val_if_fail(xml != NULL, FALSE);

    g_autoptr(xmlDoc) doc = domain_read_parse(xml, "domain", error);
    if (doc == NULL)
        return FALSE;
    g_autoptr(GPtrArray) vcpus = domain_read_select(doc, "/domain/vcpu");
    g_autoptr(GPtrArray) memory = domain_read_select(doc, "/domain/memory");
    g_autoptr(GPtrArray) unit = domain_read_select(doc, "/domain/memory/@unit");
    guint64 cpus = vcpus->len == 1 ? domain_read_number(vcpus->pdata[0]) : 0;
    guint64 amount = memory->len == 1 ? domain_read_number(memory->pdata[0]) : 0;
    const char *unit_name = unit->len == 1 ? unit->pdata[0] : "KiB";
    guint64 scale = 0;

    for (gsize i = 0; i < G_N_ELEMENTS(units); i++) {
        if (strcmp(unit_name, units[i].unit) == 0)
            scale = units[i].bytes;
    }
    if (cpus == 0 || cpus > G_MAXUINT || amount == 0 || scale == 0 ||
        amount > G_MAXUINT64 / scale || amount * scale / (1024 * 1024) == 0 ||
        amount * scale / (1024 * 1024) > G_MAXUINT)
        return vm_throw(error, VM_ERROR_NOT_FOUND,
                        "the domain XML has no CPU count or memory size");
    *ret_cpus = (guint)cpus;
    *ret_memory_mib = (guint)(amount * scale / (1024 * 1024));
    return TRUE;
}

char *
vm_domain_read_ssh_channel(const char *xml, GError **error)
{
    g_return_val_if_fail(xml != NULL, NULL);

    g_autoptr(xmlDoc) doc = domain_read_parse(xml, "domain", error);
    if (doc == NULL)
        return NULL;
    g_autoptr(GPtrArray) values = domain_read_select(
        doc, "/domain/devices/channel[@type='unix']"
             "[target/@type='virtio' and target/@name='" VM_DOMAIN_SSH_CHANNEL "']/source/@path");
    return values->len > 0 ? g_strdup(values->pdata[0]) : NULL;
}

GStrv
vm_domain_read_qemu_args(const char *xml, GError **error)
{
    g_autoptr(xmlDoc) doc = NULL;

    g_return_val_if_fail(xml != NULL, NULL);

    doc = domain_read_parse(xml, "domain", error);
    if (doc == NULL)
        return NULL;
    return domain_read_strv(domain_read_select(doc, "/domain/qemu:commandline/qemu:arg/@value"));
}

GStrv
vm_qemu_opts_split(const char *opts)
{
    g_autoptr(GPtrArray) parts = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GString) part = g_string_new(NULL);

    g_return_val_if_fail(opts != NULL, NULL);

    for (const char *p = opts; *p != '\0'; p++) {
        if (*p != ',') {
            g_string_append_c(part, *p);
        } else if (p[1] == ',') {
            g_string_append_c(part, ',');
            p++;
        } else {
            g_ptr_array_add(parts, g_strdup(part->str));
            g_string_truncate(part, 0);
        }
    }
    g_ptr_array_add(parts, g_strdup(part->str));
    return domain_read_strv(g_steal_pointer(&parts));
}

GStrv
vm_domain_read_guestfwds(const char *xml, GError **error)
{
    g_auto(GStrv) args = vm_domain_read_qemu_args(xml, error);
    GPtrArray *rules;

    if (args == NULL)
        return NULL;
    rules = g_ptr_array_new_with_free_func(g_free);
    for (gsize i = 0; args[i] != NULL && args[i + 1] != NULL; i++) {
        if (!g_str_equal(args[i], "-netdev") && !g_str_equal(args[i], "--netdev"))
            continue;
        g_auto(GStrv) opts = vm_qemu_opts_split(args[++i]);
        for (gsize j = 0; opts[j] != NULL; j++) {
            if (g_str_has_prefix(opts[j], "guestfwd="))
                g_ptr_array_add(rules, g_strdup(opts[j] + strlen("guestfwd=")));
        }
    }
    return domain_read_strv(rules);
}

/* One "+ID" of a DAC label: a number, not a name. */
static gboolean
domain_read_dac_id(const char *text, guint *ret_id)
{
    guint64 id;

    if (text[0] != '+' || !g_ascii_isdigit(text[1]))
        return FALSE;
    /* (uid_t)-1 means "unchanged" to chown(), never a user. */
    if (!g_ascii_string_to_unsigned(text + 1, 10, 0, G_MAXUINT32 - 1, &id, NULL))
        return FALSE;
    *ret_id = (guint)id;
    return TRUE;
}

gboolean
vm_capabilities_read_dac_owner(const char *caps, const char *virt_type, guint *ret_uid,
                               guint *ret_gid, GError **error)
{
    g_autoptr(xmlDoc) doc = NULL;
    g_autoptr(xmlXPathObject) labels = NULL;

    g_return_val_if_fail(caps != NULL && virt_type != NULL, FALSE);

    doc = domain_read_parse(caps, "capabilities", error);
    if (doc == NULL)
        return FALSE;
    labels = domain_read_eval(doc, "/capabilities/host/secmodel[model='dac']/baselabel");
    for (int i = 0; i < domain_read_count(labels); i++) {
        xmlNode *label = labels->nodesetval->nodeTab[i];
        xmlChar *type = xmlGetNoNsProp(label, BAD_CAST "type");
        gboolean match = type != NULL && g_str_equal((const char *)type, virt_type);
        g_autofree char *text = NULL;
        g_auto(GStrv) ids = NULL;
        guint uid, gid;

        xmlFree(type);
        if (!match)
            continue;
        text = domain_read_text(label);
        ids = g_strsplit(text, ":", -1);
        if (g_strv_length(ids) != 2 || !domain_read_dac_id(ids[0], &uid) ||
            !domain_read_dac_id(ids[1], &gid))
            return vm_throw(error, VM_ERROR_NOT_FOUND, "DAC base label '%s' is not +UID:+GID",
                            text);
        *ret_uid = uid;
        *ret_gid = gid;
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_NOT_FOUND, "no DAC base label for '%s' domains", virt_type);
}
