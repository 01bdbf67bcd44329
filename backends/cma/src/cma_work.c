/* cma: the copy engine: process_vm_readv/writev in batches, memcpy into
 * and out of mapped shared regions in chunks of two lanes, and the worker
 * thread that runs posted requests. */
#include "cma_int.h"

/* Keep the bigger of a finished request's array and the spare. Lock held. */
void cma_iov_recycle(cma_be_t *be, pdx_backend_iov_t *iov, size_t cap)
{
    if (cap > be->spare_cap) {
        free(be->spare);
        be->spare = iov;
        be->spare_cap = cap;
    } else {
        free(iov);
    }
}

/* One request: batches of up to CMA_IOV_BATCH pieces, partial copies
 * resumed, the abort flag checked between system calls. */
/* Remote address of a piece in this process (mapped regions only). */
static uint8_t *mapped_addr(const pdx_backend_iov_t *v)
{
    const cma_region_t *m = v->remote_md;
    return m->base + (v->remote_addr - m->addr);
}

static void copy_piece(const pdx_backend_iov_t *v, pdx_xfer_op_t op,
                       uint64_t off, uint64_t len)
{
    uint8_t *loc = (uint8_t *)(uintptr_t)v->local_addr + off;
    uint8_t *rem = mapped_addr(v) + off;
    if (op == PDX_XFER_WRITE) {
        cma_copy(rem, loc, len);
    } else {
        cma_copy(loc, rem, len);
    }
}

/* A small mapped request, copied inline by post (its regions checked
 * after the copy: PDX_ERR_STALE if one went meanwhile). */
pdx_status_t cma_copy_mapped(cma_be_t *be, const pdx_backend_iov_t *iov,
                             size_t n, pdx_xfer_op_t op, uint64_t total)
{
    for (size_t i = 0; i < n; i++) {
        copy_piece(&iov[i], op, 0, iov[i].len);
    }
    be->bytes_inline += total;
    return cma_rev_ok(iov, n) ? PDX_OK : PDX_ERR_STALE;
}

/* Split a mapped request into chunks of about CMA_COPY_CHUNK bytes: runs
 * of whole small pieces, or slices of a large one. */
pdx_status_t cma_plan_chunks(cma_req_t *r)
{
    size_t cap = 16, n = 0;
    cma_chunk_t *c = malloc(cap * sizeof(*c));
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    size_t i = 0;
    while (i < r->n) {
        if (n + 1 > cap) {
            cap *= 2;
            void *p = realloc(c, cap * sizeof(*c));
            if (p == NULL) {
                free(c);
                return PDX_ERR_NOMEM;
            }
            c = p;
        }
        if (r->iov[i].len >= CMA_COPY_CHUNK) {
            /* Slices of one large piece: one entry, advanced below. */
            uint64_t off = n > 0 && c[n - 1].piece == i && c[n - 1].len > 0
                               ? c[n - 1].off + c[n - 1].len
                               : 0;
            uint64_t k = r->iov[i].len - off;
            k = k > CMA_COPY_CHUNK ? CMA_COPY_CHUNK : k;
            c[n++] = (cma_chunk_t){.piece = i, .npieces = 1, .off = off,
                                   .len = k};
            if (off + k == r->iov[i].len) {
                i++;
            }
            continue;
        }
        size_t first = i;
        uint64_t sum = 0;
        while (i < r->n && r->iov[i].len < CMA_COPY_CHUNK &&
               sum < CMA_COPY_CHUNK) {
            sum += r->iov[i].len;
            i++;
        }
        c[n++] = (cma_chunk_t){.piece = first, .npieces = i - first};
    }
    r->chunks = c;
    r->nchunks = n;
    return PDX_OK;
}

/* Bytes [lo, hi) of `len` that lane `lane` copies: lane 0 the first half,
 * lane 1 the rest, split on a cache line so the two never share one. */
static void lane_range(uint64_t len, int lane, uint64_t *lo, uint64_t *hi)
{
    uint64_t h = (len / 2) & ~(uint64_t)63;
    *lo = lane == 0 ? 0 : h;
    *hi = lane == 0 ? h : len;
}

/* Copy lane `lane`'s part of chunk `c`; returns the bytes copied. */
static uint64_t copy_chunk_lane(const cma_req_t *r, const cma_chunk_t *c,
                                int lane)
{
    uint64_t lo, hi, bytes = 0;
    if (c->len > 0) {
        lane_range(c->len, lane, &lo, &hi);
        copy_piece(&r->iov[c->piece], r->op, c->off + lo, hi - lo);
        return hi - lo;
    }
    for (size_t j = c->piece; j < c->piece + c->npieces; j++) {
        lane_range(r->iov[j].len, lane, &lo, &hi);
        copy_piece(&r->iov[j], r->op, lo, hi - lo);
        bytes += hi - lo;
    }
    return bytes;
}

/* Claim and copy up to `max` half-chunks of a mapped request. Every chunk
 * has two lanes (the first and second half of each of its pieces): the
 * caller in xfer_check works lane 0, the worker lane 1, and either takes
 * the other's when its own is done. Two threads then never write the same
 * cache lines, even when every descriptor names one buffer. After an
 * abort, claimed parts are skipped. Returns true if anything was claimed. */
bool cma_help_mapped(cma_be_t *be, cma_req_t *r, int lane, size_t max)
{
    bool any = false;
    for (size_t done = 0; done < max; done++) {
        size_t i = atomic_fetch_add(&r->next_chunk[lane], 1);
        int l = lane;
        if (i >= r->nchunks) {
            l = 1 - lane;
            i = atomic_fetch_add(&r->next_chunk[l], 1);
            if (i >= r->nchunks) {
                break;
            }
        }
        any = true;
        if (atomic_load_explicit(&r->abort, memory_order_relaxed)) {
            atomic_store(&r->canceled, 1);
        } else {
            atomic_fetch_add_explicit(&be->bytes_mapped,
                                      copy_chunk_lane(r, &r->chunks[i], l),
                                      memory_order_relaxed);
        }
        /* release: the copy is visible to whoever sees the count */
        atomic_fetch_add_explicit(&r->chunks_done, 1, memory_order_release);
    }
    return any;
}

bool cma_mapped_done(cma_req_t *r)
{
    return atomic_load_explicit(&r->chunks_done, memory_order_acquire) ==
           2 * r->nchunks;
}

static pdx_status_t run_req(cma_be_t *be, cma_req_t *r)
{
    if (r->mapped) {
        cma_help_mapped(be, r, 1, SIZE_MAX);
        return PDX_OK; /* completion is counted per chunk */
    }
    struct iovec lv[CMA_IOV_BATCH], rv[CMA_IOV_BATCH];
    size_t i = 0;
    uint64_t done_in_piece = 0;
    while (i < r->n) {
        if (atomic_load(&r->abort)) {
            return PDX_ERR_CANCELED;
        }
        size_t k = 0, want = 0;
        for (size_t j = i; j < r->n && k < CMA_IOV_BATCH; j++, k++) {
            uint64_t skip = j == i ? done_in_piece : 0;
            lv[k].iov_base = (void *)(uintptr_t)(r->iov[j].local_addr + skip);
            lv[k].iov_len = r->iov[j].len - skip;
            rv[k].iov_base = (void *)(uintptr_t)(r->iov[j].remote_addr + skip);
            rv[k].iov_len = r->iov[j].len - skip;
            want += lv[k].iov_len;
        }
        ssize_t got = r->op == PDX_XFER_WRITE
                          ? process_vm_writev(r->pid, lv, k, rv, k, 0)
                          : process_vm_readv(r->pid, lv, k, rv, k, 0);
        if (got < 0) {
            int e = errno;
            pdx_error("cma: %s of pid %d failed: %s",
                      r->op == PDX_XFER_WRITE ? "process_vm_writev"
                                              : "process_vm_readv",
                      (int)r->pid, strerror(e));
            return cma_errno_status(e);
        }
        if (got == 0 && want > 0) {
            pdx_error("cma: pid %d: no progress copying %zu bytes", (int)r->pid,
                      want);
            return PDX_ERR_IO;
        }
        atomic_fetch_add(&be->bytes, (uint64_t)got);
        /* Advance over whole pieces, then into a partial one. */
        uint64_t left = (uint64_t)got;
        while (i < r->n && left > 0) {
            uint64_t rest = r->iov[i].len - done_in_piece;
            if (left >= rest) {
                left -= rest;
                i++;
                done_in_piece = 0;
            } else {
                done_in_piece += left;
                left = 0;
            }
        }
    }
    /* Bytes of a region its owner gave up meanwhile: not OK. */
    return cma_rev_ok(r->iov, r->n) ? PDX_OK : PDX_ERR_STALE;
}

void *cma_worker_main(void *arg)
{
    cma_be_t *be = arg;
    pthread_mutex_lock(&be->lock);
    for (;;) {
        while (be->head == NULL && !be->stop) {
            pthread_cond_wait(&be->cv, &be->lock);
        }
        if (be->head == NULL) {
            break;
        }
        cma_req_t *r = be->head;
        pthread_mutex_unlock(&be->lock);
        pdx_status_t st = run_req(be, r);
        pthread_mutex_lock(&be->lock);
        be->head = r->next;
        if (be->head == NULL) {
            be->tail = NULL;
        }
        r->status = st;
        atomic_store(&r->state, 1);
        pthread_cond_broadcast(&be->cv);
    }
    pthread_mutex_unlock(&be->lock);
    return NULL;
}
