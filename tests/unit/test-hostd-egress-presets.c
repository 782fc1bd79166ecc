/* Egress presets: the built-in ones, a presets directory adding and replacing presets, bad
 * preset files refused with the file named, and the expansion of "@name" rules. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

#include "hostd-config.h"
#include "hostd-egress-presets.h"
#include "vm-error.h"
#include "test-common.h"

typedef struct {
    char *dir; /* a fresh temporary directory per test: hostd.conf and presets.d/ */
    char *presets;
} Fixture;

static int
setup(void **state)
{
    Fixture *f = g_new0(Fixture, 1);

    f->dir = vm_test_make_tmpdir("test-presets-XXXXXX");
    f->presets = g_build_filename(f->dir, "presets.d", NULL);
    assert_int_equal(g_mkdir(f->presets, 0755), 0);
    *state = f;
    return 0;
}

static int
teardown(void **state)
{
    Fixture *f = *state;

    vm_test_remove_tree(f->dir);
    g_free(f->dir);
    g_free(f->presets);
    g_free(f);
    return 0;
}

static void
write_preset(const Fixture *f, const char *file, const char *text)
{
    g_autofree char *path = g_build_filename(f->presets, file, NULL);
    g_autoptr(GError) error = NULL;

    if (!g_file_set_contents(path, text, -1, &error))
        fail_msg("cannot write %s: %s", path, error->message);
}

/* The rules @rules expand to, space-separated, or "ERROR: code: message". */
static char *
expand(const HostdEgressPresets *presets, const char *rules)
{
    g_auto(GStrv) in = g_strsplit(rules, " ", -1);
    g_autoptr(GError) error = NULL;
    g_auto(GStrv) out = hostd_egress_presets_expand(presets, (const char *const *)in, &error);

    if (out == NULL)
        return g_strdup_printf("ERROR: %s: %s", vm_error_code_name(vm_error_code(error)),
                               error->message);
    return g_strjoinv(" ", out);
}

/* The presets as "NAME SOURCE OVERRIDES RULE,RULE..." lines, in the listed order. */
static char *
listing(const HostdEgressPresets *presets)
{
    g_autoptr(GVariant) list = g_variant_ref_sink(hostd_egress_presets_to_variant(presets));
    g_autoptr(GString) out = g_string_new(NULL);

    for (gsize i = 0; i < g_variant_n_children(list); i++) {
        g_autoptr(GVariant) one = g_variant_get_child_value(list, i);
        const char *name = NULL, *source = NULL, *description = NULL;
        gboolean overrides = TRUE;
        g_autofree const char **rules = NULL;
        g_autofree char *joined = NULL;

        assert_true(g_variant_lookup(one, "name", "&s", &name));
        assert_true(g_variant_lookup(one, "source", "&s", &source));
        assert_true(g_variant_lookup(one, "overrides", "b", &overrides));
        assert_true(g_variant_lookup(one, "description", "&s", &description));
        assert_true(g_variant_lookup(one, "rules", "^a&s", &rules));
        joined = g_strjoinv(",", (char **)rules);
        g_string_append_printf(out, "%s %s %s %s\n", name, source, overrides ? "yes" : "no",
                               joined);
    }
    return g_string_free(g_steal_pointer(&out), FALSE);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* The built-in presets are what the documentation promises, and each rule is a valid one. */
static void
test_builtins(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdEgressPresets) presets = hostd_egress_presets_load(NULL, &error);
    g_autofree char *text = NULL;

    assert_non_null(presets);
    text = listing(presets);
    assert_string_equal(
        text, "@anthropic built-in no api.anthropic.com\n"
              "@debian built-in no "
              "deb.debian.org,security.debian.org,ftp.debian.org,*.deb.debian.org\n"
              "@github built-in no github.com,api.github.com,codeload.github.com,"
              "objects.githubusercontent.com,raw.githubusercontent.com,*.githubusercontent.com\n"
              "@npm built-in no registry.npmjs.org\n"
              "@openai built-in no api.openai.com\n"
              "@pypi built-in no pypi.org,files.pythonhosted.org\n");
}

static void
test_expand(void **state)
{
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdEgressPresets) presets = hostd_egress_presets_load(NULL, &error);
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"@pypi", "pypi.org files.pythonhosted.org"},
        {"a.example @npm b.example:8443", "a.example registry.npmjs.org b.example:8443"},
        {"@openai @anthropic", "api.openai.com api.anthropic.com"},
        /* not a preset: left for the policy to judge */
        {"pypi", "pypi"},
        {"@nosuch", "ERROR: not-found: no egress preset '@nosuch' (see: vmctl egress presets)"},
        {"@pypi @", "ERROR: not-found: no egress preset '@' (see: vmctl egress presets)"},
        {"@PyPI", "ERROR: not-found: no egress preset '@PyPI' (see: vmctl egress presets)"},
    };

    assert_non_null(presets);
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *got = expand(presets, cases[i].in);

        if (!g_str_equal(got, cases[i].out))
            fail_msg("'%s': got '%s', want '%s'", cases[i].in, got, cases[i].out);
    }
    /* The check of `new --egress`'s rules, one by one. */
    {
        const char *const good[] = {"@pypi", "a.example:8443", "none", NULL};
        const char *const unknown[] = {"a.example", "@nosuch", NULL};
        const char *const bad[] = {"@npm", "127.1", NULL};

        assert_true(hostd_egress_presets_check(presets, good, &error));
        assert_true(hostd_egress_presets_check(presets, NULL, &error));
        assert_false(hostd_egress_presets_check(presets, unknown, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NOT_FOUND));
        g_clear_error(&error);
        assert_false(hostd_egress_presets_check(presets, bad, &error));
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_non_null(strstr(error->message, "127.1"));
        g_clear_error(&error);
    }
    assert_true(hostd_egress_preset_is_name("@x"));
    assert_false(hostd_egress_preset_is_name("x"));
    assert_false(hostd_egress_preset_is_name(NULL));
}

/* A user file adds a preset, or replaces the built-in of its name; other files are ignored. */
static void
test_user_presets(void **state)
{
    Fixture *f = *state;
    g_autoptr(GError) error = NULL;
    g_autoptr(HostdEgressPresets) presets = NULL;
    g_autofree char *pypi = g_build_filename(f->presets, "pypi.conf", NULL);
    g_autofree char *corp = g_build_filename(f->presets, "corp-mirror.conf", NULL);
    g_autofree char *text = NULL;
    g_autofree char *want = NULL;

    write_preset(f, "pypi.conf",
                 "# our PyPI mirror only\n[preset]\ndescription=the mirror\n"
                 "rules=pypi.mirror.example;files.mirror.example:8443\n");
    write_preset(f, "corp-mirror.conf", "[preset]\nrules= pkg.corp.example ;10.1.0.0/16:3128;\n");
    write_preset(f, "pypi.conf~", "not a key file");
    write_preset(f, "README", "not a key file either");
    presets = hostd_egress_presets_load(f->presets, &error);
    if (presets == NULL)
        fail_msg("load: %s", error->message);

    text = listing(presets);
    want = g_strdup_printf("@anthropic built-in no api.anthropic.com\n"
                           "@corp-mirror %s no pkg.corp.example,10.1.0.0/16:3128\n"
                           "@debian built-in no "
                           "deb.debian.org,security.debian.org,ftp.debian.org,*.deb.debian.org\n"
                           "@github built-in no github.com,api.github.com,codeload.github.com,"
                           "objects.githubusercontent.com,raw.githubusercontent.com,"
                           "*.githubusercontent.com\n"
                           "@npm built-in no registry.npmjs.org\n"
                           "@openai built-in no api.openai.com\n"
                           "@pypi %s yes pypi.mirror.example,files.mirror.example:8443\n",
                           corp, pypi);
    assert_string_equal(text, want);
    g_free(text);
    text = expand(presets, "@pypi @corp-mirror");
    assert_string_equal(text, "pypi.mirror.example files.mirror.example:8443 pkg.corp.example "
                              "10.1.0.0/16:3128");

    /* A directory that does not exist holds no presets: the built-ins stay. */
    g_autofree char *missing = g_build_filename(f->dir, "nosuch", NULL);
    g_autoptr(HostdEgressPresets) builtins = hostd_egress_presets_load(missing, &error);
    assert_non_null(builtins);
    g_free(text);
    text = expand(builtins, "@pypi");
    assert_string_equal(text, "pypi.org files.pythonhosted.org");
}

/* One bad file fails the whole load, naming the file and what is wrong. */
static void
test_bad_files(void **state)
{
    Fixture *f = *state;
    static const struct {
        const char *file, *text, *why;
    } bad[] = {
        {"x.conf", "rules=a.example\n", "Key file does not start with a group"},
        {"x.conf", "[preset]\n", "rules: a list of one rule or more"},
        {"x.conf", "[preset]\nrules=\n", "rules: a list of one rule or more"},
        {"x.conf", "[preset]\nrule=a.example\n", "unknown key 'rule'"},
        {"x.conf", "[preset]\nrules=a.example\n[other]\n", "unknown group [other]"},
        {"x.conf", "[presets]\nrules=a.example\n", "unknown group [presets]"},
        {"x.conf", "[preset]\nrules=a.example;127.1\n", "127.1"},
        {"x.conf", "[preset]\nrules=a.example;http://b.example\n", "http://b.example"},
        {"x.conf", "[preset]\nrules=any\n", NULL},
        {"x.conf", "[preset]\nrules=@pypi\n", "rule '@pypi': a preset cannot name another preset"},
        {"x.conf", "[preset]\nrules=a.example\ndescription=a\\tb\n",
         "description: a control character"},
        {"Bad.conf", "[preset]\nrules=a.example\n", "'Bad' is not a preset name"},
        {"-x.conf", "[preset]\nrules=a.example\n", "'-x' is not a preset name"},
        {".conf", "[preset]\nrules=a.example\n", "'' is not a preset name"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autofree char *path = g_build_filename(f->presets, bad[i].file, NULL);
        g_autoptr(GError) error = NULL;
        g_autoptr(HostdEgressPresets) presets = NULL;

        write_preset(f, "good.conf", "[preset]\nrules=good.example\n");
        write_preset(f, bad[i].file, bad[i].text);
        presets = hostd_egress_presets_load(f->presets, &error);
        g_unlink(path);
        if (bad[i].why == NULL) {
            /* "any" is a rule like another: a preset may open everything */
            assert_non_null(presets);
            continue;
        }
        if (presets != NULL)
            fail_msg("case %zu (%s) was loaded", i, bad[i].text);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        if (!g_str_has_prefix(error->message, path) || strstr(error->message, bad[i].why) == NULL)
            fail_msg("case %zu: the error does not name %s and '%s': %s", i, path, bad[i].why,
                     error->message);
    }

    /* Too large, and not a regular file. */
    {
        g_autofree char *big = g_strnfill(HOSTD_EGRESS_PRESET_FILE_MAX + 1, '#');
        g_autoptr(GError) error = NULL;
        g_autoptr(HostdEgressPresets) presets = NULL;
        g_autofree char *path = g_build_filename(f->presets, "big.conf", NULL);

        write_preset(f, "big.conf", big);
        presets = hostd_egress_presets_load(f->presets, &error);
        g_unlink(path);
        assert_null(presets);
        assert_non_null(strstr(error->message, "big.conf: larger than 64 KiB"));
    }
    {
        g_autofree char *path = g_build_filename(f->presets, "dir.conf", NULL);
        g_autoptr(GError) error = NULL;
        g_autoptr(HostdEgressPresets) presets = NULL;

        assert_int_equal(g_mkdir(path, 0755), 0);
        presets = hostd_egress_presets_load(f->presets, &error);
        g_rmdir(path);
        assert_null(presets);
        assert_non_null(strstr(error->message, "dir.conf: not a regular file"));
    }
}

/* hostd's configuration loads the presets beside its file (presets.d) or from
 * egress-presets-dir, and a bad preset file keeps hostd from starting, the file named. */
static void
test_config(void **state)
{
    Fixture *f = *state;
    g_autofree char *conf = g_build_filename(f->dir, "hostd.conf", NULL);
    g_autofree char *state_dir = g_build_filename(f->dir, "state", NULL);
    g_autofree char *other = g_build_filename(f->dir, "other", NULL);
    g_autofree char *text = NULL;
    g_autoptr(GError) error = NULL;

    write_preset(f, "internal.conf", "[preset]\nrules=pkg.internal.example\n");
    assert_true(g_file_set_contents(conf, "[hostd]\n", -1, NULL));
    {
        g_autoptr(HostdConfig) config = hostd_config_load(conf, state_dir, NULL, NULL, &error);

        assert_non_null(config);
        assert_string_equal(config->egress_presets_dir, f->presets);
        text = expand(config->egress_presets, "@internal @npm");
        assert_string_equal(text, "pkg.internal.example registry.npmjs.org");
    }
    /* Without a file: the built-ins only. */
    {
        g_autoptr(HostdConfig) config = hostd_config_load(NULL, state_dir, NULL, NULL, &error);

        assert_non_null(config);
        assert_null(config->egress_presets_dir);
        g_free(text);
        text = expand(config->egress_presets, "@internal");
        assert_true(g_str_has_prefix(text, "ERROR: not-found"));
    }
    /* egress-presets-dir names another directory. */
    assert_int_equal(g_mkdir(other, 0755), 0);
    g_autofree char *keyed = g_strdup_printf("[hostd]\negress-presets-dir=%s\n", other);
    assert_true(g_file_set_contents(conf, keyed, -1, NULL));
    {
        g_autoptr(HostdConfig) config = hostd_config_load(conf, state_dir, NULL, NULL, &error);

        assert_non_null(config);
        g_free(text);
        text = expand(config->egress_presets, "@internal");
        assert_true(g_str_has_prefix(text, "ERROR: not-found"));
    }
    /* A bad file: no configuration, the file named. */
    assert_true(g_file_set_contents(conf, "[hostd]\n", -1, NULL));
    write_preset(f, "broken.conf", "[preset]\nrules=not a rule\n");
    {
        g_autoptr(HostdConfig) config = hostd_config_load(conf, state_dir, NULL, NULL, &error);
        g_autofree char *broken = g_build_filename(f->presets, "broken.conf", NULL);

        assert_null(config);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_INVALID_ARGUMENT));
        assert_true(g_str_has_prefix(error->message, broken));
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_builtins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expand, setup, teardown),
        cmocka_unit_test_setup_teardown(test_user_presets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
