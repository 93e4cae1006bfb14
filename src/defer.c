/* SPDX-License-Identifier: MIT */
/*
 * The nested hooks' list (see defer.h): a ring per thread, touched by that thread alone: by
 * nested hooks, which push at its tail, and by the thread as it leaves cuheap, which works
 * it off from its head, in the order the calls were made (a handler that allocates and then
 * frees must be booked in that order).
 *
 * Why a compare-and-swap on a thread's own count: a push runs in a signal handler, which can
 * interrupt another handler's push between reserving a slot and filling it; the later one
 * reserves the next slot. Only the thread works the ring off, with the guard set, so every
 * push it finds was made by a handler that has returned: filled. A push reads `done` before
 * the thread moved it past the entry it is copying, which only makes the ring look fuller.
 * Pooled frees past a full ring wait in the blocks themselves (cuheap_pool_claim_free), so
 * that none is lost however many a handler makes.
 */
#include "defer.h"

#include <stdatomic.h>
#include <string.h>

#include "alloc.h"
#include "log.h"
#include "runtime.h"

enum defer_kind {
    DEFER_POOLED_FREE, /* free the block in its pool */
    DEFER_ALLOC,       /* book an allocation the driver served */
    DEFER_FREED,       /* book a free the driver served */
};

struct deferred {
    uint64_t key;    /* the pointer (a VMM handle's key for cuMemCreate/cuMemRelease) */
    uint64_t size;   /* DEFER_ALLOC: bytes requested */
    uint64_t actual; /* DEFER_ALLOC: bytes the driver reserved */
    uint64_t stream; /* as the hook passes it to the allocation layer */
    int16_t ordinal; /* DEFER_ALLOC: a device ordinal or CUHEAP_DEFER_* */
    uint8_t kind;    /* enum defer_kind */
    uint8_t api;     /* enum cuheap_api */
};

static __thread struct deferred slots[CUHEAP_NR_DEFERRED]
    __attribute__((tls_model("initial-exec")));
static __thread bool settling __attribute__((tls_model("initial-exec")));
static _Atomic uint64_t nr_full; /* calls left to the driver alone: a thread's list was full */

bool cuheap_nested(void)
{
    return cuheap_busy && atomic_load_explicit(&cuheap_booted, memory_order_acquire);
}

/* Async-signal-safe. */
static bool push(const struct deferred *e)
{
    unsigned t = atomic_load_explicit(&cuheap_deferred.pushed, memory_order_relaxed);
    do {
        if (t - atomic_load_explicit(&cuheap_deferred.done, memory_order_relaxed) >=
            CUHEAP_NR_DEFERRED) {
            atomic_fetch_add_explicit(&nr_full, 1, memory_order_relaxed);
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(&cuheap_deferred.pushed, &t, t + 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    /* before the entry counts for anything: the guard works it off through this */
    atomic_store_explicit(&cuheap_defer_settle_fn, cuheap_defer_settle, memory_order_relaxed);
    slots[t % CUHEAP_NR_DEFERRED] = *e;
    atomic_signal_fence(memory_order_seq_cst); /* filled before the handler returns */
    return true;
}

bool cuheap_defer_pooled_free(uint64_t ptr, uint64_t stream, int api)
{
    if (!cuheap_pool_of(ptr))
        return false;
    struct deferred e = {
        .key = ptr, .stream = stream, .kind = DEFER_POOLED_FREE, .api = (uint8_t)api};
    if (push(&e))
        return true;
    /* The list is full: the block itself waits, chained through its own records, as many as
     * handlers free (the driver does not know the pointer: passed on, the free was refused
     * and the block stayed live for good). A stream-ordered free keeps the list's order. */
    if (stream || cuheap_pool_claim_free(ptr, api, &cuheap_deferred.overflow))
        return false;
    atomic_fetch_sub_explicit(&nr_full, 1, memory_order_relaxed); /* push counted it: not lost */
    atomic_store_explicit(&cuheap_defer_settle_fn, cuheap_defer_settle, memory_order_relaxed);
    return true;
}

void cuheap_defer_alloc(int api, uint64_t key, uint64_t size, uint64_t actual, uint64_t stream,
                        int ordinal)
{
    struct deferred e = {.key = key,
                         .size = size,
                         .actual = actual,
                         .stream = stream,
                         .ordinal = (int16_t)ordinal,
                         .kind = DEFER_ALLOC,
                         .api = (uint8_t)api};
    push(&e);
}

void cuheap_defer_freed(int api, uint64_t key, uint64_t stream)
{
    struct deferred e = {.key = key, .stream = stream, .kind = DEFER_FREED, .api = (uint8_t)api};
    push(&e);
}

/* Guard set: what the nested call would have done had the thread not been inside cuheap. */
static void settle(const struct deferred *e)
{
    switch (e->kind) {
    case DEFER_POOLED_FREE:
        /* 0: no pool owns it any more (its context went meanwhile, the memory with it);
         * -1: freed twice, which the handler was not told */
        cuheap_free_pooled(cuheap_counters_mine(), e->key, e->stream, e->api);
        break;
    case DEFER_ALLOC: {
        struct cuheap_device *d = e->ordinal == CUHEAP_DEFER_CURRENT ? cuheap_device_current()
                                  : e->ordinal >= 0 ? cuheap_device_by_ordinal(e->ordinal)
                                                    : NULL;
        /* the driver has the bytes: counted as cuheap_admit would, past any limit */
        if (d)
            atomic_fetch_add(&d->reserved, e->actual);
        cuheap_passthru_done(d, CUDA_SUCCESS, e->api, e->key, e->size, e->actual, e->stream,
                             d != NULL);
        break;
    }
    case DEFER_FREED: {
        struct cuheap_passthru_free f;
        cuheap_passthru_free_begin(&f, e->key);
        cuheap_passthru_free_end(&f, CUDA_SUCCESS, e->key, e->api, e->stream);
        break;
    }
    }
}

void cuheap_defer_settle(void)
{
    if (settling)
        return; /* an entry's own book-keeping: the rest follow it in order */
    settling = true;
    unsigned h;
    while ((h = atomic_load_explicit(&cuheap_deferred.done, memory_order_relaxed)) !=
           atomic_load_explicit(&cuheap_deferred.pushed, memory_order_relaxed)) {
        struct deferred e = slots[h % CUHEAP_NR_DEFERRED];
        atomic_store_explicit(&cuheap_deferred.done, h + 1, memory_order_relaxed);
        settle(&e);
    }
    uint64_t ptr;
    int api;
    while ((ptr = cuheap_pool_claimed_pop(&cuheap_deferred.overflow, &api)) != 0)
        cuheap_free_pooled(cuheap_counters_mine(), ptr, 0, api);
    settling = false;
    if (atomic_load_explicit(&nr_full, memory_order_relaxed))
        cuheap_log_once("calls made inside a signal handler while cuheap worked on the same "
                        "thread went to the driver alone: more than %d at once",
                        CUHEAP_NR_DEFERRED);
}
