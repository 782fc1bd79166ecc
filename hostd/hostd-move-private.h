/* What moves (hostd-move.c) and replicas (hostd-replica.c) share: the table of transfers under
 * way, the names and checks of the files that travel, and the install of files brought from
 * another host. Not for other modules. */
#pragma once

#include <sys/stat.h>

#include "hostd-context.h"
#include "hostd-move.h"
#include "hostd-state.h"
#include "vm-image.h"

G_BEGIN_DECLS

/* The names a move gives the files that are not in the agent's dir on the source. */
#define MOVE_MEMORY      "@memory"
#define MOVE_WARM        "@warm"
#define MOVE_MEMORY_FILE "move.save"
#define MOVE_WARM_FILE   "moved-warm.qcow2"
#define MOVE_CHUNK       (64 * 1024)
/* A client that sends nothing for this long in the middle of a file has gone. */
#define MOVE_FRAME_TIMEOUT_S 60

/* A transfer under way on this host: a move, as source or target, or a replica, as the agent's
 * host (out) or the host that keeps it (in). The tables are the process's: tests run several
 * hostds in one process, so each entry is keyed by its context too. */
typedef struct {
    char *peer;          /* the target (source side) or the source (target side) */
    guint64 epoch;       /* the record's epoch when the transfer began */
    gint64 last_seen;    /* monotonic: the client's last request or frame */
    gboolean replica;    /* a replica's copy, not a move */
    GHashTable *sums;    /* target: file -> SHA-256 of what was written */
    char *template_name; /* target: the agent's template */
    char *source_dir;
    char *base_path;
    char *warm_path;
    char *base_sha256; /* replica target: the base image the agent stands on */
} HostdMove;

void hostd_move_free(gpointer data);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdMove, hostd_move_free)

/* Records @m (consumed) as the transfer of @name, @out of this host or into it. */
void hostd_move_put(HostdContext *ctx, gboolean out, const char *name, HostdMove *m);
/* Forgets the transfer of @name, if any. */
void hostd_move_forget(HostdContext *ctx, gboolean out, const char *name);
/* Runs @func (may be NULL) on the transfer of @name with the table locked (the client was just
 * heard from); FALSE when there is none. */
gboolean hostd_move_with(HostdContext *ctx, gboolean out, const char *name,
                         void (*func)(HostdMove *m, gpointer data), gpointer data);
/* Forgets the transfer of @name when it is a replica's copy (a move's stays): whether it was. */
gboolean hostd_move_forget_replica(HostdContext *ctx, gboolean out, const char *name);
/* Whether a client was heard from about the transfer of @name within HOSTD_MOVE_IDLE_S. */
gboolean hostd_move_active(HostdContext *ctx, gboolean out, const char *name);
/* Copies the fields of the transfer (for hostd_move_with(): @data a zeroed HostdMove). */
void hostd_move_snapshot(HostdMove *m, gpointer data);

/* Removes the dirs under $STATE/@subdir of transfers into this host nobody sends any more (no
 * client heard from within HOSTD_MOVE_IDLE_S), and forgets those transfers. Never waits on a
 * busy name. */
void hostd_move_sweep_received(HostdContext *ctx, const char *subdir);

/* Whether @file may name a file of an agent's dir in a transfer: a plain name, no path. */
gboolean hostd_move_file_name_valid(const char *file);
/* Files of an agent's dir that never travel: hostd writes them anew, or they are this host's. */
gboolean hostd_move_file_skipped(const char *file);
/* The name @file ("@memory", "@warm" or a plain name) has in a dir of received files. */
const char *hostd_move_in_file(const char *file);
/* The SHA-256 of the file at @path, in hex. Newly allocated. */
char *hostd_move_file_sha256(const char *path, GError **error);
/* The SHA-256 of a template's base image at @path, remembered by path, size and change time.
 * Newly allocated. */
char *hostd_move_base_sha256(const char *path, GError **error);
/* The entry {file, size, mtime} of @file with @st. */
GVariant *hostd_move_file_entry(const char *file, const struct stat *st);
/* Adds @file at @path to @b (aa{sv}) when it is a regular file. */
gboolean hostd_move_list_add(GVariantBuilder *b, const char *file, const char *path,
                             GError **error);

/* The record of agent @name as this host will have it, from the one in @dir brought by @m
 * (@names: the files brought, by their names there): its dir, ports, id and every field naming
 * the other host's things reset; its epoch @m's + 1. */
HostdAgentRecord *hostd_move_in_record(HostdContext *ctx, const HostdMove *m, const char *name,
                                       const char *dir, GHashTable *names, GError **error);
/* Puts the files @names of @from into @r's dir (the record there is hostd_agent_reserve()'s):
 * renamed, or with @link hard-linked (@from keeps them). */
gboolean hostd_move_in_install(const HostdAgentRecord *r, const char *from, GHashTable *names,
                               gboolean link, GError **error);
/* Old path on the source -> path here, for every image a header of @r's may name. */
GHashTable *hostd_move_in_paths(const HostdMove *m, const HostdAgentRecord *r,
                                const char *base_here, GHashTable *names);

/* The path the image standing on @r's base image names it by (its own disk's, or its warm
 * layer's: the base as it was when the warm image was built). Newly allocated. */
char *hostd_move_base_named(HostdContext *ctx, const HostdAgentRecord *r, const VmImage *image,
                            GError **error);
/* Adds to @b (a{sv}) what the receiving host's begin is told of agent @r, this host's (@me)
 * with @epoch: from, epoch, template, cpus, memory_mib, disk_gib, base_sha256, source_dir,
 * base_path, warm_path where it has one. */
void hostd_move_describe(GVariantBuilder *b, const char *me, guint64 epoch,
                         const HostdAgentRecord *r, const char *base_sha256,
                         const char *base_named);
/* Whether @in holds what a begin of @what ("a move", "a replica") needs, this host is in a
 * fleet and the name is valid. Fails with VM_ERROR_INVALID_ARGUMENT, VM_ERROR_NOT_RUNNING. */
gboolean hostd_move_in_valid(HostdContext *ctx, const HostdMoveIn *in, const char *what,
                             GError **error);
/* Whether this host may receive agent @in->name now: no transfer of it into this host under
 * way, and the fleet's record names @in->from with @in->epoch. Fails with VM_ERROR_BUSY,
 * VM_ERROR_BAD_STATE, or VM_ERROR_NOT_RUNNING when etcd cannot say. */
gboolean hostd_move_in_check(HostdContext *ctx, const HostdMoveIn *in, GError **error);
/* Whether this host's base image of @template_name has SHA-256 @base_sha256, as host @from's
 * has: the agent's disk stands on it. Fails with VM_ERROR_BAD_STATE saying both when not. */
gboolean hostd_move_check_base(HostdContext *ctx, const char *template_name,
                               const char *base_sha256, const char *from, GError **error);

/* Replicas being received, until whole (hostd-replica.h), under the state dir. */
#define HOSTD_REPLICA_STAGE_DIR "replicas-incoming"
/* Where the files of a replica of @name being received go. Newly allocated. */
char *hostd_replica_stage_dir(HostdContext *ctx, const char *name);

G_END_DECLS
