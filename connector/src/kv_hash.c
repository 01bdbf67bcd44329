/* Block hashing bit-compatible with vLLM's xxhash_cbor / sha256_cbor prefix
 * caching keys (see pdx/kv_hash.h for the exact encoding). */
#include <pdx/kv_hash.h>

#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include <pdx/log.h>

#include "cbor_int.h"
#include "kv_call_int.h"

struct pdx_hasher {
    uint32_t magic; /* PDX_MAGIC_HASHER; first, as pdx_call.h requires */
    pdx_hash_algo_t algo;
    uint32_t block_size;
    uint8_t digest_len;
    EVP_MD *md; /* fetched once for sha256_cbor; EVP_MD is thread-safe */
    pdx_block_hash_t none_hash;
};

/* Per-call digest state: the hasher stays immutable, so threads share it. */
typedef struct hash_call {
    const struct pdx_hasher *h;
    EVP_MD_CTX *ctx; /* sha256_cbor only, one per call */
} hash_call_t;

/* Encodings up to this size live on the stack; block 64 with 9-byte tokens
 * and short extra keys needs about 700 bytes. */
#define HASH_STACK_BUF 4096

pdx_status_t pdx_hash_algo_from_string(const char *name,
                                       pdx_hash_algo_t *algo_p) {
    PDX_ENTER();
    if (!PDX_ARG_OK(name, "name") || !PDX_ARG_OK(algo_p, "algo_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    if (strcmp(name, "xxhash_cbor") == 0) {
        *algo_p = PDX_HASH_XXHASH_CBOR;
        PDX_LEAVE(PDX_OK);
    }
    if (strcmp(name, "sha256_cbor") == 0) {
        *algo_p = PDX_HASH_SHA256_CBOR;
        PDX_LEAVE(PDX_OK);
    }
    pdx_error("hash algorithm '%.32s' is not supported (xxhash_cbor or "
              "sha256_cbor)",
              name);
    PDX_LEAVE(PDX_ERR_INVALID);
}

static const char *algo_name(pdx_hash_algo_t algo) {
    switch (algo) {
    case PDX_HASH_XXHASH_CBOR:
        return "xxhash_cbor";
    case PDX_HASH_SHA256_CBOR:
        return "sha256_cbor";
    }
    return NULL;
}

const char *pdx_hash_algo_to_string(pdx_hash_algo_t algo) {
    PDX_ENTER();
    const char *s = algo_name(algo);
    if (s == NULL) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: algo %d is not a pdx_hash_algo_t",
                      __func__, (int)algo);
        PDX_LEAVE_VAL(PDX_ERR_INVALID, NULL);
    }
    PDX_LEAVE_VAL(PDX_OK, s);
}

static size_t algo_digest_len(pdx_hash_algo_t algo) {
    switch (algo) {
    case PDX_HASH_XXHASH_CBOR:
        return 16;
    case PDX_HASH_SHA256_CBOR:
        return 32;
    }
    return 0;
}

size_t pdx_hash_algo_digest_len(pdx_hash_algo_t algo) {
    PDX_ENTER();
    size_t n = algo_digest_len(algo);
    if (n == 0) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: algo %d is not a pdx_hash_algo_t",
                      __func__, (int)algo);
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    }
    PDX_LEAVE_VAL(PDX_OK, n);
}

size_t pdx_block_hash_to_hex(const pdx_block_hash_t *hash, char *buf,
                             size_t buflen) {
    static const char digits[] = "0123456789abcdef";
    PDX_ENTER();
    if (!PDX_ARG_OK(hash, "hash") || (buflen > 0 && !PDX_ARG_OK(buf, "buf")))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    size_t len =
        hash->len > PDX_BLOCK_HASH_MAX ? PDX_BLOCK_HASH_MAX : hash->len;
    size_t need = 2 * len;
    if (buflen == 0)
        PDX_LEAVE_VAL(PDX_OK, need);
    size_t n = need < buflen - 1 ? need : buflen - 1;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = hash->bytes[i / 2];
        buf[i] = digits[(i & 1) ? (b & 0xf) : (b >> 4)];
    }
    buf[n] = '\0';
    PDX_LEAVE_VAL(PDX_OK, need);
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

pdx_status_t pdx_block_hash_from_hex(const char *hex,
                                     pdx_block_hash_t *hash_p) {
    PDX_ENTER();
    if (!PDX_ARG_OK(hex, "hex") || !PDX_ARG_OK(hash_p, "hash_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    size_t n = strnlen(hex, 2 * PDX_BLOCK_HASH_MAX + 1);
    if (n != 32 && n != 64) {
        pdx_error("block hash hex: %s%zu characters, expected 32 or 64 hex "
                  "digits",
                  n > 2 * PDX_BLOCK_HASH_MAX ? "more than " : "",
                  n > 2 * PDX_BLOCK_HASH_MAX ? (size_t)2 * PDX_BLOCK_HASH_MAX
                                             : n);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_block_hash_t h;
    memset(&h, 0, sizeof(h));
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            pdx_error("block hash hex: character %zu is not a hex digit",
                      hi < 0 ? 2 * i : 2 * i + 1);
            PDX_LEAVE(PDX_ERR_INVALID);
        }
        h.bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    h.len = (uint8_t)(n / 2);
    *hash_p = h;
    PDX_LEAVE(PDX_OK);
}

int pdx_block_hash_equal(const pdx_block_hash_t *a, const pdx_block_hash_t *b) {
    PDX_ENTER();
    if (!PDX_ARG_OK(a, "a") || !PDX_ARG_OK(b, "b"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK, a->len == b->len && a->len <= PDX_BLOCK_HASH_MAX &&
                             memcmp(a->bytes, b->bytes, a->len) == 0);
}

static pdx_status_t call_init(hash_call_t *c, const struct pdx_hasher *h) {
    c->h = h;
    c->ctx = NULL;
    if (h->algo == PDX_HASH_SHA256_CBOR) {
        c->ctx = EVP_MD_CTX_new();
        if (c->ctx == NULL) {
            pdx_error("sha256_cbor: openssl cannot allocate a digest context");
            return PDX_ERR_NOMEM;
        }
    }
    return PDX_OK;
}

static void call_fini(hash_call_t *c) { EVP_MD_CTX_free(c->ctx); }

static pdx_status_t call_digest(hash_call_t *c, const uint8_t *data, size_t len,
                                pdx_block_hash_t *out) {
    pdx_block_hash_t r;
    memset(&r, 0, sizeof(r));
    if (c->h->algo == PDX_HASH_XXHASH_CBOR) {
        /* XXH128_canonicalFromHash's layout (high64 then low64, each
         * big-endian), written here to spare a library call per block. */
        XXH128_hash_t x = XXH3_128bits(data, len);
        for (int i = 0; i < 8; i++) {
            r.bytes[i] = (uint8_t)(x.high64 >> (56 - 8 * i));
            r.bytes[8 + i] = (uint8_t)(x.low64 >> (56 - 8 * i));
        }
        r.len = 16;
    } else {
        unsigned int mdlen = 0;
        if (EVP_DigestInit_ex2(c->ctx, c->h->md, NULL) != 1 ||
            EVP_DigestUpdate(c->ctx, data, len) != 1 ||
            EVP_DigestFinal_ex(c->ctx, r.bytes, &mdlen) != 1 || mdlen != 32) {
            pdx_error("sha256_cbor: openssl digest failed");
            return PDX_ERR_BACKEND;
        }
        r.len = 32;
    }
    *out = r;
    return PDX_OK;
}

/* The request's extra keys, resolved once per call. */
typedef struct extra_keys {
    const char *lora;
    size_t lora_len;
    const char *salt; /* NULL when absent or empty */
    size_t salt_len;
} extra_keys_t;

static void extra_resolve(const pdx_hash_extra_t *extra, extra_keys_t *k) {
    memset(k, 0, sizeof(*k));
    if (extra == NULL)
        return;
    if ((extra->field_mask & PDX_HASH_EXTRA_FIELD_LORA_NAME) &&
        extra->lora_name != NULL) {
        k->lora = extra->lora_name;
        k->lora_len = strlen(extra->lora_name);
    }
    if ((extra->field_mask & PDX_HASH_EXTRA_FIELD_CACHE_SALT) &&
        extra->cache_salt != NULL && extra->cache_salt[0] != '\0') {
        k->salt = extra->cache_salt;
        k->salt_len = strlen(extra->cache_salt);
    }
}

static int extra_any(const extra_keys_t *k) {
    return k->lora != NULL || k->salt != NULL;
}

/* Worst-case encoding size of one block of `ntokens` with extra keys `k`;
 * 0 if it would overflow size_t. */
static size_t encode_bound(size_t ntokens, const extra_keys_t *k) {
    size_t fixed = 1 + PDX_CBOR_HEAD_MAX + PDX_BLOCK_HASH_MAX + /* parent */
                   PDX_CBOR_HEAD_MAX +                          /* tokens */
                   PDX_CBOR_HEAD_MAX + 2 * PDX_CBOR_HEAD_MAX;   /* extra */
    if (k->lora_len > SIZE_MAX / 4 || k->salt_len > SIZE_MAX / 4)
        return 0;
    size_t strings = k->lora_len + k->salt_len;
    if (ntokens > (SIZE_MAX - fixed - strings) / PDX_CBOR_HEAD_MAX)
        return 0;
    return fixed + strings + ntokens * PDX_CBOR_HEAD_MAX;
}

/* cbor([parent, [tokens...], extra]) into the writer. `first` says whether
 * this block starts at token 0, which is where vLLM applies the salt. */
static void encode_block(pdx_cbor_writer_t *w, const pdx_block_hash_t *parent,
                         const uint64_t *tokens, size_t ntokens,
                         const extra_keys_t *k, int first) {
    /* array(3), bytes(parent): written directly, as the parent's length is
     * 16 or 32 (a 1- or 2-byte head) and encode_bound() leaves room for a
     * whole PDX_BLOCK_HASH_MAX copy, which is a fixed-size move. */
    uint8_t *b = w->buf;
    size_t n = 0;
    b[n++] = 0x80 | 3;
    if (parent->len < 24) {
        b[n++] = (uint8_t)(0x40 | parent->len);
    } else {
        b[n++] = 0x40 | 24;
        b[n++] = parent->len;
    }
    memcpy(b + n, parent->bytes, PDX_BLOCK_HASH_MAX);
    w->len = n + parent->len;
    pdx_cbor_put_uint_array(w, tokens, ntokens);
    /* vLLM: lora_extra_keys + mm_extra_keys + cache_salt_keys, as a tuple,
     * or None when empty. */
    int with_salt = first && k->salt != NULL;
    unsigned nextra = (k->lora != NULL) + with_salt;
    if (nextra == 0) {
        pdx_cbor_put_null(w);
        return;
    }
    pdx_cbor_put_array(w, nextra);
    if (k->lora != NULL)
        pdx_cbor_put_text(w, k->lora, k->lora_len);
    if (with_salt)
        pdx_cbor_put_text(w, k->salt, k->salt_len);
}

static pdx_status_t hash_one(hash_call_t *c, pdx_cbor_writer_t *w,
                             const pdx_block_hash_t *parent,
                             const uint64_t *tokens, size_t ntokens,
                             const extra_keys_t *k, int first,
                             pdx_block_hash_t *out) {
    encode_block(w, parent, tokens, ntokens, k, first);
    if (w->overflow) { /* encode_bound() is a bound; cannot happen */
        pdx_error("block hash: cbor buffer overflow (%zu tokens)", ntokens);
        return PDX_ERR_INVALID;
    }
    return call_digest(c, w->buf, w->len, out);
}

/* The encode buffer for a call: the stack one, or one heap allocation. */
static pdx_status_t buf_get(size_t need, uint8_t *stack, uint8_t **buf_p) {
    if (need == 0) {
        pdx_error("block hash: one block's encoding would overflow size_t");
        return PDX_ERR_TOO_LARGE;
    }
    if (need <= HASH_STACK_BUF) {
        *buf_p = stack;
        return PDX_OK;
    }
    *buf_p = malloc(need);
    if (*buf_p == NULL) {
        pdx_error("block hash: out of memory for a %zu B encode buffer", need);
        return PDX_ERR_NOMEM;
    }
    return PDX_OK;
}

static void buf_put(uint8_t *buf, uint8_t *stack) {
    if (buf != stack)
        free(buf);
}

static pdx_status_t hasher_create(pdx_hash_algo_t algo, const char *seed,
                                  uint32_t block_size,
                                  pdx_hasher_h *hasher_p) {
    if (block_size == 0 || block_size > PDX_HASH_BLOCK_SIZE_MAX) {
        pdx_error("hasher: block_size %u out of range 1..%u", block_size,
                  PDX_HASH_BLOCK_SIZE_MAX);
        return PDX_ERR_INVALID;
    }
    if (algo_digest_len(algo) == 0) {
        pdx_error("hasher: algo %d is not a pdx_hash_algo_t", (int)algo);
        return PDX_ERR_INVALID;
    }

    pdx_status_t st;
    struct pdx_hasher *h = pdx_handle_alloc(sizeof(*h), PDX_MAGIC_HASHER);
    if (h == NULL) {
        pdx_error("hasher: out of memory");
        return PDX_ERR_NOMEM;
    }
    h->algo = algo;
    h->block_size = block_size;
    h->digest_len = (uint8_t)algo_digest_len(algo);
    if (algo == PDX_HASH_SHA256_CBOR) {
        h->md = EVP_MD_fetch(NULL, "SHA256", NULL);
        if (h->md == NULL) {
            pdx_error("sha256_cbor: openssl cannot fetch SHA256");
            st = PDX_ERR_BACKEND;
            goto err_free;
        }
    }

    /* NONE_HASH = H(cbor(seed)): vLLM hashes the PYTHONHASHSEED string. */
    size_t seed_len = strlen(seed);
    uint8_t *buf = malloc(seed_len + PDX_CBOR_HEAD_MAX);
    if (buf == NULL) {
        pdx_error("hasher: out of memory for a %zu-byte seed", seed_len);
        st = PDX_ERR_NOMEM;
        goto err_md;
    }
    pdx_cbor_writer_t w;
    pdx_cbor_init(&w, buf, seed_len + PDX_CBOR_HEAD_MAX);
    pdx_cbor_put_text(&w, seed, seed_len);
    hash_call_t c;
    st = call_init(&c, h);
    if (st == PDX_OK) {
        st = call_digest(&c, buf, w.len, &h->none_hash);
        call_fini(&c);
    }
    free(buf);
    if (st != PDX_OK)
        goto err_md;
    *hasher_p = h;
    return PDX_OK;

err_md:
    EVP_MD_free(h->md);
err_free:
    pdx_handle_release(h);
    return st;
}

pdx_status_t pdx_hasher_create(pdx_hash_algo_t algo, const char *seed,
                               uint32_t block_size, pdx_hasher_h *hasher_p) {
    PDX_ENTER();
    if (!PDX_ARG_OK(seed, "seed") || !PDX_ARG_OK(hasher_p, "hasher_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(hasher_create(algo, seed, block_size, hasher_p));
}

void pdx_hasher_destroy(pdx_hasher_h hasher) {
    PDX_ENTER();
    if (hasher == NULL) /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    if (!KV_HASHER_OK(hasher))
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    EVP_MD_free(hasher->md);
    pdx_handle_release(hasher);
    PDX_LEAVE_VOID(PDX_OK);
}

pdx_hash_algo_t pdx_hasher_algo(pdx_hasher_h hasher) {
    PDX_ENTER();
    if (!KV_HASHER_OK(hasher))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, (pdx_hash_algo_t)-1);
    PDX_LEAVE_VAL(PDX_OK, hasher->algo);
}

uint32_t pdx_hasher_block_size(pdx_hasher_h hasher) {
    PDX_ENTER();
    if (!KV_HASHER_OK(hasher))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK, hasher->block_size);
}

void pdx_hasher_none_hash(pdx_hasher_h hasher, pdx_block_hash_t *hash_p) {
    PDX_ENTER();
    if (!KV_HASHER_OK(hasher) || !PDX_ARG_OK(hash_p, "hash_p"))
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    *hash_p = hasher->none_hash;
    PDX_LEAVE_VOID(PDX_OK);
}

static pdx_status_t hash_blocks(pdx_hasher_h h, const uint64_t *tokens,
                                size_t ntokens, const pdx_hash_extra_t *extra,
                                pdx_block_hash_t *out, size_t max_out,
                                size_t *nblocks_p, pdx_block_hash_t *tail_out,
                                int *has_tail_p) {
    size_t bs = h->block_size;
    size_t nblocks = ntokens / bs, tail_len = ntokens % bs;
    if (nblocks > max_out || (nblocks > 0 && out == NULL)) {
        pdx_error("hasher: %zu tokens make %zu blocks of %zu, out holds %zu",
                  ntokens, nblocks, bs, out == NULL ? (size_t)0 : max_out);
        return PDX_ERR_TOO_LARGE;
    }

    extra_keys_t k;
    extra_resolve(extra, &k);
    int want_tail = tail_out != NULL && tail_len > 1 && !extra_any(&k);
    if (nblocks == 0 && !want_tail) {
        *nblocks_p = 0;
        if (has_tail_p != NULL)
            *has_tail_p = 0;
        return PDX_OK;
    }

    uint8_t stack[HASH_STACK_BUF], *buf;
    size_t cap = encode_bound(bs, &k);
    pdx_status_t st = buf_get(cap, stack, &buf);
    if (st != PDX_OK)
        return st;
    hash_call_t c;
    st = call_init(&c, h);
    if (st != PDX_OK)
        goto out_buf;

    pdx_cbor_writer_t w;
    pdx_cbor_init(&w, buf, cap);
    const pdx_block_hash_t *parent = &h->none_hash;
    for (size_t i = 0; i < nblocks; i++) {
        st = hash_one(&c, &w, parent, tokens + i * bs, bs, &k, i == 0, &out[i]);
        if (st != PDX_OK)
            goto out_call;
        parent = &out[i];
    }
    pdx_block_hash_t tail;
    if (want_tail) {
        /* Extra keys are absent here (else no tail), so the key is what
         * vLLM would compute were the tail a full block. */
        st = hash_one(&c, &w, parent, tokens + nblocks * bs, tail_len, &k,
                      nblocks == 0, &tail);
        if (st != PDX_OK)
            goto out_call;
        *tail_out = tail;
    }
    *nblocks_p = nblocks;
    if (has_tail_p != NULL)
        *has_tail_p = want_tail;

out_call:
    call_fini(&c);
out_buf:
    buf_put(buf, stack);
    return st;
}

pdx_status_t
pdx_hasher_hash_blocks(pdx_hasher_h h, const uint64_t *tokens, size_t ntokens,
                       const pdx_hash_extra_t *extra, pdx_block_hash_t *out,
                       size_t max_out, size_t *nblocks_p,
                       pdx_block_hash_t *tail_out, int *has_tail_p) {
    PDX_ENTER();
    if (!KV_HASHER_OK(h) || !PDX_ARG_OK(nblocks_p, "nblocks_p") ||
        (ntokens > 0 && !PDX_ARG_OK(tokens, "tokens")) ||
        (tail_out != NULL && !PDX_ARG_OK(has_tail_p, "has_tail_p")))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(hash_blocks(h, tokens, ntokens, extra, out, max_out, nblocks_p,
                         tail_out, has_tail_p));
}

static pdx_status_t hash_next(pdx_hasher_h h, const pdx_block_hash_t *parent,
                              const uint64_t *tokens, size_t ntokens,
                              const pdx_hash_extra_t *extra,
                              pdx_block_hash_t *hash_p) {
    if (ntokens == 0 || ntokens > h->block_size) {
        pdx_error("hasher: %zu tokens out of range 1..%u for one block",
                  ntokens, h->block_size);
        return PDX_ERR_INVALID;
    }
    if (parent != NULL && parent->len != h->digest_len) {
        pdx_error("hasher: parent hash of %u bytes, %s digests have %u",
                  parent->len, algo_name(h->algo), h->digest_len);
        return PDX_ERR_INVALID;
    }

    extra_keys_t k;
    extra_resolve(extra, &k);
    uint8_t stack[HASH_STACK_BUF], *buf;
    size_t cap = encode_bound(ntokens, &k);
    pdx_status_t st = buf_get(cap, stack, &buf);
    if (st != PDX_OK)
        return st;
    hash_call_t c;
    st = call_init(&c, h);
    if (st == PDX_OK) {
        pdx_cbor_writer_t w;
        pdx_cbor_init(&w, buf, cap);
        pdx_block_hash_t r;
        st = hash_one(&c, &w, parent != NULL ? parent : &h->none_hash, tokens,
                      ntokens, &k, parent == NULL, &r);
        if (st == PDX_OK)
            *hash_p = r;
        call_fini(&c);
    }
    buf_put(buf, stack);
    return st;
}

pdx_status_t pdx_hasher_hash_next(pdx_hasher_h h,
                                  const pdx_block_hash_t *parent,
                                  const uint64_t *tokens, size_t ntokens,
                                  const pdx_hash_extra_t *extra,
                                  pdx_block_hash_t *hash_p) {
    PDX_ENTER();
    if (!KV_HASHER_OK(h) || !PDX_ARG_OK(tokens, "tokens") ||
        !PDX_ARG_OK(hash_p, "hash_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(hash_next(h, parent, tokens, ntokens, extra, hash_p));
}
