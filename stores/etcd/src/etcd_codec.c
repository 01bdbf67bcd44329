/* etcd store: the encodings requests are made of: growable buffers,
 * base64 (OpenSSL's encoder), full keys and range ends, int64 JSON fields
 * (strings on the gateway), response bodies, timestamps for logs; and the
 * jitter of retries. Calls nothing else of the module. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "etcd_int.h"

uint64_t etcd_rand_range(uint64_t lo, uint64_t hi)
{
    static _Thread_local uint64_t x;
    if (x == 0) {
        x = pdx_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&x;
        x |= 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return hi > lo ? lo + x % (hi - lo + 1) : lo;
}

void etcd_buf_add(etcd_buf_t *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1) {
            cap *= 2;
        }
        char *d = realloc(b->data, cap);
        if (d == NULL) {
            return; /* the response will not parse: reported as such */
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void etcd_buf_free(etcd_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *etcd_b64_enc(const void *p, size_t n)
{
    if (n > (size_t)1 << 30) {
        return NULL;
    }
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    if (out == NULL) {
        return NULL;
    }
    EVP_EncodeBlock((unsigned char *)out, p, (int)n);
    return out;
}

void *etcd_b64_dec(const char *s, size_t *len_p)
{
    size_t n = strlen(s);
    if (n % 4 != 0 || n > (size_t)1 << 30) {
        return NULL;
    }
    unsigned char *out = malloc(3 * (n / 4) + 1);
    if (out == NULL) {
        return NULL;
    }
    int m = n > 0 ? EVP_DecodeBlock(out, (const unsigned char *)s, (int)n)
                  : 0;
    if (m < 0) {
        free(out);
        return NULL;
    }
    /* DecodeBlock counts the padding as zero bytes. */
    size_t len = (size_t)m;
    for (size_t i = n; i > 0 && s[i - 1] == '=' && len > 0; i--) {
        len--;
    }
    out[len] = '\0';
    *len_p = len;
    return out;
}

char *etcd_full_key(etcd_store_t *s, const char *rel)
{
    size_t n = strlen(s->ns) + 1 + strlen(rel) + 1;
    char *k = malloc(n);
    if (k != NULL) {
        snprintf(k, n, "%s/%s", s->ns, rel);
    }
    return k;
}

char *etcd_key_b64(etcd_store_t *s, const char *rel)
{
    char *k = etcd_full_key(s, rel);
    if (k == NULL) {
        return NULL;
    }
    char *b = etcd_b64_enc(k, strlen(k));
    free(k);
    return b;
}

char *etcd_prefix_end_b64(const char *full)
{
    size_t n = strlen(full);
    unsigned char *e = malloc(n + 1);
    if (e == NULL) {
        return NULL;
    }
    memcpy(e, full, n);
    /* Keys are text: the last byte is below 0xff, so +1 never carries. */
    size_t m = n;
    while (m > 0 && e[m - 1] == 0xff) {
        m--;
    }
    if (m == 0) {
        free(e);
        return etcd_b64_enc("\0", 1); /* every key */
    }
    e[m - 1]++;
    char *b = etcd_b64_enc(e, m);
    free(e);
    return b;
}

int64_t etcd_json_i64(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsString(v)) {
        return strtoll(v->valuestring, NULL, 10);
    }
    if (cJSON_IsNumber(v)) {
        return (int64_t)v->valuedouble;
    }
    return 0; /* proto3 leaves zero values out */
}

void etcd_json_add_i64(cJSON *obj, const char *name, int64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%lld", (long long)v);
    cJSON_AddStringToObject(obj, name, buf);
}

cJSON *etcd_parse_body(const etcd_buf_t *b)
{
    if (b->data == NULL) {
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(b->data, b->len);
    if (j != NULL && !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

void etcd_fmt_time(uint64_t rt_ns, char *buf, size_t len)
{
    time_t t = (time_t)(rt_ns / 1000000000ull);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}
