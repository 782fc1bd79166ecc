#include "hostd-state.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>

#include "vm-error.h"
#include "vm-name.h"
#include "vm-protocol.h"
#include "vm-util.h"

#define RECORD_GROUP "agent"

char *
hostd_agent_record_path(const HostdAgentRecord *record, const char *file)
{
    return g_build_filename(record->dir, file, NULL);
}

static char *
hostd_record_get_string(GKeyFile *kf, const char *key, gboolean required, const char *path,
                        GError **error)
{
    char *value = g_key_file_get_string(kf, RECORD_GROUP, key, NULL);
    if (value == NULL && required)
        vm_throw(error, VM_ERROR_FAILED, "corrupt agent record %s: no '%s'", path, key);
    return value;
}

/* Numbers are required too: a key that is missing, not a number, or out of range means the
 * record was not written by hostd_agent_record_save(). */
static gboolean
hostd_record_get_number(GKeyFile *kf, const char *key, gint64 min, gint64 max, gint64 *value,
                        const char *path, GError **error)
{
    g_autofree char *text = g_key_file_get_value(kf, RECORD_GROUP, key, NULL);
    char *end = NULL;

    if (text == NULL)
        return vm_throw(error, VM_ERROR_FAILED, "corrupt agent record %s: no '%s'", path, key);
    errno = 0;
    gint64 v = g_ascii_strtoll(text, &end, 10);
    if (text[0] == '\0' || *end != '\0' || errno != 0 || v < min || v > max)
        return vm_throw(error, VM_ERROR_FAILED, "corrupt agent record %s: bad '%s'", path, key);
    *value = v;
    return TRUE;
}

gboolean
hostd_wanted_is_valid(const char *wanted)
{
    return g_strv_contains((const char *const[]){HOSTD_WANTED_RUNNING, HOSTD_WANTED_PAUSED,
                                                 HOSTD_WANTED_SAVED, HOSTD_WANTED_STOPPED, NULL},
                           wanted);
}

gboolean
hostd_restart_policy_is_valid(const char *policy)
{
    return g_strv_contains((const char *const[]){HOSTD_RESTART_ON_CRASH, HOSTD_RESTART_ALWAYS,
                                                 HOSTD_RESTART_NEVER, NULL},
                           policy);
}

/* The record's keys of VmDiskLimit, in its order. */
static const char *const hostd_record_disk_keys[VM_DISK_LIMITS] = {
    [VM_DISK_READ_MIB] = "disk-read",
    [VM_DISK_WRITE_MIB] = "disk-write",
    [VM_DISK_READ_IOPS] = "disk-read-iops",
    [VM_DISK_WRITE_IOPS] = "disk-write-iops",
};

HostdAgentRecord *
hostd_agent_record_load(const char *dir, GError **error)
{
    g_autofree char *path = g_build_filename(dir, HOSTD_AGENT_RECORD, NULL);
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autoptr(GError) local_error = NULL;

    if (!g_key_file_load_from_file(kf, path, G_KEY_FILE_NONE, &local_error)) {
        vm_throw(error, VM_ERROR_IO, "cannot read agent record %s: %s", path, local_error->message);
        return NULL;
    }

    g_autoptr(HostdAgentRecord) r = g_new0(HostdAgentRecord, 1);
    /* An agent made from a warm pool's machine lives in the dir that machine was made in, and
     * its name in agents/ is a link to it: the record names the files where QEMU has them. */
    struct stat st;
    r->dir = lstat(dir, &st) == 0 && S_ISLNK(st.st_mode) ? realpath(dir, NULL) : NULL;
    if (r->dir == NULL)
        r->dir = g_strdup(dir);
    if ((r->name = hostd_record_get_string(kf, "name", TRUE, path, error)) == NULL ||
        (r->uuid = hostd_record_get_string(kf, "uuid", TRUE, path, error)) == NULL ||
        (r->template_name = hostd_record_get_string(kf, "template", TRUE, path, error)) == NULL ||
        (r->phase = hostd_record_get_string(kf, "phase", TRUE, path, error)) == NULL ||
        (r->mac = hostd_record_get_string(kf, "mac", TRUE, path, error)) == NULL ||
        (r->user = hostd_record_get_string(kf, "user", TRUE, path, error)) == NULL ||
        (r->instance_id = hostd_record_get_string(kf, "instance-id", TRUE, path, error)) == NULL)
        return NULL;
    r->forked_from = hostd_record_get_string(kf, "forked-from", FALSE, path, NULL);
    if (r->forked_from != NULL &&
        ((r->fork_checkpoint = hostd_record_get_string(kf, "fork-checkpoint", TRUE, path, error)) ==
             NULL ||
         (r->fork_base = hostd_record_get_string(kf, "fork-base", TRUE, path, error)) == NULL))
        return NULL;
    r->warm_base = hostd_record_get_string(kf, "warm-base", FALSE, path, NULL);
    r->domain = hostd_record_get_string(kf, "domain", FALSE, path, NULL);
    /* A name libvirt and a path take as they are: what an agent's or a template's may be. */
    if (r->domain != NULL && !vm_name_validate_template(r->domain, NULL)) {
        vm_throw(error, VM_ERROR_FAILED, "corrupt agent record %s: bad 'domain'", path);
        return NULL;
    }

    gint64 cpus, memory_mib, disk_gib, ssh_port;
    if (!hostd_record_get_number(kf, "cpus", 1, G_MAXUINT, &cpus, path, error) ||
        !hostd_record_get_number(kf, "memory-mib", 1, G_MAXUINT, &memory_mib, path, error) ||
        !hostd_record_get_number(kf, "disk-gib", 0, G_MAXUINT, &disk_gib, path, error) ||
        !hostd_record_get_number(kf, "ssh-port", 1, 65535, &ssh_port, path, error) ||
        !hostd_record_get_number(kf, "created", G_MININT64, G_MAXINT64, &r->created, path, error) ||
        !hostd_record_get_number(kf, "state-since", G_MININT64, G_MAXINT64, &r->state_since, path,
                                 error))
        return NULL;
    r->cpus = (guint)cpus;
    r->memory_mib = (guint)memory_mib;
    r->disk_gib = (guint)disk_gib;
    r->ssh_port = (guint)ssh_port;

    /* Optional keys: records of agents made before the relay and idle policies existed load
     * with no backend port and no automatic suspend. */
    gint64 backend_port = 0, idle_pause = 0, idle_save = 0, every = 0, keep = 0, hourly = 0,
           daily = 0;
    if ((g_key_file_has_key(kf, RECORD_GROUP, "checkpoint-every-s", NULL) &&
         !hostd_record_get_number(kf, "checkpoint-every-s", 0, G_MAXUINT, &every, path, error)) ||
        (g_key_file_has_key(kf, RECORD_GROUP, "checkpoint-keep", NULL) &&
         !hostd_record_get_number(kf, "checkpoint-keep", 0, 1000, &keep, path, error)) ||
        (g_key_file_has_key(kf, RECORD_GROUP, "checkpoint-hourly", NULL) &&
         !hostd_record_get_number(kf, "checkpoint-hourly", 0, 1000, &hourly, path, error)) ||
        (g_key_file_has_key(kf, RECORD_GROUP, "checkpoint-daily", NULL) &&
         !hostd_record_get_number(kf, "checkpoint-daily", 0, 1000, &daily, path, error)))
        return NULL;
    r->checkpoint_every_s = (guint)every;
    r->checkpoint_keep = (guint)keep;
    r->checkpoint_hourly = (guint)hourly;
    r->checkpoint_daily = (guint)daily;
    if ((g_key_file_has_key(kf, RECORD_GROUP, "backend-port", NULL) &&
         !hostd_record_get_number(kf, "backend-port", 1, 65535, &backend_port, path, error)) ||
        (g_key_file_has_key(kf, RECORD_GROUP, "idle-pause-s", NULL) &&
         !hostd_record_get_number(kf, "idle-pause-s", 0, G_MAXUINT, &idle_pause, path, error)) ||
        (g_key_file_has_key(kf, RECORD_GROUP, "idle-save-s", NULL) &&
         !hostd_record_get_number(kf, "idle-save-s", 0, G_MAXUINT, &idle_save, path, error)))
        return NULL;
    for (guint i = 0; i < VM_DISK_LIMITS; i++) {
        gint64 limit = 0;

        if (g_key_file_has_key(kf, RECORD_GROUP, hostd_record_disk_keys[i], NULL) &&
            !hostd_record_get_number(kf, hostd_record_disk_keys[i], 0, VM_DISK_LIMIT_MAX, &limit,
                                     path, error))
            return NULL;
        r->disk_limits[i] = (guint)limit;
    }
    r->backend_port = (guint)backend_port;
    r->idle_pause_s = (guint)idle_pause;
    r->idle_save_s = (guint)idle_save;
    r->idle_never = !g_key_file_has_key(kf, RECORD_GROUP, "idle-never", NULL) ||
                    g_key_file_get_boolean(kf, RECORD_GROUP, "idle-never", NULL);

    /* The supervisor's keys: older records have none (wanted stays NULL: the supervisor adopts
     * the state it finds). A value hostd never writes means the record is not hostd's. */
    gint64 crash_count = 0;
    r->wanted = hostd_record_get_string(kf, "wanted", FALSE, path, NULL);
    r->restart = hostd_record_get_string(kf, "restart", FALSE, path, NULL);
    if (r->restart == NULL)
        r->restart = g_strdup(HOSTD_RESTART_ON_CRASH);
    if ((r->wanted != NULL && !hostd_wanted_is_valid(r->wanted)) ||
        !hostd_restart_policy_is_valid(r->restart))
        return vm_throw(error, VM_ERROR_FAILED,
                        "corrupt agent record %s: bad 'wanted' or 'restart'", path),
               NULL;
    if ((g_key_file_has_key(kf, RECORD_GROUP, "crash-count", NULL) &&
         !hostd_record_get_number(kf, "crash-count", 0, G_MAXUINT, &crash_count, path, error)) ||
        (g_key_file_has_key(kf, RECORD_GROUP, "crash-window", NULL) &&
         !hostd_record_get_number(kf, "crash-window", G_MININT64, G_MAXINT64, &r->crash_window,
                                  path, error)))
        return NULL;
    r->crash_count = (guint)crash_count;
    r->crashed = hostd_record_get_string(kf, "crashed", FALSE, path, NULL);
    r->fenced = hostd_record_get_string(kf, "fenced", FALSE, path, NULL);
    r->moving_to = hostd_record_get_string(kf, "moving-to", FALSE, path, NULL);
    r->replicas = hostd_record_get_string(kf, "replicas", FALSE, path, NULL);
    r->replicated = hostd_record_get_string(kf, "replicated", FALSE, path, NULL);
    gint64 replicate = 0;
    r->replicate_own = g_key_file_has_key(kf, RECORD_GROUP, "replicate", NULL);
    if (r->replicate_own &&
        !hostd_record_get_number(kf, "replicate", 0, VM_REPLICAS_MAX, &replicate, path, error))
        return NULL;
    r->replicate = (guint)replicate;
    gint64 fleet_epoch = 0;
    if (g_key_file_has_key(kf, RECORD_GROUP, "fleet-epoch", NULL) &&
        !hostd_record_get_number(kf, "fleet-epoch", 0, G_MAXINT64, &fleet_epoch, path, error))
        return NULL;
    r->fleet_epoch = (guint64)fleet_epoch;
    r->shutdown_saved = g_key_file_get_boolean(kf, RECORD_GROUP, "shutdown-saved", NULL);
    r->grow_fs = g_key_file_get_boolean(kf, RECORD_GROUP, "grow-fs", NULL);
    /* Records older than agent ids have none: the agent gets one when it next boots. Root's
     * id is never one hostd hands out, so 0 reads as none. */
    gint64 agent_id = 0;
    if (g_key_file_has_key(kf, RECORD_GROUP, "agent-id", NULL) &&
        !hostd_record_get_number(kf, "agent-id", 1, G_MAXINT32, &agent_id, path, error))
        return NULL;
    r->agent_id = (guint)agent_id;
    return g_steal_pointer(&r);
}

gboolean
hostd_agent_record_save(const HostdAgentRecord *r, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    g_autofree char *path = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);

    g_key_file_set_string(kf, RECORD_GROUP, "name", r->name);
    g_key_file_set_string(kf, RECORD_GROUP, "uuid", r->uuid);
    g_key_file_set_string(kf, RECORD_GROUP, "template", r->template_name);
    g_key_file_set_string(kf, RECORD_GROUP, "phase", r->phase);
    g_key_file_set_uint64(kf, RECORD_GROUP, "cpus", r->cpus);
    g_key_file_set_uint64(kf, RECORD_GROUP, "memory-mib", r->memory_mib);
    g_key_file_set_uint64(kf, RECORD_GROUP, "disk-gib", r->disk_gib);
    for (guint i = 0; i < VM_DISK_LIMITS; i++)
        g_key_file_set_uint64(kf, RECORD_GROUP, hostd_record_disk_keys[i], r->disk_limits[i]);
    g_key_file_set_uint64(kf, RECORD_GROUP, "ssh-port", r->ssh_port);
    g_key_file_set_string(kf, RECORD_GROUP, "mac", r->mac);
    g_key_file_set_string(kf, RECORD_GROUP, "user", r->user);
    g_key_file_set_string(kf, RECORD_GROUP, "instance-id", r->instance_id);
    if (r->forked_from != NULL) {
        g_key_file_set_string(kf, RECORD_GROUP, "forked-from", r->forked_from);
        g_key_file_set_string(kf, RECORD_GROUP, "fork-checkpoint", r->fork_checkpoint);
        g_key_file_set_string(kf, RECORD_GROUP, "fork-base", r->fork_base);
    }
    if (r->warm_base != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "warm-base", r->warm_base);
    if (r->domain != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "domain", r->domain);
    g_key_file_set_int64(kf, RECORD_GROUP, "created", r->created);
    g_key_file_set_int64(kf, RECORD_GROUP, "state-since", r->state_since);
    if (r->backend_port != 0)
        g_key_file_set_uint64(kf, RECORD_GROUP, "backend-port", r->backend_port);
    g_key_file_set_boolean(kf, RECORD_GROUP, "idle-never", r->idle_never);
    g_key_file_set_uint64(kf, RECORD_GROUP, "idle-pause-s", r->idle_pause_s);
    g_key_file_set_uint64(kf, RECORD_GROUP, "idle-save-s", r->idle_save_s);
    g_key_file_set_uint64(kf, RECORD_GROUP, "checkpoint-every-s", r->checkpoint_every_s);
    g_key_file_set_uint64(kf, RECORD_GROUP, "checkpoint-keep", r->checkpoint_keep);
    g_key_file_set_uint64(kf, RECORD_GROUP, "checkpoint-hourly", r->checkpoint_hourly);
    g_key_file_set_uint64(kf, RECORD_GROUP, "checkpoint-daily", r->checkpoint_daily);
    if (r->wanted != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "wanted", r->wanted);
    g_key_file_set_string(kf, RECORD_GROUP, "restart",
                          r->restart != NULL ? r->restart : HOSTD_RESTART_ON_CRASH);
    g_key_file_set_uint64(kf, RECORD_GROUP, "crash-count", r->crash_count);
    g_key_file_set_int64(kf, RECORD_GROUP, "crash-window", r->crash_window);
    if (r->crashed != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "crashed", r->crashed);
    if (r->fleet_epoch != 0)
        g_key_file_set_uint64(kf, RECORD_GROUP, "fleet-epoch", r->fleet_epoch);
    if (r->fenced != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "fenced", r->fenced);
    if (r->moving_to != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "moving-to", r->moving_to);
    if (r->replicas != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "replicas", r->replicas);
    if (r->replicated != NULL)
        g_key_file_set_string(kf, RECORD_GROUP, "replicated", r->replicated);
    if (r->replicate_own)
        g_key_file_set_uint64(kf, RECORD_GROUP, "replicate", r->replicate);
    if (r->shutdown_saved)
        g_key_file_set_boolean(kf, RECORD_GROUP, "shutdown-saved", TRUE);
    if (r->grow_fs)
        g_key_file_set_boolean(kf, RECORD_GROUP, "grow-fs", TRUE);
    if (r->agent_id != 0)
        g_key_file_set_uint64(kf, RECORD_GROUP, "agent-id", r->agent_id);

    gsize len = 0;
    g_autofree char *data = g_key_file_to_data(kf, &len, NULL);
    return vm_file_write_atomic(path, data, (gssize)len, 0600, error);
}

HostdAgentRecord *
hostd_agent_record_copy(const HostdAgentRecord *r)
{
    HostdAgentRecord *c = g_memdup2(r, sizeof(*r));
    c->dir = g_strdup(r->dir);
    c->name = g_strdup(r->name);
    c->uuid = g_strdup(r->uuid);
    c->template_name = g_strdup(r->template_name);
    c->phase = g_strdup(r->phase);
    c->mac = g_strdup(r->mac);
    c->user = g_strdup(r->user);
    c->instance_id = g_strdup(r->instance_id);
    c->forked_from = g_strdup(r->forked_from);
    c->fork_checkpoint = g_strdup(r->fork_checkpoint);
    c->fork_base = g_strdup(r->fork_base);
    c->warm_base = g_strdup(r->warm_base);
    c->domain = g_strdup(r->domain);
    c->wanted = g_strdup(r->wanted);
    c->restart = g_strdup(r->restart);
    c->crashed = g_strdup(r->crashed);
    c->fenced = g_strdup(r->fenced);
    c->moving_to = g_strdup(r->moving_to);
    c->replicas = g_strdup(r->replicas);
    c->replicated = g_strdup(r->replicated);
    return c;
}

void
hostd_agent_record_free(HostdAgentRecord *r)
{
    if (r == NULL)
        return;
    g_free(r->dir);
    g_free(r->name);
    g_free(r->uuid);
    g_free(r->template_name);
    g_free(r->phase);
    g_free(r->mac);
    g_free(r->user);
    g_free(r->instance_id);
    g_free(r->forked_from);
    g_free(r->fork_checkpoint);
    g_free(r->fork_base);
    g_free(r->warm_base);
    g_free(r->domain);
    g_free(r->wanted);
    g_free(r->restart);
    g_free(r->crashed);
    g_free(r->fenced);
    g_free(r->moving_to);
    g_free(r->replicas);
    g_free(r->replicated);
    g_free(r);
}

HostdState *
hostd_state_open(const char *state_dir, GError **error)
{
    g_autofree char *agents_dir = g_build_filename(state_dir, "agents", NULL);
    g_autofree char *lock_path = g_build_filename(state_dir, "hostd.lock", NULL);

    /* 0711: QEMU runs as an unprivileged user (libvirt-qemu under the system and embedded
     * drivers) and must traverse these to reach the disks; the secrets inside are 0600. */
    if (g_mkdir_with_parents(state_dir, 0711) < 0 || g_mkdir_with_parents(agents_dir, 0711) < 0 ||
        chmod(state_dir, 0711) < 0 || chmod(agents_dir, 0711) < 0) {
        vm_throw_errno(error, errno, "cannot create state directory %s", state_dir);
        return NULL;
    }
    vm_autofd fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        vm_throw_errno(error, errno, "cannot open %s", lock_path);
        return NULL;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        if (errno == EWOULDBLOCK) {
            g_autofree char *holder = NULL;
            g_file_get_contents(lock_path, &holder, NULL, NULL);
            vm_throw(error, VM_ERROR_BUSY, "another hostd (pid %s) is using %s",
                     holder != NULL ? g_strstrip(holder) : "?", state_dir);
        } else {
            vm_throw_errno(error, errno, "cannot lock %s", lock_path);
        }
        return NULL;
    }
    g_autofree char *pid = g_strdup_printf("%d\n", (int)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, strlen(pid), 0) < 0) {
        vm_throw_errno(error, errno, "cannot write %s", lock_path);
        return NULL;
    }

    HostdState *state = g_new0(HostdState, 1);
    state->dir = g_strdup(state_dir);
    state->agents_dir = g_steal_pointer(&agents_dir);
    state->lock_fd = fd;
    fd = -1;
    return state;
}

void
hostd_state_close(HostdState *state)
{
    if (state == NULL)
        return;
    if (state->lock_fd >= 0)
        close(state->lock_fd);
    g_free(state->dir);
    g_free(state->agents_dir);
    g_free(state);
}

static gint
hostd_compare_strings(gconstpointer a, gconstpointer b)
{
    return g_strcmp0(*(const char *const *)a, *(const char *const *)b);
}

GPtrArray *
hostd_state_list_agents(HostdState *state, GError **error)
{
    g_autoptr(GError) local_error = NULL;
    g_autoptr(GDir) dir = g_dir_open(state->agents_dir, 0, &local_error);
    if (dir == NULL) {
        vm_throw(error, VM_ERROR_IO, "%s", local_error->message);
        return NULL;
    }
    GPtrArray *names = g_ptr_array_new_with_free_func(g_free);
    const char *entry;
    while ((entry = g_dir_read_name(dir)) != NULL) {
        if (entry[0] == '.')
            continue;
        /* Only directories are agents: a stray file here is not hostd's to load or delete. */
        g_autofree char *path = g_build_filename(state->agents_dir, entry, NULL);
        if (g_file_test(path, G_FILE_TEST_IS_DIR))
            g_ptr_array_add(names, g_strdup(entry));
    }
    g_ptr_array_sort(names, hostd_compare_strings);
    return names;
}

GPtrArray *
hostd_state_load_records(HostdState *state, GError **error)
{
    g_autoptr(GPtrArray) names = hostd_state_list_agents(state, error);
    if (names == NULL)
        return NULL;
    GPtrArray *records = g_ptr_array_new_with_free_func((GDestroyNotify)hostd_agent_record_free);
    for (guint i = 0; i < names->len; i++) {
        g_autofree char *dir = g_build_filename(state->agents_dir, names->pdata[i], NULL);
        HostdAgentRecord *r = hostd_agent_record_load(dir, NULL);
        if (r != NULL)
            g_ptr_array_add(records, r);
    }
    return records;
}
