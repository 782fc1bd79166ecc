#include "hostd-authorize-private.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hostd-agent.h"
#include "hostd-guest.h"
#include "hostd-keys.h"
#include "hostd-power.h"
#include "vm-error.h"
#include "vm-name.h"
#include "vm-protocol.h"
#include "vm-util.h"

/* Runs as the agent's user. awk keeps every line whose comment does not start with the mark;
 * anything but a readable file there stops the script (set -e) before the file is replaced, so
 * hostd's own key is never lost on the way. */
static const char authorize_guest_script[] =
    "set -eu\n"
    "umask 077\n"
    "dir=\"$HOME/.ssh\"\n"
    "file=\"$dir/authorized_keys\"\n"
    "mkdir -p \"$dir\"\n"
    "chmod 700 \"$dir\"\n"
    "tmp=$(mktemp \"$dir/.authorized_keys.XXXXXX\")\n"
    "trap 'rm -f \"$tmp\"' EXIT\n"
    "if [ -e \"$file\" ] || [ -L \"$file\" ]; then\n"
    "    [ -f \"$file\" ] || { echo \"$file is not a file\" >&2; exit 1; }\n"
    "    awk '$3 != \"" HOSTD_USER_KEY_MARK "\"' \"$file\" >\"$tmp\"\n"
    "fi\n"
    "cat >>\"$tmp\"\n"
    "chmod 600 \"$tmp\"\n"
    "sync \"$tmp\" 2>/dev/null || sync\n"
    "mv -f \"$tmp\" \"$file\"\n"
    "trap - EXIT\n";

const char *
hostd_authorize_guest_script(void)
{
    return authorize_guest_script;
}

char *
hostd_authorize_guest_input(GPtrArray *keys)
{
    g_autoptr(GString) text = g_string_new(NULL);

    for (guint i = 0; i < keys->len; i++) {
        g_autofree char *line = hostd_user_key_guest_line(keys->pdata[i]);
        g_string_append_printf(text, "%s\n", line);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* Makes the running guest of @r hold @keys: one command, with the lines on its stdin. */
static gboolean
authorize_apply(HostdContext *ctx, const HostdAgentRecord *r, GPtrArray *keys, GError **error)
{
    g_autofree char *input = hostd_authorize_guest_input(keys);
    gsize len = strlen(input);
    vm_autofd fd = memfd_create("vmctl-authorized-keys", MFD_CLOEXEC);

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot make the guest's key list");
    for (gsize done = 0; done < len;) {
        ssize_t n = write(fd, input + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return vm_throw_errno(error, errno, "cannot make the guest's key list");
        done += (gsize)n;
    }
    if (lseek(fd, 0, SEEK_SET) < 0)
        return vm_throw_errno(error, errno, "cannot make the guest's key list");

    char *argv[] = {"sh", "-c", (char *)authorize_guest_script, NULL};
    int status = -1;
    g_autofree char *guest_stderr = NULL;
    if (!hostd_agent_run(ctx, r, argv, fd, &status, &guest_stderr, error))
        return FALSE;
    if (status != 0)
        return vm_throw(error, VM_ERROR_FAILED,
                        "the guest could not write %s's ~/.ssh/authorized_keys (exit %d): %s",
                        r->user, status, g_strstrip(guest_stderr));
    return TRUE;
}

/* With @r's lock held: wakes a paused or saved agent, as exec does; its keys change inside the
 * running guest, so a stopped one is refused. */
static gboolean
authorize_wake_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                      GError **error)
{
    const char *state = hostd_libvirt_state_name(dom);

    if ((g_str_equal(state, "paused") || g_str_equal(state, "saved")) &&
        !hostd_power_wake_locked(ctx, r, dom, error))
        return FALSE;
    state = hostd_libvirt_state_name(dom);
    if (!g_str_equal(state, "running"))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is %s: its keys change inside the running guest; start it "
                        "with: vmctl start %s",
                        r->name, state, r->name);
    return TRUE;
}

static GVariant *
authorize_keys_to_variant(GPtrArray *keys)
{
    g_auto(GVariantBuilder) b = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE("aa{sv}"));

    for (guint i = 0; i < keys->len; i++)
        g_variant_builder_add_value(&b, hostd_user_key_to_variant(keys->pdata[i]));
    return g_variant_builder_end(&b);
}

/* With the lock held: the guest first, then the record, so that the record never lists a key
 * the guest did not take. */
static gboolean
authorize_store(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom, GPtrArray *keys,
                GError **error)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);

    if (!authorize_wake_locked(ctx, r, dom, error) || !authorize_apply(ctx, r, keys, error))
        return FALSE;
    if (!hostd_user_keys_save(path, keys, error)) {
        g_prefix_error(error, "the guest has the new keys, but hostd could not record them: ");
        return FALSE;
    }
    return TRUE;
}

/* Changes @keys, the keys recorded for agent @name, in place; when it fails nothing is stored. */
typedef gboolean (*AuthorizeEdit)(const char *name, GPtrArray *keys, gpointer data, GError **error);

/* What adding and removing a key share: with agent @name locked and open, its recorded keys
 * loaded, @edit changes them, then they reach the guest and the record (authorize_store()).
 * Returns the keys as they are now. */
static GVariant *
authorize_change(HostdContext *ctx, const char *name, AuthorizeEdit edit, gpointer data,
                 GError **error)
{
    g_autoptr(HostdNameLock) lock = NULL;
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(virDomain) dom = NULL;
    if (!hostd_agent_lock_open(ctx, name, &lock, &r, &dom, error))
        return NULL;
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    g_autoptr(GPtrArray) record = hostd_user_keys_load(path, error);
    if (record == NULL || !edit(name, record, data, error) ||
        !authorize_store(ctx, r, dom, record, error))
        return NULL;
    return authorize_keys_to_variant(record);
}

typedef struct {
    GPtrArray *keys;
    guint added;
} AuthorizeAdd;

static gboolean
authorize_edit_add(const char *name, GPtrArray *record, gpointer data, GError **error)
{
    AuthorizeAdd *add = data;

    add->added = hostd_user_keys_merge(record, add->keys);
    if (record->len > VM_SSH_KEYS_MAX)
        return vm_throw(error, VM_ERROR_NO_RESOURCES,
                        "agent '%s' would have %u keys: at most %d; remove some first (vmctl "
                        "authorize %s --rm FINGERPRINT)",
                        name, record->len, VM_SSH_KEYS_MAX, name);
    return TRUE;
}

GVariant *
hostd_authorize_add(HostdContext *ctx, const char *name, const char *const *lines, guint *ret_added,
                    GError **error)
{
    g_return_val_if_fail(lines != NULL, NULL);

    if (!vm_name_validate(name, error))
        return NULL;
    g_autoptr(GPtrArray) keys = hostd_user_keys_check(lines, error);
    if (keys == NULL)
        return NULL;

    AuthorizeAdd add = {.keys = keys};
    GVariant *now = authorize_change(ctx, name, authorize_edit_add, &add, error);
    if (now != NULL && ret_added != NULL)
        *ret_added = add.added;
    return now;
}

static gboolean
authorize_edit_rm(const char *name, GPtrArray *record, gpointer data, GError **error)
{
    const char *fingerprint = data;
    gint at = hostd_user_keys_find(record, fingerprint);

    if (at < 0) {
        g_autofree char *shown = vm_utf8_cut(fingerprint, 80);
        g_autofree char *escaped = g_strescape(shown, NULL);
        return vm_throw(error, VM_ERROR_NOT_FOUND,
                        "agent '%s' has no key %s; see: vmctl authorize %s --list", name, escaped,
                        name);
    }
    g_ptr_array_remove_index(record, (guint)at);
    return TRUE;
}

GVariant *
hostd_authorize_rm(HostdContext *ctx, const char *name, const char *fingerprint, GError **error)
{
    g_return_val_if_fail(fingerprint != NULL, NULL);

    return authorize_change(ctx, name, authorize_edit_rm, (gpointer)fingerprint, error);
}

GVariant *
hostd_authorize_list(HostdContext *ctx, const char *name, GError **error)
{
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(ctx, name, error);
    if (r == NULL)
        return NULL;
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    g_autoptr(GPtrArray) record = hostd_user_keys_load(path, error);
    if (record == NULL)
        return NULL;
    return authorize_keys_to_variant(record);
}

/* ---- The component */

/* A fork's disk holds its source's keys: it starts with the source's record, which agent_up
 * then applies (the checkpoint may be older than the record). */
static gboolean
authorize_agent_creating(HostdContext *ctx, const HostdAgentRecord *r, const VmTemplate *tpl,
                         GError **error)
{
    if (r->forked_from == NULL)
        return TRUE;
    g_autofree char *source_dir = hostd_agent_dir(ctx, r->forked_from);
    g_autofree char *source = g_build_filename(source_dir, HOSTD_AGENT_USER_KEYS, NULL);
    if (!g_file_test(source, G_FILE_TEST_EXISTS))
        return TRUE;
    g_autoptr(GPtrArray) keys = hostd_user_keys_load(source, error);
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    return keys != NULL && hostd_user_keys_save(path, keys, error);
}

static void
authorize_agent_seed(HostdContext *ctx, const HostdAgentRecord *r, VmSeedSpec *spec,
                     GPtrArray *keep)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    g_autoptr(GError) error = NULL;
    g_autoptr(GPtrArray) keys = hostd_user_keys_load(path, &error);

    if (keys == NULL) {
        hostd_context_log(ctx, "agent '%s': its users' keys are not in its seed: %s", r->name,
                          error->message);
        return;
    }
    if (keys->len == 0)
        return;
    const char **lines = g_new0(const char *, keys->len + 1);
    for (guint i = 0; i < keys->len; i++) {
        char *line = hostd_user_key_guest_line(keys->pdata[i]);
        g_ptr_array_add(keep, line);
        lines[i] = line;
    }
    g_ptr_array_add(keep, lines);
    spec->user_keys = lines;
}

/* Cheap for an agent without a record (no command at all), one command otherwise. */
static void
authorize_agent_up(HostdContext *ctx, const HostdAgentRecord *r)
{
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_USER_KEYS);
    g_autoptr(GError) error = NULL;

    if (!g_file_test(path, G_FILE_TEST_EXISTS))
        return;
    g_autoptr(GPtrArray) keys = hostd_user_keys_load(path, &error);
    if (keys == NULL || !authorize_apply(ctx, r, keys, &error))
        hostd_context_log(ctx, "agent '%s': could not apply its users' keys: %s", r->name,
                          error->message);
}

const HostdComponent hostd_authorize_component = {
    .name = "authorize",
    .agent_creating = authorize_agent_creating,
    .agent_seed = authorize_agent_seed,
    .agent_up = authorize_agent_up,
};
