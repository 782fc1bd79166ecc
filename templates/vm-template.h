/* Templates: YAML files describing how to get a base image and how agents made from it look.
 *
 * A template file (templates/<name>.yaml, see docs/TEMPLATES.md):
 *
 *   name: debian-12
 *   description: Debian 12 (bookworm) built offline from a Debian mirror
 *   image:
 *     build: mmdebstrap          # or: url
 *     suite: bookworm            # mmdebstrap only
 *     mirror: host               # mmdebstrap only: "host" = the host's apt mirror, or a URL
 *     url: https://...           # url only
 *     sha256: <64 hex>           # url only, required with url
 *   resources: {cpus: 2, memory: 1024, disk: 8}   # memory in MiB, disk in GiB
 *     # and optionally disk_read, disk_write (MiB/s), disk_read_iops, disk_write_iops; 0: none
 *   user: agent
 *   packages: [git, curl]        # mmdebstrap: baked into the image; url: installed by cloud-init
 *   user-data: |                 # extra #cloud-config merged into every agent's seed
 *     ...
 *   checkpoints: {every: 30m, keep: 10, hourly: 24, daily: 7}     # or: never
 *   idle: {pause_after: 5m, save_after: 30m} # or: never
 *   egress: {allow: [...], deny: [...]}     # default: none
 *   secrets: [example-api]       # secrets granted to every agent made from it (not to forks)
 *
 * Unknown keys, wrong types and out-of-range values are VM_ERROR_TEMPLATE errors whose message
 * starts with "FILE:LINE:COLUMN: ".
 */
#pragma once

#include <glib.h>

#include "vm-domain.h"

G_BEGIN_DECLS

typedef enum {
    VM_IMAGE_SOURCE_MMDEBSTRAP = 1,
    VM_IMAGE_SOURCE_URL,
} VmImageSource;

/* The most machines a template's warm pool keeps (`pool:`, hostd.conf's `pool`). */
#define VM_TEMPLATE_POOL_MAX 64

typedef struct {
    char *name;
    char *description;
    char *path; /* the file it was loaded from */

    VmImageSource source;
    char *suite;  /* mmdebstrap */
    char *mirror; /* mmdebstrap: "host" or a URL */
    char *url;    /* url */
    char *sha256; /* url: lower-case hex */

    guint cpus;
    guint memory_mib;
    guint disk_gib;
    guint disk_limits[VM_DISK_LIMITS];        /* VmDiskLimit, 0: no limit */
    gboolean disk_limits_set[VM_DISK_LIMITS]; /* FALSE: hostd's default (hostd.conf) */
    char *user;
    char **packages; /* NULL-terminated, never NULL */
    char *user_data; /* extra cloud-config text, or NULL */

    gboolean checkpoints_never;
    guint64 checkpoint_every_s; /* 0 = no periodic checkpoints */
    guint checkpoint_keep;      /* the newest automatic checkpoints kept */
    guint checkpoint_hourly;    /* plus one per hour for this many recent hours */
    guint checkpoint_daily;     /* plus one per day for this many recent days */

    gboolean idle_never;
    guint64 idle_pause_after_s;
    guint64 idle_save_after_s;

    gboolean pool_set; /* `pool:` given; else hostd.conf's `pool` */
    guint pool;        /* machines of its warm image kept restored and paused for `new` */

    char **egress_allow; /* NULL-terminated, never NULL; empty = no way out */
    char **egress_deny;  /* NULL-terminated, never NULL */

    char **secrets; /* names of hostd secrets granted at `new`; NULL-terminated, never NULL */
} VmTemplate;

/* Loads and validates one template file. Fails with VM_ERROR_TEMPLATE ("FILE:L:C: reason") for
 * syntax errors, unknown keys, wrong types and bad values, VM_ERROR_IO when unreadable. The
 * result is owned by the caller. */
VmTemplate *vm_template_load_file(const char *path, GError **error);

/* Same, from a string; @display_name stands for the file in messages. */
VmTemplate *vm_template_load_data(const char *data, gsize len, const char *display_name,
                                  GError **error);

/* Loads every *.yaml in @dir (sorted by name). A template that fails to load fails the whole
 * call, so a broken file is never silently skipped. Returns a GPtrArray of VmTemplate* that
 * frees its elements. */
GPtrArray *vm_template_load_dir(const char *dir, GError **error);

void vm_template_free(VmTemplate *template_);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmTemplate, vm_template_free)

G_END_DECLS
