#include "hostd-resources.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "vm-error.h"
#include "vm-util.h"

#define HOSTD_MIN_FREE_BYTES (1024ULL * 1024 * 1024)

guint64
hostd_file_allocated(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return 0;
    return (guint64)st.st_blocks * 512;
}

/* A socket bound to 127.0.0.1:@port and listening: what makes the port ours. SO_REUSEADDR, as
 * the relay's and QEMU's listeners have, so that TIME_WAIT connections do not keep a port from
 * being chosen. Another process that binds the port at the same moment makes bind() or listen()
 * fail (two SO_REUSEADDR sockets may share a bound port until one listens): -1, errno set. */
static int
port_listen(guint port)
{
    struct sockaddr_in sa = {
        .sin_family = AF_INET,
        .sin_port = htons((guint16)port),
        .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
    };
    vm_autofd fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;

    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0)
        return -1;
    return g_steal_fd(&fd);
}

gboolean
hostd_allocate_port(HostdContext *ctx, guint not_this, guint *ret_port, int *ret_fd, GError **error)
{
    g_autoptr(GHashTable) used = g_hash_table_new(g_direct_hash, g_direct_equal);
    g_autoptr(GPtrArray) records = hostd_state_load_records(ctx->state, error);
    if (records == NULL)
        return FALSE;
    for (guint i = 0; i < records->len; i++) {
        const HostdAgentRecord *r = records->pdata[i];
        g_hash_table_add(used, GUINT_TO_POINTER(r->ssh_port));
        g_hash_table_add(used, GUINT_TO_POINTER(r->backend_port));
    }
    g_hash_table_add(used, GUINT_TO_POINTER(not_this));
    for (guint port = ctx->config->ssh_port_min; port <= ctx->config->ssh_port_max; port++) {
        if (g_hash_table_contains(used, GUINT_TO_POINTER(port)))
            continue;
        int fd = port_listen(port);
        if (fd < 0 && errno != EADDRINUSE)
            return vm_throw_errno(error, errno, "cannot listen on 127.0.0.1:%u", port);
        if (fd < 0)
            continue;
        /* The port stays ours while the caller holds the socket: nobody can take it between
         * this choice and the listener that serves it. */
        *ret_port = port;
        if (ret_fd != NULL)
            *ret_fd = fd;
        else
            close(fd);
        return TRUE;
    }
    return vm_throw(error, VM_ERROR_NO_RESOURCES, "no free SSH port in %u-%u",
                    ctx->config->ssh_port_min, ctx->config->ssh_port_max);
}

typedef struct {
    int public_fd;
    int backend_fd;
} HeldPorts;

static void
held_ports_free(gpointer data)
{
    HeldPorts *held = data;

    if (held->public_fd >= 0)
        close(held->public_fd);
    if (held->backend_fd >= 0)
        close(held->backend_fd);
    g_free(held);
}

void
hostd_ports_hold(HostdContext *ctx, const char *name, int public_fd, int backend_fd)
{
    HeldPorts *held = g_new(HeldPorts, 1);

    held->public_fd = public_fd;
    held->backend_fd = backend_fd;
    g_mutex_lock(&ctx->lock);
    if (ctx->held_ports == NULL)
        ctx->held_ports = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, held_ports_free);
    g_hash_table_insert(ctx->held_ports, g_strdup(name), held);
    g_mutex_unlock(&ctx->lock);
}

void
hostd_ports_hold_backend(HostdContext *ctx, const char *name, int backend_fd)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    HeldPorts *held = ctx->held_ports != NULL ? g_hash_table_lookup(ctx->held_ports, name) : NULL;

    if (held == NULL) {
        g_clear_pointer(&locker, g_mutex_locker_free);
        hostd_ports_hold(ctx, name, -1, backend_fd);
        return;
    }
    if (held->backend_fd >= 0)
        close(held->backend_fd);
    held->backend_fd = backend_fd;
}

/* Takes @name's held socket at @offset (HeldPorts' public_fd or backend_fd) out: -1 when none. */
static int
ports_take(HostdContext *ctx, const char *name, gsize offset)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    HeldPorts *held = ctx->held_ports != NULL ? g_hash_table_lookup(ctx->held_ports, name) : NULL;
    int fd = -1;

    if (held != NULL) {
        int *slot = G_STRUCT_MEMBER_P(held, offset);
        fd = *slot;
        *slot = -1;
        if (held->public_fd < 0 && held->backend_fd < 0)
            g_hash_table_remove(ctx->held_ports, name);
    }
    return fd;
}

int
hostd_ports_take_public(HostdContext *ctx, const char *name)
{
    return ports_take(ctx, name, G_STRUCT_OFFSET(HeldPorts, public_fd));
}

void
hostd_ports_release_backend(HostdContext *ctx, const char *name)
{
    int fd = ports_take(ctx, name, G_STRUCT_OFFSET(HeldPorts, backend_fd));

    if (fd >= 0)
        close(fd);
}

void
hostd_ports_hold_saved(HostdContext *ctx, const char *name, guint port)
{
    int fd = port != 0 ? port_listen(port) : -1;

    if (fd >= 0)
        hostd_ports_hold_backend(ctx, name, fd);
}

void
hostd_ports_release(HostdContext *ctx, const char *name)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);

    if (ctx->held_ports != NULL)
        g_hash_table_remove(ctx->held_ports, name);
}

gboolean
hostd_port_is_free(guint port)
{
    int fd = port_listen(port);

    if (fd < 0)
        return FALSE;
    close(fd);
    return TRUE;
}

gboolean
hostd_check_resources(HostdContext *ctx, guint cpus, guint memory_mib, guint disk_gib,
                      GError **error)
{
    guint host_cpus = g_get_num_processors();
    guint64 host_mib = (guint64)sysconf(_SC_PHYS_PAGES) * (guint64)sysconf(_SC_PAGESIZE) >> 20;
    struct statvfs vfs;

    if (cpus == 0 || cpus > host_cpus)
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "--cpus %u: this host has %u CPUs", cpus,
                        host_cpus);
    if (memory_mib < 128 || memory_mib > host_mib)
        return vm_throw(error, VM_ERROR_NO_RESOURCES,
                        "--memory %u MiB: must be between 128 and this host's %" G_GUINT64_FORMAT
                        " MiB",
                        memory_mib, host_mib);
    if (disk_gib == 0 || disk_gib > 16384)
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "--disk %u GiB: must be 1-16384", disk_gib);
    if (statvfs(ctx->state->agents_dir, &vfs) == 0 &&
        (guint64)vfs.f_bavail * vfs.f_frsize < HOSTD_MIN_FREE_BYTES)
        return vm_throw(error, VM_ERROR_NO_RESOURCES, "less than 1 GiB free under %s",
                        ctx->state->agents_dir);
    return TRUE;
}

char *
hostd_agent_machine_id(const HostdAgentRecord *r)
{
    g_autoptr(GString) id = g_string_new(NULL);
    for (const char *p = r->uuid; *p != '\0'; p++) {
        if (*p != '-')
            g_string_append_c(id, g_ascii_tolower(*p));
    }
    return g_string_free(g_steal_pointer(&id), FALSE);
}

char *
hostd_random_mac(void)
{
    return g_strdup_printf("52:54:00:%02x:%02x:%02x", g_random_int_range(0, 256),
                           g_random_int_range(0, 256), g_random_int_range(0, 256));
}
