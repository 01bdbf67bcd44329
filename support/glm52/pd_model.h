/* Model stand-in of the GLM-5.2 P/D example: KV that is a pure function of
 * the token prefix, so any block a node loads can be recomputed and compared
 * byte for byte, and a decoder appending tokens writes exactly what a prefill
 * over the longer history would.
 *
 * Token p of a request has the prefix hash h_p = XXH3_64(token_p, seed
 * h_{p-1}) (h_{-1} = PD_PREFIX_ROOT). Its bytes_per_token slice in arena a,
 * at offset (p mod B) * bytes_per_token of block p / B, is the splitmix64
 * stream seeded from (h_p, a). Bytes of a block past its last token are
 * never read. */
#ifndef PD_MODEL_H
#define PD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/kv_config.h>
#include <pdx/kv_layout.h>

#define PD_PREFIX_ROOT 0x676c6d35322d7064ull /* "glm52-pd" */
#define PD_VOCAB 151552u                     /* GLM tokenizer size */

/* What the stand-in needs of one arena: where block b lives. */
typedef struct pd_arena_view {
    uint8_t *base;
    uint64_t stride;
    uint32_t bytes_per_token;
} pd_arena_view_t;

typedef struct pd_model {
    size_t narenas;
    pd_arena_view_t *arenas;
    uint32_t block_tokens;
    uint64_t num_blocks;
    uint64_t bytes_per_block; /* over all arenas */
    uint64_t bytes_per_token; /* over all arenas */
} pd_model_t;

/* Layout for the model shape of `cfg`: pdx_layout_glm52 when the shape is
 * the reference one, else pdx_kv_config_layout (same arena naming and
 * order). `mem` is the memory type to describe (the config's: DRAM, or
 * VRAM whose device pdx_layout_carve sets). `why` gets a reason on
 * failure. The caller owns *layout_p. */
pdx_status_t pd_layout_from_config(const pdx_kv_config_t *cfg,
                                   pdx_mem_type_t mem, pdx_layout_h *layout_p,
                                   int *is_reference_p, char *why,
                                   size_t why_len);

/* Views of a carved layout's arenas. 0 on success, -1 on allocation
 * failure. pd_model_fini frees them. */
int pd_model_init(pd_model_t *m, pdx_layout_h layout);
void pd_model_fini(pd_model_t *m);

/* h_p from h_{p-1} and token p. */
uint64_t pd_prefix_step(uint64_t prev, uint64_t token);

/* h[i] for tokens[from..n), given h[from-1] (or the root when from == 0). */
void pd_prefix_hashes(const uint64_t *tokens, size_t from, size_t n,
                      uint64_t *h);

/* Writes token slot `slot` of block `block_id` in every arena from the
 * token's prefix hash. */
void pd_model_write(const pd_model_t *m, uint64_t block_id, uint32_t slot,
                    uint64_t h);

/* Bytes of token slot `slot` of block `block_id` (all arenas) that differ
 * from what pd_model_write would write: 0 when byte-exact. */
uint64_t pd_model_diff(const pd_model_t *m, uint64_t block_id, uint32_t slot,
                       uint64_t h);

/* The stand-in's sampler: the next token after the prefix hashed to `h`. */
uint64_t pd_next_token(uint64_t h);

/* The driver's user text: token i of a stream named by `stream`. */
uint64_t pd_user_token(uint64_t stream, uint64_t i);

#endif
