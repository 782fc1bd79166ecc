/* What an agent's memory costs the host, for `vmctl info` and `vmctl stats`: its QEMU's resident
 * memory (VmRSS of /proc/PID/status), the pages of it KSM merged (/proc/PID/ksm_merging_pages,
 * /proc/PID/ksm_stat), and what the guest's balloon driver reports (virDomainMemoryStats).
 *
 * Every figure is read bounded and parsed strictly: a file or figure that is missing, too long or
 * not a number is left out (the client shows it as unknown), never an error. The balloon's
 * figures but `actual` and `rss` come from the guest, which is hostile: they are only shown. */
#pragma once

#include "hostd-libvirt.h"

G_BEGIN_DECLS

/* The longest /proc or sysfs file read here: /proc/PID/status is a few KiB. */
#define HOSTD_MEMORY_FILE_MAX (64 * 1024)

/* The largest figure in KiB taken from libvirt or /proc (1 PiB): beyond it a figure is nonsense,
 * and bytes computed from it could overflow. */
#define HOSTD_MEMORY_KIB_MAX (1ULL << 40)

/* The content of the small file @path, at most @max bytes (NUL-terminated; its length in
 * *@ret_len when not NULL), opened O_CLOEXEC; NULL when it is missing, unreadable or longer.
 * Newly allocated; never fails. */
char *hostd_memory_read_file(const char *path, gsize max, gsize *ret_len);

/* @text as one unsigned decimal number (surrounding blanks and a newline allowed, nothing else),
 * at most @max, into *@ret_value. FALSE, leaving it as it was, otherwise. */
gboolean hostd_memory_parse_number(const char *text, guint64 max, guint64 *ret_value);

/* The same for a signed number of magnitude at most @max. */
gboolean hostd_memory_parse_signed(const char *text, guint64 max, gint64 *ret_value);

/* The value of line "@key: N kB" of a /proc/PID/status @text, in bytes (N at most
 * HOSTD_MEMORY_KIB_MAX). FALSE when there is no such line or it is not that. */
gboolean hostd_memory_parse_status_kib(const char *text, const char *key, guint64 *ret_bytes);

/* The value of line "@key N" of a /proc/PID/ksm_stat @text (signed: ksm_process_profit may be
 * negative), of magnitude at most @max. FALSE when there is no such line or it is not that. */
gboolean hostd_memory_parse_keyed(const char *text, const char *key, guint64 max,
                                  gint64 *ret_value);

/* The pid of agent @name's QEMU as the pid file of @lv's driver says (the embedded driver's
 * <root>/run/qemu/DOMAIN.pid, else /run/libvirt/qemu/DOMAIN.pid, DOMAIN the name of the agent's
 * domain: hostd_libvirt_domain_name()), checked against /proc/PID/cmdline (a QEMU with
 * guest=DOMAIN); 0 when there is none. Can't fail. */
GPid hostd_memory_qemu_pid(HostdLibvirt *lv, const char *name);

/* Adds what process @pid costs the host, as the files under @proc_root ("/proc" but in tests)
 * say, to the a{sv} @b: `qemu_rss_bytes t`, `ksm_merged_bytes t` (its pages KSM merges with
 * others), `ksm_profit_bytes x` (what merging saves on it, less KSM's metadata; may be
 * negative); each only where it could be read. Never fails. */
void hostd_memory_add_process(GVariantBuilder *b, const char *proc_root, GPid pid);

/* The balloon's figures of @dom (a running domain) in bytes, as the a{sv} entries
 * `balloon_actual_bytes` (what the guest is given now), `balloon_rss_bytes` (QEMU's RSS as
 * libvirt reads it), `balloon_available_bytes`, `balloon_usable_bytes`, `balloon_unused_bytes`
 * (the guest's own reports); each only where libvirt has it. Also `memory_available_bytes` and
 * `memory_used_bytes` when @with_used (available less usable, or less unused; the figures of
 * `vmctl stats`). Returns FALSE when the guest reported nothing yet (libvirt has no `available`):
 * the caller may ask it to (virDomainSetMemoryStatsPeriod). Never fails. */
gboolean hostd_memory_add_balloon(GVariantBuilder *b, virDomainPtr dom, gboolean with_used);

/* The balloon's statistics period hostd sets on a guest that reports none, in seconds. */
#define HOSTD_MEMORY_BALLOON_PERIOD_S 2

/* Adds what agent @name's QEMU (domain @dom, running or paused, of @lv) costs the host:
 * `qemu_pid u` and hostd_memory_add_process()'s figures, and the balloon's (without the used
 * figure). Asks the guest for balloon reports from now on when it gives none. Never fails. */
void hostd_memory_add_agent(GVariantBuilder *b, HostdLibvirt *lv, virDomainPtr dom,
                            const char *name);

/* The host's /proc/meminfo line @field ("MemTotal", "MemAvailable") in MiB; 0 when it cannot be
 * read. Can't fail. */
guint64 hostd_memory_host_mib(const char *field);

G_END_DECLS
