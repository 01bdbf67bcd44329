/* Minimal canonical CBOR (RFC 8949 §4.2.1, as cbor2 writes with
 * canonical=True) encoder: only what block hashing needs. Private to the
 * connector. Written from the RFC for pdx; not derived from another library. */
#ifndef PDX_CBOR_H
#define PDX_CBOR_H

#include <stddef.h>
#include <stdint.h>

/* Largest head (initial byte plus argument): 1 + 8 bytes. */
#define PDX_CBOR_HEAD_MAX 9

/* A writer over a caller-owned buffer. On overflow nothing more is written
 * and `overflow` stays set; the caller checks it once at the end. */
typedef struct pdx_cbor_writer {
    uint8_t *buf;
    size_t cap;
    size_t len;
    int overflow;
} pdx_cbor_writer_t;

static inline void pdx_cbor_init(pdx_cbor_writer_t *w, uint8_t *buf,
                                 size_t cap) {
    w->buf = buf;
    w->cap = cap;
    w->len = 0;
    w->overflow = 0;
}

/* Encoded size of a head carrying `v` (shortest form). */
size_t pdx_cbor_head_size(uint64_t v);

void pdx_cbor_put_uint(pdx_cbor_writer_t *w, uint64_t v);
void pdx_cbor_put_bytes(pdx_cbor_writer_t *w, const void *data, size_t len);
/* `s` must be UTF-8 (not checked); `len` bytes are written as they are. */
void pdx_cbor_put_text(pdx_cbor_writer_t *w, const char *s, size_t len);
/* Head of a definite-length array of `n` items; the items follow. */
void pdx_cbor_put_array(pdx_cbor_writer_t *w, uint64_t n);
void pdx_cbor_put_null(pdx_cbor_writer_t *w);
/* A whole array of unsigned ints: the hot path of block hashing. */
void pdx_cbor_put_uint_array(pdx_cbor_writer_t *w, const uint64_t *v, size_t n);

#endif
