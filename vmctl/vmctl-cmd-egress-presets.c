#include "vmctl.h"

#include <stdio.h>
#include <string.h>

/* NAME, SOURCE and RULES, one preset a line, RULES comma-separated. */
static char *
format_presets(GVariant *presets)
{
    g_autoptr(GString) out = g_string_new(NULL);
    gsize n = g_variant_n_children(presets);
    int name_width = 4, source_width = 6;

    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            g_string_append_printf(out, "%-*s  %-*s  %s\n", name_width, "NAME", source_width,
                                   "SOURCE", "RULES");
        for (gsize i = 0; i < n; i++) {
            g_autoptr(GVariant) preset = g_variant_get_child_value(presets, i);
            const char *name = "-", *source = "-";
            gboolean overrides = FALSE;
            g_autofree const char **rules = NULL;
            g_autofree char *source_text = NULL;
            g_autofree char *rules_text = NULL;

            g_variant_lookup(preset, "name", "&s", &name);
            g_variant_lookup(preset, "source", "&s", &source);
            g_variant_lookup(preset, "overrides", "b", &overrides);
            g_variant_lookup(preset, "rules", "^a&s", &rules);
            source_text = g_strdup_printf("%s%s", source, overrides ? " (over the built-in)" : "");
            if (pass == 0) {
                name_width = MAX(name_width, (int)g_utf8_strlen(name, -1));
                source_width = MAX(source_width, (int)g_utf8_strlen(source_text, -1));
                continue;
            }
            rules_text = rules != NULL ? g_strjoinv(", ", (char **)rules) : g_strdup("-");
            g_string_append_printf(out, "%-*s  %-*s  %s\n", name_width, name, source_width,
                                   source_text, rules_text);
        }
    }
    return g_string_free(g_steal_pointer(&out), FALSE);
}

/* Whether @arg is an option that only `vmctl egress NAME` takes. */
static gboolean
is_policy_option(const char *arg)
{
    static const char *const options[] = {"--allow", "--deny", "--remove", "--reset", NULL};

    for (const char *const *it = options; *it != NULL; it++) {
        gsize len = strlen(*it);

        if (strncmp(arg, *it, len) == 0 && (arg[len] == '\0' || arg[len] == '='))
            return TRUE;
    }
    return FALSE;
}

gboolean
vmctl_cmd_egress_presets(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_auto(GStrv) args = NULL;
    g_autoptr(VmMessage) result = NULL;

    /* An agent may be named "presets": a change of its policy is `vmctl egress presets --allow
     * RULE`, which lists nothing. */
    for (int i = 1; i < argc; i++) {
        if (is_policy_option(argv[i])) {
            g_autoptr(GStrvBuilder) builder = g_strv_builder_new();
            g_strv_builder_add(builder, "egress");
            g_strv_builder_addv(builder, (const char **)argv);
            g_auto(GStrv) agent_argv = g_strv_builder_end(builder);
            return vmctl_cmd_egress(ctx, argc + 1, agent_argv, error);
        }
    }
    if (!vmctl_parse(ctx, argc, argv, NULL, 0, 0, &args, error))
        return FALSE;
    if (!vmctl_request(ctx, VM_OP_EGRESS_PRESETS, NULL, &result, error))
        return FALSE;
    g_autoptr(GVariant) presets = vmctl_result_get(result, "presets", G_VARIANT_TYPE("aa{sv}"));
    if (ctx->json || presets == NULL) {
        vmctl_print_result(ctx, result, "presets", NULL);
        return TRUE;
    }
    g_autofree char *text = format_presets(presets);
    fputs(text, stdout);
    return TRUE;
}
