/* Talking to a running agent's guest: waiting for SSH, running a command over the held libssh
 * session, the first boot's cloud-init, the guest clock through the guest agent. Every byte from
 * the guest is untrusted: exit statuses and stderr are bounded here. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Fills @t with @r's SSH target (hostd's backend port, the agent's key and pinned host key);
 * *identity and *known_hosts receive the paths @t points at (newly allocated, the caller frees
 * them after @t's last use). Can't fail. */
void hostd_guest_ssh_target(HostdSshTarget *t, const HostdAgentRecord *r, char **identity,
                            char **known_hosts);

/* Waits until the agent answers SSH, reporting progress; on timeout the error carries the
 * console's last lines. */
gboolean hostd_agent_wait_ssh(HostdContext *ctx, const HostdAgentRecord *r, VmProgressFunc progress,
                              gpointer progress_data, GError **error);

/* Runs @argv in the running agent (as its user) with @stdin_fd (or -1: no input) as its input,
 * and returns its exit status; the first few KiB of its stderr go to *ret_stderr when not NULL
 * (newly allocated). Fails with VM_ERROR_SSH / VM_ERROR_IO when it could not run it. */
gboolean hostd_agent_run(HostdContext *ctx, const HostdAgentRecord *r, char **argv, int stdin_fd,
                         int *ret_status, char **ret_stderr, GError **error);

/* After the first boot: waits until cloud-init has finished inside the agent. */
gboolean hostd_agent_wait_first_boot(HostdContext *ctx, const HostdAgentRecord *r,
                                     VmProgressFunc progress, gpointer progress_data,
                                     GError **error);

/* Sets the guest's clock to the host's through the guest agent (after a wake or a memory
 * restore the guest's clock lags by the time it slept). A few tries, each bounded; a guest whose
 * agent does not answer is logged through hostd_context_log(), not an error. */
void hostd_guest_sync_clock(HostdContext *ctx, virDomainPtr dom, const char *name);

G_END_DECLS
