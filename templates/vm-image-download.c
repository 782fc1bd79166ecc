#include "vm-image-private.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vm-config.h"
#include "vm-error.h"
#include "vm-util.h"

#define PROGRESS_INTERVAL_US (250 * 1000)
#define CONNECT_TIMEOUT_S    30L
#define LOW_SPEED_BYTES      1024L /* slower than this ... */
#define LOW_SPEED_TIME_S     60L   /* ... for this long aborts the transfer */
#define MAX_REDIRECTS        5L
#define MAX_IMAGE_BYTES      ((curl_off_t)64 << 30)
#define HASH_CHUNK           (1 << 20)

typedef struct {
    CURL *curl;
    int fd;
    const char *name;
    guint64 offset;          /* bytes already in the file when this transfer started */
    gboolean status_checked; /* the first body byte has been seen */
    gboolean range_mismatch; /* a 206 for another range than the one asked for */
    gint64 range_start;      /* from Content-Range of the current response, or -1 */
    int write_errno;
    GCancellable *cancellable;
    VmProgressFunc progress;
    gpointer progress_data;
    gint64 last_progress;
} Download;

G_DEFINE_AUTOPTR_CLEANUP_FUNC(CURL, curl_easy_cleanup)

static void
download_global_init(void)
{
    static gsize once = 0;

    if (g_once_init_enter(&once))
        g_once_init_leave(&once, curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 1 : 2);
}

static size_t
download_header(char *buffer, size_t size, size_t nitems, void *userdata)
{
    Download *d = userdata;
    size_t len = size * nitems;
    g_autofree char *line = g_strndup(buffer, len);

    /* Redirects deliver several responses: only the last one's headers count. */
    if (g_str_has_prefix(line, "HTTP/"))
        d->range_start = -1;
    else if (g_ascii_strncasecmp(line, "content-range:", 14) == 0) {
        const char *p = line + 14;
        while (*p == ' ' || *p == '\t')
            p++;
        if (g_ascii_strncasecmp(p, "bytes ", 6) == 0)
            d->range_start = g_ascii_strtoll(p + 6, NULL, 10);
    }
    return len;
}

static size_t
download_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    Download *d = userdata;
    size_t len = size * nmemb;

    if (!d->status_checked) {
        long code = 0;

        d->status_checked = TRUE;
        curl_easy_getinfo(d->curl, CURLINFO_RESPONSE_CODE, &code);
        if (d->offset > 0 && code == 206 && d->range_start != (gint64)d->offset) {
            d->range_mismatch = TRUE;
            return 0;
        }
        if (d->offset > 0 && code != 206) {
            /* The server ignored Range and sends the whole file: start over. */
            if (ftruncate(d->fd, 0) < 0 || lseek(d->fd, 0, SEEK_SET) < 0) {
                d->write_errno = errno;
                return 0;
            }
            d->offset = 0;
        }
    }

    for (size_t done = 0; done < len;) {
        ssize_t n = write(d->fd, ptr + done, len - done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            d->write_errno = errno;
            return 0;
        }
        done += (size_t)n;
    }
    return len;
}

static int
download_xferinfo(void *userdata, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                  curl_off_t ulnow)
{
    Download *d = userdata;

    if (g_cancellable_is_cancelled(d->cancellable))
        return 1;
    if (d->progress == NULL)
        return 0;

    gint64 now = g_get_monotonic_time();
    if (now - d->last_progress < PROGRESS_INTERVAL_US)
        return 0;
    d->last_progress = now;

    guint64 done = d->offset + (guint64)dlnow;
    guint64 total = dltotal > 0 ? d->offset + (guint64)dltotal : 0;
    g_autofree char *done_text = vm_format_bytes(done);
    g_autofree char *message = NULL;
    double fraction = -1.0;
    if (total > 0) {
        g_autofree char *total_text = vm_format_bytes(total);
        message = g_strdup_printf("downloading %s: %s of %s", d->name, done_text, total_text);
        fraction = MIN(1.0, (double)done / (double)total);
    } else {
        message = g_strdup_printf("downloading %s: %s", d->name, done_text);
    }
    d->progress(message, fraction, d->progress_data);
    return 0;
}

static gboolean
download_sha256(const char *path, GCancellable *cancellable, char **ret_hex, GError **error)
{
    g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
    g_autofree guint8 *buffer = g_malloc(HASH_CHUNK);
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return vm_throw_errno(error, errno, "opening %s", path);
    for (;;) {
        ssize_t n = read(fd, buffer, HASH_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "reading %s", path);
        if (n == 0)
            break;
        if (g_cancellable_is_cancelled(cancellable))
            return vm_throw(error, VM_ERROR_CANCELLED, "checking %s cancelled", path);
        g_checksum_update(sum, buffer, n);
    }
    *ret_hex = g_strdup(g_checksum_get_string(sum));
    return TRUE;
}

typedef enum {
    ATTEMPT_DONE,
    ATTEMPT_FAILED,
    ATTEMPT_RETRY, /* the partial file was useless and is gone: try once more from zero */
} Attempt;

static Attempt
download_attempt(const VmTemplate *template_, const char *part_path, VmProgressFunc progress,
                 gpointer progress_data, GCancellable *cancellable, GError **error)
{
    char errbuf[CURL_ERROR_SIZE] = "";
    struct stat st;
    long code = 0;

    vm_autofd fd = open(part_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || fstat(fd, &st) < 0 || lseek(fd, 0, SEEK_END) < 0) {
        vm_throw_errno(error, errno, "opening %s", part_path);
        return ATTEMPT_FAILED;
    }

    g_autoptr(CURL) curl = curl_easy_init();
    if (curl == NULL) {
        vm_throw(error, VM_ERROR_IMAGE, "cannot initialise libcurl");
        return ATTEMPT_FAILED;
    }

    Download d = {
        .curl = curl,
        .fd = fd,
        .name = template_->name,
        .offset = (guint64)st.st_size,
        .range_start = -1,
        .cancellable = cancellable,
        .progress = progress,
        .progress_data = progress_data,
    };

    curl_easy_setopt(curl, CURLOPT_URL, template_->url);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, MAX_REDIRECTS);
    curl_easy_setopt(curl, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, LOW_SPEED_BYTES);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, LOW_SPEED_TIME_S);
    curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, MAX_IMAGE_BYTES);
    /* Signals would hit whichever hostd thread happens to run. */
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "vmctl/" VM_VERSION);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, download_write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &d);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, download_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &d);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, download_xferinfo);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &d);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    /* CURLOPT_RANGE rather than RESUME_FROM: libcurl then hands over a 200 answer from a
     * server that ignores ranges instead of failing, and download_write() starts over. */
    g_autofree char *range = g_strdup_printf("%" G_GUINT64_FORMAT "-", d.offset);
    if (d.offset > 0)
        curl_easy_setopt(curl, CURLOPT_RANGE, range);

    CURLcode rc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);

    if (rc == CURLE_OK) {
        if (fdatasync(fd) < 0) {
            vm_throw_errno(error, errno, "writing %s", part_path);
            return ATTEMPT_FAILED;
        }
        return ATTEMPT_DONE;
    }

    struct stat now;
    gboolean empty = fstat(fd, &now) == 0 && now.st_size == 0;

    switch (rc) {
    case CURLE_ABORTED_BY_CALLBACK:
        if (empty)
            unlink(part_path);
        vm_throw(error, VM_ERROR_CANCELLED, "download of %s cancelled", template_->name);
        return ATTEMPT_FAILED;
    case CURLE_WRITE_ERROR:
        if (d.range_mismatch) {
            unlink(part_path);
            vm_throw(error, VM_ERROR_IMAGE, "downloading %s: the server sent another range",
                     template_->url);
            return ATTEMPT_FAILED;
        }
        if (d.write_errno != 0) {
            vm_throw_errno(error, d.write_errno, "writing %s", part_path);
            return ATTEMPT_FAILED;
        }
        break;
    case CURLE_HTTP_RETURNED_ERROR:
        /* 416: what we have is already as long as the file, or longer: it cannot be
         * trusted, fetch it again. */
        if (code == 416 && d.offset > 0) {
            unlink(part_path);
            return ATTEMPT_RETRY;
        }
        /* The server answered, and not with the file: nothing here is worth resuming. */
        unlink(part_path);
        vm_throw(error, VM_ERROR_IMAGE, "downloading %s failed: HTTP %ld", template_->url, code);
        return ATTEMPT_FAILED;
    default:
        break;
    }

    /* Network trouble: keep what arrived for the next attempt. */
    if (empty)
        unlink(part_path);
    vm_throw(error, VM_ERROR_IMAGE, "downloading %s failed: %s", template_->url,
             errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc));
    return ATTEMPT_FAILED;
}

gboolean
vm_image_download(const VmTemplate *template_, const char *part_path, VmProgressFunc progress,
                  gpointer progress_data, GCancellable *cancellable, GError **error)
{
    g_autofree char *actual = NULL;
    Attempt attempt = ATTEMPT_RETRY;

    g_return_val_if_fail(template_ != NULL && template_->url != NULL, FALSE);
    g_return_val_if_fail(template_->sha256 != NULL, FALSE);

    const char *scheme = g_uri_peek_scheme(template_->url);
    if (scheme == NULL || (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "template '%s': only http and https image URLs are supported",
                        template_->name);

    download_global_init();
    for (int tries = 0; attempt == ATTEMPT_RETRY && tries < 2; tries++)
        attempt =
            download_attempt(template_, part_path, progress, progress_data, cancellable, error);
    if (attempt == ATTEMPT_RETRY)
        return vm_throw(error, VM_ERROR_IMAGE, "downloading %s: the server refuses every range",
                        template_->url);
    if (attempt == ATTEMPT_FAILED)
        return FALSE;

    if (progress != NULL) {
        g_autofree char *message = g_strdup_printf("verifying %s", template_->name);
        progress(message, 1.0, progress_data);
    }
    if (!download_sha256(part_path, cancellable, &actual, error))
        return FALSE;
    if (g_ascii_strcasecmp(actual, template_->sha256) != 0) {
        unlink(part_path);
        return vm_throw(error, VM_ERROR_IMAGE, "sha256 mismatch: expected %s, got %s",
                        template_->sha256, actual);
    }
    return TRUE;
}
