#include "vm-trace.h"

void
vm_trace_init(VmTrace *trace)
{
    trace->start = trace->last = g_get_monotonic_time();
    trace->phases = g_string_new(NULL);
}

void
vm_trace_mark(VmTrace *trace, const char *phase)
{
    if (trace == NULL || trace->phases == NULL)
        return;
    gint64 now = g_get_monotonic_time();
    g_string_append_printf(trace->phases, "%s%s %.2f ms", trace->phases->len > 0 ? ", " : "", phase,
                           (now - trace->last) / 1000.0);
    trace->last = now;
}

char *
vm_trace_finish(VmTrace *trace, const char *what)
{
    char *text = g_strdup_printf("%s: %s; total %.2f ms", what, trace->phases->str,
                                 (g_get_monotonic_time() - trace->start) / 1000.0);
    vm_trace_clear(trace);
    return text;
}

void
vm_trace_clear(VmTrace *trace)
{
    if (trace->phases != NULL)
        g_string_free(trace->phases, TRUE);
    trace->phases = NULL;
}
