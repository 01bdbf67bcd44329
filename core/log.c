/* Process-wide log sink and level (see pdx/log.h for why it is global). */
#include <pdx/log.h>

#include "base_int.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <xxhash.h>

typedef struct {
    pdx_log_cb_t cb;
    void *arg;
} log_sink_t;

static _Atomic int g_level = -1;
static _Atomic(log_sink_t *) g_sink;
static _Atomic(pdx_log_capture_cb_t) g_capture;

void pdx_log_set_capture(pdx_log_capture_cb_t cb)
{
    atomic_store(&g_capture, cb);
}

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

/* Repeated identical lines (errors and warnings: a caller polling a dead
 * peer) are shown at most g_rep_burst times per g_rep_window_ns; the rest
 * are counted, and the next one shown after the window says how many were
 * left out. PDX_LOG_REPEAT="N/MS" sets both (N=0: no limit). A small table
 * of recent lines by hash, one leaf lock taken with trylock: a contended
 * or (after fork) stuck lock only means the line is shown. */
#define REP_SLOTS 64
typedef struct rep_slot {
    uint64_t hash;
    uint64_t window_start_ns;
    uint32_t shown, dropped;
} rep_slot_t;
static pthread_mutex_t g_rep_lock = PTHREAD_MUTEX_INITIALIZER;
static rep_slot_t g_rep[REP_SLOTS];
static uint32_t g_rep_burst = 5;
static uint64_t g_rep_window_ns = 10000000000ull;
static pthread_once_t g_rep_once = PTHREAD_ONCE_INIT;

static void rep_init(void)
{
    const char *env = getenv("PDX_LOG_REPEAT");
    unsigned n;
    unsigned long long ms;
    if (env != NULL && sscanf(env, "%u/%llu", &n, &ms) == 2 && ms > 0 &&
        ms < 3600000ull) {
        g_rep_burst = n;
        g_rep_window_ns = ms * 1000000ull;
    }
}

/* Should `line` be shown? *dropped_p gets how many identical lines were
 * left out before it (to be said with it). */
static int rep_admit(const char *line, uint32_t *dropped_p)
{
    *dropped_p = 0;
    pthread_once(&g_rep_once, rep_init);
    if (g_rep_burst == 0 || pthread_mutex_trylock(&g_rep_lock) != 0) {
        return 1;
    }
    uint64_t h = XXH3_64bits(line, strlen(line)) | 1; /* 0: a free slot */
    uint64_t now = pdx_now_ns();
    rep_slot_t *slot = &g_rep[h % REP_SLOTS];
    int show = 1;
    if (slot->hash != h || now - slot->window_start_ns >= g_rep_window_ns) {
        /* A new line, or its window is over: start one (an evicted line
         * only loses its count). */
        *dropped_p = slot->hash == h ? slot->dropped : 0;
        *slot = (rep_slot_t){.hash = h, .window_start_ns = now, .shown = 1};
    } else if (slot->shown < g_rep_burst) {
        slot->shown++;
    } else {
        slot->dropped++;
        show = 0;
    }
    pthread_mutex_unlock(&g_rep_lock);
    return show;
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
    pdx_log_capture_cb_t capture = atomic_load(&g_capture);
    if (capture != NULL) {
        capture(level, line);
    }
    if (!shown) {
        return;
    }
    uint32_t dropped = 0;
    if (level <= PDX_LOG_WARN && !rep_admit(line, &dropped)) {
        return;
    }
    if (dropped > 0) {
        size_t n = strlen(line);
        snprintf(line + n, sizeof(line) - n,
                 " (%u identical lines left out in the last %llu s)", dropped,
                 (unsigned long long)(g_rep_window_ns / 1000000000ull));
    }
    log_sink_t *s = atomic_load(&g_sink);
    if (s != NULL) {
        s->cb(s->arg, level, line);
    } else {
        fprintf(stderr, "pdx %s: %s\n", tags[level], line);
    }
}
