/* The set of grants one agent's proxy honours, and the checks and substitutions made with it. */
#include "vm-egress-credential.h"
#include "vm-egress-policy.h"
#include "vm-error.h"
#include "vm-util.h"

#include <string.h>

typedef struct {
    char *secret_name;
    char *placeholder;
    char *value;
    char **hosts;
    char *header;   /* as given: one name, or several separated by commas */
    char **headers; /* the names in it */
    char *format;
} Grant;

struct _VmEgressCredentials {
    gint ref_count;
    GPtrArray *grants; /* Grant */
};

static void
grant_free(Grant *grant)
{
    g_free(grant->secret_name);
    g_free(grant->placeholder);
    vm_secret_free(grant->value);
    g_strfreev(grant->hosts);
    g_free(grant->header);
    g_strfreev(grant->headers);
    g_free(grant->format);
    g_free(grant);
}

static gboolean
header_name_valid(const char *name)
{
    if (*name == '\0')
        return FALSE;
    for (const char *p = name; *p != '\0'; p++)
        if (!g_ascii_isalnum(*p) && strchr("!#$%&'*+-.^_`|~", *p) == NULL)
            return FALSE;
    return TRUE;
}

/* The header names of @header ("Authorization" or "Authorization, x-api-key"), or NULL when
 * one is not a valid name, one is there twice or there are more than
 * VM_EGRESS_CREDENTIAL_HEADERS_MAX. */
static char **
headers_parse(const char *header)
{
    g_auto(GStrv) names = g_strsplit(header, ",", -1);
    guint count = g_strv_length(names);

    if (count == 0 || count > VM_EGRESS_CREDENTIAL_HEADERS_MAX)
        return NULL;
    for (guint i = 0; i < count; i++) {
        g_strstrip(names[i]);
        if (!header_name_valid(names[i]))
            return NULL;
        for (guint j = 0; j < i; j++) {
            if (g_ascii_strcasecmp(names[i], names[j]) == 0)
                return NULL;
        }
    }
    return g_steal_pointer(&names);
}

static gboolean
format_valid(const char *format)
{
    const char *slot = strstr(format, "{}");

    if (slot == NULL || strstr(slot + 2, "{}") != NULL)
        return FALSE;
    for (const char *p = format; *p != '\0'; p++)
        if ((guchar)*p < 0x20 || (guchar)*p == 0x7f)
            return FALSE;
    return TRUE;
}

/* A grant's host pattern as egress rules write it ("*.suffix" or a normalised host), or NULL. */
static char *
host_pattern_normalise(const char *pattern)
{
    g_autofree char *host = NULL;

    if (g_str_has_prefix(pattern, "*.")) {
        host = vm_egress_host_normalise(pattern + 2, NULL);
        return host != NULL ? g_strconcat("*.", host, NULL) : NULL;
    }
    return vm_egress_host_normalise(pattern, NULL);
}

static gboolean
pattern_matches(const char *pattern, const char *host)
{
    if (g_str_has_prefix(pattern, "*.")) {
        gsize host_len = strlen(host), suffix_len = strlen(pattern + 1); /* ".suffix" */
        return host_len > suffix_len &&
               g_ascii_strcasecmp(host + host_len - suffix_len, pattern + 1) == 0;
    }
    return g_ascii_strcasecmp(pattern, host) == 0;
}

static gboolean
grant_names_host(const Grant *grant, const char *host)
{
    for (char **it = grant->hosts; *it != NULL; it++)
        if (pattern_matches(*it, host))
            return TRUE;
    return FALSE;
}

VmEgressCredentials *
vm_egress_credentials_new(void)
{
    VmEgressCredentials *creds = g_new0(VmEgressCredentials, 1);

    creds->ref_count = 1;
    creds->grants = g_ptr_array_new_with_free_func((GDestroyNotify)grant_free);
    return creds;
}

VmEgressCredentials *
vm_egress_credentials_ref(VmEgressCredentials *creds)
{
    g_atomic_int_inc(&creds->ref_count);
    return creds;
}

void
vm_egress_credentials_unref(VmEgressCredentials *creds)
{
    if (creds == NULL || !g_atomic_int_dec_and_test(&creds->ref_count))
        return;
    g_ptr_array_unref(creds->grants);
    g_free(creds);
}

gboolean
vm_egress_credentials_add(VmEgressCredentials *creds, const char *secret_name,
                          const char *placeholder, const char *value, const char *const *hosts,
                          const char *header, const char *format, GError **error)
{
    Grant *grant;

    if (value == NULL || *value == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' has an empty value",
                        secret_name);
    if (placeholder == NULL || *placeholder == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' has no placeholder",
                        secret_name);
    for (guint i = 0; i < creds->grants->len; i++) {
        const Grant *other = g_ptr_array_index(creds->grants, i);
        if (g_str_equal(other->placeholder, placeholder))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "placeholder of '%s' given twice",
                            secret_name);
    }
    if (strpbrk(value, "\r\n") != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "secret '%s' has a line break in its value", secret_name);
    g_auto(GStrv) headers = headers_parse(header != NULL ? header : "Authorization");
    if (headers == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s': bad header name '%s'",
                        secret_name, header);
    if (!format_valid(format != NULL ? format : "{}"))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "secret '%s': the format must hold one '{}' and no line break",
                        secret_name);
    if (headers[1] != NULL && format != NULL && !g_str_equal(format, "{}"))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "secret '%s': with several headers the value goes where the placeholder "
                        "stands, the format must be '{}'",
                        secret_name);
    g_autoptr(GPtrArray) patterns = g_ptr_array_new_with_free_func(g_free);
    for (const char *const *it = hosts; it != NULL && *it != NULL; it++) {
        char *pattern = host_pattern_normalise(*it);
        if (pattern == NULL)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s': bad host pattern '%s'",
                            secret_name, *it);
        g_ptr_array_add(patterns, pattern);
    }
    if (patterns->len == 0)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "secret '%s' names no host", secret_name);
    g_ptr_array_add(patterns, NULL);
    grant = g_new0(Grant, 1);
    grant->secret_name = g_strdup(secret_name);
    grant->placeholder = g_strdup(placeholder);
    grant->value = g_strdup(value);
    grant->hosts = (char **)g_ptr_array_free(g_steal_pointer(&patterns), FALSE);
    grant->header = g_strdup(header != NULL ? header : "Authorization");
    grant->headers = g_steal_pointer(&headers);
    grant->format = g_strdup(format != NULL ? format : "{}");
    g_ptr_array_add(creds->grants, grant);
    return TRUE;
}

GVariant *
vm_egress_credentials_to_variant(VmEgressCredentials *creds)
{
    GVariantBuilder b;

    g_variant_builder_init(&b, G_VARIANT_TYPE("a(sssasss)"));
    for (guint i = 0; creds != NULL && i < creds->grants->len; i++) {
        const Grant *grant = creds->grants->pdata[i];
        /* The value's bytes in the variant are the variant's own: wiped when it lets them go
         * (once it is serialised, or freed); the serialised frame is vm_wire_send()'s to wipe. */
        gsize size = strlen(grant->value) + 1;
        char *copy = g_memdup2(grant->value, size);
        g_autoptr(GBytes) bytes =
            g_bytes_new_with_free_func(copy, size, (GDestroyNotify)vm_secret_free, copy);

        g_variant_builder_add(&b, "(ss@s^asss)", grant->secret_name, grant->placeholder,
                              g_variant_new_from_bytes(G_VARIANT_TYPE_STRING, bytes, TRUE),
                              grant->hosts, grant->header, grant->format);
    }
    return g_variant_builder_end(&b);
}

guint
vm_egress_credentials_size(VmEgressCredentials *creds)
{
    return creds->grants->len;
}

gboolean
vm_egress_credentials_intercepts(VmEgressCredentials *creds, const char *host)
{
    if (creds == NULL || host == NULL)
        return FALSE;
    for (guint i = 0; i < creds->grants->len; i++)
        if (grant_names_host(g_ptr_array_index(creds->grants, i), host))
            return TRUE;
    return FALSE;
}

/* The first grant whose placeholder occurs in the @len bytes at @data, or NULL. */
static const Grant *
find_placeholder(VmEgressCredentials *creds, const char *data, gsize len)
{
    /* No bytes may come as a NULL pointer, which memmem() must not get. */
    if (len == 0)
        return NULL;
    for (guint i = 0; i < creds->grants->len; i++) {
        const Grant *grant = g_ptr_array_index(creds->grants, i);

        if (memmem(data, len, grant->placeholder, strlen(grant->placeholder)) != NULL)
            return grant;
    }
    return NULL;
}

static const Grant *
find_in_string(VmEgressCredentials *creds, const char *text)
{
    return text != NULL ? find_placeholder(creds, text, strlen(text)) : NULL;
}

/* The decoded pair of "Basic <base64>" credentials (newly allocated, to be wiped), or NULL when
 * @value is not that. */
static char *
basic_decode(const char *value)
{
    const char *token;
    gsize len = 0;
    guchar *decoded;

    if (g_ascii_strncasecmp(value, "Basic ", 6) != 0)
        return NULL;
    token = value + 6;
    while (*token == ' ')
        token++;
    if (*token == '\0')
        return NULL;
    decoded = g_base64_decode(token, &len);
    if (decoded == NULL)
        return NULL;
    /* A pair with a NUL in it is not text: keep what precedes it, as a server reading it would */
    char *text = g_strndup((const char *)decoded, len);
    explicit_bzero(decoded, len);
    g_free(decoded);
    return text;
}

/* The grant of a placeholder in @value, as sent or inside Basic credentials, or NULL. */
static const Grant *
find_in_value(VmEgressCredentials *creds, const char *value)
{
    const Grant *grant = find_in_string(creds, value);
    g_autofree char *pair = NULL;

    if (grant != NULL)
        return grant;
    pair = basic_decode(value);
    grant = find_in_string(creds, pair);
    if (pair != NULL)
        vm_secret_wipe(pair);
    return grant;
}

/* The request target, and the same percent-decoded: a placeholder is found in either. */
static const Grant *
find_in_target(VmEgressCredentials *creds, const char *target)
{
    const Grant *grant = find_in_string(creds, target);
    g_autofree char *decoded = NULL;

    if (grant != NULL || target == NULL)
        return grant;
    decoded = g_uri_unescape_string(target, NULL);
    return find_in_string(creds, decoded);
}

static gboolean
leak(GError **error, const Grant *grant, const char *where)
{
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "leak: placeholder of %s %s",
                    grant->secret_name, where);
}

/* Replaces every occurrence of @grant's placeholder in @text by its value; newly allocated, in
 * one allocation of the final size (a string that grew would leave copies of the value in the
 * memory it moved out of, freed unwiped). */
static char *
replace_placeholder(const char *text, const Grant *grant)
{
    gsize plen = strlen(grant->placeholder);
    gsize hits = 0;
    const char *p = text;
    const char *hit;

    for (const char *q = text; (hit = strstr(q, grant->placeholder)) != NULL; q = hit + plen)
        hits++;
    GString *out = g_string_sized_new(strlen(text) - hits * plen + hits * strlen(grant->value) + 1);

    while ((hit = strstr(p, grant->placeholder)) != NULL) {
        g_string_append_len(out, p, hit - p);
        g_string_append(out, grant->value);
        p = hit + plen;
    }
    g_string_append(out, p);
    return g_string_free(out, FALSE);
}

/* The format with its "{}" replaced by @value; newly allocated, in one allocation (printf's
 * buffers would hold the value in memory freed unwiped). */
static char *
format_with(const char *format, const char *value)
{
    const char *slot = strstr(format, "{}");
    gsize before = (gsize)(slot - format), len = strlen(value), after = strlen(slot + 2);
    char *out = g_malloc(before + len + after + 1);

    memcpy(out, format, before);
    memcpy(out + before, value, len);
    memcpy(out + before + len, slot + 2, after + 1);
    return out;
}

static gboolean
is_basic_format(const Grant *grant)
{
    return g_ascii_strncasecmp(grant->format, "Basic ", 6) == 0;
}

/* The new value of @header for @grant, whose placeholder it holds: through the format, or the
 * Basic pair with the placeholder replaced. Newly allocated, to be wiped. */
static char *
substitute(VmEgressCredentials *creds, const Grant *grant, const char *value,
           VmEgressRedactor *redactor)
{
    if (is_basic_format(grant)) {
        char *pair = basic_decode(value);
        char *replaced;
        char *encoded;
        char *out;

        if (pair == NULL || strstr(pair, grant->placeholder) == NULL) {
            /* the placeholder as sent, not encoded: it stands for the whole pair */
            vm_secret_free(pair);
            encoded = g_base64_encode((const guchar *)grant->value, strlen(grant->value));
            if (redactor != NULL)
                vm_egress_redactor_add(redactor, grant->secret_name, grant->value,
                                       grant->placeholder);
        } else {
            /* every grant's placeholder in the pair: user and password may both be ones */
            replaced = replace_placeholder(pair, grant);
            vm_secret_free(pair);
            if (redactor != NULL)
                vm_egress_redactor_add(redactor, grant->secret_name, grant->value,
                                       grant->placeholder);
            for (guint i = 0; i < creds->grants->len; i++) {
                const Grant *other = g_ptr_array_index(creds->grants, i);
                if (other != grant && strstr(replaced, other->placeholder) != NULL) {
                    char *again = replace_placeholder(replaced, other);
                    vm_secret_free(replaced);
                    replaced = again;
                    if (redactor != NULL)
                        vm_egress_redactor_add(redactor, other->secret_name, other->value,
                                               other->placeholder);
                }
            }
            encoded = g_base64_encode((const guchar *)replaced, strlen(replaced));
            vm_secret_free(replaced);
        }
        /* an echo of the header gives the pair back in base64: the guest decodes it at once */
        if (redactor != NULL)
            vm_egress_redactor_add(redactor, grant->secret_name, encoded, grant->placeholder);
        out = format_with(grant->format, encoded);
        vm_secret_free(encoded);
        return out;
    }
    if (redactor != NULL)
        vm_egress_redactor_add(redactor, grant->secret_name, grant->value, grant->placeholder);
    /* Several headers: each keeps the form its client gives it ("x-api-key: P", "Authorization:
     * Bearer P"), so the format, "{}", adds nothing and the value goes where P stands. */
    if (grant->headers[1] != NULL)
        return replace_placeholder(value, grant);
    return format_with(grant->format, grant->value);
}

/* Whether @grant may be substituted into the header @name of a request to @host. */
static gboolean
grant_fits(const Grant *grant, const char *name, const char *host)
{
    gboolean named = FALSE;

    for (char **it = grant->headers; *it != NULL && !named; it++)
        named = g_ascii_strcasecmp(*it, name) == 0;
    return named && grant_names_host(grant, host);
}

/* Every grant whose placeholder @value holds (as sent, or in a Basic pair) must fit @name and
 * @host; the first that does not, or NULL. */
static const Grant *
misplaced_in_value(VmEgressCredentials *creds, const char *name, const char *value,
                   const char *host)
{
    g_autofree char *pair = basic_decode(value);
    const Grant *bad = NULL;

    for (guint i = 0; i < creds->grants->len && bad == NULL; i++) {
        const Grant *grant = g_ptr_array_index(creds->grants, i);
        gboolean present = strstr(value, grant->placeholder) != NULL ||
                           (pair != NULL && strstr(pair, grant->placeholder) != NULL);

        if (present && !grant_fits(grant, name, host))
            bad = grant;
    }
    if (pair != NULL)
        vm_secret_wipe(pair);
    return bad;
}

gboolean
vm_egress_credentials_apply(VmEgressCredentials *creds, VmEgressRequest *request, const char *host,
                            VmEgressRedactor *redactor, char **ret_secret, GError **error)
{
    const Grant *grant;
    const char *substituted = NULL;
    g_autofree char *where = NULL;

    *ret_secret = NULL;
    if (creds == NULL)
        return TRUE;
    if ((grant = find_in_target(creds, request->path)) != NULL ||
        (grant = find_in_string(creds, request->host)) != NULL)
        return leak(error, grant, "in URL");
    where = g_strdup_printf("sent to %s", host);
    if ((grant = find_in_string(creds, request->method)) != NULL)
        return leak(error, grant, where);
    /* First every check, so that a refused request is left as it came. */
    for (guint i = 0; i < request->headers->len; i++) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        if ((grant = find_in_string(creds, header->name)) != NULL ||
            (grant = misplaced_in_value(creds, header->name, header->value, host)) != NULL)
            return leak(error, grant, where);
    }
    for (guint i = 0; i < request->headers->len; i++) {
        VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        grant = find_in_value(creds, header->value);
        if (grant == NULL)
            continue;
        char *value = substitute(creds, grant, header->value, redactor);
        vm_secret_free(header->value);
        header->value = value;
        substituted = grant->secret_name;
    }
    *ret_secret = g_strdup(substituted);
    return TRUE;
}

gboolean
vm_egress_credentials_check_plain(VmEgressCredentials *creds, const VmEgressRequest *request,
                                  GError **error)
{
    const Grant *grant;

    if (creds == NULL)
        return TRUE;
    if ((grant = find_in_target(creds, request->path)) != NULL ||
        (grant = find_in_string(creds, request->host)) != NULL ||
        (grant = find_in_string(creds, request->method)) != NULL)
        return leak(error, grant, "over plain HTTP");
    for (guint i = 0; i < request->headers->len; i++) {
        const VmEgressHeader *header = g_ptr_array_index(request->headers, i);

        if ((grant = find_in_string(creds, header->name)) != NULL ||
            (grant = find_in_value(creds, header->value)) != NULL)
            return leak(error, grant, "over plain HTTP");
    }
    return TRUE;
}

/* ---------------------------------------------------------------------------------------------
 * Body scanner */

struct _VmEgressLeakScanner {
    VmEgressCredentials *creds;
    gsize keep;       /* longest placeholder - 1: what a split placeholder can leave behind */
    GByteArray *tail; /* the last @keep bytes fed so far */
    char *found;      /* the secret name once a placeholder was seen */
};

VmEgressLeakScanner *
vm_egress_leak_scanner_new(VmEgressCredentials *creds)
{
    VmEgressLeakScanner *scanner = g_new0(VmEgressLeakScanner, 1);

    scanner->tail = g_byte_array_new();
    if (creds == NULL)
        return scanner;
    scanner->creds = vm_egress_credentials_ref(creds);
    for (guint i = 0; i < creds->grants->len; i++) {
        const Grant *grant = g_ptr_array_index(creds->grants, i);
        scanner->keep = MAX(scanner->keep, strlen(grant->placeholder) - 1);
    }
    return scanner;
}

void
vm_egress_leak_scanner_free(VmEgressLeakScanner *scanner)
{
    if (scanner == NULL)
        return;
    if (scanner->creds != NULL)
        vm_egress_credentials_unref(scanner->creds);
    g_byte_array_unref(scanner->tail);
    g_free(scanner->found);
    g_free(scanner);
}

gboolean
vm_egress_leak_scanner_feed(VmEgressLeakScanner *scanner, const guint8 *data, gsize len,
                            GError **error)
{
    const Grant *grant = NULL;

    if (scanner->found == NULL && scanner->creds != NULL && len > 0) {
        /* The seam first: the kept tail and as much of the new bytes as a placeholder can
         * reach into, so no large piece is ever copied. */
        if (scanner->tail->len > 0) {
            gsize reach = MIN(len, scanner->keep);
            g_autoptr(GByteArray) seam = g_byte_array_sized_new(scanner->tail->len + reach);

            g_byte_array_append(seam, scanner->tail->data, scanner->tail->len);
            g_byte_array_append(seam, data, reach);
            grant = find_placeholder(scanner->creds, (const char *)seam->data, seam->len);
        }
        if (grant == NULL)
            grant = find_placeholder(scanner->creds, (const char *)data, len);
        if (grant != NULL) {
            scanner->found = g_strdup(grant->secret_name);
        } else if (len >= scanner->keep) {
            g_byte_array_set_size(scanner->tail, 0);
            g_byte_array_append(scanner->tail, data + len - scanner->keep, scanner->keep);
        } else {
            g_byte_array_append(scanner->tail, data, len);
            if (scanner->tail->len > scanner->keep)
                g_byte_array_remove_range(scanner->tail, 0, scanner->tail->len - scanner->keep);
        }
    }
    if (scanner->found != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "leak: placeholder of %s in body",
                        scanner->found);
    return TRUE;
}

gsize
vm_egress_leak_scanner_get_keep(const VmEgressLeakScanner *scanner)
{
    return scanner->keep;
}

/* ---------------------------------------------------------------------------------------------
 * Response redactor */

typedef struct {
    char *secret_name;
    char *value;
    gsize len;
    char *mask; /* @len bytes */
} Target;

/* A run of pending bytes of one kind. */
typedef struct {
    gsize off;
    gsize len;
    gboolean payload;
} Segment;

struct _VmEgressRedactor {
    GPtrArray *targets;  /* Target */
    gsize longest;       /* the longest value */
    GByteArray *pending; /* fed and not yet given out */
    GArray *segments;    /* Segment, covering @pending in order */
    gsize given;         /* the bytes at the start of @pending given out by the last take() */
    gsize framing;       /* framing bytes in @pending */
    gsize scanned;       /* the bytes at the start of @pending that were looked through */
    gsize view_scanned;  /* the same, counted in payload bytes */
    GByteArray *view;    /* scratch: the payload of @pending alone */
    GPtrArray *hits;     /* secret names masked since the last steal */
};

static void
target_free(Target *target)
{
    g_free(target->secret_name);
    explicit_bzero(target->value, target->len);
    g_free(target->value);
    g_free(target->mask);
    g_free(target);
}

/* An empty GByteArray has no data at all, which explicit_bzero() must not get. */
static void
wipe_bytes(GByteArray *bytes)
{
    if (bytes->len > 0)
        explicit_bzero(bytes->data, bytes->len);
}

VmEgressRedactor *
vm_egress_redactor_new(void)
{
    VmEgressRedactor *redactor = g_new0(VmEgressRedactor, 1);

    redactor->targets = g_ptr_array_new_with_free_func((GDestroyNotify)target_free);
    redactor->pending = g_byte_array_new();
    redactor->segments = g_array_new(FALSE, FALSE, sizeof(Segment));
    redactor->view = g_byte_array_new();
    redactor->hits = g_ptr_array_new_with_free_func(g_free);
    return redactor;
}

void
vm_egress_redactor_free(VmEgressRedactor *redactor)
{
    if (redactor == NULL)
        return;
    g_ptr_array_unref(redactor->targets);
    /* the held tail may be the start of a value */
    wipe_bytes(redactor->pending);
    g_byte_array_unref(redactor->pending);
    g_array_unref(redactor->segments);
    wipe_bytes(redactor->view);
    g_byte_array_unref(redactor->view);
    g_ptr_array_unref(redactor->hits);
    g_free(redactor);
}

void
vm_egress_redactor_add(VmEgressRedactor *redactor, const char *secret_name, const char *value,
                       const char *placeholder)
{
    gsize len = strlen(value);
    gsize plen = strlen(placeholder);
    Target *target;

    g_return_if_fail(len > 0);
    for (guint i = 0; i < redactor->targets->len; i++) {
        const Target *other = g_ptr_array_index(redactor->targets, i);

        if (other->len == len && memcmp(other->value, value, len) == 0)
            return;
    }
    target = g_new0(Target, 1);
    target->secret_name = g_strdup(secret_name);
    target->value = g_strdup(value);
    target->len = len;
    target->mask = g_malloc(len);
    memset(target->mask, '*', len);
    memcpy(target->mask, placeholder, MIN(len, plen));
    g_ptr_array_add(redactor->targets, target);
    redactor->longest = MAX(redactor->longest, len);
}

guint
vm_egress_redactor_size(const VmEgressRedactor *redactor)
{
    return redactor->targets->len;
}

/* Drops the bytes the last take() gave out. */
static void
redactor_drop_given(VmEgressRedactor *redactor)
{
    gsize given = redactor->given;
    guint keep_from = 0;

    if (given == 0)
        return;
    redactor->given = 0;
    g_byte_array_remove_range(redactor->pending, 0, given);
    redactor->scanned -= given;
    for (guint i = 0; i < redactor->segments->len; i++) {
        Segment *seg = &g_array_index(redactor->segments, Segment, i);
        gsize dropped = seg->off >= given ? 0 : MIN(seg->len, given - seg->off);

        if (seg->payload)
            redactor->view_scanned -= dropped;
        else
            redactor->framing -= dropped;
        if (dropped == seg->len) {
            keep_from = i + 1;
        } else if (dropped > 0) {
            seg->len -= dropped;
            seg->off = 0;
        } else {
            seg->off -= given;
        }
    }
    g_array_remove_range(redactor->segments, 0, keep_from);
}

void
vm_egress_redactor_feed(VmEgressRedactor *redactor, const guint8 *data, gsize len, gboolean payload)
{
    Segment *last;

    redactor_drop_given(redactor);
    if (len == 0)
        return;
    last = redactor->segments->len > 0
               ? &g_array_index(redactor->segments, Segment, redactor->segments->len - 1)
               : NULL;
    if (last != NULL && last->payload == payload) {
        last->len += len;
    } else {
        Segment seg = {redactor->pending->len, len, payload};
        g_array_append_val(redactor->segments, seg);
    }
    if (!payload)
        redactor->framing += len;
    g_byte_array_append(redactor->pending, data, len);
}

static void
redactor_hit(VmEgressRedactor *redactor, const Target *target)
{
    for (guint i = 0; i < redactor->hits->len; i++)
        if (strcmp(g_ptr_array_index(redactor->hits, i), target->secret_name) == 0)
            return;
    g_ptr_array_add(redactor->hits, g_strdup(target->secret_name));
}

/* Where the payload view's bytes lie in @pending: a cursor over the payload segments, moved
 * forward as the hits of one value are (they come in order), so that each take costs the
 * segments once per value rather than once per byte masked. */
typedef struct {
    const VmEgressRedactor *redactor;
    guint segment; /* the payload segment that holds payload byte @base on */
    gsize base;
} PayloadCursor;

/* The offset in @pending of payload byte @index; @index never below the cursor's last one but
 * for a new cursor. */
static gsize
payload_cursor_offset(PayloadCursor *cursor, gsize index)
{
    const GArray *segments = cursor->redactor->segments;

    for (; cursor->segment < segments->len; cursor->segment++) {
        const Segment *seg = &g_array_index(segments, Segment, cursor->segment);

        if (!seg->payload)
            continue;
        if (index - cursor->base < seg->len)
            return seg->off + (index - cursor->base);
        cursor->base += seg->len;
    }
    g_assert_not_reached();
}

/* Masks every value that ends past @from in the @len bytes at @data in place (a value that ends
 * before it was looked for at an earlier take); with @cursor, @data is the payload view, and the
 * same bytes are masked in @pending where they lie. */
static void
redactor_mask(VmEgressRedactor *redactor, guint8 *data, gsize len, gsize from, gboolean mapped)
{
    for (guint i = 0; i < redactor->targets->len; i++) {
        const Target *target = g_ptr_array_index(redactor->targets, i);
        PayloadCursor cursor = {redactor, 0, 0};
        gsize at = from > target->len - 1 ? from - (target->len - 1) : 0;
        guint8 *hit;

        while (len > at && len - at >= target->len &&
               (hit = memmem(data + at, len - at, target->value, target->len)) != NULL) {
            at = (gsize)(hit - data);
            memcpy(hit, target->mask, target->len);
            for (gsize k = 0; mapped && k < target->len; k++)
                redactor->pending->data[payload_cursor_offset(&cursor, at + k)] = target->mask[k];
            redactor_hit(redactor, target);
            at += target->len;
        }
    }
}

/* The length of the longest tail of the @len bytes at @data that is a proper prefix of some
 * value: what the next bytes could complete. */
static gsize
redactor_tail(const VmEgressRedactor *redactor, const guint8 *data, gsize len)
{
    gsize best = 0;

    for (guint i = 0; i < redactor->targets->len; i++) {
        const Target *target = g_ptr_array_index(redactor->targets, i);

        for (gsize k = MIN(target->len - 1, len); k > best; k--)
            if (memcmp(data + len - k, target->value, k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

gboolean
vm_egress_redactor_take(VmEgressRedactor *redactor, gboolean final, const guint8 **ret_data,
                        gsize *ret_len, GError **error)
{
    GByteArray *pending = redactor->pending;
    gsize out;

    redactor_drop_given(redactor);
    /* the bytes as they go to the guest: a value inside one chunk, a head, a trailer */
    redactor_mask(redactor, pending->data, pending->len, redactor->scanned, FALSE);
    redactor->scanned = pending->len;
    if (redactor->framing == 0)
        redactor->view_scanned = pending->len; /* all of it payload: the same bytes */
    out = pending->len - (final ? 0 : redactor_tail(redactor, pending->data, pending->len));
    if (redactor->framing > 0) {
        /* the payload alone, as the guest's client decodes it: a value split between chunks */
        GByteArray *view = redactor->view;
        gsize tail;

        g_byte_array_set_size(view, 0);
        for (guint i = 0; i < redactor->segments->len; i++) {
            const Segment *seg = &g_array_index(redactor->segments, Segment, i);

            if (seg->payload)
                g_byte_array_append(view, pending->data + seg->off, seg->len);
        }
        redactor_mask(redactor, view->data, view->len, redactor->view_scanned, TRUE);
        redactor->view_scanned = view->len;
        tail = final ? 0 : redactor_tail(redactor, view->data, view->len);
        if (tail > 0) {
            PayloadCursor cursor = {redactor, 0, 0};

            out = MIN(out, payload_cursor_offset(&cursor, view->len - tail));
        }
        wipe_bytes(view);
    }
    if (pending->len - out > VM_EGRESS_REDACTOR_HOLD_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "redactor: more than %d bytes could begin a secret",
                        VM_EGRESS_REDACTOR_HOLD_MAX);
    redactor->given = out;
    /* never NULL, even with nothing fed: callers copy from it */
    *ret_data = pending->len > 0 ? pending->data : (const guint8 *)"";
    *ret_len = out;
    return TRUE;
}

char **
vm_egress_redactor_steal_hits(VmEgressRedactor *redactor)
{
    GPtrArray *hits = redactor->hits;

    if (hits->len == 0)
        return NULL;
    redactor->hits = g_ptr_array_new_with_free_func(g_free);
    g_ptr_array_set_free_func(hits, NULL);
    g_ptr_array_add(hits, NULL);
    return (char **)g_ptr_array_free(hits, FALSE);
}
