/* The offload tier over VRAM arenas, on the fake CUDA driver: blocks saved
 * whole (pdx_kv_save) and layer by layer (pdx_kv_save_layer) are copied
 * out of the device through the driver, found again by their hashes, and
 * loaded back into other blocks byte-exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda.h>

#include <pdx/kv_connector.h>
#include <pdx/log.h>
#include "poll_until.h"

#define NB 8
#define B 64

static const char CONFIG[] =
    "{\"model\": {\"id\": \"t/vram\", \"kv_dtype\": \"fp8_ds_mla\","
    " \"num_layers\": 1, \"mla_bytes_per_token\": 1444},"
    " \"kv\": {\"block_tokens\": 64, \"num_blocks\": 8, \"memory\": "
    "\"vram\"},"
    " \"hashing\": {\"algorithm\": \"sha256_cbor\", \"seed\": \"0\"},"
    " \"agent\": {\"role\": \"both\", \"name\": \"vram-off\"},"
    " \"connector\": {\"children\": [{\"type\": \"offload\","
    " \"budget_bytes\": \"8MiB\"}]},"
    " \"backends\": [{\"name\": \"ucx\", \"options\": {\"tls\": \"sm\"}}]}";

typedef struct vnode {
    pdx_kv_config_t cfg;
    pdx_layout_h layout;
    CUdeviceptr mem;
    uint64_t size;
    pdx_kv_connector_h conn;
} vnode_t;

static CUcontext g_ctx;

static void fill(vnode_t *n, uint64_t id, uint64_t seed, int check)
{
    for (size_t a = 0; a < pdx_layout_num_arenas(n->layout); a++) {
        pdx_arena_t ar;
        pdx_layout_get_arena(n->layout, a, &ar);
        size_t len = (size_t)ar.bytes_per_token * B;
        unsigned char *want = malloc(len), *got = malloc(len);
        for (size_t i = 0; i < len; i++) {
            want[i] = (unsigned char)(seed * 131 + a * 7 + i * 13);
        }
        CUdeviceptr p = (CUdeviceptr)(ar.base + id * ar.stride);
        if (check) {
            assert_int_equal(cuMemcpyDtoH(got, p, len), CUDA_SUCCESS);
            assert_memory_equal(got, want, len);
        } else {
            assert_int_equal(cuMemcpyHtoD(p, want, len), CUDA_SUCCESS);
        }
        free(want);
        free(got);
    }
}

static pdx_status_t vnode_up(vnode_t *n)
{
    char err[256];
    assert_int_equal(pdx_kv_config_parse(CONFIG, strlen(CONFIG), "vram",
                                         &n->cfg, err, sizeof(err)),
                     PDX_OK);
    assert_int_equal(pdx_layout_create(B, &n->layout), PDX_OK);
    const struct {
        const char *name;
        uint32_t layer, bpt;
        pdx_kv_kind_t kind;
    } ar[] = {{"layer0.mla", 0, 656, PDX_KV_KIND_MLA},
              {"layer0.index_k", 0, 132, PDX_KV_KIND_INDEX_K},
              {"layer1.mla", 1, 656, PDX_KV_KIND_MLA}};
    for (size_t i = 0; i < 3; i++) {
        pdx_arena_t a = {.field_mask = PDX_ARENA_FIELD_MEM_TYPE,
                         .name = ar[i].name, .layer = ar[i].layer,
                         .kind = ar[i].kind, .bytes_per_token = ar[i].bpt,
                         .num_blocks = NB, .mem_type = PDX_MEM_VRAM};
        assert_int_equal(pdx_layout_add_arena(n->layout, &a, NULL), PDX_OK);
    }
    n->size = pdx_layout_carve_size(n->layout, 4096);
    assert_int_equal(cuMemAlloc(&n->mem, n->size), CUDA_SUCCESS);
    assert_int_equal(pdx_layout_carve(n->layout, (uint64_t)n->mem, n->size,
                                      4096, 0),
                     PDX_OK);
    pdx_kv_connector_params_t p = {
        .field_mask = PDX_KV_PARAM_CONFIG | PDX_KV_PARAM_LAYOUT,
        .config = &n->cfg, .layout = n->layout};
    return pdx_kv_connector_create(&p, &n->conn);
}

static void vnode_down(vnode_t *n)
{
    pdx_kv_connector_destroy(n->conn);
    pdx_layout_destroy(n->layout);
    cuMemFree(n->mem);
}

static void request(vnode_t *n, uint64_t salt, pdx_block_hash_t *hs,
                    pdx_kv_request_t *r, const char *id)
{
    uint64_t tok[200];
    for (size_t i = 0; i < 200; i++) {
        tok[i] = (i * 2654435761u + salt) % 151552;
    }
    size_t nb;
    int has_tail;
    pdx_block_hash_t tail;
    assert_int_equal(pdx_hasher_hash_blocks(pdx_kv_connector_hasher(n->conn),
                                            tok, 200, NULL, hs, 3, &nb,
                                            &tail, &has_tail),
                     PDX_OK);
    *r = (pdx_kv_request_t){.req_id = id, .hashes = hs, .nfull = nb,
                            .has_tail = has_tail != 0, .tail_hash = tail,
                            .tail_tokens = 200 % B, .prompt_tokens = 200};
}

static void saved(vnode_t *n, const char *id)
{
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 20000) {
        st = pdx_kv_save_check(n->conn, id);
    }
    assert_int_equal(st, PDX_OK);
}

/* Look `r` up (all 3 blocks and the tail in the pool) and load it into
 * blocks 4..7, then check them against blocks `from`..`from`+3's seeds. */
static void load_back(vnode_t *n, pdx_kv_request_t *r, uint64_t seed0)
{
    pdx_kv_match_t m;
    assert_int_equal(pdx_kv_lookup(n->conn, r, &m), PDX_OK);
    assert_int_equal(m.source, PDX_KV_SOURCE_OFFLOAD);
    assert_int_equal(m.blocks, 3);
    assert_true(m.tail);
    uint64_t ids[4] = {4, 5, 6, 7};
    assert_int_equal(pdx_kv_load(n->conn, r, &m, ids), PDX_OK);
    size_t tokens;
    assert_int_equal(pdx_kv_load_check(n->conn, r->req_id, &tokens), PDX_OK);
    assert_int_equal(tokens, 199);
    for (uint64_t i = 0; i < 4; i++) {
        fill(n, 4 + i, seed0 + i, 1);
    }
}

static void test_vram_offload(void **state)
{
    (void)state;
    vnode_t n;
    assert_int_equal(vnode_up(&n), PDX_OK);
    pdx_block_hash_t h1[3], h2[3];
    pdx_kv_request_t r1, r2;
    request(&n, 1, h1, &r1, "whole");
    request(&n, 2, h2, &r2, "layers");
    uint64_t ids[4] = {0, 1, 2, 3};
    for (uint64_t i = 0; i < 4; i++) {
        fill(&n, i, 10 + i, 0);
    }
    assert_int_equal(pdx_kv_save(n.conn, &r1, ids), PDX_OK);
    saved(&n, "whole");
    for (uint64_t i = 0; i < 4; i++) {
        fill(&n, i, 20 + i, 0);
    }
    for (uint32_t layer = 0; layer < 2; layer++) {
        pdx_kv_layer_save_t ls = {
            .field_mask = PDX_KV_LAYER_SAVE_LAYER |
                          PDX_KV_LAYER_SAVE_NBLOCKS |
                          PDX_KV_LAYER_SAVE_TOKENS | PDX_KV_LAYER_SAVE_LAST,
            .layer = layer, .nblocks = 4, .tokens = 200, .last = true};
        assert_int_equal(pdx_kv_save_layer(n.conn, &r2, &ls, ids), PDX_OK);
    }
    saved(&n, "layers");
    for (uint64_t i = 0; i < NB; i++) {
        fill(&n, i, 99, 0); /* the GPU cache forgets */
    }
    r1.req_id = "whole-back";
    load_back(&n, &r1, 10);
    r2.req_id = "layers-back";
    load_back(&n, &r2, 20);
    vnode_down(&n);
}

int main(void)
{
    CUdevice d;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&g_ctx, d) != CUDA_SUCCESS ||
        cuCtxPushCurrent(g_ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "kv_offload_vram: no (fake) CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vram_offload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
