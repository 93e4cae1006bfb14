/* SPDX-License-Identifier: MIT */
/*
 * The pool's device backend over the real driver. A fence is one event on the legacy stream
 * (which orders every blocking stream, per-thread default streams included) plus one on every
 * non-blocking stream cuheap saw created in that context: together they complete only once
 * all work submitted before them has, which is what the driver's own cuMemFree waits for.
 *
 * Fence slots live in struct cuheap_cuda_device. A slot is taken with a compare-and-swap and
 * let go when its last holder lets go: the pool takes them under its lock, and the timeline
 * of threads' large blocks under its own (pool.c).
 *
 * Every driver call made here for the pool is counted by kind, and timed (DRV, counters.h);
 * the context switches around them are cheap and count as cuheap's own time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "backend_cuda.h"
#include "counters.h"
#include "driver.h"
#include "log.h"

/* r = call, a driver call of the given kind: counted and timed (counters.h) as cuheap's own
 * calls, by kind, for the summary and cuheap_get_stats. */
#define DRV(kind, r, call)                                                                         \
    do {                                                                                           \
        uint64_t t0_ = cuheap_drv_start(kind);                                                     \
        (r) = (call);                                                                              \
        cuheap_drv_done((kind), t0_);                                                              \
    } while (0)

#define NR_MAX_STREAMS 4096

struct known_stream {
    CUcontext ctx;
    CUstream stream;
};

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static struct known_stream streams[NR_MAX_STREAMS]; /* guarded by streams_lock */
static unsigned nr_streams;
/* A non-blocking stream was created with the list full: neither an event on every listed
 * stream nor their being idle says anything about it, so from then on every fence is a device
 * sync (fence_record refuses) and no stream counts as idle. */
static bool streams_unlisted;

void cuheap_streams_add(CUcontext ctx, CUstream s)
{
    pthread_mutex_lock(&streams_lock);
    if (nr_streams < NR_MAX_STREAMS) {
        streams[nr_streams++] = (struct known_stream){ctx, s};
    } else {
        streams_unlisted = true;
        cuheap_log_once("more than %d non-blocking streams: freed blocks now wait for a device "
                        "sync (as with CUHEAP_REUSE=sync)",
                        NR_MAX_STREAMS);
    }
    pthread_mutex_unlock(&streams_lock);
}

void cuheap_streams_atfork_prepare(void)
{
    pthread_mutex_lock(&streams_lock);
}

void cuheap_streams_atfork_parent(void)
{
    pthread_mutex_unlock(&streams_lock);
}

void cuheap_streams_atfork_child(void)
{
    pthread_mutex_init(&streams_lock, NULL);
    nr_streams = 0; /* the parent's contexts, and their streams, are not the child's */
    streams_unlisted = false;
}

void cuheap_streams_remove(CUstream s)
{
    pthread_mutex_lock(&streams_lock);
    for (unsigned i = 0; i < nr_streams; i++)
        if (streams[i].stream == s) {
            streams[i] = streams[--nr_streams];
            break;
        }
    pthread_mutex_unlock(&streams_lock);
}

/* Make d's context current for the duration of a call; returns whether one was pushed. */
static bool enter_ctx(struct cuheap_cuda_device *d)
{
    CUcontext cur = NULL;
    CUcontext want = d->ctx;
    if (cuheap_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == want)
        return false;
    return cuheap_drv.cuCtxPushCurrent_v2 && cuheap_drv.cuCtxPushCurrent_v2(want) == CUDA_SUCCESS;
}

static void leave_ctx(bool pushed)
{
    CUcontext dummy;
    if (pushed)
        cuheap_drv.cuCtxPopCurrent_v2(&dummy);
}

static int mem_alloc(void *ctx, uint64_t size, uint64_t *ret_ptr)
{
    struct cuheap_cuda_device *d = ctx;
    bool pushed = enter_ctx(d);
    CUdeviceptr p = 0;
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemAlloc_v2(&p, size));
    leave_ctx(pushed);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return CUHEAP_BE_OOM;
    if (r != CUDA_SUCCESS)
        return -5;
    *ret_ptr = p;
    return 0;
}

static int mem_free(void *ctx, uint64_t ptr)
{
    struct cuheap_cuda_device *d = ctx;
    bool pushed = enter_ctx(d);
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemFree_v2(ptr));
    leave_ctx(pushed);
    return r == CUDA_SUCCESS ? 0 : -5;
}

static int record_on(struct cuheap_fence *f, CUstream s)
{
    if (f->nr == CUHEAP_NR_MAX_FENCE_STREAMS)
        return -1;
    CUevent *ev = &f->events[f->nr];
    CUresult r = CUDA_SUCCESS;
    if (!*ev)
        DRV(CUHEAP_DRV_OTHER, r, cuheap_drv.cuEventCreate(ev, CU_EVENT_DISABLE_TIMING));
    if (r != CUDA_SUCCESS) {
        *ev = NULL;
        return -1;
    }
    DRV(CUHEAP_DRV_RECORD, r, cuheap_drv.cuEventRecord(*ev, s));
    if (r != CUDA_SUCCESS)
        return -1;
    f->nr++;
    return 0;
}

static struct cuheap_fence *fence_slot(struct cuheap_cuda_device *d)
{
    for (unsigned i = 0; i < CUHEAP_NR_FENCES; i++) {
        struct cuheap_fence *f = &d->fences[i];
        bool free_slot = false;
        if (!atomic_load_explicit(&f->in_use, memory_order_relaxed) &&
            atomic_compare_exchange_strong(&f->in_use, &free_slot, true)) {
            atomic_store_explicit(&f->refs, 1, memory_order_relaxed);
            f->nr = 0;
            return f;
        }
    }
    return NULL;
}

static int fence_record(void *ctx, void **ret_fence)
{
    struct cuheap_cuda_device *d = ctx;
    struct cuheap_fence *f = fence_slot(d);
    if (!f)
        return -1;
    bool pushed = enter_ctx(d);
    int r = record_on(f, CU_STREAM_LEGACY);
    CUcontext want = d->ctx;
    pthread_mutex_lock(&streams_lock);
    if (streams_unlisted)
        r = -1;
    for (unsigned i = 0; i < nr_streams && r == 0; i++)
        if (streams[i].ctx == want)
            r = record_on(f, streams[i].stream);
    pthread_mutex_unlock(&streams_lock);
    leave_ctx(pushed);
    if (r) {
        atomic_store_explicit(&f->in_use, false, memory_order_release);
        return -1;
    }
    *ret_fence = f;
    return 0;
}

/* The streams a fence would record on, asked whether they are idle: the legacy stream (whose
 * answer covers the blocking and per-thread default streams, as its events do: the query has
 * default-stream semantics and its success counts as a cuStreamSynchronize, and it says busy
 * while a kernel runs on either: bench/probe-fence.c), then each non-blocking stream
 * known in the context. Anything but success on each, a capture's refusal included, is no. */
static int streams_idle(void *ctx)
{
    struct cuheap_cuda_device *d = ctx;
    if (!cuheap_drv.cuStreamQuery)
        return 0;
    bool pushed = enter_ctx(d);
    CUresult r;
    DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuStreamQuery(CU_STREAM_LEGACY));
    bool idle = r == CUDA_SUCCESS;
    CUcontext want = d->ctx;
    pthread_mutex_lock(&streams_lock);
    /* where a fence could not be recorded, no answer either: the list is incomplete, or the
     * context has more streams than a fence holds events (asking them all under the pool's
     * lock, a driver call each, would take too long) */
    unsigned asked = 1;
    idle = idle && !streams_unlisted;
    for (unsigned i = 0; i < nr_streams && idle; i++)
        if (streams[i].ctx == want) {
            idle = ++asked <= CUHEAP_NR_MAX_FENCE_STREAMS;
            if (idle)
                DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuStreamQuery(streams[i].stream));
            idle = idle && r == CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&streams_lock);
    leave_ctx(pushed);
    return idle;
}

static int fence_query(void *ctx, void *fence)
{
    struct cuheap_cuda_device *d = ctx;
    struct cuheap_fence *f = fence;
    for (unsigned i = 0; i < f->nr; i++) {
        CUresult r;
        DRV(CUHEAP_DRV_QUERY, r, cuheap_drv.cuEventQuery(f->events[i]));
        if (r == CUDA_ERROR_NOT_READY)
            return 0;
        /* a query refused because a stream captures (or an event caught in a capture) says
         * nothing about the fence: the pool decides what that means (fence_passed) */
        if (r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED &&
            r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
            atomic_store_explicit(&d->query_refused_code, (int)r, memory_order_relaxed);
            return CUHEAP_BE_NO_ANSWER;
        }
    }
    return 1; /* complete; a broken context also counts: nothing will run on it again */
}

static int fence_wait(void *ctx, void *fence)
{
    (void)ctx;
    struct cuheap_fence *f = fence;
    int r = 0;
    for (unsigned i = 0; i < f->nr; i++) {
        CUresult e;
        DRV(CUHEAP_DRV_SYNC, e, cuheap_drv.cuEventSynchronize(f->events[i]));
        if (e != CUDA_SUCCESS)
            r = -1;
    }
    return r;
}

/* A slot is taken again (its events recorded anew) only once nobody holds it. */
static void fence_hold(void *ctx, void *fence)
{
    (void)ctx;
    atomic_fetch_add_explicit(&((struct cuheap_fence *)fence)->refs, 1, memory_order_relaxed);
}

static void fence_destroy(void *ctx, void *fence)
{
    (void)ctx;
    struct cuheap_fence *f = fence;
    if (atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) == 1)
        atomic_store_explicit(&f->in_use, false, memory_order_release); /* events stay made */
}

static int stream_fence_record(void *ctx, uint64_t stream, void **ret_fence)
{
    struct cuheap_cuda_device *d = ctx;
    struct cuheap_fence *f = fence_slot(d);
    if (!f)
        return -1;
    bool pushed = enter_ctx(d);
    int r = record_on(f, (CUstream)(uintptr_t)stream);
    leave_ctx(pushed);
    if (r) {
        atomic_store_explicit(&f->in_use, false, memory_order_release);
        return -1;
    }
    *ret_fence = f;
    return 0;
}

static int device_sync(void *ctx)
{
    struct cuheap_cuda_device *d = ctx;
    bool pushed = enter_ctx(d);
    CUresult r;
    DRV(CUHEAP_DRV_SYNC, r, cuheap_drv.cuCtxSynchronize());
    leave_ctx(pushed);
    return r == CUDA_SUCCESS ? 0 : -5;
}

static int mem_info(void *ctx, uint64_t *ret_free, uint64_t *ret_total)
{
    struct cuheap_cuda_device *d = ctx;
    bool pushed = enter_ctx(d);
    size_t f = 0, t = 0;
    CUresult r;
    DRV(CUHEAP_DRV_OTHER, r, cuheap_drv.cuMemGetInfo_v2(&f, &t));
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        return -5;
    *ret_free = f;
    *ret_total = t;
    return 0;
}

static void forget(void *ctx)
{
    struct cuheap_cuda_device *d = ctx;
    memset(d->fences, 0, sizeof(d->fences)); /* the events were the dead context's */
    CUcontext dead = d->ctx;
    pthread_mutex_lock(&streams_lock);
    for (unsigned i = 0; i < nr_streams;)
        if (streams[i].ctx == dead)
            streams[i] = streams[--nr_streams];
        else
            i++;
    pthread_mutex_unlock(&streams_lock);
}

/* ---- virtual memory: address space, 2 MiB physical granules ---- */

static CUmemAllocationProp granule_prop(const struct cuheap_cuda_device *d)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->ordinal;
    return prop;
}

/* A VMM call failed: kept for the summary unless the device was out of memory. */
static void vmm_failed(struct cuheap_cuda_device *d, const char *call, CUresult r)
{
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return;
    atomic_store_explicit(&d->vmm_failed_code, (int)r, memory_order_relaxed);
    atomic_store_explicit(&d->vmm_failed_call, call, memory_order_relaxed);
}

static int va_reserve(void *ctx, uint64_t size, uint64_t *ret_va)
{
    struct cuheap_cuda_device *d = ctx;
    bool pushed = enter_ctx(d);
    CUdeviceptr va = 0;
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemAddressReserve(&va, size, d->granule, 0, 0));
    leave_ctx(pushed);
    if (r != CUDA_SUCCESS)
        vmm_failed(d, "cuMemAddressReserve", r);
    if (r != CUDA_SUCCESS)
        return r == CUDA_ERROR_OUT_OF_MEMORY ? CUHEAP_BE_OOM : -5;
    *ret_va = va;
    return 0;
}

static void va_free(void *ctx, uint64_t va, uint64_t size)
{
    (void)ctx;
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemAddressFree(va, size));
    (void)r;
}

/* Physical memory is created exportable as a POSIX file descriptor, so that a pooled block
 * can be shared with another process (cuIpcGetMemHandle, src/ipc.c); a device or driver that
 * refuses that gets plain memory from then on (and IPC is refused for it). */
static int phys_create(void *ctx, uint64_t size, uint64_t *ret_handle)
{
    struct cuheap_cuda_device *d = ctx;
    CUmemAllocationProp prop = granule_prop(d);
    CUmemGenericAllocationHandle h;
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (!atomic_load(&d->not_shareable)) {
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemCreate(&h, size, &prop, 0));
        if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED)
            atomic_store(&d->not_shareable, true);
    }
    if (atomic_load(&d->not_shareable)) {
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemCreate(&h, size, &prop, 0));
    }
    if (r != CUDA_SUCCESS)
        vmm_failed(d, "cuMemCreate", r);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return CUHEAP_BE_OOM;
    if (r != CUDA_SUCCESS)
        return -5;
    *ret_handle = (uint64_t)h;
    return 0;
}

static int phys_release(void *ctx, uint64_t handle)
{
    (void)ctx;
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemRelease((CUmemGenericAllocationHandle)handle));
    return r == CUDA_SUCCESS ? 0 : -5;
}

/* Devices that may access each device's pooled memory besides itself, one bit per ordinal
 * (cuCtxEnablePeerAccess). Kept by ordinal, not by context record: peer access may be
 * enabled before the owner's pool exists. */
static _Atomic uint64_t peers_of[64];

void cuheap_backend_cuda_add_peer(int owner, int accessor)
{
    if (owner >= 0 && owner < 64 && accessor >= 0 && accessor < 64)
        atomic_fetch_or(&peers_of[owner], 1ull << accessor);
}

/* Make [va, va + size) readable and writable by the device and every peer given access. */
static int phys_access(void *ctx, uint64_t va, uint64_t size)
{
    struct cuheap_cuda_device *d = ctx;
    CUmemAccessDesc access[64];
    uint64_t devices = d->ordinal < 64 ? atomic_load(&peers_of[d->ordinal]) : 0;
    size_t n = 0;
    memset(access, 0, sizeof(access));
    for (int dev = 0; dev < 64; dev++)
        if (dev == d->ordinal || (devices >> dev & 1)) {
            access[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            access[n].location.id = dev;
            access[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemSetAccess(va, size, access, n));
    if (r != CUDA_SUCCESS)
        vmm_failed(d, "cuMemSetAccess", r);
    return r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_OUT_OF_MEMORY ? CUHEAP_BE_OOM : -5;
}

/* Map physical memory whole and make it accessible as phys_access() does; on failure nothing
 * stays mapped (the unmap is tried twice: a range left mapped would refuse every later map). */
static int phys_map(void *ctx, uint64_t va, uint64_t size, uint64_t handle)
{
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r,
        cuheap_drv.cuMemMap(va, size, 0, (CUmemGenericAllocationHandle)handle, 0));
    if (r != CUDA_SUCCESS) {
        vmm_failed(ctx, "cuMemMap", r);
        return r == CUDA_ERROR_OUT_OF_MEMORY ? CUHEAP_BE_OOM : -5;
    }
    int a = phys_access(ctx, va, size);
    if (a) {
        DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemUnmap(va, size));
        if (r != CUDA_SUCCESS)
            DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemUnmap(va, size));
    }
    return a;
}

static int phys_export(void *ctx, uint64_t handle, int *ret_fd)
{
    struct cuheap_cuda_device *d = ctx;
    if (atomic_load(&d->not_shareable) || !cuheap_drv.cuMemExportToShareableHandle)
        return -5;
    CUresult r;
    DRV(CUHEAP_DRV_OTHER, r,
        cuheap_drv.cuMemExportToShareableHandle(ret_fd, (CUmemGenericAllocationHandle)handle,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    return r == CUDA_SUCCESS ? 0 : -5;
}

static int phys_unmap(void *ctx, uint64_t va, uint64_t size)
{
    (void)ctx;
    CUresult r;
    DRV(CUHEAP_DRV_MAP, r, cuheap_drv.cuMemUnmap(va, size));
    return r == CUDA_SUCCESS ? 0 : -5;
}

/* The device's granularity when it and the driver support virtual memory management, else 0
 * (the pool then uses cuMemAlloc arenas). */
static uint64_t vmm_granule(struct cuheap_cuda_device *d)
{
    if (!cuheap_drv.cuMemGetAllocationGranularity || !cuheap_drv.cuMemAddressReserve ||
        !cuheap_drv.cuMemAddressFree || !cuheap_drv.cuMemSetAccess || !cuheap_drv.cuMemCreate ||
        !cuheap_drv.cuMemMap || !cuheap_drv.cuMemUnmap || !cuheap_drv.cuMemRelease)
        return 0;
    CUmemAllocationProp prop = granule_prop(d);
    size_t g = 0;
    CUresult r;
    DRV(CUHEAP_DRV_OTHER, r,
        cuheap_drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (r != CUDA_SUCCESS || !g || (g & (g - 1)))
        return 0;
    return g;
}

void cuheap_backend_cuda_init(struct cuheap_cuda_device *d, CUcontext ctx, int ordinal,
                              struct cuheap_backend *ret)
{
    memset(d, 0, sizeof(*d));
    d->ctx = ctx;
    d->ordinal = ordinal;
    d->granule = vmm_granule(d);
    *ret = (struct cuheap_backend){
        .ctx = d,
        .mem_alloc = mem_alloc,
        .mem_free = mem_free,
        .fence_record = fence_record,
        .fence_query = fence_query,
        .fence_wait = fence_wait,
        .fence_destroy = fence_destroy,
        .fence_hold = fence_hold,
        .streams_idle = streams_idle,
        .stream_fence_record = stream_fence_record,
        .device_sync = device_sync,
        .mem_info = mem_info,
        .forget = forget,
        .granule = d->granule,
        .va_reserve = va_reserve,
        .va_free = va_free,
        .phys_create = phys_create,
        .phys_release = phys_release,
        .phys_map = phys_map,
        .phys_unmap = phys_unmap,
        .phys_access = phys_access,
        .phys_export = phys_export,
    };
}
