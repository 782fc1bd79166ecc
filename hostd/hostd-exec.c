#include "hostd-exec.h"

#include "hostd-agent.h"
#include "hostd-booting.h"
#include "hostd-guest.h"
#include "hostd-metrics.h"
#include "hostd-power.h"
#include "hostd-serial.h"
#include "vm-error.h"
#include "vm-name.h"

/* The exec itself, marking its phases in request->trace. */
static gboolean hostd_agent_exec_traced(HostdContext *ctx, const char *name,
                                        const HostdExecRequest *request, int client_fd,
                                        GError **error);

gboolean
hostd_agent_exec(HostdContext *ctx, const char *name, const HostdExecRequest *request_in,
                 int client_fd, GError **error)
{
    HostdExecRequest traced = *request_in;
    const HostdExecRequest *request = &traced;
    VmTrace trace = {0};

    /* With --debug, where the time went: one line per exec in hostd's log. */
    if (ctx->debug) {
        vm_trace_init(&trace);
        traced.trace = &trace;
    }
    gboolean ok = hostd_agent_exec_traced(ctx, name, request, client_fd, error);
    if (traced.trace != NULL) {
        g_autofree char *what = g_strdup_printf("exec %s", name);
        g_autofree char *text = vm_trace_finish(&trace, what);
        hostd_context_log(ctx, "trace: %s", text);
    }
    return ok;
}

/* Waits for the guest clock a wake is setting (HostdExecRequest.before_command). */
static void
exec_clock_wait(gpointer data)
{
    HostdClockSync **clock = data;

    g_clear_pointer(clock, hostd_guest_sync_clock_finish);
}

static gboolean
hostd_agent_exec_traced(HostdContext *ctx, const char *name, const HostdExecRequest *request,
                        int client_fd, GError **error)
{
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    g_autoptr(HostdClockSync) clock = NULL;
    HostdExecRequest woken = *request;

    /* An agent hostd booted again (a crash restart) is waited for, as a wake is. */
    if (!hostd_booting_wait(ctx, name, error))
        return FALSE;
    vm_trace_mark(request->trace, "boot waited for");
    {
        /* An exec is a way in: it wakes a paused or saved agent, as a connection would. */
        g_autoptr(HostdNameLock) lock = NULL;
        if (!vm_name_validate(name, error))
            return FALSE;
        lock = hostd_name_lock(ctx, name);
        if (!hostd_agent_open(ctx, name, &r, &dom, error))
            return FALSE;
        const char *state = hostd_libvirt_state_name(dom);
        vm_trace_mark(request->trace, "lock and open");
        if (g_str_equal(state, "paused") || g_str_equal(state, "saved")) {
            if (!hostd_power_wake_traced(ctx, r, dom, request->trace, &clock, error))
                return FALSE;
            /* The clock is set while the SSH connection is made, and before the command. */
            woken.before_command = exec_clock_wait;
            woken.before_command_data = &clock;
        }
        state = hostd_libvirt_state_name(dom);
        if (!g_str_equal(state, "running"))
            return vm_throw(error, VM_ERROR_BAD_STATE,
                            "agent '%s' is %s; start it with: vmctl start %s", name, state, name);
    }
    hostd_metrics_exec(ctx->metrics, name);

    g_autofree char *identity = NULL, *known_hosts = NULL;
    HostdSshTarget target;
    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    hostd_power_session_begin(ctx, name);
    gboolean ok = hostd_ssh_exec(ctx->ssh, &target, &woken, client_fd, error);
    hostd_power_session_end(ctx, name);
    /* After the command, not before: under emulation the session's handshake takes the guest's
     * CPU. An agent running since before hostd started, or whose session did not carry over a
     * wake, gets one here. */
    if (ok)
        hostd_serial_ensure(ctx, &target, dom);
    return ok;
}
