/* Internals of hostd-authorize.c that only tests may see. */
#pragma once

#include "hostd-authorize.h"

G_BEGIN_DECLS

/* The shell script the guest runs, as the agent's user, to make its ~/.ssh/authorized_keys hold
 * the lines on its stdin (hostd_authorize_guest_input()) in place of every line marked
 * HOSTD_USER_KEY_MARK, keeping every other line; atomic (a temporary file in ~/.ssh, synced, then
 * renamed), ~/.ssh 0700 and the file 0600, owned by the user. Static storage. */
const char *hostd_authorize_guest_script(void);

/* What the script reads for @keys (VmSshKey*): one hostd_user_key_guest_line() a line. Newly
 * allocated; can't fail. */
char *hostd_authorize_guest_input(GPtrArray *keys);

G_END_DECLS
