/* cuda_ipc pure parts: blobs, UUID mapping, host check, piece merging. No
 * driver involved. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cu_api_int.h"
#include "cuda_ipc_wire_int.h"

static void uuid_of(int phys, uint8_t u[16])
{
    for (int i = 0; i < 16; i++) {
        u[i] = (uint8_t)(phys * 31 + i * 7 + 1);
    }
}

static cipc_key_t sample_key(void)
{
    cipc_key_t k;
    memset(&k, 0, sizeof(k));
    k.kind = CIPC_KIND_LEGACY;
    uuid_of(3, k.uuid);
    k.pid = 4242;
    k.fd = -1;
    k.base = 0x7f0000000000ull;
    k.alloc_size = 1ull << 30;
    k.offset = 656ull * 64 * 100;
    k.len = 656ull * 64 * 306;
    for (int i = 0; i < CIPC_HANDLE_LEN; i++) {
        k.handle[i] = (uint8_t)(i * 3 + 1);
    }
    snprintf(k.host_id, sizeof(k.host_id), "boot-1b2c3d4e");
    return k;
}

static void test_key_round_trip(void **state)
{
    cipc_key_t k = sample_key(), out;
    void *buf;
    size_t len;
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_OK);
    assert_int_equal(len, CIPC_KEY_FIXED_LEN + strlen(k.host_id));
    char why[96];
    assert_int_equal(cipc_key_decode(buf, len, &out, why, sizeof(why)), PDX_OK);
    assert_memory_equal(&k, &out, sizeof(k));
    free(buf);

    /* VMM kind carries the fd; a HOST key has no device. */
    k.kind = CIPC_KIND_VMM_FD;
    k.fd = 17;
    memset(k.handle, 0, sizeof(k.handle));
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_OK);
    assert_int_equal(cipc_key_decode(buf, len, &out, why, sizeof(why)), PDX_OK);
    assert_int_equal(out.kind, CIPC_KIND_VMM_FD);
    assert_int_equal(out.fd, 17);
    free(buf);
}

static void test_key_layout_is_little_endian(void **state)
{
    cipc_key_t k = sample_key();
    void *buf;
    size_t len;
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_OK);
    const uint8_t *b = buf;
    assert_memory_equal(b, "PDCK", 4);
    assert_int_equal(b[4], 1); /* version */
    assert_int_equal(b[5], 0);
    assert_int_equal(b[6], CIPC_KIND_LEGACY);
    assert_int_equal(b[24], 4242 & 0xff); /* pid */
    assert_int_equal(b[25], 4242 >> 8);
    assert_int_equal(b[28], 0xff);     /* fd -1 */
    assert_int_equal(b[32 + 5], 0x7f); /* base 0x7f0000000000 */
    assert_int_equal(b[40 + 3], 0x40); /* alloc size 1 GiB */
    assert_memory_equal(b + 64, k.handle, CIPC_HANDLE_LEN);
    assert_int_equal(b[128], strlen(k.host_id));
    assert_memory_equal(b + 130, k.host_id, strlen(k.host_id));
    free(buf);
}

static void test_key_truncated_rejected(void **state)
{
    cipc_key_t k = sample_key(), out;
    void *buf;
    size_t len;
    char why[96];
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_OK);
    for (size_t n = 0; n < len; n++) {
        /* A fresh copy of exactly n bytes, so a read past it is caught by
         * sanitizers too. */
        uint8_t *c = malloc(n ? n : 1);
        memcpy(c, buf, n);
        assert_int_equal(cipc_key_decode(c, n, &out, why, sizeof(why)),
                         PDX_ERR_CORRUPT);
        assert_true(why[0] != '\0');
        free(c);
    }
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0;
    assert_int_equal(cipc_key_decode(longer, len + 1, &out, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    assert_non_null(strstr(why, "trailing"));
    assert_int_equal(cipc_key_decode(NULL, 0, &out, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    free(longer);
    free(buf);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static void test_key_corrupt_rejected(void **state)
{
    cipc_key_t k = sample_key(), out;
    void *buf;
    size_t len;
    char why[96];
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_OK);
    uint8_t *c = malloc(len);

    struct {
        size_t off;
        int kind; /* 16: u16, 64: u64, 8: byte */
        uint64_t v;
        pdx_status_t want;
        const char *why;
    } cases[] = {
        {0, 8, 'X', PDX_ERR_CORRUPT, "magic"},
        {4, 16, 2, PDX_ERR_VERSION, "version"},
        {4, 16, 0, PDX_ERR_VERSION, "version"},
        {6, 16, 3, PDX_ERR_CORRUPT, "kind"},
        {56, 64, 0, PDX_ERR_CORRUPT, "bounds"},          /* len 0 */
        {48, 64, 1ull << 31, PDX_ERR_CORRUPT, "bounds"}, /* offset > size */
        {56, 64, 1ull << 30, PDX_ERR_CORRUPT, "bounds"}, /* off+len > size */
        {32, 64, UINT64_MAX - 10, PDX_ERR_CORRUPT, "bounds"}, /* wraps */
        {128, 16, 0, PDX_ERR_CORRUPT, "host id"},
        {128, 16, 300, PDX_ERR_CORRUPT, "host id"},
        {128, 16, 3, PDX_ERR_CORRUPT, "trailing"},
        {131, 8, 0, PDX_ERR_CORRUPT, "NUL"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(c, buf, len);
        if (cases[i].kind == 8) {
            c[cases[i].off] = (uint8_t)cases[i].v;
        } else if (cases[i].kind == 16) {
            put16(c + cases[i].off, (uint16_t)cases[i].v);
        } else {
            put64(c + cases[i].off, cases[i].v);
        }
        why[0] = '\0';
        pdx_status_t st = cipc_key_decode(c, len, &out, why, sizeof(why));
        if (st != cases[i].want || strstr(why, cases[i].why) == NULL) {
            fail_msg("case %zu: status %d why '%s', want %d '%s'", i, st, why,
                     cases[i].want, cases[i].why);
        }
    }
    /* A VMM key must carry an fd. */
    k.kind = CIPC_KIND_VMM_FD;
    k.fd = -1;
    void *b2;
    size_t l2;
    assert_int_equal(cipc_key_encode(&k, &b2, &l2), PDX_OK);
    assert_int_equal(cipc_key_decode(b2, l2, &out, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    free(b2);
    /* Flipping any byte never crashes and never yields a key that breaks
     * the invariants decode promises. */
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            memcpy(c, buf, len);
            c[i] ^= (uint8_t)(1u << bit);
            if (cipc_key_decode(c, len, &out, why, sizeof(why)) == PDX_OK) {
                assert_true(out.kind <= CIPC_KIND_VMM_FD);
                assert_true(out.len > 0 &&
                            out.offset + out.len <= out.alloc_size);
                assert_int_equal(strlen(out.host_id) + CIPC_KEY_FIXED_LEN, len);
            }
        }
    }
    free(c);
    free(buf);
}

static void test_key_encode_rejects_bad_input(void **state)
{
    cipc_key_t k = sample_key();
    void *buf = NULL;
    size_t len;
    k.host_id[0] = '\0';
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_ERR_INVALID);
    k = sample_key();
    k.kind = 7;
    assert_int_equal(cipc_key_encode(&k, &buf, &len), PDX_ERR_INVALID);
    assert_null(buf);
}

static void test_conn_round_trip_and_rejects(void **state)
{
    cipc_conn_t *c = calloc(1, sizeof(*c)), *out = calloc(1, sizeof(*out));
    snprintf(c->host_id, sizeof(c->host_id), "5f1c7a2e-boot");
    c->pid = 99;
    c->token = 0x0123456789abcdefull;
    c->ndev = 3;
    for (int i = 0; i < 3; i++) {
        uuid_of(i + 4, c->uuid[i]);
    }
    void *buf;
    size_t len;
    char why[96];
    assert_int_equal(cipc_conn_encode(c, &buf, &len), PDX_OK);
    assert_int_equal(len, 22 + strlen(c->host_id) + 3 * 16);
    assert_int_equal(cipc_conn_decode(buf, len, out, why, sizeof(why)), PDX_OK);
    assert_memory_equal(c, out, sizeof(*c));

    for (size_t n = 0; n < len; n++) {
        uint8_t *t = malloc(n ? n : 1);
        memcpy(t, buf, n);
        assert_int_equal(cipc_conn_decode(t, n, out, why, sizeof(why)),
                         PDX_ERR_CORRUPT);
        free(t);
    }
    uint8_t *t = malloc(len);
    memcpy(t, buf, len);
    t[4] = 9; /* version */
    assert_int_equal(cipc_conn_decode(t, len, out, why, sizeof(why)),
                     PDX_ERR_VERSION);
    memcpy(t, buf, len);
    t[1] ^= 1; /* magic */
    assert_int_equal(cipc_conn_decode(t, len, out, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    memcpy(t, buf, len);
    put16(t + 6, CIPC_MAX_DEVICES + 1); /* ndev */
    assert_int_equal(cipc_conn_decode(t, len, out, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    memcpy(t, buf, len);
    put16(t + 6, 2); /* fewer devices than bytes: trailing */
    assert_int_equal(cipc_conn_decode(t, len, out, why, sizeof(why)),
                     PDX_ERR_CORRUPT);
    assert_non_null(strstr(why, "trailing"));
    free(t);
    free(buf);

    c->ndev = CIPC_MAX_DEVICES + 1;
    assert_int_equal(cipc_conn_encode(c, &buf, &len), PDX_ERR_INVALID);
    c->ndev = 0;
    memset(c->host_id, 'h', sizeof(c->host_id)); /* unterminated, too long */
    c->host_id[CIPC_HOST_ID_MAX] = 'x';
    assert_int_equal(cipc_conn_encode(c, &buf, &len), PDX_ERR_INVALID);
    free(c);
    free(out);
}

/* What the driver does with CUDA_VISIBLE_DEVICES: ordinal i of a process
 * is physical device visible[i]. */
static size_t visible_uuids(const char *cvd, uint8_t (*out)[16], size_t max)
{
    size_t n = 0;
    for (const char *p = cvd; *p != '\0' && n < max;) {
        char *end;
        long phys = strtol(p, &end, 10);
        uuid_of((int)phys, out[n++]);
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void test_uuid_to_ordinal_shuffled(void **state)
{
    uint8_t p_devs[8][16], d_devs[8][16], u[16];
    /* P sees all eight GPUs in order; D is started with a shuffled subset. */
    size_t np = visible_uuids("0,1,2,3,4,5,6,7", p_devs, 8);
    size_t nd = visible_uuids("6,2,7,0", d_devs, 8);
    assert_int_equal(np, 8);
    assert_int_equal(nd, 4);
    /* P's ordinal -> D's ordinal, through the UUID. */
    int want[8] = {3, -1, 1, -1, -1, -1, 0, 2};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(
            cipc_uuid_to_ordinal((const uint8_t(*)[16])d_devs, nd, p_devs[i]),
            want[i]);
    }
    /* and back */
    for (size_t i = 0; i < nd; i++) {
        int o =
            cipc_uuid_to_ordinal((const uint8_t(*)[16])p_devs, np, d_devs[i]);
        assert_memory_equal(p_devs[o], d_devs[i], 16);
    }
    uuid_of(42, u);
    assert_int_equal(cipc_uuid_to_ordinal((const uint8_t(*)[16])d_devs, nd, u),
                     -1);
    assert_int_equal(
        cipc_uuid_to_ordinal((const uint8_t(*)[16])d_devs, 0, d_devs[0]), -1);
}

static void test_uuid_format(void **state)
{
    uint8_t u[16];
    for (int i = 0; i < 16; i++) {
        u[i] = (uint8_t)(0x10 * (i & 15) + i);
    }
    char buf[48];
    cipc_uuid_format(u, buf, sizeof(buf));
    assert_string_equal(buf, "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

static void test_same_host(void **state)
{
    assert_true(cipc_same_host("boot-a", "boot-a"));
    assert_false(cipc_same_host("boot-a", "boot-b"));
    assert_false(cipc_same_host("boot-a", "boot-a2"));
    assert_false(cipc_same_host("", ""));
    assert_false(cipc_same_host(NULL, "boot-a"));
    assert_false(cipc_same_host("boot-a", NULL));
}

#define MD(x) ((void *)(uintptr_t)(x))

static void test_iov_merge(void **state)
{
    pdx_backend_iov_t in[] = {
        {0x1000, 0x9000, 0x100, MD(1), MD(2)},
        {0x1100, 0x9100, 0x100, MD(1), MD(2)}, /* contiguous: merged */
        {0x1200, 0x9200, 0, MD(1), MD(2)},     /* empty: skipped */
        {0x1200, 0x9200, 0x80, MD(1), MD(2)},  /* merged */
        {0x1280, 0x9300, 0x80, MD(1), MD(2)},  /* remote gap */
        {0x1400, 0x9380, 0x80, MD(1), MD(2)},  /* local gap */
        {0x1480, 0x9400, 0x80, MD(3), MD(2)},  /* other local region */
        {0x1500, 0x9480, 0x80, MD(3), MD(4)},  /* other remote region */
        {0x1580, 0x9500, 0x80, MD(3), MD(4)},  /* merged */
        {0x0, 0x0, 0, MD(3), MD(4)},           /* trailing empty */
    };
    size_t n = sizeof(in) / sizeof(in[0]);
    pdx_backend_iov_t out[10];
    size_t k = cipc_iov_merge(in, n, out);
    assert_int_equal(k, 5);
    assert_int_equal(out[0].local_addr, 0x1000);
    assert_int_equal(out[0].len, 0x280);
    assert_int_equal(out[1].local_addr, 0x1280);
    assert_int_equal(out[1].remote_addr, 0x9300);
    assert_int_equal(out[2].local_addr, 0x1400);
    assert_int_equal(out[3].local_md, MD(3));
    assert_int_equal(out[3].len, 0x80);
    assert_int_equal(out[4].remote_md, MD(4));
    assert_int_equal(out[4].len, 0x100);

    /* In place gives the same. */
    k = cipc_iov_merge(in, n, in);
    assert_int_equal(k, 5);
    assert_memory_equal(in, out, k * sizeof(out[0]));

    /* Nothing, or only empties. */
    assert_int_equal(cipc_iov_merge(NULL, 0, out), 0);
    pdx_backend_iov_t empty = {1, 2, 0, MD(1), MD(1)};
    assert_int_equal(cipc_iov_merge(&empty, 1, out), 0);

    /* A sum that would wrap is not merged. */
    pdx_backend_iov_t big[2] = {
        {0, 0, UINT64_MAX - 1, MD(1), MD(1)},
        {UINT64_MAX - 1, UINT64_MAX - 1, 4, MD(1), MD(1)},
    };
    assert_int_equal(cipc_iov_merge(big, 2, out), 2);
}

static void test_iov_merge_many(void **state)
{
    /* 100000 blocks of 8448 B: contiguous locally, reversed remotely, with
     * every 1000th pair contiguous on both sides. */
    size_t n = 100000, blk = 8448;
    pdx_backend_iov_t *v = malloc(n * sizeof(*v));
    for (size_t i = 0; i < n; i++) {
        v[i].local_addr = 0x100000 + i * blk;
        v[i].remote_addr = 0x80000000ull + (n - i) * blk * 2;
        v[i].len = blk;
        v[i].local_md = MD(1);
        v[i].remote_md = MD(2);
    }
    for (size_t i = 1; i < n; i += 1000) {
        v[i].remote_addr = v[i - 1].remote_addr + blk;
    }
    size_t k = cipc_iov_merge(v, n, v);
    assert_int_equal(k, n - n / 1000);
    free(v);
}

static void test_cu_status_translation(void **state)
{
    assert_int_equal(cu_status(CUDA_SUCCESS), PDX_OK);
    assert_int_equal(cu_status(CUDA_ERROR_NOT_READY), PDX_INPROGRESS);
    assert_int_equal(cu_status(CUDA_ERROR_OUT_OF_MEMORY), PDX_ERR_NOMEM);
    assert_int_equal(cu_status(CUDA_ERROR_INVALID_VALUE), PDX_ERR_INVALID);
    assert_int_equal(cu_status(CUDA_ERROR_NO_DEVICE), PDX_ERR_UNAVAILABLE);
    assert_int_equal(cu_status(CUDA_ERROR_NOT_SUPPORTED), PDX_ERR_UNSUPPORTED);
    assert_int_equal(cu_status(CUDA_ERROR_ILLEGAL_ADDRESS), PDX_ERR_BACKEND);
    assert_string_equal(cu_err_name(NULL, CUDA_ERROR_INVALID_VALUE),
                        "CUDA_ERROR_UNKNOWN_CODE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_round_trip),
        cmocka_unit_test(test_key_layout_is_little_endian),
        cmocka_unit_test(test_key_truncated_rejected),
        cmocka_unit_test(test_key_corrupt_rejected),
        cmocka_unit_test(test_key_encode_rejects_bad_input),
        cmocka_unit_test(test_conn_round_trip_and_rejects),
        cmocka_unit_test(test_uuid_to_ordinal_shuffled),
        cmocka_unit_test(test_uuid_format),
        cmocka_unit_test(test_same_host),
        cmocka_unit_test(test_iov_merge),
        cmocka_unit_test(test_iov_merge_many),
        cmocka_unit_test(test_cu_status_translation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
