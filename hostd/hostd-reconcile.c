#include "hostd-reconcile.h"

#include "hostd-agent.h"
#include "vm-error.h"
#include "vm-fs.h"

/* Defines agent @name's domain again from the XML hostd saved (libvirt lost it: another embed
 * root, a wiped libvirt dir). Returns the domain, or NULL with a note saying why not. */
static virDomainPtr
hostd_reconcile_redefine(HostdContext *ctx, const char *name, const char *dir, GPtrArray *notes)
{
    g_autofree char *xml_path = g_build_filename(dir, HOSTD_AGENT_DOMAIN_XML, NULL);
    g_autofree char *xml = NULL;
    if (!g_file_get_contents(xml_path, &xml, NULL, NULL)) {
        g_ptr_array_add(notes, g_strdup_printf("agent '%s' has no domain and no saved XML", name));
        return NULL;
    }
    virDomainPtr defined = virDomainDefineXML(ctx->lv->conn, xml);
    if (defined == NULL) {
        g_autoptr(GError) define_error = NULL;
        hostd_libvirt_throw(&define_error, "cannot redefine");
        g_ptr_array_add(notes, g_strdup_printf("agent '%s': %s", name, define_error->message));
        return NULL;
    }
    g_ptr_array_add(notes, g_strdup_printf("redefined the domain of agent '%s' (stopped)", name));
    return defined;
}

gboolean
hostd_reconcile(HostdContext *ctx, GPtrArray *notes, GError **error)
{
    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return FALSE;

    for (guint i = 0; i < names->len; i++) {
        const char *name = names->pdata[i];
        g_autofree char *dir = hostd_agent_dir(ctx, name);
        g_autoptr(GError) local_error = NULL;
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, &local_error);

        if (r == NULL) {
            g_autofree char *record = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
            if (!g_file_test(record, G_FILE_TEST_EXISTS)) {
                /* No record: an `rm` that was interrupted after removing it, or a `new`
                 * that died before writing it; either way nothing here is an agent. */
                hostd_libvirt_remove(ctx->lv, name, NULL);
                vm_remove_tree(dir, NULL);
                g_ptr_array_add(notes, g_strdup_printf("removed leftovers of '%s'", name));
            } else {
                g_ptr_array_add(
                    notes, g_strdup_printf("skipping agent '%s': %s", name, local_error->message));
            }
            continue;
        }
        hostd_libvirt_alias_set(ctx->lv, name, r->domain);
        if (g_str_equal(r->phase, HOSTD_PHASE_CREATING)) {
            hostd_agent_rollback(ctx, name, dir);
            g_ptr_array_add(notes,
                            g_strdup_printf("rolled back unfinished creation of '%s'", name));
            continue;
        }
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
        if (dom != NULL)
            g_ptr_array_add(
                notes, g_strdup_printf("agent '%s' is %s", name, hostd_libvirt_state_name(dom)));
        else
            dom = hostd_reconcile_redefine(ctx, name, dir, notes);
        /* Components repair their part once the domain is back, as they would at the next
         * start-up: a journal left by a killed checkpoint operation is finished now. */
        for (guint c = 0; c < ctx->components->len; c++) {
            const HostdComponent *component = ctx->components->pdata[c];
            if (component->agent_reconcile != NULL)
                component->agent_reconcile(ctx, r, dom, notes);
        }
    }
    return TRUE;
}
