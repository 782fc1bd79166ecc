/* Templates as hostd serves them: the shipped *.yaml files and their base images. */
#pragma once

#include "hostd-context.h"
#include "vm-template.h"

G_BEGIN_DECLS

/* Loads shipped template @name (VM_ERROR_NOT_FOUND when there is none). */
VmTemplate *hostd_template_load(HostdContext *ctx, const char *name, GError **error);

/* The names of the shipped templates (a GPtrArray of strings; a HostdClusterTemplatesFunc with
 * @data the context), or NULL when the templates directory cannot be read. */
GPtrArray *hostd_template_names(gpointer data);

/* Every shipped template with whether its image is ready (aa{sv}). */
GVariant *hostd_template_list(HostdContext *ctx, GError **error);

/* Builds or downloads a template's image (idempotent unless @force; a forced rebuild is refused
 * with VM_ERROR_BAD_STATE while agents use the image). Returns the image dir. */
char *hostd_template_build(HostdContext *ctx, const char *name, gboolean force,
                           VmProgressFunc progress, gpointer progress_data, GError **error);

/* Whether template @name has a current warm image: "yes", or why not (hostd_warm_state()).
 * Newly allocated; can't fail. */
char *hostd_template_warm_state(HostdContext *ctx, const char *name);

G_END_DECLS
