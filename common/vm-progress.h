/* Progress reporting for long operations (image builds, downloads, boots). */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Called from the thread doing the work. @fraction is in [0,1], or < 0 when unknown. */
typedef void (*VmProgressFunc)(const char *message, double fraction, gpointer user_data);

G_END_DECLS
