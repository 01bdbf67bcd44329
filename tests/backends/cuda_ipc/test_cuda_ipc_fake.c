/* cuda_ipc backend logic against the fake driver (fake_cuda.h): the real
 * loader (dlopen by PDX_CUDA_DRIVER_LIB), registration, keys, the IPC open
 * cache, copies of every kind, completion by events, context discipline and
 * that every driver object is given back. Two backend instances in one
 * process get different identities so they talk as two processes would. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include <cuda.h>

#include "cuda_ipc_ops_int.h"
#include "fake_cuda.h"

static const pdx_backend_ops_t *ops = &pdx_cuda_ipc_ops;
static cu_api_t g_api;

static void on_notif(void *ctx, const char *peer, const void *msg, size_t len)
{
}

static void on_error(void *ctx, const char *peer, pdx_status_t why) {}

static const pdx_backend_host_t host1 = {NULL, "agent-1", "host-1", on_notif,
                                         on_error};
static const pdx_backend_host_t host2 = {NULL, "agent-2", "host-2", on_notif,
                                         on_error};

static void *mk_on(const pdx_backend_host_t *h, pid_t pid, uint64_t token)
{
    cipc_ident_t id = {pid, token};
    void *be = NULL;
    assert_int_equal(cipc_create_with_api(h, NULL, 0, &g_api, &id, &be),
                     PDX_OK);
    return be;
}

static void *mk(pid_t pid)
{
    return mk_on(&host1, pid, (uint64_t)pid * 7);
}

static void check_depth(void)
{
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.ctx_depth, 0);
}

static void check_all_released(void)
{
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.ctx_depth, 0);
    assert_int_equal(s.ctx_retained, 0);
    assert_int_equal(s.streams, 0);
    assert_int_equal(s.events, 0);
    assert_int_equal(s.ipc_opens, 0);
    assert_int_equal(s.host_regs, 0);
}

/* ---- "device" memory helpers (through the fake's own API) ------------- */

static void push(int ordinal)
{
    CUdevice d;
    CUcontext c;
    assert_int_equal(cuDeviceGet(&d, ordinal), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
    assert_int_equal(cuCtxPushCurrent(c), CUDA_SUCCESS);
}

static void pop(int ordinal)
{
    CUdevice d;
    assert_int_equal(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGet(&d, ordinal), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRelease(d), CUDA_SUCCESS);
}

static uint8_t pat(uint64_t seed, uint64_t off)
{
    uint64_t x =
        (seed + 1) * 0x9e3779b97f4a7c15ull + off * 0xbf58476d1ce4e5b9ull;
    return (uint8_t)(x >> 56);
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i++) {
        p[i] = pat(seed, i);
    }
}

static CUdeviceptr dalloc(int ordinal, size_t size, uint64_t seed)
{
    CUdeviceptr p;
    uint8_t *h = malloc(size);
    fill(h, size, seed);
    push(ordinal);
    assert_int_equal(cuMemAlloc(&p, size), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD(p, h, size), CUDA_SUCCESS);
    pop(ordinal);
    free(h);
    return p;
}

static void dfree(CUdeviceptr p)
{
    push(0);
    assert_int_equal(cuMemFree(p), CUDA_SUCCESS);
    pop(0);
}

static void dread(CUdeviceptr p, void *dst, size_t len)
{
    push(0);
    assert_int_equal(cuMemcpyDtoH(dst, p, len), CUDA_SUCCESS);
    pop(0);
}

/* ---- backend helpers -------------------------------------------------- */

static void *reg(void *be, pdx_mem_type_t t, uint64_t addr, uint64_t len,
                 uint32_t dev, uint64_t flags)
{
    pdx_region_t r = {.addr = addr,
                      .len = len,
                      .dev_id = dev,
                      .mem_type = t,
                      .flags = flags,
                      .shm_fd = -1};
    void *md = NULL;
    assert_int_equal(ops->mem_register(be, &r, &md), PDX_OK);
    check_depth();
    return md;
}

static void *connect_to(void *be, void *other)
{
    void *ci, *peer = NULL;
    size_t cl;
    assert_int_equal(ops->conn_info(other, &ci, &cl), PDX_OK);
    assert_int_equal(ops->peer_connect(be, "other", ci, cl, &peer), PDX_OK);
    free(ci);
    return peer;
}

static void *load(void *be, void *peer, void *owner, void *md, uint64_t addr,
                  uint64_t len)
{
    void *key, *rmd = NULL;
    size_t kl;
    assert_int_equal(ops->mem_pack(owner, md, &key, &kl), PDX_OK);
    pdx_region_t r = {.addr = addr,
                      .len = len,
                      .dev_id = 0,
                      .mem_type = PDX_MEM_VRAM,
                      .flags = 0,
                      .shm_fd = -1};
    assert_int_equal(ops->rmem_load(be, peer, &r, key, kl, &rmd), PDX_OK);
    free(key);
    check_depth();
    return rmd;
}

/* Post and drive to completion; checks that completion is not reported
 * before the events say so. */
static void run_xfer(void *be, void *peer, pdx_xfer_op_t op,
                     const pdx_backend_iov_t *iov, size_t n)
{
    void *req = NULL;
    pdx_status_t st = ops->xfer_post(be, peer, op, iov, n, "n", 1, &req);
    check_depth();
    assert_int_equal(st, PDX_INPROGRESS);
    int spins = 0;
    while ((st = ops->xfer_check(be, req)) == PDX_INPROGRESS) {
        assert_true(++spins < 1000);
    }
    check_depth();
    assert_int_equal(st, PDX_OK);
    assert_true(spins >= 1); /* the fake reports NOT_READY once */
    ops->xfer_release(be, req);
}

static int setup(void **state)
{
    setenv("PDX_CUDA_DRIVER_LIB", FAKE_CUDA_LIB, 1);
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    unsetenv("FAKE_CUDA_VISIBLE");
    char why[128];
    if (cu_api_load(&g_api, why, sizeof(why)) != PDX_OK) {
        fprintf(stderr, "loading the fake driver: %s\n", why);
        return -1;
    }
    return cuInit(0) == CUDA_SUCCESS ? 0 : -1;
}

static int strict_on(void **state)
{
    fake_cuda_strict(1);
    return 0;
}

static int strict_off(void **state)
{
    fake_cuda_strict(0);
    return 0;
}

/* ---- tests ------------------------------------------------------------ */

static void test_loader_names_and_query(void **state)
{
    /* Every entry point resolved from the fake, which exports the names
     * cuda.h maps to: the _v2 names where cuda.h says so. */
    assert_non_null(g_api.MemGetAddressRange);
    assert_non_null(g_api.CtxPushCurrent);
    assert_true(cu_api_has_vmm(&g_api));
    char why[128] = "x";
    assert_int_equal(ops->query(why, sizeof(why)), PDX_OK);
    assert_string_equal(why, "");
    assert_int_equal(ops->query(NULL, 0), PDX_OK);
}

static void test_no_device_no_driver_too_old(void **state)
{
    char why[128];
    void *be = NULL;
    setenv("FAKE_CUDA_DEVICES", "0", 1);
    assert_int_equal(ops->query(why, sizeof(why)), PDX_ERR_UNAVAILABLE);
    assert_string_equal(why, "no CUDA device");
    assert_int_equal(ops->create(&host1, NULL, 0, &be), PDX_ERR_UNAVAILABLE);
    assert_null(be);
    setenv("FAKE_CUDA_DEVICES", "2", 1);

    setenv("PDX_CUDA_DRIVER_LIB", "/nonexistent/libcuda.so.1", 1);
    assert_int_equal(ops->query(why, sizeof(why)), PDX_ERR_UNAVAILABLE);
    assert_string_equal(why, "no CUDA driver");
    assert_int_equal(ops->create(&host1, NULL, 0, &be), PDX_ERR_UNAVAILABLE);

    setenv("PDX_CUDA_DRIVER_LIB", "libc.so.6", 1);
    assert_int_equal(ops->query(why, sizeof(why)), PDX_ERR_UNAVAILABLE);
    assert_string_equal(why, "CUDA driver too old: missing cuGetErrorName");
    setenv("PDX_CUDA_DRIVER_LIB", FAKE_CUDA_LIB, 1);
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_null(be);
    check_all_released();
}

static void test_create_options_describe(void **state)
{
    void *be = NULL;
    pdx_option_t good[] = {{"streams", "2"}};
    assert_int_equal(cipc_create_with_api(&host1, good, 1, &g_api, NULL, &be),
                     PDX_OK);
    char d[512];
    ops->describe(be, d, sizeof(d));
    assert_non_null(strstr(d, "2 device(s)"));
    assert_non_null(strstr(d, "2 streams each"));
    assert_non_null(strstr(d, "0 Fake GPU 0 GPU-a0a1a2a3-a4a5-a6a7-a8a9-"
                              "aaabacadaeaf"));
    assert_non_null(strstr(d, "1 Fake GPU 1 GPU-b0b1"));
    char tiny[8];
    ops->describe(be, tiny, sizeof(tiny));
    assert_int_equal(strlen(tiny), 7);
    assert_int_equal(ops->notif_send(be, NULL, "x", 1), PDX_ERR_UNSUPPORTED);
    assert_int_equal(ops->event_fd(be), -1);
    assert_int_equal(ops->arm(be), PDX_ERR_UNSUPPORTED);
    assert_int_equal(ops->progress(be), 0);
    ops->destroy(be);

    pdx_option_t bad[][1] = {{{"streams", "0"}},  {{"streams", "65"}},
                         {{"streams", "2x"}}, {{"streams", ""}},
                         {{"bogus", "1"}},    {{NULL, "1"}}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        be = NULL;
        assert_int_equal(
            cipc_create_with_api(&host1, bad[i], 1, &g_api, NULL, &be),
            PDX_ERR_CONFIG);
        assert_null(be);
    }
    pdx_backend_host_t nohost = host1;
    nohost.host_id = "";
    assert_int_equal(cipc_create_with_api(&nohost, NULL, 0, &g_api, NULL, &be),
                     PDX_ERR_INVALID);
    nohost.host_id = NULL;
    assert_int_equal(cipc_create_with_api(&nohost, NULL, 0, &g_api, NULL, &be),
                     PDX_ERR_INVALID);
    check_all_released();
}

static void test_peer_connect_rules(void **state)
{
    void *a = mk(1001);
    void *b = mk_on(&host2, 1002, 5);
    void *ci, *peer = NULL;
    size_t cl;
    assert_int_equal(ops->conn_info(b, &ci, &cl), PDX_OK);
    /* another host: declined, the agent uses UCX */
    assert_int_equal(ops->peer_connect(a, "b", ci, cl, &peer),
                     PDX_ERR_UNSUPPORTED);
    assert_int_equal(ops->peer_connect(a, "b", ci, cl / 2, &peer),
                     PDX_ERR_CORRUPT);
    ((uint8_t *)ci)[4] = 2;
    assert_int_equal(ops->peer_connect(a, "b", ci, cl, &peer), PDX_ERR_VERSION);
    free(ci);
    assert_null(peer);

    /* same host, none of its devices visible here: accepted (its memory
     * is reached through peer access) */
    cipc_conn_t *c = calloc(1, sizeof(*c));
    snprintf(c->host_id, sizeof(c->host_id), "host-1");
    c->pid = 77;
    c->ndev = 1;
    fake_cuda_uuid(5, c->uuid[0]);
    assert_int_equal(cipc_conn_encode(c, &ci, &cl), PDX_OK);
    assert_int_equal(ops->peer_connect(a, "c", ci, cl, &peer), PDX_OK);
    ops->peer_disconnect(a, peer);
    free(ci);
    free(c);
    ops->destroy(b);
    ops->destroy(a);
    check_all_released();
}

/* P and D as two processes on one host: legacy IPC, arenas carved from one
 * allocation, READ into one GPU and WRITE from the other. */
static void test_legacy_ipc_read_write(void **state)
{
    const size_t asz = 1 << 20, half = asz / 2, blk = 4096, nb = 64;
    void *p = mk(2001), *d = mk(2002);
    CUdeviceptr pm = dalloc(0, asz, 1);
    CUdeviceptr d0 = dalloc(0, nb * blk, 2), d1 = dalloc(1, nb * blk, 3);
    void *pa0 = reg(p, PDX_MEM_VRAM, pm, half, 0, 0);
    void *pa1 = reg(p, PDX_MEM_VRAM, pm + half, half, 0, 0);
    void *md0 = reg(d, PDX_MEM_VRAM, d0, nb * blk, 0, 0);
    void *md1 = reg(d, PDX_MEM_VRAM, d1, nb * blk, 1, 0);

    void *peer = connect_to(d, p);
    void *r0 = load(d, peer, p, pa0, pm, half);
    void *r1 = load(d, peer, p, pa1, pm + half, half);
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.ipc_opens, 1); /* one allocation, opened once */

    /* READ: block i of D's dev-0 buffer <- a scattered block of P's. */
    pdx_backend_iov_t iov[64];
    uint64_t src_off[64];
    for (size_t i = 0; i < nb; i++) {
        src_off[i] = ((i * 37) % (asz / blk)) * blk;
        iov[i].local_addr = d0 + i * blk;
        iov[i].remote_addr = pm + src_off[i];
        iov[i].len = blk;
        iov[i].local_md = md0;
        iov[i].remote_md = src_off[i] < half ? r0 : r1;
    }
    run_xfer(d, peer, PDX_XFER_READ, iov, nb);
    uint8_t *got = malloc(asz), *want = malloc(asz);
    dread(d0, got, nb * blk);
    for (size_t i = 0; i < nb; i++) {
        for (size_t j = 0; j < blk; j++) {
            want[i * blk + j] = pat(1, src_off[i] + j);
        }
    }
    assert_memory_equal(got, want, nb * blk);

    /* WRITE from D's dev-1 buffer: cross-GPU, cuMemcpyPeerAsync. */
    fake_cuda_stats(&s);
    long peer_before = s.peer_copies;
    for (size_t i = 0; i < nb; i++) {
        iov[i].local_addr = d1 + i * blk;
        iov[i].local_md = md1;
    }
    run_xfer(d, peer, PDX_XFER_WRITE, iov, nb);
    fake_cuda_stats(&s);
    assert_int_equal(s.peer_copies - peer_before, nb);
    dread(pm, got, asz);
    fill(want, asz, 1);
    for (size_t i = 0; i < nb; i++) {
        for (size_t j = 0; j < blk; j++) {
            want[src_off[i] + j] = pat(3, i * blk + j);
        }
    }
    assert_memory_equal(got, want, asz);

    ops->rmem_unload(d, r0);
    ops->rmem_unload(d, r1);
    fake_cuda_stats(&s);
    assert_int_equal(s.ipc_opens, 1); /* cached until disconnect */
    ops->peer_disconnect(d, peer);
    check_depth();
    fake_cuda_stats(&s);
    assert_int_equal(s.ipc_opens, 0);
    ops->mem_deregister(d, md0);
    ops->mem_deregister(d, md1);
    ops->mem_deregister(p, pa0);
    ops->mem_deregister(p, pa1);
    ops->destroy(d);
    ops->destroy(p);
    dfree(pm);
    dfree(d0);
    dfree(d1);
    free(got);
    free(want);
    check_all_released();
}

static int pidfd_works(void)
{
    int fd = dup(0);
    int got = cu_pidfd_getfd(getpid(), fd);
    int ok = got >= 0;
    if (!ok) {
        fprintf(stderr, "pidfd_getfd: %s\n", strerror(errno));
    } else {
        close(got);
    }
    close(fd);
    return ok;
}

static CUdeviceptr vmm_alloc(int ordinal, size_t size, unsigned types,
                             CUmemGenericAllocationHandle *h_p)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)types;
    CUdeviceptr va;
    assert_int_equal(cuMemCreate(h_p, size, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va, size, 0, *h_p, 0), CUDA_SUCCESS);
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, ordinal},
                           CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(cuMemSetAccess(va, size, &acc, 1), CUDA_SUCCESS);
    uint8_t *h = malloc(size);
    fill(h, size, 9);
    push(ordinal);
    assert_int_equal(cuMemcpyHtoD(va, h, size), CUDA_SUCCESS);
    pop(ordinal);
    free(h);
    return va;
}

static void vmm_free(CUdeviceptr va, size_t size,
                     CUmemGenericAllocationHandle h)
{
    assert_int_equal(cuMemUnmap(va, size), CUDA_SUCCESS);
    assert_int_equal(cuMemAddressFree(va, size), CUDA_SUCCESS);
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
}

/* VMM memory exported as a POSIX fd, fetched by the peer with pidfd_getfd
 * (here from this very process, under another identity). */
static void test_vmm_fd(void **state)
{
    if (!pidfd_works()) {
        print_message("cuda_ipc: pidfd_getfd refused here; VMM path not "
                      "exercised\n");
        skip();
    }
    const size_t sz = 1 << 20, blk = 8192;
    CUmemGenericAllocationHandle h, h2;
    CUdeviceptr va =
        vmm_alloc(1, sz, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &h);
    /* Both use the real pid (pidfd_getfd needs it) with other tokens. */
    void *p = mk_on(&host1, getpid(), 999);
    void *d = mk_on(&host1, getpid(), 12345);
    void *pmd = reg(p, PDX_MEM_VRAM, va + blk, sz - blk, 1, 0);
    CUdeviceptr dm = dalloc(1, 4 * blk, 4);
    void *dmd = reg(d, PDX_MEM_VRAM, dm, 4 * blk, 1, 0);
    void *peer = connect_to(d, p);
    void *r = load(d, peer, p, pmd, va + blk, sz - blk);
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.vmm_maps, 2); /* ours and the peer's import */

    pdx_backend_iov_t iov[4];
    for (size_t i = 0; i < 4; i++) {
        iov[i] = (pdx_backend_iov_t){dm + i * blk, va + (10 + 3 * i) * blk, blk,
                                     dmd, r};
    }
    run_xfer(d, peer, PDX_XFER_READ, iov, 4);
    uint8_t got[4 * 8192], want[4 * 8192];
    dread(dm, got, sizeof(got));
    for (size_t i = 0; i < 4; i++) {
        for (size_t j = 0; j < blk; j++) {
            want[i * blk + j] = pat(9, (10 + 3 * i) * blk + j);
        }
    }
    assert_memory_equal(got, want, sizeof(got));

    ops->rmem_unload(d, r);
    ops->peer_disconnect(d, peer);
    fake_cuda_stats(&s);
    assert_int_equal(s.vmm_maps, 1);
    ops->mem_deregister(d, dmd);
    ops->mem_deregister(p, pmd);
    ops->destroy(d);
    ops->destroy(p);
    vmm_free(va, sz, h);
    fake_cuda_stats(&s);
    assert_int_equal(s.vmm_handles, 0); /* the exported fd was closed too */

    /* Not created shareable as an fd: refused with a reason. */
    va = vmm_alloc(0, sz, 0, &h2);
    p = mk(3003);
    pdx_region_t rg = {.addr = va,
                       .len = sz,
                       .dev_id = 0,
                       .mem_type = PDX_MEM_VRAM,
                       .flags = 0,
                       .shm_fd = -1};
    void *md = NULL;
    assert_int_equal(ops->mem_register(p, &rg, &md), PDX_ERR_UNSUPPORTED);
    check_depth();
    ops->destroy(p);
    vmm_free(va, sz, h2);
    ops->destroy(NULL);
    dfree(dm);
    check_all_released();
}

/* D's DRAM (pinned) <-> P's VRAM; and a DRAM key is not loadable. */
static void test_dram_pinned(void **state)
{
    const size_t sz = 256 * 1024;
    void *p = mk(4001), *d = mk(4002);
    CUdeviceptr pm = dalloc(1, sz, 5);
    void *pmd = reg(p, PDX_MEM_VRAM, pm, sz, 1, 0);
    uint8_t *host = aligned_alloc(4096, sz), *host2 = aligned_alloc(4096, sz);
    memset(host, 0, sz);
    void *hmd = reg(d, PDX_MEM_DRAM, (uintptr_t)host, sz, 0, PDX_REGION_F_PIN);
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.host_regs, 1);
    /* memory the application pinned itself stays pinned after deregister */
    push(0);
    assert_int_equal(cuMemHostRegister(host2, sz, 0), CUDA_SUCCESS);
    pop(0);
    void *h2md =
        reg(d, PDX_MEM_DRAM, (uintptr_t)host2, sz, 0, PDX_REGION_F_PIN);
    ops->mem_deregister(d, h2md);
    fake_cuda_stats(&s);
    assert_int_equal(s.host_regs, 2);
    push(0);
    assert_int_equal(cuMemHostUnregister(host2), CUDA_SUCCESS);
    pop(0);

    void *peer = connect_to(d, p);
    void *r = load(d, peer, p, pmd, pm, sz);
    pdx_backend_iov_t iov = {(uintptr_t)host + 4096, pm + 65536, 100000, hmd,
                             r};
    run_xfer(d, peer, PDX_XFER_READ, &iov, 1);
    for (size_t j = 0; j < 100000; j++) {
        if (host[4096 + j] != pat(5, 65536 + j)) {
            fail_msg("byte %zu differs", j);
        }
    }
    fill(host, sz, 6);
    iov.remote_addr = pm;
    run_xfer(d, peer, PDX_XFER_WRITE, &iov, 1);
    uint8_t *got = malloc(sz);
    dread(pm, got, sz);
    for (size_t j = 0; j < 100000; j++) {
        if (got[j] != pat(6, 4096 + j)) {
            fail_msg("byte %zu differs after WRITE", j);
        }
    }
    assert_int_equal(got[100000], pat(5, 100000));

    /* P loading D's DRAM key: it loads (the agent fails a whole peer on
     * any key it cannot load, though UCX reaches DRAM), but a transfer
     * through it is refused, with nothing in flight. */
    void *ppeer = connect_to(p, d);
    void *key, *rmd = NULL, *req = NULL;
    size_t kl;
    assert_int_equal(ops->mem_pack(d, hmd, &key, &kl), PDX_OK);
    pdx_region_t rg = {.addr = (uintptr_t)host,
                       .len = sz,
                       .dev_id = 0,
                       .mem_type = PDX_MEM_DRAM,
                       .flags = 0,
                       .shm_fd = -1};
    pdx_region_t as_vram = {.addr = (uintptr_t)host,
                            .len = sz,
                            .dev_id = 0,
                            .mem_type = PDX_MEM_VRAM,
                            .flags = 0,
                            .shm_fd = -1};
    assert_int_equal(ops->rmem_load(p, ppeer, &as_vram, key, kl, &rmd),
                     PDX_ERR_INVALID);
    assert_int_equal(ops->rmem_load(p, ppeer, &rg, key, kl, &rmd), PDX_OK);
    free(key);
    fake_cuda_stats(&s);
    long copies = s.copies;
    pdx_backend_iov_t to_dram = {pm, (uintptr_t)host, 64, pmd, rmd};
    assert_int_equal(
        ops->xfer_post(p, ppeer, PDX_XFER_WRITE, &to_dram, 1, NULL, 0, &req),
        PDX_ERR_UNSUPPORTED);
    fake_cuda_stats(&s);
    assert_int_equal(s.copies, copies);
    ops->rmem_unload(p, rmd);
    ops->peer_disconnect(p, ppeer);

    ops->rmem_unload(d, r);
    ops->peer_disconnect(d, peer);
    ops->mem_deregister(d, hmd);
    ops->mem_deregister(p, pmd);
    ops->destroy(d);
    ops->destroy(p);
    dfree(pm);
    free(got);
    free(host);
    free(host2);
    check_all_released();
}

static void test_register_errors(void **state)
{
    void *p = mk(5001);
    CUdeviceptr m = dalloc(0, 65536, 1);
    uint8_t host[64];
    struct {
        pdx_region_t r;
        pdx_status_t want;
    } cases[] = {
        {{.addr = m,
          .len = 4096,
          .dev_id = 1,
          .mem_type = PDX_MEM_VRAM,
          .flags = 0,
          .shm_fd = -1},
         PDX_ERR_INVALID}, /* wrong device */
        {{.addr = m,
          .len = 4096,
          .dev_id = 7,
          .mem_type = PDX_MEM_VRAM,
          .flags = 0,
          .shm_fd = -1},
         PDX_ERR_INVALID}, /* no device 7 */
        {{.addr = (uintptr_t)host,
          .len = 64,
          .dev_id = 0,
          .mem_type = PDX_MEM_VRAM,
          .flags = 0,
          .shm_fd = -1},
         PDX_ERR_INVALID},
        {{.addr = m + 4096,
          .len = 65536,
          .dev_id = 0,
          .mem_type = PDX_MEM_VRAM,
          .flags = 0,
          .shm_fd = -1},
         PDX_ERR_UNSUPPORTED},
        {{.addr = m,
          .len = 0,
          .dev_id = 0,
          .mem_type = PDX_MEM_VRAM,
          .flags = 0,
          .shm_fd = -1},
         PDX_ERR_INVALID},
        {{.addr = 0,
          .len = 64,
          .dev_id = 0,
          .mem_type = PDX_MEM_DRAM,
          .flags = 0,
          .shm_fd = -1},
         PDX_ERR_INVALID},
        {{.addr = m, .len = 64, .mem_type = (pdx_mem_type_t)9, .shm_fd = -1},
         PDX_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        void *md = NULL;
        pdx_status_t st = ops->mem_register(p, &cases[i].r, &md);
        if (st != cases[i].want) {
            fail_msg("case %zu: %d, want %d", i, st, cases[i].want);
        }
        assert_null(md);
        check_depth();
    }
    ops->destroy(p);
    dfree(m);
    check_all_released();
}

static void test_rmem_load_errors(void **state)
{
    void *p = mk(6001), *d = mk(6002), *c = mk(6003);
    CUdeviceptr m = dalloc(0, 65536, 1);
    void *md = reg(p, PDX_MEM_VRAM, m, 65536, 0, 0);
    void *peer = connect_to(d, p), *cpeer = connect_to(d, c);
    void *key, *rmd = NULL;
    size_t kl;
    assert_int_equal(ops->mem_pack(p, md, &key, &kl), PDX_OK);
    pdx_region_t good = {.addr = m,
                         .len = 65536,
                         .dev_id = 0,
                         .mem_type = PDX_MEM_VRAM,
                         .flags = 0,
                         .shm_fd = -1};
    pdx_region_t moved = {.addr = m + 64,
                          .len = 65536,
                          .dev_id = 0,
                          .mem_type = PDX_MEM_VRAM,
                          .flags = 0,
                          .shm_fd = -1};
    pdx_region_t shorter = {.addr = m,
                            .len = 4096,
                            .dev_id = 0,
                            .mem_type = PDX_MEM_VRAM,
                            .flags = 0,
                            .shm_fd = -1};
    assert_int_equal(ops->rmem_load(d, peer, &moved, key, kl, &rmd),
                     PDX_ERR_INVALID);
    assert_int_equal(ops->rmem_load(d, peer, &shorter, key, kl, &rmd),
                     PDX_ERR_INVALID);
    /* P's key handed over as if it were C's */
    assert_int_equal(ops->rmem_load(d, cpeer, &good, key, kl, &rmd),
                     PDX_ERR_INVALID);
    assert_int_equal(ops->rmem_load(d, peer, &good, key, kl - 1, &rmd),
                     PDX_ERR_CORRUPT);
    assert_null(rmd);
    free(key);
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.ipc_opens, 0);
    check_depth();
    ops->peer_disconnect(d, peer);
    ops->peer_disconnect(d, cpeer);
    ops->mem_deregister(p, md);
    ops->destroy(c);
    ops->destroy(d);
    ops->destroy(p);
    dfree(m);
    check_all_released();
}

static void test_xfer_errors_and_release(void **state)
{
    void *p = mk(7001), *d = mk(7002), *c = mk(7003);
    CUdeviceptr pm = dalloc(0, 65536, 1), dm = dalloc(0, 65536, 2);
    CUdeviceptr cm = dalloc(0, 4096, 3);
    void *pmd = reg(p, PDX_MEM_VRAM, pm, 65536, 0, 0);
    void *cmd = reg(c, PDX_MEM_VRAM, cm, 4096, 0, 0);
    void *dmd = reg(d, PDX_MEM_VRAM, dm, 65536, 0, 0);
    void *peer = connect_to(d, p), *cpeer = connect_to(d, c);
    void *r = load(d, peer, p, pmd, pm, 65536);
    void *cr = load(d, cpeer, c, cmd, cm, 4096);
    void *req = NULL;
    fake_cuda_stats_t s0, s1;
    fake_cuda_stats(&s0);

    pdx_backend_iov_t bad[] = {
        {dm, pm + 65000, 1000, dmd, r}, /* past the remote region */
        {dm + 65000, pm, 1000, dmd, r}, /* past the local region */
        {dm - 1, pm, 10, dmd, r},       /* before it */
        {dm, cm, 10, dmd, cr},          /* region of another peer */
        {dm, pm, 10, NULL, r},          /* no local region */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdx_backend_iov_t two[2] = {{dm, pm, 64, dmd, r}, bad[i]};
        /* the good first piece was queued; the error waits for it */
        assert_int_equal(
            ops->xfer_post(d, peer, PDX_XFER_READ, two, 2, NULL, 0, &req),
            PDX_ERR_INVALID);
        check_depth();
    }
    assert_int_equal(
        ops->xfer_post(d, peer, (pdx_xfer_op_t)5, bad, 1, NULL, 0, &req),
        PDX_ERR_INVALID);
    /* nothing to do: done at once, no request */
    assert_int_equal(
        ops->xfer_post(d, peer, PDX_XFER_READ, NULL, 0, NULL, 0, &req), PDX_OK);
    pdx_backend_iov_t empty = {dm, pm, 0, dmd, r};
    assert_int_equal(
        ops->xfer_post(d, peer, PDX_XFER_READ, &empty, 1, NULL, 0, &req),
        PDX_OK);
    fake_cuda_stats(&s1);
    assert_int_equal(s1.events, s0.events); /* no event was created */

    /* Release while in flight: the bytes have landed when it returns. */
    pdx_backend_iov_t iov = {dm + 100, pm + 200, 30000, dmd, r};
    assert_int_equal(
        ops->xfer_post(d, peer, PDX_XFER_READ, &iov, 1, NULL, 0, &req),
        PDX_INPROGRESS);
    ops->xfer_release(d, req);
    check_depth();
    uint8_t got[30000];
    dread(dm + 100, got, sizeof(got));
    for (size_t j = 0; j < sizeof(got); j++) {
        if (got[j] != pat(1, 200 + j)) {
            fail_msg("byte %zu not landed at release", j);
        }
    }
    ops->rmem_unload(d, r);
    ops->rmem_unload(d, cr);
    ops->peer_disconnect(d, peer);
    ops->peer_disconnect(d, cpeer);
    ops->mem_deregister(d, dmd);
    ops->mem_deregister(p, pmd);
    ops->mem_deregister(c, cmd);
    ops->destroy(c);
    ops->destroy(d);
    ops->destroy(p);
    dfree(pm);
    dfree(dm);
    dfree(cm);
    check_all_released();
}

/* A peer that is this very process: addresses are used as they are. */
static void test_self_peer(void **state)
{
    void *a = mk(8001);
    CUdeviceptr m = dalloc(1, 65536, 7);
    void *lo = reg(a, PDX_MEM_VRAM, m, 32768, 1, 0);
    void *hi = reg(a, PDX_MEM_VRAM, m + 32768, 32768, 1, 0);
    void *self = connect_to(a, a);
    void *r = load(a, self, a, hi, m + 32768, 32768);
    fake_cuda_stats_t s;
    fake_cuda_stats(&s);
    assert_int_equal(s.ipc_opens, 0);
    pdx_backend_iov_t iov = {m, m + 32768 + 1000, 5000, lo, r};
    run_xfer(a, self, PDX_XFER_READ, &iov, 1);
    uint8_t got[5000];
    dread(m, got, sizeof(got));
    for (size_t j = 0; j < sizeof(got); j++) {
        assert_int_equal(got[j], pat(7, 32768 + 1000 + j));
    }
    ops->rmem_unload(a, r);
    ops->peer_disconnect(a, self);
    ops->mem_deregister(a, lo);
    ops->mem_deregister(a, hi);
    ops->destroy(a);
    dfree(m);
    check_all_released();
}

/* 100000 pieces: one copy per merged run, spread over the stream pool. */
static void test_many_pieces(void **state)
{
    const size_t n = 100000, blk = 64, sz = n * blk;
    void *p = mk(9001), *d = mk(9002);
    CUdeviceptr pm = dalloc(0, sz, 11), dm = dalloc(0, sz, 12);
    void *pmd = reg(p, PDX_MEM_VRAM, pm, sz, 0, 0);
    void *dmd = reg(d, PDX_MEM_VRAM, dm, sz, 0, 0);
    void *peer = connect_to(d, p);
    void *r = load(d, peer, p, pmd, pm, sz);
    pdx_backend_iov_t *iov = malloc(n * sizeof(*iov));
    /* local i <- remote n-1-i, except runs of 10 kept in order */
    for (size_t i = 0; i < n; i++) {
        size_t src = (i / 10) * 10;
        src = n - 10 - src + (i % 10);
        iov[i] = (pdx_backend_iov_t){dm + i * blk, pm + src * blk, blk, dmd, r};
    }
    fake_cuda_stats_t s0, s1;
    fake_cuda_stats(&s0);
    run_xfer(d, peer, PDX_XFER_READ, iov, n);
    fake_cuda_stats(&s1);
    assert_int_equal(s1.copies - s0.copies, n / 10);
    assert_int_equal(s1.streams, 4); /* the default pool, all used */
    uint8_t *got = malloc(sz);
    dread(dm, got, sz);
    for (size_t i = 0; i < n; i++) {
        size_t src = (iov[i].remote_addr - pm) / blk;
        for (size_t j = 0; j < blk; j++) {
            if (got[i * blk + j] != pat(11, src * blk + j)) {
                fail_msg("piece %zu byte %zu differs", i, j);
            }
        }
    }
    free(got);
    free(iov);
    ops->rmem_unload(d, r);
    ops->peer_disconnect(d, peer);
    ops->mem_deregister(d, dmd);
    ops->mem_deregister(p, pmd);
    ops->destroy(d);
    ops->destroy(p);
    dfree(pm);
    dfree(dm);
    check_all_released();
}

/* P sees GPUs (0,1); D is started with them swapped. P's memory on its
 * ordinal 0 is D's ordinal 1: the key's UUID says so, not the ordinal. */
static void test_uuid_mapping_shuffled(void **state)
{
    const size_t sz = 65536;
    void *p = mk(10001);
    CUdeviceptr pm = dalloc(0, sz, 13); /* P ordinal 0 = physical 0 */
    void *pmd = reg(p, PDX_MEM_VRAM, pm, sz, 0, 0);
    void *key;
    size_t kl;
    assert_int_equal(ops->mem_pack(p, pmd, &key, &kl), PDX_OK);
    void *ci;
    size_t cl;
    assert_int_equal(ops->conn_info(p, &ci, &cl), PDX_OK);

    setenv("FAKE_CUDA_VISIBLE", "1,0", 1);
    void *d = mk(10002); /* cuInit again: D sees physical 1 as ordinal 0 */
    CUdeviceptr dm = dalloc(1, sz, 14); /* D ordinal 1 = physical 0 */
    void *dmd = reg(d, PDX_MEM_VRAM, dm, sz, 1, 0);
    void *peer = NULL, *r = NULL;
    assert_int_equal(ops->peer_connect(d, "p", ci, cl, &peer), PDX_OK);
    pdx_region_t rg = {.addr = pm,
                       .len = sz,
                       .dev_id = 0,
                       .mem_type = PDX_MEM_VRAM,
                       .flags = 0,
                       .shm_fd = -1};
    assert_int_equal(ops->rmem_load(d, peer, &rg, key, kl, &r), PDX_OK);
    fake_cuda_stats_t s0, s1;
    fake_cuda_stats(&s0);
    pdx_backend_iov_t iov = {dm, pm, sz, dmd, r};
    run_xfer(d, peer, PDX_XFER_READ, &iov, 1);
    fake_cuda_stats(&s1);
    /* same physical GPU on both sides: a plain DtoD copy, no peer copy */
    assert_int_equal(s1.peer_copies, s0.peer_copies);
    uint8_t *got = malloc(sz);
    dread(dm, got, sz);
    for (size_t j = 0; j < sz; j++) {
        assert_int_equal(got[j], pat(13, j));
    }
    free(got);
    ops->rmem_unload(d, r);
    ops->peer_disconnect(d, peer);
    ops->mem_deregister(d, dmd);
    ops->destroy(d);
    unsetenv("FAKE_CUDA_VISIBLE");
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    ops->mem_deregister(p, pmd);
    ops->destroy(p);
    dfree(pm);
    dfree(dm);
    free(key);
    free(ci);
    check_all_released();
}

/* D sees only GPU 1; P's memory is on GPU 2, invisible to D: D opens it
 * from its device 0 through peer access and copies there. */
static void test_invisible_device(void **state)
{
    const size_t sz = 65536;
    setenv("FAKE_CUDA_VISIBLE", "0,1,2", 1);
    void *p = mk(11001);
    CUdeviceptr pm = dalloc(2, sz, 15); /* physical 2 */
    void *pmd = reg(p, PDX_MEM_VRAM, pm, sz, 2, 0);
    void *key, *ci;
    size_t kl, cl;
    assert_int_equal(ops->mem_pack(p, pmd, &key, &kl), PDX_OK);
    assert_int_equal(ops->conn_info(p, &ci, &cl), PDX_OK);

    setenv("FAKE_CUDA_VISIBLE", "1", 1);
    void *d = mk(11002);
    CUdeviceptr dm = dalloc(0, sz, 16); /* D ordinal 0 = physical 1 */
    void *dmd = reg(d, PDX_MEM_VRAM, dm, sz, 0, 0);
    void *peer = NULL, *r = NULL;
    assert_int_equal(ops->peer_connect(d, "p", ci, cl, &peer), PDX_OK);
    pdx_region_t rg = {.addr = pm,
                       .len = sz,
                       .dev_id = 2,
                       .mem_type = PDX_MEM_VRAM,
                       .flags = 0,
                       .shm_fd = -1};
    assert_int_equal(ops->rmem_load(d, peer, &rg, key, kl, &r), PDX_OK);
    pdx_backend_iov_t iov = {dm, pm + 4096, 8192, dmd, r};
    run_xfer(d, peer, PDX_XFER_READ, &iov, 1);
    uint8_t got[8192];
    dread(dm, got, sizeof(got));
    for (size_t j = 0; j < sizeof(got); j++) {
        assert_int_equal(got[j], pat(15, 4096 + j));
    }
    ops->rmem_unload(d, r);
    ops->peer_disconnect(d, peer);
    ops->mem_deregister(d, dmd);
    ops->destroy(d);
    dfree(dm);
    setenv("FAKE_CUDA_VISIBLE", "0,1,2", 1);
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    ops->mem_deregister(p, pmd);
    ops->destroy(p);
    dfree(pm);
    unsetenv("FAKE_CUDA_VISIBLE");
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    free(key);
    free(ci);
    check_all_released();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_names_and_query),
        cmocka_unit_test(test_no_device_no_driver_too_old),
        cmocka_unit_test(test_create_options_describe),
        cmocka_unit_test(test_peer_connect_rules),
        cmocka_unit_test_setup_teardown(test_legacy_ipc_read_write, strict_on,
                                        strict_off),
        cmocka_unit_test_setup_teardown(test_vmm_fd, strict_on, strict_off),
        cmocka_unit_test_setup_teardown(test_dram_pinned, strict_on,
                                        strict_off),
        cmocka_unit_test(test_register_errors),
        cmocka_unit_test(test_rmem_load_errors),
        cmocka_unit_test(test_xfer_errors_and_release),
        cmocka_unit_test(test_self_peer),
        cmocka_unit_test_setup_teardown(test_many_pieces, strict_on,
                                        strict_off),
        cmocka_unit_test_setup_teardown(test_uuid_mapping_shuffled, strict_on,
                                        strict_off),
        cmocka_unit_test_setup_teardown(test_invisible_device, strict_on,
                                        strict_off),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
