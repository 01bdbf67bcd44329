/* cuda_ipc: blobs, device mapping, host check and piece merging (no driver
 * calls here, so all of it runs in unit tests). */
#include "cuda_ipc_wire_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Little-endian writers and readers; the reader fails (sticky) instead of
 * reading past the end. */
typedef struct {
    uint8_t *p;
    size_t off;
} wbuf_t;

static void put_u16(wbuf_t *w, uint16_t v)
{
    w->p[w->off++] = (uint8_t)v;
    w->p[w->off++] = (uint8_t)(v >> 8);
}

static void put_u32(wbuf_t *w, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        w->p[w->off++] = (uint8_t)(v >> (8 * i));
    }
}

static void put_u64(wbuf_t *w, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        w->p[w->off++] = (uint8_t)(v >> (8 * i));
    }
}

static void put_bytes(wbuf_t *w, const void *src, size_t n)
{
    memcpy(w->p + w->off, src, n);
    w->off += n;
}

typedef struct {
    const uint8_t *p;
    size_t len;
    size_t off;
    int bad;
} rbuf_t;

static int need(rbuf_t *r, size_t n)
{
    if (r->bad || r->len - r->off < n) {
        r->bad = 1;
        return 0;
    }
    return 1;
}

static uint16_t get_u16(rbuf_t *r)
{
    if (!need(r, 2)) {
        return 0;
    }
    uint16_t v = (uint16_t)(r->p[r->off] | (r->p[r->off + 1] << 8));
    r->off += 2;
    return v;
}

static uint32_t get_u32(rbuf_t *r)
{
    if (!need(r, 4)) {
        return 0;
    }
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        v |= (uint32_t)r->p[r->off + i] << (8 * i);
    }
    r->off += 4;
    return v;
}

static uint64_t get_u64(rbuf_t *r)
{
    if (!need(r, 8)) {
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)r->p[r->off + i] << (8 * i);
    }
    r->off += 8;
    return v;
}

static void get_bytes(rbuf_t *r, void *dst, size_t n)
{
    if (!need(r, n)) {
        memset(dst, 0, n);
        return;
    }
    memcpy(dst, r->p + r->off, n);
    r->off += n;
}

static void set_why(char *why, size_t why_len, const char *msg)
{
    if (why != NULL && why_len > 0) {
        snprintf(why, why_len, "%s", msg);
    }
}

/* A host id as it travels: 1..255 bytes, no NUL inside. */
static int host_id_ok(const char *id, size_t *len_p)
{
    if (id == NULL) {
        return 0;
    }
    size_t n = strnlen(id, CIPC_HOST_ID_MAX + 1);
    if (n == 0 || n > CIPC_HOST_ID_MAX) {
        return 0;
    }
    *len_p = n;
    return 1;
}

static pdx_status_t get_host_id(rbuf_t *r, char *dst, char *why, size_t why_len)
{
    uint16_t n = get_u16(r);
    if (r->bad) {
        set_why(why, why_len, "truncated before host id");
        return PDX_ERR_CORRUPT;
    }
    if (n == 0 || n > CIPC_HOST_ID_MAX) {
        set_why(why, why_len, "host id length out of range");
        return PDX_ERR_CORRUPT;
    }
    get_bytes(r, dst, n);
    if (r->bad) {
        set_why(why, why_len, "truncated in host id");
        return PDX_ERR_CORRUPT;
    }
    dst[n] = '\0';
    if (strlen(dst) != n) {
        set_why(why, why_len, "NUL inside host id");
        return PDX_ERR_CORRUPT;
    }
    return PDX_OK;
}

pdx_status_t cipc_conn_encode(const cipc_conn_t *conn, void **buf_p,
                              size_t *len_p)
{
    size_t hlen;
    if (!host_id_ok(conn->host_id, &hlen) || conn->ndev > CIPC_MAX_DEVICES) {
        return PDX_ERR_INVALID;
    }
    size_t len =
        4 + 2 + 2 + 4 + 8 + 2 + hlen + (size_t)conn->ndev * CIPC_UUID_LEN;
    uint8_t *buf = malloc(len);
    if (buf == NULL) {
        return PDX_ERR_NOMEM;
    }
    wbuf_t w = {buf, 0};
    put_u32(&w, CIPC_CONN_MAGIC);
    put_u16(&w, CIPC_CONN_VERSION);
    put_u16(&w, conn->ndev);
    put_u32(&w, conn->pid);
    put_u64(&w, conn->token);
    put_u16(&w, (uint16_t)hlen);
    put_bytes(&w, conn->host_id, hlen);
    for (uint16_t i = 0; i < conn->ndev; i++) {
        put_bytes(&w, conn->uuid[i], CIPC_UUID_LEN);
    }
    *buf_p = buf;
    *len_p = len;
    return PDX_OK;
}

pdx_status_t cipc_conn_decode(const void *buf, size_t len, cipc_conn_t *out,
                              char *why, size_t why_len)
{
    rbuf_t r = {buf, buf != NULL ? len : 0, 0, 0};
    cipc_conn_t c;
    memset(&c, 0, sizeof(c));
    uint32_t magic = get_u32(&r);
    uint16_t version = get_u16(&r);
    if (r.bad) {
        set_why(why, why_len, "conn info truncated in header");
        return PDX_ERR_CORRUPT;
    }
    if (magic != CIPC_CONN_MAGIC) {
        set_why(why, why_len, "conn info has a bad magic");
        return PDX_ERR_CORRUPT;
    }
    if (version != CIPC_CONN_VERSION) {
        set_why(why, why_len, "conn info version not understood");
        return PDX_ERR_VERSION;
    }
    c.ndev = get_u16(&r);
    c.pid = get_u32(&r);
    c.token = get_u64(&r);
    if (r.bad) {
        set_why(why, why_len, "conn info truncated in header");
        return PDX_ERR_CORRUPT;
    }
    if (c.ndev > CIPC_MAX_DEVICES) {
        set_why(why, why_len, "conn info lists too many devices");
        return PDX_ERR_CORRUPT;
    }
    pdx_status_t st = get_host_id(&r, c.host_id, why, why_len);
    if (st != PDX_OK) {
        return st;
    }
    for (uint16_t i = 0; i < c.ndev; i++) {
        get_bytes(&r, c.uuid[i], CIPC_UUID_LEN);
    }
    if (r.bad) {
        set_why(why, why_len, "conn info truncated in device list");
        return PDX_ERR_CORRUPT;
    }
    if (r.off != r.len) {
        set_why(why, why_len, "conn info has trailing bytes");
        return PDX_ERR_CORRUPT;
    }
    *out = c;
    return PDX_OK;
}

pdx_status_t cipc_key_encode(const cipc_key_t *key, void **buf_p, size_t *len_p)
{
    size_t hlen;
    if (!host_id_ok(key->host_id, &hlen) || key->kind > CIPC_KIND_VMM_FD) {
        return PDX_ERR_INVALID;
    }
    size_t len = CIPC_KEY_FIXED_LEN + hlen;
    uint8_t *buf = malloc(len);
    if (buf == NULL) {
        return PDX_ERR_NOMEM;
    }
    wbuf_t w = {buf, 0};
    put_u32(&w, CIPC_KEY_MAGIC);
    put_u16(&w, CIPC_KEY_VERSION);
    put_u16(&w, key->kind);
    put_bytes(&w, key->uuid, CIPC_UUID_LEN);
    put_u32(&w, key->pid);
    put_u32(&w, (uint32_t)key->fd);
    put_u64(&w, key->base);
    put_u64(&w, key->alloc_size);
    put_u64(&w, key->offset);
    put_u64(&w, key->len);
    put_bytes(&w, key->handle, CIPC_HANDLE_LEN);
    put_u16(&w, (uint16_t)hlen);
    put_bytes(&w, key->host_id, hlen);
    *buf_p = buf;
    *len_p = len;
    return PDX_OK;
}

pdx_status_t cipc_key_decode(const void *buf, size_t len, cipc_key_t *out,
                             char *why, size_t why_len)
{
    rbuf_t r = {buf, buf != NULL ? len : 0, 0, 0};
    cipc_key_t k;
    memset(&k, 0, sizeof(k));
    uint32_t magic = get_u32(&r);
    uint16_t version = get_u16(&r);
    if (r.bad) {
        set_why(why, why_len, "region key truncated in header");
        return PDX_ERR_CORRUPT;
    }
    if (magic != CIPC_KEY_MAGIC) {
        set_why(why, why_len, "region key has a bad magic");
        return PDX_ERR_CORRUPT;
    }
    if (version != CIPC_KEY_VERSION) {
        set_why(why, why_len, "region key version not understood");
        return PDX_ERR_VERSION;
    }
    k.kind = get_u16(&r);
    get_bytes(&r, k.uuid, CIPC_UUID_LEN);
    k.pid = get_u32(&r);
    k.fd = (int32_t)get_u32(&r);
    k.base = get_u64(&r);
    k.alloc_size = get_u64(&r);
    k.offset = get_u64(&r);
    k.len = get_u64(&r);
    get_bytes(&r, k.handle, CIPC_HANDLE_LEN);
    if (r.bad) {
        set_why(why, why_len, "region key truncated");
        return PDX_ERR_CORRUPT;
    }
    pdx_status_t st = get_host_id(&r, k.host_id, why, why_len);
    if (st != PDX_OK) {
        return st;
    }
    if (r.off != r.len) {
        set_why(why, why_len, "region key has trailing bytes");
        return PDX_ERR_CORRUPT;
    }
    if (k.kind > CIPC_KIND_VMM_FD) {
        set_why(why, why_len, "region key has an unknown handle kind");
        return PDX_ERR_CORRUPT;
    }
    if (k.kind == CIPC_KIND_VMM_FD && k.fd < 0) {
        set_why(why, why_len, "region key lacks the exported fd");
        return PDX_ERR_CORRUPT;
    }
    /* The region lies inside its allocation, which does not wrap. */
    if (k.len == 0 || k.offset > k.alloc_size ||
        k.len > k.alloc_size - k.offset || k.base + k.alloc_size < k.base) {
        set_why(why, why_len, "region key bounds are inconsistent");
        return PDX_ERR_CORRUPT;
    }
    *out = k;
    return PDX_OK;
}

int cipc_uuid_to_ordinal(const uint8_t (*local)[CIPC_UUID_LEN], size_t n,
                         const uint8_t uuid[CIPC_UUID_LEN])
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(local[i], uuid, CIPC_UUID_LEN) == 0) {
            return (int)i;
        }
    }
    return -1;
}

int cipc_same_host(const char *a, const char *b)
{
    return a != NULL && b != NULL && a[0] != '\0' && strcmp(a, b) == 0;
}

void cipc_uuid_format(const uint8_t u[CIPC_UUID_LEN], char *buf, size_t len)
{
    snprintf(buf, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
             "%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
             u[11], u[12], u[13], u[14], u[15]);
}

int cipc_iov_next(const pdx_backend_iov_t *iov, size_t n, size_t *pos,
                  pdx_backend_iov_t *run)
{
    size_t i = *pos;
    while (i < n && iov[i].len == 0) {
        i++;
    }
    if (i >= n) {
        *pos = n;
        return 0;
    }
    pdx_backend_iov_t r = iov[i++];
    for (; i < n; i++) {
        const pdx_backend_iov_t *c = &iov[i];
        if (c->len == 0) {
            continue;
        }
        if (c->local_md != r.local_md || c->remote_md != r.remote_md ||
            c->local_addr != r.local_addr + r.len ||
            c->remote_addr != r.remote_addr + r.len || r.len + c->len < r.len) {
            break;
        }
        r.len += c->len;
    }
    *pos = i;
    *run = r;
    return 1;
}

size_t cipc_iov_merge(const pdx_backend_iov_t *in, size_t n,
                      pdx_backend_iov_t *out)
{
    size_t pos = 0, k = 0;
    pdx_backend_iov_t run;
    while (cipc_iov_next(in, n, &pos, &run)) {
        out[k++] = run;
    }
    return k;
}
