/* cma backend: same-host DRAM transfers with one kernel copy
 * (process_vm_readv/writev, "cross-memory attach"), for peers on this host.
 *
 * Why: Debian's UCX 1.13 emulates RMA over shared memory for memory the
 * caller allocated (two copies through shm queues, the target's progress
 * thread doing one). Here the initiator's kernel copies straight between
 * the two address spaces; the target does nothing and may even be stopped.
 * Copies run on one worker thread per instance, so post never blocks; the
 * agent sends the request's notification (this backend carries none). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include <pdx/backend.h>

#define CMA_MAGIC 0x414d4350u /* "PCMA" */
#define CMA_VERSION 1u
#define CMA_HOST_MAX 128
#define CMA_IOV_BATCH 1024 /* iovecs per system call (IOV_MAX) */

typedef struct cma_req {
    struct cma_req *next;
    pid_t pid;
    pdx_xfer_op_t op;
    pdx_backend_iov_t *iov;
    size_t n, cap;
    _Atomic int state; /* 0 queued/running, 1 done */
    _Atomic int abort;
    pdx_status_t status;
} cma_req_t;

typedef struct cma_be {
    char host_id[CMA_HOST_MAX];
    pthread_mutex_t lock;
    pthread_cond_t cv;
    cma_req_t *head, *tail;
    bool stop;
    pthread_t worker;
    uint64_t bytes;
    /* The largest iov array of a finished request, reused by the next post:
     * a fresh multi-MiB malloc page-faults on first touch, which cost more
     * than the copy for 100k-piece requests. Under `lock`. */
    pdx_backend_iov_t *spare;
    size_t spare_cap;
} cma_be_t;

/* Keep the bigger of a finished request's array and the spare. Lock held. */
static void iov_recycle(cma_be_t *be, pdx_backend_iov_t *iov, size_t cap)
{
    if (cap > be->spare_cap) {
        free(be->spare);
        be->spare = iov;
        be->spare_cap = cap;
    } else {
        free(iov);
    }
}

typedef struct cma_peer {
    pid_t pid;
} cma_peer_t;

typedef struct cma_region {
    uint64_t addr, len;
} cma_region_t;

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t get_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static pdx_status_t errno_status(int e)
{
    switch (e) {
    case ESRCH:
        return PDX_ERR_REMOTE_DISCONNECT;
    case ENOMEM:
        return PDX_ERR_NOMEM;
    case EPERM:
        return PDX_ERR_UNAVAILABLE;
    default:
        return PDX_ERR_IO;
    }
}

/* One request: batches of up to CMA_IOV_BATCH pieces, partial copies
 * resumed, the abort flag checked between system calls. */
static pdx_status_t run_req(cma_be_t *be, cma_req_t *r)
{
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
            return errno_status(e);
        }
        if (got == 0 && want > 0) {
            pdx_error("cma: pid %d: no progress copying %zu bytes", (int)r->pid,
                      want);
            return PDX_ERR_IO;
        }
        be->bytes += (uint64_t)got;
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
    return PDX_OK;
}

static void *worker_main(void *arg)
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

static pdx_status_t cma_query(char *why, size_t len)
{
    char src[8] = "pdx-cma", dst[8] = {0};
    struct iovec l = {dst, sizeof(dst)}, r = {src, sizeof(src)};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(dst) ||
        memcmp(src, dst, sizeof(dst)) != 0) {
        snprintf(why, len, "process_vm_readv not permitted here: %s",
                 strerror(errno));
        return PDX_ERR_UNAVAILABLE;
    }
    return PDX_OK;
}

static pdx_status_t cma_create(const pdx_backend_host_t *host,
                               const pdx_kv_t *opts, size_t nopts,
                               void **be_p)
{
    for (size_t i = 0; i < nopts; i++) {
        pdx_error("cma: unknown option '%s' (this backend takes none)",
                  opts[i].key ? opts[i].key : "(null)");
        return PDX_ERR_CONFIG;
    }
    char why[128];
    if (cma_query(why, sizeof(why)) != PDX_OK) {
        pdx_error("cma: %s", why);
        return PDX_ERR_UNAVAILABLE;
    }
    cma_be_t *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return PDX_ERR_NOMEM;
    }
    snprintf(be->host_id, sizeof(be->host_id), "%s",
             host->host_id ? host->host_id : "");
    pthread_mutex_init(&be->lock, NULL);
    pthread_cond_init(&be->cv, NULL);
    if (pthread_create(&be->worker, NULL, worker_main, be) != 0) {
        pthread_cond_destroy(&be->cv);
        pthread_mutex_destroy(&be->lock);
        free(be);
        return PDX_ERR_IO;
    }
    *be_p = be;
    return PDX_OK;
}

static void cma_destroy(void *bev)
{
    cma_be_t *be = bev;
    pthread_mutex_lock(&be->lock);
    be->stop = true;
    pthread_cond_broadcast(&be->cv);
    pthread_mutex_unlock(&be->lock);
    pthread_join(be->worker, NULL);
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->lock);
    free(be->spare);
    free(be);
}

static pdx_status_t cma_conn_info(void *bev, void **buf_p, size_t *len_p)
{
    cma_be_t *be = bev;
    size_t hl = strlen(be->host_id);
    uint8_t *b = malloc(12 + hl);
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    put_le(b, CMA_MAGIC, 4);
    put_le(b + 4, CMA_VERSION, 2);
    put_le(b + 6, (uint64_t)hl, 2);
    put_le(b + 8, (uint32_t)getpid(), 4);
    memcpy(b + 12, be->host_id, hl);
    *buf_p = b;
    *len_p = 12 + hl;
    return PDX_OK;
}

static pdx_status_t cma_mem_register(void *bev, const pdx_region_t *r,
                                     void **md_p)
{
    if (r->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    cma_region_t *m = malloc(sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->addr = r->addr;
    m->len = r->len;
    *md_p = m;
    return PDX_OK;
}

static void cma_mem_deregister(void *bev, void *md) { free(md); }

static pdx_status_t cma_mem_pack(void *bev, void *mdv, void **buf_p,
                                 size_t *len_p)
{
    const cma_region_t *m = mdv;
    uint8_t *b = malloc(16);
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    put_le(b, m->addr, 8);
    put_le(b + 8, m->len, 8);
    *buf_p = b;
    *len_p = 16;
    return PDX_OK;
}

static pdx_status_t cma_peer_connect(void *bev, const char *name,
                                     const void *conn, size_t len,
                                     void **peer_p)
{
    cma_be_t *be = bev;
    const uint8_t *c = conn;
    if (len < 12 || get_le(c, 4) != CMA_MAGIC ||
        get_le(c + 4, 2) != CMA_VERSION || 12 + get_le(c + 6, 2) != len) {
        pdx_error("cma: peer %s: malformed connection info (%zu bytes)",
                  name, len);
        return PDX_ERR_CORRUPT;
    }
    size_t hl = (size_t)get_le(c + 6, 2);
    if (hl != strlen(be->host_id) || memcmp(c + 12, be->host_id, hl) != 0) {
        return PDX_ERR_UNSUPPORTED; /* another host: UCX carries it */
    }
    cma_peer_t *p = malloc(sizeof(*p));
    if (p == NULL) {
        return PDX_ERR_NOMEM;
    }
    p->pid = (pid_t)get_le(c + 8, 4);
    *peer_p = p;
    return PDX_OK;
}

static void cma_peer_disconnect(void *bev, void *peer) { free(peer); }

static pdx_status_t cma_rmem_load(void *bev, void *peer,
                                  const pdx_region_t *r, const void *key,
                                  size_t len, void **rmd_p)
{
    if (r->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    const uint8_t *k = key;
    if (len != 16 || get_le(k, 8) != r->addr || get_le(k + 8, 8) != r->len) {
        pdx_error("cma: region key does not match region 0x%llx+%llu",
                  (unsigned long long)r->addr, (unsigned long long)r->len);
        return PDX_ERR_CORRUPT;
    }
    cma_region_t *m = malloc(sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->addr = r->addr;
    m->len = r->len;
    *rmd_p = m;
    return PDX_OK;
}

static void cma_rmem_unload(void *bev, void *rmd) { free(rmd); }

static pdx_status_t cma_xfer_post(void *bev, void *peerv, pdx_xfer_op_t op,
                                  const pdx_backend_iov_t *iov, size_t n,
                                  const void *notif, size_t notif_len,
                                  void **req_p)
{
    cma_be_t *be = bev;
    cma_peer_t *peer = peerv;
    if (n == 0) {
        return PDX_OK;
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

static pdx_status_t cma_xfer_check(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    if (!atomic_load(&r->state)) {
        return PDX_INPROGRESS;
    }
    return r->status;
}

static pdx_status_t cma_xfer_abort(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    atomic_store(&r->abort, 1);
    return PDX_OK;
}

/* Waits for the system call in progress (a bounded kernel copy that needs
 * nothing from the peer), so nothing lands after release returns. */
static void cma_xfer_release(void *bev, void *reqv)
{
    cma_be_t *be = bev;
    cma_req_t *r = reqv;
    atomic_store(&r->abort, 1);
    pthread_mutex_lock(&be->lock);
    while (!atomic_load(&r->state)) {
        pthread_cond_wait(&be->cv, &be->lock);
    }
    iov_recycle(be, r->iov, r->cap);
    pthread_mutex_unlock(&be->lock);
    free(r);
}

static pdx_status_t cma_notif_send(void *bev, void *peer, const void *msg,
                                   size_t len)
{
    return PDX_ERR_UNSUPPORTED;
}

static int cma_progress(void *bev) { return 0; }
static int cma_event_fd(void *bev) { return -1; }
static pdx_status_t cma_arm(void *bev) { return PDX_ERR_UNSUPPORTED; }

static void cma_describe(void *bev, char *buf, size_t len)
{
    cma_be_t *be = bev;
    snprintf(buf, len, "process_vm_readv/writev, same host, %llu bytes moved",
             (unsigned long long)be->bytes);
}

__attribute__((visibility("default"))) const pdx_backend_ops_t
    pdx_backend_v1 = {
        .abi_version = PDX_BACKEND_ABI_VERSION,
        .size = sizeof(pdx_backend_ops_t),
        .name = "cma",
        .caps = PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_READ |
                PDX_BACKEND_CAP_WRITE | PDX_BACKEND_CAP_SAME_HOST,
        .query = cma_query,
        .create = cma_create,
        .destroy = cma_destroy,
        .conn_info = cma_conn_info,
        .mem_register = cma_mem_register,
        .mem_deregister = cma_mem_deregister,
        .mem_pack = cma_mem_pack,
        .peer_connect = cma_peer_connect,
        .peer_disconnect = cma_peer_disconnect,
        .rmem_load = cma_rmem_load,
        .rmem_unload = cma_rmem_unload,
        .xfer_post = cma_xfer_post,
        .xfer_check = cma_xfer_check,
        .xfer_release = cma_xfer_release,
        .notif_send = cma_notif_send,
        .progress = cma_progress,
        .event_fd = cma_event_fd,
        .arm = cma_arm,
        .describe = cma_describe,
        .xfer_abort = cma_xfer_abort,
};
