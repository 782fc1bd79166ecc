/* Handing a connected socket to another process over a Unix stream socket: the one way the
 * egress proxy and hostd's in-guest API take a guest connection. libc only, since
 * vm-egress-connect, which QEMU runs for every guest connection, links it statically and loads
 * nothing else. */
#pragma once

/* The byte that comes with a handed-over socket: what the receiver is to serve on it. */
#define VM_FD_PASS_TAG     'F' /* the default: the egress proxy's HTTP, the in-guest API */
#define VM_FD_PASS_TAG_DNS 'D' /* DNS over TCP, to the egress proxy's resolver */

/* Sends @fd over the connected Unix stream socket @sock as SCM_RIGHTS with one byte ('F'), as
 * vm_fd_pass() does after its connect. Returns 0 once the kernel holds it, or the negative errno
 * of sendmsg(). */
int vm_fd_send(int sock, int fd);

/* vm_fd_send() with @tag as its byte. */
int vm_fd_send_tagged(int sock, int fd, char tag);

/* Connects to the Unix stream socket @path and sends it @fd as SCM_RIGHTS with one byte ('F');
 * returns once the kernel holds it, so the caller may close @fd and exit. Returns 0, or a
 * negative errno: -ENAMETOOLONG when @path does not fit a sockaddr_un, else that of the
 * socket(), connect() or sendmsg() that failed (-ENOENT or -ECONNREFUSED: nobody listens). */
int vm_fd_pass(const char *path, int fd);

/* vm_fd_pass() with @tag as the byte that comes with @fd (VM_FD_PASS_TAG_DNS, ...). */
int vm_fd_pass_tagged(const char *path, int fd, char tag);

/* Takes what vm_fd_pass() sent on the connected Unix stream socket @sock, without waiting (call
 * it once @sock is readable): returns the received socket (close-on-exec, non-blocking), or a
 * negative errno: -EAGAIN when nothing has arrived yet, -ECONNRESET when the peer closed first,
 * -EPROTO for anything but one byte carrying exactly one stream socket (a descriptor that came
 * with it is closed). With @ret_byte, the byte that came is stored there (with a socket: its tag,
 * VM_FD_PASS_TAG...), and for a byte with no descriptor at all -ENOMSG returned: a peer that
 * speaks on the socket itself instead of handing one over. */
int vm_fd_receive(int sock, char *ret_byte);
