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

gboolean
hostd_allocate_port(HostdContext *ctx, guint not_this, guint *ret_port, GError **error)
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
        vm_autofd fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return vm_throw_errno(error, errno, "socket");
        struct sockaddr_in sa = {
            .sin_family = AF_INET,
            .sin_port = htons((guint16)port),
            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
        };
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            *ret_port = port;
            return TRUE;
        }
    }
    return vm_throw(error, VM_ERROR_NO_RESOURCES, "no free SSH port in %u-%u",
                    ctx->config->ssh_port_min, ctx->config->ssh_port_max);
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
