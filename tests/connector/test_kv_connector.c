/* Connector tests: a P and a D node (two agents over UCX shared memory)
 * hand off a GLM-5.2-shaped 8K-token request byte-exact; leases expire or
 * end on done/reject; invariant mismatches are refused with the field
 * named; the MultiConnector routes lookups to the first child that hits;
 * layer by layer: a push while P saves each layer, a layered READ. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <pdx/blob.h>
#include <pdx/kv_connector.h>
#include <pdx/log.h>
#include "kv_freed.h"
#include "poll_until.h"

#define NBLOCKS 160

typedef struct node {
    pdx_kv_connector_h conn;
    pdx_layout_h layout;
    void *mem;
} node_t;

static char g_last_error[512];

static void capture(void *arg, pdx_log_level_t lvl, const char *msg)
{
    if (lvl == PDX_LOG_ERROR && strstr(msg, "mismatch") != NULL) {
        snprintf(g_last_error, sizeof(g_last_error), "%s", msg);
    }
}

static void base_config(pdx_kv_config_t *c, const char *name, const char *peer,
                        const char *seed)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->model_id, sizeof(c->model_id), "zai-org/GLM-5.2-FP8");
    snprintf(c->agent_name, sizeof(c->agent_name), "%s", name);
    snprintf(c->peer_name, sizeof(c->peer_name), "%s", peer);
    snprintf(c->kv_dtype, sizeof(c->kv_dtype), "fp8_ds_mla");
    snprintf(c->hash_algo, sizeof(c->hash_algo), "xxhash_cbor");
    snprintf(c->hash_seed, sizeof(c->hash_seed), "%s", seed);
    c->role = PDX_KV_ROLE_BOTH;
    c->block_tokens = 64;
    c->num_blocks = NBLOCKS;
    c->nchildren = 2;
    c->children[0] = (pdx_kv_child_config_t){
        .type = PDX_KV_CHILD_REMOTE, .lease_ms = 30000, .heartbeat_ms = 100,
        .failure_policy = PDX_KV_FAIL_RECOMPUTE, .load_tail = true};
    c->children[1] = (pdx_kv_child_config_t){
        .type = PDX_KV_CHILD_OFFLOAD, .mode = PDX_KV_OFFLOAD_READ_WRITE,
        .budget_bytes = 48ull * 3502592, .ranks_per_host = 1,
        .wait_for_full_prefix = true, .wait_timeout_ms = 2000,
        .save_tail = true};
    snprintf(c->backends[0], sizeof(c->backends[0]), "ucx");
    c->nbackends = 1;
    snprintf(c->opt_buf[0][0], 64, "tls");
    snprintf(c->opt_buf[0][1], 64, "sm");
    c->nbackend_opts = 1;
}

static pdx_status_t node_init(node_t *n, const pdx_kv_config_t *cfg,
                              pdx_layout_h layout)
{
    n->layout = layout;
    uint64_t size = pdx_layout_carve_size(layout, 4096);
    assert_int_equal(posix_memalign(&n->mem, 4096, size), 0);
    memset(n->mem, 0, size);
    assert_int_equal(pdx_layout_carve(layout, (uintptr_t)n->mem, size, 4096,
                                      0), PDX_OK);
    pdx_kv_connector_params_t p = {
        .field_mask = PDX_KV_PARAM_CONFIG | PDX_KV_PARAM_LAYOUT,
        .config = cfg, .layout = layout};
    return pdx_kv_connector_create(&p, &n->conn);
}

static void node_glm_n(node_t *n, const pdx_kv_config_t *cfg,
                       uint64_t nblocks)
{
    pdx_layout_h l;
    assert_int_equal(pdx_layout_glm52(nblocks, PDX_MEM_DRAM, 0, &l), PDX_OK);
    assert_int_equal(node_init(n, cfg, l), PDX_OK);
}

static void node_glm(node_t *n, const pdx_kv_config_t *cfg)
{
    node_glm_n(n, cfg, NBLOCKS);
}

static void node_fini(node_t *n)
{
    pdx_kv_connector_destroy(n->conn);
    pdx_layout_destroy(n->layout);
    free(n->mem);
}

static pdx_status_t connect_both(node_t *a, node_t *b)
{
    void *blob;
    size_t len;
    pdx_status_t st;
    assert_int_equal(pdx_kv_connector_describe(b->conn, &blob, &len), PDX_OK);
    st = pdx_kv_connector_connect(a->conn, blob, len, NULL);
    pdx_blob_free(blob);
    if (st != PDX_OK) {
        return st;
    }
    assert_int_equal(pdx_kv_connector_describe(a->conn, &blob, &len), PDX_OK);
    st = pdx_kv_connector_connect(b->conn, blob, len, NULL);
    pdx_blob_free(blob);
    return st;
}

/* Stand-in KV: block `id` of every arena gets bytes from (seed, arena). */
static void fill_block(node_t *n, uint64_t id, uint64_t seed)
{
    size_t na = pdx_layout_num_arenas(n->layout);
    for (size_t a = 0; a < na; a++) {
        pdx_arena_t ar;
        pdx_layout_get_arena(n->layout, a, &ar);
        uint64_t *p = (uint64_t *)(uintptr_t)(ar.base + id * ar.stride);
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + a + 1;
        for (size_t i = 0; i < (size_t)ar.bytes_per_token * ar.block_tokens / 8;
             i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[i] = x;
        }
    }
}

static int same_block(node_t *a, uint64_t ida, node_t *b, uint64_t idb)
{
    size_t na = pdx_layout_num_arenas(a->layout);
    for (size_t i = 0; i < na; i++) {
        pdx_arena_t x, y;
        pdx_layout_get_arena(a->layout, i, &x);
        pdx_layout_get_arena(b->layout, i, &y);
        if (memcmp((void *)(uintptr_t)(x.base + ida * x.stride),
                   (void *)(uintptr_t)(y.base + idb * y.stride),
                   (size_t)x.bytes_per_token * x.block_tokens) != 0) {
            return 0;
        }
    }
    return 1;
}

static void make_tokens(uint64_t *t, size_t n, uint64_t salt)
{
    for (size_t i = 0; i < n; i++) {
        t[i] = (i * 2654435761u + salt) % 151552;
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_handoff_8k(void **state)
{
    pdx_kv_config_t cp, cd;
    base_config(&cp, "t-p", "t-d", "0");
    base_config(&cd, "t-d", "t-p", "0");
    node_t p, d;
    node_glm(&p, &cp);
    node_glm(&d, &cd);
    assert_int_equal(connect_both(&p, &d), PDX_OK);

    enum { NT = 8200 }; /* 128 full blocks and an 8-token tail */
    uint64_t *tok = malloc(NT * sizeof(*tok));
    make_tokens(tok, NT, 1);
    pdx_block_hash_t hs[NT / 64], tail;
    size_t nb;
    int has_tail;
    assert_int_equal(pdx_hasher_hash_blocks(pdx_kv_connector_hasher(p.conn),
                                            tok, NT, NULL, hs, NT / 64, &nb,
                                            &tail, &has_tail), PDX_OK);
    assert_int_equal(nb, 128);
    assert_true(has_tail);
    uint64_t pids[129], dids[129];
    for (uint64_t i = 0; i < 129; i++) {
        pids[i] = i;
        dids[i] = 20 + i; /* other ids on D: merging must still pair them */
        fill_block(&p, pids[i], 1000 + i);
    }
    pdx_kv_request_t req = {.req_id = "req-8k", .hashes = hs, .nfull = nb,
                            .has_tail = true, .tail_hash = tail,
                            .tail_tokens = NT % 64, .prompt_tokens = NT};
    char *params = NULL;
    assert_int_equal(pdx_kv_request_finished(p.conn, &req, pids, NT,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    assert_int_equal(pdx_kv_held_requests(p.conn), 1);
    /* The offload child's part is merged into the remote child's. */
    assert_non_null(strstr(params, "\"offload_blocks\":0"));

    pdx_kv_request_t dreq = req;
    dreq.req_id = "d-8k";
    dreq.params = params;
    pdx_kv_match_t m;
    assert_int_equal(pdx_kv_lookup(d.conn, &dreq, &m), PDX_OK);
    assert_int_equal(m.source, PDX_KV_SOURCE_REMOTE);
    assert_int_equal(m.blocks, 128);
    assert_true(m.tail);
    assert_int_equal(m.tokens, NT - 1); /* the last token is recomputed */
    assert_int_equal(pdx_kv_load(d.conn, &dreq, &m, dids), PDX_OK);
    size_t tokens = 0;
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        st = pdx_kv_load_check(d.conn, "d-8k", &tokens);
        pdx_kv_progress(d.conn);
        pdx_kv_progress(p.conn);
    }
    assert_int_equal(st, PDX_OK);
    assert_int_equal(tokens, NT - 1);
    for (uint64_t i = 0; i < 129; i++) {
        assert_true(same_block(&p, pids[i], &d, dids[i]));
    }
    /* D's done notification frees P's blocks at once. */
    kv_freed_t f = {0};
    for (int i = 0; i < 20000 && f.n == 0; i++) {
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.n, 1);
    assert_int_equal(f.why, PDX_KV_FREED_DONE);
    assert_int_equal(pdx_kv_held_requests(p.conn), 0);

    /* D saves what it has (decode-produced blocks would join these; the
     * pool holds 48) and hands them back from its pool: P reads them
     * (D-to-P reuse). */
    pdx_kv_request_t dr = dreq;
    dr.nfull = 40;
    dr.has_tail = false;
    assert_int_equal(pdx_kv_save(d.conn, &dr, dids), PDX_OK);
    for (int i = 0; i < 20000 && pdx_kv_save_check(d.conn, "d-8k") ==
                                     PDX_INPROGRESS; i++) {
        sleep_ms(1);
    }
    assert_int_equal(pdx_kv_save_check(d.conn, "d-8k"), PDX_OK);
    char *back = NULL;
    assert_int_equal(pdx_kv_request_finished(d.conn, &dr, NULL, 40 * 64,
                                             PDX_KV_FROM_POOL, &back),
                     PDX_OK);
    pdx_kv_request_t t2 = req;
    t2.req_id = "turn2";
    t2.params = back;
    t2.prompt_tokens = NT + 100;
    assert_int_equal(pdx_kv_lookup(p.conn, &t2, &m), PDX_OK);
    assert_int_equal(m.source, PDX_KV_SOURCE_REMOTE);
    assert_int_equal(m.blocks, 40);
    uint64_t p2[40];
    for (int i = 0; i < 40; i++) {
        p2[i] = 129 + (uint64_t)(i < 31 ? i : i - 31);
    }
    pdx_kv_match_t m1 = m;
    m1.blocks = 31;
    assert_int_equal(pdx_kv_load(p.conn, &t2, &m1, p2), PDX_OK);
    st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        st = pdx_kv_load_check(p.conn, "turn2", &tokens);
        pdx_kv_progress(d.conn);
    }
    assert_int_equal(st, PDX_OK);
    for (uint64_t i = 0; i < 31; i++) {
        if (!same_block(&p, pids[i], &p, 129 + i)) {
            fail_msg("turn-2 block %llu differs", (unsigned long long)i);
        }
    }
    f.n = 0;
    for (int i = 0; i < 20000 && f.n == 0; i++) {
        pdx_kv_progress(d.conn);
        pdx_kv_poll_freed(d.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.why, PDX_KV_FREED_DONE);
    pdx_kv_free(back);
    pdx_kv_free(params);
    free(tok);
    node_fini(&d);
    node_fini(&p);
}

static void test_lease_expiry_and_reject(void **state)
{
    pdx_kv_config_t cp, cd;
    base_config(&cp, "l-p", "l-d", "0");
    base_config(&cd, "l-d", "l-p", "0");
    cp.children[0].lease_ms = 150;
    cp.children[1].budget_bytes = 2ull * 3502592;
    cd.children[1].budget_bytes = 2ull * 3502592;
    node_t p, d;
    node_glm_n(&p, &cp, 16);
    node_glm_n(&d, &cd, 16);
    assert_int_equal(connect_both(&p, &d), PDX_OK);
    uint64_t tok[256], ids[4] = {0, 1, 2, 3};
    make_tokens(tok, 256, 7);
    pdx_block_hash_t hs[4];
    size_t nb;
    pdx_hasher_hash_blocks(pdx_kv_connector_hasher(p.conn), tok, 256, NULL,
                           hs, 4, &nb, NULL, NULL);
    pdx_kv_request_t req = {.req_id = "never-read", .hashes = hs, .nfull = 4,
                            .prompt_tokens = 256};
    char *params;
    assert_int_equal(pdx_kv_request_finished(p.conn, &req, ids, 256,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    kv_freed_t f = {0};
    for (int i = 0; i < 3000 && f.n == 0; i++) { /* bounded: ~3 s */
        sleep_ms(1);
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.n, 1);
    assert_int_equal(f.why, PDX_KV_FREED_EXPIRED);
    pdx_kv_free(params);

    /* A reject frees at once. */
    cp.children[0].lease_ms = 30000;
    req.req_id = "rejected";
    assert_int_equal(pdx_kv_request_finished(p.conn, &req, ids, 256,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    assert_int_equal(pdx_kv_reject(d.conn, params), PDX_OK);
    f.n = 0;
    for (int i = 0; i < 3000 && f.n == 0; i++) {
        sleep_ms(1);
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.n, 1);
    assert_int_equal(f.why, PDX_KV_FREED_REJECT);
    pdx_kv_free(params);

    /* A load aborted while in flight: D's blocks are its own again and P
     * frees at once. */
    req.req_id = "aborted";
    assert_int_equal(pdx_kv_request_finished(p.conn, &req, ids, 256,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    pdx_kv_request_t dr = req;
    dr.req_id = "d-aborted";
    dr.params = params;
    pdx_kv_match_t m;
    assert_int_equal(pdx_kv_lookup(d.conn, &dr, &m), PDX_OK);
    assert_int_equal(m.blocks, 4);
    uint64_t dids[4] = {8, 9, 10, 11};
    assert_int_equal(pdx_kv_load(d.conn, &dr, &m, dids), PDX_OK);
    assert_int_equal(pdx_kv_load_abort(d.conn, "d-aborted"), PDX_OK);
    assert_int_equal(pdx_kv_load_abort(d.conn, "d-aborted"),
                     PDX_ERR_NOT_FOUND); /* already aborting */
    size_t tokens = 0;
    pdx_status_t ast = PDX_INPROGRESS;
    PDX_POLL_UNTIL(ast == PDX_INPROGRESS, 30000) {
        ast = pdx_kv_load_check(d.conn, "d-aborted", &tokens);
    }
    /* Cancelled, or it had finished first: either way final now. */
    assert_true(ast == PDX_ERR_CANCELED || ast == PDX_OK);
    assert_int_equal(pdx_kv_load_check(d.conn, "d-aborted", &tokens),
                     PDX_ERR_NOT_FOUND);
    f.n = 0;
    for (int i = 0; i < 3000 && f.n == 0; i++) {
        sleep_ms(1);
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.n, 1);
    /* The READ may have finished before the abort (done) or not (reject);
     * either way P's blocks are free and nothing is held. */
    assert_true(f.why == PDX_KV_FREED_REJECT || f.why == PDX_KV_FREED_DONE);
    assert_int_equal(pdx_kv_held_requests(p.conn), 0);
    pdx_kv_free(params);
    node_fini(&d);
    node_fini(&p);
}

/* Refused at connect, the log naming `field` and both values (`a` and
 * `b`, where the test knows them, else only that there are two). */
static void expect_refused(pdx_kv_config_t *cd, pdx_layout_h dl,
                           const char *field, const char *a, const char *b)
{
    /* Small nodes: only the invariants matter here. */
    pdx_kv_config_t cp;
    base_config(&cp, "m-p", "m-d", "0");
    cp.children[1].budget_bytes = 2ull * 3502592;
    cd->children[1].budget_bytes = 2ull * 3502592;
    node_t p, d;
    node_glm_n(&p, &cp, 4);
    if (dl != NULL) {
        assert_int_equal(node_init(&d, cd, dl), PDX_OK);
    } else {
        node_glm_n(&d, cd, 4);
    }
    g_last_error[0] = '\0';
    pdx_log_set_handler(capture, NULL);
    assert_int_equal(connect_both(&p, &d), PDX_ERR_MISMATCH);
    pdx_log_set_handler(NULL, NULL);
    assert_non_null(strstr(g_last_error, field));
    assert_non_null(strstr(g_last_error, "local "));
    assert_non_null(strstr(g_last_error, ", remote "));
    if (a != NULL) {
        assert_non_null(strstr(g_last_error, a));
        assert_non_null(strstr(g_last_error, b));
    }
    node_fini(&d);
    node_fini(&p);
}

static void test_mismatch_refused(void **state)
{
    pdx_kv_config_t cd;
    base_config(&cd, "m-d", "m-p", "42"); /* another seed */
    expect_refused(&cd, NULL, "none_hash", NULL, NULL);
    base_config(&cd, "m-d", "m-p", "0");
    snprintf(cd.hash_algo, sizeof(cd.hash_algo), "sha256_cbor");
    expect_refused(&cd, NULL, "hash_algo", "sha256_cbor", "xxhash_cbor");
    base_config(&cd, "m-d", "m-p", "0");
    snprintf(cd.kv_dtype, sizeof(cd.kv_dtype), "bf16");
    expect_refused(&cd, NULL, "kv_dtype", "bf16", "fp8_ds_mla");
    /* Another layout: one MLA arena of 640 B/token. */
    base_config(&cd, "m-d", "m-p", "0");
    pdx_layout_h l;
    assert_int_equal(pdx_layout_create(64, &l), PDX_OK);
    pdx_arena_t a = {.name = "layer0.mla", .kind = PDX_KV_KIND_MLA,
                     .bytes_per_token = 640, .block_tokens = 64,
                     .num_blocks = 8};
    assert_int_equal(pdx_layout_add_arena(l, &a, NULL), PDX_OK);
    expect_refused(&cd, l, "layout_fingerprint", NULL, NULL);
    /* Another block size. */
    base_config(&cd, "m-d", "m-p", "0");
    assert_int_equal(pdx_layout_create(32, &l), PDX_OK);
    a.block_tokens = 32;
    assert_int_equal(pdx_layout_add_arena(l, &a, NULL), PDX_OK);
    expect_refused(&cd, l, "block_size", "32", "64");
}

static void test_multi_routing(void **state)
{
    pdx_kv_config_t c;
    base_config(&c, "r-p", "r-d", "0");
    c.children[1].budget_bytes = 16ull * 3502592;
    node_t n;
    node_glm_n(&n, &c, 64);
    uint64_t tok[64 * 6 + 10];
    make_tokens(tok, 64 * 6 + 10, 3);
    pdx_block_hash_t hs[6], tail;
    size_t nb;
    int has_tail;
    pdx_hasher_hash_blocks(pdx_kv_connector_hasher(n.conn), tok, 64 * 6 + 10,
                           NULL, hs, 6, &nb, &tail, &has_tail);
    uint64_t ids[7] = {0, 1, 2, 3, 4, 5, 6}, to[7] = {50, 51, 52, 53, 54, 55, 56};
    for (int i = 0; i < 7; i++) {
        fill_block(&n, ids[i], 77 + (uint64_t)i);
    }
    pdx_kv_request_t r = {.req_id = "s", .hashes = hs, .nfull = 4,
                          .prompt_tokens = 64 * 6 + 10};
    pdx_kv_match_t m;
    /* Nothing saved yet: no hit anywhere. */
    assert_int_equal(pdx_kv_lookup(n.conn, &r, &m), PDX_OK);
    assert_int_equal(m.blocks, 0);
    /* Save 4 blocks; a lookup of 6 waits (wait_for_full_prefix) while the
     * saves are in flight, then reports the 4 present. */
    assert_int_equal(pdx_kv_save(n.conn, &r, ids), PDX_OK);
    r.nfull = 6;
    r.has_tail = true;
    r.tail_hash = tail;
    r.tail_tokens = 10;
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        st = pdx_kv_lookup(n.conn, &r, &m);
        if (st == PDX_INPROGRESS) {
            sleep_ms(1);
        }
    }
    assert_int_equal(st, PDX_OK);
    assert_int_equal(pdx_kv_save_check(n.conn, "s"), PDX_OK);
    assert_int_equal(m.source, PDX_KV_SOURCE_OFFLOAD);
    assert_int_equal(m.blocks, 4);
    assert_false(m.tail);
    /* Save all 6 and the tail: the whole prompt hits, tail included. */
    r.req_id = "s2";
    assert_int_equal(pdx_kv_save(n.conn, &r, ids), PDX_OK);
    for (int i = 0; i < 5000 && pdx_kv_save_check(n.conn, "s2") ==
                                    PDX_INPROGRESS; i++) {
        sleep_ms(1);
    }
    assert_int_equal(pdx_kv_lookup(n.conn, &r, &m), PDX_OK);
    assert_int_equal(m.blocks, 6);
    assert_true(m.tail);
    assert_int_equal(m.tokens, 64 * 6 + 9);
    /* Restore into other blocks byte-exact (pure-L2 path). */
    r.req_id = "s3";
    assert_int_equal(pdx_kv_load(n.conn, &r, &m, to), PDX_OK);
    size_t tokens;
    assert_int_equal(pdx_kv_load_check(n.conn, "s3", &tokens), PDX_OK);
    assert_int_equal(tokens, 64 * 6 + 9);
    for (int i = 0; i < 7; i++) {
        assert_true(same_block(&n, ids[i], &n, to[i]));
    }
    /* Bad handoff parameters are ignored by the remote child (offload
     * still answers) and refused by reject. */
    r.params = "{\"agent\": 5}";
    assert_int_equal(pdx_kv_lookup(n.conn, &r, &m), PDX_OK);
    assert_int_equal(m.source, PDX_KV_SOURCE_OFFLOAD);
    assert_int_equal(pdx_kv_reject(n.conn, "not json"), PDX_ERR_CORRUPT);
    node_fini(&n);
}

static void test_params_merge(void **state)
{
    char *out = NULL;
    assert_int_equal(pdx_kv_params_merge("{\"agent\":\"p\",\"tokens\":5}",
                                         "{\"offload_blocks\":3}", &out),
                     PDX_OK);
    assert_string_equal(out,
                        "{\"agent\":\"p\",\"tokens\":5,\"offload_blocks\":3}");
    pdx_kv_free(out);
    out = NULL;
    assert_int_equal(pdx_kv_params_merge("{\"tokens\":5}", "{\"tokens\":6}",
                                         &out),
                     PDX_ERR_EXISTS);
    assert_null(out);
    assert_int_equal(pdx_kv_params_merge("[1]", "{}", &out), PDX_ERR_INVALID);
    assert_int_equal(pdx_kv_params_merge("{", "{}", &out), PDX_ERR_CORRUPT);
}

/* An arena handoff names the holder's memory: GPU memory with a device
 * per arena (the reader's remote list is then VRAM on those devices); host
 * memory when absent. Anything else is refused. */
static void test_params_memory(void **state)
{
    (void)state;
#define ARENA_PARAMS(extra)                                                  \
    "{\"agent\":\"p\",\"req\":\"r1\",\"source\":\"arena\",\"tokens\":64,"       \
    "\"hashes\":[\"0a8577df5ee3430515a8cc1f6e3ac52e\"],\"ids\":[\"0\"],"        \
    "\"bases\":[\"4096\",\"8192\"],\"strides\":[\"64\",\"64\"]" extra "}"
    static const char *const good[] = {
        ARENA_PARAMS(""),
        ARENA_PARAMS(",\"memory\":\"dram\""),
        ARENA_PARAMS(",\"memory\":\"vram\",\"devices\":[\"0\",\"1\"]"),
        ARENA_PARAMS(",\"memory\":\"vram\",\"devices\":[\"1023\",\"7\"]"),
    };
    static const char *const bad[] = {
        ARENA_PARAMS(",\"memory\":\"hbm\""),
        ARENA_PARAMS(",\"memory\":1"),
        ARENA_PARAMS(",\"memory\":\"vram\""),
        ARENA_PARAMS(",\"memory\":\"vram\",\"devices\":[\"0\"]"),
        ARENA_PARAMS(",\"memory\":\"vram\",\"devices\":[\"0\",\"1024\"]"),
        ARENA_PARAMS(",\"memory\":\"vram\",\"devices\":[\"0\",\"-1\"]"),
        ARENA_PARAMS(",\"memory\":\"vram\",\"devices\":[0,1]"),
    };
#undef ARENA_PARAMS
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        assert_int_equal(pdx_kv_params_check(good[i], strlen(good[i]), 2),
                         PDX_OK);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(pdx_kv_params_check(bad[i], strlen(bad[i]), 2),
                         PDX_ERR_CORRUPT);
    }
}

/* Hashes of `nt` tokens of salt `salt` on node n: the full blocks, the
 * tail; the request names them. */
static void layer_request(node_t *n, uint64_t *tok, size_t nt, uint64_t salt,
                          pdx_block_hash_t *hs, pdx_kv_request_t *r,
                          const char *id)
{
    size_t nb;
    int has_tail;
    pdx_block_hash_t tail;
    make_tokens(tok, nt, salt);
    assert_int_equal(pdx_hasher_hash_blocks(pdx_kv_connector_hasher(n->conn),
                                            tok, nt, NULL, hs, nt / 64, &nb,
                                            &tail, &has_tail),
                     PDX_OK);
    *r = (pdx_kv_request_t){.req_id = id, .hashes = hs, .nfull = nb,
                            .has_tail = has_tail != 0, .tail_hash = tail,
                            .tail_tokens = (uint32_t)(nt % 64),
                            .prompt_tokens = nt};
}

/* P saves a 1,000-token request (15 full blocks and a 40-token tail) layer
 * by layer in two steps; D, which asked for it before P started, sees each
 * layer land in order while P has later layers to go, then the end; the
 * blocks are byte-exact; P's handoff made after the push is freed at once
 * (done); P's pool holds the blocks, filled layer by layer. */
static void test_layerwise_push(void **state)
{
    pdx_kv_config_t cp, cd;
    base_config(&cp, "w-p", "w-d", "0");
    base_config(&cd, "w-d", "w-p", "0");
    node_t p, d;
    node_glm(&p, &cp);
    node_glm(&d, &cd);
    assert_int_equal(connect_both(&p, &d), PDX_OK);
    enum { NT = 1000, NB = 16 };
    uint64_t tok[NT], pids[NB], dids[NB];
    pdx_block_hash_t hs[NT / 64];
    pdx_kv_request_t req;
    layer_request(&p, tok, NT, 7, hs, &req, "p-push");
    for (uint64_t i = 0; i < NB; i++) {
        pids[i] = 3 + i;
        dids[i] = 40 + 2 * i; /* not contiguous on D */
        fill_block(&p, pids[i], 500 + i);
    }
    pdx_kv_push_expect_t e = {
        .field_mask = PDX_KV_PUSH_HOLDER | PDX_KV_PUSH_HOLDER_REQ |
                      PDX_KV_PUSH_NBLOCKS | PDX_KV_PUSH_TOKENS,
        .holder = "w-p", .holder_req = "p-push", .nblocks = NB,
        .tokens = NT - 1};
    assert_int_equal(pdx_kv_push_expect(d.conn, "d-push", &e, dids), PDX_OK);
    uint32_t layers[80];
    size_t nl = 0;
    for (size_t a = 0; a < pdx_layout_num_arenas(p.layout); a++) {
        pdx_arena_t ar;
        pdx_layout_get_arena(p.layout, a, &ar);
        if (nl == 0 || layers[nl - 1] != ar.layer) {
            layers[nl++] = ar.layer;
        }
    }
    assert_int_equal(nl, 79);
    /* Step 1: tokens [0, 600) (blocks 0..9, the last partial); step 2:
     * [600, 1000) (blocks 9..15). */
    size_t steps[2][3] = {{0, 10, 600}, {9, 7, 1000}};
    for (int s = 0; s < 2; s++) {
        for (size_t l = 0; l < nl; l++) {
            pdx_kv_layer_save_t ls = {
                .field_mask = PDX_KV_LAYER_SAVE_LAYER |
                              PDX_KV_LAYER_SAVE_NBLOCKS |
                              PDX_KV_LAYER_SAVE_TOKENS |
                              PDX_KV_LAYER_SAVE_FIRST_BLOCK |
                              PDX_KV_LAYER_SAVE_LAST,
                .layer = layers[l], .first_block = steps[s][0],
                .nblocks = steps[s][1], .tokens = steps[s][2],
                .last = s == 1};
            assert_int_equal(pdx_kv_save_layer(p.conn, &req, &ls,
                                               pids + steps[s][0]),
                             PDX_OK);
            pdx_kv_progress(p.conn);
            pdx_kv_progress(d.conn);
            if (s == 1 && l == 2) {
                /* Layer 0 of the last step lands while P computes on. */
                pdx_status_t st = PDX_INPROGRESS;
                PDX_POLL_UNTIL(st == PDX_INPROGRESS, 20000) {
                    pdx_kv_progress(p.conn);
                    pdx_kv_progress(d.conn);
                    st = pdx_kv_load_layer_check(d.conn, "d-push",
                                                 layers[0]);
                }
                assert_int_equal(st, PDX_OK);
                assert_int_equal(pdx_kv_load_layer_check(d.conn, "d-push",
                                                         layers[nl - 1]),
                                 PDX_INPROGRESS);
            }
        }
    }
    size_t tokens = 0;
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        pdx_kv_progress(p.conn);
        pdx_kv_progress(d.conn);
        st = pdx_kv_load_check(d.conn, "d-push", &tokens);
    }
    assert_int_equal(st, PDX_OK);
    assert_int_equal(tokens, NT - 1);
    for (uint64_t i = 0; i < NB; i++) {
        assert_true(same_block(&p, pids[i], &d, dids[i]));
    }
    char *params = NULL;
    assert_int_equal(pdx_kv_request_finished(p.conn, &req, pids, NT,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    /* D may see the last write land before P reaps its completion: the
     * handoff is freed (done) when P's push ends, at once or a pass later. */
    kv_freed_t f = {0};
    PDX_POLL_UNTIL(f.n == 0, 20000) {
        pdx_kv_progress(p.conn);
        pdx_kv_progress(d.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.n, 1);
    assert_int_equal(f.why, PDX_KV_FREED_DONE);
    assert_int_equal(pdx_kv_held_requests(p.conn), 0);
    /* The pool: every block, each filled layer by layer. */
    st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 20000) {
        st = pdx_kv_save_check(p.conn, "p-push");
    }
    assert_int_equal(st, PDX_OK);
    pdx_kv_request_t again = req;
    again.req_id = "p-again";
    pdx_kv_match_t m;
    assert_int_equal(pdx_kv_lookup(p.conn, &again, &m), PDX_OK);
    assert_int_equal(m.source, PDX_KV_SOURCE_OFFLOAD);
    assert_int_equal(m.blocks, 15);
    assert_true(m.tail);
    uint64_t back[NB];
    for (uint64_t i = 0; i < NB; i++) {
        back[i] = 100 + i;
    }
    pdx_kv_load_params_t lp = {.field_mask = PDX_KV_LOAD_PARAM_FIRST_BLOCK,
                               .first_block = 2};
    assert_int_equal(pdx_kv_load_ex(p.conn, &again, &m, &lp, back + 2),
                     PDX_OK);
    assert_int_equal(pdx_kv_load_check(p.conn, "p-again", &tokens), PDX_OK);
    for (uint64_t i = 2; i < NB; i++) {
        assert_true(same_block(&p, pids[i], &p, back[i]));
    }
    pdx_kv_free(params);
    node_fini(&d);
    node_fini(&p);
}

/* A layered READ from the second block on: each layer reported, the
 * bytes exact, the holder freed (done) once every layer landed. A push
 * whose holder drops the request ends NOT_FOUND under policy "fail". */
static void test_layered_pull_and_dropped_push(void **state)
{
    pdx_kv_config_t cp, cd;
    base_config(&cp, "y-p", "y-d", "0");
    base_config(&cd, "y-d", "y-p", "0");
    cd.children[0].failure_policy = PDX_KV_FAIL_FAIL;
    node_t p, d;
    node_glm(&p, &cp);
    node_glm(&d, &cd);
    assert_int_equal(connect_both(&p, &d), PDX_OK);
    enum { NT = 700, NB = 11 };
    uint64_t tok[NT], pids[NB], dids[NB];
    pdx_block_hash_t hs[NT / 64];
    pdx_kv_request_t req;
    layer_request(&p, tok, NT, 9, hs, &req, "p-pull");
    for (uint64_t i = 0; i < NB; i++) {
        pids[i] = i;
        dids[i] = 60 + i;
        fill_block(&p, pids[i], 900 + i);
    }
    char *params = NULL;
    assert_int_equal(pdx_kv_request_finished(p.conn, &req, pids, NT,
                                             PDX_KV_FROM_ARENA, &params),
                     PDX_OK);
    pdx_kv_request_t dreq = req;
    dreq.req_id = "d-pull";
    dreq.params = params;
    pdx_kv_match_t m;
    assert_int_equal(pdx_kv_lookup(d.conn, &dreq, &m), PDX_OK);
    assert_int_equal(m.blocks, 10);
    assert_true(m.tail);
    pdx_kv_load_params_t lp = {
        .field_mask = PDX_KV_LOAD_PARAM_FIRST_BLOCK | PDX_KV_LOAD_PARAM_FLAGS,
        .first_block = 1, .flags = PDX_KV_LOAD_F_LAYERED};
    assert_int_equal(pdx_kv_load_ex(d.conn, &dreq, &m, &lp, dids + 1),
                     PDX_OK);
    pdx_status_t st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 20000) {
        st = pdx_kv_load_layer_check(d.conn, "d-pull", 40);
    }
    assert_int_equal(st, PDX_OK);
    assert_int_equal(pdx_kv_load_layer_check(d.conn, "d-pull", 4000),
                     PDX_ERR_NOT_FOUND);
    size_t tokens = 0;
    st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 20000) {
        st = pdx_kv_load_check(d.conn, "d-pull", &tokens);
    }
    assert_int_equal(st, PDX_OK);
    for (uint64_t i = 1; i < NB; i++) {
        assert_true(same_block(&p, pids[i], &d, dids[i]));
    }
    kv_freed_t f = {0};
    for (int i = 0; i < 20000 && f.n == 0; i++) {
        pdx_kv_progress(p.conn);
        pdx_kv_poll_freed(p.conn, kv_on_freed, &f);
    }
    assert_int_equal(f.why, PDX_KV_FREED_DONE);

    /* A push P gives up: D's load fails, named. */
    pdx_kv_push_expect_t e = {
        .field_mask = PDX_KV_PUSH_HOLDER | PDX_KV_PUSH_HOLDER_REQ |
                      PDX_KV_PUSH_NBLOCKS,
        .holder = "y-p", .holder_req = "p-gone", .nblocks = 2};
    assert_int_equal(pdx_kv_push_expect(d.conn, "d-gone", &e, dids),
                     PDX_OK);
    for (int i = 0; i < 200; i++) {
        pdx_kv_progress(d.conn);
        pdx_kv_progress(p.conn);
    }
    assert_int_equal(pdx_kv_request_dropped(p.conn, "p-gone"), PDX_OK);
    st = PDX_INPROGRESS;
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 20000) {
        pdx_kv_progress(p.conn);
        pdx_kv_progress(d.conn);
        st = pdx_kv_load_check(d.conn, "d-gone", &tokens);
    }
    assert_int_equal(st, PDX_ERR_NOT_FOUND);
    pdx_kv_free(params);
    node_fini(&d);
    node_fini(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handoff_8k),
        cmocka_unit_test(test_lease_expiry_and_reject),
        cmocka_unit_test(test_mismatch_refused),
        cmocka_unit_test(test_multi_routing),
        cmocka_unit_test(test_params_merge),
        cmocka_unit_test(test_params_memory),
        cmocka_unit_test(test_layerwise_push),
        cmocka_unit_test(test_layered_pull_and_dropped_push),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
