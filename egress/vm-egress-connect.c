/* vm-egress-connect: the program a QEMU guestfwd runs for each guest connection to the egress
 * proxy's guest-side address ("guestfwd=tcp:10.0.2.100:3128-cmd:vm-egress-connect SOCKET").
 * QEMU gives it the guest's connection as stdin/stdout; it hands that socket to hostd's proxy
 * listening on the Unix socket SOCKET (one byte with SCM_RIGHTS, see vm-egress-proxy.h) and
 * exits, so no byte ever passes through it. When the proxy is not there it exits at once and the
 * guest's connection closes: the way out fails closed.
 *
 * It runs as QEMU's user under QEMU's seccomp filter, once per connection: plain libc, nothing
 * else to load. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vm-fd-pass.h"

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fputs("usage: vm-egress-connect SOCKET\n", stderr);
        return 2;
    }
    return vm_fd_pass(argv[1], STDIN_FILENO) == 0 ? 0 : 1;
}
