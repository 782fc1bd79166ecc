/* An SSH session to an agent's sshd over its virtio port (VM_DOMAIN_SSH_CHANNEL), kept across a
 * save: the session lives in the guest's memory and in the SSH worker, and only the port's
 * connection on the host changes with each QEMU. A saved agent's first command after its wake
 * then needs no handshake with the guest.
 *
 * libssh talks to one end of a socketpair; a relay thread carries its bytes to and from the
 * port's current connection, which QEMU closes when it exits (a save) and hostd hands over again
 * for the next QEMU (hostd_ssh_serial_adopt()) before the guest runs. What the old QEMU sent
 * before it ended is read to its end and kept; what libssh writes meanwhile waits.
 *
 * In the guest, vmctl-ssh-serial (cloud-init/vm-seed.c) holds the port and starts `sshd -i` on
 * it when a line HOSTD_SSH_SERIAL_START comes, answering HOSTD_SSH_SERIAL_STARTING first. A
 * fresh relay sends that line, again every few seconds until the answer comes (the first may
 * reach an sshd of an earlier session still on the port, which it ends, or nobody yet), then
 * waits for the guest's banner ("SSH-" at the start of a line), dropping whatever came before
 * it. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define HOSTD_SSH_SERIAL_START    "vmctl-ssh-start\n"
#define HOSTD_SSH_SERIAL_STARTING "vmctl-ssh-starting\n"

typedef struct _HostdSshSerial HostdSshSerial;

/* Starts relaying between @chan_fd (a connected socket to the port, taken over) and a new
 * socket returned in *@ret_session_fd for libssh (SSH_OPTIONS_FD), which closes it. Fails only
 * when the socketpair or the thread cannot be made (then @chan_fd is closed). */
HostdSshSerial *hostd_ssh_serial_start(int chan_fd, int *ret_session_fd, GError **error);

/* Whether libssh's end is still open and the relay runs. Can't fail. */
gboolean hostd_ssh_serial_is_alive(HostdSshSerial *serial);

/* Hands the relay @chan_fd (taken over), the port's connection in a new QEMU, in place of the
 * one that ended; the bytes that waited go to it first. FALSE (and @chan_fd closed) when the
 * relay has ended. */
gboolean hostd_ssh_serial_adopt(HostdSshSerial *serial, int chan_fd);

/* Stops the relay and closes its sockets (a session over it sees its connection end). NULL:
 * no-op. */
void hostd_ssh_serial_free(HostdSshSerial *serial);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshSerial, hostd_ssh_serial_free)

/* Where the guest's banner starts in @data (@len bytes): the offset of "SSH-" at its start or
 * right after a newline; -1 when none is there yet. Can't fail. */
gssize hostd_ssh_serial_find_banner(const guint8 *data, gsize len);

G_END_DECLS
