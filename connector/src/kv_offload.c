/* Offload tier: a slab of fixed-size block slots, an open-addressing index
 * keyed by the (mixed) first 8 hash bytes, one LRU per class, leases that pin
 * slots, and a worker thread that runs queued saves. Creation, teardown and
 * introspection are in kv_offload_admin.c. */
#include <pdx/kv_offload.h>
#include <pdx/log.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kv_call_int.h"
#include "kv_offload_int.h"
#include "pdx_clock.h"

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

void *kvo_save_worker(void *arg)
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

/* ---- query / lease / load / release ----------------------------------- */

/* Argument checks of the entry points, logged with the function named. */
static bool keys_arg_ok(const char *fn, const pdx_offload_key_t *keys,
                        size_t n)
{
    if (n > 0 && !pdx_arg_ok(keys, fn, "keys")) {
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
    if (!pdx_arg_ok(key, fn, "key")) {
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
    if (!pdx_arg_ok(lease, fn, "lease")) {
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

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(prefix_p, "prefix_p") ||
        !keys_arg_ok(__func__, keys, n)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    found = prefix_locked(pool, keys, n, SIZE_MAX, NULL);
    pthread_mutex_unlock(&pool->lock);
    *prefix_p = found;
    PDX_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_lease(pdx_offload_pool_h pool,
                               const pdx_offload_key_t *keys, size_t n,
                               pdx_offload_lease_h *lease_p, size_t *count_p)
{
    struct pdx_offload_lease *lease;
    size_t max;
    size_t found;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(lease_p, "lease_p") ||
        !PDX_ARG_OK(count_p, "count_p") || !keys_arg_ok(__func__, keys, n)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    max = n < pool->capacity ? n : pool->capacity;
    lease = malloc(sizeof(*lease) + (max ? max : 1) * sizeof(uint32_t));
    if (lease == NULL) {
        pdx_error("offload: out of memory for a lease of %zu blocks", max);
        PDX_LEAVE(PDX_ERR_NOMEM);
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
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    lease->pool = pool;
    lease->count = (uint32_t)found;
    *lease_p = lease;
    *count_p = found;
    PDX_LEAVE(PDX_OK);
}

size_t pdx_offload_lease_count(pdx_offload_lease_h lease)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(lease, "lease")) {
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    }
    PDX_LEAVE_VAL(PDX_OK, lease->count);
}

pdx_status_t pdx_offload_lease_block(pdx_offload_pool_h pool,
                                     pdx_offload_lease_h lease, size_t index,
                                     const void **addr_p)
{
    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !lease_arg_ok(__func__, pool, lease) ||
        !PDX_ARG_OK(addr_p, "addr_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (index >= lease->count) {
        pdx_error("offload: lease block index %zu out of range (%u blocks)",
                  index, lease->count);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    *addr_p = slot_addr(pool, lease->slots[index]);
    PDX_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_load(pdx_offload_pool_h pool,
                              pdx_offload_lease_h lease,
                              const pdx_offload_load_item_t *items, size_t n)
{
    uintptr_t slab_lo;
    uintptr_t slab_hi;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !lease_arg_ok(__func__, pool, lease) ||
        (n > 0 && !PDX_ARG_OK(items, "items"))) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    slab_lo = (uintptr_t)pool->slab;
    slab_hi = slab_lo + pool->slab_len;
    for (size_t i = 0; i < n; i++) {
        uintptr_t d = (uintptr_t)items[i].dst;
        if (items[i].index >= lease->count) {
            pdx_error("offload: load item %zu: index %zu out of range (lease "
                      "of %u blocks)",
                      i, items[i].index, lease->count);
            PDX_LEAVE(PDX_ERR_INVALID);
        }
        if (d == 0 || (d < slab_hi && d + pool->block_bytes > slab_lo)) {
            pdx_error("offload: load item %zu: destination %p is NULL or "
                      "overlaps the slab",
                      i, items[i].dst);
            PDX_LEAVE(PDX_ERR_INVALID);
        }
    }
    /* The lease pins every slot: no lock, nobody writes them meanwhile. */
    for (size_t i = 0; i < n; i++) {
        copy_block(pool, items[i].dst,
                   slot_addr(pool, lease->slots[items[i].index]));
    }
    atomic_fetch_add_explicit(&pool->bytes_loaded, n * pool->block_bytes,
                              memory_order_relaxed);
    PDX_LEAVE(PDX_OK);
}

void pdx_offload_release(pdx_offload_pool_h pool, pdx_offload_lease_h lease)
{
    uint32_t last[PDX_OFFLOAD_NUM_CLASSES] = {NIL, NIL};

    PDX_ENTER();
    if (!KV_POOL_OK(pool)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    if (lease == NULL) { /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    }
    if (!lease_arg_ok(__func__, pool, lease)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
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
    PDX_LEAVE_VOID(PDX_OK);
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
    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !PDX_ARG_OK(src, "src") || !class_arg_ok(__func__, cls)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(no_space(pool, do_save(pool, key, src, cls)));
}

pdx_status_t pdx_offload_save_async(pdx_offload_pool_h pool,
                                    const pdx_offload_key_t *key,
                                    const void *src, pdx_offload_class_t cls,
                                    uint32_t flags, pdx_offload_save_cb_t cb,
                                    void *cb_arg)
{
    save_req_t *req;
    pdx_status_t st;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !PDX_ARG_OK(src, "src") || !class_arg_ok(__func__, cls)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (!pool->worker_started) {
        st = no_space(pool, do_save(pool, key, src, cls));
        if (st == PDX_OK && cb != NULL) {
            /* The caller's code: its pdx calls are calls of their own. */
            int d = pdx_call_suspend();
            cb(cb_arg, key, st);
            pdx_call_resume(d);
        }
        PDX_LEAVE(st);
    }
    pthread_mutex_lock(&pool->qlock);
    /* Each wait ends when the worker takes an entry or the pool stops. */
    while (pool->q_count == pool->q_depth && !pool->q_stop) {
        if (!(flags & PDX_OFFLOAD_SAVE_WAIT)) {
            /* Counted, not logged: a full queue under load would flood
             * the log (dropped_saves in pdx_offload_stats). */
            pool->q_dropped++;
            pthread_mutex_unlock(&pool->qlock);
            PDX_LEAVE(PDX_ERR_BUSY);
        }
        pthread_cond_wait(&pool->q_space, &pool->qlock);
    }
    if (pool->q_stop) {
        pthread_mutex_unlock(&pool->qlock);
        pdx_error("offload: save refused: the pool is being destroyed");
        PDX_LEAVE(PDX_ERR_CANCELED);
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
    PDX_LEAVE(PDX_OK);
}

pdx_status_t pdx_offload_flush(pdx_offload_pool_h pool, int64_t timeout_ms)
{
    struct timespec deadline;
    uint64_t target;
    uint64_t left = 0;
    pdx_status_t st = PDX_OK;

    PDX_ENTER();
    if (!KV_POOL_OK(pool)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (timeout_ms > 0) {
        deadline = pdx_abstime_ms(CLOCK_MONOTONIC, timeout_ms);
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
    PDX_LEAVE(st);
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

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !class_arg_ok(__func__, cls) || !PDX_ARG_OK(resv_p, "resv_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
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
        PDX_LEAVE(no_space(pool, st));
    }
    resv_p->dst = slot_addr(pool, s);
    resv_p->slot = s;
    resv_p->gen = gen;
    PDX_LEAVE(PDX_OK);
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

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(resv, "resv")) {
        PDX_LEAVE(PDX_ERR_INVALID);
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
    PDX_LEAVE(st);
}

pdx_status_t pdx_offload_abort(pdx_offload_pool_h pool,
                               const pdx_offload_resv_t *resv)
{
    pdx_status_t st = PDX_ERR_INVALID;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !PDX_ARG_OK(resv, "resv")) {
        PDX_LEAVE(PDX_ERR_INVALID);
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
    PDX_LEAVE(st);
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
    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(owner_hint(pool, key, true));
}

pdx_status_t pdx_offload_drop_owner(pdx_offload_pool_h pool,
                                    const pdx_offload_key_t *key)
{
    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(owner_hint(pool, key, false));
}

/* Absent is an answer (PDX_ERR_NOT_FOUND), not logged. */
pdx_status_t pdx_offload_class_of(pdx_offload_pool_h pool,
                                  const pdx_offload_key_t *key,
                                  pdx_offload_class_t *cls_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    uint32_t s;

    PDX_ENTER();
    if (!KV_POOL_OK(pool) || !key_arg_ok(__func__, key) ||
        !PDX_ARG_OK(cls_p, "cls_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&pool->lock);
    s = idx_find(pool, key, key_hash(key), NULL);
    if (s != NIL && pool->meta[s].state == ST_VALID) {
        *cls_p = (pdx_offload_class_t)pool->meta[s].cls;
        st = PDX_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    PDX_LEAVE(st);
}
