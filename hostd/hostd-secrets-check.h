#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* What a secret and its grants must look like before anything is stored: the checks of the
 * credential broker's input (vmctl secret create/set/grant), kept apart from the store so that
 * every path (request, template, fork) refuses the same things with the same code. */

/* The length of a placeholder: "vmph_" and 40 characters of [A-Za-z0-9]. */
#define HOSTD_SECRET_PLACEHOLDER_PREFIX       "vmph_"
#define HOSTD_SECRET_PLACEHOLDER_RANDOM_CHARS 40

/* Returns a new placeholder, "vmph_" + 40 characters of [A-Za-z0-9] drawn from the kernel's
 * CSPRNG (getrandom()), so that it looks like an API token to client libraries and cannot be
 * guessed by a guest that sees another agent's. Returns NULL with VM_ERROR_IO where the kernel
 * has no randomness to give. */
char *hostd_secret_placeholder_new(GError **error);

/* TRUE if @text has the exact shape of a placeholder hostd_secret_placeholder_new() makes. */
gboolean hostd_secret_placeholder_is_valid(const char *text);

/* Checks a secret's name: 1-64 characters of [a-z0-9-], starting with a letter or digit, so it is
 * a file name under $STATE/secrets/ and maps to an env var. VM_ERROR_INVALID_ARGUMENT if not. */
gboolean hostd_secret_check_name(const char *name, GError **error);

/* Checks a secret's header as stored: one header name, or up to 8 separated by ", ", each an
 * RFC 7230 token (1-64 characters of tchar), since it is written into requests the proxy
 * forwards, none twice (case-insensitive). VM_ERROR_INVALID_ARGUMENT if not. */
gboolean hostd_secret_check_header(const char *header, GError **error);

/* The header names of @headers (each one name or several separated by commas, spaces around
 * them dropped) as hostd stores them: "Authorization, x-api-key". Fails as
 * hostd_secret_check_header(). Newly allocated. */
char *hostd_secret_normalise_headers(const char *const *headers, GError **error);

/* Checks a value format: exactly one "{}" (where the value goes), no CR, LF or NUL, at most
 * 256 bytes. VM_ERROR_INVALID_ARGUMENT if not. */
gboolean hostd_secret_check_format(const char *format, GError **error);

/* Checks an env var name: [A-Za-z_][A-Za-z0-9_]*, at most 128 characters.
 * VM_ERROR_INVALID_ARGUMENT if not. */
gboolean hostd_secret_check_env(const char *env, GError **error);

/* Returns the default env var of secret @name: upper-cased, '-' -> '_'. Can't fail for a name
 * hostd_secret_check_name() accepts. */
char *hostd_secret_default_env(const char *name);

/* Normalises one host pattern of a secret: an exact host or "*." + host (any subdomain), the
 * host part through the egress policy's own normaliser, so a grant matches what the proxy
 * compares. Returns a new string, or NULL with VM_ERROR_INVALID_ARGUMENT. */
char *hostd_secret_normalise_host(const char *pattern, GError **error);

/* Checks a secret's value: not empty, no NUL, no CR or LF (it goes into a header line), at most
 * 8 KiB. VM_ERROR_INVALID_ARGUMENT if not; the message never contains the value. */
gboolean hostd_secret_check_value(const char *value, gsize length, GError **error);

G_END_DECLS
