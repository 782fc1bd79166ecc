/* What vmctl shows: tables, "key: value" details, JSON, human units, and the progress line.
 *
 * The formatters are pure (they return strings and take "now" as an argument) so tests can pin
 * their output; only VmctlProgress writes, to the stream it is given.
 */
#pragma once

#include <glib.h>
#include <stdio.h>

G_BEGIN_DECLS

typedef enum {
    VMCTL_PROGRESS_NONE,  /* --quiet: show nothing */
    VMCTL_PROGRESS_LINES, /* stderr is not a terminal: each distinct message once, one a line */
    VMCTL_PROGRESS_BAR,   /* stderr is a terminal: one line redrawn in place */
} VmctlProgressMode;

/* How one field of an a{sv} dictionary is shown. A missing field shows as "-". */
typedef enum {
    VMCTL_FORMAT_TEXT,  /* strings as they are, other values in GVariant text form */
    VMCTL_FORMAT_YESNO, /* booleans as "yes"/"no" */
    VMCTL_FORMAT_MIB,   /* an integer count of MiB, shown by vm_format_bytes(): "2 GiB" */
    VMCTL_FORMAT_GIB,   /* an integer count of GiB: "10 GiB" */
    VMCTL_FORMAT_BYTES, /* an integer count of bytes: "1.5 GiB" */
    VMCTL_FORMAT_AGO,   /* unix seconds as "3 minutes ago" */
    VMCTL_FORMAT_DATE,  /* unix seconds as "2024-05-01 12:00:00 (3 minutes ago)", local time */
} VmctlFormat;

typedef struct {
    const char *label; /* column header or detail label */
    const char *key;   /* dictionary key */
    VmctlFormat format;
} VmctlField;

/* Looks @key up in the a{sv} @dict and unboxes the value from any variants around it. Returns a
 * new reference, or NULL when absent. */
GVariant *vmctl_dict_lookup(GVariant *dict, const char *key);

/* Formats @then relative to @now: "just now", "5 seconds ago", "1 minute ago", "3 hours ago",
 * "12 days ago", or the date "2023-01-31" beyond 60 days; "in the future" when @then > @now.
 * Newly allocated; can't fail. */
char *vmctl_format_ago(gint64 then, gint64 now);

/* Formats the value of @field in the a{sv} @dict (values may be boxed in variants or not).
 * Returns "-" when the key is absent. Newly allocated; can't fail. */
char *vmctl_format_value(GVariant *dict, const VmctlField *field, gint64 now);

/* Formats the aa{sv} @rows as a table: a header of the @n_fields labels, one line per row,
 * columns padded to their widest cell and separated by two spaces, the last column unpadded.
 * Newly allocated; can't fail. */
char *vmctl_format_table(GVariant *rows, const VmctlField *fields, gsize n_fields, gint64 now);

/* Formats the a{sv} @dict as "label: value" lines with values aligned: first the @n_fields
 * fields in order, then any key of @dict that no field names, under its key. Newly allocated;
 * can't fail. */
char *vmctl_format_details(GVariant *dict, const VmctlField *fields, gsize n_fields, gint64 now);

/* Formats the line that ends `vmctl new`, from the agent dictionary @agent:
 * "agent NAME is running: ssh port N; try: vmctl exec NAME -- uname -a", or "agent NAME is
 * STATE" when it has no SSH port yet. Newly allocated; can't fail. */
char *vmctl_format_agent_summary(GVariant *agent);

/* Makes @text (from a file or a guest) safe to show on a terminal: valid UTF-8 (invalid bytes
 * become U+FFFD), with every control character escaped: "\n", "\r", "\t", "\xNN" for the others
 * below 0x80 (DEL included), "\u00NN" for U+0080..U+009F. Newly allocated; can't fail. */
char *vmctl_format_escaped(const char *text);

/* The same, but newlines stay newlines: for messages of several lines (an error with the
 * console's last lines). */
char *vmctl_format_escaped_lines(const char *text);

/* Formats agent-stats' aa{sv} @agents as a table: NAME, STATE, CPU (%), MEMORY USED/GIVEN (the
 * guest's figure, "-" where its balloon reports none), QEMU RSS, KSM (what of it KSM merged),
 * DISK USED/SIZE (the overlay's
 * host bytes, the disk's size), CHECKPOINTS (their host bytes), EGRESS UP/DOWN, EXECS; "-" for
 * what an agent lacks. Newly allocated; can't fail. */
char *vmctl_format_stats(GVariant *agents);

/* Formats agent-stats' host-wide `ksm` a{sv} as one line: "KSM: running (hostd: ksm = auto),
 * 1.2 GiB saved, profit 1.1 GiB", leaving out what it lacks. Newly allocated; can't fail. */
char *vmctl_format_ksm(GVariant *ksm);

/* Formats @value (any GVariant) as pretty-printed JSON ending in a newline. Newly allocated;
 * can't fail. */
char *vmctl_format_json(GVariant *value);

/* Formats the progress line: "[#####               ]  25% message" when @fraction is in [0,1],
 * else a spinner frame chosen by @tick followed by the message. The line is cut to at most
 * @width - 1 characters so it never wraps. Newly allocated; can't fail. */
char *vmctl_format_progress(const char *message, double fraction, guint tick, guint width);

/* A progress display on @stream in @mode. */
typedef struct VmctlProgress VmctlProgress;

/* Creates a display writing to @stream (not owned). Can't fail. */
VmctlProgress *vmctl_progress_new(VmctlProgressMode mode, FILE *stream);

/* Shows one PROGRESS message; @fraction < 0 means unknown. */
void vmctl_progress_update(VmctlProgress *progress, const char *message, double fraction);

/* Erases the progress line if one is shown, so other output starts on a clean line. */
void vmctl_progress_clear(VmctlProgress *progress);

/* Clears and frees; accepts NULL. */
void vmctl_progress_free(VmctlProgress *progress);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmctlProgress, vmctl_progress_free)

G_END_DECLS
