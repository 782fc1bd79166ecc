/* Each agent's SSH client in a worker process of its own (vm-ssh-worker, hostd-ssh-wire.h), so
 * that libssh parses no byte a guest sent inside hostd: the worker runs as the id hostd gives it
 * (hostd-confine.h: one of its own, not its QEMU's), with no capabilities,
 * no_new_privs and a seccomp filter, and holds only that agent's key, pinned host key and
 * sessions. hostd hands it each request with the vmctl client's socket (or a forwarded port's
 * connection), so an exec's bytes pass between the client and the worker without hostd.
 *
 * A worker starts on its agent's first wait, exec or forwarded connection and serves it until
 * hostd_ssh_pool_forget() (stop, rm, a new port) or until the target it was started for changes;
 * one that died is reaped at once and replaced on the next request, and one that misses the
 * deadline of an answer (stopped, looping) is killed and replaced too. Requests of one agent run
 * side by side, and no wait on one agent's worker holds a lock another agent's request needs. */
#pragma once

#include <glib.h>

#include "hostd-ssh.h"

G_BEGIN_DECLS

/* Whom @agent's worker runs as (@agent_id: the target's, 0 for none): with *@ret_change (hostd
 * is root) *@ret_uid and *@ret_gid, else hostd's own user, confined all the same. Called before
 * each start of a worker; a failure fails the request with its error. */
typedef gboolean (*HostdSshWorkerUserFunc)(gpointer data, const char *agent, guint agent_id,
                                           gboolean *ret_change, guint *ret_uid, guint *ret_gid,
                                           GError **error);

typedef struct {
    const char *program; /* vm-ssh-worker */
    /* Whom each worker runs as: @worker_user where set; else, with @change_user (hostd is
     * root), @uid and @gid for every agent; else hostd's own user. */
    HostdSshWorkerUserFunc worker_user;
    gpointer worker_user_data;
    gboolean change_user;
    guint uid, gid;
    /* The deadline of each answer a worker owes (0: 10 s): its "ready" once started, a
     * sleep's or a resume's end, taking an exec's client or a forwarded connection, and an
     * exec's or forwarded connection's end once its client hung up; a wait for the guest's
     * sshd or a new session over the virtio port gets its own time on top. Past it the worker is
     * killed and forgotten (the next request starts another) and the request fails with
     * VM_ERROR_SSH saying so. While a command runs (or a forwarded connection is open) the
     * worker is asked every @ping_interval_ms (0: 30 s) whether it answers, within the same
     * deadline. */
    guint answer_timeout_ms, ping_interval_ms;
    /* What a sleep may take on top of the deadline (0: 30 s): the worker waits that long for a
     * spare shell on its way before it answers (hostd-ssh.c), and a worker killed meanwhile
     * loses the session held over the virtio port that the sleep is there to keep. */
    guint sleep_grace_ms;
} HostdSshWorkersConfig;

typedef struct _HostdSshWorkers HostdSshWorkers;

/* Makes the set of workers, none running yet. Can't fail. */
HostdSshWorkers *hostd_ssh_workers_new(const HostdSshWorkersConfig *config);

/* Ends every worker (their requests fail) and starts none any more: a request then fails at
 * once with VM_ERROR_SSH. NULL: no-op. */
void hostd_ssh_workers_close(HostdSshWorkers *workers);

/* Ends every worker (their requests fail) and frees @workers. NULL: no-op. */
void hostd_ssh_workers_free(HostdSshWorkers *workers);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshWorkers, hostd_ssh_workers_free)

/* The delegate (hostd-ssh.h) that runs a pool's waits and execs in the workers of the
 * HostdSshWorkers given as its data. Besides the contract of hostd_ssh_exec(), an exec fails
 * with VM_ERROR_SSH when the worker could not start or ended before it answered. */
extern const HostdSshDelegate hostd_ssh_workers_delegate;

/* The pid of @agent's running worker, 0 when none runs. Can't fail. */
GPid hostd_ssh_workers_get_pid(HostdSshWorkers *workers, const char *agent);

/* Where hostd finds vm-ssh-worker: $VM_SSH_WORKER, else next to hostd in its build tree when
 * run from there, else the installed one. Can't fail. */
char *hostd_ssh_worker_path(void);

G_END_DECLS
