/* The connector's block-owner registry against a private etcd, one
 * connector in this process with a small offload pool:
 *   evictions   a pool that evicts unregisters the evicted blocks (in
 *               batches, not a round trip per block) and keeps the others;
 *               pdx_stats_json carries the store's state and counters
 *   lease lost  etcd frozen past the lease TTL (or, where etcd renews the
 *               lease when it wakes, the lease revoked behind the agent's
 *               back): the new lease gets every block the pool holds
 *               registered again, saves made meanwhile included. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include <pdx/kv_connector.h>
#include <pdx/pdx.h>
#include <pdx/store.h>

#include "etcd_fixture.h"
#include "mix.h"
#include "pdx_clock.h"

#define BLOCK_TOKENS 16
#define NUM_BLOCKS 64

typedef struct node {
    char name[PDX_NAME_MAX];
    pdx_kv_connector_h conn;
    pdx_layout_h layout;
    void *mem;
} node_t;

/* A connector `name` whose pool holds `cap` blocks. */
static void node_open(node_t *n, const char *name, const char *ns,
                      uint32_t ttl_ms, uint32_t cap)
{
    memset(n, 0, sizeof(*n));
    snprintf(n->name, sizeof(n->name), "%s", name);
    char json[2048];
    snprintf(json, sizeof(json),
             "{\"version\": 1,\n"
             " \"model\": {\"id\": \"test/registry\", \"kv_dtype\": \"fp8\",\n"
             "   \"num_layers\": 2, \"mla_bytes_per_token\": 64},\n"
             " \"kv\": {\"block_tokens\": %d, \"num_blocks\": %d},\n"
             " \"hashing\": {\"algorithm\": \"xxhash_cbor\", \"seed\": "
             "\"reg\"},\n"
             " \"agent\": {\"role\": \"both\", \"name\": \"%s\"},\n"
             " \"connector\": {\"children\": [\n"
             "   {\"type\": \"offload\", \"budget_bytes\": \"1MiB\", "
             "\"ranks_per_host\": 1}]},\n"
             " \"backends\": [{\"name\": \"ucx\", \"options\": {\"tls\": "
             "\"tcp\"}}],\n"
             " \"store\": {\"endpoints\": [\"%s\"], \"namespace\": \"%s\",\n"
             "   \"lease_ttl_ms\": %u, \"timeout_ms\": 1000,\n"
             "   \"remote_offload\": false}}\n",
             BLOCK_TOKENS, NUM_BLOCKS, name, fx_etcd.url, ns, ttl_ms);
    pdx_kv_config_t cfg;
    char err[512];
    if (pdx_kv_config_parse(json, strlen(json), "registry.json", &cfg, err,
                            sizeof(err)) != PDX_OK) {
        fail_msg("config: %s", err);
    }
    /* A pool of exactly `cap` slots (64-byte aligned blocks). */
    uint64_t slot = (pdx_kv_config_bytes_per_block(&cfg) + 63) / 64 * 64;
    for (uint32_t i = 0; i < cfg.nchildren; i++) {
        if (cfg.children[i].type == PDX_KV_CHILD_OFFLOAD) {
            cfg.children[i].budget_bytes = slot * cap;
        }
    }
    assert_int_equal(pdx_kv_config_layout(&cfg, &n->layout), PDX_OK);
    uint64_t size = pdx_layout_carve_size(n->layout, 4096);
    assert_int_equal(posix_memalign(&n->mem, 4096, size), 0);
    memset(n->mem, 0x3c, size);
    assert_int_equal(
        pdx_layout_carve(n->layout, (uintptr_t)n->mem, size, 4096, 0), PDX_OK);
    pdx_kv_connector_params_t cp = {.field_mask = PDX_KV_PARAM_CONFIG |
                                                  PDX_KV_PARAM_LAYOUT,
                                    .config = &cfg,
                                    .layout = n->layout};
    assert_int_equal(pdx_kv_connector_create(&cp, &n->conn), PDX_OK);
    pdx_offload_stats_t os;
    assert_int_equal(pdx_kv_offload_stats(n->conn, &os), PDX_OK);
    assert_int_equal(os.capacity_blocks, cap);
}

static void node_close(node_t *n)
{
    pdx_kv_connector_destroy(n->conn);
    pdx_layout_destroy(n->layout);
    free(n->mem);
}

static pdx_agent_h agent_of(node_t *n)
{
    return pdx_kv_connector_agent(n->conn);
}

static void make_hashes(pdx_block_hash_t *h, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        memset(&h[i], 0, sizeof(h[i]));
        for (int w = 0; w < 2; w++) {
            uint64_t x = splitmix64(seed * 1000003ull + i * 2 + (uint64_t)w);
            memcpy(h[i].bytes + 8 * w, &x, 8);
        }
        h[i].len = 16;
    }
}

/* Save h[0..nb) (one request, arena blocks 0..nb-1) and wait until the
 * pool has them. */
static void save(node_t *n, const char *req, const pdx_block_hash_t *h,
                 size_t nb)
{
    uint64_t ids[NUM_BLOCKS];
    assert_true(nb <= NUM_BLOCKS);
    for (size_t i = 0; i < nb; i++) {
        ids[i] = i;
    }
    pdx_kv_request_t r = {.req_id = req,
                          .hashes = h,
                          .nfull = nb,
                          .prompt_tokens = nb * BLOCK_TOKENS};
    assert_int_equal(pdx_kv_save(n->conn, &r, ids), PDX_OK);
    pdx_status_t st = PDX_INPROGRESS;
    uint64_t end = pdx_now_ms() + 10000;
    while ((st = pdx_kv_save_check(n->conn, req)) == PDX_INPROGRESS &&
           pdx_now_ms() < end) {
        pdx_kv_progress(n->conn);
        usleep(1000);
    }
    assert_int_equal(st, PDX_OK);
}

typedef struct owned {
    const char *self;
    int *mine;   /* per block: entries of `self` */
    int *others; /* per block: entries of anyone else */
} owned_t;

static void on_owner(void *arg, size_t i, const char *owner)
{
    owned_t *o = arg;
    if (strcmp(owner, o->self) == 0) {
        o->mine[i]++;
    } else {
        o->others[i]++;
    }
}

/* Per block of h[0..n), whether n's agent is registered as its owner. */
static pdx_status_t owned_by(node_t *nd, const pdx_block_hash_t *h, size_t n,
                             int *mine)
{
    char hexbuf[NUM_BLOCKS * 2][PDX_BLOCK_HASH_HEX_MAX];
    const char *hex[NUM_BLOCKS * 2];
    int others[NUM_BLOCKS * 2] = {0};
    assert_true(n <= NUM_BLOCKS * 2);
    for (size_t i = 0; i < n; i++) {
        pdx_block_hash_to_hex(&h[i], hexbuf[i], sizeof(hexbuf[i]));
        hex[i] = hexbuf[i];
        mine[i] = 0;
    }
    owned_t o = {nd->name, mine, others};
    pdx_status_t st = pdx_store_owners_get(agent_of(nd), hex, n, on_owner, &o);
    for (size_t i = 0; st == PDX_OK && i < n; i++) {
        assert_int_equal(others[i], 0);
    }
    return st;
}

/* Wait (at most timeout_ms) until exactly the blocks with want[i] are
 * registered as owned by nd; 0 when they are. */
static int wait_owned(node_t *nd, const pdx_block_hash_t *h, size_t n,
                      const bool *want, uint32_t timeout_ms)
{
    int mine[NUM_BLOCKS * 2];
    uint64_t end = pdx_now_ms() + timeout_ms;
    int wrong = -1;
    do {
        if (owned_by(nd, h, n, mine) == PDX_OK) {
            wrong = 0;
            for (size_t i = 0; i < n; i++) {
                wrong += mine[i] != (want[i] ? 1 : 0);
            }
            if (wrong == 0) {
                return 0;
            }
        }
        usleep(20000);
    } while (pdx_now_ms() < end);
    print_message("%d of %zu blocks not as expected after %u ms\n", wrong, n,
                  timeout_ms);
    return -1;
}

static const cJSON *jget(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (v == NULL) {
        fail_msg("stats JSON: no member %s", k);
    }
    return v;
}

static void test_evicted_unregistered(void **state)
{
    (void)state;
    NEED_ETCD();
    enum { CAP = 16, N = 64 };
    char ns[64];
    snprintf(ns, sizeof(ns), "t-reg-evict-%d", (int)getpid());
    node_t n;
    node_open(&n, "reg-evict", ns, 5000, CAP);
    pdx_block_hash_t h[N];
    make_hashes(h, N, 1);
    bool want[N];
    /* The first CAP: no eviction yet, all registered. */
    save(&n, "r0", h, CAP);
    for (size_t i = 0; i < N; i++) {
        want[i] = i < CAP;
    }
    assert_int_equal(wait_owned(&n, h, N, want, 10000), 0);
    pdx_store_status_t s0, s1;
    assert_int_equal(pdx_store_status(agent_of(&n), &s0), PDX_OK);
    /* Three more requests of CAP blocks: each evicts the previous one (the
     * retained LRU tail is the oldest save). */
    save(&n, "r1", h + CAP, CAP);
    save(&n, "r2", h + 2 * CAP, CAP);
    save(&n, "r3", h + 3 * CAP, CAP);
    pdx_offload_stats_t os;
    assert_int_equal(pdx_kv_offload_stats(n.conn, &os), PDX_OK);
    assert_int_equal(os.evictions[PDX_OFFLOAD_RETAINED], N - CAP);
    for (size_t i = 0; i < N; i++) {
        want[i] = i >= N - CAP;
    }
    uint64_t t0 = pdx_now_ms();
    assert_int_equal(wait_owned(&n, h, N, want, 10000), 0);
    print_message("evictions: %d evicted blocks lost this owner, the %d kept "
                  "did not (%llu ms after the last save)\n",
                  N - CAP, CAP, (unsigned long long)(pdx_now_ms() - t0));
    /* The counters follow the calls (the connector's after the agent's):
     * wait until nothing is queued and both sides agree. */
    pdx_kv_store_stats_t ks;
    cJSON *root = NULL;
    const cJSON *st = NULL, *reg = NULL;
    uint64_t end = pdx_now_ms() + 5000;
    for (int guard = 0; guard < 1000; guard++) {
        cJSON_Delete(root);
        char *json = NULL;
        assert_int_equal(pdx_kv_store_stats(n.conn, &ks), PDX_OK);
        /* The store in pdx_stats_json (what pdx-info --stats shows). */
        assert_int_equal(pdx_stats_json(agent_of(&n), &json), PDX_OK);
        root = cJSON_Parse(json);
        if (root == NULL) {
            fail_msg("pdx_stats_json is not valid JSON: %s", json);
        }
        pdx_blob_free(json);
        st = jget(root, "store");
        reg = jget(st, "registry");
        /* agents_known: the agent's own key, which it watches; its first
         * event may come after the registry settles (a loaded machine). */
        bool settled =
            jget(st, "agents_known")->valuedouble >= 1 &&
            ks.pending_unregistrations == 0 && ks.pending_registrations == 0 &&
            ks.unregistered_blocks > 0 &&
            jget(reg, "added_blocks")->valuedouble ==
                (double)ks.registered_blocks &&
            jget(reg, "deleted_blocks")->valuedouble ==
                (double)ks.unregistered_blocks &&
            jget(reg, "del_calls")->valuedouble == (double)ks.unregistrations;
        if (settled || pdx_now_ms() > end) {
            break;
        }
        usleep(5000);
    }
    assert_int_equal(pdx_store_status(agent_of(&n), &s1), PDX_OK);
    print_message("registry: %llu blocks registered in %llu calls, %llu "
                  "unregistered in %llu calls; %llu store requests for the "
                  "%d evictions (keepalives and lookups included)\n",
                  (unsigned long long)ks.registered_blocks,
                  (unsigned long long)ks.registrations,
                  (unsigned long long)ks.unregistered_blocks,
                  (unsigned long long)ks.unregistrations,
                  (unsigned long long)(s1.requests - s0.requests), N - CAP);
    assert_int_equal(ks.pending_unregistrations, 0);
    assert_true(ks.unregistered_blocks > 0 &&
                ks.unregistered_blocks <= (uint64_t)(N - CAP));
    /* Batched: several blocks per call on average, never one per block. */
    assert_true(ks.unregistrations * 2 <= ks.unregistered_blocks);
    assert_true(s1.requests - s0.requests < (uint64_t)(N - CAP));
    /* Blocks evicted before their batch went out were never registered. */
    assert_true(jget(reg, "added_blocks")->valuedouble ==
                (double)ks.registered_blocks);
    assert_true(jget(reg, "deleted_blocks")->valuedouble ==
                (double)ks.unregistered_blocks);
    assert_true(jget(reg, "del_calls")->valuedouble ==
                (double)ks.unregistrations);
    assert_true(cJSON_IsTrue(jget(st, "reachable")));
    assert_true(cJSON_IsNull(jget(st, "unreachable_since")));
    assert_string_equal(jget(st, "state")->valuestring, "reachable");
    assert_string_equal(jget(st, "namespace")->valuestring, ns);
    assert_string_equal(jget(st, "module")->valuestring, "etcd");
    assert_true(cJSON_IsString(jget(st, "lease")) &&
                strcmp(jget(st, "lease")->valuestring, "0") != 0);
    assert_true(jget(st, "published_generation")->valuedouble >= 1);
    assert_true(jget(st, "agents_known")->valuedouble >= 1);
    cJSON_Delete(root);
    node_close(&n);
}

static void test_lease_lost_reregistered(void **state)
{
    (void)state;
    NEED_ETCD();
    enum { CAP = 16, N1 = 8, N2 = 4 };
    const uint32_t ttl_ms = 2000;
    char ns[64];
    snprintf(ns, sizeof(ns), "t-reg-lease-%d", (int)getpid());
    node_t n;
    node_open(&n, "reg-lease", ns, ttl_ms, CAP);
    pdx_block_hash_t h[N1 + N2];
    make_hashes(h, N1 + N2, 2);
    bool want[N1 + N2];
    for (size_t i = 0; i < N1 + N2; i++) {
        want[i] = i < N1;
    }
    save(&n, "a", h, N1);
    assert_int_equal(wait_owned(&n, h, N1 + N2, want, 10000), 0);
    pdx_store_status_t s0, s;
    assert_int_equal(pdx_store_status(agent_of(&n), &s0), PDX_OK);
    assert_true(s0.lease != 0);

    /* etcd frozen past the TTL: no keepalive reaches it. Saves go on. */
    kill(fx_etcd.pid, SIGSTOP);
    uint64_t end = pdx_now_ms() + 5000;
    do {
        usleep(20000);
        assert_int_equal(pdx_store_status(agent_of(&n), &s), PDX_OK);
    } while (s.reachable && pdx_now_ms() < end);
    save(&n, "b", h + N1, N2);
    usleep((ttl_ms + 1500) * 1000);
    assert_int_equal(pdx_store_status(agent_of(&n), &s), PDX_OK);
    assert_false(s.reachable);
    kill(fx_etcd.pid, SIGCONT);

    /* etcd expires the lease when it wakes, unless it renews every lease
     * first (it may, as after a leader change); then take it away by hand,
     * as an expiry would. */
    end = pdx_now_ms() + 10000;
    uint64_t reached = 0;
    for (int guard = 0; guard < 1000 && pdx_now_ms() < end; guard++) {
        usleep(20000);
        assert_int_equal(pdx_store_status(agent_of(&n), &s), PDX_OK);
        if (s.reachable && reached == 0) {
            reached = pdx_now_ms();
        }
        if (s.leases_granted > s0.leases_granted ||
            (reached != 0 && pdx_now_ms() - reached > 3000)) {
            break; /* a new lease, or the old one outlived a keepalive */
        }
    }
    assert_true(reached != 0);
    const char *how = "expired while etcd was frozen";
    if (s.leases_granted == s0.leases_granted) {
        assert_int_equal(s.lease, s0.lease);
        char body[64], out[512];
        snprintf(body, sizeof(body), "{\"ID\": \"%lld\"}", (long long)s0.lease);
        assert_int_equal(
            etcd_post(&fx_etcd, "/v3/lease/revoke", body, out, sizeof(out)), 0);
        how = "survived the freeze (etcd renewed it), revoked by hand";
    }
    for (size_t i = 0; i < N1 + N2; i++) {
        want[i] = true;
    }
    uint64_t t0 = pdx_now_ms();
    assert_int_equal(wait_owned(&n, h, N1 + N2, want, 15000), 0);
    assert_int_equal(pdx_store_status(agent_of(&n), &s), PDX_OK);
    assert_true(s.leases_granted > s0.leases_granted);
    assert_true(s.lease != s0.lease);
    pdx_kv_store_stats_t ks;
    end = pdx_now_ms() + 5000;
    do { /* counted once the registration call has returned */
        assert_int_equal(pdx_kv_store_stats(n.conn, &ks), PDX_OK);
    } while (ks.reregistered_blocks < N1 + N2 && pdx_now_ms() < end &&
             usleep(5000) == 0);
    print_message("lease %llx %s; new lease %llx: %d blocks owned again "
                  "%llu ms later (%llu walk(s), %llu blocks registered "
                  "again)\n",
                  (unsigned long long)s0.lease, how,
                  (unsigned long long)s.lease, N1 + N2,
                  (unsigned long long)(pdx_now_ms() - t0),
                  (unsigned long long)ks.lease_resyncs,
                  (unsigned long long)ks.reregistered_blocks);
    assert_true(ks.lease_resyncs >= 1);
    assert_true(ks.reregistered_blocks >= N1 + N2);
    node_close(&n);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_evicted_unregistered),
        cmocka_unit_test(test_lease_lost_reregistered),
    };
    return cmocka_run_group_tests(tests, fx_etcd_setup, fx_etcd_teardown);
}
