#include "vm-fd-pass.h"

#include "vm-sockaddr.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* One byte and room for one descriptor: the only message either side of a hand-over sends. */
typedef struct {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    char byte;
    struct iovec iov;
    struct msghdr msg;
} FdMessage;

static void
fd_message_init(FdMessage *m, char byte)
{
    memset(m, 0, sizeof(*m));
    m->byte = byte;
    m->iov = (struct iovec){.iov_base = &m->byte, .iov_len = 1};
    m->msg = (struct msghdr){.msg_iov = &m->iov,
                             .msg_iovlen = 1,
                             .msg_control = m->control.buf,
                             .msg_controllen = sizeof(m->control.buf)};
}

int
vm_fd_send(int sock, int fd)
{
    return vm_fd_send_tagged(sock, fd, VM_FD_PASS_TAG);
}

int
vm_fd_send_tagged(int sock, int fd, char tag)
{
    FdMessage m;
    struct msghdr *msg = &m.msg;
    struct cmsghdr *cmsg;

    fd_message_init(&m, tag);
    cmsg = CMSG_FIRSTHDR(msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    while (sendmsg(sock, msg, MSG_NOSIGNAL) < 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

int
vm_fd_pass(const char *path, int fd)
{
    return vm_fd_pass_tagged(path, fd, VM_FD_PASS_TAG);
}

int
vm_fd_pass_tagged(const char *path, int fd, char tag)
{
    struct sockaddr_un sun;
    socklen_t sun_len;
    int sock, rc;

    if (vm_sockaddr_un_fill(path, &sun, &sun_len) < 0)
        return -ENAMETOOLONG;
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -errno;
    if (connect(sock, (struct sockaddr *)&sun, sun_len) < 0)
        rc = -errno;
    else
        rc = vm_fd_send_tagged(sock, fd, tag);
    close(sock);
    return rc;
}

int
vm_fd_receive(int sock, char *ret_byte)
{
    FdMessage m;
    struct msghdr *msg = &m.msg;
    struct cmsghdr *cmsg;
    ssize_t n;
    int fd = -1, type = 0, flags;
    socklen_t type_len = sizeof(type);

    fd_message_init(&m, 0);
    do {
        n = recvmsg(sock, msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    if (n == 0)
        return -ECONNRESET;
    cmsg = CMSG_FIRSTHDR(msg);
    if (ret_byte != NULL)
        *ret_byte = m.byte;
    if (cmsg == NULL && ret_byte != NULL)
        return -ENOMSG;
    if (cmsg != NULL && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS &&
        cmsg->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
    if (fd < 0 || (msg->msg_flags & MSG_CTRUNC) ||
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) < 0 || type != SOCK_STREAM ||
        (flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        if (fd >= 0)
            close(fd);
        return -EPROTO;
    }
    return fd;
}
