/* A hostd on another host, reached over SSH: `vmctl --host ssh://[user@]host[:port][/socket]`.
 *
 * vmctl runs the OpenSSH client, `ssh HOST vmctl bridge [--socket PATH]`, and speaks the same
 * frames over its stdin and stdout as over a local socket; `vmctl bridge` on the remote copies
 * them to and from the remote's hostd socket. One ssh per connection, as one request per
 * connection. The parsing and the words given to ssh are pure, so tests pin them.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The longest --host URL accepted, in bytes. */
#define VMCTL_REMOTE_URL_MAX 4096

typedef struct {
    char *user;        /* NULL: ssh's default (its configuration, else the local user) */
    char *host;        /* a name or an address; an IPv6 address without its brackets */
    guint16 port;      /* 0: ssh's default */
    char *socket_path; /* hostd's socket on the remote; NULL: the remote vmctl's default */
} VmctlRemote;

/* Parses @url, "ssh://[user@]host[:port][/socket-path]", where @what names where it came from
 * ("--host", "$VMCTL_HOST") for the message. A host is a name or address (letters, digits, '.',
 * '-', '_', not starting with '-'), or an IPv6 address in brackets; a user is letters, digits,
 * '.', '-', '_'; a port is 1-65535; the socket path is absolute, without control characters.
 * Fails with VM_ERROR_INVALID_ARGUMENT "invalid WHAT 'URL': WHY; expected
 * ssh://[user@]host[:port][/socket-path]". Returns a new VmctlRemote. */
VmctlRemote *vmctl_remote_parse(const char *url, const char *what, GError **error);

void vmctl_remote_free(VmctlRemote *remote);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmctlRemote, vmctl_remote_free)

/* "[user@]host[:port]" (an IPv6 host in brackets when a port follows), as ssh's -J and
 * ProxyJump take it. Newly allocated; can't fail. */
char *vmctl_remote_destination(const VmctlRemote *remote);

/* The ssh command line that runs @remote_argv (words the remote shell receives quoted, each as
 * one word) on @remote: "ssh -o BatchMode=yes [-p PORT] [-t|-T] -- [user@]host 'w1' 'w2'...".
 * With @terminal ssh asks for a terminal (-t), else it never does (-T). Newly allocated,
 * NULL-terminated; can't fail. */
char **vmctl_remote_ssh_argv(const VmctlRemote *remote, const char *const *remote_argv,
                             gboolean terminal);

/* The words `vmctl bridge` is run with on @remote: "vmctl bridge [--socket PATH]". Newly
 * allocated, NULL-terminated; can't fail. */
char **vmctl_remote_bridge_argv(const VmctlRemote *remote);

/* Connects to hostd on @remote: starts ssh running `vmctl bridge` there, its stdin and stdout a
 * socket pair whose other end is returned in @ret_fd (close-on-exec; the frames go through it
 * as through hostd's own socket), its stderr a pipe returned in @ret_stderr_fd (non-blocking,
 * close-on-exec; what ssh says when it fails), and its process in @ret_pid (to be reaped by
 * the caller). Fails with VM_ERROR_IO when ssh cannot be started ("ssh is not installed ..."
 * when it is missing). */
gboolean vmctl_remote_connect(const VmctlRemote *remote, int *ret_fd, int *ret_stderr_fd,
                              GPid *ret_pid, GError **error);

/* The OpenSSH configuration @config (stanzas "Host vmctl-NAME" from hostd) for use from this
 * host: every "Host" line is followed by "  ProxyJump DESTINATION", so ssh reaches the agent's
 * port on the remote's loopback through the remote. Newly allocated; can't fail. */
char *vmctl_remote_ssh_config(const VmctlRemote *remote, const char *config);

G_END_DECLS
