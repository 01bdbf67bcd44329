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

/* vLLM's name ("xxhash_cbor", "sha256_cbor") to the enum. `name` is read
 * during the call only. PDX_ERR_INVALID for NULL or an unknown name (the
 * pickle-based "sha256"/"xxhash" included: they cannot be reproduced in C);
 * *algo_p is written only on success. */
PDX_API pdx_status_t pdx_hash_algo_from_string(const char *name,
                                               pdx_hash_algo_t *algo_p);

/* vLLM's name for `algo`, a static string; NULL for a value outside the
 * enum (an error, recorded in pdx_last_error()). */
PDX_API const char *pdx_hash_algo_to_string(pdx_hash_algo_t algo);

/* Digest length in bytes of `algo` (16 or 32); 0 for a value outside the
 * enum (an error, recorded in pdx_last_error()). */
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

/* Lower-case hex of `hash` into `buf`, snprintf-style: writes at most
 * buflen - 1 digits and a NUL (nothing when buflen is 0) and returns
 * 2 * hash->len, the length the whole string needs. `buf` may be NULL when
 * buflen is 0; a NULL hash, or a NULL buf with buflen > 0, returns 0. */
PDX_API size_t pdx_block_hash_to_hex(const pdx_block_hash_t *hash, char *buf,
                                     size_t buflen);

/* Parses 32 or 64 hex digits (either case, nothing else) into *hash_p.
 * PDX_ERR_INVALID otherwise; *hash_p is written only on success. */
PDX_API pdx_status_t pdx_block_hash_from_hex(const char *hex,
                                             pdx_block_hash_t *hash_p);

/* 1 when both hashes have the same length and bytes, else 0 (also when
 * either is NULL, an error recorded in pdx_last_error()). */
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

/* Creates a hasher for `algo` with NONE_HASH derived from `seed` (vLLM's
 * PYTHONHASHSEED; "" is a valid seed, NULL is not: vLLM's random NONE_HASH
 * for an unset seed cannot be shared between P and D). `seed` is copied
 * nowhere; only its hash is kept. block_size in 1..PDX_HASH_BLOCK_SIZE_MAX.
 * PDX_ERR_INVALID for bad arguments, PDX_ERR_NOMEM, PDX_ERR_BACKEND when
 * OpenSSL fails. The caller owns *hasher_p (written only on success) and
 * frees it with pdx_hasher_destroy. Thread-safe. */
PDX_API pdx_status_t pdx_hasher_create(pdx_hash_algo_t algo, const char *seed,
                                       uint32_t block_size,
                                       pdx_hasher_h *hasher_p);

/* Frees `hasher` (NULL is a no-op). No call on it may be running; one that
 * follows is refused as above (best effort). */
PDX_API void pdx_hasher_destroy(pdx_hasher_h hasher);

/* The hasher's algorithm; (pdx_hash_algo_t)-1, outside the enum, for a bad
 * handle. */
PDX_API pdx_hash_algo_t pdx_hasher_algo(pdx_hasher_h hasher);
PDX_API uint32_t pdx_hasher_block_size(pdx_hasher_h hasher);

/* Copies NONE_HASH (the seed's hash, the invariant peers compare) to
 * *hash_p; writes nothing for a bad handle or a NULL hash_p. */
PDX_API void pdx_hasher_none_hash(pdx_hasher_h hasher,
                                  pdx_block_hash_t *hash_p);

/* Hashes the full blocks of a prompt: out[i] is the hash of tokens
 * [i*B, (i+1)*B), chained from NONE_HASH, with `extra` (NULL: none) applied
 * as vLLM does. *nblocks_p = ntokens / B.
 *
 * Tail: when `tail_out` is non-NULL, the tail (ntokens % B tokens) gets
 * PegaFlow's partial key, the same hash over the tail tokens with the last
 * full block's hash (NONE_HASH if none) as parent and the extra keys vLLM
 * would give a block at that position. There is no tail key when the tail
 * has 0 or 1 tokens or when the request has any extra key (LoRA or salt):
 * then *has_tail_p is 0 and *tail_out is not written. `has_tail_p` may be
 * NULL only when tail_out is NULL.
 *
 * `tokens` may be NULL when ntokens is 0. `out` must hold ntokens / B
 * entries (max_out); PDX_ERR_TOO_LARGE otherwise, before anything is
 * written. Allocation is per call, never per block: an OpenSSL context for
 * sha256_cbor, and an encode buffer only when one block's encoding could
 * exceed 4 KiB (about 450 tokens); PDX_ERR_NOMEM if that fails.
 * PDX_ERR_BACKEND if OpenSSL fails, after which out[] is unspecified. The
 * scalar outputs are written only on success. */
PDX_API pdx_status_t pdx_hasher_hash_blocks(
    pdx_hasher_h hasher, const uint64_t *tokens, size_t ntokens,
    const pdx_hash_extra_t *extra, pdx_block_hash_t *out, size_t max_out,
    size_t *nblocks_p, pdx_block_hash_t *tail_out, int *has_tail_p);

/* Hashes one block given its parent: the incremental form of
 * pdx_hasher_hash_blocks, for blocks a decode appends. parent == NULL means
 * the first block of the request (NONE_HASH as parent and the cache salt
 * applied); otherwise *parent is the previous block's hash and only the LoRA
 * name is applied. ntokens is normally the block size; 1..B are accepted so
 * that the caller can form a partial key (the tail rules above are then the
 * caller's). `parent` may alias `hash_p`. PDX_ERR_INVALID for ntokens out
 * of range or a parent of another digest length. *hash_p is written only on
 * success. Allocation-free for xxhash_cbor; sha256_cbor allocates one
 * OpenSSL context per call. */
PDX_API pdx_status_t pdx_hasher_hash_next(
    pdx_hasher_h hasher, const pdx_block_hash_t *parent, const uint64_t *tokens,
    size_t ntokens, const pdx_hash_extra_t *extra, pdx_block_hash_t *hash_p);

#ifdef __cplusplus
}
#endif
#endif
