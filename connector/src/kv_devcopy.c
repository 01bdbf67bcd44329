/* Copies between VRAM arenas and the host offload pool, for the offload
 * child: the CUDA driver, dlopen'd when a connector whose arenas are in
 * VRAM has an offload child (PDX_CUDA_DRIVER_LIB, else libcuda.so.1, as
 * the modules find it), and synchronous copies made with the device's
 * primary context pushed on the calling thread. No cuda.h: the few
 * prototypes are declared here with the driver's ABI types. */
#include "kv_devcopy_int.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/log.h>

typedef int cu_result_t; /* CUresult; 0 is CUDA_SUCCESS */
typedef unsigned long long cu_ptr_t; /* CUdeviceptr */

struct kv_devcopy {
    void *lib;
    void *ctx; /* the device's primary context, retained */
    int dev;
    cu_result_t (*release)(int);
    cu_result_t (*push)(void *);
    cu_result_t (*pop)(void **);
    cu_result_t (*d2h)(void *, cu_ptr_t, size_t);
    cu_result_t (*h2d)(cu_ptr_t, const void *, size_t);
};

/* The versioned symbol cuda.h maps the name to, else the plain one. */
static void *sym(void *lib, const char *v2, const char *plain)
{
    void *f = dlsym(lib, v2);
    return f != NULL || plain == NULL ? f : dlsym(lib, plain);
}

pdx_status_t kv_devcopy_open(uint32_t dev, kv_devcopy_t **dc_p)
{
    const char *env = getenv("PDX_CUDA_DRIVER_LIB");
    const char *name = env != NULL && env[0] != '\0' ? env : "libcuda.so.1";
    kv_devcopy_t *dc = calloc(1, sizeof(*dc));
    if (dc == NULL) {
        return PDX_ERR_NOMEM;
    }
    /* Stays loaded, as the modules keep it: a driver unloaded under a
     * context it made is not safe to come back to. */
    dc->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (dc->lib == NULL) {
        pdx_error("kv: the offload tier copies VRAM arenas with the CUDA "
                  "driver, and %s cannot be loaded: %s", name, dlerror());
        free(dc);
        return PDX_ERR_UNAVAILABLE;
    }
    cu_result_t (*init)(unsigned) = sym(dc->lib, "cuInit", NULL);
    cu_result_t (*get)(int *, int) = sym(dc->lib, "cuDeviceGet", NULL);
    cu_result_t (*retain)(void **, int) =
        sym(dc->lib, "cuDevicePrimaryCtxRetain", NULL);
    dc->release = sym(dc->lib, "cuDevicePrimaryCtxRelease_v2",
                      "cuDevicePrimaryCtxRelease");
    dc->push = sym(dc->lib, "cuCtxPushCurrent_v2", "cuCtxPushCurrent");
    dc->pop = sym(dc->lib, "cuCtxPopCurrent_v2", "cuCtxPopCurrent");
    dc->d2h = sym(dc->lib, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
    dc->h2d = sym(dc->lib, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
    cu_result_t r = -1;
    const char *step = "a symbol";
    if (init && get && retain && dc->release && dc->push && dc->pop &&
        dc->d2h && dc->h2d) {
        step = "cuInit";
        r = init(0);
        if (r == 0) {
            step = "cuDeviceGet";
            r = get(&dc->dev, (int)dev);
        }
        if (r == 0) {
            step = "cuDevicePrimaryCtxRetain";
            r = retain(&dc->ctx, dc->dev);
        }
    }
    if (r != 0) {
        pdx_error("kv: the offload tier's copies of VRAM arenas need the "
                  "CUDA driver (%s): %s failed (%d) for device %u",
                  name, step, r, dev);
        free(dc);
        return PDX_ERR_UNAVAILABLE;
    }
    *dc_p = dc;
    return PDX_OK;
}

/* One copy with the device's context current on this thread. */
static pdx_status_t copy(kv_devcopy_t *dc, int to_dev, void *host,
                         uint64_t devp, size_t n)
{
    if (dc->push(dc->ctx) != 0) {
        pdx_error("kv: cannot make device %d's context current for the "
                  "offload tier's copy", dc->dev);
        return PDX_ERR_BACKEND;
    }
    cu_result_t r = to_dev ? dc->h2d((cu_ptr_t)devp, host, n)
                           : dc->d2h(host, (cu_ptr_t)devp, n);
    void *was;
    dc->pop(&was);
    if (r != 0) {
        pdx_error("kv: the offload tier's copy of %zu bytes %s device %d "
                  "failed (%d)",
                  n, to_dev ? "to" : "from", dc->dev, r);
        return PDX_ERR_BACKEND;
    }
    return PDX_OK;
}

pdx_status_t kv_devcopy_d2h(kv_devcopy_t *dc, void *dst, uint64_t src,
                            size_t n)
{
    return copy(dc, 0, dst, src, n);
}

pdx_status_t kv_devcopy_h2d(kv_devcopy_t *dc, uint64_t dst, const void *src,
                            size_t n)
{
    return copy(dc, 1, (void *)src, dst, n);
}

void kv_devcopy_close(kv_devcopy_t *dc)
{
    if (dc == NULL) {
        return;
    }
    dc->release(dc->dev);
    free(dc);
}
