/* SPDX-License-Identifier: MIT */
/*
 * The allocation layer: between the hooks, which only translate a CUDA call, and the pool
 * and the driver below. It is the one place that decides whether the pool or the driver
 * serves a request, applies the device's limit, reclaims the pool's spare memory and retries
 * when the driver is out of memory, keeps the pass-through map and the accounting, and emits
 * exactly one event per call (an allocation, a free, or an out-of-memory). The pooled path
 * (cuheap_alloc_device, cuheap_alloc_pooled, cuheap_free_pooled) and its small helpers are
 * inline here so that they stay inlined into the hooks (a pooled pair is counted in
 * instructions by bench/run-cpu.sh); the cold and pass-through parts (cuheap_alloc_passthru,
 * the one driver allocation sequence) live in alloc.c.
 *
 * Includes run one way: this header sees the runtime, the recorder, the events and the
 * driver table, never the hooks.
 */
#ifndef CUHEAP_ALLOC_H
#define CUHEAP_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

#include "counters.h"
#include "driver.h"
#include "event.h"
#include "recorder.h"
#include "runtime.h"

/* What the driver reserves for a request: 2 MiB pages for large ones, 512 B otherwise. A size
 * the rounding would wrap (near SIZE_MAX) stays as it is: the driver refuses it anyway, and
 * the limit must never see 0 bytes for it. */
static inline uint64_t cuheap_driver_rounded(uint64_t n)
{
    const uint64_t page = 2ull << 20;
    if (n > UINT64_MAX - page)
        return n;
    return n >= page ? (n + page - 1) & ~(page - 1) : (n + 511) & ~511ull;
}

/* The sequence number of an event about to be recorded, taken before the driver call where a
 * reuse of the address must come after it; 0 when not recording (the recorder numbers an
 * event without one as it takes it), so the pair without recording touches no shared line. */
static inline uint64_t cuheap_event_seq(void)
{
    return cuheap_recording() ? cuheap_seq_next() : 0;
}

/* Record an allocation's (or a free's) event, with the capture flag added when a stream
 * capture is under way: the events themselves, off the path taken when recording is off. */
__attribute__((noinline, cold)) void cuheap_record_alloc_event(struct cuheap_device *d, int api,
                                                               uint8_t flags, uint64_t ptr,
                                                               uint64_t size, uint64_t actual,
                                                               uint64_t stream, uint64_t seq);
__attribute__((noinline, cold)) void cuheap_record_free_event(int device, int api, uint8_t flags,
                                                              uint64_t ptr, uint64_t size,
                                                              uint64_t actual, uint64_t stream,
                                                              uint64_t seq);

/* Count an allocation and record its event when recording: without recording, one count in
 * this thread's own block. */
static inline void cuheap_record_alloc(struct cuheap_device *d, int api, uint8_t flags,
                                       uint64_t ptr, uint64_t size, uint64_t actual,
                                       uint64_t stream, uint64_t seq)
{
    cuheap_count(CUHEAP_CTR_ALLOCS, 1);
    if (__builtin_expect(cuheap_recording(), 0))
        cuheap_record_alloc_event(d, api, flags, ptr, size, actual, stream, seq);
}

/* Count a free and record its event when recording. */
static inline void cuheap_record_free(int device, int api, uint8_t flags, uint64_t ptr,
                                      uint64_t size, uint64_t actual, uint64_t stream, uint64_t seq)
{
    cuheap_count(CUHEAP_CTR_FREES, 1);
    if (__builtin_expect(cuheap_recording(), 0))
        cuheap_record_free_event(device, api, flags, ptr, size, actual, stream, seq);
}

/* Count an out-of-memory answer of `size` bytes and record its event: CUHEAP_EV_LIMIT when
 * the device's limit refused it (by_limit), CUHEAP_EV_OOM otherwise. */
void cuheap_record_oom(struct cuheap_device *d, int api, uint64_t size, bool by_limit);

/* ---- pass-through allocations ---- */

/* Count `actual` bytes against the device's limit before asking the driver; false when the
 * limit refuses them. Under pressure the pool gives back what it can spare first. True
 * without a device. */
bool cuheap_admit(struct cuheap_device *d, uint64_t actual);

/* After the driver said out of memory: give back empty arenas and say whether to retry. */
bool cuheap_reclaim_for_driver(struct cuheap_device *d);

/* Book-keep a pass-through allocation once the driver answered `r` (returned unchanged): on
 * failure give back the bytes admitted (device_mem) and record an out-of-memory; on success
 * enter `key` in the pass-through map, account it and record its event. */
CUresult cuheap_passthru_done(struct cuheap_device *d, CUresult r, int api, uint64_t key,
                              uint64_t size, uint64_t actual, uint64_t stream, bool device_mem);

/* A pass-through allocation's real driver call, described by the hook that translated it.
 * A hook whose call needs more than `out` and `size` embeds this struct as the first member
 * of its own and reads the rest from there. */
struct cuheap_driver_call;

/* Make the driver call for `size` bytes into `out` (a CUdeviceptr *, a handle *, ...) and
 * return the driver's answer; on success set *ret_key (the pass-through map's key) and, when
 * the program got other than `size` bytes, *ret_size (preset to `size`). */
typedef CUresult (*cuheap_driver_call_fn)(const struct cuheap_driver_call *call, void *out,
                                          uint64_t size, uint64_t *ret_key, uint64_t *ret_size);

struct cuheap_driver_call {
    cuheap_driver_call_fn fn;
};

/* Allocate through the driver: count `actual` bytes against the limit (a refusal records
 * the limit's out-of-memory for `size`), make the call, retried once after the pool gave
 * back what it can spare when the driver is out of memory, and book the answer with
 * cuheap_passthru_done(). Returns the driver's answer unchanged: the program gets what the
 * driver alone would have given it. `device_mem`: the bytes are the device's (`d`). */
__attribute__((noinline, cold)) CUresult
cuheap_alloc_passthru(struct cuheap_device *d, int api, uint64_t size, uint64_t actual,
                      uint64_t stream, bool device_mem, const struct cuheap_driver_call *call,
                      void *out);

/* cuMemAllocPitch's policy: rows rounded to 512 bytes (every pitch alignment the driver asks
 * of 2D accesses) served from the pool, else through the driver (`call`, whose answer sets
 * *ret_pitch). A width whose rounding would wrap goes to the driver without book-keeping: it
 * is the driver's to refuse. Sets *ret and *ret_pitch when it succeeds. */
CUresult cuheap_alloc_pitch(struct cuheap_counters *ctr, struct cuheap_device *d, size_t width,
                            size_t height, const struct cuheap_driver_call *call, CUdeviceptr *ret,
                            size_t *ret_pitch);

/* Free through the driver, keeping the map and the accounting exact: take the entry (and
 * the sequence number: a reuse of the address by the driver must come after the free) before
 * the call with cuheap_passthru_free_begin(), then settle once the driver answered with
 * cuheap_passthru_free_end(), which returns the driver's answer unchanged. */
struct cuheap_passthru_free {
    struct cuheap_addr_entry entry; /* the map's entry for the key, when known */
    bool known;                     /* the key was in the pass-through map */
    uint64_t seq;                   /* the free event's sequence number (0: not recording) */
    struct cuheap_own_span span;    /* cuheap's own time, from begin to end */
    uint64_t t;                     /* ticks when begin returned: the driver's call starts */
    bool timed;                     /* span was begun */
};

void cuheap_passthru_free_begin(struct cuheap_passthru_free *f, uint64_t key);
CUresult cuheap_passthru_free_end(struct cuheap_passthru_free *f, CUresult r, uint64_t key, int api,
                                  uint64_t stream);

/* ---- the pool's doors ---- */

/* cuheap_alloc_pooled() without its own time measured; d and the pool are on. */
static inline __attribute__((always_inline)) int
cuheap_alloc_pooled_untimed(struct cuheap_counters *ctr, struct cuheap_device *d, int api,
                            uint64_t size, uint64_t stream, CUdeviceptr *ret)
{
    uint64_t ptr, block, seq = 0; /* a sequence number only for an event recorded */
    int r =
        cuheap_pool_alloc(d->pool, size, stream, &ptr, &block, cuheap_recording() ? &seq : NULL);
    if (r == CUHEAP_POOL_PASS || r < 0)
        return 0;
    *ret = (CUdeviceptr)ptr;
    cuheap_account_in(ctr, d, (int64_t)size, 0);
    cuheap_count_in(ctr, CUHEAP_CTR_ALLOCS, 1);
    if (__builtin_expect(cuheap_recording(), 0))
        cuheap_record_alloc_event(d, api, CUHEAP_EVF_POOLED, ptr, size, block, stream, seq);
    return 1;
}

/* Whether this call is the one in CUHEAP_OWN_EVERY of the thread's (by its count in `slot`)
 * whose own time is measured: a load and a test on the pooled path. */
static inline bool cuheap_own_due(struct cuheap_counters *ctr, unsigned slot)
{
    return ctr &&
           !(atomic_load_explicit(&ctr->v[slot], memory_order_relaxed) & (CUHEAP_OWN_EVERY - 1));
}

/* cuheap_alloc_pooled(), timed (alloc.c). */
__attribute__((noinline, cold)) int cuheap_alloc_pooled_timed(struct cuheap_counters *ctr,
                                                              struct cuheap_device *d, int api,
                                                              uint64_t size, uint64_t stream,
                                                              CUdeviceptr *ret);

/* Serve from the pool. Returns 1 when served (*ret set), 0 to pass through: also when the pool
 * is out of memory after every reclaim, since the driver may still grant the exact size (a
 * block rounds up to a power of two, a vmm chunk to 2 MiB granules, and the driver's VMM
 * calls may fail where cuMemAlloc does not); the pass-through then gives the program the
 * driver's answer and records it. (-1, out of memory, is not returned.) */
static inline __attribute__((always_inline)) int
cuheap_alloc_pooled(struct cuheap_counters *ctr, struct cuheap_device *d, int api, uint64_t size,
                    uint64_t stream, CUdeviceptr *ret)
{
    if (!d || !cuheap_cfg.pool)
        return 0;
    if (__builtin_expect(cuheap_own_due(ctr, CUHEAP_CTR_ALLOCS), 0))
        return cuheap_alloc_pooled_timed(ctr, d, api, size, stream, ret);
    return cuheap_alloc_pooled_untimed(ctr, d, api, size, stream, ret);
}

/* Device memory for `size` bytes: from the pool when it serves the request, else through
 * the driver (`call`, cuheap_alloc_passthru). Returns CUDA_SUCCESS with *ret set, the pool's
 * out-of-memory, or the driver's answer. */
static inline __attribute__((always_inline)) CUresult
cuheap_alloc_device(struct cuheap_counters *ctr, struct cuheap_device *d, int api, uint64_t size,
                    uint64_t stream, const struct cuheap_driver_call *call, CUdeviceptr *ret)
{
    if (cuheap_alloc_pooled(ctr, d, api, size, stream, ret))
        return CUDA_SUCCESS;
    return cuheap_alloc_passthru(d, api, size, cuheap_driver_rounded(size), stream, true, call,
                                 ret);
}

/* cuheap_free_pooled() without its own time measured. */
static inline __attribute__((always_inline)) int
cuheap_free_pooled_untimed(struct cuheap_counters *ctr, uint64_t ptr, uint64_t stream, int api)
{
    void *owner = NULL;            /* the device record whose pool held ptr */
    uint64_t size, block, seq = 0; /* a sequence number only for an event recorded */
    int r =
        cuheap_pool_free_any(ptr, stream, &owner, &size, &block, cuheap_recording() ? &seq : NULL);
    if (r == CUHEAP_POOL_PASS)
        return 0;
    if (r)
        return -1;
    struct cuheap_device *d = owner;
    cuheap_account_in(ctr, d, -(int64_t)size, 0);
    cuheap_count_in(ctr, CUHEAP_CTR_FREES, 1);
    if (__builtin_expect(cuheap_recording(), 0))
        cuheap_record_free_event(d->ordinal, api, CUHEAP_EVF_POOLED, ptr, size, block, stream, seq);
    return 1;
}

/* cuheap_free_pooled(), timed (alloc.c). */
__attribute__((noinline, cold)) int
cuheap_free_pooled_timed(struct cuheap_counters *ctr, uint64_t ptr, uint64_t stream, int api);

/* Free a pooled pointer. Returns 1 when freed, 0 when not ours, -1 for an invalid free. */
static inline __attribute__((always_inline)) int
cuheap_free_pooled(struct cuheap_counters *ctr, uint64_t ptr, uint64_t stream, int api)
{
    if (__builtin_expect(cuheap_own_due(ctr, CUHEAP_CTR_FREES), 0))
        return cuheap_free_pooled_timed(ctr, ptr, stream, api);
    return cuheap_free_pooled_untimed(ctr, ptr, stream, api);
}

#endif /* CUHEAP_ALLOC_H */
