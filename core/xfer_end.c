/* How requests end: the end of a post counted once, a backend request
 * stopped without waiting, every request of a peer incarnation failed (its
 * death, its unload, regions it removed) and requests past the agent's
 * timeout. Below the peer's death (peer_death.c), which ends requests
 * through it. Agent lock held throughout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_int.h"
#include "path_int.h"
#include "xfer_int.h"

/* The end of a post: record it once in the backend's and peer's counters. */
void pdx_xfer_end_locked(pdx_agent_h agent, struct pdx_xfer *x,
                         pdx_status_t st)
{
    __atomic_store_n(&x->settled, 0, __ATOMIC_RELAXED);
    x->status = st;
    if (st == PDX_INPROGRESS || x->counted || !x->posted) {
        return;
    }
    x->counted = true;
    struct pdx_backend *be = x->bindex >= 0 ? agent->backends[x->bindex]
                                            : NULL;
    if (x->timed || (agent->params.flags & PDX_AGENT_F_TELEMETRY)) {
        x->done_ns = pdx_now_ns();
    }
    if (be != NULL && st == PDX_OK && x->timed && x->done_ns >= x->post_ns) {
        pdx_hist_add(&be->metrics.done, x->done_ns - x->post_ns);
    } else if (be != NULL && st < 0 && st != PDX_ERR_CANCELED) {
        pdx_be_metrics_error(&be->metrics, st);
    }
    if (x->cls >= 0) {
        /* The cost class learns what this post cost. */
        pdx_peer_t *p = pdx_xfer_peer(agent, x);
        if (p != NULL && p->epoch == x->peer_epoch) {
            pdx_path_end(p, x->cls, x->cls_key, x->bindex, x->cost_t0,
                         x->cost_div, st == PDX_OK);
        }
        x->cost_t0 = 0;
    }
    pdx_stats_t *bs = be != NULL ? &be->stats : NULL;
    pdx_stats_t *ps = x->pstats != NULL ? &x->pstats->s : NULL;
    for (int i = 0; i < 2; i++) {
        pdx_stats_t *s = i == 0 ? bs : ps;
        if (s == NULL) {
            continue;
        }
        if (st == PDX_OK) {
            s->completed++;
            s->bytes += x->bytes;
        } else if (st == PDX_ERR_CANCELED) {
            s->canceled++;
        } else {
            s->errors++;
            s->timeouts += st == PDX_ERR_TIMEOUT;
        }
    }
}

/* Ask the backend to stop `x`'s request without waiting. Returns false
 * when it has no abort op (then the request was released, blocking). */
bool pdx_xfer_backend_abort_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    struct pdx_backend *b = agent->backends[x->bindex];
    if (PDX_BE_HAS(b->ops, xfer_abort) &&
        b->ops->xfer_abort(b->be, x->breq) == PDX_OK) {
        return true;
    }
    b->ops->xfer_release(b->be, x->breq);
    x->breq = NULL;
    return false;
}

void pdx_xfer_fail_peer_locked(pdx_agent_h agent, uint64_t epoch,
                               pdx_status_t why, pdx_fail_mode_t mode)
{
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->peer_epoch != epoch) {
            continue;
        }
        bool was_live = x->status == PDX_INPROGRESS;
        if (was_live) {
            pdx_xfer_end_locked(agent, x, why);
        }
        if (x->breq == NULL) {
            continue;
        }
        if (mode == PDX_FAIL_RELEASE) {
            /* The peer is being unloaded: backends want every request
             * released before the peer; release never waits for it. */
            agent->backends[x->bindex]->ops->xfer_release(
                agent->backends[x->bindex]->be, x->breq);
            x->breq = NULL;
        } else if (was_live && mode == PDX_FAIL_ABORT) {
            /* Stop it; progress releases it once the backend says it
             * ended (never waiting here, under the lock). From inside a
             * backend call (PDX_FAIL_MARK) the backend already ended it. */
            pdx_xfer_backend_abort_locked(agent, x);
        }
    }
}

static bool uses_rmd(const struct pdx_xfer *x, void *const *rmds, size_t n)
{
    if (rmds == NULL) {
        return true;
    }
    for (size_t i = 0; i < x->niov; i++) {
        for (size_t j = 0; j < n; j++) {
            if (x->iov[i].remote_md == rmds[j]) {
                return true;
            }
        }
    }
    return false;
}

void pdx_xfer_fail_rmds_locked(pdx_agent_h agent, uint64_t epoch,
                               void *const *rmds, size_t n)
{
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->peer_epoch != epoch || x->stale || !uses_rmd(x, rmds, n)) {
            continue;
        }
        x->stale = true;
        if (x->status == PDX_INPROGRESS) {
            pdx_xfer_end_locked(agent, x, PDX_ERR_STALE);
        }
        if (x->breq != NULL) {
            /* The keys it uses are unloaded next: backends want their
             * requests released first; release never waits for the peer. */
            agent->backends[x->bindex]->ops->xfer_release(
                agent->backends[x->bindex]->be, x->breq);
            x->breq = NULL;
        }
    }
}

void pdx_xfer_timeouts_locked(pdx_agent_h agent, uint64_t now)
{
    uint64_t limit = (uint64_t)agent->params.xfer_timeout_ms * 1000000ull;
    if (limit == 0) {
        return;
    }
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS && x->post_ns != 0 &&
            now > x->post_ns && now - x->post_ns > limit) {
            pdx_warn("agent %s: request to %s timed out after %u ms "
                     "(peer hung?)", agent->name, x->peer_name,
                     agent->params.xfer_timeout_ms);
            pdx_xfer_end_locked(agent, x, PDX_ERR_TIMEOUT);
            if (x->breq != NULL) {
                /* Stopped in the background: progress releases it once
                 * the backend gives up on the peer. */
                pdx_xfer_backend_abort_locked(agent, x);
            }
        }
    }
}


