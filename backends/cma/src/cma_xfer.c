/* cma: transfers: post (inline when small and mapped, else to the
 * worker), check (which helps with mapped chunks), abort, release. */
#include "cma_int.h"

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
    for (size_t i = 0; i < n && mapped; i++) {
        mapped = ((const cma_region_t *)iov[i].remote_md)->base != NULL;
        total += iov[i].len;
    }
    if (mapped && total <= be->inline_max) {
        return cma_copy_mapped(be, iov, n, op, total);
    }
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
    if (mapped && cma_plan_chunks(r) != PDX_OK) {
        pthread_mutex_lock(&be->lock);
        cma_iov_recycle(be, r->iov, r->cap);
        pthread_mutex_unlock(&be->lock);
        free(r);
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_lock(&be->lock);
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

pdx_status_t cma_xfer_check(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    if (r->mapped) {
        /* Copy a chunk here rather than spin while the worker copies. */
        if (!cma_mapped_done(r)) {
            cma_help_mapped(bev, r, 0, 1);
        }
        if (!cma_mapped_done(r)) {
            return PDX_INPROGRESS;
        }
        return atomic_load(&r->canceled) ? PDX_ERR_CANCELED
               : cma_rev_ok(r->iov, r->n) ? PDX_OK
                                           : PDX_ERR_STALE;
    }
    if (!atomic_load(&r->state)) {
        return PDX_INPROGRESS;
    }
    return r->status;
}

pdx_status_t cma_xfer_abort(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    atomic_store(&r->abort, 1);
    return PDX_OK;
}

/* Waits until the worker is done with the request: a system call in
 * progress (a bounded kernel copy that needs nothing from the peer), or,
 * for a mapped request, the chunk being copied (the rest are skipped once
 * the abort flag is set). Chunks claimed in xfer_check ran under the
 * agent's lock, as this does. Nothing lands after release returns. */
void cma_xfer_release(void *bev, void *reqv)
{
    cma_be_t *be = bev;
    cma_req_t *r = reqv;
    atomic_store(&r->abort, 1);
    pthread_mutex_lock(&be->lock);
    while (!atomic_load(&r->state)) {
        pthread_cond_wait(&be->cv, &be->lock);
    }
    cma_iov_recycle(be, r->iov, r->cap);
    pthread_mutex_unlock(&be->lock);
    free(r->chunks);
    free(r);
}
