/* vm-egress-connect: the program a QEMU guestfwd runs for each guest connection to the egress
 * proxy's guest-side address ("guestfwd=tcp:10.0.2.100:3128-cmd:vm-egress-connect SOCKET").
 * QEMU gives it the guest's connection as stdin/stdout; it hands that socket to hostd's proxy
 * listening on the Unix socket SOCKET (one byte with SCM_RIGHTS, see vm-egress-proxy.h) and
 * exits, so no byte ever passes through it. When the proxy is not there it exits at once and the
 * guest's connection closes: the way out fails closed.
 *
 * "vm-egress-connect SOCKET dns" (the guest forward of 10.0.2.100:53) hands the connection over
 * with the byte VM_FD_PASS_TAG_DNS: the proxy serves DNS over TCP on it, not HTTP.
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
    char tag = VM_FD_PASS_TAG;

    if (argc == 3 && strcmp(argv[2], "dns") == 0)
        tag = VM_FD_PASS_TAG_DNS;
    else if (argc != 2) {
        fputs("usage: vm-egress-connect SOCKET [dns]\n", stderr);
        return 2;
    }
    return vm_fd_pass_tagged(argv[1], STDIN_FILENO, tag) == 0 ? 0 : 1;
}
