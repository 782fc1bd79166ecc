/* The messages between hostd and an agent's SSH worker (vm-ssh-worker; docs/SECURITY.md).
 *
 * hostd starts one worker per agent with a socketpair as its fd HOSTD_SSH_WORKER_CONTROL_FD.
 * Messages are frames of vm-wire.h. On the control socket hostd sends "start" and the worker
 * answers "ready" s once it is confined (what its confinement lacks, "" for nothing), or
 * "failed" s and exits; from then on the control
 * socket carries only requests: each is a connected socket of its own, handed over with
 * vm_fd_send(), on which one request is asked and answered, so requests run side by side. The
 * worker exits once hostd closes the control socket and its requests have ended.
 *
 * The worker makes no connection of its own (its seccomp filter refuses socket() and
 * connect()): on the second socketpair, its fd HOSTD_SSH_WORKER_CONNECT_FD, it writes one byte
 * 'C' for each connection to the guest's sshd it needs, and hostd answers each in turn with a
 * TCP connection of its own making to the host and port of the start message (which hostd
 * chose), handed over with vm_fd_send(), or with one byte and no descriptor: the errno of the
 * connect() that failed. The worker names nothing there, so it reaches nothing else.
 *
 * On a request's socket:
 *   hostd:  "ready"  u: the seconds hostd_ssh_wait_ready() may take
 *           "exec"   (asassbsuubb): argv, env, cwd ("": none), tty, term ("": default), cols,
 *                    rows, traced, before-command; then the vmctl client's socket, handed over
 *           "forward" u: a guest port; then the forwarded connection's socket, handed over
 *           "go"     (): the answer to "before"
 *           "ping"   (): whether the worker answers (hostd asks while a command runs); "done"
 *   worker: "taken"  (): the exec's client or the forwarded connection was received (hostd
 *                    times every answer a worker owes, this one included: docs/SECURITY.md)
 *           "before" (): the command is about to be sent; it waits for "go"
 *           "activity" (): bytes moved on the forwarded connection (at most once a second)
 *           "done"   (busa(sx)): ok, the VM_ERROR code and message when not, and the phases the
 *                    worker marked (name, g_get_monotonic_time()) when traced
 *
 * The worker trusts hostd; hostd trusts nothing a worker sends: frames are bounded, types
 * exact, codes known, messages and marks bounded and checked. */
#pragma once

#include <glib.h>

#include "hostd-ssh.h"
#include "vm-trace.h"

G_BEGIN_DECLS

#define HOSTD_SSH_WORKER_CONTROL_FD 3
#define HOSTD_SSH_WORKER_CONNECT_FD 4

/* Bounds on one frame's payload: an exec's argv and environment one way, a status the other. */
#define HOSTD_SSH_WIRE_TO_WORKER_MAX   (4 * 1024 * 1024)
#define HOSTD_SSH_WIRE_FROM_WORKER_MAX (16 * 1024)
/* The longest error message and phase name hostd takes from a worker, and the most marks. */
#define HOSTD_SSH_WIRE_MESSAGE_MAX 1024
#define HOSTD_SSH_WIRE_PHASE_MAX   48
#define HOSTD_SSH_WIRE_MARKS_MAX   32

/* What a worker starts with: @target with its key and pinned host key given as text, and the
 * user it changes to (only with @change_user). */
typedef struct {
    char *agent, *host, *user;
    guint port;
    char *identity_pem;
    char *host_key;
    gboolean change_user;
    guint uid, gid;
} HostdSshWireStart;

/* The "start" payload. Can't fail. */
GVariant *hostd_ssh_wire_start_new(const HostdSshTarget *target, const char *identity_pem,
                                   const char *host_key, gboolean change_user, guint uid,
                                   guint gid);

/* Reads a "start" payload into @out (cleared with hostd_ssh_wire_start_clear()). Fails with
 * VM_ERROR_PROTOCOL for another type. */
gboolean hostd_ssh_wire_start_parse(GVariant *payload, HostdSshWireStart *out, GError **error);

/* @start as the target a pool connects with; the strings stay @start's. Can't fail. */
void hostd_ssh_wire_start_target(const HostdSshWireStart *start, HostdSshTarget *out);

/* Frees what @start holds, the private key wiped first. Can't fail. */
void hostd_ssh_wire_start_clear(HostdSshWireStart *start);

/* The "exec" payload of @request (its trace and before_command become the flags). Can't
 * fail. */
GVariant *hostd_ssh_wire_exec_new(const HostdExecRequest *request);

/* An "exec" payload read back: request points into the fields below. */
typedef struct {
    HostdExecRequest request;
    char **argv, **env;
    char *cwd, *term;
    gboolean traced, before_command;
} HostdSshWireExec;

/* Reads an "exec" payload into @out (cleared with hostd_ssh_wire_exec_clear()). Fails with
 * VM_ERROR_PROTOCOL for another type. */
gboolean hostd_ssh_wire_exec_parse(GVariant *payload, HostdSshWireExec *out, GError **error);

/* Frees what @exec holds. Can't fail. */
void hostd_ssh_wire_exec_clear(HostdSshWireExec *exec);

/* The "done" payload: success, or @error (its code when in VM_ERROR, else VM_ERROR_SSH), with
 * the marks of @trace (may be NULL). Can't fail. */
GVariant *hostd_ssh_wire_done_new(const GError *error, const VmTrace *trace);

/* What a worker's "ready" @payload (an SSH or an egress worker's) says its confinement lacks (no
 * Landlock in this kernel), as hostd may log it (hostd_ssh_wire_text()); NULL for nothing, or a
 * payload of another type. Can't fail. */
char *hostd_ssh_wire_ready_note(GVariant *payload);

/* @text, which a worker sent, as hostd may log and show it: one line of printable ASCII (every
 * other byte '?'), at most HOSTD_SSH_WIRE_MESSAGE_MAX bytes. Newly allocated; can't fail. */
char *hostd_ssh_wire_text(const char *text);

/* Takes a worker's "done" payload: replays its marks on @trace (may be NULL), each within the
 * time the request took, and returns TRUE for success; FALSE with the worker's error (its
 * message bounded and made one line of printable text, its code kept when it is one of
 * VM_ERROR's, else VM_ERROR_SSH), or VM_ERROR_PROTOCOL for a payload of another type or with
 * marks out of bounds. */
gboolean hostd_ssh_wire_done_parse(GVariant *payload, VmTrace *trace, GError **error);

G_END_DECLS
