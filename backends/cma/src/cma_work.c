/* cma: the copy engine: process_vm_readv/writev in iovec batches, memcpy
 * into and out of mapped shared regions, small requests inline (in post),
 * large ones in chunks of two lanes shared by the worker thread and the
 * thread in xfer_check. */
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

/* One process_vm_readv/writev of k iovec pairs (equal lengths pairwise),
 * partial copies resumed. The arrays are consumed. */
static pdx_status_t pvm_batch(cma_be_t *be, pid_t pid, pdx_xfer_op_t op,
                              struct iovec *lv, struct iovec *rv, size_t k)
{
    size_t first = 0;
    while (first < k) {
        size_t want = 0;
        for (size_t j = first; j < k; j++) {
            want += lv[j].iov_len;
        }
        ssize_t got = op == PDX_XFER_WRITE
                          ? process_vm_writev(pid, lv + first, k - first,
                                              rv + first, k - first, 0)
                          : process_vm_readv(pid, lv + first, k - first,
                                             rv + first, k - first, 0);
        if (got < 0) {
            int e = errno;
            pdx_error("cma: %s of pid %d failed: %s",
                      op == PDX_XFER_WRITE ? "process_vm_writev"
                                           : "process_vm_readv",
                      (int)pid, strerror(e));
            return cma_errno_status(e);
        }
        if (got == 0 && want > 0) {
            pdx_error("cma: pid %d: no progress copying %zu bytes", (int)pid,
                      want);
            return PDX_ERR_IO;
        }
        atomic_fetch_add_explicit(&be->bytes, (uint64_t)got,
                                  memory_order_relaxed);
        /* Advance over whole pairs, then into a partial one. */
        uint64_t left = (uint64_t)got;
        while (first < k && left >= lv[first].iov_len) {
            left -= lv[first].iov_len;
            first++;
        }
        if (first < k && left > 0) {
            lv[first].iov_base = (uint8_t *)lv[first].iov_base + left;
            rv[first].iov_base = (uint8_t *)rv[first].iov_base + left;
            lv[first].iov_len -= left;
            rv[first].iov_len -= left;
        }
    }
    return PDX_OK;
}

/* Bytes [off, off + len) of piece `v` into the next iovec pair of lv/rv;
 * a full batch is copied first. */
static pdx_status_t pvm_add(cma_be_t *be, pid_t pid, pdx_xfer_op_t op,
                            struct iovec *lv, struct iovec *rv, size_t *k,
                            const pdx_backend_iov_t *v, uint64_t off,
                            uint64_t len)
{
    pdx_status_t st = PDX_OK;
    if (len == 0) {
        return PDX_OK;
    }
    if (*k == CMA_PVM_BATCH) {
        st = pvm_batch(be, pid, op, lv, rv, *k);
        *k = 0;
    }
    lv[*k] = (struct iovec){(void *)(uintptr_t)(v->local_addr + off), len};
    rv[*k] = (struct iovec){(void *)(uintptr_t)(v->remote_addr + off), len};
    (*k)++;
    return st;
}

/* A small request by process_vm_readv/writev, inline in post: every piece
 * whole, CMA_PVM_BATCH pieces per system call. */
pdx_status_t cma_copy_pvm(cma_be_t *be, pid_t pid, pdx_xfer_op_t op,
                          const pdx_backend_iov_t *iov, size_t n)
{
    struct iovec lv[CMA_PVM_BATCH], rv[CMA_PVM_BATCH];
    size_t k = 0;
    pdx_status_t st = PDX_OK;
    for (size_t i = 0; i < n && st == PDX_OK; i++) {
        st = pvm_add(be, pid, op, lv, rv, &k, &iov[i], 0, iov[i].len);
    }
    return st == PDX_OK && k > 0 ? pvm_batch(be, pid, op, lv, rv, k) : st;
}

/* Copy lane `lane`'s part of chunk `c` by memcpy; returns the bytes. */
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

/* The same by process_vm_readv/writev: the lane's half of every piece of
 * the chunk, CMA_PVM_BATCH halves per system call. */
static pdx_status_t pvm_chunk_lane(cma_be_t *be, const cma_req_t *r,
                                   const cma_chunk_t *c, int lane)
{
    struct iovec lv[CMA_PVM_BATCH], rv[CMA_PVM_BATCH];
    size_t k = 0;
    uint64_t lo, hi;
    pdx_status_t st = PDX_OK;
    if (c->len > 0) {
        lane_range(c->len, lane, &lo, &hi);
        st = pvm_add(be, r->pid, r->op, lv, rv, &k, &r->iov[c->piece],
                     c->off + lo, hi - lo);
    } else {
        for (size_t j = c->piece; j < c->piece + c->npieces && st == PDX_OK;
             j++) {
            lane_range(r->iov[j].len, lane, &lo, &hi);
            st = pvm_add(be, r->pid, r->op, lv, rv, &k, &r->iov[j], lo,
                         hi - lo);
        }
    }
    return st == PDX_OK && k > 0 ? pvm_batch(be, r->pid, r->op, lv, rv, k)
                                 : st;
}

/* Claim and copy up to `max` half-chunks of a request. Every chunk has two
 * lanes (the first and second half of each of its pieces): the caller in
 * xfer_check works lane 0, the worker lane 1, and either takes the
 * other's when its own is done. Two threads then never write the same
 * cache lines, even when every descriptor names one buffer. After an
 * abort or a process_vm error, claimed parts are skipped. Returns true if
 * anything was claimed. */
bool cma_help(cma_be_t *be, cma_req_t *r, int lane, size_t max)
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
        } else if (atomic_load_explicit(&r->err, memory_order_relaxed)) {
            /* skipped: the request has failed */
        } else if (r->mapped) {
            atomic_fetch_add_explicit(&be->bytes_mapped,
                                      copy_chunk_lane(r, &r->chunks[i], l),
                                      memory_order_relaxed);
        } else {
            pdx_status_t st = pvm_chunk_lane(be, r, &r->chunks[i], l);
            int zero = 0;
            if (st != PDX_OK) {
                atomic_compare_exchange_strong(&r->err, &zero, (int)st);
            }
        }
        /* release: the copy is visible to whoever sees the count */
        atomic_fetch_add_explicit(&r->chunks_done, 1, memory_order_release);
    }
    return any;
}

bool cma_req_done(cma_req_t *r)
{
    return atomic_load_explicit(&r->chunks_done, memory_order_acquire) ==
           2 * r->nchunks;
}

/* Free a request nobody works on any more. Lock held. */
void cma_req_free(cma_be_t *be, cma_req_t *r)
{
    cma_iov_recycle(be, r->iov, r->cap);
    free(r->chunks);
    free(r);
}

/* ---- page tables of peers' mapped regions, filled ahead ----------------
 *
 * The first copy into or out of each page of a peer's mapped region
 * faults (a write fault per 4 KiB page, a read fault per 16): measured on
 * this project's VM, a first pass of 1 MiB copies over a fresh 256 MiB
 * mapping took 845-868 ms against 12-15 ms once mapped, and 367-409 ms
 * after MADV_POPULATE_READ (8-11 ms for the whole 256 MiB; what is left
 * is the VM's own first touch, which bare metal does not pay). So once a
 * region is mapped the worker fills its page tables, a step at a time
 * while it has no copy to do. Only pages the peer's file has now
 * (mincore): nothing is allocated or read from disk for it, and read
 * faults dirty nothing. A kernel without MADV_POPULATE_READ (before
 * 5.14) ends it: copies then fault as before. */

void cma_warm_add(cma_be_t *be, cma_region_t *m)
{
    pthread_mutex_lock(&be->lock);
    if (be->populate && m->map != NULL && !m->warm_queued) {
        m->warm_next = NULL;
        m->warm_off = 0;
        m->warm_queued = true;
        if (be->warm_tail != NULL) {
            be->warm_tail->warm_next = m;
        } else {
            be->warm_head = m;
        }
        be->warm_tail = m;
        pthread_cond_signal(&be->cv);
    }
    pthread_mutex_unlock(&be->lock);
}

/* Lock held. */
static void warm_unlink(cma_be_t *be, cma_region_t *m)
{
    cma_region_t *prev = NULL;
    for (cma_region_t *q = be->warm_head; q != NULL; q = q->warm_next) {
        if (q == m) {
            if (prev != NULL) {
                prev->warm_next = m->warm_next;
            } else {
                be->warm_head = m->warm_next;
            }
            if (be->warm_tail == m) {
                be->warm_tail = prev;
            }
            break;
        }
        prev = q;
    }
    m->warm_next = NULL;
    m->warm_queued = false;
}

void cma_warm_remove(cma_be_t *be, cma_region_t *m)
{
    pthread_mutex_lock(&be->lock);
    if (m->warm_queued) {
        warm_unlink(be, m);
    }
    /* Bounded by one step (CMA_WARM_STEP of page tables). */
    while (be->warming == m) {
        pthread_cond_wait(&be->warm_cv, &be->lock);
    }
    pthread_mutex_unlock(&be->lock);
}

/* One step in the first queued region. Lock held on entry and return,
 * dropped for the step itself. */
static void warm_step(cma_be_t *be)
{
    cma_region_t *m = be->warm_head;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t off = m->warm_off;
    size_t len = m->map_len - off < CMA_WARM_STEP ? m->map_len - off
                                                  : CMA_WARM_STEP;
    be->warming = m;
    pthread_mutex_unlock(&be->lock);
    uint8_t *p = (uint8_t *)m->map + off;
    size_t npg = (len + pg - 1) / pg, warmed = 0;
    bool unsupported = false;
    if (pg >= 4096 && npg <= sizeof(be->warm_vec) &&
        mincore(p, len, be->warm_vec) == 0) {
        for (size_t i = 0; i < npg;) {
            if (!(be->warm_vec[i] & 1)) {
                i++;
                continue;
            }
            size_t j = i;
            while (j < npg && (be->warm_vec[j] & 1)) {
                j++;
            }
            size_t a = i * pg, b = j * pg < len ? j * pg : len;
#ifdef MADV_POPULATE_READ
            if (madvise(p + a, b - a, MADV_POPULATE_READ) != 0) {
                /* EINVAL: not this kernel. Else (the file shrank under
                 * the mapping: EFAULT) the rest of the step is left. */
                unsupported = errno == EINVAL;
                break;
            }
#else
            unsupported = true;
            break;
#endif
            warmed += b - a;
            i = j;
        }
    }
    pthread_mutex_lock(&be->lock);
    atomic_fetch_add_explicit(&be->bytes_warmed, warmed,
                              memory_order_relaxed);
    /* An unload of `m` waits for this (warming == m) before freeing it. */
    m->warm_off = off + len;
    if (m->warm_queued && (m->warm_off >= m->map_len || unsupported)) {
        warm_unlink(be, m);
    }
    if (unsupported) {
        pdx_debug("cma: MADV_POPULATE_READ unsupported here: peers' "
                  "mapped regions fault in on first use");
        be->populate = false;
        be->warm_unsupported = true;
        while (be->warm_head != NULL) {
            warm_unlink(be, be->warm_head);
        }
    }
    be->warming = NULL;
    pthread_cond_broadcast(&be->warm_cv);
}

/* The worker: takes the oldest queued request off the queue and works
 * lane 1 of it (then lane 0's leftovers) until every chunk is claimed.
 * A request released meanwhile (every chunk claimed, nothing left to
 * land) is freed here. With no request queued it fills mapped regions'
 * page tables ahead, a step at a time (a request waits at most a step
 * for it, and its caller's lane copies meanwhile). */
void *cma_worker_main(void *arg)
{
    cma_be_t *be = arg;
    pthread_mutex_lock(&be->lock);
    for (;;) {
        while (be->head == NULL && be->warm_head == NULL && !be->stop) {
            pthread_cond_wait(&be->cv, &be->lock);
        }
        if (be->head == NULL && (be->stop || be->warm_head == NULL)) {
            break;
        }
        if (be->head == NULL) {
            warm_step(be);
            continue;
        }
        cma_req_t *r = be->head;
        be->head = r->next;
        if (be->head == NULL) {
            be->tail = NULL;
        }
        r->next = NULL;
        r->queued = false;
        r->in_worker = true;
        pthread_mutex_unlock(&be->lock);
        cma_help(be, r, 1, SIZE_MAX);
        pthread_mutex_lock(&be->lock);
        r->in_worker = false;
        if (r->released) {
            cma_req_free(be, r);
        }
    }
    pthread_mutex_unlock(&be->lock);
    return NULL;
}
