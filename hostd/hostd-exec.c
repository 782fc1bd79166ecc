#include "hostd-exec.h"

#include "hostd-agent.h"
#include "hostd-guest.h"
#include "hostd-power.h"
#include "vm-error.h"
#include "vm-name.h"

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
    hostd_guest_ssh_target(&target, r, &identity, &known_hosts);
    hostd_power_session_begin(ctx, name);
    gboolean ok = hostd_ssh_exec(ctx->ssh, &target, request, client_fd, error);
    hostd_power_session_end(ctx, name);
    return ok;
}
