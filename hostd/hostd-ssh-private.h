/* Internals of the ssh module: what hostd-ssh.c shares with the module's other file
 * (hostd-ssh-forward.c) and with its unit tests only. */
#pragma once

#include <libssh/libssh.h>

#include "hostd-ssh.h"

G_BEGIN_DECLS

/* Number of SSH connections @pool has opened since it was created, whatever became of them.
 * Tests use it to see that an exec reused a pooled session. Can't fail. */
guint hostd_ssh_pool_get_connections_opened(HostdSshPool *pool);

/* Number of idle sessions @pool holds for @agent. Can't fail. */
guint hostd_ssh_pool_get_idle_count(HostdSshPool *pool, const char *agent);

/* Number of execs @pool ran on a spare shell (hostd-ssh.c's SPARE_SCRIPT) since it was
 * created. Can't fail. */
guint hostd_ssh_pool_get_spares_used(HostdSshPool *pool);

/* Number of @agent's idle sessions that hold a spare shell. Can't fail. */
guint hostd_ssh_pool_get_spare_count(HostdSshPool *pool, const char *agent);

/* Replaces the script a spare runs (tests: one a login shell refuses, as a shell other than
 * bash would). @script must outlive @pool. Can't fail. */
void hostd_ssh_pool_set_spare_script(HostdSshPool *pool, const char *script);

/* The exit status hostd reports for a command killed by the signal named @name as SSH names it
 * ("TERM", "KILL", without "SIG"): 128 + the Linux signal number, or 255 for a name it does
 * not know. Can't fail. */
int hostd_ssh_signal_exit_status(const char *name);

/* The module's one translator of libssh errors: "@what: <libssh's last error on @session>" in
 * VM_ERROR_SSH. Returns FALSE (a throw helper). */
gboolean hostd_ssh_throw(GError **error, ssh_session session, const char *what);

/* A connected, authenticated session to @target's agent for the caller's use alone: an idle one
 * of the pool unless @fresh, else a new one (which waits for one of the agent's handshake slots,
 * as an exec's does). *@ret_generation is what hostd_ssh_session_give() needs. Fails like a new
 * exec's connection: VM_ERROR_SSH, VM_ERROR_BUSY (no slot came free). */
ssh_session hostd_ssh_session_take(HostdSshPool *pool, const HostdSshTarget *target, gboolean fresh,
                                   guint64 *ret_generation, GError **error);

/* Gives back a session hostd_ssh_session_take() returned, every channel of it freed: the pool
 * keeps it when it is still connected, has room, and @agent's sessions were not forgotten
 * meanwhile; else it is closed. NULL @session: no-op. Can't fail. */
void hostd_ssh_session_give(HostdSshPool *pool, const char *agent, guint64 generation,
                            ssh_session session);

/* Connects to @target over @fd (taken over: a socket whose peer carries the bytes to the guest's
 * sshd, hostd-ssh-serial.h) within @timeout_s, and keeps the session as @target's held one: never
 * closed as surplus, kept by hostd_ssh_pool_sleep(), given a spare. Fails as a connection does
 * (VM_ERROR_SSH, the host key checked as always). */
gboolean hostd_ssh_pool_hold(HostdSshPool *pool, const HostdSshTarget *target, int fd,
                             guint timeout_s, GError **error);

/* @pool's delegate (hostd_ssh_pool_set_delegate()) and its data in *@ret_data; NULL when it
 * has none. Can't fail. */
const HostdSshDelegate *hostd_ssh_pool_get_delegate(HostdSshPool *pool, gpointer *ret_data);

G_END_DECLS
