#include "vm-qemu-img.h"

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <string.h>

#include "vm-error.h"
#include "vm-spawn.h"
#include "vm-util.h"

void
vm_qemu_img_info_free(VmQemuImgInfo *info)
{
    if (info == NULL)
        return;
    g_free(info->filename);
    g_free(info->format);
    g_free(info->backing_filename);
    g_free(info->backing_format);
    g_free(info->data_file);
    g_free(info);
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
    /* A qcow2 image's external data file is told among the format's own fields. */
    JsonNode *specific = json_object_get_member(object, "format-specific");
    if (specific != NULL && JSON_NODE_HOLDS_OBJECT(specific)) {
        JsonNode *data = json_object_get_member(json_node_get_object(specific), "data");
        if (data != NULL && JSON_NODE_HOLDS_OBJECT(data) &&
            !qemu_img_get_string(json_node_get_object(data), "data-file", &info->data_file, error))
            return NULL;
    }
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
    if (!vm_json_depth_ok(json, len, VM_QEMU_IMG_DEPTH_MAX))
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

GPtrArray *
vm_qemu_img_info(const char *path, VmQemuImgInfoFlags flags, GError **error)
{
    return vm_qemu_img_info_as(path, flags, 0, error);
}

GPtrArray *
vm_qemu_img_info_as(const char *path, VmQemuImgInfoFlags flags, guint uid, GError **error)
{
    const char *argv[10];
    g_autofree char *out = NULL;
    /* Its output describes guest-written images: bounded before anything parses it. */
    const VmSpawnOptions options = {
        .stdout_max = VM_QEMU_IMG_OUTPUT_MAX, .run_as = uid != 0, .uid = uid, .gid = uid};
    gsize n = 0;

    g_return_val_if_fail(path != NULL, NULL);

    argv[n++] = "qemu-img";
    argv[n++] = "info";
    argv[n++] = "--output=json";
    if (flags & VM_QEMU_IMG_INFO_SHARED)
        argv[n++] = "-U";
    if (flags & VM_QEMU_IMG_INFO_BACKING_CHAIN)
        argv[n++] = "--backing-chain";
    if (flags & VM_QEMU_IMG_INFO_QCOW2) {
        argv[n++] = "-f";
        argv[n++] = "qcow2";
    }
    /* A path starting with '-' is still a file name. */
    argv[n++] = "--";
    argv[n++] = path;
    argv[n] = NULL;
    if (!vm_spawn_run(argv, &options, &out, error))
        return NULL;
    return vm_qemu_img_info_parse(out, -1, error);
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

gboolean
vm_qemu_img_info_check(const VmQemuImgInfo *info, const char *path, const char *backing,
                       GError **error)
{
    g_return_val_if_fail(info != NULL && path != NULL, FALSE);

    if (g_strcmp0(info->format, "qcow2") != 0)
        return vm_throw(error, VM_ERROR_BAD_STATE, "image '%s' is not qcow2 (its header says %s)",
                        path, info->format != NULL ? info->format : "no format");
    if (info->data_file != NULL)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "image '%s' names an external data file ('%s'): refused", path,
                        info->data_file);
    if (g_strcmp0(info->backing_filename, backing) != 0)
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "image '%s' names '%s' as its backing file where hostd's record has '%s': "
                        "refused",
                        path, info->backing_filename != NULL ? info->backing_filename : "none",
                        backing != NULL ? backing : "none");
    if (info->backing_format != NULL && !g_str_equal(info->backing_format, "qcow2"))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "image '%s' names its backing file as %s, not qcow2: refused", path,
                        info->backing_format);
    return TRUE;
}

gboolean
vm_qemu_img_check(const char *path, const char *backing, guint uid, GError **error)
{
    g_autoptr(GPtrArray) chain =
        vm_qemu_img_info_as(path, VM_QEMU_IMG_INFO_SHARED | VM_QEMU_IMG_INFO_QCOW2, uid, error);

    if (chain == NULL)
        return FALSE;
    return vm_qemu_img_info_check(g_ptr_array_index(chain, 0), path, backing, error);
}

gboolean
vm_qemu_img_overlay(const char *backing, const char *path, guint size_gib, GError **error)
{
    g_autofree char *size = g_strdup_printf("%uG", size_gib);
    const char *argv[] = {"qemu-img", "create", "-q",    "-f", "qcow2", "-F", "qcow2",
                          "-u",       "-b",     backing, "--", path,    size, NULL};

    g_return_val_if_fail(backing != NULL && path != NULL, FALSE);

    g_unlink(path);
    return vm_spawn_run(argv, NULL, NULL, error);
}

gboolean
vm_qemu_img_rebase(const char *base, const char *path, guint uid, GError **error)
{
    const char *argv[] = {"qemu-img", "rebase", "-q", "-f", "qcow2", "-F",
                          "qcow2",    "-b",     base, "--", path,    NULL};
    const VmSpawnOptions options = {.run_as = uid != 0, .uid = uid, .gid = uid};

    g_return_val_if_fail(base != NULL && path != NULL, FALSE);

    return vm_spawn_run(argv, &options, NULL, error);
}

gboolean
vm_qemu_img_rebase_header(const char *base, const char *path, guint uid, GError **error)
{
    const char *argv[] = {"qemu-img", "rebase", "-q", "-u", "-f", "qcow2", "-F",
                          "qcow2",    "-b",     base, "--", path, NULL};
    const VmSpawnOptions options = {.run_as = uid != 0, .uid = uid, .gid = uid};

    g_return_val_if_fail(base != NULL && path != NULL, FALSE);

    return vm_spawn_run(argv, &options, NULL, error);
}

gboolean
vm_qemu_img_resize(const char *path, guint size_gib, guint uid, GError **error)
{
    g_autofree char *size = g_strdup_printf("%uG", size_gib);
    const char *argv[] = {"qemu-img", "resize", "-q", "-f", "qcow2", "--", path, size, NULL};
    const VmSpawnOptions options = {.run_as = uid != 0, .uid = uid, .gid = uid};

    g_return_val_if_fail(path != NULL && size_gib > 0, FALSE);

    return vm_spawn_run(argv, &options, NULL, error);
}
