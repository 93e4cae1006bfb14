/* SPDX-License-Identifier: MIT */
/*
 * The exported driver hooks: the one choke point every CUDA runtime, framework and library
 * reaches (the three ways in are listed below; docs/HACKING.md has the map). Each hook only
 * translates the call: the allocation layer (alloc.h) decides pool or driver, applies the
 * limit, reclaims and retries, keeps the accounting and records exactly one event; otherwise a
 * hook behaves like the driver: same results, same error codes. When cuheap cannot do its part
 * the driver's own answer goes back unchanged.
 *
 * Three ways in, one set of hooks:
 *   - the symbols themselves (programs linked with -lcuda; LD_PRELOAD puts ours first);
 *   - dlsym(handle, "cu...") on the driver (our dlsym override);
 *   - cuGetProcAddress / cuGetProcAddress_v2, which every CUDA runtime uses: the driver's
 *     answer is matched by pointer against the real functions we hook, so _ptsz twins and
 *     ABI versions map to the right hook and anything else passes through untouched.
 */
#include <cuheap/cuheap.h>
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "alloc.h"
#include "counters.h"
#include "defer.h"
#include "driver.h"
#include "ipc.h"
#include "event.h"
#include "log.h"
#include "recorder.h"
#include "runtime.h"

#define CUHEAP_EXPORT __attribute__((visibility("default")))

/* Every hooked entry point, by its versioned driver name. */
#define CUHEAP_HOOKS(X)                                                                            \
    X(cuMemAlloc_v2)                                                                               \
    X(cuMemAllocPitch_v2)                                                                          \
    X(cuMemFree_v2)                                                                                \
    X(cuMemAllocAsync)                                                                             \
    X(cuMemAllocAsync_ptsz)                                                                        \
    X(cuMemAllocFromPoolAsync)                                                                     \
    X(cuMemAllocFromPoolAsync_ptsz)                                                                \
    X(cuMemFreeAsync)                                                                              \
    X(cuMemFreeAsync_ptsz)                                                                         \
    X(cuMemAllocManaged)                                                                           \
    X(cuMemHostAlloc)                                                                              \
    X(cuMemAllocHost_v2)                                                                           \
    X(cuMemFreeHost)                                                                               \
    X(cuMemCreate)                                                                                 \
    X(cuMemRelease)                                                                                \
    X(cuMemMap)                                                                                    \
    X(cuMemUnmap)                                                                                  \
    X(cuMemGetInfo_v2)                                                                             \
    X(cuMemGetAddressRange_v2)                                                                     \
    X(cuPointerGetAttribute)                                                                       \
    X(cuPointerGetAttributes)                                                                      \
    X(cuIpcGetMemHandle)                                                                           \
    X(cuIpcOpenMemHandle_v2)                                                                       \
    X(cuIpcCloseMemHandle)                                                                         \
    X(cuStreamCreate)                                                                              \
    X(cuStreamCreateWithPriority)                                                                  \
    X(cuStreamDestroy_v2)                                                                          \
    X(cuStreamBeginCapture_v2)                                                                     \
    X(cuStreamBeginCapture_v2_ptsz)                                                                \
    X(cuStreamEndCapture)                                                                          \
    X(cuStreamEndCapture_ptsz)                                                                     \
    X(cuDevicePrimaryCtxReset_v2)                                                                  \
    X(cuCtxDestroy_v2)                                                                             \
    X(cuCtxEnablePeerAccess)                                                                       \
    X(cuGetProcAddress)                                                                            \
    X(cuGetProcAddress_v2)

enum hook_id {
#define CUHEAP_HOOK_ID(name) H_##name,
    CUHEAP_HOOKS(CUHEAP_HOOK_ID)
#undef CUHEAP_HOOK_ID
        NR_HOOKS
};

/* Prototypes of the hooks cuda.h does not declare under these names. */
CUHEAP_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s);
CUHEAP_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size,
                                                    CUmemoryPool pool, CUstream s);
CUHEAP_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
CUHEAP_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
CUHEAP_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
CUHEAP_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
CUHEAP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                        cuuint64_t flags);
CUHEAP_EXPORT void *dlsym(void *handle, const char *name);

typedef void (*cuheap_fn)(void); /* any function, as ISO C allows casting between them */

static const struct hook_entry {
    const char *name;
    cuheap_fn hook;
    size_t real_offset; /* of the real pointer in struct cuheap_driver */
} hooks[NR_HOOKS] = {
#define CUHEAP_HOOK_ENTRY(name)                                                                    \
    [H_##name] = {#name, (cuheap_fn)name, offsetof(struct cuheap_driver, name)},
    CUHEAP_HOOKS(CUHEAP_HOOK_ENTRY)
#undef CUHEAP_HOOK_ENTRY
};

_Static_assert(NR_HOOKS <= CUHEAP_NR_COUNTED_HOOKS, "each hook has its call counter");

/* Calls are counted per thread (counters.h): CUHEAP_CTR_CALLS + hook id. */
#define COUNT_CALL(name) cuheap_count(CUHEAP_CTR_CALLS + H_##name, 1)

/* The re-entry guard is cuheap_busy (runtime.h), one per thread for all of cuheap: a hook, a
 * mark or an NVTX callback reached while another runs on the thread (cuheap calling the
 * driver, a signal handler) goes straight to the driver or does nothing; a hook's free of a
 * pooled block, and the book-keeping of what the driver served, wait for the thread to leave
 * cuheap (defer.h). */

static void *real_of(const struct hook_entry *h)
{
    return *(void **)((char *)&cuheap_drv + h->real_offset);
}

/* The hook for a real driver function, or NULL when we do not hook it. */
static void *hook_for_real(void *real)
{
    if (!real)
        return NULL;
    for (int i = 0; i < NR_HOOKS; i++)
        if (real_of(&hooks[i]) == real) {
            void *hook;
            memcpy(&hook, &hooks[i].hook, sizeof(hook));
            return hook;
        }
    return NULL;
}

/* Count the call; decide whether cuheap does its part (active) or only forwards. */
#define ENTER(name)                                                                                \
    struct cuheap_counters *ctr = cuheap_counters_mine(); /* this thread's, or NULL */             \
    cuheap_count_in(ctr, CUHEAP_CTR_CALLS + H_##name, 1);                                          \
    bool active = cuheap_boot();                                                                   \
    if (!active && (cuheap_driver_load() || !cuheap_drv.name))                                     \
        return CUDA_ERROR_NOT_INITIALIZED;                                                         \
    if (active)                                                                                    \
        cuheap_busy = 1;

/* The value first, with the guard still set: the work it names (a pass-through's
 * book-keeping, its event and stack) is cuheap's, which a signal handler's hook must not
 * enter. Then the guard goes, with what nested calls left meanwhile (defer.h). */
#define LEAVE(value)                                                                               \
    do {                                                                                           \
        CUresult leave_r_ = (value);                                                               \
        if (active)                                                                                \
            cuheap_unbusy();                                                                       \
        return leave_r_;                                                                           \
    } while (0)

/* The driver served a call of a nested hook (defer.h): its book-keeping is left for later. */
#define NESTED(r) (!active && (r) == CUDA_SUCCESS && cuheap_nested())

/* A pass-through free: the layer's book-keeping around the driver's call, then LEAVE. */
#define PASSTHRU_FREE(key, api, stream, call)                                                      \
    do {                                                                                           \
        struct cuheap_passthru_free pf_;                                                           \
        cuheap_passthru_free_begin(&pf_, (key));                                                   \
        CUresult r_ = (call);                                                                      \
        LEAVE(cuheap_passthru_free_end(&pf_, r_, (key), (api), (stream)));                         \
    } while (0)

/* cuMemAlloc_v2 (and the pluggable allocator's driver memory): `out` is a CUdeviceptr *. */
static CUresult mem_alloc_fn(const struct cuheap_driver_call *call, void *out, uint64_t size,
                             uint64_t *ret_key, uint64_t *ret_size)
{
    CUdeviceptr *dptr = out;
    CUresult r = cuheap_drv.cuMemAlloc_v2(dptr, (size_t)size);
    if (r == CUDA_SUCCESS)
        *ret_key = *dptr;
    return r;
}

static const struct cuheap_driver_call mem_alloc_call = {mem_alloc_fn};

CUHEAP_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    ENTER(cuMemAlloc_v2);
    if (!active || !dptr || !size) {
        CUresult r = cuheap_drv.cuMemAlloc_v2(dptr, size);
        if (NESTED(r) && dptr && size)
            cuheap_defer_alloc(CUHEAP_API_MEM_ALLOC, *dptr, size, cuheap_driver_rounded(size), 0,
                               CUHEAP_DEFER_CURRENT);
        LEAVE(r);
    }
    LEAVE(cuheap_alloc_device(ctr, cuheap_device_current(), CUHEAP_API_MEM_ALLOC, size, 0,
                              &mem_alloc_call, dptr));
}

/* The driver's pitched allocation: what the program got is pitch times height. */
struct pitch_call {
    struct cuheap_driver_call call;
    size_t *pitch;
    size_t width, height;
    unsigned int elem;
};

static CUresult pitch_fn(const struct cuheap_driver_call *call, void *out, uint64_t size,
                         uint64_t *ret_key, uint64_t *ret_size)
{
    const struct pitch_call *c = (const struct pitch_call *)call;
    CUdeviceptr *dptr = out;
    CUresult r = cuheap_drv.cuMemAllocPitch_v2(dptr, c->pitch, c->width, c->height, c->elem);
    if (r == CUDA_SUCCESS) {
        *ret_key = *dptr;
        *ret_size = *c->pitch * c->height;
    }
    return r;
}

CUHEAP_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                          size_t height, unsigned int elem)
{
    ENTER(cuMemAllocPitch_v2);
    bool valid = dptr && pitch && width && height && (elem == 4 || elem == 8 || elem == 16);
    if (!active || !valid) {
        CUresult r = cuheap_drv.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
        if (NESTED(r) && valid)
            cuheap_defer_alloc(CUHEAP_API_PITCH, *dptr, *pitch * height,
                               cuheap_driver_rounded(*pitch * height), 0, CUHEAP_DEFER_CURRENT);
        LEAVE(r);
    }
    struct pitch_call c = {{pitch_fn}, pitch, width, height, elem};
    LEAVE(cuheap_alloc_pitch(ctr, cuheap_device_current(), width, height, &c.call, dptr, pitch));
}

/* cuMemFree_v2's pass-through, apart so that the pooled path stays short. */
static __attribute__((noinline)) CUresult mem_free_driver(CUdeviceptr dptr)
{
    struct cuheap_passthru_free f;
    cuheap_passthru_free_begin(&f, dptr);
    CUresult r = cuheap_drv.cuMemFree_v2(dptr);
    return cuheap_passthru_free_end(&f, r, dptr, CUHEAP_API_MEM_ALLOC, 0);
}

CUHEAP_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    ENTER(cuMemFree_v2);
    if (!active || !dptr) {
        if (!active && dptr && cuheap_nested() &&
            cuheap_defer_pooled_free(dptr, 0, CUHEAP_API_MEM_ALLOC))
            LEAVE(CUDA_SUCCESS);
        CUresult r = cuheap_drv.cuMemFree_v2(dptr);
        if (NESTED(r) && dptr)
            cuheap_defer_freed(CUHEAP_API_MEM_ALLOC, dptr, 0);
        LEAVE(r);
    }
    int freed = cuheap_free_pooled(ctr, dptr, 0, CUHEAP_API_MEM_ALLOC);
    if (freed)
        LEAVE(freed > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
    LEAVE(mem_free_driver(dptr));
}

/* Stream-ordered allocations belong to the driver's own pools; they pass through. */
struct async_call {
    struct cuheap_driver_call call;
    CUresult (*alloc)(CUdeviceptr *, size_t, CUstream); /* NULL: from_pool */
    CUresult (*from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUmemoryPool pool;
    CUstream s;
};

static CUresult async_fn(const struct cuheap_driver_call *call, void *out, uint64_t size,
                         uint64_t *ret_key, uint64_t *ret_size)
{
    const struct async_call *c = (const struct async_call *)call;
    CUdeviceptr *dptr = out;
    CUresult r = c->from_pool ? c->from_pool(dptr, (size_t)size, c->pool, c->s)
                              : c->alloc(dptr, (size_t)size, c->s);
    if (r == CUDA_SUCCESS)
        *ret_key = *dptr;
    return r;
}

/* `direct` is the driver's own call; the rest describe it for the allocation layer. */
#define ASYNC_ALLOC(name, api, direct, ...)                                                        \
    ENTER(name);                                                                                   \
    uint64_t actual = (size + 511) & ~(uint64_t)511;                                               \
    if (!active || !dptr || !size) {                                                               \
        CUresult r = (direct);                                                                     \
        if (NESTED(r) && dptr && size)                                                             \
            cuheap_defer_alloc(api, *dptr, size, actual, (uint64_t)(uintptr_t)s,                   \
                               CUHEAP_DEFER_CURRENT);                                              \
        LEAVE(r);                                                                                  \
    }                                                                                              \
    struct async_call ac = {{async_fn}, __VA_ARGS__};                                              \
    LEAVE(cuheap_alloc_passthru(cuheap_device_current(), api, size, actual,                        \
                                (uint64_t)(uintptr_t)s, true, &ac.call, dptr))

CUHEAP_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
    ASYNC_ALLOC(cuMemAllocAsync, CUHEAP_API_ASYNC, cuheap_drv.cuMemAllocAsync(dptr, size, s),
                cuheap_drv.cuMemAllocAsync, NULL, NULL, s);
}

CUHEAP_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
    ASYNC_ALLOC(cuMemAllocAsync_ptsz, CUHEAP_API_ASYNC,
                cuheap_drv.cuMemAllocAsync_ptsz(dptr, size, s), cuheap_drv.cuMemAllocAsync_ptsz,
                NULL, NULL, s);
}

CUHEAP_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                               CUstream s)
{
    ASYNC_ALLOC(cuMemAllocFromPoolAsync, CUHEAP_API_POOL_ASYNC,
                cuheap_drv.cuMemAllocFromPoolAsync(dptr, size, pool, s), NULL,
                cuheap_drv.cuMemAllocFromPoolAsync, pool, s);
}

CUHEAP_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size,
                                                    CUmemoryPool pool, CUstream s)
{
    ASYNC_ALLOC(cuMemAllocFromPoolAsync_ptsz, CUHEAP_API_POOL_ASYNC,
                cuheap_drv.cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, s), NULL,
                cuheap_drv.cuMemAllocFromPoolAsync_ptsz, pool, s);
}

/* cudaFreeAsync of a pooled pointer is a stream-ordered free of our block. */
#define ASYNC_FREE(name, call)                                                                     \
    ENTER(name);                                                                                   \
    if (!active || !dptr) {                                                                        \
        uint64_t stream_ = s ? (uint64_t)(uintptr_t)s : 1;                                         \
        if (!active && dptr && cuheap_nested() &&                                                  \
            cuheap_defer_pooled_free(dptr, stream_, CUHEAP_API_ASYNC))                             \
            LEAVE(CUDA_SUCCESS);                                                                   \
        CUresult r = (call);                                                                       \
        if (NESTED(r) && dptr)                                                                     \
            cuheap_defer_freed(CUHEAP_API_ASYNC, dptr, (uint64_t)(uintptr_t)s);                    \
        LEAVE(r);                                                                                  \
    }                                                                                              \
    int freed = cuheap_free_pooled(ctr, dptr, s ? (uint64_t)(uintptr_t)s : 1, CUHEAP_API_ASYNC);   \
    if (freed)                                                                                     \
        LEAVE(freed > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);                                \
    PASSTHRU_FREE(dptr, CUHEAP_API_ASYNC, (uint64_t)(uintptr_t)s, call)

CUHEAP_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    ASYNC_FREE(cuMemFreeAsync, cuheap_drv.cuMemFreeAsync(dptr, s));
}

CUHEAP_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    ASYNC_FREE(cuMemFreeAsync_ptsz, cuheap_drv.cuMemFreeAsync_ptsz(dptr, s));
}

struct managed_call {
    struct cuheap_driver_call call;
    unsigned int flags;
};

static CUresult managed_fn(const struct cuheap_driver_call *call, void *out, uint64_t size,
                           uint64_t *ret_key, uint64_t *ret_size)
{
    CUdeviceptr *dptr = out;
    CUresult r = cuheap_drv.cuMemAllocManaged(dptr, (size_t)size,
                                              ((const struct managed_call *)call)->flags);
    if (r == CUDA_SUCCESS)
        *ret_key = *dptr;
    return r;
}

CUHEAP_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    ENTER(cuMemAllocManaged);
    uint64_t actual = cuheap_driver_rounded(size);
    if (!active || !dptr || !size) {
        CUresult r = cuheap_drv.cuMemAllocManaged(dptr, size, flags);
        if (NESTED(r) && dptr && size)
            cuheap_defer_alloc(CUHEAP_API_MANAGED, *dptr, size, actual, 0, CUHEAP_DEFER_CURRENT);
        LEAVE(r);
    }
    struct managed_call c = {{managed_fn}, flags};
    LEAVE(cuheap_alloc_passthru(cuheap_device_current(), CUHEAP_API_MANAGED, size, actual, 0, true,
                                &c.call, dptr));
}

/* Pinned host memory: recorded, not counted against the device. */
CUHEAP_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    ENTER(cuMemHostAlloc);
    CUresult r = cuheap_drv.cuMemHostAlloc(pp, size, flags);
    if (NESTED(r))
        cuheap_defer_alloc(CUHEAP_API_HOST, (uint64_t)(uintptr_t)*pp, size, size, 0,
                           CUHEAP_DEFER_HOST);
    if (!active)
        LEAVE(r);
    LEAVE(cuheap_passthru_done(cuheap_device_current(), r, CUHEAP_API_HOST,
                               r ? 0 : (uint64_t)(uintptr_t)*pp, size, size, 0, false));
}

CUHEAP_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
    ENTER(cuMemAllocHost_v2);
    CUresult r = cuheap_drv.cuMemAllocHost_v2(pp, size);
    if (NESTED(r))
        cuheap_defer_alloc(CUHEAP_API_HOST, (uint64_t)(uintptr_t)*pp, size, size, 0,
                           CUHEAP_DEFER_HOST);
    if (!active)
        LEAVE(r);
    LEAVE(cuheap_passthru_done(cuheap_device_current(), r, CUHEAP_API_HOST,
                               r ? 0 : (uint64_t)(uintptr_t)*pp, size, size, 0, false));
}

CUHEAP_EXPORT CUresult cuMemFreeHost(void *p)
{
    ENTER(cuMemFreeHost);
    if (!active || !p) {
        CUresult r = cuheap_drv.cuMemFreeHost(p);
        if (NESTED(r) && p)
            cuheap_defer_freed(CUHEAP_API_HOST, (uint64_t)(uintptr_t)p, 0);
        LEAVE(r);
    }
    PASSTHRU_FREE((uint64_t)(uintptr_t)p, CUHEAP_API_HOST, 0, cuheap_drv.cuMemFreeHost(p));
}

/* VMM: physical handles are keyed apart from addresses in the pass-through map. */
#define VMM_KEY(h) ((uint64_t)(h) ^ 0x5a5a000000000001ull)

/* A physical allocation: `out` is the handle. */
struct create_call {
    struct cuheap_driver_call call;
    const CUmemAllocationProp *prop;
    unsigned long long flags;
};

static CUresult create_fn(const struct cuheap_driver_call *call, void *out, uint64_t size,
                          uint64_t *ret_key, uint64_t *ret_size)
{
    const struct create_call *c = (const struct create_call *)call;
    CUmemGenericAllocationHandle *h = out;
    CUresult r = cuheap_drv.cuMemCreate(h, (size_t)size, c->prop, c->flags);
    if (r == CUDA_SUCCESS)
        *ret_key = VMM_KEY(*h);
    return r;
}

CUHEAP_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                                   const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER(cuMemCreate);
    if (!active || !h || !prop) {
        CUresult r = cuheap_drv.cuMemCreate(h, size, prop, flags);
        if (NESTED(r) && h && prop)
            cuheap_defer_alloc(CUHEAP_API_VMM_CREATE, VMM_KEY(*h), size, size, 0,
                               prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                                   ? prop->location.id
                                   : CUHEAP_DEFER_HOST);
        LEAVE(r);
    }
    struct cuheap_device *d = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                                  ? cuheap_device_by_ordinal(prop->location.id)
                                  : NULL;
    if (!d && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        struct cuheap_device *cur = cuheap_device_current();
        d = cur && cur->ordinal == prop->location.id ? cur : NULL;
    }
    struct create_call c = {{create_fn}, prop, flags};
    LEAVE(cuheap_alloc_passthru(d, CUHEAP_API_VMM_CREATE, size, size, 0, d != NULL, &c.call, h));
}

CUHEAP_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    ENTER(cuMemRelease);
    if (!active) {
        CUresult r = cuheap_drv.cuMemRelease(h);
        if (NESTED(r))
            cuheap_defer_freed(CUHEAP_API_VMM_CREATE, VMM_KEY(h), 0);
        LEAVE(r);
    }
    PASSTHRU_FREE(VMM_KEY(h), CUHEAP_API_VMM_CREATE, 0, cuheap_drv.cuMemRelease(h));
}

CUHEAP_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                CUmemGenericAllocationHandle h, unsigned long long flags)
{
    ENTER(cuMemMap);
    CUresult r = cuheap_drv.cuMemMap(ptr, size, offset, h, flags);
    if (!active || r != CUDA_SUCCESS)
        LEAVE(r);
    /* A mapping makes memory usable but costs nothing new: an event, no accounting. */
    struct cuheap_addr_entry e;
    int dev = cuheap_addrmap_get(&cuheap_passthru, VMM_KEY(h), &e) == 0 ? e.device : -1;
    cuheap_record_alloc(cuheap_device_by_ordinal(dev), CUHEAP_API_VMM_MAP, 0, ptr, size, size, 0,
                        cuheap_event_seq());
    LEAVE(r);
}

CUHEAP_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER(cuMemUnmap);
    uint64_t seq = cuheap_event_seq();
    CUresult r = cuheap_drv.cuMemUnmap(ptr, size);
    if (!active || r != CUDA_SUCCESS)
        LEAVE(r);
    struct cuheap_device *d = cuheap_device_current();
    cuheap_record_free(d ? d->ordinal : -1, CUHEAP_API_VMM_MAP, 0, ptr, size, size, 0, seq);
    LEAVE(r);
}

/* ---- queries that must agree with the pool ---- */

CUHEAP_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    ENTER(cuMemGetInfo_v2);
    CUresult r = cuheap_drv.cuMemGetInfo_v2(free_bytes, total);
    if (!active || r != CUDA_SUCCESS)
        LEAVE(r);
    struct cuheap_device *d = cuheap_device_current();
    if (d && d->limit) {
        /* Under a limit the limit is the device: what is left of it, and never more than
         * the driver really has. */
        uint64_t used = atomic_load(&d->reserved);
        uint64_t left = used < d->limit ? d->limit - used : 0;
        *total = d->limit;
        if (left < *free_bytes)
            *free_bytes = left;
    }
    LEAVE(r);
}

CUHEAP_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    ENTER(cuMemGetAddressRange_v2);
    struct cuheap_pool *p = active ? cuheap_pool_of(dptr) : NULL;
    if (!p)
        LEAVE(cuheap_drv.cuMemGetAddressRange_v2(base, size, dptr));
    uint64_t b, s, id, arena;
    if (cuheap_pool_block_range(p, dptr, &b, &s, &id, &arena))
        LEAVE(CUDA_ERROR_NOT_FOUND); /* a freed block: as the driver says for freed memory */
    if (base)
        *base = b;
    if (size)
        *size = s;
    LEAVE(CUDA_SUCCESS);
}

/* Answer a range attribute for a pooled pointer. Returns 1 when answered, 0 when the driver
 * should answer, -1 for a pointer into a freed block. */
static int pooled_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    if (attr != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attr != CU_POINTER_ATTRIBUTE_RANGE_SIZE &&
        attr != CU_POINTER_ATTRIBUTE_BUFFER_ID &&
        attr != CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
        return 0;
    struct cuheap_pool *p = cuheap_pool_of(ptr);
    if (!p)
        return 0;
    uint64_t b, s, id, arena;
    if (cuheap_pool_block_range(p, ptr, &b, &s, &id, &arena))
        return -1;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = b;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = s;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = id;
        break;
    default:
        /* legacy IPC exports the whole arena: only a block at its start shares the right bytes */
        *(int *)data = b == arena;
        break;
    }
    return 1;
}

CUHEAP_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    ENTER(cuPointerGetAttribute);
    int answered = active && data ? pooled_attribute(data, attr, ptr) : 0;
    if (answered)
        LEAVE(answered > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
    LEAVE(cuheap_drv.cuPointerGetAttribute(data, attr, ptr));
}

CUHEAP_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs,
                                              void **data, CUdeviceptr ptr)
{
    ENTER(cuPointerGetAttributes);
    CUresult r = cuheap_drv.cuPointerGetAttributes(n, attrs, data, ptr);
    if (!active || r != CUDA_SUCCESS || !attrs || !data || !cuheap_pool_of(ptr))
        LEAVE(r);
    for (unsigned i = 0; i < n; i++)
        if (data[i] && pooled_attribute(data[i], attrs[i], ptr) < 0)
            memset(data[i], 0, attrs[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE ? sizeof(size_t) : 8);
    LEAVE(r);
}

/* Legacy IPC shares a driver allocation. A vmm pool shares a block through cuheap's own
 * handle (src/ipc.c); a legacy arena can share only a block at its start (the driver exports
 * the whole arena, whose start the importer gets). */
CUHEAP_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr ptr)
{
    ENTER(cuIpcGetMemHandle);
    struct cuheap_pool *p = active && h ? cuheap_pool_of(ptr) : NULL;
    if (p && cuheap_pool_is_vmm(p)) {
        struct cuheap_device *d = cuheap_device_of_pool(p);
        int r = cuheap_ipc_export(d, ptr, h);
        if (r)
            cuheap_log_once("cuIpcGetMemHandle on a pooled block: %s",
                            r == -EINVAL ? "no live block holds that address"
                                         : "this process cannot serve IPC handles (a Unix "
                                           "socket could not be opened); run with "
                                           "CUHEAP_POOL_MAX below the shared buffers' size");
        LEAVE(r ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
    }
    if (p) {
        uint64_t b, s, id, arena;
        if (cuheap_pool_block_range(p, ptr, &b, &s, &id, &arena) || b != arena) {
            cuheap_log_once("cuIpcGetMemHandle on a pooled block: legacy IPC would share the "
                            "whole pool arena, not this block, so it is refused. Run with "
                            "CUHEAP_BACKING=vmm (the default), CUHEAP_POOL=0, or "
                            "CUHEAP_POOL_MAX below the shared buffers' size");
            LEAVE(CUDA_ERROR_INVALID_VALUE);
        }
    }
    LEAVE(cuheap_drv.cuIpcGetMemHandle(h, ptr));
}

/* A cuheap handle is opened by cuheap (the exporter runs it); any other by the driver. */
CUHEAP_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h,
                                             unsigned int flags)
{
    ENTER(cuIpcOpenMemHandle_v2);
    if (active && pdptr && cuheap_ipc_is_ours(&h))
        LEAVE(cuheap_ipc_open(pdptr, &h));
    LEAVE(cuheap_drv.cuIpcOpenMemHandle_v2(pdptr, h, flags));
}

CUHEAP_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr ptr)
{
    ENTER(cuIpcCloseMemHandle);
    if (active && cuheap_ipc_close(ptr))
        LEAVE(CUDA_SUCCESS);
    LEAVE(cuheap_drv.cuIpcCloseMemHandle(ptr));
}

/* ---- streams: the fences must know every non-blocking stream ---- */

static void stream_created(CUresult r, CUstream *ph, unsigned flags)
{
    if (r != CUDA_SUCCESS || !(flags & CU_STREAM_NON_BLOCKING))
        return;
    CUcontext ctx = NULL;
    cuheap_drv.cuCtxGetCurrent(&ctx);
    cuheap_streams_changed(ctx, *ph, true);
}

CUHEAP_EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    ENTER(cuStreamCreate);
    CUresult r = cuheap_drv.cuStreamCreate(ph, flags);
    if (active)
        stream_created(r, ph, flags);
    LEAVE(r);
}

CUHEAP_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int prio)
{
    ENTER(cuStreamCreateWithPriority);
    CUresult r = cuheap_drv.cuStreamCreateWithPriority(ph, flags, prio);
    if (active)
        stream_created(r, ph, flags);
    LEAVE(r);
}

/* Work queued on a stream still runs after the stream is destroyed, but fences recorded after
 * it left the known streams no longer wait for it: a block freed while that work may read it
 * would come back too early. So the stream's work is waited for first (an event, as the
 * driver's own fences are), then the stream is forgotten. Only when fences are what keeps
 * reuse safe; if the wait cannot be set up, the stream stays known (a fence on a destroyed
 * stream fails, and the pool then waits for the device). */
static bool drain_stream(CUstream s)
{
    if (!cuheap_cfg.pool || cuheap_cfg.reuse != CUHEAP_REUSE_FENCE || !s || s == CU_STREAM_LEGACY ||
        s == CU_STREAM_PER_THREAD)
        return true;
    CUevent ev = NULL;
    if (cuheap_drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return false;
    bool done = cuheap_drv.cuEventRecord(ev, s) == CUDA_SUCCESS &&
                cuheap_drv.cuEventSynchronize(ev) == CUDA_SUCCESS;
    cuheap_drv.cuEventDestroy_v2(ev);
    return done;
}

CUHEAP_EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    ENTER(cuStreamDestroy_v2);
    if (active && drain_stream(s))
        cuheap_streams_changed(NULL, s, false);
    LEAVE(cuheap_drv.cuStreamDestroy_v2(s));
}

/* Which stream a capture is on. The per-thread default stream (CU_STREAM_PER_THREAD, or the
 * default stream as a _ptsz entry point sees it) is one stream per thread: it is keyed by a
 * per-thread address so two threads capturing their own are two captures. */
static __thread char per_thread_stream_key __attribute__((tls_model("initial-exec")));

static CUstream capture_key(CUstream s, bool ptsz)
{
    if (s == CU_STREAM_PER_THREAD || (ptsz && s == NULL))
        return (CUstream)(void *)&per_thread_stream_key;
    return s;
}

CUHEAP_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCapture_v2);
    /* Counted before the capture begins: a fence recorded on the stream from now on (by any
     * thread) would become a node of the program's graph. Uncounted if the driver refuses. */
    bool marked = active && cuheap_capture_changed(capture_key(s, false), true);
    CUresult r = cuheap_drv.cuStreamBeginCapture_v2(s, mode);
    if (marked && r != CUDA_SUCCESS)
        cuheap_capture_changed(capture_key(s, false), false);
    LEAVE(r);
}

CUHEAP_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    ENTER(cuStreamBeginCapture_v2_ptsz);
    bool marked = active && cuheap_capture_changed(capture_key(s, true), true); /* as above */
    CUresult r = cuheap_drv.cuStreamBeginCapture_v2_ptsz(s, mode);
    if (marked && r != CUDA_SUCCESS)
        cuheap_capture_changed(capture_key(s, true), false);
    LEAVE(r);
}

CUHEAP_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    ENTER(cuStreamEndCapture);
    CUresult r = cuheap_drv.cuStreamEndCapture(s, g);
    if (active) /* a failed end still ends the capture */
        cuheap_capture_changed(capture_key(s, false), false);
    LEAVE(r);
}

CUHEAP_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
    ENTER(cuStreamEndCapture_ptsz);
    CUresult r = cuheap_drv.cuStreamEndCapture_ptsz(s, g);
    if (active)
        cuheap_capture_changed(capture_key(s, true), false);
    LEAVE(r);
}

/* ---- contexts going away: the driver frees their memory, the pool must forget it ---- */

CUHEAP_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER(cuDevicePrimaryCtxReset_v2);
    unsigned flags = 0;
    int is_active = 0;
    if (active && cuheap_drv.cuDevicePrimaryCtxGetState &&
        cuheap_drv.cuDevicePrimaryCtxGetState(dev, &flags, &is_active) == CUDA_SUCCESS &&
        is_active) {
        /* the primary context's handle, without changing its reference count for good */
        CUcontext primary = NULL;
        if (cuheap_drv.cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS) {
            cuheap_drv.cuDevicePrimaryCtxRelease_v2(dev);
            struct cuheap_device *d = cuheap_device_by_ctx(primary);
            if (d)
                cuheap_device_gone(d, false);
        }
    }
    LEAVE(cuheap_drv.cuDevicePrimaryCtxReset_v2(dev));
}

CUHEAP_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER(cuCtxDestroy_v2);
    struct cuheap_device *d = active ? cuheap_device_by_ctx(ctx) : NULL;
    if (d)
        cuheap_device_gone(d, true);
    LEAVE(cuheap_drv.cuCtxDestroy_v2(ctx));
}

/* Peer access covers what cuMemAlloc gave; pooled memory under CUHEAP_BACKING=vmm is mapped
 * by cuheap, and a mapping is accessible only to the devices its cuMemSetAccess named. So the
 * peer's pool grants the current device access on every chunk it has mapped, and on every
 * chunk it maps from now on. */
CUHEAP_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    ENTER(cuCtxEnablePeerAccess);
    CUresult r = cuheap_drv.cuCtxEnablePeerAccess(peer, flags);
    CUdevice accessor, owner;
    CUcontext popped;
    if (!active || (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) ||
        cuheap_drv.cuCtxGetDevice(&accessor) != CUDA_SUCCESS)
        LEAVE(r);
    if (cuheap_drv.cuCtxPushCurrent_v2(peer) != CUDA_SUCCESS)
        LEAVE(r);
    CUresult got = cuheap_drv.cuCtxGetDevice(&owner);
    cuheap_drv.cuCtxPopCurrent_v2(&popped);
    if (got != CUDA_SUCCESS)
        LEAVE(r);
    cuheap_backend_cuda_add_peer(owner, accessor);
    struct cuheap_device *d = cuheap_device_by_ctx(peer);
    if (d && cuheap_pool_grant_access(d->pool))
        cuheap_log_once("could not give device %d access to pooled memory of device %d: "
                        "kernels there that read it will fault; run with CUHEAP_BACKING=legacy",
                        (int)accessor, (int)owner);
    LEAVE(r);
}

/* ---- the lookup doors ---- */

static void remap(void **pfn)
{
    void *hook = hook_for_real(*pfn);
    if (hook)
        *pfn = hook;
}

CUHEAP_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                           cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    COUNT_CALL(cuGetProcAddress_v2);
    if (cuheap_driver_load() || !cuheap_drv.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = cuheap_drv.cuGetProcAddress_v2(symbol, pfn, version, flags, st);
    if (r == CUDA_SUCCESS && pfn)
        remap(pfn);
    return r;
}

CUHEAP_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                        cuuint64_t flags)
{
    COUNT_CALL(cuGetProcAddress);
    if (cuheap_driver_load() || !cuheap_drv.cuGetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = cuheap_drv.cuGetProcAddress(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn)
        remap(pfn);
    return r;
}

/* Sanitizer runtimes resolve their interceptors through dlsym before their own shadow memory
 * exists, so the dlsym path must not be instrumented. */
#define CUHEAP_NO_SANITIZE                                                                         \
    __attribute__((no_sanitize_address, no_sanitize_thread, no_sanitize("undefined")))

/* Driver names look like cuMemAlloc_v2: "cu" then a capital. cudnn*, cublas*, cuda* do not. */
static CUHEAP_NO_SANITIZE bool is_driver_name(const char *name)
{
    return name && name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z';
}

static __attribute__((noinline)) void *dlsym_driver(void *handle, const char *name)
{
    cuheap_dlsym_fn real = cuheap_real_dlsym();
    void *p;
    if (handle == RTLD_NEXT) {
        /* RTLD_NEXT is relative to the caller, which we cannot pass on; for a driver name the
         * next definition after any caller is the driver's own. */
        p = cuheap_driver_load() == 0 ? real(cuheap_drv.handle, name) : NULL;
    } else {
        p = real(handle, name);
    }
    if (p && cuheap_driver_load() == 0)
        remap(&p);
    return p;
}

/* Everything that is not a driver name goes straight to glibc as a tail call, so the
 * return address glibc sees (which RTLD_NEXT depends on) is our caller's. */
CUHEAP_EXPORT CUHEAP_NO_SANITIZE __attribute__((optimize("optimize-sibling-calls"))) void *
dlsym(void *handle, const char *name)
{
    if (__builtin_expect(is_driver_name(name), 0))
        return dlsym_driver(handle, name);
    return cuheap_real_dlsym()(handle, name);
}

/* ---- public: counters and the pluggable allocator ---- */

CUHEAP_API uint64_t cuheap_call_count(const char *entry_point)
{
    for (int i = 0; entry_point && i < NR_HOOKS; i++)
        if (!strcmp(hooks[i].name, entry_point))
            return (uint64_t)cuheap_counters_sum(CUHEAP_CTR_CALLS + (unsigned)i);
    return 0;
}

/* The stream tag the pool keys on: the legacy default stream is 0x1, as in cuda.h. */
static uint64_t stream_tag(void *stream)
{
    return stream ? (uint64_t)(uintptr_t)stream : (uint64_t)(uintptr_t)CU_STREAM_LEGACY;
}

static struct cuheap_device *device_for(int ordinal, bool *ret_pushed)
{
    *ret_pushed = false;
    struct cuheap_device *d = cuheap_device_current();
    if (d && d->ordinal == ordinal)
        return d;
    CUcontext ctx;
    CUdevice dev;
    if (!cuheap_drv.cuCtxPushCurrent_v2 || cuheap_drv.cuDeviceGet(&dev, ordinal) ||
        cuheap_drv.cuDevicePrimaryCtxRetain(&ctx, dev) || cuheap_drv.cuCtxPushCurrent_v2(ctx))
        return NULL;
    *ret_pushed = true;
    return cuheap_device_current();
}

CUHEAP_API void *cuheap_torch_alloc(ssize_t size, int device, void *stream)
{
    if (size <= 0 || cuheap_busy || !cuheap_boot())
        return NULL;
    struct cuheap_counters *ctr = cuheap_counters_mine();
    bool pushed;
    struct cuheap_device *d = device_for(device, &pushed);
    if (!d)
        return NULL;
    cuheap_busy = 1;
    CUdeviceptr p = 0;
    if (cuheap_alloc_device(ctr, d, CUHEAP_API_TORCH, (uint64_t)size, stream_tag(stream),
                            &mem_alloc_call, &p) != CUDA_SUCCESS)
        p = 0;
    cuheap_unbusy();
    if (pushed) {
        CUcontext dummy;
        cuheap_drv.cuCtxPopCurrent_v2(&dummy);
    }
    return (void *)(uintptr_t)p;
}

CUHEAP_API void cuheap_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
    (void)size;
    (void)device;
    if (!ptr || cuheap_busy || !cuheap_boot())
        return;
    struct cuheap_counters *ctr = cuheap_counters_mine();
    cuheap_busy = 1;
    uint64_t p = (uint64_t)(uintptr_t)ptr;
    if (!cuheap_free_pooled(ctr, p, stream_tag(stream), CUHEAP_API_TORCH)) {
        /* A pass-through block: the driver's free syncs the device, as cudaFree would. */
        struct cuheap_passthru_free f;
        cuheap_passthru_free_begin(&f, p);
        cuheap_passthru_free_end(&f, cuheap_drv.cuMemFree_v2(p), p, CUHEAP_API_TORCH,
                                 stream_tag(stream));
    }
    cuheap_unbusy();
}
