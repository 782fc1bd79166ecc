/* vmctl: the command line of hostd. Every verb sends one request to hostd and prints the answer;
 * the work happens in hostd. */
#include "vmctl.h"

#include "vm-config.h"
#include "vm-error.h"

#include <stdio.h>
#include <string.h>

static const VmctlVerb verbs[] = {
    {"new", vmctl_cmd_new, "NAME", "Create an agent and start its VM"},
    {"list", vmctl_cmd_list, "", "List the agents (--fleet: every host's)"},
    {"hosts", vmctl_cmd_hosts, "", "List the fleet's hosts: capacity, load and liveness"},
    {"drain", vmctl_cmd_drain, "HOST", "Move a fleet host's agents away and keep new ones off it"},
    {"move", vmctl_cmd_move, "NAME", "Move an agent, running, to another host of the fleet"},
    {"replicate", vmctl_cmd_replicate, "NAME",
     "Copy an agent's newest checkpoint to the hosts that keep its replicas"},
    {"recover", vmctl_cmd_recover, "NAME", "Bring back a lost host's agent from its replica"},
    {"undrain", vmctl_cmd_undrain, "HOST", "Let a drained host of the fleet take new agents again"},
    {"info", vmctl_cmd_info, "NAME", "Show everything about one agent"},
    {"exec", vmctl_cmd_exec, "NAME [--] CMD [ARG...]", "Run a command in an agent's VM"},
    {"cp", vmctl_cmd_cp, "SOURCE DEST",
     "Copy files between this host and an agent, or two agents (AGENT:PATH)"},
    {"ssh", vmctl_cmd_ssh, "NAME [-- CMD [ARG...]]", "Open an SSH session to an agent's VM"},
    {"ssh-config", vmctl_cmd_ssh_config, "[NAME]", "Print the OpenSSH configuration of agents"},
    {"authorize", vmctl_cmd_authorize, "NAME [FILE]",
     "Let your own SSH public keys log in to an agent (--list, --rm)"},
    {"start", vmctl_cmd_start, "NAME...", "Start stopped agents"},
    {"stop", vmctl_cmd_stop, "NAME...", "Stop agents' VMs"},
    {"rm", vmctl_cmd_rm, "NAME...", "Remove agents and their disks"},
    {"suspend", vmctl_cmd_suspend, "NAME...", "Pause agents (or --save them to disk)"},
    {"resume", vmctl_cmd_resume, "NAME...", "Wake paused or saved agents"},
    {"keep-awake", vmctl_cmd_keep_awake, "NAME...", "Hold agents awake"},
    {"idle", vmctl_cmd_idle, "NAME", "Set when an idle agent is paused and saved"},
    {"set", vmctl_cmd_set, "NAME",
     "Give an agent more CPUs, memory or disk (--cpus, --memory, --disk)"},
    {"autorestart", vmctl_cmd_autorestart, "NAME POLICY",
     "Set what a crash or a poweroff inside does: on-crash, always, never"},
    {"stop-host-agents", vmctl_cmd_stop_host_agents, "",
     "Save every running agent to disk, processes and all (host maintenance)"},
    {"checkpoint rm", vmctl_cmd_checkpoint_rm, "NAME CHECKPOINT", "Remove a checkpoint"},
    {"checkpoint", vmctl_cmd_checkpoint, "NAME", "Checkpoint an agent's disk, live"},
    {"checkpoints", vmctl_cmd_checkpoints, "NAME", "List an agent's checkpoints"},
    {"autocheckpoint", vmctl_cmd_autocheckpoint, "NAME",
     "Set how often an agent is checkpointed by itself"},
    {"restore", vmctl_cmd_restore, "NAME CHECKPOINT",
     "Put an agent, or chosen paths of it, back to a checkpoint"},
    {"diff", vmctl_cmd_diff, "NAME CHECKPOINT [OTHER]",
     "List files added, deleted and modified since a checkpoint"},
    {"fork", vmctl_cmd_fork, "SOURCE NAME", "Create an agent from another one's disk, live"},
    {"egress presets", vmctl_cmd_egress_presets, "",
     "List the egress presets (@debian, @pypi, ...) and their rules"},
    {"egress", vmctl_cmd_egress, "NAME", "Show or change where an agent may connect"},
    {"egress-log", vmctl_cmd_egress_log, "NAME", "Show an agent's egress log"},
    {"events", vmctl_cmd_events, "[AGENT]", "Show what happened to agents, and who did it"},
    {"logs", vmctl_cmd_logs, "NAME", "Show an agent's console (or --cloud-init's output)"},
    {"stats", vmctl_cmd_stats, "[AGENT...]",
     "Show agents' CPU, memory, disk, egress and exec figures"},
    {"top", vmctl_cmd_top, "[AGENT...]", "Show agents' figures, refreshed like top"},
    {"secret create", vmctl_cmd_secret_create, "NAME",
     "Store a credential on the host (value on stdin or --from-file, never in a VM)"},
    {"secret list", vmctl_cmd_secret_list, "",
     "List the secrets and who holds them (never values)"},
    {"secret set", vmctl_cmd_secret_set, "NAME", "Rotate a secret's value (stdin or --from-file)"},
    {"secret rm", vmctl_cmd_secret_rm, "NAME", "Remove a secret (--force: revoke it first)"},
    {"secret grant", vmctl_cmd_secret_grant, "AGENT NAME",
     "Give an agent a placeholder that its egress proxy swaps for the secret"},
    {"secret revoke", vmctl_cmd_secret_revoke, "AGENT NAME", "Take a secret back from an agent"},
    {"forward", vmctl_cmd_forward, "AGENT GUEST_PORT",
     "Serve a port of an agent's VM on 127.0.0.1 (--list, --rm)"},
    {"mcp", vmctl_cmd_mcp, "",
     "Serve hostd's agents as Model Context Protocol tools on stdin and stdout"},
    {"bridge", vmctl_cmd_bridge, "",
     "Pass hostd's protocol between stdio and its socket (--host runs it remotely)"},
    {"template list", vmctl_cmd_template_list, "", "List the templates"},
    {"template build", vmctl_cmd_template_build, "NAME", "Build the base image of a template"},
};

static void
print_usage(FILE *stream)
{
    fputs("Usage: vmctl [OPTION...] COMMAND [ARG...]\n"
          "\n"
          "Gives every AI agent its own long-lived Linux VM, run by hostd.\n"
          "\n"
          "Commands:\n",
          stream);
    for (gsize i = 0; i < G_N_ELEMENTS(verbs); i++)
        fprintf(stream, "  %-18s%s\n", verbs[i].name, verbs[i].summary);
    fputs("\n"
          "Options:\n"
          "  --socket PATH   Talk to hostd at PATH (default: $VMCTL_SOCKET, else your own\n"
          "                  hostd's socket, else the system's: see vmctl(1), SOCKET)\n"
          "  --host URL      Talk to hostd on another host over SSH:\n"
          "                  ssh://[USER@]HOST[:PORT][/SOCKET] (default: $VMCTL_HOST)\n"
          "  --json          Print results as JSON\n"
          "  -q, --quiet     Do not show progress\n"
          "  --version       Print the version\n"
          "  -h, --help      Show this help\n"
          "\n"
          "Run 'vmctl COMMAND --help' for the options of a command.\n",
          stream);
}

/* For the shell completions (dist/): every command, what its arguments are
 * (vmctl_completes()) and its summary, a line each, tab-separated. Not in the usage: no one
 * types it. */
static void
print_completions(void)
{
    for (gsize i = 0; i < G_N_ELEMENTS(verbs); i++)
        printf("%s\t%s\t%s\n", verbs[i].name, vmctl_completes(verbs[i].name), verbs[i].summary);
}

/* Finds the verb named by @args (one word, or two for a subcommand) and returns how many words
 * name it in @ret_words. Two words win over one, wherever they are in the table: "checkpoint
 * rm a1 c1" is checkpoint rm, not a checkpoint of an agent named rm. */
static const VmctlVerb *
find_verb(char **args, int *ret_words)
{
    for (gsize i = 0; args[1] != NULL && i < G_N_ELEMENTS(verbs); i++) {
        const char *space = strchr(verbs[i].name, ' ');
        if (space != NULL && strncmp(verbs[i].name, args[0], space - verbs[i].name) == 0 &&
            args[0][space - verbs[i].name] == '\0' && strcmp(space + 1, args[1]) == 0) {
            *ret_words = 2;
            return &verbs[i];
        }
    }
    for (gsize i = 0; i < G_N_ELEMENTS(verbs); i++) {
        if (strcmp(verbs[i].name, args[0]) == 0) {
            *ret_words = 1;
            return &verbs[i];
        }
    }
    return NULL;
}

/* Whether @group ("template") names subcommands ("template list"). */
static gboolean
is_group(const char *group)
{
    gsize len = strlen(group);

    for (gsize i = 0; i < G_N_ELEMENTS(verbs); i++) {
        if (strncmp(verbs[i].name, group, len) == 0 && verbs[i].name[len] == ' ')
            return TRUE;
    }
    return FALSE;
}

/* The subcommands of @group as lines of a help text: "  list  List the templates\n"..., each
 * word after @prefix. */
static char *
subcommand_lines(const char *group, const char *prefix)
{
    g_autoptr(GString) text = g_string_new(NULL);
    gsize len = strlen(group);

    for (gsize i = 0; i < G_N_ELEMENTS(verbs); i++) {
        if (strncmp(verbs[i].name, group, len) != 0 || verbs[i].name[len] != ' ')
            continue;
        g_autofree char *usage =
            g_strconcat(prefix, verbs[i].name + len + 1, " ", verbs[i].params, NULL);
        g_strchomp(usage);
        if (strlen(usage) <= 22)
            g_string_append_printf(text, "  %-24s%s\n", usage, verbs[i].summary);
        else
            g_string_append_printf(text, "  %s\n  %-24s%s\n", usage, "", verbs[i].summary);
    }
    return g_string_free(g_steal_pointer(&text), FALSE);
}

/* The usage of a group with no verb of its own ("vmctl secret"): its subcommands. */
static void
print_group_usage(const char *group)
{
    g_autofree char *lines = subcommand_lines(group, "");

    printf("Usage: vmctl [OPTION...] %s COMMAND [ARG...]\n"
           "\n"
           "Commands:\n"
           "%s"
           "\n"
           "Run 'vmctl %s COMMAND --help' for the options of a command.\n",
           group, lines, group);
}

static gboolean
is_help(const char *arg)
{
    return arg != NULL && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0);
}

static int
report_failure(const VmctlContext *ctx, const GError *error)
{
    VmErrorCode code = vm_error_code(error);

    if (ctx->json) {
        /* A local message may quote a file name that is not UTF-8; JSON text must be. */
        g_autofree char *message = g_utf8_make_valid(error->message, -1);
        g_autoptr(GVariant) value = g_variant_ref_sink(g_variant_new_parsed(
            "{'error': <{'code': <%s>, 'message': <%s>}>}", vm_error_code_name(code), message));
        g_autofree char *json = vmctl_format_json(value);
        fputs(json, stdout);
    }
    /* hostd's messages may quote the guest (its console, a command's stderr): never raw. */
    g_autofree char *message = vmctl_format_escaped_lines(error->message);
    fprintf(stderr, "vmctl: %s\n", message);
    return ctx->failure_status != 0 ? ctx->failure_status : vm_error_exit_status(code);
}

static gboolean
run_verb(VmctlContext *ctx, char **args, GError **error)
{
    int words = 0;

    ctx->verb = find_verb(args, &words);
    if (ctx->verb == NULL && is_group(args[0])) {
        /* Bare, or asking for help: the group's usage. A word that is no subcommand of it is
         * a usage error. */
        if (args[1] == NULL || is_help(args[1])) {
            print_group_usage(args[0]);
            return TRUE;
        }
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "unknown command '%s %s'; see 'vmctl %s --help'", args[0], args[1],
                        args[0]);
    }
    if (ctx->verb == NULL)
        return vmctl_usage_error(ctx, error, "unknown command '%s'", args[0]);
    /* A verb that is a group as well ("checkpoint", "checkpoint rm") lists its subcommands in
     * its help. */
    g_autofree char *also = NULL;
    if (words == 1 && is_group(args[0])) {
        g_autofree char *prefix = g_strconcat("vmctl ", args[0], " ", NULL);
        g_autofree char *lines = subcommand_lines(args[0], prefix);
        also = g_strconcat("Subcommands:\n", lines, NULL);
        ctx->verb_description = also;
    }
    args += words - 1;
    if (!ctx->verb->func(ctx, (int)g_strv_length(args), args, error))
        return FALSE;
    if (fflush(stdout) != 0 || ferror(stdout))
        return vm_throw(error, VM_ERROR_IO, "cannot write the output");
    return TRUE;
}

static gboolean
run(VmctlContext *ctx, char **argv, GError **error)
{
    gboolean version = FALSE, help = FALSE;
    const GOptionEntry entries[] = {
        {"version", 0, 0, G_OPTION_ARG_NONE, &version, NULL, NULL},
        {"help", 'h', 0, G_OPTION_ARG_NONE, &help, NULL, NULL},
        G_OPTION_ENTRY_NULL,
    };
    g_autoptr(GOptionContext) options = g_option_context_new(NULL);
    g_autoptr(GError) local_error = NULL;
    g_auto(GStrv) args = g_strdupv(argv);

    /* Global options end at the verb; what follows is the verb's. */
    g_option_context_set_strict_posix(options, TRUE);
    g_option_context_set_help_enabled(options, FALSE);
    g_option_context_add_main_entries(options, entries, NULL);
    vmctl_add_global_options(options, ctx);
    if (!g_option_context_parse_strv(options, &args, &local_error)) {
        local_error->message[0] = g_ascii_tolower(local_error->message[0]);
        return vmctl_usage_error(ctx, error, "%s", local_error->message);
    }
    if (version) {
        printf("vmctl %s (protocol %d)\n", VM_VERSION, VM_PROTOCOL_VERSION);
        return TRUE;
    }

    char **rest = args + 1;
    if (rest[0] != NULL && strcmp(rest[0], "--") == 0)
        rest++;
    if (help || (rest[0] != NULL && strcmp(rest[0], "help") == 0 && rest[1] == NULL)) {
        print_usage(stdout);
        return TRUE;
    }
    if (rest[0] == NULL) {
        print_usage(stdout);
        return TRUE;
    }
    if (strcmp(rest[0], "__complete") == 0 && rest[1] == NULL) {
        print_completions();
        return TRUE;
    }
    if (strcmp(rest[0], "help") == 0) {
        /* `vmctl help VERB [SUB]` is `vmctl VERB [SUB] --help`. */
        g_autoptr(GStrvBuilder) builder = g_strv_builder_new();
        g_strv_builder_addv(builder, (const char **)rest + 1);
        g_strv_builder_add(builder, "--help");
        g_auto(GStrv) help_args = g_strv_builder_end(builder);
        return run_verb(ctx, help_args, error);
    }
    return run_verb(ctx, rest, error);
}

int
main(int argc, char **argv)
{
    VmctlContext ctx = {0};
    g_autoptr(GError) error = NULL;
    int status = run(&ctx, argv, &error) ? ctx.exit_status : report_failure(&ctx, error);

    vmctl_context_clear(&ctx);
    return status;
}
