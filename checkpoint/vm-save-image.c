#include "vm-save-image.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vm-error.h"

#define SAVE_MAGIC_LEN (sizeof(VM_SAVE_IMAGE_MAGIC) - 1)

typedef struct {
    char magic[SAVE_MAGIC_LEN];
    uint32_t version;
    uint32_t data_len;
    uint32_t was_running;
    uint32_t compressed;
    uint32_t cookie_offset;
    uint32_t unused[14];
} SaveHeader;

G_STATIC_ASSERT(sizeof(SaveHeader) == 92);

typedef struct {
    SaveHeader header;
    char *data; /* data_len bytes */
    const char *xml;
    const char *cookie; /* NULL: none */
} SaveImage;

static void
save_image_clear(SaveImage *image)
{
    g_free(image->data);
}
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(SaveImage, save_image_clear)

static gboolean
save_read_exact(int fd, void *buf, gsize len, const char *path, GError **error)
{
    gsize done = 0;
    while (done < len) {
        ssize_t n = read(fd, (char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot read %s", path);
        if (n == 0)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: not a save image (truncated)",
                            path);
        done += (gsize)n;
    }
    return TRUE;
}

/* Reads and checks the header and data area of the open save image @fd. */
static gboolean
save_image_read(int fd, const char *path, SaveImage *image, GError **error)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return vm_throw_errno(error, errno, "cannot read %s", path);
    if (!save_read_exact(fd, &image->header, sizeof(image->header), path, error))
        return FALSE;
    const SaveHeader *h = &image->header;
    if (memcmp(h->magic, VM_SAVE_IMAGE_MAGIC, SAVE_MAGIC_LEN) != 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: not a complete save image", path);
    if (h->version != VM_SAVE_IMAGE_VERSION)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: save image version %u, expected %u",
                        path, h->version, VM_SAVE_IMAGE_VERSION);
    if (h->compressed != 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: a compressed save image", path);
    if (h->data_len == 0 || h->data_len > VM_SAVE_IMAGE_DATA_MAX ||
        (guint64)st.st_size < sizeof(*h) + (guint64)h->data_len)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: bad data length %u", path,
                        h->data_len);
    if (h->cookie_offset > h->data_len)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: bad cookie offset %u", path,
                        h->cookie_offset);

    image->data = g_malloc(h->data_len + 1);
    image->data[h->data_len] = '\0';
    if (!save_read_exact(fd, image->data, h->data_len, path, error))
        return FALSE;
    image->xml = image->data;
    if (strlen(image->xml) == 0 || strlen(image->xml) >= h->data_len)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: no domain XML in the header", path);
    /* No cookie: libvirt leaves the offset 0. */
    if (h->cookie_offset != 0) {
        if (h->cookie_offset <= strlen(image->xml))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: bad cookie offset %u", path,
                            h->cookie_offset);
        image->cookie = image->data + h->cookie_offset;
    }
    return TRUE;
}

char *
vm_save_image_read_xml(const char *path, GError **error)
{
    int fd = g_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        vm_throw_errno(error, errno, "cannot open %s", path);
        return NULL;
    }
    g_auto(SaveImage) image = {0};
    gboolean ok = save_image_read(fd, path, &image, error);
    close(fd);
    return ok ? g_strdup(image.xml) : NULL;
}

/* Copies everything of @in from @offset to its end into @out at the same offset. */
static gboolean
save_copy_stream(int in, int out, off_t offset, const char *dest, GError **error)
{
    off_t in_off = offset;
    off_t out_off = offset;
    for (;;) {
        ssize_t n = copy_file_range(in, &in_off, out, &out_off, 1 << 30, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP)) {
            /* Another file system or kernel: copy through a buffer. */
            g_autofree char *buf = g_malloc(1 << 20);
            for (;;) {
                ssize_t r = pread(in, buf, 1 << 20, in_off);
                if (r < 0 && errno == EINTR)
                    continue;
                if (r < 0)
                    return vm_throw_errno(error, errno, "cannot copy into %s", dest);
                if (r == 0)
                    return TRUE;
                for (ssize_t done = 0; done < r;) {
                    ssize_t w = pwrite(out, buf + done, (size_t)(r - done), out_off);
                    if (w < 0 && errno == EINTR)
                        continue;
                    if (w < 0)
                        return vm_throw_errno(error, errno, "cannot write %s", dest);
                    done += w;
                    out_off += w;
                }
                in_off += r;
            }
        }
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot copy into %s", dest);
        if (n == 0)
            return TRUE;
    }
}

static gboolean
save_write_all(int fd, const void *buf, gsize len, const char *dest, GError **error)
{
    gsize done = 0;
    while (done < len) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot write %s", dest);
        done += (gsize)n;
    }
    return TRUE;
}

gboolean
vm_save_image_copy_with_xml(const char *src, const char *dest, const char *xml, GError **error)
{
    int in = g_open(src, O_RDONLY | O_CLOEXEC, 0);
    if (in < 0)
        return vm_throw_errno(error, errno, "cannot open %s", src);
    g_auto(SaveImage) image = {0};
    if (!save_image_read(in, src, &image, error)) {
        close(in);
        return FALSE;
    }

    gsize xml_len = strlen(xml) + 1;
    gsize cookie_len = image.cookie != NULL ? strlen(image.cookie) + 1 : 0;
    if (xml_len + cookie_len > image.header.data_len) {
        close(in);
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "the domain XML (%zu bytes) does not fit in the header of %s", xml_len,
                        src);
    }
    SaveHeader header = image.header;
    header.cookie_offset = image.cookie != NULL ? (uint32_t)xml_len : 0;
    g_autofree char *data = g_malloc0(header.data_len);
    memcpy(data, xml, xml_len);
    if (image.cookie != NULL)
        memcpy(data + xml_len, image.cookie, cookie_len);

    int out = g_open(dest, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) {
        close(in);
        return vm_throw_errno(error, errno, "cannot create %s", dest);
    }
    gboolean ok = save_write_all(out, &header, sizeof(header), dest, error) &&
                  save_write_all(out, data, header.data_len, dest, error) &&
                  save_copy_stream(in, out, (off_t)(sizeof(header) + header.data_len), dest, error);
    close(in);
    if (close(out) < 0 && ok)
        ok = vm_throw_errno(error, errno, "cannot write %s", dest);
    if (!ok)
        g_unlink(dest);
    return ok;
}
