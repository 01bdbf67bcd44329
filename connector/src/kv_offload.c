/* Offload tier: a slab of fixed-size block slots, an open-addressing index
 * keyed by the (mixed) first 8 hash bytes, one LRU per class, leases that pin
 * slots, and a worker thread that runs queued saves. */
#include <pdx/kv_offload.h>
#include <pdx/agent.h>
#include <pdx/log.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kv_call.h"

#define NIL UINT32_MAX
#define SLOT_ALIGN 64u
#define MAX_BLOCKS (1u << 30)
#define MAX_BLOCK_BYTES (1ull << 40)
#define MAX_QUEUE_DEPTH 65536u
#define MAX_DEMOTE_OWNERS 65535u
#define DEFAULT_QUEUE_DEPTH 256u
#define DEFAULT_DEMOTE_OWNERS 3u
#define HUGE_ALIGN (2ull << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum { ST_FREE = 0, ST_FILLING = 1, ST_VALID = 2 };

/* One cache line per slot, so a lookup's key compare, its LRU update and its
 * lease count touch a single line of the slot itself. */
typedef struct {
    uint8_t key[PDX_OFFLOAD_KEY_MAX];
    uint32_t prev;   /* LRU links within the class list */
    uint32_t next;   /* ... or the free-list link when ST_FREE */
    uint32_t leases; /* live leases pinning the slot */
    uint32_t owners; /* owner hints */
    uint32_t gen;    /* bumped per reservation; checks commit/abort */
    uint32_t home;   /* low 32 bits of the key hash: home bucket */
    uint8_t len;
    uint8_t cls;
    uint8_t state;
    uint8_t in_lru;
    uint8_t pad[4];
} slot_meta_t;

_Static_assert(sizeof(slot_meta_t) == 64, "slot metadata is one cache line");

/* Table entry: tag = high 32 bits of the key hash, slot1 = slot + 1 (0 is
 * empty). The tag filters probes before the slot's line is touched. */
typedef struct {
    uint32_t tag;
    uint32_t slot1;
} tab_ent_t;

typedef struct {
    uint32_t head; /* most recently used */
    uint32_t tail; /* next to evict */
} lru_t;

typedef struct {
    pdx_offload_key_t key;
    uint8_t cls;
    const void *src;
    pdx_offload_save_cb_t cb;
    void *cb_arg;
} save_req_t;

struct pdx_offload_pool {
    uint32_t magic; /* PDX_MAGIC_POOL; first, as pdx_call.h requires */
    /* Immutable after create. */
    uint64_t block_bytes;
    uint64_t slot_bytes;
    uint32_t capacity;
    uint32_t demote_owners;
    uint32_t flags;
    uint8_t *slab;
    void *slab_map; /* mapping base (slab may be aligned inside it) */
    size_t slab_map_len;
    bool slab_shared; /* from pdx_mem_alloc: free with pdx_mem_free */
    size_t slab_len;
    slot_meta_t *meta;
    size_t meta_len;
    tab_ent_t *tab;
    size_t tab_len;
    uint32_t tab_mask;
    pdx_offload_copy_cb_t copy_cb;
    void *copy_arg;
    pdx_offload_evict_cb_t evict_cb;
    void *evict_arg;

    /* Guarded by `lock`: the table, the metadata, the LRUs, the counters. */
    pthread_mutex_t lock;
    lru_t lru[PDX_OFFLOAD_NUM_CLASSES];
    uint32_t free_head;   /* recycled slots */
    uint32_t next_unused; /* slots [next_unused, capacity) never used */
    uint64_t live_leases;
    pdx_offload_stats_t st; /* counters only; sizes filled on snapshot */

    /* Guarded by `qlock`: the save queue. */
    pthread_mutex_t qlock;
    pthread_cond_t q_nonempty;
    pthread_cond_t q_space;
    pthread_cond_t q_done; /* CLOCK_MONOTONIC, for flush deadlines */
    save_req_t *q;
    uint32_t q_depth;
    uint32_t q_head;
    uint32_t q_count;
    uint64_t q_accepted;
    uint64_t q_completed;
    uint64_t q_dropped;
    bool q_stop;
    bool worker_started;
    pthread_t worker;

    _Atomic uint64_t bytes_loaded; /* updated outside the lock */
};

struct pdx_offload_lease {
    pdx_offload_pool_h pool;
    uint32_t count;
    uint32_t slots[];
};

/* ---- keys and the index ------------------------------------------------ */

static inline bool key_ok(const pdx_offload_key_t *k)
{
    return k->len >= 1 && k->len <= PDX_OFFLOAD_KEY_MAX;
}

/* Block hashes are uniformly random, but a mixer keeps the table healthy
 * for keys that are not (tests, sequential ids): murmur3's finaliser. */
static inline uint64_t key_hash(const pdx_offload_key_t *k)
{
    uint64_t x = 0;
    memcpy(&x, k->bytes, k->len < 8 ? k->len : 8);
    x ^= (uint64_t)k->len << 58;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Slot holding `k` (any state) or NIL; *pos_p is its table position. */
static uint32_t idx_find(const struct pdx_offload_pool *pool,
                         const pdx_offload_key_t *k, uint64_t h,
                         uint32_t *pos_p)
{
    uint32_t tag = (uint32_t)(h >> 32);
    uint32_t pos = (uint32_t)h & pool->tab_mask;

    for (uint32_t i = 0; i <= pool->tab_mask; i++) {
        tab_ent_t e = pool->tab[pos];
        if (e.slot1 == 0) {
            return NIL;
        }
        if (e.tag == tag) {
            const slot_meta_t *m = &pool->meta[e.slot1 - 1];
            if (m->len == k->len && memcmp(m->key, k->bytes, k->len) == 0) {
                if (pos_p != NULL) {
                    *pos_p = pos;
                }
                return e.slot1 - 1;
            }
        }
        pos = (pos + 1) & pool->tab_mask;
    }
    return NIL;
}

/* Insert slot `s` (whose key is absent). The table is at most half full, so
 * an empty entry is always found. */
static void idx_insert(struct pdx_offload_pool *pool, uint32_t s, uint64_t h)
{
    uint32_t pos = (uint32_t)h & pool->tab_mask;

    for (uint32_t i = 0; i <= pool->tab_mask; i++) {
        if (pool->tab[pos].slot1 == 0) {
            pool->tab[pos].tag = (uint32_t)(h >> 32);
            pool->tab[pos].slot1 = s + 1;
            return;
        }
        pos = (pos + 1) & pool->tab_mask;
    }
}

/* Remove slot `s` from the table by backward-shift deletion (no tombstones,
 * so probe lengths stay those of a fresh table). */
static void idx_remove(struct pdx_offload_pool *pool, uint32_t s)
{
    uint32_t mask = pool->tab_mask;
    uint32_t i = pool->meta[s].home & mask;
    uint32_t j;
    uint32_t n;

    for (n = 0; n <= mask && pool->tab[i].slot1 != s + 1; n++) {
        if (pool->tab[i].slot1 == 0) {
            return; /* not indexed; cannot happen */
        }
        i = (i + 1) & mask;
    }
    j = i;
    for (n = 0; n <= mask; n++) {
        j = (j + 1) & mask;
        if (pool->tab[j].slot1 == 0) {
            break;
        }
        uint32_t home = pool->meta[pool->tab[j].slot1 - 1].home & mask;
        /* Entry j may fill the hole at i unless its home lies in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            pool->tab[i] = pool->tab[j];
            i = j;
        }
    }
    pool->tab[i].tag = 0;
    pool->tab[i].slot1 = 0;
}

/* ---- LRUs (all under pool->lock) ---------------------------------------- */

static void lru_unlink(struct pdx_offload_pool *pool, uint32_t s)
{
    slot_meta_t *m = &pool->meta[s];
    lru_t *l = &pool->lru[m->cls];

    if (m->prev != NIL) {
        pool->meta[m->prev].next = m->next;
    } else {
        l->head = m->next;
    }
    if (m->next != NIL) {
        pool->meta[m->next].prev = m->prev;
    } else {
        l->tail = m->prev;
    }
    m->prev = m->next = NIL;
    m->in_lru = 0;
}

/* Link `s` right after `after` in its class list, or at the head (most
 * recent) when `after` is NIL. */
static void lru_link_after(struct pdx_offload_pool *pool, uint32_t after,
                           uint32_t s)
{
    slot_meta_t *m = &pool->meta[s];
    lru_t *l = &pool->lru[m->cls];

    m->prev = after;
    m->next = after == NIL ? l->head : pool->meta[after].next;
    if (m->next != NIL) {
        pool->meta[m->next].prev = s;
    } else {
        l->tail = s;
    }
    if (after != NIL) {
        pool->meta[after].next = s;
    } else {
        l->head = s;
    }
    m->in_lru = 1;
}

/* Refresh `s` as part of a run that keeps key order: the first block of the
 * run goes to the head, each next one right after the previous of its
 * class. last[] tracks the run's previous block per class. */
static void lru_touch_run(struct pdx_offload_pool *pool, uint32_t s,
                          uint32_t last[PDX_OFFLOAD_NUM_CLASSES])
{
    slot_meta_t *m = &pool->meta[s];

    if (last[m->cls] == s) {
        return; /* the same key twice in a row */
    }
    if (m->in_lru) {
        lru_unlink(pool, s);
    }
    lru_link_after(pool, last[m->cls], s);
    last[m->cls] = s;
}

/* ---- slots (under pool->lock) ------------------------------------------ */

/* A block evicted under the lock, reported to evict_cb once it is dropped
 * (the callback may take locks that are held around pool calls). */
typedef struct {
    bool any;
    uint8_t cls;
    pdx_offload_key_t key;
} evicted_t;

static void slot_evict(struct pdx_offload_pool *pool, uint32_t s, evicted_t *ev)
{
    slot_meta_t *m = &pool->meta[s];

    if (ev != NULL) {
        ev->any = true;
        ev->cls = m->cls;
        memcpy(ev->key.bytes, m->key, m->len);
        ev->key.len = m->len;
    }
    lru_unlink(pool, s);
    idx_remove(pool, s);
    pool->st.blocks[m->cls]--;
    pool->st.evictions[m->cls]++;
    m->state = ST_FREE;
}

/* A slot to fill: free, never used, or evicted (reclaimable LRU tail, then
 * retained LRU tail). Leased and filling slots are in no LRU, so the tails
 * are always evictable. NIL when every slot is pinned. */
static uint32_t slot_acquire(struct pdx_offload_pool *pool, evicted_t *ev)
{
    static const uint8_t order[] = {PDX_OFFLOAD_RECLAIMABLE,
                                    PDX_OFFLOAD_RETAINED};
    uint32_t s;

    if (pool->free_head != NIL) {
        s = pool->free_head;
        pool->free_head = pool->meta[s].next;
        return s;
    }
    if (pool->next_unused < pool->capacity) {
        return pool->next_unused++;
    }
    for (size_t i = 0; i < sizeof(order); i++) {
        s = pool->lru[order[i]].tail;
        if (s != NIL) {
            slot_evict(pool, s, ev);
            return s;
        }
    }
    return NIL;
}

static void slot_free(struct pdx_offload_pool *pool, uint32_t s)
{
    pool->meta[s].state = ST_FREE;
    pool->meta[s].next = pool->free_head;
    pool->free_head = s;
}

static inline uint8_t *slot_addr(const struct pdx_offload_pool *pool,
                                 uint32_t s)
{
    return pool->slab + (size_t)s * pool->slot_bytes;
}

static pdx_status_t reserve_locked(struct pdx_offload_pool *pool,
                                   const pdx_offload_key_t *key,
                                   pdx_offload_class_t cls, uint32_t *slot_p,
                                   evicted_t *ev)
{
    uint64_t h = key_hash(key);
    uint32_t s = idx_find(pool, key, h, NULL);
    slot_meta_t *m;

    if (s != NIL) {
        m = &pool->meta[s];
        pool->st.dup_saves++;
        if (m->in_lru) { /* refresh; never change class */
            lru_unlink(pool, s);
            lru_link_after(pool, NIL, s);
        }
        return PDX_ERR_EXISTS;
    }
    s = slot_acquire(pool, ev);
    if (s == NIL) {
        pool->st.no_space++;
        return PDX_ERR_NO_SPACE;
    }
    m = &pool->meta[s];
    memcpy(m->key, key->bytes, key->len);
    m->len = key->len;
    m->cls = (uint8_t)cls;
    m->state = ST_FILLING;
    m->in_lru = 0;
    m->prev = m->next = NIL;
    m->leases = 0;
    m->owners = 0;
    m->gen++;
    m->home = (uint32_t)h;
    idx_insert(pool, s, h);
    pool->st.filling_blocks++;
    *slot_p = s;
    return PDX_OK;
}

static void commit_locked(struct pdx_offload_pool *pool, uint32_t s)
{
    slot_meta_t *m = &pool->meta[s];

    m->state = ST_VALID;
    lru_link_after(pool, NIL, s);
    pool->st.filling_blocks--;
    pool->st.blocks[m->cls]++;
    pool->st.saves++;
    pool->st.bytes_saved += pool->block_bytes;
}

static void abort_locked(struct pdx_offload_pool *pool, uint32_t s)
{
    idx_remove(pool, s);
    slot_free(pool, s);
    pool->st.filling_blocks--;
}

/* After the pool lock is released. */
static void report_evicted(const struct pdx_offload_pool *pool,
                           const evicted_t *ev)
{
    if (ev->any && pool->evict_cb != NULL) {
        /* The caller's code: its own pdx calls record their own errors. */
        int d = pdx_call_suspend();
        pool->evict_cb(pool->evict_arg, &ev->key, (pdx_offload_class_t)ev->cls);
        pdx_call_resume(d);
    }
}

static inline void copy_block(const struct pdx_offload_pool *pool, void *dst,
                              const void *src)
{
    if (pool->copy_cb != NULL) {
        /* The caller's code: its own pdx calls record their own errors. */
        int d = pdx_call_suspend();
        pool->copy_cb(pool->copy_arg, dst, src, pool->block_bytes);
        pdx_call_resume(d);
    } else {
        memcpy(dst, src, pool->block_bytes);
    }
}

/* Reserve, copy outside the lock (the slot is FILLING: invisible, not
 * evictable, so no reader and no other writer), commit. */
static pdx_status_t do_save(struct pdx_offload_pool *pool,
                            const pdx_offload_key_t *key, const void *src,
                            pdx_offload_class_t cls)
{
    uint32_t s = NIL;
    evicted_t ev = {0};
    pdx_status_t st;

    pthread_mutex_lock(&pool->lock);
    st = reserve_locked(pool, key, cls, &s, &ev);
    pthread_mutex_unlock(&pool->lock);
    report_evicted(pool, &ev);
    if (st == PDX_ERR_EXISTS) {
        return PDX_OK;
    }
    if (st != PDX_OK) {
        return st;
    }
    copy_block(pool, slot_addr(pool, s), src);
    pthread_mutex_lock(&pool->lock);
    commit_locked(pool, s);
    pthread_mutex_unlock(&pool->lock);
    return PDX_OK;
}

/* ---- save worker ------------------------------------------------------- */

static void *save_worker(void *arg)
{
    struct pdx_offload_pool *pool = arg;
    save_req_t req;
    pdx_status_t st;

    pthread_mutex_lock(&pool->qlock);
    for (;;) {
        while (pool->q_count == 0 && !pool->q_stop) {
            pthread_cond_wait(&pool->q_nonempty, &pool->qlock);
        }
        if (pool->q_stop) {
            break;
        }
        req = pool->q[pool->q_head];
        pool->q_head = (pool->q_head + 1) % pool->q_depth;
        pool->q_count--;
        pthread_cond_signal(&pool->q_space);
        pthread_mutex_unlock(&pool->qlock);

        st = do_save(pool, &req.key, req.src, (pdx_offload_class_t)req.cls);
        if (req.cb != NULL) {
            req.cb(req.cb_arg, &req.key, st);
        }

        pthread_mutex_lock(&pool->qlock);
        pool->q_completed++;
        pthread_cond_broadcast(&pool->q_done);
    }
    /* Stopping: what is still queued is canceled, callbacks run once. */
    while (pool->q_count > 0) {
        req = pool->q[pool->q_head];
        pool->q_head = (pool->q_head + 1) % pool->q_depth;
        pool->q_count--;
        pthread_mutex_unlock(&pool->qlock);
        if (req.cb != NULL) {
            req.cb(req.cb_arg, &req.key, PDX_ERR_CANCELED);
        }
        pthread_mutex_lock(&pool->qlock);
        pool->q_completed++;
    }
    pthread_cond_broadcast(&pool->q_done);
    pthread_cond_broadcast(&pool->q_space);
    pthread_mutex_unlock(&pool->qlock);
    return NULL;
}

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
        rc = pthread_create(&pool->worker, NULL, save_worker, pool);
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
    KV_ENTER();
    if (!KV_ARG_OK(params, "params") || !KV_ARG_OK(pool_p, "pool_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(pool_create(params, pool_p));
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
    KV_ENTER();
    if (pool == NULL) { /* like free(NULL) */
        KV_LEAVE_VOID(PDX_OK);
    }
    if (!KV_POOL_REL_OK(pool)) {
        KV_LEAVE_VOID(PDX_ERR_INVALID);
    }
    pool_destroy(pool);
    KV_LEAVE_VOID(PDX_OK);
}

/* ---- query / lease / load / release ----------------------------------- */

/* Argument checks of the entry points, logged with the function named. */
static bool keys_arg_ok(const char *fn, const pdx_offload_key_t *keys,
                        size_t n)
{
    if (n > 0 && !kv_arg_ok(keys, fn, "keys")) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!key_ok(&keys[i])) {
            pdx_call_fail(PDX_ERR_INVALID,
                          "%s: keys[%zu] has length %u (must be 1..%d)", fn, i,
                          keys[i].len, PDX_OFFLOAD_KEY_MAX);
            return false;
        }
    }
    return true;
}

static bool key_arg_ok(const char *fn, const pdx_offload_key_t *key)
{
    if (!kv_arg_ok(key, fn, "key")) {
        return false;
    }
    if (!key_ok(key)) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: key has length %u (must be 1..%d)",
                      fn, key->len, PDX_OFFLOAD_KEY_MAX);
        return false;
    }
    return true;
}

static bool class_arg_ok(const char *fn, pdx_offload_class_t cls)
{
    if (cls == PDX_OFFLOAD_RETAINED || cls == PDX_OFFLOAD_RECLAIMABLE) {
        return true;
    }
    pdx_call_fail(PDX_ERR_INVALID, "%s: class %d is not a pdx_offload_class_t",
                  fn, (int)cls);
    return false;
}

/* The lease of `pool` that `lease` must be. */
static bool lease_arg_ok(const char *fn, pdx_offload_pool_h pool,
                         pdx_offload_lease_h lease)
{
    if (!kv_arg_ok(lease, fn, "lease")) {
        return false;
    }
    if (lease->pool != pool) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: lease %p is not from pool %p", fn,
                      (const void *)lease, (const void *)pool);
        return false;
    }
    return true;
}

/* A prefix walk is a chain of dependent cache misses per key (table entry,
 * then the slot's line, then its LRU neighbours). Keys are independent, so
 * the walk runs a software pipeline: PF_TAB keys ahead it hashes a key and
 * prefetches its bucket, PF_META ahead it finds the tag match in the (now
 * cached) bucket and prefetches the slot, PF_LRU ahead it prefetches the
 * slot's LRU neighbours; the misses of many keys then overlap. */
#define PF_TAB 16
#define PF_META 8
#define PF_LRU 3
#define PF_RING 32 /* > PF_TAB, power of two */
#define PF_SCAN 4  /* bucket entries a prefetch looks at */

typedef struct {
    uint64_t h;
    uint32_t cand; /* slot whose tag matches, or NIL */
} pf_ent_t;

static inline void pf_tab(const struct pdx_offload_pool *pool,
                          const pdx_offload_key_t *keys, size_t j,
                          pf_ent_t *ring)
{
    uint64_t h = key_hash(&keys[j]);
    ring[j % PF_RING].h = h;
    __builtin_prefetch(&pool->tab[(uint32_t)h & pool->tab_mask]);
}

static inline void pf_meta(const struct pdx_offload_pool *pool, size_t j,
                           pf_ent_t *ring)
{
    pf_ent_t *e = &ring[j % PF_RING];
    uint32_t tag = (uint32_t)(e->h >> 32);
    uint32_t pos = (uint32_t)e->h & pool->tab_mask;

    e->cand = NIL;
    for (uint32_t k = 0; k < PF_SCAN; k++) {
        tab_ent_t t = pool->tab[pos];
        if (t.slot1 == 0) {
            return;
        }
        if (t.tag == tag) {
            e->cand = t.slot1 - 1;
            __builtin_prefetch(&pool->meta[e->cand]);
            return;
        }
        pos = (pos + 1) & pool->tab_mask;
    }
}

static inline void pf_lru(const struct pdx_offload_pool *pool, size_t j,
                          const pf_ent_t *ring)
{
    uint32_t c = ring[j % PF_RING].cand;

    if (c != NIL) {
        const slot_meta_t *m = &pool->meta[c];
        if (m->prev != NIL) {
            __builtin_prefetch(&pool->meta[m->prev], 1);
        }
        if (m->next != NIL) {
            __builtin_prefetch(&pool->meta[m->next], 1);
        }
    }
}

/* Walk the present prefix of keys[0..n) (at most `max` blocks), refreshing
 * it as a key-ordered run; with `slots`, also pin each block into it. */
static size_t prefix_locked(struct pdx_offload_pool *pool,
                            const pdx_offload_key_t *keys, size_t n, size_t max,
                            uint32_t *slots)
{
    uint32_t last[PDX_OFFLOAD_NUM_CLASSES] = {NIL, NIL};
    pf_ent_t ring[PF_RING];
    size_t lim = n < max ? n : max;
    size_t i;

    for (i = 0; i < lim && i < PF_TAB; i++) {
        pf_tab(pool, keys, i, ring);
    }
    for (i = 0; i < lim && i < PF_META; i++) {
        pf_meta(pool, i, ring);
    }
    for (i = 0; i < lim && i < PF_LRU; i++) {
        pf_lru(pool, i, ring);
    }
    for (i = 0; i < lim; i++) {
        if (i + PF_TAB < lim) {
            pf_tab(pool, keys, i + PF_TAB, ring);
        }
        if (i + PF_META < lim) {
            pf_meta(pool, i + PF_META, ring);
        }
        if (i + PF_LRU < lim) {
            pf_lru(pool, i + PF_LRU, ring);
        }
        uint32_t s = idx_find(pool, &keys[i], ring[i % PF_RING].h, NULL);
        if (s == NIL || pool->meta[s].state != ST_VALID) {
            break;
        }
        slot_meta_t *m = &pool->meta[s];
        if (slots != NULL) {
            if (m->leases++ == 0) {
                if (m->in_lru) {
                    lru_unlink(pool, s);
                }
                pool->st.leased_blocks++;
            }
            slots[i] = s;
        } else if (m->in_lru) {
            lru_touch_run(pool, s, last);
        }
    }
    pool->st.hits += i;
    pool->st.misses += n - i;
    return i;
}

pdx_status_t pdx_offload_query(pdx_offload_pool_h pool,
                               const pdx_offload_key_t *keys, size_t n,
                               size_t *prefix_p)
{
    size_t found;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(prefix_p, "prefix_p") ||
        !keys_arg_ok(__func__, keys, n)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    found = prefix_locked(pool, keys, n, SIZE_MAX, NULL);
    pthread_mutex_unlock(&pool->lock);
    *prefix_p = found;
    KV_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_lease(pdx_offload_pool_h pool,
                               const pdx_offload_key_t *keys, size_t n,
                               pdx_offload_lease_h *lease_p, size_t *count_p)
{
    struct pdx_offload_lease *lease;
    size_t max;
    size_t found;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(lease_p, "lease_p") ||
        !KV_ARG_OK(count_p, "count_p") || !keys_arg_ok(__func__, keys, n)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    max = n < pool->capacity ? n : pool->capacity;
    lease = malloc(sizeof(*lease) + (max ? max : 1) * sizeof(uint32_t));
    if (lease == NULL) {
        pdx_error("offload: out of memory for a lease of %zu blocks", max);
        KV_LEAVE(PDX_ERR_NOMEM);
    }
    pthread_mutex_lock(&pool->lock);
    found = prefix_locked(pool, keys, n, max, lease->slots);
    if (found > 0) {
        pool->live_leases++;
    }
    pthread_mutex_unlock(&pool->lock);
    if (found == 0) {
        free(lease);
        if (n == 0) {
            pdx_error("offload: lease of 0 keys: nothing to pin");
        } else {
            pdx_error("offload: lease: the first of %zu keys is not in the "
                      "pool (saved blocks only; evicted or never saved)",
                      n);
        }
        KV_LEAVE(PDX_ERR_NOT_FOUND);
    }
    lease->pool = pool;
    lease->count = (uint32_t)found;
    *lease_p = lease;
    *count_p = found;
    KV_LEAVE(PDX_OK);
}

size_t pdx_offload_lease_count(pdx_offload_lease_h lease)
{
    KV_ENTER();
    if (!KV_ARG_OK(lease, "lease")) {
        KV_LEAVE_VAL(PDX_ERR_INVALID, 0);
    }
    KV_LEAVE_VAL(PDX_OK, lease->count);
}

pdx_status_t pdx_offload_lease_block(pdx_offload_pool_h pool,
                                     pdx_offload_lease_h lease, size_t index,
                                     const void **addr_p)
{
    KV_ENTER();
    if (!KV_POOL_OK(pool) || !lease_arg_ok(__func__, pool, lease) ||
        !KV_ARG_OK(addr_p, "addr_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (index >= lease->count) {
        pdx_error("offload: lease block index %zu out of range (%u blocks)",
                  index, lease->count);
        KV_LEAVE(PDX_ERR_INVALID);
    }
    *addr_p = slot_addr(pool, lease->slots[index]);
    KV_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_load(pdx_offload_pool_h pool,
                              pdx_offload_lease_h lease,
                              const pdx_offload_load_item_t *items, size_t n)
{
    uintptr_t slab_lo;
    uintptr_t slab_hi;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !lease_arg_ok(__func__, pool, lease) ||
        (n > 0 && !KV_ARG_OK(items, "items"))) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    slab_lo = (uintptr_t)pool->slab;
    slab_hi = slab_lo + pool->slab_len;
    for (size_t i = 0; i < n; i++) {
        uintptr_t d = (uintptr_t)items[i].dst;
        if (items[i].index >= lease->count) {
            pdx_error("offload: load item %zu: index %zu out of range (lease "
                      "of %u blocks)",
                      i, items[i].index, lease->count);
            KV_LEAVE(PDX_ERR_INVALID);
        }
        if (d == 0 || (d < slab_hi && d + pool->block_bytes > slab_lo)) {
            pdx_error("offload: load item %zu: destination %p is NULL or "
                      "overlaps the slab",
                      i, items[i].dst);
            KV_LEAVE(PDX_ERR_INVALID);
        }
    }
    /* The lease pins every slot: no lock, nobody writes them meanwhile. */
    for (size_t i = 0; i < n; i++) {
        copy_block(pool, items[i].dst,
                   slot_addr(pool, lease->slots[items[i].index]));
    }
    atomic_fetch_add_explicit(&pool->bytes_loaded, n * pool->block_bytes,
                              memory_order_relaxed);
    KV_LEAVE(PDX_OK);
}

void pdx_offload_release(pdx_offload_pool_h pool, pdx_offload_lease_h lease)
{
    uint32_t last[PDX_OFFLOAD_NUM_CLASSES] = {NIL, NIL};

    KV_ENTER();
    if (!KV_POOL_OK(pool)) {
        KV_LEAVE_VOID(PDX_ERR_INVALID);
    }
    if (lease == NULL) { /* like free(NULL) */
        KV_LEAVE_VOID(PDX_OK);
    }
    if (!lease_arg_ok(__func__, pool, lease)) {
        KV_LEAVE_VOID(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < lease->count; i++) {
        uint32_t s = lease->slots[i];
        if (--pool->meta[s].leases == 0) {
            pool->st.leased_blocks--;
            lru_touch_run(pool, s, last);
        }
    }
    pool->live_leases--;
    pthread_mutex_unlock(&pool->lock);
    free(lease);
    KV_LEAVE_VOID(PDX_OK);
}

/* ---- saves ------------------------------------------------------------- */

/* The refusal of a save or reservation for lack of room, logged by the
 * entry points (the async worker reports it to the callback instead). */
static pdx_status_t no_space(const struct pdx_offload_pool *pool,
                             pdx_status_t st)
{
    if (st == PDX_ERR_NO_SPACE) {
        pdx_error("offload: no slot for a block: all %u slots are leased or "
                  "being filled",
                  pool->capacity);
    }
    return st;
}

pdx_status_t pdx_offload_save(pdx_offload_pool_h pool,
                              const pdx_offload_key_t *key, const void *src,
                              pdx_offload_class_t cls)
{
    KV_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !KV_ARG_OK(src, "src") || !class_arg_ok(__func__, cls)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(no_space(pool, do_save(pool, key, src, cls)));
}

pdx_status_t pdx_offload_save_async(pdx_offload_pool_h pool,
                                    const pdx_offload_key_t *key,
                                    const void *src, pdx_offload_class_t cls,
                                    uint32_t flags, pdx_offload_save_cb_t cb,
                                    void *cb_arg)
{
    save_req_t *req;
    pdx_status_t st;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !KV_ARG_OK(src, "src") || !class_arg_ok(__func__, cls)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (!pool->worker_started) {
        st = no_space(pool, do_save(pool, key, src, cls));
        if (st == PDX_OK && cb != NULL) {
            /* The caller's code: its pdx calls are calls of their own. */
            int d = pdx_call_suspend();
            cb(cb_arg, key, st);
            pdx_call_resume(d);
        }
        KV_LEAVE(st);
    }
    pthread_mutex_lock(&pool->qlock);
    /* Each wait ends when the worker takes an entry or the pool stops. */
    while (pool->q_count == pool->q_depth && !pool->q_stop) {
        if (!(flags & PDX_OFFLOAD_SAVE_WAIT)) {
            /* Counted, not logged: a full queue under load would flood
             * the log (dropped_saves in pdx_offload_stats). */
            pool->q_dropped++;
            pthread_mutex_unlock(&pool->qlock);
            KV_LEAVE(PDX_ERR_BUSY);
        }
        pthread_cond_wait(&pool->q_space, &pool->qlock);
    }
    if (pool->q_stop) {
        pthread_mutex_unlock(&pool->qlock);
        pdx_error("offload: save refused: the pool is being destroyed");
        KV_LEAVE(PDX_ERR_CANCELED);
    }
    req = &pool->q[(pool->q_head + pool->q_count) % pool->q_depth];
    req->key = *key;
    req->cls = (uint8_t)cls;
    req->src = src;
    req->cb = cb;
    req->cb_arg = cb_arg;
    pool->q_count++;
    pool->q_accepted++;
    pthread_cond_signal(&pool->q_nonempty);
    pthread_mutex_unlock(&pool->qlock);
    KV_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_flush(pdx_offload_pool_h pool, int64_t timeout_ms)
{
    struct timespec deadline;
    uint64_t target;
    uint64_t left = 0;
    pdx_status_t st = PDX_OK;

    KV_ENTER();
    if (!KV_POOL_OK(pool)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (timeout_ms > 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&pool->qlock);
    target = pool->q_accepted;
    /* Bounded by the deadline, or by the worker finishing what is queued. */
    while (pool->q_completed < target) {
        if (timeout_ms == 0) {
            st = PDX_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms < 0) {
            pthread_cond_wait(&pool->q_done, &pool->qlock);
        } else if (pthread_cond_timedwait(&pool->q_done, &pool->qlock,
                                          &deadline) == ETIMEDOUT &&
                   pool->q_completed < target) {
            st = PDX_ERR_TIMEOUT;
            break;
        }
    }
    if (st != PDX_OK) {
        left = target - pool->q_completed;
    }
    pthread_mutex_unlock(&pool->qlock);
    /* A poll (timeout 0) that finds saves pending is an answer, not worth
     * a log line each time. */
    if (st != PDX_OK && timeout_ms > 0) {
        pdx_error("offload: flush: %llu saves still pending after %lld ms",
                  (unsigned long long)left, (long long)timeout_ms);
    }
    KV_LEAVE(st);
}

/* ---- zero-copy saves --------------------------------------------------- */

pdx_status_t pdx_offload_reserve(pdx_offload_pool_h pool,
                                 const pdx_offload_key_t *key,
                                 pdx_offload_class_t cls,
                                 pdx_offload_resv_t *resv_p)
{
    uint32_t s = NIL;
    uint32_t gen = 0;
    evicted_t ev = {0};
    pdx_status_t st;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !class_arg_ok(__func__, cls) || !KV_ARG_OK(resv_p, "resv_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    st = reserve_locked(pool, key, cls, &s, &ev);
    if (st == PDX_OK) {
        gen = pool->meta[s].gen;
    }
    pthread_mutex_unlock(&pool->lock);
    report_evicted(pool, &ev);
    if (st != PDX_OK) {
        /* PDX_ERR_EXISTS (a duplicate, the common case of a repeated
         * prefix) is an answer and stays quiet. */
        KV_LEAVE(no_space(pool, st));
    }
    resv_p->dst = slot_addr(pool, s);
    resv_p->slot = s;
    resv_p->gen = gen;
    KV_LEAVE(PDX_OK);
}

static bool resv_live(const struct pdx_offload_pool *pool,
                      const pdx_offload_resv_t *resv)
{
    return resv->slot < pool->capacity &&
           pool->meta[resv->slot].state == ST_FILLING &&
           pool->meta[resv->slot].gen == resv->gen &&
           resv->dst == slot_addr(pool, resv->slot);
}

static void resv_dead(const char *what, const pdx_offload_resv_t *resv)
{
    pdx_error("offload: %s: reservation of slot %u (gen %u) is not live "
              "(committed, aborted or never made)",
              what, resv->slot, resv->gen);
}

pdx_status_t pdx_offload_commit(pdx_offload_pool_h pool,
                                const pdx_offload_resv_t *resv)
{
    pdx_status_t st = PDX_ERR_INVALID;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(resv, "resv")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    if (resv_live(pool, resv)) {
        commit_locked(pool, resv->slot);
        st = PDX_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    if (st != PDX_OK) {
        resv_dead("commit", resv);
    }
    KV_LEAVE(st);
}

pdx_status_t pdx_offload_abort(pdx_offload_pool_h pool,
                               const pdx_offload_resv_t *resv)
{
    pdx_status_t st = PDX_ERR_INVALID;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(resv, "resv")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    if (resv_live(pool, resv)) {
        abort_locked(pool, resv->slot);
        st = PDX_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    if (st != PDX_OK) {
        resv_dead("abort", resv);
    }
    KV_LEAVE(st);
}

/* ---- owner hints, introspection ---------------------------------------- */

/* A key that is not present is an answer (PDX_ERR_NOT_FOUND), not logged:
 * owner hints about blocks evicted meanwhile are routine. */
static pdx_status_t owner_hint(pdx_offload_pool_h pool,
                               const pdx_offload_key_t *key, bool add)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    slot_meta_t *m;
    uint32_t s;

    pthread_mutex_lock(&pool->lock);
    s = idx_find(pool, key, key_hash(key), NULL);
    if (s == NIL || pool->meta[s].state != ST_VALID) {
        goto out;
    }
    m = &pool->meta[s];
    st = PDX_OK;
    if (!add) {
        m->owners -= m->owners > 0;
        goto out;
    }
    m->owners += m->owners < UINT32_MAX;
    if (m->cls == PDX_OFFLOAD_RETAINED && m->owners >= pool->demote_owners) {
        bool linked = m->in_lru;
        if (linked) {
            lru_unlink(pool, s);
        }
        m->cls = PDX_OFFLOAD_RECLAIMABLE;
        pool->st.blocks[PDX_OFFLOAD_RETAINED]--;
        pool->st.blocks[PDX_OFFLOAD_RECLAIMABLE]++;
        pool->st.demotions++;
        if (linked) {
            lru_link_after(pool, NIL, s);
        }
    }
out:
    pthread_mutex_unlock(&pool->lock);
    return st;
}

pdx_status_t pdx_offload_add_owner(pdx_offload_pool_h pool,
                                   const pdx_offload_key_t *key)
{
    KV_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(owner_hint(pool, key, true));
}

pdx_status_t pdx_offload_drop_owner(pdx_offload_pool_h pool,
                                    const pdx_offload_key_t *key)
{
    KV_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(owner_hint(pool, key, false));
}

/* Absent is an answer (PDX_ERR_NOT_FOUND), not logged. */
pdx_status_t pdx_offload_class_of(pdx_offload_pool_h pool,
                                  const pdx_offload_key_t *key,
                                  pdx_offload_class_t *cls_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    uint32_t s;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !KV_ARG_OK(cls_p, "cls_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    s = idx_find(pool, key, key_hash(key), NULL);
    if (s != NIL && pool->meta[s].state == ST_VALID) {
        *cls_p = (pdx_offload_class_t)pool->meta[s].cls;
        st = PDX_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    KV_LEAVE(st);
}

/* Slots one pdx_offload_keys call looks at: bounds its hold of the lock
 * (a few tens of microseconds) however sparse the pool is. */
#define KEYS_SCAN_MAX 16384u

pdx_status_t pdx_offload_keys(pdx_offload_pool_h pool, uint64_t *cursor_p,
                              pdx_offload_key_t *keys, size_t max, size_t *n_p)
{
    size_t n = 0;
    uint64_t s;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(cursor_p, "cursor_p") ||
        !KV_ARG_OK(n_p, "n_p") || !KV_ARG_OK(keys, "keys")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (max == 0) {
        /* Would make no progress: a cursor of 0 would read as the end. */
        pdx_call_fail(PDX_ERR_INVALID, "%s: max is 0", __func__);
        KV_LEAVE(PDX_ERR_INVALID);
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
    KV_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_slab(pdx_offload_pool_h pool, void **addr_p,
                              size_t *len_p)
{
    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(addr_p, "addr_p") ||
        !KV_ARG_OK(len_p, "len_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    *addr_p = pool->slab;
    *len_p = pool->slab_len;
    KV_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_stats(pdx_offload_pool_h pool,
                               pdx_offload_stats_t *stats_p)
{
    pdx_offload_stats_t s;

    KV_ENTER();
    if (!KV_POOL_OK(pool) || !KV_ARG_OK(stats_p, "stats_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
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
    KV_LEAVE(PDX_OK);
}
