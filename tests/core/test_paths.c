/* The path report and the path policy, with the real modules (ucx, cma) and
 * two agents in one process (same host by construction):
 *   - shared target memory over cma: backend "cma", transport "memcpy",
 *     no fallback, and cma's own counters say memcpy moved the bytes;
 *   - private target memory: a fallback naming why, calibrating between
 *     cma's process_vm and ucx;
 *   - no cma on the initiator: "ucx", a fallback naming the missing cma;
 *   - the same_host_fast policy refuses both fallbacks with PDX_ERR_POLICY
 *     and the reason in pdx_last_error(), and lets the fast path through;
 *   - the choice by cost: with cma's post slowed down (a wrapped ops
 *     table) a class of private-memory reads settles on ucx, with ucx's
 *     slowed down on cma, each saying so with the measured costs, and
 *     every byte right on either path;
 *   - a pinned backend (path_backend, $PDX_PATH_BACKEND) carries every
 *     request it reaches, the fast path's too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <time.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/backend.h>
#include <pdx/pdx.h>
#include "ctl.h"
#include "poll_until.h"

#define LEN (4u << 20)

static void quiet(void *arg, pdx_log_level_t level, const char *msg)
{
    (void)arg, (void)level, (void)msg;
}

static pdx_agent_h agent(const char *name, bool cma, uint32_t policy,
                         pdx_backend_h *cma_p)
{
    pdx_agent_params_t ap = {
        .field_mask = PDX_AGENT_PARAM_FLAGS | PDX_AGENT_PARAM_PATH_POLICY,
        .flags = PDX_AGENT_F_PROGRESS_THREAD,
        .path_policy = policy};
    pdx_agent_h a;
    assert_int_equal(pdx_agent_create(name, &ap, &a), PDX_OK);
    pdx_option_t tls = {"tls", "sm"};
    assert_int_equal(pdx_backend_create(a, "ucx", &tls, 1, NULL), PDX_OK);
    if (cma) {
        assert_int_equal(pdx_backend_create(a, "cma", NULL, 0, cma_p),
                         PDX_OK);
    }
    return a;
}

static void load(pdx_agent_h into, pdx_agent_h from)
{
    assert_int_equal(ctl_load_agent(into, from, NULL), PDX_OK);
}

/* cma's byte counters from its describe line. */
static void cma_bytes(pdx_backend_h be, unsigned long long *memcpy_p,
                      unsigned long long *pvm_p)
{
    char d[512];
    pdx_backend_describe(be, d, sizeof(d));
    const char *p = strstr(d, "same host: ");
    assert_non_null(p);
    assert_int_equal(sscanf(p, "same host: %llu bytes by memcpy into/out of "
                               "peers' shared memory, %llu by",
                            memcpy_p, pvm_p),
                     2);
}

/* READ `len` bytes of P's `src` into `dst` of agent `a`; telemetry out. */
static pdx_status_t read_once(pdx_agent_h a, void *dst, const void *src,
                              size_t len, pdx_xfer_telemetry_t *t)
{
    pdx_desc_t l = {(uintptr_t)dst, len, 0, 0}, r = {(uintptr_t)src, len, 0,
                                                      0};
    pdx_desc_list_t ll = {PDX_MEM_DRAM, &l, 1}, rl = {PDX_MEM_DRAM, &r, 1};
    pdx_xfer_h x;
    pdx_status_t st = pdx_xfer_create(a, PDX_XFER_READ, &ll, &rl, "path-p",
                                      NULL, 0, &x);
    if (st != PDX_OK) {
        return st;
    }
    st = pdx_xfer_post(x);
    PDX_POLL_UNTIL(st == PDX_INPROGRESS, 30000) {
        st = pdx_xfer_check(x);
    }
    assert_int_equal(pdx_xfer_telemetry(x, t), PDX_OK);
    pdx_xfer_release(x);
    return st;
}

static void test_paths(void **state)
{
    (void)state;
    pdx_agent_h p = agent("path-p", true, PDX_PATH_POLICY_ANY, NULL);
    unsigned char *shared, *priv = malloc(LEN);
    assert_non_null(priv);
    assert_int_equal(pdx_mem_alloc(LEN, PDX_MEM_F_POPULATE, (void **)&shared),
                     PDX_OK);
    for (size_t i = 0; i < LEN; i++) {
        shared[i] = (unsigned char)(i * 13 + 1);
        priv[i] = (unsigned char)(i * 7 + 3);
    }
    pdx_mem_reg_h r1, r2;
    assert_int_equal(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)shared, LEN,
                                      0, 0, &r1),
                     PDX_OK);
    assert_int_equal(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)priv, LEN,
                                      0, 0, &r2),
                     PDX_OK);

    /* D with cma, any path. */
    pdx_backend_h dcma;
    pdx_agent_h d = agent("path-d", true, PDX_PATH_POLICY_ANY, &dcma);
    unsigned char *dst = calloc(1, LEN);
    pdx_mem_reg_h rd;
    assert_int_equal(pdx_mem_register(d, PDX_MEM_DRAM, (uintptr_t)dst, LEN, 0,
                                      0, &rd),
                     PDX_OK);
    load(d, p);
    pdx_xfer_telemetry_t t;
    unsigned long long mc0, pv0, mc1, pv1;
    cma_bytes(dcma, &mc0, &pv0);
    assert_int_equal(read_once(d, dst, shared, LEN, &t), PDX_OK);
    assert_memory_equal(dst, shared, LEN);
    cma_bytes(dcma, &mc1, &pv1);
    printf("shared target: backend %s, transport %s, fallback %d; cma "
           "memcpy +%llu, process_vm +%llu\n", t.backend, t.transport,
           t.fallback, mc1 - mc0, pv1 - pv0);
    assert_string_equal(t.backend, "cma");
    assert_string_equal(t.transport, "memcpy");
    assert_false(t.fallback);
    assert_int_equal(mc1 - mc0, LEN);
    assert_int_equal(pv1 - pv0, 0);

    assert_int_equal(read_once(d, dst, priv, LEN, &t), PDX_OK);
    assert_memory_equal(dst, priv, LEN);
    cma_bytes(dcma, &mc0, &pv0);
    printf("private target: backend %s, transport %s, fallback %d (%s); "
           "cma memcpy +%llu, process_vm +%llu\n", t.backend, t.transport,
           t.fallback, t.fallback_why, mc0 - mc1, pv0 - pv1);
    /* Two paths compete: the first request of its class calibrates. */
    assert_true(strcmp(t.backend, "cma") == 0 ||
                strcmp(t.backend, "ucx") == 0);
    if (strcmp(t.backend, "cma") == 0) {
        assert_string_equal(t.transport, "process_vm");
        assert_int_equal(pv0 - pv1, LEN);
    }
    assert_true(t.fallback);
    assert_non_null(strstr(t.fallback_why, "calibrating"));
    assert_non_null(strstr(t.fallback_why, "not shared memory"));
    assert_int_equal(mc0 - mc1, 0);
    pdx_stats_t s;
    assert_int_equal(pdx_stats_peer(d, "path-p", &s), PDX_OK);
    assert_int_equal(s.requests, 2);
    assert_int_equal(s.fallbacks, 1);
    assert_int_equal(pdx_stats_backend(d, "cma", &s), PDX_OK);
    assert_true(s.bytes >= (unsigned long long)LEN);
    pdx_peer_info_t info;
    assert_int_equal(pdx_peer_info(d, "path-p", &info, NULL, 0), PDX_OK);
    assert_true(info.same_host);
    assert_non_null(strstr(info.backends, "cma"));

    /* D without cma: UCX carries same-host host memory, a fallback. */
    pdx_agent_h u = agent("path-u", false, PDX_PATH_POLICY_ANY, NULL);
    pdx_mem_reg_h ru;
    assert_int_equal(pdx_mem_register(u, PDX_MEM_DRAM, (uintptr_t)dst, LEN, 0,
                                      0, &ru),
                     PDX_OK);
    load(u, p);
    load(p, u); /* UCX replies need P to know U */
    memset(dst, 0, LEN);
    assert_int_equal(read_once(u, dst, shared, 65536, &t), PDX_OK);
    assert_memory_equal(dst, shared, 65536);
    printf("no cma: backend %s, transport %s, fallback %d (%s)\n", t.backend,
           t.transport, t.fallback, t.fallback_why);
    assert_string_equal(t.backend, "ucx");
    assert_true(t.transport[0] != '\0');
    assert_true(t.fallback);
    assert_non_null(strstr(t.fallback_why, "cma backend is not created"));

    /* The policy: fallbacks refused with the reason, the fast path not. */
    pdx_agent_h f = agent("path-f", true, PDX_PATH_POLICY_SAME_HOST_FAST, NULL);
    unsigned char *fdst = calloc(1, LEN);
    pdx_mem_reg_h rf;
    assert_int_equal(pdx_mem_register(f, PDX_MEM_DRAM, (uintptr_t)fdst, LEN,
                                      0, 0, &rf),
                     PDX_OK);
    load(f, p);
    assert_int_equal(read_once(f, fdst, priv, LEN, &t), PDX_ERR_POLICY);
    printf("policy: %s\n", pdx_last_error());
    assert_non_null(strstr(pdx_last_error(), "path policy same_host_fast"));
    assert_non_null(strstr(pdx_last_error(), "not shared memory"));
    assert_int_equal(pdx_last_status(), PDX_ERR_POLICY);
    assert_int_equal(read_once(f, fdst, shared, LEN, &t), PDX_OK);
    assert_memory_equal(fdst, shared, LEN);
    assert_int_equal(pdx_stats_peer(f, "path-p", &s), PDX_OK);
    assert_int_equal(s.refused, 1);
    assert_int_equal(s.requests, 1);
    pdx_agent_h fu = agent("path-fu", false, PDX_PATH_POLICY_SAME_HOST_FAST,
                           NULL);
    pdx_mem_reg_h rfu;
    assert_int_equal(pdx_mem_register(fu, PDX_MEM_DRAM, (uintptr_t)fdst, LEN,
                                      0, 0, &rfu),
                     PDX_OK);
    load(fu, p);
    assert_int_equal(read_once(fu, fdst, shared, 4096, &t), PDX_ERR_POLICY);
    assert_non_null(strstr(pdx_last_error(), "cma backend is not created"));

    /* pdx-info --stats of this running process shows the same counters. */
    const char *info_bin = getenv("PDX_INFO_BIN");
    if (info_bin != NULL) {
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "%s --stats %d", info_bin, (int)getpid());
        FILE *pf = popen(cmd, "r");
        assert_non_null(pf);
        char out[65536];
        size_t got = fread(out, 1, sizeof(out) - 1, pf);
        out[got] = '\0';
        assert_int_equal(pclose(pf), 0);
        printf("pdx-info --stats: %zu bytes\n", got);
        assert_non_null(strstr(out, "\"agent\": \"path-d\""));
        assert_non_null(strstr(out, "\"agent\": \"path-f\""));
        assert_non_null(strstr(out, "\"refused\": 1"));
        assert_non_null(strstr(out, "not shared memory on the peer"));
    }

    pdx_agent_destroy(fu);
    pdx_agent_destroy(f);
    pdx_agent_destroy(u);
    pdx_agent_destroy(d);
    pdx_agent_destroy(p);
    assert_int_equal(pdx_mem_free(shared), PDX_OK);
    free(priv);
    free(dst);
    free(fdst);
}

/* The fds in an epoll set, from /proc/self/fdinfo ("tfd:" lines). */
static int epoll_members(int epfd)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strncmp(line, "tfd:", 4) == 0;
    }
    fclose(f);
    return n;
}

/* The agent's fd holds the backends' event fds with a progress thread as
 * without one: a caller that checks its request once and then sleeps on
 * the fd (then pdx_progress, as Python's selectors loops do) must wake on
 * the backend's event, not a nap of the thread's later (1.2 ms instead of
 * 0.15 for a 64 KiB request over TCP when they were left out). The thread
 * takes them out of its own set only. */
static void test_agent_fd_watches_backends(void **state)
{
    (void)state;
    for (int thread = 0; thread < 2; thread++) {
        pdx_agent_params_t ap = {
            .field_mask = PDX_AGENT_PARAM_FLAGS,
            .flags = thread ? PDX_AGENT_F_PROGRESS_THREAD : 0};
        pdx_agent_h a;
        assert_int_equal(pdx_agent_create("fdset", &ap, &a), PDX_OK);
        int fd = pdx_agent_event_fd(a);
        assert_true(fd >= 0);
        assert_int_equal(epoll_members(fd), 1); /* its eventfd */
        pdx_option_t tls = {"tls", "sm"};
        assert_int_equal(pdx_backend_create(a, "ucx", &tls, 1, NULL),
                         PDX_OK);
        assert_int_equal(epoll_members(fd), 2); /* and ucx's event fd */
        assert_int_equal(pdx_backend_create(a, "cma", NULL, 0, NULL),
                         PDX_OK);
        assert_int_equal(epoll_members(fd), 2); /* cma has none */
        pdx_agent_destroy(a);
    }
}

/* A module's ops table with its post slowed by `slow_ns` (the wrapped
 * post sleeps, then posts), to give one of two paths a known cost. */
static pdx_backend_ops_t slow_ops[2];
static const pdx_backend_ops_t *real_ops[2];
static long slow_ns[2];

static pdx_status_t slow_post(int i, void *be, void *peer, pdx_xfer_op_t op,
                              const pdx_backend_iov_t *iov, size_t n,
                              const void *notif, size_t notif_len,
                              void **req_p)
{
    struct timespec ts = {0, slow_ns[i]};
    nanosleep(&ts, NULL);
    return real_ops[i]->xfer_post(be, peer, op, iov, n, notif, notif_len,
                                  req_p);
}
static pdx_status_t slow_post0(void *be, void *peer, pdx_xfer_op_t op,
                               const pdx_backend_iov_t *iov, size_t n,
                               const void *notif, size_t notif_len,
                               void **req_p)
{
    return slow_post(0, be, peer, op, iov, n, notif, notif_len, req_p);
}
static pdx_status_t slow_post1(void *be, void *peer, pdx_xfer_op_t op,
                               const pdx_backend_iov_t *iov, size_t n,
                               const void *notif, size_t notif_len,
                               void **req_p)
{
    return slow_post(1, be, peer, op, iov, n, notif, notif_len, req_p);
}

/* slow_ops[i]: module `path`'s table with a post `ns` slower. */
static const pdx_backend_ops_t *slowed(int i, const char *path, long ns)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    real_ops[i] = dlsym(h, "pdx_backend_v1");
    assert_non_null(real_ops[i]);
    slow_ops[i] = *real_ops[i];
    slow_ops[i].xfer_post = i == 0 ? slow_post0 : slow_post1;
    slow_ns[i] = ns;
    return &slow_ops[i];
}

/* An initiator with ucx and cma, one of them slowed by 2 ms per post. */
static pdx_agent_h cost_agent(const char *name, bool slow_cma)
{
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    pdx_agent_h a;
    assert_int_equal(pdx_agent_create(name, &ap, &a), PDX_OK);
    pdx_option_t tls = {"tls", "sm"};
    if (slow_cma) {
        assert_int_equal(pdx_backend_create(a, "ucx", &tls, 1, NULL),
                         PDX_OK);
        assert_int_equal(pdx_backend_create_with_ops(
                             a, slowed(0, CMA_MODULE, 2000000), NULL, 0,
                             NULL),
                         PDX_OK);
    } else {
        assert_int_equal(pdx_backend_create_with_ops(
                             a, slowed(1, UCX_MODULE, 2000000), &tls, 1,
                             NULL),
                         PDX_OK);
        assert_int_equal(pdx_backend_create(a, "cma", NULL, 0, NULL),
                         PDX_OK);
    }
    return a;
}

/* READs of 64 KiB from P's private memory until the class has settled
 * (two calibration runs of PDX_PATH_RUN posts, then posts on the chosen
 * one; bounded: 96 requests), every byte checked; the last telemetry
 * out. */
static void settle(pdx_agent_h d, unsigned char *dst, const unsigned char *src,
                   pdx_xfer_telemetry_t *t)
{
    int i;
    for (i = 0; i < 96; i++) {
        size_t off = (size_t)(i % 16) * 65536;
        memset(dst + off, 0, 65536);
        assert_int_equal(read_once(d, dst + off, src + off, 65536, t),
                         PDX_OK);
        assert_memory_equal(dst + off, src + off, 65536);
        if (i >= 40 /* 2 x PDX_PATH_RUN (16), and 8 */ &&
            strncmp(t->fallback_why, "cost: ", 6) == 0) {
            break;
        }
    }
    printf("after %d reads: backend %s, transport %s (%s)\n", i + 1,
           t->backend, t->transport, t->fallback_why);
}

static void test_cost_choice(void **state)
{
    (void)state;
    pdx_agent_h p = agent("path-p", true, PDX_PATH_POLICY_ANY, NULL);
    unsigned char *priv = malloc(LEN), *shared;
    assert_non_null(priv);
    assert_int_equal(pdx_mem_alloc(LEN, PDX_MEM_F_POPULATE, (void **)&shared),
                     PDX_OK);
    for (size_t i = 0; i < LEN; i++) {
        priv[i] = (unsigned char)(i * 7 + 3);
        shared[i] = (unsigned char)(i * 13 + 1);
    }
    pdx_mem_reg_h r1, r2;
    assert_int_equal(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)priv, LEN,
                                      0, 0, &r1),
                     PDX_OK);
    assert_int_equal(pdx_mem_register(p, PDX_MEM_DRAM, (uintptr_t)shared,
                                      LEN, 0, 0, &r2),
                     PDX_OK);
    unsigned char *dst = calloc(1, LEN);
    assert_non_null(dst);
    pdx_xfer_telemetry_t t;
    for (int slow_cma = 1; slow_cma >= 0; slow_cma--) {
        pdx_agent_h d = cost_agent(slow_cma ? "path-sc" : "path-su",
                                   slow_cma);
        pdx_mem_reg_h rd;
        assert_int_equal(pdx_mem_register(d, PDX_MEM_DRAM, (uintptr_t)dst,
                                          LEN, 0, 0, &rd),
                         PDX_OK);
        load(d, p);
        load(p, d);
        settle(d, dst, priv, &t);
        const char *want = slow_cma ? "cost: ucx " : "cost: cma (process_vm) ";
        assert_non_null(strstr(t.fallback_why, want));
        assert_string_equal(t.backend, slow_cma ? "ucx" : "cma");
        assert_true(t.fallback);
        assert_non_null(strstr(t.fallback_why, "not shared memory"));
        /* The path report has it too (pdx-info --stats). */
        char *js = NULL;
        assert_int_equal(pdx_stats_json(d, &js), PDX_OK);
        assert_non_null(strstr(js, "\"path_costs\": [{\"choice\": \"cost: "));
        pdx_blob_free(js);
        /* The shared region keeps the fast path: no class, no cost. */
        if (!slow_cma) {
            assert_int_equal(read_once(d, dst, shared, 65536, &t), PDX_OK);
            assert_memory_equal(dst, shared, 65536);
            assert_string_equal(t.backend, "cma");
            assert_string_equal(t.transport, "memcpy");
            assert_false(t.fallback);
        }
        pdx_agent_destroy(d);
    }

    /* Pinned: the param, then the environment. */
    for (int env = 0; env < 2; env++) {
        pdx_agent_params_t ap = {
            .field_mask = PDX_AGENT_PARAM_FLAGS |
                          (env ? 0 : PDX_AGENT_PARAM_PATH_BACKEND),
            .flags = PDX_AGENT_F_PROGRESS_THREAD,
            .path_backend = "ucx"};
        if (env) {
            setenv("PDX_PATH_BACKEND", "cma", 1);
        }
        pdx_agent_h d;
        assert_int_equal(pdx_agent_create(env ? "path-pe" : "path-pp", &ap,
                                          &d),
                         PDX_OK);
        unsetenv("PDX_PATH_BACKEND");
        pdx_option_t tls = {"tls", "sm"};
        assert_int_equal(pdx_backend_create(d, "ucx", &tls, 1, NULL), PDX_OK);
        assert_int_equal(pdx_backend_create(d, "cma", NULL, 0, NULL), PDX_OK);
        pdx_mem_reg_h rd;
        assert_int_equal(pdx_mem_register(d, PDX_MEM_DRAM, (uintptr_t)dst,
                                          LEN, 0, 0, &rd),
                         PDX_OK);
        load(d, p);
        load(p, d);
        const char *pin = env ? "cma" : "ucx";
        for (int i = 0; i < 12; i++) {
            memset(dst, 0, 65536);
            assert_int_equal(read_once(d, dst, priv, 65536, &t), PDX_OK);
            assert_memory_equal(dst, priv, 65536);
            assert_string_equal(t.backend, pin);
            assert_null(strstr(t.fallback_why, "cost"));
            assert_null(strstr(t.fallback_why, "calibrating"));
        }
        assert_int_equal(read_once(d, dst, shared, 65536, &t), PDX_OK);
        assert_memory_equal(dst, shared, 65536);
        printf("pinned %s: shared target over %s %s\n", pin, t.backend,
               t.transport);
        assert_string_equal(t.backend, pin);
        pdx_agent_destroy(d);
    }
    pdx_agent_destroy(p);
    assert_int_equal(pdx_mem_free(shared), PDX_OK);
    free(priv);
    free(dst);
}

int main(void)
{
    pdx_log_set_handler(quiet, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_cost_choice),
        cmocka_unit_test(test_agent_fd_watches_backends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
