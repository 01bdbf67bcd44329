/* Block hashing: vLLM-compatible vectors, extra keys, tails, CBOR length
 * boundaries, incremental == batch, and the small helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pdx/kv_hash.h>

#include "cbor_int.h"

/* Reference values: the five seed-"0"/"42" xxhash_cbor values come from the
 * issue; every other value was computed once with gen_vectors.py (Debian
 * python3-cbor2 + python3-xxhash + hashlib, mirroring vLLM's
 * kv_cache_utils) and pasted here. */
#define NOHASH NULL

static const uint64_t seq10[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
static const uint64_t big[] = {23,
                               24,
                               255,
                               256,
                               65535,
                               65536,
                               UINT64_C(4294967295),
                               UINT64_C(4294967296),
                               UINT64_MAX,
                               0,
                               1,
                               UINT64_MAX - 1};
static const uint64_t two[] = {7, 8};

typedef struct vector {
    const char *name;
    pdx_hash_algo_t algo;
    const char *seed;
    const uint64_t *tokens;
    size_t ntokens;
    const char *lora;
    const char *salt;
    const char *none;
    const char *blocks[3];
    size_t nblocks;
    const char *tail; /* NULL: no tail key */
} vector_t;

#define XX PDX_HASH_XXHASH_CBOR
#define SH PDX_HASH_SHA256_CBOR
#define XX_NONE0 "1ebe36576dcb573f26b99533a20aaeca"
#define SH_NONE0                                                               \
    "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"

static const vector_t vectors[] = {
    {"seed0",
     XX,
     "0",
     seq10,
     10,
     NULL,
     NULL,
     XX_NONE0,
     {"0a8577df5ee3430515a8cc1f6e3ac52e", "d152782cb4d753bde718a811a3b75e23"},
     2,
     "7157acec76700e416a50d67e2334f6f6"},
    {"seed42",
     XX,
     "42",
     NULL,
     0,
     NULL,
     NULL,
     "a9d2e63407fce1a26c9dc9d7fa2d7caf",
     {NULL},
     0,
     NULL},
    {"seed_empty",
     XX,
     "",
     NULL,
     0,
     NULL,
     NULL,
     "902bbcf97174df1ea0a482954fa7b32a",
     {NULL},
     0,
     NULL},
    {"lora",
     XX,
     "0",
     seq10,
     10,
     "my-lora",
     NULL,
     XX_NONE0,
     {"40c55245b28642a58a560f63c489ebd2", "a2773bb8200f890723ed7d716dbdb5c9"},
     2,
     NULL},
    {"salt",
     XX,
     "0",
     seq10,
     10,
     NULL,
     "s1",
     XX_NONE0,
     {"0214f5879021bae9917f6ee682c80287", "92ef50c05675c086a87f07e16c2d6d9e"},
     2,
     NULL},
    {"lora_salt",
     XX,
     "0",
     seq10,
     10,
     "my-lora",
     "s1",
     XX_NONE0,
     {"547f61f138b524115af11d03df1f589b", "8e532ec09a17468f10633ac9175c1185"},
     2,
     NULL},
    {"big",
     XX,
     "0",
     big,
     12,
     NULL,
     NULL,
     XX_NONE0,
     {"70823d2f23d2bb76316738a5602e6439", "cffd61892b3072f4ce402c72c8aaf8b5",
      "268f1159a14524705e3f3fa226c4ff33"},
     3,
     NULL},
    {"tail_only",
     XX,
     "0",
     two,
     2,
     NULL,
     NULL,
     XX_NONE0,
     {NULL},
     0,
     "d508f46c0372b6a6e7d1b15a553b7c55"},

    {"seed0",
     SH,
     "0",
     seq10,
     10,
     NULL,
     NULL,
     SH_NONE0,
     {"c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb",
      "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6"},
     2,
     "128a226d31d49c070c027325a6f501ea097fb252653e92d2055ff7af74062fc8"},
    {"seed42",
     SH,
     "42",
     NULL,
     0,
     NULL,
     NULL,
     "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780",
     {NULL},
     0,
     NULL},
    {"seed_empty",
     SH,
     "",
     NULL,
     0,
     NULL,
     NULL,
     "8d33f520a3c4cef80d2453aef81b612bfe1cb44c8b2025630ad38662763f13d3",
     {NULL},
     0,
     NULL},
    {"lora",
     SH,
     "0",
     seq10,
     10,
     "my-lora",
     NULL,
     SH_NONE0,
     {"c4bb06ec618fa6a409a65a4879c339dde2fc098b27d584c8f4c9729d7fda3789",
      "3b3da94fa8122748137cc30473d7d799caf4f710ec367084832dedfa68bf381f"},
     2,
     NULL},
    {"salt",
     SH,
     "0",
     seq10,
     10,
     NULL,
     "s1",
     SH_NONE0,
     {"9020341895d1db6baa4083b224865c57f7b81e52553212d17c12b84945d4a9b4",
      "16c9951f90d683ce0b9f7b823efbc1b574815f8d7264f275d1f7e0e0a4b41d4c"},
     2,
     NULL},
    {"lora_salt",
     SH,
     "0",
     seq10,
     10,
     "my-lora",
     "s1",
     SH_NONE0,
     {"ff1a43ab4e77ffe5082da712a650d49d589371042f81a502141a99529a257c38",
      "d2a108db737b7d1699d4538a438662ccdc1ed6ae65198ff8414a05c61e7d7ba4"},
     2,
     NULL},
    {"big",
     SH,
     "0",
     big,
     12,
     NULL,
     NULL,
     SH_NONE0,
     {"dd764a125ed01b5d54916c6217e6b5b0b35541004e9cd2aa0f05587f85a26ed5",
      "d021f44f335713a05bfbd8fb3ea838e8e453a77c2ca8219990e43bb76fab199a",
      "8a3ecac73ec07009274682a896048cdead405c29d39f2f5b1c4a9c6f7f6194e2"},
     3,
     NULL},
    {"tail_only",
     SH,
     "0",
     two,
     2,
     NULL,
     NULL,
     SH_NONE0,
     {NULL},
     0,
     "e5e92c0da820b9cddfd77dc59ac5c9993a61499f1a66183a6fa0f84b7afbd1bb"},
};

static void assert_hex(const pdx_block_hash_t *h, const char *want,
                       const char *what) {
    char hex[PDX_BLOCK_HASH_HEX_MAX];
    pdx_block_hash_to_hex(h, hex, sizeof(hex));
    if (strcmp(hex, want) != 0)
        print_error("%s: got %s want %s\n", what, hex, want);
    assert_string_equal(hex, want);
}

static pdx_hash_extra_t make_extra(const char *lora, const char *salt) {
    pdx_hash_extra_t e = {0};
    if (lora) {
        e.field_mask |= PDX_HASH_EXTRA_FIELD_LORA_NAME;
        e.lora_name = lora;
    }
    if (salt) {
        e.field_mask |= PDX_HASH_EXTRA_FIELD_CACHE_SALT;
        e.cache_salt = salt;
    }
    return e;
}

static void test_vectors(void **state) {
    (void)state;
    for (size_t v = 0; v < sizeof(vectors) / sizeof(vectors[0]); v++) {
        const vector_t *t = &vectors[v];
        pdx_hasher_h h;
        assert_int_equal(pdx_hasher_create(t->algo, t->seed, 4, &h), PDX_OK);
        pdx_block_hash_t none, out[3], tail;
        pdx_hasher_none_hash(h, &none);
        assert_hex(&none, t->none, t->name);

        pdx_hash_extra_t e = make_extra(t->lora, t->salt);
        size_t nb = 99;
        int has_tail = -1;
        assert_int_equal(pdx_hasher_hash_blocks(h, t->tokens, t->ntokens, &e,
                                                out, 3, &nb, &tail, &has_tail),
                         PDX_OK);
        assert_int_equal(nb, t->nblocks);
        for (size_t i = 0; i < nb; i++)
            assert_hex(&out[i], t->blocks[i], t->name);
        assert_int_equal(has_tail, t->tail != NULL);
        if (t->tail)
            assert_hex(&tail, t->tail, t->name);

        /* Incremental == batch, extra keys included. */
        pdx_block_hash_t cur;
        for (size_t i = 0; i < nb; i++) {
            assert_int_equal(pdx_hasher_hash_next(h, i ? &cur : NULL,
                                                  t->tokens + 4 * i, 4, &e,
                                                  &cur),
                             PDX_OK);
            assert_true(pdx_block_hash_equal(&cur, &out[i]));
        }
        if (t->tail) {
            pdx_block_hash_t pt;
            assert_int_equal(
                pdx_hasher_hash_next(h, nb ? &cur : NULL, t->tokens + 4 * nb,
                                     t->ntokens - 4 * nb, NULL, &pt),
                PDX_OK);
            assert_true(pdx_block_hash_equal(&pt, &tail));
        }
        pdx_hasher_destroy(h);
    }
}

/* Tail rules: 0 and 1 tokens give no key, 2 do; any extra key suppresses
 * it; an empty salt is no salt (vLLM tests truthiness). */
static void test_tail_rules(void **state) {
    (void)state;
    pdx_hasher_h h;
    assert_int_equal(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, "0", 4, &h),
                     PDX_OK);
    pdx_block_hash_t out[2], tail;
    size_t nb;
    int has_tail;
    for (size_t n = 8; n <= 10; n++) {
        memset(&tail, 0xab, sizeof(tail));
        assert_int_equal(pdx_hasher_hash_blocks(h, seq10, n, NULL, out, 2, &nb,
                                                &tail, &has_tail),
                         PDX_OK);
        assert_int_equal(nb, 2);
        assert_int_equal(has_tail, n == 10);
        if (n < 10)
            assert_int_equal(tail.len, 0xab); /* untouched */
    }
    assert_hex(&tail, "7157acec76700e416a50d67e2334f6f6", "tail");

    /* One-token prompt: no block, no tail. */
    assert_int_equal(pdx_hasher_hash_blocks(h, seq10, 1, NULL, out, 0, &nb,
                                            &tail, &has_tail),
                     PDX_OK);
    assert_int_equal(nb, 0);
    assert_int_equal(has_tail, 0);
    /* Empty prompt. */
    assert_int_equal(
        pdx_hasher_hash_blocks(h, NULL, 0, NULL, NULL, 0, &nb, NULL, NULL),
        PDX_OK);
    assert_int_equal(nb, 0);

    pdx_hash_extra_t lora = make_extra("my-lora", NULL);
    pdx_hash_extra_t salt = make_extra(NULL, "s1");
    pdx_hash_extra_t empty_salt = make_extra(NULL, "");
    assert_int_equal(pdx_hasher_hash_blocks(h, seq10, 10, &lora, out, 2, &nb,
                                            &tail, &has_tail),
                     PDX_OK);
    assert_int_equal(has_tail, 0);
    assert_int_equal(pdx_hasher_hash_blocks(h, seq10, 10, &salt, out, 2, &nb,
                                            &tail, &has_tail),
                     PDX_OK);
    assert_int_equal(has_tail, 0);
    /* Empty salt and fields outside the mask are no extra keys at all. */
    pdx_hash_extra_t masked = {0};
    masked.lora_name = "ignored";
    masked.cache_salt = "ignored";
    const pdx_hash_extra_t *same[] = {&empty_salt, &masked};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(pdx_hasher_hash_blocks(h, seq10, 10, same[i], out, 2,
                                                &nb, &tail, &has_tail),
                         PDX_OK);
        assert_int_equal(has_tail, 1);
        assert_hex(&out[0], "0a8577df5ee3430515a8cc1f6e3ac52e", "masked");
        assert_hex(&tail, "7157acec76700e416a50d67e2334f6f6", "masked tail");
    }
    /* The salt changes block 0 only through the chain: block 1's own extra
     * is null, so salt != no-salt for every block. */
    assert_int_equal(
        pdx_hasher_hash_blocks(h, seq10, 8, &salt, out, 2, &nb, NULL, NULL),
        PDX_OK);
    pdx_block_hash_t b1;
    assert_int_equal(pdx_hasher_hash_next(h, &out[0], seq10 + 4, 4, NULL, &b1),
                     PDX_OK);
    assert_true(pdx_block_hash_equal(&b1, &out[1]));
    pdx_hasher_destroy(h);
}

static void test_args(void **state) {
    (void)state;
    pdx_hasher_h h = NULL;
    assert_int_equal(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, NULL, 4, &h),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, "0", 0, &h),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_hasher_create((pdx_hash_algo_t)7, "0", 4, &h),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_hasher_create(PDX_HASH_XXHASH_CBOR, "0",
                                       PDX_HASH_BLOCK_SIZE_MAX + 1, &h),
                     PDX_ERR_INVALID);
    assert_null(h);
    assert_int_equal(pdx_hasher_create(PDX_HASH_SHA256_CBOR, "0", 4, &h),
                     PDX_OK);
    assert_int_equal(pdx_hasher_algo(h), PDX_HASH_SHA256_CBOR);
    assert_int_equal(pdx_hasher_block_size(h), 4);
    pdx_block_hash_t out[2], x;
    size_t nb = 77;
    assert_int_equal(
        pdx_hasher_hash_blocks(h, seq10, 10, NULL, out, 1, &nb, NULL, NULL),
        PDX_ERR_TOO_LARGE);
    assert_int_equal(nb, 77);
    int has_tail;
    assert_int_equal(pdx_hasher_hash_blocks(h, seq10, 10, NULL, out, 2, NULL,
                                            NULL, &has_tail),
                     PDX_ERR_INVALID);
    assert_int_equal(
        pdx_hasher_hash_blocks(h, seq10, 10, NULL, out, 2, &nb, &x, NULL),
        PDX_ERR_INVALID);
    assert_int_equal(pdx_hasher_hash_next(h, NULL, seq10, 0, NULL, &x),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_hasher_hash_next(h, NULL, seq10, 5, NULL, &x),
                     PDX_ERR_INVALID);
    pdx_block_hash_t short_parent = {{0}, 16};
    assert_int_equal(pdx_hasher_hash_next(h, &short_parent, seq10, 4, NULL, &x),
                     PDX_ERR_INVALID);
    pdx_hasher_destroy(h);
    pdx_hasher_destroy(NULL);
}

/* Large block sizes take the heap path; results must not depend on it. */
static void test_large_block(void **state) {
    (void)state;
    enum { BS = 1024, N = 2 * BS + 3 };
    uint64_t *tok = malloc(N * sizeof(*tok));
    assert_non_null(tok);
    for (size_t i = 0; i < N; i++)
        tok[i] = UINT64_MAX - i; /* 9-byte encodings: > 4 KiB per block */
    for (int algo = 0; algo < 2; algo++) {
        pdx_hasher_h h;
        assert_int_equal(pdx_hasher_create((pdx_hash_algo_t)algo, "0", BS, &h),
                         PDX_OK);
        pdx_block_hash_t out[2], tail, cur;
        size_t nb;
        int has_tail;
        assert_int_equal(pdx_hasher_hash_blocks(h, tok, N, NULL, out, 2, &nb,
                                                &tail, &has_tail),
                         PDX_OK);
        assert_int_equal(nb, 2);
        assert_int_equal(has_tail, 1);
        assert_int_equal(pdx_hasher_hash_next(h, NULL, tok, BS, NULL, &cur),
                         PDX_OK);
        assert_true(pdx_block_hash_equal(&cur, &out[0]));
        assert_int_equal(
            pdx_hasher_hash_next(h, &cur, tok + BS, BS, NULL, &cur), PDX_OK);
        assert_true(pdx_block_hash_equal(&cur, &out[1]));
        assert_int_equal(
            pdx_hasher_hash_next(h, &cur, tok + 2 * BS, 3, NULL, &cur), PDX_OK);
        assert_true(pdx_block_hash_equal(&cur, &tail));
        pdx_hasher_destroy(h);
    }
    free(tok);
}

static void test_names_hex(void **state) {
    (void)state;
    pdx_hash_algo_t a;
    assert_int_equal(pdx_hash_algo_from_string("sha256_cbor", &a), PDX_OK);
    assert_int_equal(a, PDX_HASH_SHA256_CBOR);
    assert_int_equal(pdx_hash_algo_from_string("xxhash_cbor", &a), PDX_OK);
    assert_int_equal(a, PDX_HASH_XXHASH_CBOR);
    assert_int_equal(pdx_hash_algo_from_string("sha256", &a), PDX_ERR_INVALID);
    assert_int_equal(pdx_hash_algo_from_string(NULL, &a), PDX_ERR_INVALID);
    assert_string_equal(pdx_hash_algo_to_string(PDX_HASH_XXHASH_CBOR),
                        "xxhash_cbor");
    assert_string_equal(pdx_hash_algo_to_string(PDX_HASH_SHA256_CBOR),
                        "sha256_cbor");
    assert_null(pdx_hash_algo_to_string((pdx_hash_algo_t)9));
    assert_int_equal(pdx_hash_algo_digest_len(PDX_HASH_SHA256_CBOR), 32);

    pdx_block_hash_t h, g;
    assert_int_equal(pdx_block_hash_from_hex(XX_NONE0, &h), PDX_OK);
    assert_int_equal(h.len, 16);
    assert_hex(&h, XX_NONE0, "roundtrip");
    assert_int_equal(
        pdx_block_hash_from_hex("1EBE36576DCB573F26B99533A20AAECA", &g),
        PDX_OK);
    assert_true(pdx_block_hash_equal(&h, &g));
    g.bytes[15] ^= 1;
    assert_false(pdx_block_hash_equal(&h, &g));
    assert_int_equal(pdx_block_hash_from_hex(SH_NONE0, &g), PDX_OK);
    assert_int_equal(g.len, 32);
    assert_false(pdx_block_hash_equal(&h, &g));
    assert_int_equal(pdx_block_hash_from_hex("abc", &g), PDX_ERR_INVALID);
    assert_int_equal(
        pdx_block_hash_from_hex("1ebe36576dcb573f26b99533a20aaecz", &g),
        PDX_ERR_INVALID);
    char small[9];
    assert_int_equal(pdx_block_hash_to_hex(&h, small, sizeof(small)), 32);
    assert_string_equal(small, "1ebe3657");
    assert_int_equal(pdx_block_hash_to_hex(&h, NULL, 0), 32);
}

/* CBOR encoder against bytes cbor2.dumps(..., canonical=True) produced. */
static void test_cbor_bytes(void **state) {
    (void)state;
    static const struct {
        uint64_t v;
        const char *hex;
    } ints[] = {
        {0, "00"},
        {23, "17"},
        {24, "1818"},
        {255, "18ff"},
        {256, "190100"},
        {65535, "19ffff"},
        {65536, "1a00010000"},
        {UINT64_C(4294967295), "1affffffff"},
        {UINT64_C(4294967296), "1b0000000100000000"},
        {UINT64_MAX, "1bffffffffffffffff"},
    };
    uint8_t buf[64];
    char hex[129];
    pdx_cbor_writer_t w;
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        pdx_cbor_init(&w, buf, sizeof(buf));
        pdx_cbor_put_uint(&w, ints[i].v);
        for (size_t j = 0; j < w.len; j++)
            snprintf(hex + 2 * j, 3, "%02x", buf[j]);
        assert_string_equal(hex, ints[i].hex);
        assert_int_equal(w.len, pdx_cbor_head_size(ints[i].v));
    }
    /* The same values through the branch-free array path. */
    uint64_t vals[16];
    char want[256] = "8a"; /* array of 10 */
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        vals[i] = ints[i].v;
        strcat(want, ints[i].hex);
    }
    uint8_t abuf[128];
    char ahex[257];
    pdx_cbor_init(&w, abuf, sizeof(abuf));
    pdx_cbor_put_uint_array(&w, vals, 10);
    assert_false(w.overflow);
    for (size_t j = 0; j < w.len; j++)
        snprintf(ahex + 2 * j, 3, "%02x", abuf[j]);
    assert_string_equal(ahex, want);

    /* cbor2.dumps((b"ab", (1, 2**64-1), ("x", "y")), canonical=True) */
    static const uint64_t two_ints[] = {1, UINT64_MAX};
    pdx_cbor_init(&w, buf, sizeof(buf));
    pdx_cbor_put_array(&w, 3);
    pdx_cbor_put_bytes(&w, "ab", 2);
    pdx_cbor_put_uint_array(&w, two_ints, 2);
    pdx_cbor_put_array(&w, 2);
    pdx_cbor_put_text(&w, "x", 1);
    pdx_cbor_put_text(&w, "y", 1);
    pdx_cbor_put_null(&w);
    for (size_t j = 0; j < w.len; j++)
        snprintf(hex + 2 * j, 3, "%02x", buf[j]);
    assert_string_equal(hex, "8342616282011bffffffffffffffff8261786179f6");

    /* Overflow is sticky and writes nothing past cap, also on the slow
     * path of the uint array. */
    uint8_t tiny[8];
    memset(tiny, 0xee, sizeof(tiny));
    pdx_cbor_init(&w, tiny, 4);
    pdx_cbor_put_uint_array(&w, two_ints, 2);
    assert_true(w.overflow);
    assert_int_equal(w.len, 2);
    assert_int_equal(tiny[4], 0xee);
    pdx_cbor_put_null(&w);
    assert_int_equal(w.len, 2);
}

/* Reference for an array of uints: the one-value encoder, item by item. */
static size_t cbor_ref_array(uint8_t *buf, size_t cap, const uint64_t *v,
                             size_t n) {
    pdx_cbor_writer_t w;
    pdx_cbor_init(&w, buf, cap);
    pdx_cbor_put_array(&w, n);
    for (size_t i = 0; i < n; i++)
        pdx_cbor_put_uint(&w, v[i]);
    assert_false(w.overflow);
    return w.len;
}

/* pdx_cbor_put_uint_array into a heap buffer of exactly the room its fast
 * path needs (head + 9 bytes per item), so ASan sees any store past it,
 * compared with cbor_ref_array. */
static void check_uint_array(const uint64_t *v, size_t n) {
    size_t cap = PDX_CBOR_HEAD_MAX + n * PDX_CBOR_HEAD_MAX;
    uint8_t *got = malloc(cap), *want = malloc(cap);
    assert_non_null(got);
    assert_non_null(want);
    size_t want_len = cbor_ref_array(want, cap, v, n);
    pdx_cbor_writer_t w;
    pdx_cbor_init(&w, got, cap);
    pdx_cbor_put_uint_array(&w, v, n);
    assert_false(w.overflow);
    assert_int_equal(w.len, want_len);
    assert_memory_equal(got, want, want_len);
    free(got);
    free(want);
}

/* The array fast path (ids below 2^32, one 8-byte store each, table-driven
 * width) and its fallback when an id needs 8 bytes: every width boundary,
 * mixed widths inside one block, every length around the 4-way unroll. */
static void test_cbor_uint_array_widths(void **state) {
    (void)state;
    static const uint64_t edges[] = {
        0,
        1,
        7,
        8,
        15,
        16,
        17,
        23,
        24,
        25,
        31,
        32,
        127,
        128,
        255,
        256,
        257,
        4095,
        65535,
        65536,
        65537,
        131071,
        151551,
        UINT64_C(16777215),
        UINT64_C(16777216),
        UINT64_C(2147483647),
        UINT64_C(2147483648),
        UINT64_C(4294967295),
        UINT64_C(4294967296),
        UINT64_C(4294967297),
        UINT64_C(1099511627776),
        UINT64_MAX,
    };
    size_t nedges = sizeof(edges) / sizeof(edges[0]);

    /* Known bytes (cbor2, as in test_cbor_bytes) for one block mixing every
     * width below 2^32, none of them 8-byte. */
    static const uint64_t mixed[] = {23, 24, 255, 256, 65535, 65536,
                                     UINT64_C(4294967295), 0, 16, 31};
    uint8_t buf[128];
    char hex[257];
    pdx_cbor_writer_t w;
    pdx_cbor_init(&w, buf, sizeof(buf));
    pdx_cbor_put_uint_array(&w, mixed, 10);
    for (size_t j = 0; j < w.len; j++)
        snprintf(hex + 2 * j, 3, "%02x", buf[j]);
    assert_string_equal(hex, "8a17181818ff19010019ffff1a000100001affffffff"
                             "0010181f");

    /* Each edge alone, and each at every position of a block of others. */
    uint64_t blk[70];
    for (size_t e = 0; e < nedges; e++) {
        check_uint_array(&edges[e], 1);
        for (size_t pos = 0; pos < 9; pos++) {
            for (size_t i = 0; i < 9; i++)
                blk[i] = (i * 7919) % 65536 + 256; /* 3-byte items */
            blk[pos] = edges[e];
            check_uint_array(blk, 9);
        }
    }

    /* Pseudo-random blocks of every length 0..70 drawn from the edges and
     * from random values of each width; about one block in four holds an
     * id of 2^32 or more, which sends it down the 64-bit path. */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 400; round++) {
        size_t n = (size_t)round % 71;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            unsigned kind = (unsigned)(x >> 60);
            if (kind < 6)
                blk[i] = edges[(x >> 32) % (nedges - 5)]; /* < 2^32 */
            else if (kind < 15)
                blk[i] = (x & 0xffffffff) >> (x >> 40) % 32;
            else
                blk[i] = (round % 4 == 0) ? edges[nedges - 1 - (x >> 8) % 5]
                                          : 24 + (x >> 20) % 232;
        }
        check_uint_array(blk, n);
    }

    /* Every value below 2^18 and around 2^24, 2^31 and 2^32, in blocks of
     * 64 (the vLLM default) and of 61 (the unroll's tail). */
    size_t nall = (1u << 18) + 3 * 512;
    uint64_t *all = malloc(nall * sizeof(*all));
    assert_non_null(all);
    for (size_t i = 0; i < (1u << 18); i++)
        all[i] = i;
    for (size_t i = 0; i < 512; i++) {
        all[(1u << 18) + i] = UINT64_C(16777216) - 256 + i;
        all[(1u << 18) + 512 + i] = UINT64_C(2147483648) - 256 + i;
        all[(1u << 18) + 1024 + i] = UINT64_C(4294967296) - 512 + i;
    }
    for (size_t i = 0; i < nall; i += 64)
        check_uint_array(all + i, nall - i < 64 ? nall - i : 64);
    for (size_t i = 0; i < nall; i += 61)
        check_uint_array(all + i, nall - i < 61 ? nall - i : 61);
    free(all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),   cmocka_unit_test(test_tail_rules),
        cmocka_unit_test(test_args),      cmocka_unit_test(test_large_block),
        cmocka_unit_test(test_names_hex), cmocka_unit_test(test_cbor_bytes),
        cmocka_unit_test(test_cbor_uint_array_widths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
