/* This host in a fleet ([cluster] in hostd.conf; docs/CLUSTER.md).
 *
 * A HostdCluster registers the host at /vmctl/hosts/<id> under an etcd lease and keeps the
 * lease alive from a thread of its own (a request never waits for it), writing the host's load
 * every few seconds and each of its agents' state. It claims agent names for this host
 * (/vmctl/agents/<name>, created only where no record is: a name is unique in the fleet) and
 * gives them back, and reads the fleet's hosts and agents for the one view. Without quorum the
 * claims and the view fail (VM_ERROR_NOT_RUNNING) and nothing else stops: the thread retries.
 *
 * A leaf: it knows no agent's lifecycle; hostd hands it the agents' states through a callback.
 */
#pragma once

#include <glib.h>

#include "hostd-config.h"

G_BEGIN_DECLS

/* How often the host's load and its agents' states are written again. */
#define HOSTD_CLUSTER_REFRESH_S 5

typedef struct _HostdCluster HostdCluster;

/* The agents of this host and the state of each (name -> state, both strings), newly
 * allocated; NULL when they cannot be read now. Called on the cluster's thread. */
typedef GHashTable *(*HostdClusterAgentsFunc)(gpointer data);

/* A cluster member for @config, whose disk figures are those of the filesystem of @state_dir.
 * Contacts nothing yet. Fails with VM_ERROR_INVALID_ARGUMENT for a bad endpoint. */
HostdCluster *hostd_cluster_new(const HostdClusterConfig *config, const char *state_dir,
                                GError **error);

/* The templates this host can make agents of (a GPtrArray of names), newly allocated; NULL when
 * they cannot be read now. Called on the cluster's thread. */
typedef GPtrArray *(*HostdClusterTemplatesFunc)(gpointer data);

/* Sets where the host record's templates come from (before hostd_cluster_start()); without,
 * the record names none and placement sends no agent here. */
void hostd_cluster_set_templates_func(HostdCluster *cluster, HostdClusterTemplatesFunc func,
                                      gpointer data);

/* Sets where the agents' states come from (before hostd_cluster_start()). */
void hostd_cluster_set_agents_func(HostdCluster *cluster, HostdClusterAgentsFunc func,
                                   gpointer data);

/* Told (on the cluster's thread) that agent @name, which this host has, is owned in the fleet
 * by host @owner with @epoch: hostd fences it (hostd-fence.h). Called at each refresh while it
 * lasts, so it must do nothing the second time. */
typedef void (*HostdClusterFenceFunc)(gpointer data, const char *name, const char *owner,
                                      guint64 epoch);

/* Sets what the thread calls for an agent here that another host owns (before
 * hostd_cluster_start()); without, such an agent is only logged. */
void hostd_cluster_set_fence_func(HostdCluster *cluster, HostdClusterFenceFunc func, gpointer data);

/* Sets what the thread calls after each refresh that reached etcd (before
 * hostd_cluster_start()): hostd settles what waits on the fleet's records there (hostd-move.h).
 * It must never wait on an agent: the thread renews the lease. */
void hostd_cluster_set_tick_func(HostdCluster *cluster, void (*func)(gpointer data), gpointer data);
/* Sets where the thread reports what it could not do (one line each; changes only, not every
 * retry). May be NULL. */
void hostd_cluster_set_log_func(HostdCluster *cluster, void (*log)(const char *message));

/* Starts the thread that registers the host, claims its agents that have no record, keeps the
 * lease alive and refreshes the load. Returns at once: a fleet that cannot be reached is retried
 * there. Can't fail. */
void hostd_cluster_start(HostdCluster *cluster);

/* Stops the thread; with @revoke, revokes the lease (the host's record goes at once) as a clean
 * exit does. Without, the record goes when its TTL runs out (as when the host dies). */
void hostd_cluster_stop(HostdCluster *cluster, gboolean revoke);

/* Stops (revoking) and frees. NULL is fine. */
void hostd_cluster_free(HostdCluster *cluster);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdCluster, hostd_cluster_free)

const char *hostd_cluster_host_id(const HostdCluster *cluster);

/* Whether the host holds a live lease with its record, as far as the thread knows. */
gboolean hostd_cluster_registered(HostdCluster *cluster);

/* Claims @name for this host: creates its record {host, epoch 1} where none is. *@ret_created:
 * whether this call made it (FALSE: this host owned it already). Fails with VM_ERROR_EXISTS
 * "agent 'x' exists on host 'h2'" for a name another host owns, VM_ERROR_NOT_RUNNING when etcd
 * cannot be reached or has no quorum. */
gboolean hostd_cluster_claim(HostdCluster *cluster, const char *name, gboolean *ret_created,
                             GError **error);

/* At hostd's start: deletes every agent record naming this host for an agent it does not have
 * (@here: the names it has, a set): a `new` that died between its claim and its end, or a state
 * directory that lost an agent, would otherwise hold the name for ever. Each with a transaction
 * on the record read. Returns the names released (a GPtrArray of strings). Fails with
 * VM_ERROR_NOT_RUNNING when etcd cannot be reached (nothing released). */
GPtrArray *hostd_cluster_release_missing(HostdCluster *cluster, GHashTable *here, GError **error);
/* Deletes @name's record where this host owns it (another host's record stays). Fails with
 * VM_ERROR_NOT_RUNNING when etcd cannot be reached. */
gboolean hostd_cluster_release(HostdCluster *cluster, const char *name, GError **error);

/* The fleet's hosts (aa{sv}, by id): id, address, live, cores, memory_mib, disk_gib, agents
 * (a{su}: state -> count), agents_total, free_memory_mib, free_disk_gib, drained. A host that
 * agents' records name and that has no live record is listed with live false. Records that do
 * not parse are left out. Fails with VM_ERROR_NOT_RUNNING when etcd cannot be reached. */
GVariant *hostd_cluster_hosts(HostdCluster *cluster, GError **error);

/* Every agent of the fleet (aa{sv}, by name): name, host, epoch, state (host-down where its
 * host has no live record), host_live. Fails as hostd_cluster_hosts(). */
GVariant *hostd_cluster_agents(HostdCluster *cluster, GError **error);

/* Sets (@drained) or clears host @id's drained flag, /vmctl/drained/<id>, with a transaction on
 * that key's version (retried a few times when another host changes it meanwhile). Any host of
 * the fleet may; the owner's record does not hold it, so its renewals keep it. *@ret_changed
 * (may be NULL): whether this call changed it. Fails with VM_ERROR_INVALID_ARGUMENT for what is
 * no host id, VM_ERROR_NOT_FOUND "no host 'x' in the fleet" for a host that has no record and no
 * agents, VM_ERROR_NOT_RUNNING when etcd cannot be reached. */
gboolean hostd_cluster_set_drained(HostdCluster *cluster, const char *id, gboolean drained,
                                   gboolean *ret_changed, GError **error);

/* Where a new agent of @template_name needing @memory_mib MiB (0: not checked) goes: host @on
 * when given, else the host vm_placement_choose() picks from the fleet's records now. Returns
 * its id and address (newly allocated). Fails with VM_ERROR_NOT_FOUND "no host 'x' in the
 * fleet", VM_ERROR_BAD_STATE for an @on that is down or drained, VM_ERROR_NO_RESOURCES for an
 * @on without the template or the memory and when no host can take it (each host's reason),
 * VM_ERROR_NOT_RUNNING when etcd cannot be reached. */
gboolean hostd_cluster_place(HostdCluster *cluster, const char *on, const char *template_name,
                             guint64 memory_mib, char **ret_host, char **ret_address,
                             GError **error);

/* hostd_cluster_place() that never picks host @except (NULL: any) unless it is @on: where an
 * agent of @except goes when it moves away. */
gboolean hostd_cluster_place_except(HostdCluster *cluster, const char *on, const char *except,
                                    const char *template_name, guint64 memory_mib, char **ret_host,
                                    char **ret_address, GError **error);
/* Where the replicas of an agent of @template_name go: up to @count live hosts of the fleet
 * other than this one, not drained, that have the template; first those of @keep ("h2,h3", may
 * be NULL: the hosts holding its last replica) that still qualify, then placement's choice.
 * *@ret_hosts and *@ret_addresses (GPtrArrays of strings, in step): fewer than @count when the
 * fleet has fewer such hosts, none at all included. Fails with VM_ERROR_NOT_RUNNING when etcd
 * cannot be reached. */
gboolean hostd_cluster_replica_hosts(HostdCluster *cluster, const char *template_name, guint count,
                                     const char *keep, GPtrArray **ret_hosts,
                                     GPtrArray **ret_addresses, GError **error);

/* Takes agent @name's fleet record over for this host: where it says host @from with @epoch,
 * writes {this host, @epoch + 1, @state (NULL: as it was)} with one transaction on the record
 * read, so that of two hosts taking it over from one state, one wins. A move's target calls it
 * with the source as @from once the agent runs there; a source that takes back an agent whose
 * move failed calls it with itself, so a target that is still about to take it over fails.
 * *@ret_epoch (may be NULL): the new epoch. Fails with VM_ERROR_BAD_STATE, saying who owns it,
 * when the record says anything else or changed meanwhile, VM_ERROR_NOT_RUNNING when etcd
 * cannot be reached or has no quorum (nothing was written). */
gboolean hostd_cluster_take(HostdCluster *cluster, const char *name, const char *from,
                            guint64 epoch, const char *state, guint64 *ret_epoch, GError **error);
/* Who owns agent @name in the fleet, when another host does: *@ret_host its id (NULL when no
 * record names another host: none, or this one), *@ret_address its address (NULL when it is
 * down), *@ret_live whether its lease is held. Fails with VM_ERROR_NOT_RUNNING when etcd cannot
 * be reached, VM_ERROR_FAILED for a damaged record. */
gboolean hostd_cluster_locate(HostdCluster *cluster, const char *name, char **ret_host,
                              char **ret_address, gboolean *ret_live, GError **error);

/* Who holds @name's fleet record: *@ret_host its host (NULL when there is no record), *@ret_epoch
 * its epoch. Fails with VM_ERROR_NOT_RUNNING when etcd cannot be reached or has no quorum,
 * VM_ERROR_FAILED for a damaged record. */
gboolean hostd_cluster_owner_of(HostdCluster *cluster, const char *name, char **ret_host,
                                guint64 *ret_epoch, GError **error);

/* Wakes the thread to register or refresh now (tests; a change hostd wants seen soon). */
void hostd_cluster_kick(HostdCluster *cluster);

G_END_DECLS
