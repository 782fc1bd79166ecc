/* Unix socket addresses from paths. libc only: vm-egress-connect, linked statically without
 * GLib, uses it too; everything else calls vm_unix_address() (vm-util.h), which adds the GError. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

/* The longest path a struct sockaddr_un holds (108 bytes with the NUL on Linux). */
#define VM_UNIX_PATH_MAX (sizeof(((struct sockaddr_un *)NULL)->sun_path) - 1)

/* Fills @ret (zeroed first) with the address of the socket file @path and @ret_len with its
 * length. Returns 0, or -ENAMETOOLONG (leaving both untouched) when @path is longer than
 * VM_UNIX_PATH_MAX bytes. */
static inline int
vm_sockaddr_un_fill(const char *path, struct sockaddr_un *ret, socklen_t *ret_len)
{
    size_t len = strlen(path);

    if (len > VM_UNIX_PATH_MAX)
        return -ENAMETOOLONG;
    memset(ret, 0, sizeof(*ret));
    ret->sun_family = AF_UNIX;
    memcpy(ret->sun_path, path, len + 1);
    *ret_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
    return 0;
}
