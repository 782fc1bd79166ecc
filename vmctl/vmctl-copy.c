#include "vmctl-copy.h"

#include "vm-error.h"
#include "vm-name.h"
#include "vmctl-copy-archive.h"
#include "vmctl-remote.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What the guest's scripts exit with when the path named does not exist (sysexits' NOINPUT). */
#define GUEST_NO_PATH 66

/* Sends PATH ($1) as a tar stream whose one top entry is PATH's last name. */
static const char copy_out_script[] =
    "p=$1\n"
    "while :; do case $p in ?*/) p=${p%/} ;; *) break ;; esac; done\n"
    "if [ ! -e \"$p\" ] && [ ! -L \"$p\" ]; then echo 'no such file or directory' >&2; exit 66; "
    "fi\n"
    "case $p in */*) dir=${p%/*} name=${p##*/} ;; *) dir=. name=$p ;; esac\n"
    "case $name in .|..) p=$(cd -- \"$p\" && pwd -P) || exit 66\n"
    "  dir=${p%/*} name=${p##*/} ;; esac\n"
    "if [ -z \"$name\" ]; then echo 'cannot copy /' >&2; exit 1; fi\n"
    "exec tar -C \"${dir:-/}\" -cf - -- \"$name\"\n";

/* Unpacks the tar stream on stdin, whose top entry is NAME ($2), onto DEST ($1, empty: home): into
 * it when it is a directory, else as DEST itself, unpacked beside it first and renamed into
 * place so that a failure leaves nothing. libarchive's walk of a local tree does not list each
 * directory's whole subtree before its next sibling, so directories get their modes and times
 * only at the end (--delay-directory-restore). */
static const char copy_in_script[] =
    "dest=${1:-.} name=$2\n"
    "if [ -d \"$dest\" ]; then exec tar -C \"$dest\" -xpf - --no-same-owner "
    "--delay-directory-restore; fi\n"
    "case $dest in */*) dir=${dest%/*} ;; *) dir=. ;; esac\n"
    "dir=${dir:-/}\n"
    "if [ ! -d \"$dir\" ]; then echo 'no such directory' >&2; exit 66; fi\n"
    "tmp=$(mktemp -d \"$dir/.vmctl-cp.XXXXXX\") || exit 1\n"
    "if tar -C \"$tmp\" -xpf - --no-same-owner --delay-directory-restore &&\n"
    "  mv -f -T -- \"$tmp/$name\" \"$dest\"; then\n"
    "  rm -rf -- \"$tmp\"; exit 0\n"
    "fi\n"
    "rm -rf -- \"$tmp\"; exit 1\n";

gboolean
vmctl_copy_location_parse(const char *arg, VmctlCopyLocation *ret_location, GError **error)
{
    const char *colon = strchr(arg, ':');
    const char *slash = strchr(arg, '/');

    if (colon == NULL || (slash != NULL && slash < colon)) {
        if (arg[0] == '\0')
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "an empty local path");
        *ret_location = (VmctlCopyLocation){.path = g_strdup(arg)};
        return TRUE;
    }
    g_autofree char *agent = g_strndup(arg, colon - arg);
    if (!vm_name_validate(agent, error)) {
        g_prefix_error(error, "'%s': ", arg);
        return FALSE;
    }
    *ret_location =
        (VmctlCopyLocation){.agent = g_steal_pointer(&agent), .path = g_strdup(colon + 1)};
    return TRUE;
}

void
vmctl_copy_location_clear(VmctlCopyLocation *location)
{
    g_clear_pointer(&location->agent, g_free);
    g_clear_pointer(&location->path, g_free);
}

/* @path less its trailing slashes ("/" stays). */
static char *
strip_slashes(const char *path)
{
    char *copy = g_strdup(path);
    gsize len = strlen(copy);

    while (len > 1 && copy[len - 1] == '/')
        copy[--len] = '\0';
    return copy;
}

static char *
shown(const char *path)
{
    return g_strescape(path, NULL);
}

/* The one transfer of a copy: the EXEC pipes it drives and the count of what moved. */
typedef struct {
    VmctlExecPipe *source; /* an agent's `tar -c`; NULL: this host */
    VmctlExecPipe *sink;   /* an agent's `tar -x`; NULL: this host */
    const char *local;     /* the local path packed (when source is NULL) */
    const char *name;      /* its top name */
    VmctlCopyMovedFunc moved;
    gpointer moved_data;
    GError *feed_error;   /* the feeding thread's failure */
    gboolean sink_failed; /* ... which was the sink's: its own end says why */
} CopyRun;

static void
copy_moved(CopyRun *run, gsize len)
{
    if (run->moved != NULL)
        run->moved(len, run->moved_data);
}

static gboolean
copy_write_sink(const void *data, gsize len, gpointer user_data, GError **error)
{
    CopyRun *run = user_data;

    if (!vmctl_exec_pipe_write(run->sink, data, len, error)) {
        run->sink_failed = TRUE;
        return FALSE;
    }
    copy_moved(run, len);
    return TRUE;
}

static gssize
copy_read_source(gpointer user_data, const guint8 **ret_data, GError **error)
{
    CopyRun *run = user_data;
    gssize n = vmctl_exec_pipe_read(run->source, ret_data, error);

    if (n > 0)
        copy_moved(run, (gsize)n);
    return n;
}

/* Feeds the sink's stdin: the local tree packed, or the source agent's stream as it comes. On
 * failure the sink is aborted, so its guest's tar never sees a stream end that looks whole. */
static gpointer
copy_feed_thread(gpointer data)
{
    CopyRun *run = data;
    gboolean ok;

    if (run->source == NULL) {
        ok = vmctl_copy_archive_pack(run->local, run->name, copy_write_sink, run, &run->feed_error);
    } else {
        const guint8 *bytes;
        gssize n;
        while ((n = copy_read_source(run, &bytes, &run->feed_error)) > 0) {
            if (!vmctl_exec_pipe_write(run->sink, bytes, (gsize)n, &run->feed_error)) {
                run->sink_failed = TRUE;
                break;
            }
        }
        ok = n == 0 && vmctl_exec_pipe_status(run->source) == 0;
    }
    if (ok && vmctl_exec_pipe_close_input(run->sink, &run->feed_error))
        return NULL;
    run->sink_failed = run->sink_failed || ok;
    vmctl_exec_pipe_abort(run->sink);
    return NULL;
}

/* Opens an EXEC of `sh -c SCRIPT vmctl-cp ARG...` in @agent, on the host that has it: in a
 * fleet, another host may (the exec's stream cannot be sent again once it began), so its host
 * is asked first with a request that follows an `elsewhere` (*@ret_remote: the host it followed
 * to, which the caller keeps until the pipe is closed). */
static VmctlExecPipe *
copy_open(const VmctlEndpoint *endpoint, const char *agent, const char *script,
          const char *const *args, VmctlRemote **ret_remote, GError **error)
{
    g_autoptr(VmMessage) where =
        vm_message_new(VM_OP_AGENT_INFO, g_variant_new_parsed("{'name': <%s>}", agent), error);
    g_autoptr(VmMessage) info = NULL;
    if (where == NULL ||
        !vmctl_client_request_follow(endpoint, where, NULL, NULL, NULL, &info, ret_remote, error))
        return NULL;
    VmctlEndpoint there = {.remote = *ret_remote};
    if (*ret_remote != NULL)
        endpoint = &there;
    g_autoptr(GStrvBuilder) argv = g_strv_builder_new();

    g_strv_builder_add_many(argv, "sh", "-c", script, "vmctl-cp", NULL);
    g_strv_builder_addv(argv, (const char **)args);
    g_auto(GStrv) command = g_strv_builder_end(argv);
    g_auto(GVariantDict) fields = G_VARIANT_DICT_INIT(NULL);
    g_variant_dict_insert(&fields, "name", "s", agent);
    g_variant_dict_insert(&fields, "argv", "^as", command);
    g_autoptr(VmMessage) request = vm_message_new(VM_OP_EXEC, g_variant_dict_end(&fields), error);
    if (request == NULL)
        return NULL;
    return vmctl_exec_pipe_open(endpoint, request, VMCTL_COPY_IDLE_TIMEOUT_S, error);
}

/* Turns the exit status of a guest's script into the copy's result. */
static gboolean
copy_check_status(VmctlExecPipe *channel, const char *agent, const char *path, GError **error)
{
    int status = vmctl_exec_pipe_status(channel);
    g_autofree char *what = shown(path[0] != '\0' ? path : "~");

    if (status == 0)
        return TRUE;
    if (status == GUEST_NO_PATH)
        return vm_throw(error, VM_ERROR_GUEST_PATH, "%s:%s: no such file or directory", agent,
                        what);
    g_autofree char *said = g_strstrip(g_strdup(vmctl_exec_pipe_stderr(channel)));
    const char *last = strrchr(said, '\n');
    return vm_throw(error, VM_ERROR_FAILED, "copying %s:%s failed in the agent (status %d)%s%s",
                    agent, what, status, said[0] != '\0' ? ": " : "",
                    last != NULL ? last + 1 : said);
}

/* Reads @channel to the command's end, dropping its stdout. */
static gboolean
copy_drain(VmctlExecPipe *channel, GError **error)
{
    const guint8 *bytes;
    gssize n;

    while ((n = vmctl_exec_pipe_read(channel, &bytes, error)) > 0) {
    }
    return n == 0;
}

/* Waits for the sink's command while another thread feeds it, then joins the feeder. */
static gboolean
copy_run_sink(CopyRun *run, const VmctlCopyLocation *from, const VmctlCopyLocation *to,
              GError **error)
{
    g_autoptr(GError) local_error = NULL;
    GThread *feeder = g_thread_new("vmctl-cp", copy_feed_thread, run);
    gboolean drained = copy_drain(run->sink, &local_error);

    /* The command is over (or the conversation broken): a feeder still blocked on it lets go. */
    vmctl_exec_pipe_abort(run->sink);
    if (!drained && run->source != NULL)
        vmctl_exec_pipe_abort(run->source);
    g_thread_join(feeder);
    /* tar -x ends well only after the stream's end marker, the last thing fed: only the
     * STDIN_EOF after it can have failed meanwhile. */
    if (drained && vmctl_exec_pipe_status(run->sink) == 0) {
        g_clear_error(&run->feed_error);
        return TRUE;
    }
    /* Otherwise the source's failure, then the feeder's own (not the sink's), is the cause of
     * the sink's. */
    if (run->source != NULL && vmctl_exec_pipe_status(run->source) > 0) {
        g_clear_error(&run->feed_error);
        return copy_check_status(run->source, from->agent, from->path, error);
    }
    if (run->feed_error != NULL && !run->sink_failed && !drained) {
        g_propagate_error(error, g_steal_pointer(&run->feed_error));
        return FALSE;
    }
    g_clear_error(&run->feed_error);
    if (!drained) {
        g_propagate_error(error, g_steal_pointer(&local_error));
        return vmctl_exec_pipe_fail(run->sink, error);
    }
    return copy_check_status(run->sink, to->agent, to->path, error);
}

/* Whether the resolved local directory @dir lies in @root (NULL: anywhere). */
static gboolean
copy_check_root(const char *dir, const char *root, const char *path, GError **error)
{
    gsize len = root != NULL ? strlen(root) : 0;

    if (root == NULL || (strncmp(dir, root, len) == 0 &&
                         (dir[len] == '\0' || dir[len] == '/' || strcmp(root, "/") == 0)))
        return TRUE;
    g_autofree char *what = shown(path);
    return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s is not in %s", what, root);
}

/* Where a stream from a guest goes on this host: the directory it is unpacked in (resolved) and
 * the name its top gets there (NULL: its own). */
static gboolean
copy_local_target(const char *path, const char *root, char **ret_dir, char **ret_name,
                  GError **error)
{
    g_autofree char *what = shown(path);
    g_autofree char *dir = NULL;
    g_autofree char *name = NULL;
    struct stat st;

    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        dir = realpath(path, NULL);
    } else if (g_str_has_suffix(path, "/")) {
        return vm_throw(error, VM_ERROR_IO, "%s: no such directory", what);
    } else {
        g_autofree char *parent = g_path_get_dirname(path);
        name = g_path_get_basename(path);
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
            return vm_throw(error, VM_ERROR_IO, "%s: no such directory", what);
        dir = realpath(parent, NULL);
        if (dir != NULL && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
            g_clear_pointer(&dir, free);
            errno = ENOTDIR;
        }
    }
    if (dir == NULL)
        return vm_throw_errno(error, errno, "%s", what);
    if (!copy_check_root(dir, root, path, error))
        return FALSE;
    *ret_dir = g_strdup(dir);
    free(g_steal_pointer(&dir));
    *ret_name = g_steal_pointer(&name);
    return TRUE;
}

static gboolean
copy_from_agent(const VmctlEndpoint *endpoint, const VmctlCopyLocation *from, const char *to,
                const char *root, CopyRun *run, GError **error)
{
    g_autofree char *dir = NULL;
    g_autofree char *name = NULL;
    g_autoptr(GError) local_error = NULL;
    const char *args[] = {from->path, NULL};

    if (!copy_local_target(to, root, &dir, &name, error))
        return FALSE;
    g_autoptr(VmctlRemote) followed = NULL;
    g_autoptr(VmctlExecPipe) source =
        copy_open(endpoint, from->agent, copy_out_script, args, &followed, error);
    if (source == NULL || !vmctl_exec_pipe_close_input(source, error))
        return FALSE;
    run->source = source;
    if (!vmctl_copy_archive_unpack(copy_read_source, run, dir, name, &local_error)) {
        /* A guest that found nothing to send sends no stream: say why, not that it is empty. */
        vmctl_exec_pipe_abort(source);
        if (vmctl_exec_pipe_status(source) > 0)
            return copy_check_status(source, from->agent, from->path, error);
        g_propagate_error(error, g_steal_pointer(&local_error));
        return vmctl_exec_pipe_fail(source, error);
    }
    if (!copy_drain(source, error))
        return vmctl_exec_pipe_fail(source, error);
    return copy_check_status(source, from->agent, from->path, error);
}

/* The top name a local @path is sent under: its last name, or for "." and ".." the real one. */
static char *
copy_local_name(const char *path, GError **error)
{
    g_autofree char *name = g_path_get_basename(path);

    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        g_autofree char *real = realpath(path, NULL);
        if (real == NULL) {
            g_autofree char *what = shown(path);
            vm_throw_errno(error, errno, "%s", what);
            return NULL;
        }
        g_free(name);
        name = g_path_get_basename(real);
        free(g_steal_pointer(&real));
    }
    if (strcmp(name, "/") == 0) {
        vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "cannot copy /");
        return NULL;
    }
    return g_steal_pointer(&name);
}

gboolean
vmctl_copy(const VmctlEndpoint *endpoint, const VmctlCopyLocation *from,
           const VmctlCopyLocation *to, const char *local_root, VmctlCopyMovedFunc moved,
           gpointer moved_data, GError **error)
{
    CopyRun run = {.moved = moved, .moved_data = moved_data};
    struct stat st;

    if (from->agent == NULL && to->agent == NULL)
        return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                        "both paths are local; name an agent as AGENT:PATH");
    if (to->agent == NULL)
        return copy_from_agent(endpoint, from, to->path, local_root, &run, error);

    g_autofree char *local = from->agent == NULL ? strip_slashes(from->path) : NULL;
    g_autofree char *name = NULL;
    /* Before the pipes: they go first. */
    g_autoptr(VmctlRemote) sink_host = NULL;
    g_autoptr(VmctlRemote) source_host = NULL;
    g_autoptr(VmctlExecPipe) source = NULL;
    if (from->agent == NULL) {
        if (lstat(local, &st) != 0) {
            g_autofree char *what = shown(from->path);
            return vm_throw_errno(error, errno, "%s", what);
        }
        if (local_root != NULL) {
            /* The last name is packed as itself (a symlink as a symlink): its directory is what
             * must lie in the root. */
            g_autofree char *parent = g_path_get_dirname(local);
            g_autofree char *real = realpath(parent, NULL);
            g_autofree char *last = g_path_get_basename(local);
            if (real == NULL)
                return vm_throw_errno(error, errno, "%s", parent);
            if (!copy_check_root(real, local_root, from->path, error))
                return FALSE;
            if (strcmp(last, "..") == 0)
                return vm_throw(error, VM_ERROR_INVALID_ARGUMENT, "%s is not in %s", from->path,
                                local_root);
        }
        name = copy_local_name(local, error);
    } else {
        g_autofree char *path = strip_slashes(from->path);
        name = g_path_get_basename(path);
        if (path[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
            strcmp(name, "/") == 0)
            return vm_throw(error, VM_ERROR_INVALID_ARGUMENT,
                            "between agents, name the source by its own name, not '%s'",
                            from->path);
    }
    if (name == NULL)
        return FALSE;

    const char *sink_args[] = {to->path, name, NULL};
    g_autoptr(VmctlExecPipe) sink =
        copy_open(endpoint, to->agent, copy_in_script, sink_args, &sink_host, error);
    if (sink == NULL)
        return FALSE;
    if (from->agent != NULL) {
        const char *source_args[] = {from->path, NULL};
        source =
            copy_open(endpoint, from->agent, copy_out_script, source_args, &source_host, error);
        if (source == NULL || !vmctl_exec_pipe_close_input(source, error))
            return FALSE;
    }
    run.sink = sink;
    run.source = source;
    run.local = local;
    run.name = name;
    return copy_run_sink(&run, from, to, error);
}
