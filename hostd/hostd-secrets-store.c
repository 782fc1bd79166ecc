#include "hostd-secrets-store.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostd-secrets-check.h"
#include "vm-error.h"
#include "vm-util.h"

#define GROUP "secret"

/* A secret's file is a key file ("[secret]", then value=, hosts=, header=, format=, env=), read
 * and written here rather than through GKeyFile, whose copies of the value (the file's lines,
 * its parse buffer, each escaped string) are freed without being wiped. The format is the one
 * GKeyFile reads and writes (an older hostd's files load; this one's load in GKeyFile), with its
 * escapes: \s for a leading space, \t, \n, \r, \\, and \; in a list. */

/* The most a secret's file may hold: every field at its bound, escaped, with room to spare. */
#define STORE_FILE_MAX (64 * 1024)

void
hostd_secret_free(HostdSecret *secret)
{
    if (secret == NULL)
        return;
    vm_secret_free(secret->value);
    g_free(secret->name);
    g_strfreev(secret->hosts);
    g_free(secret->header);
    g_free(secret->format);
    g_free(secret->env);
    g_free(secret);
}

/* Appends @text escaped as GKeyFile escapes a string value (@in_list: also ';'). @out must have
 * the room (2 bytes per byte of @text): it never grows, so no copy is left behind in memory
 * freed by a reallocation. */
static void
store_append_escaped(GString *out, const char *text, gboolean in_list)
{
    gsize len = strlen(text);

    g_assert(out->allocated_len > out->len + 2 * len + 1);
    for (gsize i = 0; i < len; i++) {
        char c = text[i];

        if (c == ' ' && i == 0)
            g_string_append(out, "\\s");
        else if (c == '\t')
            g_string_append(out, "\\t");
        else if (c == '\n')
            g_string_append(out, "\\n");
        else if (c == '\r')
            g_string_append(out, "\\r");
        else if (c == '\\')
            g_string_append(out, "\\\\");
        else if (c == ';' && in_list)
            g_string_append(out, "\\;");
        else
            g_string_append_c(out, c);
    }
}

/* Unescapes the value @raw (@len bytes) of a key file line into a new string, or, when @pieces
 * is not NULL, splits it at each unescaped ';' into @pieces (a trailing empty piece dropped) and
 * returns "". NULL for an escape GKeyFile would refuse too. */
static char *
store_unescape(const char *raw, gsize len, GPtrArray *pieces)
{
    char *out = g_malloc(len + 1);
    gsize o = 0;

    for (gsize i = 0; i < len; i++) {
        if (raw[i] == ';' && pieces != NULL) {
            g_ptr_array_add(pieces, g_strndup(out, o));
            o = 0;
            continue;
        }
        if (raw[i] != '\\') {
            out[o++] = raw[i];
            continue;
        }
        if (++i == len) {
            /* not terminated yet: the bytes written so far are wiped */
            explicit_bzero(out, o);
            g_free(out);
            return NULL;
        }
        switch (raw[i]) {
        case 's':
            out[o++] = ' ';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case '\\':
            out[o++] = '\\';
            break;
        case ';':
            if (pieces != NULL) {
                out[o++] = ';';
                break;
            }
            /* GKeyFile refuses it outside a list too */
            G_GNUC_FALLTHROUGH;
        default:
            explicit_bzero(out, o);
            g_free(out);
            return NULL;
        }
    }
    if (pieces != NULL && o > 0)
        g_ptr_array_add(pieces, g_strndup(out, o));
    out[o] = '\0';
    if (pieces != NULL)
        out[0] = '\0';
    return out;
}

/* Reads the whole of @path (at most STORE_FILE_MAX bytes) into a new buffer the caller wipes. */
static char *
store_read(const char *path, gsize *ret_len, GError **error)
{
    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    char *buf;
    gsize done = 0;

    if (fd < 0 || fstat(fd, &st) < 0)
        return vm_throw_errno(error, errno, "cannot open"), NULL;
    if (!S_ISREG(st.st_mode) || st.st_size > STORE_FILE_MAX)
        return vm_throw(error, VM_ERROR_IO, "not a file of at most %d bytes", STORE_FILE_MAX), NULL;
    /* One allocation of the file's size: nothing grows, nothing is left behind. */
    buf = g_malloc((gsize)st.st_size + 1);
    while (done < (gsize)st.st_size) {
        gssize n = read(fd, buf + done, (gsize)st.st_size - done);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int saved = n < 0 ? errno : EIO;

            explicit_bzero(buf, done);
            g_free(buf);
            return vm_throw_errno(error, saved, "cannot read"), NULL;
        }
        done += (gsize)n;
    }
    buf[done] = '\0';
    *ret_len = done;
    return buf;
}

/* Parses the key file @text (@len bytes) into @secret's fields, as GKeyFile would read them: lines
 * and keys trimmed of blanks, only the group [secret] counts, the last of a key wins, unknown
 * keys are left alone. */
static gboolean
store_parse(const char *text, gsize len, HostdSecret *secret, GError **error)
{
    gboolean in_group = FALSE;

    for (gsize start = 0, end; start < len; start = end + 1) {
        const char *line = text + start;
        const char *nl = memchr(line, '\n', len - start);
        end = nl != NULL ? (gsize)(nl - text) : len;
        gsize n = end - start;

        while (n > 0 && g_ascii_isspace(*line)) {
            line++;
            n--;
        }
        if (n == 0 || *line == '#')
            continue;
        if (*line == '[') {
            const char *close = memchr(line, ']', n);
            if (close == NULL)
                return vm_throw(error, VM_ERROR_IO, "a group line without ']'");
            in_group = close - line - 1 == 6 && memcmp(line + 1, "secret", 6) == 0;
            continue;
        }
        const char *eq = memchr(line, '=', n);
        if (eq == NULL)
            return vm_throw(error, VM_ERROR_IO, "a line that is neither a group nor a key");
        if (!in_group)
            continue;
        gsize key_len = (gsize)(eq - line);
        while (key_len > 0 && g_ascii_isspace(line[key_len - 1]))
            key_len--;
        const char *value = eq + 1;
        gsize value_len = n - (gsize)(value - line);
        /* GKeyFile skips the blanks after '=' and keeps those at the end (a line's CR aside) */
        while (value_len > 0 && (*value == ' ' || *value == '\t')) {
            value++;
            value_len--;
        }
        if (value_len > 0 && value[value_len - 1] == '\r')
            value_len--;

#define KEY_IS(k) (key_len == strlen(k) && memcmp(line, k, key_len) == 0)
        char **field = KEY_IS("value")    ? &secret->value
                       : KEY_IS("header") ? &secret->header
                       : KEY_IS("format") ? &secret->format
                       : KEY_IS("env")    ? &secret->env
                                          : NULL;
        if (field != NULL) {
            char *unescaped = store_unescape(value, value_len, NULL);
            if (unescaped == NULL)
                return vm_throw(error, VM_ERROR_IO, "an invalid escape sequence");
            if (field == &secret->value)
                vm_secret_free(*field);
            else
                g_free(*field);
            *field = unescaped;
        } else if (KEY_IS("hosts")) {
            g_autoptr(GPtrArray) pieces = g_ptr_array_new_with_free_func(g_free);
            g_autofree char *rest = store_unescape(value, value_len, pieces);
            if (rest == NULL)
                return vm_throw(error, VM_ERROR_IO, "an invalid escape sequence");
            g_ptr_array_add(pieces, NULL);
            g_strfreev(secret->hosts);
            secret->hosts = (char **)g_ptr_array_free(g_steal_pointer(&pieces), FALSE);
        }
#undef KEY_IS
    }
    return TRUE;
}

gboolean
hostd_secrets_store_prepare(const char *dir, GError **error)
{
    if (g_mkdir_with_parents(dir, 0700) != 0)
        return vm_throw_errno(error, errno, "cannot create %s", dir);
    if (chmod(dir, 0700) != 0)
        return vm_throw_errno(error, errno, "cannot set the mode of %s", dir);
    return TRUE;
}

static gboolean
check_secret(const HostdSecret *secret, GError **error)
{
    if (!hostd_secret_check_name(secret->name, error) ||
        !hostd_secret_check_value(secret->value, secret->value ? strlen(secret->value) : 0,
                                  error) ||
        !hostd_secret_check_header(secret->header, error) ||
        !hostd_secret_check_format(secret->format, error) ||
        !hostd_secret_check_env(secret->env, error))
        return FALSE;
    if (strchr(secret->header, ',') != NULL && !g_str_equal(secret->format, "{}"))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "secret '%s' names several headers and a format other than '{}'",
                        secret->name);
    if (secret->hosts == NULL || secret->hosts[0] == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' needs at least one --host",
                        secret->name);
    for (char **host = secret->hosts; *host != NULL; host++) {
        g_autofree char *normal = hostd_secret_normalise_host(*host, error);
        if (normal == NULL)
            return FALSE;
    }
    return TRUE;
}

gboolean
hostd_secrets_store_save(const char *dir, const HostdSecret *secret, gboolean must_be_new,
                         GError **error)
{
    if (!check_secret(secret, error))
        return FALSE;
    g_autofree char *path = g_build_filename(dir, secret->name, NULL);
    if (must_be_new && g_file_test(path, G_FILE_TEST_EXISTS))
        return vm_throw(error, VM_ERROR_EXISTS, "secret '%s' already exists", secret->name);

    g_autoptr(GPtrArray) hosts = g_ptr_array_new_with_free_func(g_free);
    gsize room = 64;
    for (char **host = secret->hosts; *host != NULL; host++) {
        g_ptr_array_add(hosts, hostd_secret_normalise_host(*host, NULL));
        room += 2 * strlen(g_ptr_array_index(hosts, hosts->len - 1)) + 2;
    }
    room += 2 * (strlen(secret->value) + strlen(secret->header) + strlen(secret->format) +
                 strlen(secret->env));
    /* Sized once for the whole file, so that it never moves: one buffer to wipe. */
    GString *text = g_string_sized_new(room);
    g_string_append(text, "[" GROUP "]\nvalue=");
    store_append_escaped(text, secret->value, FALSE);
    g_string_append(text, "\nhosts=");
    for (guint i = 0; i < hosts->len; i++) {
        store_append_escaped(text, g_ptr_array_index(hosts, i), TRUE);
        g_string_append_c(text, ';');
    }
    g_string_append(text, "\nheader=");
    store_append_escaped(text, secret->header, FALSE);
    g_string_append(text, "\nformat=");
    store_append_escaped(text, secret->format, FALSE);
    g_string_append(text, "\nenv=");
    store_append_escaped(text, secret->env, FALSE);
    g_string_append_c(text, '\n');
    g_assert(text->allocated_len > room);
    gboolean ok = vm_file_write_atomic(path, text->str, (gssize)text->len, 0600, error);
    explicit_bzero(text->str, text->allocated_len);
    g_string_free(text, TRUE);
    return ok;
}

HostdSecret *
hostd_secrets_store_load(const char *dir, const char *name, GError **error)
{
    if (!hostd_secret_check_name(name, error))
        return NULL;
    g_autofree char *path = g_build_filename(dir, name, NULL);
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR)) {
        vm_throw(error, VM_ERROR_NOT_FOUND, "no secret '%s'", name);
        return NULL;
    }
    g_autoptr(GError) local = NULL;
    gsize len = 0;
    char *text = store_read(path, &len, &local);
    if (text == NULL) {
        vm_throw(error, VM_ERROR_IO, "cannot read secret '%s': %s", name, local->message);
        return NULL;
    }
    g_autoptr(HostdSecret) secret = g_new0(HostdSecret, 1);
    secret->name = g_strdup(name);
    gboolean parsed = store_parse(text, len, secret, &local);
    explicit_bzero(text, len);
    g_free(text);
    if (!parsed) {
        vm_throw(error, VM_ERROR_IO, "cannot read secret '%s': %s", name, local->message);
        return NULL;
    }
    g_autoptr(GError) bad = NULL;
    if (!check_secret(secret, &bad)) {
        vm_throw(error, VM_ERROR_IO, "secret file of '%s' is damaged: %s", name, bad->message);
        return NULL;
    }
    return g_steal_pointer(&secret);
}

static gint
compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

char **
hostd_secrets_store_list(const char *dir, GError **error)
{
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) local = NULL;
    g_autoptr(GDir) handle = g_dir_open(dir, 0, &local);
    if (handle == NULL && !g_error_matches(local, G_FILE_ERROR, G_FILE_ERROR_NOENT)) {
        vm_throw(error, VM_ERROR_IO, "cannot list %s: %s", dir, local->message);
        return NULL;
    }
    for (const char *entry; handle != NULL && (entry = g_dir_read_name(handle)) != NULL;) {
        g_autofree char *path = g_build_filename(dir, entry, NULL);
        /* Temporary files of an interrupted write and the grants directory are not secrets. */
        if (hostd_secret_check_name(entry, NULL) && g_file_test(path, G_FILE_TEST_IS_REGULAR))
            g_ptr_array_add(names, g_strdup(entry));
    }
    g_ptr_array_sort(names, compare_names);
    g_ptr_array_add(names, NULL);
    return (char **)g_ptr_array_free(g_steal_pointer(&names), FALSE);
}

gboolean
hostd_secrets_store_remove(const char *dir, const char *name, GError **error)
{
    if (!hostd_secret_check_name(name, error))
        return FALSE;
    g_autofree char *path = g_build_filename(dir, name, NULL);
    if (unlink(path) != 0) {
        if (errno == ENOENT)
            return vm_throw(error, VM_ERROR_NOT_FOUND, "no secret '%s'", name);
        return vm_throw_errno(error, errno, "cannot remove secret '%s'", name);
    }
    return TRUE;
}
