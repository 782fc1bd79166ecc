/* docs/PROTOCOL.md against the schema table in common/vm-protocol.c: every op has a section
 * "### NUMBER `name`" with its number and name, every field the schema gives the op is a row of
 * the section's Field table with the right type, required flag and limits (and no row names a
 * field the op lacks), and every request says how its reply ends. Broken copies of the page
 * check that the checker itself notices a missing op, field or limit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test-common.h"
#include "vm-protocol-private.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *key;
    char *type;
    char *required;
    char *limits;
} DocRow;

typedef enum {
    TABLE_NONE,
    TABLE_FIELDS, /* the op's Field table */
    TABLE_OTHER,  /* another table, such as its result fields */
} TableKind;

typedef struct {
    guint number;
    char *name;
    GString *text;   /* the section's lines, for the prose checks */
    GPtrArray *rows; /* DocRow of the Field table */
    guint n_tables;
} DocSection;

static void
doc_row_free(DocRow *row)
{
    g_free(row->key);
    g_free(row->type);
    g_free(row->required);
    g_free(row->limits);
    g_free(row);
}

static void
doc_section_free(DocSection *section)
{
    g_free(section->name);
    g_string_free(section->text, TRUE);
    g_ptr_array_unref(section->rows);
    g_free(section);
}

/* The cells of a Markdown table row, trimmed, without the outer pipes. */
static char **
table_cells(const char *line)
{
    g_autofree char *inner = g_strdup(line);
    char *start = g_strstrip(inner);
    gsize len = strlen(start);
    char **cells;

    if (len > 0 && start[len - 1] == '|')
        start[--len] = '\0';
    if (start[0] == '|')
        start++;
    cells = g_strsplit(start, "|", -1);
    for (char **c = cells; *c != NULL; c++)
        g_strstrip(*c);
    return cells;
}

/* "`text`" without its backticks, or NULL when @cell is not one code span. */
static char *
code_span(const char *cell)
{
    gsize len = strlen(cell);

    if (len < 3 || cell[0] != '`' || cell[len - 1] != '`' || memchr(cell + 1, '`', len - 2))
        return NULL;
    return g_strndup(cell + 1, len - 2);
}

/* Splits the page into op sections: from a heading "### NUMBER `name`" to the next heading. */
static GPtrArray *
doc_parse(const char *text, GPtrArray *problems)
{
    g_autoptr(GRegex) heading = g_regex_new("^### ([0-9]+) `([a-z-]+)`$", 0, 0, NULL);
    GPtrArray *sections = g_ptr_array_new_with_free_func((GDestroyNotify)doc_section_free);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    DocSection *current = NULL;
    TableKind table = TABLE_NONE;

    for (guint i = 0; lines[i] != NULL; i++) {
        const char *line = lines[i];
        g_autoptr(GMatchInfo) match = NULL;

        if (g_str_has_prefix(line, "## ") || g_str_has_prefix(line, "### ")) {
            current = NULL;
            table = TABLE_NONE;
            if (g_regex_match(heading, line, 0, &match)) {
                g_autofree char *number = g_match_info_fetch(match, 1);

                current = g_new0(DocSection, 1);
                current->number = (guint)strtoul(number, NULL, 10);
                current->name = g_match_info_fetch(match, 2);
                current->text = g_string_new(NULL);
                current->rows = g_ptr_array_new_with_free_func((GDestroyNotify)doc_row_free);
                g_ptr_array_add(sections, current);
            } else if (g_ascii_isdigit(line[4]) || line[4] == '`') {
                g_ptr_array_add(problems, g_strdup_printf("malformed op heading '%s'", line));
            }
            continue;
        }
        if (current == NULL)
            continue;
        g_string_append_printf(current->text, "%s\n", line);

        if (line[0] != '|') {
            table = TABLE_NONE;
            continue;
        }
        g_auto(GStrv) cells = table_cells(line);
        if (table == TABLE_NONE) {
            /* A table starts: only the one whose first column is "Field" lists the fields. */
            table = g_strcmp0(cells[0], "Field") == 0 ? TABLE_FIELDS : TABLE_OTHER;
            if (table == TABLE_FIELDS) {
                current->n_tables++;
                i++; /* the |---| line under the header */
            }
            continue;
        }
        if (table != TABLE_FIELDS || current->n_tables != 1)
            continue;
        if (g_strv_length(cells) < 4) {
            g_ptr_array_add(problems, g_strdup_printf("%s: short row '%s'", current->name, line));
            continue;
        }
        DocRow *row = g_new0(DocRow, 1);
        row->key = code_span(cells[0]);
        row->type = code_span(cells[1]);
        row->required = g_strdup(cells[2]);
        row->limits = g_strdup(cells[3]);
        if (row->key == NULL || row->type == NULL) {
            g_ptr_array_add(problems, g_strdup_printf("%s: row '%s' does not start with `key` "
                                                      "| `type`",
                                                      current->name, line));
            doc_row_free(row);
            continue;
        }
        g_ptr_array_add(current->rows, row);
    }
    return sections;
}

/* Whether @number appears in @text as a whole number. */
static gboolean
has_number(const char *text, guint64 number)
{
    for (const char *p = text; *p != '\0'; p++) {
        if (g_ascii_isdigit(*p) && (p == text || !g_ascii_isdigit(p[-1])) &&
            g_ascii_strtoull(p, NULL, 10) == number)
            return TRUE;
    }
    return FALSE;
}

/* @text with every run of white space (line breaks included) made one space. */
static char *
normalise_space(const char *text)
{
    g_autoptr(GRegex) space = g_regex_new("\\s+", 0, 0, NULL);

    return g_regex_replace_literal(space, text, -1, 0, " ", 0, NULL);
}

static void
check_field(const VmOpSpec *spec, const VmFieldSpec *field, const DocRow *row, GPtrArray *problems)
{
    const char *required = (field->flags & VM_FIELD_REQUIRED) ? "yes" : "no";
    gboolean bounded = field->min != 0 || field->max != 0 ||
                       (field->flags & (VM_FIELD_UNIT_INTERVAL | VM_FIELD_ENV));

    if (strcmp(row->type, field->type) != 0)
        g_ptr_array_add(problems, g_strdup_printf("%s.%s: type `%s` in the doc, `%s` in the schema",
                                                  spec->name, field->key, row->type, field->type));
    if (strcmp(row->required, required) != 0)
        g_ptr_array_add(problems, g_strdup_printf("%s.%s: Required is '%s', the schema says '%s'",
                                                  spec->name, field->key, row->required, required));
    if (field->min != 0 && !has_number(row->limits, field->min))
        g_ptr_array_add(problems,
                        g_strdup_printf("%s.%s: Limits lack the minimum %" G_GUINT64_FORMAT,
                                        spec->name, field->key, field->min));
    if (field->max != 0 && !has_number(row->limits, field->max))
        g_ptr_array_add(problems,
                        g_strdup_printf("%s.%s: Limits lack the maximum %" G_GUINT64_FORMAT,
                                        spec->name, field->key, field->max));
    if ((field->flags & VM_FIELD_UNIT_INTERVAL) && strstr(row->limits, "[0, 1]") == NULL)
        g_ptr_array_add(problems,
                        g_strdup_printf("%s.%s: Limits lack '[0, 1]'", spec->name, field->key));
    if ((field->flags & VM_FIELD_ENV) && strstr(row->limits, "NAME=VALUE") == NULL)
        g_ptr_array_add(problems,
                        g_strdup_printf("%s.%s: Limits lack 'NAME=VALUE'", spec->name, field->key));
    if (!bounded && row->limits[0] != '\0')
        g_ptr_array_add(problems,
                        g_strdup_printf("%s.%s: Limits '%s', but the schema checks nothing more",
                                        spec->name, field->key, row->limits));
}

static void
check_section(const VmOpSpec *spec, const DocSection *section, GPtrArray *problems)
{
    g_autofree char *prose = normalise_space(section->text->str);
    g_autoptr(GHashTable) keys = g_hash_table_new(g_str_hash, g_str_equal);
    gsize n_fields = 0;

    if (strcmp(section->name, spec->name) != 0)
        g_ptr_array_add(problems, g_strdup_printf("op %u is '%s' in the doc, '%s' in the schema",
                                                  section->number, section->name, spec->name));
    if (section->n_tables > 1)
        g_ptr_array_add(problems,
                        g_strdup_printf("%s: %u Field tables", spec->name, section->n_tables));

    for (const VmFieldSpec *f = spec->fields; f->key != NULL; f++) {
        const DocRow *found = NULL;

        n_fields++;
        for (guint i = 0; i < section->rows->len; i++) {
            const DocRow *row = section->rows->pdata[i];

            if (strcmp(row->key, f->key) == 0)
                found = row;
        }
        if (found == NULL)
            g_ptr_array_add(
                problems, g_strdup_printf("%s: field '%s' is not documented", spec->name, f->key));
        else
            check_field(spec, f, found, problems);
    }
    for (guint i = 0; i < section->rows->len; i++) {
        const DocRow *row = section->rows->pdata[i];
        gboolean known = FALSE;

        for (const VmFieldSpec *f = spec->fields; f->key != NULL; f++)
            known = known || strcmp(f->key, row->key) == 0;
        if (!known)
            g_ptr_array_add(problems, g_strdup_printf("%s: documents field '%s' the schema lacks",
                                                      spec->name, row->key));
        if (!g_hash_table_add(keys, row->key))
            g_ptr_array_add(
                problems, g_strdup_printf("%s: field '%s' documented twice", spec->name, row->key));
    }
    if (spec->free_form && (section->n_tables != 0 || strstr(prose, "free-form") == NULL))
        g_ptr_array_add(
            problems,
            g_strdup_printf("%s: free-form, so no Field table and 'free-form'", spec->name));
    if (!spec->free_form && n_fields == 0 &&
        (section->n_tables != 0 || strstr(prose, "Fields: none.") == NULL))
        g_ptr_array_add(problems, g_strdup_printf("%s: no fields, so 'Fields: none.'", spec->name));
    if (n_fields != 0 && section->n_tables == 0)
        g_ptr_array_add(problems, g_strdup_printf("%s: no Field table", spec->name));

    if (spec->reply == 0) {
        if (strstr(prose, "Reply:") != NULL)
            g_ptr_array_add(problems,
                            g_strdup_printf("%s: not a request, yet a 'Reply:'", spec->name));
    } else {
        const char *end = spec->reply == VM_OP_EXIT ? "`exit` or `error`" : "`result` or `error`";
        const char *other = spec->reply == VM_OP_EXIT ? "`result` or `error`" : "`exit` or `error`";
        const char *reply = strstr(prose, "Reply:");

        if (reply == NULL || strstr(reply, end) == NULL || strstr(reply, other) != NULL)
            g_ptr_array_add(problems,
                            g_strdup_printf("%s: its 'Reply:' must end with %s", spec->name, end));
    }
}

/* Everything wrong with @text as a description of the schema table; empty when nothing is. */
static GPtrArray *
doc_problems(const char *text)
{
    GPtrArray *problems = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GPtrArray) sections = doc_parse(text, problems);
    gsize n_specs = 0;
    const VmOpSpec *specs = vm_op_spec_table(&n_specs);

    for (gsize i = 0; i < n_specs; i++) {
        const DocSection *found = NULL;
        guint count = 0;

        for (guint j = 0; j < sections->len; j++) {
            const DocSection *section = sections->pdata[j];

            if (section->number == (guint)specs[i].op) {
                found = section;
                count++;
            }
        }
        if (found == NULL)
            g_ptr_array_add(problems, g_strdup_printf("op %u '%s' has no section",
                                                      (guint)specs[i].op, specs[i].name));
        else if (count > 1)
            g_ptr_array_add(problems, g_strdup_printf("op %u '%s' has %u sections",
                                                      (guint)specs[i].op, specs[i].name, count));
        else
            check_section(&specs[i], found, problems);
    }
    for (guint j = 0; j < sections->len; j++) {
        const DocSection *section = sections->pdata[j];

        if (vm_op_name((VmOp)section->number) == NULL)
            g_ptr_array_add(problems, g_strdup_printf("section for op %u '%s', which is no op",
                                                      section->number, section->name));
    }
    return problems;
}

static char *
protocol_md(void)
{
    const char *root = g_getenv("VM_SOURCE_DIR");
    g_autofree char *path =
        g_build_filename(root != NULL ? root : ".", "docs", "PROTOCOL.md", NULL);

    return vm_test_read_file(path);
}

static void
assert_no_problems(GPtrArray *problems)
{
    if (problems->len == 0)
        return;
    g_ptr_array_add(problems, NULL);
    g_autofree char *all = g_strjoinv("\n# ", (char **)problems->pdata);
    fail_msg("docs/PROTOCOL.md disagrees with the schema table:\n# %s", all);
}

/* Fails unless some problem mentions every one of @needles. */
static void
assert_problem(GPtrArray *problems, const char *what, ...)
{
    va_list ap;

    va_start(ap, what);
    for (const char *needle = what; needle != NULL; needle = va_arg(ap, const char *)) {
        gboolean found = FALSE;

        for (guint i = 0; i < problems->len; i++)
            found = found || strstr(problems->pdata[i], needle) != NULL;
        if (!found) {
            va_end(ap);
            fail_msg("no problem mentions '%s' (%u problems)", needle, problems->len);
        }
    }
    va_end(ap);
}

/* @text with the first line that contains @needle removed (or, with @replacement, replaced). */
static char *
edit_line(const char *text, const char *needle, const char *replacement)
{
    const char *hit = strstr(text, needle);
    const char *start, *end;

    if (hit == NULL)
        fail_msg("the page has no '%s' to break", needle);
    start = hit;
    while (start > text && start[-1] != '\n')
        start--;
    end = strchr(hit, '\n');
    end = end != NULL ? end + 1 : hit + strlen(hit);
    return g_strdup_printf("%.*s%s%s", (int)(start - text), text,
                           replacement != NULL ? replacement : "", end);
}

static void
test_doc_matches_schema(void **state)
{
    g_autofree char *text = protocol_md();
    g_autoptr(GPtrArray) problems = doc_problems(text);

    assert_no_problems(problems);
}

/* The checker notices each kind of gap: these copies of the page are broken on purpose. */
static void
test_broken_docs_fail(void **state)
{
    g_autofree char *text = protocol_md();
    static const struct {
        const char *needle;
        const char *replacement; /* NULL: the line goes */
        const char *problem;
    } cases[] = {
        /* an op's section is missing, or its number or name is wrong */
        {"### 25 `egress-log`", NULL, "op 25 'egress-log' has no section"},
        {"### 26 `agent-set-restart`", NULL, "op 26 'agent-set-restart' has no section"},
        {"### 21 `agent-fork`", "### 26 `agent-fork`\n", "op 21 'agent-fork' has no section"},
        {"### 7 `agent-start`", "### 7 `agent-begin`\n", "'agent-begin' in the doc"},
        /* a field is missing, or has the wrong type, required flag or limits */
        {"| `memory` |", NULL, "checkpoint-create: field 'memory' is not documented"},
        {"| `daily`", NULL, "agent-set-checkpoints: field 'daily' is not documented"},
        {"| `paths`", "| `paths` | `s` | no | 1 to 64 entries | |\n", "restore.paths: type `s`"},
        {"| `source`", "| `source` | `s` | no | | |\n", "agent-fork.source: Required"},
        {"| `argv` |", "| `argv` | `as` | yes | 1 to 512 entries | |\n", "maximum 4096"},
        {"| `fraction` |", "| `fraction` | `d` | no | | |\n", "'[0, 1]'"},
        /* a field the schema does not have */
        {"| `reset`  |", "| `reset` | `b` | no | | |\n| `purge` | `b` | no | | |\n",
         "documents field 'purge'"},
        /* a request whose reply is described wrongly */
        {"Asks who is there.", "Asks who is there. Reply: `exit` or `error`.\n",
         "ping: its 'Reply:'"},
    };

    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *broken = edit_line(text, cases[i].needle, cases[i].replacement);
        g_autoptr(GPtrArray) problems = doc_problems(broken);

        assert_problem(problems, cases[i].problem, NULL);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_matches_schema),
        cmocka_unit_test(test_broken_docs_fail),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
