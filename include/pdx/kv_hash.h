/* Block hashing bit-compatible with vLLM prefix caching (`xxhash_cbor`,
 * `sha256_cbor`), plus PegaFlow's partial-tail key.
 *
 * What is hashed (vLLM v1 kv_cache_utils, with PYTHONHASHSEED=seed):
 *   NONE_HASH  = H(cbor(seed))                        seed as a text string
 *   block hash = H(cbor([parent, [t0, t1, ...], extra]))
 * where parent is the previous block's hash as a byte string (NONE_HASH for
 * the first block), the tokens are unsigned ints in shortest form and
 * extra is null or an array of the request's extra keys: the LoRA name (every
 * block), then the cache salt (first block only). H is XXH3-128 (digest as 16
 * big-endian bytes) or SHA-256 (32 bytes). Multimodal and prompt-embedding
 * extra keys are not supported; requests carrying them must not be hashed
 * here.
 *
 * A hasher is immutable after creation: any number of threads may use one
 * hasher at once. No function blocks on anything but the CPU.
 *
 * Bad handles: a NULL hasher, a NULL required pointer, or a hasher already
 * destroyed (by pdx_hasher_destroy, or with the connector that owned it) is
 * refused without being dereferenced: functions returning a status return
 * PDX_ERR_INVALID, the others 0 (or the value their comment gives; void ones
 * do nothing), and pdx_last_error() (pdx/status.h) names the function and
 * the argument, e.g. "pdx_hasher_hash_next: hasher is NULL". Every failure
 * leaves its reason there. Catching a destroyed hasher is best effort: it
 * works while the released object is among the 64 most recent releases
 * kept in quarantine, not once its memory has been reused or freed. */
#ifndef PDX_KV_HASH_H
#define PDX_KV_HASH_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/export.h>
#include <pdx/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdx_hash_algo {
    PDX_HASH_XXHASH_CBOR = 0, /* vLLM "xxhash_cbor": XXH3-128, 16 bytes */
    PDX_HASH_SHA256_CBOR = 1, /* vLLM "sha256_cbor": SHA-256, 32 bytes */
} pdx_hash_algo_t;

/* vLLM's name of a hash algorithm to the enum.
 *
 * @param [in]  name    "xxhash_cbor" or "sha256_cbor" (the pickle-based
 *                      "sha256"/"xxhash" are refused: they cannot be
 *                      reproduced in C).
 * @param [out] algo_p  The algorithm; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID for NULL or an unknown name.
 * Owns: the caller keeps `name` (read during the call only).
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_hash_algo_from_string(const char *name,
                                               pdx_hash_algo_t *algo_p);

/* vLLM's name for `algo`.
 *
 * @param [in] algo  A pdx_hash_algo_t.
 * @return A static string; NULL for a value outside the enum (an error,
 *         recorded in pdx_last_error()).
 * Owns: the string is the library's.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API const char *pdx_hash_algo_to_string(pdx_hash_algo_t algo);

/* Digest length of `algo`.
 *
 * @param [in] algo  A pdx_hash_algo_t.
 * @return 16 or 32 (bytes); 0 for a value outside the enum (an error,
 *         recorded in pdx_last_error()).
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API size_t pdx_hash_algo_digest_len(pdx_hash_algo_t algo);

#define PDX_BLOCK_HASH_MAX 32
/* Room for the hex form of any block hash, with its NUL. */
#define PDX_BLOCK_HASH_HEX_MAX (2 * PDX_BLOCK_HASH_MAX + 1)

/* A block hash by value: `len` bytes of `bytes` are the digest (16 or 32);
 * the rest is zero in every hash pdx writes. */
typedef struct pdx_block_hash {
    uint8_t bytes[PDX_BLOCK_HASH_MAX];
    uint8_t len;
} pdx_block_hash_t;

/* Lower-case hex of a block hash, snprintf-style.
 *
 * @param [in]  hash    The hash.
 * @param [out] buf     At most buflen - 1 digits and a NUL (nothing when
 *                      buflen is 0); may be NULL when buflen is 0.
 * @param [in]  buflen  Bytes of `buf`.
 * @return 2 * hash->len, the length the whole string needs; 0 for a NULL
 *         hash, or a NULL buf with buflen > 0.
 * Owns: the caller keeps `hash` and `buf`.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API size_t pdx_block_hash_to_hex(const pdx_block_hash_t *hash, char *buf,
                                     size_t buflen);

/* Parse 32 or 64 hex digits (either case, nothing else) into a hash.
 *
 * @param [in]  hex     The digits, NUL-terminated.
 * @param [out] hash_p  The hash; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID otherwise.
 * Owns: the caller keeps `hex` and *hash_p.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_block_hash_from_hex(const char *hex,
                                             pdx_block_hash_t *hash_p);

/* Are two hashes the same (same length and bytes)?
 *
 * @param [in] a  A hash.
 * @param [in] b  Another.
 * @return 1 when equal, else 0 (also when either is NULL, an error
 *         recorded in pdx_last_error()).
 * Owns: the caller keeps both.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API int pdx_block_hash_equal(const pdx_block_hash_t *a,
                                 const pdx_block_hash_t *b);

/* Extra keys of one request. Fields outside `field_mask` are ignored and
 * read as absent. Strings are UTF-8 (not checked), owned by the caller and
 * read during the call only. */
enum {
    PDX_HASH_EXTRA_FIELD_LORA_NAME = 1u << 0,
    PDX_HASH_EXTRA_FIELD_CACHE_SALT = 1u << 1,
};

typedef struct pdx_hash_extra {
    uint64_t field_mask;
    /* vLLM's lora_request.lora_name; NULL means no LoRA. An empty name is
     * still a key, as vLLM hashes whatever name a LoRA request has. */
    const char *lora_name;
    /* vLLM's request.cache_salt; NULL or "" means no salt (vLLM tests its
     * truthiness). Hashed into the first block only. */
    const char *cache_salt;
} pdx_hash_extra_t;

/* Largest block size accepted (vLLM uses 16..256; the bound keeps the
 * per-call encode buffer bounded). */
#define PDX_HASH_BLOCK_SIZE_MAX 65536u

typedef struct pdx_hasher *pdx_hasher_h;

/* Create a hasher for `algo` with NONE_HASH derived from `seed`.
 *
 * @param [in]  algo        The algorithm.
 * @param [in]  seed        vLLM's PYTHONHASHSEED; "" is a valid seed, NULL
 *                          is not (vLLM's random NONE_HASH for an unset
 *                          seed cannot be shared between P and D).
 * @param [in]  block_size  Tokens per block, 1..PDX_HASH_BLOCK_SIZE_MAX.
 * @param [out] hasher_p    The hasher; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID for bad arguments; PDX_ERR_NOMEM;
 *         PDX_ERR_BACKEND when OpenSSL fails.
 * Owns: `seed` is copied nowhere (only its hash is kept); *hasher_p is the
 *       caller's, freed with pdx_hasher_destroy.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_hasher_create(pdx_hash_algo_t algo, const char *seed,
                                       uint32_t block_size,
                                       pdx_hasher_h *hasher_p);

/* Free a hasher.
 *
 * @param [in] hasher  The hasher; NULL does nothing. Not one a connector
 *                     handed out (pdx_kv_connector_hasher): it goes with
 *                     the connector.
 * Owns: frees the hasher.
 * Blocks: no.
 * Threads: any thread; no call on the hasher may be running; one that
 *       follows is refused as above (best effort).
 */
PDX_API void pdx_hasher_destroy(pdx_hasher_h hasher);

/* The hasher's algorithm.
 *
 * @param [in] hasher  The hasher.
 * @return The algorithm; (pdx_hash_algo_t)-1, outside the enum, for a bad
 *         handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with any other use of the hasher (it
 *       is immutable).
 */
PDX_API pdx_hash_algo_t pdx_hasher_algo(pdx_hasher_h hasher);

/* The hasher's block size in tokens.
 *
 * @param [in] hasher  The hasher.
 * @return The block size; 0 for a bad handle.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread, concurrently with any other use of the hasher (it
 *       is immutable).
 */
PDX_API uint32_t pdx_hasher_block_size(pdx_hasher_h hasher);

/* NONE_HASH, the seed's hash: the invariant peers compare.
 *
 * @param [in]  hasher  The hasher.
 * @param [out] hash_p  The hash; nothing is written for a bad handle or a
 *                      NULL hash_p.
 * Owns: the caller keeps *hash_p.
 * Blocks: no.
 * Threads: any thread, concurrently with any other use of the hasher (it
 *       is immutable).
 */
PDX_API void pdx_hasher_none_hash(pdx_hasher_h hasher,
                                  pdx_block_hash_t *hash_p);

/* Hash the full blocks of a prompt: out[i] is the hash of tokens
 * [i*B, (i+1)*B), chained from NONE_HASH, with `extra` applied as vLLM
 * does.
 *
 * Tail: when `tail_out` is non-NULL, the tail (ntokens % B tokens) gets
 * PegaFlow's partial key, the same hash over the tail tokens with the last
 * full block's hash (NONE_HASH if none) as parent and the extra keys vLLM
 * would give a block at that position. There is no tail key when the tail
 * has 0 or 1 tokens or when the request has any extra key (LoRA or salt):
 * then *has_tail_p is 0 and *tail_out is not written.
 *
 * Allocation is per call, never per block: an OpenSSL context for
 * sha256_cbor, and an encode buffer only when one block's encoding could
 * exceed 4 KiB (about 450 tokens).
 *
 * @param [in]  hasher      The hasher.
 * @param [in]  tokens      ntokens token ids; may be NULL when ntokens is
 *                          0.
 * @param [in]  ntokens     Tokens.
 * @param [in]  extra       The request's extra keys; NULL: none.
 * @param [out] out         ntokens / B hashes.
 * @param [in]  max_out     Entries of `out`.
 * @param [out] nblocks_p   ntokens / B.
 * @param [out] tail_out    The tail's key; may be NULL (no tail key).
 * @param [out] has_tail_p  1 when *tail_out was written, else 0; may be
 *                          NULL only when tail_out is NULL.
 * @return PDX_OK; PDX_ERR_TOO_LARGE when max_out is short (before anything
 *         is written); PDX_ERR_INVALID; PDX_ERR_NOMEM; PDX_ERR_BACKEND if
 *         OpenSSL fails, after which out[] is unspecified. The scalar
 *         outputs are written only on success.
 * Owns: the caller keeps every argument.
 * Blocks: no (CPU only).
 * Threads: any thread, concurrently with any other use of the hasher (it
 *       is immutable).
 */
PDX_API pdx_status_t pdx_hasher_hash_blocks(
    pdx_hasher_h hasher, const uint64_t *tokens, size_t ntokens,
    const pdx_hash_extra_t *extra, pdx_block_hash_t *out, size_t max_out,
    size_t *nblocks_p, pdx_block_hash_t *tail_out, int *has_tail_p);

/* Hash one block given its parent: the incremental form of
 * pdx_hasher_hash_blocks, for blocks a decode appends. Allocation-free for
 * xxhash_cbor; sha256_cbor allocates one OpenSSL context per call.
 *
 * @param [in]  hasher   The hasher.
 * @param [in]  parent   NULL for the first block of the request (NONE_HASH
 *                       as parent and the cache salt applied); otherwise
 *                       the previous block's hash (only the LoRA name is
 *                       applied). May alias hash_p.
 * @param [in]  tokens   ntokens token ids.
 * @param [in]  ntokens  Normally the block size; 1..B are accepted so that
 *                       the caller can form a partial key (the tail rules
 *                       above are then the caller's).
 * @param [in]  extra    The request's extra keys; NULL: none.
 * @param [out] hash_p   The hash; written only on success.
 * @return PDX_OK; PDX_ERR_INVALID for ntokens out of range or a parent of
 *         another digest length; PDX_ERR_NOMEM; PDX_ERR_BACKEND.
 * Owns: the caller keeps every argument.
 * Blocks: no (CPU only).
 * Threads: any thread, concurrently with any other use of the hasher (it
 *       is immutable).
 */
PDX_API pdx_status_t pdx_hasher_hash_next(
    pdx_hasher_h hasher, const pdx_block_hash_t *parent, const uint64_t *tokens,
    size_t ntokens, const pdx_hash_extra_t *extra, pdx_block_hash_t *hash_p);

#ifdef __cplusplus
}
#endif
#endif
