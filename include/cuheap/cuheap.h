/* SPDX-License-Identifier: MIT */
/*
 * cuheap public interface: what a program (or a test) may call in the preloaded library.
 * Everything here is safe to call whether or not CUDA was ever used, and from any thread.
 * Programs that want to stay runnable without cuheap should resolve these with
 * dlsym(RTLD_DEFAULT, "cuheap_...") and treat a NULL result as "not loaded".
 */
#ifndef CUHEAP_CUHEAP_H
#define CUHEAP_CUHEAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUHEAP_API __attribute__((visibility("default")))

/* Process-wide figures, summed over devices. Sizes are bytes. */
struct cuheap_stats {
    uint64_t live_bytes;      /* bytes the program holds now (requested sizes) */
    uint64_t peak_live_bytes; /* highest live_bytes seen */
    uint64_t
        reserved_bytes; /* bytes cuheap holds from the driver now (pool arenas + pass-through) */
    uint64_t peak_reserved_bytes; /* highest reserved_bytes seen */
    uint64_t nr_allocs;           /* allocation calls that succeeded, all APIs */
    uint64_t nr_frees;            /* free calls that succeeded, all APIs */
    uint64_t nr_pool_hits;        /* allocations served from the pool without the driver */
    uint64_t nr_pool_misses;      /* pool-eligible allocations that needed the driver */
    uint64_t nr_passthrough;      /* allocations that went to the driver by design */
    uint64_t nr_ooms;             /* CUDA_ERROR_OUT_OF_MEMORY returned to the program */
    uint64_t nr_events;           /* events recorded */
    uint64_t nr_dropped;          /* events not written: the ring was full, or they came
                                     after recording stopped at exit */
    uint64_t nr_arenas;           /* pool arenas held now */
    /* Mapping operations of the vmm pool, counted since start (0 under legacy backing): what a
     * warm job should stop making. Appended: a caller built before them passes the older
     * size and gets the fields above. */
    uint64_t nr_chunks_created;  /* chunks of device memory taken from the driver (cuMemCreate,
                                    map, set access) */
    uint64_t nr_chunks_moved;    /* idle chunks unmapped and mapped again where a block needed
                                    them */
    uint64_t nr_chunks_released; /* idle chunks given back to the driver to make room for a new
                                    one (not those a trim or out-of-memory gives back) */
    uint64_t map_ns;             /* nanoseconds in the driver's create, map, set-access, unmap
                                    and release calls */
    /* cuheap's own time in the allocation path and the driver calls it makes, by kind, counted
     * since start: a step's cost to read without the host program's noise. Own time is the
     * time a thread spent in cuheap's allocation layer and the pool, less the driver calls
     * made meanwhile (counted below); it is the clock's, so a thread the OS takes the CPU from
     * meanwhile counts that too. Calls the pool serves are timed one in 32 on each thread and
     * the time scaled up (the clock costs more than a small pair), the rest (passed to the
     * driver) each. Appended as above. */
    uint64_t own_alloc_ns;     /* cuheap's own time in allocations */
    uint64_t own_free_ns;      /* cuheap's own time in frees */
    uint64_t nr_own_timed;     /* calls timed for the two figures above */
    uint64_t nr_program_calls; /* the program's allocations and frees cuheap passed to the
                                  driver (device memory; frees of any kind) */
    uint64_t program_ns;       /* time in them */
    uint64_t nr_map_calls;     /* the pool's memory and mapping calls: cuMemCreate, cuMemRelease,
                                  cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemAddressReserve,
                                  cuMemAddressFree; cuMemAlloc and cuMemFree of legacy arenas */
    uint64_t map_calls_ns;     /* time in them */
    uint64_t nr_record_calls;  /* the pool's cuEventRecord calls (fences) */
    uint64_t record_ns;        /* time in them: measured on those inside a timed call, scaled */
    uint64_t nr_query_calls;   /* the pool's cuEventQuery and cuStreamQuery calls */
    uint64_t query_ns;         /* time in them, as record_ns */
    uint64_t nr_sync_calls;    /* the pool's cuEventSynchronize and cuCtxSynchronize calls */
    uint64_t sync_ns;          /* time in them */
    uint64_t nr_other_calls;   /* the pool's cuEventCreate, cuMemGetInfo,
                                  cuMemExportToShareableHandle and granularity calls */
    uint64_t other_ns;         /* time in them */
};

/* Fill *ret with the current figures. size is sizeof(struct cuheap_stats) as the caller knows
 * it: a caller built against an older header passes a smaller size and gets the fields it
 * knows; newer fields are only ever appended. Returns 0, or -EINVAL. */
CUHEAP_API int cuheap_get_stats(struct cuheap_stats *ret, size_t size);

/* How many times the program called a hooked driver entry point by its versioned name
 * ("cuMemAlloc_v2", "cuMemFreeAsync_ptsz", ...), whichever door it came through.
 * Returns 0 for names cuheap does not hook. */
CUHEAP_API uint64_t cuheap_call_count(const char *entry_point);

/* Put a named marker into the trace (a phase, a step number). The string is copied. */
CUHEAP_API void cuheap_mark(const char *label);

/* Pause (on = 0) or resume (on = 1) recording, to record only part of a run (some steps of
 * a long job) or to measure what recording costs within one process. While paused, no event
 * is written and no stack is taken; the accounting, the summary and the statistics go on,
 * and the trace gets a mark where recording paused and where it resumed (an allocation made
 * while paused and freed after shows as a free of an unknown block). Returns whether
 * recording was on before the call (1 or 0), or -1 when cuheap records nothing
 * (CUHEAP_RECORD=0, or it could not start). */
CUHEAP_API int cuheap_set_recording(int on);

/* Entry points for PyTorch's CUDAPluggableAllocator: the stream is known, so a freed block
 * is reused in stream order (at once on the same stream, after a fence on another).
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator("libcuheap.so", "cuheap_torch_alloc",
 *                                                    "cuheap_torch_free")
 *   torch.cuda.memory.change_current_allocator(alloc)
 * Returns NULL when the device cannot give the memory. */
CUHEAP_API void *cuheap_torch_alloc(ssize_t size, int device, void *stream);
CUHEAP_API void cuheap_torch_free(void *ptr, ssize_t size, int device, void *stream);

#ifdef __cplusplus
}
#endif

#endif
