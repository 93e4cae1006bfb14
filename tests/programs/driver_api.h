/* SPDX-License-Identifier: MIT */
/*
 * How the test programs reach the driver, in the three ways real programs do:
 *   DOOR_LINKED    calls the symbols directly (linked with -lcuda);
 *   DOOR_DLSYM     dlopen("libcuda.so.1") and dlsym() for every function;
 *   DOOR_PROCADDR  dlopen, dlsym() for cuGetProcAddress_v2 only, then asks it for every
 *                  function, as every CUDA runtime (static or shared) does;
 *   DOOR_PROCADDR_V1  the same through the original cuGetProcAddress (CUDA 11 runtimes).
 * The programs are written once against this table.
 */
#ifndef CUHEAP_TEST_DRIVER_API_H
#define CUHEAP_TEST_DRIVER_API_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define DRIVER_API(X)                                                                              \
    X(cuInit, (unsigned int), "cuInit")                                                            \
    X(cuDeviceGet, (CUdevice *, int), "cuDeviceGet")                                               \
    X(cuDeviceGetCount, (int *), "cuDeviceGetCount")                                               \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain")               \
    X(cuCtxSetCurrent, (CUcontext), "cuCtxSetCurrent")                                             \
    X(cuCtxSynchronize, (void), "cuCtxSynchronize")                                                \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t), "cuMemAlloc")                                        \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned), "cuMemAllocPitch")  \
    X(cuMemFree_v2, (CUdeviceptr), "cuMemFree")                                                    \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync")                       \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream), "cuMemFreeAsync")                                   \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged")                   \
    X(cuMemAllocHost_v2, (void **, size_t), "cuMemAllocHost")                                      \
    X(cuMemHostAlloc, (void **, size_t, unsigned), "cuMemHostAlloc")                               \
    X(cuMemFreeHost, (void *), "cuMemFreeHost")                                                    \
    X(cuMemGetInfo_v2, (size_t *, size_t *), "cuMemGetInfo")                                       \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice), "cuDeviceTotalMem")                               \
    X(cuMemGetAddressRange_v2, (CUdeviceptr *, size_t *, CUdeviceptr), "cuMemGetAddressRange")     \
    X(cuPointerGetAttribute, (void *, CUpointer_attribute, CUdeviceptr), "cuPointerGetAttribute")  \
    X(cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t), "cuMemcpyHtoD")                        \
    X(cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t), "cuMemcpyDtoH")                              \
    X(cuMemsetD8_v2, (CUdeviceptr, unsigned char, size_t), "cuMemsetD8")                           \
    X(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream), "cuMemsetD8Async")          \
    X(cuStreamQuery, (CUstream), "cuStreamQuery")                                                  \
    X(cuStreamCreate, (CUstream *, unsigned), "cuStreamCreate")                                    \
    X(cuStreamDestroy_v2, (CUstream), "cuStreamDestroy")                                           \
    X(cuStreamSynchronize, (CUstream), "cuStreamSynchronize")                                      \
    X(cuLaunchHostFunc, (CUstream, CUhostFn, void *), "cuLaunchHostFunc")                          \
    X(cuMemCreate,                                                                                 \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long),   \
      "cuMemCreate")                                                                               \
    X(cuMemRelease, (CUmemGenericAllocationHandle), "cuMemRelease")                                \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long),       \
      "cuMemAddressReserve")                                                                       \
    X(cuMemAddressFree, (CUdeviceptr, size_t), "cuMemAddressFree")                                 \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long),   \
      "cuMemMap")                                                                                  \
    X(cuMemUnmap, (CUdeviceptr, size_t), "cuMemUnmap")                                             \
    X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t), "cuMemSetAccess")    \
    X(cuCtxGetCurrent, (CUcontext *), "cuCtxGetCurrent")                                           \
    X(cuCtxDestroy_v2, (CUcontext), "cuCtxDestroy")                                                \
    X(cuCtxEnablePeerAccess, (CUcontext, unsigned int), "cuCtxEnablePeerAccess")                   \
    X(cuMemGetAccess, (unsigned long long *, const CUmemLocation *, CUdeviceptr),                  \
      "cuMemGetAccess")                                                                            \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice), "cuDevicePrimaryCtxReset")                           \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice), "cuDeviceGetDefaultMemPool")          \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream),                    \
      "cuMemAllocFromPoolAsync")                                                                   \
    X(cuPointerGetAttributes, (unsigned, CUpointer_attribute *, void **, CUdeviceptr),             \
      "cuPointerGetAttributes")                                                                    \
    X(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr), "cuIpcGetMemHandle")                     \
    X(cuIpcOpenMemHandle_v2, (CUdeviceptr *, CUipcMemHandle, unsigned int), "cuIpcOpenMemHandle")  \
    X(cuIpcCloseMemHandle, (CUdeviceptr), "cuIpcCloseMemHandle")                                   \
    X(cuStreamCreateWithPriority, (CUstream *, unsigned, int), "cuStreamCreateWithPriority")       \
    X(cuStreamBeginCapture_v2, (CUstream, CUstreamCaptureMode), "cuStreamBeginCapture")            \
    X(cuStreamEndCapture, (CUstream, CUgraph *), "cuStreamEndCapture")

/* The per-thread-default-stream twins (cuda.h's _ptsz names), as a program built with
 * --default-stream per-thread reaches them: by name when linked or through dlsym, with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM through cuGetProcAddress. */
#define DRIVER_API_PTSZ(X)                                                                         \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync")                       \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream),                    \
      "cuMemAllocFromPoolAsync")                                                                   \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream), "cuMemFreeAsync")                                   \
    X(cuLaunchHostFunc, (CUstream, CUhostFn, void *), "cuLaunchHostFunc")                          \
    X(cuStreamBeginCapture_v2, (CUstream, CUstreamCaptureMode), "cuStreamBeginCapture")            \
    X(cuStreamEndCapture, (CUstream, CUgraph *), "cuStreamEndCapture")

struct driver_api {
#define DRIVER_API_FIELD(sym, params, base) CUresult(*sym) params;
    DRIVER_API(DRIVER_API_FIELD)
    struct {
        DRIVER_API_PTSZ(DRIVER_API_FIELD)
    } ptsz;
#undef DRIVER_API_FIELD
};

#if defined(DOOR_LINKED)
/* cuda.h declares the _ptsz names only for programs built for per-thread default streams. */
#define DRIVER_API_DECLARE_PTSZ(sym, params, base) CUresult sym##_ptsz params;
DRIVER_API_PTSZ(DRIVER_API_DECLARE_PTSZ)
#undef DRIVER_API_DECLARE_PTSZ
static const char *const door_name = "linked";
static inline int driver_api_open(struct driver_api *d)
{
#define DRIVER_API_LINK(sym, params, base) d->sym = sym;
    DRIVER_API(DRIVER_API_LINK)
#undef DRIVER_API_LINK
#define DRIVER_API_LINK_PTSZ(sym, params, base) d->ptsz.sym = sym##_ptsz;
    DRIVER_API_PTSZ(DRIVER_API_LINK_PTSZ)
#undef DRIVER_API_LINK_PTSZ
    return 0;
}
#elif defined(DOOR_DLSYM)
static const char *const door_name = "dlsym";
static inline int driver_api_open(struct driver_api *d)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
#define DRIVER_API_DLSYM(sym, params, base)                                                        \
    if (!(*(void **)&d->sym = dlsym(h, #sym)))                                                     \
        return -1;
    DRIVER_API(DRIVER_API_DLSYM)
#undef DRIVER_API_DLSYM
#define DRIVER_API_DLSYM_PTSZ(sym, params, base)                                                   \
    if (!(*(void **)&d->ptsz.sym = dlsym(h, #sym "_ptsz")))                                        \
        return -1;
    DRIVER_API_PTSZ(DRIVER_API_DLSYM_PTSZ)
#undef DRIVER_API_DLSYM_PTSZ
    return 0;
}
#else
/* DOOR_PROCADDR: cuGetProcAddress_v2, as CUDA 12 and later runtimes use it; DOOR_PROCADDR_V1:
 * the original cuGetProcAddress (CUDA 11 runtimes). Either is first asked for itself, as the
 * runtimes do, so the answer for "cuGetProcAddress" must be cuheap's too. */
#ifdef DOOR_PROCADDR_V1
static const char *const door_name = "procaddr-v1";
static CUresult (*door_gpa)(const char *, void **, int, cuuint64_t);
static inline CUresult door_lookup(const char *name, void **pfn, cuuint64_t flags)
{
    return door_gpa(name, pfn, 11030, flags);
}
static inline int door_lookup_open(void *h)
{
    *(void **)&door_gpa = dlsym(h, "cuGetProcAddress");
    return door_gpa && door_lookup("cuGetProcAddress", (void **)&door_gpa, 0) == CUDA_SUCCESS ? 0
                                                                                              : -1;
}
#else
static const char *const door_name = "procaddr";
static CUresult (*door_gpa)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
static inline CUresult door_lookup(const char *name, void **pfn, cuuint64_t flags)
{
    CUdriverProcAddressQueryResult st;
    return door_gpa(name, pfn, 12000, flags, &st);
}
static inline int door_lookup_open(void *h)
{
    *(void **)&door_gpa = dlsym(h, "cuGetProcAddress_v2");
    return door_gpa && door_lookup("cuGetProcAddress", (void **)&door_gpa, 0) == CUDA_SUCCESS ? 0
                                                                                              : -1;
}
#endif
static inline int driver_api_open(struct driver_api *d)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h || door_lookup_open(h))
        return -1;
#define DRIVER_API_PROC(sym, params, base)                                                         \
    if (door_lookup(base, (void **)&d->sym, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS)          \
        return -1;
    DRIVER_API(DRIVER_API_PROC)
#undef DRIVER_API_PROC
#define DRIVER_API_PROC_PTSZ(sym, params, base)                                                    \
    if (door_lookup(base, (void **)&d->ptsz.sym, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != \
        CUDA_SUCCESS)                                                                              \
        return -1;
    DRIVER_API_PTSZ(DRIVER_API_PROC_PTSZ)
#undef DRIVER_API_PROC_PTSZ
    return 0;
}
#endif

/* cuInit, device 0's primary context made current. */
static inline int driver_api_start(struct driver_api *d, int device)
{
    CUdevice dev;
    CUcontext ctx;
    if (driver_api_open(d) || d->cuInit(0) || d->cuDeviceGet(&dev, device) ||
        d->cuDevicePrimaryCtxRetain(&ctx, dev) || d->cuCtxSetCurrent(ctx))
        return -1;
    return 0;
}

#endif
