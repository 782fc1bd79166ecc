/* What of hostd-checkpoint.c only its tests see. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The free and total bytes hostd_checkpoint_create_locked() takes the agent's filesystem to
 * have, so that the free-space floor is tested exactly; @size 0: the real figures again. */
void hostd_checkpoint_test_space(guint64 avail, guint64 size);

G_END_DECLS
