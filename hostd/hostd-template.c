#include "hostd-template.h"

#include "hostd-warm.h"
#include "vm-error.h"
#include "vm-image.h"
#include "vm-name.h"

VmTemplate *
hostd_template_load(HostdContext *ctx, const char *name, GError **error)
{
    if (!vm_name_validate_template(name, error))
        return NULL;
    g_autofree char *file = g_strconcat(name, ".yaml", NULL);
    g_autofree char *path = g_build_filename(ctx->config->templates_dir, file, NULL);
    if (!g_file_test(path, G_FILE_TEST_EXISTS)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no template '%s' (see: vmctl template list)", name);
        return NULL;
    }
    return vm_template_load_file(path, error);
}

GPtrArray *
hostd_template_names(gpointer data)
{
    HostdContext *ctx = data;
    g_autoptr(GPtrArray) templates = vm_template_load_dir(ctx->config->templates_dir, NULL);
    if (templates == NULL)
        return NULL;
    GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < templates->len; i++)
        g_ptr_array_add(names, g_strdup(((const VmTemplate *)templates->pdata[i])->name));
    return names;
}

GVariant *
hostd_template_list(HostdContext *ctx, GError **error)
{
    g_autoptr(GPtrArray) templates = vm_template_load_dir(ctx->config->templates_dir, error);
    if (templates == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < templates->len; i++) {
        const VmTemplate *t = templates->pdata[i];
        g_autoptr(VmImage) image = vm_image_lookup(ctx->config->images_dir, t, NULL);
        g_auto(GVariantBuilder) e = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_variant_builder_add(&e, "{sv}", "name", g_variant_new_string(t->name));
        g_variant_builder_add(&e, "{sv}", "description",
                              g_variant_new_string(t->description ? t->description : ""));
        g_variant_builder_add(
            &e, "{sv}", "source",
            g_variant_new_string(t->source == VM_IMAGE_SOURCE_URL ? "url" : "mmdebstrap"));
        g_variant_builder_add(&e, "{sv}", "ready", g_variant_new_boolean(image != NULL));
        g_autofree char *warm = hostd_warm_state(ctx, t, image);
        g_variant_builder_add(&e, "{sv}", "warm", g_variant_new_string(warm));
        /* The warm pool: how many machines it keeps and how many wait now. */
        guint pool = t->pool_set ? t->pool : ctx->config->pool;
        guint waiting = ctx->pool_count != NULL ? ctx->pool_count(ctx, t->name) : 0;
        g_autofree char *pool_state =
            pool == 0 ? g_strdup("-") : g_strdup_printf("%u/%u", waiting, pool);
        g_variant_builder_add(&e, "{sv}", "pool", g_variant_new_uint32(pool));
        g_variant_builder_add(&e, "{sv}", "pool_ready", g_variant_new_uint32(waiting));
        g_variant_builder_add(&e, "{sv}", "pool_state", g_variant_new_string(pool_state));
        g_variant_builder_add(&e, "{sv}", "cpus", g_variant_new_uint32(t->cpus));
        g_variant_builder_add(&e, "{sv}", "memory_mib", g_variant_new_uint32(t->memory_mib));
        g_variant_builder_add(&e, "{sv}", "disk_gib", g_variant_new_uint32(t->disk_gib));
        g_variant_builder_add_value(&b, g_variant_builder_end(&e));
    }
    return g_variant_builder_end(&b);
}

/* Agents' overlays name the base image by path: rebuilding it under them would change every
 * block they have not written yet. So a forced rebuild waits until no agent uses it. */
static gboolean
hostd_template_check_unused(HostdContext *ctx, const char *template_name, GError **error)
{
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return FALSE;
    g_autoptr(GString) users = g_string_new(NULL);
    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        if (g_str_equal(r->template_name, template_name))
            g_string_append_printf(users, "%s%s", users->len > 0 ? ", " : "", r->name);
    }
    if (users->len > 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "cannot rebuild %s: agents use its image (%s); remove them first",
                        template_name, users->str);
    return TRUE;
}

char *
hostd_template_build(HostdContext *ctx, const char *name, gboolean force, VmProgressFunc progress,
                     gpointer progress_data, GError **error)
{
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, name, error);
    if (tpl == NULL)
        return NULL;
    if (force && !hostd_template_check_unused(ctx, tpl->name, error))
        return NULL;
    g_autoptr(VmImage) image =
        vm_image_ensure(ctx->config->images_dir, tpl, force, progress, progress_data, NULL, error);
    if (image == NULL)
        return NULL;

    /* The warm image: made again when forced or no longer current. A template that cannot be
     * warm, or a warm boot that fails, leaves the base image built: agents then boot. */
    g_autofree char *warm = hostd_warm_state(ctx, tpl, image);
    if (force || !g_str_equal(warm, "yes")) {
        g_autoptr(GError) warm_error = NULL;
        if (!hostd_warm_build(ctx, tpl, image, progress, progress_data, &warm_error)) {
            hostd_context_log(ctx, "template %s: no warm image: %s", tpl->name,
                              warm_error->message);
            g_autofree char *note = g_strdup_printf("no warm image: %s", warm_error->message);
            hostd_progress(progress, progress_data, note, -1);
        }
    }
    return g_strdup(image->dir);
}

char *
hostd_template_warm_state(HostdContext *ctx, const char *name)
{
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, name, NULL);
    if (tpl == NULL)
        return g_strdup("no template");
    g_autoptr(VmImage) image = vm_image_lookup(ctx->config->images_dir, tpl, NULL);
    return hostd_warm_state(ctx, tpl, image);
}
