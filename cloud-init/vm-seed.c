/* cloud-init NoCloud seed: renders user-data and meta-data and packs them into a "cidata" ISO.
 *
 * Everything a user controls reaches the YAML only through seed_append_quoted() (one-line
 * values) or seed_append_block() (the private key), so no value can add keys of its own. Extra
 * user-data parts are never spliced into hostd's document: they travel as MIME parts that
 * cloud-init merges after it.
 */
#include "vm-seed.h"

#include "vm-error.h"
#include "vm-seed-resources.h"
#include "vm-protocol.h"
#include "vm-spawn.h"
#include "vm-util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

/* cloud-init merges each part into what the earlier parts built. dict(no_replace) keeps hostd's
 * scalars (hostname, the user's shell...), list(append) adds to hostd's lists (users, packages,
 * ssh_authorized_keys) instead of replacing them, recurse_list merges into lists inside dicts. */
#define SEED_MERGE_TYPE "list(append)+dict(no_replace,recurse_list)+str()"

#define SEED_MIME_LINE_MAX   998 /* RFC 5322 line limit; longer lines go out as base64 */
#define SEED_HOSTNAME_MAX    253
#define SEED_USER_MAX        32 /* useradd's limit on Debian */
#define SEED_LINE_FIELD_MAX  8192
#define SEED_PRIVATE_KEY_MAX 16384

typedef enum {
    SEED_PART_CLOUD_CONFIG,
    SEED_PART_SHELL_SCRIPT,
} SeedPartType;

typedef struct {
    const char *filename;
    SeedPartType type;
    gboolean merge;
    char *body; /* transfer-encoded */
    gboolean base64;
} SeedPart;

/* Checks a value that lands on one YAML line: set, UTF-8, no control characters and no Unicode
 * line or paragraph separators (YAML 1.1 reads those as line breaks). */
static gboolean
seed_check_line(const char *field, const char *value, GError **error)
{
    if (value == NULL || *value == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seed: %s is missing", field);
    if (strlen(value) > SEED_LINE_FIELD_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seed: %s is longer than %d bytes", field,
                        SEED_LINE_FIELD_MAX);
    if (!g_utf8_validate(value, -1, NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seed: %s is not valid UTF-8", field);
    for (const char *p = value; *p != '\0'; p = g_utf8_next_char(p)) {
        gunichar c = g_utf8_get_char(p);
        if (g_unichar_iscntrl(c) || c == 0x2028 || c == 0x2029 || c == 0xfeff)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "seed: %s contains a control character or line break", field);
    }
    return TRUE;
}

/* The guest uses it as its hostname and in /etc/hosts: RFC 1123 labels only. */
static gboolean
seed_check_hostname(const char *hostname, GError **error)
{
    if (!seed_check_line("hostname", hostname, error))
        return FALSE;
    if (strlen(hostname) > SEED_HOSTNAME_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: hostname is longer than %d characters", SEED_HOSTNAME_MAX);

    g_auto(GStrv) labels = g_strsplit(hostname, ".", -1);
    for (char **label = labels; *label != NULL; label++) {
        size_t len = strlen(*label);
        if (len == 0 || len > 63 || (*label)[0] == '-' || (*label)[len - 1] == '-')
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "seed: hostname '%s' is not a valid host name", hostname);
        for (const char *p = *label; *p != '\0'; p++) {
            if (!g_ascii_isalnum(*p) && *p != '-')
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                                "seed: hostname '%s' is not a valid host name", hostname);
        }
    }
    return TRUE;
}

/* What useradd on Debian accepts without --badname. */
static gboolean
seed_check_user(const char *user, GError **error)
{
    if (!seed_check_line("user", user, error))
        return FALSE;

    size_t len = strlen(user);
    gboolean valid = len <= SEED_USER_MAX && (g_ascii_islower(user[0]) || user[0] == '_');
    for (size_t i = 1; valid && i < len; i++) {
        char c = user[i];
        valid = g_ascii_islower(c) || g_ascii_isdigit(c) || c == '_' || c == '-' ||
                (c == '$' && i == len - 1);
    }
    if (!valid)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: user '%s' is not a valid user name", user);
    return TRUE;
}

/* The private key is the one multi-line value: newlines are fine, other control characters
 * (a CR from a pasted key, a tab) are not, and it has to look like a PEM block. */
static gboolean
seed_check_private_key(const char *key, GError **error)
{
    if (key == NULL || *key == '\0')
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seed: host_key_private is missing");
    if (strlen(key) > SEED_PRIVATE_KEY_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: host_key_private is longer than %d bytes", SEED_PRIVATE_KEY_MAX);
    if (!g_str_has_prefix(key, "-----BEGIN "))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: host_key_private is not a PEM private key");
    for (const char *p = key; *p != '\0'; p++) {
        if (*p != '\n' && (!g_ascii_isprint(*p) || (guchar)*p >= 0x80))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "seed: host_key_private contains a character outside printable "
                            "ASCII");
    }
    return TRUE;
}

/* Whether the first @len bytes of @host are a host name or IPv4 address: letters, digits, dots
 * and hyphens, which land unquoted in the proxy settings. */
static gboolean
seed_is_host(const char *host, gsize len)
{
    gboolean ok = len > 0 && len <= SEED_HOSTNAME_MAX;

    for (gsize i = 0; ok && i < len; i++)
        ok = g_ascii_isalnum(host[i]) || host[i] == '.' || host[i] == '-';
    return ok;
}

/* The proxy URL lands unquoted in /etc/environment and in shell and apt syntax: only
 * "http://" HOST [":" PORT] with HOST made of letters, digits, dots and hyphens. */
static gboolean
seed_check_proxy(const char *url, GError **error)
{
    const char *host = NULL;
    gsize host_len = 0;
    gboolean ok;

    if (!seed_check_line("egress_proxy", url, error))
        return FALSE;
    ok = g_str_has_prefix(url, "http://");
    if (ok) {
        host = url + strlen("http://");
        host_len = strcspn(host, ":");
    }
    ok = ok && seed_is_host(host, host_len);
    if (ok && host[host_len] == ':') {
        const char *port = host + host_len + 1;

        ok = port[0] != '\0' && strlen(port) <= 5;
        for (const char *q = port; ok && *q != '\0'; q++)
            ok = g_ascii_isdigit(*q);
    }
    if (!ok)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: egress_proxy '%s' is not http://HOST[:PORT]", url);
    return TRUE;
}

/* The most a CA certificate or the environment block may take: far more than they need. */
#define SEED_BLOCK_MAX (16 * 1024)

/* One PEM certificate and nothing else: a key must never reach a guest, whoever made the
 * spec. */
static gboolean
seed_check_ca(const char *pem, GError **error)
{
    const char *begin = "-----BEGIN CERTIFICATE-----\n";
    const char *end = "-----END CERTIFICATE-----\n";

    if (strlen(pem) > SEED_BLOCK_MAX || !g_utf8_validate(pem, -1, NULL) ||
        !g_str_has_prefix(pem, begin) || !g_str_has_suffix(pem, end) ||
        strstr(pem + strlen(begin), "-----BEGIN") != NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: egress_ca_pem is not one PEM certificate");
    return TRUE;
}

/* Lines pam_env reads as they are: comments and NAME=VALUE, VALUE without control characters. */
static gboolean
seed_check_environment(const char *block, GError **error)
{
    g_auto(GStrv) lines = NULL;

    if (strlen(block) > SEED_BLOCK_MAX || !g_utf8_validate(block, -1, NULL) ||
        !g_str_has_suffix(block, "\n"))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: environment_block is not whole lines of text");
    lines = g_strsplit(block, "\n", -1);
    for (char **line = lines; line[1] != NULL; line++) {
        const char *p = *line;
        gboolean ok = p[0] == '#';

        if (!ok) {
            gsize name_len = 0;

            while (g_ascii_isalnum(p[name_len]) || p[name_len] == '_')
                name_len++;
            ok = name_len > 0 && !g_ascii_isdigit(p[0]) && p[name_len] == '=';
        }
        for (const char *q = p; ok && *q != '\0'; q = g_utf8_next_char(q))
            ok = !g_unichar_iscntrl(g_utf8_get_char(q));
        if (!ok)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "seed: environment_block line %u is neither a comment nor NAME=VALUE",
                            (guint)(line - lines) + 1);
    }
    return TRUE;
}

static gboolean
seed_check_meta(const VmSeedSpec *spec, GError **error)
{
    return seed_check_hostname(spec->hostname, error) &&
           seed_check_line("instance_id", spec->instance_id, error);
}

static gboolean
seed_is_ipv4(const char *text)
{
    struct in_addr address;

    return inet_pton(AF_INET, text, &address) == 1;
}

/* What a warm and an agent's seed share: packages, proxy, API host, CA, environment. */
static gboolean
seed_check_optional(const VmSeedSpec *spec, GError **error)
{
    for (const char *const *pkg = spec->packages; pkg != NULL && *pkg != NULL; pkg++) {
        if (!seed_check_line("package name", *pkg, error))
            return FALSE;
    }
    if (spec->egress_proxy != NULL && !seed_check_proxy(spec->egress_proxy, error))
        return FALSE;
    if (spec->guest_api_host != NULL &&
        !seed_is_host(spec->guest_api_host, strlen(spec->guest_api_host)))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: guest_api_host '%s' is not a host name or IPv4 address",
                        spec->guest_api_host);
    if (spec->egress_resolver != NULL && !seed_is_ipv4(spec->egress_resolver))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: egress_resolver '%s' is not an IPv4 address", spec->egress_resolver);
    if (spec->egress_ca_pem != NULL && !seed_check_ca(spec->egress_ca_pem, error))
        return FALSE;
    if (spec->environment_block != NULL && !seed_check_environment(spec->environment_block, error))
        return FALSE;
    return TRUE;
}

static gboolean
seed_check_spec(const VmSeedSpec *spec, GError **error)
{
    if (!seed_check_meta(spec, error) || !seed_check_user(spec->user, error))
        return FALSE;
    if (spec->warm)
        return seed_check_optional(spec, error);
    if (!seed_check_line("authorized_key", spec->authorized_key, error) ||
        !seed_check_private_key(spec->host_key_private, error) ||
        !seed_check_line("host_key_public", spec->host_key_public, error))
        return FALSE;

    /* cloud-init writes ed25519_public next to the private key, and sshd would refuse a
     * mismatched type anyway: catch a swapped or wrong key here. */
    if (!g_str_has_prefix(spec->host_key_public, "ssh-ed25519 "))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "seed: host_key_public is not an ssh-ed25519 public key");

    guint n_keys = 0;
    for (const char *const *key = spec->user_keys; key != NULL && *key != NULL; key++) {
        if (!seed_check_line("user key", *key, error))
            return FALSE;
        if (++n_keys > VM_SSH_KEYS_MAX)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "seed: more than %d user keys",
                            VM_SSH_KEYS_MAX);
    }
    return seed_check_optional(spec, error);
}

/* Appends @value as a YAML double-quoted scalar, so that no character of it (':', '#', '"',
 * a leading '-' or '*', "yes", "null"...) can change what the document means. */
static void
seed_append_quoted(GString *out, const char *value)
{
    g_string_append_c(out, '"');
    for (const char *p = value; *p != '\0'; p = g_utf8_next_char(p)) {
        gunichar c = g_utf8_get_char(p);
        switch (c) {
        case '"':
            g_string_append(out, "\\\"");
            break;
        case '\\':
            g_string_append(out, "\\\\");
            break;
        case '\n':
            g_string_append(out, "\\n");
            break;
        case '\t':
            g_string_append(out, "\\t");
            break;
        default:
            if (c < 0x20 || c == 0x7f)
                g_string_append_printf(out, "\\x%02x", (guint)c);
            else if (g_unichar_iscntrl(c) || c == 0x2028 || c == 0x2029 || c == 0xfeff)
                g_string_append_printf(out, "\\u%04x", (guint)c);
            else
                g_string_append_len(out, p, g_utf8_next_char(p) - p);
            break;
        }
    }
    g_string_append_c(out, '"');
}

/* Appends "<key>: |" and @text as a literal block scalar two spaces deeper than the key, with
 * the chomping indicator that gives back exactly @text's trailing newlines. @text must not start
 * with a space (YAML would then need an indentation indicator); the PEM check ensures that. */
static void
seed_append_block(GString *out, int key_indent, const char *key, const char *text)
{
    int indent = key_indent + 2;
    size_t len = strlen(text);
    size_t trailing = 0;

    while (trailing < len && text[len - 1 - trailing] == '\n')
        trailing++;

    g_assert(text[0] != ' ');
    g_string_append_printf(out, "%*s%s: |", key_indent, "", key);
    g_string_append(out, trailing == 0 ? "-" : trailing == 1 ? "" : "+");
    g_string_append_c(out, '\n');

    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    /* g_strsplit() leaves one empty string after the last newline: it is not a line. */
    guint n = g_strv_length(lines);
    if (trailing > 0)
        n--;
    for (guint i = 0; i < n; i++) {
        if (lines[i][0] != '\0')
            g_string_append_printf(out, "%*s%s", indent, "", lines[i]);
        g_string_append_c(out, '\n');
    }
}

static void
seed_append_key_quoted(GString *out, int indent, const char *key, const char *value)
{
    g_string_append_printf(out, "%*s%s: ", indent, "", key);
    seed_append_quoted(out, value);
    g_string_append_c(out, '\n');
}

/* The guest's only way out is the proxy, so everything that honours the usual settings is
 * pointed at it: login sessions through pam_env (/etc/environment, also what SSH and vmctl exec
 * get), shells through profile.d, and apt, which reads neither. They are always written, so a
 * policy opened later works without touching the guest. */
static void
seed_append_proxy(GString *out, const char *url, const char *guest_api_host)
{
    static const char *const names[] = {"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"};
    g_autofree char *no_proxy =
        g_strconcat("localhost,127.0.0.1,::1", guest_api_host != NULL ? "," : "",
                    guest_api_host != NULL ? guest_api_host : "", NULL);
    g_autoptr(GString) environment = g_string_new(NULL);
    g_autoptr(GString) profile = g_string_new(NULL);
    g_autofree char *apt = g_strdup_printf("Acquire::http::Proxy \"%s\";\n"
                                           "Acquire::https::Proxy \"%s\";\n",
                                           url, url);

    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        g_string_append_printf(environment, "%s=%s\n", names[i], url);
        g_string_append_printf(profile, "export %s=\"%s\"\n", names[i], url);
    }
    g_string_append_printf(environment, "no_proxy=%s\nNO_PROXY=%s\n", no_proxy, no_proxy);
    g_string_append_printf(profile, "export no_proxy=\"%s\"\nexport NO_PROXY=\"%s\"\n", no_proxy,
                           no_proxy);

    seed_append_key_quoted(out, 2, "- path", "/etc/environment");
    g_string_append(out, "    append: true\n");
    seed_append_key_quoted(out, 4, "content", environment->str);
    seed_append_key_quoted(out, 2, "- path", "/etc/profile.d/vmctl-egress.sh");
    seed_append_key_quoted(out, 4, "permissions", "0644");
    seed_append_key_quoted(out, 4, "content", profile->str);
    seed_append_key_quoted(out, 2, "- path", "/etc/apt/apt.conf.d/90vmctl-egress");
    seed_append_key_quoted(out, 4, "permissions", "0644");
    seed_append_key_quoted(out, 4, "content", apt);
}

/* The built-in file @name (vm-seed.gresource.xml) as text, kept for the life of the process. */
static const char *
seed_resource_text(const char *name)
{
    static GMutex lock;
    static GHashTable *texts;
    g_autoptr(GMutexLocker) locker = g_mutex_locker_new(&lock);
    const char *text;

    if (texts == NULL)
        texts = g_hash_table_new(g_str_hash, g_str_equal);
    text = g_hash_table_lookup(texts, name);
    if (text == NULL) {
        g_autofree char *path = g_strconcat("/dev/vmctl/cloud-init/", name, NULL);
        /* Built in: a lookup cannot fail, and the bytes stay for the life of the process. */
        g_autoptr(GBytes) bytes = g_resource_lookup_data(vm_seed_resources_get_resource(), path,
                                                         G_RESOURCE_LOOKUP_FLAGS_NONE, NULL);
        gsize len = 0;
        const char *data = g_bytes_get_data(bytes, &len);
        char *copy = g_strndup(data, len);

        g_hash_table_insert(texts, (gpointer)g_intern_string(name), copy);
        text = copy;
    }
    return text;
}

const char *
vm_seed_guest_tool(void)
{
    return seed_resource_text("vmctl-guest");
}

/* hostd's sshd on the virtio port (hostd/hostd-ssh-serial.h): the script and its unit, which
 * the seed's runcmd enables. */
static void
seed_append_ssh_serial(GString *out)
{
    seed_append_key_quoted(out, 2, "- path", "/usr/local/libexec/vmctl-ssh-serial");
    seed_append_key_quoted(out, 4, "permissions", "0755");
    seed_append_key_quoted(out, 4, "content", seed_resource_text("vmctl-ssh-serial"));
    seed_append_key_quoted(out, 2, "- path", "/etc/systemd/system/vmctl-ssh-serial.service");
    seed_append_key_quoted(out, 4, "permissions", "0644");
    seed_append_key_quoted(out, 4, "content", seed_resource_text("vmctl-ssh-serial.service"));
}

/* The in-guest API's command, for every user (the API answers for this agent whoever calls it:
 * anything in the guest may checkpoint it). */
static void
seed_append_guest_tool(GString *out)
{
    seed_append_key_quoted(out, 2, "- path", "/usr/local/bin/vmctl-guest");
    seed_append_key_quoted(out, 4, "permissions", "0755");
    seed_append_key_quoted(out, 4, "content", vm_seed_guest_tool());
}

/* Files the guest gets at its first boot: the proxy settings, its resolver, the egress CA (trusted
 * by the runcmd of seed_render_cloud_config()), the credential broker's environment block after the
 * proxy's lines, vmctl-guest, hostd's sshd on the virtio port. */
static void
seed_append_write_files(GString *out, const VmSeedSpec *spec)
{
    g_string_append(out, "write_files:\n");
    if (spec->egress_proxy != NULL)
        seed_append_proxy(out, spec->egress_proxy, spec->guest_api_host);
    if (spec->egress_resolver != NULL) {
        /* Over TCP only: QEMU's restricted network drops the guest's UDP, and the resolver is a
         * guest forward, which carries TCP (docs/EGRESS.md). */
        g_autofree char *resolv =
            g_strdup_printf("nameserver %s\noptions use-vc\n", spec->egress_resolver);

        seed_append_key_quoted(out, 2, "- path", "/etc/resolv.conf");
        seed_append_key_quoted(out, 4, "permissions", "0644");
        seed_append_key_quoted(out, 4, "content", resolv);
    }
    if (spec->egress_ca_pem != NULL) {
        seed_append_key_quoted(out, 2, "- path", VM_SEED_EGRESS_CA_PATH);
        seed_append_key_quoted(out, 4, "permissions", "0644");
        seed_append_key_quoted(out, 4, "content", spec->egress_ca_pem);
    }
    if (spec->environment_block != NULL) {
        seed_append_key_quoted(out, 2, "- path", "/etc/environment");
        g_string_append(out, "    append: true\n");
        seed_append_key_quoted(out, 4, "content", spec->environment_block);
    }
    if (spec->guest_tool)
        seed_append_guest_tool(out);
    seed_append_ssh_serial(out);
}

/* The keys of an agent's seed: hostd's and the user's authorized, and exactly the host key hostd
 * generated, so hostd can pin it. */
static void
seed_append_keys(GString *out, const VmSeedSpec *spec)
{
    g_string_append(out, "    ssh_authorized_keys:\n");
    g_string_append(out, "      - ");
    seed_append_quoted(out, spec->authorized_key);
    g_string_append_c(out, '\n');
    for (const char *const *key = spec->user_keys; key != NULL && *key != NULL; key++) {
        g_string_append(out, "      - ");
        seed_append_quoted(out, *key);
        g_string_append_c(out, '\n');
    }
    g_string_append(out, "disable_root: true\n");
    g_string_append(out, "ssh_pwauth: false\n");
    g_string_append(out, "ssh_deletekeys: true\n");
    g_string_append(out, "ssh_genkeytypes: []\n");
    g_string_append(out, "ssh_keys:\n");
    seed_append_block(out, 2, "ed25519_private", spec->host_key_private);
    seed_append_key_quoted(out, 2, "ed25519_public", spec->host_key_public);
}

/* A warm image's machine holds no key: the image's host keys go, none is made, and sshd waits
 * for VM_SEED_WARM_IDENTITY_FLAG, which hostd creates once it has given a restored agent its
 * identity (a condition in /run, so for this boot only: a later cold boot of an agent starts sshd
 * as usual, and starting it later needs no daemon-reload). The same drop-in skips the unit's
 * `sshd -t` before the start, a second parse of config and keys that a restored agent waits for
 * (sshd itself refuses a bad configuration all the same). */
static void
seed_append_warm(GString *out)
{
    g_string_append(out, "disable_root: true\n");
    g_string_append(out, "ssh_pwauth: false\n");
    g_string_append(out, "ssh_deletekeys: true\n");
    g_string_append(out, "ssh_genkeytypes: []\n");
    g_string_append(out, "bootcmd:\n");
    g_string_append(out,
                    "  - [\"sh\", \"-c\", \"mkdir -p /run/systemd/system/ssh.service.d && printf "
                    "'[Unit]\\\\nConditionPathExists=" VM_SEED_WARM_IDENTITY_FLAG
                    "\\\\n[Service]\\\\nExecStartPre=\\\\n' > "
                    "/run/systemd/system/ssh.service.d/vmctl-warm.conf && "
                    "systemctl daemon-reload\"]\n");
}

/* hostd's own #cloud-config; @spec is already checked. */
static char *
seed_render_cloud_config(const VmSeedSpec *spec)
{
    GString *out = g_string_new("#cloud-config\n");

    seed_append_key_quoted(out, 0, "hostname", spec->hostname);
    seed_append_key_quoted(out, 0, "fqdn", spec->hostname);
    /* Without it the hostname does not resolve and every sudo waits for DNS and complains. */
    g_string_append(out, "manage_etc_hosts: true\n");

    g_string_append(out, "users:\n");
    g_string_append(out, "  - name: ");
    seed_append_quoted(out, spec->user);
    g_string_append_c(out, '\n');
    seed_append_key_quoted(out, 4, "sudo", "ALL=(ALL) NOPASSWD:ALL");
    seed_append_key_quoted(out, 4, "shell", "/bin/bash");
    g_string_append(out, "    lock_passwd: true\n");
    if (spec->warm) {
        seed_append_warm(out);
    } else {
        seed_append_keys(out, spec);
    }

    seed_append_write_files(out, spec);
    /* write_files runs before runcmd: the certificate is in place when the store is rebuilt. */
    g_string_append(out, "runcmd:\n");
    if (spec->egress_ca_pem != NULL) {
        g_string_append(out, "  - [\"sh\", \"-c\", ");
        seed_append_quoted(out, VM_SEED_TRUST_CA_SCRIPT);
        g_string_append(out, ", \"sh\", \"" VM_SEED_EGRESS_CA_PATH
                             "\", \"\", \"" VM_SEED_CA_BUNDLE_PATH "\"]\n");
    }
    g_string_append(out,
                    "  - [\"systemctl\", \"enable\", \"--now\", \"vmctl-ssh-serial.service\"]\n");

    if (spec->packages != NULL && spec->packages[0] != NULL) {
        g_string_append(out, "packages:\n");
        for (const char *const *pkg = spec->packages; *pkg != NULL; pkg++) {
            g_string_append(out, "  - ");
            seed_append_quoted(out, *pkg);
            g_string_append_c(out, '\n');
        }
    }
    return g_string_free(out, FALSE);
}

/* The first line of @text with trailing blanks (and a CR) removed. */
static char *
seed_first_line(const char *text)
{
    const char *end = strchr(text, '\n');
    char *line = end != NULL ? g_strndup(text, end - text) : g_strdup(text);
    return g_strchomp(line);
}

/* A top-level merge_how/merge_type in a part's body would take precedence over our Merge-Type
 * header and could let the part replace hostd's user and keys. */
static gboolean
seed_sets_merge_keys(const char *text)
{
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (char **line = lines; *line != NULL; line++) {
        const char *p = *line;
        if (*p == '"' || *p == '\'')
            p++;
        if (g_str_has_prefix(p, "merge_how") || g_str_has_prefix(p, "merge_type"))
            return TRUE;
    }
    return FALSE;
}

/* Transfer-encodes @text: as is when it is 7-bit with short lines, else base64. Python's email
 * parser (which cloud-init uses) mangles non-ASCII text in an unencoded part. */
static char *
seed_encode_body(const char *text, gboolean *ret_base64)
{
    gboolean plain = TRUE;
    size_t line_len = 0;

    for (const char *p = text; *p != '\0' && plain; p++) {
        if ((guchar)*p >= 0x80 || *p == '\r')
            plain = FALSE;
        line_len = *p == '\n' ? 0 : line_len + 1;
        if (line_len > SEED_MIME_LINE_MAX)
            plain = FALSE;
    }
    *ret_base64 = !plain;
    if (plain)
        return g_strdup(text);

    g_autofree char *encoded = g_base64_encode((const guchar *)text, strlen(text));
    GString *out = g_string_new(NULL);
    size_t encoded_len = strlen(encoded);
    for (size_t i = 0; i < encoded_len; i += 76) {
        g_string_append_len(out, encoded + i, MIN(76, encoded_len - i));
        g_string_append_c(out, '\n');
    }
    return g_string_free(out, FALSE);
}

/* Checks an extra part (@what names it in errors) and fills @part. */
static gboolean
seed_part_init(SeedPart *part, const char *what, const char *text, const char *stem, GError **error)
{
    size_t len = strlen(text);

    if (len > VM_USER_DATA_MAX)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "%s is %zu bytes, more than the limit of %d", what, len, VM_USER_DATA_MAX);
    if (!g_utf8_validate(text, len, NULL))
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s is not valid UTF-8", what);

    g_autofree char *first = seed_first_line(text);
    if (strcmp(first, "#cloud-config") == 0) {
        if (seed_sets_merge_keys(text))
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "%s must not set merge_how or merge_type", what);
        part->type = SEED_PART_CLOUD_CONFIG;
        part->merge = TRUE;
        part->filename = stem;
    } else if (g_str_has_prefix(first, "#!")) {
        part->type = SEED_PART_SHELL_SCRIPT;
        part->merge = FALSE;
        part->filename = stem;
    } else {
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s must start with #cloud-config or #!",
                        what);
    }
    part->body = seed_encode_body(text, &part->base64);
    return TRUE;
}

/* A boundary derived from the parts, so the same input always renders the same bytes, and
 * checked against every part: a part cannot end the message early. */
static char *
seed_choose_boundary(const SeedPart *parts, guint n_parts)
{
    for (guint attempt = 0;; attempt++) {
        g_autoptr(GChecksum) sum = g_checksum_new(G_CHECKSUM_SHA256);
        g_checksum_update(sum, (const guchar *)&attempt, sizeof(attempt));
        for (guint i = 0; i < n_parts; i++)
            g_checksum_update(sum, (const guchar *)parts[i].body, -1);

        g_autofree char *boundary =
            g_strdup_printf("==vmctl-seed-%.32s==", g_checksum_get_string(sum));
        gboolean clash = FALSE;
        for (guint i = 0; i < n_parts && !clash; i++)
            clash = strstr(parts[i].body, boundary) != NULL;
        if (!clash)
            return g_steal_pointer(&boundary);
    }
}

static void
seed_append_part(GString *out, const char *boundary, const SeedPart *part)
{
    gboolean cfg = part->type == SEED_PART_CLOUD_CONFIG;

    g_string_append_printf(out, "--%s\n", boundary);
    g_string_append_printf(out, "Content-Type: %s; charset=\"utf-8\"\n",
                           cfg ? "text/cloud-config" : "text/x-shellscript");
    g_string_append(out, "MIME-Version: 1.0\n");
    g_string_append_printf(out, "Content-Transfer-Encoding: %s\n",
                           part->base64 ? "base64" : "7bit");
    g_string_append_printf(out, "Content-Disposition: attachment; filename=\"%s%s\"\n",
                           part->filename, cfg ? ".cfg" : ".sh");
    if (part->merge)
        g_string_append(out, "Merge-Type: " SEED_MERGE_TYPE "\n");
    g_string_append_c(out, '\n');
    g_string_append(out, part->body);
    /* The line break before a delimiter belongs to the delimiter, not to the body: this one
     * keeps the body's own last newline. */
    g_string_append_c(out, '\n');
}

char *
vm_seed_render_user_data(const VmSeedSpec *spec, GError **error)
{
    g_return_val_if_fail(spec != NULL, NULL);
    g_return_val_if_fail(error == NULL || *error == NULL, NULL);

    if (!seed_check_spec(spec, error))
        return NULL;

    g_autofree char *hostd_config = seed_render_cloud_config(spec);
    if (spec->template_user_data == NULL && spec->user_user_data == NULL)
        return g_steal_pointer(&hostd_config);

    /* Script file names sort in part order: cloud-init runs user scripts by name. */
    SeedPart parts[3] = {{
        .filename = "01-hostd",
        .type = SEED_PART_CLOUD_CONFIG,
        .merge = FALSE,
        .body = g_steal_pointer(&hostd_config),
        .base64 = FALSE,
    }};
    guint n_parts = 1;
    gboolean ok = TRUE;
    char *result = NULL;

    if (spec->template_user_data != NULL)
        ok = seed_part_init(&parts[n_parts++], "template user-data", spec->template_user_data,
                            "02-template", error);
    if (ok && spec->user_user_data != NULL)
        ok = seed_part_init(&parts[n_parts++], "user-data", spec->user_user_data, "03-user", error);

    if (ok) {
        g_autofree char *boundary = seed_choose_boundary(parts, n_parts);
        GString *out = g_string_new(NULL);

        g_string_append_printf(out, "Content-Type: multipart/mixed; boundary=\"%s\"\n", boundary);
        g_string_append(out, "MIME-Version: 1.0\n\n");
        for (guint i = 0; i < n_parts; i++)
            seed_append_part(out, boundary, &parts[i]);
        g_string_append_printf(out, "--%s--\n", boundary);
        result = g_string_free(out, FALSE);
    }

    for (guint i = 0; i < n_parts; i++)
        g_free(parts[i].body);
    return result;
}

char *
vm_seed_render_meta_data(const VmSeedSpec *spec, GError **error)
{
    g_return_val_if_fail(spec != NULL, NULL);
    g_return_val_if_fail(error == NULL || *error == NULL, NULL);

    if (!seed_check_meta(spec, error))
        return NULL;

    GString *out = g_string_new(NULL);
    seed_append_key_quoted(out, 0, "instance-id", spec->instance_id);
    seed_append_key_quoted(out, 0, "local-hostname", spec->hostname);
    return g_string_free(out, FALSE);
}

static gboolean
seed_write_file(const char *dir, const char *name, const char *contents, GError **error)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_autoptr(GError) local_error = NULL;

    if (!g_file_set_contents_full(path, contents, -1, G_FILE_SET_CONTENTS_NONE, 0644, &local_error))
        return vm_throw(error, VM_ERROR_IO, "seed: %s", local_error->message);
    /* The umask must not decide the modes genisoimage records in the Rock Ridge entries. */
    if (g_chmod(path, 0644) < 0)
        return vm_throw_errno(error, errno, "seed: cannot chmod %s", path);
    return TRUE;
}

static void
seed_remove_tmpdir(const char *dir)
{
    static const char *const names[] = {"user-data", "meta-data"};

    for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
        g_autofree char *path = g_build_filename(dir, names[i], NULL);
        (void)g_unlink(path);
    }
    (void)g_rmdir(dir);
}

static gboolean
seed_run_genisoimage(const char *dir, const char *output, GError **error)
{
    /* Absolute, so no input can be mistaken for an option; each file lands in the ISO's root
     * under its base name. */
    g_autofree char *user_data = g_canonicalize_filename("user-data", dir);
    g_autofree char *meta_data = g_canonicalize_filename("meta-data", dir);
    const char *argv[] = {
        "genisoimage", "-quiet", "-output", output,    "-volid", "cidata",
        "-joliet",     "-rock",  user_data, meta_data, NULL,
    };

    if (!vm_spawn_run(argv, NULL, NULL, error)) {
        g_prefix_error(error, "seed: ");
        return FALSE;
    }
    return TRUE;
}

static gboolean
seed_fsync_dir(const char *dir, GError **error)
{
    vm_autofd fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (fd < 0)
        return vm_throw_errno(error, errno, "seed: cannot open %s", dir);
    if (fsync(fd) < 0)
        return vm_throw_errno(error, errno, "seed: cannot sync %s", dir);
    return TRUE;
}

/* Fills @tmpdir, runs genisoimage into @tmp_iso (open as @fd) and renames it to @iso_path. */
static gboolean
seed_build_iso(const char *tmpdir, const char *tmp_iso, int fd, const char *iso_path,
               const char *user_data, const char *meta_data, GError **error)
{
    if (!seed_write_file(tmpdir, "user-data", user_data, error) ||
        !seed_write_file(tmpdir, "meta-data", meta_data, error) ||
        !seed_run_genisoimage(tmpdir, tmp_iso, error))
        return FALSE;
    if (fsync(fd) < 0)
        return vm_throw_errno(error, errno, "seed: cannot sync %s", tmp_iso);
    if (g_rename(tmp_iso, iso_path) < 0)
        return vm_throw_errno(error, errno, "seed: cannot rename %s to %s", tmp_iso, iso_path);

    g_autofree char *iso_dir = g_path_get_dirname(iso_path);
    return seed_fsync_dir(iso_dir, error);
}

gboolean
vm_seed_write_iso(const VmSeedSpec *spec, const char *iso_path, GError **error)
{
    g_return_val_if_fail(spec != NULL, FALSE);
    g_return_val_if_fail(iso_path != NULL, FALSE);
    g_return_val_if_fail(error == NULL || *error == NULL, FALSE);

    g_autofree char *user_data = vm_seed_render_user_data(spec, error);
    if (user_data == NULL)
        return FALSE;
    g_autofree char *meta_data = vm_seed_render_meta_data(spec, error);
    if (meta_data == NULL)
        return FALSE;

    g_autoptr(GError) local_error = NULL;
    g_autofree char *tmpdir = g_dir_make_tmp("vm-seed-XXXXXX", &local_error);
    if (tmpdir == NULL)
        return vm_throw(error, VM_ERROR_IO, "seed: %s", local_error->message);

    g_autofree char *iso_dir = g_path_get_dirname(iso_path);
    g_autofree char *iso_base = g_path_get_basename(iso_path);
    g_autofree char *tmp_iso = g_strdup_printf("%s/.%s.XXXXXX", iso_dir, iso_base);

    /* The ISO holds the guest's private host key: only its owner (libvirt chowns it to the
     * QEMU user) may read it. genisoimage truncates the file and keeps this mode. */
    vm_autofd fd = g_mkstemp_full(tmp_iso, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        vm_throw_errno(error, errno, "seed: cannot create a file next to %s", iso_path);
        seed_remove_tmpdir(tmpdir);
        return FALSE;
    }

    gboolean ok = seed_build_iso(tmpdir, tmp_iso, fd, iso_path, user_data, meta_data, error);
    if (!ok)
        (void)g_unlink(tmp_iso);
    seed_remove_tmpdir(tmpdir);
    return ok;
}
