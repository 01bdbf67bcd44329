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
#include <unistd.h>

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

static const char *const g_level_names[] = {"error", "warn", "info",
                                             "debug", "trace"};

/* PDX_LOG_LEVEL's level; *bad_p set when it is set to something else
 * (reported once, by the caller, after the level is settled). */
static int level_from_env(int *bad_p)
{
    const char *env = getenv("PDX_LOG_LEVEL");
    *bad_p = 0;
    if (env == NULL || *env == '\0') {
        return PDX_LOG_WARN;
    }
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(env, g_level_names[i]) == 0) {
            return i;
        }
    }
    if (strcasecmp(env, "warning") == 0) {
        return PDX_LOG_WARN;
    }
    *bad_p = 1;
    return PDX_LOG_WARN;
}

pdx_log_level_t pdx_log_get_level(void)
{
    int l = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (l < 0) {
        int expected = -1, bad = 0;
        l = level_from_env(&bad);
        if (atomic_compare_exchange_strong(&g_level, &expected, l) && bad) {
            pdx_log(PDX_LOG_WARN,
                    "PDX_LOG_LEVEL=%s is not a level (error, warn, info, "
                    "debug or trace): logging at warn",
                    getenv("PDX_LOG_LEVEL"));
        }
        l = atomic_load(&g_level);
    }
    return (pdx_log_level_t)l;
}

/* A bad PDX_LOG_LEVEL is said when the library loads, not at the first
 * line that happens to be logged (maybe never). */
__attribute__((constructor)) static void log_init(void)
{
    (void)pdx_log_get_level();
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

/* ---- line prefixes, agents, lines held for a call -------------------- */

static _Atomic int g_quiet_failures;
static __thread const char *g_call_agent;
static __thread const char *g_thread_agent;

void pdx_log_call_agent(const char *name) { g_call_agent = name; }

void pdx_log_thread_agent(const char *name) { g_thread_agent = name; }

void pdx_log_set_quiet_failures(int quiet)
{
    atomic_store(&g_quiet_failures, quiet != 0);
}

/* "2026-05-04T22:15:29.123Z pdx error pid=1234 agent=glm52-p-dp0: " */
static void line_prefix(char *buf, size_t len, pdx_log_level_t level)
{
    struct timespec ts;
    struct tm tm;
    char when[32] = "";
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t secs = ts.tv_sec;
    if (gmtime_r(&secs, &tm) != NULL) {
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    }
    const char *agent = g_call_agent != NULL ? g_call_agent : g_thread_agent;
    snprintf(buf, len, "%s.%03ldZ pdx %s pid=%d agent=%s: ", when,
             ts.tv_nsec / 1000000L, g_level_names[level], (int)getpid(),
             agent != NULL && agent[0] != '\0' ? agent : "-");
}

static void emit(pdx_log_level_t level, const char *prefix, const char *line)
{
    log_sink_t *s = atomic_load(&g_sink);
    if (s != NULL) {
        s->cb(s->arg, level, line);
    } else {
        fprintf(stderr, "%s%s\n", prefix, line);
    }
}

/* Lines held while a public call runs (pdx_log_set_quiet_failures): each
 * a level byte, the prefix and the line, NUL-terminated. What does not
 * fit is written at once. */
#define HELD_MAX 4096
static __thread char g_held[HELD_MAX];
static __thread size_t g_held_len;

static int hold(pdx_log_level_t level, const char *prefix, const char *line)
{
    size_t pl = strlen(prefix), ll = strlen(line);
    if (g_held_len + 2 + pl + ll + 1 > HELD_MAX) {
        return 0;
    }
    char *p = g_held + g_held_len;
    p[0] = (char)('0' + (int)level);
    memcpy(p + 1, prefix, pl);
    p[1 + pl] = '\0';
    memcpy(p + 2 + pl, line, ll + 1);
    g_held_len += 2 + pl + ll + 1;
    return 1;
}

void pdx_log_call_end(int failed)
{
    g_call_agent = NULL;
    size_t off = 0;
    while (!failed && off < g_held_len) {
        const char *prefix = g_held + off + 1;
        const char *line = prefix + strlen(prefix) + 1;
        emit((pdx_log_level_t)(g_held[off] - '0'), prefix, line);
        off = (size_t)(line - g_held) + strlen(line) + 1;
    }
    g_held_len = 0;
}

void pdx_log(pdx_log_level_t level, const char *fmt, ...)
{
    if ((unsigned)level > PDX_LOG_TRACE) {
        level = PDX_LOG_TRACE;
    }
    pdx_log_level_t cur = pdx_log_get_level();
    int shown = (int)level <= (int)cur;
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
    int in_call = capture != NULL ? capture(level, line) : 0;
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
    char prefix[192];
    line_prefix(prefix, sizeof(prefix), level);
    /* A binding that raises every failure with its pdx_last_error() text
     * asked not to see those lines twice: held until the call ends,
     * written only if it succeeds. Level info and above asks for them. */
    if (in_call && level <= PDX_LOG_WARN && cur < PDX_LOG_INFO &&
        atomic_load_explicit(&g_quiet_failures, memory_order_relaxed) &&
        hold(level, prefix, line)) {
        return;
    }
    emit(level, prefix, line);
}
