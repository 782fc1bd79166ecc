/* hostd's side of the SSH session over each agent's virtio port (hostd-ssh-serial.h): finding
 * the port's socket in the live domain, connecting to it as root, and handing the connection to
 * the agent's SSH worker, which holds the session. Nothing here fails an operation: without the
 * session an agent's execs take the TCP way, as before it. */
#pragma once

#include <libvirt/libvirt.h>

#include "hostd-context.h"

G_BEGIN_DECLS

/* Once @target's agent (running as @dom) answers SSH: makes its held session in the background,
 * unless one was made for this run of its QEMU (a cold start makes another). Logs why when it
 * cannot. @target is copied. */
void hostd_serial_ensure(HostdContext *ctx, const HostdSshTarget *target, virDomainPtr dom);

/* Right after @dom was restored paused, before it runs: hands the new QEMU's port to the session
 * @target's worker holds, so that the session goes on. FALSE when it holds none or the port could
 * not be reached (then hostd_serial_ensure() makes one once the guest runs). */
gboolean hostd_serial_resume(HostdContext *ctx, const HostdSshTarget *target, virDomainPtr dom);

/* Forgets a removed agent's session marks (ctx->serial_runs), so that no name hostd ever served
 * stays in the table. */
extern const HostdComponent hostd_serial_component;

G_END_DECLS
