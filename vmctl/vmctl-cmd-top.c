#include "vmctl.h"

#include "vm-util.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

/* The longest refresh interval, in seconds. */
#define TOP_INTERVAL_MAX 3600

static volatile sig_atomic_t top_interrupted = 0;

static void
top_on_signal(int signo)
{
    top_interrupted = 1;
}

/* One screen: a summary line and the table. */
static char *
top_frame(VmMessage *result)
{
    g_autoptr(GVariant) agents = vmctl_result_rows(result, "agents");
    g_autoptr(GVariant) uptime = vmctl_result_get(result, "uptime_s", G_VARIANT_TYPE_DOUBLE);
    g_autoptr(GVariant) ksm = vmctl_result_get(result, "ksm", G_VARIANT_TYPE_VARDICT);
    g_autofree char *ksm_line = ksm != NULL ? vmctl_format_ksm(ksm) : g_strdup("");
    g_autoptr(GDateTime) now = g_date_time_new_now_local();
    g_autofree char *clock = g_date_time_format(now, "%H:%M:%S");
    g_autofree char *table = vmctl_format_stats(agents);
    gsize n = g_variant_n_children(agents), running = 0;
    guint64 up = uptime != NULL ? (guint64)g_variant_get_double(uptime) : 0;

    for (gsize i = 0; i < n; i++) {
        g_autoptr(GVariant) agent = g_variant_get_child_value(agents, i);
        const char *state = NULL;

        if (g_variant_lookup(agent, "state", "&s", &state) && g_str_equal(state, "running"))
            running++;
    }
    return g_strdup_printf(
        "vmctl top - %s, hostd up %" G_GUINT64_FORMAT ":%02u:%02u, %" G_GSIZE_FORMAT
        " agents, %" G_GSIZE_FORMAT " running\n%s\n%s",
        clock, up / 3600, (guint)(up / 60 % 60), (guint)(up % 60), n, running, ksm_line, table);
}

/* Waits up to @ms for a key on the terminal: TRUE when it was q or Q (or stdin ended). */
static gboolean
top_wait_quit(int ms)
{
    struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
    gint64 deadline = g_get_monotonic_time() + (gint64)ms * 1000;

    while (!top_interrupted) {
        gint64 left = (deadline - g_get_monotonic_time()) / 1000;
        char key;

        if (left <= 0)
            return FALSE;
        int n = poll(&pfd, 1, (int)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return FALSE;
        if (read(STDIN_FILENO, &key, 1) != 1 || key == 'q' || key == 'Q')
            return TRUE;
    }
    return TRUE;
}

gboolean
vmctl_cmd_top(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    g_autofree char *interval_text = NULL;
    g_auto(GStrv) names = NULL;
    guint32 interval = 2;
    const GOptionEntry entries[] = {
        {"interval", 'd', 0, G_OPTION_ARG_STRING, &interval_text,
         "Seconds between refreshes (default: 2)", "S"},
        G_OPTION_ENTRY_NULL,
    };
    struct termios saved, raw;
    gboolean tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO) && !ctx->json;
    gboolean ok = TRUE;

    if (!vmctl_parse(ctx, argc, argv, entries, 0, VM_NAMES_MAX, &names, error))
        return FALSE;
    if (interval_text != NULL &&
        !vmctl_parse_uint(ctx, "--interval", interval_text, 1, TOP_INTERVAL_MAX, &interval, error))
        return FALSE;
    if (!tty) {
        /* Not a terminal: one frame, as `top -b -n 1` would. */
        g_autoptr(VmMessage) result = NULL;

        if (!vmctl_stats_fetch(ctx, names, &result, error))
            return FALSE;
        g_autoptr(GVariant) agents = vmctl_result_rows(result, "agents");
        g_autofree char *text = ctx->json ? vmctl_format_json(agents) : top_frame(result);
        fputs(text, stdout);
        return TRUE;
    }

    struct sigaction action = {.sa_handler = top_on_signal};
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    gboolean raw_set = tcgetattr(STDIN_FILENO, &saved) == 0;
    if (raw_set) {
        raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 1;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    /* The alternate screen, as top uses: the terminal's contents come back at the end. */
    fputs("\033[?1049h\033[?25l", stdout);
    while (!top_interrupted) {
        g_autoptr(VmMessage) result = NULL;

        if (!vmctl_stats_fetch(ctx, names, &result, error)) {
            ok = FALSE;
            break;
        }
        g_autofree char *frame = top_frame(result);
        fputs("\033[H\033[2J", stdout);
        fputs(frame, stdout);
        fflush(stdout);
        if (top_wait_quit((int)interval * 1000))
            break;
    }
    fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    if (raw_set)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    return ok;
}
