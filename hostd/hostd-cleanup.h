/* Automatic cleanups for the foreign types hostd uses, declared once. */
#pragma once

#include <glib.h>
#include <libssh/libssh.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

typedef struct ssh_key_struct HostdSshKey;
typedef struct ssh_session_struct HostdSshSession;
typedef struct ssh_channel_struct HostdSshChannel;

/* Disconnects (when connected) and frees a libssh session. Accepts NULL. */
static inline void
hostd_ssh_session_close(ssh_session session)
{
    if (session == NULL)
        return;
    ssh_disconnect(session);
    ssh_free(session);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC(virDomain, virDomainFree)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(virDomainSnapshot, virDomainSnapshotFree)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshKey, ssh_key_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshSession, hostd_ssh_session_close)
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSshChannel, ssh_channel_free)
