#include "vm-fs.h"

#include "vm-error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Empties the directory open as @dir_fd (taken over), @path for messages. Every step goes through
 * a descriptor of the directory it acts in, so a directory swapped for a link while we work
 * cannot lead us outside the tree. */
static gboolean
vm_remove_contents(int dir_fd, dev_t dev, const char *path, GError **error)
{
    DIR *dir = fdopendir(dir_fd);
    struct dirent *entry;
    gboolean ok = TRUE;

    if (dir == NULL) {
        int saved = errno;

        close(dir_fd);
        return vm_throw_errno(error, saved, "cannot read %s", path);
    }
    while (ok) {
        errno = 0;
        entry = readdir(dir);
        if (entry == NULL) {
            if (errno != 0)
                ok = vm_throw_errno(error, errno, "cannot read %s", path);
            break;
        }
        const char *name = entry->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            continue;
        /* Anything but a directory (a link to one included) goes with unlinkat(); Linux answers
         * EISDIR for a real directory. */
        if (unlinkat(dirfd(dir), name, 0) == 0 || errno == ENOENT)
            continue;
        g_autofree char *child_path = g_build_filename(path, name, NULL);
        if (errno != EISDIR) {
            ok = vm_throw_errno(error, errno, "cannot remove %s", child_path);
            break;
        }
        int child_fd = openat(dirfd(dir), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (child_fd < 0) {
            if (errno != ENOENT)
                ok = vm_throw_errno(error, errno, "cannot open %s", child_path);
            continue;
        }
        struct stat st;
        if (fstat(child_fd, &st) < 0) {
            ok = vm_throw_errno(error, errno, "cannot stat %s", child_path);
            close(child_fd);
            break;
        }
        /* Another file system mounted here is left whole; rmdir() then says why it stays. */
        if (st.st_dev != dev)
            close(child_fd);
        else if (!vm_remove_contents(child_fd, dev, child_path, error)) {
            ok = FALSE;
            break;
        }
        if (unlinkat(dirfd(dir), name, AT_REMOVEDIR) < 0 && errno != ENOENT)
            ok = vm_throw_errno(error, errno, "cannot remove %s", child_path);
    }
    closedir(dir);
    return ok;
}

gboolean
vm_remove_tree(const char *path, GError **error)
{
    struct stat st;

    g_return_val_if_fail(path != NULL, FALSE);

    if (lstat(path, &st) < 0)
        return errno == ENOENT ? TRUE : vm_throw_errno(error, errno, "cannot remove %s", path);
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) < 0 && errno != ENOENT)
            return vm_throw_errno(error, errno, "cannot remove %s", path);
        return TRUE;
    }
    /* O_NOFOLLOW: @path may have become a link since the lstat(). */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return TRUE;
        return vm_throw_errno(error, errno, "cannot open %s", path);
    }
    if (!vm_remove_contents(fd, st.st_dev, path, error))
        return FALSE;
    if (rmdir(path) < 0 && errno != ENOENT)
        return vm_throw_errno(error, errno, "cannot remove %s", path);
    return TRUE;
}
