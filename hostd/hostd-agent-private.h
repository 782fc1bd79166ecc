/* What hostd's modules share about agents beyond hostd-agent.h: the per-name lock, record
 * loading, the domain XML, waiting for SSH. Not for vmctl or common/. */
#pragma once

#include "hostd-agent.h"
#include "vm-image.h"
#include "vm-template.h"

G_BEGIN_DECLS

/* Takes the per-agent lock of @name (operations on one agent never interleave); release with
 * hostd_name_unlock() or g_autoptr(HostdNameLock). */
GMutex *hostd_name_lock(HostdContext *ctx, const char *name);
void hostd_name_unlock(GMutex *lock);
/* Like hostd_name_lock() but returns NULL at once when the lock is taken. */
GMutex *hostd_name_trylock(HostdContext *ctx, const char *name);
typedef GMutex HostdNameLock;
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdNameLock, hostd_name_unlock)

/* Reports progress when @progress is set. Can't fail. */
void hostd_progress(VmProgressFunc progress, gpointer data, const char *message, double fraction);

/* <agents dir>/<name>, newly allocated. */
char *hostd_agent_dir(HostdContext *ctx, const char *name);

/* Loads the record of a finished agent; VM_ERROR_INVALID_ARGUMENT for a bad name,
 * VM_ERROR_NOT_FOUND when there is none. */
HostdAgentRecord *hostd_agent_load(HostdContext *ctx, const char *name, GError **error);

/* Loads the record of @name and looks up its domain (both returned on success). */
gboolean hostd_agent_open(HostdContext *ctx, const char *name, HostdAgentRecord **ret_record,
                          virDomainPtr *ret_dom, GError **error);

/* Validates @name, takes its lock and opens it (hostd_agent_open()); on success the caller
 * holds *ret_lock, on failure nothing is held. */
gboolean hostd_agent_lock_open(HostdContext *ctx, const char *name, GMutex **ret_lock,
                               HostdAgentRecord **ret_record, virDomainPtr *ret_dom,
                               GError **error);

/* The agent's info dictionary (a{sv}). Can't fail. */
GVariant *hostd_agent_to_variant(HostdContext *ctx, const HostdAgentRecord *r);

/* Records that hostd changed the agent's state now (best effort). */
void hostd_agent_mark_state_change(HostdAgentRecord *r);

/* The base image of @r's template, as vm_image_lookup() finds it. */
VmImage *hostd_agent_image(HostdContext *ctx, const HostdAgentRecord *r, GError **error);

/* The agent's domain XML with @disk_file (a file name in its dir) as its disk. @image may be
 * NULL: then it is looked up from the agent's template. Fails like vm_image_lookup() and
 * vm_domain_xml_build(). */
char *hostd_agent_domain_xml(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                             const char *disk_file, GError **error);

/* Waits until the agent answers SSH, reporting progress; on timeout the error carries the
 * console's last lines. */
gboolean hostd_agent_wait_ssh(HostdContext *ctx, const HostdAgentRecord *r, VmProgressFunc progress,
                              gpointer progress_data, GError **error);

/* Runs @argv in the running agent (as its user) with @stdin_fd (or -1: no input) as its input,
 * and returns its exit status; the first few KiB of its stderr go to *ret_stderr when not NULL
 * (newly allocated). Fails with VM_ERROR_SSH / VM_ERROR_IO when it could not run it. */
gboolean hostd_agent_run(HostdContext *ctx, const HostdAgentRecord *r, char **argv, int stdin_fd,
                         int *ret_status, char **ret_stderr, GError **error);

/* After the first boot: waits until cloud-init has finished inside the agent. */
gboolean hostd_agent_wait_first_boot(HostdContext *ctx, const HostdAgentRecord *r,
                                     VmProgressFunc progress, gpointer progress_data,
                                     GError **error);

/* Loads shipped template @name (VM_ERROR_NOT_FOUND when there is none). */
VmTemplate *hostd_template_load(HostdContext *ctx, const char *name, GError **error);

/* Refuses sizes this host cannot give (VM_ERROR_NO_RESOURCES) and a nearly full disk. */
gboolean hostd_check_resources(HostdContext *ctx, guint cpus, guint memory_mib, guint disk_gib,
                               GError **error);

/* A random locally administered MAC in QEMU's 52:54:00 range, newly allocated. */
char *hostd_random_mac(void);

/* The agent's /etc/machine-id: its UUID as 32 lower-case hex digits, newly allocated. */
char *hostd_agent_machine_id(const HostdAgentRecord *r);

/* With the new agent's name lock held: allocates its two ports and writes its record (phase
 * "creating") in a new directory r->dir, so a crash from here on is rolled back at start-up. */
gboolean hostd_agent_reserve(HostdContext *ctx, HostdAgentRecord *r, GError **error);

/* With the name lock held, after hostd_agent_reserve(): makes keys, disk (on the template's
 * image, or on r->fork_base for a fork), seed and domain, boots it and (with @wait) waits for
 * SSH and cloud-init, then marks the record ready. On failure everything made is removed,
 * record included. */
gboolean hostd_agent_create(HostdContext *ctx, HostdAgentRecord *r, const VmTemplate *tpl,
                            const VmImage *image, const char *user_data, gboolean wait,
                            VmProgressFunc progress, gpointer progress_data, GError **error);

/* Runs a helper program (argv[0] looked up in PATH); its stderr becomes the error message
 * (VM_ERROR_IO). */
gboolean hostd_run(const char *const *argv, GError **error);

/* hostd_run() that also returns what the program wrote on stdout (newly allocated). */
gboolean hostd_run_output(const char *const *argv, char **ret_stdout, GError **error);

/* Bytes a file takes on disk (allocated blocks); 0 when it does not exist. */
guint64 hostd_file_allocated(const char *path);

G_END_DECLS
