/* SPDX-License-Identifier: MIT */
/*
 * The thread's re-entry guard, one for all of cuheap (guard.c), and the count of what nested
 * calls left for the thread. Set while this
 * thread works inside cuheap: a hook, cuheap_mark, an NVTX callback, the audit's start and
 * stop. A hook reached meanwhile on the same thread (cuheap calling the driver, a signal
 * handler that allocates) finds cuheap_boot() false and goes straight to the driver instead
 * of waiting for a lock this thread holds, leaving what it could not do to the thread
 * (defer.h), which does it as it clears the guard (cuheap_unbusy). Its own header so that
 * subsystems needing only the guard do not include the runtime.
 */
#ifndef CUHEAP_GUARD_H
#define CUHEAP_GUARD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

extern __thread int cuheap_busy __attribute__((tls_model("initial-exec")));

/* This thread's list of what nested calls left (defer.c): entries pushed and entries done,
 * each only ever moving up; equal when nothing waits. */
struct cuheap_defer_count {
    _Atomic unsigned pushed;   /* by nested hooks, in signal handlers */
    _Atomic unsigned done;     /* by the thread as it works them off */
    _Atomic uint64_t overflow; /* pooled frees past a full list: the first block of a chain
                                  through the blocks themselves (cuheap_pool_claim_free), 0 */
};
extern __thread struct cuheap_defer_count cuheap_deferred
    __attribute__((tls_model("initial-exec")));

static inline bool cuheap_defer_pending(void)
{
    return atomic_load_explicit(&cuheap_deferred.pushed, memory_order_relaxed) !=
               atomic_load_explicit(&cuheap_deferred.done, memory_order_relaxed) ||
           atomic_load_explicit(&cuheap_deferred.overflow, memory_order_relaxed);
}

/* What works the list off (defer.c's cuheap_defer_settle), left here by the first entry
 * pushed: the layers below defer.c (the allocation layer, the runtime) reach it only through
 * the guard, and no entry is pending before it is set. */
extern void (*_Atomic cuheap_defer_settle_fn)(void);

/* Guard set: settle now what nested calls left, before this thread changes the pass-through
 * map, so that the map sees its calls in the order they were made (a handler's driver free
 * of an address that the interrupted call then gets from the driver). */
static inline void cuheap_defer_settle_now(void)
{
    void (*settle)(void) = atomic_load_explicit(&cuheap_defer_settle_fn, memory_order_relaxed);
    if (settle)
        settle();
}

/* Work off this thread's list; called with the guard clear (guard.c). */
void cuheap_defer_drain(void);

/* A forked child: the entries were the parent's (its pools and map are forgotten). */
void cuheap_defer_atfork_child(void);

/* Clear the guard, then do what calls nested meanwhile left. Cleared first: a handler that
 * runs after the look finds the guard clear and does its own work in full. */
static inline void cuheap_unbusy(void)
{
    cuheap_busy = 0;
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(cuheap_defer_pending(), 0))
        cuheap_defer_drain();
}

#endif
