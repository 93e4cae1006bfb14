/* SPDX-License-Identifier: MIT */
/*
 * What a nested hook leaves for later. A hook reached while its thread is already inside
 * cuheap (a signal handler that runs during a hook, a mark or an NVTX callback) must not wait
 * for a lock: the thread it interrupted may hold it (a pool's, the pass-through map's). It
 * does what needs no lock and puts the rest on a small list of the thread's own, which the
 * interrupted entry point works off as it leaves cuheap (cuheap_unbusy(), guard.h):
 *  - a free of a pooled block is deferred whole: the driver does not know the pointer and
 *    would refuse it, leaving the block live for good; the handler is answered CUDA_SUCCESS
 *    and the block goes back to its pool when the thread leaves;
 *  - an allocation or a free the driver served leaves its book-keeping (the pass-through map,
 *    the accounting, the counts and the event), so that its later free, or its earlier
 *    allocation, is matched as any other.
 * Pushing is async-signal-safe: thread-local slots and a compare-and-swap on their count, no
 * lock, no malloc. A full list is not waited on: the call is the driver's alone, as before.
 */
#ifndef CUHEAP_DEFER_H
#define CUHEAP_DEFER_H

#include <stdbool.h>
#include <stdint.h>

#include "driver.h"
#include "guard.h"

/* Entries a thread can hold: one hook interrupted by a few handlers' calls. */
#define CUHEAP_NR_DEFERRED 16

/* The device of a deferred allocation: an ordinal, or one of these. */
#define CUHEAP_DEFER_CURRENT (-1) /* the thread's current context's, when it leaves */
#define CUHEAP_DEFER_HOST    (-2) /* none: host memory */

/* A hook on this thread now is nested: cuheap started and the thread is inside it. */
bool cuheap_nested(void);

/* A nested free of ptr: when a pool owns it, defer it and return true (answer CUDA_SUCCESS),
 * past a full list too (the block waits in its own records); false when it is not a live
 * pooled block (the driver's call, as without cuheap), or a stream's free past a full list. */
bool cuheap_defer_pooled_free(uint64_t ptr, uint64_t stream, int api);

/* The driver served a nested allocation at key (size bytes requested, actual reserved):
 * leave its book-keeping. ordinal: a device ordinal or CUHEAP_DEFER_*. */
void cuheap_defer_alloc(int api, uint64_t key, uint64_t size, uint64_t actual, uint64_t stream,
                        int ordinal);

/* The driver freed key for a nested call: leave its book-keeping. */
void cuheap_defer_freed(int api, uint64_t key, uint64_t stream);

/* Guard set: settle now what nested calls left (the guard's cuheap_defer_settle_now() calls
 * it, through the pointer push() leaves it). */
void cuheap_defer_settle(void);

#endif
