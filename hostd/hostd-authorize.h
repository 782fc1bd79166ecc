/* The users' own SSH keys in an agent (vmctl authorize, vmctl new --ssh-key), so that a user
 * logs in with a key of theirs and no key of hostd's has to leave the host.
 *
 * hostd keeps the record (HOSTD_AGENT_USER_KEYS in the agent's dir, 0600) and makes the guest's
 * ~/.ssh/authorized_keys hold exactly the recorded keys among the lines it marks as its own
 * (HOSTD_USER_KEY_MARK), next to whatever else is there: hostd's own key, lines the user wrote
 * inside. The record is what --list shows, and the guest follows it: at each change (in the
 * running guest, one command), at the first boot (through the seed), and each time hostd waits
 * for the agent to answer SSH after booting, restoring or resuming it (agent_up), since a
 * restore or a fork brings back a disk of another time. A fork starts with its source's record.
 */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* The component: copies a fork's source's record (agent_creating), authorizes the recorded keys
 * in a new agent's seed (agent_seed), applies the record when the agent comes up (agent_up). */
extern const HostdComponent hostd_authorize_component;

/* Authorizes @lines (NULL-terminated public key lines, checked with hostd_user_keys_check()
 * before anything else) in the running agent @name: wakes a paused or saved agent, writes the
 * guest's authorized_keys, then the record. A key it already has is not added again
 * (*@ret_added counts the new ones), but the guest is brought in line with the record all the
 * same. Fails with VM_ERROR_INVALID_ARGUMENT, VM_ERROR_NOT_FOUND (no agent),
 * VM_ERROR_BAD_STATE (stopped), VM_ERROR_NO_RESOURCES (more than VM_SSH_KEYS_MAX keys),
 * VM_ERROR_SSH or VM_ERROR_FAILED (the guest), VM_ERROR_IO (the record). Returns the agent's keys
 * now (aa{sv}, hostd_user_key_to_variant()). */
GVariant *hostd_authorize_add(HostdContext *ctx, const char *name, const char *const *lines,
                              guint *ret_added, GError **error);

/* Takes the key whose fingerprint is @fingerprint ("SHA256:...") out of the running agent @name,
 * as hostd_authorize_add() puts keys in. Fails as it does, and with VM_ERROR_NOT_FOUND when the
 * agent has no such key (before the agent is touched). Returns the agent's keys now. */
GVariant *hostd_authorize_rm(HostdContext *ctx, const char *name, const char *fingerprint,
                             GError **error);

/* The agent's keys, from the record (any state): aa{sv}. Fails with VM_ERROR_NOT_FOUND or
 * VM_ERROR_INVALID_ARGUMENT (no such agent), VM_ERROR_IO or VM_ERROR_FAILED (the record). */
GVariant *hostd_authorize_list(HostdContext *ctx, const char *name, GError **error);

G_END_DECLS
