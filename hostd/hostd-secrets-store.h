#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The credential broker's secret store: one key file per secret under a directory (hostd uses
 * $STATE/secrets/, mode 0700), each 0600 and written atomically, so a crash leaves a secret
 * either whole or as it was. Nothing here is ever logged or put into an error message's text but
 * names. */

typedef struct {
    char *name;
    char *value;  /* the real credential: never logged, never sent to a guest */
    char **hosts; /* normalised patterns: "api.example.com" or "*.example.com" */
    char *header;
    char *format; /* one "{}" where the value goes */
    char *env;
} HostdSecret;

/* Frees @secret, wiping its value's bytes first. NULL is fine. */
void hostd_secret_free(HostdSecret *secret);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(HostdSecret, hostd_secret_free)

/* Creates @dir with mode 0700 if missing, and resets it to 0700 if it exists with a wider mode.
 * Fails with VM_ERROR_IO. */
gboolean hostd_secrets_store_prepare(const char *dir, GError **error);

/* Checks every field of @secret (hostd-secrets-check.h) and writes it to @dir/<name> (0600,
 * atomically). With @must_be_new, an existing secret of that name fails with VM_ERROR_EXISTS and
 * is left as it was; without it, it is replaced (rotation). Bad fields fail with
 * VM_ERROR_INVALID_ARGUMENT, a write with VM_ERROR_IO; nothing is written on failure. */
gboolean hostd_secrets_store_save(const char *dir, const HostdSecret *secret, gboolean must_be_new,
                                  GError **error);

/* Reads secret @name from @dir. VM_ERROR_NOT_FOUND if there is none, VM_ERROR_IO if its file
 * cannot be read or parsed. */
HostdSecret *hostd_secrets_store_load(const char *dir, const char *name, GError **error);

/* The names of every secret in @dir, sorted, as a new NULL-terminated array (empty when the
 * directory is missing). Fails with VM_ERROR_IO. */
char **hostd_secrets_store_list(const char *dir, GError **error);

/* Removes secret @name from @dir. VM_ERROR_NOT_FOUND if there is none, VM_ERROR_IO if the file
 * stays. */
gboolean hostd_secrets_store_remove(const char *dir, const char *name, GError **error);

G_END_DECLS
