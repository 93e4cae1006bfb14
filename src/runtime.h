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
#include "driver.h"
#include "guard.h"
#include "pool.h"

#define CUHEAP_NR_MAX_DEVICES 32

struct cuheap_device {
    _Atomic(CUcontext) ctx; /* NULL until the record is complete */
    int ordinal;
    uint64_t total;            /* bytes on the device */
    uint64_t limit;            /* CUHEAP_LIMIT in bytes, 0 = none */
    _Atomic uint64_t reserved; /* bytes held from the driver through cuheap */
    _Atomic uint64_t live;     /* bytes the program holds (requested sizes) */
    _Atomic uint64_t peak_live;
    _Atomic uint64_t peak_reserved;
    struct cuheap_pool pool;
    struct cuheap_cuda_device cuda; /* the pool's backend's own state */
};

extern struct cuheap_config cuheap_cfg;
extern struct cuheap_addrmap cuheap_passthru;

/* Counters the public stats report. */
extern _Atomic uint64_t cuheap_nr_allocs, cuheap_nr_frees, cuheap_nr_passthrough, cuheap_nr_ooms;

/* Start everything once (driver, settings, recorder). Returns true when hooks may do their
 * work; false means: call the driver and nothing else (cuheap did not start, or the thread
 * is busy inside cuheap). Start-up runs with signals blocked: a handler that allocates
 * must not find it half done on its own thread. */
bool cuheap_boot(void);

/* Start like cuheap_boot(), but only in a process that has already loaded the driver (for
 * callers that are not CUDA calls, such as NVTX). */
bool cuheap_boot_if_cuda(void);

/* The record of the calling thread's current context, created on first use; NULL without a
 * context or when the table is full. */
struct cuheap_device *cuheap_device_current(void);

/* The record whose pool p is. */
static inline struct cuheap_device *cuheap_device_of_pool(struct cuheap_pool *p)
{
    return (struct cuheap_device *)((char *)p - offsetof(struct cuheap_device, pool));
}

/* The record of a context, if one exists. */
struct cuheap_device *cuheap_device_by_ctx(CUcontext ctx);

/* The record's context is being destroyed or reset: drop its pool and its pass-through
 * entries (the driver frees the memory itself). When `dead`, the record is retired. */
void cuheap_device_gone(struct cuheap_device *d, bool dead);

/* The record for a device ordinal, if one exists. */
struct cuheap_device *cuheap_device_by_ordinal(int ordinal);

/* Adjust the accounting of d and its peaks. */
void cuheap_account(struct cuheap_device *d, int64_t live, int64_t reserved);

/* The known-stream list's lock (backend_cuda.c) must be free when the process forks: it is
 * taken by the fences, under a pool lock, and by these two, which the hooks call only through
 * cuheap_streams_changed() under cuheap_streams_gate. fork holds the gate and every pool lock,
 * so no thread is inside that lock when the child is made. */
extern pthread_mutex_t cuheap_streams_gate;
void cuheap_streams_changed(CUcontext ctx, CUstream s, bool added);

/* Stream capture began or ended: tell every pool. */
void cuheap_capture_changed(CUstream s, bool begin);
bool cuheap_capturing(void);

#endif
