/* What tests of hostd-server.c may see beyond hostd-server.h. */
#pragma once

#include "vm-protocol.h"

G_BEGIN_DECLS

/* TRUE when hostd has a handler for @op: every request of the protocol, and nothing else. */
gboolean hostd_server_handles(VmOp op);

G_END_DECLS
