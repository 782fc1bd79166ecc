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

/* The same, keeping the first @max_stdout bytes of its stdout in *ret_stdout when not NULL
 * (newly allocated; the rest is read and dropped: the guest may send any amount). */
gboolean hostd_agent_run_output(HostdContext *ctx, const HostdAgentRecord *r, char **argv,
                                int stdin_fd, gsize max_stdout, int *ret_status,
                                GBytes **ret_stdout, char **ret_stderr, GError **error);

/* After the first boot: waits until cloud-init has finished inside the agent. */
gboolean hostd_agent_wait_first_boot(HostdContext *ctx, const HostdAgentRecord *r,
                                     VmProgressFunc progress, gpointer progress_data,
                                     GError **error);

/* How long hostd waits for one answer of a guest agent. */
#define HOSTD_GUEST_AGENT_TIMEOUT_S 5

/* Bounds every later guest agent call on @dom by HOSTD_GUEST_AGENT_TIMEOUT_S. Can't fail (a
 * libvirt that cannot set it keeps its own). */
void hostd_guest_agent_bound(virDomainPtr dom);

/* Sets the guest's clock to the host's through the guest agent (after a wake or a memory
 * restore the guest's clock lags by the time it slept): `date -s` through guest-exec, else
 * guest-set-time. Asked again until the agent answers, for at most 10 s in all; a guest whose
 * agent does not answer is logged through hostd_context_log(), not an error. */
void hostd_guest_sync_clock(HostdContext *ctx, virDomainPtr dom, const char *name);

typedef struct _HostdClockSync HostdClockSync;

/* The same on a thread of its own, so that what the caller does next (an SSH connection, a
 * channel open) overlaps with the guest agent's round trips; hostd_guest_sync_clock_finish()
 * waits for it. @dom is referenced. Can't fail: without a thread to spare it sets the clock
 * before it returns. */
HostdClockSync *hostd_guest_sync_clock_begin(HostdContext *ctx, virDomainPtr dom, const char *name);

/* Waits until the clock of hostd_guest_sync_clock_begin() is set (or given up), then frees
 * @sync. NULL is accepted. */
void hostd_guest_sync_clock_finish(HostdClockSync *sync);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdClockSync, hostd_guest_sync_clock_finish)

G_END_DECLS
