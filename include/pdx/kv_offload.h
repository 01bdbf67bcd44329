/* pdx offload tier: an in-process host-memory pool of fixed-size KV blocks,
 * content-addressed by block hash, that a rank saves sealed blocks into and
 * restores prefixes from (also as the only cache, "pure-L2" mode).
 *
 * Model
 * - One pool per rank. Its byte budget is the host's offload budget split
 *   evenly across the ranks that share the host; the pool preallocates one
 *   slab of (per-rank budget / slot size) block slots and its index up
 *   front; saves, queries and loads allocate nothing, a lease one small
 *   record (4 bytes per block it pins).
 * - A block is either `retained` (saved locally) or `reclaimable` (fetched
 *   from a peer, or demoted by owner hints once enough live owners hold it).
 *   Each class is an LRU. Under pressure the pool evicts the reclaimable LRU
 *   tail first, then the retained LRU tail, and never a leased block. A hit
 *   or a duplicate save refreshes a block's LRU place; neither changes its
 *   class. Classes only ever move retained -> reclaimable.
 * - Restore is query (longest present prefix) -> lease (pins that prefix) ->
 *   load (copies payloads into the caller's blocks) -> release.
 * - Saves are asynchronous by default: pdx_offload_save_async() queues the
 *   block and returns; a worker thread copies it into the pool off the
 *   caller's step path. pdx_offload_save() is the synchronous variant and
 *   pdx_offload_reserve()/commit() the zero-copy one (the caller fills the
 *   slot, e.g. by a device-to-host DMA).
 *
 * Threads: every function is thread-safe unless it says otherwise. One mutex
 * guards the index and the LRUs; payload copies run outside it, on blocks
 * that a lease or a reservation pins, so large copies never serialise
 * lookups, and a slot is never written while anyone may read it.
 *
 * Memory per indexed block (besides the payload slot): a 64-byte metadata
 * record (key, LRU links, lease and owner counts: one cache line) plus 16..32
 * bytes of hash table (8-byte entries, the next power of two >= 2 x capacity,
 * so the load factor stays <= 0.5): 80 B per block at 2^20 blocks.
 * pdx_offload_stats() reports the exact figure.
 *
 * Cost: a query walks its keys as a software pipeline (prefetching buckets,
 * slots and LRU neighbours several keys ahead), so a prefix of many keys
 * costs far less per key than single-key queries, whose cache misses are
 * serial.
 *
 * Bad handles and errors: a NULL pool, a NULL required pointer, or a pool
 * already destroyed is refused without being dereferenced: functions
 * returning a status return PDX_ERR_INVALID, pdx_offload_lease_count 0,
 * void ones do nothing, and pdx_last_error() (pdx/status.h) names the
 * function and the argument, e.g. "pdx_offload_query: pool is NULL".
 * Catching a destroyed pool is best effort: it works while the released
 * object is among the 64 most recent releases kept in quarantine, not once
 * its memory has been reused or freed; a lease is only checked for NULL and
 * for coming from the pool it is used with (a released lease is not
 * caught). Every failure logs its reason (and so leaves it in
 * pdx_last_error()) except the answers of routine calls, which would flood
 * the log: PDX_ERR_EXISTS from pdx_offload_reserve, PDX_ERR_NOT_FOUND from
 * the owner hints and pdx_offload_class_of, PDX_ERR_BUSY from
 * pdx_offload_save_async (counted in dropped_saves) and PDX_ERR_TIMEOUT
 * from pdx_offload_flush with timeout 0; for those pdx_last_error() reads
 * "<function>: <status string>". Callbacks (copy, save and eviction
 * callbacks) run outside the calling function's error capture: pdx calls
 * they make record their own errors. */
#ifndef PDX_KV_OFFLOAD_H
#define PDX_KV_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/export.h>
#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDX_OFFLOAD_KEY_MAX 32

/* A block key: opaque hash bytes, 1..32 of them. The layout is identical to
 * pdx_block_hash_t (pdx/kv_hash.h), so a block hash may be memcpy'd or cast
 * into it. Bytes past `len` are ignored. The pool indexes by the first 8
 * bytes (mixed) and compares the full key, so distinct keys never alias. */
typedef struct pdx_offload_key {
    uint8_t bytes[PDX_OFFLOAD_KEY_MAX];
    uint8_t len;
} pdx_offload_key_t;

#ifndef __cplusplus
_Static_assert(sizeof(pdx_offload_key_t) == 33, "pdx_offload_key_t layout");
#endif

typedef struct pdx_offload_pool *pdx_offload_pool_h;
typedef struct pdx_offload_lease *pdx_offload_lease_h;

typedef enum pdx_offload_class {
    PDX_OFFLOAD_RETAINED = 0,    /* saved locally; evicted after reclaimable */
    PDX_OFFLOAD_RECLAIMABLE = 1, /* fetched from a peer, or demoted */
} pdx_offload_class_t;

#define PDX_OFFLOAD_NUM_CLASSES 2

/* Pool flags (pdx_offload_params_t.flags). */
enum {
    /* Run a save worker thread; without it pdx_offload_save_async() saves
     * inline. */
    PDX_OFFLOAD_FLAG_ASYNC_SAVE = 1u << 0,
    /* madvise(MADV_HUGEPAGE) on the slab (transparent huge pages). */
    PDX_OFFLOAD_FLAG_HUGEPAGE = 1u << 1,
    /* Fault the whole slab in at creation: creation takes time in
     * proportion to the budget (the kernel zeroes every page), and in
     * exchange the first save into a slot runs at copy bandwidth instead of
     * page-fault speed (docs/BENCH-LOG.md has the ratio). On by default, like
     * pinning host buffers at startup. */
    PDX_OFFLOAD_FLAG_PREFAULT = 1u << 2,
};

/* Copies `len` bytes from `src` to `dst`, complete on return. Called from the
 * saving thread (the worker for async saves) and from pdx_offload_load()'s
 * caller, possibly concurrently; must not call back into the pool. Lets a
 * GPU stack copy device memory to the slab and back. */
typedef void (*pdx_offload_copy_cb_t)(void *arg, void *dst, const void *src,
                                      size_t len);

/* A block left the pool to make room for a save or a reservation (LRU
 * eviction); `cls` is the class it had. Runs once per evicted block, on the
 * thread that made room (the save worker for async saves, else the caller
 * of pdx_offload_save, save_async or reserve), after the pool lock is
 * released and before that call returns (for an async save, before its
 * save callback). Blocks dropped by pdx_offload_destroy are not reported.
 * Keep it short (the save waits for it): e.g. queue the key for another
 * thread. It may call pool functions that do not wait on the save queue
 * (not pdx_offload_flush(), pdx_offload_destroy(), nor save_async with
 * PDX_OFFLOAD_SAVE_WAIT); `key` is valid during the call only. Lets an
 * owner registry forget blocks this pool no longer has. */
typedef void (*pdx_offload_evict_cb_t)(void *arg, const pdx_offload_key_t *key,
                                       pdx_offload_class_t cls);

/* pdx_offload_params_t.field_mask bits. */
enum {
    PDX_OFFLOAD_PARAM_BUDGET_BYTES = 1u << 0,    /* required */
    PDX_OFFLOAD_PARAM_NRANKS_PER_HOST = 1u << 1, /* default 1 */
    PDX_OFFLOAD_PARAM_BLOCK_BYTES = 1u << 2,     /* required */
    PDX_OFFLOAD_PARAM_FLAGS = 1u << 3,           /* default: all three flags */
    PDX_OFFLOAD_PARAM_QUEUE_DEPTH = 1u << 4,     /* default 256 */
    PDX_OFFLOAD_PARAM_DEMOTE_OWNERS = 1u << 5,   /* default 3 */
    PDX_OFFLOAD_PARAM_COPY = 1u << 6,            /* default memcpy */
    PDX_OFFLOAD_PARAM_EVICT = 1u << 7,           /* default: none */
};

typedef struct pdx_offload_params {
    uint64_t field_mask;
    /* Host offload budget in bytes, split evenly across nranks_per_host. */
    uint64_t budget_bytes;
    /* Ranks sharing the host budget; per-rank budget = budget / nranks. */
    uint32_t nranks_per_host;
    /* PDX_OFFLOAD_FLAG_* */
    uint32_t flags;
    /* Payload bytes of one block; every block has this size (3,502,592 for
     * GLM-5.2 FP8 + MTP). Slots are rounded up to 64 bytes. */
    uint64_t block_bytes;
    /* Async save queue entries (1..65536). */
    uint32_t queue_depth;
    /* A block with this many live owners (pdx_offload_add_owner()) is
     * demoted to reclaimable (1..65535). */
    uint32_t demote_owners;
    /* Copy function and its argument (PDX_OFFLOAD_PARAM_COPY). */
    pdx_offload_copy_cb_t copy_cb;
    void *copy_arg;
    /* Eviction callback and its argument (PDX_OFFLOAD_PARAM_EVICT). */
    pdx_offload_evict_cb_t evict_cb;
    void *evict_arg;
} pdx_offload_params_t;

/* Counters; a snapshot taken under the pool lock. Append-only. */
typedef struct pdx_offload_stats {
    uint64_t capacity_blocks;       /* slots in the slab */
    uint64_t block_bytes;           /* payload bytes per block */
    uint64_t slot_bytes;            /* block_bytes rounded up to 64 */
    uint64_t slab_bytes;            /* capacity_blocks * slot_bytes */
    uint64_t index_bytes;           /* metadata + hash table bytes */
    uint64_t index_bytes_per_block; /* index_bytes / capacity_blocks */
    uint64_t blocks[PDX_OFFLOAD_NUM_CLASSES]; /* indexed, by class */
    uint64_t leased_blocks;  /* blocks pinned by at least one lease */
    uint64_t filling_blocks; /* reserved, not yet committed */
    uint64_t hits;           /* blocks found by query/lease (prefix) */
    uint64_t misses;         /* blocks asked for past the prefix */
    uint64_t evictions[PDX_OFFLOAD_NUM_CLASSES]; /* by class */
    uint64_t demotions;     /* retained -> reclaimable by owner hints */
    uint64_t saves;         /* blocks stored (committed) */
    uint64_t dup_saves;     /* saves of a key already present */
    uint64_t no_space;      /* saves refused: every slot pinned */
    uint64_t dropped_saves; /* async saves dropped: queue full */
    uint64_t queued_saves;  /* async saves waiting or running now */
    uint64_t bytes_saved;   /* payload bytes copied into the pool */
    uint64_t bytes_loaded;  /* payload bytes copied out of the pool */
} pdx_offload_stats_t;

/* Create a pool: its slab (from pdx_mem_alloc, so a same-host peer can map
 * blocks saved in it once registered), its index and, with ASYNC_SAVE, its
 * save worker.
 *
 * @param [in]  params  The pool's parameters (field_mask says which are
 *                      set).
 * @param [out] pool_p  The pool; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID for a missing required field or a value
 *         out of range; PDX_ERR_CONFIG (logged) when the per-rank budget
 *         holds no block; PDX_ERR_TOO_LARGE over 2^30 blocks;
 *         PDX_ERR_NOMEM / PDX_ERR_IO when the slab, index or worker cannot
 *         be set up.
 * Owns: `params` is read during the call only (copy_arg and evict_arg are
 *       kept, borrowed until pdx_offload_destroy returns); *pool_p is the
 *       caller's, freed with pdx_offload_destroy; the pool owns the slab
 *       and the worker.
 * Blocks: yes: allocating the slab and index, and, with PREFAULT, faulting
 *       the whole slab in (time in proportion to the budget).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_create(const pdx_offload_params_t *params,
                                        pdx_offload_pool_h *pool_p);

/* Destroy a pool: the worker stops, the save it is copying completes, the
 * callback of every save still queued runs with PDX_ERR_CANCELED, then the
 * slab is unmapped. Every lease must have been released; live leases are
 * logged as an error (and leaked).
 *
 * @param [in] pool  The pool; NULL does nothing.
 * Owns: frees the pool, its slab and index; every address into the slab
 *       (lease blocks, reservations, pdx_offload_slab) is dead afterwards.
 * Blocks: yes: until the worker has exited (the copy in progress).
 * Threads: any thread but a callback of the pool's; no other call on the
 *       pool may be in progress; one that follows is refused as above
 *       (best effort).
 */
PDX_API void pdx_offload_destroy(pdx_offload_pool_h pool);

/* Longest prefix of keys[0..n) present in the pool. Hits refresh LRU
 * places: the prefix becomes the most recently used run of its class,
 * keys[0] most recent, so a prefix's tail is evicted before its root.
 * Blocks being saved (not yet committed) are not present. Counts hits and
 * misses.
 *
 * @param [in]  pool      The pool.
 * @param [in]  keys      n keys, each of length 1..32.
 * @param [in]  n         Keys.
 * @param [out] prefix_p  The prefix length.
 * @return PDX_OK; PDX_ERR_INVALID for a NULL argument or a key length out
 *         of range.
 * Owns: the caller keeps `keys` (read during the call only).
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_query(pdx_offload_pool_h pool,
                                       const pdx_offload_key_t *keys, size_t n,
                                       size_t *prefix_p);

/* As pdx_offload_query(), then pin the prefix: leased blocks are never
 * evicted nor overwritten until pdx_offload_release().
 *
 * @param [in]  pool     The pool.
 * @param [in]  keys     n keys.
 * @param [in]  n        Keys.
 * @param [out] lease_p  The lease, holding *count_p >= 1 blocks in key
 *                       order; written only on success.
 * @param [out] count_p  The blocks it pins; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND when keys[0] is absent (nothing
 *         leased, outputs untouched); PDX_ERR_NOMEM if the lease cannot be
 *         allocated; PDX_ERR_INVALID.
 * Owns: the caller keeps `keys`; *lease_p is the caller's, released
 *       exactly once with pdx_offload_release before the pool is
 *       destroyed.
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_lease(pdx_offload_pool_h pool,
                                       const pdx_offload_key_t *keys, size_t n,
                                       pdx_offload_lease_h *lease_p,
                                       size_t *count_p);

/* Number of blocks a lease pins.
 *
 * @param [in] lease  A live lease.
 * @return The count; 0 for NULL.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, while the lease is live.
 */
PDX_API size_t pdx_offload_lease_count(pdx_offload_lease_h lease);

/* Address of leased block `index` in the slab (block_bytes readable), for
 * zero-copy readers (e.g. a host-to-device DMA from a registered slab).
 *
 * @param [in]  pool    The pool.
 * @param [in]  lease   A live lease of this pool.
 * @param [in]  index   0..pdx_offload_lease_count()-1.
 * @param [out] addr_p  The block's address; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID (a lease of another pool, an index out
 *         of range).
 * Owns: the block is the pool's, readable until the lease is released;
 *       it must not be written.
 * Blocks: no.
 * Threads: any thread, while the lease is live.
 */
PDX_API pdx_status_t pdx_offload_lease_block(pdx_offload_pool_h pool,
                                             pdx_offload_lease_h lease,
                                             size_t index, const void **addr_p);

/* One copy of pdx_offload_load(): leased block `index` -> `dst`. */
typedef struct pdx_offload_load_item {
    size_t index; /* position in the lease, < pdx_offload_lease_count() */
    void *dst;    /* block_bytes writable bytes of the caller's */
} pdx_offload_load_item_t;

/* Copy leased blocks into the caller's memory (a scatter list: any subset,
 * any order, a block may be copied to several places). Every item is
 * checked before anything is copied. Several threads may load from the
 * same or different leases at once (e.g. each a slice of the items).
 *
 * @param [in] pool   The pool.
 * @param [in] lease  A live lease of this pool.
 * @param [in] items  n copies; destinations must not overlap the slab.
 * @param [in] n      Items.
 * @return PDX_OK; PDX_ERR_INVALID (an index out of range, a NULL
 *         destination or one overlapping the slab, a lease of another
 *         pool).
 * Owns: the caller keeps `items` and the destination memory.
 * Blocks: yes: for the copies (memcpy, or the pool's copy callback); no
 *       lock is held while copying.
 * Threads: any thread, while the lease is live.
 */
PDX_API pdx_status_t pdx_offload_load(pdx_offload_pool_h pool,
                                      pdx_offload_lease_h lease,
                                      const pdx_offload_load_item_t *items,
                                      size_t n);

/* Unpin a lease's blocks and free the lease; they return to the head of
 * their class's LRU (first block most recent).
 *
 * @param [in] pool   The pool.
 * @param [in] lease  A lease of this pool; NULL does nothing; one of
 *                    another pool is refused (logged, nothing released).
 * Owns: frees the lease; its block addresses are not the caller's to read
 *       any more.
 * Blocks: no (the pool lock).
 * Threads: any thread; no load from the lease may be running, and the
 *       lease must not be used afterwards.
 */
PDX_API void pdx_offload_release(pdx_offload_pool_h pool,
                                 pdx_offload_lease_h lease);

/* Store a block synchronously: copy block_bytes from `src` into a slot,
 * evicting if needed, and index it under `key` in class `cls`. A key
 * already present (or being saved) is a duplicate: its LRU place is
 * refreshed, its class kept, nothing copied.
 *
 * @param [in] pool  The pool.
 * @param [in] key   The block's key (1..32 bytes).
 * @param [in] src   block_bytes readable bytes.
 * @param [in] cls   PDX_OFFLOAD_RETAINED or PDX_OFFLOAD_RECLAIMABLE.
 * @return PDX_OK (stored or duplicate); PDX_ERR_NO_SPACE (counted) when
 *         every slot is leased or being filled; PDX_ERR_INVALID.
 * Owns: the caller keeps `key` and `src` (read during the call only).
 * Blocks: yes: for the copy (no lock is held while copying) and the
 *       eviction callbacks it runs.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_save(pdx_offload_pool_h pool,
                                      const pdx_offload_key_t *key,
                                      const void *src, pdx_offload_class_t cls);

/* Completion of an async save: status PDX_OK (stored or duplicate),
 * PDX_ERR_NO_SPACE, or PDX_ERR_CANCELED (pool destroyed first). Runs on the
 * worker thread (or inline without ASYNC_SAVE), exactly once per accepted
 * save, with no pool lock held; from then on `src` is the caller's again.
 * It may call pool functions that do not wait on the save queue (not
 * pdx_offload_flush(), pdx_offload_destroy(), nor save_async with
 * PDX_OFFLOAD_SAVE_WAIT). */
typedef void (*pdx_offload_save_cb_t)(void *arg, const pdx_offload_key_t *key,
                                      pdx_status_t status);

/* pdx_offload_save_async() flags. */
enum {
    /* When the queue is full, wait for room instead of dropping. */
    PDX_OFFLOAD_SAVE_WAIT = 1u << 0,
};

/* Queue a save of `src` under `key` and return; the worker copies the block
 * in later, as pdx_offload_save() would. When the queue is full the save
 * is dropped (counted in dropped_saves) unless `flags` has
 * PDX_OFFLOAD_SAVE_WAIT. Without ASYNC_SAVE it saves inline and returns
 * the save's status, the callback running before it returns.
 *
 * @param [in] pool    The pool.
 * @param [in] key     The block's key (copied into the entry).
 * @param [in] src     block_bytes readable bytes.
 * @param [in] cls     The block's class.
 * @param [in] flags   0 or PDX_OFFLOAD_SAVE_WAIT.
 * @param [in] cb      Runs once per accepted save; may be NULL.
 * @param [in] cb_arg  Passed to `cb`.
 * @return PDX_OK (queued); PDX_ERR_BUSY (queue full, dropped);
 *         PDX_ERR_CANCELED (the pool is being destroyed); PDX_ERR_INVALID;
 *         inline, as pdx_offload_save. On any error the callback never runs
 *         and `src` is free at once.
 * Owns: `src` is borrowed until the callback runs (or, with cb NULL, until
 *       a pdx_offload_flush() that covers it returns), and must stay
 *       unchanged until then; `key` is copied.
 * Blocks: no: the queue lock only, never lookups or copies; with
 *       PDX_OFFLOAD_SAVE_WAIT, until the worker takes an entry; inline, as
 *       pdx_offload_save.
 * Threads: any thread; with PDX_OFFLOAD_SAVE_WAIT not from a save or
 *       eviction callback.
 */
PDX_API pdx_status_t
pdx_offload_save_async(pdx_offload_pool_h pool, const pdx_offload_key_t *key,
                       const void *src, pdx_offload_class_t cls, uint32_t flags,
                       pdx_offload_save_cb_t cb, void *cb_arg);

/* Wait until every async save accepted before this call has completed (its
 * callback returned).
 *
 * @param [in] pool        The pool.
 * @param [in] timeout_ms  < 0 waits without limit; 0 polls.
 * @return PDX_OK; PDX_ERR_TIMEOUT if the deadline passes first.
 * Owns: nothing.
 * Blocks: yes: until those saves are done, at most timeout_ms (no limit
 *       when negative).
 * Threads: any thread but a save or eviction callback.
 */
PDX_API pdx_status_t pdx_offload_flush(pdx_offload_pool_h pool,
                                       int64_t timeout_ms);

/* A slot reserved for a zero-copy save. */
typedef struct pdx_offload_resv {
    void *dst;     /* block_bytes writable slab bytes */
    uint32_t slot; /* private */
    uint32_t gen;  /* private */
} pdx_offload_resv_t;

/* Reserve a slot for `key` (evicting if needed) for the caller to fill at
 * resv_p->dst, then publish it with pdx_offload_commit() or give it back
 * with pdx_offload_abort(), exactly once. Until then the block is invisible
 * to queries and is not evictable.
 *
 * @param [in]  pool    The pool.
 * @param [in]  key     The block's key.
 * @param [in]  cls     The block's class.
 * @param [out] resv_p  The reservation; written only on success.
 * @return PDX_OK; PDX_ERR_EXISTS if the key is present or being saved (its
 *         LRU place refreshed, class kept); PDX_ERR_NO_SPACE (counted) when
 *         every slot is pinned; PDX_ERR_INVALID.
 * Owns: the caller keeps `key`; resv_p->dst is the pool's slab, the
 *       caller's to write until the commit or abort.
 * Blocks: no (the pool lock), beyond the eviction callbacks it runs.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_reserve(pdx_offload_pool_h pool,
                                         const pdx_offload_key_t *key,
                                         pdx_offload_class_t cls,
                                         pdx_offload_resv_t *resv_p);

/* Publish a filled reservation: the block becomes present, most recently
 * used of its class.
 *
 * @param [in] pool  The pool.
 * @param [in] resv  A live reservation of this pool.
 * @return PDX_OK; PDX_ERR_INVALID for a reservation that is not live.
 * Owns: the slot is the pool's again.
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_commit(pdx_offload_pool_h pool,
                                        const pdx_offload_resv_t *resv);

/* Drop a reservation; the slot becomes free.
 *
 * @param [in] pool  The pool.
 * @param [in] resv  A live reservation of this pool.
 * @return PDX_OK; PDX_ERR_INVALID for a reservation that is not live.
 * Owns: the slot is the pool's again.
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_abort(pdx_offload_pool_h pool,
                                       const pdx_offload_resv_t *resv);

/* Owner hint: another live holder of the block appeared (e.g. a peer rank
 * that has it). When a retained block reaches demote_owners owners it is
 * demoted to reclaimable. Counts start at 0 when a block is stored and are
 * forgotten when it is evicted.
 *
 * @param [in] pool  The pool.
 * @param [in] key   The block's key.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if the key is not present.
 * Owns: the caller keeps `key`.
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_add_owner(pdx_offload_pool_h pool,
                                           const pdx_offload_key_t *key);

/* Owner hint: a holder of the block went away. Dropping owners never
 * promotes a block back; at 0 it stays at 0.
 *
 * @param [in] pool  The pool.
 * @param [in] key   The block's key.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if the key is not present.
 * Owns: the caller keeps `key`.
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_drop_owner(pdx_offload_pool_h pool,
                                            const pdx_offload_key_t *key);

/* Class of a present block. Does not count as a use (no LRU refresh, no
 * hit).
 *
 * @param [in]  pool   The pool.
 * @param [in]  key    The block's key.
 * @param [out] cls_p  Its class; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if absent.
 * Owns: the caller keeps `key`.
 * Blocks: no (the pool lock).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_class_of(pdx_offload_pool_h pool,
                                          const pdx_offload_key_t *key,
                                          pdx_offload_class_t *cls_p);

/* Walk the keys of the blocks present (committed), in pieces, like a
 * SCAN. A call looks at a bounded number of slots (the pool lock is held
 * for one piece only), so it may return fewer than `max` keys, even none,
 * before the end. Blocks saved or evicted during a walk may or may not be
 * reported; a block present from its start to its end is reported exactly
 * once. No LRU refresh, no hit counted. Lets an owner registry register
 * every block again (e.g. after its lease was lost).
 *
 * @param [in]     pool      The pool.
 * @param [in,out] cursor_p  0 to start; where the next call goes on, or 0
 *                           when the walk is over.
 * @param [out]    keys      Up to `max` keys.
 * @param [in]     max       Entries of `keys` (> 0).
 * @param [out]    n_p       How many were written.
 * @return PDX_OK; PDX_ERR_INVALID for max 0.
 * Owns: the caller keeps `keys`.
 * Blocks: no (the pool lock, for at most 16384 slots).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_keys(pdx_offload_pool_h pool,
                                      uint64_t *cursor_p,
                                      pdx_offload_key_t *keys, size_t max,
                                      size_t *n_p);

/* The slab, for registering it with a transport or cudaHostRegister.
 *
 * @param [in]  pool    The pool.
 * @param [out] addr_p  Its address.
 * @param [out] len_p   Its length in bytes.
 * @return PDX_OK.
 * Owns: the slab is the pool's, mapped until pdx_offload_destroy (register
 *       it, never free it).
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_slab(pdx_offload_pool_h pool, void **addr_p,
                                      size_t *len_p);

/* Snapshot of the counters.
 *
 * @param [in]  pool     The pool.
 * @param [out] stats_p  Filled.
 * @return PDX_OK.
 * Owns: the caller keeps *stats_p.
 * Blocks: no (the pool and queue locks).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_offload_stats(pdx_offload_pool_h pool,
                                       pdx_offload_stats_t *stats_p);

#ifdef __cplusplus
}
#endif
#endif
