/* Egress presets: named rule sets ("@pypi") that stand for their rules wherever egress rules are
 * taken (vmctl egress --allow/--deny/--remove, vmctl new --egress, a template's egress). See
 * docs/EGRESS.md, "Presets".
 *
 * Built-in presets are compiled in. User presets are the files NAME.conf of hostd's presets
 * directory (egress-presets-dir in hostd.conf), each a key file with a [preset] group: rules (a
 * list of egress rules, as `vmctl egress --allow` takes them) and an optional description. A
 * user preset of a built-in's name replaces the built-in. A preset expands when a policy is set:
 * the policy stores the rules, never the name, so a preset changed later never widens or narrows
 * an agent's policy behind its owner's back.
 *
 * A set is immutable once loaded, so request threads share it without locks.
 */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct _HostdEgressPresets HostdEgressPresets;

/* Limits on a presets directory: its files, each file's size and a preset's rules. */
#define HOSTD_EGRESS_PRESETS_MAX      256
#define HOSTD_EGRESS_PRESET_FILE_MAX  (64 * 1024)
#define HOSTD_EGRESS_PRESET_RULES_MAX 128

/* The built-in presets, then every NAME.conf of @dir (NULL, or a directory that does not exist:
 * none; other files are ignored). A preset name is 1-64 of a-z, 0-9 and inner '-', starting with
 * a letter or digit. A file that cannot be read, is larger than HOSTD_EGRESS_PRESET_FILE_MAX, is
 * not a key file with exactly a [preset] group of the keys rules and description, holds a bad
 * rule, a preset ("@name") as a rule, no rule or more than HOSTD_EGRESS_PRESET_RULES_MAX fails
 * the whole load with VM_ERROR_INVALID_ARGUMENT "FILE: ...", as does a directory of more than
 * HOSTD_EGRESS_PRESETS_MAX files. Returns a new set. */
HostdEgressPresets *hostd_egress_presets_load(const char *dir, GError **error);

void hostd_egress_presets_free(HostdEgressPresets *presets);

/* Whether @rule names a preset ("@name"). Can't fail. */
gboolean hostd_egress_preset_is_name(const char *rule);

/* @rules (NULL: none) with every "@name" replaced by the rules of that preset, in order, other
 * rules as they are (they are checked where the policy is made). An unknown preset fails with
 * VM_ERROR_NOT_FOUND "no egress preset '@name' (see: vmctl egress presets)". Returns a new
 * NULL-terminated array. */
char **hostd_egress_presets_expand(const HostdEgressPresets *presets, const char *const *rules,
                                   GError **error);

/* Checks @rules (NULL: none) one by one, presets expanded, as a policy checks each: an unknown
 * preset fails with VM_ERROR_NOT_FOUND, a bad rule with VM_ERROR_INVALID_ARGUMENT naming it.
 * Rules that are only wrong together ("any" beside another) are left to the policy. */
gboolean hostd_egress_presets_check(const HostdEgressPresets *presets, const char *const *rules,
                                    GError **error);

/* The rules of preset @name (without '@'), or NULL when there is none. Owned by @presets. */
const char *const *hostd_egress_presets_lookup(const HostdEgressPresets *presets, const char *name);

/* Every preset, sorted by name, as aa{sv}: name s ("@pypi"), source s ("built-in" or the
 * file's path), overrides b (a user file that replaces a built-in), description s, rules as.
 * A new floating reference; can't fail. */
GVariant *hostd_egress_presets_to_variant(const HostdEgressPresets *presets);

G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdEgressPresets, hostd_egress_presets_free)

G_END_DECLS
