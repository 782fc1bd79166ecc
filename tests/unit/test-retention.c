/* Thinning of automatic checkpoints: manual ones are never dropped, the newest few survive, one
 * checkpoint per recent hour and day survives and it is always the same one (the oldest of its
 * bucket), and taking a checkpoint every five minutes for days keeps the count bounded. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "vm-retention.h"
#include "test-common.h"

#define H 3600
#define D 86400

typedef struct {
    const char *id;
    gint64 created;
    gboolean automatic;
} Item;

typedef struct {
    const char *name;
    VmRetentionPolicy policy;
    gint64 now;
    Item items[12];
    const char *drop; /* expected ids, space separated, in input order */
} Scenario;

#define AUTO   TRUE
#define MANUAL FALSE

static const Scenario scenarios[] = {
    {"nothing at all", {1, 1, 1}, 100, {{NULL}}, ""},
    {"manual ones survive a policy of zeros",
     {0, 0, 0},
     10 * H,
     {{"m1", 1 * H, MANUAL}, {"m2", 2 * H, MANUAL}},
     ""},
    {"a policy of zeros drops every automatic one",
     {0, 0, 0},
     10 * H,
     {{"a1", 1 * H, AUTO}, {"m1", 2 * H, MANUAL}, {"a2", 3 * H, AUTO}, {"a3", 3 * H + 1, AUTO}},
     "a1 a2 a3"},
    {"the newest K by position",
     {2, 0, 0},
     10 * H,
     {{"a1", 100, AUTO},
      {"a2", 200, AUTO},
      {"a3", 300, AUTO},
      {"a4", 400, AUTO},
      {"a5", 500, AUTO}},
     "a1 a2 a3"},
    {"manual ones do not count toward K",
     {1, 0, 0},
     10 * H,
     {{"a1", 100, AUTO}, {"a2", 200, AUTO}, {"m1", 300, MANUAL}, {"m2", 400, MANUAL}},
     "a1"},
    {"fewer than K: nothing goes", {5, 0, 0}, 10 * H, {{"a1", 100, AUTO}, {"a2", 200, AUTO}}, ""},
    {"the oldest of each recent hour",
     {1, 2, 0},
     13 * H,
     {{"h10a", 10 * H, AUTO},
      {"h10b", 10 * H + 1800, AUTO},
      {"h11a", 11 * H, AUTO},
      {"h11b", 11 * H + 1800, AUTO},
      {"h12a", 12 * H, AUTO},
      {"h12b", 12 * H + 1800, AUTO}},
     "h10a h10b h11b"},
    {"hours without checkpoints take no slot",
     {0, 2, 0},
     20 * H,
     {{"h0", 0 * H + 60, AUTO}, {"h5", 5 * H + 60, AUTO}, {"h9", 9 * H + 60, AUTO}},
     "h0"},
    {"the oldest of each recent day",
     {0, 0, 2},
     10 * D,
     {{"d0a", 0 * D + 10, AUTO},
      {"d0b", 0 * D + 20, AUTO},
      {"d1a", 1 * D + 10, AUTO},
      {"d1b", 1 * D + 20, AUTO},
      {"d3a", 3 * D + 10, AUTO}},
     "d0a d0b d1b"},
    {"an hourly and a daily pick together",
     {0, 1, 1},
     6 * D,
     {{"t10", 5 * D + 10 * H, AUTO},
      {"t1030", 5 * D + 10 * H + 1800, AUTO},
      {"t14", 5 * D + 14 * H, AUTO}},
     "t1030"},
    {"buckets are counted below the newest K",
     {2, 1, 0},
     10 * H,
     {{"h1a", 1 * H, AUTO},
      {"h1b", 1 * H + 60, AUTO},
      {"h2a", 2 * H, AUTO},
      {"h2b", 2 * H + 60, AUTO}},
     "h1b"},
    {"a tie in a bucket keeps the earlier entry",
     {0, 1, 0},
     10 * H,
     {{"x", 5 * H, AUTO}, {"y", 5 * H, AUTO}},
     "y"},
    {"the oldest by date, not by position",
     {0, 1, 0},
     10 * H,
     {{"late", 5 * H + 900, AUTO}, {"early", 5 * H + 60, AUTO}},
     "late"},
    {"dated after now: kept, no bucket taken",
     {1, 1, 0},
     1000,
     {{"old", 100, AUTO}, {"future", 5000, AUTO}, {"mid", 200, AUTO}, {"new", 300, AUTO}},
     "mid"},
    {"hours before 1970 are floored",
     {0, 2, 0},
     10 * H,
     {{"m3600", -3600, AUTO}, {"m1", -1, AUTO}, {"z0", 0, AUTO}},
     "m1"},
};

static char *
drop_list(const Item *items, gsize n, gint64 now, const VmRetentionPolicy *policy)
{
    g_autofree VmRetentionEntry *entries = g_new0(VmRetentionEntry, n + 1);
    g_autoptr(GPtrArray) drop = NULL;

    for (gsize i = 0; i < n; i++)
        entries[i] = (VmRetentionEntry){items[i].id, items[i].created, items[i].automatic};
    drop = vm_retention_select(entries, n, now, policy);
    g_ptr_array_add(drop, NULL);
    return g_strjoinv(" ", (char **)drop->pdata);
}

static void
test_scenarios(void **state)
{
    for (gsize i = 0; i < G_N_ELEMENTS(scenarios); i++) {
        const Scenario *s = &scenarios[i];
        gsize n = 0;
        while (n < G_N_ELEMENTS(s->items) && s->items[n].id != NULL)
            n++;

        g_autofree char *got = drop_list(s->items, n, s->now, &s->policy);
        if (strcmp(got, s->drop) != 0)
            fail_msg("%s: dropped '%s', expected '%s'", s->name, got, s->drop);

        /* Thinning what is left again drops nothing: no churn. */
        g_autofree Item *left = g_new0(Item, n + 1);
        g_auto(GStrv) dropped = g_strsplit(got, " ", -1);
        gsize n_left = 0;
        for (gsize j = 0; j < n; j++) {
            if (!g_strv_contains((const char *const *)dropped, s->items[j].id))
                left[n_left++] = s->items[j];
        }
        g_autofree char *again = drop_list(left, n_left, s->now, &s->policy);
        if (strcmp(again, "") != 0)
            fail_msg("%s: thinning again dropped '%s'", s->name, again);
    }
}

/* The ids handed to vm_retention_select() point into this. */
typedef struct {
    char id[32];
    gint64 created;
    gboolean automatic;
} SimCheckpoint;

static void
simulate(const VmRetentionPolicy *policy, gint64 start, gint64 step, guint days,
         gint64 manual_every)
{
    g_autoptr(GArray) alive = g_array_new(FALSE, TRUE, sizeof(SimCheckpoint));
    guint taken = 0;
    guint manual = 0;
    gint64 end = start + (gint64)days * D;

    for (gint64 t = start; t < end; t += step) {
        SimCheckpoint c = {.created = t, .automatic = TRUE};
        g_snprintf(c.id, sizeof(c.id), "c%u", ++taken);
        g_array_append_val(alive, c);
        if (manual_every > 0 && (t - start) % manual_every == 0) {
            SimCheckpoint m = {.created = t, .automatic = FALSE};
            g_snprintf(m.id, sizeof(m.id), "m%u", ++manual);
            g_array_append_val(alive, m);
        }

        g_autofree VmRetentionEntry *entries = g_new0(VmRetentionEntry, alive->len);
        for (guint i = 0; i < alive->len; i++) {
            SimCheckpoint *a = &g_array_index(alive, SimCheckpoint, i);
            entries[i] = (VmRetentionEntry){a->id, a->created, a->automatic};
        }
        g_autoptr(GPtrArray) drop = vm_retention_select(entries, alive->len, t, policy);
        for (guint i = alive->len; i-- > 0;) {
            SimCheckpoint *a = &g_array_index(alive, SimCheckpoint, i);
            for (guint j = 0; j < drop->len; j++) {
                if (strcmp(a->id, drop->pdata[j]) == 0) {
                    assert_true(a->automatic);
                    g_array_remove_index(alive, i);
                    break;
                }
            }
        }

        guint n_auto = 0;
        guint n_manual = 0;
        for (guint i = 0; i < alive->len; i++) {
            if (g_array_index(alive, SimCheckpoint, i).automatic)
                n_auto++;
            else
                n_manual++;
        }
        if (n_auto > policy->keep + policy->hourly + policy->daily)
            fail_msg("at %" G_GINT64_FORMAT ": %u automatic checkpoints survive, bound %u", t,
                     n_auto, policy->keep + policy->hourly + policy->daily);
        assert_int_equal(n_manual, manual);

        /* The newest keep automatic checkpoints taken are all alive. */
        for (guint k = 0; k < policy->keep && k < taken; k++) {
            g_autofree char *want = g_strdup_printf("c%u", taken - k);
            gboolean found = FALSE;
            for (guint i = 0; i < alive->len && !found; i++)
                found = strcmp(g_array_index(alive, SimCheckpoint, i).id, want) == 0;
            if (!found)
                fail_msg("at %" G_GINT64_FORMAT ": %s, one of the newest %u, was dropped", t, want,
                         policy->keep);
        }
    }

    /* Every complete past hour inside the hourly window still has its first checkpoint, and
     * every day inside the daily window too: the picks are stable, not the latest survivor. */
    gint64 last = start + ((end - start - 1) / step) * step;
    gint64 hour_now = last / H;
    guint slots = policy->hourly;
    for (gint64 h = hour_now - 1; h >= start / H && slots > 1; h--, slots--) {
        gint64 first = MAX(start, h * H);
        first = start + ((first - start + step - 1) / step) * step;
        gboolean found = FALSE;
        for (guint i = 0; i < alive->len && !found; i++)
            found = g_array_index(alive, SimCheckpoint, i).created == first &&
                    g_array_index(alive, SimCheckpoint, i).automatic;
        if (!found)
            fail_msg("hour %" G_GINT64_FORMAT ": its first checkpoint is gone", h);
    }
    for (gint64 d = last / D - 1, n = 1; d >= start / D && n < policy->daily; d--, n++) {
        gint64 first = MAX(start, d * D);
        first = start + ((first - start + step - 1) / step) * step;
        gboolean found = FALSE;
        for (guint i = 0; i < alive->len && !found; i++)
            found = g_array_index(alive, SimCheckpoint, i).created == first &&
                    g_array_index(alive, SimCheckpoint, i).automatic;
        if (!found)
            fail_msg("day %" G_GINT64_FORMAT ": its first checkpoint is gone", d);
    }
}

static void
test_every_five_minutes_for_three_days(void **state)
{
    static const VmRetentionPolicy policies[] = {
        {5, 24, 7}, {1, 0, 0}, {0, 3, 2}, {10, 48, 30}, {0, 0, 0}, {3, 1, 1},
    };
    /* 2023-11-14 22:13:20 UTC: the run starts mid-hour and crosses midnights. */
    const gint64 start = 1700000000;

    for (gsize i = 0; i < G_N_ELEMENTS(policies); i++) {
        simulate(&policies[i], start, 300, 3, 0);
        simulate(&policies[i], start, 300, 3, 6 * H);
    }
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scenarios),
        cmocka_unit_test(test_every_five_minutes_for_three_days),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
