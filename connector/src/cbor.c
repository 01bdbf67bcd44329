/* Minimal canonical CBOR encoder for block hashing (see cbor.h). Written for
 * pdx from RFC 8949; canonical here means shortest-form heads and definite
 * lengths, which is all cbor2's canonical mode changes for the types used. */
#include "cbor.h"

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

void pdx_cbor_put_uint_array(pdx_cbor_writer_t *w, const uint64_t *v,
                             size_t n) {
    pdx_cbor_put_array(w, n);
    /* One bound check for the whole run when the worst case fits, so the
     * per-token loop carries no checks. */
    if (!w->overflow && n <= (w->cap - w->len) / PDX_CBOR_HEAD_MAX) {
        uint8_t *p = w->buf + w->len;
        for (size_t i = 0; i < n; i++)
            p += cbor_uint_fast(p, v[i]);
        w->len = (size_t)(p - w->buf);
        return;
    }
    for (size_t i = 0; i < n && !w->overflow; i++)
        pdx_cbor_put_uint(w, v[i]);
}
