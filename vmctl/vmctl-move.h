/* Moving an agent to another host of the fleet, as vmctl carries it (docs/CLUSTER.md, "Moves"):
 * the source and the target hostd are each asked in turn, and every file's bytes go from the
 * one to the other through this process, each checked by its SHA-256 on both sides. vmctl move
 * and vmctl drain use it.
 */
#pragma once

#include "vmctl.h"

G_BEGIN_DECLS

/* What a move did. */
typedef struct {
    char *from;         /* the source host's id */
    char *to;           /* the target host's id */
    guint64 bytes;      /* copied in all */
    guint64 bytes_down; /* copied while the agent was saved */
    double seconds;     /* from the plan to the end */
    double down_s;      /* from the save to the target's answer that the agent runs there */
} VmctlMoveReport;

void vmctl_move_report_clear(VmctlMoveReport *report);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(VmctlMoveReport, vmctl_move_report_clear)

/* Moves agent @name to host @to (NULL: where the fleet's placement puts it), asking ctx's hostd
 * first (which sends vmctl on to the agent's host: ctx's endpoint is that host afterwards). On
 * failure after the copy began, both hosts are told to give the move up, and the agent stays on
 * its source (saved, waking as usual) unless the target had already taken it over; the error
 * says what failed. */
gboolean vmctl_move_agent(VmctlContext *ctx, const char *name, const char *to,
                          VmctlMoveReport *report, GError **error);

/* A file a target has, as the source listed it when it was copied. */
typedef struct {
    gint64 size;
    gint64 mtime;
    char *sha256;
} VmctlMovedFile;

void vmctl_moved_file_free(gpointer data);

/* Copies each file of @files (aa{sv}: file, size, mtime?) of agent @name from @source to
 * @target (move-read, move-write) that @copied (file -> VmctlMovedFile) does not hold with the
 * same size and time, checking that both sides saw the same SHA-256, and records it there;
 * adds the bytes copied to *@bytes. */
gboolean vmctl_move_copy_all(VmctlContext *ctx, const VmctlEndpoint *source,
                             const VmctlEndpoint *target, const char *name, GVariant *files,
                             GHashTable *copied, guint64 *bytes, GError **error);

/* Sends @op with @fields to @endpoint, the RESULT in *@ret_result (may be NULL); no ELSEWHERE
 * followed: each host is asked what is its own. */
gboolean vmctl_move_call(VmctlContext *ctx, const VmctlEndpoint *endpoint, VmOp op,
                         GVariant *fields, VmMessage **ret_result, GError **error);

/* Whether the plan @plan (a source's move-out answer) has what a target's begin needs. */
gboolean vmctl_move_plan_valid(GVariant *plan);

/* The fields of a target's move-in step @step for agent @name: the agent as the source's plan
 * @plan describes it (from, epoch, template, sizes, base image, paths). Floating. */
GVariant *vmctl_move_in_fields(const char *name, const char *step, GVariant *plan);

G_END_DECLS
