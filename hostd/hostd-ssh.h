/* SSH from hostd to agents (libssh): readiness checks and command execution.
 *
 * hostd keeps at most a few authenticated sessions per agent in a pool so that an exec costs
 * one channel open, not a handshake. Every connection checks the guest's host key strictly
 * against the agent's known_hosts file (written by hostd from the key it generated): there is
 * no trust-on-first-use path.
 */
#pragma once

#include <gio/gio.h>

#include "vm-trace.h"

G_BEGIN_DECLS

typedef struct {
    const char *agent; /* pool key */
    const char *host;  /* "127.0.0.1" */
    guint port;
    const char *user;
    const char *identity_path;    /* private key, OpenSSH format */
    const char *known_hosts_path; /* one line: "[127.0.0.1]:PORT ssh-ed25519 AAAA..." */
    /* In place of the files above where set (an SSH worker, which may read no file of hostd's):
     * the private key's text, and the pinned host key as "ssh-ed25519 AAAA...". */
    const char *identity_pem;
    const char *host_key;
    guint agent_id; /* the agent's id (its QEMU's uid), which its SSH worker's id is derived
                     * from (hostd-confine.h), never run as; 0: the agent has none */
} HostdSshTarget;

typedef struct HostdSshPool HostdSshPool;

/* Creates an empty pool. Thread-safe; can't fail. */
HostdSshPool *hostd_ssh_pool_new(void);
/* Disconnects and frees every session. Accepts NULL. */
void hostd_ssh_pool_free(HostdSshPool *pool);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshPool, hostd_ssh_pool_free)

/* Drops every pooled session of @agent (after stop, rm, port change). Can't fail. */
void hostd_ssh_pool_forget(HostdSshPool *pool, const char *agent);

/* Before @agent's QEMU ends for a save: drops its sessions but the one over its virtio port
 * (hostd-ssh-serial.h), which the guest's memory keeps; with none held, as forget. Can't fail. */
void hostd_ssh_pool_sleep(HostdSshPool *pool, const char *agent);

/* Hands @fd (taken over), hostd's connection to @target's virtio port of sshd, to the SSH
 * worker: with @resume, a restored QEMU's port for the session the worker holds (at once; fails
 * with VM_ERROR_SSH when it holds none); else a new session is made over it and held (as long as
 * the guest takes to start its sshd on the port, at most a few minutes). Fails with VM_ERROR_SSH
 * without a worker, or when the session could not be made. */
gboolean hostd_ssh_pool_serial(HostdSshPool *pool, const HostdSshTarget *target, int fd,
                               gboolean resume, GError **error);

/* Polls until an authenticated session to @target succeeds (each attempt with a short connect
 * and banner timeout, since the forwarded port accepts TCP before sshd listens), then keeps that
 * session in the pool. Fails with VM_ERROR_TIMEOUT after @timeout_s, VM_ERROR_SSH when the host
 * key does not match (never retried: that is an attack or a bug), VM_ERROR_CANCELLED. */
gboolean hostd_ssh_wait_ready(HostdSshPool *pool, const HostdSshTarget *target, guint timeout_s,
                              GCancellable *cancellable, GError **error);

/* The command to run and how. */
typedef struct {
    char **argv;     /* quoted for the remote shell by the callee */
    char **env;      /* "K=V", or NULL */
    const char *cwd; /* or NULL */
    gboolean tty;
    const char *term; /* with tty; NULL = "xterm-256color" */
    guint cols, rows; /* with tty; 0 = 80x24 */
    VmTrace *trace;   /* marks its phases here when not NULL */
    /* Called once right before the command is sent, when not NULL: waits for what must hold
     * when the command starts (the guest clock after a wake) while the connection was made. */
    void (*before_command)(gpointer data);
    gpointer before_command_data;
} HostdExecRequest;

/* Where the sessions of hostd_ssh_wait_ready() and hostd_ssh_exec() live when not in @pool
 * itself: each call is handed to the delegate with the same arguments and contract, and
 * hostd_ssh_pool_forget() tells it too. hostd's delegate runs them in a confined worker process
 * per agent (hostd-ssh-worker.h), so that libssh parses no guest byte in hostd. */
typedef struct {
    gboolean (*wait_ready)(gpointer data, const HostdSshTarget *target, guint timeout_s,
                           GCancellable *cancellable, GError **error);
    gboolean (*exec)(gpointer data, const HostdSshTarget *target, const HostdExecRequest *request,
                     int client_fd, GError **error);
    void (*forget)(gpointer data, const char *agent);
    /* Carries the connected socket @fd (the caller's still; the delegate uses its own copy) to
     * @guest_port on the guest's loopback until either side ends it, calling @activity (with
     * @activity_data) now and then while bytes move; FALSE with why it could not be carried.
     * NULL: forwarded ports are carried by the pool's own sessions (hostd-ssh-forward.h). */
    gboolean (*forward)(gpointer data, const HostdSshTarget *target, guint guest_port, int fd,
                        void (*activity)(gpointer activity_data), gpointer activity_data,
                        GError **error);
    /* hostd_ssh_pool_serial() and hostd_ssh_pool_sleep() (NULL: not done; forget for sleep). */
    gboolean (*serial)(gpointer data, const HostdSshTarget *target, int fd, gboolean resume,
                       GError **error);
    void (*sleep)(gpointer data, const char *agent);
} HostdSshDelegate;

/* Where a pool's connections come from when it does not connect() itself: a connected socket
 * to @target's host and port (the caller's to close, or to hand libssh), or -1 with @error set
 * (the pool takes that as a guest not up yet, and a readiness wait tries again). */
typedef int (*HostdSshConnectFunc)(gpointer data, const HostdSshTarget *target, GError **error);

/* Makes @pool take each new connection from @connect (with @data, which must outlive @pool)
 * instead of connecting itself: the SSH worker's pool, which may make no socket, asks hostd.
 * NULL: @pool connects itself again. Call before any use of @pool. Can't fail. */
void hostd_ssh_pool_set_connect(HostdSshPool *pool, HostdSshConnectFunc connect, gpointer data);

/* Hands @pool's waits and execs to @delegate (static) with @data, which must outlive @pool;
 * NULL: @pool runs them itself again. Call before any use of @pool. Can't fail. */
void hostd_ssh_pool_set_delegate(HostdSshPool *pool, const HostdSshDelegate *delegate,
                                 gpointer data);

/* Runs @request on @target and relays the conversation with the vmctl client on @client_fd:
 * reads STDIN / STDIN_EOF / WINDOW_SIZE frames from it and writes STDOUT / STDERR frames as
 * output arrives (stdout and stderr kept apart), then one EXIT frame with the remote status
 * (128+N for a signal). Blocks until the command ends or the client goes away (then the remote
 * command gets its channel closed). Returns FALSE with VM_ERROR_SSH / VM_ERROR_IO when the
 * command could not be run; then no EXIT frame was sent and the caller sends an ERROR frame. */
gboolean hostd_ssh_exec(HostdSshPool *pool, const HostdSshTarget *target,
                        const HostdExecRequest *request, int client_fd, GError **error);

/* Quotes @argv for a POSIX shell, joined with spaces (newly allocated). Can't fail. */
char *hostd_shell_quote_argv(char *const *argv);

G_END_DECLS
