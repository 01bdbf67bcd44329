/* Metadata blob writer and bounds-checked parser (see blob_int.h). The layout:
 * header {magic u32, version u16, header_len u16, body_len u32, reserved
 * u32, xxh3-64 of body u64}, then the body: name, instance u64, generation
 * u32, pid i32, host id, invariants, backends with connection info, regions
 * with one key per backend. Strings are u16-length-prefixed, byte strings
 * u32-length-prefixed, every integer little-endian. */
#include <pdx/blob.h>

#include "blob_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

static void wbuf_reserve(pdx_wbuf_t *w, size_t extra)
{
    if (w->failed) {
        return;
    }
    if (w->len + extra <= w->cap) {
        return;
    }
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + extra) {
        cap *= 2;
    }
    uint8_t *p = realloc(w->data, cap);
    if (p == NULL) {
        w->failed = 1;
        return;
    }
    w->data = p;
    w->cap = cap;
}

static void wbuf_put(pdx_wbuf_t *w, uint64_t v, unsigned bytes)
{
    wbuf_reserve(w, bytes);
    if (w->failed) {
        return;
    }
    for (unsigned i = 0; i < bytes; i++) {
        w->data[w->len++] = (uint8_t)(v >> (8 * i));
    }
}

void pdx_wbuf_u8(pdx_wbuf_t *w, uint8_t v) { wbuf_put(w, v, 1); }
void pdx_wbuf_u16(pdx_wbuf_t *w, uint16_t v) { wbuf_put(w, v, 2); }
void pdx_wbuf_u32(pdx_wbuf_t *w, uint32_t v) { wbuf_put(w, v, 4); }
void pdx_wbuf_u64(pdx_wbuf_t *w, uint64_t v) { wbuf_put(w, v, 8); }

void pdx_wbuf_bytes32(pdx_wbuf_t *w, const void *p, uint32_t len)
{
    pdx_wbuf_u32(w, len);
    wbuf_reserve(w, len);
    if (w->failed || len == 0) {
        return;
    }
    memcpy(w->data + w->len, p, len);
    w->len += len;
}

void pdx_wbuf_str(pdx_wbuf_t *w, const char *s)
{
    size_t n = strlen(s);
    if (n > UINT16_MAX) {
        w->failed = 1;
        return;
    }
    pdx_wbuf_u16(w, (uint16_t)n);
    wbuf_reserve(w, n);
    if (w->failed || n == 0) {
        return;
    }
    memcpy(w->data + w->len, s, n);
    w->len += n;
}

void pdx_blob_begin(pdx_wbuf_t *w)
{
    wbuf_reserve(w, PDX_BLOB_HEADER_LEN);
    if (!w->failed) {
        memset(w->data, 0, PDX_BLOB_HEADER_LEN);
        w->len = PDX_BLOB_HEADER_LEN;
    }
}

static void put_at(uint8_t *p, uint64_t v, unsigned bytes)
{
    for (unsigned i = 0; i < bytes; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

pdx_status_t pdx_blob_finish(pdx_wbuf_t *w)
{
    if (w->failed) {
        return PDX_ERR_NOMEM;
    }
    size_t body = w->len - PDX_BLOB_HEADER_LEN;
    if (w->len > PDX_BLOB_MAX_LEN) {
        pdx_error("metadata blob of %zu bytes exceeds the %u-byte limit",
                  w->len, PDX_BLOB_MAX_LEN);
        return PDX_ERR_TOO_LARGE;
    }
    put_at(w->data, PDX_BLOB_MAGIC, 4);
    put_at(w->data + 4, PDX_BLOB_VERSION, 2);
    put_at(w->data + 6, PDX_BLOB_HEADER_LEN, 2);
    put_at(w->data + 8, body, 4);
    put_at(w->data + 12, 0, 4);
    put_at(w->data + 16, XXH3_64bits(w->data + PDX_BLOB_HEADER_LEN, body), 8);
    return PDX_OK;
}

/* Bounds-checked reader; the first failure sticks and names the field. */
typedef struct rd {
    const uint8_t *p;
    size_t len, off;
    pdx_status_t status;
    char *why;
    size_t why_len;
} rd_t;

static int rd_fail(rd_t *r, pdx_status_t st, const char *field,
                   const char *what)
{
    if (r->status == PDX_OK) {
        r->status = st;
        snprintf(r->why, r->why_len, "%s at offset %zu: %s", field, r->off,
                 what);
    }
    return 0;
}

static int rd_need(rd_t *r, size_t n, const char *field)
{
    if (r->status != PDX_OK) {
        return 0;
    }
    if (n > r->len - r->off) {
        char what[96];
        snprintf(what, sizeof(what), "truncated (need %zu bytes, %zu left)",
                 n, r->len - r->off);
        return rd_fail(r, PDX_ERR_CORRUPT, field, what);
    }
    return 1;
}

static uint64_t rd_int(rd_t *r, unsigned bytes, const char *field)
{
    if (!rd_need(r, bytes, field)) {
        return 0;
    }
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++) {
        v |= (uint64_t)r->p[r->off + i] << (8 * i);
    }
    r->off += bytes;
    return v;
}

/* A length-prefixed string into `out` (size `cap`, NUL-terminated); only
 * printable ASCII is accepted so names can be logged safely. */
static void rd_str(rd_t *r, char *out, size_t cap, const char *field)
{
    out[0] = '\0';
    uint64_t n = rd_int(r, 2, field);
    if (r->status != PDX_OK) {
        return;
    }
    if (n >= cap) {
        char what[64];
        snprintf(what, sizeof(what), "length %llu over limit %zu",
                 (unsigned long long)n, cap - 1);
        rd_fail(r, PDX_ERR_CORRUPT, field, what);
        return;
    }
    if (!rd_need(r, n, field)) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t c = r->p[r->off + i];
        if (c < 0x20 || c > 0x7e) {
            rd_fail(r, PDX_ERR_CORRUPT, field, "non-printable character");
            return;
        }
        out[i] = (char)c;
    }
    out[n] = '\0';
    r->off += n;
}

static const uint8_t *rd_bytes(rd_t *r, uint32_t *len_p, const char *field)
{
    uint64_t n = rd_int(r, 4, field);
    if (!rd_need(r, n, field)) {
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    *len_p = (uint32_t)n;
    return p;
}

void pdx_blob_free_parsed(pdx_blob_t *b)
{
    if (b == NULL) {
        return;
    }
    if (b->regions != NULL) {
        for (uint32_t i = 0; i < b->nregions; i++) {
            free(b->regions[i].keys);
        }
    }
    free(b->regions);
    free(b->backends);
    free(b->inv);
    free(b);
}

static pdx_status_t parse_header(rd_t *r, size_t len)
{
    if (len < PDX_BLOB_HEADER_LEN) {
        snprintf(r->why, r->why_len,
                 "truncated header: %zu bytes, need %u", len,
                 PDX_BLOB_HEADER_LEN);
        return PDX_ERR_CORRUPT;
    }
    uint32_t magic = (uint32_t)rd_int(r, 4, "magic");
    if (magic != PDX_BLOB_MAGIC) {
        snprintf(r->why, r->why_len,
                 "bad magic 0x%08x (not a pdx metadata blob)", magic);
        return PDX_ERR_CORRUPT;
    }
    uint32_t version = (uint32_t)rd_int(r, 2, "version");
    uint32_t hlen = (uint32_t)rd_int(r, 2, "header_len");
    uint64_t body = rd_int(r, 4, "body_len");
    uint32_t reserved = (uint32_t)rd_int(r, 4, "reserved");
    uint64_t sum = rd_int(r, 8, "checksum");
    if (version != PDX_BLOB_VERSION) {
        snprintf(r->why, r->why_len,
                 "blob version %u, this pdx reads version %u", version,
                 PDX_BLOB_VERSION);
        return PDX_ERR_VERSION;
    }
    if (hlen != PDX_BLOB_HEADER_LEN) {
        snprintf(r->why, r->why_len, "header length %u, expected %u", hlen,
                 PDX_BLOB_HEADER_LEN);
        return PDX_ERR_CORRUPT;
    }
    if (reserved != 0) {
        snprintf(r->why, r->why_len, "reserved header field is 0x%x, not 0",
                 reserved);
        return PDX_ERR_CORRUPT;
    }
    if (body + PDX_BLOB_HEADER_LEN > PDX_BLOB_MAX_LEN) {
        snprintf(r->why, r->why_len, "body of %llu bytes over the %u limit",
                 (unsigned long long)body, PDX_BLOB_MAX_LEN);
        return PDX_ERR_TOO_LARGE;
    }
    if (body != len - PDX_BLOB_HEADER_LEN) {
        snprintf(r->why, r->why_len,
                 "length mismatch: header says %llu body bytes, have %zu",
                 (unsigned long long)body, len - PDX_BLOB_HEADER_LEN);
        return PDX_ERR_CORRUPT;
    }
    uint64_t actual = XXH3_64bits(r->p + PDX_BLOB_HEADER_LEN, body);
    if (actual != sum) {
        snprintf(r->why, r->why_len,
                 "checksum mismatch: header 0x%016llx, body 0x%016llx",
                 (unsigned long long)sum, (unsigned long long)actual);
        return PDX_ERR_CORRUPT;
    }
    return PDX_OK;
}

/* Minimum encoded sizes, to refuse counts the remaining bytes can't hold
 * before allocating for them. */
#define MIN_INV 4u
#define MIN_BACKEND 6u
#define MIN_REGION 31u
#define MIN_KEY 6u

static void parse_body(rd_t *r, pdx_blob_t *b)
{
    rd_str(r, b->name, sizeof(b->name), "name");
    if (r->status == PDX_OK && b->name[0] == '\0') {
        rd_fail(r, PDX_ERR_CORRUPT, "name", "empty agent name");
    }
    /* What pdx_agent_create allows: the name goes into store keys and
     * file names. */
    for (const char *c = b->name; r->status == PDX_OK && *c != '\0'; c++) {
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' &&
            *c != '-') {
            rd_fail(r, PDX_ERR_CORRUPT, "name",
                    "character outside [A-Za-z0-9._-]");
        }
    }
    b->instance = rd_int(r, 8, "instance");
    b->generation = (uint32_t)rd_int(r, 4, "generation");
    b->pid = (int32_t)rd_int(r, 4, "pid");
    rd_str(r, b->host_id, sizeof(b->host_id), "host_id");

    uint64_t ninv = rd_int(r, 2, "invariant count");
    if (r->status == PDX_OK &&
        (ninv > PDX_BLOB_MAX_INVARIANTS || ninv * MIN_INV > r->len - r->off)) {
        rd_fail(r, PDX_ERR_CORRUPT, "invariant count", "too many");
        return;
    }
    if (ninv > 0 && r->status == PDX_OK) {
        b->inv = calloc(ninv, sizeof(*b->inv));
        if (b->inv == NULL) {
            rd_fail(r, PDX_ERR_NOMEM, "invariants", "out of memory");
            return;
        }
        b->ninv = (uint16_t)ninv;
        for (uint16_t i = 0; i < b->ninv; i++) {
            rd_str(r, b->inv[i].key, sizeof(b->inv[i].key), "invariant key");
            rd_str(r, b->inv[i].value, sizeof(b->inv[i].value),
                   "invariant value");
            for (uint16_t j = 0; j < i && r->status == PDX_OK; j++) {
                if (strcmp(b->inv[j].key, b->inv[i].key) == 0) {
                    rd_fail(r, PDX_ERR_CORRUPT, "invariant key",
                            "key given twice");
                }
            }
        }
    }

    uint64_t nbe = rd_int(r, 2, "backend count");
    if (r->status == PDX_OK && (nbe > PDX_BLOB_MAX_BACKENDS ||
                                nbe * MIN_BACKEND > r->len - r->off)) {
        rd_fail(r, PDX_ERR_CORRUPT, "backend count", "too many");
        return;
    }
    if (nbe > 0 && r->status == PDX_OK) {
        b->backends = calloc(nbe, sizeof(*b->backends));
        if (b->backends == NULL) {
            rd_fail(r, PDX_ERR_NOMEM, "backends", "out of memory");
            return;
        }
        b->nbackends = (uint16_t)nbe;
        for (uint16_t i = 0; i < b->nbackends; i++) {
            rd_str(r, b->backends[i].name, sizeof(b->backends[i].name),
                   "backend name");
            for (uint16_t j = 0; j < i && r->status == PDX_OK; j++) {
                if (strcmp(b->backends[j].name, b->backends[i].name) == 0) {
                    rd_fail(r, PDX_ERR_CORRUPT, "backend name",
                            "backend given twice");
                }
            }
            b->backends[i].conn =
                rd_bytes(r, &b->backends[i].conn_len, "backend conn info");
        }
    }

    uint64_t nreg = rd_int(r, 4, "region count");
    if (r->status == PDX_OK && nreg * MIN_REGION > r->len - r->off) {
        rd_fail(r, PDX_ERR_CORRUPT, "region count",
                "more regions than the blob can hold");
        return;
    }
    if (nreg > 0 && r->status == PDX_OK) {
        b->regions = calloc(nreg, sizeof(*b->regions));
        if (b->regions == NULL) {
            rd_fail(r, PDX_ERR_NOMEM, "regions", "out of memory");
            return;
        }
        b->nregions = (uint32_t)nreg;
        for (uint32_t i = 0; i < b->nregions && r->status == PDX_OK; i++) {
            pdx_blob_region_t *g = &b->regions[i];
            g->region.addr = rd_int(r, 8, "region addr");
            g->region.len = rd_int(r, 8, "region len");
            g->region.dev_id = (uint32_t)rd_int(r, 4, "region dev_id");
            uint64_t mt = rd_int(r, 1, "region mem_type");
            g->region.flags = rd_int(r, 8, "region flags");
            g->region.shm_fd = -1; /* the peer's fd: its key says more */
            if (r->status != PDX_OK) {
                break;
            }
            if (mt > PDX_MEM_VRAM) {
                rd_fail(r, PDX_ERR_CORRUPT, "region mem_type",
                        "unknown memory type");
                break;
            }
            g->region.mem_type = (pdx_mem_type_t)mt;
            if (g->region.len == 0 ||
                g->region.addr + g->region.len < g->region.addr) {
                rd_fail(r, PDX_ERR_CORRUPT, "region len",
                        "empty or wrapping region");
                break;
            }
            uint64_t nkeys = rd_int(r, 2, "region key count");
            if (r->status == PDX_OK &&
                (nkeys > b->nbackends || nkeys * MIN_KEY > r->len - r->off)) {
                rd_fail(r, PDX_ERR_CORRUPT, "region key count",
                        "more keys than backends");
                break;
            }
            if (nkeys == 0) {
                continue;
            }
            g->keys = calloc(nkeys, sizeof(*g->keys));
            if (g->keys == NULL) {
                rd_fail(r, PDX_ERR_NOMEM, "region keys", "out of memory");
                break;
            }
            g->nkeys = (uint16_t)nkeys;
            for (uint16_t k = 0; k < g->nkeys; k++) {
                g->keys[k].backend = (uint16_t)rd_int(r, 2, "key backend");
                if (r->status == PDX_OK && g->keys[k].backend >= b->nbackends) {
                    rd_fail(r, PDX_ERR_CORRUPT, "key backend",
                            "backend index out of range");
                    break;
                }
                for (uint16_t j = 0; j < k && r->status == PDX_OK; j++) {
                    if (g->keys[j].backend == g->keys[k].backend) {
                        rd_fail(r, PDX_ERR_CORRUPT, "key backend",
                                "two keys of one backend for a region");
                    }
                }
                g->keys[k].key = rd_bytes(r, &g->keys[k].len, "region key");
            }
        }
    }
    if (r->status == PDX_OK && r->off != r->len) {
        rd_fail(r, PDX_ERR_CORRUPT, "end", "trailing bytes after the body");
    }
}

pdx_status_t pdx_blob_parse(const void *buf, size_t len, pdx_blob_t **blob_p,
                            char *why, size_t why_len)
{
    char scratch[8];
    if (why == NULL || why_len == 0) {
        why = scratch;
        why_len = sizeof(scratch);
    }
    why[0] = '\0';
    if (buf == NULL && len > 0) {
        snprintf(why, why_len, "null buffer");
        return PDX_ERR_INVALID;
    }
    if (len > PDX_BLOB_MAX_LEN) {
        snprintf(why, why_len, "blob of %zu bytes over the %u limit", len,
                 PDX_BLOB_MAX_LEN);
        return PDX_ERR_TOO_LARGE;
    }
    rd_t r = {.p = buf, .len = len, .status = PDX_OK, .why = why,
              .why_len = why_len};
    pdx_status_t st = parse_header(&r, len);
    if (st != PDX_OK) {
        return st;
    }
    pdx_blob_t *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(why, why_len, "out of memory");
        return PDX_ERR_NOMEM;
    }
    parse_body(&r, b);
    if (r.status != PDX_OK) {
        pdx_blob_free_parsed(b);
        return r.status;
    }
    *blob_p = b;
    return PDX_OK;
}

/* pdx_agent_describe's blob (pdx/blob.h). */
void pdx_blob_free(void *blob) { free(blob); }
