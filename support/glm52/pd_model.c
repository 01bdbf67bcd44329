/* Model stand-in: deterministic per-token KV from the prefix hash, and the
 * layout built from a config's model shape. */
#include "pd_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#define GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t pd_prefix_step(uint64_t prev, uint64_t token)
{
    return XXH3_64bits_withSeed(&token, sizeof(token), prev);
}

void pd_prefix_hashes(const uint64_t *tokens, size_t from, size_t n,
                      uint64_t *h)
{
    uint64_t prev = from == 0 ? PD_PREFIX_ROOT : h[from - 1];
    for (size_t i = from; i < n; i++) {
        prev = pd_prefix_step(prev, tokens[i]);
        h[i] = prev;
    }
}

uint64_t pd_next_token(uint64_t h)
{
    return mix64(h ^ 0x6e657874ull) % PD_VOCAB;
}

uint64_t pd_user_token(uint64_t stream, uint64_t i)
{
    return mix64(mix64(stream + GOLDEN) + i * GOLDEN) % PD_VOCAB;
}

/* The splitmix64 stream of (h, arena) over `len` bytes. */
static inline uint64_t stream_seed(uint64_t h, size_t arena)
{
    return h ^ mix64((uint64_t)arena * GOLDEN + 1);
}

static void fill(uint8_t *dst, uint32_t len, uint64_t s)
{
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s += GOLDEN;
        uint64_t v = mix64(s);
        memcpy(dst + i, &v, 8);
    }
    if (i < len) {
        s += GOLDEN;
        uint64_t v = mix64(s);
        memcpy(dst + i, &v, len - i);
    }
}

static inline uint64_t nonzero_bytes(uint64_t x)
{
    uint64_t n = 0;
    for (; x != 0; x >>= 8) {
        n += (x & 0xff) != 0;
    }
    return n;
}

static uint64_t diff(const uint8_t *src, uint32_t len, uint64_t s)
{
    uint64_t bad = 0;
    uint32_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s += GOLDEN;
        uint64_t v = mix64(s), have;
        memcpy(&have, src + i, 8);
        if (v != have) {
            bad += nonzero_bytes(v ^ have);
        }
    }
    if (i < len) {
        s += GOLDEN;
        uint64_t v = mix64(s), have = 0;
        memcpy(&have, src + i, len - i);
        uint64_t mask = (len - i) == 8 ? ~0ull : (1ull << (8 * (len - i))) - 1;
        bad += nonzero_bytes((v ^ have) & mask);
    }
    return bad;
}

void pd_model_write(const pd_model_t *m, uint64_t block_id, uint32_t slot,
                    uint64_t h)
{
    for (size_t a = 0; a < m->narenas; a++) {
        const pd_arena_view_t *v = &m->arenas[a];
        fill(v->base + block_id * v->stride +
                 (uint64_t)slot * v->bytes_per_token,
             v->bytes_per_token, stream_seed(h, a));
    }
}

uint64_t pd_model_diff(const pd_model_t *m, uint64_t block_id, uint32_t slot,
                       uint64_t h)
{
    uint64_t bad = 0;
    for (size_t a = 0; a < m->narenas; a++) {
        const pd_arena_view_t *v = &m->arenas[a];
        bad += diff(v->base + block_id * v->stride +
                        (uint64_t)slot * v->bytes_per_token,
                    v->bytes_per_token, stream_seed(h, a));
    }
    return bad;
}

int pd_model_init(pd_model_t *m, pdx_layout_h layout)
{
    memset(m, 0, sizeof(*m));
    m->narenas = pdx_layout_num_arenas(layout);
    m->arenas = calloc(m->narenas ? m->narenas : 1, sizeof(*m->arenas));
    if (m->arenas == NULL) {
        return -1;
    }
    for (size_t a = 0; a < m->narenas; a++) {
        pdx_arena_t ar;
        pdx_layout_get_arena(layout, a, &ar);
        m->arenas[a] = (pd_arena_view_t){.base = (uint8_t *)(uintptr_t)ar.base,
                                         .stride = ar.stride,
                                         .bytes_per_token = ar.bytes_per_token};
        m->bytes_per_token += ar.bytes_per_token;
    }
    m->block_tokens = pdx_layout_block_tokens(layout);
    m->num_blocks = pdx_layout_num_blocks(layout);
    m->bytes_per_block = pdx_layout_bytes_per_block(layout);
    return 0;
}

void pd_model_fini(pd_model_t *m)
{
    free(m->arenas);
    m->arenas = NULL;
}

static int is_reference_shape(const pdx_kv_config_t *c)
{
    if (c->num_layers != PDX_GLM52_NUM_LAYERS ||
        c->mla_bytes_per_token != PDX_GLM52_MLA_BYTES_PER_TOKEN ||
        c->index_k_bytes_per_token != PDX_GLM52_INDEX_K_BYTES_PER_TOKEN ||
        c->mtp_layers != 1 || c->block_tokens != PDX_GLM52_BLOCK_TOKENS) {
        return 0;
    }
    uint32_t n = 0;
    for (uint32_t l = 0; l < PDX_GLM52_NUM_LAYERS; l++) {
        if (pdx_glm52_has_index_k(l)) {
            if (n >= c->n_index_k_layers || c->index_k_layers[n] != l) {
                return 0;
            }
            n++;
        }
    }
    return n == c->n_index_k_layers;
}

pdx_status_t pd_layout_from_config(const pdx_kv_config_t *cfg,
                                   pdx_mem_type_t mem, pdx_layout_h *layout_p,
                                   int *is_reference_p, char *why,
                                   size_t why_len)
{
    pdx_status_t st;
    *is_reference_p = is_reference_shape(cfg);
    if (*is_reference_p) {
        st = pdx_layout_glm52(cfg->num_blocks, mem, 0, layout_p);
    } else {
        /* Any other shape: the config loader's layout, same arena naming
         * and order, on the memory type this example uses. */
        pdx_kv_config_t c = *cfg;
        c.mem_type = mem;
        c.device = 0;
        st = pdx_kv_config_layout(&c, layout_p);
    }
    if (st != PDX_OK) {
        snprintf(why, why_len,
                 "%s: no layout for the model shape (%u layers, %u/%u B per "
                 "token, %u MTP, %u-token blocks, %u blocks): %s",
                 cfg->source, cfg->num_layers, cfg->mla_bytes_per_token,
                 cfg->index_k_bytes_per_token, cfg->mtp_layers,
                 cfg->block_tokens, cfg->num_blocks, pdx_status_string(st));
    }
    return st;
}
