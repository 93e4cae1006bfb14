/* SPDX-License-Identifier: MIT */
/*
 * Test-only entry points of the simulated driver: how many times the real allocation calls
 * reached it, and what an IPC handle points at. Tests resolve these with dlsym so that the
 * same test binary also runs against a real driver (where they are absent).
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>

struct CUipcMemHandle_st;

enum fakecuda_counter {
    FAKECUDA_CALL_MEM_ALLOC,        /* cuMemAlloc_v2 calls that reached the driver */
    FAKECUDA_CALL_MEM_FREE,         /* cuMemFree_v2 calls that reached the driver */
    FAKECUDA_CALL_GET_PROC_ADDRESS, /* cuGetProcAddress lookups */
    /* cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemAddressReserve and
     * cuMemAddressFree calls */
    FAKECUDA_CALL_VMM,
    FAKECUDA_CALL_EVENT_RECORD, /* cuEventRecord calls (and _ptsz) */
    FAKECUDA_CALL_QUERY,        /* cuEventQuery and cuStreamQuery calls */
    FAKECUDA_CALL_SYNC,         /* cuEventSynchronize, cuStreamSynchronize, cuCtxSynchronize */
    FAKECUDA_NR_COUNTERS
};

#ifdef FAKECUDA_BUILDING
#include <cuda.h>
/* Entry points the real driver exports but cuda.h declares only under macros. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream h);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream h);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream h);
CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void *arg);
CUresult cuEventRecord_ptsz(CUevent h, CUstream st);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g);
#endif

unsigned long fakecuda_calls(enum fakecuda_counter c);
size_t fakecuda_live_allocations(void);
unsigned long long fakecuda_ipc_handle_base(const struct CUipcMemHandle_st *h);
/* Faults FAKECUDA_FAIL injected so far (fakecuda.c documents the variable). */
unsigned long fakecuda_faults_injected(void);
/* Bytes device dev has handed out: rounded allocations and VMM physical memory. */
size_t fakecuda_device_used(int dev);
/* Whether cuMemAlloc_v2 of n bytes on device dev would find room now (no fault drawn). */
int fakecuda_device_fits(int dev, size_t n);
/* Faults injected on the calling thread so far; and fault nth of them (from 1): its entry point
 * (the name FAKECUDA_FAIL matches, e.g. "cuMemAlloc") and error, -1 when it is not kept (the
 * last 64 are). */
unsigned long fakecuda_thread_faults(void);
int fakecuda_thread_fault(unsigned long nth, const char **ret_name, int *ret_error);

/* One allocation or release the simulated driver made, for a CUPTI stand-in. */
enum fakecuda_mem_kind {
    FAKECUDA_MEM_DEVICE,
    FAKECUDA_MEM_ASYNC,
    FAKECUDA_MEM_MANAGED,
    FAKECUDA_MEM_HOST
};
struct fakecuda_memop {
    int release; /* 0: allocated, 1: released */
    int kind;    /* enum fakecuda_mem_kind */
    int device;  /* -1 for host memory */
    unsigned long long ptr, bytes;
    unsigned long long pool; /* stream-ordered: the base of the device's pool */
    const char *api;         /* the entry point, when the fake knows it (cuMemAlloc_v2,
                                cuMemFree_v2), else NULL */
};
typedef void (*fakecuda_memop_fn)(const struct fakecuda_memop *op);
/* Called (under the fake's lock, on the allocating or freeing thread) for each one; NULL
 * stops it. */
void fakecuda_set_memory_observer(fakecuda_memop_fn fn);

/* Called at the start of every cuCtxGetCurrent, on the calling thread, outside the fake's
 * locks; NULL stops it. */
typedef void (*fakecuda_call_fn)(void);
void fakecuda_set_ctx_query_hook(fakecuda_call_fn fn);

typedef unsigned long (*fakecuda_calls_fn)(enum fakecuda_counter c);
typedef size_t (*fakecuda_live_allocations_fn)(void);

#endif
