#include "hostd-agent.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "hostd-agent-private.h"
#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-fork.h"
#include "hostd-keys.h"
#include "hostd-power.h"
#include "vm-domain.h"
#include "vm-error.h"
#include "vm-image.h"
#include "vm-name.h"
#include "vm-protocol.h"
#include "vm-seed.h"
#include "vm-template.h"
#include "vm-util.h"

#define HOSTD_DEFAULT_TEMPLATE   "debian-12"
#define HOSTD_AGENT_DOMAIN_XML   "domain.xml"
#define HOSTD_STOP_TIMEOUT_S     60
#define HOSTD_CONSOLE_TAIL_LINES 15
#define HOSTD_MIN_FREE_BYTES     (1024ULL * 1024 * 1024)

G_LOCK_DEFINE_STATIC(hostd_retired);
static GPtrArray *hostd_retired_name_locks = NULL;

HostdContext *
hostd_context_new(HostdConfig *config, HostdState *state, HostdLibvirt *lv)
{
    HostdContext *ctx = g_new0(HostdContext, 1);
    ctx->config = config;
    ctx->state = state;
    ctx->lv = lv;
    ctx->ssh = hostd_ssh_pool_new();
    g_mutex_init(&ctx->lock);
    ctx->name_locks = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    return ctx;
}

void
hostd_context_free(HostdContext *ctx)
{
    if (ctx == NULL)
        return;
    /* Name locks live as long as the process: a request thread may still hold one while
     * hostd exits, so they are not freed here but kept reachable. */
    G_LOCK(hostd_retired);
    if (hostd_retired_name_locks == NULL)
        hostd_retired_name_locks = g_ptr_array_new();
    g_ptr_array_add(hostd_retired_name_locks, ctx->name_locks);
    G_UNLOCK(hostd_retired);
    hostd_egress_stop_all(ctx);
    hostd_ssh_pool_free(ctx->ssh);
    hostd_libvirt_close(ctx->lv);
    hostd_state_close(ctx->state);
    hostd_config_free(ctx->config);
    g_mutex_clear(&ctx->lock);
    g_free(ctx);
}

/* The lock of @name, made on first use; locks live as long as the context. */
static GMutex *
hostd_name_mutex(HostdContext *ctx, const char *name)
{
    g_mutex_lock(&ctx->lock);
    GMutex *m = g_hash_table_lookup(ctx->name_locks, name);
    if (m == NULL) {
        m = g_new0(GMutex, 1);
        g_mutex_init(m);
        g_hash_table_insert(ctx->name_locks, g_strdup(name), m);
    }
    g_mutex_unlock(&ctx->lock);
    return m;
}

GMutex *
hostd_name_lock(HostdContext *ctx, const char *name)
{
    GMutex *m = hostd_name_mutex(ctx, name);
    g_mutex_lock(m);
    return m;
}

GMutex *
hostd_name_trylock(HostdContext *ctx, const char *name)
{
    GMutex *m = hostd_name_mutex(ctx, name);
    return g_mutex_trylock(m) ? m : NULL;
}

void
hostd_name_unlock(GMutex *m)
{
    if (m != NULL)
        g_mutex_unlock(m);
}

void
hostd_progress(VmProgressFunc progress, gpointer data, const char *message, double fraction)
{
    if (progress != NULL)
        progress(message, fraction, data);
}

char *
hostd_agent_dir(HostdContext *ctx, const char *name)
{
    return g_build_filename(ctx->state->agents_dir, name, NULL);
}

/* Loads the record of an existing, finished agent. */
HostdAgentRecord *
hostd_agent_load(HostdContext *ctx, const char *name, GError **error)
{
    if (!vm_name_validate(name, error))
        return NULL;
    g_autofree char *dir = hostd_agent_dir(ctx, name);
    g_autofree char *record = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
    if (!g_file_test(record, G_FILE_TEST_EXISTS)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s'", name);
        return NULL;
    }
    HostdAgentRecord *r = hostd_agent_record_load(dir, error);
    if (r != NULL && !g_str_equal(r->phase, HOSTD_PHASE_READY)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no agent '%s' (it is still being created)", name);
        hostd_agent_record_free(r);
        return NULL;
    }
    return r;
}

gboolean
hostd_run(const char *const *argv, GError **error)
{
    return hostd_run_output(argv, NULL, error);
}

gboolean
hostd_run_output(const char *const *argv, char **ret_stdout, GError **error)
{
    g_autofree char *err_text = NULL;
    g_autofree char *out_text = NULL;
    g_autoptr(GError) local_error = NULL;
    int status = 0;
    GSpawnFlags flags = G_SPAWN_SEARCH_PATH | (ret_stdout == NULL ? G_SPAWN_STDOUT_TO_DEV_NULL : 0);

    if (!g_spawn_sync(NULL, (char **)argv, NULL, flags, NULL, NULL,
                      ret_stdout != NULL ? &out_text : NULL, &err_text, &status, &local_error))
        return vm_throw(error, VM_ERROR_IO, "cannot run %s: %s", argv[0], local_error->message);
    if (!g_spawn_check_wait_status(status, NULL))
        return vm_throw(error, VM_ERROR_IO, "%s failed: %s", argv[0],
                        err_text != NULL ? g_strstrip(err_text) : "");
    if (ret_stdout != NULL)
        *ret_stdout = g_steal_pointer(&out_text);
    return TRUE;
}

guint64
hostd_file_allocated(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return 0;
    return (guint64)st.st_blocks * 512;
}

/* Bytes the agent's disk files take on the host: its overlay and every checkpoint image. */
static guint64
hostd_agent_disk_bytes(const HostdAgentRecord *r)
{
    g_autoptr(GDir) dir = g_dir_open(r->dir, 0, NULL);
    const char *entry;
    guint64 total = 0;

    while (dir != NULL && (entry = g_dir_read_name(dir)) != NULL) {
        if (g_str_has_suffix(entry, ".qcow2")) {
            g_autofree char *path = g_build_filename(r->dir, entry, NULL);
            total += hostd_file_allocated(path);
        }
    }
    return total;
}

GVariant *
hostd_agent_to_variant(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
    g_autoptr(GError) local_error = NULL;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, r->name, &local_error);
    const char *state = dom != NULL ? hostd_libvirt_state_name(dom) : "missing";

    g_variant_builder_add(&b, "{sv}", "name", g_variant_new_string(r->name));
    g_variant_builder_add(&b, "{sv}", "state", g_variant_new_string(state));
    g_variant_builder_add(&b, "{sv}", "state_since", g_variant_new_int64(r->state_since));
    g_variant_builder_add(&b, "{sv}", "template", g_variant_new_string(r->template_name));
    g_variant_builder_add(&b, "{sv}", "cpus", g_variant_new_uint32(r->cpus));
    g_variant_builder_add(&b, "{sv}", "memory_mib", g_variant_new_uint32(r->memory_mib));
    g_variant_builder_add(&b, "{sv}", "disk_gib", g_variant_new_uint32(r->disk_gib));
    g_variant_builder_add(&b, "{sv}", "disk_bytes",
                          g_variant_new_uint64(hostd_agent_disk_bytes(r)));
    g_variant_builder_add(&b, "{sv}", "ssh_port", g_variant_new_uint32(r->ssh_port));
    g_variant_builder_add(&b, "{sv}", "user", g_variant_new_string(r->user));
    g_variant_builder_add(&b, "{sv}", "created", g_variant_new_int64(r->created));
    g_variant_builder_add(&b, "{sv}", "virt_type", g_variant_new_string(ctx->lv->virt_type));
    g_variant_builder_add(&b, "{sv}", "uuid", g_variant_new_string(r->uuid));
    if (r->forked_from != NULL) {
        g_variant_builder_add(&b, "{sv}", "forked_from", g_variant_new_string(r->forked_from));
        g_variant_builder_add(&b, "{sv}", "fork_checkpoint",
                              g_variant_new_string(r->fork_checkpoint));
    }
    g_autofree char *idle = NULL;
    if (r->idle_never || (r->idle_pause_s == 0 && r->idle_save_s == 0))
        idle = g_strdup("never");
    else
        idle = g_strdup_printf("pause after %us, save after %us", r->idle_pause_s, r->idle_save_s);
    g_variant_builder_add(&b, "{sv}", "idle", g_variant_new_string(idle));
    g_autofree char *periodic =
        r->checkpoint_every_s == 0
            ? g_strdup("never")
            : g_strdup_printf("every %us, keep %u + %u hourly + %u daily", r->checkpoint_every_s,
                              r->checkpoint_keep, r->checkpoint_hourly, r->checkpoint_daily);
    g_variant_builder_add(&b, "{sv}", "checkpoints", g_variant_new_string(periodic));
    return g_variant_builder_end(&b);
}

void
hostd_agent_mark_state_change(HostdAgentRecord *r)
{
    r->state_since = g_get_real_time() / G_USEC_PER_SEC;
    /* A failed write loses only the timestamp; the operation itself already happened. */
    hostd_agent_record_save(r, NULL);
}

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

/* Picks the lowest port of the configured range that no agent records, that is not @not_this,
 * and that nothing listens on. Called with ctx->lock held. */
static gboolean
hostd_allocate_port(HostdContext *ctx, guint not_this, guint *ret_port, GError **error)
{
    g_autoptr(GHashTable) used = g_hash_table_new(g_direct_hash, g_direct_equal);
    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return FALSE;
    for (guint i = 0; i < names->len; i++) {
        g_autofree char *dir = hostd_agent_dir(ctx, names->pdata[i]);
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
        if (r != NULL) {
            g_hash_table_add(used, GUINT_TO_POINTER(r->ssh_port));
            g_hash_table_add(used, GUINT_TO_POINTER(r->backend_port));
        }
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

static char *
hostd_console_tail(const HostdAgentRecord *r)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE);
    g_autofree char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
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

static void
hostd_ssh_target_init(HostdSshTarget *t, const HostdAgentRecord *r, char **identity,
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

    hostd_ssh_target_init(&target, r, &identity, &known_hosts);
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
} HostdRunDrain;

/* Reader thread: takes the frames hostd_ssh_exec() writes (so it never blocks on a full socket)
 * until EXIT. */
static gpointer
hostd_run_drain_thread(gpointer data)
{
    HostdRunDrain *drain = data;
    for (;;) {
        gboolean at_eof = FALSE;
        g_autoptr(VmMessage) m = vm_message_read_fd(drain->fd, &at_eof, NULL);
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
    }
}

gboolean
hostd_agent_run(HostdContext *ctx, const HostdAgentRecord *r, char **argv, int stdin_fd,
                int *ret_status, char **ret_stderr, GError **error)
{
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0)
        return vm_throw_errno(error, errno, "socketpair");
    vm_autofd ours = fds[0];
    vm_autofd theirs = fds[1];

    HostdRunFeed feed = {.fd = ours, .stdin_fd = stdin_fd};
    HostdRunDrain drain = {.fd = ours, .status = -1, .stderr_ = g_string_new(NULL)};
    GThread *feeder = g_thread_new("hostd-run-in", hostd_run_feed_thread, &feed);
    GThread *drainer = g_thread_new("hostd-run-out", hostd_run_drain_thread, &drain);

    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    HostdExecRequest request = {.argv = argv};
    hostd_ssh_target_init(&target, r, &identity, &known_hosts);
    gboolean ok = hostd_ssh_exec(ctx->ssh, &target, &request, theirs, error);
    /* Whatever happened, the threads end: the drainer at EXIT or at the EOF this shutdown
     * causes, the feeder at its input's end or when writing fails. */
    shutdown(theirs, SHUT_RDWR);
    g_thread_join(drainer);
    shutdown(ours, SHUT_RDWR);
    g_thread_join(feeder);
    g_autofree char *err_text = g_string_free(drain.stderr_, FALSE);
    if (!ok)
        return FALSE;
    if (drain.status < 0)
        return vm_throw(error, VM_ERROR_SSH, "no exit status from the guest");
    *ret_status = drain.status;
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

static char *
hostd_ssh_config_stanza(const HostdAgentRecord *r)
{
    g_autofree char *identity = hostd_agent_record_path(r, HOSTD_AGENT_KEY);
    g_autofree char *known_hosts = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);

    /* ConnectTimeout covers the banner: a connection to a saved agent waits for its wake. */
    return g_strdup_printf("Host vmctl-%s\n"
                           "  HostName 127.0.0.1\n"
                           "  Port %u\n"
                           "  User %s\n"
                           "  IdentityFile \"%s\"\n"
                           "  IdentitiesOnly yes\n"
                           "  UserKnownHostsFile \"%s\"\n"
                           "  GlobalKnownHostsFile /dev/null\n"
                           "  StrictHostKeyChecking yes\n"
                           "  HostKeyAlgorithms ssh-ed25519\n"
                           "  PasswordAuthentication no\n"
                           "  KbdInteractiveAuthentication no\n"
                           "  ConnectTimeout 60\n"
                           "  LogLevel ERROR\n",
                           r->name, r->ssh_port, r->user, identity, known_hosts);
}

/* Everything `new` makes before the domain starts: keys, known_hosts, ssh_config, overlay,
 * seed, domain XML. */
static char *
hostd_agent_prepare_files(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                          const VmImage *image, const char *user_data, GError **error)
{
    g_autofree char *key_path = hostd_agent_record_path(r, HOSTD_AGENT_KEY);
    g_autofree char *key_pub_path = hostd_agent_record_path(r, HOSTD_AGENT_KEY_PUB);
    g_autofree char *host_pub_path = hostd_agent_record_path(r, HOSTD_AGENT_HOST_KEY_PUB);
    g_autofree char *known_hosts_path = hostd_agent_record_path(r, HOSTD_AGENT_KNOWN_HOSTS);
    g_autofree char *ssh_config_path = hostd_agent_record_path(r, HOSTD_AGENT_SSH_CONFIG);
    g_autofree char *disk = hostd_agent_record_path(r, HOSTD_AGENT_DISK);
    g_autofree char *seed = hostd_agent_record_path(r, HOSTD_AGENT_SEED);
    g_autofree char *comment = g_strdup_printf("vmctl-%s", r->name);

    g_autoptr(HostdKeyPair) user_key = hostd_keypair_generate(comment, error);
    if (user_key == NULL || !hostd_keypair_save(user_key, key_path, key_pub_path, error))
        return NULL;
    /* hostd keeps no copy of the guest's private host key: it lives only in the seed. */
    g_autoptr(HostdKeyPair) host_key = hostd_keypair_generate(comment, error);
    if (host_key == NULL)
        return NULL;
    g_autofree char *host_pub_line = g_strconcat(host_key->public_line, "\n", NULL);
    g_autofree char *known_public = hostd_known_hosts_line(r->ssh_port, host_key->public_line);
    /* hostd itself talks to the backend port, under the same pinned key. */
    g_autofree char *known_backend =
        r->backend_port != 0 ? hostd_known_hosts_line(r->backend_port, host_key->public_line)
                             : g_strdup("");
    g_autofree char *known_hosts = g_strconcat(known_public, known_backend, NULL);
    g_autofree char *stanza = hostd_ssh_config_stanza(r);
    if (!vm_file_write_atomic(host_pub_path, host_pub_line, -1, 0644, error) ||
        !vm_file_write_atomic(known_hosts_path, known_hosts, -1, 0644, error) ||
        !vm_file_write_atomic(ssh_config_path, stanza, -1, 0644, error))
        return NULL;

    /* A fork's disk stands on its source's checkpoint, anyone else's on the template's image. */
    const char *backing = r->fork_base != NULL ? r->fork_base : image->disk_path;
    g_autofree char *size = g_strdup_printf("%uG", r->disk_gib);
    const char *qemu_img[] = {"qemu-img", "create", "-q",    "-f", "qcow2", "-F",
                              "qcow2",    "-b",     backing, disk, size,    NULL};
    if (!hostd_run(qemu_img, error))
        return NULL;

    VmSeedSpec seed_spec = {
        .hostname = r->name,
        .instance_id = r->instance_id,
        .user = r->user,
        .authorized_key = user_key->public_line,
        .host_key_private = host_key->private_pem,
        .host_key_public = host_key->public_line,
        /* A fork's disk already went through the template's first boot: running it again
         * would clobber what the source's user made. */
        .packages = tpl->source == VM_IMAGE_SOURCE_URL && r->forked_from == NULL
                        ? (const char *const *)tpl->packages
                        : NULL,
        .template_user_data = r->forked_from == NULL ? tpl->user_data : NULL,
        .user_user_data = user_data,
        /* A fork's disk has the proxy settings from its source's first boot already. */
        .egress_proxy = r->forked_from == NULL ? HOSTD_EGRESS_GUEST_PROXY : NULL,
    };
    /* The seed holds the guest's private host key: readable by nobody but its owner (libvirt
     * hands it to QEMU's user when the domain starts). */
    if (!vm_seed_write_iso(&seed_spec, seed, error))
        return NULL;
    if (chmod(seed, 0600) < 0) {
        vm_throw_errno(error, errno, "cannot protect %s", seed);
        return NULL;
    }

    return hostd_agent_domain_xml(ctx, r, image, HOSTD_AGENT_DISK, error);
}

VmImage *
hostd_agent_image(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, r->template_name, error);
    if (tpl == NULL)
        return NULL;
    return vm_image_lookup(ctx->config->images_dir, tpl, error);
}

char *
hostd_agent_domain_xml(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                       const char *disk_file, GError **error)
{
    g_autoptr(VmImage) looked_up = NULL;
    if (image == NULL) {
        looked_up = hostd_agent_image(ctx, r, error);
        if (looked_up == NULL)
            return NULL;
        image = looked_up;
    }
    g_autofree char *disk = hostd_agent_record_path(r, disk_file);
    g_autofree char *seed = hostd_agent_record_path(r, HOSTD_AGENT_SEED);
    g_autofree char *console = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE);
    g_autofree char *metadata = g_markup_printf_escaped(
        "<vmctl:agent xmlns:vmctl='https://vmctl.dev/xmlns/agent/1' name='%s' template='%s'/>",
        r->name, r->template_name);
    /* A fork's disk carries its source's /etc/machine-id: systemd takes the new one from the
     * command line before anything reads it, and writes it to the disk on that first boot. */
    g_autofree char *cmdline = NULL;
    if (r->forked_from != NULL && image->cmdline != NULL) {
        g_autofree char *machine_id = hostd_agent_machine_id(r);
        cmdline = g_strdup_printf("%s systemd.machine_id=%s", image->cmdline, machine_id);
    }
    g_autofree char *egress_command = hostd_egress_command(ctx, r);
    VmDomainSpec spec = {
        .name = r->name,
        .uuid = r->uuid,
        .virt_type = ctx->lv->virt_type,
        .cpu_disable = (const char *const *)ctx->lv->cpu_disable,
        .cpus = r->cpus,
        .memory_mib = r->memory_mib,
        .disk_path = disk,
        .seed_path = seed,
        .kernel_path = image->kernel_path,
        .initrd_path = image->initrd_path,
        .cmdline = cmdline != NULL ? cmdline : image->cmdline,
        .mac = r->mac,
        .ssh_port = r->backend_port != 0 ? r->backend_port : r->ssh_port,
        .console_log = console,
        .agent_socket = NULL, /* libvirt picks a path QEMU's user may create */
        .metadata_xml = metadata,
        .egress_command = egress_command,
    };
    return vm_domain_xml_build(&spec, error);
}

/* Undoes a partial `new`: the domain, then the agent's directory. Best effort by design: it
 * runs on the failure path and must remove whatever exists. */
static void
hostd_agent_rollback(HostdContext *ctx, const char *name, const char *dir)
{
    hostd_egress_agent_stop(ctx, name);
    hostd_ssh_pool_forget(ctx->ssh, name);
    hostd_libvirt_remove(ctx->lv, name, NULL);
    hostd_remove_tree(dir, NULL);
}

static gboolean
hostd_domain_define_and_start(HostdContext *ctx, const char *xml, GError **error)
{
    g_autoptr(virDomain) dom = virDomainDefineXML(ctx->lv->conn, xml);
    if (dom == NULL)
        return hostd_libvirt_throw(error, "cannot define the domain");
    if (virDomainCreate(dom) < 0)
        return hostd_libvirt_throw(error, "cannot start the domain");
    return TRUE;
}

GVariant *
hostd_agent_new(HostdContext *ctx, const HostdNewRequest *req, VmProgressFunc progress,
                gpointer progress_data, GError **error)
{
    if (!vm_name_validate(req->name, error))
        return NULL;

    g_autoptr(HostdNameLock) name_lock = hostd_name_lock(ctx, req->name);
    g_autofree char *dir = hostd_agent_dir(ctx, req->name);
    g_autoptr(GError) lookup_error = NULL;
    g_autoptr(virDomain) existing = hostd_libvirt_lookup(ctx->lv, req->name, &lookup_error);
    if (g_file_test(dir, G_FILE_TEST_EXISTS) || existing != NULL) {
        vm_throw(error, VM_ERROR_EXISTS, "agent '%s' already exists", req->name);
        return NULL;
    }

    const char *template_name =
        req->template_name != NULL ? req->template_name : HOSTD_DEFAULT_TEMPLATE;
    g_autoptr(VmTemplate) tpl = hostd_template_load(ctx, template_name, error);
    if (tpl == NULL)
        return NULL;
    guint cpus = req->cpus != 0 ? req->cpus : tpl->cpus;
    guint memory_mib = req->memory_mib != 0 ? req->memory_mib : tpl->memory_mib;
    guint disk_gib = req->disk_gib != 0 ? req->disk_gib : tpl->disk_gib;
    if (!hostd_check_resources(ctx, cpus, memory_mib, disk_gib, error))
        return NULL;

    g_autoptr(VmImage) image =
        vm_image_ensure(ctx->config->images_dir, tpl, FALSE, progress, progress_data, NULL, error);
    if (image == NULL)
        return NULL;
    if (image->virtual_size > (guint64)disk_gib << 30) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "--disk %u GiB is smaller than the template's image", disk_gib);
        return NULL;
    }

    hostd_progress(progress, progress_data, "creating the agent's disk and seed", -1);
    g_autoptr(HostdAgentRecord) r = g_new0(HostdAgentRecord, 1);
    r->dir = g_strdup(dir);
    r->name = g_strdup(req->name);
    r->uuid = g_uuid_string_random();
    r->template_name = g_strdup(tpl->name);
    r->phase = g_strdup(HOSTD_PHASE_CREATING);
    r->cpus = cpus;
    r->memory_mib = memory_mib;
    r->disk_gib = disk_gib;
    r->mac = hostd_random_mac();
    r->user = g_strdup(tpl->user);
    r->instance_id = g_strdup_printf("vmctl-%s", r->uuid);
    r->created = g_get_real_time() / G_USEC_PER_SEC;
    r->state_since = r->created;
    r->idle_never = tpl->idle_never;
    r->idle_pause_s = (guint)MIN(tpl->idle_pause_after_s, G_MAXUINT);
    r->idle_save_s = (guint)MIN(tpl->idle_save_after_s, G_MAXUINT);
    r->checkpoint_every_s =
        tpl->checkpoints_never ? 0 : (guint)MIN(tpl->checkpoint_every_s, G_MAXUINT);
    r->checkpoint_keep = tpl->checkpoint_keep;
    r->checkpoint_hourly = tpl->checkpoint_hourly;
    r->checkpoint_daily = tpl->checkpoint_daily;

    if (!hostd_agent_reserve(ctx, r, error) ||
        !hostd_agent_create(ctx, r, tpl, image, req->user_data, req->wait, progress, progress_data,
                            error))
        return NULL;
    return hostd_agent_to_variant(ctx, r);
}

gboolean
hostd_agent_reserve(HostdContext *ctx, HostdAgentRecord *r, GError **error)
{
    /* The record goes to disk in phase "creating" before anything else exists, so a hostd
     * killed halfway finds it at start-up and rolls the agent back. The port is chosen and
     * recorded under the context lock so two concurrent `new`s never share one. */
    g_mutex_lock(&ctx->lock);
    gboolean ok = hostd_allocate_port(ctx, 0, &r->ssh_port, error) &&
                  hostd_allocate_port(ctx, r->ssh_port, &r->backend_port, error);
    if (ok && g_mkdir_with_parents(r->dir, 0711) < 0)
        ok = vm_throw_errno(error, errno, "cannot create %s", r->dir);
    if (ok && !hostd_agent_record_save(r, error)) {
        hostd_remove_tree(r->dir, NULL);
        ok = FALSE;
    }
    g_mutex_unlock(&ctx->lock);
    return ok;
}

gboolean
hostd_agent_create(HostdContext *ctx, HostdAgentRecord *r, const VmTemplate *tpl,
                   const VmImage *image, const char *user_data, gboolean wait,
                   VmProgressFunc progress, gpointer progress_data, GError **error)
{
    /* The way out, before the VM can use it: the template's policy, or the source's on fork. */
    if (!(r->forked_from == NULL
              ? hostd_egress_agent_init(ctx, r, (const char *const *)tpl->egress_allow,
                                        (const char *const *)tpl->egress_deny, error)
              : hostd_egress_copy_policy(ctx, r->forked_from, r->name, error) &&
                    hostd_egress_agent_start(ctx, r, error))) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    g_autofree char *xml = hostd_agent_prepare_files(ctx, r, tpl, image, user_data, error);
    g_autofree char *xml_path = hostd_agent_record_path(r, HOSTD_AGENT_DOMAIN_XML);
    if (xml == NULL || !vm_file_write_atomic(xml_path, xml, -1, 0600, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }

    hostd_progress(progress, progress_data, "starting the VM", -1);
    if (!hostd_domain_define_and_start(ctx, xml, error)) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    if (wait && (!hostd_agent_wait_ssh(ctx, r, progress, progress_data, error) ||
                 !hostd_agent_wait_first_boot(ctx, r, progress, progress_data, error))) {
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }

    g_free(r->phase);
    r->phase = g_strdup(HOSTD_PHASE_READY);
    r->state_since = g_get_real_time() / G_USEC_PER_SEC;
    if (!hostd_power_attach(ctx, r, error) || !hostd_agent_record_save(r, error)) {
        hostd_power_detach(ctx, r->name);
        hostd_agent_rollback(ctx, r->name, r->dir);
        return FALSE;
    }
    return TRUE;
}

/* Loads the record of @name and looks up its domain: what every operation on an existing agent
 * starts with. */
gboolean
hostd_agent_open(HostdContext *ctx, const char *name, HostdAgentRecord **ret_record,
                 virDomainPtr *ret_dom, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return FALSE;
    g_autoptr(GError) local_error = NULL;
    virDomainPtr dom = hostd_libvirt_lookup(ctx->lv, r->name, &local_error);
    if (dom == NULL) {
        if (local_error != NULL) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        return vm_throw(error, VM_ERROR_FAILED,
                        "agent '%s' has no libvirt domain; restart hostd to repair it", r->name);
    }
    *ret_record = g_steal_pointer(&r);
    *ret_dom = dom;
    return TRUE;
}

gboolean
hostd_agent_lock_open(HostdContext *ctx, const char *name, GMutex **ret_lock,
                      HostdAgentRecord **ret_record, virDomainPtr *ret_dom, GError **error)
{
    if (!vm_name_validate(name, error))
        return FALSE;
    GMutex *lock = hostd_name_lock(ctx, name);
    if (!hostd_agent_open(ctx, name, ret_record, ret_dom, error)) {
        hostd_name_unlock(lock);
        return FALSE;
    }
    *ret_lock = lock;
    return TRUE;
}

GVariant *
hostd_agent_start(HostdContext *ctx, const char *name, gboolean wait, VmProgressFunc progress,
                  gpointer progress_data, GError **error)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &name_lock, &r, &dom, error))
        return NULL;
    if (!hostd_egress_agent_start(ctx, r, error))
        return NULL;

    if (virDomainIsActive(dom) == 1) {
        if (virDomainResume(dom) < 0)
            virResetLastError(); /* not paused: nothing to do */
    } else {
        hostd_progress(progress, progress_data, "starting the VM", -1);
        hostd_ssh_pool_forget(ctx->ssh, name);
        if (virDomainCreate(dom) < 0)
            return hostd_libvirt_throw(error, "cannot start the domain"), NULL;
        hostd_agent_mark_state_change(r);
    }
    if (wait && !hostd_agent_wait_ssh(ctx, r, progress, progress_data, error))
        return NULL;
    return hostd_agent_to_variant(ctx, r);
}

GVariant *
hostd_agent_stop(HostdContext *ctx, const char *name, gboolean force, guint timeout_s,
                 VmProgressFunc progress, gpointer progress_data, GError **error)
{
    g_autoptr(HostdNameLock) name_lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &name_lock, &r, &dom, error))
        return NULL;

    if (hostd_libvirt_is_active(dom)) {
        hostd_progress(progress, progress_data,
                       force ? "stopping the VM" : "shutting the guest down", -1);
        hostd_ssh_pool_forget(ctx->ssh, name);
        if (!hostd_libvirt_stop(ctx->lv, dom, force,
                                timeout_s != 0 ? timeout_s : HOSTD_STOP_TIMEOUT_S, error))
            return NULL;
        hostd_agent_mark_state_change(r);
    } else if (virDomainHasManagedSaveImage(dom, 0) > 0) {
        /* Stopping a saved agent drops its RAM image: the next start boots from the disk,
         * which holds everything the guest had written. */
        if (virDomainManagedSaveRemove(dom, 0) < 0)
            return hostd_libvirt_throw(error, "cannot drop the saved state"), NULL;
        hostd_agent_mark_state_change(r);
    }
    virResetLastError();
    return hostd_agent_to_variant(ctx, r);
}

gboolean
hostd_agent_rm(HostdContext *ctx, const char *name, gboolean force, GError **error)
{
    if (!vm_name_validate(name, error))
        return FALSE;
    g_autoptr(HostdNameLock) name_lock = hostd_name_lock(ctx, name);
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return FALSE;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
    if (dom != NULL && hostd_libvirt_is_active(dom) && !force)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is running; stop it first or use --force", name);
    /* A fork's disk reads its source's checkpoint images: they go only with the last fork. */
    g_autofree char *forks = hostd_fork_list(ctx, name);
    if (forks != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' has forks standing on its checkpoints (%s); remove them first",
                        name, forks);

    hostd_ssh_pool_forget(ctx->ssh, name);
    hostd_power_detach(ctx, name);
    hostd_egress_agent_stop(ctx, name);
    if (!hostd_libvirt_remove(ctx->lv, name, error))
        return FALSE;
    /* The record goes first so that a crash halfway leaves no half-agent that looks whole. */
    g_autofree char *record = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);
    if (g_unlink(record) < 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot remove %s", record);
    return hostd_remove_tree(r->dir, error);
}

GVariant *
hostd_agent_info(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return NULL;
    return hostd_agent_to_variant(ctx, r);
}

GVariant *
hostd_agent_list(HostdContext *ctx, GError **error)
{
    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return NULL;
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < names->len; i++) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, names->pdata[i], NULL);
        if (r != NULL)
            g_variant_builder_add_value(&b, hostd_agent_to_variant(ctx, r));
    }
    return g_variant_builder_end(&b);
}

char *
hostd_agent_ssh_config(HostdContext *ctx, const char *name, char **ret_path, char **ret_host,
                       GError **error)
{
    if (name != NULL) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
        if (r == NULL)
            return NULL;
        if (ret_path != NULL)
            *ret_path = hostd_agent_record_path(r, HOSTD_AGENT_SSH_CONFIG);
        if (ret_host != NULL)
            *ret_host = g_strdup_printf("vmctl-%s", name);
        return hostd_ssh_config_stanza(r);
    }

    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return NULL;
    g_autoptr(GString) all = g_string_new(NULL);
    for (guint i = 0; i < names->len; i++) {
        g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, names->pdata[i], NULL);
        if (r == NULL)
            continue;
        g_autofree char *stanza = hostd_ssh_config_stanza(r);
        if (all->len > 0)
            g_string_append_c(all, '\n');
        g_string_append(all, stanza);
    }
    return g_string_free(g_steal_pointer(&all), FALSE);
}

gboolean
hostd_agent_exec(HostdContext *ctx, const char *name, const HostdExecRequest *request,
                 int client_fd, GError **error)
{
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    {
        /* An exec is a way in: it wakes a paused or saved agent, as a connection would. */
        g_autoptr(HostdNameLock) lock = NULL;
        if (!vm_name_validate(name, error))
            return FALSE;
        lock = hostd_name_lock(ctx, name);
        if (!hostd_agent_open(ctx, name, &r, &dom, error))
            return FALSE;
        const char *state = hostd_libvirt_state_name(dom);
        if ((g_str_equal(state, "paused") || g_str_equal(state, "saved")) &&
            !hostd_power_wake_locked(ctx, r, dom, error))
            return FALSE;
        state = hostd_libvirt_state_name(dom);
        if (!g_str_equal(state, "running"))
            return vm_throw(error, VM_ERROR_BAD_STATE,
                            "agent '%s' is %s; start it with: vmctl start %s", name, state, name);
    }

    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    hostd_ssh_target_init(&target, r, &identity, &known_hosts);
    hostd_power_session_begin(ctx, name);
    gboolean ok = hostd_ssh_exec(ctx->ssh, &target, request, client_fd, error);
    hostd_power_session_end(ctx, name);
    return ok;
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
    g_autoptr(GPtrArray) names = hostd_state_list_agents(ctx->state, error);
    if (names == NULL)
        return FALSE;
    g_autoptr(GString) users = g_string_new(NULL);
    for (guint i = 0; i < names->len; i++) {
        g_autofree char *dir = hostd_agent_dir(ctx, names->pdata[i]);
        g_autoptr(HostdAgentRecord) r = hostd_agent_record_load(dir, NULL);
        if (r != NULL && g_str_equal(r->template_name, template_name))
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
    return g_strdup(image->dir);
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
                hostd_remove_tree(dir, NULL);
                g_ptr_array_add(notes, g_strdup_printf("removed leftovers of '%s'", name));
            } else {
                g_ptr_array_add(
                    notes, g_strdup_printf("skipping agent '%s': %s", name, local_error->message));
            }
            continue;
        }
        if (g_str_equal(r->phase, HOSTD_PHASE_CREATING)) {
            hostd_agent_rollback(ctx, name, dir);
            g_ptr_array_add(notes,
                            g_strdup_printf("rolled back unfinished creation of '%s'", name));
            continue;
        }
        g_autoptr(GError) egress_error = NULL;
        if (!hostd_egress_agent_start(ctx, r, &egress_error))
            g_ptr_array_add(notes, g_strdup_printf("agent '%s': no egress proxy: %s", name,
                                                   egress_error->message));
        g_autoptr(virDomain) dom = hostd_libvirt_lookup(ctx->lv, name, NULL);
        if (dom != NULL) {
            g_autoptr(GError) checkpoint_error = NULL;
            if (!hostd_checkpoint_reconcile(ctx, r, notes, &checkpoint_error))
                g_ptr_array_add(notes,
                                g_strdup_printf("agent '%s': %s", name, checkpoint_error->message));
            g_ptr_array_add(
                notes, g_strdup_printf("agent '%s' is %s", name, hostd_libvirt_state_name(dom)));
            continue;
        }
        g_autofree char *xml_path = g_build_filename(dir, HOSTD_AGENT_DOMAIN_XML, NULL);
        g_autofree char *xml = NULL;
        if (!g_file_get_contents(xml_path, &xml, NULL, NULL)) {
            g_ptr_array_add(notes,
                            g_strdup_printf("agent '%s' has no domain and no saved XML", name));
            continue;
        }
        g_autoptr(virDomain) defined = virDomainDefineXML(ctx->lv->conn, xml);
        if (defined == NULL) {
            g_autoptr(GError) define_error = NULL;
            hostd_libvirt_throw(&define_error, "cannot redefine");
            g_ptr_array_add(notes, g_strdup_printf("agent '%s': %s", name, define_error->message));
            continue;
        }
        g_ptr_array_add(notes,
                        g_strdup_printf("redefined the domain of agent '%s' (stopped)", name));
    }
    return TRUE;
}
