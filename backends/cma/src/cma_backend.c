/* cma backend: same-host DRAM transfers with one kernel copy
 * (process_vm_readv/writev, "cross-memory attach"), for peers on this host.
 *
 * Why: Debian's UCX 1.13 emulates RMA over shared memory for memory the
 * caller allocated (two copies through shm queues, the target's progress
 * thread doing one). Here the initiator's kernel copies straight between
 * the two address spaces; the target does nothing and may even be stopped.
 * A small request (`pvm_inline_max`, default 256 KiB) is copied inside
 * post, many pieces per system call; a larger one is split into chunks
 * whose two lanes one worker thread per instance and the thread in
 * xfer_check share, so post never blocks for long. The agent sends the
 * request's notification (this backend carries none).
 *
 * Shared memory (pdx_mem_alloc / pdx_mem_share): a region registered with
 * PDX_REGION_F_SHARED has its fd number, inode and file offset in its key.
 * The peer takes a copy of the fd (pidfd_getfd, else /proc/<pid>/fd/<n>),
 * checks the inode and maps the range: a transfer to or from it is then a
 * memcpy by the initiator: inline in post up to `inline_max` bytes (an
 * option, default 1 MiB), above that in 1 MiB chunks of two lanes that the
 * worker and the thread in xfer_check share (see help_mapped). If the
 * mapping cannot be made the region falls back to process_vm_readv/writev
 * (logged at info), where this process may read the peer's memory; where
 * it may not, cma declines the region and the agent takes another backend
 * for it (cma_peer.c, cma_pvm_allowed). Every copy of the mapped path is
 * cma_copy (cma_copy.h):
 * memcpy, except for pieces not 64-byte aligned to each other, where
 * glibc's memcpy is ~10x slow on AMD EPYC.
 *
 * Once a peer's shared region is mapped, the worker fills this process's
 * page tables for it ahead of the first copies, a step at a time when it
 * has no copy to do (cma_work.c, "page tables ... filled ahead"); option
 * `populate` (1, the default, or 0).
 *
 * This file: the instance (options, create, destroy, conn info) and the
 * ops with nothing to do (notifications, progress, event fd). */
#include "cma_int.h"

/* Does process_vm_readv work in this process at all (a seccomp filter,
 * as container runtimes install without CAP_SYS_PTRACE, refuses it, and
 * a kernel without CONFIG_CROSS_MEMORY_ATTACH lacks it)? */
static bool pvm_self(char *why, size_t len)
{
    char src[8] = "pdx-cma", dst[8] = {0};
    struct iovec l = {dst, sizeof(dst)}, r = {src, sizeof(src)};
    if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)sizeof(dst) ||
        memcmp(src, dst, sizeof(dst)) != 0) {
        snprintf(why, len, "process_vm_readv/writev are refused in this "
                 "process (%s)", strerror(errno));
        return false;
    }
    return true;
}

/* Always available: copying into and out of a peer's shared memory needs
 * only its fd and mmap. Where process_vm_readv/writev are refused (here,
 * or for a peer), cma declines the regions it cannot map, and the agent
 * carries them by another backend (cma_pvm_allowed). */
pdx_status_t cma_query(char *why, size_t len)
{
    (void)why;
    (void)len;
    return PDX_OK;
}

pdx_status_t cma_create(const pdx_backend_host_t *host,
                        const pdx_option_t *opts, size_t nopts,
                        void **be_p)
{
    uint64_t inline_max = CMA_INLINE_MAX_DEFAULT;
    uint64_t pvm_inline_max = CMA_PVM_INLINE_MAX_DEFAULT;
    uint64_t populate = 1;
    for (size_t i = 0; i < nopts; i++) {
        const char *k = opts[i].key ? opts[i].key : "(null)";
        const char *v = opts[i].value ? opts[i].value : "";
        bool flag = strcmp(k, "populate") == 0;
        uint64_t *dst = strcmp(k, "inline_max") == 0       ? &inline_max
                        : strcmp(k, "pvm_inline_max") == 0 ? &pvm_inline_max
                        : flag                             ? &populate
                                                           : NULL;
        if (dst != NULL &&
            pdx_opt_uint(v, 0, flag ? 1 : UINT64_MAX, dst) == 0) {
            continue;
        }
        if (dst != NULL) {
            pdx_error("cma: option %s='%s' is not %s", k, v,
                      flag ? "0 or 1" : "a byte count");
        } else {
            pdx_error("cma: unknown option '%s' (this backend takes "
                      "inline_max, pvm_inline_max and populate)", k);
        }
        return PDX_ERR_CONFIG;
    }
    cma_be_t *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return PDX_ERR_NOMEM;
    }
    if (!pvm_self(be->pvm_why, sizeof(be->pvm_why))) {
        be->pvm_refused = true;
        pdx_info("cma: %s: peers' shared memory only (memcpy); their "
                 "other host memory goes by other backends", be->pvm_why);
    }
    snprintf(be->host_id, sizeof(be->host_id), "%s",
             host->host_id ? host->host_id : "");
    be->inline_max = inline_max;
    be->rev_fd = -1;
    be->pvm_inline_max = pvm_inline_max;
    be->populate = populate != 0;
    pthread_mutex_init(&be->lock, NULL);
    pthread_cond_init(&be->cv, NULL);
    pthread_cond_init(&be->warm_cv, NULL);
    if (pthread_create(&be->worker, NULL, cma_worker_main, be) != 0) {
        pthread_cond_destroy(&be->warm_cv);
        pthread_cond_destroy(&be->cv);
        pthread_mutex_destroy(&be->lock);
        free(be);
        return PDX_ERR_IO;
    }
    (void)pthread_setname_np(be->worker, "pdx-cma");
    *be_p = be;
    return PDX_OK;
}

void cma_destroy(void *bev)
{
    cma_be_t *be = bev;
    pthread_mutex_lock(&be->lock);
    be->stop = true;
    pthread_cond_broadcast(&be->cv);
    pthread_mutex_unlock(&be->lock);
    pthread_join(be->worker, NULL);
    pthread_cond_destroy(&be->warm_cv);
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->lock);
    free(be->spare);
    cma_rev_fini(be);
    free(be);
}

pdx_status_t cma_conn_info(void *bev, void **buf_p, size_t *len_p)
{
    cma_be_t *be = bev;
    size_t hl = strlen(be->host_id);
    uint8_t *b = malloc(12 + hl);
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    cma_put_le(b, CMA_MAGIC, 4);
    cma_put_le(b + 4, CMA_VERSION, 2);
    cma_put_le(b + 6, (uint64_t)hl, 2);
    cma_put_le(b + 8, (uint32_t)getpid(), 4);
    memcpy(b + 12, be->host_id, hl);
    *buf_p = b;
    *len_p = 12 + hl;
    return PDX_OK;
}

pdx_status_t cma_notif_send(void *bev, void *peer, const void *msg,
                            size_t len)
{
    return PDX_ERR_UNSUPPORTED;
}

int cma_progress(void *bev) { return 0; }
int cma_event_fd(void *bev) { return -1; }
pdx_status_t cma_arm(void *bev) { return PDX_ERR_UNSUPPORTED; }

void cma_describe(void *bev, char *buf, size_t len)
{
    cma_be_t *be = bev;
    unsigned waiting = 0;
    pthread_mutex_lock(&be->lock);
    for (const cma_region_t *m = be->warm_head; m != NULL; m = m->warm_next) {
        waiting++;
    }
    bool on = be->populate, unsupported = be->warm_unsupported;
    pthread_mutex_unlock(&be->lock);
    char w[48];
    snprintf(w, sizeof(w), "%u regions waiting", waiting);
    snprintf(buf, len,
             "same host: %llu bytes by memcpy into/out of peers' shared "
             "memory, %llu by process_vm_readv/writev; %llu bytes of "
             "peers' mapped memory populated ahead (%s)%s",
             (unsigned long long)(atomic_load(&be->bytes_mapped) +
                                  be->bytes_inline),
             (unsigned long long)atomic_load(&be->bytes),
             (unsigned long long)atomic_load(&be->bytes_warmed),
             on ? w : unsupported ? "unsupported by this kernel" : "off",
             be->pvm_refused ? "; process_vm_readv/writev refused here: "
                               "peers' shared memory only"
                             : "");
}
