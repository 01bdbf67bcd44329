/* Offload tier measurements (run by hand, not by ctest): save and load
 * bandwidth against memcpy for GLM-5.2 blocks, lookup cost with 1M blocks
 * indexed, and index memory per block.
 *   bench_offload [bw_blocks (default 128)] [index_blocks (default 1048576)] */
#include <pdx/kv_offload.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pdx_clock.h"

#define GLM_BLOCK 3502592ull

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* A 32-byte random key, as a sha256/xxh3 block hash looks. */
static pdx_offload_key_t rand_key(uint64_t *s)
{
    pdx_offload_key_t k;
    for (int i = 0; i < 4; i++) {
        uint64_t v = rng_next(s);
        memcpy(k.bytes + 8 * i, &v, 8);
    }
    k.len = 32;
    return k;
}

static int check(pdx_status_t st, const char *what)
{
    if (st != PDX_OK) {
        fprintf(stderr, "%s: %s\n", what, pdx_status_string(st));
        return 1;
    }
    return 0;
}

static pdx_offload_pool_h make(uint64_t nblocks, uint64_t block_bytes,
                               uint32_t flags, uint32_t depth)
{
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS |
                      PDX_OFFLOAD_PARAM_QUEUE_DEPTH,
        .budget_bytes = nblocks * ((block_bytes + 63) / 64 * 64),
        .block_bytes = block_bytes,
        .flags = flags,
        .queue_depth = depth,
    };
    pdx_offload_pool_h pool = NULL;
    if (check(pdx_offload_create(&p, &pool), "create")) {
        exit(1);
    }
    return pool;
}

static double best(double a, double b) { return a > b ? a : b; }

/* Bandwidth in GB/s; each figure is the best of `rounds` interleaved runs
 * (memcpy, warm sync save, async save + flush, lease + load), so a noisy
 * host skews them alike. */
static void bench_bandwidth(size_t n, uint32_t flags, const char *label)
{
    enum { ROUNDS = 5 };
    size_t bytes = n * GLM_BLOCK;
    uint8_t *src = malloc(bytes);
    uint8_t *dst = malloc(bytes);
    pdx_offload_key_t *keys = malloc(2 * n * sizeof(*keys));
    pdx_offload_load_item_t *items = malloc(n * sizeof(*items));
    pdx_offload_pool_h pool;
    pdx_offload_lease_h lease;
    uint64_t seed = 42;
    size_t count;
    double t, mc = 0, cold, warm = 0, async = 0, load = 0;

    if (!src || !dst || !keys || !items) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    for (size_t i = 0; i < 2 * n; i++) {
        keys[i] = rand_key(&seed);
    }
    pool = make(n, GLM_BLOCK, flags, 64);

    /* Sync saves into a cold slab (first touch faults pages in). */
    t = pdx_now_s();
    for (size_t i = 0; i < n; i++) {
        check(pdx_offload_save(pool, &keys[i], src + i * GLM_BLOCK,
                               PDX_OFFLOAD_RETAINED),
              "save");
    }
    cold = bytes / (pdx_now_s() - t) / 1e9;

    for (int r = 0; r < ROUNDS; r++) {
        /* The pool holds set b here; saving set a, then b, makes every save
         * new, and each evicts a block. */
        pdx_offload_key_t *a = keys + n;
        pdx_offload_key_t *b = keys;

        t = pdx_now_s();
        for (size_t i = 0; i < n; i++) {
            memcpy(dst + i * GLM_BLOCK, src + i * GLM_BLOCK, GLM_BLOCK);
        }
        mc = best(mc, bytes / (pdx_now_s() - t) / 1e9);

        t = pdx_now_s();
        for (size_t i = 0; i < n; i++) {
            check(pdx_offload_save(pool, &a[i], src + i * GLM_BLOCK,
                                   PDX_OFFLOAD_RETAINED),
                  "save");
        }
        warm = best(warm, bytes / (pdx_now_s() - t) / 1e9);

        t = pdx_now_s();
        for (size_t i = 0; i < n; i++) {
            check(pdx_offload_save_async(pool, &b[i], src + i * GLM_BLOCK,
                                         PDX_OFFLOAD_RETAINED,
                                         PDX_OFFLOAD_SAVE_WAIT, NULL, NULL),
                  "save_async");
        }
        check(pdx_offload_flush(pool, -1), "flush");
        async = best(async, bytes / (pdx_now_s() - t) / 1e9);

        t = pdx_now_s();
        if (check(pdx_offload_lease(pool, b, n, &lease, &count), "lease")) {
            exit(1);
        }
        for (size_t i = 0; i < count; i++) {
            items[i].index = i;
            items[i].dst = dst + i * GLM_BLOCK;
        }
        check(pdx_offload_load(pool, lease, items, count), "load");
        pdx_offload_release(pool, lease);
        load = best(load, bytes / (pdx_now_s() - t) / 1e9);
        if (count != n || memcmp(dst, src, bytes) != 0) {
            fprintf(stderr, "load mismatch (%zu of %zu blocks)\n", count, n);
        }
    }
    printf("bandwidth %-9s %zu x %llu B, best of %d: memcpy %.2f GB/s | "
           "save warm %.2f (%.2fx) async+flush %.2f (%.2fx) | load %.2f "
           "(%.2fx) | first-touch save %.2f\n",
           label, n, (unsigned long long)GLM_BLOCK, ROUNDS, mc, warm, warm / mc,
           async, async / mc, load, load / mc, cold);
    pdx_offload_destroy(pool);
    free(items);
    free(keys);
    free(dst);
    free(src);
}

/* Reference: latency of one dependent random load over `mb` MiB on this
 * host (what a lookup's cache misses cost here). */
static void bench_latency(size_t mb)
{
    size_t n = mb * 1024 * 1024 / 64;
    uint64_t *a = malloc(n * 64);
    uint32_t *perm = malloc(n * sizeof(*perm));
    uint64_t seed = 99;
    size_t x, steps = 2000000;
    double t;

    if (a == NULL || perm == NULL) {
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        perm[i] = (uint32_t)i;
    }
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = rng_next(&seed) % (i + 1);
        uint32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (size_t i = 0; i < n; i++) {
        a[(size_t)perm[i] * 8] = perm[(i + 1) % n];
    }
    x = perm[0];
    t = pdx_now_s();
    for (size_t i = 0; i < steps; i++) {
        x = a[x * 8];
    }
    t = pdx_now_s() - t;
    printf("host: dependent random load over %zu MiB: %.1f ns (%zu)\n", mb,
           t * 1e9 / steps, x % 2);
    free(perm);
    free(a);
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = strtol(line + 6, NULL, 10);
        }
    }
    fclose(f);
    return kb;
}

/* Lookup cost with `n` blocks indexed (64-byte blocks keep the slab
 * small). Query keys are random present blocks, laid out beforehand as a
 * caller's key list would be; each figure is the best of 3 passes. */
static void bench_lookup(size_t n)
{
    enum { BLOCK = 64 };
    static const size_t batches[] = {1, 16, 64, 512};
    pdx_offload_key_t *keys = malloc(n * sizeof(*keys));
    pdx_offload_key_t *qkeys = malloc(n * sizeof(*qkeys));
    uint8_t payload[BLOCK] = {0};
    pdx_offload_pool_h pool;
    pdx_offload_stats_t st;
    uint64_t seed = 7;
    size_t prefix, total = 0;
    long rss0, rss1;
    double t, ns;

    if (keys == NULL || qkeys == NULL) {
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        keys[i] = rand_key(&seed);
    }
    for (size_t i = 0; i < n; i++) {
        qkeys[i] = keys[rng_next(&seed) % n];
    }
    rss0 = rss_kb();
    pool = make(n, BLOCK, 0, 1);
    t = pdx_now_s();
    for (size_t i = 0; i < n; i++) {
        check(pdx_offload_save(pool, &keys[i], payload, PDX_OFFLOAD_RETAINED),
              "save");
    }
    t = pdx_now_s() - t;
    rss1 = rss_kb();
    pdx_offload_stats(pool, &st);
    printf("index %zu blocks of %d B: insert %.0f ns/block (first touch); "
           "index %llu B = %llu B/block (64 metadata + %llu table); rss "
           "+%.1f B/block incl. the %d B payload\n",
           n, BLOCK, t * 1e9 / n, (unsigned long long)st.index_bytes,
           (unsigned long long)st.index_bytes_per_block,
           (unsigned long long)st.index_bytes_per_block - 64,
           (rss1 - rss0) * 1024.0 / n, BLOCK);

    for (size_t b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
        size_t batch = batches[b];
        size_t nq = n / batch;
        ns = 1e30;
        for (int pass = 0; pass < 3; pass++) {
            t = pdx_now_s();
            for (size_t q = 0; q < nq; q++) {
                pdx_offload_query(pool, qkeys + q * batch, batch, &prefix);
                total += prefix;
            }
            t = pdx_now_s() - t;
            if (t * 1e9 / (nq * batch) < ns) {
                ns = t * 1e9 / (nq * batch);
            }
        }
        printf("lookup: query of %3zu present keys (hits, LRU refresh): "
               "%.1f ns/block\n",
               batch, ns);
    }
    /* Misses: absent keys, one per query. */
    for (size_t i = 0; i < n; i++) {
        qkeys[i] = rand_key(&seed);
    }
    ns = 1e30;
    for (int pass = 0; pass < 3; pass++) {
        t = pdx_now_s();
        for (size_t i = 0; i < n; i++) {
            pdx_offload_query(pool, &qkeys[i], 1, &prefix);
            total += prefix;
        }
        t = pdx_now_s() - t;
        if (t * 1e9 / n < ns) {
            ns = t * 1e9 / n;
        }
    }
    printf("lookup: query of 1 absent key: %.1f ns/block\n", ns);
    if (total == 0) {
        printf("(no hits?)\n");
    }
    pdx_offload_destroy(pool);
    free(qkeys);
    free(keys);
}

int main(int argc, char **argv)
{
    size_t bw_blocks = argc > 1 ? strtoull(argv[1], NULL, 10) : 128;
    size_t idx_blocks = argc > 2 ? strtoull(argv[2], NULL, 10) : 1048576;

    bench_latency(64);
    if (bw_blocks > 0) {
        bench_bandwidth(bw_blocks,
                        PDX_OFFLOAD_FLAG_ASYNC_SAVE | PDX_OFFLOAD_FLAG_HUGEPAGE,
                        "thp-lazy");
        bench_bandwidth(bw_blocks, PDX_OFFLOAD_FLAG_ASYNC_SAVE, "4k-lazy");
        bench_bandwidth(bw_blocks,
                        PDX_OFFLOAD_FLAG_ASYNC_SAVE |
                            PDX_OFFLOAD_FLAG_HUGEPAGE |
                            PDX_OFFLOAD_FLAG_PREFAULT,
                        "default");
    }
    if (idx_blocks > 0) {
        bench_lookup(idx_blocks);
    }
    return 0;
}
