/* Offload pool: its creation (parameters, the slab, the index, the save
 * worker), teardown, and introspection (keys, slab, stats). The paths a
 * step takes (query, lease, save) are in kv_offload.c. */
#include <pdx/kv_offload.h>
#include <pdx/log.h>
#include <pdx/mem.h> /* pdx_mem_alloc: the slab */

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kv_call_int.h"
#include "kv_offload_int.h"

/* ---- create / destroy -------------------------------------------------- */

static void *map_anon(size_t len, bool populate)
{
    int fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *p;

    if (populate) {
        fl |= MAP_POPULATE;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, fl, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static pdx_status_t check_params(const pdx_offload_params_t *params,
                                 uint64_t *slot_bytes_p, uint32_t *cap_p,
                                 uint32_t *tab_size_p)
{
    uint64_t mask = params->field_mask;
    uint32_t nranks = 1;
    uint64_t per_rank;
    uint64_t slot;
    uint64_t cap;
    uint64_t tab = 2;

    if (!(mask & PDX_OFFLOAD_PARAM_BUDGET_BYTES) ||
        !(mask & PDX_OFFLOAD_PARAM_BLOCK_BYTES)) {
        pdx_error("offload: budget_bytes and block_bytes are required");
        return PDX_ERR_INVALID;
    }
    if (params->block_bytes == 0 || params->block_bytes > MAX_BLOCK_BYTES) {
        pdx_error("offload: block_bytes %llu out of range 1..%llu",
                  (unsigned long long)params->block_bytes,
                  (unsigned long long)MAX_BLOCK_BYTES);
        return PDX_ERR_INVALID;
    }
    if (mask & PDX_OFFLOAD_PARAM_NRANKS_PER_HOST) {
        nranks = params->nranks_per_host;
        if (nranks == 0) {
            pdx_error("offload: nranks_per_host must be at least 1");
            return PDX_ERR_INVALID;
        }
    }
    if ((mask & PDX_OFFLOAD_PARAM_QUEUE_DEPTH) &&
        (params->queue_depth == 0 || params->queue_depth > MAX_QUEUE_DEPTH)) {
        pdx_error("offload: queue_depth %u out of range 1..%u",
                  params->queue_depth, MAX_QUEUE_DEPTH);
        return PDX_ERR_INVALID;
    }
    if ((mask & PDX_OFFLOAD_PARAM_DEMOTE_OWNERS) &&
        (params->demote_owners == 0 ||
         params->demote_owners > MAX_DEMOTE_OWNERS)) {
        pdx_error("offload: demote_owners %u out of range 1..%u",
                  params->demote_owners, MAX_DEMOTE_OWNERS);
        return PDX_ERR_INVALID;
    }
    per_rank = params->budget_bytes / nranks;
    slot = (params->block_bytes + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    if (per_rank < slot) {
        pdx_error("offload: per-rank budget %llu B (budget %llu B / %u "
                  "ranks) holds no block of %llu B (slot %llu B)",
                  (unsigned long long)per_rank,
                  (unsigned long long)params->budget_bytes, nranks,
                  (unsigned long long)params->block_bytes,
                  (unsigned long long)slot);
        return PDX_ERR_CONFIG;
    }
    cap = per_rank / slot;
    if (cap > MAX_BLOCKS) {
        pdx_error("offload: %llu blocks per rank is over the %u limit",
                  (unsigned long long)cap, MAX_BLOCKS);
        return PDX_ERR_TOO_LARGE;
    }
    while (tab < 2 * cap) {
        tab <<= 1;
    }
    *slot_bytes_p = slot;
    *cap_p = (uint32_t)cap;
    *tab_size_p = (uint32_t)tab;
    return PDX_OK;
}

static void unmap_slab(struct pdx_offload_pool *pool)
{
    if (pool->slab_shared) {
        pdx_mem_free(pool->slab_map);
    } else {
        munmap(pool->slab_map, pool->slab_map_len);
    }
}

static pdx_status_t map_slab(struct pdx_offload_pool *pool)
{
    bool huge = pool->flags & PDX_OFFLOAD_FLAG_HUGEPAGE;
    bool populate = pool->flags & PDX_OFFLOAD_FLAG_PREFAULT;
    size_t extra = huge ? HUGE_ALIGN : 0;
    uintptr_t base;

    pool->slab_len = (size_t)pool->capacity * pool->slot_bytes;
    pool->slab_map_len = pool->slab_len + extra;
    /* With huge pages, align the slab to 2 MiB and advise before faulting,
     * so THP can back it; populate afterwards in that case. */
    /* Without huge pages the slab is shared memory (pdx_mem_alloc): a peer
     * on this host loading saved blocks (D-to-P reuse) maps it and copies
     * with memcpy. Huge pages stay anonymous (THP does not back shmem by
     * default). */
    if (!huge && pdx_mem_alloc(pool->slab_map_len,
                               populate ? PDX_MEM_F_POPULATE : 0,
                               &pool->slab_map) == PDX_OK) {
        pool->slab_shared = true;
    } else {
        pool->slab_map = map_anon(pool->slab_map_len, populate && !huge);
    }
    if (pool->slab_map == NULL) {
        pdx_error("offload: cannot map a %zu B slab: %s", pool->slab_map_len,
                  strerror(errno));
        return PDX_ERR_NOMEM;
    }
    base = (uintptr_t)pool->slab_map;
    if (huge) {
        base = (base + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
    }
    pool->slab = (uint8_t *)base;
    if (huge) {
        if (madvise(pool->slab, pool->slab_len, MADV_HUGEPAGE) != 0) {
            pdx_warn("offload: madvise(MADV_HUGEPAGE) failed: %s; using "
                     "small pages",
                     strerror(errno));
        }
        if (populate &&
            madvise(pool->slab, pool->slab_len, MADV_POPULATE_WRITE) != 0) {
            /* Kernels before 5.14: fault it in by hand. */
            for (size_t off = 0; off < pool->slab_len; off += 4096) {
                pool->slab[off] = 0;
            }
        }
    }
    return PDX_OK;
}

static pdx_status_t pool_create(const pdx_offload_params_t *params,
                                pdx_offload_pool_h *pool_p)
{
    struct pdx_offload_pool *pool;
    uint64_t slot_bytes;
    uint32_t cap;
    uint32_t tab_size;
    pthread_condattr_t cattr;
    pdx_status_t st;
    int rc;

    st = check_params(params, &slot_bytes, &cap, &tab_size);
    if (st != PDX_OK) {
        return st;
    }
    pool = pdx_handle_alloc(sizeof(*pool), PDX_MAGIC_POOL);
    if (pool == NULL) {
        pdx_error("offload: out of memory for a pool");
        return PDX_ERR_NOMEM;
    }
    pool->block_bytes = params->block_bytes;
    pool->slot_bytes = slot_bytes;
    pool->capacity = cap;
    pool->flags = (params->field_mask & PDX_OFFLOAD_PARAM_FLAGS)
                      ? params->flags
                      : PDX_OFFLOAD_FLAG_ASYNC_SAVE |
                            PDX_OFFLOAD_FLAG_HUGEPAGE |
                            PDX_OFFLOAD_FLAG_PREFAULT;
    pool->demote_owners = (params->field_mask & PDX_OFFLOAD_PARAM_DEMOTE_OWNERS)
                              ? params->demote_owners
                              : DEFAULT_DEMOTE_OWNERS;
    pool->q_depth = (params->field_mask & PDX_OFFLOAD_PARAM_QUEUE_DEPTH)
                        ? params->queue_depth
                        : DEFAULT_QUEUE_DEPTH;
    if (params->field_mask & PDX_OFFLOAD_PARAM_COPY) {
        pool->copy_cb = params->copy_cb;
        pool->copy_arg = params->copy_arg;
    }
    if (params->field_mask & PDX_OFFLOAD_PARAM_EVICT) {
        pool->evict_cb = params->evict_cb;
        pool->evict_arg = params->evict_arg;
    }
    pool->tab_mask = tab_size - 1;
    pool->free_head = NIL;
    for (int c = 0; c < PDX_OFFLOAD_NUM_CLASSES; c++) {
        pool->lru[c].head = pool->lru[c].tail = NIL;
    }
    atomic_init(&pool->bytes_loaded, 0);

    st = map_slab(pool);
    if (st != PDX_OK) {
        goto err_free_pool;
    }
    st = PDX_ERR_NOMEM;
    pool->meta_len = (size_t)cap * sizeof(slot_meta_t);
    pool->meta = map_anon(pool->meta_len, false);
    if (pool->meta == NULL) {
        pdx_error("offload: cannot map %zu B of slot metadata", pool->meta_len);
        goto err_unmap_slab;
    }
    pool->tab_len = (size_t)tab_size * sizeof(tab_ent_t);
    pool->tab = map_anon(pool->tab_len, false);
    if (pool->tab == NULL) {
        pdx_error("offload: cannot map a %zu B index", pool->tab_len);
        goto err_unmap_meta;
    }
    pool->q = calloc(pool->q_depth, sizeof(*pool->q));
    if (pool->q == NULL) {
        pdx_error("offload: out of memory for a %u-entry save queue",
                  pool->q_depth);
        goto err_unmap_tab;
    }
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        pdx_error("offload: cannot initialise the pool lock");
        goto err_free_q;
    }
    if (pthread_mutex_init(&pool->qlock, NULL) != 0) {
        pdx_error("offload: cannot initialise the queue lock");
        goto err_destroy_lock;
    }
    if (pthread_cond_init(&pool->q_nonempty, NULL) != 0) {
        pdx_error("offload: cannot initialise the queue condition");
        goto err_destroy_qlock;
    }
    if (pthread_cond_init(&pool->q_space, NULL) != 0) {
        pdx_error("offload: cannot initialise the queue condition");
        goto err_destroy_nonempty;
    }
    if (pthread_condattr_init(&cattr) != 0) {
        pdx_error("offload: cannot initialise a condition attribute");
        goto err_destroy_space;
    }
    pthread_condattr_setclock(&cattr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&pool->q_done, &cattr);
    pthread_condattr_destroy(&cattr);
    if (rc != 0) {
        pdx_error("offload: cannot initialise the flush condition");
        goto err_destroy_space;
    }
    if (pool->flags & PDX_OFFLOAD_FLAG_ASYNC_SAVE) {
        rc = pthread_create(&pool->worker, NULL, kvo_save_worker, pool);
        if (rc != 0) {
            pdx_error("offload: cannot start the save worker: %s",
                      strerror(rc));
            st = PDX_ERR_IO;
            goto err_destroy_done;
        }
        pool->worker_started = true;
    }
    pdx_debug("offload: %u blocks of %llu B (slab %zu B, index %zu B)", cap,
              (unsigned long long)pool->block_bytes, pool->slab_len,
              pool->meta_len + pool->tab_len);
    *pool_p = pool;
    return PDX_OK;

err_destroy_done:
    pthread_cond_destroy(&pool->q_done);
err_destroy_space:
    pthread_cond_destroy(&pool->q_space);
err_destroy_nonempty:
    pthread_cond_destroy(&pool->q_nonempty);
err_destroy_qlock:
    pthread_mutex_destroy(&pool->qlock);
err_destroy_lock:
    pthread_mutex_destroy(&pool->lock);
err_free_q:
    free(pool->q);
err_unmap_tab:
    munmap(pool->tab, pool->tab_len);
err_unmap_meta:
    munmap(pool->meta, pool->meta_len);
err_unmap_slab:
    unmap_slab(pool);
err_free_pool:
    pdx_handle_release(pool);
    return st;
}

pdx_status_t pdx_offload_create(const pdx_offload_params_t *params,
                                pdx_offload_pool_h *pool_p)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(params, "params") || !PDX_ARG_OK(pool_p, "pool_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pool_create(params, pool_p));
}

static void pool_destroy(pdx_offload_pool_h pool)
{
    if (pool->worker_started) {
        pthread_mutex_lock(&pool->qlock);
        pool->q_stop = true;
        pthread_cond_broadcast(&pool->q_nonempty);
        pthread_cond_broadcast(&pool->q_space);
        pthread_mutex_unlock(&pool->qlock);
        pthread_join(pool->worker, NULL);
    }
    if (pool->live_leases != 0) {
        pdx_error("offload: pool destroyed with %llu live leases",
                  (unsigned long long)pool->live_leases);
    }
    pthread_cond_destroy(&pool->q_done);
    pthread_cond_destroy(&pool->q_space);
    pthread_cond_destroy(&pool->q_nonempty);
    pthread_mutex_destroy(&pool->qlock);
    pthread_mutex_destroy(&pool->lock);
    free(pool->q);
    munmap(pool->tab, pool->tab_len);
    munmap(pool->meta, pool->meta_len);
    unmap_slab(pool);
    pdx_handle_release(pool);
}

void pdx_offload_destroy(pdx_offload_pool_h pool)
{
    PDX_ENTER();
    if (pool == NULL) { /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    }
    if (!KV_POOL_REL_OK(pool)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    pool_destroy(pool);
    PDX_LEAVE_VOID(PDX_OK);
}

/* ---- introspection ------------------------------------------------------ */

/* Slots one pdx_offload_keys call looks at: bounds its hold of the lock
 * (a few tens of microseconds) however sparse the pool is. */
#define KEYS_SCAN_MAX 16384u

pdx_status_t pdx_offload_keys(pdx_offload_pool_h pool, uint64_t *cursor_p,
                              pdx_offload_key_t *keys, size_t max, size_t *n_p)
{
    size_t n = 0;
    uint64_t s;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(cursor_p, "cursor_p") ||
        !PDX_ARG_OK(n_p, "n_p") || !PDX_ARG_OK(keys, "keys")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (max == 0) {
        /* Would make no progress: a cursor of 0 would read as the end. */
        pdx_call_fail(PDX_ERR_INVALID, "%s: max is 0", __func__);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    s = *cursor_p;
    pthread_mutex_lock(&pool->lock);
    /* Slots past next_unused were never used. */
    uint64_t end = pool->next_unused;
    uint64_t stop = s + KEYS_SCAN_MAX < end ? s + KEYS_SCAN_MAX : end;
    for (; s < stop && n < max; s++) {
        const slot_meta_t *m = &pool->meta[s];
        if (m->state == ST_VALID) {
            memset(&keys[n], 0, sizeof(keys[n]));
            memcpy(keys[n].bytes, m->key, m->len);
            keys[n].len = m->len;
            n++;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    *cursor_p = s < end ? s : 0;
    *n_p = n;
    PDX_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_slab(pdx_offload_pool_h pool, void **addr_p,
                              size_t *len_p)
{
    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(addr_p, "addr_p") ||
        !PDX_ARG_OK(len_p, "len_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    *addr_p = pool->slab;
    *len_p = pool->slab_len;
    PDX_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_stats(pdx_offload_pool_h pool,
                               pdx_offload_stats_t *stats_p)
{
    pdx_offload_stats_t s;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(stats_p, "stats_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    s = pool->st;
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_lock(&pool->qlock);
    s.dropped_saves = pool->q_dropped;
    s.queued_saves = pool->q_accepted - pool->q_completed;
    pthread_mutex_unlock(&pool->qlock);
    s.bytes_loaded =
        atomic_load_explicit(&pool->bytes_loaded, memory_order_relaxed);
    s.capacity_blocks = pool->capacity;
    s.block_bytes = pool->block_bytes;
    s.slot_bytes = pool->slot_bytes;
    s.slab_bytes = pool->slab_len;
    s.index_bytes = pool->meta_len + pool->tab_len;
    s.index_bytes_per_block = s.index_bytes / pool->capacity;
    *stats_p = s;
    PDX_LEAVE(PDX_OK);
}
