/* Copies each agent's serial console from QEMU's socket into a bounded console.log. */
#include "hostd-console.h"

#include <errno.h>
#include <fcntl.h>
#include <glib-unix.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hostd-state.h"
#include "vm-util.h"

/* One read: large enough that a guest writing flat out costs few wake-ups. */
#define CONSOLE_CHUNK 65536
/* How often agents that are not connected are tried: every few seconds, and right after one is
 * started, often for a while, so that little of its boot is lost. */
#define CONSOLE_RESCAN_MS 2000
#define CONSOLE_FAST_MS   50
#define CONSOLE_FAST_S    30

typedef struct {
    char *socket_path;
    HostdLogFile *log;
    int fd; /* connected to QEMU's console socket; -1: not */
} ConsoleAgent;

struct _HostdConsole {
    GMutex lock;        /* agents, stop, fast_until */
    GHashTable *agents; /* name -> ConsoleAgent* */
    GThread *thread;    /* the copier */
    int wake[2];        /* a byte here makes the copier look again at once */
    gboolean stop;      /* the copier ends */
    gint64 fast_until;  /* monotonic: try unconnected agents every CONSOLE_FAST_MS until then */
};

gboolean
hostd_console_pump(int fd, HostdLogFile *log)
{
    g_autofree char *buf = g_malloc(CONSOLE_CHUNK);
    gssize n = read(fd, buf, CONSOLE_CHUNK);

    if (n < 0)
        return errno == EAGAIN || errno == EINTR;
    if (n == 0)
        return FALSE;
    /* A full disk loses console bytes, nothing else: the next read tries again. */
    (void)hostd_logfile_append_bytes(log, buf, (gsize)n, NULL);
    return TRUE;
}

HostdLogFile *
hostd_console_log_new(const HostdAgentRecord *r)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE);

    return hostd_logfile_new(path, HOSTD_CONSOLE_MAX_BYTES, HOSTD_LOGFILE_BYTES);
}

static void
console_agent_free(ConsoleAgent *a)
{
    if (a->fd >= 0)
        close(a->fd);
    hostd_logfile_free(a->log);
    g_free(a->socket_path);
    g_free(a);
}

/* Connects @a to its QEMU when one listens; a socket left by a QEMU that is gone refuses. To the
 * socket file itself, never to what a link in its place names (vm_unix_connect_nofollow()). */
static void
console_connect_locked(ConsoleAgent *a)
{
    int fd = vm_unix_connect_nofollow(a->socket_path, SOCK_NONBLOCK, NULL);

    if (fd >= 0)
        a->fd = fd;
}

static gpointer
console_thread(gpointer data)
{
    HostdConsole *console = data;
    gint64 next_scan = 0;

    for (;;) {
        g_autoptr(GArray) fds = g_array_new(FALSE, TRUE, sizeof(struct pollfd));
        struct pollfd wake = {.fd = console->wake[0], .events = POLLIN};
        GHashTableIter iter;
        gpointer value;

        g_mutex_lock(&console->lock);
        if (console->stop) {
            g_mutex_unlock(&console->lock);
            break;
        }
        g_array_append_val(fds, wake);
        g_hash_table_iter_init(&iter, console->agents);
        while (g_hash_table_iter_next(&iter, NULL, &value)) {
            ConsoleAgent *a = value;
            struct pollfd p = {.fd = a->fd, .events = POLLIN};

            if (a->fd >= 0)
                g_array_append_val(fds, p);
        }
        gint64 now = g_get_monotonic_time();
        int step = now < console->fast_until ? CONSOLE_FAST_MS : CONSOLE_RESCAN_MS;
        int timeout = next_scan > now ? (int)MIN((next_scan - now) / 1000 + 1, step) : 0;
        g_mutex_unlock(&console->lock);

        if (poll((struct pollfd *)fds->data, fds->len, timeout) < 0 && errno != EINTR)
            g_usleep(CONSOLE_FAST_MS * 1000);

        g_mutex_lock(&console->lock);
        char drain[64];
        while (read(console->wake[0], drain, sizeof(drain)) > 0)
            ;
        /* By descriptor: an agent removed meanwhile is no longer in the table, and only this
         * thread opens the descriptors agents hold. */
        g_hash_table_iter_init(&iter, console->agents);
        while (g_hash_table_iter_next(&iter, NULL, &value)) {
            ConsoleAgent *a = value;

            for (guint i = 1; i < fds->len && a->fd >= 0; i++) {
                const struct pollfd *p = &g_array_index(fds, struct pollfd, i);

                if (p->fd != a->fd || p->revents == 0)
                    continue;
                if (!hostd_console_pump(a->fd, a->log)) {
                    close(a->fd);
                    a->fd = -1;
                }
                break;
            }
        }
        now = g_get_monotonic_time();
        if (now >= next_scan) {
            g_hash_table_iter_init(&iter, console->agents);
            while (g_hash_table_iter_next(&iter, NULL, &value)) {
                ConsoleAgent *a = value;

                if (a->fd < 0)
                    console_connect_locked(a);
            }
            step = now < console->fast_until ? CONSOLE_FAST_MS : CONSOLE_RESCAN_MS;
            next_scan = now + (gint64)step * 1000;
        }
        g_mutex_unlock(&console->lock);
    }
    return NULL;
}

/* The console state of @ctx, made (and its thread started) on first use. */
static HostdConsole *
console_get(HostdContext *ctx)
{
    HostdConsole *console;

    g_mutex_lock(&ctx->lock);
    console = ctx->console;
    if (console == NULL) {
        console = g_new0(HostdConsole, 1);
        g_mutex_init(&console->lock);
        console->agents = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                                (GDestroyNotify)console_agent_free);
        /* Without the pipe (out of descriptors) the copier only wakes on its own, a little
         * later. */
        if (!g_unix_open_pipe(console->wake, FD_CLOEXEC, NULL)) {
            console->wake[0] = console->wake[1] = -1;
        } else {
            g_unix_set_fd_nonblocking(console->wake[0], TRUE, NULL);
            g_unix_set_fd_nonblocking(console->wake[1], TRUE, NULL);
        }
        console->thread = g_thread_new("console", console_thread, console);
        ctx->console = console;
    }
    g_mutex_unlock(&ctx->lock);
    return console;
}

/* Follows @r's console from now on; with @soon, tries often for a while (it is about to boot). */
static void
console_watch(HostdContext *ctx, const HostdAgentRecord *r, gboolean soon)
{
    HostdConsole *console = console_get(ctx);

    g_mutex_lock(&console->lock);
    if (!g_hash_table_contains(console->agents, r->name)) {
        ConsoleAgent *a = g_new0(ConsoleAgent, 1);

        a->socket_path = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE_SOCK);
        a->log = hostd_console_log_new(r);
        a->fd = -1;
        g_hash_table_insert(console->agents, g_strdup(r->name), a);
    }
    if (soon)
        console->fast_until = g_get_monotonic_time() + CONSOLE_FAST_S * G_USEC_PER_SEC;
    g_mutex_unlock(&console->lock);
    if (write(console->wake[1], "", 1) < 0) {
        /* The pipe is full: the copier is awake already. */
    }
}

static gboolean
console_agent_starting(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    console_watch(ctx, r, TRUE);
    return TRUE;
}

static void
console_agent_domain(HostdContext *ctx, const HostdAgentRecord *r, VmDomainSpec *spec,
                     GPtrArray *keep)
{
    console_watch(ctx, r, TRUE);
}

static void
console_agent_reconcile(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                        GPtrArray *notes)
{
    console_watch(ctx, r, FALSE);
}

void
hostd_console_unwatch(HostdContext *ctx, const char *name)
{
    g_mutex_lock(&ctx->lock);
    HostdConsole *console = ctx->console;
    g_mutex_unlock(&ctx->lock);

    if (console == NULL)
        return;
    g_mutex_lock(&console->lock);
    g_hash_table_remove(console->agents, name);
    g_mutex_unlock(&console->lock);
}

static void
console_agent_removed(HostdContext *ctx, const char *name)
{
    hostd_console_unwatch(ctx, name);
}

static void
console_detach(HostdContext *ctx)
{
    g_mutex_lock(&ctx->lock);
    HostdConsole *console = g_steal_pointer(&ctx->console);
    g_mutex_unlock(&ctx->lock);

    if (console == NULL)
        return;
    g_mutex_lock(&console->lock);
    console->stop = TRUE;
    g_mutex_unlock(&console->lock);
    if (write(console->wake[1], "", 1) < 0) {
        /* Full: the copier wakes anyway. */
    }
    g_thread_join(console->thread);
    g_hash_table_destroy(console->agents);
    if (console->wake[0] >= 0) {
        close(console->wake[0]);
        close(console->wake[1]);
    }
    g_mutex_clear(&console->lock);
    g_free(console);
}

const HostdComponent hostd_console_component = {
    .name = "console",
    .agent_domain = console_agent_domain,
    .agent_starting = console_agent_starting,
    .agent_removed = console_agent_removed,
    .agent_reconcile = console_agent_reconcile,
    .detach = console_detach,
};
