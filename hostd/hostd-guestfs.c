#include "hostd-guestfs.h"

#include <unistd.h>

#include "vm-error.h"
#include "vm-guestfs.h"
#include "vm-spawn.h"
#include "vm-util.h"

/* An appliance start is ~12 s, much more under load and emulation: the limit only catches one
 * that hangs. */
#define HOSTD_GUESTFS_TIMEOUT_MS (30 * 60 * 1000)

char *
hostd_guestfs_helper_path(void)
{
    return vm_program_path("VM_GUESTFS_HELPER", HOSTD_GUESTFS_HELPER_BUILD,
                           HOSTD_GUESTFS_HELPER_INSTALLED);
}

/* The fixed appliance's directory, brought up to date once per hostd (supermin rebuilds it only
 * when the host's packages are newer). */
static char *
appliance_ready(HostdContext *ctx, GError **error)
{
    g_autofree char *dir = g_build_filename(ctx->config->state_dir, "guestfs-appliance", NULL);

    g_mutex_lock(&ctx->lock);
    gboolean checked = ctx->guestfs_appliance_checked;
    g_mutex_unlock(&ctx->lock);
    /* Two first calls at once both run supermin, which takes a lock of its own. */
    if (!checked && !vm_guestfs_appliance_build(dir, error))
        return NULL;
    g_mutex_lock(&ctx->lock);
    ctx->guestfs_appliance_checked = TRUE;
    g_mutex_unlock(&ctx->lock);
    return g_steal_pointer(&dir);
}

/* What fails here fails before the appliance is built or started, as in vm_guestfs_open(). */
static gboolean
images_exist(const char *const *images, GError **error)
{
    for (gsize i = 0; images[i] != NULL; i++) {
        if (!g_file_test(images[i], G_FILE_TEST_EXISTS))
            return vm_throw(error, VM_ERROR_NOT_FOUND, "no image '%s'", images[i]);
    }
    return TRUE;
}

/* The helper runs as @r's id where agents have ids (hostd is root then), else as hostd. */
static VmSpawnOptions
helper_options(HostdContext *ctx, const HostdAgentRecord *r)
{
    VmSpawnOptions options = {.timeout_ms = HOSTD_GUESTFS_TIMEOUT_MS, .exit_is_code = TRUE};

    if (ctx->agent_ids && r->agent_id != 0 && geteuid() == 0) {
        options.run_as = TRUE;
        options.uid = r->agent_id;
        options.gid = r->agent_id;
    }
    return options;
}

GPtrArray *
hostd_guestfs_diff(HostdContext *ctx, const HostdAgentRecord *r, const char *old_image,
                   const char *new_image, const char *under, gsize max_bytes,
                   gboolean *ret_truncated, GError **error)
{
    const char *images[] = {old_image, new_image, NULL};
    if (!images_exist(images, error))
        return NULL;
    g_autofree char *appliance = appliance_ready(ctx, error);
    if (appliance == NULL)
        return NULL;
    g_autofree char *helper = hostd_guestfs_helper_path();
    g_autofree char *max = g_strdup_printf("%" G_GSIZE_FORMAT, max_bytes);
    const char *argv[] = {helper, "diff", appliance, max, old_image, new_image, under, NULL};
    gsize len = 0;
    VmSpawnOptions options = helper_options(ctx, r);
    options.ret_stdout_len = &len;
    /* The paths and what each entry of the list adds, with room to spare: past it the helper is
     * not writing what it was asked to. */
    options.stdout_max = 2 * max_bytes + 64 * 1024;
    g_autofree char *out = NULL;
    if (!vm_spawn_run(argv, &options, &out, error))
        return NULL;
    return vm_guest_changes_decode(out, len, ret_truncated, error);
}

gboolean
hostd_guestfs_export(HostdContext *ctx, const HostdAgentRecord *r, const char *image,
                     const char *const *paths, int tar_fd, GError **error)
{
    const char *images[] = {image, NULL};
    if (!images_exist(images, error))
        return FALSE;
    g_autofree char *appliance = appliance_ready(ctx, error);
    if (appliance == NULL)
        return FALSE;
    g_autofree char *helper = hostd_guestfs_helper_path();
    g_autoptr(GStrvBuilder) argv = g_strv_builder_new();
    g_strv_builder_add_many(argv, helper, "export", appliance, image, NULL);
    g_strv_builder_addv(argv, (const char **)paths);
    g_auto(GStrv) args = g_strv_builder_end(argv);
    VmSpawnOptions options = helper_options(ctx, r);
    options.stdout_fd = tar_fd;
    return vm_spawn_run((const char *const *)args, &options, NULL, error);
}
