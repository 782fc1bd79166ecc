/* What an agent takes from the host, chosen once at creation: its two 127.0.0.1 ports, its MAC,
 * its machine-id; and the checks that the host can give the CPUs, memory and disk asked for. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* With ctx->lock held: picks the lowest port of the configured range that no agent records, that
 * is not @not_this, and that nothing listens on. Fails with VM_ERROR_NO_RESOURCES. */
gboolean hostd_allocate_port(HostdContext *ctx, guint not_this, guint *ret_port, GError **error);

/* Refuses sizes this host cannot give (VM_ERROR_NO_RESOURCES) and a nearly full disk. */
gboolean hostd_check_resources(HostdContext *ctx, guint cpus, guint memory_mib, guint disk_gib,
                               GError **error);

/* A random locally administered MAC in QEMU's 52:54:00 range, newly allocated. */
char *hostd_random_mac(void);

/* The agent's /etc/machine-id: its UUID as 32 lower-case hex digits, newly allocated. */
char *hostd_agent_machine_id(const HostdAgentRecord *r);

/* Bytes a file takes on disk (allocated blocks); 0 when it does not exist. */
guint64 hostd_file_allocated(const char *path);

G_END_DECLS
