/* What the arguments of each verb are, for the shell completions of dist/ (bash, zsh, fish),
 * which read it from `vmctl __complete`: one table for all three. */
#include "vmctl.h"

#include <string.h>

static const struct {
    const char *verb;
    const char *completes;
} arguments[] = {
    {"drain", "host"},
    {"undrain", "host"},
    {"move", "agent"},
    {"replicate", "agent"},
    {"recover", "agent"},
    {"info", "agent"},
    {"exec", "agent"},
    {"ssh", "agent"},
    {"ssh-config", "agent"},
    {"authorize", "agent file"},
    {"start", "agent..."},
    {"stop", "agent..."},
    {"rm", "agent..."},
    {"suspend", "agent..."},
    {"resume", "agent..."},
    {"keep-awake", "agent..."},
    {"idle", "agent"},
    {"autorestart", "agent restart"},
    {"checkpoint rm", "agent checkpoint"},
    {"checkpoint", "agent"},
    {"checkpoints", "agent"},
    {"autocheckpoint", "agent"},
    {"restore", "agent checkpoint"},
    {"diff", "agent checkpoint checkpoint"},
    {"fork", "agent"},
    {"egress", "agent"},
    {"egress-log", "agent"},
    {"events", "agent"},
    {"forward", "agent"},
    {"set", "agent"},
    {"cp", "location location"},
    {"logs", "agent"},
    {"stats", "agent..."},
    {"top", "agent..."},
    {"secret set", "secret"},
    {"secret rm", "secret"},
    {"secret grant", "agent secret"},
    {"secret revoke", "agent secret"},
    {"template build", "template"},
};

const char *
vmctl_completes(const char *verb)
{
    for (gsize i = 0; i < G_N_ELEMENTS(arguments); i++) {
        if (strcmp(arguments[i].verb, verb) == 0)
            return arguments[i].completes;
    }
    return "";
}
