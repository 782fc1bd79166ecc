#include "hostd-notify.h"

#include <systemd/sd-daemon.h>

#include "vm-error.h"

gboolean
hostd_notify(const char *state, const char *status, GError **error)
{
    g_autoptr(GString) message = g_string_new(NULL);

    if (state != NULL)
        g_string_append_printf(message, "%s\n", state);
    if (status != NULL) {
        /* A newline would end STATUS= and start what the manager reads as another key. */
        g_autofree char *line = g_strdelimit(g_strdup(status), "\r\n", ' ');
        g_string_append_printf(message, "STATUS=%s\n", line);
    }
    if (message->len == 0)
        return TRUE;
    /* NOTIFY_SOCKET stays set: hostd notifies again when it stops. */
    int r = sd_notify(0, message->str);
    if (r < 0)
        return vm_throw_errno(error, -r, "cannot notify the service manager at %s",
                              g_getenv("NOTIFY_SOCKET"));
    return TRUE;
}
