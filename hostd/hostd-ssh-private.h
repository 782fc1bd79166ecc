/* Internals of hostd-ssh.c that only tests may see. */
#pragma once

#include "hostd-ssh.h"

G_BEGIN_DECLS

/* Number of SSH connections @pool has opened since it was created, whatever became of them.
 * Tests use it to see that an exec reused a pooled session. Can't fail. */
guint hostd_ssh_pool_get_connections_opened(HostdSshPool *pool);

/* Number of idle sessions @pool holds for @agent. Can't fail. */
guint hostd_ssh_pool_get_idle_count(HostdSshPool *pool, const char *agent);

/* The exit status hostd reports for a command killed by the signal named @name as SSH names it
 * ("TERM", "KILL", without "SIG"): 128 + the Linux signal number, or 255 for a name it does
 * not know. Can't fail. */
int hostd_ssh_signal_exit_status(const char *name);

G_END_DECLS
