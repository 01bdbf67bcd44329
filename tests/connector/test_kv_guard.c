/* Every entry point of the connector headers (kv_config.h, kv_connector.h,
 * kv_hash.h, kv_layout.h, kv_offload.h), called with NULL handles, NULL
 * required pointers and destroyed handles: no crash, PDX_ERR_INVALID (or
 * NULL / 0), and pdx_last_error() naming the function and the argument.
 *
 * The list was taken from grep PDX_API over include/pdx/kv_*.h and
 * coverage.cmake re-checks it on every run. Functions without a handle or a
 * pointer argument have no NULL case; they are called once for the record:
 * pdx_glm52_has_index_k, pdx_connector_version, and pdx_kv_free (NULL is
 * free(NULL)'s no-op by contract). pdx_kv_kind_to_string,
 * pdx_hash_algo_to_string and pdx_hash_algo_digest_len take an enum: they
 * are called with a value outside it instead. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <pdx/kv_connector.h>
#include <pdx/log.h>
#include <pdx/status.h>

#define CONFIG PDX_SOURCE_DIR "/configs/glm52-fp8-mtp/colocated-prefill.json"
#define NBLOCKS 4
#define BLOCK 4096

static void drop_log(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg;
    (void)level;
    (void)msg;
}

/* The last failing call was `call` (its text up to "("), failed with `st`
 * and names `what` (and `also`, when not NULL). */
static void expect_error(const char *call, pdx_status_t st, const char *what,
                         const char *also)
{
    char fn[96];
    size_t n = strcspn(call, "(");
    snprintf(fn, sizeof(fn), "%.*s:", (int)n, call);
    const char *e = pdx_last_error();
    if (pdx_last_status() != st || strstr(e, fn) == NULL ||
        strstr(e, what) == NULL || (also != NULL && strstr(e, also) == NULL)) {
        print_error("%s: last error \"%s\" (status %d); wanted \"%s\", "
                    "\"%s\"%s%s%s and status %d\n",
                    call, e, (int)pdx_last_status(), fn, what,
                    also ? ", \"" : "", also ? also : "", also ? "\"" : "",
                    (int)st);
        fail();
    }
}

/* `call` returns PDX_ERR_INVALID and names `what`. */
#define REFUSED(call, what)                                                    \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        assert_int_equal((call), PDX_ERR_INVALID);                             \
        expect_error(#call, PDX_ERR_INVALID, (what), NULL);                    \
    } while (0)
/* `call` returns `value` (NULL, 0, ...) and records a refusal naming
 * `what`. */
#define REFUSED_AS(call, value, what)                                          \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        assert_true((call) == (value));                                        \
        expect_error(#call, PDX_ERR_INVALID, (what), NULL);                    \
    } while (0)
#define REFUSED_VOID(call, what)                                               \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        call;                                                                  \
        expect_error(#call, PDX_ERR_INVALID, (what), NULL);                    \
    } while (0)
/* The same with a destroyed handle: the text says it is not live. */
#define DEAD(call, what)                                                       \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        assert_int_equal((call), PDX_ERR_INVALID);                             \
        expect_error(#call, PDX_ERR_INVALID, (what), "not a live");            \
    } while (0)
#define DEAD_AS(call, value, what)                                             \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        assert_true((call) == (value));                                        \
        expect_error(#call, PDX_ERR_INVALID, (what), "not a live");            \
    } while (0)
#define DEAD_VOID(call, what)                                                  \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        call;                                                                  \
        expect_error(#call, PDX_ERR_INVALID, (what), "not a live");            \
    } while (0)
/* A call that must succeed quietly (NULL no-ops). */
#define QUIET(call)                                                            \
    do {                                                                       \
        pdx_last_error_clear();                                                \
        call;                                                                  \
        assert_int_equal(pdx_last_status(), PDX_OK);                           \
    } while (0)

static int setup(void **state)
{
    (void)state;
    pdx_log_set_handler(drop_log, NULL); /* capture needs no sink */
    return 0;
}

/* ---- kv_layout.h ------------------------------------------------------- */

static pdx_layout_h small_layout(void)
{
    pdx_layout_h l;
    assert_int_equal(pdx_layout_create(64, &l), PDX_OK);
    assert_int_equal(pdx_layout_add_layer_arena(l, "layer", 0,
                                                PDX_KV_KIND_MLA, 0, 16, 8,
                                                PDX_MEM_DRAM, 0),
                     PDX_OK);
    return l;
}

static void test_layout_null(void **state)
{
    (void)state;
    pdx_layout_h l = small_layout();
    pdx_arena_t a = {.name = "x", .bytes_per_token = 16, .num_blocks = 8};
    pdx_arena_t noname = a;
    noname.name = NULL;
    uint64_t ids[2] = {0, 1};
    pdx_desc_t d[4], d2[4];
    size_t i, n;

    REFUSED_AS(pdx_kv_kind_to_string((pdx_kv_kind_t)77), NULL, "kind 77");
    REFUSED(pdx_layout_create(64, NULL), "layout_p is NULL");
    QUIET(pdx_layout_destroy(NULL));
    REFUSED(pdx_layout_add_arena(NULL, &a, NULL), "layout is NULL");
    REFUSED(pdx_layout_add_arena(l, NULL, NULL), "arena is NULL");
    REFUSED(pdx_layout_add_arena(l, &noname, NULL), "arena->name is NULL");
    REFUSED_AS(pdx_layout_num_arenas(NULL), 0, "layout is NULL");
    REFUSED(pdx_layout_get_arena(NULL, 0, &a), "layout is NULL");
    REFUSED(pdx_layout_get_arena(l, 0, NULL), "arena_p is NULL");
    REFUSED(pdx_layout_find_arena(NULL, "x", &i), "layout is NULL");
    REFUSED(pdx_layout_find_arena(l, NULL, &i), "name is NULL");
    REFUSED(pdx_layout_find_arena(l, "layer0.mla", NULL), "index_p is NULL");
    REFUSED(pdx_layout_set_base(NULL, 0, 4096, 0), "layout is NULL");
    REFUSED_AS(pdx_layout_block_tokens(NULL), 0, "layout is NULL");
    REFUSED_AS(pdx_layout_mem_type(NULL), (pdx_mem_type_t)-1,
               "layout is NULL");
    REFUSED_AS(pdx_layout_num_blocks(NULL), 0, "layout is NULL");
    REFUSED_AS(pdx_layout_bytes_per_block(NULL), 0, "layout is NULL");
    REFUSED_AS(pdx_layout_fingerprint(NULL), 0, "layout is NULL");
    REFUSED(pdx_layout_block_descs(NULL, ids, 2, d, 4, &n), "layout is NULL");
    REFUSED(pdx_layout_block_descs(l, NULL, 2, d, 4, &n), "ids is NULL");
    REFUSED(pdx_layout_block_descs(l, ids, 2, d, 4, NULL), "count_p is NULL");
    REFUSED(pdx_layout_merged_descs(NULL, ids, 2, d, 4, &n),
            "layout is NULL");
    REFUSED(pdx_layout_merged_descs(l, NULL, 2, d, 4, &n), "ids is NULL");
    REFUSED(pdx_layout_merged_descs(l, ids, 2, d, 4, NULL),
            "count_p is NULL");
    REFUSED(pdx_layout_paired_descs(NULL, ids, l, ids, 2, d, d2, 4, &n),
            "local is NULL");
    REFUSED(pdx_layout_paired_descs(l, ids, NULL, ids, 2, d, d2, 4, &n),
            "remote is NULL");
    REFUSED(pdx_layout_paired_descs(l, NULL, l, ids, 2, d, d2, 4, &n),
            "local_ids is NULL");
    REFUSED(pdx_layout_paired_descs(l, ids, l, NULL, 2, d, d2, 4, &n),
            "remote_ids is NULL");
    REFUSED(pdx_layout_paired_descs(l, ids, l, ids, 2, d, NULL, 4, &n),
            "remote_out is NULL");
    REFUSED(pdx_layout_paired_descs(l, ids, l, ids, 2, d, d2, 4, NULL),
            "count_p is NULL");
    REFUSED_AS(pdx_layout_carve_size(NULL, 4096), UINT64_MAX,
               "layout is NULL");
    REFUSED(pdx_layout_carve(NULL, 4096, 1 << 20, 4096, 0), "layout is NULL");
    REFUSED(pdx_layout_add_layer_arena(NULL, "layer", 1, PDX_KV_KIND_MLA, 0,
                                       16, 8, PDX_MEM_DRAM, 0),
            "layout is NULL");
    REFUSED(pdx_layout_add_layer_arena(l, NULL, 1, PDX_KV_KIND_MLA, 0, 16, 8,
                                       PDX_MEM_DRAM, 0),
            "prefix is NULL");
    REFUSED(pdx_layout_glm52(4, PDX_MEM_DRAM, 0, NULL), "layout_p is NULL");
    /* No handle, no pointer: nothing to refuse. */
    QUIET(assert_int_equal(pdx_glm52_has_index_k(6), 1));

    /* The live layout was left unchanged by the refusals. */
    assert_int_equal(pdx_layout_num_arenas(l), 1);
    pdx_layout_destroy(l);
}

static void test_layout_dead(void **state)
{
    (void)state;
    pdx_layout_h live = small_layout();
    pdx_layout_h l = small_layout();
    pdx_layout_destroy(l);
    pdx_arena_t a = {.name = "x", .bytes_per_token = 16, .num_blocks = 8};
    uint64_t ids[2] = {0, 1};
    pdx_desc_t d[4], d2[4];
    size_t i, n;

    DEAD_VOID(pdx_layout_destroy(l), "layout");
    DEAD(pdx_layout_add_arena(l, &a, NULL), "layout");
    DEAD_AS(pdx_layout_num_arenas(l), 0, "layout");
    DEAD(pdx_layout_get_arena(l, 0, &a), "layout");
    DEAD(pdx_layout_find_arena(l, "layer0.mla", &i), "layout");
    DEAD(pdx_layout_set_base(l, 0, 4096, 0), "layout");
    DEAD_AS(pdx_layout_block_tokens(l), 0, "layout");
    DEAD_AS(pdx_layout_mem_type(l), (pdx_mem_type_t)-1, "layout");
    DEAD_AS(pdx_layout_num_blocks(l), 0, "layout");
    DEAD_AS(pdx_layout_bytes_per_block(l), 0, "layout");
    DEAD_AS(pdx_layout_fingerprint(l), 0, "layout");
    DEAD(pdx_layout_block_descs(l, ids, 2, d, 4, &n), "layout");
    DEAD(pdx_layout_merged_descs(l, ids, 2, d, 4, &n), "layout");
    DEAD(pdx_layout_paired_descs(l, ids, live, ids, 2, d, d2, 4, &n),
         "local");
    DEAD(pdx_layout_paired_descs(live, ids, l, ids, 2, d, d2, 4, &n),
         "remote");
    DEAD_AS(pdx_layout_carve_size(l, 4096), UINT64_MAX, "layout");
    DEAD(pdx_layout_carve(l, 4096, 1 << 20, 4096, 0), "layout");
    DEAD(pdx_layout_add_layer_arena(l, "layer", 1, PDX_KV_KIND_MLA, 0, 16, 8,
                                    PDX_MEM_DRAM, 0),
         "layout");
    pdx_layout_destroy(live);
}

/* ---- kv_hash.h --------------------------------------------------------- */

static void test_hash_null(void **state)
{
    (void)state;
    pdx_hasher_h h;
    pdx_hash_algo_t algo;
    pdx_block_hash_t bh, untouched;
    uint64_t tokens[4] = {1, 2, 3, 4};
    size_t nb;
    char hex[PDX_BLOCK_HASH_HEX_MAX];
    assert_int_equal(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, "s", 4, &h),
                     PDX_OK);
    pdx_hasher_none_hash(h, &bh);

    REFUSED(pdx_hash_algo_from_string(NULL, &algo), "name is NULL");
    REFUSED(pdx_hash_algo_from_string("xxhash_cbor", NULL), "algo_p is NULL");
    REFUSED_AS(pdx_hash_algo_to_string((pdx_hash_algo_t)9), NULL, "algo 9");
    REFUSED_AS(pdx_hash_algo_digest_len((pdx_hash_algo_t)9), 0, "algo 9");
    REFUSED_AS(pdx_block_hash_to_hex(NULL, hex, sizeof(hex)), 0,
               "hash is NULL");
    REFUSED_AS(pdx_block_hash_to_hex(&bh, NULL, sizeof(hex)), 0,
               "buf is NULL");
    REFUSED(pdx_block_hash_from_hex(NULL, &bh), "hex is NULL");
    REFUSED(pdx_block_hash_from_hex("00", NULL), "hash_p is NULL");
    REFUSED_AS(pdx_block_hash_equal(NULL, &bh), 0, "a is NULL");
    REFUSED_AS(pdx_block_hash_equal(&bh, NULL), 0, "b is NULL");
    REFUSED(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, NULL, 4, &h),
            "seed is NULL");
    REFUSED(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, "s", 4, NULL),
            "hasher_p is NULL");
    QUIET(pdx_hasher_destroy(NULL));
    REFUSED_AS(pdx_hasher_algo(NULL), (pdx_hash_algo_t)-1, "hasher is NULL");
    REFUSED_AS(pdx_hasher_block_size(NULL), 0, "hasher is NULL");
    untouched = bh;
    REFUSED_VOID(pdx_hasher_none_hash(NULL, &bh), "hasher is NULL");
    assert_memory_equal(&bh, &untouched, sizeof(bh));
    REFUSED_VOID(pdx_hasher_none_hash(h, NULL), "hash_p is NULL");
    REFUSED(pdx_hasher_hash_blocks(NULL, tokens, 4, NULL, &bh, 1, &nb, NULL,
                                   NULL),
            "hasher is NULL");
    REFUSED(pdx_hasher_hash_blocks(h, NULL, 4, NULL, &bh, 1, &nb, NULL, NULL),
            "tokens is NULL");
    REFUSED(pdx_hasher_hash_blocks(h, tokens, 4, NULL, &bh, 1, NULL, NULL,
                                   NULL),
            "nblocks_p is NULL");
    REFUSED(pdx_hasher_hash_blocks(h, tokens, 4, NULL, &bh, 1, &nb, &bh,
                                   NULL),
            "has_tail_p is NULL");
    REFUSED(pdx_hasher_hash_next(NULL, NULL, tokens, 4, NULL, &bh),
            "hasher is NULL");
    REFUSED(pdx_hasher_hash_next(h, NULL, NULL, 4, NULL, &bh),
            "tokens is NULL");
    REFUSED(pdx_hasher_hash_next(h, NULL, tokens, 4, NULL, NULL),
            "hash_p is NULL");
    pdx_hasher_destroy(h);
}

static void test_hash_dead(void **state)
{
    (void)state;
    pdx_hasher_h h;
    pdx_block_hash_t bh;
    uint64_t tokens[4] = {1, 2, 3, 4};
    size_t nb;
    assert_int_equal(pdx_hasher_create(PDX_HASH_SHA256_CBOR, "s", 4, &h),
                     PDX_OK);
    pdx_hasher_destroy(h);

    DEAD_VOID(pdx_hasher_destroy(h), "hasher");
    DEAD_AS(pdx_hasher_algo(h), (pdx_hash_algo_t)-1, "hasher");
    DEAD_AS(pdx_hasher_block_size(h), 0, "hasher");
    DEAD_VOID(pdx_hasher_none_hash(h, &bh), "hasher");
    DEAD(pdx_hasher_hash_blocks(h, tokens, 4, NULL, &bh, 1, &nb, NULL, NULL),
         "hasher");
    DEAD(pdx_hasher_hash_next(h, NULL, tokens, 4, NULL, &bh), "hasher");
}

/* ---- kv_config.h ------------------------------------------------------- */

static void test_config_null(void **state)
{
    (void)state;
    static pdx_kv_config_t cfg;
    pdx_layout_h l;
    pdx_option_t opts[4];
    char err[256];

    REFUSED(pdx_kv_config_load(NULL, &cfg, err, sizeof(err)), "path is NULL");
    assert_non_null(strstr(err, "path is NULL"));
    REFUSED(pdx_kv_config_load(CONFIG, NULL, err, sizeof(err)),
            "cfg is NULL");
    REFUSED(pdx_kv_config_parse(NULL, 2, "x", &cfg, err, sizeof(err)),
            "json is NULL");
    REFUSED(pdx_kv_config_parse("{}", 2, "x", NULL, NULL, 0), "cfg is NULL");
    REFUSED_AS(pdx_kv_config_bytes_per_block(NULL), 0, "cfg is NULL");
    REFUSED_AS(pdx_kv_config_num_arenas(NULL), 0, "cfg is NULL");
    assert_int_equal(pdx_kv_config_load(CONFIG, &cfg, err, sizeof(err)),
                     PDX_OK);
    REFUSED(pdx_kv_config_layout(NULL, &l), "cfg is NULL");
    REFUSED(pdx_kv_config_layout(&cfg, NULL), "layout_p is NULL");
    REFUSED_AS(pdx_kv_config_backend_opts(NULL, 0, opts, 4), 0,
               "cfg is NULL");

    /* A load failure is pdx_last_error() too, with the text of `err`. */
    pdx_last_error_clear();
    assert_int_equal(pdx_kv_config_parse("[]", 2, "mem.json", &cfg, err,
                                         sizeof(err)),
                     PDX_ERR_CONFIG);
    assert_non_null(strstr(pdx_last_error(), err));
}

/* ---- kv_offload.h ------------------------------------------------------ */

static pdx_offload_pool_h small_pool(void)
{
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS,
        .budget_bytes = 8 * BLOCK,
        .block_bytes = BLOCK,
        .flags = 0};
    pdx_offload_pool_h pool;
    assert_int_equal(pdx_offload_create(&p, &pool), PDX_OK);
    return pool;
}

static pdx_offload_key_t key_n(uint8_t n)
{
    pdx_offload_key_t k = {.len = 16};
    memset(k.bytes, n, 16);
    return k;
}

static void test_offload_null(void **state)
{
    (void)state;
    static uint8_t src[BLOCK], dst[BLOCK];
    pdx_offload_pool_h pool = small_pool(), other = small_pool();
    pdx_offload_params_t p = {0};
    pdx_offload_key_t k = key_n(1), bad = {.len = 0};
    pdx_offload_lease_h lease, foreign;
    pdx_offload_class_t cls;
    pdx_offload_resv_t resv;
    pdx_offload_stats_t stats;
    pdx_offload_load_item_t item = {.index = 0, .dst = dst};
    const void *addr;
    void *slab;
    size_t n, len;
    pdx_offload_pool_h out;

    assert_int_equal(pdx_offload_save(pool, &k, src, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    assert_int_equal(pdx_offload_save(other, &k, src, PDX_OFFLOAD_RETAINED),
                     PDX_OK);
    assert_int_equal(pdx_offload_lease(pool, &k, 1, &lease, &n), PDX_OK);
    assert_int_equal(pdx_offload_lease(other, &k, 1, &foreign, &n), PDX_OK);

    REFUSED(pdx_offload_create(NULL, &out), "params is NULL");
    REFUSED(pdx_offload_create(&p, NULL), "pool_p is NULL");
    QUIET(pdx_offload_destroy(NULL));
    REFUSED(pdx_offload_query(NULL, &k, 1, &n), "pool is NULL");
    REFUSED(pdx_offload_query(pool, NULL, 1, &n), "keys is NULL");
    REFUSED(pdx_offload_query(pool, &k, 1, NULL), "prefix_p is NULL");
    REFUSED(pdx_offload_query(pool, &bad, 1, &n), "keys[0] has length 0");
    REFUSED(pdx_offload_lease(NULL, &k, 1, &lease, &n), "pool is NULL");
    REFUSED(pdx_offload_lease(pool, NULL, 1, &lease, &n), "keys is NULL");
    REFUSED(pdx_offload_lease(pool, &k, 1, NULL, &n), "lease_p is NULL");
    REFUSED(pdx_offload_lease(pool, &k, 1, &lease, NULL), "count_p is NULL");
    REFUSED_AS(pdx_offload_lease_count(NULL), 0, "lease is NULL");
    REFUSED(pdx_offload_lease_block(NULL, lease, 0, &addr), "pool is NULL");
    REFUSED(pdx_offload_lease_block(pool, NULL, 0, &addr), "lease is NULL");
    REFUSED(pdx_offload_lease_block(pool, lease, 0, NULL), "addr_p is NULL");
    REFUSED(pdx_offload_lease_block(pool, foreign, 0, &addr),
            "is not from pool");
    REFUSED(pdx_offload_load(NULL, lease, &item, 1), "pool is NULL");
    REFUSED(pdx_offload_load(pool, NULL, &item, 1), "lease is NULL");
    REFUSED(pdx_offload_load(pool, lease, NULL, 1), "items is NULL");
    REFUSED_VOID(pdx_offload_release(NULL, lease), "pool is NULL");
    REFUSED_VOID(pdx_offload_release(pool, foreign), "is not from pool");
    QUIET(pdx_offload_release(pool, NULL));
    REFUSED(pdx_offload_save(NULL, &k, src, PDX_OFFLOAD_RETAINED),
            "pool is NULL");
    REFUSED(pdx_offload_save(pool, NULL, src, PDX_OFFLOAD_RETAINED),
            "key is NULL");
    REFUSED(pdx_offload_save(pool, &k, NULL, PDX_OFFLOAD_RETAINED),
            "src is NULL");
    REFUSED(pdx_offload_save_async(NULL, &k, src, PDX_OFFLOAD_RETAINED, 0,
                                   NULL, NULL),
            "pool is NULL");
    REFUSED(pdx_offload_save_async(pool, NULL, src, PDX_OFFLOAD_RETAINED, 0,
                                   NULL, NULL),
            "key is NULL");
    REFUSED(pdx_offload_save_async(pool, &k, NULL, PDX_OFFLOAD_RETAINED, 0,
                                   NULL, NULL),
            "src is NULL");
    REFUSED(pdx_offload_flush(NULL, 0), "pool is NULL");
    REFUSED(pdx_offload_reserve(NULL, &k, PDX_OFFLOAD_RETAINED, &resv),
            "pool is NULL");
    REFUSED(pdx_offload_reserve(pool, NULL, PDX_OFFLOAD_RETAINED, &resv),
            "key is NULL");
    REFUSED(pdx_offload_reserve(pool, &k, PDX_OFFLOAD_RETAINED, NULL),
            "resv_p is NULL");
    REFUSED(pdx_offload_commit(NULL, &resv), "pool is NULL");
    REFUSED(pdx_offload_commit(pool, NULL), "resv is NULL");
    REFUSED(pdx_offload_abort(NULL, &resv), "pool is NULL");
    REFUSED(pdx_offload_abort(pool, NULL), "resv is NULL");
    REFUSED(pdx_offload_add_owner(NULL, &k), "pool is NULL");
    REFUSED(pdx_offload_add_owner(pool, NULL), "key is NULL");
    REFUSED(pdx_offload_drop_owner(NULL, &k), "pool is NULL");
    REFUSED(pdx_offload_drop_owner(pool, NULL), "key is NULL");
    REFUSED(pdx_offload_class_of(NULL, &k, &cls), "pool is NULL");
    REFUSED(pdx_offload_class_of(pool, NULL, &cls), "key is NULL");
    REFUSED(pdx_offload_class_of(pool, &k, NULL), "cls_p is NULL");
    uint64_t cursor = 0;
    REFUSED(pdx_offload_keys(NULL, &cursor, &k, 1, &n), "pool is NULL");
    REFUSED(pdx_offload_keys(pool, NULL, &k, 1, &n), "cursor_p is NULL");
    REFUSED(pdx_offload_keys(pool, &cursor, NULL, 1, &n), "keys is NULL");
    REFUSED(pdx_offload_keys(pool, &cursor, &k, 1, NULL), "n_p is NULL");
    REFUSED(pdx_offload_keys(pool, &cursor, &k, 0, &n), "max is 0");
    REFUSED(pdx_offload_slab(NULL, &slab, &len), "pool is NULL");
    REFUSED(pdx_offload_slab(pool, NULL, &len), "addr_p is NULL");
    REFUSED(pdx_offload_slab(pool, &slab, NULL), "len_p is NULL");
    REFUSED(pdx_offload_stats(NULL, &stats), "pool is NULL");
    REFUSED(pdx_offload_stats(pool, NULL), "stats_p is NULL");

    /* The refusals left both leases pinned and usable. */
    assert_int_equal(pdx_offload_lease_count(lease), 1);
    assert_int_equal(pdx_offload_load(pool, lease, &item, 1), PDX_OK);
    pdx_offload_release(pool, lease);
    pdx_offload_release(other, foreign);
    pdx_offload_destroy(other);
    pdx_offload_destroy(pool);
}

static void test_offload_dead(void **state)
{
    (void)state;
    static uint8_t src[BLOCK], dst[BLOCK];
    pdx_offload_pool_h pool = small_pool();
    pdx_offload_key_t k = key_n(2);
    pdx_offload_lease_h lease = NULL;
    pdx_offload_class_t cls;
    pdx_offload_resv_t resv = {0};
    pdx_offload_stats_t stats;
    pdx_offload_load_item_t item = {.index = 0, .dst = dst};
    const void *addr;
    void *slab;
    size_t n, len;
    pdx_offload_destroy(pool);

    DEAD_VOID(pdx_offload_destroy(pool), "pool");
    DEAD(pdx_offload_query(pool, &k, 1, &n), "pool");
    DEAD(pdx_offload_lease(pool, &k, 1, &lease, &n), "pool");
    assert_null(lease);
    DEAD(pdx_offload_lease_block(pool, lease, 0, &addr), "pool");
    DEAD(pdx_offload_load(pool, lease, &item, 1), "pool");
    DEAD_VOID(pdx_offload_release(pool, lease), "pool");
    DEAD(pdx_offload_save(pool, &k, src, PDX_OFFLOAD_RETAINED), "pool");
    DEAD(pdx_offload_save_async(pool, &k, src, PDX_OFFLOAD_RETAINED, 0, NULL,
                                NULL),
         "pool");
    DEAD(pdx_offload_flush(pool, 0), "pool");
    DEAD(pdx_offload_reserve(pool, &k, PDX_OFFLOAD_RETAINED, &resv), "pool");
    DEAD(pdx_offload_commit(pool, &resv), "pool");
    DEAD(pdx_offload_abort(pool, &resv), "pool");
    DEAD(pdx_offload_add_owner(pool, &k), "pool");
    DEAD(pdx_offload_drop_owner(pool, &k), "pool");
    DEAD(pdx_offload_class_of(pool, &k, &cls), "pool");
    uint64_t cursor = 0;
    DEAD(pdx_offload_keys(pool, &cursor, &k, 1, &n), "pool");
    DEAD(pdx_offload_slab(pool, &slab, &len), "pool");
    DEAD(pdx_offload_stats(pool, &stats), "pool");
}

/* ---- kv_connector.h ---------------------------------------------------- */

typedef struct conn_node {
    pdx_kv_config_t cfg;
    pdx_layout_h layout;
    void *mem;
    pdx_kv_connector_h conn;
} conn_node_t;

/* The colocated prefill config, shrunk: a few blocks, a pool of a few
 * blocks, leases that expire at once (for the freed callback). */
static void conn_up(conn_node_t *n)
{
    char err[512];
    assert_int_equal(pdx_kv_config_load(CONFIG, &n->cfg, err, sizeof(err)),
                     PDX_OK);
    n->cfg.num_blocks = NBLOCKS;
    for (uint32_t i = 0; i < n->cfg.nchildren; i++) {
        n->cfg.children[i].budget_bytes = 2 * n->cfg.bytes_per_block;
        n->cfg.children[i].lease_ms = 1;
    }
    assert_int_equal(pdx_kv_config_layout(&n->cfg, &n->layout), PDX_OK);
    uint64_t size = pdx_layout_carve_size(n->layout, 4096);
    assert_int_equal(posix_memalign(&n->mem, 4096, size), 0);
    memset(n->mem, 0, size);
    assert_int_equal(
        pdx_layout_carve(n->layout, (uintptr_t)n->mem, size, 4096, 0),
        PDX_OK);
    pdx_kv_connector_params_t p = {
        .field_mask = PDX_KV_PARAM_CONFIG | PDX_KV_PARAM_LAYOUT,
        .config = &n->cfg,
        .layout = n->layout};
    assert_int_equal(pdx_kv_connector_create(&p, &n->conn), PDX_OK);
}

static void conn_down(conn_node_t *n)
{
    pdx_kv_connector_destroy(n->conn);
    pdx_layout_destroy(n->layout);
    free(n->mem);
}

static void request(pdx_kv_request_t *r, pdx_block_hash_t *hashes,
                    const char *id)
{
    memset(r, 0, sizeof(*r));
    memset(hashes, 0, 2 * sizeof(*hashes));
    hashes[0].len = hashes[1].len = 16;
    hashes[0].bytes[0] = 1;
    hashes[1].bytes[0] = 2;
    r->req_id = id;
    r->hashes = hashes;
    r->nfull = 2;
    r->prompt_tokens = 2 * 64 + 1;
}

static void test_connector_null(void **state)
{
    (void)state;
    static conn_node_t node;
    conn_node_t *n = &node;
    conn_up(n);
    pdx_kv_connector_h c = n->conn, out;
    pdx_kv_request_t req, noid, nohash;
    pdx_block_hash_t hashes[2];
    pdx_kv_match_t m = {.source = PDX_KV_SOURCE_OFFLOAD, .blocks = 1};
    pdx_offload_stats_t stats;
    uint64_t ids[2] = {0, 1};
    size_t tokens, len;
    void *blob;
    char *params;
    request(&req, hashes, "req-7");
    noid = req;
    noid.req_id = NULL;
    nohash = req;
    nohash.hashes = NULL;

    pdx_kv_connector_params_t p = {
        .field_mask = PDX_KV_PARAM_CONFIG | PDX_KV_PARAM_LAYOUT,
        .config = &n->cfg,
        .layout = NULL};
    REFUSED(pdx_kv_connector_create(NULL, &out), "params is NULL");
    REFUSED(pdx_kv_connector_create(&p, NULL), "conn_p is NULL");
    REFUSED(pdx_kv_connector_create(&p, &out), "params->layout is NULL");
    p.layout = n->layout;
    p.config = NULL;
    REFUSED(pdx_kv_connector_create(&p, &out), "params->config is NULL");
    QUIET(pdx_kv_connector_destroy(NULL));
    REFUSED_AS(pdx_kv_connector_agent(NULL), NULL, "conn is NULL");
    REFUSED_AS(pdx_kv_connector_hasher(NULL), NULL, "conn is NULL");
    REFUSED(pdx_kv_connector_describe(NULL, &blob, &len), "conn is NULL");
    REFUSED(pdx_kv_connector_describe(c, NULL, &len), "blob_p is NULL");
    REFUSED(pdx_kv_connector_describe(c, &blob, NULL), "len_p is NULL");
    REFUSED(pdx_kv_connector_connect(NULL, "x", 1, NULL), "conn is NULL");
    REFUSED(pdx_kv_connector_connect(c, NULL, 1, NULL), "blob is NULL");
    REFUSED(pdx_kv_lookup(NULL, &req, &m), "conn is NULL");
    REFUSED(pdx_kv_lookup(c, NULL, &m), "req is NULL");
    REFUSED(pdx_kv_lookup(c, &noid, &m), "req->req_id is NULL");
    REFUSED(pdx_kv_lookup(c, &nohash, &m), "req->hashes is NULL");
    REFUSED(pdx_kv_lookup(c, &req, NULL), "match_p is NULL");
    REFUSED(pdx_kv_load(NULL, &req, &m, ids), "conn is NULL");
    REFUSED(pdx_kv_load(c, NULL, &m, ids), "req is NULL");
    REFUSED(pdx_kv_load(c, &req, NULL, ids), "match is NULL");
    REFUSED(pdx_kv_load(c, &req, &m, NULL), "block_ids is NULL");
    REFUSED(pdx_kv_load_check(NULL, "req-7", &tokens), "conn is NULL");
    REFUSED(pdx_kv_load_check(c, NULL, &tokens), "req_id is NULL");
    REFUSED(pdx_kv_load_check(c, "req-7", NULL), "tokens_p is NULL");
    REFUSED(pdx_kv_load_abort(NULL, "req-7"), "conn is NULL");
    REFUSED(pdx_kv_load_abort(c, NULL), "req_id is NULL");
    pdx_kv_load_params_t lp = {.field_mask = PDX_KV_LOAD_PARAM_FLAGS,
                               .flags = PDX_KV_LOAD_F_LAYERED};
    REFUSED(pdx_kv_load_ex(NULL, &req, &m, &lp, ids), "conn is NULL");
    REFUSED(pdx_kv_load_ex(c, NULL, &m, &lp, ids), "req is NULL");
    REFUSED(pdx_kv_load_ex(c, &req, NULL, &lp, ids), "match is NULL");
    REFUSED(pdx_kv_load_ex(c, &req, &m, &lp, NULL), "block_ids is NULL");
    lp.flags = 0x80;
    REFUSED(pdx_kv_load_ex(c, &req, &m, &lp, ids), "unknown flags");
    lp = (pdx_kv_load_params_t){.field_mask = PDX_KV_LOAD_PARAM_FIRST_BLOCK,
                                .first_block = 9};
    REFUSED(pdx_kv_load_ex(c, &req, &m, &lp, ids), "first block 9");
    REFUSED(pdx_kv_load_layer_check(NULL, "req-7", 0), "conn is NULL");
    REFUSED(pdx_kv_load_layer_check(c, NULL, 0), "req_id is NULL");
    pdx_kv_push_expect_t pe = {
        .field_mask = PDX_KV_PUSH_HOLDER | PDX_KV_PUSH_HOLDER_REQ |
                      PDX_KV_PUSH_NBLOCKS,
        .holder = "glm52-p-dp0", .holder_req = "p-7", .nblocks = 2};
    REFUSED(pdx_kv_push_expect(NULL, "req-7", &pe, ids), "conn is NULL");
    REFUSED(pdx_kv_push_expect(c, NULL, &pe, ids), "req_id is NULL");
    REFUSED(pdx_kv_push_expect(c, "req-7", NULL, ids), "e is NULL");
    REFUSED(pdx_kv_push_expect(c, "req-7", &pe, NULL), "block_ids is NULL");
    pe.field_mask &= ~(uint64_t)PDX_KV_PUSH_HOLDER;
    REFUSED(pdx_kv_push_expect(c, "req-7", &pe, ids), "e->holder");
    pdx_kv_layer_save_t ls = {
        .field_mask = PDX_KV_LAYER_SAVE_LAYER | PDX_KV_LAYER_SAVE_NBLOCKS |
                      PDX_KV_LAYER_SAVE_TOKENS,
        .layer = 0, .nblocks = 2, .tokens = 128};
    REFUSED(pdx_kv_save_layer(NULL, &req, &ls, ids), "conn is NULL");
    REFUSED(pdx_kv_save_layer(c, NULL, &ls, ids), "req is NULL");
    REFUSED(pdx_kv_save_layer(c, &req, NULL, ids), "s is NULL");
    REFUSED(pdx_kv_save_layer(c, &req, &ls, NULL), "block_ids is NULL");
    ls.layer = 100000;
    REFUSED(pdx_kv_save_layer(c, &req, &ls, ids), "no layer 100000");
    ls.field_mask = PDX_KV_LAYER_SAVE_LAYER;
    REFUSED(pdx_kv_save_layer(c, &req, &ls, ids), "lacks layer, nblocks");
    REFUSED(pdx_kv_request_dropped(NULL, "req-7"), "conn is NULL");
    REFUSED(pdx_kv_request_dropped(c, NULL), "req_id is NULL");
    REFUSED(pdx_kv_save(NULL, &req, ids), "conn is NULL");
    REFUSED(pdx_kv_save(c, NULL, ids), "req is NULL");
    REFUSED(pdx_kv_save(c, &req, NULL), "block_ids is NULL");
    REFUSED(pdx_kv_save_check(NULL, "req-7"), "conn is NULL");
    REFUSED(pdx_kv_save_check(c, NULL), "req_id is NULL");
    REFUSED(pdx_kv_request_finished(NULL, &req, ids, 128, PDX_KV_FROM_ARENA,
                                    &params),
            "conn is NULL");
    REFUSED(pdx_kv_request_finished(c, NULL, ids, 128, PDX_KV_FROM_ARENA,
                                    &params),
            "req is NULL");
    REFUSED(pdx_kv_request_finished(c, &req, NULL, 128, PDX_KV_FROM_ARENA,
                                    &params),
            "block_ids is NULL");
    REFUSED(pdx_kv_request_finished(c, &req, ids, 128, PDX_KV_FROM_ARENA,
                                    NULL),
            "params_p is NULL");
    REFUSED(pdx_kv_reject(NULL, "{}"), "conn is NULL");
    REFUSED(pdx_kv_reject(c, NULL), "params is NULL");
    REFUSED(pdx_kv_progress(NULL), "conn is NULL");
    REFUSED(pdx_kv_poll_freed(NULL, NULL, NULL), "conn is NULL");
    REFUSED_AS(pdx_kv_held_requests(NULL), 0, "conn is NULL");
    REFUSED(pdx_kv_offload_stats(NULL, &stats), "conn is NULL");
    REFUSED(pdx_kv_offload_stats(c, NULL), "stats_p is NULL");
    pdx_kv_store_stats_t sstats;
    REFUSED(pdx_kv_store_stats(NULL, &sstats), "conn is NULL");
    REFUSED(pdx_kv_store_stats(c, NULL), "stats_p is NULL");
    REFUSED(pdx_kv_params_check(NULL, 2, 101), "params is NULL");
    REFUSED(pdx_kv_params_merge(NULL, "{}", &params), "a is NULL");
    REFUSED(pdx_kv_params_merge("{}", NULL, &params), "b is NULL");
    REFUSED(pdx_kv_params_merge("{}", "{}", NULL), "out_p is NULL");
    /* No handle: free(NULL)'s no-op, and a constant. */
    QUIET(pdx_kv_free(NULL));
    QUIET(assert_string_equal(pdx_connector_version(), "pdx-kv/1"));

    /* A failure deeper in names the node and the request. */
    pdx_last_error_clear();
    assert_int_equal(pdx_kv_load_check(c, "req-7", &tokens),
                     PDX_ERR_NOT_FOUND);
    assert_non_null(strstr(pdx_last_error(),
                           "kv connector glm52-p-dp0: load check: no load of "
                           "request req-7 is known"));
    assert_int_equal(pdx_kv_held_requests(c), 0);
    conn_down(n);
}

typedef struct freed_seen {
    int calls;
    char inner_error[256];
} freed_seen_t;

/* A freed callback whose own pdx call fails: that call is outermost, so it
 * records its own pdx_last_error(), not folded into pdx_kv_poll_freed's. */
static void on_freed(void *arg, const char *req_id, pdx_kv_free_reason_t why)
{
    freed_seen_t *s = arg;
    (void)req_id;
    (void)why;
    s->calls++;
    pdx_last_error_clear();
    assert_int_equal(pdx_layout_num_blocks(NULL), 0);
    snprintf(s->inner_error, sizeof(s->inner_error), "%s", pdx_last_error());
}

static void test_connector_callback(void **state)
{
    (void)state;
    static conn_node_t node;
    conn_node_t *n = &node;
    conn_up(n);
    pdx_kv_request_t req;
    pdx_block_hash_t hashes[2];
    uint64_t ids[2] = {0, 1};
    char *params = NULL;
    request(&req, hashes, "req-cb");
    assert_int_equal(pdx_kv_request_finished(n->conn, &req, ids, 128,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    pdx_kv_free(params);
    assert_int_equal(pdx_kv_held_requests(n->conn), 1);
    /* The 1 ms lease expires; progress frees the blocks. */
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_true(pdx_kv_progress(n->conn) >= 1);
    freed_seen_t seen = {0};
    assert_int_equal(pdx_kv_poll_freed(n->conn, on_freed, &seen), 1);
    assert_int_equal(seen.calls, 1);
    assert_non_null(strstr(seen.inner_error,
                           "pdx_layout_num_blocks: layout is NULL"));
    conn_down(n);
}

static void test_connector_dead(void **state)
{
    (void)state;
    static conn_node_t node;
    conn_node_t *n = &node;
    conn_up(n);
    pdx_kv_connector_h c = n->conn;
    pdx_hasher_h hasher = pdx_kv_connector_hasher(c);
    pdx_kv_request_t req;
    pdx_block_hash_t hashes[2];
    pdx_kv_match_t m = {0};
    pdx_offload_stats_t stats;
    uint64_t ids[2] = {0, 1};
    size_t tokens, len;
    void *blob;
    char *params;
    freed_seen_t seen = {0};
    request(&req, hashes, "req-dead");
    pdx_kv_connector_destroy(c);

    DEAD_VOID(pdx_kv_connector_destroy(c), "conn");
    DEAD_AS(pdx_kv_connector_agent(c), NULL, "conn");
    DEAD_AS(pdx_kv_connector_hasher(c), NULL, "conn");
    DEAD(pdx_kv_connector_describe(c, &blob, &len), "conn");
    DEAD(pdx_kv_connector_connect(c, "x", 1, NULL), "conn");
    DEAD(pdx_kv_lookup(c, &req, &m), "conn");
    DEAD(pdx_kv_load(c, &req, &m, ids), "conn");
    DEAD(pdx_kv_load_check(c, "req-dead", &tokens), "conn");
    DEAD(pdx_kv_load_abort(c, "req-dead"), "conn");
    DEAD(pdx_kv_load_ex(c, &req, &m, NULL, ids), "conn");
    DEAD(pdx_kv_load_layer_check(c, "req-dead", 0), "conn");
    pdx_kv_push_expect_t pe = {
        .field_mask = PDX_KV_PUSH_HOLDER | PDX_KV_PUSH_HOLDER_REQ |
                      PDX_KV_PUSH_NBLOCKS,
        .holder = "glm52-p-dp0", .holder_req = "p-7", .nblocks = 2};
    DEAD(pdx_kv_push_expect(c, "req-dead", &pe, ids), "conn");
    pdx_kv_layer_save_t ls = {
        .field_mask = PDX_KV_LAYER_SAVE_LAYER | PDX_KV_LAYER_SAVE_NBLOCKS |
                      PDX_KV_LAYER_SAVE_TOKENS,
        .nblocks = 2, .tokens = 128};
    DEAD(pdx_kv_save_layer(c, &req, &ls, ids), "conn");
    DEAD(pdx_kv_request_dropped(c, "req-dead"), "conn");
    DEAD(pdx_kv_save(c, &req, ids), "conn");
    DEAD(pdx_kv_save_check(c, "req-dead"), "conn");
    DEAD(pdx_kv_request_finished(c, &req, ids, 128, PDX_KV_FROM_ARENA,
                                 &params),
         "conn");
    DEAD(pdx_kv_reject(c, "{}"), "conn");
    DEAD(pdx_kv_progress(c), "conn");
    DEAD(pdx_kv_poll_freed(c, on_freed, &seen), "conn");
    assert_int_equal(seen.calls, 0); /* refused: the callback never ran */
    DEAD_AS(pdx_kv_held_requests(c), 0, "conn");
    DEAD(pdx_kv_offload_stats(c, &stats), "conn");
    pdx_kv_store_stats_t sstats;
    DEAD(pdx_kv_store_stats(c, &sstats), "conn");
    /* The hasher the connector handed out went with it. */
    DEAD_AS(pdx_hasher_block_size(hasher), 0, "hasher");

    pdx_layout_destroy(n->layout);
    free(n->mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_null),
        cmocka_unit_test(test_layout_dead),
        cmocka_unit_test(test_hash_null),
        cmocka_unit_test(test_hash_dead),
        cmocka_unit_test(test_config_null),
        cmocka_unit_test(test_offload_null),
        cmocka_unit_test(test_offload_dead),
        cmocka_unit_test(test_connector_null),
        cmocka_unit_test(test_connector_callback),
        cmocka_unit_test(test_connector_dead),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
