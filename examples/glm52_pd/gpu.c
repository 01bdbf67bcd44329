/* glm52-pd-node's GPU arenas (kv.memory "vram"): the CUDA driver loaded
 * with dlopen (PDX_CUDA_DRIVER_LIB, else libcuda.so.1, as pdx's backends
 * load it: the tests hand in the fake driver), the arenas allocated in the
 * config's device's memory and carved there (the connector registers them
 * as VRAM), and a host mirror the model stand-in writes and checks. KV
 * crosses between the two only through the driver's copies, by whole
 * blocks of every arena: pushed to the GPU before pdx may see it (a save,
 * a handoff), pulled from it after pdx wrote it (a load, before its
 * bytes are verified; the canary of an aborted load). So the byte-for-byte
 * checks read what is in GPU memory.
 *
 * The driver's prototypes are declared here (the driver API's ABI, the
 * `_v2` entry points cuda.h maps the names to): the example builds
 * without the CUDA toolkit. Calls only libc, libdl and log.c. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"

typedef int cu_result_t;
typedef unsigned long long cu_ptr_t;

struct gpu_api {
    void *lib;
    void *ctx;
    int dev;
    cu_result_t (*init)(unsigned int);
    cu_result_t (*device_get)(int *, int);
    cu_result_t (*ctx_retain)(void **, int);
    cu_result_t (*ctx_release)(int);
    cu_result_t (*ctx_set)(void *);
    cu_result_t (*mem_alloc)(cu_ptr_t *, size_t);
    cu_result_t (*mem_free)(cu_ptr_t);
    cu_result_t (*htod)(cu_ptr_t, const void *, size_t);
    cu_result_t (*dtoh)(void *, cu_ptr_t, size_t);
    cu_result_t (*err_name)(cu_result_t, const char **);
};

static const char *cu_err(const gpu_api_t *g, cu_result_t r)
{
    const char *s = NULL;
    if (g->err_name == NULL || g->err_name(r, &s) != 0 || s == NULL) {
        return "CUDA error";
    }
    return s;
}

/* The entry points, or -1 with `why` (a driver without one of them). */
static int gpu_syms(gpu_api_t *g, const char *lib, char *why, size_t len)
{
    static const struct {
        const char *name;
        size_t off;
    } syms[] = {
        {"cuInit", offsetof(gpu_api_t, init)},
        {"cuDeviceGet", offsetof(gpu_api_t, device_get)},
        {"cuDevicePrimaryCtxRetain", offsetof(gpu_api_t, ctx_retain)},
        {"cuDevicePrimaryCtxRelease_v2", offsetof(gpu_api_t, ctx_release)},
        {"cuCtxSetCurrent", offsetof(gpu_api_t, ctx_set)},
        {"cuMemAlloc_v2", offsetof(gpu_api_t, mem_alloc)},
        {"cuMemFree_v2", offsetof(gpu_api_t, mem_free)},
        {"cuMemcpyHtoD_v2", offsetof(gpu_api_t, htod)},
        {"cuMemcpyDtoH_v2", offsetof(gpu_api_t, dtoh)},
        {"cuGetErrorName", offsetof(gpu_api_t, err_name)},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *fn = dlsym(g->lib, syms[i].name);
        if (fn == NULL) {
            snprintf(why, len, "%s has no %s", lib, syms[i].name);
            return -1;
        }
        /* POSIX: a data pointer from dlsym converts to a function
         * pointer. */
        memcpy((char *)g + syms[i].off, &fn, sizeof(fn));
    }
    return 0;
}

/* The driver, initialised, with device `dev`'s primary context current on
 * this (the node's only) thread: 0, or -1 with `why`. */
static int gpu_open(gpu_api_t *g, int dev, char *why, size_t len)
{
    const char *env = getenv("PDX_CUDA_DRIVER_LIB");
    const char *lib = env != NULL && env[0] != '\0' ? env : "libcuda.so.1";
    g->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (g->lib == NULL) {
        const char *e = dlerror();
        snprintf(why, len, "no CUDA driver (%s)", e ? e : lib);
        return -1;
    }
    if (gpu_syms(g, lib, why, len) != 0) {
        return -1;
    }
    int d = 0;
    cu_result_t r = g->init(0);
    if (r == 0) {
        r = g->device_get(&d, dev);
    }
    if (r == 0) {
        r = g->ctx_retain(&g->ctx, d);
    }
    if (r == 0) {
        g->dev = d;
        r = g->ctx_set(g->ctx);
    }
    if (r != 0) {
        snprintf(why, len, "CUDA device %d: %s", dev, cu_err(g, r));
        return -1;
    }
    return 0;
}

int gpu_arenas(node_t *nd, size_t size, uint64_t *base_p, char *why,
               size_t len)
{
    gpu_api_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        snprintf(why, len, "out of memory");
        return -1;
    }
    nd->gpu = g;
    if (gpu_open(g, (int)nd->cfg.device, why, len) != 0) {
        return -1;
    }
    cu_ptr_t p = 0;
    cu_result_t r = g->mem_alloc(&p, size);
    if (r != 0) {
        snprintf(why, len, "cuMemAlloc of %zu bytes on device %u: %s", size,
                 nd->cfg.device, cu_err(g, r));
        return -1;
    }
    nd->gpu_base = (uint64_t)p;
    nd->mirror = calloc(1, size);
    if (nd->mirror == NULL) {
        snprintf(why, len, "out of memory for a %zu-byte host mirror", size);
        return -1;
    }
    *base_p = nd->gpu_base;
    return 0;
}

void gpu_rebase(node_t *nd)
{
    for (size_t a = 0; nd->gpu != NULL && a < nd->model.narenas; a++) {
        pd_arena_view_t *v = &nd->model.arenas[a];
        v->base = nd->mirror + ((uint64_t)(uintptr_t)v->base - nd->gpu_base);
    }
}

/* Blocks `ids` of every arena between the GPU and the mirror. */
static int gpu_copy(node_t *nd, const uint64_t *ids, size_t n, int push)
{
    gpu_api_t *g = nd->gpu;
    if (g == NULL) {
        return 0;
    }
    for (size_t a = 0; a < nd->model.narenas; a++) {
        const pd_arena_view_t *v = &nd->model.arenas[a];
        size_t bytes = (size_t)v->bytes_per_token * nd->B;
        for (size_t i = 0; i < n; i++) {
            uint8_t *host = v->base + ids[i] * v->stride;
            cu_ptr_t dev = nd->gpu_base + (uint64_t)(host - nd->mirror);
            cu_result_t r = push ? g->htod(dev, host, bytes)
                                 : g->dtoh(host, dev, bytes);
            if (r != 0) {
                say("%s of block %llu (arena %zu): %s",
                    push ? "cuMemcpyHtoD" : "cuMemcpyDtoH",
                    (unsigned long long)ids[i], a, cu_err(g, r));
                return -1;
            }
        }
    }
    nd->gpu_copies += n * nd->model.narenas;
    return 0;
}

int gpu_push(node_t *nd, const uint64_t *ids, size_t n)
{
    return gpu_copy(nd, ids, n, 1);
}

int gpu_pull(node_t *nd, const uint64_t *ids, size_t n)
{
    return gpu_copy(nd, ids, n, 0);
}

void gpu_close(node_t *nd)
{
    gpu_api_t *g = nd->gpu;
    if (g == NULL) {
        return;
    }
    if (nd->gpu_base != 0) {
        g->mem_free((cu_ptr_t)nd->gpu_base);
    }
    if (g->ctx != NULL) {
        g->ctx_set(NULL);
        g->ctx_release(g->dev);
    }
    /* The driver stays loaded: pdx's backends hold it too. */
    free(nd->mirror);
    free(g);
    nd->gpu = NULL;
    nd->mirror = NULL;
    nd->gpu_base = 0;
}
