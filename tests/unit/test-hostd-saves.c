/* A full disk or an I/O error at each write of hostd's state saves: the agent record (policies,
 * `new`, `start`, `stop`), the egress policy, forwards.ini, the users' authorized_keys record,
 * the secret store and the grants (grant, revoke). Each change is made with ENOSPC, then EIO, at
 * its first write, its second, ... until it makes no more writes; after each, what hostd loads from
 * disk is the old state or the new one, never a part (the change may only fail with the error and
 * leave the old one, or work because a write was retried), the agent still loads, and no
 * temporary file is left. Writes go through vm_file_write_atomic(), whose test seam
 * vm_file_write_fault() makes them fail halfway, as a disk filling up would. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "hostd-checkpoint.h"
#include "hostd-egress.h"
#include "hostd-forward.h"
#include "hostd-keys.h"
#include "hostd-secrets-grants.h"
#include "hostd-secrets-store.h"
#include "hostd-secrets.h"
#include "test-common.h"
#include "test-hostd-fixture.h"
#include "vm-util.h"

typedef struct {
    const char *what;
    /* Brings the state to the old one, with no fault. */
    void (*reset)(HostdTestFixture *f);
    /* Makes the change to the new state. */
    gboolean (*change)(HostdTestFixture *f, GError **error);
    /* What hostd loads from disk now, as text; fails the test when it cannot load it. */
    char *(*state)(HostdTestFixture *f);
} SaveCase;

static void
ok_or_fail(gboolean ok, const char *what, GError *error)
{
    if (!ok)
        fail_msg("%s: %s", what, error != NULL ? error->message : "failed");
}

/* The text of agent a1's file @file, "" when there is none. */
static char *
agent_text(HostdTestFixture *f, const char *file)
{
    g_autofree char *path = hostd_test_agent_file(f, "a1", file);
    char *text = NULL;

    if (!g_file_get_contents(path, &text, NULL, NULL))
        return g_strdup("");
    return text;
}

/* Fails unless agent a1 loads as hostd loads it for any request. */
static void
assert_agent_loads(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(f->ctx, "a1", &error);

    ok_or_fail(r != NULL, "a1 does not load", error);
}

/* ---- the agent record --------------------------------------------------------------------- */

static void
policy_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", TRUE, 0, 0, 0, 0, &error));
    ok_or_fail(v != NULL, "checkpoints never", error);
}

static gboolean
policy_change(HostdTestFixture *f, GError **error)
{
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_set_checkpoints(f->ctx, "a1", FALSE, 600, 3, 2, 1, error));
    return v != NULL;
}

static char *
record_state(HostdTestFixture *f)
{
    assert_agent_loads(f);
    return agent_text(f, HOSTD_AGENT_RECORD);
}

/* `new` of b1: a half-made agent is rolled back, so the old state is no b1 at all. */
static void
new_reset(HostdTestFixture *f)
{
    g_autofree char *dir = hostd_test_agent_file(f, "b1", "");

    if (g_file_test(dir, G_FILE_TEST_EXISTS)) {
        g_autoptr(GError) error = NULL;
        ok_or_fail(hostd_agent_rm(f->ctx, "b1", TRUE, &error), "rm b1", error);
    }
}

static gboolean
new_change(HostdTestFixture *f, GError **error)
{
    HostdNewRequest req = {.name = "b1", .cpus = 1, .memory_mib = 128};
    g_autoptr(GVariant) v = hostd_test_sink(hostd_agent_new(f->ctx, &req, NULL, NULL, error));
    return v != NULL;
}

static char *
new_state(HostdTestFixture *f)
{
    g_autofree char *dir = hostd_test_agent_file(f, "b1", "");
    const char *domain = hostd_test_domain_state(f, "b1");

    assert_agent_loads(f);
    if (!g_file_test(dir, G_FILE_TEST_EXISTS))
        return g_strdup_printf("no b1, domain %s", domain);
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdAgentRecord) r = hostd_agent_load(f->ctx, "b1", &error);
    ok_or_fail(r != NULL, "b1 does not load", error);
    return g_strdup_printf("b1 %s %s, domain %s", r->phase, r->wanted, domain);
}

/* ---- egress policy, forwards, keys -------------------------------------------------------- */

static gboolean
egress_set(HostdTestFixture *f, const char *host, GError **error)
{
    const char *const allow[] = {host, NULL};
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_egress_set(f->ctx, "a1", allow, NULL, NULL, TRUE, error));
    return v != NULL;
}

static void
egress_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    ok_or_fail(egress_set(f, "old.example.com", &error), "egress set", error);
}

static gboolean
egress_change(HostdTestFixture *f, GError **error)
{
    return egress_set(f, "new.example.com", error);
}

/* The policy file, and the policy the proxy enforces: the two must agree. */
static char *
egress_state(HostdTestFixture *f)
{
    g_autofree char *file = agent_text(f, "egress.ini");
    g_autofree char *live = hostd_test_egress_text(f, "a1");
    gboolean old = strstr(file, "old.example.com") != NULL;
    gboolean new = strstr(file, "new.example.com") != NULL;

    assert_agent_loads(f);
    if (old == new)
        fail_msg("egress.ini holds neither policy alone:\n%s", file);
    if (strstr(live, old ? "old.example.com" : "new.example.com") == NULL)
        fail_msg("the proxy enforces '%s', the file says:\n%s", live, file);
    return g_strdup(file);
}

static void
forward_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *text = agent_text(f, "forwards.ini");

    if (strstr(text, "8080") != NULL)
        ok_or_fail(hostd_forward_remove(f->ctx, "a1", 8080, &error), "forward rm", error);
}

static gboolean
forward_change(HostdTestFixture *f, GError **error)
{
    g_autoptr(GVariant) v = hostd_test_sink(hostd_forward_add(f->ctx, "a1", 8080, 0, 1000, error));
    return v != NULL;
}

/* The forwards hostd lists for a1 (from its record), as guest ports. */
static char *
forward_state(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) list = hostd_test_sink(hostd_forward_list(f->ctx, "a1", &error));
    g_autoptr(GString) text = g_string_new(NULL);
    GVariantIter iter;
    GVariant *entry;

    assert_agent_loads(f);
    ok_or_fail(list != NULL, "forward list", error);
    g_variant_iter_init(&iter, list);
    while ((entry = g_variant_iter_next_value(&iter)) != NULL) {
        guint32 port = 0;
        g_variant_lookup(entry, "guest_port", "u", &port);
        g_string_append_printf(text, "%u ", port);
        g_variant_unref(entry);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* Two users' keys, made once per test. */
static char *user_keys[2];

static gboolean
keys_save(HostdTestFixture *f, guint n, GError **error)
{
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_USER_KEYS);
    const char *lines[3] = {user_keys[0], n > 1 ? user_keys[1] : NULL, NULL};
    g_autoptr(GPtrArray) keys = hostd_user_keys_check(lines, error);

    return keys != NULL && hostd_user_keys_save(path, keys, error);
}

static void
keys_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    ok_or_fail(keys_save(f, 1, &error), "keys", error);
}

static gboolean
keys_change(HostdTestFixture *f, GError **error)
{
    return keys_save(f, 2, error);
}

static char *
keys_state(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *path = hostd_test_agent_file(f, "a1", HOSTD_AGENT_USER_KEYS);
    g_autoptr(GPtrArray) keys = hostd_user_keys_load(path, &error);

    assert_agent_loads(f);
    ok_or_fail(keys != NULL, "the key record does not load", error);
    return g_strdup_printf("%u keys", keys->len);
}

/* ---- secrets ------------------------------------------------------------------------------ */

#define SECRET "api-token"

static gboolean
secret_set(HostdTestFixture *f, const char *value, GError **error)
{
    g_autoptr(GVariant) v = hostd_test_sink(
        hostd_secret_set(f->ctx, SECRET, (const guint8 *)value, strlen(value), error));
    return v != NULL;
}

static void
secret_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    ok_or_fail(secret_set(f, "old-value-1", &error), "secret set", error);
}

static gboolean
secret_change(HostdTestFixture *f, GError **error)
{
    return secret_set(f, "new-value-2", error);
}

static char *
secret_state(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autofree char *dir = hostd_secrets_dir(f->ctx);
    g_autoptr(HostdSecret) secret = hostd_secrets_store_load(dir, SECRET, &error);

    ok_or_fail(secret != NULL, "the secret does not load", error);
    return g_strdup(secret->value);
}

/* ---- start and stop ----------------------------------------------------------------------- */

static void
agent_stop(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, &error));
    ok_or_fail(v != NULL, "stop", error);
}

static void
agent_start(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, &error));
    ok_or_fail(v != NULL, "start", error);
}

static gboolean
start_change(HostdTestFixture *f, GError **error)
{
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_start(f->ctx, "a1", FALSE, NULL, NULL, error));
    return v != NULL;
}

static gboolean
stop_change(HostdTestFixture *f, GError **error)
{
    g_autoptr(GVariant) v =
        hostd_test_sink(hostd_agent_stop(f->ctx, "a1", TRUE, 0, NULL, NULL, error));
    return v != NULL;
}

/* What hostd's record says the user wants, and what the VM is: the two must go together (a VM
 * running that the record says stopped is neither the old state nor the new one). */
static char *
power_state(HostdTestFixture *f)
{
    g_autoptr(HostdAgentRecord) r = NULL;
    g_autoptr(GError) error = NULL;

    r = hostd_agent_load(f->ctx, "a1", &error);
    ok_or_fail(r != NULL, "a1 does not load", error);
    return g_strdup_printf("wanted %s, domain %s", r->wanted, hostd_test_domain_state(f, "a1"));
}

/* ---- grants ------------------------------------------------------------------------------- */

#define SECRET_2 "other-token"

/* Grants are put into effect in a running guest over SSH, which the test driver has not: the
 * grants are made on a stopped agent (its proxy is still given them). */
static void
grant_stopped(HostdTestFixture *f)
{
    if (!g_str_equal(hostd_test_domain_state(f, "a1"), "stopped"))
        agent_stop(f);
}

static gboolean
grant_holds(HostdTestFixture *f, const char *secret)
{
    g_autofree char *grants_dir = hostd_secrets_grants_dir(f->ctx);
    g_autoptr(GError) error = NULL;
    g_autoptr(GHashTable) grants = hostd_grants_load(grants_dir, "a1", &error);

    ok_or_fail(grants != NULL, "the grants do not load", error);
    return g_hash_table_contains(grants, secret);
}

static gboolean
grant_one(HostdTestFixture *f, const char *secret, GError **error)
{
    g_autoptr(GVariant) v = hostd_test_sink(hostd_secret_grant(f->ctx, "a1", secret, error));
    return v != NULL;
}

static gboolean
revoke_one(HostdTestFixture *f, const char *secret, GError **error)
{
    g_autoptr(GVariant) v = hostd_test_sink(hostd_secret_revoke(f->ctx, "a1", secret, error));
    return v != NULL;
}

/* Old: a1 holds SECRET_2 alone. */
static void
grant_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;

    grant_stopped(f);
    if (!grant_holds(f, SECRET_2))
        ok_or_fail(grant_one(f, SECRET_2, &error), "grant " SECRET_2, error);
    if (grant_holds(f, SECRET))
        ok_or_fail(revoke_one(f, SECRET, &error), "revoke " SECRET, error);
}

static gboolean
grant_change(HostdTestFixture *f, GError **error)
{
    return grant_one(f, SECRET, error);
}

/* Old: a1 holds both; revoking one of two rewrites the grants file (the last one removes it). */
static void
revoke_reset(HostdTestFixture *f)
{
    g_autoptr(GError) error = NULL;

    grant_stopped(f);
    if (!grant_holds(f, SECRET_2))
        ok_or_fail(grant_one(f, SECRET_2, &error), "grant " SECRET_2, error);
    if (!grant_holds(f, SECRET))
        ok_or_fail(grant_one(f, SECRET, &error), "grant " SECRET, error);
}

static gboolean
revoke_change(HostdTestFixture *f, GError **error)
{
    return revoke_one(f, SECRET, error);
}

/* The grants on disk, and what a1's proxy honours: each secret's host is opened on 443 while
 * it is granted. The two must agree. */
static char *
grant_state(HostdTestFixture *f)
{
    const char *secrets[] = {SECRET, SECRET_2};
    const char *hosts[] = {"api.example.com", "other.example.com"};
    g_autoptr(GString) text = g_string_new(NULL);

    assert_agent_loads(f);
    for (guint i = 0; i < G_N_ELEMENTS(secrets); i++) {
        gboolean held = grant_holds(f, secrets[i]);
        gboolean open = hostd_test_egress_allows(f->ctx, "a1", hosts[i], 443);

        if (held != open)
            fail_msg("%s is %sgranted, but its host is %sopen", secrets[i], held ? "" : "not ",
                     open ? "" : "not ");
        g_string_append_printf(text, "%s %s; ", secrets[i], held ? "granted" : "not granted");
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* ---- the runner --------------------------------------------------------------------------- */

/* No temporary file of an atomic write anywhere under the state directory. */
static void
assert_no_temp_files(const char *dir)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *entry;

    if (d == NULL)
        return;
    while ((entry = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(dir, entry, NULL);
        const char *dot = strrchr(entry, '.');

        if (g_file_test(path, G_FILE_TEST_IS_DIR) && !g_file_test(path, G_FILE_TEST_IS_SYMLINK)) {
            assert_no_temp_files(path);
            continue;
        }
        /* vm_file_write_atomic()'s temporary files are NAME.XXXXXX. */
        if (dot != NULL && strlen(dot) == 7 && !g_str_equal(dot, ".socket"))
            fail_msg("a temporary file is left: %s", path);
    }
}

static void
run_case(HostdTestFixture *f, const SaveCase *c)
{
    static const int errors[] = {ENOSPC, EIO};
    g_autoptr(GError) error = NULL;

    c->reset(f);
    g_autofree char *old_state = c->state(f);
    ok_or_fail(c->change(f, &error), c->what, error);
    g_autofree char *new_state = c->state(f);
    if (g_str_equal(old_state, new_state))
        fail_msg("%s: the change changes nothing ('%s')", c->what, new_state);

    for (gsize e = 0; e < G_N_ELEMENTS(errors); e++) {
        guint n;
        for (n = 1;; n++) {
            g_autoptr(GError) fault_error = NULL;

            c->reset(f);
            g_autofree char *before = c->state(f);
            assert_string_equal(before, old_state);
            vm_file_write_fault(n, 1, errors[e]);
            gboolean ok = c->change(f, &fault_error);
            gboolean reached = vm_file_write_calls() >= n;
            vm_file_write_fault(0, 0, 0);
            g_autofree char *after = c->state(f);
            assert_no_temp_files(f->ctx->config->state_dir);

            if (!reached) {
                ok_or_fail(ok, c->what, fault_error);
                assert_string_equal(after, new_state);
                break;
            }
            if (ok) {
                assert_string_equal(after, new_state);
            } else {
                if (strstr(fault_error->message, g_strerror(errors[e])) == NULL)
                    fail_msg("%s with %s at write %u failed otherwise: %s", c->what,
                             g_strerror(errors[e]), n, fault_error->message);
                if (!g_str_equal(after, old_state) && !g_str_equal(after, new_state))
                    fail_msg("%s with %s at write %u: '%s', neither the old '%s' nor the new "
                             "'%s'",
                             c->what, g_strerror(errors[e]), n, after, old_state, new_state);
            }
            if (n > 40)
                fail_msg("%s: still writing after %u writes", c->what, n);
        }
        /* Every change here writes something. */
        assert_true(n > 1);
    }
}

static int
setup(void **state)
{
    int rc = hostd_test_setup(state);
    HostdTestFixture *f = *state;
    g_autoptr(GError) error = NULL;
    const char *const hosts[] = {"api.example.com", NULL};
    const char *value = "old-value-1";
    HostdSecretRequest req = {
        .name = SECRET,
        .hosts = hosts,
        .value = (const guint8 *)value,
        .value_len = strlen(value),
    };

    g_autoptr(HostdAgentRecord) r = hostd_test_agent_new(f, "a1", HOSTD_TEST_RUNNING);
    const char *const allow[] = {"old.example.com", NULL};
    ok_or_fail(hostd_egress_agent_init(f->ctx, r, allow, NULL, &error), "egress", error);
    g_autoptr(GVariant) v = hostd_test_sink(hostd_secret_create(f->ctx, &req, &error));
    ok_or_fail(v != NULL, "secret create", error);
    const char *const hosts_2[] = {"other.example.com", NULL};
    HostdSecretRequest req_2 = {
        .name = SECRET_2,
        .hosts = hosts_2,
        .value = (const guint8 *)value,
        .value_len = strlen(value),
    };
    g_autoptr(GVariant) v_2 = hostd_test_sink(hostd_secret_create(f->ctx, &req_2, &error));
    ok_or_fail(v_2 != NULL, "secret create", error);
    for (guint i = 0; i < G_N_ELEMENTS(user_keys); i++) {
        g_autofree char *comment = g_strdup_printf("user%u@example", i);
        g_autoptr(HostdKeyPair) pair = hostd_keypair_generate(comment, &error);
        ok_or_fail(pair != NULL, "keypair", error);
        g_free(user_keys[i]);
        user_keys[i] = g_strdup(pair->public_line);
    }
    return rc;
}

static int
teardown(void **state)
{
    for (guint i = 0; i < G_N_ELEMENTS(user_keys); i++)
        g_clear_pointer(&user_keys[i], g_free);
    return hostd_test_teardown(state);
}

#define CASE(name, reset, change, state)                                                           \
    static void test_##name(void **s)                                                              \
    {                                                                                              \
        static const SaveCase c = {#name, reset, change, state};                                   \
        run_case(*s, &c);                                                                          \
    }

CASE(record, policy_reset, policy_change, record_state)
CASE(new, new_reset, new_change, new_state)
CASE(egress_policy, egress_reset, egress_change, egress_state)
CASE(forwards, forward_reset, forward_change, forward_state)
CASE(authorized_keys, keys_reset, keys_change, keys_state)
CASE(secret_store, secret_reset, secret_change, secret_state)
CASE(start, agent_stop, start_change, power_state)
CASE(stop, agent_start, stop_change, power_state)
CASE(grant, grant_reset, grant_change, grant_state)
CASE(revoke, revoke_reset, revoke_change, grant_state)

int
main(void)
{
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(test_##name, setup, teardown)
        T(record),       T(new),   T(egress_policy), T(forwards), T(authorized_keys),
        T(secret_store), T(start), T(stop),          T(grant),    T(revoke),
#undef T
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
