/* The credential broker's grants put into effect (hostd-secrets-sync.c, and the guest update of
 * hostd-secrets-guest.c): the proxy's credentials and the grants' hosts on 443 follow grants and
 * revokes without touching the stored policy; the seed of a new agent carries the CA certificate
 * and the block of placeholders, never a value or a key; rm drops the grants and the CA; a new
 * hostd hands every proxy its credentials; and the commands that bring a running guest up to
 * date, run against a fake guest (the real scripts on this host, the guest's paths mapped into a
 * temporary directory), write what pam_env must read and nothing else. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>

#include <gio/gio.h>
#include <glib/gstdio.h>

#include "hostd-agent.h"
#include "hostd-egress.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets-guest.h"
#include "hostd-secrets-store.h"
#include "hostd-secrets-sync.h"
#include "vm-error.h"
#include "vm-seed.h"
#include "vm-util.h"
#include "test-common.h"
#include "test-hostd-fixture.h"

#define VALUE "sk-real-value-that-must-stay-on-the-host-7f3a9c"

/* A CA the guest's bundle holds before any grant: it must stay there. */
#define SYSTEM_CA "# a comment\n-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----\n"

/* ---- a fake guest -----------------------------------------------------------------------------
 */

typedef struct {
    char *root;        /* the guest's files live under it */
    char *environment; /* <root>/etc/environment */
    char *ca;          /* <root>/ca/vmctl-egress.crt */
    char *bundle;      /* <root>/certs/ca-certificates.crt: the trust bundle, links beside it */
    GString *sent;     /* every byte sent to the guest, on stdin or in argv */
    guint commands;
    gboolean fail_next; /* the next command exits 1 with a message */
} FakeGuest;

static FakeGuest *
fake_guest_new(void)
{
    FakeGuest *g = g_new0(FakeGuest, 1);
    g_autofree char *etc = NULL;

    g->root = vm_test_make_tmpdir("test-secrets-guest-XXXXXX");
    etc = g_build_filename(g->root, "etc", NULL);
    g_assert(g_mkdir(etc, 0755) == 0);
    g->environment = g_build_filename(etc, "environment", NULL);
    g->ca = g_build_filename(g->root, "ca", "vmctl-egress.crt", NULL);
    g_autofree char *certs = g_build_filename(g->root, "certs", NULL);
    g_assert(g_mkdir(certs, 0755) == 0);
    g->bundle = g_build_filename(certs, "ca-certificates.crt", NULL);
    vm_test_write_file(g->bundle, SYSTEM_CA);
    g->sent = g_string_new(NULL);
    return g;
}

static void
fake_guest_free(FakeGuest *g)
{
    vm_test_remove_tree(g->root);
    g_free(g->root);
    g_free(g->environment);
    g_free(g->ca);
    g_free(g->bundle);
    g_string_free(g->sent, TRUE);
    g_free(g);
}

/* How many times @pem stands in the bundle, as a whole block. */
static guint
fake_guest_trusts(FakeGuest *g, const char *pem)
{
    g_autofree char *text = NULL;
    guint n = 0;

    if (!g_file_get_contents(g->bundle, &text, NULL, NULL))
        return 0;
    for (const char *p = text; (p = strstr(p, pem)) != NULL; p++)
        n++;
    return n;
}

/* Where the link vmctl-egress.pem beside the bundle points, or NULL. */
static char *
fake_guest_link(FakeGuest *g)
{
    g_autofree char *certs = g_path_get_dirname(g->bundle);
    g_autofree char *link = g_build_filename(certs, "vmctl-egress.pem", NULL);

    return g_file_read_link(link, NULL);
}

/* Runs the command as hostd would in the guest, minus sudo, with the guest's paths mapped. */
static gboolean
fake_guest_run(char **argv, GBytes *input, gsize max_output, int *ret_status, GBytes **ret_output,
               char **ret_stderr, gpointer user_data, GError **error)
{
    FakeGuest *g = user_data;
    g_autoptr(GPtrArray) args = g_ptr_array_new();
    g_autoptr(GSubprocess) proc = NULL;
    g_autoptr(GBytes) out = NULL;
    g_autoptr(GBytes) err = NULL;

    g->commands++;
    /* Root's work goes through sudo, never asking for a password. */
    assert_string_equal(argv[0], "sudo");
    assert_string_equal(argv[1], "-n");
    for (char **arg = argv + 2; *arg != NULL; arg++) {
        g_string_append_printf(g->sent, "%s\n", *arg);
        if (g_str_equal(*arg, HOSTD_SECRETS_GUEST_ENVIRONMENT_PATH))
            g_ptr_array_add(args, g->environment);
        else if (g_str_equal(*arg, HOSTD_SECRETS_GUEST_CA_PATH))
            g_ptr_array_add(args, g->ca);
        else if (g_str_equal(*arg, HOSTD_SECRETS_GUEST_BUNDLE_PATH))
            g_ptr_array_add(args, g->bundle);
        else
            g_ptr_array_add(args, *arg);
    }
    if (g->fail_next) {
        g->fail_next = FALSE;
        args->pdata[2] = (gpointer) "cat >/dev/null; echo 'read-only file system' >&2; exit 1";
    }
    g_ptr_array_add(args, NULL);
    if (input != NULL)
        g_string_append_len(g->sent, g_bytes_get_data(input, NULL), g_bytes_get_size(input));
    proc = g_subprocess_newv((const char *const *)args->pdata,
                             G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                                 G_SUBPROCESS_FLAGS_STDERR_PIPE,
                             error);
    if (proc == NULL)
        return FALSE;
    g_autoptr(GBytes) no_input = g_bytes_new_static("", 0);
    if (!g_subprocess_communicate(proc, input != NULL ? input : no_input, NULL, &out, &err, error))
        return FALSE;
    *ret_status = g_subprocess_get_exit_status(proc);
    if (ret_output != NULL)
        *ret_output = g_bytes_new_from_bytes(out, 0, MIN(g_bytes_get_size(out), max_output));
    if (ret_stderr != NULL)
        *ret_stderr = g_strndup(g_bytes_get_data(err, NULL), g_bytes_get_size(err));
    return TRUE;
}

static GHashTable *
env_of(const char *name, const char *placeholder)
{
    GHashTable *env = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);

    if (name != NULL)
        g_hash_table_insert(env, g_strdup(name), g_strdup(placeholder));
    return env;
}

static const char *const CA1 = "-----BEGIN CERTIFICATE-----\nONE\n-----END CERTIFICATE-----\n";
static const char *const CA2 = "-----BEGIN CERTIFICATE-----\nTWO\n-----END CERTIFICATE-----\n";
static const char *const PH = "vmph_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

static gboolean
file_is(const char *path, const char *text)
{
    g_autofree char *contents = NULL;

    return g_file_get_contents(path, &contents, NULL, NULL) && g_str_equal(contents, text);
}

/* A grant: the CA installed and trusted once, the block written after the user's lines; the
 * same again changes nothing and adds nothing; a new CA replaces the old in the bundle; the last
 * revoke removes the block and keeps the user's lines. */
static void
test_guest_update(void **state)
{
    (void)state;
    FakeGuest *g = fake_guest_new();
    g_autoptr(GHashTable) one = env_of("EXAMPLE_API_KEY", PH);
    g_autoptr(GHashTable) none = env_of(NULL, NULL);
    g_autoptr(GError) error = NULL;
    const char *user = "PATH=/usr/local/bin:/usr/bin:/bin\nhttp_proxy=http://10.0.2.100:3128\n";
    g_autofree char *expected = hostd_secrets_guest_environment(user, one);
    gboolean changed = FALSE;

    vm_test_write_file(g->environment, user);
    assert_true(hostd_secrets_guest_update(fake_guest_run, g, one, CA1, &changed, &error));
    vm_test_assert_no_error(error);
    assert_true(changed);
    /* The certificate and the read in one command, then the write. */
    assert_int_equal(g->commands, 2);
    assert_true(file_is(g->ca, CA1));
    assert_int_equal(vm_test_file_mode(g->ca), 0644);
    /* Trusted at once: in the bundle after what was there, linked beside it. */
    assert_int_equal(fake_guest_trusts(g, CA1), 1);
    assert_int_equal(fake_guest_trusts(g, SYSTEM_CA), 1);
    assert_int_equal(vm_test_file_mode(g->bundle), 0644);
    g_autofree char *link = fake_guest_link(g);
    assert_string_equal(link, g->ca);
    assert_true(file_is(g->environment, expected));
    assert_int_equal(vm_test_file_mode(g->environment), 0644);
    assert_non_null(strstr(expected, "EXAMPLE_API_KEY=vmph_AAAA"));
    assert_non_null(strstr(expected, "NODE_EXTRA_CA_CERTS=" HOSTD_SECRETS_GUEST_CA_PATH "\n"));
    assert_true(g_str_has_prefix(expected, user));

    /* Nothing to do: the file is not rewritten and the certificate not added again, in one
     * command (a new agent given both with its identity pays no more at its agent_up). */
    g->commands = 0;
    assert_true(hostd_secrets_guest_update(fake_guest_run, g, one, CA1, &changed, &error));
    assert_false(changed);
    assert_int_equal(fake_guest_trusts(g, CA1), 1);
    assert_int_equal(g->commands, 1);

    /* Another CA (a fork's own): replaced and trusted. */
    assert_true(hostd_secrets_guest_update(fake_guest_run, g, one, CA2, &changed, &error));
    assert_true(file_is(g->ca, CA2));
    assert_int_equal(fake_guest_trusts(g, CA2), 1);
    assert_int_equal(fake_guest_trusts(g, CA1), 0);
    assert_int_equal(fake_guest_trusts(g, SYSTEM_CA), 1);

    /* The last revoke: the block goes, the user's lines stay, no temporary file is left. */
    assert_true(hostd_secrets_guest_update(fake_guest_run, g, none, CA2, &changed, &error));
    assert_true(changed);
    assert_true(file_is(g->environment, user));
    assert_int_equal(fake_guest_trusts(g, CA2), 1);
    g_autofree char *etc = g_path_get_dirname(g->environment);
    g_autoptr(GDir) dir = g_dir_open(etc, 0, NULL);
    assert_string_equal(g_dir_read_name(dir), "environment");
    assert_null(g_dir_read_name(dir));

    /* Only the placeholder and the certificate ever went to the guest. */
    assert_null(strstr(g->sent->str, VALUE));
    assert_null(strstr(g->sent->str, "PRIVATE KEY"));
    fake_guest_free(g);
}

/* A guest without /etc/environment gets one holding the block alone. */
static void
test_guest_update_no_file(void **state)
{
    (void)state;
    FakeGuest *g = fake_guest_new();
    g_autoptr(GHashTable) one = env_of("EXAMPLE_API_KEY", PH);
    g_autoptr(GError) error = NULL;
    g_autofree char *expected = hostd_secrets_guest_environment(NULL, one);

    assert_true(hostd_secrets_guest_update(fake_guest_run, g, one, CA1, NULL, &error));
    vm_test_assert_no_error(error);
    assert_true(file_is(g->environment, expected));
    fake_guest_free(g);
}

/* The guest is hostile: an /etc/environment past 64 KiB, one with a NUL byte, or one that is not
 * a file is refused and left as it was; a command that fails in the guest says why. */
static void
test_guest_update_refused(void **state)
{
    (void)state;
    FakeGuest *g = fake_guest_new();
    g_autoptr(GHashTable) one = env_of("EXAMPLE_API_KEY", PH);
    g_autoptr(GString) big = g_string_new(NULL);
    g_autoptr(GError) error = NULL;

    while (big->len <= HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX)
        g_string_append(big, "X=0123456789012345678901234567890123456789\n");
    vm_test_write_file(g->environment, big->str);
    assert_false(hostd_secrets_guest_update(fake_guest_run, g, one, NULL, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "larger than 65536 bytes");
    g_clear_error(&error);
    assert_true(file_is(g->environment, big->str));

    /* Exactly the limit is fine. */
    g_string_truncate(big, HOSTD_SECRETS_GUEST_ENVIRONMENT_MAX - 1);
    g_string_append_c(big, '\n');
    vm_test_write_file(g->environment, big->str);
    assert_true(hostd_secrets_guest_update(fake_guest_run, g, one, NULL, NULL, &error));
    vm_test_assert_no_error(error);

    assert_true(g_file_set_contents(g->environment, "A=1\n\0B=2\n", 9, NULL));
    assert_false(hostd_secrets_guest_update(fake_guest_run, g, one, NULL, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "NUL");
    g_clear_error(&error);

    assert_int_equal(g_unlink(g->environment), 0);
    assert_int_equal(g_mkdir(g->environment, 0755), 0);
    assert_false(hostd_secrets_guest_update(fake_guest_run, g, one, NULL, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "is not a file");
    g_clear_error(&error);
    assert_int_equal(g_rmdir(g->environment), 0);

    g->fail_next = TRUE;
    assert_false(hostd_secrets_guest_update(fake_guest_run, g, one, CA1, NULL, &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_IO, "read-only file system");
    assert_false(g_file_test(g->ca, G_FILE_TEST_EXISTS));
    fake_guest_free(g);
}

/* ---- hostd --------------------------------------------------------------------------------------
 */

typedef struct {
    HostdTestFixture *hostd;
    HostdContext *ctx;
    char *secrets_dir;
    char *grants_dir;
} Fixture;

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->hostd = hostd_test_fixture_new();
    f->ctx = f->hostd->ctx;
    hostd_secrets_paths(f->ctx, &f->secrets_dir, &f->grants_dir);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    hostd_test_fixture_free(f->hostd);
    g_free(f->secrets_dir);
    g_free(f->grants_dir);
    g_free(f);
    return 0;
}

static void
store_secret(Fixture *f, const char *name, const char *env, const char *host)
{
    char *hosts[] = {(char *)host, NULL};
    HostdSecret secret = {
        .name = (char *)name,
        .value = (char *)VALUE,
        .hosts = hosts,
        .header = (char *)"Authorization",
        .format = (char *)"Bearer {}",
        .env = (char *)env,
    };
    g_autoptr(GError) error = NULL;

    assert_true(hostd_secrets_store_prepare(f->secrets_dir, &error));
    assert_true(hostd_secrets_store_save(f->secrets_dir, &secret, TRUE, &error));
    vm_test_assert_no_error(error);
}

static char *
grant(Fixture *f, const char *agent, const char *secret)
{
    g_autoptr(GError) error = NULL;
    char *placeholder = hostd_grants_add(f->grants_dir, agent, secret, &error);

    vm_test_assert_no_error(error);
    return placeholder;
}

static HostdAgentRecord *
agent_with_proxy(Fixture *f, const char *name)
{
    HostdAgentRecord *r = hostd_test_agent_record_new(f->hostd, name);
    const char *const allow[] = {"pypi.org", NULL};
    g_autoptr(GError) error = NULL;

    if (!hostd_egress_agent_init(f->ctx, r, allow, NULL, &error))
        fail_msg("egress: %s", error->message);
    return r;
}

static guint
n_credentials(Fixture *f, const char *name)
{
    g_autoptr(VmEgressCredentials) creds = hostd_egress_dup_credentials(f->ctx, name);

    return creds != NULL ? vm_egress_credentials_size(creds) : 0;
}

/* The paths: under the state dir, and nothing is created by asking. */
static void
test_paths(void **state)
{
    Fixture *f = *state;
    g_autofree char *secrets = g_build_filename(f->ctx->config->state_dir, "secrets", NULL);
    g_autofree char *grants = g_build_filename(secrets, "grants", NULL);

    assert_string_equal(f->secrets_dir, secrets);
    assert_string_equal(f->grants_dir, grants);
    assert_false(g_file_test(secrets, G_FILE_TEST_EXISTS));
}

/* Grant, sync: the proxy substitutes and the host is open on 443; revoke, sync: neither, and
 * egress.ini was never touched. A stopped agent is no error: its guest is done at agent_up. */
static void
test_sync_proxy(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = agent_with_proxy(f, "a1");
    g_autofree char *ini = hostd_test_agent_file(f->hostd, "a1", HOSTD_AGENT_EGRESS_POLICY);
    g_autofree char *ini_before = vm_test_read_file(ini);
    g_autoptr(GError) error = NULL;

    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    store_secret(f, "github", "GH_TOKEN", "*.github.com");
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    assert_int_equal(n_credentials(f, "a1"), 0);
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));

    g_free(grant(f, "a1", "example"));
    g_free(grant(f, "a1", "github"));
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    vm_test_assert_no_error(error);
    assert_int_equal(n_credentials(f, "a1"), 2);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.github.com", 443));
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 80));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "pypi.org", 443));
    assert_true(file_is(ini, ini_before));

    assert_true(hostd_grants_revoke(f->grants_dir, "a1", "example", &error));
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    assert_int_equal(n_credentials(f, "a1"), 1);
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.github.com", 443));
    assert_true(hostd_grants_revoke(f->grants_dir, "a1", "github", &error));
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    assert_int_equal(n_credentials(f, "a1"), 0);
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.github.com", 443));
    assert_true(file_is(ini, ini_before));

    assert_false(hostd_secrets_sync(f->ctx, "nosuch", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, "nosuch");
}

/* A secret of several headers reaches the proxy as such: one grant substitutes its placeholder
 * in x-api-key and in Authorization (Bearer kept), and nowhere else. */
static void
test_sync_several_headers(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = agent_with_proxy(f, "a1");
    char *hosts[] = {(char *)"api.anthropic.com", NULL};
    HostdSecret secret = {
        .name = (char *)"anthropic",
        .value = (char *)VALUE,
        .hosts = hosts,
        .header = (char *)"Authorization, x-api-key",
        .format = (char *)"{}",
        .env = (char *)"ANTHROPIC_API_KEY",
    };
    g_autoptr(GError) error = NULL;

    assert_true(hostd_secrets_store_prepare(f->secrets_dir, &error));
    assert_true(hostd_secrets_store_save(f->secrets_dir, &secret, TRUE, &error));
    g_autofree char *placeholder = grant(f, "a1", "anthropic");
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    vm_test_assert_no_error(error);
    g_autoptr(VmEgressCredentials) creds = hostd_egress_dup_credentials(f->ctx, "a1");
    assert_non_null(creds);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.anthropic.com", 443));

    static const char *const forms[][3] = {
        {"x-api-key", "", VALUE},
        {"Authorization", "Bearer ", "Bearer " VALUE},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(forms); i++) {
        g_autofree char *sent = g_strconcat(forms[i][1], placeholder, NULL);
        g_autofree char *head = g_strdup_printf(
            "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n%s: %s\r\n\r\n", forms[i][0],
            sent);
        g_autoptr(VmEgressParser) parser = vm_egress_parser_new_origin("api.anthropic.com", 443);
        gsize consumed = 0;
        g_autofree char *substituted = NULL;

        assert_int_equal(
            vm_egress_parser_feed(parser, (const guint8 *)head, strlen(head), &consumed, &error),
            VM_EGRESS_PARSE_DONE);
        g_autoptr(VmEgressRequest) request = vm_egress_parser_steal_request(parser);
        assert_true(vm_egress_credentials_apply(creds, request, "api.anthropic.com", NULL,
                                                &substituted, &error));
        assert_string_equal(vm_egress_request_get_header(request, forms[i][0]), forms[i][2]);
        assert_string_equal(substituted, "anthropic");
    }
}

/* A grant whose secret is gone: refused, and the proxy honours nothing rather than a stale set. */
static void
test_sync_secret_gone(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = agent_with_proxy(f, "a1");
    g_autoptr(GError) error = NULL;

    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    g_free(grant(f, "a1", "example"));
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    assert_int_equal(n_credentials(f, "a1"), 1);
    assert_true(hostd_secrets_store_remove(f->secrets_dir, "example", &error));
    assert_false(hostd_secrets_sync(f->ctx, "a1", &error));
    vm_test_assert_error(error, VM_ERROR, VM_ERROR_NOT_FOUND, NULL);
    assert_int_equal(n_credentials(f, "a1"), 0);
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
}

/* A new agent's seed: its CA certificate and the block of the grants it was created with, and
 * neither a secret's value nor the CA's key anywhere in the user-data. A fork's seed has none
 * (its guest is set right when it comes up). */
static void
test_seed(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = agent_with_proxy(f, "a1");
    g_autoptr(GPtrArray) keep = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;
    g_autofree char *placeholder = NULL;
    g_autofree char *ca = NULL;
    g_autofree char *key_path =
        g_build_filename(f->ctx->config->state_dir, "egress-ca", "a1.key", NULL);
    g_autofree char *key = NULL;
    g_autofree char *user_data = NULL;
    g_autofree char *expected_line = NULL;
    VmSeedSpec spec = {
        .hostname = "a1",
        .instance_id = "vmctl-a1",
        .user = "agent",
        .authorized_key =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
        .host_key_private = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
                            "-----END OPENSSH PRIVATE KEY-----\n",
        .host_key_public =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    };

    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    placeholder = grant(f, "a1", "example");
    hostd_secrets_sync_component.agent_seed(f->ctx, r, &spec, keep);
    ca = hostd_egress_ca_certificate(f->ctx, "a1", &error);
    assert_non_null(ca);
    assert_string_equal(spec.egress_ca_pem, ca);
    assert_non_null(spec.environment_block);
    expected_line = g_strdup_printf("\nEXAMPLE_API_KEY=%s\n", placeholder);
    assert_non_null(strstr(spec.environment_block, expected_line));
    assert_non_null(strstr(spec.environment_block, "SSL_CERT_FILE="));

    user_data = vm_seed_render_user_data(&spec, &error);
    vm_test_assert_no_error(error);
    assert_non_null(strstr(user_data, placeholder));
    assert_non_null(strstr(user_data, "update-ca-certificates"));
    assert_null(strstr(user_data, VALUE));
    key = vm_test_read_file(key_path);
    /* The key's base64 body, line by line: no line of it may be in the seed. */
    g_auto(GStrv) key_lines = g_strsplit(key, "\n", -1);
    for (char **line = key_lines; *line != NULL; line++) {
        if (strlen(*line) > 16 && !g_str_has_prefix(*line, "-----"))
            assert_null(strstr(user_data, *line));
    }
    assert_null(strstr(user_data, "EC PRIVATE KEY"));

    /* Without grants: the certificate, no block. */
    VmSeedSpec plain = spec;
    plain.egress_ca_pem = NULL;
    plain.environment_block = NULL;
    g_autoptr(HostdAgentRecord) r2 = agent_with_proxy(f, "a2");
    hostd_secrets_sync_component.agent_seed(f->ctx, r2, &plain, keep);
    assert_non_null(plain.egress_ca_pem);
    assert_string_not_equal(plain.egress_ca_pem, ca);
    assert_null(plain.environment_block);

    /* A fork: nothing. */
    VmSeedSpec fork = spec;
    fork.egress_ca_pem = NULL;
    fork.environment_block = NULL;
    g_free(r2->forked_from);
    r2->forked_from = g_strdup("a1");
    hostd_secrets_sync_component.agent_seed(f->ctx, r2, &fork, keep);
    assert_null(fork.egress_ca_pem);
    assert_null(fork.environment_block);
}

/* `new --secret`: grants made by an earlier component's agent_creating reach the proxy before
 * the first boot. */
static void
test_creating(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = agent_with_proxy(f, "a1");
    g_autoptr(GError) error = NULL;

    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    g_free(grant(f, "a1", "example"));
    assert_true(hostd_secrets_sync_component.agent_creating(f->ctx, r, NULL, &error));
    vm_test_assert_no_error(error);
    assert_int_equal(n_credentials(f, "a1"), 1);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));

    /* Grants made after this component's agent_creating reach the proxy when the agent is
     * ready. */
    store_secret(f, "github", "GH_TOKEN", "*.github.com");
    g_free(grant(f, "a1", "github"));
    assert_int_equal(n_credentials(f, "a1"), 1);
    assert_true(hostd_secrets_sync_component.agent_ready(f->ctx, r, &error));
    assert_int_equal(n_credentials(f, "a1"), 2);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.github.com", 443));
}

/* A new hostd: its proxies start bare, and reconcile gives each its agent's grants again. */
static void
test_reconcile(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = agent_with_proxy(f, "a1");
    g_autoptr(GPtrArray) notes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GError) error = NULL;

    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    g_free(grant(f, "a1", "example"));
    assert_true(hostd_secrets_sync(f->ctx, "a1", &error));
    hostd_egress_stop_all(f->ctx);
    assert_true(hostd_egress_agent_start(f->ctx, r, &error));
    assert_int_equal(n_credentials(f, "a1"), 0);
    assert_false(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
    hostd_secrets_sync_component.agent_reconcile(f->ctx, r, NULL, notes);
    assert_int_equal(notes->len, 0);
    assert_int_equal(n_credentials(f, "a1"), 1);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
}

/* rm: the agent's grants go (and with the egress component, its CA); others' stay. */
static void
test_removed(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r1 = agent_with_proxy(f, "a1");
    g_autoptr(HostdAgentRecord) r2 = agent_with_proxy(f, "a2");
    g_autofree char *a1_grants = g_build_filename(f->grants_dir, "a1", NULL);
    g_autofree char *a2_grants = g_build_filename(f->grants_dir, "a2", NULL);
    g_autofree char *a1_key =
        g_build_filename(f->ctx->config->state_dir, "egress-ca", "a1.key", NULL);
    g_autoptr(GError) error = NULL;

    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    g_free(grant(f, "a1", "example"));
    g_free(grant(f, "a2", "example"));
    assert_true(g_file_test(a1_key, G_FILE_TEST_EXISTS));
    for (guint i = 0; i < f->ctx->components->len; i++) {
        const HostdComponent *c = f->ctx->components->pdata[i];

        if (c->agent_removed != NULL)
            c->agent_removed(f->ctx, "a1");
    }
    assert_false(g_file_test(a1_grants, G_FILE_TEST_EXISTS));
    assert_true(g_file_test(a2_grants, G_FILE_TEST_EXISTS));
    assert_false(g_file_test(a1_key, G_FILE_TEST_EXISTS));
    assert_int_equal(n_credentials(f, "a1"), 0);
}

/* A running guest that cannot be reached: the proxy side is applied all the same, and the error
 * says the guest was not brought up to date. */
static void
test_sync_running_unreachable(void **state)
{
    Fixture *f = *state;
    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f->hostd, "a1", HOSTD_TEST_RUNNING);
    g_autoptr(GError) error = NULL;

    assert_true(hostd_egress_agent_init(f->ctx, r, NULL, NULL, &error));
    store_secret(f, "example", "EXAMPLE_API_KEY", "api.example.com");
    g_free(grant(f, "a1", "example"));
    assert_false(hostd_secrets_sync(f->ctx, "a1", &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_SSH) ||
                g_error_matches(error, VM_ERROR, VM_ERROR_IO));
    assert_int_equal(n_credentials(f, "a1"), 1);
    assert_true(hostd_test_egress_allows(f->ctx, "a1", "api.example.com", 443));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guest_update),
        cmocka_unit_test(test_guest_update_no_file),
        cmocka_unit_test(test_guest_update_refused),
        cmocka_unit_test_setup_teardown(test_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_proxy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_several_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_secret_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_creating, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reconcile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_running_unreachable, setup, teardown),
    };

    /* A fake guest command that fails before reading its input must not kill the test. */
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
