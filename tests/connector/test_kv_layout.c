/* KV layout: GLM-5.2 shape, fingerprint scope, per-block / merged / paired
 * descriptor lists, carving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <pdx/kv_layout.h>

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void test_glm52_shape(void **state) {
    (void)state;
    pdx_layout_h l;
    assert_int_equal(pdx_layout_glm52(1000, PDX_MEM_VRAM, 3, &l), PDX_OK);
    assert_int_equal(pdx_layout_num_arenas(l), 101);
    assert_int_equal(pdx_layout_block_tokens(l), 64);
    assert_int_equal(pdx_layout_bytes_per_block(l), 3502592);
    assert_int_equal(pdx_layout_bytes_per_block(l), PDX_GLM52_BYTES_PER_BLOCK);
    assert_int_equal(pdx_layout_num_blocks(l), 1000);
    assert_int_equal(pdx_layout_mem_type(l), PDX_MEM_VRAM);

    size_t mla = 0, idx = 0, mtp = 0;
    uint32_t idx_layers[32];
    for (size_t i = 0; i < 101; i++) {
        pdx_arena_t a;
        assert_int_equal(pdx_layout_get_arena(l, i, &a), PDX_OK);
        assert_int_equal(a.block_tokens, 64);
        assert_int_equal(a.num_blocks, 1000);
        assert_int_equal(a.dev_id, 3);
        assert_int_equal(a.stride, (uint64_t)a.bytes_per_token * 64);
        if (a.kind == PDX_KV_KIND_MLA) {
            assert_int_equal(a.bytes_per_token, 656);
            mla++;
        } else {
            assert_int_equal(a.kind, PDX_KV_KIND_INDEX_K);
            assert_int_equal(a.bytes_per_token, 132);
            if (!a.is_mtp)
                idx_layers[idx++] = a.layer;
        }
        if (a.is_mtp) {
            assert_int_equal(a.layer, 78);
            mtp++;
        } else {
            assert_in_range(a.layer, 0, 77);
        }
    }
    assert_int_equal(mla, 79);
    assert_int_equal(idx, 21);
    assert_int_equal(mtp, 2);
    static const uint32_t want[21] = {0,  1,  2,  6,  10, 14, 18,
                                      22, 26, 30, 34, 38, 42, 46,
                                      50, 54, 58, 62, 66, 70, 74};
    assert_memory_equal(idx_layers, want, sizeof(want));
    for (uint32_t layer = 0; layer < 78; layer++) {
        int has = 0;
        for (size_t k = 0; k < 21; k++)
            has |= want[k] == layer;
        assert_int_equal(pdx_glm52_has_index_k(layer), has);
    }

    /* Names and order: layer-major, MLA before index-K, MTP last. */
    pdx_arena_t a;
    assert_int_equal(pdx_layout_get_arena(l, 0, &a), PDX_OK);
    assert_string_equal(a.name, "layer0.mla");
    assert_int_equal(pdx_layout_get_arena(l, 1, &a), PDX_OK);
    assert_string_equal(a.name, "layer0.index_k");
    assert_int_equal(pdx_layout_get_arena(l, 99, &a), PDX_OK);
    assert_string_equal(a.name, "mtp78.mla");
    assert_int_equal(pdx_layout_get_arena(l, 100, &a), PDX_OK);
    assert_string_equal(a.name, "mtp78.index_k");
    assert_int_equal(pdx_layout_get_arena(l, 101, &a), PDX_ERR_NOT_FOUND);
    size_t i;
    assert_int_equal(pdx_layout_find_arena(l, "layer74.index_k", &i), PDX_OK);
    assert_int_equal(pdx_layout_find_arena(l, "layer75.index_k", &i),
                     PDX_ERR_NOT_FOUND);
    pdx_layout_destroy(l);
}

static void test_fingerprint(void **state) {
    (void)state;
    pdx_layout_h a, b;
    assert_int_equal(pdx_layout_glm52(1000, PDX_MEM_VRAM, 0, &a), PDX_OK);
    assert_int_equal(pdx_layout_glm52(77, PDX_MEM_DRAM, 5, &b), PDX_OK);
    uint64_t fp = pdx_layout_fingerprint(a);
    /* Block counts, memory type and devices are each side's own. */
    assert_int_equal(pdx_layout_fingerprint(b), fp);
    /* So are bases. */
    uint64_t sz = pdx_layout_carve_size(a, 4096);
    assert_int_equal(pdx_layout_carve(a, 0x7f0000000000ull, sz, 4096, 1),
                     PDX_OK);
    assert_int_equal(pdx_layout_fingerprint(a), fp);
    pdx_layout_destroy(b);

    /* A different byte/token, name, layer, kind, MTP flag, block size or
     * arena order changes it. */
    pdx_arena_t base = {
        .field_mask = 0,
        .name = "x",
        .layer = 0,
        .kind = PDX_KV_KIND_MLA,
        .bytes_per_token = 656,
        .num_blocks = 10,
    };
    uint64_t fps[8];
    for (int v = 0; v < 8; v++) {
        pdx_layout_h l;
        assert_int_equal(pdx_layout_create(v == 6 ? 32 : 64, &l), PDX_OK);
        pdx_arena_t x = base, y = base;
        y.name = "y";
        y.kind = PDX_KV_KIND_INDEX_K;
        y.bytes_per_token = 132;
        switch (v) {
        case 1:
            x.bytes_per_token = 657;
            break;
        case 2:
            x.name = "z";
            break;
        case 3:
            x.layer = 1;
            break;
        case 4:
            x.kind = PDX_KV_KIND_KV;
            break;
        case 5:
            x.field_mask |= PDX_ARENA_FIELD_IS_MTP;
            x.is_mtp = 1;
            break;
        default:
            break;
        }
        if (v == 7) { /* same arenas, swapped order */
            assert_int_equal(pdx_layout_add_arena(l, &y, NULL), PDX_OK);
            assert_int_equal(pdx_layout_add_arena(l, &x, NULL), PDX_OK);
        } else {
            assert_int_equal(pdx_layout_add_arena(l, &x, NULL), PDX_OK);
            assert_int_equal(pdx_layout_add_arena(l, &y, NULL), PDX_OK);
        }
        fps[v] = pdx_layout_fingerprint(l);
        pdx_layout_destroy(l);
    }
    for (int i = 0; i < 8; i++)
        for (int j = i + 1; j < 8; j++)
            assert_true(fps[i] != fps[j]);

    /* Dropping one arena of the GLM layout changes it too. */
    pdx_layout_h c;
    assert_int_equal(pdx_layout_create(64, &c), PDX_OK);
    for (size_t i = 0; i + 1 < pdx_layout_num_arenas(a); i++) {
        pdx_arena_t ar;
        assert_int_equal(pdx_layout_get_arena(a, i, &ar), PDX_OK);
        assert_int_equal(pdx_layout_add_arena(c, &ar, NULL), PDX_OK);
    }
    assert_true(pdx_layout_fingerprint(c) != fp);
    pdx_layout_destroy(c);
    pdx_layout_destroy(a);
}

static void test_add_arena_errors(void **state) {
    (void)state;
    pdx_layout_h l;
    assert_int_equal(pdx_layout_create(0, &l), PDX_ERR_INVALID);
    assert_int_equal(pdx_layout_create(16, &l), PDX_OK);
    pdx_arena_t a = {.name = "a", .bytes_per_token = 8, .num_blocks = 4};
    pdx_arena_t bad = a;
    bad.name = "";
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    char longname[PDX_ARENA_NAME_MAX + 2];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    bad.name = longname;
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    bad = a;
    bad.bytes_per_token = 0;
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    bad = a;
    bad.field_mask = PDX_ARENA_FIELD_BLOCK_TOKENS;
    bad.block_tokens = 32;
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    bad = a;
    bad.field_mask = PDX_ARENA_FIELD_STRIDE;
    bad.stride = 127; /* block bytes are 128 */
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    bad = a;
    bad.field_mask = PDX_ARENA_FIELD_BASE;
    bad.base = UINT64_MAX - 100;
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    size_t idx = 9;
    assert_int_equal(pdx_layout_add_arena(l, &a, &idx), PDX_OK);
    assert_int_equal(idx, 0);
    assert_int_equal(pdx_layout_add_arena(l, &a, NULL), PDX_ERR_EXISTS);
    bad = a;
    bad.name = "vram";
    bad.field_mask = PDX_ARENA_FIELD_MEM_TYPE;
    bad.mem_type = PDX_MEM_VRAM;
    assert_int_equal(pdx_layout_add_arena(l, &bad, NULL), PDX_ERR_INVALID);
    assert_int_equal(pdx_layout_num_arenas(l), 1);
    assert_int_equal(pdx_layout_set_base(l, 1, 0, 0), PDX_ERR_NOT_FOUND);
    assert_int_equal(pdx_layout_set_base(l, 0, UINT64_MAX - 10, 0),
                     PDX_ERR_INVALID);
    pdx_layout_destroy(l);
    pdx_layout_destroy(NULL);
}

/* Two arenas: "a" packed (16 B blocks) at 0x1000, "b" padded (8 B blocks,
 * stride 16) at 0x100000, 64 blocks each, block size 2. */
static pdx_layout_h two_arenas(uint64_t abase, uint64_t bbase, int b_packed) {
    pdx_layout_h l;
    assert_int_equal(pdx_layout_create(2, &l), PDX_OK);
    pdx_arena_t a = {.field_mask = PDX_ARENA_FIELD_BASE,
                     .name = "a",
                     .bytes_per_token = 8,
                     .num_blocks = 64,
                     .base = abase};
    pdx_arena_t b = {.field_mask =
                         PDX_ARENA_FIELD_BASE | PDX_ARENA_FIELD_STRIDE,
                     .name = "b",
                     .layer = 1,
                     .bytes_per_token = 4,
                     .num_blocks = 64,
                     .base = bbase,
                     .stride = b_packed ? 8 : 16};
    assert_int_equal(pdx_layout_add_arena(l, &a, NULL), PDX_OK);
    assert_int_equal(pdx_layout_add_arena(l, &b, NULL), PDX_OK);
    return l;
}

static void assert_desc(const pdx_desc_t *d, uint64_t addr, uint64_t len) {
    if (d->addr != addr || d->len != len)
        print_error("desc {0x%llx, %llu}, want {0x%llx, %llu}\n",
                    (unsigned long long)d->addr, (unsigned long long)d->len,
                    (unsigned long long)addr, (unsigned long long)len);
    assert_int_equal(d->addr, addr);
    assert_int_equal(d->len, len);
}

static void test_block_descs(void **state) {
    (void)state;
    pdx_layout_h l = two_arenas(0x1000, 0x100000, 0);
    const uint64_t ids[] = {3, 4, 9};
    pdx_desc_t d[6];
    size_t n = 0;
    assert_int_equal(pdx_layout_block_descs(l, ids, 3, NULL, 0, &n), PDX_OK);
    assert_int_equal(n, 6);
    assert_int_equal(pdx_layout_block_descs(l, ids, 3, d, 5, &n),
                     PDX_ERR_TOO_LARGE);
    assert_int_equal(pdx_layout_block_descs(l, ids, 3, d, 6, &n), PDX_OK);
    assert_desc(&d[0], 0x1000 + 3 * 16, 16);
    assert_desc(&d[1], 0x1000 + 4 * 16, 16);
    assert_desc(&d[2], 0x1000 + 9 * 16, 16);
    assert_desc(&d[3], 0x100000 + 3 * 16, 8);
    assert_desc(&d[4], 0x100000 + 4 * 16, 8);
    assert_desc(&d[5], 0x100000 + 9 * 16, 8);
    const uint64_t bad_id[] = {64};
    assert_int_equal(pdx_layout_block_descs(l, bad_id, 1, d, 6, &n),
                     PDX_ERR_INVALID);
    pdx_layout_destroy(l);
}

static void test_merged_descs(void **state) {
    (void)state;
    pdx_layout_h l = two_arenas(0x1000, 0x100000, 1);
    pdx_desc_t d[128];
    size_t n;

    /* 0..N-1 in order: one descriptor per arena. */
    uint64_t all[64];
    for (int i = 0; i < 64; i++)
        all[i] = (uint64_t)i;
    assert_int_equal(pdx_layout_merged_descs(l, all, 64, d, 128, &n), PDX_OK);
    assert_int_equal(n, 2);
    assert_desc(&d[0], 0x1000, 64 * 16);
    assert_desc(&d[1], 0x100000, 64 * 8);

    /* Gaps split runs; descending and repeated ids never merge. */
    const uint64_t ids[] = {2, 3, 4, 7, 8, 20, 19, 18, 18, 30};
    assert_int_equal(pdx_layout_merged_descs(l, ids, NELEM(ids), NULL, 0, &n),
                     PDX_OK);
    assert_int_equal(n, 2 * 7);
    assert_int_equal(pdx_layout_merged_descs(l, ids, NELEM(ids), d, 13, &n),
                     PDX_ERR_TOO_LARGE);
    assert_int_equal(pdx_layout_merged_descs(l, ids, NELEM(ids), d, 14, &n),
                     PDX_OK);
    assert_int_equal(n, 14);
    const struct {
        uint64_t id, nb;
    } want[] = {{2, 3}, {7, 2}, {20, 1}, {19, 1}, {18, 1}, {18, 1}, {30, 1}};
    for (size_t i = 0; i < 7; i++) {
        assert_desc(&d[i], 0x1000 + want[i].id * 16, want[i].nb * 16);
        assert_desc(&d[7 + i], 0x100000 + want[i].id * 8, want[i].nb * 8);
    }
    pdx_layout_destroy(l);

    /* A padded arena never merges; the packed one still does. */
    l = two_arenas(0x1000, 0x100000, 0);
    assert_int_equal(pdx_layout_merged_descs(l, ids, NELEM(ids), d, 128, &n),
                     PDX_OK);
    assert_int_equal(n, 7 + 10);
    assert_desc(&d[0], 0x1000 + 2 * 16, 3 * 16);
    for (size_t i = 0; i < NELEM(ids); i++)
        assert_desc(&d[7 + i], 0x100000 + ids[i] * 16, 8);

    /* Empty id list. */
    assert_int_equal(pdx_layout_merged_descs(l, NULL, 0, d, 0, &n), PDX_OK);
    assert_int_equal(n, 0);
    pdx_layout_destroy(l);
}

static void test_paired_descs(void **state) {
    (void)state;
    /* Same shape, different bases (and pool sizes via ids). */
    pdx_layout_h loc = two_arenas(0x1000, 0x100000, 1);
    pdx_layout_h rem = two_arenas(0x900000, 0xa00000, 1);
    const uint64_t lids[] = {0, 1, 2, 3, 10, 11, 12};
    const uint64_t rids[] = {5, 6, 40, 41, 42, 43, 44};
    /* Runs where both continue: {0,1}->{5,6}, {2,3}->{40,41},
     * {10,11,12}->{42,43,44}: the local run 0..3 is cut by the remote gap
     * and the remote run 40..44 by the local one. */
    pdx_desc_t ld[14], rd[14];
    size_t n;
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, rem, rids, 7, NULL, NULL, 0, &n),
        PDX_OK);
    assert_int_equal(n, 6);
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, rem, rids, 7, ld, rd, 5, &n),
        PDX_ERR_TOO_LARGE);
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, rem, rids, 7, ld, rd, 14, &n),
        PDX_OK);
    assert_int_equal(n, 6);
    const struct {
        uint64_t l, r, nb;
    } want[] = {{0, 5, 2}, {2, 40, 2}, {10, 42, 3}};
    for (size_t i = 0; i < 3; i++) {
        assert_desc(&ld[i], 0x1000 + want[i].l * 16, want[i].nb * 16);
        assert_desc(&rd[i], 0x900000 + want[i].r * 16, want[i].nb * 16);
        assert_desc(&ld[3 + i], 0x100000 + want[i].l * 8, want[i].nb * 8);
        assert_desc(&rd[3 + i], 0xa00000 + want[i].r * 8, want[i].nb * 8);
    }
    for (size_t j = 0; j < n; j++)
        assert_int_equal(ld[j].len, rd[j].len);

    /* Remote arena "b" padded: that arena pairs block by block. */
    pdx_layout_h pad = two_arenas(0x900000, 0xa00000, 0);
    assert_int_equal(pdx_layout_fingerprint(pad), pdx_layout_fingerprint(loc));
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, pad, rids, 7, ld, rd, 14, &n),
        PDX_OK);
    assert_int_equal(n, 3 + 7);
    for (size_t i = 0; i < 7; i++) {
        assert_desc(&ld[3 + i], 0x100000 + lids[i] * 8, 8);
        assert_desc(&rd[3 + i], 0xa00000 + rids[i] * 16, 8);
    }

    /* Layout mismatch is refused. */
    pdx_layout_h glm;
    assert_int_equal(pdx_layout_glm52(64, PDX_MEM_DRAM, 0, &glm), PDX_OK);
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, glm, rids, 7, ld, rd, 14, &n),
        PDX_ERR_MISMATCH);
    /* Remote id beyond the remote pool. */
    const uint64_t far[] = {0, 1, 2, 3, 10, 11, 64};
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, rem, far, 7, ld, rd, 14, &n),
        PDX_ERR_INVALID);
    /* One out list without the other. */
    assert_int_equal(
        pdx_layout_paired_descs(loc, lids, rem, rids, 7, ld, NULL, 14, &n),
        PDX_ERR_INVALID);
    pdx_layout_destroy(glm);
    pdx_layout_destroy(pad);
    pdx_layout_destroy(rem);
    pdx_layout_destroy(loc);
}

/* Full GLM-5.2 request: a 128K-token prompt's 2048 contiguous blocks give
 * one paired descriptor per arena. */
static void test_glm52_paired(void **state) {
    (void)state;
    pdx_layout_h p, d;
    assert_int_equal(pdx_layout_glm52(4096, PDX_MEM_VRAM, 0, &p), PDX_OK);
    assert_int_equal(pdx_layout_glm52(3000, PDX_MEM_VRAM, 1, &d), PDX_OK);
    assert_int_equal(pdx_layout_carve(p, 0x10000000000ull,
                                      pdx_layout_carve_size(p, 2 << 20),
                                      2 << 20, 0),
                     PDX_OK);
    assert_int_equal(pdx_layout_carve(d, 0x20000000000ull,
                                      pdx_layout_carve_size(d, 0), 0, 1),
                     PDX_OK);
    enum { N = 2048 };
    uint64_t *lids = malloc(N * sizeof(*lids)),
             *rids = malloc(N * sizeof(*rids));
    for (size_t i = 0; i < N; i++) {
        lids[i] = 1000 + i;
        rids[i] = 500 + i;
    }
    pdx_desc_t *ld = malloc(101 * N * sizeof(*ld));
    pdx_desc_t *rd = malloc(101 * N * sizeof(*rd));
    size_t n;
    assert_int_equal(
        pdx_layout_paired_descs(p, lids, d, rids, N, ld, rd, 101 * N, &n),
        PDX_OK);
    assert_int_equal(n, 101);
    uint64_t total = 0;
    for (size_t j = 0; j < n; j++) {
        assert_int_equal(ld[j].len, rd[j].len);
        assert_int_equal(rd[j].dev_id, 1);
        total += ld[j].len;
    }
    assert_int_equal(total, (uint64_t)N * PDX_GLM52_BYTES_PER_BLOCK);
    /* Remote id 3000 is past D's pool although P has it. */
    rids[N - 1] = 3000;
    assert_int_equal(
        pdx_layout_paired_descs(p, lids, d, rids, N, ld, rd, 101 * N, &n),
        PDX_ERR_INVALID);
    free(ld);
    free(rd);
    free(lids);
    free(rids);
    pdx_layout_destroy(d);
    pdx_layout_destroy(p);
}

static void test_carve(void **state) {
    (void)state;
    pdx_layout_h l = two_arenas(0, 0, 0); /* 64 * 16 B each */
    assert_int_equal(pdx_layout_carve_size(l, 0), 2048);
    assert_int_equal(pdx_layout_carve_size(l, 4096), 4096 + 1024);
    assert_int_equal(pdx_layout_carve_size(l, 3), UINT64_MAX);
    uint8_t *buf = malloc(2048);
    assert_int_equal(pdx_layout_carve(l, (uintptr_t)buf, 2047, 0, 0),
                     PDX_ERR_NO_SPACE);
    assert_int_equal(pdx_layout_carve(l, (uintptr_t)buf, 2048, 3, 0),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_layout_carve(l, (uintptr_t)buf, 2048, 1, 0), PDX_OK);
    pdx_arena_t a, b;
    assert_int_equal(pdx_layout_get_arena(l, 0, &a), PDX_OK);
    assert_int_equal(pdx_layout_get_arena(l, 1, &b), PDX_OK);
    assert_int_equal(a.base, (uintptr_t)buf);
    assert_int_equal(b.base, (uintptr_t)buf + 1024);
    /* Every block descriptor lies inside the buffer: write through them. */
    uint64_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = (uint64_t)(63 - i);
    pdx_desc_t d[128];
    size_t n;
    assert_int_equal(pdx_layout_block_descs(l, ids, 64, d, 128, &n), PDX_OK);
    for (size_t j = 0; j < n; j++)
        memset((void *)(uintptr_t)d[j].addr, 0x5a, d[j].len);
    free(buf);
    pdx_layout_destroy(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glm52_shape),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_add_arena_errors),
        cmocka_unit_test(test_block_descs),
        cmocka_unit_test(test_merged_descs),
        cmocka_unit_test(test_paired_descs),
        cmocka_unit_test(test_glm52_paired),
        cmocka_unit_test(test_carve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
