/* The in-guest API's rules, apart from any socket, server or agent: which requests there are
 * (the route table), how many an agent may make (a token bucket), what a request body may hold
 * and how its fields are bounded, and how answers and errors are shaped as JSON, host paths left
 * out. Pure: nothing here reads a clock, a file or libvirt, so every rule is a row in a table
 * test. See docs/GUEST-API.md; hostd-guest-api.c serves them. */
#pragma once

#include <glib.h>
#include <json-glib/json-glib.h>

#include "hostd-state.h"
#include "vm-error.h"

G_BEGIN_DECLS

/* Bounds on what a guest sends. libsoup itself refuses a request head over 64 KiB. */
#define HOSTD_GUEST_API_BODY_MAX (16 * 1024) /* bytes of a request body; more: 413 */
#define HOSTD_GUEST_API_DISCARD_MAX                                                                \
    (1024 * 1024)                                  /* read and dropped past that before a 413;     \
                                                    * beyond it the connection is cut */
#define HOSTD_GUEST_API_JSON_DEPTH     4           /* nesting of a request body */
#define HOSTD_GUEST_API_PATHS_MAX      16          /* paths of a partial restore */
#define HOSTD_GUEST_API_PATH_MAX       4096        /* bytes of one of them */
#define HOSTD_GUEST_API_KEEP_AWAKE_MAX (24 * 3600) /* seconds of one keep-awake */
/* Connections of one agent served at once; more, up to twice as many, are answered 503, and
 * beyond that closed unanswered (by its worker). */
#define HOSTD_GUEST_API_CONNECTIONS 8
/* A connection must have sent its whole request within this time. */
#define HOSTD_GUEST_API_REQUEST_MS (10 * 1000)

typedef enum {
    HOSTD_GUEST_API_INFO = 1,
    HOSTD_GUEST_API_CHECKPOINT_LIST,
    HOSTD_GUEST_API_CHECKPOINT_CREATE,
    HOSTD_GUEST_API_RESTORE,
    HOSTD_GUEST_API_RESTORE_STATUS,
    HOSTD_GUEST_API_KEEP_AWAKE_GET,
    HOSTD_GUEST_API_KEEP_AWAKE_SET,
    HOSTD_GUEST_API_EGRESS,
} HostdGuestApiEndpoint;

typedef enum {
    HOSTD_GUEST_API_READS = 0,        /* changes nothing: logged, no event */
    HOSTD_GUEST_API_CHANGES = 1 << 0, /* leaves an event, by the guest, once it ran */
    HOSTD_GUEST_API_HEAVY = 1 << 1,   /* a checkpoint or a restore: one at a time per agent,
                                       * and a tighter rate of its own */
    HOSTD_GUEST_API_BODY = 1 << 2,    /* takes a JSON object as its body */
} HostdGuestApiFlags;

typedef struct {
    const char *method;
    const char *path;
    HostdGuestApiEndpoint endpoint;
    HostdGuestApiFlags flags;
    const char *event; /* the event's name (the protocol op that does the same), or NULL */
} HostdGuestApiRoute;

/* The route of @method on @path (exact: no prefix, no trailing slash, no agent name anywhere).
 * NULL when there is none, with *@ret_status 404 (no such path) or 405 (a path that takes other
 * methods, listed in *@ret_allow as an Allow header says them, e.g. "GET, POST"; static). */
const HostdGuestApiRoute *hostd_guest_api_route(const char *method, const char *path,
                                                guint *ret_status, const char **ret_allow);

/* A token bucket: @rate tokens a second, at most @burst kept. Zero-initialise it; it needs no
 * freeing. */
typedef struct {
    double tokens;
    gint64 last; /* when tokens was last brought up to date (monotonic microseconds); 0: never */
} HostdGuestApiBucket;

/* Takes one token at @now (monotonic microseconds, > 0): TRUE when there was one. Otherwise
 * FALSE, with *@ret_retry_after_s the whole seconds (at least 1) until one is there. A new bucket
 * starts full. Can't fail. */
gboolean hostd_guest_api_bucket_take(HostdGuestApiBucket *bucket, double rate, guint burst,
                                     gint64 now, guint *ret_retry_after_s);

/* What a request body said, checked; fields its endpoint does not take stay unset. */
typedef struct {
    char *label;     /* checkpoint: NULL when none */
    gboolean memory; /* checkpoint: with RAM */
    char *id;        /* restore: the checkpoint */
    char **paths;    /* restore: only these trees (NULL: the whole VM) */
    guint seconds;   /* keep-awake: 1..HOSTD_GUEST_API_KEEP_AWAKE_MAX */
} HostdGuestApiArgs;

void hostd_guest_api_args_clear(HostdGuestApiArgs *args);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(HostdGuestApiArgs, hostd_guest_api_args_clear)

/* Reads the body of a request to @endpoint (@len bytes; NULL or empty reads as {}): a JSON
 * object whose members are those the endpoint takes, of their types and within their bounds.
 * POST /v1/checkpoints takes label (a string of at most VM_LABEL_MAX bytes, no control
 * characters) and memory (a boolean); POST /v1/restore id (required, VM_LABEL_MAX bytes of
 * letters, digits, '.', '_', '-') and paths (1..HOSTD_GUEST_API_PATHS_MAX absolute paths of at
 * most HOSTD_GUEST_API_PATH_MAX bytes, not "/", no ".." component); POST /v1/keep-awake seconds
 * (required, 1..HOSTD_GUEST_API_KEEP_AWAKE_MAX). Writes *@ret (clear it with
 * g_auto(HostdGuestApiArgs)) on success. Fails with VM_ERROR_PROTOCOL for a body that is not one
 * JSON object nested at most HOSTD_GUEST_API_JSON_DEPTH deep, or longer than
 * HOSTD_GUEST_API_BODY_MAX; VM_ERROR_INVALID_ARGUMENT naming a member that is unknown, of the
 * wrong type, missing or out of bounds. */
gboolean hostd_guest_api_args_parse(HostdGuestApiEndpoint endpoint, const char *body, gsize len,
                                    HostdGuestApiArgs *ret, GError **error);

/* Bytes of a request's method and path (before "..." is added) that a call carries for hostd's
 * log. */
#define HOSTD_GUEST_API_LOG_METHOD_MAX 16
#define HOSTD_GUEST_API_LOG_PATH_MAX   80

/* One request as the API's worker hands it to hostd: the endpoint and its checked arguments, or
 * a refusal the worker answers itself (hostd still counts it against the agent's rate). */
typedef struct {
    HostdGuestApiEndpoint endpoint; /* 0: refused by the worker; status says how */
    guint status;                   /* endpoint 0: 400, 404, 405 or 413; else 0 */
    char *method;                   /* for hostd's log: printable ASCII, cut */
    char *path;
    HostdGuestApiArgs args;
    /* The worker's own, never sent: its answer to a request it refuses. */
    char *refusal;     /* the error's JSON body */
    const char *allow; /* 405: the Allow header (static) */
} HostdGuestApiCall;

void hostd_guest_api_call_clear(HostdGuestApiCall *call);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC(HostdGuestApiCall, hostd_guest_api_call_clear)

/* The call a whole request makes: @method on @path (as the request line says them) with @body
 * (@len bytes kept, of a body @too_long for HOSTD_GUEST_API_BODY_MAX). Routes it (404, 405 with
 * its Allow), refuses a long body (413) and reads the body of an endpoint that takes one (400
 * with hostd_guest_api_args_parse()'s error), in the order the API always answered them. Writes
 * *@ret (clear it with g_auto(HostdGuestApiCall)); can't fail. */
void hostd_guest_api_call_read(const char *method, const char *path, const char *body, gsize len,
                               gboolean too_long, HostdGuestApiCall *ret);

/* The type of a call on the worker's channel: serial, endpoint, status, method, path, label,
 * memory, id, paths, seconds (a field the endpoint does not take is empty, FALSE or 0). */
#define HOSTD_GUEST_API_CALL_TYPE "(uuusssbsasu)"

/* @call as a HOSTD_GUEST_API_CALL_TYPE value with @serial (floating); can't fail. */
GVariant *hostd_guest_api_call_to_variant(const HostdGuestApiCall *call, guint32 serial);

/* Reads a call a worker sent, which hostd does not trust: @value must have the exact type, an
 * endpoint that its method and path route to (or a refusal whose status they explain), every
 * string bounded and printable as hostd_guest_api_call_read() leaves it, and exactly the
 * arguments the endpoint takes, within the bounds of hostd_guest_api_args_parse(). Writes
 * *@ret_serial and *@ret (clear it) on success. Fails with VM_ERROR_PROTOCOL naming the first
 * thing that is wrong. */
gboolean hostd_guest_api_call_from_variant(GVariant *value, guint32 *ret_serial,
                                           HostdGuestApiCall *ret, GError **error);

/* The HTTP status that answers an error of @code: 400 invalid-argument and protocol, 404
 * not-found, 409 exists, bad-state and busy, 503 not-running and cancelled, 504 timeout, 507
 * no-resources, 500 the rest. Can't fail. */
guint hostd_guest_api_error_status(VmErrorCode code);

/* @text with every occurrence of each of @host_dirs (NULL-terminated; NULL and empty entries are
 * skipped) replaced by "<host>", so that a message from hostd's depths names no path of the host.
 * Newly allocated; can't fail. */
char *hostd_guest_api_scrub(const char *text, const char *const *host_dirs);

/* The JSON body of an error: {"error": NAME, "message": TEXT} (vm_error_code_name() of
 * @error's code, its message cut to valid UTF-8 of at most 1 KiB), with "retry_after":
 * @retry_after_s when it is not 0. Newly allocated; can't fail. */
char *hostd_guest_api_error_json(const GError *error, guint retry_after_s);

/* The members @keys (NULL-terminated) of the a{sv} @dict, and no other, as a JSON object: strings,
 * booleans, numbers and string lists as json-glib's GVariant serialisation gives them. A key the
 * dictionary lacks is left out. New node; can't fail. */
JsonNode *hostd_guest_api_pick(GVariant *dict, const char *const *keys);

/* The same for each dictionary of the aa{sv} @list, as a JSON array. */
JsonNode *hostd_guest_api_pick_each(GVariant *list, const char *const *keys);

/* A keep-awake deadline as the API shows it: null when none, {"indefinite": true} for a hold
 * until released (@until G_MAXINT64), else {"until": ISO 8601 UTC, "seconds_left": N}. @until
 * and @now are monotonic microseconds, @now_real the wall clock's at the same instant. New node;
 * can't fail. */
JsonNode *hostd_guest_api_keep_awake_node(gint64 until, gint64 now, gint64 now_real);

/* The agent's own info from its record @r: name, state (@state, as vmctl list shows it),
 * template, cpus, memory_mib, disk_gib, created, state_since, idle {never, pause_after_s,
 * save_after_s}, checkpoints {every_s, keep, hourly, daily}, restart, keep_awake (@keep_awake,
 * consumed; NULL: null). Never the record's paths, keys, ports, uuid, MAC or fork source. New
 * node; can't fail. */
JsonNode *hostd_guest_api_info_node(const HostdAgentRecord *r, const char *state,
                                    JsonNode *keep_awake);

/* {"@key": @value} as text, @value consumed (NULL: JSON null). Newly allocated; can't fail. */
char *hostd_guest_api_wrap(const char *key, JsonNode *value);

G_END_DECLS
