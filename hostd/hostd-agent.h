/* Agents: one agent = one libvirt domain + one qcow2 overlay on its template's base image +
 * one cloud-init NoCloud seed + hostd-generated SSH keys, all under agents/<name>/.
 *
 * Every operation here is called from a request thread of hostd-server.c. Operations on one
 * agent are serialised by a per-name lock; different agents proceed in parallel. Functions
 * return a GError in VM_ERROR for the client and never log.
 */
#pragma once

#include <gio/gio.h>

#include "hostd-config.h"
#include "hostd-libvirt.h"
#include "hostd-ssh.h"
#include "hostd-state.h"
#include "vm-progress.h"

G_BEGIN_DECLS

typedef struct {
    HostdConfig *config;
    HostdState *state;
    HostdLibvirt *lv;
    HostdSshPool *ssh;
    GMutex lock;               /* guards name_locks and port allocation */
    GHashTable *name_locks;    /* agent name -> GMutex*, for the life of hostd */
    struct _HostdRelay *relay; /* the public SSH ports (hostd-power.c); NULL until started */
    struct _HostdPower *power; /* per-agent sessions, keep-awake, idle state (hostd-power.c) */
    void (*log)(const char *message); /* where hostd's background work reports; may be NULL */
} HostdContext;

/* Builds the context around already-opened parts (ownership passes to it). Can't fail. */
HostdContext *hostd_context_new(HostdConfig *config, HostdState *state, HostdLibvirt *lv);
void hostd_context_free(HostdContext *ctx);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdContext, hostd_context_free)

typedef struct {
    const char *name;
    const char *template_name; /* NULL: "debian-12" */
    guint cpus;                /* 0: the template's */
    guint memory_mib;          /* 0: the template's */
    guint disk_gib;            /* 0: the template's */
    const char *user_data;     /* the user's extra user-data, or NULL */
    gboolean wait;             /* return only once SSH answers */
} HostdNewRequest;

/* Creates and boots an agent; with @request->wait returns once SSH answers. Builds the
 * template's image first when needed. On any failure everything made so far is removed
 * (domain, disk, seed, keys, record) and the error says why: VM_ERROR_INVALID_ARGUMENT,
 * VM_ERROR_EXISTS, VM_ERROR_NOT_FOUND (template), VM_ERROR_TEMPLATE, VM_ERROR_NO_RESOURCES,
 * VM_ERROR_TIMEOUT (with the console's last lines), VM_ERROR_LIBVIRT, VM_ERROR_IO. Returns the
 * agent's info dictionary (a{sv}). */
GVariant *hostd_agent_new(HostdContext *ctx, const HostdNewRequest *request,
                          VmProgressFunc progress, gpointer progress_data, GError **error);

/* Boots a stopped agent (@wait: until SSH answers). Starting a running agent is success.
 * Returns its info dictionary. */
GVariant *hostd_agent_start(HostdContext *ctx, const char *name, gboolean wait,
                            VmProgressFunc progress, gpointer progress_data, GError **error);

/* ACPI shutdown, destroy after @timeout_s (0: 60 s) or at once with @force. Stopping a stopped
 * agent is success. Returns its info dictionary. */
GVariant *hostd_agent_stop(HostdContext *ctx, const char *name, gboolean force, guint timeout_s,
                           VmProgressFunc progress, gpointer progress_data, GError **error);

/* Removes the agent entirely. A running agent is refused (VM_ERROR_BAD_STATE) unless @force. */
gboolean hostd_agent_rm(HostdContext *ctx, const char *name, gboolean force, GError **error);

/* The agent's info dictionary (see docs/PROTOCOL.md for the fields). */
GVariant *hostd_agent_info(HostdContext *ctx, const char *name, GError **error);

/* Every agent's info dictionary, sorted by name (aa{sv}). */
GVariant *hostd_agent_list(HostdContext *ctx, GError **error);

/* The OpenSSH client stanza for @name, or for every agent when @name is NULL. For one agent,
 * *ret_path is a file holding the stanza and *ret_host the Host alias to use with it. */
char *hostd_agent_ssh_config(HostdContext *ctx, const char *name, char **ret_path, char **ret_host,
                             GError **error);

/* Runs a command in a running agent, relaying its I/O with the client on @client_fd (see
 * hostd_ssh_exec()). Fails with VM_ERROR_NOT_FOUND, VM_ERROR_BAD_STATE (not running), or what
 * hostd_ssh_exec() fails with; on failure no EXIT frame was sent. */
gboolean hostd_agent_exec(HostdContext *ctx, const char *name, const HostdExecRequest *request,
                          int client_fd, GError **error);

/* Every shipped template with whether its image is ready (aa{sv}). */
GVariant *hostd_template_list(HostdContext *ctx, GError **error);

/* Builds or downloads a template's image (idempotent unless @force). Returns the image dir. */
char *hostd_template_build(HostdContext *ctx, const char *name, gboolean force,
                           VmProgressFunc progress, gpointer progress_data, GError **error);

/* Brings the state directory and libvirt into agreement at start-up: rolls back agents whose
 * `new` never finished, redefines domains libvirt lost from the agent's saved domain XML, and
 * leaves running agents running. Appends one human-readable line per action to @notes. */
gboolean hostd_reconcile(HostdContext *ctx, GPtrArray *notes, GError **error);

G_END_DECLS
