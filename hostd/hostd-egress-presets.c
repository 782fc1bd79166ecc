/* Egress presets: the built-in rule sets and the user's presets directory. */
#include "hostd-egress-presets.h"

#include "vm-egress-policy.h"
#include "vm-error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PRESET_GROUP  "preset"
#define PRESET_SUFFIX ".conf"

typedef struct {
    char *name;         /* without '@' */
    char *source;       /* NULL: built-in, else the file */
    gboolean overrides; /* a file that replaces a built-in */
    char *description;
    char **rules;
} Preset;

struct _HostdEgressPresets {
    GHashTable *presets; /* name -> Preset */
};

/* What a program needs to reach these services, ports 80 and 443 (an allow rule without a
 * port). Hosts that take uploads of the user's own (a code forge's git push aside, which needs
 * the user's credentials anyway) are left out where the download side does without them. */
static const struct {
    const char *name;
    const char *description;
    const char *rules[8];
} builtins[] = {
    {"anthropic", "the Anthropic API", {"api.anthropic.com"}},
    {"debian",
     "Debian's package archive and security updates (apt)",
     {"deb.debian.org", "security.debian.org", "ftp.debian.org", "*.deb.debian.org"}},
    {"github",
     "GitHub: git over https, the API, archives, raw files and release downloads",
     {"github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com",
      "raw.githubusercontent.com", "*.githubusercontent.com"}},
    {"npm", "the npm registry", {"registry.npmjs.org"}},
    {"openai", "the OpenAI API", {"api.openai.com"}},
    {"pypi", "the Python Package Index (pip)", {"pypi.org", "files.pythonhosted.org"}},
};

static void
preset_free(Preset *preset)
{
    g_free(preset->name);
    g_free(preset->source);
    g_free(preset->description);
    g_strfreev(preset->rules);
    g_free(preset);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC(Preset, preset_free)

static gboolean
preset_name_valid(const char *name)
{
    gsize len = strlen(name);

    if (len == 0 || len > 64 || name[0] == '-' || name[len - 1] == '-')
        return FALSE;
    for (gsize i = 0; i < len; i++) {
        if (!(g_ascii_islower(name[i]) || g_ascii_isdigit(name[i]) || name[i] == '-'))
            return FALSE;
    }
    return TRUE;
}

gboolean
hostd_egress_preset_is_name(const char *rule)
{
    return rule != NULL && rule[0] == '@';
}

/* A rule is checked as the policy checks an allow rule, which takes every spelling a deny rule
 * does. */
static gboolean
preset_rule_check(const char *rule, GError **error)
{
    const char *const one[] = {rule, NULL};
    g_autoptr(VmEgressPolicy) policy = NULL;

    if (hostd_egress_preset_is_name(rule))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "rule '%s': a preset cannot name another preset", rule);
    policy = vm_egress_policy_new(one, NULL, error);
    return policy != NULL;
}

/* Reads @path, at most HOSTD_EGRESS_PRESET_FILE_MAX bytes of a regular file. */
static char *
preset_read(const char *path, gsize *ret_len, GError **error)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    g_autofree char *data = NULL;
    struct stat st;
    gsize len = 0;

    if (fd < 0)
        return vm_throw_errno(error, errno, "cannot open it"), NULL;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "not a regular file"), NULL;
    }
    data = g_malloc(HOSTD_EGRESS_PRESET_FILE_MAX + 2);
    while (len <= HOSTD_EGRESS_PRESET_FILE_MAX) {
        ssize_t n = read(fd, data + len, HOSTD_EGRESS_PRESET_FILE_MAX + 1 - len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int saved = errno;
            close(fd);
            return vm_throw_errno(error, saved, "cannot read it"), NULL;
        }
        if (n == 0)
            break;
        len += (gsize)n;
    }
    close(fd);
    if (len > HOSTD_EGRESS_PRESET_FILE_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "larger than %d KiB",
                        HOSTD_EGRESS_PRESET_FILE_MAX / 1024),
               NULL;
    data[len] = '\0';
    *ret_len = len;
    return g_steal_pointer(&data);
}

/* The preset in @path, named @name; the error without the file's name. */
static Preset *
preset_load_file(const char *path, const char *name, GError **error)
{
    static const char *const keys[] = {"rules", "description", NULL};
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) local_error = NULL;
    g_autoptr(Preset) preset = g_new0(Preset, 1);
    g_autofree char *data = NULL;
    g_auto(GStrv) groups = NULL;
    g_auto(GStrv) present = NULL;
    gsize len = 0, count = 0;

    data = preset_read(path, &len, error);
    if (data == NULL)
        return NULL;
    if (!g_key_file_load_from_data(kf, data, len, G_KEY_FILE_NONE, &local_error))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s", local_error->message), NULL;
    groups = g_key_file_get_groups(kf, NULL);
    for (char **g = groups; *g != NULL; g++) {
        if (!g_str_equal(*g, PRESET_GROUP))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "unknown group [%s]", *g), NULL;
    }
    present = g_key_file_get_keys(kf, PRESET_GROUP, NULL, NULL);
    if (present == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no [" PRESET_GROUP "] group"), NULL;
    for (char **k = present; *k != NULL; k++) {
        if (!g_strv_contains(keys, *k))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "unknown key '%s'", *k), NULL;
    }
    preset->rules = g_key_file_get_string_list(kf, PRESET_GROUP, "rules", &count, &local_error);
    if (preset->rules == NULL || count == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "rules: a list of one rule or more"),
               NULL;
    if (count > HOSTD_EGRESS_PRESET_RULES_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "rules: more than %d",
                        HOSTD_EGRESS_PRESET_RULES_MAX),
               NULL;
    for (char **rule = preset->rules; *rule != NULL; rule++) {
        g_strstrip(*rule);
        if (!preset_rule_check(*rule, error))
            return NULL;
    }
    if (g_key_file_has_key(kf, PRESET_GROUP, "description", NULL)) {
        preset->description = g_key_file_get_string(kf, PRESET_GROUP, "description", &local_error);
        if (preset->description == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "description: %s",
                            local_error->message),
                   NULL;
        /* It is printed on users' terminals. */
        for (const char *p = preset->description; *p != '\0'; p++) {
            if ((guchar)*p < 0x20 || (guchar)*p == 0x7f)
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "description: a control character"),
                       NULL;
        }
        if (strlen(preset->description) > 256)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "description: longer than 256 bytes"),
                   NULL;
    }
    preset->name = g_strdup(name);
    preset->source = g_strdup(path);
    return g_steal_pointer(&preset);
}

static gboolean
presets_load_dir(HostdEgressPresets *presets, const char *dir, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GDir) d = g_dir_open(dir, 0, &local_error);
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    const char *entry;

    if (d == NULL) {
        if (g_error_matches(local_error, G_FILE_ERROR, G_FILE_ERROR_NOENT))
            return TRUE;
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", dir, local_error->message);
    }
    while ((entry = g_dir_read_name(d)) != NULL) {
        if (g_str_has_suffix(entry, PRESET_SUFFIX))
            g_ptr_array_add(names, g_strdup(entry));
    }
    if (names->len > HOSTD_EGRESS_PRESETS_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: more than %d presets", dir,
                        HOSTD_EGRESS_PRESETS_MAX);
    for (guint i = 0; i < names->len; i++) {
        const char *file = names->pdata[i];
        g_autofree char *name = g_strndup(file, strlen(file) - strlen(PRESET_SUFFIX));
        g_autofree char *path = g_build_filename(dir, file, NULL);
        Preset *preset;

        if (!preset_name_valid(name))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s: '%s' is not a preset name (a-z, 0-9 and inner '-', at most "
                            "64)",
                            path, name);
        preset = preset_load_file(path, name, &local_error);
        if (preset == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s: %s", path, local_error->message);
        preset->overrides = g_hash_table_contains(presets->presets, name);
        g_hash_table_replace(presets->presets, preset->name, preset);
    }
    return TRUE;
}

HostdEgressPresets *
hostd_egress_presets_load(const char *dir, GError **error)
{
    g_autoptr(HostdEgressPresets) presets = g_new0(HostdEgressPresets, 1);

    presets->presets =
        g_hash_table_new_full(g_str_hash, g_str_equal, NULL, (GDestroyNotify)preset_free);
    for (gsize i = 0; i < G_N_ELEMENTS(builtins); i++) {
        Preset *preset = g_new0(Preset, 1);

        preset->name = g_strdup(builtins[i].name);
        preset->description = g_strdup(builtins[i].description);
        preset->rules = g_strdupv((char **)builtins[i].rules);
        g_hash_table_replace(presets->presets, preset->name, preset);
    }
    if (dir != NULL && !presets_load_dir(presets, dir, error))
        return NULL;
    return g_steal_pointer(&presets);
}

void
hostd_egress_presets_free(HostdEgressPresets *presets)
{
    if (presets == NULL)
        return;
    g_hash_table_unref(presets->presets);
    g_free(presets);
}

const char *const *
hostd_egress_presets_lookup(const HostdEgressPresets *presets, const char *name)
{
    const Preset *preset = g_hash_table_lookup(presets->presets, name);

    return preset != NULL ? (const char *const *)preset->rules : NULL;
}

char **
hostd_egress_presets_expand(const HostdEgressPresets *presets, const char *const *rules,
                            GError **error)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();

    for (const char *const *rule = rules; rule != NULL && *rule != NULL; rule++) {
        const char *const *expansion;

        if (!hostd_egress_preset_is_name(*rule)) {
            g_strv_builder_add(builder, *rule);
            continue;
        }
        expansion = hostd_egress_presets_lookup(presets, *rule + 1);
        if (expansion == NULL)
            return vm_throw(error, VM_ERROR_NOT_FOUND,
                            "no egress preset '%s' (see: vmctl egress presets)", *rule),
                   NULL;
        g_strv_builder_addv(builder, (const char **)expansion);
    }
    return g_strv_builder_end(builder);
}

gboolean
hostd_egress_presets_check(const HostdEgressPresets *presets, const char *const *rules,
                           GError **error)
{
    g_auto(GStrv) expanded = hostd_egress_presets_expand(presets, rules, error);

    if (expanded == NULL)
        return FALSE;
    for (char **rule = expanded; *rule != NULL; rule++) {
        const char *const one[] = {*rule, NULL};
        g_autoptr(VmEgressPolicy) policy = vm_egress_policy_new(one, NULL, error);

        if (policy == NULL)
            return FALSE;
    }
    return TRUE;
}

static gint
preset_compare(gconstpointer a, gconstpointer b)
{
    const Preset *const *pa = a, *const *pb = b;

    return strcmp((*pa)->name, (*pb)->name);
}

GVariant *
hostd_egress_presets_to_variant(const HostdEgressPresets *presets)
{
    g_autoptr(GPtrArray) list = g_ptr_array_new();
    GHashTableIter iter;
    gpointer value;
    GVariantBuilder b;

    g_hash_table_iter_init(&iter, presets->presets);
    while (g_hash_table_iter_next(&iter, NULL, &value))
        g_ptr_array_add(list, value);
    g_ptr_array_sort(list, preset_compare);
    g_variant_builder_init(&b, G_VARIANT_TYPE("aa{sv}"));
    for (guint i = 0; i < list->len; i++) {
        const Preset *preset = list->pdata[i];
        g_auto(GVariantBuilder) e = G_VARIANT_BUILDER_INIT(G_VARIANT_TYPE_VARDICT);
        g_autofree char *name = g_strconcat("@", preset->name, NULL);

        g_variant_builder_add(&e, "{sv}", "name", g_variant_new_string(name));
        g_variant_builder_add(&e, "{sv}", "source",
                              g_variant_new_string(preset->source ? preset->source : "built-in"));
        g_variant_builder_add(&e, "{sv}", "overrides", g_variant_new_boolean(preset->overrides));
        g_variant_builder_add(&e, "{sv}", "description",
                              g_variant_new_string(preset->description ? preset->description : ""));
        g_variant_builder_add(&e, "{sv}", "rules",
                              g_variant_new_strv((const char *const *)preset->rules, -1));
        g_variant_builder_add_value(&b, g_variant_builder_end(&e));
    }
    return g_variant_builder_end(&b);
}
