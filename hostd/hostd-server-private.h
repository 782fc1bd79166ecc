/* What tests of hostd-server.c may see beyond hostd-server.h. */
#pragma once

#include "vm-protocol.h"

G_BEGIN_DECLS

/* TRUE when hostd has a handler for @op: every request of the protocol, and nothing else. */
gboolean hostd_server_handles(VmOp op);

/* How many accepted clients hostd is serving now, across servers: a test waits for it to drop
 * back before freeing what their threads use. Can't fail. */
guint hostd_server_active_clients(void);

G_END_DECLS
