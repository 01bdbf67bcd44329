/* Private to the offload pool (kv_offload.c, kv_offload_admin.c): its
 * slot metadata, index entries, LRUs, save queue and the pool object. */
#ifndef PDX_KV_OFFLOAD_INT_H
#define PDX_KV_OFFLOAD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>

#include <pdx/kv_offload.h>

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

/* kv_offload.c: the thread that runs queued saves (started by create). */
void *kvo_save_worker(void *arg);

#endif
