#include "vm-protocol.h"

#include "vm-error.h"
#include "vm-protocol-private.h"
#include "vm-util.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Longest error or progress text a convenience constructor puts on the wire, so that building
 * such a message can never push a frame over VM_FRAME_MAX. */
#define VM_TEXT_MAX (16 * 1024)
/* A terminal size is an unsigned short in struct winsize. */
#define VM_WINSIZE_MAX G_MAXUINT16

#define REQ VM_FIELD_REQUIRED

/* clang-format off */
static const VmOpSpec vm_op_specs[] = {
    {VM_OP_PING, "ping", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_TEMPLATE_LIST, "template-list", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_TEMPLATE_BUILD, "template-build", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"force", "b"},
        {NULL}}},
    {VM_OP_AGENT_NEW, "agent-new", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"template", "s"},
        {"cpus", "u"},
        {"memory_mib", "u"},
        {"disk_gib", "u"},
        {"user_data", "s", 0, 0, VM_USER_DATA_MAX},
        {"wait", "b"},
        {"ssh_keys", "as", 0, 1, VM_SSH_KEYS_MAX},
        {"secrets", "as", 0, 1, VM_SECRETS_MAX},
        {"cold", "b"},
        {"disk_read_mib", "u"},
        {"disk_write_mib", "u"},
        {"disk_read_iops", "u"},
        {"disk_write_iops", "u"},
        {"egress", "as", 0, 1, VM_RULES_MAX},
        {"on", "s", 0, 1, VM_HOST_ID_MAX},
        {NULL}}},
    {VM_OP_AGENT_LIST, "agent-list", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_AGENT_INFO, "agent-info", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {NULL}}},
    {VM_OP_AGENT_START, "agent-start", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"wait", "b"},
        {NULL}}},
    {VM_OP_AGENT_STOP, "agent-stop", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"force", "b"},
        {"timeout_s", "u"},
        {NULL}}},
    {VM_OP_AGENT_RM, "agent-rm", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"force", "b"},
        {NULL}}},
    {VM_OP_AGENT_SSH_CONFIG, "agent-ssh-config", VM_OP_RESULT, FALSE, {
        {"name", "s"},
        {NULL}}},
    {VM_OP_EXEC, "exec", VM_OP_EXIT, FALSE, {
        {"name", "s", REQ},
        {"argv", "as", REQ, 1, VM_ARGV_MAX},
        {"env", "as", VM_FIELD_ENV, 0, VM_ARGV_MAX},
        {"cwd", "s"},
        {"tty", "b"},
        {"term", "s"},
        {"cols", "u", 0, 0, VM_WINSIZE_MAX},
        {"rows", "u", 0, 0, VM_WINSIZE_MAX},
        {NULL}}},
    {VM_OP_CHECKPOINT_CREATE, "checkpoint-create", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"label", "s", 0, 0, VM_LABEL_MAX},
        {"memory", "b"},
        {NULL}}},
    {VM_OP_CHECKPOINT_LIST, "checkpoint-list", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {NULL}}},
    {VM_OP_CHECKPOINT_RESTORE, "checkpoint-restore", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"checkpoint", "s", REQ, 1, VM_LABEL_MAX},
        {"wait", "b"},
        {"paths", "as", 0, 1, VM_PATHS_MAX},
        {NULL}}},
    {VM_OP_CHECKPOINT_RM, "checkpoint-rm", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"checkpoint", "s", REQ, 1, VM_LABEL_MAX},
        {NULL}}},
    {VM_OP_AGENT_SUSPEND, "agent-suspend", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"save", "b"},
        {NULL}}},
    {VM_OP_AGENT_RESUME, "agent-resume", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {NULL}}},
    {VM_OP_AGENT_KEEP_AWAKE, "agent-keep-awake", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"seconds", "u"},
        {"off", "b"},
        {NULL}}},
    {VM_OP_AGENT_SET_IDLE, "agent-set-idle", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"never", "b"},
        {"pause_s", "u"},
        {"save_s", "u"},
        {NULL}}},
    {VM_OP_AGENT_SET_CHECKPOINTS, "agent-set-checkpoints", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"never", "b"},
        {"every_s", "u"},
        {"keep", "u", 0, 0, 1000},
        {"hourly", "u", 0, 0, 1000},
        {"daily", "u", 0, 0, 1000},
        {NULL}}},
    {VM_OP_AGENT_FORK, "agent-fork", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"source", "s", REQ},
        {"checkpoint", "s", 0, 1, VM_LABEL_MAX},
        {"cpus", "u"},
        {"memory_mib", "u"},
        {"wait", "b"},
        {"grants", "b"},
        {"live", "b"},
        {NULL}}},
    {VM_OP_CHECKPOINT_DIFF, "checkpoint-diff", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"checkpoint", "s", REQ, 1, VM_LABEL_MAX},
        {"other", "s", 0, 1, VM_LABEL_MAX},
        {"path", "s", 0, 1, 4096},
        {NULL}}},
    {VM_OP_EGRESS_GET, "egress-get", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {NULL}}},
    {VM_OP_EGRESS_SET, "egress-set", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"allow", "as", 0, 0, VM_RULES_MAX},
        {"deny", "as", 0, 0, VM_RULES_MAX},
        {"remove", "as", 0, 0, VM_RULES_MAX},
        {"reset", "b"},
        {NULL}}},
    {VM_OP_EGRESS_LOG, "egress-log", VM_OP_EXIT, FALSE, {
        {"name", "s", REQ},
        {"follow", "b"},
        {"lines", "u"},
        {NULL}}},
    {VM_OP_AGENT_SET_RESTART, "agent-set-restart", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"policy", "s", REQ, 1, 16},
        {NULL}}},
    {VM_OP_HOST_SAVE_ALL, "host-save-all", VM_OP_RESULT, FALSE, {
        {"timeout_s", "u", 0, 1, 3600},
        {NULL}}},
    {VM_OP_EVENTS, "events", VM_OP_EXIT, FALSE, {
        {"name", "s"},
        {"since", "x"},
        {"lines", "u"},
        {"follow", "b"},
        {NULL}}},
    {VM_OP_FORWARD_ADD, "forward-add", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"guest_port", "u", REQ, 1, 65535},
        {"host_port", "u", 0, 1, 65535},
        {NULL}}},
    {VM_OP_FORWARD_RM, "forward-rm", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"guest_port", "u", REQ, 1, 65535},
        {NULL}}},
    {VM_OP_FORWARD_LIST, "forward-list", VM_OP_RESULT, FALSE, {
        {"name", "s"},
        {NULL}}},
    {VM_OP_AGENT_AUTHORIZE_ADD, "agent-authorize-add", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"keys", "as", REQ, 1, VM_SSH_KEYS_MAX},
        {NULL}}},
    {VM_OP_AGENT_AUTHORIZE_RM, "agent-authorize-rm", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"fingerprint", "s", REQ, 1, VM_FINGERPRINT_MAX},
        {NULL}}},
    {VM_OP_AGENT_AUTHORIZE_LIST, "agent-authorize-list", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {NULL}}},
    {VM_OP_SECRET_CREATE, "secret-create", VM_OP_RESULT, FALSE, {
        {"secret", "s", REQ, 1, VM_SECRET_NAME_MAX},
        {"hosts", "as", REQ, 1, VM_SECRET_HOSTS_MAX},
        {"header", "s", 0, 1, 600},
        {"format", "s", 0, 1, 256},
        {"env", "s", 0, 1, 128},
        {"value", "ay", REQ, 0, VM_SECRET_VALUE_MAX},
        {NULL}}},
    {VM_OP_SECRET_LIST, "secret-list", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_SECRET_SET, "secret-set", VM_OP_RESULT, FALSE, {
        {"secret", "s", REQ, 1, VM_SECRET_NAME_MAX},
        {"value", "ay", REQ, 0, VM_SECRET_VALUE_MAX},
        {NULL}}},
    {VM_OP_SECRET_RM, "secret-rm", VM_OP_RESULT, FALSE, {
        {"secret", "s", REQ, 1, VM_SECRET_NAME_MAX},
        {"force", "b"},
        {NULL}}},
    {VM_OP_SECRET_GRANT, "secret-grant", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"secret", "s", REQ, 1, VM_SECRET_NAME_MAX},
        {NULL}}},
    {VM_OP_SECRET_REVOKE, "secret-revoke", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"secret", "s", REQ, 1, VM_SECRET_NAME_MAX},
        {NULL}}},
    {VM_OP_AGENT_SET_RESOURCES, "agent-set-resources", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"cpus", "u", 0, 1, VM_SET_CPUS_MAX},
        {"cpus_add", "u", 0, 1, VM_SET_CPUS_MAX},
        {"memory_mib", "u", 0, 1, VM_SET_MEMORY_MIB_MAX},
        {"memory_add_mib", "u", 0, 1, VM_SET_MEMORY_MIB_MAX},
        {"disk_gib", "u", 0, 1, VM_SET_DISK_GIB_MAX},
        {"disk_add_gib", "u", 0, 1, VM_SET_DISK_GIB_MAX},
        {NULL}}},
    {VM_OP_EGRESS_PRESETS, "egress-presets", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_AGENT_LOGS, "agent-logs", VM_OP_EXIT, FALSE, {
        {"name", "s", REQ},
        {"follow", "b"},
        {"lines", "u"},
        {"cloud_init", "b"},
        {NULL}}},
    {VM_OP_AGENT_STATS, "agent-stats", VM_OP_RESULT, FALSE, {
        {"names", "as", 0, 0, VM_NAMES_MAX},
        {NULL}}},
    {VM_OP_FLEET_HOSTS, "fleet-hosts", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_FLEET_LIST, "fleet-list", VM_OP_RESULT, FALSE, {{NULL}}},
    {VM_OP_FLEET_DRAIN, "fleet-drain", VM_OP_RESULT, FALSE, {
        {"host", "s", REQ, 1, VM_HOST_ID_MAX},
        {"drained", "b", REQ},
        {NULL}}},
    {VM_OP_MOVE_OUT, "move-out", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"step", "s", REQ, 1, 16},
        {"to", "s", 0, 1, VM_HOST_ID_MAX},
        {"checkpoint", "s", 0, 1, VM_MOVE_FILE_MAX},
        {"hosts", "as", 0, 0, VM_REPLICAS_MAX},
        {NULL}}},
    {VM_OP_MOVE_READ, "move-read", VM_OP_EXIT, FALSE, {
        {"name", "s", REQ},
        {"file", "s", REQ, 1, VM_MOVE_FILE_MAX},
        {NULL}}},
    {VM_OP_MOVE_IN, "move-in", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"step", "s", REQ, 1, 16},
        {"from", "s", 0, 1, VM_HOST_ID_MAX},
        {"epoch", "x"},
        {"template", "s"},
        {"cpus", "u"},
        {"memory_mib", "u"},
        {"disk_gib", "u"},
        {"base_sha256", "s", 0, VM_SHA256_HEX, VM_SHA256_HEX},
        {"source_dir", "s", 0, 1, VM_PATH_MAX},
        {"base_path", "s", 0, 1, VM_PATH_MAX},
        {"warm_path", "s", 0, 1, VM_PATH_MAX},
        {"files", "as", 0, 1, VM_MOVE_FILES_MAX},
        {"checkpoint", "s", 0, 1, VM_MOVE_FILE_MAX},
        {NULL}}},
    {VM_OP_MOVE_WRITE, "move-write", VM_OP_EXIT, FALSE, {
        {"name", "s", REQ},
        {"file", "s", REQ, 1, VM_MOVE_FILE_MAX},
        {"size", "x", REQ},
        {NULL}}},
    {VM_OP_AGENT_RECOVER, "agent-recover", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"to", "s", 0, 1, VM_HOST_ID_MAX},
        {NULL}}},
    {VM_OP_AGENT_SET_REPLICATE, "agent-set-replicate", VM_OP_RESULT, FALSE, {
        {"name", "s", REQ},
        {"copies", "u", 0, 0, VM_REPLICAS_MAX},
        {NULL}}},

    {VM_OP_STDIN, "stdin", 0, FALSE, {
        {"data", "ay", REQ, 0, VM_STREAM_CHUNK_MAX},
        {NULL}}},
    {VM_OP_STDIN_EOF, "stdin-eof", 0, FALSE, {{NULL}}},
    {VM_OP_WINDOW_SIZE, "window-size", 0, FALSE, {
        {"cols", "u", REQ, 0, VM_WINSIZE_MAX},
        {"rows", "u", REQ, 0, VM_WINSIZE_MAX},
        {NULL}}},

    {VM_OP_PROGRESS, "progress", 0, FALSE, {
        {"message", "s", REQ},
        {"fraction", "d", VM_FIELD_UNIT_INTERVAL},
        {NULL}}},
    {VM_OP_RESULT, "result", 0, TRUE, {{NULL}}},
    {VM_OP_ERROR, "error", 0, FALSE, {
        {"code", "u", REQ, VM_ERROR_FAILED, VM_ERROR_WIRE_LAST},
        {"message", "s", REQ},
        {NULL}}},
    {VM_OP_STDOUT, "stdout", 0, FALSE, {
        {"data", "ay", REQ, 0, VM_STREAM_CHUNK_MAX},
        {NULL}}},
    {VM_OP_STDERR, "stderr", 0, FALSE, {
        {"data", "ay", REQ, 0, VM_STREAM_CHUNK_MAX},
        {NULL}}},
    {VM_OP_EXIT, "exit", 0, FALSE, {
        {"status", "i", REQ},
        {"sha256", "s", 0, VM_SHA256_HEX, VM_SHA256_HEX},
        {NULL}}},
    {VM_OP_RESULT_PART, "result-part", 0, FALSE, {
        {"data", "ay", REQ, 1, VM_RESULT_PART_MAX},
        {NULL}}},
    {VM_OP_ELSEWHERE, "elsewhere", 0, FALSE, {
        {"host", "s", REQ, 1, VM_HOST_ID_MAX},
        {"address", "s", REQ, 1, VM_ADDRESS_MAX},
        {"message", "s", REQ},
        {NULL}}},
};
/* clang-format on */

#undef REQ

const VmOpSpec *
vm_op_spec_table(gsize *ret_n)
{
    *ret_n = G_N_ELEMENTS(vm_op_specs);
    return vm_op_specs;
}

static const VmOpSpec *
vm_op_spec(VmOp op)
{
    for (gsize i = 0; i < G_N_ELEMENTS(vm_op_specs); i++) {
        if (vm_op_specs[i].op == op)
            return &vm_op_specs[i];
    }
    return NULL;
}

const char *
vm_disk_limit_field(VmDiskLimit limit)
{
    static const char *const fields[VM_DISK_LIMITS] = {
        [VM_DISK_READ_MIB] = "disk_read_mib",
        [VM_DISK_WRITE_MIB] = "disk_write_mib",
        [VM_DISK_READ_IOPS] = "disk_read_iops",
        [VM_DISK_WRITE_IOPS] = "disk_write_iops",
    };

    g_return_val_if_fail(limit < VM_DISK_LIMITS, NULL);
    return fields[limit];
}

const char *
vm_op_name(VmOp op)
{
    const VmOpSpec *spec = vm_op_spec(op);

    return spec != NULL ? spec->name : NULL;
}

gboolean
vm_op_is_request(VmOp op)
{
    const VmOpSpec *spec = vm_op_spec(op);

    return spec != NULL && spec->reply != 0;
}

VmOp
vm_op_reply_end(VmOp op)
{
    const VmOpSpec *spec = vm_op_spec(op);

    return spec != NULL ? spec->reply : 0;
}

/* Keys come from the peer: show at most a short, printable prefix of them in messages. */
static char *
vm_shown_key(const char *key)
{
    g_autofree char *prefix = g_strndup(key, 64);

    return g_strescape(prefix, NULL);
}

static gboolean
vm_field_check(const VmOpSpec *spec, const VmFieldSpec *field, GVariant *value, GError **error)
{
    const GVariantType *type = G_VARIANT_TYPE(field->type);
    guint64 count = 0;

    if (!g_variant_is_of_type(value, type))
        return vm_throw(error, VM_ERROR_PROTOCOL, "field '%s' of %s must have type %s, not %s",
                        field->key, spec->name, field->type, g_variant_get_type_string(value));

    switch (field->type[0]) {
    case 's':
        count = strlen(g_variant_get_string(value, NULL));
        break;
    case 'a':
        count = g_variant_n_children(value);
        break;
    case 'u':
        count = g_variant_get_uint32(value);
        break;
    case 'd': {
        double d = g_variant_get_double(value);

        if ((field->flags & VM_FIELD_UNIT_INTERVAL) && !(d >= 0.0 && d <= 1.0))
            return vm_throw(error, VM_ERROR_PROTOCOL, "field '%s' of %s must be in [0, 1]",
                            field->key, spec->name);
        return TRUE;
    }
    default:
        return TRUE;
    }

    if (count < field->min)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "field '%s' of %s is below its minimum %" G_GUINT64_FORMAT, field->key,
                        spec->name, field->min);
    if (field->max != 0 && count > field->max)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "field '%s' of %s is over its limit %" G_GUINT64_FORMAT, field->key,
                        spec->name, field->max);

    if (field->flags & VM_FIELD_ENV) {
        for (gsize i = 0; i < count; i++) {
            const char *entry = NULL;

            g_variant_get_child(value, i, "&s", &entry);
            if (entry[0] == '=' || strchr(entry, '=') == NULL)
                return vm_throw(error, VM_ERROR_PROTOCOL,
                                "field '%s' of %s: entry %" G_GSIZE_FORMAT " is not NAME=VALUE",
                                field->key, spec->name, i);
        }
    }
    return TRUE;
}

/* Checks @fields (any GVariant) against the schema of @op. */
static gboolean
vm_message_validate(VmOp op, GVariant *fields, GError **error)
{
    const VmOpSpec *spec = vm_op_spec(op);
    g_autoptr(GHashTable) seen = NULL;
    gsize n_fields;

    if (spec == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "unknown operation %u", (guint)op);
    if (!g_variant_is_of_type(fields, G_VARIANT_TYPE_VARDICT))
        return vm_throw(error, VM_ERROR_PROTOCOL, "fields of %s must have type a{sv}, not %s",
                        spec->name, g_variant_get_type_string(fields));

    /* A dictionary in normal form may still repeat a key; which copy wins would be up to the
     * reader, so refuse it. */
    seen = g_hash_table_new(g_str_hash, g_str_equal);
    n_fields = g_variant_n_children(fields);
    for (gsize i = 0; i < n_fields; i++) {
        g_autoptr(GVariant) value = NULL;
        const VmFieldSpec *field = NULL;
        const char *key = NULL;

        g_variant_get_child(fields, i, "{&sv}", &key, &value);

        if (!g_hash_table_add(seen, (gpointer)key)) {
            g_autofree char *shown = vm_shown_key(key);
            return vm_throw(error, VM_ERROR_PROTOCOL, "field '%s' repeated in %s", shown,
                            spec->name);
        }
        if (spec->free_form)
            continue;
        for (const VmFieldSpec *f = spec->fields; f->key != NULL; f++) {
            if (strcmp(f->key, key) == 0) {
                field = f;
                break;
            }
        }
        if (field == NULL) {
            g_autofree char *shown = vm_shown_key(key);
            return vm_throw(error, VM_ERROR_PROTOCOL, "unknown field '%s' in %s", shown,
                            spec->name);
        }
        if (!vm_field_check(spec, field, value, error))
            return FALSE;
    }

    for (const VmFieldSpec *f = spec->fields; f->key != NULL; f++) {
        if ((f->flags & VM_FIELD_REQUIRED) && !g_hash_table_contains(seen, f->key))
            return vm_throw(error, VM_ERROR_PROTOCOL, "%s lacks required field '%s'", spec->name,
                            f->key);
    }
    return TRUE;
}

VmMessage *
vm_message_new(VmOp op, GVariant *fields, GError **error)
{
    g_autoptr(GVariant) owned = NULL;
    VmMessage *message = NULL;

    owned = fields != NULL ? g_variant_take_ref(fields)
                           : g_variant_ref_sink(g_variant_new("a{sv}", NULL));
    /* Serialise now: afterwards, strings and byte arrays handed out by the accessors (and the
     * keys the validation holds on to) point into one buffer that lives as long as @owned. */
    (void)g_variant_get_data(owned);
    if (!vm_message_validate(op, owned, error))
        return NULL;

    message = g_new0(VmMessage, 1);
    message->op = op;
    message->fields = g_steal_pointer(&owned);
    return message;
}

VmMessage *
vm_message_new_error(const GError *error)
{
    g_autofree char *text = NULL;
    GVariantBuilder builder;

    g_return_val_if_fail(error != NULL, NULL);

    text = vm_utf8_cut(error->message, VM_TEXT_MAX);
    /* vmctl's own codes never travel: one of them in hostd would be a bug, sent as failed. */
    VmErrorCode code = vm_error_code(error);
    if (code > VM_ERROR_WIRE_LAST)
        code = VM_ERROR_FAILED;
    g_variant_builder_init(&builder, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&builder, "{sv}", "code", g_variant_new_uint32(code));
    g_variant_builder_add(&builder, "{sv}", "message", g_variant_new_string(text));
    return vm_message_new(VM_OP_ERROR, g_variant_builder_end(&builder), NULL);
}

VmMessage *
vm_message_new_progress(const char *message, double fraction)
{
    g_autofree char *text = vm_utf8_cut(message, VM_TEXT_MAX);
    GVariantBuilder builder;

    g_variant_builder_init(&builder, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&builder, "{sv}", "message", g_variant_new_string(text));
    /* Negative (or NaN) means unknown, which the wire says by leaving the field out. */
    if (fraction >= 0.0)
        g_variant_builder_add(&builder, "{sv}", "fraction",
                              g_variant_new_double(MIN(fraction, 1.0)));
    return vm_message_new(VM_OP_PROGRESS, g_variant_builder_end(&builder), NULL);
}

VmMessage *
vm_message_new_data(VmOp op, const void *data, gsize len)
{
    g_autoptr(GBytes) bytes = NULL;
    GVariant *value = NULL;
    GVariantBuilder builder;

    g_return_val_if_fail(op == VM_OP_STDIN || op == VM_OP_STDOUT || op == VM_OP_STDERR, NULL);
    g_return_val_if_fail(len <= VM_STREAM_CHUNK_MAX, NULL);
    g_return_val_if_fail(data != NULL || len == 0, NULL);

    bytes = g_bytes_new(data, len);
    value = g_variant_new_from_bytes(G_VARIANT_TYPE_BYTESTRING, bytes, TRUE);
    g_variant_builder_init(&builder, G_VARIANT_TYPE_VARDICT);
    g_variant_builder_add(&builder, "{sv}", "data", value);
    return vm_message_new(op, g_variant_builder_end(&builder), NULL);
}

void
vm_message_free(VmMessage *message)
{
    if (message == NULL)
        return;
    g_clear_pointer(&message->fields, g_variant_unref);
    g_free(message);
}

const char *
vm_message_get_string(const VmMessage *message, const char *key, const char *fallback)
{
    g_autoptr(GVariant) value = NULL;

    g_return_val_if_fail(message != NULL && key != NULL, fallback);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_STRING);
    /* The string lives in the serialised buffer of message->fields, not in @value. */
    return value != NULL ? g_variant_get_string(value, NULL) : fallback;
}

guint32
vm_message_get_uint(const VmMessage *message, const char *key, guint32 fallback)
{
    g_autoptr(GVariant) value = NULL;

    g_return_val_if_fail(message != NULL && key != NULL, fallback);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_UINT32);
    return value != NULL ? g_variant_get_uint32(value) : fallback;
}

gint32
vm_message_get_int(const VmMessage *message, const char *key, gint32 fallback)
{
    g_autoptr(GVariant) value = NULL;

    g_return_val_if_fail(message != NULL && key != NULL, fallback);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_INT32);
    return value != NULL ? g_variant_get_int32(value) : fallback;
}

gboolean
vm_message_get_bool(const VmMessage *message, const char *key, gboolean fallback)
{
    g_autoptr(GVariant) value = NULL;

    g_return_val_if_fail(message != NULL && key != NULL, fallback);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_BOOLEAN);
    return value != NULL ? g_variant_get_boolean(value) : fallback;
}

double
vm_message_get_double(const VmMessage *message, const char *key, double fallback)
{
    g_autoptr(GVariant) value = NULL;

    g_return_val_if_fail(message != NULL && key != NULL, fallback);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_DOUBLE);
    return value != NULL ? g_variant_get_double(value) : fallback;
}

GVariant *
vm_message_lookup(const VmMessage *message, const char *key)
{
    g_return_val_if_fail(message != NULL && key != NULL, NULL);
    return g_variant_lookup_value(message->fields, key, NULL);
}

char **
vm_message_dup_strv(const VmMessage *message, const char *key)
{
    g_autoptr(GVariant) value = NULL;

    g_return_val_if_fail(message != NULL && key != NULL, NULL);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_STRING_ARRAY);
    return value != NULL ? g_variant_dup_strv(value, NULL) : NULL;
}

const guint8 *
vm_message_get_data(const VmMessage *message, const char *key, gsize *ret_len)
{
    static const guint8 empty[1];
    g_autoptr(GVariant) value = NULL;
    const guint8 *data = NULL;
    gsize len = 0;

    g_return_val_if_fail(message != NULL && key != NULL, NULL);
    value = g_variant_lookup_value(message->fields, key, G_VARIANT_TYPE_BYTESTRING);
    if (value == NULL)
        return NULL;
    data = g_variant_get_fixed_array(value, &len, 1);
    if (ret_len != NULL)
        *ret_len = len;
    /* Present but empty must stay distinguishable from absent. */
    return len > 0 ? data : empty;
}

gboolean
vm_message_to_error(const VmMessage *message, GError **error)
{
    guint32 code;

    g_return_val_if_fail(message != NULL, FALSE);
    if (message->op != VM_OP_ERROR)
        return vm_throw(error, VM_ERROR_PROTOCOL, "expected an error message, got %s",
                        vm_op_name(message->op) != NULL ? vm_op_name(message->op) : "unknown");
    code = vm_message_get_uint(message, "code", VM_ERROR_FAILED);
    if (code < VM_ERROR_FAILED || code > VM_ERROR_WIRE_LAST)
        code = VM_ERROR_FAILED;
    return vm_throw(error, (VmErrorCode)code, "%s", vm_message_get_string(message, "message", ""));
}

GBytes *
vm_message_encode(const VmMessage *message, GError **error)
{
    g_autoptr(GVariant) payload = NULL;
    guint8 *frame = NULL;
    gsize size;

    g_return_val_if_fail(message != NULL && message->fields != NULL, NULL);

    payload = g_variant_ref_sink(g_variant_new("(u@a{sv})", (guint32)message->op, message->fields));
    /* The wire is little-endian whatever the host is. */
    if (G_BYTE_ORDER == G_BIG_ENDIAN) {
        GVariant *swapped = g_variant_byteswap(payload);

        g_variant_unref(payload);
        payload = swapped;
    }
    size = g_variant_get_size(payload);
    if (size > VM_FRAME_MAX) {
        vm_throw(error, VM_ERROR_PROTOCOL,
                 "%s message of %" G_GSIZE_FORMAT " bytes is over the frame limit of %d",
                 vm_op_name(message->op), size, VM_FRAME_MAX);
        return NULL;
    }

    frame = g_malloc(VM_FRAME_HEADER_SIZE + size);
    frame[0] = (size >> 24) & 0xff;
    frame[1] = (size >> 16) & 0xff;
    frame[2] = (size >> 8) & 0xff;
    frame[3] = size & 0xff;
    /* Not g_variant_store(): it wants the destination aligned like the type, and the payload
     * starts 4 bytes in. */
    memcpy(frame + VM_FRAME_HEADER_SIZE, g_variant_get_data(payload), size);
    return g_bytes_new_take(frame, VM_FRAME_HEADER_SIZE + size);
}

/* A decoded frame's copy: a request may carry a secret's value (secret add), so the copy is
 * wiped when the last variant over it goes. data is 16 bytes in, aligned as GVariant wants. */
typedef struct {
    gsize size;
    gsize pad;
    guint8 data[];
} VmWipedBlock;

static void
vm_wiped_block_free(gpointer block)
{
    VmWipedBlock *b = block;

    explicit_bzero(b->data, b->size);
    g_free(b);
}

VmMessage *
vm_message_decode(const guint8 *payload, gsize len, GError **error)
{
    g_autoptr(GBytes) bytes = NULL;
    g_autoptr(GVariant) variant = NULL;
    g_autoptr(GVariant) fields = NULL;
    guint32 op;

    g_return_val_if_fail(payload != NULL || len == 0, NULL);

    if (len > VM_FRAME_MAX) {
        vm_throw(error, VM_ERROR_PROTOCOL,
                 "frame of %" G_GSIZE_FORMAT " bytes is over the limit of %d", len, VM_FRAME_MAX);
        return NULL;
    }

    /* A private copy: GVariant wants aligned data that outlives the variant. Eight spare zero
     * bytes, because GLib 2.74's normal-form check reads past the end of short malformed
     * payloads. */
    VmWipedBlock *copy = g_malloc0(sizeof(VmWipedBlock) + len + 8);
    copy->size = len + 8;
    if (len > 0)
        memcpy(copy->data, payload, len);
    g_autoptr(GBytes) padded =
        g_bytes_new_with_free_func(copy->data, len + 8, vm_wiped_block_free, copy);
    bytes = g_bytes_new_from_bytes(padded, 0, len);
    variant =
        g_variant_ref_sink(g_variant_new_from_bytes(G_VARIANT_TYPE(VM_MESSAGE_TYPE), bytes, FALSE));
    if (!g_variant_is_normal_form(variant)) {
        vm_throw(error, VM_ERROR_PROTOCOL, "frame is not a %s in normal form", VM_MESSAGE_TYPE);
        return NULL;
    }
    if (G_BYTE_ORDER == G_BIG_ENDIAN) {
        GVariant *swapped = g_variant_byteswap(variant);

        g_variant_unref(variant);
        variant = swapped;
    }

    g_variant_get(variant, "(u@a{sv})", &op, &fields);
    return vm_message_new((VmOp)op, g_steal_pointer(&fields), error);
}

/* Reads up to @len bytes, stopping early only at EOF. With @deadline (monotonic us; 0: none)
 * waits for each part only until then: a peer that trickles bytes cannot stretch it. Returns the
 * count, or -1 with errno (ETIMEDOUT past the deadline). */
static gssize
vm_read_full(int fd, guint8 *buf, gsize len, gint64 deadline)
{
    gsize done = 0;

    while (done < len) {
        if (deadline > 0) {
            gint64 left = deadline - g_get_monotonic_time();
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            int ready = left > 0 ? poll(&pfd, 1, (int)MAX(left / 1000, 1)) : 0;
            if (ready < 0 && errno == EINTR)
                continue;
            if (ready == 0) {
                errno = ETIMEDOUT;
                return -1;
            }
            if (ready < 0)
                return -1;
        }
        gssize n = read(fd, buf + done, len - done);

        if (n < 0 && errno == EINTR)
            continue;
        /* On a Unix socket ECONNRESET is how a peer that closed with our data unread looks:
         * the same end of conversation as EOF. */
        if (n < 0 && errno == ECONNRESET)
            break;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        done += n;
    }
    return done;
}

VmMessage *
vm_message_read_fd(int fd, gboolean *ret_eof, GError **error)
{
    return vm_message_read_fd_until(fd, 0, ret_eof, error);
}

VmMessage *
vm_message_read_fd_until(int fd, gint64 deadline, gboolean *ret_eof, GError **error)
{
    guint8 header[VM_FRAME_HEADER_SIZE];
    g_autofree guint8 *payload = NULL;
    gssize n;
    guint32 len;

    g_return_val_if_fail(fd >= 0, NULL);

    if (ret_eof != NULL)
        *ret_eof = FALSE;

    n = vm_read_full(fd, header, sizeof(header), deadline);
    if (n < 0 && errno == ETIMEDOUT)
        return vm_throw(error, VM_ERROR_TIMEOUT, "no whole frame in time"), NULL;
    if (n < 0) {
        vm_throw_errno(error, errno, "cannot read a frame");
        return NULL;
    }
    if (n == 0) {
        if (ret_eof != NULL) {
            *ret_eof = TRUE;
            return NULL;
        }
        vm_throw(error, VM_ERROR_PROTOCOL, "connection closed before a frame");
        return NULL;
    }
    if (n < (gssize)sizeof(header)) {
        vm_throw(error, VM_ERROR_PROTOCOL,
                 "truncated frame header (%" G_GSSIZE_FORMAT " of %d bytes)", n,
                 VM_FRAME_HEADER_SIZE);
        return NULL;
    }

    len = (guint32)header[0] << 24 | (guint32)header[1] << 16 | (guint32)header[2] << 8 |
          (guint32)header[3];
    /* Checked before allocating: the length comes from the peer. */
    if (len > VM_FRAME_MAX) {
        vm_throw(error, VM_ERROR_PROTOCOL, "frame of %u bytes is over the limit of %d", len,
                 VM_FRAME_MAX);
        return NULL;
    }

    payload = g_malloc(MAX(len, 1));
    n = vm_read_full(fd, payload, len, deadline);
    if (n < 0 && errno == ETIMEDOUT)
        return vm_throw(error, VM_ERROR_TIMEOUT, "no whole frame in time"), NULL;
    if (n < 0) {
        vm_throw_errno(error, errno, "cannot read a frame");
        return NULL;
    }
    if ((gsize)n < len) {
        vm_throw(error, VM_ERROR_PROTOCOL, "truncated frame (%" G_GSSIZE_FORMAT " of %u bytes)", n,
                 len);
        return NULL;
    }
    VmMessage *message = vm_message_decode(payload, len, error);
    /* As in vm_message_decode(): no copy of a secret's value stays in freed memory. */
    explicit_bzero(payload, len);
    return message;
}

gboolean
vm_message_write_fd(int fd, const VmMessage *message, GError **error)
{
    g_autoptr(GBytes) frame = NULL;
    const guint8 *data;
    gsize len;
    gsize done = 0;
    gboolean is_socket = TRUE;

    g_return_val_if_fail(fd >= 0, FALSE);
    g_return_val_if_fail(message != NULL, FALSE);

    frame = vm_message_encode(message, error);
    if (frame == NULL)
        return FALSE;
    data = g_bytes_get_data(frame, &len);

    while (done < len) {
        gssize n;

        if (is_socket) {
            n = send(fd, data + done, len - done, MSG_NOSIGNAL);
            if (n < 0 && errno == ENOTSOCK) {
                is_socket = FALSE;
                continue;
            }
        } else {
            n = vm_write_nosignal(fd, data + done, len - done);
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot write a frame");
        done += n;
    }
    return TRUE;
}
