/* vm-guestfs-helper: reads files inside an agent's checkpoint images for hostd, so that
 * libguestfs's appliance (whose QEMU parses the guest-written qcow2 images, and whose kernel the
 * guest-written filesystems) never runs in hostd's process or as root.
 *
 * hostd runs it as the agent's own unprivileged id (vm_spawn_run()'s run_as: no supplementary
 * group, no_new_privs, no capability), which reads that agent's images and nothing of any other
 * agent's, with the fixed appliance hostd built (vm_guestfs_appliance_build()):
 *
 *   vm-guestfs-helper diff APPLIANCE MAX_BYTES OLD NEW [UNDER]
 *       what changed from image OLD to image NEW (below guest path UNDER), on stdout as
 *       vm_guest_changes_encode() writes it, at most about MAX_BYTES of paths;
 *   vm-guestfs-helper export APPLIANCE IMAGE PATH...
 *       a tar of the guest paths as they are in IMAGE, on stdout (vm_guestfs_export()).
 *
 * On failure the exit status is the VmErrorCode and stderr its message, one line. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include "vm-error.h"
#include "vm-guestfs.h"
#include "vm-util.h"

#define COPY_CHUNK (256 * 1024)

static int
fail(const GError *error)
{
    VmErrorCode code = vm_error_code(error);
    fprintf(stderr, "%s\n", error->message);
    return code >= 1 && code <= VM_ERROR_LAST ? (int)code : VM_ERROR_FAILED;
}

static gboolean
write_all(int fd, const guint8 *data, gsize len, GError **error)
{
    while (len > 0) {
        gssize n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return vm_throw_errno(error, n < 0 ? errno : EIO, "cannot write the output");
        data += n;
        len -= (gsize)n;
    }
    return TRUE;
}

static gboolean
diff(char **args, GError **error)
{
    guint64 max_bytes = 0;

    if (g_strv_length(args) < 4 || g_strv_length(args) > 5 ||
        !g_ascii_string_to_unsigned(args[1], 10, 0, G_MAXSIZE, &max_bytes, NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "usage: vm-guestfs-helper diff APPLIANCE MAX_BYTES OLD NEW [UNDER]");
    g_autoptr(GPtrArray) changes = vm_guestfs_diff(args[2], args[3], args[4], args[0], error);
    if (changes == NULL)
        return FALSE;
    g_autoptr(GBytes) out = vm_guest_changes_encode(changes, (gsize)max_bytes);
    gsize len = 0;
    const guint8 *data = g_bytes_get_data(out, &len);
    return write_all(STDOUT_FILENO, data, len, error);
}

/* libguestfs writes a tar to a file it opens by name, and stdout is a descriptor hostd opened
 * (reopening it by /proc would need hostd's permissions): the tar goes to a private directory
 * of this user's first, then to stdout. */
static gboolean export(char **args, GError **error)
{
    if (g_strv_length(args) < 3)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "usage: vm-guestfs-helper export APPLIANCE IMAGE PATH...");
    g_autofree char *dir = g_dir_make_tmp("vm-guestfs-XXXXXX", NULL);
    if (dir == NULL)
        return vm_throw_errno(error, errno, "cannot make a private directory");
    g_autofree char *tar = g_build_filename(dir, "paths.tar", NULL);
    gboolean ok = vm_guestfs_export(args[1], (const char *const *)args + 2, tar, args[0], error);
    vm_autofd fd = ok ? open(tar, O_RDONLY | O_CLOEXEC) : -1;
    g_unlink(tar);
    g_rmdir(dir);
    if (!ok)
        return FALSE;
    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot open the tar");

    g_autofree guint8 *chunk = g_malloc(COPY_CHUNK);
    for (;;) {
        gssize n = read(fd, chunk, COPY_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot read the tar");
        if (n == 0)
            return TRUE;
        if (!write_all(STDOUT_FILENO, chunk, (gsize)n, error))
            return FALSE;
    }
}

int
main(int argc, char **argv)
{
    g_autoptr(GError) error = NULL;

    /* It holds a file hostd opened for it (the export's tar): no process of the agent's id, its
     * QEMU included, may trace it and write there, and the guest's files it reads reach no core
     * file. */
    vm_process_undumpable();
    if (argc >= 2 && strcmp(argv[1], "diff") == 0)
        return diff(argv + 2, &error) ? 0 : fail(error);
    if (argc >= 2 && strcmp(argv[1], "export") == 0)
        return export(argv + 2, &error) ? 0 : fail(error);
    fprintf(stderr, "vm-guestfs-helper: hostd runs this: diff APPLIANCE MAX_BYTES OLD NEW [UNDER] "
                    "| export APPLIANCE IMAGE PATH...\n");
    return VM_ERROR_INVALID_ARGUMENT;
}
