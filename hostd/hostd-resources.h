/* What an agent takes from the host, chosen once at creation: its two 127.0.0.1 ports, its MAC,
 * its machine-id; and the checks that the host can give the CPUs, memory and disk asked for. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* With ctx->lock held: picks the lowest port of the configured range that no agent records, that
 * is not @not_this, and that hostd can listen on. With @ret_fd, *@ret_fd gets the socket that
 * listens on it (close-on-exec, non-blocking): the port is the caller's until it closes it, so
 * nothing else, another hostd or an outgoing connection, can take it meanwhile; without, the
 * socket is closed. Fails with VM_ERROR_NO_RESOURCES. */
gboolean hostd_allocate_port(HostdContext *ctx, guint not_this, guint *ret_port, int *ret_fd,
                             GError **error);

/* Keeps @public_fd and @backend_fd (listeners from hostd_allocate_port(), taken over; -1: none)
 * for the agent @name being made, until taken or released. Can't fail. */
void hostd_ports_hold(HostdContext *ctx, const char *name, int public_fd, int backend_fd);

/* The same for @name's backend port alone (@backend_fd taken over; one held before is closed),
 * its public port's listener left as it is. Can't fail. */
void hostd_ports_hold_backend(HostdContext *ctx, const char *name, int backend_fd);

/* The listener held for @name's public port, taken out of the hold (the caller owns it); -1
 * when none is held. Can't fail. */
int hostd_ports_take_public(HostdContext *ctx, const char *name);

/* Closes the listener held for @name's backend port, right before QEMU binds the port itself.
 * Can't fail; nothing held: no-op. */
void hostd_ports_release_backend(HostdContext *ctx, const char *name);

/* Holds @name's backend port @port (its QEMU's SSH forward) while the agent is saved: its saved
 * state names the port, and the range lies among Linux's ephemeral ports, so an outgoing
 * connection could take it before the wake. Released by hostd_ports_release_backend() right
 * before any QEMU of the agent starts. Can't fail; a port hostd cannot listen on is left. */
void hostd_ports_hold_saved(HostdContext *ctx, const char *name, guint port);

/* Closes whatever is still held for @name (its making ended, or was rolled back). Can't fail. */
void hostd_ports_release(HostdContext *ctx, const char *name);

/* Whether hostd could listen on 127.0.0.1:@port now (nothing else holds it). Can't fail. */
gboolean hostd_port_is_free(guint port);

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
