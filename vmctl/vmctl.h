/* The vmctl verb runtime: the verb table entry, the per-run context, and the helpers every verb
 * uses to parse its arguments, send its one request and print the result.
 *
 * A verb is a function that parses, builds one request, calls hostd and prints; it holds no
 * logic of its own (hostd does the work).
 */
#pragma once

#include "vm-protocol.h"
#include "vmctl-client.h"
#include "vmctl-output.h"
#include "vmctl-remote.h"

#include <glib.h>

G_BEGIN_DECLS

typedef struct VmctlContext VmctlContext;

/* Runs one verb. @argv[0] is the verb name; the rest are its arguments (global options before
 * the verb are already consumed). On failure sets @error; main() prints it and exits with its
 * mapped status. */
typedef gboolean (*VmctlVerbFunc)(VmctlContext *ctx, int argc, char **argv, GError **error);

typedef struct {
    const char *name; /* "list", or two words for a subcommand: "template build" */
    VmctlVerbFunc func;
    const char *params;  /* positional arguments for the usage line: "NAME [-- CMD...]" */
    const char *summary; /* one line for `vmctl help` */
} VmctlVerb;

struct VmctlContext {
    const VmctlVerb *verb;
    const char *verb_description; /* more for the verb's --help (its subcommands), or NULL */
    char *socket_path;            /* from --socket; NULL means vm_default_socket_path() */
    char *host;                   /* from --host; NULL: $VMCTL_HOST, else hostd is on this host */
    VmctlRemote *remote;          /* --host or $VMCTL_HOST parsed, by vmctl_endpoint() */
    char *endpoint_path;          /* the local socket vmctl_endpoint() chose */
    gboolean json;
    gboolean quiet;
    gpointer option_data; /* handed to the G_OPTION_ARG_CALLBACK entries of the verb */
    int exit_status;      /* what a successful run exits with (exec: the remote status) */
    int failure_status;   /* 0, or the status any failure exits with (exec: 125) */
};

/* The options every verb accepts as well as vmctl itself: --socket, --host, --json, --quiet.
 * They write into @ctx. */
void vmctl_add_global_options(GOptionContext *options, VmctlContext *ctx);

/* Parses @argv for ctx->verb with @entries (NULL-terminated, may be NULL) plus the global
 * options, and returns the positional arguments in @ret_args (newly allocated, NULL-terminated).
 * Their number must be within [@min_args, @max_args]. -h/--help prints the verb's help on stdout
 * and exits 0. Fails with VM_ERROR_INVALID_ARGUMENT and "WHAT; see 'vmctl VERB --help'". */
gboolean vmctl_parse(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries,
                     int min_args, int max_args, char ***ret_args, GError **error);

/* Like vmctl_parse() for "VERB [OPTION...] NAME [OPTION...] [--] CMD [ARG...]": options end at
 * the first word after NAME, so the command keeps its own options. Returns the NAME in @ret_name
 * and the command (possibly empty) in @ret_command, both newly allocated. */
gboolean vmctl_parse_command(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries,
                             char **ret_name, char ***ret_command, GError **error);

/* Builds the usage error of ctx->verb: "WHAT; see 'vmctl VERB --help'" (before a verb is known:
 * "see 'vmctl --help'") in VM_ERROR_INVALID_ARGUMENT. Returns FALSE. */
gboolean vmctl_usage_error(VmctlContext *ctx, GError **error, const char *fmt, ...)
    G_GNUC_PRINTF(3, 4);

/* Parses the value of @option as an unsigned decimal number in [@min, @max]. Fails with a usage
 * error naming the option. */
gboolean vmctl_parse_uint(VmctlContext *ctx, const char *option, const char *text, guint32 min,
                          guint32 max, guint32 *ret_value, GError **error);

/* Adds what a log-like stream verb's --lines and --follow ask of hostd to @fields: "lines" (u)
 * when @lines (the option's text, or NULL) parses, "follow" (b) always. Fails with a usage error
 * naming --lines. */
gboolean vmctl_insert_tail_options(VmctlContext *ctx, GVariantDict *fields, const char *lines,
                                   gboolean follow, GError **error);

/* Parses the time @text given to @option: a duration back from @now_usec ("90s", "10m", "2h",
 * "3d"; vm_duration_parse()) or an ISO 8601 time, with a zone ("2024-05-01T12:00:00Z",
 * "2024-05-01T14:00:00+02:00") or in local time without one ("2024-05-01T14:00:00",
 * "2024-05-01 14:00", or a date alone for its midnight). Returns unix microseconds in @ret_usec.
 * Fails with a usage error naming @option. */
gboolean vmctl_parse_time(VmctlContext *ctx, const char *option, const char *text, gint64 now_usec,
                          gint64 *ret_usec, GError **error);

/* Parses the size @text given to @option: a whole number with an optional unit M, G or T (also
 * MiB, GiB, TiB; case does not matter), a bare number being in @bare_mib MiB (1: MiB, as new's
 * --memory; 1024: GiB, as new's --disk), and an optional leading '+' meaning "this much more".
 * Returns the size in MiB (at least 1, at most @max_mib) in @ret_mib and whether it was relative
 * in @ret_relative. Fails with a usage error naming the option. */
gboolean vmctl_parse_size(VmctlContext *ctx, const char *option, const char *text, guint bare_mib,
                          guint64 max_mib, gboolean *ret_relative, guint64 *ret_mib,
                          GError **error);
/* Adds the numeric option @option (its text @text, NULL when not given) to @fields under @key
 * as a "u" of at least 1; a bad number is a usage error naming @option. */
gboolean vmctl_dict_add_uint(VmctlContext *ctx, GVariantDict *fields, const char *option,
                             const char *text, const char *key, GError **error);

/* vmctl_parse() for verbs that take exactly one agent or template NAME, which is checked here so
 * a typo fails before anything is sent. Returns the start of the request's fields: a new
 * GVariantDict holding "name"; NULL on failure. */
GVariantDict *vmctl_parse_name(VmctlContext *ctx, int argc, char **argv,
                               const GOptionEntry *entries, GError **error);

/* vmctl_parse() for verbs that act on one or more agents: "VERB [OPTION...] NAME...". Each name
 * is checked, and one given twice is refused, so a typo fails before anything is sent. Returns
 * the names, newly allocated and NULL-terminated (never empty); NULL on failure. */
char **vmctl_parse_names(VmctlContext *ctx, int argc, char **argv, const GOptionEntry *entries,
                         GError **error);

/* The socket vmctl talks to: --socket, else $VMCTL_SOCKET, else the first of
 * vmctl_socket_candidates() that exists. Fails with VM_ERROR_NOT_RUNNING when none does. Newly
 * allocated. */
char *vmctl_socket_path(const VmctlContext *ctx, GError **error);

/* Where hostd is: --host, else --socket, else $VMCTL_HOST, else $VMCTL_SOCKET, else the default
 * socket. Fills @ret_endpoint with pointers into @ctx (valid while it lives). Fails with a usage
 * error for a bad URL or for --host with --socket. */
gboolean vmctl_endpoint(VmctlContext *ctx, VmctlEndpoint *ret_endpoint, GError **error);

/* Frees what @ctx owns (its options and what vmctl_endpoint() made); @ctx itself is the
 * caller's. Can't fail. */
void vmctl_context_clear(VmctlContext *ctx);

/* How progress shows: not at all with --quiet, as a redrawn bar when stderr is a terminal, else
 * as plain lines. */
VmctlProgressMode vmctl_progress_mode(const VmctlContext *ctx);

/* Sends the request @op with @fields (an a{sv}, floating refs are sunk; NULL means empty) and
 * waits for the RESULT, showing PROGRESS as ctx->progress says. Returns the RESULT in
 * @ret_result (owned by the caller); fails with hostd's error, or the connection's. When hostd
 * sent it to another host of its fleet (ELSEWHERE, followed once), that host is ctx's endpoint
 * from then on. */
gboolean vmctl_request(VmctlContext *ctx, VmOp op, GVariant *fields, VmMessage **ret_result,
                       GError **error);

/* Asks hostd its protocol version (PING) and fails with VM_ERROR_PROTOCOL "WHAT needs hostd's
 * protocol N; hostd speaks M (an older hostd)" when it is older than @version: what @what
 * would send is something it would refuse. */
gboolean vmctl_require_protocol(VmctlContext *ctx, guint32 version, const char *what,
                                GError **error);

/* Returns the field @key of @result when it has type @type (a variant around it is unboxed), else
 * NULL. New reference. */
GVariant *vmctl_result_get(const VmMessage *result, const char *key, const GVariantType *type);

/* Returns the list of records (aa{sv}) in field @key of @result; an empty list when it has none,
 * as hostd leaves out an empty list. Never NULL. New reference. */
GVariant *vmctl_result_rows(const VmMessage *result, const char *key);

/* Prints a RESULT: with --json the value of @key in it (or all its fields when @key is NULL or
 * absent) as JSON; otherwise @text followed by a newline. Can't fail. */
void vmctl_print_result(VmctlContext *ctx, const VmMessage *result, const char *key,
                        const char *text);

/* Sends @op with @fields (as vmctl_request()) and prints the aa{sv} field @key of its RESULT as a
 * table of @columns, or with --json as a JSON array. */
gboolean vmctl_print_list(VmctlContext *ctx, VmOp op, GVariant *fields, const char *key,
                          const VmctlField *columns, gsize n_columns, GError **error);

/* How a verb shows one line of a log: a new string. */
typedef char *(*VmctlLineFormat)(const char *line);

/* Sends @op with @fields (as vmctl_request()), a request answered with a stream of lines
 * (egress-log, events), and prints each whole line as it comes, through @format (as it came with
 * --json or a NULL @format), until the stream ends. Fails with hostd's error, the connection's,
 * or VM_ERROR_IO when stdout cannot be written. */
gboolean vmctl_print_stream(VmctlContext *ctx, VmOp op, GVariant *fields, VmctlLineFormat format,
                            GError **error);

/* Sends a request about one agent that answers with {agent} (start, stop, rm) and prints
 * "@done NAME" (or the JSON). @fields must hold "name". */
gboolean vmctl_agent_action(VmctlContext *ctx, VmOp op, GVariantDict *fields, const char *done,
                            GError **error);

/* vmctl_agent_action() for each of @names in turn, each request with the fields of @fields (no
 * "name"; it is added per agent, and @fields is ended here). One name is exactly
 * vmctl_agent_action(). With several, a failure stops none of the others (but one to reach hostd
 * at all, NOT_RUNNING or PERMISSION, fails the whole as for one name): each success prints
 * "@done NAME", each failure "vmctl: NAME: MESSAGE" on stderr, and vmctl exits with 0 when all
 * succeeded, else with the status of the first failure (set in ctx->exit_status; TRUE is
 * returned). With --json, one array of {name, agent} or {name, error: {code, message}}. Fails
 * only when stdout cannot be written. */
gboolean vmctl_agent_actions(VmctlContext *ctx, VmOp op, char **names, GVariantDict *fields,
                             const char *done, GError **error);

/* Reads the public keys in each of @files (NULL-terminated paths of key files, one key a line)
 * and returns their lines as hostd takes them: each key is checked here (vm_ssh_key_read_file()),
 * so that a wrong file fails before anything is sent, and hostd checks it again. At most
 * VM_SSH_KEYS_MAX keys in all. Fails with VM_ERROR_INVALID_ARGUMENT naming the file and line, or
 * VM_ERROR_IO. Newly allocated, NULL-terminated. */
char **vmctl_read_ssh_keys(const char *const *files, GError **error);

/* What the positional arguments of @verb ("stop", "checkpoint rm") are, for the shell
 * completions (`vmctl __complete`): kinds one a word, in order: agent (an existing agent),
 * checkpoint (one of the first argument's), template, secret, restart (a restart policy), file;
 * the last may end in "..." (it repeats). Empty for a verb that takes none of these, or one not
 * listed: its arguments complete to nothing (a new name, a command to run). Static; can't
 * fail. */
const char *vmctl_completes(const char *verb);
/* @options (a repeatable egress option's values) with each value split at its commas, empty
 * pieces dropped: "@pypi,@npm" is two rules (no rule holds a comma). Newly allocated,
 * NULL-terminated; can't fail. */
char **vmctl_split_rules(const char *const *options);

/* The verbs, one per vmctl-cmd-<verb>.c. */
gboolean vmctl_cmd_template_list(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_template_build(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_new(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_list(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_hosts(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_drain(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_move(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_recover(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_replicate(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_undrain(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_info(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_exec(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_cp(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_ssh(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_ssh_config(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_start(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_stop(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_rm(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_checkpoint(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_checkpoint_rm(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_checkpoints(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_restore(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_suspend(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_resume(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_keep_awake(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_idle(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_autocheckpoint(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_fork(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_diff(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_egress(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_egress_presets(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_egress_log(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_autorestart(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_set(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_stop_host_agents(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_events(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_forward(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_bridge(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_mcp(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_authorize(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_secret_create(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_secret_list(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_secret_set(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_secret_rm(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_secret_grant(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_secret_revoke(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_logs(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_stats(VmctlContext *ctx, int argc, char **argv, GError **error);
gboolean vmctl_cmd_top(VmctlContext *ctx, int argc, char **argv, GError **error);

/* Asks hostd for the figures of the agents @names (NULL or empty: all), checked here first
 * (stats and top). Returns the RESULT in @ret_result; fails as vmctl_request(), or with
 * VM_ERROR_INVALID_ARGUMENT for a bad name. */
gboolean vmctl_stats_fetch(VmctlContext *ctx, char **names, VmMessage **ret_result, GError **error);

G_END_DECLS
