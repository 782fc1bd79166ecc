/* hostd's side of the session over each agent's virtio port (hostd-serial.h). */
#include "hostd-serial.h"

#include <unistd.h>

#include "hostd-guest-agent.h"
#include "hostd-libvirt.h"
#include "hostd-ssh-worker.h"
#include "vm-domain-read.h"
#include "vm-error.h"
#include "vm-util.h"

/* Restarting the guest's service ends an sshd of an earlier session still on the port (one whose
 * hostd went away): a process start or two, and the ending of the old ones. */
#define SERIAL_RESTART_TIMEOUT_MS 30000

/* What a held session is made for: this run of the agent's QEMU (its domain id) with this run
 * of its SSH worker (its pid: a worker replaced, after a forget or a crash, holds none). */
static char *
serial_run_key(HostdContext *ctx, const char *name, virDomainPtr dom)
{
    return g_strdup_printf("%u/%d", virDomainGetID(dom),
                           (int)hostd_ssh_workers_get_pid(ctx->ssh_workers, name));
}

/* The claim of a session on its way for this run of the QEMU, whichever worker it ends up in:
 * the worker may not run yet (none after a forget), and the attach's request starts it. */
static char *
serial_attaching_key(virDomainPtr dom)
{
    return g_strdup_printf("%u/attaching", virDomainGetID(dom));
}

/* Marks @dom's run as getting its session (serial_attaching_key()); FALSE when @run already has
 * one, or one is on its way for this QEMU. Keyed by the worker alone, an attach begun with no
 * worker running would be claimed for pid 0, and the first exec after it, in the worker the
 * attach started, would attach again: the guest's service started anew under the session just
 * made, and every command running on it cut off ("Socket error: disconnected"). */
static gboolean
serial_claim_run(HostdContext *ctx, const char *name, const char *run, virDomainPtr dom)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    g_autofree char *attaching = serial_attaching_key(dom);
    const char *claimed = g_hash_table_lookup(ctx->serial_runs, name);

    if (g_strcmp0(claimed, run) == 0 || g_strcmp0(claimed, attaching) == 0)
        return FALSE;
    g_hash_table_insert(ctx->serial_runs, g_strdup(name), g_steal_pointer(&attaching));
    return TRUE;
}

/* The attach of @dom's run ended: held (@run: the worker that holds it, serial_run_key() read
 * after the session was held), or failed (@run NULL: the next hostd_serial_ensure() tries
 * again). A later claim (another QEMU) is left as it is. */
static void
serial_settle_run(HostdContext *ctx, const char *name, unsigned int dom_id, const char *run)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);
    g_autofree char *attaching = g_strdup_printf("%u/attaching", dom_id);

    if (g_strcmp0(g_hash_table_lookup(ctx->serial_runs, name), attaching) != 0)
        return;
    if (run != NULL)
        g_hash_table_insert(ctx->serial_runs, g_strdup(name), g_strdup(run));
    else
        g_hash_table_remove(ctx->serial_runs, name);
}

/* The path of @dom's port of hostd's sshd; NULL with an error when it has none. */
static char *
serial_path(virDomainPtr dom, GError **error)
{
    g_autofree char *xml = virDomainGetXMLDesc(dom, 0);
    g_autoptr(GError) local_error = NULL;
    char *path;

    if (xml == NULL)
        return hostd_libvirt_throw(error, "cannot read the agent's definition"), NULL;
    path = vm_domain_read_ssh_channel(xml, &local_error);
    if (path == NULL && local_error != NULL)
        g_propagate_error(error, g_steal_pointer(&local_error));
    else if (path == NULL)
        vm_throw(error, VM_ERROR_SSH, "the VM has no virtio port for SSH");
    return path;
}

/* A connection to the port's socket at @path; -1 with an error when it cannot be reached or is
 * refused. Its directory is the QEMU user's (libvirt's channel directory), which could put a
 * symbolic link to any socket of root's there: the connection goes to the socket file itself. */
static int
serial_connect(const char *path, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    int fd = vm_unix_connect_nofollow(path, 0, &local_error);

    if (fd < 0)
        g_propagate_prefixed_error(error, g_steal_pointer(&local_error), "the SSH port: ");
    return fd;
}

typedef struct {
    HostdContext *ctx;
    HostdSshTarget target; /* its strings are the fields below */
    char *agent, *host, *user, *identity_path, *known_hosts_path;
    char *path; /* the port's socket, read from the domain by hostd_serial_ensure() */
    virDomainPtr dom;
} SerialAttach;

/* In the guest: the service that starts sshd on the port, started again so that no sshd of an
 * earlier session holds the port; then the new session. */
static gboolean
serial_attach(SerialAttach *a, GError **error)
{
    static const char *const restart[] = {"/bin/systemctl", "restart", "vmctl-ssh-serial.service",
                                          NULL};
    int status = 0;
    int fd;

    if (!hostd_guest_agent_exec(a->dom, restart, NULL, SERIAL_RESTART_TIMEOUT_MS, &status, NULL,
                                error))
        return FALSE;
    if (status != 0)
        return vm_throw(error, VM_ERROR_SSH,
                        "the guest has no vmctl-ssh-serial service (exit status %d)", status);
    fd = serial_connect(a->path, error);
    return fd >= 0 && hostd_ssh_pool_serial(a->ctx->ssh, &a->target, fd, FALSE, error);
}

static gpointer
serial_attach_thread(gpointer data)
{
    SerialAttach *a = data;
    g_autoptr(GError) error = NULL;

    if (serial_attach(a, &error)) {
        g_autofree char *run = serial_run_key(a->ctx, a->agent, a->dom);

        serial_settle_run(a->ctx, a->agent, virDomainGetID(a->dom), run);
        if (a->ctx->debug)
            hostd_context_log(a->ctx, "agent '%s': SSH session over the virtio port held",
                              a->agent);
    } else {
        serial_settle_run(a->ctx, a->agent, virDomainGetID(a->dom), NULL);
        hostd_context_log(a->ctx, "agent '%s': no SSH session over the virtio port (%s)", a->agent,
                          error->message);
    }
    g_free(a->agent);
    g_free(a->host);
    g_free(a->user);
    g_free(a->identity_path);
    g_free(a->known_hosts_path);
    virDomainFree(a->dom);
    g_free(a->path);
    /* The last use of the context: hostd_context_free() waits for it. */
    g_mutex_lock(&a->ctx->lock);
    a->ctx->serial_attaching--;
    g_cond_broadcast(&a->ctx->serial_attached);
    g_mutex_unlock(&a->ctx->lock);
    g_free(a);
    return NULL;
}

void
hostd_serial_ensure(HostdContext *ctx, const HostdSshTarget *target, virDomainPtr dom)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *path = NULL;
    g_autofree char *run = NULL;
    SerialAttach *a;

    if (ctx->ssh_workers == NULL || virDomainGetID(dom) == (unsigned int)-1)
        return;
    run = serial_run_key(ctx, target->agent, dom);
    if (!serial_claim_run(ctx, target->agent, run, dom))
        return;
    path = serial_path(dom, &error);
    if (path == NULL) {
        /* A VM defined before the port existed: its next definition has it. */
        if (ctx->debug)
            hostd_context_log(ctx, "agent '%s': no SSH session over the virtio port (%s)",
                              target->agent, error->message);
        return;
    }
    a = g_new0(SerialAttach, 1);
    a->ctx = ctx;
    a->target = *target;
    a->target.agent = a->agent = g_strdup(target->agent);
    a->target.host = a->host = g_strdup(target->host);
    a->target.user = a->user = g_strdup(target->user);
    a->target.identity_path = a->identity_path = g_strdup(target->identity_path);
    a->target.known_hosts_path = a->known_hosts_path = g_strdup(target->known_hosts_path);
    a->target.identity_pem = a->target.host_key = NULL;
    a->path = g_steal_pointer(&path);
    a->dom = dom;
    virDomainRef(dom);
    g_mutex_lock(&ctx->lock);
    ctx->serial_attaching++;
    g_mutex_unlock(&ctx->lock);
    g_thread_unref(g_thread_new("ssh-serial-attach", serial_attach_thread, a));
}

gboolean
hostd_serial_resume(HostdContext *ctx, const HostdSshTarget *target, virDomainPtr dom)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *run = NULL;
    g_autofree char *path = NULL;
    gboolean refused = FALSE;
    int fd = -1;

    if (ctx->ssh_workers == NULL)
        return FALSE;
    path = serial_path(dom, &error);
    if (path != NULL) {
        fd = serial_connect(path, &error);
        /* A refused socket is an attack from the QEMU user's side: always said. */
        refused = fd < 0 && g_error_matches(error, VM_ERROR, VM_ERROR_FAILED);
    }
    if (fd < 0 || !hostd_ssh_pool_serial(ctx->ssh, target, fd, TRUE, &error)) {
        if (ctx->debug || refused)
            hostd_context_log(ctx,
                              "agent '%s': the SSH session over the virtio port did not carry "
                              "over (%s)",
                              target->agent, error->message);
        return FALSE;
    }
    run = serial_run_key(ctx, target->agent, dom);
    g_mutex_lock(&ctx->lock);
    g_hash_table_insert(ctx->serial_runs, g_strdup(target->agent), g_steal_pointer(&run));
    g_mutex_unlock(&ctx->lock);
    return TRUE;
}

static void
serial_agent_removed(HostdContext *ctx, const char *name)
{
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&ctx->lock);

    g_hash_table_remove(ctx->serial_runs, name);
}

const HostdComponent hostd_serial_component = {
    .name = "serial",
    .agent_removed = serial_agent_removed,
};
