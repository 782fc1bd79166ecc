/* The fleet's records come from every host of the fleet: each parses as untrusted input (size,
 * JSON shape, types, ranges, names) and what one host writes another reads back the same. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "vm-error.h"
#include "vm-fleet-records.h"

#include <string.h>

static void
test_host_round_trip(void **state)
{
    g_autoptr(VmFleetHost) host = vm_fleet_host_new("h1.lab", "ssh://root@10.0.0.1:22");
    host->cores = 16;
    host->memory_mib = 64 * 1024;
    host->disk_gib = 900;
    host->free_memory_mib = 1234;
    host->free_disk_gib = 800;
    host->drained = TRUE;
    vm_fleet_host_add_agents(host, "running", 1);
    vm_fleet_host_add_agents(host, "running", 2);
    vm_fleet_host_add_agents(host, "stopped", 1);
    assert_int_equal(vm_fleet_host_agents_total(host), 4);
    /* Template names as the templates dir has them: with dots ("ubuntu-24.04"). */
    g_ptr_array_add(host->templates, g_strdup("debian-12"));
    g_ptr_array_add(host->templates, g_strdup("ubuntu-24.04"));

    g_autofree char *json = vm_fleet_host_to_json(host);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmFleetHost) back = vm_fleet_host_from_json(json, strlen(json), &error);
    assert_non_null(back);
    assert_string_equal(back->id, "h1.lab");
    assert_string_equal(back->address, "ssh://root@10.0.0.1:22");
    assert_int_equal(back->cores, 16);
    assert_int_equal(back->memory_mib, 64 * 1024);
    assert_int_equal(back->disk_gib, 900);
    assert_int_equal(back->free_memory_mib, 1234);
    assert_int_equal(back->free_disk_gib, 800);
    assert_true(back->drained);
    assert_true(vm_fleet_host_has_template(back, "ubuntu-24.04"));
    assert_true(vm_fleet_host_has_template(back, "debian-12"));
    assert_int_equal(back->agents->len, 2);
    assert_int_equal(vm_fleet_host_agents_total(back), 4);
}

static void
test_agent_round_trip(void **state)
{
    g_autoptr(VmFleetAgent) agent = vm_fleet_agent_new("builder-2", "h2", 7, "running");
    g_autofree char *json = vm_fleet_agent_to_json(agent);
    g_autoptr(GError) error = NULL;
    g_autoptr(VmFleetAgent) back = vm_fleet_agent_from_json(json, strlen(json), &error);

    assert_non_null(back);
    assert_string_equal(back->name, "builder-2");
    assert_string_equal(back->host, "h2");
    assert_int_equal(back->epoch, 7);
    assert_string_equal(back->state, "running");

    /* No state yet (a record another version wrote): unknown. */
    static const char bare[] = "{\"name\":\"a\",\"host\":\"h\",\"epoch\":1,\"future\":[1,2]}";
    g_autoptr(VmFleetAgent) plain = vm_fleet_agent_from_json(bare, strlen(bare), &error);
    assert_non_null(plain);
    assert_string_equal(plain->state, "unknown");
}

static const char *const bad_hosts[] = {
    "",
    "null",
    "[]",
    "\"h1\"",
    "{",
    "{}",
    "{\"id\":\"h1\"}",
    "{\"address\":\"x\"}",
    "{\"id\":1,\"address\":\"x\"}",
    "{\"id\":\"H1\",\"address\":\"x\"}",
    "{\"id\":\"../h\",\"address\":\"x\"}",
    "{\"id\":\"h-\",\"address\":\"x\"}",
    "{\"id\":\"h1\",\"address\":\"a b\"}",
    "{\"id\":\"h1\",\"address\":\"\"}",
    "{\"id\":\"h1\",\"address\":\"x\\u0007\"}",
    "{\"id\":\"h1\",\"address\":[\"x\"]}",
    "{\"id\":\"h1\",\"address\":\"x\",\"cores\":-1}",
    "{\"id\":\"h1\",\"address\":\"x\",\"cores\":\"4\"}",
    "{\"id\":\"h1\",\"address\":\"x\",\"cores\":4.5}",
    "{\"id\":\"h1\",\"address\":\"x\",\"cores\":99999999999}",
    "{\"id\":\"h1\",\"address\":\"x\",\"memory_mib\":9223372036854775807}",
    "{\"id\":\"h1\",\"address\":\"x\",\"free_disk_gib\":null}",
    "{\"id\":\"h1\",\"address\":\"x\",\"drained\":1}",
    "{\"id\":\"h1\",\"address\":\"x\",\"agents\":[]}",
    "{\"id\":\"h1\",\"address\":\"x\",\"agents\":{\"Running\":1}}",
    "{\"id\":\"h1\",\"address\":\"x\",\"agents\":{\"running\":-1}}",
    "{\"id\":\"h1\",\"address\":\"x\",\"agents\":{\"running\":\"1\"}}",
    "{\"id\":\"h1\",\"address\":\"x\",\"agents\":{\"running\":2000000}}",
    "{\"id\":\"h1\",\"address\":\"x\",\"agents\":{\"\":1}}",
};

static void
test_host_hostile(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(bad_hosts); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmFleetHost) host =
            vm_fleet_host_from_json(bad_hosts[i], strlen(bad_hosts[i]), &error);
        if (host != NULL)
            fail_msg("host record accepted: %s", bad_hosts[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    }
}

static void
test_host_bounds(void **state)
{
    g_autoptr(GError) error = NULL;

    /* Over the size bound: refused before it is parsed. */
    g_autoptr(GString) big = g_string_new("{\"id\":\"h1\",\"address\":\"x\",\"pad\":\"");
    while (big->len <= VM_FLEET_RECORD_MAX)
        g_string_append(big, "xxxxxxxxxxxxxxxx");
    g_string_append(big, "\"}");
    assert_null(vm_fleet_host_from_json(big->str, big->len, &error));
    assert_non_null(strstr(error->message, "over"));
    g_clear_error(&error);

    /* More states than a host may count. */
    g_autoptr(GString) states = g_string_new("{\"id\":\"h1\",\"address\":\"x\",\"agents\":{");
    for (guint i = 0; i <= VM_FLEET_STATES_MAX; i++)
        g_string_append_printf(states, "%s\"s%c\":1", i > 0 ? "," : "", 'a' + i);
    g_string_append(states, "}}");
    assert_null(vm_fleet_host_from_json(states->str, states->len, &error));
    g_clear_error(&error);

    /* A NUL inside: not a record. */
    static const char nul[] = "{\"id\":\"h1\",\"address\":\"x\"}\0{}";
    assert_null(vm_fleet_host_from_json(nul, sizeof(nul) - 1, &error));
    g_clear_error(&error);

    /* The longest id and address pass; one more byte does not. */
    g_autofree char *id = g_strnfill(VM_FLEET_HOST_ID_MAX, 'h');
    g_autofree char *address = g_strnfill(VM_FLEET_ADDRESS_MAX, 'a');
    g_autofree char *ok = g_strdup_printf("{\"id\":\"%s\",\"address\":\"%s\"}", id, address);
    g_autoptr(VmFleetHost) host = vm_fleet_host_from_json(ok, strlen(ok), &error);
    assert_non_null(host);
    g_autofree char *long_id = g_strdup_printf("{\"id\":\"%sh\",\"address\":\"x\"}", id);
    assert_null(vm_fleet_host_from_json(long_id, strlen(long_id), &error));
    g_clear_error(&error);
    g_autofree char *long_address = g_strdup_printf("{\"id\":\"h\",\"address\":\"%sa\"}", address);
    assert_null(vm_fleet_host_from_json(long_address, strlen(long_address), &error));
}

static const char *const bad_agents[] = {
    "",
    "[]",
    "{}",
    "{\"name\":\"a\",\"host\":\"h\"}",
    "{\"name\":\"a\",\"epoch\":1}",
    "{\"host\":\"h\",\"epoch\":1}",
    "{\"name\":\"A\",\"host\":\"h\",\"epoch\":1}",
    "{\"name\":\"../a\",\"host\":\"h\",\"epoch\":1}",
    "{\"name\":\"a\",\"host\":\"h/x\",\"epoch\":1}",
    "{\"name\":\"a\",\"host\":\"\",\"epoch\":1}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":0}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":-3}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":\"1\"}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":1.5}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":null}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":1,\"state\":3}",
    "{\"name\":\"a\",\"host\":\"h\",\"epoch\":1,\"state\":\"Run ning\"}",
    "{\"name\":[\"a\"],\"host\":\"h\",\"epoch\":1}",
    "{\"name\":\"a\",\"host\":{\"id\":\"h\"},\"epoch\":1}",
};

static void
test_agent_hostile(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(bad_agents); i++) {
        g_autoptr(GError) error = NULL;
        g_autoptr(VmFleetAgent) agent =
            vm_fleet_agent_from_json(bad_agents[i], strlen(bad_agents[i]), &error);
        if (agent != NULL)
            fail_msg("agent record accepted: %s", bad_agents[i]);
        assert_true(g_error_matches(error, VM_ERROR, VM_ERROR_PROTOCOL));
    }
}

static void
test_names(void **state)
{
    assert_true(vm_fleet_host_id_valid("h1"));
    assert_true(vm_fleet_host_id_valid("1"));
    assert_true(vm_fleet_host_id_valid("rack1.host-2"));
    assert_false(vm_fleet_host_id_valid(NULL));
    assert_false(vm_fleet_host_id_valid(""));
    assert_false(vm_fleet_host_id_valid("-h"));
    assert_false(vm_fleet_host_id_valid("h."));
    assert_false(vm_fleet_host_id_valid("h/1"));
    assert_false(vm_fleet_host_id_valid("h_1"));
    assert_false(vm_fleet_host_id_valid("H"));
    assert_false(vm_fleet_host_id_valid("h\xc3\xa9"));

    g_autofree char *host_key = vm_fleet_host_key("h1");
    g_autofree char *agent_key = vm_fleet_agent_key("a1");
    assert_string_equal(host_key, "/vmctl/hosts/h1");
    assert_string_equal(agent_key, "/vmctl/agents/a1");

    /* Over the states a host may count, the rest count as other. */
    g_autoptr(VmFleetHost) host = vm_fleet_host_new("h", "x");
    for (guint i = 0; i < 40; i++) {
        g_autofree char *s = g_strdup_printf("s%c", 'a' + (i % 26));
        vm_fleet_host_add_agents(host, s, 1);
    }
    vm_fleet_host_add_agents(host, "Not A State", 1);
    assert_true(host->agents->len <= VM_FLEET_STATES_MAX);
    assert_int_equal(vm_fleet_host_agents_total(host), 41);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_round_trip), cmocka_unit_test(test_agent_round_trip),
        cmocka_unit_test(test_host_hostile),    cmocka_unit_test(test_host_bounds),
        cmocka_unit_test(test_agent_hostile),   cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
