/* Offload tier tests: eviction order, LRU refresh, leases, owner hints,
 * prefix queries, pure-L2 restore, async saves, budgets, and threads. */
#include <pdx/kv_offload.h>
#include <pdx/log.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define BLK 256u

/* ---- helpers ----------------------------------------------------------- */

/* A key whose bytes derive from `id` (ids, not random hashes: the pool must
 * cope with non-uniform keys too). */
static pdx_offload_key_t key_of(uint64_t id)
{
    pdx_offload_key_t k;
    memset(&k, 0, sizeof(k));
    k.len = 16;
    memcpy(k.bytes, &id, sizeof(id));
    memcpy(k.bytes + 8, "pdx-kv16", 8);
    return k;
}

/* Deterministic payload of block `id`. */
static void fill_block(uint8_t *p, size_t len, uint64_t id)
{
    uint64_t x = id * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

static int block_is(const uint8_t *p, size_t len, uint64_t id)
{
    uint8_t *want = malloc(len);
    int ok;
    fill_block(want, len, id);
    ok = memcmp(p, want, len) == 0;
    free(want);
    return ok;
}

static pdx_offload_pool_h make_pool(uint64_t nblocks, uint64_t block_bytes,
                                    uint32_t flags)
{
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS,
        .budget_bytes = nblocks * ((block_bytes + 63) / 64 * 64),
        .block_bytes = block_bytes,
        .flags = flags,
    };
    pdx_offload_pool_h pool = NULL;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    assert_non_null(pool);
    return pool;
}

static void save_id(pdx_offload_pool_h pool, uint64_t id,
                    pdx_offload_class_t cls)
{
    uint8_t buf[BLK];
    pdx_offload_key_t k = key_of(id);
    fill_block(buf, sizeof(buf), id);
    assert_int_equal(pdx_offload_save(pool, &k, buf, cls), PDX_OK);
}

static int has(pdx_offload_pool_h pool, uint64_t id)
{
    pdx_offload_class_t c;
    pdx_offload_key_t k = key_of(id);
    return pdx_offload_class_of(pool, &k, &c) == PDX_OK;
}

static pdx_offload_class_t class_of(pdx_offload_pool_h pool, uint64_t id)
{
    pdx_offload_class_t c = (pdx_offload_class_t)99;
    pdx_offload_key_t k = key_of(id);
    assert_int_equal(pdx_offload_class_of(pool, &k, &c), PDX_OK);
    return c;
}

static size_t query_ids(pdx_offload_pool_h pool, const uint64_t *ids, size_t n)
{
    pdx_offload_key_t keys[64];
    size_t prefix = 12345;
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) {
        keys[i] = key_of(ids[i]);
    }
    assert_int_equal(pdx_offload_query(pool, keys, n, &prefix), PDX_OK);
    return prefix;
}

static pdx_offload_stats_t stats_of(pdx_offload_pool_h pool)
{
    pdx_offload_stats_t s;
    assert_int_equal(pdx_offload_stats(pool, &s), PDX_OK);
    return s;
}

/* Log capture, to check that config errors say why. Installed once for the
 * whole run (libpdx keeps replaced sinks alive on purpose); echoes lines to
 * stderr except while a test expects errors. */
static char g_last_log[512];
static atomic_int g_quiet;

static void capture_log(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg;
    (void)level;
    if (atomic_load(&g_quiet)) {
        snprintf(g_last_log, sizeof(g_last_log), "%s", msg);
    } else {
        fprintf(stderr, "pdx: %s\n", msg);
    }
}

/* ---- parameters and budgets -------------------------------------------- */

static void test_bad_params(void **state)
{
    pdx_offload_pool_h pool = (pdx_offload_pool_h)0x1;
    pdx_offload_params_t p = {
        .field_mask =
            PDX_OFFLOAD_PARAM_BUDGET_BYTES | PDX_OFFLOAD_PARAM_BLOCK_BYTES,
        .budget_bytes = 1 << 20,
        .block_bytes = 4096,
    };
    (void)state;

    atomic_store(&g_quiet, 1);
    assert_int_equal(pdx_offload_create(NULL, &pool), PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_create(&p, NULL), PDX_ERR_INVALID);

    p.field_mask = PDX_OFFLOAD_PARAM_BLOCK_BYTES; /* no budget */
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_INVALID);
    p.field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES; /* no block size */
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_INVALID);

    p.field_mask |= PDX_OFFLOAD_PARAM_BLOCK_BYTES;
    p.block_bytes = 0;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_INVALID);
    p.block_bytes = 4096;

    p.field_mask |= PDX_OFFLOAD_PARAM_NRANKS_PER_HOST;
    p.nranks_per_host = 0;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_INVALID);
    p.nranks_per_host = 1;

    p.field_mask |= PDX_OFFLOAD_PARAM_QUEUE_DEPTH;
    p.queue_depth = 0;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_INVALID);
    p.queue_depth = 8;

    p.field_mask |= PDX_OFFLOAD_PARAM_DEMOTE_OWNERS;
    p.demote_owners = 0;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_INVALID);
    p.demote_owners = 3;

    /* A budget below one block is a configuration error that says so. */
    p.budget_bytes = 3000;
    g_last_log[0] = '\0';
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_CONFIG);
    assert_non_null(strstr(g_last_log, "holds no block"));

    /* So is one that the rank split takes below one block. */
    p.budget_bytes = 8 * 4096;
    p.nranks_per_host = 9;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_CONFIG);
    assert_non_null(strstr(g_last_log, "/ 9 ranks"));

    /* Over 2^30 blocks per rank. */
    p.nranks_per_host = 1;
    p.block_bytes = 1;
    p.budget_bytes = (1ull << 36) + 64;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_ERR_TOO_LARGE);

    assert_ptr_equal(pool, (pdx_offload_pool_h)0x1); /* never written */
    atomic_store(&g_quiet, 0);
}

static void test_budget_split(void **state)
{
    pdx_offload_params_t p = {
        .field_mask =
            PDX_OFFLOAD_PARAM_BUDGET_BYTES | PDX_OFFLOAD_PARAM_BLOCK_BYTES |
            PDX_OFFLOAD_PARAM_NRANKS_PER_HOST | PDX_OFFLOAD_PARAM_FLAGS,
        .budget_bytes = 8 * 3502592ull + 100,
        .block_bytes = 3502592,
        .nranks_per_host = 8,
        .flags = 0,
    };
    pdx_offload_pool_h pool;
    pdx_offload_stats_t s;
    void *slab;
    size_t len;
    (void)state;

    /* GLM-5.2 blocks, 8 ranks: exactly one block each. */
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    s = stats_of(pool);
    assert_int_equal(s.capacity_blocks, 1);
    assert_int_equal(s.slot_bytes, 3502592);
    assert_int_equal(pdx_offload_slab(pool, &slab, &len), PDX_OK);
    assert_int_equal(len, 3502592);
    pdx_offload_destroy(pool);

    /* 2 ranks share 40 slots of a 100-byte block (128-byte slots). */
    p.block_bytes = 100;
    p.budget_bytes = 40 * 128 + 127;
    p.nranks_per_host = 2;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    s = stats_of(pool);
    assert_int_equal(s.capacity_blocks, 20);
    assert_int_equal(s.slot_bytes, 128);
    assert_int_equal(s.block_bytes, 100);
    assert_int_equal(s.slab_bytes, 20 * 128);
    assert_true(s.index_bytes_per_block >= 64 + 16);
    pdx_offload_destroy(pool);

    /* Default: one rank. */
    p.field_mask &= ~(uint64_t)PDX_OFFLOAD_PARAM_NRANKS_PER_HOST;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    assert_int_equal(stats_of(pool).capacity_blocks, 40);
    pdx_offload_destroy(pool);
    pdx_offload_destroy(NULL);
}

static void test_bad_args(void **state)
{
    pdx_offload_pool_h pool = make_pool(4, BLK, 0);
    pdx_offload_key_t k = key_of(1), bad = key_of(2);
    uint8_t buf[BLK] = {0};
    size_t prefix = 77;
    pdx_offload_lease_h lease = NULL;
    (void)state;

    bad.len = 0;
    assert_int_equal(pdx_offload_save(pool, &bad, buf, PDX_OFFLOAD_RETAINED),
                     PDX_ERR_INVALID);
    bad.len = 33;
    assert_int_equal(pdx_offload_query(pool, &bad, 1, &prefix),
                     PDX_ERR_INVALID);
    assert_int_equal(prefix, 77);
    assert_int_equal(pdx_offload_save(pool, &k, NULL, PDX_OFFLOAD_RETAINED),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_save(pool, &k, buf, (pdx_offload_class_t)7),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_save(NULL, &k, buf, PDX_OFFLOAD_RETAINED),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_query(pool, NULL, 0, &prefix), PDX_OK);
    assert_int_equal(prefix, 0);

    /* Loads are checked before any copy: bad index, NULL, into the slab. */
    assert_int_equal(pdx_offload_save(pool, &k, buf, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    size_t count = 0;
    assert_int_equal(pdx_offload_lease(pool, &k, 1, &lease, &count), PDX_OK);
    void *slab;
    size_t len;
    assert_int_equal(pdx_offload_slab(pool, &slab, &len), PDX_OK);
    pdx_offload_load_item_t it[2] = {{0, buf}, {1, buf}};
    assert_int_equal(pdx_offload_load(pool, lease, it, 2), PDX_ERR_INVALID);
    it[1].index = 0;
    it[1].dst = NULL;
    assert_int_equal(pdx_offload_load(pool, lease, it, 2), PDX_ERR_INVALID);
    it[1].dst = (uint8_t *)slab + BLK;
    assert_int_equal(pdx_offload_load(pool, lease, it, 2), PDX_ERR_INVALID);
    assert_int_equal(stats_of(pool).bytes_loaded, 0);
    const void *addr = NULL;
    assert_int_equal(pdx_offload_lease_block(pool, lease, 1, &addr),
                     PDX_ERR_INVALID);
    pdx_offload_release(pool, lease);
    pdx_offload_release(pool, NULL);
    pdx_offload_destroy(pool);
}

/* ---- eviction and LRU -------------------------------------------------- */

static void test_eviction_order(void **state)
{
    pdx_offload_pool_h pool = make_pool(4, BLK, 0);
    pdx_offload_stats_t s;
    (void)state;

    save_id(pool, 1, PDX_OFFLOAD_RETAINED);
    save_id(pool, 2, PDX_OFFLOAD_RECLAIMABLE);
    save_id(pool, 3, PDX_OFFLOAD_RETAINED);
    save_id(pool, 4, PDX_OFFLOAD_RECLAIMABLE);
    s = stats_of(pool);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RETAINED], 2);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RECLAIMABLE], 2);

    /* Reclaimable LRU first (2, then 4), though retained 1 is older. */
    save_id(pool, 5, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 2));
    assert_true(has(pool, 1) && has(pool, 4));
    save_id(pool, 6, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 4));
    s = stats_of(pool);
    assert_int_equal(s.evictions[PDX_OFFLOAD_RECLAIMABLE], 2);
    assert_int_equal(s.evictions[PDX_OFFLOAD_RETAINED], 0);

    /* Then the retained LRU, oldest first: 1, 3. */
    save_id(pool, 7, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 1));
    assert_true(has(pool, 3));
    save_id(pool, 8, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 3));
    assert_true(has(pool, 5) && has(pool, 6) && has(pool, 7) && has(pool, 8));
    s = stats_of(pool);
    assert_int_equal(s.evictions[PDX_OFFLOAD_RETAINED], 2);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RETAINED], 4);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RECLAIMABLE], 0);

    /* A fresh reclaimable block goes before every retained one. */
    save_id(pool, 9, PDX_OFFLOAD_RECLAIMABLE);
    assert_false(has(pool, 5));
    save_id(pool, 10, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 9));
    assert_true(has(pool, 6));
    pdx_offload_destroy(pool);
}

static void test_lru_refresh(void **state)
{
    pdx_offload_pool_h pool = make_pool(3, BLK, 0);
    uint64_t a = 1, b = 2, c = 3;
    (void)state;

    save_id(pool, a, PDX_OFFLOAD_RETAINED);
    save_id(pool, b, PDX_OFFLOAD_RETAINED);
    save_id(pool, c, PDX_OFFLOAD_RETAINED);
    /* A hit moves a to the head: b is now the LRU tail. */
    assert_int_equal(query_ids(pool, &a, 1), 1);
    save_id(pool, 4, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, b));
    assert_true(has(pool, a));

    /* A duplicate insert refreshes c and keeps its class (asked
     * reclaimable, stays retained). LRU is now a, 4, c -> tail a. */
    save_id(pool, c, PDX_OFFLOAD_RECLAIMABLE);
    assert_int_equal(class_of(pool, c), PDX_OFFLOAD_RETAINED);
    assert_int_equal(stats_of(pool).dup_saves, 1);
    save_id(pool, 5, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, a));
    assert_true(has(pool, c) && has(pool, 4));

    /* And the reverse: a reclaimable block stays reclaimable. */
    save_id(pool, 6, PDX_OFFLOAD_RECLAIMABLE);
    save_id(pool, 6, PDX_OFFLOAD_RETAINED);
    assert_int_equal(class_of(pool, 6), PDX_OFFLOAD_RECLAIMABLE);
    assert_int_equal(stats_of(pool).blocks[PDX_OFFLOAD_RECLAIMABLE], 1);
    pdx_offload_destroy(pool);
}

/* A query refreshes its prefix as a run, root most recent, so the tail of a
 * prefix is evicted before its root. */
static void test_prefix_refresh_order(void **state)
{
    pdx_offload_pool_h pool = make_pool(3, BLK, 0);
    uint64_t ids[3] = {10, 11, 12};
    (void)state;

    for (int i = 2; i >= 0; i--) { /* saved deepest first: 10 is MRU */
        save_id(pool, ids[i], PDX_OFFLOAD_RETAINED);
    }
    assert_int_equal(query_ids(pool, ids, 3), 3);
    save_id(pool, 13, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 12));
    save_id(pool, 14, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 11));
    assert_true(has(pool, 10));
    pdx_offload_destroy(pool);
}

static void test_longest_prefix(void **state)
{
    pdx_offload_pool_h pool = make_pool(16, BLK, 0);
    uint64_t ids[6] = {100, 101, 102, 103, 104, 105};
    pdx_offload_key_t keys[6];
    pdx_offload_lease_h lease = NULL;
    size_t count = 0;
    pdx_offload_stats_t s;
    (void)state;

    for (int i = 0; i < 6; i++) {
        keys[i] = key_of(ids[i]);
        if (i != 3) {
            save_id(pool, ids[i], PDX_OFFLOAD_RETAINED);
        }
    }
    assert_int_equal(query_ids(pool, ids, 6), 3);
    assert_int_equal(query_ids(pool, ids + 3, 3), 0);
    assert_int_equal(query_ids(pool, ids + 4, 2), 2);
    assert_int_equal(query_ids(pool, ids, 2), 2);
    s = stats_of(pool);
    assert_int_equal(s.hits, 3 + 0 + 2 + 2);
    assert_int_equal(s.misses, 3 + 3 + 0 + 0);

    assert_int_equal(pdx_offload_lease(pool, keys, 6, &lease, &count), PDX_OK);
    assert_int_equal(count, 3);
    assert_int_equal(pdx_offload_lease_count(lease), 3);
    assert_int_equal(stats_of(pool).leased_blocks, 3);
    pdx_offload_release(pool, lease);
    assert_int_equal(stats_of(pool).leased_blocks, 0);

    lease = (pdx_offload_lease_h)0x1;
    count = 99;
    assert_int_equal(pdx_offload_lease(pool, keys + 3, 3, &lease, &count),
                     PDX_ERR_NOT_FOUND);
    assert_ptr_equal(lease, (pdx_offload_lease_h)0x1);
    assert_int_equal(count, 99);

    /* Keys that share their first 8 bytes (the index key) and differ
     * later, and short keys, are distinct blocks. */
    pdx_offload_key_t x = key_of(7), y = key_of(7), z;
    uint8_t bx[BLK], by[BLK], bz[BLK], out[BLK];
    y.bytes[15] ^= 1;
    memset(&z, 0, sizeof(z));
    z.len = 3;
    memcpy(z.bytes, "abc", 3);
    fill_block(bx, BLK, 1);
    fill_block(by, BLK, 2);
    fill_block(bz, BLK, 3);
    assert_int_equal(pdx_offload_save(pool, &x, bx, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    assert_int_equal(pdx_offload_save(pool, &y, by, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    assert_int_equal(pdx_offload_save(pool, &z, bz, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    pdx_offload_key_t xyz[3] = {y, x, z};
    assert_int_equal(pdx_offload_lease(pool, xyz, 3, &lease, &count), PDX_OK);
    assert_int_equal(count, 3);
    pdx_offload_load_item_t it = {0, out};
    assert_int_equal(pdx_offload_load(pool, lease, &it, 1), PDX_OK);
    assert_true(block_is(out, BLK, 2));
    it.index = 2;
    assert_int_equal(pdx_offload_load(pool, lease, &it, 1), PDX_OK);
    assert_true(block_is(out, BLK, 3));
    pdx_offload_release(pool, lease);
    /* Bytes past len do not matter. */
    z.bytes[20] = 0xee;
    assert_int_equal(pdx_offload_query(pool, &z, 1, &count), PDX_OK);
    assert_int_equal(count, 1);
    pdx_offload_destroy(pool);
}

/* ---- leases ------------------------------------------------------------ */

static void test_leases_block_eviction(void **state)
{
    pdx_offload_pool_h pool = make_pool(2, BLK, 0);
    pdx_offload_key_t ka = key_of(1), kc = key_of(3), kd = key_of(4);
    pdx_offload_lease_h la, lc;
    size_t count;
    uint8_t buf[BLK], out[BLK];
    pdx_offload_resv_t r;
    (void)state;

    save_id(pool, 1, PDX_OFFLOAD_RECLAIMABLE);
    save_id(pool, 2, PDX_OFFLOAD_RETAINED);
    /* a is the reclaimable LRU tail, but leased: b goes instead. */
    assert_int_equal(pdx_offload_lease(pool, &ka, 1, &la, &count), PDX_OK);
    save_id(pool, 3, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 2));
    assert_true(has(pool, 1));

    /* Everything leased: saves fail with NO_SPACE, counted. */
    assert_int_equal(pdx_offload_lease(pool, &kc, 1, &lc, &count), PDX_OK);
    fill_block(buf, BLK, 4);
    assert_int_equal(pdx_offload_save(pool, &kd, buf, PDX_OFFLOAD_RETAINED),
                     PDX_ERR_NO_SPACE);
    assert_int_equal(pdx_offload_reserve(pool, &kd, PDX_OFFLOAD_RETAINED, &r),
                     PDX_ERR_NO_SPACE);
    assert_int_equal(stats_of(pool).no_space, 2);

    /* A second lease on a block: it stays pinned until both go. */
    pdx_offload_lease_h la2;
    assert_int_equal(pdx_offload_lease(pool, &ka, 1, &la2, &count), PDX_OK);
    pdx_offload_release(pool, la);
    assert_int_equal(pdx_offload_save(pool, &kd, buf, PDX_OFFLOAD_RETAINED),
                     PDX_ERR_NO_SPACE);
    pdx_offload_load_item_t it = {0, out};
    assert_int_equal(pdx_offload_load(pool, la2, &it, 1), PDX_OK);
    assert_true(block_is(out, BLK, 1));
    pdx_offload_release(pool, la2);

    /* Released: a (reclaimable) is evictable again and goes first. */
    assert_int_equal(pdx_offload_save(pool, &kd, buf, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    assert_false(has(pool, 1));
    assert_true(has(pool, 3) && has(pool, 4));
    pdx_offload_release(pool, lc);
    pdx_offload_destroy(pool);
}

static void test_reserve_commit(void **state)
{
    pdx_offload_pool_h pool = make_pool(2, BLK, 0);
    pdx_offload_key_t k = key_of(1), k2 = key_of(2);
    pdx_offload_resv_t r, r2;
    size_t prefix;
    uint8_t out[BLK];
    pdx_offload_lease_h lease;
    (void)state;

    assert_int_equal(pdx_offload_reserve(pool, &k, PDX_OFFLOAD_RETAINED, &r),
                     PDX_OK);
    /* Invisible while filling, and a duplicate of it is refused. */
    assert_int_equal(pdx_offload_query(pool, &k, 1, &prefix), PDX_OK);
    assert_int_equal(prefix, 0);
    assert_int_equal(pdx_offload_reserve(pool, &k, PDX_OFFLOAD_RETAINED, &r2),
                     PDX_ERR_EXISTS);
    assert_int_equal(stats_of(pool).filling_blocks, 1);
    fill_block(r.dst, BLK, 1);
    assert_int_equal(pdx_offload_commit(pool, &r), PDX_OK);
    assert_int_equal(pdx_offload_commit(pool, &r), PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_abort(pool, &r), PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_lease(pool, &k, 1, &lease, &prefix), PDX_OK);
    const void *addr;
    assert_int_equal(pdx_offload_lease_block(pool, lease, 0, &addr), PDX_OK);
    assert_true(block_is(addr, BLK, 1));
    pdx_offload_load_item_t it = {0, out};
    assert_int_equal(pdx_offload_load(pool, lease, &it, 1), PDX_OK);
    assert_true(block_is(out, BLK, 1));
    pdx_offload_release(pool, lease);

    /* A filling slot is not evictable; an aborted one is free again. */
    assert_int_equal(pdx_offload_reserve(pool, &k2, PDX_OFFLOAD_RETAINED, &r2),
                     PDX_OK);
    save_id(pool, 3, PDX_OFFLOAD_RETAINED); /* evicts 1, not the filling 2 */
    assert_false(has(pool, 1));
    assert_int_equal(pdx_offload_abort(pool, &r2), PDX_OK);
    assert_int_equal(pdx_offload_query(pool, &k2, 1, &prefix), PDX_OK);
    assert_int_equal(prefix, 0);
    save_id(pool, 4, PDX_OFFLOAD_RETAINED);
    assert_true(has(pool, 3) && has(pool, 4));
    pdx_offload_stats_t s = stats_of(pool);
    assert_int_equal(s.filling_blocks, 0);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RETAINED], 2);
    pdx_offload_destroy(pool);
}

/* ---- eviction callback, key walk ---------------------------------------- */

typedef struct evict_log {
    pdx_offload_pool_h pool;
    uint64_t ids[16];
    pdx_offload_class_t cls[16];
    int n;
    int absent; /* the key was gone from the pool when reported */
} evict_log_t;

static void on_evict(void *arg, const pdx_offload_key_t *key,
                     pdx_offload_class_t cls)
{
    evict_log_t *l = arg;
    uint64_t id;
    pdx_offload_class_t c;
    memcpy(&id, key->bytes, sizeof(id));
    /* No pool lock held: pool calls work, and the block is already gone. */
    l->absent += pdx_offload_class_of(l->pool, key, &c) == PDX_ERR_NOT_FOUND;
    if (l->n < 16) {
        l->ids[l->n] = id;
        l->cls[l->n] = cls;
    }
    l->n++;
}

static void test_evict_callback(void **state)
{
    evict_log_t log = {0};
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS |
                      PDX_OFFLOAD_PARAM_EVICT,
        .budget_bytes = 3 * BLK, .block_bytes = BLK,
        .flags = PDX_OFFLOAD_FLAG_ASYNC_SAVE, .evict_cb = on_evict,
        .evict_arg = &log};
    pdx_offload_pool_h pool = NULL;
    pdx_offload_resv_t r;
    uint8_t buf[BLK];
    (void)state;

    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    log.pool = pool;
    save_id(pool, 1, PDX_OFFLOAD_RETAINED);
    save_id(pool, 2, PDX_OFFLOAD_RECLAIMABLE);
    save_id(pool, 3, PDX_OFFLOAD_RETAINED);
    save_id(pool, 3, PDX_OFFLOAD_RETAINED); /* duplicate: nothing evicted */
    assert_int_equal(log.n, 0);
    save_id(pool, 4, PDX_OFFLOAD_RETAINED); /* evicts 2 (reclaimable) */
    assert_int_equal(log.n, 1);
    assert_int_equal(log.ids[0], 2);
    assert_int_equal(log.cls[0], PDX_OFFLOAD_RECLAIMABLE);
    /* A reservation that makes room reports too (retained 1). */
    pdx_offload_key_t k5 = key_of(5);
    assert_int_equal(pdx_offload_reserve(pool, &k5, PDX_OFFLOAD_RETAINED, &r),
                     PDX_OK);
    assert_int_equal(log.n, 2);
    assert_int_equal(log.ids[1], 1);
    assert_int_equal(log.cls[1], PDX_OFFLOAD_RETAINED);
    fill_block(r.dst, BLK, 5);
    assert_int_equal(pdx_offload_commit(pool, &r), PDX_OK);
    /* Async saves report on the worker, before the save is complete. */
    pdx_offload_key_t k6 = key_of(6);
    fill_block(buf, BLK, 6);
    assert_int_equal(pdx_offload_save_async(pool, &k6, buf,
                                            PDX_OFFLOAD_RETAINED, 0, NULL,
                                            NULL),
                     PDX_OK);
    assert_int_equal(pdx_offload_flush(pool, 5000), PDX_OK);
    assert_int_equal(log.n, 3);
    assert_int_equal(log.ids[2], 3);
    assert_int_equal(log.absent, 3);
    assert_int_equal(stats_of(pool).evictions[PDX_OFFLOAD_RETAINED] +
                         stats_of(pool).evictions[PDX_OFFLOAD_RECLAIMABLE],
                     3);

    /* The walk reports what is present (4, 5, 6), each once, whatever the
     * piece size. */
    for (size_t max = 1; max <= 4; max++) {
        pdx_offload_key_t keys[4];
        uint64_t cursor = 0, seen = 0;
        int calls = 0;
        do {
            size_t n = 99;
            assert_int_equal(pdx_offload_keys(pool, &cursor, keys, max, &n),
                             PDX_OK);
            assert_true(n <= max);
            for (size_t i = 0; i < n; i++) {
                uint64_t id;
                memcpy(&id, keys[i].bytes, sizeof(id));
                assert_int_equal(keys[i].len, 16);
                assert_true(id >= 4 && id <= 6);
                assert_false(seen & (1ull << id));
                seen |= 1ull << id;
            }
        } while (cursor != 0 && ++calls < 100);
        assert_int_equal(seen, (1ull << 4) | (1ull << 5) | (1ull << 6));
    }
    uint64_t cursor = 0;
    size_t n = 0;
    pdx_offload_key_t one;
    atomic_store(&g_quiet, 1);
    assert_int_equal(pdx_offload_keys(pool, &cursor, &one, 0, &n),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_keys(NULL, &cursor, &one, 1, &n),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_offload_keys(pool, &cursor, NULL, 1, &n),
                     PDX_ERR_INVALID);
    atomic_store(&g_quiet, 0);
    pdx_offload_destroy(pool); /* dropped blocks are not reported */
    assert_int_equal(log.n, 3);
}

/* ---- owner hints ------------------------------------------------------- */

static void test_owner_demotion(void **state)
{
    pdx_offload_pool_h pool = make_pool(3, BLK, 0);
    pdx_offload_key_t ka = key_of(1), kx = key_of(99);
    pdx_offload_stats_t s;
    (void)state;

    save_id(pool, 1, PDX_OFFLOAD_RETAINED);
    save_id(pool, 2, PDX_OFFLOAD_RETAINED);
    save_id(pool, 3, PDX_OFFLOAD_RETAINED);
    assert_int_equal(pdx_offload_add_owner(pool, &kx), PDX_ERR_NOT_FOUND);
    assert_int_equal(pdx_offload_add_owner(pool, &ka), PDX_OK);
    assert_int_equal(pdx_offload_add_owner(pool, &ka), PDX_OK);
    assert_int_equal(class_of(pool, 1), PDX_OFFLOAD_RETAINED);
    /* Two owners, one goes, two again: still retained. */
    assert_int_equal(pdx_offload_drop_owner(pool, &ka), PDX_OK);
    assert_int_equal(pdx_offload_add_owner(pool, &ka), PDX_OK);
    assert_int_equal(class_of(pool, 1), PDX_OFFLOAD_RETAINED);
    /* The third live owner demotes it. */
    assert_int_equal(pdx_offload_add_owner(pool, &ka), PDX_OK);
    assert_int_equal(class_of(pool, 1), PDX_OFFLOAD_RECLAIMABLE);
    s = stats_of(pool);
    assert_int_equal(s.demotions, 1);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RETAINED], 2);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RECLAIMABLE], 1);
    /* Owners leaving never promote it back. */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(pdx_offload_drop_owner(pool, &ka), PDX_OK);
    }
    assert_int_equal(class_of(pool, 1), PDX_OFFLOAD_RECLAIMABLE);
    /* Demoted, it is evicted before the older retained 2. */
    assert_int_equal(query_ids(pool, (uint64_t[]){1}, 1), 1);
    save_id(pool, 4, PDX_OFFLOAD_RETAINED);
    assert_false(has(pool, 1));
    assert_true(has(pool, 2));

    /* A demotion while leased takes effect in place; release links it into
     * the reclaimable LRU. */
    pdx_offload_key_t k2 = key_of(2);
    pdx_offload_lease_h lease;
    size_t count;
    assert_int_equal(pdx_offload_lease(pool, &k2, 1, &lease, &count), PDX_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pdx_offload_add_owner(pool, &k2), PDX_OK);
    }
    assert_int_equal(class_of(pool, 2), PDX_OFFLOAD_RECLAIMABLE);
    save_id(pool, 5, PDX_OFFLOAD_RETAINED); /* evicts retained 3 */
    assert_false(has(pool, 3));
    pdx_offload_release(pool, lease);
    save_id(pool, 6, PDX_OFFLOAD_RETAINED); /* now 2 goes first */
    assert_false(has(pool, 2));
    assert_true(has(pool, 4) && has(pool, 5) && has(pool, 6));
    pdx_offload_destroy(pool);
}

/* ---- pure-L2 restore --------------------------------------------------- */

#define L2_BLOCKS 48
#define L2_BLK 12345 /* not a multiple of 64 */

static void test_pure_l2_restore(void **state)
{
    pdx_offload_pool_h pool =
        make_pool(L2_BLOCKS, L2_BLK,
                  PDX_OFFLOAD_FLAG_ASYNC_SAVE | PDX_OFFLOAD_FLAG_HUGEPAGE);
    uint8_t *arena = malloc((size_t)L2_BLOCKS * L2_BLK);
    pdx_offload_key_t keys[L2_BLOCKS];
    pdx_offload_load_item_t items[L2_BLOCKS];
    pdx_offload_lease_h lease;
    size_t count = 0;
    (void)state;

    assert_non_null(arena);
    /* The caller's arena: block b of the request at arena slot (b*7)%48,
     * as a paged KV cache scatters them. */
    for (uint32_t b = 0; b < L2_BLOCKS; b++) {
        keys[b] = key_of(5000 + b);
        fill_block(arena + (size_t)((b * 7) % L2_BLOCKS) * L2_BLK, L2_BLK,
                   5000 + b);
        assert_int_equal(
            pdx_offload_save_async(
                pool, &keys[b], arena + (size_t)((b * 7) % L2_BLOCKS) * L2_BLK,
                PDX_OFFLOAD_RETAINED, PDX_OFFLOAD_SAVE_WAIT, NULL, NULL),
            PDX_OK);
    }
    assert_int_equal(pdx_offload_flush(pool, 10000), PDX_OK);

    /* No local prefix cache: the arena is wiped (reused by others). */
    memset(arena, 0xa5, (size_t)L2_BLOCKS * L2_BLK);

    assert_int_equal(pdx_offload_lease(pool, keys, L2_BLOCKS, &lease, &count),
                     PDX_OK);
    assert_int_equal(count, L2_BLOCKS);
    /* Restore into other arena slots, in reverse, as a scatter list. */
    for (uint32_t b = 0; b < L2_BLOCKS; b++) {
        items[b].index = L2_BLOCKS - 1 - b;
        items[b].dst =
            arena + (size_t)(((L2_BLOCKS - 1 - b) * 5) % L2_BLOCKS) * L2_BLK;
    }
    assert_int_equal(pdx_offload_load(pool, lease, items, L2_BLOCKS), PDX_OK);
    pdx_offload_release(pool, lease);
    for (uint32_t b = 0; b < L2_BLOCKS; b++) {
        assert_true(block_is(arena + (size_t)((b * 5) % L2_BLOCKS) * L2_BLK,
                             L2_BLK, 5000 + b));
    }
    pdx_offload_stats_t s = stats_of(pool);
    assert_int_equal(s.saves, L2_BLOCKS);
    assert_int_equal(s.bytes_saved, (uint64_t)L2_BLOCKS * L2_BLK);
    assert_int_equal(s.bytes_loaded, (uint64_t)L2_BLOCKS * L2_BLK);
    assert_int_equal(s.evictions[0] + s.evictions[1], 0);
    free(arena);
    pdx_offload_destroy(pool);
}

/* ---- async saves ------------------------------------------------------- */

/* A copy function with a gate, to hold the worker inside a copy. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
    int in_copy;
} gate_t;

static void gated_copy(void *arg, void *dst, const void *src, size_t len)
{
    gate_t *g = arg;
    pthread_mutex_lock(&g->mu);
    g->in_copy++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) {
        pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    memcpy(dst, src, len);
}

static void gate_open(gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait_in_copy(gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    while (g->in_copy == 0) {
        pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

static void *gate_open_later(void *arg)
{
    usleep(100 * 1000);
    gate_open(arg);
    return NULL;
}

typedef struct {
    atomic_int ok;
    atomic_int canceled;
    atomic_int other;
} cb_count_t;

static void count_cb(void *arg, const pdx_offload_key_t *key,
                     pdx_status_t status)
{
    cb_count_t *c = arg;
    /* No cmocka asserts here: this runs on the worker thread. */
    if (key->len != 16) {
        atomic_fetch_add(&c->other, 1);
    } else if (status == PDX_OK) {
        atomic_fetch_add(&c->ok, 1);
    } else if (status == PDX_ERR_CANCELED) {
        atomic_fetch_add(&c->canceled, 1);
    } else {
        atomic_fetch_add(&c->other, 1);
    }
}

static pdx_offload_pool_h make_gated_pool(gate_t *g, uint32_t depth)
{
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES |
                      PDX_OFFLOAD_PARAM_QUEUE_DEPTH | PDX_OFFLOAD_PARAM_COPY,
        .budget_bytes = 64 * BLK,
        .block_bytes = BLK,
        .queue_depth = depth,
        .copy_cb = gated_copy,
        .copy_arg = g,
    };
    pdx_offload_pool_h pool;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = 0;
    g->in_copy = 0;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    return pool;
}

static void test_async_save_flush(void **state)
{
    static uint8_t src[8][BLK];
    gate_t g;
    cb_count_t cbc = {0};
    pdx_offload_pool_h pool = make_gated_pool(&g, 4);
    pdx_offload_key_t k;
    size_t prefix;
    (void)state;

    for (int i = 0; i < 8; i++) {
        fill_block(src[i], BLK, 200 + i);
    }
    /* The worker takes the first and blocks in its copy; 4 more fill the
     * queue; the 6th is dropped and counted. */
    k = key_of(200);
    assert_int_equal(pdx_offload_save_async(pool, &k, src[0],
                                            PDX_OFFLOAD_RETAINED, 0, count_cb,
                                            &cbc),
                     PDX_OK);
    gate_wait_in_copy(&g);
    for (int i = 1; i < 5; i++) {
        k = key_of(200 + i);
        assert_int_equal(pdx_offload_save_async(pool, &k, src[i],
                                                PDX_OFFLOAD_RETAINED, 0,
                                                count_cb, &cbc),
                         PDX_OK);
    }
    k = key_of(205);
    assert_int_equal(pdx_offload_save_async(pool, &k, src[5],
                                            PDX_OFFLOAD_RETAINED, 0, count_cb,
                                            &cbc),
                     PDX_ERR_BUSY);
    pdx_offload_stats_t s = stats_of(pool);
    assert_int_equal(s.dropped_saves, 1);
    assert_int_equal(s.queued_saves, 5);
    /* Not done yet: polls and short waits time out; nothing visible. */
    assert_int_equal(pdx_offload_flush(pool, 0), PDX_ERR_TIMEOUT);
    assert_int_equal(pdx_offload_flush(pool, 30), PDX_ERR_TIMEOUT);
    k = key_of(200);
    assert_int_equal(pdx_offload_query(pool, &k, 1, &prefix), PDX_OK);
    assert_int_equal(prefix, 0);

    /* SAVE_WAIT blocks until the gate opens and room appears. */
    pthread_t opener;
    pthread_create(&opener, NULL, gate_open_later, &g);
    k = key_of(206);
    assert_int_equal(
        pdx_offload_save_async(pool, &k, src[6], PDX_OFFLOAD_RETAINED,
                               PDX_OFFLOAD_SAVE_WAIT, count_cb, &cbc),
        PDX_OK);
    pthread_join(opener, NULL);
    assert_int_equal(pdx_offload_flush(pool, -1), PDX_OK);
    assert_int_equal(atomic_load(&cbc.ok), 6);
    assert_int_equal(atomic_load(&cbc.other), 0);
    s = stats_of(pool);
    assert_int_equal(s.queued_saves, 0);
    assert_int_equal(s.saves, 6);
    assert_int_equal(pdx_offload_flush(pool, 0), PDX_OK);

    /* Everything accepted is present and exact. */
    pdx_offload_key_t keys[7];
    pdx_offload_lease_h lease;
    size_t count;
    uint8_t out[BLK];
    for (int i = 0; i < 7; i++) {
        keys[i] = key_of(200 + i);
    }
    assert_int_equal(pdx_offload_lease(pool, keys, 7, &lease, &count), PDX_OK);
    assert_int_equal(count, 5); /* 205 was dropped */
    for (size_t i = 0; i < count; i++) {
        pdx_offload_load_item_t it = {i, out};
        assert_int_equal(pdx_offload_load(pool, lease, &it, 1), PDX_OK);
        assert_true(block_is(out, BLK, 200 + i));
    }
    pdx_offload_release(pool, lease);
    assert_true(has(pool, 206));
    pdx_offload_destroy(pool);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

/* Destroy cancels what is queued; each callback runs exactly once. */
static void test_async_destroy_cancels(void **state)
{
    static uint8_t src[4][BLK];
    gate_t g;
    cb_count_t cbc = {0};
    pdx_offload_pool_h pool = make_gated_pool(&g, 8);
    pthread_t opener;
    (void)state;

    for (int i = 0; i < 4; i++) {
        pdx_offload_key_t k = key_of(300 + i);
        assert_int_equal(pdx_offload_save_async(pool, &k, src[i],
                                                PDX_OFFLOAD_RETAINED, 0,
                                                count_cb, &cbc),
                         PDX_OK);
        if (i == 0) {
            gate_wait_in_copy(&g);
        }
    }
    pthread_create(&opener, NULL, gate_open_later, &g);
    pdx_offload_destroy(pool);
    pthread_join(opener, NULL);
    assert_int_equal(atomic_load(&cbc.ok), 1);
    assert_int_equal(atomic_load(&cbc.canceled), 3);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

static void test_inline_async(void **state)
{
    pdx_offload_pool_h pool = make_pool(2, BLK, 0); /* no worker */
    cb_count_t cbc = {0};
    uint8_t buf[BLK];
    pdx_offload_key_t k = key_of(1);
    (void)state;

    fill_block(buf, BLK, 1);
    assert_int_equal(pdx_offload_save_async(pool, &k, buf, PDX_OFFLOAD_RETAINED,
                                            0, count_cb, &cbc),
                     PDX_OK);
    assert_int_equal(atomic_load(&cbc.ok), 1); /* ran before returning */
    assert_true(has(pool, 1));
    assert_int_equal(pdx_offload_flush(pool, 0), PDX_OK);
    pdx_offload_destroy(pool);
}

/* ---- index churn against a model -------------------------------------- */

/* Saving N distinct retained keys into C slots with no hits keeps exactly
 * the last C: exercises eviction and backward-shift deletion at scale. */
static void test_index_churn(void **state)
{
    enum { C = 257, N = 20000 };
    pdx_offload_pool_h pool = make_pool(C, 64, 0);
    uint8_t buf[64] = {0};
    (void)state;

    for (uint64_t i = 0; i < N; i++) {
        pdx_offload_key_t k = key_of(i * 2654435761u % 1000003u);
        assert_int_equal(pdx_offload_save(pool, &k, buf, PDX_OFFLOAD_RETAINED),
                         PDX_OK);
        if (i % 997 == 0 || i == N - 1) {
            for (uint64_t j = 0; j <= i; j++) {
                pdx_offload_class_t c;
                pdx_offload_key_t kj = key_of(j * 2654435761u % 1000003u);
                pdx_status_t want = j + C > i ? PDX_OK : PDX_ERR_NOT_FOUND;
                assert_int_equal(pdx_offload_class_of(pool, &kj, &c), want);
            }
        }
    }
    pdx_offload_stats_t s = stats_of(pool);
    assert_int_equal(s.blocks[PDX_OFFLOAD_RETAINED], C);
    assert_int_equal(s.evictions[PDX_OFFLOAD_RETAINED], N - C);
    pdx_offload_destroy(pool);
}

/* ---- threads ----------------------------------------------------------- */

#define MT_THREADS 4
#define MT_ITERS 400
#define MT_KEYS 96
#define MT_BLK 1024

typedef struct {
    pdx_offload_pool_h pool;
    int tid;
    int errors;
} mt_arg_t;

static void *mt_worker(void *argp)
{
    mt_arg_t *a = argp;
    uint8_t *src = malloc((size_t)MT_KEYS * MT_BLK);
    uint8_t *dst = malloc((size_t)8 * MT_BLK);
    uint32_t x = 12345u + (uint32_t)a->tid * 7919u;

    if (src == NULL || dst == NULL) {
        a->errors++;
        goto out;
    }
    for (int k = 0; k < MT_KEYS; k++) {
        fill_block(src + (size_t)k * MT_BLK, MT_BLK, k);
    }
    for (int it = 0; it < MT_ITERS; it++) {
        x = x * 1103515245u + 12345u;
        uint32_t base = (x >> 8) % (MT_KEYS - 8);
        pdx_offload_key_t keys[8];
        for (int i = 0; i < 8; i++) {
            keys[i] = key_of(base + i);
        }
        switch ((x >> 4) % 4) {
        case 0: /* async saves of a run (src is constant: no need to wait) */
            for (int i = 0; i < 8; i++) {
                pdx_status_t st = pdx_offload_save_async(
                    a->pool, &keys[i], src + (size_t)(base + i) * MT_BLK,
                    (pdx_offload_class_t)(i & 1), 0, NULL, NULL);
                a->errors += st != PDX_OK && st != PDX_ERR_BUSY;
            }
            break;
        case 1: { /* sync save */
            pdx_status_t st =
                pdx_offload_save(a->pool, &keys[0], src + (size_t)base * MT_BLK,
                                 PDX_OFFLOAD_RETAINED);
            a->errors += st != PDX_OK && st != PDX_ERR_NO_SPACE;
            pdx_offload_add_owner(a->pool, &keys[1]);
            break;
        }
        case 2: {
            size_t prefix;
            a->errors += pdx_offload_query(a->pool, keys, 8, &prefix) != 0;
            break;
        }
        default: { /* lease, load, verify, release */
            pdx_offload_lease_h lease;
            size_t count = 0;
            pdx_status_t st =
                pdx_offload_lease(a->pool, keys, 8, &lease, &count);
            if (st == PDX_ERR_NOT_FOUND) {
                break;
            }
            if (st != PDX_OK) {
                a->errors++;
                break;
            }
            pdx_offload_load_item_t items[8];
            for (size_t i = 0; i < count; i++) {
                items[i].index = i;
                items[i].dst = dst + i * MT_BLK;
            }
            a->errors += pdx_offload_load(a->pool, lease, items, count) != 0;
            for (size_t i = 0; i < count; i++) {
                a->errors += !block_is(dst + i * MT_BLK, MT_BLK, base + i);
            }
            pdx_offload_release(a->pool, lease);
            break;
        }
        }
    }
    a->errors += pdx_offload_flush(a->pool, 30000) != PDX_OK;
out:
    free(src);
    free(dst);
    return NULL;
}

static void test_multithreaded(void **state)
{
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES |
                      PDX_OFFLOAD_PARAM_QUEUE_DEPTH,
        .budget_bytes = 40 * MT_BLK, /* fewer slots than keys: evictions */
        .block_bytes = MT_BLK,
        .queue_depth = 16,
    };
    pdx_offload_pool_h pool;
    pthread_t th[MT_THREADS];
    mt_arg_t args[MT_THREADS];
    (void)state;

    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    for (int i = 0; i < MT_THREADS; i++) {
        args[i] = (mt_arg_t){.pool = pool, .tid = i, .errors = 0};
        assert_int_equal(pthread_create(&th[i], NULL, mt_worker, &args[i]), 0);
    }
    for (int i = 0; i < MT_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].errors, 0);
    }
    pdx_offload_stats_t s = stats_of(pool);
    assert_int_equal(s.leased_blocks, 0);
    assert_int_equal(s.filling_blocks, 0);
    assert_int_equal(s.queued_saves, 0);
    assert_true(s.blocks[0] + s.blocks[1] <= s.capacity_blocks);
    assert_true(s.saves > 0 && s.hits > 0);
    pdx_offload_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_budget_split),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_lru_refresh),
        cmocka_unit_test(test_prefix_refresh_order),
        cmocka_unit_test(test_longest_prefix),
        cmocka_unit_test(test_leases_block_eviction),
        cmocka_unit_test(test_reserve_commit),
        cmocka_unit_test(test_evict_callback),
        cmocka_unit_test(test_owner_demotion),
        cmocka_unit_test(test_pure_l2_restore),
        cmocka_unit_test(test_async_save_flush),
        cmocka_unit_test(test_async_destroy_cancels),
        cmocka_unit_test(test_inline_async),
        cmocka_unit_test(test_index_churn),
        cmocka_unit_test(test_multithreaded),
    };
    pdx_log_set_handler(capture_log, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
