/* The CUDA driver entry points the modules use (cuda_ipc, ucx's VRAM
 * path), as a table of function pointers filled from libcuda.so.1 at run
 * time (dlopen), so a module builds and loads where there is no driver,
 * and tests can hand in a fake driver. Private to the modules that link
 * pdx_cuda_driver. */
#ifndef PDX_CUDA_IPC_CU_API_H
#define PDX_CUDA_IPC_CU_API_H

#include <stddef.h>
#include <sys/types.h>

#include <cuda.h>

#include <pdx/status.h>

/* One typedef per entry point. Members carry no `cu` prefix on purpose:
 * cuda.h #defines many names (cuMemGetAddressRange -> ..._v2), and a member
 * named like a macro would be silently renamed. The exported symbol each one
 * is loaded from is spelled out in cu_api.c. */
typedef CUresult (*cu_GetErrorName_t)(CUresult, const char **);
typedef CUresult (*cu_Init_t)(unsigned int);
typedef CUresult (*cu_DriverGetVersion_t)(int *);
typedef CUresult (*cu_DeviceGetCount_t)(int *);
typedef CUresult (*cu_DeviceGet_t)(CUdevice *, int);
typedef CUresult (*cu_DeviceGetName_t)(char *, int, CUdevice);
typedef CUresult (*cu_DeviceGetUuid_t)(CUuuid *, CUdevice);
typedef CUresult (*cu_DevicePrimaryCtxRetain_t)(CUcontext *, CUdevice);
typedef CUresult (*cu_DevicePrimaryCtxRelease_t)(CUdevice);
typedef CUresult (*cu_CtxPushCurrent_t)(CUcontext);
typedef CUresult (*cu_CtxPopCurrent_t)(CUcontext *);
typedef CUresult (*cu_PointerGetAttribute_t)(void *, CUpointer_attribute,
                                             CUdeviceptr);
typedef CUresult (*cu_MemGetAddressRange_t)(CUdeviceptr *, size_t *,
                                            CUdeviceptr);
typedef CUresult (*cu_IpcGetMemHandle_t)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*cu_IpcOpenMemHandle_t)(CUdeviceptr *, CUipcMemHandle,
                                          unsigned int);
typedef CUresult (*cu_IpcCloseMemHandle_t)(CUdeviceptr);
typedef CUresult (*cu_MemHostRegister_t)(void *, size_t, unsigned int);
typedef CUresult (*cu_MemHostUnregister_t)(void *);
typedef CUresult (*cu_StreamCreate_t)(CUstream *, unsigned int);
typedef CUresult (*cu_StreamDestroy_t)(CUstream);
typedef CUresult (*cu_StreamSynchronize_t)(CUstream);
typedef CUresult (*cu_EventCreate_t)(CUevent *, unsigned int);
typedef CUresult (*cu_EventDestroy_t)(CUevent);
typedef CUresult (*cu_EventRecord_t)(CUevent, CUstream);
typedef CUresult (*cu_EventQuery_t)(CUevent);
typedef CUresult (*cu_EventSynchronize_t)(CUevent);
typedef CUresult (*cu_MemcpyDtoDAsync_t)(CUdeviceptr, CUdeviceptr, size_t,
                                         CUstream);
typedef CUresult (*cu_MemcpyHtoDAsync_t)(CUdeviceptr, const void *, size_t,
                                         CUstream);
typedef CUresult (*cu_MemcpyDtoHAsync_t)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*cu_MemcpyPeerAsync_t)(CUdeviceptr, CUcontext, CUdeviceptr,
                                         CUcontext, size_t, CUstream);
/* Virtual memory management (VMM); optional: a driver without them still
 * serves cudaMalloc-style memory. */
typedef CUresult (*cu_MemRetainAllocationHandle_t)(
    CUmemGenericAllocationHandle *, void *);
typedef CUresult (*cu_MemGetAllocationPropertiesFromHandle_t)(
    CUmemAllocationProp *, CUmemGenericAllocationHandle);
typedef CUresult (*cu_MemExportToShareableHandle_t)(
    void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
    unsigned long long);
typedef CUresult (*cu_MemImportFromShareableHandle_t)(
    CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
typedef CUresult (*cu_MemAddressReserve_t)(CUdeviceptr *, size_t, size_t,
                                           CUdeviceptr, unsigned long long);
typedef CUresult (*cu_MemAddressFree_t)(CUdeviceptr, size_t);
typedef CUresult (*cu_MemMap_t)(CUdeviceptr, size_t, size_t,
                                CUmemGenericAllocationHandle,
                                unsigned long long);
typedef CUresult (*cu_MemUnmap_t)(CUdeviceptr, size_t);
typedef CUresult (*cu_MemSetAccess_t)(CUdeviceptr, size_t,
                                      const CUmemAccessDesc *, size_t);
typedef CUresult (*cu_MemRelease_t)(CUmemGenericAllocationHandle);

/* Duplicate file descriptor `fd` of process `pid` into this process
 * (pidfd_getfd by default). Returns the new fd or -1 with errno set. */
typedef int (*cu_peer_fd_t)(pid_t pid, int fd);

typedef struct cu_api {
    cu_GetErrorName_t GetErrorName;
    cu_Init_t Init;
    cu_DriverGetVersion_t DriverGetVersion;
    cu_DeviceGetCount_t DeviceGetCount;
    cu_DeviceGet_t DeviceGet;
    cu_DeviceGetName_t DeviceGetName;
    cu_DeviceGetUuid_t DeviceGetUuid;
    cu_DevicePrimaryCtxRetain_t DevicePrimaryCtxRetain;
    cu_DevicePrimaryCtxRelease_t DevicePrimaryCtxRelease;
    cu_CtxPushCurrent_t CtxPushCurrent;
    cu_CtxPopCurrent_t CtxPopCurrent;
    cu_PointerGetAttribute_t PointerGetAttribute;
    cu_MemGetAddressRange_t MemGetAddressRange;
    cu_IpcGetMemHandle_t IpcGetMemHandle;
    cu_IpcOpenMemHandle_t IpcOpenMemHandle;
    cu_IpcCloseMemHandle_t IpcCloseMemHandle;
    cu_MemHostRegister_t MemHostRegister;
    cu_MemHostUnregister_t MemHostUnregister;
    cu_StreamCreate_t StreamCreate;
    cu_StreamDestroy_t StreamDestroy;
    cu_StreamSynchronize_t StreamSynchronize;
    cu_EventCreate_t EventCreate;
    cu_EventDestroy_t EventDestroy;
    cu_EventRecord_t EventRecord;
    cu_EventQuery_t EventQuery;
    cu_EventSynchronize_t EventSynchronize;
    cu_MemcpyDtoDAsync_t MemcpyDtoDAsync;
    cu_MemcpyHtoDAsync_t MemcpyHtoDAsync;
    cu_MemcpyDtoHAsync_t MemcpyDtoHAsync;
    cu_MemcpyPeerAsync_t MemcpyPeerAsync;
    /* optional (NULL when the driver lacks them) */
    cu_MemRetainAllocationHandle_t MemRetainAllocationHandle;
    cu_MemGetAllocationPropertiesFromHandle_t
        MemGetAllocationPropertiesFromHandle;
    cu_MemExportToShareableHandle_t MemExportToShareableHandle;
    cu_MemImportFromShareableHandle_t MemImportFromShareableHandle;
    cu_MemAddressReserve_t MemAddressReserve;
    cu_MemAddressFree_t MemAddressFree;
    cu_MemMap_t MemMap;
    cu_MemUnmap_t MemUnmap;
    cu_MemSetAccess_t MemSetAccess;
    cu_MemRelease_t MemRelease;
    /* not CUDA: how to fetch a peer's exported fd */
    cu_peer_fd_t peer_fd;
    /* dlopen handle, or NULL for a table filled by hand (tests) */
    void *lib;
} cu_api_t;

/* True when every VMM entry point is present. */
int cu_api_has_vmm(const cu_api_t *api);

/* The library to load: $PDX_CUDA_DRIVER_LIB if set (unusual installs), else
 * "libcuda.so.1". */
const char *cu_api_lib_name(void);

/* dlopen the driver and fill `api`. PDX_ERR_UNAVAILABLE with "no CUDA driver"
 * (library absent) or "CUDA driver too old: missing <sym>" in `why`. The
 * library is never dlclose'd once cuInit may have run (the driver starts
 * threads and registers exit handlers; unloading it is not safe). */
pdx_status_t cu_api_load(cu_api_t *api, char *why, size_t why_len);

/* cuInit and count devices: PDX_OK, or PDX_ERR_UNAVAILABLE with "no CUDA
 * device" (CUDA_ERROR_NO_DEVICE or a count of 0) or "cuInit failed: <name>".
 * `count_p` may be NULL. */
pdx_status_t cu_api_init(const cu_api_t *api, int *count_p, char *why,
                         size_t why_len);

/* The translator from CUresult to pdx_status_t. */
pdx_status_t cu_status(CUresult r);

/* Static name of a CUresult ("CUDA_ERROR_INVALID_VALUE"); never NULL. */
const char *cu_err_name(const cu_api_t *api, CUresult r);

/* pidfd_open + pidfd_getfd (Linux >= 5.6). */
int cu_pidfd_getfd(pid_t pid, int fd);

#endif
