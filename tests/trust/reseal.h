/* Resealed-blob mutations shared by the bounded ctest (test_reseal.c) and
 * the libFuzzer harness (tests/fuzz/fuzz_peer_load.c): a real blob's body
 * is changed (bit flips, inner fields truncated, extended, spliced, their
 * length prefixes set to extremes, boundary bytes) and the header's body
 * length and xxh3 are recomputed, so the header check passes and the body
 * reaches the parser and every backend. Header-only, test code. */
#ifndef PDX_TEST_RESEAL_H
#define PDX_TEST_RESEAL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#define RS_HDR 24u
#define RS_MAX_FIELDS 256

/* A u32-length-prefixed byte string of the body (a backend's connection
 * info or a region key): `off` is its prefix. */
typedef struct rs_field {
    size_t off;
    uint32_t len;
} rs_field_t;

typedef struct rs_src {
    const uint8_t *s;
    size_t n, pos;
    uint64_t x; /* xorshift once the script is used up */
} rs_src_t;

static inline uint32_t rs_next(rs_src_t *r)
{
    if (r->pos + 4 <= r->n) {
        uint32_t v;
        memcpy(&v, r->s + r->pos, 4);
        r->pos += 4;
        r->x ^= v;
        return v;
    }
    r->x ^= r->x << 13;
    r->x ^= r->x >> 7;
    r->x ^= r->x << 17;
    return (uint32_t)(r->x >> 11);
}

static inline uint64_t rs_get(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static inline void rs_put(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* The conn infos and keys of a well-formed blob (the layout of
 * core/blob.c); returns how many, 0 if it does not parse. */
static inline size_t rs_fields(const uint8_t *b, size_t len, rs_field_t *f)
{
    size_t o = RS_HDR, n = 0;
#define RS_NEED(k)                                                             \
    do {                                                                       \
        if ((k) > len - o)                                                     \
            return 0;                                                          \
    } while (0)
#define RS_STR()                                                               \
    do {                                                                       \
        RS_NEED(2);                                                            \
        size_t l_ = rs_get(b + o, 2);                                          \
        o += 2;                                                                \
        RS_NEED(l_);                                                           \
        o += l_;                                                               \
    } while (0)
#define RS_BYTES()                                                             \
    do {                                                                       \
        RS_NEED(4);                                                            \
        uint32_t l_ = (uint32_t)rs_get(b + o, 4);                              \
        if (n < RS_MAX_FIELDS)                                                 \
            f[n++] = (rs_field_t){o, l_};                                      \
        o += 4;                                                                \
        RS_NEED(l_);                                                           \
        o += l_;                                                               \
    } while (0)
    if (len < RS_HDR) {
        return 0;
    }
    RS_STR();      /* name */
    RS_NEED(16);   /* instance, generation, pid */
    o += 16;
    RS_STR();      /* host id */
    RS_NEED(2);
    size_t ninv = rs_get(b + o, 2);
    o += 2;
    for (size_t i = 0; i < ninv; i++) {
        RS_STR();
        RS_STR();
    }
    RS_NEED(2);
    size_t nbe = rs_get(b + o, 2);
    o += 2;
    for (size_t i = 0; i < nbe; i++) {
        RS_STR();
        RS_BYTES();
    }
    RS_NEED(4);
    size_t nreg = rs_get(b + o, 4);
    o += 4;
    for (size_t i = 0; i < nreg; i++) {
        RS_NEED(29 + 2);
        o += 29;
        size_t nk = rs_get(b + o, 2);
        o += 2;
        for (size_t k = 0; k < nk; k++) {
            RS_NEED(2);
            o += 2;
            RS_BYTES();
        }
    }
#undef RS_NEED
#undef RS_STR
#undef RS_BYTES
    return n;
}

/* Replace [at, at+old) of *b (length *len, capacity cap) by `nw` bytes
 * from `src` (NULL: random bytes from r). 0 if it would not fit. */
static inline int rs_splice(uint8_t *b, size_t *len, size_t cap, size_t at,
                            size_t old, const uint8_t *src, size_t nw,
                            rs_src_t *r)
{
    if (at + old > *len || *len - old + nw > cap) {
        return 0;
    }
    memmove(b + at + nw, b + at + old, *len - at - old);
    for (size_t i = 0; i < nw; i++) {
        b[at + i] = src != NULL ? src[i] : (uint8_t)rs_next(r);
    }
    *len = *len - old + nw;
    return 1;
}

static inline void rs_reseal(uint8_t *b, size_t len)
{
    uint64_t body = len - RS_HDR;
    rs_put(b + 8, body, 4);
    rs_put(b + 16, XXH3_64bits(b + RS_HDR, body), 8);
}

/* One to three mutations of `orig` into `out` (capacity `cap`, at least
 * orig_len + 4096), driven by `script` then a PRNG; resealed. Returns the
 * new length. */
static inline size_t rs_mutate(const uint8_t *orig, size_t orig_len,
                               const uint8_t *script, size_t slen,
                               uint8_t *out, size_t cap)
{
    static const uint32_t extremes[] = {0,          1,          2,
                                        0x7f,       0x80,       0xff,
                                        0x100,      0xffff,     0x10000,
                                        0x7fffffff, 0x80000000, 0xffffffff};
    static const uint8_t edges[] = {0x00, 0x01, 0x1f, 0x20, 0x3f, 0x40,
                                    0x7f, 0x80, 0xc0, 0xe0, 0xfe, 0xff};
    rs_src_t r = {script, slen, 0, 0x9e3779b97f4a7c15ull ^ slen};
    size_t len = orig_len;
    memcpy(out, orig, len);
    unsigned nops = 1 + rs_next(&r) % 3;
    for (unsigned op = 0; op < nops; op++) {
        rs_field_t f[RS_MAX_FIELDS];
        size_t nf = rs_fields(out, len, f);
        size_t body = len - RS_HDR;
        unsigned kind = rs_next(&r) % 9;
        if (nf == 0 || body == 0) {
            kind = 0; /* an earlier mutation broke the framing */
        }
        rs_field_t *a = nf ? &f[rs_next(&r) % nf] : NULL;
        size_t data = a ? a->off + 4 : 0;
        switch (kind) {
        case 0: /* bit flips anywhere in the body */
            if (body == 0) {
                break;
            }
            for (unsigned i = 0, n = 1 + rs_next(&r) % 3; i < n; i++) {
                uint32_t v = rs_next(&r);
                out[RS_HDR + v % body] ^= (uint8_t)(1u << ((v >> 24) & 7));
            }
            break;
        case 1: /* a byte inside a conn info or key flipped */
            if (a->len > 0) {
                uint32_t v = rs_next(&r);
                out[data + v % a->len] ^= (uint8_t)(1u << ((v >> 24) & 7));
            }
            break;
        case 2: /* a boundary value inside a conn info or key */
            if (a->len > 0) {
                out[data + rs_next(&r) % a->len] =
                    edges[rs_next(&r) % sizeof(edges)];
            }
            break;
        case 3: { /* a length prefix set to an extreme */
            uint32_t v = rs_next(&r) % 3 == 0
                             ? a->len + (rs_next(&r) & 1 ? 1u : -1u)
                             : extremes[rs_next(&r) % (sizeof(extremes) /
                                                       sizeof(extremes[0]))];
            rs_put(out + a->off, v, 4);
            break;
        }
        case 4: { /* an inner field truncated (prefix kept consistent) */
            if (a->len == 0) {
                break;
            }
            size_t cut = 1 + rs_next(&r) % a->len;
            size_t at = data + rs_next(&r) % (a->len - cut + 1);
            if (rs_splice(out, &len, cap, at, cut, NULL, 0, &r)) {
                rs_put(out + a->off, a->len - cut, 4);
            }
            break;
        }
        case 5: { /* an inner field extended with random bytes */
            size_t add = 1 + rs_next(&r) % 64;
            size_t at = data + (a->len ? rs_next(&r) % (a->len + 1) : 0);
            if (rs_splice(out, &len, cap, at, 0, NULL, add, &r)) {
                rs_put(out + a->off, a->len + add, 4);
            }
            break;
        }
        case 6: { /* a field's bytes replaced by another field's */
            rs_field_t *b = &f[rs_next(&r) % nf];
            uint8_t tmp[4096];
            if (b->len > sizeof(tmp) || b == a) {
                break;
            }
            memcpy(tmp, out + b->off + 4, b->len);
            if (rs_splice(out, &len, cap, data, a->len, tmp, b->len, &r)) {
                rs_put(out + a->off, b->len, 4);
            }
            break;
        }
        case 7: { /* an integer of the body set to an extreme */
            unsigned w = (rs_next(&r) & 1) ? 4 : 2;
            if (body < w) {
                break;
            }
            size_t at = RS_HDR + rs_next(&r) % (body - w + 1);
            rs_put(out + at, extremes[rs_next(&r) % (sizeof(extremes) /
                                                     sizeof(extremes[0]))],
                   w);
            break;
        }
        case 8: { /* the tail of the body cut */
            size_t cut = 1 + rs_next(&r) % (body < 64 ? body : 64);
            len -= cut;
            break;
        }
        }
    }
    rs_reseal(out, len);
    return len;
}

#endif
