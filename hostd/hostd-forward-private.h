/* Internals of hostd-forward.c that its unit tests see: the record and the choice of a host
 * port. */
#pragma once

#include "hostd-forward.h"

G_BEGIN_DECLS

typedef struct {
    guint guest_port;
    guint host_port;
} HostdForward;

/* Parses the text of a forwards.ini (@path names it in errors): groups "[forward GUEST_PORT]"
 * each with "host-port = PORT", ports 1-65535 in decimal. Returns the forwards (HostdForward)
 * sorted by guest port. Fails with VM_ERROR_FAILED "PATH: ..." for anything else: an unknown
 * group or key, a missing or bad port, a guest or host port twice, more than
 * HOSTD_FORWARD_MAX. */
GArray *hostd_forwards_parse(const char *text, gsize len, const char *path, GError **error);

/* The text hostd_forwards_parse() reads back as @forwards. Newly allocated; can't fail. */
char *hostd_forwards_format(const GArray *forwards);

/* The forwards recorded in agent directory @dir; none when it has no forwards.ini. Fails with
 * VM_ERROR_IO when the file cannot be read, or as hostd_forwards_parse(). */
GArray *hostd_forwards_load(const char *dir, GError **error);

/* Records @forwards in @dir, atomically and durably. Fails with VM_ERROR_IO. */
gboolean hostd_forwards_save(const char *dir, const GArray *forwards, GError **error);

/* Chooses the host port of a new forward. @requested > 0 is taken as it is, unless it is below
 * 1024 and @uid is not 0 (VM_ERROR_INVALID_ARGUMENT), or @used (port -> what holds it, a
 * string) has it (VM_ERROR_NO_RESOURCES, saying what holds it); whether something else listens
 * there is for the listener to find. @requested 0: the lowest port of @min-@max that @used does
 * not have and that can be bound on 127.0.0.1 now, or VM_ERROR_NO_RESOURCES. */
gboolean hostd_forward_choose_port(guint requested, gint64 uid, guint min, guint max,
                                   GHashTable *used, guint *ret_port, GError **error);

G_END_DECLS
