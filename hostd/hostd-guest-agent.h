/* Running a program in a guest through its qemu-guest-agent (guest-exec), for the moments when
 * there is no SSH to run it over: a warm image's machine before it has an identity, and a
 * restored agent while hostd gives it one (docs/INSTANT.md).
 *
 * The guest agent is the guest's: every answer is untrusted. Answers are capped in size and in
 * depth before json-glib parses them, a field of the wrong type fails the call, output is
 * bounded, the guest agent's error text (which libvirt quotes in its error) is cut and escaped,
 * and every wait has a deadline. libvirt reads the answer first (its own JSON parser, in hostd's
 * process: that part is libvirt's). Library code: returns a GError in VM_ERROR, never logs.
 */
#pragma once

#include <libvirt/libvirt.h>

#include "vm-error.h"

G_BEGIN_DECLS

/* The most of a guest agent's answer hostd parses, and of a program's output it keeps. */
#define HOSTD_GUEST_AGENT_REPLY_MAX  (1024 * 1024)
#define HOSTD_GUEST_AGENT_OUTPUT_MAX (64 * 1024)
/* The most of libvirt's error for a question the guest agent refused (its "desc" quoted) that an
 * error message carries, escaped by vm_log_text(). */
#define HOSTD_GUEST_AGENT_ERROR_MAX 512

/* Waits until the guest agent of the running @dom answers (guest-ping), asking every 50 ms, for
 * at most @timeout_ms. VM_ERROR_TIMEOUT when it never did. */
gboolean hostd_guest_agent_wait(virDomainPtr dom, guint timeout_ms, GError **error);

/* Runs @argv (argv[0] an absolute path in the guest) in the guest as root through guest-exec,
 * with @input (NULL: none) as its stdin, and waits for it to exit, for at most @timeout_ms.
 * Returns its exit status in *ret_status (a signal's death as 128 + the signal) and, when
 * @ret_output is not NULL, the first HOSTD_GUEST_AGENT_OUTPUT_MAX bytes of its stderr then its
 * stdout (newly allocated, NUL-terminated). Fails with VM_ERROR_LIBVIRT when the agent cannot
 * be asked or refuses (libvirt's message, the agent's text in it cut and escaped),
 * VM_ERROR_TIMEOUT when the program did not exit in time, VM_ERROR_PROTOCOL for an answer that is
 * too big, too deep or not what the protocol says. */
gboolean hostd_guest_agent_exec(virDomainPtr dom, const char *const *argv, GBytes *input,
                                guint timeout_ms, int *ret_status, char **ret_output,
                                GError **error);

/* Writes @text to the guest's file @path (created or truncated) as root through guest-file-open,
 * -write and -close: three round trips and no process started in the guest. Fails as
 * hostd_guest_agent_exec() does. */
gboolean hostd_guest_agent_write_file(virDomainPtr dom, const char *path, const char *text,
                                      GError **error);

G_END_DECLS
