/* cma backend: same-host DRAM transfers with one kernel copy
 * (process_vm_readv/writev, "cross-memory attach"), for peers on this host.
 *
 * Why: Debian's UCX 1.13 emulates RMA over shared memory for memory the
 * caller allocated (two copies through shm queues, the target's progress
 * thread doing one). Here the initiator's kernel copies straight between
 * the two address spaces; the target does nothing and may even be stopped.
 * Copies run on one worker thread per instance, so post never blocks; the
 * agent sends the request's notification (this backend carries none).
 *
 * Shared memory (pdx_mem_alloc / pdx_mem_share): a region registered with
 * PDX_REGION_F_SHARED has its fd number, inode and file offset in its key.
 * The peer takes a copy of the fd (pidfd_getfd, else /proc/<pid>/fd/<n>),
 * checks the inode and maps the range: a transfer to or from it is then a
 * memcpy by the initiator: inline in post up to `inline_max` bytes (an
 * option, default 1 MiB), above that in 1 MiB chunks of two lanes that the
 * worker and the thread in xfer_check share (see help_mapped). If the
 * mapping cannot be made the region falls back to process_vm_readv/writev
 * (logged at info). Every copy of the mapped path is cma_copy (cma_copy.h):
 * memcpy, except for pieces not 64-byte aligned to each other, where
 * glibc's memcpy is ~10x slow on AMD EPYC. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <pdx/backend.h>

#include "cma_copy.h"

#define CMA_MAGIC 0x414d4350u /* "PCMA" */
#define CMA_VERSION 1u
#define CMA_HOST_MAX 128
#define CMA_IOV_BATCH 1024 /* iovecs per system call (IOV_MAX) */
#define CMA_KEY_PLAIN 16   /* addr, len */
#define CMA_KEY_SHARED 36  /* + fd (4), inode (8), file offset (8) */
#define CMA_INLINE_MAX_DEFAULT (1u << 20)
#define CMA_COPY_CHUNK (1u << 20) /* unit of work; abort seen between */

typedef struct cma_chunk {
    size_t piece, npieces; /* whole pieces [piece, +npieces) if len == 0 */
    uint64_t off, len;     /* else a slice of one piece */
} cma_chunk_t;

typedef struct cma_req {
    struct cma_req *next;
    pid_t pid;
    pdx_xfer_op_t op;
    pdx_backend_iov_t *iov;
    size_t n, cap;
    _Atomic int state; /* 0 queued/running, 1 done */
    _Atomic int abort;
    pdx_status_t status;
    /* Every remote_md is mapped: memcpy, no system call, in chunks that
     * the worker and xfer_check callers claim (the caller spinning on
     * check copies instead of competing with the worker for the CPU). */
    bool mapped;
    cma_chunk_t *chunks;
    size_t nchunks;
    _Atomic size_t next_chunk[2], chunks_done; /* per lane; both lanes */
    _Atomic int canceled;
} cma_req_t;

typedef struct cma_be {
    char host_id[CMA_HOST_MAX];
    pthread_mutex_t lock;
    pthread_cond_t cv;
    cma_req_t *head, *tail;
    bool stop;
    pthread_t worker;
    _Atomic uint64_t bytes, bytes_mapped;
    /* Copied inline by post: ops run one at a time (the agent's lock), so
     * a plain counter, cheaper than a locked add on every small request. */
    uint64_t bytes_inline;
    uint64_t inline_max; /* mapped requests up to this are copied in post */
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
    int pidfd; /* -1 until a shared region is loaded (or if refused) */
} cma_peer_t;

typedef struct cma_region {
    uint64_t addr, len;
    /* Local, shared: the fd and its file offset, packed into the key. */
    int shm_fd;
    uint64_t shm_offset;
    /* Remote, mapped: `base` is `addr` in this process (NULL: use
     * process_vm_*); `map`/`map_len` what to munmap. */
    uint8_t *base;
    void *map;
    size_t map_len;
    /* Remote, not mapped: why (for the agent's path report). */
    char why[160];
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

/* A small mapped request, copied inline by post. */
static void copy_mapped(cma_be_t *be, const pdx_backend_iov_t *iov, size_t n,
                        pdx_xfer_op_t op, uint64_t total)
{
    for (size_t i = 0; i < n; i++) {
        copy_piece(&iov[i], op, 0, iov[i].len);
    }
    be->bytes_inline += total;
}

/* Split a mapped request into chunks of about CMA_COPY_CHUNK bytes: runs
 * of whole small pieces, or slices of a large one. */
static pdx_status_t plan_chunks(cma_req_t *r)
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
static bool help_mapped(cma_be_t *be, cma_req_t *r, int lane, size_t max)
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

static bool mapped_done(cma_req_t *r)
{
    return atomic_load_explicit(&r->chunks_done, memory_order_acquire) ==
           2 * r->nchunks;
}

static pdx_status_t run_req(cma_be_t *be, cma_req_t *r)
{
    if (r->mapped) {
        help_mapped(be, r, 1, SIZE_MAX);
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
            return errno_status(e);
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
    uint64_t inline_max = CMA_INLINE_MAX_DEFAULT;
    for (size_t i = 0; i < nopts; i++) {
        const char *k = opts[i].key ? opts[i].key : "(null)";
        const char *v = opts[i].value ? opts[i].value : "";
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (strcmp(k, "inline_max") == 0 && *v != '\0' && *v != '-' &&
            *end == '\0' && errno == 0) {
            inline_max = x;
            continue;
        }
        if (strcmp(k, "inline_max") == 0) {
            pdx_error("cma: option inline_max='%s' is not a byte count", v);
        } else {
            pdx_error("cma: unknown option '%s' (this backend takes "
                      "inline_max)", k);
        }
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
    be->inline_max = inline_max;
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
    cma_region_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->addr = r->addr;
    m->len = r->len;
    m->shm_fd = (r->flags & PDX_REGION_F_SHARED) ? r->shm_fd : -1;
    m->shm_offset = r->shm_offset;
    *md_p = m;
    return PDX_OK;
}

static void cma_mem_deregister(void *bev, void *md) { free(md); }

static pdx_status_t cma_mem_pack(void *bev, void *mdv, void **buf_p,
                                 size_t *len_p)
{
    const cma_region_t *m = mdv;
    struct stat sb;
    bool shared = m->shm_fd >= 0 && fstat(m->shm_fd, &sb) == 0;
    size_t n = shared ? CMA_KEY_SHARED : CMA_KEY_PLAIN;
    uint8_t *b = malloc(n);
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    put_le(b, m->addr, 8);
    put_le(b + 8, m->len, 8);
    if (shared) {
        put_le(b + 16, (uint32_t)m->shm_fd, 4);
        put_le(b + 20, (uint64_t)sb.st_ino, 8);
        put_le(b + 28, m->shm_offset, 8);
    }
    *buf_p = b;
    *len_p = n;
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
    uint64_t pid = get_le(c + 8, 4);
    if (pid == 0 || pid > INT32_MAX) {
        /* process_vm_* and pidfd_open would name no process or a group */
        pdx_error("cma: peer %s: malformed connection info: pid %llu",
                  name, (unsigned long long)pid);
        return PDX_ERR_CORRUPT;
    }
    cma_peer_t *p = malloc(sizeof(*p));
    if (p == NULL) {
        return PDX_ERR_NOMEM;
    }
    p->pid = (pid_t)pid;
    p->pidfd = -1;
    *peer_p = p;
    return PDX_OK;
}

static void cma_peer_disconnect(void *bev, void *peerv)
{
    cma_peer_t *p = peerv;
    if (p->pidfd >= 0) {
        close(p->pidfd);
    }
    free(p);
}

/* A copy of the peer's fd `fd`: pidfd_getfd, else /proc/<pid>/fd/<fd>
 * (where a seccomp filter refuses the former). -1 with `why` set. */
static int peer_fd(cma_peer_t *p, int fd, char *why, size_t why_len)
{
    if (p->pidfd < 0) {
        p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    }
    if (p->pidfd >= 0) {
        int got = (int)syscall(SYS_pidfd_getfd, p->pidfd, fd, 0);
        if (got >= 0) {
            return got;
        }
    }
    int e = errno;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)p->pid, fd);
    int got = open(path, O_RDWR | O_CLOEXEC);
    if (got < 0) {
        snprintf(why, why_len, "pidfd_getfd: %s; open %s: %s", strerror(e),
                 path, strerror(errno));
    }
    return got;
}

/* Map a peer's shared region into this process; false (with `why`) if
 * anything does not hold, and the region goes through process_vm_*. */
static bool map_shared(cma_peer_t *p, cma_region_t *m, const uint8_t *k,
                       char *why, size_t why_len)
{
    int rfd = (int)get_le(k + 16, 4);
    uint64_t ino = get_le(k + 20, 8), off = get_le(k + 28, 8);
    long pg = sysconf(_SC_PAGESIZE);
    if ((off & (uint64_t)(pg - 1)) != (m->addr & (uint64_t)(pg - 1)) ||
        off + m->len < off || m->len > SIZE_MAX - (size_t)pg) {
        snprintf(why, why_len, "file offset %llu does not fit the region",
                 (unsigned long long)off);
        return false;
    }
    int fd = peer_fd(p, rfd, why, why_len);
    if (fd < 0) {
        return false;
    }
    struct stat sb;
    bool ok = false;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_ino != ino ||
        !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < off + m->len) {
        snprintf(why, why_len, "fd %d of pid %d is not the file the key "
                 "names (inode %llu, %llu bytes)", rfd, (int)p->pid,
                 (unsigned long long)ino,
                 (unsigned long long)(off + m->len));
    } else {
        uint64_t lead = off & (uint64_t)(pg - 1);
        size_t maplen = (size_t)(lead + m->len);
        void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, (off_t)(off - lead));
        if (map == MAP_FAILED) {
            snprintf(why, why_len, "mmap: %s", strerror(errno));
        } else {
            m->map = map;
            m->map_len = maplen;
            m->base = (uint8_t *)map + lead;
            ok = true;
        }
    }
    close(fd);
    return ok;
}

static pdx_status_t cma_rmem_load(void *bev, void *peer,
                                  const pdx_region_t *r, const void *key,
                                  size_t len, void **rmd_p)
{
    if (r->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    const uint8_t *k = key;
    if ((len != CMA_KEY_PLAIN && len != CMA_KEY_SHARED) ||
        get_le(k, 8) != r->addr || get_le(k + 8, 8) != r->len) {
        pdx_error("cma: region 0x%llx+%llu: malformed key (%zu bytes; "
                  "length, address or size field does not match the region)",
                  (unsigned long long)r->addr, (unsigned long long)r->len,
                  len);
        return PDX_ERR_CORRUPT;
    }
    cma_region_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->addr = r->addr;
    m->len = r->len;
    m->shm_fd = -1;
    char why[256] = "";
    if (len == CMA_KEY_SHARED && !map_shared(peer, m, k, why, sizeof(why))) {
        /* The agent warns once per peer with this reason (path report). */
        pdx_info("cma: shared region 0x%llx+%llu of pid %d not mapped (%s): "
                 "process_vm_readv/writev instead",
                 (unsigned long long)r->addr, (unsigned long long)r->len,
                 (int)((cma_peer_t *)peer)->pid, why);
        snprintf(m->why, sizeof(m->why), "shared memory of pid %d not "
                 "mappable here (%s): process_vm_readv/writev",
                 (int)((cma_peer_t *)peer)->pid, why);
    } else if (len == CMA_KEY_PLAIN) {
        snprintf(m->why, sizeof(m->why), "not shared memory on the peer "
                 "(not from pdx_mem_alloc or pdx_mem_share): "
                 "process_vm_readv/writev");
    }
    *rmd_p = m;
    return PDX_OK;
}

static void cma_rmem_unload(void *bev, void *rmdv)
{
    cma_region_t *m = rmdv;
    if (m->map != NULL) {
        munmap(m->map, m->map_len);
    }
    free(m);
}

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
    bool mapped = true;
    uint64_t total = 0;
    for (size_t i = 0; i < n && mapped; i++) {
        mapped = ((const cma_region_t *)iov[i].remote_md)->base != NULL;
        total += iov[i].len;
    }
    if (mapped && total <= be->inline_max) {
        copy_mapped(be, iov, n, op, total);
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
    r->mapped = mapped;
    if (mapped && plan_chunks(r) != PDX_OK) {
        pthread_mutex_lock(&be->lock);
        iov_recycle(be, r->iov, r->cap);
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

static pdx_status_t cma_xfer_check(void *bev, void *reqv)
{
    cma_req_t *r = reqv;
    if (r->mapped) {
        /* Copy a chunk here rather than spin while the worker copies. */
        if (!mapped_done(r)) {
            help_mapped(bev, r, 0, 1);
        }
        if (!mapped_done(r)) {
            return PDX_INPROGRESS;
        }
        return atomic_load(&r->canceled) ? PDX_ERR_CANCELED : PDX_OK;
    }
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

/* Waits until the worker is done with the request: a system call in
 * progress (a bounded kernel copy that needs nothing from the peer), or,
 * for a mapped request, the chunk being copied (the rest are skipped once
 * the abort flag is set). Chunks claimed in xfer_check ran under the
 * agent's lock, as this does. Nothing lands after release returns. */
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
    free(r->chunks);
    free(r);
}

static pdx_status_t cma_path(void *bev, void *peer, void *rmdv,
                             char *transport, size_t tlen, char *why,
                             size_t wlen)
{
    const cma_region_t *m = rmdv;
    if (m == NULL) {
        snprintf(transport, tlen, "memcpy|process_vm");
        return PDX_OK;
    }
    if (m->base != NULL) {
        snprintf(transport, tlen, "memcpy");
        return PDX_OK;
    }
    snprintf(transport, tlen, "process_vm");
    snprintf(why, wlen, "%s", m->why);
    return PDX_ERR_UNAVAILABLE;
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
    snprintf(buf, len,
             "same host: %llu bytes by memcpy into/out of peers' shared "
             "memory, %llu by process_vm_readv/writev",
             (unsigned long long)(atomic_load(&be->bytes_mapped) +
                                  be->bytes_inline),
             (unsigned long long)atomic_load(&be->bytes));
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
        .path = cma_path,
};
