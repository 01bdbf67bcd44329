/* A fake CUDA driver for cuda_ipc tests (see fake_cuda.h). Single-threaded
 * test code: plain globals are fine here. Function names are those of
 * cuda.h, which renames several of them (cuMemAlloc -> cuMemAlloc_v2), so
 * the exported symbols are the ones a real libcuda exports. */
#include "fake_cuda.h"

#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define API FAKE_API
#define MAX_DEV 8
#define MAX_RANGES 4096
#define MAX_HANDLES 1024

/* Devices are known by physical id inside; ordinals are what the process
 * sees through FAKE_CUDA_VISIBLE. */
struct CUctx_st {
    int dev; /* physical id */
    int retained;
};

typedef struct {
    void *dst;
    const void *src;
    size_t len;
} op_t;

struct CUstream_st {
    int dev;
    op_t *ops;
    size_t nops, cap, done;
};

struct CUevent_st {
    CUstream s; /* NULL: never recorded, or its stream is gone */
    size_t seq;
    int queried; /* reported NOT_READY once for this record */
};

typedef enum { R_ALLOC, R_IPC, R_VMM } rkind_t;

typedef struct {
    int used;
    rkind_t kind;
    uintptr_t base;
    size_t size;
    int dev;     /* physical device the memory is on */
    int acc_dev; /* device whose contexts may use this address: dev, the
                    opener's (IPC) or the one given access (VMM) */
    int memfd;   /* R_ALLOC: owned; R_IPC: the source alloc's */
    int handle;  /* R_VMM: handle index */
    int aliased; /* another mapping of the same memory was opened */
} range_t;

typedef struct {
    int used;
    int refs;
    int memfd;
    size_t size;
    int dev;
    unsigned types;
} vhandle_t;

typedef struct {
    uintptr_t p;
    size_t size;
} hostreg_t;

static int g_init, g_ndev;
static int g_phys[MAX_DEV];
static struct CUctx_st g_ctx[MAX_DEV];
static __thread CUcontext t_stack[64];
static __thread int t_depth;
static range_t g_r[MAX_RANGES];
static vhandle_t g_h[MAX_HANDLES];
static hostreg_t g_hreg[256];
static struct CUevent_st *g_events[4096];
static CUstream g_streams[1024];
static fake_cuda_stats_t g_st;
static int g_strict;

void fake_cuda_strict(int on)
{
    g_strict = on;
}

void fake_cuda_stats(fake_cuda_stats_t *s)
{
    *s = g_st;
    s->ctx_depth = t_depth;
}

void fake_cuda_uuid(int phys, unsigned char u[16])
{
    for (int i = 0; i < 16; i++) {
        u[i] = (unsigned char)(0xa0 + phys * 16 + i);
    }
}

/* Ordinal (in the current visibility) of physical device `phys`, or -1. */
static int ordinal_of(int phys)
{
    for (int i = 0; i < g_ndev; i++) {
        if (g_phys[i] == phys) {
            return i;
        }
    }
    return -1;
}

static int phys_ok(CUdevice d)
{
    return d >= 0 && d < MAX_DEV && ordinal_of(d) >= 0;
}

static CUcontext cur(void)
{
    return t_depth > 0 ? t_stack[t_depth - 1] : NULL;
}

#define NEED_INIT()                                                            \
    do {                                                                       \
        if (!g_init)                                                           \
            return CUDA_ERROR_NOT_INITIALIZED;                                 \
    } while (0)
#define NEED_CTX()                                                             \
    do {                                                                       \
        NEED_INIT();                                                           \
        if (cur() == NULL)                                                     \
            return CUDA_ERROR_INVALID_CONTEXT;                                 \
    } while (0)

static range_t *find_range(uintptr_t p, size_t len)
{
    for (int i = 0; i < MAX_RANGES; i++) {
        range_t *r = &g_r[i];
        if (r->used && p >= r->base && p - r->base < r->size &&
            len <= r->size - (p - r->base)) {
            return r;
        }
    }
    return NULL;
}

static range_t *new_range(void)
{
    for (int i = 0; i < MAX_RANGES; i++) {
        if (!g_r[i].used) {
            memset(&g_r[i], 0, sizeof(g_r[i]));
            g_r[i].used = 1;
            return &g_r[i];
        }
    }
    return NULL;
}

/* ---- init, devices, contexts ------------------------------------------ */

API CUresult cuInit(unsigned int flags)
{
    const char *n = getenv("FAKE_CUDA_DEVICES");
    g_ndev = n != NULL ? atoi(n) : 2;
    if (g_ndev <= 0) {
        g_ndev = 0;
        return CUDA_ERROR_NO_DEVICE;
    }
    if (g_ndev > MAX_DEV) {
        g_ndev = MAX_DEV;
    }
    for (int i = 0; i < MAX_DEV; i++) {
        g_phys[i] = i;
    }
    const char *vis = getenv("FAKE_CUDA_VISIBLE");
    if (vis != NULL && vis[0] != '\0') {
        int k = 0;
        for (const char *p = vis; *p != '\0' && k < MAX_DEV;) {
            g_phys[k++] = (int)strtol(p, (char **)&p, 10);
            if (*p == ',') {
                p++;
            }
        }
        g_ndev = k;
    }
    g_init = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *v)
{
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult e, const char **s)
{
    switch (e) {
    case CUDA_SUCCESS:
        *s = "CUDA_SUCCESS";
        break;
    case CUDA_ERROR_INVALID_VALUE:
        *s = "CUDA_ERROR_INVALID_VALUE";
        break;
    case CUDA_ERROR_NOT_INITIALIZED:
        *s = "CUDA_ERROR_NOT_INITIALIZED";
        break;
    case CUDA_ERROR_NO_DEVICE:
        *s = "CUDA_ERROR_NO_DEVICE";
        break;
    case CUDA_ERROR_INVALID_CONTEXT:
        *s = "CUDA_ERROR_INVALID_CONTEXT";
        break;
    case CUDA_ERROR_NOT_READY:
        *s = "CUDA_ERROR_NOT_READY";
        break;
    default:
        *s = "CUDA_ERROR_FAKE_OTHER";
        break;
    }
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    *n = g_ndev;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (ordinal < 0 || ordinal >= g_ndev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *d = g_phys[ordinal]; /* a CUdevice is a handle: here, the physical id */
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    NEED_INIT();
    if (!phys_ok(d)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    snprintf(name, (size_t)len, "Fake GPU %d", d);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    NEED_INIT();
    if (!phys_ok(d)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    fake_cuda_uuid(d, (unsigned char *)u->bytes);
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    NEED_INIT();
    if (!phys_ok(d)) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    g_ctx[d].dev = d;
    g_ctx[d].retained++;
    g_st.ctx_retained++;
    *c = &g_ctx[d];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice d)
{
    NEED_INIT();
    if (d < 0 || d >= MAX_DEV || g_ctx[d].retained == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    g_ctx[d].retained--;
    g_st.ctx_retained--;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPushCurrent(CUcontext c)
{
    NEED_INIT();
    if (c == NULL || c->retained == 0 || t_depth == 64) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    t_stack[t_depth++] = c;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent(CUcontext *c)
{
    NEED_INIT();
    if (t_depth == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    t_depth--;
    if (c != NULL) {
        *c = t_stack[t_depth];
    }
    return CUDA_SUCCESS;
}

/* ---- memory ----------------------------------------------------------- */

static int make_memfd(size_t size)
{
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

API CUresult cuMemAlloc(CUdeviceptr *p, size_t size)
{
    NEED_CTX();
    if (size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    range_t *r = new_range();
    int fd = make_memfd(size);
    void *m = fd >= 0
                  ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    if (r == NULL || m == MAP_FAILED) {
        if (fd >= 0) {
            close(fd);
        }
        if (r != NULL) {
            r->used = 0;
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->kind = R_ALLOC;
    r->base = (uintptr_t)m;
    r->size = size;
    r->dev = cur()->dev;
    r->acc_dev = r->dev;
    r->memfd = fd;
    *p = (CUdeviceptr)r->base;
    return CUDA_SUCCESS;
}

API CUresult cuMemFree(CUdeviceptr p)
{
    NEED_CTX();
    range_t *r = find_range((uintptr_t)p, 1);
    if (r == NULL || r->kind != R_ALLOC || r->base != (uintptr_t)p) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)r->base, r->size);
    close(r->memfd);
    r->used = 0;
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
                                  CUdeviceptr p)
{
    NEED_CTX();
    range_t *r = find_range((uintptr_t)p, 1);
    if (r == NULL) {
        return CUDA_ERROR_NOT_FOUND;
    }
    if (base != NULL) {
        *base = (CUdeviceptr)r->base;
    }
    if (size != NULL) {
        *size = r->size;
    }
    return CUDA_SUCCESS;
}

API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a,
                                   CUdeviceptr p)
{
    NEED_INIT();
    range_t *r = find_range((uintptr_t)p, 1);
    if (r == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = ordinal_of(r->dev);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = r->kind == R_ALLOC;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)r->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = r->size;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

/* Legacy IPC: the handle names the allocation; opening maps its memfd
 * again, at another address. */
typedef struct {
    char magic[8];
    uint32_t index;
    int32_t pid;   /* exporter */
    int32_t memfd; /* its memfd, fetched with pidfd_getfd by another process */
    int32_t dev;
    uint64_t size;
} fake_ipc_t;

API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    NEED_CTX();
    range_t *r = find_range((uintptr_t)p, 1);
    if (r == NULL || r->kind != R_ALLOC || r->base != (uintptr_t)p) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_ipc_t f = {
        "FAKEIPC", (uint32_t)(r - g_r), (int32_t)getpid(), r->memfd, r->dev,
        r->size};
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &f, sizeof(f));
    return CUDA_SUCCESS;
}

API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h,
                                unsigned int flags)
{
    NEED_CTX();
    fake_ipc_t f;
    memcpy(&f, h.reserved, sizeof(f));
    if (memcmp(f.magic, "FAKEIPC", 8) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int memfd;
    if (f.pid != (int32_t)getpid()) {
        /* Another process: its memfd, as the real driver would map its
         * memory (needs ptrace rights over it, like pidfd_getfd). */
        int pfd = (int)syscall(SYS_pidfd_open, (pid_t)f.pid, 0);
        memfd = pfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pfd, f.memfd, 0);
        if (pfd >= 0) {
            close(pfd);
        }
        if (memfd < 0) {
            return CUDA_ERROR_INVALID_VALUE;
        }
    } else {
        if (f.index >= MAX_RANGES || !g_r[f.index].used ||
            g_r[f.index].kind != R_ALLOC) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        g_r[f.index].aliased = 1;
        memfd = dup(g_r[f.index].memfd);
    }
    void *m = mmap(NULL, (size_t)f.size, PROT_READ | PROT_WRITE, MAP_SHARED,
                   memfd, 0);
    range_t *r = new_range();
    if (m == MAP_FAILED || r == NULL) {
        close(memfd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->kind = R_IPC;
    r->base = (uintptr_t)m;
    r->size = (size_t)f.size;
    r->dev = f.dev;
    /* Usable from the opening context's device (peer access when that is
     * not where the memory is). */
    r->acc_dev = cur()->dev;
    r->memfd = memfd; /* owned by the mapping */
    g_st.ipc_opens++;
    *p = (CUdeviceptr)r->base;
    return CUDA_SUCCESS;
}

API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    NEED_CTX();
    range_t *r = find_range((uintptr_t)p, 1);
    if (r == NULL || r->kind != R_IPC || r->base != (uintptr_t)p) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)r->base, r->size);
    close(r->memfd);
    r->used = 0;
    g_st.ipc_opens--;
    return CUDA_SUCCESS;
}

API CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags)
{
    NEED_CTX();
    uintptr_t a = (uintptr_t)p;
    int freei = -1;
    for (int i = 0; i < 256; i++) {
        hostreg_t *h = &g_hreg[i];
        if (h->size == 0) {
            freei = freei < 0 ? i : freei;
        } else if (a < h->p + h->size && h->p < a + size) {
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    }
    if (find_range(a, 1) != NULL || freei < 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_hreg[freei].p = a;
    g_hreg[freei].size = size;
    g_st.host_regs++;
    return CUDA_SUCCESS;
}

API CUresult cuMemHostUnregister(void *p)
{
    NEED_CTX();
    for (int i = 0; i < 256; i++) {
        if (g_hreg[i].size != 0 && g_hreg[i].p == (uintptr_t)p) {
            g_hreg[i].size = 0;
            g_st.host_regs--;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* ---- VMM -------------------------------------------------------------- */

static vhandle_t *hget(CUmemGenericAllocationHandle h)
{
    if (h == 0 || h > MAX_HANDLES || !g_h[h - 1].used) {
        return NULL;
    }
    return &g_h[h - 1];
}

static CUmemGenericAllocationHandle hnew(int memfd, size_t size, int dev,
                                         unsigned types)
{
    for (int i = 0; i < MAX_HANDLES; i++) {
        if (!g_h[i].used) {
            g_h[i] = (vhandle_t){1, 1, memfd, size, dev, types};
            g_st.vmm_handles++;
            return (CUmemGenericAllocationHandle)(i + 1);
        }
    }
    return 0;
}

static void hput(vhandle_t *v)
{
    if (--v->refs == 0) {
        close(v->memfd);
        v->used = 0;
        g_st.vmm_handles--;
    }
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                         const CUmemAllocationProp *prop,
                         unsigned long long flags)
{
    NEED_INIT();
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        prop->location.id < 0 || prop->location.id >= g_ndev ||
        size % 4096 != 0 || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = make_memfd(size);
    if (fd < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = hnew(fd, size, g_phys[prop->location.id],
              (unsigned)prop->requestedHandleTypes);
    return *h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    vhandle_t *v = hget(h);
    if (v == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    hput(v);
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
                                 CUdeviceptr addr, unsigned long long flags)
{
    NEED_INIT();
    void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr p, size_t size)
{
    NEED_INIT();
    if (find_range((uintptr_t)p, 1) != NULL) {
        return CUDA_ERROR_INVALID_VALUE; /* still mapped */
    }
    munmap((void *)(uintptr_t)p, size);
    return CUDA_SUCCESS;
}

API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
                      CUmemGenericAllocationHandle h, unsigned long long flags)
{
    NEED_INIT();
    vhandle_t *v = hget(h);
    if (v == NULL || offset != 0 || size != v->size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    void *m = mmap((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, v->memfd, 0);
    range_t *r = new_range();
    if (m == MAP_FAILED || r == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->kind = R_VMM;
    r->base = (uintptr_t)p;
    r->size = size;
    r->dev = v->dev;
    r->acc_dev = -1; /* no access until cuMemSetAccess */
    r->memfd = -1;
    r->handle = (int)h;
    v->refs++;
    g_st.vmm_maps++;
    return CUDA_SUCCESS;
}

API CUresult cuMemUnmap(CUdeviceptr p, size_t size)
{
    NEED_INIT();
    range_t *r = find_range((uintptr_t)p, 1);
    if (r == NULL || r->kind != R_VMM || r->base != (uintptr_t)p ||
        r->size != size) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    mmap((void *)(uintptr_t)p, size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    hput(hget((CUmemGenericAllocationHandle)r->handle));
    r->used = 0;
    g_st.vmm_maps--;
    return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr p, size_t size,
                            const CUmemAccessDesc *d, size_t n)
{
    NEED_INIT();
    range_t *r = find_range((uintptr_t)p, size);
    if (r == NULL || n == 0 ||
        d[0].location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* location.id is an ordinal of this process. */
    if (d[0].location.id < 0 || d[0].location.id >= g_ndev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    r->acc_dev = g_phys[d[0].location.id];
    return CUDA_SUCCESS;
}

API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h,
                                         void *addr)
{
    NEED_INIT();
    range_t *r = find_range((uintptr_t)addr, 1);
    if (r == NULL || r->kind != R_VMM) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    hget((CUmemGenericAllocationHandle)r->handle)->refs++;
    *h = (CUmemGenericAllocationHandle)r->handle;
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    vhandle_t *v = hget(h);
    if (v == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = (CUmemAllocationHandleType)v->types;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = ordinal_of(v->dev);
    return CUDA_SUCCESS;
}

API CUresult cuMemExportToShareableHandle(void *out,
                                          CUmemGenericAllocationHandle h,
                                          CUmemAllocationHandleType type,
                                          unsigned long long flags)
{
    NEED_INIT();
    vhandle_t *v = hget(h);
    if (v == NULL || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        !(v->types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = dup(v->memfd);
    if (fd < 0) {
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
                                            void *os,
                                            CUmemAllocationHandleType type)
{
    NEED_INIT();
    int fd = (int)(intptr_t)os;
    struct stat st;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        fstat(fd, &st) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The exporter's mappings of this memory are now "in another
     * process". */
    for (int i = 0; i < MAX_RANGES; i++) {
        struct stat s2;
        if (g_r[i].used && g_r[i].kind == R_VMM &&
            fstat(g_h[g_r[i].handle - 1].memfd, &s2) == 0 &&
            s2.st_ino == st.st_ino && s2.st_dev == st.st_dev) {
            g_r[i].aliased = 1;
        }
    }
    /* The device is the exporter's: find the handle with this inode. */
    for (int i = 0; i < MAX_HANDLES; i++) {
        struct stat s2;
        if (g_h[i].used && fstat(g_h[i].memfd, &s2) == 0 &&
            s2.st_ino == st.st_ino && s2.st_dev == st.st_dev) {
            int nfd = dup(fd);
            *h = hnew(nfd, g_h[i].size, g_h[i].dev, g_h[i].types);
            return *h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- streams, events, copies ------------------------------------------ */

API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    NEED_CTX();
    *s = calloc(1, sizeof(**s));
    if (*s == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*s)->dev = cur()->dev;
    for (size_t i = 0; i < sizeof(g_streams) / sizeof(g_streams[0]); i++) {
        if (g_streams[i] == NULL) {
            g_streams[i] = *s;
            break;
        }
    }
    g_st.streams++;
    return CUDA_SUCCESS;
}

static void run_to(CUstream s, size_t seq)
{
    for (; s->done < seq && s->done < s->nops; s->done++) {
        op_t *o = &s->ops[s->done];
        memmove(o->dst, o->src, o->len);
    }
}

API CUresult cuStreamSynchronize(CUstream s)
{
    NEED_CTX();
    run_to(s, s->nops);
    return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy(CUstream s)
{
    NEED_CTX();
    if (s == NULL || s->dev != cur()->dev) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    run_to(s, s->nops);
    for (size_t i = 0; i < sizeof(g_events) / sizeof(g_events[0]); i++) {
        if (g_events[i] != NULL && g_events[i]->s == s) {
            g_events[i]->s = NULL;
        }
    }
    for (size_t i = 0; i < sizeof(g_streams) / sizeof(g_streams[0]); i++) {
        if (g_streams[i] == s) {
            g_streams[i] = NULL;
        }
    }
    free(s->ops);
    free(s);
    g_st.streams--;
    return CUDA_SUCCESS;
}

API CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    NEED_CTX();
    for (size_t i = 0; i < sizeof(g_events) / sizeof(g_events[0]); i++) {
        if (g_events[i] == NULL) {
            g_events[i] = calloc(1, sizeof(struct CUevent_st));
            if (g_events[i] == NULL) {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            *e = g_events[i];
            g_st.events++;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuEventDestroy(CUevent e)
{
    NEED_INIT();
    for (size_t i = 0; i < sizeof(g_events) / sizeof(g_events[0]); i++) {
        if (g_events[i] == e) {
            g_events[i] = NULL;
            free(e);
            g_st.events--;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuEventRecord(CUevent e, CUstream s)
{
    NEED_CTX();
    if (s == NULL || s->dev != cur()->dev) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    e->s = s;
    e->seq = s->nops;
    e->queried = 0;
    return CUDA_SUCCESS;
}

/* The first query after a record reports NOT_READY (and lets the copies
 * run); the next one reports completion. */
API CUresult cuEventQuery(CUevent e)
{
    NEED_INIT();
    if (e->s == NULL || e->s->done >= e->seq) {
        if (e->s != NULL && !e->queried && e->seq > 0) {
            e->queried = 1;
            return CUDA_ERROR_NOT_READY;
        }
        return CUDA_SUCCESS;
    }
    run_to(e->s, e->seq);
    e->queried = 1;
    return CUDA_ERROR_NOT_READY;
}

API CUresult cuEventSynchronize(CUevent e)
{
    NEED_INIT();
    if (e->s != NULL) {
        run_to(e->s, e->seq);
    }
    return CUDA_SUCCESS;
}

static CUresult enqueue(CUstream s, void *dst, const void *src, size_t len)
{
    if (s == NULL && cur() != NULL) {
        memmove(dst, src, len); /* the default stream: synchronous here */
        g_st.copies++;
        return CUDA_SUCCESS;
    }
    if (s == NULL || cur() == NULL || s->dev != cur()->dev) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (s->nops == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        op_t *o = realloc(s->ops, cap * sizeof(*o));
        if (o == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        s->ops = o;
        s->cap = cap;
    }
    s->ops[s->nops++] = (op_t){dst, src, len};
    g_st.copies++;
    return CUDA_SUCCESS;
}

/* Device memory on device `dev` (-1: any); host memory is anything else. */
static int is_dev(CUdeviceptr p, size_t len, int dev)
{
    range_t *r = find_range((uintptr_t)p, len);
    if (r != NULL && g_strict && r->aliased) {
        fprintf(stderr,
                "fake cuda: %#lx is the exporter's address of memory "
                "opened through IPC; an importer must use its own mapping\n",
                (unsigned long)p);
        return 0;
    }
    return r != NULL && (dev < 0 || r->acc_dev == dev);
}

API CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t len,
                               CUstream s)
{
    NEED_CTX();
    int d = cur()->dev;
    if (!is_dev(dst, len, d) || !is_dev(src, len, d)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return enqueue(s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                   len);
}

API CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t len,
                               CUstream s)
{
    NEED_CTX();
    if (!is_dev(dst, len, cur()->dev) ||
        is_dev((CUdeviceptr)(uintptr_t)src, 1, -1)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return enqueue(s, (void *)(uintptr_t)dst, src, len);
}

API CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t len,
                               CUstream s)
{
    NEED_CTX();
    if (!is_dev(src, len, cur()->dev) ||
        is_dev((CUdeviceptr)(uintptr_t)dst, 1, -1)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return enqueue(s, dst, (const void *)(uintptr_t)src, len);
}

API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src,
                               CUcontext sctx, size_t len, CUstream s)
{
    NEED_CTX();
    if (dctx == NULL || sctx == NULL || dctx->retained == 0 ||
        sctx->retained == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!is_dev(dst, len, dctx->dev) || !is_dev(src, len, sctx->dev)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_st.peer_copies++;
    return enqueue(s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                   len);
}

/* Synchronous copies, for tests to fill and check "device" memory (the
 * backend uses none; strict mode does not apply). */
API CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t len)
{
    NEED_CTX();
    if (find_range((uintptr_t)dst, len) == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy((void *)(uintptr_t)dst, src, len);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t len)
{
    NEED_CTX();
    if (find_range((uintptr_t)src, len) == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    memcpy(dst, (const void *)(uintptr_t)src, len);
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationGranularity(size_t *g,
                                           const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags o)
{
    NEED_INIT();
    *g = 4096;
    return CUDA_SUCCESS;
}

/* For tests/gpu/cuda_ipc_gpu_test.c run against this fake. */
API CUresult cuCtxSetCurrent(CUcontext c)
{
    NEED_INIT();
    if (c == NULL) {
        if (t_depth > 0) {
            t_depth--;
        }
        return CUDA_SUCCESS;
    }
    if (t_depth == 0) {
        t_stack[t_depth++] = c;
    } else {
        t_stack[t_depth - 1] = c;
    }
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    for (size_t i = 0; i < sizeof(g_streams) / sizeof(g_streams[0]); i++) {
        if (g_streams[i] != NULL) {
            run_to(g_streams[i], g_streams[i]->nops);
        }
    }
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocHost(void **p, size_t size)
{
    NEED_CTX();
    *p = aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    return *p != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

API CUresult cuMemFreeHost(void *p)
{
    NEED_CTX();
    free(p);
    return CUDA_SUCCESS;
}
