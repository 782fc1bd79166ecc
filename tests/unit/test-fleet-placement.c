/* The fleet's placement rule (fleet/vm-placement.c): live, not drained, has the template, room
 * for the agent's memory; then the most free memory, the fewest agents, the smallest id. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "vm-error.h"
#include "vm-fleet-records.h"
#include "vm-placement.h"

typedef struct {
    VmFleetHost *records[12];
    VmPlacementHost hosts[12];
    gsize n;
} Fleet;

static void
fleet_clear(Fleet *f)
{
    for (gsize i = 0; i < f->n; i++)
        vm_fleet_host_free(f->records[i]);
}

/* Adds host @id, live, with @free_mib free, @agents running agents and template "debian-12". */
static VmFleetHost *
add(Fleet *f, const char *id, guint64 free_mib, guint agents)
{
    VmFleetHost *h = vm_fleet_host_new(id, "ssh://root@lab");
    h->free_memory_mib = free_mib;
    if (agents > 0)
        vm_fleet_host_add_agents(h, "running", agents);
    g_ptr_array_add(h->templates, g_strdup("debian-12"));
    f->records[f->n] = h;
    f->hosts[f->n] = (VmPlacementHost){.record = h, .live = TRUE};
    return f->records[f->n++];
}

static const char *
choose(Fleet *f, const char *template_name, guint64 memory_mib, GError **error)
{
    gsize i = 99;
    if (!vm_placement_choose(f->hosts, f->n, template_name, memory_mib, &i, error))
        return NULL;
    assert_true(i < f->n);
    return f->records[i]->id;
}

static void
test_most_free_memory(void **state)
{
    Fleet f = {0};
    add(&f, "h1", 2048, 0);
    add(&f, "h2", 8192, 5);
    add(&f, "h3", 4096, 0);
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "h2");
    fleet_clear(&f);
}

static void
test_ties(void **state)
{
    Fleet f = {0};
    /* Equal memory: the fewest agents; equal both: the smallest id, whatever the order. */
    add(&f, "h3", 4096, 1);
    add(&f, "h2", 4096, 2);
    add(&f, "h1", 4096, 1);
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "h1");
    /* Agents in any state count. */
    vm_fleet_host_add_agents(f.records[2], "stopped", 1);
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "h3");
    fleet_clear(&f);
}

static void
test_drained_down_template(void **state)
{
    Fleet f = {0};
    VmFleetHost *big = add(&f, "big", 65536, 0);
    add(&f, "small", 1024, 0);
    VmFleetHost *other = add(&f, "other", 32768, 0);
    g_ptr_array_set_size(other->templates, 0);
    g_ptr_array_add(other->templates, g_strdup("alpine"));

    big->drained = TRUE;
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "small");
    big->drained = FALSE;
    f.hosts[0].live = FALSE;
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "small");
    /* The template decides before memory does. */
    assert_string_equal(choose(&f, "alpine", 0, NULL), "other");
    f.hosts[0].live = TRUE;
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "big");
    fleet_clear(&f);
}

static void
test_none_fits(void **state)
{
    Fleet f = {0};
    g_autoptr(GError) error = NULL;

    assert_null(choose(&f, "debian-12", 0, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_string_equal(error->message, "the fleet has no host");
    g_clear_error(&error);

    VmFleetHost *a = add(&f, "a", 4096, 0);
    add(&f, "b", 4096, 0);
    add(&f, "c", 512, 0);
    add(&f, "d", 4096, 0);
    a->drained = TRUE;
    f.hosts[1].live = FALSE;
    g_ptr_array_set_size(f.records[3]->templates, 0);
    assert_null(choose(&f, "debian-12", 1024, &error));
    assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_NO_RESOURCES));
    assert_string_equal(error->message,
                        "no host of the fleet can take it: host 'a' is drained; host 'b' is down; "
                        "host 'c' has 512 MiB free, the agent needs 1024; host 'd' does not have "
                        "template 'debian-12'");
    g_clear_error(&error);
    /* Without a memory figure, memory is not checked. */
    assert_string_equal(choose(&f, "debian-12", 0, NULL), "c");
    fleet_clear(&f);
}

static void
test_many_reasons_bounded(void **state)
{
    Fleet f = {0};
    g_autoptr(GError) error = NULL;
    for (guint i = 0; i < 12; i++) {
        g_autofree char *id = g_strdup_printf("h%02u", i);
        add(&f, id, 4096, 0);
        f.hosts[i].live = FALSE;
    }
    assert_null(choose(&f, "debian-12", 0, &error));
    assert_non_null(strstr(error->message, "host 'h07' is down; and 4 more"));
    assert_null(strstr(error->message, "h08"));
    fleet_clear(&f);
}

/* A record's templates travel through JSON and hostile ones are refused. */
static void
test_templates_record(void **state)
{
    g_autoptr(VmFleetHost) h = vm_fleet_host_new("h1", "ssh://root@h1");
    g_autoptr(GError) error = NULL;
    g_ptr_array_add(h->templates, g_strdup("debian-12"));
    g_ptr_array_add(h->templates, g_strdup("alpine"));
    g_autofree char *json = vm_fleet_host_to_json(h);
    g_autoptr(VmFleetHost) back = vm_fleet_host_from_json(json, strlen(json), &error);
    assert_non_null(back);
    assert_true(vm_fleet_host_has_template(back, "alpine"));
    assert_false(vm_fleet_host_has_template(back, "ubuntu"));

    const char *bad[] = {
        "{\"id\":\"h1\",\"address\":\"a\",\"templates\":\"debian-12\"}",
        "{\"id\":\"h1\",\"address\":\"a\",\"templates\":[1]}",
        "{\"id\":\"h1\",\"address\":\"a\",\"templates\":[\"../x\"]}",
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        g_autoptr(VmFleetHost) none = vm_fleet_host_from_json(bad[i], strlen(bad[i]), &error);
        assert_null(none);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
        g_clear_error(&error);
    }
    g_autoptr(GString) many = g_string_new("{\"id\":\"h1\",\"address\":\"a\",\"templates\":[");
    for (guint i = 0; i <= VM_FLEET_TEMPLATES_MAX; i++)
        g_string_append_printf(many, "%s\"t%u\"", i > 0 ? "," : "", i);
    g_string_append(many, "]}");
    g_autoptr(VmFleetHost) over = vm_fleet_host_from_json(many->str, many->len, &error);
    assert_null(over);
    assert_non_null(strstr(error->message, "templates"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_most_free_memory),      cmocka_unit_test(test_ties),
        cmocka_unit_test(test_drained_down_template), cmocka_unit_test(test_none_fits),
        cmocka_unit_test(test_many_reasons_bounded),  cmocka_unit_test(test_templates_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
