/* pdx-bench offload: the host-memory offload pool against memcpy for saves
 * and loads of GLM-5.2 blocks, and the cost of a lookup by block hash with
 * a million blocks indexed, and what indexing one block costs in memory. */
#include <stdlib.h>
#include <string.h>

#include <pdx/kv_layout.h>
#include <pdx/kv_offload.h>

#include "bench.h"

static uint64_t rng(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Keys as block hashes are: 16 uniformly random bytes. */
static void make_key(pdx_offload_key_t *k, uint64_t a, uint64_t b)
{
    uint64_t s = a * 0x9e3779b97f4a7c15ull + b + 1;
    uint64_t x = rng(&s), y = rng(&s);
    memset(k, 0, sizeof(*k));
    memcpy(k->bytes, &x, 8);
    memcpy(k->bytes + 8, &y, 8);
    k->len = 16;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            v = strtol(line + 6, NULL, 10);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return v;
}

static double run_memcpy_blocks(uint8_t *dst, const uint8_t *src, uint64_t bb,
                                uint64_t n)
{
    uint64_t t0 = pdx_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        memcpy(dst + i * bb, src + i * bb, bb);
        sink(dst + i * bb);
    }
    return gbps(bb * n, pdx_now_ns() - t0);
}

/* Save/load of `n` GLM-5.2 blocks: `reps` interleaved rounds of memcpy,
 * save, memcpy, load; best of each kept. */
static void bench_copy(const bench_opts_t *o, cJSON *root, double *save_r,
                       double *load_r)
{
    const uint64_t bb = PDX_GLM52_BYTES_PER_BLOCK;
    uint64_t n = o->pool_blocks;
    int reps = o->quick ? 1 : 3;
    uint64_t len = bb * n;
    /* src and dst stand for KV arenas (small pages); the slab and its
     * stand-in `ref` get transparent huge pages, as the pool's slab does */
    uint8_t *src = big_alloc(len), *dst = big_alloc(len);
    uint8_t *ref = big_alloc_thp(len);
    pdx_offload_params_t p = {
        .field_mask =
            PDX_OFFLOAD_PARAM_BUDGET_BYTES | PDX_OFFLOAD_PARAM_BLOCK_BYTES,
        .budget_bytes = n * ((bb + 63) & ~63ull),
        .block_bytes = bb,
    };
    pdx_offload_pool_h pool;
    uint64_t c0 = pdx_now_ns();
    CHECK(pdx_offload_create(&p, &pool));
    double create_s = secs(pdx_now_ns() - c0);
    pdx_offload_key_t *keys = malloc(n * sizeof(*keys));
    pdx_offload_load_item_t *items = malloc(n * sizeof(*items));
    double mc_save = 0, mc_load = 0, sv = 0, ld = 0, sva = 0;
    for (int r = 0; r < reps; r++) {
        double m = run_memcpy_blocks(ref, src, bb, n);
        mc_save = m > mc_save ? m : mc_save;
        for (uint64_t i = 0; i < n; i++) {
            make_key(&keys[i], 2 * (uint64_t)r, i);
        }
        uint64_t t0 = pdx_now_ns();
        for (uint64_t i = 0; i < n; i++) {
            CHECK(pdx_offload_save(pool, &keys[i], src + i * bb,
                                   PDX_OFFLOAD_RETAINED));
        }
        double s = gbps(bb * n, pdx_now_ns() - t0);
        sv = s > sv ? s : sv;

        m = run_memcpy_blocks(dst, ref, bb, n);
        mc_load = m > mc_load ? m : mc_load;
        pdx_offload_lease_h lease;
        size_t cnt;
        t0 = pdx_now_ns();
        CHECK(pdx_offload_lease(pool, keys, n, &lease, &cnt));
        if (cnt != n) {
            die("lease found %zu of %llu blocks", cnt, (unsigned long long)n);
        }
        for (uint64_t i = 0; i < n; i++) {
            items[i] = (pdx_offload_load_item_t){i, dst + i * bb};
        }
        CHECK(pdx_offload_load(pool, lease, items, n));
        pdx_offload_release(pool, lease);
        double l = gbps(bb * n, pdx_now_ns() - t0);
        ld = l > ld ? l : ld;

        /* Async saves through the worker, waited for with flush. */
        for (uint64_t i = 0; i < n; i++) {
            make_key(&keys[i], 2 * (uint64_t)r + 1, i);
        }
        t0 = pdx_now_ns();
        for (uint64_t i = 0; i < n; i++) {
            CHECK(pdx_offload_save_async(pool, &keys[i], src + i * bb,
                                         PDX_OFFLOAD_RETAINED,
                                         PDX_OFFLOAD_SAVE_WAIT, NULL, NULL));
        }
        CHECK(pdx_offload_flush(pool, -1));
        double a = gbps(bb * n, pdx_now_ns() - t0);
        sva = a > sva ? a : sva;
    }
    *save_r = sv / mc_save;
    *load_r = ld / mc_load;
    char b[32];
    say("# save/load: %llu GLM-5.2 blocks (%llu B each, %s in all), %d "
        "interleaved rounds, best kept; pool created in %.2f s (slab "
        "prefaulted, THP)\n",
        (unsigned long long)n, (unsigned long long)bb,
        fmt_bytes(len, b, sizeof(b)), reps, create_s);
    say("%-28s %9s %9s %7s\n", "operation", "pdx GB/s", "memcpy", "ratio");
    say("%-28s %9.2f %9.2f %7.2f\n", "save (sync, one thread)", sv, mc_save,
        sv / mc_save);
    say("%-28s %9.2f %9.2f %7.2f\n", "save_async + flush (worker)", sva,
        mc_save, sva / mc_save);
    say("%-28s %9.2f %9.2f %7.2f\n", "lease + load + release", ld, mc_load,
        ld / mc_load);
    cJSON *j = cJSON_AddObjectToObject(root, "copy");
    jnum(j, "blocks", (double)n);
    jnum(j, "block_bytes", (double)bb);
    jnum(j, "rounds", reps);
    jnum(j, "pool_create_s", create_s);
    jnum(j, "save_gbps", sv);
    jnum(j, "save_async_gbps", sva);
    jnum(j, "load_gbps", ld);
    jnum(j, "memcpy_save_gbps", mc_save);
    jnum(j, "memcpy_load_gbps", mc_load);
    jnum(j, "save_ratio", sv / mc_save);
    jnum(j, "save_async_ratio", sva / mc_save);
    jnum(j, "load_ratio", ld / mc_load);
    pdx_offload_destroy(pool);
    free(keys);
    free(items);
    big_free(src, len);
    big_free(dst, len);
    big_free(ref, len);
}

/* Latency of one dependent random load in a region of `len` bytes (a
 * pointer chase over a random cycle of cache lines), with 4 KiB pages or
 * THP: what each cache and TLB miss of an index walk costs here. */
static double chase_ns(size_t len, int thp)
{
    uint8_t *m = thp ? big_alloc_thp(len) : big_alloc(len);
    size_t n = len / 64;
    uint32_t *perm = malloc(n * sizeof(*perm));
    uint64_t s = 777;
    for (size_t i = 0; i < n; i++) {
        perm[i] = (uint32_t)i;
    }
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(rng(&s) % (i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        *(uint8_t **)(void *)(m + (size_t)perm[i] * 64) =
            m + (size_t)perm[(i + 1) % n] * 64;
    }
    free(perm);
    uint8_t *p = m;
    const size_t steps = 2000000;
    uint64_t t0 = pdx_now_ns();
    for (size_t i = 0; i < steps; i++) {
        p = *(uint8_t **)(void *)p;
    }
    double ns = (double)(pdx_now_ns() - t0) / (double)steps;
    sink(p);
    big_free(m, len);
    return ns;
}

/* Lookups with `nb` blocks indexed (64-byte payloads: the index is what is
 * measured). */
static void bench_lookup(const bench_opts_t *o, cJSON *root, double *hit_ns,
                         double *prefix_ns)
{
    uint64_t nb = o->index_blocks;
    long rss0 = rss_kib();
    pdx_offload_params_t p = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS,
        .budget_bytes = nb * 64,
        .block_bytes = 64,
        .flags = PDX_OFFLOAD_FLAG_PREFAULT,
    };
    pdx_offload_pool_h pool;
    CHECK(pdx_offload_create(&p, &pool));
    pdx_offload_key_t *keys = malloc(nb * sizeof(*keys));
    uint8_t payload[64] = {0};
    uint64_t t0 = pdx_now_ns();
    for (uint64_t i = 0; i < nb; i++) {
        make_key(&keys[i], 99, i);
        CHECK(pdx_offload_save(pool, &keys[i], payload, PDX_OFFLOAD_RETAINED));
    }
    double fill_ns = (double)(pdx_now_ns() - t0) / (double)nb;
    long rss1 = rss_kib();
    pdx_offload_stats_t st;
    CHECK(pdx_offload_stats(pool, &st));
    if (st.blocks[0] + st.blocks[1] != nb) {
        die("pool indexed %llu of %llu blocks",
            (unsigned long long)(st.blocks[0] + st.blocks[1]),
            (unsigned long long)nb);
    }
    /* The keys array itself is ours, not the pool's. */
    double rss_per_block =
        ((double)(rss1 - rss0) * 1024.0 - (double)st.slab_bytes -
         (double)(nb * sizeof(*keys))) /
        (double)nb;

    /* Single-key hits in random order, the keys to ask for copied into a
     * small array first, so only the pool's misses are timed, not ours. */
    uint64_t s = 12345;
    uint64_t nq = o->quick ? 200000 : 2000000;
    const size_t qn = 1u << 14;
    pdx_offload_key_t *qk = malloc(qn * sizeof(*qk));
    pdx_offload_key_t *qm = malloc(qn * sizeof(*qm));
    for (size_t i = 0; i < qn; i++) {
        qk[i] = keys[rng(&s) % nb];
        make_key(&qm[i], 7, i);
    }
    size_t found = 0, tot = 0;
    double best_hit = 1e300, best_miss = 1e300, best_prefix = 1e300;
    int reps = o->quick ? 1 : 3;
    for (int r = 0; r < reps; r++) {
        t0 = pdx_now_ns();
        for (uint64_t q = 0; q < nq; q++) {
            CHECK(pdx_offload_query(pool, &qk[q & (qn - 1)], 1, &found));
            tot += found;
        }
        double h = (double)(pdx_now_ns() - t0) / (double)nq;
        best_hit = h < best_hit ? h : best_hit;
        /* refresh the sample: the asked keys were just made hot */
        for (size_t i = 0; i < qn; i++) {
            qk[i] = keys[rng(&s) % nb];
        }

        t0 = pdx_now_ns();
        for (uint64_t q = 0; q < nq; q++) {
            CHECK(pdx_offload_query(pool, &qm[q & (qn - 1)], 1, &found));
            tot += found;
        }
        double m = (double)(pdx_now_ns() - t0) / (double)nq;
        best_miss = m < best_miss ? m : best_miss;

        /* A 128K-token prompt's 2048 hashes, present at random places. */
        const size_t plen = 2048;
        pdx_offload_key_t *pk = malloc(plen * sizeof(*pk));
        uint64_t np = nq / plen + 1, keys_done = 0;
        uint64_t tq = 0;
        for (uint64_t q = 0; q < np; q++) {
            for (size_t i = 0; i < plen; i++) {
                pk[i] = keys[rng(&s) % nb];
            }
            uint64_t a = pdx_now_ns();
            CHECK(pdx_offload_query(pool, pk, plen, &found));
            tq += pdx_now_ns() - a;
            keys_done += plen;
            tot += found;
        }
        double pr = (double)tq / (double)keys_done;
        best_prefix = pr < best_prefix ? pr : best_prefix;
        free(pk);
    }
    free(qk);
    free(qm);
    sink(&tot);
    *hit_ns = best_hit;
    *prefix_ns = best_prefix;
    say("\n# lookups: %llu blocks indexed (16-byte random keys, 64-byte "
        "payloads), pdx_offload_query, keys in random order, %d rounds, "
        "best kept\n",
        (unsigned long long)nb, reps);
    say("%-44s %10.1f ns\n", "single-key hit (query of 1 key)", best_hit);
    say("%-44s %10.1f ns\n", "single-key miss", best_miss);
    say("%-44s %10.1f ns/key\n", "prefix of 2048 keys (a 128K-token prompt)",
        best_prefix);
    say("%-44s %10.1f ns\n", "save of a 64-byte block while filling", fill_ns);
    say("%-44s %10llu B (pool's figure: %llu metadata+table / %llu)\n",
        "index memory per block", (unsigned long long)st.index_bytes_per_block,
        (unsigned long long)st.index_bytes,
        (unsigned long long)st.capacity_blocks);
    say("%-44s %10.1f B (RSS growth - slab - our key array, per block)\n",
        "measured memory per indexed block", rss_per_block);
    /* What one miss costs in a region the index's size. */
    size_t ilen =
        ((size_t)st.index_bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    double c4k = chase_ns(ilen, 0), cthp = chase_ns(ilen, 1);
    say("%-44s %10.1f ns (4 KiB pages), %.1f ns (THP)\n",
        "reference: one dependent random load there", c4k, cthp);
    cJSON *j = cJSON_AddObjectToObject(root, "lookup");
    jnum(j, "blocks", (double)nb);
    jnum(j, "hit_ns", best_hit);
    jnum(j, "miss_ns", best_miss);
    jnum(j, "prefix2048_ns_per_key", best_prefix);
    jnum(j, "fill_save_ns", fill_ns);
    jnum(j, "index_bytes_per_block", (double)st.index_bytes_per_block);
    jnum(j, "index_bytes", (double)st.index_bytes);
    jnum(j, "measured_bytes_per_block", rss_per_block);
    jnum(j, "random_load_ns_4k", c4k);
    jnum(j, "random_load_ns_thp", cthp);
    pdx_offload_destroy(pool);
    free(keys);
}

int mode_offload(const bench_opts_t *o, cJSON *root)
{
    say("# pdx-bench offload: the host-memory offload pool (pdx/kv_offload.h)"
        ", one process\n");
    say("# method: save = pdx_offload_save of each block from a KV-like "
        "source (4 KiB pages) into the pool's slab (THP, prefaulted), new "
        "keys each round (the pool evicts the last round); load = lease "
        "the prefix, pdx_offload_load into a 4 KiB-page destination, "
        "release; memcpy = the same blocks between buffers with the same "
        "page sizes\n");
    print_machine_header(root);
    double save_r = 0, load_r = 0, hit = 0, prefix = 0;
    bench_copy(o, root, &save_r, &load_r);
    bench_lookup(o, root, &hit, &prefix);
    say("\n# targets (ratios from this run)\n");
    cJSON *jt = cJSON_AddArrayToObject(root, "targets");
    struct {
        const char *name;
        double v, goal;
        int lower;
    } t[] = {
        {"offload save >= 0.8 x memcpy", save_r, 0.8, 0},
        {"offload load >= 0.8 x memcpy", load_r, 0.8, 0},
        {"lookup <= 200 ns per block at 1M blocks (single-key hit)", hit, 200,
         1},
        {"lookup <= 200 ns per block at 1M blocks (2048-key prefix)", prefix,
         200, 1},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        int met = t[i].lower ? t[i].v <= t[i].goal : t[i].v >= t[i].goal;
        int full = o->index_blocks >= (1u << 20);
        bench_target("offload", t[i].name, 1, t[i].v, t[i].goal, t[i].lower,
                     (i >= 2 && !full) ? "fewer than 1M blocks: --quick"
                                       : "");
        say("  %-62s %8.2f  %s%s\n", t[i].name, t[i].v, met ? "MET" : "NOT MET",
            (i >= 2 && !full) ? " (fewer than 1M blocks: --quick)" : "");
        cJSON *j = cJSON_CreateObject();
        jstr(j, "target", t[i].name);
        jnum(j, "value", t[i].v);
        jnum(j, "goal", t[i].goal);
        jstr(j, "status", met ? "met" : "not met");
        cJSON_AddItemToArray(jt, j);
    }
    return 0;
}
