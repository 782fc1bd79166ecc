/* Handing a connected socket to another process over a Unix stream socket: the one way the
 * egress proxy and hostd's in-guest API take a guest connection. libc only, since
 * vm-egress-connect, which QEMU runs for every guest connection, links it statically and loads
 * nothing else. */
#pragma once

/* Sends @fd over the connected Unix stream socket @sock as SCM_RIGHTS with one byte ('F'), as
 * vm_fd_pass() does after its connect. Returns 0 once the kernel holds it, or the negative errno
 * of sendmsg(). */
int vm_fd_send(int sock, int fd);

/* Connects to the Unix stream socket @path and sends it @fd as SCM_RIGHTS with one byte ('F');
 * returns once the kernel holds it, so the caller may close @fd and exit. Returns 0, or a
 * negative errno: -ENAMETOOLONG when @path does not fit a sockaddr_un, else that of the
 * socket(), connect() or sendmsg() that failed (-ENOENT or -ECONNREFUSED: nobody listens). */
int vm_fd_pass(const char *path, int fd);

/* Takes what vm_fd_pass() sent on the connected Unix stream socket @sock, without waiting (call
 * it once @sock is readable): returns the received socket (close-on-exec, non-blocking), or a
 * negative errno: -EAGAIN when nothing has arrived yet, -ECONNRESET when the peer closed first,
 * -EPROTO for anything but one byte carrying exactly one stream socket (a descriptor that came
 * with it is closed). With @ret_byte, a byte that came with no descriptor at all is stored there
 * and -ENOMSG returned: a peer that speaks on the socket itself instead of handing one over. */
int vm_fd_receive(int sock, char *ret_byte);
