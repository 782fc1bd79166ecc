/* The schema table behind vm_message_new() and vm_message_decode(), for tests that check other
 * descriptions of the protocol (docs/PROTOCOL.md) against it. */
#pragma once

#include "vm-protocol.h"

G_BEGIN_DECLS

typedef enum {
    VM_FIELD_REQUIRED = 1 << 0,
    VM_FIELD_UNIT_INTERVAL = 1 << 1, /* "d" in [0, 1] */
    VM_FIELD_ENV = 1 << 2,           /* "as" of NAME=VALUE */
} VmFieldFlags;

typedef struct {
    const char *key;
    const char *type;
    VmFieldFlags flags;
    /* Bounds, 0 for none: bytes of an "s", elements of an "as" or "ay", the value of a "u". */
    guint64 min;
    guint64 max;
} VmFieldSpec;

#define VM_FIELDS_MAX 16

typedef struct {
    VmOp op;
    const char *name;
    VmOp reply;         /* requests: what ends a successful reply (vm_op_reply_end()); else 0 */
    gboolean free_form; /* any keys of any type */
    VmFieldSpec fields[VM_FIELDS_MAX + 1]; /* ended by a NULL key */
} VmOpSpec;

/* Every op, in declaration order; @ret_n gets the count. The table is static: can't fail. */
const VmOpSpec *vm_op_spec_table(gsize *ret_n);

G_END_DECLS
