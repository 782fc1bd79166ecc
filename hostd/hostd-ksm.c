#include "hostd-ksm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "hostd-memory.h"

/* The longest KSM sysfs value read: one number. */
#define KSM_VALUE_MAX 64
/* run: 0 stop, 1 run, 2 stop and unmerge every page. */
#define KSM_RUN_MAX 2

struct _HostdKsm {
    GMutex lock; /* guards all below */
    char *root;
    HostdKsmMode mode;
    gboolean touched; /* run was written by this controller: prior holds what it was before */
    guint64 prior;
    int running;       /* what `auto` was last told: -1 nothing yet, 0 or 1 */
    gboolean reported; /* a failure was said: later ones are not */
    /* hostd_ksm_start()'s following of the agents: */
    HostdContext *ctx;
    int lifecycle_id; /* -1: none */
    guint timeout_id; /* 0: none */
};

gboolean
hostd_ksm_mode_parse(const char *text, HostdKsmMode *ret_mode)
{
    if (g_strcmp0(text, "auto") == 0)
        *ret_mode = HOSTD_KSM_AUTO;
    else if (g_strcmp0(text, "on") == 0)
        *ret_mode = HOSTD_KSM_ON;
    else if (g_strcmp0(text, "off") == 0)
        *ret_mode = HOSTD_KSM_OFF;
    else
        return FALSE;
    return TRUE;
}

const char *
hostd_ksm_mode_name(HostdKsmMode mode)
{
    switch (mode) {
    case HOSTD_KSM_ON:
        return "on";
    case HOSTD_KSM_OFF:
        return "off";
    case HOSTD_KSM_AUTO:
    default:
        return "auto";
    }
}

HostdKsm *
hostd_ksm_new(const char *root, HostdKsmMode mode)
{
    HostdKsm *ksm = g_new0(HostdKsm, 1);

    g_mutex_init(&ksm->lock);
    ksm->root = g_strdup(root);
    ksm->mode = mode;
    ksm->running = -1;
    ksm->lifecycle_id = -1;
    return ksm;
}

void
hostd_ksm_free(HostdKsm *ksm)
{
    if (ksm == NULL)
        return;
    g_mutex_clear(&ksm->lock);
    g_free(ksm->root);
    g_free(ksm);
}

/* The number in file @name under the root, at most @max; FALSE when it cannot be had, with why
 * in *@ret_why when not NULL. */
static gboolean
ksm_read(HostdKsm *ksm, const char *name, guint64 max, guint64 *ret_value, char **ret_why)
{
    g_autofree char *path = g_build_filename(ksm->root, name, NULL);
    g_autofree char *text = hostd_memory_read_file(path, KSM_VALUE_MAX, NULL);

    if (text == NULL) {
        if (ret_why != NULL)
            *ret_why = g_strdup_printf("cannot read %s (%s)", name, g_strerror(errno));
        return FALSE;
    }
    if (!hostd_memory_parse_number(text, max, ret_value)) {
        if (ret_why != NULL)
            *ret_why = g_strdup_printf("%s holds no number up to %" G_GUINT64_FORMAT, name, max);
        return FALSE;
    }
    return TRUE;
}

/* Writes @value to run; errno says why not on FALSE. */
static gboolean
ksm_write_run(HostdKsm *ksm, guint64 value)
{
    g_autofree char *path = g_build_filename(ksm->root, "run", NULL);
    char text[8];
    int len = g_snprintf(text, sizeof(text), "%u\n", (guint)value);
    /* O_TRUNC for a test's plain file; sysfs ignores it. No O_CREAT: a kernel without KSM has
     * no file, and none is made. */
    int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOCTTY);
    ssize_t n;
    int saved;

    if (fd < 0)
        return FALSE;
    do {
        n = write(fd, text, (size_t)len);
    } while (n < 0 && errno == EINTR);
    saved = errno;
    if (close(fd) < 0 && n == len) {
        n = -1;
        saved = errno;
    }
    errno = n == len ? 0 : (n < 0 ? saved : EIO);
    return n == len;
}

/* A failure, said the first time only (the reason in words). */
static char *
ksm_failed(HostdKsm *ksm, const char *what)
{
    if (ksm->reported)
        return NULL;
    ksm->reported = TRUE;
    return g_strdup_printf("ksm = %s: %s under %s; going on without it",
                           hostd_ksm_mode_name(ksm->mode), what, ksm->root);
}

/* run=1 unless it is already; the first write remembers what it was. Lock held. */
static char *
ksm_turn_on(HostdKsm *ksm, const char *why)
{
    g_autofree char *why_not = NULL;
    guint64 run = 0;

    if (!ksm_read(ksm, "run", KSM_RUN_MAX, &run, &why_not))
        return ksm_failed(ksm, why_not);
    if (run == 1)
        return NULL;
    if (!ksm_write_run(ksm, 1)) {
        g_autofree char *what = g_strdup_printf("cannot write run (%s)", g_strerror(errno));
        return ksm_failed(ksm, what);
    }
    if (!ksm->touched) {
        ksm->touched = TRUE;
        ksm->prior = run;
    }
    return g_strdup_printf("KSM on (run was %u): %s", (guint)run, why);
}

/* run back to what it was before this controller first wrote it. Lock held. */
static char *
ksm_put_back(HostdKsm *ksm, const char *why)
{
    guint64 run = 0;

    if (!ksm->touched)
        return NULL;
    ksm->touched = FALSE;
    if (ksm_read(ksm, "run", KSM_RUN_MAX, &run, NULL) && run == ksm->prior)
        return NULL;
    if (!ksm_write_run(ksm, ksm->prior)) {
        g_autofree char *what =
            g_strdup_printf("cannot put run back to %u (%s)", (guint)ksm->prior, g_strerror(errno));
        return ksm_failed(ksm, what);
    }
    return g_strdup_printf("KSM run put back to %u: %s", (guint)ksm->prior, why);
}

char *
hostd_ksm_begin(HostdKsm *ksm)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ksm->lock);

    if (ksm->mode != HOSTD_KSM_ON)
        return NULL;
    return ksm_turn_on(ksm, "ksm = on");
}

char *
hostd_ksm_agents_running(HostdKsm *ksm, gboolean running)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ksm->lock);

    if (ksm->mode != HOSTD_KSM_AUTO || ksm->running == (running ? 1 : 0))
        return NULL;
    ksm->running = running ? 1 : 0;
    if (running)
        return ksm_turn_on(ksm, "agents run (ksm = auto)");
    return ksm_put_back(ksm, "no agent runs (ksm = auto)");
}

char *
hostd_ksm_restore(HostdKsm *ksm)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ksm->lock);

    return ksm_put_back(ksm, "hostd is stopping");
}

GVariant *
hostd_ksm_figures(HostdKsm *ksm)
{
    static const char *const run_names[] = {"stopped", "running", "unmerging"};
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    guint64 page = (guint64)sysconf(_SC_PAGESIZE);
    guint64 pages_max = (HOSTD_MEMORY_KIB_MAX * 1024) / page;
    guint64 run = 0, shared = 0, sharing = 0;
    gint64 profit = 0;

    g_variant_builder_add(&b, "{sv}", "mode", g_variant_new_string(hostd_ksm_mode_name(ksm->mode)));
    if (ksm_read(ksm, "run", KSM_RUN_MAX, &run, NULL))
        g_variant_builder_add(&b, "{sv}", "run", g_variant_new_string(run_names[run]));
    if (ksm_read(ksm, "pages_shared", pages_max, &shared, NULL))
        g_variant_builder_add(&b, "{sv}", "pages_shared", g_variant_new_uint64(shared));
    if (ksm_read(ksm, "pages_sharing", pages_max, &sharing, NULL)) {
        g_variant_builder_add(&b, "{sv}", "pages_sharing", g_variant_new_uint64(sharing));
        g_variant_builder_add(&b, "{sv}", "saved_bytes", g_variant_new_uint64(sharing * page));
    }
    g_autofree char *profit_path = g_build_filename(ksm->root, "general_profit", NULL);
    g_autofree char *profit_text = hostd_memory_read_file(profit_path, KSM_VALUE_MAX, NULL);
    if (profit_text != NULL &&
        hostd_memory_parse_signed(profit_text, HOSTD_MEMORY_KIB_MAX * 1024, &profit))
        g_variant_builder_add(&b, "{sv}", "general_profit_bytes", g_variant_new_int64(profit));
    return g_variant_builder_end(&b);
}

/* ---- following the agents (hostd_ksm_start()) ---- */

static void
ksm_log(HostdContext *ctx, char *line)
{
    g_autofree char *owned = line;

    if (owned != NULL)
        hostd_context_log(ctx, "%s", owned);
}

/* `auto`: whether any agent's QEMU is up (running or paused: a paused guest's memory is merged
 * as well), as libvirt counts its active domains. */
static gboolean
ksm_check(gpointer data)
{
    HostdContext *ctx = data;
    int active;

    if (ctx->ksm == NULL)
        return G_SOURCE_REMOVE;
    active = virConnectNumOfDomains(ctx->lv->conn);
    if (active < 0) {
        virResetLastError();
        return G_SOURCE_CONTINUE;
    }
    ksm_log(ctx, hostd_ksm_agents_running(ctx->ksm, active > 0));
    return G_SOURCE_CONTINUE;
}

static gboolean
ksm_check_once(gpointer data)
{
    ksm_check(data);
    return G_SOURCE_REMOVE;
}

/* libvirt's event thread: the count and the write happen on the main context, never here (not
 * g_main_context_invoke(), which would run them here while nobody runs that context). */
static int
ksm_on_lifecycle(virConnectPtr conn, virDomainPtr dom, int event, int detail, void *opaque)
{
    if (event == VIR_DOMAIN_EVENT_STARTED || event == VIR_DOMAIN_EVENT_STOPPED ||
        event == VIR_DOMAIN_EVENT_RESUMED) {
        g_autoptr(GSource) source = g_idle_source_new();

        g_source_set_callback(source, ksm_check_once, opaque, NULL);
        g_source_attach(source, g_main_context_default());
    }
    return 0;
}

static const HostdComponent ksm_component = {
    .name = "ksm",
    .detach = hostd_ksm_stop,
};

void
hostd_ksm_start(HostdContext *ctx, const char *root)
{
    HostdKsm *ksm = hostd_ksm_new(root, ctx->config->ksm);

    ctx->ksm = ksm;
    ksm->ctx = ctx;
    hostd_context_add_component(ctx, &ksm_component);
    ksm_log(ctx, hostd_ksm_begin(ksm));
    if (ksm->mode != HOSTD_KSM_AUTO)
        return;
    ksm->lifecycle_id =
        virConnectDomainEventRegisterAny(ctx->lv->conn, NULL, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                         VIR_DOMAIN_EVENT_CALLBACK(ksm_on_lifecycle), ctx, NULL);
    if (ksm->lifecycle_id < 0)
        virResetLastError();
    ksm->timeout_id = g_timeout_add_seconds(HOSTD_KSM_CHECK_S, ksm_check, ctx);
    ksm_check(ctx);
}

void
hostd_ksm_stop(HostdContext *ctx)
{
    HostdKsm *ksm = ctx->ksm;

    if (ksm == NULL)
        return;
    if (ksm->lifecycle_id >= 0)
        virConnectDomainEventDeregisterAny(ctx->lv->conn, ksm->lifecycle_id);
    if (ksm->timeout_id != 0)
        g_source_remove(ksm->timeout_id);
    ksm_log(ctx, hostd_ksm_restore(ksm));
    /* A check already queued by an event finds no controller and does nothing. */
    ctx->ksm = NULL;
    hostd_ksm_free(ksm);
}
