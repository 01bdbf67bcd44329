/* cuda_ipc: device helpers: a driver error logged once, a device's
 * primary context (retained on first use) entered and left, its stream
 * pool and idle events, and the range check keys and copies share. */
#include "cuda_ipc_int.h"

pdx_status_t cipc_cu_fail(cipc_be_t *be, CUresult r, const char *what)
{
    pdx_error("cuda_ipc: %s failed: %s", what, cu_err_name(&be->api, r));
    pdx_status_t st = cu_status(r);
    return st < 0 ? st : PDX_ERR_BACKEND;
}

pdx_status_t cipc_dev_ctx(cipc_be_t *be, int d)
{
    cipc_dev_t *dv = &be->devs[d];
    if (dv->ctx == NULL) {
        CUresult r = be->api.DevicePrimaryCtxRetain(&dv->ctx, dv->dev);
        if (r != CUDA_SUCCESS) {
            dv->ctx = NULL;
            return cipc_cu_fail(be, r, "cuDevicePrimaryCtxRetain");
        }
    }
    return PDX_OK;
}

/* Make device d's primary context current on this thread, keeping whatever
 * the caller had current underneath (push/pop). */
pdx_status_t cipc_dev_enter(cipc_be_t *be, int d)
{
    pdx_status_t st = cipc_dev_ctx(be, d);
    if (st != PDX_OK) {
        return st;
    }
    CUresult r = be->api.CtxPushCurrent(be->devs[d].ctx);
    return r == CUDA_SUCCESS ? PDX_OK : cipc_cu_fail(be, r, "cuCtxPushCurrent");
}

void cipc_dev_leave(cipc_be_t *be)
{
    CUcontext old;
    be->api.CtxPopCurrent(&old);
}

/* Next stream of the pool, round-robin; created lazily. Context of d must
 * be current. */
pdx_status_t cipc_dev_stream(cipc_be_t *be, int d, unsigned *idx_p,
                             CUstream *s_p)
{
    cipc_dev_t *dv = &be->devs[d];
    unsigned i = dv->next;
    dv->next = (dv->next + 1) % be->streams_per_dev;
    if (i >= dv->nstreams) {
        i = dv->nstreams; /* fill the pool in order */
        CUresult r =
            be->api.StreamCreate(&dv->streams[i], CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            return cipc_cu_fail(be, r, "cuStreamCreate");
        }
        dv->nstreams++;
    }
    *idx_p = i;
    *s_p = dv->streams[i];
    return PDX_OK;
}

pdx_status_t cipc_dev_event_get(cipc_be_t *be, int d, CUevent *ev_p)
{
    cipc_dev_t *dv = &be->devs[d];
    if (dv->npool > 0) {
        *ev_p = dv->pool[--dv->npool];
        return PDX_OK;
    }
    CUresult r = be->api.EventCreate(ev_p, CU_EVENT_DISABLE_TIMING);
    return r == CUDA_SUCCESS ? PDX_OK : cipc_cu_fail(be, r, "cuEventCreate");
}

/* Return an idle event to the pool (context of d current). */
void cipc_dev_event_put(cipc_be_t *be, int d, CUevent ev)
{
    cipc_dev_t *dv = &be->devs[d];
    if (dv->npool == dv->cappool) {
        size_t cap = dv->cappool ? dv->cappool * 2 : 16;
        CUevent *p = realloc(dv->pool, cap * sizeof(*p));
        if (p == NULL) {
            be->api.EventDestroy(ev);
            return;
        }
        dv->pool = p;
        dv->cappool = cap;
    }
    dv->pool[dv->npool++] = ev;
}

int cipc_in_range(uint64_t a, uint64_t len, uint64_t base, uint64_t blen)
{
    return a >= base && len <= blen && a - base <= blen - len;
}
