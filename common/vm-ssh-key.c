#include "vm-ssh-key.h"

#include "vm-error.h"
#include "vm-util.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define VM_SSH_KEY_ACCEPTED                                                                        \
    "ssh-ed25519, ecdsa-sha2-nistp256/384/521, ssh-rsa, sk-ssh-ed25519@openssh.com, "              \
    "sk-ecdsa-sha2-nistp256@openssh.com"

typedef enum {
    KEY_ED25519,
    KEY_SK_ED25519,
    KEY_ECDSA,
    KEY_SK_ECDSA,
    KEY_RSA,
} KeyKind;

static const struct {
    const char *type;
    KeyKind kind;
    const char *curve; /* ECDSA: the curve its data names */
    guint bits;        /* 0: read from the data (RSA) */
} key_types[] = {
    {"ssh-ed25519", KEY_ED25519, NULL, 256},
    {"ecdsa-sha2-nistp256", KEY_ECDSA, "nistp256", 256},
    {"ecdsa-sha2-nistp384", KEY_ECDSA, "nistp384", 384},
    {"ecdsa-sha2-nistp521", KEY_ECDSA, "nistp521", 521},
    {"ssh-rsa", KEY_RSA, NULL, 0},
    {"sk-ssh-ed25519@openssh.com", KEY_SK_ED25519, NULL, 256},
    {"sk-ecdsa-sha2-nistp256@openssh.com", KEY_SK_ECDSA, "nistp256", 256},
};

/* The row of @type in key_types, or -1. */
static int
key_type_index(const char *type)
{
    for (gsize i = 0; i < G_N_ELEMENTS(key_types); i++) {
        if (strcmp(key_types[i].type, type) == 0)
            return (int)i;
    }
    return -1;
}

static gboolean
key_type_is_dsa(const char *type)
{
    return strcmp(type, "ssh-dss") == 0;
}

static gboolean
key_type_is_certificate(const char *type)
{
    return g_str_has_suffix(type, "-cert-v01@openssh.com");
}

/* Any word OpenSSH could take for the start of a key: what marks options before it, or a
 * second key after it. */
static gboolean
key_type_is_known(const char *word)
{
    return key_type_index(word) >= 0 || key_type_is_dsa(word) || key_type_is_certificate(word);
}

void
vm_ssh_key_free(VmSshKey *key)
{
    if (key == NULL)
        return;
    g_free(key->type);
    g_free(key->base64);
    g_free(key->comment);
    g_free(key->fingerprint);
    g_free(key);
}

/* ---- The key's data: SSH wire format, strings prefixed by a 32-bit big-endian length. */

typedef struct {
    const guint8 *p;
    gsize left;
} Blob;

static gboolean
blob_string(Blob *b, const guint8 **ret_data, gsize *ret_len)
{
    if (b->left < 4)
        return FALSE;
    guint32 len = ((guint32)b->p[0] << 24) | ((guint32)b->p[1] << 16) | ((guint32)b->p[2] << 8) |
                  (guint32)b->p[3];
    if (len > b->left - 4)
        return FALSE;
    *ret_data = b->p + 4;
    *ret_len = len;
    b->p += 4 + len;
    b->left -= 4 + len;
    return TRUE;
}

static gboolean
blob_string_is(Blob *b, const char *text)
{
    const guint8 *data;
    gsize len;

    return blob_string(b, &data, &len) && len == strlen(text) && memcmp(data, text, len) == 0;
}

static gboolean
blob_string_len(Blob *b, gsize want)
{
    const guint8 *data;
    gsize len;

    return blob_string(b, &data, &len) && len == want;
}

/* A positive mpint (no sign bit, at most one leading zero byte): its size in bits. */
static gboolean
blob_mpint_bits(Blob *b, guint *ret_bits)
{
    const guint8 *data;
    gsize len;

    if (!blob_string(b, &data, &len) || len == 0 || (data[0] & 0x80) != 0)
        return FALSE;
    if (data[0] == 0) {
        if (len == 1 || (data[1] & 0x80) == 0)
            return FALSE;
        data++;
        len--;
    }
    if (len > VM_SSH_KEY_RSA_MAX_BITS / 8)
        return FALSE;
    guint bits = (guint)len * 8;
    for (guint8 top = data[0]; (top & 0x80) == 0; top <<= 1)
        bits--;
    *ret_bits = bits;
    return TRUE;
}

/* Checks that @blob holds exactly a key of key_types[@row] and gives its size in bits. */
static gboolean
key_blob_check(const guint8 *blob, gsize len, int row, guint *ret_bits)
{
    Blob b = {blob, len};
    const guint8 *data;
    gsize data_len;
    guint bits = key_types[row].bits;

    if (!blob_string_is(&b, key_types[row].type))
        return FALSE;
    switch (key_types[row].kind) {
    case KEY_ED25519:
        if (!blob_string_len(&b, 32))
            return FALSE;
        break;
    case KEY_SK_ED25519:
        if (!blob_string_len(&b, 32) || !blob_string(&b, &data, &data_len))
            return FALSE;
        break;
    case KEY_ECDSA:
    case KEY_SK_ECDSA:
        /* An uncompressed point: 0x04, then both coordinates. */
        if (!blob_string_is(&b, key_types[row].curve) || !blob_string(&b, &data, &data_len) ||
            data_len != 1 + 2 * ((bits + 7) / 8) || data[0] != 0x04)
            return FALSE;
        if (key_types[row].kind == KEY_SK_ECDSA && !blob_string(&b, &data, &data_len))
            return FALSE;
        break;
    case KEY_RSA: {
        guint exponent_bits = 0;
        if (!blob_mpint_bits(&b, &exponent_bits) || !blob_mpint_bits(&b, &bits))
            return FALSE;
        break;
    }
    default:
        g_assert_not_reached();
    }
    if (b.left != 0)
        return FALSE;
    *ret_bits = bits;
    return TRUE;
}

/* Strict base64: only the alphabet, '=' padding at the end, whole quanta. GLib's decoder skips
 * what it does not know, which would let anything through. */
static gboolean
base64_is_valid(const char *text)
{
    gsize len = strlen(text);
    gsize pad = 0;

    if (len == 0 || len % 4 != 0)
        return FALSE;
    while (pad < 2 && pad < len && text[len - 1 - pad] == '=')
        pad++;
    for (gsize i = 0; i < len - pad; i++) {
        char c = text[i];
        if (!g_ascii_isalnum(c) && c != '+' && c != '/')
            return FALSE;
    }
    return TRUE;
}

/* "SHA256:" and the unpadded base64 of the hash, as OpenSSH shows it. */
static char *
key_fingerprint(const guint8 *blob, gsize len)
{
    guint8 digest[32];
    gsize digest_len = sizeof(digest);
    g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);

    g_checksum_update(sum, blob, (gssize)len);
    g_checksum_get_digest(sum, digest, &digest_len);
    g_autofree char *encoded = g_base64_encode(digest, digest_len);
    gsize n = strlen(encoded);
    while (n > 0 && encoded[n - 1] == '=')
        encoded[--n] = '\0';
    return g_strconcat("SHA256:", encoded, NULL);
}

/* Printable ASCII only, at most VM_SSH_KEY_COMMENT_MAX bytes, without blanks at either end. */
static char *
key_comment_sanitize(const char *text)
{
    g_autofree char *copy = g_strndup(text, VM_SSH_KEY_COMMENT_MAX);

    for (char *p = copy; *p != '\0'; p++) {
        if ((guchar)*p < 0x20 || (guchar)*p > 0x7e)
            *p = '?';
    }
    return g_strdup(g_strstrip(copy));
}

/* The next word of *@p (blanks are spaces and tabs), or NULL at the end; moves *@p past it. */
static char *
next_word(const char **p)
{
    const char *start = *p + strspn(*p, " \t");
    gsize len = strcspn(start, " \t");

    *p = start + len;
    return len > 0 ? g_strndup(start, len) : NULL;
}

/* The line's words after the first two all say the line is one key: a key type followed by
 * something that looks like key data means a second key. */
static gboolean
comment_holds_key(const char *comment)
{
    g_auto(GStrv) words = g_strsplit_set(comment, " \t", -1);

    for (guint i = 0; words[i] != NULL && words[i + 1] != NULL; i++) {
        if (key_type_is_known(words[i]) && g_str_has_prefix(words[i + 1], "AAAA"))
            return TRUE;
    }
    return FALSE;
}

VmSshKey *
vm_ssh_key_parse(const char *line, GError **error)
{
    g_return_val_if_fail(line != NULL, NULL);

    gsize line_len = strlen(line);
    if (line_len > VM_SSH_KEY_LINE_MAX) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "a key line longer than %d bytes",
                 VM_SSH_KEY_LINE_MAX);
        return NULL;
    }
    g_autofree char *copy = g_strdup(line);
    g_strstrip(copy);
    const char *p = copy;
    g_autofree char *type = next_word(&p);
    g_autofree char *data = next_word(&p);

    if (type == NULL) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "no public key: expected TYPE BASE64 [COMMENT]");
        return NULL;
    }
    int row = key_type_index(type);
    if (row < 0) {
        if (key_type_is_dsa(type)) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                     "ssh-dss (DSA) keys are not accepted: use ed25519, ECDSA or RSA of %d bits "
                     "or more",
                     VM_SSH_KEY_RSA_MIN_BITS);
            return NULL;
        }
        if (key_type_is_certificate(type)) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                     "SSH certificates are not accepted: give the plain public key");
            return NULL;
        }
        /* Options come first in an authorized_keys line: "no-pty,command=\"...\" ssh-ed25519". */
        g_auto(GStrv) words = g_strsplit_set(copy, " \t", -1);
        for (char **w = words + 1; *w != NULL; w++) {
            if (key_type_is_known(*w)) {
                vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                         "key options (command=, from=, no-pty...) are not accepted: give the "
                         "bare public key, TYPE BASE64 [COMMENT]");
                return NULL;
            }
        }
        g_autofree char *shown = vm_utf8_cut(type, 40);
        g_autofree char *escaped = g_strescape(shown, NULL);
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "unknown key type '%s' (accepted: " VM_SSH_KEY_ACCEPTED ")", escaped);
        return NULL;
    }
    if (data == NULL || !base64_is_valid(data)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "the %s key's base64 data is malformed", type);
        return NULL;
    }
    gsize blob_len = 0;
    g_autofree guint8 *blob = g_base64_decode(data, &blob_len);
    guint bits = 0;
    if (!key_blob_check(blob, blob_len, row, &bits)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "the key's data is not a valid %s key", type);
        return NULL;
    }
    if (key_types[row].kind == KEY_RSA && bits < VM_SSH_KEY_RSA_MIN_BITS) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "the RSA key has %u bits: at least %d are needed (or use ed25519)", bits,
                 VM_SSH_KEY_RSA_MIN_BITS);
        return NULL;
    }
    if (comment_holds_key(p)) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                 "more than one key on one line: put each key on a line of its own");
        return NULL;
    }

    VmSshKey *key = g_new0(VmSshKey, 1);
    key->type = g_steal_pointer(&type);
    key->base64 = g_steal_pointer(&data);
    key->comment = key_comment_sanitize(p + strspn(p, " \t"));
    key->bits = bits;
    key->fingerprint = key_fingerprint(blob, blob_len);
    return key;
}

char *
vm_ssh_key_to_line(const VmSshKey *key)
{
    g_return_val_if_fail(key != NULL, NULL);

    if (key->comment == NULL || key->comment[0] == '\0')
        return g_strdup_printf("%s %s", key->type, key->base64);
    return g_strdup_printf("%s %s %s", key->type, key->base64, key->comment);
}

GPtrArray *
vm_ssh_key_parse_text(const char *text, gsize len, const char *what, guint max, GError **error)
{
    g_return_val_if_fail(text != NULL || len == 0, NULL);
    g_return_val_if_fail(what != NULL, NULL);

    if (memchr(text, '\0', len) != NULL) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s is not a text file of public keys", what);
        return NULL;
    }
    g_autofree char *copy = g_strndup(text, len);
    g_auto(GStrv) lines = g_strsplit(copy, "\n", -1);
    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func((GDestroyNotify)vm_ssh_key_free);

    for (guint i = 0; lines[i] != NULL; i++) {
        const char *line = lines[i] + strspn(lines[i], " \t\r");
        g_autoptr(GError) local_error = NULL;

        if (*line == '\0' || *line == '#')
            continue;
        if (g_str_has_prefix(line, "-----BEGIN")) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                     "%s holds a private key: give its public key (the .pub file)", what);
            return NULL;
        }
        VmSshKey *key = vm_ssh_key_parse(line, &local_error);
        if (key == NULL) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s, line %u: %s", what, i + 1,
                     local_error->message);
            return NULL;
        }
        g_ptr_array_add(keys, key);
        if (keys->len > max) {
            vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s holds more than %u keys", what, max);
            return NULL;
        }
    }
    if (keys->len == 0) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s holds no public key", what);
        return NULL;
    }
    return g_steal_pointer(&keys);
}

GPtrArray *
vm_ssh_key_read_file(const char *path, guint max, GError **error)
{
    g_return_val_if_fail(path != NULL, NULL);

    vm_autofd fd = open(path, O_RDONLY | O_CLOEXEC);
    g_autofree char *text = g_malloc(VM_SSH_KEY_FILE_MAX + 1);
    gsize len = 0;

    if (fd < 0) {
        vm_throw_errno(error, errno, "cannot open the key file %s", path);
        return NULL;
    }
    while (len <= VM_SSH_KEY_FILE_MAX) {
        ssize_t n = read(fd, text + len, VM_SSH_KEY_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            vm_throw_errno(error, errno, "cannot read the key file %s", path);
            return NULL;
        }
        if (n == 0)
            break;
        len += (gsize)n;
    }
    if (len > VM_SSH_KEY_FILE_MAX) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s is larger than %d bytes: not a public key",
                 path, VM_SSH_KEY_FILE_MAX);
        return NULL;
    }
    return vm_ssh_key_parse_text(text, len, path, max, error);
}
