#include "vmctl-move.h"

#include "vm-error.h"

void
vmctl_moved_file_free(gpointer data)
{
    VmctlMovedFile *f = data;
    g_free(f->sha256);
    g_free(f);
}

void
vmctl_move_report_clear(VmctlMoveReport *report)
{
    g_clear_pointer(&report->from, g_free);
    g_clear_pointer(&report->to, g_free);
}

/* A client quiet for this long in the middle of a file is given up by hostd; vmctl gives up on
 * a hostd quiet for as long. */
#define MOVE_IDLE_TIMEOUT_S 120

/* Copies @file of agent @name from @source to @target, checking that both sides saw the same
 * SHA-256; returns it. */
static char *
move_copy(const VmctlEndpoint *source, const VmctlEndpoint *target, const char *name,
          const char *file, gint64 size, GError **error)
{
    g_autoptr(VmMessage) read_req = vm_message_new(
        VM_OP_MOVE_READ, g_variant_new_parsed("{'name': <%s>, 'file': <%s>}", name, file), error);
    g_autoptr(VmMessage) write_req =
        vm_message_new(VM_OP_MOVE_WRITE,
                       g_variant_new_parsed("{'name': <%s>, 'file': <%s>, 'size': <%x>}", name,
                                            file, (gint64)size),
                       error);
    if (read_req == NULL || write_req == NULL)
        return NULL;
    g_autoptr(VmctlExecPipe) in =
        vmctl_exec_pipe_open(source, read_req, MOVE_IDLE_TIMEOUT_S, error);
    if (in == NULL)
        return NULL;
    g_autoptr(VmctlExecPipe) out =
        vmctl_exec_pipe_open(target, write_req, MOVE_IDLE_TIMEOUT_S, error);
    if (out == NULL)
        return NULL;
    for (;;) {
        const guint8 *data = NULL;
        gssize n = vmctl_exec_pipe_read(in, &data, error);
        if (n < 0)
            return vmctl_exec_pipe_fail(in, error), NULL;
        if (n == 0)
            break;
        if (!vmctl_exec_pipe_write(out, data, (gsize)n, error))
            return vmctl_exec_pipe_fail(out, error), NULL;
    }
    if (!vmctl_exec_pipe_close_input(out, error))
        return vmctl_exec_pipe_fail(out, error), NULL;
    for (;;) {
        const guint8 *data = NULL;
        gssize n = vmctl_exec_pipe_read(out, &data, error);
        if (n < 0)
            return vmctl_exec_pipe_fail(out, error), NULL;
        if (n == 0)
            break;
    }
    const char *sent = vmctl_exec_pipe_sha256(in);
    const char *got = vmctl_exec_pipe_sha256(out);
    if (sent == NULL || got == NULL || !g_str_equal(sent, got))
        return vm_throw(error, VM_ERROR_FAILED,
                        "file %s of agent '%s' changed on the way: the source sent SHA-256 %s, "
                        "the target got %s",
                        file, name, sent != NULL ? sent : "(none)", got != NULL ? got : "(none)"),
               NULL;
    return g_strdup(got);
}

gboolean
vmctl_move_copy_all(VmctlContext *ctx, const VmctlEndpoint *source, const VmctlEndpoint *target,
                    const char *name, GVariant *files, GHashTable *copied, guint64 *bytes,
                    GError **error)
{
    GVariantIter it;
    GVariant *entry;
    g_variant_iter_init(&it, files);
    while ((entry = g_variant_iter_next_value(&it)) != NULL) {
        g_autoptr(GVariant) owned = entry;
        const char *file = NULL;
        gint64 size = 0, mtime = 0;
        if (!g_variant_lookup(entry, "file", "&s", &file) ||
            !g_variant_lookup(entry, "size", "x", &size) || size < 0)
            return vm_throw(error, VM_ERROR_PROTOCOL, "hostd listed a file of the move badly");
        g_variant_lookup(entry, "mtime", "x", &mtime);
        VmctlMovedFile *had = g_hash_table_lookup(copied, file);
        if (had != NULL && had->size == size && (mtime == 0 || had->mtime == mtime))
            continue;
        if (!ctx->quiet && vmctl_progress_mode(ctx) != VMCTL_PROGRESS_NONE)
            g_printerr("copying %s (%.1f MiB)\n", file, (double)size / (1024.0 * 1024.0));
        g_autofree char *sha = move_copy(source, target, name, file, size, error);
        if (sha == NULL)
            return FALSE;
        VmctlMovedFile *f = g_new0(VmctlMovedFile, 1);
        f->size = size;
        f->mtime = mtime;
        f->sha256 = g_steal_pointer(&sha);
        g_hash_table_replace(copied, g_strdup(file), f);
        *bytes += (guint64)size;
    }
    return TRUE;
}

gboolean
vmctl_move_call(VmctlContext *ctx, const VmctlEndpoint *endpoint, VmOp op, GVariant *fields,
                VmMessage **ret_result, GError **error)
{
    g_autoptr(VmMessage) request = vm_message_new(op, fields, error);
    g_autoptr(VmMessage) result = NULL;
    if (request == NULL ||
        !vmctl_client_call(endpoint, request, vmctl_progress_mode(ctx), &result, NULL, error))
        return FALSE;
    if (ret_result != NULL)
        *ret_result = g_steal_pointer(&result);
    return TRUE;
}

/* After a failure: both hosts give the move up (best effort; the source settles it by the
 * fleet's record anyway). Adds what the source says of the agent to @error. */
static void
move_give_up(VmctlContext *ctx, const VmctlEndpoint *source, const VmctlEndpoint *target,
             const char *name, GError **error)
{
    g_autoptr(VmMessage) settled = NULL;
    g_autoptr(GError) ignored = NULL;
    if (target != NULL)
        vmctl_move_call(ctx, target, VM_OP_MOVE_IN,
                        g_variant_new_parsed("{'name': <%s>, 'step': <'abort'>}", name), NULL,
                        &ignored);
    g_clear_error(&ignored);
    if (!vmctl_move_call(ctx, source, VM_OP_MOVE_OUT,
                         g_variant_new_parsed("{'name': <%s>, 'step': <'abort'>}", name), &settled,
                         &ignored)) {
        g_prefix_error(error,
                       "the move failed, and the source could not settle it yet (%s: it "
                       "does so by itself once the fleet answers): ",
                       ignored->message);
        return;
    }
    const char *owner = NULL;
    g_variant_lookup(settled->fields, "owner", "&s", &owner);
    g_prefix_error(error, "the move failed; agent '%s' is on host '%s': ", name,
                   owner != NULL ? owner : "?");
}

gboolean
vmctl_move_plan_valid(GVariant *plan)
{
    const char *s = NULL;
    gint64 epoch = 0;
    return g_variant_lookup(plan, "from", "&s", &s) &&
           g_variant_lookup(plan, "template", "&s", &s) &&
           g_variant_lookup(plan, "base_sha256", "&s", &s) &&
           g_variant_lookup(plan, "source_dir", "&s", &s) &&
           g_variant_lookup(plan, "base_path", "&s", &s) &&
           g_variant_lookup(plan, "epoch", "x", &epoch);
}

GVariant *
vmctl_move_in_fields(const char *name, const char *step, GVariant *plan)
{
    static const char *const copied[] = {"from",       "epoch",     "template",    "cpus",
                                         "memory_mib", "disk_gib",  "base_sha256", "source_dir",
                                         "base_path",  "warm_path", NULL};
    g_auto(GVariantDict) d;
    g_variant_dict_init(&d, NULL);
    g_variant_dict_insert(&d, "name", "s", name);
    g_variant_dict_insert(&d, "step", "s", step);
    for (const char *const *k = copied; *k != NULL; k++) {
        g_autoptr(GVariant) v = g_variant_lookup_value(plan, *k, NULL);
        if (v != NULL)
            g_variant_dict_insert_value(&d, *k, v);
    }
    return g_variant_dict_end(&d);
}

gboolean
vmctl_move_agent(VmctlContext *ctx, const char *name, const char *to, VmctlMoveReport *report,
                 GError **error)
{
    gint64 start = g_get_monotonic_time();
    g_auto(GVariantDict) plan_fields;
    g_variant_dict_init(&plan_fields, NULL);
    g_variant_dict_insert(&plan_fields, "name", "s", name);
    g_variant_dict_insert(&plan_fields, "step", "s", "plan");
    if (to != NULL)
        g_variant_dict_insert(&plan_fields, "to", "s", to);
    g_autoptr(VmMessage) plan = NULL;
    if (!vmctl_request(ctx, VM_OP_MOVE_OUT, g_variant_dict_end(&plan_fields), &plan, error))
        return FALSE;
    VmctlEndpoint source;
    if (!vmctl_endpoint(ctx, &source, error))
        return FALSE;

    const char *target_id = NULL, *address = NULL, *from = NULL;
    g_autoptr(GVariant) early = vmctl_result_get(plan, "files", G_VARIANT_TYPE("aa{sv}"));
    GVariant *p = plan->fields;
    if (!g_variant_lookup(p, "to", "&s", &target_id) ||
        !g_variant_lookup(p, "address", "&s", &address) ||
        !g_variant_lookup(p, "from", "&s", &from) || !vmctl_move_plan_valid(p) || early == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "hostd's plan of the move lacks a field");
    report->from = g_strdup(from);
    report->to = g_strdup(target_id);

    g_autoptr(VmctlRemote) target_remote =
        vmctl_remote_parse(address, "the target host's address", error);
    if (target_remote == NULL) {
        move_give_up(ctx, &source, NULL, name, error);
        return FALSE;
    }
    VmctlEndpoint target = {.remote = target_remote};

    if (!vmctl_move_call(ctx, &target, VM_OP_MOVE_IN, vmctl_move_in_fields(name, "begin", p), NULL,
                         error)) {
        move_give_up(ctx, &source, NULL, name, error);
        return FALSE;
    }

    g_autoptr(GHashTable) copied =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, vmctl_moved_file_free);
    g_autoptr(VmMessage) saved = NULL;
    g_autoptr(VmMessage) taken = NULL;
    gint64 down = 0;
    /* The frozen files while the agent runs; then the save, and what changed. */
    gboolean ok =
        vmctl_move_copy_all(ctx, &source, &target, name, early, copied, &report->bytes, error) &&
        (down = g_get_monotonic_time(),
         vmctl_move_call(
             ctx, &source, VM_OP_MOVE_OUT,
             g_variant_new_parsed("{'name': <%s>, 'step': <'save'>, 'to': <%s>}", name, target_id),
             &saved, error));
    g_autoptr(GVariant) all =
        saved != NULL ? vmctl_result_get(saved, "files", G_VARIANT_TYPE("aa{sv}")) : NULL;
    if (ok && all == NULL)
        ok = vm_throw(error, VM_ERROR_PROTOCOL, "hostd's save of the move lists no files");
    guint64 before = report->bytes;
    if (ok)
        ok = vmctl_move_copy_all(ctx, &source, &target, name, all, copied, &report->bytes, error);
    report->bytes_down = report->bytes - before;
    if (ok) {
        g_autoptr(GStrvBuilder) sums = g_strv_builder_new();
        GVariantIter it;
        GVariant *entry;
        g_variant_iter_init(&it, all);
        while ((entry = g_variant_iter_next_value(&it)) != NULL) {
            g_autoptr(GVariant) owned = entry;
            const char *file = NULL;
            g_variant_lookup(entry, "file", "&s", &file);
            const VmctlMovedFile *f = file != NULL ? g_hash_table_lookup(copied, file) : NULL;
            if (f != NULL) {
                g_autofree char *line = g_strdup_printf("%s %s", f->sha256, file);
                g_strv_builder_add(sums, line);
            }
        }
        g_auto(GStrv) lines = g_strv_builder_end(sums);
        g_auto(GVariantDict) commit;
        g_variant_dict_init(&commit, NULL);
        g_variant_dict_insert(&commit, "name", "s", name);
        g_variant_dict_insert(&commit, "step", "s", "commit");
        g_variant_dict_insert_value(&commit, "files",
                                    g_variant_new_strv((const char *const *)lines, -1));
        ok = vmctl_move_call(ctx, &target, VM_OP_MOVE_IN, g_variant_dict_end(&commit), &taken,
                             error);
    }
    if (!ok) {
        move_give_up(ctx, &source, &target, name, error);
        return FALSE;
    }
    report->down_s = (double)(g_get_monotonic_time() - down) / G_USEC_PER_SEC;
    /* The target owns it now: the source's copy goes. A source that cannot be told removes it
     * by itself when it settles the move by the fleet's record. */
    g_autoptr(GError) local_error = NULL;
    if (!vmctl_move_call(
            ctx, &source, VM_OP_MOVE_OUT,
            g_variant_new_parsed("{'name': <%s>, 'step': <'done'>, 'to': <%s>}", name, target_id),
            NULL, &local_error))
        g_printerr("vmctl: warning: agent '%s' runs on host '%s', but host '%s' did not remove "
                   "its old copy yet (%s); it does so by itself\n",
                   name, target_id, from, local_error->message);
    report->seconds = (double)(g_get_monotonic_time() - start) / G_USEC_PER_SEC;
    return TRUE;
}
