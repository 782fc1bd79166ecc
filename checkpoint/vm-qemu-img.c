#include "vm-qemu-img.h"

#include "vm-error.h"

#include <errno.h>
#include <json-glib/json-glib.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* How much of qemu-img's stderr makes it into an error message. */
#define QEMU_IMG_STDERR_MAX 4096

void
vm_qemu_img_info_free(VmQemuImgInfo *info)
{
    if (info == NULL)
        return;
    g_free(info->filename);
    g_free(info->format);
    g_free(info->backing_filename);
    g_free(info->backing_format);
    g_free(info);
}

/* json-glib's parser recurses once per level and has no limit of its own: a few hundred
 * thousand '[' overflow the stack. Counting the depth first keeps that from any input. */
static gboolean
qemu_img_depth_ok(const char *json, gsize len)
{
    gboolean in_string = FALSE;
    guint depth = 0;

    for (gsize i = 0; i < len; i++) {
        char c = json[i];

        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = FALSE;
        } else if (c == '"') {
            in_string = TRUE;
        } else if (c == '[' || c == '{') {
            if (++depth > VM_QEMU_IMG_DEPTH_MAX)
                return FALSE;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return TRUE;
}

/* Reads the string member @name of @object into @ret (left alone when the member is missing or
 * null). */
static gboolean
qemu_img_get_string(JsonObject *object, const char *name, char **ret, GError **error)
{
    JsonNode *node = json_object_get_member(object, name);

    if (node == NULL || JSON_NODE_HOLDS_NULL(node))
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_STRING)
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: \"%s\" is not a string", name);
    *ret = g_strdup(json_node_get_string(node));
    return TRUE;
}

static gboolean
qemu_img_get_size(JsonObject *object, const char *name, guint64 *ret, GError **error)
{
    JsonNode *node = json_object_get_member(object, name);

    if (node == NULL || JSON_NODE_HOLDS_NULL(node))
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64 ||
        json_node_get_int(node) < 0)
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: \"%s\" is not a size in bytes",
                        name);
    *ret = (guint64)json_node_get_int(node);
    return TRUE;
}

static gboolean
qemu_img_get_bool(JsonObject *object, const char *name, gboolean *ret, GError **error)
{
    JsonNode *node = json_object_get_member(object, name);

    if (node == NULL || JSON_NODE_HOLDS_NULL(node))
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_BOOLEAN)
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: \"%s\" is not a boolean", name);
    *ret = json_node_get_boolean(node);
    return TRUE;
}

static VmQemuImgInfo *
qemu_img_info_from_node(JsonNode *node, GError **error)
{
    g_autoptr(VmQemuImgInfo) info = g_new0(VmQemuImgInfo, 1);
    JsonObject *object;

    if (!JSON_NODE_HOLDS_OBJECT(node))
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: an image is not an object"), NULL;
    object = json_node_get_object(node);
    if (!qemu_img_get_string(object, "filename", &info->filename, error) ||
        !qemu_img_get_string(object, "format", &info->format, error) ||
        !qemu_img_get_string(object, "full-backing-filename", &info->backing_filename, error) ||
        !qemu_img_get_string(object, "backing-filename-format", &info->backing_format, error) ||
        !qemu_img_get_size(object, "virtual-size", &info->virtual_size, error) ||
        !qemu_img_get_size(object, "actual-size", &info->actual_size, error) ||
        !qemu_img_get_bool(object, "dirty-flag", &info->dirty, error))
        return NULL;
    /* Older qemu-img wrote only the name as the header holds it, which may be relative. */
    if (info->backing_filename == NULL &&
        !qemu_img_get_string(object, "backing-filename", &info->backing_filename, error))
        return NULL;
    if (info->filename == NULL)
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: an image has no \"filename\""),
               NULL;
    return g_steal_pointer(&info);
}

GPtrArray *
vm_qemu_img_info_parse(const char *json, gssize len, GError **error)
{
    g_autoptr(JsonParser) parser = NULL;
    g_autoptr(GPtrArray) chain = NULL;
    g_autoptr(GError) local_error = NULL;
    JsonNode *root;

    g_return_val_if_fail(json != NULL, NULL);

    if (len < 0)
        len = (gssize)strnlen(json, VM_QEMU_IMG_OUTPUT_MAX + 1);
    if ((gsize)len > VM_QEMU_IMG_OUTPUT_MAX)
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: more than %d bytes of output",
                        VM_QEMU_IMG_OUTPUT_MAX),
               NULL;
    if (!qemu_img_depth_ok(json, len))
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: JSON nested deeper than %d",
                        VM_QEMU_IMG_DEPTH_MAX),
               NULL;
    parser = json_parser_new_immutable();
    if (!json_parser_load_from_data(parser, json, len, &local_error))
        return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: %s", local_error->message), NULL;
    root = json_parser_get_root(parser);
    chain = g_ptr_array_new_with_free_func((GDestroyNotify)vm_qemu_img_info_free);
    if (root != NULL && JSON_NODE_HOLDS_ARRAY(root)) {
        JsonArray *array = json_node_get_array(root);
        guint n = json_array_get_length(array);

        for (guint i = 0; i < n; i++) {
            VmQemuImgInfo *info = qemu_img_info_from_node(json_array_get_element(array, i), error);
            if (info == NULL)
                return NULL;
            g_ptr_array_add(chain, info);
        }
        if (chain->len == 0)
            return vm_throw(error, VM_ERROR_FAILED, "qemu-img info: no image"), NULL;
    } else {
        VmQemuImgInfo *info = root != NULL ? qemu_img_info_from_node(root, error) : NULL;
        if (info == NULL) {
            if (root == NULL)
                vm_throw(error, VM_ERROR_FAILED, "qemu-img info: no output");
            return NULL;
        }
        g_ptr_array_add(chain, info);
    }
    return g_steal_pointer(&chain);
}

/* Reads from @fd until end of file into @buf, keeping at most @max bytes; returns FALSE (errno
 * set) on a read error. *ret_over is set once more than @max bytes came. */
static gboolean
qemu_img_drain(int fd, GString *buf, gsize max, gboolean *ret_over, gboolean *ret_eof)
{
    char chunk[65536];
    ssize_t n = read(fd, chunk, sizeof chunk);

    if (n < 0)
        return errno == EINTR || errno == EAGAIN;
    if (n == 0) {
        *ret_eof = TRUE;
        return TRUE;
    }
    if (buf->len + (gsize)n > max) {
        g_string_append_len(buf, chunk, max - buf->len);
        *ret_over = TRUE;
    } else {
        g_string_append_len(buf, chunk, n);
    }
    return TRUE;
}

/* Runs @argv with stdin from /dev/null, returning its stdout (NUL-terminated, at most
 * VM_QEMU_IMG_OUTPUT_MAX bytes) in @ret_out; both pipes are read together, so a chatty stderr
 * cannot stall it, and only the first QEMU_IMG_STDERR_MAX bytes of stderr are kept. */
static gboolean
qemu_img_run(const char *const *argv, GString **ret_out, GError **error)
{
    g_autoptr(GString) out = g_string_new(NULL);
    g_autoptr(GString) err = g_string_new(NULL);
    g_autoptr(GError) local_error = NULL;
    gboolean out_over = FALSE, err_over = FALSE, out_eof = FALSE, err_eof = FALSE;
    int out_fd = -1, err_fd = -1, status = 0, saved_errno = 0;
    GPid pid;

    if (!g_spawn_async_with_pipes(NULL, (char **)argv, NULL,
                                  G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD |
                                      G_SPAWN_STDIN_FROM_DEV_NULL | G_SPAWN_CLOEXEC_PIPES,
                                  NULL, NULL, &pid, NULL, &out_fd, &err_fd, &local_error))
        return vm_throw(error, VM_ERROR_IO, "cannot run %s: %s", argv[0], local_error->message);

    while (!(out_eof && err_eof) && !out_over) {
        struct pollfd fds[2] = {{out_eof ? -1 : out_fd, POLLIN, 0},
                                {err_eof ? -1 : err_fd, POLLIN, 0}};
        gboolean ok = TRUE;

        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            saved_errno = errno;
            break;
        }
        if (fds[0].revents != 0)
            ok = qemu_img_drain(out_fd, out, VM_QEMU_IMG_OUTPUT_MAX, &out_over, &out_eof);
        if (ok && fds[1].revents != 0)
            ok = qemu_img_drain(err_fd, err, QEMU_IMG_STDERR_MAX, &err_over, &err_eof);
        if (!ok) {
            saved_errno = errno;
            break;
        }
    }
    if (saved_errno != 0 || out_over)
        kill(pid, SIGKILL);
    close(out_fd);
    close(err_fd);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    g_spawn_close_pid(pid);

    if (saved_errno != 0)
        return vm_throw_errno(error, saved_errno, "cannot read the output of %s", argv[0]);
    if (out_over)
        return vm_throw(error, VM_ERROR_IO, "%s printed more than %d bytes", argv[0],
                        VM_QEMU_IMG_OUTPUT_MAX);
    if (!g_spawn_check_wait_status(status, NULL)) {
        g_autofree char *text = g_utf8_make_valid(err->str, err->len);
        return vm_throw(error, VM_ERROR_IO, "%s failed: %s", argv[0], g_strstrip(text));
    }
    *ret_out = g_steal_pointer(&out);
    return TRUE;
}

GPtrArray *
vm_qemu_img_info(const char *path, VmQemuImgInfoFlags flags, GError **error)
{
    const char *argv[8];
    g_autoptr(GString) out = NULL;
    gsize n = 0;

    g_return_val_if_fail(path != NULL, NULL);

    argv[n++] = "qemu-img";
    argv[n++] = "info";
    argv[n++] = "--output=json";
    if (flags & VM_QEMU_IMG_INFO_SHARED)
        argv[n++] = "-U";
    if (flags & VM_QEMU_IMG_INFO_BACKING_CHAIN)
        argv[n++] = "--backing-chain";
    /* A path starting with '-' is still a file name. */
    argv[n++] = "--";
    argv[n++] = path;
    argv[n] = NULL;
    if (!qemu_img_run(argv, &out, error))
        return NULL;
    return vm_qemu_img_info_parse(out->str, out->len, error);
}

gboolean
vm_qemu_img_chain_holds(const GPtrArray *chain, const char *filename)
{
    g_return_val_if_fail(chain != NULL && filename != NULL, FALSE);

    for (guint i = 0; i < chain->len; i++) {
        const VmQemuImgInfo *info = g_ptr_array_index(chain, i);
        if (g_str_equal(info->filename, filename))
            return TRUE;
    }
    return FALSE;
}
