/* Minimal canonical CBOR encoder for block hashing (see cbor.h). Written for
 * pdx from RFC 8949; canonical here means shortest-form heads and definite
 * lengths, which is all cbor2's canonical mode changes for the types used. */
#include "cbor_int.h"

#include <string.h>

enum {
    CBOR_MAJOR_UINT = 0,
    CBOR_MAJOR_BYTES = 2,
    CBOR_MAJOR_TEXT = 3,
    CBOR_MAJOR_ARRAY = 4,
    CBOR_SIMPLE_NULL = 0xf6,
};

size_t pdx_cbor_head_size(uint64_t v) {
    if (v < 24)
        return 1;
    if (v <= UINT8_MAX)
        return 2;
    if (v <= UINT16_MAX)
        return 3;
    if (v <= UINT32_MAX)
        return 5;
    return 9;
}

/* Writes a head into `p`, which has room for PDX_CBOR_HEAD_MAX bytes.
 * Big-endian argument in the shortest of 0, 1, 2, 4 or 8 bytes. */
static inline size_t cbor_head(uint8_t *p, unsigned major, uint64_t v) {
    uint8_t mt = (uint8_t)(major << 5);
    if (v < 24) {
        p[0] = (uint8_t)(mt | v);
        return 1;
    }
    if (v <= UINT8_MAX) {
        p[0] = mt | 24;
        p[1] = (uint8_t)v;
        return 2;
    }
    if (v <= UINT16_MAX) {
        p[0] = mt | 25;
        p[1] = (uint8_t)(v >> 8);
        p[2] = (uint8_t)v;
        return 3;
    }
    if (v <= UINT32_MAX) {
        p[0] = mt | 26;
        p[1] = (uint8_t)(v >> 24);
        p[2] = (uint8_t)(v >> 16);
        p[3] = (uint8_t)(v >> 8);
        p[4] = (uint8_t)v;
        return 5;
    }
    p[0] = mt | 27;
    for (int i = 0; i < 8; i++)
        p[1 + i] = (uint8_t)(v >> (56 - 8 * i));
    return 9;
}

static int cbor_room(pdx_cbor_writer_t *w, size_t n) {
    if (w->overflow || w->cap - w->len < n) {
        w->overflow = 1;
        return 0;
    }
    return 1;
}

static void cbor_put_head(pdx_cbor_writer_t *w, unsigned major, uint64_t v) {
    if (cbor_room(w, pdx_cbor_head_size(v)))
        w->len += cbor_head(w->buf + w->len, major, v);
}

static void cbor_put_string(pdx_cbor_writer_t *w, unsigned major,
                            const void *data, size_t len) {
    cbor_put_head(w, major, len);
    if (len && cbor_room(w, len)) {
        memcpy(w->buf + w->len, data, len);
        w->len += len;
    }
}

void pdx_cbor_put_uint(pdx_cbor_writer_t *w, uint64_t v) {
    cbor_put_head(w, CBOR_MAJOR_UINT, v);
}

void pdx_cbor_put_bytes(pdx_cbor_writer_t *w, const void *data, size_t len) {
    cbor_put_string(w, CBOR_MAJOR_BYTES, data, len);
}

void pdx_cbor_put_text(pdx_cbor_writer_t *w, const char *s, size_t len) {
    cbor_put_string(w, CBOR_MAJOR_TEXT, s, len);
}

void pdx_cbor_put_array(pdx_cbor_writer_t *w, uint64_t n) {
    cbor_put_head(w, CBOR_MAJOR_ARRAY, n);
}

void pdx_cbor_put_null(pdx_cbor_writer_t *w) {
    if (cbor_room(w, 1))
        w->buf[w->len++] = CBOR_SIMPLE_NULL;
}

/* Branch-free head of an unsigned int for the token loop: token ids of one
 * prompt mix 1-, 2- and 4-byte arguments at random, and the mispredicted
 * branches of cbor_head() cost more than the hash. Always stores 9 bytes at
 * `p` (the caller has that room); returns how many belong to the item. */
static inline size_t cbor_uint_fast(uint8_t *p, uint64_t v) {
    /* Argument length as log2 of 1, 2, 4, 8 bytes, by significant bits. */
    static const uint8_t lg_by_bits[65] = {
        0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
        2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
        3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
    unsigned lg = lg_by_bits[64 - __builtin_clzll(v | 1)];
    size_t nb = (size_t)1 << lg;
    uint64_t arg = v << (64 - 8 * nb); /* argument in the top nb bytes */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    arg = __builtin_bswap64(arg);
#endif
    memcpy(p + 1, &arg, 8);
    int small = v < 24;
    p[0] = small ? (uint8_t)v : (uint8_t)(24 + lg); /* major type 0 */
    return small ? 1 : 1 + nb;
}

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* Token ids below 2^32 (every real vocabulary) need a 1-, 2-, 3- or 5-byte
 * item, which fits one 8-byte store: with the argument's k significant bytes
 * shifted to the top of a word, byteswapped, the head ORed into byte 0.
 * Shift, head and length come from tables indexed by the bit length of the
 * id plus bit 3, which splits 16..23 (1 byte) from 24..31 (2 bytes), so the
 * loop has no data-dependent branch and few operations per token: it is
 * throughput-bound, not latency-bound. Index k = bsr(v | 1) + 32 * bit3. */
#define U32_CLASS(k)                                                           \
    (((k) & 31) < 4    ? 0                                                     \
     : ((k) & 31) == 4 ? ((k) >> 5)                                            \
     : ((k) & 31) < 8  ? 1                                                     \
     : ((k) & 31) < 16 ? 2                                                     \
                       : 3)
#define U32_ROW(f)                                                             \
    f(0), f(1), f(2), f(3), f(4), f(5), f(6), f(7), f(8), f(9), f(10), f(11),  \
        f(12), f(13), f(14), f(15), f(16), f(17), f(18), f(19), f(20), f(21),  \
        f(22), f(23), f(24), f(25), f(26), f(27), f(28), f(29), f(30), f(31),  \
        f(32), f(33), f(34), f(35), f(36), f(37), f(38), f(39), f(40), f(41),  \
        f(42), f(43), f(44), f(45), f(46), f(47), f(48), f(49), f(50), f(51),  \
        f(52), f(53), f(54), f(55), f(56), f(57), f(58), f(59), f(60), f(61),  \
        f(62), f(63)
/* Per class (1-byte item; 1-, 2-, 4-byte argument): the left shift that
 * moves the item's top byte to bit 56 or the argument's to bit 48, so the
 * swap puts it in byte 0 or 1; the head; the item's length. */
#define U32_SHIFT(k) ((0x18283038u >> (8 * U32_CLASS(k))) & 0xff)
#define U32_HEAD(k) (U32_CLASS(k) == 0 ? 0 : 23 + U32_CLASS(k))
#define U32_LEN(k) ((0x05030201u >> (8 * U32_CLASS(k))) & 0xff)
static const uint8_t u32_shift[64] = {U32_ROW(U32_SHIFT)};
static const uint8_t u32_head[64] = {U32_ROW(U32_HEAD)};
static const uint8_t u32_len[64] = {U32_ROW(U32_LEN)};

/* One id below 2^32 at `p`; always stores 8 bytes there. */
static inline uint8_t *cbor_u32_put(uint8_t *p, uint64_t v) {
    unsigned k = ((unsigned)__builtin_clz((uint32_t)v | 1) ^ 31u) +
                 (unsigned)(v & 8) * 4;
    uint64_t w = __builtin_bswap64(v << u32_shift[k]) | u32_head[k];
    memcpy(p, &w, 8);
    return p + u32_len[k];
}

/* Encodes `n` ids assuming each is below 2^32; stores at most 5 * n + 3
 * bytes at `p`. Returns the end, or NULL if some id was not below 2^32
 * (what was written is then garbage, within those bytes). */
static uint8_t *cbor_u32_run(uint8_t *restrict p, const uint64_t *restrict v,
                             size_t n) {
    uint64_t all = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint64_t a = v[i], b = v[i + 1], c = v[i + 2], d = v[i + 3];
        all |= a | b | c | d;
        p = cbor_u32_put(p, a);
        p = cbor_u32_put(p, b);
        p = cbor_u32_put(p, c);
        p = cbor_u32_put(p, d);
    }
    for (; i < n; i++) {
        all |= v[i];
        p = cbor_u32_put(p, v[i]);
    }
    return __builtin_expect(all >> 32 != 0, 0) ? NULL : p;
}
#endif

void pdx_cbor_put_uint_array(pdx_cbor_writer_t *w, const uint64_t *v,
                             size_t n) {
    pdx_cbor_put_array(w, n);
    /* One bound check for the whole run when the worst case fits, so the
     * per-token loop carries no checks. */
    if (!w->overflow && n <= (w->cap - w->len) / PDX_CBOR_HEAD_MAX) {
        uint8_t *p = w->buf + w->len;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint8_t *end = cbor_u32_run(p, v, n);
        if (__builtin_expect(end != NULL, 1)) {
            w->len = (size_t)(end - w->buf);
            return;
        }
#endif
        for (size_t i = 0; i < n; i++)
            p += cbor_uint_fast(p, v[i]);
        w->len = (size_t)(p - w->buf);
        return;
    }
    for (size_t i = 0; i < n && !w->overflow; i++)
        pdx_cbor_put_uint(w, v[i]);
}
