/* SPDX-License-Identifier: MIT */
/*
 * The thread's re-entry guard (guard.h): its own file, so that every layer that sets or reads
 * it (the hooks, the runtime, the audit, NVTX) depends on it alone and on nothing above it.
 */
#include "guard.h"

__thread int cuheap_busy __attribute__((tls_model("initial-exec")));
__thread struct cuheap_defer_count cuheap_deferred __attribute__((tls_model("initial-exec")));
void (*_Atomic cuheap_defer_settle_fn)(void);

void cuheap_defer_drain(void)
{
    do {
        cuheap_busy = 1;
        cuheap_defer_settle_now();
        cuheap_busy = 0;
        atomic_signal_fence(memory_order_seq_cst);
    } while (cuheap_defer_pending());
}

void cuheap_defer_atfork_child(void)
{
    atomic_store(&cuheap_deferred.done, atomic_load(&cuheap_deferred.pushed));
    atomic_store(&cuheap_deferred.overflow, 0);
}
