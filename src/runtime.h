/* SPDX-License-Identifier: MIT */
/*
 * Process-wide state of the preloaded library: settings, one record per device context
 * (its pool, its accounting), the pass-through map, and the lazy start-up that runs on the
 * first hooked call (never in a constructor).
 */
#ifndef CUHEAP_RUNTIME_H
#define CUHEAP_RUNTIME_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "addrmap.h"
#include "backend_cuda.h"
#include "config.h"
#include "counters.h"
#include "driver.h"
#include "guard.h"
#include "pool.h"

#define CUHEAP_NR_MAX_DEVICES 32

struct cuheap_device {
    _Atomic(CUcontext) ctx; /* NULL until the record is complete */
    /* read by every pooled allocation: with the fields written only when the record is made,
     * off the line of the byte counts below, which every large pair writes */
    struct cuheap_pool *pool; /* made with the record, never freed */
    int ordinal;
    unsigned index; /* in the table: CUHEAP_CTR_LIVE + index is its pending live */
    uint64_t total; /* bytes on the device */
    uint64_t limit; /* CUHEAP_LIMIT in bytes, 0 = none */
    _Alignas(64) _Atomic uint64_t reserved; /* bytes held from the driver through cuheap */
    /* Bytes the program holds (requested sizes), less what threads still hold back in their
     * CUHEAP_CTR_LIVE + index counters (each under CUHEAP_LIVE_BATCH in magnitude; read the
     * total with cuheap_device_live()). Wraps below 0 while frees are added before the
     * allocations they undo. */
    _Atomic uint64_t live;
    /* The most live reached when a thread added its pending bytes: within (threads that held
     * pending bytes) x CUHEAP_LIVE_BATCH of the true peak, exact for requests that large. */
    _Atomic uint64_t peak_live;
    _Atomic uint64_t peak_reserved;
    _Alignas(64) struct cuheap_cuda_device cuda; /* the pool's backend's own state */
};

extern struct cuheap_config cuheap_cfg;
extern struct cuheap_addrmap cuheap_passthru;

/* Counters the public stats report (allocations and frees: CUHEAP_CTR_ALLOCS and _FREES). */
extern _Atomic uint64_t cuheap_nr_passthrough, cuheap_nr_ooms;

/* Set once start-up succeeded; read by cuheap_boot() on every hooked call. */
extern atomic_bool cuheap_booted;

/* cuheap_boot() before start-up finished: runs it (once) and answers as cuheap_boot(). */
bool cuheap_boot_slow(void);

/* Start everything once (driver, settings, recorder). Returns true when hooks may do their
 * work; false means: call the driver and nothing else (cuheap did not start, or the thread
 * is busy inside cuheap). Start-up runs with signals blocked: a handler that allocates
 * must not find it half done on its own thread. Once started: one load and the guard. */
static inline bool cuheap_boot(void)
{
    if (__builtin_expect(atomic_load_explicit(&cuheap_booted, memory_order_acquire), 1))
        return !cuheap_busy;
    return cuheap_boot_slow();
}

/* Start like cuheap_boot(), but only in a process that has already loaded the driver (for
 * callers that are not CUDA calls, such as NVTX). */
bool cuheap_boot_if_cuda(void);

/* The record of the calling thread's current context, created on first use; NULL without a
 * context or when the table is full. */
struct cuheap_device *cuheap_device_current(void);

/* The record whose pool p is. */
static inline struct cuheap_device *cuheap_device_of_pool(struct cuheap_pool *p)
{
    return (struct cuheap_device *)cuheap_pool_owner(p);
}

/* The record of a context, if one exists. */
struct cuheap_device *cuheap_device_by_ctx(CUcontext ctx);

/* The record's context is being destroyed or reset: drop its pool and its pass-through
 * entries (the driver frees the memory itself). When `dead`, the record is retired. */
void cuheap_device_gone(struct cuheap_device *d, bool dead);

/* The record for a device ordinal, if one exists. */
struct cuheap_device *cuheap_device_by_ordinal(int ordinal);

/* A thread adds live-byte changes smaller than this to the device's record only once they add
 * up to this much either way: the common pair touches no shared line. */
#define CUHEAP_LIVE_BATCH (1ll << 20)

/* Adjust the accounting of d and its peaks at once (reserved bytes, large changes). */
void cuheap_account_now(struct cuheap_device *d, int64_t live, int64_t reserved);

/* d->reserved was raised directly (the pool's growth, a pass-through admitted and granted):
 * the peak follows it. */
void cuheap_note_reserved_peak(struct cuheap_device *d);

/* Adjust the accounting of d and its peaks. Reserved bytes (which limits and out-of-memory
 * decisions read) are always exact; live bytes below CUHEAP_LIVE_BATCH are held back in c,
 * the calling thread's counters (cuheap_counters_mine(); NULL: no holding back), see struct
 * cuheap_device, live and peak_live. */
static inline void cuheap_account_in(struct cuheap_counters *c, struct cuheap_device *d,
                                     int64_t live, int64_t reserved)
{
    /* |live| < CUHEAP_LIVE_BATCH, as one unsigned compare */
#define CUHEAP_LIVE_SMALL(v) ((uint64_t)(v) + (CUHEAP_LIVE_BATCH - 1) < 2 * CUHEAP_LIVE_BATCH - 1)
    if (__builtin_expect(reserved == 0 && CUHEAP_LIVE_SMALL(live) && d && c, 1)) {
        _Atomic int64_t *pending = &c->v[CUHEAP_CTR_LIVE + d->index];
        int64_t v = atomic_load_explicit(pending, memory_order_relaxed) + live;
        if (__builtin_expect(CUHEAP_LIVE_SMALL(v), 1)) {
            atomic_store_explicit(pending, v, memory_order_relaxed);
            return;
        }
        /* into the record first: a reader meanwhile counts them twice, never not at all */
        cuheap_account_now(d, v, 0);
        atomic_store_explicit(pending, 0, memory_order_relaxed);
        return;
    }
#undef CUHEAP_LIVE_SMALL
    cuheap_account_now(d, live, reserved);
}

/* cuheap_account_in() with the calling thread's counters. */
static inline void cuheap_account(struct cuheap_device *d, int64_t live, int64_t reserved)
{
    cuheap_account_in(cuheap_counters_mine(), d, live, reserved);
}

/* Live bytes of d: the record plus what every thread holds back (0 if that sum is below 0,
 * which a read racing with the threads can see). */
uint64_t cuheap_device_live(struct cuheap_device *d);

/* The known-stream list's lock (backend_cuda.c) must be free when the process forks: it is
 * taken by the fences and idle checks, under a pool lock or inside a pool's timeline, and by
 * these two, which the hooks call only through cuheap_streams_changed() under
 * cuheap_streams_gate. fork holds the gate, every pool lock and then the list's lock itself
 * (cuheap_streams_atfork_prepare), so no thread is inside it when the child is made. */
extern pthread_mutex_t cuheap_streams_gate;
void cuheap_streams_changed(CUcontext ctx, CUstream s, bool added);

/* Stream capture began or ended: tell every pool. Returns whether s's state changed (false
 * when it was counted as capturing already, or not at all). */
bool cuheap_capture_changed(CUstream s, bool begin);
bool cuheap_capturing(void);

#endif
