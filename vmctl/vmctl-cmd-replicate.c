#include <stdio.h>

#include "vm-error.h"
#include "vm-protocol.h"
#include "vm-name.h"
#include "vmctl-move.h"
#include "vmctl-remote.h"

/* Copies the replica to one host @target: what it lacks of @files, then its commit. Adds the
 * bytes copied to *@bytes. */
static gboolean
replicate_to(VmctlContext *ctx, const VmctlEndpoint *source, const VmctlEndpoint *target,
             const char *name, GVariant *plan, GVariant *files, const char *checkpoint,
             guint64 *bytes, GError **error)
{
    g_autoptr(VmMessage) begun = NULL;
    if (!vmctl_move_call(ctx, target, VM_OP_MOVE_IN,
                         vmctl_move_in_fields(name, "replica-begin", plan), &begun, error))
        return FALSE;
    /* What the host kept of the last replica need not come again. */
    g_autoptr(GHashTable) copied =
        g_hash_table_new_full(g_str_hash, g_str_equal, g_free, vmctl_moved_file_free);
    g_autoptr(GVariant) have = vmctl_result_get(begun, "have", G_VARIANT_TYPE("aa{sv}"));
    GVariantIter it;
    GVariant *entry;
    if (have != NULL) {
        g_variant_iter_init(&it, have);
        while ((entry = g_variant_iter_next_value(&it)) != NULL) {
            g_autoptr(GVariant) owned = entry;
            const char *file = NULL, *sha = NULL;
            VmctlMovedFile *f = g_new0(VmctlMovedFile, 1);
            g_variant_lookup(entry, "size", "x", &f->size);
            g_variant_lookup(entry, "mtime", "x", &f->mtime);
            if (!g_variant_lookup(entry, "file", "&s", &file) ||
                !g_variant_lookup(entry, "sha256", "&s", &sha) || f->mtime == 0) {
                vmctl_moved_file_free(f);
                continue;
            }
            f->sha256 = g_strdup(sha);
            g_hash_table_replace(copied, g_strdup(file), f);
        }
    }
    gboolean ok = vmctl_move_copy_all(ctx, source, target, name, files, copied, bytes, error);
    g_autoptr(GStrvBuilder) lines = g_strv_builder_new();
    g_variant_iter_init(&it, files);
    while (ok && (entry = g_variant_iter_next_value(&it)) != NULL) {
        g_autoptr(GVariant) owned = entry;
        const char *file = NULL;
        g_variant_lookup(entry, "file", "&s", &file);
        const VmctlMovedFile *f = file != NULL ? g_hash_table_lookup(copied, file) : NULL;
        if (f == NULL)
            continue;
        g_autofree char *line = g_strdup_printf("%s %" G_GINT64_FORMAT " %" G_GINT64_FORMAT " %s",
                                                f->sha256, f->size, f->mtime, file);
        g_strv_builder_add(lines, line);
    }
    if (ok) {
        g_auto(GStrv) all = g_strv_builder_end(lines);
        g_auto(GVariantDict) commit;
        g_variant_dict_init(&commit, NULL);
        g_variant_dict_insert(&commit, "name", "s", name);
        g_variant_dict_insert(&commit, "step", "s", "replica-commit");
        g_variant_dict_insert(&commit, "checkpoint", "s", checkpoint);
        g_variant_dict_insert_value(&commit, "files",
                                    g_variant_new_strv((const char *const *)all, -1));
        ok = vmctl_move_call(ctx, target, VM_OP_MOVE_IN, g_variant_dict_end(&commit), NULL, error);
    }
    if (!ok) {
        g_autoptr(GError) ignored = NULL;
        vmctl_move_call(ctx, target, VM_OP_MOVE_IN,
                        g_variant_new_parsed("{'name': <%s>, 'step': <'replica-abort'>}", name),
                        NULL, &ignored);
    }
    return ok;
}

/* --copies: sets the agent's own count of replicas (or "host": its host's again). */
static gboolean
replicate_set(VmctlContext *ctx, const char *name, const char *copies, GError **error)
{
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", name);
    if (!g_str_equal(copies, "host")) {
        guint64 n = 0;
        if (!g_ascii_string_to_unsigned(copies, 10, 0, VM_REPLICAS_MAX, &n, NULL))
            return vmctl_usage_error(ctx, error, "--copies takes 0 to %d, or 'host'",
                                     VM_REPLICAS_MAX);
        g_variant_dict_insert(&fields, "copies", "u", (guint32)n);
    }
    g_autoptr(VmMessage) result = NULL;
    if (!vmctl_request(ctx, VM_OP_AGENT_SET_REPLICATE, g_variant_dict_end(&fields), &result, error))
        return FALSE;
    guint32 now = 0;
    g_variant_lookup(result->fields, "copies", "u", &now);
    g_autofree char *text = g_strdup_printf(
        "%s: each checkpoint copied to %u other host%s%s", name, now, now == 1 ? "" : "s",
        g_str_equal(copies, "host") ? " (its host's setting)" : "");
    vmctl_print_result(ctx, result, NULL, text);
    return TRUE;
}

/* Copies an agent's newest checkpoint to the hosts that keep its replicas ([cluster] replicate
 * on its host, or its own count, which --copies sets; its host runs this by itself after each
 * checkpoint): what each host lacks of it, every file checked by its SHA-256 on both sides. */
gboolean
vmctl_cmd_replicate(VmctlContext *ctx, int argc, char **argv, GError **error)
{
    const char *copies = NULL;
    const GOptionEntry entries[] = {
        {"copies", 0, 0, G_OPTION_ARG_STRING, &copies,
         "Set how many other hosts keep its replicas (0-8), or 'host' for its host's setting; "
         "copies nothing now",
         "N"},
        G_OPTION_ENTRY_NULL,
    };
    g_auto(GStrv) args = NULL;

    if (!vmctl_parse(ctx, argc, argv, entries, 1, 1, &args, error))
        return FALSE;
    const char *name = args[0];
    if (!vm_name_validate(name, error))
        return FALSE;
    if (copies != NULL)
        return replicate_set(ctx, name, copies, error);
    gint64 start = g_get_monotonic_time();
    g_autoptr(VmMessage) plan = NULL;
    if (!vmctl_request(ctx, VM_OP_MOVE_OUT,
                       g_variant_new_parsed("{'name': <%s>, 'step': <'replica-plan'>}", name),
                       &plan, error))
        return FALSE;
    VmctlEndpoint source;
    if (!vmctl_endpoint(ctx, &source, error))
        return FALSE;
    const char *checkpoint = NULL;
    g_autoptr(GVariant) files = vmctl_result_get(plan, "files", G_VARIANT_TYPE("aa{sv}"));
    g_autoptr(GVariant) targets = vmctl_result_get(plan, "targets", G_VARIANT_TYPE("aa{sv}"));
    if (!vmctl_move_plan_valid(plan->fields) ||
        !g_variant_lookup(plan->fields, "checkpoint", "&s", &checkpoint) || files == NULL ||
        targets == NULL)
        return vm_throw(error, VM_ERROR_PROTOCOL, "hostd's plan of the replica lacks a field");

    g_autoptr(GStrvBuilder) done = g_strv_builder_new();
    g_autoptr(GString) failed = g_string_new(NULL);
    g_autoptr(GError) first_error = NULL;
    guint64 bytes = 0;
    guint n_done = 0;
    GVariantIter it;
    GVariant *entry;
    g_variant_iter_init(&it, targets);
    while ((entry = g_variant_iter_next_value(&it)) != NULL) {
        g_autoptr(GVariant) owned = entry;
        const char *host = NULL, *address = NULL;
        if (!g_variant_lookup(entry, "host", "&s", &host) ||
            !g_variant_lookup(entry, "address", "&s", &address))
            continue;
        g_autoptr(GError) local_error = NULL;
        g_autoptr(VmctlRemote) remote =
            vmctl_remote_parse(address, "a host's address", &local_error);
        VmctlEndpoint target = {.remote = remote};
        if (remote != NULL && replicate_to(ctx, &source, &target, name, plan->fields, files,
                                           checkpoint, &bytes, &local_error)) {
            g_strv_builder_add(done, host);
            n_done++;
            continue;
        }
        g_string_append_printf(failed, "%shost '%s': %s", failed->len > 0 ? "; " : "", host,
                               local_error->message);
        if (first_error == NULL)
            first_error = g_steal_pointer(&local_error);
    }
    g_auto(GStrv) hosts = g_strv_builder_end(done);
    g_auto(GVariantDict) end;
    g_variant_dict_init(&end, NULL);
    g_variant_dict_insert(&end, "name", "s", name);
    g_variant_dict_insert(&end, "step", "s", n_done > 0 ? "replica-done" : "replica-abort");
    g_variant_dict_insert(&end, "checkpoint", "s", checkpoint);
    g_variant_dict_insert_value(&end, "hosts", g_variant_new_strv((const char *const *)hosts, -1));
    g_autoptr(GError) end_error = NULL;
    if (!vmctl_move_call(ctx, &source, VM_OP_MOVE_OUT, g_variant_dict_end(&end), NULL,
                         n_done > 0 ? error : &end_error))
        return FALSE;
    double seconds = (double)(g_get_monotonic_time() - start) / G_USEC_PER_SEC;
    g_autofree char *joined = g_strjoinv(", ", hosts);
    if (ctx->json) {
        g_autofree char *json =
            g_strdup_printf("{\"agent\": \"%s\", \"checkpoint\": \"%s\", \"hosts\": %u, \"bytes\": "
                            "%" G_GUINT64_FORMAT ", \"seconds\": %.3f}\n",
                            name, checkpoint, n_done, bytes, seconds);
        fputs(json, stdout);
    } else if (!ctx->quiet && n_done > 0) {
        printf("%s: checkpoint %s replicated to %s (%.1f MiB copied in %.1f s)\n", name, checkpoint,
               joined, (double)bytes / (1024.0 * 1024.0), seconds);
    }
    /* The first failure's kind, every host's reason. */
    if (first_error != NULL)
        return vm_throw(error,
                        first_error->domain == VM_ERROR ? first_error->code : VM_ERROR_FAILED,
                        "%s: checkpoint %s not replicated to %s", name, checkpoint, failed->str);
    return TRUE;
}
