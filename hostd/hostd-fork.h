/* Forks: a new agent whose disk is a copy-on-write overlay on a checkpoint of another agent, with
 * an identity of its own (name, UUID, MAC, ports, keys, host keys, machine-id, hostname,
 * instance-id). The source keeps running; its checkpoint images that a fork reads are pinned
 * until the fork goes. */
#pragma once

#include "hostd-context.h"
#include "vm-checkpoint.h"

G_BEGIN_DECLS

/* Forks as a component of the context: `rm` of an agent that forks stand on is refused. */
extern const HostdComponent hostd_fork_component;

typedef struct {
    const char *name;       /* the new agent */
    const char *source;     /* the agent it is forked from */
    const char *checkpoint; /* the source's checkpoint to fork from; NULL: take one now */
    guint cpus;             /* 0: the source's */
    guint memory_mib;       /* 0: the source's */
    gboolean wait;          /* return only once SSH answers and cloud-init is done */
    gboolean grants;        /* give the fork the source's grants, under new placeholders */
    gboolean live;          /* restore the source's memory checkpoint into the fork */
} HostdForkRequest;

/* Creates agent @request->name on a checkpoint of @request->source (taken now, live, when
 * @request->checkpoint is NULL) and boots it with a new identity; with @request->live, the
 * checkpoint (taken now) holds the source's memory too, which is restored into the fork, its
 * identity applied through the guest agent (hostd_warm_restore()); a live fork that cannot be
 * (source not running, other CPUs or memory asked, a restore that fails) boots instead, logged.
 * Otherwise the first boot resets what
 * identifies the machine and nothing else (the source's users and files stay). The checkpoint
 * the fork stands on is returned in *ret_checkpoint. On failure nothing is left: no agent, and no
 * checkpoint taken for it. With @request->grants the fork holds every secret its source holds,
 * each under a new placeholder, from its seed on; without, none (not even its template's). Fails
 * with VM_ERROR_INVALID_ARGUMENT (bad name), VM_ERROR_EXISTS, VM_ERROR_NOT_FOUND (source or
 * checkpoint), VM_ERROR_NO_RESOURCES, and whatever hostd_agent_new() fails with. Returns the new
 * agent's info dictionary. */
GVariant *hostd_fork(HostdContext *ctx, const HostdForkRequest *request, char **ret_checkpoint,
                     VmProgressFunc progress, gpointer progress_data, GError **error);

G_END_DECLS
