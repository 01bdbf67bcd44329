/* Agents meeting through the etcd store (one process, a private etcd):
 * discovery by name, reload when the peer's generation changes, a peer
 * marked dead when its key goes, a peer of other invariants refused with
 * the field named, fetch of a late publisher and of a missing one, loaded
 * peers transferring byte-exact while etcd is down and publication resumed
 * when it returns, the owner registry through the agent. */
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

#include <cmocka.h>

#include <pdx/pdx.h>
#include <pdx/store.h>

#include "ctl.h"
#include "etcd_fixture.h"
#include "store_node.h"
#include "pdx_clock.h"

#define REGION (4u << 20)

static int g_ns_seq;

typedef store_node_t node_t;

static void node_open(node_t *n, const char *name, const char *ns,
                      uint32_t ttl_ms, const char *seed, uint8_t fill)
{
    assert_int_equal(store_node_open(n, name, fx_etcd.url, ns, ttl_ms, REGION,
                                     fill),
                     PDX_OK);
    assert_int_equal(pdx_agent_set_invariant(n->agent, "hash_seed", seed),
                     PDX_OK);
}

static void next_ns(char *buf, size_t len)
{
    snprintf(buf, len, "t-agent-%d-%d", (int)getpid(), ++g_ns_seq);
}

/* READ `len` bytes at `off` of peer's region into dst's region at 0. */
static pdx_status_t read_from(node_t *dst, const char *peer, node_t *src,
                              uint64_t off, uint64_t len)
{
    return ctl_read(dst->agent, peer, (uintptr_t)dst->mem,
                    (uintptr_t)src->mem + off, len, 10000);
}

static void test_discover_by_name(void **state)
{
    (void)state;
    NEED_ETCD();
    char ns[64];
    next_ns(ns, sizeof(ns));
    node_t p, d;
    node_open(&p, "p0", ns, 3000, "s", 1);
    node_open(&d, "d0", ns, 3000, "s", 2);
    assert_int_equal(pdx_peer_state(d.agent, "p0"), PDX_ERR_NOT_FOUND);
    assert_int_equal(pdx_agent_publish(p.agent), PDX_OK);
    uint64_t t0 = pdx_now_ms();
    assert_int_equal(pdx_peer_fetch(d.agent, "p0", 5000), PDX_OK);
    assert_int_equal(read_from(&d, "p0", &p, 4096, 1 << 20), PDX_OK);
    print_message("discovery: first transfer to a peer known by name "
                  "%llu ms from the fetch\n",
                  (unsigned long long)(pdx_now_ms() - t0));
    assert_memory_equal(d.mem, p.mem + 4096, 1 << 20);
    assert_int_equal(pdx_peer_fetch(d.agent, "p0", 0), PDX_OK); /* loaded */
    char line[512];
    assert_int_equal(pdx_store_describe(d.agent, line, sizeof(line)), PDX_OK);
    print_message("d0: %s\n", line);
    assert_non_null(strstr(line, "reachable"));
    /* Reload on a new generation: p0 registers more memory. */
    pdx_peer_info_t info;
    assert_int_equal(pdx_peer_info(d.agent, "p0", &info, NULL, 0), PDX_OK);
    uint32_t gen0 = info.generation;
    uint8_t *more = aligned_alloc(4096, 1 << 20);
    memset(more, 0x5a, 1 << 20);
    pdx_mem_reg_h reg2;
    assert_int_equal(pdx_mem_register(p.agent, PDX_MEM_DRAM, (uintptr_t)more,
                                      1 << 20, 0, 0, &reg2),
                     PDX_OK);
    uint64_t end = pdx_now_ms() + 5000;
    do {
        usleep(10000);
        assert_int_equal(pdx_peer_info(d.agent, "p0", &info, NULL, 0),
                         PDX_OK);
    } while (info.generation == gen0 && pdx_now_ms() < end);
    assert_true(info.generation > gen0);
    assert_int_equal(info.nregions, 2);
    print_message("new generation picked up through the watch in %llu ms\n",
                  (unsigned long long)(pdx_now_ms() - (end - 5000)));
    /* The new region is readable. */
    pdx_desc_t l = {.addr = (uintptr_t)d.mem, .len = 4096};
    pdx_desc_t r = {.addr = (uintptr_t)more, .len = 4096};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    assert_int_equal(pdx_xfer_create(d.agent, PDX_XFER_READ, &ll, &rl, "p0",
                                     NULL, 0, &x),
                     PDX_OK);
    pdx_status_t st = pdx_xfer_post(x);
    while (st == PDX_INPROGRESS) {
        st = pdx_xfer_check(x);
    }
    pdx_xfer_release(x);
    assert_int_equal(st, PDX_OK);
    assert_int_equal(d.mem[100], 0x5a);
    /* p0 goes away: its key is revoked, d0 marks it dead. */
    pdx_status_t st_before = pdx_peer_state(d.agent, "p0");
    assert_int_equal(st_before, PDX_OK);
    pdx_mem_deregister(p.agent, reg2);
    free(more);
    store_node_close(&p);
    end = pdx_now_ms() + 5000;
    while (pdx_peer_state(d.agent, "p0") == PDX_OK && pdx_now_ms() < end) {
        usleep(5000);
    }
    assert_int_equal(pdx_peer_state(d.agent, "p0"),
                     PDX_ERR_REMOTE_DISCONNECT);
    store_node_close(&d);
}

static void test_fetch_waits_and_misses(void **state)
{
    (void)state;
    NEED_ETCD();
    char ns[64];
    next_ns(ns, sizeof(ns));
    node_t d;
    node_open(&d, "d1", ns, 3000, "s", 2);
    uint64_t t0 = pdx_now_ms();
    assert_int_equal(pdx_peer_fetch(d.agent, "nobody", 300),
                     PDX_ERR_NOT_FOUND);
    uint64_t dt = pdx_now_ms() - t0;
    assert_true(dt >= 290 && dt < 3000);
    assert_non_null(strstr(pdx_last_error(), "nobody"));
    /* A publisher that comes later is waited for. */
    node_t p;
    node_open(&p, "late", ns, 3000, "s", 3);
    /* Published in the background: the fetch waits for it. */
    assert_int_equal(pdx_agent_publish(p.agent), PDX_OK);
    assert_int_equal(pdx_peer_fetch(d.agent, "late", 5000), PDX_OK);
    assert_int_equal(pdx_agent_publish(d.agent), PDX_OK);
    assert_int_equal(pdx_peer_fetch(d.agent, "bad name!", 10),
                     PDX_ERR_INVALID);
    store_node_close(&p);
    store_node_close(&d);
    /* Without a store. */
    pdx_agent_h a;
    assert_int_equal(pdx_agent_create("plain", NULL, &a), PDX_OK);
    assert_int_equal(pdx_peer_fetch(a, "x", 10), PDX_ERR_UNSUPPORTED);
    assert_int_equal(pdx_agent_publish(a), PDX_ERR_UNSUPPORTED);
    pdx_agent_destroy(a);
}

static void test_mismatch_refused(void **state)
{
    (void)state;
    NEED_ETCD();
    char ns[64];
    next_ns(ns, sizeof(ns));
    node_t p, d;
    node_open(&p, "p-other-seed", ns, 3000, "seed-B", 1);
    node_open(&d, "d2", ns, 3000, "seed-A", 2);
    assert_int_equal(pdx_agent_publish(p.agent), PDX_OK);
    assert_int_equal(pdx_peer_fetch(d.agent, "p-other-seed", 5000),
                     PDX_ERR_MISMATCH);
    print_message("refused: %s\n", pdx_last_error());
    assert_non_null(strstr(pdx_last_error(), "hash_seed"));
    assert_non_null(strstr(pdx_last_error(), "seed-B"));
    assert_int_equal(pdx_peer_state(d.agent, "p-other-seed"),
                     PDX_ERR_NOT_FOUND);
    store_node_close(&p);
    store_node_close(&d);
}

static void test_store_down(void **state)
{
    (void)state;
    NEED_ETCD();
    char ns[64];
    next_ns(ns, sizeof(ns));
    node_t p, d;
    node_open(&p, "p3", ns, 5000, "s", 7);
    node_open(&d, "d3", ns, 5000, "s", 8);
    assert_int_equal(pdx_agent_publish(p.agent), PDX_OK);
    assert_int_equal(pdx_peer_fetch(d.agent, "p3", 5000), PDX_OK);
    etcd_kill(&fx_etcd, SIGKILL);
    /* Loaded peers keep transferring, byte-exact. */
    for (int i = 0; i < 20; i++) {
        memset(d.mem, 0, 1 << 20);
        assert_int_equal(read_from(&d, "p3", &p, (uint64_t)i * 8192, 1 << 20),
                         PDX_OK);
        assert_memory_equal(d.mem, p.mem + (uint64_t)i * 8192, 1 << 20);
    }
    char line[512];
    uint64_t end = pdx_now_ms() + 5000;
    pdx_store_status_t s;
    do {
        usleep(20000);
        assert_int_equal(pdx_store_status(d.agent, &s), PDX_OK);
    } while (s.reachable && pdx_now_ms() < end);
    assert_false(s.reachable);
    assert_int_equal(pdx_store_describe(d.agent, line, sizeof(line)), PDX_OK);
    print_message("while etcd is down: %s\n", line);
    assert_non_null(strstr(line, "unreachable since"));
    /* Unknown names cannot be found; the peer stays alive. */
    assert_int_equal(pdx_peer_fetch(d.agent, "ghost", 200),
                     PDX_ERR_UNAVAILABLE);
    assert_int_equal(pdx_peer_state(d.agent, "p3"), PDX_OK);
    /* p3 changes while etcd is down: published when it is back. */
    pdx_peer_info_t info;
    assert_int_equal(pdx_peer_info(d.agent, "p3", &info, NULL, 0), PDX_OK);
    uint32_t gen0 = info.generation;
    assert_int_equal(pdx_agent_set_invariant(p.agent, "extra", "1"), PDX_OK);
    assert_int_equal(pdx_agent_set_invariant(d.agent, "extra", "1"), PDX_OK);
    usleep(300000);
    char err[256];
    assert_int_equal(etcd_restart(&fx_etcd, err, sizeof(err)), 0);
    end = pdx_now_ms() + 15000;
    do {
        usleep(20000);
        assert_int_equal(pdx_peer_info(d.agent, "p3", &info, NULL, 0),
                         PDX_OK);
    } while (info.generation == gen0 && pdx_now_ms() < end);
    assert_true(info.generation > gen0);
    assert_int_equal(pdx_peer_state(d.agent, "p3"), PDX_OK);
    assert_int_equal(read_from(&d, "p3", &p, 0, 4096), PDX_OK);
    assert_memory_equal(d.mem, p.mem, 4096);
    assert_int_equal(pdx_store_status(d.agent, &s), PDX_OK);
    assert_true(s.reachable);
    store_node_close(&p);
    store_node_close(&d);
}

static void on_owner(void *arg, size_t i, const char *owner)
{
    int *n = arg;
    if (strcmp(owner, "o1") == 0 || strcmp(owner, "o2") == 0) {
        n[i]++;
    }
}

static void test_owners_through_agent(void **state)
{
    (void)state;
    NEED_ETCD();
    char ns[64];
    next_ns(ns, sizeof(ns));
    node_t a, b;
    node_open(&a, "o1", ns, 3000, "s", 1);
    node_open(&b, "o2", ns, 3000, "s", 2);
    const char *blocks[] = {"aa01", "aa02", "aa03"};
    uint32_t counts[3];
    pdx_status_t st = PDX_ERR_UNAVAILABLE;
    uint64_t end = pdx_now_ms() + 5000;
    while (st == PDX_ERR_UNAVAILABLE && pdx_now_ms() < end) { /* lease first */
        st = pdx_store_owners_add(a.agent, blocks, 3, counts);
        usleep(10000);
    }
    assert_int_equal(st, PDX_OK);
    assert_int_equal(counts[0], 1);
    st = PDX_ERR_UNAVAILABLE;
    while (st == PDX_ERR_UNAVAILABLE && pdx_now_ms() < end) {
        st = pdx_store_owners_add(b.agent, blocks, 2, counts);
        usleep(10000);
    }
    assert_int_equal(st, PDX_OK);
    assert_int_equal(counts[1], 2);
    int n[3] = {0};
    assert_int_equal(pdx_store_owners_get(a.agent, blocks, 3, on_owner, n),
                     PDX_OK);
    assert_int_equal(n[0], 2);
    assert_int_equal(n[2], 1);
    assert_int_equal(pdx_store_owners_del(b.agent, blocks, 2), PDX_OK);
    memset(n, 0, sizeof(n));
    assert_int_equal(pdx_store_owners_get(a.agent, blocks, 3, on_owner, n),
                     PDX_OK);
    assert_int_equal(n[0], 1);
    store_node_close(&a);
    store_node_close(&b);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discover_by_name),
        cmocka_unit_test(test_fetch_waits_and_misses),
        cmocka_unit_test(test_mismatch_refused),
        cmocka_unit_test(test_owners_through_agent),
        cmocka_unit_test(test_store_down),
    };
    return cmocka_run_group_tests(tests, fx_etcd_setup, fx_etcd_teardown);
}
