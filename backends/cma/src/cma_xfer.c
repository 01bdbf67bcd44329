/* cma: transfers: post (inline when small: memcpy of mapped memory or
 * process_vm_readv/writev, no thread involved; else queued to the worker),
 * check (which helps with the chunks), abort, release (which never waits
 * for the worker to wake). */
#include "cma_int.h"

#include <sched.h>
#include <time.h>

/* A large request: chunks of two lanes, queued to the worker; the caller
 * helps in xfer_check. */
static pdx_status_t post_queued(cma_be_t *be, cma_peer_t *peer,
                                pdx_xfer_op_t op, const pdx_backend_iov_t *iov,
                                size_t n, bool mapped, void **req_p)
{
    cma_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_lock(&be->lock);
    if (be->spare != NULL && be->spare_cap >= n) {
        r->iov = be->spare;
        r->cap = be->spare_cap;
        be->spare = NULL;
        be->spare_cap = 0;
    }
    pthread_mutex_unlock(&be->lock);
    if (r->iov == NULL) {
        r->iov = malloc(n * sizeof(*iov));
        r->cap = n;
        if (r->iov == NULL) {
            free(r);
            return PDX_ERR_NOMEM;
        }
    }
    memcpy(r->iov, iov, n * sizeof(*iov));
    r->n = n;
    r->op = op;
    r->pid = peer->pid;
    r->mapped = mapped;
    if (cma_plan_chunks(r) != PDX_OK) {
        pthread_mutex_lock(&be->lock);
        cma_iov_recycle(be, r->iov, r->cap);
        pthread_mutex_unlock(&be->lock);
        free(r);
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_lock(&be->lock);
    r->queued = true;
    if (be->tail != NULL) {
        be->tail->next = r;
    } else {
        be->head = r;
    }
    be->tail = r;
    pthread_cond_signal(&be->cv);
    pthread_mutex_unlock(&be->lock);
    *req_p = r;
    return PDX_INPROGRESS;
}

pdx_status_t cma_xfer_post(void *bev, void *peerv, pdx_xfer_op_t op,
                           const pdx_backend_iov_t *iov, size_t n,
                           const void *notif, size_t notif_len,
                           void **req_p)
{
    cma_be_t *be = bev;
    cma_peer_t *peer = peerv;
    if (n == 0) {
        return PDX_OK;
    }
    if (!cma_rev_ok(iov, n)) {
        /* The peer gave a region up (its revocation word says so). */
        pdx_info("cma: pid %d: a region of the request is no longer "
                 "registered there", (int)peer->pid);
        return PDX_ERR_STALE;
    }
    bool mapped = true;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        mapped = mapped &&
                 ((const cma_region_t *)iov[i].remote_md)->base != NULL;
        total += iov[i].len;
    }
    if (mapped && total <= be->inline_max) {
        return cma_copy_mapped(be, iov, n, op, total);
    }
    if (!mapped && total <= be->pvm_inline_max) {
        /* One system call per CMA_PVM_BATCH pieces, on this thread: a
         * hand-off to the worker and back cost more than the copy. */
        pdx_status_t st = cma_copy_pvm(be, peer->pid, op, iov, n);
        /* Bytes of a region its owner gave up meanwhile: not OK. */
        return st == PDX_OK && !cma_rev_ok(iov, n) ? PDX_ERR_STALE : st;
    }
    return post_queued(be, peer, op, iov, n, mapped, req_p);
}

pdx_status_t cma_xfer_check(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    /* Copy a chunk here rather than spin while the worker copies. */
    if (!cma_req_done(r)) {
        cma_help(bev, r, 0, 1);
    }
    if (!cma_req_done(r)) {
        return PDX_INPROGRESS;
    }
    int err = atomic_load(&r->err);
    return atomic_load(&r->canceled) ? PDX_ERR_CANCELED
           : err != 0                ? (pdx_status_t)err
           : cma_rev_ok(r->iov, r->n) ? PDX_OK
                                      : PDX_ERR_STALE;
}

pdx_status_t cma_xfer_abort(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    atomic_store(&r->abort, 1);
    return PDX_OK;
}

/* Claims (and skips: the abort flag is set) every chunk nobody has
 * claimed, then waits for the chunks being copied (a bounded kernel copy
 * or memcpy of at most half a chunk, needing nothing from the peer).
 * Nothing lands after release returns. The request then leaves the queue
 * here, or the worker, if it has it, frees it: release never waits for
 * the worker to wake. */
void cma_xfer_release(void *bev, void *reqv)
{
    cma_be_t *be = bev;
    cma_req_t *r = reqv;
    if (!cma_req_done(r)) {
        atomic_store(&r->abort, 1);
        cma_help(be, r, 0, SIZE_MAX);
        long ns = 1000;
        while (!cma_req_done(r)) {
            /* The other thread's half-chunk: yield, then nap briefly. */
            if (ns < 64000) {
                sched_yield();
            } else {
                struct timespec ts = {0, ns};
                nanosleep(&ts, NULL);
            }
            ns = ns < 1000000 ? ns * 2 : ns;
        }
    }
    pthread_mutex_lock(&be->lock);
    if (r->queued) {
        cma_req_t **pp = &be->head, *prev = NULL;
        while (*pp != r) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = r->next;
        if (be->tail == r) {
            be->tail = prev;
        }
        r->queued = false;
    }
    if (r->in_worker) {
        r->released = true; /* the worker frees it */
    } else {
        cma_req_free(be, r);
    }
    pthread_mutex_unlock(&be->lock);
}
