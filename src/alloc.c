/* SPDX-License-Identifier: MIT */
/*
 * The allocation layer's out-of-line parts (alloc.h says what the layer is): the events
 * themselves, out-of-memory records, the limit's admission with the pool's reclaim, and the
 * book-keeping of allocations and frees that pass through to the driver. The hot pooled path
 * is inline in alloc.h.
 */
#include "alloc.h"

#include <string.h>

#include "addrmap.h"
#include "config.h"
#include "log.h"

static uint8_t capture_flag(void)
{
    return cuheap_capturing() ? CUHEAP_EVF_CAPTURE : 0;
}

/* An allocation's or a free's event: the one place both are built. */
static void record_block_event(int type, int device, int api, uint8_t flags, uint64_t ptr,
                               uint64_t size, uint64_t actual, uint64_t stream, uint64_t seq)
{
    struct cuheap_rec r = {.type = (uint8_t)type,
                           .api = (uint8_t)api,
                           .flags = (uint8_t)(flags | capture_flag()),
                           .device = (int16_t)device,
                           .seq = seq,
                           .ptr = ptr,
                           .size = size,
                           .actual = actual,
                           .stream = stream};
    cuheap_record(&r);
}

void cuheap_record_alloc_event(struct cuheap_device *d, int api, uint8_t flags, uint64_t ptr,
                               uint64_t size, uint64_t actual, uint64_t stream, uint64_t seq)
{
    record_block_event(CUHEAP_EV_ALLOC, d ? d->ordinal : -1, api, flags, ptr, size, actual, stream,
                       seq);
}

void cuheap_record_free_event(int device, int api, uint8_t flags, uint64_t ptr, uint64_t size,
                              uint64_t actual, uint64_t stream, uint64_t seq)
{
    record_block_event(CUHEAP_EV_FREE, device, api, flags, ptr, size, actual, stream, seq);
}

void cuheap_record_oom(struct cuheap_device *d, int api, uint64_t size, bool by_limit)
{
    atomic_fetch_add_explicit(&cuheap_nr_ooms, 1, memory_order_relaxed);
    size_t f = 0, t = 0;
    cuheap_drv.cuMemGetInfo_v2(&f, &t);
    struct cuheap_rec r = {.type = by_limit ? CUHEAP_EV_LIMIT : CUHEAP_EV_OOM,
                           .api = (uint8_t)api,
                           .device = (int16_t)(d ? d->ordinal : -1),
                           .size = size,
                           .aux = f,
                           .aux2 = by_limit && d ? d->limit : t,
                           .stream = CUHEAP_OOM_NO_POOL,
                           .result = CUDA_ERROR_OUT_OF_MEMORY};
    if (d) { /* what the out-of-memory's report says (recorder.h) */
        r.ptr = cuheap_device_live(d);
        r.actual = atomic_load(&d->reserved);
        r.stream = cuheap_cfg.pool ? cuheap_pool_largest_free(d->pool) : CUHEAP_OOM_NO_POOL;
    }
    cuheap_record(&r);
}

/* ---- pass-through allocations ---- */

bool cuheap_admit(struct cuheap_device *d, uint64_t actual)
{
    if (!d)
        return true;
    uint64_t now = atomic_fetch_add(&d->reserved, actual) + actual;
    if (!d->limit || now <= d->limit)
        return true;
    atomic_fetch_sub(&d->reserved, actual);
    if (cuheap_cfg.release == CUHEAP_RELEASE_NEVER || !cuheap_pool_trim(d->pool, false))
        return false;
    now = atomic_fetch_add(&d->reserved, actual) + actual;
    if (now <= d->limit)
        return true;
    atomic_fetch_sub(&d->reserved, actual);
    return false;
}

bool cuheap_reclaim_for_driver(struct cuheap_device *d)
{
    return d && cuheap_cfg.release != CUHEAP_RELEASE_NEVER && cuheap_pool_trim(d->pool, false);
}

/* ---- the pooled path, timed (the calls cuheap_own_due() picks) ---- */

/* How many calls a timed one stands for, by the thread's count in `slot` before it: each
 * CUHEAP_OWN_EVERY calls, but the thread's first call for itself alone (it sets up what the
 * thread and the pool make once, which its followers do not pay). */
static int64_t own_weight(struct cuheap_counters *ctr, unsigned slot)
{
    return atomic_load_explicit(&ctr->v[slot], memory_order_relaxed) ? CUHEAP_OWN_EVERY : 1;
}

int cuheap_alloc_pooled_timed(struct cuheap_counters *ctr, struct cuheap_device *d, int api,
                              uint64_t size, uint64_t stream, CUdeviceptr *ret)
{
    int64_t weight = own_weight(ctr, CUHEAP_CTR_ALLOCS);
    struct cuheap_own_span span;
    cuheap_own_begin(ctr, &span);
    int r = cuheap_alloc_pooled_untimed(ctr, d, api, size, stream, ret);
    cuheap_own_end(ctr, &span, CUHEAP_OWN_ALLOC, weight);
    return r;
}

int cuheap_free_pooled_timed(struct cuheap_counters *ctr, uint64_t ptr, uint64_t stream, int api)
{
    int64_t weight = own_weight(ctr, CUHEAP_CTR_FREES);
    struct cuheap_own_span span;
    cuheap_own_begin(ctr, &span);
    int r = cuheap_free_pooled_untimed(ctr, ptr, stream, api);
    cuheap_own_end(ctr, &span, CUHEAP_OWN_FREE, weight);
    return r;
}

/* ---- pass-through allocations: each timed whole (the driver's call takes far longer) ---- */

/* The program's driver call, counted and timed as such. */
static CUresult program_call(const struct cuheap_driver_call *call, void *out, uint64_t size,
                             uint64_t *ret_key, uint64_t *ret_size)
{
    uint64_t t0 = cuheap_drv_start(CUHEAP_DRV_PROGRAM);
    CUresult r = call->fn(call, out, size, ret_key, ret_size);
    cuheap_drv_done(CUHEAP_DRV_PROGRAM, t0);
    return r;
}

CUresult cuheap_alloc_passthru(struct cuheap_device *d, int api, uint64_t size, uint64_t actual,
                               uint64_t stream, bool device_mem,
                               const struct cuheap_driver_call *call, void *out)
{
    struct cuheap_counters *ctr = cuheap_counters_mine();
    struct cuheap_own_span span;
    if (ctr)
        cuheap_own_begin(ctr, &span);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!cuheap_admit(d, actual)) {
        cuheap_record_oom(d, api, size, true);
    } else {
        uint64_t key = 0, got = size;
        r = program_call(call, out, size, &key, &got);
        if (r == CUDA_ERROR_OUT_OF_MEMORY && cuheap_reclaim_for_driver(d))
            r = program_call(call, out, size, &key, &got);
        r = cuheap_passthru_done(d, r, api, r ? 0 : key, r ? size : got, actual, stream,
                                 device_mem);
    }
    if (ctr)
        cuheap_own_end(ctr, &span, CUHEAP_OWN_ALLOC, 1);
    return r;
}

CUresult cuheap_alloc_pitch(struct cuheap_counters *ctr, struct cuheap_device *d, size_t width,
                            size_t height, const struct cuheap_driver_call *call, CUdeviceptr *ret,
                            size_t *ret_pitch)
{
    uint64_t key, got;
    size_t row = width <= SIZE_MAX - 511 ? (width + 511) & ~(size_t)511 : 0;
    if (!row)
        return call->fn(call, ret, 0, &key, &got);
    if (height <= SIZE_MAX / row) {
        if (cuheap_alloc_pooled(ctr, d, CUHEAP_API_PITCH, (uint64_t)row * height, 0, ret)) {
            *ret_pitch = row;
            return CUDA_SUCCESS;
        }
    }
    /* the bytes the limit sees stand for the request until the driver says what it gave */
    uint64_t actual =
        height <= SIZE_MAX / row ? cuheap_driver_rounded((uint64_t)row * height) : UINT64_MAX;
    return cuheap_alloc_passthru(d, CUHEAP_API_PITCH, actual, actual, 0, true, call, ret);
}

CUresult cuheap_passthru_done(struct cuheap_device *d, CUresult r, int api, uint64_t key,
                              uint64_t size, uint64_t actual, uint64_t stream, bool device_mem)
{
    if (r != CUDA_SUCCESS) {
        if (d && device_mem)
            atomic_fetch_sub(&d->reserved, actual);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            cuheap_record_oom(d, api, size, false);
        return r;
    }
    if (cuheap_defer_pending()) /* the map in this thread's order (defer.h) */
        cuheap_defer_settle_now();
    uint64_t seq = cuheap_event_seq();
    struct cuheap_addr_entry e = {key, size, actual, (int16_t)(device_mem && d ? d->ordinal : -1),
                                  (uint8_t)api};
    if (cuheap_addrmap_put(&cuheap_passthru, &e))
        cuheap_log_once("allocation table full: some frees will be recorded without sizes");
    atomic_fetch_add_explicit(&cuheap_nr_passthrough, 1, memory_order_relaxed);
    if (device_mem) {
        cuheap_note_reserved_peak(d); /* cuheap_admit counted the bytes, the driver gave them */
        cuheap_account(d, (int64_t)size, 0);
    }
    cuheap_record_alloc(device_mem ? d : NULL, api, 0, key, size, actual, stream, seq);
    return r;
}

/* A pass-through free is timed from begin to end, less the driver's call between them (the
 * hook's: the program's, timed from begin's end to end's start). */
void cuheap_passthru_free_begin(struct cuheap_passthru_free *f, uint64_t key)
{
    if (cuheap_defer_pending()) /* the map in this thread's order (defer.h) */
        cuheap_defer_settle_now();
    memset(f, 0, sizeof(*f));
    struct cuheap_counters *ctr = cuheap_counters_mine();
    if (ctr) {
        cuheap_own_begin(ctr, &f->span);
        f->timed = true;
    }
    f->known = cuheap_addrmap_take(&cuheap_passthru, key, &f->entry) == 0;
    f->seq = cuheap_event_seq();
    f->t = cuheap_ticks();
}

static CUresult free_end(struct cuheap_passthru_free *f, CUresult r, uint64_t key, int api,
                         uint64_t stream);

CUresult cuheap_passthru_free_end(struct cuheap_passthru_free *f, CUresult r, uint64_t key, int api,
                                  uint64_t stream)
{
    uint64_t t1 = cuheap_ticks();
    struct cuheap_counters *ctr = cuheap_counters_mine();
    /* the driver's call, as cuheap_drv_done() counts one */
    int64_t drv = (int64_t)(t1 - f->t);
    cuheap_count_in(ctr, CUHEAP_CTR_DRV_CALLS + CUHEAP_DRV_PROGRAM, 1);
    cuheap_count_in(ctr, CUHEAP_CTR_DRV_TIMED + CUHEAP_DRV_PROGRAM, 1);
    cuheap_count_in(ctr, CUHEAP_CTR_DRV_TICKS + CUHEAP_DRV_PROGRAM, drv > 0 ? drv : 0);
    cuheap_count_in(ctr, CUHEAP_CTR_DRV_ALL, drv > 0 ? drv : 0);
    r = free_end(f, r, key, api, stream);
    if (f->timed && ctr)
        cuheap_own_end(ctr, &f->span, CUHEAP_OWN_FREE, 1);
    return r;
}

static CUresult free_end(struct cuheap_passthru_free *f, CUresult r, uint64_t key, int api,
                         uint64_t stream)
{
    if (r != CUDA_SUCCESS) {
        if (f->known)
            cuheap_addrmap_put(&cuheap_passthru, &f->entry);
        return r;
    }
    int dev = f->known ? f->entry.device : -1;
    if (dev >= 0)
        cuheap_account(cuheap_device_by_ordinal(dev), -(int64_t)f->entry.size,
                       -(int64_t)f->entry.actual);
    cuheap_record_free(dev, f->known ? f->entry.api : api, 0, key, f->entry.size, f->entry.actual,
                       stream, f->seq);
    return r;
}
