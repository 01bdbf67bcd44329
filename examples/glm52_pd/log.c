/* glm52-pd-node's log: pdx's lines to stderr with the node's tag, its
 * error lines kept (a ring) so a failed job's reply can carry them, and
 * the node's own lines. The bottom of the node: calls only libc. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "node.h"

#define ERR_RING 8
static struct {
    pthread_mutex_t mu;
    char tag[16];
    char lines[ERR_RING][512];
    uint64_t seq; /* error lines seen */
} g_log = {.mu = PTHREAD_MUTEX_INITIALIZER, .tag = "node"};

void log_sink(void *arg, pdx_log_level_t level, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    pthread_mutex_lock(&g_log.mu);
    if (level == PDX_LOG_ERROR) {
        snprintf(g_log.lines[g_log.seq % ERR_RING], sizeof(g_log.lines[0]),
                 "%s", msg);
        g_log.seq++;
    }
    fprintf(stderr, "[%s] pdx %s: %s\n", g_log.tag,
            level <= PDX_LOG_TRACE ? names[level] : "?", msg);
    pthread_mutex_unlock(&g_log.mu);
}

void log_set_tag(const char *tag)
{
    pthread_mutex_lock(&g_log.mu);
    snprintf(g_log.tag, sizeof(g_log.tag), "%s", tag);
    pthread_mutex_unlock(&g_log.mu);
}

uint64_t log_mark(void)
{
    pthread_mutex_lock(&g_log.mu);
    uint64_t s = g_log.seq;
    pthread_mutex_unlock(&g_log.mu);
    return s;
}

/* The pdx error lines logged since `mark`, joined by "; ". */
void log_since(uint64_t mark, char *buf, size_t len)
{
    buf[0] = '\0';
    pthread_mutex_lock(&g_log.mu);
    if (g_log.seq - mark > ERR_RING) {
        mark = g_log.seq - ERR_RING;
    }
    size_t off = 0;
    for (uint64_t s = mark; s < g_log.seq && off < len; s++) {
        int n = snprintf(buf + off, len - off, "%s%s", off ? "; " : "",
                         g_log.lines[s % ERR_RING]);
        off += n > 0 ? (size_t)n : 0;
    }
    pthread_mutex_unlock(&g_log.mu);
}

void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log.mu);
    fprintf(stderr, "[%s] %s\n", g_log.tag, buf);
    pthread_mutex_unlock(&g_log.mu);
}
