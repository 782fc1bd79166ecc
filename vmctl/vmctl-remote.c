#include "vmctl-remote.h"

#include "vm-error.h"
#include "vm-util.h"

#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>

#define URL_PREFIX        "ssh://"
#define URL_EXPECTED      "expected ssh://[user@]host[:port][/socket-path]"
#define HOST_NAME_MAX_LEN 253

void
vmctl_remote_free(VmctlRemote *remote)
{
    if (remote == NULL)
        return;
    g_free(remote->user);
    g_free(remote->host);
    g_free(remote->socket_path);
    g_free(remote);
}

static gboolean
url_throw(GError **error, const char *what, const char *url, const char *why)
{
    /* The URL comes from the user: show a bounded, printable form of it. */
    g_autofree char *prefix = g_strndup(url, 200);
    g_autofree char *shown = g_strescape(prefix, NULL);

    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "invalid %s '%s': %s; " URL_EXPECTED, what,
                    shown, why);
}

static gboolean
is_word(const char *text, gsize len)
{
    if (len == 0)
        return FALSE;
    for (gsize i = 0; i < len; i++) {
        if (!g_ascii_isalnum(text[i]) && text[i] != '.' && text[i] != '-' && text[i] != '_')
            return FALSE;
    }
    return TRUE;
}

static gboolean
is_ipv6(const char *text, gsize len)
{
    if (len == 0)
        return FALSE;
    for (gsize i = 0; i < len; i++) {
        if (!g_ascii_isxdigit(text[i]) && text[i] != ':' && text[i] != '.')
            return FALSE;
    }
    return TRUE;
}

/* Splits "host[:port]" or "[v6][:port]" into @remote. Returns the reason it cannot, or NULL. */
static const char *
parse_host_port(const char *text, VmctlRemote *remote)
{
    const char *port = NULL;
    gsize host_len;

    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || !is_ipv6(text + 1, close - text - 1))
            return "an IPv6 address in brackets is hex digits and ':'";
        remote->host = g_strndup(text + 1, close - text - 1);
        if (close[1] == ':')
            port = close + 2;
        else if (close[1] != '\0')
            return "only ':PORT' may follow the address";
    } else {
        const char *colon = strchr(text, ':');
        host_len = colon != NULL ? (gsize)(colon - text) : strlen(text);
        if (host_len == 0)
            return "the host is missing";
        if (!is_word(text, host_len) || text[0] == '-' || host_len > HOST_NAME_MAX_LEN)
            return "a host is letters, digits, '.', '-' and '_', not starting with '-'";
        remote->host = g_strndup(text, host_len);
        if (colon != NULL)
            port = colon + 1;
    }
    if (port != NULL) {
        guint64 value;
        if (!g_ascii_string_to_unsigned(port, 10, 1, G_MAXUINT16, &value, NULL))
            return "the port is a number from 1 to 65535";
        remote->port = (guint16)value;
    }
    return NULL;
}

VmctlRemote *
vmctl_remote_parse(const char *url, const char *what, GError **error)
{
    g_autoptr(VmctlRemote) remote = g_new0(VmctlRemote, 1);
    const char *why = NULL;

    g_return_val_if_fail(url != NULL && what != NULL, NULL);

    if (strlen(url) > VMCTL_REMOTE_URL_MAX) {
        url_throw(error, what, url, "it is too long");
        return NULL;
    }
    if (!g_str_has_prefix(url, URL_PREFIX)) {
        url_throw(error, what, url, "it does not start with " URL_PREFIX);
        return NULL;
    }
    const char *rest = url + strlen(URL_PREFIX);
    const char *slash = strchr(rest, '/');
    g_autofree char *authority = slash != NULL ? g_strndup(rest, slash - rest) : g_strdup(rest);
    const char *at = strrchr(authority, '@');

    if (at != NULL) {
        if (!is_word(authority, at - authority)) {
            url_throw(error, what, url, "a user is letters, digits, '.', '-' and '_'");
            return NULL;
        }
        remote->user = g_strndup(authority, at - authority);
    }
    why = parse_host_port(at != NULL ? at + 1 : authority, remote);
    if (why != NULL) {
        url_throw(error, what, url, why);
        return NULL;
    }
    if (slash != NULL && slash[1] != '\0') {
        for (const char *c = slash; *c != '\0'; c++) {
            if ((guchar)*c < 0x20 || *c == 0x7f) {
                url_throw(error, what, url, "the socket path has a control character");
                return NULL;
            }
        }
        remote->socket_path = g_strdup(slash);
    }
    return g_steal_pointer(&remote);
}

char *
vmctl_remote_destination(const VmctlRemote *remote)
{
    g_autoptr(GString) text = g_string_new(NULL);
    gboolean v6 = strchr(remote->host, ':') != NULL;

    if (remote->user != NULL)
        g_string_append_printf(text, "%s@", remote->user);
    if (v6 && remote->port != 0)
        g_string_append_printf(text, "[%s]", remote->host);
    else
        g_string_append(text, remote->host);
    if (remote->port != 0)
        g_string_append_printf(text, ":%u", remote->port);
    return g_string_free(g_steal_pointer(&text), FALSE);
}

char **
vmctl_remote_ssh_argv(const VmctlRemote *remote, const char *const *remote_argv, gboolean terminal)
{
    g_autoptr(GStrvBuilder) argv = g_strv_builder_new();

    g_strv_builder_add_many(argv, "ssh", "-o", "BatchMode=yes", "-a", "-x", terminal ? "-t" : "-T",
                            NULL);
    if (remote->port != 0) {
        g_autofree char *port = g_strdup_printf("%u", remote->port);
        g_strv_builder_add_many(argv, "-p", port, NULL);
    }
    /* ssh hands the remote shell one line: every word is quoted so that it stays one word. */
    g_strv_builder_add(argv, "--");
    if (remote->user != NULL) {
        g_autofree char *destination = g_strdup_printf("%s@%s", remote->user, remote->host);
        g_strv_builder_add(argv, destination);
    } else {
        g_strv_builder_add(argv, remote->host);
    }
    for (gsize i = 0; remote_argv[i] != NULL; i++) {
        g_autofree char *word = g_shell_quote(remote_argv[i]);
        g_strv_builder_add(argv, word);
    }
    return g_strv_builder_end(argv);
}

char **
vmctl_remote_bridge_argv(const VmctlRemote *remote)
{
    g_autoptr(GStrvBuilder) argv = g_strv_builder_new();

    g_strv_builder_add_many(argv, "vmctl", "bridge", NULL);
    if (remote->socket_path != NULL)
        g_strv_builder_add_many(argv, "--socket", remote->socket_path, NULL);
    return g_strv_builder_end(argv);
}

gboolean
vmctl_remote_connect(const VmctlRemote *remote, int *ret_fd, int *ret_stderr_fd, GPid *ret_pid,
                     GError **error)
{
    g_auto(GStrv) bridge = vmctl_remote_bridge_argv(remote);
    g_auto(GStrv) argv = vmctl_remote_ssh_argv(remote, (const char *const *)bridge, FALSE);
    g_autoptr(GError) spawn_error = NULL;
    int pair[2], err_pipe[2];
    GPid pid;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) < 0)
        return vm_throw_errno(error, errno, "cannot create a socket pair");
    vm_autofd ours = pair[0];
    vm_autofd theirs = pair[1];
    if (pipe2(err_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return vm_throw_errno(error, errno, "cannot create a pipe");
    vm_autofd err_read = err_pipe[0];
    vm_autofd err_write = err_pipe[1];

    /* The same socket is ssh's stdin and stdout: it carries the frames both ways. */
    if (!g_spawn_async_with_pipes_and_fds(NULL, (const char *const *)argv, NULL,
                                          G_SPAWN_SEARCH_PATH | G_SPAWN_DO_NOT_REAP_CHILD, NULL,
                                          NULL, theirs, theirs, err_write, NULL, NULL, 0, &pid,
                                          NULL, NULL, NULL, &spawn_error)) {
        if (g_error_matches(spawn_error, G_SPAWN_ERROR, G_SPAWN_ERROR_NOENT))
            return vm_throw(error, VM_ERROR_IO,
                            "ssh is not installed (--host runs it); install openssh-client");
        return vm_throw(error, VM_ERROR_IO, "cannot run ssh: %s", spawn_error->message);
    }
    *ret_fd = g_steal_fd(&ours);
    *ret_stderr_fd = g_steal_fd(&err_read);
    *ret_pid = pid;
    return TRUE;
}

char *
vmctl_remote_ssh_config(const VmctlRemote *remote, const char *config)
{
    g_autofree char *destination = vmctl_remote_destination(remote);
    g_autoptr(GString) text = g_string_new(NULL);
    const char *line = config;

    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        gsize len = end != NULL ? (gsize)(end - line) : strlen(line);

        g_string_append_len(text, line, (gssize)len);
        g_string_append_c(text, '\n');
        if (g_str_has_prefix(line, "Host "))
            g_string_append_printf(text, "  ProxyJump %s\n", destination);
        line += len + (end != NULL ? 1 : 0);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}
