/* The CUDA driver loaded with dlopen (one loader for every module that
 * moves GPU memory: cuda_ipc, ucx's VRAM path), and the CUresult
 * translator. */
#include "cu_api_int.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <pdx/log.h>

/* The exported symbol behind each member. cuda.h maps several API names to
 * versioned ones with #define (cuMemGetAddressRange -> cuMemGetAddressRange_v2
 * and so on); dlsym needs the real exported names, and the string literals
 * here are not macro-expanded, so they are written out. The default-stream
 * (non _ptds/_ptsz) variants are the ones we want: every copy names its
 * own stream. */
typedef struct {
    const char *sym;
    size_t off;
    int optional;
} cu_sym_t;

#define CU_SYM(member, sym)                                                    \
    {                                                                          \
        sym, offsetof(cu_api_t, member), 0                                     \
    }
#define CU_OPT(member, sym)                                                    \
    {                                                                          \
        sym, offsetof(cu_api_t, member), 1                                     \
    }

static const cu_sym_t cu_syms[] = {
    CU_SYM(GetErrorName, "cuGetErrorName"),
    CU_SYM(Init, "cuInit"),
    CU_SYM(DriverGetVersion, "cuDriverGetVersion"),
    CU_SYM(DeviceGetCount, "cuDeviceGetCount"),
    CU_SYM(DeviceGet, "cuDeviceGet"),
    CU_SYM(DeviceGetName, "cuDeviceGetName"),
    CU_SYM(DeviceGetUuid, "cuDeviceGetUuid_v2"),
    CU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    CU_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    CU_SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"),
    CU_SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    CU_SYM(PointerGetAttribute, "cuPointerGetAttribute"),
    CU_SYM(MemGetAddressRange, "cuMemGetAddressRange_v2"),
    CU_SYM(IpcGetMemHandle, "cuIpcGetMemHandle"),
    CU_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    CU_SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
    CU_SYM(MemHostRegister, "cuMemHostRegister_v2"),
    CU_SYM(MemHostUnregister, "cuMemHostUnregister"),
    CU_SYM(StreamCreate, "cuStreamCreate"),
    CU_SYM(StreamDestroy, "cuStreamDestroy_v2"),
    CU_SYM(StreamSynchronize, "cuStreamSynchronize"),
    CU_SYM(EventCreate, "cuEventCreate"),
    CU_SYM(EventDestroy, "cuEventDestroy_v2"),
    CU_SYM(EventRecord, "cuEventRecord"),
    CU_SYM(EventQuery, "cuEventQuery"),
    CU_SYM(EventSynchronize, "cuEventSynchronize"),
    CU_SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    CU_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    CU_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    CU_SYM(MemcpyPeerAsync, "cuMemcpyPeerAsync"),
    CU_OPT(MemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
    CU_OPT(MemGetAllocationPropertiesFromHandle,
           "cuMemGetAllocationPropertiesFromHandle"),
    CU_OPT(MemExportToShareableHandle, "cuMemExportToShareableHandle"),
    CU_OPT(MemImportFromShareableHandle, "cuMemImportFromShareableHandle"),
    CU_OPT(MemAddressReserve, "cuMemAddressReserve"),
    CU_OPT(MemAddressFree, "cuMemAddressFree"),
    CU_OPT(MemMap, "cuMemMap"),
    CU_OPT(MemUnmap, "cuMemUnmap"),
    CU_OPT(MemSetAccess, "cuMemSetAccess"),
    CU_OPT(MemRelease, "cuMemRelease"),
};

int cu_api_has_vmm(const cu_api_t *api)
{
    return api->MemRetainAllocationHandle != NULL &&
           api->MemGetAllocationPropertiesFromHandle != NULL &&
           api->MemExportToShareableHandle != NULL &&
           api->MemImportFromShareableHandle != NULL &&
           api->MemAddressReserve != NULL && api->MemAddressFree != NULL &&
           api->MemMap != NULL && api->MemUnmap != NULL &&
           api->MemSetAccess != NULL && api->MemRelease != NULL &&
           api->peer_fd != NULL;
}

const char *cu_api_lib_name(void)
{
    const char *env = getenv("PDX_CUDA_DRIVER_LIB");
    return (env != NULL && env[0] != '\0') ? env : "libcuda.so.1";
}

pdx_status_t cu_api_load(cu_api_t *api, char *why, size_t why_len)
{
    const char *name = cu_api_lib_name();
    memset(api, 0, sizeof(*api));
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        pdx_debug("cuda: dlopen %s: %s", name, err ? err : "?");
        snprintf(why, why_len, "no CUDA driver");
        return PDX_ERR_UNAVAILABLE;
    }
    for (size_t i = 0; i < sizeof(cu_syms) / sizeof(cu_syms[0]); i++) {
        void *fn = dlsym(lib, cu_syms[i].sym);
        if (fn == NULL && !cu_syms[i].optional) {
            snprintf(why, why_len, "CUDA driver too old: missing %s",
                     cu_syms[i].sym);
            /* cuInit has not run through this table: closing is safe. */
            dlclose(lib);
            memset(api, 0, sizeof(*api));
            return PDX_ERR_UNAVAILABLE;
        }
        /* POSIX guarantees a data pointer from dlsym converts to a
         * function pointer of the right type. */
        memcpy((char *)api + cu_syms[i].off, &fn, sizeof(fn));
    }
    api->peer_fd = cu_pidfd_getfd;
    api->lib = lib;
    return PDX_OK;
}

pdx_status_t cu_api_init(const cu_api_t *api, int *count_p, char *why,
                         size_t why_len)
{
    CUresult r = api->Init(0);
    if (r == CUDA_ERROR_NO_DEVICE) {
        snprintf(why, why_len, "no CUDA device");
        return PDX_ERR_UNAVAILABLE;
    }
    if (r != CUDA_SUCCESS) {
        snprintf(why, why_len, "cuInit failed: %s", cu_err_name(api, r));
        return PDX_ERR_UNAVAILABLE;
    }
    int count = 0;
    r = api->DeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        snprintf(why, why_len, "cuDeviceGetCount failed: %s",
                 cu_err_name(api, r));
        return PDX_ERR_UNAVAILABLE;
    }
    if (count <= 0) {
        snprintf(why, why_len, "no CUDA device");
        return PDX_ERR_UNAVAILABLE;
    }
    if (count_p != NULL) {
        *count_p = count;
    }
    return PDX_OK;
}

pdx_status_t cu_status(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return PDX_OK;
    case CUDA_ERROR_NOT_READY:
        return PDX_INPROGRESS;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
        return PDX_ERR_INVALID;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return PDX_ERR_NOMEM;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
        return PDX_ERR_UNAVAILABLE;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
        return PDX_ERR_UNSUPPORTED;
    case CUDA_ERROR_ALREADY_MAPPED:
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        return PDX_ERR_EXISTS;
    default:
        return PDX_ERR_BACKEND;
    }
}

const char *cu_err_name(const cu_api_t *api, CUresult r)
{
    const char *s = NULL;
    if (api != NULL && api->GetErrorName != NULL &&
        api->GetErrorName(r, &s) == CUDA_SUCCESS && s != NULL) {
        return s;
    }
    return "CUDA_ERROR_UNKNOWN_CODE";
}

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* same number on every Linux architecture */
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

int cu_pidfd_getfd(pid_t pid, int fd)
{
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        return -1;
    }
    int out = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    int saved = errno;
    close(pidfd);
    errno = saved;
    return out;
}
