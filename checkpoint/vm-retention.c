#include "vm-retention.h"

typedef struct {
    gint64 bucket;
    gint64 created;
    gsize index;
} Candidate;

/* Floor division, so that a date before 1970 still falls in the bucket that holds it. */
static gint64
bucket_of(gint64 created, gint64 width)
{
    gint64 q = created / width;
    return (created % width != 0 && created < 0) ? q - 1 : q;
}

/* Newest bucket first; inside a bucket the oldest checkpoint first, the earlier entry on a tie. */
static gint
candidate_compare(gconstpointer a, gconstpointer b)
{
    const Candidate *x = a;
    const Candidate *y = b;

    if (x->bucket != y->bucket)
        return x->bucket > y->bucket ? -1 : 1;
    if (x->created != y->created)
        return x->created < y->created ? -1 : 1;
    if (x->index != y->index)
        return x->index < y->index ? -1 : 1;
    return 0;
}

/* Marks in @kept the oldest candidate of each of the @buckets most recent buckets of @width
 * seconds. */
static void
keep_per_bucket(const VmRetentionEntry *entries, const gsize *candidates, gsize n_candidates,
                gint64 width, guint buckets, gboolean *kept)
{
    g_autoptr(GArray) sorted = g_array_sized_new(FALSE, FALSE, sizeof(Candidate), n_candidates);
    guint seen = 0;

    if (buckets == 0)
        return;
    for (gsize i = 0; i < n_candidates; i++) {
        const VmRetentionEntry *e = &entries[candidates[i]];
        Candidate c = {bucket_of(e->created, width), e->created, candidates[i]};
        g_array_append_val(sorted, c);
    }
    g_array_sort(sorted, candidate_compare);

    for (guint i = 0; i < sorted->len && seen < buckets; i++) {
        const Candidate *c = &g_array_index(sorted, Candidate, i);
        if (i > 0 && g_array_index(sorted, Candidate, i - 1).bucket == c->bucket)
            continue;
        kept[c->index] = TRUE;
        seen++;
    }
}

GPtrArray *
vm_retention_select(const VmRetentionEntry *entries, gsize n_entries, gint64 now,
                    const VmRetentionPolicy *policy)
{
    g_autofree gboolean *kept = g_new0(gboolean, n_entries + 1);
    g_autofree gsize *candidates = g_new(gsize, n_entries + 1);
    GPtrArray *drop = g_ptr_array_new_with_free_func(g_free);
    gsize n_candidates = 0;
    guint newest = 0;

    g_return_val_if_fail(entries != NULL || n_entries == 0, drop);
    g_return_val_if_fail(policy != NULL, drop);

    /* Walk from the newest: "newest" is by position, which a clock step cannot reorder. */
    for (gsize i = n_entries; i-- > 0;) {
        const VmRetentionEntry *e = &entries[i];
        if (!e->automatic)
            kept[i] = TRUE;
        else if (newest < policy->keep) {
            kept[i] = TRUE;
            newest++;
        } else if (e->created > now)
            kept[i] = TRUE;
        else
            candidates[n_candidates++] = i;
    }

    keep_per_bucket(entries, candidates, n_candidates, 3600, policy->hourly, kept);
    keep_per_bucket(entries, candidates, n_candidates, 86400, policy->daily, kept);

    for (gsize i = 0; i < n_entries; i++) {
        if (!kept[i])
            g_ptr_array_add(drop, g_strdup(entries[i].id));
    }
    return drop;
}
