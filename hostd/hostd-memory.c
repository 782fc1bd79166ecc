#include "hostd-memory.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

char *
hostd_memory_read_file(const char *path, gsize max, gsize *ret_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    g_autofree char *buf = NULL;
    gsize len = 0;

    if (fd < 0)
        return NULL;
    /* One byte more than allowed: a file that fills it is too long. */
    buf = g_malloc(max + 2);
    while (len < max + 1) {
        ssize_t n = read(fd, buf + len, max + 1 - len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            close(fd);
            return NULL;
        }
        if (n == 0)
            break;
        len += (gsize)n;
    }
    close(fd);
    if (len > max)
        return NULL;
    buf[len] = '\0';
    if (ret_len != NULL)
        *ret_len = len;
    return g_steal_pointer(&buf);
}

GPid
hostd_memory_qemu_pid(HostdLibvirt *lv, const char *agent)
{
    g_autofree char *name = hostd_libvirt_domain_name(lv, agent);
    g_autofree char *root = hostd_libvirt_embed_root(lv->uri);
    g_autofree char *pid_path = NULL;
    g_autofree char *pid_text = NULL;
    g_autofree char *cmdline_path = NULL;
    g_autofree char *cmdline = NULL;
    g_autofree char *want = g_strdup_printf("guest=%s,", name);
    gsize len = 0;
    guint64 pid = 0;

    if (root != NULL)
        pid_path = g_strdup_printf("%s/run/qemu/%s.pid", root, name);
    else
        pid_path = g_strdup_printf("/run/libvirt/qemu/%s.pid", name);
    pid_text = hostd_memory_read_file(pid_path, HOSTD_MEMORY_FILE_MAX, NULL);
    if (pid_text == NULL || !hostd_memory_parse_number(pid_text, G_MAXINT32, &pid) || pid == 0)
        return 0;
    /* A pid file left by a QEMU that is gone may name another process by now. */
    cmdline_path = g_strdup_printf("/proc/%" G_GUINT64_FORMAT "/cmdline", pid);
    cmdline = hostd_memory_read_file(cmdline_path, HOSTD_MEMORY_FILE_MAX, &len);
    if (cmdline == NULL)
        return 0;
    for (gsize at = 0; at < len; at += strlen(cmdline + at) + 1) {
        if (g_str_has_prefix(cmdline + at, want))
            return (GPid)pid;
    }
    return 0;
}

/* Whether only blanks and newlines are left at @p. */
static gboolean
memory_only_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n')
        p++;
    return *p == '\0';
}

gboolean
hostd_memory_parse_number(const char *text, guint64 max, guint64 *ret_value)
{
    const char *p = text;
    char *end = NULL;
    guint64 value;

    while (*p == ' ' || *p == '\t')
        p++;
    /* g_ascii_strtoull takes a sign, and "-1" as a huge number. */
    if (!g_ascii_isdigit(*p))
        return FALSE;
    errno = 0;
    value = g_ascii_strtoull(p, &end, 10);
    if (errno != 0 || end == p || !memory_only_space(end) || value > max)
        return FALSE;
    *ret_value = value;
    return TRUE;
}

gboolean
hostd_memory_parse_signed(const char *text, guint64 max, gint64 *ret_value)
{
    const char *p = text;
    gboolean negative = FALSE;
    guint64 magnitude = 0;

    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '-') {
        negative = TRUE;
        p++;
    }
    if (!hostd_memory_parse_number(p, MIN(max, (guint64)G_MAXINT64), &magnitude) ||
        (negative && (*p == ' ' || *p == '\t')))
        return FALSE;
    *ret_value = negative ? -(gint64)magnitude : (gint64)magnitude;
    return TRUE;
}

/* The rest of the line of @text that starts with @key followed by @sep, NUL-terminated in a
 * copy; NULL when no line does. */
static char *
memory_line_value(const char *text, const char *key, char sep)
{
    gsize key_len = strlen(key);

    for (const char *line = text; line != NULL && *line != '\0';) {
        const char *eol = strchr(line, '\n');
        gsize len = eol != NULL ? (gsize)(eol - line) : strlen(line);

        if (len > key_len && strncmp(line, key, key_len) == 0 && line[key_len] == sep)
            return g_strndup(line + key_len + 1, len - key_len - 1);
        line = eol != NULL ? eol + 1 : NULL;
    }
    return NULL;
}

gboolean
hostd_memory_parse_status_kib(const char *text, const char *key, guint64 *ret_bytes)
{
    g_autofree char *value = memory_line_value(text, key, ':');
    guint64 kib = 0;
    char *unit;

    if (value == NULL)
        return FALSE;
    unit = strstr(value, " kB");
    if (unit == NULL || !memory_only_space(unit + 3))
        return FALSE;
    *unit = '\0';
    if (!hostd_memory_parse_number(value, HOSTD_MEMORY_KIB_MAX, &kib))
        return FALSE;
    *ret_bytes = kib * 1024;
    return TRUE;
}

gboolean
hostd_memory_parse_keyed(const char *text, const char *key, guint64 max, gint64 *ret_value)
{
    g_autofree char *value = memory_line_value(text, key, ' ');

    return value != NULL && hostd_memory_parse_signed(value, max, ret_value);
}

void
hostd_memory_add_process(GVariantBuilder *b, const char *proc_root, GPid pid)
{
    g_autofree char *status_path = g_strdup_printf("%s/%d/status", proc_root, (int)pid);
    g_autofree char *merging_path = g_strdup_printf("%s/%d/ksm_merging_pages", proc_root, (int)pid);
    g_autofree char *stat_path = g_strdup_printf("%s/%d/ksm_stat", proc_root, (int)pid);
    g_autofree char *status = hostd_memory_read_file(status_path, HOSTD_MEMORY_FILE_MAX, NULL);
    g_autofree char *merging = hostd_memory_read_file(merging_path, HOSTD_MEMORY_FILE_MAX, NULL);
    g_autofree char *stat = hostd_memory_read_file(stat_path, HOSTD_MEMORY_FILE_MAX, NULL);
    guint64 page = (guint64)sysconf(_SC_PAGESIZE);
    /* No more pages than 1 PiB holds. */
    guint64 pages_max = (HOSTD_MEMORY_KIB_MAX * 1024) / page;
    guint64 rss = 0, pages = 0;
    gint64 profit = 0;

    if (status != NULL && hostd_memory_parse_status_kib(status, "VmRSS", &rss))
        g_variant_builder_add(b, "{sv}", "qemu_rss_bytes", g_variant_new_uint64(rss));
    if (merging != NULL && hostd_memory_parse_number(merging, pages_max, &pages))
        g_variant_builder_add(b, "{sv}", "ksm_merged_bytes", g_variant_new_uint64(pages * page));
    if (stat != NULL &&
        hostd_memory_parse_keyed(stat, "ksm_process_profit", HOSTD_MEMORY_KIB_MAX * 1024, &profit))
        g_variant_builder_add(b, "{sv}", "ksm_profit_bytes", g_variant_new_int64(profit));
}

gboolean
hostd_memory_add_balloon(GVariantBuilder *b, virDomainPtr dom, gboolean with_used)
{
    static const struct {
        int tag;
        const char *field;
    } figures[] = {
        {VIR_DOMAIN_MEMORY_STAT_ACTUAL_BALLOON, "balloon_actual_bytes"},
        {VIR_DOMAIN_MEMORY_STAT_RSS, "balloon_rss_bytes"},
        {VIR_DOMAIN_MEMORY_STAT_AVAILABLE, "balloon_available_bytes"},
        {VIR_DOMAIN_MEMORY_STAT_USABLE, "balloon_usable_bytes"},
        {VIR_DOMAIN_MEMORY_STAT_UNUSED, "balloon_unused_bytes"},
    };
    virDomainMemoryStatStruct stats[VIR_DOMAIN_MEMORY_STAT_NR];
    gboolean have[VIR_DOMAIN_MEMORY_STAT_NR] = {FALSE};
    guint64 kib[VIR_DOMAIN_MEMORY_STAT_NR] = {0};
    int n = virDomainMemoryStats(dom, stats, VIR_DOMAIN_MEMORY_STAT_NR, 0);

    if (n < 0) {
        virResetLastError();
        return TRUE;
    }
    for (int i = 0; i < MIN(n, VIR_DOMAIN_MEMORY_STAT_NR); i++) {
        /* The guest writes most of these: a figure past any memory is left out. */
        if (stats[i].tag >= 0 && stats[i].tag < VIR_DOMAIN_MEMORY_STAT_NR &&
            stats[i].val <= HOSTD_MEMORY_KIB_MAX) {
            have[stats[i].tag] = TRUE;
            kib[stats[i].tag] = stats[i].val;
        }
    }
    for (gsize i = 0; i < G_N_ELEMENTS(figures); i++) {
        if (have[figures[i].tag])
            g_variant_builder_add(b, "{sv}", figures[i].field,
                                  g_variant_new_uint64(kib[figures[i].tag] * 1024));
    }
    if (!have[VIR_DOMAIN_MEMORY_STAT_AVAILABLE])
        return FALSE;
    if (with_used) {
        guint64 available = kib[VIR_DOMAIN_MEMORY_STAT_AVAILABLE];
        guint64 free_kib = available;

        if (have[VIR_DOMAIN_MEMORY_STAT_USABLE])
            free_kib = kib[VIR_DOMAIN_MEMORY_STAT_USABLE];
        else if (have[VIR_DOMAIN_MEMORY_STAT_UNUSED])
            free_kib = kib[VIR_DOMAIN_MEMORY_STAT_UNUSED];

        g_variant_builder_add(b, "{sv}", "memory_available_bytes",
                              g_variant_new_uint64(available * 1024));
        g_variant_builder_add(b, "{sv}", "memory_used_bytes",
                              g_variant_new_uint64((available - MIN(free_kib, available)) * 1024));
    }
    return TRUE;
}

void
hostd_memory_add_agent(GVariantBuilder *b, HostdLibvirt *lv, virDomainPtr dom, const char *name)
{
    GPid pid = hostd_memory_qemu_pid(lv, name);

    if (pid > 0) {
        g_variant_builder_add(b, "{sv}", "qemu_pid", g_variant_new_uint32((guint32)pid));
        hostd_memory_add_process(b, "/proc", pid);
    }
    /* The balloon reports only once asked to; the next figures have it. */
    if (!hostd_memory_add_balloon(b, dom, FALSE) &&
        virDomainSetMemoryStatsPeriod(dom, HOSTD_MEMORY_BALLOON_PERIOD_S, VIR_DOMAIN_AFFECT_LIVE) <
            0)
        virResetLastError();
}

guint64
hostd_memory_host_mib(const char *field)
{
    g_autofree char *text = hostd_memory_read_file("/proc/meminfo", HOSTD_MEMORY_FILE_MAX, NULL);
    g_autofree char *prefix = g_strconcat(field, ":", NULL);
    guint64 kib = 0;

    if (text == NULL)
        return 0;
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (guint i = 0; lines[i] != NULL; i++) {
        if (!g_str_has_prefix(lines[i], prefix))
            continue;
        g_autofree char *value = g_strstrip(g_strdup(lines[i] + strlen(prefix)));
        if (g_str_has_suffix(value, " kB"))
            value[strlen(value) - 3] = '\0';
        return hostd_memory_parse_number(value, G_MAXUINT64 / 1024, &kib) ? kib / 1024 : 0;
    }
    return 0;
}
