/* vm-egress-connect: the program a QEMU guestfwd runs for each guest connection to the egress
 * proxy's guest-side address ("guestfwd=tcp:10.0.2.100:3128-cmd:vm-egress-connect SOCKET").
 * QEMU gives it the guest's connection as stdin/stdout; it hands that socket to hostd's proxy
 * listening on the Unix socket SOCKET (one byte with SCM_RIGHTS, see vm-egress-proxy.h) and
 * exits, so no byte ever passes through it. When the proxy is not there it exits at once and the
 * guest's connection closes: the way out fails closed.
 *
 * It runs as QEMU's user under QEMU's seccomp filter, once per connection: plain libc, nothing
 * else to load. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int
main(int argc, char **argv)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof(control.buf)};
    struct cmsghdr *cmsg;
    int guest = STDIN_FILENO;
    int sock;

    if (argc != 2 || strlen(argv[1]) >= sizeof(sun.sun_path)) {
        fputs("usage: vm-egress-connect SOCKET\n", stderr);
        return 2;
    }
    strcpy(sun.sun_path, argv[1]);
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0 || connect(sock, (struct sockaddr *)&sun, sizeof(sun)) < 0)
        return 1;
    memset(&control, 0, sizeof(control));
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &guest, sizeof(int));
    while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0)
        if (errno != EINTR)
            return 1;
    return 0;
}
