/* Process-wide log sink and level (see pdx/log.h for why it is global). */
#include <pdx/log.h>

#include "pdx_call.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    pdx_log_cb_t cb;
    void *arg;
} log_sink_t;

static _Atomic int g_level = -1;
static _Atomic(log_sink_t *) g_sink;

static int level_from_env(void)
{
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    const char *env = getenv("PDX_LOG_LEVEL");
    if (env != NULL) {
        for (int i = 0; i < 5; i++) {
            if (strcasecmp(env, names[i]) == 0) {
                return i;
            }
        }
    }
    return PDX_LOG_WARN;
}

pdx_log_level_t pdx_log_get_level(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l < 0) {
        int expected = -1;
        l = level_from_env();
        atomic_compare_exchange_strong(&g_level, &expected, l);
        l = atomic_load(&g_level);
    }
    return (pdx_log_level_t)l;
}

void pdx_log_set_level(pdx_log_level_t level)
{
    atomic_store(&g_level, (int)level);
}

void pdx_log_set_handler(pdx_log_cb_t cb, void *arg)
{
    log_sink_t *s = NULL;
    if (cb != NULL) {
        s = malloc(sizeof(*s));
        if (s == NULL) {
            return;
        }
        s->cb = cb;
        s->arg = arg;
    }
    /* The old sink is leaked on purpose: a concurrent logger may still be
     * reading it, and handlers are set a handful of times per process. */
    atomic_store(&g_sink, s);
}

void pdx_log(pdx_log_level_t level, const char *fmt, ...)
{
    static const char *tags[] = {"error", "warn", "info", "debug", "trace"};
    int shown = (int)level <= (int)pdx_log_get_level();
    if (!shown && level > PDX_LOG_WARN) {
        return;
    }
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    /* Error and warning lines of a call also become its pdx_last_error()
     * text, whatever the log level. */
    pdx_call_capture(level, line);
    if (!shown) {
        return;
    }
    log_sink_t *s = atomic_load(&g_sink);
    if (s != NULL) {
        s->cb(s->arg, level, line);
    } else {
        fprintf(stderr, "pdx %s: %s\n", tags[level], line);
    }
}
