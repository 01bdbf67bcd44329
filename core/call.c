/* Per-thread error text of the last failing call (pdx_last_error) and the
 * handle tags and quarantine behind "a released handle is refused". */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/status.h>

#include "base_int.h"
#include "call_int.h"

#define CALL_TEXT_MAX 1024

typedef struct call_tls {
    int depth;
    size_t pending_len;
    char pending[CALL_TEXT_MAX];
    char last[CALL_TEXT_MAX];
    pdx_status_t last_status;
} call_tls_t;

static __thread call_tls_t g_call;

const char *pdx_last_error(void) { return g_call.last; }

pdx_status_t pdx_last_status(void) { return g_call.last_status; }

void pdx_last_error_clear(void)
{
    g_call.last[0] = '\0';
    g_call.last_status = PDX_OK;
}

void pdx_call_enter(void)
{
    call_tls_t *t = &g_call;
    if (t->depth++ == 0) {
        t->pending_len = 0;
        t->pending[0] = '\0';
    }
}

static void call_finish(call_tls_t *t, const char *fn, pdx_status_t st)
{
    if (t->pending_len > 0) {
        memcpy(t->last, t->pending, t->pending_len + 1);
    } else {
        snprintf(t->last, sizeof(t->last), "%s: %s", fn,
                 pdx_status_string(st));
    }
    t->last_status = st;
}

pdx_status_t pdx_call_leave(const char *fn, pdx_status_t st)
{
    call_tls_t *t = &g_call;
    if (--t->depth == 0) {
        if (st < 0) {
            call_finish(t, fn, st);
        }
        pdx_log_call_end(st < 0);
    }
    if (t->depth < 0) {
        t->depth = 0; /* a leave without an enter: never go negative */
    }
    return st;
}

int pdx_call_leave_int(const char *fn, int n)
{
    if (n < 0) {
        return (int)pdx_call_leave(fn, (pdx_status_t)n);
    }
    pdx_call_leave(fn, PDX_OK);
    return n;
}

int pdx_call_capture(pdx_log_level_t level, const char *line)
{
    call_tls_t *t = &g_call;
    if (t->depth <= 0 || level > PDX_LOG_WARN) {
        return 0;
    }
    size_t room = sizeof(t->pending) - 1 - t->pending_len;
    if (room < 4) {
        return 1;
    }
    if (t->pending_len > 0) {
        /* Several lines of one call: the first is usually the cause, the
         * later ones the context added by outer layers. */
        memcpy(t->pending + t->pending_len, "; ", 2);
        t->pending_len += 2;
        room -= 2;
    }
    size_t n = strnlen(line, room);
    memcpy(t->pending + t->pending_len, line, n);
    t->pending_len += n;
    t->pending[t->pending_len] = '\0';
    return 1;
}

pdx_status_t pdx_call_fail(pdx_status_t st, const char *fmt, ...)
{
    char line[CALL_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pdx_log(PDX_LOG_ERROR, "%s", line);
    return st;
}

void pdx_call_note(const char *fmt, ...)
{
    char line[CALL_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pdx_call_capture(PDX_LOG_ERROR, line);
}

int pdx_call_suspend(void)
{
    int d = g_call.depth;
    g_call.depth = 0;
    /* The callback's own calls end as outermost calls: lines held so far
     * are written now rather than judged by them. */
    if (d > 0) {
        pdx_log_call_end(0);
    }
    return d;
}

void pdx_call_resume(int saved_depth)
{
    g_call.depth = saved_depth;
    g_call.pending_len = 0;
    g_call.pending[0] = '\0';
}

/* ---- fork ---------------------------------------------------------------- */

/* Bumped in a child process right after fork(): objects made before carry
 * an older epoch and are dead handles there (their threads, connections
 * and locks stayed in the parent). Process-wide by nature, like fork. */
static _Atomic uint64_t g_fork_epoch;

/* Header in front of every pdx_handle_alloc object (16 bytes keep the
 * object's alignment). */
typedef struct handle_hdr {
    uint64_t epoch;
    uint64_t pad;
} handle_hdr_t;

static pthread_mutex_t g_q_lock = PTHREAD_MUTEX_INITIALIZER;

static void fork_prepare(void)
{
    /* No pdx lock may be held across fork by another thread, or the child
     * would find it locked forever (the quarantine at exit; shm.c guards
     * its own lock the same way). */
    pthread_mutex_lock(&g_q_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&g_q_lock);
}

static void fork_child(void)
{
    atomic_fetch_add(&g_fork_epoch, 1);
    pthread_mutex_unlock(&g_q_lock);
}

__attribute__((constructor)) static void fork_init(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    pdx_log_set_capture(pdx_call_capture);
}

bool pdx_handle_inherited(const void *h)
{
    const handle_hdr_t *hd = (const handle_hdr_t *)h - 1;
    return hd->epoch != atomic_load_explicit(&g_fork_epoch,
                                             memory_order_relaxed);
}

/* Objects that own threads, connections or locks: dead in a forked child
 * (all pdx_handle_alloc objects have the header; layouts and hashers are
 * plain data and keep working there). */
static bool has_header(uint32_t magic)
{
    return magic == PDX_MAGIC_AGENT || magic == PDX_MAGIC_DLIST ||
           magic == PDX_MAGIC_CONN || magic == PDX_MAGIC_POOL;
}

bool pdx_handle_check(const void *h, uint32_t magic, const char *fn,
                      const char *what)
{
    if (h == NULL) {
        pdx_log(PDX_LOG_ERROR, "%s: %s is NULL", fn, what);
        return false;
    }
    if (*(const volatile uint32_t *)h != magic) {
        pdx_log(PDX_LOG_ERROR, "%s: %s %p is not a live %s (used after "
                "release or destroy?)", fn, what, h, what);
        return false;
    }
    if (has_header(magic) && pdx_handle_inherited(h)) {
        pdx_log(PDX_LOG_ERROR, "%s: %s %p was created before fork() in the "
                "parent process; inherited pdx objects are dead handles in "
                "a child (create new ones here)", fn, what, h);
        return false;
    }
    return true;
}

bool pdx_handle_check_release(const void *h, uint32_t magic, const char *fn,
                              const char *what)
{
    if (h != NULL && *(const volatile uint32_t *)h == magic &&
        has_header(magic) && pdx_handle_inherited(h)) {
        /* What a child's exit does (Python's finalisers, atexit): nothing
         * of the parent's may be touched, so it is left alone. */
        pdx_debug("%s: %s %p was inherited from the parent process: left "
                  "alone in this child", fn, what, h);
        return false;
    }
    return pdx_handle_check(h, magic, fn, what);
}

/* ---- quarantine ---------------------------------------------------------- */

typedef struct qnode {
    uint32_t magic; /* overlaps the object's tag: PDX_MAGIC_DEAD */
    uint32_t pad;
    struct qnode *next;
} qnode_t;

static qnode_t *g_q_head, *g_q_tail;
static size_t g_q_len;

static void qnode_free(qnode_t *n)
{
    if (n != NULL) {
        free((handle_hdr_t *)n - 1);
    }
}

void *pdx_handle_alloc(size_t size, uint32_t magic)
{
    if (size < sizeof(qnode_t)) {
        size = sizeof(qnode_t);
    }
    handle_hdr_t *hd = calloc(1, sizeof(*hd) + size);
    if (hd == NULL) {
        return NULL;
    }
    hd->epoch = atomic_load_explicit(&g_fork_epoch, memory_order_relaxed);
    uint32_t *p = (uint32_t *)(hd + 1);
    *p = magic;
    return p;
}

void pdx_handle_release(void *h)
{
    if (h == NULL) {
        return;
    }
    qnode_t *n = h;
    n->magic = PDX_MAGIC_DEAD;
    n->next = NULL;
    qnode_t *victim = NULL;
    pthread_mutex_lock(&g_q_lock);
    if (g_q_tail != NULL) {
        g_q_tail->next = n;
    } else {
        g_q_head = n;
    }
    g_q_tail = n;
    if (++g_q_len > PDX_QUARANTINE_MIN) {
        victim = g_q_head;
        g_q_head = victim->next;
        if (g_q_head == NULL) {
            g_q_tail = NULL;
        }
        g_q_len--;
    }
    pthread_mutex_unlock(&g_q_lock);
    qnode_free(victim);
}

/* Leak checkers see the quarantine emptied at unload. */
__attribute__((destructor)) static void quarantine_drain(void)
{
    pthread_mutex_lock(&g_q_lock);
    while (g_q_head != NULL) {
        qnode_t *n = g_q_head;
        g_q_head = n->next;
        qnode_free(n);
    }
    g_q_tail = NULL;
    g_q_len = 0;
    pthread_mutex_unlock(&g_q_lock);
}
