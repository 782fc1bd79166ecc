/* The fleet's records in etcd: a host's (capacity and load, under its lease) and an agent's
 * ownership, as JSON.
 *
 *   /vmctl/hosts/<id>    {"id", "address", "cores", "memory_mib", "disk_gib", "agents": {state:
 *                         count}, "free_memory_mib", "free_disk_gib", "drained", "templates"}
 *   /vmctl/agents/<name> {"name", "host", "epoch", "state"}
 *
 * Every host of the fleet writes its own records and reads everyone's: a record is parsed as
 * untrusted input (size, types, ranges, names checked; unknown members ignored, so a newer hostd
 * may add some). Pure: no I/O.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define VM_FLEET_PREFIX        "/vmctl/"
#define VM_FLEET_HOSTS_PREFIX  "/vmctl/hosts/"
#define VM_FLEET_AGENTS_PREFIX "/vmctl/agents/"
/* /vmctl/drained/<id>: the host is drained. Not under the host's lease, so that the owner's
 * renewals and rewrites of its record keep it; any host of the fleet sets or clears it. */
#define VM_FLEET_DRAINED_PREFIX "/vmctl/drained/"
#define VM_FLEET_RECORD_MAX     (16 * 1024) /* bytes of one record */
#define VM_FLEET_HOST_ID_MAX    63
#define VM_FLEET_ADDRESS_MAX    255
#define VM_FLEET_STATES_MAX     16 /* distinct states in a host's agent counts */
#define VM_FLEET_STATE_MAX      32 /* bytes of a state's name */
#define VM_FLEET_COUNT_MAX      1000000
#define VM_FLEET_HOSTS_MAX      4096   /* hosts a fleet view reads */
#define VM_FLEET_AGENTS_MAX     100000 /* agents a fleet view reads */
#define VM_FLEET_TEMPLATES_MAX  256    /* templates a host record names */

typedef struct {
    char *state; /* "running", "stopped", ... */
    guint count;
} VmFleetStateCount;

typedef struct {
    char *id;      /* vm_fleet_host_id_valid() */
    char *address; /* how another host reaches it: what `--host ssh://` would use */
    guint cores;
    guint64 memory_mib;
    guint64 disk_gib;
    GArray *agents; /* VmFleetStateCount, at most VM_FLEET_STATES_MAX, distinct states */
    guint64 free_memory_mib;
    guint64 free_disk_gib;
    gboolean drained;     /* as read: from VM_FLEET_DRAINED_PREFIX, never the record's own */
    GPtrArray *templates; /* the templates it can make agents of (names), at most
                           * VM_FLEET_TEMPLATES_MAX; never NULL */
} VmFleetHost;

typedef struct {
    char *name;    /* an agent name (vm_name_validate()) */
    char *host;    /* the owner's id */
    guint64 epoch; /* >= 1; moves and recoveries raise it */
    char *state;   /* as the owner last published it */
} VmFleetAgent;

/* Whether @id is a host id: [a-z0-9] then [a-z0-9.-], at most VM_FLEET_HOST_ID_MAX bytes, not
 * ending in '.' or '-'. Can't fail. */
gboolean vm_fleet_host_id_valid(const char *id);

/* Whether @state is a state name: [a-z] then [a-z-], 1 to VM_FLEET_STATE_MAX bytes. */
gboolean vm_fleet_state_valid(const char *state);

/* Whether @address is printable ASCII without spaces, 1 to VM_FLEET_ADDRESS_MAX bytes. */
gboolean vm_fleet_address_valid(const char *address);

/* The etcd keys of host @id and agent @name. Newly allocated. */
char *vm_fleet_host_key(const char *id);
char *vm_fleet_agent_key(const char *name);
char *vm_fleet_drained_key(const char *id);

/* Whether @host names @template_name among its templates. */
gboolean vm_fleet_host_has_template(const VmFleetHost *host, const char *template_name);

VmFleetHost *vm_fleet_host_new(const char *id, const char *address);
void vm_fleet_host_free(VmFleetHost *host);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmFleetHost, vm_fleet_host_free)

/* Adds @count agents in @state (to a state already there, or a new entry); beyond
 * VM_FLEET_STATES_MAX states the rest count as "other". Can't fail. */
void vm_fleet_host_add_agents(VmFleetHost *host, const char *state, guint count);

/* The number of agents in @host's counts, all states together. */
guint vm_fleet_host_agents_total(const VmFleetHost *host);

/* @host as one line of JSON. Newly allocated; can't fail. */
char *vm_fleet_host_to_json(const VmFleetHost *host);

/* Parses a host record of @len bytes. Fails with VM_ERROR_PROTOCOL saying what is wrong: over
 * VM_FLEET_RECORD_MAX, not a JSON object, a member of the wrong type or out of range, a bad id,
 * address or state. */
VmFleetHost *vm_fleet_host_from_json(const char *data, gsize len, GError **error);

VmFleetAgent *vm_fleet_agent_new(const char *name, const char *host, guint64 epoch,
                                 const char *state);
void vm_fleet_agent_free(VmFleetAgent *agent);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmFleetAgent, vm_fleet_agent_free)

char *vm_fleet_agent_to_json(const VmFleetAgent *agent);

/* Parses an agent record as vm_fleet_host_from_json() does a host's: name, host and epoch are
 * required; a missing state is "unknown". */
VmFleetAgent *vm_fleet_agent_from_json(const char *data, gsize len, GError **error);

G_END_DECLS
