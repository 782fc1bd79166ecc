/* Thinning of automatic checkpoints: keep the newest few, plus one per recent hour and one per
 * recent day, and drop the rest. Manual checkpoints are the user's and are never dropped.
 *
 * Pure: no I/O, no clock. hostd asks which ids to drop after each automatic checkpoint and
 * removes them; because every rule keeps the oldest checkpoint of its bucket, asking again with
 * nothing new drops nothing, and a checkpoint that survived thinning is dropped only once its
 * bucket falls out of the window (no churn).
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct {
    guint keep;   /* the newest automatic checkpoints kept whatever their age */
    guint hourly; /* how many of the most recent hour buckets keep one checkpoint each */
    guint daily;  /* how many of the most recent day buckets keep one checkpoint each */
} VmRetentionPolicy;

typedef struct {
    const char *id;
    gint64 created; /* unix seconds */
    gboolean automatic;
} VmRetentionEntry;

/* Chooses the automatic checkpoints to drop from @entries (@n_entries of them, in creation
 * order, oldest first). Rules, of which any one keeps a checkpoint:
 *   - a manual checkpoint is never dropped and counts for no rule;
 *   - the newest @policy->keep automatic checkpoints (by position) are kept;
 *   - of the other automatic ones, take the @policy->hourly most recent hour buckets (UTC,
 *     created / 3600) that hold any, and keep the oldest of each (smallest created, the earlier
 *     position on a tie); likewise @policy->daily day buckets (created / 86400);
 *   - an automatic checkpoint dated after @now (the clock was stepped back since) is kept and
 *     takes no bucket, so a clock step never makes thinning remove recent work.
 * So at most keep + hourly + daily automatic checkpoints dated up to @now survive; a policy of
 * all zeros drops every automatic checkpoint. Returns the ids to drop in the order of @entries,
 * newly allocated strings in an array that frees them (empty when nothing goes). Can't fail. */
GPtrArray *vm_retention_select(const VmRetentionEntry *entries, gsize n_entries, gint64 now,
                               const VmRetentionPolicy *policy);

G_END_DECLS
