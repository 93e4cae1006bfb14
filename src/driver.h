/* SPDX-License-Identifier: MIT */
/*
 * The real driver: every libcuda function cuheap calls, resolved once from the real
 * libcuda.so.1 through the real dlsym (found with dlvsym, never through our own dlsym).
 * Nothing here links against libcuda: a process without a driver simply finds nothing.
 */
#ifndef CUHEAP_DRIVER_H
#define CUHEAP_DRIVER_H

#include <cuda.h>
#undef cuGetProcAddress /* we need the legacy 4-argument entry point by its real name */

typedef void *(*cuheap_dlsym_fn)(void *handle, const char *name);

/* X(name, parameter list): the versioned symbol, and its C signature (all return CUresult). */
#define CUHEAP_DRIVER_FUNCS(X)                                                                     \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                      \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                 \
    X(cuMemFree_v2, (CUdeviceptr))                                                                 \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                                          \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *, size_t, CUstream))                                     \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                    \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))               \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                                     \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr, CUstream))                                                \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned int))                                    \
    X(cuMemHostAlloc, (void **, size_t, unsigned int))                                             \
    X(cuMemAllocHost_v2, (void **, size_t))                                                        \
    X(cuMemFreeHost, (void *))                                                                     \
    X(cuMemCreate,                                                                                 \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))   \
    X(cuMemRelease, (CUmemGenericAllocationHandle))                                                \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))   \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                                           \
    X(cuMemGetInfo_v2, (size_t *, size_t *))                                                       \
    X(cuMemGetAddressRange_v2, (CUdeviceptr *, size_t *, CUdeviceptr))                             \
    X(cuPointerGetAttribute, (void *, CUpointer_attribute, CUdeviceptr))                           \
    X(cuPointerGetAttributes, (unsigned int, CUpointer_attribute *, void **, CUdeviceptr))         \
    X(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr))                                          \
    X(cuIpcOpenMemHandle_v2, (CUdeviceptr *, CUipcMemHandle, unsigned int))                        \
    X(cuIpcCloseMemHandle, (CUdeviceptr))                                                          \
    X(cuStreamCreate, (CUstream *, unsigned int))                                                  \
    X(cuStreamCreateWithPriority, (CUstream *, unsigned int, int))                                 \
    X(cuStreamDestroy_v2, (CUstream))                                                              \
    X(cuStreamBeginCapture_v2, (CUstream, CUstreamCaptureMode))                                    \
    X(cuStreamBeginCapture_v2_ptsz, (CUstream, CUstreamCaptureMode))                               \
    X(cuStreamEndCapture, (CUstream, CUgraph *))                                                   \
    X(cuStreamEndCapture_ptsz, (CUstream, CUgraph *))                                              \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice))                                                      \
    X(cuCtxDestroy_v2, (CUcontext))                                                                \
    X(cuCtxEnablePeerAccess, (CUcontext, unsigned int))                                            \
    X(cuGetProcAddress, (const char *, void **, int, cuuint64_t))                                  \
    X(cuGetProcAddress_v2,                                                                         \
      (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))                  \
    /* helpers cuheap calls but does not hook */                                                   \
    X(cuCtxGetCurrent, (CUcontext *))                                                              \
    X(cuCtxGetDevice, (CUdevice *))                                                                \
    X(cuCtxSynchronize, (void))                                                                    \
    X(cuCtxPushCurrent_v2, (CUcontext))                                                            \
    X(cuCtxPopCurrent_v2, (CUcontext *))                                                           \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                           \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice))                                                    \
    X(cuDevicePrimaryCtxGetState, (CUdevice, unsigned int *, int *))                               \
    X(cuDeviceGet, (CUdevice *, int))                                                              \
    X(cuDeviceGetName, (char *, int, CUdevice))                                                    \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice))                                                   \
    X(cuEventCreate, (CUevent *, unsigned int))                                                    \
    X(cuEventRecord, (CUevent, CUstream))                                                          \
    X(cuEventQuery, (CUevent))                                                                     \
    X(cuEventSynchronize, (CUevent))                                                               \
    X(cuEventDestroy_v2, (CUevent))                                                                \
    X(cuStreamQuery, (CUstream))                                                                   \
    X(cuDriverGetVersion, (int *))                                                                 \
    X(cuGetErrorName, (CUresult, const char **))                                                   \
    X(cuMemGetAllocationGranularity,                                                               \
      (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))                   \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))       \
    X(cuMemAddressFree, (CUdeviceptr, size_t))                                                     \
    X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                      \
    X(cuMemExportToShareableHandle,                                                                \
      (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))       \
    X(cuMemImportFromShareableHandle,                                                              \
      (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType))

struct cuheap_driver {
    void *handle;               /* libcuda.so.1, from dlopen */
    cuheap_dlsym_fn real_dlsym; /* glibc's dlsym */
#define CUHEAP_DRIVER_FIELD(name, params) CUresult(*name) params;
    CUHEAP_DRIVER_FUNCS(CUHEAP_DRIVER_FIELD)
#undef CUHEAP_DRIVER_FIELD
};

extern struct cuheap_driver cuheap_drv;

/* The real dlsym; resolved on first use. Never NULL after a successful call. */
cuheap_dlsym_fn cuheap_real_dlsym(void);

/* Open the real driver and resolve the table (once; thread-safe). Returns 0, or -ENOENT when
 * no libcuda.so.1 can be opened: then every field is NULL. */
int cuheap_driver_load(void);

#endif
