/* Kernel same-page merging for the agents' memory (hostd.conf `ksm`, docs/INSTANT.md).
 *
 * Agents restored from one warm image hold mostly the same pages; QEMU marks guest RAM mergeable
 * (libvirt's default: the domain XML has no <nosharepages/>), and the kernel's KSM thread merges
 * what is identical once /sys/kernel/mm/ksm/run is 1. This module drives that file: `on` sets
 * run=1 at start; `auto` sets it while at least one agent's QEMU runs (libvirt's lifecycle events,
 * and a look every HOSTD_KSM_CHECK_S in case one was missed) and puts it back when none does;
 * `off` never writes it. hostd remembers what run was before it first wrote it and puts that
 * back when it exits cleanly. A host where the files are missing or not writable (no KSM in the
 * kernel, hostd not root) costs one line in the log, never a failure.
 *
 * It also reads what KSM merged, host-wide (hostd_ksm_figures()), for `vmctl stats` and the
 * metrics. The sysfs directory is a parameter, so that tests can point it at fixture files. */
#pragma once

#include "hostd-context.h"

G_BEGIN_DECLS

/* Where the kernel exposes KSM. */
#define HOSTD_KSM_SYSFS "/sys/kernel/mm/ksm"

/* How often `auto` counts the running agents besides libvirt's events, in seconds. */
#define HOSTD_KSM_CHECK_S 30

typedef struct _HostdKsm HostdKsm;

/* Parses "auto", "on" or "off" into @ret_mode; FALSE for anything else. */
gboolean hostd_ksm_mode_parse(const char *text, HostdKsmMode *ret_mode);

/* "auto", "on" or "off". Static; can't fail. */
const char *hostd_ksm_mode_name(HostdKsmMode mode);

/* A controller of the KSM files under @root (HOSTD_KSM_SYSFS but in tests) in @mode. Touches no
 * file. Thread-safe from here on. Can't fail. */
HostdKsm *hostd_ksm_new(const char *root, HostdKsmMode mode);

/* What hostd does at start: with `on`, run=1. Returns a line for the log (what it did, or why it
 * could not: said once for the controller's life), or NULL when there is nothing to say (`auto`,
 * `off`, or run was 1 already). Newly allocated. Never fails. */
char *hostd_ksm_begin(HostdKsm *ksm);

/* With `auto`, that agents run (@running TRUE: run=1 unless it is already) or that none does
 * (run back to what it was, only where this controller set it to 1). Does nothing when @running
 * is what it was last told, and in the other modes. Returns a line for the log, or NULL, as
 * hostd_ksm_begin(). Never fails. */
char *hostd_ksm_agents_running(HostdKsm *ksm, gboolean running);

/* Puts run back to what it was before this controller first wrote it, if it did. Returns a line
 * for the log, or NULL, as hostd_ksm_begin(). Never fails. */
char *hostd_ksm_restore(HostdKsm *ksm);

/* What KSM does now, host-wide, as an a{sv} (docs/PROTOCOL.md, agent-stats `ksm`): `mode s`
 * (hostd's setting), and where the files can be read `run s` (`stopped`, `running`,
 * `unmerging`), `pages_shared t`, `pages_sharing t`, `saved_bytes t` (pages_sharing pages: the
 * memory KSM saves), `general_profit_bytes x` (kernels from 6.4 on: saved less KSM's own
 * metadata; may be negative). New floating reference. Can't fail. */
GVariant *hostd_ksm_figures(HostdKsm *ksm);

void hostd_ksm_free(HostdKsm *ksm);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdKsm, hostd_ksm_free)

/* Sets ctx->ksm to a controller of @root in the configured mode and begins it; with `auto`,
 * follows the agents from now on (libvirt's lifecycle events through the default main context,
 * which hostd's main loop runs, and a look every HOSTD_KSM_CHECK_S). Logs through
 * hostd_context_log(). Can't fail. */
void hostd_ksm_start(HostdContext *ctx, const char *root);

/* Stops following the agents, puts run back (hostd_ksm_restore()) and frees ctx->ksm. Call on
 * the thread that runs the default main context, once nothing reads ctx->ksm any more. Accepts
 * a context never started. */
void hostd_ksm_stop(HostdContext *ctx);

G_END_DECLS
