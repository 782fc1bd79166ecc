/* The HTTP side of the in-guest API's worker (vm-guest-api-worker): from the bytes a guest sent
 * to the call the worker hands hostd (hostd-guest-api-rules.h). Links libsoup, which hostd
 * itself no longer does; the worker and the fuzz target build it in. */
#pragma once

#include <glib.h>

#include "hostd-guest-api-rules.h"

G_BEGIN_DECLS

/* Reads @len bytes as one request as the worker's server does: the head with libsoup's own
 * parser (soup_headers_parse_request(), up to the first empty line, at most 64 KiB), the body as
 * its Content-Length or its chunks say (a body past HOSTD_GUEST_API_BODY_MAX counted, not
 * kept), then hostd_guest_api_call_read(). Writes *@ret (clear it) and returns TRUE for a
 * request that makes a call. FALSE when the server answers it without one: *@ret_status 400 for
 * a head (or chunk framing) libsoup refuses, 0 for one announcing a body past
 * HOSTD_GUEST_API_DISCARD_MAX (the connection is cut) or bytes that end before the request
 * does. Can't fail otherwise. */
gboolean hostd_guest_api_request_parse(const char *data, gsize len, HostdGuestApiCall *ret,
                                       guint *ret_status);

G_END_DECLS
