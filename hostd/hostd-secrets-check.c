#include "hostd-secrets-check.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "vm-egress-policy.h"
#include "vm-error.h"

#define NAME_MAX_CHARS   64
#define HEADER_MAX_CHARS 64
#define HEADERS_MAX      8 /* VM_EGRESS_CREDENTIAL_HEADERS_MAX */
#define FORMAT_MAX_BYTES 256
#define ENV_MAX_CHARS    128
#define VALUE_MAX_BYTES  8192

static const char placeholder_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/* Fills @buffer from getrandom(), which blocks only until the kernel's pool is first seeded. */
static gboolean
fill_random(guint8 *buffer, gsize length, GError **error)
{
    gsize done = 0;
    while (done < length) {
        ssize_t got = getrandom(buffer + done, length - done, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return vm_throw_errno(error, errno, "no random bytes for a placeholder");
        }
        done += (gsize)got;
    }
    return TRUE;
}

char *
hostd_secret_placeholder_new(GError **error)
{
    const gsize alphabet = sizeof placeholder_alphabet - 1;
    /* Bytes at or past the largest multiple of 62 are drawn again, so each character is
     * uniform over the alphabet (a plain modulo would favour the first 8 characters). */
    const guint limit = 256 - (256 % alphabet);
    g_autoptr(GString) text = g_string_new(HOSTD_SECRET_PLACEHOLDER_PREFIX);
    while (text->len <
           strlen(HOSTD_SECRET_PLACEHOLDER_PREFIX) + HOSTD_SECRET_PLACEHOLDER_RANDOM_CHARS) {
        guint8 bytes[64];
        if (!fill_random(bytes, sizeof bytes, error))
            return NULL;
        for (gsize i = 0; i < sizeof bytes; i++) {
            if (text->len ==
                strlen(HOSTD_SECRET_PLACEHOLDER_PREFIX) + HOSTD_SECRET_PLACEHOLDER_RANDOM_CHARS)
                break;
            if (bytes[i] >= limit)
                continue;
            g_string_append_c(text, placeholder_alphabet[bytes[i] % alphabet]);
        }
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

gboolean
hostd_secret_placeholder_is_valid(const char *text)
{
    if (text == NULL || !g_str_has_prefix(text, HOSTD_SECRET_PLACEHOLDER_PREFIX))
        return FALSE;
    const char *random = text + strlen(HOSTD_SECRET_PLACEHOLDER_PREFIX);
    if (strlen(random) != HOSTD_SECRET_PLACEHOLDER_RANDOM_CHARS)
        return FALSE;
    for (const char *p = random; *p != '\0'; p++) {
        if (!g_ascii_isalnum(*p))
            return FALSE;
    }
    return TRUE;
}

gboolean
hostd_secret_check_name(const char *name, GError **error)
{
    gsize length = name != NULL ? strlen(name) : 0;
    gboolean ok = length > 0 && length <= NAME_MAX_CHARS && g_ascii_isalnum(name[0]);
    for (gsize i = 0; ok && i < length; i++) {
        char c = name[i];
        ok = g_ascii_islower(c) || g_ascii_isdigit(c) || c == '-';
    }
    if (!ok)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid secret name '%s': 1-%d characters of a-z, 0-9 and '-', not "
                        "starting with '-'",
                        name != NULL ? name : "", NAME_MAX_CHARS);
    return TRUE;
}

/* RFC 7230 section 3.2.6: tchar. */
static gboolean
is_tchar(char c)
{
    return g_ascii_isalnum(c) || (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* One header name: 1-HEADER_MAX_CHARS characters of tchar. */
static gboolean
header_name_ok(const char *name, gsize length)
{
    gboolean ok = length > 0 && length <= HEADER_MAX_CHARS;

    for (gsize i = 0; ok && i < length; i++)
        ok = is_tchar(name[i]);
    return ok;
}

gboolean
hostd_secret_check_header(const char *header, GError **error)
{
    g_auto(GStrv) names = header != NULL ? g_strsplit(header, ",", -1) : NULL;
    guint count = names != NULL ? g_strv_length(names) : 0;

    if (count == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid header name '': 1-%d characters of an HTTP token",
                        HEADER_MAX_CHARS);
    if (count > HEADERS_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid header '%s': 1-%d names separated by commas", header, HEADERS_MAX);
    for (guint i = 0; i < count; i++) {
        /* one space after each comma, as hostd_secret_normalise_headers() writes it */
        const char *name = names[i] + (i > 0 && names[i][0] == ' ' ? 1 : 0);

        if (!header_name_ok(name, strlen(name)))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "invalid header name '%s': 1-%d characters of an HTTP token", name,
                            HEADER_MAX_CHARS);
        for (guint j = 0; j < i; j++) {
            const char *other = names[j] + (j > 0 && names[j][0] == ' ' ? 1 : 0);

            if (g_ascii_strcasecmp(name, other) == 0)
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "header '%s' named twice", name);
        }
    }
    return TRUE;
}

char *
hostd_secret_normalise_headers(const char *const *headers, GError **error)
{
    g_autoptr(GStrvBuilder) builder = g_strv_builder_new();
    g_auto(GStrv) names = NULL;
    g_autofree char *joined = NULL;

    for (const char *const *it = headers; it != NULL && *it != NULL; it++) {
        g_auto(GStrv) pieces = g_strsplit(*it, ",", -1);

        for (char **piece = pieces; *piece != NULL; piece++)
            g_strv_builder_add(builder, g_strstrip(*piece));
    }
    names = g_strv_builder_end(builder);
    joined = g_strjoinv(", ", names);
    if (!hostd_secret_check_header(joined, error))
        return NULL;
    return g_steal_pointer(&joined);
}

gboolean
hostd_secret_check_format(const char *format, GError **error)
{
    if (format == NULL || strlen(format) > FORMAT_MAX_BYTES || strpbrk(format, "\r\n") != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid format: at most %d bytes on one line", FORMAT_MAX_BYTES);
    const char *first = strstr(format, "{}");
    if (first == NULL || strstr(first + 2, "{}") != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid format '%s': it must contain '{}' exactly once", format);
    return TRUE;
}

gboolean
hostd_secret_check_env(const char *env, GError **error)
{
    gsize length = env != NULL ? strlen(env) : 0;
    gboolean ok =
        length > 0 && length <= ENV_MAX_CHARS && (g_ascii_isalpha(env[0]) || env[0] == '_');
    for (gsize i = 0; ok && i < length; i++)
        ok = g_ascii_isalnum(env[i]) || env[i] == '_';
    if (!ok)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "invalid env var '%s': letters, digits and '_', not starting with a digit",
                        env != NULL ? env : "");
    return TRUE;
}

char *
hostd_secret_default_env(const char *name)
{
    char *env = g_ascii_strup(name, -1);
    g_strdelimit(env, "-", '_');
    return env;
}

char *
hostd_secret_normalise_host(const char *pattern, GError **error)
{
    if (pattern == NULL || *pattern == '\0') {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid host: empty");
        return NULL;
    }
    gboolean wildcard = g_str_has_prefix(pattern, "*.");
    const char *host = wildcard ? pattern + 2 : pattern;
    if (strchr(host, '*') != NULL) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "invalid host '%s': '*' only as a leading '*.' label", pattern);
        return NULL;
    }
    g_autoptr(GError) local = NULL;
    g_autofree char *normal = vm_egress_host_normalise(host, &local);
    if (normal == NULL) {
        /* The normaliser's message names the host already ("host 'X': why"). */
        if (!wildcard && g_str_has_prefix(local->message, "host '"))
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid %s", local->message);
        else
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid host '%s': %s", pattern,
                     local->message);
        return NULL;
    }
    return wildcard ? g_strconcat("*.", normal, NULL) : g_steal_pointer(&normal);
}

gboolean
hostd_secret_check_value(const char *value, gsize length, GError **error)
{
    if (value == NULL || length == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "empty secret value");
    if (length > VALUE_MAX_BYTES)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret value over %d bytes",
                        VALUE_MAX_BYTES);
    if (memchr(value, '\0', length) != NULL || memchr(value, '\r', length) != NULL ||
        memchr(value, '\n', length) != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "secret value contains a NUL, CR or LF (it goes into a header line)");
    return TRUE;
}
