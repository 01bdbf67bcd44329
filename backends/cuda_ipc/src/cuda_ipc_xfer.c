/* cuda_ipc: transfers: async copies on a device's streams, one event per
 * stream used; check, abort and release. */
#include "cuda_ipc_int.h"

static CUresult copy_one(cipc_be_t *be, pdx_xfer_op_t op, const cipc_md_t *l,
                         const cipc_rmd_t *r, uint64_t laddr, CUdeviceptr rptr,
                         size_t len, CUstream s)
{
    const cu_api_t *a = &be->api;
    if (l->type == PDX_MEM_DRAM) {
        void *h = (void *)(uintptr_t)laddr;
        return op == PDX_XFER_READ ? a->MemcpyDtoHAsync(h, rptr, len, s)
                                   : a->MemcpyHtoDAsync(rptr, h, len, s);
    }
    CUdeviceptr lp = (CUdeviceptr)laddr;
    if (l->dev == r->dev) {
        return op == PDX_XFER_READ ? a->MemcpyDtoDAsync(lp, rptr, len, s)
                                   : a->MemcpyDtoDAsync(rptr, lp, len, s);
    }
    CUcontext lc = be->devs[l->dev].ctx, rc = be->devs[r->dev].ctx;
    return op == PDX_XFER_READ ? a->MemcpyPeerAsync(lp, lc, rptr, rc, len, s)
                               : a->MemcpyPeerAsync(rptr, rc, lp, lc, len, s);
}

/* Wait for every stream marked in be->used (error path of post: nothing
 * may stay in flight). */
static void sync_used(cipc_be_t *be)
{
    for (int d = 0; d < be->ndev; d++) {
        if (be->used[d] == 0 || cipc_dev_enter(be, d) != PDX_OK) {
            continue;
        }
        for (unsigned i = 0; i < be->devs[d].nstreams; i++) {
            if (be->used[d] & (1ull << i)) {
                be->api.StreamSynchronize(be->devs[d].streams[i]);
            }
        }
        cipc_dev_leave(be);
    }
}

pdx_status_t cipc_op_xfer_post(void *be_, void *peer_, pdx_xfer_op_t op,
                               const pdx_backend_iov_t *iov, size_t n,
                               const void *notif, size_t notif_len,
                               void **req_p)
{
    cipc_be_t *be = be_;
    cipc_peer_t *peer = peer_;
    (void)notif; /* no CAP_NOTIF: the agent sends it after completion */
    (void)notif_len;
    if (op != PDX_XFER_READ && op != PDX_XFER_WRITE) {
        return PDX_ERR_INVALID;
    }
    memset(be->used, 0, (size_t)be->ndev * sizeof(*be->used));
    pdx_status_t st = PDX_OK;
    int cur = -1;
    size_t pos = 0, nruns = 0;
    pdx_backend_iov_t run;
    while (cipc_iov_next(iov, n, &pos, &run)) {
        const cipc_md_t *l = run.local_md;
        const cipc_rmd_t *r = run.remote_md;
        if (l == NULL || r == NULL || r->peer != peer) {
            pdx_error("cuda_ipc: piece %zu has no region of this peer", nruns);
            st = PDX_ERR_INVALID;
            break;
        }
        if (r->host) {
            pdx_error("cuda_ipc: peer %s: its DRAM at 0x%" PRIx64
                      " is not reachable through CUDA IPC",
                      peer->name, run.remote_addr);
            st = PDX_ERR_UNSUPPORTED;
            break;
        }
        if (!cipc_in_range(run.local_addr, run.len, l->addr, l->len) ||
            !cipc_in_range(run.remote_addr, run.len, r->addr, r->len)) {
            pdx_error("cuda_ipc: piece 0x%" PRIx64 "/0x%" PRIx64 "+%" PRIu64
                      " lies outside its regions",
                      run.local_addr, run.remote_addr, run.len);
            st = PDX_ERR_INVALID;
            break;
        }
        /* The copy runs on the local GPU's streams, or on the peer GPU's
         * when the local side is DRAM. */
        int d = l->type == PDX_MEM_VRAM ? l->dev : r->dev;
        if (d != cur) {
            if (cur >= 0) {
                cipc_dev_leave(be);
            }
            cur = -1;
            st = cipc_dev_enter(be, d);
            if (st != PDX_OK) {
                break;
            }
            cur = d;
        }
        if (l->type == PDX_MEM_VRAM && l->dev != r->dev) {
            st = cipc_dev_ctx(be, r->dev); /* cuMemcpyPeerAsync names both */
            if (st != PDX_OK) {
                break;
            }
        }
        unsigned si;
        CUstream s;
        st = cipc_dev_stream(be, d, &si, &s);
        if (st != PDX_OK) {
            break;
        }
        CUdeviceptr rptr = r->ptr + (CUdeviceptr)(run.remote_addr - r->addr);
        CUresult cr =
            copy_one(be, op, l, r, run.local_addr, rptr, (size_t)run.len, s);
        if (cr != CUDA_SUCCESS) {
            st = cipc_cu_fail(be, cr, "async copy");
            break;
        }
        be->used[d] |= 1ull << si;
        nruns++;
    }
    if (cur >= 0) {
        cipc_dev_leave(be);
    }
    if (st != PDX_OK) {
        sync_used(be);
        return st;
    }
    if (nruns == 0) {
        return PDX_OK;
    }
    size_t nev = 0;
    for (int d = 0; d < be->ndev; d++) {
        nev += (size_t)__builtin_popcountll(be->used[d]);
    }
    cipc_req_t *req = malloc(sizeof(*req) + nev * sizeof(req->ev[0]));
    if (req == NULL) {
        sync_used(be);
        return PDX_ERR_NOMEM;
    }
    req->nev = 0;
    req->err = PDX_OK;
    req->aborted = 0;
    for (int d = 0; d < be->ndev && st == PDX_OK; d++) {
        if (be->used[d] == 0) {
            continue;
        }
        st = cipc_dev_enter(be, d);
        if (st != PDX_OK) {
            break;
        }
        for (unsigned i = 0; i < be->devs[d].nstreams && st == PDX_OK; i++) {
            if (!(be->used[d] & (1ull << i))) {
                continue;
            }
            CUevent ev;
            st = cipc_dev_event_get(be, d, &ev);
            if (st != PDX_OK) {
                break;
            }
            CUresult cr = be->api.EventRecord(ev, be->devs[d].streams[i]);
            if (cr != CUDA_SUCCESS) {
                cipc_dev_event_put(be, d, ev);
                st = cipc_cu_fail(be, cr, "cuEventRecord");
                break;
            }
            req->ev[req->nev].dev = d;
            req->ev[req->nev].ev = ev;
            req->nev++;
        }
        cipc_dev_leave(be);
    }
    if (st != PDX_OK) {
        sync_used(be);
        cipc_op_xfer_release(be, req);
        return st;
    }
    *req_p = req;
    return PDX_INPROGRESS;
}

pdx_status_t cipc_op_xfer_check(void *be_, void *req_)
{
    cipc_be_t *be = be_;
    cipc_req_t *req = req_;
    size_t i = 0;
    int cur = -1;
    while (i < req->nev && req->err == PDX_OK) {
        cipc_evt_t *e = &req->ev[i];
        if (e->dev != cur) {
            if (cur >= 0) {
                cipc_dev_leave(be);
            }
            cur = -1;
            if (cipc_dev_enter(be, e->dev) != PDX_OK) {
                req->err = PDX_ERR_BACKEND;
                break;
            }
            cur = e->dev;
        }
        CUresult r = be->api.EventQuery(e->ev);
        if (r == CUDA_ERROR_NOT_READY) {
            i++;
            continue;
        }
        if (r != CUDA_SUCCESS) {
            /* A failed copy (bad mapping, peer gone); the event is not
             * trusted again. */
            req->err = cipc_cu_fail(be, r, "copy (cuEventQuery)");
            be->api.EventDestroy(e->ev);
        } else {
            cipc_dev_event_put(be, e->dev, e->ev);
        }
        req->ev[i] = req->ev[--req->nev];
    }
    if (cur >= 0) {
        cipc_dev_leave(be);
    }
    if (req->err != PDX_OK) {
        return req->err;
    }
    if (req->nev > 0) {
        return PDX_INPROGRESS;
    }
    return req->aborted ? PDX_ERR_CANCELED : PDX_OK;
}

/* Copies cannot be cancelled: an aborted request completes as its copies
 * do and then reports PDX_ERR_CANCELED (cuda_ipc sends no notes itself). */
pdx_status_t cipc_op_xfer_abort(void *be_, void *req_)
{
    cipc_req_t *req = req_;
    if (req == NULL) {
        return PDX_ERR_INVALID;
    }
    req->aborted = 1;
    return PDX_OK;
}

void cipc_op_xfer_release(void *be_, void *req_)
{
    cipc_be_t *be = be_;
    cipc_req_t *req = req_;
    if (req == NULL) {
        return;
    }
    /* Copies cannot be cancelled; waiting for them is what keeps the
     * promise that no byte lands after release returns. */
    for (size_t i = 0; i < req->nev; i++) {
        cipc_evt_t *e = &req->ev[i];
        if (cipc_dev_enter(be, e->dev) != PDX_OK) {
            continue;
        }
        if (be->api.EventSynchronize(e->ev) == CUDA_SUCCESS) {
            cipc_dev_event_put(be, e->dev, e->ev);
        } else {
            be->api.EventDestroy(e->ev);
        }
        cipc_dev_leave(be);
    }
    free(req);
}
