/* The messages between hostd and an agent's SSH worker. */
#include "hostd-ssh-wire.h"

#include <string.h>

#include "vm-error.h"

#define START_TYPE  "(sssussbuu)"
#define EXEC_TYPE   "(asassbsuubb)"
#define EXEC_FORMAT "(^as^assbsuubb)"
#define DONE_TYPE   "(busa(sx))"

GVariant *
hostd_ssh_wire_start_new(const HostdSshTarget *target, const char *identity_pem,
                         const char *host_key, gboolean change_user, guint uid, guint gid)
{
    return g_variant_new(START_TYPE, target->agent, target->host, target->user, target->port,
                         identity_pem, host_key, change_user, uid, gid);
}

gboolean
hostd_ssh_wire_start_parse(GVariant *payload, HostdSshWireStart *out, GError **error)
{
    memset(out, 0, sizeof(*out));
    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE(START_TYPE)))
        return vm_throw(error, VM_ERROR_PROTOCOL, "a start message of type %s",
                        g_variant_get_type_string(payload));
    g_variant_get(payload, START_TYPE, &out->agent, &out->host, &out->user, &out->port,
                  &out->identity_pem, &out->host_key, &out->change_user, &out->uid, &out->gid);
    return TRUE;
}

void
hostd_ssh_wire_start_target(const HostdSshWireStart *start, HostdSshTarget *out)
{
    *out = (HostdSshTarget){
        .agent = start->agent,
        .host = start->host,
        .port = start->port,
        .user = start->user,
        .identity_pem = start->identity_pem,
        .host_key = start->host_key,
    };
}

void
hostd_ssh_wire_start_clear(HostdSshWireStart *start)
{
    if (start->identity_pem != NULL)
        explicit_bzero(start->identity_pem, strlen(start->identity_pem));
    g_free(start->identity_pem);
    g_free(start->agent);
    g_free(start->host);
    g_free(start->user);
    g_free(start->host_key);
    memset(start, 0, sizeof(*start));
}

GVariant *
hostd_ssh_wire_exec_new(const HostdExecRequest *request)
{
    char *none[] = {NULL};

    return g_variant_new(EXEC_FORMAT, request->argv, request->env != NULL ? request->env : none,
                         request->cwd != NULL ? request->cwd : "", request->tty,
                         request->term != NULL ? request->term : "", request->cols, request->rows,
                         request->trace != NULL, request->before_command != NULL);
}

gboolean
hostd_ssh_wire_exec_parse(GVariant *payload, HostdSshWireExec *out, GError **error)
{
    memset(out, 0, sizeof(*out));
    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE(EXEC_TYPE)))
        return vm_throw(error, VM_ERROR_PROTOCOL, "an exec message of type %s",
                        g_variant_get_type_string(payload));
    g_variant_get(payload, EXEC_FORMAT, &out->argv, &out->env, &out->cwd, &out->request.tty,
                  &out->term, &out->request.cols, &out->request.rows, &out->traced,
                  &out->before_command);
    out->request.argv = out->argv;
    out->request.env = out->env[0] != NULL ? out->env : NULL;
    out->request.cwd = out->cwd[0] != '\0' ? out->cwd : NULL;
    out->request.term = out->term[0] != '\0' ? out->term : NULL;
    return TRUE;
}

void
hostd_ssh_wire_exec_clear(HostdSshWireExec *exec)
{
    g_strfreev(exec->argv);
    g_strfreev(exec->env);
    g_free(exec->cwd);
    g_free(exec->term);
    memset(exec, 0, sizeof(*exec));
}

GVariant *
hostd_ssh_wire_done_new(const GError *error, const VmTrace *trace)
{
    GVariantBuilder marks;

    g_variant_builder_init(&marks, G_VARIANT_TYPE("a(sx)"));
    for (guint i = 0; trace != NULL && trace->marks != NULL && i < trace->marks->len; i++) {
        const VmTraceMark *mark = &g_array_index(trace->marks, VmTraceMark, i);

        g_variant_builder_add(&marks, "(sx)", mark->phase, (gint64)mark->when);
    }
    return g_variant_new(DONE_TYPE, error == NULL,
                         (guint32)(error == NULL               ? 0
                                   : error->domain == VM_ERROR ? (guint)error->code
                                                               : (guint)VM_ERROR_SSH),
                         error != NULL ? error->message : "", &marks);
}

/* A phase name as hostd's own are spelled: lower-case words. */
static gboolean
phase_ok(const char *phase)
{
    if (*phase == '\0' || strlen(phase) > HOSTD_SSH_WIRE_PHASE_MAX)
        return FALSE;
    for (const char *p = phase; *p != '\0'; p++) {
        if (!g_ascii_islower(*p) && !g_ascii_isdigit(*p) && *p != ' ' && *p != '-')
            return FALSE;
    }
    return TRUE;
}

char *
hostd_ssh_wire_text(const char *text)
{
    GString *safe = g_string_new(NULL);

    for (const char *p = text; *p != '\0' && safe->len < HOSTD_SSH_WIRE_MESSAGE_MAX; p++)
        g_string_append_c(safe, g_ascii_isprint(*p) ? *p : '?');
    return g_string_free(safe, FALSE);
}

char *
hostd_ssh_wire_ready_note(GVariant *payload)
{
    if (payload == NULL || !g_variant_is_of_type(payload, G_VARIANT_TYPE_STRING) ||
        *g_variant_get_string(payload, NULL) == '\0')
        return NULL;
    return hostd_ssh_wire_text(g_variant_get_string(payload, NULL));
}

gboolean
hostd_ssh_wire_done_parse(GVariant *payload, VmTrace *trace, GError **error)
{
    g_autoptr(GVariant) marks = NULL;
    g_autofree char *message = NULL;
    const char *text;
    gboolean ok;
    guint32 code;

    if (!g_variant_is_of_type(payload, G_VARIANT_TYPE(DONE_TYPE)))
        return vm_throw(error, VM_ERROR_PROTOCOL, "the SSH worker answered with a %s",
                        g_variant_get_type_string(payload));
    g_variant_get(payload, "(bu&s@a(sx))", &ok, &code, &text, &marks);
    if (g_variant_n_children(marks) > HOSTD_SSH_WIRE_MARKS_MAX)
        return vm_throw(error, VM_ERROR_PROTOCOL, "the SSH worker sent %" G_GSIZE_FORMAT " marks",
                        g_variant_n_children(marks));
    for (gsize i = 0; i < g_variant_n_children(marks); i++) {
        const char *phase;
        gint64 when;

        g_variant_get_child(marks, i, "(&sx)", &phase, &when);
        if (!phase_ok(phase))
            return vm_throw(error, VM_ERROR_PROTOCOL,
                            "the SSH worker marked a phase not named "
                            "as hostd names them");
        vm_trace_mark_at(trace, phase, when);
    }
    if (ok)
        return TRUE;
    /* It reaches a log and an operator's terminal. */
    message = hostd_ssh_wire_text(text);
    if (code < VM_ERROR_FAILED || code > VM_ERROR_LAST)
        code = VM_ERROR_SSH;
    return vm_throw(error, (int)code, "%s", *message != '\0' ? message : "the SSH worker failed");
}
