#include "hostd-guest.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hostd-guest-agent.h"
#include "hostd-logfile.h"
#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-stream.h"
#include "vm-util.h"

#define HOSTD_CONSOLE_TAIL_LINES 15
#define HOSTD_CONSOLE_TAIL_BYTES (64 * 1024)
/* A restored guest agent reconnects within a second or two: asked every 20 ms, the clock is set
 * as soon as it answers; given up after 10 s in all, however slowly the guest answers. */
#define HOSTD_CLOCK_SYNC_DEADLINE_US (10 * G_USEC_PER_SEC)
#define HOSTD_CLOCK_SYNC_RETRY_US    (G_USEC_PER_SEC / 50)
/* `date -s` in the guest is one process start. */
#define HOSTD_CLOCK_DATE_TIMEOUT_MS 3000
/* Appends to @out the last @max bytes of the file at @path (nothing when it cannot be read). */
static void
hostd_console_read_file_end(const char *path, gsize max, GString *out)
{
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;

    if (fd < 0 || fstat(fd, &st) < 0 || max == 0)
        return;
    off_t start = (gsize)st.st_size > max ? st.st_size - (off_t)max : 0;
    g_autofree char *buf = g_malloc(max);
    ssize_t n = pread(fd, buf, max, start);
    if (n > 0)
        g_string_append_len(out, buf, n);
}

/* The last HOSTD_CONSOLE_TAIL_BYTES of the console log, across its rotation (console.log.1, then
 * console.log), NUL-terminated, or NULL when there is none: the guest decides what it holds. */
static char *
hostd_console_read_end(const char *path)
{
    g_autofree char *old_path = g_strconcat(path, HOSTD_LOGFILE_OLD_SUFFIX, NULL);
    g_autoptr(GString) current = g_string_new(NULL);
    g_autoptr(GString) text = g_string_new(NULL);

    hostd_console_read_file_end(path, HOSTD_CONSOLE_TAIL_BYTES, current);
    hostd_console_read_file_end(old_path, HOSTD_CONSOLE_TAIL_BYTES - current->len, text);
    g_string_append_len(text, current->str, current->len);
    if (text->len == 0 && !g_file_test(path, G_FILE_TEST_EXISTS))
        return NULL;
    /* Bytes as the guest wrote them: a NUL must not end the text early, nor anything else. */
    for (gsize i = 0; i < text->len; i++) {
        if (text->str[i] == '\0')
            text->str[i] = ' ';
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

static char *
hostd_console_tail(const HostdAgentRecord *r)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE);
    g_autofree char *text = hostd_console_read_end(path);

    if (text == NULL)
        return g_strdup("\n  console: (none yet)");
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    guint n = g_strv_length(lines);
    guint start = n > HOSTD_CONSOLE_TAIL_LINES ? n - HOSTD_CONSOLE_TAIL_LINES : 0;
    g_autoptr(GString) out = g_string_new(NULL);
    for (guint i = start; i < n; i++) {
        g_strchomp(lines[i]);
        if (lines[i][0] == '\0')
            continue;
        g_string_append_printf(out, "\n  console: %s", lines[i]);
    }
    if (out->len == 0)
        g_string_append(out, "\n  console: (none yet)");
    return g_string_free(g_steal_pointer(&out), FALSE);
}

void
hostd_guest_ssh_target(HostdSshTarget *t, const HostdAgentRecord *r, char **identity,
                       char **known_hosts)
{
    *identity = hostd_agent_record_path(r, HOSTD_AGENT_KEY);
    *known_hosts = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);
    t->agent = r->name;
    t->host = "127.0.0.1";
    t->port = r->backend_port != 0 ? r->backend_port : r->ssh_port;
    t->user = r->user;
    t->identity_path = *identity;
    t->known_hosts_path = *known_hosts;
    t->identity_pem = NULL;
    t->host_key = NULL;
    t->agent_id = r->agent_id;
}

/* Waits for SSH, reporting progress every few seconds; on timeout the error carries the
 * console's last lines, which is usually where the reason is. */
gboolean
hostd_agent_wait_ssh(HostdContext *ctx, const HostdAgentRecord *r, VmProgressFunc progress,
                     gpointer progress_data, GError **error)
{
    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    gint64 start = g_get_monotonic_time();
    gint64 deadline = start + (gint64)ctx->config->boot_timeout_s * G_USEC_PER_SEC;

    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    for (;;) {
        g_autoptr(GError) local_error = NULL;
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, NULL);
        gint64 now = g_get_monotonic_time();
        g_autofree char *message =
            g_strdup_printf("waiting for %s to answer SSH (%" G_GINT64_FORMAT " s)", r->name,
                            (now - start) / G_USEC_PER_SEC);

        if (dom == NULL || !hostd_libvirt_is_active(dom)) {
            g_autofree char *tail = hostd_console_tail(r);
            return vm_throw(error, VM_ERROR_BAD_STATE, "%s stopped while booting%s", r->name, tail);
        }
        hostd_progress(progress, progress_data, message, -1);
        if (hostd_ssh_wait_ready(ctx->ssh, &target, 5, NULL, &local_error))
            return TRUE;
        if (!g_error_matches(local_error, VM_ERROR, VM_ERROR_TIMEOUT)) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        if (g_get_monotonic_time() >= deadline) {
            g_autofree char *tail = hostd_console_tail(r);
            return vm_throw(error, VM_ERROR_TIMEOUT, "%s did not answer SSH within %u s%s", r->name,
                            ctx->config->boot_timeout_s, tail);
        }
    }
}

typedef struct {
    int fd;       /* our end of the conversation with hostd_ssh_exec() */
    int stdin_fd; /* what the command reads, or -1 */
} HostdRunFeed;

/* Writer thread: copies the command's input into STDIN frames, then STDIN_EOF. */
static gpointer
hostd_run_feed_thread(gpointer data)
{
    HostdRunFeed *feed = data;
    g_autofree guint8 *buf = g_malloc(VM_STREAM_CHUNK_MAX);
    while (feed->stdin_fd >= 0) {
        ssize_t n = read(feed->stdin_fd, buf, VM_STREAM_CHUNK_MAX);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        g_autoptr(VmMessage) m = vm_message_new_data(VM_OP_STDIN, buf, (gsize)n);
        if (!vm_message_write_fd(feed->fd, m, NULL))
            return NULL;
    }
    g_autoptr(VmMessage) eof = vm_message_new(VM_OP_STDIN_EOF, NULL, NULL);
    vm_message_write_fd(feed->fd, eof, NULL);
    return NULL;
}

typedef struct {
    int fd;
    int status;       /* -1 until EXIT */
    GString *stderr_; /* the first few KiB of the command's stderr */
    GString *stdout_; /* the first max_stdout bytes of its stdout, or NULL: none kept */
    gsize max_stdout;
} HostdRunDrain;

/* Reader thread: takes the frames hostd_ssh_exec() writes (so it never blocks on a full socket)
 * until EXIT. */
static gpointer
hostd_run_drain_thread(gpointer data)
{
    HostdRunDrain *drain = data;
    VmStreamReader reader;

    vm_stream_reader_init(&reader, drain->fd, VM_OP_EXEC);
    while (!reader.ended) {
        g_autoptr(VmMessage) m = vm_stream_reader_next(&reader, NULL);
        if (m == NULL)
            return NULL;
        if (m->op == VM_OP_EXIT) {
            drain->status = vm_message_get_int(m, "status", -1);
            return NULL;
        }
        gsize len = 0;
        const guint8 *bytes = vm_message_get_data(m, "data", &len);
        if (m->op == VM_OP_STDERR && bytes != NULL && drain->stderr_->len < 4096)
            g_string_append_len(drain->stderr_, (const char *)bytes, (gssize)MIN(len, 4096));
        /* The guest may send any amount: what is past the bound is read and dropped. */
        if (m->op == VM_OP_STDOUT && bytes != NULL && drain->stdout_ != NULL &&
            drain->stdout_->len < drain->max_stdout)
            g_string_append_len(drain->stdout_, (const char *)bytes,
                                (gssize)MIN(len, drain->max_stdout - drain->stdout_->len));
    }
    return NULL;
}

gboolean
hostd_agent_run(HostdContext *ctx, const HostdAgentRecord *r, char **argv, int stdin_fd,
                int *ret_status, char **ret_stderr, GError **error)
{
    return hostd_agent_run_output(ctx, r, argv, stdin_fd, 0, ret_status, NULL, ret_stderr, error);
}

gboolean
hostd_agent_run_output(HostdContext *ctx, const HostdAgentRecord *r, char **argv, int stdin_fd,
                       gsize max_stdout, int *ret_status, GBytes **ret_stdout, char **ret_stderr,
                       GError **error)
{
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0)
        return vm_throw_errno(error, errno, "socketpair");
    vm_autofd ours = fds[0];
    vm_autofd theirs = fds[1];

    HostdRunFeed feed = {.fd = ours, .stdin_fd = stdin_fd};
    HostdRunDrain drain = {
        .fd = ours,
        .status = -1,
        .stderr_ = g_string_new(NULL),
        .stdout_ = ret_stdout != NULL ? g_string_new(NULL) : NULL,
        .max_stdout = max_stdout,
    };
    GThread *feeder = g_thread_new("hostd-run-in", hostd_run_feed_thread, &feed);
    GThread *drainer = g_thread_new("hostd-run-out", hostd_run_drain_thread, &drain);

    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    HostdExecRequest request = {.argv = argv};
    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    gboolean ok = hostd_ssh_exec(ctx->ssh, &target, &request, theirs, error);
    /* Whatever happened, the threads end: the drainer at EXIT or at the EOF this shutdown
     * causes, the feeder at its input's end or when writing fails. */
    shutdown(theirs, SHUT_RDWR);
    g_thread_join(drainer);
    shutdown(ours, SHUT_RDWR);
    g_thread_join(feeder);
    g_autofree char *err_text = g_string_free(drain.stderr_, FALSE);
    g_autoptr(GBytes) out_bytes =
        drain.stdout_ != NULL ? g_string_free_to_bytes(drain.stdout_) : NULL;
    if (!ok)
        return FALSE;
    if (drain.status < 0)
        return vm_throw(error, VM_ERROR_SSH, "no exit status from the guest");
    *ret_status = drain.status;
    if (ret_stdout != NULL)
        *ret_stdout = g_steal_pointer(&out_bytes);
    if (ret_stderr != NULL)
        *ret_stderr = g_steal_pointer(&err_text);
    return TRUE;
}

gboolean
hostd_agent_wait_first_boot(HostdContext *ctx, const HostdAgentRecord *r, VmProgressFunc progress,
                            gpointer progress_data, GError **error)
{
    /* sshd answers before cloud-init is done, and cloud-init may still restart sshd (it
     * rewrites its configuration): an agent is ready once cloud-init has finished. */
    char *argv[] = {"sh", "-c",
                    "command -v cloud-init >/dev/null || exit 0; "
                    "cloud-init status --wait >/dev/null 2>&1; exit 0",
                    NULL};
    int status = 0;

    hostd_progress(progress, progress_data, "waiting for cloud-init to finish", -1);
    if (!hostd_agent_run(ctx, r, argv, -1, &status, NULL, error))
        return FALSE;
    /* sshd may have restarted under the pooled session. */
    hostd_ssh_pool_forget(ctx->ssh, r->name);
    return TRUE;
}

void
hostd_guest_agent_bound(virDomainPtr dom)
{
    /* libvirt waits for the guest agent's answer without end by default: a guest whose agent
     * died would hold this agent's lock forever. */
    if (virDomainAgentSetResponseTimeout(dom, HOSTD_GUEST_AGENT_TIMEOUT_S, 0) < 0)
        virResetLastError();
}

/* Sets the guest's clock with `date -s` run through guest-exec. guest-set-time (what
 * virDomainSetTime() asks) also writes the RTC with `hwclock -w`, which waits for the RTC's next
 * second boundary: 0.2 to 0.9 s measured after a wake, all of it holding back the first command.
 * The RTC needs no update: QEMU's follows the host's clock. The clock lags the host's by the time
 * the guest takes to start `date` (milliseconds under KVM, tens of them under TCG). */
static gboolean
hostd_guest_set_time_by_date(virDomainPtr dom, GError **error)
{
    gint64 now = g_get_real_time();
    g_autofree char *when = g_strdup_printf("@%" G_GINT64_FORMAT ".%06d", now / G_USEC_PER_SEC,
                                            (int)(now % G_USEC_PER_SEC));
    const char *const argv[] = {"/bin/date", "-u", "-s", when, NULL};
    int status = 0;

    if (!hostd_guest_agent_exec(dom, argv, NULL, HOSTD_CLOCK_DATE_TIMEOUT_MS, &status, NULL, error))
        return FALSE;
    if (status != 0)
        return vm_throw(error, VM_ERROR_LIBVIRT, "date -s in the guest exited with %d", status);
    return TRUE;
}

void
hostd_guest_sync_clock(HostdContext *ctx, virDomainPtr dom, const char *name)
{
    gint64 deadline = g_get_monotonic_time() + HOSTD_CLOCK_SYNC_DEADLINE_US;

    hostd_guest_agent_bound(dom);
    do {
        if (hostd_guest_set_time_by_date(dom, NULL))
            return;
        virResetLastError();
        /* A guest without GNU date, or whose agent refuses guest-exec: guest-set-time. While
         * the agent is not connected yet, this fails at once too. */
        gint64 now = g_get_real_time();
        if (virDomainSetTime(dom, now / G_USEC_PER_SEC, (unsigned int)(now % G_USEC_PER_SEC) * 1000,
                             0) == 0)
            return;
        virResetLastError();
        g_usleep(HOSTD_CLOCK_SYNC_RETRY_US);
    } while (g_get_monotonic_time() < deadline);
    hostd_context_log(ctx, "agent '%s': could not set the guest clock (no guest agent answer)",
                      name);
}

struct _HostdClockSync {
    HostdContext *ctx;
    virDomainPtr dom;
    char *name;
    GThread *thread;
};

static gpointer
hostd_clock_sync_thread(gpointer data)
{
    HostdClockSync *sync = data;

    hostd_guest_sync_clock(sync->ctx, sync->dom, sync->name);
    return NULL;
}

HostdClockSync *
hostd_guest_sync_clock_begin(HostdContext *ctx, virDomainPtr dom, const char *name)
{
    HostdClockSync *sync = g_new0(HostdClockSync, 1);
    g_autoptr(GError) error = NULL;

    sync->ctx = ctx;
    sync->dom = dom;
    virDomainRef(dom);
    sync->name = g_strdup(name);
    sync->thread = g_thread_try_new("clock-sync", hostd_clock_sync_thread, sync, &error);
    /* No thread to spare: set it here, as before. */
    if (sync->thread == NULL)
        hostd_guest_sync_clock(ctx, dom, name);
    return sync;
}

void
hostd_guest_sync_clock_finish(HostdClockSync *sync)
{
    if (sync == NULL)
        return;
    if (sync->thread != NULL)
        g_thread_join(sync->thread);
    virDomainFree(sync->dom);
    g_free(sync->name);
    g_free(sync);
}
