/* The backend object: creating an agent's backends (from a module the
 * loader found, or a linked-in table), describing them, and running one
 * backend op without the agent lock (backend_int.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "api_int.h"
#include "backend_int.h"
#include "loader_int.h"
#include "mem_int.h"

/* The agent whose backend this thread runs without the agent lock
 * (between pdx_backend_unlock_begin and _end): its callbacks are queued. */
/* (Not initial-exec: libpdx is dlopen'ed by Python after numpy, when
 * glibc's static TLS surplus may be gone: "cannot allocate memory in
 * static TLS block".) */
static __thread pdx_agent_h t_unlocked;

pdx_agent_h pdx_backend_unlocked_agent(void) { return t_unlocked; }

void pdx_backend_unlock_begin(pdx_agent_h agent)
{
    agent->be_busy = true;
    pthread_mutex_unlock(&agent->lock);
    t_unlocked = agent;
}

void pdx_backend_unlock_end(pdx_agent_h agent)
{
    t_unlocked = NULL;
    pthread_mutex_lock(&agent->lock);
    agent->be_busy = false;
    pthread_cond_broadcast(&agent->be_cond); /* waiters, and a progress */
}

static pdx_status_t backend_add(pdx_agent_h a, const pdx_backend_ops_t *ops,
                                void *dl, const pdx_option_t *opts,
                                size_t nopts, pdx_backend_h *be_p)
{
    pdx_status_t st;
    char why[256] = "";
    if (a->nbackends == PDX_MAX_BACKENDS) {
        pdx_error("agent %s: at most %d backends", a->name, PDX_MAX_BACKENDS);
        return PDX_ERR_TOO_LARGE;
    }
    for (uint32_t i = 0; i < a->nbackends; i++) {
        if (strcmp(a->backends[i]->name, ops->name) == 0) {
            pdx_error("agent %s: backend %s already created", a->name,
                      ops->name);
            return PDX_ERR_EXISTS;
        }
    }
    if (a->nregs > 0 || a->peers != NULL) {
        pdx_error("agent %s: create backend %s before registering memory or "
                  "loading peers", a->name, ops->name);
        return PDX_ERR_INVALID;
    }
    st = ops->query(why, sizeof(why));
    if (st != PDX_OK) {
        pdx_warn("agent %s: backend %s unavailable: %s", a->name, ops->name,
                 why);
        return PDX_ERR_UNAVAILABLE;
    }
    struct pdx_backend *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    b->magic = PDX_MAGIC_BACKEND;
    b->agent = a;
    b->ops = ops;
    b->dl = dl;
    b->index = a->nbackends;
    snprintf(b->name, sizeof(b->name), "%s", ops->name);
    st = ops->create(&a->host, opts, nopts, &b->be);
    if (st != PDX_OK) {
        pdx_error("agent %s: backend %s create failed: %s", a->name,
                  ops->name, pdx_status_string(st));
        free(b);
        return st;
    }
    int bfd = (ops->caps & PDX_BACKEND_CAP_EVENT_FD) ? ops->event_fd(b->be)
                                                     : -1;
    if (bfd >= 0) {
        /* In the users' fd too, progress thread or not: a caller that
         * checks its request once and then sleeps on the fd (calling
         * pdx_progress when it wakes, which re-arms the backends) wakes
         * on the backend's event; with the thread napping while callers
         * poll, a wake-up from the thread could come a nap later. */
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = bfd};
        if (epoll_ctl(a->epoll_fd, EPOLL_CTL_ADD, bfd, &ev) != 0 ||
            epoll_ctl(a->prog_epoll_fd, EPOLL_CTL_ADD, bfd, &ev) != 0) {
            pdx_warn("agent %s: backend %s event fd not watched: %s",
                     a->name, ops->name, strerror(errno));
        }
        pdx_agent_wake(a);
        if (ops->arm(b->be) == PDX_ERR_BUSY) {
            pdx_agent_signal(a);
        }
    }
    if ((ops->caps & PDX_BACKEND_CAP_VRAM) &&
        !(ops->caps & PDX_BACKEND_CAP_SAME_HOST) && PDX_BE_HAS(ops, path)) {
        /* How it moves our GPU memory (no peer, no region): natively, or
         * staged through host memory. */
        char t[64] = "";
        b->vram_staged = ops->path(b->be, NULL, NULL, t, sizeof(t),
                                   b->vram_why, sizeof(b->vram_why)) ==
                         PDX_ERR_UNAVAILABLE;
    }
    a->backends[a->nbackends] = b;
    /* Published: the progress thread looks at the backends without the
     * lock (their caller_polls). */
    __atomic_store_n(&a->nbackends, a->nbackends + 1, __ATOMIC_RELEASE);
    a->generation++;
    pdx_disc_changed_locked(a);
    char desc[256] = "";
    ops->describe(b->be, desc, sizeof(desc));
    pdx_info("agent %s: backend %s ready: %s", a->name, b->name, desc);
    if (be_p != NULL) {
        *be_p = b;
    }
    return PDX_OK;
}

pdx_status_t pdxi_backend_create(pdx_agent_h agent, const char *name,
                                const pdx_option_t *opts, size_t nopts,
                                pdx_backend_h *be_p)
{
    const pdx_backend_ops_t *ops;
    void *dl;
    char why[512];
    pdx_status_t st = pdx_loader_open(name, &ops, &dl, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_error("agent %s: backend %s: %s", agent->name,
                  name ? name : "(null)", why);
        return st;
    }
    pdx_agent_lock(agent);
    st = backend_add(agent, ops, dl, opts, nopts, be_p);
    pthread_mutex_unlock(&agent->lock);
    if (st != PDX_OK) {
        pdx_loader_close(dl);
    }
    return st;
}

pdx_status_t pdxi_backend_create_with_ops(pdx_agent_h agent, const void *ops,
                                          const pdx_option_t *opts,
                                          size_t nopts, pdx_backend_h *be_p)
{
    const pdx_backend_ops_t *o = ops;
    if (o == NULL || o->abi_version != PDX_BACKEND_ABI_VERSION ||
        o->size < PDX_BACKEND_OPS_MIN_SIZE) {
        pdx_error("agent %s: backend ops table rejected (abi or size)",
                  agent->name);
        return PDX_ERR_VERSION;
    }
    pdx_agent_lock(agent);
    pdx_status_t st = backend_add(agent, o, NULL, opts, nopts, be_p);
    pthread_mutex_unlock(&agent->lock);
    return st;
}

void pdxi_backend_describe(pdx_backend_h be, char *buf, size_t len)
{
    pdx_agent_lock(be->agent);
    int n = snprintf(buf, len, "%s: ", be->name);
    if (n >= 0 && (size_t)n < len) {
        be->ops->describe(be->be, buf + n, len - (size_t)n);
    }
    pthread_mutex_unlock(&be->agent->lock);
}

pdx_status_t pdxi_backend_probe(const char *name, uint64_t *caps_p, char *why,
                               size_t why_len)
{
    const pdx_backend_ops_t *ops;
    void *dl;
    char scratch[8];
    if (why == NULL || why_len == 0) {
        why = scratch;
        why_len = sizeof(scratch);
    }
    pdx_status_t st = pdx_loader_open(name, &ops, &dl, why, why_len);
    if (st != PDX_OK) {
        return st;
    }
    if (caps_p != NULL) {
        *caps_p = ops->caps;
    }
    st = ops->query(why, why_len);
    pdx_loader_close(dl);
    if (st == PDX_OK) {
        why[0] = '\0';
    }
    return st;
}
