/* Metadata blob: portable (little-endian, fixed-width, length-prefixed),
 * versioned and checksummed description of an agent, and its parser. */
#ifndef PDX_BLOB_INT_H
#define PDX_BLOB_INT_H

#include <stddef.h>
#include <stdint.h>

#include <pdx/backend.h>

#define PDX_BLOB_MAGIC 0x42584450u /* "PDXB" little-endian */
#define PDX_BLOB_VERSION 1u
#define PDX_BLOB_HEADER_LEN 24u
#define PDX_BLOB_MAX_LEN (64u << 20)
#define PDX_BLOB_BACKEND_NAME_MAX 32
#define PDX_BLOB_HOST_MAX 128
#define PDX_BLOB_NAME_MAX 64
#define PDX_BLOB_INV_KEY_MAX 64
#define PDX_BLOB_INV_VAL_MAX 256
#define PDX_BLOB_MAX_BACKENDS 8
#define PDX_BLOB_MAX_INVARIANTS 32

typedef struct pdx_blob_backend {
    char name[PDX_BLOB_BACKEND_NAME_MAX];
    const uint8_t *conn; /* points into the parsed buffer */
    uint32_t conn_len;
} pdx_blob_backend_t;

typedef struct pdx_blob_key {
    uint16_t backend; /* index into backends */
    uint32_t len;
    const uint8_t *key; /* points into the parsed buffer */
} pdx_blob_key_t;

typedef struct pdx_blob_region {
    pdx_region_t region;
    uint16_t nkeys;
    pdx_blob_key_t *keys;
} pdx_blob_region_t;

typedef struct pdx_blob_inv {
    char key[PDX_BLOB_INV_KEY_MAX];
    char value[PDX_BLOB_INV_VAL_MAX];
} pdx_blob_inv_t;

typedef struct pdx_blob {
    char name[PDX_BLOB_NAME_MAX];
    uint64_t instance;
    uint32_t generation;
    int32_t pid;
    char host_id[PDX_BLOB_HOST_MAX];
    uint16_t ninv;
    pdx_blob_inv_t *inv;
    uint16_t nbackends;
    pdx_blob_backend_t *backends;
    uint32_t nregions;
    pdx_blob_region_t *regions;
} pdx_blob_t;

/* Growable little-endian writer. */
typedef struct pdx_wbuf {
    uint8_t *data;
    size_t len, cap;
    int failed; /* an allocation failed; further puts are ignored */
} pdx_wbuf_t;

void pdx_wbuf_u8(pdx_wbuf_t *w, uint8_t v);
void pdx_wbuf_u16(pdx_wbuf_t *w, uint16_t v);
void pdx_wbuf_u32(pdx_wbuf_t *w, uint32_t v);
void pdx_wbuf_u64(pdx_wbuf_t *w, uint64_t v);
void pdx_wbuf_bytes32(pdx_wbuf_t *w, const void *p, uint32_t len);
void pdx_wbuf_str(pdx_wbuf_t *w, const char *s);

/* Start a blob (reserves the header); finish it (fills length, checksum). */
void pdx_blob_begin(pdx_wbuf_t *w);
pdx_status_t pdx_blob_finish(pdx_wbuf_t *w);

/* Parse and validate `len` bytes. On success *blob_p references `buf`,
 * which must outlive it; free with pdx_blob_free_parsed. On failure writes
 * a reason into `why`. Never reads outside [buf, buf+len). */
pdx_status_t pdx_blob_parse(const void *buf, size_t len, pdx_blob_t **blob_p,
                            char *why, size_t why_len);
void pdx_blob_free_parsed(pdx_blob_t *blob);

#endif
