/* Forks: a new agent whose disk is a copy-on-write overlay on a checkpoint of another agent, with
 * an identity of its own (name, UUID, MAC, ports, keys, host keys, machine-id, hostname,
 * instance-id). The source keeps running; its checkpoint images that a fork reads are pinned
 * until the fork goes. */
#pragma once

#include "hostd-agent.h"
#include "vm-checkpoint.h"

G_BEGIN_DECLS

typedef struct {
    const char *name;       /* the new agent */
    const char *source;     /* the agent it is forked from */
    const char *checkpoint; /* the source's checkpoint to fork from; NULL: take one now */
    guint cpus;             /* 0: the source's */
    guint memory_mib;       /* 0: the source's */
    gboolean wait;          /* return only once SSH answers and cloud-init is done */
} HostdForkRequest;

/* Creates agent @request->name on a checkpoint of @request->source (taken now, live, when
 * @request->checkpoint is NULL) and boots it with a new identity; the first boot resets what
 * identifies the machine and nothing else (the source's users and files stay). The checkpoint
 * the fork stands on is returned in *ret_checkpoint. On failure nothing is left: no agent, and no
 * checkpoint taken for it. Fails with VM_ERROR_INVALID_ARGUMENT (bad name), VM_ERROR_EXISTS,
 * VM_ERROR_NOT_FOUND (source or checkpoint), VM_ERROR_NO_RESOURCES, and whatever
 * hostd_agent_new() fails with. Returns the new agent's info dictionary. */
GVariant *hostd_fork(HostdContext *ctx, const HostdForkRequest *request, char **ret_checkpoint,
                     VmProgressFunc progress, gpointer progress_data, GError **error);

/* The names of the agents forked from @source, joined with ", ", or NULL when there are none. */
char *hostd_fork_list(HostdContext *ctx, const char *source);

/* With @source's lock held: the name of a fork whose disk reads checkpoint @id of @source (it
 * stands on @id or on a checkpoint above it), or NULL. Removing such a checkpoint would change or
 * delete an image the fork reads. */
char *hostd_fork_standing_on(HostdContext *ctx, const HostdAgentRecord *source,
                             const VmCheckpointSet *set, const char *id);

G_END_DECLS
