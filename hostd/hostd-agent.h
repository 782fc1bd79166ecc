/* Agents: the registry of agents and their lifecycle. One agent = one libvirt domain + one qcow2
 * overlay on its template's base image + one cloud-init NoCloud seed + hostd-generated SSH keys,
 * all under agents/<name>/.
 *
 * This module knows nothing of checkpoints, forks, idle or egress: those are components
 * (hostd-context.h) whose hooks it runs at each step (creating, domain, starting, ready,
 * removing, removed). Every operation is called from a request thread of hostd-server.c.
 * Operations on one agent are serialised by its name lock; different agents proceed in
 * parallel. Functions return a GError in VM_ERROR for the client and never log.
 */
#pragma once

#include <gio/gio.h>

#include "hostd-context.h"
#include "hostd-warm.h"
#include "vm-image.h"
#include "vm-template.h"

G_BEGIN_DECLS

typedef struct {
    const char *name;
    const char *template_name;         /* NULL: "debian-12" */
    guint cpus;                        /* 0: the template's */
    guint memory_mib;                  /* 0: the template's */
    guint disk_gib;                    /* 0: the template's */
    const char *user_data;             /* the user's extra user-data, or NULL */
    gboolean wait;                     /* return only once SSH answers */
    char **ssh_keys;                   /* the user's own public key lines to authorize, or NULL */
    char **secrets;                    /* secrets to grant besides the template's, or NULL */
    char **egress;                     /* egress rules (presets too) added to the template's */
    gboolean cold;                     /* boot, even when the template has a warm image */
    guint disk_limits[VM_DISK_LIMITS]; /* VmDiskLimit, 0: no limit */
    gboolean disk_limits_set[VM_DISK_LIMITS]; /* FALSE: the template's, else hostd.conf's */
} HostdNewRequest;

/* Creates and boots an agent; with @request->wait returns once SSH answers. Builds the
 * template's image first when needed. On any failure everything made so far is removed
 * (domain, disk, seed, keys, record) and the error says why: VM_ERROR_INVALID_ARGUMENT,
 * VM_ERROR_EXISTS, VM_ERROR_NOT_FOUND (template), VM_ERROR_TEMPLATE, VM_ERROR_NO_RESOURCES,
 * VM_ERROR_TIMEOUT (with the console's last lines), VM_ERROR_LIBVIRT, VM_ERROR_IO. Returns the
 * agent's info dictionary (a{sv}). The ssh_keys are checked (hostd_user_keys_check()) before
 * anything is made, then recorded in the agent's dir, where its seed takes them from. The
 * @request->secrets join the template's `secrets:`; the components grant them before the seed is
 * made (hostd-secrets.h), and an unknown one fails with VM_ERROR_NOT_FOUND, nothing made. The
 * @request->egress rules are added to the template's allow rules as `vmctl egress --allow` adds
 * them ("none" first closes the template's); a bad rule fails with VM_ERROR_INVALID_ARGUMENT, an
 * unknown preset with VM_ERROR_NOT_FOUND, before anything is made. */
GVariant *hostd_agent_new(HostdContext *ctx, const HostdNewRequest *request,
                          VmProgressFunc progress, gpointer progress_data, GError **error);

/* Boots a stopped agent (@wait: until SSH answers, then the agent_up hooks run). Starting a
 * running agent is success. Returns its info dictionary. */
GVariant *hostd_agent_start(HostdContext *ctx, const char *name, gboolean wait,
                            VmProgressFunc progress, gpointer progress_data, GError **error);

/* ACPI shutdown, destroy after @timeout_s (0: 60 s) or at once with @force. Stopping a stopped
 * agent is success. Returns its info dictionary. */
GVariant *hostd_agent_stop(HostdContext *ctx, const char *name, gboolean force, guint timeout_s,
                           VmProgressFunc progress, gpointer progress_data, GError **error);

/* Removes the agent entirely. A running agent is refused (VM_ERROR_BAD_STATE) unless @force; a
 * component's agent_removing hook may refuse too (forks standing on its checkpoints). In a
 * fleet its name is released first (where this host owns it): without etcd that fails
 * (VM_ERROR_NOT_RUNNING) and nothing is removed. */
gboolean hostd_agent_rm(HostdContext *ctx, const char *name, gboolean force, GError **error);

/* The agent's info dictionary (see docs/PROTOCOL.md for the fields), with what its memory costs
 * the host while its QEMU runs (hostd_memory_add_agent()). */
GVariant *hostd_agent_info(HostdContext *ctx, const char *name, GError **error);

/* Every agent's info dictionary, sorted by name (aa{sv}). */
GVariant *hostd_agent_list(HostdContext *ctx, GError **error);

/* The template a new agent gets when its request names none. */
#define HOSTD_DEFAULT_TEMPLATE "debian-12"

/* Every agent's state (name -> state, both strings; a HostdClusterAgentsFunc with @data the
 * context), or NULL when the agents cannot be listed. */
GHashTable *hostd_agent_states(gpointer data);

/* An agent name claimed in the fleet for a `new` or fork in progress: given back when the
 * claim goes out of scope still held (the agent was not made). */
typedef struct {
    HostdContext *ctx;
    char *name;
    gboolean held; /* this call made the fleet's record */
    guint64 epoch; /* the record's epoch when this call made it (1); 0: unknown, or no fleet */
} HostdAgentClaim;

/* Claims @name in the fleet (nothing without [cluster]). Fails with VM_ERROR_EXISTS naming the
 * host that owns it, VM_ERROR_NOT_RUNNING when the fleet's etcd cannot be reached. */
gboolean hostd_agent_claim(HostdContext *ctx, const char *name, HostdAgentClaim *claim,
                           GError **error);

/* Gives the name back where @claim still holds it (logged when etcd refuses). Can't fail. */
void hostd_agent_claim_clear(HostdAgentClaim *claim);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(HostdAgentClaim, hostd_agent_claim_clear)

/* The OpenSSH client stanza for @name, or for every agent when @name is NULL. For one agent,
 * *ret_path is a file holding the stanza and *ret_host the Host alias to use with it. */
char *hostd_agent_ssh_config(HostdContext *ctx, const char *name, char **ret_path, char **ret_host,
                             GError **error);

/* <agents dir>/<name>, newly allocated. */
char *hostd_agent_dir(HostdContext *ctx, const char *name);

/* Loads the record of a finished agent; VM_ERROR_INVALID_ARGUMENT for a bad name,
 * VM_ERROR_NOT_FOUND when there is none. */
HostdAgentRecord *hostd_agent_load(HostdContext *ctx, const char *name, GError **error);

/* The records of the agents forked from @source (their record's forked-from), in name order
 * (HostdAgentRecord*); an empty array when there are none. Records that cannot be read are
 * skipped: a half-removed agent pins nothing. Can't fail. */
GPtrArray *hostd_agent_records_forked_from(HostdContext *ctx, const char *source);

/* Loads the record of @name and looks up its domain (both returned on success). */
gboolean hostd_agent_open(HostdContext *ctx, const char *name, HostdAgentRecord **ret_record,
                          virDomainPtr *ret_dom, GError **error);

/* Validates @name, takes its lock and loads its record; on success the caller holds *ret_lock,
 * on failure nothing is held. For the requests that need the record but not the domain. */
HostdAgentRecord *hostd_agent_lock_load(HostdContext *ctx, const char *name, GMutex **ret_lock,
                                        GError **error);

/* Validates @name, takes its lock and opens it (hostd_agent_open()); on success the caller
 * holds *ret_lock, on failure nothing is held. */
gboolean hostd_agent_lock_open(HostdContext *ctx, const char *name, GMutex **ret_lock,
                               HostdAgentRecord **ret_record, virDomainPtr *ret_dom,
                               GError **error);

/* The agent's info dictionary (a{sv}). Can't fail. */
GVariant *hostd_agent_to_variant(HostdContext *ctx, const HostdAgentRecord *r);

/* Records that hostd changed the agent's state now (best effort). */
void hostd_agent_mark_state_change(HostdAgentRecord *r);

/* Sets what the user wants @r to be (HOSTD_WANTED_*) and records it with the state change
 * (best effort, as hostd_agent_mark_state_change()); anything but saved clears shutdown_saved. */
void hostd_agent_set_wanted(HostdAgentRecord *r, const char *wanted);

/* The same, strictly: a failed write of the record is @error (its VM_ERROR code, the message
 * naming the agent and the errno's text), and the record on disk stays as it was. Use it before
 * the change it announces, so that a failure leaves both as they were. */
gboolean hostd_agent_save_wanted(HostdAgentRecord *r, const char *wanted, GError **error);

/* With @r's lock held: runs the components' agent_starting hooks and boots the stopped domain
 * @dom (a saved one restores). Fails with the hook's error or VM_ERROR_LIBVIRT. */
gboolean hostd_agent_boot_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                 GError **error);

/* With @r's lock held: as hostd_agent_boot_locked(), but QEMU starts from the saved state at
 * @memory_path (a libvirt save image of this agent, brought from another host by a move) with
 * @xml as its definition (ABI-compatible with the saved one). Fails as hostd_agent_boot_locked()
 * and with VM_ERROR_LIBVIRT when the state does not load. */
gboolean hostd_agent_restore_locked(HostdContext *ctx, const HostdAgentRecord *r, virDomainPtr dom,
                                    const char *memory_path, const char *xml, GError **error);
/* With @r's name lock held, for an agent whose files came from another host (a move) and that
 * hostd_agent_reserve() gave ports of this host: its host key (its .pub file) pinned at its
 * ports here, its ssh_config written for this host. Fails with VM_ERROR_IO. */
gboolean hostd_agent_rehome(HostdContext *ctx, HostdAgentRecord *r, GError **error);
/* The base image of @r's template, as vm_image_lookup() finds it. */
VmImage *hostd_agent_image(HostdContext *ctx, const HostdAgentRecord *r, GError **error);

/* The agent's domain XML with @disk_file (a file name in its dir) as its disk; components add
 * their part through their agent_domain hook. @image may be NULL: then it is looked up from the
 * agent's template. Fails like vm_image_lookup() and vm_domain_xml_build(). */
char *hostd_agent_domain_xml(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                             const char *disk_file, GError **error);

/* The same, with @genid (NULL: none) as its VM generation ID: a definition given with a saved
 * state must carry the saved one, which libvirt checks and made new when it last restored. With
 * @backing_chain (VmDomainSpec's: the images below the disk, top-down, from hostd's records),
 * libvirt reads no header of those images; NULL: the components' agent_domain hooks may give it
 * (the checkpoint component's does for the record's active overlay). */
char *hostd_agent_domain_xml_genid(HostdContext *ctx, const HostdAgentRecord *r,
                                   const VmImage *image, const char *disk_file, const char *genid,
                                   const char *const *backing_chain, GError **error);

/* Defines @r's domain as @xml in libvirt and keeps it as hostd's copy (HOSTD_AGENT_DOMAIN_XML,
 * what start-up defines again should libvirt lose it). Fails with VM_ERROR_LIBVIRT, its message
 * led by @what, or as vm_file_write_atomic(). */
gboolean hostd_agent_define(HostdContext *ctx, const HostdAgentRecord *r, const char *xml,
                            const char *what, GError **error);

/* With @r's name lock held (not ctx->lock): gives @r another port of the range in place of its
 * public SSH port, or of its QEMU's forward (@backend), because another process took it; records
 * it (record, known_hosts pins, ssh_config) and says so in the log and the event log. *@ret_fd
 * gets the socket that holds the new port (hostd_allocate_port()): hand it to the relay, or close
 * it right before QEMU starts. Fails as hostd_allocate_port() and the writes. */
gboolean hostd_agent_move_port(HostdContext *ctx, HostdAgentRecord *r, gboolean backend,
                               int *ret_fd, GError **error);

/* A VM generation ID of @r's own, for an agent made from a warm image: the same at each of its
 * definitions (so its saves and checkpoints restore), and not the warm image's; derived from its
 * UUID. Newly allocated. */
char *hostd_agent_genid(const HostdAgentRecord *r);

/* With the new agent's name lock held: allocates its two ports and writes its record (phase
 * "creating") in a new directory r->dir, so a crash from here on is rolled back at start-up. */
gboolean hostd_agent_reserve(HostdContext *ctx, HostdAgentRecord *r, GError **error);

/* With the name lock held, after hostd_agent_reserve(): runs the components' agent_creating
 * hooks, makes keys, disk (on the template's image, on r->warm_base for an agent made from a
 * warm image, or on r->fork_base for a fork), seed and domain, boots it, or with @warm restores
 * @warm's memory and gives it its identity (docs/INSTANT.md; when that fails, logged, the disk is
 * made again on the template's image and the agent boots), and (with @wait) waits for SSH and
 * cloud-init, runs the agent_up then the agent_ready hooks, then marks the record ready. On
 * failure everything made is removed, record included. */
gboolean hostd_agent_create(HostdContext *ctx, HostdAgentRecord *r, const VmTemplate *tpl,
                            const VmImage *image, const HostdWarmImage *warm, const char *user_data,
                            gboolean wait, VmProgressFunc progress, gpointer progress_data,
                            GError **error);

/* With @r's lock held, once its guest answers SSH after hostd booted, restored or resumed it:
 * runs the components' agent_up hooks. Can't fail. */
void hostd_agent_emit_up(HostdContext *ctx, const HostdAgentRecord *r);

/* Undoes a partial `new` (or removes what a crash left): the components' agent_removed hooks,
 * the domain, then the agent's directory. Best effort: it runs on failure paths. */
void hostd_agent_rollback(HostdContext *ctx, const char *name, const char *dir);

G_END_DECLS
