/* What `qemu-img info --output=json` says about a disk image and its backing chain.
 *
 * The output describes images whose contents a guest wrote and whose headers hostd did not
 * always write itself, so it is read as untrusted input: its size and nesting are capped before
 * json-glib sees it, a field of the wrong type fails the whole read, and a missing optional
 * field only leaves its default.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The most qemu-img may print, and the deepest nesting of its JSON: a real chain of a thousand
 * images prints about 1 MiB at a depth of 7. */
#define VM_QEMU_IMG_OUTPUT_MAX (8 * 1024 * 1024)
#define VM_QEMU_IMG_DEPTH_MAX  32

typedef struct {
    char *filename;         /* as qemu-img opened it: the path given for the top image, the
                             * backing file's full name for the images below it */
    char *format;           /* "qcow2", "raw", ...; NULL when not said */
    char *backing_filename; /* the full name of the image below, as the header says; or NULL */
    char *backing_format;   /* the format the header names for it; or NULL */
    guint64 virtual_size;   /* bytes the guest sees; 0 when not said */
    guint64 actual_size;    /* bytes the file takes on the host; 0 when not said */
    gboolean dirty;         /* "dirty-flag": the image was not closed cleanly */
    char *data_file;        /* a qcow2 image's external data file, as the header names it; or
                             * NULL (the data is in the image itself) */
} VmQemuImgInfo;

void vm_qemu_img_info_free(VmQemuImgInfo *info);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(VmQemuImgInfo, vm_qemu_img_info_free)

typedef enum {
    VM_QEMU_IMG_INFO_NONE = 0,
    VM_QEMU_IMG_INFO_SHARED = 1 << 0,        /* -U: read an image another process holds open */
    VM_QEMU_IMG_INFO_BACKING_CHAIN = 1 << 1, /* --backing-chain: every image below too */
    VM_QEMU_IMG_INFO_QCOW2 = 1 << 2,         /* -f qcow2: no format probing */
} VmQemuImgInfoFlags;

/* Parses @len bytes of `qemu-img info --output=json` output (@len -1: @json is NUL-terminated):
 * one object for one image, or an array of them, top first, for --backing-chain. Returns the
 * images in that order (an array of VmQemuImgInfo that frees them; one element for a single
 * object, never empty). Fails with VM_ERROR_FAILED when the text is over VM_QEMU_IMG_OUTPUT_MAX
 * bytes, nests deeper than VM_QEMU_IMG_DEPTH_MAX, is not JSON, is neither an object nor a
 * non-empty array of objects, lacks an image's "filename", or has a known field of the wrong
 * type (a size that is negative or not an integer, a name that is not a string). Pure. */
GPtrArray *vm_qemu_img_info_parse(const char *json, gssize len, GError **error);

/* Runs `qemu-img info --output=json` (found in PATH) on @path, with -U and --backing-chain as
 * @flags say, and parses what it prints with vm_qemu_img_info_parse(). Fails with VM_ERROR_IO,
 * with qemu-img's first words on stderr, when it cannot be run or fails, or prints more than
 * VM_QEMU_IMG_OUTPUT_MAX bytes (it is then killed); else as vm_qemu_img_info_parse(). Blocks
 * until qemu-img exits. */
GPtrArray *vm_qemu_img_info(const char *path, VmQemuImgInfoFlags flags, GError **error);

/* vm_qemu_img_info() with qemu-img run as @uid (and the gid of the same number, no
 * supplementary group, no_new_privs): an agent's own id, so that qemu-img's parser of the
 * guest-written header holds no more than the agent's QEMU already does. 0: as this process.
 * Only root can give another @uid (VM_ERROR_IO otherwise). */
GPtrArray *vm_qemu_img_info_as(const char *path, VmQemuImgInfoFlags flags, guint uid,
                               GError **error);

/* Whether an image of @chain (from the two functions above) has @filename as its filename,
 * compared byte for byte. Can't fail. */
gboolean vm_qemu_img_chain_holds(const GPtrArray *chain, const char *filename);

/* Whether @info, what `qemu-img info` said of the image at @path alone, is what hostd made: a
 * qcow2 image without an external data file, standing on @backing (NULL: on nothing), which its
 * header names byte for byte as its full backing name, in format qcow2 where it names a format.
 * An image a guest could rewrite is checked so before any tool opens its backing chain or writes
 * it: a header naming another file (a host file, as raw) would have that tool, running as root,
 * read or write it. Fails with VM_ERROR_BAD_STATE, naming @path and what its header says. Pure. */
gboolean vm_qemu_img_info_check(const VmQemuImgInfo *info, const char *path, const char *backing,
                                GError **error);

/* vm_qemu_img_info_check() of the image at @path, read with `qemu-img info -f qcow2 -U` without
 * --backing-chain, as @uid (vm_qemu_img_info_as(); 0: as this process): qemu-img then opens
 * @path alone, neither its backing file nor its data file, whatever the header names. Fails as
 * vm_qemu_img_info() and vm_qemu_img_info_check(). Blocks until qemu-img exits. */
gboolean vm_qemu_img_check(const char *path, const char *backing, guint uid, GError **error);

/* Makes @path (replaced when it exists) a new empty qcow2 overlay of @size_gib GiB on @backing,
 * in format qcow2, without opening @backing (`qemu-img create -u`): the backing image may be one
 * a guest wrote, and creating an overlay needs nothing from its header. Fails with VM_ERROR_IO
 * and qemu-img's message. Blocks until qemu-img exits. */
gboolean vm_qemu_img_overlay(const char *backing, const char *path, guint size_gib, GError **error);

/* A safe rebase of @path onto @base (`qemu-img rebase -f qcow2 -F qcow2`): what @path read
 * through its old backing chain and @base lacks is copied into @path first, so it reads the same
 * afterwards. qemu-img opens @path's chain as its header names it and writes @path: the caller
 * checks those headers first (vm_qemu_img_check()) and gives the agent's @uid (0: this process)
 * so that qemu-img's parser of guest-written images runs with no more than that agent's QEMU
 * holds. No running QEMU may have @path open. Fails with VM_ERROR_IO and qemu-img's message.
 * Blocks until qemu-img exits. */
gboolean vm_qemu_img_rebase(const char *base, const char *path, guint uid, GError **error);

/* Makes the header of the qcow2 image at @path name @base (format qcow2) as its backing file,
 * and nothing else (`qemu-img rebase -u`): no data moves and @base is not opened; for an image
 * whose backing file is now at another path with the same contents (a move between hosts). Run
 * as @uid (0: this process), as vm_qemu_img_rebase(): the caller checks the header first. Fails
 * with VM_ERROR_IO and qemu-img's message. Blocks until qemu-img exits. */
gboolean vm_qemu_img_rebase_header(const char *base, const char *path, guint uid, GError **error);

/* Grows the qcow2 image at @path to a virtual size of @size_gib GiB (`qemu-img resize -f qcow2`),
 * as @uid (0: this process), as vm_qemu_img_rebase() runs: qemu-img opens @path's chain as its
 * header names it, so the caller checks the headers first (vm_qemu_img_check()). Never shrinks:
 * qemu-img refuses a smaller size without --shrink, which is never passed. No running QEMU may
 * have @path open. Fails with VM_ERROR_IO and qemu-img's message. Blocks until qemu-img exits. */
gboolean vm_qemu_img_resize(const char *path, guint size_gib, guint uid, GError **error);

G_END_DECLS
