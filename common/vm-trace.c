#include "vm-trace.h"

void
vm_trace_init(VmTrace *trace)
{
    trace->start = trace->last = g_get_monotonic_time();
    trace->phases = g_string_new(NULL);
    trace->marks = g_array_new(FALSE, FALSE, sizeof(VmTraceMark));
}

static void
trace_append(VmTrace *trace, const char *phase, gint64 when)
{
    g_string_append_printf(trace->phases, "%s%s %.2f ms", trace->phases->len > 0 ? ", " : "", phase,
                           (when - trace->last) / 1000.0);
    trace->last = when;
}

void
vm_trace_mark(VmTrace *trace, const char *phase)
{
    if (trace == NULL || trace->phases == NULL)
        return;
    VmTraceMark mark = {phase, g_get_monotonic_time()};
    trace_append(trace, phase, mark.when);
    g_array_append_val(trace->marks, mark);
}

void
vm_trace_mark_at(VmTrace *trace, const char *phase, gint64 when)
{
    if (trace == NULL || trace->phases == NULL)
        return;
    trace_append(trace, phase, CLAMP(when, trace->last, g_get_monotonic_time()));
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
    if (trace->marks != NULL)
        g_array_unref(trace->marks);
    trace->marks = NULL;
}
