/* KV layout: a model's KV cache as arenas (one per layer and cache kind)
 * that share block ids, the layout's fingerprint, and the descriptor lists
 * for a set of block ids (per block, or with contiguous runs merged, or
 * paired against a peer's layout).
 *
 * A layout is built by one thread (create, add_arena, set_base, carve);
 * once built, every read-only function may run concurrently. Nothing here
 * allocates or touches arena memory: base addresses are numbers supplied by
 * the caller (or carved out of one caller buffer). No function blocks.
 *
 * Bad handles: a NULL layout, a NULL required pointer, or a layout already
 * destroyed is refused without being dereferenced: functions returning a
 * status return PDX_ERR_INVALID, the others 0 (or the value their comment
 * gives), and pdx_last_error() (pdx/status.h) names the function and the
 * argument, e.g. "pdx_layout_num_blocks: layout is NULL". Every failure
 * leaves its reason there. Catching a destroyed layout is best effort: it
 * works while the released object is among the 64 most recent releases
 * kept in quarantine, not once its memory has been reused or freed. */
#ifndef PDX_KV_LAYOUT_H
#define PDX_KV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/export.h>
#include <pdx/status.h>
#include <pdx/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Cache kind of an arena. The values are part of the fingerprint: append
 * only. */
typedef enum pdx_kv_kind {
    PDX_KV_KIND_MLA = 0,     /* MLA latent cache (e.g. fp8_ds_mla) */
    PDX_KV_KIND_INDEX_K = 1, /* sparse-attention indexer keys */
    PDX_KV_KIND_KV = 2,      /* plain attention K and V pages */
} pdx_kv_kind_t;

/* The name of a cache kind.
 *
 * @param [in] kind  A pdx_kv_kind_t.
 * @return "mla", "index_k" or "kv"; NULL outside the enum (an error,
 *         recorded in pdx_last_error()).
 * Owns: a static string of the library's.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API const char *pdx_kv_kind_to_string(pdx_kv_kind_t kind);

/* Longest arena name, without its NUL. */
#define PDX_ARENA_NAME_MAX 63

/* Optional fields of pdx_arena_t; the others are always read. */
enum {
    PDX_ARENA_FIELD_IS_MTP = 1u << 0,       /* default 0 */
    PDX_ARENA_FIELD_BLOCK_TOKENS = 1u << 1, /* default: the layout's */
    PDX_ARENA_FIELD_STRIDE = 1u << 2,       /* default: block bytes */
    PDX_ARENA_FIELD_BASE = 1u << 3,         /* default 0 (set later) */
    PDX_ARENA_FIELD_MEM_TYPE = 1u << 4,     /* default PDX_MEM_DRAM */
    PDX_ARENA_FIELD_DEV_ID = 1u << 5,       /* default 0 */
    PDX_ARENA_FIELD_ALL = (1u << 6) - 1,
};

/* One arena: `num_blocks` blocks of `block_tokens * bytes_per_token` bytes
 * ("block bytes"), block b at base + b * stride. Block id b names block b
 * of every arena in the layout. */
typedef struct pdx_arena {
    uint64_t field_mask;
    const char *name; /* unique in the layout, 1..PDX_ARENA_NAME_MAX chars */
    uint32_t layer;
    pdx_kv_kind_t kind;
    int is_mtp; /* the arena belongs to a multi-token-prediction layer */
    uint32_t bytes_per_token;
    uint32_t block_tokens; /* must equal the layout's block size */
    uint64_t num_blocks;
    uint64_t base;
    uint64_t stride;         /* >= block bytes */
    pdx_mem_type_t mem_type; /* one memory type per layout */
    uint32_t dev_id;
} pdx_arena_t;

typedef struct pdx_layout *pdx_layout_h;

/* Create an empty layout of `block_tokens`-token blocks.
 *
 * @param [in]  block_tokens  Tokens per block (> 0).
 * @param [out] layout_p      The layout; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID; PDX_ERR_NOMEM.
 * Owns: *layout_p is the caller's, freed with pdx_layout_destroy.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_layout_create(uint32_t block_tokens,
                                       pdx_layout_h *layout_p);

/* Free a layout.
 *
 * @param [in] layout  The layout; NULL does nothing; an already destroyed
 *                     layout is refused as above (best effort).
 * Owns: frees the layout and the arena names it holds (pointers from
 *       pdx_layout_get_arena die with it).
 * Blocks: no.
 * Threads: any thread; no other call on the layout may be in progress or
 *       follow (a connector given it must have been destroyed first).
 */
PDX_API void pdx_layout_destroy(pdx_layout_h layout);

/* Append a copy of *arena. The layout is unchanged on error.
 *
 * @param [in]  layout   The layout.
 * @param [in]  arena    The arena; fields outside arena->field_mask take
 *                       their defaults (see PDX_ARENA_FIELD_*).
 * @param [out] index_p  Its index; may be NULL; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID for a missing or too long name, zero
 *         bytes_per_token or num_blocks, a block_tokens other than the
 *         layout's, a stride below the block bytes, a block bytes or arena
 *         span overflowing 64 bits, or a mem_type other than the first
 *         arena's; PDX_ERR_EXISTS for a duplicate name; PDX_ERR_NOMEM.
 * Owns: the caller keeps `arena` and its name (copied). Arena names
 *       pdx_layout_get_arena returned before may move: get them again.
 * Blocks: no.
 * Threads: one thread, with no other call on the layout at the same time
 *       (a layout is built by one thread).
 */
PDX_API pdx_status_t pdx_layout_add_arena(pdx_layout_h layout,
                                          const pdx_arena_t *arena,
                                          size_t *index_p);

/* Number of arenas.
 *
 * @param [in] layout  The layout.
 * @return The count; 0 for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API size_t pdx_layout_num_arenas(pdx_layout_h layout);

/* Copy arena `index` out, with every field set (field_mask =
 * PDX_ARENA_FIELD_ALL).
 *
 * @param [in]  layout   The layout.
 * @param [in]  index    0..num_arenas-1.
 * @param [out] arena_p  The arena; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND for an index out of range.
 * Owns: the caller keeps *arena_p; arena_p->name points into the layout,
 *       valid until it is destroyed or an arena is added.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API pdx_status_t pdx_layout_get_arena(pdx_layout_h layout, size_t index,
                                          pdx_arena_t *arena_p);

/* Index of the arena called `name`.
 *
 * @param [in]  layout   The layout.
 * @param [in]  name     The arena's name.
 * @param [out] index_p  Its index; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND if none.
 * Owns: the caller keeps `name`.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API pdx_status_t pdx_layout_find_arena(pdx_layout_h layout,
                                           const char *name, size_t *index_p);

/* Set the base address and device of one arena (memory arrives after the
 * shape is known).
 *
 * @param [in] layout  The layout.
 * @param [in] index   0..num_arenas-1.
 * @param [in] base    Address of the arena's block 0.
 * @param [in] dev_id  CUDA device for VRAM; 0 for DRAM.
 * @return PDX_OK; PDX_ERR_NOT_FOUND for an index out of range;
 *         PDX_ERR_INVALID if the arena would wrap the address space.
 * Owns: the memory at `base` stays the caller's (a number here).
 * Blocks: no.
 * Threads: one thread, with no other call on the layout at the same time
 *       (a layout is built by one thread).
 */
PDX_API pdx_status_t pdx_layout_set_base(pdx_layout_h layout, size_t index,
                                         uint64_t base, uint32_t dev_id);

/* Tokens per block.
 *
 * @param [in] layout  The layout.
 * @return The block size; 0 for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API uint32_t pdx_layout_block_tokens(pdx_layout_h layout);

/* Memory type shared by the arenas.
 *
 * @param [in] layout  The layout.
 * @return The type (PDX_MEM_DRAM while there are no arenas);
 *         (pdx_mem_type_t)-1, outside the enum, for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API pdx_mem_type_t pdx_layout_mem_type(pdx_layout_h layout);

/* Usable block ids are 0..num_blocks-1: the smallest arena's block count.
 *
 * @param [in] layout  The layout.
 * @return The count; 0 while there are no arenas, and for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API uint64_t pdx_layout_num_blocks(pdx_layout_h layout);

/* KV bytes of one block id summed over all arenas (strides not counted).
 *
 * @param [in] layout  The layout.
 * @return The bytes; 0 for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API uint64_t pdx_layout_bytes_per_block(pdx_layout_h layout);

/* Fingerprint: XXH3-64 over what two peers must agree on to exchange block
 * ids: a format tag, the block size, the arena count and, per arena in
 * order, name, layer, kind, is_mtp, bytes_per_token and block_tokens.
 * Arena order is covered because descriptor lists follow it.
 * Left out, on purpose, as each side's private business: base addresses and
 * devices (each side's own memory), block counts (P and D pools differ in
 * size), strides (descriptors are computed per side, so a padded pool still
 * pairs with a packed one) and memory type (an offload tier in DRAM pairs
 * with a GPU pool).
 *
 * @param [in] layout  The layout.
 * @return The fingerprint; 0 for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API uint64_t pdx_layout_fingerprint(pdx_layout_h layout);

/* Descriptors per block per arena: for arena a (in order) and ids[i],
 * out[a * n + i] = {base + ids[i] * stride, block bytes, dev_id}.
 *
 * @param [in]  layout   The layout.
 * @param [in]  ids      n block ids, each < pdx_layout_num_blocks.
 * @param [in]  n        Ids.
 * @param [out] out      num_arenas * n descriptors; NULL: count only.
 * @param [in]  max_out  Entries of `out`.
 * @param [out] count_p  The number of descriptors.
 * @return PDX_OK; PDX_ERR_INVALID for an id out of range;
 *         PDX_ERR_TOO_LARGE if max_out is short. `out` and *count_p are
 *         written only on success.
 * Owns: the caller keeps `ids` and `out`.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API pdx_status_t pdx_layout_block_descs(pdx_layout_h layout,
                                            const uint64_t *ids, size_t n,
                                            pdx_desc_t *out, size_t max_out,
                                            size_t *count_p);

/* As pdx_layout_block_descs, arena by arena, but a run of ids k, k+1, ...
 * in that order becomes one descriptor in an arena whose stride equals its
 * block bytes. Repeated or descending ids are never merged.
 *
 * @param [in]  layout   The layout.
 * @param [in]  ids      n block ids.
 * @param [in]  n        Ids.
 * @param [out] out      At most num_arenas * n descriptors; NULL: count
 *                       only.
 * @param [in]  max_out  Entries of `out`.
 * @param [out] count_p  The number of descriptors.
 * @return As pdx_layout_block_descs.
 * Owns: the caller keeps `ids` and `out`.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API pdx_status_t pdx_layout_merged_descs(pdx_layout_h layout,
                                             const uint64_t *ids, size_t n,
                                             pdx_desc_t *out, size_t max_out,
                                             size_t *count_p);

/* Paired lists for a transfer of block local_ids[i] <-> remote_ids[i]:
 * local_out[j] and remote_out[j] have the same length for every j, arena by
 * arena in layout order. Position i joins the run before it only when both
 * sides continue a run (local id + 1 and remote id + 1) in arenas whose
 * strides are packed on both sides.
 *
 * @param [in]  local       This side's layout.
 * @param [in]  local_ids   n block ids of this side.
 * @param [in]  remote      The peer's layout (same fingerprint).
 * @param [in]  remote_ids  n block ids of the peer.
 * @param [in]  n           Ids on each side.
 * @param [out] local_out   At most num_arenas * n descriptors; NULL with
 *                          remote_out NULL: count only.
 * @param [out] remote_out  As many, paired with local_out.
 * @param [in]  max_out     Entries of each list.
 * @param [out] count_p     The number of pairs.
 * @return PDX_OK; PDX_ERR_MISMATCH (fingerprints differ, logged with both
 *         values); PDX_ERR_INVALID (an id out of its side's block count);
 *         PDX_ERR_TOO_LARGE if max_out is short. Outputs are written only
 *         on success.
 * Owns: the caller keeps the id arrays and both lists.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of both layouts; not
 *       with a call that changes either.
 */
PDX_API pdx_status_t pdx_layout_paired_descs(
    pdx_layout_h local, const uint64_t *local_ids, pdx_layout_h remote,
    const uint64_t *remote_ids, size_t n, pdx_desc_t *local_out,
    pdx_desc_t *remote_out, size_t max_out, size_t *count_p);

/* Bytes needed to carve every arena (num_blocks * stride each) out of one
 * buffer, each arena starting at a multiple of `align` from the buffer
 * start.
 *
 * @param [in] layout  The layout.
 * @param [in] align   A power of two; 0 or 1 for none.
 * @return The bytes; UINT64_MAX for a bad align, a total that overflows or
 *         a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with other reads of the layout; not
 *       with a call that changes it (add_arena, set_base, carve).
 */
PDX_API uint64_t pdx_layout_carve_size(pdx_layout_h layout, uint64_t align);

/* Assign arena bases consecutively from `base` (arena order, each aligned
 * as pdx_layout_carve_size says) on device `dev_id`.
 *
 * @param [in] layout  The layout.
 * @param [in] base    Start of the caller's buffer.
 * @param [in] size    Its bytes (>= pdx_layout_carve_size).
 * @param [in] align   As pdx_layout_carve_size.
 * @param [in] dev_id  CUDA device for VRAM; 0 for DRAM.
 * @return PDX_OK; PDX_ERR_NO_SPACE if `size` is below
 *         pdx_layout_carve_size; PDX_ERR_INVALID for a bad align or a
 *         wrap.
 * Owns: the caller owns the buffer and keeps it alive while the layout's
 *       descriptors are in use.
 * Blocks: no.
 * Threads: one thread, with no other call on the layout at the same time
 *       (a layout is built by one thread).
 */
PDX_API pdx_status_t pdx_layout_carve(pdx_layout_h layout, uint64_t base,
                                      uint64_t size, uint64_t align,
                                      uint32_t dev_id);

/* GLM-5.2 FP8 + MTP reference shape, in this arena order: for each layer
 * 0..77 "layer<L>.mla" (MLA fp8_ds_mla, 656 B/token) then, on IndexShare
 * layers (0, 1, 2, 6, 10, ..., 74), "layer<L>.index_k" (132 B/token); then
 * the MTP layer 78: "mtp78.mla" and "mtp78.index_k" (is_mtp = 1). 101
 * arenas, 64-token blocks, 3,502,592 B per block, packed strides, bases 0
 * (set them with pdx_layout_set_base or pdx_layout_carve). */
#define PDX_GLM52_NUM_LAYERS 78
#define PDX_GLM52_MTP_LAYER 78
#define PDX_GLM52_BLOCK_TOKENS 64
#define PDX_GLM52_MLA_BYTES_PER_TOKEN 656
#define PDX_GLM52_INDEX_K_BYTES_PER_TOKEN 132
#define PDX_GLM52_NUM_ARENAS 101
#define PDX_GLM52_BYTES_PER_BLOCK 3502592ull

/* Append the arena "<prefix><layer>.<kind>" (e.g. "layer6.index_k",
 * "mtp78.mla") with packed strides: the naming every model-shape builder
 * here uses, so layouts built from a config and by pdx_layout_glm52 have
 * the same fingerprint.
 *
 * @param [in] layout           The layout.
 * @param [in] prefix           "layer", "mtp", ...
 * @param [in] layer            The layer number.
 * @param [in] kind             A pdx_kv_kind_t.
 * @param [in] is_mtp           Nonzero for a multi-token-prediction layer.
 * @param [in] bytes_per_token  KV bytes per token (> 0).
 * @param [in] num_blocks       Blocks (> 0).
 * @param [in] mem_type         The layout's memory type.
 * @param [in] dev_id           CUDA device for VRAM; 0 for DRAM.
 * @return As pdx_layout_add_arena; PDX_ERR_INVALID for a kind outside the
 *         enum.
 * Owns: the caller keeps `prefix` (the name is built and copied).
 * Blocks: no.
 * Threads: one thread, with no other call on the layout at the same time
 *       (a layout is built by one thread).
 */
PDX_API pdx_status_t pdx_layout_add_layer_arena(pdx_layout_h layout,
                                                const char *prefix,
                                                uint32_t layer,
                                                pdx_kv_kind_t kind, int is_mtp,
                                                uint32_t bytes_per_token,
                                                uint64_t num_blocks,
                                                pdx_mem_type_t mem_type,
                                                uint32_t dev_id);

/* Does layer `layer` of GLM-5.2 carry an index-K cache?
 *
 * @param [in] layer  0..77 (any other value is 0).
 * @return 1 or 0.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API int pdx_glm52_has_index_k(uint32_t layer);

/* Build the GLM-5.2 layout above with `num_blocks` blocks per arena.
 *
 * @param [in]  num_blocks  Blocks per arena (> 0).
 * @param [in]  mem_type    PDX_MEM_DRAM or PDX_MEM_VRAM.
 * @param [in]  dev_id      CUDA device for VRAM; 0 for DRAM.
 * @param [out] layout_p    The layout; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID; PDX_ERR_NOMEM.
 * Owns: *layout_p is the caller's, freed with pdx_layout_destroy.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_layout_glm52(uint64_t num_blocks,
                                      pdx_mem_type_t mem_type, uint32_t dev_id,
                                      pdx_layout_h *layout_p);

#ifdef __cplusplus
}
#endif
#endif
