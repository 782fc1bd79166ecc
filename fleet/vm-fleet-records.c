#include "vm-fleet-records.h"

#include <json-glib/json-glib.h>
#include <string.h>

#include "vm-error.h"
#include "vm-name.h"

gboolean
vm_fleet_host_id_valid(const char *id)
{
    if (id == NULL || id[0] == '\0' || strlen(id) > VM_FLEET_HOST_ID_MAX)
        return FALSE;
    if (!g_ascii_islower(id[0]) && !g_ascii_isdigit(id[0]))
        return FALSE;
    for (const char *p = id; *p != '\0'; p++) {
        if (!g_ascii_islower(*p) && !g_ascii_isdigit(*p) && *p != '-' && *p != '.')
            return FALSE;
    }
    char last = id[strlen(id) - 1];
    return last != '-' && last != '.';
}

gboolean
vm_fleet_state_valid(const char *state)
{
    if (state == NULL || !g_ascii_islower(state[0]) || strlen(state) > VM_FLEET_STATE_MAX)
        return FALSE;
    for (const char *p = state; *p != '\0'; p++) {
        if (!g_ascii_islower(*p) && *p != '-')
            return FALSE;
    }
    return TRUE;
}

gboolean
vm_fleet_address_valid(const char *address)
{
    if (address == NULL || address[0] == '\0' || strlen(address) > VM_FLEET_ADDRESS_MAX)
        return FALSE;
    for (const char *p = address; *p != '\0'; p++) {
        if (!g_ascii_isgraph(*p))
            return FALSE;
    }
    return TRUE;
}

char *
vm_fleet_host_key(const char *id)
{
    return g_strconcat(VM_FLEET_HOSTS_PREFIX, id, NULL);
}

char *
vm_fleet_agent_key(const char *name)
{
    return g_strconcat(VM_FLEET_AGENTS_PREFIX, name, NULL);
}

char *
vm_fleet_drained_key(const char *id)
{
    return g_strconcat(VM_FLEET_DRAINED_PREFIX, id, NULL);
}

gboolean
vm_fleet_host_has_template(const VmFleetHost *host, const char *template_name)
{
    for (guint i = 0; i < host->templates->len; i++) {
        if (g_str_equal(host->templates->pdata[i], template_name))
            return TRUE;
    }
    return FALSE;
}

static void
state_count_clear(VmFleetStateCount *c)
{
    g_free(c->state);
}

VmFleetHost *
vm_fleet_host_new(const char *id, const char *address)
{
    VmFleetHost *host = g_new0(VmFleetHost, 1);
    host->id = g_strdup(id);
    host->address = g_strdup(address);
    host->agents = g_array_new(FALSE, TRUE, sizeof(VmFleetStateCount));
    g_array_set_clear_func(host->agents, (GDestroyNotify)state_count_clear);
    host->templates = g_ptr_array_new_with_free_func(g_free);
    return host;
}

void
vm_fleet_host_free(VmFleetHost *host)
{
    if (host == NULL)
        return;
    g_free(host->id);
    g_free(host->address);
    g_array_unref(host->agents);
    g_ptr_array_unref(host->templates);
    g_free(host);
}

void
vm_fleet_host_add_agents(VmFleetHost *host, const char *state, guint count)
{
    if (host->agents->len >= VM_FLEET_STATES_MAX - 1 || !vm_fleet_state_valid(state))
        state = "other";
    for (guint i = 0; i < host->agents->len; i++) {
        VmFleetStateCount *c = &g_array_index(host->agents, VmFleetStateCount, i);
        if (g_str_equal(c->state, state)) {
            c->count = (guint)MIN((guint64)c->count + count, VM_FLEET_COUNT_MAX);
            return;
        }
    }
    VmFleetStateCount c = {g_strdup(state), MIN(count, VM_FLEET_COUNT_MAX)};
    g_array_append_val(host->agents, c);
}

guint
vm_fleet_host_agents_total(const VmFleetHost *host)
{
    guint total = 0;
    for (guint i = 0; i < host->agents->len; i++)
        total += g_array_index(host->agents, VmFleetStateCount, i).count;
    return total;
}

static char *
builder_text(JsonBuilder *b)
{
    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

static void
add_string(JsonBuilder *b, const char *member, const char *value)
{
    json_builder_set_member_name(b, member);
    json_builder_add_string_value(b, value);
}

static void
add_int(JsonBuilder *b, const char *member, gint64 value)
{
    json_builder_set_member_name(b, member);
    json_builder_add_int_value(b, value);
}

char *
vm_fleet_host_to_json(const VmFleetHost *host)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    add_string(b, "id", host->id);
    add_string(b, "address", host->address);
    add_int(b, "cores", host->cores);
    add_int(b, "memory_mib", (gint64)host->memory_mib);
    add_int(b, "disk_gib", (gint64)host->disk_gib);
    json_builder_set_member_name(b, "agents");
    json_builder_begin_object(b);
    for (guint i = 0; i < host->agents->len; i++) {
        const VmFleetStateCount *c = &g_array_index(host->agents, VmFleetStateCount, i);
        add_int(b, c->state, c->count);
    }
    json_builder_end_object(b);
    add_int(b, "free_memory_mib", (gint64)host->free_memory_mib);
    add_int(b, "free_disk_gib", (gint64)host->free_disk_gib);
    json_builder_set_member_name(b, "drained");
    json_builder_add_boolean_value(b, host->drained);
    json_builder_set_member_name(b, "templates");
    json_builder_begin_array(b);
    for (guint i = 0; i < host->templates->len; i++)
        json_builder_add_string_value(b, host->templates->pdata[i]);
    json_builder_end_array(b);
    json_builder_end_object(b);
    return builder_text(b);
}

/* ---------------------------------------------------------------------------------------------
 * Parsing what another host wrote */

static JsonNode *
parse_object(const char *what, const char *data, gsize len, GError **error)
{
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    g_autoptr(GError) local_error = NULL;

    if (len > VM_FLEET_RECORD_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL,
                        "%s record of %" G_GSIZE_FORMAT " bytes is over %d", what, len,
                        VM_FLEET_RECORD_MAX),
               NULL;
    if (len == 0 || memchr(data, '\0', len) != NULL ||
        !json_parser_load_from_data(parser, data, (gssize)len, &local_error))
        return vm_throw(error, VM_ERROR_PROTOCOL, "%s record is not JSON", what), NULL;
    JsonNode *root = json_parser_get_root(parser);
    if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root))
        return vm_throw(error, VM_ERROR_PROTOCOL, "%s record is not a JSON object", what), NULL;
    return json_node_ref(root);
}

/* The string member @member of @o: NULL and an error when absent (where @required) or not a
 * string; NULL and no error when absent and not required. */
static const char *
get_string(JsonObject *o, const char *what, const char *member, gboolean required, GError **error)
{
    JsonNode *n = json_object_get_member(o, member);
    if (n == NULL) {
        if (required)
            vm_throw(error, VM_ERROR_PROTOCOL, "%s record has no %s", what, member);
        return NULL;
    }
    if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING) {
        vm_throw(error, VM_ERROR_PROTOCOL, "%s record's %s is not a string", what, member);
        return NULL;
    }
    return json_node_get_string(n);
}

/* The integer member @member (absent: 0) within [0, @max]. */
static gboolean
get_uint(JsonObject *o, const char *what, const char *member, guint64 max, guint64 *ret,
         GError **error)
{
    JsonNode *n = json_object_get_member(o, member);
    *ret = 0;
    if (n == NULL)
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64)
        return vm_throw(error, VM_ERROR_PROTOCOL, "%s record's %s is not an integer", what, member);
    gint64 v = json_node_get_int(n);
    if (v < 0 || (guint64)v > max)
        return vm_throw(error, VM_ERROR_PROTOCOL, "%s record's %s is out of range", what, member);
    *ret = (guint64)v;
    return TRUE;
}

/* Sizes a host may state: 1 EiB in MiB, 1 EiB in GiB, a million cores. */
#define HOST_MIB_MAX   (G_GUINT64_CONSTANT(1) << 40)
#define HOST_GIB_MAX   (G_GUINT64_CONSTANT(1) << 30)
#define HOST_CORES_MAX 1000000

VmFleetHost *
vm_fleet_host_from_json(const char *data, gsize len, GError **error)
{
    g_autoptr(JsonNode) root = parse_object("host", data, len, error);
    if (root == NULL)
        return NULL;
    JsonObject *o = json_node_get_object(root);
    GError *local_error = NULL;

    const char *id = get_string(o, "host", "id", TRUE, error);
    if (id == NULL)
        return NULL;
    if (!vm_fleet_host_id_valid(id))
        return vm_throw(error, VM_ERROR_PROTOCOL, "host record's id is not a host id"), NULL;
    const char *address = get_string(o, "host", "address", TRUE, error);
    if (address == NULL)
        return NULL;
    if (!vm_fleet_address_valid(address))
        return vm_throw(error, VM_ERROR_PROTOCOL, "host record's address is not printable"), NULL;

    g_autoptr(VmFleetHost) host = vm_fleet_host_new(id, address);
    guint64 cores = 0;
    if (!get_uint(o, "host", "cores", HOST_CORES_MAX, &cores, error) ||
        !get_uint(o, "host", "memory_mib", HOST_MIB_MAX, &host->memory_mib, error) ||
        !get_uint(o, "host", "disk_gib", HOST_GIB_MAX, &host->disk_gib, error) ||
        !get_uint(o, "host", "free_memory_mib", HOST_MIB_MAX, &host->free_memory_mib, error) ||
        !get_uint(o, "host", "free_disk_gib", HOST_GIB_MAX, &host->free_disk_gib, error))
        return NULL;
    host->cores = (guint)cores;

    JsonNode *drained = json_object_get_member(o, "drained");
    if (drained != NULL) {
        if (!JSON_NODE_HOLDS_VALUE(drained) || json_node_get_value_type(drained) != G_TYPE_BOOLEAN)
            return vm_throw(error, VM_ERROR_PROTOCOL, "host record's drained is not a boolean"),
                   NULL;
        host->drained = json_node_get_boolean(drained);
    }

    JsonNode *templates = json_object_get_member(o, "templates");
    if (templates != NULL) {
        if (!JSON_NODE_HOLDS_ARRAY(templates))
            return vm_throw(error, VM_ERROR_PROTOCOL, "host record's templates is not an array"),
                   NULL;
        JsonArray *names = json_node_get_array(templates);
        if (json_array_get_length(names) > VM_FLEET_TEMPLATES_MAX)
            return vm_throw(error, VM_ERROR_PROTOCOL, "host record names over %d templates",
                            VM_FLEET_TEMPLATES_MAX),
                   NULL;
        for (guint i = 0; i < json_array_get_length(names); i++) {
            JsonNode *n = json_array_get_element(names, i);
            if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_STRING ||
                !vm_name_validate_template(json_node_get_string(n), NULL))
                return vm_throw(error, VM_ERROR_PROTOCOL,
                                "host record's templates holds what is no template name"),
                       NULL;
            g_ptr_array_add(host->templates, g_strdup(json_node_get_string(n)));
        }
    }

    JsonNode *agents = json_object_get_member(o, "agents");
    if (agents != NULL) {
        if (!JSON_NODE_HOLDS_OBJECT(agents))
            return vm_throw(error, VM_ERROR_PROTOCOL, "host record's agents is not an object"),
                   NULL;
        JsonObject *counts = json_node_get_object(agents);
        if (json_object_get_size(counts) > VM_FLEET_STATES_MAX)
            return vm_throw(error, VM_ERROR_PROTOCOL, "host record counts over %d states",
                            VM_FLEET_STATES_MAX),
                   NULL;
        g_autoptr(GList) members = json_object_get_members(counts);
        for (GList *m = members; m != NULL; m = m->next) {
            const char *state = m->data;
            guint64 count = 0;
            if (!vm_fleet_state_valid(state))
                return vm_throw(error, VM_ERROR_PROTOCOL,
                                "host record counts agents in a state that is no state name"),
                       NULL;
            if (!get_uint(counts, "host", state, VM_FLEET_COUNT_MAX, &count, &local_error)) {
                g_propagate_error(error, local_error);
                return NULL;
            }
            vm_fleet_host_add_agents(host, state, (guint)count);
        }
    }
    return g_steal_pointer(&host);
}

VmFleetAgent *
vm_fleet_agent_new(const char *name, const char *host, guint64 epoch, const char *state)
{
    VmFleetAgent *agent = g_new0(VmFleetAgent, 1);
    agent->name = g_strdup(name);
    agent->host = g_strdup(host);
    agent->epoch = epoch;
    agent->state = g_strdup(state != NULL ? state : "unknown");
    return agent;
}

void
vm_fleet_agent_free(VmFleetAgent *agent)
{
    if (agent == NULL)
        return;
    g_free(agent->name);
    g_free(agent->host);
    g_free(agent->state);
    g_free(agent);
}

char *
vm_fleet_agent_to_json(const VmFleetAgent *agent)
{
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    add_string(b, "name", agent->name);
    add_string(b, "host", agent->host);
    add_int(b, "epoch", (gint64)agent->epoch);
    add_string(b, "state", agent->state);
    json_builder_end_object(b);
    return builder_text(b);
}

VmFleetAgent *
vm_fleet_agent_from_json(const char *data, gsize len, GError **error)
{
    g_autoptr(JsonNode) root = parse_object("agent", data, len, error);
    if (root == NULL)
        return NULL;
    JsonObject *o = json_node_get_object(root);

    const char *name = get_string(o, "agent", "name", TRUE, error);
    if (name == NULL)
        return NULL;
    if (!vm_name_validate(name, NULL))
        return vm_throw(error, VM_ERROR_PROTOCOL, "agent record's name is not an agent name"), NULL;
    const char *host = get_string(o, "agent", "host", TRUE, error);
    if (host == NULL)
        return NULL;
    if (!vm_fleet_host_id_valid(host))
        return vm_throw(error, VM_ERROR_PROTOCOL, "agent record's host is not a host id"), NULL;
    if (json_object_get_member(o, "epoch") == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "agent record has no epoch"), NULL;
    guint64 epoch = 0;
    if (!get_uint(o, "agent", "epoch", G_MAXINT64, &epoch, error))
        return NULL;
    if (epoch == 0)
        return vm_throw(error, VM_ERROR_PROTOCOL, "agent record's epoch is 0"), NULL;
    GError *local_error = NULL;
    const char *state = get_string(o, "agent", "state", FALSE, &local_error);
    if (local_error != NULL) {
        g_propagate_error(error, local_error);
        return NULL;
    }
    if (state != NULL && !vm_fleet_state_valid(state))
        return vm_throw(error, VM_ERROR_PROTOCOL, "agent record's state is no state name"), NULL;
    return vm_fleet_agent_new(name, host, epoch, state);
}
