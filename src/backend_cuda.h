/* SPDX-License-Identifier: MIT */
/*
 * The device backend over the real driver (backend.h's operations for one device context):
 * arenas, VMM chunks, peer access and fences. Its state per device is its own
 * (struct cuheap_cuda_device, kept inside the runtime's device record, which the backend does
 * not know), and it reaches the driver only through driver.h.
 */
#ifndef CUHEAP_BACKEND_CUDA_H
#define CUHEAP_BACKEND_CUDA_H

#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define CUHEAP_NR_MAX_FENCE_STREAMS 256
#define CUHEAP_NR_FENCES                                                                           \
    208 /* a pool's epochs (64), three per thread cache for 32 threads (two batches, one large     \
           block), a few stream fences; when they run out a thread cache hands its frees to the    \
           pool's epochs instead */

/* One device fence: an event on the legacy stream and on every non-blocking stream. */
struct cuheap_fence {
    unsigned nr;           /* events recorded */
    _Atomic unsigned refs; /* the epoch that owns it, and waiters holding it; free at 0 */
    _Atomic bool in_use;
    CUevent events[CUHEAP_NR_MAX_FENCE_STREAMS]; /* created on first use, then reused */
};

struct cuheap_cuda_device {
    CUcontext ctx;
    int ordinal;
    uint64_t granule;           /* VMM granularity, 0 = the device has no VMM */
    _Atomic bool not_shareable; /* VMM memory cannot be exported as file descriptors here */
    /* The last address reservation, create, map or set-access the driver failed for another
     * reason than memory, and its answer (the summary names it when the pool gave the backing
     * up: it makes no such call after that), and the last fence query it refused (a stream
     * capture's error). 0 / NULL: none. */
    _Atomic(const char *) vmm_failed_call;
    _Atomic int vmm_failed_code;
    _Atomic int query_refused_code;
    /* taken and let go atomically: by the pool's paths under its lock, and for the timeline
     * of threads' large blocks (pool/timeline.c, tl_record_inside) under the timeline's own */
    struct cuheap_fence fences[CUHEAP_NR_FENCES];
};

/* Set up a backend for the device of ctx; d holds its state and must outlive it. */
void cuheap_backend_cuda_init(struct cuheap_cuda_device *d, CUcontext ctx, int ordinal,
                              struct cuheap_backend *ret);

/* cuCtxEnablePeerAccess succeeded: device `accessor` may now use memory of device `owner`.
 * Memory the pool maps for owner from now on is made accessible to accessor too; the hook
 * then has the pool grant it on what is mapped already (cuheap_pool_grant_access). */
void cuheap_backend_cuda_add_peer(int owner, int accessor);

/* Non-blocking streams the fences must cover. */
void cuheap_streams_add(CUcontext ctx, CUstream s);
void cuheap_streams_remove(CUstream s);
/* Around fork: the list's lock is taken by fences and idle checks of the threads' timeline,
 * which no pool lock covers, so fork takes it itself (last: nothing is waited for under it). */
void cuheap_streams_atfork_prepare(void);
void cuheap_streams_atfork_parent(void);
void cuheap_streams_atfork_child(void);

#endif
