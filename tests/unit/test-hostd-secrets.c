/* The credential broker's operations (hostd-secrets.c) against a state dir on libvirt's test
 * driver: what `vmctl secret ...`, `new --secret`, `fork --grants`, `info` and `rm` leave in
 * $STATE/secrets, the error code of each refusal (vmctl's exit status), and that no result or
 * error ever carries a secret's value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "hostd-fork.h"
#include "hostd-secrets-check.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets-store.h"
#include "hostd-secrets.h"
#include "test-common.h"
#include "test-hostd-fixture.h"

#define VALUE "sk-live-0123456789abcdef"

static GVariant *
create(HostdTestFixture *f, const char *name, const char *const *hosts, const char *header,
       const char *format, const char *env, const char *value, GError **error)
{
    HostdSecretRequest req = {
        .name = name,
        .hosts = hosts,
        .header = header,
        .format = format,
        .env = env,
        .value = (const guint8 *)value,
        .value_len = strlen(value),
    };
    return hostd_test_sink(hostd_secret_create(f->ctx, &req, error));
}

static void
create_ok(HostdTestFixture *f, const char *name)
{
    const char *const hosts[] = {"api.example.com", NULL};
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v = create(f, name, hosts, NULL, NULL, NULL, VALUE, &error);
    if (v == NULL)
        fail_msg("create %s: %s", name, error->message);
}

static void
grant_ok(HostdTestFixture *f, const char *agent, const char *name)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v = hostd_test_sink(hostd_secret_grant(f->ctx, agent, name, &error));
    if (v == NULL)
        fail_msg("grant %s %s: %s", agent, name, error->message);
}

/* The placeholder @agent holds for @name, or NULL. */
static char *
placeholder_of(HostdTestFixture *f, const char *agent, const char *name)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(f->ctx);
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, agent, NULL);
    assert_non_null(grants);
    return g_strdup(g_hash_table_lookup(grants, name));
}

/* The secrets of `vmctl info`: "name=env ..." in order. */
static char *
grants_text(HostdTestFixture *f, const char *agent)
{
    g_autoptr(GVariant) grants = hostd_test_sink(hostd_secrets_agent_grants(f->ctx, agent));
    g_autoptr(GString) text = g_string_new(NULL);
    for (gsize i = 0; i < g_variant_n_children(grants); i++) {
        g_autoptr(GVariant) grant = g_variant_get_child_value(grants, i);
        g_autofree char *name = hostd_test_dict_string(grant, "name");
        g_autofree char *env = hostd_test_dict_string(grant, "env");
        g_string_append_printf(text, "%s%s=%s", i > 0 ? " " : "", name, env);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

static void
assert_no_value(GVariant *v)
{
    g_autofree char *text = g_variant_print(v, FALSE);
    assert_null(strstr(text, VALUE));
}

/* create stores the secret 0600 in a 0700 $STATE/secrets with the contract's defaults, and its
 * description (and list) never carries the value. */
static void
test_create_and_list(void **state)
{
    HostdTestFixture *f = *state;
    const char *const hosts[] = {"API.Example.com", "*.example.org", "api.example.com", NULL};
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v = create(f, "example-api", hosts, NULL, NULL, NULL, VALUE, &error);
    if (v == NULL)
        fail_msg("create: %s", error->message);
    assert_no_value(v);
    g_autofree char *header = hostd_test_dict_string(v, "header");
    g_autofree char *format = hostd_test_dict_string(v, "format");
    g_autofree char *env = hostd_test_dict_string(v, "env");
    assert_string_equal(header, "Authorization");
    assert_string_equal(format, "Bearer {}");
    assert_string_equal(env, "EXAMPLE_API");
    /* normalised, each once */
    g_autoptr(GVariant) stored_hosts = g_variant_lookup_value(v, "hosts", G_VARIANT_TYPE("as"));
    g_autofree const char **h = g_variant_get_strv(stored_hosts, NULL);
    assert_int_equal(g_strv_length((char **)h), 2);
    assert_string_equal(h[0], "api.example.com");
    assert_string_equal(h[1], "*.example.org");

    g_autofree char *dir = hostd_secrets_dir(f->ctx);
    g_autofree char *file = g_build_filename(dir, "example-api", NULL);
    assert_int_equal(vm_test_file_mode(dir), 0700);
    assert_int_equal(vm_test_file_mode(file), 0600);
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, "example-api", &error);
    assert_non_null(secret);
    assert_string_equal(secret->value, VALUE);

    const char *const gh_hosts[] = {"api.github.com", NULL};
    g_autoptr(GVariant) gh =
        create(f, "gh", gh_hosts, "X-Token", "token {}", "GH_TOKEN", "t-1", &error);
    assert_non_null(gh);
    g_autoptr(GVariant) list = hostd_test_sink(hostd_secret_list(f->ctx, &error));
    assert_non_null(list);
    assert_no_value(list);
    assert_int_equal(g_variant_n_children(list), 2);
    g_autoptr(GVariant) first = g_variant_get_child_value(list, 0);
    g_autoptr(GVariant) second = g_variant_get_child_value(list, 1);
    g_autofree char *first_name = hostd_test_dict_string(first, "name");
    g_autofree char *second_env = hostd_test_dict_string(second, "env");
    assert_string_equal(first_name, "example-api");
    assert_string_equal(second_env, "GH_TOKEN");

    /* Several headers, as vmctl joins its --header options: stored in one form, the format
     * "{}" (the value where the placeholder stands in each). */
    const char *const ant_hosts[] = {"api.anthropic.com", NULL};
    g_autoptr(GVariant) ant =
        create(f, "anthropic", ant_hosts, "x-api-key,Authorization ", NULL, NULL, "sk-1", &error);
    if (ant == NULL)
        fail_msg("create with two headers: %s", error->message);
    g_autofree char *ant_header = hostd_test_dict_string(ant, "header");
    g_autofree char *ant_format = hostd_test_dict_string(ant, "format");
    assert_string_equal(ant_header, "x-api-key, Authorization");
    assert_string_equal(ant_format, "{}");
    g_autoptr(GVariant) ant_plain =
        create(f, "anthropic2", ant_hosts, "x-api-key, Authorization", "{}", NULL, "sk-2", &error);
    assert_non_null(ant_plain);
}

/* Each bad input is refused with its code, and nothing is stored. */
static void
test_create_refusals(void **state)
{
    HostdTestFixture *f = *state;
    static const char *const good[] = {"api.example.com", NULL};
    static const char *const bad_host[] = {"api.example.com/path", NULL};
    static const char *const no_hosts[] = {NULL};
    static const struct {
        const char *name;
        const char *const *hosts;
        const char *header, *format, *env, *value;
        VmErrorCode code;
    } cases[] = {
        {"Bad_Name", good, NULL, NULL, NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"../x", good, NULL, NULL, NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", bad_host, NULL, NULL, NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", no_hosts, NULL, NULL, NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", good, "Bad Header", NULL, NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", good, "Authorization, x-api-key", "Bearer {}", NULL, VALUE,
         VM_ERROR_INVALID_ARGUMENT},
        {"s", good, "x-api-key, X-Api-Key", NULL, NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", good, NULL, "Bearer", NULL, VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", good, NULL, NULL, "1BAD", VALUE, VM_ERROR_INVALID_ARGUMENT},
        {"s", good, NULL, NULL, NULL, "", VM_ERROR_INVALID_ARGUMENT},
        {"s", good, NULL, NULL, NULL, "two\nlines", VM_ERROR_INVALID_ARGUMENT},
    };
    g_autofree char *dir = hostd_secrets_dir(f->ctx);

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(GVariant) v = create(f, cases[i].name, cases[i].hosts, cases[i].header,
                                       cases[i].format, cases[i].env, cases[i].value, &error);
        assert_null(v);
        hostd_test_assert_error(error, cases[i].code, NULL);
        assert_null(strstr(error->message, "two\nlines"));
        g_auto(GStrv) names = hostd_secrets_store_list(dir, NULL);
        assert_int_equal(g_strv_length(names), 0);
    }

    /* A duplicate keeps the first one's value. */
    create_ok(f, "s");
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) dup = create(f, "s", good, NULL, NULL, NULL, "other", &error);
    assert_null(dup);
    hostd_test_assert_error(error, VM_ERROR_EXISTS, "'s'");
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, "s", NULL);
    assert_string_equal(secret->value, VALUE);
}

/* grant gives the agent a placeholder, list names the agent, info shows name and env; revoke
 * takes it back. Unknown agents and secrets are not-found, a second grant exists. */
static void
test_grant_and_revoke(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    create_ok(f, "example-api");
    g_autoptr(GVariant) grants =
        hostd_test_sink(hostd_secret_grant(f->ctx, "a1", "example-api", &error));
    if (grants == NULL)
        fail_msg("grant: %s", error->message);
    assert_int_equal(g_variant_n_children(grants), 1);
    g_autofree char *placeholder = placeholder_of(f, "a1", "example-api");
    assert_true(hostd_secret_placeholder_is_valid(placeholder));
    g_autofree char *text = grants_text(f, "a1");
    assert_string_equal(text, "example-api=EXAMPLE_API");

    g_autoptr(GVariant) list = hostd_test_sink(hostd_secret_list(f->ctx, &error));
    g_autoptr(GVariant) first = g_variant_get_child_value(list, 0);
    g_autoptr(GVariant) agents = g_variant_lookup_value(first, "agents", G_VARIANT_TYPE("as"));
    g_autofree const char **names = g_variant_get_strv(agents, NULL);
    assert_int_equal(g_strv_length((char **)names), 1);
    assert_string_equal(names[0], "a1");

    g_clear_error(&error);
    assert_null(hostd_secret_grant(f->ctx, "a1", "example-api", &error));
    hostd_test_assert_error(error, VM_ERROR_EXISTS, NULL);
    g_autofree char *same = placeholder_of(f, "a1", "example-api");
    assert_string_equal(same, placeholder);
    g_clear_error(&error);
    assert_null(hostd_secret_grant(f->ctx, "nobody", "example-api", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
    g_clear_error(&error);
    assert_null(hostd_secret_grant(f->ctx, "a1", "missing", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "missing");
    g_clear_error(&error);
    assert_null(hostd_secret_grant(f->ctx, "A1!", "example-api", &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, NULL);
    /* Two secrets under one env var: the guest could see only one. */
    const char *const other_hosts[] = {"other.example.com", NULL};
    g_clear_error(&error);
    g_autoptr(GVariant) same_env =
        create(f, "other", other_hosts, NULL, NULL, "EXAMPLE_API", VALUE, &error);
    assert_non_null(same_env);
    assert_null(hostd_secret_grant(f->ctx, "a1", "other", &error));
    hostd_test_assert_error(error, VM_ERROR_EXISTS, "same env EXAMPLE_API");
    g_autofree char *not_granted = placeholder_of(f, "a1", "other");
    assert_null(not_granted);

    g_clear_error(&error);
    g_autoptr(GVariant) after =
        hostd_test_sink(hostd_secret_revoke(f->ctx, "a1", "example-api", &error));
    assert_non_null(after);
    assert_int_equal(g_variant_n_children(after), 0);
    g_autofree char *gone = placeholder_of(f, "a1", "example-api");
    assert_null(gone);
    assert_null(hostd_secret_revoke(f->ctx, "a1", "example-api", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, NULL);
    g_clear_error(&error);
    assert_null(hostd_secret_revoke(f->ctx, "nobody", "example-api", &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nobody");
}

/* rm of a granted secret is bad-state and keeps everything; --force revokes, then removes. */
static void
test_rm(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(HostdAgentRecord) a2 = hostd_test_agent_new(f, "a2", HOSTD_TEST_STOPPED);
    g_autofree char *dir = hostd_secrets_dir(f->ctx);
    g_autoptr(GError) error = NULL;

    create_ok(f, "s");
    create_ok(f, "free");
    grant_ok(f, "a1", "s");
    grant_ok(f, "a2", "s");
    assert_null(hostd_secret_rm(f->ctx, "s", FALSE, &error));
    hostd_test_assert_error(error, VM_ERROR_BAD_STATE, "a1, a2");
    g_autofree char *kept = placeholder_of(f, "a1", "s");
    assert_non_null(kept);
    g_autoptr(HostdSecret) still = hostd_secrets_store_load(dir, "s", NULL);
    assert_non_null(still);

    g_clear_error(&error);
    g_autoptr(GVariant) revoked = hostd_test_sink(hostd_secret_rm(f->ctx, "s", TRUE, &error));
    if (revoked == NULL)
        fail_msg("rm --force: %s", error->message);
    g_autofree const char **agents = g_variant_get_strv(revoked, NULL);
    assert_int_equal(g_strv_length((char **)agents), 2);
    g_autofree char *gone = placeholder_of(f, "a1", "s");
    assert_null(gone);
    g_autoptr(HostdSecret) removed = hostd_secrets_store_load(dir, "s", &error);
    assert_null(removed);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, NULL);

    g_clear_error(&error);
    g_autoptr(GVariant) none = hostd_test_sink(hostd_secret_rm(f->ctx, "free", FALSE, &error));
    assert_non_null(none);
    assert_int_equal(g_variant_n_children(none), 0);
    assert_null(hostd_secret_rm(f->ctx, "free", FALSE, &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "free");
}

/* set replaces the value and keeps every grant's placeholder; bad values change nothing. */
static void
test_set(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) a1 = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autofree char *dir = hostd_secrets_dir(f->ctx);
    g_autoptr(GError) error = NULL;
    const char *rotated = "sk-rotated";

    create_ok(f, "s");
    grant_ok(f, "a1", "s");
    g_autofree char *before = placeholder_of(f, "a1", "s");
    g_autoptr(GVariant) v = hostd_test_sink(
        hostd_secret_set(f->ctx, "s", (const guint8 *)rotated, strlen(rotated), &error));
    if (v == NULL)
        fail_msg("set: %s", error->message);
    g_autofree char *shown = g_variant_print(v, FALSE);
    assert_null(strstr(shown, rotated));
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, "s", NULL);
    assert_string_equal(secret->value, rotated);
    g_autofree char *after = placeholder_of(f, "a1", "s");
    assert_string_equal(after, before);

    assert_null(hostd_secret_set(f->ctx, "s", (const guint8 *)"", 0, &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, "empty");
    g_clear_error(&error);
    assert_null(hostd_secret_set(f->ctx, "s", (const guint8 *)"a\0b", 3, &error));
    hostd_test_assert_error(error, VM_ERROR_INVALID_ARGUMENT, NULL);
    g_clear_error(&error);
    assert_null(hostd_secret_set(f->ctx, "nope", (const guint8 *)"x", 1, &error));
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "nope");
    g_autoptr(HostdSecret) unchanged = hostd_secrets_store_load(dir, "s", NULL);
    assert_string_equal(unchanged->value, rotated);
}

static GVariant *
new_agent(HostdTestFixture *f, const char *name, char **secrets, GError **error)
{
    HostdNewRequest req = {.name = name, .cpus = 1, .memory_mib = 128, .secrets = secrets};

    return hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, error));
}

/* new --secret grants before the agent is made (once each); an unknown one leaves nothing:
 * no agent, no grants. rm drops the agent's grants. */
static void
test_new_and_rm(void **state)
{
    HostdTestFixture *f = *state;
    g_autofree char *grants_dir = hostd_secrets_grants_dir(f->ctx);
    g_autoptr(GError) error = NULL;

    create_ok(f, "s");
    create_ok(f, "t");
    /* A grant file an earlier a1 left (its removal cut short) is not the new a1's. */
    g_autofree char *stale = hostd_grants_add(grants_dir, "a1", "s", &error);
    assert_non_null(stale);
    char *twice[] = {"t", "s", "t", NULL};
    g_autoptr(GVariant) info = new_agent(f, "a1", twice, &error);
    if (info == NULL)
        fail_msg("new: %s", error->message);
    g_autofree char *text = grants_text(f, "a1");
    assert_string_equal(text, "s=S t=T");
    g_autofree char *fresh = placeholder_of(f, "a1", "s");
    assert_string_not_equal(fresh, stale);

    char *unknown[] = {"s", "missing", NULL};
    g_autoptr(GVariant) none = new_agent(f, "a2", unknown, &error);
    assert_null(none);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "missing");
    g_autofree char *dir = g_build_filename(f->agents_dir, "a2", NULL);
    g_autofree char *grants_file = g_build_filename(grants_dir, "a2", NULL);
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    assert_false(g_file_test(grants_file, G_FILE_TEST_EXISTS));
    assert_string_equal(hostd_test_domain_state(f, "a2"), "missing");

    g_clear_error(&error);
    g_autofree char *a1_file = g_build_filename(grants_dir, "a1", NULL);
    assert_true(g_file_test(a1_file, G_FILE_TEST_EXISTS));
    assert_true(hostd_agent_rm(f->ctx, "a1", TRUE, &error));
    assert_false(g_file_test(a1_file, G_FILE_TEST_EXISTS));
}

/* Sets `secrets: [NAMES]` in the fixture's debian-12 template, in place of any before. */
static void
template_grants(HostdTestFixture *f, const char *names)
{
    g_autofree char *path = g_build_filename(f->templates_dir, "debian-12.yaml", NULL);
    g_autofree char *text = vm_test_read_file(path);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    g_autoptr(GString) out = g_string_new(NULL);

    for (char **line = lines; *line != NULL; line++) {
        if (**line != '\0' && !g_str_has_prefix(*line, "secrets:"))
            g_string_append_printf(out, "%s\n", *line);
    }
    g_string_append_printf(out, "secrets: [%s]\n", names);
    vm_test_write_file(path, out->str);
}

/* The template's secrets: granted at new with --secret's, once each; a template secret hostd
 * does not have fails the new; a fork gets none of them (only --grants gives a fork secrets). */
static void
test_template_secrets(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;

    create_ok(f, "s");
    create_ok(f, "t");
    template_grants(f, "s");
    char *more[] = {"t", "s", NULL};
    g_autoptr(GVariant) info = new_agent(f, "a1", more, &error);
    if (info == NULL)
        fail_msg("new: %s", error->message);
    g_autofree char *text = grants_text(f, "a1");
    assert_string_equal(text, "s=S t=T");

    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "src", HOSTD_TEST_STOPPED);
    HostdForkRequest req = {.name = "b1", .source = "src"};
    g_autoptr(GVariant) b1 = hostd_test_sink(hostd_fork(f->ctx, &req, NULL, NULL, NULL, &error));
    if (b1 == NULL)
        fail_msg("fork: %s", error->message);
    g_autofree char *fork_text = grants_text(f, "b1");
    assert_string_equal(fork_text, "");

    template_grants(f, "gone");
    g_autoptr(GVariant) none = new_agent(f, "a2", NULL, &error);
    assert_null(none);
    hostd_test_assert_error(error, VM_ERROR_NOT_FOUND, "no secret 'gone'");
    g_autofree char *dir = g_build_filename(f->agents_dir, "a2", NULL);
    assert_false(g_file_test(dir, G_FILE_TEST_EXISTS));
    g_autofree char *a2_text = grants_text(f, "a2");
    assert_string_equal(a2_text, "");
}

/* fork --grants: the source's secrets under new placeholders; without it, none. */
static void
test_fork_grants(void **state)
{
    HostdTestFixture *f = *state;
    g_autoptr(HostdAgentRecord) src = hostd_test_agent_new(f, "a1", HOSTD_TEST_STOPPED);
    g_autoptr(GError) error = NULL;

    create_ok(f, "s");
    grant_ok(f, "a1", "s");
    HostdForkRequest with = {.name = "b1", .source = "a1", .grants = TRUE};
    g_autoptr(GVariant) b1 = hostd_test_sink(hostd_fork(f->ctx, &with, NULL, NULL, NULL, &error));
    if (b1 == NULL)
        fail_msg("fork --grants: %s", error->message);
    g_autofree char *source_ph = placeholder_of(f, "a1", "s");
    g_autofree char *fork_ph = placeholder_of(f, "b1", "s");
    assert_non_null(fork_ph);
    assert_true(hostd_secret_placeholder_is_valid(fork_ph));
    assert_string_not_equal(fork_ph, source_ph);

    HostdForkRequest without = {.name = "b2", .source = "a1"};
    g_autoptr(GVariant) b2 =
        hostd_test_sink(hostd_fork(f->ctx, &without, NULL, NULL, NULL, &error));
    if (b2 == NULL)
        fail_msg("fork: %s", error->message);
    g_autofree char *text = grants_text(f, "b2");
    assert_string_equal(text, "");
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_list, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_create_refusals, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_grant_and_revoke, hostd_test_setup,
                                        hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_rm, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_set, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_new_and_rm, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_fork_grants, hostd_test_setup, hostd_test_teardown),
        cmocka_unit_test_setup_teardown(test_template_secrets, hostd_test_setup,
                                        hostd_test_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
