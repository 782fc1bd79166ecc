/* The marks of agents booting with nobody waiting for them (hostd-booting.h). */
#include "hostd-booting.h"

#include "vm-error.h"

/* What a request waits beyond the boot timeout: the watch's last attempt and its hooks. */
#define BOOTING_WAIT_MARGIN_S 60

guint
hostd_booting_mark(HostdContext *ctx, const char *name)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    guint generation = ++ctx->booting_generation;

    /* The generation tells an earlier boot's end, coming late, from a later boot's mark. */
    g_hash_table_insert(ctx->booting, g_strdup(name), GUINT_TO_POINTER(generation));
    return generation;
}

void
hostd_booting_done(HostdContext *ctx, const char *name, guint generation)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    gpointer mark = NULL;

    if (g_hash_table_lookup_extended(ctx->booting, name, NULL, &mark) &&
        (generation == 0 || GPOINTER_TO_UINT(mark) == generation))
        g_hash_table_remove(ctx->booting, name);
    g_cond_broadcast(&ctx->booted);
}

gboolean
hostd_booting_is(HostdContext *ctx, const char *name)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);

    return g_hash_table_contains(ctx->booting, name);
}

gboolean
hostd_booting_wait(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    gint64 deadline =
        g_get_monotonic_time() +
        (gint64)(ctx->config->boot_timeout_s + BOOTING_WAIT_MARGIN_S) * G_USEC_PER_SEC;

    while (g_hash_table_contains(ctx->booting, name)) {
        if (!g_cond_wait_until(&ctx->booted, &ctx->lock, deadline) &&
            g_hash_table_contains(ctx->booting, name))
            return vm_throw(error, VM_ERROR_TIMEOUT,
                            "agent '%s' did not finish booting within %u s", name,
                            ctx->config->boot_timeout_s);
    }
    return TRUE;
}
