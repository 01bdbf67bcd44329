/* cma: private to the backend's files: limits, the instance, requests,
 * peers and regions, and the functions the files share. Calls point down:
 * cma_ops (the table) above cma_backend (instance), cma_peer and cma_xfer,
 * above cma_work (the copy engine and its worker), above cma_wire. */
#ifndef PDX_CMA_INT_H
#define PDX_CMA_INT_H

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

#include "cma_copy_int.h"
#include "pdx_clock.h"
#include "pdx_opts.h"

#define CMA_MAGIC 0x414d4350u /* "PCMA" */
#define CMA_VERSION 1u
#define CMA_HOST_MAX 128
#define CMA_IOV_BATCH 1024 /* iovecs per system call (IOV_MAX) */
#define CMA_KEY_PLAIN 16   /* addr, len */
#define CMA_KEY_SHARED 36  /* + fd (4), inode (8), file offset (8) */
/* Either, then the region's revocation word (cma_rev.c): the table's fd
 * (4) and inode (8), the slot (4), the token (8). */
#define CMA_KEY_REV 24
/* The revocation table: one word per registered region, in a memfd its
 * peers map read-only. */
#define CMA_REV_SLOTS 65536u
#define CMA_INLINE_MAX_DEFAULT (1u << 20)
/* process_vm requests up to this many bytes are copied inside post. */
#define CMA_PVM_INLINE_MAX_DEFAULT (256u << 10)
#define CMA_PVM_BATCH 256 /* iovecs on the stack per system call */
#define CMA_COPY_CHUNK (1u << 20) /* unit of work; abort seen between */
/* A mapped peer region's page tables are filled ahead (cma_warm_step) in
 * steps of this many bytes, by the worker when it has no copy to do. */
#define CMA_WARM_STEP (16u << 20)

typedef struct cma_chunk {
    size_t piece, npieces; /* whole pieces [piece, +npieces) if len == 0 */
    uint64_t off, len;     /* else a slice of one piece */
} cma_chunk_t;

typedef struct cma_req {
    struct cma_req *next; /* in the worker's queue */
    pid_t pid;
    pdx_xfer_op_t op;
    pdx_backend_iov_t *iov;
    size_t n, cap;
    /* Every remote_md is mapped: memcpy, no system call; else every piece
     * goes by process_vm_readv/writev (iovec batches). Either way in
     * chunks of two lanes that the worker and xfer_check callers claim
     * (the caller spinning on check copies instead of competing with the
     * worker for the CPU). */
    bool mapped;
    cma_chunk_t *chunks;
    size_t nchunks;
    _Atomic size_t next_chunk[2], chunks_done; /* per lane; both lanes */
    _Atomic int abort;
    _Atomic int canceled;
    _Atomic int err; /* the first process_vm error (pdx_status_t), or 0 */
    /* Under the instance's lock: in the worker's queue, being worked by
     * the worker, released by the caller while the worker still had it
     * (the worker frees it then). */
    bool queued, in_worker, released;
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
    uint64_t pvm_inline_max; /* process_vm requests up to this, too */
    /* The largest iov array of a finished request, reused by the next post:
     * a fresh multi-MiB malloc page-faults on first touch, which cost more
     * than the copy for 100k-piece requests. Under `lock`. */
    pdx_backend_iov_t *spare;
    size_t spare_cap;
    /* The revocation table (cma_rev.c): made at the first registration;
     * rev_fd -1 when it could not be (regions then go unchecked). */
    int rev_fd;
    uint64_t rev_ino;
    _Atomic uint64_t *rev;
    uint32_t rev_next;            /* slots never used start here */
    uint32_t *rev_free, nrev_free; /* slots given back */
    /* Peers' mapped regions whose page tables the worker fills ahead
     * (option `populate`, default on), oldest first; `warming` is the one
     * it is in now, without the lock (an unload waits for that step).
     * Under `lock`. */
    bool populate, warm_unsupported;
    struct cma_region *warm_head, *warm_tail, *warming;
    pthread_cond_t warm_cv; /* a step ended (unloads wait on it) */
    _Atomic uint64_t bytes_warmed;
    unsigned char warm_vec[CMA_WARM_STEP / 4096]; /* mincore's, worker's */
    /* process_vm_readv/writev refused in this process (at create): every
     * peer is as one that refuses them (cma_pvm_allowed). */
    bool pvm_refused;
    char pvm_why[96];
} cma_be_t;

typedef struct cma_peer {
    pid_t pid;
    int pidfd; /* -1 until a shared region is loaded (or if refused) */
    /* Its revocation table, mapped read-only at the first key naming it
     * (NULL: none yet, or it could not be: rev_failed). */
    const _Atomic uint64_t *rev;
    uint64_t rev_ino;
    bool rev_failed;
    /* May this process read its memory with process_vm_readv/writev? 0
     * not asked yet, 1 yes, -1 refused (pvm_why says how): asked once, at
     * the first key of a region that is not mapped (cma_pvm_allowed). */
    int pvm;
    char pvm_why[200];
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
    /* Local: its slot in the revocation table and the token there
     * (token 0: none). Remote: the word in the peer's table to find that
     * token in (NULL: unchecked) and the token. */
    uint32_t rev_slot;
    uint64_t rev_token;
    const _Atomic uint64_t *rev_word;
    /* Remote, mapped: in the instance's warm queue, and how far the
     * worker got (under the instance's lock). */
    struct cma_region *warm_next;
    bool warm_queued;
    size_t warm_off;
} cma_region_t;

/* ---- functions shared between the files ---- */

/* cma_rev.c: the revocation words. A region registered here gets a slot
 * and a random token in this instance's table; its key names them; a
 * peer that maps the table finds the token there while the region is
 * registered, and 0 (or another) once it is not: every copy with the
 * region is checked against it, so a peer never gets OK for bytes of a
 * region this agent gave up, even one that never loaded this agent and
 * so heard no removal notice (a READ is checked after its copy, a WRITE
 * before and after). */
void cma_rev_register(cma_be_t *be, cma_region_t *m);
void cma_rev_deregister(cma_be_t *be, cma_region_t *m);
/* The key's revocation part (CMA_KEY_REV bytes at `k`) for region `m`. */
void cma_rev_pack(const cma_be_t *be, const cma_region_t *m, uint8_t *k);
/* A peer's: map its table (once) and point m->rev_word at the slot.
 * Never fails the load: an unmappable table leaves the region unchecked
 * (logged once per peer). */
void cma_rev_load(cma_peer_t *p, cma_region_t *m, const uint8_t *k);
void cma_rev_peer_gone(cma_peer_t *p);
/* Are the remote regions of every piece still registered at the peer? */
bool cma_rev_ok(const pdx_backend_iov_t *iov, size_t n);
void cma_rev_fini(cma_be_t *be);
/* cma_fd.c: a copy of the peer's fd `fd` (pidfd_getfd, else
 * /proc/<pid>/fd/<fd>), or -1 with `why` set. */
int cma_peer_fd(cma_peer_t *p, int fd, char *why, size_t why_len);
/* Whether process_vm_readv/writev may reach peer `p`, by reading one
 * byte at `addr` (the start of a region it published) the first time. */
bool cma_pvm_allowed(cma_be_t *be, cma_peer_t *p, uint64_t addr);

void cma_iov_recycle(cma_be_t *be, pdx_backend_iov_t *iov, size_t cap);
void cma_put_le(uint8_t *p, uint64_t v, unsigned n);
uint64_t cma_get_le(const uint8_t *p, unsigned n);
pdx_status_t cma_errno_status(int e);
pdx_status_t cma_copy_mapped(cma_be_t *be, const pdx_backend_iov_t *iov,
                             size_t n, pdx_xfer_op_t op, uint64_t total);
pdx_status_t cma_copy_pvm(cma_be_t *be, pid_t pid, pdx_xfer_op_t op,
                          const pdx_backend_iov_t *iov, size_t n);
pdx_status_t cma_plan_chunks(cma_req_t *r);
bool cma_help(cma_be_t *be, cma_req_t *r, int lane, size_t max);
bool cma_req_done(cma_req_t *r);
void cma_req_free(cma_be_t *be, cma_req_t *r);
void *cma_worker_main(void *arg);
/* A peer's region just mapped (m->map): queued for the worker to fill its
 * page tables ahead. Its unload: out of the queue, after the worker's
 * step in it (if any) ended. */
void cma_warm_add(cma_be_t *be, cma_region_t *m);
void cma_warm_remove(cma_be_t *be, cma_region_t *m);
pdx_status_t cma_query(char *why, size_t len);
pdx_status_t cma_create(const pdx_backend_host_t *host,
                        const pdx_option_t *opts, size_t nopts,
                        void **be_p);
void cma_destroy(void *bev);
pdx_status_t cma_conn_info(void *bev, void **buf_p, size_t *len_p);
pdx_status_t cma_mem_register(void *bev, const pdx_region_t *r,
                              void **md_p);
void cma_mem_deregister(void *bev, void *md);
pdx_status_t cma_mem_pack(void *bev, void *mdv, void **buf_p,
                          size_t *len_p);
pdx_status_t cma_peer_connect(void *bev, const char *name,
                              const void *conn, size_t len,
                              void **peer_p);
void cma_peer_disconnect(void *bev, void *peerv);
pdx_status_t cma_rmem_load(void *bev, void *peer,
                           const pdx_region_t *r, const void *key,
                           size_t len, void **rmd_p);
void cma_rmem_unload(void *bev, void *rmdv);
pdx_status_t cma_xfer_post(void *bev, void *peerv, pdx_xfer_op_t op,
                           const pdx_backend_iov_t *iov, size_t n,
                           const void *notif, size_t notif_len,
                           void **req_p);
pdx_status_t cma_xfer_check(void *bev, void *reqv);
pdx_status_t cma_xfer_abort(void *bev, void *reqv);
void cma_xfer_release(void *bev, void *reqv);
pdx_status_t cma_path(void *bev, void *peer, void *rmdv,
                      char *transport, size_t tlen, char *why,
                      size_t wlen);
pdx_status_t cma_notif_send(void *bev, void *peer, const void *msg,
                            size_t len);
int cma_progress(void *bev);
int cma_event_fd(void *bev);
pdx_status_t cma_arm(void *bev);
void cma_describe(void *bev, char *buf, size_t len);

#endif
