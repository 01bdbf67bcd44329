/* cuda_ipc module: its one exported table, what query()/create() say on
 * this machine, and a conformance run through the module against the fake
 * driver (always) and a real GPU (skipped, saying why, when there is none).
 * The conformance run is single-process: the peer is this process itself;
 * two-process CUDA IPC is tests/gpu/cuda_ipc_gpu_test.c. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cuda.h>

#include <pdx/backend.h>

static const pdx_backend_ops_t *g_ops;

static void on_notif(void *ctx, const char *peer, const void *msg, size_t len)
{
}

static void on_error(void *ctx, const char *peer, pdx_status_t why) {}

static const pdx_backend_host_t g_host = {NULL, "conf", "conf-host", on_notif,
                                          on_error};

static int setup(void **state)
{
    void *h = dlopen(PDX_CUDA_IPC_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", PDX_CUDA_IPC_MODULE, dlerror());
        return -1;
    }
    g_ops = dlsym(h, PDX_BACKEND_SYMBOL);
    return g_ops != NULL ? 0 : -1;
}

static void test_table(void **state)
{
    assert_int_equal(g_ops->abi_version, PDX_BACKEND_ABI_VERSION);
    assert_int_equal(g_ops->size, sizeof(pdx_backend_ops_t));
    assert_string_equal(g_ops->name, "cuda_ipc");
    assert_int_equal(g_ops->caps, PDX_BACKEND_CAP_DRAM | PDX_BACKEND_CAP_VRAM |
                                      PDX_BACKEND_CAP_READ |
                                      PDX_BACKEND_CAP_WRITE |
                                      PDX_BACKEND_CAP_SAME_HOST);
    /* every op wired */
    const void *opsv[] = {
        (void *)g_ops->query,           (void *)g_ops->create,
        (void *)g_ops->destroy,         (void *)g_ops->conn_info,
        (void *)g_ops->mem_register,    (void *)g_ops->mem_deregister,
        (void *)g_ops->mem_pack,        (void *)g_ops->peer_connect,
        (void *)g_ops->peer_disconnect, (void *)g_ops->rmem_load,
        (void *)g_ops->rmem_unload,     (void *)g_ops->xfer_post,
        (void *)g_ops->xfer_check,      (void *)g_ops->xfer_release,
        (void *)g_ops->notif_send,      (void *)g_ops->progress,
        (void *)g_ops->event_fd,        (void *)g_ops->arm,
        (void *)g_ops->describe,
    };
    for (size_t i = 0; i < sizeof(opsv) / sizeof(opsv[0]); i++) {
        assert_non_null(opsv[i]);
    }
    /* nothing else is exported */
    void *h = dlopen(PDX_CUDA_IPC_MODULE, RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h);
    assert_null(dlsym(h, "pdx_cuda_ipc_ops"));
    assert_null(dlsym(h, "cipc_op_query"));
    assert_null(dlsym(h, "cu_api_load"));
    assert_null(dlsym(h, "cipc_key_decode"));
    dlclose(h);
}

/* What the module says here: OK on a GPU machine, else one of the known
 * reasons, and then create() fails cleanly. */
static void test_query_here(void **state)
{
    unsetenv("PDX_CUDA_DRIVER_LIB");
    char why[128] = "";
    pdx_status_t st = g_ops->query(why, sizeof(why));
    print_message("cuda_ipc: query here: %s%s%s\n",
                  st == PDX_OK ? "available" : "unavailable",
                  why[0] ? ": " : "", why);
    void *be = NULL;
    if (st == PDX_OK) {
        assert_int_equal(g_ops->create(&g_host, NULL, 0, &be), PDX_OK);
        g_ops->destroy(be);
        return;
    }
    assert_int_equal(st, PDX_ERR_UNAVAILABLE);
    assert_true(strcmp(why, "no CUDA driver") == 0 ||
                strcmp(why, "no CUDA device") == 0 ||
                strncmp(why, "cuInit failed: ", 15) == 0 ||
                strncmp(why, "CUDA driver too old: ", 21) == 0);
    assert_int_equal(g_ops->create(&g_host, NULL, 0, &be), PDX_ERR_UNAVAILABLE);
    assert_null(be);
}

/* The few driver calls the test itself needs, from the same library the
 * module loads. */
typedef struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*Retain)(CUcontext *, CUdevice);
    CUresult (*Release)(CUdevice);
    CUresult (*Push)(CUcontext);
    CUresult (*Pop)(CUcontext *);
    CUresult (*Alloc)(CUdeviceptr *, size_t);
    CUresult (*Free)(CUdeviceptr);
    CUresult (*HtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*DtoH)(void *, CUdeviceptr, size_t);
    CUdevice dev;
} drv_t;

static int drv_load(drv_t *d, const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        return -1;
    }
#define LOAD(field, sym)                                                       \
    do {                                                                       \
        void *f = dlsym(h, sym);                                               \
        if (f == NULL)                                                         \
            return -1;                                                         \
        memcpy(&d->field, &f, sizeof(f));                                      \
    } while (0)
    LOAD(Init, "cuInit");
    LOAD(DeviceGet, "cuDeviceGet");
    LOAD(Retain, "cuDevicePrimaryCtxRetain");
    LOAD(Release, "cuDevicePrimaryCtxRelease_v2");
    LOAD(Push, "cuCtxPushCurrent_v2");
    LOAD(Pop, "cuCtxPopCurrent_v2");
    LOAD(Alloc, "cuMemAlloc_v2");
    LOAD(Free, "cuMemFree_v2");
    LOAD(HtoD, "cuMemcpyHtoD_v2");
    LOAD(DtoH, "cuMemcpyDtoH_v2");
#undef LOAD
    return 0;
}

static void drv_enter(drv_t *d)
{
    CUcontext c;
    assert_int_equal(d->Init(0), CUDA_SUCCESS);
    assert_int_equal(d->DeviceGet(&d->dev, 0), CUDA_SUCCESS);
    assert_int_equal(d->Retain(&c, d->dev), CUDA_SUCCESS);
    assert_int_equal(d->Push(c), CUDA_SUCCESS);
}

static void drv_leave(drv_t *d)
{
    assert_int_equal(d->Pop(NULL), CUDA_SUCCESS);
    assert_int_equal(d->Release(d->dev), CUDA_SUCCESS);
}

static uint8_t pat(uint64_t seed, uint64_t off)
{
    return (uint8_t)(((seed + 1) * 0x9e3779b97f4a7c15ull ^
                      off * 0xbf58476d1ce4e5b9ull) >>
                     52);
}

/* Through the module's table: VRAM arenas, pinned DRAM, self peer, READ and
 * WRITE of scattered pieces, byte-exact. */
static void conformance(const char *lib)
{
    drv_t d;
    memset(&d, 0, sizeof(d));
    assert_int_equal(drv_load(&d, lib), 0);
    const size_t sz = 2 << 20, half = sz / 2, blk = 4096, nb = 16;
    uint8_t *h = malloc(sz), *got = malloc(sz);
    for (size_t i = 0; i < sz; i++) {
        h[i] = pat(1, i);
    }
    CUdeviceptr m;
    drv_enter(&d);
    assert_int_equal(d.Alloc(&m, sz), CUDA_SUCCESS);
    assert_int_equal(d.HtoD(m, h, sz), CUDA_SUCCESS);
    drv_leave(&d);

    void *be = NULL;
    assert_int_equal(g_ops->create(&g_host, NULL, 0, &be), PDX_OK);
    char desc[256];
    g_ops->describe(be, desc, sizeof(desc));
    print_message("cuda_ipc: %s\n", desc);
    pdx_region_t rlo = {.addr = m,
                        .len = half,
                        .dev_id = 0,
                        .mem_type = PDX_MEM_VRAM,
                        .flags = 0,
                        .shm_fd = -1};
    pdx_region_t rhi = {.addr = m + half,
                        .len = half,
                        .dev_id = 0,
                        .mem_type = PDX_MEM_VRAM,
                        .flags = 0,
                        .shm_fd = -1};
    uint8_t *dram = aligned_alloc(4096, nb * blk);
    memset(dram, 0, nb * blk);
    pdx_region_t rdr = {.addr = (uintptr_t)dram,
                        .len = nb * blk,
                        .dev_id = 0,
                        .mem_type = PDX_MEM_DRAM,
                        .flags = PDX_REGION_F_PIN,
                        .shm_fd = -1};
    void *lo, *hi, *dmd;
    assert_int_equal(g_ops->mem_register(be, &rlo, &lo), PDX_OK);
    assert_int_equal(g_ops->mem_register(be, &rhi, &hi), PDX_OK);
    assert_int_equal(g_ops->mem_register(be, &rdr, &dmd), PDX_OK);
    void *ci, *key, *peer, *r;
    size_t cl, kl;
    assert_int_equal(g_ops->conn_info(be, &ci, &cl), PDX_OK);
    assert_int_equal(g_ops->peer_connect(be, "self", ci, cl, &peer), PDX_OK);
    assert_int_equal(g_ops->mem_pack(be, hi, &key, &kl), PDX_OK);
    assert_int_equal(g_ops->rmem_load(be, peer, &rhi, key, kl, &r), PDX_OK);
    free(ci);
    free(key);

    pdx_backend_iov_t iov[16];
    uint64_t src[16];
    for (size_t i = 0; i < nb; i++) {
        src[i] = half + ((i * 7) % (half / blk)) * blk;
        iov[i] = (pdx_backend_iov_t){m + i * blk, m + src[i], blk, lo, r};
    }
    for (int op = 0; op < 4; op++) {
        /* 0: READ VRAM, 1: WRITE VRAM, 2: READ into DRAM, 3: WRITE DRAM */
        pdx_xfer_op_t xop = (op & 1) ? PDX_XFER_WRITE : PDX_XFER_READ;
        for (size_t i = 0; i < nb; i++) {
            if (op >= 2) {
                iov[i].local_addr = (uintptr_t)dram + i * blk;
                iov[i].local_md = dmd;
            }
        }
        if (op == 1) {
            /* new content for the sources of the WRITE */
            for (size_t i = 0; i < nb * blk; i++) {
                h[i] = pat(2, i);
            }
            drv_enter(&d);
            assert_int_equal(d.HtoD(m, h, nb * blk), CUDA_SUCCESS);
            drv_leave(&d);
        }
        if (op == 3) {
            for (size_t i = 0; i < nb * blk; i++) {
                dram[i] = pat(3, i);
            }
        }
        void *req = NULL;
        pdx_status_t st =
            g_ops->xfer_post(be, peer, xop, iov, nb, NULL, 0, &req);
        assert_int_equal(st, PDX_INPROGRESS);
        long spins = 0;
        while ((st = g_ops->xfer_check(be, req)) == PDX_INPROGRESS) {
            assert_true(++spins < 100000000L);
        }
        assert_int_equal(st, PDX_OK);
        g_ops->xfer_release(be, req);

        drv_enter(&d);
        assert_int_equal(d.DtoH(got, m, sz), CUDA_SUCCESS);
        drv_leave(&d);
        for (size_t i = 0; i < nb; i++) {
            const uint8_t *dst = op == 2                ? dram + i * blk
                                 : xop == PDX_XFER_READ ? got + i * blk
                                                        : got + src[i];
            for (size_t j = 0; j < blk; j++) {
                uint8_t want = op == 0   ? pat(1, src[i] + j)
                               : op == 1 ? pat(2, i * blk + j)
                               : op == 2 ? pat(2, i * blk + j)
                                         : pat(3, i * blk + j);
                if (dst[j] != want) {
                    fail_msg("op %d piece %zu byte %zu: %u, want %u", op, i, j,
                             dst[j], want);
                }
            }
        }
    }
    g_ops->rmem_unload(be, r);
    g_ops->peer_disconnect(be, peer);
    g_ops->mem_deregister(be, lo);
    g_ops->mem_deregister(be, hi);
    g_ops->mem_deregister(be, dmd);
    g_ops->destroy(be);
    drv_enter(&d);
    assert_int_equal(d.Free(m), CUDA_SUCCESS);
    drv_leave(&d);
    free(dram);
    free(h);
    free(got);
}

static void test_conformance_fake_driver(void **state)
{
    setenv("PDX_CUDA_DRIVER_LIB", FAKE_CUDA_LIB, 1);
    setenv("FAKE_CUDA_DEVICES", "1", 1);
    char why[128];
    assert_int_equal(g_ops->query(why, sizeof(why)), PDX_OK);
    conformance(FAKE_CUDA_LIB);
    unsetenv("PDX_CUDA_DRIVER_LIB");
}

static void test_conformance_gpu(void **state)
{
    unsetenv("PDX_CUDA_DRIVER_LIB");
    char why[128] = "";
    if (g_ops->query(why, sizeof(why)) != PDX_OK) {
        print_message("cuda_ipc: %s\n", why);
        skip();
    }
    conformance("libcuda.so.1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_query_here),
        cmocka_unit_test(test_conformance_fake_driver),
        cmocka_unit_test(test_conformance_gpu),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
