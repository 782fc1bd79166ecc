/* Each agent's serial console, kept bounded on the host's disk. QEMU serves the console on a Unix
 * socket (agents/<name>/serial.sock, libvirt's <serial type='unix'> in bind mode); one thread of
 * hostd stays connected to every agent's socket, connecting again after each boot, and copies the
 * bytes as they are into agents/<name>/console.log, rotated to console.log.1 past
 * HOSTD_CONSOLE_MAX_BYTES. A guest writing without end leaves at most twice that on disk, and
 * hostd never looks inside what it copies. Output while hostd is not connected (stopped, between a
 * boot and the next connect) is dropped by QEMU, which never blocks on it.
 */
#pragma once

#include "hostd-context.h"
#include "hostd-logfile.h"

G_BEGIN_DECLS

typedef struct _HostdConsole HostdConsole;

/* The bound of console.log; console.log.1 holds at most as much again. */
#define HOSTD_CONSOLE_MAX_BYTES (4 * 1024 * 1024)

/* Reads what @fd has now (at most one buffer) and appends it to @log (a HOSTD_LOGFILE_BYTES
 * log). Returns FALSE when @fd is done (end of file, or an error other than EAGAIN/EINTR): the
 * caller closes it. Bytes @log cannot take are dropped. Can't fail otherwise. */
gboolean hostd_console_pump(int fd, HostdLogFile *log);

/* The log hostd_console_pump() copies agent @r's console into: console.log of its directory,
 * HOSTD_CONSOLE_MAX_BYTES, bytes. Newly allocated; can't fail. */
HostdLogFile *hostd_console_log_new(const HostdAgentRecord *r);

extern const HostdComponent hostd_console_component;

/* Stops copying the console of @name (what `rm` does; a warm pool's paused machine, whose console
 * becomes its agent's, under the agent's name, once taken). Can't fail. */
void hostd_console_unwatch(HostdContext *ctx, const char *name);

G_END_DECLS
