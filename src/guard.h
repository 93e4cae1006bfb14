/* SPDX-License-Identifier: MIT */
/*
 * The thread's re-entry guard, one for all of cuheap (guard.c). Set while this
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

extern __thread int cuheap_busy __attribute__((tls_model("initial-exec")));

/* This thread's list of what nested calls left (defer.c): entries pushed and entries done,
 * each only ever moving up; equal when nothing waits. */
struct cuheap_defer_count {
    _Atomic unsigned pushed; /* by nested hooks, in signal handlers */
    _Atomic unsigned done;   /* by the thread as it works them off */
};
extern __thread struct cuheap_defer_count cuheap_deferred
    __attribute__((tls_model("initial-exec")));

static inline bool cuheap_defer_pending(void)
{
    return atomic_load_explicit(&cuheap_deferred.pushed, memory_order_relaxed) !=
           atomic_load_explicit(&cuheap_deferred.done, memory_order_relaxed);
}

/* Work off this thread's list (defer.c); called with the guard clear. */
void cuheap_defer_drain(void);

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
