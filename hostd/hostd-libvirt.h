/* hostd's libvirt connection: the event loop, the error translator, and the few domain calls
 * hostd makes. Only hostd links libvirt. */
#pragma once

#include <gio/gio.h>
#include "hostd-accel.h"
#include "hostd-cleanup.h"

G_BEGIN_DECLS

typedef struct {
    virConnectPtr conn;
    char *uri;
    char *virt_type;     /* "kvm" or "qemu" */
    char **cpu_disable;  /* host CPU features hidden from KVM guests (hostd-accel.h) */
    char *accel_summary; /* which accelerator, and why, in one line */
    /* QEMU may spawn a helper (the egress guest forward): libvirt's seccomp filter is off in the
     * embedded driver's qemu.conf. FALSE for any other connection. */
    gboolean qemu_may_spawn;
    GThread *event_thread;
    /* Agents whose domain has another name (an agent made from a warm pool's machine keeps the
     * name its domain was restored under: libvirt renames no running domain). Agent name ->
     * domain name, and back; under alias_lock. */
    GMutex alias_lock;
    GHashTable *domain_of;
    GHashTable *agent_of;
} HostdLibvirt;

/* Builds the default URI for @state_dir: qemu:///embed?root=<state_dir>/libvirt. */
char *hostd_libvirt_default_uri(const char *state_dir);

/* The root= of an embedded driver URI (qemu:///embed?root=DIR[&...]), newly allocated, or NULL
 * for any other URI. The one reader of hostd's URIs. */
char *hostd_libvirt_embed_root(const char *uri);

/* Whether QEMU under @uri may spawn a helper: an embedded driver whose qemu.conf turns libvirt's
 * seccomp filter off (seccomp_sandbox = 0). Read once at open into qemu_may_spawn. */
gboolean hostd_libvirt_qemu_may_spawn(const char *uri);

/* Registers libvirt's default event loop (once per process), starts a thread running it,
 * silences libvirt's stderr printing, and opens @uri read-write. Decides the virtualisation
 * type and guest CPU with hostd_accel_detect(@accel_mode). Fails with VM_ERROR_LIBVIRT. */
HostdLibvirt *hostd_libvirt_open(const char *uri, HostdAccelMode accel_mode, GError **error);

/* Closes the connection; running domains keep running. Accepts NULL. */
void hostd_libvirt_close(HostdLibvirt *lv);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdLibvirt, hostd_libvirt_close)

/* Turns libvirt's last error into VM_ERROR_LIBVIRT "@what: <libvirt message>" and returns
 * FALSE. The one translator for libvirt errors. */
gboolean hostd_libvirt_throw(GError **error, const char *what);

/* Clears libvirt's last error (this thread's) and returns its message, newly allocated, or a copy
 * of @fallback when libvirt recorded none; with @ret_code non-NULL also its virErrorNumber
 * (VIR_ERR_OK when none), so a caller can tell VIR_ERR_NO_DOMAIN and friends apart. For failures
 * that are logged or worked around; hostd_libvirt_throw() is for those that fail a request.
 * Can't fail. */
char *hostd_libvirt_take_error(const char *fallback, int *ret_code);

/* Records that agent @agent's domain is named @domain (NULL or @agent itself: the same name, the
 * alias dropped). Every lookup, removal and event by name goes through it. Can't fail. */
void hostd_libvirt_alias_set(HostdLibvirt *lv, const char *agent, const char *domain);

/* The name of agent @agent's domain, newly allocated: its alias, else @agent. Can't fail. */
char *hostd_libvirt_domain_name(HostdLibvirt *lv, const char *agent);

/* The agent whose domain is @dom, newly allocated: the alias's agent, else the domain's own
 * name; NULL when libvirt gives no name. Can't fail. */
char *hostd_libvirt_agent_name(HostdLibvirt *lv, virDomainPtr dom);

/* Looks agent @name's domain up (through its alias, hostd_libvirt_alias_set()). Returns NULL
 * without error when there is none; NULL with VM_ERROR_LIBVIRT on any other failure (check
 * *error). */
virDomainPtr hostd_libvirt_lookup(HostdLibvirt *lv, const char *name, GError **error);

/* Returns the agent-level state name for @dom: "running", "paused", "saved" (has a managed
 * save image), "stopped", "crashed", "starting", "stopping". Can't fail ("unknown"). */
const char *hostd_libvirt_state_name(virDomainPtr dom);

/* TRUE when @dom is active (a QEMU process exists). Can't fail. */
gboolean hostd_libvirt_is_active(virDomainPtr dom);

/* Destroys (if active) and undefines agent @name's domain (through its alias) with its managed save
 * image, snapshots metadata and checkpoints metadata. Missing domain is success. Fails with
 * VM_ERROR_LIBVIRT. */
gboolean hostd_libvirt_remove(HostdLibvirt *lv, const char *name, GError **error);

/* Asks the guest to shut down (ACPI), waits up to @timeout_s for it to stop, then destroys it.
 * With @force destroys at once. Fails with VM_ERROR_LIBVIRT. */
gboolean hostd_libvirt_stop(HostdLibvirt *lv, virDomainPtr dom, gboolean force, guint timeout_s,
                            GError **error);

G_END_DECLS
