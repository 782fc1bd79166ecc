#include "hostd-libvirt.h"

#include <errno.h>
#include <libvirt/virterror.h>
#include <string.h>
#include <unistd.h>

#include "hostd-accel.h"
#include "vm-error.h"
#include "vm-util.h"

static void
hostd_libvirt_quiet_error(void *opaque, virErrorPtr err)
{
    /* libvirt prints every error to stderr unless a handler is installed; errors reach the
     * user through hostd_libvirt_throw() instead. */
}

static gpointer
hostd_libvirt_event_thread(gpointer data)
{
    for (;;)
        virEventRunDefaultImpl();
    return NULL;
}

char *
hostd_libvirt_default_uri(const char *state_dir)
{
    g_autofree char *root = g_build_filename(state_dir, "libvirt", NULL);
    return g_strdup_printf("qemu:///embed?root=%s", root);
}

gboolean
hostd_libvirt_throw(GError **error, const char *what)
{
    const virError *err = virGetLastError();
    const char *message = err != NULL && err->message != NULL ? err->message : "unknown error";
    VmErrorCode code = VM_ERROR_LIBVIRT;

    if (err != NULL && (err->code == VIR_ERR_NO_DOMAIN))
        code = VM_ERROR_NOT_FOUND;
    g_set_error(error, VM_ERROR, code, "%s: %s", what, message);
    virResetLastError();
    return FALSE;
}

char *
hostd_libvirt_take_error(const char *fallback, int *ret_code)
{
    const virError *err = virGetLastError();
    char *message = g_strdup(err != NULL && err->message != NULL ? err->message : fallback);

    if (ret_code != NULL)
        *ret_code = err != NULL ? err->code : VIR_ERR_OK;
    virResetLastError();
    return message;
}

/* The embedded driver reads <root>/etc/qemu.conf, which hostd writes:
 * - QEMU logs to plain files: the default goes through virtlogd, a daemon that need not run here.
 * - libvirt's seccomp filter is off: it denies spawning, and the egress guest forward spawns a
 *   helper per guest connection (QEMU dies of the filter at the guest's first connection to the
 *   proxy). Every domain brings its own filter instead, VM_DOMAIN_SANDBOX in
 *   templates/vm-domain.h, which denies the rest of what libvirt's does.
 * A file hostd wrote earlier is brought up to date; any other file is the administrator's and is
 * left alone (egress then works only if it has seccomp_sandbox = 0, see docs/EGRESS.md). */
#define HOSTD_QEMU_CONF_MARKER "# Written by hostd"
static const char hostd_qemu_conf[] = HOSTD_QEMU_CONF_MARKER
    ": QEMU logs to files, no virtlogd needed.\n"
    "stdio_handler = \"file\"\n"
    "# Each domain carries its own seccomp filter, one that lets the egress guest forward\n"
    "# spawn its helper (see docs/EGRESS.md).\n"
    "seccomp_sandbox = 0\n";

char *
hostd_libvirt_embed_root(const char *uri)
{
    g_autoptr(GUri) parsed = g_uri_parse(uri, G_URI_FLAGS_ENCODED_QUERY, NULL);
    if (parsed == NULL || g_strcmp0(g_uri_get_scheme(parsed), "qemu") != 0 ||
        g_strcmp0(g_uri_get_path(parsed), "/embed") != 0 || g_uri_get_query(parsed) == NULL)
        return NULL;
    g_autoptr(GHashTable) params =
        g_uri_parse_params(g_uri_get_query(parsed), -1, "&", G_URI_PARAMS_NONE, NULL);
    const char *root = params != NULL ? g_hash_table_lookup(params, "root") : NULL;
    return root != NULL && root[0] != '\0' ? g_strdup(root) : NULL;
}

/* Whether libvirt's seccomp filter is off in @conf (qemu.conf syntax: "key = value" lines). */
static gboolean
hostd_libvirt_conf_sandbox_off(const char *conf)
{
    g_autofree char *text = NULL;
    g_auto(GStrv) lines = NULL;
    gboolean off = FALSE;

    if (!g_file_get_contents(conf, &text, NULL, NULL))
        return FALSE;
    lines = g_strsplit(text, "\n", -1);
    for (char **line = lines; *line != NULL; line++) {
        g_auto(GStrv) kv = g_strsplit(*line, "=", 2);

        if (kv[0] == NULL || kv[1] == NULL || g_str_has_prefix(g_strstrip(kv[0]), "#"))
            continue;
        if (g_str_equal(kv[0], "seccomp_sandbox"))
            off = g_str_equal(g_strstrip(kv[1]), "0");
    }
    return off;
}

gboolean
hostd_libvirt_qemu_may_spawn(const char *uri)
{
    g_autofree char *root = hostd_libvirt_embed_root(uri);
    if (root == NULL)
        return FALSE;
    g_autofree char *conf = g_build_filename(root, "etc", "qemu.conf", NULL);
    return hostd_libvirt_conf_sandbox_off(conf);
}

static gboolean
hostd_libvirt_prepare_embed_root(const char *root, GError **error)
{
    g_autofree char *etc = g_build_filename(root, "etc", NULL);
    g_autofree char *conf = g_build_filename(etc, "qemu.conf", NULL);
    g_autofree char *existing = NULL;
    if (g_file_get_contents(conf, &existing, NULL, NULL) &&
        (!g_str_has_prefix(existing, HOSTD_QEMU_CONF_MARKER) ||
         g_str_equal(existing, hostd_qemu_conf)))
        return TRUE;
    if (g_mkdir_with_parents(etc, 0755) < 0)
        return vm_throw_errno(error, errno, "cannot create %s", etc);
    return vm_file_write_atomic(conf, hostd_qemu_conf, -1, 0644, error);
}

HostdLibvirt *
hostd_libvirt_open(const char *uri, HostdAccelMode accel_mode, GError **error)
{
    static gsize once = 0;
    static GThread *event_thread = NULL;

    if (g_once_init_enter(&once)) {
        virSetErrorFunc(NULL, hostd_libvirt_quiet_error);
        if (virEventRegisterDefaultImpl() < 0)
            g_error("cannot register libvirt's event loop");
        event_thread = g_thread_new("libvirt-events", hostd_libvirt_event_thread, NULL);
        g_once_init_leave(&once, 1);
    }

    g_autofree char *embed_root = hostd_libvirt_embed_root(uri);
    if (embed_root != NULL && !hostd_libvirt_prepare_embed_root(embed_root, error))
        return NULL;
    virConnectPtr conn = virConnectOpen(uri);
    if (conn == NULL) {
        g_autofree char *what = g_strdup_printf("cannot connect to %s", uri);
        hostd_libvirt_throw(error, what);
        return NULL;
    }

    HostdLibvirt *lv = g_new0(HostdLibvirt, 1);
    lv->conn = conn;
    lv->uri = g_strdup(uri);
    lv->qemu_may_spawn = hostd_libvirt_qemu_may_spawn(uri);
    g_autoptr(HostdAccel) accel = hostd_accel_detect(accel_mode, NULL, NULL);
    lv->virt_type = g_steal_pointer(&accel->virt_type);
    lv->cpu_disable = g_steal_pointer(&accel->cpu_disable);
    lv->accel_summary = g_steal_pointer(&accel->summary);
    lv->event_thread = event_thread;
    g_mutex_init(&lv->alias_lock);
    lv->domain_of = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    lv->agent_of = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    return lv;
}

void
hostd_libvirt_close(HostdLibvirt *lv)
{
    if (lv == NULL)
        return;
    if (lv->conn != NULL)
        virConnectClose(lv->conn);
    g_free(lv->uri);
    g_free(lv->virt_type);
    g_strfreev(lv->cpu_disable);
    g_free(lv->accel_summary);
    g_clear_pointer(&lv->domain_of, g_hash_table_unref);
    g_clear_pointer(&lv->agent_of, g_hash_table_unref);
    g_mutex_clear(&lv->alias_lock);
    g_free(lv);
}

void
hostd_libvirt_alias_set(HostdLibvirt *lv, const char *agent, const char *domain)
{
    g_mutex_lock(&lv->alias_lock);
    const char *old = g_hash_table_lookup(lv->domain_of, agent);
    if (old != NULL)
        g_hash_table_remove(lv->agent_of, old);
    g_hash_table_remove(lv->domain_of, agent);
    if (domain != NULL && !g_str_equal(domain, agent)) {
        g_hash_table_insert(lv->domain_of, g_strdup(agent), g_strdup(domain));
        g_hash_table_insert(lv->agent_of, g_strdup(domain), g_strdup(agent));
    }
    g_mutex_unlock(&lv->alias_lock);
}

char *
hostd_libvirt_domain_name(HostdLibvirt *lv, const char *agent)
{
    g_mutex_lock(&lv->alias_lock);
    const char *domain = g_hash_table_lookup(lv->domain_of, agent);
    char *name = g_strdup(domain != NULL ? domain : agent);
    g_mutex_unlock(&lv->alias_lock);
    return name;
}

char *
hostd_libvirt_agent_name(HostdLibvirt *lv, virDomainPtr dom)
{
    const char *domain = virDomainGetName(dom);
    if (domain == NULL)
        return NULL;
    g_mutex_lock(&lv->alias_lock);
    const char *agent = g_hash_table_lookup(lv->agent_of, domain);
    char *name = g_strdup(agent != NULL ? agent : domain);
    g_mutex_unlock(&lv->alias_lock);
    return name;
}

virDomainPtr
hostd_libvirt_lookup(HostdLibvirt *lv, const char *name, GError **error)
{
    g_autofree char *domain = hostd_libvirt_domain_name(lv, name);
    virDomainPtr dom = virDomainLookupByName(lv->conn, domain);
    if (dom != NULL)
        return dom;
    const virError *err = virGetLastError();
    if (err == NULL || err->code == VIR_ERR_NO_DOMAIN) {
        virResetLastError();
        return NULL;
    }
    hostd_libvirt_throw(error, "cannot look up domain");
    return NULL;
}

const char *
hostd_libvirt_state_name(virDomainPtr dom)
{
    int state = 0, reason = 0;

    if (virDomainGetState(dom, &state, &reason, 0) < 0) {
        virResetLastError();
        return "unknown";
    }
    switch (state) {
    case VIR_DOMAIN_RUNNING:
        return "running";
    case VIR_DOMAIN_BLOCKED:
        return "running";
    case VIR_DOMAIN_PAUSED:
        return "paused";
    case VIR_DOMAIN_SHUTDOWN:
        return "stopping";
    case VIR_DOMAIN_CRASHED:
        return "crashed";
    case VIR_DOMAIN_PMSUSPENDED:
        return "paused";
    case VIR_DOMAIN_SHUTOFF: {
        int has_save = virDomainHasManagedSaveImage(dom, 0);
        if (has_save < 0)
            virResetLastError();
        return has_save > 0 ? "saved" : "stopped";
    }
    case VIR_DOMAIN_NOSTATE:
    default:
        return "unknown";
    }
}

gboolean
hostd_libvirt_is_active(virDomainPtr dom)
{
    int active = virDomainIsActive(dom);
    if (active < 0)
        virResetLastError();
    return active == 1;
}

gboolean
hostd_libvirt_remove(HostdLibvirt *lv, const char *name, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(virDomain) dom = hostd_libvirt_lookup(lv, name, &local_error);

    if (dom == NULL) {
        if (local_error != NULL) {
            g_propagate_error(error, g_steal_pointer(&local_error));
            return FALSE;
        }
        return TRUE;
    }
    if (hostd_libvirt_is_active(dom) && virDomainDestroy(dom) < 0) {
        /* The embedded driver reports "Domain not found" for a domain it did kill; what
         * matters is that it is no longer active. */
        if (hostd_libvirt_is_active(dom))
            return hostd_libvirt_throw(error, "cannot stop domain");
        virResetLastError();
    }
    unsigned int flags = VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA |
                         VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA | VIR_DOMAIN_UNDEFINE_NVRAM;
    if (virDomainUndefineFlags(dom, flags) < 0) {
        const virError *err = virGetLastError();
        /* Drivers without checkpoints or NVRAM (the test driver) refuse those flags. */
        if (err != NULL && err->code == VIR_ERR_INVALID_ARG) {
            virResetLastError();
            flags &= ~(VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA | VIR_DOMAIN_UNDEFINE_NVRAM);
            if (virDomainUndefineFlags(dom, flags) == 0)
                return TRUE;
            err = virGetLastError();
        }
        if (err != NULL && err->code == VIR_ERR_NO_DOMAIN) {
            virResetLastError();
            return TRUE;
        }
        return hostd_libvirt_throw(error, "cannot undefine domain");
    }
    return TRUE;
}

gboolean
hostd_libvirt_stop(HostdLibvirt *lv, virDomainPtr dom, gboolean force, guint timeout_s,
                   GError **error)
{
    if (!hostd_libvirt_is_active(dom))
        return TRUE;

    if (!force) {
        if (virDomainShutdownFlags(dom, VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN) < 0) {
            virResetLastError();
        } else {
            gint64 deadline = g_get_monotonic_time() + (gint64)timeout_s * G_USEC_PER_SEC;
            while (g_get_monotonic_time() < deadline) {
                if (!hostd_libvirt_is_active(dom))
                    return TRUE;
                g_usleep(200 * 1000);
            }
        }
    }
    if (virDomainDestroy(dom) < 0 && hostd_libvirt_is_active(dom))
        return hostd_libvirt_throw(error, "cannot stop domain");
    virResetLastError();
    return TRUE;
}
