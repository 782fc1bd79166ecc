#include "hostd-logs.h"

#include "hostd-agent.h"
#include "hostd-guest.h"
#include "hostd-logfile.h"

#include <string.h>

#include "vm-error.h"
#include "vm-log-text.h"
#include "vm-name.h"
#include "vm-stream.h"

void
hostd_logs_escape_line(const char *line, gsize len, GString *out)
{
    /* The console ends its lines with "\r\n". */
    while (len > 0 && line[len - 1] == '\r')
        len--;
    g_autofree char *shown = vm_log_text(line, (gssize)len, HOSTD_LOGS_LINE_MAX);

    g_string_append(out, shown);
    g_string_append_c(out, '\n');
}

GString *
hostd_logs_escape_tail(const char *text, gsize len, guint lines)
{
    g_autoptr(GPtrArray) spans = g_ptr_array_new();
    GString *out = g_string_new(NULL);
    gsize end = len;

    /* A last line the guest did not end (a login prompt) is a line too. */
    if (end > 0 && text[end - 1] == '\n')
        end--;
    while (len > 0 && spans->len / 2 < lines) {
        gsize start = end;

        while (start > 0 && text[start - 1] != '\n')
            start--;
        g_ptr_array_add(spans, GSIZE_TO_POINTER(start));
        g_ptr_array_add(spans, GSIZE_TO_POINTER(end - start));
        if (start == 0)
            break;
        end = start - 1;
    }
    for (guint i = spans->len; i >= 2; i -= 2)
        hostd_logs_escape_line(text + GPOINTER_TO_SIZE(spans->pdata[i - 2]),
                               GPOINTER_TO_SIZE(spans->pdata[i - 1]), out);
    return out;
}

static void
logs_format(const char *line, gsize len, GString *out, gpointer user_data)
{
    hostd_logs_escape_line(line, len, out);
}

/* A follower of the console goes on while the agent exists. */
static gboolean
logs_alive(gpointer user_data)
{
    return g_file_test(user_data, G_FILE_TEST_EXISTS);
}

/* cloud-init's output in the running guest @r, the end of it, as root in the guest (the file is
 * not the agent user's to read on every image). */
static GBytes *
logs_cloud_init(HostdContext *ctx, const HostdAgentRecord *r, GError **error)
{
    g_autofree char *bytes = g_strdup_printf("%d", HOSTD_LOGS_CLOUD_INIT_MAX);
    char *argv[] = {"sudo", "-n", "tail", "-c", bytes, HOSTD_LOGS_CLOUD_INIT_PATH, NULL};
    g_autoptr(GBytes) out = NULL;
    g_autofree char *err = NULL;
    int status = -1;

    if (!hostd_agent_run_output(ctx, r, argv, -1, HOSTD_LOGS_CLOUD_INIT_MAX, &status, &out, &err,
                                error))
        return NULL;
    if (status != 0) {
        g_autofree char *why = vm_log_text(err, -1, 512);

        vm_throw(error, VM_ERROR_FAILED, "cannot read %s in agent '%s' (status %d): %s",
                 HOSTD_LOGS_CLOUD_INIT_PATH, r->name, status, why);
        return NULL;
    }
    return g_steal_pointer(&out);
}

gboolean
hostd_agent_logs(HostdContext *ctx, const char *name, gboolean follow, guint lines,
                 gboolean cloud_init, int client_fd, GError **error)
{
    g_autoptr(HostdAgentRecord) r = NULL;
    VmStreamWriter reply = VM_STREAM_WRITER_INIT(client_fd);

    if (follow && cloud_init)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "--follow shows the console; cloud-init's output is read once");
    if (!cloud_init) {
        g_autofree char *path = NULL;
        g_autofree char *record_path = NULL;
        HostdLogFileQuery query = {
            .lines = lines,
            .follow = follow,
            .alive = logs_alive,
            .show = logs_format,
        };

        r = hostd_agent_load(ctx, name, error);
        if (r == NULL)
            return FALSE;
        path = hostd_agent_record_path(r, HOSTD_AGENT_CONSOLE);
        record_path = hostd_agent_record_path(r, HOSTD_AGENT_RECORD);
        query.user_data = record_path;
        hostd_logfile_send(path, &query, &reply);
        return TRUE;
    }

    g_autoptr(virDomain) dom = NULL;
    if (!vm_name_validate(name, error) || !hostd_agent_open(ctx, name, &r, &dom, error))
        return FALSE;
    const char *state = hostd_libvirt_state_name(dom);
    if (!g_str_equal(state, "running"))
        return vm_throw(error, VM_ERROR_BAD_STATE,
                        "agent '%s' is %s; cloud-init's output is read from the running guest "
                        "(vmctl resume %s, or vmctl start %s)",
                        name, state, name, name);
    g_autoptr(GBytes) text = logs_cloud_init(ctx, r, error);
    if (text == NULL)
        return FALSE;
    gsize len = 0;
    const char *data = g_bytes_get_data(text, &len);
    g_autoptr(GString) out = hostd_logs_escape_tail(data, len, lines);
    if (vm_stream_writer_data(&reply, VM_OP_STDOUT, out->str, out->len, NULL))
        (void)vm_stream_writer_exit(&reply, 0, NULL);
    return TRUE;
}
