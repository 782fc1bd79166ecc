/* The egress verbs: `vmctl egress` (show and change an agent's policy) and `vmctl egress-log`. */
#pragma once

#include "vmctl.h"

G_BEGIN_DECLS

gboolean vmctl_cmd_egress(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_egress_log(VmctlContext *ctx, int argc, char **argv, GError **error);

G_END_DECLS
