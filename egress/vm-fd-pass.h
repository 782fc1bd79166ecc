/* Handing a connected socket to another process over a Unix stream socket: the one way the
 * egress proxy takes a guest connection. libc only, since vm-egress-connect, which QEMU runs
 * for every guest connection, links it statically and loads nothing else. */
#pragma once

/* Connects to the Unix stream socket @path and sends it @fd as SCM_RIGHTS with one byte ('F');
 * returns once the kernel holds it, so the caller may close @fd and exit. Returns 0, or a
 * negative errno: -ENAMETOOLONG when @path does not fit a sockaddr_un, else that of the
 * socket(), connect() or sendmsg() that failed (-ENOENT or -ECONNREFUSED: nobody listens). */
int vm_fd_pass(const char *path, int fd);
