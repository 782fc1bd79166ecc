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

G_END_DECLS
